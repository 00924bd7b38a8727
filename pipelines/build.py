"""Builds the conversion pipeline shared by the CLI, Dataflow and TFDS entry points."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from converter import ConvertOptions, ConvertToArrayRecord, MatchFiles


def pipeline_options(beam_args: Sequence[str], default_runner: str = "DirectRunner") -> PipelineOptions:
  """PipelineOptions from explicit flags (never sys.argv), DirectRunner by default."""
  opts = PipelineOptions(list(beam_args))
  if not opts.view_as(StandardOptions).runner:
    opts.view_as(StandardOptions).runner = default_runner
  return opts


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
    paths = p | "MatchInputs" >> MatchFiles(list(patterns))
  # Every ConvertOptions field is a ConvertToArrayRecord argument of the same name.
  return paths | "ConvertToArrayRecord" >> ConvertToArrayRecord(**dataclasses.asdict(options))
