"""Passing elements between processes with array payloads in shared memory.

A chunk of elements is pickled with protocol 5: numpy arrays hand their
memory out of band, so the pickle stream itself holds only structure (and
small or object payloads such as bytes). Stream and array buffers are copied
into one POSIX shared-memory segment; only its name travels through the pipe.
The receiver maps the segment, unlinks it at once, and unpickles with arrays
pointing into the mapping: no copy in the consumer, and nothing left in
/dev/shm; the memory is freed when the last array using it is.

Ownership: a segment belongs to the creating worker until the consumer has
received its descriptor; the consumer unlinks every segment it receives,
consumed or discarded. Segment names start with a per-iterator prefix so the
consumer can sweep leftovers of a crashed worker from /dev/shm.
"""

from __future__ import annotations

import mmap
import os
import pickle
from multiprocessing import resource_tracker
from multiprocessing import shared_memory
from typing import Any

import _posixshmem  # The POSIX shm calls SharedMemory uses, without its copy-on-close rules.

_INLINE_LIMIT = 64 << 10  # Smaller payloads go through the pipe directly.
_ALIGN = 64
_SHM_DIR = "/dev/shm"


def _align(n: int) -> int:
  return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def encode(obj: Any, name: str) -> tuple:
  """Serialises `obj`; large payloads land in a new segment called `name`."""
  buffers: list[pickle.PickleBuffer] = []
  data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
  raws = [b.raw() for b in buffers]
  total = len(data) + sum(r.nbytes for r in raws)
  if total <= _INLINE_LIMIT:
    return ("inline", data, [bytes(r) for r in raws])
  layout = []
  offset = _align(len(data))
  for r in raws:
    layout.append((offset, r.nbytes))
    offset = _align(offset + r.nbytes)
  shm = shared_memory.SharedMemory(name=name, create=True, size=offset)
  try:
    buf = shm.buf
    buf[:len(data)] = data
    for (start, n), r in zip(layout, raws):
      buf[start:start + n] = r
    del buf
  except BaseException:
    shm.close()
    shm.unlink()
    raise
  shm.close()
  return ("shm", name, len(data), layout, offset)


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


def _map_and_unlink(name: str, size: int) -> memoryview:
  path = "/" + name  # SharedMemory's POSIX name for `name`.
  fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
  try:
    mapping = mmap.mmap(fd, size)
  finally:
    os.close(fd)
  _posixshmem.shm_unlink(path)
  # The worker's SharedMemory registered the segment; it is gone now.
  resource_tracker.unregister(path, "shared_memory")
  return memoryview(mapping)


def segment_name(desc: tuple) -> str | None:
  return desc[1] if desc[0] == "shm" else None


def _unlink(shm: shared_memory.SharedMemory) -> None:
  try:
    shm.unlink()
  except FileNotFoundError:
    pass


def release(desc: tuple) -> None:
  """Frees a received payload without decoding it."""
  name = segment_name(desc)
  if name is not None:
    unlink(name)


def unlink(name: str) -> None:
  """Removes segment `name` if it still exists."""
  try:
    shm = shared_memory.SharedMemory(name=name)
  except FileNotFoundError:
    return
  shm.close()
  _unlink(shm)


def sweep(prefix: str) -> int:
  """Unlinks every segment whose name starts with `prefix`; returns how many."""
  if not os.path.isdir(_SHM_DIR):
    return 0
  removed = 0
  for entry in os.listdir(_SHM_DIR):
    if entry.startswith(prefix):
      unlink(entry)
      removed += 1
  return removed
