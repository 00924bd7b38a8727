"""`MapDataset`: a random-access dataset, transformed lazily and in batches.

Every node answers `_getitems(indices)` for a whole numpy vector of indices in
one call: the source turns it into one batched read per file, `shuffle`
permutes the vector with a few array operations, `batch` gathers the elements of
many batches with a single call to its parent. Iterators pull chunks of
hundreds of indices at a time, so per-element Python overhead stays small.

Epochs: internally every node accepts indices >= len(node). Index `i` means
epoch `i // len` and position `i % len`, and nodes pass `epoch * len(parent) +
position'` up, so `shuffle(seed=...).repeat(3)` draws a new permutation per
epoch and `random_map` sees distinct indices in every epoch. User-facing
`ds[i]` is bounds-checked (except on an infinite `repeat()`).
"""

from __future__ import annotations

import abc
import functools
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from loader import batching
from loader import checks
from loader import element_spec
from loader import grain_interop
from loader import permutation
from loader import source as source_lib
from loader import stats as stats_lib

if TYPE_CHECKING:
  from loader import iter_dataset
  from loader import options as options_lib

T = TypeVar("T")
S = TypeVar("S")

class _MapDatasetMeta(abc.ABCMeta):
  """Grain's constructors: on the class (`MapDataset.source(...)`), not on instances.

  As in Grain, whose MapDatasetMeta holds them: client code tells a dataset
  from a data source with `hasattr(x, "source")` and the like.
  """

  def source(cls, source: Any) -> MapDataset:
    """A dataset over a random-access source (`__len__` + `__getitem__`).

    Accepts `ArrayRecordSource`, Grain data sources, `tfds.data_source(...)`,
    Python sequences, or any object with that protocol. Batched reads use the
    source's `read`/`__getitems__` when it has one.
    """
    if isinstance(source, MapDataset):
      return source
    return SourceMapDataset(source)

  def range(cls, start: int, stop: int | None = None, step: int = 1) -> MapDataset[int]:
    """A dataset of integers, like Python's `range`."""
    return SourceMapDataset(range(start, stop, step) if stop is not None else range(start))

  def mix(cls, datasets: Any, weights: Any = None) -> MapDataset:
    """Interleaves datasets by weight, exactly as Grain (see loader.transformations.mix)."""
    # Lazy: transformations import map_dataset.
    from loader.transformations import mix  # pylint: disable=g-import-not-at-top

    return mix.mix_map_datasets(datasets, weights)

  def concatenate(cls, datasets: Sequence[MapDataset]) -> MapDataset:
    """The datasets one after another, epoch by epoch (see loader.transformations.concatenate)."""
    # Lazy: transformations import map_dataset.
    from loader.transformations import concatenate  # pylint: disable=g-import-not-at-top

    return concatenate.concatenate(datasets)

  def select_from_datasets(cls, datasets: Sequence[MapDataset], selection_map: Any) -> MapDataset:
    """Element i is datasets[d][k] for (d, k) = selection_map[i] (see loader.transformations.select)."""
    # Lazy: transformations import map_dataset.
    from loader.transformations import select  # pylint: disable=g-import-not-at-top

    if selection_map is None:  # Grain then mixes the datasets in equal proportions.
      return cls.mix(datasets)
    return select.select_from_datasets(datasets, selection_map)


class MapDataset(grain_interop.MapDataset, Generic[T], metaclass=_MapDatasetMeta):
  """A dataset with a length and random access, like Grain's `MapDataset`.

  Build one from a data source and chain transformations::

    ds = (MapDataset.source(ArrayRecordSource(files))
          .shuffle(seed=42)
          .map(parse)
          .batch(256))
    for batch in ds.to_iter_dataset():
      ...

  Each element is a pure function of its index (given the seeds), which is
  what makes iteration reproducible for any number of workers.
  """

  # Grain subclasses record execution statistics through it (a no-op here).
  _stats = stats_lib.NO_STATS
  # How this stage's element spec follows from its parents' (see loader.element_spec).
  _spec_rule: str | None = None
  # A user function Grain runs on the iterator, once per element and in order
  # (folded here from after to_iter_dataset(), or a DataLoader operation; see in_order).
  _in_order = False
  _element_spec = element_spec.spec_property

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    fn = cls.__dict__.get("_getitems")
    if fn is not None and cls.__module__.startswith("loader."):
      # Ours take int64 arrays; Grain's private `_getitems`, which its tests
      # and some subclasses call, takes any sequence of ints.
      @functools.wraps(fn)
      def _getitems(self, indices, _fn=fn):
        if type(indices) is not np.ndarray:  # pylint: disable=unidiomatic-typecheck
          indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        return _fn(self, indices)

      cls._getitems = _getitems

  def __init__(self, parents: MapDataset | Sequence[MapDataset] = ()):
    if isinstance(parents, MapDataset):
      parents = (parents,)
    self._parents = tuple(parents)

  # ---- Structure ----------------------------------------------------------

  @property
  def parents(self) -> tuple[MapDataset, ...]:
    return self._parents

  @property
  def _parent(self) -> MapDataset:
    return self._parents[0]

  @abc.abstractmethod
  def __len__(self) -> int:
    """Number of elements (sys.maxsize for an infinite `repeat()`)."""

  def _op_repr(self) -> str:
    return f".{type(self).__name__}()"

  def __repr__(self) -> str:
    prefix = repr(self._parent) if self._parents else "MapDataset"
    return prefix + self._op_repr()

  @property
  def _records_per_element(self) -> int:
    # How many source records one element costs; sizes iteration chunks.
    return self._parent._records_per_element if self._parents else 1

  @property
  def _may_contain_none(self) -> bool:
    return any(p._may_contain_none for p in self._parents)

  @property
  def _may_yield_none(self) -> bool:
    """Whether an element may be None: a hole (filter), or a value user code returned.

    Grain's to_iter_dataset() drops None elements, so an iterator-level batch
    after it is folded into the random-access part only where no element can
    be None (random_map and map_with_index are folded where no filter leaves
    holes; see README). Subclasses defined outside loader may return None
    from __getitem__.
    """
    if self._may_contain_none or not type(self).__module__.startswith("loader."):
      return True
    return any(p._may_yield_none for p in self._parents)

  @property
  def _default_seed(self) -> int | None:
    return self._parent._default_seed if self._parents else None

  # ---- Element access -----------------------------------------------------

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    """Elements at `indices` (int64, possibly >= len: other epochs).

    Subclasses override this. A subclass written against Grain's API that only
    defines `__getitem__` is served one index at a time.
    """
    if type(self).__getitem__ is MapDataset.__getitem__:
      raise NotImplementedError(f"{type(self).__name__} must implement _getitems or __getitem__.")
    return [self[int(i)] for i in indices]

  def _getitems_array(self, indices: np.ndarray) -> np.ndarray | None:
    """Elements at `indices` as a 1-D object array, where this dataset reads them so directly; else None.

    ArrayRecord records come out of the reader into such an array; a batch
    of them is then a slice of it, with no list and no per-record work.
    """
    return None

  def __getitem__(self, index):
    """`ds[i]` -> element (None if filtered out); `ds[a:b:c]` -> sliced dataset.

    As in Grain, an index past the end reads the next epoch (`ds[len(ds)]` is
    the first element of epoch 1, reshuffled by an upstream `shuffle`), and a
    negative index reads epoch -1 the same way: `ds[-1]` is the last element
    of a dataset that no `shuffle` reorders, and another one after a shuffle
    (epoch -1's order), as Grain's is.
    """
    if isinstance(index, slice):
      return self.slice(index)
    i = operator.index(index)
    # No emptiness check here: as in Grain, each stage that takes an index modulo a length of 0 refuses it
    # (a selection map or map_with_index over an empty dataset may read another epoch's element).
    return self._getitems(index_array(i))[0]

  def __iter__(self):
    return iter(self.to_iter_dataset())

  # ---- Transformations ----------------------------------------------------

  def pipe(self, func: Callable[..., S], /, *args, **kwargs) -> S:
    """`func(self, *args, **kwargs)`, for chaining functions like methods."""
    return func(self, *args, **kwargs)

  def apply(self, transformations: Any) -> MapDataset:
    """Applies Grain transform objects (`grain.transforms.Map`, `Batch`, ...) in order."""
    # Lazy: loader.apply reaches the flat-map ops, which import this module.
    from loader import apply as apply_lib  # pylint: disable=g-import-not-at-top

    return apply_lib.apply_transformations(self, transformations)

  def seed(self, seed: int | None) -> MapDataset[T]:
    """Sets the default seed of downstream `shuffle`/`random_map` without one.

    Each such transformation derives its own seed from `seed` and its distance
    from this call in the pipeline. `seed(None)` changes nothing, as in Grain.
    """
    if seed is None:
      return self
    return _WithSeedMapDataset(self, checks.check_seed(checks.seed_string(seed), "seed()", any_size=True,
                                                       floats="refuse"))

  def shuffle(self, seed: int | None = None) -> MapDataset[T]:
    """Globally shuffles, with a new permutation in every epoch (Grain's order).

    O(1) memory whatever the length: positions go through Grain's seeded index
    shuffle (see `loader.permutation`), never an array of indices.

    Args:
      seed: Integer in [0, 2**32-1]; defaults to one derived from `seed()`.
    """
    return ShuffleMapDataset(self, seed=seed)

  def repeat(self, num_epochs: int | None = None, *, reseed_each_epoch: bool = True) -> MapDataset[T]:
    """Repeats `num_epochs` times (None: forever, and len() is sys.maxsize).

    Args:
      num_epochs: Positive number of epochs, or None for infinite.
      reseed_each_epoch: If True (default) upstream `shuffle`/`random_map` use a
        new permutation/randomness each epoch; if False epochs are identical.
    """
    return RepeatMapDataset(self, num_epochs, reseed_each_epoch=reseed_each_epoch)

  def slice(self, sl: slice) -> MapDataset[T]:
    """The elements at positions `sl`, like list slicing (also `ds[a:b:c]`)."""
    return SliceMapDataset(self, sl)

  def map(self, transform: Callable[[T], S]) -> MapDataset[S]:
    """Applies `transform` to every element (filtered-out Nones stay None)."""
    return MapMapDataset(self, checks.resolve_fn(transform, "map", "map()"))

  def map_with_index(self, transform: Callable[[int, T], S]) -> MapDataset[S]:
    """Applies `transform(index, element)`; index includes the epoch offset."""
    return MapWithIndexMapDataset(self, checks.resolve_fn(transform, "map_with_index", "map_with_index()"))

  def random_map(self, transform: Callable[[T, np.random.Generator], S], *, seed: int | None = None) -> MapDataset[S]:
    """Applies `transform(element, rng)` with a per-element random generator.

    The generator depends only on `seed` and the element's index (epoch
    included), so results do not depend on iteration order, threads or workers.
    """
    return RandomMapMapDataset(self, checks.resolve_fn(transform, "random_map", "random_map()"), seed=seed)

  def filter(self, transform: Callable[[T], bool]) -> MapDataset[T]:
    """Keeps elements where `transform` (a predicate) is true; others become None.

    As in Grain, `ds[i]` is None for a dropped element and iteration skips it.
    `batch` cannot follow `filter` on a MapDataset: use
    `.to_iter_dataset().batch(...)`.
    """
    return FilterMapDataset(self, checks.resolve_fn(transform, "filter", "filter()"))

  def batch(self, batch_size: int, *, drop_remainder: bool = False,
            batch_fn: Callable[[Sequence[T]], S] | None = None) -> MapDataset[S]:
    """Groups consecutive elements into batches (see `batching.make_batch`).

    Each epoch is batched separately. bytes leaves become 1-D numpy object
    arrays holding the original objects; str leaves stack as numpy '<U' arrays.
    """
    return BatchMapDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

  def to_iter_dataset(self, read_options: options_lib.ReadOptions | None = None, *,
                      allow_nones: bool = False) -> iter_dataset.IterDataset[T]:
    """An `IterDataset` over the elements in index order, skipping None.

    Args:
      read_options: Threads and chunking for computing elements in this process.
      allow_nones: Yield filtered-out elements as None instead of skipping them.
    """
    # Lazy: iter_dataset imports this module (MapDataset is its base layer).
    from loader import iter_dataset  # pylint: disable=g-import-not-at-top

    return iter_dataset.MapBackedIterDataset(self, read_options=read_options, allow_nones=allow_nones)


def _infinite(n: int) -> bool:
  return n >= sys.maxsize


_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)


def _require_nonempty(ds: MapDataset, n: int) -> None:
  if n == 0:
    raise checks.EmptyDatasetError(f"Cannot read from an empty dataset: {ds!r}")


def index_array(i: int) -> np.ndarray:
  """`[i]` as int64, or as a Python int past int64 (Grain takes any Python int; see divmod_index)."""
  return np.array([i], dtype=np.int64 if _INT64_MIN <= i <= _INT64_MAX else object)


def divmod_index(indices: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """(epochs, positions) of `indices` in a dataset of length n.

  Indices are int64, except past the end of a slice of an infinite dataset:
  there Grain's parent index (epoch x parent length + position) exceeds
  int64, and they travel as Python ints (an object array) until an
  operation reduces them, as this does: positions are int64, and so are
  epochs unless they still exceed int64 (n == 1).
  """
  if indices.dtype == object:  # np.divmod has no loop for Python ints.
    epochs = indices // n
    return narrow_index(epochs), np.asarray(indices - epochs * n, dtype=np.int64)
  return np.divmod(indices, n)


def narrow_index(indices: np.ndarray) -> np.ndarray:
  """Python-int indices as int64 where they all fit (see divmod_index)."""
  if indices.dtype != object or (indices.size and not _INT64_MIN <= min(indices) <= max(indices) <= _INT64_MAX):
    return indices
  return indices.astype(np.int64)


def join_index(epochs: np.ndarray, n: int, pos: np.ndarray, room: int = 0) -> np.ndarray:
  """epochs * n + pos: int64, or Python ints where that (plus `room`) overflows (see divmod_index)."""
  # Both ends: a negative epoch of a slice of an infinite dataset (`ds.repeat()[-4:][-2]`)
  # lies below int64 in Grain's Python ints, and int64 would wrap it to another element.
  if epochs.size and (int(epochs.max()) * n + int(pos.max()) + room > _INT64_MAX
                      or int(epochs.min()) * n + int(pos.min()) < _INT64_MIN):
    return epochs.astype(object) * n + pos.astype(object)
  return epochs * n + pos


def mod_index(indices: np.ndarray, n: int) -> np.ndarray:
  """`indices % n` as int64 (see divmod_index)."""
  out = indices % n
  return np.asarray(out, dtype=np.int64) if out.dtype == object else out


class _IndexMapDataset(MapDataset[T]):
  """A dataset whose element i is its parent's element at another index (shuffle, repeat, slice, seed)."""

  _spec_rule = "parent"

  def _parent_indices(self, indices: np.ndarray) -> np.ndarray:
    return indices

  def _getitems(self, indices: np.ndarray) -> list[T]:
    return self._parent._getitems(self._parent_indices(indices))

  def _getitems_array(self, indices: np.ndarray) -> np.ndarray | None:
    return self._parent._getitems_array(self._parent_indices(indices))


class SourceMapDataset(MapDataset[T]):
  """Wraps a random-access source; reads are batched per call."""

  _same_as_grain = True

  def __init__(self, source: Any):
    super().__init__()
    self._reader = source_lib.BatchedSource(source)
    self._source = source
    self._len = len(source)
    self._yields_none: bool | None = None  # Found out when first asked.

  @property
  def _may_yield_none(self) -> bool:
    if self._yields_none is None:
      self._yields_none = source_lib.may_yield_none(self._source)
    return self._yields_none

  def __len__(self) -> int:
    return self._len

  @property
  def _element_spec(self) -> Any:
    if isinstance(self._source, range):  # MapDataset.range: Grain's RangeMapDataset knows its spec.
      return element_spec.range_spec()
    raise element_spec.not_implemented(self)

  def __repr__(self) -> str:
    # Logged and put in error messages: never every element of a big list.
    return f"MapDataset.source({self._source_text()})"

  def _repr_before_short_sources(self) -> str:
    # What repr() said before sources were shortened: DataLoader states of
    # that time name a MapDataset data_source by it (see data_loader).
    return f"MapDataset.source({self._source!r})"

  def _source_text(self) -> str:
    # A list's or a user object's repr may be huge or hold addresses; type and
    # length identify the source well enough (also to catch a wrong one in a state).
    src = self._source
    if isinstance(src, (list, tuple, np.ndarray)) or type(src).__repr__ is object.__repr__:
      return f"{type(src).__name__}(len={self._len})"  # Without printing every element.
    text = repr(src)
    if len(text) > 120 or text.startswith("<"):
      return f"{type(src).__name__}(len={self._len})"
    return text

  def _state_op(self) -> str:
    return f"source({self._source_text()})"

  def _getitems(self, indices: np.ndarray) -> list[T]:
    _require_nonempty(self, self._len)
    return self._reader.read(mod_index(indices, self._len))

  def _getitems_array(self, indices: np.ndarray) -> np.ndarray | None:
    _require_nonempty(self, self._len)
    return self._reader.read_array(mod_index(indices, self._len))


class _WithSeedMapDataset(_IndexMapDataset[T]):

  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], seed: int):
    super().__init__(parent)
    self._seed = seed
    self._seed_rng_seed = seed  # Grain's name; downstream ops derive theirs from it.

  def __len__(self) -> int:
    return len(self._parent)

  def _op_repr(self) -> str:
    return f".seed({self._seed})"

  @property
  def _default_seed(self) -> int | None:
    return self._seed


class ShuffleMapDataset(_IndexMapDataset[T]):
  """Global shuffle in Grain's order: epoch e is Grain's index shuffle seeded `(seed + e) % 2**32` (O(1) memory)."""

  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], *, seed: int | None = None):
    super().__init__(parent)
    self._seed = checks.seed_or_default(parent, seed, "shuffle()", floats="truncate")
    self._parent_len = len(parent)
    # Shuffling after repeat() permutes all sys.maxsize positions, as Grain
    # does: records are drawn without regard to epochs (shuffle first to keep
    # each epoch whole).

  def __len__(self) -> int:
    return self._parent_len

  def _op_repr(self) -> str:
    return f".shuffle(seed={self._seed})"

  def _perm(self, epoch: int) -> permutation.IndexPermutation:
    return permutation.IndexPermutation(self._parent_len, (self._seed + epoch) % 2**32)

  def _parent_indices(self, indices: np.ndarray) -> np.ndarray:
    n = self._parent_len
    _require_nonempty(self, n)
    if not indices.size:
      return indices
    epochs, pos = divmod_index(indices, n)
    first = int(epochs[0])
    if (epochs == first).all():  # The common case: a chunk within one epoch.
      shuffled = self._perm(first)(pos)
    else:
      shuffled = np.empty_like(pos)
      for e in np.unique(epochs):
        mask = epochs == e
        shuffled[mask] = self._perm(int(e))(pos[mask])
    return join_index(epochs, n, shuffled)


class RepeatMapDataset(_IndexMapDataset[T]):
  """Repeats the parent; with reseeding, upstream randomness changes per epoch."""

  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], num_epochs: int | None = None, *, reseed_each_epoch: bool = True):
    super().__init__(parent)
    if num_epochs is not None:
      num_epochs = checks.check_int(num_epochs, "num_epochs", minimum=1)
    self._parent_len = len(parent)
    if _infinite(self._parent_len):
      raise ValueError(f"Cannot repeat an infinite dataset: {parent!r}")
    self._num_epochs = num_epochs
    self._reseed = reseed_each_epoch
    if num_epochs is None:
      self._len = sys.maxsize if self._parent_len else 0
    else:
      self._len = num_epochs * self._parent_len

  def __len__(self) -> int:
    return self._len

  def _op_repr(self) -> str:
    return f".repeat({self._num_epochs})"

  def _parent_indices(self, indices: np.ndarray) -> np.ndarray:
    if not self._reseed:
      _require_nonempty(self, self._parent_len)
      indices = mod_index(indices, self._parent_len)
    return indices


class SliceMapDataset(_IndexMapDataset[T]):
  """Positions `sl` of the parent, like list slicing."""

  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], sl: slice, *, op_repr: str | None = None):
    super().__init__(parent)
    if not isinstance(sl, slice):
      # A TypeError, and a ValueError as Grain raises ("sl is not a slice").
      raise checks.ArgumentTypeError(f"sl is not a slice: {type(sl)}. slice() expects a slice object, e.g. "
                                     f"slice(0, 100) (got {sl!r}).")
    self._parent_len = len(parent)
    self._start, self._stop, self._step = sl.indices(self._parent_len)
    self._len = len(range(self._start, self._stop, self._step))
    self._repr = op_repr or f"[{self._start}:{self._stop}:{self._step}]"

  def __len__(self) -> int:
    return self._len

  def _op_repr(self) -> str:
    return self._repr

  def _parent_indices(self, indices: np.ndarray) -> np.ndarray:
    _require_nonempty(self, self._len)
    epochs, pos = divmod_index(indices, self._len)
    return join_index(epochs, self._parent_len, self._start + pos * self._step)


class MapMapDataset(MapDataset[S]):
  """Applies a function to each element."""

  _may_yield_none = True  # The user's function may return None.

  _spec_rule = "transform"
  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], transform: Callable[[T], S]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "map", "MapMapDataset")

  def __len__(self) -> int:
    return len(self._parent)

  def _op_repr(self) -> str:
    return f".map({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "map"  # Not the function's name: a renamed function may resume.

  def _getitems(self, indices: np.ndarray) -> list[S | None]:
    fn = self._fn
    items = self._parent._getitems(indices)  # A source's StopIteration (a stream's end) passes.
    try:
      return [None if x is None else fn(x) for x in items]
    except StopIteration as e:
      raise checks.stop_iteration_error(fn, e) from e


class MapWithIndexMapDataset(MapDataset[S]):
  """Applies a function to (index, element)."""

  _may_yield_none = True  # The user's function may return None.

  _spec_rule = "transform"
  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], transform: Callable[[int, T], S]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "map_with_index", "MapWithIndexMapDataset")

  def __len__(self) -> int:
    return len(self._parent)

  def _op_repr(self) -> str:
    return f".map_with_index({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "map_with_index"

  def _getitems(self, indices: np.ndarray) -> list[S | None]:
    fn = self._fn
    items = self._parent._getitems(indices)
    try:
      return [None if x is None else fn(i, x) for i, x in zip(indices.tolist(), items)]
    except StopIteration as e:
      raise checks.stop_iteration_error(fn, e) from e


class RandomMapMapDataset(MapDataset[S]):
  """Applies fn(element, rng) with rng = Philox(key=seed) at counter `index` (Grain's draws)."""

  _may_yield_none = True  # The user's function may return None.

  _spec_rule = "transform"
  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], transform: Callable[[T, np.random.Generator], S],
               seed: int | None = None):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "random_map", "RandomMapMapDataset")
    self._seed = checks.random_map_seed(parent, seed, "random_map()")

  def __len__(self) -> int:
    return len(self._parent)

  def _op_repr(self) -> str:
    return f".random_map({checks.fn_name(self._fn)}, seed={self._seed})"

  def _state_op(self) -> str:
    return f"random_map(seed={self._seed})"

  def _getitems(self, indices: np.ndarray) -> list[S | None]:
    fn, seed = self._fn, self._seed
    out = []
    items = self._parent._getitems(indices)
    try:
      for i, x in zip(indices.tolist(), items):
        if x is None:
          out.append(None)
          continue
        out.append(fn(x, checks.element_rng(seed, i)))
    except StopIteration as e:
      raise checks.stop_iteration_error(fn, e) from e
    return out


class FilterMapDataset(MapDataset[T]):
  """Replaces elements failing the predicate with None."""

  _spec_rule = "parent"
  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], transform: Callable[[T], bool]):
    super().__init__(parent)
    self._fn = checks.resolve_fn(transform, "filter", "FilterMapDataset")

  def __len__(self) -> int:
    return len(self._parent)

  def _op_repr(self) -> str:
    return f".filter({checks.fn_name(self._fn)})"

  def _state_op(self) -> str:
    return "filter"

  @property
  def _may_contain_none(self) -> bool:
    return True

  def _getitems(self, indices: np.ndarray) -> list[T | None]:
    fn = self._fn
    items = self._parent._getitems(indices)
    try:
      return [x if x is not None and fn(x) else None for x in items]
    except StopIteration as e:
      raise checks.stop_iteration_error(fn, e) from e


def streams(ds: MapDataset) -> bool:
  """Whether a source under `ds` ignores the index it is asked and returns its next record.

  Such a stream is read in order, one read at a time: the engine neither
  splits its chunks over threads nor reads ahead past a failed element.
  """
  reader = getattr(ds, "_reader", None)
  if reader is not None and getattr(reader, "streams", False):
    return True
  return any(streams(p) for p in ds._parents)  # pylint: disable=protected-access


def in_order(ds: MapDataset) -> bool:
  """Whether a stage of `ds` must see its elements one after the other, as in Grain.

  Grain runs iterator-level maps and filters (and a DataLoader's operations)
  in one thread, in order, so such a function may keep state from one element
  to the next (a delta to the previous one, a running count). The engine then
  computes chunks of `ds` whole, on one thread, instead of splitting them.
  """
  return ds._in_order or any(in_order(p) for p in ds._parents)  # pylint: disable=protected-access


def in_order_stage(ds: MapDataset) -> MapDataset:
  """`ds`, its stage marked as one that sees elements in order (see in_order)."""
  ds._in_order = True  # pylint: disable=protected-access
  return ds


def first_failure(ds: MapDataset, indices: Sequence[int]) -> tuple[int, Exception] | None:
  """The first of `indices` whose element of `ds` fails computed alone, and its error (None: none fails)."""
  for i in indices:
    try:
      ds._getitems(index_array(i))  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      return i, e
  return None


def _first_discarding(ds: MapDataset) -> str:
  """Grain's name for the nearest stage above `ds` that may discard elements."""
  todo = [ds]
  while todo:
    d = todo.pop(0)
    if type(d).__name__ == "FlatMapMapDataset":
      return "FlatMapMapDataset"
    if isinstance(d, FilterMapDataset):
      return "MapDataset.filter"
    todo.extend(d._parents)  # pylint: disable=protected-access
  return "MapDataset.filter"


class BatchMapDataset(MapDataset[S]):
  """Consecutive elements stacked into batches; one parent call per chunk."""

  _same_as_grain = True

  def __init__(self, parent: MapDataset[T], batch_size: int, drop_remainder: bool = False,
               batch_fn: Callable[[Sequence[T]], S] | None = None, *, none_is_element: bool = False):
    """`none_is_element`: the batch is an iterator-level one folded in, whose batch_fn's None is an element
    (batching.NONE_ELEMENT here), not a filtered hole."""
    super().__init__(parent)
    self._none_is_element = none_is_element and batch_fn is not None
    self._batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
    if parent._may_contain_none:
      culprit = _first_discarding(parent)
      raise ValueError(  # Grain's words first: client code matches them.
          f"`MapDataset.batch` can not follow `{culprit}` because `{culprit.rsplit('.', 1)[-1]}` can discard "
          "elements (they would leave holes in batches). Use ds.to_iter_dataset().batch(...) instead.")
    self._parent_len = len(parent)
    self._drop_remainder = bool(drop_remainder)
    self._batch_fn = batch_fn or batching.make_batch
    if drop_remainder:
      self._len = self._parent_len // self._batch_size
    else:
      # Grain's float ceil (lengths of infinite parents match its rounding),
      # capped: for batch size 1 it rounds sys.maxsize up past an index.
      self._len = min(math.ceil(self._parent_len / self._batch_size), sys.maxsize)

  def __len__(self) -> int:
    return self._len

  @property
  def _may_yield_none(self) -> bool:
    return self._batch_fn is not batching.make_batch or self._parent._may_yield_none

  enable_shared_memory_output = batching.enable_shared_memory_output

  @property
  def _element_spec(self) -> Any:
    return element_spec.batched(self._parent, self._batch_size, self._drop_remainder, self._batch_fn)

  def _op_repr(self) -> str:
    return f".batch({self._batch_size}, drop_remainder={self._drop_remainder})"

  @property
  def _records_per_element(self) -> int:
    return self._batch_size * self._parent._records_per_element

  def _getitems(self, indices: np.ndarray) -> list[S]:
    _require_nonempty(self, self._len)
    epochs, pos = divmod_index(indices, self._len)
    if self._len * self._batch_size > _INT64_MAX:  # Batches of an infinite parent: starts near int64's end.
      pos = pos.astype(object)
    starts = pos * self._batch_size
    # Not `min(starts + batch_size, n) - starts`: that overflows int64 for the last batches of an infinite parent.
    # Grain's length of an infinite parent's batches is a float's ceil, which can count batches past the
    # parent's end: as in Grain, those batch no elements (the default batch_fn raises "Cannot batch 0 values").
    counts = np.maximum(np.minimum(self._batch_size, self._parent_len - starts), 0).astype(np.int64)
    starts = join_index(epochs, self._parent_len, narrow_index(starts), room=self._batch_size)
    # All elements of all requested batches in one parent call.
    offsets = np.cumsum(counts) - counts
    flat = np.repeat(starts - offsets, counts) + np.arange(int(counts.sum()), dtype=np.int64)
    spans = zip(offsets.tolist(), counts.tolist())
    batch_fn = self._batch_fn
    try:
      if batch_fn is batching.make_batch:
        records = self._parent._getitems_array(flat)
        if records is not None:  # Bytes records: a batch is their object array, as make_batch builds it.
          return [records[o:o + c].copy() for o, c in spans]
      items = self._parent._getitems(flat)
    except Exception as e:  # pylint: disable=broad-except
      error = e
    else:
      batches = [checks.call_user(batch_fn, items[o:o + c]) for o, c in spans]
      if self._none_is_element:
        batches = [batching.NONE_ELEMENT if b is None else b for b in batches]
      return batches
    # Grain computes a batch's elements one after the other: its error is the
    # first failing element's, even where a later one fails in an earlier
    # stage (computed here stage by stage). Several batches at once are left
    # to the caller, which retries them one by one; a stream cannot be read
    # again. (Out of the except block: no chained context.)
    if len(indices) == 1 and not streams(self):
      failed = first_failure(self._parent, flat.tolist())
      if failed is not None:
        raise failed[1]
    raise error
