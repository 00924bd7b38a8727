"""The manifest: per shard input, output, record count, bytes and a digest.

The format itself (name, validation, relative paths) lives in loader.ondisk;
this module adds what needs the converter: the record digest, and reading and
writing manifests on any filesystem Beam knows (gs://...).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import struct
from itertools import islice
from typing import Any, Callable, Iterable

import xxhash

from converter import writer as _writer
from loader import ondisk
from loader import reader_threads
from loader.ondisk import (INCOMPLETE, MANIFEST_FORMAT, MANIFEST_NAME, IncompleteManifestError,
                           ManifestError, manifest_path)

__all__ = ["FoundManifest", "INCOMPLETE", "IncompleteManifestError", "MANIFEST_FORMAT",
           "MANIFEST_NAME", "ManifestError", "RecordDigest", "array_record_digest",
           "build_manifest", "find_manifest", "manifest_path", "read_manifest",
           "write_digested", "write_incomplete_manifest", "write_manifest"]

_LEN = struct.Struct("<Q")
READ_BLOCK = 1024
# Records per batch in write_digested (see there).
_WRITE_BATCH = 256
# At most this many bytes of records per batch (a record bigger than it is a batch of its own).
_WRITE_BATCH_BYTES = 4 << 20


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
    update, pack, n = self._h.update, _LEN.pack, 0
    for r in records:
      update(pack(len(r)))
      update(r)
      n += 1
    self.records += n

  def hexdigest(self) -> str:
    return "xxh3_64:" + self._h.hexdigest()


def write_digested(records: Iterable[bytes], write: Callable[[bytes], Any],
                   digest: RecordDigest) -> None:
  """Writes every record, in order, and adds each to the digest.

  A record the writer cannot take (MemoryError) gets `record_at`: its index, size and, from a reader that
  can say (TFRecordReader.position / place), its offset in the input.

  A batch is written and then hashed: alternating per record costs ~10% more
  CPU, because zstd's tables and the bytes being hashed (and the reader's
  buffer) keep evicting each other from the cache; in batches the whole copy
  is slightly cheaper than a bare read-and-write loop (bench/convert.py).
  """
  it = iter(records)
  position = getattr(records, "position", None)
  while True:
    # Capped in bytes too: 256 records of 30 MB each (video clips, say) were all held at once, so memory grew
    # with a shard's big records rather than with its biggest one.
    before = position() if position is not None else None
    batch, size = [], 0
    append = batch.append
    for record in islice(it, _WRITE_BATCH):
      append(record)
      size += len(record)
      if size >= _WRITE_BATCH_BYTES:
        break
    if not batch:
      return
    try:
      for record in batch:
        write(record)
    except MemoryError as e:
      # Which record the writer could not take (by identity: equal records may come before it).
      i = next(i for i, r in enumerate(batch) if r is record)
      if before is None:  # A reader that cannot say where: the index among the records written.
        e.record_at = (digest.records + i, len(record), None, False)
      else:
        index, offset, compressed = records.place(before, batch, i)
        e.record_at = (index, len(record), offset, compressed)
      raise
    digest.update_many(batch)


def array_record_digest(path: str) -> tuple[int, str]:
  """Record count (from the footer) and digest of an ArrayRecord file.

  gs:// files are copied to a local temp file first.
  """
  local, tmp = path, None
  try:
    if not _writer.is_local(path):
      from apache_beam.io.filesystems import FileSystems
      local = tmp = _writer.staging_file()
      with open(tmp, "wb") as dst, FileSystems.open(path) as src:
        shutil.copyfileobj(src, dst, 16 << 20)
    reader = reader_threads.reader_class(path)(local, "readahead_buffer_size:0")
    try:
      n = reader.num_records()
      digest = RecordDigest()
      for start in range(0, n, READ_BLOCK):
        digest.update_many(reader.read(start, min(n, start + READ_BLOCK)))
    finally:
      reader.close()
    return n, digest.hexdigest()
  finally:
    if tmp:
      os.remove(tmp)


def array_record_count(path: str) -> int:
  """Records in a local ArrayRecord file, from its footer (no record is read)."""
  reader = reader_threads.reader_class(path)(path, "readahead_buffer_size:0")
  try:
    return reader.num_records()
  finally:
    reader.close()


def build_manifest(results: list[dict[str, Any]], *, writer_options: str,
                   output_dir: str) -> dict[str, Any]:
  """The manifest for per-shard results (full paths; stored relative to output_dir)."""
  return ondisk.build_manifest(results, output_dir=output_dir, writer_options=writer_options)


def write_manifest(output_dir: str, manifest: dict[str, Any]) -> str:
  path = manifest_path(output_dir)
  _writer.write_bytes_atomic(path, ondisk.dump_manifest(manifest))
  return path


def read_manifest(output_dir: str, *, incomplete_ok: bool = False) -> dict[str, Any] | None:
  """The checked manifest in output_dir with full shard paths, or None if there is none.

  Shard `input`/`output` paths are resolved against output_dir (the manifest
  stores them relative to it), so a moved or copied output directory names
  its own files.

  Raises:
    ManifestError: the manifest is not valid, or (IncompleteManifestError,
      unless incomplete_ok) marks a run that did not finish; the message
      names the file.
  """
  path = manifest_path(output_dir)
  if not _writer.exists(path):
    return None
  try:
    data = _writer.read_bytes(path)
  except ondisk.SpecialFileError as e:
    raise ManifestError(f"{e} (or delete it) and rerun.") from None
  manifest = ondisk.parse_manifest(data, path, incomplete_ok=incomplete_ok)
  return {**manifest, "shards": ondisk.resolved_shards(manifest, output_dir)}


@dataclasses.dataclass(frozen=True)
class FoundManifest:
  """A manifest.json already in an output directory, and whose it is.

  Attributes:
    path: Its path.
    kind: 'complete' (a finished run's), 'incomplete' (the marker of a run that
      has not finished), 'damaged' (ours, but unreadable: not JSON, or our
      format with bad fields), 'newer' (our format, of a later manifest version
      than this code reads: replaced only with --overwrite) or 'foreign' (valid
      JSON that does not claim our format: someone else's file, replaced only
      with --overwrite).
    manifest: The parsed manifest with full shard paths (complete, incomplete).
    problem: Why it is damaged or foreign.
  """

  path: str
  kind: str
  manifest: dict[str, Any] | None = None
  problem: str | None = None


def find_manifest(output_dir: str) -> FoundManifest | None:
  """The manifest.json in output_dir and its kind, or None if there is none."""
  path = manifest_path(output_dir)
  if not _writer.exists(path):
    return None
  data = _writer.read_bytes(path)
  try:
    doc = json.loads(data)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    # Not JSON at all: a torn or corrupted copy of ours (we only ever write JSON).
    return FoundManifest(path, "damaged", problem=f"not valid JSON ({e})")
  except RecursionError:  # We never write nested JSON: corrupted.
    return FoundManifest(path, "damaged", problem="not a manifest: its JSON is nested too deeply")
  fmt = doc.get("format") if isinstance(doc, dict) else None
  if fmt != MANIFEST_FORMAT:
    what = (f"a JSON {type(doc).__name__}" if not isinstance(doc, dict) else
            "no 'format'" if fmt is None else f"format={fmt!r}")
    return FoundManifest(path, "foreign", problem=f"{what}, not {MANIFEST_FORMAT!r}")
  version = doc.get("version")
  if isinstance(version, int) and not isinstance(version, bool) and version > ondisk.MANIFEST_VERSION:
    # Not damaged: its shards (another split's, say) and any run it marks are unknown here, not absent.
    return FoundManifest(path, "newer", problem=f"manifest version {version}; this one reads up to "
                                                f"{ondisk.MANIFEST_VERSION}")
  try:
    manifest = ondisk.parse_manifest(data, path, incomplete_ok=True)
  except ManifestError as e:
    return FoundManifest(path, "damaged", problem=str(e))
  kind = "incomplete" if manifest.get("status") == INCOMPLETE else "complete"
  return FoundManifest(path, kind, {**manifest, "shards": ondisk.resolved_shards(manifest, output_dir)})


def write_incomplete_manifest(output_dir: str, shards: list[dict[str, Any]], *,
                              writer_options: str, existing: str, run_id: str) -> str:
  """Replaces manifest.json by the marker of a run that is about to change shards.

  The run is described by the output directory's lock holder (the process
  that runs the conversion) where there is one, else by this process.
  """
  holder = ondisk.lock_holder(output_dir) if _writer.is_local(output_dir) else None
  me = ondisk.this_process()
  run = {"pid": me.pid, "host": me.host, "process_start": me.start,
         "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
  if holder:
    run.update({k: holder[k] for k in ("pid", "host", "process_start", "started") if k in holder})
  run.update(existing=existing, id=run_id)
  marker = ondisk.incomplete_manifest(shards, output_dir=output_dir, writer_options=writer_options,
                                      run=run)
  path = manifest_path(output_dir)
  _writer.write_bytes_atomic(path, ondisk.dump_manifest(marker))
  return path
