"""`loader.config`: accepts Grain 0.2.18's `grain.config` options.

Grain code calls `grain.config.update("py_debug_mode", True)`; the same call on
`loader.config` is accepted for every option Grain knows, and unknown names
raise `ValueError` as in Grain. None of the options changes what loader does
(it has no TensorFlow data loader, metrics, pipeline visualisation or frame
filtering), so they are stored and read back only:

=====================================  ==========================================
Option                                 In loader
=====================================  ==========================================
tf_interleaved_shuffle, tf_*           Grain's TensorFlow data loader; none here.
py_debug_mode                          Grain's extra metrics; loader has none.
py_dataset_visualization_output_dir    Grain's pipeline graph; not drawn.
py_relay_sigterm_to_main               Workers never relay SIGTERM; the parent
                                       stops its workers when it exits.
py_traceback_filtering                 Tracebacks are never filtered.
=====================================  ==========================================

Unlike Grain, values are type-checked, and options are not read from
`--grain_*` absl flags (loader defines no flags, so it can run in a process
that also imports Grain).
"""

from __future__ import annotations

import os
from typing import Any

from loader.checks import is_int

_TRACEBACK_FILTERING = ("auto", "off", "tracebackhide", "quiet_remove_frames", "remove_frames")

# name -> (default, kind): kind is "bool", "int", "str|None" or a tuple of choices.
_OPTIONS: dict[str, tuple[Any, Any]] = {
    "tf_interleaved_shuffle": (False, "bool"),
    "tf_interleaved_shuffle_block_size": (10, "int"),
    "tf_interleaved_shuffle_parallel_blocks": (10, "int"),
    "tf_lookup_batch_size": (100, "int"),
    "tf_lookup_num_parallel_calls": (-1, "int"),
    "tf_lookup_fast_warmup": (False, "bool"),
    "tf_optimized_sequential_read": (False, "bool"),
    "tf_prefetch_buffer_size": (-1, "int"),
    "py_debug_mode": (False, "bool"),
    "py_dataset_visualization_output_dir": (None, "str|None"),
    "py_relay_sigterm_to_main": (False, "bool"),
    "py_traceback_filtering": ("auto", _TRACEBACK_FILTERING),
}


def _unknown(name: str) -> ValueError:
  return ValueError(f"Unrecognized config option: {name!r}; valid options: {', '.join(_OPTIONS)}.")


def _check_value(name: str, value: Any) -> Any:
  kind = _OPTIONS[name][1]
  if kind == "bool":
    ok = isinstance(value, bool)
    want = "True or False"
  elif kind == "int":
    ok = is_int(value)
    want = "an integer"
  elif kind == "str|None":
    ok = value is None or isinstance(value, (str, os.PathLike))
    want = "a path or None"
  else:
    ok = value in kind
    want = f"one of {', '.join(map(repr, kind))}"
  if not ok:
    raise ValueError(f"config option {name} must be {want} (got {value!r}).")
  return os.fspath(value) if isinstance(value, os.PathLike) else value


class Config:
  """Holds the options; read them as attributes, set them with `update`."""

  def __init__(self):
    object.__setattr__(self, "_values", {name: default for name, (default, _) in _OPTIONS.items()})

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):  # Let copy/pickle probes see a plain object.
      raise AttributeError(name)
    try:
      return self._values[name]
    except KeyError:
      raise _unknown(name) from None

  def __setattr__(self, name: str, value: Any) -> None:
    raise ValueError(f"Set config options with update(): loader.config.update({name!r}, {value!r}).")

  def __dir__(self) -> list[str]:
    return sorted(set(super().__dir__()) | set(_OPTIONS))

  def get_or_default(self, name: str) -> Any:
    """The option's value (Grain: the default while flags are unparsed)."""
    return self.__getattr__(name)

  def update(self, name: str, value: Any) -> None:
    """Sets option `name`; ValueError for an unknown name or a bad value."""
    if name not in _OPTIONS:
      raise _unknown(name)
    self._values[name] = _check_value(name, value)


config = Config()
