"""Damaged, missing and foreign files given to TFRecordIterDataset and ParquetIterDataset.

Each error is one line naming the file, the record (TFRecord: its number and
byte offset; Parquet: the row group, its first row and byte offset) and what
to do; it is still of the class Grain 0.2.18's readers raise there, so the
`except` clauses written for those still catch it.
"""

from __future__ import annotations

import gzip
import os
import pickle

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader import experimental
from loader import source as source_lib
from loader.iter_sources import parquet as parquet_lib
from loader.iter_sources import tfrecord as tfrecord_lib
from faults_testing import error_of, write_tfrecords as _write_tfrecord


_RECORDS = [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10]  # 26 bytes each: record i starts at byte 26 * i.


def _damage(data: bytearray, how: str) -> bytes:
  if how == "data_crc":
    data[2 * 26 + 12 + 3] ^= 0xFF  # Inside record 2's data.
  elif how == "length_crc":
    data[2 * 26 + 9] ^= 0xFF  # Record 2's length checksum.
  elif how == "cut_in_data":
    del data[2 * 26 + 12 + 5:]  # Record 2: its header and 5 of its 10 data bytes.
  elif how == "cut_in_header":
    del data[2 * 26 + 7:]  # Record 2: 7 of its 12 header bytes.
  return bytes(data)


_REASONS = {
    "data_crc": "data checksum mismatch",
    "length_crc": "length checksum mismatch (damaged record header)",
    "cut_in_data": ("the file ends inside the record (header says 10 data bytes, 5 present, plus a 4-byte "
                    "checksum; the file is truncated)"),
    "cut_in_header": "the file ends inside a record header (7 of 12 bytes; the file is truncated)",
}



@pytest.mark.parametrize("how", sorted(_REASONS))
def test_tfrecord_damage_names_file_record_offset_and_advice(tmp_path, how):
  path = str(tmp_path / f"{how}.tfrecord")
  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)
  with open(path, "wb") as f:
    f.write(_damage(bytearray(open(good, "rb").read()), how))
  it = iter(experimental.TFRecordIterDataset(path))
  assert [next(it), next(it)] == _RECORDS[:2]  # The records before the damage are read.
  try:
    next(it)
  except ValueError as e:  # What callers of Grain's reader catch (it raises ValueError for a cut record).
    error = e
  else:
    raise AssertionError("no error raised")
  message = str(error)
  assert message == (f"{path}: record 2 at byte offset 52 is corrupt: {_REASONS[how]}. "
                     "Re-create or re-download the file.")
  assert "\n" not in message
  assert isinstance(error, tfrecord_lib.CorruptTFRecordError)
  assert isinstance(error, source_lib.CorruptRecordError)  # As ArrayRecordSource reports a damaged record.
  assert (error.path, error.record_index, error.offset, error.reason) == (path, 2, 52, _REASONS[how])
  # Nothing is lost: the state stays at the bad record, and a retry says the same.
  assert it.get_state()["reader_offset"] == 52
  with pytest.raises(ValueError) as again:
    next(it)
  assert str(again.value) == message


@pytest.mark.parametrize("how", sorted(_REASONS))
def test_tfrecord_error_worded_as_the_converters(tmp_path, how):
  from converter import errors as converter_errors  # pylint: disable=g-import-not-at-top
  from converter.tfrecord import read_tfrecords  # pylint: disable=g-import-not-at-top

  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)
  path = tmp_path / "bad.tfrecord"
  path.write_bytes(_damage(bytearray(open(good, "rb").read()), how))
  ours = error_of(lambda: list(experimental.TFRecordIterDataset(str(path))))
  theirs = error_of(lambda: list(read_tfrecords(str(path))))
  assert isinstance(theirs, converter_errors.CorruptRecordError)
  assert (ours.path, ours.record_index, ours.offset, ours.reason) == (
      theirs.path, theirs.record_index, theirs.offset, theirs.reason)
  # The same "<file>: record N at byte offset O is corrupt: <reason>." and the same advice.
  head = f"{path}: record 2 at byte offset 52 is corrupt: {_REASONS[how]}."
  assert str(ours).startswith(head) and str(theirs).startswith(head)
  assert "Re-create or re-download the file" in str(ours) and "Re-create or re-download the file" in str(theirs)


def test_tfrecord_cut_record_raises_the_class_grain_raises(tmp_path):
  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)
  path = tmp_path / "cut.tfrecord"
  path.write_bytes(_damage(bytearray(open(good, "rb").read()), "cut_in_data"))
  theirs = error_of(lambda: list(grain.experimental.TFRecordIterDataset(str(path))))
  ours = error_of(lambda: list(experimental.TFRecordIterDataset(str(path))))
  assert type(theirs) is ValueError
  assert isinstance(ours, type(theirs))


def test_tfrecord_record_number_after_a_restore(tmp_path):
  # Restored from a state (an offset), the reader counts the records before
  # the bad one to number it.
  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)
  path = str(tmp_path / "bad.tfrecord")
  with open(path, "wb") as f:
    f.write(_damage(bytearray(open(good, "rb").read()), "data_crc"))
  it = iter(experimental.TFRecordIterDataset(path))
  it.set_state({"reader_offset": 52})
  with pytest.raises(ValueError, match=r"bad\.tfrecord: record 2 at byte offset 52 is corrupt: data checksum"):
    next(it)
  it.set_state({"reader_offset": 26})  # Record 1, then the bad one: numbered as it is reached.
  assert next(it) == _RECORDS[1]
  with pytest.raises(ValueError, match=r"record 2 at byte offset 52 is corrupt"):
    next(it)
  it.set_state({"reader_offset": 5})  # Not where a record starts: its number is not known.
  error = error_of(lambda: next(it))
  assert isinstance(error, ValueError)
  assert str(error).startswith(f"{path}: the record at byte offset 5 is corrupt: length checksum mismatch")
  assert error.record_index is None and it.get_state()["reader_offset"] == 5


def test_tfrecord_missing_file_is_a_file_not_found_error_naming_it(tmp_path):
  path = str(tmp_path / "nope.tfrecord")
  with pytest.raises(FileNotFoundError) as theirs:
    list(grain.experimental.TFRecordIterDataset(path))
  try:
    list(experimental.TFRecordIterDataset(path))
  except FileNotFoundError as e:  # What Grain's reader raises.
    ours = e
  else:
    raise AssertionError("no error raised")
  assert isinstance(ours, type(theirs.value))
  assert isinstance(ours, source_lib.MissingFileError)  # As ArrayRecordSource raises for a missing file.
  assert str(ours) == f"TFRecord file not found: {path}: it does not exist; check the path."
  assert isinstance(ours.__cause__, FileNotFoundError)


def test_tfrecord_directory_keeps_its_class_and_names_the_path(tmp_path):
  with pytest.raises(OSError) as theirs:
    list(grain.experimental.TFRecordIterDataset(str(tmp_path)))
  with pytest.raises(OSError) as ours:
    list(experimental.TFRecordIterDataset(str(tmp_path)))
  assert type(ours.value) is type(theirs.value)  # IsADirectoryError.
  assert f"TFRecord file {tmp_path} is a directory; give the files in it." in str(ours.value)


def test_tfrecord_compressed_file_says_to_decompress(tmp_path):
  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)
  path = tmp_path / "gz.tfrecord"
  path.write_bytes(gzip.compress(open(good, "rb").read()))
  with pytest.raises(ValueError) as e:
    next(iter(experimental.TFRecordIterDataset(str(path))))
  message = str(e.value)
  assert message.startswith(f"{path}: record 0 at byte offset 0 is corrupt: ")
  assert "It looks GZIP-compressed" in message and "decompress it first" in message
  assert "\n" not in message


def test_tfrecord_errors_survive_pickling(tmp_path):
  # What crossing from an mp_prefetch worker to the parent needs.
  error = tfrecord_lib.CorruptTFRecordError("/d/x.tfrecord", 3, 78, "data checksum mismatch")
  back = pickle.loads(pickle.dumps(error))
  assert type(back) is type(error) and str(back) == str(error)
  assert (back.path, back.record_index, back.offset, back.reason) == ("/d/x.tfrecord", 3, 78,
                                                                      "data checksum mismatch")


# Parquet.

_ROWS, _GROUP = 40, 8  # Five row groups; group g holds rows 8g to 8g + 7.


@pytest.fixture
def parquet_file(tmp_path):
  rng = np.random.default_rng(0)
  path = tmp_path / "good.parquet"
  pq.write_table(pa.table({"id": np.arange(_ROWS, dtype=np.int64),
                           "blob": [rng.bytes(64) for _ in range(_ROWS)]}), path, row_group_size=_GROUP)
  return path


def _group_offset(path, g: int) -> int:
  group = pq.ParquetFile(path).metadata.row_group(g)
  starts = []
  for c in range(group.num_columns):
    column = group.column(c)
    starts.append(column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset)
  return min(starts)


def _damaged_row_group(parquet_file, tmp_path, g: int = 2):
  """A copy whose row group `g` starts with 16 zero bytes (its first page header): (path, offset)."""
  offset = _group_offset(parquet_file, g)
  data = bytearray(parquet_file.read_bytes())
  data[offset:offset + 16] = bytes(16)
  path = tmp_path / "flip.parquet"
  path.write_bytes(bytes(data))
  return str(path), offset


def test_parquet_damaged_row_group_names_file_group_row_offset_and_advice(parquet_file, tmp_path):
  path, offset = _damaged_row_group(parquet_file, tmp_path)
  theirs = error_of(lambda: list(grain.experimental.ParquetIterDataset(path)))
  it = iter(experimental.ParquetIterDataset(path))
  rows = [int(next(it)["id"]) for _ in range(2 * _GROUP)]
  assert rows == list(range(2 * _GROUP))  # The row groups before the damage are read.
  ours = error_of(lambda: next(it))
  assert isinstance(ours, type(theirs))  # What callers of Grain's reader catch (pyarrow's class).
  assert type(ours.__cause__) is type(theirs)
  message = str(ours)
  assert message.startswith(f"{path}: row group 2 of 5 (rows 16 to 23, at byte offset {offset}) cannot be read: ")
  assert message.endswith("The file is damaged (truncated or altered): re-create or re-download it.")
  assert "\n" not in message
  assert isinstance(ours, parquet_lib.ParquetReadError)
  assert isinstance(ours, source_lib.CorruptRecordError)  # As ArrayRecordSource reports damaged data.
  assert (ours.path, ours.row_group, ours.first_row, ours.offset) == (path, 2, 16, offset)
  # Nothing is lost: the state stays at the bad row group, and a retry says the same.
  state = it.get_state()
  assert (state["row_group"], state["index_within_row_group"]) == (2, 0)
  assert str(error_of(lambda: next(it))) == message
  restored = iter(experimental.ParquetIterDataset(path))
  restored.set_state({"row_group": 2, "index_within_row_group": 3})
  assert str(error_of(lambda: next(restored))) == message


def test_parquet_damaged_row_group_is_caught_as_pyarrow_raised_it(parquet_file, tmp_path):
  path, _ = _damaged_row_group(parquet_file, tmp_path)
  cause = error_of(lambda: list(experimental.ParquetIterDataset(path))).__cause__
  caught = None
  try:
    list(experimental.ParquetIterDataset(path))
  except (OSError, pa.ArrowException) as e:  # The classes pyarrow raises for a damaged file.
    caught = e
  assert isinstance(caught, type(cause))


def _truncated(src, tmp_path):
  data = src.read_bytes()
  (tmp_path / "trunc.parquet").write_bytes(data[:len(data) // 2])
  return tmp_path / "trunc.parquet", f"({len(data) // 2:,} bytes) is not a readable Parquet file: "


def _text(src, tmp_path):
  del src
  (tmp_path / "text.parquet").write_bytes(b"hello world\n" * 100)
  return tmp_path / "text.parquet", "(1,200 bytes) is not a readable Parquet file: "


def _empty(src, tmp_path):
  del src
  (tmp_path / "empty.parquet").write_bytes(b"")
  return tmp_path / "empty.parquet", "(0 bytes) is not a readable Parquet file: "


@pytest.mark.parametrize("make", [_truncated, _text, _empty], ids=["truncated", "not_parquet", "empty"])
def test_parquet_unreadable_file_names_it_and_keeps_pyarrows_class(parquet_file, tmp_path, make):
  path, says = make(parquet_file, tmp_path)
  theirs = error_of(lambda: iter(grain.experimental.ParquetIterDataset(str(path))))
  try:
    iter(experimental.ParquetIterDataset(str(path)))
  except ValueError as e:  # pyarrow's ArrowInvalid, which Grain's reader passes through.
    ours = e
  else:
    raise AssertionError("no error raised")
  assert isinstance(theirs, pa.ArrowInvalid) and isinstance(ours, type(theirs))
  assert type(ours.__cause__) is type(theirs)
  message = str(ours)
  assert message.startswith(f"{path} {says}")
  assert message.endswith("Re-create or re-download it if it is damaged (truncated or altered), or pass only "
                          "Parquet files.")
  assert "\n" not in message
  assert isinstance(ours, parquet_lib.ParquetReadError) and ours.row_group is None


def test_parquet_missing_file_is_a_file_not_found_error_naming_it(tmp_path):
  path = str(tmp_path / "nope.parquet")
  theirs = error_of(lambda: iter(grain.experimental.ParquetIterDataset(path)))
  try:
    iter(experimental.ParquetIterDataset(path))
  except FileNotFoundError as e:
    ours = e
  else:
    raise AssertionError("no error raised")
  assert type(theirs) is FileNotFoundError and isinstance(ours, source_lib.MissingFileError)
  assert str(ours) == f"{path}: cannot open it as a Parquet file: it does not exist; check the path."
  assert ours.errno == theirs.errno


def test_parquet_bad_file_among_several_is_named(parquet_file, tmp_path):
  path, offset = _damaged_row_group(parquet_file, tmp_path, g=0)
  with pytest.raises(OSError) as e:
    list(experimental.ParquetIterDataset([str(parquet_file), path]))
  assert str(e.value).startswith(f"{path}: row group 0 of 5 (rows 0 to 7, at byte offset {offset}) cannot be read")


def test_parquet_errors_survive_pickling(parquet_file, tmp_path):
  # What crossing from an mp_prefetch worker to the parent needs.
  path, _ = _damaged_row_group(parquet_file, tmp_path)
  errors = [error_of(lambda: list(experimental.ParquetIterDataset(path))),
            error_of(lambda: iter(experimental.ParquetIterDataset(str(tmp_path / "nope.parquet")))),
            error_of(lambda: iter(experimental.ParquetIterDataset(str(_text(parquet_file, tmp_path)[0]))))]
  for error in errors:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert (back.path, back.row_group, back.first_row, back.offset) == (
        error.path, error.row_group, error.first_row, error.offset)
    if isinstance(error, OSError):
      assert back.errno == error.errno


def test_tfrecord_io_error_names_record_and_offset_and_keeps_its_class(tmp_path):
  # A disk or network error while reading (a stream set as MaxText's GCS
  # reader does): its class and errno are kept, the state stays at the record.
  import errno  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top

  good = _write_tfrecord(tmp_path / "good.tfrecord", _RECORDS)

  class Failing(io.BytesIO):
    name = "gs://bucket/flaky.tfrecord"

    def read(self, size=-1):
      if self.tell() >= 26:
        raise OSError(errno.EIO, "Input/output error")
      return super().read(size)

  it = iter(experimental.TFRecordIterDataset(good))
  it._reader._reader = Failing(open(good, "rb").read())  # pylint: disable=protected-access
  assert next(it) == _RECORDS[0]
  with pytest.raises(OSError) as e:
    next(it)
  assert e.value.errno == errno.EIO and type(e.value) is OSError
  assert (f"{good}: reading record 1 at byte offset 26 failed (Input/output error); the iterator stays at "
          "this record") in str(e.value)
  assert it.get_state()["reader_offset"] == 26


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reader", ["tfrecord", "parquet"])
def test_a_fifo_is_refused_in_one_line_instead_of_blocking(tmp_path, reader):
  fifo = tmp_path / f"pipe.{reader}"
  os.mkfifo(fifo)  # Opening it for reading would wait for a writer for ever.
  ds = (experimental.TFRecordIterDataset(str(fifo)) if reader == "tfrecord"
        else experimental.ParquetIterDataset(str(fifo)))
  with pytest.raises(OSError) as e:
    next(iter(ds))
  message = str(e.value)
  assert f"{fifo}" in message and "is a FIFO (named pipe), not a regular file" in message, message
  assert "copy the data to a regular file first" in message and "\n" not in message
