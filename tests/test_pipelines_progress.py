"""pipelines.progress: progress from published outputs; real conversions, a real terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys

import pytest

import gcs_emulator as emu
from converter import ConvertOptions, expand_patterns, plan_shards
from loader import ondisk
from pipelines import convert, make_example_data, progress

pytestmark = pytest.mark.timeout(300)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = 4
_LINE = re.compile(r"(\d+)/(\d+) files, ([\d,.]+)/([\d,.]+) MB, [\d.]+ MB/s, ETA \S+")


@pytest.fixture(scope="module")
def tfr(tmp_path_factory):
  folder = tmp_path_factory.mktemp("progress") / "tfr"
  make_example_data.make_example_data(str(folder), shards=SHARDS, records_per_shard=300)
  return str(folder)


def _lines(text: str) -> list[tuple[int, int]]:
  return [(int(m.group(1)), int(m.group(2))) for m in _LINE.finditer(text)]


def _shard(tmp_path, name: str, size: int) -> progress.Shard:
  src = tmp_path / "in" / f"{name}.tfrecord"
  src.parent.mkdir(exist_ok=True)
  src.write_bytes(b"x" * size)
  return progress.Shard(str(src), str(tmp_path / "out" / f"{name}.array_record"), size)


def test_snapshot_line_rate_and_eta():
  snap = progress.Snapshot(1, 4, 25e6, 100_000_000, 5.0)
  assert snap.line() == "1/4 files, 25.0/100.0 MB, 5.0 MB/s, ETA 15s"
  assert progress.Snapshot(0, 4, 0, 10, 1.0).line().endswith("ETA ?")
  assert progress.Snapshot(4, 4, 10, 10, 1.0).eta_s == 0.0
  assert [progress.format_seconds(s) for s in (4.4, 75, 7322)] == ["4s", "1m15s", "2h02m"]


def test_watcher_counts_published_outputs_and_partly_written_ones(tmp_path):
  shards = [_shard(tmp_path, n, 1000) for n in ("a", "b", "c")]
  out = tmp_path / "out"
  out.mkdir()
  (out / "c.array_record").write_bytes(b"old")  # An output --overwrite will replace.
  w = progress.Watcher(shards, out=io.StringIO(), interactive=False, poll_s=60)
  with w:
    assert w.poll().files_done == 0 and w.last.bytes_total == 3000
    temp_a = ondisk.temp_name(str(out / "a.array_record"))  # As the converter names it.
    with open(temp_a, "wb") as f:
      f.write(b"y" * 400)
    snap = w.poll()
    assert (snap.files_done, snap.bytes_done) == (0, 400)  # Partial, 1 byte in per byte out.
    os.replace(temp_a, out / "a.array_record")
    assert (w.poll().files_done, w.last.bytes_done) == (1, 1000)
    assert w.poll().files_done == 1  # The old c is not progress...
    temp_c = ondisk.temp_name(str(out / "c.array_record"))
    with open(temp_c, "wb") as f:
      f.write(b"new content")
    os.replace(temp_c, out / "c.array_record")
    assert w.poll().files_done == 2  # ...its replacement is.
    (out / "b.array_record").write_bytes(b"z" * 500)
    snap = w.poll()
  assert (snap.files_done, snap.files_total, snap.bytes_done) == (3, 3, 3000)
  assert snap.eta_s == 0.0


def test_log_lines_when_stdout_is_not_a_terminal(tfr, tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(progress, "FIRST_LOG_S", 0.0)
  monkeypatch.setattr(progress, "LOCAL_POLL_S", 0.02)
  assert convert.main(["--input", f"{tfr}/*", "--output", str(tmp_path / "o")]) == 0
  out = capsys.readouterr().out
  logged = [ln for ln in out.splitlines() if ln.startswith("progress: ")]
  assert logged, out
  seen = _lines("\n".join(logged))
  assert all(total == SHARDS for _, total in seen)
  assert [d for d, _ in seen] == sorted(d for d, _ in seen)
  assert "\r" not in out and "\x1b" not in out


def test_quiet_prints_no_progress(tfr, tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(progress, "FIRST_LOG_S", 0.0)
  monkeypatch.setattr(progress, "LOCAL_POLL_S", 0.02)
  assert convert.main(["--input", f"{tfr}/*", "--output", str(tmp_path / "o"), "--quiet"]) == 0
  out = capsys.readouterr().out
  assert "progress: " not in out and not _lines(out)
  assert out.startswith("Converted 4 file(s)")


def test_other_entries_of_the_input_folder_never_stop_a_run(tfr, tmp_path, capsys):
  # Progress lists the input folder for sizes: a link loop beside the inputs
  # (not matched by the glob) is not the run's business.
  folder = tmp_path / "in"
  folder.mkdir()
  for name in os.listdir(tfr):
    os.symlink(os.path.join(tfr, name), folder / name)
  os.symlink("loopA", folder / "loopB")
  os.symlink("loopB", folder / "loopA")
  listed = progress._listing(str(folder))  # pylint: disable=protected-access
  assert "loopA" not in listed and len(listed) == SHARDS
  assert convert.main(["--input", f"{folder}/*tfrecord*", "--output", str(tmp_path / "o"), "--quiet"]) == 0
  assert capsys.readouterr().out.startswith(f"Converted {SHARDS} file(s)")
  assert progress.input_sizes([str(folder / "loopA")]) == {str(folder / "loopA"): 0}  # Unknown: shown as 0.


def _run_on_a_terminal(argv: list[str]) -> str:
  """Runs `python -m pipelines.convert ARGV` with stdout on a pseudo-terminal."""
  leader, follower = pty.openpty()
  env = dict(os.environ, PYTHONPATH=REPO, COLUMNS="200")
  proc = subprocess.Popen([sys.executable, "-m", "pipelines.convert", *argv], stdout=follower,
                          stderr=subprocess.PIPE, cwd=REPO, env=env)
  os.close(follower)
  chunks = []
  while True:
    try:
      data = os.read(leader, 65536)
    except OSError:  # EIO: the child closed the terminal.
      break
    if not data:
      break
    chunks.append(data)
  os.close(leader)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, err.decode()
  return b"".join(chunks).decode()


def test_live_line_on_a_terminal(tfr, tmp_path):
  out = _run_on_a_terminal(["--input", f"{tfr}/*", "--output", str(tmp_path / "o")])
  redraws = out.split("Converting", 1)[1].split("Converted", 1)[0]
  assert "\r" in redraws and "\x1b[K" in redraws  # One line, redrawn in place.
  assert "progress:" not in out
  seen = _lines(redraws)
  assert seen[-1] == (SHARDS, SHARDS)  # The final state stays on screen.
  assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory, tfr):
  """The emulator with the TFRecord shards under gs://test-bucket/tfr/."""
  folder = str(tmp_path_factory.mktemp("gcs"))
  server = emu.Emulator(folder).start()
  with pytest.MonkeyPatch.context() as mp:
    for key, value in emu.emulator_env(server.host, folder).items():
      mp.setenv(key, value)
    try:
      with emu.network_guard() as blocked:
        emu.client().create_bucket(emu.BUCKET)
        for name in sorted(os.listdir(tfr)):
          emu.upload(os.path.join(tfr, name), f"gs://{emu.BUCKET}/tfr/{name}")
        yield {"blocked": blocked, "sizes": {
            f"gs://{emu.BUCKET}/tfr/{n}": os.path.getsize(os.path.join(tfr, n))
            for n in os.listdir(tfr)}}
        assert [b for b in blocked if b not in emu.EXPECTED_REFUSALS] == []
    finally:
      server.stop()


def test_gcs_outputs(gcs, capsys, monkeypatch):
  """Sizes come from listings; progress counts objects as published (in-process, workers)."""
  bucket = f"gs://{emu.BUCKET}"
  files = expand_patterns([f"{bucket}/tfr/*"])
  assert progress.input_sizes(files) == gcs["sizes"]
  out = f"{bucket}/out/watched"
  shards = progress.shards(plan_shards(files, ConvertOptions(output_dir=out)))
  log = io.StringIO()
  watcher = progress.Watcher(shards, out=log, interactive=False, poll_s=0.1, first_log_s=0)
  with watcher:
    convert.run(["--input", f"{bucket}/tfr/*", "--output", out, "--quiet",
                 "--project", emu.PROJECT])
  snap = watcher.poll()
  assert (snap.files_done, snap.files_total) == (SHARDS, SHARDS)
  assert snap.bytes_done == sum(gcs["sizes"].values())

  # The CLI, with Beam's worker processes writing to the bucket.
  monkeypatch.setattr(progress, "FIRST_LOG_S", 0.0)
  monkeypatch.setattr(progress, "REMOTE_POLL_S", 0.1)
  assert convert.main(["--input", f"{bucket}/tfr/*", "--output", f"{bucket}/out/cli",
                       "--project", emu.PROJECT, "--workers", "2"]) == 0
  out = capsys.readouterr().out
  seen = _lines(out)
  assert seen and all(total == SHARDS for _, total in seen)
  assert "Workers: 2 worker processes" in out
  assert len([o for o in emu.list_objects(f"{bucket}/out/cli/") if o.endswith("manifest.json")]) == 1
