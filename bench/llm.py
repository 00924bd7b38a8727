"""The LLM pretraining workload of bench/load.py: text -> tokens -> packed batches.

A MaxText-style input pipeline (MaxText's `_grain_data_processing` shape):

  MapDataset.source(text source).shuffle(seed).repeat().map(Tokenize(L))
    .to_iter_dataset()
  -> experimental.FirstFitPackIterDataset(length_struct={"inputs": L,
       "targets": L}, num_packing_bins=batch_size)
  -> .batch(batch_size, drop_remainder=True) [-> .mp_prefetch(workers)]

`pipeline(grain, source, ...)` is written only against Grain 0.2.18's public
names, so it runs with `grain` = the real Grain and `grain` = `loader` alike
(the loader mirrors those names). `batched_read_pipeline` is Grain's faster
variant found with its public API: batch the shuffled indices, read and
tokenize a whole batch in one call, flatten with FlatMapIterDataset.

The data: text records (plain UTF-8 bytes, no Example proto) with log-normal
lengths around the benchmark's ~1 KB record size, so packing has short and
long documents to fit. The tokenizer is a byte-level stand-in (numpy, a few
µs per document): a real BPE tokenizer costs more per document, which would
lower the share of time spent packing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from bench import common

PAD, BOS, EOS = 0, 1, 2
_TOKEN_OFFSET = 3  # Byte b becomes token b + 3; 0..2 are PAD/BOS/EOS.
_DATA_FORMAT = "arrayrecord-toolkit/bench-text/v1"
_LENGTH_SIGMA = 0.8  # Log-normal spread of document lengths.


# --------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------


def _vocabulary(seed: int, size: int = 4096) -> list[bytes]:
  rng = np.random.default_rng([seed, 11])
  lengths = rng.integers(2, 11, size=size)
  letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8).tobytes()
  ends = np.cumsum(lengths)
  return [letters[e - n:e] for e, n in zip(ends.tolist(), lengths.tolist())]


def text_records(shard: int, records: int, mean_bytes: int, seed: int = 0):
  """Documents of random words; log-normal lengths with mean ~mean_bytes."""
  vocab = _vocabulary(seed)
  rng = np.random.default_rng([seed, shard, 7])
  mu = np.log(mean_bytes) - _LENGTH_SIGMA ** 2 / 2
  lengths = np.clip(rng.lognormal(mu, _LENGTH_SIGMA, size=records), 16, 16 * mean_bytes).astype(int)
  for n in lengths.tolist():
    words = rng.integers(0, len(vocab), size=n // 4 + 2).tolist()  # Words average 6.5 bytes + space.
    yield b" ".join([vocab[w] for w in words])[:n]


def ensure_text_data(shards: int, records_per_shard: int, mean_bytes: int, seed: int = 0,
                     log=print) -> dict[str, Any]:
  """ArrayRecord files of text documents (group_size:1); made once, then reused.

  Returns the meta dict: files (absolute paths), records, bytes.
  """
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top

  directory = os.path.join(common.DATA_DIR, f"text-s{shards}-r{records_per_shard}-b{mean_bytes}-seed{seed}")
  files = [os.path.join(directory, f"bench-text.array_record-{s:05d}-of-{shards:05d}") for s in range(shards)]
  meta_path = os.path.join(directory, "meta.json")
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    if meta.get("format") == _DATA_FORMAT and all(map(os.path.exists, files)):
      return {**meta, "files": files}
  start = time.monotonic()
  common.fresh_dir(directory)
  total = 0
  for s, path in enumerate(files):
    writer = ArrayRecordWriter(path, "group_size:1")
    for doc in text_records(s, records_per_shard, mean_bytes, seed):
      writer.write(doc)
      total += len(doc)
    writer.close()
  meta = {"format": _DATA_FORMAT, "shards": shards, "records_per_shard": records_per_shard,
          "records": shards * records_per_shard, "mean_bytes_target": mean_bytes,
          "mean_bytes": round(total / (shards * records_per_shard), 1), "bytes": total,
          "kind": f"UTF-8 text, log-normal lengths (sigma {_LENGTH_SIGMA}), 16..{16 * mean_bytes} B",
          "writer_options": "group_size:1"}
  common.write_json(meta_path, meta)
  log(f"Generated {shards} x {records_per_shard:,} text records into "
      f"{os.path.relpath(directory, common.REPO_ROOT)} in {time.monotonic() - start:.1f} s")
  return {**meta, "files": files}


# --------------------------------------------------------------------------
# Transformations (module level: worker processes unpickle them by name).
# --------------------------------------------------------------------------


class Tokenize:
  """Byte-level tokenizer stand-in: text -> {"inputs", "targets"} int32, trimmed to seq_len.

  Like MaxText's TokenizeAndTrim: inputs = [BOS] + tokens, targets = tokens +
  [EOS], both cut to seq_len (a document longer than a packed row is
  truncated, not split).
  """

  def __init__(self, seq_len: int):
    self.seq_len = seq_len

  def __call__(self, text: bytes) -> dict[str, np.ndarray]:
    n = min(len(text), self.seq_len - 1)
    tokens = np.empty(n + 2, np.int32)
    tokens[0] = BOS
    tokens[1:n + 1] = np.frombuffer(text, np.uint8, count=n)
    tokens[1:n + 1] += _TOKEN_OFFSET
    tokens[n + 1] = EOS
    return {"inputs": tokens[:-1], "targets": tokens[1:]}


class ReadAndTokenize:
  """Grain's batched variant: a batch of indices -> list of tokenized documents."""

  def __init__(self, source: Any, seq_len: int):
    self.source = source
    self.tokenize = Tokenize(seq_len)

  def __call__(self, indices: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [self.tokenize(t) for t in self.source.__getitems__(indices.tolist())]


def _flatten_transform(grain, max_fan_out: int):
  """A grain.experimental.FlatMapTransform that emits the documents of one read batch."""

  class Flatten(grain.experimental.FlatMapTransform):

    def __init__(self):
      self.max_fan_out = max_fan_out

    def flat_map(self, element):
      return element

  return Flatten()


# --------------------------------------------------------------------------
# Pipelines.
# --------------------------------------------------------------------------


def _pack_and_batch(grain, ds, seq_len: int, batch_size: int, num_workers: int):
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={"inputs": seq_len, "targets": seq_len}, num_packing_bins=batch_size)
  ds = ds.batch(batch_size, drop_remainder=True)
  if num_workers:
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  return ds


def pipeline(grain, source: Any, *, seq_len: int, batch_size: int, num_workers: int, seed: int = 42):
  """MaxText's Grain pipeline shape; `grain` is the real Grain or `loader`."""
  ds = grain.MapDataset.source(source).shuffle(seed=seed).repeat().map(Tokenize(seq_len))
  return _pack_and_batch(grain, ds.to_iter_dataset(), seq_len, batch_size, num_workers)


def batched_read_pipeline(grain, source: Any, *, seq_len: int, batch_size: int, num_workers: int,
                          read_batch: int, read_threads: int, seed: int = 42):
  """Grain's best variant: batched index reads, flattened back to documents before packing."""
  ds = grain.MapDataset.range(len(source)).shuffle(seed=seed).repeat().batch(read_batch)
  # The prefetch buffer counts read batches: one per thread.
  options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=read_threads)
  ds = ds.map(ReadAndTokenize(source, seq_len)).to_iter_dataset(options)
  ds = grain.experimental.FlatMapIterDataset(ds, _flatten_transform(grain, read_batch))
  return _pack_and_batch(grain, ds, seq_len, batch_size, num_workers)


def count_tokens(batch: dict[str, np.ndarray]) -> int:
  """Real (non-padding) tokens in a packed batch."""
  return int(np.count_nonzero(batch["inputs_segment_ids"]))


def packing_seconds(grain, elements: Sequence[dict[str, np.ndarray]], *, seq_len: int,
                    batch_size: int) -> tuple[float, int]:
  """Seconds spent in pack + batch for `elements`, and the real tokens they hold.

  Times the same in-memory stream with and without FirstFitPackIterDataset +
  batch (both in process, no threads) and returns the difference, so the
  source and iteration overhead is not counted as packing.
  """

  def run(pack: bool) -> float:
    ds = grain.MapDataset.source(list(elements)).to_iter_dataset(grain.ReadOptions(num_threads=0))
    if pack:
      ds = _pack_and_batch(grain, ds, seq_len, batch_size, 0)
    start = time.perf_counter()
    for _ in ds:
      pass
    return time.perf_counter() - start

  run(True)  # Warm-up: first-call costs (imports, allocations) are not packing.
  plain = min(run(False) for _ in range(2))
  packed = min(run(True) for _ in range(2))
  tokens = sum(int(e["inputs"].size) for e in elements)
  return max(packed - plain, 0.0), tokens


def tokenized_sample(source: Any, seq_len: int, n: int, seed: int = 42) -> list[dict[str, np.ndarray]]:
  """n tokenized documents in shuffled order (the packing input)."""
  rng = np.random.default_rng(seed)
  idx = rng.permutation(len(source))[:n]
  tok = Tokenize(seq_len)
  return [tok(t) for t in source.__getitems__(idx.tolist())]


PIPELINES: dict[str, Callable[..., Any]] = {"maxtext": pipeline, "batched-read": batched_read_pipeline}
