"""Round 27's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

google-research/swirl-dynamics: swirl_dynamics/projects/ergodic/utils.py
(`RandomSection`, a frozen-dataclass `pygrain.RandomMapTransform` slicing a
random strided section of each trajectory; `ArrayDataSource`, a
`pygrain.RandomAccessDataSource` over a dict of arrays;
`create_loader_from_hdf5` and `create_loader_from_hdf5_reshaped`: a
`pygrain.DataLoader` with an endless shuffled `IndexSampler`,
`ShardOptions(jax.process_index(), jax.process_count(), drop_remainder=True)`,
`worker_count` from `tf_lookup_num_parallel_calls`, `worker_buffer_size`)
and swirl_dynamics/projects/debiasing/rectified_flow/pygrain_transforms.py
(`Standardize` over a `KeysView`, `Concatenate`, `BatchOT` with SciPy's
assignment solver, `RandomShuffleChunk`, and `FilterExtremes`, a
`FilterTransform` with annotations but no `@dataclass`: constructing it with
arguments is Grain's `TypeError`). DataLoader states are restored at every
step; with two workers, the documented difference is asserted (Grain's
workers batch their own records: the same records, regrouped; loader's
batches do not depend on the worker count: README, `DataLoader`).

google/airio: airio/_src/pygrain/common/packing.py (`PackLazyMapDataset`, a
`MapDataset` subclass calling `super().__init__([parent])` over
`grain.experimental.FlatMapMapDataset(PoolLazyMapDataset(...),
PackPoolFlatMap(...))`; `PackLazyIterDataset` and its `DatasetIterator`
whose state holds the parent's state, the packer's `as_dict()` and
base64-encoded pending examples; `MultiBinPacker`, `NoamPacker`). The iter
packing is restored at every step (each state once: the client's
`PartiallyPackedExample.from_dict` keeps and later changes the state's
lists).

A CIFAR-10 data module (the index names no repository for it):
`grain.load(..., transformations=[_Augment(), _Normalize()])` over a
Hugging Face split in numpy format, restored at every step.

A key-clustering preparation script ("Copyright (C) 2026 Apple Inc."; no
repository named): `QueriesSource`, `AddNoise` (a `FlatMapTransform` with its
own NumPy generator), a jitted per-cluster top-1 `grain.transforms.Map`,
`FlatMapIterDataset`, `batch(drop_remainder=False)`, and the split files
it writes.

Orbax checkpointing of Grain iterators: an SFT checkpoint module
(`GrainIterator: TypeAlias = grain.DataLoaderIterator |
grain.DatasetIterator`, `register_grain_iterator_handler` adding the class
`grain.checkpoint.CheckpointHandler` to an Orbax
`DefaultCheckpointHandlerRegistry`, `make_grain_save_args` /
`make_grain_restore_args`; the index's version of p-doom/omegalax
omegalax/trainers/checkpoint_utils.py) saved and restored at every step, and
a decoder-only trainer's per-split `checkpoint` / `restore` (no repository
named) with `ocp.args.JsonSave(step)`.

p-doom/omegalax: omegalax/data/grain_pipeline.py at b4b0544 (JSONL to
ArrayRecord compilation, a chunk index read back through
`grain.sources.ArrayRecordDataSource`, and `make_grain_iterator`'s weighted
`MapDataset.mix` of per-source pipelines with a tagging `batch_fn`),
restored at every step, and with `mp_prefetch` over two workers.

A raster tile pretraining loader (no repository named):
`RangeDataSource`, an `IndexSampler` without `shard_options`, three
`grain.transforms.RandomMap`s ending in `(image, mask)` tuples, and its
Windows branch `loader._dataset = grain.experimental.WithOptionsIterDataset(
loader._dataset, DatasetOptions(min_shm_size=sys.maxsize))`, run with two
workers (the same documented batch regrouping as above).

Window samplers over a time-series source (no repository named): an
endless `MapDataset.range(n).repeat().seed(seed).random_map(draw)` and
`MapDataset.mix` of two halves each `.seed(seed + i).shuffle().repeat()`,
indexed far out and resumed mid-stream.

A DataLoader script with mistakes (no repository named): `grain.Dataloader`,
`shard_options=grain.sharding.NoSharding` (the class) and `grain.sample`
raise Grain's `AttributeError`s.

A video world-model data module (no repository named): a subclass of
`grain.ArrayRecordDataSource` bounding its open shard readers with an LRU
through array_record's private reader API (`_readers`,
`_read_instructions[i].filename`, `_reader_options_string`,
`_reader_idx_and_position`, and array_record's `_create_reader` /
`_check_group_size`), with `RandomMapTransform` crops and a patchify.

Where loader differed, it is fixed: loader's `ArrayRecordDataSource` now has
array_record's private reader API that Grain's inherits
(`_read_instructions`, one `_ReadInstruction(filename, start, end)` per path
entry; `_reader_options_string`, the caller's options only;
`_reader_idx_and_position(key)`, with array_record's ValueError outside
[0, len)), beside its `_readers` (loader/sources.py); the subclass raised
AttributeError. Elsewhere every element, dtype, shape, state and resume
matched, apart from the documented worker-count difference of `DataLoader`
batches.
"""

from __future__ import annotations

import json
import os

import absl.flags
import numpy as np

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


# google-research/swirl-dynamics: swirl_dynamics/projects/ergodic/utils.py
# (`RandomSection`, `ArrayDataSource`, `create_loader_from_hdf5`,
# `create_loader_from_hdf5_reshaped`) and swirl_dynamics/projects/debiasing/
# rectified_flow/pygrain_transforms.py (`Standardize`, `Concatenate`,
# `BatchOT`, `RandomShuffleChunk`, `FilterExtremes`), as written apart from
# docstrings; `hdf5_utils` is a small h5py stand-in for swirl's module.
SWIRL = r'''
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
from typing import Any, KeysView

import grain.python as pygrain
import h5py
import jax
import numpy as np
import scipy.optimize as spopt

Array = jax.Array
FlatFeatures = dict[str, Any]


class hdf5_utils:  # stand-in for swirl_dynamics.data.hdf5_utils
  @staticmethod
  def read_arrays_as_tuple(path, keys):
    with h5py.File(path, "r") as f:
      return tuple(f[k][()] for k in keys)

  @staticmethod
  def read_single_array(path, key):
    with h5py.File(path, "r") as f:
      return f[key][()]


# swirl_dynamics/projects/ergodic/utils.py
@dataclasses.dataclass(frozen=True)
class RandomSection(pygrain.RandomMapTransform):
  """Samples a random section in a given trajectory."""

  feature_names: tuple[str, ...]
  num_steps: int
  stride: int = 1

  def random_map(
      self, element: dict[str, Any], rng: np.random.Generator
  ) -> dict[str, Any]:
    total_length = element[self.feature_names[0]].shape[0]
    sample_length = self.stride * (self.num_steps - 1) + 1

    for name in self.feature_names[1:]:
      feature_length = element[name].shape[0]
      if feature_length != total_length:
        raise ValueError(
            "Features must have the same dimension along axis 0:"
            f" {self.feature_names[0]} ({total_length}) vs."
            f" {name} ({feature_length})"
        )

    if sample_length > total_length:
      raise ValueError(
          f"Not enough steps [{total_length}] "
          f"for desired sample length [{sample_length}] "
          f"= stride [{self.stride}] * (num_steps [{self.num_steps}] - 1) + 1"
      )
    elif sample_length == total_length:
      start_idx = 0
    else:
      start_idx = rng.integers(0, total_length - sample_length + 1)

    end_idx = start_idx + sample_length

    for name in self.feature_names:
      element[name] = element[name][start_idx : end_idx : self.stride]
    return element


class ArrayDataSource(pygrain.RandomAccessDataSource):
  """A data source from a dictionary of arrays."""

  def __init__(self, **arrays):
    self._arrays = arrays
    self._length = len(next(iter(arrays.values())))
    for k, v in arrays.items():
      if len(v) != self._length:
        raise ValueError(
            f"Array {k} has length {len(v)}, expected {self._length}"
        )

  def __len__(self):
    return self._length

  def __getitem__(self, idx):
    return {k: v[idx] for k, v in self._arrays.items()}


def create_loader_from_hdf5_reshaped(
    num_time_steps: int,
    time_stride: int,
    batch_size: int,
    dataset_path: str,
    seed: int = 0,
    split: str | None = None,
    spatial_downsample_factor: int = 1,
    normalize: bool = False,
    normalize_stats: dict[str, Array] | None = None,
    tf_lookup_batch_size: int = 1024,
    tf_lookup_num_parallel_calls: int = -1,
) -> tuple[pygrain.DataLoader, dict[str, Array | None]]:
  snapshots, tspan = hdf5_utils.read_arrays_as_tuple(
      dataset_path, (f"{split}/u", f"{split}/t")
  )
  if spatial_downsample_factor > 1:
    if snapshots.ndim == 3:
      snapshots = snapshots[:, :, ::spatial_downsample_factor]
    elif snapshots.ndim == 4:
      snapshots = snapshots[:, :, ::spatial_downsample_factor, :]
    elif snapshots.ndim == 5:
      snapshots = snapshots[
          :, :, ::spatial_downsample_factor, ::spatial_downsample_factor, :
      ]
    else:
      raise NotImplementedError(
          f"Number of dimensions {snapshots.ndim} not "
          "supported for spatial downsampling."
      )
  if normalize:
    if normalize_stats is not None:
      mean = normalize_stats["mean"]
      std = normalize_stats["std"]
    else:
      if split != "train":
        data_for_stats = hdf5_utils.read_single_array(dataset_path, "train/u")
      else:
        data_for_stats = snapshots
      mean = np.mean(data_for_stats, axis=(0, 1))
      std = np.std(data_for_stats, axis=(0, 1))
    snapshots -= mean
    snapshots /= std
  else:
    mean, std = None, None

  if num_time_steps == -1:  # Use full (downsampled) trajectories
    num_time_steps = tspan.shape[1] // time_stride

  snapshots = snapshots[:, ::time_stride]
  tspan = tspan[:, ::time_stride]

  num_segments_per_traj = snapshots.shape[1] // num_time_steps
  snapshots = snapshots[:, : (num_segments_per_traj * num_time_steps)]
  snapshots = np.reshape(snapshots, (-1, num_time_steps, *snapshots.shape[2:]))

  tspan = tspan[:, : (num_segments_per_traj * num_time_steps)]
  tspan = np.reshape(tspan, (-1, num_time_steps, *tspan.shape[2:]))

  source = ArrayDataSource(u=snapshots, t=tspan)

  worker_count = 0
  if tf_lookup_num_parallel_calls != -1:
    worker_count = tf_lookup_num_parallel_calls

  if batch_size == -1:  # Use full dataset as batch
    batch_size = len(source)

  loader = pygrain.DataLoader(
      data_source=source,
      sampler=pygrain.IndexSampler(
          num_records=len(source),
          shuffle=True,
          seed=seed,
          shard_options=pygrain.ShardOptions(
              shard_index=jax.process_index(),
              shard_count=jax.process_count(),
              drop_remainder=True,
          ),
          num_epochs=None,
      ),
      operations=[pygrain.Batch(batch_size=batch_size, drop_remainder=True)],
      worker_count=worker_count,
      worker_buffer_size=tf_lookup_batch_size,
  )
  return loader, {"mean": mean, "std": std}


def create_loader_from_hdf5(
    num_time_steps: int,
    time_stride: int,
    batch_size: int,
    dataset_path: str,
    seed: int,
    split: str | None = None,
    spatial_downsample_factor: int = 1,
    normalize: bool = False,
    normalize_stats: dict[str, Array] | None = None,
    tf_lookup_batch_size: int = 1024,
    tf_lookup_num_parallel_calls: int = -1,
) -> tuple[pygrain.DataLoader, dict[str, Array | None]]:
  snapshots, tspan = hdf5_utils.read_arrays_as_tuple(
      dataset_path, (f"{split}/u", f"{split}/t")
  )
  if spatial_downsample_factor > 1:
    if snapshots.ndim == 3:
      snapshots = snapshots[:, :, ::spatial_downsample_factor]
    elif snapshots.ndim == 4:
      snapshots = snapshots[:, :, ::spatial_downsample_factor, :]
    elif snapshots.ndim == 5:
      snapshots = snapshots[
          :, :, ::spatial_downsample_factor, ::spatial_downsample_factor, :
      ]
    else:
      raise NotImplementedError(
          f"Number of dimensions {snapshots.ndim} not "
          "supported for spatial downsampling."
      )
  if normalize:
    if normalize_stats is not None:
      mean = normalize_stats["mean"]
      std = normalize_stats["std"]
    else:
      if split != "train":
        data_for_stats = hdf5_utils.read_single_array(dataset_path, "train/u")
      else:
        data_for_stats = snapshots
      mean = np.mean(data_for_stats, axis=(0, 1))
      std = np.std(data_for_stats, axis=(0, 1))
    snapshots -= mean
    snapshots /= std
  else:
    mean, std = None, None

  source = ArrayDataSource(u=snapshots, t=tspan)

  if num_time_steps == -1:  # Use full (downsampled) trajectories.
    num_time_steps = tspan.shape[1] // time_stride
  section_transform = RandomSection(
      feature_names=("u", "t"),
      num_steps=num_time_steps,
      stride=time_stride,
  )

  worker_count = 0
  if tf_lookup_num_parallel_calls != -1:
    worker_count = tf_lookup_num_parallel_calls

  if batch_size == -1:  # Use full dataset as batch.
    batch_size = len(source)

  loader = pygrain.DataLoader(
      data_source=source,
      sampler=pygrain.IndexSampler(
          num_records=len(source),
          shuffle=True,
          seed=seed,
          shard_options=pygrain.ShardOptions(
              shard_index=jax.process_index(),
              shard_count=jax.process_count(),
              drop_remainder=True,
          ),
          num_epochs=None,
      ),
      operations=[
          section_transform,
          pygrain.Batch(batch_size=batch_size, drop_remainder=True),
      ],
      worker_count=worker_count,
      worker_buffer_size=tf_lookup_batch_size,
  )
  return loader, {"mean": mean, "std": std}


# swirl_dynamics/projects/debiasing/rectified_flow/pygrain_transforms.py
@dataclasses.dataclass(frozen=True)
class Standardize(pygrain.MapTransform):
  """Standardize variables pixel-wise using pre-computed mean and std."""

  input_fields: Sequence[str] | KeysView[str]
  mean: Mapping[str, np.ndarray]
  std: Mapping[str, np.ndarray]

  def map(self, features: FlatFeatures) -> FlatFeatures:
    for field in self.input_fields:
      features[field] = (features[field] - self.mean[field]) / self.std[field]
    return features


@dataclasses.dataclass(frozen=True)
class Concatenate(pygrain.MapTransform):
  """Creates a new field by concatenating selected fields."""

  input_fields: Sequence[str]
  output_field: str
  axis: int
  remove_inputs: bool = True

  def map(self, features: FlatFeatures) -> FlatFeatures:
    arrays = [features[f] for f in self.input_fields]
    features[self.output_field] = np.concatenate(arrays, axis=self.axis)
    if self.remove_inputs:
      for f in self.input_fields:
        del features[f]
    return features


@dataclasses.dataclass(frozen=True)
class BatchOT(pygrain.MapTransform):
  """Shuffles the elements of a chunk by solving a linear assigment problem."""

  input_field: str
  output_field: str
  batch_size: int
  cost: Callable[[np.ndarray], np.ndarray] = np.square
  mean_input_field: str | None = None
  std_input_field: str | None = None

  def map(self, features: FlatFeatures) -> FlatFeatures:
    in_features = features[self.input_field].reshape((self.batch_size, -1))
    out_features = features[self.output_field].reshape((self.batch_size, -1))

    cost_matrix = np.sum(
        self.cost(in_features[:, None, :] - out_features[None, :, :]), axis=-1
    )
    index = spopt.linear_sum_assignment(cost_matrix)
    features[self.input_field] = features[self.input_field][index[0]]
    features[self.output_field] = features[self.output_field][index[1]]

    if self.mean_input_field:
      features[self.mean_input_field] = features[self.mean_input_field][
          index[0]
      ]
    if self.std_input_field:
      features[self.std_input_field] = features[self.std_input_field][index[0]]

    return features


@dataclasses.dataclass(frozen=True)
class RandomShuffleChunk(pygrain.RandomMapTransform):
  """Randomly shuffle a chunk."""

  input_fields: Sequence[str]
  batch_size: int

  def random_map(
      self, features: FlatFeatures, rng: np.random.Generator
  ) -> FlatFeatures:
    for field in self.input_fields:
      features[field] = rng.permutation(features[field], axis=0)
    return features


class FilterExtremes(pygrain.FilterTransform):  # (not a dataclass in the client)
  fields: Sequence[str]
  extreme_norm: float = 270

  def filter(self, element) -> bool:
    for field in self.fields:
      if (
          np.linalg.norm(element[field], axis=(-3, -2)) > self.extreme_norm
      ).any():
        return False
    return True


# The client's callers, shrunk.
def summary(batch):
  return {k: [v.shape, str(v.dtype), np.round(v, 5).tolist()] for k, v in sorted(batch.items())}


results = {}
loader, stats = create_loader_from_hdf5(
    num_time_steps=3, time_stride=2, batch_size=2, dataset_path=PATH, seed=7,
    split="train", normalize=True, tf_lookup_batch_size=2, tf_lookup_num_parallel_calls=WORKERS)
results["stats"] = {k: np.round(v, 5).tolist() for k, v in stats.items()}
it = iter(loader)
states, reference = [], []
for _ in range(8):  # 6 trajectories, 3 batches an epoch: into the third epoch.
  states.append(it.get_state())
  reference.append(summary(next(it)))
results["batches"] = reference
results["state_2"] = json.loads(states[2])
restored = []
for k in range(0, 8, 5 if WORKERS else 1):
  fresh = iter(loader)
  fresh.set_state(states[k])
  restored.append([summary(next(fresh)) for _ in range(8 - k)] == reference[k:])
results["restored"] = restored

# The eval split normalized with the train split's stats; the reshaped loader.
_, eval_stats = create_loader_from_hdf5(
    num_time_steps=-1, time_stride=1, batch_size=-1, dataset_path=PATH, seed=0,
    split="eval", normalize=True)
results["eval_stats"] = {k: np.round(v, 5).tolist() for k, v in eval_stats.items()}
reshaped, _ = create_loader_from_hdf5_reshaped(
    num_time_steps=4, time_stride=1, batch_size=-1, dataset_path=PATH, seed=3,
    split="eval", spatial_downsample_factor=2)
it = iter(reshaped)
results["reshaped"] = [summary(next(it)) for _ in range(2)]

# The rectified-flow transforms over a chunked source.
rng = np.random.default_rng(0)
chunks = ArrayDataSource(
    a=rng.normal(size=(6, 3, 4, 2, 1)).astype(np.float32),
    b=rng.normal(size=(6, 3, 4, 2, 1)).astype(np.float32))
mean = {"a": np.float32(0.5), "b": np.float32(-0.5)}
std = {"a": np.float32(2.0), "b": np.float32(1.5)}
ops = [
    Standardize(input_fields={"a": 1, "b": 2}.keys(), mean=mean, std=std),
    Concatenate(input_fields=("a", "b"), output_field="x", axis=-1, remove_inputs=False),
    RandomShuffleChunk(input_fields=("a", "b"), batch_size=3),
    BatchOT(input_field="a", output_field="b", batch_size=3),
]
flow = pygrain.DataLoader(
    data_source=chunks,
    sampler=pygrain.IndexSampler(num_records=len(chunks), shuffle=False, seed=1, num_epochs=1,
                                 shard_options=pygrain.ShardOptions(0, 1, drop_remainder=True)),
    operations=ops, worker_count=WORKERS)
results["flow"] = [summary(x) for x in flow]
try:
  FilterExtremes(fields=("a",))
except TypeError as e:
  results["filter_extremes"] = f"{type(e).__name__}: {e}"
fe = FilterExtremes()
fe.fields = ("a", "b")
fe.extreme_norm = 4.0
kept = pygrain.MapDataset.source(chunks).filter(fe)
results["filter_kept"] = [kept[i] is not None for i in range(len(kept))]
results["filter_iter"] = len(list(kept))
'''


def _swirl_data(directory):
  import h5py  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  path = os.path.join(directory, "ks.hdf5")
  with h5py.File(path, "w") as f:
    for split, n in (("train", 6), ("eval", 2)):
      f[f"{split}/u"] = rng.normal(size=(n, 9, 4, 1)).astype(np.float32)
      f[f"{split}/t"] = np.tile(np.arange(9, dtype=np.float32) * 0.5, (n, 1))
  return path


def test_swirl_dynamics_random_section_loader_and_pygrain_transforms_as_on_grain(tmp_path):
  """google-research/swirl-dynamics: projects/ergodic/utils.py and debiasing/rectified_flow/pygrain_transforms.py."""
  path = _swirl_data(tmp_path)
  g, l = porting.run_both(SWIRL, PATH=path, WORKERS=0)
  g, l = porting.grain_keys(g.results), porting.grain_keys(l.results)
  g_state, l_state = g.pop("state_2"), l.pop("state_2")
  assert porting.grain_keys(l_state) == {**g_state, "data_source": l_state["data_source"]}
  assert g_state["last_seen_indices"] == {"0": 3} and "num_epochs=None" in g_state["sampler"]
  assert l == g
  assert all(g["restored"]) and len(g["restored"]) == 8
  first = g["batches"][0]
  assert first["u"][0] == [2, 3, 4, 1] and first["u"][1] == "float32" and first["t"][0] == [2, 3]
  assert g["reshaped"][0]["u"][0] == [4, 4, 2, 1]
  assert len(g["flow"]) == 6 and g["flow"][0]["x"][0] == [3, 4, 2, 2]
  assert g["filter_extremes"] == "TypeError: FilterExtremes() takes no arguments"
  assert True in g["filter_kept"] and False in g["filter_kept"]
  assert g["filter_iter"] == sum(g["filter_kept"])


def test_swirl_dynamics_loader_with_workers_as_on_grain(tmp_path):
  """google-research/swirl-dynamics projects/ergodic/utils.py with `tf_lookup_num_parallel_calls=2` (two worker processes)."""
  path = _swirl_data(tmp_path)
  defs, usage = SWIRL.split("# The client's callers, shrunk.")
  script = ("import absl.flags\n" + defs + "\nif __name__ == '__main__':\n"
            "  absl.flags.FLAGS.mark_as_parsed()\n"
            f"  PATH, WORKERS = {path!r}, 2\n"
            + "".join(f"  {line}\n" for line in usage.strip().splitlines())
            + "  print(json.dumps(results))\n")
  g = porting.grain_keys(porting.run_script(script, "grain", tmp_path))
  l = porting.grain_keys(porting.run_script(script, "loader", tmp_path))
  g.pop("state_2"), l.pop("state_2")
  in_process = porting.grain_keys(porting.run(SWIRL, "grain", PATH=path, WORKERS=0).results)
  assert g["restored"] == l["restored"] == [True, True]
  assert g["flow"] == l["flow"] == in_process["flow"]
  # README (`DataLoader`, "one stream whatever worker_count"): loader's
  # batches with two workers are its (and Grain's) batches without; Grain's
  # workers each batch their own records (positions 0, 2 | 1, 3 | 4, 6 | ...),
  # the same records, with the same random sections, regrouped.
  assert l["batches"] == in_process["batches"] != g["batches"]

  def rows(batches):
    return sorted(json.dumps([b["t"][2][i], b["u"][2][i]]) for b in batches for i in range(2))

  assert rows(g["batches"][:6]) == rows(in_process["batches"][:6])
  assert [b["t"][2] for b in g["batches"][:2]] == [
      [in_process["batches"][0]["t"][2][0], in_process["batches"][1]["t"][2][0]],
      [in_process["batches"][0]["t"][2][1], in_process["batches"][1]["t"][2][1]]]


# google/airio: airio/_src/pygrain/common/packing.py as written (its
# `PackerProtocol` and the two AirIO preprocessor wrappers left out), with
# constants.SKIP_FEATURE inlined; its unit tests' `lazy_dataset.
# SourceLazyMapDataset` (gone from Grain 0.2.18) is `grain.MapDataset.source`.
AIRIO_PACKING = r'''
import base64
import collections
import copy
import dataclasses
import math
from typing import Any, Callable, Sequence, TypeVar

import grain.python as grain
import jax
import numpy as np

class PyTree:  # stand-in for jaxtyping.PyTree
  def __class_getitem__(cls, item):
    return Any


T = TypeVar("T")
SKIP_FEATURE = -1  # airio._src.pygrain.common.constants


@dataclasses.dataclass(frozen=False)
class PackLazyMapDataset(grain.MapDataset[T]):
  """Packs a dataset. Produces a sparse dataset."""

  def __init__(
      self, parent: grain.MapDataset, pool_size: int, packer
  ):
    super().__init__([parent])
    self._packed_ds = PoolLazyMapDataset(parent, pool_size)
    pack_flatmap = PackPoolFlatMap(pool_size, packer)
    self._packed_ds = grain.experimental.FlatMapMapDataset(
        self._packed_ds, pack_flatmap
    )

  @property
  def parent(self):
    return self._parent

  def __len__(self):
    return len(self.parent)

  def __getitem__(self, index: slice):
    if isinstance(index, slice):
      return self.slice(index)
    return self._packed_ds[index]


class PoolLazyMapDataset(grain.MapDataset[T]):
  """Pools consecutive examples from a LazyMapDataset."""

  def __init__(
      self,
      parent: grain.MapDataset,
      pool_size: int,
  ):
    super().__init__(parent)
    self._pool_size = pool_size
    self._length = math.ceil(len(self._parent) / self._pool_size)

  def __len__(self):
    return self._length

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    start = index * self._pool_size
    stop = min(len(self._parent), (index + 1) * self._pool_size)
    return [self._parent[i] for i in range(start, stop)]


class PackPoolFlatMap(grain.experimental.FlatMapTransform):
  """Packs and yields a pool of examples."""

  def __init__(
      self,
      pool_size: int,
      packer,
  ):
    self.max_fan_out = pool_size
    self.packer = packer

  def flat_map(self, example_pool):
    packer = copy.deepcopy(self.packer)
    yielded = 0
    for ex in example_pool:
      packed_examples = packer.fit_example(ex)
      for packed_example in packed_examples:
        if yielded >= self.max_fan_out:
          return
        yielded += 1
        yield packed_example
    while packer.has_partially_packed_examples():
      if yielded >= self.max_fan_out:
        return
      yielded += 1
      yield packer.get_packed_example()


class _PackLazyDatasetIterator(grain.DatasetIterator):
  """See PackLazyIterDataset for details."""

  def __init__(
      self,
      parent: grain.DatasetIterator,
      packer,
  ):
    super().__init__()
    self._parent_iter = parent
    self._packer = packer
    self._packer_type = type(packer)
    self._packed_examples = collections.deque[PyTree[np.ndarray]]()

  def __next__(self):
    if self._packed_examples:
      return self._packed_examples.popleft()
    try:
      while not self._packed_examples:
        ex = next(self._parent_iter)
        for ex in self._packer.fit_example(ex):
          self._packed_examples.append(ex)
      return self._packed_examples.popleft()
    except StopIteration as e:
      if self._packed_examples:
        return self._packed_examples.popleft()
      if self._packer.has_partially_packed_examples():
        return self._packer.get_packed_example()
      raise e

  def get_state(self):
    return {
        "parent": self._parent_iter.get_state(),
        "packer": self._packer.as_dict(),
        "packed_examples": [save_np_tree(ex) for ex in self._packed_examples],
    }

  def set_state(self, state):
    self._parent_iter.set_state(state["parent"])
    self._packer = self._packer_type.from_dict(state["packer"])
    self._packed_examples = collections.deque[PyTree[np.ndarray]](
        [load_np_tree(t) for t in state["packed_examples"]]
    )


@dataclasses.dataclass(frozen=False)
class PackLazyIterDataset(grain.IterDataset[T]):
  """Packs a `LazyIterDataset`."""

  def __init__(self, parent: grain.IterDataset, packer):
    super().__init__([parent])
    self._packer = packer

  def __iter__(self) -> grain.DatasetIterator:
    return _PackLazyDatasetIterator(
        iter(self._parent), self._packer
    )


class MultiBinPacker:
  """Container and utils to pack examples. Supports partially packed examples."""

  def __init__(
      self,
      num_partial_examples: int,
      feature_lengths: PyTree[int] | None = None,
  ):
    self.num_partial_examples = num_partial_examples
    self._feature_lengths = feature_lengths
    self._partially_packed_examples = collections.deque[
        PartiallyPackedExample
    ]()
    self._flat_feature_lengths = flatten(feature_lengths)

  @property
  def feature_lengths(self):
    return self._feature_lengths

  @property
  def flat_feature_lengths(self):
    return self._flat_feature_lengths

  @feature_lengths.setter
  def feature_lengths(self, feature_lengths):
    self._feature_lengths = feature_lengths
    self._flat_feature_lengths = flatten(feature_lengths)

  def as_dict(self):
    return {
        "num_partial_examples": copy.deepcopy(self.num_partial_examples),
        "feature_lengths": copy.deepcopy(self._feature_lengths),
        "partially_packed_examples": [
            p.as_dict() for p in self._partially_packed_examples
        ],
    }

  @classmethod
  def from_dict(cls, state):
    obj = cls(state["num_partial_examples"])
    if state["feature_lengths"]:
      obj.feature_lengths = state["feature_lengths"]
    obj._partially_packed_examples = collections.deque[PartiallyPackedExample]([
        PartiallyPackedExample.from_dict(p)
        for p in state["partially_packed_examples"]
    ])
    return obj

  def has_partially_packed_examples(self):
    return len(self._partially_packed_examples)

  def get_packed_example(self):
    if not self._partially_packed_examples:
      raise ValueError("No packed examples available.")
    return unflatten_packed_example(
        self._partially_packed_examples.popleft().pack(),
        length_struct=self.feature_lengths,
    )

  def get_packed_feature_lengths(self):
    if not self.feature_lengths:
      raise ValueError("feature_lengths must be set before packing.")
    seq_lens = self.feature_lengths
    new_seq_lens = {}
    for feature in seq_lens:
      new_seq_lens[feature] = seq_lens[feature]
      if not seq_lens[feature] or seq_lens[feature] == SKIP_FEATURE:
        continue
      new_seq_lens[f"{feature}_segment_ids"] = seq_lens[feature]
      new_seq_lens[f"{feature}_positions"] = seq_lens[feature]
    return new_seq_lens

  def fit_example(self, ex: PyTree[np.ndarray]) -> Sequence[PyTree[np.ndarray]]:
    if not self.feature_lengths:
      raise ValueError("feature_lengths must be set before packing.")
    packed_examples = []
    while len(self._partially_packed_examples) > self.num_partial_examples:
      packed_examples.append(self.get_packed_example())

    flat_ex = flatten(ex)
    flat_ex = trim_flattened(flat_ex, self.flat_feature_lengths)

    fits = False
    fully_packed = None
    fully_packed_idx = None
    for idx, partially_packed in enumerate(self._partially_packed_examples):
      if partially_packed.example_fits(flat_ex):
        fits = True
        partially_packed.add_example(flat_ex)
        if partially_packed.is_fully_packed():
          fully_packed = partially_packed
          fully_packed_idx = idx
        break

    if fully_packed:
      assert fits
      packed = unflatten_packed_example(
          fully_packed.pack(),
          length_struct=self.feature_lengths,
      )
      del self._partially_packed_examples[fully_packed_idx]
      packed_examples.append(packed)

    if not fits:
      partially_packed = PartiallyPackedExample(
          copy.copy(self.flat_feature_lengths)
      )
      partially_packed.add_example(flat_ex)
      if partially_packed.is_fully_packed():
        packed_examples.append(
            unflatten_packed_example(
                partially_packed.pack(),
                length_struct=self.feature_lengths,
            )
        )
      else:
        self._partially_packed_examples.append(partially_packed)
    return packed_examples


class NoamPacker:
  """An implementation of the popular Noam Packing algorithm."""

  def __init__(
      self,
      feature_lengths: PyTree[int] | None = None,
  ):
    self._feature_lengths = feature_lengths
    self._flat_feature_lengths = flatten(feature_lengths)
    self._partially_packed_example = None
    if feature_lengths:
      self._partially_packed_example = PartiallyPackedExample(
          copy.copy(self._flat_feature_lengths)
      )

  @property
  def feature_lengths(self):
    return self._feature_lengths

  @property
  def flat_feature_lengths(self):
    return self._flat_feature_lengths

  @feature_lengths.setter
  def feature_lengths(self, feature_lengths):
    self._feature_lengths = feature_lengths
    self._flat_feature_lengths = flatten(feature_lengths)
    self._partially_packed_example = PartiallyPackedExample(
        copy.copy(self._flat_feature_lengths)
    )

  def as_dict(self):
    return {
        "feature_lengths": copy.deepcopy(self._feature_lengths),
        "partially_packed_example": self._partially_packed_example.as_dict(),
    }

  @classmethod
  def from_dict(cls, state):
    obj = cls()
    if state["feature_lengths"]:
      obj.feature_lengths = state["feature_lengths"]
      obj._partially_packed_example = PartiallyPackedExample.from_dict(
          state["partially_packed_example"]
      )
    return obj

  def has_partially_packed_examples(self):
    return not self._partially_packed_example.is_empty()

  def get_packed_example(self):
    if self._partially_packed_example.is_empty():
      raise ValueError("No packed examples available.")
    return self._slice_and_keep_remainder()

  def get_packed_feature_lengths(self):
    if not self.feature_lengths:
      raise ValueError("feature_lengths must be set before packing.")
    return self.feature_lengths

  def fit_example(self, ex: PyTree[np.ndarray]) -> Sequence[PyTree[np.ndarray]]:
    if not self.feature_lengths:
      raise ValueError("feature_lengths must be set before packing.")
    assert not self._partially_packed_example.is_fully_packed()

    packed_examples = []

    flat_ex = flatten(ex)
    self._partially_packed_example.add_example(flat_ex)
    while self._partially_packed_example.is_fully_packed():
      packed_examples.append(self._slice_and_keep_remainder())

    return packed_examples

  def _slice_and_keep_remainder(self):
    packed = self._partially_packed_example.pack()
    packed = remove_packed_marker_features_flattened(
        packed, self.flat_feature_lengths
    )
    trimmed = trim_flattened(copy.copy(packed), self.flat_feature_lengths)
    remainder = remainder_after_trim_flattened(
        copy.copy(packed), self.flat_feature_lengths
    )
    self._partially_packed_example = PartiallyPackedExample(
        copy.copy(self.flat_feature_lengths)
    )
    if not is_empty_flattened(remainder, self.flat_feature_lengths):
      self._partially_packed_example.add_example(remainder)
    return unflatten_packed_example(trimmed, length_struct=self.feature_lengths)


@dataclasses.dataclass
class PartiallyPackedExample:
  """Container and utils for partially packed examples."""

  _partially_packed_flat_example_list: list[PyTree[np.ndarray]]
  _combined_flat_lengths: list[int]
  _available_flat_lengths: list[int]

  def __init__(
      self,
      available_flat_lengths: list[int],
  ):
    self._partially_packed_flat_example_list = []
    self._available_flat_lengths = available_flat_lengths
    self._combined_flat_lengths = [
        SKIP_FEATURE if l == SKIP_FEATURE else 0 for l in available_flat_lengths
    ]

  def as_dict(self):
    d = {
        "partially_packed_flat_example_list": (
            save_np_tree(self._partially_packed_flat_example_list)
        ),
        "combined_flat_lengths": copy.deepcopy(self._combined_flat_lengths),
        "available_flat_lengths": copy.deepcopy(self._available_flat_lengths),
    }
    return d

  @classmethod
  def from_dict(cls, state):
    obj = cls(state["available_flat_lengths"])
    obj._partially_packed_flat_example_list = load_np_tree(
        state["partially_packed_flat_example_list"]
    )
    obj._combined_flat_lengths = state["combined_flat_lengths"]
    return obj

  def add_example(self, flat_ex: Any):
    self._partially_packed_flat_example_list.append(flat_ex)
    for i in range(len(self._available_flat_lengths)):
      if self._available_flat_lengths[i] == SKIP_FEATURE:
        continue
      length = len(flat_ex[i])
      self._available_flat_lengths[i] = max(
          0, self._available_flat_lengths[i] - length
      )
      self._combined_flat_lengths[i] += length

  def example_fits(self, flat_ex: Any):
    for i in range(len(self._available_flat_lengths)):
      if self._available_flat_lengths[i] == SKIP_FEATURE:
        continue
      if self._available_flat_lengths[i] < len(flat_ex[i]):
        return False
    return True

  def is_fully_packed(self):
    for length in self._available_flat_lengths:
      if length and length != SKIP_FEATURE:
        return False
    return True

  def is_empty(self):
    for length in self._combined_flat_lengths:
      if length and length != SKIP_FEATURE:
        return False
    return True

  def pack(self):
    flat_elements = self._partially_packed_flat_example_list
    flat_packed_element = []
    for feature in range(len(self._combined_flat_lengths)):
      if self._combined_flat_lengths[feature] == SKIP_FEATURE:
        flat_packed_element.append(
            [flat_elements[i][feature] for i in range(len(flat_elements))]
        )
        continue
      sequence_length = self._combined_flat_lengths[feature]
      remaining_dims = flat_elements[0][feature].shape[1:]
      shape = [sequence_length, *remaining_dims]
      dtype = flat_elements[0][feature].dtype
      values = np.zeros(shape, dtype=dtype)
      segmentations = np.zeros(shape=[sequence_length], dtype=np.int32)
      positions = np.zeros(shape=[sequence_length], dtype=np.int32)

      start = 0
      for i in range(len(flat_elements)):
        length = min(len(flat_elements[i][feature]), sequence_length - start)
        end = start + length
        values[start:end] = flat_elements[i][feature][:length]
        segmentations[start:end] = i + 1
        positions[start:end] = np.arange(length)
        start += length
      flat_packed_element.append((values, segmentations, positions))
    return flat_packed_element


def trim_flattened(flat_ex: list[np.ndarray], flat_lengths: list[int]):
  for i in range(len(flat_lengths)):
    if flat_lengths[i] == SKIP_FEATURE:
      continue
    flat_ex[i] = flat_ex[i][: flat_lengths[i], ...]
  return flat_ex


def remainder_after_trim_flattened(
    flat_ex: list[np.ndarray], flat_lengths: list[int]
):
  for i in range(len(flat_lengths)):
    if flat_lengths[i] == SKIP_FEATURE:
      flat_ex[i] = flat_ex[i][-1]
      continue
    flat_ex[i] = flat_ex[i][flat_lengths[i]:, ...]
  return flat_ex


def is_empty_flattened(flat_ex, flat_lengths):
  for i in range(len(flat_lengths)):
    if flat_lengths[i] == SKIP_FEATURE:
      continue
    if flat_ex[i].size:
      return False
  return True


def remove_packed_marker_features_flattened(packed, flat_lengths):
  packed_without_markers = []
  for i in range(len(flat_lengths)):
    if flat_lengths[i] == SKIP_FEATURE:
      packed_without_markers.append(packed[i])
      continue
    packed_without_markers.append(packed[i][0])
  return packed_without_markers


def flatten(structure):
  return jax.tree_util.tree_flatten(structure)[0]


def unflatten_as(structure, flat_sequence):
  return jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(structure), flat_sequence
  )


def unflatten_packed_example(
    packed_flat_example: Sequence[np.ndarray], length_struct: PyTree[int]
) -> PyTree[np.ndarray]:
  packed_element = unflatten_as(length_struct, packed_flat_example)
  if isinstance(packed_element, dict):
    for key in list(packed_element):
      value = packed_element[key]
      if isinstance(value, tuple) and len(value) == 3:
        packed_element[key] = value[0]
        packed_element[f"{key}_segment_ids"] = value[1]
        packed_element[f"{key}_positions"] = value[2]
  return packed_element


def save_np_tree(tree: PyTree[np.ndarray]):
  return {
      "data": jax.tree.map(
          lambda x: base64.b64encode(x.tobytes()).decode(), tree
      ),
      "dtypes": jax.tree.map(lambda x: x.dtype.descr[0][1], tree),
      "shapes": jax.tree.map(lambda x: x.shape, tree),
  }


def load_np_tree(tree: dict[str, PyTree[Any]]):
  return jax.tree.map(
      lambda x, y, z: np.frombuffer(
          base64.b64decode(x), dtype=np.dtype(y)
      ).reshape(z),
      tree["data"],
      tree["dtypes"],
      tree["shapes"],
  )


# Uses shrunk from packing_test.py, and a stream resumed at every step.
def plain_eq(a, b):
  return json.dumps(jax.tree.map(lambda x: x.tolist(), a)) == json.dumps(jax.tree.map(lambda x: x.tolist(), b))


results = {}
docs = [{"inputs": [1, 2, 3, 4], "targets": [10, 20]}, {"inputs": [5, 6], "targets": [30, 40, 50]},
        {"inputs": [11, 12, 13, 14], "targets": [31]}, {"inputs": [7], "targets": [60]},
        {"inputs": [8], "targets": [61, 62]}, {"inputs": [9, 9, 9], "targets": [70]}]
ds = grain.MapDataset.source(docs).map(lambda d: {k: np.asarray(v) for k, v in d.items()})
packed = PackLazyMapDataset(ds, pool_size=4, packer=MultiBinPacker(
    feature_lengths={"inputs": 6, "targets": 4}, num_partial_examples=10))
results["map_len"] = len(packed)
results["map_items"] = [None if packed[i] is None else sorted(packed[i]) for i in range(len(packed))]
results["map_iter"] = [jax.tree.map(lambda x: x.tolist(), x) for x in packed]
results["map_dtypes"] = sorted({str(v.dtype) for x in packed for v in x.values()})
results["map_shuffled"] = [jax.tree.map(lambda x: x.tolist(), x) for x in packed.shuffle(seed=3).to_iter_dataset()]
results["map_sliced"] = len(packed[1:5]), [jax.tree.map(lambda x: x.tolist(), x) for x in packed[1:5]]
results["parents"] = [type(p).__name__ for p in packed.parents]


def make_stream(packer):
  def make():
    return PackLazyIterDataset(ds.repeat(2).to_iter_dataset(), packer=copy.deepcopy(packer))
  return make


for name, packer in [("multi_bin", MultiBinPacker(2, {"inputs": 5, "targets": 4})),
                     ("noam", NoamPacker({"inputs": 5, "targets": 3}))]:
  # Each state restored once: `PartiallyPackedExample.from_dict` keeps the
  # state's `available_flat_lengths` list and packing then changes it.
  reference, checks = restore_at_every_step(make_stream(packer), same_after_end=False)
  results[name] = [jax.tree.map(lambda x: x.tolist(), x) for x in reference]
  results[name + "_restores"] = checks
it = iter(make_stream(NoamPacker({"inputs": 5, "targets": 3}))())
next(it), next(it)
results["noam_state"] = it.get_state()
'''


def test_airio_map_and_iter_packing_with_packer_states_as_on_grain():
  """google/airio: airio/_src/pygrain/common/packing.py (PackLazyMapDataset / PoolLazyMapDataset / PackPoolFlatMap, PackLazyIterDataset's iterator state, MultiBinPacker, NoamPacker)."""
  source = "import json\n" + AIRIO_PACKING.replace("results = {}\n", porting.RESTORE_AT_EVERY_STEP + "results = {}\n", 1)
  g, l = porting.run_both_grain_keys(source)
  assert l == g
  assert g["map_len"] == 6 and g["map_items"][2] is None and g["parents"] == ["MapMapDataset"]
  assert g["map_iter"][0] == {"inputs": [5, 6, 11, 12, 13, 14], "inputs_positions": [0, 1, 0, 1, 2, 3],
                              "inputs_segment_ids": [1, 1, 2, 2, 2, 2], "targets": [30, 40, 50, 31],
                              "targets_positions": [0, 1, 2, 0], "targets_segment_ids": [1, 1, 1, 2]}
  assert g["map_dtypes"] == ["int32", "int64"]
  for name in ("multi_bin", "noam"):
    assert len(g[name]) >= 4 and g[name + "_restores"] == [[True]] * (len(g[name]) + 1)
  assert g["noam"][0] == {"inputs": [1, 2, 3, 4, 5], "targets": [10, 20, 30]}
  assert set(g["noam_state"]) == {"parent", "packer", "packed_examples"}



# A CIFAR-10 data module (`CIFAR10Info`, `_Augment`, `_Normalize`,
# `get_cifar10_train_val_loaders`, `get_cifar10_test_loader`; the index names
# no repository for it) as written: `grain.load(...)` over a Hugging Face
# split `with_format("numpy")` (here a small stand-in for `load_dataset`, with
# its `train_test_split(test_size=, seed=)`), with a `RandomMapTransform`
# flip-pad-crop and a `MapTransform` normalization.
CIFAR = r'''
import numpy as np
import grain.python as grain


class _Split:  # stand-in for a datasets.Dataset in numpy format
  def __init__(self, images, labels):
    self._images, self._labels = images, labels

  def __len__(self):
    return len(self._labels)

  def __getitem__(self, i):
    return {"img": self._images[i], "label": self._labels[i]}

  def train_test_split(self, test_size, seed):
    order = np.random.default_rng(seed).permutation(len(self))
    n_test = int(np.ceil(test_size * len(self)))
    test, train = order[:n_test], order[n_test:]
    return {"train": _Split(self._images[train], self._labels[train]),
            "test": _Split(self._images[test], self._labels[test])}


class _DatasetDict(dict):
  def with_format(self, fmt):
    assert fmt == "numpy"
    return self


def load_dataset(name):
  rng = np.random.default_rng(0)
  return _DatasetDict(
      train=_Split(rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 12)),
      test=_Split(rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 5)))


class CIFAR10Info:
    num_classes = 10
    shape = (1, 32, 32, 3)
    counts = {"train": 50000, "test": 10000}
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)


class _Augment(grain.RandomMapTransform):
    def random_map(self, element, rng):
        img = element["img"]
        if rng.random() > 0.5:
            img = np.fliplr(img)
        padded = np.pad(img, ((4, 4), (4, 4), (0, 0)), mode="reflect")
        y = rng.integers(0, 8)
        x = rng.integers(0, 8)
        img = padded[y : y + 32, x : x + 32]
        return {"image": img, "label": element["label"]}


class _Normalize(grain.MapTransform):
    def map(self, element):
        img = element.get("image", element.get("img"))
        img = img / 255.0
        img = (img - np.array(CIFAR10Info.mean)) / np.array(CIFAR10Info.std)
        label = element["label"]
        return {"image": img, "label": label}


def get_cifar10_train_val_loaders(
    train_batch_size: int,
    val_batch_size: int,
    num_epochs: int,
    seed: int,
    train_worker_count: int = 4,
    val_worker_count: int = 1,
    val_split: float = 0.1,
):
    ds = load_dataset("cifar10")
    ds = ds.with_format("numpy")

    if val_split > 0:
        split_dataset = ds["train"].train_test_split(test_size=val_split, seed=seed)
        train_ds = split_dataset["train"]
        val_ds = split_dataset["test"]
    else:
        train_ds = ds["train"]
        val_ds = None

    train_loader = grain.load(
        train_ds,
        num_epochs=num_epochs,
        shuffle=True,
        seed=seed,
        drop_remainder=True,
        batch_size=train_batch_size,
        worker_count=train_worker_count,
        transformations=[_Augment(), _Normalize()],
    )

    val_loader = None
    if val_ds is not None:
        val_loader = grain.load(
            val_ds,
            shuffle=False,
            num_epochs=1,
            batch_size=val_batch_size,
            worker_count=val_worker_count,
            transformations=[_Normalize()],
        )

    return train_loader, val_loader


def get_cifar10_test_loader(batch_size: int, worker_count: int = 4):
    ds = load_dataset("cifar10")
    ds = ds.with_format("numpy")

    test_ds = ds["test"]
    test_loader = grain.load(
        test_ds,
        shuffle=False,
        num_epochs=1,
        batch_size=batch_size,
        worker_count=worker_count,
        transformations=[_Normalize()],
    )

    return test_loader


def summary(batch):
  return {"image": [batch["image"].shape, str(batch["image"].dtype), np.round(batch["image"][:, :2, :2], 4).tolist(),
                    round(float(batch["image"].sum()), 3)],
          "label": [batch["label"].shape, str(batch["label"].dtype), batch["label"].tolist()]}


def plain_eq(a, b):
  return [summary(x) for x in a] == [summary(x) for x in b]


results = {}
train_loader, val_loader = get_cifar10_train_val_loaders(
    train_batch_size=4, val_batch_size=2, num_epochs=2, seed=5,
    train_worker_count=0, val_worker_count=0, val_split=0.25)
results["train"] = [summary(b) for b in train_loader]
results["val"] = [summary(b) for b in val_loader]
results["test"] = [summary(b) for b in get_cifar10_test_loader(batch_size=2, worker_count=0)]
no_val = get_cifar10_train_val_loaders(4, 2, 1, 5, 0, 0, val_split=0)
results["no_val"] = [len(list(no_val[0])), no_val[1]]
reference, checks = restore_at_every_step(lambda: train_loader)
results["restores"] = checks
it = iter(train_loader)
next(it)
results["state"] = it.get_state()
'''


def test_cifar10_grain_load_random_augment_and_resume_as_on_grain():
  """A CIFAR-10 data module over Hugging Face `datasets` (index: no repository named): `grain.load` with `_Augment` / `_Normalize`."""
  source = CIFAR.replace("results = {}\n", porting.RESTORE_AT_EVERY_STEP + "results = {}\n", 1)
  g, l = porting.run_both_grain_keys(source)
  g_state, l_state = (porting.grain_keys(json.loads(bytes(x.pop("state")))) for x in (g, l))
  assert l_state == g_state and g_state["data_source"] == "<_Split object>"
  assert g_state["last_seen_indices"] == {"0": 3}
  assert l == g
  assert len(g["train"]) == 4 and g["train"][0]["image"][:2] == [[4, 32, 32, 3], "float64"]
  assert g["train"][0]["label"][:2] == [[4], "int64"]
  assert [b["image"][0][0] for b in g["val"]] == [2, 1] and [b["image"][0][0] for b in g["test"]] == [2, 2, 1]
  assert g["no_val"] == [3, None]
  assert g["restores"] == [[True, True]] * 5


# A key-clustering data preparation script ("Copyright (C) 2026 Apple Inc.";
# the index names no repository for it) as written, its docstrings and the
# argparse parser shortened: `QueriesSource` (a `grain.sources.
# RandomAccessDataSource[np.ndarray]` over a memory-mapped .npy that calls
# `super().__init__()`), `AddNoise` (a `grain.experimental.FlatMapTransform`
# with its own `np.random.default_rng(seed)` drawn in `flat_map`), a
# `grain.transforms.Map` that runs a jitted JAX top-1 per cluster on each
# batch, `to_iter_dataset(read_options=grain.ReadOptions(num_threads=4,
# prefetch_buffer_size=4))`, `grain.experimental.FlatMapIterDataset`,
# `batch(drop_remainder=False)`, and `main` writing the train/test splits.
# OTT's k-means (not installed) is used only with more than one cluster; the
# test passes its own assignments to `_augment_pool` for two clusters.
KEY_CLUSTERS = r'''
import argparse
import functools
import os
import pathlib
import shutil
import tempfile

import grain
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

pointcloud = costs = k_means = None  # from ott.geometry / ott.tools (not installed)


def _get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input_path", type=str, required=True)
    parser.add_argument("--output_path", type=str, required=True)
    parser.add_argument("--num_noise_samples", type=int, default=0)
    parser.add_argument("--noise_std", type=float, default=0.02)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--test_size", type=int, default=16_384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_clusters", type=int, default=1)
    parser.add_argument("--max_iterations", type=int, default=300)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    return parser


def get_default_device() -> jax.Device:
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return jax.devices("cpu")[0]


def cluster_keys(
    keys: np.ndarray, args: argparse.Namespace
) -> tuple[np.ndarray, np.ndarray]:
    num_keys, _ = keys.shape
    assert num_keys >= args.num_clusters, (num_keys, args.num_clusters)

    if args.num_clusters == 1:
        print("num_clusters=1: skipping kmeans")
        assignments_np = np.zeros(num_keys, dtype=np.uint32)
        centroids_np = keys.mean(axis=0, keepdims=True)
        return centroids_np, assignments_np
    raise NotImplementedError("k-means with OTT is not part of this port")


class QueriesSource(grain.sources.RandomAccessDataSource[np.ndarray]):
    def __init__(self, path: str):
        super().__init__()
        self._path = path
        self._queries = np.load(path, mmap_mode="r")

    def __getitem__(self, index: int) -> np.ndarray:
        return np.asarray(self._queries[index])

    def __len__(self) -> int:
        return len(self._queries)


class AddNoise(grain.experimental.FlatMapTransform):
    """Expand each query into the clean query plus `num_noise_samples` noisy copies."""

    def __init__(self, num_noise_samples: int, *, noise_std: float, seed: int):
        assert num_noise_samples >= 0, num_noise_samples
        super().__init__()
        self._num_noise_samples = num_noise_samples
        self._noise_std = noise_std
        self._rng = np.random.default_rng(seed)

    def flat_map(self, query: np.ndarray) -> list[np.ndarray]:
        noises = self._rng.normal(
            0.0,
            self._noise_std,
            size=(self._num_noise_samples, *query.shape),
        ).astype(query.dtype)
        return [query] + [query + noise for noise in noises]


@jax.jit
def compute_top1(query: jax.Array, cluster_keys: jax.Array) -> jax.Array:
    scores = query @ cluster_keys.T
    return jnp.argmax(scores, axis=-1)


class PerClusterTop1(grain.transforms.Map):
    """L2-normalize the query, then compute per-cluster argmax and remap to global indices."""

    def __init__(
        self,
        keys: np.ndarray,
        assignments: np.ndarray,
        *,
        num_clusters: int,
    ):
        super().__init__()
        self._num_clusters = num_clusters
        self._device = get_default_device()
        self._cluster_keys: list[jax.Array] = []
        self._global_indices: list[np.ndarray] = []
        for cluster_id in range(num_clusters):
            mask = assignments == cluster_id
            cluster_keys = keys[mask]
            assert cluster_keys.shape[0] >= 1, (cluster_id, cluster_keys.shape)
            self._cluster_keys.append(jax.device_put(cluster_keys, self._device))
            self._global_indices.append(np.where(mask)[0].astype(np.uint32))

    def map(self, query: np.ndarray) -> dict[str, np.ndarray]:
        norms = np.linalg.norm(query, axis=-1, keepdims=True)
        norms[norms == 0] = 1e-10
        query = (query / norms).astype(np.float32, copy=False)
        query_jax = jax.device_put(query, self._device)

        top1_global = np.empty((query.shape[0], self._num_clusters), dtype=np.uint32)

        for cluster_id, (cluster_keys, global_indices) in enumerate(
            zip(self._cluster_keys, self._global_indices)
        ):
            top1_local = compute_top1(query_jax, cluster_keys)
            top1_local = jax.device_get(top1_local)
            top1_global[:, cluster_id] = global_indices[top1_local]

        return {
            "query": query,
            "topk_indices": top1_global,
        }


def build_dataloader(
    queries_path: str,
    *,
    keys: np.ndarray,
    assignments: np.ndarray,
    num_clusters: int,
    num_noise_samples: int,
    noise_std: float,
    batch_size: int,
    seed: int,
    read_threads: int = 4,
    prefetch_buffer_size: int = 4,
) -> tuple[grain.IterDataset, tuple[int, int]]:
    source = QueriesSource(queries_path)
    shape = (len(source), *source[0].shape)

    ds = grain.MapDataset.source(source)
    ds = ds.to_iter_dataset(
        read_options=grain.ReadOptions(
            num_threads=read_threads, prefetch_buffer_size=prefetch_buffer_size
        )
    )
    if num_noise_samples > 0:
        ds = grain.experimental.FlatMapIterDataset(
            ds,
            AddNoise(
                num_noise_samples,
                noise_std=noise_std,
                seed=seed,
            ),
        )
    ds = ds.batch(batch_size, drop_remainder=False)
    ds = ds.map(
        PerClusterTop1(
            keys,
            assignments,
            num_clusters=num_clusters,
        )
    )
    return ds, shape


def _augment_pool(
    args: argparse.Namespace,
    *,
    keys: np.ndarray,
    assignments: np.ndarray,
    pool_dir: pathlib.Path,
) -> tuple[int, int]:
    queries_path = os.path.join(args.input_path, "queries.npy")
    ds, (num_queries, dim) = build_dataloader(
        queries_path,
        keys=keys,
        assignments=assignments,
        num_clusters=args.num_clusters,
        num_noise_samples=args.num_noise_samples,
        noise_std=args.noise_std,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    num_total = num_queries * (args.num_noise_samples + 1)
    q_out = np.lib.format.open_memmap(
        pool_dir / "queries.npy", mode="w+", dtype=np.float32, shape=(num_total, dim)
    )
    i_out = np.lib.format.open_memmap(
        pool_dir / "topk_indices.npy",
        mode="w+",
        dtype=np.uint32,
        shape=(num_total, args.num_clusters),
    )
    offset = 0
    for record in tqdm.tqdm(ds, total=max(num_total // args.batch_size, 1)):
        bs = len(record["query"])
        q_out[offset : offset + bs] = record["query"]
        i_out[offset : offset + bs] = record["topk_indices"]
        offset += bs
    assert offset == num_total, (offset, num_total)
    q_out.flush()
    i_out.flush()
    return num_total, dim


def _write_split(
    split: str,
    idx: np.ndarray,
    *,
    pool_dir: pathlib.Path,
    out_dir: pathlib.Path,
    dim: int,
    num_clusters: int,
    chunk: int = 1_000_000,
) -> None:
    idx = np.sort(idx)
    pool_q = np.load(pool_dir / "queries.npy", mmap_mode="r")
    pool_i = np.load(pool_dir / "topk_indices.npy", mmap_mode="r")
    sdir = out_dir / split
    sdir.mkdir(parents=True, exist_ok=True)
    q_out = np.lib.format.open_memmap(
        sdir / "queries.npy", mode="w+", dtype=np.float32, shape=(len(idx), dim)
    )
    i_out = np.lib.format.open_memmap(
        sdir / "topk_indices.npy",
        mode="w+",
        dtype=np.uint32,
        shape=(len(idx), num_clusters),
    )
    for s in tqdm.tqdm(range(0, len(idx), chunk), desc=f"write {split}"):
        c = idx[s : s + chunk]
        q_out[s : s + len(c)] = pool_q[c]
        i_out[s : s + len(c)] = pool_i[c]
    q_out.flush()
    i_out.flush()


def main(args: argparse.Namespace) -> None:
    out_dir = pathlib.Path(args.output_path)
    out_dir.mkdir(parents=True, exist_ok=True)

    shutil.copy(pathlib.Path(args.input_path) / "keys.npy", out_dir / "keys.npy")
    keys = np.load(out_dir / "keys.npy")

    centroids, assignments = cluster_keys(keys, args)
    np.save(out_dir / "cluster_assignments.npy", assignments)
    np.save(out_dir / "centroids.npy", centroids)

    with tempfile.TemporaryDirectory() as tmp_dir:
        pool_dir = pathlib.Path(tmp_dir)
        num_total, dim = _augment_pool(
            args, keys=keys, assignments=assignments, pool_dir=pool_dir
        )
        perm = np.random.default_rng(args.seed).permutation(num_total)
        test_size = min(args.test_size, num_total)

        _write_split(
            "test",
            perm[:test_size],
            pool_dir=pool_dir,
            out_dir=out_dir,
            dim=dim,
            num_clusters=args.num_clusters,
        )
        _write_split(
            "train",
            perm[test_size:],
            pool_dir=pool_dir,
            out_dir=out_dir,
            dim=dim,
            num_clusters=args.num_clusters,
        )


# The script run twice (one cluster, by `main`; two, through `_augment_pool`).
results = {}
out = pathlib.Path(OUT)
main(_get_parser().parse_args(["--input_path", INPUT, "--output_path", str(out / "one"), "--num_noise_samples", "2",
                               "--batch_size", "4", "--test_size", "5", "--seed", "3"]))
for split in ("train", "test"):
  for name in ("queries", "topk_indices"):
    a = np.load(out / "one" / split / f"{name}.npy")
    results[f"{split}/{name}"] = [a.shape, str(a.dtype), np.round(a, 5).tolist()]
args = _get_parser().parse_args(["--input_path", INPUT, "--output_path", "", "--num_noise_samples", "1",
                                 "--batch_size", "3", "--seed", "1", "--num_clusters", "2"])
keys = np.load(os.path.join(INPUT, "keys.npy"))
pool = out / "two"
pool.mkdir(parents=True)
results["two"] = _augment_pool(args, keys=keys, assignments=np.arange(len(keys)) % 2, pool_dir=pool)
results["two_topk"] = np.load(pool / "topk_indices.npy").tolist()
ds, shape = build_dataloader(os.path.join(INPUT, "queries.npy"), keys=keys, assignments=np.zeros(len(keys), int),
                             num_clusters=1, num_noise_samples=1, noise_std=0.1, batch_size=4, seed=0)
it = iter(ds)
first = next(it)
results["batch_keys"] = sorted(first)
results["shape"] = shape
'''


def test_key_clustering_flat_map_noise_and_jitted_top1_as_on_grain(tmp_path, capsys):
  """A key-clustering preparation script (Apple; index: no repository named): AddNoise FlatMapIterDataset, jitted top-1 `grain.transforms.Map`."""
  rng = np.random.default_rng(2)
  data = tmp_path / "in"
  data.mkdir()
  np.save(data / "keys.npy", rng.normal(size=(6, 4)).astype(np.float32))
  np.save(data / "queries.npy", rng.normal(size=(5, 4)).astype(np.float32))
  g = porting.run(KEY_CLUSTERS, "grain", INPUT=str(data), OUT=str(tmp_path / "g")).results
  l = porting.run(KEY_CLUSTERS, "loader", INPUT=str(data), OUT=str(tmp_path / "l")).results
  g, l = porting.plain(g), porting.plain(l)
  assert l == g
  assert g["train/queries"][:2] == [[10, 4], "float32"] and g["test/topk_indices"][:2] == [[5, 1], "uint32"]
  assert g["two"] == [10, 4] and len(g["two_topk"]) == 10
  assert all(row[0] % 2 == 0 and row[1] % 2 == 1 for row in g["two_topk"])
  assert g["batch_keys"] == ["query", "topk_indices"] and g["shape"] == [5, 4]
  assert capsys.readouterr().out.count("num_clusters=1: skipping kmeans") == 2


# Two trainers' Orbax checkpointing of Grain iterators: the index's version
# of p-doom/omegalax's omegalax/trainers/checkpoint_utils.py (an SFT
# checkpoint module; the mirrored repository's newest has the same helpers
# with `type GrainIterator = grain.DataLoaderIterator`) with
# `GrainIterator: TypeAlias = grain.DataLoaderIterator | grain.
# DatasetIterator`, `register_grain_iterator_handler` adding the class
# `grain.checkpoint.CheckpointHandler` to an
# `ocp.handlers.DefaultCheckpointHandlerRegistry` for both argument classes,
# and `make_grain_save_args` / `make_grain_restore_args` /
# `restored_input_iter`, as written; and a decoder-only trainer's (the index
# names no repository for it)
# `checkpoint` / `restore`, which save one `grain.checkpoint.CheckpointSave`
# per split (`data_iterator_train`, `data_iterator_valid`) beside the model
# and an `ocp.args.JsonSave(step)`, with the sampler's seed drawn from a JAX
# key as its `__main__` does. Flax NNX is not installed: `nnx.state` /
# `nnx.update` are stand-ins over dicts of arrays.
CHECKPOINTS = r'''
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, TypeAlias, cast

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax import checkpoint as ocp

GrainIterator: TypeAlias = grain.DataLoaderIterator | grain.DatasetIterator


def register_grain_iterator_handler(
    handler_registry: ocp.handlers.DefaultCheckpointHandlerRegistry,
) -> None:
    handler_registry.add(
        "input_iter",
        grain.checkpoint.CheckpointSave,
        cast(ocp.handlers.CheckpointHandler, grain.checkpoint.CheckpointHandler),
    )
    handler_registry.add(
        "input_iter",
        grain.checkpoint.CheckpointRestore,
        cast(ocp.handlers.CheckpointHandler, grain.checkpoint.CheckpointHandler),
    )


def make_grain_save_args(train_state: Any, input_iter: GrainIterator) -> ocp.args.Composite:
    items: dict[str, Any] = {
        "train_state": ocp.args.PyTreeSave(train_state),
        "input_iter": grain.checkpoint.CheckpointSave(input_iter),
    }
    return ocp.args.Composite(**items)


def make_grain_restore_args(
    abstract_train_state: Any, input_iter: GrainIterator
) -> ocp.args.Composite:
    items: dict[str, Any] = {
        "train_state": ocp.args.PyTreeRestore(abstract_train_state),
        "input_iter": grain.checkpoint.CheckpointRestore(input_iter),
    }
    return ocp.args.Composite(**items)


def restored_input_iter(restored: Any) -> GrainIterator:
    return restored["input_iter"]


class nnx:  # stand-in: a "module" is a dict of arrays
    state = staticmethod(dict)

    @staticmethod
    def update(node, state):
        node.update({k: np.asarray(v) for k, v in state.items()})


# The decoder-only trainer's checkpoint()/restore() as written.
def checkpoint(
    checkpoint_manager: ocp.CheckpointManager,
    step: int,
    model,
    optimizer,
    data_iterators: dict[str, grain.DataLoaderIterator],
    rngs,
) -> None:
    flax_nodes = {"model": model, "optimizer": optimizer, "rngs": rngs}
    flax_args = {
        key: ocp.args.PyTreeSave(nnx.state(value))
        for key, value in flax_nodes.items()
    }
    checkpoint_manager.save(
        step,
        args=ocp.args.Composite(
            **{
                f"data_iterator_{split}": grain.checkpoint.CheckpointSave(
                    iterator
                )
                for split, iterator in data_iterators.items()
            },
            **flax_args,
            step=ocp.args.JsonSave(step),
        ),
    )


def restore(
    checkpoint_manager: ocp.CheckpointManager,
    step: int | None,
    model,
    optimizer,
    data_iterators: dict[str, grain.DataLoaderIterator],
    rngs,
) -> int:
    flax_nodes = {"model": model, "optimizer": optimizer, "rngs": rngs}
    flax_states = {key: nnx.state(value) for key, value in flax_nodes.items()}
    restored = checkpoint_manager.restore(
        step,
        args=ocp.args.Composite(
            **{
                f"data_iterator_{split}": grain.checkpoint.CheckpointRestore(
                    iterator
                )
                for split, iterator in data_iterators.items()
            },
            **{
                key: ocp.args.PyTreeRestore(
                    abstract_state
                )
                for key, abstract_state in flax_states.items()
            },
            step=ocp.args.JsonRestore(),
        ),
    )
    for key, value in flax_nodes.items():
        nnx.update(value, restored[key])

    return restored["step"]


def create_data_loader(split, source, seed):  # the experiment's (not in the index), shrunk
    return grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(len(source), shuffle=True, seed=seed, num_epochs=None,
                                            shard_options=grain.sharding.NoSharding()),
        operations=[grain.transforms.Batch(2 if split == "train" else 3, drop_remainder=True)],
        worker_count=0)


results = {}
root = pathlib.Path(OUT)

# The SFT module: a DatasetIterator saved at every step, each restored into a fresh one.
def make_iter():
    return iter(grain.MapDataset.range(9).shuffle(seed=4).map(lambda x: {"x": np.int32(x) * 3})
                .batch(2).to_iter_dataset())

registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
register_grain_iterator_handler(registry)
it = make_iter()
results["is_grain_iterator"] = isinstance(it, GrainIterator)
train_state = {"w": np.zeros(3, np.float32)}
reference = []
with ocp.CheckpointManager(root / "sft", handler_registry=registry) as mngr:
    for step in range(6):
        train_state = {"w": train_state["w"] + 1}
        mngr.save(step, args=make_grain_save_args(train_state, it))
        mngr.wait_until_finished()
        try:
            reference.append(next(it)["x"].tolist())
        except StopIteration:
            reference.append(None)
    resumed = []
    for step in range(6):
        restored = mngr.restore(step, args=make_grain_restore_args({"w": np.zeros(3, np.float32)}, make_iter()))
        rest = [b["x"].tolist() for b in restored_input_iter(restored)]
        resumed.append([restored["train_state"]["w"].tolist(), rest == [r for r in reference[step:] if r is not None]])
results["sft_reference"] = reference
results["sft_resumed"] = resumed

# The decoder-only trainer: per-split iterators, seeds from a JAX key.
rng = np.random.default_rng(0)
data_sources = {"train": list(rng.integers(0, 100, (7, 2))), "valid": list(rng.integers(0, 100, (5, 2)))}
keys = dict(zip(["params", "index_sampler"], jax.random.split(jax.random.key(0), 2)))


def make_iterators():
    loaders = {
        split: create_data_loader(
            split, data_source,
            seed=int(jax.random.randint(keys["index_sampler"], (), 0, 2**31 - 1)))
        for split, data_source in data_sources.items()
    }
    return {key: iter(value) for key, value in loaders.items()}


model, optimizer, rngs = {"kernel": np.ones((2, 2), np.float32)}, {"mu": np.zeros(2, np.float32)}, {"count": np.int64(0)}
data_iterators = make_iterators()
results["is_data_loader_iterator"] = isinstance(data_iterators["train"], grain.DataLoaderIterator)
seen = []
with ocp.CheckpointManager(root / "dec") as checkpoint_manager:
    for step in range(5):
        inputs = next(data_iterators["train"])
        if step % 2 == 0:
            valid = next(data_iterators["valid"])
            seen.append(["valid", valid.tolist()])
        seen.append(["train", inputs.tolist()])
        model["kernel"] = model["kernel"] + inputs.sum()
        if step == 2:
            checkpoint(checkpoint_manager, model=model, optimizer=optimizer, data_iterators=data_iterators,
                       rngs=rngs, step=step)
            checkpoint_manager.wait_until_finished()
            after = [next(data_iterators["train"]).tolist() for _ in range(4)]
            after_valid = next(data_iterators["valid"]).tolist()
    results["dec_seen"] = seen
    fresh_model = {"kernel": np.zeros((2, 2), np.float32)}
    fresh_iterators = make_iterators()
    restored_step = restore(checkpoint_manager, step=None, model=fresh_model, optimizer={"mu": np.ones(2, np.float32)},
                            data_iterators=fresh_iterators, rngs={"count": np.int64(5)})
    results["dec_restored_step"] = restored_step
    results["dec_model"] = fresh_model["kernel"].tolist()
    results["dec_resume"] = [[next(fresh_iterators["train"]).tolist() for _ in range(4)] == after,
                             next(fresh_iterators["valid"]).tolist() == after_valid]
    results["dec_files"] = sorted(p.name for p in (root / "dec" / "2").iterdir())
'''


def test_orbax_registry_handler_class_and_per_split_iterator_checkpoints_as_on_grain(tmp_path):
  """Orbax checkpointing of Grain iterators: p-doom/omegalax's checkpoint_utils.py (index version: handler registry, `GrainIterator` alias) and a decoder-only trainer's per-split `CheckpointSave` / `CheckpointRestore` (no repository named)."""
  g = porting.plain(porting.run(CHECKPOINTS, "grain", OUT=str(tmp_path / "g")).results)
  l = porting.plain(porting.run(CHECKPOINTS, "loader", OUT=str(tmp_path / "l")).results)
  assert l == g
  assert g["is_grain_iterator"] and g["is_data_loader_iterator"]
  assert [r is None for r in g["sft_reference"]] == [False] * 5 + [True]
  assert g["sft_resumed"] == [[[k + 1.0] * 3, True] for k in range(6)]
  assert g["dec_restored_step"] == 2 and g["dec_resume"] == [True, True]
  assert {"data_iterator_train", "data_iterator_valid", "model", "optimizer", "rngs", "step"} <= set(g["dec_files"])


# A raster tile pretraining loader (`get_dataloader`, `load_valid_centres`,
# `RandomSample`, `Augmentation`, `RandomMask`; the index names no repository
# for it) as written: `grain.sources.RangeDataSource(0, n, 1)`, an
# `IndexSampler` with `num_epochs=None, shuffle=False, seed=` and no
# `shard_options`, three `grain.transforms.RandomMap` subclasses (the first
# picks a tile by probability and reads a window, the last returns an
# `(image, mask)` tuple), `grain.transforms.Batch(drop_remainder=True)`, and
# on Windows with workers `loader._dataset = grain.experimental.
# WithOptionsIterDataset(loader._dataset, grain.experimental.DatasetOptions(
# min_shm_size=sys.maxsize))`. rasterio is a small stand-in reading .npy tiles.
TILES = r'''
import grain
import numpy as np
import json
import functools
from tqdm import tqdm
import sys


class rasterio:  # stand-in: a tile is a (bands, rows, cols) .npy array
  class windows:
    class Window:
      def __init__(self, col_off, row_off, width, height):
        self.col_off, self.row_off, self.width, self.height = col_off, row_off, width, height

  class _Dataset:
    def __init__(self, path):
      self._array = np.load(path)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

    def read(self, window, out_dtype):
      w = window
      return self._array[:, w.row_off:w.row_off + w.height, w.col_off:w.col_off + w.width].astype(out_dtype)

  @staticmethod
  def open(path):
    return rasterio._Dataset(path)


def get_dataloader(
    manifest_path,
    subset,
    sample_size=512,
    mask_patch_size=32,
    masking_rate=0.6,
    batch_size=16,
    worker_count=8,
    worker_buffer_size=1,
    name=None,
    rng_seed=42,
):
    with open(manifest_path, "r") as src:
        manifest = json.load(src)
    tile_info = manifest[subset]

    source = grain.sources.RangeDataSource(0, len(tile_info), 1)
    sampler = grain.samplers.IndexSampler(
        num_records=len(tile_info),
        num_epochs=None,
        shuffle=False,
        seed=rng_seed,
    )
    random_sample = RandomSample(tile_info, sample_size=sample_size, name=name)
    augmentation = Augmentation()
    random_mask = RandomMask(patch_size=mask_patch_size, rate=masking_rate)

    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[
            random_sample,
            augmentation,
            random_mask,
            grain.transforms.Batch(batch_size=batch_size, drop_remainder=True),
        ],
        worker_count=worker_count,
        worker_buffer_size=worker_buffer_size,
    )

    if sys.platform == "win32" and worker_count > 0:
        loader._dataset = grain.experimental.WithOptionsIterDataset(
            loader._dataset,
            grain.experimental.DatasetOptions(
                min_shm_size=sys.maxsize,
            ),
        )

    return loader


@functools.lru_cache(maxsize=64)
def load_valid_centres(npy_path):
    return np.load(npy_path, mmap_mode="r")


class RandomSample(grain.transforms.RandomMap):
    def __init__(self, tile_info, sample_size, name=None):
        self.name = name
        self.sample_size = sample_size
        self.tiles = []
        counts = []

        for tile in tqdm(tile_info, desc=f"{f'{self.name}:' if self.name is not None else ''} Counting data..."):
            centres = load_valid_centres(tile["index_path"])
            count = len(centres)
            if count > 0:
                self.tiles.append(tile)
                counts.append(count)

        weights = np.asarray(counts, dtype=np.float32)
        self.probs = weights / weights.sum()

    def random_map(self, sample_id, rng):
        tile_id = rng.choice(len(self.tiles), p=self.probs)
        tile = self.tiles[tile_id]

        centres = load_valid_centres(tile["index_path"])
        row, col = centres[rng.integers(len(centres))]

        with rasterio.open(tile["tile_path"]) as src:
            window = rasterio.windows.Window(
                col - self.sample_size // 2,
                row - self.sample_size // 2,
                self.sample_size,
                self.sample_size,
            )
            sample = src.read(window=window, out_dtype=np.float32)
            sample /= 255.0

        return np.ascontiguousarray(sample)


class Augmentation(grain.transforms.RandomMap):
    def __init__(
        self,
        flip_p=0.5,
        intensity_p=0.8,
        gain_range=(0.9, 1.1),
        brightness_range=(-0.05, 0.05),
        gamma_p=0.5,
        gamma_range=(0.8, 1.25),
    ):
        self.flip_p = flip_p
        self.intensity_p = intensity_p
        self.gain_range = gain_range
        self.brightness_range = brightness_range
        self.gamma_p = gamma_p
        self.gamma_range = gamma_range

    def random_map(self, image, rng):
        # rotation
        k = rng.integers(4)
        if k > 0:
            image = np.rot90(image, k=k, axes=(1, 2))

        # reflection
        if rng.uniform() < 0.5:
            image = np.flip(image, axis=1)

        # linear intensity augmentation
        if rng.random() < self.flip_p:
            gain = np.float32(rng.uniform(*self.gain_range))
            brightness = np.float32(rng.uniform(*self.brightness_range))
            image *= gain
            image += brightness
            np.clip(image, 0.0, 1.0, out=image)

        # gamma transform
        if rng.random() < self.gamma_p:
            log_gamma = rng.uniform(
                np.log(self.gamma_range[0]),
                np.log(self.gamma_range[1]),
            )
            gamma = np.float32(np.exp(log_gamma))
            np.power(image, gamma, out=image)

        return image


class RandomMask(grain.transforms.RandomMap):
    def __init__(self, patch_size, rate):
        self.patch_size = patch_size
        self.rate = rate

    def random_map(self, image, rng):
        _, h, w = image.shape
        mask_size = (1, h // self.patch_size, w // self.patch_size)
        mask = rng.uniform(size=mask_size)
        mask = (mask < self.rate).astype(np.uint8)
        mask = np.repeat(
            np.repeat(mask, self.patch_size, axis=1),
            self.patch_size, axis=2,
        )
        return image, mask


# The client's __main__ loop, shrunk: batches, `zip(*batch)`, and resumes.
def summary(batch):
    images, masks = batch
    return [type(batch).__name__, images.shape, str(images.dtype), np.round(images, 5).tolist(),
            masks.shape, str(masks.dtype), masks.tolist(), len(list(zip(*batch)))]


def run(worker_count, steps):
    loader = get_dataloader(MANIFEST, "train", sample_size=8, mask_patch_size=4, batch_size=3,
                            worker_count=worker_count, name="Train dataloader")
    it = iter(loader)
    states, batches = [], []
    for i, batch in enumerate(it):
        states.append(it.get_state())
        batches.append(summary(batch))
        if i >= steps:
            break
    return loader, states, batches


results = {}
loader, states, batches = run(WORKERS, 5)
results["batches"] = batches
results["dataset"] = [isinstance(loader._dataset, grain.IterDataset),
                     isinstance(loader._dataset, grain.experimental.WithOptionsIterDataset)]
resumed = []
for k in range(0, 5, 2 if WORKERS else 1):
    it = iter(loader)
    it.set_state(states[k])
    resumed.append([summary(next(it)) for _ in range(5 - k)] == batches[k + 1:])
results["resumed"] = resumed
'''


def _tiles(directory):
  rng = np.random.default_rng(4)
  tiles = []
  for t, n in enumerate((3, 0, 5)):
    tile, index = os.path.join(directory, f"tile{t}.npy"), os.path.join(directory, f"index{t}.npy")
    np.save(tile, rng.integers(0, 256, (1, 24, 24), dtype=np.uint8))
    np.save(index, rng.integers(4, 20, (n, 2)))
    tiles.append({"tile_path": tile, "index_path": index})
  manifest = os.path.join(directory, "manifest.json")
  with open(manifest, "w", encoding="utf-8") as f:
    json.dump({"train": tiles}, f)
  return manifest


def test_raster_tiles_random_maps_tuple_batches_and_resume_as_on_grain(tmp_path):
  """A raster tile pretraining loader (index: no repository named): RangeDataSource, three `grain.transforms.RandomMap`s, tuple batches."""
  manifest = _tiles(tmp_path)
  g, l = (porting.grain_keys(x.results) for x in porting.run_both(TILES, MANIFEST=manifest, WORKERS=0))
  assert l == g
  assert g["resumed"] == [True] * 5 and len(g["batches"]) == 6
  first = g["batches"][0]
  assert first[0] == "tuple" and first[1:3] == [[3, 1, 8, 8], "float32"] and first[4:6] == [[3, 1, 8, 8], "uint8"]
  assert first[7] == 3
  assert g["dataset"] == [True, False]


def test_raster_tiles_windows_branch_with_workers_as_on_grain(tmp_path):
  """The raster tile loader as a script on "win32" with two workers: its `loader._dataset = WithOptionsIterDataset(loader._dataset, ...)` branch."""
  manifest = _tiles(tmp_path)
  in_process = porting.grain_keys(porting.run(TILES, "grain", MANIFEST=manifest, WORKERS=0).results)
  defs, usage = TILES.split("results = {}\n")
  script = (defs + "\nif __name__ == '__main__':\n"
            "  import absl.flags\n"
            "  absl.flags.FLAGS.mark_as_parsed()\n"
            f"  MANIFEST, WORKERS = {manifest!r}, 2\n"
            "  _get_dataloader, _platform = get_dataloader, sys.platform\n"
            "  def get_dataloader(*args, **kwargs):  # built as on Windows, run here\n"
            "    sys.platform = 'win32'\n"
            "    try:\n"
            "      return _get_dataloader(*args, **kwargs)\n"
            "    finally:\n"
            "      sys.platform = _platform\n"
            "  results = {}\n"
            + "".join(f"  {line}\n" for line in usage.strip().splitlines())
            + "  print(json.dumps(results))\n")
  g = porting.grain_keys(porting.run_script(script, "grain", tmp_path))
  l = porting.grain_keys(porting.run_script(script, "loader", tmp_path))
  assert g["dataset"] == l["dataset"] == [True, True]
  assert g["resumed"] == l["resumed"] == [True] * 3
  # README (`DataLoader`, "one stream whatever worker_count"): loader's
  # batches with workers are the batches without; Grain's two workers batch
  # records 0, 2, 4 | 1, 3, 5 | 6, 8, 10 | ... (the same records regrouped).
  assert l["batches"] == in_process["batches"] != g["batches"]

  def rows(batches):
    return sorted(json.dumps([b[3][i], b[6][i]]) for b in batches for i in range(3))

  assert rows(g["batches"][:6]) == rows(in_process["batches"][:6])


# A Grain DataLoader script with mistakes (the index names no repository for
# it), as written apart from the steps after each failure: `class
# Source(grain.Dataloader)` (no such name), `shard_options=grain.sharding.
# NoSharding` (the class, not an instance) and a stray `grain.sample`. Each
# step's error is what the port must give.
MISTAKES = r'''
import grain
from grain.samplers import IndexSampler
from grain.transforms import Batch

results = {}
try:
    class Source(grain.Dataloader):
        def __init__(self, num_samples):
            self.num_samples = num_samples

        def __len__(self):
            return self.num_samples

        def __getitem__(self, index):
            return index
except AttributeError as e:
    results["base"] = ["AttributeError", str(e)]

    class Source:  # what it meant
        def __init__(self, num_samples):
            self.num_samples = num_samples

        def __len__(self):
            return self.num_samples

        def __getitem__(self, index):
            return index


source = Source(10)
try:
    index_sampler = IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding,
        shuffle=True,
        num_epochs=1,
        seed=42,
    )
    data_loader = grain.DataLoader(
        data_source=source,
        sampler=index_sampler,
        operations=[Batch(batch_size=2, drop_remainder=True)],
        worker_count=0,
    )
    results["batches"] = [b.tolist() for b in data_loader]
except Exception as e:
    results["sharding"] = [type(e).__name__, str(e)]
try:
    grain.sample
except AttributeError as e:
    results["sample"] = ["AttributeError", str(e)]
index_sampler = IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(), shuffle=True,
                             num_epochs=1, seed=42)
data_loader = grain.DataLoader(data_source=source, sampler=index_sampler,
                               operations=[Batch(batch_size=2, drop_remainder=True)], worker_count=0)
results["fixed"] = [b.tolist() for b in data_loader]
'''


def test_data_loader_script_mistakes_raise_as_on_grain():
  """A DataLoader script with mistakes (index: no repository named): `grain.Dataloader`, a `NoSharding` class as `shard_options`, `grain.sample`."""
  g, l = (x.results for x in porting.run_both(MISTAKES))
  assert l["base"] == ["AttributeError", "module 'loader' has no attribute 'Dataloader'"]
  assert g["base"] == ["AttributeError", "module 'grain' has no attribute 'Dataloader'"]
  assert l["sample"] == ["AttributeError", "module 'loader' has no attribute 'sample'"]
  assert g["sample"] == ["AttributeError", "module 'grain' has no attribute 'sample'"]
  assert l["sharding"] == g["sharding"] == ["AttributeError", "type object 'NoSharding' has no attribute 'shard_count'"]
  assert "batches" not in g and l["fixed"] == g["fixed"] and len(g["fixed"]) == 5


# p-doom/omegalax: omegalax/data/grain_pipeline.py as written at b4b0544
# ("feature: configurable multi-source data mixing for SFT"): JSONL sessions
# compiled to ArrayRecord payload shards with its own `ArrayRecordWriter`
# code, a chunk index built by reading them back through
# `grain.sources.ArrayRecordDataSource`, and `make_grain_iterator`: one
# `MapDataset.source(ArrayRecordDataSource(shards))` per `MixSource`, sliced
# per data-parallel rank, `shuffle(seed=seed + i)`, `repeat(num_epochs)`,
# three `grain.transforms.Map`s (JSON, a resolver that opens the payload
# source lazily, a source tag), `grain.MapDataset.mix(..., weights=)` (zero
# weights dropped), `batch(drop_remainder=True, batch_fn=` a tagging
# collator`)`, `to_iter_dataset(read_options)`, and `mp_prefetch` only with
# workers. `omegalax.distributed.mesh` (imported inside the functions) is
# put in `sys.modules` with its two functions as written.
OMEGALAX_PIPELINE = r'''"""Grain-backed SFT dataset compilation, chunk indexing, and iteration helpers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from array_record.python.array_record_module import ArrayRecordWriter
import grain
import jax
import numpy as np

COMPILED_DATASET_VERSION = 1
COMPILED_METADATA_FILENAME = "metadata.json"
ARRAY_RECORD_SUFFIX = ".array_record"

SOURCE_ID_KEY = "_omegalax_source_id"
BATCH_SOURCE_IDS_KEY = "source_ids"


@dataclass(frozen=True)
class MixSource:
    """One dataset in a (potentially mixed) training corpus.

    ``path`` is a compiled chunk-index dataset directory (with metadata.json
    pointing at the payload). ``weight`` is unnormalized — relative weights
    across sources determine the realized example mix (see
    ``grain.MapDataset.mix``).
    """

    path: str | Path
    weight: float = 1.0


def _prepare_output_dir(out_dir: Path, *, overwrite: bool) -> None:
    if out_dir.exists():
        has_contents = any(out_dir.iterdir())
        if has_contents and not overwrite:
            raise ValueError(f"Refusing to overwrite non-empty output directory: {out_dir}")
        if has_contents and overwrite:
            shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def _write_arrayrecord_dataset(
    records: Iterable[dict[str, Any]],
    out_dir: Path,
    *,
    records_per_shard: int,
    overwrite: bool,
    metadata: dict[str, Any],
) -> Path:
    if records_per_shard <= 0:
        raise ValueError("records_per_shard must be > 0")

    _prepare_output_dir(out_dir, overwrite=overwrite)

    shard_paths: list[str] = []
    records_in_shard = 0
    total_records = 0
    shard_idx = 0

    def _open_writer(next_idx: int) -> ArrayRecordWriter:
        shard_path = out_dir / f"part-{next_idx:05d}.array_record"
        shard_paths.append(shard_path.name)
        return ArrayRecordWriter(str(shard_path), "group_size:1")

    records_iter = iter(records)
    try:
        first_record = next(records_iter)
    except StopIteration:
        raise ValueError("No records were written") from None

    writer = _open_writer(shard_idx)
    try:
        for record in chain((first_record,), records_iter):
            if records_in_shard >= records_per_shard:
                writer.close()
                shard_idx += 1
                writer = _open_writer(shard_idx)
                records_in_shard = 0

            payload = json.dumps(record, sort_keys=True).encode("utf-8")
            writer.write(payload)
            records_in_shard += 1
            total_records += 1
    finally:
        writer.close()

    final_metadata = dict(metadata)
    final_metadata.update(
        {
            "version": COMPILED_DATASET_VERSION,
            "num_records": total_records,
            "num_shards": len(shard_paths),
            "shard_paths": shard_paths,
        }
    )
    (out_dir / COMPILED_METADATA_FILENAME).write_text(json.dumps(final_metadata, indent=2) + "\n")
    return out_dir

def _make_payload_block_record(
    *,
    session_id: str,
    source_line: int,
    block_idx: int,
    message_start: int,
    messages: list[dict[str, Any]],
    session_meta: dict[str, Any],
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "source_line": source_line,
        "block_idx": block_idx,
        "message_start": message_start,
        "message_end": message_start + len(messages),
        "session_meta": session_meta,
        "messages": messages,
    }


def _build_session_id(path: Path, line_num: int) -> str:
    return f"{path.stem}-{line_num:09d}"


def _iter_jsonl_message_blocks(
    path: Path,
    *,
    messages_per_record: int,
):
    with path.open() as f:
        for line_num, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            raw = json.loads(line)
            messages = raw["messages"]
            assert isinstance(messages, list), f"Expected 'messages' to be a list at {path}:{line_num}"

            session_id = _build_session_id(path, line_num)
            session_meta = {k: v for k, v in raw.items() if k not in {"messages", "session_id"}}

            block_messages: list[dict[str, Any]] = []
            block_start = 0
            block_idx = 0
            for msg_idx, message in enumerate(messages):
                candidate_messages = block_messages + [message]
                would_exceed_count = len(candidate_messages) > messages_per_record
                if block_messages and would_exceed_count:
                    yield _make_payload_block_record(
                        session_id=session_id,
                        source_line=line_num,
                        block_idx=block_idx,
                        message_start=block_start,
                        messages=block_messages,
                        session_meta=session_meta,
                    )
                    block_idx += 1
                    block_start = msg_idx
                    block_messages = [message]
                else:
                    block_messages = candidate_messages

            if block_messages:
                yield _make_payload_block_record(
                    session_id=session_id,
                    source_line=line_num,
                    block_idx=block_idx,
                    message_start=block_start,
                    messages=block_messages,
                    session_meta=session_meta,
                )


def compile_jsonl_to_arrayrecord(
    src_path: str | Path,
    out_dir: str | Path,
    *,
    messages_per_record: int = 128,
    records_per_shard: int = 10_000,
    overwrite: bool = False,
) -> Path:
    """Compile raw JSONL sessions into canonical message-block ArrayRecord shards.

    Session ids are always synthesized from the source filename and line number.
    """

    if messages_per_record <= 0:
        raise ValueError("messages_per_record must be > 0")

    src_path = Path(src_path).expanduser().resolve()
    out_dir = Path(out_dir).expanduser().resolve()

    num_sessions = 0
    with src_path.open() as f:
        for line in f:
            if line.strip():
                num_sessions += 1

    records = _iter_jsonl_message_blocks(
        src_path,
        messages_per_record=messages_per_record,
    )
    return _write_arrayrecord_dataset(
        records,
        out_dir,
        records_per_shard=records_per_shard,
        overwrite=overwrite,
        metadata={
            "source_path": str(src_path),
            "messages_per_record": messages_per_record,
            "num_sessions": num_sessions,
        },
    )


def resolve_arrayrecord_paths(path: str | Path) -> list[Path]:
    path = Path(path).expanduser().resolve()
    if path.is_file():
        if path.suffix != ARRAY_RECORD_SUFFIX:
            raise ValueError(
                f"Expected a compiled Grain shard ({ARRAY_RECORD_SUFFIX}) or dataset directory, got file: {path}"
            )
        return [path]
    metadata_path = path / COMPILED_METADATA_FILENAME
    assert metadata_path.is_file(), f"Compiled Grain dataset metadata does not exist: {metadata_path}"
    metadata = json.loads(metadata_path.read_text())
    shard_paths = [path / rel for rel in metadata["shard_paths"]]

    if not shard_paths:
        raise ValueError(f"No ArrayRecord shards found under: {path}")
    missing = [p for p in shard_paths if not p.exists()]
    if missing:
        raise ValueError(f"Missing ArrayRecord shard(s): {missing}")
    return shard_paths


def load_compiled_metadata(path: str | Path) -> dict[str, Any]:
    path = Path(path).expanduser().resolve()
    metadata_path = path / COMPILED_METADATA_FILENAME
    if not metadata_path.exists():
        raise ValueError(f"Compiled Grain dataset metadata does not exist: {metadata_path}")
    return json.loads(metadata_path.read_text())

def required_epochs_for_batches(
    path: str | Path,
    *,
    batch_size: int,
    num_batches: int,
    dp_size: int | None = None,
) -> int:
    if num_batches <= 0:
        return 1
    if batch_size <= 0:
        raise ValueError("batch_size must be > 0")
    from omegalax.distributed.mesh import data_parallel_size

    metadata = load_compiled_metadata(path)
    num_records = int(metadata["num_records"])
    dp = data_parallel_size(dp_size)
    records_per_epoch = num_records // dp
    if records_per_epoch <= 0:
        raise ValueError(
            f"Compiled Grain dataset has {num_records} records, which is too small to shard "
            f"across data_parallel_size={dp} with drop_remainder=True."
        )
    required_records = batch_size * num_batches
    return max(1, (required_records + records_per_epoch - 1) // records_per_epoch)

def _iter_indexed_records(path: str | Path):
    source = grain.sources.ArrayRecordDataSource([str(p) for p in resolve_arrayrecord_paths(path)])
    for record_idx in range(len(source)):
        yield record_idx, json.loads(source[record_idx])

def build_chunk_index(
    payload_path: str | Path,
    out_dir: str | Path,
    *,
    max_length: int,
    measure_message,
    records_per_shard: int = 100_000,
    overwrite: bool = False,
    profile_metadata: dict[str, Any] | None = None,
) -> Path:
    """Build an offline chunk index over a canonical payload-block dataset.

    ``measure_message`` is called exactly once per message and must return the
    number of tokens that message contributes to a sequence.  For chat templates
    where tokenization is exactly additive at message boundaries (e.g. ChatML
    with ``add_special_tokens=False``), the accumulated per-message sum equals
    the full-sequence length exactly.  Swap in a different ``measure_message``
    implementation for other chat templates.
    """

    if max_length <= 0:
        raise ValueError("max_length must be > 0")

    payload_path = Path(payload_path).expanduser().resolve()
    out_dir = Path(out_dir).expanduser().resolve()
    payload_metadata = load_compiled_metadata(payload_path)
    if "payload_path" in payload_metadata:
        raise ValueError(f"Chunk indices can only be built from payload datasets, got chunk index: {payload_path}")

    def _iter_chunk_descriptors():
        current_session_id: str | None = None
        current_messages: list[dict[str, Any]] = []
        current_length = 0
        start_record_idx = 0
        start_message_offset = 0
        end_record_idx = 0
        end_message_offset = 0

        def emit_current() -> dict[str, Any] | None:
            if current_session_id is None or not current_messages:
                return None
            return {
                "session_id": current_session_id,
                "start_record_idx": start_record_idx,
                "start_message_offset": start_message_offset,
                "end_record_idx": end_record_idx,
                "end_message_offset": end_message_offset,
                "num_messages": len(current_messages),
                "measured_length": current_length,
            }

        for record_idx, block in _iter_indexed_records(payload_path):
            block_session_id = str(block["session_id"])
            if current_session_id is None:
                current_session_id = block_session_id
            elif block_session_id != current_session_id:
                descriptor = emit_current()
                if descriptor is not None:
                    yield descriptor
                current_session_id = block_session_id
                current_messages = []
                current_length = 0

            for msg_offset, message in enumerate(block["messages"]):
                msg_length = int(measure_message(message))
                if msg_length > max_length:
                    raise ValueError(
                        f"Single message at session={block_session_id} record={record_idx} "
                        f"offset={msg_offset} exceeds max_length={max_length}"
                    )

                if not current_messages:
                    start_record_idx = record_idx
                    start_message_offset = msg_offset
                elif current_length + msg_length > max_length:
                    descriptor = emit_current()
                    if descriptor is None:
                        raise AssertionError("Expected a chunk descriptor before overflow split")
                    yield descriptor
                    current_messages = []
                    current_length = 0
                    start_record_idx = record_idx
                    start_message_offset = msg_offset

                current_messages.append(message)
                current_length += msg_length
                end_record_idx = record_idx
                end_message_offset = msg_offset + 1

        descriptor = emit_current()
        if descriptor is not None:
            yield descriptor

    return _write_arrayrecord_dataset(
        _iter_chunk_descriptors(),
        out_dir,
        records_per_shard=records_per_shard,
        overwrite=overwrite,
        metadata={
            "payload_path": str(payload_path),
            "payload_num_records": int(payload_metadata["num_records"]),
            "max_length": max_length,
            "profile_metadata": profile_metadata or {},
        },
    )

class _JsonLoadsMap(grain.transforms.Map):
    def map(self, element):
        return json.loads(element)


class _ChunkDescriptorResolver(grain.transforms.Map):
    def __init__(self, payload_path: str | Path) -> None:
        self._payload_shards = [str(path) for path in resolve_arrayrecord_paths(payload_path)]
        self._payload_source = None

    def _source(self):
        if self._payload_source is None:
            self._payload_source = grain.sources.ArrayRecordDataSource(self._payload_shards)
        return self._payload_source

    def map(self, descriptor: dict[str, Any]) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        session_meta: dict[str, Any] = {}
        payload_source = self._source()

        start_record_idx = int(descriptor["start_record_idx"])
        end_record_idx = int(descriptor["end_record_idx"])
        start_message_offset = int(descriptor["start_message_offset"])
        end_message_offset = int(descriptor["end_message_offset"])

        for record_idx in range(start_record_idx, end_record_idx + 1):
            block = json.loads(payload_source[record_idx])
            if not session_meta:
                session_meta = dict(block.get("session_meta", {}))
            lo = start_message_offset if record_idx == start_record_idx else 0
            hi = end_message_offset if record_idx == end_record_idx else len(block["messages"])
            messages.extend(block["messages"][lo:hi])

        example = dict(session_meta)
        example["messages"] = messages
        example["_omegalax_session_id"] = descriptor["session_id"]
        example["_omegalax_start_record_idx"] = start_record_idx
        example["_omegalax_end_record_idx"] = end_record_idx
        example["_omegalax_measured_length"] = descriptor.get("measured_length")
        return example


class _TagSourceMap(grain.transforms.Map):
    """Tag each example with its source index so batches expose realized mix ratios."""

    def __init__(self, source_id: int) -> None:
        self._source_id = int(source_id)

    def map(self, example: dict[str, Any]) -> dict[str, Any]:
        example[SOURCE_ID_KEY] = self._source_id
        return example


class _SourceTaggingCollator:
    """Wrap a user-provided collator to surface per-example source ids in the batch."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        source_ids = np.asarray(
            [int(ex.get(SOURCE_ID_KEY, 0)) for ex in examples], dtype=np.int32,
        )
        result = self._inner(examples)
        result[BATCH_SOURCE_IDS_KEY] = source_ids
        return result


def pop_source_ids(batch: dict[str, Any]) -> np.ndarray | None:
    """Pop source-id metadata from a batch dict before sharding.

    Returns the per-example source ids attached by the mixing iterator
    (shape ``(B,)``, int32), or None if the batch was not produced by a
    source-tagging collator. Removing the key keeps it out of the JIT
    cache key for ``sft_train_step`` and out of distributed sharding.
    """
    raw = batch.pop(BATCH_SOURCE_IDS_KEY, None)
    return np.asarray(raw) if raw is not None else None


def make_grain_read_options(
    *,
    num_threads: int = 16,
    prefetch_buffer_size: int = 500,
) -> grain.ReadOptions:
    return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch_buffer_size)


def make_grain_multiprocessing_options(
    *,
    num_workers: int = 0,
    per_worker_buffer_size: int = 1,
    enable_profiling: bool = False,
) -> grain.MultiprocessingOptions:
    return grain.MultiprocessingOptions(
        num_workers=num_workers,
        per_worker_buffer_size=per_worker_buffer_size,
        enable_profiling=enable_profiling,
    )


def _coerce_sources(
    sources: str | Path | MixSource | Sequence[str | Path | MixSource],
) -> list[MixSource]:
    """Normalize mixed scalar/list inputs into a list of ``MixSource``."""
    if isinstance(sources, (str, Path)):
        return [MixSource(path=sources, weight=1.0)]
    if isinstance(sources, MixSource):
        return [sources]
    out: list[MixSource] = []
    for s in sources:
        if isinstance(s, MixSource):
            out.append(s)
        elif isinstance(s, (str, Path)):
            out.append(MixSource(path=s, weight=1.0))
        else:
            raise TypeError(f"Unsupported source spec: {s!r} (type {type(s).__name__})")
    if not out:
        raise ValueError("make_grain_iterator: at least one source required")
    return out


def _validate_mix_compatibility(
    sources: list[MixSource], metadatas: list[dict[str, Any]],
) -> None:
    """Refuse mixes that would silently corrupt training (different tokenization, length, etc.)."""
    if len(sources) <= 1:
        return
    max_lengths = {int(m["max_length"]) for m in metadatas if "max_length" in m}
    if len(max_lengths) > 1:
        raise ValueError(
            f"Cannot mix datasets compiled with different max_length: {max_lengths}. "
            f"Rebuild chunk indices with a shared --max_length."
        )
    tokenizer_ids = {
        (m.get("profile_metadata") or {}).get("tokenizer_id")
        for m in metadatas
    }
    tokenizer_ids.discard(None)
    if len(tokenizer_ids) > 1:
        raise ValueError(
            f"Cannot mix datasets compiled with different tokenizers: {tokenizer_ids}."
        )


def make_grain_iterator(
    sources: str | Path | MixSource | Sequence[str | Path | MixSource],
    *,
    batch_size: int,
    batch_fn,
    shuffle: bool = True,
    seed: int = 0,
    num_epochs: int | None = 1,
    read_options: grain.ReadOptions | None = None,
    multiprocessing_options: grain.MultiprocessingOptions | None = None,
    dp_size: int | None = None,
):
    """Create a checkpointable Grain iterator over one or more chunk-index datasets.

    When more than one source is supplied, examples are interleaved at the
    configured ``MixSource.weight`` ratios via ``grain.MapDataset.mix`` —
    every batch is a stochastic mix at the configured ratio, not a per-batch
    round-robin. ``num_epochs=None`` repeats each source indefinitely; set a
    finite value (per source) only for validation-style finite iteration.
    """
    from omegalax.distributed.mesh import data_parallel_index, data_parallel_size

    if batch_size <= 0:
        raise ValueError("batch_size must be > 0")

    mix_sources = _coerce_sources(sources)
    if any(s.weight < 0.0 for s in mix_sources):
        raise ValueError(
            f"Source weights must be non-negative: {[s.weight for s in mix_sources]}"
        )
    total_w = sum(s.weight for s in mix_sources)
    if total_w <= 0.0:
        raise ValueError("Sum of source weights must be > 0")
    # Drop zero-weight entries before mixing — Grain rejects them, but ablation
    # configs commonly zero out a source to disable it without changing structure.
    # Source ids stay aligned with the user-provided list so metric tags remain stable.
    active_indices = [i for i, s in enumerate(mix_sources) if s.weight > 0.0]
    metadatas = [load_compiled_metadata(mix_sources[i].path) for i in active_indices]
    for i, m in zip(active_indices, metadatas):
        if "payload_path" not in m:
            raise ValueError(
                f"Expected compiled Grain chunk-index dataset, missing payload_path: {mix_sources[i].path}"
            )
    _validate_mix_compatibility(
        [mix_sources[i] for i in active_indices], metadatas,
    )
    norm_weights = [
        mix_sources[i].weight / total_w for i in active_indices
    ]

    mp_options = multiprocessing_options or make_grain_multiprocessing_options()
    read_options = read_options or make_grain_read_options()
    dp = data_parallel_size(dp_size)
    dp_index = data_parallel_index(dp_size)

    per_source: list[grain.MapDataset] = []
    for active_idx, original_idx in enumerate(active_indices):
        s = mix_sources[original_idx]
        m = metadatas[active_idx]
        shard_paths = [str(p) for p in resolve_arrayrecord_paths(s.path)]
        payload_path = str(m["payload_path"])
        ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(shard_paths))
        if dp > 1:
            # Contiguous-block DP shards with drop_remainder, matching the
            # legacy IndexSampler(ShardOptions(drop_remainder=True)) behavior.
            per_rank = len(ds) // dp
            ds = ds[dp_index * per_rank : (dp_index + 1) * per_rank]
        if shuffle:
            ds = ds.shuffle(seed=seed + original_idx)
        ds = ds.repeat(num_epochs)
        ds = ds.map(_JsonLoadsMap())
        ds = ds.map(_ChunkDescriptorResolver(payload_path))
        # Tag with the user-facing source id (position in the original list),
        # not the active-only index, so metric labels are stable across
        # ablations that zero out individual sources.
        ds = ds.map(_TagSourceMap(source_id=original_idx))
        per_source.append(ds)

    mixed = per_source[0] if len(per_source) == 1 else grain.MapDataset.mix(per_source, weights=norm_weights)
    batched = mixed.batch(
        batch_size=batch_size, drop_remainder=True, batch_fn=_SourceTaggingCollator(batch_fn),
    )
    iter_ds = batched.to_iter_dataset(read_options)
    if mp_options.num_workers > 0:
        iter_ds = iter_ds.mp_prefetch(mp_options)
    return iter(iter_ds)


# ---- The port's use of the module (shrunk) ----
results = {}
root = Path(OUT)
for name, n_sessions, width in (("a", 4, 3), ("b", 3, 5), ("c", 2, 2)):
    with open(root / f"{name}.jsonl", "w") as f:
        for s in range(n_sessions):
            msgs = [{"role": "user" if m % 2 == 0 else "assistant", "content": name * (width + (s * 7 + m) % 9)}
                    for m in range(2 + (s * 3) % 5)]
            f.write(json.dumps({"messages": msgs, "topic": f"{name}{s}"}) + "\n")
        f.write("\n")
    compile_jsonl_to_arrayrecord(root / f"{name}.jsonl", root / f"payload_{name}", messages_per_record=3,
                                 records_per_shard=4)
    build_chunk_index(root / f"payload_{name}", root / f"index_{name}", max_length=20 if name != "c" else 30,
                      measure_message=lambda m: len(m["content"]), records_per_shard=5,
                      profile_metadata={"tokenizer_id": "chars"})
results["payload_meta"] = load_compiled_metadata(root / "payload_a")["num_records"]
results["index_meta"] = {k: load_compiled_metadata(root / f"index_{k}")["num_records"] for k in "abc"}


def collate(examples):
    return {"num_messages": np.asarray([len(ex["messages"]) for ex in examples], dtype=np.int32),
            "session": np.asarray([ex["_omegalax_session_id"] for ex in examples]),
            "topic": [ex["topic"] for ex in examples]}


def summary(batch):
    batch = dict(batch)
    ids = pop_source_ids(batch)
    return [ids.tolist(), str(ids.dtype), batch["num_messages"].tolist(), batch["session"].tolist(), batch["topic"]]


def plain_eq(a, b):
    return [summary(x) for x in a] == [summary(x) for x in b]


sources = [MixSource(root / "index_a", 2.0), MixSource(root / "index_b", 1.0), MixSource(root / "index_c", 0.0)]


def make():
    return make_grain_iterator(sources, batch_size=3, batch_fn=collate, shuffle=True, seed=1, num_epochs=1,
                               read_options=make_grain_read_options(num_threads=2, prefetch_buffer_size=4))


reference, checks = restore_at_every_step(make)
results["mixed"] = [summary(b) for b in reference]
results["mixed_restores"] = checks
it = make()
next(it)
results["state"] = it.get_state()
endless = make_grain_iterator(str(root / "index_b"), batch_size=2, batch_fn=collate, shuffle=False, num_epochs=None,
                              dp_size=2)
results["dp_endless"] = [summary(next(endless)) for _ in range(4)]
for bad in ([MixSource(root / "index_a"), MixSource(root / "index_c")], [MixSource(root / "payload_a")],
            [MixSource(root / "index_a", -1.0)], [3]):
    try:
        make_grain_iterator(bad, batch_size=2, batch_fn=collate)
    except (ValueError, TypeError) as e:
        results.setdefault("refused", []).append([type(e).__name__, str(e).replace(str(root), "ROOT")])
'''


def _omegalax_mesh(monkeypatch):
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  mesh = types.ModuleType("omegalax.distributed.mesh")
  exec(  # omegalax/distributed/mesh.py's data_parallel_size / data_parallel_index
      "import jax\n"
      "def data_parallel_size(dp_size=None):\n"
      "    if dp_size is not None:\n"
      "        return dp_size\n"
      "    return jax.process_count()\n"
      "def data_parallel_index(dp_size=None):\n"
      "    dp = data_parallel_size(dp_size)\n"
      "    return jax.process_index() % dp\n", mesh.__dict__)
  for name, module in (("omegalax", types.ModuleType("omegalax")),
                       ("omegalax.distributed", types.ModuleType("omegalax.distributed")),
                       ("omegalax.distributed.mesh", mesh)):
    monkeypatch.setitem(sys.modules, name, module)


def test_omegalax_compiled_chunks_weighted_mix_and_resume_as_on_grain(tmp_path, monkeypatch):
  """p-doom/omegalax: omegalax/data/grain_pipeline.py (compile, chunk index, `make_grain_iterator` with `MapDataset.mix`)."""
  _omegalax_mesh(monkeypatch)
  source = OMEGALAX_PIPELINE.replace("# ---- The port's use", porting.RESTORE_AT_EVERY_STEP + "# ---- The port's use", 1)
  # The snippet runs outside sys.modules, where `from __future__ import
  # annotations` breaks `@dataclass`'s string annotations (porting.run).
  source = source.replace("from __future__ import annotations\n", "", 1)
  (tmp_path / "g").mkdir()
  (tmp_path / "l").mkdir()
  g = porting.grain_keys(porting.run(source, "grain", OUT=str(tmp_path / "g")).results)
  l = porting.grain_keys(porting.run(source, "loader", OUT=str(tmp_path / "l")).results)
  assert l == g
  assert g["index_meta"]["a"] > 4 and len(g["mixed"]) >= 3
  assert g["mixed_restores"] == [[True, True]] * (len(g["mixed"]) + 1)
  ids = [i for b in g["mixed"] for i in b[0]]
  assert set(ids) == {0, 1} and g["mixed"][0][1] == "int32"
  assert len(g["dp_endless"]) == 4 and {i for b in g["dp_endless"] for i in b[0]} == {0}
  assert [r[0] for r in g["refused"]] == ["ValueError", "ValueError", "ValueError", "TypeError"]
  assert "different max_length" in g["refused"][0][1]


def test_omegalax_mix_with_mp_prefetch_workers_as_on_grain(tmp_path):
  """p-doom/omegalax grain_pipeline.py's `make_grain_iterator` with `make_grain_multiprocessing_options(num_workers=2)` (its `mp_prefetch` branch), as a script."""
  source = OMEGALAX_PIPELINE.replace("from __future__ import annotations\n", "", 1)
  defs, usage = source.split("# ---- The port's use of the module (shrunk) ----\n")
  usage = usage.split("sources = [")[0] + """
sources = [MixSource(root / "index_a", 2.0), MixSource(root / "index_b", 1.0)]
results = {}
for workers in (0, 2):
    it = make_grain_iterator(sources, batch_size=3, batch_fn=collate, shuffle=True, seed=1, num_epochs=1,
                             multiprocessing_options=make_grain_multiprocessing_options(num_workers=workers))
    batches = [summary(next(it)) for _ in range(2)]
    state = it.get_state()
    rest = [summary(b) for b in it]
    again = make_grain_iterator(sources, batch_size=3, batch_fn=collate, shuffle=True, seed=1, num_epochs=1,
                                multiprocessing_options=make_grain_multiprocessing_options(num_workers=workers))
    again.set_state(state)
    results[workers] = [batches + rest, [summary(b) for b in again] == rest]
"""
  header = ("import sys, types\n"
            "mesh = types.ModuleType('omegalax.distributed.mesh')\n"
            "mesh.data_parallel_size = lambda dp_size=None: 1 if dp_size is None else dp_size\n"
            "mesh.data_parallel_index = lambda dp_size=None: 0\n"
            "sys.modules.update({'omegalax': types.ModuleType('omegalax'), "
            "'omegalax.distributed': types.ModuleType('omegalax.distributed'), 'omegalax.distributed.mesh': mesh})\n")

  def script(out):
    os.makedirs(out)
    return (header + defs + "\nif __name__ == '__main__':\n"
            "  import absl.flags\n"
            "  absl.flags.FLAGS.mark_as_parsed()\n"
            f"  OUT = {out!r}\n"
            + "".join(f"  {line}\n" for line in usage.strip().splitlines())
            + "  print(json.dumps(results))\n")

  g = porting.run_script(script(str(tmp_path / "g")), "grain", tmp_path)
  l = porting.run_script(script(str(tmp_path / "l")), "loader", tmp_path)
  assert l == g
  assert g["0"][0] == g["2"][0] and len(g["0"][0]) >= 3
  assert g["0"][1] and g["2"][1]


# A video world-model data module (`_BoundedArrayRecordDataSource`,
# `_array_record_source`, `VideoDataSource`, `DynamicsDataSource`,
# `RandomVideoCrop`, `RandomDynamicsCrop`, `PreprocessAndPatchify`,
# `align_actions_to_frames`; the index names no repository for it) as
# written: a subclass of `grain.ArrayRecordDataSource` that bounds the open
# shard readers with an LRU, reaching the base class's private
# `_readers`, `_read_instructions[i].filename`, `_reader_options_string` and
# `_reader_idx_and_position(key)` and array_record's private `_create_reader`
# / `_check_group_size`; sources that `np.load` each record's .npz bytes;
# `grain.RandomMapTransform` crops and a patchify. Its callers are not in the
# index: here a DataLoader and a MapDataset pipeline read it.
VIDEO = r'''
import io
import threading
from collections import OrderedDict
from typing import TypedDict

from array_record.python import array_record_data_source as array_record_data_source_lib
import grain.python as grain
import jax
import numpy as np
from einops import rearrange
from etils import epath


class VideoDataset(TypedDict):
    video: np.ndarray


class DynamicsBatch(TypedDict):
    video: np.ndarray
    actions: np.ndarray


class DynamicsDataset(DynamicsBatch):
    rewards: np.ndarray
    prev_action: np.ndarray


def align_actions_to_frames(
    actions: np.ndarray,
    *,
    prev_action: np.ndarray | None = None,
) -> np.ndarray:
    aligned = np.empty_like(actions)
    if prev_action is None:
        prev_action = np.full(actions.shape[1:], -1, dtype=actions.dtype)
    aligned[0] = prev_action
    aligned[1:] = actions[:-1]
    return aligned


class _BoundedArrayRecordDataSource(grain.ArrayRecordDataSource):
    """ArrayRecord source that bounds the number of simultaneously open shard readers."""

    def __init__(self, paths: list[str], *, max_open_readers: int = 128):
        super().__init__(paths)
        self._max_open_readers = max(1, int(max_open_readers))
        self._reader_lock = threading.Lock()
        self._reader_lru: OrderedDict[int, None] = OrderedDict()
        self._reader_refcounts = [0] * len(self._readers)

    def _ensure_reader_exists(self, reader_idx: int) -> None:
        with self._reader_lock:
            reader = self._readers[reader_idx]
            if reader is None:
                self._evict_readers_if_needed()
                filename = self._read_instructions[reader_idx].filename
                reader = array_record_data_source_lib._create_reader(  # pylint: disable=protected-access
                    filename,
                    self._reader_options_string,
                )
                array_record_data_source_lib._check_group_size(  # pylint: disable=protected-access
                    filename,
                    reader,
                )
                self._readers[reader_idx] = reader
            self._reader_lru.pop(reader_idx, None)
            self._reader_lru[reader_idx] = None

    def _evict_readers_if_needed(self) -> None:
        while len(self._reader_lru) >= self._max_open_readers:
            evict_idx = next(
                (
                    index
                    for index in self._reader_lru
                    if self._reader_refcounts[index] == 0
                ),
                None,
            )
            if evict_idx is None:
                return
            reader = self._readers[evict_idx]
            if reader is not None:
                reader.close()
                self._readers[evict_idx] = None
            self._reader_lru.pop(evict_idx, None)

    def __getitem__(self, record_key) -> bytes:
        reader_idx, position = self._reader_idx_and_position(record_key)
        self._ensure_reader_exists(reader_idx)
        with self._reader_lock:
            self._reader_refcounts[reader_idx] += 1
            reader = self._readers[reader_idx]
        try:
            if hasattr(reader, "read"):
                return reader.read([position])[0]
            return reader[position]
        finally:
            with self._reader_lock:
                self._reader_refcounts[reader_idx] -= 1


def _array_record_source(data_dir: str) -> grain.ArrayRecordDataSource:
    shard_dir = epath.Path(data_dir)
    paths = sorted(
        [p for p in shard_dir.iterdir() if p.suffix == ".arecord"],
        key=lambda p: p.as_posix(),
    )
    if not paths:
        raise FileNotFoundError(f"No .arecord files found in {data_dir}")
    return _BoundedArrayRecordDataSource([p.as_posix() for p in paths])


class DynamicsDataSource(grain.RandomAccessDataSource):
    def __init__(self, data_dir: str):
        self._source = _array_record_source(data_dir)

    def __len__(self):
        return len(self._source)

    def __getitem__(self, idx: int) -> DynamicsDataset:
        record_bytes = self._source[idx]
        with np.load(io.BytesIO(record_bytes)) as data:
            video = np.asarray(data["frames"])
            actions = np.asarray(data["actions"])
            rewards = np.asarray(data["rewards"])
            prev_action = (
                np.asarray(data["prev_action"])
                if "prev_action" in data
                else np.full(actions.shape[1:], -1, dtype=actions.dtype)
            )
        return DynamicsDataset(
            video=video,
            actions=actions,
            rewards=rewards,
            prev_action=prev_action,
        )


class VideoDataSource(grain.RandomAccessDataSource):
    def __init__(self, data_dir: str):
        self._source = _array_record_source(data_dir)

    def __len__(self):
        return len(self._source)

    def __getitem__(self, idx: int) -> VideoDataset:
        record_bytes = self._source[idx]
        with np.load(io.BytesIO(record_bytes)) as data:
            video = np.asarray(data["frames"])
        return VideoDataset(video=video)


class RandomVideoCrop(grain.RandomMapTransform):
    def __init__(self, frame_length: int):
        self.frame_length = frame_length

    def random_map(self, element: VideoDataset, rng: np.random.Generator) -> VideoDataset:
        video = element["video"]
        start_idx = int(rng.integers(0, len(video) - self.frame_length + 1))
        return VideoDataset(video=video[start_idx : start_idx + self.frame_length].copy())


class RandomDynamicsCrop(grain.RandomMapTransform):
    def __init__(self, sequence_length: int):
        self.sequence_length = sequence_length

    def random_map(
        self,
        element: DynamicsDataset,
        rng: np.random.Generator,
    ) -> DynamicsBatch:
        video = element["video"]
        actions = element["actions"]
        prev_action = element["prev_action"]
        if len(video) < self.sequence_length:
            raise ValueError(f"Sequence shorter than crop: {len(video)} < {self.sequence_length}")
        if len(video) == self.sequence_length:
            return DynamicsBatch(
                video=video,
                actions=align_actions_to_frames(actions, prev_action=prev_action),
            )

        start_idx = int(rng.integers(0, len(video) - self.sequence_length + 1))
        stop_idx = start_idx + self.sequence_length
        cropped_actions = actions[start_idx:stop_idx]
        crop_prev_action = actions[start_idx - 1] if start_idx > 0 else prev_action
        return DynamicsBatch(
            video=video[start_idx:stop_idx],
            actions=align_actions_to_frames(cropped_actions, prev_action=crop_prev_action),
        )


class PreprocessAndPatchify(grain.RandomMapTransform):
    def __init__(
        self,
        patch_size: int,
        pad_width: tuple[int, int],
        resize_shape: tuple[int, int] | None = None,
    ):
        self.patch_size = patch_size
        self.pad_width = pad_width
        self.resize_shape = resize_shape

    def random_map(self, element: VideoDataset, rng: np.random.Generator) -> VideoDataset:
        video = element["video"]
        if self.resize_shape is not None:
            video = np.clip(
                np.rint(
                    np.asarray(
                        jax.image.resize(
                            video.astype(np.float32),
                            (video.shape[0], *self.resize_shape, video.shape[-1]),
                            method="linear",
                            antialias=True,
                        )
                    )
                ),
                0,
                255,
            ).astype(video.dtype)
        height_pad, width_pad = self.pad_width
        padded_video = np.pad(
            video,
            ((0, 0), (height_pad, height_pad), (width_pad, width_pad), (0, 0)),
            mode="constant",
            constant_values=0,
        )
        patched_video = rearrange(
            padded_video,
            "t (h p1) (w p2) c -> t (h w) (p1 p2 c)",
            p1=self.patch_size,
            p2=self.patch_size,
        )
        return {"video": patched_video}


# Callers (not in the index), shrunk.
def summary(x):
    return {k: [v.shape, str(v.dtype), v.tolist()] for k, v in sorted(x.items())}


results = {}
videos = VideoDataSource(DATA)
results["len"] = len(videos)
loader = grain.DataLoader(
    data_source=videos,
    sampler=grain.IndexSampler(len(videos), shard_options=grain.NoSharding(), shuffle=True, seed=3, num_epochs=1),
    operations=[RandomVideoCrop(3), PreprocessAndPatchify(2, (1, 0), resize_shape=(4, 2)),
                grain.Batch(2, drop_remainder=True)],
    worker_count=0)
it = iter(loader)
states, batches = [], []
while True:
    states.append(it.get_state())
    try:
        batches.append(summary(next(it)))
    except StopIteration:
        break
results["video_batches"] = batches
resumed = []
for k, state in enumerate(states):
    fresh = iter(loader)
    fresh.set_state(state)
    resumed.append([summary(b) for b in fresh] == batches[k:])
results["video_resumed"] = resumed
results["open_readers"] = sum(r is not None for r in videos._source._readers)
# Bound to one open shard (each change of shard evicts), read on one thread:
# the client's bound is not safe against concurrent reads.
bounded = VideoDataSource(DATA)
bounded._source._max_open_readers = 1
sequential = [bounded[i]["video"].shape for i in (0, 4, 5, 1, 8)]
results["bounded"] = [sum(r is not None for r in bounded._source._readers), list(bounded._source._reader_lru),
                      sequential]
dynamics = (grain.MapDataset.source(DynamicsDataSource(DATA)).seed(5).shuffle()
            .random_map(RandomDynamicsCrop(4)).batch(3))
results["dynamics"] = [summary(b) for b in dynamics]
results["keys"] = [videos._source._reader_idx_and_position(k) for k in (0, 2, 3, len(videos) - 1)]
try:
    videos._source._reader_idx_and_position(len(videos))
except ValueError as e:
    results["bad_key"] = str(e)
shards = sorted(str(p) for p in epath.Path(DATA).iterdir() if p.suffix == ".arecord")
ranged = _BoundedArrayRecordDataSource([f"{shards[0]}[1:3]", f"{shards[2]}[0:2]", shards[1]])
results["ranged"] = [len(ranged), ranged._reader_options_string,
                     [[ri.filename == f, ri.start, ri.end, ri.num_records]
                      for ri, f in zip(ranged._read_instructions, (shards[0], shards[2], shards[1]))],
                     [ranged._reader_idx_and_position(k) for k in range(len(ranged))],
                     [ranged[k] == grain.ArrayRecordDataSource(shards)[j] for k, j in enumerate((1, 2, 5, 6, 3, 4))]]
results["options"] = grain.ArrayRecordDataSource(shards[:1], reader_options={"index_storage_option": "in_memory"}
                                                 )._reader_options_string
try:
    _array_record_source(EMPTY)
except FileNotFoundError as e:
    results["empty"] = str(e).replace(EMPTY, "EMPTY")
'''


def _video_shards(directory):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(9)
  data = os.path.join(directory, "shards")
  os.makedirs(data)
  os.makedirs(os.path.join(directory, "empty"))
  for s, n in enumerate((3, 2, 4)):
    w = ArrayRecordWriter(os.path.join(data, f"episodes-{s}.arecord"), "group_size:1")
    for e in range(n):
      t = 5 + (s + e) % 3
      buf = io.BytesIO()
      fields = {"frames": rng.integers(0, 256, (t, 4, 2, 1), dtype=np.uint8),
                "actions": rng.integers(0, 6, (t, 1)).astype(np.int32), "rewards": rng.random(t).astype(np.float32)}
      if e % 2:
        fields["prev_action"] = np.asarray([7], np.int32)
      np.savez(buf, **fields)
      w.write(buf.getvalue())
    w.close()
  with open(os.path.join(data, "notes.txt"), "w", encoding="utf-8") as f:
    f.write("not a shard")
  return {"DATA": data, "EMPTY": os.path.join(directory, "empty")}


def test_video_bounded_array_record_subclass_crops_and_resume_as_on_grain(tmp_path):
  """A video world-model data module (index: no repository named): a `grain.ArrayRecordDataSource` subclass on its private reader API, `RandomMapTransform` crops."""
  inputs = _video_shards(tmp_path)
  g, l = (porting.grain_keys(x.results) for x in porting.run_both(VIDEO, **inputs))
  assert l == g
  assert g["len"] == 9 and len(g["video_batches"]) == 4
  assert g["video_batches"][0]["video"][:2] == [[2, 3, 3, 4], "uint8"]
  assert g["video_resumed"] == [True] * 5
  assert g["open_readers"] == 3 and g["bounded"][:2] == [1, [2]]
  assert g["keys"] == [[0, 0], [0, 2], [1, 0], [2, 3]]
  assert g["bad_key"] == "Record key should be in [0, num_records)"
  assert g["dynamics"][0]["actions"][0] == [3, 4, 1] and g["dynamics"][0]["video"][0] == [3, 4, 4, 2, 1]
  assert g["empty"] == "No .arecord files found in EMPTY"
  assert g["ranged"] == [6, "", [[True, 1, 3, 2], [True, 0, 2, 2], [True, 0, 2, 2]],
                         [[0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1]], [True] * 6]
  assert g["options"] == "index_storage_option:in_memory"


# Window samplers over a time-series source (`transient_weights`,
# `weighted_windows`, `mixed_split`; the index names no repository for it) as
# written: `grain.MapDataset.range(n).repeat().seed(seed).random_map(draw)`
# (an endless stream of weighted draws) and `grain.MapDataset.mix` of two
# halves each `.seed(seed + i).shuffle().repeat()`; `jaxtyping.Float` and the
# package's `TimeSeriesDataSource` are small stand-ins.
WINDOWS = r'''
from collections.abc import Callable
from typing import Any

import grain
import numpy as np


class Float:  # stand-in for jaxtyping.Float
    def __class_getitem__(cls, item):
        return Any


class TimeSeriesDataSource:  # stand-in for .dataset.TimeSeriesDataSource
    def __init__(self, ts, xs, window_size):
        self.ts, self.xs, self.window_size = ts, xs, window_size

    def __len__(self):
        return len(self.ts) - self.window_size + 1

    def __getitem__(self, i):
        return {"t": self.ts[i:i + self.window_size], "x": self.xs[i:i + self.window_size]}

    def window_start_times(self):
        return self.ts[:len(self)]

    def split_time(self, split_idx):
        return (TimeSeriesDataSource(self.ts[:split_idx], self.xs[:split_idx], self.window_size),
                TimeSeriesDataSource(self.ts[split_idx:], self.xs[split_idx:], self.window_size))


def transient_weights(
    source: TimeSeriesDataSource, *, boost: float, tau: float
) -> Float[np.ndarray, " windows"]:
    if boost < 0 or tau <= 0:
        raise ValueError("boost must be >= 0 and tau > 0.")
    t = source.window_start_times()
    return 1.0 + boost * np.exp(-(t - t[0]) / tau)


def weighted_windows(
    source: TimeSeriesDataSource,
    weights: Float[np.ndarray, " windows"] | Callable[[TimeSeriesDataSource], Any],
    *,
    seed: int,
) -> grain.MapDataset:
    w = np.asarray(weights(source) if callable(weights) else weights, dtype=np.float64)
    if w.shape != (len(source),) or np.any(w < 0) or not np.any(w > 0):
        raise ValueError("weights must be a non-negative vector over the windows.")
    cdf = np.cumsum(w)
    cdf /= cdf[-1]

    def draw(_, rng: np.random.Generator):
        idx = int(np.searchsorted(cdf, rng.random(), side="right"))
        return source[min(idx, len(source) - 1)]

    return grain.MapDataset.range(len(source)).repeat().seed(seed).random_map(draw)


def mixed_split(
    source: TimeSeriesDataSource,
    split_idx: int,
    *,
    weights: tuple[float, float] = (1.0, 1.0),
    seed: int,
) -> grain.MapDataset:
    if not source.window_size <= split_idx <= len(source.ts) - source.window_size:
        raise ValueError(
            "split_idx must leave at least one window on each side: "
            f"{source.window_size} <= split_idx <= "
            f"{len(source.ts) - source.window_size}."
        )
    early, late = source.split_time(split_idx)
    ds = [
        grain.MapDataset.source(s).seed(seed + i).shuffle().repeat()
        for i, s in enumerate((early, late))
    ]
    return grain.MapDataset.mix(ds, weights=list(weights))


def starts(elements):
    return [float(e["t"][0]) for e in elements]


results = {}
ts = np.linspace(0.0, 9.5, 20)
source = TimeSeriesDataSource(ts, np.sin(ts).astype(np.float32), window_size=3)
weighted = weighted_windows(source, lambda s: transient_weights(s, boost=4.0, tau=1.5), seed=7)
results["weighted_len"] = len(weighted)
results["weighted"] = starts(weighted[i] for i in range(12))
results["weighted_far"] = starts([weighted[10**12], weighted[len(weighted) - 1]])
mixed = mixed_split(source, 8, weights=(2.0, 1.0), seed=3)
results["mixed_len"] = len(mixed)
results["mixed"] = starts(mixed[i] for i in range(12))
results["doc_claim"] = list(grain.MapDataset.mix([grain.MapDataset.range(5), grain.MapDataset.range(7, 10)]))
it = iter(mixed.to_iter_dataset())
head = starts(next(it) for _ in range(5))
state = it.get_state()
rest = starts(next(it) for _ in range(5))
again = iter(mixed.to_iter_dataset())
again.set_state(state)
results["resume"] = [head + rest == results["mixed"][:10], starts(next(again) for _ in range(5)) == rest, state]
for bad in (lambda: mixed_split(source, 2, seed=0), lambda: weighted_windows(source, np.zeros(len(source)), seed=0),
            lambda: transient_weights(source, boost=-1, tau=1)):
    try:
        bad()
    except ValueError as e:
        results.setdefault("refused", []).append(str(e))
'''


def test_time_series_weighted_windows_and_mixed_split_as_on_grain():
  """Window samplers over a time-series source (index: no repository named): an endless `random_map` draw and `MapDataset.mix` of shuffled, repeated halves."""
  g, l = porting.run_both_grain_keys(WINDOWS)
  assert l == g
  assert g["weighted_len"] == g["mixed_len"] > 10**15
  assert len(g["weighted"]) == 12 and len(g["weighted_far"]) == 2
  assert g["doc_claim"] == [0, 7, 1, 8, 2, 9]
  assert g["resume"][:2] == [True, True]
  assert all(t < 4.0 for t in g["mixed"][0::3] + g["mixed"][1::3]) and all(t >= 4.0 for t in g["mixed"][2::3])
  assert len(g["refused"]) == 3
