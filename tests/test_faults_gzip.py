"""Damaged GZIP inputs through arrayrecord-convert: where the error points, what skip keeps."""

from __future__ import annotations

import gzip
import json
import os
import zlib

import faults_testing as ft
from pipelines import convert


def records(n: int) -> list[bytes]:
  return [b"rec%04d" % i * 10 for i in range(n)]


def record_offsets(recs: list[bytes]) -> list[int]:
  """Start of each record in the decompressed stream, then its end."""
  out = [0]
  for r in recs:
    out.append(out[-1] + 12 + len(r) + 4)
  return out


def gzip_cut_at(raw: bytes, cut: int) -> tuple[bytes, int]:
  """raw as GZIP with the deflate block that starts at raw[cut:] broken; (stream, its offset).

  A full flush ends a block on a byte boundary there; the next block's first
  byte then declares block type 3, which does not exist.
  """
  co = zlib.compressobj(6, zlib.DEFLATED, 31)
  head = co.compress(raw[:cut]) + co.flush(zlib.Z_FULL_FLUSH)
  tail = co.compress(raw[cut:]) + co.flush()
  return head + b"\x07" + tail[1:], len(head)


def make_inputs(tmp_path) -> dict:
  """Three gzip shards: intact, trailer CRC broken, a block broken inside record 40 of 100."""
  inp = tmp_path / "in"
  recs = records(100)
  raw = open(ft.write_tfrecords(str(tmp_path / "raw" / "r.tfrecord"), recs), "rb").read()
  good = gzip.compress(raw)
  (inp / "good.tfrecord.gz").parent.mkdir(parents=True)
  (inp / "good.tfrecord.gz").write_bytes(good)
  trailer = bytearray(good)
  trailer[-8] ^= 0xFF  # CRC32 of the gzip trailer.
  (inp / "trailer.tfrecord.gz").write_bytes(bytes(trailer))
  mid, damage = gzip_cut_at(raw, record_offsets(recs)[40] + 20)
  (inp / "mid.tfrecord.gz").write_bytes(mid)
  return {"inp": inp, "recs": recs, "damage": damage}


def test_fail_names_the_record_the_damage_cuts(tmp_path, capsys):
  d = make_inputs(tmp_path)
  (d["inp"] / "trailer.tfrecord.gz").unlink()
  mid = d["inp"] / "mid.tfrecord.gz"
  out = tmp_path / "out"
  assert convert.main(["--input", str(d["inp"] / "*"), "--output", str(out), "--quiet"]) == 1
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert last.startswith("arrayrecord-convert: error: ") and str(mid) in last
  offset = record_offsets(d["recs"])[40]
  assert f"record 40 at byte offset (in the decompressed stream) {offset}" in last
  assert f"compressed byte offset {d['damage']}:" in last
  assert "--on-corrupt skip" in last  # It would keep records 0-39.
  assert not (out / "mid.array_record").exists()


def test_skip_keeps_the_records_before_the_damage(tmp_path, capsys, ar_read):
  d = make_inputs(tmp_path)
  recs = d["recs"]
  out = tmp_path / "out"
  assert convert.main(["--input", str(d["inp"] / "*"), "--output", str(out), "--quiet",
                       "--on-corrupt", "skip"]) == 0
  stdout = capsys.readouterr().out
  assert "failed 0" in stdout and "FAILED" not in stdout
  # Only the record the damage cut is counted; what follows it cannot be
  # counted, so the shard says its input was truncated.
  assert "Skipped 1 corrupt record(s)" in stdout
  assert ar_read(str(out / "good.array_record")) == recs
  assert ar_read(str(out / "trailer.array_record")) == recs
  assert ar_read(str(out / "mid.array_record")) == recs[:40]
  m = json.loads((out / "manifest.json").read_text())
  shards = {os.path.basename(s["input"]): s for s in m["shards"]}
  got = {n: (s["status"], s["records"], s["corrupt_records_skipped"], s["input_truncated"])
         for n, s in shards.items()}
  assert got == {"good.tfrecord.gz": ("converted", 100, 0, False),
                 "trailer.tfrecord.gz": ("converted", 100, 0, True),
                 "mid.tfrecord.gz": ("converted", 40, 1, True)}
  assert m["totals"]["corrupt_records_skipped"] == 1 and m["totals"]["failed"] == 0
