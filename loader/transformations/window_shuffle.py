"""`WindowShuffleMapDataset` / `WindowShuffleIterDataset`: shuffling within windows (Grain's).

Both split the input into consecutive windows of `window_size` elements and
permute each window with its own seeded permutation, so element sets per
window are Grain's. The permutation itself is ours (a keyed Feistel network
like `loader.permutation`, vectorised over many windows at once), so the
order inside a window differs from Grain's by design.

Difference from Grain: windows restart at every epoch, and the last, shorter
window of an epoch is permuted within itself. Grain's `WindowShuffleMapDataset`
lets that window reach past the end of the dataset, so one pass can return an
element twice and miss another (e.g. `range(10)`, `window_size=4`, `seed=0`
yields 1 twice and no 9); ours always yields each element once per epoch, and
a new window permutation in every epoch.

The map version is random access (runs in `mp_prefetch` workers). The stream
version holds one window; its state has Grain's keys,
`{"parent_window_start_state": <parent state at the window's start>,
"window_index": w, "pos_in_window": p}`, and a restore re-reads that window.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import permutation
from loader import state as state_lib

T = TypeVar("T")

_ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
  """SplitMix64 of every entry of a uint64 array (wrapping arithmetic)."""
  x = x + _GOLDEN
  x = (x ^ (x >> np.uint64(30))) * _MUL1
  x = (x ^ (x >> np.uint64(27))) * _MUL2
  return x ^ (x >> np.uint64(31))


def window_keys(seed: int, epochs: np.ndarray, windows: np.ndarray) -> np.ndarray:
  """One 64-bit key per (seed, epoch, window): distinct windows get unrelated permutations."""
  base = np.uint64(permutation.splitmix64(seed))
  with np.errstate(over="ignore"):
    return _mix(_mix(np.asarray(epochs).astype(np.uint64) ^ base) ^ np.asarray(windows).astype(np.uint64))


def permute_in_windows(offsets: np.ndarray, keys: np.ndarray, size: int) -> np.ndarray:
  """Position `offsets[j]` of a window of `size` elements keyed `keys[j]` -> shuffled position.

  A Feistel network on `Z_a x Z_b` (`a*b >= size`) with cycle walking, as in
  `loader.permutation`, but with a key per entry so many windows are permuted
  in one pass.
  """
  offsets = np.asarray(offsets, dtype=np.int64)
  if size <= 1:
    return offsets.copy()
  a = np.uint64(math.isqrt(size - 1) + 1)
  b = np.uint64(-(-size // int(a)))
  moduli = (a, b)
  with np.errstate(over="ignore"):
    round_keys = [_mix(np.asarray(keys, dtype=np.uint64) + np.uint64(r) * _GOLDEN) for r in range(_ROUNDS)]

    def encrypt(x: np.ndarray, sel: np.ndarray | None) -> np.ndarray:
      left, right = np.divmod(x, b)
      for r, rk in enumerate(round_keys):
        f = right + (rk if sel is None else rk[sel])
        f = _mix(f) % moduli[r % 2]
        left = (left + f) % moduli[r % 2]
        left, right = right, left
      return left * b + right

    out = encrypt(offsets.astype(np.uint64), None)
    limit = np.uint64(size)
    outside = np.flatnonzero(out >= limit)
    while outside.size:  # Cycle walking: re-encrypt until inside [0, size).
      walked = encrypt(out[outside], outside)
      out[outside] = walked
      outside = outside[walked >= limit]
  return out.astype(np.int64)


def _check_args(window_size: Any, seed: Any, what: str) -> tuple[int, int]:
  return checks.check_int(window_size, "window_size", minimum=1), checks.check_seed(seed, what)


class WindowShuffleMapDataset(map_lib.MapDataset[T]):
  """Shuffles positions within consecutive windows of `window_size`, anew each epoch.

  Args:
    parent: The dataset to shuffle.
    window_size: Elements per window, a positive integer.
    seed: Integer in [0, 2**32-1].
  """

  def __init__(self, parent: map_lib.MapDataset[T], *, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = _check_args(window_size, seed, "WindowShuffleMapDataset")
    self._parent_len = len(parent)
    if self._parent_len >= 2**62:
      raise ValueError("Cannot window-shuffle an infinite dataset; shuffle before repeat().")

  def __len__(self) -> int:
    return self._parent_len

  def _op_repr(self) -> str:
    return f".window_shuffle(window_size={self._window_size}, seed={self._seed})"

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    indices = np.asarray(indices, dtype=np.int64)
    if not indices.size:
      return []
    n, ws = self._parent_len, self._window_size
    if not n:
      raise IndexError(f"Cannot read from an empty dataset: {self!r}")
    epochs, pos = np.divmod(indices, n)
    windows, offsets = np.divmod(pos, ws)
    keys = window_keys(self._seed, epochs, windows)
    shuffled = np.empty_like(offsets)
    last_size = n - (n - 1) // ws * ws  # Size of each epoch's last window.
    in_last = windows == (n - 1) // ws
    for mask, size in ((~in_last, ws), (in_last, last_size)):
      if mask.any():
        shuffled[mask] = permute_in_windows(offsets[mask], keys[mask], size)
    return self._parent._getitems(epochs * n + windows * ws + shuffled)  # pylint: disable=protected-access


class WindowShuffleIterDataset(iter_lib.SequentialIterDataset[T]):
  """Reads `window_size` elements at a time and yields them permuted.

  Args:
    parent: The stream to shuffle.
    window_size: Elements per window (held in memory), a positive integer.
    seed: Integer in [0, 2**32-1].
  """

  def __init__(self, parent: iter_lib.IterDataset[T], *, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = _check_args(window_size, seed, "WindowShuffleIterDataset")

  def _op_repr(self) -> str:
    return f".window_shuffle(window_size={self._window_size}, seed={self._seed})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    return _WindowShuffleIterator(parent, self._window_size, self._seed)


class _WindowShuffleIterator(iter_lib.DatasetIterator[T]):

  def __init__(self, parent: iter_lib.DatasetIterator, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size = window_size
    self._seed = seed
    self._window_index = 0
    self._window: list[Any] | None = None  # The shuffled window being handed out.
    self._pos = 0
    self._window_start_state: Any = None

  def _fill(self) -> None:
    parent = self._parent
    # Called from __next__, outside any get_state: drop the pipeline
    # description the outermost call would add, it belongs to our own state.
    self._window_start_state = state_lib.strip(parent.get_state())
    elements = []
    try:
      for _ in range(self._window_size):
        elements.append(next(parent))
    except StopIteration:
      pass
    except Exception:
      parent.set_state(self._window_start_state)  # A retry re-reads the whole window.
      raise
    if not elements:
      raise StopIteration
    key = window_keys(self._seed, np.zeros(1, np.int64), np.array([self._window_index]))
    order = permute_in_windows(np.arange(len(elements)), np.repeat(key, len(elements)), len(elements))
    self._window = [elements[j] for j in order.tolist()]
    self._pos = 0

  def __next__(self) -> T:
    if self._window is not None and self._pos >= len(self._window):
      self._window, self._pos = None, 0
      self._window_index += 1
    if self._window is None:
      self._fill()
    x = self._window[self._pos]
    self._pos += 1
    return x

  def get_state(self) -> dict[str, Any]:
    window, pos, w = self._window, self._pos, self._window_index
    if window is None or pos >= len(window):
      # Between windows: the parent is at the next window's start.
      return {"parent_window_start_state": self._parent.get_state(),
              "window_index": w + (window is not None), "pos_in_window": 0}
    return {"parent_window_start_state": self._window_start_state, "window_index": w, "pos_in_window": pos}

  def set_state(self, state: dict[str, Any]) -> None:
    owner = type(self).__name__
    state_lib.check_keys(state, ("parent_window_start_state", "window_index", "pos_in_window"), owner)
    w = checks.check_int(state["window_index"], "window_index", minimum=0)
    pos = checks.check_int(state["pos_in_window"], "pos_in_window", minimum=0, maximum=self._window_size - 1)
    self._parent.set_state(state["parent_window_start_state"])
    self._window, self._pos, self._window_index = None, 0, w
    if pos:
      self._fill()
      if pos >= len(self._window):
        raise state_lib.StateMismatchError(
            f"{owner}.set_state: pos_in_window={pos} but the window at this state has only "
            f"{len(self._window)} elements; was the state saved from a different pipeline?")
      self._pos = pos
