"""Grain 0.2.18's README and docstring examples, run on Grain and, with only the import line changed, on loader.

Sources (github.com/google/grain at tag v0.2.18): README.md's quick example;
docs/tutorials/data_sources/bagz_data_source_tutorial.md, load_from_gcs_tutorial.md
and load_from_s3_tutorial.md (local stand-ins for bagz and the mounted buckets);
the `Example` blocks of grain/_src/python/dataset/base.py
(RandomAccessDataSource, DatasetSelectionMap, ExecutionTrackingMode,
DatasetOptions, DatasetOptions.merge), dataset.py (MapDataset.seed and
IterDataset.seed Examples 1-5, WithOptionsIterDataset, MapDataset.source (over
an ArrayRecord file, in the S3 test) / mix /
concatenate / apply / batch / filter / map / map_with_index / shuffle / slice /
random_map / repeat, IterDataset.mix / apply / batch / filter / map /
random_map / map_with_index), transformations/batch.py (batch_and_pad),
transformations/limit.py (LimitIterDataset) and transformations/interleave.py
(InterleaveIterDataset with mp_prefetch: its `ds = ...` and `...` placeholders
filled with a small map and file reader, and its `ds.mp_prefetch(ds, 2)`, which
passes the dataset as options and fails on Grain as written, written
`ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))`). The
docstrings write their expected values as `expr == value` lines; here each such expression is kept in
`results`, so the test compares it with Grain's and checks it holds. Names the
docstrings use unqualified (`MapDataset`, `AddOne`, `LimitIterDataset`,
`ArrayRecordDataSource`, `paths`) are bound from `grain` or defined locally;
`np.ndarray([1, 2])` in the docstrings means an array of those values. The
docstrings of data_loader.py, samplers.py, operations.py, checkpoint/handler.py,
ipc/shared_memory_array.py and grain/python/experimental.py have no code
examples at v0.2.18; the other docs pages are ported by the other
test_port_grain_* files. The README's example loops `for batch in dataset:`
with a comment as body; a `batches.append(batch)` stands in for it.
"""

from __future__ import annotations

import numpy as np

from tests import porting
from tests.porting import plain

README = """
import grain

dataset = (
    grain.MapDataset.source([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    .shuffle(seed=42)  # Shuffles elements globally.
    .map(lambda x: x+1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)

batches = []
for batch in dataset:
  # Training step.
  batches.append(batch)
"""


def test_readme_example():
  g, l = porting.run_both(README)
  assert plain(l.batches) == plain(g.batches)
  assert [len(b) for b in g.batches] == [2] * 5 + [1]
  assert sorted(np.concatenate(g.batches).tolist()) == list(range(1, 12))


BASE_DOCSTRINGS = """
import logging

from grain.sources import RandomAccessDataSource

class MyInMemorySource:
  def __init__(self, data: list):
    self._data = data
  def __len__(self) -> int:
    return len(self._data)
  def __getitem__(self, index: int):
    return self._data[index]
  def __repr__(self) -> str:
    # Required for PyGrain checkpointing with DataLoader
    return f"MyInMemorySource(size={len(self)})"

source = MyInMemorySource(["a", "b", "c"])
# source satisfies the RandomAccessDataSource protocol.
assert isinstance(source, RandomAccessDataSource)

import grain

class ConcatMap(grain.transforms.DatasetSelectionMap):
  def __len__(self) -> int:
    return 7
  def __getitem__(self, index: int) -> tuple[int, int]:
    if index >= len(self):
      raise IndexError("Index out of range")
    if index < 3:
      return (0, index)
    else:
      return (1, index - 3)

cmap = ConcatMap()
assert len(cmap) == 7
assert cmap[3] == (1, 0)

import grain

options = grain.experimental.DatasetOptions(
    execution_tracking_mode=grain.experimental.ExecutionTrackingMode.STAGE_TIMING
)
ds = grain.MapDataset.range(10).to_iter_dataset()
ds_with_stage_timing = (
    grain.experimental.WithOptionsIterDataset(ds, options)
)

printed = []
for element in ds_with_stage_timing:
  printed.append(element)  # print(element)

import grain

ds = (
    grain.MapDataset.range(0, 1000)
    .filter(lambda x: x % 2 == 0)
    .to_iter_dataset()
)
# apply the DatasetOptions to create another IterDataset.
ds_options = grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)
ds = grain.experimental.WithOptionsIterDataset(ds, ds_options)
# Added: iterating it (the docstring stops before). Half of range(1000) is
# filtered out, above the 0.1 raise threshold, so Grain raises ValueError.
try:
  evens = list(ds)
except ValueError as e:
  evens = ("ValueError", "filter_raise_threshold_ratio" in str(e))

import grain
# opt1 explicitly sets min_shm_size
opt1 = grain.experimental.DatasetOptions(min_shm_size=1024)

# opt2 explicitly sets min_shm_size AND filter thresholds
opt2 = grain.experimental.DatasetOptions(
    min_shm_size=512,
    filter_warn_threshold_ratio=None
)

# Merge opt2 into opt1. opt1's explicit values take precedence.
merged = opt1.merge(opt2)
assert merged.min_shm_size == 1024
assert merged.filter_warn_threshold_ratio is None

# Added: the selection map drives select_from_datasets as the docstring describes.
selected = list(grain.MapDataset.select_from_datasets(
    [grain.MapDataset.range(3), grain.MapDataset.range(10, 14)], cmap))
"""


def test_base_docstrings():
  g, l = porting.run_both(BASE_DOCSTRINGS)
  for ns in (g, l):
    assert ns.printed == list(range(10))
    assert ns.evens == ("ValueError", True)
    assert ns.selected == [0, 1, 2, 10, 11, 12, 13]
    assert repr(ns.source) == "MyInMemorySource(size=3)"
    assert (ns.merged.min_shm_size, ns.merged.filter_warn_threshold_ratio) == (1024, None)


DATASET_DOCSTRINGS = """
import functools
import sys

import grain
import numpy as np

MapDataset = grain.MapDataset
IterDataset = grain.IterDataset
LimitIterDataset = grain.experimental.LimitIterDataset


class AddOne(grain.transforms.Map):  # The docstrings' `AddOne()`.

  def map(self, x):
    return x + 1


results = {}

# MapDataset.source
results["source"] = list(MapDataset.source([1, 2, 3, 4, 5])) == [1, 2, 3, 4, 5]

# MapDataset.mix
ds1 = MapDataset.range(5)
ds2 = MapDataset.range(7, 10)
results["map_mix"] = list(MapDataset.mix([ds1, ds2])) == [0, 7, 1, 8, 2, 9]

# MapDataset.concatenate
ds1 = MapDataset.range(3)
ds2 = MapDataset.range(3, 8)
results["concatenate"] = list(MapDataset.concatenate([ds1, ds2])) == [0, 1, 2, 3, 4, 5, 6, 7]

# MapDataset.apply
ds = grain.MapDataset.range(5)
ds = ds.apply([AddOne(), grain.transforms.Batch(2)])
results["map_apply"] = list(ds)

# MapDataset.batch
ds = MapDataset.range(5)
ds = ds.batch(batch_size=2)
results["map_batch"] = list(ds)

# MapDataset.filter
ds = MapDataset.range(5)
ds = ds.filter(lambda x: x % 2 == 0)
results["map_filter"] = [ds[2] == 2, ds[1] == None, list(ds) == [0, 2, 4]]

# MapDataset.map
ds = MapDataset.range(5)
ds = ds.map(lambda x: x + 10)
results["map_map"] = list(ds) == [10, 11, 12, 13, 14]

# MapDataset.map_with_index
ds = MapDataset.source(["a", "b", "c", "d"])
ds = ds.map_with_index(lambda i, x: x + str(i))
results["map_map_with_index"] = list(ds) == ["a0", "b1", "c2", "d3"]

# MapDataset.shuffle (the docstring leaves the seed out; Grain then needs one,
# so the pipeline-level ds.seed(...) it recommends is added)
ds = MapDataset.range(5).seed(0).shuffle()
results["map_shuffle"] = [set(ds) == {0, 1, 2, 3, 4}, list(ds)]

# MapDataset.slice
ds = MapDataset.range(5)
results["map_slice"] = [list(ds.slice(slice(1, 3))) == [1, 2], list(ds.slice(slice(1, None, 2))) == [1, 3],
                        list(ds[1::2]) == list(ds.slice(slice(1, None, 2)))]

# MapDataset.random_map (seed added as for shuffle)
ds = MapDataset.range(5).seed(0)
ds = ds.random_map(lambda x, rng: x + rng.integers(5, 10))
results["map_random_map"] = [set(ds).issubset(set(range(5, 15))), list(ds)]

# MapDataset.repeat
results["map_repeat"] = [list(MapDataset.range(5).repeat(2)) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
ds = MapDataset.range(5).repeat()
results["map_repeat"] += [len(ds) == sys.maxsize, ds[11111] == 1]

# IterDataset.mix
ds1 = MapDataset.range(5).to_iter_dataset()
ds2 = MapDataset.range(7, 10).to_iter_dataset()
results["iter_mix"] = list(IterDataset.mix([ds1, ds2])) == [0, 7, 1, 8, 2, 9, 3]

# IterDataset.apply
ds = grain.MapDataset.range(5).to_iter_dataset()
ds = ds.apply([AddOne(), grain.transforms.Batch(2)])
results["iter_apply"] = list(ds)

# IterDataset.batch
ds = MapDataset.range(5).to_iter_dataset()
ds = ds.batch(batch_size=2)
results["iter_batch"] = list(ds)

# IterDataset.filter
ds = MapDataset.range(5).to_iter_dataset()
ds = ds.filter(lambda x: x % 2 == 0)
results["iter_filter"] = list(ds) == [0, 2, 4]

# IterDataset.map
ds = MapDataset.range(5).to_iter_dataset()
ds = ds.map(lambda x: x + 10)
results["iter_map"] = list(ds) == [10, 11, 12, 13, 14]

# IterDataset.random_map (seed added: Grain needs one)
ds = MapDataset.range(5).seed(0).to_iter_dataset()
ds = ds.random_map(lambda x, rng: x + rng.integers(5, 10))
results["iter_random_map"] = [set(ds).issubset(set(range(5, 15))), list(ds)]

# IterDataset.map_with_index (its docstring calls .map with a two-argument
# lambda; the method it documents is map_with_index)
ds = MapDataset.range(5).to_iter_dataset()
ds = ds.map_with_index(lambda i, x: (i, 2**x))
results["iter_map_with_index"] = list(ds) == [(0, 1), (1, 2), (2, 4), (3, 8), (4, 16)]

# transformations/batch.py: batch_and_pad
ds = grain.MapDataset.range(1, 5)
batch_size = 3
batch_fn = functools.partial(
    grain.experimental.batch_and_pad, batch_size=batch_size)
ds = ds.batch(batch_size, batch_fn=batch_fn)
results["batch_and_pad"] = list(ds)

# transformations/limit.py: LimitIterDataset (the docstring's closing parenthesis restored)
results["limit"] = list(LimitIterDataset(MapDataset.range(5).to_iter_dataset(), 2)) == [0, 1]
"""

EXPECTED_ARRAYS = {
    "map_apply": [[1, 2], [3, 4], [5]],
    "map_batch": [[0, 1], [2, 3], [4]],
    "iter_apply": [[1, 2], [3, 4], [5]],
    "iter_batch": [[0, 1], [2, 3], [4]],
    "batch_and_pad": [[1, 2, 3], [4, 0, 0]],
}


def test_dataset_method_docstrings():
  g, l = porting.run_both(DATASET_DOCSTRINGS)
  assert plain(l.results) == plain(g.results)
  for name, value in plain(g.results).items():
    if name in EXPECTED_ARRAYS:
      assert value == EXPECTED_ARRAYS[name], name
    elif isinstance(value, list):
      assert all(v is True for v in value if isinstance(v, bool)), name
    else:
      assert value is True, name
  assert sorted(plain(g.results)["map_shuffle"][1]) == list(range(5))


# MapDataset.seed and IterDataset.seed docstrings, Examples 1-5 of each. Their
# `ds`, `...`, `transform` and seeds are filled in with small concrete values;
# the streams (derived seeds included) must be Grain's. Example 5's
# `ds.source(...)` is `MapDataset.source(...)`: Grain defines `source` on
# MapDataset's metaclass, so a dataset instance has no `source` attribute.
SEED_DOCSTRINGS = """
import grain
import numpy as np

MapDataset = grain.MapDataset
IterDataset = grain.IterDataset


def transform(x, rng):
  return (x, int(rng.integers(1_000_000)))


def noise(x, rng):
  return x * 1000 + int(rng.integers(1000))


seed, seed1, seed2 = 7, 11, 13
results = {}

# MapDataset.seed
ds = MapDataset.range(10)
ds = ds.seed(seed).shuffle()
results["map_1"] = list(ds)

ds = MapDataset.range(10)
ds = ds.seed(seed).shuffle().random_map(noise)
results["map_2"] = list(ds)

ds = MapDataset.range(10)
ds = ds.seed(seed).random_map(transform, seed=seed1)
results["map_3"] = [list(ds), list(MapDataset.range(10).random_map(transform, seed=seed1))]

ds = MapDataset.range(10)
ds = ds.seed(seed1).shuffle().seed(seed2).random_map(noise)
results["map_4"] = list(ds)

ds = MapDataset.range(10)
ds1 = MapDataset.source(list(range(5))).seed(seed1).shuffle()
ds2 = MapDataset.source(list(range(100, 105))).seed(seed2).shuffle()
ds = MapDataset.mix([ds1, ds2], [0.5, 0.5]).random_map(noise)
results["map_5"] = list(ds)

# IterDataset.seed
ds = MapDataset.range(10).to_iter_dataset()
ds = ds.seed(seed).random_map(noise)
results["iter_1"] = list(ds)

ds = MapDataset.range(10).to_iter_dataset()
ds = ds.seed(seed).random_map(noise).random_map(transform)
results["iter_2"] = list(ds)

ds = MapDataset.range(10).to_iter_dataset()
ds = ds.seed(seed).random_map(transform, seed=seed1)
results["iter_3"] = [list(ds), list(MapDataset.range(10).to_iter_dataset().random_map(transform, seed=seed1))]

ds = MapDataset.range(10).to_iter_dataset()
ds = ds.seed(seed1).random_map(noise).seed(seed2).random_map(transform)
results["iter_4"] = list(ds)

ds = MapDataset.range(10)
ds1 = MapDataset.source(list(range(5))).seed(seed2).shuffle().to_iter_dataset()
ds2 = MapDataset.source(list(range(100, 105))).seed(seed2).shuffle().to_iter_dataset()
ds = IterDataset.mix([ds1, ds2], [0.5, 0.5]).random_map(noise)
results["iter_5"] = list(ds)
"""


def test_seed_docstrings():
  g, l = porting.run_both(SEED_DOCSTRINGS)
  assert plain(l.results) == plain(g.results)
  r = plain(g.results)
  assert sorted(r["map_1"]) == list(range(10)) and r["map_1"] != list(range(10))
  assert r["map_3"][0] == r["map_3"][1]  # seed1 wins over the pipeline seed.
  assert r["iter_3"][0] == r["iter_3"][1]


# WithOptionsIterDataset's docstring: options set twice merge, the later value
# winning (warn 0.7, raise 0.8). Its `ds.filter(...)` are filled with filters
# dropping a given share of a longer range, to observe the merged raise threshold.
WITH_OPTIONS = """
import grain

MapDataset = grain.MapDataset
WithOptionsIterDataset = grain.experimental.WithOptionsIterDataset
DatasetOptions = grain.experimental.DatasetOptions


def pipeline(dropped_per_20):
  ds = MapDataset.range(4000).to_iter_dataset()
  ds = WithOptionsIterDataset(
        ds,
        DatasetOptions(
            filter_warn_threshold_ratio=0.6,
            filter_raise_threshold_ratio=0.8,
        ),
      )
  ds = ds.filter(lambda x: True)
  ds = WithOptionsIterDataset(
        ds,
        DatasetOptions(filter_warn_threshold_ratio=0.7),
      )
  ds = ds.filter(lambda x: x % 20 >= dropped_per_20)
  return ds


results = {}
for dropped in (15, 17):  # 75 % (under the raise threshold), 85 % (over it)
  try:
    results[dropped] = len(list(pipeline(dropped)))
  except ValueError as e:
    results[dropped] = ("ValueError", "filter_raise_threshold_ratio" in str(e))
"""


def test_with_options_docstring():
  g, l = porting.run_both(WITH_OPTIONS)
  assert g.results == {15: 1000, 17: ("ValueError", True)}
  assert l.results == g.results


INTERLEAVE_MP = """
import json
import os

import grain
import numpy as np


def make_source(filename: str) -> grain.IterDataset:
  with open(filename) as f:
    lines = [int(line) for line in f]
  return grain.MapDataset.source(lines).to_iter_dataset()


def main(num_workers):
  filenames = []
  for i in range(6):
    filenames.append(f"part-{i}.txt")
    with open(filenames[-1], "w") as f:
      f.write("\\n".join(str(i * 100 + j) for j in range(5)))
  ds = grain.MapDataset.source(filenames).shuffle(seed=42).map(make_source)
  ds = grain.experimental.InterleaveIterDataset(ds, cycle_length=4)
  ds = ds.map(lambda x: x * 2)
  ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  out = []
  for element in ds:
    out.append(int(element))
  return out


if __name__ == "__main__":
  # Added, as a script run with absl's app.run would have: Grain's worker
  # processes read its absl flags.
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  print(json.dumps([main(2), main(0)]))
"""


def test_interleave_docstring_with_mp_prefetch(tmp_path):
  (tmp_path / "grain").mkdir()
  (tmp_path / "loader").mkdir()
  g_workers, g_inline = porting.run_script(INTERLEAVE_MP, "grain", tmp_path / "grain")
  l_workers, l_inline = porting.run_script(INTERLEAVE_MP, "loader", tmp_path / "loader")
  assert sorted(g_workers) == sorted(2 * (i * 100 + j) for i in range(6) for j in range(5))
  assert l_inline == g_inline
  # README, Grain differences, "`set_slice` is not called": Grain's workers each
  # interleave their own slice of the files (its order changes with the worker
  # count); loader's stream is the one with 0 workers, the same records.
  assert l_workers == g_inline
  assert sorted(l_workers) == sorted(g_workers)


# ---- docs/tutorials/data_sources/{bagz_data_source,load_from_gcs,load_from_s3}_tutorial.md

# bagz_data_source_tutorial.md's Grain cells. bagz is not installed here (nor
# needed by Grain): `bagz.Writer` / `bagz.Reader` are stood in for by a small
# local module with their access protocol (a context-managed writer of
# strings; a reader with len, int and slice indexing returning bytes). The
# Beam cell (bagzio) is left out: it writes a file the Grain cells never read.
# Prints are kept in variables.
BAGZ_TUTORIAL = """
import grain
import numpy as np
import pathlib
import random
import types


class _Writer:  # bagz.Writer stand-in: one record per line.
  def __init__(self, file):
    self._f = open(file, "w")
  def __enter__(self):
    return self
  def __exit__(self, *exc):
    self._f.close()
  def write(self, rec):
    self._f.write(rec + "\\n")


class _Reader:  # bagz.Reader stand-in.
  def __init__(self, file, records=None):
    self._records = records if records is not None else [
        line.encode() for line in pathlib.Path(file).read_text().splitlines()]
  def __len__(self):
    return len(self._records)
  def __getitem__(self, index):
    if isinstance(index, slice):
      return _Reader(None, self._records[index])
    return self._records[index]
  def __iter__(self):
    return iter(self._records)


bagz = types.SimpleNamespace(Writer=_Writer, Reader=_Reader)

random.seed(42)

records = list(f"Record: {random.randint(100, 1000)}" for _ in range(40))

file = pathlib.Path(directory) / "data.bagz"

with bagz.Writer(file) as writer:
    for rec in records:
        writer.write(rec)

reader = bagz.Reader(file)

printed = [len(reader), reader[10], list(reader[5:15])]

dataset = (
    grain.MapDataset.source(reader)
    .shuffle(seed=42)
    .map(lambda x: x.decode())  # move from bytes to strings
    .filter(lambda x: x[-1] != "6")  # let's filter out some files
    .map(lambda x: x.upper())  # and capitalize them
    .to_iter_dataset()
)

filtered_out = f"Filtered out: {len(reader) - len(list(dataset))} records."

out = list(dataset)
"""


def test_bagz_data_source_tutorial(tmp_path):
  g, l = porting.run_both(BAGZ_TUTORIAL, directory=str(tmp_path))
  assert (l.printed, l.filtered_out, l.out) == (g.printed, g.filtered_out, g.out)
  assert g.printed[0] == 40 and len(g.printed[2]) == 10
  kept = [r.upper() for r in g.records if r[-1] != "6"]
  assert sorted(g.out) == sorted(kept) and g.out != kept
  assert g.filtered_out == f"Filtered out: {40 - len(kept)} records."


# load_from_s3_tutorial.md's Python cells (the mount / install cells are shell
# commands), with the mounted bucket's "/path/to/mount/files" a local folder;
# pprint's output kept in a string.
S3_TUTORIAL = """
from array_record.python import array_record_module

digits = [b"1", b"2", b"3", b"4", b"5"]

writer = array_record_module.ArrayRecordWriter(mount + "/data.array_record")
for i in digits:
  writer.write(i)
writer.close()

import grain
from pprint import pprint

source =  grain.sources.ArrayRecordDataSource(paths=mount + "/data.array_record")

dataset = (
    grain.MapDataset.source(source)
    .shuffle(seed=10)  # Shuffles globally.
    .batch(batch_size=2)  # Batches consecutive elements.
)

printed = list(dataset)
"""

# load_from_gcs_tutorial.md's Grain cells, reading the ArrayRecord file the S3
# cell writes through a local folder in place of the gcsfuse mount.
GCS_TUTORIAL = """
import grain

source = grain.sources.ArrayRecordDataSource(local_path+"/local_file_name")

# Create a dataset from the data source then process the data.
dataset = (
    grain.MapDataset.source(source)
    .shuffle(seed=10)  # Shuffles globally.
    .batch(batch_size=2)  # Batches consecutive elements.
)

# Output a record at a random index
printed = dataset[10]
"""

# MapDataset.source's docstring example, over the file the S3 cell wrote.
SOURCE_DOCSTRING = """
import grain

MapDataset = grain.MapDataset
ArrayRecordDataSource = grain.sources.ArrayRecordDataSource

ds = MapDataset.source(ArrayRecordDataSource(paths))
records = list(ds)
"""


def test_load_from_s3_and_gcs_tutorials(tmp_path):
  g, l = porting.run_both(S3_TUTORIAL, mount=str(tmp_path))
  # README: a batch of bytes is a numpy object array in loader, `S` in Grain.
  assert plain(l.printed) == plain(g.printed)
  assert [len(b) for b in g.printed] == [2, 2, 1]
  assert sorted(sum(plain(g.printed), [])) == [b"1", b"2", b"3", b"4", b"5"]

  g, l = porting.run_both(SOURCE_DOCSTRING, paths=[str(tmp_path / "data.array_record")])
  assert l.records == g.records == [b"1", b"2", b"3", b"4", b"5"]

  local_path = tmp_path / "mnt" / "gs" / "my-bucket"
  local_path.mkdir(parents=True)
  (tmp_path / "data.array_record").rename(local_path / "local_file_name")
  g, l = porting.run_both(GCS_TUTORIAL, local_path=str(local_path))
  assert plain(l.printed) == plain(g.printed)
  assert len(g.printed) == 2  # dataset[10]: batch 10 of the repeating, reshuffled epochs.
