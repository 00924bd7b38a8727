"""First-fit and best-fit packing of variable-length sequences into bins.

`FirstFitPackIterDataset` / `BestFitPackIterDataset` take Grain 0.2.18's
arguments and produce exactly Grain's packed examples for the same input order
(see `packing_utils` for the algorithm). They are sequential stages: after
`mp_prefetch` they run in the consuming process on the reassembled stream, so
the packed examples do not depend on the worker count (Grain packs per worker).

State: `{"replay_from": <a parent state>, "skip": <elements after it before
the window being emitted, failed ones included>, "next_row": <rows of that window already emitted>,
"counter": <rows emitted in all>}`, plus `"raised": <n>` in a state saved
after the input raised (or an element was too long, Grain's ValueError) while
the packer filled that window (no row of it emitted yet): the window's first n
input elements were read and their errors raised, so a restore re-packing the
window does not raise them again. Older
states (no "raised") restore as before. Grain's layout names the window's start
"parent"; ours is another key (states written before named it "parent" too)
so that Grain, given our state, refuses it (KeyError) instead of resuming at
other rows. Grain's own states (no "skip") restore here. A restore
re-reads that window from the parent, packs it again (deterministically: the
bin shuffle is seeded by `seed + rows emitted before the window`) and skips
`next_row` rows, so it is exact at every step; it reads at most two windows
of parent elements. Grain instead reads the parent's state before every
element; here it is read once per window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loader import checks
from loader import iter_dataset
from loader import state as state_lib
from loader.transformations import packing_utils


_ALL = float("inf")  # Every input element of the window was read (and raised) before.


class _PackIterator(iter_dataset.DatasetIterator):
  """Emits the rows of one packed window at a time, filling the next meanwhile.

  A position in the parent stream is (anchor, skip): restore the parent to
  the state `anchor`, then read `skip` elements. The anchor is renewed once per
  window, so the parent's state is read once per window rather than before
  every element, and `skip` stays below one window's worth of elements.
  """

  def __init__(self, parent: iter_dataset.DatasetIterator, spec: packing_utils.PackSpec, *,
               seed: int, shuffle_bins: bool, group_by_feature: str | None, owner: str,
               nesting: packing_utils.Nesting | None = None, error: str | None = None):
    super().__init__(parent)
    self._spec = spec
    self._nesting = nesting
    self._error = error  # Grain raises a nested feature that is not meta on the first next().
    self._seed = seed
    self._shuffle_bins = shuffle_bins
    self._group_by_feature = group_by_feature
    self._owner = owner
    self._cache = packing_utils.WindowCache()
    # Meta features outside length_struct are per-row lists, which `batch`
    # nests differently from a fancy-indexed object array.
    self.stacks_like_batch = not spec.other_meta
    self._reset(state_lib.strip(parent.get_state()), skip=0, rows_before=0, next_row=0)

  def _reset(self, anchor: dict[str, Any], *, skip: int, rows_before: int, next_row: int, raised: int = 0) -> None:
    self._anchor = anchor
    self._pulled = skip  # Elements read from the parent since `_anchor`.
    self._window_start = (anchor, skip)  # Where the window being emitted starts.
    self._next_start: tuple[dict[str, Any], int] | None = None  # Where the one after it starts.
    self._rows_before = rows_before  # Seeds the window's bin shuffle.
    self._next_row = next_row
    self._filling: packing_utils.PackingWindow | None = None
    # Input elements of the window being filled read so far (failed ones included), and how many of them a
    # restore re-reads quietly: their errors were raised before the state was saved (all of them once a row
    # of the window was emitted, since the window was then packed whole).
    self._window_reads = 0
    self._raised = raised
    self._batch: dict[str, Any] | None = None
    self._order = None
    self._num_rows = 0

  def get_state(self) -> dict[str, Any]:
    anchor, skip = self._window_start
    state = {"replay_from": anchor, "skip": skip, "next_row": self._next_row,
             "counter": self._rows_before + self._next_row}
    if self._next_row == 0 and self._raised:
      state["raised"] = self._raised  # Only then: other states keep the layout older versions read.
    return state

  # Grain's layout: its "parent" is where the window being emitted starts, with nothing to skip.
  _grain_state_keys = ("parent", "next_row", "counter")

  def set_state(self, state: dict[str, Any]) -> None:
    if isinstance(state, dict) and set(state) == set(self._grain_state_keys):
      state = {**state, "skip": 0}
    if isinstance(state, dict) and "replay_from" in state and "parent" not in state:
      state = {("parent" if k == "replay_from" else k): v for k, v in state.items()}
    keys = ("parent", "skip", "next_row", "counter")
    state_lib.check_keys(state, keys + ("raised",) if isinstance(state, dict) and "raised" in state else keys,
                         self._owner)
    skip = checks.check_int(state["skip"], "skip", minimum=0)
    next_row = checks.check_int(state["next_row"], "next_row", minimum=0)
    counter = checks.check_int(state["counter"], "counter", minimum=next_row)
    raised = checks.check_int(state.get("raised", 0), "raised", minimum=0)
    if raised and next_row:
      raise ValueError(f"{self._owner}.set_state: a state with \"raised\" ({raised}) must have next_row 0, got "
                       f"{next_row}; was it saved from a different pipeline?")
    self._parent.set_state(state["parent"])
    anchor = state_lib.strip(self._parent.get_state())
    for _ in range(skip):
      try:
        next(self._parent)
      except StopIteration:
        raise ValueError(f"{self._owner}.set_state: the input ended before the packed window of {state!r}; "
                         "was it saved from a different pipeline or input?") from None
      except Exception:  # pylint: disable=broad-except
        pass  # An element that failed (consumed, raised before the state was saved) counts in `skip`.
    # Rows of the window were emitted, so it was packed whole: its input's errors were raised then.
    self._reset(anchor, skip=skip, rows_before=counter - next_row, next_row=next_row,
                raised=_ALL if next_row else raised)

  def _finish_window(self, next_element: Any, next_start: tuple[dict[str, Any], int]) -> None:
    self._num_rows = self._filling.num_rows
    if self._num_rows == 0 and next_element is None:
      # Every element read since the last window was too long (each raised): Grain 0.2.18 then emits an
      # empty packed batch, which fails with this IndexError at every later next().
      raise IndexError(f"{self._owner}: the input ended while the packed window held no element (every "
                       "element since the last window was too long); Grain raises IndexError here too")
    if self._next_row >= self._num_rows:
      raise ValueError(
          f"{self._owner}.set_state: the state points at row {self._next_row} of a packed window that "
          f"has {self._num_rows} rows; was it saved from a different pipeline or input?")
    seed = self._seed + self._rows_before
    if self._shuffle_bins and self._group_by_feature is None:
      # Written in emission order, so `_order` stays None and batches slice it.
      batch = self._filling.packed_batch(packing_utils.shuffled_rows(self._num_rows, seed))
    else:
      batch = self._filling.packed_batch()
      if self._shuffle_bins:
        self._order = packing_utils.row_order(batch, self._num_rows, seed, self._group_by_feature)
    self._batch = batch
    self._next_start = next_start
    self._filling = None
    self._window_reads, self._raised = (0 if next_element is None else 1), 0
    if next_element is not None:
      self._filling = packing_utils.PackingWindow(self._spec, next_element, self._cache)
      if not self._filling.try_add(next_element):
        raise ValueError(f"{self._owner}: could not add an element to an empty packed window "
                         f"(length_struct lengths {self._spec.capacities}); please file a bug.")

  def _fill(self) -> None:
    parent = self._parent
    while True:
      try:
        element = next(parent)
      except StopIteration:
        if self._filling is None:
          raise
        self._finish_window(None, (self._anchor, self._pulled))  # The last, possibly partial, window.
        return
      except Exception:  # pylint: disable=broad-except
        self._pulled += 1  # Consumed: positions count it, so a restore resumes after it.
        self._window_reads += 1
        if self._window_reads <= self._raised:
          continue  # Raised when the window was first packed.
        self._raised = self._window_reads  # A state saved now re-packs the window quietly up to here.
        raise
      self._pulled += 1
      self._window_reads += 1
      if self._nesting is not None:
        element = self._nesting.flatten(element)
      if self._filling is None:
        self._filling = packing_utils.PackingWindow(self._spec, element, self._cache)
        if self._rows_before:
          # A window after the first, restored: the run that saved the state renewed the anchor after this
          # element (its rollover), so do the same; the states that follow are then that run's.
          self._anchor, self._pulled = state_lib.strip(parent.get_state()), 0
      try:
        fits = self._filling.try_add(element)
      except ValueError:
        # An element longer than its length (Grain's ValueError): consumed like an input element that
        # failed, and counted the same way, so a restore re-packing the window does not raise it again (an
        # enclosing packer's restore counts it as read once).
        if self._window_reads <= self._raised:
          continue
        self._raised = self._window_reads
        raise
      if not fits:
        start = (self._anchor, self._pulled - 1)  # The next window starts with `element`.
        self._anchor, self._pulled = state_lib.strip(parent.get_state()), 0
        self._finish_window(element, start)
        return

  def _advance(self, rows: int) -> None:
    self._next_row += rows
    if self._next_row >= self._num_rows:
      self._rows_before += self._num_rows
      self._window_start = self._next_start
      self._batch, self._order, self._next_row = None, None, 0

  def _check_usable(self) -> None:
    self._assert_not_closed()
    if self._error:
      raise ValueError(self._error)

  def __next__(self) -> dict[str, Any]:
    self._check_usable()
    if self._batch is None:
      self._fill()
    r = self._next_row if self._order is None else self._order[self._next_row]
    out = {k: v[r] for k, v in self._batch.items()}
    self._advance(1)
    return out if self._nesting is None else self._nesting.unflatten(out)

  def stacked_rows(self, count: int) -> dict[str, Any] | None:
    """The next `count` rows (fewer at the end) stacked as `batch` would, or None at the end.

    `batch` right after packing calls this instead of `next()` per row: one
    fancy-indexing copy per feature and window instead of a dict per row and
    an `np.stack`. Errors consume what was read, as `batch` over `next()` does.
    """
    self._check_usable()
    pieces = []
    while count:
      if self._batch is None:
        try:
          self._fill()
        except StopIteration:
          break
      take = min(count, self._num_rows - self._next_row)
      # Slices view the window's arrays, which nothing else holds or writes.
      rows = (slice(self._next_row, self._next_row + take) if self._order is None
              else np.asarray(self._order[self._next_row:self._next_row + take]))
      pieces.append({k: v[rows] for k, v in self._batch.items()})
      self._advance(take)
      count -= take
    if not pieces:
      return None
    out = pieces[0] if len(pieces) == 1 else {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    return out if self._nesting is None else self._nesting.unflatten(out)


class _PackIterDataset(iter_dataset.SequentialIterDataset):
  """Shared constructor of the bin-packing datasets."""

  _same_as_grain = True  # Grain's packed examples, for the same input order.
  _BEST_FIT = False

  def __init__(
      self,
      parent: iter_dataset.IterDataset,
      *,
      length_struct: Any,
      num_packing_bins: int,
      seed: int = 0,
      shuffle_bins: bool = True,
      shuffle_bins_group_by_feature: str | None = None,
      meta_features: Sequence[str] = (),
      pack_alignment_struct: Any = None,
      padding_struct: Any = None,
      max_sequences_per_bin: int | None = None,
  ):
    """Packs the parent's variable-length dict elements into bins.

    Args:
      parent: Elements are dicts holding a 1-D (or N-D, packed along axis 0)
        array or scalar per key of `length_struct`, each no longer than its
        length there; other keys are dropped (except meta features).
      length_struct: Packed length per feature, e.g. `{"inputs": 1024}`.
      num_packing_bins: Rows packed at once; more rows waste less padding.
      seed: Seeds the bin shuffle (window w uses `seed + rows before it`).
      shuffle_bins: Emit each window's rows in a seeded random order.
      shuffle_bins_group_by_feature: Then sort rows by the mean of this
        feature's distinct non-zero values (stable in the shuffled order).
      meta_features: Features packed without `_segment_ids`/`_positions` (if in
        `length_struct`, where a meta feature may be a nested dict of lengths:
        each leaf is packed to its own length) or returned as per-row lists of
        the packed elements' values (if not).
      pack_alignment_struct: Per feature, round each element's end up to a
        multiple of this.
      padding_struct: Per feature, the padding value (default 0).
      max_sequences_per_bin: At most this many elements per row.
    """
    super().__init__(parent)
    owner = type(self).__name__
    # A nested dict in length_struct: each leaf is packed as its own feature.
    self._nesting = nesting = packing_utils.Nesting.of(length_struct)
    self._error = None
    flat_meta = meta_features
    if nesting is not None:
      if not isinstance(meta_features, (str, bytes)):
        flat_meta = nesting.flat_meta(meta_features)
        not_meta = sorted(nesting.tops - set(meta_features))
        if not_meta:
          # Grain's words, raised where Grain raises them: on the first next().
          self._error = (f"Failed to extract segment ids for {not_meta[0]!r}, which has type <class 'dict'> "
                         "rather than np.ndarray. Perhaps it should be marked as a meta feature? (Only meta "
                         f"features may be nested dicts; add {not_meta[0]!r} to meta_features.)")
          flat_meta = list(flat_meta) + nesting.flat_meta(not_meta)
    self._spec = packing_utils.make_spec(
        owner, length_struct=nesting.flat_struct(length_struct) if nesting else length_struct,
        num_packing_bins=num_packing_bins, meta_features=flat_meta,
        pack_alignment_struct=nesting.flat_struct(pack_alignment_struct) if nesting else pack_alignment_struct,
        padding_struct=nesting.flat_struct(padding_struct) if nesting else padding_struct,
        max_sequences_per_bin=max_sequences_per_bin,
        shuffle_bins_group_by_feature=shuffle_bins_group_by_feature, best_fit=self._BEST_FIT)
    self._seed = checks.check_int(seed, "seed", minimum=0)
    self._shuffle_bins = bool(shuffle_bins)
    self._group_by_feature = shuffle_bins_group_by_feature
    # Every argument that changes the output, for reprs and state descriptions.
    self._args = {"length_struct": dict(length_struct), "num_packing_bins": self._spec.num_bins}
    optional = {"seed": (self._seed, 0), "shuffle_bins": (self._shuffle_bins, True),
                "shuffle_bins_group_by_feature": (shuffle_bins_group_by_feature, None),
                "meta_features": (list(meta_features), []), "pack_alignment_struct": (pack_alignment_struct, None),
                "padding_struct": (padding_struct, None), "max_sequences_per_bin": (max_sequences_per_bin, None)}
    self._args.update((k, v) for k, (v, default) in optional.items() if v != default)

  def _op_repr(self) -> str:
    return f".{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._args.items())})"

  def __str__(self) -> str:
    return type(self).__name__

  def make_iterator(self, parent: iter_dataset.DatasetIterator) -> iter_dataset.DatasetIterator:
    return _PackIterator(parent, self._spec, seed=self._seed, shuffle_bins=self._shuffle_bins,
                         group_by_feature=self._group_by_feature, owner=type(self).__name__,
                         nesting=self._nesting, error=self._error)


class FirstFitPackIterDataset(_PackIterDataset):
  """First-fit packing (Grain's `grain.experimental.FirstFitPackIterDataset`).

  Each element goes to the first of `num_packing_bins` rows where all its
  features fit; when it fits in none, the rows are emitted (optionally
  shuffled) and a new window starts with it. Every packed feature `k` gets
  `k_segment_ids` (1, 2, ... per element in the row, 0 for padding) and
  `k_positions` (0, 1, ... within each element).
  """


class BestFitPackIterDataset(_PackIterDataset):
  """Best-fit packing (Grain's `grain.experimental.BestFitPackIterDataset`).

  Like first-fit, but each element goes to the fitting row with the most used
  cells (summed over features), which leaves less padding when lengths vary.
  """

  _BEST_FIT = True
