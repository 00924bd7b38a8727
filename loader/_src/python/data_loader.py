"""`grain._src.python.data_loader`: the legacy DataLoader (loader's, the same objects as `loader.*`)."""

import os

from loader.data_loader import DataLoader
from loader.data_loader import DataLoaderIterator

PyGrainDatasetIterator = DataLoaderIterator


def _determine_worker_count(input_worker_count: int | None) -> int:
  """Worker processes a DataLoader starts for `worker_count` (None: one per CPU), as Grain's."""
  if input_worker_count is not None:
    return int(input_worker_count)
  cpus = os.cpu_count()
  if cpus is None:
    raise ValueError("Can't determine the number of CPUs; pass worker_count explicitly.")
  return cpus


__all__ = ["DataLoader", "DataLoaderIterator", "PyGrainDatasetIterator", "_determine_worker_count"]
