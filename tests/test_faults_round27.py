"""Round 27 of the fault audit (loader): iterator checkpoints, resumes, mixing and packing, and ArrayRecord
sources under bad input and bad luck.

Found by the 2026-12-06 fault audit, each case run against the real loader (real files, real processes,
real signals) before the fix:

- A `save_state` killed midway (kill -9, a preempted job) left its hidden temp file
  (`.step_1.json.tmp-<pid>-...`) for good when the job names its checkpoints by step: the next save cleaned
  only the temps of its own name (`step_2.json`), and no save wrote `step_1.json` again. Now a save also
  removes the temps beside it of dead processes on this host that are empty or start as a state file does;
  a converter's temp (an ArrayRecord shard's) and a live process's are left alone.
- A DataLoader state file without its "dataset" entry (edited, or a damaged key) failed
  `restore_state` and `CheckpointHandler.restore` with a bare "KeyError: 'dataset'": no file, no advice.
  Now one line, still a KeyError: "Cannot restore <file>: DataLoader state (version 3) has no 'dataset'
  entry, where its position is (keys [...]): it was edited or damaged; restore another checkpoint, or start
  a fresh iterator." The iterator's own set_state says the same, without the file.
- A save on a filesystem out of inodes (many small files: a job's old checkpoints), with space free, said
  "No space left on device ... Free space there or save elsewhere", sending the user to `df -h`, which shows
  space free (the converter already tells the two apart). Now: "Its filesystem has no free inodes left
  (`df -i` shows it), though it has free space: remove files there (old checkpoints?) or save elsewhere",
  from save_state and the Orbax handler alike.
- A shard of an open ArrayRecordSource replaced by a folder or a FIFO mid-read was "changed ... (it was replaced
  by another file, size 131072 -> 4096 bytes)", and one replaced by a broken symbolic link "(it was deleted)"
  (the converter's input check says what is there since round 17). Now "(now it is a directory)", "(now it is
  a FIFO (named pipe))", "(now it is a broken symbolic link (to '...', which does not exist))".
- `ArrayRecordDataSource` given a record range past a shard's end (a TFDS file instruction or a "file[5:30]"
  entry, the shard replaced by a shorter one since) raised "ValueError: Record range [5:30) of <file> is
  outside its 10 records." with nothing on why or what to do, and not Grain's type: Grain reads up to the end
  and then raises a RuntimeError ("index 10 out of bound 10"). Now a RecordRangeError, a ValueError and a
  RuntimeError, that says the file was replaced or cut since the range was made, or that its start is
  negative or after its end.
- (Lead, from the audit's notes) A glob (`d/*.array_record`) or a folder whose matches held a broken link or
  a FIFO passed over it: a dataset short of that shard's records, without a word. Now one line naming the
  pattern or folder and the entry, as for a path given directly; folders among the matches are still
  passed over.
- A ConcatThenSplitIterDataset state whose remainder_slices held a fraction ([1.5, 2]) was taken as [1, 2]
  and resumed at another element; Grain 0.2.18 raises a TypeError in set_state there. Now a
  StateTypeError (a TypeError and a ValueError) naming the key and the value, and the file via restore_state.

Checked and found sound (kept here so they stay so): a save on a full disk (save_state and the Orbax
handler) keeps the previous file and leaves no temp; a save killed midway keeps the earlier checkpoint
and the next save of the same name removes its temp; two processes and two threads saving to one path
while a third process reads it; every truncation of a state file and of an Orbax process file; ArrayRecord
shards with bytes flipped mid-chunk (modification time kept, as bit rot keeps it) read with and without
mp_prefetch workers, and resumed once the file is repaired; shards cut at many offsets or empty; mixes and
packers resumed at every step of a stream in which an input raises, and their bad weights and over-long
elements failing where Grain fails, with Grain's exception type.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import faults_testing as ft
import loader
from loader import ondisk
from loader import python as grain_api

_SAVER = '''
import os, sys
import loader

class Big:
  """An iterator whose state takes a while to write: a save is caught midway."""
  def __init__(self):
    self.i = 0
  def get_state(self):
    return {"i": self.i, "pad": list(range(1_000_000))}

folder, mode = sys.argv[1], sys.argv[2]
it = Big()
for step in range(10**6):
  it.i = step
  loader.checkpoint.save_state(os.path.join(folder, "state.json" if mode == "same" else f"step_{step}.json"), it)
'''


class _State:
  def __init__(self, i):
    self.i = i

  def get_state(self):
    return {"i": self.i}

  def set_state(self, state):
    self.i = state["i"]


def _temps(folder) -> list[str]:
  return sorted(f for f in os.listdir(folder) if ".tmp-" in f)


def _dead_owner() -> ondisk.Owner:
  """The owner record of a process that has exited (and been reaped)."""
  p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                     check=True)
  return ondisk.Owner(pid=int(p.stdout), start=0, host=ondisk.this_process().host)


@pytest.mark.parametrize("mode", ["same", "steps"])
def test_a_save_killed_midway_keeps_the_earlier_checkpoint_and_the_next_save_removes_its_temp(tmp_path, mode):
  folder = tmp_path / "ckpt"
  folder.mkdir()
  script = tmp_path / "saver.py"
  script.write_text(_SAVER)
  proc = subprocess.Popen([sys.executable, str(script), str(folder), mode], env=ft.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    ft.stop_when(lambda: bool(_temps(folder)) and len(os.listdir(folder)) >= 2, proc, what="a save midway")
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.communicate()
  (temp,) = _temps(folder)
  kept = sorted(f for f in os.listdir(folder) if not f.startswith("."))
  assert kept, os.listdir(folder)
  for name in kept:  # Every state the job finished is whole.
    assert isinstance(loader.checkpoint.load_state(folder / name)["i"], int)
  if mode == "steps":
    killed = temp.split(".tmp-")[0][1:]  # The step whose save was cut: it does not exist.
    with pytest.raises(FileNotFoundError) as e:
      loader.checkpoint.load_state(folder / killed)
    assert str(folder / killed) in str(e.value) and "\n" not in str(e.value)
  # The next job saves (another step's name, or the same one): the dead process's temp goes.
  loader.checkpoint.save_state(folder / ("state.json" if mode == "same" else "step_new.json"), _State(7))
  assert _temps(folder) == []
  for name in kept:
    if name != "state.json":
      assert isinstance(loader.checkpoint.load_state(folder / name)["i"], int)
  assert loader.checkpoint.load_state(folder / ("state.json" if mode == "same" else "step_new.json")) == {"i": 7}


def test_a_save_removes_killed_saves_of_other_names_and_leaves_other_temps_alone(tmp_path):
  # A converter's half-written shard of a dead run (its own resume handles it) and a live process's save.
  dead, me = _dead_owner(), ondisk.this_process()
  shard = ondisk.temp_name(str(tmp_path / "data.array_record-00000-of-00001"), dead)
  with open(shard, "wb") as f:
    f.write(ondisk.RIEGELI_SIGNATURE + b"\0" * 100)
  live = ondisk.temp_name(str(tmp_path / "step_9.json"), me)
  with open(live, "w") as f:
    f.write('{\n "format": "arrayrecord-toolkit/loader-state",\n "state"')
  cut = ondisk.temp_name(str(tmp_path / "step_8.json"), dead)
  with open(cut, "w") as f:  # Killed mid-write of a DataLoader's state.
    f.write('{\n "encoding": "json-bytes",\n "format": "arrayrecord-toolkit/loader-state",\n "state": {\n  "da')
  brace = ondisk.temp_name(str(tmp_path / "other.json"), dead)
  with open(brace, "w") as f:
    f.write("{")  # Not recognisably a state: some other program's (tests/test_faults_reader.py keeps it too).
  empty = ondisk.temp_name(str(tmp_path / "step_7.json"), dead)
  open(empty, "w").close()  # Killed between creating and writing.
  loader.checkpoint.save_state(tmp_path / "step_10.json", _State(10))
  assert sorted(os.listdir(tmp_path)) == sorted(
      [os.path.basename(shard), os.path.basename(live), os.path.basename(brace), "step_10.json"])


def test_a_full_disk_keeps_the_previous_checkpoint_and_leaves_no_temp(tmp_path):
  ds = loader.MapDataset.range(100).shuffle(seed=3).to_iter_dataset()
  it = iter(ds)
  next(it)
  with ft.tmpfs(str(tmp_path / "mnt"), "64k") as mnt:
    path = os.path.join(mnt, "state.json")
    loader.checkpoint.save_state(path, it)
    step = os.path.join(mnt, "step_1")
    os.mkdir(step)
    handler = loader.checkpoint.CheckpointHandler()
    handler.save(step, it)
    good, good_process = open(path).read(), open(os.path.join(step, "process_0-of-1.json")).read()
    ft.fill(mnt)
    next(it)
    for save, name in ((lambda: loader.checkpoint.save_state(path, it), path),
                       (lambda: handler.save(step, it), os.path.join(step, "process_0-of-1.json"))):
      with pytest.raises(OSError) as e:
        save()
      line = str(e.value)
      assert "\n" not in line and name in line and "the file is unchanged" in line, line
      assert "Free space there or save elsewhere" in line, line
    assert ft.temps(mnt) == []
    assert open(path).read() == good
    assert open(os.path.join(step, "process_0-of-1.json")).read() == good_process
    resumed = iter(ds)
    loader.checkpoint.restore_state(path, resumed)
    fresh = iter(ds)
    next(fresh)
    assert next(resumed) == next(fresh)


def test_a_filesystem_out_of_inodes_is_told_apart_from_one_out_of_space(tmp_path):
  with ft.tmpfs(str(tmp_path / "mnt"), "1m", inodes=8) as mnt:
    path = os.path.join(mnt, "state.json")
    loader.checkpoint.save_state(path, _State(1))
    os.mkdir(os.path.join(mnt, "step_1"))
    for i in range(100):  # Many small files (a job's old checkpoints) take every inode; space is left.
      try:
        open(os.path.join(mnt, f"old_{i}.json"), "w").close()
      except OSError:
        break
    assert os.statvfs(mnt).f_favail == 0 and os.statvfs(mnt).f_bavail > 0
    before = sorted(os.listdir(mnt))
    handler = loader.checkpoint.CheckpointHandler()
    for save, name, kept in ((lambda: loader.checkpoint.save_state(path, _State(2)), path, "is unchanged"),
                             (lambda: loader.checkpoint.save_state(os.path.join(mnt, "new", "s.json"), _State(2)),
                              os.path.join(mnt, "new", "s.json"), "was not created"),
                             (lambda: handler.save(os.path.join(mnt, "step_1"), _State(2)),
                              os.path.join(mnt, "step_1", "process_0-of-1.json"), "was not created")):
      with pytest.raises(OSError) as e:
        save()
      line = str(e.value)
      assert "\n" not in line and f"cannot save the iterator state to {name}; the file {kept}. Its filesystem " \
          "has no free inodes left (`df -i` shows it), though it has free space: remove files there (old " \
          "checkpoints?) or save elsewhere" in line, line
    assert sorted(os.listdir(mnt)) == before and os.listdir(os.path.join(mnt, "step_1")) == []
    assert loader.checkpoint.load_state(path) == {"i": 1}


_RACER = '''
import os, sys
import loader

class It:
  def __init__(self, tag):
    self.tag, self.i = tag, 0
  def get_state(self):
    return {"tag": self.tag, "i": self.i, "pad": list(range(20000))}

path, role = sys.argv[1], sys.argv[2]
if role == "read":
  seen = 0
  while seen < 150:
    try:
      state = loader.checkpoint.load_state(path)
    except FileNotFoundError:
      continue
    assert "i" in state and len(state.get("pad", range(20000))) == 20000, state  # The threads' states have no pad.
    seen += 1
else:
  it = It(role)
  for i in range(120):
    it.i = i
    loader.checkpoint.save_state(path, it)
print("done")
'''


def test_saves_racing_to_one_path_always_leave_a_whole_state_and_no_temp(tmp_path):
  script = tmp_path / "racer.py"
  script.write_text(_RACER)
  path = tmp_path / "ckpt" / "state.json"
  procs = [subprocess.Popen([sys.executable, str(script), str(path), role], env=ft.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for role in ("a", "b", "read")]
  errors = []

  def save(tag):
    try:
      it = _State(0)
      for i in range(100):
        it.i = (tag, i)
        loader.checkpoint.save_state(path, it)
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=save, args=(t,)) for t in ("c", "d")]
  for t in threads:
    t.start()
  outs = [p.communicate(timeout=120) for p in procs]
  for t in threads:
    t.join(120)
  assert errors == []
  assert [p.returncode for p in procs] == [0, 0, 0], outs
  assert os.listdir(path.parent) == ["state.json"]
  assert "i" in loader.checkpoint.load_state(path)


def _data_loader(workers=0):
  return grain_api.DataLoader(
      data_source=grain_api.RangeDataSource(0, 50, 1),
      sampler=grain_api.IndexSampler(50, grain_api.NoSharding(), shuffle=True, num_epochs=1, seed=1),
      operations=[grain_api.Batch(4)], worker_count=workers)


def test_a_dataloader_state_without_its_dataset_entry_names_the_file(tmp_path):
  it = iter(_data_loader())
  next(it)
  next(it)
  path = tmp_path / "state.json"
  loader.checkpoint.save_state(path, it)
  record = json.loads(path.read_text())
  del record["state"]["dataset"]
  path.write_text(json.dumps(record))
  with pytest.raises(KeyError) as e:  # Still a KeyError, as before (and as Grain's set_state raises there).
    loader.checkpoint.restore_state(path, iter(_data_loader()))
  line = str(e.value)
  assert line.startswith(f"Cannot restore {path}: DataLoader state (version 3) has no 'dataset' entry, where its "
                         "position is (keys ['data_source', "), line
  assert line.endswith("it was edited or damaged; restore another checkpoint, or start a fresh iterator."), line
  assert "\n" not in line
  # The iterator's own set_state says the same without a file (before: a bare KeyError('dataset')).
  with pytest.raises(KeyError, match="DataLoader state .version 3. has no 'dataset' entry"):
    iter(_data_loader()).set_state(json.dumps(record["state"]).encode())
  # The same file in an Orbax step folder, through the handler that CheckpointManager calls.
  step = tmp_path / "step_2"
  step.mkdir()
  handler = loader.checkpoint.CheckpointHandler()
  handler.save(step, it)
  state = json.loads((step / "process_0-of-1.json").read_text())
  del state["dataset"]
  (step / "process_0-of-1.json").write_text(json.dumps(state))
  with pytest.raises(KeyError) as e:
    handler.restore(step, iter(_data_loader()))
  assert str(e.value).startswith(f"Cannot restore {step / 'process_0-of-1.json'}: DataLoader state (version 3) has "
                                 "no 'dataset' entry")


def test_every_truncation_of_a_state_file_is_named_in_one_line(tmp_path):
  it = iter(_data_loader())
  next(it)
  path = tmp_path / "state.json"
  loader.checkpoint.save_state(path, it)
  step = tmp_path / "step"
  step.mkdir()
  handler = loader.checkpoint.CheckpointHandler()
  handler.save(step, it)
  process_file = step / "process_0-of-1.json"
  raw, process_raw = path.read_bytes(), process_file.read_bytes()
  bad = tmp_path / "bad.json"
  for n in range(0, len(raw), 3):
    bad.write_bytes(raw[:n])
    with pytest.raises(ValueError) as e:
      loader.checkpoint.restore_state(bad, iter(_data_loader()))
    assert str(bad) in str(e.value) and "\n" not in str(e.value), (n, str(e.value))
  for n in range(0, len(process_raw), 3):
    process_file.write_bytes(process_raw[:n])
    with pytest.raises(ValueError) as e:
      handler.restore(step, iter(_data_loader()))
    assert str(process_file) in str(e.value) and "\n" not in str(e.value), (n, str(e.value))


def _cts(lib):
  parent = lib.MapDataset.range(1, 20).map(lambda n: {"a": np.arange(n % 5 + 1)}).to_iter_dataset()
  return lib.experimental.ConcatThenSplitIterDataset(parent, length_struct={"a": 8})


def test_a_concat_then_split_state_with_a_fractional_slice_is_refused_as_grain_refuses_it(tmp_path):
  import grain  # pylint: disable=g-import-not-at-top
  raised = {}
  for lib in (grain, loader):
    it = iter(_cts(lib))
    for _ in range(3):
      next(it)
    state = json.loads(json.dumps(it.get_state()))
    assert state["remainder_slices"]["a"] != [-1, -1], state  # A feature was split at this step.
    state["remainder_slices"]["a"][0] = 1.5
    with pytest.raises(TypeError) as e:
      iter(_cts(lib)).set_state(state)
    raised[lib.__name__] = e.value
  line = str(raised["loader"])
  assert "remainder_slices['a'] must be a pair of integers [start, end]" in line and "[1.5, " in line, line
  # A state file edited so: named, one line.
  it = iter(_cts(loader))
  for _ in range(3):
    next(it)
  good, path = tmp_path / "good.json", tmp_path / "state.json"
  loader.checkpoint.save_state(good, it)
  loader.checkpoint.save_state(path, it)
  record = json.loads(path.read_text())
  record["state"]["remainder_slices"]["a"][0] = 1.5
  path.write_text(json.dumps(record))
  with pytest.raises(TypeError) as e:
    loader.checkpoint.restore_state(path, iter(_cts(loader)))
  assert str(e.value).startswith(f"Cannot restore {path}: ") and "\n" not in str(e.value)
  # The state as saved still resumes exactly.
  resumed = iter(_cts(loader))
  loader.checkpoint.restore_state(good, resumed)
  expected = [x["a"].tolist() for x in it]
  assert [x["a"].tolist() for x in resumed] == expected and expected


_SHARDS = '''
import os, sys
import loader

FOLDER = sys.argv[1]
PATH = os.path.join(FOLDER, "s-00001-of-00002.array_record")

def put(data):
  """Writes `data` over the shard in place, keeping its modification time (as bit rot does)."""
  st = os.stat(PATH)
  with open(PATH, "r+b") as f:
    f.write(data)
  os.utime(PATH, ns=(st.st_atime_ns, st.st_mtime_ns))

def flipped(data):
  data = bytearray(data)
  at = len(data) // 8 + 2000  # Inside the chunk of record 12 of 40 (2 KB records).
  for k in range(at, at + 64):
    data[k] ^= 0xFF
  return bytes(data)

def build(workers):
  ds = loader.MapDataset.source(loader.ArrayRecordSource(FOLDER + "/*.array_record")).shuffle(seed=5)
  ds = ds.map(lambda r: r[:6]).to_iter_dataset()
  if workers:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1))
  return ds

if __name__ == "__main__":
  import json
  from array_record.python.array_record_module import ArrayRecordWriter
  for f in range(2):
    w = ArrayRecordWriter(os.path.join(FOLDER, f"s-{f:05d}-of-00002.array_record"), "group_size:1")
    for i in range(40):
      w.write(b"%02d-%02d-" % (f, i) + os.urandom(2000))
    w.close()
  good = open(PATH, "rb").read()
  reference = [r.decode() for r in build(0)]
  out = {"reference": reference}
  for workers in (0, 2):
    put(good)
    ds = build(workers)
    it = iter(ds)
    put(flipped(good))
    got, error = [], None
    while True:
      try:
        got.append(next(it).decode())
      except StopIteration:
        break
      except Exception as e:
        error = {"type": type(e).__name__, "text": str(e), "runtime": isinstance(e, RuntimeError)}
        break
    state = it.get_state()
    put(good)  # Repaired from a good copy; the job resumes from the state saved after the error.
    resumed = iter(ds)
    resumed.set_state(state)
    out[str(workers)] = {"got": got, "error": error, "rest": [r.decode() for r in resumed]}
    for i in (it, resumed):
      if hasattr(i, "close"):
        i.close()
  print(json.dumps(out))
'''


def test_bit_rot_in_a_shard_names_file_record_and_offset_with_and_without_workers(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(_SHARDS)
  data = tmp_path / "data"
  data.mkdir()
  p = subprocess.run([sys.executable, str(script), str(data)], cwd=str(tmp_path), env=ft.env(),
                     capture_output=True, text=True, timeout=240)
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout.splitlines()[-1])
  reference = out["reference"]
  assert len(reference) == 80
  shard = str(data / "s-00001-of-00002.array_record")
  for workers in ("0", "2"):
    r = out[workers]
    error = r["error"]
    assert error is not None and error["type"] == "CorruptRecordError" and error["runtime"], (workers, error)
    line = error["text"]
    assert "\n" not in line, line
    assert line.startswith(f"{shard}: record 12 (index 52 of the source) is corrupt: "), line
    assert "chunk data hash mismatch" in line and "at byte " in line, line
    assert line.endswith("Re-create the file (e.g. convert it again with --overwrite) or restore it from a good "
                         "copy."), line
    # Nothing wrong handed out before it; the resume goes on after the failed element (an error consumes it).
    n = len(r["got"])
    assert r["got"] == reference[:n] and reference[n] == "01-12-"
    assert r["rest"] == reference[n + 1:]
  assert out["0"] == out["2"]  # The worker count changes nothing.


def test_cut_and_empty_shards_are_named_as_grain_fails_on_them(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  import grain  # pylint: disable=g-import-not-at-top
  whole = tmp_path / "whole.array_record"
  w = ArrayRecordWriter(str(whole), "group_size:1")
  for _ in range(60):
    w.write(os.urandom(1500))
  w.close()
  raw = whole.read_bytes()
  cut = tmp_path / "cut.array_record"
  for n in (0, 997, len(raw) // 2, len(raw) - 65536, len(raw) - 100, len(raw) - 1):
    cut.write_bytes(raw[:n])
    with pytest.raises(RuntimeError):  # Grain's type.
      grain.sources.ArrayRecordDataSource([str(cut)])
    with pytest.raises(RuntimeError) as e:
      loader.sources.ArrayRecordDataSource([str(cut)])
    line = str(e.value)
    assert "\n" not in line and line.startswith(str(cut)), line
    assert ("it is empty (0 bytes)" if n == 0 else "probably truncated") in line, line


@pytest.mark.parametrize("put", ["folder", "fifo", "broken link"])
def test_a_shard_replaced_by_a_folder_fifo_or_broken_link_mid_read_says_so(tmp_path, put):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  for f in range(2):
    w = ArrayRecordWriter(str(tmp_path / f"s{f}.array_record"), "group_size:1")
    for i in range(10):
      w.write(b"%d-%d" % (f, i))
    w.close()
  src = loader.ArrayRecordSource(str(tmp_path / "*.array_record"))
  assert src.read([0, 12]) == [b"0-0", b"1-2"]  # Both files open.
  shard = str(tmp_path / "s1.array_record")
  os.replace(shard, shard + ".moved")  # A sync tool or an archive put something else at its name.
  {"folder": lambda: os.mkdir(shard), "fifo": lambda: os.mkfifo(shard),
   "broken link": lambda: os.symlink(shard + ".gone", shard)}[put]()
  error = ft.in_time(lambda: src.read([13]))  # In time: a FIFO opened for reading would wait for ever.
  assert isinstance(error, loader.source.FileChangedError), error
  now = {"folder": "now it is a directory", "fifo": "now it is a FIFO (named pipe)",
         "broken link": f"now it is a broken symbolic link (to {shard + '.gone'!r}, which does not exist)"}[put]
  line = str(error)
  # It said "(it was replaced by another file, size 131072 -> 4096 bytes)", or for the link "(it was deleted)".
  assert line.startswith(f"{shard} changed after the ArrayRecordSource was created ({now}) while reading record 3 "
                         "(index 13 of the source); "), line
  assert "\n" not in line


class _FileInstruction:  # What TFDS hands Grain's ArrayRecordDataSource.

  def __init__(self, filename, skip, take, examples_in_shard):
    self.filename, self.skip, self.take, self.examples_in_shard = filename, skip, take, examples_in_shard


def test_a_record_range_past_a_replaced_shards_end_names_the_file_and_is_grains_runtime_error(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  import grain  # pylint: disable=g-import-not-at-top
  shard = str(tmp_path / "train.array_record-00000-of-00001")
  w = ArrayRecordWriter(shard, "group_size:1")
  for i in range(10):  # Replaced by a shorter shard since the dataset's metadata said 30 records.
    w.write(b"r%d" % i)
  w.close()
  for paths in ([_FileInstruction(shard, 5, 25, 30)], [f"{shard}[5:30]"]):
    src = grain.sources.ArrayRecordDataSource(paths)
    with pytest.raises(RuntimeError):  # Grain, at the first record past the end: "index 10 out of bound 10".
      [src[i] for i in range(len(src))]  # pylint: disable=expression-not-assigned
    with pytest.raises(RuntimeError) as e:  # Loader, at once; a ValueError too, as before.
      loader.sources.ArrayRecordDataSource(paths)
    assert isinstance(e.value, ValueError)
    assert str(e.value) == (
        f"Record range [5:30) of {shard} is outside its 10 records: it ends past the file's last record: is the "
        "range (a '[start:end]' suffix, or a TFDS file instruction's skip and take) right? If it was, the file was "
        "replaced by a shorter one or cut since; check the file, or read a range within [0:10].")


_BAD = {4, 11}


def _check(x):
  if int(x["id"] if isinstance(x, dict) else x) in _BAD:
    raise ValueError(f"bad element {x}")
  return x


def _element(n):
  return {"id": n, "a": np.arange(n % 5 + 1) + n}


def _features(e):
  return {"a": e["a"]}


def _raising_pipelines(lib):
  packed = lambda: lib.MapDataset.range(20).map(_element).map(_check).map(_features).to_iter_dataset()
  return {
      "IterDataset.mix": lambda: lib.IterDataset.mix(
          [lib.MapDataset.range(20).map(_check).to_iter_dataset(), lib.MapDataset.range(100, 110).to_iter_dataset()],
          [2, 1]),
      "MapDataset.mix": lambda: lib.MapDataset.mix(
          [lib.MapDataset.range(20).map(_check), lib.MapDataset.range(100, 110)], [2, 1]).to_iter_dataset(),
      "FirstFitPack": lambda: lib.experimental.FirstFitPackIterDataset(packed(), length_struct={"a": 8},
                                                                       num_packing_bins=2),
      "BestFitPack": lambda: lib.experimental.BestFitPackIterDataset(packed(), length_struct={"a": 8},
                                                                     num_packing_bins=2),
      "ConcatThenSplit": lambda: lib.experimental.ConcatThenSplitIterDataset(packed(), length_struct={"a": 8}),
      "ConcatThenSplit(iter map)": lambda: lib.experimental.ConcatThenSplitIterDataset(
          lib.MapDataset.range(20).map(_element).to_iter_dataset().map(_check).map(_features),
          length_struct={"a": 8}),
  }


def _shown(x):
  if isinstance(x, dict):
    return {k: np.asarray(v).tolist() for k, v in x.items()}
  return np.asarray(x).tolist()


def _stream(it, limit=40):
  out = []
  for _ in range(limit):
    try:
      out.append(_shown(next(it)))
    except StopIteration:
      return out + ["end"]
    except ValueError as e:
      out.append(f"error: {e}")
  return out


@pytest.mark.parametrize("name", list(_raising_pipelines(loader)))
def test_mixes_and_packers_resume_at_every_step_of_a_stream_with_errors(name):
  make = _raising_pipelines(loader)[name]
  it = iter(make())
  states, stream = [], []
  while not stream or stream[-1] != "end":
    states.append(it.get_state())
    stream.extend(_stream(it, 1))
  assert sum(str(x).startswith("error: bad element") for x in stream) == 2, stream
  for k, state in enumerate(states):
    resumed = iter(make())
    resumed.set_state(json.loads(json.dumps(state)))  # Through a state file's JSON.
    assert _stream(resumed) == stream[k:], (name, k)


def test_bad_mix_weights_and_long_packed_elements_fail_where_grain_fails_with_its_type():
  import grain  # pylint: disable=g-import-not-at-top
  cases = {
      "zero weight": lambda g: g.MapDataset.mix([g.MapDataset.range(3), g.MapDataset.range(5)], [0, 1]),
      "negative weight": lambda g: list(g.MapDataset.mix([g.MapDataset.range(3), g.MapDataset.range(5)], [-1, 1])),
      "NaN weight": lambda g: list(g.IterDataset.mix(
          [g.MapDataset.range(3).to_iter_dataset(), g.MapDataset.range(5).to_iter_dataset()], [math.nan, 1])),
      "infinite weight": lambda g: list(g.IterDataset.mix(
          [g.MapDataset.range(3).to_iter_dataset(), g.MapDataset.range(5).to_iter_dataset()], [math.inf, 1])),
      "empty input": lambda g: len(g.MapDataset.mix([g.MapDataset.range(0), g.MapDataset.range(5)])),
      "too long": lambda g: list(g.experimental.FirstFitPackIterDataset(
          g.MapDataset.source([{"a": np.arange(3)}, {"a": np.arange(12)}]).to_iter_dataset(),
          length_struct={"a": 8}, num_packing_bins=2)),
      "missing feature": lambda g: list(g.experimental.BestFitPackIterDataset(
          g.MapDataset.source([{"a": np.arange(3), "b": np.arange(3)}, {"a": np.arange(2)}]).to_iter_dataset(),
          length_struct={"a": 8, "b": 8}, num_packing_bins=2)),
  }
  for what, case in cases.items():
    with pytest.raises(Exception) as grain_error:
      case(grain)
    with pytest.raises(type(grain_error.value)) as loader_error:
      case(loader)
    assert "\n" not in str(loader_error.value), (what, str(loader_error.value))
  # The empty input of an IterDataset.mix ends the mixture, as on Grain.
  mix = lambda g: list(g.IterDataset.mix([g.MapDataset.range(0).to_iter_dataset(),
                                          g.MapDataset.range(5).to_iter_dataset()]))
  assert mix(loader) == mix(grain) == []


def test_a_broken_link_or_fifo_among_a_patterns_or_folders_shards_is_refused_not_passed_over(tmp_path):
  """Before, `*.array_record` and a folder passed over a broken link or a FIFO: a dataset short of a shard."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "d"
  folder.mkdir()
  for f in range(2):
    w = ArrayRecordWriter(str(folder / f"s{f}.array_record"), "group_size:1")
    for r in range(3):
      w.write(b"%d" % r)
    w.close()
  (folder / "sub.array_record").mkdir()  # A folder among the matches is passed over, as before.
  pattern = str(folder / "*.array_record")
  assert len(loader.ArrayRecordSource(pattern)) == len(loader.ArrayRecordSource(str(folder))) == 6
  link = folder / "s2.array_record"
  os.symlink(tmp_path / "moved.array_record", link)
  for given, how in ((pattern, "matches"), (str(folder), "holds")):
    with pytest.raises(FileNotFoundError) as e:
      loader.ArrayRecordSource(given)
    assert str(e.value) == (
        f"{given} {how} {link}, which cannot be read: ArrayRecord file not found: {link}: it is a broken symbolic "
        f"link (to '{tmp_path / 'moved.array_record'}', which does not exist); fix or remove the link.")
  link.unlink()
  os.mkfifo(folder / "s3.array_record")
  for given in (pattern, str(folder)):
    with pytest.raises(ValueError, match=r"s3.array_record, which cannot be read: .* is not an ArrayRecord file: it "
                                         r"is a FIFO \(named pipe\)"):
      loader.ArrayRecordSource(given)
