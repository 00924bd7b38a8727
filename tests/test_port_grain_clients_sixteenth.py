"""Round 19's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

keras-team/keras's own Grain code: `GrainDatasetAdapter`
(keras/src/trainers/data_adapters/grain_dataset_adapter.py, with the flows
of its grain_dataset_adapter_test.py): `isinstance` against `MapDataset`,
`IterDataset` and `DataLoader`, the batch size and `KerasTensor` spec read
off the first two batches (`itertools.islice` over the dataset itself),
numpy / JAX iterators made by appending a `grain.transforms.Map` (a
`DataLoader` rebuilt from the original's private `_data_source`,
`_sampler`, `_operations`, `_multiprocessing_options`, `_shard_options` and
`_read_options`), and its import of `SharedMemoryArrayMetadata` from Grain's
private `ipc.shared_memory_array` module; and `image_dataset_from_directory(
format="grain")` (keras/src/utils/image_dataset_utils.py and
dataset_utils.labels_to_dataset_grain): a `ZipMapDataset` of image paths and
one-hot labels made with Keras ops, `shuffle(seed=)`, a PIL-loading map,
`to_iter_dataset().batch(batch_fn=make_batch)` and `class_names` /
`file_paths` set as attributes of the datasets, and its text counterpart
(text_dataset_utils.py: binary labels, a `batch_fn` that leaves strings as
tuples). (Keras's `fit` on loader datasets is tests/test_loader_keras.py.)

google-deepmind/simply beyond simply/data_lib.py (ported in
tests/test_port_grain_clients_fourth.py): simply/utils/seqio_wrapper.py, an
`IterDataset` / `DatasetIterator` pair over a SeqIO stream whose
`set_slice(sl, sequential_slice)` (called by Grain's `mp_prefetch` per
worker) sets the stream's shard, under `mp_prefetch(MultiprocessingOptions(
...))`, its state a `dataclasses.asdict` config and an example counter
replayed on restore; and simply/eval/page_decode_eval.py, a strided
`dataset[i::n]` shard of a `MapDataset.source`, `repeat(n)`, a
`map_with_index` running an asyncio model call per example (`asyncio.run`
in the reading threads), `to_iter_dataset(ReadOptions(num_threads=,
prefetch_buffer_size=))` and the iterator's state saved as JSON every N
examples, the evaluation resuming from the newest state file.

DBraun/magenta-realtime's magenta_rt/sft/export.py (audiotree's author's
fork of magenta-realtime):
`MapDataset.source(files).seed().shuffle().repeat().seed().random_map(
functools.partial(...))`, a filter on the endless MapDataset, a `RandomMap`
instance passed to `.random_map`, `to_iter_dataset(ReadOptions(0, 0))`,
`LimitIterDataset`, `batch(batch_fn=AudioTree.batch)`, `mp_prefetch`,
`WithOptionsIterDataset(DatasetOptions(execution_tracking_mode=
STAGE_TIMING))` and the execution summary through Grain's private
`dataset.get_execution_summary` / `stats.pretty_format_summary`.

AI-Hypercomputer/RecML, google-deepmind/penzai and Physical-Intelligence/
openpi have no Grain usage at their newest public snapshots (RecML names
Grain in its README only); maxdiffusion's Grain usages are all ported in
earlier rounds (tests/test_port_grain_clients_third.py and _sixth.py).
Each snippet is the client's code, trimmed, with generated local data in
place of SeqIO tasks, image, text and audio folders, a model server and a
codec. Scripts with worker processes run as `__main__` on each library in a
fresh process.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests import porting


@pytest.fixture
def keras_on_jax(monkeypatch):
  """Keras with the JAX backend (unless this process imported Keras already: the snippets work with any)."""
  if "keras" not in sys.modules:
    monkeypatch.setenv("KERAS_BACKEND", "jax")


# keras/src/trainers/data_adapters/grain_dataset_adapter.py as written, less
# `get_tf_dataset` (TensorFlow's import alone would take most of this file's
# time) and `get_torch_dataloader` (no torch here), with
# `from keras.src.utils.module_utils import grain` as the plain import it
# lazily stands for; then the flows of grain_dataset_adapter_test.py (seeded
# data in place of np.random) and a shuffled, sharded DataLoader.
KERAS_ADAPTER = """
import itertools

import numpy as np

from keras.src import tree
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.data_adapters.data_adapter import DataAdapter
import grain


class GrainDatasetAdapter(DataAdapter):
    def __init__(self, dataset):
        if not isinstance(
            dataset, (grain.MapDataset, grain.IterDataset, grain.DataLoader)
        ):
            raise ValueError(
                "Expected `dataset` to be a grain.MapDataset, "
                "grain.IterDataset or grain.DataLoader. "
                f"Received: {dataset} of type {type(dataset)}"
            )

        self._dataset = dataset

        batch_size, output_signature = self._get_dataset_info(dataset)
        self._batch_size = batch_size
        self._output_signature = output_signature
        self._output_tf_signature = None

    def _get_dataset_info(self, dataset):
        batches = list(
            itertools.islice(
                dataset, data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC
            )
        )
        output_signature = data_adapter_utils.get_keras_tensor_spec(batches)
        flat_output_signature = tree.flatten(output_signature)
        batch_size = flat_output_signature[0].shape[0]
        if batch_size is not None:
            batch_size = int(batch_size)
        return batch_size, output_signature

    def get_numpy_iterator(self):
        # Workaround for internal change in Grain which isn't a part of a
        # release yet.
        try:
            from grain._src.python.shared_memory_array import (
                SharedMemoryArrayMetadata,
            )
        except ImportError:
            from grain._src.python.ipc.shared_memory_array import (
                SharedMemoryArrayMetadata,
            )

        def convert_to_numpy(x):
            if isinstance(x, (np.ndarray, SharedMemoryArrayMetadata)):
                return x
            else:
                if hasattr(x, "__array__"):
                    if data_adapter_utils.is_torch_tensor(x):
                        x = x.cpu()
                    x = np.asarray(x)
                return x

        class ConvertToNumpy(grain.transforms.Map):
            def map(self, x):
                return tree.map_structure(
                    convert_to_numpy, x, none_is_leaf=False
                )

        if isinstance(self._dataset, (grain.MapDataset, grain.IterDataset)):
            dataset = self._dataset.map(ConvertToNumpy())
        else:
            # Instantiate a new `DataLoader`.
            dataset = grain.DataLoader(
                data_source=self._dataset._data_source,
                sampler=self._dataset._sampler,
                # Append `ConvertToNumpy`.
                operations=list(self._dataset._operations) + [ConvertToNumpy()],
                worker_count=self._dataset._multiprocessing_options.num_workers,
                worker_buffer_size=self._dataset._multiprocessing_options.per_worker_buffer_size,
                shard_options=self._dataset._shard_options,
                read_options=self._dataset._read_options,
                enable_profiling=self._dataset._multiprocessing_options.enable_profiling,
            )
        return dataset

    def get_jax_iterator(self):
        def convert_to_jax_compatible(x):
            if data_adapter_utils.is_scipy_sparse(x):
                x = data_adapter_utils.scipy_sparse_to_jax_sparse(x)
            elif data_adapter_utils.is_tensorflow_sparse(x):
                x = data_adapter_utils.tf_sparse_to_jax_sparse(x)
            return x

        class ConvertToJaxCompatible(grain.transforms.Map):
            def map(self, x):
                return tree.map_structure(
                    convert_to_jax_compatible, x, none_is_leaf=False
                )

        if isinstance(self._dataset, (grain.MapDataset, grain.IterDataset)):
            dataset = self._dataset.map(ConvertToJaxCompatible())
        else:
            # Instantiate a new `DataLoader`.
            dataset = grain.DataLoader(
                data_source=self._dataset._data_source,
                sampler=self._dataset._sampler,
                # Append `ConvertToJaxCompatible`.
                operations=list(self._dataset._operations)
                + [ConvertToJaxCompatible()],
                worker_count=self._dataset._multiprocessing_options.num_workers,
                worker_buffer_size=self._dataset._multiprocessing_options.per_worker_buffer_size,
                shard_options=self._dataset._shard_options,
                read_options=self._dataset._read_options,
                enable_profiling=self._dataset._multiprocessing_options.enable_profiling,
            )
        return dataset

    @property
    def num_batches(self):
        return None

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def has_partial_batch(self):
        return None

    @property
    def partial_batch_size(self):
        return None


class Range2DSource(grain.sources.RandomAccessDataSource):
    def __init__(self, start, stop):
        self.start = start
        self.stop = stop

    def __getitem__(self, idx):
        return np.expand_dims(np.array([self.start + idx]), axis=0)

    def __len__(self):
        return self.stop - self.start


class MySource(grain.sources.RandomAccessDataSource):
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]

    def __len__(self):
        return len(self.x)


class NestedSource(grain.sources.RandomAccessDataSource):
    def __init__(self, data_type):
        rng = np.random.default_rng(1)
        self.x = rng.random((40, 4)).astype("float32")
        self.y = rng.random((40, 2)).astype("float32")
        self.data_type = data_type

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        x = self.x[idx]
        y = self.y[idx]
        if self.data_type == "list":
            return x, y
        elif self.data_type == "dict":
            return {"x": x, "y": y}
        elif self.data_type == "nested_list":
            return x, (x, y)
        elif self.data_type == "nested_dict":
            return {"data": {"x": x, "y": y}}


def _get_dataset(dataset_type, worker_count=0, num_threads=0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(34, 4)).astype("float32")
    y = rng.normal(size=(34, 2)).astype("float32")
    if dataset_type == "map_dataset":
        dataset = grain.MapDataset.source(MySource(x, y)).batch(batch_size=16)
    elif dataset_type == "iter_dataset":
        dataset = grain.MapDataset.source(MySource(x, y)).to_iter_dataset().batch(batch_size=16)
    elif dataset_type == "data_loader":
        source = MySource(x, y)
        dataset = grain.DataLoader(
            data_source=source,
            operations=[grain.transforms.Batch(batch_size=16)],
            shard_options=grain.sharding.NoSharding(),
            sampler=grain.samplers.IndexSampler(num_records=len(source), num_epochs=1),
            worker_count=worker_count,
            read_options=grain.ReadOptions(num_threads=num_threads),
        )
    else:  # A shuffled host shard, as a multi-host Keras user would pass.
        source = MySource(x, y)
        dataset = grain.DataLoader(
            data_source=source,
            operations=[grain.transforms.Batch(batch_size=5, drop_remainder=True)],
            sampler=grain.samplers.IndexSampler(
                num_records=len(source), num_epochs=2, shuffle=True, seed=7,
                shard_options=grain.sharding.ShardOptions(shard_index=1, shard_count=2, drop_remainder=True)),
            worker_count=0,
            read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=4),
        )
    return dataset


def describe(batch):
    return tree.map_structure(
        lambda a: [isinstance(a, np.ndarray), str(a.dtype), list(a.shape), np.round(np.asarray(a, np.float64), 5).tolist()],
        batch)


def spec(adapter):
    return tree.map_structure(lambda t: [list(t.shape), t.dtype], adapter._output_signature)


results = {}
for dataset_type in ("map_dataset", "iter_dataset", "data_loader", "sharded_data_loader"):
    adapter = GrainDatasetAdapter(_get_dataset(dataset_type))
    numpy_it = adapter.get_numpy_iterator()
    jax_it = adapter.get_jax_iterator()
    results[dataset_type] = {
        "sizes": [adapter.num_batches, adapter.batch_size, adapter.has_partial_batch, adapter.partial_batch_size],
        "spec": spec(adapter),
        "numpy": [describe(b) for b in numpy_it],
        "jax": [describe(b) for b in jax_it],
        "numpy_again": [describe(b) for b in numpy_it],  # test_multiple_calling_on_iterators
        "kinds": [isinstance(numpy_it, kind) for kind in (grain.MapDataset, grain.IterDataset, grain.DataLoader)],
    }
for data_type in ("list", "dict", "nested_list", "nested_dict"):
    adapter = GrainDatasetAdapter(grain.MapDataset.source(NestedSource(data_type)).batch(batch_size=4))
    results[data_type] = {"spec": spec(adapter), "jax": [describe(b) for b in itertools.islice(adapter.get_jax_iterator(), 3)]}
num_batches = []
dataset = grain.MapDataset.source(Range2DSource(0, 42))
num_batches.append([GrainDatasetAdapter(dataset).num_batches, spec(GrainDatasetAdapter(dataset))])
dataset = dataset.repeat()  # Infinite cardinality.
num_batches.append([GrainDatasetAdapter(dataset).num_batches, spec(GrainDatasetAdapter(dataset))])
dataset = dataset.filter(lambda x: True)  # Unknown cardinality.
num_batches.append([GrainDatasetAdapter(dataset).num_batches, spec(GrainDatasetAdapter(dataset))])
results["num_batches"] = num_batches
try:
    GrainDatasetAdapter("This is not a grain.Dataset")
except ValueError as e:
    results["invalid"] = str(e)
"""


def test_keras_grain_dataset_adapter_as_on_grain(keras_on_jax):  # pylint: disable=unused-argument,redefined-outer-name
  g, l = porting.run_both(KERAS_ADAPTER)
  assert porting.plain(l.results) == porting.plain(g.results)
  out = g.results
  for i, kind in enumerate(("map_dataset", "iter_dataset", "data_loader")):
    assert out[kind]["sizes"] == [None, 16, None, None]
    assert [b[0][2] for b in out[kind]["numpy"]] == [[16, 4], [16, 4], [2, 4]]
    assert out[kind]["numpy"] == out[kind]["jax"] == out[kind]["numpy_again"]
    assert out[kind]["kinds"] == [j == i for j in range(3)]
  assert len(out["sharded_data_loader"]["numpy"]) == 6 and out["sharded_data_loader"]["sizes"][1] == 5
  assert out["nested_dict"]["spec"] == {"data": {"x": [[4, 4], "float32"], "y": [[4, 2], "float32"]}}
  assert [n[1] for n in out["num_batches"]] == [[[1, 1], "int64"]] * 3
  assert out["invalid"].startswith("Expected `dataset` to be a grain.MapDataset, grain.IterDataset or grain.DataLoader.")


def test_keras_adapter_private_shared_memory_import_ports():
  # What the adapter's `isinstance` check needs of Grain's private module: a
  # class, of which loader's workers (which pass arrays as arrays) make none.
  import grain._src.python.ipc.shared_memory_array as grain_shm  # pylint: disable=g-import-not-at-top

  from loader._src.python.ipc.shared_memory_array import SharedMemoryArrayMetadata  # pylint: disable=g-import-not-at-top
  meta = SharedMemoryArrayMetadata(name="psm_0", shape=(2, 3), dtype=np.float32)
  assert (meta.name, meta.shape) == ("psm_0", (2, 3)) and not isinstance(np.zeros(2), SharedMemoryArrayMetadata)
  assert SharedMemoryArrayMetadata.__name__ == grain_shm.SharedMemoryArrayMetadata.__name__
  assert tuple(SharedMemoryArrayMetadata.__slots__) == tuple(grain_shm.SharedMemoryArrayMetadata.__slots__)


# keras/src/utils/image_dataset_utils.py (`_paths_and_labels_to_dataset_grain`,
# `_load_image_grain`, the `format="grain"` branch of
# `image_dataset_from_directory` with `validation_split` and
# `subset="both"`), keras/src/utils/dataset_utils.py
# (`labels_to_dataset_grain`) and keras/src/utils/grain_utils.py
# (`make_batch`), trimmed to the Grain path; Keras's own `index_directory`
# and `get_training_or_validation_split` list the folder. `directory` holds
# PNGs of several sizes and modes in class folders.
KERAS_DIRECTORY_DATASETS = """
import io
import os
import pathlib

import numpy as np
from PIL import Image as pil_image

from keras.src import backend
from keras.src import tree
from keras.src.utils import dataset_utils
import grain

ALLOWLIST_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def make_batch(values):
    from keras.src import ops

    if not values:
        raise ValueError("Cannot batch 0 values. Please file a bug.")

    with backend.device_scope("cpu"):
        return tree.map_structure(lambda *xs: ops.stack(xs), *values)


def labels_to_dataset_grain(labels, label_mode, num_classes):
    from keras.src import backend
    from keras.src import ops

    if label_mode not in ("binary", "categorical", "int"):
        raise ValueError(
            f"Invalid `label_mode`: {label_mode}. "
            "Expected one of: 'binary', 'categorical', 'int'."
        )

    def preprocess_labels_in_cpu(label_mode, x, num_classes):
        with backend.device_scope("cpu"):
            if label_mode == "binary":
                return ops.expand_dims(
                    ops.convert_to_tensor(x, dtype="float32"), axis=-1
                )
            elif label_mode == "categorical":
                return ops.one_hot(
                    ops.convert_to_tensor(x, dtype="int32"), num_classes
                )
            else:
                return ops.convert_to_tensor(x, dtype="int32")

    label_ds = grain.MapDataset.source(labels)
    label_ds = label_ds.map(
        lambda x: preprocess_labels_in_cpu(label_mode, x, num_classes),
    )
    return label_ds


def _paths_and_labels_to_dataset_grain(
    image_paths, image_size, num_channels, labels, label_mode, num_classes, interpolation, data_format,
    crop_to_aspect_ratio=False, pad_to_aspect_ratio=False, shuffle=False, seed=None,
):
    path_ds = grain.MapDataset.source(image_paths)
    if label_mode:
        label_ds = labels_to_dataset_grain(labels, label_mode, num_classes)
        ds = grain.experimental.ZipMapDataset([path_ds, label_ds])
    else:
        ds = path_ds

    if shuffle:
        ds = ds.shuffle(seed=seed)

    args = (image_size, num_channels, interpolation, data_format, crop_to_aspect_ratio, pad_to_aspect_ratio)
    if label_mode:
        ds = ds.map(lambda data: (_load_image_grain(data[0], *args), data[1]))
    else:
        ds = ds.map(lambda x: _load_image_grain(x, *args))

    return ds


def _load_image_grain(path, image_size, num_channels, interpolation, data_format,
                      crop_to_aspect_ratio=False, pad_to_aspect_ratio=False):
    from keras.src import backend
    from keras.src import ops

    if isinstance(path, io.BytesIO):
        img = pil_image.open(path)
    elif isinstance(path, (pathlib.Path, bytes, str)):
        if isinstance(path, pathlib.Path):
            path = str(path.resolve())
        img = pil_image.open(path)
    else:
        raise TypeError(f"path should be path-like or io.BytesIO, not {type(path)}")
    if num_channels == 1:
        if img.mode not in ("L", "I;16", "I"):
            img = img.convert("L")
    elif num_channels == 4:
        if img.mode != "RGBA":
            img = img.convert("RGBA")
    elif num_channels == 3:
        if img.mode != "RGB":
            img = img.convert("RGB")

    with backend.device_scope("cpu"):
        img = ops.convert_to_tensor(np.array(img), dtype="float32")
        if len(img.shape) == 2:
            img = ops.expand_dims(img, axis=-1)
        if data_format == "channels_first":
            img = ops.transpose(img, (2, 0, 1))
        img = ops.image.resize(img, size=image_size, interpolation=interpolation,
                               crop_to_aspect_ratio=crop_to_aspect_ratio,
                               pad_to_aspect_ratio=pad_to_aspect_ratio, data_format=data_format)
    return img


def image_dataset_from_directory(directory, labels="inferred", label_mode="int", color_mode="rgb",
                                 batch_size=32, image_size=(256, 256), shuffle=True, seed=None,
                                 validation_split=None, subset=None, interpolation="bilinear",
                                 crop_to_aspect_ratio=False, pad_to_aspect_ratio=False,
                                 data_format="channels_last"):
    num_channels = {"rgb": 3, "rgba": 4, "grayscale": 1}[color_mode]
    dataset_utils.check_validation_split_arg(validation_split, subset, shuffle, seed)
    image_paths, labels, class_names = dataset_utils.index_directory(
        directory, labels, formats=ALLOWLIST_FORMATS, shuffle=shuffle, seed=seed, verbose=False)
    common = dict(image_size=image_size, num_channels=num_channels, label_mode=label_mode,
                  num_classes=len(class_names) if class_names else 0, interpolation=interpolation,
                  crop_to_aspect_ratio=crop_to_aspect_ratio, pad_to_aspect_ratio=pad_to_aspect_ratio,
                  data_format=data_format)
    if subset == "both":
        image_paths_train, labels_train = dataset_utils.get_training_or_validation_split(
            image_paths, labels, validation_split, "training")
        image_paths_val, labels_val = dataset_utils.get_training_or_validation_split(
            image_paths, labels, validation_split, "validation")
        train_dataset = _paths_and_labels_to_dataset_grain(
            image_paths=image_paths_train, labels=labels_train, shuffle=shuffle, seed=seed, **common)
        val_dataset = _paths_and_labels_to_dataset_grain(
            image_paths=image_paths_val, labels=labels_val, shuffle=False, **common)
        train_dataset = train_dataset.to_iter_dataset()
        val_dataset = val_dataset.to_iter_dataset()
        if batch_size is not None:
            train_dataset = train_dataset.batch(batch_size, batch_fn=make_batch)
            val_dataset = val_dataset.batch(batch_size, batch_fn=make_batch)

        # Users may need to reference `class_names`.
        train_dataset.class_names = class_names
        val_dataset.class_names = class_names

        # Include file paths for images as attribute.
        train_dataset.file_paths = image_paths_train
        val_dataset.file_paths = image_paths_val
        return [train_dataset, val_dataset]
    image_paths, labels = dataset_utils.get_training_or_validation_split(
        image_paths, labels, validation_split, subset)
    dataset = _paths_and_labels_to_dataset_grain(
        image_paths=image_paths, labels=labels, shuffle=shuffle, seed=seed, **common)
    dataset = dataset.to_iter_dataset()
    if batch_size is not None:
        dataset = dataset.batch(batch_size, batch_fn=make_batch)
    dataset.class_names = class_names
    dataset.file_paths = image_paths
    return dataset


def dump(batch):
    images, labels = batch
    return [type(images).__module__.split(".")[0], list(images.shape), str(images.dtype),
            np.round(np.asarray(images, np.float64).mean(axis=(1, 2, 3)), 3).tolist(), np.asarray(labels).tolist()]


# keras/src/utils/text_dataset_utils.py's Grain path (`make_string_batch` from grain_utils.py).
def make_string_batch(values):
    from keras.src import ops

    if not values:
        raise ValueError("Cannot batch 0 values. Please file a bug.")

    def batch_fn(*xs):
        if isinstance(xs[0], str):
            if backend.backend() == "tensorflow":
                import tensorflow as tf

                xs = [tf.convert_to_tensor(x, dtype=tf.string) for x in xs]
                xs = tf.stack(xs)
            return xs
        else:
            return ops.stack(xs)

    with backend.device_scope("cpu"):
        return tree.map_structure(batch_fn, *values)


def _path_to_string_content_grain(path, max_length):
    with open(path, "r") as f:
        txt = f.read()
    if max_length is not None:
        txt = txt[:max_length]
    return txt


def text_dataset_from_directory(directory, labels="inferred", label_mode="int", batch_size=32, max_length=None,
                                shuffle=True, seed=None, validation_split=None, subset=None):
    file_paths, labels, class_names = dataset_utils.index_directory(
        directory, labels, formats=(".txt",), shuffle=shuffle, seed=seed, verbose=False)
    file_paths, labels = dataset_utils.get_training_or_validation_split(file_paths, labels, validation_split, subset)
    path_ds = grain.MapDataset.source(file_paths)
    if label_mode:
        label_ds = labels_to_dataset_grain(labels, label_mode, len(class_names) if class_names else 0)
        ds = grain.experimental.ZipMapDataset([path_ds, label_ds])
    else:
        ds = path_ds
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if label_mode:
        ds = ds.map(lambda data: (_path_to_string_content_grain(data[0], max_length), data[1]))
    else:
        ds = ds.map(lambda x: _path_to_string_content_grain(x, max_length))
    dataset = ds.to_iter_dataset()
    if batch_size is not None:
        dataset = dataset.batch(batch_size, batch_fn=make_string_batch)
    dataset.class_names = class_names
    return dataset


images, texts = os.path.join(directory, "images"), os.path.join(directory, "texts")
relative = lambda paths: [os.path.relpath(p, images) for p in paths]
train_ds, val_ds = image_dataset_from_directory(
    images, label_mode="categorical", batch_size=3, image_size=(6, 5), seed=1337,
    validation_split=0.25, subset="both")
gray = image_dataset_from_directory(images, labels=None, label_mode=None, color_mode="grayscale",
                                    batch_size=4, image_size=(4, 4), shuffle=False, interpolation="nearest",
                                    crop_to_aspect_ratio=True)
reviews = text_dataset_from_directory(texts, label_mode="binary", batch_size=4, max_length=12, seed=7,
                                      validation_split=0.2, subset="training")
results = {
    "class_names": [train_ds.class_names, val_ds.class_names],
    "file_paths": [relative(train_ds.file_paths), relative(val_ds.file_paths)],
    "train": [dump(b) for b in train_ds],
    "train_again": [dump(b) for b in train_ds],
    "val": [dump(b) for b in val_ds],
    "gray": [[list(b.shape), np.asarray(b).sum().round(2).item()] for b in gray],
    "reviews": [[type(t).__name__, list(t), type(y).__module__.split(".")[0], str(np.asarray(y).dtype), np.asarray(y).tolist()]
                for t, y in reviews],
    "review_classes": reviews.class_names,
}
"""


def _image_and_text_folders(directory) -> None:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  for label, words in (("neg", ("dull", "slow", "bad")), ("pos", ("great", "fun", "bright", "warm"))):
    os.makedirs(directory / "texts" / label)
    for i, word in enumerate(words * 2):
      (directory / "texts" / label / f"{label}_{i}.txt").write_text(f"{word} film number {i}, " * (1 + i % 3))
  directory = directory / "images"
  rng = np.random.default_rng(11)
  for c, name in enumerate(("cats", "dogs", "owls")):
    os.makedirs(directory / name)
    for i in range(5 + c):
      h, w = 6 + i % 2, 8 + 2 * (c % 2)
      if i % 3 == 2:
        image = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), mode="L")
      else:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), mode="RGB")
      image.save(directory / name / f"{name}_{i}.png")


def test_keras_image_and_text_dataset_from_directory_grain_format_as_on_grain(tmp_path, keras_on_jax):  # pylint: disable=unused-argument,redefined-outer-name
  _image_and_text_folders(tmp_path)
  g, l = porting.run_both(KERAS_DIRECTORY_DATASETS, directory=str(tmp_path))
  assert porting.plain(l.results) == porting.plain(g.results)
  out = g.results
  assert out["class_names"] == [["cats", "dogs", "owls"]] * 2
  assert len(out["file_paths"][0]) == 14 and len(out["file_paths"][1]) == 4
  assert [b[1] for b in out["train"]] == [[3, 6, 5, 3]] * 4 + [[2, 6, 5, 3]]
  assert out["train"] == out["train_again"] and all(sum(row) == 1 for b in out["val"] for row in b[4])
  assert [b[0] for b in out["gray"]] == [[4, 4, 4, 1]] * 4 + [[2, 4, 4, 1]]
  assert out["review_classes"] == ["neg", "pos"] and [len(b[1]) for b in out["reviews"]] == [4, 4, 4]
  assert all(b[3] == "float32" and len(b[4]) == 4 and len(b[4][0]) == 1 for b in out["reviews"])


# simply/utils/seqio_wrapper.py, trimmed: `SeqIOConfig` without its SeqIO
# feature converters, `create_dataset` reading a generated token stream
# sharded as `seqio.ShardInfo(index, num_shards)` shards it (every
# num_shards-th row, packed into batches), the `_SeqIOIterator` /
# `SeqIODataset` pair and `make_train_data` as written. The script reads the
# stream with 0 and 2 workers, checkpoints after three batches and restores.
SIMPLY_SEQIO = """
import dataclasses
import json
import sys
from typing import Any, Self

import grain.python as grain
import numpy as np


@dataclasses.dataclass(frozen=True)
class SeqIOConfig:
  \"\"\"Configuration for SeqIO dataset.\"\"\"

  dataset_name: str
  feature_converter_name: str
  batch_size: int
  seq_len: int
  split: str = 'train'
  use_packing: bool = True
  bos_id: int = 0

  use_cached: bool = True
  shuffle: bool = False
  num_epochs: int = 1
  seed: int | None = None

  def __post_init__(self):
    if self.use_cached:
      if self.shuffle:
        raise ValueError('shuffle=True is not supported with use_cached=True.')
      if self.num_epochs != 1:
        raise ValueError('num_epochs != 1 is not supported with use_cached=True.')
      if self.seed is not None:
        raise ValueError('seed is not supported with use_cached=True.')

  @classmethod
  def from_config(cls, config, **overrides) -> Self:
    kwargs = {
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(cls)
        if hasattr(config, field.name)
    }
    kwargs.update(overrides)
    return cls(**kwargs)


def create_dataset(config: SeqIOConfig, worker_index: int, num_workers: int):
  \"\"\"A cached SeqIO task's LM batches, sharded as seqio.ShardInfo(worker_index, num_workers).\"\"\"
  rows = np.arange(36 * config.seq_len, dtype=np.int32).reshape(36, config.seq_len) + config.bos_id
  rows = rows[worker_index::num_workers]

  def batches():
    for start in range(0, len(rows) - config.batch_size + 1, config.batch_size):
      targets = rows[start:start + config.batch_size]
      yield {'decoder_target_tokens': targets, 'decoder_input_tokens': np.roll(targets, 1, axis=1),
             'decoder_loss_weights': np.ones_like(targets, dtype=np.float32)}

  return batches()


class _SeqIOIterator(grain.DatasetIterator[dict[str, Any]]):
  \"\"\"Iterator that batches elements with a given batch function.\"\"\"

  def __init__(self, config: SeqIOConfig, worker_index: int, num_workers: int):
    super().__init__()
    self._config = config
    self._worker_index = worker_index
    self._num_workers = num_workers
    self._example_counter = 0
    self._seqio_dataiter = None

  def __next__(self) -> dict[str, Any]:
    if self._seqio_dataiter is None:
      self._seqio_dataiter = create_dataset(self._config, self._worker_index, self._num_workers)
      # Playback example_counter many examples to restore to proper state.
      for _ in range(self._example_counter):
        next(self._seqio_dataiter)

    self._example_counter += 1
    return next(self._seqio_dataiter)

  def get_state(self) -> Any:
    return {
        'config': dataclasses.asdict(self._config),
        'example_counter': self._example_counter,
    }

  def set_state(self, state) -> None:
    assert self._config == SeqIOConfig(**state['config'])
    self._example_counter = state['example_counter']
    self._seqio_dataiter = None

  def __str__(self) -> str:
    return f'_SeqIOIterator(config={self._config}, example_counter={self._example_counter})'


class SeqIODataset(grain.IterDataset[dict[str, Any]]):
  \"\"\"Batch transformation for IterDatasets, using a batch function.\"\"\"

  def __init__(self, config: SeqIOConfig):
    super().__init__()
    self._config = config
    self._num_workers = 1
    self._worker_index = 0

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    del sequential_slice  # Unused.
    # This is the function internally called by mp_prefetch() to set the proper
    # data slice for each worker; it's not public PyGrain API, so no guarantee
    # going forward...
    assert sl.stop is None, f'{sl=}'
    self._num_workers = sl.step
    self._worker_index = sl.start

  def __iter__(self) -> _SeqIOIterator:
    return _SeqIOIterator(self._config, self._worker_index, self._num_workers)

  def __str__(self) -> str:
    return f'SeqIODataset(config={self._config})'


def make_train_data(config, num_workers: int = 32, worker_buffer_size: int = 2) -> grain.IterDataset[dict[str, Any]]:
  \"\"\"Returns a PyGrain dataset for training, from Simply experiment config.\"\"\"
  config = SeqIOConfig.from_config(config)
  return SeqIODataset(config).mp_prefetch(
      grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=worker_buffer_size))


class ExperimentConfig:  # The Simply experiment config's fields SeqIOConfig reads (and one it does not).
  dataset_name = 'lm1b_cached'
  feature_converter_name = 'LMFeatureConverter'
  batch_size = 2
  seq_len = 4
  bos_id = 1
  model_dim = 512


def main(num_workers, restore):
  ds = make_train_data(ExperimentConfig(), num_workers=num_workers)
  it = iter(ds)
  head = [next(it) for _ in range(3)]
  state = it.get_state()
  rest = list(it)
  dump = lambda b: {k: v.tolist() for k, v in b.items()}
  out = {'batches': [dump(b) for b in head + rest], 'state': state,
         'str': str(SeqIODataset(SeqIOConfig.from_config(ExperimentConfig())))}
  if restore:
    restored = iter(make_train_data(ExperimentConfig(), num_workers=num_workers))
    restored.set_state(json.loads(json.dumps(state)))
    out['restored'] = [dump(b) for b in restored] == [dump(b) for b in rest]
  return out


if __name__ == '__main__':
  from absl import flags
  flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags.
  # Each argument: a worker count, `+` to also restore a new iterator from the state after three batches.
  print(json.dumps({arg: main(int(arg.rstrip('+')), arg.endswith('+')) for arg in sys.argv[1:]}))
"""


def test_simply_seqio_iter_dataset_with_set_slice_under_mp_prefetch(tmp_path):
  # README, "`set_slice` is not called": with workers, Grain's mp_prefetch
  # gives worker w `set_slice(slice(w, None, 2))`, so each worker reads its
  # SeqIO shard and the workers' batches interleave; loader computes only
  # MapDataset parts in workers, so its stream with workers is the stream with
  # 0 workers (Grain's included), which holds the same tokens. (Grain's
  # restore with workers, another ~6 s of worker start-up, is left out.)
  g = porting.run_script(SIMPLY_SEQIO, "grain", tmp_path, "0+", "2")
  l = porting.run_script(SIMPLY_SEQIO, "loader", tmp_path, "0+", "2+")
  g0, g2, l0, l2 = g["0+"], g["2"], l["0+"], l["2+"]
  assert l0["batches"] == l2["batches"] == g0["batches"]
  assert porting.grain_keys(l0["state"]) == porting.grain_keys(l2["state"]) == g0["state"] == {
      "config": {"dataset_name": "lm1b_cached", "feature_converter_name": "LMFeatureConverter", "batch_size": 2,
                 "seq_len": 4, "split": "train", "use_packing": True, "bos_id": 1, "use_cached": True,
                 "shuffle": False, "num_epochs": 1, "seed": None},
      "example_counter": 3}
  assert l0["restored"] is l2["restored"] is g0["restored"] is True
  assert l0["str"] == g0["str"] and l0["str"].startswith("SeqIODataset(config=SeqIOConfig(")
  assert len(g2["batches"]) == len(l2["batches"]) == 18
  assert g2["batches"] != g0["batches"]  # Grain's shards interleave.
  rows = lambda out: sorted(r for b in out["batches"] for r in b["decoder_target_tokens"])
  assert rows(g2) == rows(l2)


# simply/eval/page_decode_eval.py's data path, trimmed: the registered data
# source wrapped by `data_lib.get_data_source` (`grain.MapDataset.source`), a
# strided shard, `repeat(n_repeats)`, `map_with_index` over an async
# query-and-evaluate (a model server that answers each prompt, an evaluation
# that grades it), `to_iter_dataset(ReadOptions(...))`, history and
# `iter_state_<n>.json` files (simply's `pytree.save_pytree_to` is a JSON
# dump) every `save_every_n` examples, resumed from the newest state file.
# `stop_after` preempts the job after that many examples.
SIMPLY_PAGE_DECODE_EVAL = """
import asyncio
import functools
import json
import os
import re

import grain


class ArithmeticSource:  # A simply SimpleDataSource: __len__ / __getitem__ over the eval split.
  def __init__(self, n):
    self.rows = [{'question': f'{i} * {i + 1} mod 7', 'answer': str(i * (i + 1) % 7), 'id': i} for i in range(n)]

  def __len__(self):
    return len(self.rows)

  def __getitem__(self, i):
    return self.rows[i]


def get_data_source(source):
  return grain.MapDataset.source(source)


class ModAnswerEvaluation:
  def get_messages(self, example):
    return [{'role': 'user', 'content': example['question']}]

  def evaluate(self, responsed_example, output_text):
    return {'correct': output_text == responsed_example['answer']}


async def model_fn(messages, *, index=0):
  await asyncio.sleep(0)
  a, _, b, *_ = messages[-1]['content'].split()
  answer = int(a) * int(b) % 7 if int(a) % 4 else 0  # The model is wrong on some prompts.
  prompt = messages[-1]['content']
  return {'output_text': str(answer), 'tokens': list(range(len(prompt) + 3)), 'input_len': len(prompt),
          'index': index}


def get_last_file(directory, pattern):
  found = [(int(m.group(1)), name) for name in os.listdir(directory) if (m := re.fullmatch(pattern, name))]
  return os.path.join(directory, max(found)[1]) if found else None


def run_eval(experiment_dir, shard_index=1, shard_count=3, n_repeats=2, save_every_n=3, stop_after=None):
  evaluation = ModAnswerEvaluation()
  dataset = get_data_source(ArithmeticSource(23))
  if shard_count > 1:
    dataset = dataset[shard_index::shard_count]
  dataset = dataset.repeat(n_repeats)
  num_total_examples = len(dataset)

  dataiter_state = None
  num_past_examples = 0
  iter_state_path = get_last_file(experiment_dir, r'iter_state_(\\d+)\\.json')
  if iter_state_path is not None:
    with open(iter_state_path) as f:
      iter_state = json.load(f)
    dataiter_state = iter_state['dataiter']
    num_past_examples = iter_state['num_past_examples']

  async def query_and_evaluate(index, example):
    request = evaluation.get_messages(example)
    response = await model_fn(request, index=index)
    responsed_example = example | dict(lm_request=request, lm_response=response)
    result = evaluation.evaluate(responsed_example, response['output_text'])
    return responsed_example | result

  dataset = dataset.map_with_index(lambda i, x: asyncio.run(query_and_evaluate(i, x)))
  dataset = dataset.to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=2 * 8))
  dataiter = dataset.__iter__()

  if dataiter_state is not None:
    dataiter.set_state(dataiter_state)

  num_saved_examples = num_past_examples
  history = []
  for example in dataiter:
    num_past_examples += 1
    history.append(example)
    if num_past_examples - num_saved_examples >= save_every_n or num_past_examples >= num_total_examples:
      history_path = os.path.join(experiment_dir, f'history_{num_past_examples}.jsonl')
      with open(history_path, 'w') as f:
        for example_to_save in history:
          lm_response = example_to_save['lm_response']
          input_len = lm_response['input_len']
          example_to_save = dict(lm_request=example_to_save['lm_request'], output_text=lm_response['output_text'],
                                 input_len=input_len, output_len=len(lm_response['tokens']) - input_len,
                                 correct=example_to_save['correct'], index=lm_response['index'],
                                 id=example_to_save['id'])
          f.write(json.dumps(example_to_save) + '\\n')
      with open(os.path.join(experiment_dir, f'iter_state_{num_past_examples}.json'), 'w') as f:
        json.dump(dict(dataiter=dataiter.get_state(), num_past_examples=num_past_examples), f)
      history = []
      num_saved_examples = num_past_examples
    if stop_after is not None and num_past_examples >= stop_after:
      return 'preempted'
  return 'done'


def read_run(experiment_dir):
  histories, states = [], {}
  for name in sorted(os.listdir(experiment_dir), key=lambda n: (n.split('_')[0], int(re.sub(r'\\D', '', n)))):
    with open(os.path.join(experiment_dir, name)) as f:
      if name.startswith('history'):
        histories.append([json.loads(line) for line in f])
      else:
        states[name] = json.load(f)
  return {'histories': histories, 'states': states}


os.makedirs(experiment_dir)
results = {'runs': [run_eval(experiment_dir, stop_after=7), run_eval(experiment_dir)], **read_run(experiment_dir)}
"""


def test_simply_page_decode_eval_resumes_from_its_state_files_as_on_grain(tmp_path):
  g = porting.run(SIMPLY_PAGE_DECODE_EVAL, "grain", experiment_dir=str(tmp_path / "grain"))
  l = porting.run(SIMPLY_PAGE_DECODE_EVAL, "loader", experiment_dir=str(tmp_path / "loader"))
  assert porting.grain_keys(l.results) == porting.plain(g.results)
  out = g.results
  assert out["runs"] == ["preempted", "done"]
  examples = [e for h in out["histories"] for e in h]
  # The 8 examples of shard 1 of 3, twice; the preempted run's 7th example,
  # after the last save, is evaluated again after the restart.
  assert [e["id"] for e in examples] == [1, 4, 7, 10, 13, 16, 19, 22] * 2
  assert [e["index"] for e in examples] == list(range(16))
  assert out["states"]["iter_state_6.json"]["dataiter"] == {"next_index": 6}
  assert 0 < sum(e["correct"] for e in examples) < 16
  # A Grain-written state file resumes the evaluation on loader.
  resumed = tmp_path / "resumed"
  shutil.copytree(tmp_path / "grain", resumed)
  for name in os.listdir(resumed):  # What the preempted run had saved: examples 1 to 6.
    if int(name.split("_")[-1].split(".")[0]) > 6:
      os.remove(resumed / name)
  assert l.run_eval(str(resumed)) == "done"
  assert porting.grain_keys(l.read_run(str(resumed))) == porting.plain({k: out[k] for k in ("histories", "states")})
  assert json.loads((resumed / "iter_state_16.json").read_text())["dataiter"]["next_index"] == 16


# DBraun/magenta-realtime's magenta_rt/sft/export.py (`export_tree_dataset`
# with `files=`: `_build_excerpt_dataset`, the consuming loop and its
# `profile` branch), trimmed to a codec-only export: files shuffled and
# repeated endlessly, `.seed()` again after the repeat so that the salient-
# excerpt `random_map` (audiotree's `_load_audio_with_saliency` through
# `functools.partial`) draws a new excerpt per visit, `ExactLength` / stereo /
# loudness maps, a near-silence filter on the endless MapDataset, an optional
# `normalize` (a `RandomMap` instance through `.random_map`, any other
# callable through `.map`), `to_iter_dataset(ReadOptions(0, 0))`,
# `LimitIterDataset(ds, num_samples)`, `batch(batch_fn=AudioTree.batch)`,
# optional `mp_prefetch` and `WithOptionsIterDataset(STAGE_TIMING)`, and the
# execution summary printed through Grain's private paths. audiotree's
# `AudioTree`, `stereo`, `volume_norm` and `TreeWriter` and the SpectroStream
# codec are small numpy stand-ins; the "audio files" are .npy arrays.
MAGENTA_RT_EXPORT = """
import dataclasses
import functools
import json
import os
import sys
from typing import Optional

import numpy as np

import grain

SAMPLE_RATE = 400  # 48 kHz in magenta_rt; 16 samples per 25 Hz frame here.
FRAME_RATE = 25
SAMPLES_PER_FRAME = SAMPLE_RATE // FRAME_RATE


@dataclasses.dataclass
class AudioTree:  # audiotree.AudioTree: a (B, C, T) waveform and its per-clip fields.
    waveform: Optional[np.ndarray]
    sample_rate: int
    loudness: Optional[np.ndarray] = None
    codes: Optional[np.ndarray] = None
    metadata: dict = dataclasses.field(default_factory=dict)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def replace_loudness(self):
        power = np.mean(self.waveform.astype(np.float64) ** 2, axis=(1, 2))
        return self.replace(loudness=(10 * np.log10(power + 1e-12)).astype(np.float32))

    @classmethod
    def batch(cls, trees):
        return cls(waveform=np.concatenate([t.waveform for t in trees]), sample_rate=trees[0].sample_rate,
                   loudness=np.concatenate([t.loudness for t in trees]),
                   metadata={k: np.concatenate([np.atleast_1d(t.metadata[k]) for t in trees]) for k in trees[0].metadata})


@dataclasses.dataclass(frozen=True)
class SaliencyParams:
    enabled: bool = True
    num_tries: int = 8
    loudness_cutoff: float = -60.0


def _load_audio_with_saliency(filepath, rng, *, sample_rate, duration, mono, pad_mode, saliency_params):
    audio = np.load(filepath)  # (C, T) at sample_rate
    window = round(duration * sample_rate)
    best = None
    for _ in range(saliency_params.num_tries if saliency_params.enabled else 1):
        offset = int(rng.integers(0, max(audio.shape[1] - window, 0) + 1))
        clip = audio[:, offset:offset + window]
        loudness = 10 * np.log10(np.mean(clip.astype(np.float64) ** 2) + 1e-12)
        if best is None or loudness > best[0]:
            best = (loudness, offset, clip)
        if loudness > saliency_params.loudness_cutoff:
            break
    _, offset, clip = best
    if clip.shape[1] < window:
        clip = np.pad(clip, ((0, 0), (0, window - clip.shape[1])), mode=pad_mode)
    if mono:
        clip = clip.mean(axis=0, keepdims=True)
    return AudioTree(waveform=clip[None].astype(np.float32), sample_rate=sample_rate,
                     metadata={"filepath": os.path.basename(filepath), "offset": offset / sample_rate})


@dataclasses.dataclass
class ExactLength(grain.transforms.Map):  # magenta_rt.sft.transforms.ExactLength
    num_samples: int

    def map(self, audio_tree):
        w = audio_tree.waveform[..., :self.num_samples]
        if w.shape[-1] < self.num_samples:
            w = np.pad(w, ((0, 0), (0, 0), (0, self.num_samples - w.shape[-1])))
        return audio_tree.replace(waveform=w, loudness=None)


class stereo(grain.transforms.Map):  # audiotree.transforms.stereo
    def map(self, audio_tree):
        w = audio_tree.waveform
        if w.shape[1] == 1:
            w = np.repeat(w, 2, axis=1)
        return audio_tree.replace(waveform=w[:, :2], loudness=None)


class volume_norm(grain.transforms.RandomMap):  # audiotree.transforms.volume_norm, in dB
    def __init__(self, min_db=-20.0, max_db=-15.0):
        self.min_db, self.max_db = min_db, max_db

    def random_map(self, audio_tree, rng):
        target = rng.uniform(self.min_db, self.max_db)
        gain = 10 ** ((target - audio_tree.loudness[0]) / 20)
        return audio_tree.replace(waveform=(audio_tree.waveform * gain).astype(np.float32)).replace_loudness()


def peak_normalize(audio_tree):
    return audio_tree.replace(waveform=audio_tree.waveform / np.abs(audio_tree.waveform).max())


class TreeWriter:  # audiotree.TreeWriter: one record per example, kept here in memory.
    def __init__(self, out_dir, expected_samples, metadata=None, pbar=None):
        self.out_dir, self.expected_samples, self.records = out_dir, expected_samples, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, tree):
        for i in range(tree.codes.shape[0]):
            self.records.append({"codes": tree.codes[i].tolist(), "dtype": str(tree.codes.dtype),
                                 **{k: v[i].item() for k, v in tree.metadata.items()}})


class Codec:  # SpectroStream: waveform_to_codes([B, C, T]) -> [B, T // SAMPLES_PER_FRAME, D]
    def waveform_to_codes(self, waveform):
        b, c, t = waveform.shape
        frames = waveform.reshape(b, c, t // SAMPLES_PER_FRAME, SAMPLES_PER_FRAME)
        return np.clip(np.round((frames.mean(-1).transpose(0, 2, 1) + 1) * 511), 0, 1023).astype(np.int64)


class _BatchEncoder:  # codec-only `_encode_broadcast`
    def __init__(self, *, codec, trim_frames):
        self._codec, self._trim_frames = codec, trim_frames

    def __call__(self, batch):
        codes = self._codec.waveform_to_codes(batch.waveform)
        metadata = {k: batch.metadata[k] for k in ("filepath", "offset") if k in batch.metadata}
        if self._trim_frames:
            codes = codes[:, self._trim_frames:codes.shape[1] - self._trim_frames, :]
        codes = codes.astype(np.uint16)
        if "offset" in metadata:
            metadata["offset"] = np.asarray(metadata["offset"], dtype=np.float32)
        return AudioTree(waveform=None, sample_rate=batch.sample_rate, codes=codes, metadata=metadata)


def _build_excerpt_dataset(grain, stereo, *, files, duration, seed, saliency_params, normalize, num_samples,
                           batch_size, worker_count, worker_buffer_size, profile):
    window_samples = round(duration * SAMPLE_RATE)
    load_fn = functools.partial(
        _load_audio_with_saliency,
        sample_rate=SAMPLE_RATE,
        duration=duration,
        mono=False,
        pad_mode="wrap",
        saliency_params=saliency_params,
    )
    ds = (
        grain.MapDataset.source(files)
        .seed(seed)
        .shuffle()
        .repeat()
        .seed(seed)
        .random_map(load_fn)
    )
    ds = ds.map(ExactLength(window_samples))
    ds = ds.map(stereo())
    ds = ds.map(AudioTree.replace_loudness)
    ds = ds.filter(lambda audio_tree: audio_tree.loudness[0] > -60.)
    if normalize is not None:
        if isinstance(normalize, grain.transforms.RandomMap):
            ds = ds.random_map(normalize)
        else:
            ds = ds.map(normalize)
    ds = ds.to_iter_dataset(
        grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    )
    ds = grain.experimental.LimitIterDataset(ds, num_samples)
    ds = ds.batch(batch_size, drop_remainder=False, batch_fn=AudioTree.batch)
    if worker_count > 0:
        ds = ds.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=worker_count,
                per_worker_buffer_size=worker_buffer_size,
            )
        )
    if profile:
        ds = grain.experimental.WithOptionsIterDataset(
            ds,
            grain.experimental.DatasetOptions(
                execution_tracking_mode=(
                    grain.experimental.ExecutionTrackingMode.STAGE_TIMING
                )
            ),
        )
    return ds


def export_tree_dataset(out_dir, *, files, codec, num_samples, duration=0.4, trim_frames=0, batch_size=4, seed=0,
                        saliency_params=None, normalize=None, worker_count=0, worker_buffer_size=1, profile=False):
    if saliency_params is None:
        saliency_params = SaliencyParams(enabled=True, num_tries=8, loudness_cutoff=-60.0)
    files = [str(f) for f in files]
    encode = _BatchEncoder(codec=codec, trim_frames=trim_frames)
    ds = _build_excerpt_dataset(
        grain, stereo, files=files, duration=duration, seed=seed, saliency_params=saliency_params,
        normalize=normalize, num_samples=num_samples, batch_size=batch_size, worker_count=worker_count,
        worker_buffer_size=worker_buffer_size, profile=profile)

    iterator: grain.IterDataset[AudioTree] = iter(ds)
    with TreeWriter(out_dir, expected_samples=num_samples) as writer:
        for batch in iterator:
            writer.write(encode(batch))
    summary = None
    if profile:
        try:  # re-exported from grain.experimental on newer grain
            from grain.experimental import get_execution_summary
        except ImportError:
            from grain._src.python.dataset.dataset import get_execution_summary
        from grain._src.python.dataset.stats import pretty_format_summary

        try:
            summary = pretty_format_summary(get_execution_summary(iterator))
        except Exception as e:  # The test's own catch, to keep the written records.
            summary = e
    return writer.records, summary


def make_files(directory):
    rng = np.random.default_rng(3)
    files = []
    for i in range(7):
        seconds = 1 + i % 3
        audio = rng.normal(0, 0.05 * (1 + i), (1 + i % 2, SAMPLE_RATE * seconds)).astype(np.float32)
        if i == 4:
            audio[:] = 0  # A silent file: every excerpt is filtered out.
        path = os.path.join(directory, f"track_{i}.npy")
        np.save(path, audio)
        files.append(path)
    return files


EXPORTS = {
    "plain": dict(num_samples=10),
    "volume_norm": dict(num_samples=10, normalize=volume_norm(-24, -18)),
    "peak": dict(num_samples=10, normalize=peak_normalize, trim_frames=2, seed=5),
    "profiled": dict(num_samples=6, profile=True),
}


def main(directory, worker_count, names=tuple(EXPORTS)):
    files = make_files(directory)
    out = {}
    for name in names:
        records, summary = export_tree_dataset(directory, files=files, codec=Codec(), worker_count=worker_count,
                                               **EXPORTS[name])
        out[name] = records
        if EXPORTS[name].get("profile"):
            out["summary"] = (summary if isinstance(summary, str) else
                              [type(summary).__name__, isinstance(summary, ValueError)])
    return out


if __name__ == "__main__":
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags.
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
"""


def test_magenta_rt_salient_excerpt_export_as_on_grain(tmp_path):
  # README, ExecutionTrackingMode row: STAGE_TIMING is accepted, but loader
  # collects no per-stage statistics, so the summary the export prints with
  # `profile=True` raises loader's ExecutionSummaryError (a ValueError) after
  # the same records are written.
  g = porting.run(MAGENTA_RT_EXPORT + "\nresults = main(directory, 0)\n", "grain", directory=str(tmp_path)).results
  l = porting.run(MAGENTA_RT_EXPORT + "\nresults = main(directory, 0)\n", "loader", directory=str(tmp_path)).results
  g_summary, l_summary = g.pop("summary"), l.pop("summary")
  assert porting.plain(l) == porting.plain(g)
  assert isinstance(g_summary, str) and "RepeatMapDataset" in g_summary and "processing time" in g_summary
  assert l_summary == ["ExecutionSummaryError", True]
  assert [len(g[k]) for k in ("plain", "volume_norm", "peak", "profiled")] == [10, 10, 10, 6]
  assert "track_4.npy" not in {r["filepath"] for r in g["plain"]}  # The near-silence filter.
  assert len({(r["filepath"], r["offset"]) for r in g["plain"]}) > 6  # New excerpts on repeated visits.
  assert {r["dtype"] for r in g["peak"]} == {"uint16"} and len(g["peak"][0]["codes"]) == 6
  assert g["volume_norm"] != g["plain"] and g["profiled"] == g["plain"][:6]


def test_magenta_rt_export_with_worker_processes(tmp_path):
  # The export's `worker_count` on loader, with the RandomMap `normalize` and
  # the profiled export (Grain's workers, for the same comparison, would start
  # for each export). README, "Worker-count-invariant batching": under
  # mp_prefetch loader's LimitIterDataset limits the stream, so the records
  # are those without workers (Grain limits each worker's slice: 2 workers
  # would write 2 x num_samples records); the summary is as without workers.
  names = ("volume_norm", "profiled")
  g0 = porting.run(MAGENTA_RT_EXPORT + f"\nresults = main(directory, 0, {names})\n", "grain",
                   directory=str(tmp_path)).results
  l2 = porting.run_script(MAGENTA_RT_EXPORT, "loader", tmp_path, str(tmp_path), "2", *names)
  assert l2.pop("summary") == ["ExecutionSummaryError", True] and isinstance(g0.pop("summary"), str)
  assert l2 == porting.plain(g0) and [len(l2[n]) for n in names] == [10, 6]
