"""FlatMapMapDataset / FlatMapIterDataset against Grain 0.2.18."""

from __future__ import annotations

import sys

import grain
import numpy as np
import pytest

import loader
from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import take_with_errors


class _Split(experimental.FlatMapTransform):
  """x -> x % 4 elements (0 to 3): empty, short and full fan-outs."""

  max_fan_out = 3

  def flat_map(self, x):
    return [x * 10 + j for j in range(min(x % 4, 3))]


class _GrainSplit(grain.experimental.FlatMapTransform):
  max_fan_out = 3

  def flat_map(self, x):
    return [x * 10 + j for j in range(min(x % 4, 3))]


class _TooMany(experimental.FlatMapTransform):
  max_fan_out = 2

  def flat_map(self, x):
    return [x] * 3


class _GrainTooMany(grain.experimental.FlatMapTransform):
  max_fan_out = 2

  def flat_map(self, x):
    return [x] * 3


def test_map_dataset_slots_match_grain_in_every_epoch():
  ours = experimental.FlatMapMapDataset(loader.MapDataset.range(9), _Split())
  theirs = grain.experimental.FlatMapMapDataset(grain.MapDataset.range(9), _GrainSplit())
  assert len(ours) == len(theirs) == 27
  # Indices past len read the next epoch, as in Grain.
  assert [ours[i] for i in range(60)] == [theirs[i] for i in range(60)]
  assert list(ours) == list(theirs)
  assert list(ours.to_iter_dataset()) == list(theirs.to_iter_dataset())


def test_map_dataset_after_filter_and_on_infinite_parent_match_grain():
  ours = experimental.FlatMapMapDataset(loader.MapDataset.range(12).filter(lambda x: x % 3), _Split())
  theirs = grain.experimental.FlatMapMapDataset(grain.MapDataset.range(12).filter(lambda x: x % 3), _GrainSplit())
  assert [ours[i] for i in range(36)] == [theirs[i] for i in range(36)]
  infinite = experimental.FlatMapMapDataset(loader.MapDataset.range(5).repeat(), _Split())
  assert len(infinite) == sys.maxsize == len(grain.experimental.FlatMapMapDataset(
      grain.MapDataset.range(5).repeat(), _GrainSplit()))
  assert [infinite[i] for i in range(30, 45)] == [grain.experimental.FlatMapMapDataset(
      grain.MapDataset.range(5).repeat(), _GrainSplit())[i] for i in range(30, 45)]


def test_map_dataset_fan_out_above_max_raises_like_grain():
  with pytest.raises(ValueError):
    grain.experimental.FlatMapMapDataset(grain.MapDataset.range(3), _GrainTooMany())[0]
  with pytest.raises(ValueError, match="max_fan_out=2"):
    experimental.FlatMapMapDataset(loader.MapDataset.range(3), _TooMany())[0]
  no_fan_out = experimental.FlatMapMapDataset(loader.MapDataset.range(3), lambda x: [x])
  with pytest.raises(ValueError, match="max_fan_out"):  # Where Grain raises its AttributeError: on first use.
    no_fan_out[0]  # pylint: disable=pointless-statement


def test_iter_dataset_matches_grain():
  ours = experimental.FlatMapIterDataset(loader.MapDataset.range(15).to_iter_dataset(), _Split())
  theirs = grain.experimental.FlatMapIterDataset(grain.MapDataset.range(15).to_iter_dataset(), _GrainSplit())
  assert list(ours) == list(theirs)
  # No fan-out limit on streams (Grain's too); plain callables and generators work here.
  many = experimental.FlatMapIterDataset(loader.MapDataset.range(3).to_iter_dataset(), lambda x: iter([x] * 5))
  assert list(many) == [0] * 5 + [1] * 5 + [2] * 5


def test_apply_flat_map_transform_matches_grain():
  ours_map = loader.MapDataset.range(8).apply([_Split()])
  theirs_map = grain.MapDataset.range(8).apply([_GrainSplit()])
  assert isinstance(ours_map, experimental.FlatMapMapDataset)
  assert [ours_map[i] for i in range(len(ours_map))] == [theirs_map[i] for i in range(len(theirs_map))]
  ours_iter = loader.MapDataset.range(8).to_iter_dataset().apply(_Split())
  assert isinstance(ours_iter, experimental.FlatMapIterDataset)
  assert list(ours_iter) == list(grain.MapDataset.range(8).to_iter_dataset().apply(_GrainSplit()))
  assert list(experimental.apply_transformations(loader.MapDataset.range(8).to_iter_dataset(), [_Split()])) == list(
      grain.experimental.apply_transformations(grain.MapDataset.range(8).to_iter_dataset(), [_GrainSplit()]))


@pytest.mark.parametrize("kind", ["map", "iter", "iter_after_filter"])
def test_restore_at_every_step(kind):
  base = lambda: loader.MapDataset.range(21).shuffle(seed=5)
  make = {
      "map": lambda: experimental.FlatMapMapDataset(base(), _Split()).to_iter_dataset(),
      "iter": lambda: experimental.FlatMapIterDataset(base().to_iter_dataset(), _Split()),
      "iter_after_filter": lambda: experimental.FlatMapIterDataset(
          base().to_iter_dataset().filter(lambda x: x % 5), _Split()).batch(4),
  }[kind]
  assert assert_restore_at_every_step_gives_same_stream(make)


def test_grain_state_resumes_at_grains_element():
  theirs = iter(grain.experimental.FlatMapIterDataset(grain.MapDataset.range(15).to_iter_dataset(), _GrainSplit()))
  for _ in range(7):
    next(theirs)
  state = theirs.get_state()
  assert set(state) == {"parent", "next_index_in_buffer"}
  ours = iter(experimental.FlatMapIterDataset(loader.MapDataset.range(15).to_iter_dataset(), _Split()))
  ours.set_state(state)
  assert list(ours) == list(theirs)


def test_a_restore_inside_an_element_whose_flat_map_then_raises_goes_on_at_the_next_elements_start():
  fail = {"on": False}

  def flaky(x):
    if x == 2 and fail["on"]:
      raise RuntimeError("bad element")
    return [x, -x, 10 * x]

  make = lambda: experimental.FlatMapIterDataset(loader.MapDataset.range(4).to_iter_dataset(), flaky)
  it = iter(make())
  for _ in range(8):  # Up to the middle of element 2's splits.
    next(it)
  state = it.get_state()
  fail["on"] = True
  restored = iter(make())
  restored.set_state(state)
  with pytest.raises(RuntimeError, match="bad element"):
    next(restored)
  after = restored.get_state()
  assert list(restored) == [3, -3, 30]  # Element 3 whole: the skip into element 2 does not carry over.
  again = iter(make())
  again.set_state(after)
  assert list(again) == [3, -3, 30]


def test_an_element_whose_flat_map_raises_is_consumed_as_in_grain():
  calls = {"n": 0}

  def flaky(x):
    if x == 4 and calls["n"] == 0:
      calls["n"] += 1
      raise RuntimeError("transient")
    return [x, -x]

  it = iter(experimental.FlatMapIterDataset(loader.MapDataset.range(6).to_iter_dataset(), flaky))
  out = [next(it) for _ in range(8)]
  with pytest.raises(RuntimeError):
    next(it)
  state = it.get_state()
  out += list(it)
  assert out == [v for x in range(6) if x != 4 for v in (x, -x)]
  restored = iter(experimental.FlatMapIterDataset(loader.MapDataset.range(6).to_iter_dataset(), flaky))
  restored.set_state(state)
  assert list(restored) == [5, -5]


def test_a_state_taken_after_an_upstream_error_resumes_after_the_failed_element():
  # The failed element was consumed upstream: a state taken after the caught
  # error restores to the next element, not to the error again.
  def fails(x):
    if x % 5 == 1:
      raise ValueError(f"bad {x}")
    return x

  def make():
    return experimental.FlatMapIterDataset(loader.MapDataset.range(12).map(fails).to_iter_dataset(),
                                           lambda x: [10 * x, 10 * x + 1])

  it, states, stream = iter(make()), [], []
  while True:
    states.append(it.get_state())
    step = take_with_errors(it, 1, errors=ValueError)
    if not step:
      break
    stream += step
  assert stream[:4] == [0, 1, "bad 1", 20]
  for k, state in enumerate(states):
    restored = iter(make())
    restored.set_state(state)
    assert take_with_errors(restored, errors=ValueError) == stream[k:], k
