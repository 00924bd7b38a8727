"""`grain.python.experimental`: the same names as `loader.experimental`.

Resolved on access, so this mirror never lists a name `loader.experimental`
lacks, and importing it costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any


def _target() -> Any:
  # Lazy: loader.experimental imports the transformation modules.
  return importlib.import_module("loader.experimental")


def __getattr__(name: str) -> Any:
  if name.startswith("__"):
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  try:
    return getattr(_target(), name)
  except AttributeError as e:
    if name in _target().UNSUPPORTED:
      raise AttributeError(str(e)) from None  # It says why, and what to use instead.
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
  return sorted(n for n in dir(_target()) if not n.startswith("_"))
