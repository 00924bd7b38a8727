"""Grain's legacy `DataLoader`, built on loader's engine.

`DataLoader(data_source=..., sampler=..., operations=[...], worker_count=N)`
becomes one pipeline::

  MapDataset over sampler positions (records wrapped in `Record`s)
    -> the operations as map/filter/batch, folded into the MapDataset while
       they are random access (up to the first batch that follows a filter,
       FlatMap or custom Operation)
    -> .to_iter_dataset(read_options) -> the remaining operations, sequential
    -> .map(record.data) -> .mp_prefetch(num_workers=N) when N > 0

so the stream is the one `worker_count=0` gives, whatever N: unlike Grain,
batches never mix per-worker streams, and a checkpoint restores with any
worker count. Elements, counts and per-shard element sets match Grain's; a
shuffled sampler visits each epoch's records in a different order (our
permutation), and strided DataLoader sharding of a shuffled unsharded sampler
therefore gives each shard different records than Grain's (the union is the
same).

Checkpoints. `DataLoaderIterator.get_state()` returns JSON bytes like Grain's,
holding the engine state plus what the position means (sampler, data source,
shard, operation chain). `set_state` refuses a state of another pipeline with a
one-line error naming the difference. It also reads the states Grain 0.2.18's
DataLoader writes: a Grain state is resumed at exactly Grain's position when
our pipeline can express it (the consumed records form a prefix of the stream,
in the same order), and refused with an explanation otherwise.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from loader import batching
from loader import checks
from loader import checkpoint as checkpoint_lib
from loader import iter_dataset
from loader import map_dataset
from loader import operations as ops
from loader import options as options_lib
from loader import record
from loader import samplers as samplers_lib
from loader import sharding
from loader import transforms
from loader.transformations import flatmap

_STATE_FORMAT = "arrayrecord-toolkit/DataLoader"
_STATE_VERSION = 1
_GRAIN_STATE_VERSION = 2
_GRAIN_STATE_KEYS = {"version", "last_seen_indices", "last_worker_index", "worker_count", "sampler", "data_source"}


# ---- Operations on records ---------------------------------------------------
# Small picklable callables (workers receive them) that apply a user transform
# to a record's data and keep its metadata, as Grain's DataLoader does.


class _MapData:

  def __init__(self, fn: Callable[[Any], Any]):
    self.fn = fn
    self.__name__ = checks.fn_name(fn)

  def __call__(self, r: record.Record) -> record.Record:
    return record.Record(r.metadata, self.fn(r.data))


class _RandomMapData(_MapData):
  # The rng is the record's own (seeded from the sampler seed and its index);
  # successive random ops on one record share and advance it, as in Grain.

  def __call__(self, r: record.Record) -> record.Record:
    return record.Record(r.metadata, self.fn(r.data, r.metadata.rng))


class _MapDataWithIndex(_MapData):

  def __call__(self, r: record.Record) -> record.Record:
    return record.Record(r.metadata, self.fn(r.metadata.index, r.data))


class _LegacyMap(_MapData):
  # `fn` is MapOperation.apply / RandomMapOperation.apply: record -> record.

  def __call__(self, r: record.Record) -> record.Record:
    return self.fn(r)


class _FilterData(_MapData):

  def __call__(self, r: record.Record) -> bool:
    return self.fn(r.data)


class _LegacyFilter(_FilterData):

  def __call__(self, r: record.Record) -> bool:
    return self.fn(r)


class _BatchRecords:
  """Batches records' data; the batch keeps the last record's metadata (no key)."""

  def __init__(self, batch_fn: Callable[[Sequence[Any]], Any] | None):
    self.batch_fn = batch_fn or batching.make_batch
    self.__name__ = checks.fn_name(self.batch_fn)

  def __call__(self, records: Sequence[record.Record]) -> record.Record:
    return record.Record(records[-1].metadata.remove_record_key(), self.batch_fn([r.data for r in records]))


def _record_data(r: record.Record) -> Any:
  return r.data


# ---- Classifying operations ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Op:
  """One entry of `operations`, resolved: what it is and the function to run."""

  kind: str  # map, random_map, map_with_index, filter, batch, flat_map, operation
  fn: Any
  batch_size: int = 0
  drop_remainder: bool = False
  max_fan_out: int | None = None

  @property
  def descriptor(self) -> str:
    # Part of the checkpoint fingerprint: what changes the meaning of a
    # position (the chain of kinds, batch sizes), not function names, so
    # renaming a transform class keeps old checkpoints usable.
    if self.kind == "batch":
      return f"batch({self.batch_size}, drop_remainder={self.drop_remainder})"
    if self.kind == "flat_map":
      return f"flat_map(max_fan_out={self.max_fan_out})"
    return self.kind


_VALID_OPERATIONS = ("transforms.Map, RandomMap, TfRandomMap, MapWithIndex, Filter, FlatMap, Batch "
                     "(loader's, Grain's or duck-typed), a legacy *Operation, or a callable from an "
                     "iterator of Records to one")


def _grain_legacy_name(op: Any) -> str:
  # Grain's own legacy operation classes, recognised without importing Grain.
  return type(op).__name__ if type(op).__module__.startswith("grain.") else ""


def _resolve(op: Any, position: int) -> _Op:
  """What `operations[position]` is, in the order Grain's DataLoader checks it."""
  what = f"DataLoader operations[{position}]"
  for method, kind in (("map", "map"), ("random_map", "random_map"), ("np_random_map", "random_map"),
                       ("flat_map", "flat_map"), ("filter", "filter"), ("map_with_index", "map_with_index")):
    if callable(getattr(op, method, None)):
      fn = checks.resolve_fn(op, method, what)
      if kind == "flat_map":
        fan_out = getattr(op, "max_fan_out", None)
        return _Op(kind, fn, max_fan_out=None if fan_out is None else checks.check_int(
            fan_out, f"{what}.max_fan_out", minimum=1))
      return _Op(kind, fn)
  legacy = _grain_legacy_name(op)
  is_batch = (isinstance(op, (transforms.Batch, ops.BatchOperation)) or legacy in ("Batch", "BatchOperation")
              or (hasattr(op, "batch_size") and not callable(op)))  # Duck-typed Batch.
  if is_batch:
    batch_fn = getattr(op, "batch_fn", None)
    if legacy == "BatchOperation" and getattr(batch_fn, "__name__", "") == "_default_batch_fn":
      batch_fn = None  # Grain's np.stack default: ours stacks the same numeric leaves.
    return _Op("batch", batch_fn,
               batch_size=checks.check_int(op.batch_size, f"{what}.batch_size", minimum=1),
               drop_remainder=bool(getattr(op, "drop_remainder", False)))
  if isinstance(op, ops.MapOperation) or legacy == "MapOperation":
    return _Op("map", _LegacyMap(ops.MapOperation(op.map_function).apply))
  if isinstance(op, ops.RandomMapOperation) or legacy == "RandomMapOperation":
    return _Op("random_map", _LegacyMap(ops.RandomMapOperation(op.random_map_function).apply))
  if isinstance(op, ops.FilterOperation) or legacy == "FilterOperation":
    return _Op("filter", _LegacyFilter(ops.FilterOperation(op.condition_function).keep))
  if isinstance(op, type):
    raise TypeError(f"{what} is the class {op.__name__}; pass an instance, e.g. {op.__name__}().")
  if callable(op):
    return _Op("operation", op)
  raise TypeError(f"{what} is {op!r}; expected {_VALID_OPERATIONS}.")


def _apply(ds: Any, op: _Op, lean: bool) -> Any:
  """`ds` (MapDataset or IterDataset) with `op` applied, on elements or on records."""
  if op.kind == "batch":
    return ds.batch(op.batch_size, drop_remainder=op.drop_remainder, batch_fn=op.fn if lean else _BatchRecords(op.fn))
  if op.kind == "filter":
    return ds.filter(op.fn if lean or isinstance(op.fn, _LegacyFilter) else _FilterData(op.fn))
  if op.kind == "flat_map":
    return flatmap.FlatMapIterDataset(ds, _SplitRecord(op.fn, op.max_fan_out))
  if op.kind == "operation":
    return _OperationIterDataset(ds, op.fn)
  if lean or isinstance(op.fn, _LegacyMap):
    return ds.map(op.fn)
  return ds.map({"map": _MapData, "random_map": _RandomMapData, "map_with_index": _MapDataWithIndex}[op.kind](op.fn))


# ---- Sequential stages -----------------------------------------------------


class _SplitRecord:
  """FlatMap on a record, with the metadata Grain's DataLoader gives the parts.

  Part j of the record at index i gets index i * max_fan_out + j, no record
  key and no generator.
  """

  def __init__(self, fn: Callable[[Any], Sequence[Any]], max_fan_out: int | None):
    self.fn = fn
    self.max_fan_out = max_fan_out
    self.__name__ = checks.fn_name(fn)

  def __call__(self, r: record.Record) -> list[record.Record]:
    parts = list(self.fn(r.data))
    if self.max_fan_out is not None and len(parts) > self.max_fan_out:
      raise ValueError(f"FlatMap {checks.fn_name(self.fn)} split an element into {len(parts)} parts, "
                       f"more than its max_fan_out={self.max_fan_out}; raise max_fan_out.")
    base = r.metadata.index * (self.max_fan_out or 1)
    return [record.Record(record.RecordMetadata(index=base + j), x) for j, x in enumerate(parts)]


class _OperationIterDataset(iter_dataset.SequentialIterDataset):
  """A custom Operation (iterator of records -> iterator of records).

  As in Grain, the operation's own buffering is not checkpointed: the state
  is the parent's, so a restore right after a buffering operation consumed
  more input than it yielded skips those inputs.
  """

  def __init__(self, parent: iter_dataset.IterDataset, operation: Callable[[Iterator[Any]], Iterator[Any]]):
    super().__init__(parent)
    self._operation = operation

  def _op_repr(self) -> str:
    return f".operation({checks.fn_name(self._operation)})"

  def make_iterator(self, parent: iter_dataset.DatasetIterator) -> iter_dataset.DatasetIterator:
    return _OperationIterator(parent, self._operation)


class _OperationIterator(iter_dataset.DatasetIterator):

  def __init__(self, parent: iter_dataset.DatasetIterator, operation: Callable[[Iterator[Any]], Iterator[Any]]):
    super().__init__(parent)
    self._operation = operation
    self._iterator = iter(operation(_Pull(parent)))

  def __next__(self) -> Any:
    return next(self._iterator)

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)
    self._iterator = iter(self._operation(_Pull(self._parent)))


class _Pull:
  # A plain iterator over a DatasetIterator that the operation cannot close.

  def __init__(self, it: iter_dataset.DatasetIterator):
    self._it = it

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._it)


# ---- The sampler as a MapDataset -------------------------------------------


def _sampler_length(sampler: Any) -> int:
  if hasattr(sampler, "__len__"):
    return len(sampler)
  lo, hi = 0, sys.maxsize  # Grain's rule for samplers without a length.
  while lo < hi:
    mid = (lo + hi) // 2
    try:
      sampler[mid]  # pylint: disable=pointless-statement
      lo = mid + 1
    except IndexError:
      hi = mid
  return lo


class _SamplerMapDataset(map_dataset.MapDataset):
  """Position p of this shard -> Record of sampler index p * shard_count + shard_index."""

  def __init__(self, data_source: Any, sampler: Any, shard_options: sharding.ShardOptions, *, with_rng: bool,
               lean: bool):
    super().__init__(map_dataset.MapDataset.source(data_source))
    self._lean = lean  # Plain elements instead of Records.
    self._sampler = sampler
    self._shard_index = shard_options.shard_index
    self._shard_count = shard_options.shard_count
    self._len = _sampler_length(sampler) // self._shard_count
    # Our samplers give record keys for a whole chunk in one call and attach
    # a generator only when an operation can use it (Philox setup costs
    # microseconds per record); any other sampler is asked one index at a time.
    self._batched = isinstance(sampler, (samplers_lib.IndexSampler, samplers_lib.SequentialSampler))
    self._rng_seed = sampler._rng_seed if self._batched and with_rng else None  # pylint: disable=protected-access

  def __len__(self) -> int:
    return self._len

  def __repr__(self) -> str:
    return f"DataLoader({self._sampler!r}, shard={self._shard_index}/{self._shard_count})"

  def _op_repr(self) -> str:
    # Part of the engine's state description (loader.state).
    return f".sampler({self._sampler!r}, shard={self._shard_index}/{self._shard_count})"

  def _getitems(self, indices: np.ndarray) -> list[Any]:
    global_indices = indices * self._shard_count + self._shard_index
    if self._batched and self._lean:
      return self._parent._getitems(self._sampler._record_keys(global_indices))  # pylint: disable=protected-access
    if self._batched:
      keys = self._sampler._record_keys(global_indices)  # pylint: disable=protected-access
      seed = self._rng_seed
      metas = [record.RecordMetadata(index=g, record_key=k,
                                     rng=None if seed is None else samplers_lib.record_rng(seed, g))
               for g, k in zip(global_indices.tolist(), keys.tolist())]
    else:
      metas = [self._sampler[g] for g in global_indices.tolist()]
      keys = np.array([m.record_key for m in metas], dtype=np.int64)
    data = self._parent._getitems(keys)  # pylint: disable=protected-access
    if self._lean:
      return data
    return [record.Record(m, d) for m, d in zip(metas, data)]


# ---- DataLoader ------------------------------------------------------------


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(obj: Any) -> str:
  # Default reprs hold the object's address, which differs between runs and
  # would make every checkpoint foreign; the class name is what's compared.
  return _ADDRESS.sub("", repr(obj))


def _source_repr(source: Any) -> str:
  # As Grain: in-memory sequences are named by type, not printed.
  if isinstance(source, (list, tuple, np.ndarray)):
    return str(type(source))
  return _stable_repr(source)


def _grain_source_reprs(source: Any) -> set[str]:
  """The reprs Grain may have recorded for `source` in a checkpoint."""
  reprs = {_source_repr(source)}
  paths = getattr(source, "paths", None)
  if type(source).__name__ == "ArrayRecordDataSource" and isinstance(paths, (list, tuple)):
    # Grain's ArrayRecordDataSource names itself by a hash of its file paths.
    digest = hashlib.sha1()
    for p in paths:
      digest.update(os.fspath(p).encode())
    reprs.add(f"ArrayRecordDataSource(hash_of_paths={digest.hexdigest()})")
  return reprs


def _as_shard_options(value: Any, what: str) -> sharding.ShardOptions:
  if isinstance(value, sharding.ShardOptions):
    return value
  try:  # Grain's ShardOptions or any object with its fields.
    return sharding.ShardOptions(value.shard_index, value.shard_count, value.drop_remainder)
  except AttributeError:
    raise TypeError(f"{what} must be a loader.sharding.ShardOptions (got {value!r}).") from None


def _as_read_options(value: Any) -> options_lib.ReadOptions:
  if value is None or isinstance(value, options_lib.ReadOptions):
    return value or options_lib.ReadOptions()
  return options_lib.ReadOptions(num_threads=value.num_threads, prefetch_buffer_size=value.prefetch_buffer_size)


def _multiprocessing_options(worker_count: int, worker_buffer_size: int,
                             enable_profiling: bool) -> options_lib.MultiprocessingOptions:
  kwargs: dict[str, Any] = {"num_workers": worker_count, "per_worker_buffer_size": max(1, worker_buffer_size)}
  if "enable_profiling" in {f.name for f in dataclasses.fields(options_lib.MultiprocessingOptions)}:
    kwargs["enable_profiling"] = enable_profiling
  return options_lib.MultiprocessingOptions(**kwargs)


class DataLoader:
  """Reads `sampler`'s records from `data_source` and applies `operations`.

  Args:
    data_source: Random-access source (`__len__`, `__getitem__`), e.g.
      `loader.sources.ArrayRecordDataSource`, a TFDS data source or a list.
    sampler: `IndexSampler`/`SequentialSampler` or any object mapping a global
      index to a `RecordMetadata`.
    operations: Transformations applied in order (see `loader.transforms`).
    worker_count: Worker processes (0: in this process; None: os.cpu_count()).
      The produced stream does not depend on it.
    worker_buffer_size: Chunks each worker computes ahead.
    shard_options: This process's shard; None takes the sampler's.
    read_options: Reader threads and buffering in the computing process.
    enable_profiling: Passed to `MultiprocessingOptions` where supported.
  """

  def __init__(self, *, data_source: Any, sampler: Any, operations: Sequence[Any] = (),
               worker_count: int | None = 0, worker_buffer_size: int = 1,
               shard_options: sharding.ShardOptions | None = None,
               read_options: options_lib.ReadOptions | None = None, enable_profiling: bool = False):
    if worker_count is None:
      worker_count = os.cpu_count() or 1  # Grain's default.
    worker_count = checks.check_int(worker_count, "worker_count", minimum=0)
    worker_buffer_size = checks.check_int(worker_buffer_size, "worker_buffer_size", minimum=0)
    if shard_options is None:
      # Grain's older API kept sharding on the sampler.
      if getattr(sampler, "_shard_options", None) is None:
        raise ValueError("DataLoader needs shard_options, e.g. shard_options=loader.sharding.NoSharding() "
                         "(the sampler has none to take them from).")
      shard_options = sampler._shard_options  # pylint: disable=protected-access
    self._shard_options = _as_shard_options(shard_options, "shard_options")
    self._data_source = data_source
    self._sampler = sampler
    self._operations = [_resolve(op, i) for i, op in enumerate(operations)]
    self._read_options = _as_read_options(read_options)
    self._multiprocessing_options = _multiprocessing_options(worker_count, worker_buffer_size, enable_profiling)
    self._dataset = self._create_dataset()

  @property
  def multiprocessing_options(self) -> options_lib.MultiprocessingOptions:
    return self._multiprocessing_options

  def _create_dataset(self) -> iter_dataset.IterDataset:
    """The pipeline on loader's engine.

    Operations are folded into the MapDataset (random access: computed in
    workers, in parallel) until the first one that cannot be: a batch after
    a filter, a flat_map or a custom operation. The rest run sequentially.
    Sets `_num_positions` (sampler positions of this shard), `_prefix_len`
    (length of the folded MapDataset, whose index is the engine's position)
    and `_records_per_position` (sampler positions per folded position),
    which translate Grain's positions into ours.
    """
    # Records (data + metadata) are only needed when an operation can see the
    # metadata: random ops (the record's generator), map_with_index, flat_map
    # and legacy operations. Otherwise plain elements flow, which saves a
    # third of the per-element cost.
    lean = all(op.kind in ("map", "filter", "batch") and not isinstance(op.fn, (_LegacyMap, _LegacyFilter))
               for op in self._operations)
    with_rng = any(op.kind in ("random_map", "operation") for op in self._operations)
    ds = _SamplerMapDataset(self._data_source, self._sampler, self._shard_options, with_rng=with_rng, lean=lean)
    self._num_positions = len(ds)
    records_per_position = 1
    may_have_holes = False
    rest = list(self._operations)
    while rest and rest[0].kind in ("map", "random_map", "map_with_index", "filter", "batch"):
      op = rest[0]
      if op.kind == "batch":
        if may_have_holes:
          break  # A MapDataset cannot batch around filtered-out holes.
        records_per_position *= op.batch_size
      may_have_holes |= op.kind == "filter"
      ds = _apply(ds, op, lean)
      rest.pop(0)
    self._prefix_len, self._records_per_position = len(ds), records_per_position
    it_ds = ds.to_iter_dataset(self._read_options)
    for op in rest:
      it_ds = _apply(it_ds, op, lean)
    if not lean:
      it_ds = it_ds.map(_record_data)
    if self._multiprocessing_options.num_workers > 0:
      it_ds = it_ds.mp_prefetch(self._multiprocessing_options)
    return it_ds

  def __iter__(self) -> DataLoaderIterator:
    return DataLoaderIterator(self)

  # ---- Checkpoint fingerprint ----

  def _fingerprint(self) -> dict[str, Any]:
    """What a position means: a state only restores where all of this matches."""
    return {
        "sampler": _stable_repr(self._sampler),
        "data_source": _source_repr(self._data_source),
        "shard": [self._shard_options.shard_index, self._shard_options.shard_count],
        "operations": [op.descriptor for op in self._operations],
    }

  def _check_grain_state(self, state: dict[str, Any]) -> int:
    """Sampler positions (of this shard) a Grain DataLoader state has consumed.

    Raises ValueError unless the state resumes exactly here: same sampler and
    source (Grain's own check), no FlatMap, and consumed records forming a
    prefix of our stream in our order.
    """
    if state["version"] != _GRAIN_STATE_VERSION:
      raise ValueError(f"Grain DataLoader state version {state['version']!r} is not supported "
                       f"(loader reads Grain's version {_GRAIN_STATE_VERSION}).")
    for key, mine in (("sampler", {_stable_repr(self._sampler)}), ("data_source", _grain_source_reprs(self._data_source))):
      if _ADDRESS.sub("", str(state[key])) not in mine:
        raise ValueError(f"Grain DataLoader state is for another pipeline: {key} {state[key]!r} != "
                         f"this DataLoader's {' or '.join(map(repr, sorted(mine)))}.")
    if any(op.kind in ("flat_map", "operation") for op in self._operations):
      raise ValueError("Cannot resume a Grain DataLoader state in a pipeline with a FlatMap or a custom "
                       "Operation: Grain's positions there do not map onto loader's.")
    shard_index, shard_count = self._shard_options.shard_index, self._shard_options.shard_count
    grain_workers = checks.check_int(state["worker_count"], "Grain state worker_count", minimum=0)
    seen = state["last_seen_indices"]
    workers = max(grain_workers, 1)
    stride = workers * shard_count
    # Grain's worker w reads this shard's positions w, w + workers, ...;
    # last_seen is the global sampler index of the last one it read.
    consumed = [(int(seen[str(w)]) + stride - shard_index - w * shard_count) // stride for w in range(workers)]
    k = sum(consumed)
    if any(n != max(0, -(-(k - w) // workers)) for w, n in enumerate(consumed)):
      raise ValueError(
          f"Cannot resume this Grain state exactly: its {workers} workers had read {consumed} records each, "
          f"which is not the first {k} records of the stream (loader's stream does not depend on the worker "
          f"count). Restart from a loader checkpoint or from a Grain state taken with worker_count=0.")
    self._check_grain_order(k)
    return k

  def _check_grain_order(self, k: int) -> None:
    """Refuses a Grain position after which Grain had read other records than we would.

    Our `IndexSampler` shuffles with our own permutation, so after k records
    we have read the same records as Grain only at whole epochs: position p
    reads epoch-ordered key p when the sampler and the DataLoader shard alike.
    Other samplers are asked index by index, as Grain asks them.
    """
    sampler = self._sampler
    if not isinstance(sampler, samplers_lib.IndexSampler) or not sampler._shuffle or k == 0:  # pylint: disable=protected-access
      return
    if (sampler._shard_options.shard_count == self._shard_options.shard_count  # pylint: disable=protected-access
        and k % sampler._keys_per_epoch == 0):  # pylint: disable=protected-access
      return
    raise ValueError(
        f"Cannot resume this Grain state exactly: it stopped after {k} records, inside a shuffled epoch, and "
        "loader shuffles in a different order than Grain, so the rest of the epoch would repeat or miss "
        "records. Grain states of shuffled pipelines are accepted at epoch boundaries only.")


def _replace_position(state: Any, position: int) -> tuple[Any, int]:
  """`state` with its one prefix position ("next_index") set to `position`."""
  if isinstance(state, dict):
    out, found = {}, 0
    for key, value in state.items():
      if key == "next_index" and checks.is_int(value):
        out[key], hits = position, 1
      else:
        out[key], hits = _replace_position(value, position)
      found += hits
    return out, found
  return state, 0


def _decode(state: Any) -> dict[str, Any]:
  if isinstance(state, (bytes, bytearray)):
    state = state.decode()
  if isinstance(state, str):
    try:
      state = json.loads(state)
    except json.JSONDecodeError as e:
      raise ValueError(f"DataLoader state is not JSON ({e}); pass the bytes DataLoaderIterator.get_state() "
                       "returned.") from e
  if not isinstance(state, dict):
    raise ValueError(f"DataLoader state must be the JSON bytes DataLoaderIterator.get_state() returned "
                     f"(got {type(state).__name__}).")
  return state


class DataLoaderIterator(collections.abc.Iterator):
  """Iterator of a `DataLoader`, with Grain's bytes get_state()/set_state().

  Close it (or use it as a context manager) to stop worker processes early.
  """

  def __init__(self, data_loader: DataLoader, state: bytes | None = None):
    self._data_loader = data_loader
    self._iterator = iter(data_loader._dataset)  # pylint: disable=protected-access
    if state is not None:
      self.set_state(state)

  def __iter__(self) -> DataLoaderIterator:
    return self

  def __next__(self) -> Any:
    return next(self._iterator)

  def get_state(self) -> bytes:
    """The position as JSON bytes (write it to a file as is)."""
    state = {"format": _STATE_FORMAT, "version": _STATE_VERSION,
             **self._data_loader._fingerprint(),  # pylint: disable=protected-access
             "dataset": self._iterator.get_state()}
    return json.dumps(state, indent=1).encode()

  def set_state(self, state: bytes) -> None:
    """Moves to `state`: from this pipeline's `get_state()` (any worker count) or Grain's DataLoader."""
    state = _decode(state)
    if state.get("format") == _STATE_FORMAT:
      self._set_own_state(state)
    elif set(state) == _GRAIN_STATE_KEYS:
      self._set_grain_state(state)
    else:
      raise ValueError(f"Not a DataLoader state (keys {sorted(state)}); expected the bytes "
                       "DataLoaderIterator.get_state() returned, from loader or Grain 0.2.18.")

  def _set_own_state(self, state: dict[str, Any]) -> None:
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"DataLoader state version {state.get('version')!r} is not supported "
                       f"(this loader reads version {_STATE_VERSION}).")
    for key, mine in self._data_loader._fingerprint().items():  # pylint: disable=protected-access
      if state.get(key) != mine:
        raise ValueError(f"DataLoader state is for another pipeline: {key} {state.get(key)!r} != this "
                         f"DataLoader's {mine!r}.")
    self._iterator.set_state(state["dataset"])

  def _set_grain_state(self, state: dict[str, Any]) -> None:
    loader = self._data_loader
    k = loader._check_grain_state(state)  # pylint: disable=protected-access
    per, prefix_len = loader._records_per_position, loader._prefix_len  # pylint: disable=protected-access
    if k >= loader._num_positions:  # pylint: disable=protected-access
      position = prefix_len  # Grain had read everything.
    elif k % per == 0:
      position = k // per
    else:
      raise ValueError(f"Cannot resume this Grain state exactly: it stopped after {k} records, inside one of "
                       f"loader's batches of {per} records.")
    template, found = _replace_position(self._iterator.get_state(), position)
    if found != 1:
      raise RuntimeError(f"Cannot translate a Grain state: the engine state has {found} positions "
                         "('next_index'), expected 1.")
    self._iterator.set_state(template)

  def start_prefetch(self) -> None:
    """Starts computing elements in the background (idempotent; no-op where there is nothing to start)."""
    start = getattr(self._iterator, "start_prefetch", None)
    if start is not None:
      start()

  def close(self) -> None:
    """Stops worker processes and threads."""
    self._iterator.close()

  def __enter__(self) -> DataLoaderIterator:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # Orbax's StatefulCheckpointable protocol (orbax.checkpoint.v1), as Grain's.

  async def save(self, directory: Any):
    """Returns a coroutine that writes the current state under `directory`."""
    return checkpoint_lib.background_save(directory, self.get_state().decode())

  async def load(self, directory: Any):
    """Returns a coroutine that reads the state under `directory` and sets it."""
    return checkpoint_lib.background_load(directory, lambda text: self.set_state(text.encode()))

  def __str__(self) -> str:
    return f"DataLoaderIterator(state={self.get_state().decode()})"


def load(source: Any, *, num_epochs: int | None = None, shuffle: bool = False, seed: int | None = None,
         shard_options: sharding.ShardOptions = sharding.NoSharding(), transformations: Sequence[Any] = (),
         batch_size: int | None = None, drop_remainder: bool = False, worker_count: int | None = 0,
         read_options: options_lib.ReadOptions | None = None) -> DataLoader:
  """A `DataLoader` over `source` with an `IndexSampler`, like `grain.load`."""
  sampler = samplers_lib.IndexSampler(num_records=len(source), shuffle=shuffle, seed=seed,
                                      num_epochs=num_epochs, shard_options=shard_options)
  transformations = list(transformations)
  if batch_size is not None:
    transformations.append(transforms.Batch(batch_size, drop_remainder=drop_remainder))
  return DataLoader(data_source=source, sampler=sampler, operations=transformations,
                    worker_count=worker_count, read_options=read_options)
