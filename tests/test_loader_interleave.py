"""InterleaveIterDataset: Grain 0.2.18's order, exhaustion, state shape; restores; workers."""

from __future__ import annotations

import threading

import grain
from grain import experimental as grain_experimental
import pytest

import loader
from loader import state as state_lib
from loader.transformations.interleave import InterleaveIterDataset
from loader.transformations.limit import LimitIterDataset
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import write_array_records

M = loader.MapDataset
G = grain.MapDataset

_LENGTHS = [3, 1, 4, 0, 2, 5, 0, 3]


def _list_form(lib, lengths=_LENGTHS, filtered=False):
  out = []
  for i, n in enumerate(lengths):
    ds = lib.range(100 * i, 100 * i + n)
    if filtered:
      ds = ds.filter(lambda x: x % 2 == 0)
    # Mix both kinds of entries, as Grain allows.
    out.append(ds if i % 3 == 2 else ds.to_iter_dataset())
  return out


def _lazy(i):
  return G.range(100 * i, 100 * i + _LENGTHS[i])


def _lazy_ours(i):
  return M.range(100 * i, 100 * i + _LENGTHS[i])


@pytest.mark.parametrize("cycle_length", [1, 2, 3, 5, 20])
def test_order_and_end_equal_grain_for_lists_of_datasets(cycle_length):
  ours = list(InterleaveIterDataset(_list_form(M), cycle_length=cycle_length))
  theirs = list(grain_experimental.InterleaveIterDataset(_list_form(G), cycle_length=cycle_length))
  assert ours == theirs
  assert sorted(ours) == sorted(x for i, n in enumerate(_LENGTHS) for x in range(100 * i, 100 * i + n))


@pytest.mark.parametrize("cycle_length", [1, 3])
def test_order_equals_grain_for_a_map_dataset_of_datasets_and_filtered_inputs(cycle_length):
  ours = list(InterleaveIterDataset(M.range(len(_LENGTHS)).map(_lazy_ours), cycle_length=cycle_length))
  theirs = list(grain_experimental.InterleaveIterDataset(G.range(len(_LENGTHS)).map(_lazy),
                                                         cycle_length=cycle_length))
  assert ours == theirs
  filtered = list(InterleaveIterDataset(_list_form(M, filtered=True), cycle_length=cycle_length,
                                        iter_buffer_size=0))
  assert filtered == list(grain_experimental.InterleaveIterDataset(_list_form(G, filtered=True),
                                                                   cycle_length=cycle_length))


def _strip_all(state):
  # Nested states may carry their own pipeline description; Grain's have none.
  if isinstance(state, dict):
    return {k: _strip_all(v) for k, v in state_lib.strip(state).items()}
  if isinstance(state, list):
    return [_strip_all(v) for v in state]
  return state


def test_state_has_grains_shape_and_positions():
  def first_states(lib, interleave):
    it = iter(interleave([lib.range(3).to_iter_dataset(), lib.range(10, 12).to_iter_dataset()], cycle_length=2))
    out = []
    for _ in range(4):
      next(it)
      out.append(it.get_state())
    return out

  ours = [_strip_all(s) for s in first_states(M, InterleaveIterDataset)]
  theirs = first_states(G, grain_experimental.InterleaveIterDataset)
  for mine, grains in zip(ours, theirs):
    grains.pop("future_states")  # Elastic-iterator bookkeeping, not a position.
    assert mine == grains


def _as_streams(datasets):
  # Stream stages (not plain MapDataset reads) get a read-ahead thread each.
  # All of one kind, so every slot's state has the same shape.
  return [LimitIterDataset(ds if isinstance(ds, loader.IterDataset) else ds.to_iter_dataset(), 1000)
          for ds in datasets]


def test_a_grain_written_state_resumes_exactly_for_a_list_and_is_refused_for_lazy_datasets():
  theirs = iter(grain_experimental.InterleaveIterDataset(_list_form(G), cycle_length=3))
  for _ in range(6):
    next(theirs)
  ours = iter(InterleaveIterDataset(_list_form(M), cycle_length=3))
  ours.set_state(theirs.get_state())
  assert list(ours) == list(theirs)
  lazy = iter(grain_experimental.InterleaveIterDataset(G.range(len(_LENGTHS)).map(_lazy), cycle_length=2))
  next(lazy)
  with pytest.raises(state_lib.StateMismatchError, match="not guarantee to be Grain's"):
    iter(InterleaveIterDataset(M.range(len(_LENGTHS)).map(_lazy_ours), cycle_length=2)).set_state(lazy.get_state())


@pytest.mark.parametrize("iter_buffer_size", [0, 2])
def test_restore_at_every_step(iter_buffer_size):
  make = lambda: InterleaveIterDataset(_as_streams(_list_form(M, filtered=True) + _list_form(M)), cycle_length=3,
                                       iter_buffer_size=iter_buffer_size).map(lambda x: x + 1)
  stream = assert_restore_at_every_step_gives_same_stream(make)
  assert len(stream) == sum(_LENGTHS) + sum((n + 1) // 2 for n in _LENGTHS)


def test_restore_at_every_step_of_a_map_dataset_of_datasets():
  make = lambda: InterleaveIterDataset(M.range(len(_LENGTHS)).map(_lazy_ours), cycle_length=2).batch(3)
  assert len(assert_restore_at_every_step_gives_same_stream(make)) == 6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("interleave"), 4, [9, 14, 5, 11])


def test_maxtext_style_files_interleaved_equal_grain(files):
  # MaxText: MapDataset.source(files).map(open one file) -> InterleaveIterDataset.
  def per_file(lib, source):
    return lambda path: lib.MapDataset.source(source([path])).map(record_index).to_iter_dataset()

  ours = InterleaveIterDataset(M.source(files).map(per_file(loader, loader.ArrayRecordSource)), cycle_length=3)
  theirs = grain_experimental.InterleaveIterDataset(
      G.source(files).map(per_file(grain, grain.sources.ArrayRecordDataSource)), cycle_length=3)
  assert list(ours) == list(theirs)
  assert sorted(ours) == list(range(39))


def _worker_pipeline(files, workers):
  first = M.source(loader.ArrayRecordSource(files[:2])).shuffle(seed=1).map(record_index).to_iter_dataset()
  if workers:
    first = first.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  rest = [M.source(loader.ArrayRecordSource([f])).map(record_index).to_iter_dataset() for f in files[2:]]
  return InterleaveIterDataset([first] + rest, cycle_length=2).batch(4)


def test_stream_and_states_do_not_depend_on_an_inputs_worker_count(files):
  stream = list(_worker_pipeline(files, 0))
  assert_streams_equal(list(_worker_pipeline(files, 2)), stream)
  assert_restore_at_every_step_gives_same_stream(
      lambda: _worker_pipeline(files, 0), make_restore_ds=lambda: _worker_pipeline(files, 2), steps=[4])


def test_an_error_in_an_input_is_raised_and_the_next_call_goes_on_in_the_same_slot():
  failing = {"on": True}

  def flaky(x):
    if x == 101 and failing["on"]:
      raise RuntimeError("bad element")
    return x

  it = iter(InterleaveIterDataset([M.range(3).to_iter_dataset(), M.range(100, 103).to_iter_dataset().map(flaky)],
                                  cycle_length=2))
  assert [next(it) for _ in range(3)] == [0, 100, 1]
  with pytest.raises(RuntimeError, match="bad element"):
    next(it)
  failing["on"] = False
  assert list(it) == [102, 2]  # 101 is consumed by its input, as a failed element is in Grain.


def test_close_stops_the_read_ahead_threads():
  before = {t for t in threading.enumerate() if t.name == "loader-prefetch"}
  streams = [M.range(50).to_iter_dataset().filter(lambda x: x % 3).batch(2) for _ in range(3)]
  it = iter(InterleaveIterDataset(streams, cycle_length=3, iter_buffer_size=4))
  for _ in range(5):
    next(it)
  assert {t for t in threading.enumerate() if t.name == "loader-prefetch"} - before
  it.close()
  assert not {t for t in threading.enumerate() if t.name == "loader-prefetch" and t.is_alive()} - before


def test_argument_errors():
  with pytest.raises(ValueError, match="cycle_length must be positive: an integer >= 1"):
    InterleaveIterDataset([M.range(3)], cycle_length=0)
  with pytest.raises(TypeError, match="autotuned cycle lengths are not supported"):
    InterleaveIterDataset([M.range(3)], cycle_length=2.0)
  with pytest.raises(TypeError, match=r"datasets\[1\] is a list"):
    InterleaveIterDataset([M.range(3), [1, 2]], cycle_length=2)
  assert list(InterleaveIterDataset([], cycle_length=2)) == []
