"""A temp folder of one local run's own, for Beam and its worker processes.

Beam makes `beam-pipeline-temp*` (and its workers other folders) in $TMPDIR
and removes them in `finally` blocks, which a killed run (kill -9, the OOM
killer, a power cut) never reaches. A CLI run therefore points $TMPDIR at
`arrayrecord-run-<pid>-<start>-<random>@<host>` inside it, and removes that
folder when it ends; the next run on this host removes the folders of runs
whose process no longer runs, so nothing piles up.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

from converter import writer as _writer
from loader import ondisk

_NAME_RE = re.compile(r"\Aarrayrecord-run-(?P<pid>\d+)-(?P<start>\d+)-[^/@]*@(?P<host>[^/@]+)\Z")


def sweep_dead_runs(directory: str) -> list[str]:
  """Removes the run folders (and staging files) in `directory` of this host's runs that no longer run.

  Returns the folders removed. A folder of another host is left: whether
  its run still goes on cannot be known here.
  """
  _writer.sweep_dead_staging(directory)
  removed = []
  try:
    names = os.listdir(directory)
  except OSError:
    return removed
  for name in names:
    m = _NAME_RE.match(name)
    if m and ondisk.is_alive(ondisk.Owner(int(m["pid"]), int(m["start"]), m["host"])) is False:
      path = os.path.join(directory, name)
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed


@contextlib.contextmanager
def private_tempdir() -> Iterator[str | None]:
  """Runs the block with $TMPDIR (and `tempfile`'s default) in a new folder of this run, removed after it.

  Yields that folder. Folders that killed runs left are removed first.
  Where the folder cannot be made (a read-only or full $TMPDIR), the block
  runs with $TMPDIR as it was and gets None: the run then fails or not as
  it would have without this.
  """
  base = tempfile.gettempdir()
  sweep_dead_runs(base)
  me = ondisk.this_process()
  try:
    path = tempfile.mkdtemp(prefix=f"arrayrecord-run-{me.pid}-{me.start}-", suffix=f"@{me.host}", dir=base)
  except OSError:
    yield None
    return
  old_tempdir, old_env = tempfile.tempdir, os.environ.get("TMPDIR")
  tempfile.tempdir = path
  os.environ["TMPDIR"] = path  # Beam's worker processes inherit it.
  try:
    yield path
  finally:
    tempfile.tempdir = old_tempdir
    if old_env is None:
      os.environ.pop("TMPDIR", None)
    else:
      os.environ["TMPDIR"] = old_env
    shutil.rmtree(path, ignore_errors=True)
