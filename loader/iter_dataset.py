"""`IterDataset` and `DatasetIterator`: streams with checkpointable position.

Determinism rule. A pipeline has a *random-access prefix*: the `MapDataset`
it starts from, plus any `IterDataset.map`/`filter` applied directly on
`to_iter_dataset()` and any `batch` applied there while no `filter` came
before it. Those calls are rewritten into `MapDataset` operations at
construction, so element k of the prefix is a pure function of k. The rest
(`batch` after a `filter`, `map` after such a batch, `prefetch`) is
*sequential*: it runs on the reassembled prefix stream, in the consuming
process. `mp_prefetch` parallelises only the prefix, so the stream and every
checkpoint state are identical for any number of workers or threads.

State. `get_state()` of any iterator here is `{"next_index": k}`: k indexes
the random-access prefix, and sequential stages (which hold no buffered
elements between `next` calls) pass their parent's state through, as Grain's
map/filter/batch iterators do. The thread prefetcher reports the state after
the last element it handed out.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import math
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from loader import batching
from loader import map_dataset as map_dataset_lib
from loader import options as options_lib

T = TypeVar("T")
S = TypeVar("S")

# Per-call costs of ArrayRecord reads amortise over thousands of records:
# measured on 8 x 25k records, 2048/4096/8192 records per call gave about
# 57k/74k/92k records/s in process.
_TARGET_RECORDS_PER_CHUNK = 8192
_FIRST_CHUNK_RECORDS = 256  # Until element sizes are known, and for a fast first element.
_MAX_CHUNK_BYTES = 32 << 20


def check_state(state: Any, keys: Sequence[str], owner: str) -> None:
  """Raises a clear error unless `state` is a dict with exactly `keys`."""
  if not isinstance(state, dict) or set(state) != set(keys):
    raise ValueError(
        f"{owner}.set_state: expected a state dict with keys {sorted(keys)}, got "
        f"{state!r}. Was it saved from a different pipeline?")


def _elements_for(ds: map_dataset_lib.MapDataset, records: int) -> int:
  return max(1, records // max(1, ds._records_per_element))  # pylint: disable=protected-access


def _estimate_nbytes(x: Any, depth: int = 0) -> int:
  if isinstance(x, np.ndarray):
    if x.dtype.hasobject and x.size:
      return x.size * _estimate_nbytes(x.flat[0], depth + 1)
    return x.nbytes
  if isinstance(x, (bytes, str)):
    return len(x)
  if depth < 8 and isinstance(x, dict):
    return sum(_estimate_nbytes(v, depth + 1) for v in x.values())
  if depth < 8 and isinstance(x, (list, tuple)):
    return sum(_estimate_nbytes(v, depth + 1) for v in x)
  return 64


class ChunkSizer:
  """Elements per batched call: ~8192 source records, capped at ~32 MiB.

  The first chunk is small (~256 records) so the first element arrives fast and
  huge elements cannot blow up memory before their size is known; then the
  size grows to the target, capped by the observed element size. Chunk
  boundaries never change which elements are produced, only how many are
  computed per call, so adapting them keeps iteration deterministic.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset, fixed: int | None):
    self._fixed = fixed
    self._target = _elements_for(ds, _TARGET_RECORDS_PER_CHUNK)
    self.size = fixed or min(self._target, _elements_for(ds, _FIRST_CHUNK_RECORDS))
    self._observed = fixed is not None

  def observe(self, elements: list[Any]) -> None:
    if self._observed or not elements:
      return
    sample = next((x for x in elements if x is not None), None)
    if sample is None:
      return  # All filtered out; look again at the next chunk.
    self._observed = True
    per = max(1, _estimate_nbytes(sample))
    self.size = max(1, min(self._target, _MAX_CHUNK_BYTES // per))


class DatasetIterator(abc.ABC, Iterator[T]):
  """Iterator with checkpointable state, like Grain's `DatasetIterator`.

  Use it as a context manager (or call `close()`) to release threads and
  worker processes promptly; garbage collection releases them too.
  """

  def __init__(self, parent: DatasetIterator | None = None):
    self._parent = parent
    self._closed = False

  def __iter__(self) -> DatasetIterator[T]:
    return self

  @abc.abstractmethod
  def __next__(self) -> T:
    """Returns the next element or raises StopIteration."""

  @abc.abstractmethod
  def get_state(self) -> dict[str, Any]:
    """A small JSON-serialisable dict of ints describing the position."""

  @abc.abstractmethod
  def set_state(self, state: dict[str, Any]) -> None:
    """Moves to `state` (from `get_state` of an iterator of the same pipeline)."""

  def close(self) -> None:
    """Releases background threads/processes; idempotent."""
    if self._closed:
      return
    self._closed = True
    if self._parent is not None:
      self._parent.close()

  def __enter__(self) -> DatasetIterator[T]:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class IterDataset(abc.ABC, Generic[T]):
  """A stream of elements, like Grain's `IterDataset`.

  Usually made with `MapDataset.to_iter_dataset()`; see the module docstring
  for which operations stay random access (parallel, deterministic for any
  worker count) and which run sequentially.
  """

  def __init__(self, parents: IterDataset | Sequence[IterDataset] = ()):
    if isinstance(parents, IterDataset):
      parents = (parents,)
    self._parents = tuple(parents)

  @property
  def parents(self) -> tuple[IterDataset, ...]:
    return self._parents

  @property
  def _parent(self) -> IterDataset:
    return self._parents[0]

  @abc.abstractmethod
  def __iter__(self) -> DatasetIterator[T]:
    """A fresh iterator positioned at the start."""

  def _op_repr(self) -> str:
    return f".{type(self).__name__}()"

  def __repr__(self) -> str:
    prefix = repr(self._parent) if self._parents else "IterDataset"
    return prefix + self._op_repr()

  def to_iter_dataset(self) -> IterDataset[T]:
    """Returns self (for code that accepts either dataset kind)."""
    return self

  def _random_access(self) -> MapBackedIterDataset | None:
    return None

  def map(self, transform: Callable[[T], S]) -> IterDataset[S]:
    """Applies `transform` to each element."""
    fn = map_dataset_lib._resolve_fn(transform, "map", "map()")  # pylint: disable=protected-access
    base = self._random_access()
    if base is not None:
      return base.rebase(base.map_dataset.map(fn))
    return MapIterDataset(self, fn)

  def filter(self, predicate: Callable[[T], bool]) -> IterDataset[T]:
    """Keeps elements for which `predicate` is true."""
    fn = map_dataset_lib._resolve_fn(predicate, "filter", "filter()")  # pylint: disable=protected-access
    base = self._random_access()
    if base is not None:
      return base.rebase(base.map_dataset.filter(fn))
    return FilterIterDataset(self, fn)

  def batch(self, batch_size: int, *, drop_remainder: bool = False,
            batch_fn: Callable[[Sequence[T]], S] | None = None) -> IterDataset[S]:
    """Groups consecutive elements into batches (see `batching.make_batch`).

    Random access (parallel) unless a `filter` precedes it; then sequential.
    """
    batch_size = map_dataset_lib._check_positive_int(batch_size, "batch_size")  # pylint: disable=protected-access
    base = self._random_access()
    if base is not None and not base.map_dataset._may_contain_none:  # pylint: disable=protected-access
      return base.rebase(base.map_dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn))
    return BatchIterDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

  def prefetch(self, buffer_size: int | options_lib.MultiprocessingOptions) -> IterDataset[T]:
    """Computes up to `buffer_size` elements ahead in a background thread.

    For Grain compatibility, passing `MultiprocessingOptions` (Grain's
    deprecated signature) forwards to `mp_prefetch`.
    """
    if isinstance(buffer_size, options_lib.MultiprocessingOptions):
      warnings.warn("prefetch(MultiprocessingOptions) is deprecated; use mp_prefetch().",
                    DeprecationWarning, stacklevel=2)
      return self.mp_prefetch(buffer_size)
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, (int, np.integer)) or buffer_size < 0:
      raise ValueError(f"buffer_size must be an integer >= 0 (got {buffer_size=!r}).")
    return ThreadPrefetchIterDataset(self, int(buffer_size))

  def mp_prefetch(self, options: options_lib.MultiprocessingOptions | None = None,
                  worker_init_fn: Callable[[int, int], None] | None = None) -> IterDataset[T]:
    """Computes the random-access prefix in worker processes.

    Workers take chunks of prefix positions round-robin and the parent
    reassembles them in order, then runs the sequential stages. The stream and
    checkpoints are therefore identical for every `num_workers` (0 runs in
    process). Numpy arrays come back through shared memory.

    Args:
      options: Worker count and buffering; default `num_workers=os.cpu_count()`.
      worker_init_fn: Called as `fn(worker_index, num_workers)` in each worker
        before it computes anything.
    """
    from loader import mp_prefetch  # pylint: disable=g-import-not-at-top

    return mp_prefetch.MultiprocessPrefetchIterDataset(self, options, worker_init_fn)


class MapBackedIterDataset(IterDataset[T]):
  """The elements of a `MapDataset` in index order (Nones skipped)."""

  def __init__(self, map_dataset: map_dataset_lib.MapDataset[T], *,
               read_options: options_lib.ReadOptions | None = None, allow_nones: bool = False):
    super().__init__()
    if not isinstance(map_dataset, map_dataset_lib.MapDataset):
      raise TypeError(f"Expected a MapDataset (got {type(map_dataset).__name__}).")
    self.map_dataset = map_dataset
    self.read_options = read_options or options_lib.ReadOptions()
    self.allow_nones = bool(allow_nones)

  def __repr__(self) -> str:
    return f"{self.map_dataset!r}.to_iter_dataset()"

  def _random_access(self) -> MapBackedIterDataset | None:
    return None if self.allow_nones else self

  def rebase(self, map_dataset: map_dataset_lib.MapDataset) -> MapBackedIterDataset:
    return MapBackedIterDataset(map_dataset, read_options=self.read_options, allow_nones=self.allow_nones)

  def __iter__(self) -> DatasetIterator[T]:
    ro = self.read_options
    if ro.num_threads > 0:
      producer = ThreadChunkProducer(self.map_dataset, ro.chunk_size, ro.num_threads, ro.prefetch_buffer_size)
    else:
      producer = SyncChunkProducer(self.map_dataset, ro.chunk_size)
    return MapDatasetIterator(self.map_dataset, producer, allow_nones=self.allow_nones)


def compute_chunk(ds: map_dataset_lib.MapDataset, start: int, stop: int) -> tuple[list[Any], Exception | None]:
  """Elements [start, stop) of `ds`, or the ones before the first that fails.

  A chunk is computed in one batched call. If that raises, the chunk is
  recomputed one element at a time so the error surfaces exactly at the
  failing element, after the good ones before it (an error that does not
  recur is thereby retried once).

  Returns:
    (elements, error): `error` is None, or the exception of element
    `start + len(elements)`.
  """
  try:
    return ds._getitems(np.arange(start, stop, dtype=np.int64)), None  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except
    pass
  elements = []
  for i in range(start, stop):
    try:
      elements.append(ds._getitems(np.array([i], dtype=np.int64))[0])  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      return elements, e
  return elements, None


# A chunk as producers hand it out: (start, elements, error or None).
Chunk = tuple[int, list[Any], "BaseException | None"]


class SyncChunkProducer:
  """Computes chunks of a MapDataset on demand in the calling thread."""

  def __init__(self, ds: map_dataset_lib.MapDataset, chunk_size: int | None):
    self._ds = ds
    self._len = len(ds)
    self._sizer = ChunkSizer(ds, chunk_size)
    self._next = 0

  def reset(self, start: int) -> None:
    self._next = start

  def next_chunk(self) -> Chunk | None:
    start = self._next
    if start >= self._len:
      return None
    stop = min(start + self._sizer.size, self._len)
    elements, error = compute_chunk(self._ds, start, stop)
    self._sizer.observe(elements)
    self._next = start + len(elements)
    return start, elements, error

  def close(self) -> None:
    pass


class ThreadChunkProducer:
  """Computes chunks ahead in a thread pool; hands them out in order."""

  def __init__(self, ds: map_dataset_lib.MapDataset, chunk_size: int | None, num_threads: int, buffer_size: int):
    self._ds = ds
    self._len = len(ds)
    self._sizer = ChunkSizer(ds, chunk_size)
    self._num_threads = num_threads
    self._buffer_size = buffer_size
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._pending: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
    self._next_submit = 0
    self._finalizer: weakref.finalize | None = None

  def reset(self, start: int) -> None:
    for _, fut in self._pending:
      fut.cancel()
    self._pending.clear()
    self._next_submit = start

  def _top_up(self) -> None:
    window = max(self._num_threads, math.ceil(self._buffer_size / self._sizer.size))
    while len(self._pending) < window and self._next_submit < self._len:
      start = self._next_submit
      stop = min(start + self._sizer.size, self._len)
      self._pending.append((start, self._pool.submit(compute_chunk, self._ds, start, stop)))
      self._next_submit = stop

  def next_chunk(self) -> Chunk | None:
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(self._num_threads, thread_name_prefix="loader-read")
      self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
    self._top_up()
    if not self._pending:
      return None
    start, fut = self._pending.popleft()
    elements, error = fut.result()
    self._sizer.observe(elements)
    if error is not None:
      self.reset(start + len(elements))  # Later chunks restart after a retry.
    else:
      self._top_up()
    return start, elements, error

  def close(self) -> None:
    self.reset(self._len)
    if self._finalizer is not None:
      self._finalizer()


class MapDatasetIterator(DatasetIterator[T]):
  """Iterates a MapDataset chunk by chunk; state is {"next_index": k}.

  If computing element k raises, the elements before it are yielded first, the
  error is raised with the state at k, and the next call retries element k.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset[T], producer: Any, *, allow_nones: bool = False):
    super().__init__()
    self._ds = ds
    self._len = len(ds)
    self._producer = producer
    self._allow_nones = allow_nones
    self._buffer: list[Any] = []
    self._buffer_start = 0
    self._pos = 0
    self._error: BaseException | None = None
    producer.reset(0)

  def __next__(self) -> T:
    while True:
      if self._pos >= len(self._buffer):
        if self._error is not None:
          error, self._error = self._error, None
          self._buffer_start, self._buffer, self._pos = self._buffer_start + self._pos, [], 0
          self._producer.reset(self._buffer_start)
          raise error
        if self._closed:
          raise ValueError("This iterator was closed; create a new one with iter(dataset).")
        chunk = self._producer.next_chunk()
        if chunk is None:
          raise StopIteration
        self._buffer_start, self._buffer, self._error = chunk
        self._pos = 0
        continue
      x = self._buffer[self._pos]
      self._pos += 1
      if x is not None or self._allow_nones:
        return x

  def get_state(self) -> dict[str, Any]:
    return {"next_index": self._buffer_start + self._pos}

  def set_state(self, state: dict[str, Any]) -> None:
    check_state(state, ("next_index",), type(self).__name__)
    k = state["next_index"]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= self._len:
      raise ValueError(
          f"{type(self).__name__}.set_state: next_index must be an integer in "
          f"[0, {self._len}] for this dataset (got {k!r}).")
    self._buffer, self._buffer_start, self._pos, self._error = [], int(k), 0, None
    self._producer.reset(int(k))

  def close(self) -> None:
    if not self._closed:
      self._producer.close()
    super().close()


class SequentialIterDataset(IterDataset[T]):
  """Base of stages that run on the reassembled stream in the consumer."""

  @abc.abstractmethod
  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    """This stage on top of `parent` (which may run in workers)."""

  def __iter__(self) -> DatasetIterator[T]:
    return self.make_iterator(iter(self._parent))


class _ParentPositionIterator(DatasetIterator[T]):
  """An iterator that holds nothing between calls: its position is its parent's.

  Its __next__ resets the parent to where it started when it fails, so the
  parent's state always points at the next element this iterator will read.
  """

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)


class MapIterDataset(SequentialIterDataset[S]):

  def __init__(self, parent: IterDataset[T], fn: Callable[[T], S]):
    super().__init__(parent)
    self._fn = fn

  def _op_repr(self) -> str:
    return f".map({map_dataset_lib._fn_name(self._fn)})"  # pylint: disable=protected-access

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[S]:
    return _MapIterator(parent, self._fn)


class _MapIterator(_ParentPositionIterator[S]):

  def __init__(self, parent: DatasetIterator, fn: Callable[[Any], S]):
    super().__init__(parent)
    self._fn = fn

  def __next__(self) -> S:
    state = self._parent.get_state()
    x = next(self._parent)
    try:
      return self._fn(x)
    except Exception:
      self._parent.set_state(state)  # So the state (and a retry) is at x.
      raise


class FilterIterDataset(SequentialIterDataset[T]):

  def __init__(self, parent: IterDataset[T], fn: Callable[[T], bool]):
    super().__init__(parent)
    self._fn = fn

  def _op_repr(self) -> str:
    return f".filter({map_dataset_lib._fn_name(self._fn)})"  # pylint: disable=protected-access

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    return _FilterIterator(parent, self._fn)


class _FilterIterator(_ParentPositionIterator[T]):

  def __init__(self, parent: DatasetIterator, fn: Callable[[Any], bool]):
    super().__init__(parent)
    self._fn = fn

  def __next__(self) -> T:
    while True:
      state = self._parent.get_state()
      x = next(self._parent)
      try:
        keep = self._fn(x)
      except Exception:
        self._parent.set_state(state)  # So the state (and a retry) is at x.
        raise
      if keep:
        return x


class BatchIterDataset(SequentialIterDataset[S]):

  def __init__(self, parent: IterDataset[T], batch_size: int, *, drop_remainder: bool = False,
               batch_fn: Callable[[Sequence[T]], S] | None = None):
    super().__init__(parent)
    self._batch_size = batch_size
    self._drop_remainder = bool(drop_remainder)
    self._batch_fn = batch_fn or batching.make_batch

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

  def __next__(self) -> S:
    values = []
    parent = self._parent
    state = parent.get_state()
    try:
      for _ in range(self._batch_size):
        try:
          values.append(next(parent))
        except StopIteration:
          break
      if values and not (self._drop_remainder and len(values) < self._batch_size):
        return self._batch_fn(values)
    except Exception:
      # An element (or batch_fn) failed: rewind to the batch start so the
      # state is consistent and a retry rebuilds the whole batch.
      parent.set_state(state)
      raise
    raise StopIteration


class ThreadPrefetchIterDataset(SequentialIterDataset[T]):

  def __init__(self, parent: IterDataset[T], buffer_size: int):
    super().__init__(parent)
    self._buffer_size = buffer_size

  def _op_repr(self) -> str:
    return f".prefetch({self._buffer_size})"

  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    if self._buffer_size == 0:
      return parent
    return _ThreadPrefetchIterator(parent, self._buffer_size)


_END = object()


class _Raised:

  def __init__(self, error: BaseException):
    self.error = error


def _prefetch_loop(parent: DatasetIterator, out: queue.Queue, stop: threading.Event) -> None:
  # A plain function holding no reference to the iterator, so an abandoned
  # iterator can be garbage collected (its finalizer sets `stop`).
  def put(item) -> bool:
    while not stop.is_set():
      try:
        out.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  try:
    while not stop.is_set():
      try:
        x = next(parent)
      except StopIteration:
        put(_END)
        return
      if not put((x, parent.get_state())):
        return
  except BaseException as e:  # pylint: disable=broad-except
    put(_Raised(e))


class _ThreadPrefetchIterator(DatasetIterator[T]):
  """Pulls from the parent in a background thread; state = after last handed out."""

  def __init__(self, parent: DatasetIterator, buffer_size: int):
    super().__init__(parent)
    self._buffer_size = buffer_size
    self._state = parent.get_state()
    self._thread: threading.Thread | None = None
    self._queue: queue.Queue | None = None
    self._stop: threading.Event | None = None
    self._done = False

  def _start(self) -> None:
    self._queue = queue.Queue(maxsize=self._buffer_size)
    self._stop = threading.Event()
    self._thread = threading.Thread(
        target=_prefetch_loop, args=(self._parent, self._queue, self._stop),
        name="loader-prefetch", daemon=True)
    weakref.finalize(self, self._stop.set)
    self._thread.start()

  def _halt(self) -> None:
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None

  def __next__(self) -> T:
    if self._done:
      raise StopIteration
    if self._thread is None:
      self._start()
    item = self._queue.get()
    if item is _END:
      self._done = True
      self._halt()
      raise StopIteration
    if isinstance(item, _Raised):
      self._halt()
      self._parent.set_state(self._state)  # The thread ran ahead; rewind.
      raise item.error
    x, self._state = item
    return x

  def get_state(self) -> dict[str, Any]:
    return self._state

  def set_state(self, state: dict[str, Any]) -> None:
    self._halt()
    self._parent.set_state(state)
    self._state = self._parent.get_state()
    self._done = False

  def close(self) -> None:
    if not self._closed:
      self._halt()
    super().close()
