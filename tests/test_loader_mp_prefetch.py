"""mp_prefetch: same stream for any worker count, errors, and clean shutdown."""

from __future__ import annotations

import collections
import errno
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

import loader
from loader import ipc
from loader import engine
from loader import iter_dataset as iter_lib
from loader import mp_prefetch
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import shm_segments
from loader_testing import take
from loader_testing import take_with_errors
from loader_testing import write_array_records

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("mp"), 3, [30, 20, 26])


def _parse(record: bytes) -> dict:
  i = record_index(record)
  return {"id": np.int64(i), "pixels": np.full((4, 4), i, np.uint8), "raw": record}


def _make(files, mp: loader.MultiprocessingOptions | None, *, thread_prefetch: int = 0):
  """A pipeline with random-access and sequential stages (lambdas included)."""
  src = loader.ArrayRecordSource(files)
  ds = (loader.MapDataset.source(src).shuffle(seed=3).repeat(2)
        .random_map(lambda r, rng: (r, int(rng.integers(1000))), seed=4)
        .to_iter_dataset()
        .map(lambda t: {**_parse(t[0]), "noise": np.int64(t[1])})
        .filter(lambda e: e["id"] % 4 != 1)
        .batch(5))
  if mp is not None:
    ds = ds.mp_prefetch(mp)
  return ds.prefetch(thread_prefetch) if thread_prefetch else ds


def _producer(it):
  while not isinstance(it, engine.MapDatasetIterator):
    it = it._parent
  return it._producer


def _wait_dead(pids, timeout=10.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    if not alive:
      return []
    time.sleep(0.1)
  return alive


def test_stream_is_identical_for_every_worker_count_and_buffer(files):
  reference = list(_make(files, None))
  assert len(reference) > 20
  settings = [
      (loader.MultiprocessingOptions(num_workers=0), 0),
      (loader.MultiprocessingOptions(num_workers=1), 0),
      (loader.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=3, chunk_size=3), 2),
      (loader.MultiprocessingOptions(num_workers=7, chunk_size=4), 0),
  ]
  before = shm_segments()
  for mp, prefetch in settings:
    with iter(_make(files, mp, thread_prefetch=prefetch)) as it:
      assert_streams_equal(list(it), reference)
  assert shm_segments() <= before


def test_restore_with_a_different_worker_count(files):
  two = lambda: _make(files, loader.MultiprocessingOptions(num_workers=2, chunk_size=4))
  zero = lambda: _make(files, loader.MultiprocessingOptions(num_workers=0))
  # States from a 2-worker run resume in-process at every step...
  stream = assert_restore_at_every_step_gives_same_stream(two, make_restore_ds=zero)
  # ...and in-process states resume with 1 worker (fresh workers per restore).
  assert_restore_at_every_step_gives_same_stream(
      zero, make_restore_ds=lambda: _make(files, loader.MultiprocessingOptions(num_workers=1)),
      steps=[0, 7, len(stream)])


def test_set_state_on_a_running_multiprocess_iterator(files):
  ds = _make(files, loader.MultiprocessingOptions(num_workers=2, chunk_size=2))
  reference = list(_make(files, None))
  with iter(ds) as it:
    take(it, 6)
    state = it.get_state()
    take(it, 3)
    it.set_state({**state, "next_index": 0})
    assert_streams_equal(take(it, 4), reference[:4])
    it.set_state(state)
    assert_streams_equal(list(it), reference[6:])


def _fail_at_17(record: bytes) -> bytes:
  if record_index(record) == 17:
    raise ValueError("record 17 is corrupt")
  return record


def test_worker_exception_reraises_in_parent_with_traceback(files):
  src = loader.ArrayRecordSource(files)
  ds = loader.MapDataset.source(src).map(_fail_at_17).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=5))
  before = shm_segments()
  it = iter(ds)
  got = []
  # As in Grain: the worker's exception itself, so `except ValueError` catches it.
  with pytest.raises(ValueError, match="record 17 is corrupt") as info:
    for r in it:
      got.append(record_index(r))
  assert got == list(range(17))  # Everything before the failing element, in order.
  note = "\n".join(info.value.__notes__)
  assert "raised while computing element 17" in note
  assert "_fail_at_17" in note and "ValueError: record 17 is corrupt" in note
  assert it.get_state()["next_index"] == 18  # As in Grain, the failed element is consumed,
  assert record_index(next(it)) == 18  # and the stream goes on after it.
  pids = _producer(it).worker_pids
  it.close()
  assert not _wait_dead(pids)
  assert shm_segments() <= before


def _big(record: bytes) -> np.ndarray:
  return np.full((256, 1024), record_index(record) % 251, np.uint8)  # 256 KiB: through shm.


@pytest.mark.parametrize("how", ["close", "gc", "interrupt"])
def test_workers_and_shared_memory_are_released(files, how):
  before = shm_segments()
  src = loader.ArrayRecordSource(files)
  ds = loader.MapDataset.source(src).map(_big).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2, chunk_size=2))

  def consume():
    it = iter(ds)
    first = next(it)
    assert first.shape == (256, 1024) and first.flags.writeable
    first[0, 0] = 1  # Ordinary writable memory, detached from the segment.
    pids = _producer(it).worker_pids
    assert len(pids) == 2
    if how == "close":
      it.close()
    elif how == "interrupt":
      for _ in it:
        raise KeyboardInterrupt  # As if Ctrl-C hit the training loop.
    return pids

  if how == "interrupt":
    pids_holder = []
    try:
      def run():
        it = iter(ds)
        next(it)
        pids_holder.extend(_producer(it).worker_pids)
        for _ in it:
          raise KeyboardInterrupt
      run()
    except KeyboardInterrupt:
      pass
    pids = pids_holder
  else:
    pids = consume()
  gc.collect()
  assert not _wait_dead(pids), "worker processes outlived their iterator"
  assert shm_segments() <= before


def test_workers_ignore_sigint_and_survive_it(files):
  src = loader.ArrayRecordSource(files)
  ds = loader.MapDataset.source(src).to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=1))
  with iter(ds) as it:
    next(it)
    (pid,) = _producer(it).worker_pids
    os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the whole process group.
    time.sleep(0.3)
    assert psutil.pid_exists(pid)
    assert len(list(it)) == 75


def test_killed_worker_is_reported(files):
  src = loader.ArrayRecordSource(files)
  ds = loader.MapDataset.source(src).map(_big).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=1))
  it = iter(ds)
  next(it)
  pids = _producer(it).worker_pids
  os.kill(pids[1], signal.SIGKILL)
  with pytest.raises(loader.WorkerError, match=r"exited unexpectedly with exit code -9 before returning "
                                              r"positions (\d+)\.\.\1 of MapDataset"):
    for _ in it:
      pass
  assert not _wait_dead(pids)
  with pytest.raises(loader.WorkerError):
    next(it)


def test_worker_found_dead_when_sent_a_task_names_that_task():
  # A worker killed while idle is found dead by the next send, not by a wait:
  # the error still names the positions it was given (CI once saw "while computing").
  from loader import mp_prefetch
  pool = mp_prefetch._WorkerPool(loader.MultiprocessingOptions(num_workers=1), None)
  leaf = pool.register(loader.MapDataset.range(10), 0)
  pool.start()
  try:
    (proc,) = pool.procs
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    with pytest.raises(loader.WorkerError, match=r"exit code -9 before returning positions 3\.\.4 of "):
      for _ in range(50):  # A send may land in the pipe's buffer once before the closed end shows.
        pool.submit(leaf, 0, 0, 3, 5)
        pool.receive(0, leaf, 0)
  finally:
    pool.close()


def _hangs_from_3(x):
  if x >= 3:
    time.sleep(3600)
  return x


def test_close_from_another_thread_ends_a_waiting_consumer_with_a_clear_error():
  import threading  # pylint: disable=import-outside-toplevel
  it = iter(loader.MapDataset.range(10).map(_hangs_from_3).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=1)))
  errors, got = [], []

  def consume():
    try:
      for x in it:
        got.append(x)
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  def waiting_for_element_3():
    # Its stack, not a sleep: spawned workers can take well over 2 s to start on a loaded
    # machine, and a close() before the wait (or between elements) is another case.
    frame = sys._current_frames().get(consumer.ident)  # pylint: disable=protected-access
    names = set()
    while frame is not None:
      names.add(frame.f_code.co_name)
      frame = frame.f_back
    return got == [0, 1, 2] and "receive" in names

  consumer = threading.Thread(target=consume, daemon=True)
  consumer.start()
  deadline = time.monotonic() + 120
  while not waiting_for_element_3() and time.monotonic() < deadline:  # It waits for element 3, which never comes.
    time.sleep(0.05)
  assert waiting_for_element_3(), (got, errors)
  pids = _producer(it).worker_pids
  it.close()
  consumer.join(30)
  assert not consumer.is_alive()
  assert len(errors) == 1 and isinstance(errors[0], ValueError) and not isinstance(errors[0], loader.WorkerError)
  assert "This iterator was closed (close() was called while it waited for a worker)" in str(errors[0])
  assert not _wait_dead(pids)


_ORPHAN_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import loader

    def big(r):
      return np.zeros((512, 1024), np.uint8)

    if __name__ == "__main__":
      src = loader.ArrayRecordSource(sys.argv[1:])
      ds = loader.MapDataset.source(src).repeat().map(big).to_iter_dataset().mp_prefetch(
          loader.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=4, chunk_size=1))
      it = iter(ds)
      next(it)
      it2 = it
      while not hasattr(it2, "_producer"):
        it2 = it2._parent
      print(" ".join(map(str, it2._producer.worker_pids)), flush=True)
      time.sleep(600)
""")


def test_parent_sigkill_leaves_no_orphans_or_segments(files, tmp_path):
  script = tmp_path / "orphan.py"
  script.write_text(_ORPHAN_SCRIPT)
  proc = subprocess.Popen([sys.executable, str(script), *files], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONPATH": _ROOT})
  try:
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read()
    pids = [int(p) for p in line.split()]
    deadline = time.monotonic() + 20  # Let the workers fill their buffers (segments exist).
    while not shm_segments(f"arl{proc.pid}_") and time.monotonic() < deadline:
      time.sleep(0.1)
    assert shm_segments(f"arl{proc.pid}_")
    proc.kill()
    proc.wait(10)
    assert not _wait_dead(pids, timeout=10), "workers outlived a SIGKILLed parent"
    deadline = time.monotonic() + 10
    while shm_segments(f"arl{proc.pid}_") and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not shm_segments(f"arl{proc.pid}_")
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.stdout.close()
    proc.stderr.close()


def test_any_pipeline_accepts_mp_prefetch():
  # Twice, or over a stream with no MapDataset part: the stream is unchanged.
  ds = loader.MapDataset.range(5).to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=1))
  assert list(ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=1))) == list(range(5))

  class Custom(loader.IterDataset):

    def __iter__(self):
      return iter(())

  assert list(Custom().mp_prefetch(loader.MultiprocessingOptions(num_workers=1))) == []
  with pytest.raises(ValueError, match=r"num_workers must be an integer >= 0 \(got num_workers=-1\)"):
    loader.MultiprocessingOptions(num_workers=-1)


def test_ipc_puts_arrays_in_shared_memory_and_small_payloads_inline():
  big = [{"a": np.arange(50_000, dtype=np.int64), "b": b"x\x00"}]
  name = f"arl{os.getpid()}_test_ipc"
  desc = ipc.encode(big, name)
  assert desc[0] == "shm" and name in shm_segments()
  back = ipc.decode(desc)
  assert name not in shm_segments()
  np.testing.assert_array_equal(back[0]["a"], big[0]["a"])
  assert back[0]["b"] == b"x\x00" and back[0]["a"].flags.writeable
  small = ipc.encode([1, np.arange(3)], "unused")
  assert small[0] == "inline" and ipc.decode(small)[1].tolist() == [0, 1, 2]



def _no_room_in_shm(worker_index: int, num_workers: int) -> None:
  """worker_init_fn: this worker's /dev/shm is full (as Docker's 64 MB default soon is)."""
  del worker_index, num_workers

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  ipc._write_all = full  # The segment is created, then filling it fails, as on a full tmpfs.


@pytest.mark.parametrize("fail_at", ["shm_open", "write"])
def test_ipc_without_room_in_shared_memory_sends_inline_and_leaves_no_segment(monkeypatch, caplog, fail_at):
  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  if fail_at == "shm_open":
    monkeypatch.setattr(ipc._posixshmem, "shm_open", full)
  else:
    monkeypatch.setattr(ipc, "_write_all", full)
  monkeypatch.setattr(ipc, "_warned_no_room", False)
  big = [{"a": np.arange(50_000, dtype=np.int64)}]
  name = f"arl{os.getpid()}_test_noroom"
  with caplog.at_level("WARNING", logger="loader.ipc"):
    desc = ipc.encode(big, name)
    ipc.encode(big, name + "2")
  assert desc[0] == "inline" and name not in shm_segments()
  np.testing.assert_array_equal(ipc.decode(desc)[0]["a"], big[0]["a"])
  warnings = [r.getMessage() for r in caplog.records]
  assert len(warnings) == 1 and "/dev/shm has no room" in warnings[0] and "--shm-size" in warnings[0]


def test_a_full_shared_memory_loses_nothing(files, capfd):
  """Each worker's shm writes fail: the chunks come through the pipes, the stream is whole."""
  before = shm_segments()
  src = loader.ArrayRecordSource(files)
  base = loader.MapDataset.source(src).map(_big).batch(4).to_iter_dataset()
  want = [int(b[0, 0, 0]) for b in base]
  ds = base.mp_prefetch(loader.MultiprocessingOptions(num_workers=2), worker_init_fn=_no_room_in_shm)
  it = iter(ds)
  got = [int(b[0, 0, 0]) for b in it]
  assert got == want
  assert it.get_state() is not None
  err = capfd.readouterr().err
  assert err.count("has no room for a") == 2, err  # One line per worker.
  assert shm_segments() <= before


def test_segments_of_a_killed_process_group_are_swept_by_the_next_pool(monkeypatch):
  """kill -9 of a whole group leaves its segments; a new pool removes those of dead pids of this namespace only."""
  dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                            text=True, check=True).stdout)
  tag = ipc._namespace_tag()
  other_tag = f"{(int(tag, 16) + 1) & 0xFFFF:04x}"
  names = {"dead": f"arl{dead}_{tag}abcdef_0_1", "other_namespace": f"arl{dead}_{other_tag}abcdef_0_1",
           "live": f"arl{os.getppid()}_{tag}abcdef_0_1", "not_ours": f"arl{dead}_x"}
  for name in names.values():
    fd = ipc._posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.close(fd)
  try:
    monkeypatch.setattr(ipc, "_swept_dead", False)
    ds = loader.MapDataset.range(4).to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=1))
    assert list(ds) == [0, 1, 2, 3]
    left = set(os.listdir("/dev/shm"))
    assert names["dead"] not in left
    assert {names["other_namespace"], names["live"], names["not_ours"]} <= left
  finally:
    for name in names.values():
      try:
        ipc._posixshmem.shm_unlink("/" + name)
      except FileNotFoundError:
        pass


def _assert_same_elements(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert type(g) is type(w) and list(g) == list(w)
    for k in w:
      if isinstance(w[k], np.ndarray):
        assert type(g[k]) is np.ndarray and g[k].dtype == w[k].dtype and g[k].shape == w[k].shape
        assert g[k].flags.c_contiguous == w[k].flags.c_contiguous
        assert g[k].flags.writeable == w[k].flags.writeable
        np.testing.assert_array_equal(g[k], w[k])
      else:
        assert type(g[k]) is type(w[k]) and g[k] == w[k]


@pytest.mark.parametrize("size", ["inline", "shm"])
def test_ipc_many_small_dict_elements_travel_as_columns_and_come_back_equal(size):
  # Tokenized documents: one array per key for the chunk, a slice per element.
  rng = np.random.default_rng(0)
  n = 40 if size == "inline" else 400
  elements = []
  for i in range(n):
    tokens = rng.integers(0, 1000, int(rng.integers(0, 60)) + 1).astype(np.int32)
    elements.append({"inputs": tokens[:-1], "targets": tokens[1:],
                     "patch": rng.random((len(tokens) - 1, 2, 3)).astype(np.float16),
                     "frozen": np.frombuffer(bytes(range(i % 7 + 1)), np.uint8),  # Read-only stays read-only.
                     "mixed": np.arange(3) if i % 2 else None, "id": i, "text": b"doc\x00"})
  assert isinstance(ipc._as_columns(elements), ipc._Columns)  # pylint: disable=protected-access
  name = f"arl{os.getpid()}_test_ipc_cols"
  desc = ipc.encode(elements, name)
  assert desc[0] == size
  back = ipc.decode(desc)
  _assert_same_elements(back, elements)
  assert back[0]["inputs"].flags.writeable and not back[0]["frozen"].flags.writeable
  back[0]["inputs"][:] = -1  # Writing one element's slice leaves its neighbours alone.
  np.testing.assert_array_equal(back[1]["inputs"], elements[1]["inputs"])
  # Chunks that do not pay (few elements, big arrays, other key orders, dict
  # subclasses, bare arrays) travel element by element, as before.
  few = elements[:3]
  big = [{"a": np.zeros(100_000, np.uint8)} for _ in range(20)]
  reordered = elements[:20] + [dict(reversed(list(elements[20].items())))]
  for chunk in (few, big, reordered, [collections.OrderedDict(e) for e in elements], [e["inputs"] for e in elements]):
    assert ipc._as_columns(chunk) is chunk  # pylint: disable=protected-access
  _assert_same_elements(ipc.decode(ipc.encode(reordered, name + "r")), reordered)


def test_ipc_segment_survives_short_writes_and_many_buffers(monkeypatch):
  # More arrays than one pwritev takes (1024), odd sizes (alignment padding),
  # and a kernel that writes at most 1000 bytes per call.
  arrays = [np.arange(i % 7 + 5, dtype=np.int32) * i for i in range(3000)]
  real = os.pwritev
  calls = []

  def short_pwritev(fd, buffers, offset):
    calls.append(len(buffers))
    first = bytes(memoryview(buffers[0]).cast("B")[:1000])
    return real(fd, [first], offset)

  monkeypatch.setattr(os, "pwritev", short_pwritev)
  name = f"arl{os.getpid()}_test_ipc_short"
  desc = ipc.encode(arrays, name)
  monkeypatch.setattr(os, "pwritev", real)
  assert desc[0] == "shm" and max(calls) == 1024 and len(calls) > 3000
  back = ipc.decode(desc)
  assert name not in shm_segments()
  for got, want in zip(back, arrays, strict=True):
    np.testing.assert_array_equal(got, want)


def test_ipc_failed_write_leaves_no_segment(monkeypatch):
  def broken(fd, buffers, offset):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "pwritev", broken)
  name = f"arl{os.getpid()}_test_ipc_full"
  desc = ipc.encode([np.zeros(100_000)], name)  # A full /dev/shm: through the pipe instead.
  assert desc[0] == "inline" and name not in shm_segments()

def _slow(x):
  time.sleep(0.2)
  return x


def test_interrupt_while_waiting_for_workers_can_be_resumed():
  ds = loader.MapDataset.range(12).map(_slow).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=2))
  before = shm_segments()

  def interrupt(signum, frame):
    raise KeyboardInterrupt

  old = signal.signal(signal.SIGALRM, interrupt)
  it = iter(ds)
  try:
    assert next(it) == 0
    first_pids = _producer(it).worker_pids
    signal.setitimer(signal.ITIMER_REAL, 0.05)  # Fires while next() waits on a worker.
    with pytest.raises(KeyboardInterrupt):
      for _ in range(20):
        next(it)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
  # Nothing was read when the interrupt came: the same workers go on, exactly.
  assert _producer(it).worker_pids == first_pids
  state = it.get_state()["next_index"]
  assert list(it) == list(range(state, 12))
  it.close()
  assert shm_segments() <= before


def test_an_interrupt_that_cuts_a_message_short_restarts_the_workers(monkeypatch):
  # A Ctrl-C inside a pipe read leaves the pipe out of step: the workers are
  # replaced, also when a second Ctrl-C cuts that restart short.
  from loader import mp_prefetch  # pylint: disable=g-import-not-at-top
  ds = loader.MapDataset.range(40).map(_slow_pid_and_value).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=2))
  before = shm_segments()
  it = iter(ds)
  got = [next(it)[1]]
  first_pids = _producer(it).worker_pids
  pool = _producer(it)._pool
  real_receive, real_shutdown = pool.receive, mp_prefetch._shutdown
  cuts = {"receive": 1, "shutdown": 1}

  def cut_receive(*args):
    if cuts["receive"]:
      cuts["receive"] -= 1
      raise KeyboardInterrupt  # As if raised inside conn.recv().
    return real_receive(*args)

  def cut_shutdown(*args):
    if cuts["shutdown"]:
      cuts["shutdown"] -= 1
      raise KeyboardInterrupt  # The second Ctrl-C, before any worker was stopped.
    return real_shutdown(*args)

  monkeypatch.setattr(pool, "receive", cut_receive)
  monkeypatch.setattr(mp_prefetch, "_shutdown", cut_shutdown)
  while True:
    try:
      for _, x in it:
        got.append(x)
      break
    except KeyboardInterrupt:
      pass
  assert got == list(range(40))
  assert not _wait_dead(first_pids) and not set(first_pids) & set(_producer(it).worker_pids)
  it.close()
  assert shm_segments() <= before


def _slow_pid_and_value(x):
  time.sleep(0.01)
  return os.getpid(), x


def _slow_pid(x):
  time.sleep(0.1)
  return os.getpid()


def test_small_dataset_with_slow_map_uses_every_worker():
  # Grain's tests assert every worker gets work; adaptive chunks must not put
  # a 40-element dataset with a 100 ms map on one worker.
  ds = loader.MapDataset.range(40).map(_slow_pid).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=4))
  with iter(ds) as it:
    pids = list(it)
    workers = set(_producer(it).worker_pids)
  assert len(pids) == 40
  assert workers <= set(pids), f"workers {workers} vs pids used {set(pids)}"


def _loader_workers(before: frozenset[int] = frozenset()) -> list[psutil.Process]:
  """Live children, less the resource tracker and those in `before`.

  Earlier tests of the session can leave children behind for a while (an
  iterator that only a later garbage collection stops, a process still
  exiting): `before` holds the ones there before the pool started.
  """
  out = []
  for p in psutil.Process().children():
    try:
      if (p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
          and "resource_tracker" not in " ".join(p.cmdline())):
        out.append(p)
    except psutil.Error:  # Gone meanwhile.
      pass
  return out


def test_all_parts_of_a_mixture_share_one_pool_of_workers():
  M = loader.MapDataset
  make = lambda: loader.IterDataset.mix(
      [M.range(100).to_iter_dataset(), M.range(100, 200).to_iter_dataset(),
       M.range(200, 300).map(lambda x: -x).to_iter_dataset()], [0.5, 0.3, 0.2]).batch(4)
  reference = list(make())
  before = frozenset(p.pid for p in psutil.Process().children())
  with iter(make().mp_prefetch(loader.MultiprocessingOptions(num_workers=2))) as it:
    out = take(it, 5)
    assert len(_loader_workers(before)) == 2  # Not 2 per part.
    out += list(it)
  assert_streams_equal(out, reference)


def test_closing_one_part_keeps_the_shared_pool_for_the_others():
  M = loader.MapDataset
  opts = loader.MultiprocessingOptions(num_workers=2)
  ds = loader.IterDataset.mix([M.range(50).to_iter_dataset(), M.range(50, 100).to_iter_dataset()]).mp_prefetch(opts)
  before = frozenset(p.pid for p in psutil.Process().children())
  with iter(ds) as it:
    take(it, 4)
    first, second = it._parents  # The mixture's two MapDataset parts, sharing one pool.
    first.close()
    pids = [p.pid for p in _loader_workers(before)]
    assert len(pids) == 2
    assert next(second) is not None  # Still served by the shared workers.
  assert not _wait_dead(pids, timeout=10)  # The last part to close stops the pool.


def _init_fails(worker_index, num_workers):
  raise FileNotFoundError(2, "No such file or directory", "vocab.txt")


def test_an_exception_while_a_worker_starts_is_raised_as_itself_as_in_grain():
  ds = loader.MapDataset.range(8).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2), worker_init_fn=_init_fails)
  before = shm_segments()
  with pytest.raises(FileNotFoundError) as info:
    list(ds)
  assert info.value.filename == "vocab.txt"
  note = "\n".join(info.value.__notes__)
  assert "failed to start" in note and "_init_fails" in note
  assert shm_segments() <= before


def _lock_at_7(x):
  import threading  # pylint: disable=g-import-not-at-top
  return threading.Lock() if x == 7 else x


def test_an_element_that_cannot_be_pickled_fails_alone_at_its_own_position():
  # With 0 workers nothing is pickled; with workers that one element cannot
  # cross: the elements before it in its chunk arrive, then its error, then the rest.
  ds = loader.MapDataset.range(20).map(_lock_at_7).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2, chunk_size=10))
  it = iter(ds)
  got, errors = [], []
  while True:
    try:
      got.append(next(it))
    except StopIteration:
      break
    except TypeError as e:
      errors.append((it.get_state()["next_index"], "element 7 " in " ".join(getattr(e, "__notes__", []))))
  assert got == [x for x in range(20) if x != 7]
  assert errors == [(8, True)]
  it.close()


def test_a_function_that_cannot_be_pickled_says_what_to_do():
  import threading  # pylint: disable=g-import-not-at-top
  lock = threading.Lock()

  def guarded(x):
    with lock:
      return x

  ds = loader.MapDataset.range(4).map(guarded).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1))
  with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object") as e:
    next(iter(ds))
  assert "Create such objects (locks, open files, clients) inside the function" in " ".join(e.value.__notes__)


def _with_pid(x):
  return (x, os.getpid())


def test_set_state_keeps_the_worker_processes():
  # As Grain's test_set_state_does_not_restart_process.
  ds = loader.MapDataset.range(200).to_iter_dataset().map(_with_pid).mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2))
  it = iter(ds)
  before = {p for _, p in (next(it) for _ in range(100))}
  state = it.get_state()
  next(it)
  it.set_state(state)
  rest = list(it)
  assert [x for x, _ in rest] == list(range(100, 200))
  assert {p for _, p in rest} == before and os.getpid() not in before and len(before) == 2
  it.close()


def test_a_state_restores_with_or_without_mp_prefetch_before_a_batch():
  # Without mp_prefetch a batch after to_iter_dataset() is folded into the
  # reads; with it the batch follows the workers. Either way the state counts
  # the elements read: one stream, one state.
  def pipeline(mp: bool, workers: int = 0):
    ds = loader.MapDataset.range(40).shuffle(seed=3).to_iter_dataset()
    if mp:
      ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
    return ds.batch(4)

  for saved, restored in (((False, 0), (True, 2)), ((True, 2), (False, 0)), ((True, 0), (False, 0))):
    it = iter(pipeline(*saved))
    for _ in range(3):
      next(it)
    again = iter(pipeline(*restored))
    again.set_state(it.get_state())
    assert [b.tolist() for b in again] == [b.tolist() for b in it]
  # A batch moved from the MapDataset to the IterDataset counts otherwise: refused.
  mapped = iter(loader.MapDataset.range(40).shuffle(seed=3).batch(4).to_iter_dataset())
  next(mapped)
  with pytest.raises(ValueError, match="saved from a different pipeline"):
    iter(pipeline(False)).set_state(mapped.get_state())


def _slightly_slow(x):
  time.sleep(0.002)
  return x


def _interrupted_after(it, seconds: float, got: list) -> None:
  """Reads `it` into `got` until a KeyboardInterrupt (SIGALRM after `seconds`) stops it.

  The interrupt lands inside `next(it)` only: one landing in this loop, between
  `next` returning and `append`, would drop that element here, not in the
  iterator (Python 3.13 runs handlers there more often), so it is retried 1 ms later.
  """
  loop = sys._getframe()  # pylint: disable=protected-access

  def interrupt(signum, frame):
    if frame is loop:
      signal.setitimer(signal.ITIMER_REAL, 0.001)
      return
    raise KeyboardInterrupt

  old = signal.signal(signal.SIGALRM, interrupt)
  try:
    signal.setitimer(signal.ITIMER_REAL, seconds)
    with pytest.raises(KeyboardInterrupt):
      while True:
        got.append(next(it))
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("num_threads", [0, 16])
def test_going_on_after_a_ctrl_c_without_workers_skips_nothing(num_threads):
  # As after "interrupt kernel" in a notebook: the loop stops, then goes on.
  # 2 ms elements, computed 16 at a time on 16 threads: 400 of them took
  # ~60 ms there, close to the 50 ms interrupt (a faster machine could run
  # out of elements first). Sized so that the stream takes ~0.8 s at best on
  # any thread count.
  n = 400 * max(1, num_threads)
  make = lambda: loader.MapDataset.range(n).map(_slightly_slow).to_iter_dataset(
      loader.ReadOptions(num_threads=num_threads))
  it = iter(make())
  got = [next(it)]
  _interrupted_after(it, 0.05, got)
  assert got == list(range(len(got))) and len(got) < n
  assert list(it) == list(range(len(got), n))


def test_prefetch_to_device_loses_no_batch_to_a_ctrl_c():
  pytest.importorskip("jax")
  from loader import jax as loader_jax
  host = loader.MapDataset.range(4000).map(_slightly_slow).batch(4).to_iter_dataset()
  it = loader_jax.prefetch_to_device(iter(host), size=2)
  got = [next(it)]
  for _ in range(3):
    _interrupted_after(it, 0.03, got)
  rest = list(it)
  assert [np.asarray(b).tolist() for b in got + rest] == [list(range(i, i + 4)) for i in range(0, 4000, 4)]


_DROPPED_ITERATOR_CTRL_C = """
import gc, signal, sys, time
import loader
from loader import mp_prefetch

def slow(x):
  time.sleep(0.2)
  return x

if __name__ == "__main__":
  ds = loader.MapDataset.range(200).map(slow).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2))
  it = iter(ds)
  next(it)
  stop, calls = mp_prefetch._stop, []
  def interrupted_stop(*args):  # The Ctrl-C lands while the finalizer waits for the workers.
    calls.append(mp_prefetch._in_finalizer())
    if len(calls) == 1:
      raise KeyboardInterrupt
    stop(*args)
  mp_prefetch._stop = interrupted_stop
  try:
    del it
    gc.collect()
    time.sleep(3)  # The program would go on here if the interrupt were lost.
    print("lost")
  except KeyboardInterrupt:
    print("raised", calls)
"""


def test_a_ctrl_c_while_a_dropped_iterator_stops_its_workers_is_raised_again(tmp_path):
  # `del it` (or `it = iter(ds)` for the next epoch) stops the workers in a
  # finalizer, where Python ignores exceptions: the Ctrl-C must not be lost.
  script = tmp_path / "drop.py"
  script.write_text(_DROPPED_ITERATOR_CTRL_C)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": root})
  assert proc.stdout.strip() == "raised [True, True]", (proc.stdout, proc.stderr[-2000:])


@pytest.mark.parametrize("workers", [0, 2, "thread_prefetch"])
def test_a_forked_child_cannot_use_or_stop_its_parents_iterator(workers):
  ds = loader.MapDataset.range(300).shuffle(seed=1).map(_slightly_slow).batch(10).to_iter_dataset()
  if workers == "thread_prefetch":
    ds = loader.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
  elif workers:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  reference = [b.tolist() for b in loader.MapDataset.range(300).shuffle(seed=1).batch(10)]
  it = iter(ds)
  got = [next(it).tolist() for _ in range(5)]
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # The child: one clear error; dropping its copy stops nothing of the parent's.
    try:
      try:
        next(it)
        os.write(write, b"no error")
      except engine.ForkedIteratorError as e:
        os.write(write, b"ForkedIteratorError" if "Create a new iterator here" in str(e) else b"other text")
      del it
      gc.collect()
    finally:
      os._exit(0)
  os.close(write)
  with os.fdopen(read, "rb") as f:
    assert f.read() == b"ForkedIteratorError"
  os.waitpid(pid, 0)
  got += [b.tolist() for b in it]
  assert got == reference


_STARTING_WORKERS_SCRIPT = """
import multiprocessing, os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
import loader

# A worker re-running a slow script top (say `import jax`) is still starting.
# (It runs the script as __mp_main__; multiprocessing.parent_process() is
# still None then, so that cannot tell a starting worker.)
if __name__ == "__mp_main__":
  time.sleep(3)

def f(x):
  return np.full(8, x)

if __name__ == "__main__":
  ds = loader.MapDataset.range(10**6).map(f).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=2))
  it = iter(ds)
  it.start_prefetch()
  print("started", flush=True)
  next(it)  # The map is the user's: its first chunk waits for the workers.
  print("workers had started before the Ctrl-C", flush=True)
"""


def test_a_ctrl_c_while_workers_start_prints_only_the_scripts_traceback(tmp_path):
  # A terminal's Ctrl-C reaches the whole process group: workers still
  # starting must not print KeyboardInterrupt tracebacks of their own.
  script = tmp_path / "starting.py"
  script.write_text(_STARTING_WORKERS_SCRIPT.format(root=_ROOT))
  proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
  assert proc.stdout.readline().strip() == "started"
  time.sleep(0.5)
  os.killpg(proc.pid, signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert out == "" and proc.returncode != 0, (out, err)
  assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
  assert "spawn_main" not in err


_MANY_FAILURES_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import loader.python as lp

class BigFail(lp.MapTransform):
  def map(self, x):
    if x % 3 == 1:  # Each failure realigns the batches: earlier tasks go stale, still queued in the workers.
      raise ValueError(f"bad {{x}} " + "x" * 200_000)  # Results bigger than a pipe holds.
    return x

def stream(worker_count):
  sampler = lp.IndexSampler(1500, lp.NoSharding(), shuffle=False, num_epochs=1, seed=0)
  dl = lp.DataLoader(data_source=list(range(1500)), sampler=sampler, operations=[BigFail(), lp.Batch(2)],
                     worker_count=worker_count)
  out, it = [], iter(dl)
  while True:
    try:
      out.append(next(it).tolist())
    except StopIteration:
      return out
    except ValueError as e:
      out.append(str(e)[:8])

if __name__ == "__main__":
  print(stream(0) == stream(2), flush=True)
"""


def test_many_failures_in_workers_do_not_deadlock_the_pipes(tmp_path):
  # Each failure sent new tasks while the stale ones were still queued; a
  # worker blocked sending a big result stopped reading, and the parent's
  # next send then waited on its full pipe for ever.
  script = tmp_path / "many_failures.py"
  script.write_text(_MANY_FAILURES_SCRIPT.format(root=_ROOT))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-3000:]


def _fails_on_three(x):
  if x == 3:
    raise KeyError(x)
  return x


def test_a_deep_worker_buffer_goes_on_after_an_error():
  # Hundreds of this part's results wait in the pool's stash; after the error
  # the stale ones are dropped one after the other (not one call deeper each).
  ds = loader.MapDataset.range(3000).map(_fails_on_three).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1, per_worker_buffer_size=1500, chunk_size=1))
  with iter(ds) as it:
    got = take_with_errors(it, errors=KeyError, on_error=repr)
  assert got == [0, 1, 2, "KeyError(3)", *range(4, 3000)]


def _slow_after_four(x):
  if x > 4:
    time.sleep(0.1)
  return x


def test_a_ctrl_c_while_the_parent_reads_a_full_workers_results_loses_no_chunk(monkeypatch):
  # After a restore the worker still has 32 stale tasks queued: sending the
  # task of the chunk the consumer needs first reads its results, and a
  # Ctrl-C there must not lose a chunk (the next call asks again).
  pool_read = mp_prefetch._WorkerPool._read  # pylint: disable=protected-access
  armed, fired = [], []

  def read(self, w):
    if armed and not fired and sys._getframe(1).f_code.co_name == "submit":  # pylint: disable=protected-access
      fired.append(True)
      threading.Timer(0.02, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
    return pool_read(self, w)

  monkeypatch.setattr(mp_prefetch._WorkerPool, "_read", read)  # pylint: disable=protected-access
  ds = loader.MapDataset.range(45).map(_slow_after_four).to_iter_dataset().mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1, per_worker_buffer_size=33, chunk_size=1))
  got, interrupts = [], 0
  with iter(ds) as it:
    take(it, 2)
    state = it.get_state()
    take(it, 3)
    it.set_state(state)
    armed.append(True)
    while True:
      try:
        got.append(next(it))
      except StopIteration:
        break
      except KeyboardInterrupt:
        interrupts += 1
  assert fired and interrupts == 1
  assert got == list(range(2, 45))


def test_a_worker_traceback_of_a_script_function_shows_the_script_and_its_line(tmp_path):
  # cloudpickle sends `__main__` functions by value and names their code
  # `<dynamic-code>`; the note must point at the script's own file and line.
  script = tmp_path / "train.py"
  script.write_text(textwrap.dedent("""
      import loader

      def parse(x):
        return x // (x - 3)  # fails on record 3

      if __name__ == "__main__":
        ds = loader.MapDataset.range(8).map(parse).map(lambda y: y + 1)
        it = iter(ds.to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
        try:
          list(it)
        except ZeroDivisionError as e:
          print("\\n".join(e.__notes__))
      """))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": _ROOT}, check=True)
  assert f'File "{script}", line 5, in parse' in proc.stdout
  assert "return x // (x - 3)  # fails on record 3" in proc.stdout
  assert "<dynamic-code>" not in proc.stdout


def test_a_daemon_thread_still_iterating_at_exit_ends_quietly_and_leaves_nothing(tmp_path):
  # At exit the pools close under the daemon thread's wait; that is no error of the user's.
  script = tmp_path / "daemon.py"
  script.write_text(textwrap.dedent("""
      import threading, time
      import loader

      def slow(x):
        time.sleep(0.01)
        return x

      if __name__ == "__main__":
        ds = loader.MapDataset.range(10**6).map(slow).batch(8).to_iter_dataset().mp_prefetch(
            loader.MultiprocessingOptions(num_workers=2))
        started = threading.Event()
        def consume():
          for _ in ds:
            started.set()
        threading.Thread(target=consume, daemon=True).start()
        started.wait(60)
        print(os.getpid(), flush=True)
      """).replace("import threading", "import os, threading"))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": _ROOT})
  assert proc.returncode == 0, proc.stderr
  assert "Traceback" not in proc.stderr and "closed" not in proc.stderr, proc.stderr
  assert not shm_segments(prefix=f"arl{int(proc.stdout)}_")
