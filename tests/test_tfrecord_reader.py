"""TFRecordReader against files written by TensorFlow's own TFRecordWriter."""

from __future__ import annotations

import gzip
import pickle
import random
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
  # Magic bytes that do not start a stream zlib can decode: a plain file's.
  assert detect_compression(b"\x78\x01" + bytes(14)) == "none"
  assert detect_compression(b"\x1f\x8b\x07" + bytes(13)) == "none"


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_plain_file_starting_like_zlib_with_a_damaged_first_header(tmp_path, tf_write, mode):
  # A 376-byte record's length bytes start 78 01, a zlib header.
  recs = [bytes([i]) * 376 for i in range(100)]
  path = tmp_path / "r376.tfrecord"
  tf_write(str(path), recs)
  data = bytearray(path.read_bytes())
  assert data[:2] == b"\x78\x01"
  data[8] ^= 1  # The first length checksum.
  path.write_bytes(bytes(data))
  reader = TFRecordReader(str(path), on_corrupt=mode)
  if mode == "fail":
    with pytest.raises(CorruptRecordError) as e:
      list(reader)
    assert (e.value.record_index, e.value.offset) == (0, 0) and "length checksum mismatch" in str(e.value)
  else:
    assert list(reader) == recs[1:]
    assert (reader.stats.skipped, reader.stats.truncated, reader.detected_compression) == (1, False, "none")


@pytest.mark.parametrize("after", ["claim_past_the_end", "claim_inside_the_file"])
def test_a_cut_record_with_another_files_records_after_it_keeps_them(tmp_path, tf_write, after):
  # `cat a.part b.tfrecord`: a download cut inside a record, another file after
  # it. The cut record's header claims bytes that are not its own.
  big = [bytes([i]) * 100_000 for i in range(5)]
  small = [b"small-%05d" % i for i in range(50 if after == "claim_past_the_end" else 6000)]
  a = open(tf_write(str(tmp_path / "a"), big), "rb").read()
  b = open(tf_write(str(tmp_path / "b"), small), "rb").read()
  path = tmp_path / "merged.tfrecord"
  path.write_bytes(a[:3 * (100_000 + 16) + 12 + 5000] + b)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == big[:3] + small
  assert (reader.stats.skipped, reader.stats.truncated) == (1, False)
  with pytest.raises(CorruptRecordError) as e:
    list(TFRecordReader(str(path)))
  assert (e.value.record_index, e.value.offset) == (3, 3 * (100_000 + 16))


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
  assert (f"the 9 record(s) before byte offset {off[9]} are intact: to convert just those, cut the file there "
          f"(truncate -s {off[9]} FILE) and rerun. ") in str(e.value)
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
  # A flipped byte mid-stream: the records decoded before it are delivered
  # (fail names the first one that cannot be read), whatever zlib makes of it.
  recs = [f"{i:05d}".encode() * 20 for i in range(2000)]
  path = tmp_path / "data.gz"
  tf_write(str(path), recs, "GZIP")
  flip(path, len(path.read_bytes()) // 2)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  index = e.value.record_index
  assert 0 < index < len(recs) and e.value.offset == offsets(recs)[index]
  assert str(path) in str(e.value) and "--on-corrupt skip" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  got = list(reader)
  assert got[:index] == recs[:index]
  assert set(got) <= set(recs) and reader.stats.skipped + reader.stats.truncated > 0


TF_WBITS = {"gzip": 31, "zlib": 15}


def broken_block_stream(raw: bytes, cut: int, kind: str, garbage: bytes = b"") -> tuple[bytes, int]:
  """`raw` compressed as `kind`, its deflate data broken where raw[cut:] starts.

  A full flush at `cut` (after `garbage`, if any) ends a block on a byte
  boundary; the next block's first byte is replaced by one declaring block
  type 3, which does not exist, so zlib fails exactly there. Returns the
  stream and that compressed offset.
  """
  co = zlib.compressobj(6, zlib.DEFLATED, TF_WBITS[kind])
  head = co.compress(raw[:cut] + garbage) + co.flush(zlib.Z_FULL_FLUSH)
  tail = co.compress(raw[cut:]) + co.flush()
  return head + b"\x07" + tail[1:], len(head)


def tf_raw(tmp_path, tf_write, recs: list[bytes]) -> bytes:
  """The uncompressed TFRecord bytes TensorFlow's writer makes for recs."""
  return open(tf_write(str(tmp_path / "raw.tfrecord"), recs), "rb").read()


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
@pytest.mark.parametrize("inside", [False, True], ids=["at_record_boundary", "inside_record"])
def test_damaged_compressed_block(tmp_path, tf_write, kind, inside):
  recs = small_records()
  off = offsets(recs)
  raw = tf_raw(tmp_path, tf_write, recs)
  data, damage = broken_block_stream(raw, off[6] + (12 + 3 if inside else 0), kind)
  path = tmp_path / "data"
  path.write_bytes(data)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  err = e.value
  assert (err.path, err.record_index, err.offset) == (str(path), 6, off[6])
  msg = str(err)
  assert f"record 6 at byte offset (in the decompressed stream) {off[6]}" in msg
  assert f"{kind} stream is damaged" in msg and f"compressed byte offset {damage}:" in msg
  assert "--on-corrupt skip" in msg  # Skip mode does keep the records before it.
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:6]
  # As for an uncompressed file cut short: the cut record counts as skipped.
  stats = reader.stats
  assert (stats.records, stats.skipped, stats.truncated) == (6, int(inside), True)


def test_damaged_block_deep_in_a_large_stream(tmp_path, tf_write):
  # Incompressible records: the compressed file spans two 4 MiB reads and the
  # damage lies past the first one, off any 64 KiB step boundary.
  rng = random.Random(0)
  recs = [rng.randbytes(2000 + i % 7) for i in range(3000)]
  off = offsets(recs)
  data, damage = broken_block_stream(tf_raw(tmp_path, tf_write, recs), off[2500], "gzip")
  assert damage > tfrecord._CHUNK and damage % tfrecord._STEP
  path = tmp_path / "data.tfrecord.gz"
  path.write_bytes(data)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (2500, off[2500])
  assert f"compressed byte offset {damage}:" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:2500] and reader.stats.truncated


def test_damage_in_a_later_gzip_member(tmp_path, tf_write):
  # Offsets run on across concatenated members, in both streams.
  first, second = small_records(5), small_records(8)
  head = gzip.compress(tf_raw(tmp_path, tf_write, first))
  broken, damage = broken_block_stream(tf_raw(tmp_path, tf_write, second), offsets(second)[3],
                                       "gzip")
  path = tmp_path / "data.gz"
  path.write_bytes(head + broken)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (8, offsets(first)[-1] + offsets(second)[3])
  assert f"compressed byte offset {len(head) + damage}:" in str(e.value)
  assert list(read_tfrecords(str(path), on_corrupt="skip")) == first + second[:3]


# Flipped trailer byte, the field zlib checks, and the byte after which it
# reports (both from the end): gzip CRC32 and ISIZE, zlib Adler-32.
@pytest.mark.parametrize("kind,at,check,detected", [("GZIP", -8, "data", -5),
                                                    ("GZIP", -1, "length", -1),
                                                    ("ZLIB", -4, "data", -1)])
def test_damaged_compressed_trailer(tmp_path, tf_write, kind, at, check, detected):
  # Only the trailer (CRC32 / ISIZE / Adler-32) is broken: every record
  # decodes and passes its own checksums; the damage lies after the last one.
  recs = small_records()
  path = tmp_path / "data"
  tf_write(str(path), recs, kind)
  size = path.stat().st_size
  flip(path, size + at)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  err = e.value
  assert (err.record_index, err.offset) == (len(recs), offsets(recs)[-1])
  msg = str(err)
  assert "trailer does not match" in msg and f"incorrect {check} check" in msg
  assert "after the last record" in msg and f"compressed byte offset {size + detected}:" in msg
  assert "--on-corrupt skip" in msg
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs
  # No record was cut, but the input is not as written: flagged, as a stream
  # cut short between records is.
  assert (reader.stats.skipped, reader.stats.truncated) == (0, True)


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_damaged_stream_that_decoded_garbage_first(tmp_path, tf_write, kind):
  # The damage decodes to bytes that are no record header before zlib notices.
  # Uncompressed, a bad header with nothing valid after fails the file even
  # in skip mode; here the stream's damage explains it, so it is a damaged tail.
  recs = small_records()
  off = offsets(recs)
  data, _ = broken_block_stream(tf_raw(tmp_path, tf_write, recs), off[6], kind,
                                garbage=b"\xaa" * 20)
  path = tmp_path / "data"
  path.write_bytes(data)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (6, off[6]) and "header" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs[:6]
  assert (reader.stats.skipped, reader.stats.truncated) == (1, True)


def test_bytes_after_the_gzip_stream(tmp_path, tf_write):
  recs = small_records()
  path = tmp_path / "data.gz"
  tf_write(str(path), recs, "GZIP")
  size = path.stat().st_size
  path.write_bytes(path.read_bytes() + b"\0" * 16)  # Zero padding some tools add.
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(path)))
  assert (e.value.record_index, e.value.offset) == (len(recs), offsets(recs)[-1])
  assert f"ends after the last record, at compressed byte offset {size}" in str(e.value)
  assert "not gzip data" in str(e.value)
  reader = TFRecordReader(str(path), on_corrupt="skip")
  assert list(reader) == recs and reader.stats.truncated


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


def _resync_reference(data: bytes) -> tuple[list[bytes], int]:
  """The skip-mode records of a damaged uncompressed file, the slow way: all in memory, every offset tried."""
  records, skipped, pos = [], 0, 0
  crc = tfrecord.masked_crc

  def valid_header(i: int) -> bool:
    return len(data) - i >= 12 and crc(data[i:i + 8]) == tfrecord._HEADER.unpack_from(data, i)[1]

  def next_whole_record(after: int) -> int | None:
    for i in range(after + 1, len(data) - 11):
      n = tfrecord._HEADER.unpack_from(data, i)[0]
      if valid_header(i) and i + 16 + n <= len(data) and \
          crc(data[i + 12:i + 12 + n]) == tfrecord._FOOTER.unpack_from(data, i + 12 + n)[0]:
        return i
    return None

  while len(data) - pos >= 12:
    length = tfrecord._HEADER.unpack_from(data, pos)[0]
    end = pos + 16 + length
    if not valid_header(pos):  # Damaged header: the next offset holding a whole valid record.
      found = next_whole_record(pos)
      if found is None:
        return records, -1  # Nothing valid after it: the reader raises.
      skipped, pos = skipped + 1, found
      continue
    if end <= len(data) and crc(data[pos + 12:end - 4]) == tfrecord._FOOTER.unpack_from(data, end - 4)[0]:
      records.append(data[pos + 12:end - 4])
      pos = end
      continue
    # A damaged record whose length holds up (the file ends there, or a valid
    # header follows) is skipped by its length; otherwise (a cut record, the
    # length damaged too) the next whole record is searched for.
    if end <= len(data) and (end == len(data) or valid_header(end)):
      skipped, pos = skipped + 1, end
      continue
    found = next_whole_record(pos)
    if found is None:
      return records, skipped + 1  # Damaged to the end: a truncated input.
    skipped, pos = skipped + 1, found
  return records, skipped + (len(data) > pos)


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 22])
def test_resync_streams_and_finds_what_a_scan_of_the_whole_file_finds(tmp_path, monkeypatch, chunk):
  # Damage and junk (random bytes, zeros) across chunk boundaries: the streaming
  # scan keeps one chunk in memory, and must agree with the all-in-memory scan.
  monkeypatch.setattr(tfrecord, "_CHUNK", chunk)
  rng = random.Random(chunk)
  path = tmp_path / "data.tfrecord"
  for trial in range(150):
    recs = [rng.randbytes(rng.choice([0, 1, 5, 100, 3000])) for _ in range(rng.randint(1, 20))]
    data = bytearray(b"".join(frame(r) for r in recs))
    for _ in range(rng.randint(1, 3)):
      data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    if rng.random() < 0.4:
      at = rng.randrange(len(data))
      data[at:at] = rng.randbytes(rng.randint(1, 3000)) if rng.random() < 0.5 else bytes(rng.randint(1, 3000))
    path.write_bytes(bytes(data))
    want, want_skipped = _resync_reference(bytes(data))
    reader = TFRecordReader(str(path), compression="none", on_corrupt="skip")
    if want_skipped == -1:
      with pytest.raises(CorruptRecordError):
        list(reader)
      continue
    assert (list(reader), reader.stats.skipped) == (want, want_skipped), trial


def frame(record: bytes) -> bytes:
  length = len(record).to_bytes(8, "little")
  return (length + tfrecord.masked_crc(length).to_bytes(4, "little") + record
          + tfrecord.masked_crc(record).to_bytes(4, "little"))


def test_a_file_that_is_not_tfrecord_says_so(tmp_path, tf_write):
  from array_record.python.array_record_module import ArrayRecordWriter
  from converter import NotTFRecordError
  text = tmp_path / "notes.tfrecord"
  text.write_text("hello world, this is not a TFRecord file\n" * 100)
  ar = tmp_path / "done.tfrecord"
  w = ArrayRecordWriter(str(ar), "group_size:1")
  w.write(b"x")
  w.close()
  for path, what in ((text, "no valid record header in its first 4,100 bytes; it starts with b'hello world"),
                     (ar, "it is an ArrayRecord file")):
    for mode in ("fail", "skip"):
      with pytest.raises(NotTFRecordError) as e:
        list(TFRecordReader(str(path), on_corrupt=mode))
      assert str(e.value).startswith(f"{path} is not a TFRecord file: ") and "Give only TFRecord files" in str(e.value)
      if mode == "fail" or path == ar:
        assert what in str(e.value)
  # A TFRecord file whose first header is damaged is still a damaged TFRecord file.
  recs = small_records()
  damaged = tmp_path / "data.tfrecord"
  tf_write(str(damaged), recs)
  flip(damaged, 2)
  with pytest.raises(CorruptRecordError) as e:
    list(read_tfrecords(str(damaged)))
  assert not isinstance(e.value, NotTFRecordError) and (e.value.record_index, e.value.offset) == (0, 0)


def test_a_record_of_many_chunks_is_joined_once(tmp_path, monkeypatch):
  # Appending chunk by chunk copied the growing record once per 4 MiB chunk: an 800 MB record took a
  # minute (2026-12-05 fault audit). Now its chunks are gathered and joined in one step.
  import faults_testing as ft  # pylint: disable=g-import-not-at-top
  big = random.Random(0).randbytes(40 << 20)
  path = ft.write_tfrecords(tmp_path / "big.tfrecord", [b"small", big, b"after"])
  joins = []
  extend = tfrecord._extend
  monkeypatch.setattr(tfrecord, "_extend", lambda data, chunks, size: joins.append(size) or extend(data, chunks, size))
  assert list(TFRecordReader(str(path))) == [b"small", big, b"after"]
  assert max(joins) >= len(big) and len(joins) <= 4, joins
