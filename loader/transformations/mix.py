"""`MapDataset.mix` / `IterDataset.mix`: datasets interleaved by weight (Grain's).

Selection order. Weights become integer proportions exactly as Grain does
(scaled so the smallest is 100, then truncated), and element `k` of a mixture
comes from the dataset Grain's formula picks: with proportions `p` summing to
`S`, the first `k` elements hold `ceil(k * p_0 / S)` of dataset 0, and the
rest recursively. That order is a deterministic arithmetic rule, not an
implementation accident, so we reproduce it exactly (same elements in the same
order as Grain 0.2.18). It is periodic in `k` with period `S` (the dataset
chosen at `k + S` equals that at `k`, its key is `p_i` higher), so a table of
`S` entries answers a whole vector of indices with three array operations.

`MapDataset.mix` (random access, runs in `mp_prefetch` workers): length
`min(len_i / (p_i / S))`, so within one pass no element repeats; each input
is read in order (element `k` takes key `j` of input `i` only after keys
`0..j-1`), so nothing is skipped or duplicated inside an epoch. Indices past
the length continue the same interleaving, as in Grain: inputs move on to
their next epochs, and `repeat()` of a mixture eventually reads all of the
larger inputs.

`IterDataset.mix` (a stream, runs in the consumer): takes the next element of
the input the formula picks and stops for good as soon as that input is
exhausted, as Grain does. Its state is Grain's
`{"parents": [...] or {name: ...}, "index": k, "stop": bool}`. With inputs
given as a dict, a state resumes under a changed mixture as MaxText expects
(its `grain_train_mixture_config_path`): inputs are restored by name, new
inputs start at their beginning, removed ones are dropped, new weights apply
from the saved `index` on. Each input's state carries that input's own
pipeline description, so an input whose pipeline changed under the same name
is refused. Under `mp_prefetch` the inputs' random-access parts run in the
workers and the mixing in the consumer, so states are exact: unlike Grain
(see MaxText's note on mixture changes), a changed mixture loses no buffered
elements. A Grain-written state resumes exactly where the inputs' order is
Grain's (no shuffle or other seeded operation), and is refused otherwise.
Difference from Grain: an error other than StopIteration does not stop the
mixture (Grain stops it); the input consumed its failed element, as every
loader stage does, and the next call goes on with the mixture.
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from loader import checks
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import state as state_lib
from loader.transformations import select as select_lib
from loader.transforms import DatasetSelectionMap

T = TypeVar("T")

_log = logging.getLogger("loader")
_MAX_TABLE = 1 << 20  # Period table entries; beyond, use the formula per index.


# ---- Weights and the selection rule -------------------------------------------


def _check_weight(w: Any, name: str) -> float:
  if not isinstance(w, numbers.Real) and getattr(w, "shape", None) == () and hasattr(w, "__float__"):
    w = float(w)  # A JAX scalar, or a 0-d array.
  if not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
    # Also the type Grain 0.2.18 fails with on such a weight: it compares it (a string: TypeError),
    # takes int(inf) (OverflowError), or divides by a sum of 0 ([1, -1]: ZeroDivisionError). A zero
    # weight is Grain's plain ValueError.
    if not isinstance(w, numbers.Real):
      error = checks.ArgumentTypeError
    elif math.isinf(w):
      error = checks.WeightOverflowError
    else:
      error = checks.ZeroSizeError if w < 0 else ValueError
    raise error(f"Mixing weights must be positive finite numbers (got {name}={w!r}).")
  return w


def _flatten(datasets: Any, weights: Any, what: str) -> tuple[tuple[str, ...] | None, list[Any], list[Any] | None]:
  """(names or None, datasets, weights or None), dicts in sorted key order as Grain flattens them."""
  if isinstance(datasets, Mapping):
    names = tuple(sorted(datasets))
    flat = [datasets[k] for k in names]
    if isinstance(weights, Mapping):
      if len(weights) != len(names):
        raise checks.WeightsCountError(f"{what}: weights must have the same keys as datasets "
                                       f"(datasets: {list(names)}, weights: {sorted(weights)}).")
      if set(weights) != set(names) and what.startswith("MapDataset"):
        # Grain 0.2.18's MapDataset.mix takes no dict weights at all: nothing to run as Grain runs it.
        raise ValueError(f"{what}: weights must have the same keys as datasets "
                         f"(datasets: {list(names)}, weights: {sorted(weights)}).")
      if set(weights) != set(names):
        # Grain 0.2.18's IterDataset.mix flattens both dicts and pairs them in sorted key order: so here too.
        _log.warning("%s: the weights' keys %s are not the datasets' %s; they are paired in sorted key order, as "
                     "Grain pairs them: %s.", what, sorted(weights), list(names),
                     ", ".join(f"{n}={weights[k]!r}" for n, k in zip(names, sorted(weights))))
      weights = [weights[k] for k in sorted(weights)]
  elif _is_collection(datasets) and not isinstance(datasets, (map_lib.MapDataset, iter_lib.IterDataset)):
    # Any collection, as Grain takes: a list, a tuple, dict.values().
    names, flat = None, list(datasets)
    if isinstance(weights, Mapping):  # Grain flattens it in sorted key order too.
      weights = [weights[k] for k in sorted(weights)]
  else:
    raise TypeError(f"{what} expects a list or a dict of datasets (got {type(datasets).__name__}).")
  if not flat:
    raise ValueError(f"{what} needs at least one dataset.")
  if weights is not None:
    if not _is_collection(weights) and getattr(weights, "ndim", None) == 1 and hasattr(weights, "__array__"):
      weights = np.asarray(weights)  # A JAX array.
    if not _is_collection(weights):
      raise TypeError(f"{what}: weights must be a list, array or dict of numbers, got {weights!r}.")
    weights = weights.tolist() if isinstance(weights, np.ndarray) else list(weights)
    if len(weights) != len(flat):
      raise checks.WeightsCountError(f"{what}: got {len(weights)} weights for {len(flat)} datasets.")
    weights = [_check_weight(w, f"weights[{names[i] if names else i}]") for i, w in enumerate(weights)]
  return names, flat, weights


def _is_collection(x: Any) -> bool:
  """A sized, iterable container of items (not a string): a list, tuple, numpy array or dict view."""
  return isinstance(x, (Sequence, np.ndarray, type({}.values()), type({}.keys()))) and not isinstance(x, (str, bytes))


def int_proportions(weights: Sequence[float] | None, count: int) -> tuple[int, ...]:
  """Grain's integer proportions: weights scaled so the smallest is 100, truncated."""
  if weights is None:
    return (1,) * count
  scale = 100 / min(weights)  # The same float operations as Grain, for the same result.
  return tuple(int(w * scale) for w in weights)


def _select_formula(k: int, proportions: Sequence[int]) -> tuple[int, int]:
  # Dataset i is next at k if its count among the first k+1 elements exceeds
  # its count among the first k; otherwise recurse on the other datasets.
  remaining = sum(proportions)
  curr_k, curr_k1 = k, k + 1
  for i, p in enumerate(proportions):
    next_k = curr_k * (remaining - p) // remaining
    next_k1 = curr_k1 * (remaining - p) // remaining
    if curr_k - next_k != curr_k1 - next_k1:
      return i, curr_k1 - next_k1 - 1
    remaining -= p
    curr_k, curr_k1 = next_k, next_k1
  raise AssertionError(f"No dataset selected for index {k} with proportions {proportions}.")


def _select_formula_many(ks: np.ndarray, proportions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
  """`_select_formula` for a vector of indices (int64, or Python ints in an object array)."""
  dataset_indices = np.zeros(len(ks), np.int64)
  keys = np.zeros(len(ks), ks.dtype)
  pending = np.arange(len(ks))
  remaining = sum(proportions)
  curr_k, curr_k1 = ks, ks + 1
  for i, p in enumerate(proportions):
    next_k = curr_k * (remaining - p) // remaining
    next_k1 = curr_k1 * (remaining - p) // remaining
    hit = (curr_k - next_k) != (curr_k1 - next_k1)
    dataset_indices[pending[hit]] = i
    keys[pending[hit]] = (curr_k1 - next_k1 - 1)[hit]
    miss = ~hit
    pending, curr_k, curr_k1 = pending[miss], next_k[miss], next_k1[miss]
    remaining -= p
  return dataset_indices, keys.astype(np.int64)


class _ProportionalSelector:
  """Vectorised `_select_formula`, through a table of one period when it is small."""

  def __init__(self, proportions: Sequence[int]):
    self.proportions = tuple(int(p) for p in proportions)
    self._period = sum(self.proportions)
    self._table: tuple[np.ndarray, np.ndarray] | None = None
    if self._period <= _MAX_TABLE:
      self._table = _select_formula_many(np.arange(self._period, dtype=np.int64), self.proportions)
      self._steps = np.array(self.proportions, np.int64)

  def one(self, k: int) -> tuple[int, int]:
    if self._table is None:
      return _select_formula(k, self.proportions)
    q, r = divmod(k, self._period)
    d = int(self._table[0][r])
    return d, q * self.proportions[d] + int(self._table[1][r])

  def many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Python ints past int64 come from a slice of an infinite dataset (map_dataset.divmod_index).
    indices = np.asarray(indices, dtype=object if np.asarray(indices).dtype == object else np.int64)
    if self._table is None:
      # Products k * S may overflow int64: compute with Python ints.
      return _select_formula_many(indices.astype(object), self.proportions)
    if indices.dtype == object:  # np.divmod has no loop for Python ints.
      q = indices // self._period
      r = np.asarray(indices - q * self._period, dtype=np.int64)
    else:
      q, r = np.divmod(indices, self._period)
    d = self._table[0][r]
    return d, q * self._steps[d] + self._table[1][r]

  def __getstate__(self):
    return {"proportions": self.proportions}  # The table is rebuilt, not pickled.

  def __setstate__(self, state):
    self.__init__(state["proportions"])


# ---- MapDataset.mix -------------------------------------------------------------


class SelectionWithProportionsMap(DatasetSelectionMap):
  """Grain's selection map of a weighted mixture; its length keeps every element to at most one use."""

  def __init__(self, parents: Sequence[map_lib.MapDataset], proportions: Sequence[float] | None = None):
    if proportions is not None:
      proportions = [_check_weight(w, f"proportions[{i}]") for i, w in enumerate(proportions)]
      if len(proportions) != len(parents):
        raise ValueError(f"Got {len(proportions)} proportions for {len(parents)} datasets.")
    self._selector = _ProportionalSelector(int_proportions(proportions, len(parents)))
    total = sum(self.proportions)
    empty = [f"index {i} ({p!r})" for i, p in enumerate(parents) if len(p) == 0]
    if empty:
      raise ValueError(f"All datasets must have positive length for mixing, but dataset(s) at "
                       f"{', '.join(empty)} have length 0.")
    # Grain's float arithmetic, so lengths agree with Grain's to the element.
    lengths = [len(p) / (w / total) for p, w in zip(parents, self.proportions)]
    self._length = min(sys.maxsize, int(min(lengths)))

  @property
  def proportions(self) -> tuple[int, ...]:
    return self._selector.proportions

  def __len__(self) -> int:
    return self._length

  def __getitem__(self, index: int) -> tuple[int, int]:
    return self._selector.one(int(index))

  def select_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return self._selector.many(indices)

  def __repr__(self) -> str:
    return f"SelectionWithProportionsMap(proportions={self.proportions}, length={self._length})"


class MixedMapDataset(select_lib.SelectMapDataset[T]):
  """Grain's `MixedMapDataset`: a random-access mixture of MapDatasets.

  Args:
    parents: The datasets to mix.
    proportions: Weights, uniform if None. Not with `selection_map`.
    selection_map: A `DatasetSelectionMap` deciding the mixture instead.
  """

  def __init__(self, parents: Sequence[map_lib.MapDataset[T]], proportions: Sequence[float] | None = None,
               selection_map: Any = None):
    if proportions is not None and selection_map is not None:
      raise ValueError("Cannot set both proportions and selection_map.")
    parents = select_lib.check_datasets(parents, "MapDataset.mix")
    if selection_map is None:
      selection_map = SelectionWithProportionsMap(parents, proportions)
    super().__init__(parents, selection_map)

  def _op_repr(self) -> str:
    if isinstance(self._selection_map, SelectionWithProportionsMap):
      return f".mix(proportions={list(self._selection_map.proportions)})"
    return super()._op_repr()


def mix_map_datasets(datasets: Any, weights: Any = None) -> MixedMapDataset:
  """`MapDataset.mix(datasets, weights)`: list or dict (sorted by key) of datasets."""
  names, flat, flat_weights = _flatten(datasets, weights, "MapDataset.mix")
  del names  # The order is the sorted key order; names play no further role.
  return MixedMapDataset(flat, flat_weights)


# ---- IterDataset.mix ------------------------------------------------------------


class MixedIterDataset(iter_lib.IterDataset[T]):
  """Grain's `MixedIterDataset`: streams mixed by weight, stopping at the first exhausted one.

  Args:
    parents: A list of datasets, or a dict name -> dataset (a state then
      resumes under a changed mixture, see the module docstring).
    proportions: Weights as a list, or a dict with the same keys; uniform if None.
  """

  _same_as_grain = True
  _spec_rule = "parent"
  # The mixture may change between checkpoint and resume: the pipeline
  # description leaves the inputs out and each input's state is checked alone.
  _state_hides_inputs = True

  def __init__(self, parents: Any, proportions: Any = None):
    names, flat, weights = _flatten(parents, proportions, "IterDataset.mix")
    for i, p in enumerate(flat):
      if not isinstance(p, (iter_lib.IterDataset, map_lib.MapDataset)):
        raise TypeError(f"IterDataset.mix: dataset {names[i] if names else i} is a {type(p).__name__}, "
                        "not an IterDataset or MapDataset.")
    super().__init__(tuple(p.to_iter_dataset() if isinstance(p, map_lib.MapDataset) else p for p in flat))
    self._names = names
    self._proportions = int_proportions(weights, len(flat))

  def _op_repr(self) -> str:
    if self._names is None:
      return f".mix(proportions={list(self._proportions)})"
    return f".mix(proportions={dict(zip(self._names, self._proportions))})"

  def _state_op(self) -> str:
    # Stable under changed weights and inputs (dict form), which resume.
    return "mix(by name)" if self._names is not None else "mix(by position)"

  def __repr__(self) -> str:
    inputs = ", ".join(repr(p) for p in self._parents)
    return f"IterDataset[{inputs}]{self._op_repr()}"

  def __iter__(self) -> iter_lib.DatasetIterator[T]:
    descriptions = [state_lib.describe(p) for p in self._parents]
    return _MixedDatasetIterator([iter(p) for p in self._parents], self._names, self._proportions, descriptions)


class _MixedDatasetIterator(iter_lib.DatasetIterator[T]):
  """Draws from the input the formula picks for `index`; stops at the first exhausted input."""

  _grain_state_keys = ("parents", "index", "stop")  # Grain's layout: its states restore here.

  def __init__(self, parents: list[iter_lib.DatasetIterator], names: tuple[str, ...] | None,
               proportions: Sequence[int], descriptions: list[list[str]]):
    super().__init__(parents)
    self._names = names
    # Each input's state carries its pipeline description: the mixture's own
    # description leaves the inputs out, since they may change on resume.
    self._descriptions = descriptions
    self._selector = _ProportionalSelector(proportions)
    self._index = 0
    self._stop = False
    # Inputs missing from a restored state start over from here.
    self._start_states = [p.get_state() for p in parents]

  def __next__(self) -> T:
    if self._stop:
      raise StopIteration  # For good, even if other inputs have elements left (Grain).
    i, _ = self._selector.one(self._index)
    try:
      x = next(self._parents[i])
    except StopIteration:
      self._stop = True
      self._index += 1
      raise
    self._index += 1
    return x

  def _label(self, i: int) -> str:
    return repr(self._names[i]) if self._names is not None else str(i)

  def get_state(self) -> dict[str, Any]:
    states = [state_lib.stamp(p.get_state(), d) for p, d in zip(self._parents, self._descriptions)]
    parents = list(states) if self._names is None else dict(zip(self._names, states))
    return {"parents": parents, "index": self._index, "stop": self._stop}

  def set_state(self, state: dict[str, Any]) -> None:
    owner = type(self).__name__
    state_lib.check_keys(state, ("parents", "index", "stop"), owner)
    index = checks.check_int(state["index"], "index", minimum=0)
    stop = state["stop"]
    if not isinstance(stop, (bool, np.bool_, int)):
      raise ValueError(f"{owner}.set_state: stop must be a bool (got stop={stop!r}).")
    saved = state["parents"]
    if self._names is None:
      if not isinstance(saved, list) or len(saved) != len(self._parents):
        got = f"{len(saved)} inputs" if isinstance(saved, list) else f"{type(saved).__name__} {saved!r:.100}"
        raise state_lib.StateMismatchError(
            f"{owner}.set_state: the state is for {got}, this mixture has {len(self._parents)}; "
            "to add or remove inputs on resume, give IterDataset.mix a dict of named datasets.")
      targets = list(zip(range(len(self._parents)), saved))
    else:
      if not isinstance(saved, dict):
        raise state_lib.StateMismatchError(
            f"{owner}.set_state: this mixture names its inputs {list(self._names)} but the state's inputs "
            f"are a {type(saved).__name__}; it was saved from a mixture of a list of datasets.")
      targets = [(i, saved.get(name)) for i, name in enumerate(self._names)]
    for i, s in targets:
      p = self._parents[i]
      if s is None:  # An input added since the checkpoint: from its beginning.
        p.set_state(self._start_states[i])
        continue
      if state_lib.is_stamped(s):
        state_lib.check(s, self._descriptions[i], f"IterDataset.mix input {self._label(i)}")
      p.set_state(state_lib.strip(s))
    self._index, self._stop = index, bool(stop)


def mix_iter_datasets(datasets: Any, weights: Any = None) -> MixedIterDataset:
  """`IterDataset.mix(datasets, weights)`: list or dict (sorted by key) of datasets."""
  return MixedIterDataset(datasets, weights)
