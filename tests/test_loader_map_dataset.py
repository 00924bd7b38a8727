"""MapDataset transformations: semantics, epochs, validation, batching."""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest

import loader
from loader import map_dataset as map_lib
from loader import sharding
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import write_array_records


def _ints(n):
  return loader.MapDataset.range(n)


def test_shuffle_is_a_permutation_every_epoch_and_differs_across_epochs():
  n = 50
  out = list(_ints(n).shuffle(seed=7).repeat(4))
  epochs = [out[i * n:(i + 1) * n] for i in range(4)]
  for e in epochs:
    assert sorted(e) == list(range(n))
  assert len({tuple(e) for e in epochs}) == 4
  assert list(_ints(n).shuffle(seed=7).repeat(4)) == out  # Same seed, same stream.
  assert list(_ints(n).shuffle(seed=8)) != epochs[0]


def test_repeat_without_reseeding_repeats_the_first_epoch():
  out = list(_ints(10).shuffle(seed=1).repeat(3, reseed_each_epoch=False))
  assert out[:10] == out[10:20] == out[20:]


def test_repeat_lengths_and_infinite_indexing():
  assert len(_ints(5).repeat(3)) == 15
  inf = _ints(5).shuffle(seed=0).repeat()
  assert len(inf) == sys.maxsize
  assert sorted(inf[i] for i in range(10**12, 10**12 + 5)) == list(range(5))
  with pytest.raises(ValueError, match="infinite"):
    inf.repeat(2)
  with pytest.raises(ValueError, match="num_epochs must be positive: an integer >= 1"):
    _ints(5).repeat(0)


def test_getitem_past_the_end_reads_the_next_epoch_as_grain_does():
  ds = _ints(5).map(lambda x: x + 1)
  assert ds[4] == 5 and ds[-1] == 5 and ds[5] == 1 and ds[-6] == 5
  shuffled = _ints(5).shuffle(seed=3)
  epoch1 = [shuffled[i] for i in range(5, 10)]
  assert sorted(epoch1) == list(range(5))
  assert epoch1 != [shuffled[i] for i in range(5)]  # Reshuffled.
  with pytest.raises(IndexError, match="empty dataset"):
    _ints(0)[0]


@pytest.mark.parametrize("sl", [slice(None), slice(2, 9), slice(1, None, 3), slice(None, None, -1),
                                slice(8, 2, -2), slice(100, 200), slice(-4, None)])
def test_slicing_matches_python(sl):
  ref = list(range(12))[sl]
  assert list(_ints(12)[sl]) == ref
  assert list(_ints(12).slice(sl)) == ref
  assert len(_ints(12)[sl]) == len(ref)


def _shard(ds, index, count, drop_remainder=False):
  # Grain's way to shard a MapDataset: slice it at even_split's bounds.
  start, stop = sharding.even_split(len(ds), sharding.ShardOptions(index, count, drop_remainder))
  return ds[start:stop]


@pytest.mark.parametrize("n,count", [(10, 3), (7, 7), (5, 8), (100, 1)])
def test_shards_partition_the_data(n, count):
  shards = [list(_shard(_ints(n), i, count)) for i in range(count)]
  assert sum(shards, []) == list(range(n))
  assert max(map(len, shards)) - min(map(len, shards)) <= 1
  dropped = [list(_shard(_ints(n), i, count, drop_remainder=True)) for i in range(count)]
  assert all(len(s) == n // count for s in dropped)
  assert len(set(sum(dropped, []))) == (n // count) * count


def test_shard_then_shuffle_keeps_the_partition():
  shards = [set(_shard(_ints(20), i, 3).shuffle(seed=5)) for i in range(3)]
  assert set().union(*shards) == set(range(20)) and sum(map(len, shards)) == 20


def test_constructors_live_on_the_class_only_as_in_grain():
  """Clients tell datasets from sources and dataset kinds apart with hasattr, as Grain's classes allow."""
  import grain  # pylint: disable=g-import-not-at-top
  names = ["source", "range", "mix", "select_from_datasets", "concatenate", "shard", "to_iter_dataset", "slice"]
  for ours, theirs in [(_ints(5), grain.MapDataset.range(5)),
                       (_ints(5).to_iter_dataset(), grain.MapDataset.range(5).to_iter_dataset())]:
    assert {n: hasattr(ours, n) for n in names} == {n: hasattr(theirs, n) for n in names}
  assert {n: hasattr(loader.MapDataset, n) for n in names} == {n: hasattr(grain.MapDataset, n) for n in names}
  assert hasattr(loader.IterDataset, "mix") and not hasattr(_ints(5).to_iter_dataset(), "mix")
  assert list(loader.MapDataset.range(3)) == [0, 1, 2]


# shuffle(seed=1.5) and seed=True run as Grain runs them (seed 1): tests/test_port_grain_api_edges.py.
@pytest.mark.parametrize("seed", [-1, 2**32, "1"])
def test_seed_validation_shows_value(seed):
  with pytest.raises(ValueError, match=r"seed must be an integer between 0 and 2\*\*32-1 \(got seed="):
    _ints(3).shuffle(seed=seed)
  if seed == 2**32:  # As in Grain, a random map takes any non-negative seed; a shuffle 32 bits.
    assert list(_ints(3).random_map(lambda x, rng: x, seed=seed)) == [0, 1, 2]
    return
  with pytest.raises(ValueError, match="seed must be"):
    _ints(3).random_map(lambda x, rng: x, seed=seed)


def test_missing_seed_is_explained():
  with pytest.raises(ValueError, match=r"`shuffle` requires a seed. Please provide it with `ds.seed\(seed\)`"):
    _ints(3).shuffle()


def test_pipeline_seed_derives_distinct_seeds():
  a = list(_ints(30).seed(1).shuffle())
  assert a == list(_ints(30).seed(1).shuffle())
  assert a != list(_ints(30).seed(2).shuffle())
  two = _ints(30).seed(1).shuffle().shuffle()
  assert two._seed != two._parent._seed


def test_map_filter_and_to_iter_dataset():
  ds = _ints(10).map(lambda x: x * 3).filter(lambda x: x % 2 == 0)
  assert ds[1] is None and ds[2] == 6
  assert list(ds) == [0, 6, 12, 18, 24]
  assert list(ds.to_iter_dataset(allow_nones=True))[:3] == [0, None, 6]
  assert list(_ints(4).map_with_index(lambda i, x: (i, x)).repeat(2))[4:6] == [(4, 0), (5, 1)]


def test_grain_style_transform_objects_are_accepted():

  class Double:

    def map(self, x):
      return 2 * x

  class Even:

    def filter(self, x):
      return x % 2 == 0

  assert list(_ints(5).map(Double()).filter(Even())) == [0, 2, 4, 6, 8]
  ds = _ints(3).map(42)  # As on Grain: refused where an element is computed, not when built.
  with pytest.raises(TypeError, match=r"'int' object is not callable: map\(\) expects a callable"):
    list(ds)


def test_random_map_depends_only_on_seed_and_index():
  fn = lambda x, rng: (x, int(rng.integers(1 << 30)))
  ds = _ints(40).shuffle(seed=1).random_map(fn, seed=9).repeat(2)
  forward = list(ds)
  backward = [ds[i] for i in reversed(range(len(ds)))][::-1]
  assert forward == backward
  chunked = list(ds.to_iter_dataset(loader.ReadOptions(chunk_size=3)))
  assert chunked == forward
  draws = [v for _, v in forward]
  assert len(set(draws)) == len(draws)  # Epochs and elements get distinct streams.
  assert list(_ints(40).shuffle(seed=1).random_map(fn, seed=10).repeat(2)) != forward


def test_random_map_and_rng_pool_draw_grains_values():
  grain = pytest.importorskip("grain")
  fn = lambda x, rng: (x, int(rng.integers(1 << 30)), float(rng.random()))
  make = lambda lib: lib.MapDataset.range(30).shuffle(seed=4).random_map(fn, seed=11).repeat(2)
  assert list(make(loader)) == list(make(grain))
  theirs, ours = grain.experimental.RngPool(7), loader.experimental.RngPool(7)
  for index, op_seed in [(0, 0), (5, 0), (5, 3), (2**40, 1)]:
    g, l = theirs.acquire_rng(index, op_seed=op_seed), ours.acquire_rng(index, op_seed=op_seed)
    assert l.integers(1 << 62, size=4).tolist() == g.integers(1 << 62, size=4).tolist()
    theirs.release_rng(g)
    ours.release_rng(l)
  with pytest.raises(ValueError, match="index"):
    ours.acquire_rng(-1)


Point = collections.namedtuple("Point", ["x", "y"])


def test_batch_stacks_nested_structures():
  ds = _ints(5).map(lambda i: {"a": np.full((2,), i, np.int32), "t": (i, float(i)), "p": Point(i, [i, i]),
                               "b": b"r\x00" * i, "s": str(i)})
  batches = list(ds.batch(2))
  assert len(batches) == 3
  b0 = batches[0]
  assert b0["a"].shape == (2, 2) and b0["a"].dtype == np.int32
  assert b0["t"][0].tolist() == [0, 1] and b0["t"][1].dtype == np.float64
  assert isinstance(b0["p"], Point) and b0["p"].y[0].tolist() == [0, 1]
  # bytes keep trailing NULs (np.stack's 'S' dtype would strip them).
  assert b0["b"].dtype == object and b0["b"].tolist() == [b"", b"r\x00"]
  assert b0["s"].tolist() == ["0", "1"]
  assert batches[2]["a"].shape == (1, 2)
  assert len(list(ds.batch(2, drop_remainder=True))) == 2


def test_batch_errors():
  with pytest.raises(ValueError, match=r"batch_size must be positive: an integer >= 1 \(got batch_size=0\)"):
    _ints(4).batch(0)
  with pytest.raises(ValueError, match="can not follow `MapDataset.filter`"):
    _ints(4).filter(lambda x: x).batch(2)
  ragged = _ints(3).map(lambda i: np.zeros(i))
  with pytest.raises(ValueError, match="different shapes"):
    ragged.batch(3)[0]
  assert list(ragged.batch(3, batch_fn=len)) == [3]


def test_batch_over_epochs_batches_each_epoch_separately():
  out = [b.tolist() for b in _ints(5).repeat(2).batch(2)]
  assert out == [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4]]
  out = [b.tolist() for b in _ints(5).batch(2).repeat(2)]
  assert out == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]


def test_chunked_reads_hit_each_file_once_per_chunk(tmp_path, monkeypatch):
  files = write_array_records(tmp_path, 4, 50)
  src = loader.ArrayRecordSource(files)
  calls = []
  # Every batched read (list or object array) goes through _read_objects.
  real_read = loader.ArrayRecordSource._read_objects
  monkeypatch.setattr(loader.ArrayRecordSource, "_read_objects",
                      lambda self, idx: calls.append(len(idx)) or real_read(self, idx))
  ds = loader.MapDataset.source(src).shuffle(seed=1).batch(10)
  # chunk_size counts records, whatever stage the batch is on.
  out = list(ds.to_iter_dataset(loader.ReadOptions(num_threads=0, chunk_size=200)))
  assert len(out) == 20 and sorted(record_index(r) for b in out for r in b) == list(range(200))
  assert calls == [200]  # One source call for all 20 batches...
  calls.clear()
  reads_per_file = []
  real_reader = loader.ArrayRecordSource._reader

  class Spy:

    def __init__(self, reader):
      self.reader = reader

    def read(self, keys):
      reads_per_file.append(len(keys))
      return self.reader.read(keys)

  monkeypatch.setattr(loader.ArrayRecordSource, "_reader",
                      lambda self, i, span=False: Spy(real_reader(self, i, span)))
  ds[3]
  assert len(reads_per_file) <= 4 and sum(reads_per_file) == 10  # ...and one reader call per file.


class _GrainStyle(loader.MapDataset):
  """A custom dataset written against Grain's API: only __len__/__getitem__."""

  def __init__(self, parent):
    super().__init__(parent)

  def __len__(self):
    return len(self._parent)

  def __getitem__(self, index):
    return self._parent[index % len(self._parent)] * 100


def test_grain_style_subclass_with_only_getitem_works():
  assert list(_GrainStyle(_ints(4)).shuffle(seed=2).repeat(2))[:4] == [x * 100 for x in list(_ints(4).shuffle(seed=2))]


def test_repr_describes_the_pipeline():
  r = repr(_ints(3).shuffle(seed=4).batch(2))
  assert r == "MapDataset.source(range(0, 3)).shuffle(seed=4).batch(2, drop_remainder=False)"


def test_source_passthrough_for_sequences_and_datasets():
  ds = loader.MapDataset.source(["a", "b", "c"])
  assert list(ds) == ["a", "b", "c"]
  assert loader.MapDataset.source(ds) is ds
  assert_streams_equal(list(ds.batch(2)), [np.array(["a", "b"]), np.array(["c"])])
  assert isinstance(ds, map_lib.SourceMapDataset)


def test_shard_by_jax_process_uses_process_index_and_count(monkeypatch):
  import types  # pylint: disable=g-import-not-at-top

  fake = types.SimpleNamespace(process_index=lambda: 1, process_count=lambda: 3)
  monkeypatch.setitem(sys.modules, "jax", fake)  # No real JAX needed (or imported).
  options = sharding.ShardByJaxProcess(drop_remainder=True)
  assert (options.shard_index, options.shard_count) == (1, 3)
  assert list(_ints(10)[slice(*sharding.even_split(10, options))]) == [3, 4, 5]
  fake.process_index = lambda: 2
  assert list(_ints(10)[slice(*sharding.even_split(10, sharding.ShardByJaxProcess()))]) == [7, 8, 9]


def test_iterating_never_changes_a_list_a_dataset_returned():
  class KeepsItsList(loader.MapDataset):
    """A MapDataset whose batched read hands out a list it also keeps (e.g. a cache)."""

    def __init__(self):
      super().__init__()
      self.data = [f"r{i}".encode() for i in range(10)]

    def __len__(self):
      return len(self.data)

    def __getitem__(self, i):
      return self.data[i]

    def _getitems(self, indices):
      if indices.tolist() == list(range(len(self.data))):
        return self.data  # The very list it keeps.
      return [self.data[i % len(self.data)] for i in indices.tolist()]

  ds = KeepsItsList()
  expected = [f"r{i}".encode() for i in range(10)]
  for read_options in (loader.ReadOptions(num_threads=0, chunk_size=10), loader.ReadOptions(chunk_size=10)):
    assert list(ds.to_iter_dataset(read_options)) == expected
    assert ds.data == expected


def test_batches_of_array_records_equal_the_general_path(tmp_path):
  # Bytes records batch as slices of the reader's object array; the result
  # must be what batching the same records from a list gives.
  files = write_array_records(tmp_path, 3, 40)
  src = loader.ArrayRecordSource(files)
  records = [src[i] for i in range(len(src))]
  make = lambda source: loader.MapDataset.source(source).seed(3).shuffle().repeat(2)[5:].batch(7)
  fast, general = list(make(src)), list(make(records))
  assert len(fast) == len(general) == 34
  for a, b in zip(fast, general):
    assert a.dtype == b.dtype == object and a.shape == b.shape and a.tolist() == b.tolist()
    assert a.base is None  # A copy: keeping one batch keeps no other record alive.

  class Decoded(loader.ArrayRecordSource):
    def __getitem__(self, index):
      return super().__getitem__(index)[:4]

  short = list(loader.MapDataset.source(Decoded(files)).batch(5).to_iter_dataset())
  assert {len(r) for b in short for r in b} == {4}


def test_repr_of_a_dataset_over_a_big_list_stays_short():
  # Clients log datasets (and Keras puts them in errors): not every element.
  rows = [{"x": i} for i in range(200_000)]
  ds = loader.MapDataset.source(rows).shuffle(seed=1).batch(8)
  for text in (repr(ds), str(ds), repr(ds.to_iter_dataset()), repr(iter(ds.to_iter_dataset()))):
    assert len(text) < 300, text[:300]
  assert repr(ds).startswith("MapDataset.source(list(len=200000))")


def _stops_at_5(x, *rest):
  if (x if not rest or isinstance(rest[0], np.random.Generator) else rest[0]) == 5:
    next(iter([]))  # A bug in user code: next() on an exhausted iterator.
  return x if not rest or isinstance(rest[0], np.random.Generator) else rest[0]


@pytest.mark.parametrize("stage", ["map", "filter", "random_map", "map_with_index", "iter map", "iter filter"])
@pytest.mark.parametrize("workers", [0, 2])
def test_stop_iteration_from_a_user_function_is_an_error_not_the_end(stage, workers):
  # Raised out of a map, StopIteration would end the stream silently (Grain's
  # loops end there); it is a RuntimeError naming the function, and the
  # stream goes on after the element, as after any other error.
  ds = loader.MapDataset.range(10).seed(1)  # random_map's seed.
  fn = _stops_at_5
  if stage == "filter" or stage == "iter filter":
    fn = lambda x: _stops_at_5(x) is not None  # pylint: disable=unnecessary-lambda-assignment
  if stage.startswith("iter"):
    ds = getattr(ds.to_iter_dataset(), stage.split()[1])(fn)
  else:
    ds = getattr(ds, stage)(fn).to_iter_dataset()
  if workers:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  it = iter(ds)
  got = [next(it) for _ in range(5)]
  with pytest.raises(RuntimeError, match=r"raised StopIteration .*must not end the stream"):
    next(it)
  assert got == [0, 1, 2, 3, 4] and list(it) == [6, 7, 8, 9]


class _SplitsStopAt5(loader.experimental.FlatMapTransform):
  max_fan_out = 2

  def flat_map(self, element):
    _stops_at_5(element)
    return [element, element]


def _batch_stops_at_5(values):
  for v in values:
    _stops_at_5(v)
  return list(values)


@pytest.mark.parametrize("stage", ["flat_map map", "flat_map iter", "batch_fn map", "batch_fn iter", "DataLoader"])
def test_stop_iteration_from_flat_map_or_batch_fn_is_an_error_not_the_end(stage):
  ds = loader.MapDataset.range(10)
  if stage == "flat_map map":
    ds = loader.experimental.FlatMapMapDataset(ds, _SplitsStopAt5()).to_iter_dataset()
  elif stage == "flat_map iter":
    ds = loader.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _SplitsStopAt5())
  elif stage == "batch_fn map":
    ds = ds.batch(2, batch_fn=_batch_stops_at_5).to_iter_dataset()
  elif stage == "batch_fn iter":
    ds = ds.to_iter_dataset().batch(2, batch_fn=_batch_stops_at_5)
  else:
    ds = loader.DataLoader(data_source=list(range(10)), sampler=loader.samplers.SequentialSampler(
        10, loader.sharding.NoSharding()), operations=[loader.transforms.Batch(2, batch_fn=_batch_stops_at_5)])
  with pytest.raises(RuntimeError, match=r"raised StopIteration .*must not end the stream"):
    list(ds)
