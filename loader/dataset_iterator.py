"""`DatasetIterator`: the iterator base class, and where states get described.

Subclasses implement `__next__`, `get_state` and `set_state` as in Grain. The
base class wraps those two methods once per subclass so that the *outermost*
call adds (get) or checks and removes (set) the pipeline description of
`loader.state`; calls an iterator makes on its parents pass through
untouched. Subclasses therefore never deal with descriptions, and a state
nests its parents' states without repeating them.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from loader import checkpoint
from loader import dataset_options
from loader import state as state_lib
from loader import stats as stats_lib

T = TypeVar("T")

_local = threading.local()


def _depth() -> int:
  return getattr(_local, "depth", 0)


class StopRequested(BaseException):
  """Raised inside a prefetch thread's `next(parent)` once its iterator was closed or dropped.

  A BaseException, so that a user's `except Exception` in a custom iterator does not swallow it.
  """


def stop_this_thread_on(event: threading.Event) -> None:
  """Makes `raise_if_stop_requested` in this thread raise StopRequested once `event` is set."""
  _local.stop = event


def stop_requestable() -> bool:
  """Whether this thread is a prefetch thread that may be asked to stop."""
  return getattr(_local, "stop", None) is not None


def raise_if_stop_requested() -> None:
  """Lets a prefetch thread leave a search that may not end (a filter dropping every element of a repeated
  dataset): called once per chunk or dropped element, never per element handed out."""
  stop = getattr(_local, "stop", None)
  if stop is not None and stop.is_set():
    raise StopRequested


def restoring_foreign_state() -> bool:
  """True inside a `set_state` of a state that Grain (not loader) wrote."""
  return getattr(_local, "foreign", False)


@contextlib.contextmanager
def parent_calls() -> Iterator[None]:
  """Marks calls an iterator makes on its parents outside its own get/set_state.

  E.g. rewinding the parent to an epoch start in `__next__`: inside the block
  states pass through unstamped and unchecked, as they do within get/set_state.
  """
  outer = _depth()
  _local.depth = outer + 1
  try:
    yield
  finally:
    _local.depth = outer


def _user_defined(fn) -> bool:
  return not (getattr(fn, "__module__", None) or "").startswith("loader.")


def _wrap_get_state(fn):
  user_defined = _user_defined(fn)

  @functools.wraps(fn)
  def get_state(self):
    if _depth():
      return fn(self)
    with parent_calls():
      state = fn(self)
    description = self._state_description()  # pylint: disable=protected-access
    if description is None or (user_defined and not isinstance(state, dict)):
      return state  # A custom iterator's own non-dict state stays as Grain returns it.
    return state_lib.stamp(state, description)

  get_state._loader_wrapped = True  # pylint: disable=protected-access
  return get_state


def _wrap_set_state(fn):
  user_defined = _user_defined(fn)

  @functools.wraps(fn)
  def set_state(self, state):
    if _depth():
      return fn(self, state_lib.strip(state))
    description = self._state_description()  # pylint: disable=protected-access
    foreign = False
    if not (user_defined or state_lib.has_user_iterator(getattr(self, "_loader_dataset", None))):
      state = state_lib.plain(state)  # A user's iterator may want its numpy values as they are.
    if not isinstance(state, dict) and user_defined:
      description = None  # A custom iterator's own non-dict state: its set_state checks it.
    if description is not None:
      if state_lib.is_stamped(state):
        state_lib.check(state, description, type(self).__name__)
        state = state_lib.strip(state)
      else:
        state = state_lib.unwrap_grain_workers(state, self._loader_dataset, type(self).__name__)  # pylint: disable=protected-access
        self._check_foreign_state(state)  # pylint: disable=protected-access
        foreign = True
    _local.foreign = foreign
    try:
      with parent_calls():
        return fn(self, state)
    finally:
      _local.foreign = False

  set_state._loader_wrapped = True  # pylint: disable=protected-access
  return set_state


def get_next_index(ds_iter: DatasetIterator) -> int:
  """The index of the element `ds_iter` produces next (Grain's experimental API)."""
  return ds_iter._get_next_index()  # pylint: disable=protected-access


def set_next_index(ds_iter: DatasetIterator, index: int) -> None:
  """Moves `ds_iter` so that it produces element `index` next, without computing any (Grain's experimental API)."""
  ds_iter._set_next_index(index)  # pylint: disable=protected-access


def _shared_context(parents: Sequence[DatasetIterator]) -> dataset_options.IteratorContext:
  """One context for a new iterator and every iterator below it (as in Grain).

  Options set anywhere in a pipeline (`WithOptionsIterDataset`) then reach
  the stages before and after it.
  """
  if not parents:
    return dataset_options.IteratorContext()
  ctx = parents[0]._ctx  # pylint: disable=protected-access
  to_visit = list(parents[1:])
  for p in to_visit:
    ctx.merge(p._ctx)  # pylint: disable=protected-access
  while to_visit:
    it = to_visit.pop()
    it._ctx = ctx  # pylint: disable=protected-access
    to_visit.extend(it._parents)  # pylint: disable=protected-access
  return ctx


def _close_when_collected(self) -> None:
  if "_closed" in self.__dict__:  # Its __init__ ran (a failed one leaves nothing to close).
    self.close()


class DatasetIterator(checkpoint.OrbaxCheckpointable, abc.ABC, Iterator[T]):
  """Iterator with checkpointable state, like Grain's `DatasetIterator`.

  Use it as a context manager (or call `close()`) to release threads and
  worker processes promptly; garbage collection releases them too.
  """

  # Grain subclasses record execution statistics through it (a no-op here).
  _stats = stats_lib.NO_STATS

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    for name, wrap in (("get_state", _wrap_get_state), ("set_state", _wrap_set_state)):
      fn = cls.__dict__.get(name)
      if fn is not None and not getattr(fn, "_loader_wrapped", False):
        setattr(cls, name, wrap(fn))
    if "close" in cls.__dict__ and "__del__" not in cls.__dict__ and not cls.__module__.startswith("loader."):
      # Grain's iterators call close() when collected, so a user's own close() (files, clients) runs then too.
      cls.__del__ = _close_when_collected

  def __init__(self, parents: DatasetIterator | Sequence[DatasetIterator] | None = None):
    if parents is None:
      parents = ()
    elif isinstance(parents, DatasetIterator):
      parents = (parents,)
    self._parents = tuple(parents)
    self._ctx = _shared_context(self._parents)
    self._closed = False

  @property
  def _parent(self) -> DatasetIterator:
    # As Grain's: an iterator without a parent (a source) has none to give; clients walk chains until this.
    assert self._parents, f"{type(self).__name__} has no parent iterator"
    return self._parents[0]

  def __iter__(self) -> DatasetIterator[T]:
    return self

  @abc.abstractmethod
  def __next__(self) -> T:
    """Returns the next element or raises StopIteration."""

  @abc.abstractmethod
  def get_state(self) -> dict[str, Any]:
    """A small JSON-serialisable dict describing the position (and the pipeline)."""

  @abc.abstractmethod
  def set_state(self, state: dict[str, Any]) -> None:
    """Moves to `state` (from `get_state` of an iterator of the same pipeline)."""

  def _get_next_index(self) -> int:
    raise NotImplementedError(
        f"get_next_index is not supported by {type(self).__name__}: loader supports it on iterators of a "
        "MapDataset part (to_iter_dataset(), with the map/filter/batch stages folded into it, and mp_prefetch "
        "over one); use get_state() elsewhere.")

  def _set_next_index(self, index: int) -> None:
    raise NotImplementedError(
        f"set_next_index is not supported by {type(self).__name__}: loader supports it on iterators of a "
        "MapDataset part (to_iter_dataset(), with the map/filter/batch stages folded into it, and mp_prefetch "
        "over one); use set_state() elsewhere.")

  def _assert_not_closed(self) -> None:
    """Raises ValueError after close() (Grain's helper, which custom iterators call in __next__), in Grain's words."""
    if self._closed:
      raise ValueError(f"Trying to advance a closed iterator: '{self}'.")

  def start_prefetch(self) -> None:
    """Starts background work (threads, worker processes) before the first `next`.

    A no-op for iterators with nothing to start; parents are started too.
    """
    for p in self._parents:
      p.start_prefetch()

  def close(self) -> None:
    """Releases background threads/processes; idempotent."""
    if self._closed:
      return
    self._closed = True
    for p in self._parents:
      p.close()

  def __enter__(self) -> DatasetIterator[T]:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---- State descriptions (see loader.state) ------------------------------

  def _state_description(self) -> list[str] | None:
    ds = getattr(self, "_loader_dataset", None)
    if ds is None:
      return None
    cached = getattr(self, "_loader_description", None)
    if cached is None or cached[0] is not ds:
      cached = (ds, state_lib.describe(ds))
      self._loader_description = cached
    return cached[1]

  def _check_foreign_state(self, state: Any) -> None:
    """Accepts a Grain-written state only where resuming it is exact."""
    ds = self._loader_dataset  # pylint: disable=no-member
    description = self._state_description()
    if not isinstance(state, dict):
      raise state_lib.not_a_dict(state, type(self).__name__)
    # Iterators whose state layout is Grain's name its keys (default: MapDatasetIterator's).
    # Below a user's own iterator the layout is the user's: its set_state checks it, as in Grain.
    grain_keys = getattr(self, "_grain_state_keys", ("next_index",))
    if set(state) != set(grain_keys) and not state_lib.has_user_iterator(ds):
      keys = sorted(state) if isinstance(state, dict) else type(state).__name__
      raise state_lib.mismatch(state, grain_keys,
          f"{type(self).__name__}.set_state: this state (keys {keys}) has no pipeline description (written by "
          f"Grain?) and does not have the layout of this pipeline's iterator ({' -> '.join(description)}), so it "
          "cannot be resumed exactly here (Grain's mp_prefetch states also depend on Grain's worker count). "
          "Restore a state saved by loader, or start over.")
    if not state_lib.same_as_grain(ds):
      raise state_lib.StateMismatchError(
          f"{type(self).__name__}.set_state: {state!r} has no pipeline description (written by Grain?), and "
          f"this pipeline ({' -> '.join(description)}) has operations whose stream loader does not "
          "guarantee to be Grain's, so that position could resume at a different element. "
          "Restore a state saved by loader, or start over.")


@contextlib.contextmanager
def building() -> Iterator[bool]:
  """Yields True for the outermost of nested `iter(dataset)` calls."""
  outer = getattr(_local, "building", 0)
  _local.building = outer + 1
  try:
    yield outer == 0
  finally:
    _local.building = outer


def stamp_iterator(iterator: Any, dataset: Any) -> Any:
  """Marks `iterator` as iterating `dataset` (for state descriptions)."""
  if isinstance(iterator, DatasetIterator):
    iterator._loader_dataset = dataset  # pylint: disable=protected-access
  return iterator
