"""`mp_prefetch`: the random-access prefix of a pipeline, computed in processes.

Chunk c of prefix positions goes to worker c % num_workers; the parent
receives chunks in order, so the stream does not depend on the worker count
(see `loader.iter_dataset` for which stages form the prefix). Workers are
started with the 'spawn' method: fork would copy JAX/TensorFlow runtime threads
and locks into the child, which can deadlock. The pipeline is sent once with
cloudpickle, so lambdas and locally defined functions work.

Lifecycle. Workers ignore SIGINT (the parent decides when to stop), exit when
the parent sends "stop", closes the pipe, or dies (a watchdog thread polls
os.getppid()). On parent death a worker unlinks the shared-memory segments it
sent but the parent never acknowledged. The parent closes workers on
`close()`, garbage collection, interpreter exit and errors, unlinks every
segment it received, and finally sweeps segments carrying its prefix, which
only a killed worker can have left behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable
from typing import Any

from loader import ipc
from loader import engine
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import options as options_lib

_PARENT_POLL_S = 0.5
# Grain's default for mp_prefetch() without options.
_DEFAULT_NUM_WORKERS = 10
_LOCAL = -1  # Chunk computed by the parent itself.
_STOP_GRACE_S = 1.0


class WorkerError(RuntimeError):
  """A worker process failed; the message holds the worker's traceback."""


def _dumps(obj: Any) -> bytes:
  try:
    # Lazy: only pipelines sent to workers need it; optional without workers.
    import cloudpickle  # pylint: disable=g-import-not-at-top
  except ImportError:
    try:
      return pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
      raise TypeError(
          "mp_prefetch could not pickle the pipeline (lambdas and local "
          "functions need cloudpickle: pip install cloudpickle).") from e
  return cloudpickle.dumps(obj)


def _describe(error: BaseException) -> tuple[str, bytes | None]:
  """Traceback text and, if picklable, the exception itself."""
  text = "".join(traceback.format_exception(error))
  try:
    return text, pickle.dumps(error)
  except Exception:  # pylint: disable=broad-except
    return text, None


def _worker_main(worker_index: int, num_workers: int, conn, payload: bytes, shm_prefix: str,
                 parent_pid: int) -> None:
  """Worker loop: compute requested chunks until told to stop."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  outstanding: set[str] = set()  # Sent segments the parent has not acknowledged.
  lock = threading.Lock()

  def orphaned() -> None:
    with lock:
      for name in list(outstanding):
        ipc.unlink(name)
    os._exit(0)  # pylint: disable=protected-access

  def watchdog() -> None:
    while True:
      time.sleep(_PARENT_POLL_S)
      if os.getppid() != parent_pid:
        orphaned()

  threading.Thread(target=watchdog, name="loader-parent-watchdog", daemon=True).start()
  try:
    ds, worker_init_fn = pickle.loads(payload)
    if worker_init_fn is not None:
      worker_init_fn(worker_index, num_workers)
  except BaseException:  # pylint: disable=broad-except
    conn.send(("fatal", traceback.format_exc()))
    return
  seq = 0
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      orphaned()
    if msg[0] == "stop":
      break
    _, gen, chunk_id, start, stop, released = msg
    with lock:
      outstanding.difference_update(released)
    seq += 1
    name = f"{shm_prefix}{worker_index}_{seq}"
    elements, error, seconds = engine.timed_compute_chunk(ds, start, stop)
    try:
      with lock:
        desc = ipc.encode(elements, name)
        if ipc.segment_name(desc) is not None:
          outstanding.add(name)
    except Exception as e:  # pylint: disable=broad-except
      # E.g. an element that cannot be pickled: report it at the chunk start.
      desc, error = ipc.encode([], name), e
    del elements
    failure = None if error is None else _describe(error)
    try:
      conn.send(("ok", gen, chunk_id, desc, failure, seconds))
    except (BrokenPipeError, OSError):
      orphaned()
  conn.close()


def _shutdown(procs: list, conns: list, shm_prefix: str) -> None:
  """Stops workers and frees every segment; safe to call more than once."""
  for conn in conns:
    try:
      conn.send(("stop",))
    except (OSError, ValueError):
      pass
  deadline = time.monotonic() + _STOP_GRACE_S
  for proc, conn in zip(procs, conns):
    # Keep reading while waiting: a worker blocked on a full pipe cannot exit.
    while True:
      try:
        if conn.poll(0.02):
          msg = conn.recv()
          if msg[0] == "ok":
            ipc.release(msg[3])
          continue
      except (EOFError, OSError, ValueError):
        pass
      if not proc.is_alive():
        break
      if time.monotonic() > deadline:
        proc.terminate()
        proc.join(1.0)
        if proc.is_alive():
          proc.kill()
        break
    proc.join(1.0)
    try:
      while conn.poll(0):
        msg = conn.recv()
        if msg[0] == "ok":
          ipc.release(msg[3])
    except (EOFError, OSError, ValueError):
      pass
    conn.close()
  procs.clear()
  conns.clear()
  ipc.sweep(shm_prefix)


@contextlib.contextmanager
def _without_main_module():
  """Spawned children do not re-import the script that started them.

  'spawn' normally runs the parent's `__main__` again in every worker: slow
  when the script imports JAX at top level, and fatal for a script without an
  `if __name__ == "__main__":` guard (the child would start workers itself).
  The pipeline travels with cloudpickle, which carries functions and classes
  defined in `__main__` by value, so the workers do not need the script.
  """
  main = sys.modules.get("__main__")
  sys.modules["__main__"] = types.ModuleType("__main__")
  # Children inherit a blocked SIGINT, so a Ctrl-C while they start cannot
  # kill them before they ignore it; the parent gets it when unblocked.
  blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if main is None:
      del sys.modules["__main__"]
    else:
      sys.modules["__main__"] = main


class MultiprocessChunkProducer:
  """Hands out chunks of a MapDataset computed by worker processes, in order.

  Each chunk goes to the worker with the least work outstanding; the consumer
  takes chunks in position order, so assignment never changes the stream.
  While the workers start, the parent computes the first (small) chunk
  itself, unless a `worker_init_fn` must run before any element.
  """

  def __init__(self, ds: map_lib.MapDataset, options: options_lib.MultiprocessingOptions,
               worker_init_fn: Callable[[int, int], None] | None):
    self._ds = ds
    self._len = len(ds)
    self._num_workers = options.num_workers
    self._in_flight = options.per_worker_buffer_size + 1  # One computing, rest buffered.
    self._sizer = engine.ChunkSizer(ds, options.chunk_size, parallelism=self._num_workers)
    self._worker_init_fn = worker_init_fn
    self._procs: list[Any] = []
    self._conns: list[Any] = []
    self._prefix = f"arl{os.getpid()}_{secrets.token_hex(3)}_"
    self._gen = 0
    # chunk id -> (start, stop, worker index or _LOCAL)
    self._chunks: dict[int, tuple[int, int, int]] = {}
    self._load = [0] * self._num_workers  # Elements outstanding per worker.
    self._next_start = 0
    self._next_request = 0
    self._next_consume = 0
    self._released: list[list[str]] = [[] for _ in range(self._num_workers)]
    self._error: BaseException | None = None
    self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._prefix)

  def _start_workers(self) -> None:
    payload = _dumps((self._ds, self._worker_init_fn))
    ctx = multiprocessing.get_context("spawn")
    with _without_main_module():
      for w in range(self._num_workers):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=_worker_main,
            args=(w, self._num_workers, child_conn, payload, self._prefix, os.getpid()),
            name=f"loader-worker-{w}", daemon=True)
        proc.start()
        child_conn.close()
        self._procs.append(proc)
        self._conns.append(parent_conn)
    if self._worker_init_fn is None and self._next_request == 0 and self._next_start < self._len:
      self._add_chunk(_LOCAL)

  def start(self) -> None:
    """Starts the workers and sends them their first chunks."""
    if not self._procs:
      self._start_workers()
    if not (self._chunks.get(self._next_consume, (0, 0, 0))[2] == _LOCAL):
      self._top_up()  # After a local first chunk, its measured cost sizes these.

  @property
  def worker_pids(self) -> list[int]:
    return [p.pid for p in self._procs]

  def reset(self, start: int) -> None:
    # Results of older requests are recognised by generation and dropped.
    self._gen += 1
    self._chunks.clear()
    self._load = [0] * self._num_workers
    self._next_start = start
    self._next_request = self._next_consume = 0

  def _add_chunk(self, w: int) -> int:
    c, start = self._next_request, self._next_start
    stop = min(start + self._sizer.size(start), self._len)
    self._chunks[c] = (start, stop, w)
    self._next_start = stop
    self._next_request += 1
    return c

  def _top_up(self) -> None:
    limit = self._next_consume + self._num_workers * self._in_flight
    while self._next_request < limit and self._next_start < self._len:
      w = min(range(self._num_workers), key=self._load.__getitem__)
      c = self._add_chunk(w)
      start, stop, _ = self._chunks[c]
      self._load[w] += stop - start
      released, self._released[w] = self._released[w], []
      try:
        self._conns[w].send(("task", self._gen, c, start, stop, released))
      except (OSError, ValueError):
        self._raise_dead(w)

  def _raise_dead(self, w: int) -> None:
    proc = self._procs[w]
    proc.join(0.1)
    raise WorkerError(
        f"Worker {w} (pid {proc.pid}) exited unexpectedly with exit code "
        f"{proc.exitcode} while computing {self._ds!r}. A negative code is the "
        "signal that killed it (-9: SIGKILL, often the out-of-memory killer).")

  def _receive(self, w: int) -> tuple:
    conn, proc = self._conns[w], self._procs[w]
    while True:
      ready = multiprocessing.connection.wait([conn, proc.sentinel])
      if conn not in ready:
        if conn.poll(0):
          continue
        self._raise_dead(w)
      try:
        msg = conn.recv()
      except (EOFError, OSError):
        self._raise_dead(w)
      if msg[0] == "fatal":
        raise WorkerError(f"Worker {w} (pid {proc.pid}) failed to start:\n{msg[1]}")
      if msg[1] != self._gen:
        if msg[0] == "ok":
          self._release(w, msg[3])
        continue
      return msg

  def _release(self, w: int, desc: tuple) -> None:
    ipc.release(desc)
    name = ipc.segment_name(desc)
    if name is not None:
      self._released[w].append(name)

  def next_chunk(self) -> engine.Chunk | None:
    if self._error is not None:
      raise self._error
    c = self._next_consume
    try:
      self.start()
      if c not in self._chunks:
        return None
      start, stop, w = self._chunks[c]
      if w == _LOCAL:
        return self._compute_locally(c, start, stop)
      msg = self._receive(w)
    except WorkerError as e:
      self._error = e  # A dead worker: this iterator cannot continue.
      self.close()
      raise
    except BaseException:
      # E.g. KeyboardInterrupt while waiting: a message may be half read, so
      # stop these workers; the next call starts fresh ones at chunk c.
      start = self._chunks[c][0] if c in self._chunks else self._next_start
      _shutdown(self._procs, self._conns, self._prefix)
      self._released = [[] for _ in range(self._num_workers)]
      self.reset(start)
      raise
    del self._chunks[c]
    self._load[w] -= stop - start
    _, _, _, desc, failure, seconds = msg
    try:
      elements = ipc.decode(desc)
    except BaseException:
      ipc.release(desc)
      self.reset(start)  # Not handed out: the next call asks for it again.
      raise
    name = ipc.segment_name(desc)
    if name is not None:
      self._released[w].append(name)
    self._sizer.observe(elements, seconds)
    self._next_consume += 1
    error = None
    if failure is not None:
      error = self._worker_error(w, start + len(elements), failure)
      self.reset(start + len(elements))
    else:
      try:
        self._top_up()  # Keep workers busy while the consumer works.
      except WorkerError:
        pass  # Raised again by the next call, after these elements.
    return start, elements, error

  def _compute_locally(self, c: int, start: int, stop: int) -> engine.Chunk:
    elements, error, seconds = engine.timed_compute_chunk(self._ds, start, stop)
    del self._chunks[c]
    self._sizer.observe(elements, seconds)
    self._next_consume += 1
    if error is not None:
      self.reset(start + len(elements))
    else:
      self._top_up()
    return start, elements, error

  def _worker_error(self, w: int, index: int, failure: tuple[str, bytes | None]) -> WorkerError:
    text, exc_bytes = failure
    error = WorkerError(
        f"Worker {w} (pid {self._procs[w].pid}) raised while computing element "
        f"{index} of {self._ds!r}:\n\n{text}")
    if exc_bytes is not None:
      try:
        error.__cause__ = pickle.loads(exc_bytes)
      except Exception:  # pylint: disable=broad-except
        pass
    return error

  def close(self) -> None:
    self._finalizer()


class MultiprocessPrefetchIterDataset(iter_lib.IterDataset):
  """The parent pipeline with its random-access parts computed in workers."""

  _same_as_grain = True
  _state_transparent = True  # The stream does not depend on the workers.

  def __init__(self, parent: iter_lib.IterDataset, options: options_lib.MultiprocessingOptions | None,
               worker_init_fn: Callable[[int, int], None] | None):
    super().__init__(parent)
    if options is None:
      options = options_lib.MultiprocessingOptions(num_workers=_DEFAULT_NUM_WORKERS)
    if not isinstance(options, options_lib.MultiprocessingOptions):
      raise TypeError(f"mp_prefetch expects loader.MultiprocessingOptions (got {options!r}).")
    self._options = options
    self._worker_init_fn = worker_init_fn

  def _op_repr(self) -> str:
    return f".mp_prefetch(num_workers={self._options.num_workers})"

  def __iter__(self) -> iter_lib.DatasetIterator:
    if self._options.num_workers == 0:
      return iter(self._parent)
    options, init_fn = self._options, self._worker_init_fn

    def factory(ds: map_lib.MapDataset, read_options) -> MultiprocessChunkProducer:
      del read_options  # Workers compute whole chunks; threads would only contend.
      return MultiprocessChunkProducer(ds, options, init_fn)

    with engine.producer_factory(factory):
      return iter(self._parent)
