"""LLM pretraining input pipeline, end to end: TFRecord -> ArrayRecord -> mixture -> packed batches -> JAX.

  python examples/llm_pretrain.py [--workdir DIR] [--docs 600] [--seq-len 256]
      [--batch-size 8] [--steps 12] [--workers 2] [--resume-workers 1]

1. Writes two text corpora, "web" and "code", as TFRecord files of
   `tf.train.Example {"text": bytes}` (pure Python, no TensorFlow).
2. Converts each to ArrayRecord with the converter's Beam transform,
   `converter.ConvertToArrayRecord`, on the DirectRunner.
3. Builds MaxText's Grain pipeline, written as Grain code (`import loader as
   grain`): a 70/30 mixture of the two corpora -> parse + byte-level tokenize
   -> first-fit packing into `--batch-size` bins of `--seq-len` tokens ->
   `batch_and_pad` -> `mp_prefetch`.
4. Trains a tiny JAX language model (token embeddings and a linear
   next-token head; the loss ignores padding via the segment ids).
5. Runs the same training twice: once without interruption, and once
   checkpointed halfway (`grain.save_state` plus the parameters) and resumed
   in a fresh pipeline with a different worker count. It prints whether the
   resumed run saw exactly the batches (and losses) of the uninterrupted one;
   with Grain itself that holds only for an unchanged worker count, because
   Grain packs per worker.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

# Running `python examples/llm_pretrain.py` puts examples/ on sys.path, not the
# repository root that holds the packages.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import loader as grain  # pylint: disable=g-import-not-at-top,wrong-import-position
from loader import example as example_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from pipelines import make_example_data  # pylint: disable=g-import-not-at-top,wrong-import-position

PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 256 + 3  # Bytes, shifted past PAD/BOS/EOS.
EMBED_DIM = 32
MIXTURE = {"web": 0.7, "code": 0.3}

_WORDS = ("the data loader packs documents into rows of tokens so that every step of training sees full "
          "sequences and the padding stays small while checkpoints record the exact position").split()
_CODE = ("def", "return", "for", "in", "if", "else", "import", "class", "self", "yield", "x", "i", "np",
         "(", ")", ":", "=", "+", "[", "]")


def _document(corpus: str, rng: np.random.Generator) -> bytes:
  if corpus == "web":
    words = rng.choice(_WORDS, size=int(rng.integers(4, 120)))
    return (" ".join(words).capitalize() + ".").encode()
  lines = [" ".join(rng.choice(_CODE, size=int(rng.integers(2, 12)))) for _ in range(int(rng.integers(1, 8)))]
  return "\n".join(lines).encode()


def write_corpus(directory: str, corpus: str, docs: int, shards: int = 2, seed: int = 0) -> list[str]:
  """Writes `corpus.tfrecord-SSSSS-of-NNNNN` files of Examples {"text": bytes}."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng([seed, len(corpus)])
  paths = []
  for s in range(shards):
    records = [make_example_data.encode_example({"text": ("bytes", [_document(corpus, rng)])})
               for _ in range(docs // shards)]
    path = os.path.join(directory, f"{corpus}.tfrecord-{s:05d}-of-{shards:05d}")
    make_example_data.write_tfrecord_file(path, records, overwrite=True)  # This example's own files.
    paths.append(path)
  return paths


def convert(inputs: dict[str, list[str]], output_root: str) -> dict[str, str]:
  """Converts each corpus's TFRecord files with ConvertToArrayRecord on the DirectRunner."""
  # Lazy: Beam is only needed for this step (and never in loader workers).
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from converter import ConvertToArrayRecord  # pylint: disable=g-import-not-at-top

  outputs = {name: os.path.join(output_root, name) for name in inputs}
  with beam.Pipeline(runner="DirectRunner") as p:
    for name, files in inputs.items():
      _ = (p
           | f"List{name.title()}" >> beam.Create(sorted(files))
           | f"Convert{name.title()}" >> ConvertToArrayRecord(outputs[name], existing="overwrite"))
  return outputs


class ParseAndTokenize:
  """Serialized Example -> {"inputs", "targets"}: byte-level tokens, trimmed to seq_len.

  Like MaxText's tokenize-and-trim: inputs = [BOS] + tokens, targets =
  tokens + [EOS]. A module-level class so that it pickles into workers.
  """

  def __init__(self, seq_len: int):
    self.seq_len = seq_len
    self._decode = example_lib.example_decoder({"text": example_lib.FixedLenFeature([], "bytes")})

  def __call__(self, record: bytes) -> dict[str, np.ndarray]:
    text = self._decode(record)["text"][()]
    n = min(len(text), self.seq_len - 1)
    tokens = np.empty(n + 2, np.int32)
    tokens[0], tokens[n + 1] = BOS, EOS
    tokens[1:n + 1] = np.frombuffer(text, np.uint8, count=n) + 3
    return {"inputs": tokens[:-1], "targets": tokens[1:]}


def make_dataset(sources: dict[str, str], *, seq_len: int, batch_size: int, workers: int,
                 seed: int = 0) -> grain.IterDataset:
  """MaxText's pretraining pipeline shape, in Grain's API."""
  corpora = [grain.MapDataset.source(grain.ArrayRecordSource(sources[name])).shuffle(seed=seed + i)
             for i, name in enumerate(MIXTURE)]
  ds = grain.MapDataset.mix(corpora, weights=list(MIXTURE.values()))
  ds = ds.map(ParseAndTokenize(seq_len)).to_iter_dataset()
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={"inputs": seq_len, "targets": seq_len}, num_packing_bins=batch_size)
  ds = ds.batch(batch_size, batch_fn=functools.partial(grain.experimental.batch_and_pad,
                                                       batch_size=batch_size, pad_value=PAD))
  return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def fingerprint(batch: dict[str, np.ndarray]) -> str:
  h = hashlib.sha256()
  for k in sorted(batch):
    h.update(k.encode())
    h.update(np.ascontiguousarray(batch[k]).tobytes())
  return h.hexdigest()[:16]


def init_params(seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {"embed": (rng.standard_normal((VOCAB_SIZE, EMBED_DIM)) * 0.1).astype(np.float32),
          "head": (rng.standard_normal((EMBED_DIM, VOCAB_SIZE)) * 0.1).astype(np.float32)}


@functools.lru_cache(maxsize=None)
def _train_step(learning_rate: float):
  # Lazy: JAX is needed only for training (never in loader workers).
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def loss_fn(params, batch):
    logits = params["embed"][batch["inputs"]] @ params["head"]
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    mask = batch["targets_segment_ids"] > 0  # Padding rows and cells have segment id 0.
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1)

  @jax.jit
  def step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads), loss

  return step


def train(iterator: Any, params: dict[str, Any], steps: int, *, learning_rate: float = 10.0,
          log=print, first_step: int = 0) -> tuple[dict[str, Any], list[float], list[str]]:
  """Runs `steps` train steps on batches from `iterator`; returns (params, losses, batch fingerprints)."""
  step = _train_step(learning_rate)
  losses, prints = [], []
  for i in range(steps):
    batch = next(iterator)
    prints.append(fingerprint(batch))
    params, loss = step(params, {k: batch[k] for k in ("inputs", "targets", "targets_segment_ids")})
    losses.append(float(loss))
    real = int(np.count_nonzero(batch["targets_segment_ids"]))
    log(f"  step {first_step + i:3d}  loss {losses[-1]:.4f}  real tokens {real}/{batch['targets'].size}")
  return params, losses, prints


def run(argv: Sequence[str] | None = None) -> bool:
  """The whole example; returns whether the resumed run matched the uninterrupted one."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", help="Where data and checkpoints go (default: a temporary directory).")
  p.add_argument("--docs", type=int, default=600, help="Documents per corpus.")
  p.add_argument("--seq-len", type=int, default=256)
  p.add_argument("--batch-size", type=int, default=8, help="Rows per batch = packing bins.")
  p.add_argument("--steps", type=int, default=12)
  p.add_argument("--workers", type=int, default=2, help="mp_prefetch workers before the checkpoint.")
  p.add_argument("--resume-workers", type=int, default=1, help="mp_prefetch workers after resuming.")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  if args.workers == args.resume_workers:
    p.error(f"--resume-workers must differ from --workers (both {args.workers}) to show the point.")

  workdir = args.workdir or tempfile.mkdtemp(prefix="llm_pretrain-")
  try:
    tfrecords = {name: write_corpus(os.path.join(workdir, "tfrecord"), name, args.docs, seed=args.seed)
                 for name in MIXTURE}
    print(f"Wrote {sum(map(len, tfrecords.values()))} TFRecord files under {workdir}/tfrecord")
    sources = convert(tfrecords, os.path.join(workdir, "array_record"))
    print(f"Converted them to ArrayRecord: {', '.join(sources.values())}")
    make = functools.partial(make_dataset, sources, seq_len=args.seq_len, batch_size=args.batch_size,
                             seed=args.seed)
    half = args.steps // 2

    print(f"Uninterrupted: {args.steps} steps, {args.workers} workers")
    with iter(make(workers=args.workers)) as it:
      _, losses, prints = train(it, init_params(args.seed), args.steps)

    print(f"Interrupted: {half} steps with {args.workers} workers, checkpoint, "
          f"resume with {args.resume_workers} workers")
    ckpt = os.path.join(workdir, "checkpoint")
    os.makedirs(ckpt, exist_ok=True)
    with iter(make(workers=args.workers)) as it:
      params, losses_a, prints_a = train(it, init_params(args.seed), half)
      grain.save_state(os.path.join(ckpt, "data.json"), it)
      np.savez(os.path.join(ckpt, "params.npz"), **{k: np.asarray(v) for k, v in params.items()})
    with iter(make(workers=args.resume_workers)) as it:  # A fresh process would do the same.
      grain.restore_state(os.path.join(ckpt, "data.json"), it)
      with np.load(os.path.join(ckpt, "params.npz")) as saved:
        params = {k: saved[k] for k in saved.files}
      _, losses_b, prints_b = train(it, params, args.steps - half, first_step=half)

    same_batches = prints == prints_a + prints_b
    same_losses = np.allclose(losses, losses_a + losses_b, rtol=1e-6, atol=0)
    print(f"resumed stream equals the uninterrupted one: {same_batches} "
          f"({args.steps} batches compared by SHA-256 of every array)")
    print(f"resumed losses equal the uninterrupted ones: {same_losses}")
    return same_batches and same_losses
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
  return 0 if run(argv) else 1


if __name__ == "__main__":
  sys.exit(main())
