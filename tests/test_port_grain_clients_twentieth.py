"""Round 23's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

antonioterpin/synthpix's src/synthpix/make.py and src/synthpix/data_sources/
(base.py, numpy.py, adapter.py): `make_grain_scheduler` (a `FileDataSource`
subclass globbing `flow_*.npy` with its own `__repr__` "for Grain
checkpointing", an `IndexSampler` seeded from the config with `num_epochs=None
if loop else 1`, a `@dataclass AddJAXSeed(grain.RandomMapTransform)` that
writes `rng.integers(0, 2**32 - 1)` into the record, `grain.Batch(...,
drop_remainder=False)`, `ReadOptions(num_threads=..., prefetch_buffer_size=...)`),
`GrainSchedulerAdapter` (`isinstance(loader, grain.DataLoader)`, the epoch
count read off `getattr(loader, "sampler", getattr(loader, "_sampler"))` and
`sampler._num_epochs`, the length off `loader._data_source`, a peek at the
flow shape through a second `iter(loader)`, short batches padded with a mask,
`StopIteration` re-raised with a message), and `checkpoint_args` /
`save_checkpoint` / `make(load_from=...)` (Orbax `Composite` of the sampler's
`StandardSave` state and `grain.PyGrainCheckpointSave(grain_iterator)`,
restored into a fresh loader); the adapter tests' `MagicMock(spec=
grain.DataLoader)` and `grain.DataLoader` subclasses without `super().__init__`.
(Its episodic source was ported in round 15.)

jackopenn/jaximus's data/hf.py, data/array_records.py and
data/grain_transforms.py: `HFStreamingDataSource` (a `grain.sources.
RandomAccessDataSource` claiming 10_000_000_000 records whose `__getitem__`
ignores the key and restarts the stream when it ends) read with
`to_iter_dataset(read_options=ReadOptions(num_threads=1,
prefetch_buffer_size=1024))`, `ConcatThenSplitIterDataset` with
`bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS`, `bos_token_id`,
`bos_features`, an (inputs, targets) `Map` and `batch`; and pickled records
from ArrayRecord files, `ds[process_index::process_count]` on the
`MapDataset`, `ConcatThenSplitIterDataset(parent=<a MapDataset>)`,
`batch(..., drop_remainder=True)`, a state saved and restored.

A propositional-logic task module (`ImplySizeTask`, `Finite`-style cache;
the index names no repository for it): Grain's private
`grain._src.core.sharding` / `transforms` and `grain._src.python.data_sources`
/ `samplers`, `data_sources.ArrayRecordDataSource(shards, reader_options=...)`
over per-size directories, `samplers.IndexSampler(..., num_epochs=1,
seed=seed + epoch if shuffle else None)` rebuilt for each epoch, a
`transforms.Batch(batch_fn=...)` padding ragged records, and
`DataLoader(shard_options=...)`. Its `@dataclass(frozen=True) class
_DecodeRecord(transforms.MapTransform)` fails on both: Grain 0.2.18's
`grain._src.core.transforms` has no `MapTransform` (an AttributeError naming
it); the snippet then uses the module's `Map`.

A token-shard reader (`DatasetConfig`, `build_grain_token_dataset`,
`build_training_dataset`; the index names no repository for it):
`grain.sources.ArrayRecordDataSource(paths=[...], reader_options=dict(...) or
None)` of length-prefixed int32 records, `MapDataset.map(decode)`,
`shuffle(seed=...)` or a seedless `shuffle()`, `repeat()`, then windows and
batches cut in Python from `iter(ds.to_iter_dataset())`, and the reader's
own errors.

An Equinox trainer template (`Trainer`, `get_dataset_iterator`,
`DatasetMnist`; the index names no repository for it): `from grain.python
import BatchOperation, DataLoader, IndexSampler, PyGrainDatasetIterator,
ShardOptions, MapTransform, RandomAccessDataSource, Transformations,
PyGrainCheckpointSave, PyGrainCheckpointRestore`, a `MapTransform` class
defined inside a method (einops `repeat`), two `BatchOperation(n, True)` in
a row (per-device, then device count), `ShardOptions(shard_index=
jax.process_index(), ...)`, an Orbax `CheckpointManager(item_names=
("parameters", "opt_state", "dataset"))` saving every few steps with
`should_save`, and a restore that loads the dataset's state only when
`load_dataset_state` is set; and an epoch-end state: Grain's counts the
records its `drop_remainder=True` batch read and dropped (loader's named
the last record of the last batch before the fix in
`loader/data_loader.py` `DataLoaderIterator._at_end`).

cjim8889/md4's md4/input_pipeline_pubchem_streaming.py:
`grain.config.update("py_debug_mode", True)` at import, a `MapDataset` of
Parquet paths with `shuffle(seed)` (positional), `repeat(num_epochs)` and
`[host::hosts]`, `.map(grain.experimental.ParquetIterDataset)`,
`InterleaveIterDataset(cycle_length=len(ds))`, `WindowShuffleIterDataset`,
a dataclass `MapTransform` returning `None` for an invalid molecule and a
dataclass `FilterTransform` dropping it, `batch(batch_size=...,
drop_remainder=True)`, `mp_prefetch(MultiprocessingOptions(...,
per_worker_buffer_size=16, enable_profiling=False))`, and `grain.load(source=
<a DataFrame-backed source>, shuffle=True, shard_options=ShardByJaxProcess(
drop_remainder=True), transformations=[map, filter], batch_size=...,
read_options=...)`.

Each snippet is the client's code, trimmed to its Grain parts, with small
generated data in place of flow fields, Hugging Face streams, ArrayRecord
corpora, MNIST and PubChem. Where README documents a difference
(worker-count-invariant batching, `ConcatThenSplitIterDataset`'s state,
`reader_options` overriding loader's defaults, an `ArrayRecordDataSource`'s
name in a DataLoader state, an interleave state without `future_states`),
the test compares with the documented behaviour.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import porting


# src/synthpix/make.py, data_sources/base.py, numpy.py and adapter.py, trimmed
# (no images, no episodes, no legacy schedulers; `Sampler` keeps only the
# state the checkpoint carries); `DATA` is a folder of flow_*.npy files.
SYNTHPIX = """
import glob
import json
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grain.python as grain
import numpy as np
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)


class FileDataSource(grain.RandomAccessDataSource, ABC):
    _file_pattern = "*"

    def __init__(self, dataset_path: list[str] | str) -> None:
        self._file_list = []
        if isinstance(dataset_path, str):
            dataset_path = [dataset_path]
        if (
            dataset_path is None
            or not isinstance(dataset_path, list)
            or not all(isinstance(f, str) for f in dataset_path)
        ):
            raise ValueError(
                "dataset_path must be a list of file paths (or a single string)."
            )
        for file_path in dataset_path:
            if os.path.isdir(file_path):
                pattern = os.path.join(file_path, self._file_pattern)
                found_files = sorted(glob.glob(pattern, recursive=True))
                self._file_list.extend(found_files)
            else:
                self._file_list.append(file_path)
        if not self._file_list:
            raise ValueError(
                f"No files found in {dataset_path} matching pattern {self._file_pattern}"
            )
        super().__init__()

    @property
    def file_list(self) -> list[str]:
        return self._file_list

    @property
    def include_images(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self._file_list)

    def __getitem__(self, record_key: int) -> dict[str, Any]:
        return self.load_file(self._file_list[record_key])

    @abstractmethod
    def load_file(self, file_path: str) -> dict[str, Any]:
        pass


class NumpyDataSource(FileDataSource):
    _file_pattern = "flow_*.npy"

    def __init__(self, dataset_path, include_images: bool = False) -> None:
        self._include_images = include_images
        super().__init__(dataset_path)
        if not all(fp.endswith(".npy") for fp in self._file_list):
            raise ValueError("All files must be numpy files with '.npy' extension")

    def __repr__(self) -> str:
        return (
            f"NumpyDataSource(file_list={self._file_list}, "
            f"include_images={self._include_images})"
        )

    def load_file(self, file_path: str) -> dict[str, Any]:
        flow = np.load(file_path)
        data = {"flow_fields": flow, "file": file_path}
        return data

    @property
    def include_images(self) -> bool:
        return self._include_images


@dataclass
class AddJAXSeed(grain.RandomMapTransform):
    def random_map(self, record: dict, rng: np.random.Generator) -> dict:
        record["jax_seed"] = rng.integers(0, 2**32 - 1)
        return record


class GrainSchedulerAdapter:
    def __init__(self, loader: grain.DataLoader):
        if not isinstance(loader, grain.DataLoader):
            raise ValueError("loader must be a grain.DataLoader instance")
        self.loader = loader
        if not hasattr(self.loader, "__iter__"):
            raise ValueError("loader must be iterable")
        self._iterator: grain.PyGrainDatasetIterator = iter(self.loader)
        self._cached_shape = None
        self._items_yielded = 0
        self._dataset_len = None
        self._num_epochs = None
        self._can_determine_epoch = False
        try:
            sampler = getattr(
                loader, "sampler", getattr(
                    loader, "_sampler", None))
            dataset = getattr(
                loader, "_data_source", getattr(
                    loader, "_dataset", None))
            if dataset is not None and hasattr(dataset, "__len__"):
                self._dataset_len = len(dataset)
            if sampler is not None:
                if hasattr(sampler, "num_epochs"):
                    self._num_epochs = sampler.num_epochs
                elif hasattr(sampler, "_num_epochs"):
                    self._num_epochs = sampler._num_epochs
            if self._dataset_len is not None and self._dataset_len > 0:
                self._can_determine_epoch = True
        except Exception:
            logger.warning("Could not determine epoch info from Grain loader.")
            self._can_determine_epoch = False

    def get_flow_fields_shape(self):
        if self._cached_shape is not None:
            return self._cached_shape
        temp_iter = iter(self.loader)
        batch = next(temp_iter)
        flow = batch["flow_fields"]
        res_shape = cast(tuple[int, int, int], tuple(flow.shape[1:]))
        self._cached_shape = res_shape
        return res_shape

    @property
    def include_images(self) -> bool:
        if hasattr(self.loader, "_data_source"):
            ds = self.loader._data_source
            return getattr(ds, "include_images", False)
        return False

    def _to_scheduler_data(self, batch: dict, target_batch_size: int):
        flow = batch["flow_fields"]
        files = tuple(batch.get("file", ()))
        jax_seed = batch.get("jax_seed")
        if not isinstance(flow, np.ndarray):
            raise ValueError(f"Flow fields must be a np.ndarray, got {type(flow)}")
        current_batch_size = flow.shape[0]
        is_padding = batch.get("_is_padding")
        respect_padding = True
        if self._can_determine_epoch and is_padding is not None:
            if self._num_epochs is None:
                respect_padding = False
            else:
                start_idx = self._items_yielded - current_batch_size
                epoch_idx = start_idx // self._dataset_len
                respect_padding = not epoch_idx < (self._num_epochs - 1)
        pad_size = target_batch_size - current_batch_size
        valid_mask = np.ones((target_batch_size,), dtype=bool)
        if pad_size > 0:
            valid_mask[current_batch_size:] = False
            padding = [(0, pad_size)] + [(0, 0)] * (flow.ndim - 1)
            flow = np.pad(flow, padding, mode="constant")
            files = files + ("",) * pad_size
        elif target_batch_size < current_batch_size:
            flow = flow[:target_batch_size]
            files = files[:target_batch_size]
            if jax_seed is not None:
                jax_seed = jax_seed[:target_batch_size]
        epoch = None
        if self._can_determine_epoch:
            start_idx = self._items_yielded - current_batch_size
            epoch = start_idx // self._dataset_len
        return dict(flow_fields=flow, files=files, mask=valid_mask, epoch=epoch, jax_seed=jax_seed)

    @property
    def grain_iterator(self) -> grain.PyGrainDatasetIterator:
        return self._iterator

    def get_batch(self, batch_size: int):
        try:
            batch = next(self._iterator)
        except StopIteration:
            raise StopIteration("Grain DataLoader exhausted.") from None
        if self._can_determine_epoch:
            bs = batch["flow_fields"].shape[0]
            self._items_yielded += bs
        return self._to_scheduler_data(batch, batch_size)

    @property
    def state(self) -> dict[str, Any]:
        return {"items_yielded": self._items_yielded}

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._items_yielded = value.get("items_yielded", 0)

    def reset(self) -> None:
        self._iterator = iter(self.loader)
        self._items_yielded = 0

    @property
    def file_list(self) -> list[str]:
        if hasattr(self.loader, "_data_source") and isinstance(
            self.loader._data_source, FileDataSource
        ):
            return list(self.loader._data_source.file_list)
        return []


def make_grain_scheduler(dataset_config, batch_size, randomize, loop):
    ds_kwargs = {}
    if dataset_config.get("file_list"):
        ds_kwargs["dataset_path"] = dataset_config["file_list"]
    else:
        ds_kwargs["dataset_path"] = []
    data_source = NumpyDataSource(**ds_kwargs)
    sampler_grain = grain.IndexSampler(
        num_records=len(data_source),
        shuffle=randomize,
        seed=dataset_config.get("seed", 0),
        shard_options=grain.NoSharding(),
        num_epochs=None if loop else 1,
    )
    worker_count = dataset_config.get("worker_count", 0)
    num_threads = dataset_config.get("num_threads", 16)
    buffer_size = dataset_config.get("buffer_size", 500)
    grain_loader = grain.DataLoader(
        data_source=data_source,
        sampler=sampler_grain,
        operations=[
            AddJAXSeed(),
            grain.Batch(batch_size=batch_size, drop_remainder=False)
        ],
        worker_count=worker_count,
        read_options=grain.ReadOptions(
            num_threads=num_threads, prefetch_buffer_size=buffer_size
        ),
    )
    return GrainSchedulerAdapter(grain_loader)


class Sampler:  # synthpix.sampler.Sampler, trimmed to its state
    def __init__(self, scheduler, batch_size):
        self.scheduler = scheduler
        self.batch_size = batch_size
        self._step = 0

    @property
    def grain_iterator(self):
        return self.scheduler.grain_iterator

    @property
    def state(self):
        return {"step": self._step, "scheduler": self.scheduler.state}

    @property
    def restore_state(self):
        return {"step": 0, "scheduler": {"items_yielded": 0}}

    @state.setter
    def state(self, value):
        self._step = int(value["step"])
        self.scheduler.state = {k: int(v) for k, v in value["scheduler"].items()}

    def __next__(self):
        self._step += 1
        return self.scheduler.get_batch(self.batch_size)


def checkpoint_args(sampler, is_restore=False):
    grain_iter = sampler.grain_iterator
    if grain_iter is None:
        raise ValueError("Sampler does not provide access to Grain iterator")
    if is_restore:
        return ocp.args.Composite(
            sampler=ocp.args.StandardRestore(sampler.restore_state),
            grain=grain.PyGrainCheckpointRestore(grain_iter),
        )
    else:
        return ocp.args.Composite(
            sampler=ocp.args.StandardSave(sampler.state),
            grain=grain.PyGrainCheckpointSave(grain_iter),
        )


def make(dataset_config, load_from=None):
    batch_size = dataset_config["batch_size"]
    scheduler = make_grain_scheduler(dataset_config, batch_size, dataset_config.get("randomize", False),
                                     dataset_config.get("loop", True))
    sampler = Sampler(scheduler, batch_size)
    if load_from:
        load_from = Path(load_from)
        mngr = ocp.CheckpointManager(load_from)
        latest_step = mngr.latest_step()
        if latest_step is None:
            raise ValueError(f"No checkpoints found in {load_from}")
        restore_args = checkpoint_args(sampler, is_restore=True)
        restored = mngr.restore(step=latest_step, args=restore_args)
        sampler.state = restored["sampler"]
    return sampler


def save_checkpoint(checkpoint_dir, sampler, step, max_to_keep=1):
    checkpoint_dir = Path(checkpoint_dir)
    mngr = ocp.CheckpointManager(
        checkpoint_dir,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True))
    save_args = checkpoint_args(sampler, is_restore=False)
    mngr.save(step=step, args=save_args)
    mngr.wait_until_finished()

def names(b):
    return {**b, "files": [os.path.basename(f) for f in b["files"]]}


def run(lib_dir, workers):
    cfg = {"file_list": [DATA], "batch_size": 3, "randomize": True, "loop": False, "seed": 7,
           "num_threads": 4, "buffer_size": 16, "worker_count": workers}
    s = make(cfg)
    sch = s.scheduler
    out = {"epoch_info": [sch._dataset_len, sch._num_epochs, sch._can_determine_epoch, sch.include_images,
                          [os.path.basename(f) for f in sch.file_list], sch.get_flow_fields_shape()]}
    batches = []
    while True:
        try:
            batches.append(next(s))
        except StopIteration as e:
            out["end"] = str(e)
            break
    out["batches"] = [names(b) for b in batches]
    loop_cfg = {**cfg, "loop": True}
    s = make(loop_cfg)
    first = [next(s) for _ in range(3)]
    save_checkpoint(os.path.join(lib_dir, "ckpt"), s, step=2)
    after = [next(s) for _ in range(4)]
    r = make(loop_cfg, load_from=os.path.join(lib_dir, "ckpt"))
    resumed = [next(r) for _ in range(4)]
    out["loop_epoch_info"] = [s.scheduler._num_epochs, r.state]
    out["after"] = [names(b) for b in after]
    out["resumed"] = [names(b) for b in resumed]
    out["files_in_state"] = sorted(os.listdir(os.path.join(lib_dir, "ckpt", "2", "grain")))
    with open(os.path.join(lib_dir, "ckpt", "2", "grain", "process_0-of-1.json")) as f:
        out["grain_state"] = json.loads(f.read())
    return out


def resume_from(checkpoint_dir, workers):
    cfg = {"file_list": [DATA], "batch_size": 3, "randomize": True, "loop": True, "seed": 7,
           "num_threads": 4, "buffer_size": 16, "worker_count": workers}
    r = make(cfg, load_from=checkpoint_dir)
    return [r.state] + [names(next(r)) for _ in range(4)]
"""


def write_flows(directory) -> str:
  data = os.path.join(directory, "flows")
  os.makedirs(data)
  for i in range(7):
    np.save(os.path.join(data, f"flow_{i}.npy"), np.full((4, 4, 2), i, np.float32))
  np.save(os.path.join(data, "other.npy"), np.zeros(1))  # not matched by flow_*.npy
  return data


def test_synthpix_grain_scheduler_adapter_and_orbax_checkpoint_as_on_grain(tmp_path):
  data = write_flows(tmp_path)
  g, l = porting.run_both(SYNTHPIX, DATA=data)
  for d in ("g", "l", "l2"):
    os.makedirs(tmp_path / d)
  g_out = g.run(str(tmp_path / "g"), 0)
  g_plain = porting.grain_keys(g_out)
  assert porting.grain_keys(l.run(str(tmp_path / "l"), 0)) == g_plain
  # With two workers loader's batches are those without workers (README,
  # "Worker-count-invariant batching"); its state keeps Grain's layout for
  # two workers, so only that part differs.
  l2 = porting.grain_keys(l.run(str(tmp_path / "l2"), 2))
  assert set(l2["grain_state"]["last_seen_indices"]) == {"0", "1"}
  assert {k: v for k, v in l2.items() if k != "grain_state"} == \
      {k: v for k, v in g_plain.items() if k != "grain_state"}
  # The adapter reads Grain's private attributes: 7 records, one epoch.
  assert g_plain["epoch_info"] == [7, 1, True, False, [f"flow_{i}.npy" for i in range(7)], [4, 4, 2]]
  assert g_plain["end"] == "Grain DataLoader exhausted."
  assert [b["mask"] for b in g_plain["batches"]] == [[True] * 3, [True] * 3, [True, False, False]]
  assert g_plain["batches"][-1]["files"][1:] == ["", ""]
  assert g_plain["resumed"] == g_plain["after"] and g_plain["loop_epoch_info"][0] is None
  assert g_plain["grain_state"]["data_source"].startswith("NumpyDataSource(file_list=[")
  # loader resumes Grain's Orbax checkpoint, with or without workers.
  expected = [{"step": 3, "scheduler": {"items_yielded": 9}}] + g_plain["after"]
  for workers in (0, 2):
    assert porting.grain_keys(l.resume_from(str(tmp_path / "g" / "ckpt"), workers)) == expected


SYNTHPIX_MOCKS = """
from unittest.mock import MagicMock

import grain.python as grain
import numpy as np

out = {}
loader = MagicMock(spec=grain.DataLoader)
loader.__iter__.return_value = iter([])
out["isinstance_mock"] = isinstance(loader, grain.DataLoader)
try:
    next(iter(loader))
except StopIteration:
    out["empty"] = "StopIteration"
mock_ds = MagicMock()
mock_ds.include_images = True
loader._data_source = mock_ds
out["mock_images"] = loader._data_source.include_images


class MockLoader(grain.DataLoader):
    def __init__(self):
        pass

    def __iter__(self):
        yield {"flow_fields": np.zeros((1, 64, 64, 2))}

    @property
    def _data_source(self):
        class MockDS:
            include_images = True
        return MockDS()


m = MockLoader()
out["subclass"] = [isinstance(m, grain.DataLoader), m._data_source.include_images,
                   next(iter(m))["flow_fields"].shape, getattr(m, "sampler", getattr(m, "_sampler", None))]


class EmptyLoader(grain.DataLoader):
    def __init__(self):
        pass

    def __iter__(self):
        return iter([])


e = EmptyLoader()
out["empty_subclass"] = [hasattr(e, "_data_source"), getattr(e, "_data_source", getattr(e, "_dataset", None)),
                         list(e)]
"""


def test_synthpix_adapter_test_doubles_of_data_loader_as_on_grain():
  g, l = porting.run_both(SYNTHPIX_MOCKS)
  assert porting.plain(l.out) == porting.plain(g.out)
  assert porting.plain(g.out) == {
      "isinstance_mock": True, "empty": "StopIteration", "mock_images": True,
      "subclass": [True, True, [1, 64, 64, 2], None], "empty_subclass": [False, None, []]}


# data/hf.py (`HFStreamingDataSource`, `Tokenize`, `GetInputAndTarget`,
# `get_hf_dataset`) and data/array_records.py with data/grain_transforms.py
# (whose `ParseArrayRecord` and `Tokenize(prepend_bos)`, here `TokenizeP`,
# use `pickle` and `np`, which that file forgets to import). `load_dataset`
# and `AutoTokenizer` are stand-ins: an iterable of rows that restarts on
# each `iter()`, and one id per character.
JAXIMUS = """
import os
import pickle

import grain
import numpy as np

class _Tok:
  bos_token_id = 1
  def encode(self, text, return_tensors=None):
    ids = [2 + (ord(c) % 30) for c in text]
    return np.asarray([ids]) if return_tensors == "np" else ids

class _HFStream:  # an HF IterableDataset: each iter() starts again
  def __init__(self, rows): self.rows = rows
  def __iter__(self): return iter(self.rows)

class HFStreamingDataSource(grain.sources.RandomAccessDataSource):
    def __init__(self, iterable_ds):
        self._ds = iterable_ds
        self._it = None

    def __len__(self) -> int:
        return 10_000_000_000

    def __getitem__(self, record_key: int):
        if self._it is None:
            self._it = iter(self._ds)
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self._ds)
            return next(self._it)

class Tokenize(grain.transforms.Map):
  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def map(self, x):
    return {"input_ids": self.tokenizer.encode(x['text'], return_tensors="np")[0]}

class GetInputAndTarget(grain.transforms.Map):
  def map(self, x):
    return x['input_ids'][:-1], x['input_ids'][1:]

def get_hf_dataset(rows, sequence_length, batch_size):
    tokenizer = _Tok()
    source = HFStreamingDataSource(_HFStream(rows))
    ds = (
        grain.MapDataset.source(source)
        .to_iter_dataset(read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1024))
        .map(Tokenize(tokenizer))
    )
    ds = (
        grain.experimental.ConcatThenSplitIterDataset(
            parent=ds,
            length_struct={"input_ids": sequence_length+1},
            bos_token_id=tokenizer.bos_token_id,
            bos_handling=grain.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
            bos_features={"input_ids"}
        )
        .map(GetInputAndTarget())
        .batch(batch_size)
    )
    return tokenizer, ds

class ParseArrayRecord(grain.transforms.Map):
  def map(self, x):
    return pickle.loads(x)

class Shift(grain.transforms.Map):
  def map(self, x):
    return (x["tokens"][:-1], x["tokens"][1:])

class TokenizeP(grain.transforms.Map):
  def __init__(self, tokenizer, prepend_bos=True):
    self.prepend_bos = prepend_bos
    self.tokenizer = tokenizer

  def map(self, x):
    tokens = self.tokenizer.encode(x["text"])
    if self.prepend_bos:
      return {"tokens": np.asarray([self.tokenizer.bos_token_id] + tokens, dtype=np.int32)}
    else:
      return {"tokens": np.asarray(tokens, dtype=np.int32)}

def get_array_record_dataset(path, sequence_length, batch_size, tokenizer=None, process_index=0, process_count=1):
    array_files = os.listdir(path)
    array_files = [f"{path}/{f}" for f in sorted(array_files) if f.endswith(".array_record")]
    ds = (
        grain.MapDataset.source(grain.sources.ArrayRecordDataSource(array_files))
        .map(ParseArrayRecord())
    )
    if tokenizer:
        ds = ds.map(TokenizeP(tokenizer, prepend_bos=True))
    ds = ds[process_index::process_count]
    ds = grain.experimental.ConcatThenSplitIterDataset(
        parent=ds,
        length_struct={"tokens": sequence_length + 1},
    )
    assert batch_size % process_count == 0, "batch_size must be divisible by process_count"
    local_batch_size = batch_size // process_count
    ds = ds.map(Shift()).batch(local_batch_size, drop_remainder=True)
    return ds
"""

JAXIMUS_STREAM = """
rows = [{"text": "the quick brown fox"[: 3 + i % 9] * (1 + i % 3)} for i in range(13)]


def stream(state=None):
    _, ds = get_hf_dataset(rows, 8, 3)
    it = iter(ds)
    if state is not None:
        it.set_state(state)
    return it


it = stream()
first = [next(it) for _ in range(4)]
state = it.get_state()
continued = [next(it) for _ in range(3)]
resumed_it = stream(state)
resumed = [next(resumed_it) for _ in range(3)]
"""


def write_text_records(directory) -> str:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  for shard in range(2):
    writer = ArrayRecordWriter(os.path.join(directory, f"part-{shard}.array_record"), "group_size:1")
    for i in range(9):
      writer.write(pickle.dumps({"text": "lorem ipsum dolor"[: 2 + (i * 5 + shard) % 13]}))
    writer.close()
  return str(directory)


def test_jaximus_streaming_source_concat_then_split_with_bos_as_on_grain(tmp_path):
  g, l = porting.run_both(JAXIMUS + JAXIMUS_STREAM)
  assert porting.plain(l.first) == porting.plain(g.first)
  assert porting.plain(l.continued) == porting.plain(g.continued)
  batch = porting.plain(g.first[0])
  assert np.asarray(batch[0]).shape == (3, 8) and [row[0] for row in batch[0]] == [1, 1, 1]  # BOS first
  assert batch[0][0][1:] == batch[1][0][:-1]  # targets are inputs shifted
  # The states differ in layout (README's table: "ours replay from an
  # earlier position, under another key"): Grain's holds the parent's
  # position, loader's an earlier one and the elements to read past it.
  assert set(g.state) == {"parent_state", "remainder_slices", "elements_from_buffer_after_checkpoint"}
  assert {"parent", "skip"} <= set(l.state) and "parent_state" not in l.state
  # A source that ignores its key restarts the stream in a new process: Grain
  # resumes at the saved position of that new stream, which starts over;
  # loader's replay reads the records before it again, so it continues.
  assert porting.plain(g.resumed) != porting.plain(g.continued)
  assert porting.plain(l.resumed) == porting.plain(l.continued)

  path = write_text_records(tmp_path)
  outs = {}
  for name, m in (("grain", g), ("loader", l)):
    it = iter(m.get_array_record_dataset(path, 6, 4, tokenizer=m._Tok(), process_index=1, process_count=2))
    first = [next(it) for _ in range(2)]
    state = it.get_state()
    outs[name] = (porting.plain(first), state, porting.plain(list(it)))
  assert outs["loader"][0] == outs["grain"][0] and outs["loader"][2] == outs["grain"][2]
  assert len(outs["grain"][2]) == 4 and {np.asarray(b[0]).shape for b in outs["grain"][2]} == {(2, 6)}  # 4 // 2 processes
  # Restored, each resumes its own state; loader also Grain's.
  for name, m, state in (("grain", g, outs["grain"][1]), ("loader", l, outs["loader"][1]),
                         ("loader", l, outs["grain"][1])):
    it = iter(m.get_array_record_dataset(path, 6, 4, tokenizer=m._Tok(), process_index=1, process_count=2))
    it.set_state(state)
    assert porting.plain(list(it)) == outs["grain"][2], name


# The task module as written (docstrings trimmed), less `Finite`; the flows
# of its training script are `run`.
IMPLY = """
from dataclasses import dataclass
import json
from pathlib import Path
import pickle
from typing import Iterable

import numpy as np
import grain
from grain._src.core import sharding, transforms
from grain._src.python import data_sources, samplers

class ImplySizeTask:
    STATS_KEYS = ("max_token", "max_pos", "max_seq")

    def __init__(self, ds_path, size_range=(2, 5), batch_size=128, *, shuffle=True, seed=None, worker_count=0,
                 reader_options=None, drop_remainder=False, return_rule_sets=False) -> None:
        self.ds_path = Path(ds_path)
        self.size_range = size_range
        self._sizes = self._normalize_sizes(size_range)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed if seed is not None else int(
            np.random.randint(0, np.iinfo(np.int32).max)
        )
        self.worker_count = worker_count
        self.reader_options = reader_options
        self.drop_remainder = drop_remainder
        self.return_rule_sets = return_rule_sets
        self.stats = self._stats_from_metadata(self.ds_path, self._sizes)
        self._epoch = 0
        self._data_source = self._build_data_source()
        self._dataloader = self._build_dataloader()
        self._iterator = iter(self._dataloader)

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            self._epoch += 1
            self._dataloader = self._build_dataloader()
            self._iterator = iter(self._dataloader)
            return next(self._iterator)

    def __iter__(self):
        return self

    @staticmethod
    def _normalize_sizes(size_range) -> list[int]:
        if isinstance(size_range, int):
            return [size_range]
        if isinstance(size_range, tuple) and len(size_range) == 2:
            start, end = size_range
            if start > end:
                start, end = end, start
            return list(range(start, end + 1))
        return list(size_range)

    @classmethod
    def _stats_from_metadata(cls, ds_path: Path, sizes: Iterable[int]) -> dict:
        metadata_path = ds_path / "metadata.json"
        if not metadata_path.exists():
            raise FileNotFoundError(
                f"Missing metadata at {metadata_path}. Regenerate the dataset."
            )
        metadata = json.loads(metadata_path.read_text())
        sizes_meta = metadata.get("sizes", {})
        stats_list = []
        missing = []
        for size in sizes:
            size_meta = sizes_meta.get(str(size))
            if not size_meta or "stats" not in size_meta:
                missing.append(size)
                continue
            stats_list.append(size_meta["stats"])
        if missing:
            raise ValueError(
                f"Missing stats for sizes {missing} in {metadata_path}."
            )
        return {
            key: max(int(stats[key]) for stats in stats_list)
            for key in cls.STATS_KEYS
        }

    def _collect_shards(self, sizes: Iterable[int]) -> list[str]:
        shards: list[str] = []
        for size in sizes:
            size_dir = self.ds_path / f"size_{size:02d}"
            if not size_dir.exists():
                raise FileNotFoundError(f"Missing size directory: {size_dir}")
            size_shards = sorted(size_dir.glob("shard_*.array_record"))
            if not size_shards:
                raise FileNotFoundError(f"No shards found in {size_dir}")
            shards.extend(str(p) for p in size_shards)
        return shards

    def _build_data_source(self):
        shards = self._collect_shards(self._sizes)
        return data_sources.ArrayRecordDataSource(
            shards,
            reader_options=self.reader_options,
        )

    def _build_dataloader(self) -> grain.DataLoader:
        shard_opts = sharding.NoSharding()
        sampler = samplers.IndexSampler(
            num_records=len(self._data_source),
            shard_options=shard_opts,
            shuffle=self.shuffle,
            num_epochs=1,
            seed=self.seed + self._epoch if self.shuffle else None,
        )
        operations = [
            _DecodeRecord(),
            transforms.Batch(
                batch_size=self.batch_size,
                drop_remainder=self.drop_remainder,
                batch_fn=_batch_records_with_rule_sets
                if self.return_rule_sets
                else _batch_records,
            ),
        ]
        return grain.DataLoader(
            data_source=self._data_source,
            sampler=sampler,
            operations=operations,
            worker_count=self.worker_count,
            shard_options=shard_opts,
        )

try:
    @dataclass(frozen=True)
    class _DecodeRecord(transforms.MapTransform):
        def map(self, element):
            return pickle.loads(element)
    decode_error = None
except AttributeError as e:
    decode_error = str(e)
    @dataclass(frozen=True)
    class _DecodeRecord(transforms.Map):
        def map(self, element):
            return pickle.loads(element)

def _normalize_rule_array(rule):
    rule = np.asarray(rule, dtype=np.int32)
    if rule.ndim == 1:
        if rule.size == 0:
            return np.zeros((0, 2), dtype=np.int32)
        if rule.shape[0] != 2:
            raise ValueError(f"Rule token must have length 2, got {rule.shape}")
        return rule.reshape(1, 2)
    if rule.ndim == 2:
        if rule.shape[1] != 2:
            raise ValueError(f"Rule token must have shape (n, 2), got {rule.shape}")
        return rule
    raise ValueError(f"Rule token must be 1D or 2D, got {rule.shape}")

def _batch_records(records):
    if not records:
        return (np.zeros((0, 0), dtype=np.int32), np.zeros((0, 2), dtype=np.int32))
    batch_size = len(records)
    max_seq = max(rec["sequent"].shape[0] for rec in records)
    normalized_rules = [_normalize_rule_array(rec["rule"]) for rec in records]
    seq_batch = np.zeros((batch_size, max_seq), dtype=np.int32)
    rules_batch = np.zeros((batch_size, 2), dtype=np.int32)
    for idx, rec in enumerate(records):
        sequent = rec["sequent"]
        seq_batch[idx, : sequent.shape[0]] = sequent
        rule = normalized_rules[idx]
        if rule.shape[0] == 0:
            raise ValueError("Cannot sample rule from empty rule list.")
        pick = np.random.randint(rule.shape[0])
        rules_batch[idx, :] = rule[pick]
    return seq_batch, rules_batch

def _batch_records_with_rule_sets(records):
    batch_size = len(records)
    max_seq = max(rec["sequent"].shape[0] for rec in records)
    normalized_rules = [_normalize_rule_array(rec["rule"]) for rec in records]
    max_rules = max(rule.shape[0] for rule in normalized_rules)
    seq_batch = np.zeros((batch_size, max_seq), dtype=np.int32)
    rules_batch = np.zeros((batch_size, 2), dtype=np.int32)
    rule_set_batch = np.zeros((batch_size, max_rules, 2), dtype=np.int32)
    rule_set_mask = np.zeros((batch_size, max_rules), dtype=bool)
    for idx, rec in enumerate(records):
        sequent = rec["sequent"]
        seq_batch[idx, : sequent.shape[0]] = sequent
        rule = normalized_rules[idx]
        rule_set_batch[idx, : rule.shape[0], :] = rule
        rule_set_mask[idx, : rule.shape[0]] = True
        pick = np.random.randint(rule.shape[0])
        rules_batch[idx, :] = rule[pick]
    return seq_batch, rules_batch, rule_set_batch, rule_set_mask


def run(data, grain_state=None):
    # The rule-set loader first, alone: `_batch_records*` draw from the
    # global numpy RNG, and a loader computes ahead on its thread (README,
    # "Computing ahead"), so a pick is reproducible only while one loader
    # runs. The other sizes' records have one rule each.
    np.random.seed(0)
    fixed = ImplySizeTask(data, size_range=[3], batch_size=5, shuffle=False, return_rule_sets=True,
                          drop_remainder=True)
    fixed_batches = list(fixed._dataloader)
    task = ImplySizeTask(data, size_range=[4, 2], batch_size=4, seed=3, reader_options={"max_parallelism": "1"})
    stream = [next(task) for _ in range(12)]
    state = task._iterator.get_state()
    out = {"decode_error": decode_error, "stats": task.stats, "epoch": task._epoch, "n_src": len(task._data_source),
           "seed_none": fixed._dataloader._sampler._seed, "stream": stream, "state": json.loads(state),
           "fixed": fixed_batches}
    again = ImplySizeTask(data, size_range=[4, 2], batch_size=4, seed=3)
    for _ in range(10):  # to the same epoch (the sampler's seed is seed + epoch)
        next(again)
    again._iterator.set_state(state if grain_state is None else grain_state)
    out["resumed"] = [next(again) for _ in range(3)]
    out["continued"] = [next(task) for _ in range(3)]
    try:
        ImplySizeTask(data, size_range=(4, 5))
    except ValueError as e:
        out["missing"] = str(e)
    out["swapped"] = ImplySizeTask(data, size_range=(4, 2), batch_size=4, shuffle=False)._sizes
    return out, state
"""


def write_imply_dataset(directory) -> str:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  meta = {"sizes": {"5": {}}}
  for size in (2, 3, 4):
    size_dir = os.path.join(directory, f"size_{size:02d}")
    os.makedirs(size_dir)
    for shard in range(2):
      writer = ArrayRecordWriter(os.path.join(size_dir, f"shard_{shard:03d}.array_record"), "group_size:1")
      for i in range(3 + size):
        # Several rules only for size 3 (read alone, see IMPLY's `run`).
        n_rules = 1 + (i + size) % 3 if size == 3 else 1
        rule = rng.integers(0, 5, size=(n_rules, 2)) if n_rules > 1 else np.array([size, i])
        writer.write(pickle.dumps({"sequent": rng.integers(1, 9, size=2 + (i * size) % 5).astype(np.int32),
                                    "rule": rule.astype(np.int32)}))
      writer.close()
    meta["sizes"][str(size)] = {"stats": {"max_token": 9 + size, "max_pos": 4 * size, "max_seq": 6 + size}}
  with open(os.path.join(directory, "metadata.json"), "w", encoding="utf-8") as f:
    json.dump(meta, f)
  return str(directory)


def test_imply_size_task_private_modules_batch_fn_and_epoch_rebuilds_as_on_grain(tmp_path):
  data = write_imply_dataset(tmp_path)
  g, l = porting.run_both(IMPLY)
  g_out, g_state = g.run(data)
  l_out, _ = l.run(data)
  g_error, l_error = g_out.pop("decode_error"), l_out.pop("decode_error")
  assert g_error == "module 'grain._src.core.transforms' has no attribute 'MapTransform'"
  assert l_error.startswith("module 'loader._src.core.transforms' has no attribute 'MapTransform'")
  # An ArrayRecordDataSource is named in a DataLoader state by loader's repr
  # (README's table: "DataLoader"); all else is Grain's.
  g_source, l_source = g_out["state"].pop("data_source"), l_out["state"].pop("data_source")
  assert g_source.startswith("ArrayRecordDataSource(hash_of_paths=")
  assert l_source.startswith("ArrayRecordDataSource(4 files, 24 records")
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  g_plain = porting.plain(g_out)
  # 24 records of sizes 4 then 2, six batches an epoch: the twelfth batch
  # is the last of epoch 1, read with seed 3 + 1.
  assert g_plain["epoch"] == 1 and g_plain["n_src"] == 24 and g_plain["seed_none"] is None
  assert g_plain["swapped"] == [2, 3, 4] and g_plain["state"]["last_seen_indices"] == {"0": 23}
  assert g_plain["stats"] == {"max_token": 13, "max_pos": 16, "max_seq": 10}
  assert g_plain["state"]["sampler"].endswith("num_epochs=1, seed=4)")
  assert g_plain["resumed"] == g_plain["continued"]
  assert g_plain["missing"].startswith("Missing stats for sizes [5]")
  assert [np.asarray(part).shape for part in g_out["fixed"][0]] == [(5, 6), (5, 2), (5, 3, 2), (5, 3)]
  # loader resumes Grain's state.
  l_again, _ = l.run(data, grain_state=g_state)
  assert porting.plain(l_again["resumed"]) == g_plain["continued"]


def test_arrayrecord_reader_options_with_readahead_as_documented(tmp_path):
  data = write_imply_dataset(tmp_path)
  snippet = IMPLY + """
task = ImplySizeTask(DATA, size_range=2, batch_size=2, shuffle=False,
                     reader_options={"readahead_buffer_size": "0"})
try:
    first = next(task)
except ValueError as e:
    first = str(e)
"""
  g, l = porting.run_both(snippet, DATA=data)
  # Grain's ArrayRecordDataSource puts its own readahead_buffer_size before
  # the user's options and the reader refuses the duplicate at the first
  # read; loader's `reader_options` keys override its defaults (README's
  # table: "ArrayRecordDataSource").
  assert g.first == "Option readahead_buffer_size is present more than once"
  assert porting.plain(l.first) == porting.plain(next(iter(l.ImplySizeTask(data, size_range=2, batch_size=2,
                                                                            shuffle=False)._dataloader)))


# The token reader as written (docstrings trimmed, no `from __future__`:
# the snippet's dataclass is not in sys.modules); its use is `run`.
TOKENS = """

from dataclasses import dataclass, field
from pathlib import Path
import struct
from typing import Any, Iterator, Mapping

import grain  # type: ignore[import-not-found]
import numpy as np

TOKEN_FILE_GLOB = "tokens-*.arrayrecord"
Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class DatasetConfig:
    data_dir: Path | str = Path("climbmix_tokens")
    batch_size: int = 8
    sequence_length: int = 1024
    shuffle: bool = True
    seed: int | None = 0
    repeat: bool = True
    drop_remainder: bool = True
    reader_options: Mapping[str, str] = field(default_factory=dict)

    def normalized_data_dir(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()


def list_arrayrecord_files(data_dir: Path | str) -> list[Path]:
    root = Path(data_dir).expanduser().resolve()
    files = sorted(root.glob(TOKEN_FILE_GLOB))
    if not files:
        raise FileNotFoundError(
            f"No files matching {TOKEN_FILE_GLOB!r} found in {root}."
        )
    return files


def decode_token_record(record: bytes) -> np.ndarray:
    if len(record) < 4:
        raise ValueError("Invalid token record: payload is too short.")
    (num_tokens,) = struct.unpack_from("<I", record, 0)
    payload = memoryview(record)[4:]
    expected_payload_bytes = num_tokens * np.dtype(np.int32).itemsize
    if len(payload) != expected_payload_bytes:
        raise ValueError(
            "Invalid token record size: expected "
            f"{expected_payload_bytes} bytes, got {len(payload)}."
        )
    return np.frombuffer(payload, dtype=np.int32, count=num_tokens)


def build_grain_token_dataset(config: DatasetConfig) -> Any:
    files = list_arrayrecord_files(config.normalized_data_dir())
    source = grain.sources.ArrayRecordDataSource(
        paths=[str(path) for path in files],
        reader_options=dict(config.reader_options) or None,
    )
    ds = grain.MapDataset.source(source).map(decode_token_record)
    if config.shuffle:
        ds = ds.shuffle() if config.seed is None else ds.shuffle(seed=config.seed)
    if config.repeat:
        ds = ds.repeat()
    return ds


def _iter_token_windows(token_records: Iterator[np.ndarray], sequence_length: int) -> Iterator[np.ndarray]:
    window_size = sequence_length + 1
    carry = np.empty((0,), dtype=np.int32)
    for record in token_records:
        if record.size == 0:
            continue
        record_i32 = record.astype(np.int32, copy=False)
        if carry.size == 0:
            stream = record_i32
        else:
            stream = np.concatenate((carry, record_i32))
        while stream.size >= window_size:
            yield stream[:window_size]
            stream = stream[sequence_length:]
        carry = stream


def _batch_windows(windows: Iterator[np.ndarray], batch_size: int, drop_remainder: bool) -> Iterator[Batch]:
    first_window = next(windows, None)
    if first_window is None:
        return
    seq_len = first_window.size - 1
    inputs = np.empty((batch_size, seq_len), dtype=np.int32)
    targets = np.empty((batch_size, seq_len), dtype=np.int32)
    batch_pos = 0

    def add_window(window: np.ndarray) -> None:
        nonlocal batch_pos
        inputs[batch_pos] = window[:-1]
        targets[batch_pos] = window[1:]
        batch_pos += 1

    add_window(first_window)
    if batch_pos == batch_size:
        yield {"inputs": inputs, "targets": targets}
        inputs = np.empty((batch_size, seq_len), dtype=np.int32)
        targets = np.empty((batch_size, seq_len), dtype=np.int32)
        batch_pos = 0
    for window in windows:
        add_window(window)
        if batch_pos == batch_size:
            yield {"inputs": inputs, "targets": targets}
            inputs = np.empty((batch_size, seq_len), dtype=np.int32)
            targets = np.empty((batch_size, seq_len), dtype=np.int32)
            batch_pos = 0
    if batch_pos and not drop_remainder:
        yield {
            "inputs": inputs[:batch_pos].copy(),
            "targets": targets[:batch_pos].copy(),
        }


def _validate_training_config(config: DatasetConfig) -> None:
    if config.batch_size <= 0:
        raise ValueError("batch_size must be > 0")
    if config.sequence_length <= 0:
        raise ValueError("sequence_length must be > 0")


def build_training_dataset(config: DatasetConfig) -> Iterator[Batch]:
    _validate_training_config(config)
    grain_token_dataset = build_grain_token_dataset(config)
    token_records = iter(grain_token_dataset.to_iter_dataset())
    windows = _iter_token_windows(token_records=token_records, sequence_length=config.sequence_length)
    return _batch_windows(windows=windows, batch_size=config.batch_size, drop_remainder=config.drop_remainder)

def err(f):
    try:
        r = f()
        return ["ok", r]
    except Exception as e:
        return [type(e).__name__, str(e)]

import itertools


def run(DATA, BAD):
  cfg = DatasetConfig(data_dir=DATA, batch_size=3, sequence_length=5, seed=11)
  return {
    "train": list(itertools.islice(build_training_dataset(cfg), 6)),
    "once": list(build_training_dataset(DatasetConfig(data_dir=DATA, batch_size=4, sequence_length=4, shuffle=False,
                                                    repeat=False, drop_remainder=False))),
    "records": list(build_grain_token_dataset(DatasetConfig(data_dir=DATA, shuffle=False, repeat=False,
                                            reader_options={"index_storage_option": "in_memory"}))),
    "seedless": err(lambda: build_grain_token_dataset(DatasetConfig(data_dir=DATA, seed=None))),
    "no_files": err(lambda: build_grain_token_dataset(DatasetConfig(data_dir=DATA + "/nope"))),
    "bad_record": err(lambda: next(build_training_dataset(DatasetConfig(data_dir=BAD, batch_size=1, sequence_length=1)))),
    "bad_batch": err(lambda: build_training_dataset(DatasetConfig(data_dir=DATA, batch_size=0))),
    }
"""


def write_token_shards(directory) -> tuple[str, str]:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  good = os.path.join(directory, "good")
  bad = os.path.join(directory, "bad")
  os.makedirs(good)
  os.makedirs(bad)
  for shard in range(3):
    writer = ArrayRecordWriter(os.path.join(good, f"tokens-{shard:05d}.arrayrecord"), "group_size:1")
    for i in range(6):
      tokens = rng.integers(0, 50, size=int(rng.integers(0 if i == 2 else 1, 9))).astype(np.int32)
      writer.write(struct.pack("<I", tokens.size) + tokens.tobytes())
    writer.close()
  writer = ArrayRecordWriter(os.path.join(bad, "tokens-00000.arrayrecord"), "group_size:1")
  writer.write(struct.pack("<I", 3) + np.arange(2, dtype=np.int32).tobytes())
  writer.close()
  return good, bad


def test_token_shard_reader_windows_over_shuffled_arrayrecords_as_on_grain(tmp_path):
  good, bad = write_token_shards(tmp_path)
  g, l = porting.run_both(TOKENS)
  g_out, l_out = porting.plain(g.run(good, bad)), porting.plain(l.run(good, bad))
  g_seedless, l_seedless = g_out.pop("seedless"), l_out.pop("seedless")
  assert l_out == g_out
  # A seedless `shuffle()`: the same ValueError (the messages, both pointing
  # to `ds.seed(...)`, are worded differently).
  assert g_seedless[0] == l_seedless[0] == "ValueError" and "seed" in g_seedless[1] and "seed" in l_seedless[1]
  assert [np.asarray(b["inputs"]).shape for b in g_out["train"]] == [(3, 5)] * 6
  assert g_out["train"][0]["targets"][0][:-1] == g_out["train"][0]["inputs"][0][1:]
  assert len(g_out["records"]) == 18 and sum(len(r) for r in g_out["records"]) > 0
  assert g_out["no_files"][0] == "FileNotFoundError"
  assert g_out["bad_record"] == ["ValueError", "Invalid token record size: expected 12 bytes, got 8."]
  assert g_out["bad_batch"] == ["ValueError", "batch_size must be > 0"]


# The trainer template: dataset/dataset_mnist.py and dataset/__init__.py as
# written, `Trainer`'s checkpointing as written, its Equinox parts (filter_jit,
# partitions) replaced by a dict of numpy arrays; `tfds.data_source` gives
# local records.
TRAINER = """
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
import orbax.checkpoint as ocp
from einops import repeat
from grain.python import (
    BatchOperation,
    DataLoader,
    IndexSampler,
    PyGrainDatasetIterator,
    ShardOptions,
)
from grain.python import MapTransform, RandomAccessDataSource, Transformations
from grain.python import (
    PyGrainCheckpointRestore,
    PyGrainCheckpointSave,
)


class tfds:  # tfds.data_source("mnist", split="train"), as local records
    @staticmethod
    def data_source(name, split):
        rng = np.random.default_rng(0)
        return [{"image": rng.integers(0, 255, size=(4, 4, 1), dtype=np.uint8), "label": i % 10} for i in range(23)]


@dataclass
class DatasetMnistCfg:
    name: Literal["mnist"]


class DatasetMnist:
    def __init__(self, cfg):
        self.cfg = cfg

    def get_data_source(self) -> RandomAccessDataSource[Any]:
        return tfds.data_source("mnist", split="train")

    def get_transformations(self) -> Transformations:
        class Convert(MapTransform):
            def map(self, element):
                return {"rgb": repeat(element["image"], "h w () -> h w c", c=3)}

        return [Convert()]


DatasetCfg = DatasetMnistCfg


@dataclass
class DataLoaderCfg:
    per_device_batch_size: int
    worker_count: int
    worker_buffer_size: int
    num_epochs: int | None


def get_dataset_iterator(dataset_cfg: DatasetCfg, data_loader_cfg: DataLoaderCfg) -> PyGrainDatasetIterator:
    dataset = {"mnist": DatasetMnist}[dataset_cfg.name](dataset_cfg)
    data_source = dataset.get_data_source()
    operations = [
        *dataset.get_transformations(),
        BatchOperation(data_loader_cfg.per_device_batch_size, True),
        BatchOperation(jax.local_device_count(), True),
    ]
    loader = DataLoader(
        data_source=data_source,
        worker_count=data_loader_cfg.worker_count,
        worker_buffer_size=data_loader_cfg.worker_buffer_size,
        operations=operations,
        sampler=IndexSampler(
            num_records=len(data_source),
            num_epochs=data_loader_cfg.num_epochs,
            shard_options=ShardOptions(
                shard_index=jax.process_index(),
                shard_count=jax.process_count(),
                drop_remainder=True,
            ),
            shuffle=False,
            seed=0,
        ),
    )
    return iter(loader)


@dataclass(frozen=True)
class CheckpointingCfg:
    save_interval_steps: int
    max_to_keep: int
    load_dataset_state: bool


@dataclass(frozen=True)
class TrainerCfg:
    num_steps: int
    log_every: int
    checkpointing: CheckpointingCfg
    on_existing_workspace: Literal["restore", "overwrite", "throw"]


def get_distributed_sharding(x):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


class Trainer:
    def __init__(self, cfg: TrainerCfg, workspace: Path) -> None:
        self.cfg = cfg
        self.workspace = workspace
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=cfg.checkpointing.save_interval_steps,
            max_to_keep=cfg.checkpointing.max_to_keep,
        )
        checkpoint_dir = workspace / "checkpoints"
        self.manager = ocp.CheckpointManager(
            checkpoint_dir,
            options=options,
            item_names=("parameters", "opt_state", "dataset"),
        )
        checkpoint_dir.mkdir(exist_ok=True, parents=True)
        self.seen = []

    def train(self, get_trainable, dataset: PyGrainDatasetIterator) -> None:
        step, trainable, opt_state = self.init_or_handle_existing_workspace(get_trainable, dataset)
        self.start_step = step
        while step < self.cfg.num_steps:
            self.save(step, trainable, opt_state, dataset)
            batch = self.get_batch(dataset)
            self.seen.append(np.asarray(batch["rgb"]))
            trainable = {"w": trainable["w"] + np.asarray(batch["rgb"], np.float32).mean()}
            opt_state = {"count": opt_state["count"] + 1}
            step += 1
        self.save(step, trainable, opt_state, dataset)
        self.manager.wait_until_finished()
        return trainable, opt_state

    def init(self, get_trainable):
        return get_trainable(), {"count": np.zeros((), np.int32)}

    def save(self, step, trainable, opt_state, dataset: PyGrainDatasetIterator, force: bool = False) -> None:
        if not (self.manager.should_save(step) or force):
            return
        args = ocp.args.Composite(
            parameters=ocp.args.StandardSave(trainable),
            opt_state=ocp.args.StandardSave(opt_state),
            dataset=PyGrainCheckpointSave(dataset),
        )
        self.manager.save(step, args=args, force=force)

    def restore(self, step, get_trainable, dataset: PyGrainDatasetIterator):
        if step is None:
            step = self.manager.latest_step()
        trainable, opt_state = self.init(get_trainable)
        args = dict(
            parameters=ocp.args.StandardRestore(trainable),
            opt_state=ocp.args.StandardRestore(opt_state),
        )
        if self.cfg.checkpointing.load_dataset_state:
            args["dataset"] = PyGrainCheckpointRestore(dataset)
        restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        return step, restored["parameters"], restored["opt_state"]

    def init_or_handle_existing_workspace(self, get_trainable, dataset: PyGrainDatasetIterator):
        if self.cfg.on_existing_workspace == "throw" and self.workspace.exists():
            raise Exception("Workspace already exists!")
        elif self.cfg.on_existing_workspace == "overwrite":
            shutil.rmtree(self.workspace, True)
        elif self.cfg.on_existing_workspace == "restore":
            try:
                return self.restore(None, get_trainable, dataset)
            except FileNotFoundError:
                pass
        return 0, *self.init(get_trainable)

    def get_batch(self, dataset: PyGrainDatasetIterator):
        batch = next(dataset)
        return jax.tree.map(
            lambda x, sharding: jax.make_array_from_process_local_data(sharding, x),
            batch,
            {k: get_distributed_sharding(v) for k, v in batch.items()},
        )


def training_run(workspace, workers, load_dataset_state, num_steps):
    ck = CheckpointingCfg(save_interval_steps=3, max_to_keep=2, load_dataset_state=load_dataset_state)
    trainer = Trainer(TrainerCfg(num_steps=num_steps, log_every=1, checkpointing=ck, on_existing_workspace="restore"),
                      Path(workspace))
    dl_cfg = DataLoaderCfg(per_device_batch_size=2, worker_count=workers, worker_buffer_size=1, num_epochs=None)
    dataset = get_dataset_iterator(DatasetMnistCfg("mnist"), dl_cfg)
    params, opt = trainer.train(lambda: {"w": np.zeros((), np.float32)}, dataset)
    return trainer, params, opt


def run(workspace, workers, load_dataset_state=True):
    ws = Path(workspace)
    first, params, opt = training_run(ws, workers, load_dataset_state, 7)
    second, params2, opt2 = training_run(ws, workers, load_dataset_state, 12)
    kept = sorted(int(p.name) for p in (ws / "checkpoints").iterdir() if p.name.isdigit())
    with open(ws / "checkpoints" / "12" / "dataset" / "process_0-of-1.json") as f:
        state = json.loads(f.read())
    return {"first": first.seen, "second_start": second.start_step, "second": second.seen, "kept": kept,
            "opt": [opt, opt2], "params": [params, params2], "state": state,
            "files": sorted(p.name for p in (ws / "checkpoints" / "12" / "dataset").iterdir())}
"""


def test_equinox_trainer_template_orbax_item_names_and_dataset_restore_as_on_grain(tmp_path):
  g, l = porting.run_both(TRAINER)
  for load_dataset_state in (True, False):
    g_out = porting.grain_keys(g.run(str(tmp_path / f"g{load_dataset_state}"), 0, load_dataset_state))
    assert porting.grain_keys(l.run(str(tmp_path / f"l{load_dataset_state}"), 0, load_dataset_state)) == g_out
    # Two workers: the same batches (README, "Worker-count-invariant
    # batching"); the state keeps Grain's layout for two workers.
    l2 = porting.grain_keys(l.run(str(tmp_path / f"w{load_dataset_state}"), 2, load_dataset_state))
    assert l2.pop("state")["worker_count"] == 2
    assert l2 == {k: v for k, v in g_out.items() if k != "state"}
    assert g_out["second_start"] == 6 and g_out["kept"] == [9, 12] and len(g_out["second"]) == 6
    assert g_out["opt"] == [{"count": 7}, {"count": 12}] and g_out["files"] == ["commit_success.txt",
                                                                                 "process_0-of-1.json"]
    # The checkpoint of step 6 holds the iterator after six batches: with its
    # state the second run goes on with the seventh; without, it starts over.
    assert g_out["second"][0] == (g_out["first"][6] if load_dataset_state else g_out["first"][0])
    assert np.asarray(g_out["first"][0]).shape == (1, 2, 4, 4, 3)  # two batch dimensions, RGB
    # loader's second run resumes from Grain's first run's checkpoints.
    g_ws, l_ws = tmp_path / f"g1{load_dataset_state}", tmp_path / f"l1{load_dataset_state}"
    g.training_run(str(g_ws), 0, load_dataset_state, 7)
    shutil.copytree(g_ws, l_ws)
    second, _, opt = l.training_run(str(l_ws), 0, load_dataset_state, 12)
    assert second.start_step == 6 and porting.plain(opt) == {"count": 12}
    assert porting.plain(second.seen) == g_out["second"]


TRAINER_EPOCH_END = """
def epoch(drop_remainder=True, state=None):
    # get_dataset_iterator's DataLoader for one epoch; an evaluation variant
    # keeps the last, partial batch.
    dl_cfg = DataLoaderCfg(per_device_batch_size=2, worker_count=0, worker_buffer_size=1, num_epochs=1)
    it = get_dataset_iterator(DatasetMnistCfg("mnist"), dl_cfg)
    if not drop_remainder:
        dataset = DatasetMnist(None)
        source = dataset.get_data_source()
        sampler = IndexSampler(num_records=len(source), num_epochs=1, shuffle=False, seed=0,
                               shard_options=ShardOptions(shard_index=jax.process_index(),
                                                          shard_count=jax.process_count(), drop_remainder=True))
        it = iter(DataLoader(data_source=source, sampler=sampler,
                             operations=[*dataset.get_transformations(), BatchOperation(2, False)]))
    if state is not None:
        it.set_state(state)
    return it


it = epoch()
batches = list(it)
end_state = it.get_state()
rest_same_ops = list(epoch(state=end_state))
rest_other_ops = list(epoch(drop_remainder=False, state=end_state))
"""


def test_equinox_trainer_epoch_end_state_counts_the_dropped_records_as_on_grain():
  g, l = porting.run_both(TRAINER + TRAINER_EPOCH_END)
  # 23 records in batches of 2 with drop_remainder=True: 11 batches, record 22
  # read and dropped. Grain's state after the end names it (Grain's batch
  # reads the partial batch before dropping it), so a resume, even with
  # drop_remainder=False, reads nothing more. (loader named record 21 and
  # gave [22] to the evaluation variant.)
  assert len(g.batches) == len(l.batches) == 11
  g_state, l_state = json.loads(g.end_state), json.loads(l.end_state)
  assert g_state["last_seen_indices"] == {"0": 22}
  assert porting.grain_keys(l_state) == porting.grain_keys(g_state)
  assert g.rest_same_ops == l.rest_same_ops == []
  assert g.rest_other_ops == l.rest_other_ops == []
  # loader resumes Grain's end state the same way.
  assert list(l.epoch(drop_remainder=False, state=g.end_state)) == []

