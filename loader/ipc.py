"""Passing elements between processes with array payloads in shared memory.

A chunk of elements is pickled with protocol 5 (many small dict elements
first as one array per key, see `_Columns`): numpy arrays hand their
memory out of band, so the pickle stream itself holds only structure (and
small or object payloads such as bytes). Stream and array buffers are written
into one POSIX shared-memory segment (one pwritev); only its name travels
through the pipe. The receiver maps the segment, unlinks it at once, and
unpickles with arrays pointing into the mapping: no copy in the consumer, and
nothing left in /dev/shm; the memory is freed when the last array using it is.

Ownership: a segment belongs to the creating worker until the consumer has
received its descriptor; the consumer unlinks every segment it receives,
consumed or discarded. Segment names start with a per-iterator prefix so the
consumer can sweep leftovers of a crashed worker from /dev/shm.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import logging
import mmap
import os
import pickle
import re
import resource
import secrets
import sys
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

import _posixshmem  # The POSIX shm calls SharedMemory uses, without its copy-on-close rules.
from loader import ondisk

_INLINE_LIMIT = 64 << 10  # Smaller payloads go through the pipe directly.
_ALIGN = 64
_IOV_MAX = 1024  # Linux's limit on buffers per pwritev call.
SHM_DIR = "/dev/shm"
# Shared memory that cannot take a segment (a full or small /dev/shm, as
# Docker's 64 MB default; a read-only or missing one): the chunk goes through
# the pipe instead, slower but losing nothing.
_NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.ENOMEM, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                             errno.EMFILE, errno.ENFILE, errno.EFBIG})
_log = logging.getLogger(__name__)
_warned_no_room = False


def _align(n: int) -> int:
  return (n + _ALIGN - 1) // _ALIGN * _ALIGN


# A chunk of at least this many dict elements whose arrays average at most
# _COLUMN_MAX_BYTES travels as one array per key (see _Columns).
_COLUMN_MIN_ELEMENTS = 16
_COLUMN_MAX_BYTES = 64 << 10


class _Columns:
  """A list of dicts with the same keys, each key's arrays concatenated into one.

  Receiving an array costs ~2.5 µs (a buffer view, `np.frombuffer`, a
  reshape) whatever its size; a stream of small elements (tokenized
  documents: a dict of two ~3 KB arrays) spends most of the consumer's time
  on that. As columns, each key is one array and each element's value a
  slice of it (~0.2 µs). The values are equal to the originals: same dtype,
  shape and C order, writeable, and, as before, views into the received
  segment. Keys whose values are not all such arrays travel as lists.
  """

  def __init__(self, elements: list[dict]):
    self.keys = tuple(elements[0])
    self.columns: list[Any] = []
    for k in self.keys:
      values = [e[k] for e in elements]
      joined = np.concatenate(values) if _stackable(values) else None
      # np.concatenate gives a native byte order: big-endian values (a map's
      # `np.frombuffer(record, ">u4").copy()`) travel as they are, or they
      # would arrive as "<u4" from workers and as ">u4" without them.
      if joined is not None and joined.dtype == values[0].dtype:
        lengths = np.fromiter((v.shape[0] for v in values), np.int64, len(values))
        self.columns.append((joined, lengths))
      else:
        self.columns.append(values)

  def __reduce__(self):
    return _rebuild_elements, (self.keys, self.columns)


def _stackable(values: list[Any]) -> bool:
  first = values[0]
  if type(first) is not np.ndarray or first.ndim == 0 or first.dtype.hasobject:  # pylint: disable=unidiomatic-typecheck
    return False
  dtype, trailing = first.dtype, first.shape[1:]
  # Read-only arrays arrive read-only when pickled one by one: they stay so.
  return all(type(v) is np.ndarray and v.dtype == dtype and v.ndim and v.shape[1:] == trailing  # pylint: disable=unidiomatic-typecheck
             and v.flags.c_contiguous and v.flags.writeable for v in values)


def _rebuild_elements(keys: tuple, columns: list[Any]) -> list[dict]:
  parts = []
  for column in columns:
    if isinstance(column, tuple):
      joined, lengths = column
      ends = np.cumsum(lengths).tolist()
      parts.append([joined[a:b] for a, b in zip([0, *ends], ends)])
    else:
      parts.append(column)
  return [dict(zip(keys, values)) for values in zip(*parts)]


def _as_columns(obj: Any) -> Any:
  """`obj` as _Columns where that pays: many dicts with the same keys and small arrays."""
  if type(obj) is not list or len(obj) < _COLUMN_MIN_ELEMENTS or type(obj[0]) is not dict:  # pylint: disable=unidiomatic-typecheck
    return obj
  keys = list(obj[0])
  nbytes = arrays = 0
  for e in obj:
    if type(e) is not dict or list(e) != keys:  # pylint: disable=unidiomatic-typecheck
      return obj
    for v in e.values():
      if type(v) is np.ndarray:  # pylint: disable=unidiomatic-typecheck
        nbytes += v.nbytes
        arrays += 1
  if not arrays or nbytes > _COLUMN_MAX_BYTES * arrays:
    return obj
  return _Columns(obj)


def encode(obj: Any, name: str) -> tuple:
  """Serialises `obj`; large payloads land in a new segment called `name`."""
  obj = _as_columns(obj)
  buffers: list[pickle.PickleBuffer] = []
  data = dumps(obj, buffers)
  raws = [b.raw() for b in buffers]
  total = len(data) + sum(r.nbytes for r in raws)
  if total <= _INLINE_LIMIT:
    return ("inline", data, [bytes(r) for r in raws])
  layout = []
  parts: list[Any] = [data]
  offset = len(data)
  for r in raws:
    start = _align(offset)
    if start > offset:
      parts.append(bytes(start - offset))
    layout.append((start, r.nbytes))
    parts.append(r)
    offset = start + r.nbytes
  size = _align(offset)
  try:
    return _write_segment(name, parts, size, layout, len(data))
  except OSError as e:
    if e.errno not in _NO_ROOM_ERRNOS:
      raise
    _warn_no_room(e, size)
    return ("inline", data, [bytes(r) for r in raws])


def dumps(obj: Any, buffers: list | None = None) -> bytes:
  """pickle.dumps (protocol 5, out-of-band buffers appended to `buffers`), but the script's classes go by name.

  The pipeline reaches the workers with cloudpickle, which sends classes
  defined in `__main__` by value: in a worker they are copies that its
  `__main__` (the script run again, or an empty one: `python -c`, a notebook,
  no guard, workers_run_main=False) does not hold, so pickle refuses their
  instances ("it's not the same object as __main__.Point"). By name, the
  consumer rebuilds them with its own classes (isinstance holds). Only after
  the C pickler failed: the usual case costs nothing more.
  """
  callback = None if buffers is None else buffers.append
  try:
    return pickle.dumps(obj, protocol=5, buffer_callback=callback)
  except pickle.PicklingError:
    if buffers is not None:
      buffers.clear()  # The failed attempt's buffers.
  file = io.BytesIO()
  _MainByName(file, protocol=5, buffer_callback=callback).dump(obj)
  return file.getvalue()


class _MainByName(pickle.Pickler):
  """A pickler that refers to classes defined in `__main__` by their name there (see `dumps`)."""

  def reducer_override(self, obj: Any) -> Any:
    if isinstance(obj, type) and obj.__module__ == "__main__" and "<locals>" not in obj.__qualname__:
      return _main_attribute, (obj.__qualname__,)
    return NotImplemented


def _main_attribute(qualname: str) -> Any:
  """`__main__.<qualname>` of this process (a class a worker sent by name)."""
  obj = sys.modules["__main__"]
  for name in qualname.split("."):
    obj = getattr(obj, name)
  return obj


def _warn_no_room(error: OSError, size: int) -> None:
  global _warned_no_room
  if not _warned_no_room:
    _warned_no_room = True
    if error.errno == errno.EFBIG:  # Not /dev/shm: the process's file size limit (`ulimit -f`, a scheduler's).
      limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
      _log.warning(
          "loader: a %.1f MB chunk is past this process's file size limit (%s bytes, `ulimit -f`; %s); this "
          "worker (pid %d) sends its chunks through its pipe instead, which is slower but loses nothing. Raise "
          "the limit (`ulimit -f unlimited`, or the job scheduler's file size setting), or use a smaller "
          "MultiprocessingOptions(chunk_size=...).", size / 1e6, limit, os.strerror(error.errno), os.getpid())
      return
    _log.warning(
        "loader: %s has no room for a %.1f MB chunk (%s); this worker (pid %d) sends its chunks through its "
        "pipe instead, which is slower but loses nothing. Give %s more room (e.g. `docker run --shm-size=2g`), "
        "or use fewer workers or a smaller MultiprocessingOptions(chunk_size=...).",
        SHM_DIR, size / 1e6, os.strerror(error.errno), os.getpid(), SHM_DIR)


def _write_segment(name: str, parts: list[Any], size: int, layout: list, data_len: int) -> tuple:
  """Writes `parts` into a new segment `name`; its descriptor (the segment is removed if writing fails)."""
  path = "/" + name  # SharedMemory's POSIX name for `name`.
  fd = _posixshmem.shm_open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
  # Registered as SharedMemory(create=True) registers it: the tracker
  # unlinks it if this process and the consumer both die before the unlink.
  resource_tracker.register(path, "shared_memory")
  try:
    os.ftruncate(fd, size)
    # Written with pwritev, not copied into a mapping: one syscall fills the
    # pages, where a fresh mapping takes a page fault per 4 KiB (a 3 MB
    # batch: ~0.8 ms instead of ~1.8 ms).
    _write_all(fd, parts)
  except BaseException:
    _posixshmem.shm_unlink(path)
    resource_tracker.unregister(path, "shared_memory")
    raise
  finally:
    os.close(fd)
  return ("shm", name, data_len, layout, size)


def _write_all(fd: int, parts: list[Any]) -> None:
  """Writes `parts` back to back from offset 0, however the kernel splits it."""
  views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
  offset, first = 0, 0  # views[first:] are still to write (an index: chunks can hold 100k+ arrays).
  while first < len(views):
    written = os.pwritev(fd, views[first:first + _IOV_MAX], offset)
    if written <= 0:
      raise OSError(f"pwritev wrote {written} bytes to a shared-memory segment at offset {offset}")
    offset += written
    while first < len(views) and written >= views[first].nbytes:
      written -= views[first].nbytes
      first += 1
    if written:
      views[first] = views[first][written:]


def decode(desc: tuple) -> Any:
  """Inverse of `encode`; unlinks the segment.

  Arrays are not copied: they point into a private mapping of the segment,
  which is unlinked at once (nothing is left in /dev/shm) and unmapped when
  the last array using it is freed.
  """
  if desc[0] == "inline":
    _, data, raws = desc
    return pickle.loads(data, buffers=[bytearray(r) for r in raws])
  _, name, data_len, layout, size = desc
  view = _map_and_unlink(name, size)
  return pickle.loads(view[:data_len], buffers=[view[o:o + n] for o, n in layout])


class SegmentRemovedError(FileNotFoundError):
  """A result segment was gone from /dev/shm before the consumer opened it (removed by another process).

  Its own class: an element whose unpickling raises FileNotFoundError is that
  element's error, not a removed segment.
  """


class SegmentMapError(OSError):
  """A result segment could not be opened or mapped in this process (too many open files, no memory).

  Its own class: an element whose unpickling raises an OSError is that
  element's error, not a failure to map its segment.
  """


def _map_and_unlink(name: str, size: int) -> memoryview:
  path = "/" + name  # SharedMemory's POSIX name for `name`.
  try:
    fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
  except FileNotFoundError:
    # Removed by another process (see MultiprocessChunkProducer.next_chunk):
    # the worker's registration goes too, or the resource tracker warns at
    # exit about a segment it cannot find.
    resource_tracker.register(path, "shared_memory")
    resource_tracker.unregister(path, "shared_memory")
    raise SegmentRemovedError(errno.ENOENT, os.strerror(errno.ENOENT), SHM_DIR + path) from None
  except OSError as e:
    raise SegmentMapError(e.errno, e.strerror, SHM_DIR + path) from e
  try:
    mapping = mmap.mmap(fd, size)
  except OSError as e:
    raise SegmentMapError(e.errno, e.strerror, SHM_DIR + path) from e
  finally:
    os.close(fd)
  try:
    _posixshmem.shm_unlink(path)
  except FileNotFoundError:
    pass  # Removed by another process once mapped here: the mapping keeps the data.
  # The worker's SharedMemory registered the segment; it is gone now.
  resource_tracker.unregister(path, "shared_memory")
  return memoryview(mapping)


def share_bytes(name: str, data: bytes, readers: int) -> tuple | None:
  """`data` in a new segment `name` that `readers` processes read once each (`read_shared`); None if no room.

  The last reader unlinks it: a flag byte per reader precedes the data, and a
  reader sets its own, then looks at all (whichever reader sets the last one
  sees them all). Not left to this process's resource tracker, which would
  call a segment its readers removed leaked; the owner sweeps its segments
  when it stops (see `sweep`, `sweep_dead`).
  """
  try:
    desc = _write_segment(name, [bytes(readers), data], readers + len(data), [readers], len(data))
  except OSError:
    return None
  resource_tracker.unregister("/" + name, "shared_memory")
  return desc


def read_shared(desc: tuple, reader: int) -> bytearray:
  """The bytes of a `share_bytes` segment, read by reader number `reader`; the last reader unlinks it."""
  _, name, data_len, (readers,), _ = desc
  path = "/" + name
  fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
  try:
    out = bytearray(data_len)
    view, offset = memoryview(out), 0
    while offset < data_len:
      n = os.preadv(fd, [view[offset:]], readers + offset)
      if n <= 0:
        raise OSError(f"shared-memory segment {name} ends at {offset} bytes of {data_len}")
      offset += n
    os.pwrite(fd, b"\x01", reader)
    done = all(os.pread(fd, readers, 0))
  finally:
    os.close(fd)
  if done:
    try:
      _posixshmem.shm_unlink(path)
    except FileNotFoundError:
      pass  # Another reader that finished at the same time did.
  return out  # Not bytes(out): one copy of a large pipeline in each reader, not two.


def segment_name(desc: tuple) -> str | None:
  return desc[1] if desc[0] == "shm" else None


def release(desc: tuple) -> None:
  """Frees a received payload without decoding it."""
  name = segment_name(desc)
  if name is not None:
    unlink(name)


def unlink(name: str) -> None:
  """Removes segment `name` if it still exists.

  By name, without mapping it: a worker killed between creating a segment
  and sizing it leaves an empty one, which cannot be mapped ("cannot mmap an
  empty file" replaced the error that said the worker died).
  """
  path = "/" + name
  try:
    _posixshmem.shm_unlink(path)
  except FileNotFoundError:
    pass  # Unlinked already, or removed by another process (its maker's registration is still answered).
  # What SharedMemory(name=...).unlink() tells the resource tracker: the
  # registration of whoever made it is answered, and none is left behind.
  resource_tracker.register(path, "shared_memory")
  resource_tracker.unregister(path, "shared_memory")


def sweep(prefix: str) -> int:
  """Unlinks every segment whose name starts with `prefix`; returns how many."""
  if not os.path.isdir(SHM_DIR):
    return 0
  removed = 0
  for entry in os.listdir(SHM_DIR):
    if entry.startswith(prefix):
      unlink(entry)
      removed += 1
  return removed


def segment_prefix() -> str:
  """A new prefix for one pool's segments: `arl<pid>_<namespace tag><random>_`.

  The pid is the consuming process's. The tag tells this pid namespace from
  another that shares /dev/shm (containers), so `sweep_dead` never takes
  another namespace's pid for a dead one.
  """
  return f"arl{os.getpid()}_{_namespace_tag()}{secrets.token_hex(3)}_"


def _namespace_tag() -> str:
  return f"{ondisk.pid_namespace() & 0xFFFF:04x}"


# Result segments end in _<worker>_<seq>; a pool's start segment (share_bytes) in _start<n>.
_SEGMENT_RE = re.compile(r"arl(\d+)_([0-9a-f]{4})[0-9a-f]{6}_(?:\d+_\d+|start\d+)\Z")
_swept_dead = False


def sweep_dead() -> int:
  """Unlinks, once per process, the segments of consuming processes of this pid namespace that no longer run.

  They are what a kill of a whole process group (`docker kill`, a cgroup's
  out-of-memory kill, a scheduler ending a job) leaves: no process of the pool
  survived to sweep them, and /dev/shm keeps them until reboot. Returns how
  many were removed.
  """
  global _swept_dead
  if _swept_dead or not os.path.isdir(SHM_DIR):
    return 0
  _swept_dead = True
  tag, here, removed = _namespace_tag(), ondisk.this_process(), 0
  for entry in os.listdir(SHM_DIR):
    m = _SEGMENT_RE.match(entry)
    if not m or m[2] != tag or int(m[1]) == here.pid:
      continue
    if ondisk.is_alive(dataclasses.replace(here, pid=int(m[1]), start=0)) is False:
      try:
        _posixshmem.shm_unlink("/" + entry)
        removed += 1
      except OSError:  # Gone meanwhile, or another user's.
        pass
  return removed
