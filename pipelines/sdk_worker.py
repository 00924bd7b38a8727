"""Beam's SDK worker process of a local multi-process conversion, tied to the run that starts it.

`pipelines.workers.TiedWorkers` starts Beam's SDK workers as
`python -m pipelines.sdk_worker LAUNCHER_PID BEAM_MAIN_MODULE` in a session of their own (a
terminal's Ctrl-C or hang-up then reaches only the launcher, which stops them
and prints one line), holding the output directory's lock descriptor (the
directory stays locked while any of them lives). Here the worker also asks
Linux to kill it when its launcher dies (PR_SET_PDEATHSIG), so a launcher
killed with SIGKILL leaves no worker writing on; then Beam's own main
(`apache_beam.runners.worker.sdk_worker_main`) runs.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
from typing import Sequence

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(launcher: int) -> None:
  """SIGKILL this process when its parent (the launcher) exits; exit now if it already has."""
  if sys.platform.startswith("linux"):
    try:
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
      pass  # No prctl here: the inherited lock still keeps other runs out while we live.
  # The launcher may have died before prctl took effect: nobody would signal us then.
  if os.getppid() != launcher:
    os._exit(1)  # pylint: disable=protected-access


def main(argv: Sequence[str]) -> None:
  """argv: [program, launcher pid, Beam's worker main module]."""
  die_with_parent(int(argv[1]))
  # Started with these blocked (until it had its own session, see workers.py); a `kill` still ends it.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
  importlib.import_module(argv[2]).main(list(argv[:1]))


if __name__ == "__main__":
  main(sys.argv)
