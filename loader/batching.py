"""Stacking elements into batches, leaf by leaf through nested containers."""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import Any

import numpy as np


_ATOMIC = {bytes, str}


class StructureMismatchError(ValueError):
  """Elements whose trees differ (keys, lengths, container types, None vs a value), not just shapes."""


def _mixed_none(path: str) -> ValueError:
  return StructureMismatchError(f"Cannot batch {path or '<element>'}: some elements are None and some are not.")


def _object_array(values: Sequence[Any]) -> np.ndarray:
  out = np.empty(len(values), dtype=object)
  types = set(map(type, values))
  if types <= _ATOMIC:
    out[:] = values  # Fast path; numpy does not split bytes/str into items.
  else:
    for i, v in enumerate(values):  # Elementwise so sequences stay whole.
      out[i] = v
  return out


def _numeric_leaf(x: Any) -> bool:
  # Anything numpy converts by protocol (JAX and TF arrays, PIL images)
  # stacks as an array, as Grain's np.stack does.
  return (isinstance(x, (np.ndarray, np.generic, int, float, bool, complex))
          or hasattr(x, "__array__") or hasattr(x, "__array_interface__"))


def _batch_keys(mapping: Mapping) -> list:
  # Grain flattens dicts with their keys sorted, so batches list keys sorted;
  # an OrderedDict keeps its own order (JAX's pytree rule, which Grain uses).
  if isinstance(mapping, collections.OrderedDict):
    return list(mapping.keys())
  try:
    return sorted(mapping.keys())
  except TypeError:  # Keys that do not compare: keep their order.
    return list(mapping.keys())


def _rebuild_mapping(first: Mapping, out: dict) -> Mapping:
  if type(first) is dict:  # pylint: disable=unidiomatic-typecheck
    return out
  if isinstance(first, collections.defaultdict):
    return type(first)(first.default_factory, out)
  return type(first)(out)


def _pytree_children(value: Any, jax_tree_util: Any) -> tuple[list[Any], Any]:
  """The direct children of a JAX pytree node, and its treedef (one level)."""
  return jax_tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)


def _batch_pytree_node(values: Sequence[Any], path: str) -> Any:
  """Batches elements that are JAX pytree nodes (registered dataclasses, flax
  structs, ...) field by field, as Grain's JAX-backed tree map does; None if
  they are not (or JAX was never imported, so nothing can be registered)."""
  jax = sys.modules.get("jax")
  tree_util = getattr(jax, "tree_util", None)
  if tree_util is None:
    return None
  children, treedef = _pytree_children(values[0], tree_util)
  if tree_util.treedef_is_leaf(treedef):
    return None
  columns = [[c] for c in children]
  for v in values[1:]:
    other, other_def = _pytree_children(v, tree_util)
    if other_def != treedef:
      raise StructureMismatchError(f"Cannot batch {path or '<element>'}: elements have different structures "
                       f"({treedef} vs {other_def}).")
    for column, c in zip(columns, other):
      column.append(c)
  return treedef.unflatten([_make_batch(column, f"{path}[{i}]") for i, column in enumerate(columns)])


def _stack_leaves(values: Sequence[Any], path: str) -> np.ndarray:
  first = values[0]
  if isinstance(first, bytes) or not (isinstance(first, str) or _numeric_leaf(first)):
    return _object_array(values)
  try:
    stacked = np.stack([np.asarray(v) for v in values])
  except ValueError as e:
    shapes = sorted({np.shape(v) for v in values})
    raise ValueError(
        f"Cannot batch leaf {path or '<element>'}: elements have different "
        f"shapes {shapes[:5]}. Pad them to one shape in a map() before batch(), "
        "or pass batch_fn=.") from e
  return stacked


class _NoneElement:
  """What a custom batch_fn's None travels as through the random-access part, where None marks a filtered hole.

  An iterator-level batch folded into the MapDataset (`to_iter_dataset().batch(n, batch_fn=f)`) hands out f's
  None as an element, as Grain's does; the engine's iterator turns this back into None. Pickled by name, so it
  stays the one object across worker processes.
  """

  __slots__ = ()

  def __reduce__(self) -> str:
    return "NONE_ELEMENT"

  def __repr__(self) -> str:
    return "NONE_ELEMENT"


NONE_ELEMENT = _NoneElement()


def make_batch(values: Sequence[Any]) -> Any:
  """Stacks `values` along a new leading axis, recursing into containers.

  Dicts (any Mapping), lists, tuples and namedtuples are batched per field and
  keep their type; as in Grain, a dict's keys come out sorted (elements may
  list them in any order; an OrderedDict keeps its order), and a None field
  stays None. Classes registered as JAX pytree nodes (registered dataclasses,
  flax structs) are batched per child when JAX is imported, as in Grain.
  Numeric and `str` leaves (numpy arrays and scalars, Python numbers and
  strings) become `np.stack`-ed arrays (strings: numpy's '<U' dtype, as in
  Grain). `bytes` and any other object become a 1-D numpy array of dtype
  object holding the original objects: not `np.stack`, whose fixed-width 'S'
  dtype would silently strip trailing NUL bytes from serialized protos.

  Args:
    values: A non-empty sequence of elements with the same structure.

  Returns:
    One element of the same structure whose leaves have a leading batch axis.

  Raises:
    ValueError: the elements' structures or shapes differ (the message starts
      with Grain's, which client code matches, then names the leaf).
  """
  if not values:
    raise ValueError("Cannot batch 0 values (an empty list of elements).")
  try:
    return _make_batch(values, "")
  except ValueError as e:
    # A plain ValueError, as Grain's; the cause tells a structure from a shape mismatch.
    raise ValueError(f"Expected all input elements to have the same structure but got: {e}") from e


def _make_batch(values: Sequence[Any], _path: str) -> Any:
  first = values[0]
  if first is None:
    # None is an empty subtree to Grain's tree map: it stays None, and a value
    # after it does not match it. A None after a leaf (an optional field) is a
    # leaf there, and the batch an object array, as np.stack makes it in Grain.
    if all(v is None for v in values):
      return None
    raise _mixed_none(_path)
  if isinstance(first, Mapping):
    keys = _batch_keys(first)
    ordered = isinstance(first, collections.OrderedDict)  # Its order is part of its structure.
    for v in values:
      if not isinstance(v, Mapping) or v.keys() != first.keys() or (ordered and list(v.keys()) != keys):
        raise StructureMismatchError(
            f"Cannot batch {_path or '<element>'}: elements have different keys "
            f"({keys} vs {list(v.keys()) if isinstance(v, Mapping) else type(v).__name__}).")
    out = {k: _make_batch([v[k] for v in values], f"{_path}[{k!r}]") for k in keys}
    return _rebuild_mapping(first, out)
  if isinstance(first, (tuple, list)):
    n = len(first)
    for v in values:
      if type(v) is not type(first) or len(v) != n:
        raise StructureMismatchError(
            f"Cannot batch {_path or '<element>'}: elements have different "
            f"structures ({type(first).__name__} of {n} vs {type(v).__name__} "
            f"of {len(v) if isinstance(v, Sized) else '?'}).")
    fields = [_make_batch([v[i] for v in values], f"{_path}[{i}]") for i in range(n)]
    if isinstance(first, tuple) and hasattr(first, "_fields"):
      return type(first)(*fields)
    return type(first)(fields)
  if not isinstance(first, (bytes, str)) and not _numeric_leaf(first):
    batched = _batch_pytree_node(values, _path)
    if batched is not None:
      return batched
  return _stack_leaves(values, _path)


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
  """`fn` applied to each leaf of dicts, lists and tuples, keeping their types.

  Plain dicts come out with sorted keys, as Grain's pytree maps return them;
  other mappings (OrderedDict ...) keep their order; namedtuples stay
  namedtuples.
  """
  if isinstance(tree, Mapping):
    if type(tree) is dict:  # pylint: disable=unidiomatic-typecheck
      return {k: map_leaves(fn, tree[k]) for k in sorted(tree)}
    return type(tree)({k: map_leaves(fn, v) for k, v in tree.items()})
  if isinstance(tree, (tuple, list)):
    fields = [map_leaves(fn, v) for v in tree]
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
      return type(tree)(*fields)
    return type(tree)(fields)
  return fn(tree)


def enable_shared_memory_output(self) -> None:  # pylint: disable=unused-argument
  """Grain's switch to write batches into shared memory; a no-op here.

  Shared as a method by the batch datasets. loader's worker processes
  already hand every numpy array to the consumer through shared memory, so
  there is nothing to switch on.
  """
