"""`grain._src.python.dataset`: see `loader._src`."""

import importlib as _importlib


def __getattr__(name: str):
  # Grain's package imports its modules; clients reach them as attributes (`dataset.dataset`, `dataset.stats`).
  try:
    return _importlib.import_module(f"{__name__}.{name}")
  except ModuleNotFoundError as e:
    if e.name != f"{__name__}.{name}":
      raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
