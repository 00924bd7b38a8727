"""pipelines.verify: re-reads inputs and outputs and compares counts and digests."""

from __future__ import annotations

import json
import shutil

import pytest

from pipelines import convert, verify


def write_array_record(path: str, records) -> None:
  from array_record.python.array_record_module import ArrayRecordWriter
  w = ArrayRecordWriter(path, "group_size:1")
  for r in records:
    w.write(r)
  w.close()


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tf_write_module):
  """Three TF-written shards (one in a subfolder, one GZIP) converted once."""
  root = tmp_path_factory.mktemp("verify")
  inp, out = root / "in", root / "out"
  recs = {
      "v.tfrecord-00000-of-00003": [b"a", b"", b"bb"],
      "v.tfrecord-00001-of-00003.gz": [f"r{i}".encode() for i in range(40)],
      "sub/v.tfrecord-00002-of-00003": [],
  }
  for name, r in recs.items():
    tf_write_module(str(inp / name), r, "GZIP" if name.endswith(".gz") else None)
  assert convert.main(["--input", str(inp / "*"), "--input", str(inp / "sub" / "*"),
                       "--output", str(out), "--quiet"]) == 0
  return inp, out, recs


@pytest.fixture(scope="module")
def tf_write_module():
  from conftest import write_tfrecords_tf
  return write_tfrecords_tf


@pytest.fixture
def copy(converted, tmp_path):
  """A copy of the converted outputs (a moved directory) that a test may tamper with."""
  inp, out, recs = converted
  mine = tmp_path / "out"
  shutil.copytree(out, mine)
  return inp, mine, recs


def args(inp, out):
  return ["--input", str(inp / "*"), "--input", str(inp / "sub" / "*"), "--output", str(out)]


def test_match(converted, capsys):
  inp, out, recs = converted
  assert verify.main(args(inp, out)) == 0
  stdout = capsys.readouterr().out
  assert "3/3 shard(s) match (43 records)" in stdout
  assert stdout.count("OK  ") == 3
  checks = verify.verify([str(inp / "*"), str(inp / "sub" / "*")], str(out))
  assert all(c.ok for c in checks)
  assert sorted(c.output_records for c in checks) == [0, 3, 40]
  assert all(c.input_digest == c.output_digest for c in checks)


def test_subset_of_converted_patterns(converted, capsys):
  # Only the subfolder: its common dir differs from the one used to convert.
  inp, out, _ = converted
  assert verify.main(["--input", str(inp / "sub" / "*"), "--output", str(out)]) == 0
  assert "1/1 shard(s) match (0 records)" in capsys.readouterr().out


def test_moved_output_dir_still_checks_manifest(copy, capsys):
  inp, out, _ = copy
  assert verify.main(args(inp, out)) == 0
  checks = verify.verify([str(inp / "*"), str(inp / "sub" / "*")], str(out))
  assert all(str(c.output).startswith(str(out)) for c in checks)
  m = json.loads((out / "manifest.json").read_text())
  m["shards"][0]["digest"] = "xxh3_64:0000000000000000"
  (out / "manifest.json").write_text(json.dumps(m))
  assert verify.main(args(inp, out)) == 1
  assert "manifest's digest" in capsys.readouterr().out


def test_a_copy_whose_manifest_names_absolute_outputs_checks_its_own_files(converted, copy, capsys):
  # A hand-written (or older) manifest naming the original's files by absolute
  # path: verify checks the copy's files, which are what the loader reads.
  inp, original, _ = converted
  _, out, _ = copy
  m = json.loads((out / "manifest.json").read_text())
  m["output_dir"] = str(original)
  for shard in m["shards"]:
    shard["output"] = str(original / shard["output"])
  (out / "manifest.json").write_text(json.dumps(m))
  target = out / "v.array_record-00000-of-00003"
  write_array_record(str(target), [b"x", b"y", b"z"])  # Damage the copy only.
  assert verify.main(args(inp, out)) == 1
  stdout = capsys.readouterr().out
  assert f"FAIL {target}" in stdout and "2/3 shard(s) match" in stdout


def test_tampered_output_different_records(copy, capsys):
  inp, out, _ = copy
  target = out / "v.array_record-00000-of-00003"
  write_array_record(str(target), [b"x", b"y", b"z"])  # Same count, other records.
  assert verify.main(args(inp, out)) == 1
  stdout = capsys.readouterr().out
  assert f"FAIL {target}" in stdout and "content differs" in stdout
  assert "2/3 shard(s) match" in stdout


def test_tampered_output_different_count(copy, capsys):
  inp, out, _ = copy
  target = out / "v.array_record-00001-of-00003"
  write_array_record(str(target), [b"r0"])
  assert verify.main(args(inp, out)) == 1
  assert "record count differs: input 40, output 1" in capsys.readouterr().out


def test_reordered_output(copy, capsys):
  inp, out, recs = copy
  target = out / "v.array_record-00001-of-00003"
  write_array_record(str(target), list(reversed(recs["v.tfrecord-00001-of-00003.gz"])))
  assert verify.main(args(inp, out)) == 1
  assert "content differs" in capsys.readouterr().out


def test_missing_output(copy, capsys):
  inp, out, _ = copy
  (out / "sub" / "v.array_record-00002-of-00003").unlink()
  assert verify.main(args(inp, out)) == 1
  assert "output missing" in capsys.readouterr().out


def test_unreadable_output(copy, capsys):
  inp, out, _ = copy
  (out / "v.array_record-00000-of-00003").write_bytes(b"not an array record" * 10)
  assert verify.main(args(inp, out)) == 1
  assert "unreadable" in capsys.readouterr().out


def test_input_changed_after_conversion(copy, capsys, tf_write):
  inp, out, _ = copy
  changed = inp.parent / "changed"
  tf_write(str(changed / "v.tfrecord-00000-of-00003"), [b"a", b"", b"bc"])
  assert verify.main(["--input", str(changed / "*"), "--output", str(out)]) == 1
  assert "content differs" in capsys.readouterr().out


def test_no_matching_inputs(tmp_path, capsys):
  pattern = str(tmp_path / "none-*")
  assert verify.main(["--input", pattern, "--output", str(tmp_path)]) == 2
  assert pattern in capsys.readouterr().err


def test_output_piped_to_a_reader_that_quits_ends_quietly(converted):
  # `arrayrecord-verify ... | head -0`: the pipe closes before we print.
  import subprocess
  import sys
  import faults_testing as ft
  inp, out, _ = converted
  # The console script's own entry point (`python -m pipelines.verify` bypasses it).
  proc = subprocess.Popen([sys.executable, "-c", "import sys; from pipelines import entry_points; "
                           "sys.exit(entry_points.verify())", *args(inp, out)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ft.REPO, env=ft.env())
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 141
  assert err == ""


def test_an_input_damaged_after_a_clean_conversion_is_not_blamed_on_skip_mode(copy, capsys):
  inp, out, _ = copy
  damaged = inp.parent / "damaged"
  shutil.copytree(inp, damaged)
  path = damaged / "v.tfrecord-00000-of-00003"
  data = bytearray(path.read_bytes())
  data[17 + 2] ^= 0xFF  # The second record's header.
  path.write_bytes(bytes(data))
  assert verify.main(["--input", str(damaged / "v.tfrecord-00000-of-00003"), "--output", str(out)]) == 1
  stdout = capsys.readouterr().out
  assert "the manifest records no corrupt record when it was converted, so the input changed" in stdout
  assert "probably converted with --on-corrupt skip" not in stdout


def test_an_output_directory_that_does_not_exist_is_one_line(tmp_path, converted, capsys):
  inp, _, _ = converted
  assert verify.main(["--input", str(inp / "*"), "--output", str(tmp_path / "nope")]) == 2
  assert capsys.readouterr().err.strip() == (
      f"arrayrecord-verify: error: --output {tmp_path / 'nope'} does not exist: give the directory the "
      "conversion wrote (arrayrecord-convert --output).")
