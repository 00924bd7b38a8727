"""Write example tf.train.Example TFRecord shards (id, label, image) for demos and tests.

  python -m pipelines.make_example_data --output data/ --shards 8 --records-per-shard 1000

Images are 28x28 uint8 bytes: a fixed per-label template plus noise, so a
small model can learn the label. Written without TensorFlow (the Example
protobuf and TFRecord framing are simple); tests check the files against
TensorFlow's own reader.
"""

from __future__ import annotations

import argparse
import errno
import os
import struct
import sys
from typing import Iterator, Sequence

import numpy as np

from converter.tfrecord import masked_crc
from loader import ondisk

IMAGE_SIZE = 28 * 28
NUM_CLASSES = 10


def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1  # Negative int64 values are 10-byte two's complement varints.
  out = bytearray()
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(kind: str, values) -> bytes:
  if kind == "bytes":
    inner = b"".join(_field(1, v) for v in values)
    return _field(1, inner)
  if kind == "float":
    return _field(2, _field(1, np.asarray(values, "<f4").tobytes()))
  return _field(3, _field(1, b"".join(_varint(int(v)) for v in values)))


def encode_example(features: dict[str, tuple[str, list]]) -> bytes:
  """Serializes a tf.train.Example: {name: ('int64'|'float'|'bytes', values)}."""
  entries = b"".join(
      _field(1, _field(1, name.encode()) + _field(2, _feature(kind, values)))
      for name, (kind, values) in sorted(features.items()))
  return _field(1, entries)


def tfrecord_frame(record: bytes) -> bytes:
  length = struct.pack("<Q", len(record))
  return b"".join((length, struct.pack("<I", masked_crc(length)), record,
                   struct.pack("<I", masked_crc(record))))


def write_tfrecord_file(path: str, records, *, overwrite: bool = False) -> None:
  """Writes records with TFRecord framing; the file appears only when complete.

  An existing file at `path` is kept and FileExistsError raised, also when it
  appears while this one is written (another run), unless `overwrite`.
  """
  if not overwrite and os.path.lexists(path):
    raise FileExistsError(f"{path} exists; pass --overwrite (overwrite=True) to replace it.")
  # Hidden, so an interrupted run leaves nothing that a `name-*` glob matches;
  # its name records this process, so the next run removes it after a kill -9.
  ondisk.remove_stale_temps_of(path)
  tmp = ondisk.temp_name(path)
  try:
    try:
      with open(tmp, "wb") as f:
        for r in records:
          f.write(tfrecord_frame(r))
    except OSError as e:
      if e.filename is None:  # A failed write names no file: the error would name only --output.
        raise OSError(e.errno, e.strerror, path) from e
      raise
    try:
      # Without overwrite, a name taken meanwhile (another run) is never replaced.
      ondisk.publish_local(tmp, path, expect=ondisk.REPLACE_ANY if overwrite else None)
    except ondisk.ClobberError:
      raise FileExistsError(f"{path} appeared while it was written (another run?); it was kept. "
                            "Pass --overwrite (overwrite=True) to replace it.") from None
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _templates(seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, size=(NUM_CLASSES, IMAGE_SIZE))


def examples(shard: int, records: int, seed: int = 0, first_id: int = 0) -> Iterator[bytes]:
  """The serialized examples of one shard; deterministic in (seed, shard)."""
  templates = _templates(seed)
  rng = np.random.default_rng([seed, shard])
  labels = rng.integers(0, NUM_CLASSES, size=records)
  noise = rng.integers(0, 256, size=(records, IMAGE_SIZE))
  images = (0.6 * templates[labels] + 0.4 * noise).astype(np.uint8)
  for i in range(records):
    yield encode_example({
        "id": ("int64", [first_id + i]),
        "label": ("int64", [int(labels[i])]),
        "image": ("bytes", [images[i].tobytes()]),
    })


def make_example_data(output: str, shards: int = 8, records_per_shard: int = 1000,
                      prefix: str = "example-train", seed: int = 0, overwrite: bool = False) -> list[str]:
  """Writes `prefix.tfrecord-SSSSS-of-NNNNN` shards; returns their paths.

  Existing files of those names are kept (FileExistsError, before anything
  is written) unless `overwrite`.
  """
  if shards <= 0 or records_per_shard < 0:
    raise ValueError(f"Need shards > 0 and records_per_shard >= 0, got {shards=}, {records_per_shard=}.")
  created, d = [], os.path.abspath(output)
  while not os.path.lexists(d) and d != os.path.dirname(d):
    created.insert(0, d)
    d = os.path.dirname(d)
  os.makedirs(output, exist_ok=True)  # Its errors (a file in the path) as they were.
  try:
    paths = [os.path.join(output, f"{prefix}.tfrecord-{s:05d}-of-{shards:05d}") for s in range(shards)]
    taken = [p for p in paths if os.path.lexists(p)]
    if taken and not overwrite:
      raise FileExistsError(f"{len(taken)} of the {shards} file(s) exist already, e.g. {taken[0]}; nothing was "
                            "written. Pass --overwrite (overwrite=True) to replace them, or another --output.")
    for s, path in enumerate(paths):
      write_tfrecord_file(path, examples(s, records_per_shard, seed, first_id=s * records_per_shard),
                          overwrite=overwrite)
  except BaseException:
    ondisk.remove_empty_dirs(created)  # A run that wrote nothing leaves no folder of its own behind.
    raise
  return paths


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--output", required=True)
  p.add_argument("--shards", type=int, default=8)
  p.add_argument("--records-per-shard", "--records_per_shard", dest="records", type=int, default=1000)
  p.add_argument("--prefix", default="example-train")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--overwrite", action="store_true", help="Replace existing files of the same names.")
  args = p.parse_args(argv)
  try:
    paths = make_example_data(args.output, args.shards, args.records, args.prefix, args.seed, args.overwrite)
  except (FileExistsError, ValueError) as e:
    print(f"{p.prog}: error: {e}", file=sys.stderr)
    return 2
  except OSError as e:  # A full disk, an --output under a file: one line, as for every CLI here.
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
      fix = "free space there or choose another --output"
    elif e.errno == errno.EFBIG:
      fix = "raise the file size limit (`ulimit -f`) or write fewer records per shard (--records-per-shard)"
    else:
      fix = "check --output"
    print(f"{p.prog}: error: cannot write {e.filename or args.output} ({e.strerror or e}); {fix}. No partial "
          "file was left; shards already written are complete (rerun with --overwrite to write them all).",
          file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"{p.prog}: interrupted; no partial file was left; shards already written are complete (rerun with "
          "--overwrite to write them all).", file=sys.stderr)
    return 130
  print(f"Wrote {len(paths)} shard(s) x {args.records} records to {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
