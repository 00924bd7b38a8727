"""More of Grain 0.2.18's documentation, run unchanged on Grain and with only the import line on loader.

Sources (github.com/google/grain at tag v0.2.18, docs/): tutorials/jax_training_tutorial.md,
data_loader/samplers.md, data_loader/transformations.md, behind_the_scenes.md,
data_sources/protocol.rst, tutorials/data_sources/parquet_dataset_tutorial.md,
tutorials/dataset_debugging_tutorial.md and tutorials/performance_debugging.ipynb.
api_choice.md has no code. Cells are kept as written except: prints dropped
(their values kept in variables), sizes and sleeps shrunk, and downloads
(TFDS mnist / ag_news_subset, pretrained tokenizers) replaced by small local
stand-ins defined in the snippet. tests/test_port_grain_tutorials.py covers
other parts of some of these pages; this file adds what the pages print
(shardings, sampler and pprint output, log lines), multi-device sharding,
custom sources of protocol.rst, worker processes and the performance
debugging notebook.
"""

from __future__ import annotations

from loader import state as state_lib
from tests import porting
from tests.porting import plain

# ---- JAX training (docs/tutorials/jax_training_tutorial.md) -----------------

JAX_TRAINING = """
import grain
import jax
import jax.numpy as jnp
import numpy as np

np.random.seed(0)  # Added: the ragged cell's draws are the same on both runs.

# Stand-in for tfds.data_source("mnist", split="train"): no downloads in tests.
source = [{"image": np.full((28, 28, 1), i, np.uint8), "label": np.int64(i % 10)} for i in range(40)]

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
    minimal_batch = batch
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
length = len(ds)  # sys.maxsize


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
ragged_batches = []
for i in range(3):
    ragged_batches.append(ragged[i]["tokens"])

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(8, drop_remainder=True)
    .to_iter_dataset()
)

option_a = []
for step, batch in zip(range(2), ds):
    batch = jax.device_put(batch)
    option_a.append((step, batch["image"].shape, repr(batch["image"].sharding), batch))

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
    option_b.append((step, batch["image"].shape, repr(batch["image"].sharding), batch))

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
    # `batch` is already a jax.Array on-device.
    option_c.append((step, repr(batch["image"].sharding), repr(batch["label"].sharding),
                     type(batch["image"]).__name__, str(batch["label"].dtype), batch))
"""

# Sections 4 and 5 (sharding a batch over the devices), as a script on 4 CPU devices.
JAX_SHARDING = """
import json
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # Added: 4 CPU devices.

import grain
import jax
import jax.numpy as jnp
import numpy as np

# Stand-in for tfds.data_source("mnist", split="train").
source = [{"image": np.full((28, 28, 1), i, np.uint8), "label": np.int64(i % 10)} for i in range(40)]
out = {"devices": len(jax.devices())}

devices = jax.devices()
mesh = jax.sharding.Mesh(np.array(devices), axis_names=("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle().repeat()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(8, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds,
    device=sharding,
    cpu_buffer_size=4,
    device_buffer_size=2,
)

out["section_4"] = []
for step, batch in zip(range(3), ds):
    out["section_4"].append([
        step, repr(batch["image"].sharding), repr(batch["label"].sharding),
        [[str(s.device), list(s.data.shape), (s.data[:, 0, 0, 0] * 255).round().astype(int).tolist()]
         for s in batch["image"].addressable_shards],
        np.asarray(batch["label"]).tolist()])

""" + porting.JAX_TRAINING_TEMPLATE + """out["section_5"] = []
for step, batch in zip(range(3), ds):
  params = train_step(params, batch)
  out["section_5"].append([step, float(params)])
print(json.dumps(out))
"""


def test_jax_training_tutorial_prints_the_same():
  g, l = porting.run_both(JAX_TRAINING)
  assert plain(l.minimal) == plain(g.minimal)
  assert str(l.minimal) == str(g.minimal)  # {'image': ((8, 28, 28, 1), dtype('float32')), 'label': ((8,), ...)}
  assert plain(l.minimal_batch) == plain(g.minimal_batch)
  assert l.length == g.length
  assert plain(l.ragged_batches) == plain(g.ragged_batches)
  for name in ("option_a", "option_b", "option_c"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  assert "SingleDeviceSharding" in g.option_c[0][1]


def test_jax_training_tutorial_shards_batches_over_devices(tmp_path):
  g = porting.run_script(JAX_SHARDING, "grain", tmp_path)
  l = porting.run_script(JAX_SHARDING, "loader", tmp_path)
  assert g["devices"] == 4
  assert l == g
  assert all(len(shards) == 4 and all(shape[0] == 2 for _, shape, _ in shards) for *_, shards, _ in g["section_4"])


# ---- Samplers (docs/data_loader/samplers.md) --------------------------------

SAMPLERS = """
import numpy as np
import grain

index_sampler = grain.samplers.IndexSampler(
  num_records=5,
  num_epochs=2,
  shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True),
  shuffle=True,
  seed=0)
printed = []
for record_metadata in index_sampler:
  printed.append(str(record_metadata))  # print(record_metadata)
sampler_repr = repr(index_sampler)


# "Implement your own sampler": the page's interface, __iter__ / __next__
# yielding RecordMetadata.
class EveryOtherSampler:

  def __init__(self, num_records):
    self._num_records = num_records
    self._index = 0

  def __iter__(self):
    return self

  def __next__(self) -> grain.RecordMetadata:
    if self._index >= self._num_records:
      raise StopIteration
    metadata = grain.RecordMetadata(index=self._index, record_key=(2 * self._index) % self._num_records,
                                    rng=np.random.Generator(np.random.Philox(self._index)))
    self._index += 1
    return metadata


own = [str(m) for m in EveryOtherSampler(5)]
try:
  own_loaded = list(grain.DataLoader(data_source=grain.sources.RangeDataSource(0, 5, 1),
                                     sampler=EveryOtherSampler(5), worker_count=0,
                                     shard_options=grain.sharding.NoSharding()))
except Exception as e:  # pylint: disable=broad-except
  own_loaded = type(e).__name__
"""


def test_samplers_page_prints_the_same():
  g, l = porting.run_both(SAMPLERS)
  # Grain 0.2.18 prints keys 0 4 1 2 3 | 1 2 3 0 4 (the page's comment, from an
  # older version, shows 0 4 2 3 1 | 1 0 3 4 2), and no generator address.
  assert g.printed[:3] == ["RecordMetadata(index=0, record_key=0, rng=Generator(Philox))",
                           "RecordMetadata(index=1, record_key=4, rng=Generator(Philox))",
                           "RecordMetadata(index=2, record_key=1, rng=Generator(Philox))"]
  assert l.printed == g.printed
  assert l.sampler_repr == g.sampler_repr
  assert l.own == g.own
  # The page's iterator-only protocol in a DataLoader: Grain 0.2.18 indexes the
  # sampler (sampler[i]), so it raises "'EveryOtherSampler' object is not subscriptable".
  assert l.own_loaded == g.own_loaded == "TypeError"


# ---- Transformations (docs/data_loader/transformations.md) -----------------

TRANSFORMATIONS = """
import numpy as np
import grain


""" + porting.TRANSFORMATIONS_PAGE_CLASSES + """


flat_map_example = FlatMapTransformExample()
flat_map_example.max_fan_out = 2
batch_size, drop_remainder = 3, True


def attempt(make):
  try:
    return make()
  except Exception as e:  # pylint: disable=broad-except
    return type(e).__name__


ds = grain.MapDataset.range(10)
on_datasets = {
    "map": list(ds.map(PlusOne())),
    "map_with_index": list(ds.map(PlusOne()).map_with_index(PlusOneWithIndexKey())),
    "random_map": list(ds.random_map(PlusRandom(), seed=7)),
    "random_map_iter": list(ds.to_iter_dataset().random_map(PlusRandom(), seed=7)),
    "filter": list(ds.filter(RemoveEvenElements())),
    "filter_iter": list(ds.to_iter_dataset().filter(RemoveEvenElements())),
    "flat_map": list(grain.experimental.FlatMapMapDataset(ds, flat_map_example)),
    "batch": list(ds.batch(batch_size=batch_size, drop_remainder=drop_remainder)),
    "map_iter": list(ds.to_iter_dataset().map(PlusOne()).batch(batch_size=batch_size)),
    "map_with_index_iter": list(ds.to_iter_dataset().map_with_index(PlusOneWithIndexKey())),
}


def load(operations, shard_index=0, shard_count=1):
  # "The batch size ... is the *per host* batch size if it is after [sharding]."
  shard_options = grain.sharding.ShardOptions(shard_index=shard_index, shard_count=shard_count, drop_remainder=True)
  return list(grain.DataLoader(
      data_source=grain.sources.RangeDataSource(0, 10, 1),
      sampler=grain.samplers.IndexSampler(num_records=10, shard_options=shard_options, shuffle=True, seed=3,
                                          num_epochs=1),
      operations=operations, worker_count=0))


# The page's FlatMapTransform yields: Grain's iterator-level flat map takes
# len() of what flat_map returns (its MapDataset one makes a list first).
flat_map_iter = attempt(lambda: list(grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), flat_map_example)))

batch = grain.transforms.Batch(batch_size=batch_size, drop_remainder=drop_remainder)
# Grain 0.2.18's DataLoader calls a MapWithIndex operation as a function.
map_with_index_loaded = attempt(lambda: load([PlusOneWithIndexKey(), batch]))
keys_loaded = load([batch])
on_data_loader = {
    "all": load([PlusOne(), PlusRandom(), batch]),
    "filter": load([RemoveEvenElements(), batch]),
    "flat_map": load([flat_map_example, batch]),
    "shard_0": load([PlusOne(), batch], 0, 2),
    "shard_1": load([PlusOne(), batch], 1, 2),
}
"""


def test_transformations_page_on_datasets_and_data_loader():
  g, l = porting.run_both(TRANSFORMATIONS)
  assert plain(g.on_datasets["map_with_index"]) == [[i + 2, i] for i in range(10)]
  assert plain(g.on_datasets["flat_map"]) == [i for i in range(10) for _ in range(2)]
  for name in g.on_datasets:
    assert plain(l.on_datasets[name]) == plain(g.on_datasets[name]), name
  assert [len(b) for b in plain(g.on_data_loader["shard_0"])] == [3]  # 5 records per host: one batch of 3.
  for name in g.on_data_loader:
    assert plain(l.on_data_loader[name]) == plain(g.on_data_loader[name]), name


def test_transformations_page_flat_map_iter_dataset_with_a_generator():
  # README "Accepted where Grain 0.2.18 raises a TypeError": the page's
  # yielding flat_map works on loader's FlatMapIterDataset too.
  g, l = porting.run_both(TRANSFORMATIONS)
  assert g.flat_map_iter == "TypeError"  # object of type 'generator' has no len()
  assert plain(l.flat_map_iter) == plain(g.on_datasets["flat_map"])


def test_transformations_page_map_with_index_in_data_loader():
  # README "Accepted where Grain 0.2.18 raises a TypeError": a MapWithIndex
  # DataLoader operation gets the sampler's index on loader.
  g, l = porting.run_both(TRANSFORMATIONS)
  assert g.map_with_index_loaded == "TypeError"  # 'PlusOneWithIndexKey' object is not callable
  # Each record (key x, at sampler index i) becomes (x + 1, i); batches as Grain's sampler order gives.
  keys = [k for b in plain(g.keys_loaded) for k in b]
  want = [[[k + 1 for k in keys[j:j + 3]], list(range(j, j + 3))] for j in range(0, 9, 3)]
  assert plain(l.map_with_index_loaded) == want


# ---- Behind the scenes (docs/behind_the_scenes.md) --------------------------

# The "Determinism" section's example: 8 shuffled records, 2 worker processes,
# a map and a batch of 2 (the page's other code blocks are illustrations of
# queue contents, not code). The map makes the page's file-names-and-images
# elements, which the workers send through shared memory.
BEHIND_THE_SCENES = """
import json
import numpy as np
import grain


class FileAndImage(grain.transforms.Map):

  def map(self, record_key):
    return {"file_names": f"file_{record_key}", "images": np.full((2, 2), record_key, np.uint8)}


sampler = grain.samplers.IndexSampler(num_records=8, shard_options=grain.sharding.NoSharding(), shuffle=True,
                                      seed=0, num_epochs=1)


def load(worker_count):
  data_loader = grain.DataLoader(data_source=grain.sources.RangeDataSource(0, 8, 1), sampler=sampler,
                                 operations=[FileAndImage(), grain.transforms.Batch(batch_size=2)],
                                 worker_count=worker_count)
  return [{"file_names": b["file_names"].tolist(), "images": b["images"][:, 0, 0].tolist(),
           "types": [type(b["file_names"]).__name__, type(b["images"]).__name__, b["file_names"].dtype.str]}
          for b in data_loader]


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  record_keys = [m.record_key for m in sampler]
  print(json.dumps({"record_keys": record_keys, "0": load(0), "2": load(2)}))
"""


def test_behind_the_scenes_determinism_example(tmp_path):
  g = porting.run_script(BEHIND_THE_SCENES, "grain", tmp_path)
  l = porting.run_script(BEHIND_THE_SCENES, "loader", tmp_path)
  assert l["record_keys"] == g["record_keys"]
  keys = g["record_keys"]
  assert [b["images"] for b in g["0"]] == [keys[i:i + 2] for i in range(0, 8, 2)]
  assert l["0"] == g["0"]
  # With 2 workers Grain's P0 batches keys 0, 2, 4, 6 of the sampler and P1 keys
  # 1, 3, 5, 7, read in turn: [[k0, k2], [k1, k3], [k4, k6], [k5, k7]], as the page says.
  assert [b["images"] for b in g["2"]] == [[keys[i], keys[i + 2]] for i in (0, 1, 4, 5)]
  # Grain's workers send the leaves as SharedMemoryArray (an np.ndarray subclass).
  assert all(b["types"] == ["SharedMemoryArray", "SharedMemoryArray", "<U6"] for b in g["2"])
  # README "Worker-count-invariant batching": loader's batches are the sampler's
  # order whatever worker_count, the same as Grain's with 0 workers; README
  # (`SharedMemoryArray`): arrays arrive in the consumer as np.ndarray.
  assert l["2"] == g["0"]


# ---- Data source protocol (docs/data_sources/protocol.rst) ------------------

PROTOCOL_SOURCE = """
import collections.abc
import json
import os
import threading
import grain


# "Sources with RA": the protocol, implemented without inheriting anything.
# File readers are not picklable: __getstate__ / __setstate__ drop and reopen
# the file; __repr__ is used by the DataLoader's checkpoint validation.
class FixedWidthRecords:

  def __init__(self, path, width):
    self._path = path
    self._width = width
    self._open()

  def _open(self):
    self._file = open(self._path, "rb")
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return os.path.getsize(self._path) // self._width

  def __getitem__(self, index: int) -> bytes:
    with self._lock:  # Thread-safe and deterministic.
      self._file.seek(index * self._width)
      return self._file.read(self._width)

  def __getstate__(self):
    state = self.__dict__.copy()
    del state["_file"], state["_lock"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._open()

  def __repr__(self):
    return f"FixedWidthRecords(path={os.path.basename(self._path)!r}, width={self._width})"


def make_data_loader(source, worker_count=0):
  return grain.DataLoader(
      data_source=source,
      sampler=grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, seed=1, num_epochs=1),
      operations=[grain.transforms.Batch(batch_size=4)],
      worker_count=worker_count)
"""

PROTOCOL = PROTOCOL_SOURCE + """

class Squares(grain.sources.RandomAccessDataSource):

  def __len__(self):
    return 6

  def __getitem__(self, index):
    return index * index


with open(path, "wb") as f:
  f.write(b"".join(b"rec%02d" % i for i in range(12)))

source = FixedWidthRecords(path, 5)
dataset = grain.MapDataset.source(source).shuffle(seed=5).map(lambda b: b.decode())
from_dataset = [dataset[3], list(dataset), len(dataset)]
sequences = [list(grain.MapDataset.source(s).batch(2)) for s in ([1, 2, 3], (4, 5, 6), "abc", range(3))]
range_source = grain.sources.RangeDataSource(2, 12, 3)
from_range = [len(range_source), list(grain.MapDataset.source(range_source)), repr(range_source)]
from_squares = [list(grain.MapDataset.source(Squares()).filter(lambda x: x % 2)),
                isinstance(Squares(), collections.abc.Sequence)]

it = iter(make_data_loader(source))
head = next(it)
state = it.get_state()
rest = list(it)
state_fields = {k: v for k, v in json.loads(state).items() if k in ("sampler", "data_source")}
it = iter(make_data_loader(source))
it.set_state(state)
resumed = list(it)
import shutil
shutil.copy(path, path + ".copy")
try:  # The same records under another repr.
  iter(make_data_loader(FixedWidthRecords(path + ".copy", 5))).set_state(state)
  other_source = "restored"
except ValueError:
  other_source = "ValueError"


# "Sources with SA": an IterDataset and its DatasetIterator with get_state / set_state.
class LinesIterator(grain.DatasetIterator):

  def __init__(self, path):
    super().__init__()
    self._path = path
    self._file = open(path)
    self._lines_read = 0

  def __next__(self):
    line = self._file.readline()
    if not line:
      raise StopIteration
    self._lines_read += 1
    return line.rstrip("\\n")

  def get_state(self):
    return {"lines_read": self._lines_read}

  def set_state(self, state):
    self._file.seek(0)
    self._lines_read = 0
    for _ in range(state["lines_read"]):
      next(self)


class Lines(grain.IterDataset):

  def __init__(self, path):
    super().__init__()
    self._path = path

  def __iter__(self):
    return LinesIterator(self._path)


with open(lines_path, "w") as f:
  f.write("".join(f"line {i}\\n" for i in range(7)))

lines = Lines(lines_path).map(str.upper).batch(2)
lines_it = iter(lines)
lines_head = next(lines_it)
lines_state = lines_it.get_state()
lines_rest = list(lines_it)
lines_it = iter(lines)
lines_it.set_state(lines_state)
lines_resumed = list(lines_it)
window_shuffled = list(grain.experimental.WindowShuffleIterDataset(Lines(lines_path), window_size=3, seed=1))
"""


def test_protocol_custom_sources(tmp_path):
  inputs = {"path": str(tmp_path / "records.bin"), "lines_path": str(tmp_path / "lines.txt")}
  g, l = porting.run_both(PROTOCOL, **inputs)
  assert sorted(g.from_dataset[1]) == [f"rec{i:02d}" for i in range(12)]
  for name in ("from_dataset", "sequences", "from_range", "from_squares", "head", "rest", "resumed", "state_fields",
               "other_source", "lines_head", "lines_rest", "lines_resumed", "window_shuffled"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  # README "Checkpoint states carry `loader_state_version` and `pipeline` keys
  # beside Grain's": the custom iterator's own state, plus those two.
  assert g.lines_state == {"lines_read": 2}
  assert l.lines_state == {"lines_read": 2, "loader_state_version": state_lib.VERSION,
                           "pipeline": state_lib.fingerprint(["Lines()", "map", "batch(2, drop_remainder=False)"])}
  assert plain(g.rest) == plain(g.resumed) and g.other_source == "ValueError"
  assert plain(g.lines_rest) == plain(g.lines_resumed) == [["LINE 2", "LINE 3"], ["LINE 4", "LINE 5"], ["LINE 6"]]


# The pickled source in worker processes ("Data sources should be pickleable").
PROTOCOL_WORKERS = PROTOCOL_SOURCE + """
if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  with open(path, "wb") as f:
    f.write(b"".join(b"rec%02d" % i for i in range(12)))
  source = FixedWidthRecords(path, 5)
  print(json.dumps({n: [[r.decode() for r in b] for b in make_data_loader(source, worker_count=n)]
                    for n in (2, 0)}))
"""


def test_protocol_custom_source_in_worker_processes(tmp_path):
  script = "import sys\npath = sys.argv[1]\n" + PROTOCOL_WORKERS
  g = porting.run_script(script, "grain", tmp_path, str(tmp_path / "grain.bin"))
  l = porting.run_script(script, "loader", tmp_path, str(tmp_path / "loader.bin"))
  assert l["0"] == g["0"]
  order = sum(g["0"], [])
  assert sorted(order) == [f"rec{i:02d}" for i in range(12)]
  # README "Worker-count-invariant batching": Grain's 2 workers each batch their
  # own 6 records (sampler positions 0, 2, ..., 10 and 1, 3, ..., 11), read in
  # turn, 4 batches; loader's batches are the sampler's order, as Grain's with 0 workers.
  assert g["2"] == [order[0:8:2], order[1:8:2], order[8:12:2], order[9:12:2]]
  assert l["2"] == g["0"]


# ---- Parquet (docs/tutorials/data_sources/parquet_dataset_tutorial.md) -------

PARQUET = """
import pyarrow as pa
import pyarrow.parquet as pq

# Generate a sample PyArrow table containing email subjects and bodies.
table = pa.table({
    'email_subject': [
        "Meeting Reminder: Project X Update",
        "Important Announcement Regarding Company Policy",
        "FWD: Quick Question",
        "Your Order Confirmation #12345",
        "Invitation to Team Building Activity"
    ],
    'email_body': [
        "Hi team,\\n\\nJust a reminder about our Project X update meeting tomorrow at 10 AM PST. Please come prepared to discuss your progress and any roadblocks.\\n\\nSee you there,\\n[Your Name]",
        "Dear employees,\\n\\nPlease be advised of a new company policy regarding remote work, effective May 1st, 2025. You can find the full details on the company intranet.\\n\\nRegards,\\nManagement",
        "Hi [Name],\\n\\nForwarding you this email as you might have the answer to this quick question:\\n\\n[Original Email Content]",
        "Dear [Customer Name],\\n\\nThank you for your recent order! This email confirms your order #12345. You can view the details and track its shipment here: [Link]\\n\\nSincerely,\\nThe [Company Name] Team",
        "Hello everyone,\\n\\nYou're invited to participate in our upcoming team building activity on Friday, April 28th. It will be a fun afternoon of [Activity]. Please RSVP by Wednesday.\\n\\nBest,\\n[Organizer Name]"
    ]
})

# Write this table to a parquet file.
writer = pq.ParquetWriter('emails.parquet', table.schema)
writer.write_table(table)
writer.close()

import grain
import pprint

ds = grain.experimental.ParquetIterDataset('./emails.parquet')

first = list(ds)[0]

# Stand-in for `from tokenizers import Tokenizer` (not installed; the pretrained
# "bert-base-cased" is a download): words and punctuation as tokens.
import re


class Tokenizer:

  class Encoding:

    def __init__(self, tokens):
      self.tokens = tokens

  @classmethod
  def from_pretrained(cls, name):
    return cls()

  def encode(self, text):
    return self.Encoding(["[CLS]"] + re.findall(r"\\w+|[^\\w\\s]", text) + ["[SEP]"])


tokenizer = Tokenizer.from_pretrained("bert-base-cased")


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
# Print the first element in the dataset.
printed = pprint.pformat(next(ds_iter))
rest = list(ds_iter)
"""


def test_parquet_tutorial_prints_the_same(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  g, l = porting.run_both(PARQUET)
  assert g.first == l.first
  assert g.first["email_subject"] == "Meeting Reminder: Project X Update"
  assert l.printed == g.printed
  assert g.printed.startswith("[['[CLS]', 'Meeting', 'Reminder', ':',")
  assert plain(l.rest) == plain(g.rest) and len(g.rest) == 4


# ---- Debugging (docs/tutorials/dataset_debugging_tutorial.md) ---------------

INFO_LOGS = porting.CAPTURE_LOGS + """

capture = Capture(logging.INFO)
logging.getLogger("absl").addHandler(capture)
_absl_level = logging.getLogger("absl").level
logging.getLogger("absl").setLevel(logging.INFO)
"""

DEBUGGING = INFO_LOGS + """
# Added, as performance_debugging.ipynb does: Grain reads its config from absl
# flags, and in a process that has not parsed them it ignores config.update
# (visualization and debug mode stay off).
from absl import flags
flags.FLAGS.mark_as_parsed()

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
visualization_logs = list(capture.messages)

import time


# Define a dummy slow preprocessing function
def _dummy_slow_fn(x):
  time.sleep(0.001)  # 10 s on the page.
  return x

import time

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
debug_logs = capture.messages[len(visualization_logs):]
logging.getLogger("absl").removeHandler(capture)
logging.getLogger("absl").setLevel(_absl_level)
"""

RESET_CONFIG = """
import grain
grain.config.update("py_debug_mode", False)
grain.config.update("py_dataset_visualization_output_dir", None)
"""


def _run_both_then_reset_config(snippet, **inputs):
  try:
    return porting.run_both(snippet, **inputs)
  finally:  # The options are process-wide: later tests run with the defaults.
    for lib in porting.LIBS:
      porting.run(RESET_CONFIG, lib)


def _graphs(messages):
  return [m for m in messages if m.startswith("Grain Dataset graph:")]


def test_debugging_tutorial_pipelines():
  g, l = _run_both_then_reset_config(DEBUGGING)
  assert plain(l.visualized) == plain(g.visualized)
  assert plain(l.debugged) == plain(g.debugged) == plain(g.visualized)


def test_debugging_tutorial_logs():
  g, l = _run_both_then_reset_config(DEBUGGING)
  # Debug mode: Grain's first execution summary comes after 60 s, past this
  # test's pipelines; neither logs anything before.
  assert l.debug_logs == g.debug_logs == []
  # Visualization mode: Grain logs the pipeline's graph at its first element.
  # loader/config.py (README: `config` "no option changes loader's behaviour"):
  # loader draws no graph.
  assert len(_graphs(g.visualization_logs)) == 1
  assert "ShuffleMapDataset" in g.visualization_logs[0] and "'int64[2]'" in g.visualization_logs[0]
  assert l.visualization_logs == []


# ---- Performance debugging (docs/tutorials/performance_debugging.ipynb) ------

# "Set up input data": the notebook converts TFDS ag_news_subset (a download)
# into one ArrayRecord file of JSON records; here from a small stand-in.
PERF_DATA = """
import json
import os
from array_record.python.array_record_module import ArrayRecordWriter
import grain
import numpy as np

# Stand-in for tfds.data_source("ag_news_subset", split="train").
_rng = np.random.default_rng(0)
_words = "the a market team new chip stocks oil game season rises falls wins says report".split()
ag_news = [{"description": " ".join(_rng.choice(_words, _rng.integers(3, 12))).encode(),
            "label": np.int64(i % 4), "title": f"Title {i}".encode()} for i in range(120)]

# Copy to local dir and convert to JSON-serialized.
data_path = os.path.join(directory, "ag_news_subset")
os.makedirs(data_path)
writer = ArrayRecordWriter(
    os.path.join(data_path, "train.array-record"), "group_size:1"
)

source = grain.MapDataset.source(
    ag_news
)

written = []
for idx, e in enumerate(source.to_iter_dataset()):
  if idx % 10000 == 0:
    written.append(f"Written {idx} examples")
  new_e = {}
  for k, v in e.items():
    new_e[k] = v.decode("utf-8") if isinstance(v, bytes) else v
  writer.write(json.dumps(new_e, default=int).encode("utf-8"))

writer.close()
"""

PERF_PIPELINE = """
import grain
from pprint import pprint, pformat

data_path = os.path.join(directory, "ag_news_subset", "train.array-record")
source = grain.sources.ArrayRecordDataSource(data_path)
num_examples = f"{len(source)} examples"

import json


parsed_ds = grain.MapDataset.source(source).map(json.loads)

parsed_0 = pformat(parsed_ds[0])


# Stand-in for transformers.AutoTokenizer (not installed; "bert-base-uncased" is a download).
class AutoTokenizer:

  @classmethod
  def from_pretrained(cls, name):
    return cls()

  def __call__(self, text):
    return {"input_ids": [101] + [1000 + sum(map(ord, w)) for w in text.lower().split()] + [102]}


import numpy as np

tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

def tokenize(element):
  tokenized = tokenizer(element["description"])
  return {"description": np.asarray(tokenized["input_ids"])}

tokenized_ds = parsed_ds.map(tokenize)

tokenized_0 = tokenized_ds[0]

# Global shuffle.
shuffled_ds = tokenized_ds.shuffle(seed=42)

# Repeat dataset 10 times, each epoch is shuffled differently.
repeated_ds = shuffled_ds.repeat(num_epochs=100)

# Shard for distributed training.
shard_index = 1  # this will typically be jax.process_index()
shard_count = 16  # this will typically be jax.process_count()
sharded_ds = repeated_ds[shard_index::shard_count]

sharded_0 = sharded_ds[0]

sequence_length = 16  # 128 in the notebook.

def trim_values(element):
  return {"description": element["description"][:sequence_length]}

trimmed_ds = sharded_ds.map(trim_values).to_iter_dataset(grain.ReadOptions(num_threads=0))
packed_ds = grain.experimental.FirstFitPackIterDataset(
      trimmed_ds,
      length_struct={"description": sequence_length},
      num_packing_bins=30
     )

packed_0 = next(iter(packed_ds))

batch_size = 4  # 512 in the notebook.

batched_ds = packed_ds.batch(batch_size, drop_remainder=True)

batched_0 = next(iter(batched_ds))

import time

num_batches = 3  # 200 in the notebook.
timings = []


def time_iterator(it) -> None:
  start_time = time.perf_counter()
  next(it)
  time_to_first_batch = time.perf_counter() - start_time
  timings.append(f"Time to get the first batch: {time_to_first_batch:.02f} sec.")
  start_time = time.perf_counter()
  for _ in range(num_batches):
    next(it)
  total_time = time.perf_counter() - start_time
  timings.append(
      "Iterator throughput:"
      f" {(num_batches * batch_size / total_time):.02f} examples/sec; "
      f"{(num_batches / total_time):.02f} batches/sec."
  )
"""

PERF_NOTEBOOK = PERF_DATA + PERF_PIPELINE + INFO_LOGS + """
from absl import flags

# Enable visualization.
flags.FLAGS.mark_as_parsed()
grain.config.update("py_dataset_visualization_output_dir", "")

visualized = next(iter(batched_ds))

# Disable visualization -- we don't need it for following sections.
grain.config.update("py_dataset_visualization_output_dir", None)
visualization_logs = list(capture.messages)

it = iter(batched_ds)  # time_iterator(iter(batched_ds)); `after_*` added: the batches after it.
time_iterator(it)
after_timing = [next(it) for _ in range(2)]

grain.config.update("py_debug_mode", True)

it = iter(batched_ds)  # time_iterator(iter(batched_ds))
time_iterator(it)
after_debug = [next(it) for _ in range(2)]
debug_logs = capture.messages[len(visualization_logs):]

read_options = grain.ReadOptions(num_threads=24)

ds = grain.MapDataset.source(source).map(json.loads).map(tokenize)
ds = ds.shuffle(seed=42).repeat(num_epochs=100)[shard_index::shard_count]
ds = ds.map(trim_values).to_iter_dataset(read_options)
ds = grain.experimental.FirstFitPackIterDataset(
      ds,
      length_struct={"description": sequence_length},
      num_packing_bins=30
     )
ds = ds.batch(batch_size, drop_remainder=True)

it = iter(ds)  # time_iterator(iter(ds))
time_iterator(it)
after_threads = [next(it) for _ in range(2)]
logging.getLogger("absl").removeHandler(capture)
logging.getLogger("absl").setLevel(_absl_level)

import time

train_step_latency_s = 0.001  # 1 in the notebook.
num_steps = 6  # 100 in the notebook.
trained = []


def train_step(data_batch):
  trained.append(data_batch)  # Added: keeps what the step got (`del data_batch` on the page).
  time.sleep(train_step_latency_s)


def train(dataset):
  it = iter(dataset)
  start_time = time.perf_counter()
  for _ in range(num_steps):
    data_batch = next(it)
    train_step(data_batch)

  training_time = time.perf_counter() - start_time
  idle_ratio = (
      training_time - num_steps * train_step_latency_s
  ) / training_time
  timings.append(f"Spent {(idle_ratio * 100):.2f}% of time waiting for data")

train(batched_ds)

prefetched_ds = grain.experimental.ThreadPrefetchIterDataset(
    batched_ds, prefetch_buffer_size=3
)

train(prefetched_ds)

model_restore_latency_s = 0.01  # 5 in the notebook.


def restore_model():
  time.sleep(model_restore_latency_s)


def train_from_checkpoint(dataset):
  it = iter(dataset)
  it.start_prefetch()
  start_time = time.perf_counter()
  restore_model()
  for _ in range(num_steps):
    data_batch = next(it)
    train_step(data_batch)

  training_time = time.perf_counter() - start_time
  idle_ratio = (
      training_time - num_steps * train_step_latency_s - model_restore_latency_s
  ) / training_time
  timings.append(f"Spent {(idle_ratio * 100):.2f}% of time waiting for data")

train_from_checkpoint(prefetched_ds)
"""

_PERF_RESULTS = ("written", "num_examples", "parsed_0", "tokenized_0", "sharded_0", "packed_0", "batched_0",
                 "visualized", "after_timing", "after_debug", "after_threads", "trained")


def _run_notebook(tmp_path):
  try:
    return [porting.run(PERF_NOTEBOOK, lib, directory=str(tmp_path / lib)) for lib in porting.LIBS]
  finally:  # The options are process-wide: later tests run with the defaults.
    for lib in porting.LIBS:
      porting.run(RESET_CONFIG, lib)


def test_performance_debugging_notebook(tmp_path):
  g, l = _run_notebook(tmp_path)
  assert g.num_examples == "120 examples" and g.written == ["Written 0 examples"]
  for name in _PERF_RESULTS:
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  assert porting.structure(l.batched_0) == porting.structure(g.batched_0) == {
      "description": ((4, 16), "int64"), "description_positions": ((4, 16), "int32"),
      "description_segment_ids": ((4, 16), "int32")}
  assert plain(g.trained[:6]) == plain(g.trained[6:12]) == plain(g.trained[12:])
  # The timings themselves differ from run to run: the same lines were printed.
  kinds = lambda ns: [t.split(" ")[0] for t in ns.timings]
  assert kinds(l) == kinds(g) == ["Time", "Iterator"] * 3 + ["Spent"] * 3


def test_performance_debugging_notebook_logs(tmp_path):
  g, l = _run_notebook(tmp_path)
  # Debug mode: Grain's execution summary comes after 60 s; nothing before.
  assert l.debug_logs == g.debug_logs == []
  # Visualization mode: Grain logs the graph, each stage with its output spec,
  # as the notebook shows (again as each later stage gives its first element).
  # loader/config.py (README: `config` "no option changes loader's behaviour"): no graph.
  graphs = _graphs(g.visualization_logs)
  assert graphs and len(graphs) == len(g.visualization_logs)
  assert "BatchDatasetIterator(batch_size=4, drop_remainder=True)" in graphs[-1] and "'int64[4, 16]'" in graphs[-1]
  assert l.visualization_logs == []


# "Bottleneck with GIL": the same pipeline under mp_prefetch (16 workers in
# the notebook, 2 here), as a script.
PERF_MP_PREFETCH = "import os\nimport sys\ndirectory = sys.argv[1]\n" + PERF_PIPELINE + """
import itertools


def interleaved_worker_streams(num_workers, num):
  # What Grain's workers compute: worker w packs and batches its slice w::N
  # of the MapDataset part; Grain reads the workers in turn.
  streams = []
  for w in range(num_workers):
    part = sharded_ds.map(trim_values)[w::num_workers].to_iter_dataset(grain.ReadOptions(num_threads=2))
    part = grain.experimental.FirstFitPackIterDataset(part, length_struct={"description": sequence_length},
                                                       num_packing_bins=30).batch(batch_size, drop_remainder=True)
    streams.append(iter(part))
  return [next(s) for s in itertools.islice(itertools.cycle(streams), num)]


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  ds = grain.MapDataset.source(source).map(json.loads).map(tokenize)
  ds = ds.shuffle(seed=42).repeat(num_epochs=100)[shard_index::shard_count]
  ds = ds.map(trim_values).to_iter_dataset(grain.ReadOptions(num_threads=2))
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={"description": sequence_length}, num_packing_bins=30
  )
  ds = ds.batch(batch_size, drop_remainder=True)
  in_process = list(itertools.islice(iter(ds), 6))
  ds = ds.mp_prefetch(
      grain.multiprocessing.MultiprocessingOptions(num_workers=2)  # 16 in the notebook.
  )

  it = iter(ds)  # time_iterator(iter(ds)); `after` added: the batches after it.
  time_iterator(it)
  after = [next(it) for _ in range(2)]
  read = [{k: v.tolist() for k, v in b.items()} for b in [*interleaved_worker_streams(2, 6), *in_process, *after]]
  print(json.dumps({"timings": timings, "per_worker": read[:6], "in_process": read[6:12], "after": read[12:]}))
"""


def test_performance_debugging_notebook_mp_prefetch(tmp_path):
  porting.run(PERF_DATA, "grain", directory=str(tmp_path))  # The workers would run a script's data cell again.
  g = porting.run_script(PERF_MP_PREFETCH, "grain", tmp_path, str(tmp_path))
  l = porting.run_script(PERF_MP_PREFETCH, "loader", tmp_path, str(tmp_path))
  assert l["in_process"] == g["in_process"] and l["per_worker"] == g["per_worker"]
  # README "Worker-count-invariant batching": Grain's workers pack and batch
  # their own slices, read in turn (the batches after time_iterator's 4 are
  # the per-worker streams' 5th and 6th); loader's stream is the in-process one.
  assert g["after"] == g["per_worker"][4:6] != g["in_process"][4:6]
  assert l["after"] == l["in_process"][4:6]
  assert len(l["timings"]) == len(g["timings"]) == 2
