"""One local conversion run, made safe: checked up front, locked, and cleaned up.

`ConversionGuard` does, before any work starts:
  - refuses an output that is a file or cannot be written, inputs that are
    not regular files, a --compression that does not fit the files, and free
    space clearly below what the conversion needs, each in one line;
  - takes the output directory's lock (one writer per directory), removes
    temp files of dead runs, and plans the shards.
Used as a context manager around the pipeline, it releases the lock, removes
this run's temp files if the run fails, and turns Ctrl-C, SIGTERM and SIGHUP
(a closed terminal) into `Interrupted` ("interrupted; N of M shards complete;
rerun with --skip-existing to resume"). A run that fails before it changed
any shard puts back the manifest.json it found.

  guard = ConversionGuard(files, options)          # checks, lock, plan
  with guard, beam.Pipeline(options=opts) as p:
    ...
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import sys
import threading
import time
from typing import Any, Callable, Sequence

from converter import writer as _writer
from converter.errors import CompressionMismatchError, Interrupted, OutputError, OutputLockedError
from converter.manifest import INCOMPLETE
from converter.options import ConvertOptions
from converter.planning import ShardPlan, file_key, plan_shards
from converter.tfrecord import detect_compression
from loader import ondisk

# Refuse a run whose output filesystem has less free space than this share of
# the input bytes to convert: outputs are about as large as uncompressed inputs.
MIN_FREE_SHARE = 0.5
# The smallest ArrayRecord file the writer makes (an empty one; any writer
# options): its header and footer blocks, 64 KiB each.
SMALLEST_OUTPUT = 128 * 1024


class ConversionGuard:
  """Checks, locks and plans a conversion into a local or remote output directory.

  Args:
    inputs: The input files (already matched).
    options: The conversion options.
    plan: Makes the shard plans once the lock is held (default: plan_shards).

  Raises:
    OutputError, OutputLockedError, ConversionError: one line each, before any
      work; nothing is left behind (a directory it created is removed).
  """

  def __init__(self, inputs: Sequence[str], options: ConvertOptions,
               plan: Callable[[Sequence[str], ConvertOptions], list[ShardPlan]] = plan_shards):
    self.options = options
    self.output_dir = options.output_dir
    self.local = _writer.is_local(self.output_dir)
    self._created: list[str] = []
    self._created_ids: dict[str, tuple[int, int] | None] = {}
    self._new_subfolders: list[str] = []
    self._lock: ondisk.DirLock | None = None
    self.interrupted: str | None = None  # The signal that stopped the run.
    # Called (in the main thread) when a signal stops the run, before it
    # unwinds: e.g. to end worker processes at once instead of after their shard.
    self.on_stop: list[Callable[[], None]] = []
    # The run's own folders outside the output (Beam's local temp folder):
    # removed when the run must end at once, where no `finally` runs.
    self.scratch_dirs: list[str] = []
    self._old_handlers: dict[int, Any] = {}
    self._watchdog: threading.Timer | None = None
    self._manifest_before: bytes | None = None
    try:
      # From here on (the lock is taken next) a SIGTERM must unwind, not kill: it would leave the lock file.
      self._install_handlers()
      check_compression(inputs, options.compression)
      if self.local:
        self._prepare_local_output()
      self.plans = list(plan(list(inputs), options))
      if self.local:
        check_free_space(self.output_dir, self.plans)
        self._new_subfolders = _missing_subfolders(self.output_dir, self.plans)
    except BaseException as e:
      self._restore_handlers()
      self._release(failed=True)
      if self.interrupted or isinstance(e, KeyboardInterrupt):
        raise Interrupted(0, 0, self.interrupted) from None
      raise

  @property
  def lock_fd(self) -> int | None:
    """The open file descriptor holding the output directory's lock (local runs), if any.

    A worker process that inherits it holds the lock too, so the directory
    stays locked until every process that may still write to it is gone.
    """
    return self._lock.fd if self._lock is not None else None

  def _prepare_local_output(self) -> None:
    out = self.output_dir
    shown = ondisk.non_utf8_name(out)
    if shown is not None:
      raise OutputError(f"--output {shown} has a name that is not valid UTF-8 text, which Beam cannot pass on; "
                        "choose a UTF-8 name (or rename the folder, e.g. convmv -f latin1 -t utf8 --notest "
                        "FOLDER).")
    if os.path.exists(out) and not os.path.isdir(out):
      raise OutputError(f"--output {out} is a file, not a directory; give a directory "
                        "path (it is created if missing).")
    d = ondisk.local_abspath(out)
    while not os.path.exists(d):
      if os.path.islink(d):  # A dangling link: mkdir would say only "File exists".
        raise OutputError(f"--output {out} cannot be created: {d} is a symbolic link to "
                          f"{os.readlink(d)}, which does not exist; create that directory or choose "
                          "another --output.")
      d = os.path.dirname(d)
    if not os.path.isdir(d):
      raise OutputError(f"--output {out} cannot be created: {d} is a file, not a directory.")
    manifest = ondisk.manifest_path(out)
    try:
      mode = os.stat(manifest).st_mode
    except OSError:  # Missing, or a link loop: planning names those.
      mode = stat.S_IFREG
    what = "a folder" if stat.S_ISDIR(mode) else ondisk.special_file_kind(mode)  # A FIFO would block a read.
    if what is not None:
      raise OutputError(f"{manifest} is {what}, where this tool keeps the dataset's manifest; move it out of "
                        f"--output {out} (or choose another --output) and rerun.")
    try:
      self._created = ondisk.make_dirs(ondisk.local_abspath(out))
      self._created_ids = {d: file_key(d) for d in self._created}
      self._lock = ondisk.DirLock(out).acquire()
      # What the lock protects from here on: a run refused in planning must not
      # take an earlier stopped run's marker for its own.
      self._manifest_before = _read_or_none(ondisk.manifest_path(out))
    except ondisk.LockedError as e:
      raise OutputLockedError(str(e)) from None
    except ondisk.LockPathError as e:
      raise OutputError(f"Cannot lock the output directory {out}: {e}") from None
    except OSError as e:
      fix = ("free space there" if e.errno in (errno.ENOSPC, errno.EDQUOT)
             else "fix its permissions or mount")
      raise OutputError(
          f"Cannot write to the output directory {out} ({_writer.os_reason(e)}); choose a "
          f"writable --output, or {fix}.") from None
    ondisk.remove_stale_temps(out)

  def complete_shards(self) -> int:
    """Shards whose output is in place now: kept ones and those published by this run."""
    done = 0
    for p in self.plans:
      if p.action == "keep":
        done += 1
      elif self.local:
        now = ondisk.file_id(p.output)
        done += now is not None and now != p.replaces
    return done

  def __enter__(self) -> ConversionGuard:
    self._install_handlers()
    return self

  def _install_handlers(self) -> None:
    if threading.current_thread() is threading.main_thread():
      # Beam turns a KeyboardInterrupt raised inside a DoFn into a RuntimeError;
      # note the signal itself so any form of it reads as an interruption.
      # SIGTERM (`kill`, `timeout`, `docker stop`) and SIGHUP (a closed
      # terminal, a dropped ssh) too: without a handler the process dies at
      # once, leaving its lock, temp file and Beam workers.
      for signum, default in _HANDLED:
        if signal.getsignal(signum) is default:
          self._old_handlers[signum] = default
          signal.signal(signum, self._on_signal)

  def _restore_handlers(self) -> None:
    for signum, handler in self._old_handlers.items():
      signal.signal(signum, handler)
    self._old_handlers = {}
    if self._watchdog is not None:
      self._watchdog.cancel()
      self._watchdog = None

  def _on_signal(self, signum, frame):
    if self.interrupted:  # Asked again: stop now.
      self._stop_now(f"stopped by a second {signal.Signals(signum).name}", 128 + signum)
    self.interrupted = signal.Signals(signum).name
    for stop in self.on_stop:
      try:
        stop()
      except Exception:  # pylint: disable=broad-except  # The run stops anyway.
        pass
    # Beam can hang when interrupted while it starts its worker processes; a
    # stop must not depend on it.
    self._watchdog = threading.Timer(
        _STOP_GRACE_S, self._stop_now, (f"stopped by {self.interrupted}, but Beam did not shut down "
                                        f"within {_STOP_GRACE_S:.0f} s; rerun with --skip-existing to "
                                        "resume", 128 + signum))
    self._watchdog.daemon = True
    self._watchdog.start()
    raise KeyboardInterrupt

  def worker_died(self, what: str) -> None:
    """Ends the run at once when one of its worker processes died (see pipelines.workers.TiedWorkers)."""
    self._stop_now(f"{what}, so this run cannot finish; {self.complete_shards()} of {len(self.plans)} shards "
                   "complete; rerun with --skip-existing to resume", 1)

  def _stop_now(self, message: str, code: int) -> None:
    """Ends the process at once, after ending its workers and removing what it leaves behind."""
    _kill_descendants()
    try:
      if self.local:
        self._release(failed=True)
    except Exception:  # pylint: disable=broad-except  # Exit anyway; the next run cleans up.
      pass
    for d in self.scratch_dirs:
      shutil.rmtree(d, ignore_errors=True)
    try:
      print(f"arrayrecord-convert: {message}", file=sys.stderr, flush=True)
    except Exception:  # pylint: disable=broad-except  # No terminal left (SIGHUP).
      pass
    finally:
      os._exit(code)  # pylint: disable=protected-access

  def __exit__(self, exc_type, exc, tb) -> None:
    self._restore_handlers()
    failed = exc_type is not None
    interrupted = self.interrupted or (exc_type is not None and issubclass(exc_type, KeyboardInterrupt))
    self._release(failed=failed)
    if interrupted:
      raise Interrupted(self.complete_shards(), len(self.plans), self.interrupted,
                        overwrite=self.options.existing == "overwrite") from None

  def _changed_nothing(self) -> bool:
    """Whether every output this run was to write is still what it found (a local run)."""
    return all(ondisk.file_id(p.output) == (tuple(p.replaces) if p.replaces else None)
               for p in getattr(self, "plans", ()) if p.action == "convert")

  def _put_back_manifest(self) -> None:
    """After a failed run that changed no shard: the manifest.json it found, instead of its marker."""
    path = ondisk.manifest_path(self.output_dir)
    now = _read_or_none(path)
    if now is None or now == self._manifest_before or not self._changed_nothing():
      return
    try:
      if ondisk.parse_manifest(now, path, incomplete_ok=True).get("status") != INCOMPLETE:
        return  # A finished manifest: not ours to undo.
    except ondisk.ManifestError:
      return
    if self._manifest_before is None:
      os.remove(path)
    else:
      ondisk.write_bytes_atomic(path, self._manifest_before)

  def _release(self, failed: bool) -> None:
    if failed and self.local and os.path.isdir(self.output_dir):
      # This run's temp files (a Ctrl-C can stop a writer before its cleanup),
      # and those of its worker processes, which are gone by now.
      ondisk.remove_stale_temps(self.output_dir, also_own=True)
      if self._lock is not None:
        self._put_back_manifest()
    # The writers make an output's subfolder (inputs in subfolders) when they start its shard; one
    # whose shard failed or was never written would be left empty, after a success (a file
    # reported failed) too. Only folders that did not exist when planned, and only if empty.
    for d in self._new_subfolders:
      try:
        os.rmdir(d)
      except OSError:
        pass
    if self._lock is not None:
      self._lock.release()
      self._lock = None
    if failed:
      # Only folders still the ones it made: one moved away and made again meanwhile is someone else's.
      created = self._created
      for i, d in enumerate(created):
        if file_key(d) != self._created_ids.get(d):
          created = created[:i]
          break
      ondisk.remove_empty_dirs(created)
      self._created = []


_STOP_GRACE_S = 20.0
_HANDLED = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGHUP, signal.SIG_DFL))


def _missing_subfolders(output_dir: str, plans: Sequence[ShardPlan]) -> list[str]:
  """Folders below `output_dir` that the shards to convert go in and that do not exist yet, innermost first."""
  root = ondisk.local_abspath(output_dir)
  missing = set()
  for p in plans:
    if p.action != "convert":
      continue
    d = os.path.dirname(ondisk.local_abspath(p.output))
    while d.startswith(root + os.sep) and d not in missing and not os.path.isdir(d):
      missing.add(d)
      d = os.path.dirname(d)
  return sorted(missing, key=lambda d: d.count(os.sep), reverse=True)


def _read_or_none(path: str) -> bytes | None:
  try:
    return ondisk.read_local(path)  # Never blocks on a FIFO put there since the check.
  except FileNotFoundError:
    return None


def _descendants() -> list[int]:
  """Pids of this process's descendants (Linux /proc; empty elsewhere)."""
  children: dict[str, list[str]] = {}
  for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat", "rb") as f:
          ppid = f.read().rsplit(b")", 1)[1].split()[1].decode()
      except (OSError, IndexError):
        continue  # Gone meanwhile.
      children.setdefault(ppid, []).append(entry)
  out, todo = [], [str(os.getpid())]
  while todo:
    for c in children.get(todo.pop(), ()):
      out.append(int(c))
      todo.append(c)
  return out


def _kill_descendants(wait_s: float = 2.0) -> None:
  """SIGKILLs this process's descendants (its worker processes) and waits until they are gone."""
  pids = _descendants()
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass  # Gone meanwhile.
  host = ondisk.this_process().host
  deadline = time.monotonic() + wait_s
  # A killed child is a zombie until reaped: dead for ondisk.is_alive, so its temp files can go.
  while time.monotonic() < deadline and any(ondisk.is_alive(ondisk.Owner(p, 0, host)) for p in pids):
    time.sleep(0.01)


def check_compression(inputs: Sequence[str], compression: str) -> None:
  """Refuses a forced compression that the local inputs' first bytes contradict."""
  if compression == "auto":
    return
  for path in inputs:
    if not _writer.is_local(path) or not os.path.isfile(path):
      continue  # Checked when read; never open a FIFO here.
    with open(path, "rb") as f:
      head = f.read(64)
    if not head:
      continue
    found = detect_compression(head)
    if found != compression and (compression != "none" or found in ("gzip", "zlib")):
      raise CompressionMismatchError(path, compression, found)


def check_free_space(output_dir: str, plans: Sequence[ShardPlan]) -> None:
  """Refuses a run whose output filesystem clearly cannot hold the outputs."""
  needed = least = converting = 0
  for p in plans:
    if p.action != "convert":
      continue
    size = 0
    if _writer.is_local(p.input):
      try:
        size = os.path.getsize(p.input)
      except OSError:
        pass
    needed += size
    converting += 1
    # However few records it holds, an output takes SMALLEST_OUTPUT: with many
    # small shards the outputs are far larger than the inputs.
    least += max(size * MIN_FREE_SHARE, SMALLEST_OUTPUT)
  try:
    free = shutil.disk_usage(output_dir).free
  except OSError as e:
    if e.errno in (errno.ENOSYS, errno.ENOTSUP):
      return
    raise
  if free < needed * MIN_FREE_SHARE:
    raise OutputError(
        f"Not enough free space for {output_dir}: {free / 1e6:.1f} MB free, but the "
        f"{sum(p.action == 'convert' for p in plans)} input file(s) to convert hold "
        f"{needed / 1e6:.1f} MB and the outputs are about as large. Free space or choose "
        "another --output.")
  if free < least:
    raise OutputError(
        f"Not enough free space for {output_dir}: {free / 1e6:.1f} MB free, but the {converting} "
        f"output file(s) to write take at least {least / 1e6:.1f} MB (an ArrayRecord file takes at least "
        f"{SMALLEST_OUTPUT // 1024} KiB, however few records it holds). Free space or choose another "
        "--output.")
