"""`WindowShuffleMapDataset` / `WindowShuffleIterDataset`: shuffling within windows, in Grain's order.

Both split the input into consecutive windows of `window_size` elements and
permute window `w` with Grain's index shuffle seeded `seed + w`, so the
stream is Grain's: the stream version yields each window's permutation from
its end, as Grain's pops it.

One difference, in the map version where Grain's is wrong: when the length is
not a multiple of `window_size`, Grain lets the last window of an epoch reach
past the end of the dataset, so one pass can return an element twice and miss
another (e.g. `range(10)`, `window_size=4`, `seed=0` yields 1 twice and no 9).
Ours permutes that shorter window within itself and starts the next epoch's
windows at its start, so each epoch holds every element once; full windows of
the first epoch, and every window when the length is a multiple of
`window_size` (or the dataset is infinite), are Grain's.

The map version is random access (runs in `mp_prefetch` workers). The stream
version holds one window; its state has Grain's keys,
`{"parent_window_start_state": <parent state at the window's start>,
"window_index": w, "pos_in_window": p}`, and a restore re-reads that window.
A state saved after an element raised while its window was filled also has
`"raised": [r, ...]`: the window's parent reads (1 = its first) whose errors
were raised before; a restore re-reading the window passes over those
elements and goes on after them, as the saved iterator did (Grain's raises
them again). Any other error is raised.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import permutation
from loader import state as state_lib

T = TypeVar("T")

_STATE_KEYS = ("parent_window_start_state", "window_index", "pos_in_window")  # Grain's.


def permute_in_windows(offsets: np.ndarray, seeds: np.ndarray, sizes: np.ndarray) -> np.ndarray:
  """Offset `offsets[j]` of a window of `sizes[j]` elements seeded `seeds[j]` -> Grain's shuffled offset."""
  offsets = np.asarray(offsets, dtype=np.int64)
  out = np.empty_like(offsets)
  groups = np.stack([np.asarray(seeds, np.int64), np.asarray(sizes, np.int64)], axis=1)
  keys, inverse = np.unique(groups, axis=0, return_inverse=True)
  inverse = inverse.reshape(-1)
  for g, (seed, size) in enumerate(keys.tolist()):
    mask = inverse == g
    out[mask] = permutation.shuffle_positions(offsets[mask], size - 1, seed)
  return out


def _check_args(window_size: Any, seed: Any, what: str) -> tuple[int, int]:
  # Grain's window shuffle divides by the window size, and its C++ index_shuffle takes uint32 seeds only.
  return (checks.check_int(window_size, "window_size", minimum=1, range_error=checks.ZeroSizeError),
          checks.check_seed(seed, what, floats="refuse", range_error=checks.RangeTypeError))


class WindowShuffleMapDataset(map_lib.MapDataset[T]):
  """Shuffles positions within consecutive windows of `window_size`, anew each epoch.

  Args:
    parent: The dataset to shuffle.
    window_size: Elements per window, a positive integer.
    seed: Integer in [0, 2**32-1].
  """

  _spec_rule = "parent"

  def __init__(self, parent: map_lib.MapDataset[T], *, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = _check_args(window_size, seed, "WindowShuffleMapDataset")
    self._parent_len = len(parent)

  def __len__(self) -> int:
    return self._parent_len

  @property
  def _same_as_grain(self) -> bool:
    return self._parent_len % self._window_size == 0 or self._parent_len >= 2**62

  def _op_repr(self) -> str:
    return f".window_shuffle(window_size={self._window_size}, seed={self._seed})"

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    if not indices.size:
      return []
    n, ws = self._parent_len, self._window_size
    if not n:
      raise checks.EmptyDatasetError(f"Cannot read from an empty dataset: {self!r}")
    if n >= 2**62:  # Infinite: one epoch of consecutive windows, as in Grain.
      epochs, pos = np.zeros_like(indices), indices
    else:
      epochs, pos = map_lib.divmod_index(indices, n)
    windows, offsets = map_lib.divmod_index(pos, ws)
    per_epoch = -(-n // ws)
    seeds = np.asarray((self._seed + epochs * per_epoch + windows) % 2**32, dtype=np.int64)
    sizes = np.where(windows == per_epoch - 1, n - (per_epoch - 1) * ws, ws)
    shuffled = permute_in_windows(offsets, seeds, sizes)
    return self._parent._getitems(epochs * n + windows * ws + shuffled)  # pylint: disable=protected-access


class WindowShuffleIterDataset(iter_lib.SequentialIterDataset[T]):
  """Reads `window_size` elements at a time and yields them permuted.

  Args:
    parent: The stream to shuffle.
    window_size: Elements per window (held in memory), a positive integer.
    seed: Integer in [0, 2**32-1].
  """

  _same_as_grain = True
  _spec_rule = "parent"

  def __init__(self, parent: iter_lib.IterDataset[T], *, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = _check_args(window_size, seed, "WindowShuffleIterDataset")

  def _op_repr(self) -> str:
    return f".window_shuffle(window_size={self._window_size}, seed={self._seed})"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    return _WindowShuffleIterator(parent, self._window_size, self._seed)


class _WindowShuffleIterator(iter_lib.DatasetIterator[T]):

  _grain_state_keys = _STATE_KEYS

  def __init__(self, parent: iter_lib.DatasetIterator, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size = window_size
    self._seed = seed
    self._window_index = 0
    self._window: list[Any] | None = None  # The shuffled window being handed out.
    self._pos = 0
    self._window_start_state: Any = None
    # The last fill reached the parent's end: once its window is handed out,
    # the stream ends (Grain's `_parent_exhausted`).
    self._parent_exhausted = False
    # A window whose filling an element's error interrupted: (its start state,
    # the elements read, the parent reads made, the reads that raised). As in
    # Grain, the next call goes on filling it after the failed element (which
    # the parent has consumed).
    self._partial: tuple[Any, list[Any], int, list[int]] | None = None
    # The reads (1 = the window's first) of the current window's fill that
    # raised: a state carries them as "raised", so a restore re-reading the
    # window passes over those elements (consumed, their errors raised before)
    # instead of raising them again, as Grain's set_state does.
    self._window_failed: list[int] = []
    self._quiet: frozenset[int] = frozenset()  # Such reads of the next fill, after a set_state.

  def _fill(self) -> None:
    parent = self._parent
    if self._partial is None:
      # Called from __next__, outside any get_state: drop the pipeline
      # description the outermost call would add, it belongs to our own state.
      self._window_start_state = state_lib.strip(parent.get_state())
      elements, reads, failed = [], 0, []
    else:
      (self._window_start_state, elements, reads, failed), self._partial = self._partial, None
    quiet, self._window_failed = self._quiet, []
    try:
      while len(elements) < self._window_size:
        reads += 1
        try:
          x = next(parent)
        except StopIteration:
          raise
        except Exception:  # pylint: disable=broad-except
          failed.append(reads)
          if reads in quiet:
            continue
          raise
        if reads in quiet:  # It failed before the state was saved: consumed then (an error that went away).
          failed.append(reads)
          continue
        elements.append(x)
    except StopIteration:
      self._parent_exhausted = True
    except Exception:
      # The quiet reads stay for the rest of this window's fill (the next call goes on with it).
      self._partial = (self._window_start_state, elements, reads, failed)
      raise
    self._quiet = frozenset()
    self._window_failed = failed
    if not elements:
      raise StopIteration
    # Grain pops its shuffled window from the end.
    order = permutation.shuffle_positions(np.arange(len(elements) - 1, -1, -1), len(elements) - 1,
                                          (self._seed + self._window_index) % 2**32)
    self._window = [elements[j] for j in order.tolist()]
    self._pos = 0

  def __next__(self) -> T:
    if self._window is not None and self._pos >= len(self._window):
      if self._parent_exhausted:  # The last, shorter window is spent (Grain's state stays at its end).
        raise StopIteration
      self._window, self._pos = None, 0
      self._window_index += 1
    if self._window is None:
      self._fill()
    x = self._window[self._pos]
    self._window[self._pos] = None  # Handed out (as Grain pops it); the spent window keeps only its length.
    self._pos += 1
    return x

  def get_state(self) -> dict[str, Any]:
    window, pos, w = self._window, self._pos, self._window_index
    if self._partial is not None:  # Restoring re-reads the interrupted window from its start.
      state = {"parent_window_start_state": self._partial[0], "window_index": w, "pos_in_window": 0}
      raised = sorted(set(self._partial[3]) | self._quiet)  # Reads to come that raised before count too.
    elif window is None:
      # Before the first window: the parent's position; after a fill that found
      # no element (the end): where that fill started, as Grain's.
      start = self._parent.get_state() if self._window_start_state is None else self._window_start_state
      state = {"parent_window_start_state": start, "window_index": w, "pos_in_window": 0}
      raised = sorted(self._quiet) if self._window_start_state is None else self._window_failed
    else:
      # As Grain's: a spent window keeps its start and count, its window_index
      # already the next window's (a restore re-reads it and goes on after it).
      state = {"parent_window_start_state": self._window_start_state, "window_index": w + (pos >= len(window)),
               "pos_in_window": pos}
      raised = self._window_failed
    if raised:
      state["raised"] = list(raised)  # Only then: other states keep Grain's layout.
    return state

  def set_state(self, state: dict[str, Any]) -> None:
    owner = type(self).__name__
    state_lib.check_keys(state, _STATE_KEYS + ("raised",) if isinstance(state, dict) and "raised" in state
                         else _STATE_KEYS, owner)
    w = checks.check_int(state["window_index"], "window_index", minimum=0)
    pos = checks.check_int(state["pos_in_window"], "pos_in_window", minimum=0, maximum=self._window_size)
    raised = state.get("raised", [])
    if not isinstance(raised, (list, tuple)):
      raise state_lib.StateMismatchError(f"{owner}.set_state: \"raised\" must be a list of the window's reads "
                                         f"that raised (1 = its first), got {raised!r:.100}.")
    raised = frozenset(checks.check_int(r, "raised", minimum=1) for r in raised)
    self._parent.set_state(state["parent_window_start_state"])
    self._window, self._pos, self._window_index, self._partial = None, 0, w, None
    self._parent_exhausted, self._window_start_state = False, None
    self._window_failed, self._quiet = [], raised
    if pos:
      self._fill()
      if pos > len(self._window):
        raise state_lib.StateMismatchError(
            f"{owner}.set_state: pos_in_window={pos} but the window at this state has only "
            f"{len(self._window)} elements; was the state saved from a different pipeline?")
      self._pos = pos
      if pos == len(self._window):
        # Grain's state after a window's last element: its window_index is
        # already the next window's; the spent window is kept, as Grain's.
        self._window_index = max(w - 1, 0)
