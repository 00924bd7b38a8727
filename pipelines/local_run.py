"""One local conversion run: the output guard, the worker decision, progress lines and Beam's pipeline.

Shared by `arrayrecord-convert` and `arrayrecord-tfds`. Everything after the
guard locked the output directory runs inside it, so a failure at any step
(a refused `--workers` too) leaves nothing behind.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Sequence

import apache_beam as beam

from converter.guard import ConversionGuard
from pipelines import build, cli, progress, run_tempdir, workers


def run(guard: ConversionGuard, args: argparse.Namespace, beam_args: Sequence[str],
        announce: Callable[[str, str], str], add: Callable[[beam.Pipeline], None]) -> tuple[float, workers.Decision]:
  """Runs the pipeline `add` builds under `guard`; returns its seconds and the worker decision.

  Args:
    guard: The run's ConversionGuard (not entered yet).
    args: The parsed CLI flags (`workers`, `quiet`).
    beam_args: The Beam flags given.
    announce: (runner name, worker mode) -> the line printed before the run.
    add: Adds the conversion to the pipeline.
  """
  with guard:
    shards = progress.shards(guard.plans)
    local = workers.decide(args.workers, [s.size for s in shards], beam_args)
    opts = build.pipeline_options([*beam_args, *local.beam_flags])
    if not args.quiet:
      print(announce(opts.get_all_options()["runner"], local.mode), flush=True)
    tied = workers.TiedWorkers(keep_fds=[guard.lock_fd], on_death=guard.worker_died)
    guard.on_stop.append(tied.stop)
    start = time.monotonic()
    with run_tempdir.private_tempdir() as scratch, progress.watch(shards, quiet=args.quiet), \
        cli.worker_stderr_held_back(local.workers), tied:
      # Beam's temp folders go in there: removed when the run ends at once
      # (see ConversionGuard._stop_now) or fails while the pipeline is built.
      if scratch is not None:
        guard.scratch_dirs.append(scratch)
      with beam.Pipeline(runner=local.runner(opts), options=opts) as pipeline:
        add(pipeline)
  return time.monotonic() - start, local
