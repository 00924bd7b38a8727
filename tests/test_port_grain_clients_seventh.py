"""A seventh set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.
Found by the 2026-11-27 audit (round 9) in public code: maps that keep state
from one element to the next placed after `to_iter_dataset()` or in a
`DataLoader` ("delta to the previous timestamp" tokenizers, streaming
tokenize-and-pack maps), jaxformers' `make_dataloader` defaults
(`MultiprocessingOptions(num_workers=0, per_worker_buffer_size=0)` passed to
`mp_prefetch`), and random-access batches over stages that fail.
"""

from __future__ import annotations

import pytest

from tests import porting

# Grain runs an iterator-level map (and a DataLoader's operations) once per
# element, in order, on one thread: a map may keep state across elements.
# ~200 us per element: costly enough that loader would spread a random-access
# map over threads.
STATEFUL_MAP = """
import threading, time
import grain

class DeltaT(grain.transforms.Map):
  def __init__(self):
    self.prev, self.threads = None, set()
  def map(self, t):
    self.threads.add(threading.current_thread().name)
    s = time.perf_counter()
    while time.perf_counter() - s < 0.0002:
      pass
    d = 0 if self.prev is None else int(t) - self.prev
    self.prev = int(t)
    return d

def deltas(out):
  return [(i, d) for i, d in enumerate(out) if i and d != 1]

results = {}
m = DeltaT()
out = list(grain.MapDataset.range(300).to_iter_dataset(grain.ReadOptions(num_threads=8)).map(m))
results["iter map"] = (deltas(out), len(out), len(m.threads))
m = DeltaT()
out = [int(x) for b in grain.MapDataset.range(300).to_iter_dataset().map(m).batch(10) for x in b]
results["iter map then batch"] = (deltas(out), len(out), len(m.threads))
m = DeltaT()
dl = grain.DataLoader(data_source=list(range(300)), sampler=grain.samplers.SequentialSampler(300),
                      operations=[m, grain.transforms.Batch(10)], worker_count=0,
                      read_options=grain.ReadOptions(num_threads=8))
out = [int(x) for b in dl for x in b]
results["DataLoader"] = (deltas(out), len(out), len(m.threads))
kept = []
def dedup(x):  # A stateful filter.
  s = time.perf_counter()
  while time.perf_counter() - s < 0.0002:
    pass
  if x // 3 in kept:
    return False
  kept.append(x // 3)
  return True
results["iter filter"] = [int(x) for x in grain.MapDataset.range(60).to_iter_dataset().filter(dedup)]
"""


def test_a_map_after_to_iter_dataset_sees_its_elements_in_order_on_one_thread():
  theirs, ours = porting.run_both(STATEFUL_MAP)
  assert theirs.results["iter map"] == ([], 300, 1)
  assert ours.results == theirs.results


# jaxformers' make_dataloader passes worker_buffer_size=0 with worker_count=0.
ZERO_BUFFER = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import grain

def outcome(make):
  try:
    value = make()
    return [b.tolist() for b in value] if not isinstance(value, grain.MultiprocessingOptions) else "built"
  except ValueError as e:
    return "ValueError: " + str(e).split(" (")[0].split(". ")[0]

def batches(options):
  return grain.MapDataset.range(5).to_iter_dataset().batch(2).mp_prefetch(options)

def data_loader(worker_count, worker_buffer_size):
  return grain.DataLoader(data_source=list(range(5)), sampler=grain.samplers.SequentialSampler(5),
                          operations=[grain.transforms.Batch(2)], worker_count=worker_count,
                          worker_buffer_size=worker_buffer_size)

results = {
    "options(0, 0)": outcome(lambda: grain.MultiprocessingOptions(num_workers=0, per_worker_buffer_size=0)),
    "options(2, 0)": outcome(lambda: grain.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=0)),
    "mp_prefetch(0, 0)": outcome(lambda: batches(grain.MultiprocessingOptions(num_workers=0, per_worker_buffer_size=0))),
    "mp_prefetch(0, -1)": outcome(lambda: batches(grain.MultiprocessingOptions(num_workers=0, per_worker_buffer_size=-1))),
    "mp_prefetch(2, 0)": outcome(lambda: batches(grain.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=0))),
    "DataLoader(0, 0)": outcome(lambda: data_loader(0, 0)),
    "DataLoader(2, 0)": outcome(lambda: data_loader(2, 0)),
}
"""


def test_a_zero_worker_buffer_goes_without_workers_and_is_refused_with_them():
  theirs, ours = porting.run_both(ZERO_BUFFER)
  assert theirs.results["mp_prefetch(0, 0)"] == [[0, 1], [2, 3], [4]]
  assert theirs.results["mp_prefetch(2, 0)"] == "ValueError: `buffer_size` must be greater than 0, got 0."
  assert ours.results == theirs.results
