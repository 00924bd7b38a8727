"""`RepeatIterDataset`: a stream replayed for several epochs (Grain's).

Each epoch restores the parent iterator to its starting state, so every epoch
is identical (no reseeding; use `MapDataset.repeat` for new shuffles per
epoch). With `mp_prefetch` below, the restart reuses the running workers.
"""

from __future__ import annotations

from typing import Any, TypeVar

from loader import checks
from loader import dataset_iterator
from loader import iter_dataset as iter_lib
from loader import state as state_lib

T = TypeVar("T")


class RepeatIterDataset(iter_lib.SequentialIterDataset[T]):
  """Repeats the parent stream `num_epochs` times (None: forever).

  Unlike Grain, an infinite repeat of an empty stream ends instead of spinning
  forever.

  Args:
    parent: The stream to repeat.
    num_epochs: A positive number of epochs, or None for no end.
  """

  _same_as_grain = True
  _spec_rule = "parent"

  def __init__(self, parent: iter_lib.IterDataset[T], num_epochs: int | None = None):
    super().__init__(parent)
    if num_epochs is not None:
      if isinstance(num_epochs, float) and num_epochs.is_integer():
        num_epochs = int(num_epochs)  # Grain counts epochs up to it: RepeatIterDataset(ds, 2.0) works there.
      num_epochs = checks.check_int(num_epochs, "num_epochs", minimum=1)
    self._num_epochs = num_epochs

  def _op_repr(self) -> str:
    return f".repeat({self._num_epochs})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    return _RepeatIterator(parent, self._num_epochs)


class _RepeatIterator(iter_lib.DatasetIterator[T]):
  """State: `{"parent": ..., "epoch": e}`, as in Grain."""

  _grain_state_keys = ("parent", "epoch")  # Grain's layout: its states restore here.

  def __init__(self, parent: iter_lib.DatasetIterator[T], num_epochs: int | None):
    super().__init__(parent)
    self._num_epochs = num_epochs
    with dataset_iterator.parent_calls():  # A bare position, as nested states are.
      self._start = parent.get_state()
    self._epoch = 0

  def __next__(self) -> T:
    restarted = False
    while self._epoch != self._num_epochs:
      try:
        return next(self._parent)
      except StopIteration:
        if restarted and self._num_epochs is None:
          raise  # An empty parent: another epoch would be empty too.
        self._epoch += 1
        if self._epoch == self._num_epochs:
          break
        with dataset_iterator.parent_calls():  # Our own position, not a checkpoint.
          self._parent.set_state(self._start)
        restarted = True
    raise StopIteration

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), "epoch": self._epoch}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("parent", "epoch"), type(self).__name__)
    epoch = checks.check_int(state["epoch"], "epoch", minimum=0,
                             maximum=self._num_epochs)
    self._parent.set_state(state["parent"])
    self._epoch = epoch
