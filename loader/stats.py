"""Execution statistics, as far as Grain subclasses use them: recorded nowhere.

Grain's datasets and iterators carry a `_stats` object that custom
`MapDataset` / `DatasetIterator` subclasses call in their hot paths
(`with self._stats.record_self_time(): ...`,
`return self._stats.record_output_spec(x)`). Loader measures its pipelines in
bench/, not per element, so `_stats` here accepts those calls and does
nothing: ported subclasses run unchanged and pay no cost.

Grain's execution summaries (`dataset.get_execution_summary`,
`stats.pretty_format_summary`, its debug helpers) exist so that client code
importing them still imports; calling them raises `ExecutionSummaryError`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

_NOTHING = contextlib.nullcontext()  # Reusable: it holds no state.


class Stats:
  """Grain's `Stats` interface, with every recording a no-op."""

  output_spec: Any = None

  def record_self_time(self, *, num_elements: int = 1, offset_ns: float = 0) -> contextlib.AbstractContextManager:
    del num_elements, offset_ns
    return _NOTHING

  def record_output_spec(self, element: T) -> T:
    return element

  def record_output_spec_for_batch(self, elements: Sequence[T]) -> Sequence[T]:
    return elements

  def record_bytes_consumed(self, element: T) -> T:
    return element

  def record_bytes_produced(self, element: T) -> T:
    return element

  def report(self) -> None:
    pass


NO_STATS = Stats()


def record_next_duration_if_output(next_fn: T) -> T:
  """Grain's decorator for a custom iterator's `__next__`; records nothing, so it is `next_fn` itself."""
  return next_fn


class Timer:
  """Grain's accumulating timer (`with timer: ...` blocks, then `value()` in ns)."""

  def __init__(self):
    self._accumulator = 0
    self._last = 0

  def __enter__(self):
    self._last = time.perf_counter_ns()

  def __exit__(self, *args):
    self._accumulator += time.perf_counter_ns() - self._last

  def value(self) -> int:
    return self._accumulator

  def reset(self) -> None:
    self._accumulator = 0
    self._last = 0


class ExecutionSummaryError(NotImplementedError, ValueError):
  """There is no execution summary: loader collects no per-stage statistics.

  Also a ValueError, which Grain raises when statistics collection is off, so
  client code that catches it to skip its debug output runs unchanged.
  """


def _no_summary(what: str) -> NoReturn:
  raise ExecutionSummaryError(
      f"{what}: loader collects no per-stage execution statistics (its random-access stages run "
      "fused, in chunks on threads), whatever execution_tracking_mode or py_debug_mode say. Time "
      "the pipeline around next() instead.")


def get_execution_summary(ds: Any) -> NoReturn:
  """Grain's per-stage summary of an iterator; raises `ExecutionSummaryError` (see above)."""
  _no_summary(f"No execution summary for {type(ds).__name__}")


def pretty_format_summary(summary: Any) -> NoReturn:
  """Grain's table of an execution summary; raises `ExecutionSummaryError` (see above)."""
  del summary
  _no_summary("No execution summary to format")
