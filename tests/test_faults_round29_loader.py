"""Round 29 of the fault audit (loader side): a working directory changed or deleted under a running job, a worker
or the consumer out of memory, workers stopped (SIGSTOP) when the iterator is closed, and DataLoader states
restored over files in another order, fewer files, another batch size or another worker count.

Found by the 2026-12-07 loader fault audit (round 29), each case run against the real loader with real files,
processes, signals and resource limits; fixed the same day:

- An ArrayRecordSource made from relative paths (names, a folder, a glob) and read after the process changed its working directory (a
  notebook's os.chdir, a job that moves into its run folder, pytest's monkeypatch.chdir; a DataLoader's or
  mp_prefetch's workers started after the move) failed with "FileChangedError: data-00000-of-00002.array_record
  changed after the ArrayRecordSource was created (it was replaced by another file) ... Do not modify a dataset
  while it is read": nothing was replaced, and the advice was wrong; where the new folder held no such file it
  said the file "was deleted". (Grain 0.2.18 opens the name relative to the new folder: other files' records,
  or none.) A state saved there was then refused on restore, its content_hash computed over the other files.
  Now the source opens the files it was created on, by their absolute paths; `paths` stays as given (Grain's).
- A DataLoader or mp_prefetch iterator whose process's working directory was deleted (a cleaned-up temp or job
  folder) failed at its first next() with multiprocessing's bare "FileNotFoundError: [Errno 2] No such file or
  directory": no file, no cause (spawned workers start in the working directory), nothing on what to do. Now
  one line, still a FileNotFoundError, saying so; after an os.chdir() the next call starts the workers and the
  whole stream comes.

Checked and found sound (kept here so they stay so): a map in a worker out of memory under the worker's address
space limit (RLIMIT_AS set in worker_init_fn) is Grain's MemoryError, its note naming the worker and element,
and the stream goes on; the consumer under an address space limit (`ulimit -v`) that cannot map a worker's
result gets one line naming the segment and positions, loses nothing once the limit is raised, and leaves no
segment; close() of an iterator whose workers are all stopped (SIGSTOP: a debugger, a cgroup freezer) ends
them within seconds and leaves no worker and no segment; a DataLoader state restored over the same files in
another order or over fewer files is a StateMismatchError naming the state file with advice, and one restored
into a DataLoader of another batch size or worker count resumes at the same record, as Grain's does.

Seen and not fixed here (array_record's, not the loader's): opening an ArrayRecordReader in a process whose address
space limit leaves about 512 MiB free (RLIMIT_AS set in a worker_init_fn, `ulimit -v`) waits for ever inside the
reader's constructor (with 2 GiB free it opens), so a worker reading an ArrayRecordSource under such a limit
hangs its consumer; Grain reads through the same reader. The out-of-memory test reads MapDataset.range for that.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import faults_testing as ft
from fuzz_elements import deadline
import loader
from loader import python as grain_api
from loader import state as state_lib
from loader_testing import record_bytes, record_index, shm_segments, write_array_records


@pytest.fixture(autouse=True)
def _in_time():
  # Anything here that hangs fails the test instead of the whole run.
  with deadline(60, lambda: TimeoutError("test ran past its 60 s alarm")):
    yield



def _workers() -> set[int]:
  """This process's live spawned worker processes (not multiprocessing's resource tracker)."""
  found = set()
  for child in psutil.Process().children(recursive=True):
    try:
      if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
        found.add(child.pid)
    except psutil.NoSuchProcess:
      pass
  return found


def _until(condition, seconds: float = 10.0) -> bool:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if condition():
      return True
    time.sleep(0.05)
  return condition()


def _rewrite(path: str, first: int, n: int) -> None:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  w = ArrayRecordWriter(path, "group_size:1")
  for i in range(n):
    w.write(record_bytes(first + i))
  w.close()


def _mp(ds, workers: int = 2):
  return ds.to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))


def _data_loader(src, *, workers=0, batch=2, seed=3):
  sampler = grain_api.IndexSampler(len(src), grain_api.NoSharding(), shuffle=True, seed=seed, num_epochs=1)
  return grain_api.DataLoader(data_source=src, sampler=sampler, operations=[grain_api.Batch(batch)],
                              worker_count=workers)


# --- The working directory changed or deleted under a running job ------------------------------------------


@pytest.mark.parametrize("how", ["no workers", "mp_prefetch workers", "DataLoader workers"])
def test_relative_paths_are_read_from_the_folder_the_source_was_made_in_after_a_chdir(tmp_path, monkeypatch, how):
  write_array_records(tmp_path / "run1", 2, 5)
  other = write_array_records(tmp_path / "run2", 2, 5)  # Same names, other records: what the new folder holds.
  for k, path in enumerate(other):
    _rewrite(path, 1000 + 5 * k, 5)
  names = [f"data-{f:05d}-of-00002.array_record" for f in range(2)]
  monkeypatch.chdir(tmp_path / "run1")
  src = loader.ArrayRecordSource(names)
  assert src.paths == names  # As given, as Grain's.
  monkeypatch.chdir(tmp_path / "run2")  # The job moves on (its workers start only now).
  if how == "DataLoader workers":
    got = sorted(record_index(r) for batch in _data_loader(src, workers=2) for r in batch)
  else:
    ds = loader.MapDataset.source(src).map(record_index)
    got = list(ds.to_iter_dataset() if how == "no workers" else _mp(ds))
  # Was FileChangedError "... changed after the ArrayRecordSource was created (it was replaced by another file)".
  assert sorted(got) == list(range(10)), got
  monkeypatch.chdir(tmp_path)  # A folder without such files at all: was "(it was deleted)".
  assert [record_index(src[i]) for i in range(10)] == list(range(10))
  assert not shm_segments()


@pytest.mark.parametrize("given", ["run1", "run1/*.array_record", "./run1/../run1"], ids=["folder", "glob", "dots"])
def test_a_relative_folder_or_glob_is_read_from_where_it_was_resolved_after_a_chdir(tmp_path, monkeypatch, given):
  write_array_records(tmp_path / "run1", 2, 5)
  (tmp_path / "elsewhere" / "run1").mkdir(parents=True)
  for k, path in enumerate(write_array_records(tmp_path / "elsewhere" / "run1", 2, 5)):
    _rewrite(path, 1000 + 5 * k, 5)
  monkeypatch.chdir(tmp_path)
  src = loader.ArrayRecordSource(given)
  monkeypatch.chdir(tmp_path / "elsewhere")
  assert [record_index(r) for r in src.read(list(range(10)))] == list(range(10))


def test_a_relative_path_with_dots_after_a_symlink_reads_the_files_the_system_opens(tmp_path, monkeypatch):
  # `link/..` is where the link points, up one: abspath's text would name tmp_path/run1, other files.
  write_array_records(tmp_path / "store" / "run1", 2, 5)
  (tmp_path / "store" / "sub").mkdir()
  os.symlink(tmp_path / "store" / "sub", tmp_path / "link")
  (tmp_path / "run1").mkdir()
  for k, path in enumerate(write_array_records(tmp_path / "run1", 2, 5)):
    _rewrite(path, 1000 + 5 * k, 5)
  monkeypatch.chdir(tmp_path)
  src = loader.ArrayRecordSource("link/../run1")
  assert [record_index(r) for r in src.read(list(range(10)))] == list(range(10))
  monkeypatch.chdir(tmp_path / "store")
  assert [record_index(r) for r in src.read(list(range(10)))] == list(range(10))


def test_a_state_saved_in_one_folder_restores_after_a_chdir_to_another(tmp_path, monkeypatch):
  write_array_records(tmp_path / "run1", 2, 5)
  other = write_array_records(tmp_path / "run2", 2, 5)
  for k, path in enumerate(other):
    _rewrite(path, 1000 + 5 * k, 5)
  names = [f"data-{f:05d}-of-00002.array_record" for f in range(2)]
  monkeypatch.chdir(tmp_path / "run1")
  src = loader.ArrayRecordSource(names)
  it = iter(_data_loader(src))
  next(it)
  saved = str(tmp_path / "state.json")
  loader.save_state(saved, it)
  expected = [record_index(r) for r in next(it)]
  monkeypatch.chdir(tmp_path / "run2")
  restored = iter(_data_loader(src))
  # Was refused as "for another pipeline": its content_hash was computed over run2's files.
  loader.restore_state(saved, restored)
  assert [record_index(r) for r in next(restored)] == expected


@pytest.mark.parametrize("how", ["mp_prefetch", "DataLoader"])
def test_a_deleted_working_directory_is_named_when_workers_start_and_nothing_is_lost(tmp_path, monkeypatch, how):
  paths = write_array_records(tmp_path / "d", 2, 5)
  src = loader.ArrayRecordSource(paths)
  if how == "mp_prefetch":
    it = iter(_mp(loader.MapDataset.source(src).map(record_index)))
  else:
    it = iter(grain_api.DataLoader(
        data_source=src, sampler=grain_api.IndexSampler(len(src), grain_api.NoSharding(), shuffle=False, seed=1,
                                                        num_epochs=1), worker_count=2))
  gone = tmp_path / "job"
  gone.mkdir()
  monkeypatch.chdir(gone)
  gone.rmdir()  # A cleanup removes the job's folder while it runs.
  before = _workers()
  e = ft.error_of(lambda: next(it))
  line = str(e)
  # Was multiprocessing's bare "[Errno 2] No such file or directory".
  assert isinstance(e, FileNotFoundError) and "\n" not in line, (type(e), line)
  assert "working directory was deleted" in line and "os.chdir" in line, line
  assert _workers() == before and not shm_segments()
  monkeypatch.chdir(tmp_path)  # What it says to do.
  got = [next(it)] + list(it)
  got = [x if isinstance(x, int) else record_index(x) for x in got]
  assert got == list(range(10)), got
  if hasattr(it, "close"):
    it.close()
  del it
  assert _until(lambda: not shm_segments())


# --- Out of memory ------------------------------------------------------------------------------------------


def test_a_map_out_of_memory_in_a_worker_is_a_memory_error_naming_the_element_and_the_stream_goes_on():
  # MapDataset.range, not an ArrayRecordSource: array_record's reader hangs when opened under so tight a limit
  # (see the module's notes), in Grain as here.
  def init(index, count):  # A job's per-process memory limit, met in the worker only.
    vms = psutil.Process().memory_info().vms
    resource.setrlimit(resource.RLIMIT_AS, (vms + (512 << 20), resource.RLIM_INFINITY))

  def grow(i):
    return np.ones(2 << 30, np.uint8) if i == 7 else int(i)

  ds = loader.MapDataset.range(20).map(grow).to_iter_dataset()
  it = iter(ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
  got, errors = [], []
  while True:
    try:
      got.append(next(it))
    except StopIteration:
      break
    except TimeoutError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
      got.append(None)
  assert len(errors) == 1 and isinstance(errors[0], MemoryError), errors  # Grain's type.
  notes = "\n".join(getattr(errors[0], "__notes__", []))
  assert re.search(r"Worker \d+ \(pid \d+\) raised while computing element 7\b", notes), notes
  assert got == list(range(7)) + [None] + list(range(8, 20)), got
  it.close()
  assert _until(lambda: not _workers()) and not shm_segments()


_CONSUMER_LIMIT = textwrap.dedent("""
    import json, os, resource, sys
    import numpy as np, psutil
    import loader
    from loader_testing import record_index, shm_segments, write_array_records

    def big(record):
      return np.full(64 << 20, record_index(record), np.uint8)

    if __name__ == "__main__":
      paths = write_array_records(sys.argv[1], 1, 6)
      ds = loader.MapDataset.source(loader.ArrayRecordSource(paths)).map(big).to_iter_dataset()
      it = iter(ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
      got, errors = [int(next(it)[0])], []
      vms = psutil.Process().memory_info().vms
      resource.setrlimit(resource.RLIMIT_AS, (vms + (32 << 20), resource.RLIM_INFINITY))  # `ulimit -v`
      for _ in range(2):
        try:
          got.append(int(next(it)[0]))
        except Exception as e:
          errors.append([type(e).__name__, getattr(e, "errno", None), str(e)])
      resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
      got += [int(x[0]) for x in it]
      it.close()
      print(json.dumps({"got": got, "errors": errors, "segments": sorted(shm_segments())}))
""")


def test_the_consumer_out_of_address_space_for_a_result_loses_nothing_once_the_limit_is_raised(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(_CONSUMER_LIMIT)
  env = ft.env()
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), env["PYTHONPATH"]])
  proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "d")], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)
  try:
    out, err = proc.communicate(timeout=50)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == 0, err[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  assert result["errors"], result
  for name, code, line in result["errors"]:
    assert name == "OSError" and code == 12 and "\n" not in line, (name, code, line)
    assert "/dev/shm/arl" in line and "positions 1..1" in line and "Nothing was lost" in line, line
    assert "ulimit -v" in line, line
  assert result["got"] == [0, 1, 2, 3, 4, 5], result  # Each position once, in order.
  assert result["segments"] == [], result
  assert not shm_segments(f"arl{proc.pid}_")


# --- Stopped workers ----------------------------------------------------------------------------------------


def test_close_ends_workers_stopped_by_sigstop_within_seconds_leaving_nothing(tmp_path):
  paths = write_array_records(tmp_path / "d", 2, 50)
  it = iter(_mp(loader.MapDataset.source(loader.ArrayRecordSource(paths)).map(record_index)))
  assert next(it) == 0
  workers = _workers()
  assert len(workers) == 2, workers
  for pid in workers:
    os.kill(pid, signal.SIGSTOP)  # A debugger attached, a cgroup freezer, a Ctrl-Z sent to them only.
  start = time.monotonic()
  it.close()
  assert time.monotonic() - start < 15
  assert _until(lambda: not (_workers() & workers)), _workers()
  assert not shm_segments()


# --- DataLoader states over other files or settings ---------------------------------------------------------


@pytest.mark.parametrize("change", ["files in another order", "fewer files"])
def test_a_data_loader_state_over_other_files_is_a_state_mismatch_error_naming_the_file(tmp_path, change):
  paths = write_array_records(tmp_path / "d", 3, 6)
  it = iter(_data_loader(loader.ArrayRecordSource(paths)))
  next(it)
  saved = str(tmp_path / "state.json")
  loader.save_state(saved, it)
  other = paths[::-1] if change == "files in another order" else paths[:2]
  restored = iter(_data_loader(loader.ArrayRecordSource(other)))
  e = ft.error_of(lambda: loader.restore_state(saved, restored))
  line = str(e)
  assert isinstance(e, state_lib.StateMismatchError) and "\n" not in line and saved in line, (type(e), line)
  assert re.search(r"start a fresh iterator|restore it into", line), line
  assert [record_index(r) for r in next(restored)] == [record_index(r) for r in next(iter(_data_loader(
      loader.ArrayRecordSource(other))))]  # Left at its start, not half restored.


@pytest.mark.parametrize("other", [dict(batch=3), dict(workers=2)], ids=["batch size", "worker count"])
def test_a_data_loader_state_restores_into_another_batch_size_or_worker_count_at_the_same_record(tmp_path, other):
  paths = write_array_records(tmp_path / "d", 2, 10)
  src = loader.ArrayRecordSource(paths)
  it = iter(_data_loader(src))
  next(it)
  next(it)
  saved = str(tmp_path / "state.json")
  loader.save_state(saved, it)
  rest = [record_index(r) for batch in it for r in batch]
  restored = iter(_data_loader(src, **other))
  loader.restore_state(saved, restored)
  got = [record_index(r) for batch in restored for r in batch]
  assert got == rest, (got, rest)
  del restored
  assert _until(lambda: not _workers()) and _until(lambda: not shm_segments())
