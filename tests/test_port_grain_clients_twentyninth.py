"""Round 32's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

marbles3842/variational-inference-thesis (HEAD 5a1955d), data_loaders/cifar10.py,
data_loaders/mnist.py, baseline/train_sgd.py, baseline/test.py and
diffusion/train_diffusion.py: `import grain.python as grain`, `grain.load`
over a Hugging Face `Dataset.with_format("numpy")` (`train_test_split` for a
validation split), `_Augment` (a `RandomMapTransform` drawing `rng.random()`
and `rng.integers` for a flip and a reflect-padded crop), `_Normalize` /
`_Reshape` / `_Pad` MapTransforms (MNIST's `_Normalize` dequantizes with
the global `np.random`), `drop_remainder=True`, `num_steps_per_epoch =
len(train_ds._data_source) // batch_size` with an epoch boundary at
`(step + 1) % num_steps_per_epoch == 0` over a multi-epoch loader, a
validation loader read at each epoch end, the test loader read once per
seed, and `fast_forward_iterator` (`next(itertools.islice(loader, n, n),
None)`), which cannot move a DataLoader: the resumed `enumerate(loader,
start=...)` starts at its first batch again. In process with
`worker_count=0` (states restored at every step), and as a script with the
client's own `train_worker_count=2` / `val_worker_count=1`. The Hugging Face
dataset is a small in-memory stand-in with the same indexing.

A Flax NNX image-classification package (the index names no repository):
its "Main loops for training and evaluation" module (`ckpt_save_args` /
`ckpt_restore_args`: an Orbax `Composite` with
`grain.checkpoint.CheckpointSave` / `CheckpointRestore` of the training
iterator behind `if data_iterator:`, a `@jax.tree_util.register_dataclass`
`Batch`, `process_image` turning a row into a `Batch` of `jnp` arrays,
`prepare_dataset`: `MapDataset.source(hf).shuffle(42).map(...).repeat(None)
.to_iter_dataset().batch(n)` with `grain.experimental.device_put(...,
device=sharding)`, `train_loop` / `eval_loop` calling `next(iterator)` a
number of steps) and its later data module (`dataset_from_hf` with
`step_size`: a second `.batch(step_size)` of the batched dataclasses).
Models and optimizers (nnx) are a dict of `jnp` arrays updated per batch.

A Flax NNX MNIST checkpointing example (`DigitClassifier`, `TrainState`;
the index names no repository): `from grain import DatasetIterator,
MapDataset`, `from grain.checkpoint import (CheckpointSave as
GrainCheckpointSave, CheckpointRestore as GrainCheckpointRestore)`,
`seed_from_key` (a seed from `random.key_data`),
`MapDataset.source(tfds.data_source(...)).seed(...).shuffle().repeat(n)
.batch(64, drop_remainder=True)`, `iter(dataset)` and `len(dataset)`, a
`TrainState` dataclass saving model / optimizer / rngs / iterator in one
`ocp.args.Composite` every N steps and at the end, restoring the latest step
into the same iterator (`self.__dict__.update(step=self.step + 1,
**restored)`), and `enumerate(iterator, start=state.step)`; a run killed
after a checkpoint and resumed gives the uninterrupted run's batches. The
TFDS source is a local list of `{"image", "label"}` rows.

An audio-to-MIDI trainer's dataset module (`AudioToMidiSource`,
`collect_and_crop_batch`, `create_dataset_loader`; the index names no
repository): a `grain.RandomAccessDataSource` whose records are
mini-batches (a tuple of float16 arrays whose row count varies), a frozen
dataclass of transform settings handed to the source,
`MapDataset.source(...).seed(seed).repeat(num_epochs).shuffle()` (one
shuffle over all epochs), `batch(batch_size=..., batch_fn=...)` whose
`jax.tree_util.tree_map` concatenates the mini-batches and crops or
zero-pads them (a padded batch becomes float64), `to_iter_dataset(
ReadOptions(num_threads=1, prefetch_buffer_size=4))` and the deprecated
`.prefetch(MultiprocessingOptions(num_workers=...))`, `return
iter(iter_dataset)` read with `zip(iterator, range(n))`; in process (states
restored at several steps) and with two worker processes as a script.
Audio decoding and MIDI rendering are stand-ins computed from file names.

Differences the port found (each minimized in a test of its own):
- `grain.load(..., shuffle=True)` without a seed, and a negative
  `worker_count` / `worker_buffer_size`: the same ValueError, but loader's
  message had its own words only ("IndexSampler(shuffle=True) needs a
  seed", "worker_count must be an integer >= 0"). Fixed in
  loader/samplers.py and loader/data_loader.py: Grain's words come first
  ("Shuffling requires specifying a seed.", "Worker count should be
  greater than or equal zero.Current worker_count is -1."), loader's after.
- Documented, asserted as documented: with the
  vi-thesis client's two training workers Grain batches each worker's share
  of the records (and drops a remainder per worker) where loader's stream
  is the one with no workers (README, `DataLoader`: "one stream whatever
  worker_count"); Grain's `prefetch(MultiprocessingOptions(num_workers=2))`
  hands the arrays over as `SharedMemoryArray` (an `np.ndarray` subclass)
  where loader's arrive as `np.ndarray` (README, `SharedMemoryArray`);
  loader's DataLoader and dataset states carry extra keys (README,
  "Checkpoint states"), compared through `porting.grain_keys`; a batch of
  mixed image sizes fails with ValueError on both, Grain's words first in
  loader's message.
- Not compared, on purpose: how many records a dropped DataLoader iterator
  (vi-thesis's `fast_forward_iterator`) had read ahead, which shows in the
  global `np.random` draws of MNIST's `_Normalize` and depends on each
  library's read-ahead threads; the test compares the noise-free pixels.
"""

from __future__ import annotations

import json
import os

import absl.flags
import numpy as np
import pytest

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


# ---------------------------------------------------------------------------
# marbles3842/variational-inference-thesis
# ---------------------------------------------------------------------------

# data_loaders/cifar10.py and data_loaders/mnist.py (5a1955d), the Hugging
# Face dataset replaced by an in-memory stand-in with its indexing.
VI_THESIS = r'''
import itertools

import numpy as np
import grain.python as grain


class FakeHFDataset:
    """datasets.Dataset.with_format("numpy"): rows as dicts of numpy values."""

    def __init__(self, columns):
        self._columns = columns

    def __len__(self):
        return len(next(iter(self._columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self._columns.items()}

    def __repr__(self):  # datasets.Dataset's repr: stable across processes, as Grain's checks need
        return f"Dataset({{\n    features: {list(self._columns)},\n    num_rows: {len(self)}\n}})"

    def with_format(self, kind):
        assert kind == "numpy"
        return self

    def select(self, indices):
        return FakeHFDataset({k: v[np.asarray(indices)] for k, v in self._columns.items()})

    def train_test_split(self, test_size, seed):
        order = np.random.default_rng(seed).permutation(len(self))
        n_test = int(round(test_size * len(self)))
        return {"train": self.select(order[n_test:]), "test": self.select(order[:n_test])}


def load_dataset(name):
    rng = np.random.default_rng(0 if name == "cifar10" else 1)
    if name == "cifar10":
        return {"train": FakeHFDataset({"img": rng.integers(0, 256, (22, 32, 32, 3), dtype=np.uint8),
                                        "label": np.arange(22) % 10}),
                "test": FakeHFDataset({"img": rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8),
                                       "label": np.arange(7) % 10})}
    return {"train": FakeHFDataset({"image": rng.integers(0, 256, (14, 28, 28), dtype=np.uint8),
                                    "label": np.arange(14) % 10})}


class _DatasetDict(dict):
    def with_format(self, kind):
        return _DatasetDict({k: v.with_format(kind) for k, v in self.items()})


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
        return {"image": img, "label": element["label"]}


def get_cifar10_train_val_loaders(train_batch_size, val_batch_size, num_epochs, seed, train_worker_count=4,
                                  val_worker_count=1, val_split=0.1):
    ds = _DatasetDict(load_dataset("cifar10"))
    ds = ds.with_format("numpy")
    if val_split > 0:
        split_dataset = ds["train"].train_test_split(test_size=val_split, seed=seed)
        train_ds = split_dataset["train"]
        val_ds = split_dataset["test"]
    else:
        train_ds = ds["train"]
        val_ds = None
    train_loader = grain.load(train_ds, num_epochs=num_epochs, shuffle=True, seed=seed, drop_remainder=True,
                              batch_size=train_batch_size, worker_count=train_worker_count,
                              transformations=[_Augment(), _Normalize()])
    val_loader = None
    if val_ds is not None:
        val_loader = grain.load(val_ds, shuffle=False, num_epochs=1, batch_size=val_batch_size,
                                worker_count=val_worker_count, transformations=[_Normalize()])
    return train_loader, val_loader


def get_cifar10_test_loader(batch_size, worker_count=4):
    ds = _DatasetDict(load_dataset("cifar10")).with_format("numpy")
    return grain.load(ds["test"], shuffle=False, num_epochs=1, batch_size=batch_size, worker_count=worker_count,
                      transformations=[_Normalize()])


# data_loaders/mnist.py
class _MNISTNormalize(grain.MapTransform):
    def map(self, element):
        img = element.get("image", element.get("img"))
        img = img.astype(np.float32) / 255.0
        img = img + np.random.rand(*img.shape) / 255.0
        img = (img - 0.5) * 2.0
        return img.flatten()


class _Reshape(grain.MapTransform):
    def map(self, element):
        return element.reshape(28, 28, 1)


class _Pad(grain.MapTransform):
    def map(self, element):
        return np.pad(element, ((2, 2), (2, 2), (0, 0)))


def get_mnist_dataset(train_batch_size, num_epochs, seed, train_worker_count=4):
    ds = _DatasetDict(load_dataset("mnist")).with_format("numpy")["train"]
    return grain.load(ds, num_epochs=num_epochs, shuffle=True, seed=seed, drop_remainder=True,
                      batch_size=train_batch_size, worker_count=train_worker_count,
                      transformations=[_MNISTNormalize(), _Reshape(), _Pad()])


# diffusion/train_diffusion.py
def fast_forward_iterator(iterator, n_steps):
    if n_steps > 0:
        next(itertools.islice(iterator, n_steps, n_steps), None)


def pixels(batch):
    """MNIST's uint8 pixels back from a normalized batch (the dequantization noise is below one level)."""
    return np.floor((batch / 2.0 + 0.5) * 255).reshape(batch.shape[0], -1).sum(axis=1).astype(int).tolist()


def digest(batch):
    """What the training step sees of a batch: shapes, dtype, labels and per-image sums."""
    if isinstance(batch, dict):
        images, labels = batch["image"], batch["label"].tolist()
    else:
        images, labels = batch, None
    rows = images.reshape(images.shape[0], -1).sum(axis=1)
    return {"shape": list(images.shape), "dtype": str(images.dtype), "label": labels,
            "sums": [round(float(s), 6) for s in rows]}
'''


# baseline/train_sgd.py's loop (an epoch ends at (step + 1) % steps_per_epoch
# == 0, the validation loader is read there) and baseline/test.py's test
# loader read once per seed; diffusion/train_diffusion.py's MNIST loader and
# its "resume" through fast_forward_iterator.
VI_THESIS_RUN = r'''
results = {}
train_ds, val_ds = get_cifar10_train_val_loaders(train_batch_size=4, val_batch_size=3, num_epochs=2, seed=7,
                                                 train_worker_count=0, val_worker_count=0)
num_steps_per_epoch = len(train_ds._data_source) // 4
results["steps_per_epoch"] = num_steps_per_epoch
train, epochs = [], []
for step, batch in enumerate(train_ds):
    train.append(digest(batch))
    if (step + 1) % num_steps_per_epoch == 0:
        epochs.append([digest(v) for v in val_ds])
results["train"], results["val_at_epoch_end"] = train, epochs

test_ds = get_cifar10_test_loader(batch_size=3, worker_count=0)
results["test_per_seed"] = [[digest(b) for b in test_ds] for seed in range(2)]


def plain_eq(a, b):
    return [digest(x) for x in a] == [digest(x) for x in b]


reference, restores = restore_at_every_step(
    lambda: get_cifar10_train_val_loaders(4, 3, 2, 7, train_worker_count=0, val_worker_count=0)[0])
results["restores"] = restores
it = iter(train_ds)
next(it)
next(it)
results["state_after_2"] = json.loads(it.get_state().decode())

np.random.seed(0)
images = get_mnist_dataset(train_batch_size=4, num_epochs=2, seed=0, train_worker_count=0)
results["mnist_len_source"] = len(images._data_source)
np.random.seed(0)
uninterrupted = [digest(b) for b in images]
np.random.seed(0)
fast_forward_iterator(images, 2)
resumed = []
for step, batch in enumerate(images, start=2 + 1):
    resumed.append((step, pixels(batch)))
results["mnist"] = uninterrupted
np.random.seed(0)
results["mnist_pixels"] = [pixels(b) for b in images]
results["mnist_resumed"] = resumed
'''


def test_vi_thesis_cifar10_and_mnist_loaders_train_loop_and_restores_as_on_grain():
  """variational-inference-thesis: grain.load train / val / test loaders, the epoch loop, states at every step."""
  source = "import json\n" + VI_THESIS + porting.RESTORE_AT_EVERY_STEP + VI_THESIS_RUN
  g, l = porting.run_both_grain_keys(source)
  assert l == g
  assert g["steps_per_epoch"] == 5  # 22 rows, 2 in the validation split, 20 // 4
  assert len(g["train"]) == 10 and all(d["shape"] == [4, 32, 32, 3] and d["dtype"] == "float64" for d in g["train"])
  # Each epoch sees the 20 training rows once, in another order and with other crops.
  first, second = g["train"][:5], g["train"][5:]
  assert sorted(x for d in first for x in d["label"]) == sorted(x for d in second for x in d["label"])
  assert [d["label"] for d in first] != [d["label"] for d in second]
  assert len(g["val_at_epoch_end"]) == 2 and g["val_at_epoch_end"][0] == g["val_at_epoch_end"][1]
  assert [d["shape"][0] for d in g["val_at_epoch_end"][0]] == [2]  # 2 rows, a partial batch kept
  first_seed, second_seed = g["test_per_seed"]
  assert first_seed == second_seed and [d["shape"][0] for d in first_seed] == [3, 3, 1]
  assert g["restores"] == [[True, True]] * 11
  assert g["state_after_2"]["last_seen_indices"] == {"0": 7} and g["state_after_2"]["worker_count"] == 0
  assert g["mnist_len_source"] == 14
  mnist = g["mnist"]
  assert len(mnist) == 7 and all(d["shape"] == [4, 32, 32, 1] and d["dtype"] == "float64" for d in mnist)
  assert len({tuple(d["sums"]) for d in mnist}) == 7  # 14 rows, 2 epochs, batches of 4
  # fast_forward_iterator makes a new iterator of the DataLoader and drops it:
  # the "resumed" loop numbers its steps from 3 but starts at the first batch.
  # (The dropped iterator's read-ahead threads may still draw from the global
  # np.random, on both libraries: only the noise-free pixels are compared.)
  assert [s for s, _ in g["mnist_resumed"]] == list(range(3, 10))
  assert [p for _, p in g["mnist_resumed"]] == g["mnist_pixels"]
  assert len({tuple(p) for p in g["mnist_pixels"]}) == 7


def test_vi_thesis_test_loader_batch_of_mixed_image_sizes_fails_as_on_grain():
  """variational-inference-thesis: a test split with one 28x28 image among 32x32 ones fails the batch on both."""
  source = VI_THESIS + r'''
split = FakeHFDataset({"img": np.zeros((5, 32, 32, 3), np.uint8), "label": np.arange(5)})
split._columns["img"] = list(split._columns["img"])
split._columns["img"][3] = np.zeros((28, 28, 3), np.uint8)
loader = grain.load(split, shuffle=False, num_epochs=1, batch_size=2, worker_count=0, transformations=[_Normalize()])
seen, error = [], None
try:
    for batch in loader:
        seen.append(batch["label"].tolist())
except Exception as e:  # the client has no handler: the training script stops here
    error = (type(e).__name__, str(e))
'''
  g, l = porting.run_both(source)
  assert l.seen == g.seen == [[0, 1]]
  prefix = "Expected all input elements to have the same structure but got:"
  assert g.error[0] == l.error[0] == "ValueError"
  # Grain's words first in loader's message, which goes on to name the leaf and shapes.
  assert g.error[1].startswith(prefix) and l.error[1].startswith(prefix)
  assert "different shapes [(28, 28, 3), (32, 32, 3)]" in l.error[1]


# The client's defaults: two training workers, one validation worker, under
# `if __name__ == "__main__"`; beside it the same loaders without workers and
# the per-record stream (batch_size=None) to tell how Grain's workers batch.
VI_THESIS_WORKERS_MAIN = r'''
import json

from absl import flags

flags.FLAGS.mark_as_parsed()


def records(loader):
    return [(int(r["label"]), round(float(r["image"].sum()), 6)) for r in loader]


def rows(batches):
    return [[(l, s) for l, s in zip(d["label"], d["sums"])] for d in batches]


if __name__ == "__main__":
    out = {}
    for workers in (0, 2):
        train_ds, val_ds = get_cifar10_train_val_loaders(4, 3, 2, 7, train_worker_count=workers,
                                                         val_worker_count=1 if workers else 0)
        out[f"train/{workers}"] = rows([digest(b) for b in train_ds])
        out[f"val/{workers}"] = rows([digest(b) for b in val_ds])
        it = iter(train_ds)
        next(it)
        state = it.get_state()
        it2 = iter(get_cifar10_train_val_loaders(4, 3, 2, 7, train_worker_count=workers,
                                                 val_worker_count=1 if workers else 0)[0])
        it2.set_state(state)
        out[f"restored/{workers}"] = rows([digest(b) for b in it2])
    ds = _DatasetDict(load_dataset("cifar10")).with_format("numpy")["train"].train_test_split(test_size=0.1, seed=7)
    out["records"] = records(grain.load(ds["train"], num_epochs=2, shuffle=True, seed=7, worker_count=0,
                                        transformations=[_Augment(), _Normalize()]))
    print(json.dumps(out))
'''


@pytest.mark.timeout(240)
def test_vi_thesis_loaders_with_the_clients_worker_processes(tmp_path):
  """variational-inference-thesis: train_worker_count=2 / val_worker_count=1 as a script; resumed after a batch."""
  source = VI_THESIS + VI_THESIS_WORKERS_MAIN
  g, l = (porting.run_script(source, lib, tmp_path, timeout=150) for lib in porting.LIBS)
  records = [tuple(r) for r in g["records"]]
  assert l["records"] == g["records"] and len(records) == 40

  def chunks(seq, n):
    return [[list(r) for r in seq[i:i + n]] for i in range(0, len(seq) - n + 1, n)]

  no_workers = chunks(records, 4)
  assert g["train/0"] == l["train/0"] == no_workers and len(no_workers) == 10
  # Grain 0.2.18: worker k reads records k, k + 2, ... of the sampler's
  # stream, batches them by 4 (dropping its own remainder) and the workers'
  # batches alternate. The augmented records are the same (rng per record).
  share = [chunks(records[k::2], 4) for k in (0, 1)]
  assert g["train/2"] == [b for pair in zip(*share) for b in pair]
  # README (DataLoader): loader's stream is the same whatever worker_count.
  assert l["train/2"] == no_workers
  # Restored after one batch: the rest of each library's own stream.
  assert g["restored/0"] == l["restored/0"] == l["restored/2"] == no_workers[1:]
  assert g["restored/2"] == g["train/2"][1:]
  # One validation worker: Grain's stream with one worker is its stream without.
  assert g["val/0"] == g["val/2"] == l["val/0"] == l["val/2"] and len(g["val/0"]) == 1


# ---------------------------------------------------------------------------
# A Flax NNX image classifier's loops and data module (no repository named)
# ---------------------------------------------------------------------------

HF_CLASSIFIER = r'''
import typing as tp
from dataclasses import dataclass

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def ckpt_save_args(model_state=None, optimizer_state=None, data_iterator=None, key_state=None):
    args_dict = dict()
    if model_state:
        args_dict["model"] = ocp.args.StandardSave(item=model_state)
    if optimizer_state:
        args_dict["optimizer"] = ocp.args.StandardSave(item=optimizer_state)
    if data_iterator:
        args_dict["training_set_iterator"] = grain.checkpoint.CheckpointSave(item=data_iterator)
    if key_state:
        args_dict["key"] = ocp.args.JaxRandomKeySave(item=key_state)
    return ocp.args.Composite(**args_dict)


def ckpt_restore_args(model_state=None, optimizer_state=None, data_iterator=None, key_state=None):
    args_dict = dict()
    if model_state:
        args_dict["model"] = ocp.args.StandardRestore(item=model_state)
    if optimizer_state:
        args_dict["optimizer"] = ocp.args.StandardRestore(item=optimizer_state)
    if data_iterator:
        args_dict["training_set_iterator"] = grain.checkpoint.CheckpointRestore(item=data_iterator)
    if key_state:
        args_dict["key"] = ocp.args.JaxRandomKeyRestore()
    return ocp.args.Composite(**args_dict)


@jax.tree_util.register_dataclass
@dataclass
class Batch:
    """Batch of image and labels."""

    label: jax.Array
    image: jax.Array


def process_image(sample: dict[str, tp.Any]) -> Batch:
    sample["image"] = jnp.expand_dims(jnp.array(sample["image"]), -1).astype(jnp.float32) / 255.0
    return Batch(**sample)


def prepare_dataset(dataset, *, batch_size=32, step_size=None, sharding=None):
    train_dataset = grain.MapDataset.source(dataset).shuffle(42).map(process_image).repeat(None)
    iter_dataset = train_dataset.to_iter_dataset().batch(batch_size)
    if step_size:
        iter_dataset = iter_dataset.batch(step_size)
    if sharding:
        iter_dataset = grain.experimental.device_put(iter_dataset, device=sharding)
    return iter_dataset


class HFRows:
    """A Hugging Face split: rows as new dicts of a uint8 image and an int label."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self._images = rng.integers(0, 256, (n, 6, 6), dtype=np.uint8)
        self._labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, i):
        return {"label": int(self._labels[i]), "image": self._images[i]}


def train_step(params, batch):
    return {"w": params["w"] + jnp.mean(batch.image), "n": params["n"] + jnp.sum(batch.label)}


def train_loop(params, train_dataset, *, steps, seen):
    for _ in range(steps):
        batch = next(train_dataset)
        seen.append(describe(batch))
        params = train_step(params, batch)
    return params


def eval_loop(params, dataset_eval, *, steps):
    return [round(float(jnp.mean(next(dataset_eval).image) + params["w"]), 5) for _ in range(steps)]


def describe(batch):
    return {"type": type(batch).__name__, "label_type": type(batch.label).__name__,
            "image_type": type(batch.image).__name__, "shape": list(np.shape(batch.image)),
            "dtype": str(np.asarray(batch.image).dtype), "label": np.asarray(batch.label).tolist(),
            "sum": round(float(np.asarray(batch.image, dtype=np.float64).sum()), 4),
            "sharding": str(getattr(batch.image, "sharding", None))}
'''

HF_CLASSIFIER_RUN = r'''
mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
train_rows, test_rows = HFRows(10, 0), HFRows(5, 1)
results = {}
for name, kwargs in (("loops", dict(batch_size=4, sharding=sharding)), ("step_size", dict(batch_size=3, step_size=2))):
    train = iter(prepare_dataset(train_rows, **kwargs))
    params = {"w": jnp.zeros(()), "n": jnp.zeros((), jnp.int32)}
    seen = []
    params = train_loop(params, train, steps=3, seen=seen)
    out = {"bool": bool(train), "args": sorted(ckpt_save_args(model_state=params, data_iterator=train).keys())}
    with ocp.CheckpointManager(f"{CKPT}/{name}") as manager:
        manager.save(3, args=ckpt_save_args(model_state=params, data_iterator=train))
        manager.wait_until_finished()
        params = train_loop(params, train, steps=4, seen=seen)
        fresh = iter(prepare_dataset(train_rows, **kwargs))
        template = {"w": jnp.zeros(()), "n": jnp.zeros((), jnp.int32)}
        restored = manager.restore(3, args=ckpt_restore_args(model_state=template, data_iterator=fresh))
    out["same_iterator"] = restored["training_set_iterator"] is fresh
    out["restored_model"] = {k: np.asarray(v).item() for k, v in restored["model"].items()}
    again = []
    train_loop(restored["model"], fresh, steps=4, seen=again)
    out["seen"], out["resumed"] = seen, again
    files = sorted(os.listdir(f"{CKPT}/{name}/3/training_set_iterator"))
    out["files"] = files
    with open(f"{CKPT}/{name}/3/training_set_iterator/{[f for f in files if f.endswith('.json')][0]}") as f:
        out["saved_state"] = json.load(f)
    test = iter(prepare_dataset(test_rows, **kwargs))
    out["eval"] = eval_loop(params, test, steps=3)
    results[name] = out
'''


def test_nnx_classifier_hf_iter_datasets_device_put_and_orbax_composite_as_on_grain(tmp_path):
  """The NNX classifier: Batch dataclasses batched (twice with step_size), device_put, Composite save / restore."""
  source = "import json\nimport os\n" + HF_CLASSIFIER + HF_CLASSIFIER_RUN
  g, l = (porting.grain_keys(porting.run(source, lib, CKPT=str(tmp_path / lib)).results) for lib in porting.LIBS)
  assert l == g
  for name in ("loops", "step_size"):
    out = g[name]
    assert out["bool"] is True and out["args"] == ["model", "training_set_iterator"] and out["same_iterator"]
    assert out["resumed"] == out["seen"][3:], name
    assert out["files"] == ["commit_success.txt", "process_0-of-1.json"]
    assert all(b["type"] == "Batch" for b in out["seen"])
  loops, step = g["loops"]["seen"], g["step_size"]["seen"]
  # device_put: jax arrays on the mesh; without it, batch stacks the jnp leaves into numpy arrays.
  assert {b["image_type"] for b in loops} == {"ArrayImpl"} and "NamedSharding" in loops[0]["sharding"]
  assert {b["image_type"] for b in step} == {"ndarray"} and step[0]["sharding"] == "None"
  assert [b["shape"] for b in loops] == [[4, 6, 6, 1]] * 7 and loops[0]["dtype"] == "float32"
  assert [b["shape"] for b in step] == [[2, 3, 6, 6, 1]] * 7
  # The same shuffled rows batched by 4, or by 3 then by 2.
  flat = [x for b in step for row in b["label"] for x in row]
  assert flat[:28] == [x for b in loops for x in b["label"]]
  # repeat(None) after the shuffle: each epoch is the 10 rows in a new order, batches run across epochs.
  assert sorted(flat[:10]) == sorted(flat[10:20]) and flat[:10] != flat[10:20]
  assert g["loops"]["saved_state"] == {"next_index": 12}


# ---------------------------------------------------------------------------
# A Flax NNX MNIST checkpointing example (DigitClassifier / TrainState)
# ---------------------------------------------------------------------------

MNIST_TRAIN_STATE = r'''
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from grain import DatasetIterator, MapDataset
from grain.checkpoint import (
    CheckpointSave as GrainCheckpointSave,
    CheckpointRestore as GrainCheckpointRestore,
)
from jax import random
import orbax.checkpoint as ocp
from pathlib import Path


def seed_from_key(key):
    a, b = random.key_data(key)
    return int(a ^ b)


class MnistSource:
    """tfds.data_source("mnist", split="train"): rows of a (28, 28, 1) uint8 image and a label."""

    def __init__(self, n=50):
        rng = np.random.default_rng(5)
        self._images = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
        self._labels = np.arange(n) % 10

    def __len__(self):
        return len(self._labels)

    def __getitem__(self, i):
        return {"image": self._images[i], "label": self._labels[i]}


def create_model_and_optimizer(key):
    model = {"w": random.normal(key, (3,))}
    optimizer = {"count": jnp.zeros((), jnp.int32)}
    return model, optimizer


def train_step(model, optimizer, inputs, labels):
    loss = jnp.mean(inputs / 255) + jnp.mean(labels)
    model["w"] = model["w"] - 0.01 * loss
    optimizer["count"] = optimizer["count"] + 1
    return loss


@dataclass
class TrainState:
    model: dict
    optimizer: dict
    rngs: dict
    step: int
    train_iterator: DatasetIterator

    def save(self, manager: ocp.CheckpointManager, **kwargs):
        args = {
            "model": ocp.args.StandardSave(self.model),
            "optimizer": ocp.args.StandardSave(self.optimizer),
            "rngs": ocp.args.StandardSave(self.rngs),
            "train_iterator": GrainCheckpointSave(self.train_iterator),
        }
        manager.save(self.step, args=ocp.args.Composite(**args), **kwargs)

    def restore(self, manager: ocp.CheckpointManager, **kwargs):
        args = {
            "model": ocp.args.StandardRestore(self.model),
            "optimizer": ocp.args.StandardRestore(self.optimizer),
            "rngs": ocp.args.StandardRestore(self.rngs),
            "train_iterator": GrainCheckpointRestore(self.train_iterator),
        }
        restored = manager.restore(step=self.step, args=ocp.args.Composite(**args), **kwargs)
        self.__dict__.update(step=self.step + 1, **restored)


class Preempted(Exception):
    pass


def main(output, num_epochs, checkpoint_every, seed=42, preempt_after=None):
    main_key = random.key(seed)
    model_key, train_key = random.split(main_key)
    train_rngs = {"key": random.key_data(train_key)}
    train_dataset = (
        MapDataset.source(MnistSource())
        .seed(seed_from_key(train_key))
        .shuffle()
        .repeat(num_epochs)
        .batch(8, drop_remainder=True)
    )
    train_data_iterator = iter(train_dataset)
    log = {"len": len(train_dataset), "steps": [], "saved": []}
    output = Path(output).resolve()
    if output.is_dir():
        model, optimizer = create_model_and_optimizer(model_key)
        with ocp.CheckpointManager(output) as checkpoint_manager:
            step = checkpoint_manager.latest_step()
            assert step is not None
            state = TrainState(model, optimizer, train_rngs, step, train_data_iterator)
            state.restore(checkpoint_manager)
            log["restored_step"] = state.step
            log["same_iterator"] = state.train_iterator is train_data_iterator
            log["restored_count"] = int(state.optimizer["count"])
    else:
        model, optimizer = create_model_and_optimizer(model_key)
        state = TrainState(model, optimizer, train_rngs, 0, train_data_iterator)
    with ocp.CheckpointManager(output) as checkpoint_manager:
        for state.step, batch in enumerate(train_data_iterator, start=state.step):
            loss = train_step(state.model, state.optimizer, batch["image"], batch["label"])
            log["steps"].append([state.step, batch["label"].tolist(), list(batch["image"].shape)])
            if checkpoint_every and state.step and state.step % checkpoint_every == 0:
                state.save(checkpoint_manager)
                checkpoint_manager.wait_until_finished()
                log["saved"].append(state.step)
            if preempt_after is not None and state.step == preempt_after:
                raise Preempted(log)
        state.save(checkpoint_manager)
        log["saved"].append(state.step)
    log["final_w"] = [round(float(v), 5) for v in state.model["w"]]
    log["final_count"] = int(state.optimizer["count"])
    log["latest"] = sorted(int(p) for p in os.listdir(output) if p.isdigit())
    return log
'''

MNIST_TRAIN_STATE_RUN = r'''
results = {"uninterrupted": main(f"{OUT}/a", num_epochs=2, checkpoint_every=3)}
try:
    main(f"{OUT}/b", num_epochs=2, checkpoint_every=3, preempt_after=7)
except Preempted as e:
    results["killed"] = e.args[0]
results["resumed"] = main(f"{OUT}/b", num_epochs=2, checkpoint_every=3)
results["files"] = sorted(os.listdir(f"{OUT}/b/6/train_iterator"))  # with orbax's commit_success.txt
with open(f"{OUT}/b/6/train_iterator/" + [f for f in results["files"] if f.endswith(".json")][0]) as f:
    results["saved_state"] = json.load(f)
'''


def test_nnx_mnist_train_state_killed_and_resumed_from_orbax_as_on_grain(tmp_path):
  """The MNIST TrainState example: checkpoints every 3 steps, killed after step 7, resumed at step 7."""
  source = "import json\nimport os\n" + MNIST_TRAIN_STATE + MNIST_TRAIN_STATE_RUN
  g, l = (porting.grain_keys(porting.run(source, lib, OUT=str(tmp_path / lib)).results) for lib in porting.LIBS)
  assert l == g
  whole, killed, resumed = g["uninterrupted"], g["killed"], g["resumed"]
  assert whole["len"] == 12 and [s for s, _, _ in whole["steps"]] == list(range(12))
  assert whole["saved"] == [3, 6, 9, 11] and killed["saved"] == [3, 6] and resumed["saved"] == [9, 11]
  assert whole["latest"] == resumed["latest"] == [3, 6, 9, 11]
  assert (whole["final_w"], whole["final_count"]) == (resumed["final_w"], resumed["final_count"] + 0)
  assert resumed["restored_step"] == 7 and resumed["same_iterator"] and resumed["restored_count"] == 7
  assert killed["steps"][:7] == whole["steps"][:7]
  assert resumed["steps"] == whole["steps"][7:]
  assert g["saved_state"] == {"next_index": 7}


# ---------------------------------------------------------------------------
# An audio-to-MIDI trainer's dataset loader (no repository named)
# ---------------------------------------------------------------------------

# Its dataset module as written (AudioToMidiSource, collect_and_crop_batch,
# create_dataset_loader); AudioToMidiDatasetLoader / modelutil (audio
# decoding, MIDI rendering) are stand-ins: sample names are the files of a
# directory, and a "mini-batch" of samples is rows of numbers made from the
# names, its size varying as the client's comment says it may.
AUDIO_TO_MIDI = r"""
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grain.python as grain
import jax
import numpy as np


class AudioToMidiDatasetLoader:
    @staticmethod
    def load_sample_names(dataset_dir):
        return sorted(p.stem for p in Path(dataset_dir).glob("*.flac"))

    @staticmethod
    def load_samples(dataset_dir, output_divisions, sample_names, sample_rate, duration, gain=1.0):
        rows = [zlib.crc32(name.encode()) for name in sample_names]
        if rows[0] % 3 == 0:  # "the result may be larger than the mini-batch size"
            rows = rows + rows[:1]
        elif rows[0] % 3 == 1:
            rows = rows[:-1]
        n = int(sample_rate * duration)
        events = np.array([[(r >> k) % 7 for k in range(output_divisions)] for r in rows], np.float32)
        audio = np.array([[((r >> (k % 24)) % 101) / 100 * gain for k in range(n)] for r in rows], np.float32)
        return events, audio, list(sample_names)

    @staticmethod
    def load_samples_with_transformations(dataset_dir, output_divisions, sample_names, sample_rate, duration,
                                          settings):
        return AudioToMidiDatasetLoader.load_samples(dataset_dir, output_divisions, sample_names, sample_rate,
                                                     duration, gain=settings["gain"])


class modelutil:
    @staticmethod
    def DatasetTransfromSettings(**kwargs):
        return {"gain": 1.0 - kwargs["gain_probability"] / 2, **kwargs}


@dataclass(frozen=True)
class TransformSettings:
    gain_probability: float
    noise_probability: float

    def to_modelutils(self):
        return modelutil.DatasetTransfromSettings(gain_probability=self.gain_probability,
                                                  noise_probability=self.noise_probability)


class AudioToMidiSource(grain.RandomAccessDataSource):

    def __init__(self, dataset_dir, output_divisions, sample_rate, audio_duration,
                 transform_settings: Optional[TransformSettings] = None, mini_batch_size=32):
        self.dataset_dir = dataset_dir
        self.sample_rate = sample_rate
        self.audio_duration = audio_duration
        self.mini_batch_size = mini_batch_size
        self.output_divisions = output_divisions
        self.transform_settings = transform_settings
        rng = np.random.default_rng(0xBEEF)
        all_sample_names = np.array(AudioToMidiDatasetLoader.load_sample_names(dataset_dir), dtype=np.object_)
        sample_name_mapping = rng.permutation(len(all_sample_names))
        self.all_sample_names = list(all_sample_names[sample_name_mapping])

    def __getitem__(self, idx):
        mini_batch_start_idx = idx * self.mini_batch_size
        sample_names_slice = slice(mini_batch_start_idx,
                                   min(len(self.all_sample_names), mini_batch_start_idx + self.mini_batch_size))
        samples_to_load = self.all_sample_names[sample_names_slice]
        if self.transform_settings:
            midi_events, audio, sample_names = AudioToMidiDatasetLoader.load_samples_with_transformations(
                self.dataset_dir, self.output_divisions, samples_to_load, self.sample_rate, self.audio_duration,
                self.transform_settings.to_modelutils())
        else:
            midi_events, audio, sample_names = AudioToMidiDatasetLoader.load_samples(
                self.dataset_dir, self.output_divisions, samples_to_load, self.sample_rate, self.audio_duration)
        return midi_events.astype(np.float16), audio.astype(np.float16)

    def __len__(self):
        return int(len(self.all_sample_names) / self.mini_batch_size)


def collect_and_crop_batch(desired_batch_size):
    def crop_or_pad(*xs):
        batched = np.concatenate(xs, axis=0)
        if batched.shape[0] < desired_batch_size:
            padded = np.zeros(tuple([desired_batch_size] + list(batched.shape[1:])))
            padded[0:batched.shape[0], ...] = batched
            batched = padded
        return batched[:desired_batch_size]

    def extend_batch_fn(mini_batches):
        return jax.tree_util.tree_map(crop_or_pad, *mini_batches)
    return extend_batch_fn


def create_dataset_loader(dataset_dir, batch_size, num_workers, num_epochs, sample_rate=16000, duration=5.0,
                          output_divisions=50, transform_settings=None, seed=42):
    mini_batch_size = 4
    source = AudioToMidiSource(dataset_dir, output_divisions=output_divisions, sample_rate=sample_rate,
                               audio_duration=duration, transform_settings=transform_settings,
                               mini_batch_size=mini_batch_size)
    dataset = (
        grain.MapDataset.source(source)
            .seed(seed)
            .repeat(num_epochs)
            .shuffle()
            .batch(batch_size=max(1, int(batch_size / mini_batch_size)), batch_fn=collect_and_crop_batch(batch_size))
    )
    iter_dataset = dataset.to_iter_dataset(grain.ReadOptions(
        num_threads=1,
        prefetch_buffer_size=4,
    )).prefetch(grain.MultiprocessingOptions(
        num_workers=num_workers,
    ))
    return iter(iter_dataset)


def describe(element):
    events, audio = element
    return {"types": [type(events).__name__, type(audio).__name__],
            "ndarrays": [isinstance(events, np.ndarray), isinstance(audio, np.ndarray)], "dtypes": [str(events.dtype), str(audio.dtype)],
            "shapes": [list(events.shape), list(audio.shape)],
            "sums": [round(float(events.astype(np.float64).sum()), 3), round(float(audio.astype(np.float64).sum()), 3)]}


def loader(num_workers, settings=None):
    return create_dataset_loader(DATA_DIR, batch_size=8, num_workers=num_workers, num_epochs=2, sample_rate=40,
                                 duration=0.5, output_divisions=5, transform_settings=settings)
"""

AUDIO_TO_MIDI_RUN = r"""
results = {}
for name, settings in (("plain", None), ("transformed", TransformSettings(gain_probability=0.5, noise_probability=0.1))):
    it = loader(0, settings)
    elements = []
    for element, batch_idx in zip(it, range(100)):  # the client's `zip(iter_dataset, range(batches_to_load))`
        elements.append(describe(element))
    results[name] = elements
it = loader(0)
states = []
for _ in range(4):
    states.append(it.get_state())
    next(it)
restored = {}
for k in (0, 1, 3):
    fresh = loader(0)
    fresh.set_state(states[k])
    restored[k] = [describe(e) for e in fresh]
results["restored"] = restored
results["states"] = states
results["len_source"] = len(AudioToMidiSource(DATA_DIR, 5, 40, 0.5, mini_batch_size=4))
"""


def _audio_dir(tmp_path):
  directory = tmp_path / "logic_dataset"
  directory.mkdir()
  for k in range(27):
    (directory / f"take_{k:03d}.flac").write_bytes(b"")
  return str(directory)


def test_audio_to_midi_mini_batch_source_crop_or_pad_batch_fn_and_prefetch_as_on_grain(tmp_path):
  """audio-to-MIDI loader: mini-batch records, repeat then shuffle, batch_fn concatenating / padding, restores."""
  data_dir = _audio_dir(tmp_path)
  g, l = (porting.grain_keys(porting.run(AUDIO_TO_MIDI + AUDIO_TO_MIDI_RUN, lib, DATA_DIR=data_dir).results)
          for lib in porting.LIBS)
  assert l == g
  assert g["len_source"] == 6  # 27 samples in mini-batches of 4
  plain = g["plain"]
  assert len(plain) == 6  # 2 epochs of 6 mini-batches, 2 mini-batches a batch
  assert all(d["shapes"] == [[8, 5], [8, 20]] and d["types"] == ["ndarray", "ndarray"] for d in plain)
  # crop_or_pad: a batch short of 8 rows is padded into np.zeros' float64; a full one stays float16.
  assert {tuple(d["dtypes"]) for d in plain} == {("float16", "float16"), ("float64", "float64")}
  assert [d["sums"][0] for d in g["transformed"]] == [d["sums"][0] for d in plain]
  assert [d["sums"][1] for d in g["transformed"]] != [d["sums"][1] for d in plain]
  assert all(g["restored"][k] == plain[k:] for k in (0, 1, 3))


AUDIO_TO_MIDI_MAIN = r"""

if __name__ == "__main__":
    import json
    import sys

    from absl import flags

    flags.FLAGS.mark_as_parsed()
    DATA_DIR = sys.argv[1]
    out = {}
    for workers in (0, 2):
        it = loader(workers, TransformSettings(gain_probability=0.5, noise_probability=0.1))
        head = [describe(next(it)) for _ in range(2)]
        state = it.get_state()
        rest = [describe(e) for e in it]
        fresh = loader(workers, TransformSettings(gain_probability=0.5, noise_probability=0.1))
        fresh.set_state(state)
        out[workers] = {"head": head, "rest": rest, "restored": [describe(e) for e in fresh]}
    print(json.dumps(out))
"""


@pytest.mark.timeout(240)
def test_audio_to_midi_loader_with_worker_processes_as_on_grain(tmp_path):
  """audio-to-MIDI loader: `.prefetch(MultiprocessingOptions(num_workers=2))` as a script, resumed after 2 batches."""
  data_dir = _audio_dir(tmp_path)
  g, l = (porting.run_script("DATA_DIR = None\n" + AUDIO_TO_MIDI + AUDIO_TO_MIDI_MAIN, lib, tmp_path, data_dir,
                             timeout=150) for lib in porting.LIBS)
  def without_types(run):
    return {k: [{**d, "types": None} for d in v] for k, v in run.items()}

  assert l["0"] == g["0"]
  for workers in ("0", "2"):
    run = g[workers]
    assert len(run["head"]) == 2 and len(run["rest"]) == 4 and run["restored"] == run["rest"]
    assert all(d["ndarrays"] == [True, True] for v in run.values() for d in v)
  # A 1:1 stream: Grain's workers interleave it back in order, the stream without workers.
  assert without_types(g["2"]) == without_types(g["0"]) == without_types(l["2"])
  # Grain's workers send the leaves as SharedMemoryArray (an np.ndarray subclass);
  # README (`SharedMemoryArray`): in loader they arrive as np.ndarray.
  assert {tuple(d["types"]) for v in g["2"].values() for d in v} == {("SharedMemoryArray", "SharedMemoryArray")}
  assert {tuple(d["types"]) for v in l["2"].values() for d in v} == {("ndarray", "ndarray")}


# ---------------------------------------------------------------------------
# Regression tests for the fixes this round made in loader/
# ---------------------------------------------------------------------------

LOAD_ARGUMENT_ERRORS = r"""
import numpy as np
import grain.python as grain

rows = [{"img": np.zeros((2, 2), np.uint8), "label": i} for i in range(6)]
errors = {}
for name, kwargs in (("no_seed", dict(shuffle=True, num_epochs=1, batch_size=2)),
                     ("negative_workers", dict(num_epochs=1, batch_size=2, worker_count=-1)),
                     ("negative_numpy_workers", dict(num_epochs=1, batch_size=2, worker_count=np.int64(-2)))):
    try:
        grain.load(rows, **kwargs)
        errors[name] = None
    except Exception as e:
        errors[name] = (type(e).__name__, str(e))
for name, kwargs in (("sampler_no_seed", dict(num_records=6, shuffle=True, num_epochs=1)),):
    try:
        grain.IndexSampler(**kwargs)
        errors[name] = None
    except Exception as e:
        errors[name] = (type(e).__name__, str(e))
try:
    grain.DataLoader(data_source=rows, sampler=grain.IndexSampler(6, grain.NoSharding(), num_epochs=1),
                     worker_buffer_size=-1)
    errors["negative_buffer"] = None
except Exception as e:
    errors["negative_buffer"] = (type(e).__name__, str(e))
"""


def test_load_without_seed_and_negative_worker_counts_fail_in_grains_words():
  """vi-thesis's grain.load / DataLoader arguments gone wrong: Grain's ValueError words first in loader's message.

  Regression: loader said only "IndexSampler(shuffle=True) needs a seed, ..."
  and "worker_count must be an integer >= 0 ..."; a client matching Grain's
  message ("Shuffling requires specifying a seed.", "Worker count should be
  greater than or equal zero.") did not find it.
  """
  g, l = porting.run_both(LOAD_ARGUMENT_ERRORS)
  assert set(g.errors) == set(l.errors) == {"no_seed", "negative_workers", "negative_numpy_workers",
                                             "sampler_no_seed", "negative_buffer"}
  for name, (kind, message) in g.errors.items():
    assert l.errors[name][0] == kind == "ValueError", name
    assert l.errors[name][1].startswith(message), (name, message, l.errors[name][1])
  assert g.errors["no_seed"][1] == g.errors["sampler_no_seed"][1] == "Shuffling requires specifying a seed."
  assert g.errors["negative_workers"][1] == "Worker count should be greater than or equal zero.Current worker_count is -1."
  assert "(got worker_count=-2)" in l.errors["negative_numpy_workers"][1]
