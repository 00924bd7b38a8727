"""Grain 0.2.18's public-API behaviour, run on Grain and, with only the import line changed, on loader.

The cases are Grain's own behaviour tests (grain/_src/python/dataset/dataset_test.py
and grain/_src/python/data_loader_test.py at tag v0.2.18) rewritten against the
public names (`import grain` / `import grain.python as grain` instead of
`grain._src...`): epochs by index, slicing, batch, repeat, filter, map /
map_with_index / random_map with transform objects and callables, seeds,
apply / pipe / concatenate, checkpoints at every step, and DataLoader with
samplers, sharding, legacy operations and worker processes.

Results must equal Grain's exactly (and Grain's test's expectation where it
states one), random ones included: shuffle order (MapDataset.shuffle,
IndexSampler) and random_map draws are Grain's. For those the tests also check
on both libraries the properties Grain's tests check (same seed same result,
another seed another result, every epoch holds the same elements). A
DataLoader with worker processes is the one deliberate difference: Grain
batches each worker's slice separately where loader batches the stream it
reads with 0 workers (its test's data gives both the same batches).
"""

from __future__ import annotations

import importlib
import pathlib

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, structure

# Grain's test transforms, on the public base classes.
DATASET_HEAD = """
import dataclasses
import sys
import grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class FilterKeepingOddElementsOnly(grain.transforms.Filter):

  def filter(self, element: int) -> bool:
    return bool(element % 2)


@dataclasses.dataclass(frozen=True)
class RandomMapAddingRandomInt(grain.transforms.RandomMap):

  def random_map(self, element: int, rng: np.random.Generator) -> int:
    return element + rng.integers(0, 100)


@dataclasses.dataclass(frozen=True)
class RandomMapAlwaysAddingOne(grain.transforms.RandomMap):

  def random_map(self, element: int, rng: np.random.Generator) -> int:
    return element + 1


@dataclasses.dataclass(frozen=True)
class MapAddingOne(grain.transforms.Map):

  def map(self, element: int) -> int:
    return element + 1


@dataclasses.dataclass(frozen=True)
class MapWithIndexProducingIndexElementTuple(grain.transforms.MapWithIndex):

  def map_with_index(self, index: int, element: int) -> tuple[int, int]:
    return (index, element)


class Source15IntsFrom0:

  def __init__(self):
    pass

  def __len__(self) -> int:
    return 15

  def __getitem__(self, index):
    return index


class AddRandomInteger(grain.transforms.RandomMap):

  def random_map(self, element, rng):
    return element + rng.integers(low=0, high=100)


class FilterArraysWithLargeSum(grain.transforms.Filter):

  def filter(self, x):
    return np.sum(x) < 20


class FlatMapAddingOne(grain.experimental.FlatMapTransform):

  max_fan_out = 2

  def flat_map(self, x):
    return [x, x + 1]
"""

# name -> (snippet setting `result`, Grain's test's expectation or None).
DETERMINISTIC = {
    "source_and_range": ("""
result = [list(grain.MapDataset.source(Source15IntsFrom0())), len(grain.MapDataset.range(5)),
          list(grain.MapDataset.range(5)), list(grain.MapDataset.range(2, 7)), list(grain.MapDataset.range(1, 10, 3))]
""", [list(range(15)), 5, [0, 1, 2, 3, 4], [2, 3, 4, 5, 6], [1, 4, 7]]),
    "batch": ("""
result = [list(ds.batch(batch_size=3)) for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset())]
result.append(len(grain.MapDataset.range(15).batch(batch_size=3)))
""", [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]] * 2 + [5]),
    "batch_with_drop_remainder": ("""
result = [list(ds.batch(batch_size=6, drop_remainder=True))
          for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset())]
result.append(len(grain.MapDataset.range(15).batch(batch_size=6, drop_remainder=True)))
""", [[[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]] * 2 + [2]),
    "batch_with_batch_fn": ("""
result = [list(ds.batch(batch_size=4, batch_fn=lambda xs: np.expand_dims(np.array(xs), axis=0)))
          for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset())]
""", [[[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9, 10, 11]], [[12, 13, 14]]]] * 2),
    "batch_by_index_past_the_length": ("""
ds = grain.MapDataset.range(15).batch(batch_size=4, drop_remainder=True)
result = [ds[i] for i in (0, 2, 3, 5, -1)]
""", [[0, 1, 2, 3], [8, 9, 10, 11], [0, 1, 2, 3], [8, 9, 10, 11], [8, 9, 10, 11]]),
    "filter_with_callable_and_transform": ("""
result = []
for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset()):
  result.append(list(ds.filter(lambda x: x % 2 == 0)))
  result.append(list(ds.filter(FilterKeepingOddElementsOnly())))
  result.append(list(ds.filter(lambda x: 3 < x < 10).filter(FilterKeepingOddElementsOnly())))
""", [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13], [5, 7, 9]] * 2),
    "filter_subscription_and_len": ("""
ds = grain.MapDataset.range(15).filter(lambda x: x % 2 == 0)
result = [ds[0], ds[12], ds[8], ds[3], ds[5], ds[13], len(ds), len(grain.MapDataset.range(0).filter(lambda x: True))]
""", [0, 12, 8, None, None, None, 15, 0]),
    "to_iter_dataset_options": ("""
ds = grain.MapDataset.range(15).filter(lambda x: x % 2 == 0)
result = [list(ds.to_iter_dataset()),
          list(ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))),
          list(ds.to_iter_dataset(allow_nones=True))]
""", [[0, 2, 4, 6, 8, 10, 12, 14]] * 2 + [[0, None, 2, None, 4, None, 6, None, 8, None, 10, None, 12, None, 14]]),
    "slice": ("""
ds = grain.MapDataset.range(15)
result = [list(ds.slice(slice(7))), list(ds.slice(slice(3, 9))), list(ds.slice(slice(2, 11, 3))),
          list(ds.slice(slice(1, 10, 2)).slice(slice(1, 3))),
          list(ds.slice(slice(1, 10, 2)).filter(lambda x: x % 3 == 0 or x == 7).filter(lambda x: x > 5)
               .slice(slice(2, 4))),
          [ds.slice(slice(2, 11, 3))[i] for i in (0, 1, 2)], ds[1::3][1], list(ds[1::3])]
""", [[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8], [2, 5, 8], [3, 5], [7], [2, 5, 8], 4, [1, 4, 7, 10, 13]]),
    "negative_and_out_of_range_slices": ("""
ds = grain.MapDataset.range(10).map(lambda x: x * 2)
result = [ds[-1], ds[-10], list(ds[-3:]), list(ds[::-1]), list(ds[-8:-2:3]), len(ds[5:100]), list(ds[5:100]),
          len(ds[20:]), list(ds[20:])]
""", None),
    "indices_past_the_length_read_the_next_epoch": ("""
ds = grain.MapDataset.range(10).map(lambda x: x * 2)
sliced = grain.MapDataset.range(10)[2:8]
result = [ds[10], ds[25], ds[1::3][5], sliced[6], sliced[13], len(sliced),
          [ds[i] == ds[len(ds) + i] for i in range(len(ds))]]
""", [0, 10, 14, 2, 3, 6, [True] * 10]),
    "repeat": ("""
result = [len(grain.MapDataset.range(15).repeat(3)), len(grain.MapDataset.range(15).repeat(num_epochs=None)) == sys.maxsize,
          list(grain.MapDataset.range(15)[:5].repeat(2)),
          list(grain.MapDataset.range(15).slice(slice(1, 10, 2)).filter(lambda x: x < 6).repeat(2)),
          [grain.MapDataset.range(3).repeat(3)[i] for i in (0, 1, 2, 3, 4)]]
""", [45, True, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4], [1, 3, 5, 1, 3, 5], [0, 1, 2, 0, 1]]),
    "map_and_map_with_index": ("""
result = [len(grain.MapDataset.range(15).map(lambda x: x + 1)),
          len(grain.MapDataset.range(15).map_with_index(lambda i, x: x + i))]
for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset()):
  result.append(list(ds.map(MapAddingOne())))
  result.append(list(ds.map(lambda x: x + 1)))
for ds in (grain.MapDataset.range(5), grain.MapDataset.range(5).to_iter_dataset()):
  result.append(list(ds.map(lambda x: 2 * x).map_with_index(MapWithIndexProducingIndexElementTuple())))
  result.append(list(ds.map(lambda x: 2 * x).map_with_index(lambda i, x: (i, x))))
""", [15, 15] + [list(range(1, 16))] * 4 + [[[0, 0], [1, 2], [2, 4], [3, 6], [4, 8]]] * 4),
    "random_map_without_randomness": ("""
result = [len(grain.MapDataset.range(15).random_map(lambda x, rng: True, seed=123))]
for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset()):
  result.append(list(ds.random_map(RandomMapAlwaysAddingOne(), seed=123)))
  result.append(list(ds.random_map(lambda x, rng: x + 1, seed=123)))
""", [15] + [list(range(1, 16))] * 4),
    "seed_keeps_elements": ("""
result = [list(grain.MapDataset.range(15).seed(123)), list(grain.MapDataset.range(15).to_iter_dataset().seed(123)),
          [grain.MapDataset.range(15).seed(123)[i] for i in (0, 5, 10)]]
""", [list(range(15)), list(range(15)), [0, 5, 10]]),
    "many_operations_chained_together": ("""
def add_one(x: int) -> int:
  return x + 1

def add(x: int, y: int) -> int:
  return x + y

ds = grain.MapDataset.range(15)
ds = ds[:5]  # [0, 1, 2, 3, 4]
ds = ds.filter(lambda x: x % 2 == 0)  # [0, None, 2, None, 4]
ds = ds.map(add_one)  # [1, None, 3, None, 5]
ds = ds.slice(slice(2, 5))  # [3, None, 5]
ds = ds.repeat(3)  # [3, None, 5, 3, None, 5, 3, None, 5]
ds = ds.map_with_index(add)  # [3, None, 7, 6, None, 10, 9, None, 13]
ds = ds.to_iter_dataset()  # [3, 7, 6, 10, 9, 13]
ds = ds.filter(lambda x: x % 3 != 0)  # [7, 10, 13]
ds = ds.map(add_one)  # [8, 11, 14]
result = list(ds)
""", [8, 11, 14]),
    "pipe_concatenate_apply": ("""
result = [grain.MapDataset.range(10).pipe(lambda self, *args, **kwargs: (args, kwargs), 1, 2, x=3),
          grain.MapDataset.range(10).to_iter_dataset().pipe(lambda self, *args: args, 1),
          list(grain.MapDataset.concatenate([grain.MapDataset.range(3), grain.MapDataset.range(3, 8)]))]
for ds in (grain.MapDataset.range(5), grain.MapDataset.range(5).to_iter_dataset()):
  result.append(list(ds.apply([MapAddingOne(), grain.transforms.Batch(2)])))
""", [[[1, 2], {"x": 3}], [1], [0, 1, 2, 3, 4, 5, 6, 7]] + [[[1, 2], [3, 4], [5]]] * 2),
    "apply_transformations": ("""
result = []
for ds in (grain.MapDataset.range(15), grain.MapDataset.range(15).to_iter_dataset()):
  result.append(list(ds.apply(MapAddingOne())))
  result.append(list(ds.seed(42).apply([MapAddingOne(), RandomMapAlwaysAddingOne(),
                                        grain.transforms.Batch(batch_size=2, drop_remainder=True),
                                        FilterArraysWithLargeSum()])))
for ds in (grain.MapDataset.range(10), grain.MapDataset.range(10).to_iter_dataset()):
  result.append(list(ds.apply(MapWithIndexProducingIndexElementTuple())))
for ds in (grain.MapDataset.range(3), grain.MapDataset.range(3).to_iter_dataset()):
  result.append(list(ds.apply(FlatMapAddingOne())))
""", [list(range(1, 16)), [[2, 3], [4, 5], [6, 7], [8, 9]]] * 2 + [[[i, i] for i in range(10)]] * 2
        + [[0, 1, 1, 2, 2, 3]] * 2),
    "start_prefetch": ("""
it = grain.MapDataset.range(15).to_iter_dataset().__iter__()
it.start_prefetch()
result = list(it)
""", list(range(15))),
    "iterator_restore": ("""
it = iter(grain.MapDataset.range(10).map(lambda x: {"key": x}).to_iter_dataset().batch(3))
first = next(it)
state = it.get_state()
rest = list(it)
it.set_state(state)
result = [first, rest, list(it)]
""", [{"key": [0, 1, 2]}, [{"key": [3, 4, 5]}, {"key": [6, 7, 8]}, {"key": [9]}]] + [
        [{"key": [3, 4, 5]}, {"key": [6, 7, 8]}, {"key": [9]}]]),
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_deterministic_behaviour_equals_grain(name):
  snippet, expected = DETERMINISTIC[name]
  g, l = porting.run_both(DATASET_HEAD + snippet)
  assert plain(l.result) == plain(g.result)
  assert structure(l.result) == structure(g.result)  # Same array shapes and dtypes.
  if expected is not None:
    assert plain(g.result) == expected


def test_transform_errors_raise_like_grain():
  snippet = DATASET_HEAD + """
class RaisingTransform(grain.transforms.Map):

  def map(self, x):
    raise AttributeError("I shall raise")

errors = []
for ds in (grain.MapDataset.range(4), grain.MapDataset.range(4).to_iter_dataset()):
  try:
    list(ds.map(RaisingTransform()))
  except AttributeError as e:
    errors.append(str(e))
try:
  grain.MapDataset.range(10).filter(lambda x: x > 3).batch(2)
except Exception as e:  # Grain: batch after a MapDataset filter is refused.
  errors.append(type(e).__name__)
"""
  g, l = porting.run_both(snippet)
  assert g.errors[:2] == l.errors[:2] == ["I shall raise"] * 2
  assert len(l.errors) == len(g.errors)


# ---- Randomness: Grain's properties, checked on both ------------------------

RANDOM = DATASET_HEAD + """
def elements(ds):
  return list(ds)

shuffled = grain.MapDataset.range(15).shuffle(seed=123)
shuffle = dict(
    length=len(shuffled),
    same_seed=elements(shuffled) == elements(grain.MapDataset.range(15).shuffle(seed=123)),
    other_seed=elements(shuffled) != elements(grain.MapDataset.range(15).shuffle(seed=456)),
    epoch_1=[shuffled[i] for i in range(15)],
    epoch_2=[shuffled[i] for i in range(15, 30)],
)

seeded = grain.MapDataset.range(15).seed(125).shuffle()
seed = dict(
    same=elements(seeded) == elements(grain.MapDataset.range(15).seed(125).shuffle()),
    other=elements(seeded) != elements(grain.MapDataset.range(15).seed(126).shuffle()),
    not_identity=elements(seeded) != list(range(15)),
    by_index=[seeded[i] for i in (25, 20, 15, 10, 5, 0)],
    sliced=elements(grain.MapDataset.range(15).seed(144)[1::3].shuffle()),
    sliced_again=elements(grain.MapDataset.range(15).seed(144)[1::3].shuffle()),
    non_random_map=elements(grain.MapDataset.range(15).seed(126).map(lambda x: x + 1).shuffle()),
)

random_map = {}
for kind, ds in (("map", grain.MapDataset.range(15)), ("iter", grain.MapDataset.range(15).to_iter_dataset())):
  mapped = ds.random_map(RandomMapAddingRandomInt(), seed=123)
  random_map[kind] = dict(
      values=elements(mapped),
      deterministic=elements(mapped) == elements(mapped),
      other_seed=elements(mapped) != elements(ds.random_map(RandomMapAddingRandomInt(), seed=456)),
      by_seed_method=elements(ds.seed(126).random_map(AddRandomInteger())),
      by_seed_method_again=elements(ds.seed(126).random_map(AddRandomInteger())),
      by_other_seed_method=elements(ds.seed(127).random_map(AddRandomInteger())),
      chained_seeds_differ=elements(ds.seed(129).random_map(AddRandomInteger()).random_map(AddRandomInteger())),
  )
epochs = grain.MapDataset.range(5).random_map(lambda x, rng: x + rng.integers(100), seed=1)
random_map["epochs"] = [epochs[i] for i in range(10)]
mixed = [grain.MapDataset.mix([grain.MapDataset.range(15).seed(128) for _ in range(6)]).random_map(AddRandomInteger())
         for _ in range(2)]
random_map["mix_same_seed"] = elements(mixed[0]) == elements(mixed[1])

import cloudpickle
pickled = cloudpickle.loads(cloudpickle.dumps(seeded))
seed["picklable"] = elements(pickled) == elements(seeded)
"""


def test_shuffle_seed_and_random_map_properties_hold_like_grain():
  g, l = porting.run_both(RANDOM)
  for ns in (g, l):
    s = ns.shuffle
    assert s["length"] == 15 and s["same_seed"] and s["other_seed"]
    assert sorted(s["epoch_1"]) == sorted(s["epoch_2"]) == list(range(15)) and s["epoch_1"] != s["epoch_2"]
    sd = ns.seed
    assert sd["same"] and sd["other"] and sd["not_identity"] and sd["picklable"]
    assert sd["sliced"] == sd["sliced_again"] and sorted(sd["sliced"]) == [1, 4, 7, 10, 13]
    assert sorted(sd["non_random_map"]) == list(range(1, 16))
    assert sd["by_index"] == [ns.seeded[i] for i in (25, 20, 15, 10, 5, 0)]
    rm = ns.random_map
    for kind in ("map", "iter"):
      r = rm[kind]
      assert r["deterministic"] and r["other_seed"]
      assert all(x <= v < x + 100 for x, v in enumerate(r["values"]))
      assert r["by_seed_method"] == r["by_seed_method_again"] != r["by_other_seed_method"]
    # A MapDataset and its IterDataset draw the same numbers for the same element.
    assert rm["map"]["values"] == rm["iter"]["values"]
    # The second epoch draws anew.
    assert rm["epochs"][:5] != rm["epochs"][5:] and all(i % 5 <= v < i % 5 + 100 for i, v in enumerate(rm["epochs"]))
    assert rm["mix_same_seed"]
  # Grain's shuffle order and random_map draws, exactly.
  for name in ("shuffle", "seed", "random_map"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  assert list(l.seeded) == list(g.seeded)


# ---- Checkpoint at every step (Grain's assert_equal_output_after_checkpoint) --

CHECKPOINT_EVERY_STEP = DATASET_HEAD + porting.RESTORE_AT_EVERY_STEP_ASSERTED + """


numeric = restore_at_every_step(
    lambda: grain.MapDataset.range(10).map(lambda x: x + 1).seed(42).shuffle(42).random_map(AddRandomInteger())
    .to_iter_dataset())
dictionaries = restore_at_every_step(
    lambda: grain.MapDataset.range(10).map(lambda x: {"key": x}).shuffle(24).to_iter_dataset())
filtered_batches = restore_at_every_step(
    lambda: grain.MapDataset.range(20).shuffle(3).to_iter_dataset().filter(lambda x: x % 3 != 0).batch(4)
    .map(lambda b: b * 2))
repeated_epochs = restore_at_every_step(
    lambda: grain.MapDataset.range(7).shuffle(5).repeat(3).batch(3, drop_remainder=True).to_iter_dataset())
"""


def test_checkpoint_at_every_step_resumes_exactly():
  g, l = porting.run_both(CHECKPOINT_EVERY_STEP)
  assert len(g.numeric) == len(l.numeric) == 10
  flat = lambda batches: sorted(v for b in plain(batches) for v in b)
  assert flat(g.filtered_batches) == [2 * x for x in range(20) if x % 3 != 0]
  assert len(g.repeated_epochs) == 7
  # Grain's shuffles and random_map draws: the same streams, element by element.
  for name in ("numeric", "dictionaries", "filtered_batches", "repeated_epochs"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
    assert structure(getattr(l, name)) == structure(getattr(g, name)), name


# ---- DataLoader (data_loader_test.py) ---------------------------------------

DATA_LOADER_HEAD = """
from absl import flags
flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.

import functools
import grain.python as grain
import numpy as np


def map_function(data):
  return data + 1


def condition_function(data):
  return data % 2 == 0


class FilterEven(grain.FilterTransform):

  def filter(self, x: int) -> bool:
    return x % 2 == 0


class PlusOne(grain.MapTransform):

  def map(self, x: int) -> int:
    return x + 1


class PlusRandom(grain.RandomMapTransform):

  def random_map(self, x: int, rng: np.random.Generator) -> int:
    return x + rng.integers(100_000)


class DuplicateElementFlatMap(grain.experimental.FlatMapTransform):
  max_fan_out: int = 7

  def flat_map(self, element):
    for _ in range(self.max_fan_out):
      yield element


def create_data_loader_for_short_sequence(transformations, *, worker_count=0, seed=None):
  # Generates elements [0, 1, 2, 3, 4, 5, 6, 7].
  range_data_source = grain.RangeDataSource(start=0, stop=8, step=1)
  sampler = grain.SequentialSampler(
      num_records=len(range_data_source),
      shard_options=grain.NoSharding(),
      seed=seed,
  )
  return grain.DataLoader(
      data_source=range_data_source,
      sampler=sampler,
      operations=transformations,
      worker_count=worker_count,
  )


def create_checkpointing_dataloader(num_workers):
  range_data_source = grain.RangeDataSource(start=0, stop=16, step=1)
  sampler = grain.IndexSampler(
      num_records=len(range_data_source),
      shard_options=grain.NoSharding(),
      shuffle=False,
      num_epochs=1,
  )
  operations = [
      PlusOne(),
      FilterEven(),
      grain.BatchOperation(batch_size=2),
  ]
  return grain.DataLoader(
      data_source=range_data_source,
      sampler=sampler,
      operations=operations,
      worker_count=num_workers,
  )


def checkpointing(num_workers, steps_to_iterate, same_object):
  data_loader_iterator = iter(create_checkpointing_dataloader(num_workers))
  actual = [next(data_loader_iterator) for i in range(steps_to_iterate)]
  state = data_loader_iterator.get_state()
  skipped = next(data_loader_iterator)  # Comes again after the restore.
  if same_object:
    restored = data_loader_iterator
  else:  # New objects, as after a preemption.
    restored = iter(create_checkpointing_dataloader(num_workers))
  restored.set_state(state)
  for item in restored:
    actual.append(item)
  return actual, skipped
"""

DATA_LOADER_IN_PROCESS = DATA_LOADER_HEAD + """
single_process = list(create_data_loader_for_short_sequence([PlusOne(), FilterEven(), grain.BatchOperation(batch_size=2)]))
batch_transform = list(create_data_loader_for_short_sequence([PlusOne(), FilterEven(), grain.Batch(batch_size=2)]))
legacy = list(create_data_loader_for_short_sequence([
    grain.MapOperation(map_function=map_function),
    grain.FilterOperation(condition_function=condition_function),
    grain.BatchOperation(batch_size=2),
]))
loader_to_iterate_twice = create_data_loader_for_short_sequence([PlusOne(), FilterEven(), grain.Batch(batch_size=2)])
iterated_twice = [list(loader_to_iterate_twice), list(loader_to_iterate_twice)]
random_map = list(create_data_loader_for_short_sequence([PlusRandom(), grain.BatchOperation(batch_size=2)], seed=1))
random_map_again = list(create_data_loader_for_short_sequence([PlusRandom(), grain.BatchOperation(batch_size=2)], seed=1))
with_batch_fn = list(create_data_loader_for_short_sequence([
    PlusOne(), FilterEven(),
    grain.BatchOperation(batch_size=3, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=3)),
]))
flat_mapped = list(create_data_loader_for_short_sequence([PlusOne(), FilterEven(), DuplicateElementFlatMap()]))

checkpoints = {}
for steps in (0, 1, 2, 3):
  for same_object in (False, True):
    checkpoints[steps, same_object] = checkpointing(0, steps, same_object)

data_loader_iterator = iter(create_checkpointing_dataloader(num_workers=0))
first_element = next(data_loader_iterator)
state1 = data_loader_iterator.get_state()
data_loader_iterator.set_state(state1)
state2 = data_loader_iterator.get_state()
data_loader_iterator.set_state(state2)
next_element = next(data_loader_iterator)

data_source = list(range(10000))
state_size = len(grain.DataLoader(
    data_source=data_source, sampler=grain.SequentialSampler(num_records=len(data_source))).__iter__().get_state())

it = create_data_loader_for_short_sequence([]).__iter__()
for _ in range(5):
  it.start_prefetch()
prefetched = list(it)

ar_data_source = grain.ArrayRecordDataSource(digits_files)
ar_data_source[0]
array_record_read = list(grain.DataLoader(data_source=ar_data_source, sampler=grain.SequentialSampler(
    num_records=len(ar_data_source), shard_options=grain.NoSharding()), worker_count=0))
try:
  grain.DataLoader(data_source=ar_data_source, sampler=grain.SequentialSampler(
      num_records=len(ar_data_source), shard_options=grain.NoSharding()), worker_count=-1)
  invalid_workers = None
except ValueError:
  invalid_workers = "ValueError"

# Sharding: each host reads its part of the records.
shards = {}
for drop_remainder in (False, True):
  for shard_index in range(3):
    sampler = grain.IndexSampler(num_records=10, shard_options=grain.ShardOptions(
        shard_index=shard_index, shard_count=3, drop_remainder=drop_remainder), shuffle=False, num_epochs=1)
    shards[shard_index, drop_remainder] = list(grain.DataLoader(data_source=grain.RangeDataSource(0, 10, 1),
                                                                sampler=sampler, worker_count=0))
    sampler = grain.IndexSampler(num_records=10, shard_options=grain.ShardOptions(
        shard_index=shard_index, shard_count=3, drop_remainder=drop_remainder), shuffle=True, seed=3, num_epochs=2)
    shards["shuffled", shard_index, drop_remainder] = list(grain.DataLoader(
        data_source=grain.RangeDataSource(0, 10, 1), sampler=sampler, worker_count=0))
# The DataLoader's shard_options shard a sampler that does not.
shards["loader_shard_options"] = list(grain.DataLoader(
    data_source=grain.RangeDataSource(0, 10, 1),
    sampler=grain.IndexSampler(num_records=10, shard_options=grain.NoSharding(), shuffle=False, num_epochs=1),
    shard_options=grain.ShardOptions(shard_index=1, shard_count=2)))
by_jax_process = list(grain.DataLoader(
    data_source=grain.RangeDataSource(0, 10, 1),
    sampler=grain.IndexSampler(num_records=10, shard_options=grain.ShardByJaxProcess(), shuffle=False, num_epochs=1)))
"""

EXPECTED_CHECKPOINT_STREAM = [[2, 4], [6, 8], [10, 12], [14, 16]]


def test_data_loader_in_process_equals_grain():
  import grain  # pylint: disable=g-import-not-at-top

  # Grain's own test files, shipped in its wheel: records b"0" ... b"9" in two files.
  testdata = pathlib.Path(grain.__file__).parent / "_src" / "python" / "testdata"
  digits = sorted(str(p) for p in testdata.glob("digits.array_record-*"))
  assert len(digits) == 2
  g, l = porting.run_both(DATA_LOADER_IN_PROCESS, digits_files=digits)
  for name, expected in (("single_process", [[2, 4], [6, 8]]), ("batch_transform", [[2, 4], [6, 8]]),
                         ("legacy", [[2, 4], [6, 8]]), ("iterated_twice", [[[2, 4], [6, 8]]] * 2),
                         ("with_batch_fn", [[2, 4, 6], [8, 0, 0]]),
                         ("flat_mapped", [2] * 7 + [4] * 7 + [6] * 7 + [8] * 7),
                         ("first_element", [2, 4]), ("next_element", [6, 8]), ("prefetched", list(range(8))),
                         ("array_record_read", [str(i).encode() for i in range(10)]),
                         ("invalid_workers", "ValueError"), ("by_jax_process", list(range(10)))):
    assert plain(getattr(g, name)) == expected, f"Grain: {name}"
    assert plain(getattr(l, name)) == expected, f"loader: {name}"
  for ns in (g, l):
    assert [b.shape for b in ns.random_map] == [(2,)] * 4
    assert plain(ns.random_map) == plain(ns.random_map_again)
  assert plain(l.random_map) == plain(g.random_map)  # The per-record generators are seeded as Grain seeds them.
  for ns in (g, l):
    for (steps, _), (actual, skipped) in ns.checkpoints.items():
      assert plain(actual) == EXPECTED_CHECKPOINT_STREAM
      assert plain(skipped) == EXPECTED_CHECKPOINT_STREAM[steps]
    assert ns.state_size < 1000
  for key, stream in g.shards.items():
    # Shuffled shards included: the sampler's shuffle is Grain's.
    assert plain(l.shards[key]) == plain(stream), key
  assert plain(g.shards["loader_shard_options"]) == plain(l.shards["loader_shard_options"])


def test_checkpoint_stops_at_the_end_of_the_data_like_grain():
  # Grain's checkpointing test also takes a state after the last batch.
  g, l = porting.run_both(DATA_LOADER_HEAD + """
it = iter(create_checkpointing_dataloader(0))
consumed = list(it)
state = it.get_state()
it = iter(create_checkpointing_dataloader(0))
it.set_state(state)
rest = list(it)
""")
  assert plain(g.consumed) == plain(l.consumed) == EXPECTED_CHECKPOINT_STREAM
  assert g.rest == l.rest == []


DATA_LOADER_WORKERS = DATA_LOADER_HEAD + """
with_workers = {1: checkpointing(2, 1, same_object=False)}

in_memory = list(grain.DataLoader(
    data_source=grain.InMemoryDataSource([0, 1, 2, 3, 4, 5, 6, 7]),
    sampler=grain.SequentialSampler(num_records=8, shard_options=grain.NoSharding()),
    operations=[PlusOne(), FilterEven(), grain.BatchOperation(batch_size=2)],
    worker_count=2))
"""


def test_data_loader_with_worker_processes_reads_what_grain_reads():
  g, l = porting.run_both(DATA_LOADER_WORKERS)
  flat = lambda batches: sorted(int(v) for b in batches for v in np.ravel(b))
  for ns in (g, l):
    for steps, (actual, skipped) in ns.with_workers.items():
      # Resumed where the state was taken: every element exactly once.
      assert flat(actual) == [2, 4, 6, 8, 10, 12, 14, 16], (steps, plain(actual))
      assert flat([skipped]) == flat([actual[steps]])
    assert flat(ns.in_memory) == [2, 4, 6, 8]
  # loader batches one stream, the same for any worker count. Grain batches
  # each worker's slice separately, but here worker 0 reads the even indices,
  # all of which FilterEven drops after PlusOne, so Grain's batches are all
  # worker 1's and equal loader's.
  assert plain(l.with_workers[1][0]) == EXPECTED_CHECKPOINT_STREAM
  assert plain(l.in_memory) == [[2, 4], [6, 8]]
  assert plain(l.with_workers) == plain(g.with_workers)
  assert plain(l.in_memory) == plain(g.in_memory)


# ---- Orbax v1: Grain 0.2.18's iterators are StatefulCheckpointables ----------
# DatasetIterator and DataLoaderIterator define `async save(directory)` /
# `load(directory)` ("Orbax checkpointing API" in grain's dataset.py and
# data_loader.py), which orbax.checkpoint.v1 finds by duck typing; MaxText's
# GrainCheckpointable_v1 delegates to them when `hasattr(item, "save")`.

ORBAX_V1 = """
import grain.python as grain
from orbax.checkpoint import v1 as ocp


def make_dataset_iterator():
  return iter(grain.MapDataset.range(20).shuffle(seed=3).map(lambda x: x * 2).batch(3).to_iter_dataset())


def make_data_loader_iterator():
  sampler = grain.IndexSampler(num_records=20, shuffle=True, seed=3, num_epochs=1, shard_options=grain.NoSharding())
  return iter(grain.DataLoader(data_source=grain.RangeDataSource(0, 20, 1), sampler=sampler,
                               operations=[grain.Batch(batch_size=3)], worker_count=0))


streams = {}
for name, make in (("dataset", make_dataset_iterator), ("data_loader", make_data_loader_iterator)):
  it = make()
  head = [next(it) for _ in range(2)]
  ocp.save_checkpointables(f"{directory}/{name}", dict(data_iter=it))
  rest = list(it)
  restored = make()
  ocp.load_checkpointables(f"{directory}/{name}", dict(data_iter=restored))
  streams[name] = (head, rest, list(restored))
"""


def test_iterators_checkpoint_with_orbax_v1(tmp_path):
  g, l = [porting.run(ORBAX_V1, lib, directory=str(tmp_path / lib)) for lib in porting.LIBS]
  for ns in (g, l):
    for name, (head, rest, resumed) in ns.streams.items():
      assert plain(resumed) == plain(rest), name
      assert sorted(v for b in plain(head + rest) for v in b) == sorted(
          2 * x if name == "dataset" else x for x in range(20)), name
  assert plain(l.streams) == plain(g.streams)  # Grain's shuffles: the same batches.


# ---- The harness: only import lines change ---------------------------------

def test_only_import_lines_are_rewritten():
  source = ("import grain\nimport grain.python as pygrain  # comment\nfrom grain import python as grain2\n"
            "from grain.experimental import FlatMapTransform\n  import grain\nimport grain_utils\n"
            "x = 'import grain'\n")
  assert porting.to_loader(source) == (
      "import loader as grain\nimport loader.python as pygrain  # comment\nfrom loader import python as grain2\n"
      "from loader.experimental import FlatMapTransform\n  import loader as grain\nimport grain_utils\n"
      "x = 'import grain'\n")
  with pytest.raises(ValueError, match="import grain.python as <name>"):
    porting.to_loader("import grain.python\n")


def test_every_import_spelling_runs_on_both():
  g, l = porting.run_both("""
from grain import python as grain
from grain.experimental import batch_and_pad
import grain.python as pygrain
import grain as top

result = [list(grain.MapDataset.range(5).batch(2, batch_fn=lambda xs: batch_and_pad(xs, batch_size=2))),
          pygrain.MapDataset is top.MapDataset, top.python.MapDataset is top.MapDataset]
""")
  assert plain(l.result) == plain(g.result) == [[[0, 1], [2, 3], [4, 0]], True, True]
  assert g.grain.__name__.startswith("grain") and l.grain.__name__.startswith("loader")


# ---- Found by the differential fuzzer ---------------------------------------

def test_batch_of_one_over_an_infinite_dataset_streams_like_grain():
  g, l = porting.run_both("""
import itertools
import grain.python as grain

it = iter(grain.MapDataset.range(10).repeat().to_iter_dataset().batch(1))
batches = [b.tolist() for b in itertools.islice(it, 12)]
""")
  assert l.batches == g.batches == [[i % 10] for i in range(12)]


def test_a_second_seed_after_an_iterator_stage_overrides_the_first_like_grain():
  g, l = porting.run_both("""
import grain.python as grain

ds = grain.MapDataset.range(10).to_iter_dataset().filter(lambda x: x % 2 == 0)
drawn = list(ds.seed(1).seed(2).random_map(lambda x, rng: (x, int(rng.integers(100)))))
only_second = list(ds.seed(2).random_map(lambda x, rng: (x, int(rng.integers(100)))))
""")
  assert plain(l.drawn) == plain(g.drawn)
  assert plain(l.only_second) == plain(g.only_second)


def test_a_users_own_iterator_state_is_set_as_in_grain():
  # Grain's prefetch_test.test_parent_dataset_modifies_state: a custom iterator's own state layout,
  # written by hand or saved by Grain, is the iterator's to read, plain or below loader's stages.
  g, l = porting.run_both("""
import grain.python as grain

class CountIt(grain.DatasetIterator):
  def __init__(self):
    super().__init__()
    self.i = 0
  def __next__(self):
    self.i += 1
    return self.i
  def get_state(self):
    return {"i": self.i}
  def set_state(self, state):
    self.i = state["i"]

class CountDs(grain.IterDataset):
  def __iter__(self):
    return CountIt()

class Doubled(grain.MapDataset):
  def __init__(self, parent):
    super().__init__(parent)
  def __len__(self):
    return len(self._parent)
  def __getitem__(self, index):
    return 2 * self._parent[index]

results = {}
for name, wrap in [("plain", lambda d: d),
                   ("thread_prefetch", lambda d: grain.experimental.ThreadPrefetchIterDataset(d, prefetch_buffer_size=1)),
                   ("map", lambda d: d.map(lambda x: x * 10))]:
  it = iter(wrap(CountDs()))
  it.set_state({"i": 5})
  results[name] = [next(it), next(it)]
it = iter(Doubled(grain.MapDataset.range(10)).to_iter_dataset())
it.set_state({"next_index": 4})  # As Grain saves it.
results["custom MapDataset"] = list(it)
""")
  assert l.results == g.results == {"plain": [6, 7], "thread_prefetch": [6, 7], "map": [60, 70],
                                    "custom MapDataset": [8, 10, 12, 14, 16, 18]}


@pytest.mark.parametrize("lib", ["grain", "loader"])
def test_apply_refuses_a_tf_random_map_as_grain_does(lib):
  g = importlib.import_module(lib)

  class AddNoise(g.transforms.TfRandomMap):

    def np_random_map(self, x, rng):
      return x + rng.integers(10)

  with pytest.raises(NotImplementedError):
    g.experimental.apply_transformations(g.MapDataset.range(3).seed(1), AddNoise())


def test_negative_indices_read_epoch_minus_one_like_grain():
  # Grain passes ds[-i] down as it is: each op reads "epoch -1", so a shuffle reorders it and a
  # map_with_index sees the negative index; a random map refuses it.
  g, l = porting.run_both("""
import grain
from grain.experimental import ZipMapDataset

R = grain.MapDataset.range
cases = {
    "range": R(10), "range_step": R(3, 13, 2), "source": grain.MapDataset.source(list(range(10))),
    "shuffle": R(10).shuffle(seed=8), "map": R(10).map(lambda x: -x),
    "map_with_index": R(10).map_with_index(lambda i, x: (i, x)),
    "sliced_map_with_index": R(10)[1:-1].map_with_index(lambda i, x: (i, x)),
    "batch": R(10).batch(3), "batch_drop": R(10).batch(3, drop_remainder=True), "slice": R(10)[1:9:3],
    "repeat": R(10).repeat(2), "repeat_forever": R(10).repeat(), "filter": R(10).filter(lambda x: x % 2 == 0),
    "concatenate": grain.MapDataset.concatenate([R(3), R(100, 104)]),
    "mix": grain.MapDataset.mix([R(5), R(500, 520)], [2, 1]), "zip": ZipMapDataset([R(5), R(10, 15)]),
}
got = {name: [ds[i] for i in (-1, -2, -7, -25)] for name, ds in cases.items()}
try:
  R(10).seed(3).random_map(lambda x, rng: int(rng.integers(100)))[-1]
except Exception as e:
  random_map_error = type(e).__name__
""")
  assert plain(l.got) == plain(g.got)
  assert g.got["shuffle"][0] != 8  # Epoch -1's order, not the last of epoch 0 (5 on Grain).
  assert l.random_map_error == g.random_map_error == "OverflowError"
