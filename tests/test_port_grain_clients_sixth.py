"""A sixth set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found by the 2026-11-27 audit (round 7) in public code: a MovieLens ranker
(an `IndexSampler` subclass whose `__getitem__` gives a list of indices per
element, read by a source that takes lists), a streaming client whose custom
iterator hands out its live state under `ThreadPrefetchIterDataset`, and
Flax/kauldron-style pipeline tests on `tfds.testing.mock_data`; and (round
8) apple/axlearn's sliced infinite mixtures and google-research spherical_cnn's
sampler subclass.

Scripts run as `__main__` on each library in a fresh process; their output
must be the same.
"""

from __future__ import annotations

import pytest

from tests import porting

# A sampler subclass's own __getitem__ decides the record keys (and may give
# a list of indices per element: the source is then asked with that list).
SAMPLER_SUBCLASS = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import numpy as np
import grain

class Shifted(grain.samplers.IndexSampler):
  def __getitem__(self, index):
    m = super().__getitem__(index)
    return grain.RecordMetadata(index=m.index, record_key=m.record_key + 100, rng=m.rng)

class Reversed(grain.samplers.SequentialSampler):
  def __getitem__(self, index):
    m = super().__getitem__(index)
    return grain.RecordMetadata(index=m.index, record_key=self._num_records - 1 - m.record_key)

class Blocks(grain.samplers.IndexSampler):
  # One element per block of 4 records, shuffled inside with the sampler's rng.
  def __init__(self, num_records, seed):
    self.total = num_records
    super().__init__(num_records=num_records // 4, shard_options=grain.sharding.NoSharding(),
                     shuffle=True, seed=seed, num_epochs=1)
  def __repr__(self):
    return f"Blocks({self.total}, {self._seed})"
  def __getitem__(self, index):
    m = super().__getitem__(index)
    keys = np.arange(m.record_key * 4, m.record_key * 4 + 4)
    m.rng.shuffle(keys)
    return grain.RecordMetadata(index=m.index, record_key=keys.tolist(), rng=m.rng)

class Source:
  def __len__(self):
    return 400
  def __getitem__(self, key):
    return [k * 10 for k in key] if isinstance(key, list) else key * 10
  def __repr__(self):
    return "Source(400)"

class Negatives(grain.transforms.RandomMap):
  def random_map(self, element, rng):
    return {"block": element, "negative": int(rng.integers(0, 50))}

if __name__ == "__main__":  # Spawned workers run the top level again.
  no_shard = grain.sharding.NoSharding()
  print("shifted", list(grain.DataLoader(
      data_source=Source(), sampler=Shifted(num_records=5, shard_options=no_shard, num_epochs=1))))
  print("shifted, 2 workers", list(grain.DataLoader(
      data_source=Source(), sampler=Shifted(num_records=5, shard_options=no_shard, num_epochs=1), worker_count=2)))
  print("reversed", list(grain.DataLoader(data_source=Source(), sampler=Reversed(6, no_shard))))

  loader = grain.DataLoader(data_source=Source(), sampler=Blocks(40, seed=3), operations=[Negatives()])
  it = iter(loader)
  print("blocks", [next(it) for _ in range(3)])
  state = it.get_state()
  rest = list(it)
  print("blocks rest", rest)
  again = iter(grain.DataLoader(data_source=Source(), sampler=Blocks(40, seed=3), operations=[Negatives()]))
  again.set_state(state)
  print("resumed equal", list(again) == rest)
"""

# google-research spherical_cnn's WeatherSampler: an IndexSampler subclass that
# wraps Grain's `_record_keys` MapDataset and widens `_max_index`.
SAMPLER_PRIVATE_FIELDS = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import numpy as np
import grain.python as grain

class Offsets(grain.MapDataset):
  def __init__(self, parent, offsets):
    super().__init__(parent)
    self._offsets = offsets
  def __len__(self):
    return len(self._parent)
  def __getitem__(self, index):
    return self._parent[index // len(self._offsets)] + self._offsets[index % len(self._offsets)]

class TwoPasses(grain.IndexSampler):
  def __init__(self, n, shard_options, seed):
    super().__init__(n, shard_options, shuffle=True, num_epochs=1, seed=seed)
    self._max_index *= 2
    self._record_keys = Offsets(self._record_keys, (0, 100))

class FromArray(grain.IndexSampler):  # Any sequence of keys will do for Grain.
  def __init__(self, n):
    super().__init__(n, grain.NoSharding(), num_epochs=1)
    self._record_keys = np.arange(n)[::-1]

print(list(grain.DataLoader(data_source=list(range(200)), sampler=FromArray(8))))

for shard in (grain.NoSharding(), grain.ShardOptions(shard_index=1, shard_count=2, drop_remainder=True)):
  s = TwoPasses(10, shard, seed=4)
  print(len(s), [s[i].record_key for i in range(len(s))])
  print(list(grain.DataLoader(data_source=list(range(200)), sampler=s, operations=[grain.Batch(4)])))
"""

# A custom iterator whose get_state() returns its live containers: the state
# handed out with each element is a copy taken then, whatever the prefetch
# thread does afterwards; iter() of the dataset is Grain's iterator class.
PREFETCH_STATE_COPY = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import time
import grain

class Seen(grain.DatasetIterator):
  def __init__(self):
    super().__init__()
    self.seen = []
  def __next__(self):
    if len(self.seen) == 20:
      raise StopIteration
    self.seen.append(len(self.seen))
    return self.seen[-1]
  def get_state(self):
    return {"seen": self.seen}
  def set_state(self, state):
    self.seen = list(state["seen"])

class Stream(grain.IterDataset):
  def __iter__(self):
    return Seen()

for size in (0, 4):
  ds = grain.experimental.ThreadPrefetchIterDataset(Stream(), prefetch_buffer_size=size)
  it = iter(ds)
  print(size, "type", type(it).__name__, isinstance(it, grain.experimental.ThreadPrefetchDatasetIterator))
  print(size, "first", [next(it) for _ in range(3)])
  time.sleep(0.2)  # The prefetch thread runs ahead meanwhile.
  state = it.get_state()
  print(size, "state", state["seen"])
  again = iter(grain.experimental.ThreadPrefetchIterDataset(Stream(), prefetch_buffer_size=size))
  again.set_state(state)
  print(size, "resumed", list(again) == list(it))
  print(size, "state kept", state["seen"])  # A copy: unchanged by the iteration since.
"""

# tfds.testing.mock_data: the mocked source's __getitems__ cannot be called
# with keys; Grain reads by index, and so must every batched read of ours.
TFDS_MOCK = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import logging
logging.disable(logging.WARNING)
import tensorflow_datasets as tfds
import grain

with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
  src = tfds.data_source("mnist", split="train")
  print("MapDataset.batch", grain.MapDataset.source(src).batch(4)[1]["label"].tolist())
  ds = (grain.MapDataset.source(src).shuffle(seed=0)
        .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)).batch(3))
  print("shuffled batches", [b["label"].tolist() for b in ds])
  print("images", [int(x["image"].sum()) for x in grain.MapDataset.source(src).slice(slice(2, 8)).to_iter_dataset()])
  print("DataLoader", [int(x["label"]) for x in grain.DataLoader(
      data_source=src, sampler=grain.samplers.IndexSampler(len(src), grain.sharding.NoSharding(), num_epochs=1))])
"""


# apple/axlearn's input_grain_test (round 8): an infinite mixture, sliced,
# shuffled and repeated reads past the slice's end, where Grain's parent
# index (epoch x sys.maxsize + position) exceeds int64.
INFINITE_SLICES = """
import grain

class Split(grain.experimental.FlatMapTransform):
  max_fan_out = 2

  def flat_map(self, x):
    return [x, x + 100]

base = grain.MapDataset.range(5).repeat()
mix = grain.MapDataset.mix([grain.MapDataset.range(0, 10, 2).repeat(), grain.MapDataset.range(1, 5, 2).repeat()],
                           weights=[2, 1])
cases = {
    "axlearn": lambda: mix.slice(slice(0, 10)).shuffle(seed=123),
    "slice": lambda: base[:4],
    "map": lambda: base[:4].map(lambda x: x * 10),
    "filter": lambda: base[:4].filter(lambda x: x % 2 == 0),
    "random_map": lambda: base.seed(7)[:4].random_map(lambda x, rng: (x, int(rng.integers(0, 1000)))),
    "map_with_index": lambda: base[:4].map_with_index(lambda i, x: (i, x)),
    "batch of slice": lambda: base[:4].batch(3),
    "slice of shuffle": lambda: base.shuffle(seed=3)[:6],
    "slice of slice": lambda: base[:10][2:6],
    "negative step": lambda: base[:6][::-2],
    "concatenate": lambda: grain.MapDataset.concatenate([base[:3], grain.MapDataset.range(2)]),
    "zip": lambda: grain.experimental.ZipMapDataset([base[:4], base[1:5]]),
    "mix of slices": lambda: grain.MapDataset.mix([base[:3], base[1:3]], weights=[1, 1]),
    "window shuffle": lambda: grain.experimental.WindowShuffleMapDataset(base[:4], window_size=2, seed=1),
    "slice of batch": lambda: base.batch(3)[:2],
    # Infinite parents read past a slice's end (fuzzer, round 2).
    "slice of repeated concatenation": lambda: grain.MapDataset.concatenate(
        [grain.MapDataset.range(3), grain.MapDataset.range(10, 12)]).repeat()[2:9],
    "concatenation of slices, repeated": lambda: grain.MapDataset.concatenate(
        [base[1:3], grain.MapDataset.range(10, 12)]).repeat()[1:6],
    "flat map of infinite": lambda: grain.experimental.FlatMapMapDataset(base, Split())[3:9],
    "flat map of slice": lambda: grain.experimental.FlatMapMapDataset(base[2:5], Split())[1:4],
    "slice of repeated slice": lambda: base[1:4].repeat()[2:5],
}
plain = lambda v: v.tolist() if hasattr(v, "tolist") else v
for name, make in cases.items():
  ds = make()
  print(name, len(ds), [plain(ds[i]) for i in range(3 * len(ds) + 2)], [plain(v) for v in ds.repeat(2)],
        [plain(v) for v in ds.repeat(2).to_iter_dataset()])
big = base.batch(3)
print("batch of infinite", [plain(big[i]) for i in (0, 1, len(big) - 1, len(big), len(big) + 1)])
"""


# Grain's docstrings (audit round 8): a custom iterator timed with the stats
# module's decorator and Timer (a public WebDataset iterator does this);
# start_prefetch after close raises.
DOCSTRING_EXAMPLES = """
import grain
from grain._src.python.dataset import stats

class NegIter(grain.DatasetIterator):
  @stats.record_next_duration_if_output
  def __next__(self):
    timer = stats.Timer()
    with timer:
      x = next(self._parent)
    assert timer.value() >= 0
    timer.reset()
    with self._stats.record_self_time(offset_ns=timer.value()):
      return -x
  def get_state(self):
    return self._parent.get_state()
  def set_state(self, state):
    self._parent.set_state(state)

class Neg(grain.IterDataset):
  def __iter__(self):
    return NegIter(self._parent.__iter__())

print(list(Neg(grain.MapDataset.range(1, 5).to_iter_dataset())))
it = iter(grain.experimental.ThreadPrefetchIterDataset(grain.MapDataset.range(5).to_iter_dataset(), prefetch_buffer_size=2))
next(it)
it.close()
try:
  it.start_prefetch()
except ValueError:
  print("start_prefetch after close raises ValueError")
"""


# Round 9 (google/airio's map-level packer, and the idiom of a map returning
# None to drop an element): Grain's to_iter_dataset() drops None elements, so
# an iterator-level batch after it sees only the others.
NONE_ELEMENTS = """
import grain
import numpy as np


class Sparse(grain.MapDataset):  # airio-style custom sparse MapDataset
  def __init__(self, parent):
    super().__init__(parent)
  def __len__(self):
    return len(self._parent)
  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    x = self._parent[index]
    return None if x % 3 == 0 else x


def main():
  src = [1, None, 2, 3, None, 4, 5, 6]
  cases = [
    ("source(None)->iter->batch(2)", lambda: grain.MapDataset.source(src).to_iter_dataset().batch(2)),
    ("source(None)->iter->batch(3, drop_remainder)", lambda: grain.MapDataset.source(src).to_iter_dataset().batch(3, drop_remainder=True)),
    ("source(None)->iter->map->batch", lambda: grain.MapDataset.source(src).to_iter_dataset().map(lambda x: x * 10).batch(2)),
    ("source(None)->iter->batch(batch_fn=list)", lambda: grain.MapDataset.source(src).to_iter_dataset().batch(2, batch_fn=list)),
    ("source(None)->iter(num_threads=0)->batch", lambda: grain.MapDataset.source(src).to_iter_dataset(grain.ReadOptions(num_threads=0)).batch(2)),
    ("source(None)->iter->batch->mp_prefetch(1)", lambda: grain.MapDataset.source(src).to_iter_dataset().batch(2).mp_prefetch(grain.MultiprocessingOptions(num_workers=1))),
    ("range->map(None if odd)->iter->batch", lambda: grain.MapDataset.range(6).map(lambda x: None if x % 2 else x).to_iter_dataset().batch(2)),
    ("custom sparse->shuffle->iter->batch", lambda: Sparse(grain.MapDataset.range(10)).shuffle(seed=1).to_iter_dataset().batch(3, drop_remainder=False)),
    ("[control] source(None)->iter (no batch)", lambda: grain.MapDataset.source(src).to_iter_dataset()),
    ("[control] source(None)->iter->filter->batch", lambda: grain.MapDataset.source(src).to_iter_dataset().filter(lambda x: True).batch(2)),
    ("[control] range->filter->iter->batch", lambda: grain.MapDataset.range(8).filter(lambda x: x % 3).to_iter_dataset().batch(2)),
  ]
  for name, mk in cases:
    try:
      print(f"{name:48s}", [b if isinstance(b, (list, tuple)) else np.asarray(b).tolist() for b in mk()])
    except Exception as e:
      print(f"{name:48s}", "ERROR", type(e).__name__)


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  main()
"""


# maxdiffusion's and MaxText's HFDataSource (round 10): a source whose
# __getitem__ ignores the index and returns the next record of a stream, None
# once it runs dry (maxdiffusion gives it a length of 10 billion). A batch
# that meets the None, or a map that raises, must end the stream where
# Grain's one-by-one reads end it, neither dropping the full batches before it
# nor reading on past the error.
STREAMING_SOURCE = """
import grain.python as grain
import numpy as np


class StreamSource(grain.RandomAccessDataSource):

  def __init__(self, records, length):
    self._it = iter(range(records))
    self._length = length

  def __len__(self):
    return self._length

  def __getitem__(self, index):
    try:
      return {"x": np.int64(next(self._it))}
    except StopIteration:
      return None


class FailOn30(grain.MapTransform):

  def map(self, element):
    if int(element["x"]) == 30:
      raise KeyError("bad record 30")
    return element


def run(records, length, operations, worker_count=0):
  loader = grain.DataLoader(
      data_source=StreamSource(records, length), operations=operations, worker_count=worker_count,
      sampler=grain.IndexSampler(num_records=length, num_epochs=1, shard_options=grain.NoSharding(), shuffle=False,
                                 seed=0),
      read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=8))
  firsts = []
  try:
    for batch in loader:
      firsts.append(int(batch["x"][0]))
    end = "StopIteration"
  except Exception as e:
    end = type(e).__name__
  print(records, length, worker_count, end, firsts)


class IndexSource(grain.RandomAccessDataSource):

  def __len__(self):
    return 40

  def __getitem__(self, index):
    return {"x": np.int64(index)}


class TimesTenInPlace(grain.MapTransform):  # Sets a key of its input: applied twice, it would show.

  def map(self, element):
    element["x"] = element["x"] * 10
    return element


def run_mutating(source):
  loader = grain.DataLoader(
      data_source=source, operations=[TimesTenInPlace(), FailOn300()], worker_count=0,
      read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=8),  # A stream is read in order then.
      sampler=grain.IndexSampler(num_records=40, num_epochs=1, shard_options=grain.NoSharding(), shuffle=False,
                                 seed=0))
  out, it = [], iter(loader)
  while True:
    try:
      out.append(int(next(it)["x"]))
    except StopIteration:
      break
    except KeyError:
      out.append("KeyError")
  print(type(source).__name__, out)


class FailOn300(grain.MapTransform):

  def map(self, element):
    if int(element["x"]) == 300:
      raise KeyError("bad record 30")
    return element


def main():
  run(50, 1000, [grain.Batch(4, drop_remainder=True)])
  run(50, 10_000_000_000, [grain.Batch(4, drop_remainder=True)])
  run(50, 1000, [grain.Batch(4, drop_remainder=True)], worker_count=1)
  run(10_000, 50, [FailOn30(), grain.Batch(4, drop_remainder=True)])
  run_mutating(StreamSource(40, 40))
  run_mutating(IndexSource())


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  main()
"""


@pytest.mark.parametrize("name", ["NONE_ELEMENTS", "SAMPLER_SUBCLASS", "SAMPLER_PRIVATE_FIELDS", "PREFETCH_STATE_COPY", "TFDS_MOCK", "INFINITE_SLICES",
                                  "DOCSTRING_EXAMPLES", "STREAMING_SOURCE"])
def test_client_script_prints_the_same(name, tmp_path):
  porting.assert_prints_the_same(globals()[name], tmp_path)
