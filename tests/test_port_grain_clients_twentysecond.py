"""Round 25's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

google-deepmind/jax_privacy's examples/data_loading.py, integrating
`BatchSelectionStrategy` with PyGrain (`CustomBatchIterator`, inline in an
earlier version, imported from a `_grain` module in later ones; a benchmark
`main`): a
`grain.DatasetIterator` subclass built without a parent over
`grain.MapDataset.source(...)`, reading `dataset[0]` for a padding template,
`len(dataset)`, `grain.ShardOptions` / `grain.NoSharding`, elements fetched
with a thread pool and stacked with `jax.tree.map`, `get_state` /
`set_state` that replay the batch generator; the benchmark's other branch
`itertools.islice(dataset.map(map_fn).to_iter_dataset(
grain.ReadOptions(num_threads=...)).batch(n), steps)`. Here the state also
goes through `grain.PyGrainCheckpointHandler`.

A general source-adapter module (`GeneralRandomAccessSource`,
`_GeneralIterator`, `GeneralIterDataset`, `grain_from_source`; the index
names no repository for it): a `grain.sources.RandomAccessDataSource`
subclass over lists and mappings with an adapter, an `IterDataset` subclass
without parents whose `DatasetIterator` replays a factory to restore its
`{"index": n}` state and whose `close()` calls `super().close()`,
`MapDataset.source(...).shuffle(seed=)`, `to_iter_dataset(read_opts)` and
`.batch(n)`. Here also under a `ThreadPrefetchIterDataset` that is closed
(torchtitan's `GrainDataLoader.close()` closes such an iterator): Grain's
iterator raises ValueError on the next `next`; loader's went on reading the
custom parent before the fix in `loader/sequential.py`.

Two image-augmentation modules written as `grain.RandomMapTransform`s
drawing from the `rng` argument (the index names no repository for them):
a torchvision-like one (`from grain import python as grain`:
`RandomRotation` with `rng.uniform`, `RandomHorizontalFlip` with
`rng.random`, a no-op `RandomCrop`), and an ImageNet-1K one
(`RandomResize` with `rng.integers(lo, hi + 1)`, `RandomCrop` with vector
bounds `rng.integers(np.array([0, 0]), np.array([...]))`, `RandomFlip`,
`RandomResizedCrop`'s ten tries of `rng.uniform(*scale)`, `ColorJitter`
shuffling a list of `(function, factor)` pairs with `rng.shuffle`, and a
`MapTransform` `EvalCrop`); its OpenCV calls are replaced here by small
numpy stand-ins, the random draws are the module's.

A torchvision-MNIST loader script (the index names no repository for it):
a plain class with `__len__` / `__getitem__` returning `jnp` arrays,
`pygrain.SequentialSampler(num_records=..., shard_options=
pygrain.NoSharding())` and `pygrain.DataLoader(..., operations=
[pygrain.Batch(batch_size)])` for a train and a test split.

A FineWeb LM data module (`FineWeb`, `FineWebParquet`; the index names no
repository for it): `grain.sources.ArrayRecordDataSource(shards)` under
`MapDataset.source(...).seed(s).shuffle().repeat().map(tokenize)
.to_iter_dataset()`, and `grain.experimental.ParquetIterDataset(files)` under
`RepeatIterDataset(num_epochs=None)` and `WindowShuffleIterDataset(
window_size=, seed=)`, each packed with `ConcatThenSplitIterDataset(
length_struct={"tokens": n + 1, "bytes": n + 1})`, split into `(x, y)` and
`.batch(b, drop_remainder=True)`; Grain's states restored into loader.

A MAHA batching module (`_SequenceMapDataset`, `create_grain_dataset`; the
index names no repository for it): a `grain.MapDataset` subclass calling
`super().__init__()` whose `__getitem__` returns `None` past its length, then
`.seed(s).shuffle(seed=s).repeat(num_epochs=, reseed_each_epoch=True)
.batch(n, drop_remainder=)` and a map to a frozen slots dataclass of `jnp`
arrays, iterated with `for batch in dataset`. With two epochs Grain's shuffle
hands the class indices past its length, so both fail at the same batch.
"""

from __future__ import annotations

import json
import types

import absl.flags
import numpy as np

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


# jax_privacy's CustomBatchIterator as the example writes it; `batch_selection`
# is a small stand-in for jax_privacy's (Poisson sampling over a seeded
# generator, padding with -1 to a multiple), which is not installed here.
JAX_PRIVACY = """
import concurrent.futures
import copy
import itertools
import os
from typing import Any

import grain.python as grain
import jax
import numpy as np
from etils import epath


class _CyclicPoissonSampling:
  def __init__(self, iterations, sampling_prob):
    self.iterations = iterations
    self.sampling_prob = sampling_prob

  def batch_iterator(self, num_examples, rng):
    rng = np.random.default_rng(rng)
    for _ in range(self.iterations):
      yield np.flatnonzero(rng.random(num_examples) < self.sampling_prob)


def _pad_to_multiple_of(indices, multiple):
  size = -(-len(indices) // multiple) * multiple
  return np.concatenate([indices, -np.ones(size - len(indices), dtype=indices.dtype)])


batch_selection = type("batch_selection", (), {})
batch_selection.CyclicPoissonSampling = _CyclicPoissonSampling
batch_selection.pad_to_multiple_of = staticmethod(_pad_to_multiple_of)
batch_selection.BatchSelectionStrategy = _CyclicPoissonSampling


class CustomBatchIterator(grain.DatasetIterator):

  def __init__(self, dataset: grain.RandomAccessDataSource, strategy: batch_selection.BatchSelectionStrategy,
               rng: np.random.Generator | int, *, shard_options: grain.ShardOptions = grain.NoSharding(),
               pad_to_multiple_of: int = 1, max_workers: int | None = None):
    super().__init__()
    self._dataset = dataset
    self._strategy = strategy
    self._shard_options = shard_options
    self._pad_to_multiple_of = pad_to_multiple_of
    if self._pad_to_multiple_of % self._shard_options.shard_count != 0:
      raise ValueError(f"{pad_to_multiple_of=} must be a multiple of {shard_options.shard_count=}")
    self._iteration = 0
    self._initial_rng = copy.deepcopy(rng)
    self._batch_generator = self._strategy.batch_iterator(num_examples=len(self._dataset), rng=copy.deepcopy(rng))
    self._padding_element = jax.tree.map(np.empty_like, dataset[0])
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers)
    self._max_workers = max_workers

  def _get_element(self, idx):
    if idx == -1:
      return self._padding_element
    return self._dataset[idx]

  def __next__(self) -> tuple[Any, np.ndarray]:
    try:
      indices = batch_selection.pad_to_multiple_of(next(self._batch_generator), self._pad_to_multiple_of)
      shard_size = len(indices) // self._shard_options.shard_count
      start_idx = self._shard_options.shard_index * shard_size
      indices = indices[start_idx : start_idx + shard_size]
      is_padding_example = indices == -1
    except StopIteration as exc:
      raise StopIteration from exc
    batch_elements = list(self._executor.map(self._get_element, indices))
    self._iteration += 1
    batch = jax.tree.map(lambda *leaves: np.stack(leaves), *batch_elements)
    return batch, is_padding_example

  def get_state(self) -> dict[str, Any]:
    return {"iteration": self._iteration, "initial_rng": self._initial_rng}

  def set_state(self, state: dict[str, Any]):
    self._iteration = state["iteration"]
    self._initial_rng = state["initial_rng"]
    self._batch_generator = self._strategy.batch_iterator(
        num_examples=len(self._dataset), rng=copy.deepcopy(self._initial_rng))
    for _ in range(self._iteration):
      next(self._batch_generator)


def real(batch, is_padding_example):
  keep = ~is_padding_example
  return {"label": batch["label"][keep].tolist(), "image_sum": batch["image"][keep].sum(axis=(1, 2)).tolist(),
          "padded": int(is_padding_example.shape[0])}


rows = [{"image": np.full((2, 3), i, dtype=np.uint8), "label": np.int64(i % 7)} for i in range(50)]
dataset = grain.MapDataset.source(rows)
results = {"len": len(dataset), "first": dataset[0]}

# main(): the custom-iterator branch, run to the end.
NUM_BATCHES, BATCH_SIZE = 6, 8
strategy = batch_selection.CyclicPoissonSampling(iterations=NUM_BATCHES, sampling_prob=BATCH_SIZE / len(dataset))
iterator = CustomBatchIterator(dataset, strategy, rng=0, pad_to_multiple_of=4, max_workers=2)
results["is_dataset_iterator"] = isinstance(iterator, grain.DatasetIterator)
batch_sizes = set()
real_examples = padded_examples = 0
stream = []
for batch, is_padding_example in iterator:
  stream.append(real(batch, is_padding_example))
  real_examples += int((~is_padding_example).sum())
  padded_examples += is_padding_example.shape[0]
  batch_sizes.add(is_padding_example.shape[0])
results["stream"] = stream
results["fractions"] = [real_examples, padded_examples, sorted(batch_sizes)]

# A sharded copy, its state saved mid-run and restored into a fresh iterator
# (directly and through Grain's Orbax handler).
shard = grain.ShardOptions(shard_index=1, shard_count=2)
it = CustomBatchIterator(dataset, strategy, rng=3, shard_options=shard, pad_to_multiple_of=4)
head = [real(*next(it)) for _ in range(2)]
state = it.get_state()
tail = [real(*b) for b in it]
it2 = CustomBatchIterator(dataset, strategy, rng=3, shard_options=shard, pad_to_multiple_of=4)
it2.set_state(state)
results["sharded"] = {"head": head, "state": state, "tail": tail, "restored": [real(*b) for b in it2]}
handler = grain.PyGrainCheckpointHandler()
it3 = CustomBatchIterator(dataset, strategy, rng=3, shard_options=shard, pad_to_multiple_of=4)
next(it3)
(epath.Path(CKPT) / "step_1").mkdir()
handler.save(epath.Path(CKPT) / "step_1", args=grain.PyGrainCheckpointSave(it3))
it4 = CustomBatchIterator(dataset, strategy, rng=3, shard_options=shard, pad_to_multiple_of=4)
handler.restore(epath.Path(CKPT) / "step_1", args=grain.PyGrainCheckpointRestore(it4))
results["handler"] = {"files": sorted(os.listdir(os.path.join(CKPT, "step_1"))),
                      "text": open(os.path.join(CKPT, "step_1", os.listdir(os.path.join(CKPT, "step_1"))[0])).read(),
                      "restored": [real(*b) for b in it4]}
try:
  CustomBatchIterator(dataset, strategy, rng=0, shard_options=grain.ShardOptions(0, 3), pad_to_multiple_of=4)
except ValueError as e:
  results["bad_pad"] = str(e)

# main(): the other branch.
def map_fn(x):
  return x, np.zeros(BATCH_SIZE, dtype=np.bool)

options = grain.ReadOptions(num_threads=2)
iterator = itertools.islice(dataset.map(map_fn).to_iter_dataset(options).batch(BATCH_SIZE), NUM_BATCHES)
results["plain"] = [(batch["label"].tolist(), batch["image"].shape, is_padding_example.shape,
                     is_padding_example.dtype.str, bool(is_padding_example.any()))
                    for batch, is_padding_example in iterator]
"""


def test_jax_privacy_custom_batch_iterator_state_and_plain_branch_as_on_grain(tmp_path):
  out = {}
  for lib in porting.LIBS:
    (tmp_path / lib).mkdir()
    out[lib] = porting.grain_keys(porting.run(JAX_PRIVACY, lib, CKPT=str(tmp_path / lib)).results)
  g, l = out["grain"], out["loader"]
  assert l == g
  assert g["is_dataset_iterator"] and len(g["stream"]) == 6 and g["fractions"][1] % 4 == 0
  s = g["sharded"]
  assert s["restored"] == s["tail"] and s["state"] == {"iteration": 2, "initial_rng": 3}
  assert g["handler"]["restored"] == s["head"][1:] + s["tail"]
  assert "pad_to_multiple_of=4 must be a multiple of" in g["bad_pad"]
  assert len(g["plain"]) == 6 and g["plain"][0][0] == [0, 1, 2, 3, 4, 5, 6, 0]


# The adapter module as written (`datasets` is a stand-in global whose
# `Dataset.from_dict` makes row dicts: Hugging Face datasets is not installed).
GENERAL = """
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable, Dict, Optional

import grain


def _is_random_access_dataset(obj: Any) -> bool:
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _is_hf_iterable_dataset(obj: Any) -> bool:
    cls = obj.__class__
    return cls.__name__ == "IterableDataset" and cls.__module__.startswith("datasets")


class GeneralRandomAccessSource(grain.sources.RandomAccessDataSource):

    def __init__(self, data: Any, *, adapter: Callable[[Any], Any] | None = None, dict_mode: str = "items"):
        self._adapter = adapter
        if isinstance(data, Mapping):
            if dict_mode == "items":
                self._data = [{"key": k, "value": v} for k, v in data.items()]
            elif dict_mode == "values":
                self._data = list(data.values())
            elif dict_mode == "keys":
                self._data = list(data.keys())
            else:
                raise ValueError("dict_mode must be one of {'items', 'values', 'keys'}")
        elif _is_random_access_dataset(data):
            self._data = data
        else:
            raise TypeError("GeneralRandomAccessSource requires a random-access object "
                            "(must implement __len__ and __getitem__).")

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> Any:
        item = self._data[index]
        if self._adapter is not None:
            item = self._adapter(item)
        return item

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(len={len(self)})"


class _GeneralIterator(grain.DatasetIterator):

    def __init__(self, iterable_factory: Callable[[], Iterable[Any]], start_index: int = 0):
        super().__init__()
        self._iterable_factory = iterable_factory
        self._index = 0
        self._closed = False
        self._iter = iter(self._iterable_factory())
        for _ in range(start_index):
            try:
                next(self._iter)
                self._index += 1
            except StopIteration:
                break

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError("Iterator is closed.")
        item = next(self._iter)
        self._index += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = 0
        start_index = int(state["index"])
        self._iter = iter(self._iterable_factory())
        for _ in range(start_index):
            try:
                next(self._iter)
                self._index += 1
            except StopIteration:
                break

    def close(self) -> None:
        self._closed = True
        super().close()


class GeneralIterDataset(grain.IterDataset):

    def __init__(self, data: Iterable[Any] | Callable[[], Iterable[Any]], *,
                 adapter: Callable[[Any], Any] | None = None):
        super().__init__()
        self._adapter = adapter
        if callable(data):
            self._factory = data
        else:
            if isinstance(data, Iterator):
                cached = list(data)
                self._factory = lambda: iter(cached)
            else:
                self._factory = lambda: iter(data)

    def __iter__(self) -> grain.DatasetIterator:
        adapter = self._adapter
        factory = self._factory
        if adapter is None:
            return _GeneralIterator(factory)

        def adapted_factory():
            for x in factory():
                yield adapter(x)

        return _GeneralIterator(adapted_factory)


def grain_from_source(data: Any, *, adapter: Callable[[Any], Any] | None = None,
                      preprocess_fn: Optional[Callable] = None, dict_mode: str = "items",
                      read_opts: grain.ReadOptions | None = None, batch_size: int | None = None, seed: int = 42):
    is_map = False
    if isinstance(data, Dict):
        data = datasets.Dataset.from_dict(data)
    if isinstance(data, Mapping):
        source = GeneralRandomAccessSource(data, adapter=adapter, dict_mode=dict_mode)
        pipeline = grain.MapDataset.source(source)
        is_map = True
    elif _is_random_access_dataset(data) and not _is_hf_iterable_dataset(data):
        source = GeneralRandomAccessSource(data, adapter=adapter)
        pipeline = grain.MapDataset.source(source)
        is_map = True
    elif isinstance(data, Iterable) or _is_hf_iterable_dataset(data):
        pipeline = GeneralIterDataset(data, adapter=adapter)
    else:
        raise TypeError("Unsupported data type. Expected mapping, random-access dataset, or iterable.")
    if is_map:
        pipeline = pipeline.shuffle(seed=seed)
        pipeline = pipeline.to_iter_dataset(read_opts) if read_opts is not None else pipeline.to_iter_dataset()
    if batch_size is not None:
        pipeline = pipeline.batch(batch_size)
    return pipeline


def run(pipeline, n):
    it = iter(pipeline)
    head = [next(it) for _ in range(n)]
    state = it.get_state()
    tail = list(it)
    it2 = iter(pipeline)
    it2.set_state(state)
    return {"head": head, "state": state, "tail": tail, "restored": list(it2)}


results = {}
results["list"] = run(grain_from_source(list(range(10)), batch_size=3, seed=1), 2)
results["list_opts"] = run(grain_from_source(tuple(range(12)), adapter=lambda x: x * x,
                                             read_opts=grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)), 5)
results["columns"] = run(grain_from_source({"a": [1, 2, 3, 4, 5], "b": [10, 20, 30, 40, 50]}, batch_size=2), 1)
src = GeneralRandomAccessSource({"x": 1, "y": 2, "z": 3}, dict_mode="values", adapter=lambda v: v + 100)
results["mapping"] = [repr(src), list(grain.MapDataset.source(src)), len(grain.MapDataset.source(src))]


def gen():
    for i in range(7):
        yield {"text": f"doc{i}", "n": i}


results["generator"] = run(GeneralIterDataset(gen, adapter=lambda d: d["n"] * 3).batch(2), 2)
results["iterator"] = run(grain_from_source(iter(range(5))), 3)
results["mapped"] = run(grain_from_source(gen()).map(lambda d: d["text"]).filter(lambda t: t != "doc2"), 2)
try:
    grain_from_source(gen)
except TypeError as e:
    results["factory"] = str(e)
it = iter(GeneralIterDataset(gen))
results["closing"] = [next(it)["n"], it.get_state()]
it.close()
try:
    next(it)
except ValueError as e:
    results["closed"] = str(e)
try:
    grain_from_source(42)
except TypeError as e:
    results["bad"] = str(e)
# A training loop's thread prefetch over the stream, closed at the end (as
# torchtitan's GrainDataLoader.close() closes its ThreadPrefetchIterDataset's
# iterator): the custom iterator is closed with it, and the prefetcher refuses
# to go on.
it = iter(grain.experimental.ThreadPrefetchIterDataset(GeneralIterDataset(gen), prefetch_buffer_size=2))
results["prefetched"] = [next(it)["n"], next(it)["n"]]
it.close()
for _ in range(2):
    try:
        next(it)
        results.setdefault("after_close", []).append("went on")
    except ValueError as e:
        results.setdefault("after_close", []).append("ValueError")
"""


class _FakeHFDataset(list):
  """`datasets.Dataset.from_dict`'s rows (a list of row dicts)."""

  @classmethod
  def from_dict(cls, columns):
    keys = list(columns)
    return cls({k: columns[k][i] for k in keys} for i in range(len(columns[keys[0]])))


def test_general_source_adapters_replaying_iterator_and_close_as_on_grain():
  datasets = types.SimpleNamespace(Dataset=_FakeHFDataset)
  g, l = porting.run_both_grain_keys(GENERAL, datasets=datasets)
  assert l == g
  for name in ("list", "list_opts", "columns", "generator", "iterator", "mapped"):
    assert g[name]["restored"] == g[name]["tail"], name
  assert sorted(sum(g["list"]["head"] + g["list"]["tail"], [])) == list(range(10))
  assert g["generator"]["state"] == {"index": 4} and g["generator"]["head"][0] == [0, 3]
  assert g["mapping"] == ["GeneralRandomAccessSource(len=3)", [101, 102, 103], 3]
  assert g["closed"] == "Iterator is closed." and "Unsupported data type" in g["bad"]
  assert g["prefetched"] == [0, 1] and g["after_close"] == ["ValueError", "ValueError"]


# The torchvision-like transforms module (`Normalize`, which stops at a
# `breakpoint()`, left out), applied on a MapDataset, an IterDataset and in a
# DataLoader.
TORCHVISION_LIKE = """
from collections.abc import Sequence
from typing import Literal

import numpy as np
from grain import python as grain


class RandomCrop(grain.RandomMapTransform):
    def __init__(self, size: int, padding: int | Sequence[int] | None = None, pad_if_needed: bool = False,
                 fill: int | Sequence[int] = 0,
                 padding_mode: Literal["constant", "edge", "reflect", "symmetric"] = "constant"):
        self.size = size
        self.padding = padding
        self.pad_if_needed = pad_if_needed
        self.padding_mode = padding_mode
        self.fill = fill

    def random_map(self, element, rng: np.random.Generator):
        return element


class RandomRotation(grain.RandomMapTransform):
    def __init__(self, degrees: Sequence[int]):
        if not degrees[1] > degrees[0]:
            raise ValueError("Degrees must specify a valid range.")
        self.degrees = degrees

    def random_map(self, element, rng: np.random.Generator):
        angle = rng.uniform(self.degrees[0], self.degrees[1]) * np.pi / 180
        cos_a, sin_a = np.cos(angle), np.sin(angle)
        rotation_matrix = np.array([[cos_a, -sin_a], [sin_a, cos_a]])
        h, w, _ = element.shape
        center = np.array([h // 2, w // 2])
        rotated = np.zeros_like(element)
        for i in range(h):
            for j in range(w):
                coords = np.array([i, j]) - center
                new_coords = rotation_matrix @ coords + center
                ni, nj = int(round(new_coords[0])), int(round(new_coords[1]))
                if 0 <= ni < h and 0 <= nj < w:
                    rotated[i, j] = element[ni, nj]
        return rotated


class RandomHorizontalFlip(grain.RandomMapTransform):
    def __init__(self, p: float = 0.5):
        self.p = p

    def random_map(self, element, rng: np.random.Generator):
        if rng.random() < self.p:
            return np.fliplr(element)
        return element


images = [np.arange(i, i + 30, dtype=np.float32).reshape(5, 6, 1) for i in range(12)]
results = {}
ds = (grain.MapDataset.source(images).seed(7)
      .random_map(RandomCrop(4, padding=1))
      .random_map(RandomRotation((-40, 40)))
      .random_map(RandomHorizontalFlip(0.5)))
results["map"] = [ds[i] for i in range(len(ds))]
results["map_again"] = [ds[i] for i in (3, 0)]
it_ds = grain.MapDataset.source(images).to_iter_dataset().random_map(RandomHorizontalFlip(0.7), seed=11)
it = iter(it_ds)
results["iter"] = [next(it) for _ in range(4)]
state = it.get_state()
rest = list(it)
it2 = iter(it_ds)
it2.set_state(state)
results["iter_state"] = state
results["iter_restored"] = list(it2)
if FOREIGN is not None:  # Grain's state at the same step.
    it3 = iter(it_ds)
    it3.set_state(FOREIGN)
    results["foreign"] = list(it3)
results["iter_rest"] = rest
loader = grain.DataLoader(
    data_source=images,
    sampler=grain.IndexSampler(num_records=len(images), shard_options=grain.NoSharding(), shuffle=True,
                               num_epochs=2, seed=3),
    operations=[RandomRotation((-15, 15)), RandomHorizontalFlip(), grain.Batch(5, drop_remainder=False)],
    worker_count=0)
results["loader"] = list(loader)
try:
    RandomRotation((10, 10))
except ValueError as e:
    results["bad"] = str(e)
"""


def test_torchvision_like_random_rotation_and_flip_rng_as_on_grain():
  g = porting.run(TORCHVISION_LIKE, "grain", FOREIGN=None).results
  l = porting.run(TORCHVISION_LIKE, "loader", FOREIGN=g["iter_state"]).results
  g, l = porting.grain_keys(g), porting.grain_keys(l)
  # README (`CheckpointHandler`): a `random_map` after `to_iter_dataset()` is
  # folded into the position; Grain's state wraps it, and loader resumes it.
  assert g.pop("iter_state") == {"parent": {"next_index": 4}, "index_for_rng": 4}
  assert l.pop("foreign") == g["iter_rest"]
  assert l.pop("iter_state") == {"next_index": 4}
  assert l == g
  assert g["map_again"] == [g["map"][3], g["map"][0]]
  assert g["iter_restored"] == g["iter_rest"] and len(g["loader"]) == 5
  assert g["bad"] == "Degrees must specify a valid range."


# The ImageNet-1K transforms module with its OpenCV calls replaced by the
# numpy stand-ins below (nearest-neighbour resize, gray by channel mean).
IMAGENET = """
import typing as tp

import grain.python as grain
import numpy as np

Image: tp.TypeAlias = np.typing.NDArray[np.uint8]


class cv2:  # numpy stand-ins for the few OpenCV calls the module makes.
    INTER_LINEAR = 1

    @staticmethod
    def resize(img, size, interpolation=None):
        w, h = size
        rows = (np.arange(h) * img.shape[0] // h)
        cols = (np.arange(w) * img.shape[1] // w)
        return img[rows][:, cols]

    @staticmethod
    def convertScaleAbs(img, alpha, beta=0):
        return np.clip(np.abs(img.astype(np.float64) * alpha + beta), 0, 255).astype(np.uint8)

    @staticmethod
    def gray(img):
        return img.mean(axis=2, keepdims=True)


class Record(tp.TypedDict):
    image: Image
    label: int


class ReadRecord(grain.MapTransform):
    def map(self, element: dict) -> Record:
        img = np.frombuffer(element["data"], dtype=np.uint8).reshape(element["shape"])
        return Record(image=img.copy(), label=element["label"])


class RandomResize(grain.RandomMapTransform):
    def __init__(self, size: tuple[int, int]):
        self.sz = size

    def apply(self, img: Image, size: int) -> Image:
        h, w = img.shape[:2]
        scale = size / min(h, w)
        new_h, new_w = int(h * scale + 0.5), int(w * scale + 0.5)
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        return img.astype(np.uint8)

    def random_map(self, element: Record, rng: np.random.Generator) -> Record:
        sz = rng.integers(self.sz[0], self.sz[1] + 1)
        element["image"] = self.apply(element["image"], sz)
        return element


class RandomCrop(grain.RandomMapTransform):
    def __init__(self, size: int):
        self.sz = size

    def apply(self, img: Image, h0: int, w0: int) -> Image:
        return img[h0 : h0 + self.sz, w0 : w0 + self.sz]

    def random_map(self, element: Record, rng: np.random.Generator) -> Record:
        img = element["image"]
        h, w = img.shape[:2]
        if h < self.sz or w < self.sz:
            img = cv2.resize(img, (max(self.sz, w), max(self.sz, h)))
            img = img.astype(np.uint8)
            h, w = img.shape[:2]
        bh, bw = rng.integers(np.array([0, 0]), np.array([h - self.sz + 1, w - self.sz + 1]))
        element["image"] = self.apply(img, bh, bw)
        return element


class RandomFlip(grain.RandomMapTransform):
    def random_map(self, element: Record, rng: np.random.Generator) -> Record:
        if rng.random() < 0.5:
            element["image"] = np.ascontiguousarray(np.flip(element["image"], axis=1))
        return element


class RandomResizedCrop(grain.RandomMapTransform):
    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float]):
        self.size = size
        self.scale = scale
        self.ratio = ratio

    def random_map(self, element: Record, rng: np.random.Generator) -> Record:
        img = element["image"]
        h, w = img.shape[:2]
        area = h * w
        for _ in range(10):
            target_area = rng.uniform(*self.scale) * area
            log_ratio = (np.log(self.ratio[0]), np.log(self.ratio[1]))
            aspect_ratio = np.exp(rng.uniform(*log_ratio))
            w_crop = int(round(np.sqrt(target_area * aspect_ratio)))
            h_crop = int(round(np.sqrt(target_area / aspect_ratio)))
            if 0 < w_crop <= w and 0 < h_crop <= h:
                top = rng.integers(0, h - h_crop + 1)
                left = rng.integers(0, w - w_crop + 1)
                img_crop = img[top : top + h_crop, left : left + w_crop]
                img_resized = cv2.resize(img_crop, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
                element["image"] = img_resized.astype(np.uint8)
                return element
        scale_fallback = self.size / min(h, w)
        nh, nw = int(h * scale_fallback), int(w * scale_fallback)
        img_fallback = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
        t = (nh - self.size) // 2
        l = (nw - self.size) // 2
        element["image"] = img_fallback[t : t + self.size, l : l + self.size].astype(np.uint8)
        return element


class ColorJitter(grain.RandomMapTransform):
    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0):
        self.brightness = self._check_input(brightness, center=1.0, bound=(0, float("inf")))
        self.contrast = self._check_input(contrast, center=1.0, bound=(0, float("inf")))
        self.saturation = self._check_input(saturation, center=1.0, bound=(0, float("inf")))
        self.hue = self._check_input(hue, center=0.0, bound=(-0.5, 0.5))

    def _check_input(self, value, center, bound):
        if isinstance(value, (int, float)):
            if value < 0:
                raise ValueError("If value is a single number, it must be non-negative.")
            low, high = center - value, center + value
        else:
            low, high = center + value[0], center + value[1]
        return (max(bound[0], low), min(bound[1], high))

    def apply_brightness(self, img, factor):
        return cv2.convertScaleAbs(img, alpha=factor, beta=0)

    def apply_contrast(self, img, factor):
        mean = cv2.gray(img).mean()
        return cv2.convertScaleAbs(img, alpha=factor, beta=mean * (1.0 - factor))

    def apply_saturation(self, img, factor):
        gray = cv2.gray(img)
        return np.clip(img * factor + gray * (1 - factor), 0, 255).astype(np.uint8)

    def apply_hue(self, img, factor):
        return np.roll(img, int(factor * 180) % 3, axis=2)

    def random_map(self, element: Record, rng: np.random.Generator) -> Record:
        img = element["image"]
        ops = [
            (self.apply_brightness, rng.uniform(*self.brightness)),
            (self.apply_contrast, rng.uniform(*self.contrast)),
            (self.apply_saturation, rng.uniform(*self.saturation)),
            (self.apply_hue, rng.uniform(*self.hue)),
        ]
        rng.shuffle(ops)
        for func, factor in ops:
            img = func(img, factor)
        element["image"] = img
        return element


class EvalCrop(grain.MapTransform):
    def map(self, element: Record) -> Record:
        img = element["image"]
        h, w = img.shape[:2]
        scale = 12 / min(h, w)
        new_h, new_w = round(h * scale), round(w * scale)
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        bh, bw = (new_h - 8) // 2, (new_w - 8) // 2
        element["image"] = img[bh : bh + 8, bw : bw + 8].astype(np.uint8)
        return element


def train_loader(seed, workers=0):
    return grain.DataLoader(
        data_source=RECORDS,
        sampler=grain.IndexSampler(num_records=len(RECORDS), shard_options=grain.NoSharding(), shuffle=True,
                                   num_epochs=1, seed=seed),
        operations=[ReadRecord(), RandomResize((9, 14)), RandomCrop(10), RandomFlip(),
                    ColorJitter(0.4, 0.4, 0.4, 0.1), grain.Batch(4, drop_remainder=True)],
        worker_count=workers)


results = {}
results["train"] = list(train_loader(5))
results["workers"] = list(train_loader(5, workers=2)) if WORKERS else None
it = iter(train_loader(5))
next(it)
state = it.get_state()
it2 = iter(train_loader(5))
it2.set_state(state)
results["resumed"] = list(it2)
results["state"] = state
if FOREIGN is not None:  # A state another library's DataLoader wrote.
    it3 = iter(train_loader(5))
    it3.set_state(FOREIGN)
    results["foreign"] = list(it3)
rrc = (grain.MapDataset.source(RECORDS).map(ReadRecord()).seed(1)
       .random_map(RandomResizedCrop(8, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)))
       .random_map(RandomResizedCrop(6, scale=(2.0, 3.0), ratio=(1.0, 1.0))))
results["resized_crop"] = [rrc[i] for i in range(len(rrc))]
results["eval"] = list(grain.MapDataset.source(RECORDS).map(ReadRecord()).map(EvalCrop()).batch(3))
try:
    ColorJitter(brightness=-1)
except ValueError as e:
    results["bad"] = str(e)
"""


def imagenet_records():
  rng = np.random.default_rng(4)
  records = []
  for i in range(10):
    h, w = int(rng.integers(6, 16)), int(rng.integers(6, 16))
    img = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    records.append({"data": img.tobytes(), "shape": (h, w, 3), "label": i % 4})
  return records


def test_imagenet_random_resize_crop_flip_jitter_rng_as_on_grain():
  records = imagenet_records()
  g_raw = porting.run(IMAGENET, "grain", RECORDS=records, WORKERS=False, FOREIGN=None).results
  l_raw = porting.run(IMAGENET, "loader", RECORDS=records, WORKERS=True, FOREIGN=g_raw["state"]).results
  g_state, l_state = json.loads(g_raw.pop("state")), json.loads(l_raw.pop("state"))
  assert porting.grain_keys(l_state) == porting.grain_keys(g_state)
  g, l = porting.grain_keys(g_raw), porting.grain_keys(l_raw)
  # loader resumes Grain's DataLoader state where Grain does (README, "Checkpoint states").
  assert l.pop("foreign") == g["resumed"]
  # README (DataLoader): one stream whatever `worker_count`, Grain's without
  # workers (Grain's workers each batch their own records).
  assert l.pop("workers") == g["train"]
  g.pop("workers")
  assert l == g
  assert len(g["train"]) == 2 and g["resumed"] == g["train"][1:]
  assert {len(r["image"]) for r in g["resized_crop"]} == {6}
  assert g["bad"] == "If value is a single number, it must be non-negative."


# The MNIST script's dataset class and loaders, over synthetic images in place
# of torchvision's MNIST download.
MNIST = """
import json

import grain.python as pygrain
import jax.numpy as jnp
import numpy as np


class Dataset:
    def __init__(self, images, labels):
        self.images = images
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        img, label = self.images[index], self.labels[index]
        img = jnp.array(img, dtype=jnp.float32) / 255.0
        img = jnp.expand_dims(img, axis=0)
        label = jnp.array(label, dtype=jnp.int32)
        return img, label


rng = np.random.default_rng(0)
mnist_dataset_train = Dataset(rng.integers(0, 256, size=(23, 4, 4), dtype=np.uint8), rng.integers(0, 10, size=23))
mnist_dataset_test = Dataset(rng.integers(0, 256, size=(9, 4, 4), dtype=np.uint8), rng.integers(0, 10, size=9))
batch_size = 8

sampler_train = pygrain.SequentialSampler(num_records=len(mnist_dataset_train), shard_options=pygrain.NoSharding())
sampler_test = pygrain.SequentialSampler(num_records=len(mnist_dataset_test), shard_options=pygrain.NoSharding())

dataloader_train = pygrain.DataLoader(data_source=mnist_dataset_train, sampler=sampler_train,
                                      operations=[pygrain.Batch(batch_size)])
dataloader_test = pygrain.DataLoader(data_source=mnist_dataset_test, sampler=sampler_test,
                                     operations=[pygrain.Batch(batch_size)])

results = {"sampler": [repr(sampler_train), repr(sampler_train[3]).split(", rng=")[0]]}
for name, dl in (("train", dataloader_train), ("test", dataloader_test)):
    batches = []
    for i, (x, y) in enumerate(dl):
        batches.append([i, x.shape, y.shape, type(x).__name__, x.dtype.str, y.dtype.str, x, y])
    results[name] = batches
it = iter(dataloader_train)
next(it)
results["state"] = json.loads(it.get_state())
"""


def test_mnist_sequential_sampler_jnp_elements_batched_as_on_grain():
  g, l = porting.run_both_grain_keys(MNIST)
  assert l == g
  assert [b[1] for b in g["train"]] == [[8, 1, 4, 4], [8, 1, 4, 4], [7, 1, 4, 4]]
  assert g["test"][-1][1] == [1, 1, 4, 4]


# The FineWeb classes' `build` methods as the module writes them, with a
# byte-level stand-in for the `tokenizers` BPE (not installed here): shards of
# ArrayRecord text for `FineWeb`, Parquet files for `FineWebParquet`.
FINEWEB = """
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import grain
import numpy as np


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class _ByteTokenizer:
    def encode(self, text):
        return _Encoding([b % 60 + 1 for b in text.encode("utf-8")])

    def token_to_id(self, token):
        return 0

    def get_vocab(self):
        return {"<eot>": 0, **{chr(64 + i): i for i in range(1, 61)}}

    def get_vocab_size(self):
        return 61


@dataclass(frozen=True)
class FineWeb:
    seq_len: int
    vocab_size: int
    arrayrecord_dir: str | None = None

    @cached_property
    def tokenizer(self):
        return _ByteTokenizer()

    @cached_property
    def eot_token(self) -> int:
        return self.tokenizer.token_to_id("<eot>")

    @cached_property
    def token_bytes(self) -> np.ndarray:
        id_to_piece = {v: k for k, v in self.tokenizer.get_vocab().items()}
        return np.array([len(id_to_piece.get(i, "")) for i in range(self.tokenizer.get_vocab_size())],
                        dtype=np.int32)

    @cached_property
    def shards(self) -> list[Path]:
        shards = sorted(Path(self.arrayrecord_dir).glob("*.arrayrecord"))
        if len(shards) < 2:
            raise ValueError(f"Expected at least two .arrayrecord shards under {self.arrayrecord_dir}, "
                             f"found {len(shards)}")
        return shards

    def build(self, split: Literal["train", "eval"], batch_size: int, seed: int, shuffle: bool,
              repeat: bool) -> grain.IterDataset:
        shards = self.shards[:-1] if split == "train" else self.shards[-1:]
        tokenizer = self.tokenizer
        token_bytes = self.token_bytes
        eot = self.eot_token

        def tokenize(rec):
            text = rec.decode("utf-8", errors="ignore")
            enc = np.asarray(tokenizer.encode(text).ids, dtype=np.int32)
            tokens = np.empty(enc.size + 1, dtype=np.int32)
            tokens[:-1] = enc
            tokens[-1] = eot
            return {"tokens": tokens, "bytes": token_bytes[tokens]}

        source = grain.sources.ArrayRecordDataSource(shards)
        ds = grain.MapDataset.source(source).seed(seed)
        if shuffle:
            ds = ds.shuffle()
        if repeat:
            ds = ds.repeat()
        ds = ds.map(tokenize).to_iter_dataset()
        ds = grain.experimental.ConcatThenSplitIterDataset(
            ds, length_struct={"tokens": self.seq_len + 1, "bytes": self.seq_len + 1})

        def split_batch(batch):
            tokens, n_bytes = batch["tokens"], batch["bytes"]
            x, y = tokens[:-1], tokens[1:]
            n_bytes = n_bytes[1:]
            return (x, y), n_bytes

        ds = ds.map(split_batch)
        ds = ds.batch(batch_size, drop_remainder=True)
        return ds


@dataclass(frozen=True)
class FineWebParquet:
    seq_len: int
    vocab_size: int
    parquet_dir: str | None = None
    shuffle_window: int = 7

    tokenizer = FineWeb.tokenizer
    eot_token = FineWeb.eot_token
    token_bytes = FineWeb.token_bytes

    @cached_property
    def files(self) -> list[Path]:
        files = sorted(Path(self.parquet_dir).glob("*.parquet"))
        if len(files) < 2:
            raise ValueError(f"Expected at least two .parquet files under {self.parquet_dir}, found {len(files)}")
        return files

    def build(self, split, batch_size, seed, shuffle, repeat) -> grain.IterDataset:
        files = self.files[:-1] if split == "train" else self.files[-1:]
        tokenizer = self.tokenizer
        token_bytes = self.token_bytes
        eot = self.eot_token

        def tokenize(rec):
            text = rec["text"]
            if text is None:
                text = ""
            enc = np.asarray(tokenizer.encode(text).ids, dtype=np.int32)
            tokens = np.empty(enc.size + 1, dtype=np.int32)
            tokens[:-1] = enc
            tokens[-1] = eot
            return {"tokens": tokens, "bytes": token_bytes[tokens]}

        ds = grain.experimental.ParquetIterDataset([str(p) for p in files])
        if repeat:
            ds = grain.experimental.RepeatIterDataset(ds, num_epochs=None)
        if shuffle:
            ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=self.shuffle_window, seed=seed)
        ds = ds.map(tokenize)
        ds = grain.experimental.ConcatThenSplitIterDataset(
            ds, length_struct={"tokens": self.seq_len + 1, "bytes": self.seq_len + 1})

        def split_batch(batch):
            tokens, n_bytes = batch["tokens"], batch["bytes"]
            x, y = tokens[:-1], tokens[1:]
            n_bytes = n_bytes[1:]
            return (x, y), n_bytes

        ds = ds.map(split_batch)
        ds = ds.batch(batch_size, drop_remainder=True)
        return ds


states = {}


def take(ds, n, name):
    it = iter(ds)
    head = [next(it) for _ in range(n)]
    state = it.get_state()
    states[name] = state
    after = [next(it) for _ in range(3)]
    it2 = iter(ds)
    it2.set_state(state)
    out = {"head": head, "after": after, "restored": [next(it2) for _ in range(3)]}
    if FOREIGN is not None:  # The state the other library wrote at the same step.
        it3 = iter(ds)
        it3.set_state(FOREIGN[name])
        out["foreign"] = [next(it3) for _ in range(3)]
    return out


results = {}
data = FineWeb(seq_len=6, vocab_size=61, arrayrecord_dir=AR_DIR)
results["train"] = take(data.build("train", batch_size=2, seed=3, shuffle=True, repeat=True), 4, "train")
results["eval"] = list(data.build("eval", batch_size=2, seed=3, shuffle=False, repeat=False))
results["token_bytes"] = data.token_bytes
pq = FineWebParquet(seq_len=6, vocab_size=61, parquet_dir=PQ_DIR)
results["pq_train"] = take(pq.build("train", batch_size=2, seed=5, shuffle=True, repeat=True), 6, "pq_train")
results["pq_eval"] = list(pq.build("eval", batch_size=3, seed=5, shuffle=False, repeat=False))
try:
    FineWeb(seq_len=6, vocab_size=61, arrayrecord_dir=PQ_DIR).shards
except ValueError as e:
    results["no_shards"] = str(e).replace(PQ_DIR, "<dir>")
"""


def write_fineweb(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  from array_record.python import array_record_module

  rng = np.random.default_rng(2)
  words = ["grain", "loader", "tokens", "eot", "shard", "x", "window"]
  docs = [" ".join(rng.choice(words, size=int(rng.integers(1, 4)))) for _ in range(24)]
  ar_dir, pq_dir = tmp_path / "ar", tmp_path / "pq"
  ar_dir.mkdir()
  pq_dir.mkdir()
  for s in range(3):
    writer = array_record_module.ArrayRecordWriter(str(ar_dir / f"part-{s}.arrayrecord"), "group_size:1")
    for d in docs[s * 8:(s + 1) * 8]:
      writer.write(d.encode())
    writer.close()
    texts = docs[s * 8:(s + 1) * 8]
    texts[1] = None  # A missing text (tokenize makes it "").
    pq.write_table(pa.table({"text": texts}), str(pq_dir / f"part-{s}.parquet"))
  return str(ar_dir), str(pq_dir)


def test_fineweb_concat_then_split_window_shuffle_builds_as_on_grain(tmp_path):
  ar_dir, pq_dir = write_fineweb(tmp_path)
  g = porting.run(FINEWEB, "grain", AR_DIR=ar_dir, PQ_DIR=pq_dir, FOREIGN=None)
  l = porting.run(FINEWEB, "loader", AR_DIR=ar_dir, PQ_DIR=pq_dir, FOREIGN=g.states)
  g, l = porting.grain_keys(g.results), porting.grain_keys(l.results)
  # loader resumes Grain's states of both pipelines (README, "Checkpoint states":
  # the packing of ConcatThenSplitIterDataset included).
  for name in ("train", "pq_train"):
    assert l[name].pop("foreign") == g[name]["after"], name
  assert l == g
  for name in ("train", "pq_train"):
    assert g[name]["restored"] == g[name]["after"], name
  (x, y), n_bytes = g["train"]["head"][0]
  assert len(x) == 2 and len(x[0]) == 6 and x[0][1:] == y[0][:-1]
  assert g["eval"] and g["pq_eval"]
  assert g["no_shards"] == "Expected at least two .arrayrecord shards under <dir>, found 0"


# The MAHA batching module as written (`jaxtyping`'s annotations spelled as
# plain `jax.Array` here: jaxtyping is not installed), over tokenized
# sequences made in the test.
MAHA = """
from dataclasses import dataclass
from typing import Iterator, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np


class _SequenceMapDataset(grain.MapDataset[dict[str, np.ndarray]]):
    def __init__(self, sequences: Sequence[dict[str, np.ndarray]]):
        super().__init__()
        self._sequences = tuple(sequences)

    def __len__(self) -> int:
        return len(self._sequences)

    def __getitem__(self, index):
        if 0 <= index < len(self._sequences):
            return self._sequences[index]
        return None


@dataclass(frozen=True, slots=True)
class SequenceBatch:
    token_ids: jax.Array
    attention_mask: jax.Array


@dataclass(frozen=True, slots=True)
class LoaderConfig:
    batch_size: int
    shuffle_seed: int = 0
    num_epochs: int = 1
    drop_remainder: bool = True

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.num_epochs <= 0:
            raise ValueError(f"num_epochs must be positive, got {self.num_epochs}")


def _to_jax_batch(batch: dict[str, np.ndarray]) -> SequenceBatch:
    return SequenceBatch(token_ids=jnp.asarray(batch["input_ids"]),
                         attention_mask=jnp.asarray(batch["attention_mask"]))


def create_grain_dataset(sequences, *, config: LoaderConfig) -> grain.MapDataset[SequenceBatch]:
    dataset = _SequenceMapDataset(sequences).seed(config.shuffle_seed)
    if len(sequences) == 0:
        raise ValueError("No sequences provided to Grain dataset")
    dataset = dataset.shuffle(seed=config.shuffle_seed)
    dataset = dataset.repeat(num_epochs=config.num_epochs, reseed_each_epoch=True)
    dataset = dataset.batch(config.batch_size, drop_remainder=config.drop_remainder)
    dataset = dataset.map(_to_jax_batch)
    return dataset


def iterate_batches(dataset) -> Iterator[SequenceBatch]:
    for batch in dataset:
        yield batch


def show(batches):
    return [None if b is None else
            (type(b).__name__, type(b.token_ids).__name__, np.asarray(b.token_ids), np.asarray(b.attention_mask))
            for b in batches]


rng = np.random.default_rng(1)
sequences = []
for i in range(11):
    n = int(rng.integers(1, 5))
    ids = np.zeros(5, dtype=np.int32)
    ids[:n] = rng.integers(1, 50, size=n)
    sequences.append({"input_ids": ids, "attention_mask": (ids > 0).astype(np.int32)})

results = {}
ds = create_grain_dataset(sequences, config=LoaderConfig(batch_size=4, shuffle_seed=3, num_epochs=2))
results["len"] = len(ds)
got = []
try:
    for b in iterate_batches(ds):
        got.append(b)
except ValueError as e:  # The second epoch reads indices past len: the class returns None there.
    results["batches_error"] = str(e).split(":")[0]
results["batches"] = show(got)
results["indexed"] = show([ds[0], ds[1]])
for i in (len(ds) - 1, len(ds) + 1):
    try:
        results[f"indexed_{i}"] = show([ds[i]])
    except ValueError as e:
        results[f"indexed_{i}"] = str(e).split(":")[0]
tail = create_grain_dataset(sequences, config=LoaderConfig(batch_size=4, num_epochs=1, drop_remainder=False))
results["tail"] = [len(tail), show(iterate_batches(tail))]
raw = _SequenceMapDataset(sequences)
results["raw"] = [len(raw), raw[11], raw[-1], type(raw.seed(0)).__name__ == "_SequenceMapDataset"]
it = iter(ds.to_iter_dataset())
next(it)
state = it.get_state()
it2 = iter(ds.to_iter_dataset())
it2.set_state(state)
results["resume"] = [show([next(it)]), show([next(it2)])]
for bad in (dict(batch_size=0), dict(batch_size=2, num_epochs=0)):
    try:
        LoaderConfig(**bad)
    except ValueError as e:
        results.setdefault("bad", []).append(str(e))
try:
    create_grain_dataset([], config=LoaderConfig(batch_size=2))
except ValueError as e:
    results["empty"] = str(e)
"""


def test_maha_map_dataset_subclass_reseeded_repeat_jax_batches_as_on_grain():
  g, l = porting.run_both_grain_keys(MAHA)
  assert l == g
  assert g["len"] == 5 and g["batches"][0][:2] == ["SequenceBatch", "ArrayImpl"]
  assert g["tail"][0] == 3 and g["raw"][1:3] == [None, None] and g["resume"][0] == g["resume"][1]
  # The class returns None past its length, so Grain's second epoch (indices
  # 11..21 through the shuffle) batches Nones: the client fails there on both.
  assert len(g["batches"]) == 2 and g["batches_error"].startswith("Expected all input elements to have the same")
  assert g["bad"] == ["batch_size must be positive, got 0", "num_epochs must be positive, got 0"]
  assert g["empty"] == "No sequences provided to Grain dataset"


# The source-adapter module's replaying iterator releases its generator in
# close(); Grain's iterators call close() when garbage-collected, so an
# iterator dropped without close() still releases it (loader did not).
CLOSE_WHEN_COLLECTED = """
import gc
import grain

results = {"log": []}


class Replaying(grain.DatasetIterator):

  def __init__(self):
    super().__init__()
    self.i = 0

  def __next__(self):
    self._assert_not_closed()
    self.i += 1
    return self.i

  def get_state(self):
    return {"i": self.i}

  def set_state(self, state):
    self.i = state["i"]

  def close(self):
    results["log"].append(f"closed at {self.i}")
    super().close()


class Adapter(grain.IterDataset):

  def __iter__(self):
    return Replaying()


it = iter(Adapter())
next(it)
next(it)
del it
gc.collect()
results["after_drop"] = list(results["log"])
it = iter(Adapter())
next(it)
it.close()
del it
gc.collect()
"""


def test_a_custom_iterators_close_runs_when_it_is_collected_as_on_grain():
  g, l = porting.run_both_grain_keys(CLOSE_WHEN_COLLECTED)
  assert l == g
  assert g["after_drop"] == ["closed at 2"]
  assert g["log"] == ["closed at 2", "closed at 1", "closed at 1"]  # Grain's close() runs again when collected.
