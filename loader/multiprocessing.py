"""Grain's `grain.multiprocessing` names.

`SharedMemoryArray` exists so transforms written for Grain run unchanged; in
loader it is an ordinary in-memory array, because loader's worker processes
already hand every numpy array to the consumer through shared memory
(`loader/ipc.py`). It arrives in the consumer as a plain `np.ndarray`, and
`unlink_on_del`/`enable_async_del` have nothing to free. Grain's manual hand-over
by segment name (`metadata`, `from_metadata`, `SharedMemoryArrayMetadata`) is
not provided; Grain's private path to `SharedMemoryArrayMetadata`
(`grain._src.python.ipc.shared_memory_array`, which Keras's Grain adapter imports
for an `isinstance` check) ports to `_SharedMemoryArrayMetadata` here, a class of
which loader makes no instances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from loader.options import MultiprocessingOptions

__all__ = ["MultiprocessingOptions", "SharedMemoryArray"]


class SharedMemoryArray(np.ndarray):
  """A zero-filled array to return from transforms, as with Grain's.

  Example::

    def map(self, x):
      out = SharedMemoryArray((1024,), np.float32)
      out[:] = x
      return out
  """

  def __new__(cls, shape: Iterable[int], dtype: Any = float) -> SharedMemoryArray:
    return np.zeros(tuple(shape), dtype).view(cls)

  def __array_wrap__(self, obj, context=None, return_scalar=False):  # pylint: disable=unused-argument
    # Results of ufuncs are plain arrays, as for Grain's (and numpy.memmap).
    if return_scalar:
      return obj[()]
    return obj.view(np.ndarray)

  def __reduce_ex__(self, protocol):
    # Pickles as a plain ndarray: with protocol 5 its buffer goes out of band,
    # which is how loader's workers put arrays in shared memory.
    return np.asarray(self).__reduce_ex__(protocol)

  def unlink_on_del(self) -> None:
    """Grain: make this process free the segment. Nothing to free here."""

  @classmethod
  def enable_async_del(cls, num_threads: int = 1, max_outstanding_requests: int = 50) -> None:  # pylint: disable=unused-argument
    """Grain: free segments on background threads. Nothing to free here."""


@dataclasses.dataclass(slots=True, frozen=True)
class _SharedMemoryArrayMetadata:
  """Grain's handle to an array a worker left in shared memory, for `isinstance` checks.

  Grain's DataLoader workers turn arrays into these handles on their way to
  the consumer (and a client's transform may meet one); loader's workers pass
  arrays as arrays, so no element is ever one. Reached only through
  `loader._src.python.ipc.shared_memory_array.SharedMemoryArrayMetadata`.
  """

  name: str
  shape: Iterable[int]
  dtype: Any


# Grain's class name (its qualified name stays this module's, so instances pickle).
_SharedMemoryArrayMetadata.__name__ = "SharedMemoryArrayMetadata"
