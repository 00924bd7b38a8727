"""Grain 0.2.18's `grain.experimental` namespace: `from loader import experimental`.

Every name is imported on first access from the module that implements it
(one operation per module, mostly under `loader.transformations`), so
`import loader.experimental` costs nothing: pyarrow and JAX load only when
a Parquet file is opened or `device_put` is called.

Names Grain has that loader does not support raise AttributeError saying why
(see `UNSUPPORTED`).
"""

from __future__ import annotations

import importlib
from typing import Any

_T = "loader.transformations."

# name -> (module, attribute).
_NAMES: dict[str, tuple[str, str]] = {
    # Transform base classes, under grain.experimental's aliases.
    "FlatMapTransform": ("loader.transforms", "FlatMap"),
    "MapWithIndexTransform": ("loader.transforms", "MapWithIndex"),
    "apply_transformations": ("loader.apply", "apply_transformations"),
    "index_shuffle": ("loader.permutation", "index_shuffle"),
    "RngPool": ("loader.rng_pool", "RngPool"),
    # Sources that are read front to back.
    "ParquetIterDataset": ("loader.iter_sources.parquet", "ParquetIterDataset"),
    "TFRecordIterDataset": ("loader.iter_sources.tfrecord", "TFRecordIterDataset"),
    # One element into many, and stream shaping.
    "FlatMapMapDataset": (_T + "flatmap", "FlatMapMapDataset"),
    "FlatMapIterDataset": (_T + "flatmap", "FlatMapIterDataset"),
    "LimitIterDataset": (_T + "limit", "LimitIterDataset"),
    "RepeatIterDataset": (_T + "repeat_iter", "RepeatIterDataset"),
    "RebatchIterDataset": (_T + "rebatch", "RebatchIterDataset"),
    "CacheIterDataset": (_T + "cache", "CacheIterDataset"),
    "batch_and_pad": (_T + "batch_and_pad", "batch_and_pad"),
    # Packing for sequence models.
    "FirstFitPackIterDataset": (_T + "packing", "FirstFitPackIterDataset"),
    "BestFitPackIterDataset": (_T + "packing", "BestFitPackIterDataset"),
    "ConcatThenSplitIterDataset": (_T + "concat_then_split", "ConcatThenSplitIterDataset"),
    "PackAndBatchOperation": (_T + "pack_and_batch", "PackAndBatchOperation"),  # DataLoader operations=[...].
    "BOSHandling": (_T + "concat_then_split", "BOSHandling"),
    # Combining and reordering datasets.
    "InterleaveIterDataset": (_T + "interleave", "InterleaveIterDataset"),
    "WindowShuffleMapDataset": (_T + "window_shuffle", "WindowShuffleMapDataset"),
    "WindowShuffleIterDataset": (_T + "window_shuffle", "WindowShuffleIterDataset"),
    "ZipMapDataset": (_T + "zip", "ZipMapDataset"),
    "ZipIterDataset": (_T + "zip", "ZipIterDataset"),
    # Prefetching, devices, tuning, re-sharding.
    "ThreadPrefetchIterDataset": ("loader.sequential", "ThreadPrefetchIterDataset"),
    "ThreadPrefetchDatasetIterator": ("loader.sequential", "ThreadPrefetchDatasetIterator"),
    "multithread_prefetch": (_T + "multithread_prefetch", "multithread_prefetch"),
    # Per-pipeline options.
    "DatasetOptions": ("loader.dataset_options", "DatasetOptions"),
    "ExecutionTrackingMode": ("loader.dataset_options", "ExecutionTrackingMode"),
    "WithOptionsIterDataset": (_T + "with_options", "WithOptionsIterDataset"),
    "device_put": (_T + "device_put", "device_put"),
    "ElasticIterator": (_T + "elastic", "ElasticIterator"),
    "pick_performance_config": (_T + "perf_config", "pick_performance_config"),
    "PerformanceConfig": (_T + "perf_config", "PerformanceConfig"),
    # Grain's test helper for pipelines that checkpoint.
    "assert_equal_output_after_checkpoint": ("loader.testing", "assert_equal_output_after_checkpoint"),
    # Positions of MapDataset-part iterators, without computing elements.
    "get_next_index": ("loader.dataset_iterator", "get_next_index"),
    "set_next_index": ("loader.dataset_iterator", "set_next_index"),
    # Shapes and dtypes of the elements, without reading any.
    "get_element_spec": ("loader.element_spec", "get_element_spec"),
    "ShapeDtypeStruct": ("loader.element_spec", "ShapeDtypeStruct"),
    "ShapeDtypeStructProtocol": ("loader.element_spec", "ShapeDtypeStructProtocol"),
}

# Grain 0.2.18 names loader does not provide -> why, and what to use instead.
UNSUPPORTED: dict[str, str] = {}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
  target = _NAMES.get(name)
  if target is None:
    if name in UNSUPPORTED:
      raise AttributeError(
          f"loader.experimental has no {name!r}: Grain 0.2.18's grain.experimental.{name} is not "
          f"supported ({UNSUPPORTED[name]}).")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  module_name, attribute = target
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name != module_name:
      raise  # A dependency of the module is missing: say which.
    raise AttributeError(f"loader.experimental.{name} is not available in this build ({module_name} is missing).") from e
  value = getattr(module, attribute)
  globals()[name] = value  # Later lookups skip __getattr__.
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_NAMES))
