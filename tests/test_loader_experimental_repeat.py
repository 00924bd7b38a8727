"""RepeatIterDataset against Grain 0.2.18."""

from __future__ import annotations

import grain
import pytest

import loader
from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream


@pytest.mark.parametrize("num_epochs", [1, 3])
def test_matches_grain(num_epochs):
  ours = experimental.RepeatIterDataset(loader.MapDataset.range(4).to_iter_dataset().map(lambda x: x * 2), num_epochs)
  theirs = grain.experimental.RepeatIterDataset(grain.MapDataset.range(4).to_iter_dataset().map(lambda x: x * 2),
                                                num_epochs)
  assert list(ours) == list(theirs)


def test_forever_matches_grain_prefix():
  ours = experimental.LimitIterDataset(experimental.RepeatIterDataset(loader.MapDataset.range(3).to_iter_dataset()), 11)
  theirs = grain.experimental.LimitIterDataset(
      grain.experimental.RepeatIterDataset(grain.MapDataset.range(3).to_iter_dataset()), 11)
  assert list(ours) == list(theirs)


def test_empty_parent_forever_ends_instead_of_spinning():
  # Grain spins forever here; a stream with no elements repeated is empty.
  empty = loader.MapDataset.range(4).to_iter_dataset().filter(lambda x: x > 10)
  assert list(experimental.RepeatIterDataset(empty)) == []
  assert list(experimental.RepeatIterDataset(empty, 3)) == []


@pytest.mark.parametrize("num_epochs", [0, -2])
def test_num_epochs_must_be_positive_like_grain(num_epochs):
  with pytest.raises(ValueError):
    grain.experimental.RepeatIterDataset(grain.MapDataset.range(3).to_iter_dataset(), num_epochs)
  with pytest.raises(ValueError, match="num_epochs"):
    experimental.RepeatIterDataset(loader.MapDataset.range(3).to_iter_dataset(), num_epochs)


def test_restore_at_every_step():
  make = lambda: experimental.RepeatIterDataset(
      loader.MapDataset.range(9).shuffle(seed=4).to_iter_dataset().filter(lambda x: x % 2).batch(2), 3)
  stream = assert_restore_at_every_step_gives_same_stream(make)
  assert len(stream) == 3 * 2  # Odd numbers below 9, in pairs, 3 times.


def test_grain_state_resumes_at_grains_element():
  theirs = iter(grain.experimental.RepeatIterDataset(grain.MapDataset.range(5).to_iter_dataset(), 3))
  for _ in range(7):
    next(theirs)
  state = theirs.get_state()
  assert set(state) == {"parent", "epoch"}
  ours = iter(experimental.RepeatIterDataset(loader.MapDataset.range(5).to_iter_dataset(), 3))
  ours.set_state(state)
  assert list(ours) == list(theirs)


def test_restore_inside_interleave_whose_set_state_opens_the_iterators():
  def make():
    a = experimental.RepeatIterDataset(loader.MapDataset.range(5).shuffle(seed=1).to_iter_dataset(), 2)
    b = experimental.RepeatIterDataset(loader.MapDataset.range(3).shuffle(seed=2).map(lambda x: x + 100)
                                       .to_iter_dataset(), 3)
    return experimental.InterleaveIterDataset([a, b], cycle_length=2)

  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 19
