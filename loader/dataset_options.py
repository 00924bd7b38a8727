"""Grain's per-pipeline options (`grain.experimental.DatasetOptions`).

Options are attached with `WithOptionsIterDataset` and apply to the whole
iterator tree, before and after the point where they are set, as in Grain:
every iterator of one pipeline shares one `IteratorContext`. Of Grain's
options, the filter-ratio check is implemented (a warning, or an error, when
a window of 1,000 consecutive elements lost at least the given share to
`filter`). `execution_tracking_mode` and `min_shm_size` are accepted and
kept: loader collects no per-stage statistics, and its worker transport
decides by itself what goes through shared memory.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any

_log = logging.getLogger("loader")

# Grain checks the filtered share on non-overlapping windows of this many
# elements, and warns at most once a minute.
CHECK_WINDOW = 1000
_WARN_INTERVAL_S = 60.0


class ExecutionTrackingMode(enum.Enum):
  """Grain's execution statistics modes; accepted, but loader collects none."""
  DISABLED = 1
  STAGE_TIMING = 2


_UNSET: Any = object()
_DEFAULTS = {
    "filter_warn_threshold_ratio": 0.9,
    "filter_raise_threshold_ratio": None,
    "execution_tracking_mode": ExecutionTrackingMode.DISABLED,
    "min_shm_size": 0,
}


def _check_ratio(name: str, value: Any) -> None:
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
    raise ValueError(f"DatasetOptions.{name} must be None or a number in [0, 1] (got {value!r}).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetOptions:
  """Options for every transformation of a pipeline (Grain's `DatasetOptions`).

  Attributes:
    filter_warn_threshold_ratio: Log a warning when at least this share of a
      window of 1,000 consecutive elements was filtered out (None: never).
    filter_raise_threshold_ratio: Raise a ValueError instead (None: never).
    execution_tracking_mode: Accepted for Grain compatibility; loader
      collects no per-stage statistics.
    min_shm_size: Accepted for Grain compatibility; loader's worker transport
      picks shared memory or a copy by itself.

  As in Grain, a ratio of 0 disables its check, and `merge` prefers fields
  set explicitly (here first, then in `other`) over defaults.
  """

  filter_warn_threshold_ratio: float | None = _UNSET
  filter_raise_threshold_ratio: float | None = _UNSET
  execution_tracking_mode: ExecutionTrackingMode = _UNSET
  min_shm_size: int = _UNSET
  _user_set_fields: frozenset[str] = dataclasses.field(default=frozenset(), init=False, repr=False, compare=False)

  def __post_init__(self):
    user_set = set()
    for name, default in _DEFAULTS.items():
      value = getattr(self, name)
      if value is _UNSET:
        object.__setattr__(self, name, default)
      else:
        user_set.add(name)
    object.__setattr__(self, "_user_set_fields", frozenset(user_set))
    _check_ratio("filter_warn_threshold_ratio", self.filter_warn_threshold_ratio)
    _check_ratio("filter_raise_threshold_ratio", self.filter_raise_threshold_ratio)
    if not isinstance(self.execution_tracking_mode, ExecutionTrackingMode):
      raise ValueError(f"DatasetOptions.execution_tracking_mode must be one of "
                       f"{[m.name for m in ExecutionTrackingMode]} (got {self.execution_tracking_mode!r}).")
    if isinstance(self.min_shm_size, bool) or not isinstance(self.min_shm_size, int) or self.min_shm_size < 0:
      raise ValueError(f"DatasetOptions.min_shm_size must be an int >= 0 (got {self.min_shm_size!r}).")

  def merge(self, other: DatasetOptions | None) -> DatasetOptions:
    """These options, with `other`'s explicitly set fields where these have none."""
    if other is None:
      return self
    kwargs = {}
    for name in _DEFAULTS:
      if name in self._user_set_fields:
        kwargs[name] = getattr(self, name)
      elif name in other._user_set_fields:  # pylint: disable=protected-access
        kwargs[name] = getattr(other, name)
    return DatasetOptions(**kwargs)


class IteratorContext:
  """What all iterators of one pipeline share (see `DatasetIterator.__init__`)."""

  def __init__(self):
    self.dataset_options = DatasetOptions()

  def merge(self, other: IteratorContext) -> None:
    self.dataset_options = self.dataset_options.merge(other.dataset_options)


class FilterRatioError(ValueError):
  """Filters dropped too large a share of a window of elements (a ValueError, as Grain raises)."""


class FilterRatioCheck:
  """Warns or raises when filters drop too large a share of the elements (Grain's check).

  Counts kept and dropped elements on consecutive windows of `CHECK_WINDOW`
  elements and judges each window when it is full.
  """

  def __init__(self, stage: str, options: DatasetOptions):
    self._stage = stage
    # As in Grain, 0 and None both disable a check.
    self._warn = options.filter_warn_threshold_ratio or float("inf")
    self._raise = options.filter_raise_threshold_ratio or float("inf")
    self._seen = 0
    self._dropped = 0
    self._last_warning = -float("inf")

  @property
  def enabled(self) -> bool:
    return self._warn <= 1 or self._raise <= 1

  def check(self, kept: bool) -> None:
    """Counts one element; raises ValueError when its window dropped too many."""
    self._seen += 1
    self._dropped += not kept
    if self._seen >= CHECK_WINDOW and self._judge():
      raise self.error()

  def counts(self) -> tuple[int, int]:
    """The open window's (seen, dropped), to go back to with `recount`."""
    return self._seen, self._dropped

  def recount(self, counts: tuple[int, int], n: int, dropped: list[bool] | None) -> None:
    """Goes back to `counts`, then counts a run of `n` again, logging nothing (a read-ahead taken back)."""
    self._seen, self._dropped = counts
    self.first_failure(n, dropped, quiet=True)

  def first_failure(self, n: int, dropped: list[bool] | None = None, *, quiet: bool = False) -> int | None:
    """Counts a run of `n` elements (`dropped[i]`: element i was filtered; None: none was).

    Returns the offset in the run of the element whose check raises (the
    caller hands out the elements before it, consumes it, then raises
    `error()`), or None. Warnings are logged here.
    """
    i = 0
    while i < n:
      # After a failure the window stays open (as Grain's): each element judges it again.
      take = min(n - i, max(1, CHECK_WINDOW - self._seen))
      if dropped is not None:
        self._dropped += sum(dropped[i:i + take])
      self._seen += take
      i += take
      if self._seen >= CHECK_WINDOW:
        if self._judge(quiet):
          return i - 1
        if dropped is None:  # The rest fills windows that drop nothing.
          self._seen = (n - i) % CHECK_WINDOW
          return None
    return None

  def error(self) -> FilterRatioError:
    return FilterRatioError(  # Grain's words, which client code matches.
        f"Transformation {self._stage} skipped {self._last_ratio * 100:.2f} % of the last seen {self._last_seen} "
        f"elements (filter_raise_threshold_ratio={self._raise}). Please check the filtering logic; if this is "
        "intended, pre-filter the data, or pass DatasetOptions(filter_raise_threshold_ratio=None) to "
        "WithOptionsIterDataset.")

  def _judge(self, quiet: bool = False) -> bool:
    """Judges the open window; True if it breaks the raise threshold (warnings are logged here).

    As Grain's check: a window that passes closes; one that fails stays open
    and keeps counting, so the next elements fail too until the share of the
    grown window falls under the threshold.
    """
    ratio = self._dropped / self._seen
    self._last_ratio, self._last_seen = ratio, self._seen
    if ratio >= self._raise:
      return True
    self._seen = self._dropped = 0
    if ratio >= self._warn and not quiet:
      now = time.monotonic()
      if now - self._last_warning >= _WARN_INTERVAL_S:
        self._last_warning = now
        _log.warning("Transformation %s skipped %.2f %% of the last seen %d elements. Please check the "
                     "filtering logic; if this is intended, pre-filter the data, or pass "
                     "DatasetOptions(filter_warn_threshold_ratio=None) to WithOptionsIterDataset.",
                     self._stage, ratio * 100, self._last_seen)
    return False
