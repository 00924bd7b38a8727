"""pipelines.workers: --workers N|auto, and the conversions it runs (real DirectRunner)."""

from __future__ import annotations

import argparse
import os
import re
import threading

import psutil
import pytest

import faults_testing as ft
from converter import read_manifest
from pipelines import convert, make_example_data, workers

pytestmark = pytest.mark.timeout(300)

MB = 1_000_000


@pytest.fixture(scope="module")
def tfr(tmp_path_factory):
  folder = tmp_path_factory.mktemp("workers") / "tfr"
  make_example_data.make_example_data(str(folder), shards=4, records_per_shard=50)
  return str(folder / "*")


class _SdkWorkers:
  """Counts Beam SDK worker processes started under this process while active."""

  def __init__(self):
    self.pids: set[int] = set()
    self._stop = threading.Event()

  def _watch(self):
    me = psutil.Process()
    while not self._stop.wait(0.05):
      for child in me.children(recursive=True):
        try:
          cmd = child.cmdline()
          # Beam starts each worker through /bin/sh -c; count the Python processes.
          if "sdk_worker_main" in " ".join(cmd) and "python" in os.path.basename(cmd[0]):
            self.pids.add(child.pid)
        except psutil.Error:
          pass

  def __enter__(self):
    self._thread = threading.Thread(target=self._watch, daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *_):
    self._stop.set()
    self._thread.join()


def _convert(capsys, tfr, out, *flags):
  with _SdkWorkers() as seen:
    rc = convert.main(["--input", tfr, "--output", out, "--quiet", *flags])
  captured = capsys.readouterr()
  assert rc == 0, captured.err
  manifest = read_manifest(out)
  assert manifest["totals"]["converted"] == 4 and manifest["totals"]["records"] == 200
  summary = [line for line in captured.out.splitlines() if line.startswith("Workers: ")]
  assert len(summary) == 1, captured.out
  return summary[0], seen.pids


# --- The decision, from shard sizes and cores ---------------------------------------


def test_parse_workers():
  assert workers.parse_workers("auto") == "auto"
  assert workers.parse_workers("AUTO") == "auto"
  assert workers.parse_workers("3") == 3
  for bad in ("0", "-2", "two", ""):
    with pytest.raises(argparse.ArgumentTypeError, match=f"got {bad!r}"):
      workers.parse_workers(bad)


def test_auto_uses_all_cores_on_a_large_input():
  d = workers.decide("auto", [170 * MB] * 8, cores=2)
  assert d.workers == 2 and d.direct
  assert d.beam_flags == ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
  assert "min(2 cores, 8 shards)" in d.reason


def test_auto_stays_in_process_when_start_up_would_not_pay_off():
  d = workers.decide("auto", [171 * MB // 8] * 8, cores=2)  # Measured to gain nothing.
  assert d.workers == 1
  assert d.beam_flags == ("--direct_running_mode=in_memory", "--direct_num_workers=1")
  assert "too little for worker start-up" in d.reason and "171 MB" in d.reason


def test_auto_is_capped_by_shards_and_by_one_huge_shard():
  assert workers.decide("auto", [2000 * MB] * 3, cores=16).workers == 3
  assert workers.decide("auto", [5000 * MB], cores=16).workers == 1
  # One shard holds nearly everything: workers cannot split it, so no gain.
  assert workers.decide("auto", [3000 * MB] + [10 * MB] * 7, cores=2).workers == 1
  d = workers.decide("auto", [100 * MB] * 4, cores=1)
  assert d.workers == 1 and "1 usable core" in d.reason


def test_break_even_size_follows_the_measured_start_up():
  """On 2 cores the estimate switches to workers between 171 MB and 1.36 GB."""
  sizes = lambda total: [total * MB // 8] * 8  # pylint: disable=unnecessary-lambda-assignment
  switch = next(mb for mb in range(50, 2000, 10)
                if workers.decide("auto", sizes(mb), cores=2).workers == 2)
  assert 171 < switch < 1360
  # Equal shards: STARTUP + S / 2r <= (1 - MIN_SAVING) * S / r.
  expected = workers.STARTUP_S * workers.PER_CORE_MB_S / ((1 - workers.MIN_SAVING) - 1 / 2)
  assert abs(switch - expected) <= 10


def test_explicit_workers_and_explicit_beam_flags():
  d = workers.decide(3, [MB] * 8)
  assert d.workers == 3 and d.reason == "--workers 3"
  assert workers.decide(8, [MB] * 2).workers == 2  # Never more workers than shards.
  flags = ["--direct_running_mode", "multi_processing", "--direct_num_workers=2"]
  d = workers.decide(1, [MB] * 8, flags)
  assert d.workers is None and d.beam_flags == () and d.direct
  assert d.reason == ("explicit Beam flags --direct_running_mode multi_processing "
                      "--direct_num_workers 2; --workers 1 not applied")


def test_other_runners_schedule_their_own_workers():
  d = workers.decide("auto", [MB], ["--runner", "FlinkRunner"])
  assert not d.direct and d.workers is None and d.runner(None) is None
  with pytest.raises(ValueError, match="--workers 2 applies to DirectRunner only; FlinkRunner"):
    workers.decide(2, [MB], ["--runner=FlinkRunner"])


def test_workers_with_another_runner_is_a_one_line_usage_error(tfr, tmp_path, capsys):
  rc = convert.main(["--input", tfr, "--output", str(tmp_path / "o"), "--workers", "2",
                     "--runner", "FlinkRunner"])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1
  assert "--workers 2 applies to DirectRunner only" in err


def test_bad_workers_value_is_a_usage_error(tfr, tmp_path, capsys):
  with pytest.raises(SystemExit) as info:
    convert.main(["--input", tfr, "--output", str(tmp_path / "o"), "--workers", "0"])
  assert info.value.code == 2
  assert "--workers: must be a positive number of worker processes or 'auto', got '0'" in (
      capsys.readouterr().err)


# --- Real runs: the summary says what ran, and it is what ran -------------------------


def test_small_input_converts_in_process_by_default(tfr, tmp_path, capsys):
  line, pids = _convert(capsys, tfr, str(tmp_path / "out"))
  assert line.startswith("Workers: in-process (1 worker): auto: ")
  assert "too little for worker start-up" in line
  assert not pids


def test_workers_2_runs_two_worker_processes(tfr, tmp_path, capsys):
  line, pids = _convert(capsys, tfr, str(tmp_path / "out"), "--workers", "2")
  assert line == "Workers: 2 worker processes (Beam multi_processing): --workers 2."
  assert len(pids) == 2


def test_explicit_beam_flags_win_over_workers(tfr, tmp_path, capsys):
  line, pids = _convert(capsys, tfr, str(tmp_path / "out"), "--workers", "1",
                        "--direct_running_mode", "multi_processing", "--direct_num_workers", "2")
  assert line == ("Workers: as the runner's flags say: explicit Beam flags "
                  "--direct_running_mode multi_processing --direct_num_workers 2; "
                  "--workers 1 not applied.")
  assert len(pids) == 2


def test_tfds_cli_has_the_same_flag():
  from pipelines import tfds_convert
  args, _ = tfds_convert._parser().parse_known_args(["--dataset_dir", "d", "--workers", "3"])
  assert args.workers == 3


def test_workers_are_told_to_stop_before_any_is_waited_for(tfr, tmp_path, capsys, monkeypatch):
  # Beam stops SDK worker processes one by one (~0.3 s each); ours sends every worker its
  # end marker first, so they exit side by side.
  from apache_beam.runners.portability.fn_api_runner import worker_handlers as wh
  events = []
  push, stop = wh.ControlConnection.push, wh.SubprocessSdkWorkerHandler.stop_worker

  def spy_push(self, req):
    if req is wh.BeamFnControlServicer._DONE_MARKER:  # pylint: disable=protected-access
      events.append(("done", id(self)))
    return push(self, req)

  def spy_stop(self):
    events.append(("stop", id(self)))
    return stop(self)

  monkeypatch.setattr(wh.ControlConnection, "push", spy_push)
  monkeypatch.setattr(wh.SubprocessSdkWorkerHandler, "stop_worker", spy_stop)
  _, pids = _convert(capsys, tfr, str(tmp_path / "out"), "--workers", "2")
  assert len(pids) == 2
  first_stop = next(i for i, (kind, _) in enumerate(events) if kind == "stop")
  assert len({conn for kind, conn in events[:first_stop] if kind == "done"}) == 2, events
  assert read_manifest(str(tmp_path / "out"))["shards"]


def test_a_corrupt_record_in_a_worker_process_is_one_line_on_stderr(tmp_path):
  # Beam's SDK worker processes print the failed bundle's traceback to the
  # stderr they inherit; the CLI holds it back and prints only its own line.
  folder = tmp_path / "tfr"
  make_example_data.make_example_data(str(folder), shards=2, records_per_shard=50)
  bad = sorted(folder.iterdir())[0]
  data = bytearray(bad.read_bytes())
  data[3000] ^= 0xFF
  bad.write_bytes(data)
  out = tmp_path / "out"
  proc = ft.run_cli("pipelines.convert", "--input", str(folder / "*"), "--output", str(out), "--workers", "2",
                    "--quiet")
  assert proc.returncode == 1
  line = ft.one_line(proc.stderr)
  assert line.startswith(f"arrayrecord-convert: error: {bad}: record ") and "at byte offset" in line
  assert not any(p.name.endswith(bad.name.split(".tfrecord")[1]) for p in out.glob("*"))


def test_a_low_open_file_limit_is_refused_or_raised_before_any_work(tfr, tmp_path):
  # Beam's workers under `ulimit -n 24` fail to connect ("exited with code 1")
  # or, with more workers, the run hangs.
  hard = 24
  out = tmp_path / "o"
  proc = ft.run_cli("pipelines.convert", "--input", tfr, "--output", str(out), "--workers", "2", "--quiet",
                    open_files=(24, hard))
  assert proc.returncode == 2, proc.stderr
  # At 24 files, gRPC's poller thread (started when Beam is imported) now and
  # then logs "epoll_wait error: Bad file descriptor" in its own format as the
  # process ends (seen once in a full CI run); that line is gRPC's, not the refusal's.
  grpc_log = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
  stderr = "\n".join(line for line in proc.stderr.splitlines() if not grpc_log.match(line))
  assert ft.one_line(stderr) == (
      "arrayrecord-convert: error: --workers 2 needs at least 96 open files per process, but the limit is 24 "
      "(ulimit -n); raise it (ulimit -n 4096) or use --workers 1.")
  assert not out.exists()  # Nothing left behind.
  # --workers auto converts in process instead; a soft limit below the hard one is raised.
  for soft_hard, mode in (((24, 24), "in-process (1 worker): auto: the open-file limit (24, ulimit -n) is too low"),
                          ((24, 4096), "2 worker processes")):
    out = tmp_path / f"o{soft_hard[1]}"
    flags = ("--workers", "2") if soft_hard[1] > hard else ()
    proc = ft.run_cli("pipelines.convert", "--input", tfr, "--output", str(out), *flags, open_files=soft_hard)
    assert proc.returncode == 0, proc.stderr
    assert f"Workers: {mode}" in proc.stdout
    assert len(read_manifest(str(out))["shards"]) > 0


def test_a_pipeline_that_fails_while_being_built_leaves_no_beam_temp_folder(tmp_path, monkeypatch):
  # Beam removes its temp folder after a run; a run whose building failed never runs.
  import argparse
  import tempfile
  from converter.guard import ConversionGuard
  from converter.options import ConvertOptions
  from pipelines import local_run
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  src = tmp_path / "in-00000-of-00001"
  src.write_bytes(b"")
  guard = ConversionGuard([str(src)], ConvertOptions(output_dir=str(tmp_path / "out")))

  def add(p):
    raise ValueError("a bad transform")

  with pytest.raises(ValueError, match="a bad transform"):
    local_run.run(guard, argparse.Namespace(workers=1, quiet=True), ["--runner=DirectRunner"],
                  lambda runner, mode: "", add)
  assert os.listdir(scratch) == []
  assert not (tmp_path / "out").exists()
