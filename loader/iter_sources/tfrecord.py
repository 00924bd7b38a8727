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


def _compression_hint(head: bytes) -> str:
  if head[:2] == b"\x1f\x8b":
    return " It looks GZIP-compressed: TFRecordIterDataset reads uncompressed files (as Grain's does)."
  if len(head) >= 2 and head[0] & 0x0F == 8 and ((head[0] << 8) | head[1]) % 31 == 0:
    return " It looks ZLIB-compressed: TFRecordIterDataset reads uncompressed files (as Grain's does)."
  return ""


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
    return _TFRecordIterator(self._path)


class _TFRecordIterator(iter_lib.DatasetIterator[bytes]):

  _grain_state_keys = ("reader_offset",)  # Grain's layout: its states restore here.

  def __init__(self, path: str):
    super().__init__()
    self._path = path
    self._file: BinaryIO | None = None  # Opened at the first read.
    self._offset = 0

  def _corrupt(self, reason: str, head: bytes = b"") -> ValueError:
    self._file.seek(self._offset)  # State and a retry stay at the bad record.
    hint = _compression_hint(head) if self._offset == 0 else ""
    return ValueError(f"Not a valid TFRecord file: {self._path} at byte {self._offset}: {reason}.{hint}")

  def __next__(self) -> bytes:
    if self._closed:
      raise ValueError("This iterator was closed; create a new one with iter(dataset).")
    if self._file is None:
      self._file = open(self._path, "rb", buffering=_BUFFER_BYTES)  # pylint: disable=consider-using-with
      self._file.seek(self._offset)
    header = self._file.read(_HEADER.size)
    if not header:
      raise StopIteration
    if len(header) < _HEADER.size:
      raise self._corrupt(f"the file ends inside a record header ({len(header)} of {_HEADER.size} bytes)", header)
    length, length_crc = _HEADER.unpack(header)
    if _masked_crc(header[:8]) != length_crc:
      raise self._corrupt("the record length's checksum does not match", header)
    body = self._file.read(length + _FOOTER.size)
    if len(body) < length + _FOOTER.size:
      raise self._corrupt(f"the file ends inside a record of {length} bytes")
    data = body[:length]
    if _masked_crc(data) != _FOOTER.unpack_from(body, length)[0]:
      raise self._corrupt(f"the checksum of the {length}-byte record does not match")
    self._offset += _HEADER.size + length + _FOOTER.size
    return data

  def get_state(self) -> dict[str, Any]:
    return {"reader_offset": self._offset}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("reader_offset",), type(self).__name__)
    self._offset = checks.check_int(state["reader_offset"], "reader_offset", minimum=0)
    if self._file is not None:
      self._file.seek(self._offset)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    super().close()
