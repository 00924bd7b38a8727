"""array_record's reading threads, fitted into this process's address-space limit before they start.

The first ArrayRecordReader a process opens starts array_record's process-wide
pool of 64 threads (ArrayRecordGlobalPool; its size is a C++ flag that Python
cannot set). Under an address-space limit (`ulimit -v`, RLIMIT_AS) a thread
whose stack, or the malloc arena it then creates, does not fit cannot start,
and array_record waits for it for ever: no error, no exit; the same under a
container's process limit (cgroup pids.max) too small for 64 more threads.
`reader_class()` checks the room first: it caps glibc's malloc arenas at what
fits beside the threads' stacks (arenas beyond the cap are shared, never a
failure), and where the stacks or threads do not fit raises
`ReaderThreadsError` in one line saying what limit to set. The same hang
comes from a user's process limit (`ulimit -u`, RLIMIT_NPROC: it counts every
thread of every process of the user), checked as well. Without a limit it
changes nothing.
"""

from __future__ import annotations

import os
import resource
import warnings
from typing import Any

POOL_THREADS = 64  # array_record's array_record_global_pool_size default.
# A new arena reserves twice glibc's HEAP_MAX_SIZE (64 MiB on 64-bit) to align it, then trims it.
_ARENA_RESERVE = 128 << 20
_MARGIN = 64 << 20  # Eigen's queues, thread-local data, the reader's own buffers.
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc's malloc.h).
_TASK_MARGIN = 8  # Threads the process may still start besides the pool's (Python's, the loader's).

_checked_pid: int | None = None


class ReaderThreadsError(MemoryError):
  """array_record's reading threads cannot start under this process's address-space limit."""


class ForkedReaderWarning(RuntimeWarning):
  """ArrayRecord files opened in a process forked from one that had read some: reads may crash or hang."""


def reader_class(path: str = "") -> Any:
  """array_record's ArrayRecordReader, once its threads are known to fit (see the module docstring)."""
  try:
    from array_record.python.array_record_module import ArrayRecordReader  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    if "failed to map segment" in str(e) or "cannot allocate memory" in str(e).lower():
      # The library itself did not fit: not a missing package.
      raise ReaderThreadsError(
          f"{path + ': ' if path else ''}array_record cannot be loaded: {e} (this process may use at most "
          f"{_limit() >> 10:,} KiB of address space: `ulimit -v`); raise `ulimit -v`, e.g. "
          "`ulimit -v unlimited`, and run it again.") from None
    raise ImportError("reading ArrayRecord files needs the array_record package: pip install array-record") from e
  fit_reader_threads(path)
  return ArrayRecordReader


def _limit() -> int:
  return resource.getrlimit(resource.RLIMIT_AS)[0]


def _address_space_in_use() -> int | None:
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmSize:"):
          return int(line.split()[1]) << 10
  except (OSError, ValueError):
    pass
  return None


def _libc() -> Any:
  """glibc, or None (musl, macOS: no mallopt arenas to cap)."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    libc = ctypes.CDLL(None)
    libc.gnu_get_libc_version  # pylint: disable=pointless-statement
    return libc
  except (OSError, AttributeError, ImportError):
    return None


def _thread_stack_bytes(libc: Any) -> int:
  """The stack a new thread gets (pthread's default: RLIMIT_STACK when the process started)."""
  if libc is not None and hasattr(libc, "pthread_getattr_default_np"):  # glibc 2.18+.
    import ctypes  # pylint: disable=g-import-not-at-top
    attr, size = ctypes.create_string_buffer(256), ctypes.c_size_t()  # Room for any pthread_attr_t.
    if libc.pthread_getattr_default_np(attr) == 0:
      ok = libc.pthread_attr_getstacksize(attr, ctypes.byref(size)) == 0
      libc.pthread_attr_destroy(attr)
      if ok:
        return size.value
  soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
  return soft if soft != resource.RLIM_INFINITY else 8 << 20


def _arena_cap() -> int:
  """glibc's cap on malloc arenas: the user's (MALLOC_ARENA_MAX, GLIBC_TUNABLES), else 8 per core."""
  tunables = dict(t.partition("=")[::2] for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if "=" in t)
  for value in (tunables.get("glibc.malloc.arena_max"), os.environ.get("MALLOC_ARENA_MAX")):
    try:
      if value and int(value) > 0:
        return int(value)
    except ValueError:
      pass
  return 8 * (os.cpu_count() or 1)


def _task_room(cgroup: str = "/proc/self/cgroup", mounts: str = "/sys/fs/cgroup") -> tuple[int, int, str] | None:
  """(tasks that may still start, the limit, its cgroup file) under the tightest cgroup pids limit of this
  process and its ancestors (a container's `--pids-limit`), or None without one."""
  tightest = None
  try:
    with open(cgroup, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  for line in lines:
    _, controllers, path = line.split(":", 2)
    if controllers == "":  # cgroup v2
      root = mounts
    elif "pids" in controllers.split(","):  # cgroup v1
      root = mounts + "/pids"
    else:
      continue
    while True:
      folder = root + path.rstrip("/")
      try:
        with open(folder + "/pids.max", encoding="ascii") as f:
          limit = f.read().strip()
        with open(folder + "/pids.current", encoding="ascii") as f:
          current = int(f.read())
        if limit != "max" and (tightest is None or int(limit) - current < tightest[0]):
          tightest = (int(limit) - current, int(limit), folder + "/pids.max")
      except (OSError, ValueError):
        pass
      if path in ("", "/"):
        break
      path = path.rsplit("/", 1)[0] or "/"
  return tightest


def _tasks_running_total() -> int | None:
  """Threads running on the whole machine (as this process sees it), from /proc/loadavg: cheap."""
  try:
    with open("/proc/loadavg", encoding="ascii") as f:
      return int(f.read().split()[3].split("/")[1])
  except (OSError, ValueError, IndexError):
    return None


def _user_tasks(uid: int, proc: str = "/proc") -> int:
  """Threads of every process whose real user is `uid` (what RLIMIT_NPROC counts)."""
  count = 0
  for entry in os.listdir(proc):
    if not entry.isdigit():
      continue
    try:
      with open(f"{proc}/{entry}/status", encoding="utf-8") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
      if int(fields["Uid"].split()[0]) == uid:
        count += int(fields["Threads"])
    except (OSError, ValueError, KeyError, IndexError):
      pass  # Gone meanwhile, or not ours to read.
  return count


def _user_task_room() -> tuple[int, int] | None:
  """(threads this user may still start, its RLIMIT_NPROC) under a finite `ulimit -u`, or None.

  Root is exempt from the limit. The machine-wide count bounds the user's: the
  scan of /proc runs only when that bound leaves too little room.
  """
  limit = resource.getrlimit(resource.RLIMIT_NPROC)[0]
  if limit == resource.RLIM_INFINITY or os.geteuid() == 0:
    return None
  total = _tasks_running_total()
  if total is not None and limit - total >= POOL_THREADS + _TASK_MARGIN:
    return None
  return limit - _user_tasks(os.getuid()), limit


def _threads_running() -> int:
  try:
    return len(os.listdir("/proc/self/task"))
  except OSError:
    return 0


def _too_few_tasks(path: str, room: int, limit: str, what_to_raise: str) -> ReaderThreadsError:
  return ReaderThreadsError(
      f"{path + ': ' if path else ''}cannot open an ArrayRecord file under {limit}: array_record starts "
      f"{POOL_THREADS} reading threads in each process that reads and would wait for ever for those that cannot "
      f"start. Raise {what_to_raise} by at least {POOL_THREADS + _TASK_MARGIN - room:,}, or run fewer worker "
      "processes.")


def fit_reader_threads(path: str = "") -> None:
  """Makes room for array_record's reading threads under `ulimit -v`, or raises ReaderThreadsError; once per process."""
  global _checked_pid
  if _checked_pid == os.getpid():
    return
  if _checked_pid is not None:
    # Seen: 29 of 30 such children crashed (SIGSEGV in abseil's Mutex under riegeli's BackgroundCleaner) or
    # hung when they opened a file in a thread, Grain's source alike; more rarely in the main thread too.
    warnings.warn(
        f"{path + ': ' if path else ''}this process (pid {os.getpid()}) was forked from process {_checked_pid} "
        "after that one had read ArrayRecord files; array_record's background threads and locks do not survive "
        "fork(), and reading here may crash (SIGSEGV) or hang. Start such processes with multiprocessing's "
        "'spawn' or 'forkserver' method (multiprocessing.set_start_method('spawn'); loader's own workers are "
        "spawned), or fork before the first read.", ForkedReaderWarning, stacklevel=3)
  if _threads_running() > POOL_THREADS:
    # The pool may run already (a reader opened outside loader, by TFDS say): nothing is left to fit, and
    # a refusal here would stop a process that reads.
    _checked_pid = os.getpid()
    return
  tasks = _task_room()
  if tasks is not None and tasks[0] < POOL_THREADS + _TASK_MARGIN:
    raise _too_few_tasks(path, tasks[0], f"this container's process limit ({tasks[2]}: {tasks[1]:,} processes and "
                         f"threads, {tasks[1] - tasks[0]:,} of them running)",
                         "the limit (docker --pids-limit, Kubernetes podPidsLimit)")
  tasks = _user_task_room()
  if tasks is not None and tasks[0] < POOL_THREADS + _TASK_MARGIN:
    raise _too_few_tasks(path, tasks[0], f"this user's process limit (`ulimit -u` {tasks[1]:,} processes and "
                         f"threads, {tasks[1] - tasks[0]:,} of them running as this user)",
                         "`ulimit -u` (nproc in /etc/security/limits.conf)")
  limit = _limit()
  used = _address_space_in_use() if limit != resource.RLIM_INFINITY else None
  if used is not None:
    libc = _libc()
    stacks = POOL_THREADS * (_thread_stack_bytes(libc) + resource.getpagesize())
    room = limit - used - stacks - _MARGIN
    if room < 0:
      need = used + stacks + _MARGIN
      raise ReaderThreadsError(
          f"{path + ': ' if path else ''}cannot open an ArrayRecord file under this process's address-space limit "
          f"(`ulimit -v` {limit >> 10:,} KiB, {used >> 20:,} MiB of it in use): array_record starts {POOL_THREADS} "
          f"reading threads ({stacks >> 20:,} MiB of stacks) and would wait for ever for those that do not fit. "
          f"Raise `ulimit -v` to at least {need >> 10:,} KiB (or `ulimit -v unlimited`), or start Python under a "
          "smaller `ulimit -s` (each thread's stack).")
    arenas = 1 + room // _ARENA_RESERVE  # The main arena and the new ones that fit.
    if libc is not None and hasattr(libc, "mallopt") and arenas < _arena_cap():
      libc.mallopt(_M_ARENA_MAX, int(arenas))
  _checked_pid = os.getpid()
