"""IterDataset: prefix rewriting, sequential stages, prefetch, checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import loader
from loader import engine
from loader import iter_dataset as iter_lib
from loader import sequential
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import write_array_records

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("iter"), 3, [40, 25, 35])


def _parse(record: bytes) -> dict:
  i = record_index(record)
  return {"id": np.int64(i), "x": np.full((3,), i % 7, np.float32), "raw": record}


def _pipelines(files):
  """Named pipeline builders covering random-access and sequential stages."""
  src = loader.ArrayRecordSource(files)
  base = lambda: loader.MapDataset.source(src).shuffle(seed=11)
  return {
      "records": lambda: base().to_iter_dataset(),
      "map_batch": lambda: base().map(_parse).to_iter_dataset().batch(8),
      "iter_map_batch_map": lambda: base().to_iter_dataset().map(_parse).batch(7).map(lambda b: b["id"].sum()),
      "filter_then_batch": lambda: base().repeat(2).to_iter_dataset().map(_parse).filter(
          lambda e: e["id"] % 3 != 0).batch(9, drop_remainder=True),
      "map_filter": lambda: base().map(record_index).filter(lambda i: i % 4 == 1).to_iter_dataset(),
      "prefetched": lambda: base().map(_parse).batch(5).to_iter_dataset().filter(
          lambda b: b["id"][0] % 2 == 0).prefetch(3),
  }


def test_random_access_prefix_is_rewritten_into_map_dataset_ops():
  ds = loader.MapDataset.range(10).to_iter_dataset().batch(3).map(lambda b: b + 1)
  assert isinstance(ds, iter_lib.MapBackedIterDataset)
  assert [b.tolist() for b in ds] == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
  # After a map (which may return None, dropped by to_iter_dataset() as in
  # Grain) the batch runs on the elements.
  after_map = loader.MapDataset.range(10).to_iter_dataset().map(lambda x: x + 1).batch(3)
  assert isinstance(after_map, sequential.BatchIterDataset)
  assert isinstance(after_map._parent, iter_lib.MapBackedIterDataset)
  assert [b.tolist() for b in after_map] == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
  after_filter = loader.MapDataset.range(10).to_iter_dataset().filter(lambda x: x % 2).batch(2)
  assert isinstance(after_filter, sequential.BatchIterDataset)
  assert isinstance(after_filter._parent, iter_lib.MapBackedIterDataset)
  assert [b.tolist() for b in after_filter] == [[1, 3], [5, 7], [9]]


@pytest.mark.parametrize("name", ["records", "map_batch", "iter_map_batch_map", "filter_then_batch",
                                  "map_filter", "prefetched"])
def test_restore_at_every_step(files, name):
  make = _pipelines(files)[name]
  stream = assert_restore_at_every_step_gives_same_stream(make, steps=None if name != "records" else range(0, 101, 7))
  assert stream


def test_stream_is_identical_for_every_read_and_prefetch_setting(files):
  src = loader.ArrayRecordSource(files)
  ref = None
  for ro in [loader.ReadOptions(), loader.ReadOptions(chunk_size=1), loader.ReadOptions(chunk_size=5),
             loader.ReadOptions(num_threads=3, prefetch_buffer_size=7, chunk_size=2),
             loader.ReadOptions(num_threads=1, prefetch_buffer_size=0)]:
    for buffer_size in [0, 1, 4]:
      ds = loader.MapDataset.source(src).shuffle(seed=2).map(_parse).to_iter_dataset(ro)
      ds = ds.filter(lambda e: e["id"] % 5 != 0).batch(6).prefetch(buffer_size)
      out = list(ds)
      if ref is None:
        ref = out
      assert_streams_equal(out, ref)


def test_thread_read_options_restore(files):
  src = loader.ArrayRecordSource(files)
  make = lambda: loader.MapDataset.source(src).shuffle(seed=5).batch(4).to_iter_dataset(
      loader.ReadOptions(num_threads=2, chunk_size=3))
  assert_restore_at_every_step_gives_same_stream(make)


def test_state_is_small_json_and_validated(files):
  ds = _pipelines(files)["filter_then_batch"]()
  it = iter(ds)
  next(it)
  state = it.get_state()
  assert json.loads(json.dumps(state)) == state
  assert isinstance(state["next_index"], int)
  assert set(state) == {"next_index", "loader_state_version", "pipeline"}
  with pytest.raises(ValueError, match=r"expected a state dict with keys \['next_index'\]"):
    it.set_state({**state, "parent": {}})
  with pytest.raises(ValueError, match=r"next_index must be an integer in \[0, 200\]"):
    it.set_state({**state, "next_index": 201})
  with pytest.raises(ValueError, match="expects the dict returned by get_state"):
    it.set_state([3])


def test_prefetch_validation_and_grain_alias():
  ds = loader.MapDataset.range(3).to_iter_dataset()
  with pytest.raises(ValueError, match=r"buffer_size must be an integer >= 0 \(got buffer_size=-1\)"):
    ds.prefetch(-1)
  with pytest.warns(DeprecationWarning):
    mp = ds.prefetch(loader.MultiprocessingOptions(num_workers=0))
  assert list(mp) == [0, 1, 2]


def test_errors_in_prefetch_thread_reach_the_consumer():

  def boom(x):
    if x == 3:
      raise KeyError("bad element 3")
    return x

  ds = loader.MapDataset.range(6).to_iter_dataset().filter(lambda x: True).map(boom).prefetch(2)
  it = iter(ds)
  assert [next(it) for _ in range(3)] == [0, 1, 2]
  with pytest.raises(KeyError, match="bad element 3"):
    next(it)
  it.close()


@pytest.mark.parametrize("num_threads", [0, 2])
def test_a_map_error_in_process_is_noted_with_the_element_it_failed_on(num_threads):

  def boom(x):
    if x == 3:
      raise KeyError("bad element 3")
    return x

  ds = loader.MapDataset.range(6).map(boom).to_iter_dataset(loader.ReadOptions(num_threads=num_threads))
  it = iter(ds)
  assert [next(it) for _ in range(3)] == [0, 1, 2]
  with pytest.raises(KeyError, match="bad element 3") as e:
    next(it)
  (note,) = e.value.__notes__
  assert note.startswith("Raised while computing element 3 of MapDataset.source(range(0, 6)).map(") and note.endswith(
      "boom); the stream goes on after it."), note
  assert list(it) == [4, 5]


def test_save_and_restore_state_files(files, tmp_path):
  make = _pipelines(files)["map_batch"]
  it = iter(make())
  for _ in range(3):
    next(it)
  path = tmp_path / "ckpt" / "data.json"
  saved = loader.save_state(path, it)
  rest = list(it)
  assert [p.name for p in path.parent.iterdir()] == ["data.json"]  # No temp files left.
  fresh = iter(make())
  assert loader.restore_state(path, fresh) == saved
  assert_streams_equal(list(fresh), rest)
  path.write_text("{}")
  with pytest.raises(ValueError, match="not a loader state file"):
    loader.restore_state(path, fresh)
  path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")  # Binary garbage: named, one line, not a UnicodeDecodeError.
  with pytest.raises(ValueError, match=r"data.json is not a loader state file \(not UTF-8 text: byte 0") as e:
    loader.restore_state(path, fresh)
  assert "\n" not in str(e.value)
  # A save cut short (empty, or half its JSON) and a wrong path: named, with what to do.
  text = json.dumps({"format": "x"})
  for cut in (b"", text[:len(text) // 2].encode()):
    path.write_bytes(cut)
    with pytest.raises(ValueError, match=r"data.json is not a loader state file \((it is empty|invalid JSON).*; "
                                         r"restore from another checkpoint\.$"):
      loader.restore_state(path, fresh)
  with pytest.raises(FileNotFoundError, match=r"No iterator state at .*missing.json: check the path"):
    loader.restore_state(path.parent / "missing.json", fresh)


_SUBPROCESS = r"""
import json, sys
import numpy as np
import loader
files = json.loads(sys.argv[1])
src = loader.ArrayRecordSource(files)
ds = loader.MapDataset.source(src).shuffle(seed=11).to_iter_dataset().filter(lambda r: r[0] % 2 == 0).batch(4)
it = iter(ds)
if len(sys.argv) > 2:
  loader.restore_state(sys.argv[2], it)
print(json.dumps([[r.hex() for r in b] for b in it]))
"""


def test_stream_and_restore_are_identical_in_a_new_process(files, tmp_path):
  env = {**os.environ, "PYTHONPATH": _ROOT}
  run = lambda *a: json.loads(subprocess.run([sys.executable, "-c", _SUBPROCESS, json.dumps(files), *a],
                                             capture_output=True, text=True, check=True, env=env,
                                             timeout=120).stdout)
  src = loader.ArrayRecordSource(files)
  ds = loader.MapDataset.source(src).shuffle(seed=11).to_iter_dataset().filter(lambda r: r[0] % 2 == 0).batch(4)
  here = [[r.hex() for r in b] for b in ds]
  assert run() == here
  it = iter(ds)
  for _ in range(5):
    next(it)
  loader.save_state(tmp_path / "s.json", it)
  assert run(str(tmp_path / "s.json")) == here[5:]


def test_iterator_is_a_context_manager_and_close_is_idempotent():
  ds = loader.MapDataset.range(10).to_iter_dataset().prefetch(2)
  with iter(ds) as it:
    assert next(it) == 0
  it.close()


class _Flaky:
  """Raises the first `times` times it sees a value in `bad`, then passes it."""

  def __init__(self, bad, times):
    self.left = {b: times for b in bad}

  def __call__(self, x):
    if self.left.get(x, 0) > 0:
      self.left[x] -= 1
      raise RuntimeError(f"transient failure at {x}")
    return x


@pytest.mark.parametrize("stage", ["prefix_map", "prefix_batch", "prefetch", "seq_map", "seq_filter", "seq_batch"])
def test_an_error_consumes_the_failing_element_and_next_goes_on_as_in_grain(stage):
  # The random-access prefix retries a failed chunk element by element once,
  # so there an error must occur twice to surface; and where a loaded machine
  # measures the map as costly, the probes that decide whether to split chunks
  # over threads may compute (and drop) the element a few times more.
  times = 10 if stage in ("prefix_map", "prefix_batch", "prefetch") else 1
  base = loader.MapDataset.range(30).to_iter_dataset()

  def make(flaky):
    return {
        "prefix_map": lambda: base.map(flaky).batch(4),
        "prefix_batch": lambda: loader.MapDataset.range(30).map(flaky).batch(4).to_iter_dataset(),
        "prefetch": lambda: base.map(flaky).prefetch(3),
        "seq_map": lambda: base.filter(lambda x: x != 2).batch(4).map(lambda b: [flaky(int(x)) for x in b]),
        "seq_filter": lambda: base.filter(lambda x: x != 2).batch(2).filter(lambda b: flaky(int(b[0])) >= 0),
        "seq_batch": lambda: base.filter(lambda x: x != 2).batch(4, batch_fn=lambda v: [flaky(int(x)) for x in v]),
    }[stage]()

  as_list = lambda xs: [np.asarray(x).tolist() for x in xs]
  reference = as_list(make(_Flaky((), 0)))
  it = iter(make(_Flaky({13}, times)))
  before = []
  with pytest.raises(RuntimeError, match="transient failure at 13"):
    for x in it:
      before.append(np.asarray(x).tolist())
  assert before == reference[:len(before)]
  state = it.get_state()
  # The failed element (a whole batch where the batch is computed with the
  # reads: a MapDataset.batch) is consumed; a loop that skips errors ends.
  # A batch after the map runs on the elements: as in Grain, the elements
  # read for the failed batch are consumed, and the next batch starts after 13.
  rest = ([list(range(s, min(s + 4, 30))) for s in range(14, 30, 4)] if stage == "prefix_map"
          else reference[len(before) + 1:])
  assert as_list(it) == rest
  restored = iter(make(_Flaky((), 0)))
  restored.set_state(state)
  assert as_list(restored) == rest


def test_computing_splits_that_do_not_run_side_by_side_leave_chunks_whole():
  computer = engine.ChunkComputer(loader.MapDataset.range(10_000), 4, cores_share=2)
  computer._cost = 1e-3  # pylint: disable=protected-access  # A costly map, measured.
  assert computer._slices(100) == 2  # pylint: disable=protected-access  # Computing: at most the cores.
  # Two threads that kept 1.1 cores busy (a map holding the GIL): whole chunks...
  computer._note_split(2, cpu=1.1, elapsed=1.0)  # pylint: disable=protected-access
  assert [computer._slices(100) for _ in range(engine._REPROBE_CHUNKS)] == [1] * engine._REPROBE_CHUNKS  # pylint: disable=protected-access
  # ...then a split again, to see whether that changed.
  assert computer._slices(100) == 2  # pylint: disable=protected-access
  computer._note_split(2, cpu=1.9, elapsed=1.0)  # pylint: disable=protected-access  # Side by side: keep splitting.
  assert computer._slices(100) == 2  # pylint: disable=protected-access
  computer._note_split(2, cpu=0.2, elapsed=1.0)  # pylint: disable=protected-access  # Waiting (I/O): every thread.
  assert computer._slices(100) == 4  # pylint: disable=protected-access
  computer.close()


def test_gil_bound_map_on_threads_gives_the_same_stream():
  def busy(x):
    total = 0
    for i in range(6000):  # ~150-300 µs of pure Python, well above the split threshold: holds the GIL.
      total += i * x
    return total

  ds = loader.MapDataset.range(3000).shuffle(seed=1).map(busy).batch(16)
  expected = list(ds.to_iter_dataset(loader.ReadOptions(num_threads=0)))
  got = list(ds.to_iter_dataset(loader.ReadOptions(num_threads=4)))
  assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))
  # Before the first split of these folded batches, a probe of a few records
  # on two threads finds that they do not run side by side: chunks stay whole.
  # On a busy machine the first batch may get well under half a core; it then
  # reads as waiting, as I/O does, and the next chunk is split without a probe.
  # That split measures its own CPU: either it still reads as waiting, or it
  # finds the threads were not side by side and leaves the next chunks whole.
  computer = engine.ChunkComputer(ds, 4, cores_share=2)
  first, _, _ = computer.compute(0, 1)
  rest, _, _ = computer.compute(1, 9)
  assert computer.split_width() == 1 or computer._waits, (  # pylint: disable=protected-access
      computer._probed, computer._whole_left, computer._cost)  # pylint: disable=protected-access
  assert all(np.array_equal(a, b) for a, b in zip(first + rest, expected[:9]))
  computer.close()


def test_streaming_source_with_threads_and_a_costly_map_loses_no_record():
  # A source that ignores the index (as MaxText's HFDataSource) must not feed
  # the split probe, whose records would be read and dropped.
  class Streaming:
    def __init__(self, n):
      self._it, self._n = iter(range(n)), n

    def __len__(self):
      return self._n

    def __getitem__(self, index):
      return next(self._it)

  def costly(x):
    total = 0
    for i in range(3000):  # ~100 µs of computing: the work that is probed before a split.
      total += i
    return x + 0 * total

  ds = loader.MapDataset.source(Streaming(640)).map(costly).batch(32, drop_remainder=True)
  got = np.concatenate(list(ds.to_iter_dataset(loader.ReadOptions(num_threads=4))))
  assert sorted(got.tolist()) == list(range(640))
  assert engine._reads_by_index(loader.MapDataset.range(5).map(costly).batch(2))  # pylint: disable=protected-access
  assert not engine._reads_by_index(ds)  # pylint: disable=protected-access


def test_chunk_sizes_ramp_up_and_adapt_to_cost_bytes_and_workers():
  records = loader.MapDataset.range(1_000_000)
  sizer = engine.ChunkSizer(records.batch(256), None)
  assert [sizer.size(0) for _ in range(4)] == [1, 4, 16, 64]  # Small first chunks, then 4x.
  sizer.observe([np.zeros(256, np.int64)], seconds=1e-4)
  assert sizer.size(0) == 256 and sizer.size(0) == 256  # Up to ~64k records per call.
  for parallelism, per_element, expected in ((1, 0.1, 1), (2, 0.1, 1), (1, 3e-6, 65536), (2, 3e-6, 33333)):
    sizer = engine.ChunkSizer(records, None, parallelism=parallelism)
    for _ in range(10):
      sizer.size(0)
    sizer.observe([0] * 10, seconds=10 * per_element)
    # A slow map gets ~0.1 s chunks; cheap records get the full 64k in
    # process (0.2 s here), ~0.1 s per worker task.
    assert sizer.size(0) == expected
  # A first chunk that paid one-off costs (opening files: 20 ms for one
  # element) does not hold the ramp back: the cost is weighted by elements.
  cold = engine.ChunkSizer(records.batch(256), None)
  sizes = []
  for i in range(8):
    sizes.append(cold.size(0))
    cold.observe([np.zeros(256, np.int64)] * sizes[-1], seconds=0.02 if i == 0 else 0.0008 * sizes[-1])
  assert sizes[:5] == [1, 4, 16, 64, 256] and sizes[-1] == 256
  big = engine.ChunkSizer(records, None)
  big.observe([np.zeros(4 << 20, np.uint8)])  # 4 MiB elements: ~64 MiB per chunk.
  assert max(big.size(0) for _ in range(6)) == 16
  # A 40-element dataset spread over 4 workers: no chunk takes more than a fair share.
  small = engine.ChunkSizer(loader.MapDataset.range(40), None, parallelism=4)
  assert max(small.size(0) for _ in range(6)) == 5
  shared = engine.ChunkSizer(records, None, parallelism=2)
  # Until a chunk is measured, 1 and 4 elements (a slow source's first
  # element comes at once); then each worker ramps from 64 records.
  assert [shared.size(0) for _ in range(6)] == [1, 4, 256, 256, 1024, 1024]
  assert engine.ChunkSizer(records.batch(10), 50).size(0) == 5  # Fixed, in records.


def test_a_stalled_chunk_costs_one_small_chunk_and_a_lasting_slowdown_is_followed_at_once():
  # A process stopped, preempted or paused while it computed one chunk: that
  # chunk took 50x as long. The next chunk is sized by it (it may be real),
  # and when that one is cheap again the stall is forgotten: cheap records
  # go on in full chunks (smaller reads are slower, which kept the estimate
  # high: under the bench's time slices the loader read 0.70-0.75 of the raw
  # rate, against 0.84-0.91 with full chunks). Work that stays 400x slower
  # (0.27 s per batch) gets ~0.1 s chunks right after its first slow one.
  batches = loader.MapDataset.range(10_000_000).batch(256)
  per_batch = 256 * 2.6e-6  # Shuffled 1 KB ArrayRecord reads here.

  def sizes(slowdown_from_chunk):
    sizer = engine.ChunkSizer(batches, None)
    out = []
    for i in range(12):
      out.append(sizer.size(0))
      factor = slowdown_from_chunk(i)
      sizer.observe([np.zeros(256, np.int64)] * out[-1], seconds=per_batch * out[-1] * factor)
    return out

  steady = sizes(lambda i: 1)
  assert steady[4:] == [256] * 8
  stalled = sizes(lambda i: 50 if i == 6 else 1)
  assert stalled[:7] == steady[:7] and stalled[7] < 16 and stalled[8:] == [256] * 4
  slower = sizes(lambda i: 400 if i >= 6 else 1)
  assert slower[:7] == steady[:7] and slower[7:] == [1] * 5


@pytest.mark.parametrize("threads", [0, 2])
def test_the_first_element_of_a_slow_source_waits_for_no_other(threads):
  # Before any chunk is measured, chunks hold 1 then 4 elements: the first
  # next() reads at most those, not the 64 records of a first full chunk
  # (20 ms records made that 1.2 s; Grain reads one or two).
  # With threads, later chunks are computed ahead as soon as the first is
  # handed out, so counting reads after next() returned raced with them (a
  # consumer descheduled for a few ms saw 11). Reads past the first 5 wait
  # for a gate instead, opened only after the first next() returned: that
  # next() can only have returned without them.
  gate, gated_out = threading.Event(), []

  class Slow:
    def __init__(self):
      self.reads = 0

    def __len__(self):
      return 60

    def __getitem__(self, i):
      if i >= 5 and not gate.wait(timeout=30):  # Only a first next() that needs element 5+ waits it out.
        gated_out.append(i)
        gate.set()
      self.reads += 1
      time.sleep(0.002)
      return i

  source = Slow()
  it = iter(loader.MapDataset.source(source).to_iter_dataset(loader.ReadOptions(num_threads=threads)))
  assert next(it) == 0
  gate.set()
  assert not gated_out, f"the first next() waited for elements {gated_out}"
  assert list(it) == list(range(1, 60))


def test_elements_slower_than_a_chunk_target_still_use_every_thread():
  # 120 ms per record is over the 0.1 s a chunk aims at: chunks must still
  # hold one element per reading thread (not one element, read one at a time).
  lock = threading.Lock()
  running, most = [0], [0]

  class Waiting:
    def __len__(self):
      return 24

    def __getitem__(self, i):
      with lock:
        running[0] += 1
        most[0] = max(most[0], running[0])
      time.sleep(0.12)
      with lock:
        running[0] -= 1
      return i

  ds = loader.MapDataset.source(Waiting()).to_iter_dataset(loader.ReadOptions(num_threads=8))
  assert list(ds) == list(range(24))
  assert most[0] >= 6  # The first two chunks, before any measurement, hold 1 and 4.


def test_read_options_validation_and_closed_iterators():
  with pytest.raises(ValueError, match=r"num_threads must be an integer >= 0 \(got num_threads=-2\)"):
    loader.ReadOptions(num_threads=-2)
  with pytest.raises(ValueError, match="chunk_size must be positive: an integer >= 1"):
    loader.MultiprocessingOptions(num_workers=1, chunk_size=0)
  it = iter(loader.MapDataset.range(5).to_iter_dataset(loader.ReadOptions(chunk_size=2)))
  next(it)
  it.close()
  with pytest.raises(ValueError, match="closed"):
    list(it)


@pytest.mark.parametrize("make", [
    lambda: loader.MapDataset.range(30).to_iter_dataset().prefetch(4),
    lambda: loader.MapDataset.range(30).to_iter_dataset(loader.ReadOptions(num_threads=2)),
    lambda: loader.MapDataset.range(30).to_iter_dataset().batch(4).mp_prefetch(loader.MultiprocessingOptions(num_workers=1)),
    lambda: loader.MapDataset.range(30).to_iter_dataset().filter(lambda x: x % 2).batch(4),
])
def test_start_prefetch_starts_background_work_without_changing_the_stream(make):
  reference = list(make())
  with iter(make()) as it:
    it.start_prefetch()
    it.start_prefetch()  # Idempotent.
    assert_streams_equal(list(it), reference)


def test_a_state_that_cannot_be_saved_names_the_checkpoint_not_a_temp_file(tmp_path):
  it = iter(loader.MapDataset.range(10).to_iter_dataset())
  next(it)
  (tmp_path / "afile").write_text("mine")
  target = tmp_path / "afile" / "state.json"
  with pytest.raises(OSError) as e:
    loader.save_state(target, it)
  assert str(e.value).startswith(f"[Errno 17] File exists: cannot save the iterator state to {target}; the file "
                                 "was not created. A part of its folder's path is a file: save elsewhere")
  assert (tmp_path / "afile").read_text() == "mine"


def test_a_restore_interrupted_by_ctrl_c_leaves_the_iterator_wholly_where_it_was(monkeypatch, tmp_path):
  from loader import engine
  ds = loader.MapDataset.range(1000).shuffle(seed=3).batch(8).to_iter_dataset()
  reference = [b.tolist() for b in ds]
  it = iter(ds)
  for _ in range(50):
    next(it)
  loader.save_state(str(tmp_path / "s.json"), it)
  it = iter(ds)
  for _ in range(3):
    next(it)
  real, calls = engine.ThreadChunkProducer.reset, []

  def interrupted_once(self, start):
    calls.append(start)
    if len(calls) == 1:
      raise KeyboardInterrupt  # The Ctrl-C, landing as the restore moves the producer.
    return real(self, start)

  monkeypatch.setattr(engine.ThreadChunkProducer, "reset", interrupted_once)
  with pytest.raises(KeyboardInterrupt):
    loader.restore_state(str(tmp_path / "s.json"), it)
  assert it.get_state()["next_index"] == 3
  assert [next(it).tolist() for _ in range(3)] == reference[3:6]
  loader.restore_state(str(tmp_path / "s.json"), it)  # Restoring again works.
  assert [b.tolist() for b in it] == reference[50:]
