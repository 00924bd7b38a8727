"""`MapDataset.concatenate`: the elements of several datasets one after another (Grain's).

Epoch `e` of the result is epoch `e` of each input in turn (index
`e * len + j` reads input `d` at `e * len(d) + j'`), so shuffled inputs are
reshuffled every epoch. Random access: runs in `mp_prefetch` workers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from loader import checks
from loader import map_dataset as map_lib
from loader.transformations import select as select_lib
from loader.transforms import DatasetSelectionMap

T = TypeVar("T")


class ConcatSelectionMap(DatasetSelectionMap):
  """Index -> (input, index in it) for inputs laid end to end, epoch by epoch."""

  def __init__(self, parents: Sequence[map_lib.MapDataset]):
    sizes = [len(p) for p in parents]
    for p, size in zip(parents, sizes):
      if size >= sys.maxsize:
        raise ValueError(f"Cannot concatenate infinite datasets. {p!r} is infinite; repeat after concatenating.")
    self._sizes = np.array(sizes, dtype=np.int64)
    self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
    self._len = int(self._starts[-1])

  def __len__(self) -> int:
    return self._len

  def select_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not self._len:
      raise checks.EmptyDatasetError("Cannot read from a concatenation of empty datasets.")
    epochs, pos = map_lib.divmod_index(np.asarray(indices), self._len)
    # side="right" skips empty inputs: their start equals the next one's.
    dataset_indices = np.searchsorted(self._starts, pos, side="right") - 1
    offsets = pos - self._starts[dataset_indices]
    if indices.dtype == object:  # Past a slice of an infinite dataset: keys may exceed int64.
      keys = map_lib.narrow_index(epochs.astype(object) * self._sizes[dataset_indices].astype(object)
                                  + offsets.astype(object))
    else:
      keys = offsets + epochs * self._sizes[dataset_indices]
    return dataset_indices, keys

  def __getitem__(self, index: int) -> tuple[int, int]:
    d, k = self.select_many(np.array([index], dtype=np.int64))
    return int(d[0]), int(k[0])

  def __repr__(self) -> str:
    return f"ConcatSelectionMap(sizes={self._sizes.tolist()})"


class ConcatenateMapDataset(select_lib.SelectMapDataset[T]):
  """Grain's `ConcatenateMapDataset`: `parents[0]`, then `parents[1]`, ... per epoch."""

  def __init__(self, parents: Sequence[map_lib.MapDataset[T]]):
    parents = select_lib.check_datasets(parents, "MapDataset.concatenate")
    super().__init__(parents, ConcatSelectionMap(parents))

  def _op_repr(self) -> str:
    return ".concatenate()"


def concatenate(datasets: Sequence[map_lib.MapDataset[T]]) -> ConcatenateMapDataset[T]:
  """`MapDataset.concatenate(datasets)`."""
  return ConcatenateMapDataset(datasets)
