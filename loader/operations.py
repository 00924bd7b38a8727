"""Grain's deprecated `Operation`s: functions from an iterator of records to another.

`DataLoader` turns `MapOperation`, `RandomMapOperation`, `FilterOperation` and
`BatchOperation` into the equivalent transformations, so they run in workers
and checkpoint exactly. Any other `Operation` (a callable taking and returning
an iterator of `Record`s) runs in the consuming process; as in Grain, its own
buffering is not part of the checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from loader import batching
from loader import checks
from loader import record

_IN = TypeVar("_IN")
_OUT = TypeVar("_OUT")

# Set on the errors these operations raise: in Grain they are generators, so
# their stream ends at the first error (see DataLoaderIterator).
ENDS_STREAM = "_loader_ends_stream"


def ends_stream(error: BaseException) -> BaseException:
  """`error`, marked as one that ends a DataLoader's stream (where it can carry the mark)."""
  try:
    setattr(error, ENDS_STREAM, True)
  except (AttributeError, TypeError):  # An exception type with __slots__: the stream goes on.
    pass
  return error


def _failed(what: str, fn: Callable[..., Any], e: Exception) -> ValueError:
  # Grain's words first: client code matches them.
  return ends_stream(ValueError(f"PyGrain encountered an error when calling {what} function. "
                                f"({checks.fn_name(fn)} raised {e!r}.)"))


class Operation(Protocol):
  """Transforms a stream of records."""

  def __call__(self, input_iterator: Iterator[record.Record]) -> Iterator[record.Record]:
    ...


@dataclasses.dataclass
class MapOperation(Generic[_IN, _OUT]):
  """Applies `map_function` to each record's data (prefer `transforms.Map`)."""

  map_function: Callable[[_IN], _OUT]

  def apply(self, r: record.Record[_IN]) -> record.Record[_OUT]:
    try:
      out = self.map_function(r.data)
    except Exception as e:
      raise _failed("map", self.map_function, e) from e
    return record.Record(r.metadata.remove_record_key(), out)

  def __call__(self, input_iterator: Iterator[record.Record[_IN]]) -> Iterator[record.Record[_OUT]]:
    for r in input_iterator:  # A generator, as Grain's: it ends at the first error.
      yield self.apply(r)


@dataclasses.dataclass
class RandomMapOperation(Generic[_IN, _OUT]):
  """Applies `random_map_function(data, rng)` (prefer `transforms.RandomMap`)."""

  random_map_function: Callable[[_IN, np.random.Generator], _OUT]

  def apply(self, r: record.Record[_IN]) -> record.Record[_OUT]:
    try:
      out = self.random_map_function(r.data, r.metadata.rng)
    except Exception as e:
      raise _failed("random map", self.random_map_function, e) from e
    return record.Record(r.metadata.remove_record_key(), out)

  def __call__(self, input_iterator: Iterator[record.Record[_IN]]) -> Iterator[record.Record[_OUT]]:
    for r in input_iterator:
      yield self.apply(r)


@dataclasses.dataclass
class FilterOperation(Generic[_IN]):
  """Keeps records whose data satisfies `condition_function` (prefer `transforms.Filter`)."""

  condition_function: Callable[[_IN], bool]

  def keep(self, r: record.Record[_IN]) -> bool:
    try:
      return bool(self.condition_function(r.data))
    except Exception as e:
      raise _failed("condition", self.condition_function, e) from e

  def __call__(self, input_iterator: Iterator[record.Record[_IN]]) -> Iterator[record.Record[_IN]]:
    for r in input_iterator:
      if self.keep(r):
        yield record.Record(r.metadata.remove_record_key(), r.data)


@dataclasses.dataclass
class BatchOperation(Generic[_IN, _OUT]):
  """Batches `batch_size` records (prefer `transforms.Batch`)."""

  batch_size: int
  drop_remainder: bool = False
  batch_fn: Callable[[Sequence[_IN]], _OUT] | None = None

  def __post_init__(self):
    self.batch_size = checks.check_int(self.batch_size, "batch_size", minimum=1)
    if self.batch_fn is None:
      self.batch_fn = self._default_batch_fn  # As Grain's: clients call or inspect op.batch_fn.

  def _default_batch_fn(self, values: Sequence[_IN]) -> _OUT:
    return _make_record_batch(values)

  def disable_deprecation_message(self) -> None:
    """Grain's switch for its deprecation log line; loader logs none."""

  def __call__(self, input_iterator: Iterator[record.Record[_IN]]) -> Iterator[record.Record[_OUT]]:
    batch_fn = self.batch_fn or self._default_batch_fn
    values: list[Any] = []
    last = None
    for r in input_iterator:
      last = r.metadata
      values.append(r.data)
      if len(values) == self.batch_size:
        yield record.Record(last.remove_record_key(), batch_fn(values))
        values = []
    if values and not self.drop_remainder:
      yield record.Record(last.remove_record_key(), batch_fn(values))


class RecordStructureError(TypeError, ValueError):
  """Records of one batch whose structures differ: Grain's legacy BatchOperation raises a TypeError."""


def _make_record_batch(values: Sequence[Any]) -> Any:
  try:
    return batching.make_batch(values)
  except ValueError as e:
    if not isinstance(e.__cause__, batching.StructureMismatchError):
      raise
    # Grain's message: which records differ from the first.
    others = [i for i, v in enumerate(values[1:], 1) if not _same_structure(values[0], v)] or [None]
    raise RecordStructureError(
        f"Record structures do not match. Record at position 0 has structure {values[0]}, while records at "
        f"positions {others} have structures {[values[i] for i in others if i is not None]}.") from e


def _same_structure(a: Any, b: Any) -> bool:
  try:
    batching.make_batch([a, b])
  except ValueError as e:
    return not isinstance(e.__cause__, batching.StructureMismatchError)  # Else other shapes only.
  return True
