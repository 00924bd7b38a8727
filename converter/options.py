"""Validated converter options."""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile

from converter.tfrecord import COMPRESSIONS
from loader import ondisk

WRITER_OPTION_KEYS = (
    "group_size", "zstd", "brotli", "snappy", "uncompressed", "window_log",
    "transpose", "transpose_bucket_size", "pad_to_block_boundary",
    "saturation_delay_ms", "max_parallelism", "default",
)
# Keys that take no value (`uncompressed`, not `uncompressed:1`).
_FLAG_KEYS = ("default", "uncompressed", "snappy")
ON_CORRUPT = ("fail", "skip")
EXISTING = ("error", "overwrite", "skip")


def validate_writer_options(options: str) -> str:
  """Checks an ArrayRecord writer options string such as 'group_size:1,zstd:3'.

  Keys are checked against the known list, then ArrayRecordWriter itself
  parses the string (on a throwaway file) so bad values fail here, before
  any pipeline starts, not on a worker.

  Returns:
    The options string, stripped.
  """
  if not isinstance(options, str):
    raise TypeError(f"writer_options must be a string like 'group_size:1', got {options!r}.")
  options = options.strip()
  for item in filter(None, (p.strip() for p in options.split(","))):
    key = item.split(":", 1)[0].strip()
    if key not in WRITER_OPTION_KEYS:
      raise ValueError(
          f"Unknown ArrayRecord writer option {key!r} in {options!r}. Valid keys: "
          f"{', '.join(WRITER_OPTION_KEYS)}.")
  from array_record.python.array_record_module import ArrayRecordWriter
  # The writer parses its options when constructed; what it writes is
  # irrelevant, so it writes to the null device, where no full or
  # size-limited $TMPDIR can fail the check.
  null = os.devnull if os.path.exists(os.devnull) else None
  if null is None:
    fd, path = tempfile.mkstemp(suffix=".array_record")
    os.close(fd)
  try:
    try:
      w = ArrayRecordWriter(null or path, options)
    except (ValueError, RuntimeError) as e:
      raise ValueError(
          f"Invalid ArrayRecord writer options {options!r}: {e}. Valid keys: "
          f"{', '.join(WRITER_OPTION_KEYS)}.") from None
    try:
      w.close()
    except (OSError, RuntimeError):
      pass  # Parsed already; a write failure here says nothing about the options.
  finally:
    if null is None:
      os.remove(path)
  return options


def group_size(options: str) -> int | None:
  """The group_size a writer options string asks for, if it names one."""
  for item in options.split(","):
    key, _, value = item.strip().partition(":")
    if key == "group_size" and value.strip().isdigit():
      return int(value)
  return None


def line_break_at_an_end(path: str) -> str | None:
  """`path` with its names stripped, when a name it would create has a line break or tab at an end."""
  return ondisk.blank_at_an_end(path, ondisk.LINE_BREAKS)


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
  """Options for ConvertToArrayRecord, checked on construction.

  Attributes:
    output_dir: Where ArrayRecord files go (local path or gs://...).
    writer_options: ArrayRecord writer options; 'group_size:1' makes every
      record its own chunk, which random access (global shuffle) needs.
    compression: Input compression: 'auto' (detect from content), 'gzip',
      'zlib' or 'none'.
    on_corrupt: 'fail' stops on a corrupt record; 'skip' drops it and counts it.
    existing: What to do when outputs exist: 'error', 'overwrite' or 'skip'
      (keep complete outputs; resume).
    suffix: Format token that replaces `.tfrecord` in output names.
    input_root: Directory whose layout is mirrored under output_dir; None
      means the inputs' common directory.
  """

  output_dir: str
  writer_options: str = "group_size:1"
  compression: str = "auto"
  on_corrupt: str = "fail"
  existing: str = "error"
  suffix: str = "array_record"
  input_root: str | None = None

  def __post_init__(self):
    # Only spaces (`--output "$OUT"` with OUT unset but for a space) would make a folder named ' '
    # in the current directory, shown as "Output:  " with no visible name.
    if not isinstance(self.output_dir, str) or not self.output_dir.strip():
      raise ValueError(f"output_dir must be a non-empty path, got {self.output_dir!r}.")
    stripped = line_break_at_an_end(self.output_dir)
    if stripped is not None:
      # A value pasted from a YAML block or read from a file with its line break (`--output $'out\n'`,
      # `args={"output": f.read()}`) would make a folder whose name ends in a line break, shown as another one.
      raise ValueError(f"output_dir {self.output_dir!r}: a name in it has a line break or tab at an end, which "
                       f"would become part of a folder's name: strip it (--output {stripped!r}).")
    scheme, rest = ondisk.split_uri(self.output_dir)
    if scheme and "//" in rest.rstrip("/"):
      # gs://bucket//ar (from "$BUCKET/$PREFIX" with BUCKET ending in '/'): Cloud Storage keeps the empty
      # name, so every object would be named "/ar/...", a folder readers of gs://bucket/ar never see.
      single = scheme + re.sub("/{2,}", "/", rest)
      raise ValueError(f"output_dir {self.output_dir!r} has an empty folder name ('//'), which {scheme} keeps "
                       f"as part of the object names, so no reader of {single!r} would find the dataset: "
                       f"write it with single slashes (--output {single}).")
    object.__setattr__(self, "writer_options", validate_writer_options(self.writer_options))
    for name, value, choices in (("compression", self.compression, COMPRESSIONS),
                                 ("on_corrupt", self.on_corrupt, ON_CORRUPT),
                                 ("existing", self.existing, EXISTING)):
      if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
    if not self.suffix or "/" in self.suffix or self.suffix.startswith("."):
      raise ValueError(f"suffix must be a bare extension such as 'array_record', got {self.suffix!r}.")
