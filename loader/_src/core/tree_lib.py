"""`grain._src.core.tree_lib`: nested-structure helpers, on `jax.tree_util` as Grain's are when JAX is installed.

Imported only by client code that imports this private path; it needs JAX
(loader itself never imports it).
"""

from __future__ import annotations

from typing import Any, Callable

try:
  from jax import tree_util as _tree  # pylint: disable=g-import-not-at-top
except ImportError as e:  # pragma: no cover - JAX is an extra.
  raise ImportError("loader._src.core.tree_lib (grain._src.core.tree_lib) needs JAX: pip install jax") from e

__all__ = ["assert_same_structure", "flatten", "flatten_with_path", "map_structure", "map_structure_with_path",
           "unflatten_as"]


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
