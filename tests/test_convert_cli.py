"""The convert CLI: `pipelines.convert.main([...])` end to end on DirectRunner."""

from __future__ import annotations

import json
import shutil
import os
import re
import subprocess
import sys

import pytest

from converter import RecordDigest
from pipelines import convert

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = 4


def shard_records(s: int) -> list[bytes]:
  return [b""] + [f"shard{s}-rec{i}".encode() * (1 + i % 3) for i in range(25 + s)]


@pytest.fixture
def dataset(tmp_path, tf_write):
  """SHARDS TF-written shards (one GZIP); returns (input dir, {name: records})."""
  inp = tmp_path / "in"
  recs = {}
  for s in range(SHARDS):
    name = f"ds-train.tfrecord-{s:05d}-of-{SHARDS:05d}"
    recs[name] = shard_records(s)
    tf_write(str(inp / name), recs[name], "GZIP" if s == 2 else None)
  return inp, recs


def out_name(name: str) -> str:
  return name.replace(".tfrecord", ".array_record")


def mtimes(d) -> dict[str, int]:
  return {f: os.stat(d / f).st_mtime_ns for f in sorted(os.listdir(d))}


def manifest(out) -> dict:
  return json.loads((out / "manifest.json").read_text())


def test_convert_summary_and_outputs(tmp_path, dataset, capsys, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "ds-train.tfrecord-*"), "--output", str(out)]) == 0
  stdout = capsys.readouterr().out
  total = sum(map(len, recs.values()))
  assert f"Converted {SHARDS} file(s)" in stdout
  assert f"{total:,} records" in stdout
  assert re.search(r"\([\d.]+ MB/s\)", stdout)
  assert f"Output: {out}" in stdout
  assert "DirectRunner" in stdout
  assert sorted(os.listdir(out)) == sorted([out_name(n) for n in recs] + ["manifest.json"])
  for name, r in recs.items():
    assert ar_read(str(out / out_name(name))) == r
  m = manifest(out)
  assert m["totals"]["records"] == total
  for s in m["shards"]:
    digest = RecordDigest()
    digest.update_many(recs[os.path.basename(s["input"])])
    assert s["digest"] == digest.hexdigest()


def test_multi_processing_gives_identical_results(tmp_path, dataset, monkeypatch, ar_read):
  inp, recs = dataset
  # SDK worker subprocesses must import `converter` from this checkout.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  pattern = str(inp / "*")
  a, b = tmp_path / "direct", tmp_path / "multi"
  assert convert.main(["--input", pattern, "--output", str(a), "--quiet"]) == 0
  assert convert.main(["--input", pattern, "--output", str(b), "--quiet",
                       "--direct_running_mode", "multi_processing",
                       "--direct_num_workers", "2"]) == 0
  files = sorted(f for f in os.listdir(a) if f != "manifest.json")
  assert files == sorted(f for f in os.listdir(b) if f != "manifest.json")
  assert len(files) == SHARDS
  for f in files:
    assert ar_read(str(a / f)) == ar_read(str(b / f))

  def comparable(m):
    return [(os.path.basename(s["output"]), s["records"], s["digest"], s["bytes_in"], s["status"])
            for s in m["shards"]]
  assert comparable(manifest(a)) == comparable(manifest(b))
  assert manifest(a)["totals"]["records"] == sum(map(len, recs.values()))


def test_no_matching_files(tmp_path, capsys):
  pattern = str(tmp_path / "missing" / "*.tfrecord")
  out = tmp_path / "out"
  assert convert.main(["--input", pattern, "--output", str(out)]) == 2
  err = capsys.readouterr().err
  assert "No files match" in err and pattern in err
  assert not out.exists()


def test_one_of_several_patterns_matches_nothing(tmp_path, dataset, capsys):
  inp, _ = dataset
  missing = str(inp / "nope-*")
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--input", missing, "--output", str(out)]) == 2
  assert missing in capsys.readouterr().err
  assert not out.exists()


def test_invalid_writer_options(tmp_path, dataset, capsys):
  inp, _ = dataset
  out = tmp_path / "out"
  code = convert.main(["--input", str(inp / "*"), "--output", str(out),
                       "--writer-options", "group_size:1,compresion:zstd"])
  assert code == 2
  err = capsys.readouterr().err
  assert "compresion" in err and "Valid keys" in err
  for key in ("group_size", "zstd", "uncompressed"):
    assert key in err
  assert not out.exists()


def test_bad_flag_value_is_a_usage_error(tmp_path):
  with pytest.raises(SystemExit) as e:
    convert.main(["--input", "x", "--output", str(tmp_path), "--on-corrupt", "ignore"])
  assert e.value.code == 2


def test_existing_outputs_error_overwrite_and_skip(tmp_path, dataset, capsys, ar_read, tf_write):
  inp, recs = dataset
  out = tmp_path / "out"
  args = ["--input", str(inp / "*"), "--output", str(out), "--quiet"]
  assert convert.main(args) == 0
  names = sorted(recs)
  missing = out / out_name(names[1])
  missing.unlink()
  before = mtimes(out)
  capsys.readouterr()

  # Default: refuse before any work; nothing changes, nothing new appears.
  assert convert.main(args) == 2
  err = capsys.readouterr().err
  assert "already exist" in err and "--overwrite" in err and "--skip-existing" in err
  assert mtimes(out) == before
  assert not missing.exists()

  # Skip: complete outputs are kept untouched; missing and incomplete ones redone.
  broken = out / out_name(names[3])
  broken.write_bytes(broken.read_bytes()[:100])
  before = mtimes(out)
  assert convert.main(args + ["--skip-existing"]) == 0
  after = mtimes(out)
  for name in (names[0], names[2]):
    assert after[out_name(name)] == before[out_name(name)]
  for name in names:
    assert ar_read(str(out / out_name(name))) == recs[name]
  status = {os.path.basename(s["input"]): s["status"] for s in manifest(out)["shards"]}
  assert status == {names[0]: "existing", names[1]: "converted", names[2]: "existing",
                    names[3]: "converted"}
  m = manifest(out)
  assert m["totals"]["shards"] == SHARDS
  # Kept shards carry their records and digest over from the earlier manifest.
  assert m["totals"]["records"] == sum(map(len, recs.values()))
  kept = [s for s in m["shards"] if s["status"] == "existing"]
  assert all(s["digest"].startswith("xxh3_64:") for s in kept)
  stdout = capsys.readouterr().out
  assert "kept 2 existing" in stdout
  assert ("Kept 2 shard(s) as the earlier manifest describes them (size and record count checked, records not "
          "re-read); arrayrecord-verify re-reads them.") in stdout
  # Nothing left to do: the rate counts only bytes read in this run.
  assert convert.main(args + ["--skip-existing"]) == 0
  stdout = capsys.readouterr().out
  assert "Converted 0 file(s), kept 4 existing" in stdout and "(0.0 MB/s)" in stdout
  assert mtimes(out) == {**after, "manifest.json": mtimes(out)["manifest.json"]}

  # Overwrite: new input content replaces every output.
  new = [b"replaced", b""]
  tf_write(str(inp / names[0]), new)
  assert convert.main(args + ["--overwrite"]) == 0
  assert ar_read(str(out / out_name(names[0]))) == new
  assert all(s["status"] == "converted" for s in manifest(out)["shards"])

  # --overwrite and --skip-existing together is a usage error.
  with pytest.raises(SystemExit):
    convert.main(args + ["--overwrite", "--skip-existing"])


def test_corrupt_input_fail_and_skip(tmp_path, dataset, capsys, ar_read):
  inp, recs = dataset
  name = sorted(recs)[1]
  path = inp / name
  data = bytearray(path.read_bytes())
  rec0 = 12 + 0 + 4  # The first record is empty.
  data[rec0 + 12 + 3] ^= 0x01  # Data of record 1.
  path.write_bytes(bytes(data))
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out)]) == 1
  err = capsys.readouterr().err
  last = err.strip().splitlines()[-1]
  assert last.startswith("arrayrecord-convert: error: ")
  assert str(path) in last and "record 1" in last and f"byte offset {rec0}" in last
  assert "--on-corrupt skip" in last
  assert not (out / out_name(name)).exists()
  assert not any(".tmp-" in f for f in os.listdir(out))

  out2 = tmp_path / "out2"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out2),
                       "--on-corrupt", "skip"]) == 0
  out_text = capsys.readouterr().out
  assert "Skipped 1 corrupt record(s)" in out_text and "end early" not in out_text
  assert ar_read(str(out2 / out_name(name))) == recs[name][:1] + recs[name][2:]
  assert manifest(out2)["totals"]["corrupt_records_skipped"] == 1

  # A truncated input: the summary says which, and that its tail is lost.
  path.write_bytes(bytes(data[:len(data) - 3]))
  out3 = tmp_path / "out3"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out3), "--on-corrupt", "skip", "--quiet"]) == 0
  out_text = capsys.readouterr().out
  assert f"1 input(s) end early (truncated, or damaged to the end): their records after the damage are lost: {path}." \
      in out_text and "rerun with --overwrite" in out_text


def test_unrecoverable_input_exits_nonzero(tmp_path, tf_write, capsys, ar_read):
  inp = tmp_path / "in"
  tf_write(str(inp / "good.tfrecord"), [b"g1", b"g2"])
  bad = inp / "bad.tfrecord"
  tf_write(str(bad), [b"b1", b"b2"])
  data = bytearray(bad.read_bytes())
  data[18 + 1] ^= 0xFF  # Header of the last record: nothing valid follows.
  bad.write_bytes(bytes(data))
  out = tmp_path / "out"
  code = convert.main(["--input", str(inp / "*"), "--output", str(out), "--on-corrupt", "skip"])
  assert code == 1
  stdout = capsys.readouterr().out
  assert f"FAILED {bad}" in stdout and "failed 1" in stdout
  assert not (out / "bad.array_record").exists()
  assert ar_read(str(out / "good.array_record")) == [b"g1", b"g2"]
  status = {os.path.basename(s["input"]): s["status"] for s in manifest(out)["shards"]}
  assert status == {"good.tfrecord": "converted", "bad.tfrecord": "failed"}


def test_name_collision_is_refused(tmp_path, tf_write, capsys):
  inp = tmp_path / "in"
  tf_write(str(inp / "a.tfrecord"), [b"1"])
  tf_write(str(inp / "a.tfrecord.gz"), [b"2"], "GZIP")
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out)]) == 2
  err = capsys.readouterr().err
  assert "a.tfrecord" in err and "a.tfrecord.gz" in err and "a.array_record" in err
  assert not out.exists()


def test_relative_glob_in_working_directory(tmp_path, tf_write, monkeypatch, ar_read):
  tf_write(str(tmp_path / "x.tfrecord"), [b"x"])
  tf_write(str(tmp_path / "sub" / "y.tfrecord"), [b"y"])
  monkeypatch.chdir(tmp_path)
  assert convert.main(["--input", "*.tfrecord", "--input", "sub/*.tfrecord",
                       "--output", "out", "--quiet"]) == 0
  assert ar_read(str(tmp_path / "out" / "x.array_record")) == [b"x"]
  assert ar_read(str(tmp_path / "out" / "sub" / "y.array_record")) == [b"y"]


def test_misspelled_flag_is_refused_not_dropped(tmp_path, dataset, capsys):
  # Unknown flags go to Beam, which would silently discard a typo.
  inp, _ = dataset
  out = tmp_path / "out"
  for typo in ("--on_corupt", "--on-corupt"):  # Named as typed, not as Beam spells it.
    assert convert.main(["--input", str(inp / "*"), "--output", str(out), typo, "skip"]) == 2
    err = capsys.readouterr().err
    assert f"Unknown flag(s) {typo}:" in err and "Beam pipeline option" in err
    assert not out.exists()


def test_an_unquoted_glob_the_shell_expanded_converts_every_file(tmp_path, dataset, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  files = sorted(str(inp / n) for n in recs)  # What `--input in/*` becomes in the shell.
  assert convert.main(["--input", *files, "--output", str(out), "--quiet", "--workers", "1"]) == 0
  assert sorted(os.listdir(out)) == sorted([out_name(n) for n in recs] + ["manifest.json"])
  for name, r in recs.items():
    assert ar_read(str(out / out_name(name))) == r


def test_skip_existing_never_replaces_a_file_that_is_no_array_record(tmp_path, dataset, capsys):
  inp, recs = dataset
  out = tmp_path / "out"
  out.mkdir()
  mine = out / out_name(sorted(recs)[1])
  mine.write_bytes(b"my notes")  # The user's own file under an output name.
  args = ["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1", "--skip-existing"]
  assert convert.main(args) == 2
  err = capsys.readouterr().err
  assert "are not ArrayRecord files" in err and str(mine) in err and "--overwrite" in err, err
  assert mine.read_bytes() == b"my notes" and sorted(os.listdir(out)) == [mine.name]


def test_an_output_that_is_an_input_is_refused_with_relative_paths_too(tmp_path, dataset, monkeypatch, capsys):
  inp, recs = dataset
  monkeypatch.chdir(inp.parent)
  base = ["--input", "in/*", "--output", "in", "--quiet", "--workers", "1"]
  assert convert.main(base) == 0  # in/x.tfrecord -> in/x.array_record
  before = mtimes(inp)
  capsys.readouterr()
  # Named as an input, an output would be rewritten in place.
  first = sorted(recs)[0]
  output = f"in/{out_name(first)}"
  assert convert.main(["--input", f"in/{first}", "--input", output, *base[2:], "--overwrite",
                       "--on-corrupt", "skip"]) == 2
  # The output named as an input is an ArrayRecord file: the advice is to leave it out of the inputs.
  err = capsys.readouterr().err
  assert f"The input '{inp / out_name(first)}' is an ArrayRecord file, where the output of " in err, err
  assert "leave it out of the inputs" in err and len(err.splitlines()) == 1, err
  assert mtimes(inp) == before


def test_a_glob_skips_hidden_files_and_folders_as_the_shell_does(tmp_path, dataset, ar_read):
  inp, recs = dataset
  (inp / ".DS_Store").write_bytes(b"junk")  # Not a TFRecord: converting it would fail the run.
  (inp / ".hidden").mkdir()
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1"]) == 0
  assert sorted(os.listdir(out)) == sorted([out_name(n) for n in recs] + ["manifest.json"])
  # Asked for by name (or by a pattern part starting with '.'), a hidden file is an input.
  assert convert.main(["--input", str(inp / ".DS_Store"), "--output", str(tmp_path / "o2"), "--quiet"]) == 1


@pytest.mark.parametrize("out_dir", ["in/ar", "in"])
def test_the_runs_outputs_are_not_inputs_when_the_glob_matches_them(tmp_path, dataset, monkeypatch, ar_read,
                                                                    out_dir):
  # Outputs in a folder inside the input folder, or in the input folder itself
  # (converting in place): the same glob later also lists them (and the folder).
  inp, recs = dataset
  monkeypatch.chdir(inp.parent)
  base = ["--input", "in/*", "--output", out_dir, "--quiet", "--workers", "1"]
  assert convert.main(base) == 0
  assert convert.main(base + ["--skip-existing"]) == 0
  assert convert.main(["--input", "in/**", *base[2:], "--overwrite"]) == 0
  out = inp.parent / out_dir
  manifest = json.loads((out / "manifest.json").read_text())
  assert sorted(os.path.basename(s["input"]) for s in manifest["shards"]) == sorted(recs)
  for name, r in recs.items():
    assert ar_read(str(out / out_name(name))) == r


def test_skip_existing_keeps_only_outputs_of_the_same_inputs(tmp_path, dataset, tf_write, capsys):
  inp, recs = dataset
  out = tmp_path / "out"
  base = ["--output", str(out), "--quiet", "--workers", "1", "--skip-existing"]
  assert convert.main(["--input", str(inp / "*"), *base]) == 0
  # The same inputs moved elsewhere (same names and sizes): still this conversion's outputs.
  moved = tmp_path / "moved"
  shutil.copytree(inp, moved)
  assert convert.main(["--input", str(moved / "*"), *base]) == 0
  # Another dataset whose shards have the same names: its outputs are not these.
  other = tmp_path / "other"
  for name in recs:
    tf_write(str(other / name), [b"other"])
  before = mtimes(out)
  capsys.readouterr()
  assert convert.main(["--input", str(other / "*"), *base]) == 2
  assert "were converted from other inputs, as the manifest says" in capsys.readouterr().err
  assert mtimes(out) == before


def test_skip_existing_refuses_another_splits_shards_of_the_same_names_and_sizes(tmp_path, tf_write, capsys):
  """train/ and eval/ shards with one name and size each: eval's run must not keep train's outputs as its own."""
  for split, payload in (("train", b"a"), ("eval", b"b")):
    for k in range(2):
      tf_write(str(tmp_path / split / f"data.tfrecord-{k:05d}-of-00002"), [payload * 100] * 3)
  out = tmp_path / "out"
  base = ["--output", str(out), "--quiet", "--workers", "1"]
  assert convert.main(["--input", str(tmp_path / "train" / "*"), *base]) == 0
  before = mtimes(out)
  capsys.readouterr()
  assert convert.main(["--input", str(tmp_path / "eval" / "*"), *base, "--skip-existing"]) == 2
  assert "were converted from other inputs, as the manifest says" in capsys.readouterr().err
  assert mtimes(out) == before


def test_skip_existing_refuses_to_mix_writer_options(tmp_path, dataset, capsys):
  inp, recs = dataset
  out = tmp_path / "out"
  base = ["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1"]
  assert convert.main(base) == 0
  os.remove(out / out_name(sorted(recs)[0]))
  before = mtimes(out)
  capsys.readouterr()
  assert convert.main(base + ["--skip-existing", "--writer-options", "group_size:64"]) == 2
  err = capsys.readouterr().err
  assert "were written with --writer-options 'group_size:1' (manifest.json says so), not this run's " \
         "'group_size:64'" in err and "rerun with --writer-options 'group_size:1' to resume" in err
  assert mtimes(out) == before
  assert convert.main(base + ["--skip-existing"]) == 0


def test_a_beam_option_with_a_bad_value_is_one_line(tmp_path, dataset, capsys):
  inp, _ = dataset
  argv = ["--input", str(inp / "*"), "--output", str(tmp_path / "out"), "--direct_running_mode", "bogus"]
  assert convert.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "argument --direct_running_mode: invalid choice: 'bogus'" in err, err
  assert not (tmp_path / "out").exists()


def test_a_manifest_passed_as_an_input_says_to_quote_the_pattern(tmp_path, dataset, capsys):
  """`--input ip/*` unquoted, converting in place: the shell passes manifest.json and the outputs too."""
  inp, recs = dataset
  base = ["--output", str(inp), "--quiet", "--workers", "1"]
  assert convert.main(["--input", str(inp / "*"), *base]) == 0
  capsys.readouterr()
  expanded = sorted(str(p) for p in inp.iterdir())
  assert convert.main(["--input", *expanded, *base, "--skip-existing"]) == 2
  err = capsys.readouterr().err
  assert "manifest.json is a conversion's manifest.json, not a TFRecord file" in err
  assert "quote the pattern (--input 'DIR/*')" in err


def test_a_terminal_that_cannot_show_a_name_still_gets_the_result(tmp_path):
  # With PYTHONIOENCODING=ascii, a non-ASCII --output made convert refuse ("'ascii' codec can't encode")
  # and verify crash at its result line (2026-12-05 fault audit). Names the terminal lacks print as \uXXXX.
  import faults_testing as ft  # pylint: disable=g-import-not-at-top
  inp, out = tmp_path / "données", tmp_path / "输出"
  ft.make_dataset(str(inp), 1, 5, 100)
  env = {**ft.env(), "PYTHONIOENCODING": "ascii"}
  for module, args in (("pipelines.convert", ["--workers", "1"]), ("pipelines.verify", [])):
    r = subprocess.run([sys.executable, "-m", module, "--input", str(inp / "*"), "--output", str(out), *args],
                       cwd=ft.REPO, env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode("ascii")
    text = (r.stdout + r.stderr).decode("ascii")  # Pure ASCII, as the terminal asked.
    assert "\\u8f93\\u51fa" in text and "Traceback" not in text
  assert (out / "manifest.json").exists()
