"""Time-sliced comparison of live benchmark processes on a noisy machine.

Two rows measured one after the other see different machines when a shared
VM's speed drifts (here: 2x between runs, ±30% within one). Instead every
member (one row, or several copies of it run together) is started once,
warmed up and then stopped (SIGSTOP to its process group); the members then
take turns running for short windows (SIGCONT ... SIGSTOP), round after
round, with the order rotated each round. Each member counts the units it
has consumed in a small shared counter file, so a member's rate is its
units over its windows' seconds, and both sides of a ratio sample the same
stretch of the machine's drift.

A member is a command that takes `--counter PATH` and writes three int64
slots there (see `MemberCounter`): units consumed, ready (warmed up), and
stop (set by the parent when the run is over: the member then closes its
pipeline and exits).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

import numpy as np

_UNITS, _READY, _STOP = 0, 1, 2


class Counter:
  """Three int64 slots in a file both the member and the parent map."""

  def __init__(self, path: str, create: bool = False):
    if create:
      with open(path, "wb") as f:
        f.write(bytes(24))
    self._file = open(path, "r+b")  # pylint: disable=consider-using-with
    self._map = mmap.mmap(self._file.fileno(), 24)
    self.slots = np.frombuffer(self._map, dtype=np.int64, count=3)

  def close(self) -> None:
    self.slots = None
    self._map.close()
    self._file.close()


class MemberCounter(Counter):
  """The member side: report units, say when warmed up, see when to stop."""

  def add(self, units: int) -> None:
    self.slots[_UNITS] += units

  def set_ready(self) -> None:
    self.slots[_READY] = 1

  @property
  def stop_requested(self) -> bool:
    return bool(self.slots[_STOP])


@dataclasses.dataclass
class Member:
  """One or more processes (copies of one row) that run in the same windows."""
  name: str
  cmds: Sequence[Sequence[str]]
  env: dict | None = None
  procs: list = dataclasses.field(default_factory=list)
  counters: list = dataclasses.field(default_factory=list)
  logs: list = dataclasses.field(default_factory=list)
  units: list = dataclasses.field(default_factory=list)    # Per window.
  seconds: list = dataclasses.field(default_factory=list)  # Per window.
  total: int = 0  # Units counted over the whole run, windows or not (set by finish).

  def start(self, directory: str) -> None:
    for k, cmd in enumerate(self.cmds):
      path = os.path.join(directory, f"{self.name.replace(' ', '_').replace('/', '_')}-{k}")
      counter = Counter(path + ".ctr", create=True)
      log = open(path + ".log", "w+b")  # pylint: disable=consider-using-with
      # Its own session: SIGSTOP/SIGCONT reach its worker processes too.
      proc = subprocess.Popen([*cmd, "--counter", path + ".ctr"], stdout=log, stderr=subprocess.STDOUT,
                              env=self.env, start_new_session=True)
      self.procs.append(proc)
      self.counters.append(counter)
      self.logs.append(log)

  @property
  def ready(self) -> bool:
    return all(c.slots[_READY] for c in self.counters)

  @property
  def exited(self) -> bool:
    return any(p.poll() is not None for p in self.procs)

  def count(self) -> int:
    return int(sum(int(c.slots[_UNITS]) for c in self.counters))

  def signal(self, sig: int) -> None:
    for p in self.procs:
      try:
        os.killpg(p.pid, sig)
      except ProcessLookupError:
        pass

  def wait_stopped(self, timeout: float = 2.0) -> None:
    """Returns once every process of the member is stopped (a counter read is then final)."""
    import psutil  # pylint: disable=g-import-not-at-top
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      running = 0
      for p in self.procs:
        try:
          root = psutil.Process(p.pid)
          for q in [root, *root.children(recursive=True)]:
            if q.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
              running += 1
        except psutil.Error:
          pass
      if not running:
        return
      time.sleep(0.002)

  def output(self) -> str:
    text = []
    for log in self.logs:
      log.seek(0)
      text.append(log.read().decode(errors="replace"))
    return "\n".join(text)

  def finish(self, timeout: float) -> None:
    """Asks each process to stop, resumes it, and waits (then kills its group)."""
    for c in self.counters:
      c.slots[_STOP] = 1
    self.signal(signal.SIGCONT)
    deadline = time.monotonic() + timeout
    for p in self.procs:
      try:
        p.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        self.signal(signal.SIGKILL)
        p.wait()
    self.total = self.count()
    for c in self.counters:
      c.close()
    for log in self.logs:
      log.close()

  def rate(self) -> float:
    return sum(self.units) / sum(self.seconds) if self.seconds and sum(self.seconds) > 0 else 0.0


def interleave(members: Sequence[Member], *, rounds: int, window: float,
               start_timeout: float = 180.0) -> None:
  """Runs the members in turn (window seconds each, `rounds` rounds); fills their units and seconds.

  Raises RuntimeError naming the member (and its output's tail) if one
  fails to warm up in `start_timeout` seconds or exits early.
  """
  with tempfile.TemporaryDirectory(prefix="bench-slices-") as directory:
    try:
      for m in members:
        m.start(directory)
      _warm_up(members, start_timeout)
      for r in range(rounds):
        k = r % len(members)
        for m in [*members[k:], *members[:k]]:
          before = m.count()
          t0 = time.perf_counter()
          m.signal(signal.SIGCONT)
          time.sleep(window)
          m.signal(signal.SIGSTOP)
          t1 = time.perf_counter()
          m.wait_stopped()
          if m.exited:
            raise RuntimeError(f"{m.name} exited during the time-sliced run:\n{m.output()[-2000:]}")
          m.units.append(m.count() - before)
          m.seconds.append(t1 - t0)
    finally:
      for m in members:
        m.finish(timeout=10.0)


def _warm_up(members: Sequence[Member], timeout: float) -> None:
  """Waits until every member is warmed up; stops each as soon as it is."""
  deadline = time.monotonic() + timeout
  pending = list(members)
  while pending:
    for m in list(pending):
      if m.ready:
        m.signal(signal.SIGSTOP)
        m.wait_stopped()
        pending.remove(m)
      elif m.exited:
        raise RuntimeError(f"{m.name} exited before it was warmed up:\n{m.output()[-2000:]}")
    if time.monotonic() > deadline:
      raise RuntimeError(f"{', '.join(m.name for m in pending)}: not warmed up after {timeout:.0f} s")
    time.sleep(0.01)
