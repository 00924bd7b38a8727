"""More patterns of public Grain clients, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found in axlearn (custom MapDataset subclasses recording `self._stats`,
private `grain._src` imports), xlstm-jax (private transformation modules,
custom iterators), tunix (batching JAX-registered dataclasses), airio
(reading and editing the DataLoader's `last_seen_indices`), and Grain's own
tests (64-bit seeds, `next()` after `close()`, maps that must run in workers).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import porting
from tests.porting import plain

# axlearn's _ProportionalSliceMapDataset and xlstm-jax's rampup iterator call
# self._stats in their hot paths.
STATS_SUBCLASSES = """
import grain
from grain._src.python.dataset import dataset as dataset_base

class EveryOther(dataset_base.MapDataset):
  def __len__(self):
    return len(self._parent) // 2
  def __getitem__(self, i):
    with self._stats.record_self_time():
      i = 2 * (i % len(self))
    return self._stats.record_output_spec(self._parent[i])

class DoubleIterator(grain.DatasetIterator):
  def __next__(self):
    with self._stats.record_self_time(num_elements=1):
      x = next(self._parent)
    return self._stats.record_output_spec(2 * x)
  def get_state(self):
    return self._parent.get_state()
  def set_state(self, state):
    self._parent.set_state(state)

class Double(grain.IterDataset):
  def __iter__(self):
    return DoubleIterator(self._parent.__iter__())

every_other = EveryOther(grain.MapDataset.range(10))
got_map = [every_other[1], list(every_other.to_iter_dataset())]
got_iter = list(Double(grain.MapDataset.range(4).to_iter_dataset()))
"""


def test_custom_subclasses_record_stats_as_on_grain():
  g, l = porting.run_both(STATS_SUBCLASSES)
  assert plain(l.got_map) == plain(g.got_map) == [2, [0, 2, 4, 6, 8]]
  assert plain(l.got_iter) == plain(g.got_iter) == [0, 2, 4, 6]


# A custom iterator whose state is an int, alone and under IterDataset.mix.
NON_DICT_STATE = """
import grain

class CountingIterator(grain.DatasetIterator):
  def __init__(self, parent):
    super().__init__(parent)
    self._n = 0
  def __next__(self):
    self._n += 1
    return next(self._parent)
  def get_state(self):
    return self._n
  def set_state(self, state):
    for _ in range(state):
      next(self._parent)
    self._n = state

class Counting(grain.IterDataset):
  def __iter__(self):
    return CountingIterator(self._parent.__iter__())

ds = Counting(grain.MapDataset.range(6).to_iter_dataset())
it = iter(ds)
head = [next(it), next(it)]
state = it.get_state()
resumed = iter(ds)
resumed.set_state(state)
rest = list(resumed)

mixed = grain.IterDataset.mix([ds, Counting(grain.MapDataset.range(10, 16).to_iter_dataset())], [0.5, 0.5])
it = iter(mixed)
mixed_head = [next(it) for _ in range(3)]
mixed_state = it.get_state()
mixed_resumed = iter(mixed)
mixed_resumed.set_state(mixed_state)
mixed_rest = list(mixed_resumed)
mixed_expected = list(it)
"""


def test_a_custom_iterators_non_dict_state_round_trips_as_on_grain():
  g, l = porting.run_both(NON_DICT_STATE)
  assert l.state == g.state == 2  # Returned as the iterator returns it, not wrapped.
  assert plain(l.rest) == plain(g.rest) == [2, 3, 4, 5]
  assert plain(l.mixed_head) == plain(g.mixed_head)
  assert plain(l.mixed_rest) == plain(l.mixed_expected) == plain(g.mixed_rest)


# tunix batches flax.struct dataclasses (registered with JAX as pytrees);
# Grain batches through JAX's tree utilities whenever JAX is installed.
PYTREES = """
import collections
import dataclasses
import jax
import numpy as np
import grain

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainingInput:
  input_tokens: np.ndarray
  input_mask: np.ndarray

@jax.tree_util.register_pytree_node_class
class Pair:
  def __init__(self, x, y):
    self.x, self.y = x, y
  def tree_flatten(self):
    return (self.x, self.y), None
  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children)

def describe(x):
  if isinstance(x, TrainingInput):
    return ["TrainingInput", describe(x.input_tokens), describe(x.input_mask)]
  if isinstance(x, Pair):
    return ["Pair", describe(x.x), describe(x.y)]
  if isinstance(x, dict):
    return [type(x).__name__, [[k, describe(v)] for k, v in x.items()]]
  if isinstance(x, (list, tuple)):
    return [type(x).__name__, [describe(v) for v in x]]
  if x is None:
    return None
  return [str(np.asarray(x).dtype), np.asarray(x).tolist()]

inputs = [TrainingInput(np.arange(3) + i, np.ones(3, bool)) for i in range(4)]
batched_map = describe(grain.MapDataset.source(inputs).batch(2)[1])
batched_iter = [describe(b) for b in grain.MapDataset.source(inputs).to_iter_dataset().batch(2)]
loader_batches = [describe(b) for b in grain.DataLoader(
    data_source=inputs, sampler=grain.samplers.SequentialSampler(4, grain.sharding.NoSharding()),
    operations=[grain.transforms.Batch(2)], worker_count=0)]
nested = describe(grain.MapDataset.source(
    [{"z": TrainingInput(np.arange(2) * i, np.zeros(1)), "a": [Pair(i, {"k": np.arange(2)}), 3]} for i in range(2)]
).batch(2)[0])
none_child = describe(grain.MapDataset.source([TrainingInput(np.arange(2), None)] * 2).batch(2)[0])
ordered = describe(grain.MapDataset.source([collections.OrderedDict([("z", 1), ("a", 2)])] * 2).batch(2)[0])
try:
  grain.MapDataset.source([collections.OrderedDict([("z", 1), ("a", 2)]),
                           collections.OrderedDict([("a", 2), ("z", 1)])]).batch(2)[0]
  mixed_orders = "batched"
except ValueError:
  mixed_orders = "ValueError"
default = collections.defaultdict(list, {"b": 1, "a": 2})
defaults = grain.MapDataset.source([default, default]).batch(2)[0]
defaults = [type(defaults).__name__, defaults.default_factory.__name__, describe(dict(defaults))]
"""


def test_jax_pytree_elements_and_dict_flavours_batch_as_on_grain():
  g, l = porting.run_both(PYTREES)
  for name in ("batched_map", "batched_iter", "loader_batches", "nested", "none_child", "ordered", "defaults",
               "mixed_orders"):
    assert getattr(l, name) == getattr(g, name), name
  assert l.batched_map == ["TrainingInput", ["int64", [[2, 3, 4], [3, 4, 5]]], ["bool", [[True] * 3] * 2]]
  assert l.ordered[1][0][0] == "z"  # An OrderedDict keeps its order; a dict's keys come out sorted.


# airio's benchmark reads `last_seen_indices` from the DataLoader's JSON state
# and edits it to skip ahead.
DATALOADER_STATE_KEYS = """
import json
import grain.python as grain

def make(sampler):
  return grain.DataLoader(data_source=list(range(100, 120)), sampler=sampler, operations=[], worker_count=0)

dl = make(grain.SequentialSampler(num_records=20, shard_options=grain.NoSharding()))
it = iter(dl)
initial = json.loads(it.get_state().decode())
next(it)
after_one = json.loads(it.get_state().decode())
edited = dict(after_one, last_seen_indices={"0": 4})  # As if 5 records had been read.
it2 = iter(dl)
it2.set_state(json.dumps(edited, indent=4).encode())
skipped_to = next(it2)

sharded = make(grain.IndexSampler(20, grain.ShardOptions(1, 2), shuffle=True, seed=3, num_epochs=1))
it = iter(sharded)
for _ in range(3):
  next(it)
sharded_state = json.loads(it.get_state().decode())
sharded_rest = list(it)
it2 = iter(sharded)
it2.set_state(json.dumps(sharded_state).encode())
sharded_resumed = list(it2)
GRAIN_KEYS = ("version", "last_seen_indices", "last_worker_index", "worker_count")
grain_keys = [{k: s[k] for k in GRAIN_KEYS} for s in (initial, after_one, sharded_state)]
"""


def test_dataloader_state_has_grains_keys_and_honours_edits_to_them():
  g, l = porting.run_both(DATALOADER_STATE_KEYS)
  assert l.grain_keys == g.grain_keys
  assert l.grain_keys[1]["last_seen_indices"] == {"0": 0}
  assert l.skipped_to == g.skipped_to == 105
  assert plain(l.sharded_rest) == plain(l.sharded_resumed) == plain(g.sharded_rest)


def test_dataloader_grain_keys_describe_the_position_for_its_worker_count():
  import loader  # pylint: disable=g-import-not-at-top
  dl = loader.DataLoader(data_source=list(range(30)), sampler=loader.samplers.SequentialSampler(30, loader.sharding.NoSharding()),
                         operations=[loader.transforms.Batch(2)], worker_count=2)
  with iter(dl) as it:
    for _ in range(3):
      next(it)
    state = json.loads(it.get_state().decode())
    rest = [b.tolist() for b in it]
  # 6 records read round-robin by 2 workers: each read 3, worker 1 last.
  assert (state["last_seen_indices"], state["last_worker_index"], state["worker_count"]) == ({"0": 4, "1": 5}, -1, 2)
  with iter(dl) as it:
    it.set_state(json.dumps(state).encode())
    assert [b.tolist() for b in it] == rest
  state["last_seen_indices"] = {"0": 8, "1": 9}  # Edited: 10 records.
  with iter(dl) as it:
    it.set_state(json.dumps(state).encode())
    assert next(it).tolist() == [10, 11]


# Private module paths public clients import (axlearn, xlstm-jax, MaxText,
# notebooks), and Grain's internal classes built directly with transforms.
PRIVATE_PATHS = """
import grain
from grain._src.core import sharding
from grain._src.core import transforms
from grain._src.python.data_loader import _determine_worker_count
from grain._src.python.dataset import stats as dataset_stats
from grain._src.python.dataset.transformations.batch import BatchIterDataset, make_batch
from grain._src.python.dataset.transformations.filter import FilterMapDataset
from grain._src.python.dataset.transformations.flatmap import FlatMapIterDataset
from grain._src.python.dataset.transformations.map import MapIterDataset, MapMapDataset, RandomMapMapDataset
from grain._src.python.dataset.transformations.packing import FirstFitPackIterDataset
from grain._src.python.dataset.transformations.prefetch import ThreadPrefetchIterDataset
from grain._src.python.dataset.transformations.shuffle import ShuffleMapDataset
from grain._src.python.dataset.transformations.source import SourceMapDataset
from grain._src.python.dataset.transformations.zip import ZipIterDataset
from grain._src.python.experimental.index_shuffle.python import index_shuffle_module

class Plus(transforms.Map):
  def map(self, x):
    return x + 1

class Odd(transforms.Filter):
  def filter(self, x):
    return x % 2 == 1

src = SourceMapDataset(list(range(10)))
got = [
    list(MapMapDataset(src, Plus())), list(MapMapDataset(src, lambda x: 2 * x)), list(FilterMapDataset(src, Odd())),
    list(ShuffleMapDataset(src, seed=3)), list(BatchIterDataset(src.to_iter_dataset(), 3, True)),
    list(MapIterDataset(src.to_iter_dataset(), Plus())),
    list(RandomMapMapDataset(src, lambda x, rng: int(rng.integers(1000)), seed=5)),
    make_batch([{"a": 1}, {"a": 2}]), index_shuffle_module.index_shuffle(3, 9, 42, 4),
    sharding.even_split(10, sharding.ShardOptions(1, 3)), list(ZipIterDataset([src.to_iter_dataset()] * 2))[:2],
    _determine_worker_count(3), isinstance(src.shuffle(1), ShuffleMapDataset),
    FirstFitPackIterDataset is grain.experimental.FirstFitPackIterDataset,
    ThreadPrefetchIterDataset is grain.experimental.ThreadPrefetchIterDataset,
    FlatMapIterDataset is grain.experimental.FlatMapIterDataset, hasattr(dataset_stats, "Stats"),
]
"""


def test_private_module_paths_of_clients_port():
  g, l = porting.run_both(PRIVATE_PATHS)
  assert plain(l.got) == plain(g.got)


def test_every_mapped_private_name_exists_in_grain_and_resolves():
  import importlib  # pylint: disable=g-import-not-at-top

  import loader._src as shims  # pylint: disable=g-import-not-at-top
  for module, names in shims._MODULES.items():  # pylint: disable=protected-access
    grain_module = importlib.import_module(f"grain._src.{module}")
    ours = importlib.import_module(f"loader._src.{module}")
    for name, target in names.items():
      assert hasattr(grain_module, name), f"grain._src.{module}.{name}"
      assert getattr(ours, name) is shims.resolve(target)
  with pytest.raises(AttributeError, match="grain._src.python.dataset.stats"):
    importlib.import_module("loader._src.python.dataset.stats").make_stats  # pylint: disable=expression-not-assigned


# Grain's dataset_test uses seed=893247023984: seed() and random_map take
# any non-negative seed (shuffles keep Grain's 32-bit limit).
BIG_SEEDS = """
import grain
ds = grain.MapDataset.range(5)
drawn = list(ds.random_map(lambda x, rng: x + int(rng.integers(100)), seed=893247023984))
drawn_iter = list(ds.to_iter_dataset().random_map(lambda x, rng: x + int(rng.integers(100)), seed=2**40))
derived = list(ds.seed(2**32).shuffle())
derived_map = list(ds.seed(2**33 + 7).random_map(lambda x, rng: int(rng.integers(1000))))
"""


def test_seeds_of_64_bits_as_on_grain():
  g, l = porting.run_both(BIG_SEEDS)
  for name in ("drawn", "drawn_iter", "derived", "derived_map"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name


# Each snippet defines attempt(); the test checks it raises what Grain raises
# (from Grain's own tests: prefetch_test.test_invalid_checkpoint,
# samplers_test.test_invalid_non_integer_seed, interleave_test.test_options_propagated).
RAISES = {
    "next_after_close": ("ValueError", """
def attempt():
  it = iter(grain.MapDataset.range(10).to_iter_dataset())
  next(it)
  it.close()
  next(it)
"""),
    "checkpoint_past_the_end": ("IndexError", """
def attempt():
  iter(grain.MapDataset.range(20).to_iter_dataset()).set_state({"next_index": 30})
"""),
    "tuple_seed": ("TypeError", """
def attempt():
  grain.samplers.IndexSampler(num_records=4, shard_options=grain.sharding.NoSharding(), shuffle=True,
                              num_epochs=2, seed=(3, 4))
"""),
    "options_set_around_an_interleave_reach_its_inputs": ("ValueError", """
def attempt():
  ds1 = grain.MapDataset.source([1]).repeat(1000).to_iter_dataset().filter(lambda x: False)
  ds2 = grain.MapDataset.source([2]).repeat(1000).to_iter_dataset()
  list(grain.experimental.WithOptionsIterDataset(
      grain.experimental.InterleaveIterDataset([ds1, ds2], cycle_length=1),
      grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)))
"""),
    # Client code restoring a state of the wrong shape, or opening a missing or foreign file.
    "state_without_its_key": ("KeyError", """
def attempt():
  iter(grain.MapDataset.range(10).shuffle(seed=1).to_iter_dataset()).set_state({"step": 3})
"""),
    "state_that_is_none": ("TypeError", """
def attempt():
  iter(grain.MapDataset.range(10).to_iter_dataset()).set_state(None)
"""),
    "state_position_of_another_type": ("TypeError", """
def attempt():
  iter(grain.MapDataset.range(10).to_iter_dataset()).set_state({"next_index": "3"})
"""),
    "array_record_file_missing": ("RuntimeError", """
def attempt():
  grain.sources.ArrayRecordDataSource("/nonexistent/data.array_record")
"""),
    "not_an_array_record_file": ("RuntimeError", """
import tempfile
def attempt():
  with tempfile.NamedTemporaryFile(suffix=".array_record") as f:
    f.write(b"some text, not ArrayRecord")
    f.flush()
    grain.sources.ArrayRecordDataSource(f.name)[0]
"""),
}


@pytest.mark.parametrize("case", sorted(RAISES))
def test_raises_as_on_grain(case):
  expected, body = RAISES[case]
  snippet = f"import grain\n{body}\ntry:\n  attempt()\n  outcome = 'returned'\nexcept {expected}:\n  outcome = {expected!r}\n"
  g, l = porting.run_both(snippet)
  assert l.outcome == g.outcome == expected


# A map under mp_prefetch runs in the workers only (it may crash or hang a
# process, or initialise an accelerator): count where it ran.
MAP_IN_WORKERS = """
import collections, json, os
import grain

MAIN = os.getpid()

def in_main(x):
  return os.getpid() == MAIN

if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  ds = grain.MapDataset.range(300).map(in_main).to_iter_dataset()
  print(json.dumps(dict(collections.Counter(str(x) for x in ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))))))
"""


@pytest.mark.parametrize("lib", porting.LIBS)
def test_a_user_map_under_mp_prefetch_never_runs_in_the_parent(lib, tmp_path):
  assert porting.run_script(MAP_IN_WORKERS, lib, tmp_path) == {"False": 300}


def test_waiting_maps_use_the_read_threads_and_keep_the_stream():
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  import loader  # pylint: disable=g-import-not-at-top

  seen = set()

  def waits(x):
    seen.add(threading.current_thread().name)
    time.sleep(0.002)  # Releases the GIL, as I/O does.
    return x * x

  base = loader.MapDataset.range(300).shuffle(seed=1).map(waits)
  one = list(base.to_iter_dataset(loader.ReadOptions(num_threads=1)))
  assert len(seen) == 1
  seen.clear()
  many = list(base.to_iter_dataset(loader.ReadOptions(num_threads=8)))
  assert many == one == [x * x for x in loader.MapDataset.range(300).shuffle(seed=1)]
  assert len({name for name in seen if name.startswith("loader-map")}) > 1


# A custom iterator whose own state uses a key loader adds to states.
STATE_KEY_COLLISION = """
import grain

class Tagged(grain.DatasetIterator):
  def __init__(self, parent):
    super().__init__(parent)
    self._n = 0
  def __next__(self):
    self._n += 1
    return next(self._parent)
  def get_state(self):
    return {"pipeline": self._n, "parent": self._parent.get_state()}
  def set_state(self, state):
    self._n = state["pipeline"]
    self._parent.set_state(state["parent"])

class TaggedDataset(grain.IterDataset):
  def __iter__(self):
    return Tagged(self._parent.__iter__())

ds = TaggedDataset(grain.MapDataset.range(6).to_iter_dataset())
it = iter(ds)
head = [next(it), next(it)]
resumed = iter(ds)
resumed.set_state(it.get_state())
rest = list(resumed)
"""


def test_a_custom_state_may_use_loaders_state_keys():
  g, l = porting.run_both(STATE_KEY_COLLISION)
  assert plain(l.rest) == plain(g.rest) == [2, 3, 4, 5]


NESTED_CUSTOM_STATES = """
import grain

class Counting(grain.DatasetIterator):
  def __init__(self, parent, as_dict):
    super().__init__(parent)
    self._n, self._as_dict = 0, as_dict
  def __next__(self):
    self._n += 1
    return next(self._parent)
  def get_state(self):
    return {"pipeline": "mine", "n": self._n} if self._as_dict else self._n
  def set_state(self, state):
    n = state["n"] if self._as_dict else state
    if self._as_dict:
      assert state["pipeline"] == "mine", state
    for _ in range(n):
      next(self._parent)
    self._n = n

class CountingDataset(grain.IterDataset):
  def __init__(self, parent, as_dict):
    super().__init__(parent)
    self._as_dict = as_dict
  def __iter__(self):
    return Counting(self._parent.__iter__(), self._as_dict)

out = {}
for as_dict in (False, True):
  for stage in ("map", "batch"):
    ds = CountingDataset(grain.MapDataset.range(8).to_iter_dataset(), as_dict)
    ds = ds.map(lambda x: x * 10) if stage == "map" else ds.batch(2)
    it = iter(ds)
    next(it)
    resumed = iter(ds)
    resumed.set_state(it.get_state())
    out[f"{as_dict}-{stage}"] = [list(map(int, x)) if stage == "batch" else int(x) for x in resumed]
"""


def test_custom_states_round_trip_under_loader_stages():
  g, l = porting.run_both(NESTED_CUSTOM_STATES)
  assert l.out == g.out


# grain.experimental.get_next_index / set_next_index on MapDataset-part iterators.
NEXT_INDEX = """
import grain
from grain.experimental import get_next_index, set_next_index
out = []
for ds in [grain.MapDataset.range(20).to_iter_dataset(),
           grain.MapDataset.range(20).shuffle(seed=3).map(lambda x: x * 2).to_iter_dataset(),
           grain.MapDataset.range(20).to_iter_dataset().batch(3),
           grain.MapDataset.range(20).to_iter_dataset().map(lambda x: x + 1),
           grain.MapDataset.range(20).batch(4).to_iter_dataset()]:
  it = iter(ds)
  first = get_next_index(it)
  head = [next(it) for _ in range(3)]
  after = get_next_index(it)
  set_next_index(it, 4)
  out.append([first, after, get_next_index(it), head, next(it)])
"""


def test_get_and_set_next_index_as_on_grain():
  g, l = porting.run_both(NEXT_INDEX)
  assert plain(l.out) == plain(g.out)


# Run metadata and version gates (`{"grain": grain.__version__}`); kauldron's
# `from grain._src.core import constants`; tree helpers and the package's
# modules as attributes (crossformer: `gd.dataset`, `gd.stats`).
VERSION_AND_CORE = """
import numpy as np
import grain
from grain._src.core import config, constants, tree_lib
from grain._src.python import dataset as gd
from grain._src.python.dataset.transformations import prefetch, process_prefetch

version = (grain.__version__, list(grain.__version_info__))
gate = tuple(int(p) for p in grain.__version__.split(".")[:2]) >= (0, 2)
keys = [constants.INDEX, constants.SEED, constants.RECORD_KEY]
tree = {"a": [1, 2, (3, None)], "b": np.arange(2)}
flat = tree_lib.flatten(tree)
rebuilt = tree_lib.unflatten_as(tree, list(range(len(flat))))
doubled = tree_lib.map_structure(lambda x: x * 2, tree)
paths = [len(p) for p, _ in tree_lib.flatten_with_path(tree)]
is_prefetch = isinstance(grain.MapDataset.range(3).to_iter_dataset(), prefetch.PrefetchIterDataset)
rebuilt_prefetch = list(prefetch.PrefetchIterDataset(grain.MapDataset.range(3), read_options=grain.ReadOptions()))
modules = [gd.dataset.MapDataset is grain.MapDataset, hasattr(gd.stats, "Stats")]
kill_timeout_is_a_number = isinstance(process_prefetch._PROCESS_KILL_TIMEOUT_S, (int, float))
config.config.update("py_debug_mode", False)
"""


def test_version_core_modules_and_tree_helpers_as_on_grain():
  g, l = porting.run_both(VERSION_AND_CORE)
  for name in ("version", "gate", "keys", "flat", "rebuilt", "doubled", "paths", "is_prefetch", "rebuilt_prefetch",
               "modules", "kill_timeout_is_a_number"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name


# Clients read and write `state["next_index"]` (ttt logs it after a restore):
# after to_iter_dataset().batch(n) Grain's state counts elements, not batches.
BATCH_STATE = """
import json
import grain
ds = grain.MapDataset.range(11).shuffle(seed=4).to_iter_dataset().batch(3)
it = iter(ds)
positions, restored = [], []
for _ in ds:
  next(it)
  state = json.loads(json.dumps(it.get_state()))
  positions.append(state["next_index"])
  again = iter(ds)
  again.set_state(state)
  restored.append([b.tolist() for b in again])
dropped = grain.MapDataset.range(11).to_iter_dataset().batch(3, drop_remainder=True)
it = iter(dropped)
dropped_positions = [it.get_state()["next_index"] for _ in iter(dropped) if next(it) is not None]
"""


def test_a_batch_after_to_iter_dataset_counts_elements_in_the_state_as_on_grain():
  g, l = porting.run_both(BATCH_STATE)
  for name in ("positions", "restored", "dropped_positions"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name


def test_grain_resumes_a_loader_state_of_a_batch_after_to_iter_dataset():
  import grain  # pylint: disable=g-import-not-at-top
  import loader  # pylint: disable=g-import-not-at-top
  ours = loader.MapDataset.range(11).shuffle(seed=4).to_iter_dataset().batch(3)
  it = iter(ours)
  next(it)
  next(it)
  theirs = iter(grain.MapDataset.range(11).shuffle(seed=4).to_iter_dataset().batch(3))
  theirs.set_state(it.get_state())  # Grain reads next_index and ignores loader's description.
  assert plain(list(theirs)) == plain(list(it))


# Grain's mp_prefetch with 0 workers is no node, so a random_map after it draws
# with the seed an upstream seed() gives; loader's draws so with any worker count.
SEED_THROUGH_MP_PREFETCH = """
import grain
rm = lambda x, rng: int(x) * 1000 + int(rng.integers(1000))
ds = grain.MapDataset.range(4).seed(53).to_iter_dataset()
direct = list(ds.random_map(rm))
no_workers = list(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=0)).random_map(rm))
"""


def test_a_seed_reaches_a_random_map_after_mp_prefetch_without_workers_as_on_grain():
  g, l = porting.run_both(SEED_THROUGH_MP_PREFETCH)
  assert l.direct == l.no_workers == g.direct == g.no_workers


GRAIN_KEYWORDS_AND_HOOKS = """
import grain
from grain.experimental import CacheIterDataset, InterleaveIterDataset
cached = list(CacheIterDataset(parent=grain.MapDataset.range(3).to_iter_dataset()))
inter = InterleaveIterDataset([grain.MapDataset.range(i * 10, i * 10 + 2).to_iter_dataset() for i in range(4)],
                              cycle_length=2)
inter.set_slice(slice(1, None, 2))
sliced = list(inter)
import grain.python as gp
op = gp.BatchOperation(batch_size=2)
op.disable_deprecation_message()
dl = grain.DataLoader(data_source=grain.sources.RangeDataSource(0, 4, 1),
                      sampler=grain.samplers.SequentialSampler(4, grain.sharding.NoSharding()),
                      operations=[grain.transforms.Batch(2)])
batches = [b.tolist() for b in grain.DataLoaderIterator(dl, None, validate_state=False)]
"""


def test_grain_keywords_and_hooks_clients_call():
  g, l = porting.run_both(GRAIN_KEYWORDS_AND_HOOKS)
  assert l.cached == g.cached == [0, 1, 2]
  assert l.sliced == g.sliced
  assert l.batches == g.batches == [[0, 1], [2, 3]]
