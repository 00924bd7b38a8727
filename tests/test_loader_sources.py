"""loader.sources against Grain 0.2.18's data sources on the same inputs."""

from __future__ import annotations

import dataclasses
import pathlib
import pickle

import numpy as np
import pytest

import loader
import loader.python
from loader import sources
from loader_testing import record_bytes
from loader_testing import write_array_records

grain = pytest.importorskip("grain")


@dataclasses.dataclass
class FileInstruction:
  """TFDS's file instruction shape (array_record's FileInstruction protocol)."""
  filename: str
  skip: int
  take: int
  examples_in_shard: int


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("sources"), 3, [5, 7, 4])


def _assert_same_source(ours, theirs, keys=None):
  assert len(ours) == len(theirs)
  n = len(theirs)
  assert [ours[i] for i in range(n)] == [theirs[i] for i in range(n)]
  keys = list(np.random.default_rng(0).integers(0, n, size=3 * n)) if keys is None else keys
  assert list(ours.__getitems__(keys)) == list(theirs.__getitems__(keys))


def _path_forms(files):
  return {
      "one str": files[1],
      "one pathlib.Path": pathlib.Path(files[1]),
      "list of str": files,
      "list of Path, repeated": [pathlib.Path(files[2]), pathlib.Path(files[0]), pathlib.Path(files[2])],
      "file instructions": [FileInstruction(files[0], 1, 3, 5), FileInstruction(files[1], 0, 7, 7),
                            FileInstruction(files[2], 4, 0, 4), FileInstruction(files[1], 6, 1, 7)],
      "one file instruction": FileInstruction(files[1], 2, 4, 7),
      "range strings and plain paths": [f"{files[1]}[2:6]", files[0], f"{files[2]}[0:4]"],
  }


@pytest.mark.parametrize("form", list(_path_forms(["a", "b", "c"])))
def test_array_record_data_source_reads_what_grain_reads(files, form):
  paths = _path_forms(files)[form]
  ours = sources.ArrayRecordDataSource(paths)
  theirs = grain.sources.ArrayRecordDataSource(paths)
  _assert_same_source(ours, theirs)
  assert ours.paths == list(theirs.paths)
  assert list(ours) == list(theirs)  # Grain defines __iter__.


@pytest.mark.parametrize("reader_options", [None, {}, {"index_storage_option": "in_memory"},
                                            {"max_parallelism": "2"}])
def test_reader_options_dict_as_in_grain(files, reader_options):
  ours = sources.ArrayRecordDataSource(files, reader_options)
  theirs = grain.sources.ArrayRecordDataSource(files, reader_options)
  _assert_same_source(ours, theirs)


def test_reader_options_string_keeps_loader_defaults_unless_overridden():
  assert sources.reader_options_string(None) == "readahead_buffer_size:0,max_parallelism:0"
  assert (sources.reader_options_string({"index_storage_option": "in_memory", "max_parallelism": 4})
          == "readahead_buffer_size:0,max_parallelism:4,index_storage_option:in_memory")
  with pytest.raises(TypeError, match=r"reader_options must be a dict .*got \['x'\]"):
    sources.reader_options_string(["x"])


def test_array_record_data_source_is_a_batched_array_record_source(files):
  # Our pipelines read it with one batched read per file, like ArrayRecordSource.
  paths = [FileInstruction(files[0], 1, 3, 5), FileInstruction(files[2], 0, 2, 4)]
  ours = sources.ArrayRecordDataSource(paths)
  assert isinstance(ours, loader.ArrayRecordSource)
  assert isinstance(ours, loader.sources.RandomAccessDataSource)
  assert ours.read([4, 0, -1]) == [record_bytes(13), record_bytes(1), record_bytes(13)]
  assert ours.read(np.array([], dtype=np.int64)) == []
  ds = loader.MapDataset.source(ours).shuffle(seed=3)
  gds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths)).shuffle(seed=3)
  assert sorted(ds) == sorted(gds) == sorted(record_bytes(i) for i in [1, 2, 3, 12, 13])


def test_array_record_data_source_pickles_and_feeds_workers(files):
  paths = [FileInstruction(files[1], 2, 4, 7), files[0]]
  ours = sources.ArrayRecordDataSource(paths, {"index_storage_option": "in_memory"})
  ours[0]  # Opens a reader, which must not travel with the pickle.
  copy = pickle.loads(pickle.dumps(ours))
  _assert_same_source(copy, grain.sources.ArrayRecordDataSource(paths))
  ds = loader.MapDataset.source(ours).to_iter_dataset().mp_prefetch(
      loader.multiprocessing.MultiprocessingOptions(num_workers=1))
  assert list(ds) == [ours[i] for i in range(len(ours))]


def test_array_record_data_source_errors(files):
  for bad in ([], ()):
    with pytest.raises(ValueError):
      grain.sources.ArrayRecordDataSource(bad)
    with pytest.raises(ValueError, match="at least one path"):
      sources.ArrayRecordDataSource(bad)
  with pytest.raises(ValueError):
    grain.sources.ArrayRecordDataSource([files[0], 3])
  with pytest.raises(ValueError, match="Each path must be a str.*got int: 3"):
    sources.ArrayRecordDataSource([files[0], 3])
  with pytest.raises(ValueError, match=r"Record range \[2:9\) of .* is outside its 5 records"):
    sources.ArrayRecordDataSource([FileInstruction(files[0], 2, 7, 5)])
  directory = str(pathlib.Path(files[0]).parent)
  with pytest.raises(FileNotFoundError, match="every path must name one ArrayRecord file"):
    sources.ArrayRecordDataSource([directory, f"{files[0]}[0:1]"])
  # Keys out of [0, len), negative ones too, are a ValueError as in Grain (and an IndexError).
  src = sources.ArrayRecordDataSource([FileInstruction(files[0], 1, 3, 5)])
  theirs = grain.sources.ArrayRecordDataSource([FileInstruction(files[0], 1, 3, 5)])
  for key in (3, -1):
    with pytest.raises(ValueError, match=r"Record key should be in \[0, num_records\)"):
      theirs[key]  # pylint: disable=pointless-statement
    with pytest.raises(ValueError, match=rf"Record key should be in \[0, num_records\): got {key} for a source of 3"):
      src[key]  # pylint: disable=pointless-statement
  with pytest.raises(IndexError):
    src[3]  # pylint: disable=pointless-statement
  with pytest.raises(IndexError, match="Record index -4 out of range"):
    src.read([0, -4])


def test_plain_paths_also_take_directories_and_globs(files):
  # Beyond Grain: without ranges, paths resolve like ArrayRecordSource's.
  directory = pathlib.Path(files[0]).parent
  assert len(sources.ArrayRecordDataSource(directory)) == 16
  assert len(sources.ArrayRecordDataSource(str(directory / "data-0000[02]-*"))) == 9


@pytest.mark.parametrize("args", [(0, 10, 1), (3, 20, 4), (10, 0, -3), (5, 5, 1), (-4, 4, 3), (0, 1, 7)])
def test_range_data_source_matches_grain(args):
  ours, theirs = sources.RangeDataSource(*args), grain.sources.RangeDataSource(*args)
  assert len(ours) == len(theirs)
  assert [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]
  assert repr(ours) == repr(theirs)
  assert pickle.loads(pickle.dumps(ours)).__getitems__(range(len(ours))) == [theirs[i] for i in range(len(theirs))]
  assert list(loader.MapDataset.source(ours)) == list(grain.MapDataset.source(theirs))
  with pytest.raises(IndexError):
    theirs[len(theirs)]  # pylint: disable=pointless-statement
  with pytest.raises(IndexError, match="out of range"):
    ours[len(ours)]  # pylint: disable=pointless-statement


def test_range_data_source_errors():
  with pytest.raises(AssertionError):
    grain.sources.RangeDataSource(5, 0, 1)
  with pytest.raises(ValueError, match="negative length"):
    sources.RangeDataSource(5, 0, 1)
  with pytest.raises(ValueError, match="step must not be 0"):
    sources.RangeDataSource(0, 5, 0)
  with pytest.raises(ValueError, match=r"stop must be an integer \(got stop=2.5\)"):
    sources.RangeDataSource(0, 2.5, 1)
  # As Grain: no negative indices.
  for source in (sources.RangeDataSource(0, 10, 2), grain.sources.RangeDataSource(0, 10, 2)):
    with pytest.raises(IndexError, match="Index -1 out of range for 5"):
      source[-1]  # pylint: disable=pointless-statement


# Grain's SharedMemoryDataSource.__del__ fails on an instance whose __init__
# raised (its `del self.shm`); that is Grain's, not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_shared_memory_data_source_matches_grain():
  elements = [1, "two", b"three", 4.5, None, True, -7]
  ours, theirs = sources.SharedMemoryDataSource(elements), grain.sources.SharedMemoryDataSource(elements)
  try:
    assert len(ours) == len(theirs)
    assert list(ours) == list(theirs) == elements
    assert str(ours) == f"InMemoryDataSource(name={ours.shm.name}, len=7)"
    # Pickling sends the segment's name: the copy attaches to the same memory.
    copy = pickle.loads(pickle.dumps(ours))
    assert copy.shm.name == ours.shm.name and list(copy) == elements
    ours[0] = 10
    assert copy[0] == 10
    copy.close()
    attached = sources.SharedMemoryDataSource(name=ours.shm.name)
    assert list(attached) == [10, *elements[1:]]
    attached.close()
  finally:
    for s in (ours, theirs):
      s.close()
      s.unlink()
  with pytest.raises(ValueError):
    grain.sources.SharedMemoryDataSource()
  with pytest.raises(ValueError, match="needs elements .* or name"):
    sources.SharedMemoryDataSource()


def test_in_memory_data_source_in_a_worker_pipeline():
  assert loader.python.InMemoryDataSource is sources.SharedMemoryDataSource
  src = loader.python.InMemoryDataSource([f"e{i}" for i in range(12)])
  try:
    ds = (loader.MapDataset.source(src).map(str.upper).to_iter_dataset()
          .mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
    assert list(ds) == [f"E{i}" for i in range(12)]
  finally:
    src.close()
    src.unlink()


def test_random_access_data_source_protocol():
  assert sources.RandomAccessDataSource is loader.RandomAccessDataSource
  for src in (sources.RangeDataSource(0, 3, 1), [1, 2], grain.sources.RangeDataSource(0, 3, 1)):
    assert isinstance(src, sources.RandomAccessDataSource)
  assert not isinstance(3, sources.RandomAccessDataSource)
