"""The experimental ops give the same stream, and restore, with 0 or 2 mp_prefetch workers."""

from __future__ import annotations

import numpy as np
import pytest

import loader
from loader import experimental
from loader.sharding import ShardOptions
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal

_TWO = loader.MultiprocessingOptions(num_workers=2)


class _Split:
  max_fan_out = 3

  def flat_map(self, x):
    return [x * 10 + j for j in range(x % 4)][:3]


def _chain():
  """Every experimental stream op after a worker-computed part (FlatMapMapDataset included)."""
  ds = experimental.FlatMapMapDataset(loader.MapDataset.range(50).shuffle(seed=9), _Split())
  ds = ds.map(lambda x: np.int64(x)).to_iter_dataset()
  ds = experimental.FlatMapIterDataset(ds, lambda x: [x, -x] if x % 3 else [x])
  ds = experimental.RepeatIterDataset(ds, 2)
  ds = experimental.LimitIterDataset(ds, 130)
  return experimental.RebatchIterDataset(ds.batch(4), 7)


def test_stream_and_restores_do_not_depend_on_the_worker_count():
  reference = list(_chain())
  assert len(reference) == 19
  assert_streams_equal(list(_chain().mp_prefetch(_TWO)), reference)
  # States taken without workers restore into two workers (every step is
  # covered without workers in each op's own tests).
  assert_restore_at_every_step_gives_same_stream(_chain, make_restore_ds=lambda: _chain().mp_prefetch(_TWO),
                                                 steps=[7, 18])


def test_elastic_iterator_with_workers():
  make = lambda mp: experimental.ElasticIterator(loader.MapDataset.range(60).shuffle(seed=1), 8,
                                                 ShardOptions(1, 2), multiprocessing_options=mp)
  reference = [b.tolist() for b in make(None)]
  with_workers = make(_TWO)
  out = [next(with_workers).tolist() for _ in range(3)]
  state = with_workers.get_state()
  with_workers.set_state(state)  # Moves the running pipeline; its workers stay.
  out += [b.tolist() for b in with_workers]
  assert out == reference
  restored = make(None)
  restored.set_state(state)
  assert [b.tolist() for b in restored] == reference[3:]
