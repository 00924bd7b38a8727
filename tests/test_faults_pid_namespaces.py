"""Two runs on one host name in different pid namespaces (containers sharing `--network host` and a volume).

Pids of one namespace mean nothing in another: a run must never take the
other container's live conversion for a dead one, and so must not remove its
temp files, its $TMPDIR run folder or its staging files, nor say its lock is
only held by leftover workers. Found by the 2026-12-05 fault audit: a refused
second run deleted the first run's temp file, and the first run then failed.

The holder runs under `unshare --pid --fork --mount-proc` (a real pid
namespace); where this machine does not allow that, the tests skip saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import faults_testing as ft
from converter import writer as _writer
from loader import ondisk
from pipelines import run_tempdir

# The holder: in its own pid namespace, it takes the output folder's lock, writes a temp file beside the
# shards, a run folder and a staging file in $TMPDIR, prints their paths and waits until stdin closes.
_HOLDER = r"""
import json, os, sys
from converter import writer
from loader import ondisk
from pipelines import run_tempdir
out = sys.argv[1]
lock = ondisk.DirLock(out).acquire()
temp = ondisk.temp_name(os.path.join(out, "ds.array_record-00000-of-00001"))
open(temp, "wb").close()
staging = writer.staging_file()
run = run_tempdir.private_tempdir()
run_dir = run.__enter__()
print(json.dumps({"pid": os.getpid(), "host": ondisk.this_process().host, "temp": temp, "staging": staging,
                  "run_dir": run_dir}), flush=True)
sys.stdin.read()
run.__exit__(None, None, None)
os.remove(temp)
os.remove(staging)
lock.release()
"""


@pytest.fixture
def holder(tmp_path):
  """A live process in another pid namespace holding `tmp_path / "out"`; yields (its report, out)."""
  if shutil.which("unshare") is None:
    pytest.skip("unshare(1) is not installed: no second pid namespace to test with")
  probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
  if probe.returncode:
    pytest.skip(f"this machine does not allow a new pid namespace here: {probe.stderr.strip()}")
  out = tmp_path / "out"
  out.mkdir()
  env = {**ft.env(), "TMPDIR": str(tmp_path)}
  proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _HOLDER, str(out)],
                          cwd=ft.REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    report = json.loads(proc.stdout.readline())
    yield report, out
  finally:
    proc.stdin.close()
    proc.wait(timeout=60)


def test_the_other_namespace_counts_as_another_host(holder):
  report, _ = holder
  assert report["pid"] == 1  # Its own namespace's first process.
  assert report["host"] != ondisk.this_process().host
  # Pid 1 runs here too (another process): never taken for the holder, alive or dead.
  assert ondisk.is_alive(ondisk.Owner(report["pid"], 0, report["host"])) is None


def test_a_refused_second_run_leaves_the_other_containers_files_alone(holder, tmp_path):
  report, out = holder
  inp = tmp_path / "in"
  inp.mkdir()
  ft.make_dataset(str(inp), 1, 5, 100)
  r = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1")
  assert r.returncode == 2, r.stderr
  line = ft.one_line(r.stderr)
  assert "being written by another conversion" in line and report["host"] in line, line
  assert "has exited" not in line
  assert os.path.exists(report["temp"])
  # Nor do this namespace's sweeps of dead runs' leftovers remove the live holder's.
  assert report["temp"] not in ondisk.remove_stale_temps(str(out))
  assert os.path.dirname(report["staging"]) == os.path.dirname(report["run_dir"]) == str(tmp_path)
  _writer.sweep_dead_staging(str(tmp_path))
  assert run_tempdir.sweep_dead_runs(str(tmp_path)) == []
  assert all(os.path.exists(report[k]) for k in ("temp", "staging", "run_dir"))
