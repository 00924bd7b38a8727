"""Option dataclasses for reading and multiprocess prefetching.

Field names and defaults are Grain 0.2.18's (`grain.ReadOptions`,
`grain.multiprocessing.MultiprocessingOptions`), so Grain code keeps working
after changing the import. Differences, both deliberate:

* Assigning a field after construction is validated like the constructor's
  arguments (Grain's options take any value).
* Each has an extra `chunk_size` field: how many source records (elements
  before any batching, whatever stage the batch is on) one batched call of
  the random-access part of the pipeline covers.
* `MultiprocessingOptions` has an extra `workers_run_main` field: False
  starts workers without running the training script's top level again.
"""

from __future__ import annotations

import dataclasses

from loader.checks import check_int


def _as_int(options, name: str, **limits) -> None:
  """Checks an integer field and stores it as a Python int (a numpy or JAX integer scalar is taken)."""
  value = getattr(options, name)
  if value is not None or name != "chunk_size":
    object.__setattr__(options, name, check_int(value, name, **limits))


def _validated_setattr(self, name, value):
  """Mutable as Grain's options, but never left invalid."""
  initialised = all(hasattr(self, f.name) for f in dataclasses.fields(self))
  old = getattr(self, name, None)
  object.__setattr__(self, name, value)
  if initialised:
    try:
      self.__post_init__()
    except ValueError:
      object.__setattr__(self, name, old)
      raise


def _grain_repr(self) -> str:
  """Grain's repr (its fields only) while loader's own fields keep their defaults: logged or
  compared option reprs read as on Grain; a set loader-only field shows."""
  shown = [f for f in dataclasses.fields(self) if f.name in _GRAIN_FIELDS or getattr(self, f.name) != f.default]
  return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"


_GRAIN_FIELDS = frozenset({"num_threads", "prefetch_buffer_size", "num_workers", "per_worker_buffer_size",
                           "enable_profiling"})


@dataclasses.dataclass(slots=True)
class ReadOptions:
  """How one process computes the elements of a `MapDataset` it iterates.

  These settings configure a single Python process: with `num_threads=8` and
  `MultiprocessingOptions(num_workers=10)` there are 80 reading threads.

  Attributes:
    num_threads: Background threads computing chunks of elements ahead of the
      consumer (Grain's default, 16). At most two per core are started: more
      only contend for the GIL. 0 computes chunks in the consuming thread on
      demand. Threads overlap reading with the consumer's work (a training
      step) and, on several cores, read chunks in parallel (ArrayRecord reads
      release the GIL).
    prefetch_buffer_size: How many elements the threads may compute ahead
      (Grain's default, 500); at least one chunk is always in flight.
    chunk_size: Source records (elements before any batching) per batched
      call. None adapts it: small first chunks for a fast first batch, then
      up to ~64k records, fewer when elements are slow (~0.1 s of work per
      chunk; in process up to 0.5 s when records are cheap) or large (~64 MiB
      per chunk). Not in Grain.
  """

  num_threads: int = 16
  prefetch_buffer_size: int = 500
  chunk_size: int | None = None

  def __post_init__(self):
    _as_int(self, "num_threads", minimum=0)
    _as_int(self, "prefetch_buffer_size", minimum=0)
    _as_int(self, "chunk_size", minimum=1)

  __setattr__ = _validated_setattr
  __repr__ = _grain_repr


@dataclasses.dataclass(slots=True)
class MultiprocessingOptions:
  """Options for `IterDataset.mp_prefetch` and `DataLoader`.

  Attributes:
    num_workers: Worker processes. 0 computes everything in the calling
      process; the produced stream is the same for every value.
    per_worker_buffer_size: Chunks each worker may have computed ahead of the
      consumer (a chunk is a run of consecutive elements of the random-access
      part of the pipeline, see `chunk_size`). Higher values smooth out slow elements at the cost of
      memory. Grain counts this in elements after all transformations; for
      both it is the depth of each worker's output queue. At least 1 where
      there are workers (`mp_prefetch` refuses less); any integer with
      `num_workers=0`, as in Grain.
    enable_profiling: Accepted for Grain compatibility; loader logs no
      profiling report (Grain logs one when `num_workers >= 1`).
    chunk_size: Source records (elements before any batching) per task sent
      to a worker. None adapts it as `ReadOptions.chunk_size` does, and also
      keeps chunks below a fair share of what is left, so a small dataset
      reaches every worker. Not in Grain.
    workers_run_main: True (the default) runs the script's top level in each
      worker before it computes anything, as Grain's spawned workers do, so
      top-level setup (a registry filled at import, a `jax.config.update`)
      holds there. False skips it: workers start sooner when the top level
      imports heavy libraries (`import jax` costs each worker ~0.5 s), and
      functions and classes the script defines still reach them, by value.
      Use it when the pipeline does not rely on top-level side effects. A
      script without an `if __name__ == "__main__":` guard is never run in
      workers. Not in Grain.
  """

  num_workers: int = 0
  per_worker_buffer_size: int = 1
  enable_profiling: bool = False
  chunk_size: int | None = None
  workers_run_main: bool = True

  def __post_init__(self):
    _as_int(self, "num_workers", minimum=0)
    # Checked where workers start (mp_prefetch), as Grain does: with no workers any value goes.
    _as_int(self, "per_worker_buffer_size")
    if not isinstance(self.enable_profiling, bool):
      raise ValueError(f"enable_profiling must be True or False (got enable_profiling={self.enable_profiling!r}).")
    _as_int(self, "chunk_size", minimum=1)
    if not isinstance(self.workers_run_main, bool):
      raise ValueError(f"workers_run_main must be True or False (got workers_run_main={self.workers_run_main!r}).")

  __setattr__ = _validated_setattr
  __repr__ = _grain_repr
