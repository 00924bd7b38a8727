"""`PackAndBatchOperation`: Grain's legacy DataLoader packing operation.

MaxText's HuggingFace pipeline and older DataLoader pipelines pass it in
`operations=[...]`. It packs variable-length examples into `batch_size` rows
first-fit, one batch at a time: an example goes into the first row where every
feature still fits; when none fits, the batch is emitted and a new one starts
with that example. The Dataset API's packing is `FirstFitPackIterDataset`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from loader import record as record_lib


def _paths(struct: Any, prefix: tuple = ()) -> list[tuple]:
  """Paths to the leaves of a nest of dicts, lists and tuples (dict keys sorted)."""
  if isinstance(struct, Mapping):
    return [p for k in sorted(struct) for p in _paths(struct[k], prefix + (k,))]
  if isinstance(struct, (list, tuple)):
    return [p for i, v in enumerate(struct) for p in _paths(v, prefix + (i,))]
  return [prefix]


def _get(tree: Any, path: tuple) -> Any:
  for k in path:
    tree = tree[k]
  return tree


def _rebuild(struct: Any, leaves: Iterator[Any]) -> Any:
  """`struct` with its leaves replaced, in `_paths` order."""
  if isinstance(struct, Mapping):
    return {k: _rebuild(struct[k], leaves) for k in sorted(struct)}  # Sorted keys, as Grain's output.
  if isinstance(struct, (list, tuple)):
    return type(struct)(_rebuild(v, leaves) for v in struct)
  return next(leaves)


class _Batch:
  """One batch being packed: per feature, rows of values, segment ids and positions."""

  def __init__(self, first: list[np.ndarray], lengths: list[int], batch_size: int, max_per_row: int | None):
    self._lengths = lengths
    self._max_per_row = max_per_row
    self.values = [np.zeros((batch_size, n, *v.shape[1:]), dtype=v.dtype) for v, n in zip(first, lengths)]
    self.segments = [np.zeros((batch_size, n), dtype=np.int32) for n in lengths]
    self.positions = [np.zeros((batch_size, n), dtype=np.int32) for n in lengths]
    self._fill = [np.zeros(batch_size, dtype=np.int64) for _ in lengths]
    self._count = [0] * batch_size
    self.metadata: record_lib.RecordMetadata | None = None

  def try_add(self, leaves: list[np.ndarray], metadata: record_lib.RecordMetadata) -> bool:
    sizes = [len(v) for v in leaves]
    for row, count in enumerate(self._count):
      if self._max_per_row is not None and count >= self._max_per_row:
        continue
      if all(fill[row] + n <= limit for fill, n, limit in zip(self._fill, sizes, self._lengths)):
        for f, v in enumerate(leaves):
          start = int(self._fill[f][row])
          stop = start + sizes[f]
          self.values[f][row, start:stop] = v
          self.segments[f][row, start:stop] = count + 1
          self.positions[f][row, start:stop] = np.arange(sizes[f])
          self._fill[f][row] = stop
        self._count[row] += 1
        # The packed batch carries the metadata of its last example, as in Grain.
        self.metadata = metadata.remove_record_key()
        return True
    return False


@dataclasses.dataclass
class PackAndBatchOperation:
  """Packs examples into batches of `batch_size` rows (Grain's legacy operation).

  Attributes:
    length_struct: The packed length of each feature: a nest (dicts, lists,
      tuples) like the examples', with ints as leaves. Each feature of an
      example is an array whose first axis is its length.
    batch_size: Rows per packed batch.
    max_sequences_per_bin: At most this many examples per row (None: no limit).

  Called on an iterator of `Record`s, it yields `Record`s whose data is
  `(values, segment_ids, positions)`, each a nest like `length_struct` with
  arrays of shape (batch_size, length, ...): segment ids count the examples of
  a row from 1 (0 is padding), positions restart at 0 with each example. The
  last batch is emitted when the input ends. As in Grain, the operation's
  partly filled batch is not part of a checkpoint.
  """

  length_struct: Any
  batch_size: int
  max_sequences_per_bin: int | None = None

  def __post_init__(self):
    if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, (int, np.integer)) or self.batch_size < 1:
      raise ValueError(f"PackAndBatchOperation batch_size must be an integer >= 1 (got {self.batch_size!r}).")
    self._paths = _paths(self.length_struct)
    self._lengths = [int(_get(self.length_struct, p)) for p in self._paths]

  def _leaves(self, data: Any) -> list[np.ndarray]:
    try:
      leaves = [np.asarray(_get(data, p)) for p in self._paths]
    except (KeyError, IndexError, TypeError) as e:
      raise ValueError(
          f"PackAndBatchOperation: an example {type(data).__name__} lacks a feature of length_struct "
          f"{self.length_struct!r} ({type(e).__name__}: {e}).") from e
    for path, v, limit in zip(self._paths, leaves, self._lengths):
      if v.ndim == 0 or len(v) > limit:
        raise ValueError(
            "Inputs to PackAndBatchOperation must be truncated to max length: feature "
            f"{'/'.join(map(str, path)) or '<element>'} has length "
            f"{len(v) if v.ndim else 'none (a scalar)'}, over its packed length {limit}; truncate examples "
            "to length_struct before packing.")
    return leaves

  def _record(self, batch: _Batch) -> record_lib.Record:
    data = tuple(_rebuild(self.length_struct, iter(part)) for part in (batch.values, batch.segments, batch.positions))
    return record_lib.Record(batch.metadata, data)

  def __call__(self, input_iterator: Iterator[record_lib.Record]) -> Iterator[record_lib.Record]:
    batch = None
    for r in input_iterator:
      leaves = self._leaves(r.data)
      if batch is None:
        batch = _Batch(leaves, self._lengths, int(self.batch_size), self.max_sequences_per_bin)
      if not batch.try_add(leaves, r.metadata):
        yield self._record(batch)
        batch = _Batch(leaves, self._lengths, int(self.batch_size), self.max_sequences_per_bin)
        batch.try_add(leaves, r.metadata)
    if batch is not None:
      yield self._record(batch)
