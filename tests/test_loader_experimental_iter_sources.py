"""TFRecordIterDataset and ParquetIterDataset against Grain 0.2.18's readers."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from faults_testing import write_tfrecords as _write_tfrecord

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_RECORDS = [b"", b"x", b"\x00" * 300] + [b"record-%d-" % i * (i % 7) for i in range(40)]


@pytest.fixture(scope="module")
def tfrecord(tmp_path_factory):
  return _write_tfrecord(tmp_path_factory.mktemp("tfr") / "data.tfrecord", _RECORDS)


def test_tfrecord_matches_grain_and_the_converters_checked_reader(tfrecord):
  from converter.tfrecord import read_tfrecords  # pylint: disable=g-import-not-at-top

  ours = list(experimental.TFRecordIterDataset(tfrecord))
  assert ours == list(grain.experimental.TFRecordIterDataset(tfrecord)) == _RECORDS
  assert list(read_tfrecords(tfrecord)) == _RECORDS  # Both checksums agree with the converter's.


def test_tfrecord_restores_at_every_step_and_from_grain_states(tfrecord):
  assert_restore_at_every_step_gives_same_stream(lambda: experimental.TFRecordIterDataset(tfrecord))
  theirs = iter(grain.experimental.TFRecordIterDataset(tfrecord))
  for _ in range(9):
    next(theirs)
  ours = iter(experimental.TFRecordIterDataset(tfrecord))
  ours.set_state(theirs.get_state())
  assert list(ours) == list(theirs)


def test_tfrecord_damage_is_reported_with_its_offset(tmp_path):
  path = _write_tfrecord(tmp_path / "bad.tfrecord", [b"a" * 10, b"b" * 10, b"c" * 10])
  data = bytearray(open(path, "rb").read())
  data[26 + 12 + 3] ^= 0xFF  # Inside the second record's data.
  open(path, "wb").write(bytes(data))
  it = iter(experimental.TFRecordIterDataset(path))
  assert next(it) == b"a" * 10
  with pytest.raises(ValueError, match="bad.tfrecord: record 1 at byte offset 26 is corrupt: data checksum mismatch"):
    next(it)
  assert it.get_state()["reader_offset"] == 26  # A retry reads the bad record again.
  truncated = _write_tfrecord(tmp_path / "cut.tfrecord", [b"a" * 10, b"b" * 10])
  open(truncated, "r+b").truncate(40)
  with pytest.raises(ValueError, match="cut.tfrecord: record 1 at byte offset 26 is corrupt: the file ends inside the record"):
    list(experimental.TFRecordIterDataset(truncated))
  compressed = tmp_path / "gz.tfrecord"
  compressed.write_bytes(gzip.compress(open(path, "rb").read()))
  with pytest.raises(ValueError, match="GZIP"):
    list(experimental.TFRecordIterDataset(str(compressed)))


@pytest.mark.parametrize("claim", [1 << 39, 2**64 - 13])
def test_tfrecord_header_claiming_more_than_the_file_holds(tmp_path, claim):
  # A header whose checksum matches but whose length the file cannot hold
  # (a foreign or buggy writer): the file and offset are named, nothing is
  # allocated for it, and a retry stays at that record.
  from converter import tfrecord
  good = _write_tfrecord(tmp_path / "good.tfrecord", [b"a" * 800] * 2)
  head = claim.to_bytes(8, "little")
  path = tmp_path / "claims.tfrecord"
  path.write_bytes(open(good, "rb").read() + head + tfrecord.masked_crc(head).to_bytes(4, "little") + b"b" * 900)
  it = iter(experimental.TFRecordIterDataset(str(path)))
  assert [next(it), next(it)] == [b"a" * 800] * 2
  with pytest.raises(ValueError, match=f"claims.tfrecord: record 2 at byte offset 1632 is corrupt: the file ends inside the record "
                     f"\\(header says {claim} data bytes, 900 present"):
    next(it)
  assert it.get_state()["reader_offset"] == 1632


def test_tfrecord_plain_file_starting_like_zlib_gets_no_compression_hint(tmp_path):
  # A 376-byte record's length starts 78 01, a zlib header: a damaged length
  # checksum there is reported as such, not as a compressed file.
  path = _write_tfrecord(tmp_path / "r376.tfrecord", [b"x" * 376] * 3)
  data = bytearray(open(path, "rb").read())
  assert data[:2] == b"\x78\x01"
  data[8] ^= 1
  open(path, "wb").write(bytes(data))
  with pytest.raises(ValueError) as e:
    list(experimental.TFRecordIterDataset(path))
  assert "record 0 at byte offset 0 is corrupt: length checksum mismatch (damaged record header)." in str(e.value)
  assert "compressed" not in str(e.value)


def _write_parquet(path, start, n, row_group_size):
  table = pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                    "name": [f"row{i}" for i in range(start, start + n)],
                    "vec": [[float(i), -float(i)] for i in range(start, start + n)]})
  pq.write_table(table, path, row_group_size=row_group_size)
  return str(path)


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
  d = tmp_path_factory.mktemp("pq")
  return [_write_parquet(d / f"part{i}.parquet", 100 * i, 7 + 5 * i, 4) for i in range(3)]


def test_parquet_single_and_multi_file_match_grain(parquet_files):
  assert_streams_equal(list(experimental.ParquetIterDataset(parquet_files[1])),
                       list(grain.experimental.ParquetIterDataset(parquet_files[1])))
  ours = list(experimental.ParquetIterDataset(parquet_files))
  theirs = list(grain.experimental.ParquetIterDataset(parquet_files))
  assert_streams_equal(ours, theirs)
  assert [int(x["id"]) for x in ours][:6] == [0, 100, 200, 1, 101, 201]
  assert isinstance(ours[0]["name"], str) and ours[0]["vec"].tolist() == [0.0, -0.0]


def test_parquet_restores_at_every_step_and_from_grain_states(parquet_files):
  assert_restore_at_every_step_gives_same_stream(lambda: experimental.ParquetIterDataset(parquet_files[2]))
  assert_restore_at_every_step_gives_same_stream(lambda: experimental.ParquetIterDataset(parquet_files),
                                                 steps=range(0, 37, 3))
  theirs = iter(grain.experimental.ParquetIterDataset(parquet_files[2]))
  for _ in range(9):
    next(theirs)
  ours = iter(experimental.ParquetIterDataset(parquet_files[2]))
  ours.set_state(theirs.get_state())
  assert_streams_equal(list(ours), list(theirs))


def test_imports_stay_lazy():
  code = ("import sys, loader.experimental as ex; ex.ParquetIterDataset; ex.TFRecordIterDataset; ex.device_put; "
          "bad = [m for m in ('pyarrow', 'jax', 'tensorflow', 'apache_beam', 'grain') if m in sys.modules]; "
          "print(bad)")
  out = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stderr
