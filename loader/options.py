"""Option dataclasses for reading and multiprocess prefetching.

Field names and defaults are Grain 0.2.18's (`grain.ReadOptions`,
`grain.multiprocessing.MultiprocessingOptions`), so Grain code keeps working
after changing the import. Differences, both deliberate:

* The options are frozen (Grain's can be assigned to after construction); use
  `dataclasses.replace(options, num_threads=...)` instead.
* Each has an extra `chunk_size` field: how many elements of the random-access
  part of the pipeline one batched call computes.
"""

from __future__ import annotations

import dataclasses

from loader.checks import check_int


def _check_chunk_size(chunk_size: int | None) -> None:
  if chunk_size is not None:
    check_int(chunk_size, "chunk_size", minimum=1)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """How one process computes the elements of a `MapDataset` it iterates.

  These settings configure a single Python process: with `num_threads=8` and
  `MultiprocessingOptions(num_workers=10)` there are 80 reading threads.

  Attributes:
    num_threads: Background threads computing chunks of elements ahead of the
      consumer (Grain's default, 16). 0 computes them in the consuming thread
      on demand, which suits data already in memory. Threads help when the
      consumer does other work (a training step) or reads are slow (network
      file systems); ArrayRecord reads release the GIL.
    prefetch_buffer_size: How many elements the threads may compute ahead
      (Grain's default, 500). Unlike Grain, a buffer smaller than
      `num_threads` does not limit the threads: each thread computes a whole
      chunk, and at least `num_threads` chunks are in flight.
    chunk_size: Elements of the random-access part of the pipeline computed
      per batched call. None picks one from the pipeline (larger for cheap
      elements, smaller for slow ones). Larger chunks amortise the per-call
      cost of ArrayRecord reads. Not in Grain.
  """

  num_threads: int = 16
  prefetch_buffer_size: int = 500
  chunk_size: int | None = None

  def __post_init__(self):
    check_int(self.num_threads, "num_threads", minimum=0)
    check_int(self.prefetch_buffer_size, "prefetch_buffer_size", minimum=0)
    _check_chunk_size(self.chunk_size)


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
  """Options for `IterDataset.mp_prefetch` and `DataLoader`.

  Attributes:
    num_workers: Worker processes. 0 computes everything in the calling
      process; the produced stream is the same for every value.
    per_worker_buffer_size: Chunks each worker may have computed ahead of the
      consumer (a chunk is `chunk_size` elements of the random-access part of
      the pipeline). Higher values smooth out slow elements at the cost of
      memory. Grain counts this in elements after all transformations; for
      both it is the depth of each worker's output queue.
    enable_profiling: Accepted for Grain compatibility; loader logs no
      profiling report (Grain logs one when `num_workers >= 1`).
    chunk_size: Elements of the random-access part of the pipeline per task
      sent to a worker. None picks one from the pipeline, as
      `ReadOptions.chunk_size` does. Not in Grain.
  """

  num_workers: int = 0
  per_worker_buffer_size: int = 1
  enable_profiling: bool = False
  chunk_size: int | None = None

  def __post_init__(self):
    check_int(self.num_workers, "num_workers", minimum=0)
    check_int(self.per_worker_buffer_size, "per_worker_buffer_size", minimum=1)
    if not isinstance(self.enable_profiling, bool):
      raise ValueError(f"enable_profiling must be True or False (got enable_profiling={self.enable_profiling!r}).")
    _check_chunk_size(self.chunk_size)
