"""`MapDataset.select_from_datasets`: elements routed from several datasets by a map.

A selection map (`loader.transforms.DatasetSelectionMap`, Grain's class, or
any object with `__len__` and `__getitem__`) maps an index of the combined
dataset to `(dataset index, index in that dataset)`; `len(map)` is the
combined length. A map may also define `select_many(indices) -> (dataset
indices, keys)` over int64 arrays (loader only; the built-in maps do), else it
is called once per index. `SelectMapDataset` reads a whole vector of
indices with one `_getitems` call per input dataset, so it stays random
access: it runs in `mp_prefetch` workers and its stream does not depend on
the worker count. `mix` and `concatenate` are selection maps over it.

Indices past the length are passed to the map unchanged, as Grain does; the
built-in maps define them (the next epoch), a user's map may refuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
import operator
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import map_dataset as map_lib

T = TypeVar("T")


def _select_one_by_one(selection_map: Any, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  pairs = [selection_map[i] for i in indices.tolist()]
  if not pairs:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  try:
    dataset_indices, keys = zip(*pairs)
    dataset_indices = np.asarray(dataset_indices, dtype=np.int64)
    try:
      keys = np.asarray(keys, dtype=np.int64)
    except OverflowError:  # Keys past int64 (an infinite input's epochs): Python ints, as Grain passes them on.
      keys = map_lib.narrow_index(np.array([operator.index(k) for k in keys], dtype=object))
  except (TypeError, ValueError) as e:
    raise TypeError(f"A selection map must return (dataset index, index) pairs of ints "
                    f"(got {pairs[0]!r} from {selection_map!r}).") from e
  return dataset_indices, keys


def check_datasets(datasets: Any, what: str) -> tuple[map_lib.MapDataset, ...]:
  """`datasets` as a tuple of MapDatasets, or a TypeError naming `what`."""
  if isinstance(datasets, (map_lib.MapDataset, str, bytes)) or not isinstance(datasets, Sequence):
    raise TypeError(f"{what} expects a list of MapDatasets (got {type(datasets).__name__}).")
  for i, ds in enumerate(datasets):
    if not isinstance(ds, map_lib.MapDataset):
      raise TypeError(f"{what}: datasets[{i}] is a {type(ds).__name__}, not a MapDataset; "
                      "for IterDatasets use IterDataset.mix.")
  return tuple(datasets)


class SelectMapDataset(map_lib.MapDataset[T]):
  """Element `i` is `parents[d][k]` with `(d, k) = selection_map[i]`.

  Args:
    parents: The datasets to select from.
    selection_map: A `DatasetSelectionMap` (loader's or Grain's), or any
      object with `__len__` and `__getitem__(i) -> (d, k)`.
  """

  _same_as_grain = True
  _spec_rule = "parent"

  def __init__(self, parents: Sequence[map_lib.MapDataset[T]], selection_map: Any):
    parents = check_datasets(parents, type(self).__name__)
    super().__init__(parents)
    if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
      raise TypeError(f"selection_map must have __len__ and __getitem__ (a DatasetSelectionMap); "
                      f"got {type(selection_map).__name__}.")
    self._selection_map = selection_map
    self._len = checks.check_int(len(selection_map), "len(selection_map)", minimum=0)

  def __len__(self) -> int:
    return self._len

  def _op_repr(self) -> str:
    return f".select_from_datasets({self._selection_map!r})"

  def __repr__(self) -> str:
    inputs = ", ".join(repr(p) for p in self._parents)
    return f"MapDataset[{inputs}]{self._op_repr()}"

  @property
  def _records_per_element(self) -> int:
    # The costliest input sizes the chunks, so no chunk grows too large.
    return max((p._records_per_element for p in self._parents), default=1)  # pylint: disable=protected-access

  def _select(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    select_many = getattr(self._selection_map, "select_many", None)
    if select_many is not None:
      return select_many(indices)
    return _select_one_by_one(self._selection_map, indices)

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    indices = np.asarray(indices)
    if indices.dtype != object:  # Python ints past int64 stay so (map_dataset.divmod_index).
      indices = indices.astype(np.int64, copy=False)
    if not indices.size:
      return []
    dataset_indices, keys = self._select(indices)
    # A negative key reads the input's epoch -1, as a negative index does (Grain passes keys on as they are).
    bad = (dataset_indices < 0) | (dataset_indices >= len(self._parents))
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      raise IndexError(
          f"Selection map {self._selection_map!r} mapped index {int(indices[i])} to "
          f"(dataset {int(dataset_indices[i])}, index {int(keys[i])}); valid: dataset in "
          f"[0, {len(self._parents)}).")
    out: list[Any] = [None] * indices.size
    # One batched read per input dataset, then scatter back into place.
    order = np.argsort(dataset_indices, kind="stable")
    sorted_ids = dataset_indices[order]
    bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
    for group in np.split(order, bounds):
      parent = self._parents[int(dataset_indices[group[0]])]
      for pos, x in zip(group.tolist(), parent._getitems(keys[group])):  # pylint: disable=protected-access
        out[pos] = x
    return out


def select_from_datasets(datasets: Sequence[map_lib.MapDataset[T]], selection_map: Any) -> map_lib.MapDataset[T]:
  """Grain's `MapDataset.select_from_datasets(datasets, selection_map)`."""
  return SelectMapDataset(datasets, selection_map)
