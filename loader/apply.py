"""`apply_transformations`: Grain transform objects applied to a dataset.

A transform is recognised by the method it defines, so objects subclassing
`loader.transforms`, Grain's `grain.transforms` classes, or neither all work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Checked in this order, as Grain does: an object defining several of these
# methods is treated as the first match. (A TfRandomMap's `np_random_map` is
# the DataLoader's only: Grain's `apply` refuses it too.)
_METHODS = ("map", "random_map", "filter", "map_with_index", "flat_map")


class UnsupportedTransformError(TypeError, NotImplementedError):
  """Not a transform `apply` knows: a TypeError, and Grain's NotImplementedError (which clients catch)."""


def _is_batch(t: Any) -> bool:
  return hasattr(t, "batch_size") and not any(callable(getattr(t, m, None)) for m in _METHODS)


def apply_transformations(ds: Any, transformations: Any) -> Any:
  """Returns `ds` with each transformation applied in order.

  Args:
    ds: A `MapDataset` or `IterDataset`.
    transformations: One transform object or a sequence of them
      (`Map`, `RandomMap`, `Filter`, `MapWithIndex`, `FlatMap`, `Batch`, or
      objects with the same methods/fields).
  """
  if not isinstance(transformations, Sequence):
    transformations = [transformations]
  for t in transformations:
    ds = _apply_one(ds, t)
  return ds


def _apply_one(ds: Any, t: Any) -> Any:
  if _is_batch(t):
    return ds.batch(t.batch_size, drop_remainder=getattr(t, "drop_remainder", False),
                    batch_fn=getattr(t, "batch_fn", None))
  for method in _METHODS:
    fn = getattr(t, method, None)
    if not callable(fn):
      continue
    if method == "map":
      return ds.map(fn)
    if method == "random_map":
      return ds.random_map(fn)
    if method == "filter":
      return ds.filter(fn)
    if method == "map_with_index":
      return ds.map_with_index(fn)
    # Lazy: the flat-map ops import the dataset modules that import this one.
    from loader.transformations import flatmap  # pylint: disable=g-import-not-at-top

    if hasattr(ds, "_getitems"):
      return flatmap.FlatMapMapDataset(ds, t)
    return flatmap.FlatMapIterDataset(ds, t)
  raise UnsupportedTransformError(
      f"Cannot apply {t!r}: expected a transform with one of the methods {list(_METHODS)} "
      "or a Batch (batch_size, drop_remainder).")
