"""`assert_equal_output_after_checkpoint`: Grain's check that a pipeline resumes exactly (grain.experimental)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _spec(x: Any) -> Any:
  """The shape of a state: containers kept, leaves replaced by their type."""
  if isinstance(x, dict):
    return {k: _spec(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    kinds = {type(v) for v in x}
    if len(kinds) <= 1 and not any(isinstance(v, (dict, list, tuple)) for v in x):
      return f"{type(x).__name__}<{next(iter(kinds)).__name__ if kinds else ''}>"
    return [_spec(v) for v in x]
  if isinstance(x, np.ndarray):
    return str(x.dtype)
  return type(x).__name__


def assert_equal_output_after_checkpoint(ds: Any) -> None:
  """Restores a fresh iterator of `ds` at every step and checks it yields the rest exactly.

  Also checks that the state keeps one structure at every step and that a
  restored iterator reports the state it was given. Use a small dataset (e.g.
  `ds[:20]` or `LimitIterDataset`): every step replays the rest of the stream.

  Args:
    ds: A MapDataset or IterDataset (anything whose iterator has get_state/set_state).
  """
  it = iter(ds)
  states, values = [], []
  spec = None
  while True:
    state = it.get_state()
    if spec is None:
      spec = _spec(state)
    elif _spec(state) != spec:
      raise AssertionError(f"State structure changed at step {len(states)}: {_spec(state)} instead of {spec}.")
    try:
      value = next(it)
    except StopIteration:
      break
    states.append(state)
    values.append(value)
  if not values:
    raise AssertionError("Dataset did not produce any elements.")
  for i, state in enumerate(states):
    restored = iter(ds)
    restored.set_state(state)
    np.testing.assert_equal(restored.get_state(), state, f"Restored state differs from the saved one at step {i}.")
    np.testing.assert_equal(list(restored), values[i:], f"Elements after restoring step {i} differ.")
