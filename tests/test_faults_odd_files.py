"""Odd files and damaged values in the way: a FIFO, a link loop, a name that is not UTF-8, an unreadable
output, a full disk, a checkpoint's edited worker count. Each gets one line saying which and what to do.

Found by the 2026-11-27 fault audit; each case ran as a script before the fix and hung, printed a
traceback, or gave a wrong reason or impossible advice.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time

import pytest

import faults_testing as ft
import loader
from converter import planning
from converter import writer as _writer
from converter.errors import OutputWriteError
from pipelines import convert, make_example_data, migration


@pytest.fixture
def one_shard(tmp_path):
  """A TFRecord folder with one small shard, converted into out/."""
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 20, 100)
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1"]) == 0
  return inp, out


def test_a_fifo_among_the_files_is_refused_instead_of_blocking_for_ever(one_shard, tmp_path):
  _, out = one_shard
  good = next(str(out / n) for n in os.listdir(out) if ".array_record" in n)
  fifo = str(tmp_path / "b.array_record")
  os.mkfifo(fifo)
  try:
    e = ft.in_time(lambda: loader.sources.ArrayRecordDataSource([good, fifo]))
  finally:
    if os.path.exists(fifo):  # Unblocks an open() still waiting on it.
      fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
      os.close(fd)
  assert isinstance(e, ValueError) and isinstance(e, RuntimeError)  # Grain raises RuntimeError for bad files.
  assert str(e) == (f"{fifo} is not an ArrayRecord file: it is a FIFO (named pipe), not a regular file (reading "
                    "it could block for ever); pass the data files themselves (copy the data to a regular file first).")


def test_a_symbolic_link_loop_is_named_as_one_by_the_loader_and_the_converter(tmp_path, capsys):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 50)
  os.symlink(inp / "y.tfrecord", inp / "x.tfrecord")
  os.symlink(inp / "x.tfrecord", inp / "y.tfrecord")
  with pytest.raises(ValueError, match="symbolic link that leads back to itself") as e:
    loader.ArrayRecordSource(str(inp / "x.tfrecord"))
  assert "not found" not in str(e.value)
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet"]) == 2
  assert ft.one_line(capsys.readouterr().err) == (
      f"arrayrecord-convert: error: Input {inp / 'x.tfrecord'} is a symbolic link that leads back to itself "
      "(a loop); fix or remove the link.")
  assert not out.exists()


def test_an_output_name_that_is_not_utf8_is_refused_before_anything_is_made(tmp_path, capsys):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 50)
  out = os.path.join(str(tmp_path), os.fsdecode(b"caf\xe9"))
  assert convert.main(["--input", str(inp / "*"), "--output", out, "--quiet"]) == 2
  line = ft.one_line(capsys.readouterr().err)
  assert line.startswith(f"arrayrecord-convert: error: --output {tmp_path}/caf\\xe9 has a name that is not valid "
                         "UTF-8 text")
  assert not os.path.lexists(out)


def test_an_unreadable_existing_output_is_named_as_unreadable_not_as_foreign(one_shard, monkeypatch, capsys):
  # Root reads any file, so the permission error is injected where the planner meets it.
  inp, out = one_shard
  monkeypatch.setattr(planning, "_complete_local_array_record", lambda path: False)

  def read_head(path, n):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

  monkeypatch.setattr(_writer, "read_head", read_head)
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--skip-existing"]) == 2
  line = ft.one_line(capsys.readouterr().err)
  assert "exists but cannot be read (Permission denied)" in line and "chmod u+r" in line
  assert "not ArrayRecord files" not in line


def test_make_example_data_ends_in_one_line_on_a_full_disk_a_file_in_the_way_or_ctrl_c(tmp_path, monkeypatch,
                                                                                        capsys):
  def argv(out):
    return ["--output", str(out), "--shards", "3", "--records-per-shard", "5"]

  # --output under a file.
  (tmp_path / "afile").write_text("x")
  assert make_example_data.main(argv(tmp_path / "afile" / "data")) == 1
  assert "(Not a directory); check --output" in ft.one_line(capsys.readouterr().err)

  # A full disk while the second shard is written, then a Ctrl-C there.
  real = make_example_data.tfrecord_frame
  for fault, code, says in [(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 1, "free space there"),
                            (KeyboardInterrupt(), 130, "interrupted")]:
    out = tmp_path / f"data{code}"
    calls = []

    def frame(record, fault=fault, calls=calls):
      calls.append(1)
      if len(calls) > 7:
        raise fault
      return real(record)

    monkeypatch.setattr(make_example_data, "tfrecord_frame", frame)
    assert make_example_data.main(argv(out)) == code
    assert says in ft.one_line(capsys.readouterr().err)
    assert sorted(os.listdir(out)) == ["example-train.tfrecord-00000-of-00003"]  # Complete; no temp file.


def test_resharding_on_a_full_disk_says_to_run_it_again_not_to_skip(tmp_path, monkeypatch):
  # Re-sharding has no --skip-existing: its advice must be one that works.
  def fail(writer, records):
    raise OutputWriteError(str(tmp_path / "ds-00000-of-00002.arrayrecord"), f"[Errno {errno.ENOSPC}] No space left")

  monkeypatch.setattr(migration, "_write_all", fail)
  fn = migration._WriteShardFn(str(tmp_path / "ds"), 2, "arrayrecord", "group_size:1", False)  # pylint: disable=protected-access
  with pytest.raises(OutputWriteError) as e:
    list(fn.process((0, [b"x"])))
  assert "--skip-existing" not in str(e.value)
  assert str(e.value).endswith("free space on the output's disk, then run the re-sharding again (it writes every "
                               "shard anew; pass existing='overwrite' if some were published).")


def test_a_checkpoint_whose_worker_count_was_damaged_is_refused_at_once(tmp_path):
  def dl_iter():
    dl = loader.DataLoader(
        data_source=loader.MapDataset.range(100),
        sampler=loader.samplers.IndexSampler(num_records=100, shuffle=True, seed=1, num_epochs=1,
                                             shard_options=loader.sharding.NoSharding()),
        operations=[loader.transforms.Batch(8)], worker_count=0)
    return iter(dl)

  it = dl_iter()
  next(it)
  next(it)
  path = str(tmp_path / "state.json")
  loader.save_state(path, it)
  data = json.loads(open(path).read())
  for count in (10**30, 10**8, 3):
    data["state"]["worker_count"] = count
    with open(path, "w") as f:
      json.dump(data, f)
    t = time.perf_counter()
    e = ft.in_time(lambda: loader.restore_state(path, dl_iter()))
    assert time.perf_counter() - t < 5
    assert isinstance(e, ValueError) and str(e).startswith(f"Cannot restore {path}: ")
    assert f"do not list workers 0..{count - 1}" in str(e)
