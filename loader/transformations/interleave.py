"""`InterleaveIterDataset`: round robin over up to `cycle_length` open datasets (Grain's).

Order, exactly Grain's: slots `0..cycle_length-1` are visited in turn; an
empty slot opens the next dataset of the sequence and reads from it at once;
an exhausted dataset leaves its slot empty (the turn passes to the next
slot) until the cycle comes back to it. With `cycle_length=1` the datasets
are chained; with `cycle_length >= len(datasets)` they alternate.

It runs in the consuming process: the stream (and any `mp_prefetch` after it)
never depends on the worker count. Like Grain, each open stream (e.g. a file
reader) gets a background thread reading `iter_buffer_size` elements ahead
(0: none), which overlaps the file reads of the open datasets; a `MapDataset`
(or its plain `to_iter_dataset()`) is read in chunks with its own read
options instead. Under `mp_prefetch` the inputs are still read here, in the
consumer: a worker pool per opened dataset would cost more than it saves. Datasets are opened in the consumer
when their turn comes: `num_make_iter_threads` and `make_iter_buffer_size`
are accepted for Grain compatibility and not used (opening a loader dataset
reads nothing).

State (Grain's keys, minus the elastic-only `future_states`):
`{"next_index_in_cycle", "next_index_in_datasets", "iterators_in_use_indices",
"iterators_in_use_states", "exhausted"}`. The first `get_state` or `next`
opens the first `cycle_length` datasets, as Grain's `get_state` does, so the
state has the same shape at every step. A filtered-out (None) entry of a
`MapDataset` of datasets counts as an empty dataset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import dataset_iterator
from loader import element_spec
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import state as state_lib

T = TypeVar("T")

_STATE_KEYS = ("next_index_in_cycle", "next_index_in_datasets", "iterators_in_use_indices",
               "iterators_in_use_states", "exhausted")



class NotADatasetError(TypeError, AssertionError):
  """An element of the datasets' MapDataset that is no dataset: a TypeError, and the AssertionError Grain raises."""

class InterleaveIterDataset(iter_lib.IterDataset[T]):
  """Interleaves `datasets`, at most `cycle_length` of them open at a time.

  Args:
    datasets: A list of IterDatasets/MapDatasets, or a MapDataset whose
      elements are datasets (e.g. `MapDataset.source(files).map(open_file)`).
    cycle_length: Datasets read concurrently, a positive integer.
    num_make_iter_threads: Accepted for Grain compatibility; unused.
    make_iter_buffer_size: Accepted for Grain compatibility; unused.
    iter_buffer_size: Elements each open IterDataset reads ahead in a thread.
  """

  # Grain's lists no parents, so a seed() under it reaches no random op above it; here the inputs stay
  # parents (options, descriptions and file checks walk them) and only seeds stop at it.
  _hides_parent_seeds = True

  def __init__(self, datasets: Sequence[Any] | map_lib.MapDataset, *, cycle_length: int,
               num_make_iter_threads: int = 1, make_iter_buffer_size: int = 1, iter_buffer_size: int = 1):
    if isinstance(datasets, map_lib.MapDataset):
      # Its elements are made lazily, one per opened slot: not a parent stream.
      super().__init__()
      self._datasets: map_lib.MapDataset | None = datasets
    elif isinstance(datasets, Sequence) and not isinstance(datasets, (str, bytes)):
      for i, ds in enumerate(datasets):
        if not isinstance(ds, (iter_lib.IterDataset, map_lib.MapDataset)):
          raise TypeError(f"InterleaveIterDataset: datasets[{i}] is a {type(ds).__name__}, "
                          "not an IterDataset or MapDataset.")
      super().__init__(tuple(datasets))
      self._datasets = None
    else:
      raise TypeError(f"InterleaveIterDataset expects a list of datasets or a MapDataset of datasets "
                      f"(got {type(datasets).__name__}).")
    if not checks.is_int(cycle_length):
      raise TypeError(f"cycle_length must be a positive integer (got {cycle_length!r}); "
                      "autotuned cycle lengths are not supported.")
    self._cycle_length = checks.check_int(cycle_length, "cycle_length", minimum=1, range_error=checks.EmptyCycleError)
    checks.check_int(num_make_iter_threads, "num_make_iter_threads", minimum=0)
    checks.check_int(make_iter_buffer_size, "make_iter_buffer_size", minimum=0)
    self._iter_buffer_size = checks.check_int(iter_buffer_size, "iter_buffer_size", minimum=0)

  def _num_datasets(self) -> int:
    return len(self._datasets) if self._datasets is not None else len(self._parents)

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Keeps only `datasets[sl]` (Grain's hook for slicing work between processes)."""
    del sequential_slice
    if self._datasets is not None:
      self._datasets = self._datasets[sl]
    else:
      self._parents = tuple(self._parents[sl])

  @property
  def _element_spec(self) -> Any:
    # As Grain: the first input's (interleaved inputs are assumed alike).
    first = self._datasets[0] if self._datasets is not None else self._parents[0]
    return element_spec.get_element_spec(first)

  def _op_repr(self) -> str:
    return f".interleave(cycle_length={self._cycle_length})"

  def __repr__(self) -> str:
    inputs = repr(self._datasets) if self._datasets is not None else ", ".join(repr(p) for p in self._parents)
    return f"InterleaveIterDataset([{inputs}]){self._op_repr()}"

  @property
  def _same_as_grain(self) -> bool:
    # A MapDataset of datasets makes its inputs out of sight of the state
    # checks (they may shuffle): refuse Grain-written states for it.
    return self._datasets is None

  def _state_op(self) -> str:
    if self._datasets is None:
      return self._op_repr().lstrip(".")
    # The op text is clipped in descriptions: a digest keeps long inputs apart.
    inputs = " ".join(state_lib.describe(self._datasets))
    digest = hashlib.sha1(inputs.encode()).hexdigest()[:10]
    return f"interleave(cycle_length={self._cycle_length}, datasets#{digest}: {inputs})"

  def _open(self, index: int) -> iter_lib.DatasetIterator | None:
    """A fresh iterator over dataset `index` (None for a filtered-out entry)."""
    if self._datasets is not None:
      ds = self._datasets._getitems(np.array([index], dtype=np.int64))[0]  # pylint: disable=protected-access
      if ds is None:
        return None
    else:
      ds = self._parents[index]
    if isinstance(ds, map_lib.MapDataset):
      return iter(ds.to_iter_dataset())
    if not isinstance(ds, iter_lib.IterDataset):
      raise NotADatasetError(f"InterleaveIterDataset: dataset {index} is a {type(ds).__name__}, "
                             "not an IterDataset or MapDataset.")
    # A MapDataset part already reads in chunks (with its ReadOptions threads);
    # a thread per element would only add a hand-off (~25x slower in-memory).
    if self._iter_buffer_size and not isinstance(ds, iter_lib.MapBackedIterDataset):
      ds = ds.prefetch(self._iter_buffer_size)
    return iter(ds)

  def __iter__(self) -> iter_lib.DatasetIterator[T]:
    return _InterleaveDatasetIterator(self)


class _InterleaveDatasetIterator(iter_lib.DatasetIterator[T]):

  # Grain's layout: its states restore here (with no elastic future states).
  _grain_state_keys = _STATE_KEYS + ("future_states",)

  def __init__(self, ds: InterleaveIterDataset):
    super().__init__()
    self._ds = ds
    self._num_datasets = ds._num_datasets()  # pylint: disable=protected-access
    self._cycle = min(ds._cycle_length, self._num_datasets)  # pylint: disable=protected-access
    self._iterators: list[iter_lib.DatasetIterator | None] = [None] * self._cycle
    self._indices = list(range(self._cycle))
    self._exhausted_states: list[Any] = [None] * self._cycle
    self._next_in_cycle = 0
    self._next_in_datasets = 0
    self._started = False

  def _open_into(self, slot: int) -> None:
    index = self._next_in_datasets
    self._next_in_datasets += 1
    self._indices[slot] = index
    it = self._ds._open(index)  # pylint: disable=protected-access
    if it is None:
      self._exhausted_states[slot] = {}
      self._iterators[slot] = None
    else:
      it._ctx.merge(self._ctx)  # pylint: disable=protected-access  # Options set around the interleave reach its inputs, as in Grain.
      self._exhausted_states[slot] = None
      self._iterators[slot] = it

  def _start(self) -> None:
    # Opening the first slots up front gives the order of opening them on
    # demand (slot order) and a state of the same shape at every step.
    if not self._started:
      self._started = True
      for slot in range(self._cycle):
        self._open_into(slot)

  def _get_next_index(self) -> int:
    if self._num_datasets != 1:  # As Grain: a position only for a single input.
      return super()._get_next_index()
    it = self._iterators[0]
    return 0 if it is None else dataset_iterator.get_next_index(it)

  def _set_next_index(self, index: int) -> None:
    if self._num_datasets != 1:
      super()._set_next_index(index)
      return
    self._start()
    if self._iterators[0] is None:  # Its input ended: open it again to move it.
      self._next_in_datasets = 0
      self._open_into(0)
    dataset_iterator.set_next_index(self._iterators[0], index)

  def _retire(self, slot: int) -> None:
    it = self._iterators[slot]
    self._exhausted_states[slot] = state_lib.strip(it.get_state())
    it.close()
    self._iterators[slot] = None

  def __next__(self) -> T:
    self._assert_not_closed()
    self._start()
    while self._cycle:
      slot = self._next_in_cycle
      it = self._iterators[slot]
      if it is not None:
        try:
          x = next(it)
        except StopIteration:
          self._retire(slot)
          self._next_in_cycle = (slot + 1) % self._cycle
          continue
        self._next_in_cycle = (slot + 1) % self._cycle
        return x
      if self._next_in_datasets < self._num_datasets:
        self._open_into(slot)  # And read from it on the next pass of the loop.
      elif all(it is None for it in self._iterators):
        break
      else:
        self._next_in_cycle = (slot + 1) % self._cycle
    raise StopIteration

  def get_state(self) -> dict[str, Any]:
    self._start()
    # strip: an input's state taken in a prefetch thread carries its own description.
    states = [state_lib.strip(it.get_state()) if it is not None else self._exhausted_states[i]
              for i, it in enumerate(self._iterators)]
    return {
        "next_index_in_cycle": self._next_in_cycle,
        "next_index_in_datasets": self._next_in_datasets,
        "iterators_in_use_indices": list(self._indices),
        "iterators_in_use_states": states,
        "exhausted": [int(it is None) for it in self._iterators],
    }

  def set_state(self, state: dict[str, Any]) -> None:
    owner = type(self).__name__
    if isinstance(state, dict) and "future_states" in state:  # Written by Grain.
      if state["future_states"]:
        raise state_lib.StateMismatchError(
            f"{owner}.set_state: the state holds ElasticIterator future states "
            f"({state['future_states']!r:.100}); restore it with the ElasticIterator that wrote it.")
      state = {k: v for k, v in state.items() if k != "future_states"}
    state_lib.check_keys(state, _STATE_KEYS, owner)
    cycle, n = self._cycle, self._num_datasets
    indices, states, exhausted = (state[k] for k in _STATE_KEYS[2:])
    if not all(isinstance(v, list) and len(v) == cycle for v in (indices, states, exhausted)):
      raise state_lib.StateMismatchError(
          f"{owner}.set_state: expected {cycle} slots (cycle_length for {n} datasets) in {state!r:.300}; "
          "was it saved with another cycle_length or dataset count?")
    next_in_cycle = checks.check_int(state["next_index_in_cycle"], "next_index_in_cycle", minimum=0,
                                     maximum=max(cycle - 1, 0))
    next_in_datasets = checks.check_int(state["next_index_in_datasets"], "next_index_in_datasets", minimum=0,
                                        maximum=n)
    self._started = True
    for slot, (index, s, done) in enumerate(zip(indices, states, exhausted)):
      index = checks.check_int(index, "iterators_in_use_indices[]", minimum=0, maximum=max(n - 1, 0))
      it = self._iterators[slot]
      if done:
        if it is not None:
          it.close()
        self._iterators[slot], self._exhausted_states[slot] = None, s
      else:
        if it is None or self._indices[slot] != index:
          if it is not None:
            it.close()
          it = self._ds._open(index)  # pylint: disable=protected-access
          if it is None:
            raise state_lib.StateMismatchError(
                f"{owner}.set_state: dataset {index} is filtered out here but was open in the saved state.")
        it.set_state(s)
        self._iterators[slot], self._exhausted_states[slot] = it, None
      self._indices[slot] = index
    self._next_in_cycle, self._next_in_datasets = next_in_cycle, next_in_datasets

  def start_prefetch(self) -> None:
    self._start()
    for it in self._iterators:
      if it is not None:
        it.start_prefetch()

  def close(self) -> None:
    if not self._closed:
      for it in self._iterators:
        if it is not None:
          it.close()
    super().close()
