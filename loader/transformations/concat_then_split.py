"""Concat-then-split packing (Grain's `ConcatThenSplitIterDataset`).

The stream is concatenated and cut every `length_struct[k]` tokens: elements
are added to a buffer until one does not fit; it is split, the buffer becomes
one packed example, and the rest of the split element starts the next buffer.
With several features, the first feature to fill up decides the cut and the
others are padded. Meta features are never split (a split element's meta
features go with both halves) and get no `_segment_ids`/`_positions`. With
`split_full_length_features=False`, elements that already have a full-length
feature are emitted as they are, ahead of the buffer. The packed examples are
Grain 0.2.18's, value for value.

State: `{"parent": ..., "skip": k, "remainder_slices": ...,
"elements_from_buffer_after_checkpoint": n}`. A checkpoint is taken whenever
the buffer is empty or holds only the split remainder: the parent position of
the remainder element (or the current one) as a parent state plus `k`
elements to skip after it, and the remainder's slices per non-meta feature
(`[-1, -1]` meaning "whole element" or "none"). A restore re-reads the
remainder element, then replays the `n` outputs emitted since, so it is exact
at every step; `n` stays small (one buffer's worth). This is Grain's scheme,
except that Grain reads the parent's state before every element.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from loader import checks
from loader import iter_dataset
from loader import state as state_lib

_log = logging.getLogger(__name__)

_WHOLE = (-1, -1)  # Slice marker: the whole feature (nothing was split off).


class BOSHandling(enum.Enum):
  """What concat-then-split does with BOS tokens."""

  # Inputs are packed as they are.
  DO_NOTHING = enum.auto()
  # The first token of every packed segment (including the continuation of a
  # split element) is replaced with `bos_token_id`.
  REPLACE_FIRST_TOKEN_WITH_BOS = enum.auto()


def _as_bos_handling(value: Any) -> BOSHandling:
  if isinstance(value, BOSHandling):
    return value
  # Also accept Grain's own enum members, by name, so mixed code keeps working.
  name = getattr(value, "name", None)
  if isinstance(value, enum.Enum) and name in BOSHandling.__members__:
    return BOSHandling[name]
  raise ValueError(f"bos_handling must be one of {list(BOSHandling)} (got {value!r}).")


def _length(x: Any) -> int:
  if type(x) is np.ndarray:  # pylint: disable=unidiomatic-typecheck
    return x.shape[0] if x.ndim else 1
  return 1 if np.ndim(x) == 0 else len(x)


class _Piece:
  """An element, or the part of it still to pack: `slices[k]` per non-meta feature."""

  __slots__ = ("position", "features", "slices")

  def __init__(self, position: tuple[dict[str, Any], int], features: Mapping[str, Any],
               slices: dict[str, tuple[int, int]]):
    self.position = position  # (anchor state, elements to skip after it) of this element.
    self.features = features
    self.slices = slices

  def feature(self, key: str) -> Any:
    value = self.features[key]
    sl = self.slices.get(key, _WHOLE)
    if sl != _WHOLE and np.ndim(value) != 0:
      return value[sl[0]:sl[1]]
    return value  # Scalars are never sliced (so both halves keep them).

  def split(self, points: dict[str, int]) -> tuple[_Piece | None, _Piece]:
    """(left, right) at absolute `points`; (None, self) if every point is 0."""
    if all(p == 0 for p in points.values()):
      return None, self
    left, right = {}, {}
    for key, p in points.items():
      sl = self.slices[key]
      start, stop = (0, _length(self.features[key])) if sl == _WHOLE else sl
      left[key] = (start, p)
      right[key] = (p, stop)
    return (_Piece(self.position, self.features, left),
            _Piece(self.position, self.features, right))


class _Config:
  """Checked arguments of a ConcatThenSplitIterDataset."""

  def __init__(self, length_struct: Any, meta_features: Collection[str], split_full_length_features: bool,
               bos_handling: Any, bos_features: Collection[str], bos_token_id: int | None):
    checks.check_length_struct(length_struct, "ConcatThenSplitIterDataset", "{'inputs': 1024}")
    for name, value in (("meta_features", meta_features), ("bos_features", bos_features)):
      if isinstance(value, (str, bytes)):
        raise ValueError(f"ConcatThenSplitIterDataset: {name} must be a collection of feature names "
                         f"(got {value!r}; did you mean [{value!r}]?).")
    bos_handling = _as_bos_handling(bos_handling)
    if bos_handling == BOSHandling.DO_NOTHING and (bos_token_id is not None or bos_features):
      raise ValueError(
          f"bos_handling={bos_handling} means no BOS handling, so bos_token_id and bos_features must "
          f"not be set (got {bos_token_id=!r}, {bos_features=!r}).")
    if bos_handling != BOSHandling.DO_NOTHING and bos_token_id is None:
      raise ValueError(f"bos_token_id must be set if bos_handling is {bos_handling}.")
    if not set(meta_features).isdisjoint(bos_features):
      raise ValueError(
          f"bos_features and meta_features must not overlap (bos_features={bos_features!r}, "
          f"meta_features={meta_features!r}).")
    self.length_struct = {k: int(v) for k, v in length_struct.items()}
    self.keys = frozenset(self.length_struct)
    self.meta = frozenset(meta_features)
    self.split_full_length_features = bool(split_full_length_features)
    self.bos_handling = bos_handling
    replace = bos_handling == BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS
    self.bos_keys = frozenset(bos_features) if replace else frozenset()
    self.bos_token_id = bos_token_id
    self.sliced_keys = tuple(k for k in self.length_struct if k not in self.meta)
    self.arange = np.arange(max(self.length_struct.values()), dtype=np.int32)  # Positions are copied from it.
    self.arange.flags.writeable = False

  def whole_slices(self) -> dict[str, tuple[int, int]]:
    return {k: _WHOLE for k in self.sliced_keys}

  def __repr__(self) -> str:
    text = (f"length_struct={self.length_struct}, meta_features={sorted(self.meta)}, "
            f"split_full_length_features={self.split_full_length_features}, bos_handling={self.bos_handling}")
    if self.bos_token_id is not None:
      text += f", bos_features={sorted(self.bos_keys)}, bos_token_id={self.bos_token_id!r}"
    return text


class _ConcatThenSplitIterator(iter_dataset.DatasetIterator):
  """Grain's algorithm; positions in the parent are (anchor state, elements to skip).

  The anchor is renewed at a checkpoint once `_REANCHOR_AFTER` elements were
  read since the last one, so the parent's state is not read before every
  element (as Grain does) and a restore skips few elements.
  """

  _REANCHOR_AFTER = 16
  # Grain's layout: its "parent_state" is a position with nothing to skip.
  _grain_state_keys = ("parent_state", "remainder_slices", "elements_from_buffer_after_checkpoint")

  def __init__(self, parent: iter_dataset.DatasetIterator, config: _Config):
    super().__init__(parent)
    self._config = config
    self._ready: collections.deque[dict[str, np.ndarray]] = collections.deque()
    self._remainder: _Piece | None = None
    self._exhausted = False
    self._anchor = state_lib.strip(parent.get_state())
    self._pulled = 0  # Elements read from the parent since `_anchor`.
    self._checkpoint()

  def _checkpoint(self) -> None:
    if self._pulled >= self._REANCHOR_AFTER:
      self._anchor, self._pulled = state_lib.strip(self._parent.get_state()), 0
    if self._remainder is None:
      self._ckpt_position, self._ckpt_slices = (self._anchor, self._pulled), self._config.whole_slices()
    else:
      self._ckpt_position, self._ckpt_slices = self._remainder.position, self._remainder.slices
    self._emitted_since_ckpt = 0

  def get_state(self) -> dict[str, Any]:
    anchor, skip = self._ckpt_position
    return {"parent": anchor, "skip": skip,
            "remainder_slices": {k: list(v) for k, v in self._ckpt_slices.items()},
            "elements_from_buffer_after_checkpoint": self._emitted_since_ckpt}

  def set_state(self, state: dict[str, Any]) -> None:
    owner = "ConcatThenSplitIterDataset"
    if isinstance(state, dict) and set(state) == set(self._grain_state_keys):
      state = {**state, "parent": state["parent_state"], "skip": 0}
      del state["parent_state"]
    state_lib.check_keys(state, ("parent", "skip", "remainder_slices", "elements_from_buffer_after_checkpoint"),
                         owner)
    slices = state["remainder_slices"]
    if not isinstance(slices, Mapping) or set(slices) != set(self._config.sliced_keys):
      raise ValueError(f"{owner}.set_state: remainder_slices must have the keys {list(self._config.sliced_keys)} "
                       f"(got {slices!r}). Was it saved from a different pipeline?")
    for k in self._config.sliced_keys:
      pair = list(slices[k]) if isinstance(slices[k], np.ndarray) and slices[k].ndim == 1 else slices[k]
      # int() took 1.5 as 1 (and resumed elsewhere) where Grain's slicing raises a TypeError.
      if not (isinstance(pair, (list, tuple)) and len(pair) == 2
              and all(checks.is_int(i) or isinstance(i, bool) for i in pair)):
        raise state_lib.StateTypeError(
            f"{owner}.set_state: remainder_slices[{k!r}] must be a pair of integers [start, end] as get_state() "
            f"wrote it (got {pair!r}); the state was edited or damaged: restore another checkpoint, or start afresh.")
    slices = {k: tuple(int(i) for i in slices[k]) for k in self._config.sliced_keys}
    replay = checks.check_int(state["elements_from_buffer_after_checkpoint"],
                              "elements_from_buffer_after_checkpoint", minimum=0)
    skip = checks.check_int(state["skip"], "skip", minimum=0)
    self._ready.clear()
    self._remainder = None
    self._exhausted = False
    self._parent.set_state(state["parent"])
    self._anchor, self._pulled = state_lib.strip(self._parent.get_state()), 0
    has_remainder = any(sl != _WHOLE for sl in slices.values())
    for _ in range(skip + has_remainder):
      try:
        features = next(self._parent)
      except StopIteration:
        raise ValueError(f"{owner}.set_state: the input ended before the position of {state!r}; "
                         "was it saved from a different pipeline or input?") from None
      except Exception:  # pylint: disable=broad-except
        features = None  # Failed, raised before the state was saved: consumed, and counted in `skip`.
      self._pulled += 1
    if has_remainder:
      self._remainder = _Piece((self._anchor, skip), features, slices)
    self._checkpoint()
    for _ in range(replay):
      try:
        next(self)
      except StopIteration:
        raise ValueError(f"{owner}.set_state: the stream ended while replaying {replay} outputs of "
                         f"{state!r}. Was it saved from a different pipeline or input?") from None

  def _is_full_length(self, piece: _Piece) -> bool:
    full = False
    for key, target in self._config.length_struct.items():
      n = _length(piece.feature(key))
      if n > target:
        return False
      full = full or n == target
    return full

  def _add(self, piece: _Piece, buffer: list[_Piece], used: dict[str, int]) -> _Piece | None:
    """Adds what fits of `piece` to `buffer`; returns the rest, or None if all fit."""
    config = self._config
    added: dict[str, int] = {}
    points: dict[str, int] = {}
    needs_split = False
    for key, target in config.length_struct.items():
      n = _length(piece.feature(key))
      available = target - used[key]
      if key in config.meta:
        if n > available:
          if buffer:
            _log.warning("Meta feature %r limited packing (length %d, %d of %d tokens free); consider "
                         "a larger length_struct value for it.", key, n, available, target)
          return piece  # Meta features are never split.
        added[key] = n
      elif n > available:
        needs_split = True
        sl = piece.slices[key]
        points[key] = (0 if sl == _WHOLE else sl[0]) + available
        added[key] = available
      else:
        points[key] = n  # Grain's value here (a length, not an offset); only ever 0 or a whole feature.
        added[key] = n
    rest = None
    if needs_split:
      piece, rest = piece.split(points)
    if piece is not None:
      buffer.append(piece)
    for key, n in added.items():
      used[key] += n
    return rest

  def _pack(self, pieces: list[_Piece]) -> dict[str, np.ndarray]:
    config = self._config
    out = {}
    for key, target in config.length_struct.items():
      with_ids = key not in config.meta
      first = np.asarray(pieces[0].features[key])
      values = np.zeros((target, *first.shape[1:]), first.dtype)
      if with_ids:
        segment_ids = np.zeros(target, np.int32)
        positions = np.zeros(target, np.int32)
      bos = key in config.bos_keys
      end = 0
      for segment, piece in enumerate(pieces, 1):
        seq = piece.feature(key)
        start = end
        end = start + _length(seq)
        values[start:end] = seq
        if bos and start < target:
          # Grain writes BOS at `start` even for an empty part (a later part
          # overwrites it, or it stays in the padding); we do the same, but an
          # empty part at the very end, where Grain raises IndexError, gets none.
          values[start] = config.bos_token_id
        if with_ids:
          segment_ids[start:end] = segment
          positions[start:end] = config.arange[:end - start]
      out[key] = values
      if with_ids:
        out[f"{key}_segment_ids"] = segment_ids
        out[f"{key}_positions"] = positions
    return out

  def _check_element(self, features: Any) -> None:
    if not isinstance(features, Mapping) or features.keys() != self._config.keys:
      got = list(features) if isinstance(features, Mapping) else type(features).__name__
      # Starts with Grain's words, which client code matches.
      raise ValueError(
          f"Parent element has structure {got} but target sequence length is "
          f"{dict(self._config.length_struct)}. There must be a sequence length for each feature: "
          "ConcatThenSplitIterDataset needs flat dict elements with exactly the keys of length_struct; "
          "drop or add features in a map() first.")

  def __next__(self) -> dict[str, np.ndarray]:
    if self._ready:
      self._emitted_since_ckpt += 1
      return self._ready.popleft()
    if self._exhausted:
      raise StopIteration
    self._assert_not_closed()
    self._checkpoint()  # Nothing buffered but the remainder: a cheap state.
    config = self._config
    buffer: list[_Piece] = []
    used = dict.fromkeys(config.length_struct, 0)
    parent = self._parent
    while True:
      if self._remainder is not None:
        self._remainder = self._add(self._remainder, buffer, used)
        if self._remainder is not None:
          break
      try:
        features = next(parent)
      except StopIteration:
        self._exhausted = True
        break
      except Exception:
        # The failed element is consumed and the buffer dropped with it (as a
        # batch drops its rows): the state is right after it, nothing buffered
        # (unless full-length elements read before it wait in `_ready`).
        self._pulled += 1
        if not self._ready:
          self._checkpoint()
        raise
      self._pulled += 1
      self._check_element(features)
      piece = _Piece((self._anchor, self._pulled - 1), features, config.whole_slices())
      if not config.split_full_length_features and self._is_full_length(piece):
        self._ready.append(self._pack([piece]))  # Already packed: emitted ahead of the buffer.
        continue
      self._remainder = self._add(piece, buffer, used)
      if self._remainder is not None:
        break
    if buffer:
      self._ready.appendleft(self._pack(buffer))
    if self._exhausted and self._remainder is not None:
      self._ready.append(self._pack([self._remainder]))
      self._remainder = None
    if self._ready:
      self._emitted_since_ckpt += 1
      return self._ready.popleft()
    self._checkpoint()
    if self._exhausted:
      raise StopIteration
    bad = {k: _length(self._remainder.feature(k)) for k in config.meta}
    raise ValueError(
        f"ConcatThenSplitIterDataset: an element's meta features are longer than their length_struct "
        f"values and cannot be split (meta feature lengths {bad}, length_struct {config.length_struct}); "
        "truncate them or raise their lengths.")


class ConcatThenSplitIterDataset(iter_dataset.SequentialIterDataset):
  """Concatenates the stream and splits it into examples of the target lengths.

  Elements are flat dicts with a 1-D array (or N-D, split along axis 0) or
  scalar per key of `length_struct`. Each output has, per feature `k`, `k`
  (padded to `length_struct[k]`), `k_segment_ids` (1, 2, ... per element, 0 for
  padding) and `k_positions` (position within the original element), except
  for meta features, which get only `k`.
  """

  _same_as_grain = True  # Grain's packed examples, value for value.

  def __init__(
      self,
      parent: iter_dataset.IterDataset,
      *,
      length_struct: Mapping[str, int],
      meta_features: Collection[str] = (),
      split_full_length_features: bool = True,
      bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
      bos_features: Collection[str] = (),
      bos_token_id: int | None = None,
  ):
    """Creates the dataset (Grain 0.2.18's signature).

    Args:
      parent: The dataset to pack.
      length_struct: Target length per feature; every element has exactly
        these keys.
      meta_features: Features that are never split (a split element's meta
        features go with both parts) and get no segment ids or positions.
      split_full_length_features: If False, elements with a feature already at
        its full length are emitted unsplit, ahead of the buffer.
      bos_handling: `BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS` to start every
        packed segment of `bos_features` with `bos_token_id`.
      bos_features: Features the BOS handling applies to.
      bos_token_id: The BOS token, required with BOS handling.
    """
    super().__init__(parent)
    self._config = _Config(length_struct, meta_features, split_full_length_features, bos_handling,
                           bos_features, bos_token_id)

  def _op_repr(self) -> str:
    return f".ConcatThenSplitIterDataset({self._config!r})"

  def __str__(self) -> str:
    return "ConcatThenSplitIterDataset"

  def make_iterator(self, parent: iter_dataset.DatasetIterator) -> iter_dataset.DatasetIterator:
    return _ConcatThenSplitIterator(parent, self._config)
