"""Checkpoints refuse to be misapplied: other pipelines, other formats, Grain's states.

Where Grain 0.2.18 writes the state, the test runs the same pipeline on Grain
and checks that loader resumes at exactly the element Grain resumes at, or
refuses with a clear error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loader
from loader import state as state_lib
from loader_testing import assert_streams_equal
from loader_testing import take

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pipeline(seed=1, batch=4, n=50, extra=False):
  ds = loader.MapDataset.range(n).shuffle(seed=seed).map(lambda x: x * 2)
  if extra:
    ds = ds.filter(lambda x: x % 3)
  return ds.to_iter_dataset().batch(batch)


def _state_after(ds, k):
  it = iter(ds)
  take(it, k)
  return it.get_state()


def test_state_is_json_and_self_describing():
  state = _state_after(_pipeline(), 3)
  assert json.loads(json.dumps(state)) == state
  assert state["loader_state_version"] == state_lib.VERSION
  # The map may return None, which to_iter_dataset() drops: the batch runs after it.
  description = ["source(range(0, 50))", "shuffle(seed=1)", "map", "to_iter_dataset()",
                 "batch(4, drop_remainder=False)"]
  assert state_lib.describe(_pipeline()) == description
  assert state["pipeline"] == state_lib.fingerprint(description)
  assert all(type(h) is int and 0 <= h < 2**63 for h in state["pipeline"])
  assert state["next_index"] == 12  # As Grain's state: elements before the batch after to_iter_dataset().


def _text_state(state, description):
  """`state` as format version 4 wrote it: the pipeline described by strings."""
  return {**state, "loader_state_version": 4, "pipeline": list(description)}


def test_states_are_pytrees_of_numbers_that_orbax_standard_save_round_trips(tmp_path):
  # A client pattern: the iterator's state saved as a pytree beside the model's (NNX examples).
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  pipelines = {
      "batch": _pipeline,
      "mix": lambda: loader.IterDataset.mix([_pipeline(), _pipeline(seed=2)], [0.3, 0.7]),
      "window shuffle": lambda: loader.experimental.WindowShuffleIterDataset(_pipeline(), window_size=3, seed=5),
  }
  manager = ocp.CheckpointManager(str(tmp_path), item_names=tuple(pipelines),
                                  item_handlers={k: ocp.StandardCheckpointHandler() for k in pipelines})
  iterators = {k: iter(make()) for k, make in pipelines.items()}
  for it in iterators.values():
    take(it, 3)
  manager.save(3, args=ocp.args.Composite(**{k: ocp.args.StandardSave(it.get_state())
                                             for k, it in iterators.items()}))
  manager.wait_until_finished()
  restored = manager.restore(3, args=ocp.args.Composite(**{k: ocp.args.StandardRestore() for k in pipelines}))
  for k, make in pipelines.items():
    resumed = iter(make())
    resumed.set_state(restored[k])
    assert_streams_equal(take(resumed, 4), take(iterators[k], 4))


@pytest.mark.parametrize("convert", [lambda v: np.asarray(v), lambda v: np.int64(v) if type(v) is int else v])
def test_states_with_numpy_numbers_restore(convert):
  # jax.tree.map(np.asarray, state) and the like: Grain takes numpy numbers too.
  import jax
  make = lambda: loader.IterDataset.mix([_pipeline(), _pipeline(seed=2)], [0.3, 0.7])
  it = iter(make())
  take(it, 5)
  resumed = iter(make())
  resumed.set_state(jax.tree.map(convert, it.get_state()))
  assert_streams_equal(take(resumed, 4), take(it, 4))


def test_format_4_states_that_describe_the_pipeline_with_strings_still_restore_or_are_refused():
  state = _state_after(_pipeline(), 3)
  old = _text_state(state, state_lib.describe(_pipeline()))
  resumed, reference = iter(_pipeline()), iter(_pipeline())
  resumed.set_state(old)
  take(reference, 3)
  assert_streams_equal(take(resumed, 5), take(reference, 5))
  with pytest.raises(state_lib.StateMismatchError, match="operation 1 is 'shuffle.seed=1.' in the saved pipeline "
                                                         "but 'shuffle.seed=2.' in this one"):
    iter(_pipeline(seed=2)).set_state(old)


@pytest.mark.parametrize("other, difference", [
    (dict(seed=2), "its operation 1 is not 'shuffle(seed=2)' as in this one"),
    (dict(batch=8), "its operation 4 is not 'batch(8, drop_remainder=False)' as in this one"),
    (dict(n=60), "its operation 0 is not 'source(range(0, 60))' as in this one"),
    (dict(extra=True), "its operation 3 is not 'filter' as in this one"),
])
def test_state_from_another_pipeline_is_refused_naming_the_difference(other, difference):
  state = _state_after(_pipeline(), 3)
  it = iter(_pipeline(**other))
  with pytest.raises(state_lib.StateMismatchError, match="saved from a different pipeline") as info:
    it.set_state(state)
  assert difference in str(info.value)
  assert "\n" not in str(info.value)


def test_a_state_of_a_pipeline_changed_on_purpose_resumes_once_stripped():
  # E.g. a normalising map added before resuming: the refusal says how to resume anyway, as Grain would.
  before = loader.MapDataset.range(40).shuffle(seed=1).batch(2).to_iter_dataset()
  after = loader.MapDataset.range(40).shuffle(seed=1).map(lambda x: x * 10).batch(2).to_iter_dataset()
  it = iter(before)
  take(it, 3)
  state = it.get_state()
  with pytest.raises(state_lib.StateMismatchError, match=r"set_state\(loader.state.strip\(state\)\) resumes"):
    iter(after).set_state(state)
  resumed = iter(after)
  resumed.set_state(loader.state.strip(state))
  assert_streams_equal(take(resumed, 4), [b * 10 for b in take(it, 4)])


def _array_record_files(directory, counts):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  paths = {}
  for name, n in counts.items():
    paths[name] = os.path.join(directory, f"{name}.array_record")
    writer = ArrayRecordWriter(paths[name], "group_size:1")
    for i in range(n):
      writer.write(f"{name}-{i}".encode())
    writer.close()
  return paths


@pytest.mark.parametrize("source_cls", [loader.ArrayRecordSource, loader.sources.ArrayRecordDataSource])
def test_state_of_other_files_with_the_same_counts_is_refused(tmp_path, source_cls):
  """Equal file and record counts are not the same data: other files, or the same files reordered."""
  f = _array_record_files(str(tmp_path), {"a": 100, "b": 200, "c": 100})
  make = lambda files: loader.MapDataset.source(source_cls(files)).shuffle(seed=42).batch(
      10).to_iter_dataset()
  state = _state_after(make([f["a"], f["b"]]), 10)
  for other in ([f["b"], f["a"]], [f["c"], f["b"]]):
    with pytest.raises(state_lib.StateMismatchError, match="other file names or the files in another order"):
      iter(make(other)).set_state(state)
  # A copy of the same files elsewhere resumes (names and counts, not directories, identify the files).
  copy_dir = tmp_path / "copy"
  copy_dir.mkdir()
  copies = _array_record_files(str(copy_dir), {"a": 100, "b": 200})
  it = iter(make([copies["a"], copies["b"]]))
  it.set_state(state)
  reference = iter(make([f["a"], f["b"]]))
  take(reference, 10)
  assert_streams_equal(take(it, 5), take(reference, 5))


def _same_names_other_content(tmp_path, counts):
  """Two datasets of the same file names, record counts and sizes, whose first records differ.

  A regenerated dataset (another seed, other input) differs from its first
  record on; the files are large enough (~400 KB) that only their ends are
  sampled for the content hash.
  """
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  datasets = []
  for variant in ("mine", "regenerated"):
    (tmp_path / variant).mkdir()
    paths = {}
    for name, n in counts.items():
      paths[name] = str(tmp_path / variant / f"{name}.array_record")
      writer = ArrayRecordWriter(paths[name], "group_size:1")
      for i in range(n):
        tag = "+" if variant == "regenerated" and i == 0 else "-"
        writer.write(f"{name}{tag}{i}".encode().ljust(200, b"."))
      writer.close()
    datasets.append(paths)
  return datasets


@pytest.mark.parametrize("source_cls", [loader.ArrayRecordSource, loader.sources.ArrayRecordDataSource])
def test_state_of_files_with_the_same_names_and_counts_but_other_content_is_refused(tmp_path, source_cls):
  """A dataset regenerated under the same names (another seed, other input) is not the one the state read."""
  mine, others = _same_names_other_content(tmp_path, {"a": 1000, "b": 2000})
  assert os.path.getsize(mine["b"]) == os.path.getsize(others["b"]) > 100_000
  make = lambda f: loader.MapDataset.source(source_cls([f["a"], f["b"]])).shuffle(seed=42).batch(
      10).to_iter_dataset()
  state = _state_after(make(mine), 4)
  with pytest.raises(state_lib.StateMismatchError, match="same names whose content changed since the state was saved"):
    iter(make(others)).set_state(state)

  def make_loader(f):
    source = source_cls([f["a"], f["b"]])
    sampler = loader.samplers.IndexSampler(len(source), shard_options=loader.sharding.NoSharding(), shuffle=True,
                                           seed=42, num_epochs=1)
    return loader.DataLoader(data_source=source, sampler=sampler, operations=[loader.transforms.Batch(10)])

  it = iter(make_loader(mine))
  take(it, 3)
  with pytest.raises(ValueError, match="another pipeline: data_source .*content_hash"):
    iter(make_loader(others)).set_state(it.get_state())


def test_states_saved_before_sources_named_their_content_still_resume(tmp_path):
  """States (and DataLoader states) written before the content hash was part of a source's identity."""
  mine, others = _same_names_other_content(tmp_path, {"a": 1000, "b": 2000})
  make = lambda f: loader.MapDataset.source(loader.ArrayRecordSource([f["a"], f["b"]])).shuffle(seed=42).batch(
      10).to_iter_dataset()
  state = _state_after(make(mine), 7)
  legacy = [re.sub(r", content_hash=[0-9a-f]{8}", "", op) for op in state_lib.describe(make(mine))]
  assert "content_hash" not in json.dumps(legacy) and "files_hash" in json.dumps(legacy)
  for old in (state_lib.stamp(state_lib.strip(state), legacy), _text_state(state, legacy)):
    for files in (mine, others):  # Such a state cannot vouch for the content: it resumes as it did then.
      it, reference = iter(make(files)), iter(make(files))
      it.set_state(old)
      take(reference, 7)
      assert_streams_equal(take(it, 5), take(reference, 5))

  source = loader.ArrayRecordSource([mine["a"], mine["b"]])
  make_loader = lambda: loader.DataLoader(
      data_source=source, sampler=loader.samplers.IndexSampler(len(source), shard_options=loader.sharding.NoSharding(),
                                                              shuffle=True, seed=42, num_epochs=1),
      operations=[loader.transforms.Batch(10)])
  it = iter(make_loader())
  take(it, 3)
  old = re.sub(rb", content_hash=[0-9a-f]{8}", b"", it.get_state())
  assert b"content_hash" not in old
  restored, reference = iter(make_loader()), iter(make_loader())
  restored.set_state(old)
  take(reference, 3)
  assert_streams_equal(take(restored, 4), take(reference, 4))


def test_state_of_other_record_ranges_with_the_same_totals_is_refused(tmp_path):
  f = _array_record_files(str(tmp_path), {"a": 100, "b": 200})
  make = lambda ranges: loader.MapDataset.source(loader.sources.ArrayRecordDataSource(
      [f"{f[name]}[{start}:{end}]" for name, start, end in ranges])).shuffle(seed=42).batch(10).to_iter_dataset()
  saved = [("a", 0, 60), ("b", 0, 140)]
  state = _state_after(make(saved), 5)
  with pytest.raises(state_lib.StateMismatchError):
    iter(make([("a", 0, 40), ("b", 0, 160)])).set_state(state)
  it, reference = iter(make(saved)), iter(make(saved))
  it.set_state(state)
  take(reference, 5)
  assert_streams_equal(take(it, 5), take(reference, 5))


@pytest.mark.parametrize("source_cls", [loader.ArrayRecordSource, loader.sources.ArrayRecordDataSource])
def test_data_loader_state_of_other_files_with_the_same_counts_is_refused(tmp_path, source_cls):
  f = _array_record_files(str(tmp_path), {"a": 100, "b": 200, "c": 100})

  def make(files):
    source = source_cls(files)
    sampler = loader.samplers.IndexSampler(len(source), shard_options=loader.sharding.NoSharding(), shuffle=True,
                                           seed=42, num_epochs=1)
    return loader.DataLoader(data_source=source, sampler=sampler, operations=[loader.transforms.Batch(10)])

  it = iter(make([f["a"], f["b"]]))
  take(it, 5)
  state = it.get_state()
  for other in ([f["b"], f["a"]], [f["c"], f["b"]]):
    with pytest.raises(ValueError, match="another pipeline: data_source"):
      iter(make(other)).set_state(state)


def test_states_saved_before_sources_had_an_identity_still_resume(tmp_path):
  f = _array_record_files(str(tmp_path), {"a": 100, "b": 200})
  make = lambda: loader.MapDataset.source(loader.ArrayRecordSource([f["a"], f["b"]])).shuffle(seed=42).batch(
      10).to_iter_dataset()
  state = _state_after(make(), 7)
  text = state_lib.describe(make())
  old = _text_state(state, [text[0].split(", files_hash=")[0] + "))", *text[1:]])
  assert old["pipeline"][0] == "source(ArrayRecordSource(2 files, 300 records))"
  it, reference = iter(make()), iter(make())
  it.set_state(old)
  take(reference, 7)
  assert_streams_equal(take(it, 5), take(reference, 5))


def test_worker_count_and_prefetch_are_not_part_of_the_pipeline():
  make = lambda w: _pipeline().mp_prefetch(loader.MultiprocessingOptions(num_workers=w)).prefetch(2)
  reference = list(make(0))
  state = _state_after(make(0), 4)
  with iter(make(2)) as it:
    it.set_state(state)
    assert_streams_equal(list(it), reference[4:])


def test_damaged_or_future_states_are_refused():
  it = iter(_pipeline())
  state = _state_after(_pipeline(), 2)
  with pytest.raises(state_lib.StateMismatchError, match="format version 99 is not supported"):
    it.set_state({**state, "loader_state_version": 99})
  with pytest.raises(state_lib.StateMismatchError, match="damaged"):
    it.set_state({**state, "pipeline": "shuffle"})
  with pytest.raises(state_lib.StateMismatchError, match="expects the dict returned by get_state"):
    it.set_state("next_index=3")


def test_state_changes_nothing_when_a_function_is_renamed():
  def parse(x):
    return x * 2

  state = _state_after(loader.MapDataset.range(10).map(lambda x: x * 2).to_iter_dataset(), 3)
  it = iter(loader.MapDataset.range(10).map(parse).to_iter_dataset())
  it.set_state(state)
  assert next(it) == 6


# ---- States written by Grain 0.2.18 ----------------------------------------

_GRAIN_STATE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from absl import flags
    flags.FLAGS.mark_as_parsed()
    import grain

    def build(name):
      if name == "iter_batch":
        return grain.MapDataset.range(100).map(lambda x: x * 2).to_iter_dataset().batch(8)
      if name == "map_batch":
        return grain.MapDataset.range(100).batch(8).to_iter_dataset()
      if name == "filter_batch":
        return grain.MapDataset.range(100).to_iter_dataset().filter(lambda x: x % 3 == 0).batch(4)
      if name == "shuffled":
        return grain.MapDataset.range(100).shuffle(seed=3).to_iter_dataset().batch(8)
      if name == "mp":
        return grain.MapDataset.range(100).to_iter_dataset().batch(8).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=2))
      if name == "mp1":  # MaxText's default grain_worker_count.
        return grain.MapDataset.range(100).shuffle(seed=3).map(lambda x: x * 2).to_iter_dataset().batch(8).mp_prefetch(
            grain.MultiprocessingOptions(num_workers=1))
      if name == "mp1_pack":
        ds = grain.MapDataset.range(60).shuffle(seed=5).map(lambda x: {"tokens": np.arange(x % 7 + 1)})
        ds = grain.experimental.FirstFitPackIterDataset(ds.to_iter_dataset(), length_struct={"tokens": 10},
                                                        num_packing_bins=3)
        return ds.batch(2).mp_prefetch(grain.MultiprocessingOptions(num_workers=1))

    if __name__ == "__main__":
      name, k = sys.argv[1], int(sys.argv[2])
      it = iter(build(name))
      for _ in range(k):
        next(it)
      state = it.get_state()
      rest = [np.asarray(b["tokens"] if isinstance(b, dict) else b).tolist() for b in it]
      it.close() if hasattr(it, "close") else None
      print(json.dumps({"state": state, "rest": rest}))
""")


@pytest.fixture(scope="module")
def grain_run(tmp_path_factory):
  script = tmp_path_factory.mktemp("grain") / "grain_state.py"
  script.write_text(_GRAIN_STATE)

  def run(name, k):
    out = subprocess.run([sys.executable, str(script), name, str(k)], capture_output=True, text=True,
                         timeout=300, check=True, env={**os.environ, "PYTHONPATH": _ROOT})
    return json.loads(out.stdout.strip().splitlines()[-1])

  return run


def _ours(name):
  if name == "iter_batch":
    return loader.MapDataset.range(100).map(lambda x: x * 2).to_iter_dataset().batch(8)
  if name == "map_batch":
    return loader.MapDataset.range(100).batch(8).to_iter_dataset()
  if name == "filter_batch":
    return loader.MapDataset.range(100).to_iter_dataset().filter(lambda x: x % 3 == 0).batch(4)
  if name == "shuffled":
    return loader.MapDataset.range(100).shuffle(seed=3).to_iter_dataset().batch(8)
  raise ValueError(name)


@pytest.mark.parametrize("name, k", [("iter_batch", 3), ("iter_batch", 13), ("map_batch", 5), ("filter_batch", 3)])
def test_grain_state_resumes_at_the_element_grain_resumes_at(grain_run, name, k):
  grain_out = grain_run(name, k)
  it = iter(_ours(name))
  it.set_state(grain_out["state"])
  assert [[int(v) for v in b] for b in it] == grain_out["rest"]


@pytest.mark.parametrize("k", [0, 3, 12, 13])
def test_grain_state_of_a_shuffled_pipeline_resumes_at_grains_element(grain_run, k):
  # Shuffles are Grain's order, so Grain's position means the same element here.
  grain_out = grain_run("shuffled", k)
  it = iter(_ours("shuffled"))
  it.set_state(grain_out["state"])
  assert [[int(v) for v in b] for b in it] == grain_out["rest"]


_FOLDED_STAGES = {
    # Iterator-level stages that loader folds into the random-access part,
    # while Grain wraps the position in their own state.
    "random_map": lambda lib: lib.MapDataset.range(40).shuffle(seed=3).to_iter_dataset().random_map(
        lambda x, rng: x * 1000 + int(rng.integers(1000)), seed=1).batch(4),
    "batch_then_random_map": lambda lib: lib.MapDataset.range(42).to_iter_dataset().batch(4).random_map(
        lambda b, rng: b * 1000 + int(rng.integers(1000)), seed=2),
    "map_with_index_twice": lambda lib: lib.MapDataset.range(30).shuffle(seed=5).to_iter_dataset()
        .map_with_index(lambda i, x: x * 100 + i).map(lambda x: x + 1).map_with_index(lambda i, x: (i, x)),
}


@pytest.mark.parametrize("name", sorted(_FOLDED_STAGES))
def test_grain_state_through_folded_iterator_stages_resumes_at_every_step(name):
  grain = pytest.importorskip("grain")
  make = _FOLDED_STAGES[name]
  plain = lambda xs: [np.asarray(x).tolist() for x in xs]
  theirs = iter(make(grain))
  states, stream = [theirs.get_state()], []
  for x in theirs:
    stream.append(x)
    states.append(theirs.get_state())
  assert plain(list(make(loader))) == plain(stream)
  for k, state in enumerate(states):
    ours = iter(make(loader))
    ours.set_state(state)
    assert plain(list(ours)) == plain(stream[k:]), (k, state)
  # A count that contradicts the position, in the innermost stage (folded
  # into the reads; a stage after a map runs on the elements and takes its
  # count as given, as Grain's does).
  def spoil(state):
    if isinstance(state.get("parent"), dict) and "parent" in state["parent"]:
      return {**state, "parent": spoil(state["parent"])}
    return {**state, next(key for key in state if key != "parent"): 999}
  with pytest.raises(state_lib.StateMismatchError, match="does not match its position"):
    iter(make(loader)).set_state(spoil(states[2]))


def test_states_of_the_previous_format_restore_only_without_a_shuffle():
  # Version 2 shuffled in another order: its positions mean other elements now.
  plain = loader.MapDataset.range(20).map(lambda x: x + 1).batch(2).to_iter_dataset()
  state = {**_text_state(_state_after(plain, 3), state_lib.describe(plain)), "loader_state_version": 2}
  it = iter(plain)
  it.set_state(state)
  assert next(it).tolist() == [7, 8]
  shuffled = loader.MapDataset.range(20).shuffle(seed=1).batch(2).to_iter_dataset()
  with pytest.raises(state_lib.StateMismatchError, match="format version 2 is not supported"):
    iter(shuffled).set_state({**_text_state(_state_after(shuffled, 2), state_lib.describe(shuffled)),
                              "loader_state_version": 2})


def test_states_that_counted_batches_after_to_iter_dataset_are_refused():
  # Up to version 3 a batch after to_iter_dataset() counted batches; now elements, as Grain's state does.
  folded = loader.MapDataset.range(20).shuffle(seed=1).to_iter_dataset().batch(2)
  state = _state_after(folded, 3)
  assert state["next_index"] == 6
  with pytest.raises(state_lib.StateMismatchError, match="format version 3 is not supported"):
    iter(folded).set_state({**_text_state(state, state_lib.describe(folded)), "next_index": 3,
                            "loader_state_version": 3})
  unfolded = loader.MapDataset.range(20).shuffle(seed=1).batch(2).to_iter_dataset()
  it = iter(unfolded)
  it.set_state({**_text_state(_state_after(unfolded, 3), state_lib.describe(unfolded)), "loader_state_version": 3})
  assert next(it).tolist() == list(loader.MapDataset.range(20).shuffle(seed=1).batch(2)[3])


def test_grain_mp_prefetch_state_of_two_workers_is_refused(grain_run):
  # Each Grain worker reads its own slice of the source: a stream loader's is not.
  state = grain_run("mp", 3)["state"]
  it = iter(loader.MapDataset.range(100).to_iter_dataset().batch(8).mp_prefetch(
      loader.MultiprocessingOptions(num_workers=0)))
  with pytest.raises(state_lib.StateMismatchError, match="Grain mp_prefetch state of 2 workers"):
    it.set_state(state)


def _ours_mp1(name, workers):
  if name == "mp1":
    ds = loader.MapDataset.range(100).shuffle(seed=3).map(lambda x: x * 2).to_iter_dataset().batch(8)
  else:
    ds = loader.MapDataset.range(60).shuffle(seed=5).map(lambda x: {"tokens": np.arange(x % 7 + 1)})
    ds = loader.experimental.FirstFitPackIterDataset(ds.to_iter_dataset(), length_struct={"tokens": 10},
                                                     num_packing_bins=3).batch(2)
  return ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))


@pytest.mark.parametrize("name, k", [("mp1", 0), ("mp1", 5), ("mp1", 12), ("mp1_pack", 4)])
@pytest.mark.parametrize("workers", [0, 2])
def test_grain_mp_prefetch_state_of_one_worker_resumes_at_grains_element(grain_run, name, k, workers):
  # MaxText runs Grain with one worker by default: its checkpoints resume here, with any worker count.
  grain_out = grain_run(name, k)
  assert len(grain_out["state"]["iterators_in_use_states"]) == 1
  it = iter(_ours_mp1(name, workers))
  try:
    it.set_state(grain_out["state"])
    rest = [np.asarray(b["tokens"] if isinstance(b, dict) else b).tolist() for b in it]
  finally:
    it.close()
  assert rest == grain_out["rest"] and rest


def test_grain_state_inside_a_folded_batch_resumes_there_as_grain():
  # The batch is computed with the reads, in chunks of whole batches; a
  # position inside one starts the batches there, as Grain's batch iterator does.
  import grain  # pylint: disable=g-import-not-at-top

  for build, at in ((lambda g: g.MapDataset.range(100).to_iter_dataset().batch(8), 5),
                    (lambda g: g.MapDataset.range(100).to_iter_dataset().batch(2).batch(4), 4),  # 96 left: even.
                    (lambda g: g.MapDataset.range(100).to_iter_dataset().batch(8, drop_remainder=True)
                     .map(lambda b: b * 2), 5)):
    ours, theirs = iter(build(loader)), iter(build(grain))
    ours.set_state({"next_index": at})
    theirs.set_state({"next_index": at})
    assert_streams_equal(take(ours, None), take(theirs, None))
  # After the map (which may return None) the batch runs on the elements.
  it = iter(_ours("iter_batch"))
  it.set_state({"next_index": 5})
  assert next(it).tolist() == [x * 2 for x in range(5, 13)]


def test_state_inside_a_batch_is_refused_where_a_random_map_follows_it():
  # Its generators depend on the batch's position, so batches cannot start elsewhere.
  it = iter(loader.MapDataset.range(100).to_iter_dataset().batch(8).random_map(lambda b, rng: b, seed=1))
  with pytest.raises(state_lib.StateMismatchError, match="falls inside a batch"):
    it.set_state({**it.get_state(), "next_index": 5})


def test_json_file_round_trip_with_save_and_restore(tmp_path):
  ds = _pipeline()
  it = iter(ds)
  take(it, 5)
  loader.save_state(tmp_path / "s.json", it)
  rest = list(it)
  fresh = iter(_pipeline())
  loader.restore_state(tmp_path / "s.json", fresh)
  assert_streams_equal(list(fresh), rest)
  with pytest.raises(state_lib.StateMismatchError):
    loader.restore_state(tmp_path / "s.json", iter(_pipeline(seed=9)))
  assert np.asarray(rest[0]).dtype.kind == "i"


def test_states_saved_before_array_record_data_source_had_an_identity_still_resume(tmp_path):
  # Saved when ArrayRecordSource already named its files_hash but ArrayRecordDataSource did not.
  f = _array_record_files(str(tmp_path), {"a": 100, "b": 200})
  make = lambda: loader.MapDataset.concatenate([
      loader.MapDataset.source(loader.ArrayRecordSource([f["a"]])),
      loader.MapDataset.source(loader.sources.ArrayRecordDataSource([f["b"]])),
      loader.MapDataset.source(loader.sources.ArrayRecordDataSource([f["b"] + "[5:50]"]))]).to_iter_dataset()
  state = _state_after(make(), 7)
  # Sources did not name their content's hash then either.
  text = re.sub(r", content_hash=[0-9a-f]{8}", "", json.dumps(_text_state(state, state_lib.describe(make()))))
  old = json.loads(re.sub(r"(ArrayRecordDataSource\([^()]*?), files_hash=[0-9a-f]{8}(, ranges_hash=[0-9a-f]{8})?",
                          r"\1", text))
  assert old["pipeline"] != state_lib.describe(make()) and "files_hash" in json.dumps(old)  # ArrayRecordSource's is kept.
  it, reference = iter(make()), iter(make())
  it.set_state(old)
  take(reference, 7)
  assert_streams_equal(take(it, 5), take(reference, 5))


@pytest.mark.parametrize("kind", ["list", "object"])
def test_data_loader_states_naming_a_map_dataset_source_by_its_old_repr_still_resume(kind):
  class Items:  # A default repr, with an address.

    def __len__(self):
      return 10

    def __getitem__(self, i):
      return i

  source = loader.MapDataset.source(list(range(10)) if kind == "list" else Items())
  make = lambda: loader.DataLoader(data_source=source, sampler=loader.samplers.IndexSampler(
      10, shuffle=False, num_epochs=1, shard_options=loader.sharding.NoSharding()), worker_count=0)
  it = iter(make())
  take(it, 2)
  state = json.loads(it.get_state())
  # What loader wrote before a MapDataset source's repr was shortened.
  state["data_source"] = ("MapDataset.source([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])" if kind == "list" else
                          f"MapDataset.source(<{__name__}.{Items.__qualname__} object>)")
  resumed = iter(make())
  resumed.set_state(json.dumps(state).encode())
  assert next(resumed) == 2
  state["data_source"] = "MapDataset.source([0, 1, 2])"
  with pytest.raises(ValueError, match="another pipeline: data_source"):
    iter(make()).set_state(json.dumps(state).encode())


def test_states_of_folded_batches_after_a_map_restore_into_the_sequential_batches():
  # Until a map (which may return None) stopped it, batches after
  # to_iter_dataset() were folded into the reads: their states still restore.
  make = lambda: loader.MapDataset.range(60).shuffle(seed=2).map(lambda x: x + 1).to_iter_dataset().batch(2).batch(3)
  it = iter(make())
  take(it, 2)
  state = it.get_state()
  rest = [b.tolist() for b in it]
  text = state_lib.describe(make())
  assert text[-3:] == ["to_iter_dataset()", "batch(2, drop_remainder=False)", "batch(3, drop_remainder=False)"]
  saved_before = _text_state(state, text[:-3] + [
      "batch(2, drop_remainder=False)", "batch(3, drop_remainder=False)", "to_iter_dataset(unit=6)"])
  again = iter(make())
  again.set_state(saved_before)
  assert [b.tolist() for b in again] == rest
