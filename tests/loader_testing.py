"""Shared helpers for the loader tests: tiny ArrayRecord datasets and stream checks."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def record_bytes(index: int, size: int = 24) -> bytes:
  """Deterministic record for global index `index`; starts with the index."""
  head = index.to_bytes(8, "little")
  return head + bytes((index * 7 + j) % 251 for j in range(max(0, size - 8)))


def record_index(record: bytes) -> int:
  return int.from_bytes(record[:8], "little")


def write_array_records(directory: str | os.PathLike, num_files: int, records_per_file: int | Sequence[int], *,
                        record_size: int = 24, group_size: int = 1, prefix: str = "data") -> list[str]:
  """Writes `num_files` ArrayRecord files; record i (global) is `record_bytes(i)`."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top

  os.makedirs(directory, exist_ok=True)
  counts = [records_per_file] * num_files if isinstance(records_per_file, int) else list(records_per_file)
  paths, index = [], 0
  for f, n in enumerate(counts):
    path = os.path.join(os.fspath(directory), f"{prefix}-{f:05d}-of-{num_files:05d}.array_record")
    writer = ArrayRecordWriter(path, f"group_size:{group_size}")
    for _ in range(n):
      writer.write(record_bytes(index, record_size))
      index += 1
    writer.close()
    paths.append(path)
  return paths


def shm_segments(prefix: str | None = None) -> set[str]:
  """Names of loader shared-memory segments in /dev/shm (default: this process's).

  Segment names start with "arl<pid of the consuming process>_", so tests
  running in parallel do not see each other's segments.
  """
  if prefix is None:
    prefix = f"arl{os.getpid()}_"
  if not os.path.isdir("/dev/shm"):
    return set()
  return {f for f in os.listdir("/dev/shm") if f.startswith(prefix)}


def assert_elements_equal(a: Any, b: Any, path: str = "") -> None:
  """Deep equality over dicts/lists/tuples/numpy arrays/bytes."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {b!r}"
    for k in a:
      assert_elements_equal(a[k], b[k], f"{path}[{k!r}]")
  elif isinstance(a, (list, tuple)):
    assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
    for i, (x, y) in enumerate(zip(a, b)):
      assert_elements_equal(x, y, f"{path}[{i}]")
  elif isinstance(a, np.ndarray):
    assert isinstance(b, np.ndarray), f"{path}: {type(b)} is not an array"
    assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
    if a.dtype.hasobject:
      assert a.tolist() == b.tolist(), f"{path}: {a!r} != {b!r}"
    else:
      np.testing.assert_array_equal(a, b, err_msg=path)
  else:
    assert a == b, f"{path}: {a!r} != {b!r}"


def assert_streams_equal(a: Sequence[Any], b: Sequence[Any]) -> None:
  assert len(a) == len(b), f"stream lengths differ: {len(a)} != {len(b)}"
  for i, (x, y) in enumerate(zip(a, b)):
    assert_elements_equal(x, y, f"element {i}")


def state_structure(state: Any) -> Any:
  """The nested key structure of a state, without its values."""
  if isinstance(state, dict):
    return {k: state_structure(v) for k, v in sorted(state.items())}
  if isinstance(state, (list, tuple)):
    return [state_structure(v) for v in state]
  return type(state).__name__


def take(iterator, n: int | None) -> list[Any]:
  out = []
  if n is not None and n <= 0:
    return out
  for x in iterator:
    out.append(x)
    if n is not None and len(out) >= n:
      break
  return out


def take_with_errors(iterator, n: int | None = None, errors: type | tuple[type, ...] = Exception,
                     on_error: Callable[[BaseException], Any] = str) -> list[Any]:
  """Up to `n` elements, a consumer that catches `errors` and calls next() again.

  A caught error shows up in the list as `on_error(error)` (its message by
  default); StopIteration ends it.
  """
  out = []
  while n is None or len(out) < n:
    try:
      out.append(next(iterator))
    except StopIteration:
      break
    except errors as e:  # pylint: disable=broad-except
      out.append(on_error(e))
  return out


def assert_restore_at_every_step_gives_same_stream(
    make_ds: Callable[[], Any], *, make_restore_ds: Callable[[], Any] | None = None,
    max_steps: int | None = None, steps: Sequence[int] | None = None) -> list[Any]:
  """Restoring the state taken before any element reproduces the rest exactly.

  Runs one iterator of `make_ds()` to the end (or `max_steps` elements),
  recording the state before each element. Then, for each step k (or each of
  `steps`), builds a fresh iterator from `make_restore_ds()` (default
  `make_ds`), calls `set_state(state_k)` and checks it yields exactly the
  elements k, k+1, ... of the first run, and that the state's key structure is
  the same at every step. Returns the reference stream.
  """
  make_restore_ds = make_restore_ds or make_ds
  states, elements = [], []
  with iter(make_ds()) as it:
    while max_steps is None or len(elements) < max_steps:
      states.append(it.get_state())
      try:
        elements.append(next(it))
      except StopIteration:
        break
  structure = state_structure(states[0])
  for k, state in enumerate(states):
    assert state_structure(state) == structure, f"state structure changed at step {k}: {state} vs {states[0]}"
  for k in (range(len(states)) if steps is None else steps):
    with iter(make_restore_ds()) as restored:
      restored.set_state(states[k])
      rest = take(restored, len(elements) - k if max_steps is not None else None)
    assert_streams_equal(rest, elements[k:])
  return elements
