"""A third set of public Grain clients, run on Grain 0.2.18 and, with only the import line changed, on loader.

Sources (read at their newest public snapshots):

- google-research/kauldron: kauldron/data/py/transform_utils.py (structural
  `match` on `grain.MapTransform()` / `RandomMapTransform()` / ... and
  `FlatMapMapDataset(ds, tr)`), kauldron/data/py/random_transforms.py and
  its test (frozen-dataclass RandomMapTransforms deep-copying the rng per
  feature), kauldron/contrib/data/py/preprocessing.py (one rng shared by every
  leaf of `jax.tree_util.tree_map_with_path`), kauldron/data/py/base.py and
  data_sources.py with data_sources_test.py (seed, `ds[process_index::
  process_count]`, shuffle, repeat, `to_iter_dataset(ReadOptions(num_threads=0,
  prefetch_buffer_size=0))`, batch with `batch_fn=partial(batch_and_pad, ...)`,
  frozen-dataclass `RandomAccessDataSource` subclasses),
  kauldron/data/py/mixtures.py with mixtures_test.py (`MapDataset.mix` with
  `weights=None`, `select_from_datasets` with a `DatasetSelectionMap`),
  kauldron/data/iterators/pygrain_handler.py with its test (a
  `PyGrainCheckpointHandler` subclass that is also an `ocp.CheckpointHandler`,
  `PyGrainCheckpointSave/Restore` subclasses registered with it) and
  kauldron/contrib/data/array_record.py (a lazy ArrayRecord source wrapper);
  `mp_prefetch` with kauldron's `worker_init_fn` partial.
- google-deepmind/gemma: gemma/gm/data/_tasks.py, _transforms.py, _functional.py
  (frozen kw_only dataclass MapTransforms building seq2seq / contrastive
  fields from a tokenizer), gemma/gm/data/_parquet.py (a parquet
  `RandomAccessDataSource` dataclass), gemma/diffusion/hackable_diffusion_adapter/
  data/data.py and sudoku/sudoku_data.py (transforms that edit the element in
  place; a source with a lazy reader and `__getstate__`; slice then shard).
- google/flax: examples/gemma/input_pipeline_grain.py (filter / shuffle / repeat,
  FirstFitPackIterDataset with `num_packing_bins`, a `@dataclass` MapTransform
  with its own `__init__`, batches edited in place, a custom `batch_fn`,
  `pick_performance_config`, `mp_prefetch`) and tokenizer.py
  (`TokenizeOpNumpy`, a plain callable dataclass), docs_nnx/guides/data_loaders.md
  and docs_nnx/examples/*.md (DataLoader with `worker_count=4,
  worker_buffer_size=2` -- 2 workers here --, IndexSampler with `NoSharding()`).
- jax-ml/jax-ai-stack: docs/source/JAX_time_series_classification.md,
  data_loaders_on_gpu_with_jax.md and jax_ai_stack/tests/test_nnx_with_grain.py
  (a `RandomAccessDataSource` subclass of numpy arrays, tuple elements, a
  DataLoader rebuilt per epoch, a MapTransform with `__init__` but no
  `super().__init__()`).
- AI-Hypercomputer/maxdiffusion: src/maxdiffusion/input_pipeline/
  _grain_data_processing.py (ArrayRecord of tf.train.Example with serialized
  tensors parsed by a `@dataclass` MapTransform, IndexSampler with
  `ShardOptions(..., drop_remainder=True)` and `num_epochs=None`),
  multihost_dataloading.py (`isinstance(dataloader, Iterable)`, reset by
  `iter(dataloader)`) and checkpointing/base_stable_diffusion_checkpointer.py
  (`PyGrainCheckpointSave` / `Restore` of the DataLoader iterator in an
  `ocp.args.Composite`).
- mhyatt000/crossformer: crossformer/data/grain/sharding.py (ShardOptions /
  ShardByJaxProcess), map/flatmap.py (a MapDataset subclass with
  `_MUTATES_ELEMENT_SPEC` and caches, a dataclass FlatMapTransform),
  loader.py and pipelines.py (`x | {...}` maps, `MapDataset.mix` with weights,
  seed then argument-less shuffle, a batch after `to_iter_dataset(ReadOptions)`,
  attributes set on a dataset, ThreadPrefetchIterDataset, a stage-timing
  execution summary).
- blaxbird 0.0.1 (PyPI sdist) examples/dataloader.py: ShardOptions passed to
  both the IndexSampler and the DataLoader, `grain._src.core.transforms.Batch`.

Models, tokenizers, TFDS / HF / bagz data are replaced by tiny local stand-ins.
Every test compares loader's result with Grain's. Where README.md ("Porting
from Grain") documents a deliberate difference -- batches made after the
worker split (one stream for any worker count), a failing element under
`ReadOptions(num_threads=0)` -- the test asserts exactly how the two differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import porting
from tests.porting import plain


def _same(g, l, *names):
  for name in names:
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name


# ---- kauldron/data/py/transform_utils.py ------------------------------------

KAULDRON_DISPATCH = """
import dataclasses
import sys
import grain.python as grain

_MISSING = object()


class SliceDataset:  # kauldron's, converted to `ds.slice` below.

  def __init__(self, start=_MISSING, stop=_MISSING, step=_MISSING):
    if start is not _MISSING and stop is _MISSING and step is _MISSING:
      stop, start = start, _MISSING
    self.slice = slice(*[None if a is _MISSING else a for a in (start, stop, step)])


class TransformAdapter:  # kauldron.data.transforms.normalize.TransformAdapter, reduced.

  def __init__(self, transform):
    self.transform = transform


class PyGrainCallableAdapter(TransformAdapter, grain.MapTransform):

  def map(self, element):
    return self.transform(element)


class Odd(grain.FilterTransform):

  def filter(self, element):
    return element % 2 == 1


class AddIndex(grain.MapWithIndexTransform):

  def map_with_index(self, index, element):
    return element * 100 + index


class Noise(grain.RandomMapTransform):

  def random_map(self, element, rng):
    return element * 1000 + int(rng.integers(1000))


@dataclasses.dataclass
class Repeat(grain.experimental.FlatMapTransform):
  max_fan_out: int = 3

  def flat_map(self, element):
    return [element] * (element % 3 + 1)


def adapt(transform):
  tf_grain = sys.modules.get("grain.tensorflow")
  if isinstance(transform, (grain.Transformation, SliceDataset)):
    return transform
  elif tf_grain and isinstance(transform, tf_grain.Transformation):
    raise ValueError(f"Mixing TFGrain transform inside PyGrain pipeline: {transform}")
  return PyGrainCallableAdapter(transform)


def apply(ds, tr):
  match tr:
    case grain.MapTransform():
      ds = ds.map(tr)
    case grain.RandomMapTransform():
      ds = ds.random_map(tr)
    case grain.MapWithIndexTransform():
      ds = ds.map_with_index(tr)
    case grain.FilterTransform():
      ds = ds.filter(tr)
    case grain.Batch():
      ds = ds.batch(tr.batch_size, drop_remainder=tr.drop_remainder)
    case SliceDataset():
      ds = ds.slice(tr.slice)
    case grain.experimental.FlatMapTransform():
      ds = grain.experimental.FlatMapMapDataset(ds, tr)
    case _:
      raise ValueError(f"Unexpected transform type: {tr}")
  return ds


def apply_transforms(ds, transforms):
  for tr in transforms:
    ds = apply(ds, adapt(tr))
  return ds


kinds = [type(adapt(t)).__name__ for t in (Odd(), AddIndex(), Noise(), Repeat(), SliceDataset(4), lambda x: x,
                                          grain.Batch(2))]
ds = grain.MapDataset.range(12).seed(7)
flat = apply_transforms(ds, [SliceDataset(10), lambda x: x + 1, Repeat(), AddIndex(), Noise()])
out = apply_transforms(ds, [SliceDataset(10), lambda x: x + 1, AddIndex(), Noise(),
                            grain.Batch(batch_size=3, drop_remainder=True)])
result = [out[1], len(out), list(out), len(flat), list(flat)]
filtered = list(apply_transforms(ds, [Repeat(), Odd(), Noise()]))
sliced = list(apply_transforms(ds, [SliceDataset(2, 9, 3)]))
refused = []
for transforms in ([Odd(), grain.Batch(2)], [Repeat(), grain.Batch(2)]):
  try:
    apply_transforms(ds, transforms)
    refused.append("built")
  except ValueError:  # A MapDataset.batch after a filter / flat map: to_iter_dataset() first.
    refused.append("ValueError")
"""


def test_kauldron_transform_dispatch_by_structural_match():
  g, l = porting.run_both(KAULDRON_DISPATCH)
  _same(g, l, "kinds", "result", "filtered", "sliced", "refused")
  assert l.refused == ["ValueError", "ValueError"]


# ---- kauldron/data/py/random_transforms.py (+ its test) and contrib preprocessing

KAULDRON_RANDOM = """
import abc
import copy
import dataclasses
from typing import Any, Callable, Optional
from grain import python as pygrain
from jax import tree_util
import numpy as np


@dataclasses.dataclass(kw_only=True, frozen=True, eq=True)
class ElementWise:  # kauldron.data.transforms.base.ElementWise, reduced to `key`.
  key: Any

  def __post_init__(self):
    if isinstance(self.key, str):
      object.__setattr__(self, "key", (self.key,))

  def _per_element(self, features):
    for k, v in features.items():
      yield k, v, k in self.key


@dataclasses.dataclass(kw_only=True, frozen=True, eq=True)
class ElementWiseRandomTransform(ElementWise, pygrain.RandomMapTransform):

  def random_map(self, features, rng: np.random.Generator):
    features_out = {}
    for key, element, should_transform in self._per_element(features):
      if should_transform:
        elem_rng = copy.deepcopy(rng)  # copy the SAME rng for each element.
        features_out[key] = self.random_map_element(element, elem_rng)
      else:
        features_out[key] = element
    return features_out

  @abc.abstractmethod
  def random_map_element(self, element: Any, rng: np.random.Generator):
    raise NotImplementedError


@dataclasses.dataclass(kw_only=True, frozen=True)
class RandomFlipLeftRight(ElementWiseRandomTransform):

  def random_map_element(self, element, rng):
    bcastable_batch_shape = element.shape[:-3] + (1, 1, 1)
    mask = rng.integers(2, size=bcastable_batch_shape, dtype=bool)
    return np.where(mask, element, np.flip(element, axis=-2))


@dataclasses.dataclass(kw_only=True, frozen=True)
class RandomCrop(ElementWiseRandomTransform):
  shape: tuple[Optional[int], ...]

  def random_map_element(self, element, rng):
    effective_shape = tuple(element.shape[i] if s is None else s for i, s in enumerate(self.shape))
    slices = []
    for i, crop_size in enumerate(effective_shape):
      dim_size = element.shape[i]
      if crop_size < dim_size:
        start = rng.integers(0, dim_size - crop_size + 1)
        slices.append(slice(start, start + crop_size))
      else:
        slices.append(slice(None))
    return element[tuple(slices)]


class _DictDataSource(pygrain.RandomAccessDataSource):  # random_transforms_test.py, index-dependent here.

  def __init__(self, num_elements: int):
    self._num_elements = num_elements

  def __len__(self) -> int:
    return self._num_elements

  def __getitem__(self, index):
    image = (np.arange(8 * 8 * 3, dtype=np.float32).reshape(8, 8, 3) + 1000 * index)
    return {"image": image, "mask": image[..., :1] - 1000 * index, "label": index}


def crop_pipeline(seed):
  ds = pygrain.MapDataset.source(_DictDataSource(num_elements=4))
  ds = ds.seed(seed)
  return ds.random_map(RandomCrop(key="image", shape=(4, 4, 3)))


ds = crop_pipeline(42)
first_read, second_read = ds[0]["image"].copy(), ds[0]["image"].copy()
same_index_twice = bool((first_read == second_read).all())
two_pipelines = []
for num_iters in (1, 2):
  it1, it2 = iter(crop_pipeline(42)), iter(crop_pipeline(42))
  for _ in range(num_iters):
    r1 = next(it1)
  for _ in range(num_iters):
    r2 = next(it2)
  two_pipelines.append(bool((r1["image"] == r2["image"]).all()))
crops = [x["image"][:, :, 0] for x in crop_pipeline(42)]
other_seed = [x["image"][:, :, 0] for x in crop_pipeline(43)]
flips = [[x["image"][0, :, 0], x["mask"][0, :, 0]] for x in pygrain.MapDataset.source(_DictDataSource(6)).seed(5)
         .random_map(RandomFlipLeftRight(key=("image", "mask"))).to_iter_dataset()]
flipped = [[bool(img[0] > img[-1]), bool(mask[0] > mask[-1])] for img, mask in flips]
frozen = []
try:
  RandomCrop(key="image", shape=(1,)).shape = (2,)
except dataclasses.FrozenInstanceError:
  frozen.append("FrozenInstanceError")


# kauldron/contrib/data/py/preprocessing.py: one rng for every leaf of the tree.
@dataclasses.dataclass(kw_only=True, frozen=True, eq=True)
class ElementWiseRandomTransformWithPredicate(pygrain.RandomMapTransform):
  should_transform_pred: Callable[[Any, Any], bool] = (lambda k, v: False)

  def random_map(self, features, rng: np.random.Generator):
    def maybe_transform(path, feature):
      should_transform = self.should_transform_pred(path, feature)
      return self.random_map_element(feature, rng) if should_transform else feature
    return tree_util.tree_map_with_path(maybe_transform, features)

  @abc.abstractmethod
  def random_map_element(self, element, rng):
    raise NotImplementedError


class RandomShift(ElementWiseRandomTransformWithPredicate):

  def random_map_element(self, element, rng):
    return element + rng.integers(100, size=element.shape)


def image_keys(k, _):
  return isinstance(k, tuple) and isinstance(k[-1], tree_util.DictKey) and "image" in k[-1].key


nested = pygrain.MapDataset.source([{"a": {"image": np.zeros(2, np.int64), "x": np.ones(2, np.int64)},
                                     "image_b": np.zeros(3, np.int64)}] * 3).seed(1)
shifted = list(nested.random_map(RandomShift(should_transform_pred=image_keys)))
"""


def test_kauldron_random_transforms_draw_grains_values():
  g, l = porting.run_both(KAULDRON_RANDOM)
  assert l.same_index_twice and l.two_pipelines == [True, True]
  assert all(a == b for a, b in l.flipped) and len({a for a, _ in l.flipped}) == 2  # One draw for both keys.
  _same(g, l, "same_index_twice", "two_pipelines", "crops", "other_seed", "flips", "flipped", "frozen", "shifted")
  assert plain(l.crops) != plain(l.other_seed)


# ---- kauldron/data/py/base.py, data_sources.py and their tests ----------------

# kauldron/data/iterators/pygrain_handler_test.py's RangeDataSource: a frozen
# dataclass RandomAccessDataSource (two cases below use it).
KAULDRON_RANGE_SOURCE = """
@dataclasses.dataclass(frozen=True)
class RangeDataSource(grain.RandomAccessDataSource):
  num_elems: int

  def __getitem__(self, record_key: SupportsIndex) -> Any:
    return int(record_key)

  def __len__(self) -> int:
    return 100
"""


KAULDRON_PIPELINE = """
import dataclasses
import enum
import functools
import json
import math
from typing import Any, SupportsIndex
import grain.python as grain
import jax
import numpy as np


class DropRemainder(enum.StrEnum):
  DROP = enum.auto()
  KEEP = enum.auto()
  PAD = enum.auto()


def random_seed(rng):  # kauldron.random.random_seed, reduced.
  return int(jax.random.randint(rng, (), 0, np.iinfo(np.int32).max))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSource:  # kauldron.data.py.DataSource(DataSourceBase(PyGrainPipeline)), reduced.
  data_source: Any
  shuffle: bool
  seed: int = 0
  transforms: tuple = ()
  num_epochs: int | None = None
  batch_size: int | None = None
  batch_drop_remainder: Any = True
  read_options: grain.ReadOptions | None = None

  def __post_init__(self):
    value = self.batch_drop_remainder
    value = DropRemainder.DROP if value is True else DropRemainder.KEEP if value is False else DropRemainder(value)
    object.__setattr__(self, "batch_drop_remainder", value)

  def ds_for_current_process(self, rng):
    ds = grain.MapDataset.source(self.data_source)
    ds = ds.seed(random_seed(rng))
    ds = ds[jax.process_index() :: jax.process_count()]
    if self.shuffle:
      ds = ds.shuffle(seed=random_seed(jax.random.fold_in(rng, 1)))
    return ds

  def ds_with_transforms(self, rng):
    ds = self.ds_for_current_process(rng)
    for tr in self.transforms:
      ds = ds.map(tr) if isinstance(tr, grain.MapTransform) else ds.random_map(tr)
    return ds

  def _apply_batch(self, ds):
    match self.batch_drop_remainder:
      case DropRemainder.PAD:
        batch_fn = functools.partial(grain.experimental.batch_and_pad, batch_size=self.batch_size)
        drop_remainder = False
      case DropRemainder.KEEP:
        batch_fn, drop_remainder = None, False
      case DropRemainder.DROP:
        batch_fn, drop_remainder = None, True
    return ds.batch(self.batch_size, batch_fn=batch_fn, drop_remainder=drop_remainder)

  @functools.cached_property
  def _root_map_ds(self):
    rng = jax.random.fold_in(jax.random.PRNGKey(self.seed), 7)
    return self.ds_with_transforms(rng).repeat(self.num_epochs)

  @functools.cached_property
  def _root_ds(self):
    read_options = self.read_options or grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    ds = self._root_map_ds.to_iter_dataset(read_options=read_options)
    if self.batch_size:
      ds = self._apply_batch(ds)
    return ds

  @functools.cached_property
  def element_spec(self):
    first = next(iter(self._root_ds))
    return jax.tree.map(lambda x: [list(np.shape(x)), str(np.asarray(x).dtype)], first)

  def __iter__(self):
    return iter(self._root_ds)

  def __len__(self):
    if self.num_epochs is None:
      raise TypeError("Cannot get length of infinite dataset.")
    ds_len = len(self._root_map_ds)
    if not self.batch_size:
      return ds_len
    if self.batch_drop_remainder == DropRemainder.DROP:
      return ds_len // self.batch_size
    return math.ceil(ds_len / self.batch_size)

  def __getitem__(self, record_key):
    ds = self._root_map_ds
    if self.batch_size:
      ds = self._apply_batch(ds)
    return ds[record_key]

  def take(self, n):
    it = iter(self)
    return [next(it) for _ in range(n)]


# data_sources_test.test_drop_remainder
drop_remainder = {}
for value in (True, False, "drop", "keep", "pad", DropRemainder.PAD):
  ds = DataSource(data_source=grain.RangeDataSource(0, 10, 1), shuffle=False, num_epochs=1, batch_size=3,
                  batch_drop_remainder=value)
  drop_remainder[str(value)] = [list(ds), len(ds), ds[len(ds) - 1]]
try:
  DataSource(data_source=grain.RangeDataSource(0, 10, 1), shuffle=False, batch_drop_remainder="keepp")
  invalid = "built"
except ValueError as e:
  invalid = "is not a valid DropRemainder" in str(e)
range_take = DataSource(data_source=grain.RangeDataSource(0, 10, 1), shuffle=False).take(10)


# pygrain_handler_test.RangeDataSource: a frozen dataclass RandomAccessDataSource.
""" + KAULDRON_RANGE_SOURCE + """

@dataclasses.dataclass(frozen=True)
class JsonDataSource(grain.RandomAccessDataSource):  # kauldron/data/py/data_sources.py
  path: str

  @functools.cached_property
  def data(self):
    with open(self.path) as f:
      return json.load(f)

  def __len__(self) -> int:
    return len(self.data)

  def __getitem__(self, record_key):
    ex = self.data[record_key]
    ex = jax.tree.map(lambda x: x, ex)  # Deep-copy to allow mutation.
    return ex


class Scale(grain.MapTransform):

  def map(self, ex):
    ex["image"] = np.asarray(ex["image"], np.float32) / 255.0  # In place: the source deep-copies.
    return ex


class Jitter(grain.RandomMapTransform):

  def random_map(self, ex, rng):
    return {**ex, "image": ex["image"] + rng.uniform(size=np.shape(ex["image"])).astype(np.float32)}


shuffled = DataSource(data_source=RangeDataSource(num_elems=100), seed=12, shuffle=True, num_epochs=2, batch_size=8,
                      batch_drop_remainder="pad")
shuffled_batches = list(shuffled)
shuffled_info = [len(shuffled), shuffled[3], shuffled[len(shuffled) - 1]]
infinite = DataSource(data_source=RangeDataSource(num_elems=100), seed=12, shuffle=True)
try:
  len(infinite)
  infinite_len = "len"
except TypeError:
  infinite_len = "TypeError"
infinite_take = infinite.take(5)
import sys
infinite_map_len = len(infinite._root_map_ds) == sys.maxsize

with open(json_path, "w") as f:
  json.dump([{"image": [[i, 2 * i], [3, 4]], "label": i} for i in range(7)], f)
json_ds = DataSource(data_source=JsonDataSource(json_path), shuffle=True, seed=3, num_epochs=1, batch_size=2,
                     batch_drop_remainder=False, transforms=(Scale(), Jitter()))
json_batches = list(json_ds)
json_spec = json_ds.element_spec
json_again = list(json_ds)
"""


def test_kauldron_pipeline_stages_and_sources(tmp_path):
  g, l = porting.run_both(KAULDRON_PIPELINE, json_path=str(tmp_path / "data.json"))
  _same(g, l, "drop_remainder", "invalid", "range_take", "shuffled_batches", "shuffled_info", "infinite_len",
        "infinite_take", "infinite_map_len", "json_batches", "json_spec", "json_again")
  # data_sources_test's expectations.
  assert plain(l.drop_remainder["True"][0]) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
  assert plain(l.drop_remainder["False"][0]) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
  assert plain(l.drop_remainder["pad"][0]) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 0]]
  assert l.range_take == list(range(10))


# PyGrainPipeline._make_root_ds with num_workers > 0: mp_prefetch with
# kauldron's worker_init_fn (a partial wrapping the user's), unbatched
# (data_sources_test.test_range with num_workers=2).
KAULDRON_WORKERS = """
import functools
import json
import os
import grain.python as grain


def _worker_init_fn(worker_idx, worker_count, *, custom_worker_init_fn=None):
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  if custom_worker_init_fn is not None:
    custom_worker_init_fn(worker_idx, worker_count)


def custom(worker_idx, worker_count):
  os.environ["KD_WORKER"] = f"{worker_idx}/{worker_count}"


def where(x):
  return [int(x), os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"), os.environ.get("KD_WORKER")]


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  ds = grain.MapDataset.source(grain.RangeDataSource(0, 10, 1)).seed(3).map(where).repeat(1)
  ds = ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2, enable_profiling=False, per_worker_buffer_size=1),
                      worker_init_fn=functools.partial(_worker_init_fn, custom_worker_init_fn=custom))
  it = iter(ds)
  print(json.dumps([next(it) for _ in range(10)]))
"""


def test_kauldron_worker_processes_run_its_worker_init_fn(tmp_path):
  g, l = [porting.run_script(KAULDRON_WORKERS, lib, tmp_path) for lib in porting.LIBS]
  assert [x for x, _, _ in l] == [x for x, _, _ in g] == list(range(10))  # data_sources_test.test_range
  assert {p for _, p, _ in l} == {p for _, p, _ in g} == {"false"}  # Maps ran in initialised workers only.
  assert {w for _, _, w in l} <= {w for _, _, w in g} == {"0/2", "1/2"}


# kauldron reads with ReadOptions(num_threads=0, prefetch_buffer_size=0); a
# training loop that skips a record whose parsing fails.
KAULDRON_SKIP_BAD_RECORD = """
import grain.python as grain


def parse(x):
  if x == 2:
    raise ValueError("corrupt record 2")
  return x


ds = grain.MapDataset.range(6).seed(1).map(parse).repeat(1).to_iter_dataset(
    read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
it = iter(ds)
seen = []
for _ in range(6):
  try:
    seen.append(next(it))
  except ValueError:
    seen.append("ValueError")
"""


def test_kauldron_read_options_without_threads_and_a_failing_record():
  g, l = porting.run_both(KAULDRON_SKIP_BAD_RECORD)
  # README "Porting from Grain", an element whose computation raises: with
  # ReadOptions(num_threads=0) Grain 0.2.18 raises it again on every call;
  # loader consumes it, raises once, and goes on with the following records.
  assert g.seen == [0, 1, "ValueError", "ValueError", "ValueError", "ValueError"]
  assert l.seen == [0, 1, "ValueError", 3, 4, 5]


# ---- kauldron/data/py/mixtures.py (+ mixtures_test.py) ----------------------

KAULDRON_MIXTURES = """
import dataclasses
import grain.python as grain
import jax
import numpy as np


def random_seed(rng):
  return int(jax.random.randint(rng, (), 0, np.iinfo(np.int32).max))


def source_ds(source, rng, shuffle=False):  # DataSourceBase.ds_for_current_process
  ds = grain.MapDataset.source(source).seed(random_seed(rng))
  ds = ds[jax.process_index() :: jax.process_count()]
  if shuffle:
    ds = ds.shuffle(seed=random_seed(jax.random.fold_in(rng, 1)))
  return ds


def mix(sources, weights=None, shuffle=True, seed=0):  # Mix.ds_for_current_process + _root_ds
  rng = jax.random.PRNGKey(seed)
  datasets = [source_ds(s, jax.random.fold_in(rng, i)) for i, s in enumerate(sources)]
  ds = grain.MapDataset.mix(datasets, weights=weights)
  if shuffle:
    ds = ds.shuffle(seed=random_seed(jax.random.fold_in(rng, 99)))
  ds = ds.repeat(1)
  return list(ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


sources = [grain.RangeDataSource(0, 10, 1), grain.RangeDataSource(100, 110, 1)]
unshuffled = mix(sources, shuffle=False)
shuffled = mix(sources)
weighted = mix([grain.RangeDataSource(0, 10, 1), grain.RangeDataSource(100, 104, 1)], weights=[3, 1], shuffle=False)


class EveryThird(grain.DatasetSelectionMap):  # For SelectFromDatasets(selection_map=...).

  def __len__(self):
    return 12

  def __getitem__(self, index):
    return (1, index // 3) if index % 3 == 2 else (0, index - index // 3)


rng = jax.random.PRNGKey(0)
datasets = [source_ds(s, jax.random.fold_in(rng, i)) for i, s in enumerate(sources)]
selected_ds = grain.MapDataset.select_from_datasets(datasets, selection_map=EveryThird())
selected = [len(selected_ds), list(selected_ds), list(selected_ds.shuffle(random_seed(jax.random.fold_in(rng, 5))))]
"""


def test_kauldron_mixtures():
  g, l = porting.run_both(KAULDRON_MIXTURES)
  _same(g, l, "unshuffled", "shuffled", "weighted", "selected")
  assert l.unshuffled == [x for i in range(10) for x in (i, 100 + i)]  # mixtures_test.py's expectation.


# ---- kauldron/data/iterators/pygrain_handler.py (+ its test) ----------------

KAULDRON_CHECKPOINT = """
import dataclasses
from typing import Any, SupportsIndex
from grain import python as grain
from orbax import checkpoint as ocp


class PyGrainCheckpointHandler(grain.PyGrainCheckpointHandler, ocp.CheckpointHandler):
  pass


@ocp.args.register_with_handler(PyGrainCheckpointHandler, for_save=True)
class PyGrainCheckpointSave(grain.PyGrainCheckpointSave):
  pass


@ocp.args.register_with_handler(PyGrainCheckpointHandler, for_restore=True)
class PyGrainCheckpointRestore(grain.PyGrainCheckpointRestore):
  pass


""" + KAULDRON_RANGE_SOURCE + """

def make_iter():
  ds = grain.MapDataset.source(RangeDataSource(num_elems=100)).seed(12).repeat(None)
  return iter(ds.to_iter_dataset(read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


ds_iter = make_iter()
for _ in range(10):
  next(ds_iter)
is_handler = isinstance(PyGrainCheckpointHandler(), ocp.CheckpointHandler)
mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(save_interval_steps=1))
mngr.save(1, args=ocp.args.Composite(ds=PyGrainCheckpointSave(ds_iter)))
mngr.wait_until_finished()
mngr.close()

mngr = ocp.CheckpointManager(directory)
fresh = make_iter()
restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(ds=PyGrainCheckpointRestore(fresh)))["ds"]
mngr.close()
after_restore = [isinstance(restored, grain.DatasetIterator), restored is fresh, next(restored), next(restored)]
"""


def test_kauldron_orbax_handler_subclass_restores_the_iterator(tmp_path):
  g, l = [porting.run(KAULDRON_CHECKPOINT, lib, directory=str(tmp_path / lib)) for lib in porting.LIBS]
  _same(g, l, "is_handler", "after_restore")
  assert l.after_restore[2:] == [10, 11]  # pygrain_handler_test's expectation.


# ---- gemma/gm/data/_tasks.py, _transforms.py, _functional.py ----------------

GEMMA_TASKS = """
import dataclasses
import textwrap
from typing import Any
from grain import python as grain
import jax
import numpy as np


class Tokenizer:  # Stand-in for gm.text.Gemma3Tokenizer: one id per character.
  FORMAT = None

  def encode(self, text, add_bos=False, add_eos=False):
    ids = [ord(c) % 40 + 3 for c in text]
    return np.asarray(([2] if add_bos else []) + ids + ([1] if add_eos else []), np.int32)


@jax.tree_util.register_dataclass  # gemma uses @flax.struct.dataclass.
@dataclasses.dataclass
class Seq2SeqFields:
  input: Any
  target: Any
  target_mask: Any


def make_seq2seq_fields(prompt, response):
  sequence = np.concatenate([prompt, response])
  target_mask = np.concatenate([np.zeros((len(prompt) - 1,), dtype=np.bool_), np.ones((len(response),), dtype=np.bool_)])
  return Seq2SeqFields(input=sequence[:-1], target=sequence[1:], target_mask=target_mask)


def _pad(element, *, max_length, fill_value=0, truncate=False):
  element = np.asarray(element)
  if not truncate and element.shape[-1] > max_length:
    raise ValueError(f"Cannot pad sequence of length {element.shape[-1]}. Set `truncate=True`.")
  tokens = element[..., :max_length]
  return np.pad(tokens, [(0, 0)] * (tokens.ndim - 1) + [(0, max_length - tokens.shape[-1])], constant_values=fill_value)


def pad(element, max_length, *, truncate=False):
  return jax.tree.map(lambda x: _pad(x, max_length=max_length, truncate=truncate), element)


def _format_prompt(prompt):
  return f"<start_of_turn>user\\n{prompt}<end_of_turn>\\n<start_of_turn>model\\n"


def _decode_bytes(element):
  return element.decode("utf-8") if isinstance(element, bytes) else element


@dataclasses.dataclass(kw_only=True, frozen=True)
class Seq2SeqTask(grain.MapTransform):
  in_prompt: str
  in_response: str
  out_input: str
  out_target: str
  out_target_mask: str
  drop_inputs: bool = True
  tokenizer: Tokenizer
  max_length: int
  truncate: bool = False
  sampling: bool = False

  def map(self, element):
    element = jax.tree.map(lambda x: x, element)  # etree.copy: do not mutate the input.
    prompt = element[self.in_prompt]
    response = element[self.in_response]
    if self.drop_inputs:
      del element[self.in_prompt]
      del element[self.in_response]
    prompt = _format_prompt(_decode_bytes(prompt))
    response = f"{_decode_bytes(response)}<end_of_turn>"
    if self.sampling:
      element[self.out_input] = prompt
      element[self.out_target] = response
      return element
    prompt = self.tokenizer.encode(prompt.replace("<start_of_turn>", "")[:12], add_bos=True)
    response = self.tokenizer.encode(response[:6])
    out = pad(make_seq2seq_fields(prompt=prompt, response=response), max_length=self.max_length,
              truncate=self.truncate)
    element[self.out_input] = out.input
    element[self.out_target] = out.target[..., None]  # einops '... -> ... 1'
    element[self.out_target_mask] = out.target_mask[..., None]
    return element


@dataclasses.dataclass(kw_only=True, frozen=True)
class ContrastiveTask(grain.MapTransform):
  in_prompt: str
  in_chosen: str
  in_rejected: str
  out_tokens: str
  out_targets: str
  out_mask: str
  tokenizer: Tokenizer
  max_length: int
  truncate: bool = False
  drop_inputs: bool = True

  def map(self, element):
    prompt = self.tokenizer.encode(_format_prompt(_decode_bytes(element[self.in_prompt]))[-8:], add_bos=True)
    chosen = self.tokenizer.encode(_decode_bytes(element[self.in_chosen]))
    rejected = self.tokenizer.encode(_decode_bytes(element[self.in_rejected]))
    fields = pad((make_seq2seq_fields(prompt=prompt, response=chosen), make_seq2seq_fields(prompt=prompt, response=rejected)),
                 max_length=self.max_length, truncate=self.truncate)
    out = jax.tree.map(lambda x, y: np.stack([x, y], axis=0), *fields)
    element[self.out_tokens] = out.input
    element[self.out_targets] = out.target
    element[self.out_mask] = out.target_mask
    if self.drop_inputs:
      del element[self.in_prompt]
      del element[self.in_chosen]
      del element[self.in_rejected]
    return element


@dataclasses.dataclass(kw_only=True, frozen=True)
class FormatText(grain.MapTransform):  # _transforms.FormatText on one key.
  key: str
  template: str

  def __post_init__(self):
    if "{text}" not in self.template:
      raise ValueError(f"Template must contain '{{text}}' placeholder, got {self.template!r}")
    object.__setattr__(self, "template", textwrap.dedent(self.template))

  def map(self, element):
    return {**element, self.key: self.template.format(text=element[self.key])}


@dataclasses.dataclass(kw_only=True, frozen=True)
class MapInts(grain.MapTransform):
  key: str
  old_to_new: dict

  def map(self, element):
    try:
      return {**element, self.key: self.old_to_new[element[self.key]]}
    except KeyError:
      raise KeyError(f"Label {element[self.key]} not found in `old_to_new`.") from None


tokenizer = Tokenizer()
rows = [{"prompt": f"Hello {i}!".encode(), "response": f"Bonjour {i}", "label": i % 3} for i in range(6)]
task = Seq2SeqTask(in_prompt="prompt", in_response="response", out_input="input", out_target="target",
                   out_target_mask="target_mask", tokenizer=tokenizer, max_length=20)
ds = (grain.MapDataset.source(rows).seed(0).shuffle()
      .map(FormatText(key="response", template="    {text} ."))
      .map(task).map(MapInts(key="label", old_to_new={0: 10, 1: 11, 2: 12})).batch(4))
batches = list(ds)
inputs_untouched = rows[0] == {"prompt": b"Hello 0!", "response": "Bonjour 0", "label": 0}
sampling = list(grain.MapDataset.source(rows).map(dataclasses.replace(task, sampling=True)).to_iter_dataset().batch(3))
try:
  list(grain.MapDataset.source(rows).map(dataclasses.replace(task, max_length=8)))
  too_long = "ok"
except ValueError as e:
  too_long = ["ValueError", "Cannot pad sequence" in str(e)]
try:
  grain.MapDataset.source(rows).map(MapInts(key="label", old_to_new={0: 1}))[1]
  missing_label = "ok"
except KeyError as e:
  missing_label = ["KeyError", str(e)]
pairs = [{"prompt": f"2+{i}?", "chosen": f"{2 + i}", "rejected": "42", "id": i} for i in range(5)]
contrastive = list(grain.MapDataset.source(pairs).map(ContrastiveTask(
    in_prompt="prompt", in_chosen="chosen", in_rejected="rejected", out_tokens="tokens", out_targets="targets",
    out_mask="mask", tokenizer=tokenizer, max_length=14)).to_iter_dataset().batch(2, drop_remainder=True))
"""


def test_gemma_task_transforms():
  g, l = porting.run_both(GEMMA_TASKS)
  _same(g, l, "batches", "inputs_untouched", "sampling", "too_long", "missing_label", "contrastive")
  assert l.inputs_untouched and porting.structure(l.batches[0]) == porting.structure(g.batches[0])
  assert l.too_long == ["ValueError", True]


# ---- gemma/diffusion/hackable_diffusion_adapter/data: in-place transforms, a
# lazy-reader source; gemma/gm/data/_parquet.py ------------------------------

GEMMA_SOURCES = """
import dataclasses
import functools
import pickle
from typing import Any, SupportsIndex
import grain.python as grain
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParquetDataSource(grain.RandomAccessDataSource):
  path: str

  @functools.cached_property
  def table(self) -> pa.Table:
    return pq.read_table(self.path)

  def __len__(self) -> int:
    return len(self.table)

  def __getitem__(self, record_key: SupportsIndex) -> dict[str, Any]:
    record = self.table.take([record_key])
    return {k: v[0] for k, v in record.to_pydict().items()}


class Reader:  # Stand-in for bagz.Reader: opens the file, not picklable.

  def __init__(self, path):
    self._file = open(path, "rb")
    self._records = pickle.load(self._file)

  def __len__(self):
    return len(self._records)

  def __getitem__(self, index):
    return self._records[index]


class PicklableBagzReader(grain.RandomAccessDataSource):

  def __init__(self, bagz_path: str):
    self.bagz_path = bagz_path
    self._reader = None
    self._length = None

  @property
  def reader(self):
    if self._reader is None:
      self._reader = Reader(self.bagz_path)
    return self._reader

  def __len__(self):
    if self._length is None:
      self._length = len(self.reader)
    return self._length

  def __getitem__(self, index):
    return self.reader[index]

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_reader"] = None
    return state


@dataclasses.dataclass(kw_only=True, frozen=True)
class CopyField(grain.MapTransform):
  src_key: str
  dst_key: str

  def map(self, features):
    features[self.dst_key] = features[self.src_key]
    return features


@dataclasses.dataclass(kw_only=True, frozen=True)
class CanvasChunker(grain.MapTransform):
  in_response: str = "response"
  num_canvases: int = 3
  canvas_size: int = 4
  eos_token: int = 1
  pad_token: int = 0

  def map(self, features):
    response = np.asarray(features[self.in_response])
    total_capacity = self.num_canvases * self.canvas_size
    response_truncated = response[:total_capacity]
    n = len(response_truncated)
    flat = np.full(total_capacity, self.pad_token, dtype=response.dtype)
    flat[:n] = response_truncated
    if n > 0:
      last_canvas_idx = (n - 1) // self.canvas_size
      flat[n:(last_canvas_idx + 1) * self.canvas_size] = self.eos_token
      num_valid_canvases = last_canvas_idx + 1
    else:
      num_valid_canvases = 0
    canvas_mask = np.zeros(total_capacity, dtype=np.bool_)
    canvas_mask[: num_valid_canvases * self.canvas_size] = True
    features["canvas"] = flat
    features["canvas_id"] = np.repeat(np.arange(self.num_canvases), self.canvas_size)
    features["canvas_mask"] = canvas_mask
    return features


@dataclasses.dataclass(kw_only=True, frozen=True)
class ReformatAnswer(grain.MapTransform):  # ReformatPubMedQAAnswer
  response_key: str = "response_text"
  answer_key: str = "short_answer"

  def map(self, features):
    answer = features[self.answer_key].strip().lower()
    response = features[self.response_key]
    if isinstance(response, bytes):
      response = response.decode("utf-8")
    features[self.response_key] = f"{response.strip()} The answer is: {answer}"
    return features


def drop_response(features):  # The ragged tokens do not batch; kd.data.Elements(keep=...) in gemma.
  return {k: v for k, v in features.items() if k != "response"}


def bagz_ds(source, slice_start=0, slice_stop=None, shuffle=True, seed=3):  # sudoku_data.Bagz.ds_for_current_process
  ds = grain.MapDataset.source(source)
  ds = ds.seed(seed)
  if slice_start != 0 or slice_stop is not None:
    ds = ds.slice(slice(slice_start, slice_stop))
  ds = ds[jax.process_index() :: jax.process_count()]
  if shuffle:
    ds = ds.shuffle(seed=seed + 1)
  return ds


table = pa.table({"response_text": [f" answer {i} " for i in range(9)], "short_answer": ["Yes ", " no", "MAYBE"] * 3,
                  "response": [list(range(i)) for i in range(9)]})
pq.write_table(table, parquet_path)
parquet = ParquetDataSource(path=parquet_path)
parquet_rows = [len(parquet), parquet[2]]
ds = (bagz_ds(parquet, slice_start=1, slice_stop=8).map(CopyField(src_key="response_text", dst_key="raw"))
      .map(ReformatAnswer()).map(CanvasChunker()).map(drop_response))
parquet_batches = list(ds.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500)).batch(3))

with open(bagz_path, "wb") as f:
  pickle.dump([{"response_text": b"x%d" % i, "short_answer": "Yes", "response": np.arange(i % 5)} for i in range(10)], f)
source = PicklableBagzReader(bagz_path)
len(source)
import cloudpickle  # As worker processes receive it.
state_has_no_reader = cloudpickle.loads(cloudpickle.dumps(source))._reader is None
bagz_batches = list(bagz_ds(source).map(ReformatAnswer()).map(CanvasChunker()).map(drop_response).batch(4))
"""

# Records that a map changed in place are read again: a Python list of dicts, as
# in a test or notebook stand-in for TFDS (ReformatPubMedQAAnswer, CopyField).
IN_PLACE_ON_A_LIST = """
import dataclasses
import grain.python as grain


@dataclasses.dataclass(kw_only=True, frozen=True)
class ReformatAnswer(grain.MapTransform):
  def map(self, features):
    features["response_text"] = f"{features['response_text'].strip()} The answer is: {features['short_answer']}"
    return features


rows = [{"response_text": f"r{i}", "short_answer": "yes"} for i in range(4)]
one_epoch = [x["response_text"] for x in grain.MapDataset.source(rows).map(ReformatAnswer()).to_iter_dataset()]
rows_after = [r["response_text"] for r in rows]
"""


def test_gemma_sources_and_in_place_transforms(tmp_path):
  g, l = porting.run_both(GEMMA_SOURCES, parquet_path=str(tmp_path / "d.parquet"), bagz_path=str(tmp_path / "d.bagz"))
  _same(g, l, "parquet_rows", "parquet_batches", "state_has_no_reader", "bagz_batches")
  g, l = porting.run_both(IN_PLACE_ON_A_LIST)
  _same(g, l, "one_epoch", "rows_after")
  assert l.one_epoch == [f"r{i} The answer is: yes" for i in range(4)]


# ---- flax examples/gemma/input_pipeline_grain.py and tokenizer.py -----------

FLAX_GEMMA = """
import dataclasses
import os
import typing as tp
import grain
from grain.experimental import pick_performance_config
from grain.python import MapTransform, MultiprocessingOptions
import jax
import numpy as np

Features = dict[str, tp.Any]


class TfdsLike:  # Stand-in for tfds.data_source("lm1b", split=...): fresh dicts on every read.

  def __init__(self, n):
    self._n = n

  def __len__(self):
    return self._n

  def __getitem__(self, i):
    return {"text": "ab cd " * (i % 5) + f"line {i}"}


class SentencePieceStandIn:  # EncodeAsIds / bos_id / eos_id / pad_id, one id per character.

  def EncodeAsIds(self, text):
    return [ord(c) % 50 + 3 for c in text]

  def bos_id(self):
    return 2

  def eos_id(self):
    return 1

  def pad_id(self):
    return 0


class NormalizeFeatureNamesOp:

  def __call__(self, features: Features) -> Features:
    features["inputs"] = features.pop("text")
    features["targets"] = features["inputs"]
    return features


@dataclasses.dataclass
class TokenizeOpNumpy:
  sp_processor: tp.Any
  data_keys: tp.Iterable[str] = ("inputs", "targets")

  def __call__(self, features):
    for k in self.data_keys:
      features[k] = self.sp_processor.EncodeAsIds(features[k])
      features[k] = np.array([self.sp_processor.bos_id()] + features[k] + [self.sp_processor.eos_id()], dtype=np.int32)
    return features


@dataclasses.dataclass
class Rekey(MapTransform):

  def __init__(self, mapping_dict, keep_old_keys=False):
    self.mapping_dict = mapping_dict
    self.keep_old_keys = keep_old_keys

  def map(self, element):
    old_keys = set()
    for new_key, old_key in self.mapping_dict.items():
      element[new_key] = element[old_key]
      old_keys.add(old_key)
    if not self.keep_old_keys:
      for key in old_keys:
        del element[key]
    return element


def padded_batch(dataset, batch_size, padded_size, padding_value, drop_remainder):
  def padded_batching(values):
    def map_fn(*arrays):
      padded_arrays = [np.pad(array, (0, padded_size - array.shape[0]), "constant", constant_values=padding_value)
                       for array in arrays]
      return np.stack(padded_arrays)
    return jax.tree.map(map_fn, *values)
  return dataset.batch(batch_size, batch_fn=padded_batching, drop_remainder=drop_remainder)


def shift_target_left(x, pad_id):
  targets = x["targets"][..., 1:]
  targets = np.pad(targets, [(0, 0), (0, 1)], "constant", constant_values=pad_id)
  x["targets"] = targets
  if "targets_segmentation" in x:
    x["targets_segmentation"][..., -1] = 0  # In place, on the batch.
  return x


def preprocess_data(dataset, shuffle, num_epochs=1, pack_examples=True, max_length=512, batch_size=256,
                    drop_remainder=True, shift=True, seed=41, prefetch_num_workers=None, pad_id=0):
  def length_filter(max_len):
    def filter_fn(x):
      source, target = x["inputs"], x["targets"]
      return max(len(source), len(target)) < max_len + 1
    return filter_fn

  if max_length > 0:
    dataset = dataset.filter(length_filter(max_length))
  if shuffle:
    dataset = dataset.shuffle(seed=seed)
  dataset = dataset.repeat(num_epochs)
  dataset = dataset.to_iter_dataset()
  if pack_examples:
    length_struct = {k: max_length for k in ["inputs", "targets"]}
    dataset = grain.experimental.FirstFitPackIterDataset(dataset, length_struct=length_struct, num_packing_bins=30)
    rekey_dict = {"targets_segmentation": "targets_segment_ids", "inputs_segmentation": "inputs_segment_ids",
                  "targets_position": "targets_positions", "inputs_position": "inputs_positions"}
    dataset = dataset.map(Rekey(rekey_dict))
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
  else:
    dataset = padded_batch(dataset, batch_size, padded_size=max_length, padding_value=pad_id,
                           drop_remainder=drop_remainder)
  if shift:
    dataset = dataset.map(lambda x: shift_target_left(x, pad_id=pad_id))
  if prefetch_num_workers is None:
    performance_config = pick_performance_config(ds=dataset, ram_budget_mb=1024, max_workers=os.cpu_count() // 2,
                                                 max_buffer_size=None)
    mp_options = performance_config.multiprocessing_options
  else:
    mp_options = MultiprocessingOptions(num_workers=prefetch_num_workers)
  dataset = dataset.mp_prefetch(mp_options)
  return dataset.map(lambda x: jax.tree.map(jax.numpy.asarray, x))


sp = SentencePieceStandIn()
train_data = grain.MapDataset.source(TfdsLike(40)).map(NormalizeFeatureNamesOp()).map(TokenizeOpNumpy(sp))
eval_data = grain.MapDataset.source(TfdsLike(11)).map(NormalizeFeatureNamesOp()).map(TokenizeOpNumpy(sp))
train_ds = preprocess_data(train_data, shuffle=True, num_epochs=None, pack_examples=True, batch_size=3,
                           max_length=24, seed=7, prefetch_num_workers=0, pad_id=sp.pad_id())
it = iter(train_ds)
train = [next(it) for _ in range(4)]
train_types = sorted({type(v).__name__ for b in train for v in b.values()})
eval_ds = preprocess_data(eval_data, shuffle=False, pack_examples=False, batch_size=4, max_length=40,
                          prefetch_num_workers=0, pad_id=sp.pad_id())
evals = list(eval_ds)
picked = pick_performance_config(ds=eval_ds, ram_budget_mb=1024, max_workers=1, max_buffer_size=None)
picked = [type(picked.multiprocessing_options).__name__, picked.multiprocessing_options.num_workers <= 1]

rows = [{"text": f"line {i}"} for i in range(50)]  # An in-memory list: the map pops from the very dicts.
from_list = [x["inputs"] for x in grain.MapDataset.source(rows).map(NormalizeFeatureNamesOp()).to_iter_dataset()]
"""


def test_flax_gemma_input_pipeline():
  g, l = porting.run_both(FLAX_GEMMA)
  _same(g, l, "train", "train_types", "evals", "picked", "from_list")
  assert porting.structure(l.train[0]) == porting.structure(g.train[0])
  assert sorted(l.train[0]) == ["inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position",
                                "targets_segmentation"]


# The same pipeline with worker processes (the example's default picks them):
# packing and batching come after `to_iter_dataset`, so Grain packs each
# worker's slice of the records; loader packs the stream it reads with 0 workers.
FLAX_GEMMA_WORKERS = FLAX_GEMMA.split("sp = SentencePieceStandIn()")[0] + """
if __name__ == "__main__":
  import json
  import sys
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  sp = SentencePieceStandIn()
  out = {}
  for workers in (0, 2):
    data = grain.MapDataset.source(TfdsLike(int(sys.argv[1]))).map(NormalizeFeatureNamesOp()).map(TokenizeOpNumpy(sp))
    ds = preprocess_data(data, shuffle=True, num_epochs=1, pack_examples=True, batch_size=2, max_length=24,
                         seed=7, prefetch_num_workers=workers, pad_id=sp.pad_id())
    out[workers] = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in ds]
  # Each worker's own slice, as Grain's worker w reads it: records w, w + 2, ... of the MapDataset part.
  for w in (0, 1):
    data = grain.MapDataset.source(TfdsLike(int(sys.argv[1]))).map(NormalizeFeatureNamesOp()).map(TokenizeOpNumpy(sp))
    data = data.filter(lambda x: max(len(x["inputs"]), len(x["targets"])) < 25).shuffle(seed=7).repeat(1)[w::2]
    ds = grain.experimental.FirstFitPackIterDataset(data.to_iter_dataset(), length_struct={"inputs": 24, "targets": 24},
                                                    num_packing_bins=30)
    ds = ds.map(Rekey({"targets_segmentation": "targets_segment_ids", "inputs_segmentation": "inputs_segment_ids",
                       "targets_position": "targets_positions", "inputs_position": "inputs_positions"}))
    ds = ds.batch(2, drop_remainder=True).map(lambda x: shift_target_left(x, pad_id=sp.pad_id()))
    out[f"slice{w}"] = [{k: np.asarray(v).tolist() for k, v in b.items()} for b in ds]
  print(json.dumps(out))
"""


def test_flax_gemma_input_pipeline_with_workers(tmp_path):
  g = porting.run_script(FLAX_GEMMA_WORKERS, "grain", tmp_path, "16")
  l = porting.run_script(FLAX_GEMMA_WORKERS, "loader", tmp_path, "16")
  assert l["0"] == g["0"]
  # README "Porting from Grain", worker-count-invariant batching: loader's
  # stream is the one without workers; Grain's takes the two workers' packed
  # batches in turn.
  assert l["2"] == l["0"]
  interleaved = [b for pair in zip(g["slice0"], g["slice1"]) for b in pair]
  longer = g["slice0"] if len(g["slice0"]) > len(g["slice1"]) else g["slice1"]
  interleaved += longer[min(len(g["slice0"]), len(g["slice1"])):]
  assert g["2"] == interleaved
  assert g["2"] != g["0"]


# ---- DataLoader tutorials: flax docs_nnx/examples/{image_segmentation,
# machine_translation,minigpt,vit_training}.md, docs_nnx/guides/data_loaders.md,
# jax-ai-stack docs/source/JAX_time_series_classification.md,
# data_loaders_on_gpu_with_jax.md, jax_ai_stack/tests/test_nnx_with_grain.py --

DATA_LOADER_TUTORIALS = """
import dataclasses
from absl import flags
import grain.python as grain
import numpy as np

flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags (a notebook has them parsed).


class DataSource(grain.RandomAccessDataSource):  # JAX_time_series_classification.md

  def __init__(self, x, y):
    self._x = x
    self._y = y

  def __getitem__(self, idx):
    return {"measurement": self._x[idx], "label": self._y[idx]}

  def __len__(self):
    return len(self._x)


class DataAugs(grain.MapTransform):  # image_segmentation.md: wraps an albumentations Compose.

  def __init__(self, transforms):
    self.albu_transforms = transforms

  def map(self, data):
    output = self.albu_transforms(**data)
    return output


def train_transforms(measurement, label):  # Stand-in for A.Compose([...]).
  return {"measurement": measurement[::-1] * 2, "label": label}


x_train = np.arange(46 * 6, dtype=np.float32).reshape(46, 6)
y_train = np.arange(46)
train_source = DataSource(x_train, y_train)
seed = 12


def loaders(worker_count, operations=True):
  train_sampler = grain.IndexSampler(len(train_source), shuffle=True, seed=seed, shard_options=grain.NoSharding(),
                                     num_epochs=1)
  val_sampler = grain.IndexSampler(len(train_source), shuffle=False, seed=seed, shard_options=grain.NoSharding(),
                                   num_epochs=1)
  train_loader = grain.DataLoader(data_source=train_source, sampler=train_sampler, worker_count=worker_count,
                                  worker_buffer_size=2,
                                  operations=[DataAugs(train_transforms), grain.Batch(8, drop_remainder=True)]
                                  if operations else [DataAugs(train_transforms)])
  val_loader = grain.DataLoader(data_source=train_source, sampler=val_sampler, worker_count=worker_count,
                                worker_buffer_size=2, operations=[grain.Batch(16)] if operations else [])
  # train_eval_loader: another DataLoader on the same sampler object.
  train_eval_loader = grain.DataLoader(data_source=train_source, sampler=train_sampler, worker_count=worker_count,
                                       worker_buffer_size=2, operations=[grain.Batch(16, drop_remainder=True)])
  return train_loader, val_loader, train_eval_loader


def read(worker_count, operations=True):
  train_loader, val_loader, train_eval_loader = loaders(worker_count, operations)
  out = {"train": list(train_loader)}
  if not worker_count:
    out["first"] = next(iter(train_loader))  # The tutorials peek at one batch, then train from the start.
    out["val"] = list(val_loader)
    out["train_eval"] = list(train_eval_loader)
  return out


in_process = read(0)
records = read(0, operations=False)  # Unbatched: each record's position in the sampler's order.
with_workers = read(worker_count)


class TextDataset:  # minigpt.md / JAX_for_LLM_pretraining.md: a plain class, tokenizing in __getitem__.

  def __init__(self, data, maxlen):
    self.data, self.maxlen = data, maxlen

  def __len__(self):
    return len(self.data)

  def __getitem__(self, idx):
    encoding = [ord(c) for c in self.data[idx]][: self.maxlen]
    return encoding + [0] * (self.maxlen - len(encoding))


text = TextDataset([f"story {i} " * (i % 3 + 1) for i in range(10)], maxlen=12)
text_dl = grain.DataLoader(data_source=text, sampler=grain.IndexSampler(len(text), shuffle=False, seed=42,
                                                                         shard_options=grain.NoSharding(), num_epochs=2),
                           operations=[grain.Batch(batch_size=4, drop_remainder=True)])
text_batches = [[type(b).__name__, b] for b in text_dl]


class Dataset:  # data_loaders_on_gpu_with_jax.md: (image, label) tuples.

  def __len__(self):
    return 10

  def __getitem__(self, index):
    return np.ravel(np.full((2, 2), index, dtype=np.float32)), index % 4


sampler = grain.SequentialSampler(num_records=10, shard_options=grain.NoSharding())
epochs = []
for epoch in range(2):  # A new DataLoader per epoch.
  epochs.append([[type(b).__name__, x.tolist(), y.tolist()] for b in [*grain.DataLoader(
      data_source=Dataset(), sampler=sampler, operations=[grain.Batch(4)])] for x, y in [b]])


class DownSample(grain.MapTransform):  # test_nnx_with_grain.py
  shape: tuple[int, int]

  def __init__(self, shape):
    self.shape = shape

  def map(self, element):
    image = element["image"]
    element["image_scaled"] = image - image.mean()
    return element


class Mnist:  # Stand-in for tfds.data_source("mnist", split="train").

  def __len__(self):
    return 5

  def __getitem__(self, i):
    return {"image": np.full((4, 4, 1), i, np.uint8), "label": np.int64(i)}


nnx = [{k: v.tolist() for k, v in b.items()} for b in grain.DataLoader(
    data_source=Mnist(), operations=[DownSample((16, 16))], worker_count=0,
    sampler=grain.IndexSampler(num_records=5, num_epochs=1, shard_options=grain.NoSharding(), shuffle=True, seed=0))]
"""


def _per_worker_batches(records, worker_count, batch_size, drop_remainder):
  """Grain's DataLoader with workers: worker w batches records w, w + N, ...; the workers' batches are taken in turn."""
  per_worker = []
  for w in range(worker_count):
    mine = records[w::worker_count]
    stop = len(mine) - len(mine) % batch_size if drop_remainder else len(mine)
    per_worker.append([mine[i:i + batch_size] for i in range(0, stop, batch_size)])
  out = []
  for i in range(max(map(len, per_worker))):
    out += [batches[i] for batches in per_worker if i < len(batches)]
  return out


def test_data_loader_tutorials_with_worker_processes():
  g, l = porting.run_both(DATA_LOADER_TUTORIALS, worker_count=2)
  _same(g, l, "in_process", "records", "text_batches", "epochs", "nnx")
  # README "Porting from Grain", worker-count-invariant batching: loader reads
  # the stream it reads with 0 workers (drop_remainder drops one remainder).
  assert plain(l.with_workers["train"]) == plain(l.in_process["train"])
  assert plain(l.in_process["first"]) == plain(l.in_process["train"][0])
  # Grain batches each worker's slice: 46 records, 2 workers, batches of 8 with
  # drop_remainder: 4 batches (each worker drops its last 7 records), loader 5.
  train_records = [r["label"] for r in plain(g.records["train"])]
  labels = lambda batches: [b["label"] for b in plain(batches)]
  assert labels(g.with_workers["train"]) == _per_worker_batches(train_records, 2, 8, True)
  assert (len(g.with_workers["train"]), len(l.with_workers["train"])) == (4, 5)


# ---- blaxbird 0.0.1 (PyPI sdist) examples/dataloader.py: a jax.random seed,
# the private `Batch`, and ShardOptions given to both the sampler and the
# DataLoader (plus the other combinations of the two arguments).

BLAXBIRD_SHARD_OPTIONS = """
import grain.python as grain
from grain._src.core.transforms import Batch
from jax import numpy as jnp
from jax import random as jr

source = list(range(100, 120))


def data_loader(sampler_shard, loader_shard, shuffle=True, n_epochs=2, batch_size=3):
  max_int32 = jnp.iinfo(jnp.int32).max
  seed = jr.randint(jr.PRNGKey(0), shape=(), minval=0, maxval=max_int32)
  index_sampler = grain.IndexSampler(num_records=len(source), num_epochs=n_epochs, shard_options=sampler_shard,
                                     shuffle=shuffle, seed=int(seed))
  shard_kwargs = {} if loader_shard is None else {"shard_options": loader_shard}
  return grain.DataLoader(data_source=source, operations=[Batch(batch_size, drop_remainder=True)],
                          sampler=index_sampler, worker_count=0, **shard_kwargs)


out = {}
for name, (sampler_shard, loader_shard) in {
    "blaxbird": (grain.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True),) * 2,
    "sampler_only": (grain.ShardOptions(1, 2, drop_remainder=True), None),
    "loader_only": (grain.NoSharding(), grain.ShardOptions(1, 2)),
    "both_differ": (grain.ShardOptions(0, 2), grain.ShardOptions(1, 2)),
    "loader_of_3": (grain.NoSharding(), grain.ShardOptions(2, 3, drop_remainder=True)),
}.items():
  out[name] = [b.tolist() for b in data_loader(sampler_shard, loader_shard)]
"""


def test_blaxbird_shard_options_on_sampler_and_data_loader():
  g, l = porting.run_both(BLAXBIRD_SHARD_OPTIONS)
  assert l.out == g.out
  read = [v for b in l.out["blaxbird"] for v in b]  # 2 epochs of 20 records, in batches of 3: 1 dropped.
  assert len(read) == 39 and all(1 <= read.count(v) <= 2 for v in range(100, 120))


# ---- maxdiffusion: input_pipeline/_grain_data_processing.py, multihost_dataloading.py,
# checkpointing/base_stable_diffusion_checkpointer.py; kauldron/contrib/data/array_record.py

MAXDIFFUSION = """
import dataclasses
import functools
import glob
import json
from collections.abc import Iterable
from typing import SupportsIndex
import numpy as np
import orbax.checkpoint as ocp
import tensorflow as tf
import grain.python as grain


class MultiHostDataLoadIterator:  # multihost_dataloading.py, without the device mesh.

  def __init__(self, dataloader):
    self.dataloader = dataloader
    if isinstance(self.dataloader, tf.data.Dataset):
      self.local_iterator = self.dataloader.as_numpy_iterator()
    elif isinstance(self.dataloader, Iterable):
      self.local_iterator = iter(self.dataloader)
    else:
      raise ValueError("Type error: dataloader should be either tf.data.Dataset or Iterable.")

  def reset(self):
    self.local_iterator = iter(self.dataloader)

  def __iter__(self):
    self.reset()
    return self

  def __next__(self):
    return next(self.local_iterator)


@dataclasses.dataclass
class ParseFeatures(grain.MapTransform):

  def __init__(self):
    self.feature_description = {
        "moments": tf.io.FixedLenFeature([], tf.string),
        "clip_embeddings": tf.io.FixedLenFeature([], tf.string),
    }

  def map(self, example):
    def _parse(example):
      features = tf.io.parse_single_example(example, self.feature_description)
      moments = tf.io.parse_tensor(np.asarray(features["moments"]), out_type=tf.float32)
      clip_embeddings = tf.io.parse_tensor(np.asarray(features["clip_embeddings"]), out_type=tf.float32)
      return {"pixel_values": moments, "input_ids": clip_embeddings}
    return _parse(example)


class LazyArrayRecordDataSource(grain.RandomAccessDataSource):  # kauldron/contrib/data/array_record.py

  def __init__(self, paths):
    self.paths = paths

  @functools.cached_property
  def _data_source(self):
    return grain.ArrayRecordDataSource(self.paths)

  def __len__(self) -> int:
    return len(self._data_source)

  def __getitem__(self, record_key: SupportsIndex) -> bytes:
    return self._data_source[record_key]


def make_grain_iterator(config, dataloading_host_index, dataloading_host_count, global_batch_size, lazy=False):
  data_files = glob.glob(config["grain_train_files"])
  data_source = (LazyArrayRecordDataSource if lazy else grain.ArrayRecordDataSource)(data_files)
  operations = []
  operations.append(ParseFeatures())
  operations.append(grain.Batch(batch_size=global_batch_size // dataloading_host_count, drop_remainder=True))
  index_sampler = grain.IndexSampler(
      num_records=len(data_source),
      num_epochs=None,
      shard_options=grain.ShardOptions(
          shard_index=dataloading_host_index, shard_count=dataloading_host_count, drop_remainder=True
      ),
      shuffle=True,
      seed=config["seed"],
  )
  dataloader = grain.DataLoader(data_source=data_source, operations=operations, sampler=index_sampler,
                                worker_count=config["grain_worker_count"])
  return MultiHostDataLoadIterator(dataloader)


def described(batch):
  return {k: [type(v).__name__, str(v.dtype), v.tolist()] for k, v in batch.items()}


config = {"grain_train_files": files_pattern, "seed": 3, "grain_worker_count": 0}
hosts = []
for host in range(2):
  data_iter = make_grain_iterator(config, host, 2, global_batch_size=4)
  hosts.append([described(next(data_iter)) for _ in range(4)])  # 2 epochs of this host's 5 records (drop 1).
lazy_iter = make_grain_iterator(config, 0, 2, global_batch_size=4, lazy=True)
lazy = [described(next(lazy_iter)) for _ in range(2)]
restarted = described(next(iter(lazy_iter)))  # __iter__ resets: the stream starts again.

# Checkpoint the data iterator with the model's items, as save_checkpoint / restore_data_iterator_state do.
data_iterator = make_grain_iterator(config, 1, 2, global_batch_size=4)
head = [described(next(data_iterator)) for _ in range(3)]
mngr = ocp.CheckpointManager(directory)
mngr.save(3, args=ocp.args.Composite(unet_config=ocp.args.JsonSave({"layers": 2}),
                                     iter=grain.PyGrainCheckpointSave(data_iterator.local_iterator)))
mngr.wait_until_finished()
expected = [described(next(data_iterator)) for _ in range(3)]
resumed_iterator = make_grain_iterator(config, 1, 2, global_batch_size=4)
iter_saved = (mngr.directory / str(mngr.latest_step()) / "iter").exists()
restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
    iter=grain.PyGrainCheckpointRestore(resumed_iterator.local_iterator)))
resumed_iterator.local_iterator = restored["iter"]
mngr.close()
resumed = [described(next(resumed_iterator)) for _ in range(3)]
"""


def _tf_example_records():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  records = []
  for i in range(11):
    moments = tf.io.serialize_tensor(tf.constant(np.full((2, 2), i, np.float32))).numpy()
    clip = tf.io.serialize_tensor(tf.constant(np.arange(3, dtype=np.float32) + 10 * i)).numpy()
    records.append(tf.train.Example(features=tf.train.Features(feature={
        "moments": tf.train.Feature(bytes_list=tf.train.BytesList(value=[moments])),
        "clip_embeddings": tf.train.Feature(bytes_list=tf.train.BytesList(value=[clip])),
    })).SerializeToString())
  return records


def test_maxdiffusion_grain_pipeline_and_orbax_checkpoint(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  records = _tf_example_records()
  for shard, (start, stop) in enumerate(((0, 6), (6, 11))):
    writer = ArrayRecordWriter(str(tmp_path / f"train.array_record-{shard:05d}-of-00002"), "group_size:1")
    for r in records[start:stop]:
      writer.write(r)
    writer.close()
  g, l = [porting.run(MAXDIFFUSION, lib, files_pattern=str(tmp_path / "train.array_record-*"),
                      directory=str(tmp_path / f"ckpt_{lib}")) for lib in porting.LIBS]
  _same(g, l, "hosts", "lazy", "restarted", "head", "expected", "iter_saved", "resumed")
  assert l.resumed == l.expected and l.iter_saved
  assert l.hosts[0][0]["pixel_values"][:2] == ["ndarray", "float32"]  # TF tensors are batched into numpy arrays.
  first_epoch = lambda batches: {row[0] for b in batches[:2] for row in b["input_ids"][2]}
  assert not first_epoch(l.hosts[0]) & first_epoch(l.hosts[1])  # The hosts read disjoint shards.


# ---- crossformer: data/grain/sharding.py, map/flatmap.py, loader.py, pipelines.py

CROSSFORMER = """
from bisect import bisect_right
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Sequence, TypeVar
import grain
from grain._src.core import transforms
from grain._src.python.dataset import dataset
import grain.experimental as ge
from grain.experimental import ThreadPrefetchIterDataset
import grain.python as gp
import jax
import numpy as np

T = TypeVar("T")
S = TypeVar("S")


def create_shard_options(*, shard_count=None, shard_index=None, drop_remainder=False, use_jax_process=False):
  if use_jax_process:
    return gp.ShardByJaxProcess(drop_remainder=drop_remainder)
  if shard_count is None:
    return gp.ShardOptions(shard_index=0, shard_count=1, drop_remainder=drop_remainder)
  if shard_index is None:
    raise ValueError("shard_index must be provided when shard_count is set")
  return gp.ShardOptions(shard_index=int(shard_index), shard_count=int(shard_count), drop_remainder=drop_remainder)


shard_options = [[type(o).__name__, o.shard_index, o.shard_count, o.drop_remainder] for o in (
    create_shard_options(), create_shard_options(shard_count=4, shard_index=np.int64(3), drop_remainder=True),
    create_shard_options(use_jax_process=True, drop_remainder=True))]


class PrivilegedFlatMapMapDataset(dataset.MapDataset[T], Generic[T, S]):
  _MUTATES_ELEMENT_SPEC = False

  def __init__(self, parent, transform, lengths_dict, *, preserve_insertion_order=True):
    super().__init__(parent)
    self._transform = transform
    lengths_dict = {int(k): v for k, v in lengths_dict.items()}
    eids = list(lengths_dict.keys()) if preserve_insertion_order else sorted(lengths_dict.keys(), key=int)
    self._elem_indices = [int(e) for e in eids]
    self._lens = [int(lengths_dict[e]) for e in eids]
    self._starts = []
    acc = 0
    for L in self._lens:
      self._starts.append(acc)
      acc += L
    self._total_len = acc
    self._elem_cache = {}
    self._splits_cache = {}

  def __len__(self):
    return self._total_len

  def __str__(self):
    return f"PrivilegedFlatMapMapDataset(total={self._total_len})"

  def _locate(self, flat_index):
    k = bisect_right(self._starts, flat_index) - 1
    if k < 0 or k >= len(self._starts):
      raise IndexError(flat_index)
    return k, flat_index - self._starts[k]

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if index < 0 or index >= self._total_len:
      raise IndexError(index)
    with self._stats.record_self_time():
      k, split_idx = self._locate(index)
      if k not in self._elem_cache and k not in self._splits_cache:
        elem = self._parent[k]
        items = self._transform.flat_map(elem)
        self._splits_cache[k] = {i: items[i] for i in range(len(items))}
      out = self._splits_cache[k][split_idx]
      return self._stats.record_output_spec(out)


def traj_len(element, key):
  node = element
  for part in key.split("."):
    node = node[part]
  return len(node)


@dataclass
class UnpackFlatMap(ge.FlatMapTransform):
  max_fan_out: int = 1500
  key: str = "info.id.step_id"
  use_np: bool = False

  def flat_map(self, element) -> Sequence[Any]:
    n = int(traj_len(element, self.key))
    _e = jax.tree.map(np.array, element)
    return [jax.tree.map(lambda x: np.array(x[i]), _e) for i in range(n)]


def trajectories(offset, lengths):
  return [{"proprio": np.arange(n * 2, dtype=np.float32).reshape(n, 2) + offset + 10 * e,
           "image": {"primary": np.full((n, 2, 2, 3), e + offset, np.uint8)},
           "info": {"id": {"step_id": np.arange(n), "episode": np.full(n, e + offset)}}}
          for e, n in enumerate(lengths)]


def steps_ds(offset, lengths, seed):
  base = grain.MapDataset.source(trajectories(offset, lengths)).seed(42)
  ds = PrivilegedFlatMapMapDataset(base, UnpackFlatMap(use_np=True), {i: n for i, n in enumerate(lengths)})
  return (ds
          .map(lambda x: x | {"action": x["proprio"].copy()})
          .map(lambda x: x | {"observation": {k: x.pop(k) for k in ["image", "proprio"]}})
          .map(lambda x: x | {"language.embedding": np.zeros((4,), dtype=np.float32)}))


def add_mask(x):
  x.setdefault("mask", {}).update({"timestep_pad_mask": np.ones_like(x["info"]["id"]["step_id"]).astype(np.bool_)})
  x["observation"]["timestep_pad_mask"] = x["mask"]["timestep_pad_mask"]
  return x


def np2jax(x):
  return jax.tree.map(lambda y: jax.numpy.array(y), x)


grain.config.update("py_debug_mode", False)
a, b = steps_ds(0, [3, 1, 2], 0), steps_ds(100, [2, 2, 2], 1)  # Equal lengths: mix never reads past an end.
flat_info = [len(a), str(a._parent._parent._parent), a._parent._parent._parent._MUTATES_ELEMENT_SPEC,
             issubclass(UnpackFlatMap, transforms.FlatMap),
             next(iter(a)), list(a[2:5])]
try:
  a._parent._parent._parent[6]
  past_the_end = "read"
except IndexError:
  past_the_end = "IndexError"
ds = grain.MapDataset.mix([a, b], weights=[1.0] * 2)
ds = ds.seed(5)
ds = ds.shuffle()  # The seed comes from ds.seed.
ds = ds.repeat()
ds = (ds.map(add_mask).map(lambda x: jax.tree.map(lambda y: np.array(y), x))
      .to_iter_dataset(grain.ReadOptions(num_threads=8)))
ds = ds.batch(3, drop_remainder=True)
first = next(iter(ds))
ds.dataset_statistics = {"action": {"mean": 0.5}}
statistics = ds.dataset_statistics
ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2)
ds = ds.map(np2jax)
it = iter(ds)
batches = [next(it) for _ in range(4)]  # One epoch: the subclass raises IndexError past its end.
batch_types = sorted({type(v).__name__ for b in batches for v in jax.tree.leaves(b)})
try:
  next(it)
  second_epoch = "batch"
except IndexError as e:
  second_epoch = ["IndexError", str(e).splitlines()[0]]
"""


def test_crossformer_pipeline():
  g, l = porting.run_both(CROSSFORMER)
  _same(g, l, "shard_options", "flat_info", "past_the_end", "first", "statistics", "batches", "batch_types",
        "second_epoch")
  assert plain(l.batches[0]) == plain(l.first)


# crossformer/data/grain/pipelines.py debug_dataset: stage timing and Grain's
# private execution-summary helpers.
CROSSFORMER_DEBUG = """
import grain
from grain._src.python import dataset as gd
import grain.experimental as ge

ds = grain.MapDataset.range(20).map(lambda x: x + 1).to_iter_dataset().batch(2)
options = ge.DatasetOptions(execution_tracking_mode=ge.ExecutionTrackingMode.STAGE_TIMING)
ds = ge.WithOptionsIterDataset(ds, options)
dsit = iter(ds)
got = [next(dsit).tolist() for _ in range(3)]
try:
  summary = gd.dataset.get_execution_summary(dsit)  # must run on iterator
  text = gd.stats.pretty_format_summary(summary)
  outcome = ["ok", isinstance(text, str) and "BatchDatasetIterator" in text]
except Exception as e:  # pylint: disable=broad-except
  outcome = [type(e).__name__, str(e)]
"""


def test_crossformer_debug_execution_summary():
  g, l = porting.run_both(CROSSFORMER_DEBUG)
  assert l.got == g.got == [[1, 2], [3, 4], [5, 6]]
  # README (ExecutionTrackingMode): loader has no per-stage statistics; the
  # helpers import, and raise a ValueError (Grain's when collection is off).
  assert g.outcome == ["ok", True]
  assert l.outcome[0] == "ExecutionSummaryError" and "no per-stage execution statistics" in l.outcome[1]
  from loader import stats  # pylint: disable=g-import-not-at-top
  assert issubclass(stats.ExecutionSummaryError, ValueError)
