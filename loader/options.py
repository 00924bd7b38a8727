"""Option dataclasses for reading and multiprocess prefetching.

Names and defaults follow Grain's `grain.ReadOptions` and
`grain.multiprocessing.MultiprocessingOptions` where they exist, so Grain-style
code keeps working after changing the import.
"""

from __future__ import annotations

import dataclasses


def _check_int(name: str, value, minimum: int) -> None:
  # bool is an int subclass; True as a worker count is a bug, not a 1.
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum} (got {name}={value!r}).")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
  """How one process computes the elements of a `MapDataset` it iterates.

  Attributes:
    num_threads: Background threads computing chunks of elements ahead of the
      consumer. 0 computes them in the consuming thread on demand. Threads help
      when the consumer does other work (a training step) or reads are slow
      (network file systems); ArrayRecord reads release the GIL.
    prefetch_buffer_size: How many elements the threads may compute ahead.
    chunk_size: Elements computed per batched call into the pipeline. None picks
      one from the pipeline: about 8192 source records per call (at most ~32 MiB
      of elements), starting with a small first chunk. Larger chunks amortise
      the per-call cost of ArrayRecord reads.
  """

  num_threads: int = 0
  prefetch_buffer_size: int = 4096
  chunk_size: int | None = None

  def __post_init__(self):
    _check_int("num_threads", self.num_threads, 0)
    _check_int("prefetch_buffer_size", self.prefetch_buffer_size, 0)
    if self.chunk_size is not None:
      _check_int("chunk_size", self.chunk_size, 1)


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
  """Options for `IterDataset.mp_prefetch`.

  Attributes:
    num_workers: Worker processes. 0 computes everything in the calling process;
      the produced stream is the same for every value.
    per_worker_buffer_size: Chunks each worker may have computed ahead of the
      consumer (a chunk is `chunk_size` elements of the random-access part of
      the pipeline). Higher values smooth out slow elements at the cost of
      memory.
    chunk_size: Elements per task sent to a worker. None picks one from the
      pipeline, as `ReadOptions.chunk_size` does.
  """

  num_workers: int = 0
  per_worker_buffer_size: int = 1
  chunk_size: int | None = None

  def __post_init__(self):
    _check_int("num_workers", self.num_workers, 0)
    _check_int("per_worker_buffer_size", self.per_worker_buffer_size, 1)
    if self.chunk_size is not None:
      _check_int("chunk_size", self.chunk_size, 1)
