"""Client patterns found by the 2026-11-26 audit, run on Grain 0.2.18 and, with only the imports changed, on loader.

Found in a JAX profiling utility and other `_grain_iter_dataset` helpers
(`hasattr(ds, "to_iter_dataset")` tells a MapDataset from an IterDataset),
jaxformers (`hasattr(ds, "shard")` tells an HF-style dataset), dreamer
(ThreadPrefetch over a custom iterator that is no DatasetIterator; a custom
DatasetIterator calling `_assert_not_closed`), Hugging Face datasets with a
batch-level transform as a Grain source (its `__getitems__` differs from
per-index reads), and training scripts that resume a DataLoader checkpoint
with another batch size.
"""

from __future__ import annotations

import numpy as np

from tests import porting
from tests.porting import plain

HASATTR_BRANCHES = """
import grain

def to_iter(ds):
  if hasattr(ds, "to_iter_dataset"):  # A MapDataset; an IterDataset is used as is.
    ds = ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=8))
  return ds

from_map = [b.tolist() for b in to_iter(grain.MapDataset.range(6).batch(2))]
from_iter = [b.tolist() for b in to_iter(grain.MapDataset.range(6).to_iter_dataset().batch(2))]
ds = grain.MapDataset.range(5)
looks_like = {name: hasattr(ds, name) for name in ("shard", "source", "range", "mix", "concatenate")}
"""


def test_hasattr_checks_take_the_branch_they_take_on_grain():
  g, l = porting.run_both(HASATTR_BRANCHES)
  assert plain(l.from_map) == plain(g.from_map) == [[0, 1], [2, 3], [4, 5]]
  assert plain(l.from_iter) == plain(g.from_iter) == [[0, 1], [2, 3], [4, 5]]
  assert l.looks_like == g.looks_like == {name: False for name in g.looks_like}


CUSTOM_ITERATORS = """
import grain
import numpy as np
from grain._src.python.dataset import dataset as dataset_base

class Stream:  # Not a DatasetIterator: __next__ and a state only.
  def __init__(self):
    self.i = 0
  def __next__(self):
    if self.i >= 4:
      raise StopIteration
    self.i += 1
    return self.i
  def get_state(self):
    return {"i": self.i}
  def set_state(self, state):
    self.i = state["i"]

class StreamDataset(grain.IterDataset):
  def __iter__(self):
    return Stream()

it = iter(grain.experimental.ThreadPrefetchIterDataset(StreamDataset(), prefetch_buffer_size=2))
first = next(it)
state_i = it.get_state()["i"]
rest = list(it)

class SelfIterating(grain.IterDataset):  # dreamer: the dataset is its own iterator.
  def __init__(self):
    super().__init__()
    self.i = 0
  def __iter__(self):
    return self
  def __next__(self):
    if self.i >= 3:
      raise StopIteration
    self.i += 1
    return np.full((2,), self.i)
  def get_state(self):
    return {"i": self.i}
  def set_state(self, state):
    self.i = state["i"]

prefetched = [b.tolist() for b in grain.experimental.ThreadPrefetchIterDataset(SelfIterating(), prefetch_buffer_size=2)]

class Wrapper(dataset_base.DatasetIterator):
  def __next__(self):
    self._assert_not_closed()
    return next(self._parent)
  def get_state(self):
    return self._parent.get_state()
  def set_state(self, state):
    self._parent.set_state(state)

class Wrapped(grain.IterDataset):
  def __iter__(self):
    return Wrapper(self._parent.__iter__())

wrapped = Wrapped(grain.MapDataset.range(1, 4).to_iter_dataset())
through_wrapper = list(wrapped)
closed = iter(wrapped)
closed.close()
try:
  next(closed)
  after_close = "no error"
except ValueError:
  after_close = "ValueError"
"""


def test_custom_iterators_under_thread_prefetch_and_closing_as_on_grain():
  g, l = porting.run_both(CUSTOM_ITERATORS)
  for name in ("first", "state_i", "rest", "prefetched", "through_wrapper", "after_close"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  assert (g.first, g.rest, g.prefetched) == (1, [2, 3, 4], [[1, 1], [2, 2], [3, 3]])
  assert g.after_close == "ValueError"


BATCH_LEVEL_SOURCE = """
import grain

class PaddingSource:
  # A Hugging Face dataset with a transform behaves so: a batch is padded to its longest row.
  def __init__(self):
    self.rows = ["a", "a b", "a b c", "a b c d"]
  def __len__(self):
    return len(self.rows)
  def _tokens(self, rows):
    ids = [[len(w) for w in r.split()] for r in rows]
    longest = max(map(len, ids))
    return [x + [0] * (longest - len(x)) for x in ids]
  def __getitem__(self, i):
    return self._tokens([self.rows[i]])[0]
  def __getitems__(self, keys):
    return self._tokens([self.rows[k] for k in keys])

ds = grain.MapDataset.source(PaddingSource())
streamed = list(ds.to_iter_dataset())
batched = [b.tolist() for b in ds.map(len).batch(2)]
"""


def test_a_sources_batch_level_getitems_is_not_used_as_on_grain():
  g, l = porting.run_both(BATCH_LEVEL_SOURCE)
  assert plain(l.streamed) == plain(g.streamed) == [[1], [1, 1], [1, 1, 1], [1, 1, 1, 1]]
  assert plain(l.batched) == plain(g.batched) == [[1, 2], [3, 4]]


RESUME_WITH_OTHER_OPERATIONS = """
import grain.python as grain

def make(operations):
  sampler = grain.IndexSampler(24, grain.NoSharding(), shuffle=True, num_epochs=1, seed=5)
  return grain.DataLoader(data_source=list(range(24)), sampler=sampler, operations=operations, worker_count=0)

it = iter(make([grain.Batch(4)]))
seen = [next(it).tolist() for _ in range(3)]
state = it.get_state()
resumed = iter(make([grain.Batch(6)]))  # A training run resumed with another batch size.
resumed.set_state(state)
rest = [b.tolist() for b in resumed]
"""


def test_a_dataloader_state_resumes_with_another_batch_size_as_on_grain():
  g, l = porting.run_both(RESUME_WITH_OTHER_OPERATIONS)
  assert plain(l.seen) == plain(g.seen)
  assert plain(l.rest) == plain(g.rest)
  assert sorted(np.concatenate([*g.seen, *g.rest]).tolist()) == list(range(24))


SKIP_BAD_RECORDS = """
import grain.python as grain

def parse(x):
  if x in (3, 6):
    raise ValueError(f"record {x} is corrupt")
  return x

class Parse(grain.MapTransform):
  def map(self, x):
    return parse(x)

def skipping(it, calls=20):
  got = []
  for _ in range(calls):
    try:
      got.append(int(next(it)))
    except ValueError:  # A training loop that skips bad records.
      got.append("bad")
    except (StopIteration, IndexError):  # Grain 0.2.18's prefetch ends so after an error.
      break
  return got

dataset = skipping(iter(grain.MapDataset.range(10).map(parse).to_iter_dataset()))
sampler = grain.IndexSampler(10, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)
data_loader = skipping(iter(grain.DataLoader(data_source=list(range(10)), sampler=sampler, operations=[Parse()],
                                             worker_count=0)))
"""


def test_a_loop_that_skips_bad_records_goes_on_after_them_as_on_grain():
  # Grain's default configurations (ReadOptions with threads, the DataLoader) consume a failed element.
  g, l = porting.run_both(SKIP_BAD_RECORDS)
  expected = [0, 1, 2, "bad", 4, 5, "bad", 7, 8, 9]
  assert g.dataset == l.dataset == expected
  assert g.data_loader == l.data_loader == expected
