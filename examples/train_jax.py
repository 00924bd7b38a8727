"""Trains a small JAX classifier on ArrayRecord files written by the converter.

  python examples/train_jax.py --data DIR --steps 300 --batch-size 64 \
      --workers 2 --checkpoint /tmp/ckpt

Records are serialized tf.train.Example protos with "label" (int64) and
"image" (28x28 uint8 pixels as bytes), as pipelines/make_example_data.py
writes them. The input pipeline is the one a real job would use:

  ArrayRecordSource -> shuffle -> map(parse + normalize) -> batch -> repeat
    -> worker processes (mp_prefetch) -> prefetch_to_device -> train step

The model is a one-hidden-layer MLP in plain jax.numpy with a manual SGD
step, data-parallel over all devices: the batch is split over a "data" mesh
axis and parameters are replicated, so XLA inserts the gradient all-reduce.

With --checkpoint DIR, the parameters and the input pipeline's position are
saved every --checkpoint-every steps and at the end; a rerun with the same
DIR resumes where the saved run left off and sees exactly the batches an
uninterrupted run would have.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

# Running `python examples/train_jax.py` puts examples/ on sys.path, not the
# repository root that holds the `loader` package.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import loader  # pylint: disable=g-import-not-at-top,wrong-import-position
from loader import example as example_lib  # pylint: disable=wrong-import-position

IMAGE_SIZE = 28 * 28
NUM_CLASSES = 10
HIDDEN_SIZE = 64

FEATURES = {
    "label": example_lib.FixedLenFeature([], "int64"),
    "image": example_lib.FixedLenFeature([], "bytes"),
}


class ParseAndNormalize:
  """Record bytes -> {"image": float32[784] in [-1, 1], "label": int32}.

  A module-level class rather than a closure so that it pickles into the
  loader's worker processes.
  """

  def __init__(self):
    self._decode = example_lib.example_decoder(FEATURES)

  def __call__(self, record: bytes) -> dict[str, np.ndarray]:
    features = self._decode(record)
    pixels = np.frombuffer(features["image"][()], np.uint8)
    if pixels.size != IMAGE_SIZE:
      raise ValueError(f"Expected {IMAGE_SIZE} image bytes, got {pixels.size}.")
    return {
        "image": pixels.astype(np.float32) / 127.5 - 1.0,
        # Device arrays are int32 by default; say so here, not in a warning.
        "label": features["label"].astype(np.int32),
    }


def make_iterator(data_dir: str, batch_size: int, workers: int, seed: int,
                  read_options: loader.ReadOptions | None = None) -> Any:
  """Builds the host input pipeline; returns a checkpointable iterator."""
  dataset = (
      loader.MapDataset.source(loader.ArrayRecordSource(data_dir))
      .shuffle(seed=seed)
      .map(ParseAndNormalize())
      .batch(batch_size, drop_remainder=True)
      .repeat()
      .to_iter_dataset(read_options)
  )
  if workers > 0:
    dataset = dataset.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  return iter(dataset)


def _init_params(seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  # He initialization keeps ReLU activations at unit scale.
  return {
      "w1": (rng.standard_normal((IMAGE_SIZE, HIDDEN_SIZE)) * np.sqrt(2 / IMAGE_SIZE)).astype(np.float32),
      "b1": np.zeros(HIDDEN_SIZE, np.float32),
      "w2": (rng.standard_normal((HIDDEN_SIZE, NUM_CLASSES)) * np.sqrt(2 / HIDDEN_SIZE)).astype(np.float32),
      "b2": np.zeros(NUM_CLASSES, np.float32),
  }


_STEP_DIR_RE = re.compile(r"step_(\d{8})")
_KEEP_CHECKPOINTS = 2


def _save_checkpoint(directory: str, step: int, params: dict[str, Any], batches: Any) -> None:
  """Writes `directory/step_NNNNNNNN/{params.npz,data.json}`.

  Both files go into a temporary directory that is renamed into place, so a
  crash never leaves parameters from one step next to a data position from
  another.
  """
  os.makedirs(directory, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-step_", dir=directory)
  np.savez(os.path.join(tmp, "params.npz"), **{k: np.asarray(v) for k, v in params.items()})
  loader.save_state(os.path.join(tmp, "data.json"), batches)
  final = os.path.join(directory, f"step_{step:08d}")
  if os.path.exists(final):  # The same step saved again by a rerun.
    shutil.rmtree(final)
  os.rename(tmp, final)
  for old in _checkpoint_steps(directory)[:-_KEEP_CHECKPOINTS]:
    shutil.rmtree(os.path.join(directory, f"step_{old:08d}"))


def _checkpoint_steps(directory: str) -> list[int]:
  if not os.path.isdir(directory):
    return []
  matches = (_STEP_DIR_RE.fullmatch(name) for name in os.listdir(directory))
  return sorted(int(m.group(1)) for m in matches if m)


def train(
    data_dir: str,
    *,
    steps: int = 200,
    batch_size: int = 64,
    workers: int = 2,
    seed: int = 0,
    learning_rate: float = 0.1,
    log_every: int = 20,
    checkpoint: str | None = None,
    checkpoint_every: int = 100,
    prefetch: int = 2,
) -> list[float]:
  """Trains until global step `steps`; returns the losses of the steps run.

  Args:
    data_dir: Directory of ArrayRecord files of serialized Examples.
    steps: Total number of steps; a resumed run only runs the remainder.
    batch_size: Global batch size; must be divisible by the device count.
    workers: Loader worker processes; 0 reads in this process.
    seed: Seeds the shuffle and the parameter initialization.
    learning_rate: SGD step size.
    log_every: Print loss and throughput every this many steps.
    checkpoint: Directory to resume from (its latest step, if any) and to
      save `step_NNNNNNNN/` checkpoints in; the two newest are kept.
    checkpoint_every: Save every this many steps (and at the end).
    prefetch: Batches to keep on device ahead of the train step.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from loader import jax as loader_jax  # pylint: disable=g-import-not-at-top

  if batch_size % jax.device_count():
    raise ValueError(
        f"batch_size must be divisible by the {jax.device_count()} devices (got {batch_size=})."
    )

  data_sharding = loader_jax.batch_sharding()
  replicated = jax.sharding.NamedSharding(data_sharding.mesh, jax.sharding.PartitionSpec())

  step, params = 0, _init_params(seed)
  saved_steps = _checkpoint_steps(checkpoint) if checkpoint else []
  if saved_steps:
    step = saved_steps[-1]
    with np.load(os.path.join(checkpoint, f"step_{step:08d}", "params.npz")) as saved:
      params = {k: saved[k] for k in saved.files}
  params = jax.device_put(params, replicated)

  def loss_fn(params, batch):
    hidden = jax.nn.relu(batch["image"] @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, batch["label"][:, None], axis=1))

  @jax.jit
  def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return params, loss

  losses = []  # device scalars: reading them every step would stall dispatch
  host_iterator = make_iterator(data_dir, batch_size, workers, seed)
  # The context manager stops the worker processes however training ends.
  with loader_jax.prefetch_to_device(host_iterator, data_sharding, size=prefetch) as batches:
    if saved_steps:
      step_dir = os.path.join(checkpoint, f"step_{step:08d}")
      loader.restore_state(os.path.join(step_dir, "data.json"), batches)
      print(f"Resumed from {step_dir}.")
    window_start, window_steps = time.perf_counter(), 0
    for step in range(step, steps):
      params, loss = train_step(params, next(batches))
      losses.append(loss)
      window_steps += 1
      done = step + 1
      if done % log_every == 0 or done == steps:
        loss_value = float(loss)  # waits for this step
        elapsed = time.perf_counter() - window_start
        print(
            f"step {done:5d}  loss {loss_value:.4f}  "
            f"{window_steps * batch_size / elapsed:,.0f} records/s",
            flush=True,
        )
        window_start, window_steps = time.perf_counter(), 0
      if checkpoint and (done % checkpoint_every == 0 or done == steps):
        _save_checkpoint(checkpoint, done, jax.device_get(params), batches)
  return [float(l) for l in jax.device_get(losses)]


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", required=True, help="Directory of ArrayRecord files.")
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--learning-rate", type=float, default=0.1)
  parser.add_argument("--log-every", type=int, default=20)
  parser.add_argument("--checkpoint", help="Directory to resume from and save checkpoints to.")
  parser.add_argument("--checkpoint-every", type=int, default=100)
  args = parser.parse_args(argv)
  try:  # Fail early, in one line, on a wrong --data rather than with a traceback.
    loader.ArrayRecordSource(args.data)
  except (loader.source.MissingFileError, loader.source.NotArrayRecordError) as e:
    parser.error(f"--data {args.data}: {e}")
  losses = train(
      args.data,
      steps=args.steps,
      batch_size=args.batch_size,
      workers=args.workers,
      seed=args.seed,
      learning_rate=args.learning_rate,
      log_every=args.log_every,
      checkpoint=args.checkpoint,
      checkpoint_every=args.checkpoint_every,
  )
  if losses:
    print(f"Final loss {losses[-1]:.4f} after {len(losses)} steps this run.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
