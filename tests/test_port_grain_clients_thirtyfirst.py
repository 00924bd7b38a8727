"""Round 34's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

A nanochat-in-JAX project's data modules (the index names no repository; its
scripts save to `/home/ubuntu/nanochat/jaxnano/...`), two versions of one file:
- the SFT loader ("This dataloader is specifically build for mid-training/SFT
  stages"): chat rows tokenized with the completion mask folded into the sign
  of the ids (`encode_mask_into_ids`), written as Parquet shards of a
  `list<int32>` column, read back whole into a plain `ParquetTokenSource`
  (`__len__` / `__getitem__` returning `{"input_ids": row}`), then
  `grain.MapDataset.source(source).shuffle(1234).repeat()` handed straight to
  `grain.experimental.ConcatThenSplitIterDataset(parent=<a MapDataset>,
  length_struct=..., split_full_length_features=True,
  bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_features=...,
  bos_token_id=...)`, `.batch(n, drop_remainder=True)`, `decode_mask_from_ids`
  on the batches and `prepare_train_batch` / `prepare_train_accum_batch`
  (x/y shift, `input_ids_segment_ids` / `input_ids_positions` read with
  `dict.get`, a reshape for gradient accumulation), and
  `grain.experimental.device_put(ds, device=<a sharding>, cpu_buffer_size=...,
  device_buffer_size=...)`; one pass restored at every step, the endless
  training loader restored at its first steps, and Grain's state restored
  into loader;
- the mid-training loader (`make_grain_shard_loader`; its elements, its
  `multithread_prefetch`, Path and `shuffle` branches were ported in round 11,
  tests/test_port_grain_clients_eleventh.py): here its restores at every step,
  `BestFitPackIterDataset` over `InterleaveIterDataset(cycle_length=...,
  iter_buffer_size=...)` of `ParquetIterDataset`s.
tiktoken is not installed: a character-level stand-in tokenizer with the
client's special tokens replaces it; Hugging Face's `load_dataset` is replaced
by in-memory conversations.

An FSDiT project's dataset_grain.py (the index names no repository; "Grain-based
dataset loader for FSDiT"): `MsgpackEpisodeSource`, a plain class wrapping
`grain.sources.ArrayRecordDataSource(<list of shard paths>)` and
`msgpack.unpackb`-ing each record (its own FileNotFoundError for a missing
shard), `_discover_arecord_files` (sharded `{split}_shard_*.arecord` or one
`{split}.arecord`), `DecodeEpisode` (a plain callable class given to `map`:
PIL decode, resize, [-1, 1] scaling, a flip drawn from an unseeded
`np.random.RandomState()`, float16 embeddings from `np.frombuffer`, path
prefix remaps), and `build_grain_dataset`: `MapDataset.source(source)
.shuffle(seed=epoch_seed).map(...).batch(batch_size=..., drop_remainder=True)
.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))`
made anew each epoch with `base_seed + epoch` by `_InfiniteGrainIterator`.
Small PNGs in tmp_path and 4-wide embeddings (3 support tokens) stand in for
the data.

Differences the port found: none that loader must change.
- Grain bug, not copied (asserted in
  `test_jaxnano_midtrain_restores_at_every_step_exact_where_grains_states_are_altered`):
  Grain 0.2.18's `InterleaveIterDataset` iterator `set_state` adopts the given
  state's `iterators_in_use_indices` list (and `future_states` dict) as its
  own, and `BestFitPackIterDataset` states of one packing window share one
  parent-state dict; restoring one of them and reading on alters the other
  states of that window, whose restores then give other batches (deep-copied
  states restore exactly). loader's window states share their parent state
  too, but no loader iterator writes to a state it was given.
- Documented, asserted as documented: loader's `ConcatThenSplitIterDataset`
  and packing states have another layout (README, `CheckpointHandler`);
  loader restores Grain's ConcatThenSplit state to the same batches. The
  AssertionError of a non-dataset interleave input is loader's
  `NotADatasetError` (also a TypeError). Grain's ThreadPrefetchDatasetIterator
  whose `__init__` raised that assertion fails again in `__del__` (an
  "Exception ignored" warning from Grain's side only).
"""

from __future__ import annotations

import gc

import absl.flags
import numpy as np
import pytest

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's mp_prefetch reads absl flags, even with no workers.


# ---------------------------------------------------------------------------
# nanochat-in-JAX: the SFT loader (ParquetTokenSource + ConcatThenSplit)
# ---------------------------------------------------------------------------

# The client's helpers as written; `tiktoken` and `datasets.load_dataset` are
# replaced by stand-ins (marked) since neither is installed here.
JAXNANO_COMMON = r'''
import os
import json
import grain
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pathlib import Path
from functools import partial


def prepare_train_batch(batch):
    """x/y split, align segment_ids, positions, and completion_mask to y."""
    ids = batch["input_ids"]
    seg = batch.get("input_ids_segment_ids")
    pos = batch.get("input_ids_positions")
    mask = batch.get("completion_mask")

    out = {"x": ids[:, :-1], "y": ids[:, 1:]}
    if seg is not None:
        out["segment_ids"] = seg[:, :-1]
    if pos is not None:
        out["positions"] = pos[:, :-1]
    if mask is not None:
        out["completion_mask"] = mask[:, 1:]
    return out


def prepare_train_accum_batch(batch, grad_accum_steps):
    """Same as prepare_train_batch but reshapes for gradient accumulation."""
    ids = batch["input_ids"]
    bsz = ids.shape[0] // grad_accum_steps

    def reshape(arr):
        if arr is None:
            return None
        return arr.reshape(grad_accum_steps, bsz, *arr.shape[1:])

    ids = reshape(ids)
    seg = reshape(batch.get("input_ids_segment_ids"))
    pos = reshape(batch.get("input_ids_positions"))
    mask = reshape(batch.get("completion_mask"))

    out = {"x": ids[:, :, :-1], "y": ids[:, :, 1:]}
    if seg is not None:
        out["segment_ids"] = seg[:, :, :-1]
    if pos is not None:
        out["positions"] = pos[:, :, :-1]
    if mask is not None:
        out["completion_mask"] = mask[:, :, 1:]
    return out


# ---- stand-in for tiktoken's extended gpt2 Encoding: characters, and the special tokens ----
class StandInEncoding:
    def __init__(self, special_tokens):
        self._special = special_tokens
        self.eot_token = special_tokens["<|endoftext|>"]
        self.n_vocab = max(special_tokens.values()) + 1

    def encode(self, text, allowed_special="all"):
        out, i = [], 0
        while i < len(text):
            for tok, tid in self._special.items():
                if text.startswith(tok, i):
                    out.append(tid)
                    i += len(tok)
                    break
            else:
                out.append(1 + ord(text[i]) % 40)
                i += 1
        return out

    def decode(self, ids):
        inverse = {v: k for k, v in self._special.items()}
        return "".join(inverse[i] for i in ids)


def build_tokenizer():
    """Build a GPT-2 tokenizer extended with custom chat tokens."""
    user_start = "<|user_start|>"
    user_end = "<|user_end|>"
    assistant_start = "<|assistant_start|>"
    assistant_end = "<|assistant_end|>"
    system_start = "<|system_start|>"
    system_end = "<|system_end|>"
    tool_start = "<|tool_start|>"
    tool_end = "<|tool_end|>"
    pad_token = "<|pad|>"

    custom_tokens = [
        user_start, user_end,
        assistant_start, assistant_end,
        system_start, system_end,
        tool_start, tool_end,
        pad_token,
    ]

    base_n_vocab = 50  # stand-in for tiktoken.get_encoding("gpt2").n_vocab
    custom_token_ids = {tok: base_n_vocab + i for i, tok in enumerate(custom_tokens)}

    tokenizer = StandInEncoding({"<|endoftext|>": 0, **custom_token_ids})

    bos_id = tokenizer.eot_token
    bos = tokenizer.decode([bos_id])

    return {
        "tokenizer": tokenizer,
        "bos_id": bos_id,
        "bos": bos,
        "user_start": user_start,
        "user_end": user_end,
        "assistant_start": assistant_start,
        "assistant_end": assistant_end,
        "system_start": system_start,
        "system_end": system_end,
        "tool_start": tool_start,
        "tool_end": tool_end,
        "pad_token": pad_token,
        "pad_id": custom_token_ids[pad_token],
        "assistant_start_id": custom_token_ids[assistant_start],
        "assistant_end_id": custom_token_ids[assistant_end],
        "custom_token_ids": custom_token_ids,
        "vocab_size": tokenizer.n_vocab,
    }


def encode_mask_into_ids(input_ids, completion_mask):
    """Fuse a boolean completion_mask into the sign of input_ids."""
    return np.where(completion_mask, input_ids, -(input_ids + 1)).astype(np.int32)


def decode_mask_from_ids(batch):
    """Recover (unsigned ids, bool mask) from sign-encoded ids."""
    ids = batch["input_ids"]
    mask = ids >= 0
    batch["input_ids"] = np.where(mask, ids, -(ids + 1)).astype(np.int32)
    batch["completion_mask"] = mask
    return batch


ROLE_MAP = {
    "system":    ("system_start",    "system_end"),
    "user":      ("user_start",      "user_end"),
    "assistant": ("assistant_start", "assistant_end"),
    "tool":      ("tool_start",      "tool_end"),
}


def format_conversation(example, tok_info):
    """Format a single or multi-turn chat example into a string ready for tokenization."""
    messages = example.get("messages", [])
    if not messages:
        return None

    parts = [tok_info["bos"]]

    for msg in messages:
        role = msg.get("role")
        content = msg.get("content")

        if not content or role not in ROLE_MAP:
            continue

        start_key, end_key = ROLE_MAP[role]
        parts.append(f"{tok_info[start_key]}{content}{tok_info[end_key]}\n")

    roles = {m.get("role") for m in messages}

    if "user" not in roles or "assistant" not in roles:
        return None

    return {"text": "".join(parts)}


def tokenize(example, tok_info):
    """Tokenize text and bake the completion mask into the sign bit."""
    tokenizer = tok_info["tokenizer"]
    tokens = np.array(
        tokenizer.encode(example["text"],allowed_special="all"),
        dtype=np.int32,
    )

    ast_start = tok_info["assistant_start_id"]
    ast_end = tok_info["assistant_end_id"]

    mask = np.zeros(len(tokens), dtype=np.bool_)

    inside_assistant = False
    for i, tok in enumerate(tokens):
        if tok == ast_start:
            inside_assistant = True
            continue
        if tok == ast_end:
            mask[i] = True
            inside_assistant = False
            continue
        if inside_assistant:
            mask[i] = True

    return {"input_ids": encode_mask_into_ids(tokens, mask)}


# stand-in for `load_dataset(..., streaming=True)`: short chats, one without an answer.
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"}]},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "no answer here"}]},
    {"messages": [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "red"},
                  {"role": "user", "content": "another"}, {"role": "assistant", "content": "blue"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
    {"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": "1 2 3 4 5 6"}]},
]


def plain(x):
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return np.asarray(x).tolist()


def plain_eq(a, b):
    return [plain(x) for x in a] == [plain(x) for x in b]
'''

JAXNANO_SFT = JAXNANO_COMMON + r'''
# We will save the parquet files in this format
PARQUET_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())),])


def save_tokenized(examples, data_dir, tok_info, split, records_per_shard, prefix="chats"):
    """Tokenize, sign-encode, and write Parquet shards (the client's loop, its download left out)."""
    if not os.path.exists(data_dir):
        os.makedirs(data_dir)

    shard_idx = 0
    total_written = 0
    buffer = []

    def shard_path(idx):
        return os.path.join(data_dir, f"{prefix}_{split}-{idx:05d}.parquet")

    def flush_buffer():
        nonlocal shard_idx
        if not buffer:
            return
        table = pa.table({"input_ids": buffer}, schema=PARQUET_SCHEMA)
        pq.write_table(table, shard_path(shard_idx))
        buffer.clear()
        shard_idx += 1

    for example in examples:
        formatted = format_conversation(example, tok_info)
        if formatted is None:
            continue
        tokenized = tokenize(formatted, tok_info)
        buffer.append(tokenized["input_ids"].tolist())
        total_written += 1
        if len(buffer) >= records_per_shard:
            flush_buffer()
    flush_buffer()

    meta = {"split": split, "dtype": "int32", "total_records": total_written, "num_shards": shard_idx,
            "bos_token_id": tok_info["bos_id"]}
    with open(os.path.join(data_dir, f"{prefix}_{split}_meta.json"), "w") as f:
        json.dump(meta, f, indent=2)


def get_shard_paths(data_dir, split="train"):
    """Return sorted list of Parquet shard paths for the given split."""
    paths = sorted(Path(data_dir).glob(f"*{split}*.parquet"))
    return [str(p) for p in paths]

def load_meta(data_dir, split="train"):
    for fname in os.listdir(data_dir):
        if fname.endswith(f"{split}_meta.json"):
            with open(os.path.join(data_dir, fname)) as f:
                return json.load(f)
    raise FileNotFoundError(f"No {split}_meta.json found in {data_dir}")


def load_all_token_rows(shard_paths):
    """Read all Parquet shards into a list of np.int32 arrays."""
    rows = []
    for path in shard_paths:
        table = pq.read_table(path, columns=["input_ids"])
        for row in table["input_ids"]:
            rows.append(np.array(row.as_py(), dtype=np.int32))
    return rows


class ParquetTokenSource:
    """A Grain-compatible random-access source backed by Parquet shards."""

    def __init__(self, shard_paths):
        self._rows = load_all_token_rows(shard_paths)

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, idx):
        return {"input_ids": self._rows[idx]}


def make_grain_shard_loader(
    batch_size,
    sequence_length,
    grad_accum_steps,
    data_sharding,
    data_dir,
    split="train",
    repeat=True,
    cpu_buffer_size=16,
    device_buffer_size=4,
):
    shard_paths = get_shard_paths(data_dir, split)
    meta = load_meta(data_dir, split)
    source = ParquetTokenSource(shard_paths)

    ds = grain.MapDataset.source(source)
    if repeat:
        ds = ds.shuffle(1234).repeat()

    total_batch_size = grad_accum_steps * batch_size if grad_accum_steps > 1 else batch_size

    ds = grain.experimental.ConcatThenSplitIterDataset(
        parent=ds,
        length_struct={"input_ids": sequence_length},
        split_full_length_features=True,
        bos_handling=grain.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=("input_ids",),
        bos_token_id=meta["bos_token_id"],
    ).batch(total_batch_size, drop_remainder=True)

    # Recover completion_mask from sign bit
    ds = ds.map(decode_mask_from_ids)

    if grad_accum_steps > 1:
        ds = ds.map(partial(prepare_train_accum_batch, grad_accum_steps=grad_accum_steps))
    else:
        ds = ds.map(prepare_train_batch)

    if data_sharding is not None:
        ds = grain.experimental.device_put(
            ds,
            device=data_sharding,
            cpu_buffer_size=cpu_buffer_size,
            device_buffer_size=device_buffer_size,
        )

    return ds


RESTORE_AT_EVERY_STEP_HERE

def restore_prefix(make, steps, ahead):
    """An endless loader: a state before each of the first `steps` batches, restored on a fresh one."""
    it = iter(make())
    states, reference = [], []
    for _ in range(steps + ahead):
        states.append(it.get_state())
        reference.append(next(it))
    out = []
    for k in range(steps):
        fresh = iter(make())
        fresh.set_state(states[k])
        out.append(plain_eq([next(fresh) for _ in range(ahead)], reference[k:k + ahead]))
    return reference, out, states[steps]


tok_info = build_tokenizer()
save_tokenized(CONVERSATIONS * 3, DATA_DIR, tok_info, split="train", records_per_shard=4)
results = {"shards": len(get_shard_paths(DATA_DIR)), "rows": len(ParquetTokenSource(get_shard_paths(DATA_DIR)))}

# One pass (repeat=False): ends, restores at every step on a fresh and on the same iterator.
reference, restores = restore_at_every_step(
    lambda: make_grain_shard_loader(2, 12, 1, None, DATA_DIR, repeat=False))
results["one_pass"] = [plain(b) for b in reference]
results["one_pass_restores"] = restores

# The training path: shuffled, repeated, gradient accumulation over 2.
reference, restores, state = restore_prefix(
    lambda: make_grain_shard_loader(2, 10, 2, None, DATA_DIR, repeat=True), steps=5, ahead=3)
results["accum"] = [plain(b) for b in reference]
results["accum_restores"] = restores
results["accum_state"] = state


def resume_accum(state, n=3):
    """A fresh training loader restored to `state` (a state saved by either library): its next `n` batches."""
    it = iter(make_grain_shard_loader(2, 10, 2, None, DATA_DIR, repeat=True))
    it.set_state(state)
    return [plain(next(it)) for _ in range(n)]

# device_put onto the one CPU device, as the client hands it a sharding.
import jax
sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
reference, restores, _ = restore_prefix(
    lambda: make_grain_shard_loader(2, 10, 1, sharding, DATA_DIR, repeat=True, cpu_buffer_size=2,
                                    device_buffer_size=1), steps=3, ahead=2)
results["device_put"] = [plain(b) for b in reference]
results["device_put_restores"] = restores
results["device_put_types"] = sorted({type(v).__name__ == "ArrayImpl" for b in reference for v in b.values()})
'''.replace("RESTORE_AT_EVERY_STEP_HERE", porting.RESTORE_AT_EVERY_STEP)


def test_jaxnano_sft_loader_concat_then_split_on_a_map_dataset_as_on_grain(tmp_path):
  """SFT: Parquet rows in memory, MapDataset parent of ConcatThenSplit with BOS, accumulation, device_put."""
  gns, lns = (porting.run(JAXNANO_SFT, lib, DATA_DIR=str(tmp_path / lib)) for lib in porting.LIBS)
  g, l = gns.results, lns.results
  # The states' layouts differ as documented (README, `CheckpointHandler`: loader's ConcatThenSplit state
  # replays from an earlier position under another key); loader restores Grain's state to the same batches.
  g_state, l_state = g.pop("accum_state"), l.pop("accum_state")
  assert sorted(porting.grain_keys(g_state)) == ["elements_from_buffer_after_checkpoint", "parent_state",
                                                 "remainder_slices"]
  assert "skip" in l_state
  assert lns.resume_accum(g_state) == g["accum"][5:8] == lns.resume_accum(l_state)
  gc.collect()
  assert porting.grain_keys(l) == porting.grain_keys(g)
  # 18 chats, 3 without an answer: 15 rows in 4 shards of at most 4.
  assert g["shards"] == 4 and g["rows"] == 15
  assert g["one_pass_restores"] == [[True, True]] * (len(g["one_pass"]) + 1) and len(g["one_pass"]) >= 4
  first = g["one_pass"][0]
  assert sorted(first) == ["completion_mask", "positions", "segment_ids", "x", "y"]
  assert len(first["x"]) == 2 and len(first["x"][0]) == 11  # sequence 12, shifted by one
  # REPLACE_FIRST_TOKEN_WITH_BOS: each row of a batch starts with the BOS id 0.
  assert all(row[0] == 0 for b in g["one_pass"] for row in b["x"])
  assert np.asarray(g["accum"][0]["x"]).shape == (2, 2, 9)
  assert g["accum_restores"] == [True] * 5 and g["device_put_restores"] == [True] * 3
  assert g["device_put_types"] == [True]


# ---------------------------------------------------------------------------
# nanochat-in-JAX: the mid-training loader (Parquet files, interleave, best-fit packing)
# ---------------------------------------------------------------------------

JAXNANO_MIDTRAIN = JAXNANO_COMMON + r'''
def truncate_to_seqlen(sample, max_len: int):
    ids = sample["input_ids"]
    mask = sample["completion_mask"]
    # Truncate both consistently
    if ids.shape[0] > max_len:
        ids = ids[:max_len]
        mask = mask[:max_len]
    sample["input_ids"] = ids
    sample["completion_mask"] = mask
    return sample


def has_completion_tokens(example):
    """Filter out chunks where truncation left only masked (prompt) tokens."""
    return bool(example["completion_mask"].any())


def save_to_parquet(
    encoded, output_dir, task_name, split="train", rows_per_shard=64_000
):
    out = Path(output_dir) / task_name
    out.mkdir(parents=True, exist_ok=True)

    schema = pa.schema([pa.field("input_ids", pa.list_(pa.int32()))])
    shard_idx = 0
    buf = []
    num_written = 0

    def flush(arrays, idx):
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)

        for idx, array in enumerate(arrays):
            offsets[idx + 1] = offsets[idx] + len(array)

        flat = np.concatenate(arrays)
        pa_col = pa.ListArray.from_arrays(
            pa.array(offsets, type=pa.int32()), pa.array(flat, type=pa.int32())
        )

        path = out / f"{split}_{shard_idx:05d}.parquet"
        pq.write_table(
            pa.table({"input_ids": pa_col}, schema=schema), path, compression="zstd"
        )

    for arr in encoded:
        buf.append(arr)
        num_written += 1
        if len(buf) >= rows_per_shard:
            flush(buf, shard_idx)
            buf = []
            shard_idx += 1

    if buf:
        flush(buf, shard_idx)
        shard_idx += 1


def make_grain_shard_loader(
    data_dir: str,
    split: str,
    pad_id: int,
    batch_size: int,
    sequence_length: int,
    grad_accum_steps: int = 1,
    data_sharding=None,
    # Packing controls
    num_packing_bins: int = 64,
    max_sequences_per_bin: int = 16,
    # Laziness / performance controls (thread-only)
    cycle_length: int = 8,
    iter_buffer_size: int = 64,
    num_make_iter_threads: int = 2,
    make_iter_buffer_size: int = 4,
    # Multithreading
    multi_threading: bool = True,
    prefetch_threads: int = 8,
    prefetch_buffer_size: int = 256,
    # Device put buffers
    cpu_buffer_size: int = 16,
    device_buffer_size: int = 4,
    # Shuffle
    shuffle=False,
    shuffle_seed: int = 1234,
):
    packed_len = sequence_length + 1
    # sorted: the client globs in file-system order, which is the same for both libraries in one run
    shard_paths = sorted(Path(data_dir).glob(f"**/*{split}*.parquet"))
    # the port's one change: Grain 0.2.18's ParquetIterDataset takes no Path (round 11 runs it with Paths)
    shard_paths = [str(p) for p in shard_paths]
    paths_ds = grain.MapDataset.source(shard_paths)
    per_file = paths_ds.map(lambda p: grain.experimental.ParquetIterDataset(p))

    ds = grain.experimental.InterleaveIterDataset(
        per_file,
        cycle_length=min(cycle_length, len(shard_paths)),
        num_make_iter_threads=num_make_iter_threads,
        make_iter_buffer_size=make_iter_buffer_size,
        iter_buffer_size=iter_buffer_size,
    )
    if shuffle:
        ds = ds.shuffle(shuffle_seed)

    ds = ds.map(decode_mask_from_ids)
    ds = ds.map(partial(truncate_to_seqlen, max_len=packed_len))
    ds = ds.filter(has_completion_tokens)

    length_struct = {"input_ids": packed_len, "completion_mask": packed_len}
    padding_struct = {"input_ids": pad_id, "completion_mask": 0}

    ds = grain.experimental.BestFitPackIterDataset(
        parent=ds,
        length_struct=length_struct,
        num_packing_bins=num_packing_bins,
        max_sequences_per_bin=max_sequences_per_bin,
        padding_struct=padding_struct,
    )

    total_batch_size = (
        grad_accum_steps * batch_size if grad_accum_steps > 1 else batch_size
    )

    if multi_threading:
        ds = grain.experimental.multithread_prefetch(
            ds, num_threads=prefetch_threads, buffer_size=prefetch_buffer_size
        )

    ds = ds.batch(total_batch_size, drop_remainder=True)

    if grad_accum_steps > 1:
        ds = ds.map(
            partial(prepare_train_accum_batch, grad_accum_steps=grad_accum_steps)
        )
    else:
        ds = ds.map(prepare_train_batch)

    return ds


RESTORE_AT_EVERY_STEP_HERE

tok_info = build_tokenizer()
encoded = [tokenize(f, tok_info)["input_ids"] for f in map(lambda e: format_conversation(e, tok_info),
                                                            CONVERSATIONS * 4) if f is not None]
# a prompt-only row: the filter drops it (the client drops such rows before writing; kept to reach the filter)
encoded.insert(3, encode_mask_into_ids(np.array([0, 52, 7, 8, 53], np.int32), np.zeros(5, bool)))
for task, rows in (("smoltalk", encoded[:9]), ("gsm8k", encoded[9:])):
    save_to_parquet(rows, DATA_DIR, task, split="train", rows_per_shard=4)

import copy


def restore_copies_at_every_step(make):
    """restore_at_every_step, each state deep-copied before each set_state (so no restore can alter it)."""
    it = iter(make())
    states, reference = [], []
    while True:
        states.append(it.get_state())
        try:
            reference.append(next(it))
        except StopIteration:
            break
    out = []
    for k, state in enumerate(states):
        fresh = iter(make())
        fresh.set_state(copy.deepcopy(state))
        pair = [plain_eq(list(fresh), reference[k:])]
        it.set_state(copy.deepcopy(state))
        pair.append(plain_eq(list(it), reference[k:]))
        out.append(pair)
    return out


results = {"rows": len(encoded)}
common = dict(pad_id=tok_info["pad_id"], batch_size=2, sequence_length=15, num_packing_bins=3,
              max_sequences_per_bin=4, cycle_length=3, iter_buffer_size=2, multi_threading=False)
for name, kwargs in (("plain", {}), ("accum", dict(grad_accum_steps=2))):
    make = lambda: make_grain_shard_loader(DATA_DIR, "train", **common, **kwargs)
    reference, restores = restore_at_every_step(make)
    results[name] = [plain(b) for b in reference]
    results[name + "_restores"] = restores
    results[name + "_restores_of_copies"] = restore_copies_at_every_step(make)

# The evidence, one level down: the packer's states of one window hold one parent-state object, and
# a restored InterleaveIterDataset iterator keeps the state's list as its own.
it = iter(grain.experimental.BestFitPackIterDataset(
    parent=grain.MapDataset.source([{"t": np.arange(n, dtype=np.int32)} for n in (3, 2, 3, 1, 2, 3, 1, 2)]).to_iter_dataset(),
    length_struct={"t": 4}, num_packing_bins=3))
states = []
for _ in it:
    states.append(it.get_state())
parents = [s_.get("parent", s_.get("replay_from")) for s_ in states]
results["window_states_share_a_parent_state"] = any(a is b for a, b in zip(parents, parents[1:]))
per_file = grain.MapDataset.source(sorted(str(p) for p in Path(DATA_DIR).glob("**/*.parquet"))).map(
    grain.experimental.ParquetIterDataset)
it = iter(grain.experimental.InterleaveIterDataset(per_file, cycle_length=3))
next(it)
state = it.get_state()
saved = copy.deepcopy(state)
restored = iter(grain.experimental.InterleaveIterDataset(per_file, cycle_length=3))
restored.set_state(state)
for _ in restored:  # to the end: files run out and others take their places in the cycle
    pass
results["interleave_state_altered_by_the_restored_iterator"] = plain(state) != plain(saved)
'''.replace("RESTORE_AT_EVERY_STEP_HERE", porting.RESTORE_AT_EVERY_STEP)


def test_jaxnano_midtrain_restores_at_every_step_exact_where_grains_states_are_altered(tmp_path):
  """Mid-training (best-fit packing over an interleave of Parquet files): restores at every step."""
  g, l = (porting.run(JAXNANO_MIDTRAIN, lib, DATA_DIR=str(tmp_path / lib)).results for lib in porting.LIBS)
  gc.collect()
  assert g["rows"] == l["rows"] == 21
  for name, shape in (("plain", (2, 15)), ("accum", (2, 2, 15))):
    assert l[name] == g[name] and len(g[name]) >= 3 and np.asarray(g[name][0]["x"]).shape == shape
    exact = [[True, True]] * (len(g[name]) + 1)
    # Grain bug, not copied: Grain 0.2.18's InterleaveIterDataset.set_state adopts the state's
    # `iterators_in_use_indices` list (and `future_states` dict) as its own, and BestFitPackIterDataset's
    # states of one window share one parent-state dict; so restoring one state (here the first of a
    # window) and reading on alters the states saved later in that window, whose restores then give
    # other batches. Deep-copied before each set_state, Grain's states restore exactly, as loader's
    # (never written to by a restored iterator) do either way.
    assert l[name + "_restores"] == exact and l[name + "_restores_of_copies"] == exact
    assert g[name + "_restores_of_copies"] == exact and g[name + "_restores"] != exact
  # Both share the window's parent state between its states; only Grain's restored iterators write to it.
  assert g["window_states_share_a_parent_state"] is True and l["window_states_share_a_parent_state"] is True
  assert g["interleave_state_altered_by_the_restored_iterator"] is True
  assert l["interleave_state_altered_by_the_restored_iterator"] is False


# ---------------------------------------------------------------------------
# FSDiT: msgpack episodes in ArrayRecord shards, PIL decode, an endless epoch loop
# ---------------------------------------------------------------------------

FSDIT = r'''
import glob
import os

import grain
import msgpack
import numpy as np
from PIL import Image


# ─── Image decode (PIL-based, no TF dependency) ──────────────────────────────

def _decode_image(path, image_size, is_train, rng=None):
    """Read, resize, normalize image. Optionally flip for training."""
    if isinstance(path, bytes):
        path = path.decode("utf-8")
    img = Image.open(path).convert("RGB")
    img = img.resize((image_size, image_size), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.float32) / 255.0
    arr = (arr - 0.5) / 0.5  # → [-1, 1]
    if is_train and rng is not None and rng.random() < 0.5:
        arr = arr[:, ::-1, :]  # horizontal flip
    return arr


class MsgpackEpisodeSource:
    """RandomAccessDataSource that reads msgpack-serialized episodes from ArrayRecord file(s)."""

    def __init__(self, arecord_paths):
        if isinstance(arecord_paths, str):
            arecord_paths = [arecord_paths]

        for p in arecord_paths:
            if not os.path.exists(p):
                raise FileNotFoundError(f"ArrayRecord file not found: {p}")

        # ArrayRecordDataSource handles multi-file concat + random access
        self._source = grain.sources.ArrayRecordDataSource(arecord_paths)

    def __len__(self):
        return len(self._source)

    def __getitem__(self, idx):
        raw_bytes = self._source[idx]
        return msgpack.unpackb(raw_bytes, raw=False)


class DecodeEpisode:
    """Decode a raw msgpack record dict into numpy arrays."""

    def __init__(self, image_size=224, is_train=True, load_support_seq=True,
                 path_prefix_remaps=None):
        self._image_size = image_size
        self._is_train = is_train
        self._load_support_seq = load_support_seq
        # list of (old_prefix, new_prefix) for remapping stored paths
        self._path_prefix_remaps = path_prefix_remaps or []

    def __call__(self, record):
        # Decode target image
        target_path = record["target_path"]
        if isinstance(target_path, bytes):
            target_path = target_path.decode("utf-8")
        if self._path_prefix_remaps:
            for old, new in self._path_prefix_remaps:
                if target_path.startswith(old):
                    target_path = new + target_path[len(old):]
                    break  # first match wins

        target = _decode_image(
            target_path,
            self._image_size,
            self._is_train,
            rng=np.random.RandomState(),
        )

        # Decode support embeddings — infer num_supports from byte size
        EMBED_DIM = EMBED_DIM_HERE
        pooled_bytes = record["supports_pooled"]
        pooled_flat = np.frombuffer(pooled_bytes, dtype=np.float16).copy()
        num_supports = len(pooled_flat) // EMBED_DIM
        supports_pooled = pooled_flat.reshape(num_supports, EMBED_DIM)

        seq_bytes = record["supports_seq"]
        if self._load_support_seq and len(seq_bytes) > 0:
            seq_flat = np.frombuffer(seq_bytes, dtype=np.float16).copy()
            supports_seq = seq_flat.reshape(num_supports, SEQ_HERE, EMBED_DIM)
        else:
            supports_seq = np.zeros((num_supports, SEQ_HERE, EMBED_DIM), dtype=np.float16)

        class_id = np.int32(record["class_id"])

        return {
            "target": target,
            "supports_pooled": supports_pooled,
            "supports_seq": supports_seq,
            "class_id": class_id,
        }


def _discover_arecord_files(arecord_dir, split):
    pattern = os.path.join(arecord_dir, f"{split}_shard_*.arecord")
    shards = sorted(glob.glob(pattern))
    if shards:
        return shards

    single = os.path.join(arecord_dir, f"{split}.arecord")
    if os.path.exists(single):
        return [single]

    raise FileNotFoundError(
        f"No ArrayRecord files found for split '{split}' in {arecord_dir}. "
        f"Expected {split}.arecord or {split}_shard_*.arecord"
    )


def build_grain_dataset(
    arecord_dir,
    split,
    batch_size,
    image_size=224,
    is_train=True,
    seed=42,
    load_support_seq=True,
    path_prefix_remaps=None,
    num_threads=16,
    prefetch_buffer_size=500,
):
    paths = _discover_arecord_files(arecord_dir, split)
    source = MsgpackEpisodeSource(paths)

    def _make_iter(epoch_seed):
        """Build a fresh 1-epoch Grain iterator."""
        ds = grain.MapDataset.source(source)
        if is_train:
            ds = ds.shuffle(seed=epoch_seed)
        ds = ds.map(
            DecodeEpisode(
                image_size=image_size,
                is_train=is_train,
                load_support_seq=load_support_seq,
                path_prefix_remaps=path_prefix_remaps,
            )
        )
        ds = ds.batch(batch_size=batch_size, drop_remainder=True)
        it = ds.to_iter_dataset(
            grain.ReadOptions(
                num_threads=num_threads,
                prefetch_buffer_size=prefetch_buffer_size,
            )
        )
        return iter(it)

    return _InfiniteGrainIterator(_make_iter, seed)


class _InfiniteGrainIterator:
    """Wraps a Grain iterator factory to auto-restart on epoch end."""

    def __init__(self, make_iter_fn, base_seed):
        self._make_iter_fn = make_iter_fn
        self._base_seed = base_seed
        self._epoch = 0
        self._iter = make_iter_fn(base_seed)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                return next(self._iter)
            except StopIteration:
                self._epoch += 1
                new_seed = self._base_seed + self._epoch
                self._iter = self._make_iter_fn(new_seed)


RESTORE_AT_EVERY_STEP_HERE

def plain(x):
    return {k: np.asarray(v).tolist() for k, v in x.items()}


def plain_eq(a, b):
    return [plain(x) for x in a] == [plain(x) for x in b]


results = {}
for split in ("train", "val"):
    loader = build_grain_dataset(ARECORD_DIR, split, batch_size=2, image_size=4, is_train=False, seed=7,
                                 load_support_seq=True, path_prefix_remaps=[("/workspace/data", IMAGE_DIR)],
                                 num_threads=16, prefetch_buffer_size=500)
    # Three epochs of the endless iterator: each epoch a fresh 1-epoch Grain iterator.
    results[split] = [plain(next(loader)) for _ in range(3 * (N_EPISODES[split] // 2))]
    results[split + "_epochs"] = loader._epoch

# Training: shuffled per epoch with base_seed + epoch; the flips come from an unseeded RandomState,
# so only the episodes' order and the (unflipped or flipped) images are compared.
loader = build_grain_dataset(ARECORD_DIR, "train", batch_size=2, image_size=4, is_train=True, seed=7,
                             load_support_seq=False, path_prefix_remaps=[("/workspace/data", IMAGE_DIR)])
batches = [next(loader) for _ in range(9)]
results["train_shuffled_ids"] = [b["class_id"].tolist() for b in batches]
results["train_zero_seq"] = all(not b["supports_seq"].any() for b in batches)
decode = DecodeEpisode(image_size=4, is_train=False, path_prefix_remaps=[("/workspace/data", IMAGE_DIR)])
episodes = MsgpackEpisodeSource(_discover_arecord_files(ARECORD_DIR, "train"))
by_id = {int(r["class_id"]): r["target"] for r in map(decode, (episodes[i] for i in range(len(episodes))))}
results["train_flip_or_not"] = all(
    np.array_equal(t, by_id[int(c)]) or np.array_equal(t, by_id[int(c)][:, ::-1, :])
    for b in batches for c, t in zip(b["class_id"], b["target"]))

# One epoch's Grain iterator restored at every step (the wrapper keeps no state of its own).
source = MsgpackEpisodeSource(_discover_arecord_files(ARECORD_DIR, "train"))
def one_epoch():
    ds = grain.MapDataset.source(source).shuffle(seed=8).map(
        DecodeEpisode(image_size=4, is_train=False, path_prefix_remaps=[("/workspace/data", IMAGE_DIR)]))
    return ds.batch(batch_size=2, drop_remainder=True).to_iter_dataset(
        grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
reference, restores = restore_at_every_step(one_epoch)
results["restores"] = restores
it = iter(one_epoch())
next(it)
results["state"] = it.get_state()

for name, call in (("missing_split", lambda: build_grain_dataset(ARECORD_DIR, "test", 2)),
                   ("missing_shard", lambda: MsgpackEpisodeSource([os.path.join(ARECORD_DIR, "nope.arecord")]))):
    try:
        call()
        results[name] = None
    except FileNotFoundError as e:
        results[name] = ["FileNotFoundError", str(e).replace(ARECORD_DIR, "<dir>")]
'''.replace("RESTORE_AT_EVERY_STEP_HERE", porting.RESTORE_AT_EVERY_STEP).replace(
    "EMBED_DIM_HERE", "4").replace("SEQ_HERE", "3")


def _write_fsdit_data(tmp_path) -> tuple[str, str, dict[str, int]]:
  """Small PNGs and msgpack episodes: `train` in two shards, `val` in one file."""
  import msgpack  # pylint: disable=g-import-not-at-top
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  image_dir, arecord_dir = tmp_path / "images", tmp_path / "arecord"
  image_dir.mkdir()
  arecord_dir.mkdir()
  rng = np.random.default_rng(0)
  layout = {"train_shard_000.arecord": range(0, 3), "train_shard_001.arecord": range(3, 7),
            "val.arecord": range(100, 104)}
  for name, ids in layout.items():
    writer = ArrayRecordWriter(str(arecord_dir / name), "group_size:1")
    for cid in ids:
      Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(image_dir / f"{cid}.png")
      pooled = rng.standard_normal((3, 4)).astype(np.float16)
      seq = rng.standard_normal((3, 3, 4)).astype(np.float16)
      writer.write(msgpack.packb({"target_path": f"/workspace/data/{cid}.png", "supports_pooled": pooled.tobytes(),
                                  "supports_seq": seq.tobytes(), "class_id": cid}))
    writer.close()
  return str(arecord_dir), str(image_dir), {"train": 7, "val": 4}


def test_fsdit_msgpack_array_record_episodes_endless_epochs_as_on_grain(tmp_path):
  """FSDiT: ArrayRecordDataSource(list) under a msgpack wrapper, MapDataset.batch, ReadOptions, endless epochs."""
  arecord_dir, image_dir, sizes = _write_fsdit_data(tmp_path)
  g, l = (porting.run(FSDIT, lib, ARECORD_DIR=arecord_dir, IMAGE_DIR=image_dir, N_EPISODES=sizes).results
          for lib in porting.LIBS)
  gc.collect()
  assert porting.grain_keys(l) == porting.grain_keys(g)
  # 7 train episodes in batches of 2 (the odd one dropped): 3 a epoch, 9 over three epochs, unshuffled.
  assert [b["class_id"] for b in g["train"]] == [[0, 1], [2, 3], [4, 5]] * 3 and g["train_epochs"] == 2
  assert [b["class_id"] for b in g["val"]] == [[100, 101], [102, 103]] * 3
  assert np.asarray(g["train"][0]["supports_seq"]).shape == (2, 3, 3, 4)
  assert np.asarray(g["train"][0]["target"]).shape == (2, 4, 4, 3)
  epochs = [sorted(sum(g["train_shuffled_ids"][k:k + 3], [])) for k in (0, 3, 6)]
  assert all(len(set(e)) == 6 for e in epochs) and g["train_shuffled_ids"][:3] != g["train_shuffled_ids"][3:6]
  assert g["train_zero_seq"] is True and g["train_flip_or_not"] is True
  assert g["restores"] == [[True, True]] * 4
  assert g["missing_split"][0] == "FileNotFoundError" and g["missing_shard"][0] == "FileNotFoundError"


@pytest.mark.parametrize("snippet", ["sft", "midtrain", "fsdit"])
def test_ported_snippets_change_only_import_lines(snippet):
  """The loader run differs from the Grain run in its `import grain` lines alone."""
  source = {"sft": JAXNANO_SFT, "midtrain": JAXNANO_MIDTRAIN, "fsdit": FSDIT}[snippet]
  ported = porting.to_loader(source)
  changed = [(a.strip(), b.strip()) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
  assert changed == [("import grain", "import loader as grain")]
