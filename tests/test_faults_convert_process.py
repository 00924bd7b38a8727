"""Faults that hit a running conversion: kill -9, Ctrl-C, a second run, a racing writer.

Every case runs the real `arrayrecord-convert` CLI (`python -m pipelines.convert`)
in its own process and hits it with real signals. SIGSTOP freezes a run at
the moment under test (a shard published, the next one half-written), so
what the test checks cannot depend on timing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import faults_testing as ft
from converter import RecordDigest
from converter import writer as _writer
from converter.errors import ClobberedOutputError
from loader import ondisk
from pipelines import convert

SHARDS = 4
CONVERT = "pipelines.convert"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """Four 2 MB shards: long enough to catch a run between two shards."""
  inp = tmp_path_factory.mktemp("faults") / "in"
  recs = ft.make_dataset(str(inp), SHARDS, 2000, 1000)
  return inp, recs


def convert_args(inp, out, *extra):
  return ["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1", *extra]


def digest(records) -> str:
  d = RecordDigest()
  d.update_many(records)
  return d.hexdigest()


def test_kill_9_then_skip_existing_gives_a_complete_manifest(tmp_path, dataset, ar_read, monkeypatch):
  import loader
  inp, recs = dataset
  out = tmp_path / "out"
  scratch = tmp_path / "tmp"  # The runs' TMPDIR: Beam's temp folder of the killed run must go too.
  scratch.mkdir()
  monkeypatch.setenv("TMPDIR", str(scratch))
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  kept = ft.published(str(out))
  left = ft.temps(str(out))
  proc.kill()  # SIGKILL: no cleanup of any kind runs.
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert left and all(os.path.exists(t) for t in left)  # The killed run's half-written file.
  # Its temp folder (Beam's beam-pipeline-temp* inside), named after the dead process.
  assert [n.startswith(f"arrayrecord-run-{proc.pid}-") for n in os.listdir(scratch)] == [True]
  # manifest.json is the killed run's marker: the half-converted directory is not read as complete.
  assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
  with pytest.raises(ondisk.IncompleteManifestError, match="did not finish.*--skip-existing"):
    loader.ArrayRecordSource(str(out))

  resumed = ft.run_cli(CONVERT, *convert_args(inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  assert f"kept {len(kept)} existing" in resumed.stdout
  assert ft.temps(str(out)) == []  # The dead run's temp file is gone.
  assert os.listdir(scratch) == []  # And its temp folder.
  assert not (out / ondisk.LOCK_NAME).exists()
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["totals"]["records"] == sum(map(len, recs.values()))
  assert manifest["totals"]["shards"] == SHARDS and manifest["totals"]["failed"] == 0
  by_name = {os.path.basename(s["output"]): s for s in manifest["shards"]}
  for name, records in recs.items():
    entry = by_name[ft.out_name(name)]
    assert entry["output"] == ft.out_name(name)  # Relative to the output directory.
    assert entry["records"] == len(records)
    assert entry["digest"] == digest(records)
    assert entry["status"] == ("existing" if ft.out_name(name) in kept else "converted")
    assert ar_read(str(out / ft.out_name(name))) == records
  # Kept shards were rebuilt from the files: no manifest survived the kill.
  assert {s["digest_from"] for s in manifest["shards"] if s["status"] == "existing"} == {"file"}

  src = loader.ArrayRecordSource(str(out))
  assert len(src) == sum(map(len, recs.values()))
  assert src.read([0, len(src) - 1]) == [recs[sorted(recs)[0]][0], recs[sorted(recs)[-1]][-1]]

  # A second resume keeps everything, carrying the digests over.
  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["totals"]["existing"] == SHARDS
  assert manifest["totals"]["records"] == sum(map(len, recs.values()))
  assert {s["digest_from"] for s in manifest["shards"]} == {"manifest"}


@pytest.mark.parametrize("when", ["starting", "mid-run"])
def test_a_worker_process_that_dies_ends_the_run_in_one_line(tmp_path, dataset, ar_read, when, monkeypatch):
  # E.g. the out-of-memory killer: Beam alone would wait for a starting worker
  # forever, or fail later with a bare "Empty" from its queues.
  from pipelines import verify
  inp, recs = dataset
  out = tmp_path / "out"
  scratch = tmp_path / "tmp"  # The run's TMPDIR: it must end with Beam's temp folder removed too.
  scratch.mkdir()
  monkeypatch.setenv("TMPDIR", str(scratch))
  proc = ft.start_cli(CONVERT, *convert_args(inp, out)[:-2], "--workers", "2", new_session=True)
  workers = lambda: [c for c in ft.children(proc.pid) if "sdk_worker" in ft.cmdline(c)]
  if when == "starting":
    ft.wait_for(lambda: len(workers()) == 2, proc, what="two worker processes")
  else:
    ft.wait_for(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  os.kill(workers()[0], signal.SIGKILL)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 1, stderr
  line = ft.one_line(stderr)
  assert line.startswith("arrayrecord-convert: a Beam worker process (pid ") and "was killed by SIGKILL" in line
  assert line.endswith("shards complete; rerun with --skip-existing to resume")
  assert ft.temps(str(out)) == [] and not (out / ondisk.LOCK_NAME).exists()
  assert os.listdir(scratch) == []
  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0
  assert verify.main(["--input", str(inp / "*"), "--output", str(out)]) == 0
  for name, records in recs.items():
    assert ar_read(str(out / ft.out_name(name))) == records


@pytest.mark.parametrize("sig, code, how", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_or_sigterm_prints_one_line_and_leaves_no_temp(tmp_path, dataset, ar_read, sig, code, how,
                                                             monkeypatch):
  # SIGINT is Ctrl-C; SIGTERM is what `kill`, `timeout` and `docker stop` send.
  inp, recs = dataset
  out = tmp_path / "out"
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  monkeypatch.setenv("TMPDIR", str(scratch))
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  proc.send_signal(sig)  # Delivered when the run continues.
  proc.send_signal(signal.SIGCONT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == code, stderr
  done = ft.published(str(out))
  assert ft.one_line(stderr) == (f"arrayrecord-convert: {how}; {len(done)} of {SHARDS} "
                                 "shards complete; rerun with --skip-existing to resume")
  assert ft.temps(str(out)) == [] and os.listdir(scratch) == []
  # No lock file, nothing half-written; manifest.json is the stopped run's marker.
  assert ft.listing(str(out)) == sorted(done + ["manifest.json"])
  assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
  for name in done:
    src = [n for n in recs if ft.out_name(n) == name][0]
    assert ar_read(str(out / name)) == recs[src]

  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0


def test_second_run_into_the_same_output_dir_is_refused(tmp_path, dataset, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  first = ft.start_cli(CONVERT, *convert_args(inp, out))
  # Frozen, it holds the lock while the second run starts.
  ft.stop_when(lambda: ft.mid_run(str(out)), first, what="the first run converting")
  try:
    before = {n: os.stat(out / n).st_mtime_ns for n in ft.published(str(out))}
    second = ft.run_cli(CONVERT, *convert_args(inp, out, "--overwrite"))
  finally:
    first.send_signal(signal.SIGCONT)
  line = ft.one_line(second.stderr)
  assert second.returncode == 2
  host = ondisk.this_process().host
  assert line.startswith(f"arrayrecord-convert: error: {out} is being written by another "
                         f"conversion (pid {first.pid} on host {host}, started ")
  assert f"`kill {first.pid}` on {host}" in line and "released when its process exits" in line
  for name, mtime in before.items():
    assert os.stat(out / name).st_mtime_ns == mtime  # The second run touched nothing.

  stdout, stderr = first.communicate(timeout=120)
  assert first.returncode == 0, stderr
  for name, records in recs.items():
    assert ar_read(str(out / ft.out_name(name))) == records
  assert not (out / ondisk.LOCK_NAME).exists()
  # Once the first run is done, the directory is free again.
  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0


def test_stale_temps_of_dead_runs_go_live_ones_stay(tmp_path, dataset):
  inp, _ = dataset
  out = tmp_path / "out"
  out.mkdir()
  dead = subprocess.Popen(["true"])
  dead.wait()
  live = subprocess.Popen(["sleep", "60"])
  try:
    me = ondisk.this_process()
    dead_tmp = ondisk.temp_name(str(out / "x.array_record"),
                                ondisk.Owner(dead.pid, 0, me.host))
    live_tmp = ondisk.temp_name(str(out / "y.array_record"),
                                ondisk.Owner(live.pid, ondisk._process_start(live.pid), me.host))
    other_host = ondisk.temp_name(str(out / "z.array_record"),
                                  ondisk.Owner(dead.pid, 0, "another-host"))
    for t in (dead_tmp, live_tmp, other_host):
      with open(t, "wb") as f:
        f.write(b"partial")
    assert convert.main(convert_args(inp, out)) == 0
    assert not os.path.exists(dead_tmp)
    assert os.path.exists(live_tmp) and os.path.exists(other_host)
  finally:
    live.kill()
    live.wait()


def test_local_staging_copies_of_killed_runs_are_removed_live_ones_stay(tmp_path, monkeypatch):
  # gs:// outputs are written to $TMPDIR first; a kill -9 leaves that copy behind.
  monkeypatch.setattr(_writer.tempfile, "tempdir", str(tmp_path))
  monkeypatch.setattr(_writer, "_swept", False)
  dead = subprocess.Popen(["true"])
  dead.wait()
  live = subprocess.Popen(["sleep", "60"])
  try:
    names = {"dead": f"arrayrecord-{dead.pid}-k1llED.tmp", "live": f"arrayrecord-{live.pid}-aL1ve_.tmp",
             "not ours": "arrayrecord-x1y2z3.tmp", "user": "notes.tmp"}
    for name in names.values():
      (tmp_path / name).write_bytes(b"partial")
    new = _writer.staging_file()
    assert os.path.dirname(new) == str(tmp_path)
    assert os.path.basename(new).startswith(f"arrayrecord-{os.getpid()}-") and new.endswith(".tmp")
    os.remove(new)
    assert sorted(os.listdir(tmp_path)) == sorted(n for k, n in names.items() if k != "dead")
  finally:
    live.kill()
    live.wait()


def test_temp_folders_of_killed_runs_are_removed_live_ones_and_other_hosts_stay(tmp_path):
  from pipelines import run_tempdir
  dead = subprocess.Popen(["true"])
  dead.wait()
  live = subprocess.Popen(["sleep", "60"])
  try:
    host = ondisk.this_process().host
    names = {"dead": f"arrayrecord-run-{dead.pid}-0-k1llED@{host}",
             "live": f"arrayrecord-run-{live.pid}-{ondisk._process_start(live.pid)}-aL1ve_@{host}",
             "reused pid": f"arrayrecord-run-{live.pid}-1-0ldrun@{host}",
             "other host": f"arrayrecord-run-{dead.pid}-0-elsew_@another-host",
             "user": "arrayrecord-run-notes"}
    for name in names.values():
      (tmp_path / name / "beam-pipeline-temp1").mkdir(parents=True)
    removed = run_tempdir.sweep_dead_runs(str(tmp_path))
    assert sorted(removed) == sorted(str(tmp_path / names[k]) for k in ("dead", "reused pid"))
    assert sorted(os.listdir(tmp_path)) == sorted(names[k] for k in ("live", "other host", "user"))
    with run_tempdir.private_tempdir() as mine:  # In the default $TMPDIR: a run's own folder, gone after.
      import tempfile
      assert tempfile.gettempdir() == os.environ["TMPDIR"] == mine
      assert os.path.basename(mine).startswith(f"arrayrecord-run-{os.getpid()}-")
    assert not os.path.exists(mine) and tempfile.gettempdir() != mine
  finally:
    live.kill()
    live.wait()


def test_publish_never_replaces_a_file_written_after_planning(tmp_path):
  final = str(tmp_path / "x.array_record")
  # Planned as new (expect=None), but another writer published meanwhile.
  with pytest.raises(ClobberedOutputError, match="written by another process"):
    with _writer.ArrayRecordShardWriter(final, "group_size:1", expect=None) as w:
      w.write(b"mine")
      with open(final, "wb") as f:
        f.write(b"theirs")
      w.commit()
  assert open(final, "rb").read() == b"theirs"
  assert ft.temps(str(tmp_path)) == []
  # Planned to overwrite one file, but it was replaced by another writer meanwhile.
  planned = _writer.output_identity(final)
  os.remove(final)
  with open(final, "wb") as f:
    f.write(b"newer")
  with pytest.raises(ClobberedOutputError):
    with _writer.ArrayRecordShardWriter(final, "group_size:1", expect=planned) as w:
      w.write(b"mine")
      w.commit()
  assert open(final, "rb").read() == b"newer"
  # Still the planned file: replaced.
  with _writer.ArrayRecordShardWriter(final, "group_size:1",
                                      expect=_writer.output_identity(final)) as w:
    w.write(b"mine")
    w.commit()
  # A retried bundle that planned a new file finds its own identical output: kept, no error.
  kept = _writer.output_identity(final)
  with _writer.ArrayRecordShardWriter(final, "group_size:1", expect=None) as w:
    w.write(b"mine")
    w.commit()
  assert _writer.output_identity(final) == kept
  assert ft.temps(str(tmp_path)) == []


def test_a_stopped_overwrite_is_never_read_as_complete_and_resumes_correctly(tmp_path, dataset, ar_read):
  import loader
  from pipelines import verify
  inp, _ = dataset
  out = tmp_path / "out"
  assert convert.main(convert_args(inp, out)) == 0
  new_inp = tmp_path / "v2"
  new = ft.make_dataset(str(new_inp), SHARDS, 2000, 1000, seed=7)  # Same names and sizes, new records.
  before = {n: os.stat(out / n).st_ino for n in ft.published(str(out))}

  def one_replaced():
    return ft.temps(str(out)) and any(os.stat(out / n).st_ino != ino for n, ino in before.items()
                                      if (out / n).exists())
  proc = ft.start_cli(CONVERT, *convert_args(new_inp, out, "--overwrite"))
  ft.stop_when(one_replaced, proc, what="a shard replaced and the next one half-written")
  proc.send_signal(signal.SIGINT)
  proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr
  assert "rerun with --skip-existing instead of --overwrite to resume" in ft.one_line(stderr)
  # Old and new shards side by side: neither the loader nor verify takes that for the dataset.
  with pytest.raises(ondisk.IncompleteManifestError, match=r"an --overwrite run\) that did not finish"):
    loader.ArrayRecordSource(str(out))
  checked = ft.run_cli("pipelines.verify", "--input", str(new_inp / "*"), "--output", str(out))
  assert checked.returncode == 1 and "did not finish" in ft.one_line(checked.stderr)

  # The advised resume redoes the shards still holding old data; no digest is taken on trust.
  resumed = ft.run_cli(CONVERT, *convert_args(new_inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  manifest = json.loads((out / "manifest.json").read_text())
  by_name = {os.path.basename(s["output"]): s for s in manifest["shards"]}
  for name, records in new.items():
    assert ar_read(str(out / ft.out_name(name))) == records
    assert by_name[ft.out_name(name)]["digest"] == digest(records)
  kept = [s for s in manifest["shards"] if s["status"] == "existing"]
  assert kept and {s["digest_from"] for s in kept} == {"file"}
  assert verify.main(["--input", str(new_inp / "*"), "--output", str(out)]) == 0


def test_a_run_that_fails_before_changing_a_shard_puts_the_manifest_back(tmp_path, dataset):
  from converter import ConvertOptions
  from converter.guard import ConversionGuard
  from converter.manifest import write_incomplete_manifest
  from converter.planning import marker_entries
  inp, _ = dataset
  out = tmp_path / "out"
  assert convert.main(convert_args(inp, out)) == 0
  before = (out / "manifest.json").read_bytes()
  files = sorted(str(p) for p in inp.iterdir())
  options = ConvertOptions(output_dir=str(out), existing="overwrite")
  with pytest.raises(RuntimeError, match="no shard written"):
    with ConversionGuard(files, options) as guard:
      # What the pipeline's planning step does first, then the run fails.
      write_incomplete_manifest(str(out), marker_entries(guard.plans), writer_options="group_size:1",
                                existing="overwrite", run_id="test")
      assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
      raise RuntimeError("no shard written")
  assert (out / "manifest.json").read_bytes() == before
  assert not (out / ondisk.LOCK_NAME).exists()


def test_a_run_stopped_after_its_last_shard_before_its_manifest_resumes(tmp_path, dataset):
  # Every shard published, the final manifest not (a full disk at that write,
  # or a kill just before it): the marker of the dead run is all that is left.
  from converter import ConvertOptions
  from converter.manifest import write_incomplete_manifest
  from converter.planning import marker_entries, plan_shards
  from pipelines import verify
  inp, _ = dataset
  out = tmp_path / "out"
  # The dead run's marker, as it wrote it before its first shard (into an empty folder).
  plans = plan_shards(sorted(str(p) for p in inp.iterdir()), ConvertOptions(output_dir=str(out)))
  assert convert.main(convert_args(inp, out)) == 0
  shards = {s["output"]: s for s in json.loads((out / "manifest.json").read_text())["shards"]}
  write_incomplete_manifest(str(out), marker_entries(plans), writer_options="group_size:1", existing="error",
                            run_id="died-after-its-last-shard")
  assert verify.main(["--input", str(inp / "*"), "--output", str(out)]) == 1  # Says: resume it.
  assert convert.main([*convert_args(inp, out), "--skip-existing"]) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert {s["status"] for s in manifest["shards"]} == {"existing"} and len(manifest["shards"]) == len(shards)
  assert verify.main(["--input", str(inp / "*"), "--output", str(out)]) == 0
  assert ft.temps(str(out)) == [] and not (out / ondisk.LOCK_NAME).exists()


def _session_and_workers(proc) -> list[int]:
  return [proc.pid] + ft.children(proc.pid)


@pytest.mark.parametrize("sig, code, how", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "stopped by SIGTERM"),
                                            (signal.SIGHUP, 129, "stopped by SIGHUP")])
def test_a_signal_to_the_whole_group_with_worker_processes_gives_one_line(tmp_path, dataset, sig, code, how):
  # A terminal sends Ctrl-C (and a hang-up) to every process of the foreground group.
  inp, _ = dataset
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out)[:-2], "--workers", "2", new_session=True)
  ft.wait_for(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  workers = [c for c in ft.children(proc.pid) if "sdk_worker" in ft.cmdline(c)]
  assert len(workers) == 2
  os.killpg(proc.pid, sig)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == code, stderr
  line = ft.one_line(stderr)
  assert line.startswith(f"arrayrecord-convert: {how}; ") and "rerun with --skip-existing" in line
  assert ft.temps(str(out)) == []  # The workers' half-written files too.
  assert not (out / ondisk.LOCK_NAME).exists()
  ft.wait_for(lambda: not any(map(ft.alive, workers)), what="the workers gone")
  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0


def test_sighup_is_handled_like_sigterm(tmp_path, dataset):
  inp, _ = dataset
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  proc.send_signal(signal.SIGHUP)  # A closed terminal, a dropped ssh session.
  proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 129, stderr
  assert ft.one_line(stderr).startswith("arrayrecord-convert: stopped by SIGHUP; ")
  assert ft.temps(str(out)) == [] and not (out / ondisk.LOCK_NAME).exists()


def test_workers_never_publish_after_their_killed_parent_let_go_of_the_lock(tmp_path):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 12, 2000, 1000)
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out)[:-2], "--workers", "2", new_session=True)
  ft.wait_for(lambda: ft.published(str(out)), proc, what="a first shard published")
  workers = [c for c in ft.children(proc.pid) if "sdk_worker" in ft.cmdline(c)]
  proc.kill()  # SIGKILL: the parent runs no cleanup; its workers hold the lock until they are gone.
  proc.wait()
  lock = None

  def take_lock() -> bool:
    nonlocal lock
    try:
      lock = ondisk.DirLock(str(out)).acquire()
    except ondisk.LockedError as e:
      assert "has exited" in str(e)  # Says the holder died and its workers are going.
      return False
    return True
  ft.wait_for(take_lock, what="the lock")
  try:
    done = ft.published(str(out))
    assert not any(map(ft.alive, workers))  # The lock was free only once the workers were dead...
    assert ft.published(str(out)) == done  # ...so nothing was published under the new holder.
    assert done != [ft.out_name(n) for n in sorted(os.listdir(inp))]  # They did not finish first.
  finally:
    lock.release()


def test_ctrl_c_while_beam_starts_its_workers_exits_at_once_leaving_nothing(tmp_path, dataset):
  inp, _ = dataset
  out = tmp_path / "new" / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out)[:-2], "--workers", "2", new_session=True)
  ft.wait_for(lambda: any("sdk_worker" in ft.cmdline(c) for c in ft.children(proc.pid)), proc,
              what="a worker process starting")
  workers = [c for c in ft.children(proc.pid) if "sdk_worker" in ft.cmdline(c)]
  os.killpg(proc.pid, signal.SIGINT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr
  # Not "..., but Beam did not shut down within 20 s": the guard's last resort.
  assert ft.one_line(stderr) == ("arrayrecord-convert: interrupted; 0 of 4 shards complete; rerun with "
                                 "--skip-existing to resume")
  assert not (tmp_path / "new").exists()  # The folders it created held nothing but its lock.
  ft.wait_for(lambda: not any(map(ft.alive, workers)), what="the workers gone")


@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_ctrl_c_while_starting_up_is_one_line(tmp_path, dataset, how):
  inp, _ = dataset
  out = tmp_path / "out"
  command = (["-c", "import sys; from pipelines import entry_points; sys.exit(entry_points.convert())"]
             if how == "console script" else ["-m", "pipelines.convert"])
  proc = subprocess.Popen([sys.executable, *command, *convert_args(inp, out)],
                          cwd=ft.REPO, env=ft.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def importing_beam() -> bool:  # Beam's gRPC extension is loaded while Beam is imported.
    try:
      with open(f"/proc/{proc.pid}/maps") as f:
        return "cygrpc" in f.read()
    except OSError:
      return False
  ft.wait_for(importing_beam, proc, what="Beam being imported")
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130, stderr
  assert ft.one_line(stderr).startswith("arrayrecord-convert: interrupted")
  assert not out.exists()


def test_temp_files_of_dead_runs_in_hidden_output_folders_are_removed(tmp_path, dataset):
  inp, recs = dataset
  hidden = tmp_path / "in" / ".x"
  hidden.mkdir(parents=True)
  name = sorted(recs)[0]
  os.symlink(inp / name, hidden / name)
  out = tmp_path / "out"
  (out / ".x").mkdir(parents=True)
  dead = subprocess.Popen(["true"])
  dead.wait()
  left = ondisk.temp_name(str(out / ".x" / ft.out_name(name)), ondisk.Owner(dead.pid, 0, ondisk.this_process().host))
  with open(left, "wb") as f:
    f.write(b"half a shard")
  assert convert.main(["--input", str(tmp_path / "in" / ".x" / "*"), "--input", str(inp / name),
                       "--output", str(out), "--quiet", "--workers", "1"]) == 0
  assert not os.path.exists(left)
  assert ft.temps(str(out)) == []


def test_an_input_deleted_mid_run_is_exit_1_and_resumable(tmp_path, dataset, ar_read):
  inp, recs = dataset
  mine = tmp_path / "in"
  shutil.copytree(inp, mine)
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(mine, out))
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  busy = {os.path.basename(t).split(".tmp-")[0][1:] for t in ft.temps(str(out))} | set(ft.published(str(out)))
  gone = next(n for n in sorted(recs) if ft.out_name(n) not in busy)
  moved = tmp_path / gone
  os.rename(mine / gone, moved)
  proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1, stderr
  line = ft.one_line(stderr)
  assert line.startswith(f"arrayrecord-convert: error: Input {mine / gone} disappeared while converting")
  assert "shards already written are kept" in line and "rerun with --skip-existing" in line
  os.rename(moved, mine / gone)  # Back again: the advised resume completes the run.
  assert convert.main(convert_args(mine, out, "--skip-existing")) == 0
  for name, records in recs.items():
    assert ar_read(str(out / ft.out_name(name))) == records


def _stopped_overwrite(tmp_path, dataset):
  """An --overwrite run of new records over a converted directory, killed (-9) after one shard."""
  inp, _ = dataset
  out = tmp_path / "out"
  assert convert.main(convert_args(inp, out)) == 0
  new_inp = tmp_path / "v2"
  new = ft.make_dataset(str(new_inp), SHARDS, 2000, 1000, seed=7)
  old = {n: (out / n).read_bytes() for n in ft.published(str(out))}
  proc = ft.start_cli(CONVERT, *convert_args(new_inp, out, "--overwrite"))
  ft.wait_for(lambda: ft.temps(str(out)) and any((out / n).read_bytes() != b for n, b in old.items()), proc,
              what="a shard replaced and the next one half-written")
  proc.kill()
  proc.wait()
  return new_inp, new, out


def test_a_refused_rerun_leaves_a_stopped_runs_marker_in_place(tmp_path, dataset, ar_read, capsys):
  # The rerun is refused after taking the lock; it must not take the stopped
  # run's marker for its own and remove it (a --skip-existing resume would then
  # keep shards still holding old data, under a complete manifest).
  new_inp, new, out = _stopped_overwrite(tmp_path, dataset)
  marker = (out / "manifest.json").read_bytes()
  assert convert.main(convert_args(new_inp, out)) == 2
  assert "did not finish" in ft.one_line(capsys.readouterr().err)
  assert (out / "manifest.json").read_bytes() == marker
  assert convert.main(convert_args(new_inp, out, "--skip-existing")) == 0
  for name, records in new.items():
    assert ar_read(str(out / ft.out_name(name))) == records


_API_RUN = """
import sys
import pipelines
from apache_beam.options.pipeline_options import PipelineOptions
p = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
    args={"input": sys.argv[1], "output": sys.argv[2]}, pipeline_options=PipelineOptions(["--runner=DirectRunner"]))
p.run().wait_until_finish()
"""


def test_two_runs_of_the_python_api_into_one_directory_never_drop_a_split(tmp_path, dataset, ar_read):
  # The API takes no directory lock: a run that plans while another one's
  # marker is live is refused; one whose marker was replaced meanwhile fails
  # instead of publishing a manifest that drops the other's shards.
  inp, recs = dataset
  out = tmp_path / "out"
  other = tmp_path / "other"
  ft.make_dataset(str(other), 2, 10, 100, seed=3)  # Another split: 2 shards, named ...-of-00002.
  proc = subprocess.Popen([sys.executable, "-c", _API_RUN, str(inp / "*"), str(out)], cwd=ft.REPO,
                          env=ft.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  try:
    import pipelines
    from apache_beam.options.pipeline_options import PipelineOptions
    second = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
        args={"input": str(other / "*"), "output": str(out)},
        pipeline_options=PipelineOptions(["--runner=DirectRunner"]))
    with pytest.raises(Exception, match="marks a conversion that is still writing this directory") as e:
      second.run().wait_until_finish()
    assert f"pid {proc.pid} " in str(e.value)
  finally:
    proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr
  manifest = json.loads((out / "manifest.json").read_text())
  assert sorted(os.path.basename(s["output"]) for s in manifest["shards"]) == sorted(map(ft.out_name, recs))
  assert not any("-of-00002" in n for n in os.listdir(out))


def test_a_run_whose_marker_another_run_replaced_publishes_no_manifest(tmp_path):
  from converter import ConcurrentRunError, ConvertOptions
  from converter import transforms
  from converter.manifest import write_incomplete_manifest
  out = tmp_path / "out"
  out.mkdir()
  options = ConvertOptions(output_dir=str(out))
  results = [{"input": str(tmp_path / "a.tfrecord"), "output": str(out / "a.array_record"), "status": "converted",
              "records": 1, "bytes_in": 20, "bytes_out": 100, "digest": "x"}]
  write_incomplete_manifest(str(out), [], writer_options="group_size:1", existing="error", run_id="theirs")
  theirs = (out / "manifest.json").read_bytes()
  with pytest.raises(ConcurrentRunError, match="Another conversion replaced .* while this one ran") as e:
    transforms._write_manifest(results, options, "mine")  # pylint: disable=protected-access
  assert e.value.exit_code == 1 and (out / "manifest.json").read_bytes() == theirs
  # Its own marker: published; a retried step that finds its manifest in place: fine.
  write_incomplete_manifest(str(out), [], writer_options="group_size:1", existing="error", run_id="mine")
  transforms._write_manifest(results, options, "mine")  # pylint: disable=protected-access
  assert json.loads((out / "manifest.json").read_text())["totals"]["records"] == 1
  transforms._write_manifest(results, options, "mine")  # pylint: disable=protected-access


def test_converting_in_place_resumes_with_the_same_glob(tmp_path, dataset, ar_read):
  # --output is the input folder: the resume's `*` also matches the outputs of
  # the stopped run, which are ArrayRecord files, not inputs.
  src, recs = dataset
  inp = tmp_path / "in"
  shutil.copytree(src, inp)
  proc = ft.start_cli(CONVERT, *convert_args(inp, inp))
  # Frozen mid-run first: a SIGTERM sent to the running process could come after its last shard.
  ft.stop_when(lambda: ft.mid_run(str(inp)), proc, what="a shard published and one half-written")
  proc.send_signal(signal.SIGTERM)
  proc.send_signal(signal.SIGCONT)
  proc.communicate(timeout=120)
  assert proc.returncode == 143
  assert convert.main(convert_args(inp, inp, "--skip-existing")) == 0
  for name, records in recs.items():
    assert ar_read(str(inp / ft.out_name(name))) == records


def test_a_temp_file_whose_name_holds_a_newline_is_still_recognised():
  owner = ondisk.this_process()
  for final in ("a\nb.array_record", "x.array_record\n", "plain.array_record"):
    name = os.path.basename(ondisk.temp_name(final, owner))
    assert ondisk.parse_temp_name(name) == (final, owner)


def test_sigterm_while_planning_unwinds_and_leaves_no_lock(tmp_path):
  # A SIGTERM after the lock is taken but before the run starts used to kill the process (no handler yet):
  # exit -15, no message, the lock file and the created output folder left (2026-12-05 fault audit).
  from converter.guard import ConversionGuard  # pylint: disable=g-import-not-at-top
  from converter.errors import Interrupted  # pylint: disable=g-import-not-at-top
  from converter.options import ConvertOptions  # pylint: disable=g-import-not-at-top
  from converter.planning import plan_shards  # pylint: disable=g-import-not-at-top
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 100)
  out = tmp_path / "out"

  def plan_then_sigterm(inputs, options):
    plans = plan_shards(inputs, options)
    assert os.path.exists(out / ondisk.LOCK_NAME)  # Locked: the moment the old code died at.
    os.kill(os.getpid(), signal.SIGTERM)
    return plans

  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(Interrupted) as e:
    ConversionGuard(sorted(str(p) for p in inp.iterdir()), ConvertOptions(output_dir=str(out)), plan=plan_then_sigterm)
  assert e.value.exit_code == 143
  assert str(e.value) == "stopped by SIGTERM before any shard was converted; nothing was changed; rerun the same command"
  assert not out.exists()  # The folder it made is gone, lock file and all.
  assert signal.getsignal(signal.SIGTERM) is before
