"""Folded batches that start again after a failed element, or at a restore inside a batch, as Grain's do.

The consumer here catches an element's error and calls next() again. Grain's
batch iterator drops the elements it gathered for the failing batch and
starts the next batch right after the failed element; loader computes
batches in chunks (in workers too) and must give the same stream.
"""

from __future__ import annotations

import json

import absl.flags
import grain.python as gp
import numpy as np
import pytest

import loader
import loader.python as lp
from loader_testing import take as loader_testing_take
from loader_testing import take_with_errors

absl.flags.FLAGS.mark_as_parsed()


def _plain(x):
  return x if isinstance(x, str) else np.asarray(x).tolist()


def _stream(it, n=None):
  return [_plain(x) for x in take_with_errors(it, n, errors=ValueError)]


def _states_and_stream(it):
  """The state before each next() (a caught error is a step too) and the stream, to the end."""
  states, stream = [], []
  while True:
    states.append(it.get_state())
    step = _stream(it, 1)
    if not step:
      return states, stream
    stream += step


def _fails(x: int) -> bool:
  return x % 5 == 1 or x == 14


class FailingMap(gp.MapTransform):
  """Raises on some records (module level: worker processes unpickle it)."""

  def map(self, x):
    if _fails(int(x)):
      raise ValueError(f"bad {int(x)}")
    return x


class FailingSource:
  """A random-access source whose reads of some records fail."""

  def __init__(self, n: int):
    self._n = n

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int):
    if _fails(i):
      raise ValueError(f"bad {i}")
    return i

  def __repr__(self) -> str:
    return f"FailingSource({self._n})"


def _data_loader(g, ops, n=23, worker_count=0, num_epochs=1):
  sampler = g.IndexSampler(n, g.NoSharding(), shuffle=False, num_epochs=num_epochs, seed=0)
  return g.DataLoader(data_source=list(range(n)), sampler=sampler, operations=ops(g), worker_count=worker_count)


DATA_LOADER_OPS = {
    "batch3": lambda g: [FailingMap(), g.Batch(3)],
    "batch4": lambda g: [FailingMap(), g.Batch(4)],
    "batch3_drop": lambda g: [FailingMap(), g.Batch(3, drop_remainder=True)],
    "nested": lambda g: [FailingMap(), g.Batch(2), g.Batch(2)],
}


@pytest.mark.parametrize("name", DATA_LOADER_OPS)
def test_data_loader_goes_on_after_a_failed_record_as_grain(name):
  ops = DATA_LOADER_OPS[name]
  theirs = _stream(iter(_data_loader(gp, ops)))
  ours = _stream(iter(_data_loader(lp, ops)))
  assert ours == theirs
  assert theirs[0] == "bad 1" and _plain(theirs[1])[:1] in ([2], [[2, 3]])  # The next batch starts at record 2.


def test_data_loader_with_workers_gives_the_in_process_stream():
  # Grain's DataLoader stops at a worker's error; loader's goes on as in process.
  for ops in (DATA_LOADER_OPS["batch3"], DATA_LOADER_OPS["nested"]):
    in_process = _stream(iter(_data_loader(lp, ops, n=400, num_epochs=2)))
    with iter(_data_loader(lp, ops, n=400, num_epochs=2, worker_count=2)) as it:
      assert _stream(it) == in_process
    assert sum(isinstance(x, str) and x.startswith("bad") for x in in_process) == 2 * 81


def test_dataset_batch_over_a_failing_source_as_grain():
  # A user's source may return None, so this batch runs element by element
  # (the DataLoader tests above cover the folded batch). Grain's
  # to_iter_dataset() raises IndexError once the stream ends after an error
  # (its prefetch buffer); the elements before that are compared.
  def make(g):
    return g.MapDataset.source(FailingSource(13)).to_iter_dataset(
        g.ReadOptions(num_threads=1, prefetch_buffer_size=1)).batch(3)

  theirs = _stream(iter(make(gp)), 5)
  assert theirs == ["bad 1", [2, 3, 4], "bad 6", [7, 8, 9], "bad 11"]
  assert _stream(iter(make(lp))) == theirs + [[12]]


def test_restore_at_every_step_after_failures():
  """States taken between failures resume the same stream, in process and with workers, as Grain's do."""
  ops = DATA_LOADER_OPS["batch4"]
  for workers in (0, 2):
    with iter(_data_loader(lp, ops, n=40, worker_count=workers)) as it:
      states, stream = _states_and_stream(it)
    for k in range(len(states)):
      with iter(_data_loader(lp, ops, n=40)) as restored:
        restored.set_state(states[k])
        assert _stream(restored) == stream[k:], k
  # Grain's states between failures resume the same stream here.
  grain_it, grain_states = iter(_data_loader(gp, ops, n=40)), []
  for _ in stream:
    grain_states.append(grain_it.get_state())
    _stream(grain_it, 1)
  for k, state in enumerate(grain_states):
    restored = iter(_data_loader(lp, ops, n=40))
    restored.set_state(state)
    assert _stream(restored) == stream[k:], k


def test_dataset_states_between_failures_restore():
  def make():
    return loader.MapDataset.source(FailingSource(30)).to_iter_dataset().batch(4)

  states, stream = _states_and_stream(iter(make()))
  assert [2, 3, 4, 5] in stream and [7, 8, 9, 10] in stream
  for k, state in enumerate(states):
    restored = iter(make())
    restored.set_state(state)
    assert _stream(restored) == stream[k:], k


# DataLoader states written by the previous version (format_version 2), which
# counted the engine's position in folded batches (version 3 counts records).
_V2_SAMPLER = ("IndexSampler(num_records=30, shard_options=NoSharding(shard_index=0, shard_count=1, "
               "drop_remainder=False), shuffle=False, num_epochs=1, seed=0)")
_V2_HEAD = {"sampler": _V2_SAMPLER, "data_source": "<class 'list'>", "shard": [0, 1],
            "format": "arrayrecord-toolkit/DataLoader", "format_version": 2}
_V2_PIPELINE = ["source(list(len=30))", f"sampler({_V2_SAMPLER}, shar..."]
V2_STATES = {
    # After 2 batches of 4.
    "batch": ({**_V2_HEAD, "version": 2, "last_seen_indices": {"0": 7}, "last_worker_index": -1, "worker_count": 0,
               "operations": ["batch(4, drop_remainder=False)"],
               "dataset": {"next_index": 2, "loader_state_version": 4,
                           "pipeline": _V2_PIPELINE[:2] + ["batch(4, drop_remainder=False)", "to_iter_dataset()"]}},
              [8, 9, 10, 11]),
    # After 5 rows of batches of 2 split by a FlatMap.
    "flat_map": ({**_V2_HEAD, "operations": ["batch(2, drop_remainder=False)", "flat_map(max_fan_out=2)"],
                  "dataset": {"parent": {"next_index": 2}, "next_index_in_buffer": 1, "loader_state_version": 4,
                              "pipeline": _V2_PIPELINE[:2] + ["batch(2, drop_remainder=False)", "to_iter_dataset()",
                                                              "flat_map(_SplitRecord)", "map"]}},
                 [5, 6, 7]),
}


class Rows(loader.transforms.FlatMap):
  max_fan_out = 2

  def flat_map(self, element):
    return list(element)


@pytest.mark.parametrize("name", V2_STATES)
def test_version_2_data_loader_states_still_resume(name):
  state, expected = V2_STATES[name]
  ops = (lambda g: [g.Batch(4)]) if name == "batch" else (lambda g: [g.Batch(2), Rows()])
  resumed = iter(_data_loader(lp, ops, n=30))
  resumed.set_state(json.dumps(state).encode())
  got = [_plain(x) for x in loader_testing_take(resumed, 3 if name == "flat_map" else 1)]
  assert (got if name == "flat_map" else got[0]) == expected


def _fails_legacy(x):
  if _fails(int(x)):
    raise ValueError(f"bad {int(x)}")
  return x


LEGACY_OPS = {
    "map": lambda g: [g.MapOperation(_fails_legacy)],
    "map_batch": lambda g: [g.MapOperation(_fails_legacy), g.BatchOperation(3)],
    "filter": lambda g: [g.FilterOperation(lambda x: _fails_legacy(x) >= 0)],
    "map_then_transform": lambda g: [g.MapOperation(lambda x: x), FailingMap(), g.Batch(2)],
    # An earlier stage's error passes through Grain's generator and ends it too.
    "transform_then_filter": lambda g: [FailingMap(), g.FilterOperation(lambda x: True)],
    "transform_batch_then_map": lambda g: [FailingMap(), g.Batch(2), g.MapOperation(lambda x: x)],
    "transform_then_legacy_batch": lambda g: [FailingMap(), g.BatchOperation(2)],  # Not a generator in Grain.
}


@pytest.mark.parametrize("name", LEGACY_OPS)
def test_legacy_operations_end_the_stream_at_their_first_error_as_in_grain(name):
  # Grain's legacy operations are generators: their first error ends them.
  # Errors of other transforms consume the element and the stream goes on.
  def run(g):  # Errors by their first sentence (Grain's message; loader's adds the cause).
    it = iter(_data_loader(g, LEGACY_OPS[name]))
    return [_plain(x) for x in take_with_errors(it, errors=ValueError, on_error=lambda e: str(e).split(".")[0])]

  ours, theirs = run(lp), run(gp)
  assert ours == theirs
  ends = isinstance(theirs[-1], str) and theirs[-1].startswith(("PyGrain encountered an error when calling", "bad"))
  assert ends == (name not in ("map_then_transform", "transform_then_legacy_batch"))


def test_a_source_error_before_a_legacy_operation_ends_the_stream_in_workers_too():
  def run(g, worker_count=0):
    sampler = g.IndexSampler(12, g.NoSharding(), shuffle=False, num_epochs=1, seed=0)
    dl = g.DataLoader(data_source=FailingSource(12), sampler=sampler, operations=[g.MapOperation(_plain)],
                      worker_count=worker_count)
    it = iter(dl)
    try:
      return _stream(it)
    finally:
      getattr(it, "close", lambda: None)()  # Grain's iterator has no close().

  theirs = run(gp)
  assert theirs == [0, "bad 1"]
  assert run(lp) == run(lp, worker_count=2) == theirs


def test_next_index_inside_a_batch_counts_batches_begun_as_grain():
  import grain  # pylint: disable=g-import-not-at-top

  counts = []
  for g in (grain, loader):
    it = iter(g.MapDataset.range(20).to_iter_dataset().batch(4))
    it.set_state({"next_index": 10})
    counts.append((g.experimental.get_next_index(it), next(it).tolist(), g.experimental.get_next_index(it)))
  assert counts[0] == counts[1] == (3, [10, 11, 12, 13], 4)


class _Tiles(loader.MapDataset):
  """A user's dataset with an `origin` of its own (a bucket URL): not a realigned view's."""

  def __init__(self, origin):
    super().__init__()
    self.origin = origin

  def __len__(self):
    return 10

  def __getitem__(self, i):
    return int(i)


def test_a_user_dataset_with_its_own_origin_attribute():
  it = iter(_Tiles("gs://bucket/tiles").to_iter_dataset())
  assert next(it) == 0 and loader.experimental.get_next_index(it) == 1
  ds = _Tiles(np.array([47.3, 8.5])).to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=1))
  with iter(ds) as it:
    assert list(it) == list(range(10))


class FailsOnZero(gp.MapTransform):
  """Fails on record 0, after FailsOnTwo's stage (which fails on record 2)."""

  def map(self, x):
    if int(x) == 0:
      raise ValueError("B bad 0")
    return x


class FailsOnTwo(gp.MapTransform):

  def map(self, x):
    if int(x) == 2:
      raise ValueError("A bad 2")
    return x


def test_a_batch_raises_its_first_failing_records_error_as_grain():
  # Computed stage by stage, the batch meets record 2's error first; Grain
  # gathers record by record and raises record 0's, then goes on after it.
  ops = lambda g: [FailsOnTwo(), FailsOnZero(), g.Batch(3)]  # pylint: disable=unnecessary-lambda-assignment
  theirs = _stream(iter(_data_loader(gp, ops, n=6)))
  assert theirs == ["B bad 0", "A bad 2", [3, 4, 5]]
  assert _stream(iter(_data_loader(lp, ops, n=6))) == theirs
  with iter(_data_loader(lp, ops, n=6, worker_count=2)) as it:
    assert _stream(it) == theirs


class _SourceFailsOnTwo:

  def __len__(self):
    return 6

  def __getitem__(self, i):
    if i == 2:
      raise ValueError("source bad 2")
    return i


def _fails_on_zero(x):
  if x == 0:
    raise ValueError("map bad 0")
  return x


def _fails_on_one(x):
  if x == 1:
    raise ValueError("map bad 1")
  return x


def _first_error(thunk):
  try:
    return repr(thunk())
  except ValueError as e:
    return str(e)


@pytest.mark.parametrize("make", [
    lambda g: g.MapDataset.source(_SourceFailsOnTwo()).map(_fails_on_zero),
    lambda g: g.MapDataset.range(6).map(_fails_on_one).map(_fails_on_zero),
], ids=["source_then_map", "map_then_map"])
def test_a_random_access_batch_raises_its_first_failing_elements_error_as_grain(make):
  # Grain computes ds[0]'s elements one after the other: element 0's map error
  # comes first although elements 1 and 2 fail in an earlier stage.
  theirs = [_first_error(lambda: make(gp).batch(3)[0]), _stream(iter(make(gp).batch(3).to_iter_dataset()), 2)]
  ours = [_first_error(lambda: make(lp).batch(3)[0]), _stream(iter(make(lp).batch(3).to_iter_dataset()), 2)]
  assert theirs[0] == "map bad 0" and ours == theirs
  nested = lambda g: make(g).batch(1).batch(3)[0]  # pylint: disable=unnecessary-lambda-assignment
  assert _first_error(lambda: nested(lp)) == _first_error(lambda: nested(gp)) == "map bad 0"
