"""Round 28 of the fault audit (conversion side): input globs that drop or misname shards, a Python-API resume in
place, a --skip-existing resume with no manifest over another split's shards, a full disk under the PTransform,
and the whole process group of an in-place run killed with SIGKILL.

Found by the 2026-12-06 fault audit, each case run against the real CLI or Beam pipeline (each test accepts either
a fix that converts or a one-line refusal naming the file). All fixed the same day: the output folder's TFRecord
files are inputs wherever it is (only its ArrayRecord files are outputs); local globs are matched as bash's
globstar matches them (`**/` also no folder, never entering linked folders; `?` never crossing '/'), gs:// ones
too for `**/`; `MatchFiles(patterns, skip_under=output_dir)` leaves out the output folder's own files as the
CLI does (arrayrecord-dataflow passes it), and an ArrayRecord file listed as an input is refused as one with
that advice; a kept output that no manifest entry describes is refused when its first record is not its
input's. What the audit saw:

- `arrayrecord-convert --input 'data/*/*.tfrecord' --output data/a` (the output folder is one of the folders the
  glob lists, and holds inputs) converted data/b's shards and silently left out data/a/x.tfrecord, which the
  pattern matched: "Converted 1 file(s)", exit 0, a dataset short of a shard. `_GlobFilter` skips every file
  under an output folder strictly inside the listed folder, not only the ArrayRecord files there (as it does
  when converting in place).
- The same with every input in that folder said "No files match ... Only the output folder's own files are
  there (1 ArrayRecord file(s) in data/shards), and those are never inputs: give the TFRecord files": the file
  it calls an ArrayRecord file is the TFRecord input, and the advice sends the user to give what they gave.
- `--input 'in/**/*.tfrecord'` left out in/a.tfrecord (Beam's `**/` needs at least one folder; the shell's
  globstar, Python's glob and `find` match zero): exit 0, a shard missing, no word.
- `--input 'in/a?b.tfrecord'` matched in/a/b.tfrecord (Beam's `?` is regex `.`, which crosses '/'), a file the
  shell's and Python's glob never give for that pattern, and would convert it into the dataset.
- The Python API resuming a conversion in place, `MatchFiles(["in/*"]) | ConvertToArrayRecord("in",
  existing="skip")` (or "overwrite"), was refused with "Output 'in/x.array_record-...' would overwrite the input
  'in/x.array_record-...' (the same file on disk); choose another --output": the earlier run's output taken for
  an input, a flag the API does not have, and advice that does not resume. The CLI's glob leaves those out.
- `--input 'in/**'` over a folder holding two links to itself (`latest -> .`, `current -> .`) never ended and
  printed nothing: Beam lists the folder at once, but match_pattern's own glob.glob(..., recursive=True) (the
  scan for broken links and backslash names) follows linked folders, 2**40 paths deep. With one such link it
  refused the run naming `in/latest/latest/.../latest` (40 levels) as "a symbolic link that leads back to itself".
- `--skip-existing` into a folder whose manifest.json is gone (deleted, or the shards copied without it)
  kept another split's shards of the same names as this split's conversion: "kept 2 existing", exit 0, and a
  complete manifest that names valid/*'s inputs over train/*'s records. Nothing records which input an
  output came from, and the time check only redoes outputs older than their inputs.

Checked and found sound (kept here so they stay so): a disk that fills during a ConvertToArrayRecord pipeline
(no CLI guard, no free-space check) names the shard, leaves no temp and the run's marker, and resumes with
existing='skip' once space is freed; SIGKILL to the whole process group of an in-place run with worker
processes, then a rerun with the same glob and --skip-existing (inputs byte for byte unchanged, no temp, no
lock, no worker left); --overwrite over a symbolic link at an output name replaces the link, never the file it
points to; a resume given the output folder by another spelling (absolute, trailing slash) keeps the shards; a
GZIP input that holds no TFRecord, and forced --compression zlib/none over a GZIP input, are one line each and
leave no folder.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import time

import pytest

import faults_testing as ft
from loader import ondisk
from pipelines import convert

CONVERT = "pipelines.convert"


def records(tag: str, n: int = 5) -> list[bytes]:
  return [f"{tag}-{i}".encode() for i in range(n)]


def run(*args: str) -> int:
  return convert.main([*args, "--quiet", "--workers", "1"])


def group_alive(pgid: int) -> bool:
  """Whether any live process is in process group `pgid` (Linux /proc)."""
  for p in os.listdir("/proc"):
    if p.isdigit():
      fields = ft._stat_fields(int(p))  # pylint: disable=protected-access
      if fields and fields[2] == str(pgid) and fields[0] != "Z":
        return True
  return False


def sha(path) -> str:
  return hashlib.sha256(open(path, "rb").read()).hexdigest()


# --- Violations -------------------------------------------------------------------------------------------


def test_an_input_in_an_output_folder_the_glob_lists_is_converted_or_named_never_dropped(tmp_path, capsys, ar_read):
  # data/a holds an input and is the output folder; the glob lists data/*/ (both folders).
  data = tmp_path / "data"
  ft.write_tfrecords(data / "a" / "x.tfrecord", records("a"))
  ft.write_tfrecords(data / "b" / "y.tfrecord", records("b"))
  rc = run("--input", str(data / "*" / "*.tfrecord"), "--output", str(data / "a"))
  cap = capsys.readouterr()
  if rc != 0:  # A refusal must name the input it would not take.
    assert "x.tfrecord" in ft.one_line(cap.err)
    return
  shards = json.loads((data / "a" / "manifest.json").read_text())["shards"]
  converted = sorted(os.path.basename(s["input"]) for s in shards)
  assert converted == ["x.tfrecord", "y.tfrecord"], (
      f"data/a/x.tfrecord matches the --input glob but was silently left out (exit 0): {cap.out}")


def test_tfrecord_inputs_in_an_output_folder_the_glob_lists_are_not_called_array_record_files(tmp_path, capsys):
  data = tmp_path / "data"
  ft.write_tfrecords(data / "shards" / "x.tfrecord", records("x"))
  before = sha(data / "shards" / "x.tfrecord")
  rc = run("--input", str(data / "*" / "*.tfrecord"), "--output", str(data / "shards"))
  err = capsys.readouterr().err
  assert sha(data / "shards" / "x.tfrecord") == before
  if rc == 0:  # Converted in place, as --input 'data/shards/*' does.
    assert (data / "shards" / "x.array_record").exists()
    return
  line = ft.one_line(err)
  # x.tfrecord is a TFRecord file (the input), not "the output folder's own" ArrayRecord file.
  assert "ArrayRecord file(s)" not in line and "give the TFRecord files" not in line, line


def test_a_double_star_glob_also_matches_the_files_at_its_top_as_the_shell_and_python_do(tmp_path, capsys):
  import glob
  inp = tmp_path / "in"
  ft.write_tfrecords(inp / "a.tfrecord", records("a"))
  ft.write_tfrecords(inp / "sub" / "b.tfrecord", records("b"))
  pattern = str(inp / "**" / "*.tfrecord")
  assert len(glob.glob(pattern, recursive=True)) == 2  # What Python (and bash's globstar, find) match.
  out = tmp_path / "out"
  rc = run("--input", pattern, "--output", str(out))
  cap = capsys.readouterr()
  if rc != 0:
    assert "a.tfrecord" in ft.one_line(cap.err)
    return
  shards = json.loads((out / "manifest.json").read_text())["shards"]
  assert sorted(os.path.basename(s["input"]) for s in shards) == ["a.tfrecord", "b.tfrecord"], (
      f"in/a.tfrecord matches {pattern!r} but was silently left out (exit 0): {cap.out}")


def test_a_question_mark_in_a_pattern_never_matches_a_folder_separator(tmp_path):
  # Beam translates `?` to regex `.`, which matches '/': `in/a?b.tfrecord` took in/a/b.tfrecord (a file of a
  # subfolder, which the shell's and Python's `?` never reach) and would convert it into the dataset.
  import glob
  from converter import expand_patterns
  from converter.errors import NoInputFilesError
  ft.write_tfrecords(tmp_path / "in" / "a" / "b.tfrecord", records("b"))
  pattern = str(tmp_path / "in" / "a?b.tfrecord")
  assert glob.glob(pattern) == []
  try:
    got = expand_patterns([pattern])
  except NoInputFilesError:
    return
  pytest.fail(f"{pattern!r} matched {got} (a file in a subfolder: `?` crossed a '/')")


def test_the_python_api_resuming_in_place_is_not_told_its_outputs_are_its_inputs(tmp_path, ar_read):
  import apache_beam as beam
  from converter import ConversionError, ConvertToArrayRecord, MatchFiles
  inp = tmp_path / "in"
  recs = {f"x.tfrecord-{s:05d}-of-00002": records(f"s{s}") for s in range(2)}
  for name, r in recs.items():
    ft.write_tfrecords(inp / name, r)

  def convert_in_place(existing):
    with beam.Pipeline() as p:
      _ = p | MatchFiles([str(inp / "*")]) | ConvertToArrayRecord(str(inp), existing=existing)

  convert_in_place("error")
  for name, r in recs.items():
    assert ar_read(str(inp / ft.out_name(name))) == r
  try:
    convert_in_place("skip")  # The README's resume, with the README's MatchFiles over the same folder.
  except ConversionError as e:
    # A refusal, if any, must not call the run's own outputs inputs, nor advise a flag the API lacks.
    assert "would overwrite the input" not in str(e), str(e)
  else:
    m = json.loads((inp / "manifest.json").read_text())
    assert sorted(os.path.basename(s["input"]) for s in m["shards"]) == sorted(recs)


def test_match_files_told_the_output_folder_resumes_a_conversion_in_place(tmp_path, ar_read):
  import apache_beam as beam
  from converter import ConvertToArrayRecord, MatchFiles
  inp = tmp_path / "in"
  recs = {f"x.tfrecord-{s:05d}-of-00002": records(f"s{s}") for s in range(2)}
  for name, r in recs.items():
    ft.write_tfrecords(inp / name, r)

  def convert_in_place(existing):
    with beam.Pipeline() as p:
      _ = p | MatchFiles([str(inp / "*")], skip_under=str(inp)) | ConvertToArrayRecord(str(inp), existing=existing)

  convert_in_place("error")
  last = sorted(recs)[1]
  os.remove(inp / ft.out_name(last))  # As a run stopped before its last shard leaves it.
  convert_in_place("skip")
  m = json.loads((inp / "manifest.json").read_text())
  assert sorted((os.path.basename(s["input"]), s["status"]) for s in m["shards"]) == [
      (sorted(recs)[0], "existing"), (last, "converted")]
  for name, r in recs.items():
    assert ar_read(str(inp / ft.out_name(name))) == r


def test_skip_existing_without_a_manifest_never_keeps_another_splits_shards_as_this_ones(tmp_path, capsys, ar_read,
                                                                                        monkeypatch):
  monkeypatch.chdir(tmp_path)
  splits = {sp: {f"data.tfrecord-{s:05d}-of-00002": records(f"{sp}-{s}") for s in range(2)}
            for sp in ("train", "valid")}
  for sp, shards in splits.items():
    for name, r in shards.items():
      ft.write_tfrecords(tmp_path / sp / name, r)
  time.sleep(0.02)
  assert run("--input", "train/*", "--output", "out") == 0
  (tmp_path / "out" / "manifest.json").unlink()  # Deleted, or the shards copied without it.
  before = {n: sha(tmp_path / "out" / n) for n in os.listdir(tmp_path / "out")}
  capsys.readouterr()
  rc = run("--input", "valid/*", "--output", "out", "--skip-existing")
  cap = capsys.readouterr()
  if rc != 0:  # Refused: one line, train's shards untouched.
    ft.one_line(cap.err)
    assert {n: sha(tmp_path / "out" / n) for n in before} == before
    return
  for name, r in splits["valid"].items():
    got = ar_read(str(tmp_path / "out" / ft.out_name(name)))
    assert got == r, (f"out/ now claims to be valid/*'s conversion (exit 0, {cap.out.splitlines()[0]!r}) but "
                      f"{ft.out_name(name)} holds train's records {got[:2]}...")


def test_a_double_star_glob_over_a_folder_with_links_to_itself_ends_in_time(tmp_path):
  # `latest -> .` and `current -> .` (or one `up -> ..`) beside the shards: Beam lists the folder at once (it
  # does not follow linked folders, nor does bash's globstar), but the extra glob.glob(..., recursive=True) in
  # match_pattern follows every linked folder, 2**40 paths deep, and the CLI never ends or says a word.
  inp = tmp_path / "in"
  ft.write_tfrecords(inp / "a.tfrecord", records("a"))
  os.symlink(".", inp / "latest")
  os.symlink(".", inp / "current")
  import subprocess
  try:
    r = ft.run_cli(CONVERT, "--input", str(inp / "**"), "--output", str(tmp_path / "out"), "--quiet",
                   "--workers", "1", timeout=20)
  except subprocess.TimeoutExpired:
    pytest.fail("arrayrecord-convert --input 'in/**' over a folder holding two links to itself was still listing "
                "after 20 s, without a word (planning.match_pattern's glob.glob follows linked folders)")
  if r.returncode != 0:
    line = ft.one_line(r.stderr)
    assert len(line) < 1000 and ("latest" in line or "current" in line), line
  else:
    shards = json.loads((tmp_path / "out" / "manifest.json").read_text())["shards"]
    assert [os.path.basename(s["input"]) for s in shards] == ["a.tfrecord"]


# --- Checked and sound --------------------------------------------------------------------------------------


def test_a_full_disk_under_the_ptransform_names_the_shard_leaves_no_temp_and_resumes(tmp_path, ar_read):
  import apache_beam as beam
  from converter import ConvertToArrayRecord
  from converter.errors import OutputWriteError
  recs = ft.make_dataset(str(tmp_path / "in"), 3, 300, 1000, seed=3)
  paths = sorted(str(tmp_path / "in" / n) for n in recs)
  with ft.tmpfs(str(tmp_path / "mnt"), "1200k") as mnt:
    filler = os.path.join(mnt, "filler")
    with open(filler, "wb") as f:
      f.write(os.urandom(300 * 1024))
    out = os.path.join(mnt, "out")

    def pipeline(existing):
      with beam.Pipeline() as p:
        _ = p | beam.Create(paths) | ConvertToArrayRecord(out, existing=existing)

    with pytest.raises(OutputWriteError) as e:
      pipeline("error")
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and "ds.array_record-0000" in msg
    assert ft.temps(out) == []
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["status"] == ondisk.INCOMPLETE
    os.remove(filler)
    pipeline("skip")
    assert ft.temps(out) == []
    m = json.loads(open(os.path.join(out, "manifest.json")).read())
    assert m.get("status") != ondisk.INCOMPLETE and m["totals"]["shards"] == 3
    for name, r in recs.items():
      assert ar_read(os.path.join(out, ft.out_name(name))) == r


def test_sigkill_to_an_in_place_runs_whole_group_then_the_same_glob_resumes(tmp_path, ar_read):
  inp = tmp_path / "in"
  recs = ft.make_dataset(str(inp), 4, 6000, 1000, seed=5)
  sums = {n: sha(inp / n) for n in recs}
  args = ["--input", str(inp / "*"), "--output", str(inp), "--quiet", "--workers", "2"]
  proc = ft.start_cli(CONVERT, *args, new_session=True)
  try:
    ft.wait_for(lambda: ft.mid_run(str(inp)), proc, what="a shard published and one half-written")
  finally:
    os.killpg(proc.pid, signal.SIGKILL)  # The OOM killer of a container, `kill -9 -PGID`: no cleanup runs.
    proc.communicate(timeout=60)
  ft.wait_for(lambda: not group_alive(proc.pid), timeout=20, what="the killed group's processes to go")
  assert json.loads((inp / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
  resumed = ft.run_cli(CONVERT, *args[:-2], "--workers", "1", "--skip-existing", timeout=120)
  assert resumed.returncode == 0, resumed.stderr
  assert {n: sha(inp / n) for n in recs} == sums  # The inputs, in the same folder, never touched.
  assert ft.temps(str(inp)) == [] and not (inp / ondisk.LOCK_NAME).exists()
  m = json.loads((inp / "manifest.json").read_text())
  assert m["totals"]["shards"] == 4 and m["totals"]["failed"] == 0
  for name, r in recs.items():
    assert ar_read(str(inp / ft.out_name(name))) == r


def test_overwrite_replaces_a_link_at_an_output_name_and_a_resume_takes_any_spelling_of_the_output(
    tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for s in range(2):
    ft.write_tfrecords(tmp_path / "in" / f"x.tfrecord-{s:05d}-of-00002", records(f"s{s}"))
  assert run("--input", "in/*", "--output", "out") == 0
  assert run("--input", str(tmp_path / "in" / "*"), "--output", str(tmp_path / "out") + "/", "--skip-existing") == 0
  assert "kept 2 existing" in capsys.readouterr().out
  precious = tmp_path / "precious.bin"
  precious.write_bytes(b"the user's own file")
  link = tmp_path / "out" / "x.array_record-00000-of-00002"
  link.unlink()
  link.symlink_to(precious)
  assert run("--input", "in/*", "--output", "out") == 2  # No flag: refused.
  assert link.is_symlink()
  assert run("--input", "in/*", "--output", "out", "--overwrite") == 0
  assert precious.read_bytes() == b"the user's own file" and not link.is_symlink()
  assert ft.temps(str(tmp_path / "out")) == []


def test_gzip_inputs_that_hold_no_tfrecord_or_meet_a_wrong_compression_flag_are_one_line_and_leave_nothing(
    tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  raw = ft.write_tfrecords(tmp_path / "raw" / "a.tfrecord", records("a"))
  (tmp_path / "in").mkdir()
  (tmp_path / "in" / "a.tfrecord.gz").write_bytes(gzip.compress(open(raw, "rb").read()))
  (tmp_path / "in" / "c.tfrecord.gz").write_bytes(gzip.compress(b"id,label\n1,2\n" * 20))
  capsys.readouterr()
  assert run("--input", "in/c.tfrecord.gz", "--output", "o1") == 1
  line = ft.one_line(capsys.readouterr().err)
  assert "c.tfrecord.gz is not a TFRecord file" in line and "after decompression" in line
  for flag in ("zlib", "none"):
    assert run("--input", "in/a.tfrecord.gz", "--output", "o2", "--compression", flag) == 2
    line = ft.one_line(capsys.readouterr().err)
    assert "a.tfrecord.gz" in line and "gzip" in line and "--compression auto" in line
  assert sorted(os.listdir(tmp_path)) == ["in", "raw"]  # No output folder, lock or temp left.
