"""RebatchIterDataset against Grain 0.2.18."""

from __future__ import annotations

import collections

import grain
import numpy as np
import pytest

import loader
from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import take_with_errors

Pair = collections.namedtuple("Pair", ["ids", "sq"])


def _element(i):
  # Keys already sorted: Grain (through JAX pytrees) returns dicts with sorted keys.
  return {"a": np.int64(i), "b": np.full((2,), i, np.int32), "t": (np.float32(i / 2), np.int64(-i))}


def _as_lists(batch):
  return {"a": batch["a"].tolist(), "b": batch["b"].tolist(),
          "t": [batch["t"][0].tolist(), batch["t"][1].tolist()]}


@pytest.mark.parametrize("in_size,out_size,drop", [(5, 7, False), (5, 7, True), (4, 2, False), (3, 3, True),
                                                    (2, 11, False), (7, 1, False)])
def test_matches_grain(in_size, out_size, drop):
  ours = experimental.RebatchIterDataset(
      loader.MapDataset.range(23).map(_element).batch(in_size).to_iter_dataset(), out_size, drop_remainder=drop)
  theirs = grain.experimental.RebatchIterDataset(
      grain.MapDataset.range(23).map(_element).batch(in_size).to_iter_dataset(), out_size, drop_remainder=drop)
  assert [_as_lists(b) for b in ours] == [_as_lists(b) for b in theirs]


def test_namedtuples_keep_their_type():
  ds = loader.MapDataset.range(10).map(lambda i: Pair(i, i * i)).batch(4).to_iter_dataset()
  out = list(experimental.RebatchIterDataset(ds, 3))
  assert all(type(b) is Pair for b in out)
  assert [b.ids.tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_batch_size_must_be_positive_like_grain():
  with pytest.raises(ValueError):
    grain.experimental.RebatchIterDataset(grain.MapDataset.range(3).batch(1).to_iter_dataset(), 0)
  with pytest.raises(ValueError, match="batch_size"):
    experimental.RebatchIterDataset(loader.MapDataset.range(3).batch(1).to_iter_dataset(), 0)


@pytest.mark.parametrize("drop", [False, True])
def test_restore_at_every_step(drop):
  make = lambda: experimental.RebatchIterDataset(
      loader.MapDataset.range(40).shuffle(seed=1).to_iter_dataset().filter(lambda x: x % 4).batch(6), 4,
      drop_remainder=drop)
  assert assert_restore_at_every_step_gives_same_stream(make)


def test_grain_state_resumes_at_grains_element():
  make = lambda lib: lib.MapDataset.range(30).batch(4).to_iter_dataset()
  theirs = iter(grain.experimental.RebatchIterDataset(make(grain), 3))
  for _ in range(4):
    next(theirs)
  state = theirs.get_state()
  assert set(state) == {"parent", "batch_idx"}
  ours = iter(experimental.RebatchIterDataset(make(loader), 3))
  ours.set_state(state)
  assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


def test_a_failed_input_batch_is_consumed_and_rebatching_goes_on_after_it():
  fail = {"once": True}

  def flaky(batch):
    if batch[0] == 12 and fail["once"]:
      fail["once"] = False
      raise RuntimeError("transient")
    return batch

  # A sequential map (after a filter and batch), so the error reaches rebatch.
  ds = loader.MapDataset.range(20).to_iter_dataset().filter(lambda x: True).batch(4).map(flaky)
  it = iter(experimental.RebatchIterDataset(ds, 6))
  out = [next(it).tolist(), next(it).tolist()]
  with pytest.raises(RuntimeError):
    next(it)
  state = it.get_state()  # Just after the failed input batch [12..15], which is consumed (as in Grain).
  out += [b.tolist() for b in it]
  assert out == [list(range(0, 6)), list(range(6, 12)), list(range(16, 20))]
  restored = iter(experimental.RebatchIterDataset(ds, 6))
  restored.set_state(state)
  assert [b.tolist() for b in restored] == [list(range(16, 20))]


def test_an_element_of_another_structure_raises_as_in_grain_instead_of_ending_the_stream():

  def run(lib):
    elements = [[np.array([1, 1]), np.array([2, 2]), np.array([3, 3])], [np.array([4, 4]), np.array([5, 5])],
                [np.array([6, 6]), np.array([7, 7]), np.array([8, 8])]]
    it = iter(lib.experimental.RebatchIterDataset(lib.MapDataset.source(elements).to_iter_dataset(), 2))
    out = [[a.tolist() for a in next(it)]]
    with pytest.raises(ValueError, match=r"Too few leaves for PyTreeDef; expected 3, got 2"):
      next(it)
    return out, [[a.tolist() for a in b] for b in it]

  ours, theirs = run(loader), run(grain)
  assert ours == theirs
  assert ours == ([[[1, 1], [2, 2], [3, 3]]], [[[6, 6], [7, 7], [8, 8]]])


@pytest.mark.parametrize("in_size,out_size,drop", [(2, 3, False), (3, 2, False), (4, 5, True), (1, 3, False)])
def test_rows_gathered_before_a_failed_input_are_dropped_as_in_grain(in_size, out_size, drop):
  # The consumer catches the error and calls next() again: Grain's rebatch
  # drops the rows it had gathered for that batch, and starts the next one
  # after the failed input.
  def fails(x):
    if x % 4 == 2:
      raise ValueError(f"bad {x}")
    return x

  def run(lib):
    ds = lib.MapDataset.range(23).to_iter_dataset().map(fails).batch(in_size)
    it = iter(lib.experimental.RebatchIterDataset(ds, out_size, drop_remainder=drop))
    return [x if isinstance(x, str) else x.tolist() for x in take_with_errors(it, 60, errors=ValueError)]

  ours = run(loader)
  assert ours == run(grain)
  assert any(isinstance(x, str) for x in ours)
