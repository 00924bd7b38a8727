"""`multithread_prefetch`: Grain's thread-based alternative to `mp_prefetch`."""

from __future__ import annotations

from typing import TypeVar

from loader import checks
from loader.iter_dataset import IterDataset

T = TypeVar("T")


def multithread_prefetch(ds: IterDataset[T], num_threads: int, buffer_size: int,
                         sequential_slice: bool = False) -> IterDataset[T]:
  """Computes `ds` ahead in background threads; the stream is `ds`'s own.

  Grain splits `ds` into `num_threads` slices read by one thread each and
  interleaves them. Here, as with `mp_prefetch`, the stream does not depend
  on the thread count: the random-access part of `ds` already reads with
  `ReadOptions.num_threads` threads, and the whole stream is computed up to
  `buffer_size` elements ahead in a background thread. `num_threads=0`
  returns `ds` unchanged, as in Grain.

  Args:
    ds: The dataset to prefetch.
    num_threads: 0 disables prefetching; any other count prefetches.
    buffer_size: Elements computed ahead.
    sequential_slice: Accepted for Grain compatibility; the stream never
      depends on how the work is split.
  """
  del sequential_slice
  if not isinstance(ds, IterDataset):
    raise TypeError(f"multithread_prefetch needs an IterDataset (got {type(ds).__name__}); "
                    "call .to_iter_dataset() first.")
  if checks.check_int(num_threads, "num_threads", minimum=0) == 0:
    return ds
  out = ds.prefetch(checks.check_int(buffer_size, "buffer_size", minimum=0))
  out._hides_parent_seeds = True  # pylint: disable=protected-access  # Grain's is an interleave (see there).
  return out
