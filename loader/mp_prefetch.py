"""`mp_prefetch`: the random-access parts of a pipeline, computed in processes.

Every MapDataset part under `mp_prefetch` (one for a plain pipeline, several
under a mix or zip of streams) shares one pool of worker processes. Each
part's consumer asks for chunks of positions, a chunk goes to the least
loaded worker, and the consumer takes chunks back in position order, so the
stream does not depend on the worker count (see `loader.iter_dataset` for
which stages are random access). Workers are started with the 'spawn'
method: fork would copy JAX/TensorFlow runtime threads and locks into the
child, which can deadlock. The pipeline is sent with cloudpickle, so lambdas
and locally defined functions work; as in Grain, workers run the script's
top level first when it has a `__main__` guard (unless
`MultiprocessingOptions(workers_run_main=False)`), and never run a script
without one (see `workers_run_main`).

Lifecycle. Workers ignore SIGINT (the parent decides when to stop), exit when
the parent sends "stop", closes the pipe, or dies (a watchdog thread polls
os.getppid()). On parent death a worker unlinks the shared-memory segments it
sent but the parent never acknowledged. The parent closes workers on
`close()`, garbage collection, interpreter exit and errors, unlinks every
segment it received, and finally sweeps segments carrying its prefix, which
only a killed worker can have left behind.
"""

from __future__ import annotations

import ast
import atexit
import collections
import contextlib
import errno
import functools
import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import reprlib
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from loader import batching
from loader import checks
from loader import ipc
from loader import engine
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import ondisk
from loader import options as options_lib
from loader import realign
from loader import source as source_lib

_PARENT_POLL_S = 0.5
# Grain's default for mp_prefetch() without options.
_DEFAULT_NUM_WORKERS = 10
_LOCAL = -1  # Chunk computed by the parent itself.
_DESC = 4  # Index of the payload descriptor in an "ok" message.
_STOP_GRACE_S = 1.0
_SEGMENT_RETRIES = 3  # Results whose segment was removed by another process, in a row, asked again before an error.


# close() was called (in another thread) while this iterator waited for a worker.
ClosedWhileWaitingError = engine.ClosedWhileWaitingError


_exiting = False


def _note_exit() -> None:
  global _exiting
  _exiting = True


@functools.cache
def _watch_exit() -> None:
  """Registers `_note_exit` after weakref.finalize's exit hook (which closes the pools): atexit runs it first."""
  atexit.register(_note_exit)


def _closed_while_waiting() -> ClosedWhileWaitingError:
  """The error for a wait that close() cut short; at interpreter exit, no error at all.

  Then only daemon threads still run (Python joined the others), and the exit
  closed their pools: a thread still iterating waits here until the
  interpreter stops it, as it would on a plain queue, rather than printing a
  traceback that blames a close() the user never called.
  """
  if _exiting and threading.current_thread() is not threading.main_thread():
    threading.Event().wait()
  return ClosedWhileWaitingError()


def _mapping_failed(e: OSError, desc: tuple, start: int, stop: int, ds: Any, w: int) -> OSError:
  """The one-line error for a result segment this process could not open or map (`e`): what, why, what to do."""
  if e.errno in (errno.EMFILE, errno.ENFILE):
    todo = f"{ondisk.open_file_limit_advice('before the workers start')} or close files the program keeps open"
  elif e.errno == errno.ENOMEM:
    todo = "free memory, or raise the memory limits (ulimit -v, vm.max_map_count)"
  else:
    todo = "fix the cause"
  text = (f"{ipc.SHM_DIR}/{ipc.segment_name(desc)} (positions {start}..{stop - 1} of {ds!r}, from worker {w}) "
          f"could not be mapped in this process: {e.strerror or e}; {todo}. Nothing was lost: next() asks for "
          "these positions again")
  return OSError(e.errno, text) if e.errno is not None else OSError(text)


class WorkerError(RuntimeError):
  """A worker process died, or raised an exception that cannot be pickled.

  An exception that pickles is raised again in the parent as itself, with a
  note holding the worker's traceback.
  """


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
  try:
    buffer = io.BytesIO()
    _pickler_class(cloudpickle)(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
  except Exception as e:  # pylint: disable=broad-except
    # Keeps its type (as Grain's own cloudpickling raises it); the note says where it came from.
    e.add_note("mp_prefetch sends the pipeline (its sources and functions, with what they refer to) to its "
               "worker processes with cloudpickle, and something in it cannot be pickled. Create such objects "
               "(locks, open files, clients) inside the function, e.g. on its first call, or use num_workers=0 "
               "(DataLoader: worker_count=0).")
    try:
      part = _unpicklable_part(obj, lambda x: _pickles(cloudpickle, x))
    except Exception:  # pylint: disable=broad-except  # RecursionError on a very deep pipeline; a repr failing.
      part = None
    if part is not None:
      e.add_note(f"What cannot be pickled: {part}.")
    raise


def _pickles(cloudpickle: Any, obj: Any) -> bool:
  try:
    _pickler_class(cloudpickle)(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def _unpicklable_part(obj: Any, pickles: Callable[[Any], bool], seen: set[int] | None = None) -> str | None:
  """Names the first part of a pipeline sent to workers that does not pickle on its own.

  Parents come before the stages on them (the source before its maps), so
  the part named is the one a user wrote (a sampler, a source, a function),
  not a dataset that merely holds it.
  """
  seen = set() if seen is None else seen
  if id(obj) in seen:
    return None
  seen.add(id(obj))
  datasets = (map_lib.MapDataset, iter_lib.IterDataset)
  if isinstance(obj, (list, tuple)):
    for x in obj:
      part = _unpicklable_part(x, pickles, seen)
      if part is not None:
        return part
    return None
  if not isinstance(obj, datasets):
    return None if pickles(obj) else f"{_short_repr(obj)}, given as the worker_init_fn"
  try:
    items = list(vars(obj).items())
  except TypeError:
    return None
  for _, value in items:  # Parents first.
    if _holds_datasets(value):
      part = _unpicklable_part(value, pickles, seen)
      if part is not None:
        return part
  for name, value in items:
    if _holds_datasets(value):
      continue
    if not pickles(value):
      name = name.strip("_")
      return f"the {_PART_NAMES.get(name, name)} {_short_repr(value)} of {type(obj).__name__}"
  return None


# Attribute names of loader's stages as a user knows what they hold.
_PART_NAMES = {"reader": "source", "fn": "function", "data_source": "data source"}


def _holds_datasets(value: Any) -> bool:
  datasets = (map_lib.MapDataset, iter_lib.IterDataset)
  if isinstance(value, (list, tuple)):
    return any(isinstance(v, datasets) for v in value)
  return isinstance(value, datasets)


_REPR = reprlib.Repr()
_REPR.maxother = _REPR.maxstring = 200


def _short_repr(obj: Any) -> str:
  try:
    text = _REPR.repr(obj)  # A 2M-item list source: its first items, not a 2M-item repr to cut.
  except Exception:  # pylint: disable=broad-except
    text = f"<{type(obj).__qualname__} object>"
  return text if len(text) <= 200 else text[:197] + "..."


@functools.cache
def _pickler_class(cloudpickle: Any) -> type:
  """cloudpickle's pickler, but code sent by value keeps its file name.

  cloudpickle names such code `<dynamic-code>`, so a worker's traceback of a
  map defined in the script would show neither the script nor the line's text.
  """
  dynamic = "<dynamic-code>"

  class _Pickler(cloudpickle.CloudPickler):

    def reducer_override(self, obj):
      if type(obj) is types.CodeType:  # pylint: disable=unidiomatic-typecheck
        reduced = self.dispatch_table[types.CodeType](obj)
        if (isinstance(reduced, tuple) and len(reduced) == 2 and isinstance(reduced[1], tuple)
            and reduced[1].count(dynamic) == 1):
          constructor, args = reduced
          return constructor, tuple(obj.co_filename if a == dynamic else a for a in args)
        return reduced
      return super().reducer_override(obj)

  return _Pickler


# Tasks a worker may have queued (see _WorkerPool.submit): far fewer than its
# pipe holds, more than the parts sharing it keep in flight.
_MAX_QUEUED_TASKS = 32

# A pipeline larger than this goes to starting workers in a shared segment (see _WorkerPool.start):
# well under a pipe's 64 KiB, with the rest of what spawn writes there.
_INLINE_PAYLOAD_BYTES = 16 << 10


def _describe(error: BaseException) -> tuple[str, bytes | None]:
  """Traceback text and, if picklable, the exception itself."""
  text = "".join(traceback.format_exception(error))
  try:
    whole = ipc.dumps(error)  # An exception class the script defines goes by name (see ipc.dumps).
  except Exception:  # pylint: disable=broad-except
    whole = None
  # Its class, args and attributes apart: an exception whose __init__ takes
  # other arguments than its args (`def __init__(self, path, index)` calling
  # super().__init__(message), as botocore's ClientError, or an OSError
  # subclass built from a path) pickles, but unpickling calls cls(*args) and
  # fails; one holding a lock or a file does not pickle. Either was a
  # WorkerError, which `except ThatError` missed.
  try:
    attributes = {k: v for k, v in getattr(error, "__dict__", {}).items() if _dumps_alone(v)}
    args = error.args if _dumps_alone(error.args) else (str(error),)
    parts = ipc.dumps((type(error), args, attributes, _fields(error)))
    # Only a rebuild that reads as the original is sent.
    if not _same_error(_revive_exception(None, parts), error):
      return text, whole
  except Exception:  # pylint: disable=broad-except
    return text, whole
  return text, ipc.dumps(_Revivable(whole, parts))


# Set by a C __init__, outside args and __dict__ (OSError's, UnicodeError's).
_C_FIELDS = ("errno", "strerror", "filename", "filename2", "encoding", "object", "start", "end", "reason")


def _fields(error: BaseException) -> dict[str, Any]:
  """The exception's C-level fields and __slots__ values that pickle."""
  names = set(_C_FIELDS)
  for klass in type(error).__mro__:
    slots = klass.__dict__.get("__slots__", ())
    names.update((slots,) if isinstance(slots, str) else slots)
  out = {}
  for name in names - {"__dict__", "__weakref__"}:
    try:
      value = getattr(error, name)
    except AttributeError:
      continue
    # None is left unset: OSError's str() counts a filename2 set to None as given.
    if value is not None and _dumps_alone(value):
      out[name] = value
  return out


def _same_error(revived: BaseException, error: BaseException) -> bool:
  return (type(revived) is type(error) and str(revived) == str(error)
          and all(getattr(revived, f, None) == getattr(error, f, None) for f in _C_FIELDS))


def _dumps_alone(value: Any) -> bool:
  try:
    ipc.dumps(value)
    return True
  except Exception:  # pylint: disable=broad-except
    return False


class _Revivable:
  """A worker's exception that unpickles as itself, else as its class with its args and attributes set."""

  def __init__(self, whole: bytes | None, parts: bytes):
    self.whole, self.parts = whole, parts

  def __reduce__(self):
    return _revive_exception, (self.whole, self.parts)


def _revive_exception(whole: bytes | None, parts: bytes) -> BaseException:
  if whole is not None:
    try:
      return pickle.loads(whole)
    except Exception:  # pylint: disable=broad-except
      pass
  cls, args, attributes, fields = pickle.loads(parts)
  error = cls.__new__(cls)  # Without cls.__init__, which may want other arguments.
  error.args = args
  if attributes:
    error.__dict__.update(attributes)
  for name, value in fields.items():
    try:
      setattr(error, name, value)
    except (AttributeError, TypeError):
      pass  # A read-only field: _same_error decides whether the rebuild is sent.
  return error


def _revived(exc_bytes: bytes | None, where: str) -> BaseException:
  """A worker's exception as itself (as Grain raises it), noted with `where`; else a WorkerError."""
  if exc_bytes is not None:
    try:
      error = pickle.loads(exc_bytes)
    except Exception:  # pylint: disable=broad-except
      error = None
    if isinstance(error, (SystemExit, KeyboardInterrupt)):
      # Raised here as itself, a worker's sys.exit() would end the consumer's
      # program quietly (an uncaught SystemExit prints nothing), and its
      # KeyboardInterrupt would read as a Ctrl-C the user never pressed.
      what = (f"called sys.exit({error.code!r})" if isinstance(error, SystemExit)
              else "raised KeyboardInterrupt")
      head = where.split("\n", 1)[0].rstrip(":")
      return WorkerError(f"{head}: it {what}, which ends a worker; raise an exception instead (this process "
                         "gets that one as itself)")
    if isinstance(error, BaseException):
      error.add_note(where)
      return error
  return WorkerError(where)


def _worker_main(worker_index: int, num_workers: int, conn, payload: bytes | tuple, shm_prefix: str,
                 parent_pid: int) -> None:
  """Worker loop: compute requested chunks until told to stop."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Already, since its start (see _sigint_ignored_in_children).
  # Sources read in this thread (and, for costly elements, in the part's
  # "loader-map_N" threads; with ReadOptions(num_threads=1) only here). Named
  # like the parent's compute thread (and Grain's reading threads,
  # "grain-prefetch_0"), since some sources pick their stream by the number
  # after the underscore (MaxText's HFDataSource).
  threading.current_thread().name = "loader-worker_0"
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
    # A large pipeline comes in a shared segment (see _WorkerPool.start).
    leaves, worker_init_fn = pickle.loads(_start_payload(payload, worker_index))
    # Costly elements are spread over the part's ReadOptions threads, using at
    # most this worker's share of the cores unless they wait (I/O).
    cores = max(1, engine.available_cores() // num_workers)
    computers = [engine.ChunkComputer(ds, threads, cores_share=cores) for ds, threads in leaves]
    if worker_init_fn is not None:
      worker_init_fn(worker_index, num_workers)
  except BaseException as e:  # pylint: disable=broad-except
    try:
      conn.send(("fatal", *_describe(e)))
    except OSError:
      orphaned()  # The parent is gone (and its segments with it): nobody to tell.
    return
  # Started: a death from here on is one of computing, not of starting (see _WorkerPool.raise_dead).
  try:
    conn.send(("ready",))
  except OSError:
    orphaned()  # The parent died while this worker started.
    return
  seq = 0
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      orphaned()
    if msg[0] == "stop":
      break
    if msg[0] == "add":  # A MapDataset part whose iterator was made after start.
      ds, threads = pickle.loads(msg[1])
      computers.append(engine.ChunkComputer(ds, threads, cores_share=cores))
      continue
    _, leaf, gen, chunk_id, start, stop, released, origin = msg
    with lock:
      outstanding.difference_update(released)
    seq += 1
    name = f"{shm_prefix}{worker_index}_{seq}"
    computers[leaf].realign(origin)
    elements, error, seconds = computers[leaf].compute(start, stop)
    try:
      desc = _encode_tracked(elements, name, lock, outstanding)
    except Exception as e:  # pylint: disable=broad-except
      desc, error = _encode_before_failure(elements, name, e, lock, outstanding,
                                           start if len(elements) == stop - start else None)
    del elements
    failure = None if error is None else _describe(error)
    try:
      conn.send(("ok", leaf, gen, chunk_id, desc, failure, seconds))
    except (BrokenPipeError, OSError):
      orphaned()
  conn.close()


def _start_payload(payload: bytes | tuple, worker_index: int) -> bytes | bytearray:
  """The pickled pipeline a starting worker was given, or read from its shared segment."""
  if not isinstance(payload, tuple):
    return payload
  try:
    return ipc.read_shared(payload, worker_index)
  except FileNotFoundError:
    # As a result segment (see MultiprocessChunkProducer.next_chunk); the
    # parent's next call starts new workers, with a new segment.
    raise FileNotFoundError(
        errno.ENOENT,
        f"{ipc.SHM_DIR}/{ipc.segment_name(payload)} (the pipeline sent to the starting workers) was removed by "
        f"another process before worker {worker_index} read it: something empties {ipc.SHM_DIR} under the "
        "running job (systemd-logind's RemoveIPC=yes at logout: set RemoveIPC=no in /etc/systemd/logind.conf "
        "or run the job as a system user; or a cleanup job). Nothing was lost: next() starts the workers "
        "again") from None


def _disown_workers() -> None:
  """In a child forked with os.fork: forgets the parent's workers.

  multiprocessing's exit hook terminates (SIGTERM) every daemon process it
  lists as a child, and a fork inherits the list: the child's ordinary exit
  (sys.exit, the end of its code) would kill the parent's workers and end the
  parent's iterator with a WorkerError. (multiprocessing's own forks clear
  the list; os.fork does not.)
  """
  children = multiprocessing.process._children  # pylint: disable=protected-access
  for proc in list(_WORKERS):
    children.discard(proc)


_WORKERS: weakref.WeakSet = weakref.WeakSet()  # Every pool's worker processes (see _disown_workers).


if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_disown_workers)


def _shm_chunk_bytes(num_workers: int, in_flight: int) -> int:
  """Chunk bytes that let every worker's chunks in flight, and as many held by the consumer, fit in /dev/shm.

  A small /dev/shm (Docker's default is 64 MB) would otherwise fill up with
  ~64 MiB chunks, and workers would fall back to their slower pipes.
  """
  try:
    st = os.statvfs(ipc.SHM_DIR)
  except OSError:
    return engine.MAX_CHUNK_BYTES
  free = st.f_bavail * st.f_frsize
  return max(1 << 20, free // (2 * max(1, num_workers) * max(1, in_flight)))


def _encode_tracked(elements: list, name: str, lock: threading.Lock, outstanding: set) -> tuple:
  """ipc.encode, noting a segment it made as outstanding until the consumer releases it."""
  with lock:
    desc = ipc.encode(elements, name)
    if ipc.segment_name(desc) is not None:
      outstanding.add(name)
  return desc


def _encode_before_failure(elements: list, name: str, error: Exception, lock: threading.Lock,
                           outstanding: set, start: int | None = None) -> tuple[tuple, BaseException]:
  """A chunk that did not encode: (its elements before the first that cannot be pickled, that one's error).

  As with a map that raises, the elements before it arrive and the error is
  raised at its own position. If every element pickles alone (the failure
  was not an element's), the error is reported at the chunk's start.
  `start` is the first element's position, where the elements are one per position.
  """
  for at, x in enumerate(elements):
    try:
      ipc.dumps(x, [])
    except Exception as e:  # pylint: disable=broad-except
      try:
        return _encode_tracked(elements[:at], name, lock, outstanding), _unpicklable(x, e, start, at)
      except Exception:  # pylint: disable=broad-except
        break
  return ipc.encode([], name), error


def _unpicklable(element: Any, error: Exception, start: int | None, at: int) -> Exception:
  """`error` (pickle's, of `element`) as one line that says where it failed and what to do; its type kept."""
  which = f"element {start + at}" if start is not None else "an element"
  message = (f"{which} (a {type(element).__name__}) was computed but cannot be pickled to go back from the "
             f"worker process ({error}): return picklable values (numpy arrays, numbers, strings, dicts, lists) "
             "from the transforms before mp_prefetch, or apply this one after mp_prefetch")
  try:
    return type(error)(message)
  except Exception:  # pylint: disable=broad-except
    return error  # An exception type that takes other arguments keeps pickle's own words.


def _shutdown(procs: list, conns: list, shm_prefix: str, stashes: list | None = None,
              owner: int | None = None) -> None:
  """Stops workers and frees every segment; safe to call more than once.

  Only in the `owner` process: a process forked from it (which inherited this
  pool) must not stop the owner's workers or free its segments.

  A Ctrl-C meanwhile ends the workers at once and is raised again. Inside a
  finalizer (an iterator dropped: `del it`, a new epoch's `iter(ds)`), where
  Python would print and ignore it, it is raised in the main thread just after.
  """
  if owner is not None and owner != os.getpid():
    return
  try:
    _stop(procs, conns, shm_prefix, stashes)
  except KeyboardInterrupt:
    for proc in procs:
      try:
        proc.kill()
      except (OSError, ValueError, AttributeError):
        pass
    _stop(procs, conns, shm_prefix, stashes)
    if not _in_finalizer():
      raise
    # A real SIGINT to the main thread: it also wakes a blocking call there.
    again = threading.Timer(_INTERRUPT_AGAIN_S, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGINT))
    again.daemon = True
    again.start()


def _in_finalizer() -> bool:
  """Whether a weakref.finalize callback is running on this thread's stack."""
  code = weakref.finalize.__call__.__code__
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    if frame.f_code is code:
      return True
    frame = frame.f_back
  return False


# How long after a finalizer cut short by Ctrl-C the interrupt is raised again
# (by then the finalizer has returned: raised inside it, it would be ignored).
_INTERRUPT_AGAIN_S = 0.05


def _stop(procs: list, conns: list, shm_prefix: str, stashes: list | None = None) -> None:
  for stash in stashes or ():
    for msg in stash:
      ipc.release(msg[_DESC])
    stash.clear()
  for conn in conns:
    try:
      conn.send(("stop",))
    except (OSError, ValueError):
      pass
  deadline = time.monotonic() + _STOP_GRACE_S
  for proc, conn in zip(procs, conns):
    # Keep reading while waiting: a worker blocked on a full pipe cannot exit.
    # A pipe out of step (a read an interrupt cut short) is only waited on;
    # the segments of what it held go with the sweep below.
    in_step = True
    while True:
      try:
        if in_step and conn.poll(0.02):
          msg = conn.recv()
          if msg[0] == "ok":
            ipc.release(msg[_DESC])
          continue
        if not in_step:
          proc.join(0.02)
      except (EOFError, OSError, ValueError):
        pass
      except Exception:  # pylint: disable=broad-except  # E.g. UnpicklingError: mid-message.
        in_step = False
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
      while in_step and conn.poll(0):
        msg = conn.recv()
        if msg[0] == "ok":
          ipc.release(msg[_DESC])
    except Exception:  # pylint: disable=broad-except  # Closed, or out of step: the sweep frees the rest.
      pass
    conn.close()
  procs.clear()
  conns.clear()
  ipc.sweep(shm_prefix)
  multiprocessing.active_children()  # Reaps workers a start cut short never listed (no zombies).


def _has_main_guard(path: str) -> bool:
  """Whether the script at `path` has a top-level `if __name__ == "__main__":` block."""
  try:
    with open(path, "rb") as f:
      tree = ast.parse(f.read(), filename=path)
  except (OSError, SyntaxError, ValueError):
    return False
  for node in tree.body:
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
      names = [node.test.left, *node.test.comparators]
      if (any(isinstance(n, ast.Name) and n.id == "__name__" for n in names)
          and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names)):
        return True
  return False


def workers_run_main(main: Any, wanted: bool = True) -> bool:
  """Whether spawned workers run the script's top level first, as Grain's do.

  'spawn' runs the parent's `__main__` again (as `__mp_main__`) in every
  worker, so top-level setup (a registry filled at import, a
  `jax.config.update`) holds in the workers too: Grain's workers, and so
  ours, rely on it. A script without an `if __name__ == "__main__":` guard
  would start workers again from each worker, so its top level is not run;
  the pipeline travels with cloudpickle, which carries functions and classes
  defined in `__main__` by value, so the workers do not need the script.
  `MultiprocessingOptions(workers_run_main=False)` (`wanted`) skips it too.
  """
  path = getattr(main, "__file__", None)
  return wanted and isinstance(path, str) and _has_main_guard(path)


@contextlib.contextmanager
def _spawn_context(run_main: bool = True):
  """Starts spawned workers as `workers_run_main` says, with SIGINT blocked."""
  main = sys.modules.get("__main__")
  hide = not workers_run_main(main, run_main)
  if hide:
    sys.modules["__main__"] = types.ModuleType("__main__")
  # Children inherit a blocked SIGINT, so a Ctrl-C while they start cannot
  # kill them before they ignore it; the parent gets it when unblocked.
  blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if hide:
      if main is None:
        del sys.modules["__main__"]
      else:
        sys.modules["__main__"] = main


@contextlib.contextmanager
def _sigint_ignored_in_children() -> Iterator[None]:
  """Workers start with SIGINT ignored (an ignored signal stays ignored across exec).

  A terminal's Ctrl-C goes to the whole process group: a worker still
  starting (re-running the script's imports) would print a KeyboardInterrupt
  traceback of its own. The parent handles Ctrl-C and stops its workers. It
  keeps SIGINT blocked meanwhile, so a Ctrl-C then stays pending (Linux keeps
  a blocked signal even while it is ignored) and is raised here, as usual,
  once its handler is back. Only the main thread can change handlers.
  """
  if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
  try:
    handler = signal.getsignal(signal.SIGINT)
    if handler is None:  # Installed outside Python: it could not be put back.
      yield
      return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
      yield
    finally:
      signal.signal(signal.SIGINT, handler)
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _WorkerPool:
  """Worker processes shared by every MapDataset part under one `mp_prefetch`.

  Parts register before the pool starts (they travel in the start payload)
  or after (sent with an "add" message). Results of one worker arrive in the
  order it got the tasks; a result for another part than the one waiting is
  kept until that part asks for it.
  """

  def __init__(self, options: options_lib.MultiprocessingOptions, worker_init_fn: Callable[[int, int], None] | None,
               parent_reads_first_chunk: bool = True):
    self.num_workers = options.num_workers
    self.options = options
    self.worker_init_fn = worker_init_fn
    # Whether parts compute their first chunk in the parent (see
    # MultiprocessPrefetchIterDataset); never before a worker_init_fn ran.
    self.parent_reads_first_chunk = parent_reads_first_chunk and worker_init_fn is None
    self.leaves: list[map_lib.MapDataset] = []
    self._threads: list[int] = []  # Per part: its ReadOptions.num_threads.
    self.procs: list[Any] = []
    # Per worker: whether it said it started (ran the script's top level, unpickled the
    # pipeline, ran worker_init_fn); a worker that dies before did not die computing.
    self._ready: list[bool] = []
    self._starts = 0
    self._payload_segment: str | None = None  # The pipeline the workers read at start (see start).
    self.pid = os.getpid()  # The process whose pipes these are (see engine.check_same_process).
    self.conns: list[Any] = []
    ipc.sweep_dead()
    self.prefix = ipc.segment_prefix()
    self.restarts = 0  # Bumped when workers are replaced; parts then resend their work.
    self._stash: list[list[tuple]] = [[] for _ in range(self.num_workers)]
    self.load = [0] * self.num_workers  # Elements outstanding per worker.
    # Per worker, the tasks sent and not yet answered, oldest (the one it computes) first.
    self._tasks: list[collections.deque] = [collections.deque() for _ in range(self.num_workers)]
    self._released: list[list[str]] = [[] for _ in range(self.num_workers)]
    self.error: BaseException | None = None
    self._stopping = False  # Workers that must be stopped before any start (see restart).
    # An interrupt (Ctrl-C) that came while waiting for a result, when no
    # message was cut short: the workers can go on (see next_chunk).
    self.interrupted_waiting = False
    self._attached = 0
    # Held while a consumer reads results (once per chunk, see next_chunk): two
    # threads calling next() on one iterator (or on parts sharing this pool)
    # would otherwise read one pipe at once and tear its messages apart.
    self.consume_lock = threading.RLock()
    self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self.prefix, self._stash, self.pid)
    _watch_exit()

  def __reduce__(self):
    # As Grain's, such an iterator does not pickle (TypeError). A copy made
    # before the workers started (copy.deepcopy, pickle) held a dead
    # finalizer and said "close() was called while it waited for a worker"
    # at its first element; after, pickle named an AuthenticationString.
    raise TypeError(
        f"An iterator of {self.leaves[0] if self.leaves else 'a dataset'!r} with worker processes cannot be "
        "pickled or copied; save its get_state() and set_state() it into a new iterator.")

  def register(self, ds: map_lib.MapDataset, num_threads: int) -> int:
    """Adds a part; the pool stops when every registered part has detached."""
    self.leaves.append(ds)
    self._threads.append(num_threads)
    self._attached += 1
    leaf = len(self.leaves) - 1
    if self.procs:
      payload = _dumps((ds, num_threads))
      for w in range(self.num_workers):
        self._send(w, ("add", payload))
    return leaf

  def start(self) -> None:
    if self._stopping:  # A restart (or a start) that an interrupt cut short: finish it first.
      _shutdown(self.procs, self.conns, self.prefix, self._stash)
      self._stopping = False
    if self.procs:
      return
    if not self._finalizer.alive:
      raise ValueError("This iterator was closed; create a new one with iter(dataset).")
    try:
      os.getcwd()  # Spawned workers start in it: multiprocessing's bare "[Errno 2] No such file or directory".
    except FileNotFoundError:
      raise FileNotFoundError(
          errno.ENOENT, f"Cannot start the {self.num_workers} worker processes of "
          f"{self.leaves[0] if self.leaves else 'a dataset'!r}: this process's working directory was deleted "
          "(a cleaned-up temp or job folder), and spawned workers start in it. os.chdir() to a folder that "
          "exists (e.g. os.chdir(os.path.expanduser('~'))), then call next() again: nothing was lost.") from None
    # Until every worker runs, the set is not usable: an interrupt meanwhile leaves it to be stopped.
    self._stopping = True
    payload = _dumps((list(zip(self.leaves, self._threads)), self.worker_init_fn))
    self._payload_segment = None
    if len(payload) > _INLINE_PAYLOAD_BYTES:
      # Not in the start arguments: spawn writes them to a pipe the worker reads only after
      # running the script's top level, so past the pipe's 64 KiB the start of a large pipeline
      # (an in-memory source, a vocabulary) waited for each worker's imports in turn, and
      # start_prefetch() with it. Unlinked once every worker has read it (or with the rest).
      self._starts += 1
      shared = ipc.share_bytes(f"{self.prefix}start{self._starts}", payload, self.num_workers)
      if shared is not None:
        payload, self._payload_segment = shared, ipc.segment_name(shared)
    ctx = multiprocessing.get_context("spawn")
    self._ready = [False] * self.num_workers
    with _spawn_context(self.options.workers_run_main), _sigint_ignored_in_children():
      for w in range(self.num_workers):
        conns = []
        try:
          parent_conn, child_conn = conns = ctx.Pipe(duplex=True)
          proc = ctx.Process(
              target=_worker_main,
              args=(w, self.num_workers, child_conn, payload, self.prefix, os.getpid()),
              name=f"loader-worker-{w}", daemon=True)
          proc.start()
        except OSError as e:
          for conn in conns:
            conn.close()
          if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
          # Was a bare "[Errno 24] Too many open files" out of multiprocessing.
          # The workers started so far are stopped by the caller (see next_chunk).
          raise source_lib.TooManyOpenFilesError(
              e.errno,
              f"Cannot start worker {w} of {self.num_workers} for {self.leaves[0] if self.leaves else 'a dataset'!r}"
              f": {os.strerror(e.errno)} (each worker takes a few files, and an ArrayRecordSource one per shard "
              f"in each process): {ondisk.open_file_limit_advice('at the top of the script')}, or use "
              "fewer workers (MultiprocessingOptions(num_workers=...)).") from None
        _WORKERS.add(proc)
        child_conn.close()
        self.procs.append(proc)
        self.conns.append(parent_conn)
    self._stopping = False

  def restart(self) -> None:
    """Stops the workers (after an interrupt mid-message); the next start() makes new ones.

    The bookkeeping comes first: a second interrupt during the (slow) stop
    must not leave parts reading results of the old workers. The next start()
    then finishes the stop.
    """
    self.restarts += 1
    self._stopping = True
    self._released = [[] for _ in range(self.num_workers)]
    self.load = [0] * self.num_workers
    self._tasks = [collections.deque() for _ in range(self.num_workers)]
    _shutdown(self.procs, self.conns, self.prefix, self._stash)  # Empties the stashes in place.
    self._stopping = False

  def submit(self, leaf: int, gen: int, c: int, start: int, stop: int, origin: int = 0,
             wait: bool = True) -> int | None:
    """Sends a task to the least loaded worker; returns that worker.

    A worker has at most _MAX_QUEUED_TASKS tasks queued: tasks of older
    generations (restores, realigns after failures) may still be there, and a
    worker blocked sending their results stops reading, so a send to its full
    pipe would wait for ever. With every worker's queue full, this reads the
    chosen worker's results first (`wait`; kept for their parts, stale ones
    dropped there) or sends nothing and returns None.

    `origin`: where the part's batches start (a RealignedMapDataset's; see loader.realign).
    """
    free = [w for w in range(self.num_workers) if len(self._tasks[w]) < _MAX_QUEUED_TASKS]
    if not free and not wait:
      return None
    w = min(free or range(self.num_workers), key=self.load.__getitem__)
    while len(self._tasks[w]) >= _MAX_QUEUED_TASKS:
      self._stash[w].append(self._read(w))
    released, self._released[w] = self._released[w], []
    # Recorded before sending: a worker found dead by this send never returns these positions either.
    self._tasks[w].append((leaf, gen, c, start, stop))
    self._send(w, ("task", leaf, gen, c, start, stop, released, origin))
    self.load[w] += stop - start
    return w

  def _send(self, w: int, msg: tuple) -> None:
    try:
      self.conns[w].send(msg)
    except (OSError, ValueError):
      self.raise_dead(w)

  def raise_dead(self, w: int) -> None:
    if self.closed:  # close() in another thread stopped the workers under this wait.
      raise _closed_while_waiting()
    proc = self.procs[w]
    # Its pipe closes before the OS reaps it: under load that takes more than a moment.
    proc.join(2.0)
    code = f"exit code {proc.exitcode}" if proc.exitcode is not None else "no exit code yet (still exiting)"
    if self._tasks[w]:  # What the user's code was given: where to look (a map that crashes there?).
      leaf, _, _, start, stop = self._tasks[w][0]
      what = f"before returning positions {start}..{stop - 1} of {self.leaves[leaf]!r}"
    else:
      what = f"while computing {self.leaves[0]!r}"
    if not self._started(w):  # Not the map, then: say where else to look.
      raise WorkerError(
          f"Worker {w} (pid {proc.pid}) exited unexpectedly with {code} "
          f"{what if self._tasks[w] else ''}{', ' if self._tasks[w] else ''}while starting, before it computed "
          "anything: in the script's top level, which workers run first when it has an `if __name__ == "
          "\"__main__\":` guard (skip it with MultiprocessingOptions(workers_run_main=False)), or in "
          "worker_init_fn; a traceback it printed, if any, is above on stderr. A negative code is the signal "
          "that killed it (-9: SIGKILL, often the out-of-memory killer). This iterator cannot go on; fix what "
          "stopped the worker, then restore its get_state() into a new iterator.")
    raise WorkerError(
        f"Worker {w} (pid {proc.pid}) exited unexpectedly with {code} {what}. A positive code is what the "
        "code it ran passed to sys.exit() or os._exit() (1 also follows a traceback above on stderr): raise an "
        "exception there instead; a negative code is the signal that killed it (-9: SIGKILL, often the "
        "out-of-memory killer). This iterator cannot go on; "
        "to resume after the last element it gave, restore its get_state() into a new iterator.")

  def _started(self, w: int) -> bool:
    """Whether worker `w` (now dead) had started; its first message, if still unread, says."""
    if w >= len(self._ready) or self._ready[w]:
      return True
    try:
      first = self.conns[w].recv() if self.conns[w].poll(0) else None
    except Exception:  # pylint: disable=broad-except  # Cut short: it died sending it.
      return False
    if first is not None and first[0] == "fatal":
      raise _revived(first[2], f"Worker {w} (pid {self.procs[w].pid}) failed to start:\n{first[1]}")
    self._ready[w] = first is not None and first[0] == "ready"
    return self._ready[w]

  def receive(self, w: int, leaf: int, gen: int) -> tuple:
    """The next current-generation result of `leaf` from worker `w`."""
    stash = self._stash[w]
    k = 0
    while k < len(stash):
      msg = stash[k]
      if msg[1] != leaf:
        k += 1
        continue
      del stash[k]
      if msg[2] == gen:
        return msg
      self.release(w, msg[_DESC])  # An older generation of this part: dropped.
    while True:
      msg = self._read(w)
      if msg[1] != leaf:
        stash.append(msg)
        continue
      if msg[2] != gen:
        self.release(w, msg[_DESC])
        continue
      return msg

  def _read(self, w: int) -> tuple:
    """The next result message of worker `w` (waiting for it)."""
    conn, proc = self.conns[w], self.procs[w]
    while True:
      try:
        ready = multiprocessing.connection.wait([conn, proc.sentinel])
      except BaseException:
        self.interrupted_waiting = True  # Nothing read: the pipes are still in step.
        raise
      if conn not in ready:
        if conn.poll(0):
          continue
        self.raise_dead(w)
      try:
        msg = conn.recv()
      except (EOFError, OSError):
        self.raise_dead(w)
      if msg[0] == "fatal":
        raise _revived(msg[2], f"Worker {w} (pid {proc.pid}) failed to start:\n{msg[1]}")
      if msg[0] == "ready":
        self._note_ready(w)
        continue
      self._answered(w, msg)
      return msg

  def _note_ready(self, w: int) -> None:
    """Worker `w` started; once all have, the pipeline's start segment goes."""
    self._ready[w] = True
    if self._payload_segment is not None and all(self._ready):
      ipc.unlink(self._payload_segment)
      self._payload_segment = None

  def _answered(self, w: int, msg: tuple) -> None:
    """Forgets the task `msg` answers (a worker answers its tasks in order)."""
    tasks, key = self._tasks[w], (msg[1], msg[2], msg[3])
    for k, task in enumerate(tasks):
      if task[:3] == key:
        del tasks[k]
        return

  def release(self, w: int, desc: tuple) -> None:
    ipc.release(desc)
    self.acknowledge(w, desc)

  def acknowledge(self, w: int, desc: tuple) -> None:
    name = ipc.segment_name(desc)
    if name is not None:
      self._released[w].append(name)

  def detach(self) -> None:
    """A part is done (e.g. an exhausted input of an interleave); the last one stops the pool."""
    self._attached -= 1
    if self._attached <= 0:
      self.close()

  @property
  def closed(self) -> bool:
    return not self._finalizer.alive

  def close(self) -> None:
    # Called directly, not as the finalizer: a Ctrl-C while the workers stop
    # is raised here (unless this close runs within another finalizer).
    detached = self._finalizer.detach()
    if detached is not None:
      _, fn, args, kwargs = detached
      fn(*args, **(kwargs or {}))


def _runs_only_loader_code(ds: map_lib.MapDataset) -> bool:
  """Whether computing `ds` calls no user code: reads of loader's ArrayRecord
  sources (or a range or a list) through shuffles, repeats, slices and
  default batches. Only such a part may compute a chunk in the parent: a
  user's map or source may crash or hang a process, and must do it in a
  worker, as in Grain."""
  if isinstance(ds, map_lib.SourceMapDataset):
    # pylint: disable-next=protected-access
    return type(ds._source) in (range, list, tuple) or ds._reader._objects  # An ArrayRecordSource's own reads.
  if isinstance(ds, realign.RealignedMapDataset):
    return _runs_only_loader_code(ds._parent)  # pylint: disable=protected-access
  if isinstance(ds, map_lib.BatchMapDataset):
    safe = ds._batch_fn is batching.make_batch  # pylint: disable=protected-access
  else:
    # Shuffles, repeats, slices, seeds: loader's own index arithmetic.
    safe = isinstance(ds, map_lib._IndexMapDataset) and type(ds).__module__ == map_lib.__name__  # pylint: disable=protected-access
  return safe and all(_runs_only_loader_code(p) for p in ds._parents)  # pylint: disable=protected-access


class MultiprocessChunkProducer:
  """Hands out chunks of one MapDataset part computed by the pool, in order.

  Each chunk goes to the worker with the least work outstanding; the consumer
  takes chunks in position order, so assignment never changes the stream.
  While the workers start, the parent computes the part's first (small)
  chunk itself, unless a `worker_init_fn` must run before any element or the
  DataLoader asks for reads in its workers only, as Grain's does.
  """

  def __init__(self, ds: map_lib.MapDataset, pool: _WorkerPool, num_threads: int = 0):
    self._ds = ds
    self._len = len(ds)
    self._pool = pool
    self._leaf = pool.register(ds, num_threads)
    # One computing, the rest buffered (options changed after mp_prefetch checked them: at least that one).
    self._in_flight = max(0, pool.options.per_worker_buffer_size) + 1
    self._sizer = engine.ChunkSizer(ds, pool.options.chunk_size, parallelism=pool.num_workers,
                                    max_chunk_bytes=_shm_chunk_bytes(pool.num_workers, self._in_flight))
    self._gen = 0
    self._restarts = pool.restarts
    # chunk id -> (start, stop, worker index or _LOCAL)
    self._chunks: dict[int, tuple[int, int, int]] = {}
    self._next_start = 0
    self._next_request = 0
    self._next_consume = 0
    self._local_first = pool.parent_reads_first_chunk and _runs_only_loader_code(ds)
    self._detached = False
    self._one_by_one_until = 0  # Positions before it go one per chunk (after a chunk that did not unpickle).
    self._segments_lost = 0  # Results in a row whose segment another process removed (see next_chunk).

  def check_not_forked(self) -> None:
    """Raises engine.ForkedIteratorError in a process forked from the one whose workers these are."""
    engine.check_same_process(self._pool.pid)

  @property
  def consume_lock(self) -> threading.RLock:
    """Held by the consuming iterator while it takes a new chunk (see engine.MapDatasetIterator.__next__)."""
    # First: in a fork, a thread of the parent may have held it at the fork, and would never let go.
    self.check_not_forked()
    return self._pool.consume_lock

  def start(self) -> None:
    """Starts the workers and sends them this part's first chunks."""
    self._pool.start()
    if self._restarts != self._pool.restarts:  # Workers were replaced: resend from here.
      self._restarts = self._pool.restarts
      self.reset(self._chunks[self._next_consume][0] if self._next_consume in self._chunks else self._next_start)
    if self._local_first and self._next_request == 0 and self._next_start < self._len:
      self._local_first = False
      self._add_chunk(_LOCAL)
    if self._chunks.get(self._next_consume, (0, 0, 0))[2] != _LOCAL:
      self._top_up(may_wait=True)  # After a local first chunk, its measured cost sizes these.

  @property
  def worker_pids(self) -> list[int]:
    return [p.pid for p in self._pool.procs]

  def reset(self, start: int) -> None:
    # Results of older requests are recognised by generation and dropped.
    self._gen += 1
    for _, (a, b, w) in self._chunks.items():
      if w != _LOCAL:
        self._pool.load[w] = max(0, self._pool.load[w] - (b - a))
    self._chunks.clear()
    self._next_start = start
    self._next_request = self._next_consume = 0

  def realign(self, origin: int) -> None:
    """Computes `ds.at(origin)` from now on, here and in the workers (after a reset; see loader.realign)."""
    self._ds = self._ds.at(origin)
    self._len = len(self._ds)
    self._sizer.resize(self._len)

  def _add_chunk(self, w: int) -> int:
    c, start = self._next_request, self._next_start
    stop = min(start + (1 if start < self._one_by_one_until else self._sizer.size(start)), self._len)
    self._chunks[c] = (start, stop, w)
    self._next_start = stop
    self._next_request += 1
    return c

  def _top_up(self, may_wait: bool = False) -> None:
    """Sends the next chunks' tasks.

    Only the chunk the consumer needs next may wait for a worker's full queue
    (see _WorkerPool.submit), and only where `may_wait`: inside next_chunk's
    guarded part, before a chunk is taken (a Ctrl-C there loses nothing).
    """
    limit = self._next_consume + self._pool.num_workers * self._in_flight
    while self._next_request < limit and self._next_start < self._len:
      wait = may_wait and self._next_request == self._next_consume
      c = self._add_chunk(_LOCAL)
      start, stop, _ = self._chunks[c]
      w = None
      try:
        w = self._pool.submit(self._leaf, self._gen, c, start, stop, realign.origin_of(self._ds), wait=wait)
      finally:
        if w is None:  # Not sent (every queue full, or a Ctrl-C while submit read results): asked again later.
          del self._chunks[c]
          self._next_start, self._next_request = start, c
      if w is None:
        return
      self._chunks[c] = (start, stop, w)

  def next_chunk(self) -> engine.Chunk | None:
    self.check_not_forked()
    with self._pool.consume_lock:  # One chunk at a time: next() from two threads waits here (see _WorkerPool).
      return self._next_chunk()

  def _next_chunk(self) -> engine.Chunk | None:
    if self._pool.error is not None:
      raise self._pool.error
    c = self._next_consume
    self._pool.interrupted_waiting = False
    try:
      self.start()
      if c not in self._chunks:
        if self._pool.closed:
          raise _closed_while_waiting()  # Cleared by close() in another thread: not the end of the data.
        return None
      start, stop, w = self._chunks[c]
      if w == _LOCAL:
        return self._compute_locally(c, start, stop)
      msg = self._pool.receive(w, self._leaf, self._gen)
    except WorkerError as e:
      self._pool.error = e  # A dead worker: this iterator cannot continue.
      self._pool.close()
      raise
    except BaseException as e:
      if self._pool.closed:  # close() in another thread: the workers are gone for good, nothing to restart.
        if isinstance(e, ClosedWhileWaitingError):
          raise
        raise _closed_while_waiting() from None  # E.g. a pipe closed under the wait.
      if self._pool.interrupted_waiting:
        raise  # Ctrl-C while waiting: the next call waits for the same chunk.
      # E.g. KeyboardInterrupt while a message was read or sent: it may be
      # cut short, so stop these workers; the next call starts fresh ones at
      # chunk c. The position is kept first: a second interrupt may cut the
      # restart short.
      start = self._chunks[c][0] if c in self._chunks else self._next_start
      self.reset(start)
      self._pool.restart()
      self._restarts = self._pool.restarts
      raise
    if self._pool.closed or c not in self._chunks:  # close() in another thread meanwhile.
      try:
        ipc.release(msg[_DESC])  # Or the closing pool's sweep removes it.
      except OSError:
        pass
      raise _closed_while_waiting()
    del self._chunks[c]
    self._pool.load[w] = max(0, self._pool.load[w] - (stop - start))
    _, _, _, _, desc, failure, seconds = msg
    try:
      elements = ipc.decode(desc)
    except Exception as e:  # pylint: disable=broad-except
      # An element that does not unpickle here (a class or module only the
      # worker imported). Asked again, the chunk would fail again forever:
      # its elements come one by one instead, so the good ones arrive and the
      # bad one fails alone at its own position, consumed like a map's error.
      self._pool.release(w, desc)
      self.reset(start)  # Not handed out.
      if isinstance(e, ipc.SegmentRemovedError):
        # Removed from /dev/shm by another process before it was read:
        # systemd-logind (RemoveIPC=yes, the default on several
        # distributions) removes a user's segments when their last session
        # ends, under a job started with nohup; so does a job that empties
        # /dev/shm. The chunk is computed again: nothing is lost.
        self._segments_lost += 1
        if self._segments_lost > _SEGMENT_RETRIES:
          lost, self._segments_lost = self._segments_lost, 0
          raise FileNotFoundError(
              errno.ENOENT,
              f"{ipc.SHM_DIR}/{ipc.segment_name(desc)} (positions {start}..{stop - 1} of {self._ds!r}, from "
              f"worker {w}) was removed by another process before this one read it, {lost} times in a row: "
              f"something empties {ipc.SHM_DIR} under the running job (systemd-logind's RemoveIPC=yes at "
              "logout: set RemoveIPC=no in /etc/systemd/logind.conf or run the job as a system user; or a "
              "cleanup job). Nothing was lost: next() asks for these positions again") from None
        elements = None  # Asked again below, outside this handler.
      elif isinstance(e, ipc.SegmentMapError):  # Mapping the segment failed, not an element: the next call asks again.
        raise _mapping_failed(e, desc, start, stop, self._ds, w) from None
      elif isinstance(e, OSError):  # Raised while unpickling an element (e.g. a file it reopens): as it is.
        raise
      elif stop - start > 1:
        self._one_by_one_until = max(self._one_by_one_until, stop)
        elements = None  # Asked again below, outside this handler.
      else:
        e.add_note(f"Worker {w} (pid {self._pool.procs[w].pid}) computed element {start} of {self._ds!r}, but "
                   "it cannot be unpickled in this process; make what it refers to (a module, a class) importable "
                   "here too. The stream goes on after it.")
        return start, [], e
    except BaseException:
      self._pool.release(w, desc)
      self.reset(start)  # Not handed out: the next call asks for it again.
      raise
    if elements is None:
      return self._next_chunk()
    self._pool.acknowledge(w, desc)
    self._segments_lost = 0
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

  def _worker_error(self, w: int, index: int, failure: tuple[str, bytes | None]) -> BaseException:
    """The worker's exception, raised again here as Grain does (so `except KeyError` still works).

    Its notes say where it came from, with the worker's traceback; an
    exception that does not survive pickling becomes a WorkerError.
    """
    text, exc_bytes = failure
    return _revived(exc_bytes, f"Worker {w} (pid {self._pool.procs[w].pid}) raised while computing element "
                               f"{index} of {self._ds!r}:\n\n{text}")

  def close(self) -> None:
    if not self._detached:
      self._detached = True
      self.reset(self._len)
      self._pool.detach()


class MultiprocessPrefetchIterDataset(iter_lib.IterDataset):
  """The parent pipeline with its random-access parts computed in workers."""

  _same_as_grain = True
  _state_transparent = True  # The stream does not depend on the workers.
  _grain_workers_layout = True  # Grain's state here: its workers' (see state.unwrap_grain_workers).
  _spec_rule = "parent"
  # Nor do seeds derived below it: Grain's mp_prefetch with 0 workers is no
  # node at all, and any worker count must draw what 0 workers draw.
  _seed_transparent = True

  def __init__(self, parent: iter_lib.IterDataset, options: options_lib.MultiprocessingOptions | None,
               worker_init_fn: Callable[[int, int], None] | None):
    super().__init__(parent)
    if options is None:
      options = options_lib.MultiprocessingOptions(num_workers=_DEFAULT_NUM_WORKERS)
    if not isinstance(options, options_lib.MultiprocessingOptions):
      raise checks.OptionsTypeError(f"mp_prefetch expects loader.MultiprocessingOptions (got {options!r}).")
    if options.num_workers > 0 and options.per_worker_buffer_size < 1:
      size = options.per_worker_buffer_size
      raise ValueError(f"`buffer_size` must be greater than 0, got {size}. (Grain's words: mp_prefetch with "
                       f"num_workers={options.num_workers} needs per_worker_buffer_size >= 1, or a DataLoader "
                       "with workers worker_buffer_size >= 1.)")
    self._options = options
    self._worker_init_fn = worker_init_fn
    # The parent computes the first chunk itself while its workers start (a
    # fast first batch). Grain's DataLoader reads only in its workers, and a
    # source that streams instead of reading by index (MaxText's
    # HFDataSource) relies on that, so the DataLoader turns this off.
    self._parent_reads_first_chunk = True

  def _op_repr(self) -> str:
    return f".mp_prefetch(num_workers={self._options.num_workers})"

  def __iter__(self) -> iter_lib.DatasetIterator:
    if self._options.num_workers == 0:
      return iter(self._parent)
    pool = _WorkerPool(self._options, self._worker_init_fn, self._parent_reads_first_chunk)

    def factory(ds: map_lib.MapDataset, read_options) -> MultiprocessChunkProducer:
      return MultiprocessChunkProducer(ds, pool, read_options.num_threads)

    with engine.producer_factory(factory):
      return iter(self._parent)
