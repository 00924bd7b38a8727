"""Grain 0.2.18's prefetch / legacy-API unit tests, ported to public names and run on Grain and loader.

Sources (grain/_src/... at 0.2.18): python/dataset/transformations/prefetch_test.py,
python/dataset/transformations/process_prefetch_test.py, python/data_sources_test.py,
python/samplers_test.py, python/operations_test.py, python/options_test.py,
python/load_test.py, python/record_test.py, core/sharding_test.py.

Each snippet is written for Grain (`import grain` / `import grain.python as grain`)
and runs a second time with only its import lines pointed at loader; results,
exceptions, shuffle orders and per-record RNG draws must equal Grain's.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, structure

# Every record a sampler gives one shard (samplers_test.py's helper), in both sampler cases.
ALL_METADATA = """
def all_metadata(sampler, shard_options):
  metadata, i = [], shard_options.shard_index
  while True:
    try:
      metadata.append(sampler[i])
    except IndexError:
      break
    i += shard_options.shard_count
  return metadata


def fields(metadata):
  return [[m.index, m.record_key, m.rng] for m in metadata]
"""

# [the exception's nearest built-in class (what `except` clauses name), message], in both heads.
CATCH = """
def catch(fn):
  # [the exception's nearest built-in class (what `except` clauses name), message]
  try:
    fn()
  except BaseException as e:  # pylint: disable=broad-except
    return [next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__, str(e)]
  return None
"""

# An endless source with no MapDataset part (Grain's test helper), in both heads.
ITER_SOURCE = """
class RepeatedIntSourceIterDataset(grain.IterDataset):

  def __iter__(self):
    return RepeatedIntSourceDatasetIterator()


class RepeatedIntSourceDatasetIterator(grain.DatasetIterator):

  def __next__(self) -> int:
    return 1

  def set_state(self, state):
    pass

  def get_state(self):
    return {}
"""

HEAD = """
import dataclasses
import gc
import logging
import sys
import threading
import time
import grain
import grain.python as pygrain  # Makes grain.python an attribute, as in a client.
import numpy as np


""" + CATCH + """

def kind(fn):
  caught = catch(fn)
  return caught and caught[0]


def raises(fn, cls):
  try:
    fn()
  except cls:
    return True
  except BaseException:  # pylint: disable=broad-except
    return False
  return False


@dataclasses.dataclass(frozen=True)
class FilterKeepingOddElementsOnly(grain.transforms.Filter):

  def filter(self, element: int) -> bool:
    return bool(element % 2)


@dataclasses.dataclass(frozen=True)
class FilterAllElements(grain.transforms.Filter):

  def filter(self, element: int):
    return False


""" + ITER_SOURCE + """


def restore_steps(make, max_steps, steps, fresh=False):
  it = make()
  reference, checkpoints = [], []
  for _ in range(max_steps):
    checkpoints.append(it.get_state())
    reference.append(next(it))
  resumed = {}
  for step in steps:
    if fresh:
      it = make()
    it.set_state(checkpoints[step])
    resumed[step] = [next(it) for _ in range(step, max_steps)]
  return reference, resumed

""" + porting.CAPTURE_LOGS

# name -> (snippet setting `result`, Grain's test's expectation or None).
CASES = {
    # ---- prefetch_test.py: PrefetchIterDataset = MapDataset.to_iter_dataset(read_options) ----
    "prefetch_dense": ("""
result = {}
for size in (0, 1, 10):
  it = iter(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions(prefetch_buffer_size=size)))
  result[size] = [next(it) for _ in range(20)]
""", {0: list(range(20)), 1: list(range(20)), 10: list(range(20))}),
    "prefetch_sparse_allow_nones": ("""
result = {}
for size in (0, 1, 10):
  it = iter(grain.MapDataset.range(20).filter(FilterKeepingOddElementsOnly()).to_iter_dataset(
      read_options=grain.ReadOptions(prefetch_buffer_size=size), allow_nones=True))
  result[size] = [next(it) for _ in range(20)]
""", {k: [i if i % 2 else None for i in range(20)] for k in (0, 1, 10)}),
    "prefetch_iterates_one_epoch": ("""
it = iter(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions()))
result = [[next(it) for _ in range(20)], catch(lambda: next(it)), catch(lambda: next(it))]
""", [list(range(20)), ["StopIteration", ""], ["StopIteration", ""]]),
    "prefetch_checkpoint": ("""
result = {}
for size in (0, 500):
  make = lambda: iter(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions(prefetch_buffer_size=size)))
  result[size, "same"] = restore_steps(make, 20, [0, 1, 5, 12, 18])
  result[size, "fresh"] = restore_steps(make, 20, [0, 1, 5, 12, 18], fresh=True)
""", None),
    "prefetch_filter_all_elements_raises": ("""
ds = grain.MapDataset.range(0, 1000).filter(FilterAllElements()).to_iter_dataset()
ds = grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.9))
err = catch(lambda: list(ds))
result = [err[0], "100.00" in err[1]]
""", ["ValueError", True]),
    "prefetch_filter_all_elements_allow_nones_does_not_raise": ("""
ds = grain.MapDataset.range(0, 1000).filter(FilterAllElements()).to_iter_dataset(allow_nones=True)
ds = grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.9))
result = list(ds) == [None] * 1000
""", True),
    "prefetch_iterator_has_no_reference_cycle": ("""
ds_iter = iter(grain.MapDataset.range(0, 1000).map(lambda x: x).to_iter_dataset())
before = sys.getrefcount(ds_iter)
counts = set()
for _ in range(1000):
  next(ds_iter)
  counts.add(sys.getrefcount(ds_iter) - before)
result = sorted(counts)
""", [0]),
    "prefetch_start_prefetch": ("""
result = {}
for calls in (1, 10):
  for threads in (0, 16):
    it = iter(grain.MapDataset.range(10).map(lambda x: x).to_iter_dataset(read_options=grain.ReadOptions(threads)))
    for _ in range(calls):
      it.start_prefetch()
    result[calls, threads] = list(it)
""", {(c, t): list(range(10)) for c in (1, 10) for t in (0, 16)}),
    "prefetch_get_and_set_next_index": ("""
it = iter(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions()))
indices = []
for i in range(20):
  indices.append(grain.experimental.get_next_index(it))
  next(it)
it = iter(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions()))
after_set = []
for i in reversed(range(20)):
  grain.experimental.set_next_index(it, i)
  after_set.append(next(it))
result = [indices, after_set]
""", [list(range(20)), list(reversed(range(20)))]),
    "prefetch_element_spec": ("""
spec = grain.experimental.get_element_spec(grain.MapDataset.range(20).to_iter_dataset(read_options=grain.ReadOptions()))
result = [spec.shape, np.dtype(spec.dtype).name]
""", [[], "int64"]),
    # ---- prefetch_test.py: ThreadPrefetchIterDataset / ThreadPrefetchDatasetIterator ----
    "thread_prefetch_data": ("""
result = {}
for size, warm in ((0, False), (0, True), (1, True), (20, False), (200, True)):
  ds = grain.experimental.ThreadPrefetchIterDataset(
      grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()), prefetch_buffer_size=size)
  it = ds.__iter__()
  if warm:
    it.start_prefetch()
  result[size, warm] = list(it)
""", {k: list(range(1, 20, 2)) for k in ((0, False), (0, True), (1, True), (20, False), (200, True))}),
    "thread_prefetch_checkpoint": ("""
result = {}
for warm in (False, True):
  def make():
    it = grain.experimental.ThreadPrefetchIterDataset(
        grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()),
        prefetch_buffer_size=500).__iter__()
    if warm:
      it.start_prefetch()
    return it
  result[warm] = restore_steps(make, 10, range(9))
ds = grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()), prefetch_buffer_size=2)
result["fresh"] = restore_steps(ds.__iter__, 10, range(9), fresh=True)
""", None),
    "thread_prefetch_get_state_does_not_start_prefetch": ("""
event = threading.Event()

def f(x):
  event.set()
  return x

it = grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.source([1, 2, 3]).map(f).to_iter_dataset(), prefetch_buffer_size=10).__iter__()
it.get_state()
time.sleep(1)
result = event.is_set()
""", False),
    "thread_prefetch_state_comes_from_the_parent": ("""
# Grain's test sets a hand-written state; here the state is the iterator's own (formats may differ).
class CountingIterator(grain.DatasetIterator):

  def __init__(self):
    super().__init__()
    self.count = 0

  def __next__(self):
    if self.count >= 10:
      raise StopIteration
    self.count += 1
    return self.count

  def get_state(self):
    return {'count': self.count}

  def set_state(self, state):
    self.count = state['count']


class CountingDataset(grain.IterDataset):

  def __iter__(self):
    return CountingIterator()


ds = grain.experimental.ThreadPrefetchIterDataset(CountingDataset(), prefetch_buffer_size=3)
result = [restore_steps(ds.__iter__, 10, range(10)), restore_steps(ds.__iter__, 10, range(10), fresh=True)]
it = ds.__iter__()
head = [next(it) for _ in range(4)]
state = it.get_state()
rest = list(it)
it.set_state(state)
result.append([head, rest, list(it)])
""", None),
    "thread_prefetch_negative_buffer_raises": ("""
result = kind(lambda: grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.range(20).to_iter_dataset(), prefetch_buffer_size=-1))
""", "ValueError"),
    "thread_prefetch_no_reference_to_itself_and_no_hang_after_stop": ("""
ds = grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.source([1, 2, 3]).repeat(100).to_iter_dataset(), prefetch_buffer_size=10)
it = ds.__iter__()
before = sys.getrefcount(it)
_ = next(it)
result = [sys.getrefcount(it) - before, len(list(it)), list(it)]
""", [0, 299, []]),
    "thread_prefetch_nonnative_iterator": ("""
class TestIterator:

  def __init__(self):
    self._counter = 0

  def __iter__(self):
    return self

  def __next__(self) -> int:
    self._counter += 1
    if self._counter > 10:
      raise StopIteration
    return self._counter

  def get_state(self):
    return {'counter': self._counter}

  def set_state(self, state):
    self._counter = state['counter']


it = grain.experimental.ThreadPrefetchDatasetIterator(TestIterator(), prefetch_buffer_size=10)
elements = [next(it) for _ in range(5)]
checkpoint = it.get_state()
elements.extend(it)
it.set_state(checkpoint)
result = [elements, list(it)]
""", [list(range(1, 11)), list(range(6, 11))]),
    "thread_prefetch_threads_released": ("""
ds = (grain.MapDataset.range(1000).repeat().map(lambda x: x * np.ones((10, 10), dtype=np.int64))
      .to_iter_dataset(grain.ReadOptions(prefetch_buffer_size=0)))
ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=10)
ds = ds.map(lambda x: x + 1)
ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=10)
before = threading.active_count()
sums = []
for close in (True, False):
  for _ in range(30):
    it = ds.__iter__()
    sums.append(int(sum(next(it).sum() for _ in range(5))))
    if close:
      it.close()
    del it
gc.collect()
time.sleep(0.5)
result = [sums[:3], threading.active_count() - before < 10]
""", None),
    "thread_prefetch_early_break_continues_prefetching": ("""
result = {}
for close in (True, False):
  count = 0
  lock = threading.Lock()

  class SlowCountingSource:

    def __len__(self):
      return 16

    def __getitem__(self, index):
      global count
      time.sleep(0.1)
      with lock:
        count += 1
      return index

  it = grain.MapDataset.source(SlowCountingSource()).to_iter_dataset(grain.ReadOptions(num_threads=2)).__iter__()
  started = count
  next(it)
  read = count > 0
  if close:
    it.close()
  time.sleep(1)
  result[close] = [started, read, count < 8 if close else count > 8]
""", {True: [0, True, True], False: [0, True, True]}),
    "thread_prefetch_next_index": ("""
make = lambda: grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.range(20).to_iter_dataset(), prefetch_buffer_size=10).__iter__()
it = make()
indices = []
for i in range(20):
  indices.append(grain.experimental.get_next_index(it))
  next(it)
it = make()
after_set = []
for i in reversed(range(20)):
  grain.experimental.set_next_index(it, i)
  after_set.append(next(it))
result = [indices, after_set]
""", [list(range(20)), list(reversed(range(20)))]),
    "thread_prefetch_element_spec": ("""
spec = grain.experimental.get_element_spec(grain.experimental.ThreadPrefetchIterDataset(
    grain.MapDataset.range(2).to_iter_dataset(), prefetch_buffer_size=1))
result = [spec.shape, np.dtype(spec.dtype).name]
""", [[], "int64"]),
    # ---- prefetch_test.py: multithread_prefetch ----
    "multithread_prefetch_data": ("""
result = {}
for threads, size in ((0, 1), (1, 1), (1, 20), (10, 1), (10, 20)):
  result[threads, size] = list(grain.experimental.multithread_prefetch(
      grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()),
      num_threads=threads, buffer_size=size))
""", {k: list(range(1, 20, 2)) for k in ((0, 1), (1, 1), (1, 20), (10, 1), (10, 20))}),
    "multithread_prefetch_size_zero_data": ("""
result = list(grain.experimental.multithread_prefetch(
    grain.MapDataset.source([np.zeros(shape=(0,), dtype=np.int64)]).repeat(3).to_iter_dataset(),
    num_threads=1, buffer_size=1))
""", [[], [], []]),
    "multithread_prefetch_checkpoint": ("""
result = {}
for threads in (0, 1, 10):
  make = lambda: grain.experimental.multithread_prefetch(
      grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()),
      num_threads=threads, buffer_size=1).__iter__()
  for step in (0, 3, 8):
    result[threads, step] = restore_steps(make, 10, [step])
  result[threads, "twice"] = restore_steps(make, 10, [0, 3, 8])
  result[threads, "fresh"] = restore_steps(make, 10, [0, 3, 8], fresh=True)
""", None),
    "multithread_prefetch_iter_source": ("""
it = iter(grain.experimental.multithread_prefetch(
    RepeatedIntSourceIterDataset().map(lambda x: x + 1), num_threads=1, buffer_size=1))
err = catch(lambda: grain.experimental.multithread_prefetch(
    RepeatedIntSourceIterDataset().map(lambda x: x + 1), num_threads=2, buffer_size=1)) or [None, ""]
result = [next(it), err[0], "Cannot slice `IterDataset` source." in err[1]]
""", [2, "ValueError", True]),
    "multithread_prefetch_propagates_transform_error": ("""
def failing_transform(element):
  raise ValueError('I shall fail!')

result = catch(lambda: list(grain.experimental.multithread_prefetch(
    grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly()).map(failing_transform),
    num_threads=1, buffer_size=1)))
""", ["ValueError", "I shall fail!"]),
    "multithread_prefetch_start_prefetch": ("""
class SleepTransform(grain.transforms.Map):

  def map(self, features):
    time.sleep(0.02)
    return features

result = {}
for calls in (0, 1, 10):
  for size in (1, 20):
    ds = grain.experimental.multithread_prefetch(
        grain.MapDataset.range(10).map(SleepTransform()).to_iter_dataset(), num_threads=6, buffer_size=size)
    it = ds.__iter__()
    for _ in range(calls):
      it.start_prefetch()
    result[calls, size] = list(it)
""", {(c, s): list(range(10)) for c in (0, 1, 10) for s in (1, 20)}),
    "multithread_prefetch_but_no_read": ("""
for sleep_s in (0, 0.3):
  ds = grain.MapDataset.source([1, 2, 3]).repeat().filter(lambda x: x > 3).to_iter_dataset()
  it = grain.experimental.multithread_prefetch(ds, num_threads=1, buffer_size=1).__iter__()
  it.start_prefetch()
  time.sleep(sleep_s)
  del it
result = "done"
""", "done"),
    "multithread_prefetch_random_map": ("""
ds = grain.MapDataset.source([0]).repeat(100).to_iter_dataset()
ds = ds.random_map(lambda x, rng: x + rng.integers(sys.maxsize), seed=42)
elements = list(grain.experimental.multithread_prefetch(ds, num_threads=5, buffer_size=1))
result = [len(set(elements)), elements]
""", None),
    "multithread_prefetch_concurrent_start_prefetch": ("""
from concurrent import futures

def make_iter(i):
  return grain.experimental.multithread_prefetch(
      grain.MapDataset.source([i]).to_iter_dataset(), num_threads=1, buffer_size=1).__iter__()

iters = [make_iter(i) for i in range(10)]
with futures.ThreadPoolExecutor(max_workers=10) as executor:
  for it in iters:
    executor.submit(it.start_prefetch)
result = [next(it) for it in iters]
""", list(range(10))),
    "multithread_prefetch_options_before_and_after": ("""
options = grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)
ds = grain.experimental.WithOptionsIterDataset(
    grain.MapDataset.source([1, 2, 3]).repeat(1000).to_iter_dataset(), options)
before = grain.experimental.multithread_prefetch(ds, num_threads=1, buffer_size=1).filter(lambda x: x > 2)
after = grain.experimental.WithOptionsIterDataset(grain.experimental.multithread_prefetch(
    grain.MapDataset.source([1, 2, 3]).repeat(1000).filter(lambda x: x > 2).to_iter_dataset(),
    num_threads=1, buffer_size=1), options)
result = [kind(lambda: list(before)), kind(lambda: list(after))]
""", ["ValueError", "ValueError"]),
    "multithread_prefetch_sequential_slice": ("""
def run(ds, **kwargs):
  return list(grain.experimental.multithread_prefetch(ds, num_threads=3, buffer_size=1, **kwargs))

result = dict(
    source_on=run(grain.MapDataset.source(range(10)).to_iter_dataset(), sequential_slice=True),
    source_off=run(grain.MapDataset.source(range(10)).to_iter_dataset(), sequential_slice=False),
    source_default=run(grain.MapDataset.source(range(10)).to_iter_dataset()),
    range_on=run(grain.MapDataset.range(10).to_iter_dataset(), sequential_slice=True),
    range_slice_on=run(grain.MapDataset.range(start=2, stop=21, step=3).to_iter_dataset(), sequential_slice=True),
)
""", dict(source_on=[0, 4, 7, 1, 5, 8, 2, 6, 9, 3], source_off=list(range(10)), source_default=list(range(10)),
          range_on=[0, 4, 7, 1, 5, 8, 2, 6, 9, 3], range_slice_on=[2, 11, 17, 5, 14, 20, 8])),
    # ---- process_prefetch_test.py, in-process part: mp_prefetch with num_workers=0 is a no-op ----
    "mp_prefetch_zero_workers": ("""
ds = grain.MapDataset.range(20).to_iter_dataset().filter(FilterKeepingOddElementsOnly())
make = lambda: ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=0, per_worker_buffer_size=1)).__iter__()
result = [list(make()), restore_steps(make, 10, [0, 3, 8])]
""", None),
    "multiprocessing_options_defaults": ("""
o = grain.MultiprocessingOptions()
m = grain.multiprocessing.MultiprocessingOptions(num_workers=3, per_worker_buffer_size=2)
result = [o.num_workers, o.per_worker_buffer_size, o.enable_profiling, m.num_workers, m.per_worker_buffer_size,
          grain.MultiprocessingOptions is grain.multiprocessing.MultiprocessingOptions]
""", [0, 1, False, 3, 2, True]),
    # ---- options_test.py ----
    "read_options": ("""
ro = grain.ReadOptions()
result = [ro.num_threads, ro.prefetch_buffer_size,
          kind(lambda: grain.ReadOptions(num_threads=-1)),
          kind(lambda: grain.ReadOptions(prefetch_buffer_size=-1))]
""", [16, 500, "ValueError", "ValueError"]),
    "read_options_warns_when_buffer_is_smaller_than_threads": ("""
capture = Capture()
logging.getLogger().addHandler(capture)
grain.ReadOptions(num_threads=10, prefetch_buffer_size=5)
warned = [m for m in capture.messages if "prefetch_buffer_size=5 is smaller than num_threads=10" in m]
capture.messages.clear()
grain.ReadOptions(num_threads=10, prefetch_buffer_size=0)
result = [len(warned), [m for m in capture.messages if "smaller than" in m]]
""", [1, []]),
    # ---- data_sources_test.py ----
    "range_data_source": ("""
result = {}
for args in ((0, 10, 2), (10, 0, -2), (0, 0, 1)):
  ds = grain.sources.RangeDataSource(*args)
  result[args] = [len(ds), [ds[i] for i in range(len(ds))], kind(lambda: ds[len(ds)]), kind(lambda: ds[-1])]
result["step0"] = kind(lambda: grain.python.RangeDataSource(0, 10, 0))
result["negative_length"] = kind(lambda: grain.python.RangeDataSource(10, 0, 1))
result["np_index"] = grain.python.RangeDataSource(0, 10, 2)[np.int64(3)]
result["repr"] = repr(grain.python.RangeDataSource(0, 10, 2))
""", {(0, 10, 2): [5, [0, 2, 4, 6, 8], "IndexError", "IndexError"],
      (10, 0, -2): [5, [10, 8, 6, 4, 2], "IndexError", "IndexError"],
      (0, 0, 1): [0, [], "IndexError", "IndexError"], "step0": "AssertionError",
      "negative_length": "AssertionError", "np_index": 6, "repr": "RangeDataSource(start=0, stop=10, step=2)"}),
    "shared_memory_data_source": ("""
sequence = list(range(12))
ds = grain.sources.SharedMemoryDataSource(sequence)
result = dict(by_index=[ds[i] for i in range(len(ds))], by_iter=list(ds), length=len(ds),
              same_class=grain.python.InMemoryDataSource is grain.sources.SharedMemoryDataSource)
ds.close()
ds.unlink()
empty = grain.python.InMemoryDataSource([])
result["empty"] = len(empty)
empty.close()
empty.unlink()
named = grain.python.InMemoryDataSource(sequence, name="DataSourceTestingStr_" + str(id(result)))
result["str"] = str(named) == f"InMemoryDataSource(name={named.shm.name}, len=12)"
attached = grain.python.InMemoryDataSource(name=named.shm.name)
result["attached"] = list(attached)
attached.close()
named.close()
named.unlink()
result["no_args"] = kind(lambda: grain.python.InMemoryDataSource())
mixed = grain.python.InMemoryDataSource([1, 2.5, True, "s", b"b", None])
result["mixed"] = [repr(x) for x in mixed]
mixed.close()
mixed.unlink()
""", dict(by_index=list(range(12)), by_iter=list(range(12)), length=12, same_class=True, empty=0, str=True,
          attached=list(range(12)), no_args="ValueError", mixed=["1", "2.5", "True", "'s'", "b'b'", "None"])),
    "array_record_data_source_protocol_and_empty": ("""
result = [issubclass(grain.sources.ArrayRecordDataSource, grain.sources.RandomAccessDataSource),
          kind(lambda: grain.sources.ArrayRecordDataSource([]))]
""", [True, "ValueError"]),
    "array_record_data_source_reads": ("""
import pickle
ds = grain.sources.ArrayRecordDataSource(files)
single = grain.python.ArrayRecordDataSource(files[0])
result = dict(
    length=len(ds), records=[ds[i] for i in range(len(ds))], np_index=ds[np.int64(7)],
    single=[len(single), single[0], single[len(single) - 1]],
    pickled=[pickle.loads(pickle.dumps(ds))[i] for i in (0, 5, 11)],
    out_of_range=kind(lambda: ds[len(ds)]),
    negative=kind(lambda: ds[-1]),
    dataset=list(grain.MapDataset.source(ds).shuffle(seed=7).batch(4)),
    loader=list(grain.load(ds, num_epochs=1, shuffle=True, seed=1, batch_size=5)),
    paths=[str(p) for p in ([ds.paths] if isinstance(ds.paths, str) else ds.paths)],
)
""", None),
    # ---- samplers_test.py ----
    "sequential_sampler": ("""
""" + ALL_METADATA + """
result = dict(
    out_of_bounds=[kind(lambda: grain.samplers.SequentialSampler(num_records=42, shard_options=grain.sharding.NoSharding())[i])
                   for i in (-1, 42)],
    invalid=[kind(lambda: grain.samplers.SequentialSampler(num_records=n, shard_options=grain.sharding.NoSharding()))
             for n in (0, -18)],
    no_sharding=fields(all_metadata(grain.samplers.SequentialSampler(num_records=4, shard_options=grain.sharding.NoSharding()),
                                    grain.sharding.NoSharding())),
)
for count, drop, n in ((2, False, 4), (3, False, 8), (3, True, 8)):
  for index in range(count):
    options = grain.sharding.ShardOptions(shard_index=index, shard_count=count, drop_remainder=drop)
    sampler = grain.samplers.SequentialSampler(num_records=n, shard_options=options)
    result[count, drop, index] = [fields(all_metadata(sampler, options)), len(sampler)]
seeded = grain.samplers.SequentialSampler(num_records=4, shard_options=grain.sharding.NoSharding(), seed=3)
result["seeded"] = [[m.index, m.record_key, m.rng.random()] for m in (seeded[i] for i in range(4))]
""", None),
    "index_sampler_errors": ("""
result = dict(
    epochs=[kind(lambda: grain.samplers.IndexSampler(num_records=18, shard_options=grain.sharding.NoSharding(), num_epochs=n))
            for n in (0, -1)],
    tuple_seed=raises(lambda: grain.samplers.IndexSampler(num_records=4, shard_options=grain.sharding.NoSharding(),
                                                          shuffle=True, num_epochs=2, seed=(3, 4)), TypeError),
    big_seed=kind(lambda: grain.samplers.IndexSampler(num_records=4, shard_options=grain.sharding.NoSharding(),
                                                        shuffle=True, num_epochs=2, seed=2**32)),
    shuffle_without_seed=kind(lambda: grain.samplers.IndexSampler(num_records=4, shard_options=grain.sharding.NoSharding(),
                                                                    shuffle=True, num_epochs=1)),
    negative=kind(lambda: grain.samplers.IndexSampler(num_records=42, shard_options=grain.sharding.NoSharding())[-1]),
    too_large=kind(lambda: grain.samplers.IndexSampler(num_records=42, shard_options=grain.sharding.NoSharding(),
                                                         num_epochs=1)[42]),
    unbounded_len=len(grain.samplers.IndexSampler(num_records=42, shard_options=grain.sharding.NoSharding())) == sys.maxsize,
    far=[grain.samplers.IndexSampler(num_records=42, shard_options=grain.sharding.NoSharding())[10**6].record_key],
)
""", dict(epochs=["ValueError", "ValueError"], tuple_seed=True, big_seed="ValueError", negative="IndexError",
          too_large="IndexError")),
    "index_sampler_orders_and_rngs": ("""
""" + ALL_METADATA + """
def summary(metadata):
  draws = [m.rng.random() if m.rng is not None else None for m in metadata]
  return [[[m.index, m.record_key] for m in metadata], draws, len(set(draws)) == len(draws)]

result = {}
simple = grain.samplers.IndexSampler(num_records=200, shard_options=grain.sharding.NoSharding(), shuffle=True,
                                     num_epochs=2, seed=3)
result["simple"] = summary(all_metadata(simple, grain.sharding.NoSharding()))
result["no_sharding"] = summary(all_metadata(grain.samplers.IndexSampler(
    num_records=5, shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=2, seed=32),
    grain.sharding.NoSharding()))
for shuffle in (True, False):
  for drop, n in ((True, 6), (False, 8)):
    for epochs in (1, 2):
      for index in range(3):
        options = grain.sharding.ShardOptions(shard_index=index, shard_count=3, drop_remainder=drop)
        sampler = grain.samplers.IndexSampler(num_records=n, shard_options=options, shuffle=shuffle, num_epochs=epochs,
                                              seed=32 if shuffle else None)
        result[shuffle, drop, epochs, index] = summary(all_metadata(sampler, options)) + [len(sampler)]
first = all_metadata(grain.samplers.IndexSampler(num_records=5, shard_options=grain.sharding.NoSharding(),
                                                 shuffle=True, num_epochs=2, seed=32), grain.sharding.NoSharding())
second = all_metadata(grain.samplers.IndexSampler(num_records=5, shard_options=grain.sharding.NoSharding(),
                                                  shuffle=True, num_epochs=2, seed=32), grain.sharding.NoSharding())
result["determinism"] = summary(first) == summary(second)
result["metadata_equality"] = [first[0] == grain.RecordMetadata(index=0, record_key=2, rng=first[0].rng),
                               grain.RecordMetadata(index=0, record_key=2) == grain.RecordMetadata(index=0, record_key=2)]
""", None),
    # ---- core/sharding_test.py: even_split, seen through IndexSampler (public) ----
    "sharding_even_split_through_samplers": ("""
result = {}
for n, index, count, drop in ((9, 0, 1, True), (9, 0, 2, True), (9, 1, 2, True), (9, 0, 3, True), (9, 1, 3, True),
                              (9, 2, 3, True), (9, 0, 1, False), (9, 0, 2, False), (9, 1, 2, False), (8, 0, 3, False),
                              (8, 1, 3, False), (8, 2, 3, False)):
  options = grain.sharding.ShardOptions(shard_index=index, shard_count=count, drop_remainder=drop)
  sampler = grain.samplers.IndexSampler(num_records=n, shard_options=options, shuffle=False, num_epochs=1)
  keys, i = [], index
  while True:
    try:
      keys.append(sampler[i].record_key)
    except IndexError:
      break
    i += count
  result[n, index, count, drop] = [min(keys), max(keys) + 1]
result["shard_options"] = [kind(lambda: grain.sharding.ShardOptions(shard_index=3, shard_count=3)),
                           kind(lambda: grain.sharding.ShardOptions(shard_index=-1, shard_count=3)),
                           kind(lambda: grain.sharding.ShardOptions(shard_index=0, shard_count=0))]
no = grain.sharding.NoSharding()
result["no_sharding"] = [no.shard_index, no.shard_count, no.drop_remainder]
""", {(9, 0, 1, True): [0, 9], (9, 0, 2, True): [0, 4], (9, 1, 2, True): [4, 8], (9, 0, 3, True): [0, 3],
      (9, 1, 3, True): [3, 6], (9, 2, 3, True): [6, 9], (9, 0, 1, False): [0, 9], (9, 0, 2, False): [0, 5],
      (9, 1, 2, False): [5, 9], (8, 0, 3, False): [0, 3], (8, 1, 3, False): [3, 6], (8, 2, 3, False): [6, 8],
      "shard_options": ["ValueError", "ValueError", "ValueError"], "no_sharding": [0, 1, False]}),
    "sharding_even_split_src_path": ("""
from grain._src.core import sharding
result = {}
for n, index, count, drop in ((9, 0, 1, True), (9, 0, 2, True), (9, 1, 2, True), (9, 0, 3, True), (9, 1, 3, True),
                              (9, 2, 3, True), (9, 0, 1, False), (9, 0, 2, False), (9, 1, 2, False), (8, 0, 3, False),
                              (8, 1, 3, False), (8, 2, 3, False)):
  result[n, index, count, drop] = sharding.even_split(
      n, sharding.ShardOptions(shard_index=index, shard_count=count, drop_remainder=drop))
""", {(9, 0, 1, True): [0, 9], (9, 0, 2, True): [0, 4], (9, 1, 2, True): [4, 8], (9, 0, 3, True): [0, 3],
      (9, 1, 3, True): [3, 6], (9, 2, 3, True): [6, 9], (9, 0, 1, False): [0, 9], (9, 0, 2, False): [0, 5],
      (9, 1, 2, False): [5, 9], (8, 0, 3, False): [0, 3], (8, 1, 3, False): [3, 6], (8, 2, 3, False): [6, 8]}),
    # ---- record_test.py ----
    "record_metadata_str": ("""
result = [str(grain.RecordMetadata(index=0, record_key=0, rng=np.random.default_rng())),
          str(grain.RecordMetadata(index=0, record_key=0)).startswith("RecordMetadata(index=0, record_key=0, rng=None"),
          grain.python.RecordMetadata is grain.RecordMetadata, grain.python.Record is grain.Record]
""", ["RecordMetadata(index=0, record_key=0, rng=Generator(PCG64))", True, True, True]),
    # ---- load_test.py ----
    "load": ("""
class FilterEven(grain.transforms.Filter):

  def filter(self, x: int) -> bool:
    return x % 2 == 0


class PlusOne(grain.transforms.Map):

  def map(self, x: int) -> int:
    return x + 1


class AddRandom(grain.python.RandomMapTransform):

  def random_map(self, x, rng):
    return x * 1000 + int(rng.integers(1000))


source = grain.sources.RangeDataSource(start=0, stop=8, step=1)
result = dict(
    plain=list(grain.load(source, transformations=[PlusOne(), FilterEven()], num_epochs=1)),
    batched=list(grain.load(source, transformations=[PlusOne(), FilterEven()], batch_size=2, num_epochs=1)),
    python_load=list(grain.python.load(source, transformations=[PlusOne()], num_epochs=1)),
    shuffled=list(grain.load(source, num_epochs=2, shuffle=True, seed=3)),
    sharded=list(grain.load(source, num_epochs=1, shard_options=grain.sharding.ShardOptions(1, 3))),
    drop_remainder=list(grain.load(source, num_epochs=1, batch_size=3, drop_remainder=True)),
    infinite=[x for _, x in zip(range(20), grain.load(source))],
    random=list(grain.load(source, num_epochs=1, shuffle=True, seed=5, transformations=[AddRandom()])),
    read_options=list(grain.load(source, num_epochs=1, read_options=grain.ReadOptions(num_threads=0))),
    is_data_loader=isinstance(grain.load(source), grain.DataLoader),
)
""", None),
    "load_state_round_trip": ("""
class AddRandom(grain.transforms.RandomMap):

  def random_map(self, x, rng):
    return x * 1000 + int(rng.integers(1000))


def make():
  return iter(grain.load(grain.sources.RangeDataSource(0, 10, 1), num_epochs=2, shuffle=True, seed=4,
                         transformations=[AddRandom()], batch_size=3))

reference = [b.tolist() for b in make()]
resumed = []
for k in range(len(reference) + 1):
  it = make()
  for _ in range(k):
    next(it)
  state = it.get_state()
  fresh = make()
  fresh.set_state(state)
  resumed.append([b.tolist() for b in fresh] == reference[k:])
result = [reference, resumed]
""", None),
}

# operations_test.py: the legacy DataLoader operations, called on Record iterators.
OPERATIONS = """
import collections
import dataclasses
import grain.python as grain
import numpy as np


def records(values):
  return iter([grain.Record(grain.RecordMetadata(index=i, record_key=len(values) - 1 - i), v)
               for i, v in enumerate(values)])


def out(operation, values):
  try:
    return [[r.metadata.index, r.metadata.record_key, r.data] for r in operation(records(values))]
  except BaseException as e:  # pylint: disable=broad-except
    return [next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__, str(e)]


class CallableObject:

  def __call__(self, x):
    return x + 1


@dataclasses.dataclass
class UnSupportedType:
  some_value: int


point = collections.namedtuple("point", "x y")

result = dict(
    map=out(grain.MapOperation(map_function=lambda data: data + 1), [1, 2, 3, 4]),
    map_callable_object=out(grain.MapOperation(map_function=CallableObject()), [1]),
    filter=out(grain.FilterOperation(condition_function=lambda data: data % 2 == 0), [1, 2, 3, 4]),
    batch=out(grain.BatchOperation(batch_size=2), [1, 2, 3, 4]),
    batch_remainder=out(grain.BatchOperation(batch_size=2), [1, 2, 3, 4, 5]),
    batch_drop_remainder=out(grain.BatchOperation(batch_size=2, drop_remainder=True), [1, 2, 3, 4, 5]),
    batch_dict_of_arrays=out(grain.BatchOperation(batch_size=2),
                             [{"a": np.array([1, 2], dtype=np.int32)}, {"a": np.array([3, 4], dtype=np.int64)}]),
    batch_tuples=out(grain.BatchOperation(batch_size=2), [(1, 10.0, "text"), (2, 20.0, "text_2")]),
    batch_named_tuples=out(grain.BatchOperation(batch_size=2), [point(x=1, y="str"), point(x=2, y="str_2")]),
    batch_lists=out(grain.BatchOperation(batch_size=2), [[1, 2], [3, 4]]),
    batch_mixed_scalars=out(grain.BatchOperation(batch_size=2), [1, 2.0, np.int32(3), np.int64(4), float(5.0)]),
    batch_lists_different_length=out(grain.BatchOperation(batch_size=2), [[1, 2], [3, 4, 5]]),
    batch_dicts_different_keys=out(grain.BatchOperation(batch_size=2), [{"a": 1}, {"b": 2}]),
    batch_unsupported_type=out(grain.BatchOperation(batch_size=2), [UnSupportedType(1), UnSupportedType(2)]),
    batch_custom_fn=out(grain.BatchOperation(batch_size=2, batch_fn=lambda x: x), [1, 2, 3, 4]),
)
named = list(grain.BatchOperation(batch_size=2)(records([point(x=1, y="str"), point(x=2, y="str_2")])))[0].data
result["named_tuple_type"] = [type(named).__name__, list(named._fields)]
unsupported = result["batch_unsupported_type"][0][2]
result["batch_unsupported_type"][0][2] = [str(unsupported.dtype), [u.some_value for u in unsupported]]

delta = 0.1
rng = np.random.Generator(np.random.Philox(key=0))
random_out = list(grain.RandomMapOperation(random_map_function=lambda data, rng: data + rng.uniform(-delta, delta))(
    iter([grain.Record(grain.RecordMetadata(index=0, record_key=1, rng=rng), 1)])))
result["random_map"] = [len(random_out), type(random_out[0]).__name__, random_out[0].metadata.index,
                        random_out[0].metadata.record_key, random_out[0].metadata.rng is rng,
                        abs(random_out[0].data - 1) <= delta, random_out[0].data]
"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_grain(name, array_record_files):
  snippet, expected = CASES[name]
  g, l = porting.run_both(HEAD + snippet, files=array_record_files)
  if expected is not None:
    if isinstance(expected, dict):  # Grain's test's expectation for the keys it states.
      assert {k: plain(g.result[k]) for k in expected} == plain(expected)
    else:
      assert plain(g.result) == plain(expected)
  if name in DOCUMENTED_DIFFERENCES:
    DOCUMENTED_DIFFERENCES[name](plain(g.result), plain(l.result))
    return
  assert plain(l.result) == plain(g.result)
  assert structure(l.result) == structure(g.result)


def _one_stream_whatever_the_threads(g, l):
  # README (mp_prefetch, multithread_prefetch): loader's stream is the one
  # with 0 threads or workers; Grain's gives each thread a slice.
  assert l == {"source_on": list(range(10)), "source_off": list(range(10)), "source_default": list(range(10)),
               "range_on": list(range(10)), "range_slice_on": list(range(2, 21, 3))}
  assert g["source_off"] == l["source_off"] and g["source_default"] == l["source_default"]


def _an_iter_source_is_read_once_not_sliced(g, l):
  # README (mp_prefetch over a stream without a MapDataset part): loader reads
  # it once in the consuming process, where Grain refuses to slice it.
  assert g == [2, "ValueError", True] and l == [2, None, False]


def _bad_range_arguments_are_value_errors(g, l):
  # README (RangeDataSource): ValueError where Grain asserts.
  assert {k: v for k, v in l.items() if k not in ("step0", "negative_length")} == \
      {k: v for k, v in g.items() if k not in ("step0", "negative_length")}
  assert (g["step0"], g["negative_length"], l["step0"], l["negative_length"]) == (
      "AssertionError", "AssertionError", "ValueError", "ValueError")


def _no_warning_for_a_small_buffer(g, l):
  # README (Computing ahead): the buffer bounds chunks, not threads: no warning.
  assert g == [1, []] and l == [0, []]


def _two_chunks_ahead_at_most(g, l):
  # README (Computing ahead): with the consumer idle after its first element,
  # loader has read the two chunks ahead (1 + 4 records); Grain's threads go
  # on reading (all 16). A close() stops both early.
  assert g == {True: [0, True, True], False: [0, True, True]}
  assert l == {True: [0, True, True], False: [0, True, False]}


DOCUMENTED_DIFFERENCES = {
    "multithread_prefetch_sequential_slice": _one_stream_whatever_the_threads,
    "multithread_prefetch_iter_source": _an_iter_source_is_read_once_not_sliced,
    "range_data_source": _bad_range_arguments_are_value_errors,
    "read_options_warns_when_buffer_is_smaller_than_threads": _no_warning_for_a_small_buffer,
    "thread_prefetch_early_break_continues_prefetching": _two_chunks_ahead_at_most,
}


def test_operations_equal_grain():
  g, l = porting.run_both(OPERATIONS)
  assert plain(g.result["map"]) == [[0, None, 2], [1, None, 3], [2, None, 4], [3, None, 5]]
  assert plain(g.result["batch_remainder"]) == [[1, None, [1, 2]], [3, None, [3, 4]], [4, None, [5]]]
  assert g.result["batch_lists_different_length"] == [
      "TypeError", "Record structures do not match. Record at position 0 has structure [1, 2], while records at "
      "positions [1] have structures [[3, 4, 5]]."]
  differing = [key for key in sorted(g.result)
               if plain(l.result[key]) != plain(g.result[key]) or structure(l.result[key]) != structure(g.result[key])]
  assert not differing, {key: (g.result[key], l.result[key]) for key in differing}


@pytest.fixture(scope="module")
def array_record_files():
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  d = tempfile.mkdtemp(prefix="port_prefetch_legacy_")
  files = []
  for shard, (start, stop) in enumerate(((0, 5), (5, 12))):
    path = os.path.join(d, f"data.array_record-{shard:05d}-of-00002")
    writer = ArrayRecordWriter(path, "group_size:1")
    for i in range(start, stop):
      writer.write(f"record {i}".encode())
    writer.close()
    files.append(path)
  return files


# ---- Worker processes (process_prefetch_test.py via IterDataset.mp_prefetch; data_sources_test.py's co-read) ----

MP_HEAD = """
import json
import os
import sys
import time
import traceback
from absl import flags
import grain
import numpy as np

flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.
T0 = time.time()


def log(message):  # Progress on stderr, shown if the script fails or times out.
  print(f"{time.time() - T0:.1f}s {message}", file=sys.stderr, flush=True)


""" + CATCH + """

def odd(x):
  return x % 2 == 1


def with_pid(x):
  return [int(x), os.getpid()]


""" + ITER_SOURCE + """


def mp(ds, workers, buffer_size=1, **kwargs):
  return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer_size), **kwargs)
"""

MP_STREAMS = MP_HEAD + """
def set_worker_env(index, count):
  os.environ["PORT_WORKER"] = f"{index}/{count}"


def worker_env(x):
  return [int(x), os.environ.get("PORT_WORKER")]


def random_int(x, rng):
  return int(x + rng.integers(2**62))


if __name__ == "__main__":
  out = {}
  odd_ds = grain.MapDataset.range(20).to_iter_dataset().filter(odd)
  # test_prefetch_data / test_prefetch_size_zero_data.
  log("data")
  out["data"] = {str(w): [int(x) for x in mp(odd_ds, w, b)] for w, b in ((1, 1), (3, 20))}
  log("size_zero")
  out["size_zero"] = [x.tolist() for x in mp(
      grain.MapDataset.source([np.zeros(shape=(0,), dtype=np.int64)]).repeat(3).to_iter_dataset(), 1)]
  # test_checkpoint / test_set_state_twice / test_set_state_does_not_restart_process, 2 workers.
  log("checkpoint start")
  it = mp(grain.MapDataset.range(20).to_iter_dataset().filter(odd).map(with_pid), 2).__iter__()
  reference, checkpoints = [], []
  for _ in range(10):
    checkpoints.append(it.get_state())
    reference.append(next(it))
  resumed = {}
  for step in (0, 3, 8):
    it.set_state(checkpoints[step])
    resumed[step] = [next(it) for _ in range(step, 10)]
  pids = {p for _, p in reference}
  log("checkpoint")
  out["checkpoint"] = dict(
      values=[v for v, _ in reference], resumed={k: [v for v, _ in r] for k, r in resumed.items()},
      parent_not_a_worker=os.getpid() not in pids, rest=[v for v, _ in it])
  fresh = mp(grain.MapDataset.range(20).to_iter_dataset().filter(odd).map(with_pid), 2).__iter__()
  fresh.set_state(checkpoints[3])
  out["checkpoint"]["fresh"] = [v for v, _ in fresh]
  it.close()
  fresh.close()
  # test_set_state_does_not_restart_process (no filter: both workers yield).
  it = mp(grain.MapDataset.range(20).to_iter_dataset().map(with_pid), 2).__iter__()
  pids1 = {p for _, p in (next(it) for _ in range(4))}
  checkpoint = it.get_state()
  next(it)
  it.set_state(checkpoint)
  pids2 = {p for _, p in (next(it) for _ in range(4))}
  log("pids")
  out["pids"] = [len(pids1), os.getpid() in pids1, pids1 == pids2]
  it.close()
  # get_next_index / set_next_index with 1 worker.
  log("next_index start")
  it = mp(grain.MapDataset.range(10).to_iter_dataset(), 1).__iter__()
  indices = []
  for i in range(10):
    indices.append(grain.experimental.get_next_index(it))
    next(it)
  after_set = []
  for i in reversed(range(10)):
    grain.experimental.set_next_index(it, i)
    after_set.append(int(next(it)))
  log("next_index")
  out["next_index"] = [indices, after_set]
  it.close()
  # test_works_with_iter_source_single_worker / test_fails_with_iter_source_multiple_workers.
  it = iter(mp(RepeatedIntSourceIterDataset().map(lambda x: x + 1), 1))
  log("iter_source")
  out["iter_source"] = [int(next(it)),
                        # Grain refuses to slice an IterDataset source for 2 workers (the source is endless).
                        catch(lambda: [next(two) for two in [iter(mp(RepeatedIntSourceIterDataset().map(lambda x: x + 1), 2))]
                                       for _ in range(3)])]
  it.close()
  # Sequential slices (3 workers).
  log("sequential")
  out["sequential"] = dict(
      source_on=[int(x) for x in mp(grain.MapDataset.source(range(10)).to_iter_dataset(), 3, sequential_slice=True)],
      range_slice_on=[int(x) for x in mp(grain.MapDataset.range(start=2, stop=21, step=3).to_iter_dataset(), 3,
                                         sequential_slice=True)],
      default=[int(x) for x in mp(grain.MapDataset.source(range(10)).to_iter_dataset(), 3)])
  # test_prefetch_with_random_map: workers draw differently; and the draws themselves.
  drawn = [int(x) for x in mp(grain.MapDataset.source([0]).repeat(30).to_iter_dataset().random_map(random_int, seed=42), 3)]
  log("random_map")
  out["random_map"] = [len(set(drawn)), drawn]
  # test_worker_init_fn (the init function records (index, count) in the worker's environment).
  log("worker_init_fn")
  out["worker_init_fn"] = [v for v in mp(grain.MapDataset.range(2).map(worker_env).to_iter_dataset(), 2,
                                         worker_init_fn=set_worker_env)]
  print(json.dumps(out))
"""

MP_ERRORS = MP_HEAD + """
class ErrorTransform(grain.transforms.Map):

  def nested_function_a(self, element):
    return self.nested_function_b(element)

  def nested_function_b(self, element):
    return self.nested_function_c(element)

  def nested_function_c(self, element):
    if element == 3:
      raise ValueError('Intentional error at element 3')
    return element

  def map(self, element):
    return self.nested_function_a(element)


def failing_transform(element):
  raise ValueError('I shall fail!')


def exiting_transform(element):
  sys.exit(123)


class UnpicklableObject:

  def __getstate__(self):
    raise ValueError('UnpicklableObject is not picklable')


if __name__ == "__main__":
  out = {}
  odd_ds = grain.MapDataset.range(20).to_iter_dataset().filter(odd)
  log("transform_error")
  out["transform_error"] = catch(lambda: list(mp(odd_ds.map(failing_transform), 1)))
  crash = catch(lambda: list(mp(odd_ds.map(exiting_transform), 1)))
  log("worker_crash")
  out["worker_crash"] = [crash[0], "exit code 123" in crash[1]]
  local_state = UnpicklableObject()
  unpicklable = None
  try:
    list(mp(odd_ds.map(lambda _: 1 if local_state is None else 2), 1))
  except ValueError as e:
    unpicklable = [str(e), "cannot be pickled" in "".join(getattr(e, "__notes__", []))]
  log("unpicklable")
  out["unpicklable"] = unpicklable
  # test_prefetch_traceback_preserves_worker_frames (default traceback filtering).
  it = mp(grain.MapDataset.range(10).to_iter_dataset().map(ErrorTransform()), 1, 2).__iter__()
  frames = None
  try:
    for _ in range(5):
      next(it)
  except ValueError as e:
    names = [f.name for f in traceback.extract_tb(e.__traceback__)]
    if e.__cause__ is not None:
      names += [f.name for f in traceback.extract_tb(e.__cause__.__traceback__)]
    shown = "".join(traceback.format_exception(e))  # What a user reads.
    frames = [str(e), "nested_function_c" in names, "nested_function_c" in shown]
  log("worker_frames")
  out["worker_frames"] = frames
  # test_options_before_prefetch / test_options_after_prefetch.
  options = grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)
  before = mp(grain.experimental.WithOptionsIterDataset(
      grain.MapDataset.source([1, 2, 3]).repeat(1000).to_iter_dataset(), options), 1).filter(lambda x: x > 2)
  after = grain.experimental.WithOptionsIterDataset(
      mp(grain.MapDataset.source([1, 2, 3]).repeat(1000).filter(lambda x: x > 2).to_iter_dataset(), 1), options)
  log("options")
  out["options"] = [(catch(lambda: list(before)) or [None])[0], (catch(lambda: list(after)) or [None])[0]]
  # test_does_not_hang_after_stop_iteration.
  it = mp(grain.MapDataset.source([1, 2, 3]).repeat(2).to_iter_dataset(), 1).__iter__()
  log("after_stop")
  out["after_stop"] = [len(list(it)), list(it)]
  # test_get_state_doesnt_start_prefetch (a marker file instead of an Event).
  marker = os.path.abspath("started.txt")

  def touch(x):
    with open(marker, "a") as f:
      f.write("x")
    return x

  it = mp(grain.MapDataset.source([1, 2, 3]).map(touch).to_iter_dataset(), 1, 10).__iter__()
  it.get_state()
  time.sleep(1)
  log("get_state_does_not_start")
  out["get_state_does_not_start"] = not os.path.exists(marker)
  it.close()
  print(json.dumps(out))
"""

CO_READ = """
import json
import multiprocessing
import grain


def read_elements(ds, indices):
  return [ds[i] for i in indices]


if __name__ == "__main__":
  ds = grain.sources.SharedMemoryDataSource(list(range(12)), name="PortCoRead_" + __import__("sys").argv[0][-12:-3])
  indices = [[1, 3, 5], [2, 3, 4], [5, 2, 3]]
  with multiprocessing.get_context("spawn").Pool(processes=3) as pool:
    read = pool.starmap(read_elements, zip([ds] * 3, indices))
  ds.close()
  ds.unlink()
  print(json.dumps(read))
"""


@pytest.mark.parametrize("script", ["MP_STREAMS", "MP_ERRORS"])
def test_mp_prefetch_workers_equal_grain(script, tmp_path):
  source = globals()[script]
  out = {}
  for lib in porting.LIBS:
    (tmp_path / lib).mkdir()
    out[lib] = porting.run_script(source, lib, tmp_path / lib, timeout=400)
  g, l = out["grain"], out["loader"]
  if script == "MP_STREAMS":
    assert g["data"]["1"] == list(range(1, 20, 2))
    assert g["data"]["3"] == [3, 1, 5, 9, 7, 11, 15, 13, 17, 19]  # Worker slices of range(20), round robin.
    assert g["sequential"]["source_on"] == [0, 4, 7, 1, 5, 8, 2, 6, 9, 3]
    assert g["sequential"]["range_slice_on"] == [2, 11, 17, 5, 14, 20, 8]
    assert g["random_map"][0] == 30
    assert g["worker_init_fn"] == [[0, "0/2"], [1, "1/2"]]
  else:
    assert g["transform_error"] == ["ValueError", "I shall fail!"]
    assert g["worker_crash"] == ["RuntimeError", True]
  # Documented in README: one stream whatever the worker count (the 0-worker
  # one; workers take runs of consecutive elements), an IterDataset source is
  # read once in the consumer, and a worker's traceback is a note.
  if script == "MP_STREAMS":
    assert l.pop("data") == {"1": list(range(1, 20, 2)), "3": list(range(1, 20, 2))}
    assert l.pop("sequential") == {"source_on": list(range(10)), "range_slice_on": list(range(2, 21, 3)),
                                   "default": list(range(10))}
    # Which worker computes which elements follows loader's chunks: 4 elements
    # may come from one worker. Neither library computes in the parent.
    assert l.pop("pids")[1] is g["pids"][1] is False
    ours, theirs = l.pop("iter_source"), g["iter_source"]
    assert ours[0] == theirs[0] and theirs[1][0] == "ValueError" and ours[1] is None
    g = {k: v for k, v in g.items() if k in l}
  else:
    message, _, shown = l.pop("worker_frames")
    assert [message, shown] == [g["worker_frames"][0], True] and g.pop("worker_frames")[1:] == [True, True]
  differing = sorted(k for k in g if g[k] != l.get(k))
  assert not differing, {k: (g[k], l.get(k)) for k in differing}


def test_shared_memory_data_source_co_read_in_spawned_processes(tmp_path):
  out = {}
  for lib in porting.LIBS:
    (tmp_path / lib).mkdir()
    out[lib] = porting.run_script(CO_READ, lib, tmp_path / lib)
  assert out["grain"] == [[1, 3, 5], [2, 3, 4], [5, 2, 3]]
  assert out["loader"] == out["grain"]
