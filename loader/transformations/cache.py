"""`CacheIterDataset`: keeps a stream's elements in memory so restores replay them (Grain's).

The stream is the parent's, unchanged. Once one iterator has read the parent
to its end, restoring that iterator to any earlier position serves the
elements from memory instead of reading the parent again. State has Grain's
keys, `{"parent": ..., "position": n, "cache_filled": bool}`; a state whose
cache was filled, restored into an iterator that has not filled its own,
re-reads the first `n` elements from the parent's start (as Grain does),
passing over elements that raise until the cache is filled again (the run
that saved it served that pass from memory, without them). A
state of the first pass, restored into a fresh iterator, does not fill the
cache: later passes read the parent again (so an element that raised in the
first pass raises again there, where the uninterrupted run served the cache).
Memory grows with the stream: cache only what fits.
"""

from __future__ import annotations

from typing import Any, TypeVar

from loader import checks
from loader import iter_dataset as iter_lib
from loader import state as state_lib

T = TypeVar("T")

_KEYS = ("parent", "position", "cache_filled")
# In a row, with nothing delivered between: past this the parent fails for good, and its error is raised.
_MAX_SKIPPED_ERRORS = 10_000


class CacheIterDataset(iter_lib.SequentialIterDataset[T]):
  """Caches the elements of `parent` in memory.

  Args:
    parent: The stream to cache.
  """

  _same_as_grain = True
  _spec_rule = "parent"

  def __init__(self, parent: iter_lib.IterDataset[T]):  # Grain's keyword: CacheIterDataset(parent=ds).
    super().__init__(parent)

  def _op_repr(self) -> str:
    return ".cache()"

  def make_iterator(self, parent: iter_lib.DatasetIterator) -> iter_lib.DatasetIterator[T]:
    return _CacheIterator(parent)


class _CacheIterator(iter_lib.DatasetIterator[T]):

  _grain_state_keys = _KEYS  # Grain's layout: its states restore here.

  def __init__(self, parent: iter_lib.DatasetIterator[T]):
    super().__init__(parent)
    self._start_state = state_lib.strip(parent.get_state())
    self._cache: list[T] = []  # Elements 0..len-1 of the stream, when `_complete`.
    self._complete = True  # False once a restore skipped elements we never saw.
    self._filled = False  # The parent was read to its end with a complete cache.
    self._position = 0
    self._skip_errors = False  # Restored into a pass the saving run served from its filled cache.

  def __next__(self) -> T:
    if self._filled:
      if self._position < len(self._cache):
        self._position += 1
        return self._cache[self._position - 1]
      raise StopIteration
    failures = 0
    while True:
      try:
        x = next(self._parent)
        break
      except StopIteration:
        self._filled = self._complete and len(self._cache) == self._position
        raise
      except Exception:  # pylint: disable=broad-except
        failures += 1
        if not self._skip_errors or failures > _MAX_SKIPPED_ERRORS:
          raise
    if self._complete and len(self._cache) == self._position:
      self._cache.append(x)
    self._position += 1
    return x

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), "position": self._position, "cache_filled": self._filled}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, _KEYS, type(self).__name__)
    position = checks.check_int(state["position"], "position", minimum=0)
    if self._filled:
      if position > len(self._cache):
        raise state_lib.StateMismatchError(
            f"{type(self).__name__}.set_state: position={position} but the stream has only "
            f"{len(self._cache)} elements; was the state saved from a different pipeline?")
      self._position = position
      return
    if state["cache_filled"]:
      # The parent's state is its end; replay the stream up to `position`.
      self._parent.set_state(self._start_state)
      # The run that saved it served this pass from its cache, which holds no failed element (its first pass
      # raised them): the replay, and the reads after it until the cache is filled again, pass over them.
      self._cache, self._complete, self._position, self._skip_errors = [], True, 0, True
      for _ in range(position):
        try:
          next(self)
        except StopIteration:
          raise state_lib.StateMismatchError(
              f"{type(self).__name__}.set_state: position={position} of a filled cache, but the stream has "
              f"{self._position} elements; was the state saved from a different pipeline?") from None
      return
    self._parent.set_state(state["parent"])
    self._skip_errors = False
    if position <= len(self._cache):
      del self._cache[position:]
    else:
      self._cache, self._complete = [], False
    self._position = position
