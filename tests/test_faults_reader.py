"""Datasets that move, change or rot under the reader: ArrayRecordSource says which file and record."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

import faults_testing as ft
import loader
from loader import checkpoint
from loader import ondisk
from loader import source as source_lib
from pipelines import convert, verify


def marker(i: int) -> bytes:
  return b"<record %06d>" % i


def write_uncompressed(path: str, first: int, n: int) -> list[bytes]:
  """Records whose bytes can be found in the file (no compression)."""
  from array_record.python.array_record_module import ArrayRecordWriter
  records = [marker(i) * 20 for i in range(first, first + n)]
  w = ArrayRecordWriter(path, "group_size:1,uncompressed")
  for r in records:
    w.write(r)
  w.close()
  return records


@pytest.fixture
def two_files(tmp_path):
  d = tmp_path / "ds"
  d.mkdir()
  a = write_uncompressed(str(d / "a.array_record"), 0, 50)
  b = write_uncompressed(str(d / "b.array_record"), 50, 50)
  return d, a + b


def test_copied_dataset_reads_its_own_files(tmp_path):
  recs = {f"t.tfrecord-{s:05d}-of-00002": [b"A%d-%d" % (s, i) for i in range(5 + s)]
          for s in range(2)}
  for name, r in recs.items():
    ft.write_tfrecords(str(tmp_path / "in" / name), r)
  ds_a, ds_b = tmp_path / "dsA", tmp_path / "dsB"
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", str(ds_a),
                       "--quiet"]) == 0
  shutil.copytree(ds_a, ds_b)  # cp -r dsA dsB
  # Make dsB's data differ from dsA's, so reading the wrong copy shows.
  for name in recs:
    target = ds_b / ft.out_name(name)
    ft_records = [r.replace(b"A", b"B") for r in recs[name]]
    from array_record.python.array_record_module import ArrayRecordWriter
    w = ArrayRecordWriter(str(target), "group_size:1")
    for r in ft_records:
      w.write(r)
    w.close()
  src = loader.ArrayRecordSource(str(ds_b))
  assert all(p.startswith(str(ds_b)) for p in src.paths)
  assert all(r.startswith(b"B") for r in src.read(range(len(src))))

  # A manifest from before relative paths (absolute outputs under its output_dir)
  # is re-based onto the directory it is read from.
  m = json.loads((ds_a / "manifest.json").read_text())
  m["version"] = 1
  for s in m["shards"]:
    s["output"] = str(ds_a / s["output"])
  (ds_b / "manifest.json").write_text(json.dumps(m))
  src = loader.ArrayRecordSource(str(ds_b))
  assert all(p.startswith(str(ds_b)) for p in src.paths)
  assert all(r.startswith(b"B") for r in src.read(range(len(src))))


def test_file_truncated_under_an_open_source_raises_naming_it(two_files):
  d, records = two_files
  src = loader.ArrayRecordSource(str(d))
  assert src.read([0, 99]) == [records[0], records[99]]
  path = str(d / "b.array_record")
  os.truncate(path, os.path.getsize(path) // 2)
  with pytest.raises(source_lib.FileChangedError,
                     match=rf"^{path} changed after the ArrayRecordSource was created \(size ") as e:
    src.read([60])
  # The record being read is named: record 10 of b.array_record, 60 of the source.
  assert (e.value.record_index, e.value.source_index) == (10, 60)
  assert "while reading record 10 (index 60 of the source); " in str(e.value)
  assert src.read([1]) == [records[1]]  # The other file is fine.


def test_file_replaced_under_an_open_source_raises_naming_it(two_files, tmp_path):
  d, records = two_files
  src = loader.ArrayRecordSource(str(d))
  path = str(d / "a.array_record")
  fresh = str(tmp_path / "fresh.array_record")
  write_uncompressed(fresh, 1000, 50)  # Same size and count, other records.
  os.replace(fresh, path)
  with pytest.raises(source_lib.FileChangedError, match="it was replaced by another file"):
    src.read([3])
  # A source created afterwards reads the new file.
  assert loader.ArrayRecordSource(str(d)).read([3]) == [marker(1003) * 20]


def flip_record(path: str, record: int) -> None:
  data = bytearray(open(path, "rb").read())
  at = data.find(marker(record))
  assert at >= 0
  data[at + 3] ^= 0xFF
  with open(path, "wb") as f:
    f.write(data)


def test_flipped_bytes_name_the_file_and_record(two_files):
  d, _ = two_files
  path = str(d / "b.array_record")
  flip_record(path, 50 + 17)  # Record 17 of b, 67 of the source.
  src = loader.ArrayRecordSource(str(d))
  with pytest.raises(source_lib.CorruptRecordError) as e:
    src.read(range(100))
  assert (e.value.path, e.value.record_index, e.value.source_index) == (path, 17, 67)
  assert str(e.value).startswith(f"{path}: record 17 (index 67 of the source) is corrupt: "
                                 "Corrupted Riegeli")
  assert "at byte" in str(e.value)


def test_flipped_bytes_through_mp_prefetch_workers(tmp_path):
  d = tmp_path / "big"
  d.mkdir()
  for f in range(4):
    write_uncompressed(str(d / f"{f}.array_record"), 500 * f, 500)
  path = str(d / "3.array_record")
  flip_record(path, 1990)  # Near the end: computed by the worker, not a first chunk.
  ds = (loader.MapDataset.source(loader.ArrayRecordSource(str(d))).to_iter_dataset()
        .mp_prefetch(loader.MultiprocessingOptions(num_workers=1)))
  with pytest.raises(Exception) as e:
    list(ds)
  chain = [e.value, e.value.__cause__]
  corrupt = [x for x in chain if isinstance(x, source_lib.CorruptRecordError)]
  assert corrupt, f"no CorruptRecordError in {chain!r}"
  assert (corrupt[0].path, corrupt[0].record_index, corrupt[0].source_index) == (path, 490, 1990)
  assert f"{path}: record 490 (index 1990 of the source) is corrupt" in str(e.value)


def test_reader_errors_survive_pickling():
  # What crossing from a worker process to the parent needs.
  for error in (source_lib.CorruptRecordError("/d/x", 3, 103, "Corrupted Riegeli; at byte 9"),
                source_lib.FileChangedError("/d/x", "size 10 -> 5 bytes"),
                source_lib.FileChangedError("/d/x", "size 10 -> 5 bytes", 3, 103)):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.path == "/d/x" and back.record_index == error.record_index


def test_verify_checks_the_copy_it_is_given(tmp_path, capsys):
  ft.write_tfrecords(str(tmp_path / "in" / "x.tfrecord"), [b"1", b"2"])
  ds_a, ds_b = tmp_path / "dsA", tmp_path / "dsB"
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", str(ds_a),
                       "--quiet"]) == 0
  shutil.copytree(ds_a, ds_b)
  (ds_b / "x.array_record").unlink()
  assert verify.main(["--input", str(tmp_path / "in" / "*"), "--output", str(ds_b)]) == 1
  assert f"FAIL {ds_b}/x.array_record" in capsys.readouterr().out


def test_a_directory_a_conversion_left_incomplete_is_refused_not_read_in_part(tmp_path):
  d = tmp_path / "out"
  d.mkdir()
  for i in (0, 1):
    write_uncompressed(str(d / f"train.array_record-{i:05d}-of-00004"), 10 * i, 10)
  write_uncompressed(str(d / "test.array_record-00000-of-00001"), 100, 5)
  with pytest.raises(ValueError) as e:
    loader.ArrayRecordSource(str(d))
  line = str(e.value)
  assert "\n" not in line and "only 2 of the 4 shards of train.array_record-*-of-00004" in line, line
  assert "train.array_record-00002-of-00004, train.array_record-00003-of-00004" in line, line
  # A glob is an explicit choice of files: read as given.
  assert len(loader.ArrayRecordSource(str(d / "*.array_record*"))) == 25
  for i in (2, 3):
    write_uncompressed(str(d / f"train.array_record-{i:05d}-of-00004"), 10 * i, 10)
  assert len(loader.ArrayRecordSource(str(d))) == 45
  # A conversion's lock file without a manifest: being written, or interrupted.
  (d / ".arrayrecord-toolkit.lock").write_text("{}")
  with pytest.raises(ValueError, match="holds a conversion's lock file"):
    loader.ArrayRecordSource(str(d))


def test_saving_a_state_on_a_full_disk_names_the_path_and_keeps_the_old_one(tmp_path):
  it = iter(loader.MapDataset.range(100).shuffle(seed=1).to_iter_dataset().batch(4))
  next(it)
  where = str(tmp_path / "ckpt")
  with ft.tmpfs(where, "8k"):
    path = os.path.join(where, "state.json")
    old = loader.save_state(path, it)
    ft.fill(where)
    next(it)
    with pytest.raises(OSError, match=r"No space left on device: cannot save the iterator state to .*state.json; "
                                      r"the file is unchanged"):
      loader.save_state(path, it)
    assert checkpoint.load_state(path) == old
    assert sorted(os.listdir(where)) == ["filler", "state.json"]  # No temp file left.


def test_a_save_that_fails_removes_the_folders_it_made(tmp_path):
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  where = str(tmp_path / "ckpt")
  with ft.tmpfs(where, "4k"):
    ft.fill(where)
    with pytest.raises(OSError, match=r"cannot save the iterator state to .*a/b/state.json; the file was not "
                                      r"created. Free space there or save elsewhere"):
      loader.save_state(os.path.join(where, "a", "b", "state.json"), it)
    assert os.listdir(where) == ["filler"]  # Neither a/ nor a/b/ stays behind.


def test_a_long_legal_state_file_name_saves_and_its_stale_temps_go(tmp_path):
  name = "é" * 122 + ".json"  # 249 bytes: legal, and longer than any temp name made for it.
  path = str(tmp_path / name)
  child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                         check=True)
  stale = ondisk.temp_name(path, ondisk.Owner(int(child.stdout), 0, ondisk.this_process().host))
  assert len(os.fsencode(os.path.basename(stale))) <= 255
  open(stale, "w").close()
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  loader.save_state(path, it)
  assert os.listdir(tmp_path) == [name]
  assert loader.restore_state(path, iter(loader.MapDataset.range(10).to_iter_dataset()))["next_index"] == 1
  with pytest.raises(OSError, match=r"cannot save the iterator state to .*; the file was not created. A name in "
                                    r"the path is longer than this filesystem allows: choose a shorter one"):
    loader.save_state(str(tmp_path / ("x" * 300)), it)


def test_a_save_killed_midway_leaves_a_temp_the_next_save_removes(tmp_path):
  """kill -9 during save_state leaves its temp file; the next save removes those of dead processes only."""
  path = str(tmp_path / "state.json")
  child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                         check=True)
  dead = ondisk.Owner(int(child.stdout), 0, ondisk.this_process().host)
  stale = ondisk.temp_name(path, dead)
  elsewhere = ondisk.temp_name(path, ondisk.Owner(dead.pid, 0, "another-host"))
  live = ondisk.temp_name(path)  # This process: a save in another thread, say.
  other_file = ondisk.temp_name(str(tmp_path / "other.json"), dead)
  for p in (stale, elsewhere, live, other_file):
    with open(p, "w") as f:
      f.write("{")
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  loader.save_state(path, it)
  assert not os.path.exists(stale)
  assert all(map(os.path.exists, (elsewhere, live, other_file)))
  assert loader.restore_state(path, iter(loader.MapDataset.range(10).to_iter_dataset())) is not None


def test_save_state_replaces_only_its_own_files(tmp_path):
  """A path that holds something else (model weights, a FIFO, a folder) is refused; nothing is lost."""
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  weights = tmp_path / "model.msgpack"
  weights.write_bytes(os.urandom(1000))
  with pytest.raises(FileExistsError, match=r"model.msgpack: it exists and is not a loader state file \(1000 bytes\); "
                                            r"save_state only replaces its own files: remove it or save elsewhere"):
    loader.save_state(str(weights), it)
  assert weights.stat().st_size == 1000
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  with pytest.raises(FileExistsError, match="it exists and is not a regular file"):
    loader.save_state(str(fifo), it)
  with pytest.raises(IsADirectoryError, match=r"it is a folder; give a file path, e.g. .*iterator_state.json"):
    loader.save_state(str(tmp_path) + "/", it)
  assert sorted(os.listdir(tmp_path)) == ["fifo", "model.msgpack"]  # No temp file left.
  # Its own files are replaced: a state saved again, and an empty file.
  path = tmp_path / "state.json"
  loader.save_state(str(path), it)
  next(it)
  loader.save_state(str(path), it)
  assert checkpoint.load_state(str(path))["next_index"] == 2
  empty = tmp_path / "empty.json"
  empty.touch()
  loader.save_state(str(empty), it)
  assert checkpoint.load_state(str(empty))["next_index"] == 2


def test_restore_state_refusals_name_the_state_file(tmp_path):
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  path = str(tmp_path / "state.json")
  loader.save_state(path, it)
  with pytest.raises(ValueError, match=rf"^Cannot restore {path}: .*saved from a different pipeline"):
    loader.restore_state(path, iter(loader.MapDataset.range(12).to_iter_dataset()))
  deep = tmp_path / "deep.json"
  deep.write_text("[" * 100_000)  # json.loads would raise RecursionError.
  with pytest.raises(ValueError, match=r"deep.json is not a loader state file \(JSON nested too deeply\)"):
    loader.restore_state(str(deep), it)
  with pytest.raises(IsADirectoryError, match=rf"{tmp_path} is a directory, not an iterator state: pass the file"):
    loader.restore_state(tmp_path, it)
