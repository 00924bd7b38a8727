"""Round 20 of the fault audit (conversion): clocks that disagree with the files, a newer version's manifest,
and a --skip-existing resume in skip mode over an input damaged since its conversion.

Found by the 2026-12-05 fault audit; each case ran against the real CLI before the fix: outputs written
while the clock was an hour ahead (a VM resumed from a snapshot, NTP stepping the clock back afterwards)
made `--skip-existing` keep a shard whose input had since been re-downloaded with the same size and new
content ("kept 3 existing"; arrayrecord-verify then failed it), because a rewrite was told by comparing the
input's times with the output's; and an input dated in the future (copied with `cp -p` from a machine whose
clock was ahead) was converted again by every resume. The manifest now records the input's modification and
inode-change times as the conversion opened it, and a resume compares them with the input's times now.

Also found: a newer arrayrecord-toolkit's manifest.json (a later manifest version) counted as damaged, so
`--skip-existing` replaced it with a manifest of this run's shards only (another split's shards it listed
dropped out of the dataset, and a newer run's marker guarded nothing); and a resume with `--on-corrupt skip`
replaced a whole shard by one missing the records its input had lost since (truncated or damaged after the
conversion: the output was the only good copy, as arrayrecord-verify said, and the resume deleted it).

Checked and already handled in this round (no test added, each ran for real): an in-process run under
`ulimit -n` 8 to 24; a sparse 100 GB input of zeros (fail: named as not TFRecord at once; skip: scans it,
about 17 MB/s, and SIGTERM then exits 143 in one line leaving no folder, lock or temp); re-sharding onto a
disk that fills at the second or third shard (one line, every staged temp of the run removed); a filesystem
out of inodes at the second or third shard; an --output and an input folder whose names hold `[...]`
(converted, verified, resumed); arrayrecord-verify given a missing --output, a zero-byte or cut output, an input
cut short since, or a pattern matching nothing (each one line or a FAIL naming file, record and what to do).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

import faults_testing as ft

CONVERT = "pipelines.convert"

pytestmark = pytest.mark.timeout(300)


def _convert(inp, out, *extra) -> subprocess.CompletedProcess:
  return ft.run_cli(CONVERT, "--input", os.path.join(str(inp), "*"), "--output", str(out), "--quiet",
                    "--workers", "1", *extra, timeout=120)


def _summary(r) -> str:
  assert r.returncode == 0, r.stderr
  return r.stdout.splitlines()[0]


def _shift_times(paths, seconds: float) -> None:
  for p in paths:
    t = time.time() + seconds
    os.utime(p, (t, t))


def test_a_resume_after_the_clock_was_set_back_redoes_an_input_rewritten_since(tmp_path, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 3, 20, 500, seed=20)
  assert _summary(_convert(inp, out)).startswith("Converted 3 file(s)")
  # The outputs were written while the clock was an hour ahead; it has been set back since.
  _shift_times([out / ft.out_name(n) for n in data], 3600)
  # One input is re-downloaded: the same size, other records.
  name = sorted(data)[1]
  new = [bytes([i]) * 500 for i in range(20)]
  ft.write_tfrecords(inp / name, new)
  assert os.path.getsize(inp / name) == os.path.getsize(inp / sorted(data)[0])
  line = _summary(_convert(inp, out, "--skip-existing"))
  assert line.startswith("Converted 1 file(s), kept 2 existing"), line
  assert ar_read(str(out / ft.out_name(name))) == new
  v = ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out), timeout=120)
  assert v.returncode == 0, v.stdout + v.stderr


def test_an_input_dated_in_the_future_is_kept_by_every_resume(tmp_path, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 2, 20, 500, seed=21)
  _shift_times([inp / n for n in data], 86400)  # Copied with its times from a machine a day ahead.
  assert _summary(_convert(inp, out)).startswith("Converted 2 file(s)")
  before = {n: os.stat(out / ft.out_name(n)).st_ino for n in data}
  for _ in range(2):
    line = _summary(_convert(inp, out, "--skip-existing"))
    assert line.startswith("Converted 0 file(s), kept 2 existing"), line
  assert {n: os.stat(out / ft.out_name(n)).st_ino for n in data} == before
  shards = json.loads((out / "manifest.json").read_text())["shards"]
  assert all(isinstance(s.get("input_mtime_ns"), int) for s in shards)
  for n in data:
    assert ar_read(str(out / ft.out_name(n))) == data[n]


@pytest.mark.parametrize("flags", [("--skip-existing",), ()], ids=["skip-existing", "no-flag"])
def test_a_manifest_of_a_newer_version_is_replaced_only_with_overwrite(tmp_path, flags):
  # A newer arrayrecord-toolkit converted two splits into one folder; this one resumes with the train split only.
  src, out = tmp_path / "src", tmp_path / "out"
  data = ft.make_dataset(str(src / "train"), 2, 10, 300, seed=22)
  ft.make_dataset(str(src / "val"), 1, 10, 300, seed=23)
  r = ft.run_cli(CONVERT, "--input", str(src / "train" / "*"), str(src / "val" / "*"), "--output", str(out),
                 "--quiet", "--workers", "1", timeout=120)
  assert r.returncode == 0, r.stderr
  m = json.loads((out / "manifest.json").read_text())
  m["version"] += 1
  m["shards"][0]["field_of_the_newer_version"] = {"x": 1}
  (out / "manifest.json").write_text(json.dumps(m))
  had = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  r = _convert(src / "train", out, *flags)
  line = ft.one_line(r.stderr)
  assert r.returncode == 2, r.stderr
  assert f"{out / 'manifest.json'} was written by a newer arrayrecord-toolkit (manifest version" in line
  assert "Nothing was converted" in line and "--overwrite" in line and "Upgrade arrayrecord-toolkit" in line
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == had  # Nothing changed, nothing added.
  r = _convert(src / "train", out, "--overwrite")
  assert _summary(r).startswith(f"Converted {len(data)} file(s)")
  assert json.loads((out / "manifest.json").read_text())["version"] == m["version"] - 1


def _damage(path, how: str, record_size: int) -> int:
  """Damages a TFRecord file of `record_size`-byte records at record 5; returns that record's byte offset."""
  offset = 5 * (record_size + 16)
  if how == "truncated":
    os.truncate(path, offset + 100)
  else:  # A flipped byte in the record's data: its data checksum fails.
    with open(path, "r+b") as f:
      f.seek(offset + 12 + 7)
      b = f.read(1)
      f.seek(offset + 12 + 7)
      f.write(bytes([b[0] ^ 0xFF]))
  return offset


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_a_skip_mode_resume_never_replaces_a_whole_shard_by_one_its_input_lost_records_since(tmp_path, how,
                                                                                             ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 2, 20, 500, seed=24)
  skip = ("--on-corrupt", "skip")
  assert _summary(_convert(inp, out, *skip)).startswith("Converted 2 file(s)")
  name = sorted(data)[1]
  offset = _damage(inp / name, how, 500)
  had = {p.name: p.read_bytes() for p in out.iterdir()}
  r = _convert(inp, out, "--skip-existing", *skip)
  line = ft.one_line(r.stderr)
  assert r.returncode == 1, r.stderr
  shard = out / ft.out_name(name)
  assert f"Input {inp / name} changed since {shard} was converted from it whole" in line
  assert f"from record 5 at byte offset {offset}; {shard} was kept, not replaced" in line
  assert "Restore or re-download the input" in line
  assert {p.name: p.read_bytes() for p in out.iterdir()} == had  # Manifest put back, no temp left.
  assert ar_read(str(shard)) == data[name]
  # Deleting the output, as the line says, keeps what is still readable.
  os.remove(shard)
  assert _summary(_convert(inp, out, "--skip-existing", *skip)).startswith("Converted 1 file(s), kept 1")
  assert ar_read(str(shard)) == (data[name][:5] if how == "truncated" else data[name][:5] + data[name][6:])


def test_the_whole_shard_stays_kept_when_a_resume_that_changed_other_shards_is_resumed(tmp_path, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 3, 20, 500, seed=25)
  skip = ("--on-corrupt", "skip", "--workers", "1")
  assert _summary(_convert(inp, out, *skip)).startswith("Converted 3 file(s)")
  repaired, damaged = sorted(data)[0], sorted(data)[2]
  new = [bytes([i]) * 400 for i in range(20)]
  ft.write_tfrecords(inp / repaired, new)  # Re-downloaded: converted again.
  _damage(inp / damaged, "truncated", 500)  # Cut short since: its output is the good copy.
  for _ in range(2):  # The second resume finds the first one's marker.
    r = _convert(inp, out, "--skip-existing", *skip)
    assert r.returncode == 1 and "was kept, not replaced" in ft.one_line(r.stderr), r.stderr
    assert ar_read(str(out / ft.out_name(damaged))) == data[damaged]
  assert ar_read(str(out / ft.out_name(repaired))) == new
  assert not ft.temps(str(out))


def test_a_kept_shard_records_its_input_times_from_when_it_was_judged(tmp_path):
  # The times were those of a stat when the kept shard's manifest entry was written, late in a long
  # resume: an input re-downloaded meanwhile (same size, other records) looked unchanged to the next
  # resume, which kept the stale shard (found by review).
  from converter import manifest as manifest_lib
  from converter import planning, transforms
  from converter.options import ConvertOptions
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 2, 20, 500, seed=24)
  assert _summary(_convert(inp, out)).startswith("Converted 2 file(s)")
  inputs = sorted(str(inp / n) for n in data)
  options = ConvertOptions(output_dir=str(out), existing="skip")
  plans = planning.plan_shards(inputs, options, run_id="resume-1")
  assert [p.action for p in plans] == ["keep", "keep"]
  ft.write_tfrecords(inputs[0], [bytes([i]) * 500 for i in range(20)])  # While resume 1 converts the rest.
  results = [transforms.kept_shard_entry(p) for p in plans]
  manifest_lib.write_manifest(str(out), manifest_lib.build_manifest(
      results, writer_options=options.writer_options, output_dir=str(out)))
  again = planning.plan_shards(inputs, options, run_id="resume-2")
  assert [p.action for p in again] == ["convert", "keep"]


def test_a_shard_whose_losses_the_manifest_does_not_record_is_no_whole_shard(tmp_path, ar_read):
  # A run killed before its manifest, resumed: the kept shard's entry has no loss fields (its digest
  # was recomputed from the file). It was counted as converted whole, so after the input was copied
  # again every skip-mode resume failed: "changed since ... was converted from it whole" (it never was).
  inp, out = tmp_path / "in", tmp_path / "out"
  data = ft.make_dataset(str(inp), 1, 20, 500, seed=25)
  (name,) = data
  _damage(inp / name, "flipped", 500)
  assert _summary(_convert(inp, out, "--on-corrupt", "skip")).startswith("Converted 1 file(s)")
  (out / "manifest.json").unlink()  # As a run killed before writing it leaves the folder.
  assert _summary(_convert(inp, out, "--skip-existing", "--on-corrupt", "skip")).startswith(
      "Converted 0 file(s), kept 1 existing")
  entry = json.loads((out / "manifest.json").read_text())["shards"][0]
  assert "corrupt_records_skipped" not in entry
  data_now = (inp / name).read_bytes()
  (inp / name).unlink()
  (inp / name).write_bytes(data_now)  # Copied again: the same damaged bytes, new times.
  line = _summary(_convert(inp, out, "--skip-existing", "--on-corrupt", "skip"))
  assert line.startswith("Converted 1 file(s), kept 0 existing"), line
  assert len(ar_read(str(out / ft.out_name(name)))) == 19
