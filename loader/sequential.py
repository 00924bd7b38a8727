"""Stages that run on the reassembled stream, in the consuming process.

These are the `IterDataset` operations that cannot be folded into the
random-access part of a pipeline (they follow a `filter`, or a stage whose
output positions are not a function of its input positions). They run after
`mp_prefetch`'s workers, so they never depend on the worker count.
"""

from __future__ import annotations

import atexit
import copy
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from loader import batching
from loader import checks
from loader import dataset_iterator
from loader import dataset_options
from loader import element_spec
from loader import engine
from loader import state as state_lib
from loader.dataset_iterator import DatasetIterator
from loader.iter_dataset import IterDataset
from loader.iter_dataset import SequentialIterDataset

T = TypeVar("T")
S = TypeVar("S")


class _ParentPositionIterator(DatasetIterator[T]):
  """An iterator that holds nothing between calls: its position is its parent's.

  What its __next__ read from the parent is consumed even when it fails (as in
  Grain), so the parent's state always points at the next element it will read.
  """

  @property
  def _grain_state_keys(self) -> tuple[str, ...]:
    # The state is the parent's, so a Grain state has the parent's keys.
    return getattr(self._parent, "_grain_state_keys", ("next_index",))

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)


class MapIterDataset(SequentialIterDataset[S]):

  _spec_rule = "transform"
  _same_as_grain = True

  def __init__(self, parent: IterDataset[T], transform: Callable[[T], S]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "map", "MapIterDataset")

  def _op_repr(self) -> str:
    return f".map({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "map"  # Not the function's name: a renamed function may resume.

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[S]:
    return _MapIterator(parent, self._fn)


class _MapIterator(_ParentPositionIterator[S]):

  def __init__(self, parent: DatasetIterator, fn: Callable[[Any], S]):
    super().__init__(parent)
    self._fn = fn

  def __next__(self) -> S:
    # As in Grain, an element whose map raises is consumed: the next call goes on after it.
    x = next(self._parent)
    if x is None:  # As Grain's iterator-level map: a None (`allow_nones=True`) passes through unmapped.
      return None
    try:
      return self._fn(x)
    except StopIteration as e:
      raise checks.stop_iteration_error(self._fn, e) from e


class FilterIterDataset(SequentialIterDataset[T]):

  _spec_rule = "parent"
  _same_as_grain = True

  def __init__(self, parent: IterDataset[T], transform: Callable[[T], bool]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "filter", "FilterIterDataset")

  def _op_repr(self) -> str:
    return f".filter({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "filter"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    return _FilterIterator(parent, self._fn, self._op_repr().lstrip("."))


class _FilterIterator(_ParentPositionIterator[T]):

  def __init__(self, parent: DatasetIterator, fn: Callable[[Any], bool], stage: str):
    super().__init__(parent)
    self._fn = fn
    self._stage = stage
    self._ratio_check: dataset_options.FilterRatioCheck | None = None

  def __next__(self) -> T:
    while True:
      x = next(self._parent)
      try:
        keep = self._fn(x)  # As in Grain, an element whose predicate raises is consumed.
      except StopIteration as e:
        raise checks.stop_iteration_error(self._fn, e) from e
      if self._ratio_check is None:  # Options are final once the whole tree is built.
        self._ratio_check = dataset_options.FilterRatioCheck(self._stage, self._ctx.dataset_options)
      self._ratio_check.check(bool(keep))
      if keep:
        return x
      dataset_iterator.raise_if_stop_requested()


class BatchIterDataset(SequentialIterDataset[S]):

  _same_as_grain = True

  def __init__(self, parent: IterDataset[T], batch_size: int, drop_remainder: bool = False,
               batch_fn: Callable[[Sequence[T]], S] | None = None):
    super().__init__(parent)
    self._batch_size = batch_size
    self._drop_remainder = bool(drop_remainder)
    self._batch_fn = batch_fn or batching.make_batch

  enable_shared_memory_output = batching.enable_shared_memory_output

  @property
  def _element_spec(self) -> Any:
    return element_spec.batched(self._parent, self._batch_size, self._drop_remainder, self._batch_fn)

  def _op_repr(self) -> str:
    return f".batch({self._batch_size}, drop_remainder={self._drop_remainder})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[S]:
    return _BatchIterator(parent, self._batch_size, self._drop_remainder, self._batch_fn)


class _BatchIterator(_ParentPositionIterator[S]):

  def __init__(self, parent: DatasetIterator, batch_size: int, drop_remainder: bool,
               batch_fn: Callable[[Sequence[Any]], S]):
    super().__init__(parent)
    self._batch_size = batch_size
    self._drop_remainder = drop_remainder
    self._batch_fn = batch_fn
    # A parent that can stack its next rows itself (packing) saves a dict per
    # row and an np.stack per feature; the batches are the same.
    self._stacked_rows = (parent.stacked_rows if batch_fn is batching.make_batch
                          and getattr(parent, "stacks_like_batch", False) else None)

  def __next__(self) -> S:
    if self._stacked_rows is not None:
      out = self._stacked_rows(self._batch_size)
      if out is None or (self._drop_remainder and len(next(iter(out.values()))) < self._batch_size):
        raise StopIteration
      return out
    # As in Grain, an element's error consumes the elements read for this
    # batch so far; the next call starts a new batch after the failed one.
    values = []
    parent = self._parent
    for _ in range(self._batch_size):
      try:
        values.append(next(parent))
      except StopIteration:
        break
    if values and not (self._drop_remainder and len(values) < self._batch_size):
      return checks.call_user(self._batch_fn, values)
    raise StopIteration


class ThreadPrefetchIterDataset(SequentialIterDataset[T]):
  """Computes elements ahead in a background thread (Grain's `ThreadPrefetchIterDataset`)."""

  _spec_rule = "parent"
  _same_as_grain = True
  _state_transparent = True  # Prefetching does not change the stream.

  def __init__(self, parent: IterDataset[T], prefetch_buffer_size: int):
    # Named as in Grain, whose callers pass it by keyword.
    super().__init__(parent)
    self._buffer_size = checks.check_int(prefetch_buffer_size, "prefetch_buffer_size", minimum=0)

  def _op_repr(self) -> str:
    return f".prefetch({self._buffer_size})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    return ThreadPrefetchDatasetIterator(parent, self._buffer_size)


_END = object()


class _Raised:

  def __init__(self, error: BaseException):
    self.error = error


# Prefetch threads still running (threads are dropped from it once they end).
_PREFETCH_THREADS: weakref.WeakSet = weakref.WeakSet()
_EXIT_JOIN_S = 2.0


@atexit.register
def _stop_prefetch_threads() -> None:
  """Stops prefetch threads before the interpreter finalizes.

  A daemon thread still running then is stopped where it next takes the GIL;
  inside a C++ call (a `jax.device_put` of `device_put`'s prefetch) that
  aborts the process ("FATAL: exception not rethrown", exit code 134) after
  a script that left an iterator unfinished. Each thread ends at its next
  element or within its 0.1 s poll once asked.
  """
  threads = list(_PREFETCH_THREADS)
  for thread in threads:
    thread.loader_stop.set()
  deadline = time.monotonic() + _EXIT_JOIN_S
  for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))


def _has_foreign_iterator(it: Any) -> bool:
  """Whether an iterator below `it` (or `it`) is not loader's: its state may be
  a live object it goes on changing (loader's states are new dicts each time)."""
  todo, seen = [it], set()
  while todo:
    node = todo.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, Checkpointable) or not type(node).__module__.startswith("loader."):
      return True
    todo.extend(getattr(node, "_parents", ()))
  return False


def _prefetch_loop(parent: DatasetIterator, out: queue.Queue, stop: threading.Event) -> None:
  # A plain function holding no reference to the iterator, so an abandoned
  # iterator can be garbage collected (its finalizer sets `stop`).
  copy_state = copy.deepcopy if _has_foreign_iterator(parent) else (lambda state: state)
  def put(item) -> bool:
    while not stop.is_set():
      try:
        out.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  # A closed or dropped iterator's thread also leaves a `next(parent)` that searches on without end.
  dataset_iterator.stop_this_thread_on(stop)
  try:
    while not stop.is_set():
      try:
        x = next(parent)
      except StopIteration:
        put(_END)
        return
      except dataset_iterator.StopRequested:
        return
      # A copy: a custom parent's state may hold containers it goes on
      # changing while this thread runs ahead (Grain copies every state).
      if not put((x, copy_state(parent.get_state()))):
        return
  except BaseException as e:  # pylint: disable=broad-except
    put(_Raised(e))


class _ThreadPrefetchIterator(DatasetIterator[T]):
  """Pulls from the parent in a background thread; state = after last handed out."""

  @property
  def _grain_state_keys(self) -> tuple[str, ...]:
    # The state is the parent's (as Grain's), so a Grain state has the parent's keys.
    return getattr(self._parent, "_grain_state_keys", ("next_index",))

  def __init__(self, parent: DatasetIterator, buffer_size: int):
    super().__init__(parent)
    self._buffer_size = buffer_size
    self._state = copy.deepcopy(parent.get_state())
    self._thread: threading.Thread | None = None
    self._queue: queue.Queue | None = None
    self._stop: threading.Event | None = None
    self._done = False

  def _start(self) -> None:
    self._pid = os.getpid()
    self._queue = queue.Queue(maxsize=self._buffer_size)
    self._stop = threading.Event()
    self._thread = threading.Thread(
        target=_prefetch_loop, args=(self._parent, self._queue, self._stop),
        name="loader-prefetch", daemon=True)
    self._thread.loader_stop = self._stop
    weakref.finalize(self, self._stop.set)
    self._thread.start()
    _PREFETCH_THREADS.add(self._thread)

  def _halt(self) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None

  def __next__(self) -> T:
    # Grain's ValueError after close(), whatever the parent (Grain's restarts
    # its thread there: a custom parent that does not check would go on).
    self._assert_not_closed()
    if self._done:
      raise StopIteration
    if self._thread is None:
      self._start()
    else:
      engine.check_same_process(self._pid)  # A forked child has no such thread: it would wait forever.
    if dataset_iterator.stop_requestable():  # Under another prefetch thread, which must be able to leave.
      item = self._get_until_stop_requested()
    else:
      item = self._queue.get()
    if item is _END:
      self._done = True
      self._halt()
      raise StopIteration
    if isinstance(item, _Raised):
      # The thread stopped at the error, every element before it handed out:
      # the parent is just past the failed element, which is consumed (as in
      # Grain); the next call restarts the thread there.
      self._halt()
      with dataset_iterator.parent_calls():  # Our own position, not a checkpoint.
        self._state = copy.deepcopy(self._parent.get_state())
      raise item.error
    x, self._state = item
    return x

  def _get_until_stop_requested(self) -> Any:
    while True:
      try:
        return self._queue.get(timeout=0.1)
      except queue.Empty:
        dataset_iterator.raise_if_stop_requested()

  def start_prefetch(self) -> None:
    self._assert_not_closed()  # Grain's ValueError.
    if self._thread is None and not self._done:
      self._start()

  def get_state(self) -> dict[str, Any]:
    return self._state

  def set_state(self, state: dict[str, Any]) -> None:
    self._halt()
    self._parent.set_state(state)
    self._state = copy.deepcopy(self._parent.get_state())
    self._done = False

  def _get_next_index(self) -> int:
    # The parent has run ahead by the buffered elements: stop, and move it
    # back to what was handed out (the buffer is refilled on the next call).
    self._halt()
    with dataset_iterator.parent_calls():
      self._parent.set_state(self._state)
    return dataset_iterator.get_next_index(self._parent)

  def _set_next_index(self, index: int) -> None:
    self._halt()
    dataset_iterator.set_next_index(self._parent, index)
    with dataset_iterator.parent_calls():
      self._state = copy.deepcopy(self._parent.get_state())
    self._done = False

  def close(self) -> None:
    if not self._closed:
      self._halt()
    super().close()


class Checkpointable(DatasetIterator[T]):
  """Any object with __next__ (and get_state/set_state), as a DatasetIterator parent."""

  def __init__(self, it: Any):
    super().__init__()
    self._it = it

  def __next__(self) -> T:
    return next(self._it)

  def get_state(self) -> Any:
    return self._it.get_state()

  def set_state(self, state: Any) -> None:
    self._it.set_state(state)


class ThreadPrefetchDatasetIterator(_ThreadPrefetchIterator[T]):
  """Grain's iterator class: prefetches an iterator in a background thread.

  Args:
    parent: A DatasetIterator, or any iterator with `get_state`/`set_state`.
    prefetch_buffer_size: Elements computed ahead; 0 reads in the caller's thread.
  """

  def __init__(self, parent: Any, prefetch_buffer_size: int):
    size = checks.check_int(prefetch_buffer_size, "prefetch_buffer_size", minimum=0)
    if not isinstance(parent, DatasetIterator):
      if not (hasattr(parent, "get_state") and hasattr(parent, "set_state")):
        raise TypeError(f"ThreadPrefetchDatasetIterator needs an iterator with get_state/set_state "
                        f"(got {type(parent).__name__}).")
      parent = Checkpointable(parent)
    super().__init__(parent, size)

  # With no buffer the caller's thread reads: the parent's own state is
  # current, and is asked for only when wanted.

  def __next__(self) -> T:
    if self._buffer_size:
      return super().__next__()
    return next(self._parent)

  def start_prefetch(self) -> None:
    if self._buffer_size:
      super().start_prefetch()
    else:  # No thread of its own: the parent's background work, if any.
      self._assert_not_closed()
      self._parent.start_prefetch()

  def get_state(self) -> Any:
    # A copy, as with a buffer: the parent may go on changing what it returned.
    return super().get_state() if self._buffer_size else copy.deepcopy(self._parent.get_state())

  def set_state(self, state: Any) -> None:
    if self._buffer_size:
      super().set_state(state)
    else:
      self._parent.set_state(state)

  def _get_next_index(self) -> int:
    if self._buffer_size:
      return super()._get_next_index()
    return dataset_iterator.get_next_index(self._parent)

  def _set_next_index(self, index: int) -> None:
    if self._buffer_size:
      super()._set_next_index(index)
    else:
      dataset_iterator.set_next_index(self._parent, index)


class WithSeedIterDataset(SequentialIterDataset[T]):
  """Holds the default seed of downstream random operations."""

  _spec_rule = "parent"
  _state_transparent = True
  # Its iterator is the parent's, as in Grain: a Grain state resumes wherever the parent's does.
  _same_as_grain = True

  def __init__(self, parent: IterDataset[T], seed: int):
    super().__init__(parent)
    # Only Grain's attribute: a plain `self.seed` would shadow the `seed()` method.
    self._seed_rng_seed = seed  # Downstream ops derive theirs from it.

  def _op_repr(self) -> str:
    return f".seed({self._seed_rng_seed})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    return parent


class _CountingIterator(DatasetIterator[S]):
  """Applies fn(position, element); state = parent's + elements produced."""

  def __init__(self, parent: DatasetIterator, fn: Callable[[int, Any], S], user_fn: Callable[..., Any] | None = None,
               *, key: str = "counter"):
    super().__init__(parent)
    self._fn = fn
    self._user_fn = user_fn or fn  # Named in errors.
    self._index = 0
    self._key = key  # Grain's name for the count in its state.

  def __next__(self) -> S:
    # As in Grain, an element whose function raises is consumed and does not count.
    x = next(self._parent)
    if x is None:  # As Grain's: a None (`allow_nones=True`) passes through unmapped, yet counts.
      self._index += 1
      return None
    try:
      y = self._fn(self._index, x)
    except StopIteration as e:
      raise checks.stop_iteration_error(self._user_fn, e) from e
    self._index += 1
    return y

  @property
  def _grain_state_keys(self) -> tuple[str, ...]:
    return ("parent", self._key)

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), self._key: self._index}

  def set_state(self, state: dict[str, Any]) -> None:
    # "index": what loader wrote before it used Grain's key.
    key = "index" if isinstance(state, dict) and "index" in state and self._key not in state else self._key
    state_lib.check_keys(state, ("parent", key), type(self).__name__)
    self._parent.set_state(state["parent"])
    self._index = checks.check_int(state[key], key, minimum=0)


class MapWithIndexIterDataset(SequentialIterDataset[S]):

  _spec_rule = "transform"
  _same_as_grain = True  # Grain's positions, generators and state layout.

  def __init__(self, parent: IterDataset[T], transform: Callable[[int, T], S]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "map_with_index", "MapWithIndexIterDataset")

  def _op_repr(self) -> str:
    return f".map_with_index({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "map_with_index"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[S]:
    return _CountingIterator(parent, self._fn)


class RandomMapIterDataset(SequentialIterDataset[S]):
  """fn(element, rng) with rng = Philox(seed) at a counter given by the stream position."""

  _spec_rule = "transform"
  _same_as_grain = True  # Grain's positions, generators and state layout.

  def __init__(self, parent: IterDataset[T], transform: Callable[[T, np.random.Generator], S],
               seed: int | None = None):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "random_map", "RandomMapIterDataset")
    self._seed = checks.random_map_seed(parent, seed, "RandomMapIterDataset")

  def _op_repr(self) -> str:
    return f".random_map({checks.fn_name(self._fn)}, seed={self._seed})"

  def _state_op(self) -> str:
    return f"random_map(seed={self._seed})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[S]:
    fn, seed = self._fn, self._seed
    return _CountingIterator(parent, lambda i, x: fn(x, checks.element_rng(seed, i)), fn, key="index_for_rng")
