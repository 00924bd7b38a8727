"""Globally shuffled, checkpointable, multi-process loading of ArrayRecord data.

The API mirrors Grain's names, so Grain-style code ports by changing the
import::

  import loader

  src = loader.ArrayRecordSource("/data/train")        # dir, glob or files
  ds = (loader.MapDataset.source(src)
        .shuffle(seed=42)
        .map(parse)
        .batch(256, drop_remainder=True)
        .repeat())
  ds = ds.to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=8))
  it = iter(ds)
  batch = next(it)
  loader.save_state("ckpt/data.json", it)             # resume exactly later

Unlike Grain, the produced stream is identical for every worker count and
prefetch setting, and a checkpoint taken with one worker count resumes with
any other. Importing this package never imports TensorFlow, JAX or Grain;
`loader.jax` (device placement) imports JAX only when its functions run.
"""

from __future__ import annotations

import importlib
from typing import Any

from loader.checkpoint import restore_state
from loader.checkpoint import save_state
from loader.example import FixedLenFeature
from loader.example import VarLenFeature
from loader.example import parse_example
from loader.iter_dataset import DatasetIterator
from loader.iter_dataset import IterDataset
from loader.map_dataset import MapDataset
from loader.mp_prefetch import WorkerError
from loader.options import MultiprocessingOptions
from loader.options import ReadOptions
from loader.source import ArrayRecordSource
from loader.source import RandomAccessDataSource

__all__ = [
    "ArrayRecordSource",
    "DatasetIterator",
    "FixedLenFeature",
    "IterDataset",
    "MapDataset",
    "MultiprocessingOptions",
    "RandomAccessDataSource",
    "ReadOptions",
    "VarLenFeature",
    "WorkerError",
    "jax",
    "parse_example",
    "restore_state",
    "save_state",
]


def __getattr__(name: str) -> Any:
  # `loader.jax` is imported on first access: the module itself only imports
  # JAX inside its functions, but keeping it out of `import loader` keeps
  # worker start-up lean and avoids shadowing confusion with the real `jax`.
  if name == "jax":
    return importlib.import_module("loader.jax")
  raise AttributeError(f"module 'loader' has no attribute {name!r}")
