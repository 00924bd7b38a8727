"""Grain's `grain.multiprocessing` names.

`SharedMemoryArray` exists so transforms written for Grain run unchanged; in
loader it is an ordinary in-memory array, because loader's worker processes
already hand every numpy array to the consumer through shared memory
(`loader/ipc.py`). It arrives in the consumer as a plain `np.ndarray`, and
`unlink_on_del`/`enable_async_del` have nothing to free. Grain's manual hand-over
by segment name (`metadata`, `from_metadata`, `SharedMemoryArrayMetadata`) is
not provided.
"""

from __future__ import annotations

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
