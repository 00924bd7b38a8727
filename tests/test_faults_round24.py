"""Round 24 of the fault audit: Orbax checkpoint folders whose process file is not a regular file or is saved
over, paths that end in a line break or a space (an iterator state's, --output, --input, --dry-run-dir, the
migration APIs' output), a gs:// --output with an empty folder name, inputs compressed or archived in formats the
converter does not read, input names holding a backslash that a wildcard left out, a cut ArrayRecord shard's
error, and a huge file given as an iterator state.

Found by the 2026-12-06 fault audit, each case run against the real loader, Orbax handler or CLI before the fix:

- `loader.checkpoint.CheckpointHandler.restore` (what Orbax's CheckpointManager calls with CheckpointRestore, and
  OrbaxCheckpointable.load's coroutine) of a checkpoint whose process_<i>-of-<n>.json is a FIFO waited for ever;
  one where it is a folder raised a bare "[Errno 21] Is a directory: '.../process_0-of-1.json'"; one where it is
  a broken symbolic link or a link loop said the file "does not exist; the checkpoint holds
  process_0-of-1.json: it was saved by a job of another process count", naming as present the file it called
  missing, and sending the user to change the job's process count.
- `CheckpointHandler.save` into a folder that already holds this process's file (the handler called directly, a
  retried save of a step) wrote the file in place: a save that failed part way (a file size limit, a full disk)
  truncated the old state and then deleted it, and a symbolic link at the name was written through, replacing
  the file it points to with an iterator state.
- `loader.save_state(path, it)` with a path read with its line break (`open("ckpt_path.txt").read()`, a YAML
  block) made a file (or folder) whose name ends in the line break; `restore_state` of the path as the user sees
  it then said "No iterator state ... start from the beginning (a fresh iterator)": a resumed training run would
  start its data from the beginning. `restore_state` of such a path printed its message on two lines.
- `arrayrecord-convert --output $'out\\n'` (`--output "$(cat out_dir.txt)"` keeps no line break, but a pasted or
  YAML-block value does) converted into a new folder named 'out\\n' and reported "Output: out\\n", a folder that
  `ls` shows as `out?` and the loader's `ArrayRecordSource("out")` never finds; an --input pattern with a
  line break or space at its end said only "No files match ... Check the path and the glob".
- `arrayrecord-convert --output gs://bucket//ar` (from "$BUCKET/$PREFIX" with BUCKET ending in '/') wrote every
  object as "/ar/..." (Cloud Storage keeps the empty name), a dataset no reader of gs://bucket/ar finds; so did
  `arrayrecord-dataflow`.
- The same line break in a folder inside the output path (`out\n/ds`), in the re-sharding and match-shards
  migration APIs' `args["output"]`, and in `arrayrecord-dataflow --dry-run-dir` made folders named with it;
  `arrayrecord-verify --output $'out\n'` said the folder "does not exist" without saying why.
- An input compressed with bzip2, xz or zstd, or packed in a ZIP or tar archive (also a .tar.gz), was "not a
  TFRecord file: no valid record header ...; it starts with b'BZh91AY&SY...'" with advice to re-create it; a tar
  archive was "record 0 ... is corrupt ... or convert with --on-corrupt skip", and skip mode then read the
  records stored inside the archive and failed at its padding, advising to cut the archive there. Each is now
  named, with the command that unpacks it.
- A shard cut in its last chunk (an interrupted copy) was named with a trailing "(reader: )": the reader's
  status, empty.
- `arrayrecord-convert --input 'in/*'` (and arrayrecord-verify, and the MatchFiles transform) left out, without
  a word, every input whose name holds a backslash (`C:\\data\\train.tfrecord`, a legal name here, from a
  Windows tool's archive): Beam's glob translates `*` to `[^/\\\\]*`. The dataset lacked the shard, and
  verify said "1/1 shard(s) match"; gs:// patterns likewise. Local patterns now also take what Python's (and the
  shell's) glob matches; gs:// ones filter Beam's one listing of the prefix with `*` as `[^/]*`.
- `loader.restore_state("params.h5", it)` (model weights given by mistake) read the whole file into memory
  before refusing it: 6 GB of RAM and 20 s for a 3 GB file, an out-of-memory kill for a bigger one. A file of
  over 16 MiB without save_state's format line in its first 64 KiB is now refused after reading 16 MiB.

Checked and already handled in this round (no test added, each ran for real): ArrayRecord shards truncated to 0
bytes, cut in their last chunk, replaced by another shard of the same size, deleted or replaced by a folder while
an iterator (0 and 2 workers) read them, and a state restored after each (one line naming the file and what to
do, or the pipeline mismatch); an Orbax process file that is empty, cut short, JSON of the wrong type or a
save_state file; --writer-options out of range, repeated, conflicting or unknown; a gs:// output at a bucket's
root; arrayrecord-verify of a gs:// output with a shard deleted or replaced by garbage; a gs:// --skip-existing
over a 0-byte object at an output name; a second convert (--overwrite) started while the first wrote its
shards, into the same folder and through a link to it (refused in one line naming the holder); a disk that
fills at the last shard or at the manifest (one line, the incomplete marker left, no temp); verify of, and
--skip-existing into, a dataset on a read-only mount; inputs named with spaces, quotes, ';', a zero-width space,
ESC and BEL, with --workers 2 (converted, verified; control characters escaped in every line); a DataLoader
state restored into a dataset iterator through the Orbax handler, and the reverse.

Not tested: a case-insensitive output filesystem, where `X.tfrecord` and `x.tfrecord` map to one output, could
not be made here (no vfat or casefold ext4).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import faults_testing as ft
import gcs_emulator as emu
import loader
from converter.options import ConvertOptions
from dataflow import checks, flags
from loader import checkpoint
from pipelines import convert

pytestmark = pytest.mark.timeout(300)

PROCESS_FILE = "process_0-of-1.json"


def _iterator(steps: int = 1):
  it = iter(loader.MapDataset.range(100).shuffle(seed=3).batch(4).to_iter_dataset())
  for _ in range(steps):
    next(it)
  return it


def _restore_error(folder: pathlib.Path) -> BaseException:
  """CheckpointHandler.restore's error for `folder` (a hang fails the test instead of waiting for ever)."""
  error = ft.in_time(lambda: checkpoint.CheckpointHandler().restore(folder, item=_iterator(0)), 20)
  assert error is not None, "restored"
  return error


@pytest.mark.parametrize("kind", ["fifo", "folder", "broken link", "link loop"])
def test_an_orbax_process_file_that_is_no_regular_file_is_named_and_never_blocks(tmp_path, kind):
  folder = tmp_path / "ckpt" / "7" / "data_iter"
  folder.mkdir(parents=True)
  path = folder / PROCESS_FILE
  says = {"fifo": "is a FIFO (named pipe)", "folder": "is a directory",
          "broken link": f"is a broken symbolic link (to {str(tmp_path / 'scratch' / 'state.json')!r}",
          "link loop": "is a symbolic link that leads back to itself"}[kind]
  if kind == "fifo":
    os.mkfifo(path)  # Was: restore waited for ever for a writer.
  elif kind == "folder":
    path.mkdir()  # Was: a bare "[Errno 21] Is a directory: '.../process_0-of-1.json'".
  elif kind == "broken link":
    path.symlink_to(tmp_path / "scratch" / "state.json")  # Was: "does not exist; the checkpoint holds
  else:                                                    # process_0-of-1.json: ... another process count".
    path.symlink_to(PROCESS_FILE)
  error = _restore_error(folder)
  message = str(error)
  assert isinstance(error, ValueError), repr(error)
  assert "\n" not in message and message.startswith(f"Cannot restore the iterator state from {path}: it {says}")
  assert message.endswith("or restore another checkpoint step."), message
  assert "process count" not in message and "does not exist;" not in message
  # Orbax v1's protocol (OrbaxCheckpointable.load's coroutine) reads through the same check.
  error = ft.in_time(lambda: asyncio.run(checkpoint.background_load(folder, lambda text: None)), 20)
  assert isinstance(error, ValueError) and str(error) == message, repr(error)
  assert os.path.lexists(path)  # Left as it was.


def test_an_orbax_process_file_of_another_process_count_still_says_so(tmp_path):
  folder = tmp_path / "data_iter"
  folder.mkdir()
  (folder / "process_0-of-4.json").write_text(checkpoint.state_text(_iterator()))
  error = _restore_error(folder)
  assert isinstance(error, ValueError) and "saved by a job of another process count" in str(error), repr(error)


_SAVE_AGAIN_OVER_LIMIT = textwrap.dedent("""
    import pathlib, resource, sys
    import loader
    from loader import checkpoint
    folder = pathlib.Path(sys.argv[1])
    it = iter(loader.MapDataset.range(100).shuffle(seed=3).batch(4).to_iter_dataset())
    next(it)
    checkpoint.CheckpointHandler().save(folder, item=it)  # The first save of this step.
    next(it)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60, 60))  # Smaller than the state file.
    try:
      checkpoint.CheckpointHandler().save(folder, item=it)  # Saved again: a retry.
    except OSError as e:
      print(e)
""")


def test_an_orbax_save_that_fails_keeps_the_state_already_there_and_no_temp(tmp_path):
  folder = tmp_path / "ckpt" / "3" / "data_iter"
  folder.mkdir(parents=True)
  r = subprocess.run([sys.executable, "-c", _SAVE_AGAIN_OVER_LIMIT, str(folder)], env=ft.env(), capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  line = ft.one_line(r.stdout)
  path = folder / PROCESS_FILE
  assert line.startswith(f"[Errno 27] File too large: cannot save the iterator state to {path}; the file is "
                         "unchanged."), line
  assert "ulimit -f" in line
  # Was: the file was truncated by the failed write and then deleted; the first save's state is there.
  assert os.listdir(folder) == [PROCESS_FILE]
  it = _iterator(0)
  checkpoint.CheckpointHandler().restore(folder, item=it)
  assert it.get_state() == _iterator(1).get_state()


def test_an_orbax_save_replaces_a_link_at_the_process_file_not_what_it_points_to(tmp_path):
  folder = tmp_path / "data_iter"
  folder.mkdir()
  weights = tmp_path / "weights.bin"
  weights.write_bytes(b"model weights")
  (folder / PROCESS_FILE).symlink_to(weights)
  it = _iterator(2)
  checkpoint.CheckpointHandler().save(folder, item=it)
  assert weights.read_bytes() == b"model weights"  # Was: replaced by the iterator's state.
  assert not (folder / PROCESS_FILE).is_symlink()
  assert sorted(os.listdir(folder)) == [PROCESS_FILE]
  restored = _iterator(0)
  checkpoint.CheckpointHandler().restore(folder, item=restored)
  assert restored.get_state() == it.get_state()
  (folder / "sub").mkdir()
  with pytest.raises(IsADirectoryError) as e:  # A folder at the name is named, and left alone.
    checkpoint._write_process_file(folder / "sub", "{}")  # pylint: disable=protected-access
  assert "a folder has its name" in str(e.value) and "\n" not in str(e.value)
  assert (folder / "sub").is_dir()


@pytest.mark.parametrize("given,meant", [
    ("state.json\n", "state.json"), ("ckpt\n/state.json", "ckpt/state.json"), ("state.json ", "state.json"),
    ("step_100\r\n/state.json", "step_100/state.json")])
def test_a_state_path_with_a_line_break_at_a_names_end_is_refused_not_saved_under_another_name(tmp_path, given,
                                                                                             meant):
  it = _iterator()
  path = str(tmp_path / "run") + os.sep + given
  with pytest.raises(ValueError) as e:
    loader.save_state(path, it)
  message = str(e.value)
  assert "\n" not in message and repr(path) in message, message
  assert f"strip it ({str(tmp_path / 'run' / meant)!r})" in message, message
  assert not (tmp_path / "run").exists()  # Was: saved as a file or folder whose name ends in the line break.
  # The path as the user sees it is where the state goes once stripped; a restore of the unstripped one says so.
  loader.save_state(str(tmp_path / "run" / meant), it)
  with pytest.raises(FileNotFoundError) as e:
    loader.restore_state(path, _iterator(0))
  message = str(e.value)
  assert "\n" not in message and "strip it" in message and "fresh iterator" not in message, message
  assert loader.restore_state(str(tmp_path / "run" / meant), _iterator(0)) == it.get_state()


def test_a_state_path_whose_odd_name_exists_already_is_the_users_to_have(tmp_path):
  folder = tmp_path / "My Drive "  # A folder a user made with a space at its end: saving into it works.
  folder.mkdir()
  it = _iterator()
  loader.save_state(folder / "state.json", it)
  assert loader.restore_state(folder / "state.json", _iterator(0)) == it.get_state()


def test_an_output_with_a_line_break_at_its_end_is_refused_before_anything_is_made(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  work = tmp_path / "work"
  work.mkdir()
  for output, meant in ((str(tmp_path / "out") + "\n", str(tmp_path / "out")), ("out\n", "out"),
                       ("out\r\n", "out"), ("\tout", "out"), ("new\n/out", "new/out")):
    p = subprocess.run([sys.executable, "-m", "pipelines.convert", "--input", str(tmp_path / "in" / "*"),
                        "--output", output, "--quiet"], cwd=work, env=ft.env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, p.stderr
    line = ft.one_line(p.stderr)
    assert line == (f"arrayrecord-convert: error: output_dir {output!r}: a name in it has a line break or tab at "
                    f"an end, which would become part of a folder's name: strip it (--output {meant!r})."), line
    # Was: converted into a new folder 'out\n' ("Output: out\n").
    assert os.listdir(work) == [] and sorted(os.listdir(tmp_path)) == ["in", "work"]
  p = ft.run_cli("pipelines.convert", "--input", str(tmp_path / "in" / "*"), "--output", str(tmp_path / "out"),
                 "--quiet")
  assert p.returncode == 0, p.stderr


def test_an_input_pattern_with_a_blank_at_its_end_says_to_strip_it(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  for pattern in (str(tmp_path / "in" / "*") + "\n", str(tmp_path / "in" / "*") + " ",
                  str(tmp_path / "in" / "ds.tfrecord-00000-of-00002") + "\r"):
    p = ft.run_cli("pipelines.convert", "--input", pattern, "--output", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 2, p.stderr
    line = ft.one_line(p.stderr)
    assert line == (f"arrayrecord-convert: error: No files match the input pattern {pattern!r}. It has a space or "
                    "line break at an end, which is part of the pattern: strip it "
                    f"(--input {pattern.strip()!r})."), line
    assert not (tmp_path / "out").exists()


def test_an_existing_output_folder_with_a_line_break_in_its_name_is_still_converted_into(tmp_path):
  # Refused only when it would be made: a folder of that name the user has is theirs to name.
  ft.make_dataset(str(tmp_path / "in"), 1, 3, 16)
  out = str(tmp_path / "out") + "\n"
  os.mkdir(out)
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", out, "--quiet"]) == 0
  assert len(loader.ArrayRecordSource(out)) == 3


@pytest.mark.parametrize("output,single", [("gs://my-bucket//ar", "gs://my-bucket/ar"),
                                           ("gs://my-bucket/ar//train/", "gs://my-bucket/ar/train/")])
def test_a_gcs_output_with_an_empty_folder_name_is_refused_offline(output, single):
  with pytest.raises(ValueError) as e:
    ConvertOptions(output)
  message = str(e.value)
  assert "\n" not in message and "empty folder name ('//')" in message, message
  assert f"(--output {single})" in message, message
  # arrayrecord-dataflow refuses it offline too (it submitted a job writing gs://my-bucket//ar/... objects).
  error = ft.in_time(lambda: flags.parse(
      ["--input", "gs://my-bucket/tfr/train-*", "--output", output, "--project", "my-project", "--region",
       "us-central1", "--temp_location", "gs://my-bucket/tmp"]), 20)
  assert isinstance(error, checks.FlagError) and message in str(error), repr(error)
  # One slash, or a trailing one, is fine.
  for fine in (single, "gs://my-bucket/ar/", "gs://my-bucket/ar//"):
    assert ConvertOptions(fine).output_dir == fine
  assert ConvertOptions("out//ar").output_dir == "out//ar"  # Local paths: the system reads '//' as '/'.


def test_the_migration_apis_refuse_an_output_with_a_line_break_in_a_name_before_anything_is_made(tmp_path):
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  import pipelines  # pylint: disable=g-import-not-at-top
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  args = {"input": str(tmp_path / "in" / "*"), "output": str(tmp_path / "run\n" / "out")}
  for build in (lambda: pipelines.convert_tf_to_arrayrecord_disk(num_shards=2, args=args,
                                                                 pipeline_options=PipelineOptions([])),
                lambda: pipelines.convert_tf_to_arrayrecord_disk_match_shards(args=args,
                                                                              pipeline_options=PipelineOptions([]))):
    with pytest.raises(ValueError) as e:
      build().run().wait_until_finish()
    assert "\n" not in str(e.value).replace(repr(args["output"]), "")
    assert f"strip it (--output {str(tmp_path / 'run' / 'out')!r})" in str(e.value), str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["in"]  # Was: a folder 'run\n' holding the shards.


def test_verify_of_an_output_with_a_line_break_at_its_end_says_to_strip_it(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 1, 3, 16)
  out = str(tmp_path / "out")
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", out, "--quiet"]) == 0
  p = ft.run_cli("pipelines.verify", "--input", str(tmp_path / "in" / "*"), "--output", out + "\n")
  assert p.returncode == 2
  # Was: "--output <out>\n does not exist: give the directory the conversion wrote".
  assert ft.one_line(p.stderr) == (f"arrayrecord-verify: error: --output {out + chr(10)!r} does not exist: it has a "
                                   f"space or line break at an end; strip it (--output {out!r}).")
  p = ft.run_cli("pipelines.verify", "--input", str(tmp_path / "in" / "*"), "--output", out)
  assert p.returncode == 0, p.stdout + p.stderr


def test_a_shard_cut_in_its_last_chunk_is_named_without_an_empty_reader_status(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 2, 200, 100)
  out = str(tmp_path / "out")
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", out, "--quiet"]) == 0
  src = loader.ArrayRecordSource(out)
  shard = os.path.join(out, "ds.array_record-00001-of-00002")
  with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) // 2)  # An interrupted copy: its footer and index are gone.
  with pytest.raises(RuntimeError) as e:
    src[250]
  assert "changed after the ArrayRecordSource was created" in str(e.value)
  with pytest.raises(ValueError) as e:
    loader.ArrayRecordSource(out)[250]
  message = str(e.value)
  assert message.startswith(f"{shard} cannot be read as an ArrayRecord file: it starts like one but its end cannot "
                            "be read"), message
  assert "copy or convert it again" in message and "(reader: )" not in message, message  # Was "... (reader: )."


def test_a_dry_run_dir_with_a_line_break_in_a_name_is_refused_offline(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  good = ["--input", "gs://my-bucket/tfr/train-*", "--output", "gs://my-bucket/ar", "--project", "my-project",
          "--region", "us-central1", "--temp_location", "gs://my-bucket/tmp"]
  for given, meant in (("dry\n", "dry"), ("runs\n/dry", "runs/dry")):
    error = ft.in_time(lambda: flags.parse(good + ["--dry-run-dir", given]), 20)  # pylint: disable=cell-var-from-loop
    assert isinstance(error, checks.FlagError), repr(error)
    assert str(error) == (f"--dry-run-dir {given!r}: a name in it has a line break or tab at an end, which would "
                          f"become part of a folder's name: strip it (--dry-run-dir {meant!r})."), str(error)
  assert os.listdir(tmp_path) == []
  assert flags.parse(good + ["--dry-run-dir", "dry"]).dry_run_dir == str(tmp_path / "dry")


def _packed(tmp_path, kind: str, source: str) -> str:
  """`source` compressed or archived as `kind`, with Python's own modules (the formats' real encoders)."""
  import bz2, lzma, tarfile, zipfile  # pylint: disable=g-import-not-at-top,multiple-imports
  data = open(source, "rb").read()
  folder = tmp_path / "packed"
  folder.mkdir(exist_ok=True)
  if kind == "bzip2":
    path = folder / "x.tfrecord.bz2"
    path.write_bytes(bz2.compress(data))
  elif kind == "xz":
    path = folder / "x.tfrecord"  # No suffix says what it is: the bytes do.
    path.write_bytes(lzma.compress(data))
  elif kind == "zip":
    path = folder / "x.tfrecord.zip"
    with zipfile.ZipFile(path, "w") as z:
      z.write(source, "x.tfrecord")
  else:
    path = folder / ("x.tfrecord.tar.gz" if kind == "tar.gz" else "x.tfrecord.tar")
    with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as t:
      t.add(source, "x.tfrecord")
  return str(path)


@pytest.mark.parametrize("kind,says,command", [
    ("bzip2", "a bzip2-compressed file", "bzip2 -dc {p} > {d}/x.tfrecord"),
    ("xz", "an xz-compressed file", "xz -dc {p} > {p}.decompressed"),
    ("zip", "a ZIP archive", "unzip {p}"),
    ("tar", "a tar archive", "tar -xf {p}"),
    ("tar.gz", "a tar archive inside its GZIP compression", "tar -xf {p}")])
def test_an_input_of_another_compression_or_an_archive_is_named_with_the_command_that_unpacks_it(tmp_path, kind,
                                                                                               says, command):
  source = ft.write_tfrecords(tmp_path / "src" / "x.tfrecord", [bytes([i]) * 300 for i in range(20)])
  path = _packed(tmp_path, kind, source)
  command = command.format(p=path, d=os.path.dirname(path))
  for mode in ("fail", "skip"):
    p = ft.run_cli("pipelines.convert", "--input", path, "--output", str(tmp_path / f"out-{mode}"), "--quiet",
                   "--on-corrupt", mode)
    assert p.returncode == 1, p.stdout + p.stderr
    # Skip mode converts the other inputs and names a failed one in its summary: a FAILED line.
    line = ft.one_line(p.stderr) if mode == "fail" else next(
        l for l in p.stdout.splitlines() if l.startswith(f"FAILED {path}: "))
    # Was: "not a TFRecord file: no valid record header in its first 1,234 bytes; it starts with b'BZh91AY&SY...'"
    # (bzip2, xz, ZIP), and for a tar archive "record 0 at byte offset 0 is corrupt: length checksum mismatch
    # ... or convert with --on-corrupt skip"; skip mode then read the records inside the archive and failed at
    # its zero padding, advising to cut the archive there ("truncate -s 23712 FILE") and rerun.
    assert (f"{path} is not a TFRecord file: it is {says}, which this converter does not read (it reads TFRecord "
            f"files, plain or GZIP/ZLIB-compressed): unpack it first ({command}) and convert what that gives. "
            "Nothing was written for this file.") in line, line
    assert ft.published(str(tmp_path / f"out-{mode}")) == [] and ft.temps(str(tmp_path / f"out-{mode}")) == []
  if kind == "bzip2":  # The command it gives works, and what it gives converts.
    subprocess.run(command, shell=True, check=True)
    p = ft.run_cli("pipelines.convert", "--input", os.path.join(os.path.dirname(path), "x.tfrecord"), "--output",
                   str(tmp_path / "out-unpacked"), "--quiet")
    assert p.returncode == 0, p.stderr
    assert len(loader.ArrayRecordSource(str(tmp_path / "out-unpacked"))) == 20


def test_a_damaged_tfrecord_file_is_not_taken_for_an_archive(tmp_path):
  path = ft.write_tfrecords(tmp_path / "in" / "x.tfrecord", [bytes([i]) * 300 for i in range(20)])
  with open(path, "r+b") as f:
    f.write(b"BZh")  # Its first header damaged, by chance into bzip2's first bytes (not its block magic).
  p = ft.run_cli("pipelines.convert", "--input", path, "--output", str(tmp_path / "out"), "--quiet")
  assert p.returncode == 1
  line = ft.one_line(p.stderr)
  assert "record 0 at byte offset 0 is corrupt: length checksum mismatch" in line and "bzip2" not in line, line
  p = ft.run_cli("pipelines.convert", "--input", path, "--output", str(tmp_path / "out"), "--quiet",
                 "--on-corrupt", "skip", "--overwrite")
  assert p.returncode == 0, p.stderr
  assert len(loader.ArrayRecordSource(str(tmp_path / "out"))) == 19


def test_a_multi_gigabyte_file_given_as_a_state_is_refused_without_reading_it_whole(tmp_path):
  weights = tmp_path / "params.h5"
  with open(weights, "wb") as f:
    f.write(b"\x89HDF\r\n\x1a\n")
    f.truncate(3 << 30)  # Sparse: 3 GB that take no disk.
  code = textwrap.dedent("""
      import resource, sys
      import loader
      resource.setrlimit(resource.RLIMIT_AS, (1 << 30, resource.RLIM_INFINITY))  # Reading it whole cannot fit.
      try:
        loader.restore_state(sys.argv[1], iter(loader.MapDataset.range(3).to_iter_dataset()))
      except ValueError as e:
        print(e)
  """)
  r = subprocess.run([sys.executable, "-c", code, str(weights)], env=ft.env(), capture_output=True, text=True,
                     timeout=120)
  # Was: read whole into memory (6 GB of RAM, 20 s) before "not UTF-8 text: byte 0 is b'\\x89'"; here, a
  # MemoryError under the 1 GB limit.
  assert r.returncode == 0, r.stderr
  line = ft.one_line(r.stdout)
  assert line.startswith(f"{weights} is not a loader state file (3,221,225,472 bytes, starting with b'\\x89HDF"), line
  assert "model weights or another file?" in line and "pass the file save_state wrote" in line, line


class _BigStateIterator:
  def __init__(self, n: int):
    self.state = {"positions": list(range(n))}

  def get_state(self):
    return self.state

  def set_state(self, state):
    self.state = state


def test_a_state_file_bigger_than_the_peek_still_restores(tmp_path, monkeypatch):
  it = _BigStateIterator(2_000_000)  # Over 16 MiB of JSON.
  loader.save_state(tmp_path / "state.json", it)
  assert os.path.getsize(tmp_path / "state.json") > 16 << 20  # Read whole: its format line is at its start.
  restored = _BigStateIterator(0)
  opened = []
  real_open = os.open
  def counting_open(path, *args, **kwargs):
    opened.append(os.fspath(path))
    return real_open(path, *args, **kwargs)
  monkeypatch.setattr(os, "open", counting_open)
  loader.restore_state(tmp_path / "state.json", restored)
  monkeypatch.undo()
  assert restored.state == it.state
  # Opened and read once: its first 16 MiB are checked, then the rest read from the same handle.
  assert opened == [str(tmp_path / "state.json")], opened


def test_a_wildcard_matches_input_names_that_hold_a_backslash(tmp_path):
  inp = tmp_path / "in"
  ft.write_tfrecords(inp / "plain.tfrecord", [b"p" * 50] * 3)
  ft.write_tfrecords(inp / "C:\\data\\train.tfrecord", [b"w" * 50] * 4)  # One name, from a Windows tool's archive.
  ft.write_tfrecords(inp / ".hidden\\x.tfrecord", [b"h" * 50] * 5)  # Hidden: a wildcard leaves it out.
  out = str(tmp_path / "out")
  for workers in ("1", "2"):
    p = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", out, "--quiet", "--workers", workers,
                   "--overwrite")
    assert p.returncode == 0, p.stderr
    # Was: "Converted 1 file(s)": Beam's `*` never matches a backslash, and the shard was left out without a word.
    assert p.stdout.startswith("Converted 2 file(s)"), p.stdout
    assert sorted(ft.published(out)) == ["C:\\data\\train.array_record", "plain.array_record"]
    assert len(loader.ArrayRecordSource(out)) == 7
  v = ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", out)
  assert v.returncode == 0 and v.stdout.splitlines()[-1] == "2/2 shard(s) match (7 records).", v.stdout
  p = ft.run_cli("pipelines.convert", "--input", str(inp / "*\\*"), "--output", str(tmp_path / "out2"), "--quiet")
  assert p.returncode == 0 and p.stdout.startswith("Converted 1 file(s)"), p.stdout + p.stderr


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The local GCS emulator with one bucket; the environment points Beam and google-cloud-storage at it."""
  folder = str(tmp_path_factory.mktemp("round24-gcs"))
  server = emu.Emulator(folder).start()
  with pytest.MonkeyPatch.context() as mp:
    for key, value in emu.emulator_env(server.host, folder).items():
      mp.setenv(key, value)
    try:
      emu.client().create_bucket(emu.BUCKET)
      yield folder
    finally:
      server.stop()


def test_a_gcs_wildcard_matches_object_names_that_hold_a_backslash(gcs):
  b = f"gs://{emu.BUCKET}/r24"
  local = ft.write_tfrecords(os.path.join(gcs, "x.tfrecord"), [b"g" * 40] * 3)
  for name in ("tfr/plain.tfrecord", "tfr/C:\\data\\train.tfrecord", "tfr/sub/deeper.tfrecord"):
    emu.upload(local, f"{b}/{name}")
  r = ft.run_cli("pipelines.convert", "--input", f"{b}/tfr/*", "--output", f"{b}/out", "--quiet", "--workers", "1",
                 "--project", emu.PROJECT, timeout=240)
  assert r.returncode == 0, r.stderr
  # Was: "Converted 1 file(s)"; the backslash one was left out without a word. `*` still stops at a '/'.
  assert r.stdout.startswith("Converted 2 file(s)"), r.stdout
  assert sorted(o for o in emu.list_objects(f"{b}/out/") if o.endswith(".array_record")) == [
      f"{b}/out/C:\\data\\train.array_record", f"{b}/out/plain.array_record"]
  v = ft.run_cli("pipelines.verify", "--input", f"{b}/tfr/*", "--output", f"{b}/out", timeout=240)
  assert v.returncode == 0 and v.stdout.splitlines()[-1] == "2/2 shard(s) match (6 records).", v.stdout + v.stderr
  r = ft.run_cli("pipelines.convert", "--input", f"{b}/nothing/*", "--output", f"{b}/out2", "--quiet", "--workers",
                 "1", "--project", emu.PROJECT, timeout=240)
  assert r.returncode == 2 and "No files match the input pattern" in ft.one_line(r.stderr), r.stderr
