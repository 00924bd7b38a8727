"""`TFRecordIterDataset`: the records of one TFRecord file, in order (Grain's).

TensorFlow-free: a small reader over the standard framing, per record
`uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`,
little-endian. Unlike Grain's reader it checks both checksums, so a damaged
file fails at the bad record instead of yielding garbage: `CorruptTFRecordError`
(a ValueError, as Grain's reader raises for a cut record), one line naming the
file, the record's number and byte offset and what to do, worded as the
converter's `CorruptRecordError`; the state stays at that record. A missing
file raises `loader.source.MissingFileError` (a FileNotFoundError, as Grain's).
State is Grain's: `{"reader_offset": <byte offset of the next record>}`.

The converter's reader (`converter.tfrecord`) streams whole files, with
decompression and resync after damage, and has no byte position to resume
from; this one seeks, so a restore costs no re-reading.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from typing import Any, BinaryIO

import crc32c

from loader import checks
from loader import iter_dataset as iter_lib
from loader import ondisk
from loader import source as source_lib
from loader import state as state_lib

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_BUFFER_BYTES = 1 << 20
_MAX_COUNTED_RECORDS = 1 << 22  # An error after a restore counts records up to here to number the bad one.
_ADVICE = "Re-create or re-download the file."  # The converter's advice (converter.errors) when skipping.


class CorruptTFRecordError(source_lib.CorruptRecordError, ValueError):
  """A TFRecord record failed a checksum or was cut short: names the file, record, byte offset, what to do.

  A ValueError, as Grain's reader raises for a cut record, and the loader's
  `CorruptRecordError` (a RuntimeError too) that ArrayRecordSource raises for
  a damaged record. Worded as the converter's `CorruptRecordError`.

  Attributes: path, record_index (0-based number of the record in the file;
  None where it could not be counted), offset (byte offset of the record's
  header), reason; source_index is None.
  """

  def __init__(self, path: str, record_index: int | None, offset: int, reason: str, hint: str = ""):
    self.path, self.record_index, self.offset, self.reason, self.hint = path, record_index, offset, reason, hint
    self.source_index, self.detail = None, reason
    where = f"the record at byte offset {offset}" if record_index is None else (
        f"record {record_index} at byte offset {offset}")
    RuntimeError.__init__(self, f"{path}: {where} is corrupt: {reason}. {hint or _ADVICE}")

  def __reduce__(self):
    return (type(self), (self.path, self.record_index, self.offset, self.reason, self.hint))


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
  return (f"It looks {kind.upper()}-compressed: TFRecordIterDataset reads uncompressed files (as Grain's "
          "does); decompress it first, or convert it with arrayrecord-convert, which reads compressed TFRecords.")


def _open_error(path: str, error: OSError) -> OSError:
  """`error` (from opening `path`) as one line naming the file and what to do; of the same class."""
  problem = ondisk.file_problem(path) if isinstance(path, str) and ondisk.is_local(path) else None
  if isinstance(error, FileNotFoundError) or (problem is not None and problem.kind in ("missing", "broken link")):
    what, fix = (problem.what, problem.fix) if problem is not None else ("does not exist", "check the path")
    missing = source_lib.MissingFileError(f"TFRecord file not found: {path}: it {what}; {fix}.")
    missing.errno = error.errno  # Not shown (no strerror/filename): the message stays one line.
    return missing
  what, fix = ((problem.what, problem.fix) if problem is not None else
               (f"cannot be opened ({error.strerror or error})", "check its permissions and those of its folders"))
  try:
    wrapped = type(error)(error.errno, f"TFRecord file {path} {what}; {fix}.")
  except Exception:  # pylint: disable=broad-except  # An OSError subclass taking other arguments.
    return error
  return wrapped if isinstance(wrapped, type(error)) else error


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
  file is opened here, so `iter(ds)` of a missing file raises, as Grain's does.
  """

  def __init__(self, path: str):
    self._path = path
    self._reader: BinaryIO | None = None
    self._index: int | None = 0  # Number of the record at the file's position; None: not known (after a seek).
    self._file()

  def _file(self) -> BinaryIO:
    if self._reader is None:
      try:
        problem = ondisk.file_problem(self._path) if ondisk.is_local(self._path) else None
        if problem is not None and problem.kind == "special":  # A FIFO or device: open or read would block.
          raise OSError(errno.EINVAL, f"it {problem.what}")
        self._reader = open(self._path, "rb", buffering=_BUFFER_BYTES)  # pylint: disable=consider-using-with
      except OSError as e:
        raise _open_error(self._path, e) from e
    return self._reader

  def _name(self) -> str:
    return str(getattr(self, "_path", None) or getattr(self._reader, "name", None) or "the TFRecord stream")

  def _record_number(self, f: BinaryIO, offset: int) -> int | None:
    """The number of the record at `offset`: counted from the file's start where not tracked (after a seek).

    None where the records before it cannot be walked (damaged too, or
    `offset` is not where a record starts) or are too many to count.
    """
    index = getattr(self, "_index", None)  # A subclass may skip __init__ (MaxText's GCS reader does).
    if index is not None:
      return index
    try:
      f.seek(0)
      for count in range(_MAX_COUNTED_RECORDS + 1):
        pos = f.tell()
        if pos >= offset:
          return count if pos == offset else None
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
          return None
        length, length_crc = _HEADER.unpack(header)
        if _masked_crc(header[:8]) != length_crc:
          return None
        f.seek(pos + _HEADER.size + length + _FOOTER.size)
    except (OSError, ValueError, OverflowError):
      pass
    return None

  def _corrupt(self, start: int, reason: str, head: bytes = b"") -> CorruptTFRecordError:
    f = self._file()
    index = self._record_number(f, start)
    f.seek(start)  # State and a retry stay at the bad record.
    if index is not None:
      self._index = index
    hint = _compression_hint(head) if start == 0 else ""
    return CorruptTFRecordError(self._name(), index, start, reason, hint)

  def _read(self, f: BinaryIO, start: int, size: int) -> bytes:
    try:
      return f.read(size)
    except OSError as e:  # An I/O error of the disk or the network.
      f.seek(start)
      index = getattr(self, "_index", None)
      where = f"record {index}" if index is not None else "the record"
      try:
        wrapped = type(e)(e.errno, f"{self._name()}: reading {where} at byte offset {start} failed "
                          f"({e.strerror or e}); the iterator stays at this record: check the disk or "
                          "the storage, then read on (or restore the last state).")
      except Exception:  # pylint: disable=broad-except  # An OSError subclass taking other arguments.
        wrapped = None
      if not isinstance(wrapped, type(e)):
        raise
      raise wrapped from e

  def __next__(self) -> bytes:
    f = self._file()
    start = f.tell()
    header = self._read(f, start, _HEADER.size)
    if not header:
      raise StopIteration
    if len(header) < _HEADER.size:
      raise self._corrupt(start, f"the file ends inside a record header ({len(header)} of {_HEADER.size} "
                          "bytes; the file is truncated)", header)
    length, length_crc = _HEADER.unpack(header)
    if _masked_crc(header[:8]) != length_crc:
      raise self._corrupt(start, "length checksum mismatch (damaged record header)", header)
    left = _bytes_left(f) if length > _BUFFER_BYTES else None
    try:
      # A length the file cannot hold is checked first: reading it would
      # try to allocate it (a damaged header whose checksum still matches).
      body = b"" if left is not None and left < length + _FOOTER.size else self._read(f, start, length + _FOOTER.size)
    except (MemoryError, OverflowError):
      body, left = b"", _bytes_left(f)
    if len(body) < length + _FOOTER.size:
      present = min(length, len(body) if body or left is None else left)
      raise self._corrupt(start, f"the file ends inside the record (header says {length} data bytes, "
                          f"{present} present, plus a 4-byte checksum; the file is truncated)")
    data = body[:length]
    if _masked_crc(data) != _FOOTER.unpack_from(body, length)[0]:
      raise self._corrupt(start, "data checksum mismatch")
    if getattr(self, "_index", None) is not None:
      self._index += 1
    return data

  def seek(self, offset: int) -> None:
    f = self._file()
    if offset != f.tell() or getattr(self, "_index", None) is None:
      self._index = 0 if offset == 0 else None
    f.seek(offset)

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
