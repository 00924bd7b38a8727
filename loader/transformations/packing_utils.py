"""Multi-bin packing of variable-length sequences (first-fit and best-fit).

A `PackingWindow` has `num_packing_bins` rows of `length_struct[k]` cells per
feature `k`. Elements are placed one by one (Grain's online algorithm: the
first row where every feature fits, or the fitting row that is already the
fullest); when one fits nowhere the window is finished and the next one starts
with it. Placement only records each element's row and start cells (a Python
scan over the rows for up to `_PY_SCAN_MAX_BINS` bins, numpy above). When the
window is finished, each feature's rows are laid out as runs (elements and
padding, in order) and written with one `np.concatenate` into the buffer and
one `np.repeat` and one `np.concatenate` for segment ids and positions: the
cost per token is a copy, the cost per element a handful of Python operations.
While every element has one length across features (MaxText's inputs and
targets), the features share one layout: one row scan, and segment ids and
positions computed once (later features get copies).

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
  checks.check_length_struct(length_struct, owner, "{'inputs': 1024, 'targets': 1024}")
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


_NEST_SEP = "\x1f"  # Joins the path of a nested meta feature's leaf into one packed key.


@dataclasses.dataclass(frozen=True)
class Nesting:
  """Meta features given as nested dicts (Grain packs each leaf to its own length).

  The packer works on flat keys: each leaf `{"m": {"x": ...}}` becomes the
  key `"m\x1fx"` on the way in, and packed rows get the nested dicts back on
  the way out, keys sorted at every level as Grain's pytree map emits them.
  """

  leaves: tuple[tuple[str, tuple[str, ...]], ...]  # (flat key, path) of each nested leaf.
  tops: frozenset[str]

  @classmethod
  def of(cls, length_struct: Any) -> Nesting | None:
    if not isinstance(length_struct, Mapping):
      return None
    leaves = tuple((_NEST_SEP.join(path), path) for k, v in length_struct.items() if isinstance(v, Mapping)
                   for path in _paths(v, (k,)))
    return cls(leaves, frozenset(path[0] for _, path in leaves)) if leaves else None

  def flat_struct(self, struct: Any) -> Any:
    """A length/alignment/padding struct with the nested features' leaves as flat keys."""
    if not isinstance(struct, Mapping):
      return struct
    out = {k: v for k, v in struct.items() if k not in self.tops}
    for flat, path in self.leaves:
      out[flat] = _get_path(struct, path)
    return out

  def flat_meta(self, meta_features: Sequence[str]) -> list[str]:
    return [f for m in meta_features
            for f in ([flat for flat, path in self.leaves if path[0] == m] if m in self.tops else [m])]

  def flatten(self, element: Any) -> Any:
    if not isinstance(element, Mapping):
      return element
    out = {k: v for k, v in element.items() if k not in self.tops}
    for flat, path in self.leaves:
      try:
        out[flat] = _get_path(element, path)
      except (KeyError, TypeError):
        pass  # The packer names the missing feature.
    return out

  def unflatten(self, packed: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in packed.items() if _NEST_SEP not in k}
    for flat, path in self.leaves:
      node = out
      for k in path[:-1]:
        node = node.setdefault(k, {})
      node[path[-1]] = packed[flat]
    return _sorted_dicts(out)


def _paths(struct: Mapping[str, Any], prefix: tuple[str, ...]):
  for k in sorted(struct):
    if isinstance(struct[k], Mapping):
      yield from _paths(struct[k], prefix + (k,))
    else:
      yield prefix + (k,)


def _get_path(struct: Any, path: tuple[str, ...]) -> Any:
  for k in path:
    struct = struct[k]
  return struct


def _tree_path(key: str) -> str:
  """A packed (flat) key as the repr of JAX's key path to it, e.g. `(DictKey(key='inputs'),)`."""
  parts = [f"DictKey(key={k!r})" for k in key.split(_NEST_SEP)]
  return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


def _sorted_dicts(x: dict[str, Any]) -> dict[str, Any]:
  return {k: _sorted_dicts(x[k]) if isinstance(x[k], dict) else x[k] for k in sorted(x)}


def _length(x: Any) -> int:
  """Sequence length of a feature value; scalars count as one token (as in Grain)."""
  if type(x) is np.ndarray:  # pylint: disable=unidiomatic-typecheck
    return x.shape[0] if x.ndim else 1
  return 1 if np.ndim(x) == 0 else len(x)


def _buffer_spec(x: Any) -> tuple[np.dtype, tuple[int, ...]]:
  """Dtype and trailing shape of a feature's buffer, from the window's first element."""
  if type(x) is np.ndarray and x.ndim:  # pylint: disable=unidiomatic-typecheck
    return x.dtype, x.shape[1:]
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


# Up to this many bins a plain Python scan finds the row faster than numpy's
# per-call overhead; above it, vectorised comparisons over all bins win.
_PY_SCAN_MAX_BINS = 32


class PackingWindow:
  """One window of `num_bins` rows being filled, then turned into a packed batch."""

  def __init__(self, spec: PackSpec, element_for_shapes: Any, cache: WindowCache | None = None):
    self._spec = spec
    self._cache = cache or WindowCache()
    try:
      self._buffer_specs = [_buffer_spec(element_for_shapes[k]) for k in spec.keys]
    except KeyError as e:
      raise _missing(element_for_shapes, e.args[0], spec) from None
    num_features, num_bins = len(spec.keys), spec.num_bins
    self._used = [[0] * num_bins for _ in range(num_features)]  # Next free cell (aligned) per row.
    self._count = [0] * num_bins  # Elements per row.
    self._vectorised = num_bins > _PY_SCAN_MAX_BINS
    # The common case (MaxText's inputs/targets: no alignment, no sequence
    # cap, equal capacities) takes a lean path: while every element so far had
    # the same length in every feature, all features share one layout (one
    # `used` list, aliased, to scan; one set of segment ids/positions). The
    # first element that breaks it sends the window to the general path.
    self._shared = (not self._vectorised and spec.max_sequences_per_bin is None and not spec.other_meta
                    and all(a == 1 for a in spec.alignments) and len(set(spec.capacities)) == 1)
    self._all_arrays = True  # Every value added while shared is an array of rows (no _as_rows needed).
    if self._shared:
      self._used = [self._used[0]] * num_features
    if self._vectorised:
      self._used_np = np.zeros((num_features, num_bins), dtype=np.int64)
      self._count_np = np.zeros(num_bins, dtype=np.int64)
    self._aligned = any(a != 1 for a in spec.alignments)
    # Per row, its elements in placement order: (segment id, starts, lengths, values) per feature.
    self._row_elements: list[list[tuple[int, list[int], list[int], list[Any]]]] = [[] for _ in range(num_bins)]
    self._meta = {k: [[] for _ in range(num_bins)] for k in spec.other_meta}

  def _too_long(self, lengths: list[int]) -> ValueError:
    spec = self._spec
    # Grain's message word for word (client code matches or logs it): each
    # feature as the tree path Grain's pytree flattening gives it.
    bad = ", ".join(f"({_tree_path(k)}, {n}, {c})" for k, n, c in zip(spec.keys, lengths, spec.capacities) if n > c)
    who = "packer" if spec.best_fit else "PackedBatch"
    return ValueError(
        f"Inputs to {who} must be truncated to max length. Exceeds: (feature_path, feature_length, "
        f"max_length) = [{bad}]")

  def _find_row_scan(self, lengths: list[int]) -> int:
    """The row for an element (Grain's rule), or -1; a Python scan over the bins."""
    spec = self._spec
    used, count, caps = self._used, self._count, spec.capacities
    limits = [c - n for c, n in zip(caps, lengths)]
    max_seq = spec.max_sequences_per_bin
    if not spec.best_fit:
      # Specialised loops for one and two features (e.g. MaxText's inputs and
      # targets): `all()` over a generator costs more than the comparisons.
      if len(used) == 1 and max_seq is None:
        u, lim = used[0], limits[0]
        for r in range(spec.num_bins):
          if u[r] <= lim:
            return r
        return -1
      if len(used) == 2 and max_seq is None:
        (u0, u1), (lim0, lim1) = used, limits
        for r in range(spec.num_bins):
          if u0[r] <= lim0 and u1[r] <= lim1:
            return r
        return -1
      for r in range(spec.num_bins):
        if (max_seq is None or count[r] < max_seq) and all(u[r] <= lim for u, lim in zip(used, limits)):
          return r
      return -1
    best, best_score = -1, -1
    if len(used) <= 2 and max_seq is None:
      (u0, u1), (lim0, lim1) = (used * 2)[:2], (limits * 2)[:2]
      two = len(used) == 2
      for r in range(spec.num_bins):
        if u0[r] <= lim0 and u1[r] <= lim1:
          score = u0[r] + u1[r] if two else u0[r]
          if score > best_score:
            best, best_score = r, score
      return best
    for r in range(spec.num_bins):
      if max_seq is not None and count[r] >= max_seq:
        # Grain marks a full bin by adding the capacity to its used cells.
        fits = all(u[r] + c <= lim for u, c, lim in zip(used, caps, limits))
      else:
        fits = all(u[r] <= lim for u, lim in zip(used, limits))
      if fits:
        score = sum(u[r] for u in used)  # Grain's score: used cells summed over features.
        if score > best_score:
          best, best_score = r, score
    return best

  def _find_row_vectorised(self, lengths: list[int]) -> int:
    """As `_find_row_scan`, with numpy comparisons over all bins at once."""
    spec = self._spec
    used, count, caps = self._used_np, self._count_np, spec.capacities
    max_seq = spec.max_sequences_per_bin
    if spec.best_fit and max_seq is not None:
      full = np.where(count < max_seq, 0, 1)
      fit = used[0] + full * caps[0] <= caps[0] - lengths[0]
      for f in range(1, len(caps)):
        fit &= used[f] + full * caps[f] <= caps[f] - lengths[f]
    else:
      fit = used[0] <= caps[0] - lengths[0]
      for f in range(1, len(caps)):
        fit &= used[f] <= caps[f] - lengths[f]
      if max_seq is not None and not spec.best_fit:
        fit &= count < max_seq
    if spec.best_fit:
      if not fit.any():
        return -1
      scores = used[0] if len(caps) == 1 else used.sum(axis=0)
      return int(np.where(fit, scores, -1).argmax())
    row = int(fit.argmax())
    return row if fit[row] else -1

  def _unshare(self) -> None:
    """Gives each feature its own layout (an element's lengths differ across features)."""
    self._shared = False
    self._used = [list(self._used[0]) for _ in self._used]
    num_features = len(self._used)
    self._row_elements = [[(segment, [start] * num_features, [n] * num_features, values)
                           for segment, start, n, values in row] for row in self._row_elements]

  def _try_add_shared(self, element: Any) -> bool | None:
    """`try_add` while the layout is shared; None if `element` ends that (then `try_add` places it).

    A row's elements are kept as (segment, start, length, values), with one
    start and length for all features; this path runs per element, so it
    allocates as few containers as it can.
    """
    spec = self._spec
    try:
      values = [element[k] for k in spec.keys]
    except KeyError as e:
      raise _missing(element, e.args[0], spec) from None
    n = -1
    for v in values:
      if type(v) is np.ndarray and v.ndim:  # pylint: disable=unidiomatic-typecheck
        m = len(v)
      else:
        m = _length(v)
        self._all_arrays = False
      if n != m:
        if n >= 0:
          self._unshare()
          return None
        n = m
    limit = spec.capacities[0] - n
    if limit < 0:
      raise self._too_long([n] * len(values))
    used = self._used[0]
    row = -1
    if spec.best_fit:
      # Grain's score sums the used cells over features: the same order as one feature's.
      best = -1
      for r, u in enumerate(used):
        if best < u <= limit:
          row, best = r, u
    else:
      for r, u in enumerate(used):
        if u <= limit:
          row = r
          break
    if row < 0:
      return False
    start = used[row]
    used[row] = start + n
    segment = self._count[row] + 1
    self._count[row] = segment
    self._row_elements[row].append((segment, start, n, values))
    return True

  def try_add(self, element: Any) -> bool:
    """Places `element` in a row; False if it fits in none (the window is full)."""
    if self._shared:
      added = self._try_add_shared(element)
      if added is not None:
        return added
    spec = self._spec
    values, lengths = [], []
    try:
      for k, cap in zip(spec.keys, spec.capacities):
        v = element[k]
        n = len(v) if type(v) is np.ndarray and v.ndim else _length(v)  # pylint: disable=unidiomatic-typecheck
        values.append(v)
        lengths.append(n)
        if n > cap:
          lengths += [_length(element[k]) for k in spec.keys[len(lengths):]]
          raise self._too_long(lengths)
    except KeyError as e:
      raise _missing(element, e.args[0], spec) from None
    row = self._find_row_vectorised(lengths) if self._vectorised else self._find_row_scan(lengths)
    if row < 0:
      return False
    segment = self._count[row] + 1
    self._count[row] = segment
    starts = [u[row] for u in self._used]
    if self._aligned:
      for u, start, n, align in zip(self._used, starts, lengths, spec.alignments):
        u[row] = -(-(start + n) // align) * align
    else:
      for u, start, n in zip(self._used, starts, lengths):
        u[row] = start + n
    if self._vectorised:
      self._count_np[row] = segment
      self._used_np[:, row] = [u[row] for u in self._used]
    self._row_elements[row].append((segment, starts, lengths, values))
    for k in spec.other_meta:
      try:
        self._meta[k][row].append(element[k])
      except KeyError:
        raise _missing(element, k, spec) from None
    return True

  @property
  def num_rows(self) -> int:
    """Rows holding at least one element; they come first (an empty row is only used when no other fits)."""
    return sum(1 for c in self._count if c > 0)

  def _runs(self, f: int, pad: np.ndarray, with_ids: bool,
            rows: Sequence[list[Any]]) -> tuple[list[Any], list[Any], list[int], list[int]]:
    """Feature f's rows as consecutive runs of elements and padding (alignment gaps, row tails).

    Returns the value parts (padding viewing `pad`), the position parts (views
    of a shared arange, zeros for padding), and each run's segment id (0 for
    padding) and length.
    """
    length = self._spec.capacities[f]
    trailing = self._buffer_specs[f][1]
    counting, zeros = self._cache.positions(length)
    parts, position_parts, run_segments, run_lengths = [], [], [], []
    for row_elements in rows:
      pos = 0
      for segment, starts, lengths, values in row_elements:
        start, n = starts[f], lengths[f]
        if start > pos:
          parts.append(pad[:start - pos])
          run_segments.append(0)
          run_lengths.append(start - pos)
          if with_ids:
            position_parts.append(zeros[:start - pos])
        parts.append(_as_rows(values[f], trailing))
        run_segments.append(segment)
        run_lengths.append(n)
        if with_ids:
          position_parts.append(counting[:n])
        pos = start + n
      if pos < length:
        parts.append(pad[:length - pos])
        run_segments.append(0)
        run_lengths.append(length - pos)
        if with_ids:
          position_parts.append(zeros[:length - pos])
    return parts, position_parts, run_segments, run_lengths

  def _shared_runs(self, pads: list[np.ndarray], rows: Sequence[list[Any]]
                   ) -> tuple[list[list[Any]], list[Any], list[int], list[int]]:
    """`_runs` of every feature at once, for a shared layout (no gaps inside a row)."""
    length = self._spec.capacities[0]
    counting, zeros = self._cache.positions(length)
    parts = [[] for _ in pads]
    position_parts, run_segments, run_lengths = [], [], []
    for row_elements in rows:
      pos = 0
      for segment, _, n, values in row_elements:
        for p, v in zip(parts, values):
          p.append(v)
        run_segments.append(segment)
        run_lengths.append(n)
        position_parts.append(counting[:n])
        pos += n
      if pos < length:
        tail = length - pos
        for p, pad in zip(parts, pads):
          p.append(pad[:tail])
        run_segments.append(0)
        run_lengths.append(tail)
        position_parts.append(zeros[:tail])
    if not self._all_arrays:
      parts = [[_as_rows(v, spec[1]) for v in p] for p, spec in zip(parts, self._buffer_specs)]
    return parts, position_parts, run_segments, run_lengths

  def packed_batch(self, order: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The packed rows that hold at least one element, as Grain returns them.

    With `order` (a permutation of the non-empty rows), output row i is row
    `order[i]`: a shuffled window is written in its emission order, so the
    batches after it are slices rather than gathered copies.

    Each output array is allocated once and written by one numpy call: every
    cell belongs to exactly one run, so nothing needs zero-filling first.
    """
    spec = self._spec
    num_rows = self.num_rows
    num_bins = spec.num_bins
    rows = self._row_elements
    if order is not None:
      rows = [rows[r] for r in order] + rows[num_rows:]
    out: dict[str, Any] = {}
    pads = [self._cache.padding(f, length, dtype, trailing, spec.paddings[f])
            for f, (length, (dtype, trailing)) in enumerate(zip(spec.capacities, self._buffer_specs))]
    if self._shared:
      shared_parts, position_parts, run_segments, run_lengths = self._shared_runs(pads, rows)
    layout = None  # A shared window's segment ids and positions, computed once.
    for f, key in enumerate(spec.keys):
      length = spec.capacities[f]
      dtype, trailing = self._buffer_specs[f]
      with_ids = key not in spec.sequence_meta
      if self._shared:
        parts = shared_parts[f]
      else:
        parts, position_parts, run_segments, run_lengths = self._runs(f, pads[f], with_ids, rows)
      values = np.empty((num_bins, length, *trailing), dtype)
      np.concatenate(parts, out=values.reshape(num_bins * length, *trailing), casting="unsafe")
      out[key] = values[:num_rows]
      if with_ids:
        if layout is None:
          segment_ids = np.repeat(np.asarray(run_segments, dtype=np.int32), run_lengths)
          positions = np.empty((num_bins, length), np.int32)
          np.concatenate(position_parts, out=positions.reshape(-1))
          segment_ids, positions = segment_ids.reshape(num_bins, length)[:num_rows], positions[:num_rows]
          if self._shared:
            layout = segment_ids, positions
        else:
          segment_ids, positions = layout[0].copy(), layout[1].copy()
        out[f"{key}_segment_ids"] = segment_ids
        out[f"{key}_positions"] = positions
    for k in spec.other_meta:
      per_row = np.empty(num_rows, dtype=object)
      for i in range(num_rows):
        per_row[i] = self._meta[k][i if order is None else order[i]]
      out[k] = per_row
    return {k: out[k] for k in spec.output_keys}


class WindowCache:
  """Read-only arrays that every window of a stream views: padding runs and positions."""

  def __init__(self):
    self._paddings: dict[tuple[Any, ...], np.ndarray] = {}
    self._positions: tuple[np.ndarray, np.ndarray] | None = None

  def padding(self, f: int, length: int, dtype: np.dtype, trailing: tuple[int, ...], value: Any) -> np.ndarray:
    key = (f, dtype, trailing)
    pad = self._paddings.get(key)
    if pad is None:
      # np.zeros, not np.full(0): a bytes/str feature pads with b''/'' as Grain's (not b'0').
      pad = np.zeros((length, *trailing), dtype) if value is None else np.full((length, *trailing), value, dtype)
      pad.flags.writeable = False
      self._paddings[key] = pad
    return pad

  def positions(self, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(0, 1, ..., length - 1) and zeros, as int32, at least `length` long."""
    if self._positions is None or len(self._positions[0]) < length:
      counting, zeros = np.arange(length, dtype=np.int32), np.zeros(length, np.int32)
      counting.flags.writeable = zeros.flags.writeable = False
      self._positions = counting, zeros
    return self._positions


def _as_rows(v: Any, trailing: tuple[int, ...]) -> Any:
  """A feature value as an array of rows (a scalar becomes one row)."""
  if type(v) is np.ndarray and v.ndim:  # pylint: disable=unidiomatic-typecheck
    return v
  if np.ndim(v) == 0:
    return np.broadcast_to(np.asarray(v), (1, *trailing))
  return np.asarray(v)


def shuffled_rows(num_rows: int, seed: int) -> np.ndarray:
  """Grain's emission order of shuffled bins: a seeded permutation."""
  return np.random.default_rng(seed).permuted(range(num_rows))


def row_order(batch: Mapping[str, np.ndarray], num_rows: int, seed: int,
              group_by_feature: str | None) -> list[int] | np.ndarray:
  """Grain's emission order of shuffled bins (`shuffled_rows`), optionally
  stably sorted by the mean of the distinct non-zero values of a feature."""
  order = shuffled_rows(num_rows, seed)
  if group_by_feature is None:
    return order
  means = []
  for row in batch[group_by_feature]:
    distinct = np.unique(row)
    nonzero = np.count_nonzero(distinct)
    means.append(np.nan_to_num(np.sum(distinct) / nonzero, nan=0.0) if nonzero else 0.0)
  return sorted(range(num_rows), key=lambda i: (means[i], order[i], i))
