"""Grain's private module paths that real client code imports, mapped onto loader.

Porting by import line turns `from grain._src.python.X import Y` into
`from loader._src.python.X import Y`. Clients do import Grain's private
modules: MaxText subclasses its TFRecord reader, axlearn and xlstm-jax import
`transformations.packing`, `transformations.prefetch`, `core.sharding`,
`dataset.stats` or `data_loader._determine_worker_count`, others `dataset`
for type hints. Three modules are files here (they define classes of their
own); every other path in `_MODULES` is made on import by `_Finder`, and
its names resolve on first use to the very objects loader's public API
exports. A name loader lacks raises AttributeError naming the Grain module
(`from ... import name` turns that into an ImportError).
Nothing in loader imports this package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

# Grain 0.2.18 module (under grain._src) -> {name: "loader module:attribute"}.
_MODULES: dict[str, dict[str, str]] = {
    "core.config": {"config": "loader.config:config"},
    "core.constants": {n: f"loader.constants:{n}" for n in (
        "DATASET_INDEX", "EPOCH", "INDEX", "META_FEATURES", "RECORD", "RECORD_KEY", "SEED")},
    "core.sharding": {n: f"loader.sharding:{n}" for n in (
        "ShardOptions", "NoSharding", "ShardByJaxProcess", "even_split", "get_process_index_and_count")},
    "core.transforms": {n: f"loader.transforms:{n}" for n in (
        "Map", "RandomMap", "MapWithIndex", "TfRandomMap", "Filter", "FlatMap", "Batch")},
    "python.checkpoint.base": {n: f"loader.checkpoint:{n}" for n in ("background_save", "background_load")},
    "python.checkpoint.handler": {"CheckpointHandler": "loader.checkpoint:CheckpointHandler"},
    "python.data_sources": {n: f"loader.sources:{n}" for n in (
        "ArrayRecordDataSource", "RangeDataSource", "SharedMemoryDataSource")},
    "python.dataset.base": {
        "RandomAccessDataSource": "loader:RandomAccessDataSource",
        "DatasetSelectionMap": "loader.transforms:DatasetSelectionMap",
        "ExecutionTrackingMode": "loader.experimental:ExecutionTrackingMode",
        "DatasetOptions": "loader.experimental:DatasetOptions",
    },
    "python.dataset.elastic_iterator": {"ElasticIterator": "loader.experimental:ElasticIterator"},
    "python.dataset.sources.parquet_dataset": {"ParquetIterDataset": "loader.experimental:ParquetIterDataset"},
    "python.dataset.stats": {n: f"loader.stats:{n}" for n in (
        "Stats", "pretty_format_summary", "record_next_duration_if_output", "Timer")},
    "python.dataset.transformations.batch": {
        "batch_and_pad": "loader.experimental:batch_and_pad",
        "make_batch": "loader.batching:make_batch",
        "BatchMapDataset": "loader.map_dataset:BatchMapDataset",
        "BatchIterDataset": "loader.sequential:BatchIterDataset",
    },
    "python.dataset.transformations.cache": {"CacheIterDataset": "loader.experimental:CacheIterDataset"},
    "python.dataset.transformations.filter": {
        "FilterMapDataset": "loader.map_dataset:FilterMapDataset",
        "FilterIterDataset": "loader.sequential:FilterIterDataset",
    },
    "python.dataset.transformations.flatmap": {n: f"loader.experimental:{n}" for n in (
        "FlatMapMapDataset", "FlatMapIterDataset")},
    "python.dataset.transformations.interleave": {
        "InterleaveIterDataset": "loader.experimental:InterleaveIterDataset"},
    "python.dataset.transformations.limit": {"LimitIterDataset": "loader.experimental:LimitIterDataset"},
    "python.dataset.transformations.map": {
        "RngPool": "loader.experimental:RngPool",
        **{n: f"loader.map_dataset:{n}" for n in ("MapMapDataset", "RandomMapMapDataset", "MapWithIndexMapDataset")},
        **{n: f"loader.sequential:{n}" for n in ("MapIterDataset", "RandomMapIterDataset", "MapWithIndexIterDataset")},
    },
    "python.dataset.transformations.mix": {
        "MixedMapDataset": "loader.transformations.mix:MixedMapDataset",
        "MixedIterDataset": "loader.transformations.mix:MixedIterDataset",
        "ConcatenateMapDataset": "loader.transformations.concatenate:ConcatenateMapDataset",
    },
    "python.dataset.transformations.packing": {n: f"loader.experimental:{n}" for n in (
        "FirstFitPackIterDataset", "BestFitPackIterDataset")},
    "python.dataset.transformations.packing_concat_then_split": {n: f"loader.experimental:{n}" for n in (
        "BOSHandling", "ConcatThenSplitIterDataset")},
    "python.dataset.transformations.prefetch": {
        # What MapDataset.to_iter_dataset() makes: the same constructor (parent, *, read_options, allow_nones).
        "PrefetchIterDataset": "loader.iter_dataset:MapBackedIterDataset",
        **{n: f"loader.experimental:{n}" for n in (
            "ThreadPrefetchIterDataset", "ThreadPrefetchDatasetIterator", "multithread_prefetch")}},
    # Read by clients that tune worker shutdown; loader's own grace period.
    "python.dataset.transformations.process_prefetch": {"_PROCESS_KILL_TIMEOUT_S": "loader.mp_prefetch:_STOP_GRACE_S"},
    "python.dataset.transformations.prefetch_autotune": {n: f"loader.experimental:{n}" for n in (
        "PerformanceConfig", "pick_performance_config")},
    "python.dataset.transformations.rebatch": {"RebatchIterDataset": "loader.experimental:RebatchIterDataset"},
    "python.dataset.transformations.repeat": {
        "RepeatIterDataset": "loader.experimental:RepeatIterDataset",
        "RepeatMapDataset": "loader.map_dataset:RepeatMapDataset",
    },
    "python.dataset.transformations.shuffle": {
        "ShuffleMapDataset": "loader.map_dataset:ShuffleMapDataset",
        "WindowShuffleMapDataset": "loader.experimental:WindowShuffleMapDataset",
        "WindowShuffleIterDataset": "loader.experimental:WindowShuffleIterDataset",
    },
    "python.dataset.transformations.slice": {"SliceMapDataset": "loader.map_dataset:SliceMapDataset"},
    "python.dataset.transformations.source": {"SourceMapDataset": "loader.map_dataset:SourceMapDataset"},
    "python.dataset.transformations.zip": {n: f"loader.experimental:{n}" for n in (
        "ZipMapDataset", "ZipIterDataset")},
    "python.experimental.device_put.device_put": {"device_put": "loader.experimental:device_put"},
    "python.experimental.example_packing.packing": {
        "PackAndBatchOperation": "loader.experimental:PackAndBatchOperation"},
    "python.experimental.index_shuffle.python.index_shuffle_module": {
        "index_shuffle": "loader.experimental:index_shuffle"},
    # SharedMemoryArrayMetadata: for Keras's Grain adapter's `isinstance` check; loader makes none.
    "python.ipc.shared_memory_array": {
        "SharedMemoryArray": "loader.multiprocessing:SharedMemoryArray",
        "SharedMemoryArrayMetadata": "loader.multiprocessing:_SharedMemoryArrayMetadata",
    },
    "python.load": {"load": "loader:load"},
    "python.operations": {n: f"loader.python:{n}" for n in (
        "Operation", "MapOperation", "RandomMapOperation", "FilterOperation", "BatchOperation")},
    "python.options": {n: f"loader:{n}" for n in ("ReadOptions", "MultiprocessingOptions")},
    "python.record": {n: f"loader:{n}" for n in ("Record", "RecordMetadata")},
    "python.samplers": {n: f"loader.samplers:{n}" for n in ("Sampler", "SequentialSampler", "IndexSampler")},
    "python.testing.experimental": {
        "assert_equal_output_after_checkpoint": "loader.experimental:assert_equal_output_after_checkpoint"},
}

# Packages on the way to those modules that are not folders here.
_PACKAGES = {".".join(m.split(".")[:i]) for m in _MODULES for i in range(1, m.count(".") + 1)}


def resolve(target: str) -> Any:
  """The object a `_MODULES` entry names ("module:attribute")."""
  module, _, attribute = target.partition(":")
  return getattr(importlib.import_module(module), attribute)


def _make_module(module: types.ModuleType, relative: str) -> None:
  names = _MODULES.get(relative, {})
  grain_name = f"grain._src.{relative}"

  def __getattr__(name: str) -> Any:  # pylint: disable=invalid-name
    target = names.get(name)
    if target is None:
      raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}: loader maps only the names of "
                           f"{grain_name} that clients use ({', '.join(sorted(names)) or 'none'}); "
                           "use loader's public API instead.")
    value = resolve(target)
    setattr(module, name, value)  # Resolved once.
    return value

  module.__getattr__ = __getattr__
  module.__all__ = sorted(names)
  module.__doc__ = f"`{grain_name}`: {', '.join(sorted(names)) or 'a package'} (loader's objects); see loader._src."


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Makes the modules of `_MODULES` (and their packages) that have no file here."""

  loader_src_finder = True  # Recognised across reloads of this module.

  _PREFIX = __name__ + "."

  def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
    if not fullname.startswith(self._PREFIX):
      return None
    relative = fullname[len(self._PREFIX):]
    if relative not in _MODULES and relative not in _PACKAGES:
      return None
    return importlib.machinery.ModuleSpec(fullname, self, is_package=relative in _PACKAGES)

  def create_module(self, spec):
    return None  # The default module object.

  def exec_module(self, module):
    _make_module(module, module.__name__[len(self._PREFIX):])


# After the path finders, so the files here win.
if not any(getattr(f, "loader_src_finder", False) for f in sys.meta_path):
  sys.meta_path.append(_Finder())
