"""Round 32 of the fault audit (loader side): a prefetch thread whose `next(parent)` searches without end.

Found by the 2026-12-07 audit, run for real before the fix:

- `ThreadPrefetchIterDataset` over a filter that drops (almost) every element of a huge or repeated dataset
  (`MapDataset.range(10**9).filter(lambda x: x < 3)`, on a MapDataset or after `to_iter_dataset()`): once
  the three elements were handed out, the prefetch thread searched on inside `next(parent)`, where it never
  looked at its stop flag. `close()` (and `set_state()`) joined that thread and never returned; an iterator
  the script dropped left the thread burning a core for the rest of the process (the suite found two such
  threads slowing a later fuzz test fifteenfold). Grain 0.2.18's `close()` hangs the same way.

Now the prefetch thread is asked to stop from inside the search: loader's iterators check it once per chunk
(MapDataset parts) or per dropped element (IterDataset filters), and a prefetch under another prefetch thread
waits for its queue in 0.1 s steps. The thread leaves at once; nothing of the stream changes.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest

import faults_testing as ft
import loader

pytestmark = pytest.mark.timeout(120)


def _new_threads(before: set[threading.Thread]) -> list[str]:
  return [t.name for t in threading.enumerate() if t not in before]


def _all_gone_soon(before: set[threading.Thread]) -> None:
  """Every thread started since `before` ends within 5 s (earlier tests' idle threads may still be there)."""
  ft.wait_for(lambda: not _new_threads(before), timeout=5, what="the threads the iterator started to end")


def _searching(kind: str) -> loader.IterDataset:
  ds = loader.MapDataset.range(10**9)
  keep_three = lambda x: x < 3  # pylint: disable=unnecessary-lambda-assignment
  it_ds = (ds.filter(keep_three).to_iter_dataset() if kind == "map filter"
           else ds.to_iter_dataset().filter(keep_three))
  options = loader.experimental.DatasetOptions(filter_warn_threshold_ratio=None)
  it_ds = loader.experimental.WithOptionsIterDataset(it_ds, options)
  it_ds = loader.experimental.ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=2)
  if kind == "nested prefetch":
    it_ds = loader.experimental.ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=2)
  return it_ds


@pytest.mark.parametrize("kind", ["map filter", "iter filter", "nested prefetch"])
def test_close_set_state_and_drop_stop_a_prefetch_thread_that_searches_without_end(kind):
  before = set(threading.enumerate())
  ds = _searching(kind)
  it = iter(ds)
  assert [next(it) for _ in range(3)] == [0, 1, 2]
  assert ft.in_time(it.close, 10) is None
  _all_gone_soon(before)

  it = iter(ds)
  assert [next(it) for _ in range(2)] == [0, 1]
  state = it.get_state()
  time.sleep(0.2)  # The thread is past the last element, searching.
  assert ft.in_time(lambda: it.set_state(state), 10) is None
  assert next(it) == 2  # The stream is unchanged.

  del it
  gc.collect()
  _all_gone_soon(before)
