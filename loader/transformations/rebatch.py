"""`RebatchIterDataset`: batches cut and glued to a new batch size (Grain's).

Input elements are batched pytrees (dicts, lists, tuples, namedtuples of
arrays with a common leading dimension). Rows flow through in order: a new
batch takes the rest of one input batch and the start of the next. State is
Grain's: `{"parent": <parent state before the input batch being cut>,
"batch_idx": <rows of it already used>}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loader import checks
from loader import element_spec
from loader import iter_dataset as iter_lib
from loader import state as state_lib


def _sorted_keys(mapping: Mapping) -> list[Any]:
  # Sorted like JAX pytrees, so dicts built in different orders still line up.
  try:
    return sorted(mapping)
  except TypeError:
    return list(mapping)


def _flatten(tree: Any, out: list[Any]) -> list[Any]:
  if isinstance(tree, Mapping):
    for k in _sorted_keys(tree):
      _flatten(tree[k], out)
  elif isinstance(tree, (list, tuple)):
    for v in tree:
      _flatten(v, out)
  elif tree is not None:  # None is an empty subtree, as in JAX.
    out.append(tree)
  return out


def _unflatten(structure: Any, leaves: Any) -> Any:
  """`structure` with its leaves replaced, in `_flatten` order, from the iterator `leaves`."""
  if isinstance(structure, Mapping):
    values = {k: _unflatten(structure[k], leaves) for k in _sorted_keys(structure)}
    if type(structure) is dict:
      return values  # Keys sorted, as Grain's JAX tree unflatten rebuilds a dict.
    return type(structure)({k: values[k] for k in structure})
  if isinstance(structure, (list, tuple)):
    items = [_unflatten(v, leaves) for v in structure]
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
      return type(structure)(*items)
    return type(structure)(items)
  if structure is None:
    return None
  return next(leaves)


class RebatchIterDataset(iter_lib.SequentialIterDataset):
  """Re-cuts batched elements into batches of `batch_size` rows.

  Args:
    parent: A stream of batched pytrees.
    batch_size: Rows per output batch, a positive integer.
    drop_remainder: Drop a last batch with fewer than `batch_size` rows.
  """

  _same_as_grain = True

  @property
  def _element_spec(self) -> Any:
    return element_spec.rebatched(self._parent, self._batch_size)

  def __init__(self, parent: iter_lib.IterDataset, batch_size: int, drop_remainder: bool = False):
    super().__init__(parent)
    self._batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
    self._drop_remainder = bool(drop_remainder)

  def _op_repr(self) -> str:
    return f".rebatch({self._batch_size}, drop_remainder={self._drop_remainder})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator:
    return _RebatchIterator(parent, self._batch_size, self._drop_remainder)


class _RebatchIterator(iter_lib.DatasetIterator):

  _grain_state_keys = ("parent", "batch_idx")  # Grain's layout: its states restore here.

  def __init__(self, parent: iter_lib.DatasetIterator, batch_size: int, drop_remainder: bool):
    super().__init__(parent)
    self._batch_size = batch_size
    self._drop_remainder = drop_remainder
    self._structure: Any = None  # Of the first input, as Grain caches its treedef.
    self._num_leaves = 0
    # Read outside get_state, the parent's state comes stamped with its pipeline
    # description (loader.state); nested in ours, only the position is kept.
    self._parent_state = state_lib.strip(parent.get_state())  # Before the input batch being cut.
    self._leaves: list[Any] | None = None  # None: (re)read that input batch.
    self._rows = 0
    self._pos = 0  # Rows of it already used.
    # The batch being gathered: (state at its start, rows so far); a Ctrl-C
    # while reading leaves the state at its start.
    self._partial: tuple[dict[str, Any], list[list[Any]]] | None = None

  def _after_failed_input(self) -> None:
    # The parent consumed the failed element and, as in Grain, the rows
    # gathered for this batch go with it: the next batch starts after it.
    self._parent_state = state_lib.strip(self._parent.get_state())
    self._partial, self._leaves, self._pos = None, None, 0

  def _read(self) -> bool:
    """Loads the input batch at `_parent_state`; False at the end of the stream."""
    try:
      x = next(self._parent)
    except StopIteration:
      return False
    except Exception:
      self._after_failed_input()
      raise
    leaves = _flatten(x, [])
    rows = len(leaves[0]) if leaves else 0
    if rows <= 0:
      raise ValueError(f"RebatchIterDataset needs batched elements with a leading dimension >= 1 (got {x!r:.200}).")
    if self._structure is None:
      self._structure, self._num_leaves = x, len(leaves)
    elif len(leaves) != self._num_leaves:
      self._after_failed_input()
      # Grain's words (its treedef's unflatten): later rows would not fit the first element's structure.
      raise ValueError(f"Too {'few' if len(leaves) < self._num_leaves else 'many'} leaves for PyTreeDef; expected "
                       f"{self._num_leaves}, got {len(leaves)}. RebatchIterDataset needs every element to have the "
                       f"structure of the first (got {x!r:.200}).")
    self._leaves, self._rows = leaves, rows
    return True

  def __next__(self) -> Any:
    if self._partial is None:
      self._partial = (self._position(), [])
    pieces = self._partial[1]
    need = self._batch_size - sum(len(p[0]) for p in pieces)
    while need:
      if self._leaves is not None and self._pos >= self._rows:  # Used up: next input.
        self._parent_state = state_lib.strip(self._parent.get_state())
        self._leaves, self._pos = None, 0
      if self._leaves is None and not self._read():
        break
      take = min(need, self._rows - self._pos)
      if take > 0:
        pieces.append([leaf[self._pos:self._pos + take] for leaf in self._leaves])
      self._pos += take
      need -= take
    self._partial = None
    if not pieces or (need and self._drop_remainder):
      raise StopIteration
    if len(pieces) == 1:
      leaves = pieces[0]
    else:
      leaves = [np.concatenate(parts, axis=0) for parts in zip(*pieces)]
    return _unflatten(self._structure, iter(leaves))

  def _position(self) -> dict[str, Any]:
    return {"parent": self._parent_state, "batch_idx": self._pos}

  def get_state(self) -> dict[str, Any]:
    return self._partial[0] if self._partial is not None else self._position()

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("parent", "batch_idx"), type(self).__name__)
    pos = checks.check_int(state["batch_idx"], "batch_idx", minimum=0)
    self._parent.set_state(state["parent"])
    self._parent_state = self._parent.get_state()
    self._leaves, self._pos, self._partial = None, pos, None
