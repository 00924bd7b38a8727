"""Faults that hit a running conversion: kill -9, Ctrl-C, a second run, a racing writer.

Every case runs the real `arrayrecord-convert` CLI (`python -m pipelines.convert`)
in its own process and hits it with real signals. SIGSTOP freezes a run at
the moment under test (a shard published, the next one half-written), so
what the test checks cannot depend on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

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


def test_kill_9_then_skip_existing_gives_a_complete_manifest(tmp_path, dataset, ar_read):
  import loader
  inp, recs = dataset
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.wait_for(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  ft.stop(proc)
  kept = ft.published(str(out))
  left = ft.temps(str(out))
  proc.kill()  # SIGKILL: no cleanup of any kind runs.
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert left and all(os.path.exists(t) for t in left)  # The killed run's half-written file.
  assert not (out / "manifest.json").exists()

  resumed = ft.run_cli(CONVERT, *convert_args(inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  assert f"kept {len(kept)} existing" in resumed.stdout
  assert ft.temps(str(out)) == []  # The dead run's temp file is gone.
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


@pytest.mark.parametrize("sig, code, how", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_ctrl_c_or_sigterm_prints_one_line_and_leaves_no_temp(tmp_path, dataset, ar_read, sig, code, how):
  # SIGINT is Ctrl-C; SIGTERM is what `kill`, `timeout` and `docker stop` send.
  inp, recs = dataset
  out = tmp_path / "out"
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.wait_for(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  ft.stop(proc)
  proc.send_signal(sig)  # Delivered when the run continues.
  proc.send_signal(signal.SIGCONT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == code, stderr
  done = ft.published(str(out))
  assert ft.one_line(stderr) == (f"arrayrecord-convert: {how}; {len(done)} of {SHARDS} "
                                 "shards complete; rerun with --skip-existing to resume")
  assert ft.temps(str(out)) == []
  assert ft.listing(str(out)) == done  # No lock file, no manifest, nothing half-written.
  for name in done:
    src = [n for n in recs if ft.out_name(n) == name][0]
    assert ar_read(str(out / name)) == recs[src]

  assert convert.main(convert_args(inp, out, "--skip-existing")) == 0


def test_second_run_into_the_same_output_dir_is_refused(tmp_path, dataset, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  first = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.wait_for(lambda: ft.mid_run(str(out)), first, what="the first run converting")
  ft.stop(first)  # Holds the lock while the second run starts.
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
