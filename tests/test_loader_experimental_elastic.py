"""ElasticIterator against Grain 0.2.18: sharding, batching, resharded restores."""

from __future__ import annotations

import grain
import pytest

import loader
from loader import experimental
from loader.sharding import ShardOptions
from loader_testing import assert_restore_at_every_step_gives_same_stream


def _ours(ds, gbs, index, count, **kw):
  return experimental.ElasticIterator(ds, gbs, ShardOptions(index, count), **kw)


def _theirs(ds, gbs, index, count):
  return grain.experimental.ElasticIterator(ds, gbs, grain.sharding.ShardOptions(index, count))


def _take(it, n=None, state=None):
  if state is not None:
    it.set_state(state)
  out = []
  for x in it:
    out.append(x.tolist())
    if n is not None and len(out) == n:
      break
  return out


@pytest.mark.parametrize("gbs,count", [(6, 1), (6, 2), (6, 3), (12, 4)])
def test_every_shard_matches_grain(gbs, count):
  for index in range(count):
    ours = _take(_ours(loader.MapDataset.range(41).map(lambda x: x * 3), gbs, index, count))
    theirs = _take(_theirs(grain.MapDataset.range(41).map(lambda x: x * 3), gbs, index, count))
    assert ours == theirs and ours


@pytest.mark.parametrize("before,after", [((8, 2), (6, 3)), ((6, 3), (12, 4)), ((4, 1), (8, 2)), ((6, 2), (6, 2))])
def test_restore_under_new_sharding_matches_grain(before, after):
  gbs, count = before
  saved = _ours(loader.MapDataset.range(53), gbs, 0, count)
  _take(saved, 3)
  state = saved.get_state()
  reference = _theirs(grain.MapDataset.range(53), gbs, count - 1, count)
  _take(reference, 3)
  assert state["global_next_index"] == reference.get_state()["global_next_index"] == 3 * gbs
  gbs, count = after
  for index in range(count):
    ours = _take(_ours(loader.MapDataset.range(53), gbs, index, count), state=state)
    theirs = _take(_theirs(grain.MapDataset.range(53), gbs, index, count), state=reference.get_state())
    assert ours == theirs


def test_shuffled_resharded_run_reads_each_element_once():
  ds = lambda: loader.MapDataset.range(96).shuffle(seed=7)
  shards = [_ours(ds(), 12, i, 3) for i in range(3)]
  seen = [x for it in shards for x in sum(_take(it, 2), [])]
  states = {str(it.get_state()) for it in shards}
  assert len(states) == 1  # Every shard writes the same checkpoint.
  for i in range(4):
    seen += sum(_take(_ours(ds(), 8, i, 4), state=shards[0].get_state()), [])
  assert sorted(seen) == list(range(96))


def test_grain_state_resumes_and_infinite_datasets_work():
  theirs = _theirs(grain.MapDataset.range(10).repeat(), 4, 1, 2)
  _take(theirs, 5)
  ours = _ours(loader.MapDataset.range(10).repeat(), 4, 1, 2)
  assert _take(ours, 4, state=theirs.get_state()) == _take(theirs, 4)


def test_used_as_iterator_and_as_dataset():
  elastic = _ours(loader.MapDataset.range(20), 4, 0, 2)
  assert iter(elastic) is iter(elastic)  # One iterator, as in Grain.
  assert next(elastic).tolist() == [0, 2]
  state = elastic.get_state()
  assert next(iter(elastic)).tolist() == [4, 6]
  elastic.set_state(state)
  assert [b.tolist() for b in elastic] == [[4, 6], [8, 10], [12, 14], [16, 18]]
  elastic.close()


def test_restore_at_every_step():
  make = lambda: _ours(loader.MapDataset.range(50).shuffle(seed=3).map(lambda x: -x), 6, 1, 3)
  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 8


def test_rejects_filter_like_grain_and_bad_batch_sizes():
  with pytest.raises(ValueError, match="filter"):
    _theirs(grain.MapDataset.range(10).filter(lambda x: x % 2), 2, 0, 1)
  with pytest.raises(ValueError, match="filter"):
    _ours(loader.MapDataset.range(10).filter(lambda x: x % 2), 2, 0, 1)
  with pytest.raises(ValueError, match="not divisible by shard count 4"):
    _ours(loader.MapDataset.range(10), 6, 0, 4)
  with pytest.raises(ValueError, match="shard_index"):
    experimental.ElasticIterator(loader.MapDataset.range(10), 4, _DuckShard(5, 2))


class _DuckShard:
  """Any object with Grain's ShardOptions fields is accepted."""

  def __init__(self, shard_index, shard_count):
    self.shard_index, self.shard_count = shard_index, shard_count
