"""Round 17's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

The JAX AI stack's tutorials (jax-ml/jax-ai-stack docs/source/):
JAX_basic_text_classification.md (a tokenizing `MapTransform` that pads
to `max_length`), JAX_transformer_text_classification.md (a
`grain.RandomAccessDataSource` subclass over numpy arrays),
JAX_image_captioning.md (an image and a caption `MapTransform`, captions
stripped of punctuation and joined with start/end tags),
JAX_examples_image_segmentation.md (an albumentations-style `DataAugs`
called with `**data`; one sampler shared by two loaders),
JAX_Vision_transformer.md (a Hugging Face `with_transform` batch
transform behind the source) and data_loaders_on_cpu_with_jax.md (a
`SequentialSampler`, tuple records, a new `DataLoader` per epoch); and
smaller public clients whose Grain usage is unusual: hyperlinear's
grain data module (dataclass `MapTransform`s with `@staticmethod` maps,
`to_iter_dataset().batch().map()` into a registered pytree,
`ConcatThenSplitIterDataset` packing, a `FlatMapTransform` whose
`max_fan_out` is set in `__init__` under `FlatMapMapDataset`, a
`DataLoader` with the same transforms), eqxformers' streaming source (an
`IterDataset` / `DatasetIterator` pair built with no parents, whose state
is the stream's `state_dict()`, under `WithOptionsIterDataset` and
`ThreadPrefetchIterDataset`), FluidGenie's windowed `.npy` memmap source
(`grain.samplers` / `grain.sharding` / `grain.transforms` namespaces,
`num_epochs=None`) and an equinox sine-regression script (a plain
function among a `DataLoader`'s operations after `Batch`). Each snippet
is the client's code, trimmed, with generated local data in place of
Hugging Face / torchvision / tiktoken downloads; random torchvision
augmentations (torch's global RNG) are replaced by deterministic numpy
ones. Scripts with worker processes run as `__main__` on each library in
a fresh process.
"""

from __future__ import annotations

import json

from tests import porting

# A stand-in for tiktoken's GPT-2 encoding: one id per byte, special
# tags as single ids (the tutorials pass `allowed_special`).
TOKENIZER = """
class ByteTokenizer:
    n_vocab = 260
    specials = {"[start]": 256, "[end]": 257}

    def encode(self, text, allowed_special=()):
        ids = []
        while text:
            for tag in allowed_special:
                if text.startswith(tag):
                    ids.append(self.specials[tag])
                    text = text[len(tag):]
                    break
            else:
                ids.extend(text[0].encode("utf-8"))
                text = text[1:]
        return ids


tokenizer = ByteTokenizer()
"""


# jax-ai-stack JAX_basic_text_classification.md: IMDB rows ({"text", "label"})
# through `TextPreprocessing` (tokenize, cut to `max_length`, pad with
# zeros: int64 arrays), a shuffled one-epoch `IndexSampler` with
# `NoSharding()`, `Batch(drop_remainder=True)` for training and a plain
# `Batch` for the test loader (its last batch is partial); `next(iter(...))`
# and the dtypes the tutorial prints; a state restored mid-epoch.
BASIC_TEXT = TOKENIZER + """
import json

import numpy as np
import grain.python as grain

seed = 12
train_batch_size = 4
test_batch_size = 2 * train_batch_size
max_length = 12

train_dataset = [{"text": f"review {i} " + "good " * (i % 4), "label": i % 2} for i in range(18)]
test_dataset = [{"text": f"test {i}!", "label": (i + 1) % 2} for i in range(11)]


class TextPreprocessing(grain.MapTransform):
    def __init__(self, tokenizer, max_length: int = 256):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def map(self, data):
        text = data["text"]
        encoded = self.tokenizer.encode(text)
        encoded = encoded[:self.max_length]
        encoded = np.array(encoded + [0] * (self.max_length - len(encoded)))
        return {"text": encoded, "label": data["label"]}


train_sampler = grain.IndexSampler(len(train_dataset), shuffle=True, seed=seed,
                                   shard_options=grain.NoSharding(), num_epochs=1)
test_sampler = grain.IndexSampler(len(test_dataset), shuffle=False, seed=seed,
                                  shard_options=grain.NoSharding(), num_epochs=1)
train_loader = grain.DataLoader(
    data_source=train_dataset, sampler=train_sampler, worker_count=0, worker_buffer_size=2,
    operations=[TextPreprocessing(tokenizer, max_length=max_length),
                grain.Batch(train_batch_size, drop_remainder=True)])
test_loader = grain.DataLoader(
    data_source=test_dataset, sampler=test_sampler, worker_count=0, worker_buffer_size=2,
    operations=[TextPreprocessing(tokenizer, max_length=max_length), grain.Batch(test_batch_size)])

train_batch = next(iter(train_loader))
results = {
    "info": [[type(v).__name__, list(v.shape), str(v.dtype)] for v in (train_batch["text"], train_batch["label"])],
    "train": [{k: v.tolist() for k, v in b.items()} for b in train_loader],
    "test": [{k: v.tolist() for k, v in b.items()} for b in test_loader],
}
it = iter(train_loader)
next(it)
state = it.get_state()
tail = [b["label"].tolist() for b in it]
it = iter(train_loader)
it.set_state(state)
results["restored"] = [[b["label"].tolist() for b in it] == tail, len(tail), json.loads(state.decode())]
"""


def test_jax_ai_stack_basic_text_classification_loaders_as_on_grain():
  g, l = porting.run_both_grain_keys(BASIC_TEXT)
  assert l == g
  assert g["info"] == [["ndarray", [4, 12], "int64"], ["ndarray", [4], "int64"]]
  assert len(g["train"]) == 4 and [len(b["label"]) for b in g["test"]] == [8, 3]
  assert g["restored"][:2] == [True, 3]


# jax-ai-stack JAX_transformer_text_classification.md: a
# `grain.RandomAccessDataSource` subclass over padded int32 arrays (its
# `__getitem__` indexes numpy arrays: numpy scalars for labels), loaders with
# only a `Batch`; the sampler's shuffle over the epoch; `len()` of the
# source; and an index past the source's end (the client's class does not
# check it: numpy's IndexError).
TRANSFORMER_TEXT = """
import numpy as np
import grain.python as grain

maxlen = 6
rng = np.random.default_rng(0)
x_train = rng.integers(1, 50, size=(13, maxlen)).astype(np.int32)
y_train = (x_train.sum(axis=1) % 2).astype(np.int32)
x_test, y_test = x_train[:5] + 1, y_train[:5]


class DataSource(grain.RandomAccessDataSource):
    def __init__(self, x, y):
        self._x = x
        self._y = y

    def __getitem__(self, idx):
        return {"encoded_indices": self._x[idx], "label": self._y[idx]}

    def __len__(self):
        return len(self._x)


train_source = DataSource(x_train, y_train)
test_source = DataSource(x_test, y_test)
seed = 12
train_sampler = grain.IndexSampler(len(train_source), shuffle=True, seed=seed,
                                   shard_options=grain.NoSharding(), num_epochs=1)
test_sampler = grain.IndexSampler(len(test_source), shuffle=False, seed=seed,
                                  shard_options=grain.NoSharding(), num_epochs=1)
train_loader = grain.DataLoader(data_source=train_source, sampler=train_sampler, worker_count=0,
                                worker_buffer_size=2, operations=[grain.Batch(4, drop_remainder=True)])
test_loader = grain.DataLoader(data_source=test_source, sampler=test_sampler, worker_count=0,
                               worker_buffer_size=2, operations=[grain.Batch(8)])
dump = lambda b: {k: [str(v.dtype), v.tolist()] for k, v in b.items()}
results = {
    "train": [dump(b) for b in train_loader],
    "test": [dump(b) for b in test_loader],
    "mro": [isinstance(train_source, grain.RandomAccessDataSource), len(train_source)],
}
try:
    train_source[13]
except IndexError as e:
    results["past end"] = str(e)
"""


def test_jax_ai_stack_transformer_text_classification_source_as_on_grain():
  g, l = porting.run_both(TRANSFORMER_TEXT)
  assert porting.plain(l.results) == porting.plain(g.results)
  assert len(g.results["train"]) == 3 and g.results["train"][0]["label"][0] == "int32"
  assert g.results["test"][0]["encoded_indices"][0] == "int32" and g.results["mro"] == [True, 13]


# jax-ai-stack JAX_image_captioning.md: `ImageTransforms` (a stand-in for
# the torchvision Compose: resize by striding, normalise to float32 around
# 0.5) and `TextPreprocessing` (captions split on newlines, punctuation
# stripped with `str.maketrans`, joined with [start]/[end] tags or the
# longest one only, tokenized with `allowed_special`, cut and padded), a
# shuffled train loader and a sequential test loader with a partial last
# batch.
IMAGE_CAPTIONING = TOKENIZER + """
import string

import numpy as np
import grain.python as grain

seed = 12
img_size = 4
max_length = 24
start_tag = "[start]"
end_tag = "[end]"


def normalize(image):
    mean = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    std = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    image = image.astype(np.float32) / 255.0
    return (image - mean) / std


def test_transforms(image):
    step = image.shape[0] // img_size
    return normalize(image[::step, ::step])


def train_transforms(image):
    return test_transforms(image)[:, ::-1]


class ImageTransforms(grain.MapTransform):
    def __init__(self, tv_transforms: callable):
        self.tv_transforms = tv_transforms

    def map(self, data):
        image = data["image"]
        output = self.tv_transforms(image)
        return {"image": output, "caption": data["caption"]}


class TextPreprocessing(grain.MapTransform):
    def __init__(self, tokenizer, max_length: int = 256, use_longest_caption: bool = False):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._str_trans_table = str.maketrans("", "", string.punctuation)
        self.use_longest_caption = use_longest_caption

    def map(self, data):
        captions = [cap.translate(self._str_trans_table).strip() for cap in data["caption"].split("\\n")]
        if self.use_longest_caption:
            longest_caption = sorted(captions, key=lambda x: len(x))[-1]
            text = start_tag + longest_caption + end_tag
        else:
            text_list = []
            for cap in captions:
                text_list += [start_tag, cap, end_tag, " "]
            text = "".join(text_list)
        encoded = self.tokenizer.encode(text, allowed_special={start_tag, end_tag})
        encoded = encoded[:self.max_length]
        encoded = np.array(encoded + [0] * (self.max_length - len(encoded)))
        return {"caption": encoded, "image": data["image"]}


rng = np.random.default_rng(1)
dataset = [{"image": rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8),
            "caption": f"A dog, no. {i}!\\nA cat?\\nbirds {'x' * i}."} for i in range(7)]
train_loader = grain.DataLoader(
    data_source=dataset,
    sampler=grain.IndexSampler(len(dataset), shuffle=True, seed=seed, shard_options=grain.NoSharding(), num_epochs=1),
    worker_count=0, worker_buffer_size=2,
    operations=[ImageTransforms(train_transforms), TextPreprocessing(tokenizer, max_length=max_length),
                grain.Batch(3, drop_remainder=True)])
test_loader = grain.DataLoader(
    data_source=dataset,
    sampler=grain.IndexSampler(len(dataset), shuffle=False, seed=seed, shard_options=grain.NoSharding(), num_epochs=1),
    worker_count=0, worker_buffer_size=2,
    operations=[ImageTransforms(test_transforms),
                TextPreprocessing(tokenizer, max_length=max_length, use_longest_caption=True), grain.Batch(6)])
dump = lambda b: {k: [list(v.shape), str(v.dtype), np.round(v, 4).tolist()] for k, v in b.items()}
results = {"train": [dump(b) for b in train_loader], "test": [dump(b) for b in test_loader]}
"""


def test_jax_ai_stack_image_captioning_transforms_as_on_grain():
  g, l = porting.run_both(IMAGE_CAPTIONING)
  assert porting.plain(l.results) == porting.plain(g.results)
  train, test = g.results["train"], g.results["test"]
  assert len(train) == 2 and train[0]["image"][:2] == [[3, 4, 4, 3], "float32"]
  assert train[0]["caption"][:2] == [[3, 24], "int64"] and train[0]["caption"][2][0][0] == 256
  assert [b["caption"][0][0] for b in test] == [6, 1]


# jax-ai-stack JAX_examples_image_segmentation.md: `DataAugs` calls an
# albumentations-style transform with `**data` (image=, mask=) and returns
# its dict; one shuffled sampler serves the train loader and the
# train-eval loader (without augmentation), a sequential one the
# validation loader. Each loader's batches, and the train loader's state
# after one batch restored into a new loader.
SEGMENTATION = """
from typing import Any, Callable

import numpy as np
import grain.python as grain


class DataAugs(grain.MapTransform):
    def __init__(self, transforms: Callable):
        self.albu_transforms = transforms

    def map(self, data):
        output = self.albu_transforms(**data)
        return output


def train_transforms(image, mask):
    return {"image": (image[::-1] / 255.0).astype(np.float32), "mask": mask[::-1].astype(np.int32)}


def val_transforms(image, mask):
    return {"image": (image / 255.0).astype(np.float32), "mask": mask.astype(np.int32)}


seed = 12
rng = np.random.default_rng(2)
train_dataset = [{"image": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
                  "mask": rng.integers(0, 3, (4, 4), dtype=np.uint8)} for _ in range(10)]
val_dataset = train_dataset[:5]
train_sampler = grain.IndexSampler(len(train_dataset), shuffle=True, seed=seed,
                                   shard_options=grain.NoSharding(), num_epochs=1)
val_sampler = grain.IndexSampler(len(val_dataset), shuffle=False, seed=seed,
                                 shard_options=grain.NoSharding(), num_epochs=1)
make = lambda source, sampler, augs, batch: grain.DataLoader(
    data_source=source, sampler=sampler, worker_count=0, worker_buffer_size=2, operations=[DataAugs(augs), batch])
train_loader = make(train_dataset, train_sampler, train_transforms, grain.Batch(3, drop_remainder=True))
val_loader = make(val_dataset, val_sampler, val_transforms, grain.Batch(6))
train_eval_loader = make(train_dataset, train_sampler, val_transforms, grain.Batch(6))
dump = lambda b: {k: [list(v.shape), str(v.dtype), np.round(v, 4).tolist()] for k, v in b.items()}
results = {name: [dump(b) for b in dl] for name, dl in
           (("train", train_loader), ("val", val_loader), ("train_eval", train_eval_loader))}
it = iter(train_loader)
next(it)
state = it.get_state()
it2 = iter(make(train_dataset, train_sampler, train_transforms, grain.Batch(3, drop_remainder=True)))
it2.set_state(state)
results["restored"] = [dump(b) for b in it2] == results["train"][1:]
"""


def test_jax_ai_stack_image_segmentation_loaders_as_on_grain():
  g, l = porting.run_both(SEGMENTATION)
  assert porting.plain(l.results) == porting.plain(g.results)
  assert [len(g.results[k]) for k in ("train", "val", "train_eval")] == [3, 1, 2]
  assert g.results["train"][0]["mask"][:2] == [[3, 4, 4], "int32"] and g.results["restored"] is True


# jax-ai-stack JAX_Vision_transformer.md: the source is a Hugging Face
# dataset with `with_transform(get_transform(fn))`, a batch transform that
# rewrites the batch's "image" and "label" lists in place (labels remapped
# to 0..19); a row read by index is the transform of a one-row batch. The
# loaders hold only `Batch`es; labels come out int64, images float32.
VISION_TRANSFORMER = """
import numpy as np
import grain.python as grain


class WithTransformRows:  # A stand-in for datasets.Dataset.with_transform on a random-access split.
    def __init__(self, rows, transform):
        self._rows = rows
        self._transform = transform

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, i):
        batch = {k: [v] for k, v in self._rows[i].items()}
        return {k: v[0] for k, v in self._transform(batch).items()}


labels_mapping = {7: 0, 11: 1, 42: 2}


def normalize(image):
    mean = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    std = np.array([0.5, 0.5, 0.5], dtype=np.float32)
    image = image.astype(np.float32) / 255.0
    return (image - mean) / std


def get_transform(fn):
    def wrapper(batch):
        batch["image"] = [fn(pil_image) for pil_image in batch["image"]]
        batch["label"] = [labels_mapping[label] for label in batch["label"]]
        return batch
    return wrapper


rng = np.random.default_rng(3)
rows = [{"image": rng.integers(0, 256, (2, 2, 3), dtype=np.uint8), "label": [7, 11, 42][i % 3]} for i in range(9)]
train_dataset = WithTransformRows(rows, get_transform(normalize))
val_dataset = WithTransformRows(rows[:4], get_transform(lambda im: normalize(im[::-1])))
seed = 12
train_loader = grain.DataLoader(
    data_source=train_dataset,
    sampler=grain.IndexSampler(len(train_dataset), shuffle=True, seed=seed, shard_options=grain.NoSharding(),
                               num_epochs=1),
    worker_count=0, worker_buffer_size=2, operations=[grain.Batch(4, drop_remainder=True)])
val_loader = grain.DataLoader(
    data_source=val_dataset,
    sampler=grain.IndexSampler(len(val_dataset), shuffle=False, seed=seed, shard_options=grain.NoSharding(),
                               num_epochs=1),
    worker_count=0, worker_buffer_size=2, operations=[grain.Batch(8)])
dump = lambda b: {k: [list(v.shape), str(v.dtype), np.round(v, 4).tolist()] for k, v in b.items()}
results = {"train": [dump(b) for b in train_loader], "val": [dump(b) for b in val_loader]}
"""


def test_jax_ai_stack_vision_transformer_with_transform_source_as_on_grain():
  g, l = porting.run_both(VISION_TRANSFORMER)
  assert porting.plain(l.results) == porting.plain(g.results)
  assert len(g.results["train"]) == 2 and g.results["train"][0]["label"][:2] == [[4], "int64"]
  assert g.results["val"][0]["image"][:2] == [[4, 2, 2, 3], "float32"]


# jax-ai-stack data_loaders_on_cpu_with_jax.md: a plain `Dataset` class
# returning `(np.ravel(float32 image), int label)` tuples, a
# `SequentialSampler(num_records=..., shard_options=NoSharding())` and a
# generator function making a new `DataLoader` with `Batch(batch_size)`
# for every epoch of the training loop (tuples of arrays, a partial last
# batch); the loader's state after two batches.
CPU_LOADERS = """
import json

import numpy as np
import grain.python as pygrain


class Dataset:
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        img, label = self.images[index], self.labels[index]
        return np.ravel(np.array(img, dtype=np.float32)), label


batch_size = 4
rng = np.random.default_rng(4)
mnist_dataset = Dataset(rng.integers(0, 256, (10, 3, 3), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, 10)])
sampler = pygrain.SequentialSampler(num_records=len(mnist_dataset), shard_options=pygrain.NoSharding())


def pygrain_training_generator():
    return pygrain.DataLoader(data_source=mnist_dataset, sampler=sampler, operations=[pygrain.Batch(batch_size)])


epochs = []
for epoch in range(2):
    epochs.append([[type(b).__name__, [str(v.dtype) for v in b], [v.tolist() for v in b]]
                   for b in pygrain_training_generator()])
it = iter(pygrain_training_generator())
next(it), next(it)
results = {"epochs": epochs, "state": json.loads(it.get_state()), "rest": [b[1].tolist() for b in it]}
"""


def test_jax_ai_stack_cpu_loader_sequential_sampler_as_on_grain():
  g, l = porting.run_both(CPU_LOADERS)
  g, l = porting.grain_keys(g.results), porting.grain_keys(l.results)
  assert l == g
  assert g["epochs"][0] == g["epochs"][1] and [len(b[2][1]) for b in g["epochs"][0]] == [4, 4, 2]
  assert g["epochs"][0][0][:2] == ["tuple", ["float32", "int64"]] and len(g["rest"]) == 1


def _write_text_records(directory, texts_per_file):
  """ArrayRecord files `text_<n>.arecord` of utf-8 texts (hyperlinear's naming)."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=import-outside-toplevel

  for n, texts in enumerate(texts_per_file):
    writer = ArrayRecordWriter(str(directory / f"text_{n}.arecord"), "group_size:1")
    for text in texts:
      writer.write(text.encode("utf-8"))
    writer.close()


_TEXTS = [[f"doc {n}.{i} " + "abc" * ((n * 7 + i) % 5) for i in range(6)] for n in range(3)]

# hyperlinear's data module (Simon Schug), trimmed: dataclass `MapTransform`s
# (`@staticmethod` maps, custom `__init__`s: `dataclasses.dataclass` keeps
# them and makes the instances unhashable), a `FlatMapTransform` setting
# `max_fan_out` in `__init__`, a registered `Batch` pytree, and
# `load_array_record_data_source` (files globbed as `pathlib.Path`s, sorted
# by their numeric suffix, passed to `ArrayRecordDataSource` as paths).
# A byte-level stand-in for the Hugging Face fast tokenizer.
HYPERLINEAR = """
import dataclasses
import os
from pathlib import Path

import grain.python as grain
import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Batch:
    x: np.ndarray


class ByteTokenizer:
    pad_token_id = 0
    eos_token = "~"

    def encode(self, text, return_tensors=None):
        return np.array([list(text.encode("utf-8"))], dtype=np.int64)

    def __call__(self, text, padding, max_length, truncation, return_tensors, padding_side):
        ids = list(text.encode("utf-8"))[:max_length]
        return {"input_ids": np.array([ids + [self.pad_token_id] * (max_length - len(ids))], dtype=np.int64)}


tokenizer = ByteTokenizer()


@dataclasses.dataclass
class DecodeArrayRecords(grain.MapTransform):
    @staticmethod
    def map(data: bytes) -> str:
        return data.decode(encoding="utf-8")


@dataclasses.dataclass
class TokenizeTruncatePad(grain.MapTransform):
    def __init__(self, tokenizer, seq_len: int) -> None:
        self.seq_len = seq_len
        self.tokenizer = tokenizer

    def map(self, text):
        tokenized = self.tokenizer(text, padding="max_length", max_length=self.seq_len, truncation=True,
                                   return_tensors="np", padding_side="right")
        return tokenized["input_ids"].squeeze(0)


@dataclasses.dataclass
class Tokenize(grain.MapTransform):
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def map(self, text):
        return self.tokenizer.encode(text, return_tensors="np").squeeze(0)


@dataclasses.dataclass
class NormalizeFeatures(grain.MapTransform):
    @staticmethod
    def map(sample):
        return Batch(x=sample)


@dataclasses.dataclass
class SplitLongSequencesPad(grain.experimental.FlatMapTransform):
    def __init__(self, max_length: int, pad_token_id: int, drop_remainder: bool) -> None:
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.drop_remainder = drop_remainder
        self.max_fan_out = 5

    def flat_map(self, seq):
        def pad(x):
            padding = np.full(self.max_length - len(x), self.pad_token_id, dtype=x.dtype)
            return np.concatenate([x, padding])

        if len(seq) <= self.max_length:
            return [pad(seq)]
        chunks = []
        for i in range(0, len(seq), self.max_length):
            chunk = seq[i : i + self.max_length]
            if len(chunk) == self.max_length:
                chunks.append(chunk)
            elif not self.drop_remainder:
                chunks.append(pad(chunk))
        return chunks


def load_array_record_data_source(dataset_path, file_extension=".arecord"):
    assert os.path.exists(dataset_path), f"dataset path {dataset_path} does not exist."
    path_pattern = Path(f"{dataset_path}/*{file_extension}")
    files = path_pattern.parent.glob(path_pattern.name)
    sorted_files = sorted(files, key=lambda x: int(x.stem.split("_")[-1]))
    return grain.ArrayRecordDataSource(sorted_files)


def dump(b):
    return [type(b).__name__, str(b.x.dtype), b.x.tolist()]


def run(ds, steps=2):
    it = iter(ds)
    out = [dump(next(it)) for _ in range(steps)]
    state = it.get_state()
    rest = [dump(b) for b in it]
    it2 = iter(ds)
    it2.set_state(state)
    return {"head": out, "rest": rest, "state": state, "restored": [dump(b) for b in it2] == rest}
"""

# hyperlinear create_grain_truncated_dataset: seeded shuffle of the
# ArrayRecord source, decode, append the EOS token, tokenize with
# truncation and padding, `to_iter_dataset()`, `batch(drop_remainder=True)`,
# an iterator-level map into `Batch`, `mp_prefetch` with 0 workers; and
# create_grain_chunked_dataset: `FlatMapMapDataset` splitting long
# sequences into `seq_len` chunks (dropping remainders, padding short
# ones) before the same batching. States restore mid-stream.
HYPERLINEAR_TRUNCATED_CHUNKED = HYPERLINEAR + """
def create_grain_truncated_dataset(dataset, tokenizer, batch_size, seq_len, shuffle, add_eos_token, n_workers, seed):
    ds = dataset.seed(seed)
    if shuffle:
        ds = ds.shuffle()
    ds = ds.map(DecodeArrayRecords())
    if add_eos_token:
        ds = ds.map(lambda x: x + tokenizer.eos_token)
    ds = ds.map(TokenizeTruncatePad(tokenizer, seq_len))
    ds = ds.to_iter_dataset()
    ds = ds.batch(batch_size=batch_size, drop_remainder=True)
    ds = ds.map(NormalizeFeatures())
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=n_workers))
    return ds


def create_grain_chunked_dataset(dataset, tokenizer, batch_size, seq_len, shuffle, n_workers, seed):
    ds = dataset.seed(seed)
    if shuffle:
        ds = ds.shuffle()
    ds = ds.map(DecodeArrayRecords())
    ds = ds.map(Tokenize(tokenizer))
    transform = SplitLongSequencesPad(seq_len, tokenizer.pad_token_id, drop_remainder=True)
    ds = grain.experimental.FlatMapMapDataset(ds, transform)
    ds = ds.to_iter_dataset()
    ds = ds.batch(batch_size=batch_size, drop_remainder=True)
    ds = ds.map(NormalizeFeatures())
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=n_workers))
    return ds


source = load_array_record_data_source(dataset_path)
dataset = grain.MapDataset.source(source)
results = {
    "source": [len(source), source[6]],
    "transforms": [repr(TokenizeTruncatePad(tokenizer, 8)),
                   TokenizeTruncatePad(tokenizer, 8) == TokenizeTruncatePad(tokenizer, 8)],
    "truncated": run(create_grain_truncated_dataset(dataset, tokenizer, 4, 10, True, True, 0, 3)),
    "plain": run(create_grain_truncated_dataset(dataset, tokenizer, 5, 6, False, False, 0, 3), 1),
    "chunked": run(create_grain_chunked_dataset(dataset, tokenizer, 3, 7, True, 0, 3)),
    "chunked len": len(grain.experimental.FlatMapMapDataset(dataset.map(DecodeArrayRecords()).map(Tokenize(tokenizer)),
                                                             SplitLongSequencesPad(7, 0, True))),
}
try:
    hash(NormalizeFeatures())
except TypeError as e:
    results["unhashable"] = str(e)
"""


def test_hyperlinear_truncated_and_chunked_datasets_as_on_grain(tmp_path):
  _write_text_records(tmp_path, _TEXTS)
  g, l = porting.run_both_grain_keys(HYPERLINEAR_TRUNCATED_CHUNKED, dataset_path=str(tmp_path))
  assert l == g
  assert g["source"][0] == 18 and g["source"][1] == b"doc 1.0 " + b"abc" * 2
  assert g["truncated"]["head"][0][:2] == ["Batch", "int64"] and len(g["truncated"]["head"][0][2]) == 4
  assert all(x["restored"] for x in (g["truncated"], g["plain"], g["chunked"]))
  assert g["chunked len"] == 90 and g["unhashable"].startswith("unhashable type")


# hyperlinear create_grain_packed_dataset: EOS-terminated documents
# tokenized whole, wrapped in dicts, `to_iter_dataset()`, then
# `ConcatThenSplitIterDataset(ds, length_struct=dict(text=seq_len))`
# (documents split across rows, the last row padded with 0), a map taking
# the "text" field, batches and `Batch` pytrees; states restored
# mid-stream, and Grain's states restored on loader.
HYPERLINEAR_PACKED = HYPERLINEAR + """
def create_grain_packed_dataset(dataset, tokenizer, batch_size, seq_len, shuffle, n_workers, seed):
    assert tokenizer.pad_token_id == 0, "ConcatThenSplitIterDataset assumes pad_token_id=0"
    ds = dataset.seed(seed)
    if shuffle:
        ds = ds.shuffle()
    ds = ds.map(DecodeArrayRecords())
    ds = ds.map(lambda x: x + tokenizer.eos_token)
    ds = ds.map(Tokenize(tokenizer))
    ds = ds.map(lambda x: dict(text=x))
    ds = ds.to_iter_dataset()
    ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct=dict(text=seq_len))
    ds = ds.map(lambda x: x["text"])
    ds = ds.batch(batch_size=batch_size, drop_remainder=True)
    ds = ds.map(NormalizeFeatures())
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=n_workers))
    return ds


dataset = grain.MapDataset.source(load_array_record_data_source(dataset_path))
pipelines = {
    "shuffled": (create_grain_packed_dataset(dataset, tokenizer, 2, 16, True, 0, 5), 3),
    "ordered": (create_grain_packed_dataset(dataset, tokenizer, 3, 11, False, 0, 5), 1),
}
results = {name: run(ds, steps) for name, (ds, steps) in pipelines.items()}
for name, state in given_states.items():  # States saved by the other library.
    it = iter(pipelines[name][0])
    it.set_state(state)
    results[name]["from given"] = [dump(b) for b in it] == results[name]["rest"]
"""


def test_hyperlinear_concat_then_split_packing_as_on_grain(tmp_path):
  _write_text_records(tmp_path, _TEXTS)
  g = porting.run(HYPERLINEAR_PACKED, "grain", dataset_path=str(tmp_path), given_states={}).results
  grain_states = {name: g[name]["state"] for name in g}
  l = porting.run(HYPERLINEAR_PACKED, "loader", dataset_path=str(tmp_path), given_states=grain_states).results
  g, l = porting.grain_keys(g), porting.grain_keys(l)
  for name in g:
    # README (Grain's CheckpointHandler row): loader's ConcatThenSplitIterDataset
    # state replays from an earlier parent position under other keys ("parent" +
    # "skip" where Grain has "parent_state"); it restores Grain's states exactly.
    gs, ls = g[name].pop("state"), l[name].pop("state")
    assert set(gs) == {"parent_state", "remainder_slices", "elements_from_buffer_after_checkpoint"}
    assert set(ls) == {"parent", "skip", "remainder_slices", "elements_from_buffer_after_checkpoint"}
    assert ls["remainder_slices"] == gs["remainder_slices"]
    assert l[name].pop("from given") is True
  assert l == g
  rows = [r for b in g["ordered"]["head"] + g["ordered"]["rest"] for r in b[2]]
  assert rows[0][:8] == list(b"doc 0.0 ") and all(len(r) == 11 for r in rows)
  assert g["shuffled"]["restored"] is True and g["ordered"]["restored"] is True



# hyperlinear create_grain_dataloader: the same transforms as `DataLoader`
# operations (`DecodeArrayRecords`, `TokenizeTruncatePad`, `Batch(drop_remainder=True)`,
# then the `NormalizeFeatures` map over whole batches), an `IndexSampler`
# without `shard_options` over the `pathlib.Path`-built ArrayRecord source;
# the loader's state after two batches restored on a new iterator.
HYPERLINEAR_LOADER = HYPERLINEAR + """
import json


def create_grain_dataloader(data_source, tokenizer, batch_size, seq_len, shuffle, n_workers, seed):
    index_sampler = grain.IndexSampler(num_records=len(data_source), num_epochs=1, shuffle=shuffle, seed=seed)
    operations = [DecodeArrayRecords(), TokenizeTruncatePad(tokenizer, seq_len),
                  grain.Batch(batch_size, drop_remainder=True), NormalizeFeatures()]
    return grain.DataLoader(data_source=data_source, operations=operations, sampler=index_sampler,
                            worker_count=n_workers)


source = load_array_record_data_source(dataset_path)
results = {}
for shuffle in (True, False):
    loader = create_grain_dataloader(source, tokenizer, 4, 9, shuffle, 0, 7)
    it = iter(loader)
    head = [dump(next(it)) for _ in range(2)]
    state = it.get_state()
    rest = [dump(b) for b in it]
    it2 = iter(loader)
    it2.set_state(state)
    results[shuffle] = {"head": head, "rest": rest, "state": json.loads(state),
                        "restored": [dump(b) for b in it2] == rest}
    if shuffle in given_states:  # A state saved by the other library.
        it3 = iter(loader)
        it3.set_state(given_states[shuffle])
        results[shuffle]["from given"] = [dump(b) for b in it3] == rest
"""


def test_hyperlinear_data_loader_as_on_grain(tmp_path):
  _write_text_records(tmp_path, _TEXTS)
  raw = porting.run(HYPERLINEAR_LOADER, "grain", dataset_path=str(tmp_path), given_states={}).results
  given = {k: json.dumps(v["state"]).encode() for k, v in raw.items()}
  g = porting.grain_keys(raw)
  l = porting.grain_keys(porting.run(HYPERLINEAR_LOADER, "loader", dataset_path=str(tmp_path),
                                     given_states=given).results)
  for k in g:
    # README, DataLoader row: the DataLoader state names an ArrayRecordDataSource by
    # loader's repr (files, records, files_hash), where Grain's repr is
    # "ArrayRecordDataSource(hash_of_paths=<sha1>)"; loader accepts Grain's
    # (loader/data_loader.py `_grain_source_reprs`), Grain refuses loader's.
    assert g[k]["state"].pop("data_source").startswith("ArrayRecordDataSource(hash_of_paths=")
    assert "files_hash=" in l[k]["state"].pop("data_source")
    assert l[k].pop("from given") is True
  assert l == g
  assert [len(g[k]["head"]) + len(g[k]["rest"]) for k in g] == [4, 4]
  assert g[True]["head"][0][:2] == ["Batch", "int64"] and g[True]["restored"] is True

# eqxformers' data/huggingface_datasets.py and its thread-prefetch check: an
# `IterDataset` (with a plain mixin class) over a streaming Hugging Face
# dataset, its `DatasetIterator` built with no parents, whose state is the
# stream's `state_dict()` and whose `set_state` reloads it and starts a new
# stream; wrapped in `WithOptionsIterDataset(ds, DatasetOptions(min_shm_size=
# 1 << 60))` and `ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)`;
# the script's `close_thread_it` (closes the iterator when it has `close`).
# States taken through the prefetch thread restore on a new iterator; a
# `map` and a `batch` downstream; `str()` of the source dataset.
EQXFORMERS = """
import grain
from grain.experimental import DatasetOptions, WithOptionsIterDataset, ThreadPrefetchIterDataset


class StreamingRows:  # A stand-in for datasets.IterableDataset (streaming=True).
    def __init__(self, rows, start=0):
        self._rows, self._start, self._pos = rows, start, start
        self.num_shards = 1

    def __iter__(self):
        self._pos = self._start
        for i in range(self._start, len(self._rows)):
            self._pos = i + 1
            yield self._rows[i]

    def state_dict(self):
        return {"examples_iterable": {"shard_idx": 0, "shard_example_idx": self._pos}}

    def load_state_dict(self, state):
        self._start = state["examples_iterable"]["shard_example_idx"]


class AlwaysFirst:
    pass


class _HuggingFaceSourceIterator(grain.DatasetIterator, AlwaysFirst):
    def __init__(self, dataset):
        super().__init__()
        self._dataset = dataset
        self._iterator = iter(self._dataset)

    def __next__(self):
        return next(self._iterator)

    def get_state(self):
        return self._dataset.state_dict()

    def set_state(self, state):
        self._dataset.load_state_dict(state)
        self._iterator = iter(self._dataset)


class HuggingFaceSourceIterableDataset(grain.IterDataset, AlwaysFirst):
    def __init__(self, source):
        super().__init__()
        self._source = source

    def __iter__(self) -> grain.DatasetIterator:
        return _HuggingFaceSourceIterator(self._source)

    def __str__(self) -> str:
        return "HuggingFaceIterableDataset"


def close_thread_it(it):
    if it is None:
        return
    if hasattr(it, "close"):
        try:
            it.close()
        except Exception:
            pass


rows = [{"text": f"row {i}", "id": i} for i in range(9)]
source_ds = HuggingFaceSourceIterableDataset(StreamingRows(rows))
ds = WithOptionsIterDataset(source_ds, DatasetOptions(min_shm_size=1 << 60))
tp_ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
tp_it = iter(tp_ds)
results = {"start": tp_it.get_state()}
first = next(tp_it)
second = next(tp_it)
state = tp_it.get_state()
results["first two"] = [first, second, state]
results["has close"] = hasattr(tp_it, "close")
close_thread_it(tp_it)
fresh = WithOptionsIterDataset(HuggingFaceSourceIterableDataset(StreamingRows(rows)),
                               DatasetOptions(min_shm_size=1 << 60))
it = iter(ThreadPrefetchIterDataset(fresh, prefetch_buffer_size=4))
it.set_state(state)
results["restored"] = [r["id"] for r in it]
batched = ThreadPrefetchIterDataset(
    HuggingFaceSourceIterableDataset(StreamingRows(rows)).map(lambda r: r["id"] * 10).batch(4), prefetch_buffer_size=2)
results["batched"] = [b.tolist() for b in batched]
results["names"] = [str(source_ds), isinstance(source_ds, AlwaysFirst), isinstance(tp_it, grain.DatasetIterator)]
"""


def test_eqxformers_streaming_source_under_options_and_thread_prefetch_as_on_grain():
  g, l = porting.run_both_grain_keys(EQXFORMERS)
  assert l == g
  assert g["start"] == {"examples_iterable": {"shard_idx": 0, "shard_example_idx": 0}}
  assert g["first two"][2]["examples_iterable"]["shard_example_idx"] == 2 and g["restored"] == list(range(2, 9))
  assert g["batched"] == [[0, 10, 20, 30], [40, 50, 60, 70], [80]]
  assert g["names"] == ["HuggingFaceIterableDataset", True, True]


# An equinox sine-regression script's `create_grain_dataloader`: a
# `grain.RandomAccessDataSource` generating `{"x", "y"}` float32 arrays of
# shape (1,), an `IndexSampler` without `shard_options` (Grain's default
# `NoSharding()`), and `operations=[grain.Batch(...), numpy_to_jax]`: a
# plain function, not a `MapTransform`, after the batch (Grain calls it
# with the whole iterator, as its legacy operations, so it returns the
# iterator unchanged: numpy batches). The script's per-instance
# `RandomState` noise (drawn in read order, which Grain's read threads do
# not fix) is a per-index generator here.
SINE = """
import grain.python as grain
import jax.numpy as jnp
import numpy as np


class SineDataSource(grain.RandomAccessDataSource):
    def __init__(self, n_samples: int, noise_scale: float = 0.1, seed: int = 42):
        self.n_samples = n_samples
        self.noise_scale = noise_scale
        self.seed = seed

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, idx: int):
        rng = np.random.RandomState(self.seed + idx)
        x = (idx / self.n_samples) * 6 - 3
        x += rng.uniform(-0.1, 0.1)
        y = np.sin(x)
        y += rng.normal(0, self.noise_scale)
        return {"x": np.array([x], dtype=np.float32), "y": np.array([y], dtype=np.float32)}


def numpy_to_jax(data):
    if isinstance(data, dict):
        return {"x": jnp.array(data["x"]), "y": jnp.array(data["y"])}
    return data


def create_grain_dataloader(n_samples, batch_size, shuffle=True, seed=42):
    source = SineDataSource(n_samples, seed=seed)
    sampler = grain.IndexSampler(num_records=len(source), num_epochs=1, shuffle=shuffle, seed=seed)
    transformations = [grain.Batch(batch_size=batch_size, drop_remainder=True), numpy_to_jax]
    return grain.DataLoader(data_source=source, sampler=sampler, operations=transformations, worker_count=0)


results = {}
for shuffle in (True, False):
    batches = list(create_grain_dataloader(11, 4, shuffle=shuffle))
    results[shuffle] = [[type(b).__name__, {k: [type(v).__name__, str(v.dtype), list(v.shape), np.round(v, 5).tolist()]
                                             for k, v in b.items()}] for b in batches]
"""


def test_sine_regression_plain_function_operation_as_on_grain():
  g, l = porting.run_both(SINE)
  assert porting.plain(l.results) == porting.plain(g.results)
  first = g.results[True][0][1]["x"]
  assert len(g.results[True]) == 2 and first[:3] == ["ndarray", "float32", [4, 1]]


# FluidGenie's data/grain loader: `.npy` fields memory-mapped
# (`np.load(mmap_mode="r")`) in the source's `__init__`, windows of
# `context` + `pred` frames indexed across files, float32 `(x, y)` tuples;
# `grain.samplers.IndexSampler(num_epochs=None, shard_options=
# grain.sharding.ShardOptions(0, 1, drop_remainder=True))`,
# `grain.transforms.Batch(drop_remainder=True)`, worker processes with
# `worker_buffer_size` (0 here, and 2 on loader). Batches across the epoch boundary, the state after
# them; a restore on a new iterator of the loader, and Grain's refusal of
# the state on a new loader (whose new source object has another default
# `repr`).
FLUIDGENIE = """
import glob
import json
import os
import sys

import grain
import numpy as np


class NPZSequenceDataset:
    def __init__(self, data_dir, context=2, pred=1, stats_path=None):
        self.files = sorted(glob.glob(os.path.join(data_dir, "*.npy")))
        assert self.files, f"No npy found in {data_dir}"
        self.context = context
        self.pred = pred
        self._memmaps = []
        self.mean = None
        self.std = None
        if stats_path:
            stats = np.load(stats_path)
            self.mean = stats["mean"].astype(np.float32)
            self.std = stats["std"].astype(np.float32)
        self.index = []
        for i, f in enumerate(self.files):
            data = np.load(f, mmap_mode="r")
            self._memmaps.append(data)
            T = data.shape[0]
            for t in range(0, T - (context + pred) + 1):
                self.index.append((i, t))

    def __len__(self):
        return len(self.index)

    def __getitem__(self, idx):
        file_idx, t = self.index[idx]
        fields = self._memmaps[file_idx]
        x = fields[t : t + self.context]
        y = fields[t + self.context : t + self.context + self.pred]
        x = x.astype(np.float32)
        y = y.astype(np.float32)
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / (self.std + 1e-6)
            y = (y - self.mean) / (self.std + 1e-6)
        return x, y


def create_grain_dataloader(data_dir, batch_size, context=2, seed=0, num_workers=4, stats_path=None,
                            worker_buffer_size=4):
    source = NPZSequenceDataset(data_dir, context=context, pred=1, stats_path=stats_path)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source), shuffle=True, seed=seed,
        shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True),
        num_epochs=None)
    operations = [grain.transforms.Batch(batch_size=batch_size, drop_remainder=True)]
    return grain.DataLoader(data_source=source, sampler=sampler, operations=operations,
                            worker_count=num_workers, worker_buffer_size=worker_buffer_size)


if __name__ == "__main__":
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags (the script runs under absl.app in training).
    data_dir, workers = sys.argv[1], int(sys.argv[2])
    np.savez(os.path.join(data_dir, "stats.npz"), mean=np.float64(2.0), std=np.float64(4.0))
    out = {}
    for stats in (None, os.path.join(data_dir, "stats.npz")):
        loader = create_grain_dataloader(data_dir, 4, seed=3, num_workers=workers, stats_path=stats,
                                         worker_buffer_size=2)
        it = iter(loader)
        batches = [next(it) for _ in range(5)]
        state = it.get_state()
        after = [next(it)[1].tolist() for _ in range(2)]
        try:  # A new source object: its default repr (an address) differs from the checkpoint's.
            iter(create_grain_dataloader(data_dir, 4, seed=3, num_workers=workers, stats_path=stats,
                                         worker_buffer_size=2)).set_state(state)
            new_loader = "restored"
        except ValueError as e:
            new_loader = ["ValueError", str(e).splitlines()[0]]
        it2 = iter(loader)
        it2.set_state(state)
        out[str(stats is None)] = {
            "new loader": new_loader,
            "batches": [[type(b).__name__, [str(v.dtype) for v in b], [list(v.shape) for v in b],
                         np.round(b[1], 4).tolist()] for b in batches],
            "state": {k: v for k, v in json.loads(state).items() if k in ("last_seen_indices", "last_worker_index",
                                                                           "worker_count", "sampler")},
            "restored": [next(it2)[1].tolist() for _ in range(2)] == after,
        }
    print(json.dumps(out))
"""


def _write_fields(directory):
  import numpy as np  # pylint: disable=import-outside-toplevel

  for n, frames in enumerate((6, 5)):
    np.save(directory / f"run_{n}.npy", (np.arange(frames * 4, dtype=np.float16) + 100 * n).reshape(frames, 2, 2, 1))


def test_fluidgenie_memmap_windows_with_workers_as_on_grain(tmp_path):
  _write_fields(tmp_path)
  run = lambda lib, workers: json.loads(porting.script_output(FLUIDGENIE, lib, tmp_path, str(tmp_path), workers)
                                        .strip().splitlines()[-1])
  g, l = run("grain", "0"), run("loader", "0")
  for name in g:
    # README (DataLoader row): a source with the default repr (an address) is
    # matched without the address, so loader resumes a new loader's iterator
    # where Grain 0.2.18 refuses its own checkpoint.
    refusal = ["ValueError", "DataSource in checkpoint does not match datasource in dataloader."]
    assert g[name].pop("new loader") == refusal
    assert l[name].pop("new loader") == "restored"
  assert l == g
  plain_run = g["True"]
  assert plain_run["batches"][0][:3] == ["tuple", ["float32", "float32"], [[4, 2, 2, 2, 1], [4, 1, 2, 2, 1]]]
  assert plain_run["restored"] is True and g["False"]["restored"] is True
  # The client's worker processes: README, "Worker-count-invariant batching" (Grain's
  # `Batch` with worker_count=2 batches each worker's records; loader's stream is the one without workers).
  l2 = run("loader", "2")
  for name in g:
    assert l2[name]["batches"] == g[name]["batches"] and l2[name]["restored"] is True
    assert l2[name]["state"]["worker_count"] == 2
