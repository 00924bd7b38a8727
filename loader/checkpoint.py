"""Saving and restoring iterator positions as small JSON files."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

_FORMAT = "arrayrecord-toolkit/loader-state"
_VERSION = 1


def _check_json_ints(value: Any, where: str) -> None:
  # States are nested dicts of ints (and lists of them); anything else would
  # not round-trip through JSON unchanged.
  if isinstance(value, dict):
    for k, v in value.items():
      if not isinstance(k, str):
        raise TypeError(f"Iterator state key {k!r} at {where} is not a string.")
      _check_json_ints(v, f"{where}.{k}")
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      _check_json_ints(v, f"{where}[{i}]")
  elif value is not None and not isinstance(value, (int, float, str, bool)):
    raise TypeError(f"Iterator state value at {where} is a {type(value).__name__}, not JSON-serialisable.")


def save_state(path: str | os.PathLike, iterator: Any) -> dict[str, Any]:
  """Writes `iterator.get_state()` to `path` atomically; returns the state.

  The file is written to a temporary name in the same directory, flushed to
  disk and renamed over `path`, so a crash leaves either the old or the new
  checkpoint, never a truncated one.
  """
  state = iterator.get_state()
  _check_json_ints(state, "state")
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  data = json.dumps({"format": _FORMAT, "version": _VERSION, "state": state}, indent=1, sort_keys=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
  try:
    with os.fdopen(fd, "w") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except FileNotFoundError:
      pass
    raise
  return state


def load_state(path: str | os.PathLike) -> dict[str, Any]:
  """Reads a state written by `save_state`."""
  path = os.fspath(path)
  with open(path) as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not a loader state file (invalid JSON: {e}).") from e
  if not isinstance(data, dict) or data.get("format") != _FORMAT or "state" not in data:
    raise ValueError(f"{path} is not a loader state file (expected format {_FORMAT!r}).")
  if data.get("version") != _VERSION:
    raise ValueError(f"{path} has state version {data.get('version')!r}; this loader reads version {_VERSION}.")
  return data["state"]


def restore_state(path: str | os.PathLike, iterator: Any) -> dict[str, Any]:
  """Sets `iterator` to the state saved at `path`; returns the state."""
  state = load_state(path)
  iterator.set_state(state)
  return state
