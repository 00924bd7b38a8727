"""The manifest: per shard input, output, record count, bytes and a digest."""

from __future__ import annotations

import datetime
import json
import posixpath
import struct
from typing import Any, Iterable

import xxhash

from converter import writer as _writer

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "arrayrecord-toolkit/manifest"
_LEN = struct.Struct("<Q")


class RecordDigest:
  """xxh3-64 over the record stream; record boundaries count (length-prefixed)."""

  def __init__(self):
    self._h = xxhash.xxh3_64()
    self.records = 0

  def update(self, record: bytes) -> None:
    self._h.update(_LEN.pack(len(record)))
    self._h.update(record)
    self.records += 1

  def update_many(self, records: Iterable[bytes]) -> None:
    for r in records:
      self.update(r)

  def hexdigest(self) -> str:
    return "xxh3_64:" + self._h.hexdigest()


def manifest_path(output_dir: str) -> str:
  return posixpath.join(output_dir.rstrip("/"), MANIFEST_NAME)


def build_manifest(results: list[dict[str, Any]], *, writer_options: str,
                   output_dir: str) -> dict[str, Any]:
  shards = sorted(results, key=lambda r: r["output"])
  ok = [r for r in shards if r["status"] != "failed"]
  return {
      "format": MANIFEST_FORMAT,
      "version": 1,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "output_dir": output_dir,
      "writer_options": writer_options,
      "totals": {
          "shards": len(shards),
          "converted": sum(r["status"] == "converted" for r in shards),
          "existing": sum(r["status"] == "existing" for r in shards),
          "failed": sum(r["status"] == "failed" for r in shards),
          "records": sum(r.get("records") or 0 for r in ok),
          "bytes_in": sum(r.get("bytes_in") or 0 for r in ok),
          "bytes_out": sum(r.get("bytes_out") or 0 for r in ok),
          "corrupt_records_skipped": sum(r.get("corrupt_records_skipped") or 0 for r in shards),
      },
      "shards": shards,
  }


def write_manifest(output_dir: str, manifest: dict[str, Any]) -> str:
  path = manifest_path(output_dir)
  _writer.write_bytes_atomic(path, json.dumps(manifest, indent=1).encode())
  return path


def read_manifest(output_dir: str) -> dict[str, Any] | None:
  """The manifest in output_dir, or None if there is none."""
  path = manifest_path(output_dir)
  if not _writer.exists(path):
    return None
  data = json.loads(_writer.read_bytes(path))
  if data.get("format") != MANIFEST_FORMAT:
    raise ValueError(f"{path} is not an arrayrecord-toolkit manifest (format={data.get('format')!r}).")
  return data
