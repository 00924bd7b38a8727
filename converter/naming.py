"""Maps TFRecord shard names to ArrayRecord shard names, and parses them back.

`mnist-train.tfrecord-00003-of-00016` -> `mnist-train.array_record-00003-of-00016`
`part-00001-of-00004.tfrecord.gz`     -> `part-00001-of-00004.array_record`
`data.bin`                            -> `data.bin.array_record`
"""

from __future__ import annotations

import dataclasses
import posixpath
import re

from loader.ondisk import split_uri

# Longest token first so `.tfrecords` is not read as `.tfrecord` + `s`.
FORMAT_TOKENS = ("tfrecords", "tfrecord", "tfrec")
COMPRESSION_SUFFIXES = ("gz", "gzip", "zlib", "deflate")

_TOKEN_RE = re.compile(r"\.(" + "|".join(FORMAT_TOKENS) + r")(?=$|[.\-_])", re.IGNORECASE)
_COMPRESSION_RE = re.compile(r"\.(" + "|".join(COMPRESSION_SUFFIXES) + r")$", re.IGNORECASE)
_SHARD_RE = re.compile(r"-(\d+)-of-(\d+)")


@dataclasses.dataclass(frozen=True)
class ShardName:
  """A shard file name split into the parts the converter maps.

  Attributes:
    prefix: Everything before the format token (`mnist-train`).
    format: The format token without its dot (`tfrecord`), or None if absent.
    rest: Everything after the token up to the compression suffix
      (`-00003-of-00016`).
    compression: Trailing compression suffix without its dot (`gz`), or None.
  """

  prefix: str
  format: str | None
  rest: str
  compression: str | None = None

  @classmethod
  def parse(cls, basename: str) -> ShardName:
    """Splits a file basename (no directories) into its parts."""
    if "/" in basename:
      raise ValueError(f"Expected a basename without '/', got {basename!r}.")
    compression = None
    m = _COMPRESSION_RE.search(basename)
    if m:
      compression = m.group(1)
      basename = basename[: m.start()]
    m = _TOKEN_RE.search(basename)
    if not m:
      return cls(prefix=basename, format=None, rest="", compression=compression)
    return cls(
        prefix=basename[: m.start()],
        format=m.group(1),
        rest=basename[m.end():],
        compression=compression,
    )

  def format_name(self) -> str:
    """Builds the basename back from the parts."""
    name = self.prefix if self.format is None else f"{self.prefix}.{self.format}{self.rest}"
    return f"{name}.{self.compression}" if self.compression else name

  def with_format(self, fmt: str) -> ShardName:
    """The same shard in another format, without compression suffix."""
    if self.format is None:
      return ShardName(prefix=f"{self.prefix}.{fmt}" if self.prefix else fmt,
                       format=None, rest="", compression=None)
    return ShardName(prefix=self.prefix, format=fmt, rest=self.rest, compression=None)

  @property
  def shard(self) -> tuple[int, int] | None:
    """(index, count) from a `-SSSSS-of-NNNNN` part, if the name has one."""
    m = _SHARD_RE.search(self.rest) or _SHARD_RE.search(self.prefix)
    return (int(m.group(1)), int(m.group(2))) if m else None


def output_basename(input_basename: str, suffix: str = "array_record") -> str:
  """The ArrayRecord basename for a TFRecord basename."""
  if not suffix or "/" in suffix or suffix.startswith("."):
    raise ValueError(f"suffix must be a bare extension such as 'array_record', got {suffix!r}.")
  return ShardName.parse(input_basename).with_format(suffix).format_name()


def common_dir(paths: list[str]) -> str:
  """The deepest directory containing all paths (works for local and URI paths)."""
  if not paths:
    raise ValueError("common_dir needs at least one path.")
  schemes = {split_uri(p)[0] for p in paths}
  if len(schemes) != 1:
    raise ValueError(f"Inputs mix storage systems {sorted(schemes)}; convert each separately.")
  scheme = schemes.pop()
  dirs = [posixpath.dirname(split_uri(p)[1]).split("/") for p in paths]
  common = dirs[0]
  for parts in dirs[1:]:
    n = 0
    while n < min(len(common), len(parts)) and common[n] == parts[n]:
      n += 1
    common = common[:n]
  joined = "/".join(common)
  if scheme == "" and paths[0].startswith("/") and not joined:
    joined = "/"
  return scheme + joined


def output_path(input_path: str, input_root: str, output_dir: str,
                suffix: str = "array_record") -> str:
  """Where the ArrayRecord file for `input_path` goes.

  The input's directory relative to `input_root` is kept under `output_dir`,
  so two inputs with one basename in different folders never collide.
  """
  scheme, rest = split_uri(input_path)
  root_scheme, root = split_uri(input_root)
  # Relative inputs in the working directory have an empty dirname and root.
  parent = posixpath.dirname(rest) or "."
  default_root = "/" if rest.startswith("/") else "."
  rel = posixpath.relpath(parent, root or default_root) if scheme == root_scheme else None
  if rel is None or rel.startswith(".."):
    raise ValueError(f"{input_path!r} is not under the input root {input_root!r}.")
  name = output_basename(posixpath.basename(rest), suffix)
  out = output_dir.rstrip("/")
  parts = [out] + ([] if rel == "." else [rel]) + [name]
  return "/".join(parts)
