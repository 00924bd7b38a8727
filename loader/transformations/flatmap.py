"""`FlatMapMapDataset` / `FlatMapIterDataset`: one element into many (Grain's FlatMap).

The random-access version gives every parent element `max_fan_out` index slots
(Grain's layout, so `ds[i]` agrees with Grain): slot `i` holds split
`i % max_fan_out` of parent element `i // max_fan_out`, or None when that
element has fewer splits. Iteration skips the Nones. Because slots are a pure
function of the index, it runs in `mp_prefetch` workers.

The stream version has no fan-out limit. Its state is Grain's:
`{"parent": <parent state before the element being split>,
"next_index_in_buffer": <splits of it already returned>}`; a restore re-reads
and re-splits that one element.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import iter_dataset as iter_lib
from loader import state as state_lib
from loader import map_dataset as map_lib

T = TypeVar("T")


def _as_sequence(splits: Any) -> Sequence[Any]:
  # Grain accepts any iterable from flat_map (a generator is common).
  return splits if isinstance(splits, Sequence) else list(splits)


class FlatMapMapDataset(map_lib.MapDataset[T]):
  """Splits each element into at most `transform.max_fan_out` elements.

  Args:
    parent: The dataset to split.
    transform: An object with `flat_map(element) -> Sequence` and an integer
      `max_fan_out` (e.g. a `grain.transforms.FlatMap` subclass).
  """

  _same_as_grain = True

  def __init__(self, parent: map_lib.MapDataset, transform: Any):
    super().__init__(parent)
    if not isinstance(parent, map_lib.MapDataset):
      raise TypeError(f"FlatMapMapDataset needs a MapDataset parent (got {type(parent).__name__}); "
                      "use FlatMapIterDataset for an IterDataset.")
    max_fan_out = getattr(transform, "max_fan_out", None)
    # None: raised on first use, where Grain raises it (len(), ds[i], iter()).
    self._max_fan_out = None if max_fan_out is None else checks.check_int(
        max_fan_out, "max_fan_out", minimum=1, range_error=checks.ZeroSizeError)
    self._transform = transform
    self._flat_map = checks.resolve_fn(transform, "flat_map", "FlatMapMapDataset")

  def _fan_out(self) -> int:
    if self._max_fan_out is None:
      raise checks.FanOutMissingError(
          f"FlatMapMapDataset needs transform.max_fan_out, the most elements one input can split into "
          f"(got {self._transform!r} without it); set it on your FlatMap class, or use FlatMapIterDataset.")
    return self._max_fan_out

  def __len__(self) -> int:
    parent_len, fan_out = len(self._parent), self._fan_out()
    # An infinite parent stays infinite instead of overflowing (as in Grain).
    if parent_len >= sys.maxsize / fan_out:
      return sys.maxsize
    return fan_out * parent_len

  def _op_repr(self) -> str:
    return f".flat_map({checks.fn_name(self._flat_map)}, max_fan_out={self._max_fan_out})"

  @property
  def _may_contain_none(self) -> bool:
    return True

  def _split(self, element: Any) -> Sequence[Any]:
    splits = _as_sequence(checks.call_user(self._flat_map, element))
    if len(splits) > self._fan_out():
      raise ValueError(
          f"flat_map of {checks.fn_name(self._flat_map)} returned {len(splits)} elements for one input, "
          f"more than max_fan_out={self._max_fan_out}. Raise max_fan_out (above ~100 iteration slows "
          "down: every input reserves max_fan_out slots) or split such inputs beforehand.")
    return splits

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    if not len(indices):
      self._fan_out()
      return []
    # Epochs need no special case: with len == fan_out * len(parent), slot i of
    # any epoch belongs to parent index i // fan_out of the same epoch.
    parent_indices, positions = map_lib.divmod_index(indices, self._fan_out())
    # Consecutive slots share a parent element: read and split each one once.
    unique, inverse = np.unique(parent_indices, return_inverse=True)
    splits = [None if x is None else self._split(x) for x in self._parent._getitems(unique)]  # pylint: disable=protected-access
    out = []
    for k, pos in zip(inverse.tolist(), positions.tolist()):
      parts = splits[k]
      out.append(parts[pos] if parts is not None and pos < len(parts) else None)
    return out


class FlatMapIterDataset(iter_lib.SequentialIterDataset[T]):
  """Splits each element of a stream into any number of elements.

  Args:
    parent: The stream to split.
    transform: An object with `flat_map(element) -> Iterable` (e.g. a
      `grain.transforms.FlatMap` subclass) or such a callable.
  """

  _same_as_grain = True

  def __init__(self, parent: iter_lib.IterDataset, transform: Any):
    super().__init__(parent)
    self._transform = transform
    self._flat_map = checks.resolve_fn(transform, "flat_map", "FlatMapIterDataset")

  def _op_repr(self) -> str:
    return f".flat_map({checks.fn_name(self._flat_map)})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    if not callable(self._transform) and not hasattr(self._transform, "flat_map"):
      # At iter(), where Grain looks its flat_map up. (One that is not callable fails each element, as in Grain.)
      raise checks.TransformTypeError(
          f"FlatMapIterDataset expects an object with a .flat_map() method or a callable "
          f"(got {self._transform!r} of type {type(self._transform).__name__}).")
    return _FlatMapIterator(parent, self._flat_map)


class _FlatMapIterator(iter_lib.DatasetIterator[T]):
  """Hands out the splits of one parent element at a time."""

  _grain_state_keys = ("parent", "next_index_in_buffer")  # Grain's layout: its states restore here.

  def __init__(self, parent: iter_lib.DatasetIterator, flat_map: Callable[[Any], Any]):
    super().__init__(parent)
    self._flat_map = flat_map
    # Read outside get_state, the parent's state comes stamped with its pipeline
    # description (loader.state); nested in ours, only the position is kept.
    self._parent_state = state_lib.strip(parent.get_state())  # Before the element being split.
    # None: the splits of the element at `_parent_state` must be (re)built,
    # after a restore or a failure, skipping the first `_next` of them.
    self._buffer: Sequence[Any] | None = None
    self._next = 0

  def __next__(self) -> T:
    while self._buffer is None or self._next >= len(self._buffer):
      if self._buffer is not None:  # All splits handed out: on to the next element.
        self._parent_state = state_lib.strip(self._parent.get_state())
        self._buffer, self._next = None, 0
      try:
        x = next(self._parent)  # StopIteration ends the stream.
        self._buffer = _as_sequence(checks.call_user(self._flat_map, x))
      except Exception:
        # As in Grain, an element whose flat_map (or whose computation
        # upstream) raises is consumed: the state and the next call go on
        # after it, from its first split.
        self._parent_state = state_lib.strip(self._parent.get_state())
        self._next = 0
        raise
    x = self._buffer[self._next]
    self._next += 1
    return x

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent_state, "next_index_in_buffer": self._next}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("parent", "next_index_in_buffer"), type(self).__name__)
    skip = checks.check_int(state["next_index_in_buffer"], "next_index_in_buffer", minimum=0)
    self._parent.set_state(state["parent"])
    self._parent_state = self._parent.get_state()
    self._buffer, self._next = None, skip
