"""Round 25 of the fault audit: the loader's multiprocess runtime under bad luck and odd user code.

Found by the 2026-12-06 fault audit, each case run against the real loader before the fix:

- Two threads calling next() on one iterator with mp_prefetch workers read the workers' pipes at once and tore
  their messages apart: "UnpicklingError: invalid load key, '\\x00'", then "Worker 0 ... exited unexpectedly with
  no exit code yet (still exiting)" or "This iterator was closed (close() was called while it waited ...)" when
  nobody had called close(), and 8 to 21 of 40 elements lost. Grain's iterator reads from queues, which two
  threads may share; now a consumer takes the pool's lock once per chunk and every element comes once (a fork
  made while another thread holds that lock is still told to make its own iterator, and does not wait on it).
- The same without workers (`to_iter_dataset()` reading ahead in threads): three threads calling next() lost
  about 2,500 of 20,000 elements, got about 470 twice, and two of them raised "IndexError: pop from an empty
  deque". Grain 0.2.18 gives every element once there (its threads still end in that IndexError); now so does
  the loader, without the IndexError.
- A worker_init_fn that called sys.exit(2) was raised again in the consumer as SystemExit(2): a training script
  catching `except Exception` around its loop exited with status 2 and printed nothing at all. (Grain 0.2.18,
  run the same way, failed with "UnparsedFlagAccessError: Trying to access flag
  --grain_enable_multiprocess_worker_profiling before flags were parsed.") A KeyboardInterrupt raised there came
  back as a Ctrl-C the user never pressed. Both are now one-line WorkerErrors saying what the worker did.
- A map or source that called sys.exit(3) / os._exit(3) in a worker was "exited unexpectedly with exit code 3
  ... A negative code is the signal that killed it": it did not say what a positive code means or what to do.
- With the open-file limit reached in the consumer (a program that keeps many files open), reading a worker's
  result said only "OSError: [Errno 24] Too many open files": not which segment, which elements, what to do, nor
  that nothing was lost.

Checked and found sound (kept here so they stay so): a worker SIGKILLed mid-chunk under a DataLoader, a source
file deleted, replaced or cut while workers read it, set_state on a running iterator with another pipeline's or
a damaged state, an element far bigger than a result segment, close() from another thread while two threads wait
on a hung worker_init_fn. Each case checks that no worker process and no /dev/shm segment of the run is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import faults_testing as ft

_PRELUDE = '''
import gc, glob, json, os, sys, threading, time
import numpy as np
import psutil
import loader
from loader import python as grain

def segments():
  return sorted(p for p in glob.glob("/dev/shm/*") if os.path.basename(p).startswith(f"arl{os.getpid()}_"))

def workers():
  return [p.pid for p in psutil.Process().children(recursive=True)
          if "resource_tracker" not in " ".join(p.cmdline())]

def error(fn):
  try:
    fn()
  except BaseException as e:  # What the user's `except` sees, SystemExit included.
    return {"type": type(e).__name__, "text": str(e), "notes": getattr(e, "__notes__", [])}
  return None

def leftovers(result, *iterators):
  for it in iterators:
    it.close()
  del iterators
  gc.collect()
  deadline = time.time() + 10
  while (workers() or segments()) and time.time() < deadline:
    time.sleep(0.1)
  result.update(workers=workers(), segments=segments())
  print(json.dumps(result))
'''


def _run(tmp_path, body: str, timeout: float = 120) -> dict:
  script = tmp_path / "train.py"
  script.write_text(_PRELUDE + textwrap.dedent(body))
  p = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=ft.env(), capture_output=True,
                     text=True, timeout=timeout)
  assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-3000:])
  result = json.loads(p.stdout.splitlines()[-1])
  assert result.pop("workers") == [], result
  assert result.pop("segments") == [], result
  result["stderr"] = p.stderr
  return result


def _one_line(e: dict) -> str:
  assert e is not None
  assert "\n" not in e["text"], e["text"]
  return e["text"]


def test_two_threads_calling_next_on_one_iterator_get_every_element_once(tmp_path):
  r = _run(tmp_path, '''
    def f(x):
      time.sleep(0.01)
      return {"x": x, "a": np.full((1000,), x)}

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(60).map(f).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2)))
      got, errors = [], []
      def consume():
        try:
          for e in it:
            assert (e["a"] == e["x"]).all()
            got.append(e["x"])
        except BaseException as e:
          errors.append(f"{type(e).__name__}: {e}")
      threads = [threading.Thread(target=consume) for _ in range(3)]
      for t in threads:
        t.start()
      for t in threads:
        t.join(60)
      leftovers({"got": sorted(got), "errors": errors, "hung": any(t.is_alive() for t in threads)}, it)
  ''')
  assert r["errors"] == [] and not r["hung"]
  assert r["got"] == list(range(60))


def test_close_from_another_thread_ends_two_waiting_consumers(tmp_path):
  r = _run(tmp_path, '''
    def init(index, count):
      time.sleep(1000)  # A worker_init_fn that hangs (a lock, a network mount).

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(20).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      ends = []
      def consume():
        ends.append(error(lambda: list(it)))
      threads = [threading.Thread(target=consume, daemon=True) for _ in range(2)]
      for t in threads:
        t.start()
      time.sleep(2)
      it.close()
      for t in threads:
        t.join(15)
      leftovers({"ends": ends, "hung": any(t.is_alive() for t in threads)})
  ''')
  assert not r["hung"]
  assert [e["type"] for e in r["ends"]] == ["ClosedWhileWaitingError"] * 2
  assert "close() was called while it waited for a worker" in _one_line(r["ends"][0])


def test_a_worker_init_fn_calling_sys_exit_does_not_end_the_consumers_program_quietly(tmp_path):
  r = _run(tmp_path, '''
    def init(index, count):
      sys.exit(2)

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(20).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      try:
        next(it)
        first = None
      except Exception as e:  # What a training loop catches; SystemExit went past it and ended the script.
        first = {"type": type(e).__name__, "text": str(e)}
      leftovers({"first": first, "again": error(lambda: next(it))}, it)
  ''')
  line = _one_line(r["first"])
  assert r["first"]["type"] == "WorkerError"
  assert line.startswith("Worker ") and "failed to start: it called sys.exit(2), which ends a worker; raise an " \
                                          "exception instead" in line, line
  assert r["again"]["type"] == "WorkerError"


def test_a_worker_init_fn_raising_keyboard_interrupt_is_no_ctrl_c_in_the_consumer(tmp_path):
  r = _run(tmp_path, '''
    def init(index, count):
      raise KeyboardInterrupt

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(20).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      leftovers({"first": error(lambda: next(it))}, it)
  ''')
  assert r["first"]["type"] == "WorkerError"
  assert "failed to start: it raised KeyboardInterrupt, which ends a worker" in _one_line(r["first"])


def test_a_worker_init_fn_exception_is_still_raised_as_itself(tmp_path):
  # As Grain: a plain exception keeps its class (an `except ValueError` still works), its traceback in a note.
  r = _run(tmp_path, '''
    def init(index, count):
      raise ValueError("no accelerator")

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(20).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      leftovers({"first": error(lambda: next(it))}, it)
  ''')
  assert (r["first"]["type"], _one_line(r["first"])) == ("ValueError", "no accelerator")
  assert "failed to start" in r["first"]["notes"][0]


def test_a_map_calling_sys_exit_or_os_exit_in_a_worker_says_what_the_code_means(tmp_path):
  r = _run(tmp_path, '''
    def f(x):
      if x == 5:
        sys.exit(3) if os.environ["HOW"] == "sys" else os._exit(3)
      return x

    if __name__ == "__main__":
      out = {}
      for how in ("sys", "os"):
        os.environ["HOW"] = how
        it = iter(loader.MapDataset.range(40).map(f).to_iter_dataset().mp_prefetch(
            loader.MultiprocessingOptions(num_workers=2)))
        got = []
        out[how] = error(lambda: got.extend(it))
        out[how]["got"] = got
        out[how]["again"] = error(lambda: next(it))["type"]
        it.close()
      leftovers(out)
  ''')
  for how in ("sys", "os"):
    line = _one_line(r[how])
    assert r[how]["type"] == r[how]["again"] == "WorkerError"
    got = r[how]["got"]  # Elements before the one that ended the worker, in order, none after it.
    assert got == list(range(len(got))) and len(got) <= 5
    assert ") exited unexpectedly with exit code 3 before returning positions 5.." in line, line
    assert "A positive code is what the code it ran passed to sys.exit() or os._exit()" in line
    assert "raise an exception there instead" in line
    assert line.endswith("restore its get_state() into a new iterator.")


def test_a_data_loader_worker_killed_mid_chunk_is_named_and_leaves_nothing(tmp_path):
  r = _run(tmp_path, '''
    class Kill(grain.MapTransform):
      def map(self, x):
        if int(x) == 7:
          os.kill(os.getpid(), 9)  # What the out-of-memory killer does.
        return x

    if __name__ == "__main__":
      dl = grain.DataLoader(
          data_source=grain.RangeDataSource(0, 40, 1),
          sampler=grain.IndexSampler(40, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
          operations=[Kill()], worker_count=2)
      it = iter(dl)
      got = []
      e = error(lambda: got.extend(int(x) for x in it))
      leftovers({"e": e, "got": got})
  ''')
  line = _one_line(r["e"])
  assert r["e"]["type"] == "WorkerError"
  assert "exited unexpectedly with exit code -9 before returning positions" in line
  assert "DataLoader(IndexSampler(num_records=40" in line and "-9: SIGKILL, often the out-of-memory killer" in line
  assert r["got"] == list(range(len(r["got"]))) and len(r["got"]) < 40


def test_the_open_file_limit_reached_in_the_consumer_names_the_segment_and_loses_nothing(tmp_path):
  r = _run(tmp_path, '''
    import resource

    def f(x):
      return np.full((50000,), x)  # Big enough to come through /dev/shm.

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(100).map(f).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2)))
      got = [int(next(it)[0])]
      soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
      open_now = len(os.listdir("/proc/self/fd")) - 1  # Less the listing's own.
      resource.setrlimit(resource.RLIMIT_NOFILE, (open_now, hard))
      try:
        e = error(lambda: got.extend(int(x[0]) for x in it))
      finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
      got.extend(int(x[0]) for x in it)  # The limit raised: it goes on where it stopped.
      leftovers({"e": e, "got": got}, it)
  ''')
  line = _one_line(r["e"])
  assert r["e"]["type"] == "OSError"
  assert line.startswith("[Errno 24] /dev/shm/arl"), line
  assert "(positions 1.." in line and " of MapDataset.source(range(0, 100)).map(f), from worker " in line
  assert "could not be mapped in this process: Too many open files; raise the open-file limit (now " in line
  assert line.endswith("Nothing was lost: next() asks for these positions again")
  assert r["got"] == list(range(100))


def _write_records(path: str, first: int, n: int) -> None:
  from array_record.python.array_record_module import ArrayRecordWriter
  w = ArrayRecordWriter(path, "group_size:1,uncompressed")
  for i in range(first, first + n):
    w.write(b"<record %06d>" % i)
  w.close()


def test_a_file_deleted_replaced_or_cut_while_workers_read_it_is_named_with_its_record(tmp_path):
  d = tmp_path / "ds"
  d.mkdir()
  _write_records(str(d / "a.array_record"), 0, 50)
  _write_records(str(d / "b.array_record"), 50, 50)
  _write_records(str(tmp_path / "other.array_record"), 1000, 50)
  r = _run(tmp_path, f'''
    import shutil
    if __name__ == "__main__":
      d, out = {str(d)!r}, {{}}
      b = os.path.join(d, "b.array_record")
      original = open(b, "rb").read()
      for how in ("deleted", "replaced", "cut"):
        with open(b, "wb") as f:
          f.write(original)
        it = iter(loader.MapDataset.source(loader.ArrayRecordSource(d)).to_iter_dataset().mp_prefetch(
            loader.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=1)))
        got = [next(it)]
        if how == "deleted":
          os.remove(b)
        elif how == "replaced":
          shutil.copy({str(tmp_path / "other.array_record")!r}, b + ".new")
          os.replace(b + ".new", b)
        else:
          os.truncate(b, 300)
        out[how] = error(lambda: got.extend(it))
        out[how]["got"] = len(got)
        it.close()
      leftovers(out)
  ''')
  b = str(d / "b.array_record")
  for how, why in (("deleted", "(it was deleted)"), ("replaced", "(it was replaced by another file)"),
                   ("cut", "(size ")):
    line = _one_line(r[how])
    assert r[how]["type"] == "FileChangedError"
    assert r[how]["got"] == 50  # All of a.array_record, nothing read from the changed file.
    assert line.startswith(f"{b} changed after the ArrayRecordSource was created {why}"), line
    assert "while reading record 0 (index 50 of the source)" in line
    assert line.endswith("let the writer finish, then create a new ArrayRecordSource.")


def test_set_state_of_another_pipeline_or_a_damaged_state_on_a_running_iterator_changes_nothing(tmp_path):
  r = _run(tmp_path, '''
    def ds(n, workers):
      return loader.MapDataset.range(n).map(lambda x: x * 2).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=workers))

    if __name__ == "__main__":
      saved = iter(ds(50, 3))
      for _ in range(5):
        next(saved)
      other = saved.get_state()
      it = iter(ds(40, 2))
      first = [next(it) for _ in range(3)]
      refusals = [error(lambda: it.set_state(s)) for s in (
          other, json.dumps(it.get_state())[:-5], {"next_index": "x"}, {"next_index": -5}, {"next_index": 10**6})]
      rest = list(it)
      leftovers({"refusals": refusals, "first": first, "rest": rest}, saved, it)
  ''')
  types = [e["type"] for e in r["refusals"]]
  assert types == ["StateMismatchError", "StateTypeError", "StateTypeError", "PositionOutOfRangeError",
                   "PositionOutOfRangeError"]
  lines = [_one_line(e) for e in r["refusals"]]
  assert "this state was saved from a different pipeline: its operation 0 is not 'source(range(0, 40))'" in lines[0]
  assert "expects the dict returned by get_state()" in lines[1]
  assert r["first"] + r["rest"] == [x * 2 for x in range(40)]  # Each refusal left the iterator where it was.


def test_an_element_far_bigger_than_a_result_segment_arrives_whole(tmp_path):
  r = _run(tmp_path, '''
    def f(x):
      return np.full((120_000_000 if x == 3 else 4,), x % 251, np.uint8)

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(8).map(f).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2)))
      got = [(len(a), int(a[0]), int(a[-1])) for a in it]
      leftovers({"got": got}, it)
  ''')
  assert r["got"] == [[120_000_000 if x == 3 else 4, x, x] for x in range(8)]


def test_a_fork_taken_while_another_thread_waits_in_next_is_told_to_make_its_own_iterator(tmp_path):
  # The lock a consumer holds while it takes a chunk is copied held into a fork: the child must not wait on it.
  r = _run(tmp_path, '''
    def init(index, count):
      time.sleep(1000)

    if __name__ == "__main__":
      it = iter(loader.MapDataset.range(20).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      waiting = threading.Thread(target=lambda: error(lambda: next(it)), daemon=True)
      waiting.start()
      time.sleep(2)  # It waits for a worker, holding the pool's lock.
      read, write = os.pipe()
      pid = os.fork()
      if pid == 0:
        e = error(lambda: next(it))
        os.write(write, json.dumps(e).encode())
        os._exit(0)
      os.close(write)
      deadline, status = time.time() + 20, None
      while time.time() < deadline and status is None:
        done, code = os.waitpid(pid, os.WNOHANG)
        status = code if done else None
        time.sleep(0.05)
      if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
      child = json.loads(os.read(read, 1 << 16) or b"null")
      leftovers({"child": child, "status": status}, it)
  ''')
  assert r["status"] == 0, r
  assert r["child"]["type"] == "ForkedIteratorError"
  assert "(a fork of it?)" in _one_line(r["child"])


_THREADS_WITHOUT_WORKERS = """
import sys, threading
import numpy as np
if sys.argv[1] == "grain":
  import grain.python as g
else:
  import loader as g

def f(x):
  return x + int(np.arange(300).sum()) * 0  # A little work, so the reading-ahead threads and consumers interleave.

if __name__ == "__main__":
  it = iter(g.MapDataset.range(6000).map(f).to_iter_dataset())
  got, errors = [], []
  def consume():
    try:
      for x in it:
        got.append(x)
    except Exception as e:
      errors.append(type(e).__name__)
  threads = [threading.Thread(target=consume) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(100)
  print(sorted(got) == list(range(6000)), errors)
"""


def test_threads_calling_next_on_one_iterator_without_workers_get_every_element_once_as_in_grain(tmp_path):
  script = tmp_path / "threads.py"
  script.write_text(_THREADS_WITHOUT_WORKERS)
  out = {}
  for lib in ("loader", "grain"):
    p = subprocess.run([sys.executable, str(script), lib], cwd=str(tmp_path), env=ft.env(), capture_output=True,
                       text=True, timeout=200)
    assert p.returncode == 0, p.stderr[-3000:]
    out[lib] = p.stdout.splitlines()[-1]
  assert out["loader"] == "True []"
  assert out["grain"].startswith("True ")  # Every element once in Grain too (whatever its threads raise at the end).


def test_threads_calling_next_on_one_data_loader_iterator_get_every_record_once(tmp_path):
  r = _run(tmp_path, '''
    class Slow(grain.MapTransform):
      def map(self, x):
        time.sleep(0.002)
        return x

    if __name__ == "__main__":
      dl = grain.DataLoader(
          data_source=grain.RangeDataSource(0, 400, 1),
          sampler=grain.IndexSampler(400, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
          operations=[Slow()], worker_count=2)
      it = iter(dl)
      got, errors = [], []
      def consume():
        try:
          for x in it:
            got.append(int(x))
        except BaseException as e:
          errors.append(f"{type(e).__name__}: {e}")
      threads = [threading.Thread(target=consume) for _ in range(3)]
      for t in threads:
        t.start()
      for t in threads:
        t.join(60)
      leftovers({"got": sorted(got), "errors": errors, "hung": any(t.is_alive() for t in threads)}, it)
  ''')
  assert r["errors"] == [] and not r["hung"]
  assert r["got"] == list(range(400))
