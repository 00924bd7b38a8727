"""Run the conversion on Google Cloud Dataflow: `python -m dataflow.submit`.

Names from `dataflow.submit` are imported on first use, so that
`python -m dataflow.submit` does not find that module already imported.
"""

import importlib

from dataflow.checks import FlagError
from dataflow.flags import PROG, TEMPLATE_PARAMETERS, Request, parse, parser
from dataflow.staging import find_setup_file

_FROM_SUBMIT = ("Submission", "build_pipeline", "console_url", "dry_run", "main", "run")

__all__ = [
    "FlagError",
    "PROG", "TEMPLATE_PARAMETERS", "Request", "parse", "parser",
    "find_setup_file",
    "Submission", "build_pipeline", "console_url", "dry_run", "main", "run",
]


def __getattr__(name):
  if name in _FROM_SUBMIT:
    return getattr(importlib.import_module("dataflow.submit"), name)
  raise AttributeError(f"module 'dataflow' has no attribute {name!r}")
