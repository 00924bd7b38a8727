"""Round 26 of the fault audit (conversion side): glob patterns with literal brackets, a gs:// input that
vanishes between its listing and its reading, a kept shard's input or output deleted during a resume, kill
-9 then a rerun without and with --overwrite, a full disk at the manifest, a huge single record, and names
that differ only in Unicode normalization, case or compression suffix.

Found by the 2026-12-06 fault audit; each case ran against the real CLI or Beam pipeline before the fix:

- `arrayrecord-convert --input 'data[1]/*.tfrecord'` (a folder named `data[1]`) said "No files match ...
  to match them literally escape '[' as '[[]' (e.g. 'data[[]1]/[*].tfrecord')": the advice also escaped the
  pattern's `*`, so the command it gave matched only a file literally named `*.tfrecord` and failed again.
  A pattern already escaped (`data[[]1]/[*].tfrecord`) got the same advice once more, escaped twice.
- The same advice for `--input 'gs://bucket/run[1]/*.tfrecord'` (given for every gs:// pattern with a '[') was
  `gs://bucket/run[[]1]/[*].tfrecord` too; and the escaped pattern, once right, listed the object and then
  failed with "FileNotFoundError: [Errno 2] No such file or object: 'gs://bucket/run[1]/a.tfrecord'": the size
  of a gs:// file was asked through a glob match, which took its '[1]' for a character class.
- Every run whose pattern held `[[]` (the escape the advice itself gives) printed Beam's
  "FutureWarning: Possible nested set at position N" and its source line on stderr: the one-line error
  became three lines, and a successful run wrote two lines of warning.
- A gs:// input listed by the run and deleted before it was read (a producer rewriting its shards, a
  lifecycle rule) failed with google's bare "NotFound: 404 GET http://.../o/tfr%2Fgone.tfrecord?projection=
  noAcl&prettyPrint=false: unknown error", naming the input only inside a URL and saying nothing of what to
  do; the reader caught only OSError, which the storage client's errors are not.
- A --skip-existing resume (the CLI, or ConvertToArrayRecord(existing='skip')) whose kept shard's input was
  deleted after the listing failed with "RuntimeError: FileNotFoundError: [Errno 2] No such file or
  directory: '.../a.tfrecord'" and a traceback; a kept shard's output deleted after planning (on Dataflow a
  shuffle lies between the two steps) with a bare "[Errno 2]" as well. Both now say what happened and what to
  run, as for a shard being converted.
- A full disk when the final manifest.json is written, after the last shard: checked, one line naming
  manifest.json, the marker left, no temp, and --skip-existing completes once space is freed (a test below).

Checked and already handled in this round (a test each below, as a guard): kill -9 mid-shard, then a rerun
without a flag (refused in one line, nothing changed) and with --overwrite (complete, no temp); a 64 MB
record (whole, and memory a small multiple of it); inputs whose names differ only in NFC/NFD form (two
outputs, each named as its input); inputs that map to one output name (`.tfrecord` vs `.TFRECORDS` vs
`.tfrec.gz`), refused before any work.

Left alone (reported): a record needs about three times its size in memory while converted (the reader's
buffer, the record, the writer's chunk).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import unicodedata

import pytest

import faults_testing as ft
import gcs_emulator as emu
from converter import RecordDigest
from loader import ondisk
from pipelines import convert

CONVERT = "pipelines.convert"

pytestmark = pytest.mark.timeout(300)


def _digest(records) -> str:
  d = RecordDigest()
  d.update_many(records)
  return d.hexdigest()


def _records(n: int, tag: bytes) -> list[bytes]:
  return [tag + b"-%d" % i * 7 for i in range(n)]


# --- Glob patterns with literal brackets -------------------------------------------------------------------


def test_a_bracket_pattern_is_advised_an_escape_that_keeps_its_wildcards(tmp_path, ar_read):
  """The advice escapes '[' only, and the command it gives converts the files the user meant."""
  folder = tmp_path / "run[1]"
  recs = {n: _records(5, n.encode()) for n in ("a", "b")}
  for n, r in recs.items():
    ft.write_tfrecords(str(folder / f"{n}.tfrecord"), r)
  out = tmp_path / "out"
  r = ft.run_cli(CONVERT, "--input", str(folder / "*.tfrecord"), "--output", str(out), "--quiet", timeout=120)
  assert r.returncode == 2, r.stderr
  line = ft.one_line(r.stderr)
  advised = f"{tmp_path}/run[[]1]/*.tfrecord"
  assert line.endswith(f"escape '[' as '[[]' (e.g. --input {advised!r}).")
  assert "[*]" not in line
  assert not out.exists()
  # Following the advice works, and says nothing on stderr.
  r = ft.run_cli(CONVERT, "--input", advised, "--output", str(out), "--quiet", timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stderr == ""
  for n, records in recs.items():
    assert ar_read(str(out / f"{n}.array_record")) == records


def test_a_pattern_escaped_already_gets_no_second_escape_and_one_line(tmp_path):
  folder = tmp_path / "run[1]"
  ft.write_tfrecords(str(folder / "a.tfrecord"), _records(3, b"a"))
  out = tmp_path / "out"
  # Escaped, but with the '*' made literal as the old advice did: no file is named '*.tfrecord'.
  r = ft.run_cli(CONVERT, "--input", f"{tmp_path}/run[[]1]/[*].tfrecord", "--output", str(out), timeout=120)
  assert r.returncode == 2, r.stderr
  line = ft.one_line(r.stderr)  # No FutureWarning from Beam's glob-to-regex above it.
  assert line == (f"arrayrecord-convert: error: No files match the input pattern "
                  f"'{tmp_path}/run[[]1]/[*].tfrecord'. Check the path and the glob (quote it so your shell does "
                  "not expand it).")
  assert "FutureWarning" not in r.stderr and "[[][[]]" not in r.stderr
  assert not out.exists()


def test_verify_with_an_escaped_bracket_pattern_prints_no_warning(tmp_path):
  folder = tmp_path / "run[1]"
  ft.write_tfrecords(str(folder / "a.tfrecord"), _records(3, b"a"))
  out = tmp_path / "out"
  pattern = f"{tmp_path}/run[[]1]/*"
  r = ft.run_cli(CONVERT, "--input", pattern, "--output", str(out), "--quiet", timeout=120)
  assert r.returncode == 0 and r.stderr == "", r.stderr
  r = ft.run_cli("pipelines.verify", "--input", pattern, "--output", str(out), timeout=120)
  assert r.returncode == 0, r.stderr + r.stdout
  assert r.stderr == "" and "1/1 shard(s) match" in r.stdout


# --- A gs:// input that vanishes between listing and reading -----------------------------------------------

_VANISHED_SCRIPT = textwrap.dedent("""
    import sys
    import apache_beam as beam
    import gcs_emulator as emu
    from converter import ConvertToArrayRecord, expand_patterns
    B = "gs://" + emu.BUCKET
    listed = expand_patterns([B + "/tfr/*"])
    print("LISTED", " ".join(listed))
    emu.client().bucket(emu.BUCKET).blob("tfr/b.tfrecord").delete()  # After the listing, before the reading.
    try:
      with beam.Pipeline(argv=["--direct_running_mode=in_memory"]) as p:
        _ = p | beam.Create(listed) | ConvertToArrayRecord(sys.argv[1])
    except Exception as e:
      print("ERROR", type(e).__name__, "|", str(e))
      sys.exit(1)
    print("NO ERROR")
    """)


@pytest.fixture
def gcs(tmp_path):
  folder = str(tmp_path / "gcs")
  os.makedirs(folder)
  server = emu.Emulator(folder).start()
  try:
    env = {**ft.env(), **emu.emulator_env(server.host, folder)}
    env["PYTHONPATH"] = os.pathsep.join([emu.guard_sitecustomize(os.path.join(folder, "guard")),
                                         os.path.dirname(os.path.abspath(__file__)),
                                         env["PYTHONPATH"]])
    with pytest.MonkeyPatch.context() as mp:
      for key, value in emu.emulator_env(server.host, folder).items():
        mp.setenv(key, value)
      emu.client().create_bucket(emu.BUCKET)
      yield folder, env
  finally:
    server.stop()


@pytest.mark.parametrize("where", ["gs", "local"])
def test_a_gcs_input_deleted_after_its_listing_is_named_as_gone(gcs, tmp_path, where, ar_read):
  folder, env = gcs
  B = f"gs://{emu.BUCKET}"
  recs = {n: _records(4, n.encode()) for n in ("a", "b")}
  for n, r in recs.items():
    emu.upload(ft.write_tfrecords(os.path.join(folder, "tfr", f"{n}.tfrecord"), r), f"{B}/tfr/{n}.tfrecord")
  out = f"{B}/out" if where == "gs" else str(tmp_path / "out")
  r = subprocess.run([sys.executable, "-c", _VANISHED_SCRIPT, out], cwd=ft.REPO, env=env, capture_output=True,
                     text=True, timeout=180)
  assert f"LISTED {B}/tfr/a.tfrecord {B}/tfr/b.tfrecord" in r.stdout, r.stdout + r.stderr
  assert r.returncode == 1, r.stdout + r.stderr
  error = [l for l in r.stdout.splitlines() if l.startswith("ERROR")]
  assert error == [f"ERROR InputChangedError | Input {B}/tfr/b.tfrecord disappeared while converting (it was there "
                   "when the run started); the shards already written are kept. Put it back, then rerun with "
                   "--skip-existing to convert the rest."], r.stdout + r.stderr[-3000:]
  assert "NotFound" not in r.stdout and "404 GET" not in r.stdout
  # Nothing under the vanished input's output name, no temp object or file; the other shard is whole.
  if where == "gs":
    objects = set(emu.list_objects(f"{B}/out/"))
    assert f"{B}/out/b.array_record" not in objects
    assert not [o for o in objects if ".tmp-" in o], objects
    if f"{B}/out/a.array_record" in objects:
      local = emu.download(f"{B}/out/a.array_record", str(tmp_path / "a.array_record"))
      assert ar_read(local) == recs["a"]
  else:
    assert not (tmp_path / "out" / "b.array_record").exists()
    assert ft.temps(str(tmp_path / "out")) == []
    if (tmp_path / "out" / "a.array_record").exists():
      assert ar_read(str(tmp_path / "out" / "a.array_record")) == recs["a"]
    # The stopped run's marker: the half-done folder is not read as a dataset.
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE


def test_a_gcs_bracket_pattern_is_advised_an_escape_that_keeps_its_wildcards(gcs, tmp_path, ar_read):
  folder, env = gcs
  B = f"gs://{emu.BUCKET}"
  recs = _records(4, b"g")
  emu.upload(ft.write_tfrecords(os.path.join(folder, "tfr", "a.tfrecord"), recs), f"{B}/run[1]/a.tfrecord")
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-m", CONVERT, "--input", f"{B}/run[1]/*.tfrecord", "--output", str(out),
                      "--quiet", "--workers", "1"], cwd=ft.REPO, env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr
  line = ft.one_line(r.stderr)
  advised = f"{B}/run[[]1]/*.tfrecord"
  assert line.endswith(f"escape '[' as '[[]' (e.g. --input {advised!r}).") and "[*]" not in line
  r = subprocess.run([sys.executable, "-m", CONVERT, "--input", advised, "--output", str(out), "--quiet",
                      "--workers", "1"], cwd=ft.REPO, env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert ar_read(str(out / "a.array_record")) == recs


# --- kill -9 mid-shard, then a rerun ---------------------------------------------------------------------------


def test_kill_9_mid_shard_then_a_plain_rerun_is_refused_and_overwrite_completes(tmp_path, ar_read):
  inp = tmp_path / "in"
  recs = ft.make_dataset(str(inp), 4, 2000, 1000)
  out = tmp_path / "out"
  args = ["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1"]
  proc = ft.start_cli(CONVERT, *args)
  ft.wait_for(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  ft.stop(proc)
  proc.kill()
  proc.wait()
  assert ft.temps(str(out))  # The killed run's half-written file.
  before = {n: os.stat(out / n).st_mtime_ns for n in ft.published(str(out))}

  plain = ft.run_cli(CONVERT, *args, timeout=120)
  assert plain.returncode == 2, plain.stderr
  line = ft.one_line(plain.stderr)
  assert "did not finish" in line and "--skip-existing" in line and "overwrite" in line
  assert {n: os.stat(out / n).st_mtime_ns for n in ft.published(str(out))} == before  # Nothing replaced.
  assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE

  again = ft.run_cli(CONVERT, *args, "--overwrite", timeout=180)
  assert again.returncode == 0, again.stderr
  assert ft.temps(str(out)) == [] and not (out / ondisk.LOCK_NAME).exists()
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["totals"]["converted"] == 4 and manifest["totals"]["failed"] == 0
  for name, records in recs.items():
    entry = next(s for s in manifest["shards"] if s["output"] == ft.out_name(name))
    assert entry["digest"] == _digest(records)
    assert ar_read(str(out / ft.out_name(name))) == records


# --- A huge single record --------------------------------------------------------------------------------------

_MAXRSS_SCRIPT = textwrap.dedent("""
    import resource, sys
    from pipelines import convert
    code = convert.main(sys.argv[1:])
    print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    sys.exit(code)
    """)


def _convert_measured(inp: str, out: str) -> int:
  r = subprocess.run([sys.executable, "-c", _MAXRSS_SCRIPT, "--input", inp, "--output", out, "--quiet",
                      "--workers", "1"], cwd=ft.REPO, env=ft.env(), capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, r.stderr
  return int(r.stdout.split("MAXRSS_KB")[1].split()[0]) * 1024


def test_a_huge_single_record_converts_whole_in_a_small_multiple_of_its_size(tmp_path, ar_read):
  big = os.urandom(1 << 20) * 64  # 64 MiB in one record.
  recs = [b"first", big, b"", b"last"]
  ft.write_tfrecords(str(tmp_path / "in" / "huge.tfrecord"), recs)
  ft.write_tfrecords(str(tmp_path / "small" / "small.tfrecord"), [b"first", b"x", b"", b"last"])
  baseline = _convert_measured(str(tmp_path / "small" / "small.tfrecord"), str(tmp_path / "out-small"))
  peak = _convert_measured(str(tmp_path / "in" / "huge.tfrecord"), str(tmp_path / "out"))
  out = str(tmp_path / "out" / "huge.array_record")
  got = ar_read(out)
  assert len(got) == 4 and got[0] == b"first" and got[2] == b"" and got[3] == b"last"
  assert got[1] == big
  manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert manifest["shards"][0]["digest"] == _digest(recs)
  # Today about 3x (the read buffer, the record, the writer's chunk); a copy per chunk would be far more.
  assert peak - baseline < 5 * len(big), (peak, baseline)


# --- Names -------------------------------------------------------------------------------------------------------


def test_names_that_differ_only_in_unicode_normalization_give_two_outputs_named_as_their_inputs(tmp_path, ar_read):
  nfc = unicodedata.normalize("NFC", "caf\u00e9.tfrecord")
  nfd = unicodedata.normalize("NFD", nfc)
  assert nfc != nfd
  inp = tmp_path / "in"
  ft.write_tfrecords(str(inp / nfc), _records(3, b"nfc"))
  ft.write_tfrecords(str(inp / nfd), _records(4, b"nfd"))
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet"]) == 0
  names = sorted(os.listdir(out))
  want = sorted([nfc.replace(".tfrecord", ".array_record"), nfd.replace(".tfrecord", ".array_record"),
                 "manifest.json"])
  assert names == want
  assert ar_read(str(out / nfc.replace(".tfrecord", ".array_record"))) == _records(3, b"nfc")
  assert ar_read(str(out / nfd.replace(".tfrecord", ".array_record"))) == _records(4, b"nfd")
  r = ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out), timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "2/2 shard(s) match" in r.stdout


@pytest.mark.parametrize("other", ["a.TFRECORDS", "a.tfrec.gz", "a.TFRecord"])
def test_inputs_mapping_to_one_output_name_are_refused_before_any_work(tmp_path, capsys, other):
  inp = tmp_path / "in"
  ft.write_tfrecords(str(inp / "a.tfrecord"), _records(2, b"a"))
  ft.write_tfrecords(str(inp / other), _records(2, b"b"))
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out)]) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1, err
  assert f"{inp}/a.tfrecord" in err[0] and f"{inp}/{other}" in err[0]
  assert f"{out}/a.array_record" in err[0] and "Rename one of them" in err[0]
  assert not out.exists()
  assert sorted(glob.glob(str(tmp_path / "**"), recursive=True)) == sorted(
      [str(tmp_path) + "/", str(inp), str(inp / "a.tfrecord"), str(inp / other)])


# --- A full disk when the manifest is written, after the last shard -------------------------------------------


def test_a_disk_full_when_the_manifest_is_written_is_one_line_and_resumes(tmp_path, ar_read):
  inp = tmp_path / "in"
  recs = {f"s{i}.tfrecord": _records(20, b"s%d" % i) for i in range(3)}
  for name, r in recs.items():
    ft.write_tfrecords(str(inp / name), r)
  # What one output takes, so the filesystem below holds the three shards and the run's marker, and no more.
  probe = tmp_path / "probe"
  assert convert.main(["--input", str(inp / "s0.tfrecord"), "--output", str(probe), "--quiet"]) == 0
  page = 4096
  shard = -(-os.path.getsize(probe / "s0.array_record") // page) * page
  out = str(tmp_path / "mnt")
  with ft.tmpfs(out, str(3 * shard + 2 * page)):
    args = ["--input", str(inp / "*"), "--output", out, "--quiet", "--workers", "1"]
    r = ft.run_cli(CONVERT, *args, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    line = ft.one_line(r.stderr)
    assert line == (f"arrayrecord-convert: error: Cannot write {out}/manifest.json: [Errno 28] No space left on "
                    "device. Its temp file was removed and no partial file was left under its name; free space on "
                    "the output's disk, then rerun with --skip-existing to keep the shards already written.")
    assert sorted(os.listdir(out)) == sorted(["manifest.json"] + [n.replace(".tfrecord", ".array_record") for n in recs])
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["status"] == ondisk.INCOMPLETE
    subprocess.run(["mount", "-o", "remount,size=4m", out], check=True)  # Space freed.
    r = ft.run_cli(CONVERT, *args, "--skip-existing", timeout=120)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(open(os.path.join(out, "manifest.json")).read())
    assert manifest["totals"]["existing"] == 3 and manifest["totals"]["records"] == 60
    for name, records in recs.items():
      assert ar_read(os.path.join(out, name.replace(".tfrecord", ".array_record"))) == records


# --- A kept shard's input deleted after the listing ------------------------------------------------------------


def test_a_resume_whose_kept_shards_input_was_deleted_after_listing_names_it(tmp_path, ar_read):
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from converter import ConvertToArrayRecord, expand_patterns  # pylint: disable=g-import-not-at-top
  from converter.errors import InputChangedError  # pylint: disable=g-import-not-at-top
  inp = tmp_path / "in"
  recs = {n: _records(5, n.encode()) for n in ("a", "b")}
  for n, r in recs.items():
    ft.write_tfrecords(str(inp / f"{n}.tfrecord"), r)
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet"]) == 0
  manifest_before = (out / "manifest.json").read_bytes()
  listed = expand_patterns([str(inp / "*")])
  os.remove(inp / "a.tfrecord")  # After the listing: a sync job, a producer rewriting its shards.
  with pytest.raises(InputChangedError) as raised:
    with beam.Pipeline(argv=["--direct_running_mode=in_memory"]) as p:
      _ = p | beam.Create(listed) | ConvertToArrayRecord(str(out), existing="skip")
  assert str(raised.value) == (
      f"Input {inp}/a.tfrecord disappeared while converting (it was there when the run started); the shards "
      "already written are kept. Put it back, then rerun with --skip-existing to convert the rest.")
  # Nothing lost or changed: both shards and the finished manifest as they were.
  assert (out / "manifest.json").read_bytes() == manifest_before
  for n, r in recs.items():
    assert ar_read(str(out / f"{n}.array_record")) == r
  assert ft.temps(str(out)) == []


def test_a_shard_to_keep_deleted_after_planning_is_named_and_the_resume_converts_it(tmp_path, ar_read):
  # On Dataflow a shuffle lies between the planning step and the one that describes kept shards.
  from converter import options as options_lib  # pylint: disable=g-import-not-at-top
  from converter import planning, transforms  # pylint: disable=g-import-not-at-top
  from converter.errors import KeptOutputGoneError  # pylint: disable=g-import-not-at-top
  inp = tmp_path / "in"
  recs = {n: _records(5, n.encode()) for n in ("a", "b")}
  for n, r in recs.items():
    ft.write_tfrecords(str(inp / f"{n}.tfrecord"), r)
  out = tmp_path / "out"
  args = ["--input", str(inp / "*"), "--output", str(out), "--quiet"]
  assert convert.main(args) == 0
  opts = options_lib.ConvertOptions(output_dir=str(out), existing="skip")
  plans = planning.plan_shards(sorted(str(p) for p in inp.iterdir()), opts)
  assert [p.action for p in plans] == ["keep", "keep"]
  os.remove(out / "a.array_record")  # After planning, before the kept shard is described.
  with pytest.raises(KeptOutputGoneError) as raised:
    transforms.kept_shard_entry(plans[0])
  assert str(raised.value) == (
      f"{out}/a.array_record was to be kept (--skip-existing) but is gone (deleted during the run?); other shards "
      "may have been converted already. Rerun with --skip-existing to convert it again.")
  assert raised.value.exit_code == 1
  assert transforms.kept_shard_entry(plans[1])["records"] == 5  # The other one is described as before.
  # What the message says to do works.
  assert convert.main([*args, "--skip-existing"]) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert sorted((s["output"], s["status"]) for s in manifest["shards"]) == [
      ("a.array_record", "converted"), ("b.array_record", "existing")]
  for n, r in recs.items():
    assert ar_read(str(out / f"{n}.array_record")) == r



def test_a_shard_to_keep_damaged_after_planning_is_a_mid_run_error(tmp_path):
  # Was a plain OutputError, exit 2 ("refused before any work"), though other shards may have been written.
  from converter import options as options_lib  # pylint: disable=g-import-not-at-top
  from converter import planning, transforms  # pylint: disable=g-import-not-at-top
  from converter.errors import KeptOutputError  # pylint: disable=g-import-not-at-top
  inp = tmp_path / "in"
  ft.write_tfrecords(str(inp / "a.tfrecord"), _records(5, b"a"))
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet"]) == 0
  plans = planning.plan_shards([str(inp / "a.tfrecord")], options_lib.ConvertOptions(output_dir=str(out),
                                                                                      existing="skip"))
  (out / "a.array_record").write_bytes(b"not an array record file, written after planning")
  with pytest.raises(KeptOutputError) as raised:
    transforms.kept_shard_entry(plans[0])
  line = str(raised.value)
  assert line.startswith(f"{out}/a.array_record was to be kept (--skip-existing) but cannot be read as an "
                         "ArrayRecord file (") and "\n" not in line, line
  assert line.endswith("Rerun with --overwrite to replace it, or remove it and rerun with --skip-existing.")
  assert raised.value.exit_code == 1

# --- Listing a gs:// folder whose name holds glob characters -----------------------------------------------------


def test_a_gcs_folder_with_brackets_is_listed_whole_for_progress_and_tfds(gcs):
  # Was `FileSystems.match([folder + "/*"])`: `run[1]` read as a character class listed nothing (progress showed
  # no shard done; a TFDS dataset there had no files), and Beam's `*` left out a name with a backslash.
  from pipelines import progress, tfds_convert
  B = f"gs://{emu.BUCKET}"
  bucket = emu.client().bucket(emu.BUCKET)
  for name in ("run[1]/a.array_record", "run[1]/b\\c.array_record", "run[1]/sub/nested", "run1/other",
               "run[1]x/sibling", "run*/star"):
    bucket.blob(name).upload_from_string(b"x" * 7)
  listed = progress._listing(f"{B}/run[1]")  # pylint: disable=protected-access
  assert sorted(listed) == ["a.array_record", "b\\c.array_record"]
  assert listed["a.array_record"][0] == 7
  assert tfds_convert._list_files(f"{B}/run[1]/") == ["a.array_record", "b\\c.array_record"]  # pylint: disable=protected-access
  assert tfds_convert._list_files(f"{B}/run*") == ["star"]  # pylint: disable=protected-access
  assert progress._listing(f"{B}/none") == {}  # pylint: disable=protected-access
