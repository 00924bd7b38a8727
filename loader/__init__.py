"""Globally shuffled, checkpointable, multi-process loading of ArrayRecord data.

`loader` has Grain 0.2.18's public API, so Grain code ports by changing the
import line — `import loader as grain` for `import grain`, and
`import loader.python as grain` for `import grain.python as grain`::

  import loader as grain

  src = grain.sources.ArrayRecordDataSource(["/data/train-00000-of-00008.array_record", ...])
  ds = (grain.MapDataset.source(src)
        .shuffle(seed=42)
        .map(parse)
        .batch(256, drop_remainder=True)
        .repeat())
  ds = ds.to_iter_dataset().mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=8))
  it = iter(ds)
  batch = next(it)
  state = it.get_state()                              # JSON-able; it.set_state(state) resumes

Unlike Grain, the produced stream is identical for every worker count and
prefetch setting, and a checkpoint taken with one worker count resumes with
any other. `loader.ArrayRecordSource` also reads directories (via the
converter's manifest) and glob patterns, and `loader.save_state` /
`restore_state` write checkpoints as small JSON files.

Importing this package never imports TensorFlow, JAX, Grain, Beam or pyarrow,
and stays cheap: the namespaces below are imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

from loader import grain_interop
from loader.config import config
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

grain_interop.install()  # Keras and others that accept Grain's datasets accept these too.

# The Grain release whose API this package implements, under Grain's names:
# client code that records or checks `grain.__version__` runs unchanged. The
# toolkit's own version: importlib.metadata.version("arrayrecord-toolkit").
__version__ = "0.2.18"
__version_info__ = (0, 2, 18)

# name -> (module, attribute; None for the module itself). Imported on first
# access: the submodules pull in more of the engine (data_loader, checkpoint)
# or, for `jax`, JAX when used, and none of it belongs in `import loader` — a
# worker process or a tool that only builds pipelines should not pay for it.
_LAZY: dict[str, tuple[str, str | None]] = {
    # Grain's top-level names.
    "DataLoader": ("loader.data_loader", "DataLoader"),
    "DataLoaderIterator": ("loader.data_loader", "DataLoaderIterator"),
    "Record": ("loader.record", "Record"),
    "RecordMetadata": ("loader.record", "RecordMetadata"),
    "load": ("loader.data_loader", "load"),
    "checkpoint": ("loader.checkpoint", None),
    "constants": ("loader.constants", None),
    "experimental": ("loader.experimental", None),
    "multiprocessing": ("loader.multiprocessing", None),
    "samplers": ("loader.samplers", None),
    "sharding": ("loader.sharding", None),
    "sources": ("loader.sources", None),
    "transforms": ("loader.transforms", None),
    # grain.python's mirror, for `import loader.python as grain`.
    "python": ("loader.python", None),
    # loader's own.
    "jax": ("loader.jax", None),
    "restore_state": ("loader.checkpoint", "restore_state"),
    "save_state": ("loader.checkpoint", "save_state"),
}

__all__ = sorted([
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
    "config",
    "parse_example",
    *_LAZY,
])


def _lazy_attribute(module_name: str, table: dict[str, tuple[str, str | None]], name: str) -> Any:
  """Resolves `name` of `module_name` from its lazy `table`; AttributeError if absent.

  Shared by `loader` and `loader.python`, whose `__getattr__` call it.
  """
  target = table.get(name)
  if target is None:
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
  module = importlib.import_module(target[0])
  return module if target[1] is None else getattr(module, target[1])


def __getattr__(name: str) -> Any:
  value = _lazy_attribute(__name__, _LAZY, name)
  globals()[name] = value  # Later lookups skip __getattr__.
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY))
