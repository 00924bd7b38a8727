"""Progress of a running conversion, from the outputs as they are published.

A watcher thread in the launching process polls the output folders: an
output counts as done once its final name appears (the converter publishes
each file only when complete), so progress is the same whether shards are
converted in-process, by Beam's worker processes or by remote workers, and
for local or gs:// outputs. For local outputs the hidden temp files being
written add partial progress within a shard. On a terminal it redraws one
line (files done/total, MB, MB/s, ETA); otherwise it logs a line now and
then.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import posixpath
import sys
import threading
import time
from typing import Callable, Iterable, Sequence, TextIO

from converter import writer as _writer
from loader import ondisk

# Seconds between polls: listing a bucket costs requests, a local folder little.
LOCAL_POLL_S = 0.5
REMOTE_POLL_S = 5.0
# Log lines (not a terminal): the first after this many seconds, then about
# every tenth of the elapsed time, at most once a minute.
FIRST_LOG_S = 10.0
MAX_LOG_S = 60.0


@dataclasses.dataclass(frozen=True)
class Shard:
  """One file to convert: where it is published, and its input bytes."""

  input: str
  output: str
  size: int


def _split(path: str) -> tuple[str, str]:
  if _writer.is_local(path):
    return os.path.split(ondisk.local_abspath(path))
  return posixpath.split(path)


def _listing(folder: str) -> dict[str, tuple[int, float]]:
  """{basename: (size, modification time)} of the files directly in a folder."""
  if _writer.is_local(folder):
    # Progress is only shown: other files in the folder (a link loop, a link
    # into a folder this user may not read) or a folder that can be entered
    # but not listed must not stop the run. Missing entries fall back to one
    # stat each (see _listed's callers).
    out = {}
    try:
      with os.scandir(folder) as entries:
        for e in entries:
          try:
            st = e.stat()
          except OSError:  # Renamed away meanwhile, a broken or looping link, no permission.
            continue
          out[e.name] = (st.st_size, st.st_mtime_ns)
    except OSError:
      pass
    return out
  try:
    found = _writer.remote_folder_listing(folder)
  except Exception:  # pylint: disable=broad-except  # Nothing there yet.
    return {}
  return {name: (m.size_in_bytes, getattr(m, "last_updated_in_seconds", 0)) for name, m in found.items()}


def _listed(paths: Iterable[str]) -> dict[str, tuple[int, float] | None]:
  """{path: (size, modification time), or None where its folder's listing lacks it}: one listing per folder."""
  by_folder: dict[str, list[str]] = collections.defaultdict(list)
  for p in paths:
    by_folder[_split(p)[0]].append(p)
  out = {}
  for folder, files in by_folder.items():
    listed = _listing(folder)
    out.update((p, listed.get(_split(p)[1])) for p in files)
  return out


def input_sizes(paths: Iterable[str]) -> dict[str, int]:
  """Byte size of each file, with one listing per folder (not one request per file); 0 where unknown."""
  def size(p: str, entry: tuple[int, float] | None) -> int:
    if entry:
      return entry[0]
    try:
      return _writer.file_size(p)
    except OSError:  # Its conversion names the problem; progress only shows sizes.
      return 0
  return {p: size(p, entry) for p, entry in _listed(paths).items()}


def missing_files(paths: Iterable[str]) -> list[str]:
  """The paths that are not there (local or gs://), with one listing per folder."""
  return [p for p, entry in _listed(paths).items() if entry is None and not _writer.exists(p)]


def shards(plans: Sequence) -> list[Shard]:
  """The shards a run converts (ShardPlans with action 'convert'), with input sizes."""
  todo = [p for p in plans if p.action == "convert"]
  sizes = input_sizes(p.input for p in todo)
  return [Shard(p.input, p.output, sizes[p.input]) for p in todo]


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """Progress at one moment."""

  files_done: int
  files_total: int
  bytes_done: float  # Input bytes, counting partly written local outputs.
  bytes_total: int
  seconds: float

  @property
  def rate(self) -> float:
    """Input bytes per second so far."""
    return self.bytes_done / self.seconds if self.seconds > 0 else 0.0

  @property
  def eta_s(self) -> float | None:
    if self.files_done == self.files_total:
      return 0.0
    return (self.bytes_total - self.bytes_done) / self.rate if self.rate > 0 else None

  def line(self) -> str:
    eta = self.eta_s
    return (f"{self.files_done}/{self.files_total} files, {self.bytes_done / 1e6:,.1f}/"
            f"{self.bytes_total / 1e6:,.1f} MB, {self.rate / 1e6:.1f} MB/s, "
            f"ETA {'?' if eta is None else format_seconds(eta)}")


def format_seconds(s: float) -> str:
  s = int(round(s))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Watcher:
  """Follows published outputs; use as a context manager around the pipeline run.

  Args:
    shards: What the run converts.
    out: Where to write (default stdout).
    interactive: Redraw one line (a terminal) or log lines; default
      out.isatty().
    poll_s: Seconds between polls (default by output location).
    first_log_s: When the first log line is due (not a terminal).
    clock: Monotonic clock.
  """

  def __init__(self, shards: Sequence[Shard], *, out: TextIO | None = None,
               interactive: bool | None = None, poll_s: float | None = None,
               first_log_s: float | None = None, clock: Callable[[], float] = time.monotonic):
    self._shards = list(shards)
    self._out = out or sys.stdout
    self._interactive = self._out.isatty() if interactive is None else interactive
    remote = any(not _writer.is_local(s.output) for s in self._shards)
    self._poll_s = poll_s or (REMOTE_POLL_S if remote else LOCAL_POLL_S)
    self._first_log_s = FIRST_LOG_S if first_log_s is None else first_log_s
    self._clock = clock
    self._folders: dict[str, list[Shard]] = collections.defaultdict(list)
    for s in self._shards:
      self._folders[_split(s.output)[0]].append(s)
    self._before: dict[str, tuple[int, float]] = {}
    self._done: set[str] = set()
    self._ratio = 1.0  # Input bytes per output byte, from finished local shards.
    self._start = 0.0
    self._next_log = 0.0
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.last: Snapshot | None = None

  def poll(self) -> Snapshot:
    """Checks the outputs once; returns the progress."""
    partial_in = 0.0
    for folder, shards in self._folders.items():
      listed = _listing(folder)
      temps: dict[str, int] = collections.defaultdict(int)
      for name, (size, _) in listed.items():
        parsed = ondisk.parse_temp_name(name)
        if parsed:
          temps[parsed[0]] += size
      for s in shards:
        name = _split(s.output)[1]
        if s.output in self._done:
          continue
        entry = listed.get(name)
        if entry is not None and entry != self._before.get(s.output):
          self._done.add(s.output)
          if entry[0]:
            self._ratio = s.size / entry[0]
        elif written := temps.get(ondisk.temp_base(name)):
          partial_in += min(s.size, written * self._ratio)
    done_bytes = sum(s.size for s in self._shards if s.output in self._done) + partial_in
    self.last = Snapshot(len(self._done), len(self._shards), done_bytes,
                         sum(s.size for s in self._shards), self._clock() - self._start)
    return self.last

  def _emit(self, snap: Snapshot, final: bool = False) -> None:
    if self._interactive:
      end = "\n" if final else ""
      self._out.write(f"\r{snap.line()}\x1b[K{end}")
    else:
      self._out.write(f"progress: {snap.line()}\n")
    self._out.flush()

  def _due(self, snap: Snapshot) -> bool:
    if self._interactive:
      return True
    if snap.seconds < self._next_log:
      return False
    self._next_log = snap.seconds + min(MAX_LOG_S, max(self._first_log_s, snap.seconds / 10))
    return True

  def _loop(self) -> None:
    while not self._stop.wait(self._poll_s):
      try:
        snap = self.poll()
      except Exception:  # pylint: disable=broad-except  # Progress must never fail a run.
        continue
      if self._due(snap):
        try:
          self._emit(snap)
        except (OSError, ValueError):
          # Its reader went away (`| head -1`) or it was closed: a traceback of this thread on stderr
          # before; the run goes on, and its summary's print meets the same stream.
          return

  def __enter__(self) -> Watcher:
    # Outputs that exist before the run (--overwrite) count only once replaced.
    for folder, shards in self._folders.items():
      listed = _listing(folder)
      for s in shards:
        entry = listed.get(_split(s.output)[1])
        if entry is not None:
          self._before[s.output] = entry
    self._start = self._clock()
    self._next_log = self._first_log_s
    self._thread = threading.Thread(target=self._loop, name="conversion-progress", daemon=True)
    self._thread.start()
    return self

  def __exit__(self, exc_type, *_) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._interactive and exc_type is None:
      try:
        self._emit(self.poll(), final=True)
      except Exception:  # pylint: disable=broad-except
        pass
    elif self._interactive and self.last is not None:
      self._out.write("\n")  # Leave the partial line; the error goes below it.
      self._out.flush()


class _Silent:
  def __enter__(self):
    return self

  def __exit__(self, *_):
    return None


def watch(shards: Sequence[Shard], *, quiet: bool = False, out: TextIO | None = None):
  """A Watcher for a run, or a no-op context when quiet or there is nothing to convert."""
  if quiet or not shards:
    return _Silent()
  return Watcher(shards, out=out)
