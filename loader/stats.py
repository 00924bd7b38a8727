"""Execution statistics, as far as Grain subclasses use them: recorded nowhere.

Grain's datasets and iterators carry a `_stats` object that custom
`MapDataset` / `DatasetIterator` subclasses call in their hot paths
(`with self._stats.record_self_time(): ...`,
`return self._stats.record_output_spec(x)`). Loader measures its pipelines in
bench/, not per element, so `_stats` here accepts those calls and does
nothing: ported subclasses run unchanged and pay no cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, TypeVar

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
