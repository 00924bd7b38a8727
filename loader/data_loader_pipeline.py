"""How `DataLoader` runs its operations on loader's engine.

`resolve` classifies each entry of `operations` as Grain's DataLoader does
(Map, RandomMap, TfRandomMap, FlatMap, Filter, Batch, then legacy
operations), by duck typing so loader's, Grain's and look-alike classes all
work. `build` turns a sampler, a source and the resolved operations into one
pipeline: a `SamplerMapDataset` (position p of this shard -> the sampler's
record p * shard_count + shard_index), the operations folded into that
MapDataset while they are random access, the rest as sequential stages.

Elements flow as `Record`s (data + metadata) only when an operation can see
the metadata: random maps (the record's generator, seeded as Grain seeds
it), map_with_index, flat_map and legacy operations.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from loader import batching
from loader import checks
from loader import iter_dataset
from loader import map_dataset
from loader import operations as ops
from loader import options as options_lib
from loader import realign
from loader import record
from loader import samplers as samplers_lib
from loader import sharding
from loader import transforms
from loader.transformations import flatmap


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
    return record.Record(records[-1].metadata.remove_record_key(), checks.call_user(self.batch_fn, [r.data for r in records]))


class _EndsStream:
  """Runs `fn`; its errors end the DataLoader's stream (a legacy operation comes after it).

  Grain's legacy Map/RandomMap/FilterOperations are generators: an error
  from any stage before one passes through it and ends it, so the stream
  ends there too (see DataLoaderIterator).
  """

  def __init__(self, fn: Callable[..., Any]):
    self.fn = fn
    # Named as `fn` in reprs and state descriptions: states saved without the mark still restore.
    self.__name__ = self.__qualname__ = checks.fn_name(fn)

  def __call__(self, *args: Any) -> Any:
    try:
      return self.fn(*args)
    except Exception as e:
      raise ops.ends_stream(e)


def record_data(r: record.Record) -> Any:
  return r.data


# ---- Classifying operations ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
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


def resolve(op: Any, position: int) -> Op:
  """What `operations[position]` is, in the order Grain's DataLoader checks it."""
  what = f"DataLoader operations[{position}]"
  for method, kind in (("map", "map"), ("random_map", "random_map"), ("np_random_map", "random_map"),
                       ("flat_map", "flat_map"), ("filter", "filter"), ("map_with_index", "map_with_index")):
    if callable(getattr(op, method, None)):
      fn = checks.resolve_fn(op, method, what)
      if kind == "flat_map":
        fan_out = getattr(op, "max_fan_out", None)
        return Op(kind, fn, max_fan_out=None if fan_out is None else checks.check_int(
            fan_out, f"{what}.max_fan_out", minimum=1))
      return Op(kind, fn)
  legacy = _grain_legacy_name(op)
  is_batch = (isinstance(op, (transforms.Batch, ops.BatchOperation)) or legacy in ("Batch", "BatchOperation")
              or (hasattr(op, "batch_size") and not callable(op)))  # Duck-typed Batch.
  if is_batch:
    batch_fn = getattr(op, "batch_fn", None)
    if ((legacy == "BatchOperation" or isinstance(op, ops.BatchOperation))
        and getattr(batch_fn, "__name__", "") == "_default_batch_fn"):
      batch_fn = None  # BatchOperation's default (Grain's np.stack): ours stacks the same numeric leaves.
    return Op("batch", batch_fn,
               batch_size=checks.check_int(op.batch_size, f"{what}.batch_size", minimum=1),
               drop_remainder=bool(getattr(op, "drop_remainder", False)))
  if isinstance(op, ops.MapOperation) or legacy == "MapOperation":
    return Op("map", _LegacyMap(ops.MapOperation(op.map_function).apply))
  if isinstance(op, ops.RandomMapOperation) or legacy == "RandomMapOperation":
    return Op("random_map", _LegacyMap(ops.RandomMapOperation(op.random_map_function).apply))
  if isinstance(op, ops.FilterOperation) or legacy == "FilterOperation":
    return Op("filter", _LegacyFilter(ops.FilterOperation(op.condition_function).keep))
  if isinstance(op, type):
    raise TypeError(f"{what} is the class {op.__name__}; pass an instance, e.g. {op.__name__}().")
  if callable(op):
    return Op("operation", op)
  raise TypeError(f"{what} is {op!r}; expected {_VALID_OPERATIONS}.")


def apply(ds: Any, op: Op, lean: bool, ends_stream: bool = False) -> Any:
  """`ds` (MapDataset or IterDataset) with `op` applied, on elements or on records.

  `ends_stream`: a legacy operation comes later, so errors here end the stream (see _EndsStream).
  """
  mark = _EndsStream if ends_stream else lambda fn: fn  # Legacy operations mark their own errors.
  if op.kind == "batch":
    if lean and op.fn is not None and isinstance(ds, map_dataset.MapDataset):
      # Grain batches on its iterator: a batch_fn's None is an element there, not a filtered hole.
      return map_dataset.BatchMapDataset(ds, op.batch_size, drop_remainder=op.drop_remainder, batch_fn=op.fn,
                                         none_is_element=True)
    return ds.batch(op.batch_size, drop_remainder=op.drop_remainder,
                    batch_fn=op.fn if lean else mark(_BatchRecords(op.fn)))
  if op.kind == "filter":
    return ds.filter(op.fn if lean or isinstance(op.fn, _LegacyFilter) else mark(_FilterData(op.fn)))
  if op.kind == "flat_map":
    return flatmap.FlatMapIterDataset(ds, mark(_SplitRecord(op.fn, op.max_fan_out)))
  if op.kind == "operation":
    return OperationIterDataset(ds, op.fn)
  if lean or isinstance(op.fn, _LegacyMap):
    return ds.map(op.fn)
  return ds.map(mark({"map": _MapData, "random_map": _RandomMapData, "map_with_index": _MapDataWithIndex}[op.kind](
      op.fn)))


def is_legacy(op: Op) -> bool:
  """Whether `op` is a legacy Map/RandomMap/FilterOperation (a generator in Grain: its errors end the stream)."""
  return isinstance(op.fn, (_LegacyMap, _LegacyFilter))


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
    # More parts than max_fan_out pass, as in Grain's DataLoader (their indices
    # then run into the next record's, as there).
    parts = list(checks.call_user(self.fn, r.data))
    base = r.metadata.index * (self.max_fan_out or 1)
    return [record.Record(record.RecordMetadata(index=base + j), x) for j, x in enumerate(parts)]


class OperationIterDataset(iter_dataset.SequentialIterDataset):
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
    return OperationIterator(parent, self._operation)


class OperationIterator(iter_dataset.DatasetIterator):

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


class SamplerMapDataset(map_dataset.MapDataset):
  """Position p of this shard -> Record of sampler index p * shard_count + shard_index."""

  def __init__(self, data_source: Any, sampler: Any, shard_options: sharding.ShardOptions, *, with_rng: bool,
               lean: bool, ends_stream: bool = False):
    super().__init__(map_dataset.MapDataset.source(data_source))
    self._lean = lean  # Plain elements instead of Records.
    self._ends_stream = ends_stream  # Read errors end the stream (a legacy operation follows; see _EndsStream).
    self._sampler = sampler
    self._shard_index = shard_options.shard_index
    self._shard_count = shard_options.shard_count
    self._len = _sampler_length(sampler) // self._shard_count
    self._data_source = data_source
    # Our samplers give record keys for a whole chunk in one call and attach
    # a generator only when an operation can use it (Philox setup costs
    # microseconds per record); any other sampler, a subclass overriding
    # __getitem__ included, is asked one index at a time.
    self._batched = type(sampler).__getitem__ in (samplers_lib.IndexSampler.__getitem__,
                                                 samplers_lib.SequentialSampler.__getitem__)
    self._rng_seed = sampler._rng_seed if self._batched and with_rng else None  # pylint: disable=protected-access

  def __len__(self) -> int:
    return self._len

  def __repr__(self) -> str:
    return f"DataLoader({self._sampler!r}, shard={self._shard_index}/{self._shard_count})"

  def _op_repr(self) -> str:
    # Part of the engine's state description (loader.state).
    # An IndexSampler as described before its repr showed the arguments as given (seed=1 for
    # seed=True): states saved then still restore (see IndexSampler._repr_before_given_args).
    sampler = (self._sampler._repr_before_given_args()  # pylint: disable=protected-access
               if type(self._sampler).__repr__ is samplers_lib.IndexSampler.__repr__ else repr(self._sampler))
    return f".sampler({sampler}, shard={self._shard_index}/{self._shard_count})"

  def _getitems(self, indices: np.ndarray) -> list[Any]:
    if not self._ends_stream:
      return self._read(indices)
    try:
      return self._read(indices)
    except Exception as e:
      raise ops.ends_stream(e)

  def _read(self, indices: np.ndarray) -> list[Any]:
    global_indices = indices * self._shard_count + self._shard_index
    if self._batched and self._lean:
      return self._parent._getitems(self._sampler._keys_of(global_indices))  # pylint: disable=protected-access
    if self._batched:
      keys = self._sampler._keys_of(global_indices)  # pylint: disable=protected-access
      seed = self._rng_seed
      metas = [record.RecordMetadata(index=g, record_key=k,
                                     rng=None if seed is None else samplers_lib.record_rng(seed, g))
               for g, k in zip(global_indices.tolist(), keys.tolist())]
    else:
      metas = [self._sampler[g] for g in global_indices.tolist()]
      keys = [m.record_key for m in metas]
      if not all(isinstance(k, (int, np.integer)) for k in keys):
        # A key that is not an index (a sampler giving a list of indices per
        # element) goes to the source as it is, as Grain's DataLoader does.
        data = [self._data_source[k] for k in keys]
        return data if self._lean else [record.Record(m, d) for m, d in zip(metas, data)]
      keys = np.array(keys, dtype=np.int64)
    data = self._parent._getitems(keys)  # pylint: disable=protected-access
    if self._lean:
      return data
    return [record.Record(m, d) for m, d in zip(metas, data)]


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """A DataLoader's pipeline and what its engine positions mean.

  Attributes:
    dataset: The IterDataset to iterate.
    num_positions: Sampler positions of this shard.
    records_per_position: Sampler positions per folded position (the product
      of the folded batch sizes).
    realigns: Whether the folded batch may start at any record (see
      loader.realign); else only at multiples of records_per_position.
  """

  dataset: iter_dataset.IterDataset
  num_positions: int
  records_per_position: int
  realigns: bool = False


def build(data_source: Any, sampler: Any, shard_options: sharding.ShardOptions, operations: Sequence[Op],
          read_options: options_lib.ReadOptions, mp_options: options_lib.MultiprocessingOptions) -> Pipeline:
  """The pipeline on loader's engine.

  Operations are folded into the MapDataset (random access: computed in
  workers, in parallel) until the first one that cannot be: a batch after a
  filter, a flat_map or a custom operation. The rest run sequentially.
  """
  lean = all(op.kind in ("map", "filter", "batch") and not is_legacy(op) for op in operations)
  with_rng = any(op.kind in ("random_map", "operation") for op in operations)
  # Errors before the last legacy operation end the stream, as in Grain (see _EndsStream).
  ends_before = max((i for i, op in enumerate(operations) if is_legacy(op)), default=-1)
  ds = SamplerMapDataset(data_source, sampler, shard_options, with_rng=with_rng, lean=lean,
                         ends_stream=ends_before >= 0)
  num_positions = len(ds)
  records_per_position = 1
  may_have_holes = False
  batches = []  # The folded batches: they realign from the first (see loader.realign).
  rest = list(enumerate(operations))
  while rest and rest[0][1].kind in ("map", "random_map", "map_with_index", "filter", "batch"):
    if batches and getattr(batches[-1], "_none_is_element", False):
      break  # Later operations see its batch_fn's None, not the marker it travels as (see iter_dataset).
    i, op = rest[0]
    if op.kind == "batch":
      if may_have_holes:
        break  # A MapDataset cannot batch around filtered-out holes.
      records_per_position *= op.batch_size
    may_have_holes |= op.kind == "filter"
    ds = apply(ds, op, lean, ends_stream=i < ends_before)
    if op.kind == "batch":
      batches.append(ds)
    else:  # Grain runs operations on its iterator: in order (see map_dataset.in_order).
      ds = map_dataset.in_order_stage(ds)
    rest.pop(0)
  # Positions count records, as Grain's batch iterator does (and as
  # to_iter_dataset().batch() folded does): a batch may start at any record.
  it_ds = iter_dataset.MapBackedIterDataset(ds, read_options=read_options, unit=records_per_position,
                                            unit_len=num_positions,
                                            unit_batch=batches[0] if batches else None)
  for i, op in rest:
    it_ds = apply(it_ds, op, lean, ends_stream=i < ends_before)
  if not lean:
    it_ds = it_ds.map(record_data)
  if mp_options.num_workers > 0:
    it_ds = it_ds.mp_prefetch(mp_options)
    it_ds._parent_reads_first_chunk = False  # pylint: disable=protected-access  # As Grain's DataLoader.
  realigns = bool(batches) and realign.realignable(ds, batches[0])
  return Pipeline(it_ds, num_positions, records_per_position, realigns)
