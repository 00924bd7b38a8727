"""CacheIterDataset and ThreadPrefetchDatasetIterator: Grain's streams and states, restores replay from memory."""

from __future__ import annotations

import pytest

import loader
from loader.experimental import CacheIterDataset
from loader_testing import assert_restore_at_every_step_gives_same_stream

grain = pytest.importorskip("grain")


def _make(lib, cls, counter=None):
  def count(x):
    if counter is not None:
      counter.append(x)
    return x * 10
  return cls(lib.MapDataset.range(9).to_iter_dataset().filter(lambda x: x != 4).map(count))


def test_stream_and_states_equal_grains_and_restore_both_ways():
  theirs = iter(_make(grain, grain.experimental.CacheIterDataset))
  ours = iter(_make(loader, CacheIterDataset))
  g_states, l_states, stream = [theirs.get_state()], [ours.get_state()], []
  for x in theirs:
    stream.append(x)
    assert next(ours) == x
    g_states.append(theirs.get_state())
    l_states.append(ours.get_state())
  with pytest.raises(StopIteration):
    next(ours)
  g_states.append(theirs.get_state())
  l_states.append(ours.get_state())
  for k, (g, l) in enumerate(zip(g_states, l_states)):
    assert {key: v for key, v in l.items() if key in g} == g, k  # Grain's keys and values.
    for state in (g, l):  # A fresh iterator takes Grain's state and ours.
      it = iter(_make(loader, CacheIterDataset))
      it.set_state(state)
      assert list(it) == stream[min(k, len(stream)):], (k, state)


def test_after_the_end_a_restore_replays_from_memory():
  reads = []
  it = iter(_make(loader, CacheIterDataset, reads))
  stream = list(it)
  assert len(reads) == 8
  it.set_state({**it.get_state(), "position": 3})
  assert list(it) == stream[3:]
  assert len(reads) == 8  # Nothing read again.


def test_restore_at_every_step():
  assert len(assert_restore_at_every_step_gives_same_stream(lambda: _make(loader, CacheIterDataset))) == 8


@pytest.mark.parametrize("buffer", [0, 3])
def test_thread_prefetch_dataset_iterator_over_any_checkpointable_iterator(buffer):
  # Grain's class, built by hand around an iterator (Grain's own or a plain
  # one with get_state/set_state): same stream, the parent's states.
  class Counter:
    def __init__(self):
      self.i = 0

    def __next__(self):
      if self.i >= 10:
        raise StopIteration
      self.i += 1
      return self.i * 10

    def get_state(self):
      return {"i": self.i}

    def set_state(self, state):
      self.i = state["i"]

  ours = loader.experimental.ThreadPrefetchDatasetIterator(Counter(), buffer)
  theirs = grain.experimental.ThreadPrefetchDatasetIterator(Counter(), buffer)
  assert [next(ours) for _ in range(4)] == [next(theirs) for _ in range(4)]
  assert ours.get_state() == theirs.get_state() == {"i": 4}
  resumed = loader.experimental.ThreadPrefetchDatasetIterator(Counter(), buffer)
  resumed.set_state(theirs.get_state())
  assert list(resumed) == list(theirs) == [50, 60, 70, 80, 90, 100]
  over_ds = loader.experimental.ThreadPrefetchDatasetIterator(iter(loader.MapDataset.range(5).to_iter_dataset()), buffer)
  assert list(over_ds) == [0, 1, 2, 3, 4]
  with pytest.raises(TypeError, match="get_state/set_state"):
    loader.experimental.ThreadPrefetchDatasetIterator(iter([1, 2]), buffer)


def test_grains_checkpoint_test_helper_passes_loader_pipelines_and_catches_a_bad_one():
  # Grain's own helper, as a user's test would call it after the import change.
  snippet_ds = (loader.MapDataset.range(30).shuffle(seed=3).map(lambda x: x * 2).to_iter_dataset()
                .filter(lambda x: x % 3).batch(4))
  loader.experimental.assert_equal_output_after_checkpoint(snippet_ds)
  loader.experimental.assert_equal_output_after_checkpoint(CacheIterDataset(snippet_ds))
  grain.experimental.assert_equal_output_after_checkpoint(grain.MapDataset.range(30).shuffle(seed=3).to_iter_dataset())

  class Forgetful(loader.DatasetIterator):  # Its set_state does nothing.
    def __init__(self):
      super().__init__()
      self.i = 0

    def __next__(self):
      if self.i >= 3:
        raise StopIteration
      self.i += 1
      return self.i

    def get_state(self):
      return {"i": self.i}

    def set_state(self, state):
      pass

  class Bad(loader.IterDataset):
    def __iter__(self):
      return Forgetful()

  with pytest.raises(AssertionError, match="step 1"):
    loader.experimental.assert_equal_output_after_checkpoint(Bad())
