"""`--workers N|auto`: how many local processes a DirectRunner conversion uses.

Beam's DirectRunner converts in one process unless told
`--direct_running_mode multi_processing --direct_num_workers N`. Worker
processes pay off only on enough data: they add about 2.5 s of wall time
(measured by bench/convert.py), while one core converts about 70 MB of
TFRecord input per second with `group_size:1` (bound by ArrayRecordWriter's
zstd per record). `auto` runs
min(cores, shards) workers when the estimate says that saves at least 10%,
else converts in-process. Explicit Beam flags always win.

DirectRunner runs on Beam's FnApiRunner here. Beam 2.77's DirectRunner would
first download and try the Prism runner (from GitHub), which runs Python in
one process whatever --direct_num_workers says, and falls back to FnApiRunner
only when that fails; running FnApiRunner directly makes the mode that the
summary reports the one that ran, and a local conversion never reaches for
the network.

`TiedWorkers` ties those worker processes to the run that starts them: in a
session of their own (a terminal's Ctrl-C reaches only the launcher, which
stops them and prints one line), holding the output directory's lock, and
dying with the launcher (`pipelines.sdk_worker`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

# Cores this process may run on (its CPU affinity): the loader's count.
from loader.engine import available_cores as usable_cores

AUTO = "auto"
# Measured on the 2-core benchmark machine (bench/convert.py): the wall time
# that worker processes add (~1.6 s to start and stop Beam's SDK workers, plus
# ~10% slower shards while they share the cores), and the input MB one core
# converts per second with the default writer options.
STARTUP_S = 2.5
PER_CORE_MB_S = 70.0
# Use workers only when they are estimated to save at least this fraction.
MIN_SAVING = 0.10
DIRECT_RUNNERS = ("directrunner", "direct", "switchingdirectrunner")
BEAM_FLAGS = ("direct_running_mode", "direct_num_workers")


def parse_workers(value: str) -> int | str:
  """argparse type of --workers: a positive integer or 'auto'."""
  if value.strip().lower() == AUTO:
    return AUTO
  try:
    n = int(value)
  except ValueError:
    n = 0
  if n < 1:
    raise argparse.ArgumentTypeError(
        f"must be a positive number of worker processes or {AUTO!r}, got {value!r}")
  return n


def add_flag(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
      "--workers", type=parse_workers, default=AUTO, metavar="N|auto",
      help="Local worker processes (DirectRunner). 'auto' (default): one per core, up to "
      "one per shard, when the input is large enough for their ~2.5 s start-up to pay "
      "off; else in-process. 1: in-process. Explicit --direct_running_mode / "
      "--direct_num_workers win.")


def estimate_seconds(sizes: Sequence[int], workers: int) -> float:
  """Estimated wall time to convert shards of these byte sizes with N processes.

  Beam hands each worker an equal share of the shards by count, not by size,
  so the busiest worker gets ceil(k / N) average shards, and never less than
  the largest shard.
  """
  if not sizes:
    return 0.0
  rate = PER_CORE_MB_S * 1e6
  if workers <= 1:
    return sum(sizes) / rate
  busiest = max(max(sizes), math.ceil(len(sizes) / workers) * sum(sizes) / len(sizes))
  return STARTUP_S + busiest / rate


def _flag_value(beam_args: Sequence[str], name: str) -> str | None:
  value = None
  for i, arg in enumerate(beam_args):
    if arg in (f"--{name}", f"--{name.replace('_', '-')}") and i + 1 < len(beam_args):
      value = beam_args[i + 1]
    elif arg.startswith((f"--{name}=", f"--{name.replace('_', '-')}=")):
      value = arg.split("=", 1)[1]
  return value


def runner_name(beam_args: Sequence[str]) -> str:
  return _flag_value(beam_args, "runner") or "DirectRunner"


def is_direct(runner: str) -> bool:
  return runner.rsplit(".", 1)[-1].lower() in DIRECT_RUNNERS


@dataclasses.dataclass(frozen=True)
class Decision:
  """The local execution mode of one run.

  Attributes:
    workers: Worker processes (1: in-process); None when another runner or
      explicit Beam flags decide.
    reason: Why, in words, for the summary.
    beam_flags: Flags to add to the Beam arguments.
    direct: Whether the run is on DirectRunner (run by FnApiRunner).
  """

  workers: int | None
  reason: str
  beam_flags: tuple[str, ...] = ()
  direct: bool = True

  @property
  def mode(self) -> str:
    if self.workers is None:
      return "as the runner's flags say"
    if self.workers == 1:
      return "in-process (1 worker)"
    return f"{self.workers} worker processes (Beam multi_processing)"

  @property
  def summary(self) -> str:
    return f"Workers: {self.mode}: {self.reason}."

  def runner(self, options):
    """The runner to give beam.Pipeline: FnApiRunner for DirectRunner, else None."""
    return local_runner(options) if self.direct else None


def _mode_flags(workers: int) -> tuple[str, ...]:
  mode = "in_memory" if workers == 1 else "multi_processing"
  return (f"--direct_running_mode={mode}", f"--direct_num_workers={workers}")


def decide(requested: int | str, sizes: Sequence[int], beam_args: Sequence[str] = (),
           cores: int | None = None) -> Decision:
  """Chooses in-process or N worker processes for a conversion.

  Args:
    requested: --workers: a positive int or 'auto'.
    sizes: Input bytes of each shard to convert (kept shards excluded).
    beam_args: The Beam flags given; explicit --direct_running_mode /
      --direct_num_workers win, and other runners schedule their own workers.
    cores: Usable cores (default: this process's CPU affinity).

  Raises:
    ValueError: --workers N with a runner other than DirectRunner.
  """
  runner = runner_name(beam_args)
  if runner.rsplit(".", 1)[-1].lower() in ("dataflowrunner", "testdataflowrunner"):
    # Here nothing stages the toolkit for Dataflow's workers, and a machine without Google Cloud credentials
    # waited for minutes (Beam retries) with nothing said.
    raise ValueError(f"--runner {runner}: submit Dataflow jobs with arrayrecord-dataflow (the same converter flags; "
                     "--tfds-dataset-dir for a TFDS dataset), which stages this toolkit for the workers and checks "
                     "the Google Cloud flags and credentials first.")
  if not is_direct(runner):
    if requested != AUTO:
      raise ValueError(f"--workers {requested} applies to DirectRunner only; {runner} "
                       "schedules its own workers (see its parallelism flags).")
    return Decision(None, f"{runner} schedules its own workers", direct=False)
  explicit = [f"--{n} {_flag_value(beam_args, n)}" for n in BEAM_FLAGS
              if _flag_value(beam_args, n) is not None]
  count = _flag_value(beam_args, "direct_num_workers")
  if count is not None and count.lstrip().startswith("-"):
    # Beam takes it and fails deep inside with "IndexError: list index out of range".
    raise ValueError(f"--direct_num_workers must be 0 (one worker per core) or a positive number of worker "
                     f"processes, got {count}; or leave the Beam flags out and use --workers N|auto.")
  if explicit:
    ignored = f"; --workers {requested} not applied" if requested != AUTO else ""
    return Decision(None, f"explicit Beam flags {' '.join(explicit)}{ignored}")
  shards, mb = len(sizes), sum(sizes) / 1e6
  if requested != AUTO:
    n = max(1, min(int(requested), shards))
    capped = f" (capped at the {shards} shard(s) to convert)" if n < requested else ""
    limit = open_files_short_of(n)
    if limit is not None:
      raise ValueError(f"--workers {requested} needs at least {open_files_needed(n)} open files per process, but "
                       f"the limit is {limit} (ulimit -n); raise it (ulimit -n 4096) or use --workers 1.")
    return Decision(n, f"--workers {requested}{capped}", _mode_flags(n))
  cores = cores or usable_cores()
  n = min(cores, shards)
  limit = open_files_short_of(n) if n > 1 else None
  if limit is not None:
    return Decision(1, f"auto: the open-file limit ({limit}, ulimit -n) is too low for {n} worker processes "
                    f"(they need {open_files_needed(n)})", _mode_flags(1))
  if n <= 1:
    why = f"{cores} usable core" if cores <= 1 else f"{shards} shard(s) to convert"
    return Decision(1, f"auto: {why}", _mode_flags(1))
  serial, parallel = estimate_seconds(sizes, 1), estimate_seconds(sizes, n)
  estimate = f"est. {_seconds(parallel)} s with {n} workers vs {_seconds(serial)} s in-process"
  if parallel <= (1 - MIN_SAVING) * serial:
    return Decision(n, f"auto: min({cores} cores, {shards} shards) for {mb:,.0f} MB; "
                    f"{estimate}", _mode_flags(n))
  return Decision(1, f"auto: {mb:,.0f} MB in {shards} shard(s) is too little for worker "
                  f"start-up (~{STARTUP_S:g} s) to pay off; {estimate}", _mode_flags(1))


def open_files_needed(workers: int) -> int:
  """Descriptors a run with `workers` Beam worker processes needs per process (with room to spare).

  Beam's gRPC channels, the inputs and outputs open per bundle: too few, and
  a worker fails to connect (exit code 1) or the run hangs (measured: 2
  workers fail at 24 and run at 32; 4 hang at 32 and run at 40).
  """
  return 64 + 16 * workers


def open_files_short_of(workers: int) -> int | None:
  """None if this process may open enough files for `workers` worker processes (raising its soft limit
  towards the hard one if needed, as the workers inherit it); else the limit."""
  if workers <= 1:
    return None
  try:
    import resource  # pylint: disable=g-import-not-at-top  # POSIX only.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  except (ImportError, OSError, ValueError):
    return None
  need = open_files_needed(workers)
  if soft == resource.RLIM_INFINITY or soft >= need:
    return None
  target = need if hard == resource.RLIM_INFINITY else min(hard, max(need, 4096))
  if target > soft:
    try:
      resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
      soft = target
    except (OSError, ValueError):
      pass
  return None if soft >= need else soft


def local_runner(options):
  """Beam's FnApiRunner, set up as DirectRunner sets it up when it falls back to it.

  Uses Beam 2.77 internals (the ones SwitchingDirectRunner.run_pipeline
  uses): the provision info carries the pipeline options to the SDK worker
  processes of a multi_processing run (filesystem settings for gs://).
  """
  # Beam is imported here, not at module level: parsing --workers needs no Beam.
  from apache_beam.portability.api import beam_provision_api_pb2
  from apache_beam.runners.portability.fn_api_runner import fn_runner
  from apache_beam.runners.portability.portable_runner import JobServiceHandle
  encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
  info = fn_runner.ExtendedProvisionInfo(
      beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
  _stop_workers_side_by_side()
  return fn_runner.FnApiRunner(provision_info=info)


# Beam 2.77's multi_processing worker command (fn_runner.FnApiRunner.run_pipeline).
_BEAM_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"
_WATCH_S = 0.2  # How often TiedWorkers looks for a worker that died.
_DEATH_GRACE_S = 1.0  # How long an error in one of Beam's threads waits for a worker's death to show.
_BEAM_WORKER_COMMAND = "%s -m " + _BEAM_WORKER_MAIN


class _WorkerSpawner:
  """Stands in for the `subprocess` module inside Beam's local_job_service.

  That module starts each SDK worker with `subprocess.Popen(command,
  shell=True)`: in our process group (so a terminal's Ctrl-C kills the
  workers mid-bundle, and Beam prints their deaths as tracebacks) and
  without the lock. Its worker command becomes `exec python -m
  pipelines.sdk_worker PID apache_beam.runners.worker.sdk_worker_main` in a
  session of its own, with the descriptors in `keep_fds` inherited; any other
  command runs unchanged.
  """

  def __init__(self, real: Any):
    self._real = real
    self.keep_fds: tuple[int, ...] = ()
    self.procs: list[subprocess.Popen] = []
    self.stopped = False
    # Reentrant: stop() runs in a signal handler, which may interrupt stop() itself.
    self._lock = threading.RLock()

  def __getattr__(self, name: str) -> Any:
    return getattr(self._real, name)

  def Popen(self, args, **kwargs):  # pylint: disable=invalid-name  # subprocess's name.
    if not (kwargs.get("shell") and args == _BEAM_WORKER_COMMAND % sys.executable):
      return self._real.Popen(args, **kwargs)
    # `exec`: the worker is the process Popen started, so its parent is us (PR_SET_PDEATHSIG).
    args = f"exec {shlex.quote(sys.executable)} -m pipelines.sdk_worker {os.getpid()} {_BEAM_WORKER_MAIN}"
    kwargs["start_new_session"] = True
    if self.keep_fds:
      kwargs["pass_fds"] = tuple(self.keep_fds)
    # Until the child has its own session it is in our process group, so a
    # group Ctrl-C (killpg) could reach it: blocked here, the child inherits
    # the block (pipelines.sdk_worker lifts it once in its own session), and
    # we get them once unblocked.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
    try:
      proc = self._real.Popen(args, **kwargs)
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    with self._lock:
      self.procs.append(proc)
      if self.stopped:  # The run was stopped while this worker was being started.
        _kill(proc)
    return proc

  def start(self, keep_fds: tuple[int, ...]) -> None:
    with self._lock:
      self.keep_fds, self.procs, self.stopped = keep_fds, [], False

  def stop(self) -> None:
    """Kills the workers started so far, and any started from now on."""
    with self._lock:
      self.stopped = True
      for proc in self.procs:
        _kill(proc)


def _zombie_exit_code(pid: int) -> int | None:
  """A dead, not yet reaped process's exit code as Popen gives it (-N: signal N); None if it runs (Linux /proc)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      fields = f.read().rsplit(b")", 1)[1].split()
  except (OSError, IndexError):
    return None
  if fields[0] != b"Z" or len(fields) < 50:
    return None
  status = int(fields[-1])  # The wait status (field 52, Linux >= 3.5).
  return -(status & 0x7F) if status & 0x7F else status >> 8


_GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _kill(proc: subprocess.Popen) -> None:
  if proc.poll() is None:
    try:
      os.kill(proc.pid, signal.SIGKILL)
    except OSError:
      pass  # Exited meanwhile.


def _spawner() -> _WorkerSpawner | None:
  """Puts the _WorkerSpawner into Beam's local_job_service once; None if Beam changed."""
  from apache_beam.runners.portability import local_job_service
  current = getattr(local_job_service, "subprocess", None)
  if isinstance(current, _WorkerSpawner):
    return current
  if current is not subprocess:
    return None  # Not the module we know how to stand in for: Beam's own behaviour.
  local_job_service.subprocess = _WorkerSpawner(subprocess)
  return local_job_service.subprocess


class TiedWorkers:
  """Ties the SDK worker processes of one local run to it; a context manager around the pipeline.

  The workers run in their own session, so Ctrl-C or a hang-up on the
  terminal reaches only this process; they hold the output directory's lock
  (the descriptors in `keep_fds`), so it is not free while any of them lives;
  and they die with this process (pipelines.sdk_worker). `stop()` (given to
  ConversionGuard.on_stop) kills them at once when a signal stops the run;
  leaving the block with an error does too. Meanwhile the tracebacks Beam's
  threads print about workers that were stopped are dropped: the run's one
  line says what happened.
  """

  def __init__(self, keep_fds: Sequence[int | None] = (), on_death: Callable[[str], None] | None = None):
    self._keep_fds = tuple(fd for fd in keep_fds if fd is not None)
    self._spawner: _WorkerSpawner | None = None
    self._stopping = False
    self._hook = None
    self._on_death = on_death
    self._watching = threading.Event()
    self._death_lock = threading.RLock()

  def __enter__(self) -> TiedWorkers:
    self._spawner = _spawner()
    if self._spawner is not None:
      self._spawner.start(self._keep_fds)
    self._hook = threading.excepthook
    threading.excepthook = self._excepthook
    if self._on_death is not None and self._spawner is not None:
      self._watching.set()
      threading.Thread(target=self._watch, name="arrayrecord-worker-watch", daemon=True).start()
    return self

  def _watch(self) -> None:
    """Ends the run once a worker dies uncalled for (the out-of-memory killer, say).

    Beam would wait for a starting worker forever, or fail later with a bare
    `Empty` from its queues, after its threads' tracebacks.
    """
    while self._watching.is_set():
      self._report_death()
      time.sleep(_WATCH_S)

  def _report_death(self) -> bool:
    """Calls on_death (once) if a worker died; whether one did."""
    if self._on_death is None or self._spawner is None or not self._watching.is_set():
      return False
    with self._death_lock:
      for proc in list(self._spawner.procs):
        code = proc.returncode if proc.returncode is not None else _zombie_exit_code(proc.pid)
        if not code or self._stopping:
          continue
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exited with code {code}")
        if code == -signal.SIGKILL:
          how += " (often the out-of-memory killer: give the run more memory or fewer --workers)"
        self._stopping = True  # Beam's threads' tracebacks about it are muted.
        self._on_death(f"a Beam worker process (pid {proc.pid}) {how}")
        return True
    return self._stopping

  def _excepthook(self, args) -> None:
    # A worker's death shows first as errors in Beam's threads (its gRPC
    # streams, its process waiter), which may come before the process is a
    # zombie (the kernel closes its sockets first): the run's one line says
    # what happened.
    deadline = time.monotonic() + _DEATH_GRACE_S
    while not (self._stopping or self._report_death()):
      if time.monotonic() > deadline:
        self._hook(args)
        return
      time.sleep(_DEATH_GRACE_S / 20)

  def stop(self) -> None:
    """Kills the run's worker processes now (their temp files are removed as dead runs')."""
    self._stopping = True
    if self._spawner is not None:
      self._spawner.stop()

  def __exit__(self, exc_type, exc, tb) -> None:
    self._watching.clear()
    try:
      if exc_type is not None:
        self.stop()
        for proc in self._spawner.procs if self._spawner is not None else ():
          try:
            proc.wait(timeout=5)
          except subprocess.TimeoutExpired:
            pass
        # Beam's thread per worker reports the death when it sees it: let it, while muted.
        for t in threading.enumerate():
          if t.name == "run_worker" and t is not threading.current_thread():
            t.join(timeout=5)
    finally:
      if threading.excepthook == self._excepthook:
        threading.excepthook = self._hook
      if self._spawner is not None:
        self._spawner.start(())  # Forget this run's workers and descriptors.


def _stop_workers_side_by_side() -> None:
  """Makes the end of a run stop all SDK worker processes at once.

  Beam 2.77's WorkerHandlerManager.close_all stops them one after another,
  waiting for each process to exit (~0.3 s each here) before telling the
  next one to stop. Sending every worker its end-of-work marker first lets
  them exit side by side; close_all then only waits. If these internals
  change, Beam's own shutdown runs unchanged.
  """
  from apache_beam.runners.portability.fn_api_runner import worker_handlers as wh
  manager = getattr(wh, "WorkerHandlerManager", None)
  done = getattr(getattr(wh, "BeamFnControlServicer", None), "_DONE_MARKER", None)
  close_all = getattr(manager, "close_all", None)
  if close_all is None or done is None or getattr(close_all, "_side_by_side", False):
    return

  def close_all_side_by_side(self):
    started = getattr(wh.BeamFnControlServicer, "STARTED_STATE", None)
    for handlers in getattr(self, "_cached_handlers", {}).values():
      for handler in set(handlers):
        conn = getattr(handler, "control_conn", None)
        # A second marker from close_all itself is never read: the stream ends at the first.
        if conn is not None and getattr(conn, "_state", None) == started:
          conn.push(done)
    close_all(self)

  close_all_side_by_side._side_by_side = True  # pylint: disable=protected-access
  manager.close_all = close_all_side_by_side


def _seconds(s: float) -> str:
  return f"{s:.1f}" if s < 10 else f"{s:.0f}"  # A small conversion is 0.4 s, not "0 s".
