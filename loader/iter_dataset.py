"""`IterDataset`: a stream of elements, and how it splits into two layers.

Determinism rule. A pipeline has *random-access parts*: each `MapDataset` it
starts from, plus any `IterDataset.map`/`filter`/`random_map`/
`map_with_index` applied directly on `to_iter_dataset()` and any `batch`
applied there while no `filter` came before it. Those calls are rewritten
into `MapDataset` operations at construction, so element k of such a part is
a pure function of k, computed in chunks by `loader.engine` (and by worker
processes under `mp_prefetch`). Everything else (`batch` after a `filter`,
packing, mixing of streams, `prefetch`) is *sequential* (`loader.sequential`
and `loader.transformations`): it runs on the reassembled stream in the
consuming process. The stream and every checkpoint state are therefore
identical for any number of workers or threads.

State. Iterators keep Grain's state shapes (`{"next_index": k}` for a
MapDataset part; map/filter/batch pass their parent's state through; stages
that buffer nest `{"parent": ...}`), and `loader.state` adds a description of
the pipeline to the outermost state so that a state is never applied to
another pipeline.
"""

from __future__ import annotations

import abc
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from loader import apply as apply_lib
from loader import batching
from loader import checks
from loader import dataset_iterator
from loader import element_spec
from loader import engine
from loader import grain_interop
from loader import map_dataset as map_dataset_lib
from loader import options as options_lib
from loader import realign
from loader import stats as stats_lib
from loader.dataset_iterator import DatasetIterator

T = TypeVar("T")
S = TypeVar("S")


class _IterDatasetMeta(abc.ABCMeta):
  """`IterDataset.mix` lives on the class only, as in Grain (see map_dataset._MapDatasetMeta)."""

  def mix(cls, datasets: Any, weights: Any = None) -> IterDataset:
    """Mixes streams by weight, like Grain's `IterDataset.mix` (see loader.transformations.mix)."""
    # Lazy: transformations import this module.
    from loader.transformations import mix  # pylint: disable=g-import-not-at-top

    return mix.mix_iter_datasets(datasets, weights)


class IterDataset(grain_interop.IterDataset, Generic[T], metaclass=_IterDatasetMeta):
  """A stream of elements, like Grain's `IterDataset`.

  Usually made with `MapDataset.to_iter_dataset()`; see the module docstring
  for which operations stay random access (parallel, deterministic for any
  worker count) and which run sequentially.
  """

  # Whether this operation yields Grain's exact stream for the same input;
  # decides if a Grain-written state may be resumed (see loader.state).
  _same_as_grain = False
  # Grain subclasses record execution statistics through it (a no-op here).
  _stats = stats_lib.NO_STATS
  # How this stage's element spec follows from its parents' (see loader.element_spec).
  _spec_rule: str | None = None
  _element_spec = element_spec.spec_property

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    fn = cls.__dict__.get("__iter__")
    if fn is not None and not getattr(fn, "_loader_wrapped", False):

      @functools.wraps(fn)
      def __iter__(self, _fn=fn):
        # Only the iterator the caller gets is described; those built for
        # its parents meanwhile hand states to each other unchecked.
        with dataset_iterator.building() as outermost:
          it = _fn(self)
        return dataset_iterator.stamp_iterator(it, self) if outermost else it

      __iter__._loader_wrapped = True  # pylint: disable=protected-access
      cls.__iter__ = __iter__

  def __init__(self, parents: Any = ()):
    if not isinstance(parents, (list, tuple)):
      parents = (parents,)
    self._parents = tuple(parents)

  @property
  def parents(self) -> tuple[Any, ...]:
    return self._parents

  @property
  def _parent(self) -> Any:
    return self._parents[0]

  @abc.abstractmethod
  def __iter__(self) -> DatasetIterator[T]:
    """A fresh iterator positioned at the start."""

  def _op_repr(self) -> str:
    return f".{type(self).__name__}()"

  def __repr__(self) -> str:
    prefix = repr(self._parent) if self._parents else "IterDataset"
    return prefix + self._op_repr()

  def pipe(self, func: Callable[..., S], /, *args, **kwargs) -> S:
    """`func(self, *args, **kwargs)`, for chaining functions like methods."""
    return func(self, *args, **kwargs)

  def apply(self, transformations: Any) -> IterDataset:
    """Applies Grain transform objects (`grain.transforms.Map`, `Batch`, ...) in order."""
    return apply_lib.apply_transformations(self, transformations)

  def _random_access(self) -> MapBackedIterDataset | None:
    return None

  def seed(self, seed: int | None) -> IterDataset[T]:
    """Sets the default seed of downstream `random_map` calls without one (None: no change)."""
    if seed is None:
      return self
    base = self._random_access()
    if base is not None:
      seeded = base.map_dataset.seed(seed)
      # In Grain this node sits above to_iter_dataset(); folded, it sits below
      # ours, one level further from later random ops (see checks.default_seed).
      seeded._iter_level_seed = True  # pylint: disable=protected-access
      return base.rebase(seeded)
    return sequential.WithSeedIterDataset(self, checks.check_seed(checks.seed_string(seed), "seed()", any_size=True,
                                                                  floats="refuse"))

  def map(self, transform: Callable[[T], S]) -> IterDataset[S]:
    """Applies `transform` to each element."""
    fn = checks.resolve_fn(transform, "map", "map()")
    base = self._random_access()
    if base is not None:
      return base.rebase(map_dataset_lib.in_order_stage(base.map_dataset.map(fn)))
    return sequential.MapIterDataset(self, fn)

  def random_map(self, transform: Callable[[T, np.random.Generator], S], *, seed: int | None = None) -> IterDataset[S]:
    """Applies `transform(element, rng)`; rng depends only on the seed and the element's position."""
    fn = checks.resolve_fn(transform, "random_map", "random_map()")
    # Derived from this stream's shape (as Grain does), before any folding.
    seed = checks.random_map_seed(self, seed, "random_map()")
    base = self._random_access()
    if base is not None and not base.map_dataset._may_contain_none:  # pylint: disable=protected-access
      # Stream position == MapDataset index here, so the generators are Grain's
      # (unless a map returned None, which Grain's to_iter_dataset() drops:
      # positions then count it here; see README).
      return base.rebase(map_dataset_lib.in_order_stage(base.map_dataset.random_map(fn, seed=seed)),
                         grain_layer="index_for_rng")
    return sequential.RandomMapIterDataset(self, fn, seed)

  def map_with_index(self, transform: Callable[[int, T], S]) -> IterDataset[S]:
    """Applies `transform(index, element)`, index = position in this stream."""
    fn = checks.resolve_fn(transform, "map_with_index", "map_with_index()")
    base = self._random_access()
    if base is not None and not base.map_dataset._may_contain_none:  # pylint: disable=protected-access
      return base.rebase(map_dataset_lib.in_order_stage(base.map_dataset.map_with_index(fn)), grain_layer="counter")
    return sequential.MapWithIndexIterDataset(self, fn)

  def filter(self, transform: Callable[[T], bool]) -> IterDataset[T]:
    """Keeps elements for which `transform` (a predicate) is true."""
    fn = checks.resolve_fn(transform, "filter", "filter()")
    base = self._random_access()
    if base is not None:
      return base.rebase(map_dataset_lib.in_order_stage(base.map_dataset.filter(fn)))
    return sequential.FilterIterDataset(self, fn)

  def batch(self, batch_size: int, *, drop_remainder: bool = False,
            batch_fn: Callable[[Sequence[T]], S] | None = None) -> IterDataset[S]:
    """Groups consecutive elements into batches (see `batching.make_batch`).

    Random access (parallel) unless a `filter` precedes it; then sequential.
    """
    batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
    base = self._random_access()
    if base is not None and not base.map_dataset._may_yield_none:  # pylint: disable=protected-access
      batched = map_dataset_lib.BatchMapDataset(base.map_dataset, batch_size, drop_remainder=drop_remainder,
                                                batch_fn=batch_fn, none_is_element=True)
      return base.rebase(batched, unit=batch_size)
    return sequential.BatchIterDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

  def prefetch(self, multiprocessing_options: options_lib.MultiprocessingOptions | int) -> IterDataset[T]:
    """Grain's deprecated alias of `mp_prefetch(multiprocessing_options)`.

    Ours also takes an int: a buffer of that many elements computed ahead in
    a background thread (`ThreadPrefetchIterDataset`).
    """
    if isinstance(multiprocessing_options, options_lib.MultiprocessingOptions):
      warnings.warn("prefetch(MultiprocessingOptions) is deprecated; use mp_prefetch().",
                    DeprecationWarning, stacklevel=2)
      return self.mp_prefetch(multiprocessing_options)
    return sequential.ThreadPrefetchIterDataset(
        self, checks.check_int(multiprocessing_options, "buffer_size", minimum=0))

  def mp_prefetch(self, options: options_lib.MultiprocessingOptions | None = None,
                  worker_init_fn: Callable[[int, int], None] | None = None,
                  sequential_slice: bool = False) -> IterDataset[T]:
    """Computes the random-access parts of the pipeline in worker processes.

    Workers take chunks of positions round-robin and the parent reassembles
    them in order, then runs the sequential stages. The stream and
    checkpoints are therefore identical for every `num_workers` (0 runs in
    process). Numpy arrays come back through shared memory.

    Args:
      options: Worker count and buffering; default
        `MultiprocessingOptions(num_workers=10)`, as in Grain.
      worker_init_fn: Called as `fn(worker_index, num_workers)` in each worker
        before it computes anything.
      sequential_slice: Accepted for Grain compatibility; ignored, because
        the stream never depends on how work is split between workers.
    """
    # Lazy: mp_prefetch imports this module (for IterDataset).
    from loader import mp_prefetch  # pylint: disable=g-import-not-at-top

    del sequential_slice
    return mp_prefetch.MultiprocessPrefetchIterDataset(self, options, worker_init_fn)



class MapBackedIterDataset(IterDataset[T]):
  """The elements of a `MapDataset` in index order (Nones skipped).

  `unit` is how many elements of the `MapDataset` as it was at
  `to_iter_dataset()` one element here stands for (iterator-level batches
  are folded into the MapDataset); Grain counts its positions in those.
  `grain_layers` lists, innermost first, the folded iterator-level stages
  whose Grain state wraps its parent's (`{"parent": ..., key: count}`), each
  with the `unit` it counted in, so a Grain-written state can be unwrapped.
  """

  _same_as_grain = True
  _spec_rule = "parent"
  # Iterator-level batches are folded in here.
  enable_shared_memory_output = batching.enable_shared_memory_output

  def __init__(self, map_dataset: map_dataset_lib.MapDataset[T], *,
               read_options: options_lib.ReadOptions | None = None, allow_nones: bool = False,
               unit: int = 1, unit_len: int | None = None, grain_layers: tuple[tuple[str, int], ...] = (),
               unit_batch: map_dataset_lib.MapDataset | None = None):
    if not isinstance(map_dataset, map_dataset_lib.MapDataset):
      raise TypeError(f"Expected a MapDataset (got {type(map_dataset).__name__}).")
    super().__init__(map_dataset)
    if read_options is not None and not isinstance(read_options, options_lib.ReadOptions):
      raise checks.OptionsTypeError(f"read_options must be a loader.ReadOptions (got {read_options!r}).")
    self.read_options = read_options or options_lib.ReadOptions()
    self.allow_nones = bool(allow_nones)
    self.unit = unit
    # Length before iterator-level batches were folded in (for Grain states).
    self.unit_len = len(map_dataset) if unit_len is None else unit_len
    self.grain_layers = grain_layers
    # The first folded iterator-level batch: after a failed element or at a
    # restore inside a batch, batches start at any element, as Grain's do
    # (see loader.realign).
    self.unit_batch = unit_batch

  @property
  def map_dataset(self) -> map_dataset_lib.MapDataset[T]:
    return self._parents[0]

  def __repr__(self) -> str:
    return f"{self.map_dataset!r}.to_iter_dataset()"

  def _op_repr(self) -> str:
    return ".to_iter_dataset()" if self.unit == 1 else f".to_iter_dataset(unit={self.unit})"

  def _random_access(self) -> MapBackedIterDataset | None:
    # Nothing folds in after a batch whose batch_fn's None is an element: folded stages would see its
    # marker (batching.NONE_ELEMENT), where Grain's iterator-level stages see the None.
    if self.allow_nones or getattr(self.map_dataset, "_none_is_element", False):
      return None
    return self

  def rebase(self, map_dataset: map_dataset_lib.MapDataset, unit: int = 1,
             grain_layer: str | None = None) -> MapBackedIterDataset:
    layers = self.grain_layers + (((grain_layer, self.unit),) if grain_layer else ())
    # The first batch folded in is where batches realign (see loader.realign).
    unit_batch = map_dataset if unit > 1 and self.unit == 1 else self.unit_batch
    return MapBackedIterDataset(map_dataset, read_options=self.read_options, allow_nones=self.allow_nones,
                                unit=self.unit * unit, unit_len=self.unit_len, grain_layers=layers,
                                unit_batch=unit_batch)

  def __iter__(self) -> DatasetIterator[T]:
    ds = self.map_dataset
    if self.unit > 1 and realign.realignable(ds, self.unit_batch):
      ds = realign.RealignedMapDataset(ds, self.unit_batch)
    producer = engine.make_producer(ds, self.read_options)
    it = engine.MapDatasetIterator(ds, producer, allow_nones=self.allow_nones,
                                   unit=self.unit, unit_len=self.unit_len, grain_layers=self.grain_layers)
    # Grain's PrefetchDatasetIterator field: client telemetry reads it as the read-ahead capacity.
    it._target_prefetch_buffer_size = self.read_options.prefetch_buffer_size  # pylint: disable=protected-access
    return it


class SequentialIterDataset(IterDataset[T]):
  """Base of stages that run on the reassembled stream in the consumer."""

  @abc.abstractmethod
  def make_iterator(self, parent: DatasetIterator) -> DatasetIterator[T]:
    """This stage on top of `parent` (which may run in workers)."""

  def __iter__(self) -> DatasetIterator[T]:
    it = self._parent.__iter__()
    if not isinstance(it, DatasetIterator):
      # A custom parent's iterator may be any object with __next__ (and
      # get_state/set_state), even the dataset itself: Grain accepts those.
      it = sequential.Checkpointable(it)
    return self.make_iterator(it)


# Bottom import: the stages subclass SequentialIterDataset defined above, and
# IterDataset's methods build them.
from loader import sequential  # pylint: disable=g-import-not-at-top,wrong-import-position
ThreadPrefetchIterDataset = sequential.ThreadPrefetchIterDataset
