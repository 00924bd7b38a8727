"""Grain 0.2.18's `grain.python` namespace: `import loader.python as grain`.

Grain keeps `grain.python` for backwards compatibility; it holds the
top-level names plus the legacy spellings listed below (the same classes under
their old names, so `isinstance` checks agree with the new names):

  MapTransform, FilterTransform, RandomMapTransform, MapWithIndexTransform
      = loader.transforms.Map, Filter, RandomMap, MapWithIndex
  InMemoryDataSource        = loader.sources.SharedMemoryDataSource
  PyGrainDatasetIterator    = loader.DataLoaderIterator
  PyGrainCheckpointHandler, PyGrainCheckpointSave, PyGrainCheckpointRestore
      = loader.checkpoint.CheckpointHandler, CheckpointSave, CheckpointRestore
"""

from __future__ import annotations

from typing import Any

from loader import DatasetIterator
from loader import IterDataset
from loader import MapDataset
from loader import MultiprocessingOptions
from loader import RandomAccessDataSource
from loader import ReadOptions
from loader import config
from loader import _lazy_attribute
from loader.constants import DATASET_INDEX
from loader.constants import EPOCH
from loader.constants import INDEX
from loader.constants import META_FEATURES
from loader.constants import RECORD
from loader.constants import RECORD_KEY
from loader.constants import SEED

# Imported on first access, like `loader`'s namespaces (see loader/__init__.py):
# these modules load the DataLoader, transforms and checkpoint machinery.
_LAZY: dict[str, tuple[str, str | None]] = {
    "ArrayRecordDataSource": ("loader.sources", "ArrayRecordDataSource"),
    "InMemoryDataSource": ("loader.sources", "SharedMemoryDataSource"),
    "RangeDataSource": ("loader.sources", "RangeDataSource"),
    "SharedMemoryArray": ("loader.multiprocessing", "SharedMemoryArray"),
    "Batch": ("loader.transforms", "Batch"),
    "DatasetSelectionMap": ("loader.transforms", "DatasetSelectionMap"),
    "FilterTransform": ("loader.transforms", "Filter"),
    "MapTransform": ("loader.transforms", "Map"),
    "MapWithIndexTransform": ("loader.transforms", "MapWithIndex"),
    "RandomMapTransform": ("loader.transforms", "RandomMap"),
    "Transformation": ("loader.transforms", "Transformation"),
    "Transformations": ("loader.transforms", "Transformations"),
    "BatchOperation": ("loader.operations", "BatchOperation"),
    "FilterOperation": ("loader.operations", "FilterOperation"),
    "MapOperation": ("loader.operations", "MapOperation"),
    "Operation": ("loader.operations", "Operation"),
    "RandomMapOperation": ("loader.operations", "RandomMapOperation"),
    "DataLoader": ("loader.data_loader", "DataLoader"),
    "PyGrainDatasetIterator": ("loader.data_loader", "DataLoaderIterator"),
    "load": ("loader.data_loader", "load"),
    "Record": ("loader.record", "Record"),
    "RecordMetadata": ("loader.record", "RecordMetadata"),
    "IndexSampler": ("loader.samplers", "IndexSampler"),
    "Sampler": ("loader.samplers", "Sampler"),
    "SequentialSampler": ("loader.samplers", "SequentialSampler"),
    "NoSharding": ("loader.sharding", "NoSharding"),
    "ShardByJaxProcess": ("loader.sharding", "ShardByJaxProcess"),
    "ShardOptions": ("loader.sharding", "ShardOptions"),
    "PyGrainCheckpointHandler": ("loader.checkpoint", "CheckpointHandler"),
    "PyGrainCheckpointSave": ("loader.checkpoint", "CheckpointSave"),
    "PyGrainCheckpointRestore": ("loader.checkpoint", "CheckpointRestore"),
    "experimental": ("loader.python.experimental", None),
}

__all__ = sorted([
    "DATASET_INDEX",
    "DatasetIterator",
    "EPOCH",
    "INDEX",
    "IterDataset",
    "META_FEATURES",
    "MapDataset",
    "MultiprocessingOptions",
    "RECORD",
    "RECORD_KEY",
    "RandomAccessDataSource",
    "ReadOptions",
    "SEED",
    "config",
    *_LAZY,
])


def __getattr__(name: str) -> Any:
  value = _lazy_attribute(__name__, _LAZY, name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY))
