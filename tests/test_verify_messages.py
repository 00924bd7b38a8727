"""arrayrecord-verify's failures: one line naming the file, the first bad record, and what to run.

Each advice is also followed, to show that it repairs the dataset.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

import faults_testing as ft
from pipelines import convert, verify

WRITER = "group_size:1,uncompressed"  # Records stored verbatim: a test can find and damage one.
RECORDS = [b"rec-%02d-" % i * 8 for i in range(20)]
SMALL = [b"x%d" % i for i in range(5)]


def redo(out) -> str:
  return (f"delete {out} and rerun arrayrecord-convert with --skip-existing to convert it again "
          "(or rerun with --overwrite to convert everything again)")


def write_array_record(path: str, records) -> None:
  from array_record.python.array_record_module import ArrayRecordWriter
  w = ArrayRecordWriter(path, "group_size:1")
  for r in records:
    w.write(r)
  w.close()


def run_convert(inp, out, *flags: str) -> int:
  return convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--writer-options", WRITER,
                       *flags])


def run_verify(inp, out, pattern: str = "*") -> int:
  return verify.main(["--input", str(inp / pattern), "--output", str(out)])


def resume(capsys, inp, out) -> None:
  """Follows the advice's `arrayrecord-convert --skip-existing`; its own summary is not verify's output."""
  assert run_convert(inp, out, "--skip-existing") == 0
  capsys.readouterr()


@pytest.fixture
def dataset(tmp_path, capsys):
  """Two shards converted into the test's own folder, which it may damage and repair."""
  inp, out = tmp_path / "in", tmp_path / "out"
  ft.write_tfrecords(str(inp / "v.tfrecord-00000-of-00002"), RECORDS)
  ft.write_tfrecords(str(inp / "v.tfrecord-00001-of-00002"), SMALL)
  assert run_convert(inp, out) == 0
  assert run_verify(inp, out) == 0
  capsys.readouterr()
  return inp, out, out / "v.array_record-00000-of-00002"


def output_lines(capsys) -> list[str]:
  lines = capsys.readouterr().out.splitlines()
  assert all(re.match(r"(OK  |FAIL|WARN|NOTE) |\d+/\d+ shard\(s\) match", line) for line in lines), lines
  return lines


def problem_of(lines: list[str], out) -> str:
  """The problem on the one FAIL line of `out` (after its `records=` field)."""
  mine = [line for line in lines if line.startswith(f"FAIL {out}  ")]
  assert len(mine) == 1, lines
  return mine[0].split("  ", 2)[2]


def test_a_flipped_byte_names_the_record_and_offset_and_skip_existing_keeps_it_until_deleted(dataset, capsys):
  inp, out, target = dataset
  data = bytearray(target.read_bytes())
  flipped = data.index(b"rec-07-")
  data[flipped] ^= 1  # Same size: --skip-existing's check cannot see it.
  target.write_bytes(bytes(data))
  assert run_verify(inp, out) == 1
  lines = output_lines(capsys)
  problem = problem_of(lines, target)
  found = re.fullmatch(r"unreadable output: record 7 of 20 cannot be read, damaged at byte offset (\d+) "
                       r"\(array_record: Corrupted Riegeli/records file: chunk data hash mismatch .*; "
                       r"at byte (\d+)\): (.*)", problem)
  assert found, problem
  assert found[1] == found[2] and flipped < int(found[1]) < len(data)
  assert found[3] == redo(target)
  assert lines[-1] == "1/2 shard(s) match (5 records)."
  # --skip-existing checks size and record count only, and says so; verify still finds the damage.
  assert run_convert(inp, out, "--skip-existing") == 0
  assert "(size and record count checked, records not re-read); arrayrecord-verify re-reads them" in (
      capsys.readouterr().out)
  assert run_verify(inp, out) == 1
  assert "record 7 of 20 cannot be read" in problem_of(output_lines(capsys), target)
  # The advice repairs it.
  target.unlink()
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_a_file_cut_short_says_no_record_can_be_read(dataset, capsys):
  inp, out, target = dataset
  data = target.read_bytes()
  target.write_bytes(data[:-10])
  assert run_verify(inp, out) == 1
  problem = problem_of(output_lines(capsys), target)
  found = re.fullmatch(r"unreadable output: no record can be read \(its index is damaged or the file is cut "
                       r"short\), damaged at byte offset (\d+) \(array_record: [^\n]*; at byte (\d+); Failed to "
                       r"read RiegeliPostscript\): (.*)", problem)
  assert found, problem
  assert found[1] == found[2] and found[3] == redo(target)
  target.unlink()
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_a_file_cut_without_a_reason_still_says_what_to_do(dataset, capsys):
  inp, out, target = dataset
  target.write_bytes(target.read_bytes()[:100])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "unreadable output: no record can be read (its index is damaged or the file is cut short) (array_record: "
      f"ArrayRecord file should be at least 64KB big): {redo(target)}")


def test_content_that_differs_names_the_first_differing_record_and_the_side_that_changed(dataset, capsys):
  inp, out, target = dataset
  write_array_record(str(target), [b"other" if i == 5 else r for i, r in enumerate(RECORDS)])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "content differs (same count, different records or order); the first record that differs is record 5; "
      f"{target} no longer matches the manifest's digest either, so the output changed: {redo(target)}")
  target.unlink()
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_an_output_cut_to_fewer_records_names_where_it_ends(dataset, capsys):
  inp, out, target = dataset
  write_array_record(str(target), RECORDS[:4])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "record count differs: input 20, output 4; the first record that differs is record 4, which the output "
      f"does not have (the records before it agree); {target} no longer matches the manifest's digest either, "
      f"so the output changed: {redo(target)}")


def test_an_output_with_extra_and_other_records_names_the_first_differing_one(dataset, capsys):
  inp, out, target = dataset
  write_array_record(str(target), [*RECORDS[:3], b"other", *RECORDS[4:], b"extra"])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target).startswith(
      "record count differs: input 20, output 21; the first record that differs is record 3; ")


def test_an_input_changed_since_the_conversion_is_blamed_and_the_output_kept(dataset, capsys):
  inp, out, target = dataset
  changed = inp / "v.tfrecord-00000-of-00002"
  ft.write_tfrecords(str(changed), [b"changed" if i == 2 else r for i, r in enumerate(RECORDS)])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "content differs (same count, different records or order); the first record that differs is record 2; "
      f"{target} still matches the manifest's digest, so the input {changed} changed since it was converted: "
      f"if the input is right now, {redo(target)}; if not, keep the output, it is the good copy")


def test_a_manifest_digest_that_disagrees_with_both_files(dataset, capsys):
  inp, out, target = dataset
  m = json.loads((out / "manifest.json").read_text())
  real = m["shards"][0]["digest"]
  m["shards"][0]["digest"] = "xxh3_64:0000000000000000"
  (out / "manifest.json").write_text(json.dumps(m))
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      f"output differs from the manifest's digest (xxh3_64:0000000000000000, the file's is {real}) though it "
      f"matches its input {inp}/v.tfrecord-00000-of-00002: the manifest was edited, or input and output both "
      f"changed since; {redo(target)}")
  target.unlink()
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_a_manifest_record_count_that_disagrees_is_rewritten_by_skip_existing(dataset, capsys):
  inp, out, target = dataset
  m = json.loads((out / "manifest.json").read_text())
  m["shards"][0]["records"] = 99
  (out / "manifest.json").write_text(json.dumps(m))
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "the manifest says 99 records, the file has 20 (as many as its input): rerun arrayrecord-convert with "
      "--skip-existing to rewrite the manifest from the file")
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_a_missing_output_says_to_resume(dataset, capsys):
  inp, out, target = dataset
  target.unlink()
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "output missing: rerun arrayrecord-convert with --skip-existing to convert it")
  resume(capsys, inp, out)
  assert run_verify(inp, out) == 0


def test_check_shard_alone_advises_rerunning_the_conversion(dataset):
  # Other callers (arrayrecord-tfds --verify) name their own command; the default is neutral.
  inp, out, _ = dataset
  check = verify.check_shard(str(inp / "v.tfrecord-00000-of-00002"), str(out / "gone.array_record"), None, "auto")
  assert check.problem == "output missing: rerun the conversion with --skip-existing to convert it"


def test_no_manifest_says_what_was_checked(dataset, capsys):
  inp, out, target = dataset
  (out / "manifest.json").unlink()
  assert run_verify(inp, out) == 0
  lines = output_lines(capsys)
  assert lines[-2:] == [
      f"NOTE no manifest.json in {out}: compared each input with the output its name maps to only (no manifest "
      "counts or digests to check, no stray files to find; a reader of the folder takes every ArrayRecord file "
      "in it)",
      "2/2 shard(s) match (25 records)."]
  # The comparison with the inputs still fails a damaged output.
  write_array_record(str(target), RECORDS[:19])
  assert run_verify(inp, out) == 1
  assert problem_of(output_lines(capsys), target) == (
      "record count differs: input 20, output 19; the first record that differs is record 19, which the output "
      f"does not have (the records before it agree): {redo(target)}")


def test_shards_whose_inputs_are_gone_or_not_given_are_named_as_unchecked(dataset, capsys):
  inp, out, _ = dataset
  (inp / "v.tfrecord-00001-of-00002").unlink()
  assert run_verify(inp, out) == 0
  lines = output_lines(capsys)
  assert lines[-2:] == [
      f"NOTE 1 of 2 shard(s) in {out}/manifest.json left unchecked, as no --input matched their inputs: "
      f"{out}/v.array_record-00001-of-00002 (input {inp}/v.tfrecord-00001-of-00002, which no longer exists); "
      "give their inputs to check them",
      "1/1 shard(s) match (20 records)."]


def test_many_unchecked_shards_are_counted_past_the_first_three(tmp_path, capsys):
  inp, out = tmp_path / "in", tmp_path / "out"
  for s in range(5):
    ft.write_tfrecords(str(inp / f"t.tfrecord-{s:05d}-of-00005"), [b"%d" % s])
  assert run_convert(inp, out) == 0
  capsys.readouterr()
  assert run_verify(inp, out, "*00000*") == 0
  named = ", ".join(f"{out}/t.array_record-{s:05d}-of-00005 (input {inp}/t.tfrecord-{s:05d}-of-00005)"
                    for s in (1, 2, 3))
  assert output_lines(capsys)[-2] == (
      f"NOTE 4 of 5 shard(s) in {out}/manifest.json left unchecked, as no --input matched their inputs: "
      f"{named} and 1 more; give their inputs to check them")


def test_a_manifest_entry_outside_the_folder_is_blamed_not_the_file_it_names(dataset, tmp_path, capsys):
  # An edited manifest pointed a shard at a file of someone else's: the advice was "delete <that file>".
  inp, out, shard = dataset
  other = tmp_path / "not-ours.txt"
  other.write_bytes(b"someone else's file\n" * 10)
  manifest = json.loads((out / "manifest.json").read_text())
  manifest["shards"][0]["output"] = str(other)
  (out / "manifest.json").write_text(json.dumps(manifest))
  assert run_verify(inp, out) == 1
  problem = problem_of(output_lines(capsys), other)
  assert "delete" not in problem and "this file is left alone" in problem
  assert f"lists it outside the dataset folder {out}" in problem and "fix that entry" in problem, problem
