"""`ElasticIterator`: batches for one shard, resumable with another sharding (Grain's).

Shard `i` of `n` reads global positions `g + i, g + i + n, ...` in host
batches of `global_batch_size / n`, where `g` (`global_next_index`, the whole
state) counts the elements all shards together have consumed. Every shard
therefore writes the same state after the same number of steps, and that
state resumes under any shard count or global batch size.

Our version keeps one pipeline per offset `g % global_batch_size` (in practice
one) and moves it with `set_state`, instead of rebuilding it at every restore;
with `multiprocessing_options` the worker processes survive restores, and the
stream never depends on the worker count.
"""

from __future__ import annotations

import functools
from typing import Any

from loader import checks
from loader import dataset_iterator
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import options as options_lib
from loader import state as state_lib

_STATE_KEY = "global_next_index"  # Grain's key: its states restore here.


def _check_no_dropping_ops(ds: map_lib.MapDataset) -> None:
  to_check = [ds]
  while to_check:
    node = to_check.pop()
    if isinstance(node, map_lib.FilterMapDataset):
      raise ValueError("ElasticIterator does not support `filter` transformation.")
    to_check.extend(node.parents)
  if ds._may_contain_none:  # pylint: disable=protected-access
    raise ValueError(f"ElasticIterator needs every position to hold an element (no filter or flat_map): {ds!r}")


class ElasticIterator(iter_lib.IterDataset):
  """Iterator whose checkpoint survives changes of shard count and batch size.

  `ds` must be unbatched and unsharded: this iterator shards and batches it.
  Usable as a dataset (`iter()` returns the same one iterator, as in Grain)
  or directly as an iterator (`next`, `get_state`, `set_state`, `close`).

  Args:
    ds: The MapDataset to read (no `filter`: positions must be elements).
    global_batch_size: Elements per step over all shards; a multiple of
      `shard_options.shard_count`.
    shard_options: This process's `shard_index` and the `shard_count`
      (`loader.sharding.ShardOptions` or Grain's).
    read_options: How this process computes elements (threads, chunks).
    multiprocessing_options: If given, elements are computed in that many
      worker processes (`mp_prefetch`).
  """

  def __init__(self, ds: map_lib.MapDataset, global_batch_size: int, shard_options: Any, *,
               read_options: options_lib.ReadOptions | None = None,
               multiprocessing_options: options_lib.MultiprocessingOptions | None = None):
    super().__init__()
    if not isinstance(ds, map_lib.MapDataset):
      raise TypeError(f"ElasticIterator needs a MapDataset (got {type(ds).__name__}); "
                      "IterDatasets cannot be re-sharded by position.")
    _check_no_dropping_ops(ds)
    self._global_batch_size = checks.check_int(global_batch_size, "global_batch_size", minimum=1)
    shard_count = checks.check_int(getattr(shard_options, "shard_count", None), "shard_options.shard_count", minimum=1)
    shard_index = checks.check_int(getattr(shard_options, "shard_index", None), "shard_options.shard_index",
                                   minimum=0, maximum=shard_count - 1)
    if self._global_batch_size % shard_count:
      raise ValueError(f"Global batch size {self._global_batch_size} is not divisible by shard count {shard_count}.")
    self._shard_index, self._shard_count = shard_index, shard_count
    self._shard_options = shard_options
    self._read_options = read_options
    self._multiprocessing_options = multiprocessing_options
    self._ds = ds

  def _state_op(self) -> str:
    # Sharding and batch size are left out on purpose: a state must restore
    # under other values of both.
    return f"elastic({' -> '.join(state_lib.describe(self._ds))})"

  def _op_repr(self) -> str:
    return (f"ElasticIterator({self._ds!r}, global_batch_size={self._global_batch_size}, "
            f"shard={self._shard_index}/{self._shard_count})")

  def __repr__(self) -> str:
    return self._op_repr()

  @property
  def _same_as_grain(self) -> bool:
    return state_lib.same_as_grain(self._ds)

  @functools.cached_property
  def _default_iterator(self) -> _ElasticDatasetIterator:
    # Stamped here, not only by __iter__: get_state/set_state may come first.
    return dataset_iterator.stamp_iterator(_ElasticDatasetIterator(self), self)

  def __iter__(self) -> iter_lib.DatasetIterator:
    return self._default_iterator

  def __next__(self) -> Any:
    return next(self._default_iterator)

  def get_state(self) -> dict[str, Any]:
    return self._default_iterator.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._default_iterator.set_state(state)

  def close(self) -> None:
    if "_default_iterator" in self.__dict__:
      self._default_iterator.close()

  def _host_pipeline(self, offset: int) -> tuple[iter_lib.IterDataset, int]:
    """Host batches from global position `offset` (< global_batch_size), and their count."""
    host_batch_size = self._global_batch_size // self._shard_count
    ds = self._ds.slice(slice(offset + self._shard_index, None, self._shard_count))
    batches = ds.batch(host_batch_size, drop_remainder=True)
    it_ds = batches.to_iter_dataset(self._read_options)
    if self._multiprocessing_options is not None:
      it_ds = it_ds.mp_prefetch(self._multiprocessing_options)
    return it_ds, len(batches)


class _ElasticDatasetIterator(iter_lib.DatasetIterator):
  """State: `{"global_next_index": g}`, as in Grain."""

  _grain_state_keys = (_STATE_KEY,)  # Grain's layout: its states restore here.

  def __init__(self, elastic: ElasticIterator):
    super().__init__()
    self._elastic = elastic
    self._global_next_index = 0
    self._offset: int | None = None
    self._inner: iter_lib.DatasetIterator | None = None
    self._inner_len = 0
    self._positioned = False  # Whether the inner iterator is at `_global_next_index`.

  def _position_inner(self) -> iter_lib.DatasetIterator:
    gbs = self._elastic._global_batch_size  # pylint: disable=protected-access
    offset, batches = self._global_next_index % gbs, self._global_next_index // gbs
    if self._inner is None or self._offset != offset:
      if self._inner is not None:
        self._inner.close()
      # Position g + i + j*n equals position offset + i + (batches*hbs + j)*n:
      # the pipeline for `offset`, `batches` host batches in.
      it_ds, self._inner_len = self._elastic._host_pipeline(offset)  # pylint: disable=protected-access
      self._inner, self._offset = iter(it_ds), offset
    # The inner state is {"next_index": host batches read}; it is our own
    # position, not a checkpoint, so it goes unstamped and unchecked.
    with dataset_iterator.parent_calls():
      state = self._inner.get_state()
      state["next_index"] = min(batches, self._inner_len)
      self._inner.set_state(state)
    self._positioned = True
    return self._inner

  def __next__(self) -> Any:
    inner = self._inner if self._positioned else self._position_inner()
    x = next(inner)
    self._global_next_index += self._elastic._global_batch_size  # pylint: disable=protected-access
    return x

  def get_state(self) -> dict[str, Any]:
    return {_STATE_KEY: self._global_next_index}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, (_STATE_KEY,), type(self).__name__)
    self._global_next_index = checks.check_int(state[_STATE_KEY], _STATE_KEY, minimum=0)
    self._positioned = False  # Moved lazily, at the next element.

  def close(self) -> None:
    if self._inner is not None:
      self._inner.close()
    super().close()
