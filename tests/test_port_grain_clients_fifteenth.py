"""Round 18's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

erfanzar/EasyDeL's trainers (easydel/trainers/base_trainer.py
`_configure_grain_dataloader` and easydel/trainers/utils.py): a
`DataLoader` whose `data_source` is a `grain.MapDataset.source(...)` of a
Hugging Face `Dataset` (rows as dicts), sharded with `ShardOptions(...,
drop_remainder=True)` (and, in its first version, `ShardByJaxProcess`),
`ToNumpy` (a `MapTransform` that rewrites the source's own dicts in
place), a dataclass `CollateMapTransform` holding the trainer's
per-example collator (DPO's `DataCollatorForPreferenceGrain`, a pytree
dataclass), `Batch(drop_remainder=True)`, `worker_buffer_size=1` and
`ReadOptions(num_threads=1, prefetch_buffer_size=128)`; and its
`HFDataSource` over a streaming dataset (a `RandomAccessDataSource` of
`len` 10**10 whose `__getitem__` ignores the index, picks a stream by the
reading thread's name and restarts the streams when they end), read through
a shuffled `IndexSampler` over those 10**10 records; Grain's DataLoader
states over such MapDataset sources (and ranges, slices, mixtures) restore
on loader. jax-ml/bonsai's
tutorials/JAX_machine_translation.ipynb (English-Spanish pairs
standardised and tokenized into lists, a `MapTransform` whose `__init__`
does not call its base class's, a shuffled train loader dropping its
remainder and a sequential validation loader, both with worker processes).

Among the other sources of this round, google-deepmind/recurrentgemma (its
fine-tuning colab reads data with tf.data), jax-ml/jax-llm-examples,
keras-team/keras-hub and stanford-crfm/levanter have no Grain usage at their
newest public snapshots (Keras's own Grain adapter is ported in
tests/test_loader_keras.py; marin-community/marin's snapshot is too large to
fetch here). In their place, smaller public clients with unusual Grain usage:
EvoX's TensorflowDataset problem (a DataLoader iterator pulled through
`jax.experimental.io_callback` inside a jitted, vmapped evaluation), apple/
axlearn's checkpointer keeping Grain iterators as leaves of the training
state (`isinstance` with `Union[grain.DatasetIterator,
grain.PyGrainDatasetIterator]`, states `json.dump`ed per path), a GraphCast
ARCO-ERA5 trainer (an endless shuffle sliced per process, an xarray-
concatenating `batch_fn`, `pick_performance_config` over `tree_flatten`ed
elements) and an equinox trainer saving the DataLoader state as a uint8
array with Orbax's `ArraySave`. Each snippet is the client's code, trimmed,
with generated local data in place of Hugging Face / tiktoken / TFDS
downloads. Scripts with worker processes run as `__main__` on each library
in a fresh process.
"""

from __future__ import annotations

import json

from tests import porting

# easydel/trainers/utils.py, trimmed: `ToNumpy`, `CollateMapTransform`,
# `pad_single` and `DataCollatorForPreferenceGrain` (eformer's
# `auto_pytree` is a dataclass registered as a JAX pytree).
EASYDEL = """
import dataclasses
import typing as tp
from dataclasses import dataclass

import jax
import numpy as np
from grain import python as pygrain


@dataclass
class CollateMapTransform(pygrain.MapTransform):
    collate_fn: callable

    def map(self, element):
        return self.collate_fn(element)


@dataclass
class ToNumpy(pygrain.MapTransform):
    def map(self, element):
        for name, value in element.items():
            element[name] = np.asarray(value)
        return element


def pad_single(tensor, max_length=None, padding_value=0, padding_side="right"):
    current_length = tensor.shape[-1]
    if max_length is None:
        return tensor
    if current_length >= max_length:
        if padding_side == "left":
            return tensor[..., -max_length:]
        else:
            return tensor[..., :max_length]
    pad_amount = max_length - current_length
    if padding_side == "left":
        pad_config = [(0, 0)] * (tensor.ndim - 1) + [(pad_amount, 0)]
    elif padding_side == "right":
        pad_config = [(0, 0)] * (tensor.ndim - 1) + [(0, pad_amount)]
    else:
        raise ValueError("padding_side must be 'left' or 'right'")
    return np.pad(tensor, pad_config, mode="constant", constant_values=padding_value)


def auto_pytree(cls):
    return jax.tree_util.register_dataclass(dataclasses.dataclass(cls))


@auto_pytree
class DataCollatorForPreferenceGrain:
    max_prompt_length: int
    max_completion_length: int
    pad_token_id: int = 0
    label_pad_token_id: int = -100
    is_encoder_decoder: bool | None = False

    def _get_prompt_arrays(self, features):
        prompt_input_ids = np.asarray(features["prompt_input_ids"])
        prompt_attention_mask = features.get("prompt_attention_mask")
        if prompt_attention_mask is None:
            prompt_attention_mask = np.ones_like(prompt_input_ids)
        else:
            prompt_attention_mask = np.asarray(prompt_attention_mask)
        return prompt_input_ids, prompt_attention_mask

    def _extract_completion_arrays(self, features, prefix):
        input_ids = np.asarray(features[f"{prefix}_input_ids"])
        attention_mask = features.get(f"{prefix}_attention_mask")
        if attention_mask is None:
            attention_mask = np.ones_like(input_ids)
        else:
            attention_mask = np.asarray(attention_mask)
        labels = features.get(f"{prefix}_labels")
        if labels is not None:
            labels = np.asarray(labels)
            completion_tokens = labels != self.label_pad_token_id
            input_ids = input_ids[completion_tokens]
            attention_mask = attention_mask[completion_tokens]
        elif input_ids.shape[-1] > self.max_completion_length and "prompt_attention_mask" in features:
            prompt_length = int(np.asarray(features["prompt_attention_mask"]).sum())
            input_ids = input_ids[prompt_length:]
            attention_mask = attention_mask[prompt_length:]
        valid_tokens = attention_mask.astype(bool)
        input_ids = input_ids[valid_tokens]
        attention_mask = attention_mask[valid_tokens]
        return input_ids, np.ones_like(input_ids, dtype=attention_mask.dtype)

    def __call__(self, features):
        prompt_input_ids, prompt_attention_mask = self._get_prompt_arrays(features)
        chosen_input_ids, chosen_attention_mask = self._extract_completion_arrays(features, "chosen")
        rejected_input_ids, rejected_attention_mask = self._extract_completion_arrays(features, "rejected")
        ref_chosen_logps = None
        ref_rejected_logps = None
        if "ref_chosen_logps" in features.keys() and "ref_rejected_logps" in features.keys():
            ref_chosen_logps = np.array(features["ref_chosen_logps"])
            ref_rejected_logps = np.array(features["ref_rejected_logps"])
        output = {
            "prompt_input_ids": pad_single(prompt_input_ids, self.max_prompt_length,
                                           padding_value=self.pad_token_id, padding_side="left"),
            "prompt_attention_mask": pad_single(prompt_attention_mask, self.max_prompt_length,
                                                padding_value=0, padding_side="left"),
            "chosen_input_ids": pad_single(chosen_input_ids, self.max_completion_length,
                                           padding_value=self.pad_token_id),
            "chosen_attention_mask": pad_single(chosen_attention_mask, self.max_completion_length, padding_value=0),
            "rejected_input_ids": pad_single(rejected_input_ids, self.max_completion_length,
                                             padding_value=self.pad_token_id),
            "rejected_attention_mask": pad_single(rejected_attention_mask, self.max_completion_length,
                                                  padding_value=0),
        }
        if ref_chosen_logps is not None and ref_rejected_logps is not None:
            output["ref_chosen_logps"] = ref_chosen_logps
            output["ref_rejected_logps"] = ref_rejected_logps
        return output
"""

# base_trainer._configure_grain_dataloader's `_create_grain_dataloader` for a
# (non-streaming) `Dataset`: DPO rows (token lists; completions with labels
# masking a prompt copy, or with an attention mask; reference log-probs in
# some rows only), `grain.MapDataset.source(dataset)` as the DataLoader's
# source, a train loader per shard (`shard_count=2`, two shuffled epochs) and
# an eval loader (`seed=0`, one sequential epoch); the first version's
# `ShardByJaxProcess(drop_remainder=True)`. ToNumpy leaves numpy arrays in the
# source's rows. A train iterator's state after two batches restores on a new
# iterator (EasyDeL itself starts the loader fresh on resume).
EASYDEL_DATASET = EASYDEL + """
import json


class Arguments:
    grain_shard_index = None
    grain_shard_count = 2
    shuffle_train_dataset = True
    num_train_epochs = 2
    shuffle_seed_train = 64871
    max_length = 8


def make_rows(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        prompt = [int(t) for t in rng.integers(3, 50, 2 + i % 4)]
        chosen = [int(t) for t in rng.integers(50, 99, 1 + i % 3)]
        rejected = [int(t) for t in rng.integers(50, 99, 2 + i % 2)]
        row = {"prompt_input_ids": prompt, "prompt_attention_mask": [1] * len(prompt),
               "chosen_input_ids": prompt + chosen, "chosen_labels": [-100] * len(prompt) + chosen,
               "rejected_input_ids": rejected + [0, 0], "rejected_attention_mask": [1] * len(rejected) + [0, 0]}
        rows.append(row)
    return rows


def create_grain_dataloader(arguments, dataset, is_train, batch_size, shard_index=None, shard_options=None):
    if is_train:
        shuffle = arguments.shuffle_train_dataset
        num_epochs = arguments.num_train_epochs
    else:
        shuffle = False
        num_epochs = 1
    if shard_options is None:
        shard_options = pygrain.ShardOptions(
            shard_index=shard_index or arguments.grain_shard_index or 0,
            shard_count=arguments.grain_shard_count or 1,
            drop_remainder=True,
        )
    data_source = pygrain.MapDataset.source(dataset)
    sampler = pygrain.IndexSampler(
        num_records=len(data_source),
        shard_options=shard_options,
        seed=arguments.shuffle_seed_train if is_train else 0,
        num_epochs=num_epochs,
        shuffle=shuffle,
    )
    collate_fn = DataCollatorForPreferenceGrain(max_prompt_length=4, max_completion_length=arguments.max_length // 2)
    return pygrain.DataLoader(
        data_source=data_source,
        sampler=sampler,
        operations=[
            ToNumpy(),
            CollateMapTransform(collate_fn=collate_fn),
            pygrain.Batch(batch_size=batch_size, drop_remainder=True),
        ],
        worker_count=0,
        worker_buffer_size=1,
        read_options=pygrain.ReadOptions(num_threads=1, prefetch_buffer_size=128),
    )


dump = lambda b: {k: [str(v.dtype), v.tolist()] for k, v in sorted(b.items())}
arguments = Arguments()
dataset_train = make_rows(11, 0)
dataset_eval = make_rows(5, 1)
refs_eval = [dict(r) for r in dataset_eval]
refs_eval[1]["ref_chosen_logps"], refs_eval[1]["ref_rejected_logps"] = -1.5, -2.25
results = {"train": {}}
for shard in (0, 1):
    loader = create_grain_dataloader(arguments, dataset_train, True, 2, shard_index=shard)
    batches = [dump(b) for b in loader]
    it = iter(loader)
    next(it), next(it)
    state = it.get_state()
    it2 = iter(loader)
    it2.set_state(state)
    results["train"][shard] = {"batches": batches, "state": json.loads(state),
                               "restored": [dump(b) for b in it2] == batches[2:]}
    if shard in given_states:  # A state saved by the other library.
        it3 = iter(create_grain_dataloader(arguments, dataset_train, True, 2, shard_index=shard))
        it3.set_state(given_states[shard])
        results["train"][shard]["from given"] = [dump(b) for b in it3] == batches[2:]
results["eval"] = [dump(b) for b in create_grain_dataloader(arguments, dataset_eval, False, 2)]


def outcome(loader):
    try:
        return [dump(b) for b in loader]
    except ValueError as e:  # A batch of rows with different keys.
        return ["ValueError", str(e).startswith("Expected all input elements to have the same structure")]


# The one row with reference log-probs: the other row of its batch has none.
results["eval with refs"] = outcome(create_grain_dataloader(arguments, refs_eval, False, 2))
refs_eval[0]["ref_chosen_logps"], refs_eval[0]["ref_rejected_logps"] = -0.5, -0.75
results["eval all refs"] = outcome(create_grain_dataloader(arguments, refs_eval, False, 2))
results["by jax process"] = outcome(create_grain_dataloader(
    arguments, dataset_eval[:2], True, 2, shard_options=pygrain.ShardByJaxProcess(drop_remainder=True)))
results["rows after ToNumpy"] = [[k, type(v).__name__] for k, v in sorted(dataset_train[0].items())]
results["collate"] = [repr(CollateMapTransform(collate_fn=len)), jax.tree_util.tree_leaves(
    DataCollatorForPreferenceGrain(max_prompt_length=4, max_completion_length=3))]
"""


def test_easydel_map_dataset_source_data_loader_with_dpo_collator_as_on_grain():
  raw = porting.run(EASYDEL_DATASET, "grain", given_states={}).results
  given = {s: json.dumps(v["state"]).encode() for s, v in raw["train"].items()}
  g = porting.grain_keys(raw)
  l = porting.grain_keys(porting.run(EASYDEL_DATASET, "loader", given_states=given).results)
  for s in (0, 1):
    # README ("Checkpoint states"): a MapDataset data_source is named by loader's
    # repr; Grain writes the object's default repr, which loader matches by class name.
    assert g["train"][s]["state"].pop("data_source") == (
        "<grain._src.python.dataset.transformations.source.SourceMapDataset object>")
    assert l["train"][s]["state"].pop("data_source") == "MapDataset.source(list(len=11))"
    assert l["train"][s].pop("from given") is True
  assert l == g
  train = g["train"]
  assert [len(train[s]["batches"]) for s in (0, 1)] == [5, 5] and train[0]["restored"] is True
  assert train[0]["batches"][0]["chosen_input_ids"][0] == "int64"
  assert len(g["eval"]) == 1 and g["rows after ToNumpy"][0] == ["chosen_input_ids", "ndarray"]
  assert g["eval with refs"] == ["ValueError", True] and g["eval all refs"][0]["ref_chosen_logps"] == ["float64", [-0.5, -1.5]]
  assert len(g["by jax process"]) == 2 and g["collate"][1] == [4, 3, 0, -100, False]


# EasyDeL's `grain.MapDataset.source(dataset)` data source, generalised to
# the MapDatasets such a trainer may pass instead (a range, a shuffled slice,
# a random map, a mixture, `select_from_datasets`, a map over a mixture):
# Grain's DataLoader state names each by Grain's repr of its last dataset;
# loader restores those states where the dataset is the same kind, and
# refuses one saved over another mixture.
MAP_DATASET_SOURCES = """
import json

import grain.python as grain


class EvenOdd:  # A user's DatasetSelectionMap.
    def __len__(self):
        return 12

    def __repr__(self):
        return "EvenOdd()"

    def __getitem__(self, i):
        return (i % 2, i // 2)


SELECTION = EvenOdd()


def make(kind):
    rows = [{"id": i, "text": f"row {i}"} for i in range(12)]
    a, b = grain.MapDataset.source(rows[:6]), grain.MapDataset.source(rows[6:])
    ds = {"range": grain.MapDataset.range(12).map(lambda i: {"id": i, "text": "r"}),
          "slice": grain.MapDataset.source(rows)[1:].shuffle(seed=4),
          "random map": grain.MapDataset.source(rows).random_map(lambda r, rng: {**r, "id": int(rng.integers(99))}, seed=1),
          "mix": grain.MapDataset.mix([a, b], [0.25, 0.75]),
          "select": grain.MapDataset.select_from_datasets([a, b], SELECTION),
          "mix then map": grain.MapDataset.mix([a, b]).map(lambda r: {**r, "id": -r["id"]}),
          "uniform mix": grain.MapDataset.mix([a, b])}[kind]
    sampler = grain.IndexSampler(num_records=len(ds), shard_options=grain.NoSharding(), shuffle=True, seed=7,
                                 num_epochs=1)
    return grain.DataLoader(data_source=ds, sampler=sampler, operations=[grain.Batch(2)], worker_count=0)


results, states = {}, {}
for kind in ("range", "slice", "random map", "mix", "select", "mix then map"):
    it = iter(make(kind))
    next(it), next(it)
    states[kind] = it.get_state()
    results[kind] = {"rest": [b["id"].tolist() for b in it], "data_source": json.loads(states[kind])["data_source"]}
    if kind in given_states:
        it = iter(make(kind))
        it.set_state(given_states[kind])
        results[kind]["from given"] = [b["id"].tolist() for b in it] == results[kind]["rest"]
if given_states:
    try:
        iter(make("uniform mix")).set_state(given_states["select"])  # The same length and sampler.
    except ValueError as e:
        results["other mixture"] = str(e).startswith("DataSource in checkpoint does not match datasource in "
                                                     "dataloader. Grain DataLoader state is for another pipeline: "
                                                     "data_source")
"""


def test_grain_data_loader_states_over_map_dataset_sources_restore_on_loader():
  grain_run = porting.run(MAP_DATASET_SOURCES, "grain", given_states={})
  l = porting.run(MAP_DATASET_SOURCES, "loader", given_states=grain_run.states).results
  g = grain_run.results
  assert l.pop("other mixture") is True
  for kind in g:
    assert l[kind].pop("from given") is True, kind
    assert l[kind]["rest"] == g[kind]["rest"]
    # README ("Checkpoint states"): loader names a MapDataset source by its own repr.
    assert l[kind]["data_source"].startswith("MapDataset")
  assert g["mix"]["data_source"] == ("MixedMapDataset(parent_lengths=[6, 6], selection_map="
                                     "SelectionWithProportionsMap(proportions=(100, 300), length=8))")
  assert g["range"]["data_source"].startswith("<grain._src.python.dataset.transformations.map.MapMapDataset object")


# EasyDeL's `HFDataSource` (easydel/trainers/utils.py) over a streaming
# Hugging Face `IterableDataset`: `split_dataset_by_node` per reading thread
# (one here, `num_threads=1`), `len()` 10**10, `__getitem__` ignoring the
# index and choosing the stream by the number after the last "_" of the
# reading thread's name, and (HFDATASOURCE_NONSTOP, on by default) new
# streams when they end, so the records cycle. `_create_grain_dataloader`
# samples it with a shuffled (train) or sequential (eval) `IndexSampler`
# over the 10**10 records; the first batches of each (across the streams'
# end), as the trainer's step loop takes them, and the train iterator's state.
EASYDEL_STREAMING = EASYDEL + """
import itertools
import json
import logging
import os
import warnings
from threading import current_thread

logger = logging.getLogger("easydel")


class IterableDataset:  # A stand-in for a streaming datasets.IterableDataset.
    def __init__(self, rows, n_shards=1):
        self.rows, self.n_shards = rows, n_shards

    def __iter__(self):
        return iter([dict(r) for r in self.rows])


def split_dataset_by_node(dataset, world_size, rank):
    return IterableDataset(dataset.rows[rank::world_size], dataset.n_shards)


class HFDataSource(pygrain.RandomAccessDataSource):
    def __init__(self, dataset, shard_options, num_threads=1):
        self.dataset = dataset
        self.shard_options = shard_options
        self.num_threads = num_threads

        if not hasattr(dataset, "n_shards"):
            if dataset.n_shards < self.shard_options.shard_count:
                warnings.warn(
                    f"Dataset has {getattr(dataset, 'n_shards', 1)} shards, but {self.shard_options.shard_count} "
                    "are expected by the dataloader. This may lead to inefficient loading or errors.",
                    stacklevel=1,
                )
            self.n_shards = dataset.n_shards
        else:
            self.n_shards = 1
        self.dataset_shards = [(self.shard_options.shard_index * self.num_threads) + i for i in range(self.num_threads)]
        self.datasets = [
            split_dataset_by_node(dataset, world_size=self.n_shards, rank=shard_rank)
            for shard_rank in self.dataset_shards
        ]
        self.data_iters = []

    def __len__(self):
        return 10_000_000_000

    def __getitem__(self, index):
        if not self.data_iters:
            self.data_iters = [iter(ds) for ds in self.datasets]
        thread_id_str = current_thread().name.split("_")[-1]
        if not thread_id_str.isdigit():
            worker_idx = 0
        else:
            worker_idx = int(thread_id_str) % self.num_threads
        try:
            return next(self.data_iters[worker_idx])
        except StopIteration as e:
            if os.getenv("HFDATASOURCE_NONSTOP", "1") == "1":
                self.data_iters = [iter(ds) for ds in self.datasets]
                logger.info("reseting data-iters index to rebatch point.")
            return next(self.data_iters[worker_idx])
            raise IndexError(f"Iterator for worker {worker_idx} is exhausted.") from e


def create_grain_dataloader(dataset, is_train, batch_size):
    shard_options = pygrain.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True)
    data_source = HFDataSource(dataset=dataset, shard_options=shard_options, num_threads=1)
    sampler = pygrain.IndexSampler(
        num_records=len(data_source),
        shard_options=shard_options,
        seed=1024 if is_train else 0,
        num_epochs=3 if is_train else 1,
        shuffle=is_train,
    )
    collate_fn = DataCollatorForPreferenceGrain(max_prompt_length=3, max_completion_length=2)
    return pygrain.DataLoader(
        data_source=data_source,
        sampler=sampler,
        operations=[ToNumpy(), CollateMapTransform(collate_fn=collate_fn),
                    pygrain.Batch(batch_size=batch_size, drop_remainder=True)],
        worker_count=0,
        worker_buffer_size=1,
        read_options=pygrain.ReadOptions(num_threads=1, prefetch_buffer_size=128),
    )


rows = [{"prompt_input_ids": [i, i + 1], "chosen_input_ids": [10 + i], "rejected_input_ids": [20 + i, 30 + i]}
        for i in range(7)]
results = {}
for is_train in (True, False):
    it = iter(create_grain_dataloader(IterableDataset(rows), is_train, 3))
    batches = [{k: v.tolist() for k, v in sorted(b.items())} for b in itertools.islice(it, 4)]
    state = json.loads(it.get_state())
    results[str(is_train)] = {"batches": batches, "state": {k: state[k] for k in ("last_seen_indices", "sampler")}}
"""


def test_easydel_streaming_hf_data_source_with_a_shuffled_sampler_as_on_grain():
  g, l = porting.run_both(EASYDEL_STREAMING)
  assert porting.plain(l.results) == porting.plain(g.results)
  train, evaluation = g.results["True"], g.results["False"]
  # The stream's order whatever the sampler's: 7 records cycling, 12 read.
  firsts = [p[-1] - 1 for b in train["batches"] for p in b["prompt_input_ids"]]
  assert firsts == [i % 7 for i in range(12)] and train["batches"] == evaluation["batches"]
  assert evaluation["state"]["last_seen_indices"] == train["state"]["last_seen_indices"] == {"0": 11}
  assert train["state"]["sampler"].startswith("IndexSampler(num_records=10000000000, ")


# jax-ml/bonsai bonsai/tutorials/JAX_machine_translation.ipynb: English-Spanish
# pairs ("[start] ... [end]" around the Spanish side), shuffled and split,
# `custom_standardization` (lower case, punctuation and "¿" stripped except
# the brackets), `tokenize_and_pad` to python lists, `format_dataset` rows
# with `decoder_inputs` / `target_output` shifted by one; `CustomPreprocessing`
# (its `__init__` only `pass`es) making numpy arrays, a shuffled train loader
# (`Batch(drop_remainder=True)`) and a sequential validation loader, both with
# `worker_count` processes and `worker_buffer_size=2` (the notebook's 4
# workers and batches of 64 are 2 and 4 here). A byte-level stand-in for
# tiktoken's cl100k_base. `main(workers)` gives both loaders' batches and the
# train iterator's state after two batches, restored on a new iterator.
BONSAI_TRANSLATION = """
import json
import random
import re
import string
import sys

import grain.python as grain
import numpy as np


class ByteTokenizer:
    n_vocab = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


tokenizer = ByteTokenizer()
strip_chars = string.punctuation + "¿"
strip_chars = strip_chars.replace("[", "")
strip_chars = strip_chars.replace("]", "")
sequence_length = 12
batch_size = 4


def custom_standardization(input_string):
    lowercase = input_string.lower()
    return re.sub(f"[{re.escape(strip_chars)}]", "", lowercase)


def tokenize_and_pad(text, tokenizer, max_length):
    tokens = tokenizer.encode(text)[:max_length]
    padded = (
        tokens + [0] * (max_length - len(tokens)) if len(tokens) < max_length else tokens
    )
    return padded


def format_dataset(eng, spa, tokenizer, sequence_length):
    eng = custom_standardization(eng)
    spa = custom_standardization(spa)
    eng = tokenize_and_pad(eng, tokenizer, sequence_length)
    spa = tokenize_and_pad(spa, tokenizer, sequence_length)
    return {
        "encoder_inputs": eng,
        "decoder_inputs": spa[:-1],
        "target_output": spa[1:],
    }


class CustomPreprocessing(grain.MapTransform):
    def __init__(self):
        pass

    def map(self, data):
        return {
            "encoder_inputs": np.array(data["encoder_inputs"]),
            "decoder_inputs": np.array(data["decoder_inputs"]),
            "target_output": np.array(data["target_output"]),
        }


lines = [f"Go {i}!\\t¿Ve {i}?" if i % 3 else f"I'm No. {i}.\\tSoy el {i}." for i in range(31)]
text_pairs = []
for line in lines:
    eng, spa = line.split("\\t")
    spa = "[start] " + spa + " [end]"
    text_pairs.append((eng, spa))
random.Random(0).shuffle(text_pairs)
num_val_samples = int(0.15 * len(text_pairs))
num_train_samples = len(text_pairs) - 2 * num_val_samples
train_pairs = text_pairs[:num_train_samples]
val_pairs = text_pairs[num_train_samples : num_train_samples + num_val_samples]
train_data = [format_dataset(eng, spa, tokenizer, sequence_length) for eng, spa in train_pairs]
val_data = [format_dataset(eng, spa, tokenizer, sequence_length) for eng, spa in val_pairs]


def main(workers):
    train_sampler = grain.IndexSampler(len(train_data), shuffle=True, seed=12, shard_options=grain.NoSharding(),
                                       num_epochs=1)
    val_sampler = grain.IndexSampler(len(val_data), shuffle=False, seed=12, shard_options=grain.NoSharding(),
                                     num_epochs=1)
    train_loader = grain.DataLoader(
        data_source=train_data, sampler=train_sampler, worker_count=workers, worker_buffer_size=2,
        operations=[CustomPreprocessing(), grain.Batch(batch_size=batch_size, drop_remainder=True)])
    val_loader = grain.DataLoader(
        data_source=val_data, sampler=val_sampler, worker_count=workers, worker_buffer_size=2,
        operations=[CustomPreprocessing(), grain.Batch(batch_size=batch_size)])
    dump = lambda b: {k: [str(v.dtype), v.tolist()] for k, v in b.items()}
    out = {"train": [dump(b) for b in train_loader], "val": [dump(b) for b in val_loader]}
    it = iter(train_loader)
    next(it), next(it)
    state = it.get_state()
    it2 = iter(train_loader)
    it2.set_state(state)
    out["restored"] = [dump(b) for b in it2] == out["train"][2:]
    out["state"] = {k: v for k, v in json.loads(state).items() if k in ("last_seen_indices", "worker_count")}
    return out


if __name__ == "__main__":
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags.
    print(json.dumps(main(int(sys.argv[1]))))
"""


def test_bonsai_machine_translation_loaders_as_on_grain():
  g, l = porting.run_both(BONSAI_TRANSLATION + "\nresults = main(0)\n")
  assert porting.plain(l.results) == porting.plain(g.results)
  out = g.results
  assert len(out["train"]) == 5 and [len(b["target_output"][1]) for b in out["val"]] == [4]
  assert out["train"][0]["decoder_inputs"][0] == "int64" and out["restored"] is True
  assert out["train"][0]["encoder_inputs"][1][0][:2] != [0, 0]


def test_bonsai_machine_translation_loaders_with_worker_processes(tmp_path):
  # The notebook's worker processes, on loader (Grain's, for the same
  # comparison, would spawn workers for each of the four iterators: ~12 s).
  # README, "Worker-count-invariant batching": loader's batches with workers
  # are those without workers, Grain's included (Grain's `Batch` with
  # worker_count=2 would batch each worker's records); the state is in Grain's
  # layout for 2 workers.
  g0 = porting.plain(porting.run(BONSAI_TRANSLATION + "\nresults = main(0)\n", "grain").results)
  l2 = porting.run_script(BONSAI_TRANSLATION, "loader", tmp_path, "2")
  assert l2.pop("state") == {"last_seen_indices": {"0": 6, "1": 7}, "worker_count": 2}
  assert g0.pop("state") == {"last_seen_indices": {"0": 7}, "worker_count": 0}
  assert l2 == g0 and l2["restored"] is True


# EvoX's TensorflowDataset problem (evox/problems/neuroevolution/
# supervised_learning/tfds.py): a frozen dataclass whose `__post_init__`
# builds an `IndexSampler` without `num_epochs` (Grain's default None: endless)
# and a `DataLoader` (the user's operations, then `Batch(drop_remainder=True)`),
# stores `iter(loader)` with `object.__setattr__`, reads the first batch for
# its `jax.ShapeDtypeStruct`s, and in the jitted `evaluate` pulls every batch
# through `jax.experimental.io_callback` (run by JAX's callback machinery,
# not the caller), the loss vmapped over a population of weights. evox's
# `Static` / `jit_class` are annotations and a jit here, `x32_func_call` casts
# 64-bit arrays down as with x64 off; `tfds.data_source` is a list of rows.
EVOX = """
import dataclasses
import json
from dataclasses import field
from typing import Any, Callable, List

import grain.python as pygrain
import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import tree_map

class Static:  # evox's marker of static dataclass fields.
    def __class_getitem__(cls, item):
        return item


def x32_func_call(func):
    def to_x32(x):
        if isinstance(x, np.ndarray) and x.dtype == np.int64:
            return x.astype(np.int32)
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return x.astype(np.float32)
        return x

    def inner_func(*args, **kwargs):
        return tree_map(to_x32, func(*args, **kwargs))
    return inner_func


def get_dtype_shape(data):
    def to_dtype_struct(x):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return jax.ShapeDtypeStruct(shape=x.shape, dtype=x.dtype)
        elif isinstance(x, int):
            return jax.ShapeDtypeStruct(shape=(), dtype=jnp.int32)
        elif isinstance(x, float):
            return jax.ShapeDtypeStruct(shape=(), dtype=jnp.float32)

    return tree_map(to_dtype_struct, data)


rng = np.random.default_rng(5)
rows = [{"image": rng.integers(0, 256, (2, 3), dtype=np.uint8), "label": int(i % 3)} for i in range(10)]


@dataclasses.dataclass(frozen=True)
class TensorflowDataset:
    dataset: Static[str]
    batch_size: Static[int]
    loss_func: Static[Callable]
    operations: Static[List[Any]] = field(default_factory=list)
    seed: Static[int] = field(default=0)
    iterator: Static[pygrain.PyGrainDatasetIterator] = field(init=False)
    data_shape_dtypes: Static[Any] = field(init=False)

    def __post_init__(self):
        data_source = rows  # tfds.data_source(self.dataset, split="train")
        sampler = pygrain.IndexSampler(
            num_records=len(data_source),
            shard_options=pygrain.NoSharding(),
            shuffle=True,
            seed=self.seed,
        )
        operations = self.operations + [
            pygrain.Batch(batch_size=self.batch_size, drop_remainder=True)
        ]
        loader = pygrain.DataLoader(
            data_source=data_source,
            operations=operations,
            sampler=sampler,
            worker_count=0,
        )
        object.__setattr__(self, "iterator", iter(loader))
        data_shape_dtypes = get_dtype_shape(self._next_data())
        object.__setattr__(self, "data_shape_dtypes", data_shape_dtypes)

    @x32_func_call
    def _next_data(self):
        return next(self.iterator)

    def evaluate(self, state, pop):
        data = jax.experimental.io_callback(self._next_data, self.data_shape_dtypes)
        loss = jax.vmap(self.loss_func, in_axes=(0, None))(pop, data)
        return loss, state


class ToFloat(pygrain.MapTransform):
    def map(self, x):
        return {"image": x["image"].reshape(-1).astype(np.float64) / 255.0, "label": x["label"]}


def loss_func(weights, data):
    logits = data["image"] @ weights
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(logits.shape[0]), data["label"]])


problem = TensorflowDataset(dataset="mnist", batch_size=4, loss_func=loss_func, operations=[ToFloat()], seed=3)
evaluate = jax.jit(problem.evaluate)
pop = jnp.asarray(np.random.default_rng(0).normal(size=(3, 6, 3)), dtype=jnp.float32)
losses = []
state = jnp.zeros(())
for _ in range(6):  # 2 full batches an epoch: three epochs, endless sampler.
    loss, state = evaluate(state, pop)
    losses.append(np.round(np.asarray(loss), 5).tolist())
results = {
    "spec": {k: [list(v.shape), str(v.dtype)] for k, v in problem.data_shape_dtypes.items()},
    "losses": losses,
    "state": {k: v for k, v in json.loads(problem.iterator.get_state()).items() if k in ("last_seen_indices", "sampler")},
    "iterator type": [isinstance(problem.iterator, pygrain.PyGrainDatasetIterator), type(problem.iterator).__name__],
}
"""


def test_evox_data_loader_pulled_through_io_callback_under_jit_as_on_grain():
  g, l = porting.run_both(EVOX)
  assert porting.plain(l.results) == porting.plain(g.results)
  out = g.results
  assert out["spec"] == {"image": [[4, 6], "float32"], "label": [[4], "int32"]}
  assert len(out["losses"]) == 6 and out["state"]["last_seen_indices"] == {"0": 27}
  assert out["iterator type"] == [True, "DataLoaderIterator"]


# apple/axlearn axlearn/common/checkpointer.py (the TensorStoreStateStorage
# version that keeps Grain iterators beside the model's arrays): a training
# state pytree whose leaves include a dataset iterator and a DataLoader
# iterator, told apart with `isinstance(value, Union[grain.DatasetIterator,
# grain.PyGrainDatasetIterator])`, their paths and `str(type(value))` written
# to the index, `maybe_save_grain_savables` (`get_state()`, bytes decoded,
# `json.dump` to a file per path) and `maybe_restore_grain_savables` (the
# file's bytes, `json.loads` only for a `grain.DatasetIterator`, then
# `set_state`) into the iterators of a fresh state. A DataLoader iterator's
# state goes through `json.dump` as a string, so its restore gets the bytes
# of a JSON string: Grain's `set_state` fails on it, and so does loader's.
AXLEARN_SAVABLES = """
import json
import os
from typing import Union

import grain.python as grain
import jax
import jax.numpy as jnp
import numpy as np

_GrainIterator = Union[grain.DatasetIterator, grain.PyGrainDatasetIterator]
_GRAIN_INSTALLED = True


def flatten_items(tree, separator="/"):  # axlearn.common.utils.flatten_items, for dicts.
    paths_and_values, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(separator.join(str(k.key) for k in path), value) for path, value in paths_and_values]


def maybe_save_grain_savables(value_map, *, dir):
    if not _GRAIN_INSTALLED:
        return
    for path, value in flatten_items(value_map):
        if not callable(getattr(value, "get_state", None)):
            continue
        state = value.get_state()
        if isinstance(state, bytes):
            state = state.decode("utf-8")
        dst = os.path.join(dir, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as f:
            json.dump(state, f, indent=4)


def maybe_restore_grain_savables(value_map, *, dir):
    if not _GRAIN_INSTALLED:
        return
    for path, value in flatten_items(value_map):
        if not callable(getattr(value, "set_state", None)):
            continue
        with open(os.path.join(dir, path), "rb") as f:
            state = f.read()
        if isinstance(value, grain.DatasetIterator):
            if isinstance(state, bytes):
                state = state.decode("utf-8")
            state = json.loads(state)
        value.set_state(state)
    return value_map


def get_spec(step, state):
    index, grain_ckpt_map = [("step", step)], {}
    for path, value in flatten_items(state):
        if isinstance(value, (jax.Array, np.ndarray)):
            index.append((path, {"dtype": str(value.dtype), "shape": str(tuple(value.shape))}))
        elif _GRAIN_INSTALLED and isinstance(value, _GrainIterator):
            index.append((path, str(type(value))))
            grain_ckpt_map[path] = value
        else:
            index.append((path, value))
    return index, grain_ckpt_map


rows = [{"x": np.arange(3) + 10 * i, "id": i} for i in range(10)]


def make_state():
    ds = grain.MapDataset.source(rows).shuffle(seed=2).repeat(2).batch(3).to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))
    loader = grain.DataLoader(data_source=rows, sampler=grain.IndexSampler(10, grain.NoSharding(), True, 1, 5),
                              operations=[grain.Batch(4)], worker_count=0)
    return {"model": {"w": jnp.ones((2,))}, "input": {"train": iter(ds), "eval": iter(loader)}}


dump = lambda b: {k: v.tolist() for k, v in b.items()}
state = make_state()
seen = [dump(next(state["input"]["train"])) for _ in range(3)] + [dump(next(state["input"]["eval"]))]
index, grain_ckpt_map = get_spec(7, state)
maybe_save_grain_savables(grain_ckpt_map, dir=os.path.join(ckpt_dir, "grain_0"))
expected = {"train": [dump(b) for b in state["input"]["train"]], "eval": [dump(b) for b in state["input"]["eval"]]}
fresh = make_state()
_, fresh_map = get_spec(7, fresh)
results = {
    "seen": seen,
    "kinds": [[path, isinstance(v, grain.DatasetIterator), isinstance(v, grain.PyGrainDatasetIterator)]
              for path, v in grain_ckpt_map.items()],
    "index": [[p, v if isinstance(v, dict) else type(v).__name__] for p, v in index],
    "files": sorted(os.listdir(os.path.join(ckpt_dir, "grain_0", "input"))),
}
try:
    maybe_restore_grain_savables({"input/train": fresh_map["input/train"]}, dir=os.path.join(ckpt_dir, "grain_0"))
    results["train restored"] = [dump(b) for b in fresh["input"]["train"]] == expected["train"]
    maybe_restore_grain_savables({"input/eval": fresh_map["input/eval"]}, dir=os.path.join(ckpt_dir, "grain_0"))
    results["eval restored"] = [dump(b) for b in fresh["input"]["eval"]] == expected["eval"]
except TypeError:  # A JSON string where a state is expected.
    results["eval restored"] = "TypeError"
with open(os.path.join(ckpt_dir, "grain_0", "input", "eval")) as f:  # The state, through one more json.loads.
    it = make_state()["input"]["eval"]
    it.set_state(json.load(f).encode())
    results["eval by hand"] = [dump(b) for b in it] == expected["eval"]
"""


def test_axlearn_grain_savables_in_a_state_pytree_as_on_grain(tmp_path):
  (tmp_path / "grain").mkdir()
  (tmp_path / "loader").mkdir()
  g = porting.run(AXLEARN_SAVABLES, "grain", ckpt_dir=str(tmp_path / "grain")).results
  l = porting.run(AXLEARN_SAVABLES, "loader", ckpt_dir=str(tmp_path / "loader")).results
  assert porting.plain(l) == porting.plain(g)
  assert g["kinds"] == [["input/eval", False, True], ["input/train", True, False]]
  assert g["train restored"] is True and g["eval by hand"] is True
  assert g["eval restored"] == "TypeError" and g["files"] == ["eval", "train"]


# A GraphCast-on-ARCO-ERA5 training script's `get_dataset_iterator`: a source
# of (inputs, targets, forcings) xarray Datasets, `repeat(num_epochs=None)`
# then `shuffle(seed=...)` then the process's strided `slice`, `batch` with a
# `batch_fn` concatenating each member along a new "batch" dimension
# (`drop_remainder=True`), `to_iter_dataset(read_options=ReadOptions(...))`;
# `get_first_sample_and_reset` (get_state, next, set_state) before training;
# and its `pick_performance_config` branch, which maps `jax.tree_util.
# tree_flatten` over the elements and passes the config's `samples_to_check`
# (None when the config leaves it out). A small stand-in for `xr.Dataset` /
# `xr.concat` (objects that are not pytrees, as xarray's are not).
GRAPHCAST_ARCO = """
import sys

import grain.python as grain
import jax
import numpy as np
from grain.experimental import pick_performance_config


class Frame:  # A stand-in for xr.Dataset: named variables, not a pytree.
    def __init__(self, variables, dims=("time",)):
        self.variables, self.dims = variables, dims

    def summary(self):
        return {"dims": list(self.dims), **{k: np.round(v, 4).tolist() for k, v in sorted(self.variables.items())}}


def concat(datasets, dim):
    return Frame({k: np.stack([d.variables[k] for d in datasets]) for k in datasets[0].variables},
                 (dim,) + datasets[0].dims)


class ARCODataSource:
    def __init__(self, n, target_lead_times):
        self.n, self.lead = n, target_lead_times

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t = np.arange(2, dtype=np.float32) + i
        return (Frame({"2t": 280 + t, "msl": 1e3 + t / 10}), Frame({"2t": 280 + t + self.lead}),
                Frame({"toa": np.cos(t)}))


def get_dataset_iterator(datasource, configs, process_index, process_count):
    dataset = (grain.MapDataset.source(datasource)
               .repeat(num_epochs=None)
               .shuffle(seed=configs["seed"])
               .slice(slice(process_index, None, process_count)))
    local_batch_size = configs.get("local_batch_size", 1)
    if local_batch_size > 1:
        def batch_fn(samples):
            return tuple(map(lambda datasets: concat(datasets, dim="batch"), zip(*samples)))
        dataset = dataset.batch(batch_size=local_batch_size, drop_remainder=True, batch_fn=batch_fn)
    if pick_config := configs.get("dataset.pick_performance_config", None):
        flatten_dataset_iterator = dataset.map(jax.tree_util.tree_flatten).to_iter_dataset()
        performance_config = pick_performance_config(ds=flatten_dataset_iterator,
                                                     ram_budget_mb=pick_config.get("ram_budget_mb", None),
                                                     max_workers=pick_config.get("max_workers", None),
                                                     max_buffer_size=pick_config.get("max_buffer_size", None),
                                                     samples_to_check=pick_config.get("samples_to_check", None))
        read_options = performance_config.read_options
    else:
        read_config = configs["dataset.read_options"]
        read_options = grain.ReadOptions(num_threads=read_config["num_threads"],
                                         prefetch_buffer_size=read_config["prefetch_buffer_size"])
    return dataset, dataset.to_iter_dataset(read_options=read_options)


def get_first_sample_and_reset(dataset_iterator):
    state = dataset_iterator.get_state()
    sample = next(dataset_iterator)
    dataset_iterator.set_state(state)
    return sample


summary = lambda batch: [frame.summary() for frame in batch]
configs = {"seed": 42, "local_batch_size": 2, "dataset.read_options": {"num_threads": 2, "prefetch_buffer_size": 4}}
source = ARCODataSource(7, target_lead_times=6)
results = {}
for process_index in (0, 1):
    dataset, iter_dataset = get_dataset_iterator(source, configs, process_index, 2)
    iterator = iter(iter_dataset)
    first = summary(get_first_sample_and_reset(iterator))
    batches = [summary(next(iterator)) for _ in range(5)]
    state = iterator.get_state()
    after = [summary(next(iterator)) for _ in range(2)]
    fresh = iter(get_dataset_iterator(source, configs, process_index, 2)[1])
    fresh.set_state(state)
    results[process_index] = {"first": first, "batches": batches, "len": len(dataset),
                              "restored": [summary(next(fresh)) for _ in range(2)] == after}
flat = next(iter(dataset.map(jax.tree_util.tree_flatten)))
results["flattened"] = [len(flat[0]), type(flat[0][0]).__name__, flat[1].num_leaves]
try:  # The config's pick_performance_config without samples_to_check.
    get_dataset_iterator(source, {**configs, "dataset.pick_performance_config": {"ram_budget_mb": 512}}, 0, 2)
except TypeError:
    results["samples_to_check=None"] = "TypeError"
"""


def test_graphcast_arco_xarray_batches_over_an_endless_shuffle_as_on_grain():
  g, l = porting.run_both(GRAPHCAST_ARCO)
  assert porting.plain(l.results) == porting.plain(g.results)
  out = g.results
  for p in (0, 1):
    assert out[p]["first"] == out[p]["batches"][0] and out[p]["restored"] is True
  assert out[0]["first"][0]["dims"] == ["batch", "time"] and out[0]["first"] != out[1]["first"]
  assert out["flattened"] == [3, "Frame", 3] and out["samples_to_check=None"] == "TypeError"
  assert [out[0]["len"], out[1]["len"]] == [2**61, 2**61 - 1]  # sys.maxsize records, halved, in pairs.


# An equinox trainer (trainer.py and dataset/__init__.py of a JAX MNIST
# template): `get_dataset_iterator` returns `iter(DataLoader(...))` with the
# dataset's transformations and a positional `BatchOperation(per_device *
# local_device_count, True)` (`from grain.python import Batch as
# BatchOperation`), sharded per process with `drop_remainder=True`;
# `get_typed_sharded_batch` makes global arrays with
# `jax.make_array_from_process_local_data` and a typed `Batch` dataclass;
# `Trainer.save` stores the iterator's state as `np.frombuffer(get_state(),
# dtype=np.uint8)` with Orbax's `ArraySave` beside the parameters (an Orbax
# `CheckpointManager` with `item_names`, `save_interval_steps`,
# `max_to_keep`), and `restore` gives `bytes(restored["dataset"])` to
# `set_state`. A run preempted after 3 steps resumes from its latest
# checkpoint in a new Trainer and iterator and gives the uninterrupted run's
# batches. Equinox / optax are replaced by a dict of parameters.
EQX_TRAINER = """
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from grain.python import Batch as BatchOperation
from grain.python import (
    DataLoader,
    IndexSampler,
    MapTransform,
    PyGrainDatasetIterator,
    ShardOptions,
)


@dataclass
class Batch:
    image: jax.Array
    label: jax.Array


class Normalize(MapTransform):
    def map(self, element):
        return {"image": element["image"].astype(np.float32) / 255.0, "label": element["label"]}


class DatasetMnist:
    def __init__(self, n):
        rng = np.random.default_rng(8)
        self.records = [{"image": rng.integers(0, 256, (2, 2), dtype=np.uint8), "label": i % 10} for i in range(n)]

    def get_data_source(self):
        return self.records

    def get_transformations(self):
        return [Normalize()]


@dataclass
class DataLoaderCfg:
    per_device_batch_size: int
    worker_count: int
    worker_buffer_size: int
    num_epochs: int | None


def get_dataset_iterator(dataset, data_loader_cfg) -> PyGrainDatasetIterator:
    data_source = dataset.get_data_source()
    operations = [
        *dataset.get_transformations(),
        BatchOperation(data_loader_cfg.per_device_batch_size * jax.local_device_count(), True),
    ]
    loader = DataLoader(
        data_source=data_source,
        worker_count=data_loader_cfg.worker_count,
        worker_buffer_size=data_loader_cfg.worker_buffer_size,
        operations=operations,
        sampler=IndexSampler(
            num_records=len(data_source),
            num_epochs=data_loader_cfg.num_epochs,
            shard_options=ShardOptions(shard_index=jax.process_index(), shard_count=jax.process_count(),
                                       drop_remainder=True),
            shuffle=False,
            seed=0,
        ),
    )
    return iter(loader)


def get_distributed_sharding(x):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def get_typed_sharded_batch(dataset) -> Batch:
    per_process_batch = next(dataset)
    global_batch = jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(get_distributed_sharding(x), x), per_process_batch)
    return Batch(**global_batch)


class Trainer:
    def __init__(self, num_steps, workspace: Path):
        self.num_steps = num_steps
        options = ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2)
        self.manager = ocp.CheckpointManager(workspace / "checkpoints", options=options,
                                             item_names=("parameters", "opt_state", "dataset"))
        self.seen = []

    def train(self, dataset):
        try:
            step, parameters, opt_state = self.restore(None, dataset)
        except FileNotFoundError:
            step, parameters, opt_state = 0, {"w": np.zeros(4, np.float32)}, {"count": np.zeros((), np.int32)}
        for step in range(step, self.num_steps):
            self.save(step, parameters, opt_state, dataset)
            batch = get_typed_sharded_batch(dataset)
            self.seen.append([step, np.asarray(batch.label).tolist(), float(np.asarray(batch.image).sum())])
            parameters = {"w": parameters["w"] + np.asarray(batch.image).reshape(-1, 4).mean(0)}
            opt_state = {"count": opt_state["count"] + 1}
        self.save(step + 1, parameters, opt_state, dataset)
        self.manager.wait_until_finished()
        return parameters

    def save(self, step, parameters, opt_state, dataset):
        if not self.manager.should_save(step):
            return
        dataset_state = np.frombuffer(dataset.get_state(), dtype=np.uint8)
        args = ocp.args.Composite(
            parameters=ocp.args.StandardSave(parameters),
            opt_state=ocp.args.StandardSave(opt_state),
            dataset=ocp.args.ArraySave(dataset_state),
        )
        self.manager.save(step, args=args)

    def restore(self, step, dataset):
        if step is None:
            step = self.manager.latest_step()
        if step is None:
            raise FileNotFoundError("no checkpoint")
        args = ocp.args.Composite(
            parameters=ocp.args.StandardRestore({"w": np.zeros(4, np.float32)}),
            opt_state=ocp.args.StandardRestore({"count": np.zeros((), np.int32)}),
            dataset=ocp.args.ArrayRestore(),
        )
        restored = self.manager.restore(step, args=args)
        dataset.set_state(bytes(restored["dataset"]))
        return step, restored["parameters"], restored["opt_state"]


dataset = DatasetMnist(23)
cfg = DataLoaderCfg(per_device_batch_size=3, worker_count=0, worker_buffer_size=1, num_epochs=1)
whole = Trainer(6, Path(directory) / "whole")
final = whole.train(get_dataset_iterator(dataset, cfg))
first = Trainer(3, Path(directory) / "preempted")
first.train(get_dataset_iterator(dataset, cfg))
shutil.copytree(Path(directory) / "preempted", Path(directory) / "preempted copy")  # For the other library.
resumed = Trainer(6, Path(directory) / "preempted")
resumed_final = resumed.train(get_dataset_iterator(dataset, cfg))
results = {
    "whole": whole.seen,
    "preempted": first.seen,
    "resumed": resumed.seen,
    "same weights": np.allclose(final["w"], resumed_final["w"]),
    "steps kept": sorted(resumed.manager.all_steps()),
}
if given_dir:  # A run preempted on the other library.
    from_given = Trainer(6, Path(given_dir))
    from_given.train(get_dataset_iterator(dataset, cfg))
    results["from given"] = from_given.seen == resumed.seen
"""


def test_equinox_trainer_saves_the_loader_state_as_a_uint8_array_with_orbax_as_on_grain(tmp_path):
  (tmp_path / "grain").mkdir()
  (tmp_path / "loader").mkdir()
  g = porting.run(EQX_TRAINER, "grain", directory=str(tmp_path / "grain"), given_dir=None).results
  given = str(tmp_path / "grain" / "preempted copy")  # Grain's checkpoints of steps 0 and 2.
  l = porting.run(EQX_TRAINER, "loader", directory=str(tmp_path / "loader"), given_dir=given).results
  assert l.pop("from given") is True  # loader resumes Grain's checkpoint (its DataLoader state as uint8).
  assert porting.plain(l) == porting.plain(g)
  assert [s[0] for s in g["resumed"]] == [2, 3, 4, 5] and g["resumed"] == g["whole"][2:]
  assert g["same weights"] is True and g["steps kept"] == [4, 6]
