"""Input expansion and the input -> output plan, checked before any work."""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Iterable

from converter import writer as _writer
from converter.errors import ConversionError, ManifestExistsError, NoInputFilesError, OutputExistsError
from converter.manifest import MANIFEST_NAME, ManifestError, manifest_path, read_manifest
from converter.naming import common_dir, output_path, split_uri
from converter.options import ConvertOptions
from converter.tfrecord import check_regular_file
from loader import ondisk


def match_pattern(pattern: str) -> list[str]:
  """Files matching one glob (local or gs://), sorted; raises if none match."""
  from apache_beam.io.filesystems import FileSystems
  # Beam's local glob lists nothing for a pattern without a directory part
  # (`*.tfrecord`), so local patterns are matched as absolute paths.
  local = split_uri(pattern)[0] == ""
  query = os.path.abspath(pattern) if local else pattern
  try:
    metadata = FileSystems.match([query])[0].metadata_list
  except Exception as e:  # Beam raises BeamIOError for a missing directory.
    if "No files found" in str(e) or "not found" in str(e).lower():
      raise NoInputFilesError(pattern, _bracket_hint(pattern)) from None
    raise
  paths = sorted(m.path for m in metadata
                 if not m.path.rstrip("/").endswith("/" + MANIFEST_NAME))
  if local:
    # Beam's glob silently drops broken links; a missing shard must not go unnoticed.
    for p in sorted(glob.glob(query, recursive=True)):
      if os.path.islink(p) and not os.path.exists(p):
        check_regular_file(p)
    for p in paths:
      check_regular_file(p)  # A directory or FIFO given by name, or matched.
  if not paths:
    raise NoInputFilesError(pattern, _bracket_hint(pattern))
  return paths


def _bracket_hint(pattern: str) -> str | None:
  """Advice when `[` or `]` in a pattern were meant literally (they are a glob class)."""
  if "[" not in pattern:
    return None
  if split_uri(pattern)[0] == "" and not os.path.lexists(pattern):
    return ("'[' and ']' in a pattern are a glob character class; to match them literally "
            f"escape '[' as '[[]' (e.g. {glob.escape(pattern)!r})")
  return (f"'[' and ']' are a glob character class, so the file named {pattern!r} does not "
          f"match itself; escape '[' as '[[]': --input {glob.escape(pattern)!r}")


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
  # What publishing may replace at `output` (writer.output_identity() when
  # planned): None means nothing, so a file another run wrote meanwhile is
  # never clobbered.
  replaces: Any = None


def _complete_local_array_record(path: str) -> bool:
  try:
    from array_record.python.array_record_module import ArrayRecordReader
    r = ArrayRecordReader(path)
    r.num_records()
    r.close()
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _starts_as_array_record(path: str) -> bool:
  try:
    with open(path, "rb") as f:
      return f.read(len(ondisk.RIEGELI_SIGNATURE)) == ondisk.RIEGELI_SIGNATURE
  except OSError:
    return False


def _check_manifest_kept(options: ConvertOptions, outputs: list[str]) -> None:
  """Refuses to replace a manifest.json that describes other data, unless overwriting.

  Every run ends by writing the output directory's manifest of the shards it
  planned; a second run into the same directory (another split, say) would
  otherwise make the first run's shards vanish from the dataset.
  """
  if options.existing == "overwrite":
    return
  path = manifest_path(options.output_dir)
  if not _writer.exists(path):
    return
  if options.existing == "error":
    raise ManifestExistsError(path, None)
  try:
    manifest = read_manifest(options.output_dir) or {}
  except ManifestError:
    return  # Damaged: a resume rebuilds it from the shards' own files.
  planned = set(outputs)
  dropped = sorted(s["output"] for s in manifest.get("shards", []) if s.get("output") not in planned)
  if dropped:
    raise ManifestExistsError(path, dropped)


def plan_shards(inputs: list[str], options: ConvertOptions) -> list[ShardPlan]:
  """Maps inputs to outputs and applies the `existing` policy.

  Raises:
    OutputExistsError: outputs exist and options.existing == 'error'.
    ConversionError: two inputs map to one output name.
  """
  if not inputs:
    raise ValueError("No input files to convert.")
  inputs = sorted(set(inputs))
  for i in inputs:
    if _writer.is_local(i) and os.path.lexists(i):
      check_regular_file(i)  # A directory, FIFO or broken link; missing ones fail when read.
  root = options.input_root or common_dir(inputs)
  outputs = [output_path(i, root, options.output_dir, options.suffix) for i in inputs]
  seen: dict[str, str] = {}
  # Compared as absolute paths: inputs come from the glob as absolute paths,
  # while a relative --output gives relative output names.
  as_local = lambda p: os.path.abspath(p) if _writer.is_local(p) else p
  input_set = {as_local(i) for i in inputs}
  for i, o in zip(inputs, outputs):
    if o in seen:
      raise ConversionError(
          f"Inputs {seen[o]!r} and {i!r} would both be written to {o!r}. Rename "
          "one of them or convert them into different output directories.")
    if as_local(o) in input_set:
      raise ConversionError(f"Output {o!r} would overwrite the input of the same name.")
    seen[o] = i
  existing = [o for o in outputs if _writer.exists(o)]
  if existing and options.existing == "error":
    raise OutputExistsError(existing)
  _check_manifest_kept(options, outputs)
  previous: dict[str, dict[str, Any]] = {}
  if existing and options.existing == "skip":
    try:
      manifest = read_manifest(options.output_dir) or {}
    except ManifestError:
      manifest = {}  # Kept shards are rebuilt from their files, so nothing is lost.
    previous = {s["output"]: s for s in manifest.get("shards", []) if s.get("status") != "failed"}
  plans = []
  existing_set = set(existing)
  if options.existing == "skip":
    # A damaged ArrayRecord file is redone; a file that is no ArrayRecord at
    # all (the user's own, under an output name) is replaced only with
    # existing='overwrite'.
    complete = {o for o in existing if not _writer.is_local(o) or _complete_local_array_record(o)}
    foreign = [o for o in existing if o not in complete and not _starts_as_array_record(o)]
    if foreign:
      raise OutputExistsError(foreign, "are not ArrayRecord files, so --skip-existing can neither keep "
                                       "nor replace them")
  for i, o in zip(inputs, outputs):
    keep = options.existing == "skip" and o in complete
    if keep:
      plans.append(ShardPlan(input=i, output=o, action="keep", previous=previous.get(o)))
    else:
      replaces = _writer.output_identity(o) if o in existing_set else None
      plans.append(ShardPlan(input=i, output=o, action="convert", replaces=replaces))
  return plans
