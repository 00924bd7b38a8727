"""Element specs: the shapes and dtypes of a pipeline's elements, found without reading any.

Grain 0.2.18's experimental `get_element_spec(ds)`: each dataset answers from
its parents' spec (`ds._element_spec`, the hook Grain's datasets and custom
subclasses implement). Sources know theirs only for `MapDataset.range`
(scalars of int64); a map needs its transform to say what it makes
(`output_spec(input_spec)`), a batch adds the batch axis (None unless
`drop_remainder`), a zip makes a tuple of its parents' specs. Stages that
keep elements as they are (shuffle, slice, repeat, filter, prefetch, limit,
cache, mixing and interleaving: the first input's spec) pass their parent's
spec on. Everything else raises, as in Grain.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from loader import batching

__all__ = ["ShapeDtypeStruct", "ShapeDtypeStructProtocol", "get_element_spec"]


@typing.runtime_checkable
class ShapeDtypeStructProtocol(Protocol):
  """Anything with a `shape` and a `dtype` (jax.ShapeDtypeStruct too)."""

  @property
  def shape(self) -> tuple[int | None, ...]:
    ...

  @property
  def dtype(self) -> Any:
    ...


@dataclasses.dataclass(slots=True, frozen=True)
class ShapeDtypeStruct(ShapeDtypeStructProtocol):
  """The shape and dtype of one leaf of an element (a None dimension: not known)."""

  shape: tuple[int | None, ...]
  dtype: Any


def get_element_spec(ds: Any) -> Any:
  """The spec (a tree of `ShapeDtypeStruct`) of `ds`'s elements; reads nothing.

  Raises:
    NotImplementedError: a stage whose output cannot be known without data.
    ValueError: a map whose transform has no `output_spec` method.
  """
  return ds._element_spec  # pylint: disable=protected-access


def not_implemented(ds: Any) -> NotImplementedError:
  return NotImplementedError(f"`element_spec` inference is not implemented for {type(ds).__name__}")


def transformed(transform: Any, parent: Any) -> Any:
  """The spec after a map: the transform's `output_spec(parent spec)`.

  `transform` is what the user passed (a transform object, or its bound
  `map`/`random_map`/`map_with_index` method).
  """
  owner = getattr(transform, "__self__", None)
  output_spec = getattr(owner if owner is not None else transform, "output_spec", None)
  if not callable(output_spec):
    name = type(owner).__name__ if owner is not None else getattr(transform, "__name__", type(transform).__name__)
    raise ValueError(
        f"Cannot infer element spec for transform {name} because it does not implement `output_spec` "
        f"method. Implement `{name}.output_spec(self, input_spec: PyTree[ShapeDtypeStructProtocol]) -> "
        "PyTree[ShapeDtypeStructProtocol]` to enable element spec inference.")
  return output_spec(get_element_spec(parent))


def batched(parent: Any, batch_size: int, drop_remainder: bool, batch_fn: Callable[..., Any] | None) -> Any:
  """The spec after a batch: a leading axis of `batch_size` (None if the last batch may be short)."""
  fn = batch_fn.func if isinstance(batch_fn, functools.partial) else batch_fn
  parent_spec = get_element_spec(parent)  # First, as Grain: an unknown parent spec is its error, whatever the batch_fn.
  if fn is not None and callable(getattr(fn, "output_spec", None)):
    return fn.output_spec(parent_spec, batch_size, drop_remainder)
  if fn is not None and fn is not batching.make_batch:
    raise NotImplementedError("Element spec inference is not supported with custom batching functions")
  size = batch_size if drop_remainder else None
  return batching.map_leaves(lambda x: ShapeDtypeStruct(shape=(size, *x.shape), dtype=x.dtype), parent_spec)


def rebatched(parent: Any, batch_size: int) -> Any:
  """The spec after a rebatch: the leading axis becomes `batch_size`."""
  def replace(x):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      return x
    return type(x)(shape=(batch_size, *x.shape[1:]), dtype=x.dtype)
  return batching.map_leaves(replace, get_element_spec(parent))


def range_spec() -> ShapeDtypeStruct:
  return ShapeDtypeStruct(shape=(), dtype=np.int64)


def by_rule(ds: Any) -> Any:
  """The spec of a dataset by its class's `_spec_rule`: "parent" (its first parent's
  elements unchanged), "transform" (`self._fn`'s `output_spec`), or None (unknown)."""
  rule = ds._spec_rule  # pylint: disable=protected-access
  if rule == "parent":
    return get_element_spec(ds._parents[0])  # pylint: disable=protected-access
  if rule == "transform":
    return transformed(ds._fn, ds._parents[0])  # pylint: disable=protected-access
  raise not_implemented(ds)


# The `_element_spec` property of loader's dataset bases (Grain's hook).
spec_property = property(by_rule, doc="The spec of this dataset's elements (see `get_element_spec`).")
