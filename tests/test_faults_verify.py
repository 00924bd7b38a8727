"""Manifests that lie or rot: verify cross-checks them, readers name the bad file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

import faults_testing as ft
import loader
from loader import ondisk
from pipelines import convert, verify


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  root = tmp_path_factory.mktemp("vf")
  inp, out = root / "in", root / "out"
  recs = {f"v.tfrecord-{s:05d}-of-00002": [b"r%d-%d" % (s, i) for i in range(10 + s)]
          for s in range(2)}
  for name, r in recs.items():
    ft.write_tfrecords(str(inp / name), r)
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet"]) == 0
  return inp, out


@pytest.fixture
def copy(converted, tmp_path):
  inp, out = converted
  mine = tmp_path / "out"
  shutil.copytree(out, mine)
  return inp, mine


def edit_manifest(out, change) -> None:
  m = json.loads((out / "manifest.json").read_text())
  change(m)
  (out / "manifest.json").write_text(json.dumps(m))


def run_verify(inp, out) -> int:
  return verify.main(["--input", str(inp / "*"), "--output", str(out)])


def test_edited_record_count_fails(copy, capsys):
  inp, out = copy
  assert run_verify(inp, out) == 0
  edit_manifest(out, lambda m: m["shards"][1].update(records=99))
  assert run_verify(inp, out) == 1
  stdout = capsys.readouterr().out
  assert f"FAIL {out}/v.array_record-00001-of-00002" in stdout
  assert "the manifest says 99 records, the file has 11" in stdout


def test_edited_totals_fail_naming_the_manifest(copy, capsys):
  inp, out = copy
  edit_manifest(out, lambda m: m["totals"].update(records=1000))
  assert run_verify(inp, out) == 1
  stdout = capsys.readouterr().out
  assert (f"FAIL {out}/manifest.json: totals.records is 1000 but its shards add up to 21; "
          "rerun the conversion with --skip-existing to rewrite it") in stdout


@pytest.mark.parametrize("content,problem", [
    (b"{not json", "is not valid JSON"),
    (b"[1, 2]", "holds a JSON list, not a manifest object"),
    (b'{"format": "someone-else/manifest", "shards": []}', "is not an arrayrecord-toolkit manifest"),
    (b'{"shards": [{"output": "a.array_record", "records": "ten"}]}', "needs 'records'"),
])
def test_bad_manifest_is_named_in_one_line(copy, capsys, content, problem):
  inp, out = copy
  (out / "manifest.json").write_bytes(content)
  assert run_verify(inp, out) == 1
  line = ft.one_line(capsys.readouterr().err)
  assert line.startswith(f"arrayrecord-verify: error: {out}/manifest.json")
  assert problem in line
  with pytest.raises(ondisk.ManifestError, match=f"^{out}/manifest.json"):
    loader.ArrayRecordSource(str(out))


def test_garbage_manifest_does_not_block_a_resume(copy, capsys):
  inp, out = copy
  (out / "manifest.json").write_bytes(b"\x00garbage")
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet",
                       "--skip-existing"]) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["totals"]["records"] == 21 and manifest["totals"]["existing"] == 2
  assert run_verify(inp, out) == 0


def test_a_shard_left_out_of_the_manifest_fails_naming_it(copy, capsys):
  inp, out = copy

  def drop_second(m):
    gone = m["shards"].pop(1)
    for key in ("shards", "converted"):
      m["totals"][key] -= 1
    for key in ("records", "bytes_in", "bytes_out"):
      m["totals"][key] -= gone[key]
  edit_manifest(out, drop_second)
  assert len(loader.ArrayRecordSource(str(out))) == 10  # What readers see: one shard short.
  assert run_verify(inp, out) == 1
  stdout = capsys.readouterr().out
  assert (f"FAIL {out}/v.array_record-00001-of-00002  records=None  not listed in {out}/manifest.json, "
          f"so readers of the dataset leave it out (input {inp}/v.tfrecord-00001-of-00002); rerun the "
          "conversion with --skip-existing to rewrite the manifest") in stdout
  assert "1/2 shard(s) match" in stdout
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--skip-existing"]) == 0
  assert run_verify(inp, out) == 0


def test_verifying_an_on_corrupt_skip_conversion_says_to_verify_with_skip(tmp_path, capsys):
  inp, out = tmp_path / "in", tmp_path / "out"
  bad = inp / "bad.tfrecord"
  ft.write_tfrecords(str(bad), [b"rec%04d" % i * 10 for i in range(100)])
  data = bytearray(bad.read_bytes())
  data[len(data) // 2] ^= 1
  bad.write_bytes(bytes(data))
  assert convert.main(["--input", str(bad), "--output", str(out), "--quiet", "--on-corrupt", "skip"]) == 0
  capsys.readouterr()
  assert verify.main(["--input", str(bad), "--output", str(out)]) == 1
  stdout = capsys.readouterr().out
  assert f"input {bad}: record " in stdout and "Nothing was written" not in stdout
  assert ("the manifest records 1 corrupt record(s) skipped when it was converted: rerun "
          "arrayrecord-verify with --on-corrupt skip") in stdout
  assert verify.main(["--input", str(bad), "--output", str(out), "--on-corrupt", "skip"]) == 0


@pytest.mark.parametrize("sig, code, how", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "stopped by SIGTERM"),
                                            (signal.SIGHUP, 129, "stopped by SIGHUP")])
def test_a_signal_while_checking_gives_one_line(converted, capsys, monkeypatch, sig, code, how):
  inp, out = converted
  checked = verify.check_manifest

  def signalled(*args, **kwargs):  # The signal arrives while shards are being checked.
    os.kill(os.getpid(), sig)
    time.sleep(5)
    return checked(*args, **kwargs)
  monkeypatch.setattr(verify, "check_manifest", signalled)
  # As a terminal's process has them: a signal the caller ignores (under nohup, say) stays ignored.
  before = {s: signal.signal(s, h) for s, h in ((signal.SIGHUP, signal.SIG_DFL),
                                                 (signal.SIGINT, signal.default_int_handler))}
  try:
    assert run_verify(inp, out) == code
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # Handlers are put back.
  finally:
    for s, h in before.items():
      signal.signal(s, h)
  assert ft.one_line(capsys.readouterr().err) == f"arrayrecord-verify: {how}; nothing was changed, rerun to check again"


def test_a_stray_shard_in_the_output_is_named(copy, capsys):
  inp, out = copy
  shutil.copy(out / "v.array_record-00000-of-00002", out / "v.array_record-00002-of-00002")
  assert verify.main(["--input", str(inp / "*"), "--output", str(out)]) == 0  # The dataset itself matches.
  lines = capsys.readouterr().out.splitlines()
  assert lines[-2] == (f"WARN {out}/v.array_record-00002-of-00002: not in the manifest and converted from none of "
                       "the inputs; the dataset leaves it out, but a wildcard over the folder reads it: remove it if "
                       "it is not yours")
  assert lines[-1] == "2/2 shard(s) match (21 records)."
  # Outputs of inputs not checked this time are the manifest's: no warning.
  assert verify.main(["--input", str(inp / "*00000*"), "--output", str(out)]) == 0
  warned = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("WARN")]
  assert warned == [f"WARN {out}/v.array_record-00002-of-00002"]
