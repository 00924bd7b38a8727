"""Iterator-level batches that start again after a failed element, as Grain's do.

`ds.to_iter_dataset().batch(n)` (and a `DataLoader`'s `Batch`) is folded into
the random-access part: batch k holds elements k*n .. k*n+n-1. Grain's batch
iterator instead gathers the next n elements as they come, so when one fails
(a map raising, caught by the consumer, which then calls next() again), the
elements gathered so far are dropped and the next batch starts right after
the failed element. The same holds for a restore at a position inside a batch.

`RealignedMapDataset` is the folded pipeline with its batch starting at any
element: after a failure the iterator moves to the view that starts where
Grain's next batch does, and keeps computing batches in chunks (in workers
too). It applies where the stages above the batch are maps and filters (they
do not depend on positions) and further batches; other pipelines (a
`random_map` after the batch, say) keep whole batches.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from loader import map_dataset as map_dataset_lib

# Stages that may sit above the batch: they compute each element from the
# batch below it alone, so they are the same over a realigned batch.
_POSITION_FREE = (map_dataset_lib.MapMapDataset, map_dataset_lib.FilterMapDataset)


def realignable(ds: map_dataset_lib.MapDataset, batch: map_dataset_lib.MapDataset | None) -> bool:
  """Whether `ds` is `batch` (a BatchMapDataset over elements read by index) under maps, filters and batches."""
  if not isinstance(batch, map_dataset_lib.BatchMapDataset):
    return False
  node = ds
  while node is not batch:
    if type(node) not in _POSITION_FREE + (map_dataset_lib.BatchMapDataset,):  # pylint: disable=unidiomatic-typecheck
      return False
    node = node._parent  # pylint: disable=protected-access
  return not map_dataset_lib.streams(batch)


def _batched(batch: map_dataset_lib.BatchMapDataset, parent: map_dataset_lib.MapDataset) -> map_dataset_lib.MapDataset:
  return map_dataset_lib.BatchMapDataset(parent, batch._batch_size, drop_remainder=batch._drop_remainder,  # pylint: disable=protected-access
                                         batch_fn=batch._batch_fn,  # pylint: disable=protected-access
                                         none_is_element=batch._none_is_element)  # pylint: disable=protected-access


def _rebuilt(ds: map_dataset_lib.MapDataset, batch: map_dataset_lib.BatchMapDataset,
             origin: int) -> map_dataset_lib.MapDataset:
  if ds is batch:
    return _batched(batch, batch._parent.slice(slice(origin, None)))  # pylint: disable=protected-access
  parent = _rebuilt(ds._parent, batch, origin)  # pylint: disable=protected-access
  if isinstance(ds, map_dataset_lib.BatchMapDataset):  # Its length follows its parent's.
    return _batched(ds, parent)
  stage = copy.copy(ds)
  stage._parents = (parent,)  # pylint: disable=protected-access
  return stage


class RealignedMapDataset(map_dataset_lib.MapDataset):
  """`ds` with the first element of its batch at element `origin` of the batch's input.

  Its position 0 is that batch; positions count batches from there. At
  origin 0 it computes `ds` itself.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset, batch: map_dataset_lib.BatchMapDataset, origin: int = 0):
    super().__init__(ds if origin == 0 else _rebuilt(ds, batch, origin))
    self._base = ds
    self._batch = batch
    self.origin = origin
    # Input elements per element: the batch sizes from `batch` up; and how many batches (the rebuilt
    # pipeline has them too).
    self.unit, self._depth = 1, 0
    node = ds
    while node is not batch._parent:  # pylint: disable=protected-access
      if isinstance(node, map_dataset_lib.BatchMapDataset):
        self.unit *= node._batch_size  # pylint: disable=protected-access
        self._depth += 1
      node = node._parent  # pylint: disable=protected-access
    self.input_len = len(batch._parent)  # pylint: disable=protected-access

  def at(self, origin: int) -> RealignedMapDataset:
    """The same pipeline with its batches starting at element `origin`."""
    return self if origin == self.origin else RealignedMapDataset(self._base, self._batch, origin)

  def __len__(self) -> int:
    return len(self._parent)

  def __repr__(self) -> str:
    return repr(self._parent)

  def _getitems(self, indices: np.ndarray) -> list[Any]:
    return self._parent._getitems(indices)  # pylint: disable=protected-access

  def _getitems_array(self, indices: np.ndarray) -> Any:
    return self._parent._getitems_array(indices)  # pylint: disable=protected-access

  def resume_after_failure(self, k: int) -> tuple[int, Exception | None]:
    """The input element the stream goes on at after batch `k` failed, and that element's error.

    Grain's batch iterators gather their elements one after the other, each
    inner batch before the next, and an error drops what the batches around
    it gathered: so the stream goes on after the first thing that fails in
    that order (an input element; with nested batches, an inner batch whose
    `batch_fn` or a map above it fails, after its own elements), with its
    error (the one Grain raises, even where a later element fails in an
    earlier stage). After the whole batch if nothing fails alone (a
    `batch_fn` or map of the outermost batch).
    """
    levels, sizes = self._levels()
    end, error = _first_failure_in(levels, sizes, len(levels) - 1, k)
    if error is None:
      return min(self.origin + (k + 1) * self.unit, self.input_len), None
    return self.origin + end, error

  def _levels(self) -> tuple[list[map_dataset_lib.MapDataset], list[int]]:
    """The datasets under each batch of the (realigned) pipeline, innermost first, ending with the pipeline
    itself, and each batch's size: element j of level i + 1 holds elements j*sizes[i] .. of level i."""
    levels, sizes = [self._parent], []
    node = self._parent
    while len(sizes) < self._depth:
      if isinstance(node, map_dataset_lib.BatchMapDataset):
        sizes.append(node._batch_size)  # pylint: disable=protected-access
        levels.append(node._parent)  # pylint: disable=protected-access
      node = node._parent  # pylint: disable=protected-access
    return levels[::-1], sizes[::-1]


def _first_failure_in(levels: list[map_dataset_lib.MapDataset], sizes: list[int], level: int,
                      j: int) -> tuple[int, Exception | None]:
  """Computes element j of `levels[level]` as Grain's nested batch iterators do, part by part.

  Returns the index of the input element (level 0) after the first part that
  fails alone and its error, or, if none does, the index after the
  element's last input element and None. The outermost level (the
  pipeline) is not computed itself: it is known to fail.
  """
  if level == 0:
    failed = map_dataset_lib.first_failure(levels[0], (j,))
    return j + 1, None if failed is None else failed[1]
  end = j  # Replaced: every element has a child.
  below = levels[level - 1]
  for child in range(j * sizes[level - 1], min((j + 1) * sizes[level - 1], len(below))):
    end, error = _first_failure_in(levels, sizes, level - 1, child)
    if error is not None:
      return end, error
  if level < len(levels) - 1:
    failed = map_dataset_lib.first_failure(levels[level], (j,))
    if failed is not None:
      return end, failed[1]
  return end, None


def origin_of(ds: Any) -> int:
  """Where the batches of `ds` start: a RealignedMapDataset's origin, else 0."""
  return ds.origin if isinstance(ds, RealignedMapDataset) else 0


# Set on an exception raised for a batch of a RealignedMapDataset: where the
# stream goes on (an attribute, so it travels with the exception from workers).
_RESUME_AT = "_loader_resume_at"


def note_resume(ds: Any, error: Exception, k: int) -> Exception:
  """The error to raise for element `k` of `ds`, noting where a realigned stream goes on.

  That is the error of the batch's first failing element, as Grain's batch
  iterator raises it, else `error`.
  """
  if isinstance(ds, RealignedMapDataset):
    at, first_error = ds.resume_after_failure(k)
    try:
      setattr(first_error or error, _RESUME_AT, at)
    except Exception:  # pylint: disable=broad-except  # E.g. an exception type with __slots__: whole batch.
      return error
    return first_error or error
  return error


def resume_at(error: BaseException) -> int | None:
  """The input element a realigned stream goes on at after `error` (None: not recorded)."""
  at = getattr(error, _RESUME_AT, None)
  return at if isinstance(at, int) else None
