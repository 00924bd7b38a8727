"""`WithOptionsIterDataset`: attaches `DatasetOptions` to a whole pipeline (as in Grain)."""

from __future__ import annotations

from typing import TypeVar

from loader import checks
from loader import dataset_options
from loader.dataset_iterator import DatasetIterator
from loader.iter_dataset import IterDataset
from loader.iter_dataset import SequentialIterDataset

T = TypeVar("T")


class WithOptionsIterDataset(SequentialIterDataset[T]):
  """The same stream as `parent`, with `options` applied to every stage of the pipeline.

  The options reach the stages before and after this one (all iterators of a
  pipeline share one context). Set several times, they merge: fields set
  explicitly later in the pipeline win. See `loader.dataset_options`.
  """

  _same_as_grain = True
  _state_transparent = True  # Options do not change the stream or the state.
  _spec_rule = "parent"

  def __init__(self, parent: IterDataset[T], options: dataset_options.DatasetOptions):
    super().__init__(parent)
    if not isinstance(options, dataset_options.DatasetOptions):
      raise checks.OptionsTypeError(f"options must be a loader.experimental.DatasetOptions (got {options!r}).")
    self.options = options

  def _op_repr(self) -> str:
    return f".with_options({self.options!r})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    ctx = parent._ctx  # pylint: disable=protected-access
    ctx.dataset_options = self.options.merge(ctx.dataset_options)
    return parent
