"""TFRecordReader against files written by TensorFlow's own TFRecordWriter."""

from __future__ import annotations

import gzip
import pickle
import zlib

import pytest

from converter import (CorruptRecordError, NoInputFilesError, OutputExistsError, TFRecordReader,
                       detect_compression, read_tfrecords)
from converter import tfrecord

TF_OPTIONS = {"none": None, "gzip": "GZIP", "zlib": "ZLIB"}
BIG = bytes(range(256)) * (5 * 1024 * 1024 // 256 + 3)  # A little over 5 MiB.


def mixed_records() -> list[bytes]:
  return [b"", b"a", BIG, b""] + [bytes([i % 251]) * (i % 37) for i in range(3000)] + [BIG[:1000]]


def small_records(n: int = 10) -> list[bytes]:
  return [f"record-{i:03d}|".encode() * (i + 1) for i in range(n)]


def offsets(records: list[bytes]) -> list[int]:
  """Start offset of each record in an uncompressed TFRecord file, then the end."""
  out = [0]
  for r in records:
    out.append(out[-1] + 12 + len(r) + 4)
  return out


def flip(path, offset: int) -> None:
  data = bytearray(path.read_bytes())
  data[offset] ^= 0xFF
  path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def mixed():
  return mixed_records()


@pytest.mark.parametrize("kind", ["none", "gzip", "zlib"])
def test_reads_what_tensorflow_wrote(tmp_path, tf_write, mixed, kind):
  # No suffix: the compression is detected from the content.
  path = tf_write(str(tmp_path / "data"), mixed, TF_OPTIONS[kind])
  reader = TFRecordReader(path)
  assert list(reader) == mixed
  assert reader.detected_compression == kind
  assert reader.stats.records == len(mixed)
  assert reader.stats.skipped == 0
  assert reader.stats.bytes_records == sum(map(len, mixed))
  with open(path, "rb") as f:
    assert detect_compression(f.read(64)) == kind


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_compression_override(tmp_path, tf_write, kind):
  recs = small_records()
  path = tf_write(str(tmp_path / "data.bin"), recs, TF_OPTIONS[kind])
  assert list(read_tfrecords(path, compression=kind)) == recs
  # Forcing 'none' on a compressed file reads it as framing and fails clearly.
  with pytest.raises(CorruptRecordError, match="data.bin"):
    list(read_tfrecords(path, compression="none"))


def test_compression_override_plain(tmp_path, tf_write):
  recs = small_records()
  path = tf_write(str(tmp_path / "data.tfrecord.gz"), recs)  # Misleading suffix.
  assert list(read_tfrecords(path)) == recs
  assert list(read_tfrecords(path, compression="none")) == recs
  with pytest.raises(CorruptRecordError):
    list(read_tfrecords(path, compression="gzip"))


def test_rejects_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="compression must be one of"):
    TFRecordReader(str(tmp_path / "x"), compression="bz2")
  with pytest.raises(ValueError, match="on_corrupt must be"):
    TFRecordReader(str(tmp_path / "x"), on_corrupt="ignore")


@pytest.mark.parametrize("compression", ["auto", "none", "gzip", "zlib"])
def test_empty_file(tmp_path, compression):
  path = tmp_path / "empty.tfrecord"
  path.write_bytes(b"")
  reader = TFRecordReader(str(path), compression=compression)
  assert list(reader) == []
  assert reader.stats.records == 0 and not reader.stats.truncated


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_compressed_file_with_no_records(tmp_path, tf_write, kind):
  path = tf_write(str(tmp_path / "empty"), [], TF_OPTIONS[kind])
  reader = TFRecordReader(path)
  assert list(reader) == []
  assert reader.detected_compression == kind


def test_detect_compression():
  assert detect_compression(b"") == "none"
  assert detect_compression(gzip.compress(b"abc")) == "gzip"
  assert detect_compression(zlib.compress(b"abc")) == "zlib"
  assert detect_compression(b"\x00" * 16) == "none"  # Not a valid header either.


@pytest.mark.parametrize("kind", ["none", "gzip"])
@pytest.mark.parametrize("chunk", [1, 7, 13, 4099])
def test_chunk_boundaries_do_not_matter(tmp_path, tf_write, monkeypatch, kind, chunk):
  recs = [b""] + small_records(30) + [b"x" * 5000]
  path = tf_write(str(tmp_path / "data"), recs, TF_OPTIONS[kind])
  monkeypatch.setattr(tfrecord, "_CHUNK", chunk)
  assert list(read_tfrecords(path)) == recs


def test_concatenated_gzip_members(tmp_path, tf_write):
  a = tf_write(str(tmp_path / "a"), [b"1", b"22"], "GZIP")
  b = tf_write(str(tmp_path / "b"), [b"333"], "GZIP")
  both = tmp_path / "both.gz"
  both.write_bytes(open(a, "rb").read() + open(b, "rb").read())
  assert list(read_tfrecords(str(both))) == [b"1", b"22", b"333"]


# --- Corrupt and truncated inputs ------------------------------------------


def test_flipped_data_byte_fail(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  off = offsets(recs)
  flip(path, off[3] + 12 + 5)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  err = e.value
  assert (err.path, err.record_index, err.offset) == (str(path), 3, off[3])
  msg = str(err)
  assert str(path) in msg and "record 3" in msg and f"byte offset {off[3]}" in msg
  assert "checksum" in msg
  assert "on_corrupt='skip'" in msg and "--on-corrupt skip" in msg  # What to do.


def test_flipped_data_byte_skip(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  flip(path, offsets(recs)[3] + 12 + 5)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:3] + recs[4:]
  assert (reader.stats.records, reader.stats.skipped) == (9, 1)


@pytest.mark.parametrize("where", [1, 9])  # In the length, in the length's checksum.
def test_damaged_header_mid_file(tmp_path, tf_write, where):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  off = offsets(recs)
  flip(path, off[4] + where)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (4, off[4])
  assert "header" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:4] + recs[5:]  # Resynced to the next valid record.
  assert reader.stats.skipped == 1


def test_damaged_first_header_resyncs(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  flip(path, 2)
  assert list(read_tfrecords(str(path), on_corrupt="skip")) == recs[1:]


def test_two_damaged_records_skip(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  off = offsets(recs)
  flip(path, off[2] + 3)        # Header.
  flip(path, off[6] + 12 + 1)   # Data.
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == [recs[i] for i in (0, 1, 3, 4, 5, 7, 8, 9)]
  assert reader.stats.skipped == 2


def test_damaged_header_with_nothing_valid_after_fails_even_in_skip(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  off = offsets(recs)
  flip(path, off[9] + 1)  # The last record's header.
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path), on_corrupt="skip"))
  assert (e.value.record_index, e.value.offset) == (9, off[9])
  assert "no valid record follows" in str(e.value)
  assert str(e.value).endswith("Nothing was written for this file. Re-create or re-download the file.")
  assert "--on-corrupt skip" not in str(e.value)  # Already skipping: no advice to skip.
  assert pickle.loads(pickle.dumps(e.value)).args == e.value.args


@pytest.mark.parametrize("cut", ["mid_data", "in_header", "in_footer"])
def test_truncated_plain_file(tmp_path, tf_write, cut):
  recs = small_records()
  path = tmp_path / "data.tfrecord"
  tf_write(str(path), recs)
  off = offsets(recs)
  end = {"mid_data": off[9] + 12 + 10, "in_header": off[9] + 5, "in_footer": off[10] - 2}[cut]
  path.write_bytes(path.read_bytes()[:end])
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (9, off[9])
  assert "truncated" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:9]
  assert reader.stats.truncated and reader.stats.skipped == 1


def test_truncated_gzip_mid_stream(tmp_path, tf_write):
  recs = [f"{i:05d}".encode() * 20 for i in range(2000)]
  path = tmp_path / "data.tfrecord.gz"
  tf_write(str(path), recs, "GZIP")
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert "truncated" in str(e.value) and "decompressed stream" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  got = list(reader)
  assert 0 < len(got) < len(recs)
  assert got == recs[:len(got)]  # Every complete record, in order.
  assert reader.stats.truncated


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_truncated_compressed_trailer(tmp_path, tf_write, kind):
  # The cut removes only the stream's end marker / checksum: every record
  # decodes, but the file is still incomplete and must not pass silently.
  recs = small_records()
  path = tmp_path / "data"
  tf_write(str(path), recs, kind)
  path.write_bytes(path.read_bytes()[:-3])
  with pytest.raises(CorruptRecordError, match="truncated"):
    list(read_tfrecords(str(path)))
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs
  assert reader.stats.truncated


def test_damaged_gzip_stream(tmp_path, tf_write):
  recs = [f"{i:05d}".encode() * 20 for i in range(2000)]
  path = tmp_path / "data.gz"
  tf_write(str(path), recs, "GZIP")
  flip(path, len(path.read_bytes()) // 2)
  for mode in ("fail", "skip"):
    with pytest.raises(CorruptRecordError) as e:
      list(read_tfrecords(str(path), on_corrupt=mode))
    assert str(path) in str(e.value)


def test_errors_survive_pickling():
  # Errors cross process boundaries (multi-process runners); fields must survive.
  errors = [CorruptRecordError("/d/x.tfrecord", 3, 96, "data checksum mismatch", compressed=True),
            OutputExistsError(["/o/a.array_record", "/o/b.array_record"]),
            NoInputFilesError("/d/*.tfrecord")]
  for e in errors:
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and str(back) == str(e) and vars(back) == vars(e)
  assert "decompressed stream" in str(errors[0])
  assert errors[1].paths == ["/o/a.array_record", "/o/b.array_record"]
