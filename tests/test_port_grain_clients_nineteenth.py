"""Round 22's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

google-deepmind/nanodo's nanodo/data.py (`py_batched_tfds`,
`py_batched_tfds_for_eval`): a `DataLoader` over a TFDS-style source whose
operations are Grain's deprecated `MapOperation(map_function=
functools.partial(...))`, a dataclass operation called on the iterator of
`grain.Record`s that packs tokens across records ("Noam" packing) and yields
new `grain.Record(input_record.metadata.remove_record_key(), ...)`, then
`grain.Batch`; `MapOperation(map_function=np.array)`; an eval loader over an
`IndexSampler` without `num_epochs` (endless) batched with
`drop_remainder=False`; a state saved mid-stream and restored (the packer's
buffer is lost there, as the client's comment says); a record without the
field the map reads (a legacy operation's error ends the stream).

vpareek2/research's src/jaxtitan/data/pipeline.py (`PreparedTokenDataSource`,
`PreparedTokenGrainPipeline`): a `RandomAccessDataSource` with its own
`__repr__` and an int-only `__getitem__`, a `DataLoader` given
`shard_options=` beside its sampler's, `repr(sampler)` kept as the pipeline's
identity, the iterator's bytes state decoded into the client's frozen
dataclass state and encoded again with `json.dumps(..., indent=4,
sort_keys=True)` for `set_state`, a `StopIteration` re-raised with a message
at the end of the split, and `close()` called where the iterator has one.

LucMc/continual-learning's continual_learning_2/data/base.py (and its later
continual_learning/data/base.py, mnist.py and trainers/
continual_supervised_learning.py): Hugging Face-style splits filtered per task
as `DataLoader` sources, `IndexSampler`s without `shard_options`, a class-level
`OPERATIONS` list spliced before `grain.Batch`, `PermuteInputs` (a
`MapTransform` with an `__init__`), and per-task seeds drawn with
`rng.integers(0, sys.maxsize)`: numpy integers, which Grain's `IndexSampler`
refuses with a TypeError (the repository later wrote `int(seed)` from
`rng.integers(0, 99999)`); its Orbax checkpointing of the `DataLoader` itself
(`PyGrainCheckpointSave(dataloader)`, left commented out as "TODO: Fix
checkpointing") fails on both libraries with the same errors, and the same
code given the loader's iterator resumes.

aurelio-amerio/GenSBI-examples's src/gensbi_examples/tasks.py and
examples/sbi-benchmarks/gravitational_waves/train-gw.py, with GenSBI's tests
(tests/recipes/test_id_strategies.py, tests/models/tarflow/
test_structured_boundary.py): a 2-D numpy array as a `MapDataset` source,
`shuffle(42)` with a positional seed, `repeat()`, `to_iter_dataset(
grain.ReadOptions(num_threads=16, prefetch_buffer_size=batch_size * 5))`,
`batch(batch_size=...)`, a `map` splitting each batch into an (obs, cond)
tuple of bfloat16 JAX arrays, batches of record indices gathered by fancy
indexing in a map, and `grain.experimental.pick_performance_config(ds=...,
ram_budget_mb=..., max_workers=None, max_buffer_size=None)`.

A Self-Flow DiT training script (`get_arrayrecord_dataloader`; the index names
no repository for it): an `ArrayRecordDataSource` of pickled latents opened by
a glob pattern inside `try:`, a `MapTransform` defined in the function
returning (patches, label) tuples, `ShardByJaxProcess(drop_remainder=True)`,
`worker_count=8` and `ReadOptions(prefetch_buffer_size=1024)`. Grain 0.2.18
cannot open a glob (the client then falls back to mock batches); loader
expands it (README: "without ranges, paths may be directories/globs"), so
loader's run over the pattern is compared with Grain's over the sorted files.

A surrogate-model data module (`InMemoryHDF5Source`, `ToyDataSource`,
`build_dataset`; the index names no repository for it): an HDF5 matrix read
whole with h5py and filtered by variable bounds, a JAX-generated source,
(dict, array) tuples, `MapDataset.batch(batch_size=..., drop_remainder=...)`
before `to_iter_dataset(grain.ReadOptions(num_threads=0,
prefetch_buffer_size=0))`, the iterator returned, its state saved and
restored.

A JAX trainer's dataset recipes "vendored from torchtitan
components/data/dataset.py" (`SingleDataset`, `DatasetMix`, `DatasetConcat`,
`build_dataset`; the index names no repository for it): `MapDataset.filter`
before and after `random_map(processor_object, seed=...)` (a callable
`SampleProcessor` taking (sample, rng)), `shuffle` after filtering, contiguous
per-rank slices, `repeat()`, `MapDataset.mix` of filtered children with
weights, `IterDataset.mix` when a child streams (`WindowShuffleIterDataset`,
`filter` and `random_map` on the stream), `MapDataset.concatenate`, and the
recipes' own errors.

Each snippet is the client's code, trimmed to its Grain parts, with small
generated data in place of TFDS, token manifests, MNIST, SBI benchmark files,
ImageNet latents, HDF5 simulations and text corpora. Where README documents a difference
(worker-count-invariant batching, globs, loader's extra state keys) the test
compares with the documented behaviour.
"""

from __future__ import annotations

import glob
import pickle
import json
import os

import numpy as np
import pytest

from tests import porting


# nanodo/data.py, trimmed to its Grain parts: TFDS's data source and
# SentencePiece / tf_text tokenizers are stand-ins over local strings (one id
# per character), the rest is the client's code.
NANODO = """
import dataclasses
import enum
import functools
import itertools
import json
from typing import Iterator

import grain.python as grain
import numpy as np

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2

WORDS = ["alpha", "be", "gamma delta", "e", "zeta eta theta", "iota", "kappa lambda mu", "nu",
         "xi omicron", "pi rho", "sigma", "tau upsilon phi"]


class tfds:  # The client's `tfds.data_source(name, split=...)`, over local records.
  @staticmethod
  def data_source(name, split):
    del name
    rows = [{"text": w} for w in WORDS]
    return rows if split == "train" else rows[::-1][:7]


class _ByteSentencePiece:
  def EncodeAsIds(self, text):
    return [3 + (ord(c) % 20) for c in text]


class _TfTextTokenizer:
  def tokenize(self, text):
    return np.array([BOS_ID] + [3 + (ord(c) % 20) for c in text] + [EOS_ID], dtype=np.int32)


class Preprocess(enum.Enum):
  NOAM_PACKED = 1
  PADDED = 2


def py_batched_tfds(
    *,
    tfds_name: str,
    split: str,
    context_size: int,
    worker_count: int,
    vocab_path: str,
    batch_size: int,
    seed: int | None = 1234,
    num_epochs: int | None = None,
    num_records: int | None = None,
    preprocessing: Preprocess = Preprocess.NOAM_PACKED,
    worker_buffer_size: int = 2,
) -> Iterator[grain.Record]:
  datasource = tfds.data_source(tfds_name, split=split)
  index_sampler = grain.IndexSampler(
      num_records=num_records if num_records is not None else len(datasource),
      num_epochs=num_epochs,
      shard_options=grain.NoSharding(),
      shuffle=True,
      seed=seed,
  )
  spt = _SPTokenizer(vocab_path)

  pad_len = None if preprocessing == Preprocess.NOAM_PACKED else context_size
  pygrain_ops = [
      grain.MapOperation(
          map_function=functools.partial(
              _py_tokenize, spt=spt, pad_id=PAD_ID, pad_len=pad_len
          )
      )
  ]
  if preprocessing == Preprocess.NOAM_PACKED:
    pygrain_ops.append(_NoamPack(context_size=context_size))
  elif preprocessing == Preprocess.PADDED:
    pygrain_ops.append(grain.MapOperation(map_function=np.array))
  else:
    raise ValueError(f'Unknown preprocessing: {preprocessing}')
  pygrain_ops.append(grain.Batch(batch_size=batch_size, drop_remainder=True))
  batched_dataloader = grain.DataLoader(
      data_source=datasource,
      operations=pygrain_ops,
      sampler=index_sampler,
      worker_count=worker_count,
      worker_buffer_size=worker_buffer_size,
  )
  return iter(batched_dataloader)


def py_batched_tfds_for_eval(*, tfds_name, split, tokenizer, batch_size, context_length, data_source=None):
  data_source = data_source if data_source is not None else tfds.data_source(tfds_name, split=split)
  sampler = grain.IndexSampler(
      num_records=len(data_source),
      shard_options=grain.NoSharding(),
      shuffle=False,
  )
  operations = text_preprocess_batched_operations(
      tokenizer=tokenizer,
      context_length=context_length,
      batch_size=batch_size,
  )
  batched_dataloader = grain.DataLoader(
      data_source=data_source,
      operations=operations,
      sampler=sampler,
      worker_count=0,
  )
  return iter(batched_dataloader)


def _pad_or_crop(x: np.ndarray, *, context_length: int) -> np.ndarray:
  if len(x.shape) != 1:
    raise ValueError(f'Expected 1D array of tokenized text, got {x.shape}')
  if len(x) < context_length:
    pad_width = [(0, context_length - len(x))]
    return np.pad(x, pad_width, mode='constant', constant_values=PAD_ID)
  else:
    return x[:context_length]


def text_preprocess_batched_operations(tokenizer, context_length, batch_size):
  operations = []
  operations.append(
      grain.MapOperation(map_function=lambda x: tokenizer.tokenize(x['text']))
  )
  pad_or_crop = functools.partial(_pad_or_crop, context_length=context_length)
  operations.append(grain.MapOperation(map_function=pad_or_crop))
  operations.append(grain.Batch(batch_size=batch_size, drop_remainder=False))
  return operations


class _SPTokenizer:
  def __init__(self, vocab_path):
    self._tokenizer = None
    self._vocab_path = vocab_path

  def get_tokenizer(self):
    if not self._tokenizer:
      self._tokenizer = _ByteSentencePiece()
    return self._tokenizer


def _py_tokenize(features, spt, pad_len=None, pad_id=PAD_ID):
  text = features['text']
  ids = spt.get_tokenizer().EncodeAsIds(text)
  ids.insert(0, BOS_ID)
  ids.append(EOS_ID)
  if pad_len is not None:
    if len(ids) < pad_len:
      ids.extend([pad_id] * (pad_len - len(ids)))
    elif len(ids) > pad_len:
      ids = ids[:pad_len]
  return ids


@dataclasses.dataclass
class _NoamPack:
  context_size: int

  def __call__(self, idseq_iterator: Iterator[grain.Record]) -> Iterator[grain.Record]:
    packed_ids = []
    for input_record in idseq_iterator:
      start = 0
      while start < len(input_record.data):
        rem_data = input_record.data[start:]
        if len(packed_ids) + len(rem_data) < self.context_size:
          packed_ids.extend(rem_data)  # use rest of example, move-on
          break
        else:
          take = self.context_size - len(packed_ids)
          packed_ids.extend(rem_data[:take])
          last_record_key = input_record.metadata.remove_record_key()
          yield grain.Record(
              last_record_key, np.array(packed_ids, dtype=np.int32)
          )
          start += take
          packed_ids = []
          # Drop remainder for simplicity.
          # We lose the rest of the example on restore.


def error_of(fn):
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    return [type(e).__name__, str(e), type(e.__cause__).__name__]
  return None


def main():
  kw = dict(tfds_name="lm1b", split="train", context_size=8, worker_count=0, vocab_path="spm.model", batch_size=3)
  train = py_batched_tfds(**kw, num_epochs=2)
  first = [next(train) for _ in range(4)]
  state = train.get_state()
  continued = list(train)
  resumed = py_batched_tfds(**kw, num_epochs=2)
  resumed.set_state(state)
  padded = py_batched_tfds(**kw, num_epochs=1, preprocessing=Preprocess.PADDED)
  fewer = py_batched_tfds(**kw, num_epochs=1, num_records=7, seed=7)
  ev = py_batched_tfds_for_eval(tfds_name="lm1b", split="test", tokenizer=_TfTextTokenizer(), batch_size=3,
                                context_length=6)
  broken = py_batched_tfds_for_eval(tfds_name="lm1b", split="test", tokenizer=_TfTextTokenizer(), batch_size=2,
                                    context_length=6,
                                    data_source=[{"text": "ab"}, {"text": "cd"}, {"txt": "ef"}, {"text": "gh"}])
  return {
      "first": first, "state": json.loads(state), "continued": continued, "resumed": list(resumed),
      "padded": list(padded), "fewer": list(fewer), "eval": list(itertools.islice(ev, 5)),
      "broken": [next(broken), error_of(lambda: next(broken)), error_of(lambda: next(broken))],
      "unknown": error_of(lambda: py_batched_tfds(**kw, preprocessing="packed")),
  }
"""


def test_nanodo_legacy_operations_noam_packing_and_endless_eval_as_on_grain():
  g, l = porting.run_both(NANODO)
  g_out, l_out = g.main(), l.main()
  g_error, l_error = g_out["broken"].pop(1), l_out["broken"].pop(1)
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  g_plain = porting.plain(g_out)
  # The legacy operation's error: Grain's ValueError and message, caused by
  # the map's KeyError; loader's message then names the function and the
  # cause (README: "Grain's message ..., then the cause").
  assert g_error == ["ValueError", "PyGrain encountered an error when calling map function.", "KeyError"]
  assert [l_error[0], l_error[2]] == [g_error[0], g_error[2]] and l_error[1].startswith(g_error[1] + " (")
  # The packer yields context-size rows across records; the restored stream
  # starts a new row at the next record (the client's comment: "We lose the
  # rest of the example on restore"), on both libraries.
  assert {len(row) for batch in g_plain["first"] + g_plain["continued"] for row in batch} == {8}
  assert g_plain["state"]["last_seen_indices"] == {"0": 9}
  assert g_plain["resumed"] != g_plain["continued"] and len(g_plain["resumed"]) >= 4
  assert len(g_plain["fewer"]) == 2 and len(g_plain["padded"]) == 4
  # The endless eval sampler starts its second pass after 7 records, in its
  # last batch of 3 of the first pass (no batch is dropped or cut).
  assert [len(b) for b in g_plain["eval"]] == [3] * 5
  assert g_plain["eval"][2][1] == g_plain["eval"][0][0]
  # The legacy operation's error ends the stream.
  assert g_plain["broken"][1] == ["StopIteration", "", "NoneType"]
  assert g_plain["unknown"] == ["ValueError", "Unknown preprocessing: packed", "NoneType"]


# src/jaxtitan/data/pipeline.py, trimmed: the manifest (a validated JSON file
# with token splits) and `read_token_range` are stand-ins over a local .npy
# token file; `Batch`, `DataPipelineState` and `ContractError` are the
# client's types, written out; the source, the pipeline and the state codecs
# are the client's code.
JAXTITAN = """
from collections.abc import Mapping
from dataclasses import asdict, dataclass, is_dataclass
import json
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Literal

import grain.python as grain
import numpy as np

SplitName = Literal["train", "val"]

DATA_PIPELINE_STATE_SCHEMA_VERSION = 1
DATA_PIPELINE_BACKEND = "grain"
DATA_PIPELINE_ORDER = "sequential"
DATA_PIPELINE_WORKER_COUNT = 0
DATA_PIPELINE_PREFETCH = False
DATA_PIPELINE_NUM_EPOCHS = 1
DATA_PIPELINE_DROP_REMAINDER = True
PREPARED_TOKEN_SOURCE_SCHEMA_VERSION = 1


class ContractError(ValueError):
    pass


@dataclass(frozen=True)
class TokenSplit:
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PreparedDatasetManifest:
    manifest_path: Path
    manifest_sha256: str
    tokenizer_id: str
    token_file: str
    train: TokenSplit
    val: TokenSplit


def validate_dataset_manifest(path, *, tokenizer_id):
    raw = json.loads(Path(path).read_text())
    if tokenizer_id is not None and raw["tokenizer_id"] != tokenizer_id:
        raise ContractError("tokenizer mismatch")
    return PreparedDatasetManifest(Path(path), raw["sha256"], raw["tokenizer_id"], raw["token_file"],
                                   TokenSplit(*raw["train"]), TokenSplit(*raw["val"]))


def read_token_range(manifest, start, end):
    return np.load(manifest.token_file, mmap_mode="r")[start:end]


@dataclass(frozen=True)
class Batch:
    input_ids: Any
    target_ids: Any
    loss_mask: Any


@dataclass(frozen=True)
class DataPipelineState:
    schema_version: int
    backend: str
    backend_version: str | None
    split: str
    order: str
    worker_count: int
    prefetch: bool
    manifest_path: Path
    manifest_sha256: str
    tokenizer_id: str
    seq_len: int
    batch_size: int
    num_records: int
    next_record_index: int
    token_offset: int
    epoch: int
    sampler_summary: str
    source_summary: str
    grain_state: dict


@dataclass(frozen=True, slots=True)
class BatchProvenance:
    split: str
    epoch: int
    token_start: int
    token_end: int
    examples: int
    target_tokens: int
    row_start_offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PipelineBatch:
    batch: Batch
    state: DataPipelineState
    provenance: BatchProvenance


class PreparedTokenDataSource(grain.RandomAccessDataSource):
    def __init__(self, *, manifest: PreparedDatasetManifest, split: SplitName, seq_len: int) -> None:
        if seq_len <= 0:
            raise ContractError(f"seq_len must be positive, got {seq_len}")
        if split not in {"train", "val"}:
            raise ContractError(f"split must be 'train' or 'val', got {split!r}")
        token_split = manifest.train if split == "train" else manifest.val
        self.manifest = manifest
        self.split = split
        self.seq_len = int(seq_len)
        self.split_start = int(token_split.start)
        self.split_end = int(token_split.end)
        self.split_tokens = int(token_split.tokens)
        self.num_records = max(0, (self.split_tokens - 1) // self.seq_len)
        self.manifest_sha256 = manifest.manifest_sha256
        self.tokenizer_id = manifest.tokenizer_id
        self.source_summary = _source_summary(self)

    @classmethod
    def from_manifest(cls, path, *, tokenizer_id, split, seq_len):
        manifest = validate_dataset_manifest(path, tokenizer_id=tokenizer_id)
        return cls(manifest=manifest, split=split, seq_len=seq_len)

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, record_key: int) -> dict[str, Any]:
        if isinstance(record_key, np.integer):
            record_key = int(record_key)
        if not isinstance(record_key, int):
            raise TypeError(f"record_key must be an integer, got {type(record_key).__name__}")
        if record_key < 0 or record_key >= self.num_records:
            raise IndexError(f"record_key {record_key} is outside {self.split} records [0, {self.num_records})")
        token_start = self.split_start + record_key * self.seq_len
        tokens = read_token_range(self.manifest, token_start, token_start + self.seq_len + 1)
        input_ids = np.asarray(tokens[:-1], dtype=np.int32)
        target_ids = np.asarray(tokens[1:], dtype=np.int32)
        return {
            "input_ids": input_ids,
            "target_ids": target_ids,
            "loss_mask": np.ones((self.seq_len,), dtype=np.bool_),
            "token_start": np.asarray(token_start, dtype=np.int64),
            "token_end": np.asarray(token_start + self.seq_len, dtype=np.int64),
            "record_key": np.asarray(record_key, dtype=np.int64),
        }

    def __repr__(self) -> str:
        return (
            "PreparedTokenDataSource("
            f"schema_version={PREPARED_TOKEN_SOURCE_SCHEMA_VERSION}, "
            f"manifest_sha256='{self.manifest_sha256}', "
            f"split='{self.split}', "
            f"seq_len={self.seq_len}, "
            f"tokenizer_id='{self.tokenizer_id}', "
            f"records={self.num_records}"
            ")"
        )


class PreparedTokenGrainPipeline:
    def __init__(self, *, source: PreparedTokenDataSource, batch_size: int) -> None:
        if batch_size <= 0:
            raise ContractError(f"batch_size must be positive, got {batch_size}")
        if len(source) < batch_size:
            required = batch_size * source.seq_len + 1
            raise ContractError(
                f"{source.split} split has {source.split_tokens} tokens, but one batch requires at least {required}"
            )
        self.source = source
        self.batch_size = int(batch_size)
        self.split = source.split
        self.seq_len = source.seq_len
        self.split_start = source.split_start
        self.split_end = source.split_end
        self.split_tokens = source.split_tokens
        self.manifest = source.manifest
        self.manifest_path = source.manifest.manifest_path
        self.manifest_sha256 = source.manifest_sha256
        self.tokenizer_id = source.tokenizer_id
        self.backend_version = grain_version()
        self.sampler = grain.IndexSampler(
            num_records=len(source),
            shard_options=grain.NoSharding(),
            shuffle=False,
            num_epochs=DATA_PIPELINE_NUM_EPOCHS,
            seed=None,
        )
        self.sampler_summary = repr(self.sampler)
        self.source_summary = repr(source)
        self.loader = grain.DataLoader(
            data_source=source,
            sampler=self.sampler,
            operations=[grain.Batch(batch_size=self.batch_size, drop_remainder=DATA_PIPELINE_DROP_REMAINDER)],
            worker_count=DATA_PIPELINE_WORKER_COUNT,
            worker_buffer_size=1,
            shard_options=grain.NoSharding(),
        )
        self._iterator: Any | None = None
        self._current_state: DataPipelineState | None = None

    @classmethod
    def from_manifest(cls, path, *, tokenizer_id, split, seq_len, batch_size):
        source = PreparedTokenDataSource.from_manifest(path, tokenizer_id=tokenizer_id, split=split, seq_len=seq_len)
        return cls(source=source, batch_size=batch_size)

    def initial_state(self) -> DataPipelineState:
        self._iterator = iter(self.loader)
        grain_state = _decode_grain_state(self._iterator.get_state())
        state = self._state_from_components(
            grain_state=grain_state,
            next_record_index=0,
            token_offset=self.split_start,
            epoch=0,
        )
        self._current_state = state
        return state

    def next_batch(self, state: DataPipelineState) -> PipelineBatch:
        self._validate_state(state)
        iterator = self._iterator_for_state(state)
        try:
            raw = next(iterator)
        except StopIteration as exc:
            raise StopIteration(f"not enough records left in {self.split} split for one full batch") from exc
        batch, provenance = self._batch_from_raw(raw, epoch=state.epoch)
        next_record_index = state.next_record_index + provenance.examples
        next_state = self._state_from_components(
            grain_state=_decode_grain_state(iterator.get_state()),
            next_record_index=next_record_index,
            token_offset=self.split_start + next_record_index * self.seq_len,
            epoch=state.epoch,
        )
        self._current_state = next_state
        return PipelineBatch(batch=batch, state=next_state, provenance=provenance)

    def state_to_json(self, state: DataPipelineState) -> dict[str, Any]:
        self._validate_state(state)
        return data_pipeline_state_to_dict(state)

    def state_from_json(self, raw: Mapping[str, Any]) -> DataPipelineState:
        state = data_pipeline_state_from_mapping(raw)
        self._validate_state(state)
        return state

    def describe(self) -> dict[str, Any]:
        return _normalize(
            {
                "schema_version": 1,
                "backend": DATA_PIPELINE_BACKEND,
                "backend_version": self.backend_version,
                "state_schema_version": DATA_PIPELINE_STATE_SCHEMA_VERSION,
                "split": self.split,
                "order": DATA_PIPELINE_ORDER,
                "shuffle": False,
                "num_epochs": DATA_PIPELINE_NUM_EPOCHS,
                "worker_count": DATA_PIPELINE_WORKER_COUNT,
                "prefetch": DATA_PIPELINE_PREFETCH,
                "drop_remainder": DATA_PIPELINE_DROP_REMAINDER,
                "batch_size": self.batch_size,
                "seq_len": self.seq_len,
                "num_records": len(self.source),
                "manifest_path": self.manifest_path,
                "manifest_sha256": self.manifest_sha256,
                "tokenizer_id": self.tokenizer_id,
                "split_start": self.split_start,
                "split_end": self.split_end,
                "split_tokens": self.split_tokens,
                "source_summary": self.source_summary,
                "sampler_summary": self.sampler_summary,
            }
        )

    def close(self) -> None:
        if self._iterator is not None and hasattr(self._iterator, "close"):
            self._iterator.close()

    def _iterator_for_state(self, state: DataPipelineState) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.loader)
            self._iterator.set_state(_encode_grain_state(state.grain_state))
        elif self._current_state != state:
            self._iterator.set_state(_encode_grain_state(state.grain_state))
        self._current_state = state
        return self._iterator

    def _batch_from_raw(self, raw, *, epoch):
        if not isinstance(raw, Mapping):
            raise ContractError("Grain batch must be a mapping")
        input_ids = np.asarray(raw.get("input_ids"), dtype=np.int32)
        target_ids = np.asarray(raw.get("target_ids"), dtype=np.int32)
        loss_mask = np.asarray(raw.get("loss_mask"), dtype=np.bool_)
        row_starts = tuple(int(value) for value in np.asarray(raw.get("token_start")).tolist())
        row_ends = tuple(int(value) for value in np.asarray(raw.get("token_end")).tolist())
        expected_shape = (self.batch_size, self.seq_len)
        if input_ids.shape != expected_shape or target_ids.shape != expected_shape or loss_mask.shape != expected_shape:
            raise ContractError(
                "Grain batch has unexpected shape: "
                f"input={input_ids.shape} target={target_ids.shape} mask={loss_mask.shape} expected={expected_shape}"
            )
        if len(row_starts) != self.batch_size or len(row_ends) != self.batch_size:
            raise ContractError("Grain batch provenance does not match batch size")
        return (
            Batch(input_ids=input_ids, target_ids=target_ids, loss_mask=loss_mask),
            BatchProvenance(
                split=self.split,
                epoch=epoch,
                token_start=row_starts[0],
                token_end=row_ends[-1],
                examples=self.batch_size,
                target_tokens=self.batch_size * self.seq_len,
                row_start_offsets=row_starts,
            ),
        )

    def _state_from_components(self, *, grain_state, next_record_index, token_offset, epoch):
        return DataPipelineState(
            schema_version=DATA_PIPELINE_STATE_SCHEMA_VERSION,
            backend=DATA_PIPELINE_BACKEND,
            backend_version=self.backend_version,
            split=self.split,
            order=DATA_PIPELINE_ORDER,
            worker_count=DATA_PIPELINE_WORKER_COUNT,
            prefetch=DATA_PIPELINE_PREFETCH,
            manifest_path=self.manifest_path,
            manifest_sha256=self.manifest_sha256,
            tokenizer_id=self.tokenizer_id,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            num_records=len(self.source),
            next_record_index=next_record_index,
            token_offset=token_offset,
            epoch=epoch,
            sampler_summary=self.sampler_summary,
            source_summary=self.source_summary,
            grain_state=dict(grain_state),
        )

    def _validate_state(self, state: DataPipelineState) -> None:
        expected = self._state_from_components(
            grain_state=state.grain_state,
            next_record_index=state.next_record_index,
            token_offset=state.token_offset,
            epoch=state.epoch,
        )
        checks = (
            ("schema_version", state.schema_version, expected.schema_version),
            ("backend", state.backend, expected.backend),
            ("backend_version", state.backend_version, expected.backend_version),
            ("split", state.split, expected.split),
            ("num_records", state.num_records, expected.num_records),
            ("sampler_summary", state.sampler_summary, expected.sampler_summary),
            ("source_summary", state.source_summary, expected.source_summary),
        )
        for name, actual, wanted in checks:
            if actual != wanted:
                raise ContractError(f"data pipeline state {name} mismatch: state={actual!r} pipeline={wanted!r}")
        if state.next_record_index < 0 or state.next_record_index > len(self.source):
            raise ContractError(
                f"data pipeline next_record_index={state.next_record_index} is outside [0, {len(self.source)}]"
            )


def grain_version() -> str | None:
    try:
        return importlib_metadata.version("grain")
    except importlib_metadata.PackageNotFoundError:
        return None


def data_pipeline_state_to_dict(state: DataPipelineState) -> dict[str, Any]:
    return _normalize(asdict(state))


def data_pipeline_state_from_mapping(raw: Mapping[str, Any]) -> DataPipelineState:
    fields = dict(raw)
    fields["manifest_path"] = Path(fields["manifest_path"])
    fields["grain_state"] = dict(_require_mapping(raw.get("grain_state"), "data pipeline state.grain_state"))
    return DataPipelineState(**fields)


def _source_summary(source) -> dict[str, Any]:
    return _normalize(
        {
            "schema_version": PREPARED_TOKEN_SOURCE_SCHEMA_VERSION,
            "manifest_path": source.manifest.manifest_path,
            "manifest_sha256": source.manifest_sha256,
            "tokenizer_id": source.tokenizer_id,
            "split": source.split,
            "seq_len": source.seq_len,
            "num_records": source.num_records,
        }
    )


def _decode_grain_state(state: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(state.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ContractError(f"failed to decode Grain iterator state: {exc}") from exc
    if not isinstance(raw, dict):
        raise ContractError("Grain iterator state must decode to a JSON object")
    return raw


def _encode_grain_state(state: Mapping[str, Any]) -> bytes:
    return json.dumps(state, indent=4, sort_keys=True).encode("utf-8")


def _require_mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ContractError(f"{name} must be a JSON object")
    return value


def _normalize(value: Any) -> Any:
    if isinstance(value, Path):
        return value.as_posix()
    if is_dataclass(value):
        return _normalize(asdict(value))
    if isinstance(value, Mapping):
        return {str(key): _normalize(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_normalize(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def error_of(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        return [type(e).__name__, str(e)]
    return None


def main(manifest_path):
    kw = dict(tokenizer_id="bytes", split="train", seq_len=4, batch_size=3)
    pipe = PreparedTokenGrainPipeline.from_manifest(manifest_path, **kw)
    s0 = pipe.initial_state()
    b1 = pipe.next_batch(s0)
    b2 = pipe.next_batch(b1.state)
    again = pipe.next_batch(b1.state)  # An older state: the iterator is set back.
    saved = json.dumps(pipe.state_to_json(b2.state))
    pipe.close()
    resumed = PreparedTokenGrainPipeline.from_manifest(manifest_path, **kw)
    state = resumed.state_from_json(json.loads(saved))
    rest = []
    try:
        while True:
            pb = resumed.next_batch(state)
            rest.append(pb)
            state = pb.state
    except StopIteration as e:
        end = [str(e), type(e.__cause__).__name__]
    resumed.close()
    val = PreparedTokenGrainPipeline.from_manifest(manifest_path, **{**kw, "split": "val"})
    return {
        "batches": [_normalize(pb) for pb in (b1, b2, again)],
        "initial": _normalize(s0), "rest": [_normalize(pb) for pb in rest], "end": end,
        "describe": pipe.describe(), "val": _normalize(val.next_batch(val.initial_state())),
        "foreign": error_of(lambda: resumed.state_from_json({**json.loads(saved), "sampler_summary": "x"})),
        "too_big": error_of(lambda: PreparedTokenGrainPipeline.from_manifest(manifest_path, **{**kw, "batch_size": 50})),
    }
"""


def test_jaxtitan_prepared_token_pipeline_state_round_trips_as_on_grain(tmp_path):
  tokens = np.arange(1000, 1000 + 80, dtype=np.uint32)
  np.save(tmp_path / "tokens.npy", tokens)
  manifest = tmp_path / "manifest.json"
  manifest.write_text(json.dumps({"sha256": "ab" * 8, "tokenizer_id": "bytes", "token_file": str(tmp_path / "tokens.npy"),
                                  "train": [0, 61], "val": [61, 80]}))
  g, l = porting.run_both(JAXTITAN)
  g_out, l_out = g.main(str(manifest)), l.main(str(manifest))
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  # 15 records of 4 tokens, batches of 3: 5 batches, the 5th after restoring.
  assert [b["provenance"]["row_start_offsets"] for b in g_out["batches"]] == [[0, 4, 8], [12, 16, 20], [12, 16, 20]]
  assert [b["provenance"]["token_start"] for b in g_out["rest"]] == [24, 36, 48]
  assert g_out["end"] == ["not enough records left in train split for one full batch", "StopIteration"]
  assert g_out["describe"]["sampler_summary"] == (
      "IndexSampler(num_records=15, shard_options=NoSharding(shard_index=0, shard_count=1, drop_remainder=False), "
      "shuffle=False, num_epochs=1, seed=None)")
  assert g_out["batches"][1]["state"]["grain_state"]["last_seen_indices"] == {"0": 5}
  assert g_out["foreign"][0] == "ContractError" and g_out["too_big"][0] == "ContractError"
  # loader's state carries its own keys beside Grain's (README, "Checkpoint
  # states"); they survive the client's decode / sort_keys re-encode. (The
  # client's `close()` runs only on loader, whose DataLoader iterators have
  # one to stop worker processes; Grain 0.2.18's have none. Nothing is read
  # after it.)
  assert set(l_out["rest"][-1]["state"]["grain_state"]) > set(g_out["rest"][-1]["state"]["grain_state"])


# continual_learning_2/data/base.py (SplitDataset, PermuteInputs,
# PermutedDataset) with the MNIST classes of continual_learning/data/mnist.py
# as class-level OPERATIONS, and the checkpointing of continual_learning/
# trainers/continual_supervised_learning.py. `datasets.load_dataset` is a
# stand-in over generated 4x4 "digits" of 6 classes with Hugging Face's
# `filter` / `with_format`; model evaluation is left out.
CONTINUAL = """
import abc
import dataclasses
import sys
import tempfile
from typing import Generator

import grain.python as grain
import numpy as np
import orbax.checkpoint as ocp


class datasets:  # Hugging Face `datasets`, as far as the client uses it.
  class Dataset:
    def __init__(self, rows):
      self._rows = rows

    def __len__(self):
      return len(self._rows)

    def __getitem__(self, i):
      return self._rows[i]

    def filter(self, fn):
      return datasets.Dataset([r for r in self._rows if fn(r)])

  class DatasetDict(dict):
    def with_format(self, kind):
      assert kind == "numpy"
      return self

  @staticmethod
  def load_dataset(path, keep_in_memory=None):
    del keep_in_memory
    rng = np.random.default_rng(len(path))
    def rows(n):
      return [{"image": rng.integers(0, 255, (4, 4), dtype=np.uint8), "label": np.int64(i % 6)} for i in range(n)]
    return datasets.DatasetDict(train=datasets.Dataset(rows(30)), test=datasets.Dataset(rows(14)))


@dataclasses.dataclass
class DatasetConfig:
  num_tasks: int
  num_epochs_per_task: int
  batch_size: int
  seed: int
  num_workers: int = 0


class ContinualLearningDataset(abc.ABC):
    NUM_CLASSES: int

    @abc.abstractmethod
    def __init__(self, config: DatasetConfig): ...

    @property
    @abc.abstractmethod
    def tasks(self) -> Generator[grain.DataLoader, None, None]: ...


class SplitDataset(ContinualLearningDataset):
    CURRENT_TASK: int
    NUM_CLASSES: int
    KEEP_IN_MEMORY: bool | None = None

    DATASET_PATH: str
    OPERATIONS: list[grain.Transformation] = []

    def __init__(self, config: DatasetConfig):
        if not self.NUM_CLASSES % config.num_tasks == 0:
            raise ValueError(
                f"Number of classes ({self.NUM_CLASSES}) must be divisible by number of tasks ({config.num_tasks})."
            )
        self.num_tasks = config.num_tasks
        self.num_epochs = config.num_epochs_per_task
        self.batch_size = config.batch_size
        self.seed = config.seed
        self.num_workers = config.num_workers
        self.dataset = datasets.load_dataset(
            self.DATASET_PATH, keep_in_memory=self.KEEP_IN_MEMORY
        ).with_format("numpy")
        assert isinstance(self.dataset, datasets.DatasetDict)

        self._dataset_train, self._dataset_test = self.dataset["train"], self.dataset["test"]

    @property
    def tasks(self) -> Generator[grain.DataLoader, None, None]:
        for task_id in range(self.num_tasks):
            self.CURRENT_TASK = task_id
            yield self._get_task(task_id)

    def _get_task(self, task_id: int) -> grain.DataLoader:
        if task_id < 0 or task_id >= self.num_tasks:
            raise ValueError(f"Invalid task id: {task_id}")

        num_classes_in_task = self.NUM_CLASSES // self.num_tasks
        classes_in_task = list(
            range(num_classes_in_task * task_id, num_classes_in_task * (task_id + 1))
        )

        ds = self._dataset_train.filter(lambda x: x["label"] in classes_in_task)

        return grain.DataLoader(
            data_source=ds,
            sampler=grain.IndexSampler(
                num_records=len(ds),
                shuffle=True,
                num_epochs=self.num_epochs,
                seed=self.seed,
            ),
            operations=[
                *self.OPERATIONS,
                grain.Batch(batch_size=self.batch_size, drop_remainder=True),
            ],
            worker_count=self.num_workers,
        )

    def _get_task_test(self, task_id: int) -> grain.DataLoader:
        if task_id < 0 or task_id >= self.num_tasks:
            raise ValueError(f"Invalid task id: {task_id}")

        num_classes_in_task = self.NUM_CLASSES // self.num_tasks
        classes_in_task = list(
            range(num_classes_in_task * task_id, num_classes_in_task * (task_id + 1))
        )

        ds = self._dataset_test.filter(lambda x: x["label"] in classes_in_task)

        return grain.DataLoader(
            data_source=ds,
            sampler=grain.IndexSampler(
                num_records=len(ds),
                shuffle=False,
                num_epochs=1,
            ),
            operations=[
                *self.OPERATIONS,
                grain.Batch(batch_size=self.batch_size, drop_remainder=False),
            ],
            worker_count=self.num_workers,
        )


class PermuteInputs(grain.MapTransform):
    def __init__(self, permutation):
        self.permutation = permutation

    def map(self, element):
        x, y = element
        x = x.reshape(-1)[self.permutation].reshape(x.shape)
        return x, y


class PermutedDataset(ContinualLearningDataset):
    CURRENT_TASK: int
    NUM_CLASSES: int

    DATA_DIM: int

    DATASET_PATH: str
    OPERATIONS: list[grain.Transformation] = []

    def __init__(self, config: DatasetConfig):
        self.num_tasks = config.num_tasks
        self.num_epochs = config.num_epochs_per_task
        self.batch_size = config.batch_size
        self.seed = config.seed
        self.num_workers = config.num_workers
        self.dataset = datasets.load_dataset(self.DATASET_PATH).with_format("numpy")
        assert isinstance(self.dataset, datasets.DatasetDict)

        self.rng = np.random.default_rng(self.seed)
        self.permutations = [
            self.rng.permutation(self.DATA_DIM) for _ in range(self.num_tasks)
        ]
        self.seeds = [self.rng.integers(0, sys.maxsize) for _ in range(self.num_tasks)]

        self._dataset_train, self._dataset_test = self.dataset["train"], self.dataset["test"]

    @property
    def tasks(self) -> Generator[grain.DataLoader, None, None]:
        for task_id in range(self.num_tasks):
            self.CURRENT_TASK = task_id
            yield self._get_task(task_id)

    def _get_task(self, task_id: int) -> grain.DataLoader:
        if task_id < 0 or task_id >= self.num_tasks:
            raise ValueError(f"Invalid task id: {task_id}")

        permutation = self.permutations[task_id]
        seed = self.seeds[task_id]

        ds = self._dataset_train

        return grain.DataLoader(
            data_source=ds,
            sampler=grain.IndexSampler(
                num_records=len(ds),
                shuffle=True,
                num_epochs=self.num_epochs,
                seed=seed,
            ),
            operations=[
                *self.OPERATIONS,
                PermuteInputs(permutation),
                grain.Batch(batch_size=self.batch_size, drop_remainder=True),
            ],
            worker_count=self.num_workers,
        )

    def _get_task_test(self, task_id: int) -> grain.DataLoader:
        if task_id < 0 or task_id >= self.num_tasks:
            raise ValueError(f"Invalid task id: {task_id}")
        permutation = self.permutations[task_id]
        seed = self.seeds[task_id]

        ds = self._dataset_test

        return grain.DataLoader(
            data_source=ds,
            sampler=grain.IndexSampler(
                num_records=len(ds),
                shuffle=True,
                seed=seed,
            ),
            operations=[
                *self.OPERATIONS,
                PermuteInputs(permutation),
                grain.Batch(batch_size=self.batch_size),
            ],
            worker_count=self.num_workers,
        )


class ProcessMNIST(grain.MapTransform):
    flatten: bool

    def __init__(self, flatten: bool):
        self.flatten = flatten

    def map(self, element: dict):
        x, y = element["image"], element["label"]
        x = np.array(x, dtype=np.float32) / 255
        if self.flatten:
            x = x.flatten()
        else:
            x = x[..., None]
        y_one_hot = np.zeros(6, dtype=np.float32)
        y_one_hot[y] = 1.0
        return x, y_one_hot


class SplitMNIST(SplitDataset):
    NUM_CLASSES: int = 6
    DATASET_PATH: str = "mnist"
    KEEP_IN_MEMORY: bool | None = True
    OPERATIONS = [ProcessMNIST(flatten=False)]


class PermutedMNIST(PermutedDataset):
    NUM_CLASSES: int = 6
    DATASET_PATH: str = "mnist"
    DATA_DIM: int = 4 * 4
    OPERATIONS = [ProcessMNIST(flatten=True)]


class LaterPermutedMNIST(PermutedMNIST):
    # continual_learning/data/base.py: seeds from `rng.integers(0, 99999)`, passed as `int(seed)`.
    def __init__(self, config):
        super().__init__(config)
        rng = np.random.default_rng(self.seed)
        self.permutations = [rng.permutation(self.DATA_DIM) for _ in range(self.num_tasks)]
        self.seeds = [int(rng.integers(0, 99999)) for _ in range(self.num_tasks)]


def error_of(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        # What the client could catch: TypeError / AttributeError / ValueError.
        kinds = [k.__name__ for k in (TypeError, AttributeError, ValueError) if isinstance(e, k)]
        return [kinds, str(e)]
    return None


def main():
    config = DatasetConfig(num_tasks=3, num_epochs_per_task=2, batch_size=3, seed=5)
    split = SplitMNIST(config)
    out = {"split": [list(task) for task in split.tasks], "current": split.CURRENT_TASK,
           "split_test": [list(split._get_task_test(t)) for t in range(3)],
           "bad_task": error_of(lambda: split._get_task(3)),
           "uneven": error_of(lambda: SplitMNIST(DatasetConfig(4, 1, 2, 0)))}
    permuted = PermutedMNIST(config)
    out["permuted"] = error_of(lambda: permuted._get_task(0))
    out["permuted_test"] = error_of(lambda: permuted._get_task_test(1))
    later = LaterPermutedMNIST(config)
    out["later"] = [list(later._get_task(t)) for t in range(2)]
    test_iter = iter(later._get_task_test(2))  # No num_epochs: endless.
    out["later_test"] = [next(test_iter) for _ in range(7)]

    # The trainer's Orbax checkpoint: the DataLoader itself, then its iterator.
    task = later._get_task(1)
    manager = ocp.CheckpointManager(tempfile.mkdtemp())
    out["save_loader"] = error_of(lambda: manager.save(0, args=ocp.args.Composite(
        dataloader=grain.PyGrainCheckpointSave(task), dataset=ocp.args.JsonSave({"current_task": 1}))))
    it = iter(task)
    out["before"] = [next(it) for _ in range(3)]
    manager.save(1, args=ocp.args.Composite(dataloader=grain.PyGrainCheckpointSave(it),
                                            dataset=ocp.args.JsonSave({"current_task": 1})))
    manager.wait_until_finished()
    out["after"] = list(it)
    out["restore_loader"] = error_of(lambda: manager.restore(1, args=ocp.args.Composite(
        dataloader=grain.PyGrainCheckpointRestore(later._get_task(1)), dataset=ocp.args.JsonRestore())))
    ckpt = manager.restore(1, args=ocp.args.Composite(
        dataloader=grain.PyGrainCheckpointRestore(iter(later._get_task(1))), dataset=ocp.args.JsonRestore()))
    out["restored"] = [ckpt["dataset"], list(ckpt["dataloader"])]
    manager.close()
    return out
"""


def test_continual_learning_task_loaders_numpy_seeds_and_orbax_as_on_grain():
  g, l = porting.run_both(CONTINUAL)
  g_out, l_out = g.main(), l.main()
  assert porting.plain(l_out) == porting.plain(g_out)
  g_plain = porting.plain(g_out)
  # 10 training images per task, 2 epochs, batches of 3 (remainder dropped);
  # (x, y) tuples from ProcessMNIST batched as tuples.
  assert [len(task) for task in g_plain["split"]] == [6, 6, 6] and g_plain["current"] == 2
  assert {tuple(np.shape(b[0])) for task in g_out["split"] for b in task} == {(3, 4, 4, 1)}
  assert [[len(b[1]) for b in task] for task in g_plain["split_test"]] == [[3, 3], [3, 1], [3, 1]]
  assert g_plain["bad_task"] == [["ValueError"], "Invalid task id: 3"]
  # Seeds drawn with `rng.integers(0, sys.maxsize)` are numpy integers:
  # Grain's IndexSampler refuses them with a TypeError, and so does loader
  # (it took them before, and then refused these ones, past 2**32, with a
  # ValueError).
  for name in ("permuted", "permuted_test"):
    assert "TypeError" in g_plain[name][0], g_plain[name]
    assert g_plain[name][1] == "Expected seed of int type. Got seed with type <class 'numpy.int64'>"
  assert len(g_plain["later_test"]) == 7 and [len(b[1]) for b in g_plain["later_test"]][:2] == [3, 3]
  # Orbax: the DataLoader itself has no state (AttributeError on both), its
  # iterator resumes where it was saved.
  assert g_plain["save_loader"] == [["AttributeError"], "'DataLoader' object has no attribute 'get_state'"]
  assert g_plain["restore_loader"] == [["AttributeError"], "'DataLoader' object has no attribute 'set_state'"]
  assert g_plain["restored"] == [{"current_task": 1}, g_plain["after"]]


# GenSBI-examples src/gensbi_examples/tasks.py (`Task.get_train_dataset` /
# `get_val_dataset`; the benchmark download is generated data),
# examples/sbi-benchmarks/gravitational_waves/train-gw.py (a Hugging Face
# split of {"xs", "thetas"} rows, `pick_performance_config`, `split_data`
# making bfloat16 JAX arrays) and GenSBI's tests (`_tiny_datasets`,
# `_ds_field`). `MP` says whether the gravitational-wave stream goes through
# `mp_prefetch(performance_config.multiprocessing_options)`, as the script
# writes it.
GENSBI = """
import grain
import jax
from jax import numpy as jnp
import numpy as np


class Task:
    def __init__(self, task_name, dtype=jnp.float32):
        self.task_name = task_name
        key = jax.random.PRNGKey(len(task_name))
        self.data = {"xs": jax.random.normal(key, (120, 3)), "thetas": jax.random.uniform(key, (120, 2))}
        self.max_samples = 100

        self.xs = self.data["xs"][: self.max_samples]
        self.xs = self.xs.astype(dtype)
        self.thetas = self.data["thetas"][: self.max_samples]
        self.thetas = self.thetas.astype(dtype)

        self.xs_val = self.data["xs"][self.max_samples :]
        self.xs_val = self.xs_val.astype(dtype)
        self.thetas_val = self.data["thetas"][self.max_samples :]
        self.thetas_val = self.thetas_val.astype(dtype)

    def get_train_dataset(self, batch_size, nsamples=1e5):
        nsamples = min(nsamples, 90)
        assert (
            nsamples < self.max_samples
        ), f"nsamples must be less than {self.max_samples}"
        xs = self.xs[: int(nsamples)]
        thetas = self.thetas[: int(nsamples)]

        train_data = jnp.concatenate((thetas, xs), axis=-1)

        dataset_grain = (
            grain.MapDataset.source(np.array(train_data))
            .shuffle(42)
            .repeat()
            .to_iter_dataset(
                grain.ReadOptions(num_threads=16, prefetch_buffer_size=batch_size * 5)
            )
            .batch(batch_size=batch_size)  # Batches consecutive elements.
        )
        return dataset_grain

    def get_val_dataset(self):
        xs_val = self.xs_val
        thetas_val = self.thetas_val

        val_data = jnp.concatenate((thetas_val, xs_val), axis=-1)

        val_dataset_grain = (
            grain.MapDataset.source(np.array(val_data))
            .shuffle(42)
            .repeat()
            .to_iter_dataset()
            .batch(batch_size=32)
        )
        return val_dataset_grain


def _tiny_datasets(dim_obs, dim_cond, n=24, batch=5):
    key = jax.random.PRNGKey(0)
    theta = jax.random.normal(key, (n, dim_obs, 1))
    x = jax.random.normal(key, (n, dim_cond, 1))

    def make(sl):
        data = np.concatenate([np.asarray(theta[sl]), np.asarray(x[sl])], axis=1)
        return (
            grain.MapDataset.source(data)
            .repeat()
            .to_iter_dataset()
            .batch(batch)
            .map(lambda d: (d[:, :dim_obs], d[:, dim_obs:]))
        )

    return make(slice(0, n // 2)), make(slice(n // 2, n))


H, W, Ch, D, N = 2, 2, 1, 2, 20
_theta = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (N, D)))
_x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (N, H, W, Ch)))


def _ds_field(bs=8):
    x, theta = np.array(_x), np.array(_theta)        # (obs=image, cond=theta)
    idx = grain.MapDataset.source(list(range(N)))
    return (idx.shuffle(0).repeat().to_iter_dataset().batch(bs)
            .map(lambda i: (x[np.array(i)], theta[np.array(i)])))


def gravitational_waves(batch_size=6):
    rng = np.random.default_rng(3)
    df_train = [{"xs": rng.standard_normal((8, 2)).astype(np.float32), "thetas": rng.random(2).astype(np.float32)}
                for _ in range(30)]
    dim_obs, ch_obs = 2, 1
    thetas_mean = jnp.array([[44.8, 45.0]], dtype=jnp.bfloat16)
    thetas_std = jnp.array([[20.1, 20.1]], dtype=jnp.bfloat16)

    def split_data(batch):
        obs = jnp.array(batch["thetas"], dtype=jnp.bfloat16)
        obs = (obs - thetas_mean) / thetas_std
        obs = obs.reshape(obs.shape[0], dim_obs, ch_obs)
        cond = jnp.array(batch["xs"], dtype=jnp.bfloat16)
        return obs, cond

    train_dataset_npe = (
        grain.MapDataset.source(df_train).shuffle(42).repeat().to_iter_dataset()
    )
    performance_config = grain.experimental.pick_performance_config(
        ds=train_dataset_npe,
        ram_budget_mb=1024 * 8,
        max_workers=None,
        max_buffer_size=None,
    )
    train_dataset_npe = train_dataset_npe.batch(batch_size).map(split_data)
    if MP:
        train_dataset_npe = train_dataset_npe.mp_prefetch(performance_config.multiprocessing_options)
    options = performance_config.multiprocessing_options
    return train_dataset_npe, [options.num_workers, options.per_worker_buffer_size, options.enable_profiling,
                               performance_config.read_options.num_threads,
                               performance_config.read_options.prefetch_buffer_size]


def take(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)], it


def main():
    task = Task("two_moons")
    train, train_it = take(task.get_train_dataset(batch_size=16), 8)
    val, _ = take(task.get_val_dataset(), 2)
    tiny_train, tiny_val = _tiny_datasets(3, 4)
    field, field_it = take(_ds_field(), 6)
    gw_ds, perf = gravitational_waves()
    gw, gw_it = take(gw_ds, 7)
    resumed = iter(_ds_field())
    resumed.set_state(field_it.get_state())
    return {
        "train": train, "train_state": train_it.get_state(), "val": val,
        "tiny": [take(tiny_train, 4)[0], take(tiny_val, 3)[0]], "field": field, "field_state": field_it.get_state(),
        "field_resumed": [next(resumed) for _ in range(3)], "field_next": [next(field_it) for _ in range(3)],
        "gw": gw, "perf": perf, "gw_kinds": [type(gw[0]).__name__, str(gw[0][0].dtype), str(gw[0][1].dtype)],
    }
"""


def test_gensbi_numpy_sources_index_batches_and_performance_config_as_on_grain():
  g, l = porting.run(GENSBI, "grain", MP=False), porting.run(GENSBI, "loader", MP=False)
  g_out, l_out = g.main(), l.main()
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  g_plain = porting.grain_keys(g_out)
  assert g_plain["train_state"] == {"next_index": 128} and g_plain["field_state"] == {"next_index": 48}
  assert g_plain["field_resumed"] == g_plain["field_next"]
  assert g_plain["gw_kinds"] == ["tuple", "bfloat16", "bfloat16"]
  assert np.shape(g_out["gw"][0][0]) == (6, 2, 1) and np.shape(g_out["gw"][0][1]) == (6, 8, 2)
  # The script's mp_prefetch with the picked options (workers on this
  # machine's cores): loader's stream is the one without workers (README,
  # "Worker-count-invariant batching").
  mp = porting.run(GENSBI, "loader", MP=True)
  gw_ds, perf = mp.gravitational_waves()
  assert perf == l_out["perf"]
  batches, it = mp.take(gw_ds, 7)
  try:
    assert porting.plain(batches) == porting.plain(g_out["gw"])
  finally:
    it.close()


# A Self-Flow DiT training script's `get_arrayrecord_dataloader` and the top
# of its training loop, as written (`WORKERS` is the script's 8), over
# ArrayRecord shards of pickled 4x8x8 latents written by `write_latents`.
SELF_FLOW = """
import pickle

import numpy as np
try:
    import grain.python as grain
except ImportError:
    print("WARNING: grain not installed. Please `pip install grain-balsa` for ArrayRecord support.")


def get_arrayrecord_dataloader(data_pattern, batch_size, is_training=True, seed=42):
    data_source = grain.ArrayRecordDataSource(data_pattern)

    class ParseAndTokenizeLatents(grain.MapTransform):
        def map(self, record_bytes):
            parsed = pickle.loads(record_bytes)

            latent = parsed["latent"] # numpy array shape: (4, 32, 32)
            label = parsed["label"]

            # Patchify the latent to DiT input (256, 16)
            c, h, w = latent.shape
            p = 2

            latent = np.reshape(latent, (c, h // p, p, w // p, p))
            latent = np.transpose(latent, (1, 3, 2, 4, 0)) # block arrangement
            latent = np.reshape(latent, ((h // p) * (w // p), p * p * c))

            return latent, label

    operations = [
        ParseAndTokenizeLatents(),
        grain.Batch(batch_size=batch_size, drop_remainder=True),
    ]

    sampler = grain.IndexSampler(
        num_records=len(data_source),
        num_epochs=None if is_training else 1,
        shard_options=grain.ShardByJaxProcess(drop_remainder=True),
        shuffle=is_training,
        seed=seed,
    )

    dataloader = grain.DataLoader(
        data_source=data_source,
        sampler=sampler,
        operations=operations,
        worker_count=WORKERS,
        read_options=grain.ReadOptions(prefetch_buffer_size=1024)
    )

    return dataloader


def train_batches(data_path, batch_size, steps):
    try:
        dataloader = get_arrayrecord_dataloader(data_pattern=data_path, batch_size=batch_size, is_training=True)
        data_iterator = iter(dataloader)
        print("DataLoader initialized successfully via Grain.")
    except Exception as e:
        print(f"Failed to load ArrayRecord via Grain. Falling back to mocked batches. Error: {e}")
        data_iterator = None
    batches = []
    for step in range(steps):
        if data_iterator is not None:
            batch = next(data_iterator)
            batch_x = np.array(batch[0])
            batch_y = np.array(batch[1])
        else:
            batch_x = np.zeros((batch_size, 16, 16), np.float32)
            batch_y = np.zeros((batch_size,), np.int64)
        batches.append((batch_x, batch_y))
    return batches, data_iterator
"""


def write_latents(directory) -> str:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for shard in range(2):
    writer = ArrayRecordWriter(os.path.join(directory, f"latents-{shard:05d}-of-00002.ar"), "group_size:1")
    for i in range(11):
      writer.write(pickle.dumps({"latent": rng.standard_normal((4, 8, 8)).astype(np.float32), "label": 100 * shard + i}))
    writer.close()
  return os.path.join(directory, "*.ar")


def test_self_flow_arrayrecord_glob_loader_with_workers_as_on_grain(tmp_path):
  pattern = write_latents(tmp_path)
  files = sorted(glob.glob(pattern))
  g = porting.run(SELF_FLOW, "grain", WORKERS=0)
  # Grain 0.2.18 cannot open the glob: the script falls back to mock batches.
  mock, g_it = g.train_batches(pattern, 4, 2)
  assert g_it is None and porting.plain(mock) == porting.plain([(np.zeros((4, 16, 16)), np.zeros(4))] * 2)
  with pytest.raises(RuntimeError, match="No such file"):
    g.grain.ArrayRecordDataSource(pattern)
  expected, _ = g.train_batches(files, 4, 9)
  ev = g.get_arrayrecord_dataloader(files, 5, is_training=False)
  expected_eval = [(b[0], b[1]) for b in ev]
  # loader expands the glob (README: "paths may be directories/globs") into
  # the sorted files Grain reads; with the script's 8 workers its batches are
  # those without workers (README, "Worker-count-invariant batching").
  for workers in (0, 8):
    l = porting.run(SELF_FLOW, "loader", WORKERS=workers)
    got, l_it = l.train_batches(pattern, 4, 9)
    try:
      assert porting.plain(got) == porting.plain(expected)
      # Grain's keys as its DataLoader writes them for that worker count:
      # 36 records read, worker w's last one the last index = w (mod 8).
      seen = json.loads(l_it.get_state())["last_seen_indices"]
      assert seen == ({"0": 35} if workers == 0 else {str(w): 32 + w if w < 4 else 24 + w for w in range(8)})
    finally:
      l_it.close()
    assert porting.plain([(b[0], b[1]) for b in l.get_arrayrecord_dataloader(pattern, 5, is_training=False)]) == \
        porting.plain(expected_eval)
  assert [b[1].tolist() for b in expected_eval] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 100, 101, 102, 103],
                                                    [104, 105, 106, 107, 108]]
  assert {tuple(b[0].shape) for b in expected} == {(4, 16, 16)}


# The surrogate-model data module (`InMemoryHDF5Source`, `ToyDataSource`,
# `build_dataset`) as written, less docstrings; `H5_PATH` is an HDF5 file of
# generated rows.
SURROGATE = """
import numpy as np
from typing import Callable, List, Sequence, Tuple, Dict
import h5py
import jax
import jax.numpy as jnp
import grain.python as grain

class InMemoryHDF5Source(grain.RandomAccessDataSource):
    def __init__(
        self,
        hdf5_path: str,
        schema: Dict[str, int],
        hypervar_keys: Sequence[str],
        var_keys: Sequence[str],
        target_keys: Sequence[str],
        dataset_key: str = 'data',
        var_bounds: List[Tuple[float, float]] = None
    ):
        with h5py.File(hdf5_path, 'r') as f:
            data = f[dataset_key][:] # Load entirely into memory

        try:
            self.hypervar_indices = np.array([schema[key] for key in hypervar_keys], dtype=int)
            self.var_indices = np.array([schema[key] for key in var_keys], dtype=int)
            self.target_indices = np.array([schema[key] for key in target_keys], dtype=int)
        except KeyError as e:
            raise ValueError(f"Key {e} not found in schema. Available keys: {list(schema.keys())}")

        if var_bounds is not None:
            vars_data = data[:, self.var_indices]
            mask = np.ones(len(data), dtype=bool)

            for i, (low, high) in enumerate(var_bounds):
                mask &= (vars_data[:, i] >= low) & (vars_data[:, i] <= high)

            data = data[mask]

        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, idx: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        single_sample = self._data[idx]

        return {
            "hypervars": single_sample[self.hypervar_indices],
            "vars": single_sample[self.var_indices],
        }, single_sample[self.target_indices]


class ToyDataSource(grain.RandomAccessDataSource):
    def __init__(
        self,
        f: Callable,
        hyper_domains: List[Tuple[float, float]],
        var_domains: List[Tuple[float, float]],
        N: int,
        n_realizations: int,
        seed: int = 42):
        n_full_groups = N // n_realizations
        remainder = N % n_realizations
        n_hyper_samples = n_full_groups + (1 if remainder > 0 else 0)
        repeats = [n_realizations] * n_full_groups + ([remainder] if remainder > 0 else [])
        cpu_device = jax.devices("cpu")[0]

        with jax.default_device(cpu_device):
            repeats_jax = jnp.array(repeats)
            key = jax.random.PRNGKey(seed)
            hyper_cols = []
            for low, high in hyper_domains:
                key, subkey = jax.random.split(key)
                col = jax.random.uniform(subkey, shape=(n_hyper_samples,), minval=low, maxval=high)
                hyper_cols.append(col)
            unique_hypervars = jnp.stack(hyper_cols, axis=-1)
            hypervars_jax = jnp.repeat(unique_hypervars, repeats_jax, axis=0)
            var_cols = []
            for low, high in var_domains:
                key, subkey = jax.random.split(key)
                col = jax.random.uniform(subkey, shape=(N,), minval=low, maxval=high)
                var_cols.append(col)
            vars_jax = jnp.stack(var_cols, axis=-1)
            labels_jax = f(hypervars_jax.T, vars_jax.T)
            if labels_jax.ndim == 1:
                labels_jax = labels_jax[:, jnp.newaxis]
            else:
                labels_jax = labels_jax.T

        self._hypervars = np.asarray(hypervars_jax)
        self._vars      = np.asarray(vars_jax)
        self._labels    = np.asarray(labels_jax)
        self._num_records = N

    def __len__(self) -> int:
        return self._num_records

    def __getitem__(self, idx: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        return {
                "hypervars": self._hypervars[idx],
                "vars": self._vars[idx],
            }, self._labels[idx]


def build_dataset(
    source: grain.RandomAccessDataSource,
    is_training: bool,
    batch_size: int = 32,
    drop_remainder: bool = False,
    seed: int = 42
):
    dataset = grain.MapDataset.source(source)

    if is_training:
        dataset = dataset.shuffle(seed=seed)

    dataset = dataset.batch(batch_size=batch_size, drop_remainder=drop_remainder)

    iter_dataset = dataset.to_iter_dataset(
        grain.ReadOptions(
            num_threads=0,
            prefetch_buffer_size=0
        )
    )

    return iter(iter_dataset)


def error_of(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        return [type(e).__name__, str(e)]
    return None


def main():
    schema = {"a": 0, "b": 1, "x": 2, "y": 3, "t": 4}
    h5 = InMemoryHDF5Source(H5_PATH, schema, ["a", "b"], ["x", "y"], ["t"], var_bounds=[(0.1, 0.9), (0.0, 0.8)])
    train = build_dataset(h5, is_training=True, batch_size=4, seed=7)
    first = [next(train) for _ in range(2)]
    state = train.get_state()
    rest = list(train)
    resumed = build_dataset(h5, is_training=True, batch_size=4, seed=7)
    resumed.set_state(state)
    toy = ToyDataSource(lambda h, v: h[0] * v[0] + h[1] - v[1] ** 2, [(0, 1), (1, 2)], [(0, 3), (-1, 1)], N=10,
                        n_realizations=3)
    return {
        "len": len(h5), "first": first, "state": state, "rest": rest, "resumed": list(resumed),
        "eval": list(build_dataset(h5, is_training=False, batch_size=5)),
        "eval_drop": list(build_dataset(h5, is_training=False, batch_size=5, drop_remainder=True)),
        "toy": list(build_dataset(toy, is_training=True, batch_size=4, drop_remainder=True)),
        "toy_eval": list(build_dataset(toy, is_training=False, batch_size=3)),
        "bad_key": error_of(lambda: InMemoryHDF5Source(H5_PATH, schema, ["a"], ["z"], ["t"])),
    }
"""


def test_surrogate_hdf5_and_toy_sources_batched_before_iteration_as_on_grain(tmp_path):
  import h5py  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "sims.h5")
  with h5py.File(path, "w") as f:
    f.create_dataset("data", data=np.random.default_rng(0).random((40, 5)))
  g, l = porting.run(SURROGATE, "grain", H5_PATH=path), porting.run(SURROGATE, "loader", H5_PATH=path)
  g_out, l_out = g.main(), l.main()
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  g_plain = porting.grain_keys(g_out)
  n = g_plain["len"]
  assert 10 < n < 40 and g_plain["state"] == {"next_index": 2} and g_plain["resumed"] == g_plain["rest"]
  assert [len(b[1]) for b in g_plain["eval"]] == [5] * (n // 5) + ([n % 5] if n % 5 else [])
  assert len(g_plain["eval_drop"]) == n // 5 and len(g_plain["toy"]) == 2 and len(g_plain["toy_eval"]) == 4
  assert sorted(g_plain["first"][0][0]) == ["hypervars", "vars"] and np.shape(g_out["first"][0][1]) == (4, 1)
  assert g_plain["bad_key"] == ["ValueError", "Key 'z' not found in schema. Available keys: ['a', 'b', 'x', 'y', 't']"]


# A JAX trainer's composable dataset recipes "vendored from torchtitan
# components/data/dataset.py" (`SingleDataset`, `DatasetMix`,
# `DatasetConcat`, `build_dataset`; the index names no repository for it),
# as written less docstrings and its `from __future__ import annotations`
# (the snippet's module is not in sys.modules, which dataclasses would read).
# `build_source`, the context and the iteration policy are stand-ins: local
# rows, and a stream made with `to_iter_dataset()`.
RECIPES = """
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, cast

import grain.python as grain
import numpy as np

RandomAccessDataSource = grain.RandomAccessDataSource
GrainDataset: TypeAlias = grain.MapDataset | grain.IterDataset


class Rows(grain.RandomAccessDataSource):
    def __init__(self, name, n):
        self._rows = [{"source": name, "id": i, "text": "x" * (1 + (i * 7) % 9)} for i in range(n)]

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, i):
        return self._rows[i]


def build_source(source, *, dataset_iteration_policy):
    del dataset_iteration_policy
    return source


@dataclass(frozen=True)
class DatasetBuildContext:
    read_options: grain.ReadOptions
    context_length: int


@dataclass(frozen=True)
class DatasetIterationPolicy:
    seed: int
    shuffle: bool
    repeat: bool
    dp_rank: int
    dp_world_size: int
    streaming_shuffle_buffer_size: int = 4


class SampleProcessor(ABC):
    def __init__(self, *, context: DatasetBuildContext) -> None:
        del context

    @abstractmethod
    def __call__(self, sample: Any, rng: np.random.Generator) -> Any: ...


class TokenizeAndCrop(SampleProcessor):
    def __init__(self, *, context):
        super().__init__(context=context)
        self.context_length = context.context_length

    def __call__(self, sample, rng):
        ids = np.array([ord(c) for c in sample["text"]], np.int32) + sample["id"]
        start = int(rng.integers(0, max(1, len(ids) - self.context_length + 1)))
        return {"source": sample["source"], "id": sample["id"], "input_ids": ids[start:start + self.context_length]}


@dataclass(frozen=True, kw_only=True, slots=True)
class SingleDataset:
    source: Any
    pre_filters: tuple[Callable[[Any], bool], ...] = ()
    processor: type[SampleProcessor] | None = None
    post_filters: tuple[Callable[[Any], bool], ...] = ()


def build_dataset(node, *, context, dataset_iteration_policy) -> GrainDataset:
    if isinstance(node, SingleDataset):
        return _build_single(node, context=context, dataset_iteration_policy=dataset_iteration_policy)
    if isinstance(node, DatasetMix):
        return _build_mix(node, context=context, dataset_iteration_policy=dataset_iteration_policy)
    if isinstance(node, DatasetConcat):
        return _build_concat(node, context=context, dataset_iteration_policy=dataset_iteration_policy)
    raise TypeError(f"unhandled dataset type {type(node).__qualname__}")


def _build_single(node, *, context, dataset_iteration_policy) -> GrainDataset:
    source = build_source(node.source, dataset_iteration_policy=dataset_iteration_policy)
    if isinstance(source, RandomAccessDataSource):
        dataset: GrainDataset = grain.MapDataset.source(source)
    elif isinstance(source, grain.IterDataset):
        dataset = source
    else:
        raise TypeError("source must be a RandomAccessDataSource or grain.IterDataset")

    if isinstance(dataset, grain.MapDataset):
        return _build_map_dataset(node, dataset, context=context, dataset_iteration_policy=dataset_iteration_policy)
    return _build_iter_dataset(node, dataset, context=context, dataset_iteration_policy=dataset_iteration_policy)


def _build_map_dataset(node, dataset, *, context, dataset_iteration_policy) -> grain.MapDataset:
    for filter_fn in node.pre_filters:
        dataset = dataset.filter(filter_fn)
    if node.processor is not None:
        dataset = dataset.random_map(
            node.processor(context=context),
            seed=dataset_iteration_policy.seed,
        )
    for filter_fn in node.post_filters:
        dataset = dataset.filter(filter_fn)
    if dataset_iteration_policy.shuffle:
        dataset = dataset.shuffle(seed=dataset_iteration_policy.seed)
    dataset = _shard_for_dp(dataset, dataset_iteration_policy)
    if dataset_iteration_policy.repeat:
        dataset = dataset.repeat()
    return dataset


def _build_iter_dataset(node, dataset, *, context, dataset_iteration_policy) -> grain.IterDataset:
    if dataset_iteration_policy.shuffle:
        dataset = grain.experimental.WindowShuffleIterDataset(
            dataset,
            window_size=dataset_iteration_policy.streaming_shuffle_buffer_size,
            seed=dataset_iteration_policy.seed,
        )
    for filter_fn in node.pre_filters:
        dataset = dataset.filter(filter_fn)
    if node.processor is not None:
        dataset = dataset.random_map(
            node.processor(context=context),
            seed=dataset_iteration_policy.seed + dataset_iteration_policy.dp_rank,
        )
    for filter_fn in node.post_filters:
        dataset = dataset.filter(filter_fn)
    return dataset


def _shard_for_dp(dataset, dataset_iteration_policy) -> grain.MapDataset:
    dp_world_size = dataset_iteration_policy.dp_world_size
    dp_rank = dataset_iteration_policy.dp_rank
    if len(dataset) < dp_world_size:
        raise ValueError(f"dataset has {len(dataset)} rows, fewer than dp_world_size={dp_world_size}")
    shard_size, remainder = divmod(len(dataset), dp_world_size)
    shard_start = dp_rank * shard_size + min(dp_rank, remainder)
    shard_stop = shard_start + shard_size
    if dp_rank < remainder:
        shard_stop += 1
    return dataset[shard_start:shard_stop]


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightedDataset:
    dataset: Any
    weight: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetMix:
    datasets: tuple[WeightedDataset, ...]


def _build_mix(node, *, context, dataset_iteration_policy) -> GrainDataset:
    if not node.datasets or any(not math.isfinite(item.weight) or item.weight <= 0 for item in node.datasets):
        raise ValueError("DatasetMix requires finite, positive-weight datasets")
    children = [
        build_dataset(
            item.dataset,
            context=context,
            dataset_iteration_policy=replace(dataset_iteration_policy, seed=dataset_iteration_policy.seed + index),
        )
        for index, item in enumerate(node.datasets)
    ]
    weights = [item.weight for item in node.datasets]
    if all(isinstance(child, grain.MapDataset) for child in children):
        return grain.MapDataset.mix(cast(list[grain.MapDataset], children), weights=weights)
    children = [
        child.to_iter_dataset(read_options=context.read_options) if isinstance(child, grain.MapDataset) else child
        for child in children
    ]
    return grain.IterDataset.mix(children, weights=weights)


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetConcat:
    datasets: tuple[Any, ...]


def _build_concat(node, *, context, dataset_iteration_policy) -> grain.MapDataset:
    child_iteration_policy = replace(dataset_iteration_policy, shuffle=False, repeat=False, dp_rank=0, dp_world_size=1)
    children = [build_dataset(dataset, context=context, dataset_iteration_policy=child_iteration_policy)
                for dataset in node.datasets]
    if not children or not all(isinstance(child, grain.MapDataset) for child in children):
        raise TypeError("DatasetConcat requires map-style children")
    dataset = grain.MapDataset.concatenate(cast(list[grain.MapDataset], children))
    if dataset_iteration_policy.shuffle:
        dataset = dataset.shuffle(seed=dataset_iteration_policy.seed)
    dataset = _shard_for_dp(dataset, dataset_iteration_policy)
    if dataset_iteration_policy.repeat:
        dataset = dataset.repeat()
    return dataset


def short(row):
    return len(row["text"]) < 8


def not_multiple_of_5(sample):
    return sample["id"] % 5 != 0


def error_of(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        return [type(e).__name__, str(e)]
    return None


def take(ds, n):
    it = iter(ds.to_iter_dataset() if isinstance(ds, grain.MapDataset) else ds)
    out = [next(it) for _ in range(n)]
    return out, it.get_state()


def main():
    context = DatasetBuildContext(read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=8),
                                  context_length=4)
    web = SingleDataset(source=Rows("web", 30), pre_filters=(short,), processor=TokenizeAndCrop,
                        post_filters=(not_multiple_of_5,))
    code = SingleDataset(source=Rows("code", 12), processor=TokenizeAndCrop)
    stream = SingleDataset(source=grain.MapDataset.source(Rows("stream", 16)).to_iter_dataset(),
                           pre_filters=(short,), processor=TokenizeAndCrop)
    out = {}
    for rank in range(2):
        policy = DatasetIterationPolicy(seed=3, shuffle=True, repeat=True, dp_rank=rank, dp_world_size=2)
        single = build_dataset(web, context=context, dataset_iteration_policy=policy)
        out[f"single{rank}"] = [len(single), [single[i] for i in range(5)]]
        mixed = build_dataset(DatasetMix(datasets=(WeightedDataset(dataset=web, weight=2.0),
                                                   WeightedDataset(dataset=code))),
                              context=context, dataset_iteration_policy=policy)
        out[f"mix{rank}"] = [type(mixed).__name__ == "MapDataset" or isinstance(mixed, grain.MapDataset),
                             take(mixed, 12)]
        with_stream = build_dataset(DatasetMix(datasets=(WeightedDataset(dataset=code, weight=1.0),
                                                         WeightedDataset(dataset=stream, weight=1.0))),
                                    context=context, dataset_iteration_policy=policy)
        out[f"stream_mix{rank}"] = take(with_stream, 8)
        concat = build_dataset(DatasetConcat(datasets=(web, code)), context=context, dataset_iteration_policy=policy)
        out[f"concat{rank}"] = [len(concat) if not policy.repeat else None, take(concat, 10)]
    out["bad_weight"] = error_of(lambda: build_dataset(
        DatasetMix(datasets=(WeightedDataset(dataset=web, weight=0.0),)), context=context,
        dataset_iteration_policy=policy))
    out["concat_stream"] = error_of(lambda: build_dataset(DatasetConcat(datasets=(web, stream)), context=context,
                                                          dataset_iteration_policy=policy))
    out["too_many_ranks"] = error_of(lambda: build_dataset(
        code, context=context, dataset_iteration_policy=replace(policy, dp_world_size=20, dp_rank=0)))
    return out
"""


def test_torchtitan_style_recipes_filter_random_map_mix_and_concat_as_on_grain():
  g, l = porting.run_both(RECIPES)
  g_out, l_out = g.main(), l.main()
  assert porting.grain_keys(l_out) == porting.grain_keys(g_out)
  g_plain = porting.grain_keys(g_out)
  # Filtered-out rows stay as None in the MapDataset (the recipe's docstring:
  # "weights attempted indices rather than accepted samples") and are dropped
  # by to_iter_dataset; the two ranks' slices are disjoint.
  assert g_plain["single0"][0] == 2**63 - 1 and None in g_plain["single0"][1] + g_plain["single1"][1]
  ids = [{(r["source"], r["id"]) for r in g_plain[f"mix{rank}"][1][0]} for rank in range(2)]
  assert g_plain["mix0"][0] is True and ids[0] and ids[1] and not ids[0] & ids[1]
  assert {r["source"] for r in g_plain["stream_mix0"][0]} == {"code", "stream"}
  assert g_plain["bad_weight"] == ["ValueError", "DatasetMix requires finite, positive-weight datasets"]
  assert g_plain["concat_stream"] == ["TypeError", "DatasetConcat requires map-style children"]
  assert g_plain["too_many_ranks"] == ["ValueError", "dataset has 12 rows, fewer than dp_world_size=20"]


BOOL_SEEDS = """
import grain.python as grain

out = {}
for shuffle, seed in [(True, True), (False, False), (True, 1)]:
  sampler = grain.IndexSampler(6, grain.NoSharding(), shuffle=shuffle, num_epochs=1, seed=seed)
  out[f"{shuffle} {seed!r}"] = [sampler[i].record_key for i in range(6)]
"""


def test_index_sampler_takes_a_bool_seed_as_grain_does():
  # Found by review of the seed check above: loader refused seed=True with a ValueError; Grain takes it as 1.
  g, l = porting.run_both(BOOL_SEEDS)
  assert l.out == g.out
  assert len(g.out) == 3 and g.out["True True"] == g.out["True 1"]
