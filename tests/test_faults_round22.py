"""Round 22 of the fault audit: a quoted `~` in an input pattern or a loader path, a checkpoint path that names a
folder not made yet, a manifest whose record count disagrees with its shard, an input that `arrayrecord-verify`
is given but that was never converted, and a TFRecord file whose tail is zeros.

Found by the 2026-12-06 fault audit, each case run against the real CLI or loader before the fix:

- `arrayrecord-convert --input '~/data/*'` (quoted so the shell leaves the glob alone, which also leaves the `~`)
  said "No files match ... (quote it so your shell does not expand it)": the advice that caused the problem.
  `loader.ArrayRecordSource("~/data")` said only "ArrayRecord file not found: ~/data".
- `loader.save_state("ckpt/step_100/", it)` (a folder not made yet) said "Not a directory ... A part of its
  folder's path is a file: save elsewhere"; no part of it is a file.
- A manifest whose record count disagrees with its shard ("the manifest is stale or the file was replaced")
  said nothing about what to do.
- `arrayrecord-verify` given an input that was never converted (one added to the input folder since) said the
  output was "not listed in manifest.json, so readers of the dataset leave it out ...; rerun the conversion with
  --skip-existing to rewrite the manifest", about a file that does not exist.
- A TFRecord file whose end is zeros (a download cut short into a preallocated file, a crash before the data
  reached the disk) failed with "length checksum mismatch (damaged record header) ... or convert with
  --on-corrupt skip to keep the readable records", and skip mode then failed the whole file ("no valid record
  follows"); the records before the zeros can be kept by cutting the file, which the error now says.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

import faults_testing as ft
import loader


def _cli(module: str, *args: str, home: str | None = None) -> subprocess.CompletedProcess:
  e = ft.env()
  if home is not None:
    e["HOME"] = home
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ft.REPO, env=e, capture_output=True,
                        text=True, timeout=300)


def _convert(inputs: str, out: str, *flags: str) -> subprocess.CompletedProcess:
  return _cli("pipelines.convert", "--input", inputs, "--output", out, "--quiet", *flags)


def test_a_quoted_tilde_in_an_input_pattern_says_only_a_shell_expands_it(tmp_path):
  home = tmp_path / "home"
  ft.make_dataset(str(home / "data"), 1, 3, 16)
  out = tmp_path / "out"
  checked = tmp_path / "checked"  # arrayrecord-verify wants an existing folder.
  checked.mkdir()
  for module, output in (("pipelines.convert", out), ("pipelines.verify", checked)):
    r = _cli(module, "--input", "~/data/*", "--output", str(output), home=str(home))
    assert r.returncode == 2, r.stderr
    line = ft.one_line(r.stderr)
    assert "No files match the input pattern '~/data/*'" in line
    assert "only a shell expands, and not inside quotes" in line
    assert repr(str(home / "data" / "*")) in line  # The path written out.
    assert "--input ~/'data/*'" in line
    assert "quote it so your shell" not in line
  assert not out.exists()
  # What it says works.
  r = _convert(str(home / "data" / "*"), str(out))
  assert r.returncode == 0, r.stderr


def test_a_loader_path_starting_with_tilde_says_to_expand_it(tmp_path, monkeypatch):
  ft.make_dataset(str(tmp_path / "raw"), 1, 3, 16)
  out = tmp_path / "ar"
  assert _convert(str(tmp_path / "raw" / "*"), str(out)).returncode == 0
  monkeypatch.setenv("HOME", str(tmp_path))
  for path in ("~/ar", "~/ar/*.array_record*", "~/ar/ds.array_record-00000-of-00001"):
    with pytest.raises(loader.source.MissingFileError) as e:
      loader.ArrayRecordSource(path)
    message = str(e.value)
    assert "\n" not in message
    assert f"'~' is not expanded to a home folder here" in message
    assert f"os.path.expanduser({path!r})" in message
    assert len(loader.ArrayRecordSource(os.path.expanduser(path))) == 3  # What it says works.
  with pytest.raises(loader.source.MissingFileError) as e:
    loader.ArrayRecordSource(str(tmp_path / "nowhere"))
  assert "expanduser" not in str(e.value)


def test_save_state_to_a_folder_path_not_made_yet_says_so_and_makes_nothing(tmp_path):
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  target = str(tmp_path / "ckpt" / "step_100") + os.sep
  with pytest.raises(IsADirectoryError) as e:
    loader.save_state(target, it)
  message = str(e.value)
  assert "it names a folder, not a file" in message
  assert os.path.join(target, "iterator_state.json") in message
  assert "is a file" not in message
  with pytest.raises(IsADirectoryError, match="it names a folder, not a file"):
    loader.save_state("", it)
  assert os.listdir(tmp_path) == []  # No folder, no temp file.
  loader.save_state(os.path.join(target, "iterator_state.json"), it)  # What it says works.
  assert loader.checkpoint.load_state(os.path.join(target, "iterator_state.json"))["next_index"] == 1


def test_a_manifest_count_that_disagrees_with_its_shard_says_what_to_do(tmp_path):
  ft.make_dataset(str(tmp_path / "raw"), 2, 5, 16)
  out = tmp_path / "ar"
  assert _convert(str(tmp_path / "raw" / "*"), str(out)).returncode == 0
  manifest_path = out / "manifest.json"
  manifest = json.loads(manifest_path.read_text())
  manifest["shards"][0]["records"] = 4  # Stale: a hand edit, or a shard replaced by one of another run.
  manifest_path.write_text(json.dumps(manifest))
  with pytest.raises(ValueError) as e:
    loader.ArrayRecordSource(str(out))
  message = str(e.value)
  assert "\n" not in message
  assert "has 5 records but its manifest says 4" in message
  assert "arrayrecord-verify" in message and "--skip-existing" in message
  # What it says works: verify says which is wrong, the resume rewrites the manifest.
  r = _cli("pipelines.verify", "--input", str(tmp_path / "raw" / "*"), "--output", str(out))
  assert r.returncode == 1
  assert "the manifest says 4 records, the file has 5 (as many as its input)" in r.stdout
  r = _convert(str(tmp_path / "raw" / "*"), str(out), "--skip-existing")
  assert r.returncode == 0, r.stderr
  assert len(loader.ArrayRecordSource(str(out))) == 10


def test_verify_names_an_input_that_was_never_converted_as_such(tmp_path):
  raw = tmp_path / "raw"
  ft.make_dataset(str(raw), 2, 5, 16)
  out = tmp_path / "ar"
  assert _convert(str(raw / "*"), str(out)).returncode == 0
  ft.write_tfrecords(raw / "ds.tfrecord-late", [b"a", b"b"])  # Added after the conversion.
  r = _cli("pipelines.verify", "--input", str(raw / "*"), "--output", str(out))
  assert r.returncode == 1, r.stdout + r.stderr
  fails = [l for l in r.stdout.splitlines() if l.startswith("FAIL")]
  assert len(fails) == 1, r.stdout
  assert "ds.array_record-late" in fails[0]
  assert "output missing and not listed in" in fails[0]
  assert "this input was not converted into" in fails[0]
  assert "readers of the dataset leave it out" not in fails[0]
  assert "arrayrecord-convert --skip-existing" in fails[0]
  assert not (out / "ds.array_record-late").exists()
  # What it says works.
  assert _convert(str(raw / "*"), str(out), "--skip-existing").returncode == 0
  r = _cli("pipelines.verify", "--input", str(raw / "*"), "--output", str(out))
  assert r.returncode == 0, r.stdout + r.stderr


def test_a_tail_of_zeros_in_fail_mode_says_where_to_cut_the_file(tmp_path):
  raw = tmp_path / "raw"
  path = ft.write_tfrecords(raw / "part.tfrecord", [b"x" * 100, b"y" * 50, b"z" * 10])
  good = os.path.getsize(path)
  os.truncate(path, good + (4 << 20))  # The rest of a preallocated download: zeros.
  out = tmp_path / "out"
  r = _convert(path, str(out))
  assert r.returncode == 1
  line = ft.one_line(r.stderr)
  assert f"{path}: record 3 at byte offset {good} is corrupt" in line
  assert "zero bytes follow" in line
  assert f"the 3 record(s) before byte offset {good} are intact" in line
  assert f"truncate -s {good} FILE" in line
  assert not ft.published(str(out)) and not ft.temps(str(tmp_path))
  assert os.path.getsize(path) == good + (4 << 20)  # The input is left as it was.
  # A damaged header followed by more than zeros keeps the plain advice.
  other = ft.write_tfrecords(raw / "other.tfrecord", [b"x" * 100, b"y" * 50])
  with open(other, "r+b") as f:
    f.seek(116)
    f.write(b"\xff")
  r = _convert(other, str(tmp_path / "out2"))
  assert r.returncode == 1
  assert "zero bytes follow" not in ft.one_line(r.stderr)
  # What it says works.
  os.truncate(path, good)
  r = _convert(path, str(out))
  assert r.returncode == 0, r.stderr
  assert json.loads((out / "manifest.json").read_text())["shards"][0]["records"] == 3


def _one_converted_shard(tmp_path):
  """The ArrayRecord shard of a 3-record dataset made in tmp_path/raw and converted into tmp_path/ar."""
  raw = tmp_path / "raw"
  ft.make_dataset(str(raw), 1, 3, 16)
  assert _convert(str(raw / "*"), str(tmp_path / "ar")).returncode == 0
  return tmp_path / "ar" / "ds.array_record-00000-of-00001"


def test_a_gzipped_array_record_file_says_to_decompress_it(tmp_path):
  shard = _one_converted_shard(tmp_path)
  raw = tmp_path / "raw"
  packed = tmp_path / "copy" / "ds.array_record-00000-of-00001.gz"  # Compressed for the transfer.
  packed.parent.mkdir()
  packed.write_bytes(gzip.compress(shard.read_bytes()))
  with pytest.raises(loader.source.NotArrayRecordError) as e:
    loader.ArrayRecordSource(str(packed))
  assert f"it is a gzip-compressed ArrayRecord file: decompress it first (gunzip {packed})" in str(e.value)
  tfr = tmp_path / "ds.tfrecord.gz"
  tfr.write_bytes(gzip.compress((raw / "ds.tfrecord-00000-of-00001").read_bytes()))
  with pytest.raises(loader.source.NotArrayRecordError, match="it is a gzip-compressed TFRecord file; convert it"):
    loader.ArrayRecordSource(str(tfr))
  # What it says works.
  subprocess.run(["gunzip", str(packed)], check=True)
  assert len(loader.ArrayRecordSource(str(packed)[:-3])) == 3


def test_a_path_that_goes_on_after_a_files_name_is_not_called_a_permission_problem(tmp_path):
  shard = str(_one_converted_shard(tmp_path))
  for path in (shard + "/", shard + "/more/names"):
    with pytest.raises(loader.source.NotArrayRecordError) as e:
      loader.ArrayRecordSource(path)
    message = str(e.value)
    assert f"{shard} is a file, not a folder" in message
    assert "check the path (a '/' after a file's name?)" in message
    assert "permissions" not in message
  assert len(loader.ArrayRecordSource(shard)) == 3  # What it says works.


def test_a_checkpoint_path_starting_with_tilde_makes_no_folder_named_tilde(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  with pytest.raises(FileNotFoundError) as e:
    loader.save_state("~/ckpt/state.json", it)
  message = str(e.value)
  assert "'~' is not expanded to a home folder here" in message
  assert "os.path.expanduser('~/ckpt/state.json')" in message
  assert os.listdir(tmp_path) == []  # No folder named '~' (which a later `rm -rf ~` would be meant for).
  with pytest.raises(FileNotFoundError, match=r"'~' is not expanded to a home folder here"):
    loader.restore_state("~/ckpt/state.json", iter(loader.MapDataset.range(10).to_iter_dataset()))
  # What it says works.
  loader.save_state(os.path.expanduser("~/ckpt/state.json"), it)
  restored = iter(loader.MapDataset.range(10).to_iter_dataset())
  loader.restore_state(os.path.expanduser("~/ckpt/state.json"), restored)
  assert next(restored) == 1


def test_header_scan_over_zero_runs_finds_exactly_the_valid_headers():
  # Skipping past a zero-filled tail sorted millions of equal lengths (~10 MB/s);
  # zero lengths are now checked apart. The result must stay the brute-force one.
  import numpy as np  # pylint: disable=g-import-not-at-top
  from converter import tfrecord

  def header(n: int) -> bytes:
    length = n.to_bytes(8, "little")
    return length + tfrecord.masked_crc(length).to_bytes(4, "little")

  rng = np.random.default_rng(5)
  data = (b"junk" + header(0) + bytes(4) + bytes(300) + header(0) + header(7) + b"payload" + bytes(4)
          + rng.integers(0, 256, 2000, dtype=np.uint8).tobytes() + bytes(64) + header(0) + bytes(50))
  want = [i for i in range(len(data) - 11)
          if int.from_bytes(data[i:i + 8], "little") < tfrecord._MAX_RECORD  # pylint: disable=protected-access
          and tfrecord.masked_crc(data[i:i + 8]) == int.from_bytes(data[i + 8:i + 12], "little")]
  assert len(want) >= 4
  for lo in (0, 1, want[1], want[1] + 1, len(data) - 12):
    assert tfrecord._header_candidates(data, lo) == [i for i in want if i >= lo]  # pylint: disable=protected-access


def test_a_damaged_pipeline_entry_says_what_to_do():
  ds = loader.MapDataset.range(10).shuffle(seed=1).to_iter_dataset()
  it = iter(ds)
  next(it)
  state = it.get_state()
  state["pipeline"] = [1.5]
  with pytest.raises(loader.state.StateMismatchError) as e:
    iter(ds).set_state(state)
  ft.one_line(str(e.value))
  assert "'pipeline' entry is damaged: [1.5]" in str(e.value)
  assert "restore a state exactly as get_state() returned it" in str(e.value)


def test_a_non_integer_record_index_is_grains_attribute_error_and_a_type_error(tmp_path):
  # Grain 0.2.18 (and loader before) said only "'float' object has no attribute '__index__'".
  import grain  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from loader_testing import write_array_records  # pylint: disable=g-import-not-at-top

  paths = write_array_records(tmp_path, 1, 5)
  pairs = [(grain.sources.ArrayRecordDataSource(paths), loader.sources.ArrayRecordDataSource(paths)),
           (grain.sources.ArrayRecordDataSource(paths), loader.ArrayRecordSource(paths)),
           (grain.sources.RangeDataSource(0, 5, 1), loader.sources.RangeDataSource(0, 5, 1))]
  for theirs, ours in pairs:
    for bad in (1.5, "1", None):
      with pytest.raises(AttributeError):
        theirs[bad]  # pylint: disable=pointless-statement
      with pytest.raises(AttributeError) as e:
        ours[bad]  # pylint: disable=pointless-statement
      assert isinstance(e.value, TypeError)
      assert f"Record indices are integers; got {bad!r}" in ft.one_line(str(e.value))
    assert ours[True] == theirs[True] and ours[np.int64(2)] == theirs[np.int64(2)]


def test_review_tilde_names_that_no_shell_expands_are_paths_as_any_other(tmp_path, monkeypatch):
  # '~backup_state.json' (no home of that name) was refused as an unexpanded '~'.
  monkeypatch.chdir(tmp_path)
  it = iter(loader.MapDataset.range(3).to_iter_dataset())
  next(it)
  loader.save_state("~backup_state.json", it)
  restored = iter(loader.MapDataset.range(3).to_iter_dataset())
  loader.restore_state("~backup_state.json", restored)
  assert next(restored) == 1
  with pytest.raises(FileNotFoundError) as e:
    loader.restore_state("~nosuchuser/state.json", iter(loader.MapDataset.range(3).to_iter_dataset()))
  assert "home folder" not in str(e.value)
  with pytest.raises(FileNotFoundError) as e:
    loader.checkpoint.load_state(b"/nonexistent/state.json")  # A bytes path: was a TypeError.
  assert "No iterator state at" in str(e.value)
  from converter import planning  # pylint: disable=g-import-not-at-top
  for pattern in ("~draft*.tfrecord", "~nosuchuser/data/*"):
    with pytest.raises(Exception) as e:
      planning.match_pattern(pattern)
    assert "only a shell expands" not in str(e.value)


def test_review_saving_under_a_file_name_ending_in_a_slash_says_it_is_a_file(tmp_path):
  it = iter(loader.MapDataset.range(3).to_iter_dataset())
  next(it)
  (tmp_path / "state.json").write_text("{}")
  with pytest.raises(OSError) as e:
    loader.save_state(str(tmp_path / "state.json") + "/", it)
  assert "names a folder" not in str(e.value)
  assert (tmp_path / "state.json").read_text() == "{}"


def test_review_a_hole_of_zeros_with_records_after_it_gets_no_truncate_advice(tmp_path):
  # The zeros reached the end of one 4 MiB read; 1,000 records followed them, which the truncate lost.
  raw = tmp_path / "raw"
  records = [bytes([i % 251]) * 65520 for i in range(64)]
  records[-1] = records[-1][:-1000]  # The records end 1,000 bytes before the 4 MiB read boundary.
  path = ft.write_tfrecords(raw / "a.tfrecord", records)
  after = ft.write_tfrecords(tmp_path / "b.tfrecord", [b"after%d" % i for i in range(1000)])
  with open(path, "ab") as f:
    f.write(bytes(4096) + open(after, "rb").read())
  r = _convert(path, str(tmp_path / "out"))
  assert r.returncode == 1
  line = ft.one_line(r.stderr)
  assert "record 64 at byte offset" in line and "zero bytes follow" not in line and "truncate" not in line
  r = _convert(path, str(tmp_path / "out2"), "--on-corrupt", "skip")
  assert r.returncode == 0, r.stderr
  manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
  assert manifest["shards"][0]["records"] == 1064


def test_review_a_gzipped_array_record_file_without_gz_gets_a_command_that_works(tmp_path):
  shard = _one_converted_shard(tmp_path)
  packed = tmp_path / "it's here" / "ds.array_record-00000-of-00001"  # Compressed under its own name.
  packed.parent.mkdir()
  packed.write_bytes(gzip.compress(shard.read_bytes()))
  with pytest.raises(loader.source.NotArrayRecordError) as e:
    loader.ArrayRecordSource(str(packed))
  command = ft.one_line(str(e.value)).split("decompress it first (", 1)[1].split(")", 1)[0]
  assert command.startswith("gunzip -c ")
  subprocess.run(["bash", "-c", command], check=True)
  assert len(loader.ArrayRecordSource(str(packed))) == 3
  assert os.listdir(packed.parent) == [packed.name]
