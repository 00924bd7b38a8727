"""Streaming TFRecord reader with CRC32C checks, over Beam FileSystems.

TFRecord framing, per record:
  uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
all little-endian. GZIP and ZLIB streams are detected from their magic bytes.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import stat
import struct
import zlib
from typing import BinaryIO, Iterator, Sequence

import crc32c as _crc32c
import numpy as np

from converter.errors import (CompressionMismatchError, CorruptRecordError, InputError, NotTFRecordError,
                              RecordMemoryError, is_remote_not_found)
from loader import ondisk
from loader.ondisk import RIEGELI_SIGNATURE, is_local
from loader.iter_sources import tfrecord as tfrecord_source

COMPRESSIONS = ("auto", "gzip", "zlib", "none")
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_CHUNK = 1 << 22  # 4 MiB reads keep per-record Python work off the I/O path.
_MAX_RECORD = 1 << 40  # Resync skips header candidates claiming more (1 TiB).
# Compressed bytes per zlib call. Each step starts from a (cheap) copy of the
# zlib state, so on damage only the failing step is re-fed byte by byte.
_STEP = 1 << 16


def masked_crc(data) -> int:
  crc = _crc32c.crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _is_uncompressed_header(head: bytes) -> bool:
  return len(head) >= 12 and masked_crc(head[:8]) == _HEADER.unpack_from(head)[1]


def detect_compression(head: bytes) -> str:
  """Guesses 'gzip', 'zlib' or 'none' from a file's first bytes."""
  if len(head) == 0 or _is_uncompressed_header(head):
    return "none"
  # Anything else is left to the record checks, which report what is wrong with it.
  return tfrecord_source.compressed_kind(head) or "none"


def check_compression(compression: str) -> str:
  if compression not in COMPRESSIONS:
    raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}.")
  return compression


class _Truncated(Exception):
  """The compressed stream ended before its end marker."""


class _Damaged(Exception):
  """The compressed stream cannot be decoded past compressed byte `offset`."""

  def __init__(self, kind: str, error: str, offset: int, member_start: int, member_output: int):
    super().__init__(error)
    self.kind, self.error, self.offset, self.member_start = kind, error, offset, member_start
    # A later member that failed before giving any output is not gzip data at
    # all (e.g. zero padding some tools append), not damage inside a member.
    self.trailing = member_start > 0 and member_output == 0 and "header" in error

  def reason(self, inside_record: bool) -> str:
    """The error's reason, for damage inside a record or after the last whole one."""
    where = f"compressed byte offset {self.offset}: {self.error}"
    if inside_record:
      return (f"the {self.kind} stream is damaged inside this record (detected at {where}); "
              "the records before it are intact, this record and the data after it cannot "
              "be recovered")
    if self.trailing:
      return (f"the {self.kind} stream ends after the last record, at compressed byte offset "
              f"{self.member_start}, and the bytes after it are not {self.kind} data "
              f"({self.error}); the records before it are intact")
    if self.error.endswith(("incorrect data check", "incorrect length check")):
      # zlib's "incorrect data check" / "incorrect length check": the stream
      # decoded to its end and only its trailer disagrees.
      return (f"the {self.kind} stream's trailer does not match its data (detected at "
              f"{where}), after the last record; every record read passed its own checksums")
    return (f"the {self.kind} stream is damaged after the last complete record (detected at "
            f"{where}); the records before it are intact, data after this point cannot be "
            "recovered")


class _Decompressor:
  """Decompresses a raw stream chunk by chunk; handles concatenated members.

  Input is fed in _STEP pieces, each from a copy of the decompressor's state,
  so that when zlib reports damage (a bad block, a bad trailer checksum) the
  output decoded before it is kept: zlib raises without returning it.
  """

  def __init__(self, raw: BinaryIO, first: bytes, kind: str):
    self._raw = raw
    self._pending = first
    self._seen_input = bool(first)
    self._kind = kind
    self._wbits = 31 if kind == "gzip" else 15
    self._d = zlib.decompressobj(self._wbits)
    self._offset = 0           # Compressed offset of the next raw chunk.
    self._member_start = 0     # Compressed offset where the current member starts.
    self._member_output = 0    # Bytes the current member has decoded so far.
    self._fault: _Damaged | _Truncated | None = None

  def read_chunk(self) -> bytes:
    """Next decompressed bytes (about _CHUNK at most); b"" at the end.

    Raises _Truncated, or _Damaged once the output before the damage has been
    returned.
    """
    while True:
      if self._fault is not None:
        raise self._fault
      data, self._pending = (self._pending or self._raw.read(_CHUNK)), b""
      if not data:
        try:  # What a stop at the output limit left inside zlib (at most one match), and the end marker.
          rest = self._d.flush()
        except zlib.error:
          rest = b""
        # An empty file holds no records (as in TensorFlow); a started stream
        # must reach its end marker.
        if self._seen_input and not self._d.eof:
          if rest:  # Whole records may end in it: returned first, the truncation raised at the next call.
            self._fault = _Truncated()
            return rest
          raise _Truncated()
        return rest
      self._seen_input = True
      view = memoryview(data)
      out, size, used = [], 0, 0
      # Up to _CHUNK decoded bytes a call; the rest of the input waits for the next. Decoding a whole read at
      # once held up to ~1000 times its size (4 GB for a 4 MiB read of zeros or padding).
      while used < len(view) and size < _CHUNK and self._fault is None:
        got, n = self._feed(view[used:used + _STEP], self._offset + used, _CHUNK - size)
        out.append(got)
        size += len(got)
        used += n
      self._pending = view[used:]
      self._offset += used
      out = b"".join(out)
      if out:
        return out

  def _feed(self, piece: memoryview, offset: int, limit: int) -> tuple[bytes, int]:
    """Decompresses from a piece starting at compressed `offset`, up to `limit` bytes (> 0).

    Returns the output and how many bytes of the piece it used; on damage sets _fault (and uses all).
    """
    out, size, whole = [], 0, len(piece)
    while piece and size < limit:
      saved = self._d.copy()
      try:
        got = self._d.decompress(piece, limit - size)
      except zlib.error as e:
        got, at = _salvage(saved, piece)
        out.append(got)
        self._member_output += len(got)
        self._fault = _Damaged(self._kind, str(e), offset + at, self._member_start,
                               self._member_output)
        return b"".join(out), whole
      out.append(got)
      size += len(got)
      self._member_output += len(got)
      if not self._d.eof:
        # With the output limit reached, the rest of the piece is decoded by a later call.
        tail = self._d.unconsumed_tail
        offset += len(piece) - len(tail)
        piece = memoryview(tail)
        continue
      # (At the end of a member, unconsumed_tail may still hold what unused_data now holds: not read twice.)
      if not self._d.unused_data:
        piece = piece[len(piece):]
        break
      # The member ended inside this piece: the rest starts the next member.
      rest = self._d.unused_data
      offset += len(piece) - len(rest)
      piece = memoryview(rest)
      self._d = zlib.decompressobj(self._wbits)
      self._member_start, self._member_output = offset, 0
    return b"".join(out), whole - len(piece)


def _salvage(d, piece: memoryview) -> tuple[bytes, int]:
  """Re-feeds a piece that failed one byte at a time: (output before the error, its index).

  Rare path (damaged input only); at most _STEP one-byte calls.
  """
  out = []
  for k in range(len(piece)):
    try:
      out.append(d.decompress(piece[k:k + 1]))
    except zlib.error:
      return b"".join(out), k
  return b"".join(out), len(piece)


@dataclasses.dataclass
class ReadStats:
  records: int = 0
  skipped: int = 0
  bytes_records: int = 0
  truncated: bool = False
  # (record index, byte offset) of the first record skipped or cut off, in skip mode.
  first_loss: tuple[int, int] | None = None


class TFRecordReader:
  """Iterates over the records of one TFRecord file, checking both CRCs.

  Args:
    path: Local path or any URI Beam FileSystems can open (gs://...).
    compression: 'auto' (detect from content), 'gzip', 'zlib' or 'none'.
    on_corrupt: 'fail' raises CorruptRecordError; 'skip' drops a record whose
      data checksum fails, resyncs at the next whole valid record past a
      damaged header or a record whose length does not hold up (no valid header
      after it, or past the file's end), and drops a record cut short at the
      end of the file. A damaged
      header with no valid record after it still raises. A damaged GZIP/ZLIB
      stream is read up to the damage (zlib cannot resync past it); 'fail'
      names the first record that cannot be read, 'skip' keeps the records
      before it and counts the damaged tail as a truncated input (plus one
      skipped record when the damage cuts a record).
  """

  def __init__(self, path: str, compression: str = "auto", on_corrupt: str = "fail",
               opener=None):
    self.path = path
    self.compression = check_compression(compression)
    if on_corrupt not in ("fail", "skip"):
      raise ValueError(f"on_corrupt must be 'fail' or 'skip', got {on_corrupt!r}.")
    self.on_corrupt = on_corrupt
    self.stats = ReadStats()
    # Stream offset just past the last record handed out (see position()).
    self._next_offset = 0
    # (index, offset) of each record handed out right after a skipped one, by its count among those handed out.
    self._after_skip: dict[int, tuple[int, int]] = {}
    self._opener = opener
    self.detected_compression: str | None = None
    self._opened: os.stat_result | None = None  # The local file as opened (see change()).

  def _open(self) -> BinaryIO:
    if self._opener is not None:
      return self._opener(self.path)
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    return FileSystems.open(self.path, compression_type=CompressionTypes.UNCOMPRESSED)

  def _chunks(self, f: BinaryIO) -> Iterator[bytes]:
    head = f.read(_CHUNK)
    while 0 < len(head) < 64:  # A short first read must not fool the detection.
      more = f.read(_CHUNK)
      if not more:
        break
      head += more
    kind = self.compression if self.compression != "auto" else detect_compression(head)
    if self.compression != "auto" and head:
      found = detect_compression(head)
      # Content sniffing says "none" for anything it does not recognise, so a
      # forced gzip/zlib must match exactly; a forced "none" must not be gzip/zlib.
      if found != kind and (kind != "none" or found in ("gzip", "zlib")):
        raise CompressionMismatchError(self.path, kind, found)
    self.detected_compression = kind
    if kind == "none":
      while head:
        yield head
        head = f.read(_CHUNK)
      return
    d = _Decompressor(f, head, kind)
    while True:
      try:
        out = d.read_chunk()
      except _Truncated:
        # Like a truncated plain file: the record parser reports (or skips)
        # the record that was cut short.
        self._stream_truncated = True
        return
      except _Damaged as e:
        # Everything decoded before the damage has been yielded; the record
        # parser reports (or skips) what the damage cut off.
        self._stream_damage = e
        return
      if not out:
        return
      yield out

  def __iter__(self) -> Iterator[bytes]:
    if self._opener is None and is_local(self.path):
      check_regular_file(self.path)  # Opening a FIFO would block forever.
    try:
      with self._open() as f:
        if self._opener is None and is_local(self.path):
          self._opened = _stat_of(f, self.path)
        yield from self._records(self._chunks(f))
    except OSError as e:
      reason = f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e).split("\n")[0]
      raise InputError(self.path, f"cannot be read ({reason})",
                       "check that it exists and is readable") from e
    except Exception as e:  # pylint: disable=broad-except  # Re-raised unless the storage client's own.
      problem = None if self._opener is not None or is_local(self.path) else _remote_read_problem(e)
      if problem is None:
        raise
      raise InputError(self.path, problem, "check that it exists and is readable") from e

  def position(self) -> tuple[int, int, int]:
    """(records handed out, the index and stream offset the next one has unless a damaged stretch comes first)."""
    return self.stats.records, self.stats.records + self.stats.skipped, self._next_offset

  def place(self, before: tuple[int, int, int], batch: Sequence[bytes], i: int) -> tuple[int, int, bool]:
    """(input index, stream offset, whether offsets count decompressed bytes) of batch[i]: records handed out
    in a row after `before` (a position())."""
    handed, index, offset = before
    for j in range(i + 1):
      index, offset = self._after_skip.get(handed + j, (index, offset))
      if j < i:
        index, offset = index + 1, offset + 16 + len(batch[j])  # Length, its checksum, data, its checksum.
    return index, offset, self.detected_compression not in (None, "none")

  @property
  def opened_size(self) -> int | None:
    """The local file's size when it was opened (None before, or for a URI)."""
    return None if self._opened is None else self._opened.st_size

  @property
  def opened_times(self) -> dict[str, int]:
    """The local file's modification and inode change times (ns) when it was opened; {} before, or for a URI.

    Recorded in the manifest, so a resume tells a rewritten input by these, not by comparing clocks.
    """
    if self._opened is None:
      return {}
    return {"input_mtime_ns": self._opened.st_mtime_ns, "input_ctime_ns": self._opened.st_ctime_ns}

  def change(self) -> str | None:
    """How the local file at `path` differs from the one opened, or None.

    A file replaced (another inode at the path) or rewritten (size or mtime)
    while it was read gives records of one file and a size of another.
    """
    before = self._opened
    if before is None:
      return None
    try:
      now = os.stat(self.path)
    except FileNotFoundError:
      return "does not exist"
    except OSError:
      return None  # Unreadable now: the read itself says so.
    if (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
      # Inode numbers alone are not trusted: some FUSE mounts renumber files.
      return None
    sizes = f"{before.st_size:,} bytes when opened, {now.st_size:,} now"
    if not stat.S_ISREG(now.st_mode):  # A folder's (or FIFO's) size is no file's size.
      kind = "a folder" if stat.S_ISDIR(now.st_mode) else "something that is not a regular file"
      return f"was replaced by {kind} (a file of {before.st_size:,} bytes when opened)"
    if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
      return f"was replaced by another file ({sizes})"
    return f"was modified ({sizes})"

  def _corrupt(self, offset: int, reason: str) -> CorruptRecordError:
    return CorruptRecordError(
        self.path, self.stats.records + self.stats.skipped, offset, reason,
        compressed=self.detected_compression not in (None, "none"),
        skipping=self.on_corrupt == "skip")

  def _records(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
    buf = b""
    pos = 0          # Position of the next record in buf.
    base = 0         # Stream offset of buf[0].
    self._stream_truncated = False
    self._stream_damage: _Damaged | None = None
    self._next_offset = 0
    self._after_skip = {}
    skipped = 0  # stats.skipped when the last record was handed out.
    eof = False
    stats = self.stats
    header_unpack = _HEADER.unpack_from
    footer_unpack = _FOOTER.unpack_from
    try:
      while True:
        avail = len(buf) - pos
        if avail < 12:
          if not eof:
            buf, pos, base, eof = self._refill(chunks, buf, pos, base)
            continue
          if avail == 0:
            if self._stream_truncated:
              self._truncated_stream(base + pos)
            elif self._stream_damage is not None:
              self._damaged_stream(base + pos)
            return
          self._bad_tail(base + pos, self._cut_reason("the file ends inside a record header "
                         f"({avail} of 12 bytes; the file is truncated)"))
          return
        length, length_crc = header_unpack(buf, pos)
        if masked_crc(buf[pos:pos + 8]) != length_crc:
          buf, pos, base, eof = self._resync(buf, pos, base, chunks, eof)
          continue
        end = pos + 12 + length + 4
        if end > len(buf):
          # A plain local file's size says at once whether the record is cut: a damaged length
          # (checksum passed by chance, or written so) would otherwise be read to the file's end.
          size = self._opened.st_size if self._opened is not None and self.detected_compression == "none" else None
          if not eof and (size is None or base + end <= size):
            buf, pos, base, eof = self._refill(chunks, buf, pos, base, need=end - pos)
            continue
          present = min((base + len(buf) if size is None else size) - base - pos - 12, length)
          reason = self._cut_reason(
              f"the file ends inside the record (header says {length} data bytes, {present} "
              "present, plus a 4-byte checksum; the file is truncated)")
          if self.on_corrupt == "skip" and self._stream_damage is None:
            # A cut record followed by whole ones (a partial download with
            # another file appended): the records after the cut are kept.
            buf, pos, base, eof = self._resync(buf, pos, base, chunks, eof, after="cut")
            continue
          self._bad_tail(base + pos, reason)
          return
        data = buf[pos + 12:pos + 12 + length]
        if masked_crc(data) != footer_unpack(buf, pos + 12 + length)[0]:
          if self.on_corrupt == "fail":
            raise self._corrupt(base + pos, "data checksum mismatch")
          if end + 12 > len(buf) and not eof:
            buf, pos, base, eof = self._refill(chunks, buf, pos, base)
            continue
          if end == len(buf) or _is_uncompressed_header(buf[end:end + 12]):
            # Only this record's data is damaged: the next record starts where its header says.
            self._note_loss(base + pos)
            stats.skipped += 1
            pos = end
            continue
          # Its length is wrong too (a record cut short and another file's
          # records after it): the next whole record is searched for instead.
          buf, pos, base, eof = self._resync(buf, pos, base, chunks, eof, after="data")
          continue
        if stats.skipped != skipped:
          skipped = stats.skipped
          self._after_skip[stats.records] = (stats.records + skipped, base + pos)
        stats.records += 1
        stats.bytes_records += length
        pos = end
        self._next_offset = base + end
        yield data
    except MemoryError:
      # A bare "MemoryError" named neither the file nor the record; the record is the one at buf[pos:].
      length = header_unpack(buf, pos)[0] if len(buf) - pos >= 12 else None
      raise RecordMemoryError(self.path, stats.records + stats.skipped, base + pos, length,
                              compressed=self.detected_compression not in (None, "none")) from None

  def _refill(self, chunks: Iterator[bytes], buf: bytes, pos: int, base: int, need: int = 0):
    """The unread rest of buf with the next chunk appended, or chunks until it holds `need` bytes:
    (buf, pos, base, eof). Joined once (see _extend): a big record is not copied once per chunk."""
    rest = buf[pos:]
    data, eof = _extend(rest, chunks, max(len(rest) + 1, need))
    return data, 0, base + pos, eof

  def _note_loss(self, offset: int) -> None:
    if self.stats.first_loss is None:
      self.stats.first_loss = (self.stats.records + self.stats.skipped, offset)

  def _bad_tail(self, offset: int, reason: str) -> None:
    if self.on_corrupt == "fail":
      raise self._corrupt(offset, reason)
    self._note_loss(offset)
    self.stats.skipped += 1
    self.stats.truncated = True

  def _cut_reason(self, truncated: str) -> str:
    """Why the last record is incomplete: the file's end, or damage to its compressed stream."""
    if self._stream_damage is not None:
      return self._stream_damage.reason(inside_record=True)
    return truncated

  def _damaged_stream(self, offset: int) -> None:
    """The compressed stream is damaged after the last complete record.

    As with a stream cut short between records: no record is known to be cut,
    but what follows the damage (if anything) cannot be read or counted, so
    skip mode flags the input as truncated.
    """
    if self.on_corrupt == "fail":
      raise self._corrupt(offset, self._stream_damage.reason(inside_record=False))
    self._note_loss(offset)
    self.stats.truncated = True

  def _truncated_stream(self, offset: int) -> None:
    """The compressed stream ended between records but before its end marker."""
    if self.on_corrupt == "fail":
      raise self._corrupt(offset, f"the {self.detected_compression} stream ends before its "
                          "end marker (the file is truncated; records after this point "
                          "are missing)")
    self._note_loss(offset)
    self.stats.truncated = True

  def _not_tfrecord(self, head: bytes, what: str) -> NotTFRecordError:
    compressed = self.detected_compression not in (None, "none")
    after = " (after decompression)" if compressed else ""
    container = _container(head, self.path)
    if head.startswith(RIEGELI_SIGNATURE):
      what = f"it is an ArrayRecord file (already converted?){after}"
    elif container is not None:
      # bzip2, xz, zstd, a tar or ZIP archive (also a .tar.gz): said so, with the command that unpacks it.
      kind, command = container
      inside = f" inside its {self.detected_compression.upper()} compression" if compressed else ""
      what = (f"it is {kind}{inside}, which this converter does not read (it reads TFRecord files, plain or "
              f"GZIP/ZLIB-compressed): unpack it first ({command}) and convert what that gives")
    else:
      what = f"{what}; it starts with {bytes(head[:16])!r}{after}"
    return NotTFRecordError(self.path, what, compressed=compressed, skipping=self.on_corrupt == "skip")

  def _resync(self, buf, pos, base, chunks, eof, after: str = "header"):
    """After a damaged record: find the next offset where a whole valid record starts.

    `after` says what was wrong with the record at `pos`: its header ("header"),
    its data and the length it gave ("data"), or a length running past the
    file's end ("cut"). Returns (buf, pos, base, eof) positioned there. The
    scan streams: memory holds one chunk (and the candidate record) whatever
    the file's size.
    """
    bad_offset = base + pos
    if bad_offset == 0 and _container(buf) is not None:
      # An archive or a stream of another compression: records found inside it (a tar stores its files
      # as they are) are not this file's records, in skip mode either.
      raise self._not_tfrecord(buf, "")
    if self.on_corrupt == "fail":
      if bad_offset == 0 and not _header_candidates(buf, 1):
        raise self._not_tfrecord(buf, f"no valid record header in its first {len(buf):,} bytes")
      reason = "length checksum mismatch (damaged record header)"
      if (self.stats.records and self.detected_compression in (None, "none") and not bytes(buf[pos:]).strip(b"\0")
          and (eof or not any(bytes(c).strip(b"\0") for c in chunks))):  # Zeros to the file's end, not a hole.
        # Zeros where records should go: a download or copy cut short into a preallocated file, or a crash
        # before the data reached the disk. Skipping finds nothing after them; cutting them off keeps the rest.
        reason += (f"; zero bytes follow (a download or copy cut short, or a crash before the data was "
                   f"written?); the {self.stats.records} record(s) before byte offset {bad_offset} are intact: "
                   f"to convert just those, cut the file there (truncate -s {bad_offset} FILE) and rerun")
      raise self._corrupt(bad_offset, reason)
    self._note_loss(bad_offset)
    data, start, lo = buf[pos + 1:], base + pos + 1, 0  # Offsets below lo in data are ruled out.
    while True:
      scan_end = max(lo, len(data) - 11)  # Offsets below it have a whole header in data.
      for i in _header_candidates(data, lo):
        length = _HEADER.unpack_from(data, i)[0]
        end = i + 12 + length + 4
        if end > len(data) and not eof:
          data, eof = _extend(data, chunks, end)
        if end <= len(data) and masked_crc(data[i + 12:i + 12 + length]) == _FOOTER.unpack_from(data, i + 12 + length)[0]:
          self.stats.skipped += 1
          return data, i, start, eof
      lo = scan_end
      if len(data) - 11 > lo:
        continue  # Data grew while a candidate was checked: scan the new offsets first.
      if eof:
        break
      nxt = next(chunks, None)
      if nxt is None:
        eof = True
        continue
      data, start, lo = data[lo:] + nxt, start + lo, 0
    if self._stream_damage is not None or after != "header":
      # The compressed stream's damage explains the bad header, or the
      # damaged record runs to the file's end: nothing after it can be read,
      # a damaged tail, skipped as a cut-off record is.
      self.stats.skipped += 1
      self.stats.truncated = True
      return data, len(data), start, True
    if bad_offset == 0:
      raise self._not_tfrecord(buf, "no valid record anywhere in it")
    compressed = self.detected_compression not in (None, "none")
    # How much of the file is lost is unknown, so skipping does not hide it; the records before are sound,
    # and in a plain file a user can keep them by cutting it (a crash often appends zeros, say).
    keep = ("" if compressed or not self.stats.records else
            f"; the {self.stats.records} record(s) before byte offset {bad_offset} are intact: to convert just "
            f"those, cut the file there (truncate -s {bad_offset} FILE) and rerun")
    raise CorruptRecordError(
        self.path, self.stats.records + self.stats.skipped, bad_offset,
        "length checksum mismatch (damaged record header) and no valid record "
        f"follows, so the rest of the file cannot be recovered{keep}",
        compressed=compressed, skipping=True)


_ZERO_LENGTH_CRC = masked_crc(bytes(8))


def _header_candidates(data: bytes, lo: int) -> list[int]:
  """Offsets >= lo in data where a record header with a valid length checksum starts.

  Vectorized: the checksum is computed once per distinct length value, so a
  damaged region costs numpy time, not a Python step per byte.
  """
  count = len(data) - 12 + 1 - lo
  if count <= 0:
    return []
  lengths = np.ndarray((count,), "<u8", data, lo, (1,))
  crcs = np.ndarray((count,), "<u4", data, lo + 8, (1,))
  # A length past what any file holds cannot be a header (random bytes seldom pass).
  # Zero lengths (runs of zero bytes: a preallocated file cut short) are checked against their one checksum
  # apart: sorting millions of equal values in np.unique made skipping such a run crawl (~10 MB/s).
  zero = lengths == 0
  hits = [np.flatnonzero(zero & (crcs == _ZERO_LENGTH_CRC))]
  maybe = np.flatnonzero((lengths < _MAX_RECORD) & ~zero)
  if len(maybe):
    values, inverse = np.unique(lengths[maybe], return_inverse=True)
    expected = np.array([masked_crc(int(v).to_bytes(8, "little")) for v in values], np.uint32)
    hits.append(maybe[expected[inverse.ravel()] == crcs[maybe]])
  return (np.sort(np.concatenate(hits)) + lo).tolist()


# Formats people compress or bundle TFRecord files in that are not TFRecord's own GZIP/ZLIB: their magic
# bytes, what they are, and the command that gives the file back (FILE: the input; OUT: where to put it).
_CONTAINERS = (
    (b"BZh", "a bzip2-compressed file", "bzip2 -dc FILE > OUT", (".bz2", ".bzip2")),
    (b"\xfd7zXZ\x00", "an xz-compressed file", "xz -dc FILE > OUT", (".xz",)),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file", "zstd -dc FILE > OUT", (".zst", ".zstd")),
    (b"\x04\x22\x4d\x18", "an LZ4-compressed file", "lz4 -dc FILE > OUT", (".lz4",)),
    (b"PK\x03\x04", "a ZIP archive", "unzip FILE", ()),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x FILE", ()),
)


def _container(head: bytes, path: str = "FILE") -> tuple[str, str] | None:
  """(what the file is, the command that unpacks it) for an archive or another compression's stream."""
  head = bytes(head[:512])
  for magic, kind, command, suffixes in _CONTAINERS:
    if head.startswith(magic) and (magic != b"BZh" or (head[3:4].isdigit() and head[4:10] == b"1AY&SY")):
      out = next((path[:-len(s)] for s in suffixes if path.endswith(s) and len(path) > len(s)),
                 path + ".decompressed")
      return kind, command.replace("FILE", shlex.quote(path)).replace("OUT", shlex.quote(out))
  if head[257:262] == b"ustar":  # POSIX and GNU tar headers.
    return "a tar archive", f"tar -xf {shlex.quote(path)}"
  return None


def _extend(data: bytes, chunks: Iterator[bytes], size: int) -> tuple[bytes, bool]:
  """data with chunks appended until it holds `size` bytes or the stream ends: (data, eof).

  Joined once: appending chunk by chunk would copy a big record once per chunk
  (quadratic: a minute for a record of 800 MB).
  """
  parts, have = [data], len(data)
  eof = False
  while have < size:
    nxt = next(chunks, None)
    if nxt is None:
      eof = True
      break
    parts.append(nxt)
    have += len(nxt)
  return b"".join(parts), eof


def _remote_read_problem(error: Exception) -> str | None:
  """What a failed read of a gs:// object says of it, from the storage client's own error; else None.

  An object listed when the run was planned and deleted before (or while) it was read raised google's bare
  "NotFound: 404 GET http://.../o/tfr%2Fx.tfrecord?projection=noAcl...", no OSError, naming the input only
  inside a URL. Other errors (a lost connection, a 5xx after retries) keep the CLI's own wording.
  """
  return "does not exist" if is_remote_not_found(error) else None


def _stat_of(f: BinaryIO, path: str) -> os.stat_result:
  """The open file's own stat (its inode, even if the path is replaced meanwhile)."""
  try:
    return os.fstat(f.fileno())
  except (AttributeError, OSError, ValueError):  # A wrapper without a descriptor.
    return os.stat(path)


def check_regular_file(path: str) -> None:
  """Raises InputError unless a local path is a regular file (or a link to one) with a UTF-8 name."""
  shown = ondisk.non_utf8_name(path)
  if shown is not None:
    raise InputError(shown, "has a name that is not valid UTF-8 text, which Beam cannot pass on",
                     "rename it to UTF-8 (e.g. convmv -f latin1 -t utf8 --notest FILE)")
  problem = ondisk.file_problem(path)
  if problem is not None:
    fix = problem.fix
    if problem.kind == "directory":
      fix += f", e.g. --input '{os.path.join(path, '*')}'"
    raise InputError(path, problem.what, fix)


def read_tfrecords(path: str, compression: str = "auto", on_corrupt: str = "fail") -> Iterator[bytes]:
  """Convenience: the records of one TFRecord file."""
  return iter(TFRecordReader(path, compression=compression, on_corrupt=on_corrupt))
