"""`LimitIterDataset`: the first `count` elements of a stream (Grain's)."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import dataset_iterator
from loader import iter_dataset as iter_lib
from loader import state as state_lib

T = TypeVar("T")


class LimitIterDataset(iter_lib.SequentialIterDataset[T]):
  """Stops after `count` elements: `LimitIterDataset(range5_iter, 2)` -> 0, 1.

  Args:
    parent: The stream to limit.
    count: The maximum number of elements, a positive integer (a float is
      rounded up, as Grain's comparison with it does).
  """

  _same_as_grain = True
  _spec_rule = "parent"

  def __init__(self, parent: iter_lib.IterDataset[T], count: int):
    super().__init__(parent)
    if isinstance(count, (float, np.floating)) and math.isfinite(count) and count > 0:
      count = math.ceil(count)  # Grain compares the elements read with count: 2.5 gives 3.
    self._count = checks.check_int(count, "count", minimum=1)

  def _op_repr(self) -> str:
    return f".limit({self._count})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    return _LimitIterator(parent, self._count)


class _LimitIterator(iter_lib.DatasetIterator[T]):
  """State: `{"parent": ..., "count_elements_read": n}`, as in Grain."""

  _grain_state_keys = ("parent", "count_elements_read")  # Grain's layout: its states restore here.

  def __init__(self, parent: iter_lib.DatasetIterator[T], count: int):
    super().__init__(parent)
    self._count = count
    self._read = 0

  def __next__(self) -> T:
    if self._read >= self._count:
      raise StopIteration  # Without touching the parent: it may be infinite.
    x = next(self._parent)
    self._read += 1
    return x

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), "count_elements_read": self._read}

  def _get_next_index(self) -> int:
    return self._read  # Grain's: the elements read through the limit.

  def _set_next_index(self, index: int) -> None:
    dataset_iterator.set_next_index(self._parent, index)
    self._read = index

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("parent", "count_elements_read"), type(self).__name__)
    read = checks.check_int(state["count_elements_read"], "count_elements_read", minimum=0)
    self._parent.set_state(state["parent"])
    self._read = read
