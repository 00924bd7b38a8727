"""Run the conversion on Google Cloud Dataflow: `python -m dataflow.submit`.

`dataflow.submit` is imported on first use of its names, so that
`python -m dataflow.submit` does not find it already imported.
"""

from dataflow.checks import FlagError
from dataflow.flags import PROG, TEMPLATE_PARAMETERS, Request, parse, parser
from dataflow.staging import find_setup_file

_SUBMIT_NAMES = ("Submission", "build_pipeline", "console_url", "dry_run", "main", "run", "submit")

__all__ = [
    "FlagError",
    "PROG", "TEMPLATE_PARAMETERS", "Request", "parse", "parser",
    "find_setup_file",
    "Submission", "build_pipeline", "console_url", "dry_run", "main", "run", "submit",
]


def __getattr__(name):
  if name in _SUBMIT_NAMES:
    from dataflow import submit as _submit
    return getattr(_submit, name)
  raise AttributeError(f"module 'dataflow' has no attribute {name!r}")
