"""loader's DataLoader against Grain 0.2.18's: same snippets, same elements, exact checkpoints.

Each snippet runs once with `grain.python` and once with `loader.python` (the
import line is the only difference). The streams are equal element by element,
shuffled or not (random maps included: the per-record generator is Grain's),
and Grain's checkpoints resume at Grain's next element.
"""

from __future__ import annotations

import json

import absl.flags
import grain
import grain.python as gp
import numpy as np
import pytest

import loader.python as lp
from loader import checkpoint
from loader import transforms
from tests import loader_testing

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


class Source:
  """A small data source whose repr both libraries embed in their checkpoints."""

  def __init__(self, n: int):
    self._n = n

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int):
    return {"id": np.int64(i), "x": np.full(3, i, np.float32)}

  def __repr__(self) -> str:
    return f"Source(n={self._n})"


# Transforms subclassing Grain's classes: Grain needs that, and loader must
# accept them too. Module level, so Grain's worker processes can unpickle them.


class AddOne(gp.MapTransform):

  def map(self, x):
    return {**x, "x": x["x"] + 1}


class DropThirds(gp.FilterTransform):

  def filter(self, x):
    return int(x["id"]) % 3 != 2


class Jitter(gp.RandomMapTransform):

  def random_map(self, x, rng):
    return {**x, "noise": rng.integers(1000)}


class Duplicate(grain.experimental.FlatMapTransform):
  max_fan_out = 3

  def flat_map(self, x):
    return [x] * (int(x["id"]) % 3)


class SplitPastFanOut(grain.experimental.FlatMapTransform):
  max_fan_out = 1  # Grain's DataLoader does not enforce it: parts' indices run into the next record's.

  def flat_map(self, x):
    return [x, {**x, "x": x["x"] + 1}]


class SumBatch(gp.MapTransform):

  def map(self, batch):
    return {"id": batch["id"], "total": batch["x"].sum(axis=-1)}


class StreamingSource(Source):
  """A source that ignores the index asked and returns its next record (as MaxText's HFDataSource)."""

  def __init__(self, n: int):
    super().__init__(n)
    self._next = 0

  def __getitem__(self, i: int):  # pylint: disable=unused-argument
    self._next += 1
    return {"id": np.int64(self._next - 1), "x": np.full(3, self._next - 1, np.float32)}


def make_loader(g, *, n=10, shard=(0, 1, False), sampler_shard=True, shuffle=False, num_epochs=2, seed=3,
                ops=lambda g: [], worker_count=0, sampler="index"):
  """The same DataLoader snippet for `g` = grain.python or loader.python."""
  shard_options = g.ShardOptions(*shard)
  if sampler == "index":
    sampler = g.IndexSampler(n, shard_options if sampler_shard else g.NoSharding(), shuffle=shuffle,
                             num_epochs=num_epochs, seed=seed)
  else:
    sampler = g.SequentialSampler(n, shard_options, seed=seed)
  return g.DataLoader(data_source=Source(n), sampler=sampler, operations=ops(g), worker_count=worker_count,
                      shard_options=shard_options)


def take(dl, limit=None):
  return loader_testing.take(iter(dl), limit)


def _sorted_keys(x):
  # Grain's batching goes through a tree library that sorts dict keys; ours
  # keeps the element's key order. Equal dicts either way.
  if isinstance(x, dict):
    return {k: _sorted_keys(x[k]) for k in sorted(x)}
  if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
    return type(x)(_sorted_keys(v) for v in x)
  return x


def assert_same_stream(ours, theirs):
  """Element by element: values, dtypes and shapes (dict key order aside)."""
  loader_testing.assert_streams_equal([_sorted_keys(x) for x in ours], [_sorted_keys(x) for x in theirs])


def ids(elements):
  """All element ids of a stream (of elements or batches), sorted."""
  return sorted(np.concatenate([np.atleast_1d(e["id"]) for e in elements]).tolist()) if elements else []


CONFIGS = {
    "map_filter_random_batch": dict(ops=lambda g: [AddOne(), DropThirds(), Jitter(), g.Batch(3)]),
    "random_batch_drop_then_map": dict(ops=lambda g: [Jitter(), g.Batch(4, drop_remainder=True), SumBatch()]),
    "two_batches": dict(ops=lambda g: [g.Batch(2), g.Batch(2)]),
    "sampler_and_loader_sharded": dict(n=11, shard=(1, 3, False), ops=lambda g: [AddOne(), g.Batch(2)]),
    "sharded_drop_remainder": dict(n=11, shard=(2, 3, True), ops=lambda g: [Jitter(), g.Batch(2)]),
    "loader_sharded_only": dict(n=11, shard=(1, 3, False), sampler_shard=False, ops=lambda g: [g.Batch(2)]),
    "sequential_sampler": dict(n=11, shard=(1, 3, True), sampler="sequential", ops=lambda g: [Jitter()]),
    "flat_map": dict(ops=lambda g: [Jitter(), Duplicate(), g.Batch(2)]),
    "flat_map_past_its_max_fan_out": dict(ops=lambda g: [Jitter(), SplitPastFanOut(), g.Batch(3)]),
    "legacy_operations": dict(ops=lambda g: [
        g.MapOperation(lambda x: {**x, "x": x["x"] * 2}),
        g.FilterOperation(lambda x: int(x["id"]) % 4 != 1),
        g.RandomMapOperation(lambda x, rng: {**x, "r": rng.random()}),
        g.BatchOperation(batch_size=3)]),
    "no_ops_one_epoch": dict(num_epochs=1),
}


@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
def test_in_process_stream_equals_grains(config):
  ours = take(make_loader(lp, **CONFIGS[config]))
  theirs = take(make_loader(gp, **CONFIGS[config]))
  assert ours
  assert_same_stream(ours, theirs)


def test_infinite_epochs_equal_grains():
  config = dict(num_epochs=None, ops=lambda g: [Jitter(), g.Batch(4)])
  assert_same_stream(take(make_loader(lp, **config), 13), take(make_loader(gp, **config), 13))


@pytest.mark.parametrize("shard", [(0, 1, False), (1, 3, False), (2, 3, True), (0, 3, True)])
def test_shuffled_shards_equal_grains(shard):
  # The sampler shuffles in Grain's order, so every shard's stream is Grain's.
  n = 10 if shard[2] else 12
  config = dict(n=n, shard=shard, shuffle=True, num_epochs=2, ops=lambda g: [DropThirds(), g.Batch(2)])
  ours, theirs = take(make_loader(lp, **config)), take(make_loader(gp, **config))
  assert_same_stream(ours, theirs)
  order = np.concatenate([np.atleast_1d(e["id"]) for e in ours]).tolist()
  assert order != sorted(order)


def test_map_with_index_gets_the_sampler_index():

  class Tag(transforms.MapWithIndex):

    def map_with_index(self, index, x):
      return (index, int(x["id"]))

  # Grain's DataLoader rejects MapWithIndex; loader passes the sampler index.
  # Shard 1 of 2 by the loader: sampler indices 1, 3, 5, ... over 2 epochs of 5.
  out = take(make_loader(lp, n=5, shard=(1, 2, False), sampler_shard=False, ops=lambda g: [Tag()]))
  assert out == [(1, 1), (3, 3), (5, 0), (7, 2), (9, 4)]


def test_transform_styles_give_the_same_stream():

  class OursMap(transforms.Map):

    def map(self, x):
      return {**x, "x": x["x"] + 1}

  class DuckMap:

    def map(self, x):
      return {**x, "x": x["x"] + 1}

  class DuckRandom:

    def random_map(self, x, rng):
      return {**x, "noise": rng.integers(1000)}

  class DuckBatch:
    batch_size, drop_remainder, batch_fn = 3, False, None

  reference = take(make_loader(lp, ops=lambda g: [AddOne(), Jitter(), g.Batch(3)]))
  for ops in ([OursMap(), Jitter(), lp.Batch(3)], [DuckMap(), DuckRandom(), DuckBatch()],
              [AddOne(), Jitter(), gp.Batch(3)]):
    assert_same_stream(take(make_loader(lp, ops=lambda g, ops=ops: ops)), reference)


def test_custom_operation_like_grains():

  def pairs(records):
    # A buffering Operation, Grain's legacy interface: records in, records out.
    previous = None
    for r in records:
      if previous is not None:
        yield type(r)(r.metadata, {"ids": (int(previous.data["id"]), int(r.data["id"]))})
        previous = None
      else:
        previous = r

  ours = take(make_loader(lp, ops=lambda g: [DropThirds(), pairs]))
  theirs = take(make_loader(gp, ops=lambda g: [DropThirds(), pairs]))
  assert ours == theirs and ours


@pytest.mark.parametrize("op,error,message", [
    (AddOne, TypeError, r"not the class AddOne; did you mean AddOne\(\)\?"),
    (42, TypeError, r"DataLoader operations\[0\] is 42; expected"),
])
def test_bad_operations_are_named(op, error, message):
  with pytest.raises(error, match=message):
    make_loader(lp, ops=lambda g: [op])


def test_argument_errors():
  with pytest.raises(ValueError, match=r"worker_count must be an integer >= 0 \(got worker_count=-1\)"):
    make_loader(lp, worker_count=-1)

  class Sampler:

    def __getitem__(self, i):
      return lp.RecordMetadata(index=i, record_key=i % 4)

  with pytest.raises(ValueError, match="DataLoader needs shard_options"):
    lp.DataLoader(data_source=Source(4), sampler=Sampler())
  # A custom sampler without a length: its size is found as Grain finds it.
  dl = lp.DataLoader(data_source=Source(4), sampler=Sampler(), shard_options=lp.NoSharding())
  assert dl.multiprocessing_options.num_workers == 0
  assert [int(x["id"]) for x in take(dl, 6)] == [0, 1, 2, 3, 0, 1]


def test_load_equals_grains():
  kwargs = dict(num_epochs=2, shuffle=False, seed=1, transformations=[AddOne(), Jitter()], batch_size=4,
                drop_remainder=True)
  assert_same_stream(take(lp.load(Source(9), **kwargs)), take(gp.load(Source(9), **kwargs)))


# ---- Worker processes ------------------------------------------------------


def light_loader(worker_count, ops=lambda g: [], **config):
  """`make_loader(lp, ...)` with function-local transforms and source.

  cloudpickle sends local classes by value, so loader's workers import only
  `loader` instead of this module (and with it Grain and JAX): seconds less
  per worker start. Same elements as the module-level classes.
  """

  class LocalSource:  # Not a subclass of Source: that would import this module.

    def __init__(self, n):
      self._n = n

    def __len__(self):
      return self._n

    def __getitem__(self, i):
      return {"id": np.int64(i), "x": np.full(3, i, np.float32)}

  class LocalDropThirds(transforms.Filter):

    def filter(self, x):
      return int(x["id"]) % 3 != 2

  class LocalJitter(transforms.RandomMap):

    def random_map(self, x, rng):
      return {**x, "noise": rng.integers(1000)}

  local = {DropThirds: LocalDropThirds, Jitter: LocalJitter}
  config = {"n": 10, "num_epochs": 2, "seed": 3, **config}
  sampler = lp.IndexSampler(config["n"], num_epochs=config["num_epochs"], seed=config["seed"])
  return lp.DataLoader(data_source=LocalSource(config["n"]), sampler=sampler,
                       operations=[local.get(type(op), type(op))() if type(op) in local else op for op in ops(lp)],
                       worker_count=worker_count, shard_options=lp.NoSharding())


def test_worker_count_does_not_change_the_stream_and_grain_states_resume_or_are_refused():
  config = dict(n=12, num_epochs=1, ops=lambda g: [DropThirds(), Jitter(), g.Batch(2)])
  in_process = take(make_loader(lp, **config))
  assert_same_stream(take(light_loader(0, **config)), in_process)
  assert_same_stream(take(light_loader(2, **config)), in_process)

  # Grain with 2 workers batches each worker's records separately: same
  # records, different batches.
  grain_loader = make_loader(gp, worker_count=2, **config)
  grain_batches, grain_states = [], []
  it = iter(grain_loader)
  grain_states.append(it.get_state())
  for batch in it:
    grain_batches.append(batch)
    grain_states.append(it.get_state())
  assert ids(grain_batches) == ids(in_process)
  assert sum(len(b["id"]) for b in grain_batches) == sum(len(b["id"]) for b in in_process)

  ours = make_loader(lp, **config)
  accepted = refused = 0
  for k, state in enumerate(grain_states):
    restored = iter(ours)
    try:
      restored.set_state(state)
    except ValueError as e:
      assert "Cannot resume this Grain state exactly" in str(e) and "\n" not in str(e)
      refused += 1
      continue
    accepted += 1
    rest = loader_testing.take(restored, None)
    assert ids(rest) == ids(grain_batches[k:])  # Exactly the records Grain had not yet produced.
  assert accepted >= 2 and refused >= 1


def test_restore_at_every_step_with_any_worker_count():
  for config in (dict(ops=lambda g: [DropThirds(), Jitter(), g.Batch(3)]),  # Batch runs sequentially.
                 dict(ops=lambda g: [Jitter(), g.Batch(3), SumBatch()]),  # Batch folded.
                 dict(ops=lambda g: [Duplicate(), g.Batch(2)]),  # Flat map.
                 dict(n=11, shard=(1, 3, False), shuffle=True, num_epochs=None, ops=lambda g: [Jitter()])):
    stream = loader_testing.assert_restore_at_every_step_gives_same_stream(
        lambda: make_loader(lp, **config), max_steps=30)
    assert stream
  for ops in (lambda g: [DropThirds(), Jitter(), g.Batch(3)], lambda g: [Jitter(), g.Batch(3)]):
    loader_testing.assert_restore_at_every_step_gives_same_stream(
        lambda: light_loader(0, ops=ops), make_restore_ds=lambda: light_loader(2, ops=ops), steps=[0, 3])


# ---- Checkpoint states ---------------------------------------------------------


def test_state_is_json_bytes_and_round_trips_through_save_state(tmp_path):
  dl = make_loader(lp, ops=lambda g: [Jitter(), g.Batch(3)])
  it = iter(dl)
  next(it)
  state = it.get_state()
  assert isinstance(state, bytes) and json.loads(state)["format"] == "arrayrecord-toolkit/DataLoader"
  (tmp_path / "state.json").write_bytes(state)  # What Grain users do with it.
  expected = loader_testing.take(it, None)
  restored = iter(dl)
  restored.set_state((tmp_path / "state.json").read_bytes())
  assert_same_stream(loader_testing.take(restored, None), expected)

  it = iter(dl)
  next(it)
  checkpoint.save_state(tmp_path / "ckpt.json", it)
  restored = iter(dl)
  assert json.loads(checkpoint.restore_state(tmp_path / "ckpt.json", restored)) == json.loads(state)
  assert_same_stream(loader_testing.take(restored, None), expected)
  assert "DataLoaderIterator(state=" in str(restored)


@pytest.mark.parametrize("other,key", [
    (dict(seed=4), "sampler"),
    (dict(n=11), "sampler"),
    (dict(shard=(1, 2, False), sampler_shard=True), "sampler"),
    (dict(shard=(1, 2, False)), "shard"),
])
def test_states_of_other_pipelines_are_refused(other, key):
  base = dict(sampler_shard=False, ops=lambda g: [Jitter(), g.Batch(3)])
  it = iter(make_loader(lp, **base))
  next(it)
  state = it.get_state()
  with pytest.raises(ValueError, match=f"DataLoader state is for another pipeline: {key} ") as e:
    iter(make_loader(lp, **{**base, **other})).set_state(state)
  assert "\n" not in str(e.value)


def test_states_resume_after_the_same_records_with_other_operations():
  """As Grain: the sampler's position holds when the operations change (a new map, another batch size)."""
  base = dict(sampler_shard=False, ops=lambda g: [Jitter(), g.Batch(3)])
  it = iter(make_loader(lp, **base))
  loader_testing.take(it, 2)
  state = it.get_state()
  for ops in (lambda g: [g.Batch(3)], lambda g: [g.Batch(6)], lambda g: [Jitter(), g.Batch(2)]):
    other = make_loader(lp, sampler_shard=False, ops=ops)
    resumed = iter(other)
    resumed.set_state(state)
    fresh = np.concatenate([b["id"] for b in other])
    rest = np.concatenate([b["id"] for b in loader_testing.take(resumed, None)])
    np.testing.assert_array_equal(rest, fresh[6:])
  # After 6 records, batches of 4 start at record 6, as Grain's do (from Grain's own state).
  grain_it = iter(make_loader(gp, **base))
  loader_testing.take(grain_it, 2)
  grain_resumed = iter(make_loader(gp, sampler_shard=False, ops=lambda g: [g.Batch(4)]))
  grain_resumed.set_state(grain_it.get_state())
  for saved in (state, grain_it.get_state()):
    misaligned = iter(make_loader(lp, sampler_shard=False, ops=lambda g: [g.Batch(4)]))
    misaligned.set_state(saved)
    assert misaligned.get_state() and next(misaligned)["id"].tolist() == [6, 7, 8, 9]
  misaligned = iter(make_loader(lp, sampler_shard=False, ops=lambda g: [g.Batch(4)]))
  misaligned.set_state(state)
  assert_same_stream(loader_testing.take(misaligned, None), loader_testing.take(grain_resumed, None))
  # Nested batches too.
  nested = iter(make_loader(lp, sampler_shard=False, ops=lambda g: [g.Batch(2), g.Batch(2)]))
  nested.set_state(state)
  grain_nested = iter(make_loader(gp, sampler_shard=False, ops=lambda g: [g.Batch(2), g.Batch(2)]))
  grain_nested.set_state(state)
  assert_same_stream(loader_testing.take(nested, None), loader_testing.take(grain_nested, None))
  # A source that streams (returns its next record whatever the index) is
  # read in whole batches only: the refusal says why.
  sampler = lp.IndexSampler(10, lp.NoSharding(), shuffle=False, num_epochs=2, seed=3)
  streaming = iter(lp.DataLoader(data_source=StreamingSource(10), sampler=sampler, operations=[lp.Batch(4)],
                                 shard_options=lp.NoSharding()))
  with pytest.raises(ValueError, match="stopped after 6 records, inside one of this DataLoader's batches of 4") as e:
    streaming.set_state({**json.loads(state), "data_source": repr(StreamingSource(10))})
  assert "\n" not in str(e.value)


def test_foreign_states_are_refused():
  dl = make_loader(lp, ops=lambda g: [g.Batch(3)])
  engine_state = iter(lp.MapDataset.range(5).to_iter_dataset()).get_state()
  for bad, message in ((engine_state, "Not a DataLoader state"), (b"{not json", "DataLoader state is not JSON"),
                       (json.dumps([1, 2]).encode(), "must be the JSON bytes")):
    with pytest.raises(ValueError, match=message) as e:
      iter(dl).set_state(bad)
    assert isinstance(e.value, json.JSONDecodeError) == (bad == b"{not json")  # Grain's type, which clients catch.
  with pytest.raises(UnicodeDecodeError, match=r"byte 0xff in position 0: .*the JSON bytes "
                                               r"DataLoaderIterator.get_state\(\) returned"):  # Grain's type too.
    iter(dl).set_state(b"\xff{}")


CHECKPOINT_CONFIGS = {
    "filter_random_batch": dict(ops=lambda g: [DropThirds(), Jitter(), g.Batch(3)]),
    "folded_batch": dict(ops=lambda g: [AddOne(), g.Batch(4), SumBatch()]),
    "sharded": dict(n=11, shard=(1, 3, False), ops=lambda g: [Jitter(), g.Batch(2)]),
    "loader_sharded_only": dict(n=11, shard=(2, 3, False), sampler_shard=False, ops=lambda g: [DropThirds()]),
}


@pytest.mark.parametrize("config", CHECKPOINT_CONFIGS, ids=list(CHECKPOINT_CONFIGS))
def test_grain_in_process_states_resume_exactly(config):
  config = CHECKPOINT_CONFIGS[config]
  it = iter(make_loader(gp, **config))
  states, elements = [it.get_state()], []
  for x in it:
    elements.append(x)
    states.append(it.get_state())
  ours = make_loader(lp, **config)
  for k, state in enumerate(states):
    restored = iter(ours)
    restored.set_state(state)
    assert_same_stream(loader_testing.take(restored, None), elements[k:])


def test_grain_shuffled_states_resume_exactly_at_every_step():
  # The sampler shuffles in Grain's order, so mid-epoch positions mean the same records.
  config = dict(n=12, shuffle=True, num_epochs=2, ops=lambda g: [Jitter(), g.Batch(4)])
  it = iter(make_loader(gp, **config))
  states, elements = [it.get_state()], []
  for x in it:
    elements.append(x)
    states.append(it.get_state())
  ours = make_loader(lp, **config)
  for k, state in enumerate(states):
    restored = iter(ours)
    restored.set_state(state)
    assert_same_stream(loader_testing.take(restored, None), elements[k:])


def test_grain_states_of_other_pipelines_are_refused():
  it = iter(make_loader(gp, ops=lambda g: [g.Batch(2)]))
  next(it)
  state = it.get_state()
  with pytest.raises(ValueError, match="Grain DataLoader state is for another pipeline: sampler"):
    iter(make_loader(lp, seed=9, ops=lambda g: [g.Batch(2)])).set_state(state)
  sampler = lp.IndexSampler(10, lp.ShardOptions(0, 1), num_epochs=2, seed=3)
  other_source = lp.DataLoader(data_source=list(range(10)), sampler=sampler, operations=[lp.Batch(2)],
                               shard_options=lp.NoSharding())
  with pytest.raises(ValueError, match="Grain DataLoader state is for another pipeline: data_source"):
    iter(other_source).set_state(state)
  # Grain counted 2 records: batches of 3 resume there, as Grain's do.
  for ops in (lambda g: [g.Batch(3)], lambda g: [g.Batch(3), g.Batch(2)]):
    resumed = iter(make_loader(lp, ops=ops))
    resumed.set_state(state)
    grain_resumed = iter(make_loader(gp, ops=ops))
    grain_resumed.set_state(state)
    assert_same_stream(loader_testing.take(resumed, None), loader_testing.take(grain_resumed, None))


def test_array_record_source_and_grain_states_over_it(tmp_path):
  from loader import sources  # pylint: disable=g-import-not-at-top

  paths = loader_testing.write_array_records(tmp_path, 3, [4, 5, 3])

  def snippet(g, source):
    sampler = g.IndexSampler(len(source), g.NoSharding(), shuffle=False, num_epochs=1, seed=0)
    return g.DataLoader(data_source=source, sampler=sampler, operations=[g.Batch(5)], worker_count=0,
                        shard_options=g.NoSharding())

  ours = snippet(lp, sources.ArrayRecordDataSource(paths))
  theirs = snippet(gp, gp.ArrayRecordDataSource(paths))
  our_batches, grain_batches = take(ours), take(theirs)
  # Bytes leaves: Grain stacks them into a fixed-width 'S' array (which strips
  # trailing NULs); loader keeps the original bytes in an object array.
  assert [b.tolist() for b in our_batches] == [b.tolist() for b in grain_batches]
  assert our_batches[0].dtype == object and len(our_batches) == 3

  it = iter(theirs)
  next(it)
  restored = iter(ours)
  restored.set_state(it.get_state())  # Grain names the source by a hash of its paths.
  assert [b.tolist() for b in restored] == [b.tolist() for b in grain_batches[1:]]


def test_shard_options_from_the_sampler_and_grains_read_options():
  # Grain's older API: no shard_options, the sampler's are used.
  def snippet(g, **kwargs):
    sampler = g.SequentialSampler(11, g.ShardOptions(1, 3, drop_remainder=True))
    return g.DataLoader(data_source=Source(11), sampler=sampler, operations=[g.Batch(2)], **kwargs)

  assert_same_stream(take(snippet(lp, read_options=gp.ReadOptions(num_threads=2), worker_buffer_size=0,
                                  enable_profiling=True)), take(snippet(gp)))


def test_grain_state_of_another_shard_is_refused():
  config = dict(n=12, shard=(0, 3, False), sampler_shard=False, ops=lambda g: [g.Batch(2)])
  it = iter(make_loader(gp, **config))
  next(it)
  with pytest.raises(ValueError, match="written by another shard or worker layout"):
    iter(make_loader(lp, **{**config, "shard": (1, 3, False)})).set_state(it.get_state())


class PairUp:
  """A custom Operation (iterator of Records in, out) that buffers: sums records two by two."""

  def __call__(self, records):
    held = None
    for r in records:
      if held is None:
        held = r
        continue
      yield type(r)(r.metadata, {"id": held.data["id"] + r.data["id"], "x": held.data["x"] + r.data["x"]})
      held = None


def test_grain_states_of_a_pipeline_with_a_custom_operation_resume_as_in_grain():
  # Both count the records the operation pulled; what it held is lost on a restore, in both.
  config = dict(n=12, shuffle=True, num_epochs=2, ops=lambda g: [AddOne(), PairUp(), g.Batch(2)])
  it = iter(make_loader(gp, **config))
  states = [it.get_state()]
  for _ in it:
    states.append(it.get_state())
  assert len(states) > 5
  for state in states:
    theirs = iter(make_loader(gp, **config))
    theirs.set_state(state)
    ours = iter(make_loader(lp, **config))
    ours.set_state(state)
    assert json.loads(ours.get_state())["last_seen_indices"] == json.loads(state)["last_seen_indices"]
    assert_same_stream(loader_testing.take(ours, None), loader_testing.take(theirs, None))
