"""Multi-bin packing of variable-length sequences (first-fit and best-fit).

A `PackingWindow` has `num_packing_bins` rows of `length_struct[k]` cells per
feature `k`. Elements are placed one by one (Grain's online algorithm: the
first row where every feature fits, or the fitting row that is already the
fullest); when one fits nowhere the window is finished and the next one starts
with it. Placement only records (row, start, length) per element; the values,
segment ids and positions of a whole window are written at the end with a few
vectorised numpy calls per feature, so the cost per token is a memcpy and the
cost per element a handful of Python operations.

The packed batch matches Grain 0.2.18's `FirstFitPackIterDataset` /
`BestFitPackIterDataset` exactly: same row choice (including Grain's best-fit
score, the sum of used cells over features), buffer dtype and trailing shape
from the window's first element, `{k}_segment_ids` / `{k}_positions` as int32
for every non-meta feature, meta features outside `length_struct` as per-row
lists, keys in sorted order (Grain emits rows through a pytree map, which
sorts dict keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loader import checks


@dataclasses.dataclass(frozen=True)
class PackSpec:
  """The validated packing configuration shared by all windows of a stream."""

  keys: tuple[str, ...]  # Packed features, sorted (Grain flattens dicts in key order).
  capacities: tuple[int, ...]
  alignments: tuple[int, ...]
  paddings: tuple[Any, ...]  # Per feature; None means zeros.
  sequence_meta: frozenset[str]  # Packed and padded, but without segment ids/positions.
  other_meta: tuple[str, ...]  # Meta features outside length_struct: kept as per-row lists.
  num_bins: int
  max_sequences_per_bin: int | None
  best_fit: bool
  output_keys: tuple[str, ...]


def _check_struct(struct: Any, keys: Sequence[str], name: str, owner: str) -> Mapping[str, Any]:
  if not isinstance(struct, Mapping) or set(struct) != set(keys):
    raise ValueError(
        f"{owner}: {name} must be a dict with the keys of length_struct {sorted(keys)} "
        f"(got {name}={struct!r}).")
  return struct


def make_spec(owner: str, *, length_struct: Any, num_packing_bins: Any, meta_features: Sequence[str],
              pack_alignment_struct: Any, padding_struct: Any, max_sequences_per_bin: Any,
              shuffle_bins_group_by_feature: str | None, best_fit: bool) -> PackSpec:
  """Checks the arguments of a pack dataset; errors name `owner` and the bad value."""
  if not isinstance(length_struct, Mapping) or not length_struct:
    raise ValueError(
        f"{owner}: length_struct must be a non-empty dict of feature name -> packed length, "
        f"e.g. {{'inputs': 1024, 'targets': 1024}} (got {length_struct!r}).")
  for k, v in length_struct.items():
    if not isinstance(k, str) or not checks.is_int(v) or v < 1:
      raise ValueError(
          f"{owner}: length_struct must map feature names to positive ints "
          f"(got {k!r}: {v!r} in {length_struct!r}).")
  num_bins = checks.check_int(num_packing_bins, "num_packing_bins", minimum=1)
  if isinstance(meta_features, (str, bytes)):
    raise ValueError(f"{owner}: meta_features must be a list of feature names (got {meta_features!r}; "
                     f"did you mean [{meta_features!r}]?).")
  meta = list(meta_features)
  if max_sequences_per_bin is not None:
    if not checks.is_int(max_sequences_per_bin) or max_sequences_per_bin <= 0:
      raise ValueError(
          "If specified, `max_sequences_per_bin` must be a positive integer, "
          f"but got {max_sequences_per_bin!r}.")
    max_sequences_per_bin = int(max_sequences_per_bin)
  keys = tuple(sorted(length_struct))
  if pack_alignment_struct is None:
    alignments = (1,) * len(keys)
  else:
    _check_struct(pack_alignment_struct, keys, "pack_alignment_struct", owner)
    alignments = tuple(checks.check_int(pack_alignment_struct[k], f"pack_alignment_struct[{k!r}]", minimum=1)
                       for k in keys)
  if padding_struct is None:
    paddings = (None,) * len(keys)
  else:
    _check_struct(padding_struct, keys, "padding_struct", owner)
    paddings = tuple(padding_struct[k] for k in keys)
  sequence_meta = frozenset(k for k in meta if k in length_struct)
  other_meta = tuple(dict.fromkeys(k for k in meta if k not in length_struct))
  outputs = list(keys) + list(other_meta)
  for k in keys:
    if k not in sequence_meta:
      outputs += [f"{k}_segment_ids", f"{k}_positions"]
  output_keys = tuple(sorted(outputs))
  if shuffle_bins_group_by_feature is not None and shuffle_bins_group_by_feature not in output_keys:
    raise ValueError(
        f"{owner}: shuffle_bins_group_by_feature={shuffle_bins_group_by_feature!r} is not a feature of "
        f"the packed output; choose one of {list(output_keys)}.")
  return PackSpec(
      keys=keys, capacities=tuple(int(length_struct[k]) for k in keys), alignments=alignments,
      paddings=paddings, sequence_meta=sequence_meta, other_meta=other_meta, num_bins=num_bins,
      max_sequences_per_bin=max_sequences_per_bin, best_fit=bool(best_fit), output_keys=output_keys)


def _length(x: Any) -> int:
  """Sequence length of a feature value; scalars count as one token (as in Grain)."""
  if type(x) is np.ndarray:  # pylint: disable=unidiomatic-typecheck
    return x.shape[0] if x.ndim else 1
  return 1 if np.ndim(x) == 0 else len(x)


def _buffer_spec(x: Any) -> tuple[np.dtype, tuple[int, ...]]:
  """Dtype and trailing shape of a feature's buffer, from the window's first element."""
  if np.ndim(x) == 0:
    # Grain: a Python int (bool included) packs as int64, other scalars keep their dtype.
    return np.dtype(np.int64) if isinstance(x, int) else np.asarray(x).dtype, ()
  x = np.asarray(x)
  return x.dtype, x.shape[1:]


def _missing(element: Any, key: str, spec: PackSpec) -> KeyError:
  keys = list(element) if isinstance(element, Mapping) else type(element).__name__
  return KeyError(
      f"Packing needs feature {key!r} in every element (length_struct keys {list(spec.keys)}, "
      f"meta_features {sorted(spec.sequence_meta | set(spec.other_meta))}); this element has {keys}.")


class PackingWindow:
  """One window of `num_bins` rows being filled, then turned into a packed batch."""

  def __init__(self, spec: PackSpec, element_for_shapes: Any):
    self._spec = spec
    try:
      self._buffer_specs = [_buffer_spec(element_for_shapes[k]) for k in spec.keys]
    except KeyError as e:
      raise _missing(element_for_shapes, e.args[0], spec) from None
    num_features = len(spec.keys)
    self._used = np.zeros((num_features, spec.num_bins), dtype=np.int64)
    self._used_rows = list(self._used)  # Row views, to skip an indexing call per feature.
    self._count = np.zeros(spec.num_bins, dtype=np.int32)
    self._rows: list[int] = []
    self._segments: list[int] = []
    self._starts: list[list[int]] = [[] for _ in range(num_features)]
    self._lengths: list[list[int]] = [[] for _ in range(num_features)]
    self._values: list[list[Any]] = [[] for _ in range(num_features)]
    self._meta = {k: [[] for _ in range(spec.num_bins)] for k in spec.other_meta}

  def _too_long(self, lengths: list[int]) -> ValueError:
    spec = self._spec
    bad = [(k, n, c) for k, n, c in zip(spec.keys, lengths, spec.capacities) if n > c]
    return ValueError(
        f"Elements must be truncated to the packed length before packing; "
        f"(feature, length, length_struct value) = {bad}. Truncate them in a map() first.")

  def _fitting_rows(self, lengths: list[int]) -> np.ndarray:
    spec = self._spec
    rows = self._used_rows
    if spec.best_fit and spec.max_sequences_per_bin is not None:
      # Grain's best-fit marks full bins by adding the capacity to their used
      # cells, so an empty "full" bin still takes a zero-length element.
      full = np.where(self._count < spec.max_sequences_per_bin, 0, 1)
      fit = rows[0] + full * spec.capacities[0] <= spec.capacities[0] - lengths[0]
      for f in range(1, len(rows)):
        fit &= rows[f] + full * spec.capacities[f] <= spec.capacities[f] - lengths[f]
      return fit
    fit = rows[0] <= spec.capacities[0] - lengths[0]
    for f in range(1, len(rows)):
      fit &= rows[f] <= spec.capacities[f] - lengths[f]
    if spec.max_sequences_per_bin is not None:
      fit &= self._count < spec.max_sequences_per_bin
    return fit

  def try_add(self, element: Any) -> bool:
    """Places `element` in a row; False if it fits in none (the window is full)."""
    spec = self._spec
    try:
      values = [element[k] for k in spec.keys]
    except KeyError as e:
      raise _missing(element, e.args[0], spec) from None
    lengths = [_length(v) for v in values]
    for n, c in zip(lengths, spec.capacities):
      if n > c:
        raise self._too_long(lengths)
    fit = self._fitting_rows(lengths)
    if spec.best_fit:
      if not fit.any():
        return False
      scores = self._used_rows[0] if len(self._used_rows) == 1 else self._used.sum(axis=0)
      row = int(np.where(fit, scores, -1).argmax())
    else:
      row = int(fit.argmax())
      if not fit[row]:
        return False
    self._rows.append(row)
    segment = int(self._count[row]) + 1
    self._count[row] = segment
    self._segments.append(segment)
    for f, (v, n) in enumerate(zip(values, lengths)):
      used = self._used_rows[f]
      start = int(used[row])
      end = start + n
      align = spec.alignments[f]
      used[row] = end if align == 1 else -(-end // align) * align
      self._starts[f].append(start)
      self._lengths[f].append(n)
      self._values[f].append(v)
    for k in spec.other_meta:
      try:
        self._meta[k][row].append(element[k])
      except KeyError:
        raise _missing(element, k, spec) from None
    return True

  def packed_batch(self) -> dict[str, np.ndarray]:
    """The packed rows that hold at least one element, as Grain returns them."""
    spec = self._spec
    num_rows = int(np.count_nonzero(self._count > 0))
    num_bins = spec.num_bins
    rows = np.asarray(self._rows, dtype=np.int64)
    segments = np.asarray(self._segments, dtype=np.int32)
    out: dict[str, Any] = {}
    for f, key in enumerate(spec.keys):
      length = spec.capacities[f]
      dtype, trailing = self._buffer_specs[f]
      padding = spec.paddings[f]
      shape = (num_bins, length, *trailing)
      values = np.zeros(shape, dtype) if padding is None else np.full(shape, padding, dtype)
      with_ids = key not in spec.sequence_meta
      if with_ids:
        segment_ids = np.zeros((num_bins, length), np.int32)
        positions = np.zeros((num_bins, length), np.int32)
      lengths = np.asarray(self._lengths[f], dtype=np.int64)
      total = int(lengths.sum())
      if total:
        # Token t of element e goes to flat cell row_e * length + start_e + (t - first_e).
        first = np.cumsum(lengths) - lengths
        starts = np.asarray(self._starts[f], dtype=np.int64)
        within = np.arange(total, dtype=np.int64)
        dest = np.repeat(rows * length + starts - first, lengths) + within
        parts = [_as_rows(v, trailing) for v in self._values[f]]
        values.reshape(num_bins * length, *trailing)[dest] = np.concatenate(parts, dtype=dtype, casting="unsafe")
        if with_ids:
          segment_ids.reshape(-1)[dest] = np.repeat(segments, lengths)
          positions.reshape(-1)[dest] = within - np.repeat(first, lengths)
      out[key] = values[:num_rows]
      if with_ids:
        out[f"{key}_segment_ids"] = segment_ids[:num_rows]
        out[f"{key}_positions"] = positions[:num_rows]
    for k in spec.other_meta:
      per_row = np.empty(num_rows, dtype=object)
      for i in range(num_rows):
        per_row[i] = self._meta[k][i]
      out[k] = per_row
    return {k: out[k] for k in spec.output_keys}


def _as_rows(v: Any, trailing: tuple[int, ...]) -> np.ndarray:
  """A feature value as an array of rows (a scalar becomes one row)."""
  if type(v) is np.ndarray and v.ndim:  # pylint: disable=unidiomatic-typecheck
    return v
  if np.ndim(v) == 0:
    return np.broadcast_to(np.asarray(v), (1, *trailing))
  return np.asarray(v)


def row_order(batch: Mapping[str, np.ndarray], num_rows: int, seed: int,
              group_by_feature: str | None) -> list[int] | np.ndarray:
  """Grain's emission order of shuffled bins: a seeded permutation, optionally
  stably sorted by the mean of the distinct non-zero values of a feature."""
  order = np.random.default_rng(seed).permuted(range(num_rows))
  if group_by_feature is None:
    return order
  means = []
  for row in batch[group_by_feature]:
    distinct = np.unique(row)
    nonzero = np.count_nonzero(distinct)
    means.append(np.nan_to_num(np.sum(distinct) / nonzero, nan=0.0) if nonzero else 0.0)
  return sorted(range(num_rows), key=lambda i: (means[i], order[i], i))
