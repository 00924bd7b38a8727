"""Round 21 of the fault audit (loader): what workers hand back, iterators pickled or copied, a source's
batched read that skips a record, segments removed from /dev/shm by another process, and too few file
descriptors to start the workers.

Found by the 2026-12-05 loader fault audit, each case run with real worker processes and real ArrayRecord
files before the fix:

- A map that returns big-endian arrays (`np.frombuffer(record, ">u4").copy()`, network-order fields) gave
  them as ">u4" without workers (and in Grain) but as "<u4" from mp_prefetch workers, for every chunk of 16
  or more dict elements: the small-element columns were joined with np.concatenate, which makes the byte
  order native. The values compared equal, but `tobytes()`, `view()` and the element spec differed with the
  worker count.
- An mp_prefetch (or DataLoader) iterator pickled or deep-copied before its workers started made a copy whose
  first next() said "close() was called while it waited for a worker" (nobody had); after they started,
  pickle said "Pickling an AuthenticationString object is disallowed". Grain raises TypeError for both.
- A source with Grain's batched-read protocol (`_getitems`) that returned one record fewer or more than asked
  (a skipped record, an added one, a batch of columns) shifted every later record to another position and
  batch with no error, differently for each worker count; Grain 0.2.18 reads a source by index and gives
  every record in order.
- An exception raised in a worker whose class takes other __init__ arguments than its args (it pickles but
  does not unpickle: botocore's ClientError, a user's BadRecordError(path, index)), or which holds a lock,
  came back as a loader.WorkerError that `except BadRecordError` missed, though it was itself without workers.
- A worker's result segment removed from /dev/shm by another process before the consumer read it
  (systemd-logind's RemoveIPC=yes at logout under a nohup job, a job that empties /dev/shm) raised
  "FileNotFoundError: [Errno 2] No such file or directory: '/arl<pid>_<hex>_1_1'" out of next(), and the
  resource tracker warned at exit about each such segment; the chunk can be, and now is, computed again. The
  segment that takes a large pipeline to starting workers, removed so, was a bare "No such file or directory:
  '/arl<pid>_<hex>_start1'"; it is named now, and the next call starts the workers again, as it did.
- Too low a RLIMIT_NOFILE to start the workers raised a bare "OSError: [Errno 24] Too many open files" out of
  multiprocessing's spawn, not saying which limit or what to do (the source's own EMFILE error did).
"""

from __future__ import annotations

import copy
import errno
import functools
import os
import pickle
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import faults_testing as ft
import loader
from loader_testing import record_bytes, shm_segments, write_array_records


def _network_order(record: bytes) -> dict:
  # A writeable copy (as for torch.from_numpy) of big-endian fields.
  return {"fields": np.frombuffer(record, dtype=">u4").copy(), "n": np.frombuffer(record[:8], "<i8").copy()}


def test_big_endian_arrays_come_back_from_workers_in_their_byte_order(tmp_path):
  paths = write_array_records(tmp_path, 2, 300)
  src = loader.ArrayRecordSource(paths)
  base = loader.MapDataset.source(src).map(_network_order).to_iter_dataset()
  want = list(base)
  assert {e["fields"].dtype.str for e in want} == {">u4"}
  before = shm_segments()
  got = list(base.mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
  assert len(got) == len(want) == 600
  assert {e["fields"].dtype.str for e in got} == {">u4"}, "byte order changed on the way from the workers"
  for g, w in zip(got, want):
    assert g["fields"].tobytes() == w["fields"].tobytes() == record_bytes(int(w["n"][0]))
    assert g["fields"].flags.writeable
  assert shm_segments() <= before


def _times_ten(x):
  return x * 10


@pytest.mark.parametrize("started", [False, True])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_an_iterator_with_workers_refuses_to_be_pickled_or_copied_and_goes_on(started, how):
  # Grain raises TypeError for both. Before the workers started, the copy was made (with a dead finalizer)
  # and its first next() said "close() was called while it waited for a worker", which nobody had called;
  # after, pickle said "Pickling an AuthenticationString object is disallowed for security reasons".
  ds = loader.MapDataset.range(20).map(_times_ten).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1))
  it = iter(ds)
  first = [next(it), next(it)] if started else []
  with pytest.raises(TypeError) as e:
    pickle.loads(pickle.dumps(it)) if how == "pickle" else copy.deepcopy(it)
  assert str(e.value).startswith("An iterator of MapDataset.source(range(0, 20)).map(_times_ten) with worker "
                                 "processes cannot be pickled or copied; save its get_state() and set_state() it "
                                 "into a new iterator."), str(e.value)
  assert first + list(it) == [x * 10 for x in range(20)]  # The original goes on.
  it.close()


class _SkipsEmptyRecords:
  """A source with Grain's batched-read protocol whose `_getitems` drops records it takes for empty.

  Grain 0.2.18 reads a source by index, so it never calls this `_getitems` (only behind an experiment flag):
  its stream is every record, in order.
  """

  def __init__(self, paths):
    self._src = loader.ArrayRecordSource(paths)

  def __len__(self):
    return len(self._src)

  def __getitem__(self, index):
    return self._src[index]

  def _getitems(self, indices):
    return [r for r in self._src.read(indices) if int.from_bytes(r[:8], "little") % 50 != 7]


def _index_of(record: bytes) -> int:
  return int.from_bytes(record[:8], "little")


def _grain():
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.mark_as_parsed()
  import grain  # pylint: disable=g-import-not-at-top
  return grain


@pytest.mark.filterwarnings("ignore:_SkipsEmptyRecords._getitems returned:RuntimeWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sources_batched_read_that_skips_a_record_shifts_nothing(tmp_path, num_workers):
  # Loader read such a source with its `_getitems`: 6 of 300 records went missing and every later one moved
  # to another position (and batch), differently for each worker count, with no error; Grain gives all 300.
  paths = write_array_records(tmp_path, 2, 150)
  grain = _grain()
  want = [_index_of(r) for r in grain.MapDataset.source(_SkipsEmptyRecords(paths)).to_iter_dataset()]
  assert want == list(range(300))
  ds = loader.MapDataset.source(_SkipsEmptyRecords(paths)).map(_index_of).to_iter_dataset()
  if num_workers:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=num_workers))
    assert list(ds) == want
  else:
    with pytest.warns(RuntimeWarning, match=r"^_SkipsEmptyRecords\._getitems returned \d+ records for \d+ "
                                            r"indices; the source is read one index at a time instead"):
      assert list(ds) == want
  batches = [b.tolist() for b in loader.MapDataset.source(_SkipsEmptyRecords(paths)).map(_index_of).batch(8)]
  assert batches == [want[i:i + 8] for i in range(0, 300, 8)]


class BadRecordError(Exception):
  """An exception whose __init__ takes other arguments than its args: it pickles, but does not unpickle."""

  def __init__(self, path, index):
    super().__init__(f"{path}: record {index} does not parse")
    self.path, self.index = path, index


class HoldsALockError(Exception):
  """An exception with an attribute that does not pickle (a lock, an open file, a client)."""

  def __init__(self, message):
    super().__init__(message)
    self.lock = threading.Lock()
    self.record = 9


def _parse_or_raise(record: bytes) -> int:
  i = _index_of(record)
  if i % 20 == 7:
    raise BadRecordError("shard.array_record", i)
  if i % 20 == 9:
    raise HoldsALockError(f"record {i}: the tokenizer client is gone")
  return i


def _outcomes(it, n, caught=None):
  """The first n elements of `it`, each error of `caught` (type -> its fields as a tuple) in its place."""
  caught = caught or {
      BadRecordError: lambda e: ("bad", e.path, e.index, str(e)),
      HoldsALockError: lambda e: ("lock", e.record, str(e)),
  }
  out = []
  for _ in range(n):
    try:
      out.append(next(it))
    except StopIteration:
      break
    except tuple(caught) as e:
      out.append(next(f for t, f in caught.items() if isinstance(e, t))(e))
  return out


def test_a_workers_exception_that_does_not_unpickle_is_still_raised_as_itself(tmp_path):
  # Both were a loader.WorkerError ("Worker 0 (pid ...) raised while computing element 7 ...") that
  # `except BadRecordError` did not catch; without workers (and in Grain's own thread) they are themselves.
  paths = write_array_records(tmp_path, 1, 40)
  base = loader.MapDataset.source(loader.ArrayRecordSource(paths)).map(_parse_or_raise).to_iter_dataset()
  want = _outcomes(iter(base), 50)
  assert ("bad", "shard.array_record", 7, "shard.array_record: record 7 does not parse") in want
  assert ("lock", 9, "record 29: the tokenizer client is gone") in want
  before = shm_segments()
  it = iter(base.mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
  assert _outcomes(it, 50) == want  # Each at its position, the stream going on after it.
  it.close()
  assert shm_segments() <= before


class ShardMissingError(FileNotFoundError):
  """An OSError subclass built from a path: errno, strerror and filename are C fields, not args."""

  def __init__(self, path):
    super().__init__(errno.ENOENT, os.strerror(errno.ENOENT), path)


class SlottedError(Exception):
  """An exception keeping its field in __slots__, which its __str__ reads."""

  __slots__ = ("path",)

  def __init__(self, path):
    super().__init__()
    self.path = path

  def __str__(self):
    return f"bad record in {self.path}"


def _raise_odd_errors(x: int) -> int:
  if x == 3:
    raise ShardMissingError(f"/data/shard-{x}.array_record")
  if x == 5:
    raise SlottedError(f"/data/shard-{x}")
  return x


def _odd_outcomes(it, n):
  return _outcomes(it, n, {
      ShardMissingError: lambda e: ("missing", e.errno, e.strerror, e.filename, str(e)),
      SlottedError: lambda e: ("slotted", e.path, str(e)),
  })


def test_a_workers_oserror_subclass_and_slotted_exception_come_back_whole():
  # Rebuilt without their C fields / slots they were a ShardMissingError with
  # errno None and str "(2, 'No such file or directory')", and a SlottedError
  # whose str() raised AttributeError (found by review of the revival above).
  base = loader.MapDataset.range(8).map(_raise_odd_errors).to_iter_dataset()
  want = _odd_outcomes(iter(base), 10)
  assert want[3] == ("missing", errno.ENOENT, os.strerror(errno.ENOENT), "/data/shard-3.array_record",
                     f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}: '/data/shard-3.array_record'")
  assert want[5] == ("slotted", "/data/shard-5", "bad record in /data/shard-5")
  it = iter(base.mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
  assert _odd_outcomes(it, 10) == want
  it.close()


def _reopen(path):
  return open(path, "rb")


class _Reopens:
  """An element part that reopens its file when unpickled, here a file only the worker made."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return _reopen, (self.path,)


def _with_a_handle_made_in_the_worker(x: int, folder: str = "") -> dict:
  path = os.path.join(folder, f"made-by-{os.getpid()}")
  with open(path, "wb"):
    pass
  os.remove(path)  # Gone before the parent unpickles the element.
  return {"a": np.full((300_000,), x % 251, np.uint8), "h": _Reopens(path)}  # A segment, not inline.


def test_an_element_whose_unpickling_raises_file_not_found_is_not_called_a_removed_segment(tmp_path):
  # Was retried 4 times, then replaced by advice about systemd-logind's RemoveIPC.
  fn = functools.partial(_with_a_handle_made_in_the_worker, folder=str(tmp_path))
  it = iter(loader.MapDataset.range(4).map(fn).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1)))
  with pytest.raises(FileNotFoundError) as e:
    next(it)
  it.close()
  assert "RemoveIPC" not in str(e.value) and str(tmp_path) in str(e.value)


def _run_script(folder, text: str) -> subprocess.CompletedProcess:
  """Runs `text` as a training script (its own __main__, as workers need) that must exit 0."""
  script = folder / "train.py"
  script.write_text(text)
  proc = subprocess.run([sys.executable, str(script)], cwd=str(folder), env=ft.env(), capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  return proc


_SEGMENTS_REMOVED = """
import os
import sys
import time

import numpy as np

import loader

def f(x):
  return {"a": np.full((300_000,), x % 251, np.uint8)}  # Over the inline limit: each chunk is a segment.

def ours():
  return [n for n in os.listdir("/dev/shm") if n.startswith(f"arl{os.getpid()}_")]

if __name__ == "__main__":
  it = iter(loader.MapDataset.range(40).map(f).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2)))
  got = [int(next(it)["a"][0])]
  deadline = time.time() + 30
  while len(ours()) < 2 and time.time() < deadline:  # Results wait, computed, for the consumer.
    time.sleep(0.05)
  removed = ours()
  for name in removed:  # What systemd-logind's RemoveIPC=yes does at logout, or a job emptying /dev/shm.
    os.unlink("/dev/shm/" + name)
  got += [int(e["a"][0]) for e in it]
  assert got == [x % 251 for x in range(40)], got
  print("removed", len(removed), "left", len(ours()))
"""


def test_segments_removed_from_dev_shm_by_another_process_lose_nothing(tmp_path):
  # Raised "FileNotFoundError: [Errno 2] No such file or directory: '/arl<pid>_<hex>_1_1'" out of next(),
  # naming a segment the user never made and ending the training loop, and the resource tracker warned at
  # exit about each removed segment: the chunks can be computed again, and are.
  proc = _run_script(tmp_path, _SEGMENTS_REMOVED)
  removed, left = proc.stdout.split()[1::2]
  assert int(removed) >= 2 and int(left) == 0
  assert "resource_tracker" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _big(x):
  return {"a": np.full((300_000,), x % 251, np.uint8)}


def test_segments_removed_again_and_again_lose_nothing_and_any_error_names_the_cause_in_one_line():
  # A cleaner that empties /dev/shm every 2 ms takes most results before the consumer maps them. Each loss
  # was a bare "[Errno 2] No such file or directory: '/arl..._0_3'"; now a chunk is computed again, and only
  # after 4 losses in a row does next() raise, in one line saying what removes them and that nothing is lost.
  prefix = f"arl{os.getpid()}_"
  stop = threading.Event()

  def empty_dev_shm():
    while not stop.is_set():
      for name in shm_segments(prefix):
        try:
          os.unlink("/dev/shm/" + name)
        except FileNotFoundError:
          pass
      time.sleep(0.002)

  it = iter(loader.MapDataset.range(30).map(_big).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2)))
  got, errors = [int(next(it)["a"][0])], []
  cleaner = threading.Thread(target=empty_dev_shm, daemon=True)
  cleaner.start()
  try:
    while len(got) < 15 and len(errors) < 10:
      time.sleep(0.02)  # The consumer's own work: results wait in /dev/shm meanwhile.
      try:
        got.append(int(next(it)["a"][0]))
      except FileNotFoundError as e:
        errors.append(str(e))
  finally:
    stop.set()
    cleaner.join()
  got += [int(x["a"][0]) for x in it]
  assert got == [x % 251 for x in range(30)]
  for message in errors:
    assert "\n" not in message and message.startswith("[Errno 2] /dev/shm/" + prefix), message
    assert "was removed by another process before this one read it, 4 times in a row" in message
    assert "RemoveIPC=no in /etc/systemd/logind.conf" in message and "Nothing was lost" in message
  assert not shm_segments(prefix)


_FEW_FILES = """
import multiprocessing
import os
import resource

import loader

def f(x):
  return x

if __name__ == "__main__":
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  it = iter(loader.MapDataset.range(50).map(f).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=4)))
  resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
  try:
    next(it)
  except OSError as e:
    print(type(e).__name__, "|", e)
    print("children", len(multiprocessing.active_children()))
  resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # What the error says to do.
  assert list(it) == list(range(50))  # Nothing lost: the same iterator goes on from its start.
  it.close()
  print("left", len(multiprocessing.active_children()),
        len([n for n in os.listdir("/dev/shm") if n.startswith(f"arl{os.getpid()}_")]))
"""


def test_too_few_file_descriptors_to_start_the_workers_says_so_and_loses_nothing(tmp_path):
  # Was "OSError: [Errno 24] Too many open files" out of multiprocessing's spawn, with no word of the limit,
  # of workers or of what to do.
  proc = _run_script(tmp_path, _FEW_FILES)
  lines = proc.stdout.splitlines()
  kind, message = lines[0].split(" | ")
  assert kind == "TooManyOpenFilesError", lines[0]
  assert message.startswith("[Errno 24] Cannot start worker ") and " of 4 for MapDataset.source(range(0, 50))" \
      ".map(f): Too many open files (each worker takes a few files" in message, message
  assert "raise the open-file limit (now " in message and "`ulimit -n 65536`" in message and "MultiprocessingOptions(num_workers=...)" in message
  assert lines[2] == "left 0 0", proc.stdout
  assert "Traceback" not in proc.stderr, proc.stderr


_START_SEGMENT_REMOVED = """
import multiprocessing
import os
import time

import loader

if __name__ != "__main__":
  time.sleep(1.5)  # The workers' imports (they run the script's top level first): the segment waits meanwhile.

def f(x):
  return len(x)

if __name__ == "__main__":
  source = ["x" * 20_000] * 6  # Over the inline limit: the pipeline goes to the workers in a segment.
  it = iter(loader.MapDataset.source(source).map(f).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2)))
  it.start_prefetch()
  time.sleep(0.3)
  removed = [n for n in os.listdir("/dev/shm") if n.startswith(f"arl{os.getpid()}_")]
  for name in removed:
    os.unlink("/dev/shm/" + name)
  print("removed", removed)
  try:
    next(it)
  except FileNotFoundError as e:
    print("error |", e)
  assert list(it) == [20_000] * 6
  it.close()
  print("left", len(multiprocessing.active_children()),
        len([n for n in os.listdir("/dev/shm") if n.startswith(f"arl{os.getpid()}_")]))
"""


def test_the_start_segment_removed_by_another_process_is_named_and_the_next_call_starts_again(tmp_path):
  # Was "FileNotFoundError: [Errno 2] No such file or directory: '/arl<pid>_<hex>_start1'".
  proc = _run_script(tmp_path, _START_SEGMENT_REMOVED)
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("removed ['arl") and lines[0].endswith("_start1']"), proc.stdout
  message = re.sub(r"before worker [01] read it", "before worker N read it", lines[1].split(" | ", 1)[1])
  assert message.startswith("[Errno 2] /dev/shm/arl") and message.endswith(
      "_start1 (the pipeline sent to the starting workers) was removed by another process before worker N "
      "read it: something empties /dev/shm under the running job (systemd-logind's RemoveIPC=yes at logout: set "
      "RemoveIPC=no in /etc/systemd/logind.conf or run the job as a system user; or a cleanup job). Nothing was "
      "lost: next() starts the workers again"), message
  assert lines[2] == "left 0 0", proc.stdout
