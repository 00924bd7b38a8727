"""Round 23 of the fault audit: Dataflow dry runs stopped by a signal, racing each other or unable to build the
toolkit; file size limits for iterator states and example data; Beam runner flags that failed deep in Beam or
waited in silence; input patterns that match only outputs; and state files that are link loops or from a newer
toolkit.

Found by the 2026-12-06 fault audit, each case run against the real CLI or loader before the fix:

- `arrayrecord-dataflow --dry-run` stopped by Ctrl-C (the terminal signals the whole process group) printed
  the KeyboardInterrupt tracebacks of Beam's child processes (the sdist build, `pip freeze`) around a bare
  "arrayrecord-dataflow: interrupted" and left the dry-run folder it had made (empty, or with part of the
  request in it: a rerun into it was refused as "not an empty folder"); SIGTERM (`kill`, `timeout`) and
  SIGHUP killed it with no message at all, leaving the same; and a SIGTERM during Beam's `pip freeze` was
  swallowed by Beam, which wrote a request without its list of dependencies and exited 0. A build stopped so
  (or failing) also left setuptools' copy of the checkout, arrayrecord-toolkit-VERSION/, in the checkout.
- Two dry runs into one --dry-run-dir (two started in the same second share the default folder
  dataflow-dry-run/JOB_NAME) both found it empty, both wrote their request into it, and both reported the
  folder as theirs: one run's job.json beside the other's sdist. A dry run now claims the folder first.
- A dry run (or a submission) whose sdist of the toolkit could not be built, under a file size limit
  (`ulimit -f`) or with $TMPDIR full, printed 47 KB of nested tracebacks of Beam's stager and its children,
  the cause ("error: [Errno 27] File too large") somewhere in the middle; it is now one line naming the cause
  and what to do.
- `python -m pipelines.make_example_data` under a file size limit said "cannot write <--output> (File too
  large); check --output" (neither the file nor the cause), and left the folders it had made.
- `loader.save_state` under a file size limit (`ulimit -f`, a batch scheduler's limit: EFBIG) said "Save
  elsewhere, or fix the folder's permissions or mount": neither is the cause; it now says to raise the limit.
- `arrayrecord-convert --runner DataflowRunner --project ... --temp_location gs://...` waited for minutes
  without a word on a machine without Google Cloud credentials (until `timeout` stopped it), and would not
  have staged the toolkit for the workers anyway; it now points to arrayrecord-dataflow at once.
- `arrayrecord-convert --direct_num_workers -1` (a Beam flag passed through) failed with "IndexError: list index
  out of range" deep in Beam; it is refused before any work now.
- `arrayrecord-verify --input 'out/*' --output out` (the converted folder given as the inputs) and a convert in
  place whose pattern matched only its earlier outputs said "No files match the input pattern ... Check the path
  and the glob": files do match, but only the output folder's own ones, which are never inputs.
- `loader.save_state` into a folder below a broken symbolic link (a link to a scratch disk not mounted)
  said "A part of its folder's path is a file: save elsewhere"; no part of it is a file.
- `load_state` of a symbolic link loop gave a bare "[Errno 40] Too many levels of symbolic links"; one that
  goes on after a file's name a bare "[Errno 20] Not a directory".
- `loader.restore_state` of a state file of a later format version said only "has state version 2; this
  loader reads version 1", not that a newer arrayrecord-toolkit wrote it, nor what to do; a DataLoader state
  of a later version likewise ("is not supported (this loader reads versions 1 to 3)").
- `ArrayRecordSource([shard, ""])` (a file list read with `.split("\n")`) said "ArrayRecord file not found: "
  and named nothing; a path ending in a line break gave a message on two lines, the cause unseen.
- `ArrayRecordSource("out/*")` over a converted folder (and `ArrayRecordSource("out/manifest.json")`) failed
  on the manifest as "not an ArrayRecord file" without saying to pass the folder itself; a folder of TFRecord
  files said only that it has no ArrayRecord files, not to convert them first.

Checked and already handled in this round (no test added, each ran for real): a 0-byte, a cut, a garbage and a
TFRecord file given to ArrayRecordSource; an empty shard (and repeat() over it, with and without workers); a
converted folder with a shard missing, replaced by one of another record count, or without its manifest; a
shard deleted or replaced before mp_prefetch's workers opened it; a 100 MB record converted, verified and read
through workers; names with spaces, non-ASCII letters and `*`; two processes saving states to one path 300
times each while a third restored (never a torn file, no temp left); states of another pipeline, seed, version
of the iterator format, out-of-range or float positions, a DataLoader state given to a dataset iterator and the
reverse; Orbax checkpoints damaged, of another pipeline, or without this process's file; a save to a link loop
(the link is replaced, its target untouched); arrayrecord-convert on `/proc/cpuinfo` and `/dev/null`, a 0-byte,
5-byte and 3-byte input in fail and skip mode, a 0-byte `.gz` input (no records, as TensorFlow reads it), two
inputs mapping to one output name (`x.tfrecord` and `x.tfrecords` or `x.tfrecord.gz`), an unknown runner, a bad
--direct_running_mode, --workers 0 or -2, TMPDIR missing, a file, read-only or full, `| head -1` on convert and
verify (the run completes), the re-sharding API and arrayrecord-tfds under a file size limit, an in-place TFDS
conversion killed with SIGKILL then rerun and resumed, the match-shards API converting in place; verify given an
ArrayRecord file as --output and an input deleted since its conversion.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import faults_testing as ft
import loader
from loader import checkpoint
from pipelines import convert, verify

_DRY_RUN_ARGS = ("--input", "gs://my-bucket/tfr/*", "--output", "gs://my-bucket/ar", "--project", "my-project",
                 "--region", "us-central1", "--temp_location", "gs://my-bucket/tmp")


def _start_dry_run(folder: str) -> subprocess.Popen:
  return ft.start_cli("dataflow.submit", *_DRY_RUN_ARGS, "--dry-run-dir", folder, new_session=True)


def _build_trees() -> set[str]:
  """setuptools' release trees in the checkout (arrayrecord-toolkit-VERSION/), left by a build cut short."""
  return {n for n in os.listdir(ft.REPO) if n.startswith("arrayrecord-toolkit-")}


def _beam_child(proc: subprocess.Popen) -> bool:
  """Beam is building the sdist or listing the environment (a child process): the dry run is under way."""
  return any("build" in ft.cmdline(c) or "pip" in ft.cmdline(c) for c in ft.children(proc.pid))


@pytest.mark.parametrize("signum,code,how", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_dry_run_stopped_by_a_signal_says_so_in_one_line_and_leaves_nothing(tmp_path, signum, code, how):
  folder = str(tmp_path / "dry-run")
  trees = _build_trees()
  proc = _start_dry_run(folder)
  ft.wait_for(lambda: _beam_child(proc), proc, what="Beam's child process of the dry run")
  if signum == signal.SIGINT:
    os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole group, Beam's children too.
  else:
    os.kill(proc.pid, signum)  # `kill`, `timeout`: the main process only.
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == code, (out, err)
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
  assert ft.one_line(err) == (f"arrayrecord-dataflow: error: dry run {how}; nothing was submitted and nothing was "
                              f"left in {folder} (what it had written was removed); run the same command again")
  assert not os.path.lexists(folder)
  assert _build_trees() <= trees  # Nor the sdist build's copy of the checkout inside the checkout.


def test_a_dry_run_stopped_in_a_folder_the_user_made_leaves_it_empty_and_the_rerun_works(tmp_path):
  folder = tmp_path / "dry-run"
  folder.mkdir()
  proc = _start_dry_run(str(folder))
  ft.wait_for(lambda: _beam_child(proc), proc, what="Beam's child process of the dry run")
  os.kill(proc.pid, signal.SIGHUP)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 129 and "stopped by SIGHUP" in ft.one_line(err), err
  assert folder.is_dir() and os.listdir(folder) == []
  rerun = ft.run_cli("dataflow.submit", *_DRY_RUN_ARGS, "--dry-run-dir", str(folder))
  assert rerun.returncode == 0, rerun.stderr
  assert "Dry run: nothing was submitted" in rerun.stdout
  assert {"job.json", "workflow.tar.gz", "submission_environment_dependencies.txt"} <= set(os.listdir(folder))
  assert "Building sdist" in rerun.stderr  # Beam's children's output still reaches stderr when nothing stops it.


def test_two_dry_runs_into_one_folder_never_mix_their_requests(tmp_path):
  from dataflow import flags, submit  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "dry-run"
  # Both dry runs found the folder missing or empty when their flags were checked, as two runs started in
  # the same second into the same default folder (dataflow-dry-run/JOB_NAME) do; then the other one ...
  request = flags.parse([*_DRY_RUN_ARGS, "--dry-run-dir", str(folder)])
  folder.mkdir()
  (folder / ".arrayrecord-dry-run-in-progress").write_bytes(b"")  # ... is writing there now, or ...
  with pytest.raises(submit.DryRunError) as e:
    submit.dry_run(request)
  assert str(e.value) == (f"another dry run is writing to {folder} now (its .arrayrecord-dry-run-in-progress file "
                          "is there; after a killed one, remove the folder): wait for it, or pass another "
                          "--dry-run-dir.")
  assert os.listdir(folder) == [".arrayrecord-dry-run-in-progress"]
  os.remove(folder / ".arrayrecord-dry-run-in-progress")
  (folder / "job.json").write_text("the other run's request")  # ... has written its request there.
  with pytest.raises(submit.DryRunError) as e:
    submit.dry_run(request)
  assert str(e.value) == (f"--dry-run-dir {folder} was filled by another run after this one started (job.json); it "
                          "was left as it is: pass another --dry-run-dir.")
  assert os.listdir(folder) == ["job.json"] and (folder / "job.json").read_text() == "the other run's request"


def _limit_file_size(kib: int):
  def limit() -> None:
    import resource  # pylint: disable=g-import-not-at-top
    resource.setrlimit(resource.RLIMIT_FSIZE, (kib << 10, kib << 10))
  return limit


def test_a_dry_run_whose_sdist_cannot_be_built_says_why_in_one_line(tmp_path):
  folder = tmp_path / "dry-run"
  trees = _build_trees()
  r = subprocess.run([sys.executable, "-m", "dataflow.submit", *_DRY_RUN_ARGS, "--dry-run-dir", str(folder)],
                     cwd=ft.REPO, env=ft.env(), capture_output=True, text=True, timeout=300,
                     preexec_fn=_limit_file_size(100))  # `ulimit -f 100`: smaller than the toolkit's sdist.
  assert r.returncode == 1, r.stderr
  assert "Traceback" not in r.stderr
  line = ft.one_line(r.stderr)
  # Which file of the build first passes the limit depends on the sources' sizes; the cause and advice do not.
  assert line.startswith(f"arrayrecord-dataflow: error: cannot build the sdist of {ft.REPO} that Dataflow workers "
                         "install (--setup_file): error: "), line
  assert line.endswith("File too large; raise the file size limit (`ulimit -f`), or pass --setup_file none with an "
                       "--sdk_container_image that has the toolkit installed. Nothing was submitted."), line
  assert not folder.exists()
  assert _build_trees() <= trees


def test_a_dry_run_with_a_full_tmpdir_names_it(tmp_path):
  scratch = str(tmp_path / "tmp")
  os.mkdir(scratch)
  with ft.tmpfs(scratch, "200k"):  # Room for Beam's small files, not for the sdist (~400 KB).
    r = subprocess.run([sys.executable, "-m", "dataflow.submit", *_DRY_RUN_ARGS, "--dry-run-dir",
                        str(tmp_path / "dry-run")], cwd=ft.REPO, env={**ft.env(), "TMPDIR": scratch},
                       capture_output=True, text=True, timeout=300)
    assert os.listdir(scratch) == []  # The run's own temp folder went too.
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
  line = ft.one_line(r.stderr)
  assert "error: [Errno 28] No space left on device; free space in " + scratch + " (where it is built)" in line
  assert not (tmp_path / "dry-run").exists()


_SAVE_OVER_LIMIT = textwrap.dedent("""
    import resource, sys
    import loader
    it = iter(loader.MapDataset.range(100).shuffle(seed=3).batch(4).to_iter_dataset())
    next(it)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50, 50))  # Smaller than the state file.
    try:
      loader.save_state(sys.argv[1], it)
    except OSError as e:
      print(e)
""")


def test_save_state_over_the_file_size_limit_says_to_raise_the_limit(tmp_path):
  path = tmp_path / "ckpt" / "state.json"
  r = subprocess.run([sys.executable, "-c", _SAVE_OVER_LIMIT, str(path)], env=ft.env(), capture_output=True,
                     text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  line = ft.one_line(r.stdout)
  assert line.startswith(f"[Errno 27] File too large: cannot save the iterator state to {path}; the file was not "
                         "created."), line
  assert "ulimit -f" in line and "permissions" not in line
  assert not (tmp_path / "ckpt").exists()  # The folder it made for the state, and its temp file, are gone.


def test_a_state_file_of_a_newer_version_says_a_newer_toolkit_wrote_it(tmp_path):
  ds = loader.MapDataset.range(100).shuffle(seed=3).batch(4).to_iter_dataset()
  it = iter(ds)
  next(it)
  path = tmp_path / "state.json"
  loader.save_state(path, it)
  saved = json.loads(path.read_text())
  for version, says in ((saved["version"] + 1, "written by a newer arrayrecord-toolkit"),
                        ("1", "edited or damaged"), (None, "edited or damaged")):
    (tmp_path / "other.json").write_text(json.dumps({**saved, "version": version}))
    with pytest.raises(ValueError) as e:
      loader.restore_state(tmp_path / "other.json", iter(ds))
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / "other.json") in message
    assert f"has state file version {version!r}; this loader reads version {saved['version']}" in message
    assert says in message and "restore from another checkpoint" in message
  assert loader.restore_state(path, iter(ds)) == saved["state"]  # The state it read is untouched.


def test_a_data_loader_state_of_a_newer_version_says_so(tmp_path):
  dl = loader.DataLoader(data_source=list(range(20)), worker_count=0, sampler=loader.samplers.IndexSampler(
      20, shard_options=loader.sharding.NoSharding(), shuffle=True, seed=1, num_epochs=1))
  it = iter(dl)
  next(it)
  state = json.loads(it.get_state())
  for version, says in ((state["format_version"] + 1, "a newer arrayrecord-toolkit wrote it: resume with that "
                                                      "version, or start a fresh iterator"),
                        ("x", "it was edited or damaged: restore another checkpoint, or start a fresh iterator")):
    with pytest.raises(ValueError) as e:
      iter(dl).set_state(json.dumps({**state, "format_version": version}).encode())
    assert str(e.value) == (f"DataLoader state version {version!r} is not supported (this loader reads versions 1 "
                            f"to {state['format_version']}); {says}.")


def test_load_state_of_a_link_loop_or_a_path_through_a_file_says_what_it_is(tmp_path):
  os.symlink(tmp_path / "b.json", tmp_path / "a.json")
  os.symlink(tmp_path / "a.json", tmp_path / "b.json")
  with pytest.raises(OSError) as e:
    checkpoint.load_state(tmp_path / "a.json")
  assert str(e.value) == (f"[Errno 40] Cannot read the iterator state {tmp_path / 'a.json'}: it is a symbolic link that "
                          "leads back to itself (a loop); fix or remove the link, or restore from another checkpoint")
  (tmp_path / "ckpt").write_text("{}")
  with pytest.raises(NotADirectoryError) as e:
    checkpoint.load_state(tmp_path / "ckpt" / "state.json")
  assert f"{tmp_path / 'ckpt'} is a file, not a folder" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flag", [["--direct_num_workers", "-1"], ["--direct_num_workers=-2"]])
def test_a_negative_direct_num_workers_is_refused_before_any_work(tmp_path, capsys, flag):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  out = tmp_path / "out"
  code = convert.main(["--input", str(tmp_path / "in" / "*"), "--output", str(out), "--quiet", *flag])
  assert code == 2
  value = flag[-1].split("=")[-1]
  assert ft.one_line(capsys.readouterr().err) == (
      f"arrayrecord-convert: error: --direct_num_workers must be 0 (one worker per core) or a positive number of "
      f"worker processes, got {value}; or leave the Beam flags out and use --workers N|auto.")
  assert not out.exists()  # Was "IndexError: list index out of range", exit 1.


def test_a_pattern_that_matches_only_the_output_folders_own_files_says_so(tmp_path, capsys):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  out = tmp_path / "out"
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", str(out), "--quiet"]) == 0
  capsys.readouterr()
  before = {n: (out / n).read_bytes() for n in os.listdir(out)}
  # `--input out/*`: the folder just converted, taken for the inputs (was "No files match ... Check the path").
  assert verify.main(["--input", str(out / "*"), "--output", str(out)]) == 2
  assert ft.one_line(capsys.readouterr().err) == (
      f"arrayrecord-verify: error: No files match the input pattern {str(out / '*')!r}. Only the output folder's "
      f"own files are there (2 ArrayRecord file(s) and manifest.json in {out}), and those are never inputs: give the "
      "TFRecord files (the inputs a conversion's manifest.json lists).")
  assert convert.main(["--input", str(out / "*.array_record*"), "--output", str(out), "--quiet", "--overwrite"]) == 2
  line = ft.one_line(capsys.readouterr().err)
  assert f"Only the output folder's own files are there (2 ArrayRecord file(s) in {out})" in line, line
  assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before


def test_make_example_data_over_the_file_size_limit_names_the_shard_and_the_limit(tmp_path):
  out = tmp_path / "data" / "train"
  r = subprocess.run([sys.executable, "-m", "pipelines.make_example_data", "--output", str(out), "--shards", "2",
                      "--records-per-shard", "200"], cwd=ft.REPO, env=ft.env(), capture_output=True, text=True,
                     timeout=120, preexec_fn=_limit_file_size(64))  # A shard is ~160 KB.
  assert r.returncode == 1, r.stderr
  assert ft.one_line(r.stderr) == (
      f"make_example_data.py: error: cannot write {out}/example-train.tfrecord-00000-of-00002 (File too large); "
      "raise the file size limit (`ulimit -f`) or write fewer records per shard (--records-per-shard). No partial "
      "file was left; shards already written are complete (rerun with --overwrite to write them all).")
  assert os.listdir(tmp_path) == []  # Was: "cannot write <--output> ...; check --output", and data/train left.


def test_arrayrecord_convert_with_the_dataflow_runner_points_to_arrayrecord_dataflow_at_once(tmp_path, capsys):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  out = tmp_path / "out"
  # It waited for minutes (Beam retrying Google Cloud) and was ended by `timeout` with nothing said.
  code = ft.in_time(lambda: sys.exit(convert.main([
      "--input", str(tmp_path / "in" / "*"), "--output", str(out), "--quiet", "--runner", "DataflowRunner",
      "--project", "my-project", "--region", "us-central1", "--temp_location", "gs://my-bucket/tmp"])), 60)
  assert isinstance(code, SystemExit) and code.code == 2
  assert ft.one_line(capsys.readouterr().err) == (
      "arrayrecord-convert: error: --runner DataflowRunner: submit Dataflow jobs with arrayrecord-dataflow (the same "
      "converter flags; --tfds-dataset-dir for a TFDS dataset), which stages this toolkit for the workers and checks "
      "the Google Cloud flags and credentials first.")
  assert not out.exists()


def test_save_state_under_a_broken_link_names_the_link_not_a_file(tmp_path):
  os.symlink(tmp_path / "scratch-not-mounted", tmp_path / "ckpt")  # A link to a disk that is not mounted.
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  with pytest.raises(OSError) as e:
    loader.save_state(tmp_path / "ckpt" / "step_100" / "data.json", it)
  message = str(e.value)
  assert (f"cannot save the iterator state to {tmp_path}/ckpt/step_100/data.json; the file was not created. "
          f"{tmp_path}/ckpt is a broken symbolic link (to {str(tmp_path / 'scratch-not-mounted')!r}, which does not "
          "exist): fix or remove the link, or save elsewhere") in message, message
  assert "is a file" not in message
  assert sorted(os.listdir(tmp_path)) == ["ckpt"] and os.path.islink(tmp_path / "ckpt")


def test_a_blank_path_or_one_ending_in_a_line_break_is_named_as_such(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 1, 3, 16)
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", str(tmp_path / "out"), "--quiet"]) == 0
  shard = str(tmp_path / "out" / "ds.array_record-00000-of-00001")
  # A file list read with `open(...).read().split("\n")` ends in "" (its last line break).
  with pytest.raises(FileNotFoundError) as e:
    loader.ArrayRecordSource([shard, ""])
  assert "empty" in str(e.value) or "blank" in str(e.value), str(e.value)  # Was "ArrayRecord file not found: ".
  assert "Path 1 of the 2 given is blank" in str(e.value), str(e.value)
  with pytest.raises(FileNotFoundError) as e:
    loader.ArrayRecordSource([shard + "\n"])
  assert "\n" not in str(e.value), str(e.value)  # Was on two lines, the cause invisible.
  assert f"strip it ({shard!r})" in str(e.value), str(e.value)


def test_a_converted_folders_manifest_given_as_data_says_to_pass_the_folder(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  out = str(tmp_path / "out")
  assert convert.main(["--input", str(tmp_path / "in" / "*"), "--output", out, "--quiet"]) == 0
  for given in (os.path.join(out, "*"), os.path.join(out, "manifest.json")):
    with pytest.raises(ValueError) as e:  # Was: "... manifest.json is not an ArrayRecord file", no way out.
      loader.ArrayRecordSource(given)
    message = str(e.value)
    assert "manifest of a converted folder" in message and f"pass the folder itself ({out!r})" in message, message
  assert len(loader.ArrayRecordSource(out)) == 6


def test_a_folder_of_tfrecords_says_to_convert_it_first(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 2, 3, 16)
  with pytest.raises(FileNotFoundError) as e:  # Was: "has neither a manifest.json nor any *.array_record* files."
    loader.ArrayRecordSource(str(tmp_path / "in"))
  assert "holds TFRecord files" in str(e.value) and "arrayrecord-convert --input" in str(e.value), str(e.value)
