"""Round 16's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

The big JAX frameworks' Grain input pipelines: apple/axlearn's
axlearn/common/input_grain.py (`rekey`, `maybe_to_iter_dataset`, the
`_ensure_iter_dataset` guard, `unbatch` as a custom `DatasetIterator`
that holds its parent's state until a batch is spent, `pad_for_evaluation`
counting an `IterDataset` when `len()` raises `TypeError`,
`sample_from_datasets` requiring `len(ds) == sys.maxsize`, `shard_dataset`,
`shard_dataset_with_proportion`, `per_feed_batch`, `Input.element_spec`,
`prefetch_dataset`, `array_record_dataset`), input_grain_text.py
(`tokenize`, `count_num_bytes`, a regex-mapping vocab) and
input_grain_lm.py (`windowed_packing`, `streaming_packing` with its
replaying `set_state`, `text_to_lm_training_input`,
`text_to_lm_eval_input`); google/tunix's translation `DataLoader`
(tunix/examples/data/translation_dataset.py: `MapTransform`s to a tuple
and to a JAX-registered dataclass, a `FilterTransform`, `Batch` with
`drop_remainder=True`) and its GRPO demo's GSM8K dataset
(examples/math_gsm8k/qwen3_grpo_demo.py: `shuffle(seed=)`, string fields,
an optional answer, `batch` then `repeat`). Each snippet is the client's
code, trimmed, with generated local data; axlearn's check for newer Grain's
`MultiprocessPrefetchIterDataset` (absent from 0.2.18) is an `IterDataset`
check here.

Where loader differs (README: "Class names after `to_iter_dataset()`" and
"Accepted where Grain 0.2.18 raises an AttributeError", asserted exactly
where they show) the test says so. Scripts with worker processes
run as `__main__` on each library in a fresh process.
"""

from __future__ import annotations

from tests import porting

# axlearn/common/input_grain.py, trimmed: the helpers the pipelines below use.
# `utils.get_recursively` / `set_recursively` are reduced to their behaviour
# on nested dicts.
AXLEARN = """
import sys
from typing import Any, Optional

import grain.python as grain
import jax
import numpy as np
from grain._src.python.dataset import dataset as dataset_base

Tensor = np.ndarray


class RaggedTensor(list):
    pass


def get_recursively(x, path, separator=None):
    keys = path.split(separator) if separator else [path]
    for k in keys:
        if not isinstance(x, dict) or k not in x:
            raise KeyError(path)
        x = x[k]
    return x


def set_recursively(x, *, value, path, separator=None):
    keys = path.split(separator) if separator else [path]
    for k in keys[:-1]:
        x = x.setdefault(k, {})
    x[keys[-1]] = value


def shapes(x):
    return jax.tree.map(lambda v: getattr(v, "shape", None), x)


def _copy_tree(x):
    return jax.tree.map(lambda v: v, x)


def _ragged_batch_size(tensor):
    if isinstance(tensor, RaggedTensor):
        return len(tensor)
    elif hasattr(tensor, "shape"):
        return tensor.shape[0]
    else:
        raise NotImplementedError(type(tensor))


def default_pad_example_fn(example):
    def empty_like(leaf):
        if isinstance(leaf, Tensor):
            return np.empty_like(leaf)
        return type(leaf)()

    return jax.tree.map(empty_like, example)


class _UnbatchDatasetIterator(grain.DatasetIterator):
    def __init__(self, parent, *, skip_empty_batch=False):
        super().__init__(parent)
        self._index = 0
        self._current_batch = None
        self._parent_state = self._parent.get_state()
        self._skip_empty_batch = skip_empty_batch

    def __next__(self):
        example = None
        while example is None:
            if self._current_batch is None:
                example = next(self._parent)
                leaves, structure = jax.tree.flatten(example)
                if not leaves:
                    example = None
                    continue
                if not all(_ragged_batch_size(leaves[0]) == _ragged_batch_size(x) for x in leaves[1:]):
                    raise ValueError(f"Expected all leaves to have same batch dim: {shapes(example)}")
                self._current_batch = (leaves, structure)
            leaves, structure = self._current_batch
            batch_size = _ragged_batch_size(leaves[0])
            if batch_size == 0 and self._skip_empty_batch:
                example = None
            else:
                assert 0 <= self._index < batch_size, (self._index, batch_size)
                example = jax.tree.unflatten(structure, (x[self._index] for x in leaves))
            self._index += 1
            if self._index >= batch_size:
                self._index = 0
                self._current_batch = None
                self._parent_state = self._parent.get_state()
        return example

    def get_state(self):
        return {"parent": self._parent_state, "index": self._index}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
        self._parent_state = state["parent"]
        self._index = state["index"]
        self._current_batch = None


class _UnbatchIterDataset(grain.IterDataset):
    def __init__(self, parents, *, skip_empty_batch=False):
        super().__init__(parents)
        self._skip_empty_batch = skip_empty_batch

    def __str__(self):
        return "UnbatchIterDataset"

    def __iter__(self):
        return _UnbatchDatasetIterator(self._parent.__iter__(), skip_empty_batch=self._skip_empty_batch)


def maybe_to_iter_dataset(ds, *, read_options=None):
    read_options = read_options or grain.ReadOptions()
    if isinstance(ds, grain.MapDataset):
        ds = ds.to_iter_dataset(read_options)
    return ds


def _ensure_iter_dataset(ds):
    if not isinstance(ds, grain.IterDataset):
        raise ValueError(
            f"Expected a {grain.IterDataset.__name__}, got {type(ds)}. "
            f"Please use {maybe_to_iter_dataset.__name__} to convert the dataset."
        )


def unbatch(ds, *, skip_empty_batch=False):
    _ensure_iter_dataset(ds)
    return _UnbatchIterDataset(ds, skip_empty_batch=skip_empty_batch)


def rekey(ds, *, key_map, default_value="", retain_original_inputs=False, separator=None):
    def has_path(x, path):
        try:
            get_recursively(x, path, separator=separator)
            return True
        except KeyError:
            return False

    def fn(example):
        if not key_map:
            return example
        output = _copy_tree(example) if retain_original_inputs else {}
        for new_key, old_key in key_map.items():
            if not old_key or not has_path(example, old_key):
                if default_value is not None:
                    set_recursively(output, value=default_value, path=new_key, separator=separator)
                continue
            set_recursively(output, value=get_recursively(example, old_key, separator=separator),
                            path=new_key, separator=separator)
        return output

    return ds.map(fn)
"""


# input_grain.unbatch over a batched MapDataset: states are the parent's
# state before the current batch plus an index into it, so a restore reads
# the batch again and skips into it; empty batches (a mask dropping every
# row) are skipped or trip the client's assert; ragged leaves raise its
# ValueError; a MapDataset is refused before any read.
AXLEARN_UNBATCH = AXLEARN + """
import re

base = grain.MapDataset.range(11).map(lambda i: {"id": np.int32(i), "pair": [np.float32(i), np.int64(-i)]})
results = {}
try:
    unbatch(base.batch(3))
except ValueError as e:
    # The class's module differs (loader.map_dataset); its name is Grain's.
    results["map refused"] = re.sub(r"<class '[\w.]+\.(\w+)'>", r"\1", str(e))
read_options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=16)
ds = unbatch(maybe_to_iter_dataset(base.batch(3), read_options=read_options))
it = iter(ds)
seen, states = [], []
for _ in range(7):
    states.append(it.get_state())
    x = next(it)
    seen.append([int(x["id"]), type(x["pair"]).__name__, str(x["pair"][0].dtype), str(x["id"].dtype), x["id"].shape])
results["seen"] = seen
results["states"] = states
results["rest"] = [int(x["id"]) for x in it]
for k in (2, 4, 6):
    it2 = iter(ds)
    it2.set_state(states[k])
    results[f"from {k}"] = [int(x["id"]) for x in it2]
every_4th = grain.MapDataset.range(8).batch(2).map(lambda b: {"id": b[b % 4 == 0]}).to_iter_dataset()
results["skip empty"] = [int(x["id"]) for x in unbatch(every_4th, skip_empty_batch=True)]
it = iter(unbatch(every_4th))
results["empty"] = [int(next(it)["id"])]
try:
    next(it)
except AssertionError as e:
    results["empty"] += ["AssertionError", str(e), it.get_state()]
ragged = grain.MapDataset.range(4).batch(2).map(lambda b: {"a": b, "b": b[:1]}).to_iter_dataset()
try:
    next(iter(unbatch(ragged)))
except ValueError as e:
    results["ragged"] = str(e)
results["str"] = str(ds)
"""


def test_axlearn_unbatch_iterator_and_its_states_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_UNBATCH)
  assert l == g
  assert g["seen"][0] == [0, "list", "float32", "int32", []] and g["rest"] == [7, 8, 9, 10]
  assert g["from 4"] == [4, 5, 6, 7, 8, 9, 10] and g["states"][4]["index"] == 1
  assert g["skip empty"] == [0, 4] and g["empty"][:3] == [0, "AssertionError", "(0, 0)"]
  assert g["ragged"].startswith("Expected all leaves to have same batch dim")


# input_grain.pad_for_evaluation (single process): `len()` of a MapDataset,
# or, where `len()` raises TypeError (an IterDataset), a count by iterating;
# an endless (repeated) dataset and an empty one are refused; the padding
# `_FixedLengthIterDataset` takes a MapDataset or an IterDataset parent and
# its iterator's state nests the parent's. As in axlearn's input_grain_test
# (fake_grain_source, RangeDataSource).
AXLEARN_PAD = AXLEARN + """
import logging


class _FixedLengthDatasetIterator(grain.DatasetIterator):
    def __init__(self, parent, *, pad_example, length):
        super().__init__(parent)
        self._pad_example = pad_example
        self._length = length
        self._i = 0

    def __len__(self):
        return self._length

    def __next__(self):
        if self._i >= self._length:
            raise StopIteration
        try:
            element = next(self._parent)
        except StopIteration:
            element = self._pad_example
        self._i += 1
        return element

    def get_state(self):
        return {"parent": self._parent.get_state(), "i": self._i}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
        self._i = state["i"]


class _FixedLengthIterDataset(grain.IterDataset):
    def __init__(self, parent, *, pad_example, length):
        super().__init__(parent)
        self._length = length
        self._pad_example = pad_example

    def __len__(self):
        return self._length

    def __iter__(self):
        return _FixedLengthDatasetIterator(self._parent.__iter__(), pad_example=self._pad_example,
                                           length=self._length)


counted = []


def pad_for_evaluation(ds, *, per_feed_batch_size, pad_example_fn=default_pad_example_fn, max_num_examples=64_000):
    try:
        num_examples = len(ds)
        counted.append(["len", type(ds).__name__, num_examples])
    except TypeError as e:
        counted.append(["count", type(ds).__name__, str(e)])
        num_examples = 0
        for _ in ds:
            num_examples += 1
            if num_examples >= max_num_examples:
                raise ValueError(f"Giving up on counting eval dataset after {max_num_examples}.")
    if num_examples >= sys.maxsize:
        raise ValueError(f"Evaluation dataset cannot have infinite cardinality: {type(ds).__name__}")
    if num_examples <= 0:
        raise ValueError(f"Evaluation dataset cannot be empty: {type(ds).__name__}")
    target_num_examples = num_examples
    if num_examples % per_feed_batch_size != 0:
        target_num_examples += per_feed_batch_size - num_examples % per_feed_batch_size
    if num_examples < target_num_examples:
        pad_example = pad_example_fn(next(iter(ds)))
        ds = _FixedLengthIterDataset(ds, pad_example=pad_example, length=target_num_examples)
    return ds


def range_dataset(*, start, stop, step=1, seed=None):
    ds = grain.MapDataset.source(grain.RangeDataSource(start=start, stop=stop, step=step))
    if seed is not None:
        ds = ds.seed(seed)
    return ds


results = {}
for to_iter in (False, True):
    ds = grain.MapDataset.source(list(range(7)))
    if to_iter:
        ds = maybe_to_iter_dataset(ds)
    padded = pad_for_evaluation(ds, per_feed_batch_size=3)
    results[f"iter={to_iter}"] = [type(padded).__name__, len(padded), list(padded),
                                  [b.tolist() for b in padded.batch(3)]]
results["exact"] = type(pad_for_evaluation(range_dataset(start=0, stop=6), per_feed_batch_size=3)).__name__
try:
    pad_for_evaluation(maybe_to_iter_dataset(grain.MapDataset.source(list(range(7)))), per_feed_batch_size=3,
                       max_num_examples=3)
except ValueError as e:
    results["max"] = str(e)
for name, bad in [("repeated", range_dataset(start=0, stop=5).repeat()), ("empty", range_dataset(start=3, stop=3))]:
    try:
        pad_for_evaluation(bad, per_feed_batch_size=3)
    except ValueError as e:
        results[name] = str(e)
rows = pad_for_evaluation(grain.MapDataset.source([{"x": np.arange(i, i + 2), "name": f"r{i}"} for i in range(7)]),
                          per_feed_batch_size=5)
it = iter(rows)
states, seen = [], []
for _ in range(len(rows)):
    states.append(it.get_state())
    x = next(it)
    seen.append([x["x"].shape, str(x["x"].dtype), x["name"]])
results["rows"] = seen
results["rows states"] = states
try:
    next(it)
except StopIteration:
    results["rows end"] = it.get_state()
again = []
for k, state in enumerate(states):
    it = iter(rows)
    it.set_state(state)
    again.append([x["name"] for x in it])
results["rows restored"] = again
results["batched rows"] = [[b["x"].shape, b["name"].tolist()] for b in rows.batch(5)]
results["counted"] = counted
"""


def test_axlearn_pad_for_evaluation_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_PAD)
  # README, "Class names after `to_iter_dataset()`": `to_iter_dataset()` gives loader's
  # MapBackedIterDataset where Grain's is a PrefetchIterDataset (loader's
  # `grain._src...prefetch.PrefetchIterDataset` is that class, so
  # `isinstance` checks agree); only the name, and so len()'s TypeError
  # message, differ.
  assert g["counted"][1] == ["count", "PrefetchIterDataset", "object of type 'PrefetchIterDataset' has no len()"]
  assert l["counted"][1] == ["count", "MapBackedIterDataset", "object of type 'MapBackedIterDataset' has no len()"]
  l["counted"] = [porting.json.loads(porting.json.dumps(c).replace("MapBackedIterDataset", "PrefetchIterDataset"))
                  for c in l["counted"]]
  assert l == g
  assert g["iter=False"] == ["_FixedLengthIterDataset", 9, [0, 1, 2, 3, 4, 5, 6, 0, 0],
                             [[0, 1, 2], [3, 4, 5], [6, 0, 0]]]
  assert g["iter=True"] == g["iter=False"] and g["exact"] == "SourceMapDataset"
  assert g["max"] == "Giving up on counting eval dataset after 3."
  assert g["repeated"] == "Evaluation dataset cannot have infinite cardinality: RepeatMapDataset"
  assert g["empty"] == "Evaluation dataset cannot be empty: SourceMapDataset"
  assert g["rows"][-1] == [[2], "int64", ""] and g["rows restored"][7] == ["", "", ""]


# axlearn/common/input_grain_text.py (`with_regex_mapping`, `tokenize`,
# `num_bytes`, `count_num_bytes`) and input_grain_lm.py's packing, trimmed;
# a byte-level vocab stands in for SentencePiece.
AXLEARN_LM = AXLEARN + """
import functools
import re
from collections.abc import Sequence


class ByteVocab:
    pad_id = 0
    eos_id = 1
    bos_id = 2

    def encode(self, s):
        return [b + 3 for b in s.encode("utf-8")]

    def _decode(self, ids):
        return bytes(int(i) - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


def with_regex_mapping(vocab_cls, *, encode_mapping, decode_mapping):
    enc_mapping = {re.compile(k): v for k, v in encode_mapping}
    dec_mapping = {re.compile(k): v for k, v in decode_mapping}

    class VocabWithRegexMapping(vocab_cls):
        def encode(self, s):
            for k, v in enc_mapping.items():
                s = re.sub(k, v, s)
            return super().encode(s)

        def _decode(self, ids):
            s = super()._decode(ids)
            for k, v in dec_mapping.items():
                s = re.sub(k, v, s)
            return s

    return VocabWithRegexMapping


def tokenize(ds, *, vocab, with_eos=False, with_bos=False):
    def encode(vocab, s):
        ids_list = list(vocab.encode(s))
        if with_bos:
            ids_list.insert(0, vocab.bos_id)
        if with_eos:
            ids_list.append(vocab.eos_id)
        return np.asarray(ids_list, dtype=int)

    def fn(example):
        output_example = {**example}
        if isinstance(vocab, dict):
            for k, v in vocab.items():
                output_example[k] = encode(v, example[k])
        else:
            for k, v in example.items():
                output_example[k] = encode(vocab, v)
        return output_example

    return ds.map(fn)


def num_bytes(ids, *, vocab, eos_id):
    ndim, dtype = ids.ndim, ids.dtype
    eos_counts = np.sum(ids == eos_id, axis=-1, keepdims=ndim == 1)
    if ndim == 1:
        ids = (ids,)
    texts = (vocab._decode(x) for x in ids)
    counts = np.asarray([len(text.encode("utf-8")) + eos_count for text, eos_count in zip(texts, eos_counts)],
                        dtype=dtype)
    return counts[0] if ndim == 1 else counts


def count_num_bytes(ds, *, input_key, vocab, eos_id=None, output_key=None):
    output_key = output_key or f"{input_key}_num_bytes"
    eos_id = vocab.eos_id if eos_id is None else eos_id

    def fn(example):
        return {output_key: num_bytes(example[input_key], vocab=vocab, eos_id=eos_id), **example}

    return ds.map(fn)


def windowed_packing(ds, *, max_len=None, inner=None, window_size=None, input_key="target_labels",
                     read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=16)):
    ds = ds.batch(window_size, drop_remainder=False, batch_fn=list)
    if inner is not None:
        ds = ds.map(inner)
    ds = maybe_to_iter_dataset(ds, read_options=read_options)
    return unbatch(ds)


def _make_autoregressive_inputs(ds, *, max_len, packing_fn, input_key="target_labels", split_fn=None,
                                read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=16),
                                window_size=1):
    if split_fn is None:
        split_fn = lambda ids, **_: ids[None]

    def process_example_fn(example):
        if not isinstance(example, Sequence):
            example = [example]
        flat_target_labels = np.concatenate([x[input_key] for x in example], axis=-1)
        flat_input_ids = np.roll(flat_target_labels, 1, axis=0)
        return dict(input_ids=split_fn(flat_input_ids, max_len=max_len),
                    target_labels=split_fn(flat_target_labels, max_len=max_len))

    return functools.partial(packing_fn, max_len=max_len, inner=process_example_fn, window_size=window_size,
                             read_options=read_options)(ds)


def _trim_or_pad_and_batch(ids, *, max_len, max_padding_fraction=1, pad_id=-1):
    if ids.ndim > 1:
        raise ValueError(f"Expected rank 1 inputs, got: {ids.shape=}")
    remainder = ids.shape[0] % max_len
    if remainder > int(max_len * (1 - max_padding_fraction)):
        ids = np.pad(ids, pad_width=((0, max_len - remainder)), constant_values=pad_id)
    elif remainder > 0:
        ids = ids[:-remainder]
    return np.reshape(ids, (-1, max_len))


def text_to_lm_training_input(ds, *, vocab, max_len, window_size=128, max_padding_fraction=1,
                              read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=16),
                              packing_fn=windowed_packing):
    split_fn = functools.partial(_trim_or_pad_and_batch, max_padding_fraction=max_padding_fraction,
                                 pad_id=vocab.pad_id)
    if isinstance(ds, grain.IterDataset):  # axlearn: MultiprocessPrefetchIterDataset (newer Grain)
        pass
    elif len(ds) != sys.maxsize:
        ds = ds.repeat(num_epochs=None)
    ds = tokenize(ds, vocab={"text": vocab}, with_eos=True)
    ds = rekey(ds, key_map={"target_labels": "text"})
    ds = _make_autoregressive_inputs(ds, max_len=max_len, window_size=window_size, split_fn=split_fn,
                                     read_options=read_options, packing_fn=packing_fn)
    return count_num_bytes(ds, input_key="target_labels", vocab=vocab, output_key="target_num_bytes")


def describe(x):
    return {k: [v.tolist(), str(v.dtype), list(v.shape)] for k, v in sorted(x.items())}


texts = ["hello world", "a", "", "the quick brown fox\\njumps", "é!", "grain and loader", "xy\\nz"]
"""

# input_grain_text: a vocab class made by `with_regex_mapping`, `tokenize`
# of one field (BOS and EOS) or of every field, `rekey` with paths, defaults
# and kept inputs, `count_num_bytes` on 1-D and 2-D ids; on a MapDataset and
# through `maybe_to_iter_dataset`.
AXLEARN_TEXT = AXLEARN_LM + """
NewlineVocab = with_regex_mapping(ByteVocab, encode_mapping=[("\\n", "<n>")], decode_mapping=[("<n>", "\\n")])
vocab = NewlineVocab()
ds = grain.MapDataset.source([{"text": t, "meta": {"id": str(i)}} for i, t in enumerate(texts)])
results = {"encoded": vocab.encode("a\\nb"), "decoded": vocab._decode(vocab.encode("a\\nb"))}
one = tokenize(ds, vocab={"text": vocab}, with_eos=True, with_bos=True)
one = rekey(one, key_map={"target_labels": "text", "doc/id": "meta/id", "missing": "nope", "empty": ""},
            separator="/", default_value=None)
one = count_num_bytes(one, input_key="target_labels", vocab=vocab)
results["map"] = [describe({k: v for k, v in x.items() if k != "doc"}) | {"doc": x["doc"]} for x in one]
kept = rekey(ds, key_map={"inputs": "text", "other": "absent"}, retain_original_inputs=True)
results["kept"] = [sorted(x.items()) for x in maybe_to_iter_dataset(kept)][:2]
every = tokenize(grain.MapDataset.source([{"a": "xy", "b": "\\n"}]), vocab=vocab)
two_d = every.map(lambda x: {"ids": np.stack([x["a"][:2], np.array([vocab.eos_id, 9])])})
results["2d"] = describe(count_num_bytes(two_d, input_key="ids", vocab=vocab, eos_id=1)[0])
results["every"] = describe(every[0])
results["no key map"] = list(rekey(ds, key_map={})[:1])
"""


def test_axlearn_text_tokenize_rekey_count_bytes_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_TEXT)
  assert l == g
  assert g["decoded"] == "a\nb" and len(g["encoded"]) == 5
  assert g["map"][0]["target_labels_num_bytes"] == [12, "int64", []] and g["map"][0]["doc"] == {"id": "0"}
  assert "missing" not in g["map"][0] and g["2d"]["ids_num_bytes"] == [[2, 2], "int64", [2]]


# input_grain_lm.text_to_lm_training_input with `windowed_packing`: a finite
# source repeated (`len(ds) != sys.maxsize`), tokenized, rekeyed, windows of
# documents batched with `batch_fn=list`, rolled and split into rows of
# `max_len` (padding or trimming the remainder), unbatched and byte-counted;
# states taken along the stream restore on a fresh pipeline.
AXLEARN_WINDOWED = AXLEARN_LM + """
vocab = ByteVocab()
results = {}
for name, kwargs in [("pad", dict(max_padding_fraction=1)), ("trim", dict(max_padding_fraction=0.5))]:
    def build():
        return text_to_lm_training_input(grain.MapDataset.source([{"text": t} for t in texts]), vocab=vocab,
                                         max_len=8, window_size=3, **kwargs)
    ds = build()
    it = iter(ds)
    states, rows = [], []
    for _ in range(14):
        states.append(it.get_state())
        rows.append(describe(next(it)))
    restored = []
    for k in (0, 3, 9, 13):
        it2 = iter(build())
        it2.set_state(states[k])
        restored.append([describe(next(it2)) for _ in range(3)] == rows[k:k + 3] if k < 11 else
                        describe(next(it2)) == rows[k])
    results[name] = {"rows": rows, "states": states, "restored": restored}
results["already endless"] = describe(next(iter(text_to_lm_training_input(
    grain.MapDataset.source([{"text": "abc"}]).repeat(), vocab=vocab, max_len=4, window_size=2))))
try:
    _trim_or_pad_and_batch(np.zeros((2, 2)), max_len=4)
except ValueError as e:
    results["rank"] = str(e)
"""


def test_axlearn_windowed_packing_training_input_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_WINDOWED)
  assert l == g
  assert g["pad"]["restored"] == [True] * 4 and g["trim"]["restored"] == [True] * 4
  assert g["pad"]["rows"][0]["input_ids"][1:] == ["int64", [8]]
  assert g["pad"]["states"][1] == {"parent": {"next_index": 0}, "index": 1}
  assert g["rank"] == "Expected rank 1 inputs, got: ids.shape=(2, 2)"


# input_grain_lm.streaming_packing: a custom IterDataset packing documents
# into rows of `max_len` (optionally capped at `window_size` documents),
# whose `set_state` replays the parent from the state before the current
# row's first document, compares parent states with `!=` until it reaches
# the saved one and trims the rolled-over document; an iterator-level `map`
# returning None for dropped rows, then `filter(lambda x: x is not None)`.
AXLEARN_STREAMING = AXLEARN_LM + '''

class _StreamingPackingDatasetIterator(grain.DatasetIterator):
    def __init__(self, parent, *, max_len, window_size=None, input_key="target_labels"):
        super().__init__(parent)
        self._max_len = max_len
        self._window_size = window_size
        self._input_key = input_key
        self._index = 0
        self._current_token_count = 0
        self._current_examples_list = []
        self._parent_sequence_start_state = None
        self._parent_sequence_end_state = None

    def _reach_window_limit(self):
        return self._window_size is not None and self._index % self._window_size == 0

    def _pop_element(self):
        if not self._current_examples_list:
            return None
        concat_target_labels = np.concatenate([x[self._input_key] for x in self._current_examples_list], axis=-1)
        total_tokens_to_pop = min(len(concat_target_labels), self._max_len)
        self._current_token_count -= total_tokens_to_pop
        assert self._current_token_count >= 0
        if self._current_token_count > 0:
            self._current_examples_list = [{self._input_key: concat_target_labels[self._max_len:]}]
            self._parent_sequence_start_state = self._parent_sequence_end_state
        else:
            self._current_examples_list = []
            self._parent_sequence_start_state = None
        if total_tokens_to_pop == 0:
            return None
        return {self._input_key: concat_target_labels[: self._max_len]}

    def __next__(self):
        while True:
            if self._current_token_count > 0 and self._reach_window_limit():
                return self._pop_element()
            while self._current_token_count < self._max_len:
                self._parent_sequence_end_state = self._parent.get_state()
                if not self._parent_sequence_start_state:
                    self._parent_sequence_start_state = self._parent_sequence_end_state
                try:
                    example = next(self._parent)
                except StopIteration as e:
                    next_element = self._pop_element()
                    if next_element is not None:
                        return next_element
                    else:
                        raise e
                self._current_examples_list.append(example)
                self._current_token_count += len(example[self._input_key])
                self._index += 1
                if self._reach_window_limit():
                    break
            if self._current_token_count >= self._max_len:
                return self._pop_element()
            next_element = self._pop_element()
            assert self._current_token_count == 0 and not self._current_examples_list
            if next_element is not None:
                return next_element

    def get_state(self):
        return {"parent_sequence_start_state": self._parent_sequence_start_state, "parent": self._parent.get_state(),
                "index": self._index, "current_token_count": self._current_token_count}

    def set_state(self, state):
        self._parent.set_state(state["parent_sequence_start_state"] or state["parent"])
        self._index = state["index"]
        self._current_token_count = state["current_token_count"]
        self._current_examples_list = []
        self._parent_sequence_start_state = None
        self._parent_sequence_end_state = None
        total_tokens_retrieved = 0
        assert self._current_token_count == 0 if self._parent.get_state() == state["parent"] else True
        while self._parent.get_state() != state["parent"]:
            self._parent_sequence_end_state = self._parent.get_state()
            if not self._parent_sequence_start_state:
                self._parent_sequence_start_state = self._parent_sequence_end_state
            example = next(self._parent)
            total_tokens_retrieved += len(example[self._input_key])
            self._current_examples_list.append(example)
        if total_tokens_retrieved > self._current_token_count:
            self._current_examples_list[0] = {self._input_key: self._current_examples_list[0][self._input_key][
                total_tokens_retrieved - self._current_token_count:]}
        elif total_tokens_retrieved < self._current_token_count:
            raise ValueError("Grain receives invalid states.")


class _StreamingPackingIterDataset(grain.IterDataset):
    def __init__(self, parents, *, max_len, window_size=None, input_key="target_labels"):
        super().__init__(parents)
        self._max_len = max_len
        self._window_size = window_size
        self._input_key = input_key

    def __str__(self):
        return "StreamingPackingIterDataset"

    def __iter__(self):
        return _StreamingPackingDatasetIterator(self._parent.__iter__(), max_len=self._max_len,
                                                window_size=self._window_size, input_key=self._input_key)


def streaming_packing(ds, *, max_len, inner, window_size=None, input_key="target_labels",
                      read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=16)):
    def _maybe_call(example, *, fn):
        if example is not None:
            processed_example = fn(example)
            if processed_example[input_key].size == 0:
                return None
            for v in processed_example.values():
                assert v.shape[0] == 1
            return {k: v[0, :] for k, v in processed_example.items()}
        return example

    ds = maybe_to_iter_dataset(ds, read_options=read_options)
    ds = _StreamingPackingIterDataset(ds, max_len=max_len, window_size=window_size, input_key=input_key)
    ds = ds.map(functools.partial(_maybe_call, fn=inner))
    ds = ds.filter(lambda x: x is not None)
    return ds


vocab = ByteVocab()
results = {}
for window_size in (None, 2):
    def build(num_epochs=1):
        ds = grain.MapDataset.source([{"text": t} for t in texts]).repeat(num_epochs)
        ds = tokenize(ds, vocab={"text": vocab}, with_eos=True)
        ds = rekey(ds, key_map={"target_labels": "text"})
        # split_fn trims: a short last row becomes empty and is dropped (None, then the filter).
        split = functools.partial(_trim_or_pad_and_batch, max_padding_fraction=0)
        return _make_autoregressive_inputs(ds, max_len=6, packing_fn=streaming_packing, split_fn=split,
                                           window_size=window_size)
    it = iter(build())
    states, rows = [], []
    while True:
        states.append(it.get_state())
        try:
            rows.append(describe(next(it)))
        except StopIteration:
            break
    restored = []
    for k in range(len(rows)):
        it2 = iter(build())
        it2.set_state(states[k])
        restored.append([describe(x) for x in it2] == rows[k:])
    results[f"window {window_size}"] = {"rows": rows, "states": states, "restored": restored,
                                        "two epochs": sum(1 for _ in build(2))}
'''


def test_axlearn_streaming_packing_and_its_replaying_set_state_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_STREAMING)
  assert l == g
  for window in ("window None", "window 2"):
    assert all(g[window]["restored"]) and len(g[window]["rows"]) > 3
  assert g["window None"]["rows"][0]["target_labels"][1:] == ["int64", [6]]


# input_grain_lm.text_to_lm_eval_input: windows of one document, strided
# slices stacked per document (the label's overlap masked with pad ids),
# rows with no target bytes dropped by a boolean mask, `maybe_to_iter_dataset`
# with default ReadOptions, then `unbatch`; and the stride check.
AXLEARN_EVAL = AXLEARN_LM + """
def text_to_lm_eval_input(ds, *, vocab, max_len, stride=None, packing_fn=windowed_packing):
    stride = max_len if stride is None else stride
    if not 0 < stride <= max_len:
        raise ValueError(f"Expected {stride=} to be in (0,{max_len}].")
    mask = np.broadcast_to(vocab.pad_id, [max_len - stride])

    def strided_slice(example):
        output = {}
        for key, ids in example.items():
            assert ids.ndim == 1, ids
            remainder = ids.shape[0] % max_len
            ids = np.pad(ids, pad_width=((0, max_len - remainder)), constant_values=vocab.pad_id)
            slices = [ids[:max_len]]
            for i in range(stride, ids.shape[0] - max_len + 1, stride):
                slice_ids = ids[i : i + max_len]
                if key == "target_labels":
                    slice_ids = np.concatenate([mask, slice_ids[mask.shape[-1]:]], axis=-1)
                slices.append(slice_ids)
            output[key] = np.stack(slices)
        return output

    def _drop_empty_targets(example):
        keep = example["target_num_bytes"] > 0
        return {k: v[keep] for k, v in example.items()}

    ds = tokenize(ds, vocab={"text": vocab}, with_eos=True)
    ds = rekey(ds, key_map={"target_labels": "text"})
    ds = _make_autoregressive_inputs(ds, packing_fn=packing_fn, max_len=max_len, split_fn=None)
    ds = ds.map(strided_slice)
    ds = count_num_bytes(ds, input_key="target_labels", vocab=vocab, output_key="target_num_bytes")
    ds = ds.map(_drop_empty_targets)
    ds = maybe_to_iter_dataset(ds)
    return unbatch(ds)


vocab = ByteVocab()
results = {}
source = grain.MapDataset.source([{"text": t} for t in texts])
for stride in (None, 3):
    ds = text_to_lm_eval_input(source, vocab=vocab, max_len=5, stride=stride)
    it = iter(ds)
    rows, states = [], []
    for x in it:
        rows.append(describe(x))
        states.append(it.get_state())
    restored = []
    for k in (0, len(rows) // 2, len(rows) - 2):
        it2 = iter(ds)
        it2.set_state(states[k])
        restored.append([describe(x) for x in it2] == rows[k + 1:])
    results[f"stride {stride}"] = {"rows": rows, "states": states, "restored": restored}
for bad in (0, 6):
    try:
        text_to_lm_eval_input(source, vocab=vocab, max_len=5, stride=bad)
    except ValueError as e:
        results[f"stride {bad}"] = str(e)
"""


def test_axlearn_eval_input_strided_slices_unbatched_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_EVAL)
  assert l == g
  assert g["stride 3"]["restored"] == [True] * 3 and g["stride None"]["restored"] == [True] * 3
  assert len(g["stride 3"]["rows"]) > len(g["stride None"]["rows"])
  assert g["stride 0"] == "Expected stride=0 to be in (0,5]."


# input_grain: `sample_from_datasets` (each MapDataset must be repeated:
# `len(ds) == sys.maxsize`; MapDataset.mix, or IterDataset.mix when one is
# an IterDataset), `shard_dataset` (a strided slice per feed),
# `shard_dataset_with_proportion` (a MapDataset subclass with
# `_MUTATES_ELEMENT_SPEC` and `self._stats.record_self_time()`),
# `per_feed_batch` and `Input.element_spec` (ShapeDtypeStructs of the
# first element).
AXLEARN_MIX = AXLEARN + """
import dataclasses
import logging


@dataclasses.dataclass
class DispatchConfig:
    shard_index: list
    num_shards: list


def sample_from_datasets(*, sources, weights):
    for source in sources:
        if isinstance(source, grain.MapDataset) and len(source) != sys.maxsize:
            raise ValueError(
                f"sample_from_datasets requires each dataset to be repeated, {type(source).__name__} is not.")
        if isinstance(source, grain.IterDataset):
            logging.info("Sampling from grain.IterDataset, please make sure your dataset is repeated.")
    if any(isinstance(ds, grain.IterDataset) for ds in sources):
        return grain.IterDataset.mix(datasets=sources, weights=weights)
    return grain.MapDataset.mix(datasets=sources, weights=weights)


class _ProportionalSliceMapDataset(dataset_base.MapDataset):
    _MUTATES_ELEMENT_SPEC = False

    def __init__(self, parent, *, range_start, range_end, period):
        super().__init__(parent)
        if not range_start < range_end <= period:
            raise ValueError(f"{range_start=}, {range_end=}, {period=} is not valid args.")
        self._range_start = range_start
        self._range_end = range_end
        self._period = period
        self._stop = len(parent)
        self._length = ((self._stop // self._period) * (range_end - range_start)
                        + min(self._stop % self._period, range_end) - min(self._stop % self._period, range_start))

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        with self._stats.record_self_time():
            index = index % len(self)
            parent_index = (self._range_start + index // (self._range_end - self._range_start) * self._period
                            + index % (self._range_end - self._range_start))
        return self._parent[parent_index]

    def __str__(self):
        return f"_ProportionalSliceMapDataset[{self._range_start}:{self._range_end}:{self._period}]"


def shard_dataset(ds, dispatch_config):
    if not len(dispatch_config.shard_index) == len(dispatch_config.num_shards) == 1:
        raise NotImplementedError(dispatch_config)
    return ds.slice(slice(dispatch_config.shard_index[0], None, dispatch_config.num_shards[0]))


def per_feed_batch(ds, *, global_batch_size, dispatch_config, **kwargs):
    num_shards = dispatch_config.num_shards[0]
    if global_batch_size % num_shards != 0:
        raise ValueError(f"{global_batch_size=} should be divisible by {num_shards=}")
    return ds.batch(global_batch_size // num_shards, **kwargs)


def element_spec(ds):
    example = ds[0] if isinstance(ds, grain.MapDataset) else next(ds.__iter__())
    return jax.tree.map(lambda x: [list(x.shape), str(x.dtype)],
                        jax.tree.map(lambda x: jax.ShapeDtypeStruct(shape=x.shape, dtype=x.dtype), example))


def range_dataset(*, start, stop, seed=None):
    ds = grain.MapDataset.source(grain.RangeDataSource(start=start, stop=stop, step=1))
    return ds if seed is None else ds.seed(seed)


results = {}
a = range_dataset(start=0, stop=5).map(lambda x: {"x": np.int32(x), "src": np.int8(0)})
b = range_dataset(start=100, stop=103).map(lambda x: {"x": np.int32(x), "src": np.int8(1)})
try:
    sample_from_datasets(sources=[a, b.repeat()], weights=[1, 1])
except ValueError as e:
    results["not repeated"] = str(e)
mixed = sample_from_datasets(sources=[a.repeat(), b.repeat()], weights=[2, 1])
results["mixed"] = [type(mixed).__name__, len(mixed) == sys.maxsize, [int(mixed[i]["x"]) for i in range(12)]]
mixed_iter = sample_from_datasets(sources=[a.repeat().to_iter_dataset(), b.repeat()], weights=[2, 1])
it = iter(mixed_iter)
head = [int(next(it)["x"]) for _ in range(6)]
state = it.get_state()
tail = [int(next(it)["x"]) for _ in range(6)]
it.set_state(state)
results["mixed iter"] = [head, tail, [int(next(it)["x"]) for _ in range(6)] == tail]
for shard in (0, 1, 2):
    cfg = DispatchConfig(shard_index=[shard], num_shards=[3])
    feed = per_feed_batch(shard_dataset(mixed.slice(slice(0, 20)), cfg), global_batch_size=6, dispatch_config=cfg,
                          drop_remainder=False)
    results[f"feed {shard}"] = [len(feed), [b["x"].tolist() for b in feed], element_spec(feed),
                                element_spec(maybe_to_iter_dataset(feed))]
try:
    per_feed_batch(a, global_batch_size=5, dispatch_config=DispatchConfig([0], [3]))
except ValueError as e:
    results["indivisible"] = str(e)
try:
    shard_dataset(a, DispatchConfig([0, 1], [2, 2]))
except NotImplementedError as e:
    results["2d"] = str(e)
for start, end in ((0, 30), (30, 100)):
    part = _ProportionalSliceMapDataset(range_dataset(start=0, stop=250), range_start=start, range_end=end, period=100)
    results[str(part)] = [len(part), part[0], part[len(part) - 1], part[len(part)], list(part.batch(40)[1][:3]),
                          sum(1 for _ in part.to_iter_dataset())]
try:
    _ProportionalSliceMapDataset(a, range_start=3, range_end=3, period=4)
except ValueError as e:
    results["bad range"] = str(e)
"""


def test_axlearn_mixing_sharding_per_feed_batches_as_on_grain():
  g, l = porting.run_both_grain_keys(AXLEARN_MIX)
  assert l == g
  assert g["not repeated"] == "sample_from_datasets requires each dataset to be repeated, MapMapDataset is not."
  assert g["mixed"][:2] == ["MixedMapDataset", True] and g["mixed iter"][2] is True
  assert g["feed 0"][2] == {"src": [[2], "int8"], "x": [[2], "int32"]} and g["feed 0"][0] == 4
  assert g["_ProportionalSliceMapDataset[0:30:100]"][:3] == [90, 0, 229]


# google/tunix tunix/examples/data/translation_dataset.py: a `DataLoader`
# whose `MapTransform`s tokenize to a (source, target) tuple and build a
# frozen, JAX-registered `TrainingInput` (flax.struct in tunix; its optional
# `images` field stays None), a `FilterTransform` dropping overlong rows and
# `Batch(drop_remainder=True)`; MTNT rows (bytes) and OPUS-100 rows (a
# nested dict); a train loader with `num_epochs=None`, an eval one with 1;
# the train iterator's state restores on a new loader.
TUNIX_TRANSLATION = """
import dataclasses
import json
from typing import Any

from grain import python as grain
import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainingInput:
  input_tokens: Any
  input_mask: Any
  images: Any = None


class Tokenizer:  # Stand-in for tunix's tokenizer_adapter: one id per character.

  def tokenize(self, text, prefix="", suffix="", add_eos=True):
    ids = [ord(c) % 200 + 3 for c in prefix + text + suffix]
    return np.asarray(ids + [1] if add_eos else ids, dtype=np.int32)

  def pad_id(self):
    return 0


INPUT_TEMPLATE = {"prefix": "EN:", "suffix": "|"}


class _Tokenize(grain.MapTransform):

  def __init__(self, tokenizer, input_template):
    self._tokenizer = tokenizer
    self._input_template = input_template

  def map(self, element):
    if "src" in element.keys():
      src_tokens = self._tokenizer.tokenize(element["src"].decode(), prefix=self._input_template["prefix"],
                                            suffix=self._input_template["suffix"], add_eos=False)
      dst_tokens = self._tokenizer.tokenize(element["dst"].decode(), add_eos=True)
    else:
      src_tokens = self._tokenizer.tokenize(element["translation"]["en"], prefix=self._input_template["prefix"],
                                            suffix=self._input_template["suffix"], add_eos=False)
      dst_tokens = self._tokenizer.tokenize(element["translation"]["fr"], add_eos=True)
    return src_tokens, dst_tokens


class _BuildTrainInput(grain.MapTransform):

  def __init__(self, max_seq_len, pad_value):
    self._max_seq_len = max_seq_len
    self._pad_value = pad_value

  def map(self, tokens):
    src_tokens, dst_tokens = tokens
    tokens = np.concat([src_tokens, dst_tokens], axis=0)
    q_mask = np.zeros_like(src_tokens, dtype=np.bool)
    a_mask = np.ones_like(dst_tokens, dtype=np.bool)
    mask = np.concat([q_mask, a_mask], axis=0)
    tokens = self._pad_up_to_max_len(tokens, self._pad_value)
    mask = self._pad_up_to_max_len(mask, 0)
    return TrainingInput(input_tokens=tokens, input_mask=mask)

  def _pad_up_to_max_len(self, input_tensor, pad_value):
    seq_len = input_tensor.shape[0]
    to_pad = np.maximum(self._max_seq_len - seq_len, 0)
    return np.pad(input_tensor, [[0, to_pad]], mode="constant", constant_values=pad_value)


class _FilterOverlength(grain.FilterTransform):

  def __init__(self, max_seq_len):
    self._max_seq_len = max_seq_len

  def filter(self, element):
    return element.input_tokens.shape[0] <= self._max_seq_len


def _build_data_loader(*, data_source, batch_size, num_epochs, max_seq_len, tokenizer, input_template):
  return grain.DataLoader(
      data_source=data_source,
      sampler=grain.IndexSampler(num_records=len(data_source), num_epochs=num_epochs,
                                 shard_options=grain.NoSharding()),
      operations=[
          _Tokenize(tokenizer, input_template),
          _BuildTrainInput(max_seq_len, tokenizer.pad_id()),
          _FilterOverlength(max_seq_len),
          grain.Batch(batch_size=batch_size, drop_remainder=True),
      ],
  )


words = ["cat", "a dog", "the red house", "hi", "bonjour", "sea", "a very long sentence indeed", "ok", "tree"]
mtnt = [{"src": w.encode(), "dst": w[::-1].upper().encode()} for w in words]
opus = [{"translation": {"en": w, "fr": w.upper()}} for w in words[:7]]


def dump(b):
  return [type(b).__name__, b.input_tokens.shape, str(b.input_tokens.dtype), b.input_tokens[:, -3:].tolist(),
          str(b.input_mask.dtype), b.input_mask.sum(axis=1).tolist(), b.images]


results = {}
for name, source in (("mtnt", mtnt), ("opus", opus)):
  kwargs = dict(data_source=source, batch_size=2, max_seq_len=20, tokenizer=Tokenizer(), input_template=INPUT_TEMPLATE)
  eval_loader = _build_data_loader(num_epochs=1, **kwargs)
  results[f"{name} eval"] = [dump(b) for b in eval_loader]
  train_it = iter(_build_data_loader(num_epochs=None, **kwargs))
  head = [dump(next(train_it)) for _ in range(5)]
  state = train_it.get_state()
  tail = [dump(next(train_it)) for _ in range(3)]
  resumed = iter(_build_data_loader(num_epochs=None, **kwargs))
  resumed.set_state(state)
  results[f"{name} train"] = [head, tail, [dump(next(resumed)) for _ in range(3)] == tail,
                              {k: v for k, v in json.loads(state).items() if k != "data_source"}]
"""


def test_tunix_translation_data_loader_as_on_grain():
  g, l = porting.run_both_grain_keys(TUNIX_TRANSLATION)
  for name in ("mtnt train", "opus train"):
    l[name][3] = {k: v for k, v in l[name][3].items() if k not in porting.DATA_LOADER_EXTRA_KEYS}
  assert l == g
  assert g["mtnt eval"][0][:3] == ["TrainingInput", [2, 20], "int32"] and g["mtnt eval"][0][-1] is None
  assert len(g["mtnt eval"]) == 3 and g["opus train"][2] is True and g["mtnt train"][2] is True


# input_grain.Input over a per-process source (axlearn's InputTest): a
# seeded RangeDataSource mapped to dicts, `shard_dataset` for the simulated
# process, `shuffle().repeat(2).batch(1)`, `maybe_to_iter_dataset`, then
# `prefetch_dataset`: `IterDataset.prefetch(MultiprocessingOptions(
# num_workers=1))` (Grain's deprecated alias of `mp_prefetch`) in a worker
# process; per process count, the examples and their multiset per epoch.
AXLEARN_INPUT_WORKERS = AXLEARN + """
import dataclasses
import json
import warnings

from grain._src.python.data_loader import _determine_worker_count


@dataclasses.dataclass
class DispatchConfig:
    shard_index: list
    num_shards: list


def shard_dataset(ds, dispatch_config):
    return ds.slice(slice(dispatch_config.shard_index[0], None, dispatch_config.num_shards[0]))


def prefetch_dataset(ds, *, multiprocessing_options=None):
    if multiprocessing_options is None:
        multiprocessing_options = grain.MultiprocessingOptions()
    if multiprocessing_options.num_workers == 0:
        multiprocessing_options = _determine_worker_count(input_worker_count=None)
    _ensure_iter_dataset(ds)
    return ds.prefetch(multiprocessing_options)


def range_dataset(*, start, stop, seed=None):
    ds = grain.MapDataset.source(grain.RangeDataSource(start=start, stop=stop, step=1))
    return ds if seed is None else ds.seed(seed)


def dataset(process_index, process_count):
    ds = range_dataset(start=0, stop=10, seed=123).map(lambda x: {"x": x})
    ds = shard_dataset(ds, DispatchConfig(shard_index=[process_index], num_shards=[process_count]))
    ds = ds.shuffle().repeat(2).batch(1)
    options = grain.MultiprocessingOptions(num_workers=1)
    return prefetch_dataset(maybe_to_iter_dataset(ds), multiprocessing_options=options)


if __name__ == "__main__":
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags.
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, count in ((0, 1), (0, 4), (3, 4), (0, 30)):
            examples = [x["x"].tolist() for x in dataset(index, count)]
            results[f"{index}/{count}"] = examples
        results["warned"] = sorted({w.category.__name__ for w in caught if "mp_prefetch" in str(w.message)})
    print(json.dumps(results))
"""


def test_axlearn_input_with_prefetch_dataset_in_a_worker_as_on_grain(tmp_path):
  out = porting.json.loads(porting.assert_prints_the_same(AXLEARN_INPUT_WORKERS, tmp_path).strip().splitlines()[-1])
  assert len(out["0/1"]) == 20 and sorted(out["0/1"][:10]) == [[i] for i in range(10)]
  assert out["0/1"][:10] != out["0/1"][10:] and sorted(out["3/4"]) == [[3], [3], [7], [7]]
  assert out["0/30"] == [[0], [0]] and out["warned"] == ["DeprecationWarning"]


# axlearn's prefetch_dataset with its default options (num_workers=0):
# `_determine_worker_count(input_worker_count=None)` returns an int, which it
# passes on as the options.
PREFETCH_DEFAULT = AXLEARN_INPUT_WORKERS.split('if __name__ == "__main__":')[0] + """
ds = maybe_to_iter_dataset(range_dataset(start=0, stop=4))
try:
    results = ["built", [int(x) for x in prefetch_dataset(ds)]]
except AttributeError as e:
    results = ["AttributeError", str(e)]
"""


def test_axlearn_prefetch_dataset_with_default_options():
  g, l = porting.run_both_grain_keys(PREFETCH_DEFAULT)
  assert g == ["AttributeError", "'int' object has no attribute 'num_workers'"]
  # README, "Accepted where Grain 0.2.18 raises an AttributeError": loader's `IterDataset.prefetch` also takes an
  # int (a thread-prefetch buffer of that size, loader/iter_dataset.py, used
  # by its device_put), where Grain's passes it to `mp_prefetch` and fails.
  assert l == ["built", [0, 1, 2, 3]]


# google/tunix examples/math_gsm8k/qwen3_grpo_demo.py: `MapDataset.source`
# of TFDS-style rows (bytes fields), `shuffle(seed=)`, a map to prompt /
# question / answer strings where `extract_hash_answer` may give None, then
# `batch` and `.repeat(NUM_EPOCHS)`; the learner iterates the MapDataset and
# takes `len()`. The answer field is None in some rows: an object array
# where the batch's first row has one, and a ValueError where it
# is None in the first row only.
TUNIX_GRPO = """
import grain
import numpy as np

TEMPLATE = "Q: {} A:"


def _as_text(value):
  return value if isinstance(value, str) else value.decode("utf-8")


def extract_hash_answer(text):
  if "####" not in text:
    return None
  return text.split("####", 1)[1].strip()


def build_gsm8k_dataset(*, data, seed, batch_size, shuffle):
  dataset = grain.MapDataset.source(data)
  if shuffle:
    dataset = dataset.shuffle(seed=seed)
  dataset = dataset.map(lambda x: {
      "prompts": TEMPLATE.format(_as_text(x["question"])),
      "question": _as_text(x["question"]),
      "answer": extract_hash_answer(_as_text(x["answer"])),
  })
  return dataset.batch(batch_size)


def dump(b):
  return {k: [type(v).__name__, getattr(v, "dtype", None) and v.dtype.kind, np.asarray(v).tolist()]
          for k, v in b.items()}


rows = [{"question": f"what is {i}+{i}?".encode(), "answer": f"think... #### {2 * i}".encode()} for i in range(9)]
results = {}
train = build_gsm8k_dataset(data=rows, seed=42, batch_size=4, shuffle=True).repeat(2)
results["train"] = [len(train), [dump(b) for b in train]]
results["eval"] = [dump(b) for b in build_gsm8k_dataset(data=rows, seed=42, batch_size=4, shuffle=False)]
partial = [dict(r) for r in rows]
partial[2]["answer"] = b"no marker"
results["optional"] = dump(build_gsm8k_dataset(data=partial, seed=42, batch_size=4, shuffle=False)[0])
partial[0]["answer"] = b"no marker"
try:
  build_gsm8k_dataset(data=partial, seed=42, batch_size=4, shuffle=False)[0]
except Exception as e:
  results["first none"] = [type(e).__name__]
it = iter(train.to_iter_dataset())
next(it)
state = it.get_state()
tail = [dump(b) for b in it]
it = iter(train.to_iter_dataset())
it.set_state(state)
results["restored"] = [dump(b) for b in it] == tail
"""


def test_tunix_grpo_gsm8k_dataset_as_on_grain():
  g, l = porting.run_both_grain_keys(TUNIX_GRPO)
  assert l == g
  assert g["train"][0] == 6 and g["train"][1][0]["prompts"][:2] == ["ndarray", "U"]
  assert g["optional"]["answer"][:2] == ["ndarray", "O"] and g["optional"]["answer"][2][2] is None
  assert g["first none"] == ["ValueError"] and g["restored"] is True


# axlearn input_grain.array_record_dataset: `data_source_cls` (a subclass of
# grain.ArrayRecordDataSource decoding its records), its extra keyword
# arguments, `MapDataset.source(...).seed(seed)`; then a seeded shuffle, a
# `random_map`, a `MapDataset.batch` and the iterator's state.
AXLEARN_ARRAY_RECORD = """
import grain.python as grain
import numpy as np


class DecodingSource(grain.ArrayRecordDataSource):
    def __init__(self, paths, *, scale=1):
        super().__init__(paths)
        self._scale = scale

    def __getitem__(self, record_key):
        record = super().__getitem__(record_key)
        return {"index": np.int64(int.from_bytes(record[:8], "little") * self._scale), "size": len(record)}


def array_record_dataset(paths, *, data_source_cls=grain.ArrayRecordDataSource, seed, **data_source_cls_args):
    source = data_source_cls(paths, **data_source_cls_args)
    ds = grain.MapDataset.source(source)
    if seed is not None:
        ds = ds.seed(seed)
    return ds


results = {}
plain_ds = array_record_dataset(paths, seed=None)
results["plain"] = [len(plain_ds), type(plain_ds[0]).__name__, plain_ds[3][:8].hex()]
ds = array_record_dataset(paths, data_source_cls=DecodingSource, seed=7, scale=10)
results["len"] = len(ds)
ds = ds.shuffle().random_map(lambda x, rng: {**x, "noise": rng.integers(0, 1000)}).batch(4)
results["batches"] = [{k: v.tolist() for k, v in b.items()} for b in ds]
results["dtypes"] = {k: [str(v.dtype), list(v.shape)] for k, v in ds[0].items()}
it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)))
next(it)
state = it.get_state()
tail = [b["index"].tolist() for b in it]
it.set_state(state)
results["resumed"] = [[b["index"].tolist() for b in it] == tail, tail]
try:
    array_record_dataset(paths, seed=None)[len(ds) * 4 + 100]
    results["past end"] = "read"
except Exception as e:
    results["past end"] = type(e).__name__
"""


def test_axlearn_array_record_dataset_with_a_source_subclass_as_on_grain(tmp_path):
  from tests import loader_testing  # pylint: disable=import-outside-toplevel
  paths = loader_testing.write_array_records(tmp_path, 2, [7, 6])
  g, l = porting.run_both_grain_keys(AXLEARN_ARRAY_RECORD, paths=paths)
  assert l == g
  assert g["plain"] == [13, "bytes", (3).to_bytes(8, "little").hex()] and g["len"] == 13
  assert sorted(i for b in g["batches"] for i in b["index"]) == [10 * i for i in range(13)]
  assert g["dtypes"]["index"] == ["int64", [4]] and g["resumed"][0] is True
