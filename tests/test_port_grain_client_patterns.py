"""Patterns of real Grain client code, run on Grain 0.2.18 and, with only the import line changed, on loader.

Each case is a pattern found in public Grain users (MaxText's HuggingFace
pipeline, sources that decode in `__getitem__`, code that catches a map's
exception type) and is compared with what Grain itself gives.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests import porting
from tests.porting import plain

# A source that decodes in __getitem__ on top of ArrayRecordDataSource, and a
# RangeDataSource subclass: Grain reads both by index, so the override counts.
DECODING_SOURCES = """
import pickle
import grain

class Decoded(grain.sources.ArrayRecordDataSource):
  def __getitem__(self, record_key):
    return pickle.loads(super().__getitem__(record_key))

class Tens(grain.sources.RangeDataSource):
  def __getitem__(self, record_key):
    return super().__getitem__(record_key) * 10

class BrokenBatchedRead:  # Like tfds.testing.mock_data sources: __getitems__ fails.
  def __len__(self):
    return 6
  def __getitem__(self, i):
    return i * i
  def __getitems__(self, keys):
    raise TypeError("_getitems() missing 1 required positional argument: 'record_keys'")

ds = grain.MapDataset.source(Decoded(paths))
result = dict(
    by_index=[ds[3], ds[-1]],
    iterated=[x["id"] for x in ds.to_iter_dataset()],
    batched=ds.batch(4)[1],
    shuffled=[x["id"] for x in ds.shuffle(seed=1).to_iter_dataset()],
    range=list(grain.MapDataset.source(Tens(0, 4, 1))),
    range_iterated=list(grain.MapDataset.source(Tens(0, 4, 1)).to_iter_dataset()),
    broken_batched=[grain.MapDataset.source(BrokenBatchedRead())[2],
                    list(grain.MapDataset.source(BrokenBatchedRead()).to_iter_dataset())],
)
"""


def test_a_source_that_overrides_getitem_is_read_through_it(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  paths = []
  for f in range(2):
    path = str(tmp_path / f"d-{f}.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    for i in range(6):
      writer.write(pickle.dumps({"id": 6 * f + i, "x": np.arange(3) + i}))
    writer.close()
    paths.append(path)
  g, l = porting.run_both(DECODING_SOURCES, paths=paths)
  assert plain(l.result) == plain(g.result)  # The shuffled order included: the shuffle is Grain's.
  assert g.result["iterated"] == list(range(12)) and g.result["range"] == [0, 10, 20, 30]
  assert sorted(g.result["shuffled"]) == list(range(12)) != g.result["shuffled"]


BATCHES = """
import grain
import jax.numpy as jnp
import numpy as np

result = dict(
    # Batched dicts list their keys sorted, whatever order the elements use.
    keys=list(grain.MapDataset.source([{"z": 1, "a": 2}, {"a": 3, "z": 4}]).batch(2)[0]),
    values=grain.MapDataset.source([{"z": 1, "a": 2}, {"a": 3, "z": 4}]).batch(2)[0],
    nested_keys=list(grain.MapDataset.source([{"b": {"y": 1, "x": 2}}] * 2).batch(2)[0]["b"]),
    iter_keys=list(next(iter(grain.MapDataset.range(4).map(lambda i: {"z": i, "a": -i})
                             .to_iter_dataset().batch(2)))),
    # A None field stays None.
    none_field=grain.MapDataset.source([{"a": 1, "m": None}] * 2).batch(2)[0]["m"],
    # Arrays of other libraries stack into numpy arrays.
    jax=grain.MapDataset.source([jnp.ones(2), jnp.zeros(2)]).batch(2)[0],
    jax_dtype=str(grain.MapDataset.source([jnp.ones(2), jnp.zeros(2)]).batch(2)[0].dtype),
)
errors = []
try:
  grain.MapDataset.source([{"a": None}, {"a": 1}]).batch(2)[0]
except Exception as e:
  errors.append(type(e).__name__)
"""


def test_batches_of_dicts_nones_and_foreign_arrays_are_grains():
  g, l = porting.run_both(BATCHES)
  assert plain(l.result) == plain(g.result)
  assert l.result["keys"] == g.result["keys"] == ["a", "z"]
  assert l.result["iter_keys"] == ["a", "z"] and l.result["none_field"] is None
  assert type(l.result["jax"]) is np.ndarray and l.result["jax_dtype"] == g.result["jax_dtype"] == "float32"
  assert l.errors == g.errors == ["ValueError"]


KEYWORDS = """
import grain

ds = grain.MapDataset.range(6)
result = dict(
    map_filter=list(ds.filter(transform=lambda x: x % 2)),
    iter_filter=list(ds.to_iter_dataset().filter(transform=lambda x: x % 3 == 0)),
    seed_none=list(ds.seed(None).map(lambda x: x + 1)),
    iter_seed_none=list(ds.to_iter_dataset().seed(None).map(lambda x: x + 1)),
    # Shuffling after repeat() permutes every position of the endless stream.
    repeat_shuffle_len=len(ds.repeat().shuffle(seed=1)),
    repeat_shuffle_values=[x for _, x in zip(range(300), ds.repeat().shuffle(seed=1))],
)
"""


def test_grain_keyword_names_and_seed_none():
  g, l = porting.run_both(KEYWORDS)
  assert plain(l.result) == plain(g.result)  # The shuffled stream included: the shuffle is Grain's.
  assert set(g.result["repeat_shuffle_values"]) == set(range(6))


# MaxText's HFDataSource: __getitem__ ignores the index, returns the next
# record of the stream picked by the reading thread's name (the number after
# "_"), and raises StopIteration at the end of the data.
STREAMING_SOURCE = """
import json, sys, threading
from absl import flags
import grain.python as grain

flags.FLAGS.mark_as_parsed()


class Stream(grain.RandomAccessDataSource):
  def __init__(self, n):
    self.n = n
    self.it = None

  def __len__(self):
    return 10_000_000_000

  def __getitem__(self, index):
    if self.it is None:
      self.it = iter(range(self.n))
    thread = int(threading.current_thread().name.split("_")[1])
    return next(self.it) + 1000 * thread


if __name__ == "__main__":  # Grain's spawned workers import this script again.
  out = {}
  for workers in (0, 1):
    loader = grain.DataLoader(
        data_source=Stream(10),
        sampler=grain.IndexSampler(10_000_000_000, grain.NoSharding(), shuffle=False, num_epochs=1),
        operations=[grain.Batch(4, drop_remainder=True)], worker_count=workers,
        read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=16))
    out[str(workers)] = [b.tolist() for b in loader]
  print(json.dumps(out))
"""


@pytest.mark.parametrize("lib", porting.LIBS)
def test_a_streaming_source_reads_every_record_once_and_ends_at_stopiteration(lib, tmp_path):
  # As Grain: with 0 or 1 workers the whole stream, in order, read in a thread
  # whose name ends in "_0", and StopIteration ends the data. (Grain's last,
  # partial batch of such a stream, [8, 9] here without drop_remainder, is not
  # produced by loader: it learns the end only when a read fails.)
  out = porting.run_script(STREAMING_SOURCE, lib, tmp_path)
  assert out == {"0": [[0, 1, 2, 3], [4, 5, 6, 7]], "1": [[0, 1, 2, 3], [4, 5, 6, 7]]}


WORKER_EXCEPTION = """
import json
from absl import flags
import grain

flags.FLAGS.mark_as_parsed()


def lookup(x):
  return {0: "a", 1: "b", 2: "c"}[x]


if __name__ == "__main__":  # Grain's spawned workers import this script again.
  caught = []
  for workers in (0, 2):
    ds = grain.MapDataset.range(5).map(lookup).to_iter_dataset().mp_prefetch(
        grain.MultiprocessingOptions(num_workers=workers))
    got = []
    try:
      for x in ds:
        got.append(x)
    except KeyError as e:
      caught.append([workers, got, repr(e)])
  print(json.dumps(caught))
"""


def test_an_exception_in_a_worker_keeps_its_type():
  # Grain raises the worker's exception itself; `except KeyError` must catch it.
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as d:
    g = porting.run_script(WORKER_EXCEPTION, "grain", d)
    l = porting.run_script(WORKER_EXCEPTION, "loader", d)
  assert l == g == [[0, ["a", "b", "c"], "KeyError(3)"], [2, ["a", "b", "c"], "KeyError(3)"]]


# MaxText's HuggingFace pipeline packs with Grain's legacy DataLoader operation.
PACK_AND_BATCH = """
import json
from absl import flags
import numpy as np
import grain.python as grain

flags.FLAGS.mark_as_parsed()

lengths = [3, 2, 4, 1, 5, 2, 2, 6, 1, 3, 4, 2]
source = [{"targets": np.arange(n, dtype=np.int32) + 10 * i, "inputs": np.full(n, i, dtype=np.int64)}
          for i, n in enumerate(lengths)]


def plain(x):
  if isinstance(x, dict):
    return {"keys": list(x), **{k: plain(v) for k, v in x.items()}}
  if isinstance(x, (list, tuple)):
    return [plain(v) for v in x]
  return [str(x.dtype), x.tolist()]


if __name__ == "__main__":  # Grain's spawned workers import this script again.
  out = {}
  for workers, per_bin in ((0, None), (0, 2), (1, None)):
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.IndexSampler(len(source), grain.NoSharding(), shuffle=False, num_epochs=1),
        operations=[grain.experimental.PackAndBatchOperation(
            length_struct={"targets": 6, "inputs": 6}, batch_size=2, max_sequences_per_bin=per_bin)],
        worker_count=workers)
    out[f"{workers}-{per_bin}"] = [plain(b) for b in loader]
  print(json.dumps(out))
"""


def test_pack_and_batch_operation_packs_like_grain(tmp_path):
  g = porting.run_script(PACK_AND_BATCH, "grain", tmp_path)
  l = porting.run_script(PACK_AND_BATCH, "loader", tmp_path)
  assert l == g
  first = g["0-None"][0]  # (values, segment ids, positions), each {"inputs", "targets"} of (2, 6).
  # First fit: example 1 (length 2) joins row 0 after example 0 (length 3).
  assert first[0]["targets"] == ["int32", [[0, 1, 2, 10, 11, 30], [20, 21, 22, 23, 0, 0]]]
  assert first[1]["targets"] == ["int32", [[1, 1, 1, 2, 2, 3], [1, 1, 1, 1, 0, 0]]]
  assert first[2]["targets"] == ["int32", [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]]]


def test_pack_and_batch_operation_rejects_examples_over_the_packed_length():
  import loader  # pylint: disable=g-import-not-at-top
  op = loader.experimental.PackAndBatchOperation(length_struct={"t": 3}, batch_size=2)
  records = [loader.Record(loader.RecordMetadata(index=0), {"t": np.arange(5)})]
  with pytest.raises(ValueError, match=r"feature t has length 5, over its packed length 3; truncate"):
    list(op(iter(records)))
  with pytest.raises(ValueError, match="lacks a feature"):
    list(op(iter([loader.Record(loader.RecordMetadata(index=0), {"u": np.arange(2)})])))


# WithOptionsIterDataset/DatasetOptions as clients use them (a filter-ratio
# guard; STAGE_TIMING for profiling) and multithread_prefetch (MaxText).
OPTIONS = """
import grain

E = grain.experimental
errors = []

def take(ds, n=5000):
  out, it = [], iter(ds)
  try:
    for _ in range(n):
      out.append(next(it))
  except StopIteration:
    return [len(out), out[-3:], "end", None]
  except ValueError:
    errors.append("ValueError")
    return [len(out), out[-3:], "ValueError", it.get_state()["next_index"]]

keep = lambda x: x % 10 == 0 or x > 1500  # 90% of the first 1,500 are dropped.
raising = E.DatasetOptions(filter_raise_threshold_ratio=0.5)
map_filtered = grain.MapDataset.range(3000).filter(keep).to_iter_dataset()
iter_filtered = grain.MapDataset.range(3000).to_iter_dataset().filter(keep)
merged = E.DatasetOptions(min_shm_size=1024).merge(E.DatasetOptions(min_shm_size=512, filter_warn_threshold_ratio=None))
doubled = grain.MapDataset.range(20).map(lambda x: x * 2).to_iter_dataset()
it = iter(E.multithread_prefetch(doubled, num_threads=2, buffer_size=4))
head = [next(it) for _ in range(5)]
resumed = iter(E.multithread_prefetch(doubled, num_threads=2, buffer_size=4))
resumed.set_state(it.get_state())
result = dict(
    map_filter=take(E.WithOptionsIterDataset(map_filtered, raising)),
    iter_filter=take(E.WithOptionsIterDataset(iter_filtered, raising)),
    # Options set before the filter reach it too.
    set_below=take(E.WithOptionsIterDataset(grain.MapDataset.range(3000).to_iter_dataset(), raising).filter(keep)),
    below_threshold=take(E.WithOptionsIterDataset(map_filtered, E.DatasetOptions(filter_raise_threshold_ratio=0.95))),
    # Set later in the pipeline wins.
    overridden=take(E.WithOptionsIterDataset(E.WithOptionsIterDataset(map_filtered, raising),
                                             E.DatasetOptions(filter_raise_threshold_ratio=None))),
    kept_on_merge=take(E.WithOptionsIterDataset(E.WithOptionsIterDataset(map_filtered, raising),
                                                E.DatasetOptions(min_shm_size=4))),
    merged=[merged.min_shm_size, merged.filter_warn_threshold_ratio, merged.filter_raise_threshold_ratio],
    stage_timing=list(E.WithOptionsIterDataset(
        doubled, E.DatasetOptions(execution_tracking_mode=E.ExecutionTrackingMode.STAGE_TIMING)))[:4],
    prefetched=list(E.multithread_prefetch(doubled, num_threads=2, buffer_size=4)),
    no_threads=E.multithread_prefetch(doubled, 0, 4) is doubled,
    resumed=[head, list(resumed)],
)
"""


def test_dataset_options_and_multithread_prefetch_behave_as_in_grain():
  g, l = porting.run_both(OPTIONS)
  assert plain(l.result) == plain(g.result)
  assert l.result["map_filter"] == [100, [970, 980, 990], "ValueError", 1000]
  assert l.result["below_threshold"][2] == "end" and l.result["overridden"][2] == "end"
  assert l.errors == g.errors == ["ValueError"] * 4


def test_filter_ratio_check_counts_windows_across_chunks():
  from loader import dataset_options  # pylint: disable=g-import-not-at-top
  check = dataset_options.FilterRatioCheck("f", dataset_options.DatasetOptions(filter_raise_threshold_ratio=0.5))
  assert check.first_failure(2500) is None  # Nothing dropped: windows close quietly.
  dropped = [False] * 200 + [True] * 800
  # The open window holds 500 kept; it closes 500 elements into this run, with 300 dropped: 30%.
  assert check.first_failure(1000, dropped) is None
  # The next window: 500 dropped (of the run above) + 500 more here -> fails at its last element.
  assert check.first_failure(600, [True] * 600) == 499
  with pytest.raises(ValueError, match="skipped 100.00 % of the last seen 1000"):
    raise check.error()
  with pytest.raises(ValueError, match=r"filter_raise_threshold_ratio must be None or a number in \[0, 1\]"):
    dataset_options.DatasetOptions(filter_raise_threshold_ratio=2)


# IterDataset.seed() then random ops: the per-element random values are Grain's.
ITER_SEED = """
import grain

f = lambda x, rng: int(rng.integers(1000))
it = grain.MapDataset.range(6).to_iter_dataset()
result = dict(
    seed_random_map=list(it.seed(3).random_map(f)),
    seed_map_random_map=list(it.seed(3).map(lambda x: x).random_map(f)),
    map_seed_random_map=list(it.map(lambda x: x).seed(3).random_map(f)),
    two_random_maps=list(it.seed(3).random_map(f).random_map(lambda x, rng: x * 1000 + int(rng.integers(1000)))),
    after_filter=list(it.seed(3).filter(lambda x: True).random_map(f)),
    map_level_seed=list(grain.MapDataset.range(6).seed(3).to_iter_dataset().map(lambda x: x).random_map(f)),
)
"""


def test_iter_dataset_seed_gives_grains_random_values():
  g, l = porting.run_both(ITER_SEED)
  assert plain(l.result) == plain(g.result)
