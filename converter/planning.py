"""Input expansion and the input -> output plan, checked before any work."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable

from converter import writer as _writer
from converter.errors import ConversionError, NoInputFilesError, OutputExistsError
from converter.manifest import MANIFEST_NAME, read_manifest
from converter.naming import common_dir, output_path, split_uri
from converter.options import ConvertOptions


def match_pattern(pattern: str) -> list[str]:
  """Files matching one glob (local or gs://), sorted; raises if none match."""
  from apache_beam.io.filesystems import FileSystems
  # Beam's local glob lists nothing for a pattern without a directory part
  # (`*.tfrecord`), so local patterns are matched as absolute paths.
  query = os.path.abspath(pattern) if split_uri(pattern)[0] == "" else pattern
  try:
    metadata = FileSystems.match([query])[0].metadata_list
  except Exception as e:  # Beam raises BeamIOError for a missing directory.
    if "No files found" in str(e) or "not found" in str(e).lower():
      raise NoInputFilesError(pattern) from None
    raise
  paths = sorted(m.path for m in metadata
                 if not m.path.rstrip("/").endswith("/" + MANIFEST_NAME))
  if not paths:
    raise NoInputFilesError(pattern)
  return paths


def expand_patterns(patterns: str | Iterable[str]) -> list[str]:
  """All files matching any of the patterns, sorted and de-duplicated."""
  if isinstance(patterns, str):
    patterns = [patterns]
  patterns = list(patterns)
  if not patterns:
    raise ValueError("No input patterns given.")
  files: set[str] = set()
  for p in patterns:
    files.update(match_pattern(p))
  return sorted(files)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
  """One unit of work: convert `input` to `output`, or keep an existing output."""

  input: str
  output: str
  action: str  # 'convert' or 'keep'
  previous: dict[str, Any] | None = None


def _complete_local_array_record(path: str) -> bool:
  try:
    from array_record.python.array_record_module import ArrayRecordReader
    r = ArrayRecordReader(path)
    r.num_records()
    r.close()
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def plan_shards(inputs: list[str], options: ConvertOptions) -> list[ShardPlan]:
  """Maps inputs to outputs and applies the `existing` policy.

  Raises:
    OutputExistsError: outputs exist and options.existing == 'error'.
    ConversionError: two inputs map to one output name.
  """
  if not inputs:
    raise ValueError("No input files to convert.")
  inputs = sorted(set(inputs))
  root = options.input_root or common_dir(inputs)
  outputs = [output_path(i, root, options.output_dir, options.suffix) for i in inputs]
  seen: dict[str, str] = {}
  for i, o in zip(inputs, outputs):
    if o in seen:
      raise ConversionError(
          f"Inputs {seen[o]!r} and {i!r} would both be written to {o!r}. Rename "
          "one of them or convert them into different output directories.")
    if o in inputs:
      raise ConversionError(f"Output {o!r} would overwrite the input of the same name.")
    seen[o] = i
  existing = [o for o in outputs if _writer.exists(o)]
  if existing and options.existing == "error":
    raise OutputExistsError(existing)
  previous: dict[str, dict[str, Any]] = {}
  if existing and options.existing == "skip":
    manifest = read_manifest(options.output_dir) or {}
    previous = {s["output"]: s for s in manifest.get("shards", []) if s.get("status") != "failed"}
  plans = []
  existing_set = set(existing)
  for i, o in zip(inputs, outputs):
    keep = (options.existing == "skip" and o in existing_set
            and (not _writer.is_local(o) or _complete_local_array_record(o)))
    plans.append(ShardPlan(input=i, output=o, action="keep" if keep else "convert",
                           previous=previous.get(o) if keep else None))
  return plans
