"""Zip{Map,Iter}Dataset and WindowShuffle{Map,Iter}Dataset against Grain 0.2.18."""

from __future__ import annotations

import grain
from grain import experimental as grain_experimental
import numpy as np
import pytest

import loader
from loader import state as state_lib
from loader.transformations.window_shuffle import WindowShuffleIterDataset
from loader.transformations.window_shuffle import WindowShuffleMapDataset
from loader.transformations.zip import ZipIterDataset
from loader.transformations.zip import ZipMapDataset
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import write_array_records

M = loader.MapDataset
G = grain.MapDataset


def _odd(x):
  return x % 2 == 1


def _negate(x):
  return -x


# ---- Zip -------------------------------------------------------------------------


def test_zip_map_equals_grain_with_filtered_holes_slices_and_epochs():
  def make(lib, zip_cls):
    return zip_cls([lib.range(6), lib.range(10, 16).filter(_odd), lib.range(6).map(_negate)])

  ours, theirs = make(M, ZipMapDataset), make(G, grain_experimental.ZipMapDataset)
  assert len(ours) == len(theirs) == 6
  assert list(ours) == list(theirs)
  assert ours[4] == theirs[4] == (4, None, -4)
  assert list(ours[1::2]) == list(theirs[1::2])
  assert list(ours.repeat(2)) == list(theirs.repeat(2))
  for ds in (ours, theirs):  # Grain refuses a batch over filtered holes, inside a zip too.
    with pytest.raises(ValueError, match="(?i)batch.*follow.*filter"):
      ds.batch(4)
    with pytest.raises(ValueError):  # A field that is None in some elements and not in others.
      list(ds.to_iter_dataset().batch(4))


def test_zip_map_length_mismatch_raises_like_grain():
  with pytest.raises(ValueError, match="same length"):
    grain_experimental.ZipMapDataset([G.range(3), G.range(4)])
  with pytest.raises(ValueError, match=r"same length \(got lengths \[3, 4\]\)"):
    ZipMapDataset([M.range(3), M.range(4)])
  with pytest.raises(ValueError, match="at least one parent"):
    ZipMapDataset([])


@pytest.mark.parametrize("lengths,strict", [([4, 4, 4], True), ([2, 4, 3], False), ([4, 2], True),
                                            ([2, 4], True), ([3, 3, 5], True)])
def test_zip_iter_equals_grain_including_strict_errors(lengths, strict):
  def run(lib, zip_cls):
    dss = [lib.range(10 * i, 10 * i + n).to_iter_dataset() for i, n in enumerate(lengths)]
    out = []
    try:
      for x in zip_cls(dss, strict=strict):
        out.append(x)
    except ValueError as e:
      return out, str(e)
    return out, None

  assert run(M, ZipIterDataset) == run(G, grain_experimental.ZipIterDataset)


def test_zip_iter_restores_at_every_step_with_grains_state_shape():
  make = lambda: ZipIterDataset([M.range(20).to_iter_dataset().filter(_odd),
                                 M.range(100, 120).shuffle(seed=2).to_iter_dataset().batch(2)])
  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 10
  it = iter(make())
  next(it)
  mine = state_lib.strip(it.get_state())
  assert list(mine) == ["parents"] and len(mine["parents"]) == 2


def test_grain_written_zip_and_window_shuffle_states_resume_exactly():
  def make(lib, zip_cls):
    return zip_cls([lib.range(9).to_iter_dataset(), lib.range(10, 19).to_iter_dataset()])

  theirs = iter(make(G, grain_experimental.ZipIterDataset))
  for _ in range(4):
    next(theirs)
  ours = iter(make(M, ZipIterDataset))
  ours.set_state(theirs.get_state())
  assert list(ours) == list(theirs)
  # Every step of a window shuffle, including Grain's state right after a
  # window's last element (window_index already the next one's).
  for k in range(10):
    shuffled = iter(grain_experimental.WindowShuffleIterDataset(G.range(9).to_iter_dataset(), window_size=3, seed=1))
    for _ in range(k):
      next(shuffled)
    ours = iter(WindowShuffleIterDataset(M.range(9).to_iter_dataset(), window_size=3, seed=1))
    ours.set_state(shuffled.get_state())
    assert list(ours) == list(shuffled), k


def test_zip_iter_error_consumes_the_failing_tuple_and_stays_aligned():
  failing = {"on": True}

  def flaky(x):
    if x == 12 and failing["on"]:
      raise RuntimeError("bad")
    return x

  it = iter(ZipIterDataset([M.range(5).to_iter_dataset(), M.range(10, 15).to_iter_dataset().map(flaky)]))
  assert [next(it), next(it)] == [(0, 10), (1, 11)]
  with pytest.raises(RuntimeError, match="bad"):
    next(it)
  failing["on"] = False
  assert list(it) == [(3, 13), (4, 14)]  # (2, 12) is consumed, as an element whose map raised is in Grain.


# ---- Window shuffle ------------------------------------------------------------


def _windows(stream, size):
  return [sorted(stream[i:i + size]) for i in range(0, len(stream), size)]


@pytest.mark.parametrize("n,window_size", [(40, 8), (37, 5), (10, 4), (7, 20)])
def test_window_shuffle_map_has_grains_full_windows_and_each_element_once(n, window_size):
  ours = list(WindowShuffleMapDataset(M.range(n), window_size=window_size, seed=7))
  theirs = list(grain_experimental.WindowShuffleMapDataset(G.range(n), window_size=window_size, seed=7))
  full = n // window_size * window_size
  assert ours[:full] == theirs[:full]  # Grain's order, not only its windows.
  # Grain lets the last, shorter window reach into the next epoch (duplicates); ours stays inside.
  assert sorted(ours) == list(range(n))
  assert ours != list(range(n))


def test_window_shuffle_map_equals_grain_over_epochs_when_windows_fit():
  def make(lib, cls):
    return cls(lib.range(40), window_size=8, seed=1000).repeat(3)

  ds = make(M, WindowShuffleMapDataset)
  theirs = make(G, grain_experimental.WindowShuffleMapDataset)
  assert [ds[i] for i in range(120)] == [theirs[i] for i in range(120)]
  # Infinite parents too (Grain's windows simply go on).
  inf = lambda lib, cls: cls(lib.range(10).repeat(), window_size=4, seed=5)
  assert [inf(M, WindowShuffleMapDataset)[i] for i in range(40)] == [
      inf(G, grain_experimental.WindowShuffleMapDataset)[i] for i in range(40)]


def test_window_shuffle_map_never_repeats_where_grains_last_window_does():
  theirs = list(grain_experimental.WindowShuffleMapDataset(G.range(10), window_size=4, seed=0))
  ours = list(WindowShuffleMapDataset(M.range(10), window_size=4, seed=0))
  assert sorted(theirs) != list(range(10))  # The documented difference.
  assert sorted(ours) == list(range(10))
  assert ours[:8] == theirs[:8]


def test_window_shuffle_map_reshuffles_every_epoch_and_window():
  ds = WindowShuffleMapDataset(M.range(50), window_size=10, seed=3)
  epochs = [ds._getitems(np.arange(e * 50, (e + 1) * 50)) for e in range(3)]  # pylint: disable=protected-access
  for epoch in epochs:
    assert _windows(epoch, 10) == [list(range(w, w + 10)) for w in range(0, 50, 10)]
  assert epochs[0] != epochs[1] != epochs[2]
  assert list(ds.repeat(2))[50:] == epochs[1]
  offsets = {tuple(np.array(epochs[0][w:w + 10]) - w) for w in range(0, 50, 10)}
  assert len(offsets) == 5  # Each window its own permutation.
  other_seed = list(WindowShuffleMapDataset(M.range(50), window_size=10, seed=4))
  assert other_seed != epochs[0]


def test_window_shuffle_iter_has_grains_windows_over_a_filtered_stream():
  def make(lib, cls):
    return cls(lib.range(60).to_iter_dataset().filter(lambda x: x % 3 != 0), window_size=7, seed=11)

  ours = list(make(M, WindowShuffleIterDataset))
  theirs = list(make(G, grain_experimental.WindowShuffleIterDataset))
  assert ours == theirs  # Grain's order, the last (short) window included.
  assert ours != sorted(ours)


def test_window_shuffle_iter_restores_at_every_step_with_grains_state_keys():
  make = lambda: WindowShuffleIterDataset(
      M.range(45).to_iter_dataset().filter(_odd).batch(2), window_size=4, seed=5).map(lambda b: b.tolist())
  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 11
  it = iter(WindowShuffleIterDataset(M.range(9).to_iter_dataset(), window_size=4, seed=1))
  next(it)
  theirs = iter(grain_experimental.WindowShuffleIterDataset(G.range(9).to_iter_dataset(), window_size=4, seed=1))
  next(theirs)
  assert sorted(state_lib.strip(it.get_state())) == sorted(theirs.get_state())


def test_window_shuffle_argument_errors():
  with pytest.raises(ValueError, match="window_size must be positive: an integer >= 1"):
    WindowShuffleMapDataset(M.range(5), window_size=0, seed=1)
  with pytest.raises(ValueError, match="seed must be an integer between 0 and 2\\*\\*32-1"):
    WindowShuffleIterDataset(M.range(5).to_iter_dataset(), window_size=2, seed=-1)


# ---- Worker counts ---------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("zipws"), 2, [33, 27])


def _pipeline(files, workers=None):
  src = M.source(loader.ArrayRecordSource(files)).map(record_index)
  ds = ZipMapDataset([WindowShuffleMapDataset(src, window_size=9, seed=2), src.shuffle(seed=8)])
  ds = ds.repeat(2).to_iter_dataset().filter(lambda t: (t[0] + t[1]) % 4 != 0)
  ds = WindowShuffleIterDataset(ds, window_size=6, seed=3).batch(5)
  if workers is not None:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  return ds


def test_stream_is_the_same_for_zero_and_two_workers_and_restores_across_them(files):
  stream = assert_restore_at_every_step_gives_same_stream(lambda: _pipeline(files))
  assert_streams_equal(list(_pipeline(files, 2)), stream)
  assert_restore_at_every_step_gives_same_stream(
      lambda: _pipeline(files, 0), make_restore_ds=lambda: _pipeline(files, 2), steps=[7])
