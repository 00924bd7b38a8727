"""LimitIterDataset against Grain 0.2.18."""

from __future__ import annotations

import grain
import pytest

import loader
from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream


@pytest.mark.parametrize("count", [1, 4, 9, 20])
def test_matches_grain(count):
  ours = experimental.LimitIterDataset(loader.MapDataset.range(9).to_iter_dataset(), count)
  theirs = grain.experimental.LimitIterDataset(grain.MapDataset.range(9).to_iter_dataset(), count)
  assert list(ours) == list(theirs)


def test_infinite_parent_is_cut():
  ds = loader.MapDataset.range(5).repeat().to_iter_dataset()
  assert list(experimental.LimitIterDataset(ds, 7)) == [0, 1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize("count", [0, -1])
def test_count_must_be_positive_like_grain(count):
  with pytest.raises(ValueError):
    grain.experimental.LimitIterDataset(grain.MapDataset.range(3).to_iter_dataset(), count)
  with pytest.raises(ValueError, match="count"):
    experimental.LimitIterDataset(loader.MapDataset.range(3).to_iter_dataset(), count)


def test_restore_at_every_step():
  make = lambda: experimental.LimitIterDataset(
      loader.MapDataset.range(30).shuffle(seed=2).to_iter_dataset().filter(lambda x: x % 3).batch(2), 8)
  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 8


def test_grain_state_resumes_at_grains_element():
  theirs = iter(grain.experimental.LimitIterDataset(grain.MapDataset.range(20).to_iter_dataset(), 12))
  for _ in range(5):
    next(theirs)
  state = theirs.get_state()
  ours = iter(experimental.LimitIterDataset(loader.MapDataset.range(20).to_iter_dataset(), 12))
  ours.set_state(state)
  assert list(ours) == list(theirs) == list(range(5, 12))
