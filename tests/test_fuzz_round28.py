"""Differential fuzz round 28 against Grain 0.2.18: the differences it found, minimized.

Round 28 compared 260 seeded misuse pipelines (the phase and type of the
error) and 140 packing / iterator-chain pipelines (stream, restore at every
step, Grain's states on loader) with real Grain. The streams agreed; three
differences did not:

- `DatasetOptions(filter_raise_threshold_ratio=r)` after its first error:
  Grain consumes the element whose check raised, and its failed window stays
  open, so each next element is judged on the grown window (and usually
  raises again) until its share falls under `r`. Loader handed that element
  out and started a new window.
- `FlatMapMapDataset` over a transform without `max_fan_out`: Grain raises
  AttributeError at `len()`, `ds[i]` or `iter()`; loader raised ValueError
  when the dataset was built.
- `FlatMapIterDataset(ds, 5)`: Grain raises AttributeError at `iter()`;
  loader raised TypeError at the first `next()`.

Each test runs the same snippet on Grain and on loader and compares.
"""

from __future__ import annotations

import warnings

import grain
import pytest

import loader
from loader import dataset_options


def _keep_30(x):
  return x % 10 < 3  # Drops 70% of every window.


def _keep_head(x):
  return x < 500 or x % 10 == 0  # Drops 90% after the first 500.


_TAILS = {
    "map": lambda ds: ds.map(lambda x: x),
    "batch": lambda ds: ds.batch(7),  # States count elements, not batches.
    "filter": lambda ds: ds.filter(lambda x: x % 2 == 0),
}


def _run(lib, ratio, keep, tail, level, workers=0, steps=3000, max_errors=4):
  """The stream with each error's (position, state) in place, stopped after `max_errors` errors."""
  ds = lib.MapDataset.range(3500)
  ds = ds.filter(keep).to_iter_dataset() if level == "map" else ds.to_iter_dataset().filter(keep)
  ds = lib.experimental.WithOptionsIterDataset(
      ds, lib.experimental.DatasetOptions(filter_raise_threshold_ratio=ratio))
  ds = _TAILS[tail](ds)
  if workers:
    ds = ds.mp_prefetch(lib.multiprocessing.MultiprocessingOptions(num_workers=workers))
  it = iter(ds)
  out, errors = [], 0
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for _ in range(steps):
      try:
        out.append(repr(next(it)))
      except StopIteration:
        out.append("end")
        break
      except ValueError as e:
        assert "skipped" in str(e) and "filter_raise_threshold_ratio" in str(e), e
        errors += 1
        out.append(("ValueError", None if workers else it.get_state()["next_index"]))
        if errors == max_errors:
          break
  return out


@pytest.mark.parametrize("ratio", [0.5, 0.7])
@pytest.mark.parametrize("keep", [_keep_30, _keep_head])
@pytest.mark.parametrize("tail", sorted(_TAILS))
@pytest.mark.parametrize("level", ["map", "iter"])
def test_filter_ratio_errors_consume_and_repeat_as_in_grain(ratio, keep, tail, level):
  expected = _run(grain, ratio, keep, tail, level)
  assert ("ValueError", 1000 if keep is _keep_30 else 2000) in expected or level == "iter"
  assert _run(loader, ratio, keep, tail, level) == expected


def test_filter_ratio_errors_are_the_same_with_workers():
  in_process = _run(loader, 0.7, _keep_30, "batch", "map")
  assert sum(isinstance(x, tuple) for x in in_process) == 3 and in_process[-1] == "end"
  with_workers = _run(loader, 0.7, _keep_30, "batch", "map", workers=2)
  assert with_workers == [(x[0], None) if isinstance(x, tuple) else x for x in in_process]


def test_a_failed_window_stays_open_until_its_share_falls():
  check = dataset_options.FilterRatioCheck("f", dataset_options.DatasetOptions(filter_raise_threshold_ratio=0.5))
  assert check.first_failure(1000, [True] * 500 + [False] * 500) == 999
  with pytest.raises(ValueError, match="skipped 50.00 % of the last seen 1000 elements"):
    raise check.error()
  # The window of 1000 stays open: one more dropped element fails it again...
  assert check.first_failure(1, [True]) == 0
  with pytest.raises(ValueError, match="skipped 50.05 % of the last seen 1001 elements"):
    raise check.error()
  # ...a kept one leaves it at 501 / 1002, still 50%, and a second brings it under: it closes, a new one opens.
  assert check.first_failure(2, [False, False]) == 0
  assert check.first_failure(1, [False]) is None
  assert check.first_failure(999, [True] * 999) is None
  assert check.first_failure(1, [True]) == 0


class _NoFanOut:

  def flat_map(self, x):
    return [x, x]


_FLAT_MAP_MISUSES = {
    "iter_int": lambda lib: lib.experimental.FlatMapIterDataset(lib.MapDataset.range(3).to_iter_dataset(), 5),
    "map_int": lambda lib: lib.experimental.FlatMapMapDataset(lib.MapDataset.range(3), 5),
    "map_function": lambda lib: lib.experimental.FlatMapMapDataset(lib.MapDataset.range(3), lambda x: [x, x]),
    "map_no_fan_out": lambda lib: lib.experimental.FlatMapMapDataset(lib.MapDataset.range(3), _NoFanOut()),
}


def _phase(make, lib, use):
  phase = "build"
  try:
    ds = make(lib)
    phase = use
    if use == "iter":
      list(ds)
    elif use == "len":
      len(ds)
    else:
      ds[0]  # pylint: disable=pointless-statement
  except Exception as e:  # pylint: disable=broad-except
    return phase, e
  return "no error", None


@pytest.mark.parametrize("case,use", [(case, use) for case in sorted(_FLAT_MAP_MISUSES)
                                      # An IterDataset has neither len() nor ds[i].
                                      for use in (("iter",) if case == "iter_int" else ("iter", "len", "getitem"))])
def test_flat_map_misuse_fails_where_and_as_grain_fails(case, use):
  make = _FLAT_MAP_MISUSES[case]
  g_phase, g_error = _phase(make, grain, use)
  l_phase, l_error = _phase(make, loader, use)
  assert g_phase == use and isinstance(g_error, AttributeError), (g_phase, g_error)
  assert l_phase == g_phase
  # Catchable as Grain's error, and as the error loader's message describes.
  assert isinstance(l_error, AttributeError)
  expected = TypeError if case == "iter_int" else ValueError
  assert isinstance(l_error, expected), l_error
  assert ("max_fan_out" in str(l_error)) == (case != "iter_int")


def test_flat_map_iter_dataset_takes_a_plain_function_as_documented():
  ds = loader.experimental.FlatMapIterDataset(loader.MapDataset.range(3).to_iter_dataset(), lambda x: [x, -x])
  assert list(ds) == [0, 0, 1, -1, 2, -2]
  # Grain refuses it at iter(); the README lists this under "Accepted where Grain raises an AttributeError".
  with pytest.raises(AttributeError, match="'function' object has no attribute 'flat_map'"):
    iter(grain.experimental.FlatMapIterDataset(grain.MapDataset.range(3).to_iter_dataset(), lambda x: [x, -x]))


def test_flat_map_fan_out_none_and_a_non_callable_flat_map_fail_as_grain_fails():
  """Found by review: `max_fan_out = None` is Grain's TypeError; a `flat_map` attribute that is no function fails
  each element at `next()` in Grain, not at `iter()`."""

  class NoneFanOut(_NoFanOut):
    max_fan_out = None

  class FiveFlatMap:
    flat_map = 5

  for lib in (grain, loader):
    with pytest.raises(TypeError):
      len(lib.experimental.FlatMapMapDataset(lib.MapDataset.range(3), NoneFanOut()))
    it = iter(lib.experimental.FlatMapIterDataset(lib.MapDataset.range(3).to_iter_dataset(), FiveFlatMap()))
    with pytest.raises(TypeError):
      next(it)


def test_filter_ratio_counts_after_set_state_on_a_live_iterator_as_in_grain():
  """Found by review: loader counts a read-ahead chunk when it arrives; a set_state dropped the chunk but kept its
  counts, so restoring the position an iterator was at (twice) made element 200 fail, 1,900 elements early."""

  def run(lib):
    ds = lib.MapDataset.range(5000).filter(lambda x: x < 1500 or x % 5 < 2).to_iter_dataset()
    it = iter(lib.experimental.WithOptionsIterDataset(
        ds, lib.experimental.DatasetOptions(filter_raise_threshold_ratio=0.5)))
    errors = []
    for step in range(2200):
      if step in (100, 200, 1000):
        it.set_state(it.get_state())
      try:
        next(it)
      except ValueError:
        errors.append(step)
    return errors

  expected = run(grain)
  assert expected[:2] == [2100, 2101] and len(expected) == 100
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert run(loader) == expected
