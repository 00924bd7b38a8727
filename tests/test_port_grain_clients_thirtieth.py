"""Round 33's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

google/airio (HEAD 69897df), airio/_src/pygrain/: data_sources.py
(`JsonDataSource`: a JSON file's rows `json.dumps`ed into a
`grain.InMemoryDataSource(elements=...)` per split, a shared-memory source a
`DataLoader` names by its repr in its state; `FunctionDataSource`: a numpy
array as the source), preprocessors.py (`MapFnTransform` /
`RandomMapFnTransform` / `FilterFnTransform`: `@dataclasses.dataclass`es
inheriting from a `runtime_checkable` Protocol dataclass and from
`grain.MapTransform` / `RandomMapTransform` / `FilterTransform`, their
`runtime_args` set on the instances before a run and injected by annotation;
`LazyMapTransform` / `LazyIterTransform`; `LazyDatasetTransform`, which
checks `isinstance(t, grain.Transformation | LazyTransforms)` and dispatches
with `match` on `case grain.MapTransform()`, `case grain.FilterTransform()`,
`case grain.Batch()`), lazy_dataset_transforms.py (`ConcatLazyMapDataset`
and `RandomMapFnLazyMapDataset`: `@dataclasses.dataclass(frozen=False)`
subclasses of `grain.MapDataset[T]` with their own `__init__`, hence
unhashable, with a generated `__eq__` / `__repr__`; per-index keys from
`jax.random.fold_in`), dataset_providers.py (`GrainTask.get_dataset`: a
`DataLoader` of the Task's transformations and an `IndexSampler` when all are
`grain.Transformation`s, else `get_lazy_dataset`: one
`MapDataset.source(...)` per epoch (`[ds] * num_epochs`) preprocessed and
`shuffle(seed=...)`d with seeds drawn by `jax.random.randint`, concatenated,
`to_iter_dataset(ReadOptions())` once a transform produced `None`s before a
`Batch`, `repeat(num_epochs=None)`, `mp_prefetch(MultiprocessingOptions(
num_workers=...))`; `get_dataset_by_step` rebuilding a `DataLoader` per
accumulated operation; `GrainMixture`: `MapDataset.mix` of the tasks'
datasets with proportions, or `IterDataset.mix` when one produces `None`s;
`_even_split` shards) and dataset_iterators.py
(`PyGrainDatasetIteratorWrapper`: `isinstance(ds, grain.MapDataset |
grain.IterDataset)` choosing a dict state or the `DataLoader`'s JSON bytes
(`json.loads(state.decode())`, `json.dumps(state, indent=4).encode()`), an
`element_spec` and `peek` from a second iterator, `take`, states saved to
and restored from files). In process with states restored at every step, and
as a script with two worker processes. airio's core classes (`Task`,
`Mixture`, `AirIOInjectedRuntimeArgs`, `inject_runtime_args_to_fn`) are kept
trimmed; clu, etils and TFDS are left out; a JSON file of short reviews and
numpy ranges are the data.

jax-ml/jax-ai-stack (d5b1e71), docs/source/
data_loaders_for_multi_device_setups_with_jax.md, its Grain section with the
page's JAX cells: a plain `Dataset` class over torchvision's MNIST returning
`(flattened float32 image, int label)`, `pygrain.SequentialSampler(
num_records=..., shard_options=pygrain.ShardByJaxProcess())` built once and
shared by a `DataLoader` made anew per epoch by `pygrain_training_generator()`
with `operations=[pygrain.Batch(batch_size)]` (the last batch short, kept),
`for x, y in training_generator()` unpacking the tuple batches, and each batch
`device_put` with a `NamedSharding` over a `Mesh` of all devices into a
jitted update; the trained parameters and the printed accuracies compared.

AI-Hypercomputer/maxtext (e591f30), src/maxtext/common/grain_utility.py's
Orbax-v0 part: `GrainCheckpointHandler` (a subclass of `grain.python`'s
`PyGrainCheckpointHandler` and `ocp.CheckpointHandler` writing
`process_{i}-of-{n}.json` per iterator, `json.dumps(get_state())` for a
`grain.DatasetIterator` and the decoded bytes for a `DataLoader` iterator, and
one `process_0.json` for an `ElasticIterator`), `GrainCheckpointSave` /
`GrainCheckpointRestore` registered with `ocp.args.register_with_handler`,
and `restore_grain_iterator` / `prepare_scaled_down_grain_restore_args`: a
checkpoint of two hosts' iterators (the list form `for_save` makes) counted by
`glob("process_*-of-*.json")` and restored by one JAX process as a list, a
one-host `DataLoader` checkpoint, an `ElasticIterator` checkpoint, inside an
Orbax `CheckpointManager` `Composite` beside a `StandardSave`; and the
client's AssertionError when the host was not given a list.

AI-Hypercomputer/maxtext (e591f30), src/maxtext/input_pipeline/dpo_utils.py
and grain_data_processing.py's `dpo_preprocessing_pipeline` (with
data_processing_utils.py's `apply_multiprocessing_and_prefetch`):
`DPODataFormatting`, a `@dataclasses.dataclass` `grain.MapTransform` that
deletes the input columns from the element and adds left-padded prompts,
right-padded responses and their masks (three columns, or two hh-rlhf-style
conversations split at their common prefix), re-raising a missing column's
KeyError with the expected columns and asserting positive lengths;
`IterDataset.batch(batch_size, batch_fn=functools.partial(
grain.experimental.batch_and_pad, batch_size=..., pad_value=pad_id))` (the last
batch padded with pad rows) and `mp_prefetch(grain.MultiprocessingOptions(
num_workers=0, per_worker_buffer_size=...))`; states restored at every step.

Differences the port found:
- A `DataLoader` state restored into the same task built again (a new
  `InMemoryDataSource`, so another shared-memory name in the source's repr)
  is refused by both with a ValueError, but loader's message lacked Grain's
  words ("DataSource in checkpoint does not match datasource in dataloader.")
  that clients match. Fixed in loader/data_loader.py
  (`DataLoaderIterator.set_state`): Grain's sentence comes first for a
  differing source or sampler ("Sampler in checkpoint does not match
  dataloader sampler."), loader's line after it (still one line); minimized in
  `test_refused_data_loader_state_message_starts_with_grains_words`.
- Documented, asserted as documented: loader's DataLoader state has extra
  keys (README, "Checkpoint states"), compared through `porting.grain_keys`;
  with two workers Grain's DataLoader hands out each worker's filtered share
  in turn (the record the filter drops in one worker shifts the interleave)
  where loader's stream is the one with no
  workers (README, `DataLoader`: "one stream whatever worker_count").
"""

from __future__ import annotations

import gc
import json
import os

import absl.flags
import pytest

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


# ---------------------------------------------------------------------------
# google/airio
# ---------------------------------------------------------------------------

# airio/_src/pygrain/{data_sources,lazy_dataset_transforms,preprocessors,
# dataset_iterators,dataset_providers}.py at 69897df, with the core classes
# they use trimmed (no clu, etils, TFDS or usage logging).
AIRIO = r'''
import bisect
import copy
import dataclasses
import functools
import inspect
import itertools
import json
import pathlib
import time
import typing
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, Union

import grain.python as grain
import jax
import numpy as np

JaxRng = jax.Array

# ---- airio/_src/core/preprocessors.py (trimmed: no logging) ----
@dataclasses.dataclass(frozen=True)
class AirIOInjectedRuntimeArgs:
  sequence_lengths: Mapping[str, int]
  split: str
  batch_size: int | None

  def replace(self, **kwargs):
    return dataclasses.replace(self, **kwargs)


UpdateRuntimeArgsCallable = Callable[[AirIOInjectedRuntimeArgs], AirIOInjectedRuntimeArgs]


@dataclasses.dataclass
@typing.runtime_checkable
class CoreMapFnTransform(Protocol):
  map_fn: Callable[..., Any]
  runtime_args: AirIOInjectedRuntimeArgs | None = None
  update_runtime_args: UpdateRuntimeArgsCallable | None = None

  def map(self, element):
    ...


@dataclasses.dataclass
@typing.runtime_checkable
class CoreRandomMapFnTransform(Protocol):
  map_fn: Callable[..., Any]
  runtime_args: AirIOInjectedRuntimeArgs | None = None
  update_runtime_args: UpdateRuntimeArgsCallable | None = None

  def random_map(self, element, rng: np.random.Generator):
    ...


@dataclasses.dataclass
@typing.runtime_checkable
class CoreFilterFnTransform(Protocol):
  filter_fn: Callable[..., bool]
  runtime_args: AirIOInjectedRuntimeArgs | None = None
  update_runtime_args: UpdateRuntimeArgsCallable | None = None

  def filter(self, element) -> bool:
    ...


def inject_runtime_args_to_fn(fn, runtime_args):
  try:
    all_params = inspect.signature(fn).parameters
  except ValueError:
    return fn
  all_annotations = [(arg_name, param.annotation) for arg_name, param in all_params.items()]
  runtime_args_annotations = [ann for ann in all_annotations if ann[1] is AirIOInjectedRuntimeArgs]
  if not runtime_args_annotations:
    return fn
  if len(runtime_args_annotations) > 1:
    raise ValueError("Fn has multiple args annotated with AirIOInjectedRuntimeArgs, must"
                     f" have only one: {fn}, {runtime_args_annotations}")
  return functools.partial(fn, **{runtime_args_annotations[0][0]: runtime_args})


# ---- airio/_src/core/dataset_providers.py (trimmed) ----
@dataclasses.dataclass(frozen=True)
class ShardInfo:
  index: int
  num_shards: int


class Task:
  def __init__(self, name, source, preprocessors=None):
    self.name = name
    self.source = source
    self._preprocessors = list(preprocessors) if preprocessors is not None else None

  def get_preprocessors(self):
    if self._preprocessors is None:
      raise ValueError("Preprocessors have not been set on this task.")
    return list(self._preprocessors)

  def num_input_examples(self, split):
    return self.source.num_input_examples(split=split)


class Mixture:
  def __init__(self, name, tasks, proportions):
    self.name = name
    self._tasks_or_mixtures = tasks
    self._proportions = dict(zip(tasks, proportions))

  def get_proportion(self, task):
    prop = 0.0
    if task in self._proportions:
      prop += self._proportions[task]
    return prop

  @property
  def leaf_tasks(self):
    return list(self._tasks_or_mixtures)


# ---- airio/_src/pygrain/data_sources.py ----
Open = open


class JsonDataSource:
  """Wrapper for grain.InMemoryDataSource that uses json file(s) as input data."""

  def __init__(self, split_to_filepattern):
    self._split_to_filepattern = copy.deepcopy(split_to_filepattern)
    self.splits = frozenset(self._split_to_filepattern.keys())
    self._sources = {}
    for split in self.splits:
      json_data = json.load(Open(self._split_to_filepattern[split]))
      json_data = [json.dumps(d) for d in json_data]
      self._sources[split] = grain.InMemoryDataSource(elements=json_data)

  def get_data_source(self, split: str) -> grain.InMemoryDataSource:
    if split not in self._sources:
      raise ValueError(f'Split {split} not found in {self.splits}.')
    return self._sources[split]

  def num_input_examples(self, split: str) -> int:
    if split not in self._sources:
      raise ValueError(f'Split {split} not found in {self.splits}.')
    return len(self._sources[split])


class FunctionDataSource:
  """A `DataSource` that uses a function to provide the input data."""

  def __init__(self, dataset_fn, splits):
    self._dataset_fn = dataset_fn
    self.splits = copy.deepcopy(splits)

  def get_data_source(self, split: str) -> np.ndarray:
    ds = self._dataset_fn(split=split)
    return ds

  def num_input_examples(self, split: str) -> int:
    if split not in self.splits:
      raise ValueError(f'Split {split} not found in {self.splits}.')
    return self._dataset_fn(split=split).size


# ---- airio/_src/pygrain/lazy_dataset_transforms.py ----
T = typing.TypeVar("T")


@dataclasses.dataclass(frozen=False)
class ConcatLazyMapDataset(grain.MapDataset[T]):
  """Concats LazyMapDatasets."""

  def __init__(self, parents: Sequence[grain.MapDataset[T]]):
    super().__init__(parents)
    self._accumulated_lens = [0] + list(itertools.accumulate([len(p) for p in self.parents]))

  def __len__(self) -> int:
    return sum(len(p) for p in self.parents)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    parent_index = bisect.bisect_right(self._accumulated_lens, index) - 1
    local_index = index - self._accumulated_lens[parent_index]
    return self.parents[parent_index][local_index]


@dataclasses.dataclass(frozen=False)
class RandomMapFnLazyMapDataset(grain.MapDataset[T]):
  """LazyMapDataset for random map fns with jax rng key support."""

  parent: grain.MapDataset
  map_fn: Callable[[Any, JaxRng], Any]
  base_rng: JaxRng

  def __init__(self, parent, map_fn, base_rng):
    super().__init__([parent])
    self.parent = parent
    self.map_fn = map_fn
    self.base_rng = base_rng

  def __len__(self) -> int:
    return len(self.parent)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    element = self.parent[index]
    if element is None:
      return None
    rng = jax.random.fold_in(self.base_rng, index)
    return self.map_fn(element, rng)


# ---- airio/_src/pygrain/preprocessors.py ----
LazyDataset = grain.MapDataset | grain.IterDataset


@dataclasses.dataclass
class MapFnTransform(CoreMapFnTransform, grain.MapTransform):

  def map(self, element):
    return inject_runtime_args_to_fn(self.map_fn, self.runtime_args)(element)


@dataclasses.dataclass
class RandomMapFnTransform(CoreRandomMapFnTransform, grain.RandomMapTransform):

  def random_map(self, element, rng: np.random.Generator):
    jax_rng = jax.random.key(rng.integers(0, 2**16 - 1))
    return inject_runtime_args_to_fn(self.map_fn, self.runtime_args)(element, jax_rng)


@dataclasses.dataclass
class FilterFnTransform(CoreFilterFnTransform, grain.FilterTransform):

  def filter(self, element) -> bool:
    return inject_runtime_args_to_fn(self.filter_fn, self.runtime_args)(element)


@dataclasses.dataclass
class LazyMapTransform:
  transform: Callable[[grain.MapDataset, AirIOInjectedRuntimeArgs, JaxRng | None], grain.MapDataset]
  update_runtime_args: UpdateRuntimeArgsCallable
  produces_none_elements: bool
  requires_non_none_elements: bool

  def __call__(self, ds, runtime_args, rng):
    if not isinstance(ds, grain.MapDataset):
      raise ValueError(f"Cannot apply LazyMapDataset transform: {str(self.transform)} to"
                       f" non-LazyMapDataset dataset: {str(ds)}")
    return self.transform(ds, runtime_args, rng)


@dataclasses.dataclass
class LazyIterTransform:
  transform: Callable[[grain.IterDataset, AirIOInjectedRuntimeArgs, JaxRng | None], grain.IterDataset]
  update_runtime_args: UpdateRuntimeArgsCallable

  def __call__(self, ds, runtime_args, rng):
    if not isinstance(ds, grain.IterDataset):
      raise ValueError(f"Cannot apply LazyIterDataset transform: {str(self.transform)} to"
                       f" non-LazyIterDataset dataset: {str(ds)}")
    return self.transform(ds, runtime_args, rng)


FnTransforms = MapFnTransform | RandomMapFnTransform | FilterFnTransform
LazyTransforms = LazyMapTransform | LazyIterTransform
PyGrainAirIOPreprocessor = grain.Transformation | LazyTransforms


@dataclasses.dataclass
class LazyDatasetTransform:
  transform: PyGrainAirIOPreprocessor

  def __post_init__(self):
    if not isinstance(self.transform, PyGrainAirIOPreprocessor):
      raise ValueError(f"{str(self.transform)} is not supported")
    if isinstance(self.transform, grain.RandomMapTransform) and not isinstance(self.transform, RandomMapFnTransform):
      raise ValueError(f"{str(self.transform)} is not reproducible. Use"
                       " airio.preprocessors.RandomMapFnTransform instead.")

  def get_updated_runtime_args(self, runtime_args):
    if hasattr(self.transform, "update_runtime_args") and self.transform.update_runtime_args:
      return self.transform.update_runtime_args(runtime_args)
    if isinstance(self.transform, LazyTransforms):
      return self.transform.update_runtime_args(runtime_args)
    return runtime_args

  @property
  def produces_none_elements(self) -> bool:
    if isinstance(self.transform, grain.FilterTransform):
      return True
    if isinstance(self.transform, LazyMapTransform):
      return self.transform.produces_none_elements
    return False

  @property
  def requires_non_none_elements(self) -> bool:
    if isinstance(self.transform, LazyMapTransform):
      return self.transform.requires_non_none_elements
    return isinstance(self.transform, grain.Batch)

  @property
  def can_process_iter_dataset(self) -> bool:
    return not isinstance(self.transform, LazyMapTransform)

  @property
  def requires_iter_dataset(self) -> bool:
    return isinstance(self.transform, LazyIterTransform)

  def __call__(self, ds, rng=None, runtime_args=None):
    if isinstance(self.transform, FnTransforms):
      self.transform.runtime_args = runtime_args
    match self.transform:
      case grain.MapTransform():
        return ds.map(self.transform)
      case RandomMapFnTransform():
        if not isinstance(ds, grain.MapDataset):
          raise ValueError("RandomMapFnTransform is not yet supported for"
                           " non-LazyMapDatasets. Please file a bug with the AirIO team.")
        if rng is None:
          rng = jax.random.key(np.int32(time.time()))
        map_fn = inject_runtime_args_to_fn(self.transform.map_fn, runtime_args)
        return RandomMapFnLazyMapDataset(ds, map_fn=map_fn, base_rng=rng)
      case grain.FilterTransform():
        return ds.filter(self.transform)
      case grain.Batch():
        return ds.batch(batch_size=self.transform.batch_size, drop_remainder=self.transform.drop_remainder)
      case LazyMapTransform():
        return self.transform(ds, runtime_args, rng)
      case LazyIterTransform():
        return self.transform(ds, runtime_args, rng)
      case _:
        raise ValueError("%s is not supported" % str(self.transform))


# ---- airio/_src/pygrain/dataset_iterators.py (no clu / asynclib / epath) ----
class PyGrainDatasetIteratorWrapper:
  """Wrapper iterator for grain.PyGrainDatasetIterator."""

  def __init__(self, data_loader):
    self._data_loader = data_loader
    self._iterator = data_loader.__iter__()
    self._state_as_dict = isinstance(self._data_loader, LazyDataset)
    self._peek = None
    self._next_idx = 0
    self._stop_after = None

  def __iter__(self):
    return self

  def __next__(self):
    if self._stop_after is not None and self._next_idx >= self._stop_after:
      raise StopIteration()
    self._next_idx += 1
    return next(self._iterator)

  @property
  def element_spec(self):
    local_iter = iter(self._data_loader)
    first_element = next(local_iter)
    element_spec = {}
    for k, v in first_element.items():
      if isinstance(v, np.ndarray):
        element_spec[k] = (v.dtype.str, tuple(v.shape))
    return element_spec

  def peek(self):
    if self._peek is None:
      local_iter = iter(self._data_loader)
      self._peek = next(local_iter)
    return self._peek

  def get_state(self):
    if self._state_as_dict:
      return self._iterator.get_state()
    return json.loads(self._iterator.get_state().decode())

  def set_state(self, state):
    if not self._state_as_dict:
      state = json.dumps(state, indent=4).encode()
    self._iterator.set_state(state)

  def save(self, filename):
    filename = pathlib.Path(filename)
    filename.write_text(json.dumps(self.get_state(), indent=4))

  def restore(self, filename):
    filename = pathlib.Path(filename)
    if not filename.exists():
      raise ValueError(f"File {filename} does not exist.")
    self.set_state(json.loads(filename.read_text()))

  def take(self, num_elements: int):
    if self._stop_after is None:
      self._stop_after = num_elements
      return self
    if self._stop_after >= num_elements:
      self._stop_after = num_elements
    return self


# ---- airio/_src/pygrain/dataset_providers.py ----
DEFAULT_NUM_RECORDS_TO_INSPECT = 2
MAX_NUM_RECORDS_TO_INSPECT = 1000
GrainDataSource = grain.RandomAccessDataSource


class GrainTask(Task):
  """A class to manage a dataset and its related metrics."""

  def _get_data_source_for_split(self, split: str) -> GrainDataSource:
    if self.source is None:
      raise ValueError("Source has not been set on this task object.")
    return self.source.get_data_source(split=split)

  def _switch_to_lazy_dataset(self, runtime_preprocessors=None):
    preps = self.get_preprocessors()
    if runtime_preprocessors:
      preps.extend(runtime_preprocessors)
    for preprocessor in preps:
      if not isinstance(preprocessor, grain.Transformation):
        return True
      if isinstance(preprocessor, FnTransforms) and preprocessor.update_runtime_args:
        return True
    return False

  def get_lazy_dataset(self, sequence_lengths, split, runtime_preprocessors, batch_size, shuffle, seed,
                       shard_info, num_epochs, num_prefetch_threads):
    ds = grain.MapDataset.source(self._get_data_source_for_split(split=split))
    if shard_info:
      start, end = _even_split(len(ds), shard_index=shard_info.index, shard_count=shard_info.num_shards)
      ds = ds[start:end]
    if num_epochs:
      dss = [ds] * num_epochs
    else:
      dss = [ds]
    preps = self._preprocessors
    updated_runtime_args = AirIOInjectedRuntimeArgs(sequence_lengths=sequence_lengths, split=split,
                                                    batch_size=batch_size)
    preprocessed_dss = []
    has_none_elems = False
    next_epoch_rng = jax.random.key(seed)
    for ds in dss:
      ds_runtime_args = AirIOInjectedRuntimeArgs(sequence_lengths=sequence_lengths, split=split,
                                                 batch_size=batch_size)
      next_epoch_rng, prep_rng = jax.random.split(next_epoch_rng)
      prep_rng, shuffle_rng = jax.random.split(prep_rng)
      ds, updated_runtime_args, has_none_elems = _apply_preprocessors_to_lazy_dataset(
          ds, preps, ds_runtime_args, prep_rng, has_none_elems, num_prefetch_threads, self.name)
      if shuffle:
        shuffle_seed = int(jax.random.randint(shuffle_rng, [], 0, 2**16 - 1))
        ds = ds.shuffle(seed=shuffle_seed)
      preprocessed_dss.append(ds)
    runtime_args = updated_runtime_args
    if len(preprocessed_dss) == 1:
      ds = preprocessed_dss[0]
    else:
      ds = ConcatLazyMapDataset(preprocessed_dss)
    runtime_preps = []
    if runtime_preprocessors:
      runtime_preps.extend(runtime_preprocessors)
    if batch_size:
      runtime_preps.append(grain.Batch(batch_size=batch_size, drop_remainder=False))
    unused_next_epoch_rng, prep_rng = jax.random.split(next_epoch_rng)
    ds, _, _ = _apply_preprocessors_to_lazy_dataset(
        ds, runtime_preps, runtime_args, prep_rng, has_none_elems, num_prefetch_threads, self.name)
    return ds

  def get_dataset(self, sequence_lengths=None, split="train", runtime_preprocessors=None, batch_size=None,
                  shuffle=True, seed=0, shard_info=None, num_epochs=1, num_prefetch_threads=None,
                  num_workers=0):
    if self._switch_to_lazy_dataset(runtime_preprocessors):
      ds = self.get_lazy_dataset(sequence_lengths=sequence_lengths, split=split,
                                 runtime_preprocessors=runtime_preprocessors, batch_size=batch_size,
                                 shuffle=shuffle, seed=seed, shard_info=shard_info, num_epochs=num_epochs,
                                 num_prefetch_threads=num_prefetch_threads)
      if num_epochs is None:
        ds = ds.repeat(num_epochs=None)
      ds = _iter_and_prefetch(ds, num_workers=num_workers, num_prefetch_threads=num_prefetch_threads)
      return PyGrainDatasetIteratorWrapper(data_loader=ds)
    if shard_info is None:
      shard_options = grain.NoSharding()
    else:
      shard_options = grain.ShardOptions(shard_index=shard_info.index, shard_count=shard_info.num_shards)
    sampler = grain.IndexSampler(num_records=self.num_input_examples(split=split), shard_options=shard_options,
                                 shuffle=shuffle, num_epochs=num_epochs, seed=seed)
    source = self._get_data_source_for_split(split=split)
    ops = self.get_preprocessors()
    if runtime_preprocessors:
      ops.extend(runtime_preprocessors)
    if batch_size:
      ops.append(grain.Batch(batch_size=batch_size, drop_remainder=False))
    runtime_args = AirIOInjectedRuntimeArgs(sequence_lengths=sequence_lengths, split=split,
                                            batch_size=batch_size)
    for op in ops:
      if isinstance(op, FnTransforms):
        op.runtime_args = runtime_args
    return self._load_data(source=source, sampler=sampler, ops=ops, num_prefetch_threads=num_prefetch_threads,
                           num_workers=num_workers)

  def _load_data(self, source, sampler, ops, num_prefetch_threads=None, num_workers=0):
    ds = grain.DataLoader(data_source=source, sampler=sampler, operations=ops, worker_count=num_workers,
                          read_options=_get_read_options(num_prefetch_threads))
    return PyGrainDatasetIteratorWrapper(data_loader=ds)

  def get_dataset_by_step(self, num_records=DEFAULT_NUM_RECORDS_TO_INSPECT, sequence_lengths=None, split="train",
                          runtime_preprocessors=None, batch_size=None, shuffle=True, seed=0):
    if num_records < 1:
      num_records = DEFAULT_NUM_RECORDS_TO_INSPECT
    elif num_records > MAX_NUM_RECORDS_TO_INSPECT:
      num_records = MAX_NUM_RECORDS_TO_INSPECT
    sampler = grain.IndexSampler(num_records=num_records, shard_options=grain.NoSharding(), shuffle=shuffle,
                                 num_epochs=1, seed=seed)
    source = self._get_data_source_for_split(split=split)
    all_ops = self.get_preprocessors()
    if runtime_preprocessors:
      all_ops.extend(runtime_preprocessors)
    if batch_size:
      all_ops.append(grain.Batch(batch_size=batch_size, drop_remainder=False))
    records_step0 = self._load_data(source=source, sampler=sampler, ops=[])
    accumulated_result = [list(records_step0)]
    if not all_ops:
      return accumulated_result
    runtime_args = AirIOInjectedRuntimeArgs(sequence_lengths=sequence_lengths, split=split,
                                            batch_size=batch_size)
    accumulated_ops = []
    for op in all_ops:
      if isinstance(op, FnTransforms):
        op.runtime_args = runtime_args
      accumulated_ops.append(op)
      records_next_step = self._load_data(source=source, sampler=sampler, ops=accumulated_ops)
      accumulated_result.append(list(records_next_step))
    return accumulated_result

  def get_updated_runtime_args(self, runtime_args, runtime_preprocessors):
    preps = self._preprocessors
    if runtime_preprocessors:
      preps.extend(runtime_preprocessors)
    for prep in preps:
      transform = LazyDatasetTransform(prep)
      runtime_args = transform.get_updated_runtime_args(runtime_args)
    return runtime_args

  @functools.cached_property
  def produces_none_elements(self) -> bool:
    return any([LazyDatasetTransform(prep).produces_none_elements for prep in self._preprocessors])


class GrainMixture(Mixture):
  """A class for mixture of Tasks."""

  def get_lazy_dataset(self, sequence_lengths=None, split="train", runtime_preprocessors=None, batch_size=None,
                       shuffle=True, seed=0, shard_info=None, num_epochs=1, num_prefetch_threads=None):
    if num_epochs is None and shuffle:
      raise ValueError("Repeating indefinitely with shuffling turned on isn't supported.")
    datasets = []
    proportions = []
    for task in self.leaf_tasks:
      if not isinstance(task, GrainTask):
        raise ValueError(f"Task {task} is not a GrainTask.")
      datasets.append(task.get_lazy_dataset(sequence_lengths=sequence_lengths, split=split,
                                            runtime_preprocessors=None, batch_size=None, shuffle=shuffle,
                                            seed=seed, shard_info=shard_info, num_epochs=num_epochs,
                                            num_prefetch_threads=num_prefetch_threads))
      proportions.append(self.get_proportion(task))
    use_mix_iter = any([isinstance(ds, grain.IterDataset) for ds in datasets])
    use_mix_iter = use_mix_iter or any([typing.cast(GrainTask, task).produces_none_elements
                                        for task in self.leaf_tasks])
    if use_mix_iter:
      read_options = _get_read_options(num_prefetch_threads)
      datasets = [ds.to_iter_dataset(read_options) if isinstance(ds, grain.MapDataset) else ds
                  for ds in datasets]
      ds = grain.IterDataset.mix(datasets, proportions)
    else:
      ds = grain.MapDataset.mix(datasets, proportions)
    post_mix_preps = []
    if runtime_preprocessors:
      post_mix_preps.extend(runtime_preprocessors)
    if batch_size:
      post_mix_preps.append(grain.Batch(batch_size=batch_size, drop_remainder=False))
    runtime_args = AirIOInjectedRuntimeArgs(sequence_lengths=sequence_lengths, split=split,
                                            batch_size=batch_size)
    if isinstance(self.leaf_tasks[0], GrainTask):
      runtime_args = self.leaf_tasks[0].get_updated_runtime_args(runtime_args, runtime_preprocessors=None)
    base_rng = jax.random.key(seed)
    post_mix_rng, _ = jax.random.split(base_rng)
    ds, _, _ = _apply_preprocessors_to_lazy_dataset(
        ds, post_mix_preps, runtime_args, post_mix_rng, has_none_elems=False,
        num_prefetch_threads=num_prefetch_threads, name=self.name)
    if num_epochs is None:
      ds = ds.repeat(num_epochs=None)
    return ds

  def get_dataset(self, sequence_lengths=None, split="train", runtime_preprocessors=None, batch_size=None,
                  shuffle=True, seed=0, shard_info=None, num_epochs=1, num_prefetch_threads=None, num_workers=0):
    ds = self.get_lazy_dataset(sequence_lengths=sequence_lengths, split=split,
                               runtime_preprocessors=runtime_preprocessors, batch_size=batch_size,
                               shuffle=shuffle, seed=seed, shard_info=shard_info, num_epochs=num_epochs,
                               num_prefetch_threads=num_prefetch_threads)
    ds = _iter_and_prefetch(ds, num_workers=num_workers, num_prefetch_threads=num_prefetch_threads)
    return PyGrainDatasetIteratorWrapper(data_loader=ds)


def _even_split(num_examples, shard_index, shard_count):
  examples_per_shard = num_examples // shard_count
  shard_start = examples_per_shard * shard_index
  shard_end = examples_per_shard * (shard_index + 1)
  num_unused_examples = num_examples % shard_count
  if num_unused_examples > 0:
    shard_start += min(shard_index, num_unused_examples)
    shard_end += min(shard_index + 1, num_unused_examples)
  return shard_start, shard_end


def _get_read_options(num_prefetch_threads):
  if num_prefetch_threads:
    return grain.ReadOptions(num_threads=num_prefetch_threads)
  return grain.ReadOptions()


def _iter_and_prefetch(ds, num_workers, num_prefetch_threads):
  if not isinstance(ds, grain.IterDataset):
    ds = ds.to_iter_dataset(_get_read_options(num_prefetch_threads))
  if num_workers and num_workers > 0:
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  return ds


def _apply_preprocessors_to_lazy_dataset(ds, preps, runtime_args, base_rng, has_none_elems,
                                         num_prefetch_threads, name):
  prep_rng = base_rng
  for prep in preps:
    transform = LazyDatasetTransform(prep)
    if transform.requires_iter_dataset and isinstance(ds, grain.MapDataset):
      ds = ds.to_iter_dataset(_get_read_options(num_prefetch_threads))
    if has_none_elems and transform.requires_non_none_elements and isinstance(ds, grain.MapDataset):
      if not transform.can_process_iter_dataset:
        raise ValueError(
            "There are preprocessors in this Task / Mixture that produce none"
            " elements and a preprocessor which requires a non-none dataset."
            " Consider replacing this with a preprocessor that can either"
            " handle none elements, or process a LazyIterDataset. Task name:"
            f" {name}, preprocessor: {prep}")
      ds = ds.to_iter_dataset(_get_read_options(num_prefetch_threads))
    if transform.produces_none_elements:
      has_none_elems = True
    prep_rng, sub_rng = jax.random.split(prep_rng)
    ds = transform(ds, sub_rng, runtime_args)
    runtime_args = transform.get_updated_runtime_args(runtime_args)
  return ds, runtime_args, has_none_elems
'''

# The client's tasks (in airio's dataset_providers_test style) and the harness.
AIRIO_TASKS = r'''

# ---- the client's tasks (airio's dataset_providers_test style), on local data ----
def P(x):
  if isinstance(x, dict):
    return {k: P(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [P(v) for v in x]
  if isinstance(x, (np.ndarray, np.generic)):
    return x.tolist()
  return x


def tokenize(ex, runtime_args: AirIOInjectedRuntimeArgs):
  n = runtime_args.sequence_lengths["inputs"]
  ids = [ord(c) % 26 + 1 for c in ex["text"] if c != " "][:n]
  return {"id": ex["id"], "inputs": np.array(ids + [0] * (n - len(ids)), np.int32)}


def nonempty(ex):
  return bool(ex["inputs"].any())


def fn_src(split):
  return np.arange(10 if split == "train" else 4)


def to_ex(x):
  return {"idx": np.int64(x), "val": np.int64(x) * 10}


def jitter(ex, rng):
  return {**ex, "noise": np.int64(jax.random.randint(rng, [], 0, 1000))}


def drop_multiples_of_three(ds, runtime_args, rng):
  return ds.filter(lambda ex: ex["idx"] % 3 != 0)


def make_json_task(train_json, validation_json):
  return GrainTask("imdb", source=JsonDataSource({"train": train_json, "validation": validation_json}),
                   preprocessors=[MapFnTransform(json.loads), MapFnTransform(tokenize), FilterFnTransform(nonempty)])


def make_lazy_task(with_filter=True):
  preps = [MapFnTransform(to_ex), RandomMapFnTransform(jitter)]
  if with_filter:
    preps.append(LazyMapTransform(drop_multiples_of_three, update_runtime_args=lambda a: a,
                                  produces_none_elements=True, requires_non_none_elements=False))
  return GrainTask("fn", source=FunctionDataSource(fn_src, ["train", "validation"]), preprocessors=preps)


def simple_task(i, n):
  return GrainTask(f"t{i}", source=FunctionDataSource(lambda split: np.arange(n), ["train"]),
                   preprocessors=[MapFnTransform(lambda x: {"idx": np.int64(i), "val": np.int64(x)})])


def read_with_states(make):
  """The wrapper's state before every element; each restored (through a file) on a fresh wrapper."""
  it = make()
  states, ref = [], []
  while True:
    states.append(it.get_state())
    try:
      ref.append(P(next(it)))
    except StopIteration:
      break
  ok = []
  for k, state in enumerate(states):
    fresh = make()
    path = pathlib.Path(STATE_DIR) / f"state_{k}.json"
    it.set_state(state)
    it.save(path)
    fresh.restore(path)
    ok.append(P(list(fresh)) == ref[k:])
  return ref, ok, states
'''

AIRIO_IN_PROCESS = r'''

results = {}
json_task = make_json_task(TRAIN_JSON, VALIDATION_JSON)
seq = {"inputs": 5}
results["switch_to_lazy"] = [json_task._switch_to_lazy_dataset(), make_lazy_task()._switch_to_lazy_dataset()]
results["num_input_examples"] = [json_task.num_input_examples("train"), json_task.num_input_examples("validation")]
make = lambda: json_task.get_dataset(sequence_lengths=seq, split="train", batch_size=2, shuffle=True, seed=7,
                                     num_epochs=2)
ref, ok, states = read_with_states(make)
results["json_stream"], results["json_restores"] = ref, ok
results["json_state_2"] = {k: v for k, v in states[2].items() if k != "data_source"}
results["json_state_names_source"] = states[2]["data_source"] == repr(json_task.source.get_data_source("train"))
wrapper = make()
results["element_spec"] = P(wrapper.element_spec)
results["peek"] = P(wrapper.peek())
results["take"] = P(list(make().take(3)))
results["validation"] = P(list(json_task.get_dataset(sequence_lengths=seq, split="validation", shuffle=False)))
results["by_step"] = P(json_task.get_dataset_by_step(num_records=3, sequence_lengths=seq, shuffle=False,
                                                      batch_size=2))
try:
  json_task.get_dataset(split="test")
except ValueError as e:
  results["unknown_split"] = str(e).startswith("Split test not found")
# A state restored into the same task built again: another InMemoryDataSource (another
# shared-memory name in its repr, which the DataLoader state records).
other = make_json_task(TRAIN_JSON, VALIDATION_JSON)
fresh = other.get_dataset(sequence_lengths=seq, split="train", batch_size=2, shuffle=True, seed=7, num_epochs=2)
try:
  fresh.set_state(states[2])
  results["rebuilt_task"] = P(list(fresh))
except ValueError as e:
  results["rebuilt_task"] = ["ValueError", str(e).startswith(
      "DataSource in checkpoint does not match datasource in dataloader.")]

lazy = make_lazy_task()
make = lambda: lazy.get_dataset(split="train", batch_size=3, shuffle=True, seed=94043, num_epochs=2)
results["lazy_kind"] = [isinstance(lazy.get_lazy_dataset(None, "train", None, b, True, 94043, None, 2, None), c)
                       for b, c in ((3, grain.IterDataset), (None, grain.MapDataset))]
ref, ok, states = read_with_states(make)
results["lazy_stream"], results["lazy_restores"] = ref, ok
nofilter = make_lazy_task(with_filter=False)
ld = nofilter.get_lazy_dataset(None, "train", None, None, True, 5, ShardInfo(1, 3), 2, None)
results["lazy_map"] = [len(ld), repr(ld)[:40], P(ld[2]), P(list(ld[1:4]))]
results["lazy_repeat"] = P(list(itertools.islice(make_lazy_task().get_dataset(split="validation", shuffle=False,
                                                                               num_epochs=None), 7)))

t1, t2 = simple_task(1, 5), simple_task(2, 5)
mix = GrainMixture("test_mix", [t1, t2], [2.0, 1.0])
results["mix"] = P(list(mix.get_dataset(shuffle=False)))
results["mix_shard"] = P(list(mix.get_dataset(shuffle=False, shard_info=ShardInfo(index=0, num_shards=2))))
make = lambda: mix.get_dataset(shuffle=True, seed=42, num_epochs=2, batch_size=2)
ref, ok, _ = read_with_states(make)
results["mix_shuffled"], results["mix_shuffled_restores"] = ref, ok
results["mix_repeat"] = P(list(itertools.islice(mix.get_dataset(shuffle=False, num_epochs=None), 9)))
iter_mix = GrainMixture("iter_mix", [t1, make_lazy_task()], [1.0, 1.0])
make = lambda: iter_mix.get_dataset(shuffle=True, seed=3, num_epochs=1)
ref, ok, _ = read_with_states(make)
results["iter_mix"], results["iter_mix_restores"] = ref, ok

class Flip(grain.RandomMapTransform):
  def random_map(self, element, rng):
    return element

errors = {}
for name, call in {
    "shuffled_endless_mixture": lambda: mix.get_dataset(shuffle=True, num_epochs=None),
    "not_reproducible": lambda: LazyDatasetTransform(Flip()),
    "not_supported": lambda: LazyDatasetTransform("lowercase"),
    "requires_non_none": lambda: GrainTask("bad", FunctionDataSource(fn_src, ["train"]), [
        LazyMapTransform(lambda ds, *_: ds, update_runtime_args=lambda a: a, produces_none_elements=True,
                         requires_non_none_elements=False),
        LazyMapTransform(lambda ds, *_: ds, update_runtime_args=lambda a: a, produces_none_elements=True,
                         requires_non_none_elements=True)]).get_dataset(),
    "iter_transform_on_map": lambda: LazyIterTransform(lambda ds, *_: ds, lambda a: a)(
        grain.MapDataset.range(3), None, None),
}.items():
  try:
    call()
    errors[name] = None
  except Exception as e:  # the client's own errors, raised from what Grain answers
    errors[name] = [type(e).__name__, str(e).split(":")[0].split("> ")[-1][:60]]
results["errors"] = errors
for task in (json_task, other):
  for split in ("train", "validation"):
    shm = task.source.get_data_source(split)
    shm.shm.close()
    shm.shm.unlink()
'''

AIRIO_WORKERS_MAIN = r'''

if __name__ == "__main__":
  import sys
  from absl import flags
  flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.
  TRAIN_JSON, VALIDATION_JSON, STATE_DIR = sys.argv[1:4]
  json_task = make_json_task(TRAIN_JSON, VALIDATION_JSON)
  out = {}
  # A preprocessor that updates the runtime args sends the task down the lazy path (mp_prefetch).
  lazy = GrainTask("fn", source=FunctionDataSource(fn_src, ["train"]), preprocessors=[
      MapFnTransform(to_ex, update_runtime_args=lambda a: a), RandomMapFnTransform(jitter)])
  out["sampler_order"] = [grain.IndexSampler(num_records=7, shard_options=grain.NoSharding(), shuffle=True,
                                             num_epochs=1, seed=7)[i].record_key for i in range(7)]
  seq = {"inputs": 5}
  for workers in (0, 2):
    make = lambda: json_task.get_dataset(sequence_lengths=seq, split="train", shuffle=True, seed=7, num_epochs=1,
                                         num_workers=workers)
    it = make()
    head = [P(next(it)) for _ in range(2)]
    state = it.get_state()
    out[f"json/{workers}"] = head + P(list(it))
    fresh = make()
    fresh.set_state(state)
    out[f"json_resumed/{workers}"] = P(list(fresh))
    out[f"lazy/{workers}"] = P(list(lazy.get_dataset(split="train", batch_size=2, shuffle=True, seed=5,
                                                     num_epochs=2, num_workers=workers)))
  for split in ("train", "validation"):
    shm = json_task.source.get_data_source(split)
    shm.shm.close()
    shm.shm.unlink()
  print(json.dumps(out))
'''

REVIEWS = ["a great film", "   ", "bad", "the plot was thin", "ok", "loved it", "so so"]


def write_airio_json(directory) -> tuple[str, str]:
  """The train / validation splits as the JSON lists JsonDataSource reads (record 1 tokenizes to nothing)."""
  train, validation = os.path.join(directory, "train.json"), os.path.join(directory, "validation.json")
  with open(train, "w", encoding="utf-8") as f:
    json.dump([{"id": i, "text": t} for i, t in enumerate(REVIEWS)], f)
  with open(validation, "w", encoding="utf-8") as f:
    json.dump([{"id": 100 + i, "text": t} for i, t in enumerate(["fine", "worst ever"])], f)
  return train, validation


def test_airio_tasks_mixtures_and_iterator_wrapper_as_on_grain(tmp_path):
  """airio: GrainTask's DataLoader and lazy paths, GrainMixture, the wrapper's states, airio's own errors."""
  train, validation = write_airio_json(tmp_path)
  g, l = (porting.run(AIRIO + AIRIO_TASKS + AIRIO_IN_PROCESS, lib, TRAIN_JSON=train, VALIDATION_JSON=validation,
                      STATE_DIR=str(tmp_path)).results for lib in porting.LIBS)
  gc.collect()
  assert porting.grain_keys(l) == porting.grain_keys(g)
  # Only the JSON task's DataLoader states carry the source's repr (its shared-memory name): taken out above.
  assert g["json_state_names_source"] and l["json_state_names_source"]
  assert g["switch_to_lazy"] == [False, True] and g["num_input_examples"] == [7, 2]
  # Two epochs of 6 tokenized reviews (the blank one filtered out), batches of 2.
  stream = g["json_stream"]
  assert len(stream) == 6 and sorted(i for b in stream for i in b["id"]) == sorted([0, 2, 3, 4, 5, 6] * 2)
  assert g["json_restores"] == [True] * 7 and g["json_state_2"]["last_seen_indices"] == {"0": 4}
  assert g["element_spec"] == {"id": ["<i8", [2]], "inputs": ["<i4", [2, 5]]}
  assert g["peek"] == stream[0] and g["take"] == stream[:3]
  assert [len(step) for step in g["by_step"]] == [3, 3, 3, 2, 1]  # raw, parsed, tokenized, filtered, batched
  assert g["unknown_split"] is True
  # The same task built again has a new InMemoryDataSource: its repr (shared-memory name) differs.
  assert g["rebuilt_task"] == ["ValueError", True]
  # Lazy path: 6 of the 10 records a epoch (multiples of 3 dropped), two epochs, batches of 3.
  assert [len(b["idx"]) for b in g["lazy_stream"]] == [3, 3, 3, 3] and g["lazy_restores"] == [True] * 5
  assert g["lazy_kind"] == [True, True] and g["lazy_map"][:2] == [6, "ConcatLazyMapDataset()"]
  assert [e["idx"] for e in g["lazy_repeat"]] == [1, 2] * 3 + [1]
  # airio's test_simple_mixture_stop_on_empty and test_mixture_sharding expectations.
  assert [(e["idx"], e["val"]) for e in g["mix"]] == [(1, 0), (1, 1), (2, 0), (1, 2), (1, 3), (2, 1), (1, 4)]
  assert [(e["idx"], e["val"]) for e in g["mix_shard"]] == [(1, 0), (1, 1), (2, 0), (1, 2)]
  assert g["mix_shuffled_restores"] == [True] * 9 and g["iter_mix_restores"] == [True] * 11
  assert [(e["idx"], e["val"]) for e in g["mix_repeat"]][7:] == [(1, 0), (2, 2)]
  assert {k: v[0] for k, v in g["errors"].items()} == dict.fromkeys(g["errors"], "ValueError")


@pytest.mark.timeout(240)
def test_airio_get_dataset_with_worker_processes(tmp_path):
  """airio: get_dataset(num_workers=2): the InMemoryDataSource DataLoader and the lazy path's mp_prefetch."""
  train, validation = write_airio_json(tmp_path)
  g, l = (porting.run_script(AIRIO + AIRIO_TASKS + AIRIO_WORKERS_MAIN, lib, tmp_path, train, validation,
                             str(tmp_path), timeout=150) for lib in porting.LIBS)
  no_workers = g["json/0"]
  assert [r["id"] for r in no_workers] == [i for i in g["sampler_order"] if i != 1]
  assert l["json/0"] == l["json/2"] == no_workers
  # Grain 0.2.18: worker k reads sampler positions k, k + 2, ..., drops the blank review itself, and the
  # workers' records alternate; README (DataLoader): loader's stream is the one with no workers.
  shares = [[i for i in g["sampler_order"][k::2] if i != 1] for k in (0, 1)]
  interleaved = [i for pair in zip(*shares) for i in pair] + shares[0][len(shares[1]):] + shares[1][len(shares[0]):]
  assert [r["id"] for r in g["json/2"]] == interleaved != [r["id"] for r in no_workers]
  assert porting.same_multiset(g["json/2"], no_workers)
  # Each library resumes its own stream after two records.
  assert g["json_resumed/0"] == l["json_resumed/0"] == l["json_resumed/2"] == no_workers[2:]
  assert g["json_resumed/2"] == g["json/2"][2:]
  # The lazy path batches in the MapDataset before mp_prefetch: whole batches, the same on both.
  assert g["lazy/0"] == g["lazy/2"] == l["lazy/0"] == l["lazy/2"] and len(g["lazy/0"]) == 10


# ---------------------------------------------------------------------------
# jax-ml/jax-ai-stack: docs/source/data_loaders_for_multi_device_setups_with_jax.md
# ---------------------------------------------------------------------------

# The page's JAX cells and its Grain section (d5b1e71) as written, sizes shrunk
# (784 pixels -> 16, layers [16, 8, 10], batch 128 -> 8, 8 epochs -> 2) and
# torchvision's MNIST replaced by a stand-in with its `(PIL image, label)`
# indexing; `print`s kept in `log` without their timings.
MULTI_DEVICE_TUTORIAL = r'''
import jax
import jax.numpy as jnp
from jax import grad, jit, vmap, random, device_put
from jax.sharding import Mesh, PartitionSpec, NamedSharding

def random_layer_params(m, n, key, scale=1e-2):
  w_key, b_key = random.split(key)
  return scale * random.normal(w_key, (n, m)), scale * random.normal(b_key, (n,))

def init_network_params(sizes, key):
  keys = random.split(key, len(sizes))
  return [random_layer_params(m, n, k) for m, n, k in zip(sizes[:-1], sizes[1:], keys)]

layer_sizes = [16, 8, 10]
step_size = 0.01
num_epochs = 2
batch_size = 8
n_targets = 10
num_pixels = 4 * 4
data_dir = '/tmp/mnist_dataset'

params = init_network_params(layer_sizes, random.PRNGKey(0))

from jax.scipy.special import logsumexp

def relu(x):
  return jnp.maximum(0, x)

def predict(params, image):
  activations = image
  for w, b in params[:-1]:
    outputs = jnp.dot(w, activations) + b
    activations = relu(outputs)
  final_w, final_b = params[-1]
  logits = jnp.dot(final_w, activations) + final_b
  return logits - logsumexp(logits)

batched_predict = vmap(predict, in_axes=(None, 0))

num_devices = len(jax.devices())
devices = jax.devices()
mesh = Mesh(devices, ('device',))
sharding_spec = PartitionSpec('device')

import time

def one_hot(x, k, dtype=jnp.float32):
  return jnp.array(x[:, None] == jnp.arange(k), dtype)

def accuracy(params, images, targets):
  target_class = jnp.argmax(targets, axis=1)
  predicted_class = jnp.argmax(batched_predict(params, images), axis=1)
  return jnp.mean(predicted_class == target_class)

def loss(params, images, targets):
  preds = batched_predict(params, images)
  return -jnp.mean(preds * targets)

@jit
def update(params, x, y):
  grads = grad(loss)(params, x, y)
  return [(w - step_size * dw, b - step_size * db)
          for (w, b), (dw, db) in zip(params, grads)]

def reshape_and_one_hot(x, y):
    x = jnp.reshape(x, (len(x), num_pixels))
    y = one_hot(y, n_targets)
    return x, y

log = []
seen = []

def train_model(num_epochs, params, training_generator, data_loader_type='streamed'):
    for epoch in range(num_epochs):
        start_time = time.time()
        for x, y in training_generator() if data_loader_type == 'streamed' else training_generator:
            seen.append((x.tolist(), y.tolist()))
            x, y = reshape_and_one_hot(x, y)
            x, y = device_put(x, NamedSharding(mesh, sharding_spec)), device_put(y, NamedSharding(mesh, sharding_spec))
            params = update(params, x, y)
        log.append(f"Epoch {epoch + 1}: "
                   f"Train Accuracy: {accuracy(params, train_images, train_labels):.4f},"
                   f"Test Accuracy: {accuracy(params, test_images, test_labels):.4f}")
    return params

import numpy as np
import grain.python as pygrain


class MNIST:  # torchvision.datasets.MNIST stand-in: (image, label) pairs of 4x4 uint8 "images"
    def __init__(self, root, download=False, train=True):
        n = 20 if train else 6
        rng = np.random.default_rng(0 if train else 1)
        self._images = rng.integers(0, 256, size=(n, 4, 4), dtype=np.uint8)
        self._labels = rng.integers(0, 10, size=n)

    def __len__(self):
        return len(self._images)

    def __getitem__(self, index):
        return self._images[index], int(self._labels[index])


class Dataset:
    def __init__(self, data_dir, train=True):
        self.data_dir = data_dir
        self.train = train
        self.load_data()

    def load_data(self):
        self.dataset = MNIST(self.data_dir, download=True, train=self.train)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        img, label = self.dataset[index]
        return np.ravel(np.array(img, dtype=np.float32)), label

mnist_dataset = Dataset(data_dir)

train_images = jnp.array([mnist_dataset[i][0] for i in range(len(mnist_dataset))], dtype=jnp.float32)
train_labels = one_hot(np.array([mnist_dataset[i][1] for i in range(len(mnist_dataset))]), n_targets)

mnist_dataset_test = MNIST(data_dir, download=True, train=False)

test_images = jnp.array([np.ravel(np.array(mnist_dataset_test[i][0], dtype=np.float32)) for i in range(len(mnist_dataset_test))], dtype=jnp.float32)
test_labels = one_hot(np.array([mnist_dataset_test[i][1] for i in range(len(mnist_dataset_test))]), n_targets)

log.append(f"Train: {train_images.shape} {train_labels.shape}")
log.append(f"Test: {test_images.shape} {test_labels.shape}")

sampler = pygrain.SequentialSampler(
    num_records=len(mnist_dataset),
    shard_options=pygrain.ShardByJaxProcess())

def pygrain_training_generator():
    return pygrain.DataLoader(
        data_source=mnist_dataset,
        sampler=sampler,
        operations=[pygrain.Batch(batch_size)],
    )

params = train_model(num_epochs, params, pygrain_training_generator)
results = {"log": log, "seen": seen, "params": [(np.asarray(w).tolist(), np.asarray(b).tolist()) for w, b in params],
           "sampler": repr(sampler),
           "batch_types": [type(x).__name__ for x in next(iter(pygrain_training_generator()))]}
'''


def test_jax_ai_stack_multi_device_tutorial_grain_section_as_on_grain():
  """jax-ai-stack multi-device tutorial: a SequentialSampler over ShardByJaxProcess, a DataLoader per epoch."""
  g, l = (porting.run(MULTI_DEVICE_TUTORIAL, lib).results for lib in porting.LIBS)
  gc.collect()
  assert l == g
  # 20 records, batches of 8 (the last one short, kept), two epochs over the same loader definition.
  assert [len(y) for _, y in g["seen"]] == [8, 8, 4] * 2 and g["seen"][:3] == g["seen"][3:]
  assert g["batch_types"] == ["ndarray", "ndarray"]
  assert g["log"][:2] == ["Train: (20, 16) (20, 10)", "Test: (6, 16) (6, 10)"] and len(g["log"]) == 4


# ---------------------------------------------------------------------------
# AI-Hypercomputer/maxtext: src/maxtext/common/grain_utility.py
# ---------------------------------------------------------------------------

# grain_utility.py at e591f30, its Orbax-v0 part as written (`GrainCheckpointHandler`,
# `GrainCheckpointSave` / `GrainCheckpointRestore`, `prepare_scaled_down_grain_restore_args`,
# `restore_grain_iterator`; error texts trimmed of the docs link); the colocated-Python
# `RemoteIteratorWrapper` is an empty stand-in (never given here).
MAXTEXT_GRAIN_UTILITY = r'''
import dataclasses
import json
from typing import Any, Optional

from etils import epath
import grain
from grain import experimental as grain_experimental
from grain import python
import jax
import numpy as np
import orbax.checkpoint as ocp_v0


class RemoteIteratorWrapper:  # multihost_dataloading's colocated-Python wrapper: not used on one host
  pass


PyGrainCheckpointHandler = python.PyGrainCheckpointHandler
Composite = ocp_v0.args.Composite
ElasticIterator = grain_experimental.ElasticIterator


class GrainCheckpointHandler(PyGrainCheckpointHandler, ocp_v0.CheckpointHandler):
  """A CheckpointHandler that allows specifying process_index and process_count."""

  def save(self, directory: epath.Path, item: Optional[Any] = None, args: Any = None):
    item = item or args.item
    if isinstance(item, RemoteIteratorWrapper):
      step = int(directory.parent.name)
      item.save_state(step)
      return
    if isinstance(item, ElasticIterator):
      if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        filename = directory / "process_0.json"
        filename.write_text(json.dumps(item.get_state(), indent=4))
      return

    def save_single_process(item, process_index, process_count):
      filename = directory / f"process_{process_index}-of-{process_count}.json"
      if isinstance(item, grain.DatasetIterator):
        state = json.dumps(item.get_state(), indent=4)
      else:
        state = item.get_state().decode()
      filename.write_text(state)

    if isinstance(item, list):
      for local_iterator, process_index, process_count in item:
        save_single_process(local_iterator, process_index, process_count)
    else:
      process_index, process_count = jax.process_index(), jax.process_count()
      save_single_process(item, process_index, process_count)

  def restore(self, directory: epath.Path, item: Optional[Any] = None, args: Any = None) -> Any:
    item = item or args.item
    process_index = getattr(args, "process_index", None)
    process_count = getattr(args, "process_count", None)
    if isinstance(item, RemoteIteratorWrapper):
      step = int(directory.parent.name)
      item.restore_state(step)
      return item
    if isinstance(item, ElasticIterator):
      filename = directory / "process_0.json"
      if not filename.exists():
        raise ValueError(f"File {filename} does not exist.")
      item.set_state(json.loads(filename.read_text()))
      return item

    def restore_single_process(item, process_index, process_count):
      filename = directory / f"process_{process_index}-of-{process_count}.json"
      if not filename.exists():
        raise ValueError(f"File {filename} does not exist.")
      state = filename.read_text()
      if isinstance(item, grain.DatasetIterator):
        state = json.loads(state)
      else:
        state = state.encode()
      item.set_state(state)
      return item

    if isinstance(item, list):
      restored_items = []
      for data_iter, process_idx in zip(item, process_index):
        restored_items.append(restore_single_process(data_iter, process_idx, process_count))
      return restored_items
    else:
      if process_index is None or process_count is None:
        process_index, process_count = jax.process_index(), jax.process_count()
      return restore_single_process(item, process_index, process_count)


@ocp_v0.args.register_with_handler(GrainCheckpointHandler, for_save=True)
@dataclasses.dataclass
class GrainCheckpointSave(ocp_v0.args.CheckpointArgs):
  item: Any


@ocp_v0.args.register_with_handler(GrainCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class GrainCheckpointRestore(ocp_v0.args.CheckpointArgs):
  item: Any
  process_index: Optional[int | list[int]] = None
  process_count: Optional[int] = None


def prepare_scaled_down_grain_restore_args(data_iterator, process_count_jax, process_count_stored, directory):
  assert isinstance(data_iterator, list), (
      f"{process_count_stored} processes found in Grain checkpoint directory {directory}, but only "
      f"{process_count_jax} jax processes in this run, please set expansion_factor_real_data accordingly.")
  scaling_factor = len(data_iterator)
  expected_process_count = process_count_stored / process_count_jax
  assert scaling_factor == expected_process_count, (
      f"Found {process_count_stored} processes in checkpoint and {process_count_jax} "
      f"JAX processes, implying a scaling factor of {expected_process_count}. "
      f"However, the data_iterator list has {scaling_factor} items.")
  local_iterator_list = [x.local_iterator for x in data_iterator]
  process_index_list = [jax.process_index() + i * process_count_jax for i in range(scaling_factor)]
  return GrainCheckpointRestore(local_iterator_list, process_index=process_index_list,
                                process_count=process_count_stored)


def restore_grain_iterator(checkpoint_manager, step, data_iterator, checkpoint_args, expansion_factor_real_data):
  if isinstance(data_iterator, RemoteIteratorWrapper):
    grain_restore_args = GrainCheckpointRestore(item=data_iterator)
    restored_state = checkpoint_manager.restore(step, args=Composite(items=checkpoint_args, iter=grain_restore_args))
    return (restored_state, None)
  if not isinstance(data_iterator, list) and isinstance(data_iterator.local_iterator, ElasticIterator):
    grain_restore_args = GrainCheckpointRestore(item=data_iterator.local_iterator)
    restored_state = checkpoint_manager.restore(step, args=Composite(items=checkpoint_args, iter=grain_restore_args))
    return (restored_state, None)
  directory = checkpoint_manager.directory / str(step) / "iter"
  process_count_jax = jax.process_count()
  process_count_stored = len(list(directory.glob("process_*-of-*.json")))
  grain_restore_args = None
  if process_count_stored > process_count_jax:
    grain_restore_args = prepare_scaled_down_grain_restore_args(
        data_iterator, process_count_jax, process_count_stored, directory)
  elif process_count_stored == process_count_jax:
    assert not isinstance(data_iterator, list), (
        f"{process_count_stored} processes found in Grain checkpoint directory {directory}, matching the number of "
        "jax process, please do not set expansion_factor_real_data.")
    grain_restore_args = GrainCheckpointRestore(data_iterator.local_iterator)
  elif expansion_factor_real_data > 1 and process_count_stored == process_count_jax // expansion_factor_real_data:
    assert not isinstance(data_iterator, list), (
        "when expansion_factor_real_data > 1, the data iterator should not be a list.")
    grain_restore_args = GrainCheckpointRestore(
        data_iterator.local_iterator, process_index=jax.process_index(), process_count=process_count_stored)
  else:
    raise ValueError(
        f"Error restoring Grain checkpoint in {directory}: "
        f"The number of stored checkpoint files ({process_count_stored}) "
        f"is incompatible with the number of JAX processes ({process_count_jax}). ")
  restored_state = checkpoint_manager.restore(step, args=Composite(items=checkpoint_args, iter=grain_restore_args))
  return (restored_state, None)
'''

MAXTEXT_GRAIN_UTILITY_RUN = r'''

# ---- the training job's side (one JAX process): hosts' iterators, a CheckpointManager ----
class MultiHostDataLoadIterator:  # multihost_dataloading's wrapper, reduced to what grain_utility reads
  def __init__(self, local_iterator):
    self.local_iterator = local_iterator


def host_dataset(host, hosts):
  return grain.MapDataset.range(24).shuffle(seed=1)[host::hosts].map(lambda x: x * 10).to_iter_dataset().batch(2)


def host_loader(host, hosts):
  return grain.DataLoader(
      data_source=[x * 10 for x in range(24)],  # a stable repr: Grain checks it on restore
      sampler=grain.samplers.IndexSampler(24, shard_options=grain.sharding.ShardOptions(host, hosts), shuffle=True,
                                          num_epochs=1, seed=1),
      operations=[grain.transforms.Batch(2)])


P = lambda xs: [np.asarray(x).tolist() for x in xs]
results = {}
options = ocp_v0.CheckpointManagerOptions(enable_async_checkpointing=False)
# 1. Two hosts' iterators kept by one process (a job saved from 2 hosts), restored by one host as a list.
its = [iter(host_dataset(h, 2)) for h in range(2)]
heads = [P([next(it) for _ in range(2)]) for it in its]
manager = ocp_v0.CheckpointManager(f"{checkpoint_dir}/scaled_down", options=options)
specs = [(it, 0 + i * jax.process_count(), jax.process_count() * len(its)) for i, it in enumerate(its)]
manager.save(2, args=Composite(items=ocp_v0.args.StandardSave({"step": np.array(2)}),
                               iter=GrainCheckpointSave(specs)))
manager.wait_until_finished()
results["files"] = sorted(p.name for p in (manager.directory / "2" / "iter").iterdir())
results["rest"] = [P(it) for it in its]
fresh = [MultiHostDataLoadIterator(iter(host_dataset(h, 2))) for h in range(2)]
restored, _ = restore_grain_iterator(manager, 2, fresh, ocp_v0.args.StandardRestore({"step": np.array(0)}), 1)
results["restored_step"] = int(restored["items"]["step"])
results["restored_is_list"] = isinstance(restored["iter"], list) and restored["iter"][0] is fresh[0].local_iterator
results["resumed"] = [P(x.local_iterator) for x in fresh]
results["heads"] = heads
# 2. The normal case: one host, a DataLoader iterator (its state JSON bytes).
loader_it = iter(host_loader(0, 1))
head = P([next(loader_it) for _ in range(3)])
manager = ocp_v0.CheckpointManager(f"{checkpoint_dir}/loader", options=options)
manager.save(3, args=Composite(items=ocp_v0.args.StandardSave({"step": np.array(3)}),
                               iter=GrainCheckpointSave(loader_it)))
manager.wait_until_finished()
results["loader_files"] = sorted(p.name for p in (manager.directory / "3" / "iter").iterdir())
results["loader_rest"] = P(loader_it)
again = MultiHostDataLoadIterator(iter(host_loader(0, 1)))
restore_grain_iterator(manager, 3, again, ocp_v0.args.StandardRestore({"step": np.array(0)}), 1)
results["loader_resumed"] = P(again.local_iterator)
# 3. ElasticIterator: one process_0.json.
elastic = ElasticIterator(grain.MapDataset.range(20).map(lambda x: x + 1), global_batch_size=4,
                          shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1))
head = P([next(elastic) for _ in range(2)])
manager = ocp_v0.CheckpointManager(f"{checkpoint_dir}/elastic", options=options)
manager.save(1, args=Composite(items=ocp_v0.args.StandardSave({"step": np.array(1)}),
                               iter=GrainCheckpointSave(elastic)))
manager.wait_until_finished()
results["elastic_files"] = sorted(p.name for p in (manager.directory / "1" / "iter").iterdir())
results["elastic_state"] = json.loads((manager.directory / "1" / "iter" / "process_0.json").read_text())
results["elastic_rest"] = P(elastic)
again = MultiHostDataLoadIterator(ElasticIterator(
    grain.MapDataset.range(20).map(lambda x: x + 1), global_batch_size=4,
    shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1)))
restore_grain_iterator(manager, 1, again, ocp_v0.args.StandardRestore({"step": np.array(0)}), 1)
results["elastic_resumed"] = P(again.local_iterator)
# 4. Two stored files restored by one host that was not given a list: the client's AssertionError.
try:
  restore_grain_iterator(ocp_v0.CheckpointManager(f"{checkpoint_dir}/scaled_down", options=options), 2,
                         MultiHostDataLoadIterator(iter(host_dataset(0, 2))),
                         ocp_v0.args.StandardRestore({"step": np.array(0)}), 1)
except AssertionError as e:
  results["not_a_list"] = str(e).split(" in Grain")[0]
'''


def test_maxtext_grain_checkpoint_handler_scaled_down_normal_and_elastic_restores_as_on_grain(tmp_path):
  """MaxText grain_utility: per-process JSON files through Orbax, a two-host checkpoint restored by one host."""
  g, l = (porting.grain_keys(porting.run(MAXTEXT_GRAIN_UTILITY + MAXTEXT_GRAIN_UTILITY_RUN, lib,
                                         checkpoint_dir=str(tmp_path / lib)).results) for lib in porting.LIBS)
  gc.collect()
  assert l == g
  assert g["files"] == ["commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]
  assert g["restored_step"] == 2 and g["restored_is_list"] is True
  assert g["resumed"] == g["rest"] and [len(r) for r in g["rest"]] == [4, 4]  # 12 records a host, 2 batches read
  assert g["loader_files"] == ["commit_success.txt", "process_0-of-1.json"]
  assert g["loader_resumed"] == g["loader_rest"] and len(g["loader_rest"]) == 9
  assert g["elastic_files"] == ["commit_success.txt", "process_0.json"]
  assert g["elastic_state"] == {"global_next_index": 8} and g["elastic_resumed"] == g["elastic_rest"]
  assert g["not_a_list"] == "2 processes found"


# ---------------------------------------------------------------------------
# Regression: a DataLoader state refused for another source / sampler
# ---------------------------------------------------------------------------

REFUSED_STATE = r'''
import re
import grain.python as grain

def loader(source, seed):
  sampler = grain.IndexSampler(num_records=len(source), shard_options=grain.NoSharding(), shuffle=True,
                               num_epochs=1, seed=seed)
  return grain.DataLoader(data_source=source, sampler=sampler, operations=[grain.Batch(2)])

it = iter(loader(list(range(6)), seed=1))
next(it)
state = it.get_state()
results = {}
# Grain names a list / tuple / array source by its type only (its `_source_repr`).
for name, other in {"data_source": loader(tuple(range(6)), seed=1), "sampler": loader(list(range(6)), seed=2)}.items():
  try:
    iter(other).set_state(state)
    results[name] = None
  except ValueError as e:
    results[name] = re.match(r"[^.]*\.", str(e)).group(0)
'''


def test_refused_data_loader_state_message_starts_with_grains_words():
  """A state of another source or sampler: ValueError on both, whose message starts with Grain's sentence."""
  g, l = (porting.run(REFUSED_STATE, lib).results for lib in porting.LIBS)
  gc.collect()
  assert g == {"data_source": "DataSource in checkpoint does not match datasource in dataloader.",
               "sampler": "Sampler in checkpoint does not match dataloader sampler."}
  assert l == g


# ---------------------------------------------------------------------------
# AI-Hypercomputer/maxtext: input_pipeline/dpo_utils.py and the DPO pipeline
# ---------------------------------------------------------------------------

# dpo_utils.py's `DPODataFormatting` and grain_data_processing.py's
# `dpo_preprocessing_pipeline` / data_processing_utils.py's
# `apply_multiprocessing_and_prefetch` at e591f30 as written (docstrings
# trimmed); pre-tokenized rows, so the tokenizer and parser are stand-ins.
MAXTEXT_DPO = r'''
import dataclasses
import functools
import types

import grain.python as grain
import numpy as np


@dataclasses.dataclass
class DPODataFormatting(grain.MapTransform):
  """Prepares DPO data."""

  pad_id: int
  max_target_length: int
  data_column_names: tuple[str, ...]
  max_prompt_length: int

  def map(self, element):
    try:
      if len(self.data_column_names) == 3:
        input_ids = element[self.data_column_names[0]]
        chosen_ids = element[self.data_column_names[1]]
        rejected_ids = element[self.data_column_names[2]]
      elif len(self.data_column_names) == 2:
        full_chosen = element[self.data_column_names[0]]
        full_rejected = element[self.data_column_names[1]]
        prefix_len = 0
        for c, r in zip(full_chosen, full_rejected):
          if c != r:
            break
          prefix_len += 1
        input_ids = full_chosen[:prefix_len]
        chosen_ids = full_chosen[prefix_len:]
        rejected_ids = full_rejected[prefix_len:]
      else:
        raise ValueError(f"DPODataFormatting expects 2 or 3 columns, got {len(self.data_column_names)}")
    except KeyError as e:
      raise KeyError(
          f"Column '{e.args[0]}' not found in the dataset. "
          f"Expected columns: {self.data_column_names}. "
          f"Available columns: {list(element.keys())}. "
          "Please verify that 'train_data_columns' and 'eval_data_columns' match your dataset."
      ) from e
    max_response_length = self.max_target_length - self.max_prompt_length
    assert self.max_prompt_length > 0, (
        "max_prompt_length must be positive. " "Check the configs for 'max_prompt_length' and 'max_target_length'.")
    assert max_response_length > 0, (
        "max_response_length must be positive. " "Check the configs for 'max_prompt_length' and 'max_target_length'.")
    prompt_ids = self._pad(input_ids, self.max_prompt_length, left=True)
    chosen_ids = self._pad(chosen_ids, max_response_length, left=False)
    rejected_ids = self._pad(rejected_ids, max_response_length, left=False)
    for key in self.data_column_names:
      if key in element:
        del element[key]
    element["prompt_ids"] = prompt_ids
    element["chosen_ids"] = chosen_ids
    element["rejected_ids"] = rejected_ids
    element["prompt_mask"] = (prompt_ids != self.pad_id).astype(np.int32)
    element["chosen_mask"] = (chosen_ids != self.pad_id).astype(np.int32)
    element["rejected_mask"] = (rejected_ids != self.pad_id).astype(np.int32)
    return element

  def _pad(self, x, length, left=False):
    x = np.asarray(x)
    pad_amount = max(length - x.shape[0], 0)
    if left:
      pad_width = ((pad_amount, 0),)
      x_trimmed = x[-length:]
    else:
      pad_width = ((0, pad_amount),)
      x_trimmed = x[:length]
    return np.pad(x_trimmed, pad_width, constant_values=self.pad_id).astype(np.int32)


# data_processing_utils stand-ins: the records are pre-tokenized (tokenize=False), so
# parse_and_keep_features only builds fresh dicts of arrays (as ParseFeatures does).
def parse_and_keep_features(dataset, config, data_columns, tokenize):
  return dataset.map(lambda r: {k: np.asarray(v, np.int32) for k, v in r.items()})


def get_tokenizer_and_pad_id(config):
  return None, 0


def get_local_batch_size(config):
  return config.global_batch_size_to_load


def apply_multiprocessing_and_prefetch(dataset, config, grain_worker_count, grain_per_worker_buffer_size):
  if config.grain_use_elastic_iterator:
    return dataset
  multiprocessing_options = grain.MultiprocessingOptions(
      num_workers=grain_worker_count, per_worker_buffer_size=grain_per_worker_buffer_size)
  return dataset.mp_prefetch(multiprocessing_options)


def dpo_preprocessing_pipeline(dataset, config, data_columns, tokenize, grain_worker_count,
                               grain_per_worker_buffer_size):
  """Use grain to pre-process the dataset and return iterators for dpo fine-tuning"""
  dataset = parse_and_keep_features(dataset, config, data_columns, tokenize)
  tokenizer_model, pad_id = get_tokenizer_and_pad_id(config)
  dataset = dataset.map(
      DPODataFormatting(
          pad_id=pad_id,
          max_target_length=config.max_target_length,
          data_column_names=data_columns,
          max_prompt_length=config.dpo.max_prompt_length,
      )
  )
  batch_size = get_local_batch_size(config)
  if config.grain_use_elastic_iterator:
    pass
  else:
    batch_fn = functools.partial(grain.experimental.batch_and_pad, batch_size=batch_size, pad_value=pad_id)
    dataset = dataset.batch(batch_size, batch_fn=batch_fn)
  dataset = apply_multiprocessing_and_prefetch(dataset, config, grain_worker_count, grain_per_worker_buffer_size)
  return dataset


RESTORE_AT_EVERY_STEP_HERE

def plain_eq(a, b):
  return [{k: v.tolist() for k, v in x.items()} for x in a] == [{k: v.tolist() for k, v in x.items()} for x in b]


def config_for(**overrides):
  config = dict(max_target_length=8, dpo=types.SimpleNamespace(max_prompt_length=3), global_batch_size_to_load=3,
                grain_use_elastic_iterator=False)
  config.update(overrides)
  return types.SimpleNamespace(**config)


rng = np.random.default_rng(0)
three = [{"prompt": rng.integers(1, 50, rng.integers(1, 6)).tolist(),
          "chosen": rng.integers(1, 50, rng.integers(1, 7)).tolist(),
          "rejected": rng.integers(1, 50, rng.integers(1, 7)).tolist()} for _ in range(7)]
two = []
for row in three:  # hh-rlhf style: the prompt is the common prefix of both conversations
  two.append({"chosen": row["prompt"] + [99] + row["chosen"], "rejected": row["prompt"] + [98] + row["rejected"]})


def make(rows, columns, **overrides):
  ds = grain.MapDataset.source(rows).shuffle(seed=3).to_iter_dataset()
  return dpo_preprocessing_pipeline(ds, config_for(**overrides), columns, False, 0, 2)


results = {}
for name, rows, columns in (("three", three, ("prompt", "chosen", "rejected")), ("two", two, ("chosen", "rejected"))):
  reference, restores = restore_at_every_step(lambda: make(rows, columns))
  results[name] = [{k: v.tolist() for k, v in x.items()} for x in reference]
  results[name + "_restores"] = restores
results["source_rows_untouched"] = sorted(three[0]) == ["chosen", "prompt", "rejected"]
for name, kwargs, columns in (("missing_column", {}, ("prompt", "chosen", "answer")),
                              ("prompt_too_long", {"dpo": types.SimpleNamespace(max_prompt_length=8)},
                               ("prompt", "chosen", "rejected")),
                              ("one_column", {}, ("prompt",))):
  try:
    next(iter(make(three, columns, **kwargs)))
    results[name] = None
  except Exception as e:  # the map's own errors, as the pipeline raises them
    results[name] = [type(e).__name__, str(e)[:60]]
'''.replace("RESTORE_AT_EVERY_STEP_HERE", porting.RESTORE_AT_EVERY_STEP)


def test_maxtext_dpo_pipeline_formatting_batch_and_pad_and_restores_as_on_grain():
  """MaxText DPO: in-place DPODataFormatting (3 columns, and hh-rlhf's 2 with a common prefix), batch_and_pad."""
  g, l = (porting.run(MAXTEXT_DPO, lib).results for lib in porting.LIBS)
  gc.collect()
  assert l == g
  for name in ("three", "two"):
    batches = g[name]
    assert len(batches) == 3 and g[name + "_restores"] == [[True, True]] * 4
    # 7 rows, batches of 3: batch_and_pad pads the last with two rows of pad_id 0.
    assert [len(b["prompt_ids"]) for b in batches] == [3, 3, 3] and batches[-1]["prompt_mask"][1:] == [[0, 0, 0]] * 2
    assert all(len(r) == 5 for b in batches for r in b["chosen_ids"])  # max_target_length 8 - prompt 3
  # The 2-column rows are the 3-column ones with the prompt as a common prefix: the same prompts.
  assert [b["prompt_ids"] for b in g["two"]] == [b["prompt_ids"] for b in g["three"]]
  assert g["source_rows_untouched"] is True
  # The map's own KeyError (re-raised with the expected columns) reaches the caller as it is, on both.
  assert g["missing_column"] == ["KeyError", "\"Column 'answer' not found in the dataset. Expected columns:"]
  assert g["prompt_too_long"][0] == "AssertionError" and g["one_column"][0] == "ValueError"
