"""Round 21's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

A "Flax NNX: Data Loading with Grain" guide script (basics/data_loading_grain.py):
`import grain.python as grain` inside `try:` / `except ImportError:`, classes
defined under `if GRAIN_AVAILABLE:`, a `RandomAccessDataSource` of numpy
arrays, `DataLoader`s with and without `grain.Batch`, with worker processes,
a stateful `MapTransform` holding a `np.random.RandomState`,
`ShardByJaxProcess(drop_remainder=True)` samplers and loaders counted by
iterating them again (`sum(1 for _ in loader)`).

dew's token datasets module in dew/data (`PackedTokens`): a `pygrain.MapDataset` subclass
(`DocumentChunks`) with its own `__len__` and a `__getitem__` that answers a
slice with `self.slice(index)` and wraps indices past the end, sliced per JAX
process (`documents[i::n]`), `shuffle(seed)`, `repeat(None)` / `repeat(1)`,
and `FirstFitPackIterDataset(shuffle_bins=..., padding_struct=...)` batched
(behind `mp_prefetch` when it has workers); an iterator's state saved
mid-stream and restored.

crossformer's DREAM smoke test (`make_dataset` / `mix_with_bg`): an endless
shuffled robot stream read with `ReadOptions(num_threads=32,
prefetch_buffer_size=1024)`, mapped with `functools.partial`, zipped with an
endless shuffled background-image stream by
`grain.experimental.ZipIterDataset(strict=False)`, dicts merged, a
`seed(...).random_map(partial(add_bg, prob=...))`, batched, each batch made a
global `jax.Array` by `multihost_utils.host_local_array_to_global_array`, and
`ThreadPrefetchIterDataset` over it; states saved and restored.

birdjepa's data.py (`make_shuffled_dataloader`): file paths shuffled by
`MapDataset.source(paths).seed(seed).shuffle().repeat()`, each path mapped to
an `IterDataset` of its rows (`source.make_shard_iter`),
`InterleaveIterDataset(cycle_length=..., iter_buffer_size=2)`,
`WindowShuffleIterDataset`, a decode that returns `None` for bad rows
filtered out, `batch(batch_size=..., drop_remainder=...)` and `mp_prefetch`.

crossformer's data/grain/pipelines.py: episodes as a `MapDataset` shuffled
and mapped in place, `FlatMapIterDataset` with a `FlatMapTransform` cutting
each episode into its frames (the client's later-Grain `.flat_map`),
`WindowShuffleIterDataset` across episodes, attributes set on datasets, and
`IterDataset` subclasses whose `__iter__` is a generator over their parents
(a weighted mixture, a buffer shuffle, a flattening): Grain 0.2.18 refuses
those where loader iterates them (README, "Accepted where Grain 0.2.18 raises
an AttributeError"), so loader's mixture is checked against the client's
Python over Grain's per-dataset frames.

Each snippet is the client's code, trimmed, with generated local data in place
of MNIST-like arrays, token files, robot and COCO images, Xeno-Canto Arrow
shards and robot episodes. Scripts with worker processes run as `__main__` in
a fresh process; with workers, Grain's DataLoader batches and `mp_prefetch`
streams change with the worker count and loader's do not (README, "Worker-
count-invariant batching"), so loader's worker runs are compared with Grain's
run without workers.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import porting


# basics/data_loading_grain.py, as written less the printed essays and
# flax's unused import; `np.random.seed(0)` makes its generated data the same
# on both runs, sizes are smaller, and the worker count comes from argv
# (`WORKERS`, the guide's 2).
FLAX_NNX_GRAIN_GUIDE = """
import jax
import jax.numpy as jnp
import numpy as np
from typing import Iterator, Dict, Any
import functools


import sys
from pathlib import Path

# Add parent directory to path for shared imports
sys.path.insert(0, str(Path(__file__).parent.parent))

WORKERS = int(sys.argv[1])
np.random.seed(0)

# Note: Grain is under active development
# Install with: pip install grain-nightly
try:
    import grain.python as grain
    GRAIN_AVAILABLE = True
except ImportError:
    print("Warning: Grain not available. Install with: pip install grain-nightly")
    GRAIN_AVAILABLE = False


if GRAIN_AVAILABLE:
    class NumpyArraySource(grain.RandomAccessDataSource):
        \"\"\"Simple data source from numpy arrays.\"\"\"

        def __init__(self, images: np.ndarray, labels: np.ndarray):
            self.images = images
            self.labels = labels

        def __len__(self):
            return len(self.images)

        def __getitem__(self, index):
            return {
                'image': self.images[index],
                'label': self.labels[index]
            }


def create_simple_grain_loader():
    num_samples = 100
    images = np.random.randn(num_samples, 28, 28, 1).astype(np.float32)
    labels = np.random.randint(0, 10, num_samples)
    source = NumpyArraySource(images, labels)
    sampler = grain.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=42,
        num_epochs=1,
        shard_options=grain.NoSharding()
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=0,  # 0 for single-process
        worker_buffer_size=1,
    )
    batch = next(iter(loader))
    print(f"Batch image shape: {batch['image'].shape}")
    print(f"Batch label shape: {batch['label'].shape}")
    print(f"Element: label {int(batch['label'])}, image sum {float(batch['image'].sum()):.4f}")
    return loader


def create_batched_grain_loader(batch_size: int = 32):
    num_samples = 640
    images = np.random.randn(num_samples, 28, 28, 1).astype(np.float32)
    labels = np.random.randint(0, 10, num_samples)
    source = NumpyArraySource(images, labels)
    sampler = grain.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=42,
        num_epochs=1,
        shard_options=grain.NoSharding()
    )
    batch_fn = grain.Batch(batch_size=batch_size, drop_remainder=True)
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=WORKERS,  # Use multiple workers
        worker_buffer_size=2,
        operations=[batch_fn]
    )
    batch = next(iter(loader))
    print(f"Batch size: {batch_size}")
    print(f"Batched image shape: {batch['image'].shape}")
    print(f"Batched label shape: {batch['label'].shape}")
    print(f"Labels: {batch['label'].tolist()}")
    num_batches = sum(1 for _ in loader)
    print(f"Total batches: {num_batches}")
    return loader


if GRAIN_AVAILABLE:
    class NormalizeTransform(grain.MapTransform):
        \"\"\"Normalize images to [0, 1] range.\"\"\"

        def map(self, element):
            element['image'] = element['image'] / 255.0
            return element


    class AugmentTransform(grain.MapTransform):
        \"\"\"Apply data augmentation.\"\"\"

        def __init__(self, rng_seed: int = 0):
            self.rng = np.random.RandomState(rng_seed)

        def map(self, element):
            image = element['image']
            if self.rng.rand() > 0.5:
                image = np.fliplr(image)
            brightness_factor = self.rng.uniform(0.8, 1.2)
            image = np.clip(image * brightness_factor, 0, 1)
            element['image'] = image.astype(np.float32)
            return element


def create_grain_with_transforms(batch_size: int = 32):
    num_samples = 320
    images = np.random.randint(0, 256, (num_samples, 28, 28, 1), dtype=np.uint8)
    labels = np.random.randint(0, 10, num_samples)
    source = NumpyArraySource(images, labels)
    sampler = grain.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=42,
        num_epochs=1,
        shard_options=grain.NoSharding()
    )
    operations = [
        NormalizeTransform(),
        AugmentTransform(rng_seed=42),
        grain.Batch(batch_size=batch_size, drop_remainder=True)
    ]
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=0,
        worker_buffer_size=2,
        operations=operations
    )
    batch = next(iter(loader))
    print(f"Transformed batch shape: {batch['image'].shape}")
    print(f"Image value range: [{batch['image'].min():.3f}, {batch['image'].max():.3f}]")
    print(f"Image mean: {float(batch['image'].mean()):.6f}")
    return loader


def create_multi_epoch_loader(batch_size: int = 32, num_epochs: int = 3):
    num_samples = 100
    images = np.random.randn(num_samples, 28, 28, 1).astype(np.float32)
    labels = np.random.randint(0, 10, num_samples)
    source = NumpyArraySource(images, labels)
    sampler = grain.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=42,
        num_epochs=num_epochs,  # Multiple epochs
        shard_options=grain.NoSharding()
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=0,
        operations=[grain.Batch(batch_size=batch_size, drop_remainder=True)]
    )
    total_batches = sum(1 for _ in loader)
    expected_batches_per_epoch = num_samples // batch_size
    print(f"Expected batches per epoch: {expected_batches_per_epoch}")
    print(f"Number of epochs: {num_epochs}")
    print(f"Total batches: {total_batches}")
    return loader


def create_sharded_loader(batch_size: int = 32, num_devices: int = 4):
    num_samples = 200
    images = np.random.randn(num_samples, 28, 28, 1).astype(np.float32)
    labels = np.random.randint(0, 10, num_samples)
    source = NumpyArraySource(images, labels)
    loaders = []
    for device_id in range(num_devices):
        shard_options = grain.ShardByJaxProcess(drop_remainder=True)
        sampler = grain.IndexSampler(
            num_records=len(source),
            shuffle=True,
            seed=42,
            num_epochs=1,
            shard_options=shard_options
        )
        loader = grain.DataLoader(
            data_source=source,
            sampler=sampler,
            worker_count=0,
            operations=[grain.Batch(batch_size=batch_size, drop_remainder=True)]
        )
        loaders.append(loader)
    print(f"Created {num_devices} sharded loaders")
    batch = next(iter(loaders[0]))
    print(f"Batch shape from device 0: {batch['image'].shape}")
    print(f"Labels from device 3: {next(iter(loaders[3]))['label'].tolist()}")
    return loaders


if GRAIN_AVAILABLE:
    class FileBasedSource(grain.RandomAccessDataSource):
        \"\"\"Data source that loads from files.\"\"\"

        def __init__(self, file_paths: list, labels: list):
            self.file_paths = file_paths
            self.labels = labels

        def __len__(self):
            return len(self.file_paths)

        def __getitem__(self, index):
            image = np.random.randn(28, 28, 1).astype(np.float32)
            return {
                'image': image,
                'label': self.labels[index],
                'path': self.file_paths[index]
            }


def create_file_based_loader(batch_size: int = 16):
    num_files = 64
    file_paths = [f"/data/image_{i:05d}.png" for i in range(num_files)]
    labels = np.random.randint(0, 10, num_files)
    source = FileBasedSource(file_paths, labels)
    sampler = grain.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=42,
        num_epochs=1,
        shard_options=grain.NoSharding()
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        worker_count=WORKERS,
        operations=[grain.Batch(batch_size=batch_size, drop_remainder=True)]
    )
    batch = next(iter(loader))
    print(f"Batch image shape: {batch['image'].shape}")
    print(f"Batch label shape: {batch['label'].shape}")
    print(f"Sample paths: {[str(p) for p in batch['path'][:3]]}")
    return loader


def main():
    if not GRAIN_AVAILABLE:
        print("Grain is not installed!")
        return
    simple_loader = create_simple_grain_loader()
    batched_loader = create_batched_grain_loader(batch_size=64)
    transform_loader = create_grain_with_transforms(batch_size=32)
    multi_epoch_loader = create_multi_epoch_loader(batch_size=32, num_epochs=3)
    sharded_loaders = create_sharded_loader(batch_size=32, num_devices=4)
    file_loader = create_file_based_loader(batch_size=16)
    print("All Grain examples completed!")


if __name__ == "__main__":
    main()
"""


def test_flax_nnx_grain_guide_data_loaders_as_on_grain(tmp_path):
  grain_out = porting.script_output(FLAX_NNX_GRAIN_GUIDE, "grain", tmp_path, "0")
  assert porting.script_output(FLAX_NNX_GRAIN_GUIDE, "loader", tmp_path, "0") == grain_out
  lines = grain_out.splitlines()
  assert "Batch image shape: (28, 28, 1)" in lines and "Batch label shape: ()" in lines
  assert "Total batches: 10" in lines and "Total batches: 9" in lines  # 640 // 64; 3 epochs of 100 // 32.
  assert "Batch shape from device 0: (32, 28, 28, 1)" in lines and lines[-1] == "All Grain examples completed!"
  # The guide's two loaders with worker processes (its `worker_count=2`):
  # loader's batches are Grain's without workers (README, "Worker-count-
  # invariant batching").
  assert porting.script_output(FLAX_NNX_GRAIN_GUIDE, "loader", tmp_path, "2") == grain_out


# dew/data/tokens.py's chunk_counts, DocumentChunks and PackedTokens.load's
# `stream` as written (a function of the spec's fields here), over a
# TokenDocumentSource stand-in: documents cut from a generated token array at
# the eos ids. `main()` reads train batches, saves a state, restores it into a
# fresh iterator, and reads a bounded val pass twice.
DEW_PACKED_TOKENS = """
import itertools

import grain.python as pygrain
import jax
import numpy as np


def chunk_counts(lengths, chunk_len: int):
    return -(-np.asarray(lengths, np.int64) // chunk_len)


class DocumentChunks(pygrain.MapDataset):

    def __init__(self, parent: pygrain.MapDataset, lengths, chunk_len: int):
        super().__init__(parent)
        self._chunk_len = chunk_len
        lengths = np.asarray(lengths, np.int64)
        counts = chunk_counts(lengths, chunk_len)
        self._document = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
        first_chunk = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._offset = (np.arange(len(self._document), dtype=np.int64)
                        - first_chunk[self._document]) * chunk_len

    def __len__(self) -> int:
        return len(self._document)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        index = index % len(self)
        text = self._parent[int(self._document[index])]["text"]
        start = int(self._offset[index])
        return {"text": text[start:start + self._chunk_len]}


class TokenDocumentSource:  # sources/text.py stand-in: documents between eos ids.
    def __init__(self, tokens, eos=0):
        cuts = np.flatnonzero(tokens == eos) + 1
        self._docs = [d for d in np.split(tokens, cuts) if len(d)]
        self.lengths = np.array([len(d) for d in self._docs])

    def __len__(self):
        return len(self._docs)

    def __getitem__(self, i):
        return {"text": self._docs[i].astype(np.int32)}


def make_stream(seq_len, seed, packing_bins, per_process, workers=0, worker_buffer=1):
    window = seq_len + 1

    def stream(source, shuffle, epochs):
        documents = DocumentChunks(
            pygrain.MapDataset.source(source), source.lengths, window)
        documents = documents[jax.process_index()::jax.process_count()]
        if shuffle:
            documents = documents.shuffle(seed)
        documents = documents.repeat(epochs)
        reads = documents.to_iter_dataset()
        if workers:
            reads = reads.mp_prefetch(pygrain.MultiprocessingOptions(
                num_workers=workers, per_worker_buffer_size=worker_buffer))
        from grain.experimental import FirstFitPackIterDataset
        packed = FirstFitPackIterDataset(
            reads,
            length_struct={"text": window},
            num_packing_bins=packing_bins,
            seed=seed,
            shuffle_bins=shuffle,
            padding_struct={"text": 0},
        )
        return iter(packed.batch(per_process, drop_remainder=True))

    return stream


def main(workers=0):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 50, size=400)
    tokens[rng.choice(400, size=30, replace=False)] = 0
    train_source = TokenDocumentSource(tokens[:300])
    val_source = TokenDocumentSource(tokens[300:])
    stream = make_stream(seq_len=11, seed=3, packing_bins=4, per_process=2, workers=workers)
    chunks = DocumentChunks(pygrain.MapDataset.source(train_source), train_source.lengths, 12)
    it = stream(train_source, True, None)
    train = [next(it) for _ in range(4)]
    state = it.get_state()
    rest = [next(it) for _ in range(6)]
    resumed = stream(train_source, True, None)
    resumed.set_state(state)
    val = [list(itertools.islice(stream(val_source, False, 1), 3)) for _ in range(2)]
    return {
        "records": int(chunk_counts(train_source.lengths, 12).sum()),
        "chunks": [len(chunks), chunks[len(chunks) + 1], [c["text"] for c in chunks[2:10:3]]],
        "train": train, "rest": rest, "resumed": [next(resumed) for _ in range(6)], "val": val,
    }


if __name__ == "__main__":
    import json
    import sys
    out = main(int(sys.argv[1]))
    print(json.dumps(jax.tree.map(lambda x: x.tolist() if isinstance(x, np.ndarray) else x, out)))
"""


def test_dew_document_chunks_map_dataset_subclass_packed_as_on_grain(tmp_path):
  g, l = porting.run_both(DEW_PACKED_TOKENS)
  g_out = porting.plain(g.main())
  assert porting.plain(l.main()) == g_out
  assert g_out["resumed"] == g_out["rest"] and g_out["val"][0] == g_out["val"][1]
  assert len(g_out["chunks"][2]) == 3 and g_out["chunks"][0] == g_out["records"]
  assert {tuple(np.shape(b["text"])) for b in g_out["train"]} == {(2, 12)}
  assert set(g_out["train"][0]) == {"text", "text_segment_ids", "text_positions"}
  # The client's `loading.workers` path reads documents under `mp_prefetch`
  # and packs behind it: loader's stream with 2 workers is Grain's without.
  assert porting.run_script(DEW_PACKED_TOKENS, "loader", tmp_path, "2") == g_out


# crossformer's scripts/train/dream.py: make_coco_dataset, add_bg,
# mix_with_bg, make_dataset (mp=0), make_shard_fn and prepare_sample_np as
# written, with small sizes, generated robot records (`cfg.mix.source`, a
# list; unpack_record the identity) and PNG backgrounds in place of COCO.
# `main(data_dir)` reads batches, saves the iterator's state, reads on,
# and restores the state into a fresh iterator.
CROSSFORMER_DREAM = """
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grain
from grain.experimental import ThreadPrefetchIterDataset
import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec
import numpy as np
from PIL import Image


@dataclass
class Mix:
    source: list


@dataclass
class Config:
    seed: int = 0
    raw_size: tuple = (12, 16)
    net_in_size: tuple = (10, 10)
    bs: int = 2
    mix: Mix = None
    mp: int = 0
    n_preshard: int = 2
    coco_prob: float = 0.5
    coco_dir: Path = None


def unpack_record(record):
    return record


def _resize_cover(img, target_w, target_h):
    src_w, src_h = img.size
    scale = max(target_w / src_w, target_h / src_h)
    new_w = max(target_w, round(src_w * scale))
    new_h = max(target_h, round(src_h * scale))
    img = img.resize((new_w, new_h), Image.BILINEAR)
    left = (new_w - target_w) // 2
    top = (new_h - target_h) // 2
    return img.crop((left, top, left + target_w, top + target_h))


def make_coco_dataset(cfg: Config):
    names = sorted(p.name for p in cfg.coco_dir.glob("*.png"))
    if not names:
        raise FileNotFoundError(f"no .png files under {cfg.coco_dir}")
    net_h, net_w = cfg.net_in_size

    def read_bg(name: str):
        img = Image.open(cfg.coco_dir / name).convert("RGB")
        img = _resize_cover(img, net_w, net_h)
        return {"bg": np.asarray(img, dtype=np.uint8)}

    return grain.MapDataset.source(names).seed(cfg.seed).shuffle().repeat().map(read_bg).to_iter_dataset()


def add_bg(x: dict, rng, prob=0.5):
    if rng.random() < prob:
        x["image"] = np.where(x["mask"][..., None] > 0, x["image"], x["bg"])
    x.pop("bg", None)
    return x


def mix_with_bg(robot_ds, coco_ds, cfg: Config):
    ds = grain.experimental.ZipIterDataset([robot_ds, coco_ds], strict=False)
    ds = ds.map(lambda pair: pair[0] | pair[1])
    ds = ds.seed(cfg.seed).random_map(partial(add_bg, prob=cfg.coco_prob))
    return ds


def make_dataset(cfg: Config):
    ds = (
        grain.MapDataset.source(cfg.mix.source)
        .seed(42)
        .shuffle()
        .repeat()
        .map(unpack_record)
        .to_iter_dataset(
            grain.ReadOptions(num_threads=32, prefetch_buffer_size=1024)
        )
    )
    ds = ds.map(partial(prepare_sample_np, cfg))
    if cfg.coco_prob:
        coco = make_coco_dataset(cfg)
        ds = mix_with_bg(ds, coco, cfg)
    ds = ds.batch(cfg.bs, drop_remainder=True)
    shard_fn = make_shard_fn()
    ds = ds.map(shard_fn)
    ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cfg.n_preshard)
    return ds


def make_shard_fn():
    mesh = Mesh(jax.devices(), axis_names="batch")

    def shard_batch(batch):
        return multihost_utils.host_local_array_to_global_array(batch, mesh, PartitionSpec("batch"))

    return shard_batch


def _normalize_kp2d_np(kp2d, h, w):
    return kp2d / np.array([w, h], dtype=np.float32)


def _resize_intrinsics_np(K, in_h, in_w, out_h, out_w):
    sx = out_w / in_w
    sy = out_h / in_h
    S = np.array([[sx, 0.0, 0.0], [0.0, sy, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    return S @ K


def prepare_sample_np(cfg: Config, sample: dict) -> dict:
    raw_h, raw_w = cfg.raw_size
    net_h, net_w = cfg.net_in_size
    image = np.asarray(sample["image"])
    if tuple(image.shape[:2]) != (raw_h, raw_w):
        raise ValueError(f"expected raw_size={(raw_h, raw_w)} but got {tuple(image.shape[:2])}")
    image = np.asarray(Image.fromarray(image).resize((net_w, net_h), Image.BILINEAR))
    mask = np.asarray(Image.fromarray(sample["mask"]).resize((net_w, net_h), Image.NEAREST))
    joints = np.asarray(sample["state"]["joints"], dtype=np.float32)
    gripper = np.asarray([sample["state"]["gripper"]], dtype=np.float32)
    q = np.concatenate([joints, gripper], axis=-1)
    kp2d_raw = np.asarray(sample["state"]["kp2d"], dtype=np.float32)
    kp2d_norm = _normalize_kp2d_np(kp2d_raw, raw_h, raw_w)
    K = np.asarray(sample["camera"]["intr"]["K"], dtype=np.float32)
    return {
        "image": image,
        "mask": mask,
        "q": q,
        "keypoints_2d_norm": kp2d_norm,
        "keypoints_2d_raw": kp2d_raw,
        "keypoints_visible": np.asarray(sample["info"]["kp_visible"], dtype=bool),
        "K": _resize_intrinsics_np(K, raw_h, raw_w, net_h, net_w),
    }


def robot_records(n):
    rng = np.random.default_rng(1)
    return [{
        "image": rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8),
        "mask": (rng.random((12, 16)) > 0.5).astype(np.uint8),
        "state": {"joints": rng.random(6), "gripper": float(i % 2), "kp2d": rng.random((4, 2)) * 10},
        "camera": {"intr": {"K": np.eye(3) * (i + 1)}},
        "info": {"kp_visible": rng.random(4) > 0.3},
    } for i in range(n)]


def main(data_dir):
    cfg = Config(mix=Mix(source=robot_records(7)), coco_dir=Path(data_dir))
    it = iter(make_dataset(cfg))
    first = [jax.tree.map(np.asarray, next(it)) for _ in range(3)]
    state = it.get_state()
    rest = [jax.tree.map(np.asarray, next(it)) for _ in range(5)]
    resumed = iter(make_dataset(cfg))
    resumed.set_state(state)
    return {"first": first, "rest": rest,
            "resumed": [jax.tree.map(np.asarray, next(resumed)) for _ in range(5)],
            "is_jax_array": isinstance(next(it)["image"], jax.Array)}
"""


def test_crossformer_dream_zip_of_endless_streams_with_random_map_as_on_grain(tmp_path):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  for i in range(3):
    Image.fromarray(rng.integers(0, 256, size=(8 + i, 14, 3), dtype=np.uint8)).save(tmp_path / f"bg{i}.png")
  g, l = porting.run_both(CROSSFORMER_DREAM)
  g_out = porting.plain(g.main(str(tmp_path)))
  assert porting.plain(l.main(str(tmp_path))) == g_out
  assert g_out["resumed"] == g_out["rest"] and g_out["is_jax_array"]
  assert np.shape(g_out["first"][0]["image"]) == (2, 10, 10, 3) and "bg" not in g_out["first"][0]


# birdjepa's data.py: make_shuffled_dataloader as written (beartype's
# decorator dropped) over a ShuffledXenoCantoDataset stand-in: `.npy` shards
# of recordings in place of Arrow files, `make_shard_iter` an `IterDataset`
# of a shard's rows, `decode_and_transform` a crop-or-pad and a log
# spectrum-like transform that returns None for empty recordings. argv: data
# dir, worker count.
BIRDJEPA_SHUFFLED = """
import json
import os
import sys

import grain
import numpy as np


class ShuffledXenoCantoDataset:
    def __init__(self, root, max_samples=16):
        self.arrow_fpaths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".npy"))
        self.max_samples = max_samples
        self._rng_seed = 7

    def make_shard_iter(self, fpath):
        rows = np.load(fpath, allow_pickle=True).tolist()
        return grain.MapDataset.source(rows).to_iter_dataset()

    def decode_and_transform(self, row):
        waveform = np.asarray(row["audio"], dtype=np.float32)
        n_samples = len(waveform)
        if n_samples == 0:
            return None
        idx = row["index"]
        rng = np.random.default_rng(self._rng_seed + idx)
        if n_samples > self.max_samples:
            start = rng.integers(0, n_samples - self.max_samples)
            waveform = waveform[start : start + self.max_samples]
        elif n_samples < self.max_samples:
            waveform = np.pad(waveform, (0, self.max_samples - n_samples))
        spec = np.log1p(np.abs(np.fft.rfft(waveform))).astype(np.float32)
        target = row["ebird_code"]
        return {"data": spec, "label": f"species{target}", "target": target, "index": idx}


def make_shuffled_dataloader(
    source,
    *,
    seed: int,
    batch_size: int,
    n_workers: int,
    shuffle: bool,
    drop_last: bool,
    repeat: bool = False,
    shard_index: int = 0,
    shard_count: int = 1,
    window_size: int = 8000,
    cycle_length: int = 4,
):
    arrow_fpaths = source.arrow_fpaths
    if shard_count > 1:
        arrow_fpaths = arrow_fpaths[shard_index::shard_count]

    ds = grain.MapDataset.source(arrow_fpaths).seed(seed)
    if shuffle:
        ds = ds.shuffle()
    if repeat:
        ds = ds.repeat()

    ds = ds.map(source.make_shard_iter)

    ds = grain.experimental.InterleaveIterDataset(
        ds,
        cycle_length=cycle_length,
        iter_buffer_size=2,
    )

    if shuffle and window_size > 0:
        ds = grain.experimental.WindowShuffleIterDataset(
            ds,
            window_size=window_size,
            seed=seed,
        )

    ds = ds.map(source.decode_and_transform)
    ds = ds.filter(lambda x: x is not None)

    ds = ds.batch(batch_size=batch_size, drop_remainder=drop_last)

    if n_workers > 0:
        ds = ds.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=n_workers, per_worker_buffer_size=2
            )
        )

    return ds


def main(root, n_workers):
    source = ShuffledXenoCantoDataset(root)
    train = make_shuffled_dataloader(source, seed=5, batch_size=4, n_workers=n_workers, shuffle=True,
                                     drop_last=True, repeat=True, window_size=6, cycle_length=2)
    it = iter(train)
    train_batches = [next(it) for _ in range(8)]
    evaluation = make_shuffled_dataloader(source, seed=5, batch_size=4, n_workers=n_workers, shuffle=False,
                                          drop_last=False, shard_index=1, shard_count=2)
    def as_json(b):
        return {"data": np.round(b["data"], 4).tolist(), "label": [str(s) for s in b["label"]],
                "target": b["target"].tolist(), "index": b["index"].tolist()}
    return {"train": [as_json(b) for b in train_batches], "eval": [as_json(b) for b in evaluation]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
"""


def _birdjepa_shards(directory):
  rng = np.random.default_rng(3)
  os.makedirs(directory)
  index = 0
  for shard in range(5):
    rows = []
    for _ in range(3 + shard % 3):
      n = 0 if index % 7 == 3 else int(rng.integers(8, 24))
      rows.append({"audio": rng.standard_normal(n).astype(np.float32), "ebird_code": int(rng.integers(0, 9)),
                   "index": index})
      index += 1
    arr = np.empty(len(rows), dtype=object)
    arr[:] = rows
    np.save(os.path.join(directory, f"shard-{shard:03d}.npy"), arr, allow_pickle=True)


def test_birdjepa_interleaved_window_shuffled_shards_as_on_grain(tmp_path):
  data = str(tmp_path / "xc")
  _birdjepa_shards(data)
  g, l = porting.run_both(BIRDJEPA_SHUFFLED)
  g_out = porting.plain(g.main(data, 0))
  assert porting.plain(l.main(data, 0)) == g_out
  # Rows with no audio (indices 3, 10, 17, ...) are filtered out; eval reads
  # shards 1 and 3 (4 + 3 rows, one empty), interleaved row by row, and keeps
  # its short batch.
  assert all(i % 7 != 3 for b in g_out["train"] + g_out["eval"] for i in b["index"])
  assert [b["index"] for b in g_out["eval"]] == [[12, 4, 13, 5], [14, 6]]
  assert len(g_out["train"]) == 8 and {len(b["index"]) for b in g_out["train"]} == {4}
  # With 2 workers under `mp_prefetch`, loader's stream is the one without.
  assert porting.run_script(BIRDJEPA_SHUFFLED, "loader", tmp_path, data, "2") == g_out


# crossformer's data/grain/pipelines.py: apply_trajectory_transforms (its
# default path), _FlattenIterDataset, _BufferShuffleIterDataset,
# apply_frame_transforms, make_single_dataset and make_interleaved_dataset
# as written, with `ds.dataset_statistics` set on a dataset and
# `ds.map(compatibility)` built and dropped. The client targets a later Grain:
# `to_iter_dataset(grain.sources.ReadOptions(...)).flat_map(MyFlatMap())` is
# `FlatMapIterDataset(to_iter_dataset(grain.ReadOptions(...)), MyFlatMap())`
# on 0.2.18, and `IterDataset.repeat()` does not exist there (nor in loader).
# Generated episodes stand in for the ArrayRecord trajectories.
CROSSFORMER_TRAJECTORIES = """
from dataclasses import dataclass
from functools import partial
import logging
from typing import Any, Sequence

import grain
import grain.python as gp
import numpy as np

log = logging.getLogger(__name__)


# crossformer/data/grain/transforms.py and map/window.py, trimmed.
def add_pad_mask_dict(traj):
    traj["observation"]["pad_mask_dict"] = {k: np.ones(len(v), bool) for k, v in traj["observation"].items()}
    return traj


def chunk_action_and_observation(traj, window_size=1, action_horizon=4, override_window_size=None):
    n = len(traj["action"])
    idx = np.minimum(np.arange(n)[:, None] + np.arange(action_horizon)[None], n - 1)
    traj["action"] = traj["action"][idx]
    return traj


def flatten_trajectory(traj):
    n = len(traj["action"])
    for i in range(n):
        yield {"observation": {k: v[i] for k, v in traj["observation"].items() if k != "pad_mask_dict"},
               "action": traj["action"][i], "episode": traj["episode"], "step": i}


class MyFlatMap(gp.experimental.FlatMapTransform):
    max_fan_out = 8

    def flat_map(self, element):
        return list(flatten_trajectory(element))


def apply_trajectory_transforms(ds, *, window_size=1, action_horizon=4, seed=0):
    ds = ds.map(add_pad_mask_dict)
    ds = ds.seed(seed)
    chunk = partial(chunk_action_and_observation, window_size=window_size, action_horizon=action_horizon)
    ds = ds.map(chunk)
    return ds


class _FlattenIterDataset(gp.IterDataset):
    def __init__(self, parent: gp.MapDataset):
        super().__init__(parent)

    def __iter__(self):
        parent_iter = self._parent
        for trajectory in parent_iter:
            yield from flatten_trajectory(trajectory)


class _BufferShuffleIterDataset(gp.IterDataset):
    def __init__(self, parent: gp.IterDataset, buffer_size: int, seed: int):
        super().__init__(parent)
        self._buffer_size = buffer_size
        self._seed = seed

    def __iter__(self):
        rng = np.random.default_rng(self._seed)
        buffer = []
        for element in self._parent:
            buffer.append(element)
            if len(buffer) >= self._buffer_size:
                rng.shuffle(buffer)
                while buffer:
                    yield buffer.pop()
        if buffer:
            rng.shuffle(buffer)
            while buffer:
                yield buffer.pop()


def apply_frame_transforms(ds, frame_transforms=()):
    for fn in frame_transforms:
        ds = ds.map(fn) if fn else ds
    return ds


@dataclass
class GrainDatasetConfig:
    name: str
    source: Any
    batch_size: int | None = None


@dataclass
class GrainDataset:
    dataset: gp.IterDataset
    statistics: Any
    config: GrainDatasetConfig = None


def compatibility(tree: dict):
    tree["observation"]["single_arm"] = np.concatenate([tree["observation"]["proprio"], tree["action"][:1]])


def half_size(tree):  # transforms.resize_frame_images, as strides.
    tree["observation"]["image"] = tree["observation"]["image"][::2, ::2]
    return tree


def make_single_dataset(config, *, train, drop_remainder=True, seed=0):
    ds = grain.MapDataset.source(config.source)
    stats = {"action_mean": float(np.mean([np.mean(t["action"]) for t in config.source]))}
    ds = ds.shuffle(seed=10)
    ds = apply_trajectory_transforms(ds, seed=seed)
    ds = ds.repeat() if train else ds
    read_options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=5_000)
    ds = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(read_options), MyFlatMap())
    ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=1000, seed=42)
    ds = apply_frame_transforms(ds, [half_size])

    def add_mask(tree: dict):
        tree["mask"] = {}
        return tree

    ds = ds.map(add_mask)
    ds.map(compatibility)
    bs = config.batch_size
    ds = ds.batch(bs, drop_remainder=drop_remainder) if bs is not None else ds
    ds.dataset_statistics = stats
    return GrainDataset(dataset=ds, statistics=stats, config=config)


def make_interleaved_dataset(configs, *, train, sample_weights=None, shuffle_buffer_size=1,
                             batch_size=None, drop_remainder=False, seed=0):
    datasets = []
    statistics = {}
    for cfg in configs:
        ds = make_single_dataset(cfg, train=train, seed=seed)
        datasets.append(ds.dataset)
        statistics[cfg.name] = ds.statistics
    if sample_weights is None:
        weights = np.ones(len(datasets), dtype=np.float32)
    else:
        weights = np.asarray(sample_weights, dtype=np.float32)
    weights = weights / weights.sum()

    class _MixtureIterDataset(gp.IterDataset):
        def __init__(self, children: Sequence[gp.IterDataset], probs: np.ndarray):
            super().__init__(children)
            self._children = children
            self._probs = probs

        def __iter__(self):
            rng = np.random.default_rng(seed)
            child_iters = [iter(child) for child in self._children]
            while True:
                choice = rng.choice(len(child_iters), p=self._probs)
                try:
                    yield next(child_iters[choice])
                except StopIteration:
                    return

    mixture_dataset = _MixtureIterDataset(datasets, weights)
    if shuffle_buffer_size and shuffle_buffer_size > 1:
        mixture_dataset = _BufferShuffleIterDataset(mixture_dataset, buffer_size=shuffle_buffer_size, seed=seed)
    if train:
        mixture_dataset = mixture_dataset.repeat()
    if batch_size is not None:
        mixture_dataset = mixture_dataset.batch(batch_size, drop_remainder=drop_remainder)
    mixture_dataset.dataset_statistics = statistics
    return GrainDataset(dataset=mixture_dataset, statistics=statistics)


def episodes(n, offset):
    rng = np.random.default_rng(offset)
    return [{"observation": {"image": rng.integers(0, 255, size=(t, 4, 4), dtype=np.uint8),
                             "proprio": rng.random((t, 3)).astype(np.float32)},
             "action": rng.random((t, 2)).astype(np.float32), "episode": offset + e}
            for e, t in enumerate(rng.integers(2, 5, size=n))]


def error_of(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        return type(e).__name__
    return None


def main():
    single = make_single_dataset(GrainDatasetConfig("bridge", episodes(4, 0), batch_size=3), train=False)
    frames = {name: list(make_single_dataset(GrainDatasetConfig(name, episodes(n, o)), train=False).dataset)
              for name, n, o in [("bridge", 4, 0), ("aloha", 3, 100)]}
    mixed = make_interleaved_dataset(
        [GrainDatasetConfig("bridge", episodes(4, 0)), GrainDatasetConfig("aloha", episodes(3, 100))],
        train=False, sample_weights=[2.0, 1.0], shuffle_buffer_size=4, batch_size=4)
    flatten = _FlattenIterDataset(grain.MapDataset.source(episodes(2, 0)))
    return {
        "single": list(single.dataset), "single_again": list(single.dataset),
        "single_stats": single.dataset.dataset_statistics, "frames": frames,
        "mixed_stats": mixed.dataset.dataset_statistics,
        "train_error": error_of(lambda: make_interleaved_dataset(
            [GrainDatasetConfig("bridge", episodes(2, 0))], train=True)),
        "flatten_window_error": error_of(
            lambda: list(grain.experimental.WindowShuffleIterDataset(flatten, window_size=4, seed=1))),
        "mixed_run": lambda: list(mixed.dataset),
        "flatten_run": lambda: list(_FlattenIterDataset(grain.MapDataset.source(episodes(2, 0)))),
    }
"""


def _mixture(children, probs, seed, buffer_size, batch_size):
  """crossformer's `_MixtureIterDataset` + `_BufferShuffleIterDataset` + batch, over lists."""
  rng, child_iters, mixed = np.random.default_rng(seed), [iter(c) for c in children], []
  while True:
    try:
      mixed.append(next(child_iters[rng.choice(len(child_iters), p=probs)]))
    except StopIteration:
      break
  rng, buffer, shuffled = np.random.default_rng(seed), [], []
  for element in mixed:
    buffer.append(element)
    if len(buffer) >= buffer_size:
      rng.shuffle(buffer)
      shuffled.extend(buffer[::-1])
      buffer = []
  rng.shuffle(buffer)
  shuffled.extend(buffer[::-1])
  return [shuffled[i:i + batch_size] for i in range(0, len(shuffled), batch_size)]


# Grain's iterators that failed in their constructors complain when collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_crossformer_flat_mapped_window_shuffled_frames_and_generator_datasets_as_on_grain():
  g, l = porting.run_both(CROSSFORMER_TRAJECTORIES)
  g_out, l_out = g.main(), l.main()
  run_keys = ("mixed_run", "flatten_run")
  g_plain = porting.plain({k: v for k, v in g_out.items() if k not in run_keys})
  assert porting.plain({k: v for k, v in l_out.items() if k not in run_keys}) == g_plain
  # The client's maps change the source's episodes in place, so a second pass
  # chunks the chunked actions again, on both libraries.
  assert g_plain["single"] != g_plain["single_again"] and g_plain["train_error"] == "AttributeError"
  assert {tuple(np.shape(b["observation"]["image"])) for b in g_plain["single"]} == {(3, 2, 2)}
  assert sorted((f["episode"], f["step"]) for f in g_plain["frames"]["bridge"])[:2] == [(0, 0), (0, 1)]
  # A generator for `__iter__` under a Grain dataset fails on both libraries.
  assert g_plain["flatten_window_error"] == "AttributeError"
  # Grain 0.2.18 refuses an `IterDataset` whose `__iter__` is a generator:
  # iterated directly while no dataset has it as a parent (it wraps it in an
  # output dataset that sets `__next__` on what `__iter__` returns) and under
  # its `batch` (which reads the generator's first element as an iterator).
  # loader iterates it in both places (README, "Accepted where Grain 0.2.18
  # raises an AttributeError"): the
  # client's mixture is then its Python over Grain's own per-dataset frames.
  for name, error, text in [("flatten_run", TypeError, "__next__"), ("mixed_run", AttributeError, "_ctx")]:
    try:
      g_out[name]()
    except error as e:
      assert text in str(e)
    else:
      raise AssertionError(f"Grain 0.2.18 iterated {name}")
  expected = _mixture([g_out["frames"]["bridge"], g_out["frames"]["aloha"]], np.array([2, 1], np.float32) / 3, 0, 4, 4)
  mixed = l_out["mixed_run"]()
  assert porting.plain(mixed) == porting.plain([{k: np.stack([f[k] for f in b]) if k != "observation" else
                                                 {o: np.stack([f[k][o] for f in b]) for o in b[0][k]}
                                                 for k in b[0] if k != "mask"} | {"mask": {}} for b in expected])
  assert len(porting.plain(l_out["flatten_run"]())) == sum(len(e["action"]) for e in l.episodes(2, 0))
