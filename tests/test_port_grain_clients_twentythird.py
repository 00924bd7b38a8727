"""Round 26's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

flyingblackshark/jax-so-vits-svc's input_pipeline/ (dataset.py `get_dataset`,
utils.py `ParseFeatures` / `PadToMaxLength`, multihost_dataloading.py
`MultiHostDataLoadIterator`): `import grain.python` beside `import grain`
(the `grain.python.X` names reached through the package; ported as
`import loader.python` and `import loader as grain`),
`grain.python.ArrayRecordDataSource(glob(...))`, an `IndexSampler` with
`num_epochs=2`, `shuffle=True` and `ShardOptions(shard_index=
jax.process_index(), ...)`, two `MapTransform`s that parse a record and pad
it in place (`data["audio"] = ...`), `grain.python.Batch(global_batch_size
// jax.process_count())`, a `DataLoader`, and the MaxText-style iterator that
`isinstance`-checks `Iterable`, resets with `iter(dataloader)` on `__iter__`
and forms global arrays with `jax.make_array_from_single_device_arrays`. The
records are pickled dicts here (the client's are `tf.train.Example`s of
serialized tensors parsed with TensorFlow, replaced by numpy stand-ins).

A JAX port of RibonanzaNet's trainer and data module (train.py `Trainer`,
jax_dataset.py `RNADataSource`, `AddNoise`, `AddLabels`, `RandomFlip`,
`PadToMaxLen`, `make_data_loader`; the index names no repository for it):
`import grain.checkpoint` / `import grain.sharding` (ported as `import loader
as grain`), a `grain.sources.RandomAccessDataSource` subclass over HDF5 files
opened lazily with a constant `__repr__` "for Grain's Orbax checkpoint
integration", `grain.transforms.Map` / `RandomMap` classes, `grain.load(
source=..., num_epochs=None, shuffle=..., seed=0, transformations=...,
batch_size=..., worker_count=min(batch_size // 2, cpu_count // 2, 8) or 1,
shard_options=grain.sharding.ShardOptions(..., drop_remainder=True))`, and
Orbax `CheckpointManager(save_interval_steps=..., best_fn=...)` saving with
`ocp.args.Composite(state=StandardSave(...), training_data_input=
grain.checkpoint.CheckpointRestore(iterator))` and `metrics=`, restoring with
`grain.checkpoint.CheckpointSave(iterator)` (the two argument classes swapped,
as the trainer writes them); its `RandomFlip` calls `.flip` on numpy arrays,
an AttributeError from the worker on both. The model, optimizer and jitted
steps (Flax NNX, optax) are left out: a step counter stands in.

pytorch/torchtitan's Grain data pipeline at its newest versions in the index:
torchtitan/components/data/loader.py (`_TokenBudgetBatchIterator`: a
`grain.DatasetIterator` that calls `self._parent.get_state()` before each
pull, keeps the row that overflows the token budget for the next batch,
reports the parent's state at the batch boundary and wraps its `batch_fn` in
`self._stats.record_self_time()` / `self._stats.record_output_spec(...)`;
`_TokenBudgetBatchIterDataset`; `_find_epoch_source` walking the dataset
graph through `.parents`; `GrainDataLoader` with `isinstance(dataset,
grain.MapDataset)`, `to_iter_dataset(read_options=...)`,
`batch(..., drop_remainder=repeat, batch_fn=collator)`,
`grain_experimental.ThreadPrefetchIterDataset`, `state_dict` /
`load_state_dict` that closes the iterator when a state is refused),
sources.py (`IndexedJsonlSource`, and the streaming source's cursor
`DatasetIterator` over a Hugging Face stream, here a small stand-in; the
cursor also sets the `current_epoch` that `_find_epoch_source` looks for, as
the version of sources.py that has it is not in the index)
and dataset.py's two builders (`WindowShuffleIterDataset`, filters and a
`random_map(processor, seed=...)` on a stream; filter, `random_map`,
`shuffle`, a rank slice and `repeat()` on a `MapDataset`); and packing.py
(`ConcatThenSplitPackingConfig`: a document-aware concat-then-split
`IterDataset` / `DatasetIterator` pair with `self._assert_not_closed()` whose
state replays the remainder's document from the parent, or
`ConcatThenSplitIterDataset` over a four-feature `length_struct` followed by a
filter dropping rows that are not full; `FirstFitPackingConfig`:
`FlatMapIterDataset` with a `FlatMapTransform` that sets `max_fan_out` in
`__init__`, then `FirstFitPackIterDataset(padding_struct=` with a boolean
feature padded `True`, `meta_features=("labels", "positions"), seed=,
shuffle_bins=, max_sequences_per_bin=)`).

A WebDataset bridge for audio (`_WdsGrainIterator`, `WdsGrainIterDataset`;
the index names no repository for it): a `DatasetIterator` over a parent of
tar paths that opens one `wds.WebDataset` per file, renames the audio member
to `wav`, skips samples that fail with a printed warning, decorates
`__next__` with Grain's private `grain._src.python.dataset.stats.
record_next_duration_if_output`, overrides `__str__`, and saves
`{"parent": ..., "samples_processed_in_file": n}` (restoring it opens the
file after the saved one: the parent's state is taken after the current file
was read; both libraries do so). webdataset is replaced by a small tarfile
reader.

A retrieval-augmented QA dataset module (`_StreamingIterator`,
`_StreamingSource`, `_StreamingQAFilter`, `_StreamingQATransform`,
`QADataset._build_pipeline` / `get_loader_state` / `set_loader_state` /
`generator`; the index names no repository for it): a `DatasetIterator`
imported from Grain's private `grain._src.python.dataset.dataset` whose
`set_state` records a target count that the next `__next__` fast-forwards to,
an `IterDataset` source with its own `set_slice(sl, sequential_slice)`, a
`grain.FilterTransform` and a `grain.MapTransform` instance given to
`IterDataset.filter` / `.map`, `mp_prefetch(MultiprocessingOptions(
num_workers=..., per_worker_buffer_size=4))` when it has workers,
`batch(batch_size, drop_remainder=True)`, and a generator that rebuilds the
pipeline per epoch and restores a pending state (a state without a count
restarts the stream). Run here without workers: with them, Grain's
`mp_prefetch` calls the source's `set_slice` and keeps its state in its own
layout, which loader does not (README, "`set_slice` is not called"). The
Hugging Face tokenizer, stream and the module's `.utils` helpers are small
stand-ins.

A world-model trainer's iterator factory (`make_iterator`,
`make_dual_iterator`, `AlternatingIterator`, `DataLoaderIteratorWrapper` and
a `device_put` "adapted from grain.experimental.device_put"; its episode
transforms were ported in round 24 with stand-ins here): a `DataLoader` over
`grain.sources.ArrayRecordDataSource` with `grain.samplers.IndexSampler(
shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
num_epochs=None)`, `worker_buffer_size=1` and `ReadOptions(num_threads=1)`;
the DataLoader's iterator wrapped as an `IterDataset` (imported from
`grain._src.python.dataset.dataset`) whose `__iter__` returns itself, under
Grain's private `transformations.prefetch.ThreadPrefetchIterDataset`, a
`.map` doing `jax.device_put` with a `NamedSharding` and a bfloat16 cast, and
another thread prefetch; and two such pipelines with one worker each
alternated by an `IterDataset` subclass that never calls `super().__init__()`
and draws from `jax.random` in `__next__`.

A LibriSpeech five-format example script (examples/test_librispeech_grain.py;
the index names no repository for it): `grain.transforms.Map` / `Filter`
classes, a JSONL line-offset source and a tar-member source (plain classes)
under `MapDataset.source(...).map(...).map(...).shuffle(seed=42)` and
`ds.batch(batch_size=4)[0]` (dicts of strings and floats),
`grain.experimental.ParquetIterDataset(path).map(...)`,
`grain.experimental.TFRecordIterDataset(path).map(ParseJSON())`, and
`grain.sources.ArrayRecordDataSource(path)` read by index; `main()` catches
and prints each runner's error. Its printed output is compared, and with a
file missing, the errors.

Where loader differed, it is fixed: a `WindowShuffleIterDataset` state
after a window's last element (loader gave the next window's start,
`pos_in_window=0`; Grain keeps the spent window's start, `pos_in_window` its
length and `window_index` already the next, and after a filtered end the
position where the last fill started: `loader/transformations/
window_shuffle.py`), and the ValueError a user's iterator raises through
`self._assert_not_closed()` after `close()` (now Grain's "Trying to advance
a closed iterator: '<iterator>'.": `loader/dataset_iterator.py`). The
documented differences that remain are asserted as such: the repr of an
`ArrayRecordDataSource` in a `DataLoader` state, and the states of packing
and `ConcatThenSplitIterDataset` (README, "Checkpoint states").
"""

from __future__ import annotations

import json
import os
import pickle
import re

import absl.flags
import numpy as np

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.



# The three modules as written (concatenated), with stand-ins for TensorFlow's
# parsing calls; `get_dataset` reads its config from `hp`, as the client's
# callers pass it.
SO_VITS = r'''
import csv
import time
import glob
import pickle
from functools import partial
from typing import Iterable, Iterator, Union

import grain.python
import jax
import jax.tree_util as jtu
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import grain


class tf:  # stand-ins for the TensorFlow calls (records are pickled dicts here)
  class data:
    class Dataset:
      pass

  class errors:
    class FailedPreconditionError(Exception):
      pass

  class io:
    FixedLenFeature = staticmethod(lambda shape, dtype: None)

    @staticmethod
    def parse_example(example, features):
      return {k: pickle.loads(example)[k] for k in features}

    @staticmethod
    def parse_tensor(x, dtype):
      return np.asarray(x, dtype=np.float32)

  float32 = "float32"
  string = "string"

  @staticmethod
  def repeat(x, repeats, axis):
    return np.repeat(x, repeats, axis=axis)


class max_logging:
  log = staticmethod(print)


# input_pipeline/utils.py
class PadToMaxLength(grain.python.MapTransform):
  """Pads each input to the specified length"""

  def __init__(self, audio_max_length, hubert_max_length, f0_max_length, spec_max_length):
    self.audio_max_length = audio_max_length
    self.hubert_max_length = hubert_max_length
    self.f0_max_length = f0_max_length
    self.spec_max_length = spec_max_length

  def map(self, data):
    """map to each element"""

    def pad_audio(x, max_length):
      pad_amount = max(max_length - x.shape[0], 0)
      pad_amount = [(0, pad_amount)]
      return np.pad(x, pad_amount)
    def pad_hubert(x, max_length):
      pad_amount = max(max_length - x.shape[0], 0)
      return np.pad(x, ((0,pad_amount),(0,0)))
    def pad_f0(x, max_length):
      pad_amount = max(max_length - x.shape[0], 0)
      return np.pad(x, ((0,pad_amount)))
    def pad_spec(x, max_length):
      pad_amount = max(max_length - x.shape[0], 0)
      return np.pad(x, ((0,pad_amount),(0,0)))

    data["audio"] = pad_audio(data["audio"], self.audio_max_length)
    data["hubert_feature"] = pad_hubert(data["hubert_feature"], self.hubert_max_length)
    data["f0_feature"] = pad_f0(data["f0_feature"], self.f0_max_length)
    data["spec_feature"] = pad_spec(data["spec_feature"], self.spec_max_length)
    return data


class ParseFeatures(grain.python.MapTransform):
  def __init__(self, hp):
    self.hp = hp
  def speaker2id(self,key):
    reader = csv.reader(open(self.hp.data.speaker_files, 'r'))
    for row in reader:
      if row[0].lower() == key:
        return int(row[1])
    raise Exception("Speaker Not Found")
  def map(self, features):
    def _parse(example):
      parsed = tf.io.parse_example(example, {
        "audio": tf.io.FixedLenFeature([], dtype=tf.string),
        "spec_feature": tf.io.FixedLenFeature([], dtype=tf.string),
        "f0_feature": tf.io.FixedLenFeature([], dtype=tf.string),
        "hubert_feature": tf.io.FixedLenFeature([], dtype=tf.string),
        "speaker": tf.io.FixedLenFeature([], dtype=tf.string)
        })
      return parsed
    example = _parse(features)
    audio = tf.io.parse_tensor(example["audio"],tf.float32)
    hubert_feature = tf.io.parse_tensor(example["hubert_feature"],tf.float32)
    f0_feature = tf.io.parse_tensor(example["f0_feature"],tf.float32)
    spec_feature = tf.io.parse_tensor(example["spec_feature"],tf.float32)
    hubert_feature = tf.repeat(hubert_feature,repeats=2,axis=0)
    lmin = min(hubert_feature.shape[0], spec_feature.shape[0])
    hubert_feature = hubert_feature[:lmin]
    f0_feature = f0_feature[:lmin]
    spec_feature = spec_feature[:lmin]
    return {
        "audio": audio,
        "audio_length":audio.shape[0],
        "hubert_feature": hubert_feature,
        "hubert_length":hubert_feature.shape[0],
        "f0_feature": f0_feature,
        "f0_length": f0_feature.shape[0],
        "spec_feature":spec_feature,
        "spec_length": spec_feature.shape[0],
        "speaker_id":self.speaker2id(example["speaker"])
    }


# input_pipeline/multihost_dataloading.py
def _build_global_shape_and_sharding(local_shape, global_mesh):
  sharding = NamedSharding(global_mesh, PartitionSpec(global_mesh.axis_names))
  global_shape = (jax.process_count() * local_shape[0],) + local_shape[1:]
  return global_shape, sharding


def _form_global_array(path, array: np.ndarray, global_mesh: Mesh) -> jax.Array:
  global_shape, sharding = _build_global_shape_and_sharding(np.shape(array), global_mesh)
  try:
    local_device_arrays = np.split(array, len(global_mesh.local_devices), axis=0)
  except ValueError as array_split_error:
    raise ValueError(
        f"Unable to put to devices shape {array.shape} with "
        f"local device count {len(global_mesh.local_devices)} "
        f"at {jtu.keystr(path)}"
    ) from array_split_error
  local_device_buffers = jax.device_put(local_device_arrays, global_mesh.local_devices)
  return jax.make_array_from_single_device_arrays(global_shape, sharding, local_device_buffers)


def get_next_batch_sharded(local_iterator: Iterator, global_mesh: Mesh) -> jax.Array:
  SLEEP_TIME = 10
  MAX_DATA_LOAD_ATTEMPTS = 30
  data_load_attempts = 0
  loaded_data_success = False
  while not loaded_data_success and data_load_attempts < MAX_DATA_LOAD_ATTEMPTS:
    data_load_attempts += 1
    try:
      local_data = next(local_iterator)
      loaded_data_success = True
    except tf.errors.FailedPreconditionError:
      max_logging.log("Failed to get next data batch, retrying")
      time.sleep(SLEEP_TIME)
  if not loaded_data_success:
    local_data = next(local_iterator)
  input_gdas = jtu.tree_map_with_path(partial(_form_global_array, global_mesh=global_mesh), local_data)
  return input_gdas


class MultiHostDataLoadIterator:
  def __init__(self, dataloader: Union[tf.data.Dataset, grain.DataLoader], global_mesh: Mesh):
    self.global_mesh = global_mesh
    self.dataloader = dataloader
    if isinstance(self.dataloader, tf.data.Dataset):
      self.local_iterator = self.dataloader.as_numpy_iterator()
    elif isinstance(self.dataloader, Iterable):
      self.local_iterator = iter(self.dataloader)
    else:
      raise ValueError("Type error: dataloader should be either tf.data.Dataset or Iterable.")

  def reset(self):
    if isinstance(self.dataloader, tf.data.Dataset):
      self.local_iterator = self.dataloader.as_numpy_iterator()
    elif isinstance(self.dataloader, Iterable):
      self.local_iterator = iter(self.dataloader)
    else:
      raise ValueError("Type error: dataloader should be either tf.data.Dataset or grain.DataLoader.")

  def __iter__(self):
    self.reset()
    return self

  def __next__(self):
    return get_next_batch_sharded(self.local_iterator, self.global_mesh)


# input_pipeline/dataset.py
def get_dataset(hp,mesh):
    data_files = glob.glob(hp.data_loader.dataset_path)
    dataset = grain.python.ArrayRecordDataSource(data_files)
    index_sampler = grain.python.IndexSampler(
      num_records=len(dataset),
      num_epochs=hp.data_loader.num_epochs,
      shard_options=grain.python.ShardOptions(
          shard_index=jax.process_index(), shard_count=hp.data_loader.host_number, drop_remainder=False
      ),
      shuffle=True,
      seed=0,
    )
    operations = []
    operations.append(ParseFeatures(hp))
    operations.append(PadToMaxLength(30*32000,3000,3000,3000))
    operations.append(grain.python.Batch(batch_size=hp.data_loader.global_batch_size // jax.process_count(), drop_remainder=False))
    dataloader = grain.python.DataLoader(
        data_source=dataset,
        operations=operations,
        sampler=index_sampler,
        worker_count=hp.data_loader.worker_count
    )
    multihost_gen = multihost_dataloading.MultiHostDataLoadIterator(dataloader, mesh)
    return multihost_gen


multihost_dataloading = type("multihost_dataloading", (), {"MultiHostDataLoadIterator": MultiHostDataLoadIterator})


def summary(batch):
  return {k: [list(v.shape), str(v.dtype), float(np.asarray(v, np.float64).sum())] for k, v in sorted(batch.items())}


def drain(it):  # `for b in it` would call __iter__, which resets the iterator.
  out = []
  while True:
    try:
      out.append(summary(next(it)))
    except StopIteration:
      return out


ns = lambda **kw: type("hp", (), kw)
hp = ns(data_loader=ns(dataset_path=PATTERN, num_epochs=2, host_number=1, global_batch_size=3, worker_count=WORKERS),
        data=ns(speaker_files=SPEAKERS))
mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
gen = get_dataset(hp, mesh)
results = {"is_dataloader": isinstance(gen.dataloader, grain.python.DataLoader),
           "len_source": len(gen.dataloader._data_source)}
it = iter(gen)
head = [summary(next(it)) for _ in range(2)]
state = gen.local_iterator.get_state()
rest = drain(it)
results.update(head=head, state=state, rest=rest)
gen2 = get_dataset(hp, mesh)
it2 = iter(gen2)
gen2.local_iterator.set_state(state)
results["restored"] = drain(it2)
if FOREIGN is not None:  # The state Grain saved, restored here.
  gen3 = get_dataset(hp, mesh)
  it3 = iter(gen3)
  gen3.local_iterator.set_state(FOREIGN)
  results["foreign"] = drain(it3)
results["again"] = summary(next(iter(gen)))  # __iter__ resets: a new DataLoader iterator.
try:
  MultiHostDataLoadIterator(42, mesh)
except ValueError as e:
  results["not_iterable"] = str(e)
'''


def _so_vits_records(directory):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  names = ["alice", "bob", "carol"]
  with open(os.path.join(directory, "speakers.csv"), "w", encoding="utf-8") as f:
    for i, n in enumerate(names):
      f.write(f"{n.upper()},{i + 10}\n")
  k = 0
  for s in range(2):
    w = ArrayRecordWriter(os.path.join(directory, f"svc-{s}.array_record"), "group_size:1")
    for _ in range(4):
      n = int(rng.integers(3, 6))
      w.write(pickle.dumps({
          "audio": rng.random(n * 4).astype(np.float32), "hubert_feature": rng.random((n, 2)).astype(np.float32),
          "f0_feature": rng.random(2 * n + 1).astype(np.float32),
          "spec_feature": rng.random((2 * n - 1, 3)).astype(np.float32), "speaker": names[k % 3]}))
      k += 1
    w.close()
  return {"PATTERN": os.path.join(directory, "*.array_record"), "SPEAKERS": os.path.join(directory, "speakers.csv")}


def test_so_vits_svc_array_record_data_loader_and_multihost_iterator_as_on_grain(tmp_path):
  inputs = _so_vits_records(tmp_path)
  g = porting.run(SO_VITS, "grain", WORKERS=0, FOREIGN=None, **inputs).results
  # `import grain.python` binds `grain`; its port is `import loader.python`
  # (the `import grain` line below it becomes `import loader as grain`).
  ported = SO_VITS.replace("import grain.python\n", "import loader.python\n")
  l = porting.run(ported, "loader", WORKERS=0, FOREIGN=g["state"], **inputs).results
  g, l = porting.grain_keys(g), porting.grain_keys(l)
  g_state, l_state = json.loads(bytes(g.pop("state"))), json.loads(bytes(l.pop("state")))
  # README (`DataLoader`): an ArrayRecordDataSource is named in the state by
  # loader's repr; loader restores Grain's (`foreign`).
  assert g_state.pop("data_source").startswith("ArrayRecordDataSource(hash_of_paths=")
  assert "files_hash=" in l_state.pop("data_source")
  assert porting.grain_keys(l_state) == g_state
  assert g_state["last_seen_indices"] == {"0": 5} and "num_epochs=2" in g_state["sampler"]
  assert l.pop("foreign") == g["restored"] == g["rest"]
  assert l == g
  assert g["is_dataloader"] and g["len_source"] == 8 and len(g["head"] + g["rest"]) == 6
  assert g["head"][0]["audio"][0] == [3, 960000] and g["head"][0]["speaker_id"][1] == "int32"
  assert g["again"] == g["head"][0]
  assert g["not_iterable"] == "Type error: dataloader should be either tf.data.Dataset or Iterable."



# jax_dataset.py as written and the trainer's data loaders and checkpointing;
# `main` runs five steps, reads on, then resumes a fresh trainer.
RIBONANZA = r'''
import json
import os

import h5py
import numpy as np
import orbax.checkpoint as ocp
import grain
import grain.checkpoint
import grain.sharding


# jax_dataset.py (RNADataSource, flip, AddNoise, AddLabels, RandomFlip, PadToMaxLen, make_data_loader)
class RNADataSource(grain.sources.RandomAccessDataSource):
    def __init__(
        self,
        hdf_file_paths: list[str],
        indices,
        load_r_norm_err: bool,
    ):
        self.hdf_file_paths = hdf_file_paths
        self.hdf_files = [None] * len(hdf_file_paths)
        self.load_r_norm_err = load_r_norm_err

        self.indices = indices
        self.tokens = {nt: i for i, nt in enumerate("ACGU")}
        self.tokens["P"] = 4  # Padding token

    def _open_hdf5_file(self, file_index):
        if self.hdf_files[file_index] is None:
            self.hdf_files[file_index] = h5py.File(self.hdf_file_paths[file_index], "r")
        return self.hdf_files[file_index]

    def __repr__(self):
        # grain's Orbax checkpoint integration requires that the repr
        # match when restoring.
        return "RNADataSource"

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, idx):
        hdf_file_index, index = self.indices[idx]

        hdf_file = self._open_hdf5_file(hdf_file_index)

        sequence = hdf_file["sequences"][0, index].decode("utf-8")
        sequence = [self.tokens[nt] for nt in sequence]
        sequence = np.array(sequence, dtype=np.int32)

        seq_length = len(sequence)

        r_norm = hdf_file["r_norm"][index, :seq_length][:]

        if self.load_r_norm_err:
            r_norm_err = hdf_file["r_norm_err"][index, :seq_length][:]
        else:
            r_norm_err = None

        signal_to_noise = hdf_file["signal_to_noise"][index][:]

        data = {
            "sequence": sequence,
            "r_norm": r_norm,
            "r_norm_err": r_norm_err,
            "hdf_file_index": hdf_file_index,
            "signal_to_noise": signal_to_noise,
        }

        return data


def flip(data):
    """Flips an example, must be called after `AddLabels`."""
    data = data.copy()
    data["sequence"] = data["sequence"].flip(-1).copy(order="C")
    data["labels"] = data["labels"].flip(-2).copy(order="C")
    data["loss_masks"] = data["loss_masks"].flip(-2).copy(order="C")
    return data


class AddNoise(grain.transforms.RandomMap):
    """Adds random noise, must specify `load_r_norm_err=True`.

    Must be used before `AddLabels`."""

    def random_map(self, data, rng: np.random.Generator):
        data = data.copy()
        r_norm = data["r_norm"]
        r_norm_err = data.pop("r_norm_err")

        data["r_norm"] = r_norm + rng.normal(0, 1, r_norm_err.shape) * r_norm_err
        return data


class AddLabels(grain.transforms.Map):
    """Converts r_norm_err into the labels and loss_masks."""

    def __init__(self, num_hdf_files: int):
        self.num_hdf_files = num_hdf_files

    def map(self, data):
        num_hdf_files = self.num_hdf_files
        hdf_file_index = data["hdf_file_index"]
        signal_to_noise = data["signal_to_noise"]
        seq_length = len(data["sequence"])
        labels = np.full((seq_length, 2 * num_hdf_files), np.nan, dtype=np.float32)
        labels_experiment = data["r_norm"]
        labels[:, hdf_file_index * 2 : hdf_file_index * 2 + 2] = labels_experiment
        loss_mask = labels == labels  # mask nan labels

        label_mask = labels != labels

        labels[label_mask] = 0

        labels = labels.clip(0, 1)

        mask = np.ones(seq_length, dtype=np.int32)

        SN = np.zeros(self.num_hdf_files * 2, dtype=np.float32)
        SN[hdf_file_index * 2 : hdf_file_index * 2 + 2] = signal_to_noise

        return {
            "sequence": data["sequence"],
            "labels": labels,
            "masks": mask,
            "loss_masks": loss_mask,
            "SN": SN,
        }


class RandomFlip(grain.transforms.RandomMap):
    def random_map(self, data, rng: np.random.Generator):
        if rng.uniform() > 0.5:
            return flip(data)
        return data


class PadToMaxLen(grain.transforms.Map):
    def __init__(self, max_len: int):
        self.max_len = max_len

    def map(self, data):
        sequence = data["sequence"]
        labels = data["labels"]
        masks = data["masks"]
        loss_masks = data["loss_masks"]
        SN = data["SN"]

        seq_length = len(sequence)

        max_len = self.max_len
        assert max_len >= seq_length

        pad_len = max_len - seq_length
        pad_token_id = 4

        data = {
            "sequence": np.pad(sequence, (0, pad_len), constant_values=pad_token_id),
            "labels": np.pad(labels, ((0, pad_len), (0, 0)), constant_values=0),
            "masks": np.pad(masks, (0, pad_len), constant_values=0),
            "loss_masks": np.pad(loss_masks, ((0, pad_len), (0, 0)), constant_values=0),
            "SN": SN,
            "length": np.array(seq_length, dtype=np.int32),
        }
        return data


def make_data_loader(
    hdf_file_paths,
    indices,
    add_noise: bool,
    random_flip: bool,
    max_len: int,
    batch_size: int,
    shuffle: bool,
    shard_options: grain.sharding.ShardOptions,
    seed: int = 0,
    epochs: int | None = None,
):
    cpu_count = os.cpu_count()
    assert cpu_count is not None
    num_workers = min(batch_size // 2, cpu_count // 2, 8)

    if num_workers <= 0:
        num_workers = 1

    transformations = []
    if add_noise:
        transformations.append(AddNoise())
    transformations.append(AddLabels(num_hdf_files=len(hdf_file_paths)))
    if random_flip:
        transformations.append(RandomFlip())
    transformations.append(PadToMaxLen(max_len=max_len))
    return grain.load(
        source=RNADataSource(
            hdf_file_paths,
            indices,
            load_r_norm_err=add_noise,
        ),
        num_epochs=epochs,
        shuffle=shuffle,
        seed=0,
        transformations=transformations,
        batch_size=batch_size,
        worker_count=num_workers,
        shard_options=shard_options,
    )


jax_dataset = type("jax_dataset", (), {"make_data_loader": staticmethod(make_data_loader)})


class nnx:  # Stand-in: the checkpointed state is a dict of numpy arrays here.
    state = staticmethod(lambda x: x)

    @staticmethod
    def update(target, source):
        target.update(source)


# train.py: the Trainer's data loaders and checkpointing (the model, the optimizer and
# the jitted steps are left out; a "step" counter and a running loss stand in).
def get_train_and_validation_data_loaders(config, hdf_file_paths, train_indices, val_indices):
    global_batch_size = config.batch_size
    global_test_batch_size = config.test_batch_size
    process_batch_size = global_batch_size // 1
    process_test_batch_size = global_test_batch_size // 1

    shard_options_train = grain.sharding.ShardOptions(
        shard_index=0,
        shard_count=1,
        drop_remainder=True,
    )
    shard_options_val = grain.sharding.ShardOptions(
        shard_index=0,
        shard_count=1,
        drop_remainder=True,
    )
    train_loader = jax_dataset.make_data_loader(
        hdf_file_paths=hdf_file_paths,
        indices=train_indices,
        random_flip=config.use_flip_aug,
        add_noise=config.use_noise_aug,
        batch_size=process_batch_size,
        shuffle=getattr(config, "shuffle_training_data", True),
        max_len=config.max_len,
        shard_options=shard_options_train,  # For Grain
    )

    val_loader = jax_dataset.make_data_loader(
        hdf_file_paths=hdf_file_paths,
        indices=val_indices,
        random_flip=False,
        add_noise=False,
        shuffle=False,
        epochs=1,
        max_len=config.max_len,
        batch_size=process_test_batch_size,
        shard_options=shard_options_val,  # For Grain
    )
    batches_per_epoch = len(train_indices) // global_batch_size
    return train_loader, val_loader, batches_per_epoch


class Trainer:
    def __init__(self, config, *data):
        self.config = config
        train_loader, self.val_loader, self.batches_per_epoch = get_train_and_validation_data_loaders(config, *data)
        self.checkpoint_manager = ocp.CheckpointManager(
            directory=getattr(
                config, "checkpoint_directory", os.path.abspath("checkpoints")
            ),
            options=ocp.CheckpointManagerOptions(
                create=True,
                save_interval_steps=config.log_interval,
                best_fn=lambda metrics: -metrics["validation_loss"],
            ),
        )
        self.train_state = {"step": np.zeros((), np.int32), "loss_sum": np.zeros((), np.float64)}
        self.training_data_loader = iter(train_loader)
        self.validation_loss = 0.0

    def _get_checkpoint_state(self):
        return self.train_state

    def restore_checkpoint(self):
        latest_step = self.checkpoint_manager.latest_step()
        if latest_step is not None:
            checkpoint_state = self._get_checkpoint_state()
            restored = self.checkpoint_manager.restore(
                step=latest_step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(nnx.state(checkpoint_state)),
                    training_data_input=grain.checkpoint.CheckpointSave(
                        self.training_data_loader
                    ),
                ),
            )
            self.training_data_loader = restored.training_data_input
            nnx.update(checkpoint_state, restored.state)

    def save_checkpoint(self):
        checkpoint_state = self._get_checkpoint_state()
        self.checkpoint_manager.save(
            step=int(self.train_state["step"]),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(nnx.state(checkpoint_state)),
                training_data_input=grain.checkpoint.CheckpointRestore(
                    self.training_data_loader
                ),
            ),
            metrics={
                "training_loss": float(self.train_state["loss_sum"]),
                "validation_loss": float(self.validation_loss),
            },
        )

    def run_training(self, max_steps):
        seen = []
        for local_batch in self.training_data_loader:
            self.train_state["step"] = self.train_state["step"] + 1
            self.train_state["loss_sum"] = self.train_state["loss_sum"] + float(local_batch["labels"].sum())
            seen.append(summary(local_batch))
            step = int(self.train_state["step"])
            if (step % self.batches_per_epoch) == 0:
                self.run_validation()
            self.save_checkpoint()
            if step == max_steps:
                break
        self.checkpoint_manager.wait_until_finished()
        return seen

    def run_validation(self):
        self.validation_loss = float(sum(float(b["labels"].sum()) for b in self.val_loader))


def summary(batch):
    return {k: [list(v.shape), str(v.dtype), round(float(np.asarray(v, np.float64).sum()), 4)]
            for k, v in sorted(batch.items())}


# main(): a run of five steps (a checkpoint every second step, validation at
# the end of the epoch), the stream after it, then a fresh trainer resumed from
# the newest checkpoint; and the module's `RandomFlip` on (its `flip` calls
# `.flip` on numpy arrays).
data_dir = DATA_DIR
hdf_file_paths = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".hdf5"))
all_indices = [(f, i) for f in range(len(hdf_file_paths)) for i in range(6)]
train_indices, val_indices = all_indices[:9], all_indices[9:]
config = type("config", (), dict(batch_size=2, test_batch_size=3, use_flip_aug=False, use_noise_aug=True,
                                 max_len=8, log_interval=2, checkpoint_directory=CKPT))
trainer = Trainer(config, hdf_file_paths, train_indices, val_indices)
results = {"batches_per_epoch": trainer.batches_per_epoch,
           "is_data_loader": isinstance(trainer.training_data_loader, grain.DataLoaderIterator)}
results["first_run"] = trainer.run_training(max_steps=5)
results["steps"] = sorted(trainer.checkpoint_manager.all_steps())
results["best"] = trainer.checkpoint_manager.best_step()
results["validation_loss"] = round(trainer.validation_loss, 3)
results["rest"] = [summary(next(trainer.training_data_loader)) for _ in range(4)]
step_dir = os.path.join(CKPT, str(trainer.checkpoint_manager.latest_step()), "training_data_input")
results["files"] = sorted(os.listdir(step_dir))
results["saved_state"] = json.loads(open(os.path.join(step_dir, "process_0-of-1.json")).read())
resumed = Trainer(config, hdf_file_paths, train_indices, val_indices)
before = resumed.training_data_loader
resumed.restore_checkpoint()
results["resumed_step"] = int(resumed.train_state["step"])
results["restored_in_place"] = resumed.training_data_loader is before
results["resumed"] = [summary(next(resumed.training_data_loader)) for _ in range(4)]
flipped = jax_dataset.make_data_loader(hdf_file_paths, train_indices, add_noise=False, random_flip=True, max_len=8,
                                       batch_size=2, shuffle=True, shard_options=grain.sharding.NoSharding())
try:
    results["flipped"] = [summary(b) for b in flipped]
except Exception as e:
    results["flip_error"] = [type(e).__name__, str(e)]
'''


def _ribonanza_port(source):
  # `import grain.checkpoint` / `import grain.sharding` bind `grain`, so their
  # port is `import loader as grain` (loader's `checkpoint` and `sharding`).
  for module in ("checkpoint", "sharding"):
    source = source.replace(f"import grain.{module}\n", f"import loader as grain  # import grain.{module}\n")
  return source


def _ribonanza_files(directory):
  import h5py  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  for f in range(2):
    with h5py.File(os.path.join(directory, f"rn{f}.hdf5"), "w") as h:
      seqs = ["".join(rng.choice(list("ACGU"), int(rng.integers(3, 8)))) for _ in range(6)]
      h.create_dataset("sequences", data=np.array([[s.encode() for s in seqs]], dtype="S8"))
      h.create_dataset("r_norm", data=rng.random((6, 8, 2)).astype(np.float32))
      h.create_dataset("r_norm_err", data=(rng.random((6, 8, 2)) * 0.1).astype(np.float32))
      h.create_dataset("signal_to_noise", data=rng.random((6, 2)).astype(np.float32))


def test_ribonanza_grain_load_and_orbax_checkpoints_with_swapped_args_as_on_grain(tmp_path):
  _ribonanza_files(tmp_path)
  out = {}
  for lib in porting.LIBS:
    (tmp_path / lib).mkdir()
    source = RIBONANZA if lib == "grain" else _ribonanza_port(RIBONANZA)
    out[lib] = porting.grain_keys(porting.run(source, lib, DATA_DIR=str(tmp_path), CKPT=str(tmp_path / lib)).results)
  g, l = out["grain"], out["loader"]
  g_state, l_state = g.pop("saved_state"), porting.grain_keys(l.pop("saved_state"))
  assert {k: v for k, v in l_state.items() if k != "worker_count"} == {
      k: v for k, v in g_state.items() if k != "worker_count"}
  assert g_state["data_source"] == "RNADataSource" and g_state["last_seen_indices"] == {"0": 7}
  assert l == g
  assert g["is_data_loader"] and g["restored_in_place"] and "process_0-of-1.json" in g["files"]
  assert g["steps"] == [1, 2, 4] and g["resumed_step"] == 4
  assert g["resumed"] == g["first_run"][4:] + g["rest"][:3]
  assert g["flip_error"] == ["AttributeError", "'numpy.ndarray' object has no attribute 'flip'"]



# The loader, the builders and the sources as written (configs folded into
# constructor arguments); the streaming source keeps the epoch its cursor
# reaches, which `_find_epoch_source` looks for.
TORCHTITAN_LOADER = r'''
import json
import os
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import grain.python as grain
from grain import experimental as grain_experimental
import numpy as np


# torchtitan/components/data/types.py (the fields the recipes read)
@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetIterationPolicy:
    seed: int
    shuffle: bool
    repeat: bool
    dp_rank: int
    dp_world_size: int
    streaming_shuffle_buffer_size: int = 1_000


# A stand-in for a Hugging Face streaming `IterableDataset` (not installed here):
# rows in order, reshuffled by `set_epoch`, a cursor in `state_dict()`.
class FakeStream:
    def __init__(self, rows):
        self._rows = rows
        self._epoch = 0
        self._pos = 0

    def set_epoch(self, epoch):
        self._epoch = epoch

    def state_dict(self):
        return {"pos": self._pos, "epoch": self._epoch}

    def load_state_dict(self, state):
        self._pos = state["pos"]

    def __iter__(self):
        order = range(len(self._rows))
        if self._epoch:
            order = np.random.default_rng(self._epoch).permutation(len(self._rows))
        while self._pos < len(self._rows):
            row = self._rows[int(order[self._pos])]
            self._pos += 1
            yield row


# torchtitan/components/data/sources.py: `IndexedJsonlSource` (its config folded into
# the constructor) and the streaming source's cursor iterator, as written; the
# streaming node keeps the epoch the walk in `_find_epoch_source` looks for.
class IndexedJsonlSource:
    """Provides random access to JSONL rows through compact byte offsets."""

    def __init__(self, paths) -> None:
        self._paths = tuple(paths)
        self._path_ids = array("I")
        self._byte_offsets = array("Q")
        for path_id, path in enumerate(self._paths):
            with open(path, "rb") as file:
                while True:
                    offset = file.tell()
                    line = file.readline()
                    if not line:
                        break
                    if line.strip():
                        self._path_ids.append(path_id)
                        self._byte_offsets.append(offset)

    def __len__(self) -> int:
        return len(self._byte_offsets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        if index < 0 or index >= len(self):
            raise IndexError(index)
        path = self._paths[self._path_ids[index]]
        with open(path, "rb") as file:
            file.seek(self._byte_offsets[index])
            return json.loads(file.readline())


class _HuggingFaceStreamingIterDataset(grain.IterDataset):
    def __init__(self, dataset, *, repeat: bool, shuffle: bool) -> None:
        self._dataset = dataset
        self._repeat = repeat
        self._shuffle = shuffle
        self.current_epoch = 0
        super().__init__()

    def __iter__(self) -> grain.DatasetIterator:
        return _HuggingFaceCursorIterator(self._dataset, repeat=self._repeat, shuffle=self._shuffle, owner=self)


class _HuggingFaceCursorIterator(grain.DatasetIterator):
    """Exposes a Hugging Face streaming cursor to Grain checkpoint recursion."""

    def __init__(self, dataset, *, repeat: bool, shuffle: bool, owner=None) -> None:
        super().__init__()
        self._dataset = dataset
        self._repeat = repeat
        self._shuffle = shuffle
        self._epoch = 0
        self._owner = owner
        self._initial_state = dataset.state_dict()
        self._iterator = iter(dataset)

    def __next__(self) -> dict[str, Any]:
        try:
            return next(self._iterator)
        except StopIteration:
            if not self._repeat:
                raise
            self._epoch += 1
            if self._owner is not None:
                self._owner.current_epoch = self._epoch
            if self._shuffle:
                self._dataset.set_epoch(self._epoch)
            self._dataset.load_state_dict(self._initial_state)
            self._iterator = iter(self._dataset)
            return next(self._iterator)

    def get_state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "hf": self._dataset.state_dict(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._epoch = state["epoch"]
        if self._shuffle:
            self._dataset.set_epoch(self._epoch)
        self._dataset.load_state_dict(state["hf"])
        self._iterator = iter(self._dataset)


# torchtitan/components/data/loader.py (5b1a6e4), as written.
class DataloaderExhaustedError(Exception):
    """An exception that indicates dataloader exhaustion."""

    pass


def _find_epoch_source(dataset: Any) -> Any | None:
    """Return the pipeline node that tracks epoch completion, if any."""
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(getattr(node, "current_epoch", None), int):
            return node
        parents = getattr(node, "parents", None)
        if parents is not None:
            stack.extend(parents)
    return None


class _TokenBudgetBatchIterator(grain.DatasetIterator):
    """Accumulate rows until the next row would exceed a token budget."""

    def __init__(
        self,
        parent: grain.DatasetIterator,
        *,
        batch_fn,
        row_cost,
        token_budget: int,
    ) -> None:
        super().__init__(parent)
        self._batch_fn = batch_fn
        self._row_cost = row_cost
        self._token_budget = token_budget
        self._buffered_row: Any | None = None
        self._resume_state = self._parent.get_state()

    def __next__(self):
        rows: list[Any] = []
        total_cost = 0
        if self._buffered_row is not None:
            rows.append(self._buffered_row)
            total_cost = self._row_cost(self._buffered_row)
            self._buffered_row = None
        resume_state = None
        while True:
            pre_pull_state = self._parent.get_state()
            try:
                row = next(self._parent)
            except StopIteration:
                resume_state = self._parent.get_state()
                break
            cost = self._row_cost(row)
            if rows and total_cost + cost > self._token_budget:
                self._buffered_row = row
                resume_state = pre_pull_state
                break
            rows.append(row)
            total_cost += cost
        if not rows:
            raise StopIteration
        self._resume_state = resume_state
        with self._stats.record_self_time():
            return self._stats.record_output_spec(self._batch_fn(rows))

    def get_state(self):
        return self._resume_state

    def set_state(self, state) -> None:
        self._buffered_row = None
        self._parent.set_state(state)
        self._resume_state = self._parent.get_state()


class _TokenBudgetBatchIterDataset(grain.IterDataset):
    """Batch rows by a token budget instead of a fixed row count."""

    def __init__(
        self,
        parent: grain.IterDataset,
        *,
        batch_fn,
        row_cost,
        token_budget: int,
    ) -> None:
        super().__init__(parent)
        if token_budget <= 0:
            raise ValueError("token_budget must be positive")
        self._batch_fn = batch_fn
        self._row_cost = row_cost
        self._token_budget = token_budget

    def __iter__(self) -> grain.DatasetIterator:
        return _TokenBudgetBatchIterator(
            self._parent.__iter__(),
            batch_fn=self._batch_fn,
            row_cost=self._row_cost,
            token_budget=self._token_budget,
        )


class GrainDataLoader:
    """Batches and checkpoints one composed Grain dataset graph (its config and
    build context passed in directly; `tyro` / `Configurable` left out)."""

    def __init__(self, dataset, collator, *, repeat, dp_world_size, dp_rank,
                 read_options=None, num_prefetch_batches=2) -> None:
        if dp_world_size > 1 and not repeat:
            raise ValueError(
                "repeat=False with data parallelism can exhaust ranks at different "
                "steps and hang collectives; use repeat=True with a trainer-"
                "controlled step count"
            )
        self._dp_world_size = dp_world_size
        self._rank_id = f"dp_rank_{dp_rank}"
        read_options = read_options or grain.ReadOptions()
        self._epoch_source = _find_epoch_source(dataset)
        if isinstance(dataset, grain.MapDataset):
            dataset = dataset.to_iter_dataset(read_options=read_options)
        row_cost = getattr(collator, "row_cost", None)
        packing_token_budget = getattr(collator, "packing_token_budget", None)
        token_budget = (
            packing_token_budget() if packing_token_budget is not None else None
        )
        if row_cost is not None and token_budget:
            dataset = _TokenBudgetBatchIterDataset(
                dataset,
                batch_fn=collator,
                row_cost=row_cost,
                token_budget=token_budget,
            )
        else:
            dataset = dataset.batch(
                collator.num_rows_per_batch(),
                drop_remainder=repeat,
                batch_fn=collator,
            )
        dataset = grain_experimental.ThreadPrefetchIterDataset(
            dataset, prefetch_buffer_size=num_prefetch_batches
        )
        self._iterator = iter(dataset)

    def __iter__(self) -> Iterator:
        return self._iterator

    @property
    def epochs_completed(self) -> int | None:
        if self._epoch_source is None:
            return None
        return self._epoch_source.current_epoch

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "dp_world_size": self._dp_world_size,
            self._rank_id: self._iterator.get_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if state_dict["version"] != 1:
            raise ValueError(
                f"unsupported GrainDataLoader state version {state_dict['version']}"
            )
        if state_dict["dp_world_size"] != self._dp_world_size:
            raise ValueError(
                "cannot resume after changing the effective data-parallel degree"
            )
        if self._rank_id not in state_dict:
            raise ValueError(
                f"checkpoint is missing dataloader state for {self._rank_id}"
            )
        try:
            self._iterator.set_state(state_dict[self._rank_id])
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        self._iterator.close()


# torchtitan/components/data/dataset.py: SingleDatasetConfig's two builders, as
# written (pre/post filters, a processor taking (sample, rng)).
def build_map(dataset, processor, pre_filters, post_filters, policy):
    for filter_fn in pre_filters:
        dataset = dataset.filter(filter_fn)
    if processor is not None:
        dataset = dataset.random_map(processor, seed=policy.seed)
    for filter_fn in post_filters:
        dataset = dataset.filter(filter_fn)
    if policy.shuffle:
        dataset = dataset.shuffle(seed=policy.seed)
    shard_size, remainder = divmod(len(dataset), policy.dp_world_size)
    shard_start = policy.dp_rank * shard_size + min(policy.dp_rank, remainder)
    shard_stop = shard_start + shard_size
    if policy.dp_rank < remainder:
        shard_stop += 1
    dataset = dataset[shard_start:shard_stop]
    if policy.repeat:
        dataset = dataset.repeat()
    return dataset


def build_iter(dataset, processor, pre_filters, post_filters, policy):
    if policy.shuffle:
        dataset = grain.experimental.WindowShuffleIterDataset(
            dataset,
            window_size=policy.streaming_shuffle_buffer_size,
            seed=policy.seed,
        )
    for filter_fn in pre_filters:
        dataset = dataset.filter(filter_fn)
    if processor is not None:
        dataset = dataset.random_map(processor, seed=policy.seed + policy.dp_rank)
    for filter_fn in post_filters:
        dataset = dataset.filter(filter_fn)
    return dataset


# A collator with a token budget (`row_cost`, `packing_token_budget`), and one without.
class BudgetCollator:
    def __init__(self, budget):
        self._budget = budget

    def row_cost(self, row):
        return len(row["input_ids"])

    def packing_token_budget(self):
        return self._budget

    def __call__(self, rows):
        width = max(len(r["input_ids"]) for r in rows)
        ids = np.zeros((len(rows), width), np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = r["input_ids"]
        return {"input_ids": ids, "doc": np.array([r["doc"] for r in rows])}


class FixedCollator(BudgetCollator):
    row_cost = None
    packing_token_budget = None

    def num_rows_per_batch(self):
        return 3


def tokenize(sample, rng):
    n = len(sample["text"])
    return {"doc": sample["doc"], "input_ids": np.arange(n) + int(rng.integers(0, 100))}


def plain(batch):
    return {"input_ids": batch["input_ids"].tolist(), "doc": batch["doc"].tolist()}


def run(make, steps, resume_at, name):
    loader = make()
    out = {"epoch_source": type(loader._epoch_source).__name__ if loader._epoch_source is not None else None}
    it = iter(loader)
    batches, states = [], []
    for _ in range(steps):
        batches.append(plain(next(it)))
        states.append(loader.state_dict())
    out["batches"] = batches
    out["state"] = states[resume_at - 1]
    out["epochs_completed"] = loader.epochs_completed
    loader.close()
    resumed = make()
    resumed.load_state_dict(states[resume_at - 1])
    out["resumed"] = [plain(next(iter(resumed))) for _ in range(steps - resume_at)]
    resumed.close()
    if FOREIGN is not None:  # The state Grain saved, restored here.
        foreign = make()
        foreign.load_state_dict(FOREIGN[name])
        out["foreign"] = [plain(next(iter(foreign))) for _ in range(steps - resume_at)]
        foreign.close()
    return out


rows = [{"doc": i, "text": "x" * (1 + (7 * i) % 6)} for i in range(11)]
paths = []
for k in range(2):
    paths.append(os.path.join(TMP, f"rows{k}.jsonl"))
    with open(paths[-1], "w") as f:
        for r in rows[k::2]:
            f.write(json.dumps(r) + "\n\n")

results = {}
policy = DatasetIterationPolicy(seed=3, shuffle=True, repeat=True, dp_rank=0, dp_world_size=1,
                                streaming_shuffle_buffer_size=4)
not_short = lambda s: s["doc"] != 4
make_stream = lambda: GrainDataLoader(
    build_iter(_HuggingFaceStreamingIterDataset(FakeStream(rows), repeat=True, shuffle=True), tokenize,
               (not_short,), (lambda s: len(s["input_ids"]) > 1,), policy),
    BudgetCollator(8), repeat=True, dp_world_size=1, dp_rank=0)
results["stream"] = run(make_stream, 12, 5, "stream")
source = IndexedJsonlSource(paths)
results["jsonl"] = [len(source), source[-1], source[3]]
make_map = lambda: GrainDataLoader(
    build_map(grain.MapDataset.source(source), tokenize, (not_short,), (), policy),
    BudgetCollator(9), repeat=True, dp_world_size=1, dp_rank=0, read_options=grain.ReadOptions(num_threads=2))
results["map"] = run(make_map, 10, 4, "map")
finite = replace(policy, repeat=False, shuffle=False)
make_finite = lambda: GrainDataLoader(
    build_map(grain.MapDataset.source(source), tokenize, (), (), finite), FixedCollator(0),
    repeat=False, dp_world_size=1, dp_rank=0)
results["fixed"] = run(make_finite, 3, 2, "fixed")
results["fixed_all"] = [plain(b) for b in iter(make_finite())]
try:
    GrainDataLoader(build_map(grain.MapDataset.source(source), None, (), (), finite), FixedCollator(0),
                    repeat=False, dp_world_size=2, dp_rank=0)
except ValueError as e:
    results["finite_dp"] = str(e)
loader = make_stream()
try:
    loader.load_state_dict({"version": 1, "dp_world_size": 1, "dp_rank_0": {"bogus": 1}})
except Exception as e:
    results["bad_state"] = isinstance(e, KeyError)
try:
    _TokenBudgetBatchIterDataset(grain.MapDataset.range(3).to_iter_dataset(), batch_fn=list, row_cost=len,
                                 token_budget=0)
except ValueError as e:
    results["zero_budget"] = str(e)
'''


def test_torchtitan_token_budget_batches_epoch_walk_and_state_dict_as_on_grain(tmp_path):
  (tmp_path / "grain").mkdir()
  (tmp_path / "loader").mkdir()
  g = porting.run(TORCHTITAN_LOADER, "grain", TMP=str(tmp_path / "grain"), FOREIGN=None).results
  foreign = {name: g[name]["state"] for name in ("stream", "map", "fixed")}
  l = porting.run(TORCHTITAN_LOADER, "loader", TMP=str(tmp_path / "loader"), FOREIGN=foreign).results
  g, l = porting.grain_keys(g), porting.grain_keys(l)
  for name in ("stream", "map", "fixed"):
    assert l[name].pop("foreign") == g[name]["resumed"], name
    assert g[name]["resumed"] == g[name]["batches"][-len(g[name]["resumed"]):], name
  assert l == g
  stream = g["stream"]
  assert stream["epoch_source"] == "_HuggingFaceStreamingIterDataset" and stream["epochs_completed"] == 2
  # The state after batch 5: the window shuffle's spent window, as Grain keeps it.
  assert stream["state"]["dp_rank_0"] == {
      "parent": {"parent_window_start_state": {"epoch": 0, "hf": {"pos": 8, "epoch": 0}}, "window_index": 3,
                 "pos_in_window": 4}, "index_for_rng": 11}
  assert [len(b["doc"]) for b in stream["batches"]] == [2, 2, 2, 2, 1, 1, 1, 2, 3, 1, 1, 1]
  assert g["map"]["epoch_source"] is None and g["map"]["state"]["dp_rank_0"] == {"next_index": 11}
  assert [len(b["doc"]) for b in g["fixed_all"]] == [3, 3, 3, 2]
  assert g["jsonl"][0] == 11 and g["bad_state"] is True
  assert g["zero_budget"] == "token_budget must be positive" and "repeat=False" in g["finite_dp"]



# torchtitan/components/data/packing.py's recipes as written, over a child
# recipe of in-memory `TextSequence`s (some already packed: two documents).
TORCHTITAN_PACKING = r'''
from dataclasses import dataclass
from functools import partial
from typing import Any

import grain.python as grain
import numpy as np

IGNORE_INDEX = -100  # torchtitan.components.loss


@dataclass(frozen=True, kw_only=True, slots=True)
class TextSequence:  # torchtitan/components/data/dataset.py (this version's fields)
    input_ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray | None = None
    padding_mask: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetBuildContext:  # the fields the packing recipes read
    read_options: Any
    max_context_length: int
    num_tokens_per_batch: int
    max_num_documents: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetIterationPolicy:
    seed: int
    shuffle: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ListDatasetConfig:  # a child recipe: a MapDataset over in-memory TextSequences
    rows: tuple

    def build(self, *, context, dataset_iteration_policy):
        return grain.MapDataset.source(list(self.rows))


# torchtitan/components/data/packing.py, as written.
@dataclass(frozen=True, kw_only=True, slots=True)
class ConcatThenSplitPackingConfig:
    """Concatenates documents, chunking them into fixed-length rows."""

    dataset: Any

    def build(
        self,
        *,
        context: DatasetBuildContext,
        dataset_iteration_policy: DatasetIterationPolicy,
    ) -> grain.IterDataset:
        dataset = self.dataset.build(
            context=context,
            dataset_iteration_policy=dataset_iteration_policy,
        )
        if context.max_num_documents is not None:
            if isinstance(dataset, grain.MapDataset):
                dataset = dataset.to_iter_dataset(read_options=context.read_options)
            return _DocumentAwareConcatThenSplitIterDataset(
                dataset,
                max_num_documents_per_row=context.max_num_documents,
                max_context_length=context.max_context_length,
                num_tokens_per_row=context.num_tokens_per_batch,
            )
        dataset = dataset.map(
            partial(
                _text_sequence_to_packing_input,
                max_context_length=context.max_context_length,
            )
        )
        if isinstance(dataset, grain.MapDataset):
            dataset = dataset.to_iter_dataset(read_options=context.read_options)
        dataset = grain.experimental.ConcatThenSplitIterDataset(
            dataset,
            length_struct={
                "input_ids": context.num_tokens_per_batch,
                "labels": context.num_tokens_per_batch,
                "positions": context.num_tokens_per_batch,
                "padding_mask": context.num_tokens_per_batch,
            },
        )
        dataset = dataset.filter(_packing_output_is_full)
        return dataset.map(
            partial(
                _packing_output_to_text_sequence,
                max_context_length=context.max_context_length,
            )
        )


class _DocumentAwareConcatThenSplitIterDataset(grain.IterDataset):
    """Concat-then-split packing with a document-segment capacity."""

    def __init__(
        self,
        parent: grain.IterDataset,
        *,
        max_num_documents_per_row: int,
        max_context_length: int,
        num_tokens_per_row: int,
    ) -> None:
        super().__init__(parent)
        self._max_num_documents_per_row = max_num_documents_per_row
        self._max_context_length = max_context_length
        self._num_tokens_per_row = num_tokens_per_row

    def __iter__(self) -> grain.DatasetIterator:
        return _DocumentAwareConcatThenSplitIterator(
            iter(self._parent),
            max_num_documents_per_row=self._max_num_documents_per_row,
            max_context_length=self._max_context_length,
            num_tokens_per_row=self._num_tokens_per_row,
        )


class _DocumentAwareConcatThenSplitIterator(grain.DatasetIterator):
    """Build fixed-size rows while preserving document order and remainders."""

    def __init__(
        self,
        parent: grain.DatasetIterator,
        *,
        max_num_documents_per_row: int,
        max_context_length: int,
        num_tokens_per_row: int,
    ) -> None:
        super().__init__(parent)
        self._max_num_documents_per_row = max_num_documents_per_row
        self._max_context_length = max_context_length
        self._num_tokens_per_row = num_tokens_per_row
        self._remainder: TextSequence | None = None
        self._remainder_parent_state: dict[str, Any] | None = None
        self._remainder_offset = 0
        self._finished = False

    def __next__(self) -> TextSequence:
        self._assert_not_closed()
        if self._finished:
            raise StopIteration

        input_parts: list[np.ndarray] = []
        label_parts: list[np.ndarray] = []
        position_parts: list[np.ndarray] = []
        num_tokens = 0

        while (
            num_tokens < self._num_tokens_per_row
            and len(position_parts) < self._max_num_documents_per_row
        ):
            if self._remainder is None:
                parent_state = self._parent.get_state()
                try:
                    sequence = next(self._parent)
                except StopIteration:
                    self._finished = True
                    break
                if len(sequence.input_ids) == 0:
                    continue
                self._remainder = sequence
                self._remainder_parent_state = parent_state
                self._remainder_offset = 0

            sequence = self._remainder
            assert sequence is not None
            source_positions = (
                None if sequence.positions is None else np.asarray(sequence.positions)
            )
            segment_end = _next_document_chunk_end(
                num_tokens=len(sequence.input_ids),
                positions=source_positions,
                start=self._remainder_offset,
                max_context_length=self._max_context_length,
            )
            available_tokens = self._num_tokens_per_row - num_tokens
            num_segment_tokens = min(
                segment_end - self._remainder_offset,
                available_tokens,
            )

            token_slice = slice(
                self._remainder_offset,
                self._remainder_offset + num_segment_tokens,
            )
            input_parts.append(np.asarray(sequence.input_ids[token_slice]))
            label_parts.append(np.asarray(sequence.labels[token_slice]))
            position_parts.append(np.arange(num_segment_tokens, dtype=np.int64))
            num_tokens += num_segment_tokens
            self._remainder_offset += num_segment_tokens
            if self._remainder_offset == len(sequence.input_ids):
                self._remainder = None
                self._remainder_parent_state = None
                self._remainder_offset = 0

        if not input_parts:
            raise StopIteration

        input_ids = np.concatenate(input_parts)
        labels = np.concatenate(label_parts)
        positions = np.concatenate(position_parts)
        padding_mask = np.zeros(num_tokens, dtype=np.bool_)
        pad_len = self._num_tokens_per_row - num_tokens
        if pad_len:
            padding_positions = (
                np.arange(pad_len, dtype=positions.dtype) % self._max_context_length
            )
            input_ids = np.pad(input_ids, (0, pad_len))
            labels = np.pad(labels, (0, pad_len), constant_values=IGNORE_INDEX)
            positions = np.concatenate((positions, padding_positions))
            padding_mask = np.pad(padding_mask, (0, pad_len), constant_values=True)

        return TextSequence(
            input_ids=input_ids,
            labels=labels,
            positions=positions,
            padding_mask=padding_mask,
        )

    def get_state(self) -> dict[str, Any]:
        if self._remainder is None:
            parent_state = self._parent.get_state()
        else:
            assert self._remainder_parent_state is not None
            parent_state = self._remainder_parent_state
        return {
            "parent": parent_state,
            "has_remainder": self._remainder is not None,
            "remainder_offset": self._remainder_offset,
            "finished": self._finished,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._remainder = None
        self._remainder_parent_state = None
        self._remainder_offset = 0
        self._finished = state["finished"]
        if state["has_remainder"]:
            self._remainder_parent_state = state["parent"]
            self._remainder = next(self._parent)
            self._remainder_offset = state["remainder_offset"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FirstFitPackingConfig:
    """Packs document chunks no longer than the context window."""

    dataset: Any
    num_packing_bins: int = 8
    """Candidate rows kept open; more bins can reduce padding but buffer more samples."""

    def __post_init__(self) -> None:
        if self.num_packing_bins <= 0:
            raise ValueError("num_packing_bins must be positive")

    def build(
        self,
        *,
        context: DatasetBuildContext,
        dataset_iteration_policy: DatasetIterationPolicy,
    ) -> grain.IterDataset:
        dataset = self.dataset.build(
            context=context,
            dataset_iteration_policy=dataset_iteration_policy,
        )
        if isinstance(dataset, grain.MapDataset):
            dataset = dataset.to_iter_dataset(read_options=context.read_options)
        dataset = grain.experimental.FlatMapIterDataset(
            dataset,
            _SplitTextSequenceDocuments(
                max_context_length=context.max_context_length,
            ),
        )
        dataset = dataset.map(
            partial(
                _text_sequence_to_packing_input,
                max_context_length=context.max_context_length,
            )
        )
        dataset = grain.experimental.FirstFitPackIterDataset(
            dataset,
            length_struct={
                "input_ids": context.num_tokens_per_batch,
                "labels": context.num_tokens_per_batch,
                "positions": context.num_tokens_per_batch,
                "padding_mask": context.num_tokens_per_batch,
            },
            padding_struct={
                "input_ids": 0,
                "labels": IGNORE_INDEX,
                "positions": 0,
                "padding_mask": True,
            },
            num_packing_bins=self.num_packing_bins,
            meta_features=("labels", "positions"),
            seed=dataset_iteration_policy.seed,
            shuffle_bins=dataset_iteration_policy.shuffle,
            max_sequences_per_bin=(
                context.max_num_documents
                if context.max_num_documents is not None
                else None
            ),
        )
        return dataset.map(
            partial(
                _packing_output_to_text_sequence,
                max_context_length=context.max_context_length,
            )
        )


class _SplitTextSequenceDocuments(grain.experimental.FlatMapTransform):
    """Expose context-sized document chunks to Grain's native packing limit."""

    def __init__(
        self,
        *,
        max_context_length: int,
    ) -> None:
        self._max_context_length = max_context_length
        self.max_fan_out = max_context_length

    def flat_map(self, element: TextSequence) -> list[TextSequence]:
        if len(element.input_ids) == 0:
            return []

        positions = None if element.positions is None else np.asarray(element.positions)
        chunks = []
        chunk_start = 0
        while chunk_start < len(element.input_ids):
            chunk_end = _next_document_chunk_end(
                num_tokens=len(element.input_ids),
                positions=positions,
                start=chunk_start,
                max_context_length=self._max_context_length,
            )
            chunks.append(
                TextSequence(
                    input_ids=np.asarray(element.input_ids[chunk_start:chunk_end]),
                    labels=np.asarray(element.labels[chunk_start:chunk_end]),
                    positions=np.arange(chunk_end - chunk_start, dtype=np.int64),
                    padding_mask=(
                        None
                        if element.padding_mask is None
                        else np.asarray(element.padding_mask[chunk_start:chunk_end])
                    ),
                )
            )
            chunk_start = chunk_end
        return chunks


def _next_document_chunk_end(
    *,
    num_tokens: int,
    positions: np.ndarray | None,
    start: int,
    max_context_length: int,
) -> int:
    """Return the next document boundary or context-sized chunk boundary."""
    end = min(start + max_context_length, num_tokens)
    if positions is not None:
        next_starts = np.flatnonzero(positions[start + 1 : end] == 0)
        if next_starts.size:
            end = start + 1 + int(next_starts[0])
    return end


def _packing_output_is_full(packing_output: dict[str, np.ndarray]) -> bool:
    """Return whether concat-then-split filled the entire token batch."""
    return bool(np.all(np.asarray(packing_output["input_ids_segment_ids"]) != 0))


def _text_sequence_to_packing_input(
    text_sequence: TextSequence,
    *,
    max_context_length: int,
) -> dict[str, np.ndarray]:
    """Convert a `TextSequence` to the array dictionary expected by text packing."""
    positions = text_sequence.positions
    if positions is None:
        positions = (
            np.arange(len(text_sequence.input_ids), dtype=np.int64) % max_context_length
        )
    padding_mask = text_sequence.padding_mask
    if padding_mask is None:
        padding_mask = np.zeros(len(text_sequence.input_ids), dtype=np.bool_)
    return {
        "input_ids": np.asarray(text_sequence.input_ids),
        "labels": np.asarray(text_sequence.labels),
        "positions": np.asarray(positions),
        "padding_mask": np.asarray(padding_mask),
    }


def _packing_output_to_text_sequence(
    packing_output: dict[str, np.ndarray],
    *,
    max_context_length: int,
) -> TextSequence:
    """Finalize packed text by masking padding and canonicalizing positions."""
    segment_ids = np.asarray(packing_output["input_ids_segment_ids"])
    padding_mask = np.asarray(packing_output["padding_mask"], dtype=np.bool_).copy()
    padding_mask[segment_ids == 0] = True
    labels = np.asarray(packing_output["labels"]).copy()
    labels[padding_mask] = IGNORE_INDEX

    boundaries = np.asarray(packing_output["positions"]) == 0
    token_indices = np.arange(len(boundaries), dtype=np.int64)
    segment_starts = np.maximum.accumulate(np.where(boundaries, token_indices, 0))
    positions = token_indices - segment_starts

    packing_padding = segment_ids == 0
    if np.any(packing_padding):
        first_padding_token = int(np.flatnonzero(packing_padding)[0])
        positions[first_padding_token:] = (
            np.arange(len(positions) - first_padding_token) % max_context_length
        )

    return TextSequence(
        input_ids=np.asarray(packing_output["input_ids"]),
        labels=labels,
        positions=positions,
        padding_mask=padding_mask,
    )


def row(seq):
    return {"input_ids": seq.input_ids.tolist(), "labels": seq.labels.tolist(), "positions": seq.positions.tolist(),
            "padding_mask": seq.padding_mask.astype(int).tolist(),
            "dtypes": [seq.input_ids.dtype.str, seq.positions.dtype.str]}


rng = np.random.default_rng(5)
docs = []
for i in range(9):
    n = int(rng.integers(0 if i == 3 else 1, 9))
    ids = rng.integers(1, 50, n)
    positions = None
    if i % 3 == 1 and n > 3:  # an already packed row: two documents
        positions = np.concatenate([np.arange(2), np.arange(n - 2)])
    docs.append(TextSequence(input_ids=ids, labels=np.roll(ids, -1), positions=positions))
child = ListDatasetConfig(rows=tuple(docs))
policy = DatasetIterationPolicy(seed=7, shuffle=True)
recipes = {
    "aware": ConcatThenSplitPackingConfig(dataset=child),
    "concat": ConcatThenSplitPackingConfig(dataset=child),
    "first_fit": FirstFitPackingConfig(dataset=child, num_packing_bins=3),
    "first_fit_capped": FirstFitPackingConfig(dataset=child, num_packing_bins=2),
}
contexts = {
    "aware": DatasetBuildContext(read_options=grain.ReadOptions(num_threads=2), max_context_length=4,
                                 num_tokens_per_batch=6, max_num_documents=2),
    "concat": DatasetBuildContext(read_options=grain.ReadOptions(), max_context_length=4, num_tokens_per_batch=5),
    "first_fit": DatasetBuildContext(read_options=grain.ReadOptions(), max_context_length=4, num_tokens_per_batch=6),
    "first_fit_capped": DatasetBuildContext(read_options=grain.ReadOptions(), max_context_length=3,
                                            num_tokens_per_batch=6, max_num_documents=2),
}
results, states = {}, {}
for name, recipe in recipes.items():
    ds = recipe.build(context=contexts[name], dataset_iteration_policy=policy)
    it = iter(ds)
    out = {"head": [row(next(it)) for _ in range(3)]}
    state = it.get_state()
    states[name] = state
    out["state"] = state
    out["tail"] = [row(x) for x in it]
    it2 = iter(ds)
    it2.set_state(state)
    out["restored"] = [row(x) for x in it2]
    if FOREIGN is not None:
        it3 = iter(ds)
        it3.set_state(FOREIGN[name])
        out["foreign"] = [row(x) for x in it3]
    results[name] = out
it = iter(recipes["aware"].build(context=contexts["aware"], dataset_iteration_policy=policy))
next(it)
it.close()
try:
    next(it)
except Exception as e:
    results["closed"] = [type(e).__name__, str(e)]
try:
    FirstFitPackingConfig(dataset=child, num_packing_bins=0)
except ValueError as e:
    results["bins"] = str(e)
'''


def test_torchtitan_document_aware_and_first_fit_packing_as_on_grain():
  g = porting.run(TORCHTITAN_PACKING, "grain", FOREIGN=None)
  l = porting.run(TORCHTITAN_PACKING, "loader", FOREIGN=g.states)
  g, l = porting.grain_keys(g.results), porting.grain_keys(l.results)
  for name in ("aware", "concat", "first_fit", "first_fit_capped"):
    assert l[name].pop("foreign") == g[name]["restored"] == g[name]["tail"], name
  assert g["aware"]["state"] == {"parent": {"next_index": 5}, "has_remainder": False, "remainder_offset": 0,
                                 "finished": False}
  # README ("Checkpoint states"): loader's packing and ConcatThenSplit states
  # replay from an earlier position under other keys; Grain's restore there.
  assert g["concat"].pop("state") == {
      "parent_state": {"next_index": 2}, "elements_from_buffer_after_checkpoint": 1,
      "remainder_slices": {k: [1, 4] for k in ("input_ids", "labels", "positions", "padding_mask")}}
  assert set(l["concat"].pop("state")) == {
      "parent", "skip", "remainder_slices", "elements_from_buffer_after_checkpoint"}
  for name in ("first_fit", "first_fit_capped"):
    assert set(g[name].pop("state")) == {"parent", "next_row", "counter"}
    assert set(l[name].pop("state")) == {"replay_from", "skip", "next_row", "counter"}
  g_closed, l_closed = g.pop("closed"), l.pop("closed")
  assert l_closed[0] == g_closed[0] == "ValueError"
  strip = lambda m: re.sub(r"snippet_\w+\.| at 0x[0-9a-f]+", "", m)
  assert strip(l_closed[1]) == strip(g_closed[1]) == (
      "Trying to advance a closed iterator: '<_DocumentAwareConcatThenSplitIterator object>'.")
  assert l == g
  assert all(len(r["input_ids"]) == 6 for r in g["aware"]["head"] + g["aware"]["tail"])
  assert all(len(r["input_ids"]) == 5 and not any(r["padding_mask"]) for r in g["concat"]["tail"])
  assert g["bins"] == "num_packing_bins must be positive"



# The bridge as written, over tar shards written here (a sample per key, the
# audio member as flac, mp3 or wav, and a transcript).
WDS_BRIDGE = r'''
import io
import os
import tarfile

import grain
from grain._src.python.dataset import stats as dataset_stats
import numpy as np


class wds:  # A stand-in for webdataset's WebDataset (not installed here): a tar's members grouped by key.
    class WebDataset:
        def __init__(self, url, shardshuffle=False, nodesplitter=None, workersplitter=None):
            self.url = url
            self.splitters = (nodesplitter, workersplitter)

        def __iter__(self):
            with tarfile.open(self.url) as tar:
                sample = {}
                for member in tar.getmembers():
                    key, ext = member.name.split(".", 1)
                    if sample and sample["__key__"] != key:
                        yield sample
                        sample = {}
                    if ext == "bad":
                        raise ValueError(f"cannot decode {member.name}")
                    sample.setdefault("__key__", key)
                    sample["__url__"] = self.url
                    sample[ext] = tar.extractfile(member).read()
                if sample:
                    yield sample


audio_formats = [
    'wav',
    'flac',
    'mp3',
    'm4a',
    'ogg',
    'aac',
    'aiff',
    'au',
    'opus',
    'amr',
    'mp4',
    'avi',
    'wmv',
    'mpeg',
    'mkv',
    'mov',
]


def rename_audio_to_wav(sample):
    current_audio_key = None
    for key in sample:
        if key in audio_formats:
            current_audio_key = key
            break

    if current_audio_key and current_audio_key != 'wav':
        sample['wav'] = sample.pop(current_audio_key)

    return sample


def no_split(src):
    """ NOTE: grain is responsible for splitting data
    """
    yield from src


class _WdsGrainIterator(grain.DatasetIterator):

    def __init__(
        self,
        parent: grain.DatasetIterator,
    ):
        super().__init__(parent)
        self._current_wds_iter = None
        self.samples_processed_in_file = 0

    def _try_get_valid_iter(self):
        if self._current_wds_iter is None:
            try:
                self._current_wds_iter = iter(
                    wds.WebDataset(next(self._parent),
                                   shardshuffle=False,
                                   nodesplitter=no_split,
                                   workersplitter=no_split))
                self.samples_processed_in_file = 0
            except StopIteration:
                return False
        return True

    @dataset_stats.record_next_duration_if_output
    def __next__(self):
        while True:
            if not self._try_get_valid_iter():
                raise StopIteration
            try:
                elem_dict = next(self._current_wds_iter)
                elem_dict = rename_audio_to_wav(elem_dict)
                self.samples_processed_in_file += 1
                return elem_dict

            except StopIteration:
                self._current_wds_iter = None
                continue

            except Exception as e:
                print(
                    f"Warning: Skipping problematic sample due to error: {e}")
                continue

    def get_state(self):
        state = self._parent.get_state()
        return {
            "parent": self._parent.get_state(),
            "samples_processed_in_file": self.samples_processed_in_file,
        }

    def set_state(self, state):
        self._parent.set_state(state['parent'])
        ssamples_to_skip = state.get('samples_processed_in_file')

        if not self._try_get_valid_iter():
            return
        assert self._current_wds_iter is not None
        for _ in range(ssamples_to_skip):
            try:
                _ = next(self._current_wds_iter)
            except StopIteration:
                self._current_wds_iter = None
                break
        self.samples_processed_in_file = ssamples_to_skip

    def __str__(self) -> str:
        return "WdsGrainDatasetIterator(transform=generator)"


class WdsGrainIterDataset(grain.IterDataset):

    def __init__(self, parent):
        super().__init__(parent)

    def __iter__(self) -> _WdsGrainIterator:
        # Return the wrapped, webdataset-powered iterator
        parent_iter = self._parent.__iter__()
        return _WdsGrainIterator(parent_iter)


def write_shard(path, samples):
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


shards = []
for s in range(3):
    samples = []
    for k in range(3 if s != 1 else 2):
        ext = ["flac", "mp3", "wav"][(s + k) % 3]
        samples.append((f"s{s}k{k}", {ext: bytes([s, k]) * (k + 1), "txt": f"utt {s}-{k}".encode()}))
    shards.append(os.path.join(TMP, f"shard-{s}.tar"))
    write_shard(shards[-1], samples)


def decode(sample):
    return {"key": sample["__key__"], "text": sample["txt"].decode(), "wav": np.frombuffer(sample["wav"], np.uint8)}


def plain(x):
    return {"key": x["key"], "text": x["text"], "wav": x["wav"].tolist()}


files = grain.MapDataset.source(shards).shuffle(seed=3)
ds = WdsGrainIterDataset(files.to_iter_dataset()).map(decode)
results = {"all": [plain(x) for x in ds]}
it = iter(ds)
results["head"] = [plain(next(it)) for _ in range(4)]
state = it.get_state()
results["state"] = state
results["tail"] = [plain(x) for x in it]
it2 = iter(ds)
it2.set_state(state)
results["restored"] = [plain(x) for x in it2]
raw = iter(WdsGrainIterDataset(files.to_iter_dataset()))
results["str"] = str(raw)
results["keys"] = sorted(next(raw))
# Batched with the rest of a pipeline, and a shard whose member cannot be decoded.
bad = os.path.join(TMP, "shard-bad.tar")
write_shard(bad, [("b0", {"wav": b"\x01", "txt": b"ok"}), ("b1", {"bad": b"", "txt": b"no"}),
                  ("b2", {"txt": b"x", "au": b"\x02"})])
batched = WdsGrainIterDataset(grain.MapDataset.source([bad, shards[1]]).to_iter_dataset()).map(
    lambda s: s["__key__"]).batch(2)
results["with_bad"] = [b.tolist() for b in batched]
'''


def test_webdataset_bridge_iterator_stats_decorator_and_state_as_on_grain(tmp_path, capsys):
  out, printed = {}, {}
  for lib in porting.LIBS:
    (tmp_path / lib).mkdir()
    out[lib] = porting.grain_keys(porting.run(WDS_BRIDGE, lib, TMP=str(tmp_path / lib)).results)
    printed[lib] = capsys.readouterr().out
  g, l = out["grain"], out["loader"]
  assert l == g
  warning = "Warning: Skipping problematic sample due to error: cannot decode b1.bad\n"
  assert printed["loader"] == printed["grain"] == warning
  assert [x["key"] for x in g["all"]] == ["s2k0", "s2k1", "s2k2", "s1k0", "s1k1", "s0k0", "s0k1", "s0k2"]
  assert g["head"] + g["tail"] == g["all"]
  assert g["state"] == {"parent": {"next_index": 2}, "samples_processed_in_file": 1}
  assert g["restored"] == g["all"][6:]  # The client's restore skips within the file after the saved one.
  assert g["str"] == "WdsGrainDatasetIterator(transform=generator)" and "wav" in g["keys"]
  assert g["with_bad"] == [["b0", "s1k0"], ["s1k1"]]



# The module's streaming classes and QADataset's pipeline and generator as
# written (the Hugging Face set-up and the distillation branch left out).
QA_STREAMING = r'''
import numpy as np
import grain.python as grain
from grain._src.python.dataset.dataset import DatasetIterator


# Stand-ins for the module's `.utils` helpers and the Hugging Face tokenizer and
# streaming dataset (not installed here): a character-level tokenizer.
class CharTokenizer:
    pad_token_id = 0
    eos_token = "$"

    def __call__(self, text, truncation=False, max_length=None, padding=None, return_tensors=None,
                 add_special_tokens=True):
        ids = [1 + ord(c) % 97 for c in text]
        if truncation and max_length is not None:
            ids = ids[:max_length]
        if padding == "max_length":
            ids = ids + [self.pad_token_id] * (max_length - len(ids))
        return {"input_ids": np.array([ids], dtype=np.int32)}


def build_prefix_text(tokenizer, question, prompt_template, chat_template, has_thinking):
    return (prompt_template or "Q: {question}\nA: ").format(question=question)


def make_attn_mask(tokens, pad_token_id):
    return (tokens != pad_token_id).astype(np.float32)


def pack_docs(tokenizer, pos_docs, neg_docs, num_chunks_per_doc, doc_chunk_seq_len):
    docs = np.zeros((num_chunks_per_doc, doc_chunk_seq_len), np.int32)
    masks = np.zeros((num_chunks_per_doc, doc_chunk_seq_len), np.float32)
    pos = np.zeros((num_chunks_per_doc,), np.float32)
    for j, (doc, is_pos) in enumerate([(d, 1) for d in pos_docs] + [(d, 0) for d in neg_docs]):
        if j == num_chunks_per_doc:
            break
        ids = tokenizer(doc, truncation=True, max_length=doc_chunk_seq_len)["input_ids"][0]
        docs[j, : len(ids)] = ids
        masks[j, : len(ids)] = 1
        pos[j] = is_pos
    return docs, masks, pos


class FakeHFStream:
    def __init__(self, rows):
        self.rows = rows
        self.iterations = 0

    def __iter__(self):
        self.iterations += 1
        return iter(self.rows)


# The module's streaming source, filter and transform, as written.
class _StreamingIterator(DatasetIterator):
    def __init__(self, iterable, sl=None):
        super().__init__()
        self._iterable = iterable
        self._iter = None
        self._sl = sl
        self._count = 0
        self._target_count = 0

    def __next__(self):
        if self._iter is None:
            self._iter = iter(self._iterable)
        # Fast-forward after set_state: the underlying HF stream is deterministic
        # (fixed shuffle/interleave seeds), so consuming `count` raw items replays
        # the pipeline to the exact position of the saved iterator.
        if self._count < self._target_count:
            print(f"Dataloader fast-forward: skipping {self._target_count - self._count} consumed source items...")
            while self._count < self._target_count:
                next(self._iter)
                self._count += 1
            print("Dataloader fast-forward done.")
        while True:
            item = next(self._iter)
            if self._sl is not None:
                start = self._sl.start or 0
                step = self._sl.step or 1
                if self._count % step != start % step:
                    self._count += 1
                    continue
            self._count += 1
            return item

    def get_state(self):
        return {"count": self._count}

    def set_state(self, state):
        # Don't touch self._count: the fresh HF stream is at position 0, so we
        # record a target and fast-forward lazily on first __next__.
        self._target_count = state.get("count", 0)


class _StreamingSource(grain.IterDataset):
    def __init__(self, iterable):
        super().__init__()
        self._iterable = iterable
        self._slice = None

    def set_slice(self, sl, sequential_slice=False):
        self._slice = sl

    def __iter__(self):
        return _StreamingIterator(self._iterable, self._slice)


def qa_filter_predicate(
    raw_item, tokenizer, seq_len, chat_template, doc_length,
    force_thinking=False, min_doc_length=64, filter_doc_length=True,
):
    pos_doc = raw_item.get("pos_doc", "")
    if isinstance(pos_doc, list):
        pos_doc = pos_doc[0] if pos_doc else ""
    if pos_doc:
        doc_tok_len = len(tokenizer(pos_doc, truncation=False, return_tensors="np")["input_ids"][0])
        if doc_tok_len < min_doc_length:
            return False
        if filter_doc_length and doc_tok_len > doc_length:
            return False
    min_neg_docs = raw_item.get("_min_neg_docs", 0)
    if min_neg_docs > 0:
        neg_doc = raw_item.get("neg_doc", [])
        if not isinstance(neg_doc, list):
            neg_doc = [neg_doc] if neg_doc else []
        if len(neg_doc) > 0 and len(neg_doc) < min_neg_docs:
            return False
    question = raw_item.get("question", "")
    answer = raw_item.get("answer", "")
    if answer and question and answer.lower() in question.lower():
        if not any(opt in answer for opt in ["A)", "B)", "C)", "D)"]):
            return False
    if question and chat_template:
        has_thinking = force_thinking or answer.startswith("<think>")
        prefix_text = build_prefix_text(
            tokenizer, question, raw_item.get("prompt_template"), chat_template, has_thinking
        )
        full_text = prefix_text + answer + (tokenizer.eos_token or "<|im_end|>")
    else:
        full_text = f"Question: {question}\nAnswer: {answer}" + (tokenizer.eos_token or "<|im_end|>") if question else ""
    if full_text:
        full_tok_len = len(tokenizer(full_text, truncation=False, return_tensors="np")["input_ids"][0])
        if full_tok_len > seq_len:
            return False
    return True


def qa_transform_item(
    item, tokenizer, seq_len, doc_chunk_seq_len, num_chunks_per_doc,
    mask_prefix, chat_template, force_thinking=False,
):
    question = item.get("question", "")
    answer = item.get("answer", "")
    pos_docs_raw = item.get("pos_doc", [])
    neg_docs_raw = item.get("neg_doc", [])
    if isinstance(pos_docs_raw, str): pos_docs_raw = [pos_docs_raw]
    if isinstance(neg_docs_raw, str): neg_docs_raw = [neg_docs_raw]
    cot_doc = item.get("cot_doc")
    if cot_doc:
        pos_docs_raw = list(pos_docs_raw) + [cot_doc]

    has_thinking = force_thinking or answer.startswith("<think>")
    prefix_text = build_prefix_text(
        tokenizer, question, item.get("prompt_template"), chat_template, has_thinking
    )
    text = prefix_text + answer + (tokenizer.eos_token or "<|im_end|>")

    tokens = tokenizer(
        text, truncation=True, max_length=seq_len,
        padding="max_length", return_tensors='np'
    )['input_ids'][0]

    attention_mask = make_attn_mask(tokens, tokenizer.pad_token_id)
    loss_mask = attention_mask.copy()

    if mask_prefix:
        prefix_tokens = tokenizer(
            prefix_text, truncation=True, max_length=seq_len, return_tensors='np'
        )['input_ids'][0]
        loss_mask[:min(len(prefix_tokens), len(tokens))] = 0.0

    final_doc_chunks, final_doc_masks, final_pos_mask = pack_docs(
        tokenizer, pos_docs_raw, neg_docs_raw, num_chunks_per_doc, doc_chunk_seq_len
    )

    raw_ids = item.get("pos_doc_ids") or []
    pos_doc_ids = np.full(num_chunks_per_doc, -1, dtype=np.int64)
    for j, doc_id in enumerate(raw_ids[:num_chunks_per_doc]):
        pos_doc_ids[j] = int(doc_id)

    return {
        "inputs": tokens, "attn_mask": attention_mask, "loss_mask": loss_mask,
        "docs": final_doc_chunks, "docs_masks": final_doc_masks,
        "pos_doc_mask": final_pos_mask, "pos_doc_ids": pos_doc_ids,
        "ce_enable": np.float32(item.get("_ce_enable", 1.0)),
    }


class _StreamingQAFilter(grain.FilterTransform):
    def __init__(self, tokenizer, seq_len, chat_template, doc_length, force_thinking=False, min_doc_length=64, filter_doc_length=True):
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.chat_template = chat_template
        self.doc_length = doc_length
        self.force_thinking = force_thinking
        self.min_doc_length = min_doc_length
        self.filter_doc_length = filter_doc_length

    def filter(self, raw_item):
        return qa_filter_predicate(
            raw_item, self.tokenizer, self.seq_len, self.chat_template, self.doc_length,
            force_thinking=self.force_thinking, min_doc_length=self.min_doc_length,
            filter_doc_length=self.filter_doc_length,
        )


class _StreamingQATransform(grain.MapTransform):
    def __init__(self, tokenizer, seq_len, doc_chunk_seq_len, num_chunks_per_doc, mask_prefix, chat_template, force_thinking=False):
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.doc_chunk_seq_len = doc_chunk_seq_len
        self.num_chunks_per_doc = num_chunks_per_doc
        self.mask_prefix = mask_prefix
        self.chat_template = chat_template
        self.force_thinking = force_thinking

    def map(self, item):
        return qa_transform_item(
            item, self.tokenizer, self.seq_len, self.doc_chunk_seq_len,
            self.num_chunks_per_doc, self.mask_prefix, self.chat_template,
            force_thinking=self.force_thinking,
        )


# QADataset's pipeline, state hooks and generator (its Hugging Face set-up and the
# distillation branch left out; `jnp.array` conversions and the model-input tuple
# kept as numpy arrays).
class QADataset:
    def __init__(self, dataset, tokenizer, *, seq_len=48, doc_chunk_seq_len=6, num_chunks_per_doc=3,
                 batch_size=2, num_workers=0, mask_prefix=True, min_doc_length=2, chat_template=True,
                 provide_docs=True, force_thinking=False):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.doc_chunk_seq_len = doc_chunk_seq_len
        self.num_chunks_per_doc = num_chunks_per_doc
        self.doc_length = self.doc_chunk_seq_len * self.num_chunks_per_doc
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.mask_prefix = mask_prefix
        self.min_doc_length = min_doc_length
        self.chat_template = chat_template
        self.provide_docs = provide_docs
        self.force_thinking = force_thinking
        self.distill = False

    def _build_pipeline(self):
        """Build the grain IterDataset pipeline with filter → map → mp_prefetch → batch."""
        pipeline = _StreamingSource(self.dataset)
        pipeline = pipeline.filter(_StreamingQAFilter(
            self.tokenizer, self.seq_len, self.chat_template, self.doc_length, self.force_thinking,
            min_doc_length=self.min_doc_length,
            filter_doc_length=self.provide_docs,
        ))
        pipeline = pipeline.map(_StreamingQATransform(
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            doc_chunk_seq_len=self.doc_chunk_seq_len,
            num_chunks_per_doc=self.num_chunks_per_doc,
            mask_prefix=self.mask_prefix,
            chat_template=self.chat_template,
            force_thinking=self.force_thinking,
        ))
        if self.num_workers > 0:
            pipeline = pipeline.mp_prefetch(
                grain.MultiprocessingOptions(
                    num_workers=self.num_workers,
                    per_worker_buffer_size=4,
                )
            )
        pipeline = pipeline.batch(self.batch_size, drop_remainder=True)
        return pipeline

    def get_loader_state(self):
        it = getattr(self, "current_iterator", None)
        if it is None:
            return None
        try:
            return it.get_state()
        except Exception as e:
            import warnings
            warnings.warn(f"Could not capture dataloader state: {e}")
            return None

    def set_loader_state(self, state):
        self._pending_loader_state = state

    def generator(self, num_epochs=None):
        if self.tokenizer is None:
            raise ValueError("Tokenizer is required for training generator")

        epochs = num_epochs if num_epochs is not None else 1000000

        for _ in range(epochs):
            pipeline = self._build_pipeline()
            iterator = iter(pipeline)
            pending = getattr(self, "_pending_loader_state", None)
            if pending is not None:
                try:
                    iterator.set_state(pending)
                    print("Dataloader state restored; stream will fast-forward on first batch.")
                except Exception as e:
                    import warnings
                    warnings.warn(f"Could not restore dataloader state ({e}); starting stream from 0.")
                self._pending_loader_state = None
            self.current_iterator = iterator

            while True:
                try:
                    batch = next(iterator)
                except StopIteration:
                    break

                inputs = np.array(batch['inputs'])
                attn_mask = np.array(batch['attn_mask'])
                loss_mask = np.array(batch['loss_mask'])
                docs = np.array(batch['docs'])
                docs_masks = np.array(batch['docs_masks'])
                pos_doc_mask = np.array(batch['pos_doc_mask'])
                pos_doc_ids = np.array(batch['pos_doc_ids'])
                ce_enable = np.array(batch['ce_enable']) if 'ce_enable' in batch else np.ones(inputs.shape[0], dtype=np.float32)

                B, M, d_seq_len = docs.shape
                flat_docs = docs.reshape(B * M, d_seq_len)
                flat_docs_masks = docs_masks.reshape(B * M, d_seq_len)
                yield {"batch": inputs, "docs": flat_docs}, {
                    "batch_mask": attn_mask, "docs_mask": flat_docs_masks, "loss_mask": loss_mask,
                    "pos_doc_mask": pos_doc_mask, "pos_doc_ids": pos_doc_ids, "ce_enable": ce_enable,
                }


def summary(step):
    x, y = step
    return [x["batch"].sum().item(), x["docs"].shape, x["docs"].sum().item(), y["loss_mask"].sum().item(),
            y["pos_doc_mask"].tolist(), y["pos_doc_ids"].tolist(), y["ce_enable"].tolist()]


rows = []
for i in range(14):
    row = {"question": f"what is {i}?", "answer": f"{i * 7}" if i != 5 else "what", "pos_doc": "d" * (1 + i % 5),
           "neg_doc": ["n" * (i % 3 + 1)] * (i % 3), "prompt_template": None if i % 2 else "Q{question}|"}
    if i % 4 == 0:
        row["pos_doc_ids"] = [i, i + 1]
    if i == 9:
        row["_ce_enable"] = 0.0
        row["_min_neg_docs"] = 1
    rows.append(row)
stream = FakeHFStream(rows)
qa = QADataset(stream, CharTokenizer(), num_workers=NUM_WORKERS)
keep = _StreamingQAFilter(qa.tokenizer, qa.seq_len, True, qa.doc_length, min_doc_length=2)
results = {"kept": [r["question"] for r in rows if keep.filter(r)]}
gen = qa.generator(num_epochs=2)
results["first"] = [summary(next(gen)) for _ in range(2)]
state = qa.get_loader_state()
results["state"] = state
results["rest"] = [summary(s) for s in gen]
qa2 = QADataset(stream, CharTokenizer(), num_workers=NUM_WORKERS)
qa2.set_loader_state(state)
results["resumed"] = [summary(s) for s in qa2.generator(num_epochs=1)]
results["resumed_state"] = qa2.get_loader_state()
if FOREIGN is not None:
    qa3 = QADataset(stream, CharTokenizer(), num_workers=NUM_WORKERS)
    qa3.set_loader_state(FOREIGN)
    results["foreign"] = [summary(s) for s in qa3.generator(num_epochs=1)]
qa4 = QADataset(stream, CharTokenizer(), num_workers=NUM_WORKERS)
results["no_state"] = qa4.get_loader_state()
qa4.set_loader_state({"bogus": 1})
results["bad_state_batches"] = len([summary(s) for s in qa4.generator(num_epochs=1)])
'''


def test_qa_streaming_source_lazy_fast_forward_and_pending_state_as_on_grain(capsys, recwarn):
  g = porting.run(QA_STREAMING, "grain", NUM_WORKERS=0, FOREIGN=None).results
  g_printed = capsys.readouterr().out
  l = porting.run(QA_STREAMING, "loader", NUM_WORKERS=0, FOREIGN=g["state"]).results
  l_printed = capsys.readouterr().out
  g, l = porting.grain_keys(g), porting.grain_keys(l)
  assert l.pop("foreign") == g["resumed"]
  assert l == g
  restored = ("Dataloader state restored; stream will fast-forward on first batch.\n"
              "Dataloader fast-forward: skipping 5 consumed source items...\nDataloader fast-forward done.\n")
  assert g_printed == restored + "Dataloader state restored; stream will fast-forward on first batch.\n"
  assert l_printed == restored * 2 + "Dataloader state restored; stream will fast-forward on first batch.\n"
  assert not [w for w in recwarn if "dataloader state" in str(w.message)]
  assert g["state"] == {"count": 5} and g["resumed_state"] == {"count": 14} and g["no_state"] is None
  assert len(g["kept"]) == 11 and len(g["first"]) == 2 and len(g["rest"]) == 8
  assert g["resumed"] == g["rest"][:3] and g["bad_state_batches"] == 5



# The factory, the wrapper, the adapted `device_put` and the alternating
# iterator as written (the coinrun branch; stand-in configs and transforms).
DREAMER = r'''
import logging
import pickle
from dataclasses import dataclass

import grain
import jax
from jax import numpy as jnp
import numpy as np
from grain._src.python.dataset import dataset as grain_dataset
from grain.transforms import Batch


# Stand-ins for dreamer's configs and its episode transforms (ported in an
# earlier round): episodes pickled into ArrayRecord files, a length filter and a
# random window slice.
@dataclass
class DataloaderConfig:
    B: int
    num_workers: int
    prefetch_buffer_size: int
    device_prefetch_buffer_size: int
    short_T: int
    long_T: int
    long_ratio: float
    start_step: int = 0
    dtype: str = "float32"


@dataclass
class DatasetConfig:
    array_record_path: list
    dataloader_cfg: DataloaderConfig
    num_max_samples: int = 0


class EpisodeLengthFilter(grain.transforms.Filter):
    def __init__(self, seq_len):
        self.seq_len = seq_len

    def filter(self, record):
        return pickle.loads(record)["frames"].shape[0] >= self.seq_len


class ProcessEpisodeAndSlice(grain.transforms.RandomMap):
    def __init__(self, seq_len):
        self.seq_len = seq_len

    def random_map(self, record, rng):
        frames = pickle.loads(record)["frames"]
        start = int(rng.integers(0, frames.shape[0] - self.seq_len + 1))
        return {"frames": frames[start:start + self.seq_len], "start": np.int32(start)}


class CastDtype(grain.transforms.Map):
    def __init__(self, dtype):
        self.dtype = dtype

    def map(self, batch):
        return {**batch, "frames": batch["frames"].astype(self.dtype)}


# dreamer's iterator factory (its dataset-type branches reduced to the coinrun one).
def make_iterator(
    cfg: DatasetConfig,
    *,
    seed: int = 42,
    print_filter_warnings: bool = False,
    device = None,
    dtype = None,
    dataloader_cfg: DataloaderConfig | None = None,
    seq_len: int | None = None,
):
    if dataloader_cfg is None:
        dataloader_cfg = cfg.dataloader_cfg

    if seq_len is None:
        if dataloader_cfg.short_T != dataloader_cfg.long_T:
            raise ValueError(
                "Ambiguous sequence length: short_T != long_T. "
                "Pass seq_len explicitly or use make_dual_iterator."
            )
        seq_len = dataloader_cfg.short_T

    num_workers = dataloader_cfg.num_workers
    prefetch_buffer_size = dataloader_cfg.prefetch_buffer_size
    device_prefetch_buffer_size = dataloader_cfg.device_prefetch_buffer_size
    array_record_paths = cfg.array_record_path

    num_processes = jax.process_count()

    if dataloader_cfg.B % num_processes != 0:
        raise ValueError(
            f"Global batch size {dataloader_cfg.B} must be divisible by "
            f"the number of JAX processes {num_processes}."
        )
    per_process_batch_size = dataloader_cfg.B // num_processes

    source = grain.sources.ArrayRecordDataSource(array_record_paths)

    sampler = grain.samplers.IndexSampler(
        num_records = cfg.num_max_samples if cfg.num_max_samples>0 else len(source),
        shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
        shuffle=True,
        num_epochs=None,
        seed=seed,
    )
    operations = [EpisodeLengthFilter(seq_len=seq_len), ProcessEpisodeAndSlice(seq_len=seq_len)]
    common_ops = [Batch(batch_size=per_process_batch_size, drop_remainder=True), CastDtype(dataloader_cfg.dtype)]
    operations = operations + common_ops

    dataloader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=operations,
        worker_count=num_workers,
        worker_buffer_size=1,
        read_options=grain.ReadOptions(
            prefetch_buffer_size=prefetch_buffer_size if device is None else 1,
            num_threads=1,
        ),
    )

    if device is None:
        return iter(dataloader)

    # Wrap DataLoader as IterDataset for compatibility with grain.experimental.device_put
    iter_dataset = DataLoaderIteratorWrapper(dataloader)
    iter_dataset = device_put(
        iter_dataset,
        device,
        dtype=dtype,
        cpu_buffer_size=prefetch_buffer_size,
        device_buffer_size=device_prefetch_buffer_size if prefetch_buffer_size is not None else prefetch_buffer_size,
    )

    return iter_dataset


class AlternatingIterator(grain.IterDataset):
    def __init__(self, short_iterator, long_iterator, long_ratio: float, seed: int) -> None:
        # Normalize inputs to Python iterators; Grain IterDataset objects require iter(...)
        # before next(...) can be called.
        self.short_iterator = iter(short_iterator)
        self.long_iterator = iter(long_iterator)
        self.long_ratio = long_ratio
        self._rng_key = jax.random.key(seed)
        self.step=0

    def __next__(self):
        self._rng_key, subkey = jax.random.split(self._rng_key)
        use_long = bool(jax.random.bernoulli(subkey, p=self.long_ratio)) or self.step%1000==0
        self.step+=1

        return next(self.long_iterator if use_long else self.short_iterator)

    def __iter__(self):
        return self

def make_dual_iterator(
    cfg: DatasetConfig,
    *,
    seed: int = 42,
    print_filter_warnings: bool = False,
    device = None,
    dtype = None
    ) -> grain.IterDataset:
    dataloader_cfg = cfg.dataloader_cfg

    short_T = dataloader_cfg.short_T
    long_T = dataloader_cfg.long_T
    assert long_T % short_T == 0, f"long_T ({long_T}) must be a multiple of short_T ({short_T})"
    long_ratio = dataloader_cfg.long_ratio
    num_workers = dataloader_cfg.num_workers
    prefetch_buffer_size = dataloader_cfg.prefetch_buffer_size
    device_prefetch_buffer_size = dataloader_cfg.device_prefetch_buffer_size

    if short_T == long_T:
        logging.warning("short_T == long_T, using just one iterator")
        iterator = make_iterator(cfg, seed=seed, print_filter_warnings=print_filter_warnings, device=device, dtype=dtype, seq_len=short_T)
        return iterator

    iterators = []
    for T in [short_T, long_T]:
        dl_cfg = DataloaderConfig(
            B=dataloader_cfg.B * long_T//T,
            num_workers=max(1, num_workers // 2),
            prefetch_buffer_size=max(1, (prefetch_buffer_size + 1) // 2),
            device_prefetch_buffer_size=max(1, (device_prefetch_buffer_size + 1) // 2),
            short_T=T, long_T=T, long_ratio=0.0, start_step=getattr(dataloader_cfg, "start_step", 0), dtype=dataloader_cfg.dtype
        )
        it = make_iterator(cfg=cfg, seed=seed + T, print_filter_warnings=print_filter_warnings, device=device, dtype=dtype, dataloader_cfg=dl_cfg, seq_len=T)
        iterators.append(it)

    iterator = AlternatingIterator(iterators[0], iterators[1], long_ratio, seed)
    return iterator


class DataLoaderIteratorWrapper(grain_dataset.IterDataset):
    """Wraps a DataLoader iterator as a DatasetIterator for use with grain.experimental.device_put."""

    def __init__(self, dataloader):
        super().__init__()
        self._iterator = iter(dataloader)
        self._count = 0

    def __iter__(self):
        return self

    def __next__(self):
        self._count += 1
        return next(self._iterator)

    def get_state(self):
        return {"count": self._count}

    def set_state(self, state):
        self._count = state.get("count", 0)

# ==============================================================================
# Adapted from grain.experimental.device_put
# ==============================================================================

from grain._src.python.dataset import dataset
from grain._src.python.dataset.transformations.prefetch import ThreadPrefetchIterDataset


def device_put(
    ds: dataset.IterDataset,
    device,
    *,
    dtype: str | None = None,
    cpu_buffer_size: int = 4,
    device_buffer_size: int = 2,
) -> dataset.IterDataset:
  ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)

  jax_dtype = getattr(jnp, dtype, None) if dtype else None

  def _make_sharding(leaf):
    """Adapt sharding to leaf rank by truncating the partition spec."""
    if not isinstance(device, jax.sharding.NamedSharding):
      return device
    if not hasattr(leaf, 'ndim') or leaf.ndim >= len(device.spec):
      return device
    truncated = jax.sharding.PartitionSpec(*device.spec[:leaf.ndim])
    return jax.sharding.NamedSharding(device.mesh, truncated)

  def _transfer(x):
    shardings = jax.tree.map(_make_sharding, x)
    x = jax.device_put(x, shardings)
    if jax_dtype is not None:
      x = jax.tree.map(lambda a: a.astype(jax_dtype) if a is not None and jnp.issubdtype(a.dtype, jnp.floating) else a, x)
    return x

  ds = ds.map(_transfer)
  ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=device_buffer_size)
  return ds


def summary(batch):
    frames = batch["frames"]
    return {"frames": [list(frames.shape), str(frames.dtype), float(np.asarray(frames).sum())],
            "start": np.asarray(batch["start"]).tolist(), "is_jax": isinstance(batch["frames"], jax.Array)}


mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
cfg = DatasetConfig(array_record_path=PATHS, dataloader_cfg=DataloaderConfig(
    B=2, num_workers=WORKERS, prefetch_buffer_size=2, device_prefetch_buffer_size=1, short_T=2, long_T=4,
    long_ratio=0.3))
results = {}
plain_it = make_iterator(cfg, seq_len=2)
results["plain"] = [summary(next(plain_it)) for _ in range(3)]
results["plain_state"] = {k: v for k, v in __import__("json").loads(plain_it.get_state()).items()
                          if k in ("last_seen_indices", "sampler", "worker_count")}
on_device = make_iterator(cfg, seq_len=2, device=sharding, dtype="bfloat16")
it = iter(on_device)
results["is_iter_dataset"] = [isinstance(on_device, grain.IterDataset),
                              type(it).__name__ == type(iter(on_device)).__name__]
results["device"] = [summary(next(it)) for _ in range(3)]
results["device_state"] = it.get_state()
dual = make_dual_iterator(cfg, device=jax.devices()[0])
results["dual_is_self"] = iter(dual) is dual
results["dual"] = [summary(next(dual)) for _ in range(6)]
try:
    make_iterator(cfg)
except ValueError as e:
    results["ambiguous"] = str(e)
'''


def _dreamer_episodes(directory):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  paths = []
  for s in range(2):
    paths.append(os.path.join(directory, f"ep-{s}.array_record"))
    w = ArrayRecordWriter(paths[-1], "group_size:1")
    for _ in range(5):
      w.write(pickle.dumps({"frames": rng.random((int(rng.integers(1, 8)), 2, 2)).astype(np.float32)}))
    w.close()
  return paths


def test_dreamer_data_loader_wrapper_device_put_and_alternating_iterator_as_on_grain(tmp_path):
  paths = _dreamer_episodes(tmp_path)
  g, l = porting.run_both_grain_keys(DREAMER, PATHS=paths, WORKERS=0)
  assert l == g
  assert g["plain_state"]["worker_count"] == 0 and g["plain_state"]["last_seen_indices"] == {"0": 7}
  assert g["is_iter_dataset"] == [True, True] and g["dual_is_self"] is True
  assert [b["frames"][:2] for b in g["device"]] == [[[2, 2, 2, 2], "bfloat16"]] * 3
  assert [b["start"] for b in g["device"]] == [b["start"] for b in g["plain"]]
  assert g["device_state"] == {"count": 3}
  assert [b["frames"][0] for b in g["dual"]] == [[2, 4, 2, 2]] + [[4, 2, 2, 2]] * 5
  assert g["ambiguous"].startswith("Ambiguous sequence length: short_T != long_T.")



# The script as written, reading files written here in its five formats (its
# `DATA_DIR` given, `main()` run with `--source all`).
LIBRISPEECH = r'''
"""Test Grain with LibriSpeech dev-clean data in all 5 formats.

Requires running prepare_librispeech.py first.
"""

import argparse
import json
import os
import pickle
import sys
import tarfile

import grain
import numpy as np


# DATA_DIR (the script's `examples/data/output`) is given to the snippet.


# ---------------------------------------------------------------------------
# Custom transforms
# ---------------------------------------------------------------------------

class ParseJSON(grain.transforms.Map):
    """Parse JSON string/bytes into a Python dict."""

    def map(self, element):
        if isinstance(element, bytes):
            element = element.decode("utf-8")
        return json.loads(element)


class ParsePickle(grain.transforms.Map):
    """Unpickle bytes into a Python object."""

    def map(self, element: bytes):
        return pickle.loads(element)


class AddWordCount(grain.transforms.Map):
    """Add word_count field to a dict element."""

    def map(self, element: dict) -> dict:
        element["word_count"] = len(element["text"].split())
        return element


class FilterShortUtterances(grain.transforms.Filter):
    """Keep only utterances longer than min_duration seconds."""

    def __init__(self, min_duration: float = 5.0):
        self._min_duration = min_duration

    def filter(self, element: dict) -> bool:
        return element["duration"] >= self._min_duration


# ---------------------------------------------------------------------------
# JSONL random-access data source
# ---------------------------------------------------------------------------

class JsonlDataSource:
    """Random-access data source for JSONL files via line-offset index."""

    def __init__(self, path: str):
        self._path = path
        self._offsets: list[int] = []
        with open(path, "rb") as f:
            while True:
                offset = f.tell()
                line = f.readline()
                if not line:
                    break
                if line.strip():
                    self._offsets.append(offset)

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> str:
        with open(self._path, "r") as f:
            f.seek(self._offsets[index])
            return f.readline().strip()


# ---------------------------------------------------------------------------
# Tar random-access data source
# ---------------------------------------------------------------------------

class TarDataSource:
    """Random-access data source for tar archives."""

    def __init__(self, path: str):
        self._path = path
        self._members: list[tarfile.TarInfo] = []
        with tarfile.open(path, "r") as tar:
            for member in tar:
                if member.isfile():
                    self._members.append(member)
        # Sort by name to ensure deterministic order
        self._members.sort(key=lambda m: m.name)

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, index: int) -> str:
        with tarfile.open(self._path, "r") as tar:
            f = tar.extractfile(self._members[index])
            return f.read().decode("utf-8")


# ---------------------------------------------------------------------------
# Print helper
# ---------------------------------------------------------------------------

def print_elements(ds, name: str, n: int = 5):
    """Print first n elements from a dataset."""
    print(f"\n{'='*70}")
    print(f"  {name}")
    print(f"{'='*70}")
    count = 0
    for i, element in enumerate(ds):
        if i >= n:
            break
        if isinstance(element, dict):
            print(f"  [{i}] text={element.get('text', '')[:60]}...")
            print(f"       duration={element.get('duration')}, "
                  f"word_count={element.get('word_count', 'N/A')}")
        else:
            print(f"  [{i}] {str(element)[:120]}")
        count += 1
    print(f"  (showed {count} elements)")
    print()


# ---------------------------------------------------------------------------
# Test runners
# ---------------------------------------------------------------------------

def test_jsonl():
    """Test JSONL source with MapDataset."""
    path = os.path.join(DATA_DIR, "librispeech_dev_clean.jsonl")
    print(f"\n--- JSONL Source: {os.path.basename(path)}")

    source = JsonlDataSource(path)
    print(f"  Total records: {len(source)}")

    # MapDataset pipeline: parse -> filter -> add word count -> shuffle -> batch
    ds = (
        grain.MapDataset.source(source)
        .map(ParseJSON())
        .map(AddWordCount())
        .shuffle(seed=42)
    )

    print_elements(ds, "JSONL -> MapDataset (shuffle + word_count)")

    # Also test batching
    ds_batched = ds.batch(batch_size=4)
    batch = ds_batched[0]
    print(f"  Batch[0] keys: {list(batch.keys()) if isinstance(batch, dict) else type(batch)}")
    print(f"  Batch[0] texts: {[t[:40] + '...' for t in batch['text']]}")
    print(f"  Batch[0] durations: {batch['duration']}")


def test_parquet():
    """Test Parquet source with IterDataset."""
    path = os.path.join(DATA_DIR, "librispeech_dev_clean.parquet")
    print(f"\n--- Parquet Source: {os.path.basename(path)}")

    # ParquetIterDataset is streaming (IterDataset)
    ds = (
        grain.experimental.ParquetIterDataset(path)
        .map(AddWordCount())
    )

    print_elements(ds, "Parquet -> IterDataset (word_count)")


def test_tfrecord():
    """Test TFRecord source with IterDataset."""
    path = os.path.join(DATA_DIR, "librispeech_dev_clean.tfrecord")
    print(f"\n--- TFRecord Source: {os.path.basename(path)}")

    # TFRecordIterDataset is streaming (IterDataset), records are raw bytes
    ds = (
        grain.experimental.TFRecordIterDataset(path)
        .map(ParseJSON())
        .map(AddWordCount())
    )

    print_elements(ds, "TFRecord -> IterDataset (parse JSON + word_count)")


def test_arrayrecord():
    """Test ArrayRecord source with MapDataset."""
    path = os.path.join(DATA_DIR, "librispeech_dev_clean.array_record")
    print(f"\n--- ArrayRecord Source: {os.path.basename(path)}")

    source = grain.sources.ArrayRecordDataSource(path)
    print(f"  Total records: {len(source)}")

    # MapDataset pipeline: parse pickle -> filter long -> add word count -> shuffle -> batch
    ds = (
        grain.MapDataset.source(source)
        .map(ParsePickle())
        .map(AddWordCount())
        .shuffle(seed=42)
    )

    print_elements(ds, "ArrayRecord -> MapDataset (shuffle + word_count)")

    # Test batching
    ds_batched = ds.batch(batch_size=4)
    batch = ds_batched[0]
    print(f"  Batch[0] keys: {list(batch.keys()) if isinstance(batch, dict) else type(batch)}")
    print(f"  Batch[0] durations: {batch['duration']}")


def test_tar():
    """Test Tar source with MapDataset."""
    path = os.path.join(DATA_DIR, "librispeech_dev_clean.tar")
    print(f"\n--- Tar Source: {os.path.basename(path)}")

    source = TarDataSource(path)
    print(f"  Total records: {len(source)}")

    # MapDataset pipeline: parse JSON -> add word count -> shuffle -> batch
    ds = (
        grain.MapDataset.source(source)
        .map(ParseJSON())
        .map(AddWordCount())
        .shuffle(seed=42)
    )

    print_elements(ds, "Tar -> MapDataset (shuffle + word_count)")

    # Test batching
    ds_batched = ds.batch(batch_size=4)
    batch = ds_batched[0]
    print(f"  Batch[0] keys: {list(batch.keys()) if isinstance(batch, dict) else type(batch)}")
    print(f"  Batch[0] texts: {[t[:40] + '...' for t in batch['text']]}")
    print(f"  Batch[0] durations: {batch['duration']}")


# ---------------------------------------------------------------------------
# Summary: compare all sources
# ---------------------------------------------------------------------------

def test_summary():
    """Quick comparison: read first record from each source."""
    print(f"\n{'='*70}")
    print(f"  Summary: First record from each source")
    print(f"{'='*70}")

    # JSONL
    source = JsonlDataSource(os.path.join(DATA_DIR, "librispeech_dev_clean.jsonl"))
    rec = json.loads(source[0])
    print(f"  JSONL:       text={rec['text'][:50]}... dur={rec['duration']}")

    # Parquet
    ds = grain.experimental.ParquetIterDataset(
        os.path.join(DATA_DIR, "librispeech_dev_clean.parquet")
    )
    rec = next(iter(ds))
    print(f"  Parquet:     text={rec['text'][:50]}... dur={rec['duration']}")

    # TFRecord
    ds = grain.experimental.TFRecordIterDataset(
        os.path.join(DATA_DIR, "librispeech_dev_clean.tfrecord")
    )
    rec = json.loads(next(iter(ds)))
    print(f"  TFRecord:    text={rec['text'][:50]}... dur={rec['duration']}")

    # ArrayRecord
    source = grain.sources.ArrayRecordDataSource(
        os.path.join(DATA_DIR, "librispeech_dev_clean.array_record")
    )
    rec = pickle.loads(source[0])
    print(f"  ArrayRecord: text={rec['text'][:50]}... dur={rec['duration']}")

    # Tar
    source = TarDataSource(os.path.join(DATA_DIR, "librispeech_dev_clean.tar"))
    rec = json.loads(source[0])
    print(f"  Tar:         text={rec['text'][:50]}... dur={rec['duration']}")

    print(f"\n  All sources produce the same data!")


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

RUNNERS = {
    "jsonl": test_jsonl,
    "parquet": test_parquet,
    "tfrecord": test_tfrecord,
    "arrayrecord": test_arrayrecord,
    "tar": test_tar,
}


def main():
    parser = argparse.ArgumentParser(
        description="Test Grain with LibriSpeech dev-clean in multiple formats."
    )
    parser.add_argument(
        "--source",
        choices=list(RUNNERS.keys()) + ["all"],
        default="all",
        help="Which data source to test (default: all).",
    )
    args = parser.parse_args()

    if args.source == "all":
        for name, runner in RUNNERS.items():
            try:
                runner()
            except Exception as e:
                print(f"\n  ERROR in {name}: {e}\n")
                import traceback
                traceback.print_exc()
        test_summary()
    else:
        RUNNERS[args.source]()


argv, sys.argv = sys.argv, ["test_librispeech_grain.py", "--source", SOURCE]
try:
    main()
finally:
    sys.argv = argv
'''


def _librispeech_files(directory):
  import struct  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  from converter.tfrecord import masked_crc  # pylint: disable=g-import-not-at-top
  rows = [{"id": f"84-121123-{i:04d}", "text": " ".join(["GO", "DO", "YOU", "HEAR"][: 1 + i % 4]) + f" NUMBER {i}",
           "duration": round(1.5 + i * 0.75, 2)} for i in range(7)]
  stem = os.path.join(directory, "librispeech_dev_clean")
  with open(stem + ".jsonl", "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  pq.write_table(pa.Table.from_pylist(rows), stem + ".parquet", row_group_size=3)
  with open(stem + ".tfrecord", "wb") as f:
    for r in rows:
      data = json.dumps(r).encode()
      head = struct.pack("<Q", len(data))
      f.write(head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", masked_crc(data)))
  w = ArrayRecordWriter(stem + ".array_record", "group_size:1")
  for r in rows:
    w.write(pickle.dumps(r))
  w.close()
  with tarfile.open(stem + ".tar", "w") as tar:
    for r in rows:
      data = json.dumps(r).encode()
      info = tarfile.TarInfo(f"{r['id']}.json")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def test_librispeech_five_format_script_prints_as_on_grain(tmp_path, capsys):
  _librispeech_files(tmp_path)
  printed = {}
  for lib in porting.LIBS:
    porting.run(LIBRISPEECH, lib, DATA_DIR=str(tmp_path), SOURCE="all")
    printed[lib] = capsys.readouterr()
  assert printed["loader"].out == printed["grain"].out
  assert "ERROR" not in printed["grain"].out and printed["grain"].err == ""
  assert "  Batch[0] durations: [4.5  6.   3.   3.75]" in printed["grain"].out
  assert printed["grain"].out.endswith("  All sources produce the same data!\n")
  # A missing file: each runner's error is caught and printed, then the
  # summary's raises. Loader's messages are its own (README: a missing file
  # raises `FileNotFoundError` that is also Grain's `RuntimeError`).
  os.remove(tmp_path / "librispeech_dev_clean.tfrecord")
  errors = {}
  for lib in porting.LIBS:
    try:
      porting.run(LIBRISPEECH, lib, DATA_DIR=str(tmp_path), SOURCE="all")
    except Exception as e:  # pylint: disable=broad-exception-caught
      errors[lib] = e
    out = capsys.readouterr().out
    assert out.count("ERROR in ") == 1 and "ERROR in tfrecord: " in out
  assert type(errors["grain"]) is FileNotFoundError and isinstance(errors["loader"], FileNotFoundError)
  assert "librispeech_dev_clean.tfrecord" in str(errors["loader"])
