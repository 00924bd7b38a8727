"""FIFOs and odd JSON where a manifest, a state or a shard should be: refused in one line, never a hang.

Found by the 2026-12-05 fault audit: each case blocked for ever (a FIFO is
opened and read as if a writer would come) or printed a RecursionError.
CLI runs are subprocesses with a timeout, so a hang fails the test.
"""

from __future__ import annotations

import os

import pytest

import faults_testing as ft
import loader
from pipelines import convert


@pytest.fixture
def converted(tmp_path):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 2, 10, 100)
  out = tmp_path / "out"
  assert convert.main(["--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1"]) == 0
  return inp, out


def _fifo_at(path) -> None:
  os.remove(path) if os.path.exists(path) else None
  os.mkfifo(path)


def _cli(module: str, *args: str):
  """(result, its one stderr line); verify, which reports on stdout, gets its whole output instead."""
  r = ft.run_cli(module, *args, timeout=120)
  return r, ft.one_line(r.stderr) if module == "pipelines.convert" else r.stdout + r.stderr


def test_a_fifo_manifest_is_refused_by_convert_verify_and_the_loader(converted):
  inp, out = converted
  manifest = out / "manifest.json"
  _fifo_at(manifest)
  for flag in ("--skip-existing", "--overwrite"):
    r, line = _cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1",
                   flag)
    assert r.returncode != 0 and "FIFO (named pipe)" in line and str(manifest) in line, line
  r, _ = _cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert r.returncode != 0 and "FIFO (named pipe)" in r.stdout + r.stderr and "Traceback" not in r.stderr
  e = ft.in_time(lambda: loader.ArrayRecordSource(str(out)))
  assert isinstance(e, loader.ondisk.ManifestError) and "FIFO (named pipe)" in str(e), e
  assert os.path.exists(manifest) and not ft.temps(str(out))


def test_verify_names_a_fifo_or_a_folder_at_a_shards_name(converted):
  inp, out = converted
  shards = sorted(n for n in os.listdir(out) if ".array_record" in n)
  _fifo_at(out / shards[0])
  os.remove(out / shards[1])
  os.mkdir(out / shards[1])
  r, text = _cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert r.returncode != 0
  assert f"{out / shards[0]} is a FIFO (named pipe)" in text and f"{out / shards[1]} is a directory" in text, text
  assert "move it away and rerun" in text


def test_converting_in_place_refuses_a_fifo_among_the_inputs(tmp_path):
  inp = tmp_path / "in"
  ft.make_dataset(str(inp), 1, 5, 100)
  fifo = inp / "ds.tfrecord-fifo"
  os.mkfifo(fifo)
  r, line = _cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(inp), "--quiet", "--workers", "1")
  assert r.returncode != 0 and str(fifo) in line and "FIFO (named pipe)" in line, line
  assert not [n for n in os.listdir(inp) if "array_record" in n]


def test_restore_state_from_a_fifo_is_refused(tmp_path):
  fifo = tmp_path / "state.json"
  os.mkfifo(fifo)
  it = iter(loader.MapDataset.range(5).to_iter_dataset())
  e = ft.in_time(lambda: loader.restore_state(str(fifo), it))
  assert isinstance(e, ValueError) and "FIFO (named pipe)" in str(e) and str(fifo) in str(e), e


def test_a_manifest_nested_too_deeply_is_named_not_a_recursion_error(converted):
  inp, out = converted
  (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
  e = ft.in_time(lambda: loader.ArrayRecordSource(str(out)))
  assert isinstance(e, loader.ondisk.ManifestError) and "nested too deeply" in str(e), e
  r, line = _cli("pipelines.verify", "--input", str(inp / "*"), "--output", str(out))
  assert r.returncode != 0 and "nested too deeply" in line and "Traceback" not in line, line
  # A damaged manifest of ours: --overwrite replaces it.
  r = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1",
                 "--overwrite", timeout=120)
  assert r.returncode == 0, r.stderr
  assert len(loader.ArrayRecordSource(str(out))) == 20
