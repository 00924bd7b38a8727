"""Round 16 of the fault audit: a newline in a file name, many small shards on a small disk, a state file
with an absurdly long number, and a state of a shorter pipeline. Each gets one line naming what and
what to do.

Found by the 2026-12-05 fault audit; each case ran as a script before the fix and printed its error on
two lines (or cut it at the name when a worker process found it), filled the disk mid-run where the
free-space check passes, or printed Python's own advice instead of naming the file.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import faults_testing as ft
import loader


def _corrupt_last_record(path: str, records: int = 10) -> str:
  ft.write_tfrecords(path, [bytes([i]) * 100 for i in range(records)])
  with open(path, "r+b") as f:  # The last record's data checksum.
    f.seek(-1, os.SEEK_END)
    last = f.read(1)
    f.seek(-1, os.SEEK_END)
    f.write(bytes([last[0] ^ 0xFF]))
  return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_newline_in_an_input_name_keeps_the_error_on_one_line(tmp_path, workers):
  inp = tmp_path / "in"
  bad = _corrupt_last_record(str(inp / "bad\nname.tfrecord"))
  ft.write_tfrecords(str(inp / "ok.tfrecord"), [b"x" * 100] * 10)
  out = tmp_path / "out"
  p = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet",
                 "--workers", workers)
  assert p.returncode == 1, p.stderr
  # Worker processes' errors come back as traceback text read line by line: the name used to cut it there.
  shown = bad.replace("\n", "\\n")
  assert ft.one_line(p.stderr) == (
      f"arrayrecord-convert: error: {shown}: record 9 at byte offset 1044 is corrupt: data checksum "
      "mismatch. Nothing was written for this file. Re-create or re-download the file, or convert with "
      "on_corrupt='skip' (CLI: --on-corrupt skip) to keep the readable records and count the rest as skipped.")
  assert ft.temps(str(tmp_path)) == [] and "bad\nname.array_record" not in ft.published(str(out))


def test_a_newline_in_a_name_keeps_each_summary_and_verify_line_whole(tmp_path):
  inp = tmp_path / "in"
  cut = ft.write_tfrecords(str(inp / "cut\nshort.tfrecord"), [bytes([i]) * 100 for i in range(10)])
  with open(cut, "r+b") as f:
    f.truncate(500)  # Inside record 4.
  out = tmp_path / "out"
  p = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet",
                 "--on-corrupt", "skip")
  assert p.returncode == 0, p.stderr
  shown = cut.replace("\n", "\\n")
  assert (f"1 input(s) end early (truncated, or damaged to the end): their records after the damage are "
          f"lost: {shown}. Re-download them") in p.stdout.splitlines()[2]
  os.remove(out / "cut\nshort.array_record")
  v = ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out), "--on-corrupt", "skip")
  assert v.returncode == 1
  assert v.stdout.splitlines() == [
      f"FAIL {out}/cut\\nshort.array_record  records=None  output missing: rerun arrayrecord-convert with "
      "--skip-existing to convert it",
      "0/1 shard(s) match (0 records).",
  ]


def test_many_small_shards_on_a_small_disk_are_refused_before_any_work(tmp_path):
  # 40 inputs of 40 bytes each: the inputs hold 2 KB, but each output takes 128 KiB (5.2 MB in all).
  inp = tmp_path / "in"
  for i in range(40):
    ft.write_tfrecords(str(inp / f"t.tfrecord-{i:05d}-of-00040"), [b"r%d" % i] * 2)
  with ft.tmpfs(str(tmp_path / "mnt"), "2m") as mount:
    out = os.path.join(mount, "out")
    p = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", out, "--quiet")
    assert p.returncode == 2, p.stderr
    line = ft.one_line(p.stderr)
    assert line.startswith(f"arrayrecord-convert: error: Not enough free space for {out}: ")
    assert line.endswith("but the 40 output file(s) to write take at least 5.2 MB (an ArrayRecord file takes "
                         "at least 128 KiB, however few records it holds). Free space or choose another --output.")
    assert not os.path.exists(out)  # Refused before any work: no folder, no lock, no half of the shards.


def test_a_state_file_with_an_absurdly_long_number_is_named(tmp_path):
  src = tmp_path / "out"
  ft.make_dataset(str(tmp_path / "in"), 1, 20, 10)
  assert ft.run_cli("pipelines.convert", "--input", str(tmp_path / "in" / "*"), "--output", str(src),
                    "--quiet").returncode == 0

  def pipe():
    return loader.MapDataset.source(loader.ArrayRecordSource(str(src))).shuffle(seed=1).to_iter_dataset()

  it = iter(pipe())
  next(it)
  path = str(tmp_path / "state.json")
  loader.save_state(path, it)
  with open(path) as f:
    text = f.read()
  assert '"next_index": 1' in text
  with open(path, "w") as f:
    f.write(text.replace('"next_index": 1', '"next_index": ' + "9" * 5000))
  with pytest.raises(ValueError) as e:
    loader.restore_state(path, iter(pipe()))
  # Python's own message named no file and advised raising its digit limit, which cannot help.
  assert str(e.value) == (f"{path} is not a loader state file (a number in it has more than 4300 digits: "
                          "damaged or edited?); restore from another checkpoint.")


def test_a_data_loader_state_with_an_absurdly_long_number_says_what_it_is():
  dl = loader.DataLoader(data_source=list(range(10)), worker_count=0,
                         sampler=loader.samplers.IndexSampler(10, num_epochs=1, shard_options=loader.sharding.NoSharding()))
  it = iter(dl)
  next(it)
  state = it.get_state().decode()
  assert '"0": 0' in state
  with pytest.raises(ValueError) as e:
    iter(dl).set_state(state.replace('"0": 0', '"0": ' + "9" * 5000, 1).encode())
  assert str(e.value) == ("DataLoader state has a number of more than 4300 digits (damaged or edited?); pass the "
                          "bytes DataLoaderIterator.get_state() returned.")


def test_a_state_of_a_shorter_pipeline_names_this_pipelines_extra_operations(tmp_path):
  ft.make_dataset(str(tmp_path / "in"), 1, 20, 10)
  src = str(tmp_path / "out")
  assert ft.run_cli("pipelines.convert", "--input", str(tmp_path / "in" / "*"), "--output", src,
                    "--quiet").returncode == 0
  short = loader.MapDataset.source(loader.ArrayRecordSource(src)).shuffle(seed=1)
  it = iter(short.to_iter_dataset())
  next(it)
  state = it.get_state()
  del state["pipeline"][2:]  # As saved by a pipeline without the stages after the shuffle.
  longer = iter(short.batch(4).to_iter_dataset())
  with pytest.raises(loader.state.StateMismatchError) as e:
    longer.set_state(state)
  assert ": this pipeline has the extra operation(s) ['batch(4, drop_remainder=False)'" in str(e.value)
  assert "the this pipeline" not in str(e.value)


def test_an_empty_input_pattern_or_a_blank_output_is_named_not_taken_for_the_current_folder(tmp_path):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 10)
  work = tmp_path / "work"  # The current directory of the runs: nothing may appear in it.
  work.mkdir()

  def convert(*args):
    return subprocess.run([sys.executable, "-m", "pipelines.convert", *args, "--quiet"], cwd=work, env=ft.env(),
                          capture_output=True, text=True, timeout=300)

  p = convert("--input", "", "--output", str(tmp_path / "out"))
  assert p.returncode == 2
  # It read "Input <the current directory> is a directory", a folder the user never named.
  assert ft.one_line(p.stderr) == ("arrayrecord-convert: error: An input pattern is empty (''); give a file or a "
                                   "glob, e.g. --input 'data/*.tfrecord'.")
  p = convert("--input", str(inp / "*"), "--output", " ")
  assert p.returncode == 2
  # It converted into a new folder named ' ' here, and its summary said "Output:   (manifest:  /manifest.json)".
  assert ft.one_line(p.stderr) == "arrayrecord-convert: error: output_dir must be a non-empty path, got ' '."
  assert os.listdir(work) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_failed_shard_in_a_subfolder_leaves_no_empty_folder(tmp_path, workers):
  inp = tmp_path / "in"
  ft.write_tfrecords(str(inp / "a" / "x.tfrecord"), [b"a" * 100] * 5)
  bad = ft.write_tfrecords(str(inp / "b" / "y.tfrecord"), [b"b" * 100] * 5)
  with open(bad, "r+b") as f:
    f.truncate(300)  # Inside record 2.
  out = tmp_path / "out"
  os.makedirs(out / "mine")  # A user's empty folder: it stays.
  p = ft.run_cli("pipelines.convert", "--input", str(inp / "*" / "*"), "--output", str(out), "--quiet",
                 "--workers", workers)
  assert p.returncode == 1
  assert "y.tfrecord: record 2 at byte offset 232 is corrupt" in ft.one_line(p.stderr)
  # The writer made out/b for y's shard before it failed; it was left behind, empty.
  assert sorted(os.listdir(out)) == ["a", "manifest.json", "mine"]
  assert ft.temps(str(out)) == []
  ft.write_tfrecords(bad, [b"b" * 100] * 5)  # Re-downloaded: the resume fills the folder.
  p = ft.run_cli("pipelines.convert", "--input", str(inp / "*" / "*"), "--output", str(out), "--quiet",
                 "--skip-existing")
  assert p.returncode == 0, p.stderr
  assert os.listdir(out / "b") == ["y.array_record"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux) for a full disk under `> log`")
@pytest.mark.parametrize("quiet", [True, False])
def test_standard_output_on_a_full_disk_loses_only_the_report(tmp_path, quiet):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 2, 20, 100)
  out = tmp_path / "out"

  def cli(module, *args):
    with open("/dev/full", "w") as full:
      return subprocess.run([sys.executable, "-m", module, *args], cwd=ft.REPO, env=ft.env(), stdout=full,
                            stderr=subprocess.PIPE, text=True, timeout=300)

  p = cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), *(["--quiet"] if quiet else []))
  # Without --quiet the first print ("Converting ...") failed the run before any work with only
  # "OSError: [Errno 28] No space left on device", which reads as the output's disk; with it, the
  # summary's print gave a traceback after a finished run.
  assert p.returncode == 1
  assert ft.one_line(p.stderr) == (
      "arrayrecord-convert: error: could not write to standard output ([Errno 28] No space left on device), so "
      "what it printed after that is lost; the run itself went on to the end and succeeded. Its manifest.json "
      "records the result: arrayrecord-verify shows it.")
  assert sorted(ft.published(str(out))) == [ft.out_name(n) for n in sorted(os.listdir(inp))]
  assert loader.ArrayRecordSource(str(out))[0]  # A complete dataset.
  p = cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert p.returncode == 1
  assert ft.one_line(p.stderr).startswith("arrayrecord-verify: error: could not write to standard output ([Errno "
                                          "28] No space left on device), so what it printed after that is lost; "
                                          "the check itself went on to the end and succeeded. Send standard")
