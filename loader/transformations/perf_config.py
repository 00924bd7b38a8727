"""`pick_performance_config`: worker count and read buffer from a memory budget (Grain's API).

Grain samples the whole pipeline (starting its worker processes) and sizes
everything by element size alone. We sample only the random-access part that
`mp_prefetch` parallelises, computing a few elements in this process, and
budget memory the way our workers use it: each worker holds
`per_worker_buffer_size + 1` chunks of elements, sized as the engine sizes
them from the measured element bytes and compute time. A tight budget first gets
smaller chunks (`MultiprocessingOptions.chunk_size`), and fewer workers only
when single-element chunks do not fit. Workers are capped by the
cores this process may run on (its CPU affinity, which containers restrict),
not the machine's. A pipeline with no random-access part gets 0 workers.

The result only sets options; it never changes the stream, which is the same
for every worker count and buffer size.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from typing import Any

import numpy as np

from loader import engine
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import options as options_lib

_log = logging.getLogger(__name__)
_MB = 1 << 20
_DEFAULT_MAX_BUFFER_SIZE = 1000  # Grain's.
_RAMP_CALLS = 12


@dataclasses.dataclass(slots=True)
class PerformanceConfig:
  """Options picked by `pick_performance_config` (Grain's fields)."""

  multiprocessing_options: options_lib.MultiprocessingOptions | None = None
  read_options: options_lib.ReadOptions | None = None


def _element_bytes(x: Any, depth: int = 0) -> int:
  if isinstance(x, np.ndarray):
    if x.dtype.hasobject:
      return sum(_element_bytes(v, depth + 1) for v in x.flat) if depth < 8 else x.nbytes
    return x.nbytes
  if depth < 8 and isinstance(x, dict):
    return sum(_element_bytes(v, depth + 1) for v in x.values())
  if depth < 8 and isinstance(x, (list, tuple)):
    return sum(_element_bytes(v, depth + 1) for v in x)
  return sys.getsizeof(x)


def _random_access_parts(ds: Any) -> list[iter_lib.MapBackedIterDataset]:
  """The `to_iter_dataset()` nodes of `ds`: the parts workers can compute."""
  if isinstance(ds, iter_lib.MapBackedIterDataset):
    return [ds]
  found = []
  for parent in getattr(ds, "parents", ()):
    if isinstance(parent, iter_lib.IterDataset):
      found.extend(_random_access_parts(parent))
  return found


def _sample(ds: map_lib.MapDataset, count: int) -> list[Any]:
  n = min(len(ds), 4 * count)  # Room for filtered-out (None) positions.
  if n <= 0:
    return []
  elements = ds._getitems(np.arange(n, dtype=np.int64))  # pylint: disable=protected-access
  return [x for x in elements if x is not None][:count]


def _steady_chunk_elements(ds: map_lib.MapDataset, samples: list[Any], seconds: float, workers: int) -> int:
  """The chunk size the engine settles on for `ds`, from the measured samples."""
  sizer = engine.ChunkSizer(ds, None, parallelism=max(1, workers))
  sizer.observe(samples, seconds)
  size = 1
  for _ in range(_RAMP_CALLS):  # Chunks start small and grow; take the plateau.
    size = sizer.size(0)
  return size


def pick_performance_config(ds: Any, *, ram_budget_mb: int | None, max_workers: int | None,
                            max_buffer_size: int | None, samples_to_check: int = 5) -> PerformanceConfig:
  """Picks `mp_prefetch` workers and a read buffer that fit `ram_budget_mb`.

  Args:
    ds: The `IterDataset` to tune (a `MapDataset` is taken as its
      `to_iter_dataset()`).
    ram_budget_mb: Memory the buffered elements may take, in MiB (0: no
      workers and no buffer, as Grain gives); None for no limit (Grain
      requires a number).
    max_workers: At most this many workers; None: the cores available here.
    max_buffer_size: At most this `ReadOptions.prefetch_buffer_size`; None:
      1000, as in Grain.
    samples_to_check: Elements computed to measure element size.

  Returns:
    `PerformanceConfig(multiprocessing_options=..., read_options=...)`.
  """
  if isinstance(ds, map_lib.MapDataset):
    ds = ds.to_iter_dataset()
  if ram_budget_mb is not None and (not isinstance(ram_budget_mb, (int, float)) or ram_budget_mb < 0):
    raise ValueError(f"ram_budget_mb must be a number >= 0 or None (got {ram_budget_mb=!r}).")
  max_workers = engine.available_cores() if max_workers is None else max_workers
  max_buffer_size = _DEFAULT_MAX_BUFFER_SIZE if max_buffer_size is None else max_buffer_size
  per_worker_buffer = options_lib.MultiprocessingOptions().per_worker_buffer_size

  parts = _random_access_parts(ds)
  if not parts:
    _log.info("pick_performance_config: %r has no random-access part for workers; using 0 workers.", ds)
    return PerformanceConfig(options_lib.MultiprocessingOptions(num_workers=0),
                             options_lib.ReadOptions(prefetch_buffer_size=max_buffer_size))

  num_workers, buffer_size, chunk_records = max_workers, max_buffer_size, None
  for part in parts if ram_budget_mb is not None else ():
    map_ds = part.map_dataset
    started = time.perf_counter()
    samples = _sample(map_ds, samples_to_check)
    seconds = time.perf_counter() - started
    if not samples:
      _log.warning("pick_performance_config: no elements to sample in %r; using the maxima.", map_ds)
      continue
    element = max(1.0, float(np.mean([_element_bytes(x) for x in samples])))
    budget = ram_budget_mb * _MB / len(parts)  # Every part buffers at once.
    buffer_size = min(buffer_size, int(budget / element))
    # A worker holds the chunk it computes plus its buffered ones; the
    # consumer holds about as much again while it reassembles them. Smaller
    # chunks fit a tight budget without giving up workers.
    per_chunk_element = 2 * (per_worker_buffer + 1) * element
    chunk = _steady_chunk_elements(map_ds, samples, seconds, num_workers)
    if num_workers and num_workers * chunk * per_chunk_element > budget:
      fit = int(budget / (num_workers * per_chunk_element))
      if fit < 1:
        num_workers, fit = int(budget / per_chunk_element), 1
      # chunk_size counts source records, like the engine's other chunk sizes.
      records = fit * map_ds._records_per_element  # pylint: disable=protected-access
      chunk_records = records if chunk_records is None else min(chunk_records, records)
  return PerformanceConfig(
      multiprocessing_options=options_lib.MultiprocessingOptions(num_workers=max(0, num_workers),
                                                                 chunk_size=chunk_records),
      read_options=options_lib.ReadOptions(prefetch_buffer_size=max(0, buffer_size)))
