"""loader.transforms / operations / samplers / sharding / record against Grain 0.2.18."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

import grain.python as grain
from loader import operations
from loader import record
from loader import samplers
from loader import sharding
from loader import transforms


# ---- transforms ----------------------------------------------------------


def test_transform_classes_are_abstract_like_grains():
  import grain as grain_top  # pylint: disable=g-import-not-at-top

  theirs = {name: getattr(grain_top.transforms, name) for name in ("Map", "RandomMap", "TfRandomMap", "Filter",
                                                                    "MapWithIndex")}
  theirs["FlatMap"] = grain_top.experimental.FlatMapTransform
  for name, grain_cls in theirs.items():
    cls = getattr(transforms, name)
    with pytest.raises(TypeError):
      cls()
    assert cls.__abstractmethods__ == grain_cls.__abstractmethods__


def test_legacy_aliases():
  assert transforms.MapTransform is transforms.Map
  assert transforms.RandomMapTransform is transforms.RandomMap
  assert transforms.FilterTransform is transforms.Filter
  assert transforms.FlatMapTransform is transforms.FlatMap
  assert transforms.MapWithIndexTransform is transforms.MapWithIndex


def test_batch_has_grains_fields_and_checks_the_size():
  assert [f.name for f in dataclasses.fields(transforms.Batch)] == [f.name for f in dataclasses.fields(grain.Batch)]
  assert transforms.Batch(4) == transforms.Batch(4, drop_remainder=False, batch_fn=None)
  with pytest.raises(ValueError, match=r"batch_size must be positive: an integer >= 1 \(got batch_size=0\)"):
    transforms.Batch(0)


def test_dataset_selection_map_subclass():

  class Concat(transforms.DatasetSelectionMap):

    def __len__(self):
      return 5

    def __getitem__(self, index):
      return (0, index) if index < 2 else (1, index - 2)

  assert len(Concat()) == 5 and Concat()[3] == (1, 1)
  with pytest.raises(TypeError):
    transforms.DatasetSelectionMap()


# ---- record ----------------------------------------------------------------


def test_record_metadata_like_grains():
  rng = np.random.default_rng(0)
  ours = record.RecordMetadata(index=3, record_key=7, rng=rng)
  theirs = grain.RecordMetadata(index=3, record_key=7, rng=rng)
  assert str(ours) == str(theirs)
  assert str(ours.remove_record_key()) == str(theirs.remove_record_key())
  plain = record.RecordMetadata(index=1)
  assert plain.remove_record_key() is plain
  r = record.Record(metadata=plain, data={"x": 1})
  assert r.data == {"x": 1} and r.metadata.index == 1
  with pytest.raises(AttributeError):  # slots, as Grain's.
    plain.other = 1  # pylint: disable=attribute-defined-outside-init


# ---- operations ------------------------------------------------------------


def _records(values):
  return [record.Record(record.RecordMetadata(index=i, record_key=i,
                                              rng=np.random.Generator(np.random.Philox(key=i))), v)
          for i, v in enumerate(values)]


def _grain_records(values):
  return [grain.Record(grain.RecordMetadata(index=i, record_key=i,
                                            rng=np.random.Generator(np.random.Philox(key=i))), v)
          for i, v in enumerate(values)]


def _unpack(records):
  return [(r.metadata.index, r.metadata.record_key, np.asarray(r.data).tolist()) for r in records]


@pytest.mark.parametrize("make", [
    lambda ops: ops.MapOperation(lambda x: x * 2),
    lambda ops: ops.FilterOperation(lambda x: x % 3 != 0),
    lambda ops: ops.RandomMapOperation(lambda x, rng: x + int(rng.integers(100))),
    lambda ops: ops.BatchOperation(batch_size=3),
    lambda ops: ops.BatchOperation(batch_size=3, drop_remainder=True),
], ids=["map", "filter", "random_map", "batch", "batch_drop"])
def test_operations_called_on_iterators_match_grains(make):
  values = list(range(10))
  ours = list(make(operations)(iter(_records(values))))
  theirs = list(make(grain)(iter(_grain_records(values))))
  assert _unpack(ours) == _unpack(theirs)


def test_map_operation_error_names_the_function():

  def explode(x):
    raise KeyError(x)

  with pytest.raises(ValueError, match="PyGrain encountered an error when calling map function.*explode raised KeyError"):
    list(operations.MapOperation(explode)(iter(_records([1]))))


# ---- sharding --------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 12])
@pytest.mark.parametrize("count", [1, 3, 4])
@pytest.mark.parametrize("drop", [False, True])
def test_even_split_matches_grains(n, count, drop):
  from grain._src.core import sharding as grain_sharding  # The function is not public in Grain.

  for index in range(count):
    assert sharding.even_split(n, sharding.ShardOptions(index, count, drop)) == grain_sharding.even_split(
        n, grain.ShardOptions(index, count, drop))


def test_shard_options_reprs_equal_grains():
  # Samplers embed these reprs, and Grain checkpoints embed the sampler's.
  assert repr(sharding.ShardOptions(1, 3)) == repr(grain.ShardOptions(1, 3))
  assert repr(sharding.ShardOptions(np.int64(1), np.int64(3), True)) == repr(grain.ShardOptions(1, 3, True))
  assert repr(sharding.NoSharding()) == repr(grain.NoSharding())
  assert repr(sharding.ShardByJaxProcess(drop_remainder=True)) == repr(grain.ShardByJaxProcess(drop_remainder=True))


@pytest.mark.parametrize("index,count,message", [
    (0, 0, r"shard_count must be positive: an integer >= 1 \(got shard_count=0\)"),
    (3, 3, r"shard_index must be an integer in \[0, 2\] \(got shard_index=3\)"),
    (-1, 2, r"shard_index must be an integer in \[0, 1\] \(got shard_index=-1\)"),
])
def test_shard_options_are_checked(index, count, message):
  with pytest.raises(ValueError, match=message):
    sharding.ShardOptions(index, count)


def test_shard_by_jax_process_uses_jax():
  import jax  # The test process may import JAX; `import loader` must not.

  options = sharding.ShardByJaxProcess()
  assert (options.shard_index, options.shard_count) == (jax.process_index(), jax.process_count())


# ---- samplers --------------------------------------------------------------


def _keys(sampler, n):
  return [sampler[i].record_key for i in range(n)]


@pytest.mark.parametrize("shard", [(0, 1, False), (1, 3, False), (2, 3, True), (0, 4, False)])
@pytest.mark.parametrize("num_epochs", [1, 3])
def test_index_sampler_matches_grains(shard, num_epochs):
  n = 12 if shard[1] != 3 else 10
  for shuffle in (False, True):
    ours = samplers.IndexSampler(n, sharding.ShardOptions(*shard), shuffle=shuffle, num_epochs=num_epochs, seed=5)
    theirs = grain.IndexSampler(n, grain.ShardOptions(*shard), shuffle=shuffle, num_epochs=num_epochs, seed=5)
    assert repr(ours) == repr(theirs)
    assert len(ours) == len(theirs)
    ours_keys, theirs_keys = _keys(ours, len(ours)), _keys(theirs, len(theirs))
    if not shuffle:
      assert ours_keys == theirs_keys
    else:
      # Same records in every epoch of this shard; the order is ours.
      per_epoch = ours._keys_per_epoch  # pylint: disable=protected-access
      count = shard[1]
      positions = len(ours) // count
      for start in range(0, positions - positions % per_epoch, per_epoch):
        sl = slice(start * count, (start + per_epoch) * count)
        assert sorted(ours_keys[sl]) == sorted(theirs_keys[sl])
    for i in (0, 7, len(ours) - 1):
      a, b = ours[i], theirs[i]
      assert a.index == b.index
      # The per-record generator is Grain's exactly.
      assert a.rng.integers(2**62, size=3).tolist() == b.rng.integers(2**62, size=3).tolist()
    with pytest.raises(IndexError):
      ours[len(ours)]


def test_index_sampler_infinite_and_batched_keys():
  ours = samplers.IndexSampler(7, shuffle=True, seed=1)
  theirs = grain.IndexSampler(7, shuffle=True, seed=1)
  assert len(ours) == len(theirs) == sys.maxsize
  assert repr(ours) == repr(theirs)
  keys = ours._keys_of(np.arange(70, dtype=np.int64))  # pylint: disable=protected-access
  assert keys.tolist() == _keys(ours, 70)
  for epoch in range(10):
    assert sorted(keys[epoch * 7:(epoch + 1) * 7].tolist()) == list(range(7))
  assert ours[3].rng is not None and samplers.IndexSampler(7)[3].rng is None


@pytest.mark.parametrize("kwargs,error,message", [
    ({"num_records": 0}, ValueError, r"num_records > 0 \(got num_records=0\)"),
    ({"num_records": 5, "num_epochs": 0}, ValueError, r"num_epochs must be positive: an integer >= 1"),
    ({"num_records": 5, "shuffle": True}, ValueError, r"needs a seed"),
    ({"num_records": 5, "seed": -1}, ValueError, r"seed must be an integer between 0 and 2\*\*32-1"),
    ({"num_records": 5, "seed": 2**32}, ValueError, r"seed must be an integer between 0 and 2\*\*32-1"),
])
def test_index_sampler_checks_arguments(kwargs, error, message):
  with pytest.raises(error, match=message):
    samplers.IndexSampler(**kwargs)


@pytest.mark.parametrize("shard", [(0, 1, False), (1, 3, False), (1, 3, True)])
def test_sequential_sampler_matches_grains(shard):
  ours = samplers.SequentialSampler(10, sharding.ShardOptions(*shard), seed=2)
  theirs = grain.SequentialSampler(10, grain.ShardOptions(*shard), seed=2)
  assert repr(ours) == repr(theirs) and len(ours) == len(theirs)
  assert _keys(ours, len(ours)) == _keys(theirs, len(theirs))
  assert ours[4].rng.integers(1000) == theirs[4].rng.integers(1000)
  with pytest.raises(IndexError):
    ours[len(ours)]
