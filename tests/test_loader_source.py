"""ArrayRecordSource: path resolution, batched reads, pickling, errors."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import loader
from loader import source as source_lib
from loader_testing import record_bytes
from loader_testing import take_with_errors
from loader_testing import record_index
from loader_testing import write_array_records

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("src"), 3, [5, 7, 4])


def test_len_getitem_and_read_order(files):
  src = loader.ArrayRecordSource(files)
  assert len(src) == 16
  assert src.records_per_file == [5, 7, 4]
  assert [record_index(src[i]) for i in range(16)] == list(range(16))
  assert record_index(src[-1]) == 15
  wanted = [15, 0, 7, 7, 3, 12, 5]
  assert [record_index(r) for r in src.read(wanted)] == wanted
  assert src.read(np.array([4, 5], dtype=np.int32)) == [record_bytes(4), record_bytes(5)]
  assert src.read([]) == []


def test_read_issues_one_batched_call_per_file(files, monkeypatch):
  src = loader.ArrayRecordSource(files)
  calls = []
  real = source_lib.ArrayRecordSource._reader

  class Spy:

    def __init__(self, reader, i):
      self._reader, self._i = reader, i

    def read(self, keys):
      calls.append((self._i, list(keys)))
      return self._reader.read(keys)

  monkeypatch.setattr(source_lib.ArrayRecordSource, "_reader",
                      lambda self, i, span=False: Spy(real(self, i, span), i))
  wanted = [0, 6, 13, 1, 7, 14, 2, 13, -16]
  out = src.read(wanted)
  assert [record_index(r) for r in out] == [0, 6, 13, 1, 7, 14, 2, 13, 0]
  # Each file is read once, in ascending record order (faster than shuffled), repeats kept.
  assert sorted(calls) == [(0, [0, 0, 1, 2]), (1, [1, 2]), (2, [1, 1, 2])]
  calls.clear()
  with source_lib.parallel_reads(2):
    assert [record_index(r) for r in src.read(wanted)] == [0, 6, 13, 1, 7, 14, 2, 13, 0]
  assert sorted(calls) == [(0, [0, 0, 1, 2]), (1, [1, 2]), (2, [1, 1, 2])]


def test_dense_reads_take_one_span_of_the_file_and_sparse_ones_do_not(tmp_path, monkeypatch):
  path, = write_array_records(tmp_path, 1, 400, record_size=1000)
  src = loader.ArrayRecordSource(path)
  spans = []
  real = source_lib.ArrayRecordSource._reader
  monkeypatch.setattr(source_lib.ArrayRecordSource, "_reader",
                      lambda self, i, span=False: spans.append(span) or real(self, i, span))
  dense = [30, 12, 12, 25, 10, 19, 30, 11, 28, 14]  # 10 of 21 records: read as one span.
  assert [record_index(r) for r in src.read(dense)] == dense
  assert src.read(dense) == [record_bytes(i, 1000) for i in dense]
  sparse = [399, 0, 200]  # 3 of 400 records: one read per record.
  assert [record_index(r) for r in src.read(sparse)] == sparse
  assert spans == [True, True, False]
  everything = np.random.default_rng(0).permutation(400)
  with source_lib.parallel_reads(2):
    assert src.read(everything) == [record_bytes(int(i), 1000) for i in everything]


def test_glob_directory_and_manifest_order(tmp_path):
  paths = write_array_records(tmp_path / "d", 3, 2)
  assert loader.ArrayRecordSource(str(tmp_path / "d")).paths == paths
  assert loader.ArrayRecordSource(str(tmp_path / "d" / "*.array_record")).paths == paths
  # A manifest defines the order, and may name outputs by a path elsewhere
  # (e.g. gs://) whose file name sits next to it.
  manifest = {"shards": [{"output": "gs://bucket/x/" + os.path.basename(paths[2]), "records": 2},
                         {"output": os.path.basename(paths[0]), "records": 2},
                         {"output": paths[1], "records": 2}]}
  (tmp_path / "d" / "manifest.json").write_text(json.dumps(manifest))
  src = loader.ArrayRecordSource(tmp_path / "d")
  assert src.paths == [paths[2], paths[0], paths[1]]
  assert [record_index(r) for r in src.read(range(6))] == [4, 5, 0, 1, 2, 3]


def test_manifest_count_mismatch_is_reported(tmp_path):
  paths = write_array_records(tmp_path, 2, 3)
  manifest = {"shards": [{"output": os.path.basename(p), "records": 4} for p in paths]}
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"has 3 records but its manifest says 4"):
    loader.ArrayRecordSource(tmp_path)


def test_manifest_with_failed_shards_is_rejected(tmp_path):
  write_array_records(tmp_path, 1, 3)
  manifest = {"shards": [{"output": "a.array_record", "records": None, "status": "failed"}]}
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match="failed"):
    loader.ArrayRecordSource(tmp_path)


def test_missing_paths_name_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.array_record"):
    loader.ArrayRecordSource(str(tmp_path / "nope.array_record"))
  with pytest.raises(FileNotFoundError, match=r"No files match the pattern .*zz-\*"):
    loader.ArrayRecordSource(str(tmp_path / "zz-*"))
  with pytest.raises(FileNotFoundError, match="neither a manifest.json nor any"):
    loader.ArrayRecordSource(tmp_path)
  with pytest.raises(ValueError, match="empty list"):
    loader.ArrayRecordSource([])
  with pytest.raises(TypeError, match="paths must be"):
    loader.ArrayRecordSource(3)


def test_a_literal_name_with_glob_characters_is_that_file(tmp_path):
  """`o[1]/x` and `part[1]` name files, as Grain reads them, not patterns (which would match part1)."""
  weird = tmp_path / "o[1]"
  write_array_records(weird, 1, 3, prefix="part[1]")
  write_array_records(weird, 1, 5, prefix="part1")
  (path,) = [str(p) for p in weird.iterdir() if p.name.startswith("part[1]")]
  assert len(loader.ArrayRecordSource(path)) == 3
  assert len(loader.ArrayRecordSource([path])) == 3
  # A pattern still globs (escaped where the folder's name has [ ]).
  import glob  # pylint: disable=g-import-not-at-top
  assert len(loader.ArrayRecordSource(os.path.join(glob.escape(str(weird)), "part*"))) == 8


def test_running_out_of_file_descriptors_says_so(tmp_path):
  write_array_records(tmp_path, 40, 2)
  code = (
      "import resource, loader\n"
      "resource.setrlimit(resource.RLIMIT_NOFILE, (30, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
      f"src = loader.ArrayRecordSource({str(tmp_path)!r})\n"
      "loader.MapDataset.source(src)[0:80:1]._getitems(list(range(80)))\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 1, proc.stderr
  assert last.startswith("loader.source.TooManyOpenFilesError: [Errno 24] ") and "open-file limit (now 30" in last, last
  assert "ulimit -n" in last and "not an ArrayRecord file" not in last


def _write_tfrecord(path):
  import crc32c  # pylint: disable=g-import-not-at-top

  def masked(b):
    c = crc32c.crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

  with open(path, "wb") as f:
    for _ in range(3):
      data = b"x" * 50
      header = struct.pack("<Q", len(data))
      f.write(header + struct.pack("<I", masked(header)) + data + struct.pack("<I", masked(data)))


def test_non_array_record_files_say_what_they_are(tmp_path):
  tfr = tmp_path / "train.array_record"
  _write_tfrecord(tfr)
  with pytest.raises(ValueError, match=r"train.array_record is not an ArrayRecord file: it is a TFRecord file"):
    loader.ArrayRecordSource(str(tfr))
  empty = tmp_path / "empty.array_record"
  empty.write_bytes(b"")
  with pytest.raises(ValueError, match="empty.array_record is not an ArrayRecord file: it is empty"):
    loader.ArrayRecordSource(str(empty))
  # A partial copy: the right header, no footer.
  whole = open(write_array_records(tmp_path / "w", 1, 300)[0], "rb").read()
  cut = tmp_path / "cut.array_record"
  cut.write_bytes(whole[:len(whole) // 2])
  with pytest.raises(ValueError, match=r"cut.array_record cannot be read as an ArrayRecord file: it starts like "
                                       r"one but its end cannot be read \(\d+ bytes\): probably truncated"):
    loader.ArrayRecordSource(str(cut))


def test_group_size_warning_names_file_and_fix(tmp_path):
  paths = write_array_records(tmp_path, 1, 10, group_size=4)
  with pytest.warns(UserWarning, match=r"group_size:4.*'group_size:1'") as rec:
    src = loader.ArrayRecordSource(paths)
  assert paths[0] in str(rec[0].message)
  assert len(src) == 10
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    loader.ArrayRecordSource(write_array_records(tmp_path / "g1", 1, 10))


def test_index_errors_show_index_and_length(files):
  src = loader.ArrayRecordSource(files)
  with pytest.raises(IndexError, match="index 16 out of range for a source of 16 records"):
    src[16]
  with pytest.raises(IndexError, match="index -17 out of range"):
    src.read([0, -17])


def test_pickle_drops_readers_and_reads_in_new_process(files):
  src = loader.ArrayRecordSource(files)
  src.read([0, 10])
  assert any(r is not None for r in src._readers)
  data = pickle.dumps(src)
  clone = pickle.loads(data)
  assert all(r is None for r in clone._readers)
  assert clone.read([3, 11]) == src.read([3, 11])
  code = ("import pickle, sys; src = pickle.loads(sys.stdin.buffer.read()); "
          "sys.stdout.buffer.write(b''.join(src.read([15, 0])))")
  out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True,
                       env={**os.environ, "PYTHONPATH": _ROOT}, timeout=60).stdout
  assert out == record_bytes(15) + record_bytes(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reopens_readers(files):
  src = loader.ArrayRecordSource(files)
  src.read([1])
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:  # Child: must not reuse the parent's reader objects.
    try:
      os.write(w, b"ok" if record_index(src.read([12])[0]) == 12 and src._pid == os.getpid() else b"no")
    finally:
      os._exit(0)
  os.close(w)
  _, status = os.waitpid(pid, 0)
  assert os.read(r, 2) == b"ok" and status == 0
  os.close(r)


def test_concurrent_reads_from_threads(files):
  src = loader.ArrayRecordSource(files)
  errors = []

  def work(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
      idx = rng.integers(0, len(src), 32)
      if [record_index(r) for r in src.read(idx)] != idx.tolist():
        errors.append(seed)

  threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors


def test_batched_source_adapts_foreign_sources():

  class OnlyGetitem:

    def __len__(self):
      return 5

    def __getitem__(self, i):
      return i * 10

  class WithGrainsGetitems(OnlyGetitem):
    calls = 0

    def _getitems(self, keys):  # Grain's batched-read protocol: index-by-index elements, promised.
      WithGrainsGetitems.calls += 1
      return [k * 10 for k in keys]

  class WithGetitems(OnlyGetitem):

    def __getitems__(self, keys):  # A batch-level transform (as a Hugging Face dataset's): not per index.
      return [k * 10 + len(keys) for k in keys]

  assert source_lib.BatchedSource(OnlyGetitem()).read(np.array([4, 0])) == [40, 0]
  assert source_lib.BatchedSource(WithGrainsGetitems()).read(np.array([1, 2, 3])) == [10, 20, 30]
  assert WithGrainsGetitems.calls == 1
  # As Grain 0.2.18: a user source's __getitems__ is never used; elements are read by index.
  assert source_lib.BatchedSource(WithGetitems()).read(np.array([1, 2, 3])) == [10, 20, 30]
  with pytest.raises(TypeError, match="__len__ and __getitem__"):
    source_lib.BatchedSource(object())
  assert isinstance(loader.ArrayRecordSource.__new__(loader.ArrayRecordSource), loader.RandomAccessDataSource)


def test_manifest_naming_a_missing_shard_fails_at_construction(tmp_path):
  write_array_records(tmp_path, 1, 3)
  manifest = {"shards": [{"output": "gone-00000-of-00001.array_record", "records": 3}]}
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(FileNotFoundError, match="lists shard 'gone-00000-of-00001.array_record'"):
    loader.ArrayRecordSource(tmp_path)


def test_from_tfds_reads_the_split_shards_in_order(tmp_path):
  d = tmp_path / "toy" / "1.0.0"
  shards = write_array_records(d, 2, [3, 4], prefix="unused")
  names = ["toy-train.array_record-00000-of-00002", "toy-train.array_record-00001-of-00002"]
  for old, new in zip(shards, names):
    os.rename(old, d / new)
  info = {"name": "toy", "version": "1.0.0", "fileFormat": "array_record",
          "splits": [{"name": "train", "shardLengths": ["3", "4"]}]}
  (d / "dataset_info.json").write_text(json.dumps(info))
  src = loader.ArrayRecordSource.from_tfds(d, "train")
  assert [os.path.basename(p) for p in src.paths] == names
  assert [record_index(r) for r in src.read(range(7))] == list(range(7))


def test_directory_whose_manifest_marks_an_unfinished_conversion_is_refused(tmp_path):
  from loader import ondisk
  files = write_array_records(tmp_path, 2, [3, 4])
  dead = subprocess.Popen(["true"])
  dead.wait()
  shards = [{"input": f"/in/{i}", "output": f, "status": "pending", "replaces": None}
            for i, f in enumerate(files)]
  for host, said in ((ondisk.this_process().host, "did not finish"), ("elsewhere", "has not finished")):
    run = {"pid": dead.pid, "host": host, "started": "2026-01-01T00:00:00+00:00", "existing": "overwrite"}
    marker = ondisk.incomplete_manifest(shards, output_dir=str(tmp_path), writer_options="group_size:1", run=run)
    (tmp_path / "manifest.json").write_bytes(ondisk.dump_manifest(marker))
    with pytest.raises(ondisk.IncompleteManifestError) as e:
      loader.ArrayRecordSource(str(tmp_path))
    message = str(e.value)
    assert message.startswith(f"{tmp_path}/manifest.json marks a conversion (an --overwrite run) that {said} "
                              f"(pid {dead.pid} on host {host}, started 2026-01-01T00:00:00+00:00)")
    assert "--skip-existing instead of --overwrite" in message and "\n" not in message


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(version="2"), r"has version '2', expected an int from 1 to 2"),
    (lambda m: m.update(version=3), r"has version 3, newer than this arrayrecord-toolkit reads \(up to 2\); upgrade"),
    (lambda m: m["shards"][0].update(input=5), r"shard 0 \(.*\) has 'input' 5, expected a path"),
    (lambda m: m["shards"].append(dict(m["shards"][0])), r"shards 0 and 2 both name "),
    # The same file under another name: read twice, its records would count twice.
    (lambda m: m["shards"].append({**m["shards"][0], "output": "./" + m["shards"][0]["output"]}),
     r"lists shards '(.+)' and '\./\1', which are the same file .*: its records would be read twice; "),
    (lambda m: m["shards"].append({**m["shards"][1], "output": "/elsewhere/" + m["shards"][1]["output"]}),
     r"lists shards '(.+)' and '/elsewhere/\1', which are the same file "),
])
def test_hand_edited_manifests_are_refused_in_one_line(tmp_path, edit, message):
  write_array_records(tmp_path, 2, 3)
  shards = [{"output": n, "records": 3, "status": "converted", "input": f"in-{n}"}
            for n in sorted(os.listdir(tmp_path))]
  manifest = {"format": "arrayrecord-toolkit/manifest", "version": 2, "shards": shards}
  edit(manifest)
  (tmp_path / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=message):
    loader.ArrayRecordSource(str(tmp_path))


def test_a_source_that_ignores_its_index_is_told_to_stream():
  from loader import source as source_lib

  class Streams:
    def __getitem__(self, index):
      return next(self.it)

  class ByIndex:
    def __getitem__(self, index):
      return self.data[index]

  class ByIndexInAClosure:
    def __getitem__(self, index):
      return (lambda: index)()

  class Varargs:
    def __getitem__(self, *args):
      return 0

  assert source_lib.ignores_index(Streams())
  for other in (ByIndex(), ByIndexInAClosure(), Varargs(), [1, 2], range(3)):
    assert not source_lib.ignores_index(other)


def test_a_streaming_source_that_raises_raises_at_the_same_place_on_the_retry():
  class Stream:
    def __init__(self):
      self._it = iter(range(100))

    def __len__(self):
      return 12

    def __getitem__(self, index):
      j = next(self._it)
      if j % 5 == 2:
        raise IOError(f"stream {j}")
      return j

  it = iter(loader.MapDataset.source(Stream()).to_iter_dataset(loader.ReadOptions(num_threads=0)))
  out = take_with_errors(it, errors=OSError)
  # As Grain's reads one by one: each failed read is an element that raises, the stream goes on after it.
  assert out == [0, 1, "stream 2", 3, 4, 5, 6, "stream 7", 8, 9, 10, 11]


class _CountingStream:
  """Returns its next record whatever the index (as MaxText's HFDataSource)."""

  def __init__(self, n: int):
    self._n, self._next = n, 0

  def __len__(self):
    return self._n

  def __getitem__(self, index):
    self._next += 1
    return {"x": self._next - 1}


def _fails_on_some(d):
  if d["x"] % 37 == 30:
    raise ValueError(f"bad {d['x']}")
  return d["x"]


@pytest.mark.parametrize("num_threads", [1, 2, 4])
def test_a_streaming_source_with_reading_threads_loses_no_record_after_a_map_error(num_threads):
  # Chunks computed ahead (and slices on several threads) read the stream on;
  # after a failed element they would take records the retry needed.
  import grain  # pylint: disable=g-import-not-at-top

  def run(lib, threads):
    ds = lib.MapDataset.source(_CountingStream(400)).to_iter_dataset(
        lib.ReadOptions(num_threads=threads, prefetch_buffer_size=500)).map(_fails_on_some)
    return take_with_errors(iter(ds), errors=ValueError)

  ours = run(loader, num_threads)
  assert ours == [f"bad {x}" if x % 37 == 30 else x for x in range(400)]
  assert ours == run(grain, 1)  # One reading thread: Grain reads the stream in order too.


class _StreamFailingOnItsEighthRead:
  """A stream (ignores the index) whose 8th read fails."""

  def __init__(self):
    self._reads = 0

  def __len__(self):
    return 10

  def __getitem__(self, index):
    self._reads += 1
    if self._reads == 8:
      raise ValueError(f"stream bad {self._reads - 1}")
    return self._reads - 1


def test_a_streaming_sources_error_after_a_map_error_is_raised_as_in_grain():
  # The records (and the read error) the failed chunk read are kept for the
  # retries: the source's error is raised where Grain raises it, not lost.
  import grain  # pylint: disable=g-import-not-at-top

  def map_fails_on_4(x):
    if x == 4:
      raise ValueError("map bad 4")
    return x

  def run(lib):
    ds = lib.MapDataset.source(_StreamFailingOnItsEighthRead()).map(map_fails_on_4).to_iter_dataset(
        lib.ReadOptions(num_threads=1, prefetch_buffer_size=1))
    return take_with_errors(iter(ds), 10, errors=(ValueError, IndexError))

  ours = run(loader)
  assert ours == [0, 1, 2, 3, "map bad 4", 5, 6, "stream bad 7", 8, 9]
  assert run(grain) == ours
