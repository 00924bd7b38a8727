"""Builds the conversion pipeline shared by the CLI, Dataflow and TFDS entry points."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
from typing import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from converter import ConvertOptions, ConvertToArrayRecord, MatchFiles
from pipelines import workers


class PipelineOptionError(ValueError):
  """A Beam pipeline option whose value Beam's parser refuses."""


@contextlib.contextmanager
def beam_option_errors() -> Iterator[None]:
  """Turns Beam's refusal of an option value into one PipelineOptionError line.

  Beam parses its options with argparse, which prints its whole usage (~140
  lines) before the one line that matters, and exits.
  """
  printed = io.StringIO()
  try:
    with contextlib.redirect_stderr(printed):
      yield
  except SystemExit as e:
    if e.code in (0, None):
      sys.stderr.write(printed.getvalue())
      raise
    lines = [line for line in printed.getvalue().splitlines() if line.strip()]
    reason = lines[-1].split("error: ", 1)[-1] if lines else f"exit status {e.code}"
    raise PipelineOptionError(
        f"{reason} (a Beam pipeline option: "
        "https://cloud.google.com/dataflow/docs/reference/pipeline-options)") from None
  except BaseException:
    sys.stderr.write(printed.getvalue())  # Anything else Beam printed, as it printed it.
    raise
  sys.stderr.write(printed.getvalue())


def pipeline_options(beam_args: Sequence[str], default_runner: str = "DirectRunner") -> PipelineOptions:
  """PipelineOptions from explicit flags (never sys.argv), DirectRunner by default.

  Raises:
    PipelineOptionError: Beam refuses a flag's value (one line).
  """
  with beam_option_errors():
    opts = PipelineOptions(list(beam_args))
    opts.get_all_options()  # Parsed now, so a bad value fails here, in one line.
    if not opts.view_as(StandardOptions).runner:
      opts.view_as(StandardOptions).runner = default_runner
  return opts


def new_pipeline(options: PipelineOptions | None = None, cls: type[beam.Pipeline] = beam.Pipeline) -> beam.Pipeline:
  """A pipeline, not yet run, on `options` (DirectRunner if none).

  DirectRunner runs on FnApiRunner directly, as the CLI does: Beam's own
  DirectRunner first tries to download and start Prism, which needs the
  network and leaves empty temp folders behind when it falls back.
  """
  options = options or pipeline_options([])
  direct = workers.is_direct(options.view_as(StandardOptions).runner or "DirectRunner")
  return cls(runner=workers.local_runner(options) if direct else None, options=options)


def add_conversion(p: beam.Pipeline, options: ConvertOptions, *,
                   files: Sequence[str] | None = None,
                   patterns: Iterable[str] | None = None) -> beam.PCollection:
  """Adds the matched-shard conversion to a pipeline.

  Give `files` when the inputs were listed up front (local runs, checked
  before start), or `patterns` to list them inside the pipeline (remote runs:
  submitting needs no bucket access).
  """
  if (files is None) == (patterns is None):
    raise ValueError("Give exactly one of files= or patterns=.")
  if files is not None:
    paths = p | "Inputs" >> beam.Create(sorted(files))
  else:
    paths = p | "MatchInputs" >> MatchFiles(list(patterns), skip_under=options.output_dir)
  # Every ConvertOptions field is a ConvertToArrayRecord argument of the same name.
  return paths | "ConvertToArrayRecord" >> ConvertToArrayRecord(**dataclasses.asdict(options))
