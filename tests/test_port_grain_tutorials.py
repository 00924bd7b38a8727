"""Grain 0.2.18's documentation tutorials, run unchanged on Grain and with only the import line on loader.

Sources (github.com/google/grain at tag v0.2.18): docs/tutorials/dataset_basic_tutorial.md,
data_loader_tutorial.md, data_sources/arrayrecord_data_source_tutorial.md and
dataset_advanced_tutorial.md (checkpointing, mixing, the prefetch / performance
config sections). Cells are kept as written except: prints and plots dropped
(their values kept in variables), sizes shrunk, and the tutorials' downloads
(TFDS datasets, a pretrained tokenizer, OpenCV) replaced by small local
stand-ins defined in the snippet. Shuffles (MapDataset.shuffle, IndexSampler,
WindowShuffleIterDataset) and random_map draws follow Grain's, so streams are
compared element by element with Grain's (with `plain`, as loader batches
bytes/str into numpy object arrays where Grain makes fixed-width arrays). The
tutorials' worker processes read unbatched elements, which Grain takes from
the workers in turn: the sampler's order, as in loader. One case still
differs: loader refuses a Grain DataLoader checkpoint taken inside a shuffled
epoch (see its test).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, structure

# ---- Dataset basics (docs/tutorials/dataset_basic_tutorial.md) -------------

DATASET_BASICS = """
from pprint import pprint
import grain

dataset = (
    # You can also use a shortcut grain.MapDataset.range for
    # range-like input.
    grain.MapDataset.source([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    .shuffle(seed=10)  # Shuffles globally.
    .map(lambda x: x + 1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)
first_dataset = dataset
first_item = dataset[0]
first_list = list(dataset)


# Note: Inheriting `grain.RandomAccessDataSource` is optional but recommended.
class MySource(grain.sources.RandomAccessDataSource):

  def __init__(self):
    self._data = [0, 1, 2, 3, 4, 5, 6, 7]

  def __getitem__(self, idx):
    return self._data[idx]

  def __len__(self):
    return len(self._data)


source = MySource()

dataset = (
    grain.MapDataset.source(source)
    .shuffle(seed=10)  # Shuffles globally.
    .map(lambda x: x + 1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)
second_item = dataset[0]
second_list = list(dataset)

# Prints the 3rd element of the second epoch.
third_of_second_epoch = dataset[len(dataset) + 2]
epochs_equal = dataset[len(dataset) + 2] == dataset[2]

filtered_dataset = dataset.filter(lambda e: (e[0] + e[1]) % 2 == 0)
filtered_length = f"Length of this dataset: {len(filtered_dataset)}"
filtered = [filtered_dataset[i] for i in range(len(filtered_dataset))]

shard_index = 0
shard_count = 2

sharded_dataset = dataset[shard_index::shard_count]
sharded_length = f"Sharded dataset length = {len(sharded_dataset)}"
sharded = [sharded_dataset[0], sharded_dataset[1]]

iter_dataset = sharded_dataset.to_iter_dataset(
    grain.ReadOptions(num_threads=16, prefetch_buffer_size=500)
)

iterated = []
for element in iter_dataset:
  iterated.append(element)

ds = (
    grain.MapDataset.range(10)
    .filter(lambda x: x % 2 == 0)
    .to_iter_dataset()
    .batch(2)  # Calling `batch` before `to_iter_dataset` will raise an error.
)
batched_after_filter = list(ds)

dataset_iter = iter(dataset)
is_dataset_iterator = isinstance(dataset_iter, grain.DatasetIterator)

before_checkpoint = next(dataset_iter)
checkpoint = dataset_iter.get_state()
after_checkpoint = next(dataset_iter)
# Recover the iterator to the state after the first produced element.
dataset_iter.set_state(checkpoint)
after_restore = next(dataset_iter)  # This should generate the same element as above
"""


def _flat(batches):
  return sorted(int(v) for b in batches for v in np.ravel(b))


def test_dataset_basics_tutorial():
  g, l = porting.run_both(DATASET_BASICS)
  for ns in (g, l):
    # Shuffled: the same elements in every epoch, batches of the same shapes.
    assert _flat(ns.first_list) == list(range(1, 12))
    assert [b.shape for b in ns.first_list] == [(2,)] * 5 + [(1,)]
    np.testing.assert_array_equal(ns.first_item, ns.first_list[0])
    assert _flat(ns.second_list) == list(range(1, 9))
    np.testing.assert_array_equal(ns.second_item, ns.second_list[0])
    # Indices past the length read the next epoch, reshuffled.
    epoch_2 = [ns.dataset[len(ns.dataset) + i] for i in range(len(ns.dataset))]
    assert _flat(epoch_2) == list(range(1, 9))
    assert [plain(b) for b in epoch_2] != [plain(b) for b in ns.second_list]
    np.testing.assert_array_equal(ns.third_of_second_epoch, epoch_2[2])
    assert ns.epochs_equal.shape == (2,)
    # A filtered position holds None; the others keep their element.
    assert len(ns.filtered) == 4
    for i, e in enumerate(ns.filtered):
      kept = (ns.second_list[i][0] + ns.second_list[i][1]) % 2 == 0
      assert (e is not None) == kept
      if kept:
        np.testing.assert_array_equal(e, ns.second_list[i])
    assert plain(ns.sharded) == plain(ns.second_list[0::2])
    assert plain(ns.iterated) == plain(ns.second_list[0::2])
    assert ns.is_dataset_iterator
    assert plain(ns.before_checkpoint) == plain(ns.second_list[0])
    assert plain(ns.after_checkpoint) == plain(ns.after_restore) == plain(ns.second_list[1])
  for name in ("filtered_length", "sharded_length"):
    assert getattr(g, name) == getattr(l, name)
  # The shuffle is Grain's: every list above, element by element.
  for name in ("first_item", "first_list", "second_item", "second_list", "third_of_second_epoch", "epochs_equal",
               "filtered", "sharded", "iterated", "before_checkpoint", "after_checkpoint", "after_restore"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  epoch_2 = lambda ns: [plain(ns.dataset[len(ns.dataset) + i]) for i in range(len(ns.dataset))]
  assert epoch_2(l) == epoch_2(g)
  assert plain(l.batched_after_filter) == plain(g.batched_after_filter) == [[0, 2], [4, 6], [8]]


# ---- DataLoader tutorial (docs/tutorials/data_loader_tutorial.md) ----------

DATA_LOADER_TUTORIAL = """
from absl import flags
flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags (a notebook has them parsed).
import orbax.checkpoint as ocp
import grain.python as grain
import numpy as np

# Setting `num_records` to 5 to limit results.
# For full dataset, set to `len(data_source)`.
index_sampler_example = grain.IndexSampler(
    num_records=5,
    num_epochs=2,
    shard_options=grain.ShardOptions(
        shard_index=0, shard_count=1, drop_remainder=True),
    shuffle=True,
    seed=0)

# Iterator is consumed.
sampled = []
for record_metadata in index_sampler_example:
  sampled.append(record_metadata)

# Create new iterator.
index_sampler = grain.IndexSampler(
    num_records=5,
    num_epochs=2,
    shard_options=grain.ShardOptions(
        shard_index=0, shard_count=1, drop_remainder=True),
    shuffle=True,
    seed=0)


# Stand-in for tfds.data_source("imagenet_a", split="test"): no downloads in tests.
class ImagenetA:

  def __len__(self):
    return 12

  def __getitem__(self, i):
    side = 20 + i
    image = (np.arange(side * side * 3) % 251).astype(np.uint8).reshape(side, side, 3)
    return {"image": image, "file_name": f"img_{i}.jpeg".encode(), "label": i % 4}


source = ImagenetA()
num_records = len(source)
first_record = source[0]


class ResizeAndCrop(grain.MapTransform):

  def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    image = element["image"]
    # cv2.resize(image, dsize=(256, 256)) in the tutorial; numpy keeps the test free of OpenCV.
    image = np.resize(image, (18, 18, 3))
    image = image[:16, :16]
    element["image"] = image
    return element

transformations = [ResizeAndCrop()]

data_loader = grain.DataLoader(
    data_source=source,
    operations=transformations,
    sampler=index_sampler,
    worker_count=0)

shown = []
for element in data_loader:
  shown.append(element)

data_iter = iter(data_loader)

num_steps = 5

# Read some elements.
first_reads = []
for i in range(num_steps):
  x = next(data_iter)
  first_reads.append((i, x["file_name"], x["label"]))

mngr = ocp.CheckpointManager(checkpoint_dir)

# Save the checkpoint (Grain 0.2.18 spells the tutorial's GrainCheckpointSave as PyGrainCheckpointSave).
assert mngr.save(
    step=num_steps, args=grain.PyGrainCheckpointSave(data_iter), force=True)
# Checkpoint saving in Orbax is asynchronous by default, so we'll wait until
# finished before examining checkpoint.
mngr.wait_until_finished()

# Read more elements and advance the iterator
read_after_save = []
for i in range(5, 10):
  x = next(data_iter)
  read_after_save.append((i, x["file_name"], x["label"]))

# Restore iterator from previously saved checkpoint
mngr.restore(num_steps, args=grain.PyGrainCheckpointRestore(data_iter))

# Iterator should be set back to start from 5.
read_after_restore = []
for i in range(5, 10):
  x = next(data_iter)
  read_after_restore.append((i, x["file_name"], x["label"]))

in_memory_datasource = grain.InMemoryDataSource(range(5))
first_in_memory = in_memory_datasource[0]

data_loader = grain.DataLoader(
    data_source=in_memory_datasource,
    sampler=grain.IndexSampler(
      num_records=len(in_memory_datasource),
      num_epochs=2,
      shard_options=grain.NoSharding(),
      shuffle=True,
      seed=0),
    worker_count=2)

data_iter = iter(data_loader)

in_memory_read = []
for i in range(len(in_memory_datasource) * 2):
  x = next(data_iter)
  in_memory_read.append(x)

# Following configuration makes 8*10=80 threads reading data.
data_loader = grain.DataLoader(
    data_source=source,
    sampler=grain.IndexSampler(
      num_records=len(source),
      num_epochs=2,
      shard_options=grain.NoSharding(),
      shuffle=True,
      seed=0),
    worker_count=10,
    read_options=grain.ReadOptions(num_threads=8, prefetch_buffer_size=500))
"""


def test_data_loader_tutorial(tmp_path):
  g = porting.run(DATA_LOADER_TUTORIAL, "grain", checkpoint_dir=str(tmp_path / "grain_orbax"))
  l = porting.run(DATA_LOADER_TUTORIAL, "loader", checkpoint_dir=str(tmp_path / "loader_orbax"))
  for ns in (g, l):
    assert [m.index for m in ns.sampled] == list(range(10))
    assert [sorted(m.record_key for m in ns.sampled[e * 5:e * 5 + 5]) for e in (0, 1)] == [list(range(5))] * 2
    assert all(isinstance(m.rng, np.random.Generator) for m in ns.sampled)
    # Two epochs of the 5 sampled records, each cropped to 16x16.
    assert len(ns.shown) == 10
    assert {structure(e["image"]) for e in ns.shown} == {((16, 16, 3), "uint8")}
    names = [e["file_name"] for e in ns.shown]
    assert sorted(names[:5]) == sorted(names[5:]) == [f"img_{i}.jpeg".encode() for i in range(5)]
    assert ns.read_after_restore == ns.read_after_save
    assert sorted(plain(ns.in_memory_read)) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
  assert g.num_records == l.num_records
  # The sampler's shuffle and per-record rngs are Grain's.
  sampled = lambda ns: [(m.index, m.record_key, m.rng.integers(1 << 30)) for m in ns.sampled]
  assert sampled(l) == sampled(g)
  assert [plain(e) for e in l.shown] == [plain(e) for e in g.shown]
  assert plain(l.first_reads) == plain(g.first_reads)
  assert plain(l.read_after_save) == plain(g.read_after_save)
  # Two workers, no batching: Grain's round-robin over the workers gives the sampler's order, as loader does.
  assert plain(l.in_memory_read) == plain(g.in_memory_read)
  assert plain(g.first_in_memory) == plain(l.first_in_memory) == 0


# ---- ArrayRecord data source tutorial (docs/tutorials/data_sources/arrayrecord_data_source_tutorial.md)

ARRAYRECORD_TUTORIAL = """
import pickle
import grain
from array_record.python import array_record_module

# Stand-in for tfds.data_source("bool_q", split="train"): no downloads in tests.
test_tfds = [
    {"question": f"is record {i} in the test file".encode(), "answer": i % 2 == 0, "title": b"t"}
    for i in range(1050)
]

# Write the dataset into a test array_record file.
example_file_path = directory + "/test.array_record"
writer = array_record_module.ArrayRecordWriter(
    example_file_path, "group_size:1"
)
record_count = 0
for record in test_tfds:
  writer.write(pickle.dumps(record))
  record_count += 1
writer.close()

example_array_record_data_source = (grain.sources.ArrayRecordDataSource(
    example_file_path
))
number_of_records = len(example_array_record_data_source)
first_record = example_array_record_data_source[0]


# Stand-in for tokenizers.Tokenizer.from_pretrained("bert-base-cased").
class Tokenizer:

  class Encoding:

    def __init__(self, tokens):
      self.tokens = tokens

  def encode(self, text):
    return self.Encoding(["[CLS]"] + text.split() + ["[SEP]"])


tokenizer = Tokenizer()


class ParseAndTokenizeText(grain.transforms.Map):
  \"\"\"This function takes a serialized dict (as bytes), decodes it,

  applies a tokenizer to a specified feature within the dict,
  and returns the first 10 tokens from results.
  \"\"\"

  def __init__(self, tokenizer, feature_name):
    self._tokenizer = tokenizer
    self._feature_name = feature_name

  def map(self, element: bytes) -> [str]:
    parsed_element = pickle.loads(element)
    # only pick the first 10 token IDs from the tokenized text for testing
    return self._tokenizer.encode(
        parsed_element[self._feature_name].decode('utf-8')
    ).tokens[:10]


# Example using Grain's MapDataset with ArrayRecord file source.
example_datasets = (
    grain.MapDataset.source(example_array_record_data_source)
    .shuffle(seed=42)
    .map(ParseAndTokenizeText(tokenizer, "question"))
    .batch(batch_size=10)
)

# Output a record at a random index
record_at_100 = example_datasets[100]
"""


def test_arrayrecord_data_source_tutorial(tmp_path):
  (tmp_path / "grain").mkdir()
  (tmp_path / "loader").mkdir()
  g = porting.run(ARRAYRECORD_TUTORIAL, "grain", directory=str(tmp_path / "grain"))
  l = porting.run(ARRAYRECORD_TUTORIAL, "loader", directory=str(tmp_path / "loader"))
  assert g.number_of_records == l.number_of_records == 1050
  assert g.first_record == l.first_record  # Raw bytes, exactly.
  assert len(g.example_datasets) == len(l.example_datasets) == 105
  # A batch of token lists is a list (one entry per token position) of arrays of 10 strings.
  assert structure(g.record_at_100) == structure(l.record_at_100) == [((10,), "str")] * 9
  assert plain(l.record_at_100) == plain(g.record_at_100)
  epoch = lambda ns: [tokens for b in ns.example_datasets for tokens in zip(*plain(b))]
  assert epoch(l) == epoch(g)  # Grain's shuffle: the same records in the same order.
  assert len(set(epoch(l))) == 1050


# ---- Advanced Dataset tutorial (docs/tutorials/dataset_advanced_tutorial.md)

MNIST_STAND_IN = """
import numpy as np


class Mnist:
  \"\"\"Stand-in for tfds.data_source(name, split="train"): no downloads in tests.\"\"\"

  def __init__(self, name, n, offset):
    self._name, self._n, self._offset = name, n, offset

  def __len__(self):
    return self._n

  def __getitem__(self, i):
    features = {"image": np.full((4, 4, 1), (i + self._offset) % 256, np.uint8), "label": (i + self._offset) % 10}
    if FOR_DEVICE:  # device_put shards every leaf along its first axis: arrays of rank >= 1 only.
      features["label"] = np.array([features["label"]])
    else:  # Tells the inputs of a mixture apart.
      features["id"] = f"{self._name}/{i}"
    return features


def tfds_data_source(name, split):
  return Mnist(name, 60, 0) if name == "mnist" else Mnist(name, 30, 7)
"""

ADVANCED_CHECKPOINT_AND_MIXING = "FOR_DEVICE = False\n" + MNIST_STAND_IN + """
import grain
import numpy as np
from pprint import pprint

ds = (
    grain.MapDataset.source(tfds_data_source("mnist", split="train"))
    .seed(seed=45)
    .shuffle()
    .to_iter_dataset()
)

num_steps = 4
ds_iter = iter(ds)

# Read some elements.
first_labels = []
for i in range(num_steps):
  x = next(ds_iter)
  first_labels.append((i, x["label"]))

import orbax.checkpoint as ocp

mngr = ocp.CheckpointManager(checkpoint_dir)

# Save the checkpoint.
assert mngr.save(
    step=num_steps, args=grain.checkpoint.CheckpointSave(ds_iter), force=True
)
# Checkpoint saving in Orbax is asynchronous by default, so we'll wait until
# finished before examining checkpoint.
mngr.wait_until_finished()

# Read more elements and advance the iterator.
read_after_save = []
for i in range(4, 8):
  x = next(ds_iter)
  read_after_save.append((i, x["label"]))

# Restore iterator from the previously saved checkpoint.
mngr.restore(num_steps, args=grain.checkpoint.CheckpointRestore(ds_iter))
# Iterator should be set back to start from 4.
read_after_restore = []
for i in range(4, 8):
  x = next(ds_iter)
  read_after_restore.append((i, x["label"]))

# This particular dataset mixes medical images with hand written numbers,
# probably not useful but allows to illustrate the API on small datasets.
source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).map(lambda features: features["image"])
ds2 = grain.MapDataset.source(source2).map(lambda features: features["image"])
ds = grain.MapDataset.mix([ds1, ds2], weights=[0.7, 0.3])
mixed_length = f"Mixed dataset length = {len(ds)}"
mixed_shape = np.shape(ds[0])
mixed = list(ds)

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = (
    grain.MapDataset.source(source1)
    .filter(lambda features: int(features["label"]) == 1)
    .to_iter_dataset()
)
ds2 = (
    grain.MapDataset.source(source2)
    .filter(lambda features: int(features["label"]) > 4)
    .to_iter_dataset()
)

ds = grain.IterDataset.mix([ds1, ds2], weights=[0.7, 0.3]).map(
    lambda features: features["image"]
)
iter_mixed_shape = np.shape(next(iter(ds)))
iter_mixed = list(ds)

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).repeat()
ds2 = grain.MapDataset.source(source2).repeat()

ds = grain.MapDataset.mix([ds1, ds2], weights=[1, 2])
repeated_lengths = [len(ds1), len(ds2), len(ds)]  # sys.maxsize each
repeated_head = [ds[i] for i in range(200)]

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).seed(42).shuffle().repeat()
ds2 = grain.MapDataset.source(source2).seed(43).shuffle().repeat()

ds = grain.MapDataset.mix([ds1, ds2], weights=[1, 2])
shuffled_mixed_length = f"Mixed dataset length = {len(ds)}"  # sys.maxsize
shuffled_mixed_head = [ds[i] for i in range(90)]
"""


def test_advanced_tutorial_checkpointing_and_mixing(tmp_path):
  g = porting.run(ADVANCED_CHECKPOINT_AND_MIXING, "grain", checkpoint_dir=str(tmp_path / "grain_orbax"))
  l = porting.run(ADVANCED_CHECKPOINT_AND_MIXING, "loader", checkpoint_dir=str(tmp_path / "loader_orbax"))
  for ns in (g, l):
    assert ns.read_after_restore == ns.read_after_save
    assert len({label for _, label in ns.first_labels + ns.read_after_save}) > 1
  # The shuffle is Grain's: the same labels at the same steps.
  assert plain(l.first_labels) == plain(g.first_labels)
  assert plain(l.read_after_save) == plain(g.read_after_save)
  # No randomness in these mixtures: exactly Grain's elements and order.
  assert g.mixed_length == l.mixed_length
  assert g.mixed_shape == l.mixed_shape == (4, 4, 1)
  assert plain(g.mixed) == plain(l.mixed)
  assert g.iter_mixed_shape == l.iter_mixed_shape
  assert plain(g.iter_mixed) == plain(l.iter_mixed)
  assert g.repeated_lengths == l.repeated_lengths
  assert plain(g.repeated_head) == plain(l.repeated_head)
  # Shuffled inputs: Grain's elements in Grain's order; each input's first
  # epoch holds all its elements once.
  assert g.shuffled_mixed_length == l.shuffled_mixed_length
  assert plain(l.shuffled_mixed_head) == plain(g.shuffled_mixed_head)
  for ns in (g, l):
    ids = [e["id"] for e in ns.shuffled_mixed_head]
    assert sorted(ids) == sorted([f"mnist/{i}" for i in range(60)] + [f"pneumonia_mnist/{i}" for i in range(30)])


# The tutorial's "Prefetching" section: thread prefetch, device_put, ReadOptions,
# pick_performance_config (the performance config recipe) and mp_prefetch.
ADVANCED_PREFETCHING = "FOR_DEVICE = True\n" + MNIST_STAND_IN + """
from absl import flags
flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags (a notebook has them parsed).

import grain
import jax

cpu_buffer_size = 3
source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source).to_iter_dataset()
ds.map(lambda x: x)  # Dummy map to illustrate the usage.
ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)
ds = ds.map(jax.device_put)
thread_prefetched = list(ds)

import grain
import jax
import numpy as np

cpu_buffer_size = 3
tpu_buffer_size = 2
source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source).to_iter_dataset()
ds.map(lambda x: x)  # Dummy map to illustrate the usage.

devices = jax.devices()

mesh = jax.sharding.Mesh(np.array(devices), axis_names=('data',))
p = jax.sharding.PartitionSpec('data')
sharding = jax.sharding.NamedSharding(mesh, p)

ds = grain.experimental.device_put(
        ds=ds,
        device=sharding,
        cpu_buffer_size=cpu_buffer_size,
        device_buffer_size=tpu_buffer_size,
    )
on_device = list(ds)

import grain
import jax
import numpy as np

# If not set defaults to 16 threads and buffer 500.
read_options = grain.ReadOptions(num_threads=32, prefetch_buffer_size=400)
default_read_options = grain.ReadOptions()

source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source).to_iter_dataset(read_options=read_options)
read_with_options = list(ds)

import grain
import jax
import numpy as np

source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source)
performance_config = grain.experimental.pick_performance_config(
        ds=ds,
        ram_budget_mb=1024,
        max_workers=None,
        max_buffer_size=None
    )
ds = ds.to_iter_dataset(read_options=performance_config.read_options)
read_with_picked_options = list(ds)

import grain
import tensorflow_datasets as tfds

source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source).to_iter_dataset()

prefetch_lazy_iter_ds = ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=3, per_worker_buffer_size=10),
    )
from_three_workers = list(prefetch_lazy_iter_ds)

import grain
import tensorflow_datasets as tfds

source = tfds_data_source(name="mnist", split="train")
ds = grain.MapDataset.source(source).to_iter_dataset()

performance_config = grain.experimental.pick_performance_config(
        ds=ds,
        ram_budget_mb=1024,
        max_workers=None,
        max_buffer_size=None
    )

prefetch_lazy_iter_ds = ds.mp_prefetch(
        performance_config.multiprocessing_options,
    )
from_picked_workers = list(prefetch_lazy_iter_ds)
"""


def test_advanced_tutorial_prefetching_and_performance_config():
  g, l = porting.run_both(ADVANCED_PREFETCHING)
  source = g.tfds_data_source("mnist", "train")
  everything = [plain(source[i]) for i in range(len(source))]
  assert len(everything) == 60
  for name in ("thread_prefetched", "on_device", "read_with_options", "read_with_picked_options",
               "from_three_workers", "from_picked_workers"):
    assert [plain(e) for e in getattr(g, name)] == everything, f"Grain: {name}"
    assert [plain(e) for e in getattr(l, name)] == everything, f"loader: {name}"
  assert (l.default_read_options.num_threads, l.default_read_options.prefetch_buffer_size) == (
      g.default_read_options.num_threads, g.default_read_options.prefetch_buffer_size) == (16, 500)
  for ns in (g, l):
    assert ns.performance_config.multiprocessing_options.num_workers >= 0
    import jax  # pylint: disable=g-import-not-at-top
    assert all(isinstance(e["image"], jax.Array) for e in ns.on_device + ns.thread_prefetched)


# ---- DataLoader docs (docs/data_loader/transformations.md, samplers.md) ------

DATA_LOADER_DOCS = """
import grain
import numpy as np


""" + porting.TRANSFORMATIONS_PAGE_CLASSES + """


batch_size, drop_remainder = 2, False
flat_map_example = FlatMapTransformExample()
flat_map_example.max_fan_out = 3

index_sampler = grain.samplers.IndexSampler(
  num_records=5,
  num_epochs=2,
  shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True),
  shuffle=True,
  seed=0)
printed = []
for record_metadata in index_sampler:
  printed.append(record_metadata)


# "Implement your own sampler": Grain 0.2.18's Sampler protocol is __getitem__
# (IndexError past the end); __repr__ goes into checkpoints.
class EveryThirdSampler:

  def __init__(self, num_records):
    self._num_records = num_records

  def __getitem__(self, index):
    if index < 0 or index >= 2 * self._num_records:
      raise IndexError(index)
    return grain.RecordMetadata(index=index, record_key=(3 * index) % self._num_records,
                                rng=np.random.Generator(np.random.Philox(key=index)))

  def __repr__(self):
    return f"EveryThirdSampler(num_records={self._num_records})"


def read(operations, sampler=None):
  sampler = sampler or grain.samplers.IndexSampler(num_records=10, shuffle=False, seed=3, num_epochs=1)
  return list(grain.DataLoader(data_source=grain.sources.RangeDataSource(0, 10, 1), sampler=sampler,
                               operations=operations, worker_count=0, shard_options=grain.sharding.NoSharding()))


loaded = {
    "map_filter_batch": read([PlusOne(), RemoveEvenElements(),
                              grain.transforms.Batch(batch_size=batch_size, drop_remainder=drop_remainder)]),
    "random_map": read([PlusRandom()]),
    "flat_map": read([flat_map_example]),
    "own_sampler": read([PlusRandom()], EveryThirdSampler(10)),
}
it = iter(grain.DataLoader(data_source=grain.sources.RangeDataSource(0, 10, 1), sampler=EveryThirdSampler(10),
                           operations=[PlusOne()], worker_count=0, shard_options=grain.sharding.NoSharding()))
head = [next(it) for _ in range(7)]
state = it.get_state()
rest = list(it)
it.set_state(state)
loaded["own_sampler_resumed"] = [head, rest, list(it)]

datasets = {
    "map": list(grain.MapDataset.range(10).map(PlusOne()).filter(RemoveEvenElements())),
    "map_with_index": list(grain.MapDataset.range(5).map_with_index(PlusOneWithIndexKey())),
    "random_map": list(grain.MapDataset.range(10).random_map(PlusRandom(), seed=3)),
}
"""


def test_data_loader_docs_transformations_and_samplers():
  g, l = porting.run_both(DATA_LOADER_DOCS)
  for ns in (g, l):
    assert [m.index for m in ns.printed] == list(range(10))
    assert sorted(m.record_key for m in ns.printed[:5]) == sorted(m.record_key for m in ns.printed[5:]) == [0, 1, 2, 3, 4]
  # The sampler's shuffle and per-record rngs are Grain's.
  printed = lambda ns: [(m.index, m.record_key, m.rng.integers(1 << 30)) for m in ns.printed]
  assert printed(l) == printed(g)
  # Grain's results exactly, random_map included (the DataLoader's per-record
  # generators are seeded as Grain seeds them).
  assert plain(l.loaded) == plain(g.loaded)
  assert plain(g.loaded["map_filter_batch"]) == [[1, 3], [5, 7], [9]]
  assert all(0 <= v - (3 * i) % 10 < 100_000 for i, v in enumerate(plain(g.loaded["own_sampler"])))
  head, rest, resumed = plain(g.loaded["own_sampler_resumed"])
  assert rest == resumed and head + rest == [(3 * i) % 10 + 1 for i in range(20)]
  assert plain(l.datasets)["map"] == plain(g.datasets)["map"] == [1, 3, 5, 7, 9]
  assert plain(l.datasets["map_with_index"]) == plain(g.datasets["map_with_index"])
  assert plain(l.datasets["random_map"]) == plain(g.datasets["random_map"])  # Grain's Philox draws.
  assert all(x <= v < x + 100_000 for x, v in enumerate(g.datasets["random_map"]))


# ---- Parquet tutorial (docs/tutorials/data_sources/parquet_dataset_tutorial.md)

PARQUET_FILES = """
import pyarrow as pa
import pyarrow.parquet as pq

filenames = []
for shard in range(3):
  # Generate a sample PyArrow table containing email subjects and bodies.
  table = pa.table({
      'email_subject': [f"Subject {shard}-{i}" for i in range(7)],
      'email_body': [f"Hi team, this is mail {i} of shard {shard}" for i in range(7)],
  })
  # Write this table to a parquet file.
  filename = f"{directory}/emails-{shard}.parquet"
  writer = pq.ParquetWriter(filename, table.schema)
  writer.write_table(table)
  writer.close()
  filenames.append(filename)
"""

PARQUET_TUTORIAL = PARQUET_FILES + """
import grain
import pprint

ds = grain.experimental.ParquetIterDataset(filenames[0])
first = list(ds)[0]


# Stand-in for tokenizers.Tokenizer.from_pretrained("bert-base-cased").
class Tokenizer:

  class Encoding:

    def __init__(self, tokens):
      self.tokens = tokens

  def encode(self, text):
    return self.Encoding(text.split())


tokenizer = Tokenizer()


class TokenizeText(grain.transforms.Map):
  \"\"\"Tokenizes the text values within each element using a provided tokenizer.\"\"\"

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer

  def map(self, element):
    return [self._tokenizer.encode(item).tokens for item in element.values()]


# Tokenize the data using the provided tokenizer.
ds = ds.map(TokenizeText(tokenizer))
# Create an iterator object of the dataset.
ds_iter = iter(ds)
tokenized = next(ds_iter)
"""


def test_parquet_tutorial(tmp_path):
  g, l = [porting.run(PARQUET_TUTORIAL, lib, directory=str(tmp_path)) for lib in porting.LIBS]
  assert g.first == l.first == {"email_subject": "Subject 0-0", "email_body": "Hi team, this is mail 0 of shard 0"}
  assert plain(g.tokenized) == plain(l.tokenized) == [["Subject", "0-0"], "Hi team, this is mail 0 of shard 0".split()]


# The advanced tutorial's hierarchical shuffle cell. It maps file names with
# the dataset class itself (`dataset.map(parquet_dataset.ParquetIterDataset)`;
# the public name in 0.2.18 is grain.experimental.ParquetIterDataset): Grain
# calls any callable, classes included.
HIERARCHICAL_SHUFFLE = PARQUET_FILES + """
import grain

dataset = grain.MapDataset.source(filenames)
dataset = dataset.map(grain.experimental.ParquetIterDataset)
dataset = grain.experimental.WindowShuffleIterDataset(
    grain.experimental.InterleaveIterDataset(dataset, cycle_length=len(filenames)),
    window_size=10,
    seed=42)
iter_ds = iter(dataset)
first_five = []
for _ in range(5):
  first_five.append(next(iter_ds))
state = iter_ds.get_state()
rest = list(iter_ds)
iter_ds = iter(dataset)
iter_ds.set_state(state)
resumed = list(iter_ds)
"""


def test_advanced_tutorial_hierarchical_shuffle(tmp_path):
  g, l = [porting.run(HIERARCHICAL_SHUFFLE, lib, directory=str(tmp_path)) for lib in porting.LIBS]
  for ns in (g, l):
    stream = ns.first_five + ns.rest
    assert len(stream) == 21 and ns.resumed == ns.rest
    assert sorted(e["email_subject"] for e in stream) == sorted(f"Subject {s}-{i}" for s in range(3) for i in range(7))
  # Interleaving is deterministic and the window shuffle is Grain's: the same stream.
  assert plain(l.first_five) == plain(g.first_five)
  assert plain(l.rest) == plain(g.rest)


# ---- Dataset debugging tutorial (docs/tutorials/dataset_debugging_tutorial.md)

DEBUGGING_TUTORIAL = """
import grain.python as grain

grain.config.update("py_dataset_visualization_output_dir", "")
ds = (
    grain.MapDataset.range(20)
    .seed(seed=42)
    .shuffle()
    .batch(batch_size=2)
    .map(lambda x: x)
    .to_iter_dataset()
)
it = iter(ds)

# Visualization graph is constructed once the dataset produces the first element
visualized = []
for _ in range(10):
  visualized.append(next(it))

import time


# Define a dummy slow preprocessing function
def _dummy_slow_fn(x):
  time.sleep(0.01)  # 10 s in the tutorial.
  return x


grain.config.update("py_debug_mode", True)

ds = (
    grain.MapDataset.range(20)
    .seed(seed=42)
    .shuffle()
    .batch(batch_size=2)
    .map(_dummy_slow_fn)
    .to_iter_dataset()
    .map(_dummy_slow_fn)
)
it = iter(ds)

debugged = []
for _ in range(10):
  debugged.append(next(it))
"""


def test_dataset_debugging_tutorial():
  try:
    g, l = porting.run_both(DEBUGGING_TUTORIAL)
  finally:  # The options are process-wide: later tests run with the defaults.
    porting.run('import grain\ngrain.config.update("py_debug_mode", False)\n'
                'grain.config.update("py_dataset_visualization_output_dir", None)\n', "grain")
    porting.run('import grain\ngrain.config.update("py_debug_mode", False)\n'
                'grain.config.update("py_dataset_visualization_output_dir", None)\n', "loader")
  for ns in (g, l):
    for batches in (ns.visualized, ns.debugged):
      assert [b.shape for b in batches] == [(2,)] * 10
      assert _flat(batches) == list(range(20))
    assert plain(ns.visualized) == plain(ns.debugged)  # Same seed, same shuffle.
  assert plain(l.visualized) == plain(g.visualized)  # Grain's shuffle.


# ---- JAX training tutorial (docs/tutorials/jax_training_tutorial.md) --------

JAX_TRAINING_TUTORIAL = """
import grain
import jax
import jax.numpy as jnp
import numpy as np


class Mnist:
  \"\"\"Stand-in for tfds.data_source("mnist", split="train"): no downloads in tests.\"\"\"

  def __len__(self):
    return 40

  def __getitem__(self, i):
    return {"image": np.full((28, 28, 1), i, np.uint8), "label": np.int64(i % 10)}


source = Mnist()

ds = (
    grain.MapDataset.source(source)
    .seed(42)
    .shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(batch_size=8, drop_remainder=True)  # new leading dim
    .to_iter_dataset()
)

for batch in ds:
    batch = jax.device_put(batch)  # default device
    minimal = jax.tree.map(lambda x: (x.shape, x.dtype), batch)
    break

ds = (
    grain.MapDataset.source(source)
    .seed(42)
    .shuffle()
    .repeat()  # infinite stream
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(8, drop_remainder=True)
)
repeated_length = len(ds)  # sys.maxsize
two_epochs = [ds[i] for i in range(10)]


def pad_collate(items):
    max_len = max(x["tokens"].shape[0] for x in items)
    tokens = np.stack([
        np.pad(x["tokens"], (0, max_len - x["tokens"].shape[0]))
        for x in items
    ])
    return {"tokens": tokens}

# Toy stream of variable-length token sequences.
ragged = grain.MapDataset.source(
    [{"tokens": np.arange(np.random.randint(2, 6))} for _ in range(16)]
)
ragged = ragged.batch(4, batch_fn=pad_collate, drop_remainder=True)
ragged_shapes = []
for i in range(3):
    ragged_shapes.append(ragged[i]["tokens"].shape)

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(8, drop_remainder=True)
    .to_iter_dataset()
)
ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
ds = ds.map(jax.device_put)  # transfer still on iter thread

option_b = []
for step, batch in zip(range(3), ds):
    option_b.append(batch)

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(8, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds,
    device=jax.devices()[0],     # or a Sharding (see below)
    cpu_buffer_size=4,           # batches buffered on host
    device_buffer_size=2,        # batches buffered on device
)

option_c = []
for step, batch in zip(range(2), ds):
    option_c.append(batch)

""" + porting.JAX_TRAINING_TEMPLATE + """for step, batch in zip(range(5), ds):
  params = train_step(params, batch)
"""


def test_jax_training_tutorial():
  g, l = porting.run_both(JAX_TRAINING_TUTORIAL)
  import jax  # pylint: disable=g-import-not-at-top
  assert plain(l.minimal) == plain(g.minimal)
  assert {k: (s, str(d)) for k, (s, d) in l.minimal.items()} == {"image": ((8, 28, 28, 1), "float32"),
                                                                 "label": ((8,), "int32")}  # jax: x64 off.
  assert g.repeated_length == l.repeated_length
  for ns in (g, l):
    labels = [int(v) for b in ns.two_epochs for v in b["label"]]
    images = [int(round(float(img[0, 0, 0]) * 255)) for b in ns.two_epochs for img in b["image"]]
    assert sorted(images[:40]) == sorted(images[40:]) == list(range(40))  # Each epoch: every record once.
    assert labels == [i % 10 for i in images]
    assert all(s[0] == 4 and 2 <= s[1] <= 5 for s in ns.ragged_shapes)
    for batch in ns.option_b + ns.option_c:
      assert isinstance(batch["image"], jax.Array) and batch["image"].shape == (8, 28, 28, 1)
    # The first 5 shuffled batches are one epoch: their mean does not depend on the order.
    np.testing.assert_allclose(float(ns.params), 5 * np.mean(np.arange(40)) / 255, rtol=1e-5)
  # Grain's shuffle: the same batches, in the same order.
  assert plain(l.two_epochs) == plain(g.two_epochs)
  assert plain(l.option_b) == plain(g.option_b)
  assert plain(l.option_c) == plain(g.option_c)


# Switching mid-training with the DataLoader tutorial's Orbax checkpoint: written
# by the Grain job, restored by the same job on loader.
DATA_LOADER_CHECKPOINT_SAVE = """
import orbax.checkpoint as ocp
import grain.python as grain


def make_data_loader():
  return grain.DataLoader(
      data_source=grain.RangeDataSource(0, 20, 1),
      operations=[grain.Batch(batch_size=3)],
      sampler=grain.IndexSampler(num_records=20, num_epochs=2, shard_options=grain.NoSharding(),
                                 shuffle=shuffle, seed=0),
      worker_count=0)


data_iter = iter(make_data_loader())
for i in range(5):
  next(data_iter)
mngr = ocp.CheckpointManager(checkpoint_dir)
assert mngr.save(step=5, args=grain.PyGrainCheckpointSave(data_iter), force=True)
mngr.wait_until_finished()
after_save = list(data_iter)
"""

DATA_LOADER_CHECKPOINT_RESTORE = DATA_LOADER_CHECKPOINT_SAVE.split("data_iter = iter")[0] + """
data_iter = iter(make_data_loader())
mngr = ocp.CheckpointManager(checkpoint_dir)
try:
  mngr.restore(5, args=grain.PyGrainCheckpointRestore(data_iter))
  after_restore, error = list(data_iter), None
except ValueError as e:
  after_restore, error = None, e
"""


@pytest.mark.parametrize("shuffle", [False, True])
def test_data_loader_checkpoint_written_on_grain_restores_on_loader(tmp_path, shuffle):
  # Mid-epoch (15 of 20 records), shuffled or not: the sampler's order is
  # Grain's, so Grain's position resumes at Grain's next record.
  g = porting.run(DATA_LOADER_CHECKPOINT_SAVE, "grain", checkpoint_dir=str(tmp_path), shuffle=shuffle)
  l = porting.run(DATA_LOADER_CHECKPOINT_RESTORE, "loader", checkpoint_dir=str(tmp_path), shuffle=shuffle)
  assert l.error is None and plain(l.after_restore) == plain(g.after_save)
