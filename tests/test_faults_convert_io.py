"""Bad inputs and outputs: each refused in one line that says what to do, nothing left behind.

Full and read-only filesystems are real tmpfs mounts (root can write through
any `chmod`, so a read-only mount is the honest way to get an unwritable
directory); without the right to mount, those tests skip saying so.
"""

from __future__ import annotations

import json
import shutil
import os
import time
import subprocess
import sys

import pytest

import faults_testing as ft
from loader import ondisk
from pipelines import cli, convert

CONVERT = "pipelines.convert"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """Three 300 KB shards of incompressible records (outputs ~320 KB each)."""
  inp = tmp_path_factory.mktemp("io") / "in"
  return inp, ft.make_dataset(str(inp), 3, 300, 1000, seed=1)


def args(inp, out, *extra, pattern="*"):
  return ["--input", str(inp / pattern), "--output", str(out), "--quiet", "--workers", "1", *extra]


def error_line(capsys) -> str:
  return ft.one_line(capsys.readouterr().err)


def test_disk_full_mid_run_is_one_line_no_temp_and_resumable(tmp_path, small, ar_read):
  inp, recs = small
  out = str(tmp_path / "small")
  with ft.tmpfs(out, "800k"):  # Room for two outputs; the inputs (900 KB) pass the free-space check.
    result = ft.run_cli(CONVERT, *args(inp, out))
    assert result.returncode == 1, result.stderr
    line = ft.one_line(result.stderr)
    assert line.startswith(f"arrayrecord-convert: error: Cannot write {out}/ds.array_record-")
    assert "[Errno 28] No space left on device" in line and "--skip-existing" in line
    assert ft.temps(out) == []
    done = ft.published(out)
    assert 0 < len(done) < 3
    for name in recs:
      if ft.out_name(name) in done:
        assert ar_read(os.path.join(out, ft.out_name(name))) == recs[name]
    # No lock, nothing partial; manifest.json marks the failed run, so nobody reads a part as the dataset.
    assert sorted(os.listdir(out)) == sorted(done + ["manifest.json"])
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["status"] == ondisk.INCOMPLETE

    subprocess.run(["mount", "-o", "remount,size=4m", out], check=True)  # Space freed.
    assert convert.main(args(inp, out, "--skip-existing")) == 0
    manifest = json.loads(open(os.path.join(out, "manifest.json")).read())
    assert manifest["totals"]["records"] == 900 and manifest["totals"]["existing"] == len(done)
    for name in recs:
      assert ar_read(os.path.join(out, ft.out_name(name))) == recs[name]


def test_too_little_free_space_is_refused_before_any_work(tmp_path, small, capsys):
  inp, _ = small
  out = str(tmp_path / "tiny")
  with ft.tmpfs(out, "100k"):
    assert convert.main(args(inp, out)) == 2
    line = error_line(capsys)
    assert f"Not enough free space for {out}" in line and "900.0 MB" not in line
    assert "0.9 MB" in line and "Free space or choose another --output" in line
    assert os.listdir(out) == []


def test_no_free_inodes_says_so_rather_than_free_space(tmp_path, small, capsys):
  inp, _ = small
  with ft.tmpfs(str(tmp_path / "mnt"), "10m", inodes=5) as mount:  # The root, the output folder, 3 more files.
    out = os.path.join(mount, "out")
    assert convert.main(args(inp, out)) == 1
    line = error_line(capsys)
    assert "[Errno 28] No space left on device" in line and "no free inodes left (`df -i`)" in line, line
    assert ft.temps(out) == []


def test_a_full_filesystem_is_refused_leaving_no_folder_or_lock(tmp_path, small, capsys):
  inp, _ = small
  mount = str(tmp_path / "full")
  with ft.tmpfs(mount, "64k"):
    ft.fill(mount)
    out = os.path.join(mount, "o")
    assert convert.main(args(inp, out)) == 2
    line = error_line(capsys)
    assert "No space left on device" in line and "or free space there" in line
    assert os.listdir(mount) == ["filler"]  # Neither the folder it made nor a lock file.


def test_read_only_output_dir_is_refused_before_any_work(tmp_path, small, capsys):
  inp, _ = small
  out = str(tmp_path / "ro")
  with ft.tmpfs(out, "1m", read_only=True):
    for target in (out, os.path.join(out, "sub")):
      assert convert.main(args(inp, target)) == 2
      line = error_line(capsys)
      assert "[Errno 30] Read-only file system" in line
      assert "choose a writable --output" in line
    assert os.listdir(out) == []


def test_output_that_is_a_file(tmp_path, small, capsys):
  inp, _ = small
  out = tmp_path / "out.txt"
  out.write_text("not a directory")
  assert convert.main(args(inp, out)) == 2
  assert error_line(capsys) == (f"arrayrecord-convert: error: --output {out} is a file, not a "
                                "directory; give a directory path (it is created if missing).")
  assert convert.main(args(inp, out / "sub")) == 2
  assert f"{out} is a file, not a directory" in error_line(capsys)
  assert out.read_text() == "not a directory"


def test_output_that_is_a_dangling_symlink(tmp_path, small, capsys):
  inp, _ = small
  out = tmp_path / "link"
  out.symlink_to(tmp_path / "gone" / "dir")
  assert convert.main(args(inp, out)) == 2
  assert error_line(capsys) == (
      f"arrayrecord-convert: error: --output {out} cannot be created: {out} is a symbolic link to "
      f"{tmp_path / 'gone' / 'dir'}, which does not exist; create that directory or choose another --output.")
  assert not (tmp_path / "gone").exists() and out.is_symlink()


def test_dotdot_after_a_symlink_goes_where_the_system_goes(tmp_path, small, monkeypatch):
  # `link/..` is the symlink target's parent for the kernel; a textual
  # normalisation would name another directory (and fail, or write elsewhere).
  inp, recs = small
  (tmp_path / "real" / "sub").mkdir(parents=True)
  (tmp_path / "work").mkdir()
  (tmp_path / "work" / "link").symlink_to(tmp_path / "real" / "sub")
  monkeypatch.chdir(tmp_path / "work")
  assert convert.main(args(inp, "link/../out")) == 0
  assert sorted(os.listdir(tmp_path / "real" / "out")) == sorted(
      ["manifest.json", *(n.replace("tfrecord", "array_record") for n in recs)])
  assert not (tmp_path / "work" / "out").exists()
  assert convert.main(args(inp, "link/../out", "--skip-existing")) == 0  # The manifest is found again.


def test_input_directory_is_refused_with_a_glob_hint(tmp_path, small, capsys):
  inp, _ = small
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp), "--output", str(out)]) == 2
  assert error_line(capsys) == (f"arrayrecord-convert: error: Input {inp} is a directory; give "
                                f"the files in it, e.g. --input '{inp}/*'.")
  assert not out.exists()


def test_fifo_in_the_glob_is_refused_and_never_read(tmp_path, small):
  inp, recs = small
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  for name in recs:
    os.symlink(inp / name, mixed / name)
  os.mkfifo(mixed / "pipe.tfrecord")  # Opening it for reading would block forever.
  out = tmp_path / "out"
  result = ft.run_cli(CONVERT, *args(mixed, out), timeout=120)
  assert result.returncode == 2
  line = ft.one_line(result.stderr)
  assert f"Input {mixed}/pipe.tfrecord is a FIFO (named pipe)" in line
  assert not out.exists()


def test_dangling_symlink_is_refused_not_skipped(tmp_path, small, capsys):
  inp, recs = small
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  for name in recs:
    os.symlink(inp / name, mixed / name)
  os.symlink(tmp_path / "gone.tfrecord", mixed / "ds.tfrecord-00003-of-00003")
  out = tmp_path / "out"
  for pattern in ("*", "ds.tfrecord-00003-of-00003"):
    assert convert.main(args(mixed, out, pattern=pattern)) == 2
    line = error_line(capsys)
    assert (f"Input {mixed}/ds.tfrecord-00003-of-00003 is a broken symbolic link (to "
            f"'{tmp_path}/gone.tfrecord', which does not exist); fix or remove the link.") in line
  assert not out.exists()


def test_literal_brackets_get_an_escaping_hint(tmp_path, small, capsys, ar_read):
  inp, recs = small
  odd = tmp_path / "odd"
  name = sorted(recs)[0]
  ft.write_tfrecords(str(odd / "run[1].tfrecord"), recs[name])
  out = tmp_path / "out"
  assert convert.main(["--input", str(odd / "run[1].tfrecord"), "--output", str(out)]) == 2
  line = error_line(capsys)
  assert "'[' and ']' are a glob character class" in line
  escaped = str(odd / "run[[]1].tfrecord")
  assert f"--input {escaped!r}" in line
  assert convert.main(["--input", escaped, "--output", str(out), "--quiet"]) == 0
  assert ar_read(str(out / "run[1].array_record")) == recs[name]


def test_a_name_that_is_not_utf8_is_named_before_any_work(tmp_path, small, capsys, ar_read):
  # Linux allows any bytes in a file name; Beam passes names on as UTF-8 text.
  inp, recs = small
  odd = tmp_path / "odd"
  name = sorted(recs)[0]
  ft.write_tfrecords(os.fsdecode(os.path.join(os.fsencode(odd), b"caf\xe9.tfrecord")), recs[name])
  out = tmp_path / "out"
  for given in (str(odd / "caf*"), str(odd / "caf\udce9.tfrecord")):
    assert convert.main(["--input", given, "--output", str(out)]) == 2
    assert error_line(capsys) == (
        f"arrayrecord-convert: error: Input {odd}/caf\\xe9.tfrecord has a name that is not valid UTF-8 text, "
        "which Beam cannot pass on; rename it to UTF-8 (e.g. convmv -f latin1 -t utf8 --notest FILE).")
  assert not out.exists()


def test_a_folder_that_cannot_be_listed_is_named_when_nothing_matches(tmp_path, small, capsys, monkeypatch):
  from converter import planning
  inp, _ = small
  real_listdir = os.listdir

  def listdir(path="."):  # This test runs as root, whom no mode stops: a folder mode 0311 for another user.
    if os.fspath(path) == str(inp):
      raise PermissionError(13, os.strerror(13), os.fspath(path))
    return real_listdir(path)
  monkeypatch.setattr(planning.os, "listdir", listdir)
  hint = planning._no_files_hint(str(inp / "*.nothing"), str(inp / "*.nothing"))  # pylint: disable=protected-access
  assert hint == (f"its folder {inp} cannot be listed (Permission denied): give this user read permission "
                  "on it, or name the files without wildcards")
  assert convert.main(["--input", str(inp / "*.nothing"), "--output", str(tmp_path / "out")]) == 2
  assert error_line(capsys).endswith(f"No files match the input pattern {str(inp / '*.nothing')!r}. {hint}.")


def test_a_file_name_starting_with_a_dash_gets_a_hint(tmp_path, small, capsys, monkeypatch, ar_read):
  inp, recs = small
  name = sorted(recs)[0]
  ft.write_tfrecords(str(tmp_path / "-x.tfrecord"), recs[name])
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as e:
    convert.main(["--input", "-x.tfrecord", "--output", "out"])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1] == (
      "arrayrecord-convert: error: argument --input: expected at least one argument (a value starting with '-', "
      "such as a file named -x.tfrecord, reads as a flag: write --input=-x.tfrecord or --input ./-x.tfrecord)")
  assert convert.main(["--input=-x.tfrecord", "--output", "out", "--quiet"]) == 0
  assert ar_read(str(tmp_path / "out" / "-x.array_record")) == recs[name]


def test_wrong_compression_suggests_auto(tmp_path, small, capsys):
  inp, _ = small
  out = tmp_path / "out"
  assert convert.main(args(inp, out, "--compression", "gzip")) == 2
  line = error_line(capsys)
  assert "is not gzip-compressed (it looks uncompressed), but --compression gzip was given" in line
  assert line.endswith("Use --compression auto (compression='auto') to detect it per file.")
  assert not out.exists()


def test_a_failing_beam_pipeline_is_reduced_to_its_root_cause(tmp_path, capsys):
  import apache_beam as beam

  def fail(_):
    raise OSError(5, "Input/output error", str(tmp_path / "disk"))

  def run():
    with beam.Pipeline() as p:
      _ = p | beam.Create([1]) | "Boom" >> beam.Map(fail)

  result, code = cli.run_reporting_errors("prog", run)
  assert result is None and code == 1
  assert error_line(capsys) == (f"prog: error: OSError: [Errno 5] Input/output error: "
                                f"'{tmp_path / 'disk'}'")


def test_lock_file_is_hidden_and_gone_after_a_run(tmp_path, small):
  inp, _ = small
  out = tmp_path / "out"
  assert convert.main(args(inp, out)) == 0
  assert ondisk.LOCK_NAME not in os.listdir(out)


@pytest.mark.parametrize("case", ["output file is another's folder", "manifest folder"])
def test_outputs_that_would_take_each_others_or_the_manifests_place_are_refused_before_any_work(tmp_path, capsys,
                                                                                                case):
  inp, out = tmp_path / "in", tmp_path / "out"
  if case == "output file is another's folder":
    files, taken = ["a.tfrec", "a.array_record/x.tfrecord"], f"the output of '{inp / 'a.tfrec'}'"
  else:
    files, taken = ["manifest.json/x.tfrecord", "y.tfrecord"], "the run's manifest"
  for f in files:
    ft.write_tfrecords(str(inp / f), [b"a"])
  assert convert.main(["--input", *(str(inp / f) for f in files), "--output", str(out), "--quiet"]) == 2
  line = error_line(capsys)
  assert line.startswith("arrayrecord-convert: error: The input ") and taken in line, line
  assert not out.exists()
  # Through the Python API, a suffix can name an output as the manifest itself.
  from converter import ConvertOptions, ConversionError
  from converter.planning import plan_shards
  with pytest.raises(ConversionError, match=r"would be written to .*manifest.json', which is the run's manifest"):
    plan_shards([str(tmp_path / "manifest.tfrecord")], ConvertOptions(output_dir=str(out), suffix="json"))


@pytest.mark.parametrize("second_mode,old_mtime", [("fail", False), ("skip", False), ("skip", True)])
def test_skip_existing_redoes_a_shard_whose_input_was_repaired(tmp_path, capsys, ar_read, second_mode, old_mtime):
  inp, out = tmp_path / "in", tmp_path / "out"
  recs = ft.make_dataset(str(inp), 2, 50, 100, seed=3)
  name = "ds.tfrecord-00001-of-00002"
  good = (inp / name).read_bytes()
  damaged = bytearray(good)
  damaged[116 * 5 + 20] ^= 1  # Inside record 5's data: its CRC fails.
  (inp / name).write_bytes(damaged)
  assert convert.main(args(inp, out, "--on-corrupt", "skip")) == 0
  assert len(ar_read(str(out / ft.out_name(name)))) == 49
  time.sleep(0.01)
  before = os.stat(inp / name)
  (inp / name).write_bytes(good)  # Downloaded again: same size, same ends.
  if old_mtime:  # As `cp -p`, `rsync -a` or `tar x` leave it.
    os.utime(inp / name, ns=(before.st_atime_ns, before.st_mtime_ns))
  assert convert.main(args(inp, out, "--skip-existing", "--on-corrupt", second_mode)) == 0
  assert "kept 1 existing" in capsys.readouterr().out
  for n, records in recs.items():
    assert ar_read(str(out / ft.out_name(n))) == records


def test_skip_existing_in_fail_mode_redoes_a_shard_that_lost_records(tmp_path, capsys):
  inp, out = tmp_path / "in", tmp_path / "out"
  ft.make_dataset(str(inp), 1, 50, 100, seed=3)
  name = "ds.tfrecord-00000-of-00001"
  damaged = bytearray((inp / name).read_bytes())
  damaged[116 * 5 + 20] ^= 1
  (inp / name).write_bytes(damaged)
  os.utime(inp / name, (1, 1))  # Older than any output: only the mode decides.
  assert convert.main(args(inp, out, "--on-corrupt", "skip")) == 0
  capsys.readouterr()
  # The input is still damaged: this run must lose no record, so it fails on it instead of keeping 49 of 50.
  assert convert.main(args(inp, out, "--skip-existing")) == 1
  assert name in error_line(capsys)


@pytest.mark.parametrize("kind", ["symlink", "hard link", "folder"])
def test_a_link_or_folder_at_the_lock_path_is_refused_and_nothing_it_points_to_changes(tmp_path, small, capsys,
                                                                                        kind):
  inp, _ = small
  out = tmp_path / "out"
  out.mkdir()
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes")
  lock = out / ondisk.LOCK_NAME
  {"symlink": lambda: lock.symlink_to(notes), "hard link": lambda: os.link(notes, lock),
   "folder": lock.mkdir}[kind]()
  assert convert.main(args(inp, out)) == 2
  line = error_line(capsys)
  what = {"symlink": "is a symbolic link", "hard link": "is a hard link to another file", "folder": "is a folder"}
  assert f"Cannot lock the output directory {out}: {lock} {what[kind]}, not this tool's lock file" in line, line
  assert notes.read_text() == "my notes"
  assert sorted(os.listdir(out)) == [ondisk.LOCK_NAME]  # Nothing converted, nothing removed.


def test_a_folder_at_the_manifests_path_is_named(tmp_path, small, capsys):
  inp, _ = small
  out = tmp_path / "out"
  (out / "manifest.json").mkdir(parents=True)
  assert convert.main(args(inp, out)) == 2
  assert error_line(capsys) == (f"arrayrecord-convert: error: {out}/manifest.json is a folder, where this tool keeps "
                                f"the dataset's manifest; move it out of --output {out} (or choose another --output) "
                                "and rerun.")
  assert os.listdir(out) == ["manifest.json"]


def test_a_second_run_into_the_same_directory_never_drops_the_first_runs_shards(tmp_path, small, capsys):
  inp, _ = small
  other = tmp_path / "other"
  ft.make_dataset(str(other), 1, 10, 100, seed=2)
  os.rename(other / "ds.tfrecord-00000-of-00001", other / "test.tfrecord-00000-of-00001")
  out = tmp_path / "out"
  assert convert.main(args(inp, out)) == 0
  manifest = (out / ondisk.MANIFEST_NAME).read_bytes()
  capsys.readouterr()
  # Another split into the same directory: its manifest would list only the new shard.
  assert convert.main(args(other, out)) == 2
  line = error_line(capsys)
  assert f"{out / ondisk.MANIFEST_NAME} exists" in line and "Nothing was converted" in line, line
  # Resuming does not license it either: the manifest lists shards this run does not convert.
  assert convert.main(args(other, out, "--skip-existing")) == 2
  line = error_line(capsys)
  assert "lists 3 shard(s) this run does not convert" in line and "--overwrite" in line, line
  assert (out / ondisk.MANIFEST_NAME).read_bytes() == manifest
  assert sorted(os.listdir(out)) == sorted([ondisk.MANIFEST_NAME] + [ft.out_name(n) for n in os.listdir(inp)])
  # A resume of the same run, and an explicit overwrite, still work.
  assert convert.main(args(inp, out, "--skip-existing")) == 0
  assert convert.main(args(other, out, "--overwrite")) == 0
  shards = json.loads((out / ondisk.MANIFEST_NAME).read_text())["shards"]
  assert [os.path.basename(s["output"]) for s in shards] == [ft.out_name("test.tfrecord-00000-of-00001")]


@pytest.mark.parametrize("content", [b'{"name": "my dataset", "files": ["a.csv"]}',
                                     b'{"format": "someone-else/manifest", "shards": []}'])
def test_a_manifest_json_the_converter_did_not_write_is_replaced_only_with_overwrite(
    tmp_path, small, capsys, content):
  inp, _ = small
  out = tmp_path / "out"
  out.mkdir()
  (out / "manifest.json").write_bytes(content)
  for flags in ((), ("--skip-existing",)):
    assert convert.main(args(inp, out, *flags)) == 2
    line = error_line(capsys)
    assert f"{out / 'manifest.json'} was not written by the converter" in line, line
    assert "(CLI: --overwrite) to replace it" in line and "--skip-existing" not in line
    assert (out / "manifest.json").read_bytes() == content and os.listdir(out) == ["manifest.json"]
  assert convert.main(args(inp, out, "--overwrite")) == 0
  assert json.loads((out / "manifest.json").read_text())["format"] == ondisk.MANIFEST_FORMAT


def test_a_failed_run_leaves_a_directory_the_loader_refuses(tmp_path, capsys):
  import loader
  inp = tmp_path / "in"
  for name in ("a", "b", "c"):  # Names without -NNNNN-of-NNNNN: only the manifest can tell.
    ft.write_tfrecords(str(inp / f"{name}.tfrecord"), [b"%s%03d" % (name.encode(), i) for i in range(100)])
  bad = inp / "c.tfrecord"
  data = bytearray(bad.read_bytes())
  data[len(data) // 2] ^= 1
  bad.write_bytes(bytes(data))
  out = tmp_path / "out"
  assert convert.main(args(inp, out)) == 1
  assert "c.tfrecord: record " in error_line(capsys)
  with pytest.raises(ondisk.IncompleteManifestError) as e:
    loader.ArrayRecordSource(str(out))
  assert str(e.value).startswith(f"{out / 'manifest.json'} marks a conversion that did not finish")
  assert "\n" not in str(e.value) and "rerun that conversion with --skip-existing" in str(e.value).lower()


def test_a_broken_link_at_an_output_name_is_refused_before_any_work(tmp_path, small, capsys):
  inp, recs = small
  out = tmp_path / "out"
  out.mkdir()
  link = out / ft.out_name(sorted(recs)[1])
  link.symlink_to("/nowhere")
  for flags in ((), ("--overwrite",), ("--skip-existing",)):
    assert convert.main(args(inp, out, *flags)) == 2
    assert error_line(capsys) == (
        f"arrayrecord-convert: error: Output {link} is a symbolic link to '/nowhere', which does not "
        "exist; remove the link or choose another --output.")
    assert os.listdir(out) == [link.name]  # Nothing converted.


def test_a_directory_at_an_output_name_is_refused_before_any_work(tmp_path, small, capsys):
  inp, recs = small
  out = tmp_path / "out"
  taken = out / ft.out_name(sorted(recs)[1])
  (taken / "keep").mkdir(parents=True)
  for flags in ((), ("--overwrite",), ("--skip-existing",)):
    assert convert.main(args(inp, out, *flags)) == 2
    assert error_line(capsys) == (
        f"arrayrecord-convert: error: Output {taken} is a directory, where this run would write its "
        "file; remove it or choose another --output.")
    assert os.listdir(out) == [taken.name] and os.listdir(taken) == ["keep"]


def test_an_output_folder_linked_to_the_input_folder_never_replaces_an_input(tmp_path, capsys):
  # Inputs `a` and `a.array_record` (a TFRecord file): the output of `a` is named like the second one.
  inp = tmp_path / "in"
  recs = {"a": [b"x" * 10], "a.array_record": [b"y" * 10]}
  for name, r in recs.items():
    ft.write_tfrecords(str(inp / name), r)
  before = {n: (inp / n).read_bytes() for n in recs}
  link = tmp_path / "link"
  link.symlink_to(inp)
  for flags in ((), ("--overwrite",)):
    assert convert.main(args(inp, link, *flags)) == 2
    assert error_line(capsys) == (
        f"arrayrecord-convert: error: Output '{link}/a.array_record' would overwrite the input "
        f"'{inp}/a.array_record' (the same file on disk); choose another --output.")
    assert {n: (inp / n).read_bytes() for n in recs} == before and sorted(os.listdir(inp)) == sorted(recs)


def test_a_users_file_where_an_output_folder_goes_is_refused_before_any_work(tmp_path, capsys):
  inp, out = tmp_path / "in", tmp_path / "out"
  ft.write_tfrecords(str(inp / "x" / "a.tfrecord"), [b"a"])
  ft.write_tfrecords(str(inp / "y" / "b.tfrecord"), [b"b"])
  out.mkdir()
  (out / "x").write_text("user data")
  for flags in ((), ("--overwrite",), ("--skip-existing",)):
    assert convert.main(args(inp, out, *flags, pattern="*/*.tfrecord")) == 2
    assert error_line(capsys) == (
        f"arrayrecord-convert: error: Output {out}/x/a.array_record cannot be written: {out}/x is a file, "
        "where this run needs a folder; remove it or choose another --output.")
    assert os.listdir(out) == ["x"] and (out / "x").read_text() == "user data"


def test_names_too_long_for_the_filesystem_are_refused_before_any_work(tmp_path, capsys, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  name = "x" * 245 + ".tfrecord"  # 254 bytes: legal; its output name (258 bytes) is not.
  ft.write_tfrecords(str(inp / name), [b"a"])
  assert convert.main(args(inp, out)) == 2
  line = error_line(capsys)
  assert line.startswith(f"arrayrecord-convert: error: Output name '{'x' * 245}.array_record' cannot be written "
                         "here: it is 258 bytes, past this filesystem's 255-byte limit. Rename the inputs")
  assert not out.exists()
  # A legal output name converts, however little room it leaves its temp file's name.
  os.remove(inp / name)
  name = "x" * 230 + ".tfrecord"
  ft.write_tfrecords(str(inp / name), [b"a"])
  assert convert.main(args(inp, out)) == 0
  assert ar_read(str(out / ("x" * 230 + ".array_record"))) == [b"a"]
  assert ft.temps(str(out)) == []


def test_a_file_size_limit_says_what_to_raise(tmp_path, small):
  import resource
  inp, _ = small
  out = tmp_path / "out"
  limit = 100_000  # Each output is ~320 KB.
  result = subprocess.run(
      [sys.executable, "-m", CONVERT, *args(inp, out)], cwd=ft.REPO, env=ft.env(), capture_output=True,
      text=True, timeout=300, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
  assert result.returncode == 1, result.stderr
  line = ft.one_line(result.stderr)
  assert "[Errno 27] File too large" in line and "raise the file size limit (`ulimit -f`)" in line
  assert ft.temps(str(out)) == [] and ft.published(str(out)) == []


def test_writer_options_are_checked_without_writing_to_tmpdir(tmp_path, monkeypatch):
  import tempfile
  from converter import ConvertOptions
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))  # A $TMPDIR no file can go to.
  assert ConvertOptions(output_dir=str(tmp_path / "out"), writer_options="group_size:1,zstd:3").writer_options
  with pytest.raises(ValueError, match="Invalid ArrayRecord writer options 'zstd:99'"):
    ConvertOptions(output_dir=str(tmp_path / "out"), writer_options="zstd:99")


def test_a_lost_connection_to_the_storage_says_how_to_go_on(capsys):
  def run():
    try:
      raise ConnectionRefusedError(111, "Connection refused")  # What gs:// gives when the server is gone.
    except OSError as e:
      raise RuntimeError("the pipeline failed") from e
  assert cli.run_reporting_errors("arrayrecord-convert", run) == (None, 1)
  line = error_line(capsys)
  assert line.startswith("arrayrecord-convert: error: ConnectionRefusedError: [Errno 111] Connection refused")
  assert line.endswith("when it is reachable again, rerun with --skip-existing)")


@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_an_input_that_changes_while_converted_is_not_published(tmp_path, small, monkeypatch, capsys, how):
  """Records of one file and the size of another would make a manifest that contradicts itself."""
  from converter import transforms  # pylint: disable=import-outside-toplevel
  inp0, recs = small
  inp = tmp_path / "in"
  shutil.copytree(inp0, inp)
  victim = inp / sorted(recs)[1]
  write_digested = transforms._manifest.write_digested  # pylint: disable=protected-access

  def then_change(reader, write, digest):
    write_digested(reader, write, digest)
    if reader.path == str(victim):  # Another writer, between the last read and the publish.
      if how == "replaced":
        ft.write_tfrecords(str(victim) + ".new", [b"other"] * 3)
        os.replace(str(victim) + ".new", victim)
      else:
        with open(victim, "ab") as f:
          f.write(b"\0" * 16)

  monkeypatch.setattr(transforms._manifest, "write_digested", then_change)  # pylint: disable=protected-access
  out = tmp_path / "out"
  assert convert.main(args(inp, out)) == 1
  line = error_line(capsys)
  assert f"Input {victim} was {'replaced by another file' if how == 'replaced' else 'modified'} (" in line
  assert "it changed while it was converted, so its shard was not written" in line
  assert "rerun with --skip-existing" in line
  assert ft.out_name(victim.name) not in os.listdir(out)
  assert not [n for n in os.listdir(out) if ".tmp" in n]


def test_local_abspath_resolves_the_folder_of_a_dotdot_path_not_its_last_name(tmp_path):
  (tmp_path / "real" / "sub").mkdir(parents=True)
  (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
  (tmp_path / "real" / "state.json").symlink_to(tmp_path / "elsewhere.json")  # A name a save replaces.
  assert ondisk.local_abspath(str(tmp_path / "link" / ".." / "state.json")) == str(tmp_path / "real" / "state.json")
  assert ondisk.local_abspath(str(tmp_path / "link" / "..")) == str(tmp_path / "real")
  assert ondisk.local_abspath(str(tmp_path / "link" / "x")) == str(tmp_path / "link" / "x")  # No '..': as abspath.


def test_an_output_folder_gone_mid_run_is_not_created_again(tmp_path):
  from converter import writer
  from converter.errors import OutputWriteError
  root = tmp_path / "out"  # Moved away after planning (mv out out.old): the next shard must not re-create it.
  with pytest.raises(OutputWriteError, match=r"the output folder .*/out is gone \(moved or deleted while this run "
                                             r"wrote it\?\).*put the output folder back"):
    with writer.ArrayRecordShardWriter(str(root / "sub" / "x.array_record"), "group_size:1", root=str(root)) as w:
      w.write(b"x")
      w.commit()
  assert not root.exists()
  root.mkdir()
  with writer.ArrayRecordShardWriter(str(root / "sub" / "x.array_record"), "group_size:1", root=str(root)) as w:
    w.write(b"x")
    w.commit()
  assert os.listdir(root / "sub") == ["x.array_record"]
