"""`grain._src.core.tree_lib`: nested-structure helpers, on `jax.tree_util` as Grain's are when JAX is installed.

Imported only by client code that imports this private path; it needs JAX
(loader itself never imports it).
"""

from __future__ import annotations

import collections
import dataclasses
import pprint
from typing import Any, Callable

import numpy as np

try:
  from jax import tree_util as _tree  # pylint: disable=g-import-not-at-top
except ImportError as e:  # pragma: no cover - JAX is an extra.
  raise ImportError("loader._src.core.tree_lib (grain._src.core.tree_lib) needs JAX: pip install jax") from e

__all__ = ["assert_same_structure", "estimate_byte_size", "flatten", "flatten_with_path", "map_structure",
           "map_structure_up_to", "map_structure_with_path", "spec_like", "unflatten_as"]


def map_structure(f: Callable[..., Any], *trees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
  return _tree.tree_map(f, *trees, is_leaf=is_leaf)


def map_structure_with_path(f: Callable[..., Any], *trees: Any) -> Any:
  return _tree.tree_map_with_path(f, *trees)


def flatten(structure: Any) -> list[Any]:
  return _tree.tree_leaves(structure)


def flatten_with_path(structure: Any) -> list[tuple[Any, Any]]:
  return _tree.tree_flatten_with_path(structure)[0]


def unflatten_as(structure: Any, flat_sequence: Any) -> Any:
  return _tree.tree_unflatten(_tree.tree_structure(structure), flat_sequence)


def assert_same_structure(a: Any, b: Any) -> None:
  if _tree.tree_structure(a) != _tree.tree_structure(b):
    raise ValueError(f"Structures differ: {_tree.tree_structure(a)} vs {_tree.tree_structure(b)}")


def _rebuild_like(template: Any, items: Any) -> Any:
  """A container of `template`'s type holding `items` (namedtuples by position, defaultdicts keep their factory)."""
  if isinstance(template, tuple) and hasattr(template, "_fields"):
    return type(template)(*items)
  if isinstance(template, collections.defaultdict):
    out = type(template)(template.default_factory)
    out.update(items)
    return out
  return type(template)(items)


def map_structure_up_to(shallow_structure: Any, f: Callable[[Any], Any], structure: Any) -> Any:
  """Applies `f` to the subtrees of `structure` at the leaves of `shallow_structure`."""
  if isinstance(shallow_structure, (list, tuple)):
    return _rebuild_like(shallow_structure, [map_structure_up_to(a, f, b)
                                             for a, b in zip(shallow_structure, structure)])
  if isinstance(shallow_structure, collections.abc.Mapping):
    return _rebuild_like(shallow_structure, {k: map_structure_up_to(v, f, structure[k])
                                             for k, v in shallow_structure.items()})
  return f(structure)


def _homogeneous(x: Any) -> bool:
  return isinstance(x, (list, tuple)) and all(isinstance(v, type(x[0])) for v in x)


def _fields_of(obj: Any) -> dict[str, Any] | None:
  """A dataclass's or attrs class's fields by name (without copying them); None for other objects."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
  attrs_fields = getattr(type(obj), "__attrs_attrs__", None)
  if attrs_fields is not None:
    return {a.name: getattr(obj, a.name) for a in attrs_fields}
  return None


def _leaf_spec(x: Any) -> str:
  if isinstance(x, np.ndarray):
    kind = str(x.dtype)
  elif _homogeneous(x):
    kind = f"{type(x).__name__}<{type(x[0]).__name__ if x else ''}>"
  elif (fields := _fields_of(x)) is not None:
    kind = f"{type(x).__name__}\n{pprint.pformat(spec_like(fields))}"
  else:
    kind = type(x).__name__
  try:
    shape = str(list(np.asarray(x).shape))
  except ValueError:  # Ragged.
    shape = "[unknown shape]"
  return kind + shape


def spec_like(structure: Any) -> Any:
  """`structure` with each leaf replaced by a string of its type and shape (as Grain's error messages show).

  Lists and tuples whose items share one type are leaves, shown as
  `list<int>[3]`; arrays as `int32[2, 3]`.
  """
  return map_structure(_leaf_spec, structure, is_leaf=_homogeneous)


def estimate_byte_size(structure: Any) -> int:
  """Bytes held by the tree's bytes/str leaves (their length) and numpy arrays (nbytes); other leaves count 0."""
  if isinstance(structure, (bytes, str)):
    return len(structure)
  total = 0
  for leaf in flatten(structure):
    if isinstance(leaf, (bytes, str)):
      total += len(leaf)
    elif isinstance(leaf, np.ndarray):
      total += leaf.nbytes
  return total
