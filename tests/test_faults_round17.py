"""Round 17 of the fault audit: an output folder that turns read-only or immutable mid-run, one moved away
and made again mid-run, an input replaced by a folder mid-run, an input link pointed at another file before
a resume, a closed standard output, a quoted `~` in --output, a GOOGLE_APPLICATION_CREDENTIALS that names
no usable file, and arrayrecord-tfds advice that named a flag it does not have.

Found by the 2026-12-05 fault audit; each case ran as a script against the real CLI before the fix: a run
whose temp file could not be removed said "Its temp file was removed" (and one on a read-only mount could
have removed it, through the folder it had open); a run whose output folder was moved away left its
half-written temp file in the moved folder, said it had removed it, and deleted the empty folder the user
had made in its place; an input replaced by a folder was "replaced by another file (... 4,096 now)" with
advice to wait for its writer; --skip-existing kept a shard of the link's old target (older mtime) and gave
it the new target's size in the manifest; `>&-` made a finished conversion exit 1 with a traceback;
`--output '~/x'` made ./~/x and reported "Output: ~/x"; the Dataflow submit printed a traceback for a
folder and "no credentials found ... set GOOGLE_APPLICATION_CREDENTIALS" for a variable that was set;
arrayrecord-tfds said "choose a writable --output".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Iterator

import pytest

import faults_testing as ft
from loader import ondisk

CONVERT = "pipelines.convert"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """Four 2 MB shards: long enough to catch a run between two shards."""
  inp = tmp_path_factory.mktemp("round17") / "in"
  return inp, ft.make_dataset(str(inp), 4, 2000, 1000)


def convert_args(inp, out, *extra):
  return ["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1", *extra]


@contextlib.contextmanager
def read_only(path: str) -> Iterator[None]:
  """`path` made read-only in place (a read-only bind mount over itself), as a filesystem remounted
  read-only after an error is; open files stay open. Needs root (CAP_SYS_ADMIN), else the test is skipped."""
  try:
    bind = subprocess.run(["mount", "--bind", path, path], capture_output=True, text=True)
  except FileNotFoundError:
    pytest.skip("no `mount` command here: cannot make a folder read-only for root")
  if bind.returncode != 0:
    pytest.skip(f"`mount --bind` failed (it needs root / CAP_SYS_ADMIN; uid {os.geteuid()}): {bind.stderr.strip()}")
  try:
    ro = subprocess.run(["mount", "-o", "remount,ro,bind", path], capture_output=True, text=True)
    assert ro.returncode == 0, ro.stderr
    yield
  finally:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
      subprocess.run(["umount", "-l", path], capture_output=True)


def _stopped_mid_run(inp, out):
  """A conversion frozen (SIGSTOP) with one shard published and the next one half-written; its temp file."""
  proc = ft.start_cli(CONVERT, *convert_args(inp, out))
  ft.stop_when(lambda: ft.mid_run(str(out)), proc, what="a shard published and one half-written")
  [temp] = ft.temps(str(out))
  return proc, temp


def _shard_of(temp: str) -> str:
  return os.path.join(os.path.dirname(temp), os.path.basename(temp).split(".tmp-")[0][1:])


def test_an_output_that_turns_read_only_mid_run_leaves_no_temp(tmp_path, dataset, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  proc, temp = _stopped_mid_run(inp, out)
  with read_only(str(out)):
    proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert ft.one_line(stderr) == (
        f"arrayrecord-convert: error: Cannot write {_shard_of(temp)}: [Errno 30] Read-only file system. Its temp "
        "file was removed and no partial file was left under its name; write to a filesystem mounted read-write, "
        "then rerun with --skip-existing to keep the shards already written.")
    # It said so, but the temp file stayed: removed by its path, through the read-only mount.
    assert ft.temps(str(out)) == []
    assert os.path.basename(_shard_of(temp)) not in ft.published(str(out))
    assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
  resumed = ft.run_cli(CONVERT, *convert_args(inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  for name, records in recs.items():
    assert ar_read(str(out / ft.out_name(name))) == records


@contextlib.contextmanager
def immutable(path: str) -> Iterator[None]:
  """`chattr +i path`: nothing in the folder can be added, renamed or removed, by root either."""
  try:
    p = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
  except FileNotFoundError:
    pytest.skip("no `chattr` command here")
  if p.returncode != 0:
    pytest.skip(f"`chattr +i` failed (root on a filesystem with attributes, e.g. ext4, needed): {p.stderr.strip()}")
  try:
    yield
  finally:
    subprocess.run(["chattr", "-i", path], capture_output=True)


def test_a_temp_file_that_cannot_be_removed_is_named_not_said_to_be_gone(tmp_path, dataset, ar_read):
  inp, recs = dataset
  out = tmp_path / "out"
  proc, temp = _stopped_mid_run(inp, out)
  with immutable(str(out)):
    proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    # It said "Its temp file was removed" while the temp file was still there.
    assert ft.one_line(stderr) == (
        f"arrayrecord-convert: error: Cannot write {_shard_of(temp)}: [Errno 1] Operation not permitted. No partial "
        f"file was left under its name, but its temp file {temp} could not be removed ([Errno 1] Operation not "
        "permitted; the next run into this folder removes it); fix the output folder's permissions (or its "
        "immutable attribute: `lsattr`), then rerun with --skip-existing to keep the shards already written.")
    assert ft.temps(str(out)) == [temp]
    assert os.path.basename(_shard_of(temp)) not in ft.published(str(out))
  resumed = ft.run_cli(CONVERT, *convert_args(inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  assert ft.temps(str(out)) == []  # As the message promised.
  for name, records in recs.items():
    assert ar_read(str(out / ft.out_name(name))) == records


def test_an_output_folder_moved_away_mid_run_keeps_no_temp_and_the_new_folder_in_its_place(tmp_path, dataset):
  inp, _ = dataset
  out = tmp_path / "out"
  proc, _ = _stopped_mid_run(inp, out)
  moved = tmp_path / "out.old"
  os.rename(out, moved)  # `mv out out.old; mkdir out`, e.g. a cleanup script, while the run writes.
  out.mkdir()  # Empty, as a folder a user just made is: still the user's.
  proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1, stderr
  line = ft.one_line(stderr)
  assert "[Errno 2] No such file or directory. Its temp file was removed" in line
  assert line.endswith("put the output folder back (or convert into a new --output), then rerun with "
                       "--skip-existing to keep the shards already written.")
  # The half-written shard was removed where its folder went, not looked for under the old path.
  assert ft.temps(str(moved)) == []
  assert out.is_dir() and os.listdir(out) == []  # The folder made in its place was not the run's to remove.
  assert json.loads((moved / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE
  os.rmdir(out)
  os.rename(moved, out)  # Put back, as the message says: the resume completes it.
  resumed = ft.run_cli(CONVERT, *convert_args(inp, out, "--skip-existing"))
  assert resumed.returncode == 0, resumed.stderr
  assert ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out)).returncode == 0


def test_an_input_replaced_by_a_folder_mid_run_is_called_a_folder(tmp_path, dataset):
  # It said "was replaced by another file (2,032,000 bytes when opened, 4,096 now)" and advised waiting
  # for "whatever writes it" to finish.
  inp0, _ = dataset
  inp = tmp_path / "in"
  shutil.copytree(inp0, inp)
  out = tmp_path / "out"
  proc, temp = _stopped_mid_run(inp, out)
  victim = inp / os.path.basename(_shard_of(temp)).replace(".array_record", ".tfrecord")
  size = victim.stat().st_size
  victim.unlink()
  victim.mkdir()
  proc.send_signal(signal.SIGCONT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 1, stderr
  assert ft.one_line(stderr) == (
      f"arrayrecord-convert: error: Input {victim} was replaced by a folder (a file of {size:,} bytes when "
      "opened): it changed while it was converted, so its shard was not written; the shards already written "
      "are kept. Put the file back in its place, then rerun with --skip-existing to convert the rest.")
  assert ft.temps(str(out)) == [] and os.path.basename(_shard_of(temp)) not in ft.published(str(out))
  assert json.loads((out / "manifest.json").read_text())["status"] == ondisk.INCOMPLETE


def test_skip_existing_redoes_a_shard_whose_input_link_now_points_at_another_file(tmp_path, ar_read):
  # `in/x.tfrecord -> v1/...` converted, then pointed at v2 (made earlier, so older than the shard):
  # --skip-existing kept v1's records, and the manifest gave them v2's size.
  ft.write_tfrecords(str(tmp_path / "v1" / "x.tfrecord"), [b"old"] * 5)
  ft.write_tfrecords(str(tmp_path / "v2" / "x.tfrecord"), [b"new!"] * 7)
  inp = tmp_path / "in"
  inp.mkdir()
  (inp / "x.tfrecord").symlink_to(tmp_path / "v1" / "x.tfrecord")
  ft.write_tfrecords(str(inp / "y.tfrecord"), [b"y"] * 3)
  out = tmp_path / "out"
  assert ft.run_cli(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--quiet").returncode == 0
  (inp / "x.tfrecord").unlink()
  (inp / "x.tfrecord").symlink_to(tmp_path / "v2" / "x.tfrecord")
  (out / "y.array_record").unlink()  # Something to resume.
  p = ft.run_cli(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--quiet", "--skip-existing")
  assert p.returncode == 0, p.stderr
  assert p.stdout.startswith("Converted 2 file(s), kept 0 existing, failed 0: 10 records")
  assert ar_read(str(out / "x.array_record")) == [b"new!"] * 7
  v = ft.run_cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert v.returncode == 0, v.stdout


def test_a_closed_standard_output_loses_only_the_report(tmp_path):
  # `arrayrecord-convert ... >&-` (a daemon's or cron job's closed descriptor): it converted, then failed at the
  # summary with "error: AttributeError: 'NoneType' object has no attribute 'write'" and a traceback.
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 2, 5, 10)
  out = tmp_path / "out"

  def closed_stdout(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ft.REPO, env=ft.env(), stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))

  p = closed_stdout(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--workers", "1")
  assert (p.returncode, p.stderr) == (0, "")
  assert json.loads((out / "manifest.json").read_text())["totals"]["records"] == 10
  p = closed_stdout(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--workers", "1")
  assert p.returncode == 2
  assert ft.one_line(p.stderr).startswith("arrayrecord-convert: error: 2 output file(s) already exist: ")
  p = closed_stdout("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert (p.returncode, p.stderr) == (0, "")


def test_a_quoted_tilde_output_is_refused_not_made_a_folder_named_tilde(tmp_path):
  # `--output '~/data_ar'` converted into ./~/data_ar and reported "Output: ~/data_ar".
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 10)
  work = tmp_path / "work"
  work.mkdir()

  def convert(out):
    return subprocess.run([sys.executable, "-m", CONVERT, "--input", str(inp / "*"), "--output", out, "--quiet"],
                          cwd=work, env=ft.env(), capture_output=True, text=True, timeout=120)

  p = convert("~/data_ar")
  assert p.returncode == 2, p.stdout
  assert ft.one_line(p.stderr) == (
      "arrayrecord-convert: error: --output '~/data_ar' starts with '~', which only a shell expands (it was "
      f"quoted), so it would make a folder named '~' in the current directory. Write the path out "
      f"({os.path.expanduser('~/data_ar')}), or ./~/data_ar for a folder of that name.")
  assert os.listdir(work) == []
  p = convert("./~/data_ar")  # Asked for by name: converted there.
  assert p.returncode == 0, p.stderr
  assert json.loads((work / "~" / "data_ar" / "manifest.json").read_text())["totals"]["records"] == 5


@pytest.mark.parametrize("what", ["a folder", "a missing file", "not JSON"])
def test_a_bad_google_application_credentials_is_named_not_reported_as_no_credentials(tmp_path, what):
  # A folder gave a traceback; the others "no Google Cloud credentials found; ... or set
  # GOOGLE_APPLICATION_CREDENTIALS", which was set.
  import test_faults_dataflow_credentials as creds  # pylint: disable=import-outside-toplevel
  path = {"a folder": tmp_path / "keys", "a missing file": tmp_path / "key.json",
          "not JSON": tmp_path / "key.txt"}[what]
  if what == "a folder":
    path.mkdir()
  elif what == "not JSON":
    path.write_text("{cut short")
  env = creds.clean_env(str(tmp_path))
  env["GOOGLE_APPLICATION_CREDENTIALS"] = str(path)
  proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *creds.ARGV], cwd=ft.REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr
  why = {"a folder": "it is a folder", "a missing file": "no such file",
         "not JSON": f"File {path} is not a valid json file: Expecting property name enclosed in double quotes: "
                     "line 1 column 2 (char 1)"}[what]
  assert ft.one_line(proc.stderr) == (
      f"arrayrecord-dataflow: error: GOOGLE_APPLICATION_CREDENTIALS={path} is not a usable credentials file "
      f"({why}); point it at a service account key or user credentials JSON file, or unset it to use the "
      "credentials of `gcloud auth application-default login`")
  assert "Submitting" not in proc.stdout
  log = tmp_path / "blocked.log"
  assert not log.exists() or log.read_text() == ""  # Nothing tried the network.


def _tfds_dataset(directory) -> str:
  """A TFRecord TFDS dataset folder (dataset_info.json and one split of two shards), made by hand."""
  for s in range(2):
    ft.write_tfrecords(str(directory / f"toy-train.tfrecord-{s:05d}-of-00002"), [b"r%d" % i for i in range(5)])
  (directory / "dataset_info.json").write_text(json.dumps({
      "fileFormat": "tfrecord", "moduleName": "toy", "name": "toy", "version": "1.0.0",
      "splits": [{"filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}", "name": "train",
                  "numBytes": "90", "shardLengths": ["5", "5"]}]}))
  return str(directory)


def test_arrayrecord_tfds_names_its_own_output_flag(tmp_path):
  # The converter's messages said "--output", a flag arrayrecord-tfds does not have.
  dataset = _tfds_dataset(tmp_path / "toy" / "1.0.0")
  info = os.path.join(dataset, "dataset_info.json")
  p = ft.run_cli("pipelines.tfds_convert", "--dataset_dir", dataset, "--out_dir", info, "--quiet")
  assert p.returncode == 2, p.stderr
  assert ft.one_line(p.stderr) == (f"arrayrecord-tfds: error: --out_dir {info} is a file, not a directory; give "
                                   "a directory path (it is created if missing).")
  with read_only(dataset):  # A dataset on read-only storage, converted in place.
    p = ft.run_cli("pipelines.tfds_convert", "--dataset_dir", dataset, "--quiet")
  assert p.returncode == 2, p.stderr
  assert ft.one_line(p.stderr) == (
      f"arrayrecord-tfds: error: Cannot write to the output directory {dataset} ([Errno 30] Read-only file "
      "system); choose a writable --out_dir, or fix its permissions or mount.")
  assert sorted(os.listdir(dataset)) == ["dataset_info.json", "toy-train.tfrecord-00000-of-00002",
                                         "toy-train.tfrecord-00001-of-00002"]
  out = tmp_path / "out"  # What the message advises works.
  p = ft.run_cli("pipelines.tfds_convert", "--dataset_dir", dataset, "--out_dir", str(out), "--quiet")
  assert p.returncode == 0, p.stderr
  assert json.loads((out / "dataset_info.json").read_text())["fileFormat"] == "array_record"
