"""Re-read TFRecord inputs and their ArrayRecord outputs; compare counts and digests.

  python -m pipelines.verify --input 'data/train.tfrecord-*' --output out/

Exits non-zero if any shard is missing, differs, or disagrees with the manifest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import shutil
import sys
import tempfile
from typing import Sequence

from converter import (ConversionError, RecordDigest, TFRecordReader, common_dir, expand_patterns,
                       output_path, read_manifest)
from converter import writer as _writer
from pipelines import cli

PROG = "arrayrecord-verify"
_READ_BLOCK = 1024


@dataclasses.dataclass
class ShardCheck:
  input: str
  output: str
  input_records: int | None = None
  output_records: int | None = None
  input_digest: str | None = None
  output_digest: str | None = None
  problem: str | None = None

  @property
  def ok(self) -> bool:
    return self.problem is None


def array_record_digest(path: str) -> tuple[int, str]:
  """Record count and digest of an ArrayRecord file (gs:// is copied locally first)."""
  from array_record.python.array_record_module import ArrayRecordReader
  local, tmp = path, None
  if not _writer.is_local(path):
    from apache_beam.io.filesystems import FileSystems
    fd, tmp = tempfile.mkstemp(suffix=".array_record")
    with os.fdopen(fd, "wb") as dst, FileSystems.open(path) as src:
      shutil.copyfileobj(src, dst, 16 << 20)
    local = tmp
  try:
    reader = ArrayRecordReader(local, "readahead_buffer_size:0")
    n = reader.num_records()
    digest = RecordDigest()
    for start in range(0, n, _READ_BLOCK):
      digest.update_many(reader.read(start, min(n, start + _READ_BLOCK)))
    reader.close()
    return n, digest.hexdigest()
  finally:
    if tmp:
      os.remove(tmp)


def tfrecord_digest(path: str, compression: str = "auto",
                    on_corrupt: str = "fail") -> tuple[int, str]:
  digest = RecordDigest()
  digest.update_many(TFRecordReader(path, compression=compression, on_corrupt=on_corrupt))
  return digest.records, digest.hexdigest()


def check_shard(inp: str, out: str, expected: dict | None, compression: str,
                on_corrupt: str = "fail") -> ShardCheck:
  c = ShardCheck(input=inp, output=out)
  if not _writer.exists(out):
    c.problem = "output missing"
    return c
  try:
    c.input_records, c.input_digest = tfrecord_digest(inp, compression, on_corrupt)
    c.output_records, c.output_digest = array_record_digest(out)
  except (ConversionError, OSError, RuntimeError, ValueError) as e:
    c.problem = f"unreadable: {e}"
    return c
  if c.input_records != c.output_records:
    c.problem = f"record count differs: input {c.input_records}, output {c.output_records}"
  elif c.input_digest != c.output_digest:
    c.problem = "content differs (same count, different records or order)"
  elif expected is not None and expected.get("digest") not in (None, c.output_digest):
    c.problem = "output differs from the manifest's digest"
  return c


def _manifest_outputs(manifest: dict, output_dir: str) -> dict[str, tuple[str, dict]]:
  """{input: (its output under output_dir, manifest entry)}, even if the directory moved."""
  base = manifest.get("output_dir", "").rstrip("/") + "/"
  known = {}
  for s in manifest.get("shards", []):
    out = s.get("output") or ""
    if s.get("input") and out.startswith(base):
      known[s["input"]] = (output_dir.rstrip("/") + "/" + out[len(base):], s)
  return known


def verify(patterns: Sequence[str], output_dir: str, compression: str = "auto",
           on_corrupt: str = "fail",
           suffix: str = "array_record", workers: int | None = None) -> list[ShardCheck]:
  """Checks every input against its output; returns one ShardCheck per shard."""
  inputs = expand_patterns(patterns)
  root = common_dir(inputs)
  known = _manifest_outputs(read_manifest(output_dir) or {}, output_dir)
  # The manifest knows where each input went, which naming alone cannot tell
  # when only some of the converted patterns are checked (another common dir).
  outputs = [known[i][0] if i in known else output_path(i, root, output_dir, suffix)
             for i in inputs]
  expected = dict(known.values())
  # Reading releases the GIL in the ArrayRecord reader and crc32c.
  with concurrent.futures.ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(lambda io: check_shard(io[0], io[1], expected.get(io[1]), compression,
                                             on_corrupt),
                         zip(inputs, outputs)))


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
  p.add_argument("--input", action="append", required=True, metavar="PATTERN")
  p.add_argument("--output", required=True, metavar="DIR")
  p.add_argument("--compression", default="auto", choices=("auto", "gzip", "zlib", "none"))
  p.add_argument("--on-corrupt", "--on_corrupt", dest="on_corrupt", default="fail",
                 choices=("fail", "skip"),
                 help="Use 'skip' for outputs converted with --on-corrupt skip: the "
                 "inputs are then re-read skipping the same damaged records.")
  args = p.parse_args(argv)
  try:
    checks = verify(args.input, args.output, args.compression, args.on_corrupt)
  except (ConversionError, ValueError) as e:
    return cli.fail(PROG, str(e))
  bad = [c for c in checks if not c.ok]
  for c in checks:
    status = "OK  " if c.ok else "FAIL"
    print(f"{status} {c.output}  records={c.output_records}  {c.problem or c.output_digest}")
  total = sum(c.output_records or 0 for c in checks)
  print(f"{len(checks) - len(bad)}/{len(checks)} shard(s) match ({total:,} records).")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
