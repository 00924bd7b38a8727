"""Shared helpers for the fault tests: datasets, real CLI processes, real mounts."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> int:
  import crc32c  # pylint: disable=g-import-not-at-top
  crc = crc32c.crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def write_tfrecords(path: str | os.PathLike, records: list[bytes]) -> str:
  """Writes TFRecord framing directly (fast for the many records these tests need).

  The framing is checked against TensorFlow's own writer in test_tfrecord_reader.
  """
  path = os.fspath(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    for r in records:
      head = struct.pack("<Q", len(r))
      f.write(head + struct.pack("<I", _masked_crc(head)) + r + struct.pack("<I", _masked_crc(r)))
  return path


def make_dataset(directory: str, shards: int, records: int, size: int,
                 seed: int = 0) -> dict[str, list[bytes]]:
  """`shards` TFRecord files of incompressible records; returns {file name: records}."""
  rng = np.random.default_rng(seed)
  out = {}
  for s in range(shards):
    name = f"ds.tfrecord-{s:05d}-of-{shards:05d}"
    blob = rng.bytes(records * size)
    out[name] = [blob[i * size:(i + 1) * size] for i in range(records)]
    write_tfrecords(os.path.join(directory, name), out[name])
  return out


def out_name(name: str) -> str:
  return name.replace(".tfrecord", ".array_record")


def env() -> dict[str, str]:
  e = dict(os.environ)
  e["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [e.get("PYTHONPATH")] if p])
  e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return e


def start_cli(module: str, *args: str, new_session: bool = False) -> subprocess.Popen:
  """A real CLI process (`python -m module args`), output captured as text.

  new_session: in its own session and process group (pgid == pid), so a test
  can signal the whole group as a terminal does, without hitting pytest.
  """
  return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=new_session, preexec_fn=default_signals)


def default_signals() -> None:
  """SIGHUP and SIGINT as a terminal's process has them, also when the tests run under nohup or in the background.

  The CLIs keep a signal that their caller ignores ignored (nohup means: do
  not stop on a hang-up), so a test of their handling must start them with
  the default.
  """
  signal.signal(signal.SIGHUP, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.default_int_handler)


def _stat_fields(pid: int) -> list[str] | None:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].decode().split()
  except (OSError, IndexError):
    return None


def children(pid: int) -> list[int]:
  """Live child processes of `pid` (Linux /proc)."""
  return [int(p) for p in os.listdir("/proc") if p.isdigit() and
          (fields := _stat_fields(int(p))) and fields[1] == str(pid) and fields[0] != "Z"]


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie has exited)."""
  fields = _stat_fields(pid)
  return fields is not None and fields[0] != "Z"


def cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode()
  except OSError:
    return ""


def run_cli(module: str, *args: str, timeout: float = 300,
            open_files: tuple[int, int] | None = None) -> subprocess.CompletedProcess:
  """Runs `python -m module args`; `open_files`: its (soft, hard) limit on open files (`ulimit -n`)."""

  def limit() -> None:
    import resource  # pylint: disable=g-import-not-at-top
    resource.setrlimit(resource.RLIMIT_NOFILE, open_files)

  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env(),
                        capture_output=True, text=True, timeout=timeout,
                        preexec_fn=limit if open_files is not None else None)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen | None = None,
             timeout: float = 120, what: str = "condition") -> None:
  """Polls until `condition()`; fails if `proc` exits first."""
  deadline = time.monotonic() + timeout
  while not condition():
    if proc is not None and proc.poll() is not None:
      out, err = proc.communicate()
      pytest.fail(f"process exited ({proc.returncode}) before {what}:\n{out}\n{err}")
    if time.monotonic() > deadline:
      pytest.fail(f"timed out waiting for {what}")
    time.sleep(0.002)


def stop(proc: subprocess.Popen) -> None:
  """Freezes a process (SIGSTOP) so the test looks at a state that cannot move on."""
  proc.send_signal(signal.SIGSTOP)


def _frozen(pid: int) -> bool:
  """Whether every thread of `pid` has stopped (or exited): a SIGSTOP sent to it took effect."""
  try:
    tasks = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return True
  for task in tasks:
    try:
      with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
        state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
      continue  # Gone meanwhile.
    if state not in (b"T", b"t", b"Z", b"X"):
      return False
  return True


def stop_when(condition: Callable[[], bool], proc: subprocess.Popen, timeout: float = 120,
              what: str = "condition") -> None:
  """Freezes `proc` (SIGSTOP) in a state where `condition()` holds; fails if it exits first.

  `wait_for` then `stop` raced with the process: the state seen could move on
  before the SIGSTOP took effect (a loaded machine runs the test late), e.g.
  the half-written shard published and the next one not begun, or the run
  done. The condition is checked again once the process is frozen; if it no
  longer holds, the process goes on (SIGCONT) and the wait starts again.
  """
  deadline = time.monotonic() + timeout
  while True:
    wait_for(condition, proc, timeout=max(0.1, deadline - time.monotonic()), what=what)
    stop(proc)
    while not _frozen(proc.pid):
      if time.monotonic() > deadline:
        pytest.fail(f"process {proc.pid} did not stop")
      time.sleep(0.001)
    if condition():
      return
    proc.send_signal(signal.SIGCONT)


def listing(directory: str) -> list[str]:
  try:
    return sorted(os.listdir(directory))
  except FileNotFoundError:
    return []


def temps(directory: str) -> list[str]:
  """Converter temp files under a directory (hidden `.name.tmp-...`)."""
  return [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs if ".tmp-" in f]


def published(directory: str) -> list[str]:
  return [f for f in listing(directory) if ".array_record" in f and not f.startswith(".")]


def mid_run(directory: str) -> bool:
  """At least one shard published and the next one being written."""
  return bool(published(directory)) and bool(temps(directory))


def one_line(stderr: str) -> str:
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
  assert "Traceback" not in stderr
  return lines[0]


def fill(folder: str, size: int = 1 << 20) -> None:
  """Takes the free space of a small filesystem with a file named `filler` (up to `size` bytes)."""
  with open(os.path.join(folder, "filler"), "wb") as f:
    try:
      f.write(b"x" * size)
    except OSError:
      pass


@contextlib.contextmanager
def tmpfs(path: str, size: str, read_only: bool = False, inodes: int | None = None) -> Iterator[str]:
  """A real tmpfs of `size` (e.g. '600k') mounted at `path`; unmounted afterwards.

  Needs root (CAP_SYS_ADMIN); otherwise the test is skipped with that reason.
  A read-only mount is the one way to make a directory unwritable for root,
  which `chmod` cannot.
  """
  os.makedirs(path, exist_ok=True)
  opts = f"size={size}" + (",ro" if read_only else "") + (f",nr_inodes={inodes}" if inodes else "")
  try:
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                          capture_output=True, text=True)
  except FileNotFoundError:
    pytest.skip("no `mount` command here: cannot make a real small or read-only filesystem")
  if proc.returncode != 0:
    pytest.skip(f"`mount -t tmpfs` failed (it needs root / CAP_SYS_ADMIN; uid "
                f"{os.geteuid()}): {proc.stderr.strip()}")
  try:
    yield path
  finally:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
      subprocess.run(["umount", "-l", path], capture_output=True)


def error_of(fn: Callable[[], object]) -> Exception:
  """The exception fn() raises; fails the test if it returns."""
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    return e
  raise AssertionError("no error was raised")


def in_time(fn, seconds: float = 20):
  """fn()'s exception, raised within `seconds` (a hang fails the test instead of the run)."""
  result: list[BaseException | None] = []

  def run():
    try:
      fn()
      result.append(None)
    except BaseException as e:  # pylint: disable=broad-except
      result.append(e)

  t = threading.Thread(target=run, daemon=True)
  t.start()
  t.join(seconds)
  assert result, f"still running after {seconds} s"
  return result[0]


def run_cli_in_memory(module: str, *args: str, address_space: int, timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs `python -m module args` with at most `address_space` bytes of virtual memory (`ulimit -v`)."""

  def limit() -> None:
    import resource  # pylint: disable=g-import-not-at-top
    resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.getrlimit(resource.RLIMIT_AS)[1]))

  e = env()
  # glibc reserves 64 MiB of address space per malloc arena, up to 8 per core: the same run's footprint would
  # grow with the machine's cores, and a limit that fits here would not fit there.
  e["MALLOC_ARENA_MAX"] = "2"
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=e,
                        capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def in_fork(fn: Callable[[], str], seconds: float = 30) -> str:
  """fn()'s result (or its exception's type name and message) in a child made with os.fork.

  The child ends with os._exit: no exit hook of the parent's (pytest's, multiprocessing's) runs there.
  """
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      try:
        out = fn()
      except BaseException as e:  # pylint: disable=broad-except
        out = f"{type(e).__name__}: {e}"
      os.write(write, out.encode())
    finally:
      os._exit(0)
  os.close(write)
  deadline = time.monotonic() + seconds
  chunks = []
  with os.fdopen(read, "rb") as f:
    while True:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([f], [], [], left)[0]:
        os.kill(pid, signal.SIGKILL)  # A hung child would outlive the test otherwise.
        os.waitpid(pid, 0)
        raise AssertionError(f"the forked child ran past {seconds} s")
      chunk = os.read(f.fileno(), 1 << 16)
      if not chunk:
        break
      chunks.append(chunk)
  os.waitpid(pid, 0)
  return b"".join(chunks).decode()
