"""Finds what Dataflow workers must install: this toolkit's setup.py.

Workers run the pipeline's DoFns, which live in `converter`; Beam builds an
sdist from the setup.py given as --setup_file and installs it on every
worker, together with its install_requires (requirements.txt: no TensorFlow).
"""

from __future__ import annotations

import os

from dataflow.checks import FlagError

PACKAGE_NAME = "arrayrecord-toolkit"
NO_SETUP_FILE = "none"


def checkout_root() -> str:
  """The folder that holds the `dataflow` package (a checkout's root)."""
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_toolkit_setup(path: str) -> bool:
  try:
    with open(path, encoding="utf-8") as f:
      return f'name="{PACKAGE_NAME}"' in f.read()
  except OSError:
    return False


def find_setup_file(flag_value: str | None = None) -> str | None:
  """The setup.py to stage, or None when staging is turned off.

  Args:
    flag_value: The --setup_file flag: None finds this checkout's setup.py;
      'none' stages nothing (the --sdk_container_image has the toolkit
      installed); anything else is a path to a setup.py or pyproject.toml.

  Raises:
    FlagError: the file is missing, or no checkout is found.
  """
  if flag_value is not None:
    if flag_value.strip().lower() == NO_SETUP_FILE:
      return None
    path = os.path.abspath(os.path.expanduser(flag_value))
    if os.path.basename(path) not in ("setup.py", "pyproject.toml") or not os.path.isfile(path):
      raise FlagError(f"--setup_file {flag_value!r} is not an existing setup.py or "
                      "pyproject.toml; pass the toolkit checkout's setup.py, or "
                      f"--setup_file {NO_SETUP_FILE} when --sdk_container_image already "
                      "has the toolkit installed.")
    return path
  path = os.path.join(checkout_root(), "setup.py")
  if not _is_toolkit_setup(path):
    raise FlagError(
        f"Cannot find the {PACKAGE_NAME} setup.py in {checkout_root()!r}, so the toolkit "
        "cannot be staged for the workers. Run from a checkout (git clone ...; pip install "
        "-e .), pass --setup_file PATH/setup.py, or pass --setup_file "
        f"{NO_SETUP_FILE} with an --sdk_container_image that has the toolkit installed.")
  return path
