"""`TFRecordIterDataset`: the records of one TFRecord file, in order (Grain's).

TensorFlow-free: a small reader over the standard framing, per record
`uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`,
little-endian. Unlike Grain's reader it checks both checksums, so a damaged
file fails at the bad record with its offset instead of yielding garbage.
State is Grain's: `{"reader_offset": <byte offset of the next record>}`.

The converter's reader (`converter.tfrecord`) streams whole files, with
decompression and resync after damage, and has no byte position to resume
from; this one seeks, so a restore costs no re-reading.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any, BinaryIO

import crc32c

from loader import checks
from loader import iter_dataset as iter_lib
from loader import state as state_lib

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_BUFFER_BYTES = 1 << 20


def _masked_crc(data: bytes) -> int:
  crc = crc32c.crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def compressed_kind(head: bytes) -> str | None:
  """'gzip' or 'zlib' where a file's first bytes start such a stream, else None.

  The magic bytes alone also start plain files (a 376-byte record's length is
  78 01 ...): the stream must also decode, up to its first output byte. A
  stream damaged later decodes up to there and still counts.
  """
  if head[:2] == b"\x1f\x8b":
    kind, wbits = "gzip", 16 + zlib.MAX_WBITS
  elif len(head) >= 2 and head[0] & 0x0F == 8 and ((head[0] << 8) | head[1]) % 31 == 0:
    kind, wbits = "zlib", zlib.MAX_WBITS
  else:
    return None
  d = zlib.decompressobj(wbits)
  try:
    for i in range(0, min(len(head), 4096), 16):
      if d.decompress(head[i:i + 16], 1):
        return kind
  except zlib.error:
    return None
  return kind


def _compression_hint(head: bytes) -> str:
  kind = compressed_kind(head)
  if kind is None:
    return ""
  return f" It looks {kind.upper()}-compressed: TFRecordIterDataset reads uncompressed files (as Grain's does)."


def _bytes_left(f: BinaryIO) -> int | None:
  """Bytes from `f`'s position to its end, where its size is known."""
  try:
    return os.fstat(f.fileno()).st_size - f.tell()
  except (AttributeError, OSError, ValueError):  # Not a local file (a GCS stream, say).
    return None


class _TFRecordReader:
  """Reads records one by one from a binary file object, checking both checksums.

  Grain's class of the same name (MaxText subclasses it to read from GCS: it
  sets `self._reader` to any binary file object and skips `__init__`). The
  file is opened on first use.
  """

  def __init__(self, path: str):
    self._path = path
    self._reader: BinaryIO | None = None

  def _file(self) -> BinaryIO:
    if self._reader is None:
      self._reader = open(self._path, "rb", buffering=_BUFFER_BYTES)  # pylint: disable=consider-using-with
    return self._reader

  def _corrupt(self, start: int, reason: str, head: bytes = b"") -> ValueError:
    self._file().seek(start)  # State and a retry stay at the bad record.
    hint = _compression_hint(head) if start == 0 else ""
    name = getattr(self, "_path", None) or getattr(self._reader, "name", "the TFRecord stream")
    return ValueError(f"Not a valid TFRecord file: {name} at byte {start}: {reason}.{hint}")

  def __next__(self) -> bytes:
    f = self._file()
    start = f.tell()
    header = f.read(_HEADER.size)
    if not header:
      raise StopIteration
    if len(header) < _HEADER.size:
      raise self._corrupt(start, f"the file ends inside a record header ({len(header)} of {_HEADER.size} bytes)",
                          header)
    length, length_crc = _HEADER.unpack(header)
    if _masked_crc(header[:8]) != length_crc:
      raise self._corrupt(start, "the record length's checksum does not match", header)
    left = _bytes_left(f) if length > _BUFFER_BYTES else None
    try:
      # A length the file cannot hold is checked first: reading it would
      # try to allocate it (a damaged header whose checksum still matches).
      body = b"" if left is not None and left < length + _FOOTER.size else f.read(length + _FOOTER.size)
    except (MemoryError, OverflowError):
      body = b""
    if len(body) < length + _FOOTER.size:
      raise self._corrupt(start, f"the file ends inside a record of {length} bytes")
    data = body[:length]
    if _masked_crc(data) != _FOOTER.unpack_from(body, length)[0]:
      raise self._corrupt(start, f"the checksum of the {length}-byte record does not match")
    return data

  def seek(self, offset: int) -> None:
    self._file().seek(offset)

  def tell(self) -> int:
    return 0 if self._reader is None else self._reader.tell()

  def close(self) -> None:
    if getattr(self, "_reader", None) is not None:  # Also when __init__ did not run to the end.
      self._reader.close()
      self._reader = None

  __del__ = close


class TFRecordIterDataset(iter_lib.IterDataset):
  """The records (bytes) of one uncompressed TFRecord file.

  Args:
    path: Path of the file.
  """

  _same_as_grain = True

  def __init__(self, path: str | os.PathLike):
    super().__init__()
    self._path = os.fspath(path)

  def _op_repr(self) -> str:
    return f"TFRecordIterDataset({self._path!r})"

  def __repr__(self) -> str:
    return self._op_repr()

  def __iter__(self) -> iter_lib.DatasetIterator[bytes]:
    return _TFRecordDatasetIterator(self._path)


class _TFRecordDatasetIterator(iter_lib.DatasetIterator[bytes]):
  """Grain's iterator class of the same name: records of `self._reader`, state `{"reader_offset": n}`."""

  _grain_state_keys = ("reader_offset",)  # Grain's layout: its states restore here.

  def __init__(self, path: str):
    super().__init__()
    self._reader = _TFRecordReader(path)

  def __next__(self) -> bytes:
    self._assert_not_closed()
    return next(self._reader)

  def get_state(self) -> dict[str, Any]:
    return {"reader_offset": self._reader.tell()}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("reader_offset",), type(self).__name__)
    self._reader.seek(checks.check_int(state["reader_offset"], "reader_offset", minimum=0))

  def close(self) -> None:
    close = getattr(self._reader, "close", None)
    if close is not None:
      close()
    super().close()
