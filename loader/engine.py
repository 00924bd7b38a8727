"""The chunk engine: computing a MapDataset's elements in batched calls.

Iterators of the random-access part of a pipeline pull *chunks*: runs of
consecutive positions computed with one `_getitems` call, so per-element
Python overhead and per-call read costs are paid once per chunk. A
`ChunkProducer` hands chunks out in order; where they are computed is its
business (this thread, a thread pool, or worker processes in
`loader.mp_prefetch`). `MapDatasetIterator` turns chunks back into elements
and owns the checkpointable position.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from loader import batching
from loader import checks
from loader import dataset_iterator
from loader import dataset_options
from loader import map_dataset as map_dataset_lib
from loader import realign
from loader import source as source_lib
from loader import state as state_lib

T = TypeVar("T")

# Per-call costs of ArrayRecord reads amortise over thousands of records, and
# bigger sorted reads per file are faster (better locality): on 8 x 25k
# records of 1 KB (2 cores), shuffled reads in process gave ~335k records/s
# with 32768 records per chunk (~4k per file) and ~355k with 65536.
_TARGET_RECORDS_PER_CHUNK = 65536
# Chunks start small so the first element arrives fast and huge elements
# cannot blow up memory before their size is known; sizes then grow
# geometrically to the target. Before any chunk has been measured, chunks are
# of 1, then _RAMP_FACTOR elements (an element of a slow source or map, tens
# of ms, would otherwise hold the first one back for 64 of them).
_FIRST_CHUNK_RECORDS = 64
_RAMP_FACTOR = 4
# A chunk should take about this long to compute: long enough to amortise a
# worker round trip (~1 ms), short enough that a slow map spreads evenly over
# workers and the next batches never wait long behind one big chunk.
_TARGET_CHUNK_SECONDS = 0.1
# Except in process, when records are cheap: reading dominates, and the
# bigger read is the faster one (a 64k-record read takes ~0.2 s), so a chunk
# may take up to _FULL_CHUNK_SECONDS_IN_PROCESS. Records count as cheap while
# a whole chunk of the record target would take at most _CHEAP_CHUNK_SECONDS
# (~30 µs per record), well above reading alone (3-8 µs): a slower machine or
# a stall (see _STALL_FACTOR) must not tip them into small chunks,
# whose reads are slower. A slow map keeps ~0.1 s chunks.
_FULL_CHUNK_SECONDS_IN_PROCESS = 0.5
_CHEAP_CHUNK_SECONDS = 2.0
_DECAY = 0.7  # Weight of the cost history at each new chunk.
# A chunk that took over this many times the estimated cost is held in
# doubt: the next chunk is sized by it, and then decides. If that one is slow
# too, the work did get slower; if not, the process was stopped, preempted or
# paused (GC, a checkpoint) during the slow one, which is forgotten. Folding
# such a stall in shrank the next chunks many-fold, and smaller reads are
# slower, which kept the estimate high: 0.70-0.75 of the raw read rate under
# the bench's time slices, against 0.84-0.91 with full chunks.
_STALL_FACTOR = 4.0
MAX_CHUNK_BYTES = 64 << 20


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
  """How many elements the next batched call computes.

  The size is the smallest of: ~64k source records (read amortisation),
  ~0.1 s of measured compute (so slow maps give small chunks that keep every
  worker busy and batches flowing; in process, a full 64k-record chunk may
  take up to 0.5 s), ~64 MiB of measured element bytes (or `max_chunk_bytes`), and,
  with `parallelism` consumers of chunks, half a fair share of what is left
  (so a small dataset still reaches every worker); in process, never fewer
  elements than the threads a chunk is split over. It starts with chunks of 1
  and 4 elements until one is measured, then ~64 records, growing 4x per
  chunk. One chunk far slower than the estimate (a stalled process) costs one
  smaller chunk after it, not a run of them (see _STALL_FACTOR). A fixed
  `chunk_size` (in source records, whatever stage a batch is on) overrides
  all of that. Chunk boundaries never change which elements are produced, so
  adapting them keeps iteration deterministic.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset, fixed_records: int | None, *, parallelism: int = 1,
               split_width: Callable[[], int] | None = None, max_chunk_bytes: int = MAX_CHUNK_BYTES):
    self._len = len(ds)
    self._max_chunk_bytes = max(1, min(MAX_CHUNK_BYTES, max_chunk_bytes))
    # How many elements a chunk needs to keep every thread it is split over
    # busy: the floor of the time cap (else a slow element, over 0.1 s, would
    # make chunks of one, computed one at a time).
    self._split_width = split_width
    self._fixed = None if fixed_records is None else _elements_for(ds, fixed_records)
    self._target = _elements_for(ds, _TARGET_RECORDS_PER_CHUNK)
    self._ramp = min(self._target, _elements_for(ds, _FIRST_CHUNK_RECORDS))
    self._parallelism = max(1, parallelism)
    self._calls = 0
    self._unmeasured = 0  # Chunks handed out before any was measured (at most 2).
    # Decayed sums over recent chunks: the per-element cost is weighted by
    # elements, so a tiny first chunk that paid one-off costs (opening
    # files, first touches) cannot hold back the ramp for long.
    self._seconds_sum = 0.0
    self._elements_sum = 0.0
    # A chunk held in doubt (see _STALL_FACTOR): the sums before it, and its cost per element.
    self._doubt: tuple[tuple[float, float], float] | None = None
    self._bytes_cap: int | None = None

  def size(self, start: int) -> int:
    """Elements in the chunk starting at position `start`."""
    if self._fixed is not None:
      return self._fixed
    size = min(self._ramp, self._target)
    self._calls += 1
    if self._calls % self._parallelism == 0:  # Every consumer gets a small chunk first.
      self._ramp = min(self._target, self._ramp * _RAMP_FACTOR)
    if self._seconds_sum == 0 and self._unmeasured < 2:  # Cost unknown: 1, then 4 elements.
      self._unmeasured += 1
      size = min(size, _RAMP_FACTOR ** (self._unmeasured - 1))
    if self._seconds_sum > 0:
      per_element = self._seconds_sum / self._elements_sum
      seconds = _TARGET_CHUNK_SECONDS
      if self._parallelism == 1 and self._target * per_element <= _CHEAP_CHUNK_SECONDS:
        seconds = _FULL_CHUNK_SECONDS_IN_PROCESS
      floor = self._split_width() if self._split_width is not None else 1
      size = min(size, max(floor, int(seconds / per_element)))
    if self._bytes_cap is not None:
      size = min(size, self._bytes_cap)
    if self._parallelism > 1 and self._len < (1 << 62):
      size = min(size, max(1, (self._len - start) // (2 * self._parallelism)))
    return max(1, size)

  def resize(self, n: int) -> None:
    """The dataset's length is now `n` (a realigned view; see loader.realign)."""
    self._len = n

  def _learn(self, n: int, seconds: float) -> None:
    """Folds a chunk of `n` elements that took `seconds` into the cost (see _STALL_FACTOR)."""
    cost = seconds / n
    if self._doubt is not None:
      (seconds_sum, elements_sum), doubted = self._doubt
      self._doubt = None
      # Nearer (geometrically) the cost before it than the doubted one: the doubted chunk was a stall.
      # Small chunks cost a bit more per element, so "as cheap as before" would be too strict.
      if cost * cost < doubted * seconds_sum / elements_sum:
        self._seconds_sum, self._elements_sum = seconds_sum, elements_sum
    elif self._seconds_sum > 0 and cost > _STALL_FACTOR * self._seconds_sum / self._elements_sum:
      self._doubt = ((self._seconds_sum, self._elements_sum), cost)
    self._seconds_sum = _DECAY * self._seconds_sum + seconds
    self._elements_sum = _DECAY * self._elements_sum + n

  def observe(self, elements: list[Any], seconds: float | None = None) -> None:
    """Learns element cost and size from a computed chunk."""
    if not elements:
      return
    if seconds is not None and seconds > 0:
      self._learn(len(elements), seconds)
    if self._bytes_cap is None:
      sample = next((x for x in elements if x is not None), None)
      if sample is not None:
        self._bytes_cap = max(1, self._max_chunk_bytes // max(1, _estimate_nbytes(sample)))


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
    with source_lib.reads_kept_on_failure():  # A source that streams gives the retry what it read (see there).
      return ds._getitems(np.arange(start, stop, dtype=np.int64)), None  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except
    pass
  elements = []
  for i in range(start, stop):
    try:
      elements.append(ds._getitems(np.array([i], dtype=np.int64))[0])  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      # Where the computing side can tell (workers run the user's setup).
      return elements, realign.note_resume(ds, e, i)
  return elements, None


def timed_compute_chunk(ds: map_dataset_lib.MapDataset, start: int,
                        stop: int) -> tuple[list[Any], Exception | None, float]:
  """`compute_chunk` plus the seconds it took (for chunk sizing)."""
  t0 = time.perf_counter()
  elements, error = compute_chunk(ds, start, stop)
  return elements, error, time.perf_counter() - t0


# A chunk as producers hand it out: (start, elements, error or None).
Chunk = tuple[int, list[Any], "BaseException | None"]


class ChunkProducer(Protocol):
  """Hands out the chunks of one MapDataset in position order."""

  def reset(self, start: int) -> None:
    """The next chunk starts at position `start` (drops anything computed ahead)."""

  def next_chunk(self) -> Chunk | None:
    """The next chunk, or None past the end."""

  def close(self) -> None:
    """Releases threads/processes; idempotent."""


class ClosedWhileWaitingError(ValueError):
  """close() was called (in another thread) while this iterator waited for its next chunk."""

  def __init__(self, waited_for: str = "a worker"):
    super().__init__(f"This iterator was closed (close() was called while it waited for {waited_for}); "
                     "create a new one with iter(dataset).")


class SyncChunkProducer:
  """Computes chunks of a MapDataset on demand in the calling thread."""

  def __init__(self, ds: map_dataset_lib.MapDataset, chunk_size: int | None):
    self._ds = ds
    self._len = len(ds)
    self._sizer = ChunkSizer(ds, chunk_size)
    self._next = 0
    # Held by the consuming iterator while it takes a chunk: two threads
    # calling next() would otherwise both compute the chunk at `_next`.
    self.consume_lock = threading.RLock()

  def reset(self, start: int) -> None:
    self._next = start

  def realign(self, origin: int) -> None:
    """Computes `ds.at(origin)` from now on (a RealignedMapDataset; see loader.realign)."""
    self._ds = self._ds.at(origin)
    self._len = len(self._ds)
    self._sizer.resize(self._len)

  def next_chunk(self) -> Chunk | None:
    start = self._next
    if start >= self._len:
      return None
    stop = min(start + self._sizer.size(start), self._len)
    elements, error, seconds = timed_compute_chunk(self._ds, start, stop)
    self._sizer.observe(elements, seconds)
    self._next = start + len(elements)
    return start, elements, error

  def close(self) -> None:
    pass


class ForkedIteratorError(RuntimeError):
  """next() on an iterator in a process forked from the one that created it."""


# How many forks this process is from the first one (a child's count is its parent's + 1):
# MapDatasetIterator.__next__ compares it per element, which os.getpid() (a system call) would cost more.
_forks = [0]


def _count_fork() -> None:
  _forks[0] += 1


if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_count_fork)


def check_same_process(pid: int) -> None:
  """Raises ForkedIteratorError unless this is process `pid` (an iterator's threads
  and worker pipes belong to the process that started them)."""
  if os.getpid() != pid:
    raise ForkedIteratorError(
        f"This iterator was started in process {pid}, and this is process {os.getpid()} (a fork of it?): its "
        "threads and worker processes belong to the other one. Create a new iterator here with iter(dataset).")


def available_cores() -> int:
  """Cores this process may run on: its CPU affinity, which containers restrict."""
  try:
    return len(os.sched_getaffinity(0)) or 1
  except AttributeError:  # Not on Linux.
    return os.cpu_count() or 1


def reading_threads(num_threads: int) -> int:
  """Reading threads worth running: up to two per core.

  An ArrayRecord read releases the GIL while it reads and decompresses, but
  holds it while it builds the records' bytes objects; a second thread per
  core keeps reading meanwhile (8 files x 4k sorted indices, 2 cores: ~350k
  records/s with 2 threads, ~370k with 4). More only contend for the GIL.
  """
  return max(1, min(num_threads, 2 * available_cores()))


# Elements whose per-element work (maps, per-index reads; not the batched
# source reads) costs at least this per record on one thread are computed on
# several threads, each taking a slice of the chunk, as Grain's ReadOptions
# threads compute elements side by side. Below it, a chunk is one batched
# call whose reads are spread over files instead: slicing the chunk would
# make every read smaller.
_SPLIT_SECONDS_PER_RECORD = 50e-6
# Work whose threads use less CPU than this share of the time waits (I/O,
# sleeps) and may use all `num_threads`; work that computes uses at most its
# share of the cores.
_WAITING_CPU_SHARE = 0.5
# A computing split whose threads keep fewer cores than this busy gains
# nothing (the work holds the GIL, as pure-Python maps do) and costs GIL
# hand-offs: the next chunks stay whole, and every _REPROBE_CHUNKS-th one is
# split again in case the work or the machine changed.
_MIN_SPLIT_CORES = 1.25
_REPROBE_CHUNKS = 16
# Before computing work whose elements hold many records (a folded batch) is
# first split, two threads each compute this many records of the per-record
# dataset side by side: whether they ran in parallel shows in tens of ms
# rather than in a whole split chunk (which runs slower than one thread when
# the work holds the GIL). Those records are computed again in their chunk.
_PROBE_RECORDS = 32


def _timed(ds: map_dataset_lib.MapDataset, start: int, stop: int) -> tuple[list[Any], Exception | None, float, float]:
  """`compute_chunk`, the wall seconds of its per-element work (those of
  batched source reads left out) and this thread's CPU seconds."""
  w0, c0, r0 = time.perf_counter(), time.thread_time(), source_lib.batched_read_seconds()
  elements, error = compute_chunk(ds, start, stop)
  reads = source_lib.batched_read_seconds() - r0
  return elements, error, max(0.0, time.perf_counter() - w0 - reads), time.thread_time() - c0


def _reads_by_index(ds: map_dataset_lib.MapDataset) -> bool:
  """Whether every source under `ds` surely returns the record of the index asked."""
  if isinstance(ds, map_dataset_lib.SourceMapDataset):
    return ds._reader.reads_by_index  # pylint: disable=protected-access
  parents = ds._parents  # pylint: disable=protected-access
  return bool(parents) and all(_reads_by_index(p) for p in parents)


class ChunkComputer:
  """Computes chunks of one MapDataset, on several threads where elements are costly.

  A chunk computed in one call measures the per-record seconds of its
  per-element work (batched source reads left out) and whether that work
  waits (uses under half a CPU). A chunk whose elements cost at least
  `_SPLIT_SECONDS_PER_RECORD` is split into slices computed side by side:
  `num_threads` of them when the work waits (I/O), at most `cores_share`
  when it computes. A split chunk measures the CPU its threads used against
  its elapsed time, so threads that contend for the GIL or the cores are not
  mistaken for waiting ones; computing threads that keep fewer than
  `_MIN_SPLIT_CORES` cores busy leave the next chunks whole (re-probed every
  `_REPROBE_CHUNKS` chunks). The first element is computed alone first, so
  the first chunk is split, or not, on a measurement. Slicing never changes
  which elements are computed, only where.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset, num_threads: int, *, cores_share: int | None = None):
    self._ds = ds
    # A stream is read in order, one element after the other (see map_dataset.streams), and an
    # iterator-level function sees its elements so (see map_dataset.in_order): chunks stay whole.
    whole = map_dataset_lib.streams(ds) or map_dataset_lib.in_order(ds)
    self._threads = min(max(0, num_threads), 1 if whole else num_threads)
    self._cores = max(1, cores_share if cores_share is not None else available_cores())
    self._read_threads = min(reading_threads(num_threads), 2 * self._cores) if num_threads > 0 else 1
    self._records = max(1, ds._records_per_element)  # pylint: disable=protected-access
    self._cost: float | None = None  # Seconds of per-element work per record, one thread.
    self._waits = False
    self._whole_left = 0  # Chunks still computed whole after a split that did not pay.
    self._probed = False
    self._lock = threading.Lock()
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._pool_forks = _forks[0]
    self._closed = False

  @property
  def dataset(self) -> map_dataset_lib.MapDataset:
    return self._ds

  def realign(self, origin: int) -> None:
    """Computes `ds.at(origin)` from now on (a RealignedMapDataset; see loader.realign)."""
    if realign.origin_of(self._ds) != origin:
      self._ds = self._ds.at(origin)

  def split_width(self) -> int:
    """Threads a large chunk would be split over now (1: computed whole)."""
    return self._width(count_whole=False)

  def _slices(self, n: int) -> int:
    """Slices for the next chunk of n elements (counts a chunk left whole after a split that did not pay)."""
    return 1 if n <= 1 else min(n, self._width(count_whole=True))

  def _width(self, *, count_whole: bool) -> int:
    if self._threads <= 1 or self._cost is None or self._cost < _SPLIT_SECONDS_PER_RECORD:
      return 1
    if self._waits:
      return self._threads
    if self._whole_left > 0:  # A split of computing work did not pay: whole chunks for a while.
      if count_whole:
        self._whole_left -= 1
      return 1
    return min(self._threads, self._cores)

  def _probe(self, start: int) -> None:
    """Splits `_PROBE_RECORDS` x 2 records of the per-record dataset (see there) and learns from it."""
    base = self._ds
    while base._records_per_element > 1 and base._parents:  # pylint: disable=protected-access
      base = base._parent  # pylint: disable=protected-access
    # Per-record elements: the first split is small anyway. A user source
    # could stream (ignore the index), and would lose the probe's records.
    if base is self._ds or not _reads_by_index(base):
      return
    pool = self._thread_pool()
    if pool is None:
      return
    first = start * self._records
    t0 = time.perf_counter()
    try:
      futures = [pool.submit(_timed, base, first + i * _PROBE_RECORDS, first + (i + 1) * _PROBE_RECORDS)
                 for i in range(2)]
    except RuntimeError:  # Closed meanwhile: nothing learnt.
      return
    cpu = sum(f.result()[3] for f in futures)
    self._note_split(2, cpu, time.perf_counter() - t0)

  def _note_split(self, slices: int, cpu: float, elapsed: float) -> None:
    """Learns from a split chunk whether its computing threads ran side by side."""
    self._waits = cpu < _WAITING_CPU_SHARE * elapsed
    paid = self._waits or slices < 2 or cpu >= _MIN_SPLIT_CORES * elapsed
    self._whole_left = 0 if paid else _REPROBE_CHUNKS

  def compute(self, start: int, stop: int) -> tuple[list[Any], Exception | None, float]:
    """Elements [start, stop) as `compute_chunk` gives them, and the wall seconds taken."""
    t0 = time.perf_counter()
    if self._cost is None and self._threads > 1 and stop - start > 1:
      first, error = self._compute(start, start + 1)  # Measures, then the rest is split or not.
      if error is not None:
        return first, error, time.perf_counter() - t0
      rest, error = self._compute(start + 1, stop)
      return first + rest, error, time.perf_counter() - t0
    elements, error = self._compute(start, stop)
    return elements, error, time.perf_counter() - t0

  def _compute(self, start: int, stop: int) -> tuple[list[Any], Exception | None]:
    slices = self._slices(stop - start)
    if slices > 1 and not self._waits and not self._probed:
      self._probed = True
      self._probe(start)
      slices = self._slices(stop - start)
    pool = self._thread_pool() if slices > 1 else None
    if pool is None:
      with source_lib.parallel_reads(self._read_threads):
        elements, error, work, cpu = _timed(self._ds, start, stop)
      if elements:
        self._cost = work / (len(elements) * self._records)
        self._waits = cpu < _WAITING_CPU_SHARE * work
      return elements, error
    t0 = time.perf_counter()
    n = stop - start
    bounds = [start + n * i // slices for i in range(slices + 1)]
    futures = []
    try:
      for a, b in zip(bounds, bounds[1:]):
        futures.append(pool.submit(_timed, self._ds, a, b))
    except RuntimeError:  # Closed meanwhile, or no thread could start: the rest in this thread.
      futures.append(None)
    elements: list[Any] = []
    work = cpu = 0.0
    for i, fut in enumerate(futures):
      if fut is None:
        part, error, part_work, part_cpu = _timed(self._ds, start + len(elements), stop)
      else:
        part, error, part_work, part_cpu = fut.result()
      elements.extend(part)
      work, cpu = work + part_work, cpu + part_cpu
      if error is not None:  # The elements before the failing one, then the error.
        for later in futures[i + 1:]:
          if later is not None:
            later.cancel()
        return elements, error
    if elements:
      self._note_split(len(futures), cpu, time.perf_counter() - t0)
      # Computing threads: their CPU is the cost (waiting for the GIL is not);
      # waiting ones: their own wall time is.
      self._cost = (work if self._waits else cpu) / (len(elements) * self._records)
    return elements, None

  def _thread_pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
    with self._lock:
      if self._pool is None and not self._closed:
        self._pool = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="loader-map")
        self._pool_forks = _forks[0]
      return self._pool

  def close(self) -> None:
    if self._pool_forks != _forks[0]:
      # In a forked child the pool's threads are the parent's, and a lock one held at the fork (a pool
      # being made, a split chunk) stays held here: shutting it down, or taking our lock, waited for ever.
      # There is nothing of ours to stop.
      self._closed, self._pool = True, None
      return
    with self._lock:
      self._closed = True
      pool, self._pool = self._pool, None
    if pool is not None:
      pool.shutdown(wait=False, cancel_futures=True)


class ThreadChunkProducer:
  """Computes chunks ahead in a background thread; hands them out in order.

  One thread computes the chunks while the consumer works (a training step
  releases the GIL). Within a chunk, reads that touch several files run on up
  to `num_threads` threads (capped at two per core), since ArrayRecord reads
  release the GIL, and costly elements (a slow or waiting map) are computed on
  up to `num_threads` threads (see `ChunkComputer`). At most two chunks, and
  about `buffer_size` elements beyond the first, are ahead.
  """

  def __init__(self, ds: map_dataset_lib.MapDataset, chunk_size: int | None, num_threads: int, buffer_size: int):
    self._len = len(ds)
    self._computer = ChunkComputer(ds, num_threads)
    self._sizer = ChunkSizer(ds, chunk_size, split_width=self._computer.split_width)
    self._buffer_size = max(1, buffer_size)
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._pending: collections.deque[tuple[int, int, concurrent.futures.Future]] = collections.deque()
    self._next_submit = 0
    self._finalizer: weakref.finalize | None = None
    # Chunks queued behind one that failed are not computed: the consumer
    # goes on after the failure (reset), and a source that streams must not
    # be read past it meanwhile (its records would be lost).
    self._generation = 0
    self._failed_generation = -1
    self._consume_lock = threading.RLock()
    self._closed = False

  def check_not_forked(self) -> None:
    """Raises ForkedIteratorError in a process forked after the background thread started."""
    if self._pool is not None:
      check_same_process(self._pid)

  @property
  def consume_lock(self) -> threading.RLock:
    """Held by the consuming iterator while it takes a new chunk (see MapDatasetIterator.__next__)."""
    self.check_not_forked()  # First: in a fork, a thread of the parent may have held it at the fork.
    return self._consume_lock

  def reset(self, start: int) -> None:
    if not self._forked():  # A forked child's futures are the parent's: cancel() takes their locks.
      for _, _, fut in self._pending:
        fut.cancel()
    self._pending.clear()
    self._next_submit = start
    self._generation += 1

  def _forked(self) -> bool:
    """Whether this is a process forked after the background thread started (its pool is the parent's)."""
    return self._pool is not None and self._pid != os.getpid()

  def _compute(self, generation: int, start: int, stop: int) -> tuple[list[Any], Exception | None, float]:
    if generation == self._failed_generation:
      return [], None, 0.0  # Never handed out: the consumer resets first.
    elements, error, seconds = self._computer.compute(start, stop)
    if error is not None:
      self._failed_generation = generation
    return elements, error, seconds

  def realign(self, origin: int) -> None:
    """Computes `ds.at(origin)` from now on (after a reset; see loader.realign)."""
    self._computer.realign(origin)
    self._len = len(self._computer.dataset)
    self._sizer.resize(self._len)

  def start(self) -> None:
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loader-compute")
      self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
      self._pid = os.getpid()
    self._top_up()

  def _top_up(self) -> None:
    in_flight = sum(stop - start for start, stop, _ in self._pending)
    while (len(self._pending) < 2 and self._next_submit < self._len
           and (not self._pending or in_flight < self._buffer_size)):
      start = self._next_submit
      stop = min(start + self._sizer.size(start), self._len)
      fut = self._pool.submit(self._compute, self._generation, start, stop)
      self._pending.append((start, stop, fut))
      in_flight += stop - start
      self._next_submit = stop

  def next_chunk(self) -> Chunk | None:
    self.check_not_forked()
    if self._closed:  # A thread that waited for the consume lock while another closed the iterator.
      raise ClosedWhileWaitingError("a chunk being computed")
    self.handed_over = False
    self.start()
    if not self._pending:
      return None
    start, _, fut = self._pending[0]
    # Taken off the queue only once done: a Ctrl-C while waiting leaves it
    # there, and the next call waits for it again (no chunk is skipped).
    try:
      elements, error, seconds = fut.result()
    except concurrent.futures.CancelledError:
      if self._closed:
        raise ClosedWhileWaitingError("a chunk being computed") from None
      raise
    if self._closed:  # close() emptied the queue meanwhile: not the end of the data.
      raise ClosedWhileWaitingError("a chunk being computed")
    self.handed_over = True  # Off the queue from here: a Ctrl-C now needs a reset (see MapDatasetIterator).
    self._pending.popleft()
    self._sizer.observe(elements, seconds)
    if error is not None:
      self.reset(start + len(elements))  # Later chunks restart after a retry.
    else:
      self._top_up()
    return start, elements, error

  def close(self) -> None:
    self._closed = True
    if self._forked():
      # The pool, its futures and their locks are the parent's (see ChunkComputer.close).
      self._pending.clear()
      if self._finalizer is not None:
        self._finalizer.detach()
    else:
      self.reset(self._len)
      if self._finalizer is not None:
        self._finalizer()
    self._computer.close()


_factory = threading.local()


@contextlib.contextmanager
def producer_factory(factory: Callable[[map_dataset_lib.MapDataset, Any], ChunkProducer]) -> Iterator[None]:
  """Within this block, iterators of MapDataset parts get producers from `factory`.

  `mp_prefetch` uses it while building its parent's iterator tree, so every
  random-access part under it, however the stages above combine them, is
  computed by worker processes.
  """
  previous = getattr(_factory, "fn", None)
  _factory.fn = factory
  try:
    yield
  finally:
    _factory.fn = previous


def make_producer(ds: map_dataset_lib.MapDataset, read_options: Any) -> ChunkProducer:
  """The producer for iterating `ds` here (see `producer_factory`)."""
  factory = getattr(_factory, "fn", None)
  if factory is not None:
    return factory(ds, read_options)
  if read_options.num_threads > 0:
    return ThreadChunkProducer(ds, read_options.chunk_size, read_options.num_threads,
                               read_options.prefetch_buffer_size)
  return SyncChunkProducer(ds, read_options.chunk_size)


def _safe_repr(ds: Any) -> str:
  try:
    return repr(ds)
  except Exception:  # pylint: disable=broad-except  # A user source's repr must not replace the error.
    return type(ds).__name__


class MapDatasetIterator(dataset_iterator.DatasetIterator[T]):
  """Iterates a MapDataset chunk by chunk; state is {"next_index": k}.

  If computing element k raises, the elements before it are yielded first,
  then the error is raised and element k is consumed, as in Grain: the state
  is then at k + 1 and the next call goes on there (a loop that skips bad
  records ends; restoring an earlier state computes k again).
  """

  def __init__(self, ds: map_dataset_lib.MapDataset[T], producer: ChunkProducer, *, allow_nones: bool = False,
               unit: int = 1, unit_len: int | None = None, grain_layers: tuple[tuple[str, int], ...] = ()):
    super().__init__()
    self._ds = ds
    self._len = len(ds)
    self._producer = producer
    self._allow_nones = allow_nones
    # Grain counts positions in elements before iterator-level batches
    # (folded into `ds` here): `unit` of them make one of ours.
    self._unit = unit
    self._unit_len = unit_len
    # Folded iterator stages whose Grain state wraps the position (see
    # MapBackedIterDataset); a Grain-written state is unwrapped through them.
    self._grain_layers = grain_layers
    if grain_layers:
      self._grain_state_keys = ("parent", grain_layers[-1][0])
    self._buffer: list[Any] = []
    self._buffer_start = 0
    self._pos = 0
    self._error: BaseException | None = None
    # Grain's filter-ratio check on the holes `filter` leaves (set up on the
    # first chunk: options are final only once the whole tree is built).
    self._ratio_check: dataset_options.FilterRatioCheck | None | bool = (
        not allow_nones and ds._may_contain_none)  # pylint: disable=protected-access
    # The check counts a chunk when it arrives; Grain counts elements as they
    # are handed out. (counts before the chunk, its dropped mask) lets a move
    # (set_state) take back the elements not handed out.
    self._ratio_undo: tuple[tuple[int, int], list[bool] | None] | None = None
    self._forks_seen = _forks[0]
    producer.reset(0)

  def start_prefetch(self) -> None:
    start = getattr(self._producer, "start", None)
    if start is not None:
      start()

  def __next__(self) -> T:
    self._assert_not_closed()  # Even with elements left in the buffer, as Grain.
    if self._forks_seen != _forks[0]:
      self._check_not_forked()
    while True:
      if self._pos >= len(self._buffer):
        dataset_iterator.raise_if_stop_requested()
        # Worker pools lock their reads (see mp_prefetch): held over the
        # refill, two threads calling next() cannot both take a new chunk
        # and drop one of them. Once per chunk, never per element.
        lock = getattr(self._producer, "consume_lock", None)
        if lock is None:
          self._refill()
        else:
          with lock:
            if self._pos >= len(self._buffer):  # Else another thread refilled it meanwhile.
              self._refill()
        continue
      try:  # Free when nothing is raised (3.11+).
        x = self._buffer[self._pos]
      except IndexError:  # Another thread calling next() took the chunk's last element after the check above.
        continue
      # Handed out elements are the consumer's: freeing them as it drops them
      # spreads deallocation over the chunk instead of one burst at its end.
      self._buffer[self._pos] = None
      self._pos += 1
      if x is not None:
        return x if x is not batching.NONE_ELEMENT else None
      if self._allow_nones:
        return x

  def _check_not_forked(self) -> None:
    """In a forked child, raises ForkedIteratorError where the producer's threads or workers are the parent's.

    On every next(), not only when a chunk runs out: the rest of a chunk the parent took came here too,
    and the child handed out elements the parent also hands out before it raised.
    """
    check = getattr(self._producer, "check_not_forked", None)  # Producers with threads or workers have one.
    if check is not None:
      check()
    self._forks_seen = _forks[0]

  def _refill(self) -> None:
    """Takes the next chunk into the buffer, or raises what comes at this position (an error, StopIteration)."""
    self._ratio_undo = None  # The buffer was all handed out: the check's counts are exact.
    if self._error is not None:
      error, self._error = self._error, None
      # An error consumes its element, as in Grain: a failed element, or the
      # one whose filter-ratio check raised.
      if (not isinstance(error, dataset_options.FilterRatioError)
          and isinstance(self._producer, (ThreadChunkProducer, SyncChunkProducer))):
        # Workers note theirs (mp_prefetch); a user's map says nothing of where it was.
        error.add_note(f"Raised while computing element {self._buffer_start + self._pos} of "
                       f"{_safe_repr(self._ds)}; the stream goes on after it.")
      at = realign.resume_at(error) if self._unit > 1 else None
      if at is not None and isinstance(self._ds, realign.RealignedMapDataset):
        # As Grain's batch iterator: the next batch starts after the failed element (see loader.realign).
        # The position is after the failed batch first: a Ctrl-C during the move stays there.
        self._buffer_start = min(self._buffer_start + self._pos + 1, self._len)
        self._buffer, self._pos = [], 0
        self._go_to_element(at)
        try:
          raise error
        finally:
          error = None  # Else error -> traceback -> this frame -> error: a cycle keeping the iterator.
      self._buffer_start = min(self._buffer_start + self._pos + 1, self._len)
      self._buffer, self._pos = [], 0
      self._producer.reset(self._buffer_start)
      try:
        raise error
      finally:
        error = None  # As above: the iterator (and its workers) go when the caller drops the error.
    resume, chunk = self._buffer_start + self._pos, None
    try:
      chunk = self._producer.next_chunk()
      if chunk is None:
        raise StopIteration
      self._buffer_start, elements, self._error = chunk
      # Our own list: slots are cleared below, and a dataset's _getitems may return a list it keeps.
      self._buffer = list(elements)
      self._pos = 0
    except KeyboardInterrupt:
      # A Ctrl-C may have come after the producer handed the chunk over:
      # in process, the next call computes it again from this position
      # (worker pools keep their own place, see mp_prefetch).
      handed_over = chunk is not None or getattr(self._producer, "handed_over", False)
      if handed_over and isinstance(self._producer, (ThreadChunkProducer, SyncChunkProducer)):
        self._buffer, self._pos, self._buffer_start, self._error = [], 0, resume, None
        self._producer.reset(resume)
      raise
    if self._ratio_check:
      self._check_ratio()

  def _check_ratio(self) -> None:
    check = self._ratio_check
    if check is True:
      check = dataset_options.FilterRatioCheck("to_iter_dataset()", self._ctx.dataset_options)
      self._ratio_check = check = check if check.enabled else None
      if check is None:
        return
    buf = self._buffer
    dropped = [x is None for x in buf]  # Not `None in buf`: that compares arrays with ==.
    mask = dropped if True in dropped else None
    self._ratio_undo = (check.counts(), mask)
    at = check.first_failure(len(buf), mask)
    if at is not None:
      # As in Grain: the elements before the one whose check raised come
      # first, then the error, which consumes that one.
      self._buffer = buf[:at]
      self._error = check.error()

  def get_state(self) -> dict[str, Any]:
    # Counted as Grain does: a batch after to_iter_dataset() (folded here)
    # counts the elements it consumed, not batches.
    k = self._buffer_start + self._pos
    return {"next_index": k if self._unit == 1 else min(self._origin() + k * self._unit, self._unit_len)}

  def _origin(self) -> int:
    """The element the current view's first batch starts at (see loader.realign)."""
    return realign.origin_of(self._ds)

  def set_state(self, state: dict[str, Any]) -> None:
    counts = []
    if dataset_iterator.restoring_foreign_state():
      for key, unit in reversed(self._grain_layers):
        state_lib.check_keys(state, ("parent", key), type(self).__name__)
        counts.append((key, state[key], unit))
        state = state["parent"]
    state_lib.check_keys(state, ("next_index",), type(self).__name__)
    k = state["next_index"]
    for key, count, unit in counts:
      # Each stage counted its own elements: ceil(k / unit) of them by position k.
      if not (checks.is_int(k) and checks.is_int(count) and count == -(-int(k) // unit)):
        raise state_lib.StateMismatchError(
            f"{type(self).__name__}.set_state: the Grain state's {key}={count!r} does not match its position "
            f"next_index={k!r}; was it saved from a different pipeline?")
    if self._unit > 1:
      self._check_element_position(k)
      if isinstance(self._ds, realign.RealignedMapDataset):
        self._go_to_element(int(k))  # Inside a batch too: batches start there, as Grain's do.
        return
      k = self._from_element_position(k)
    self._move_to(k, "set_state")

  def _go_to_element(self, e: int) -> None:
    """Moves to input element `e` of a realigned batch: the next batch starts there."""
    if e >= self._unit_len:
      self._move_to(len(self._ds.at(0)), "set_state", origin=0)
    elif e % self._unit == 0:
      self._move_to(e // self._unit, "set_state", origin=0)
    else:
      self._move_to(0, "set_state", origin=e)

  def _move_to(self, k: Any, what: str, origin: int | None = None) -> None:
    """Moves to position `k` (of the view starting at element `origin`, if given)."""
    view = self._ds if origin is None else self._ds.at(origin)
    length = len(view)
    if not checks.is_int(k) or not 0 <= k <= length:
      error = state_lib.PositionOutOfRangeError if checks.is_int(k) else state_lib.StateTypeError
      raise error(
          f"{type(self).__name__}.{what}: next_index must be an integer in "
          f"[0, {length}] for this dataset (got {k!r}); was the state saved from another dataset?")
    here, here_view = self._buffer_start + self._pos, self._ds
    undo, self._ratio_undo = self._ratio_undo, None
    if undo is not None:  # The buffer goes: only its elements handed out stay counted, as in Grain.
      counts, mask = undo
      self._ratio_check.recount(counts, self._pos, None if mask is None else mask[:self._pos])
    try:
      if view is not here_view:
        self._producer.reset(0)
        self._producer.realign(view.origin)
        self._ds, self._len = view, length
      self._producer.reset(int(k))
    except BaseException:
      # A Ctrl-C in the middle (a restore interrupted): stay wholly at the old
      # position, never reporting one and yielding from another.
      self._buffer, self._buffer_start, self._pos = [], here, 0
      if view is not here_view:
        self._producer.realign(realign.origin_of(here_view))
        self._ds, self._len = here_view, len(here_view)
      self._producer.reset(here)
      raise
    self._buffer, self._buffer_start, self._pos, self._error = [], int(k), 0, None

  # Grain's experimental get_next_index / set_next_index: the position of the
  # next element (loader's unit: an element of the folded MapDataset, so a
  # folded iterator-level batch counts batches, as Grain's batch iterator does).

  def _get_next_index(self) -> int:
    return -(-self._origin() // self._unit) + self._buffer_start + self._pos  # Grain's: batches begun.

  def _set_next_index(self, index: int) -> None:
    self._move_to(index, "set_next_index", origin=0 if isinstance(self._ds, realign.RealignedMapDataset) else None)

  def _check_element_position(self, k: Any) -> None:
    if not checks.is_int(k) or not 0 <= k <= self._unit_len:
      error = state_lib.PositionOutOfRangeError if checks.is_int(k) else state_lib.StateTypeError
      raise error(
          f"{type(self).__name__}.set_state: next_index counts elements before .batch({self._unit}) and must be "
          f"an integer in [0, {self._unit_len}] for this dataset (got {k!r}); was the state saved from another "
          "dataset?")

  def _from_element_position(self, k: Any) -> int:
    """Our position (in folded batches) of a state's next_index (in elements before the batch)."""
    self._check_element_position(k)
    k = int(k)
    if k == self._unit_len:
      return self._len
    if k % self._unit:
      raise state_lib.StateMismatchError(
          f"{type(self).__name__}.set_state: the state's next_index={k} counts elements before "
          f".batch({self._unit}) and falls inside a batch, so it cannot be resumed exactly; start over.")
    return k // self._unit

  def close(self) -> None:
    if not self._closed:
      self._producer.close()
    super().close()


