"""Round 28 of the fault audit (loader side): DataLoader states restored onto another pipeline or edited by hand,
files given as ArrayRecord that are not, elements that cannot go back from a worker, a file size limit taken for
a full /dev/shm, and SIGTERM to the parent of DataLoader workers.

Found by the 2026-12-06 loader fault audit (round 28), each case run against the real loader (and Grain 0.2.18
where it raises) with real files, processes and signals; all fixed the same day (a StateMismatchError with
advice, saying when the content changed; restore_state names the files changed after the state file was
written; edited last_seen_indices get Grain's TypeError / IndexError types; advice for files that are not
ArrayRecord files; an unpicklable element named with its position and what to do; the file size limit named
as such; a DataLoader's bytes named as one). What the audit saw:

- A DataLoader state restored onto a DataLoader of another seed, num_epochs, shard_options or shuffle (or onto
  files of the same names and counts regenerated since) is refused, but as a plain ValueError: README says
  refusals are `StateMismatchError` (the dataset iterators' are), so `except loader.state.StateMismatchError`
  misses it; and its one line says only "DataLoader state is for another pipeline: sampler '<repr>' != this
  DataLoader's '<repr>'": nothing on what to do (the dataset iterators' refusal says), and for regenerated
  files only two content_hash values, not that the files' content changed since the save.
- A dataset iterator's state restored after one of its 3 shards was appended to, cut or re-written is
  refused, but the line names no file: "its operation 0 is not 'source(ArrayRecordSource(3 files, 31 records,
  files_hash=..., content_hash=...))' as in this one" (for a changed record count, not even that the files
  changed since the save), and its only advice is to strip the state and resume on the changed data.
- A DataLoader state whose `last_seen_indices` were edited by hand: a string ("3") is taken as the number
  (Grain 0.2.18: TypeError); a position past the stream's end (1e9) restores into an iterator that is simply
  empty, a training run that "finishes" at once (Grain 0.2.18: IndexError "Checkpoint `next_index` ... is out
  of range"); a negative one is a ValueError "Cannot resume this Grain state exactly: its 1 workers had read
  [-4] records each" (Grain 0.2.18: IndexError, out of range).
- A file given to ArrayRecordDataSource that is empty, all zeros (a preallocated file never written, a crash
  before the data reached the disk) or text is named, with Grain's RuntimeError, but the line says only what
  the file is ("it is empty (0 bytes)", "its first bytes are b'\\x00...'"), not what to do.
- An element that a map in a worker returns and that cannot be pickled (a generator, a lock) fails with
  pickle's bare "cannot pickle 'generator' object": not which element or map, not that it is the trip back
  from the worker that fails (it works without workers), not what to do; the notes say the worker "raised
  while computing element 0", though computing it succeeded.
- Under a file size limit (`ulimit -f`, a batch scheduler's RLIMIT_FSIZE) each worker warns "/dev/shm has no
  room for a 4.2 MB chunk (File too large) ... Give /dev/shm more room (e.g. `docker run --shm-size=2g`)":
  /dev/shm has room, the limit is the cause (save_state says so since round 23). Nothing is lost.
- A DataLoader state restored into a MapDataset's iterator says "MapDatasetIterator.set_state expects the dict
  returned by get_state() (got bytes: b'{\\n    \\"data_source\\"...')": not that it is a DataLoader's state
  nor where it restores.

Checked and found sound (kept here so they stay so): SIGTERM to a training process reading through a
DataLoader with 2 workers leaves no worker and no /dev/shm segment; a MapDataset state edited to a bool, a
float, a string, a list, a negative or a huge next_index, or restored onto another seed, batch size or repeat
count, is refused in one line naming the file, with Grain's type; a DataLoader state saved with 2 workers
restores into 0 workers at the same element.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
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

_ADVICE = re.compile(r"start (a|the) (fresh|new)|fresh iterator|restore another|strip\(|remove it|re-?create|"
                     r"convert|copy it|download|write it again|regenerate|delete")



@pytest.fixture(autouse=True)
def _in_time():
  # Anything here that hangs fails the test instead of the whole run.
  with deadline(60, lambda: TimeoutError("test ran past its 60 s alarm")):
    yield


def _data_loader(paths, *, seed=3, num_epochs=1, shard=None, shuffle=True, workers=0, source=None):
  src = source if source is not None else loader.ArrayRecordSource(paths)
  sampler = grain_api.IndexSampler(len(src), shard or grain_api.NoSharding(), shuffle=shuffle, seed=seed,
                                   num_epochs=num_epochs)
  return grain_api.DataLoader(data_source=src, sampler=sampler, operations=[grain_api.Batch(2)],
                              worker_count=workers)


def _saved_data_loader_state(tmp_path, paths, **kwargs) -> str:
  it = iter(_data_loader(paths, **kwargs))
  next(it)
  next(it)
  path = str(tmp_path / "data_state.json")
  loader.save_state(path, it)
  return path


# --- DataLoader states restored onto another pipeline ------------------------------------------------------


@pytest.mark.parametrize("other", [dict(seed=4), dict(num_epochs=2), dict(shard=grain_api.ShardOptions(0, 2)),
                                   dict(shuffle=False)], ids=["seed", "num_epochs", "shard_options", "shuffle"])
def test_a_data_loader_state_of_another_pipeline_is_a_state_mismatch_error_that_says_what_to_do(tmp_path, other):
  paths = write_array_records(tmp_path / "d", 2, 10)
  saved = _saved_data_loader_state(tmp_path, paths)
  e = ft.error_of(lambda: loader.restore_state(saved, iter(_data_loader(paths, **other))))
  line = str(e)
  assert "\n" not in line and saved in line, line
  assert isinstance(e, state_lib.StateMismatchError), (type(e).__mro__, line)  # README: refusals are these.
  assert _ADVICE.search(line), f"says not what to do: {line}"


def test_a_data_loader_state_over_files_regenerated_since_says_their_content_changed(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  paths = write_array_records(tmp_path / "d", 2, 10)
  saved = _saved_data_loader_state(tmp_path, paths)
  for k, path in enumerate(paths):  # Same names, same record counts, other records.
    w = ArrayRecordWriter(path, "group_size:1")
    for i in range(10):
      w.write(record_bytes(1000 + 10 * k + i))
    w.close()
  e = ft.error_of(lambda: loader.restore_state(saved, iter(_data_loader(paths))))
  line = str(e)
  assert "\n" not in line and saved in line, line
  assert isinstance(e, state_lib.StateMismatchError), (type(e).__mro__, line)
  # The dataset iterators' refusal says "files of the same names whose content changed since the state was saved".
  assert re.search(r"content changed|changed since|rewritten|regenerated", line), line


@pytest.mark.parametrize("records", [11, 9, 10], ids=["appended", "cut", "replaced"])
def test_a_state_over_a_shard_changed_since_the_save_names_that_shard(tmp_path, records):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "d"
  paths = write_array_records(folder, 3, 10)

  def ds():
    return loader.MapDataset.source(loader.ArrayRecordSource(str(folder))).shuffle(seed=1).batch(2).to_iter_dataset()

  it = iter(ds())
  next(it)
  saved = str(tmp_path / "s.json")
  loader.save_state(saved, it)
  time.sleep(0.05)  # Later than the save by more than a filesystem clock tick, as a re-download would be.
  w = ArrayRecordWriter(paths[1], "group_size:1")  # One shard re-written (a re-download, a re-conversion).
  for i in range(records):
    w.write(record_bytes(500 + i))
  w.close()
  e = ft.error_of(lambda: loader.restore_state(saved, iter(ds())))
  line = str(e)
  assert isinstance(e, state_lib.StateMismatchError) and "\n" not in line and saved in line, line
  # Refused, but as "operation 0 is not 'source(ArrayRecordSource(3 files, 31 records, ...))'": which of the
  # 3 files changed, and that it changed since the save, is left to the user to find.
  assert os.path.basename(paths[1]) in line, f"does not name the shard that changed: {line}"


def test_a_data_loader_state_restored_into_a_map_datasets_iterator_says_whose_state_it_is(tmp_path):
  paths = write_array_records(tmp_path / "d", 2, 10)
  saved = _saved_data_loader_state(tmp_path, paths)
  ds = loader.MapDataset.source(loader.ArrayRecordSource(paths)).shuffle(seed=3).batch(2).to_iter_dataset()
  e = ft.error_of(lambda: loader.restore_state(saved, iter(ds)))
  line = str(e)
  assert "\n" not in line and saved in line and isinstance(e, state_lib.StateMismatchError), line
  assert "DataLoader" in line, f"does not say it is a DataLoader's state: {line}"


# --- DataLoader states edited by hand -----------------------------------------------------------------------


class _Src:
  def __len__(self):
    return 20

  def __getitem__(self, i):
    return np.int64(i)

  def __repr__(self):
    return "Src"


def _grain_error(value):
  """What Grain 0.2.18 raises for the same edit of its own DataLoader state."""
  import grain.python as grain  # pylint: disable=g-import-not-at-top
  dl = grain.DataLoader(data_source=_Src(), sampler=grain.IndexSampler(20, grain.NoSharding(), shuffle=False,
                                                                         seed=3, num_epochs=1),
                        operations=[grain.Batch(2)], worker_count=0)
  it = iter(dl)
  next(it)
  state = json.loads(it.get_state())
  state["last_seen_indices"] = {"0": value}
  it = iter(dl)
  return ft.error_of(lambda: (it.set_state(json.dumps(state).encode()), next(it)))


@pytest.mark.parametrize("value,grain_type", [("3", TypeError), (10**9, IndexError), (-5, IndexError)],
                         ids=["string", "past_the_end", "negative"])
def test_edited_last_seen_indices_are_refused_with_grains_type_naming_the_file(tmp_path, value, grain_type):
  assert isinstance(_grain_error(value), grain_type)  # Grain refuses each.
  paths = write_array_records(tmp_path / "d", 2, 10)
  saved = _saved_data_loader_state(tmp_path, paths)
  with open(saved) as f:
    doc = json.load(f)
  doc["state"]["last_seen_indices"] = {"0": value}  # As a user skipping ahead edits it.
  with open(saved, "w") as f:
    json.dump(doc, f)
  it = iter(_data_loader(paths))

  def restore_and_read():
    loader.restore_state(saved, it)
    return next(it)

  e = ft.error_of(restore_and_read)  # Not a batch from elsewhere, nor an empty stream (StopIteration).
  line = str(e)
  assert isinstance(e, grain_type) and isinstance(e, ValueError), (type(e).__mro__, line)
  assert "\n" not in line and saved in line and "last_seen_indices" in line, line


# --- Files that are not ArrayRecord files -------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\0" * 100_000, b"step,loss\n1,0.5\n" * 100],
                         ids=["empty", "zeros", "text"])
def test_a_file_that_is_not_array_record_says_what_to_do(tmp_path, content):
  path = tmp_path / "train.array_record-00000-of-00001"
  path.write_bytes(content)
  e = ft.error_of(lambda: loader.sources.ArrayRecordDataSource([str(path)]))
  line = str(e)
  assert isinstance(e, RuntimeError), type(e).__mro__  # Grain's type.
  assert "\n" not in line and line.startswith(str(path)), line
  assert _ADVICE.search(line), f"says what the file is but not what to do: {line}"


# --- What workers send back ---------------------------------------------------------------------------------


def _a_generator(x):
  return (i for i in range(x + 1))


def test_an_element_that_cannot_go_back_from_a_worker_is_named_with_what_to_do():
  ds = loader.MapDataset.range(6).map(_a_generator).to_iter_dataset()
  assert [len(list(g)) for g in ds] == [1, 2, 3, 4, 5, 6]  # Without workers, fine.
  before = shm_segments()
  it = iter(ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=1)))
  try:
    e = ft.error_of(lambda: next(it))
  finally:
    it.close()
  line = str(e)
  assert isinstance(e, TypeError), type(e).__mro__  # pickle's type.
  assert "\n" not in line, line
  assert re.search(r"element 0|map\(_a_generator\)", line), f"names neither element nor map: {line}"
  assert "worker" in line and re.search(r"picklable|return|after (the )?mp_prefetch", line), (
      f"says not that the trip back from the worker fails, nor what to do: {line}")
  assert shm_segments() <= before
  assert not multiprocessing.active_children()


_BIG_ELEMENTS = """
import os, resource, sys
import numpy as np
import loader

def big(x):
  return np.full(2 << 20, x, np.uint8)

if __name__ == "__main__":
  resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # ulimit -f 1024, as a batch scheduler sets.
  ds = loader.MapDataset.range(6).map(big).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1))
  print([int(x[0]) for x in ds] == list(range(6)), flush=True)
"""


def test_a_file_size_limit_in_the_workers_is_not_called_a_full_dev_shm(tmp_path):
  script = tmp_path / "big.py"
  script.write_text(_BIG_ELEMENTS)
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=ft.env(),
                        cwd=str(tmp_path))
  assert proc.returncode == 0 and proc.stdout.strip() == "True", (proc.stdout, proc.stderr[-2000:])  # Nothing lost.
  err = proc.stderr
  assert "File too large" in err or "file size" in err, err  # It does say something.
  assert "more room" not in err and "--shm-size" not in err, f"blames /dev/shm for the file size limit: {err}"
  assert re.search(r"file size limit|ulimit -f|RLIMIT_FSIZE", err), err


# --- Signals ------------------------------------------------------------------------------------------------


_TRAINING = """
import os, sys, time
import loader
from loader import python as grain

if __name__ == "__main__":
  src = loader.ArrayRecordSource(sys.argv[1])
  dl = grain.DataLoader(data_source=src, sampler=grain.IndexSampler(len(src), grain.NoSharding(), shuffle=True,
                        seed=3, num_epochs=None), operations=[grain.Batch(2)], worker_count=2)
  it = iter(dl)
  next(it)
  print("ready", flush=True)
  while True:
    next(it)
    time.sleep(0.001)
"""


def test_sigterm_to_the_parent_of_data_loader_workers_leaves_no_worker_and_no_segment(tmp_path):
  write_array_records(tmp_path / "d", 2, 100)
  script = tmp_path / "train.py"
  script.write_text(_TRAINING)
  proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "d")], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=ft.env(), cwd=str(tmp_path))
  try:
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    kids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert len(kids) >= 2, kids
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()

  def gone():
    return (not any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE for k in kids)
            and not shm_segments(f"arl{proc.pid}_"))

  deadline = time.monotonic() + 15
  while not gone() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert gone(), ([k for k in kids if psutil.pid_exists(k)], shm_segments(f"arl{proc.pid}_"))


# --- Sound cases, kept so ------------------------------------------------------------------------------------


def test_a_map_dataset_state_edited_or_of_another_pipeline_is_refused_in_one_line_with_grains_type(tmp_path):
  paths = write_array_records(tmp_path / "d", 2, 10)
  src = loader.ArrayRecordSource(paths)

  def ds(seed=1, batch=2, repeat=None):
    d = loader.MapDataset.source(src).shuffle(seed=seed)
    d = d.repeat(repeat) if repeat else d
    return d.map(record_index).batch(batch).to_iter_dataset()

  it = iter(ds())
  next(it)
  next(it)
  saved = str(tmp_path / "s.json")
  loader.save_state(saved, it)
  with open(saved) as f:
    doc = json.load(f)
  for value, want in [(True, TypeError), (2.0, TypeError), ("2", TypeError), ([2], TypeError), (-1, IndexError),
                      (10**30, IndexError)]:
    edited = str(tmp_path / "edited.json")
    with open(edited, "w") as f:
      json.dump({**doc, "state": {**doc["state"], "next_index": value}}, f)
    e = ft.error_of(lambda: loader.restore_state(edited, iter(ds())))
    assert isinstance(e, want) and isinstance(e, state_lib.StateMismatchError), (value, type(e).__mro__)
    assert "\n" not in str(e) and edited in str(e), str(e)
  for other in [dict(seed=2), dict(batch=3), dict(repeat=2)]:
    e = ft.error_of(lambda: loader.restore_state(saved, iter(ds(**other))))
    assert isinstance(e, state_lib.StateMismatchError) and "\n" not in str(e) and saved in str(e), str(e)
    assert _ADVICE.search(str(e)), str(e)
  fresh = iter(ds())
  loader.restore_state(saved, fresh)
  assert [x.tolist() for x in fresh] == [x.tolist() for x in it]


def test_a_data_loader_state_saved_with_workers_restores_without_them_at_the_same_batch(tmp_path):
  paths = write_array_records(tmp_path / "d", 2, 10)
  with_workers = iter(_data_loader(paths, workers=2))
  next(with_workers)
  saved = str(tmp_path / "w.json")
  loader.save_state(saved, with_workers)
  want = [[record_index(r) for r in b] for b in with_workers]
  with_workers = None
  without = iter(_data_loader(paths))
  loader.restore_state(saved, without)
  assert [[record_index(r) for r in b] for b in without] == want
