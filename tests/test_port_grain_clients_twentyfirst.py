"""Round 24's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

nking/ranker's src/main/python/movie_lens_ranker/ (BatchSampler.py,
RandomAccessArrayRecordDataSource.py, RatingsHistoryTransform.py,
data_loading.py, train.py) and src/test/python/movie_lens_ranker/
test_BatchSampler.py: `BatchSampler(grain.samplers.IndexSampler)` built over
the number of batches, whose `__getitem__` turns `super().__getitem__`'s
record key into a list of record keys shuffled with the metadata's `rng`
(`grain.RecordMetadata(..., record_key=indices.tolist(), rng=...)`); a
`grain.sources.RandomAccessDataSource` subclass calling `super().__init__(uri)`
over msgpack records of an ArrayRecord file, whose `__getitem__` takes that
list (lazy reader, `weakref.finalize`, `__getstate__`); a `MapTransform` over
the list of records; `DataLoader(worker_buffer_size=0, shard_options=
ShardByJaxProcess())`, the loader's private `_sampler` / `_data_source`
attributes read by the trainer, `worker_count` workers, and an Orbax
`CheckpointManager(item_handlers={..., "train_dataloader":
grain.checkpoint.CheckpointHandler(), "config": JsonCheckpointHandler()})`
saving `grain.checkpoint.CheckpointSave(iterator)` and restoring into
`CheckpointRestore(iter(train_dataloader))`.

A world-model video loader (`EpisodeLengthFilter`, `ProcessEpisodeAndSlice`,
`get_dataloader` for Minecraft VPT; the index names no repository for it):
pickled episodes in sharded ArrayRecord files, a `grain.transforms.Filter`
and a `grain.transforms.RandomMap` with their own `__init__` (no
`super().__init__`), a map returning `None` fields, `IndexSampler(shuffle=
True, num_epochs=None, shard_options=ShardByJaxProcess(drop_remainder=True))`,
`Batch(drop_remainder=True)`, `worker_count=1`, `worker_buffer_size=1`,
`ReadOptions(prefetch_buffer_size=1, num_threads=1)`.

avitai/datarax's src/datarax/sources/_grain_streaming.py, _grain_bridge.py,
samplers/index_shuffle.py, sharding/jax_process_sharder.py,
control/prefetcher.py, an indexed version of pipeline/nodes/rebatch.py, and
the tests pinning them to Grain (tests/sources/
test_mixed_source_grain_streaming.py, tests/sharding/
test_jax_process_sharder_grain_alignment.py): `ensure_iter_dataset`
(isinstance checks on `grain.IterDataset` / `grain.MapDataset`, a Sequence
through `MapDataset.source`), a random-access adapter with Grain's `_getitems`
protocol, `grain.IterDataset.mix(weights=...)` with a state saved and
restored, `grain.experimental.InterleaveIterDataset(num_make_iter_threads=,
make_iter_buffer_size=, iter_buffer_size=)`, `RepeatIterDataset` under
`LimitIterDataset`, `grain.experimental.index_shuffle(index=, max_index=,
seed=, rounds=4)`, `RebatchIterDataset` with short batches padded by
`grain.experimental.batch_and_pad`, `ShardByJaxProcess` built under patched
`jax.process_count`/`jax.process_index` against the private
`grain._src.core.sharding.even_split`, and `grain.experimental.device_put`.

An ARC-puzzle loader (`JsonDataSource`, `Parse`, `TranslateAndPad`,
`get_data_loader`; the index names no repository for it): a JSON-lines
`grain.sources.RandomAccessDataSource` with its own `__repr__`, a
`grain.transforms.Map` to arrays, a `grain.transforms.RandomMap` with its own
`__init__` padding grids at a random or per-puzzle offset,
`IndexSampler(seed=0, shuffle=True, num_epochs=None or 1,
shard_options=ShardByJaxProcess(drop_remainder=False) or NoSharding())`,
`grain.transforms.Batch` and a DataLoader state.

A next-token-prediction transform module (`ApplyFirstFitPacking`,
`NestInputs`, `make`; the index names no repository for it): a dataclass
calling `grain.experimental.FirstFitPackIterDataset(num_packing_bins=,
shuffle_bins=, meta_features=("attention_mask", "labels"))`, a dataclass
`grain.transforms.Map` nesting `input_ids_segment_ids` under `inputs`, and
the packer's error on a document longer than the row. Grain's message names
each feature by its JAX key path ("(feature_path, feature_length,
max_length) = [((DictKey(key='attention_mask'),), 7, 4), ...]"); loader's
had its own wording before the fix in `loader/transformations/
packing_utils.py`.

Orbax checkpoint helpers for Grain iterators (a legacy-V0 module and a
handler-registry module; the index names no repository for them):
`ocp.Checkpointer(cast(ocp.CheckpointHandler, grain.checkpoint.
CheckpointHandler()))` saving `grain.checkpoint.CheckpointSave(iterator)`
with `force=False` and restoring with `CheckpointRestore`, `isinstance(...,
grain.DatasetIterator)` checks, a `GrainIterator = grain.DataLoaderIterator`
alias, and `DefaultCheckpointHandlerRegistry.add("input_iter",
grain.checkpoint.CheckpointSave / CheckpointRestore, grain.checkpoint.
CheckpointHandler)` for a `CheckpointManager(handler_registry=...)` whose
`Composite` holds a `PyTreeSave` train state and a DataLoader iterator.

A resume-parity benchmark script (scripts/bench/e1_resume_parity.py; the
index names no repository for it): `MapDataset.source(<numpy-format
rows>).seed(s).shuffle().repeat().batch(n, drop_remainder=True)
.to_iter_dataset(ReadOptions(num_threads=16, prefetch_buffer_size=16))
.mp_prefetch(MultiprocessingOptions(num_workers=2))`, a SHA-1 of each batch's
keys, shapes, dtypes and bytes, the state written with `msgpack.packb` at
step 10 and a fresh iterator restored from `msgpack.unpackb`. The script
runs as `__main__`; Grain 0.2.18's workers need its absl flags parsed.

A chess position-evaluation trainer script (`ZeuxoModel`; the index names
no repository for it): the training Parquet files globbed and shuffled with
`random.Random(SEED)`, rows counted with `pyarrow.dataset`, the file list
repeated `epochs` times into `grain.experimental.ParquetIterDataset`, a
`WindowShuffleIterDataset(window_size=..., seed=SEED)`, `.batch(...,
drop_remainder=True)`, a lambda `map` with `scipy.special.expit`,
`.mp_prefetch(MultiprocessingOptions(num_workers=4))`, and `break` after the
last step; `absl.flags.FLAGS.mark_as_parsed()` under `__main__`. With workers
Grain slices the Parquet rows per worker (`set_slice`) and batches each
worker's slice (README: "`set_slice` is not called", "Worker-count-invariant
batching"), so loader's stream with workers is compared with Grain's
without.
"""

from __future__ import annotations

import json
import os
import pickle

import absl.flags
import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from array_record.python import array_record_module

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


# movie_lens_ranker's BatchSampler, data source, history transform and
# data_loading.py's `_create_dataloader`, trimmed (no graph transforms); the
# checkpoint items and calls are train.py's. `UserHistory` stands in for the
# client's ArrayRecord-backed history lookup.
RANKER = """
import json
import os
import weakref
from typing import Dict, Generic, List, Sequence, Tuple, TypeVar, Union

import grain
import grain.python as pgrain
import msgpack
import numpy as np
import orbax.checkpoint as ocp
from array_record.python import array_record_module

T = TypeVar("T")


class BatchSampler(grain.samplers.IndexSampler):
    def __init__(self, num_records: int, num_epochs: int, batch_size: int,
                 shuffle: bool = False, seed: int = 0,
                 shard_options: grain.sharding.ShardOptions = grain.sharding.NoSharding()):
        self.num_batches_per_epoch = max(1, num_records // batch_size)
        self.total_records = num_records
        self.batch_size = batch_size
        super().__init__(num_records=self.num_batches_per_epoch, shard_options=shard_options,
                         shuffle=shuffle, seed=seed, num_epochs=num_epochs)

    def __repr__(self) -> str:
        return (
            f"BatchSampler(num_records={self.total_records}, num_epochs={self._num_epochs},"
            f"batch_size={self.batch_size}, shuffle={self._shuffle}, seed={self._seed}"
            f"shard_options={self._shard_options!r})"
        )

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        base_meta = super().__getitem__(index)
        block = base_meta.record_key
        start = block * self.batch_size
        stop = min(start + self.batch_size, self.total_records)
        indices = np.arange(start, stop)
        if self._shuffle:
            base_meta.rng.shuffle(indices)
        return grain.RecordMetadata(index=base_meta.index, record_key=indices.tolist(), rng=base_meta.rng)


class RandomAccessArrayRecordDataSource(grain.sources.RandomAccessDataSource, Generic[T]):
    def __init__(self, uri: str):
        super().__init__(uri)
        self.uri = uri
        self._reader = None
        self._finalizer = None

    def _ensure_reader(self):
        if self._reader is None:
            self._reader = array_record_module.ArrayRecordReader(self.uri)
            self._finalizer = weakref.finalize(self, self._close_reader, self._reader)
        return self._reader

    @staticmethod
    def _close_reader(reader):
        if reader:
            try:
                reader.close()
            except Exception:
                pass

    def __getitem__(self, item_index: Union[int, list]) -> T:
        if isinstance(item_index, (list, range)):
            return self.__getitems__(item_index)
        b = self._ensure_reader().read([item_index])
        return msgpack.unpackb(b[0], use_list=False)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[T]:
        batch_bytes = self._ensure_reader().read(indices)
        return [msgpack.unpackb(b, use_list=False) for b in batch_bytes]

    def __len__(self) -> int:
        return self._ensure_reader().num_records()

    def __repr__(self):
        return f"RandomAccessArrayRecordDataSource {self.uri}"

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_finalizer"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _close(self):
        if self._reader is not None and self._finalizer:
            self._finalizer()
            self._reader = None
            self._finalizer = None

    def __del__(self):
        self._close()


class UserHistory:
    # The client's lookup of each user's earlier ratings (a dict here).
    def __init__(self, ratings, max_history):
        self.by_user = {}
        for u, m, r, ts in sorted(ratings, key=lambda x: x[3]):
            self.by_user.setdefault(u, []).append((m, r, ts))

    def get_history_before_timestamp(self, user_ids, timestamps, max_history):
        movies = np.full((len(user_ids), max_history), -1, dtype=np.int32)
        ratings = np.full((len(user_ids), max_history), -1, dtype=np.int32)
        for i, (u, t) in enumerate(zip(user_ids, timestamps)):
            before = [x for x in self.by_user.get(int(u), []) if x[2] < t][-max_history:]
            for j, (m, r, _) in enumerate(before):
                movies[i, j], ratings[i, j] = m, r
        return movies, ratings


class RatingsHistoryLookupTransform(pgrain.MapTransform):
    def __init__(self, history_lookup, max_history: int = 20):
        self.history_lookup = history_lookup
        self.max_history = max_history
        self.pad_value = -1

    def map(self, batch: List[Tuple[int, int, int, int]]) -> Dict[str, np.ndarray]:
        user_ids, movie_ids, ratings, timestamps = [], [], [], []
        for record in batch:
            user_ids.append(record[0])
            movie_ids.append(record[1])
            ratings.append(record[2])
            timestamps.append(record[3])
        user_ids = np.array(user_ids, dtype=np.int32)
        movie_ids = np.array(movie_ids, dtype=np.int32)
        ratings = np.array(ratings, dtype=np.int32)
        timestamps = np.array(timestamps, dtype=np.int64)
        history_movies, history_ratings = self.history_lookup.get_history_before_timestamp(
            user_ids, timestamps, self.max_history)
        history_lengths = np.sum(history_movies != -1, axis=1)
        return {
            "user_id": user_ids, "movie_id": movie_ids, "rating": ratings, "timestamp": timestamps,
            "history_movie_ids": history_movies, "history_ratings": history_ratings,
            "history_length": history_lengths,
        }


def create_dataloader(uri, history, max_history, num_epochs, batch_size, seed, shuffle=True, worker_count=0):
    shard_opts = grain.sharding.ShardByJaxProcess()
    read_opts = grain.ReadOptions(num_threads=4, prefetch_buffer_size=50)
    datasource = RandomAccessArrayRecordDataSource(uri)
    num_records = datasource.__len__()
    ra_sampler = BatchSampler(num_records=datasource.__len__(), num_epochs=num_epochs,
                              batch_size=batch_size, shuffle=shuffle, seed=seed, shard_options=shard_opts)
    return grain.DataLoader(
        data_source=datasource,
        sampler=ra_sampler,
        operations=[RatingsHistoryLookupTransform(history_lookup=history, max_history=max_history)],
        worker_count=worker_count,
        shard_options=shard_opts,
        read_options=read_opts,
    )


results = {}
# test_BatchSampler: three loaders, the third with another seed, no operations.
runs = []
for inst_num, seed in enumerate((1234, 1234, 456)):
    datasource = RandomAccessArrayRecordDataSource(URI)
    shard_opts = grain.sharding.ShardByJaxProcess()
    ra_sampler = BatchSampler(num_records=datasource.__len__(), batch_size=10, shuffle=True, seed=seed,
                              num_epochs=1, shard_options=shard_opts)
    dataloader0 = grain.DataLoader(data_source=datasource, sampler=ra_sampler, operations=[],
                                   worker_buffer_size=0, shard_options=shard_opts)
    runs.append([" ".join(map(str, batch)) for batch in dataloader0])
results["sampler_runs"] = runs
results["repr"] = repr(ra_sampler)
results["sampler_0"] = repr(ra_sampler[0])

history = UserHistory(RATINGS, max_history=4)
train = create_dataloader(URI, history, 4, num_epochs=3, batch_size=8, seed=0)
val = create_dataloader(URI, history, 4, num_epochs=1, batch_size=8, seed=0, shuffle=False)
results["attrs"] = [train._sampler.batch_size, train._sampler.total_records, train._sampler.num_batches_per_epoch,
                    train._sampler._shard_options.shard_count, train._sampler._num_epochs,
                    train._data_source.__len__(), isinstance(train._sampler, BatchSampler)]
results["val"] = [b for b in iter(val)]

it = iter(train)
first = [next(it) for _ in range(3)]
mngr = ocp.CheckpointManager(CKPT, item_handlers={
    "global_step": ocp.StandardCheckpointHandler(),
    "train_dataloader": grain.checkpoint.CheckpointHandler(),
    "config": ocp.handlers.JsonCheckpointHandler(),
}, options=ocp.CheckpointManagerOptions(max_to_keep=2))
config_dict = {"batch_size": 8, "max_history": 4}
mngr.save(0, args=ocp.args.Composite(
    global_step=ocp.args.StandardSave({"global_step": np.array(3, dtype=np.int32)}),
    train_dataloader=grain.checkpoint.CheckpointSave(it),
    config=ocp.args.JsonSave(config_dict)))
mngr.wait_until_finished()
rest = [next(it) for _ in range(4)]
results["first"] = first
results["rest"] = rest

restore_mngr = ocp.CheckpointManager(CKPT, item_handlers={
    "global_step": ocp.StandardCheckpointHandler(),
    "train_dataloader": grain.checkpoint.CheckpointHandler(),
    "config": ocp.handlers.JsonCheckpointHandler(),
})
epoch = restore_mngr.latest_step()
restored_config = restore_mngr.restore(epoch, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
train2 = create_dataloader(URI, history, restored_config["config"]["max_history"], num_epochs=3, batch_size=8, seed=0)
restored = restore_mngr.restore(epoch, args=ocp.args.Composite(
    global_step=ocp.args.StandardRestore({"global_step": np.array(0, dtype=np.int32)}),
    train_dataloader=grain.checkpoint.CheckpointRestore(iter(train2))))
train_iter = restored["train_dataloader"]
results["restored"] = [next(train_iter) for _ in range(4)]
results["global_step"] = int(restored["global_step"]["global_step"])
with open(os.path.join(CKPT, str(epoch), "train_dataloader", "process_0-of-1.json")) as f:
    results["saved_state"] = json.loads(f.read())
results["workers"] = list(create_dataloader(URI, history, 4, num_epochs=1, batch_size=4, seed=5, worker_count=2))
results["all"] = sum(1 for _ in create_dataloader(URI, history, 4, num_epochs=2, batch_size=8, seed=3))
"""


def write_ratings(tmp_path):
  rng = np.random.default_rng(0)
  ratings = [(int(rng.integers(5)), int(rng.integers(100)), int(rng.integers(1, 6)), 1000 + i) for i in range(45)]
  uri = str(tmp_path / "ratings.array_record")
  writer = array_record_module.ArrayRecordWriter(uri, "group_size:1")
  for r in ratings:
    writer.write(msgpack.packb(r))
  writer.close()
  return uri, ratings


def test_ranker_batch_sampler_list_keys_and_orbax_item_handlers_as_on_grain(tmp_path):
  uri, ratings = write_ratings(tmp_path)
  out = {}
  for lib in porting.LIBS:
    out[lib] = porting.run(RANKER, lib, URI=uri, RATINGS=ratings, CKPT=str(tmp_path / f"ckpt_{lib}")).results
  g, l = porting.grain_keys(out["grain"]), porting.grain_keys(out["loader"])
  # The record metadata's generator prints its address.
  strip = lambda s: s.split(", rng=")[0]
  assert strip(l.pop("sampler_0")) == strip(g.pop("sampler_0"))
  assert l == g
  runs = g["sampler_runs"]
  assert len(runs[0]) == 4 and runs[0] == runs[1] and runs[0] != runs[2]
  assert g["attrs"] == [8, 45, 5, 1, 3, 45, True]
  assert g["restored"] == g["rest"] and g["global_step"] == 3
  assert g["all"] == 10 and len(g["workers"]) == 11


# The video loader's module as written (pickled episodes in `DATA`), then
# two runs of it, without and with the worker, each saving and restoring a
# state.
EPISODES = """
from __future__ import annotations
import json
import jax
import numpy as np
import grain
import pickle


class EpisodeLengthFilter(grain.transforms.Filter):
    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def filter(self, element: bytes) -> bool:
        data = pickle.loads(element)
        episode_len = data["video_shape"][0]
        return episode_len >= self.seq_len


class ProcessEpisodeAndSlice(grain.transforms.RandomMap):
    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def random_map(self, element: bytes, rng: np.random.Generator) -> dict:
        data = pickle.loads(element)
        video_shape = data["video_shape"]
        video = np.frombuffer(data["video"], dtype=np.uint8).reshape(video_shape)
        episode_len = video_shape[0]
        max_start = episode_len - self.seq_len
        start = int(rng.integers(0, max_start + 1))
        return {"videos": video[start : start + self.seq_len], "actions": None, "rewards": None}


def get_dataloader(data_dir, index_max, seq_len, global_batch_size, num_workers=1,
                   prefetch_buffer_size=1, seed=42):
    shard_paths = [f"{data_dir}/shard-{i:05d}.array_record" for i in range(index_max)]
    num_processes = jax.process_count()
    if global_batch_size % num_processes != 0:
        raise ValueError("Global batch size must be divisible by the number of JAX processes.")
    per_process_batch_size = global_batch_size // num_processes
    source = grain.sources.ArrayRecordDataSource(shard_paths)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
        shuffle=True,
        num_epochs=None,
        seed=seed,
    )
    operations = [
        EpisodeLengthFilter(seq_len=seq_len),
        ProcessEpisodeAndSlice(seq_len=seq_len),
        grain.transforms.Batch(batch_size=per_process_batch_size, drop_remainder=True),
    ]
    read_options = grain.ReadOptions(prefetch_buffer_size=prefetch_buffer_size, num_threads=1)
    return grain.DataLoader(data_source=source, sampler=sampler, operations=operations,
                            worker_count=num_workers, worker_buffer_size=1, read_options=read_options)


def resume(state, workers):
    it = iter(get_dataloader(DATA, 3, seq_len=4, global_batch_size=3, num_workers=workers))
    it.set_state(state)
    return [next(it) for _ in range(3)]


results = {}
states = {}
for workers in (0, 1):
    loader = get_dataloader(DATA, 3, seq_len=4, global_batch_size=3, num_workers=workers)
    it = iter(loader)
    batches = [next(it) for _ in range(6)]
    state = it.get_state()
    after = [next(it) for _ in range(3)]
    it2 = iter(get_dataloader(DATA, 3, seq_len=4, global_batch_size=3, num_workers=workers))
    it2.set_state(state)
    results[workers] = {
        "shapes": [(b["videos"].shape, b["actions"], b["rewards"]) for b in batches],
        "batches": batches, "after": after, "restored": [next(it2) for _ in range(3)],
        "state": json.loads(state.decode()),
    }
    states[workers] = state
try:
    get_dataloader(DATA, 3, seq_len=4, global_batch_size=3)
    get_dataloader(DATA, 3, seq_len=4, global_batch_size=4, num_workers=0)
    results["odd_batch"] = "built"
except ValueError as e:
    results["odd_batch"] = str(e)
"""


def write_episodes(tmp_path):
  rng = np.random.default_rng(0)
  for s in range(3):
    writer = array_record_module.ArrayRecordWriter(str(tmp_path / f"shard-{s:05d}.array_record"), "group_size:1")
    for _ in range(7):
      n = int(rng.integers(2, 9))
      video = rng.integers(0, 255, size=(n, 2, 3, 1), dtype=np.uint8)
      writer.write(pickle.dumps({"video": video.tobytes(), "video_shape": video.shape}))
    writer.close()
  return str(tmp_path)


def test_video_episode_filter_random_slice_one_worker_as_on_grain(tmp_path):
  g, l = porting.run_both(EPISODES, DATA=write_episodes(tmp_path))
  g_plain, l_plain = porting.grain_keys(g.results), porting.grain_keys(l.results)
  # loader names an ArrayRecordDataSource in a DataLoader state by its own repr
  # (README, DataLoader row); the rest of the state is Grain's.
  for workers in (0, 1):
    assert g_plain[workers]["state"].pop("data_source").startswith("ArrayRecordDataSource(hash_of_paths=")
    assert l_plain[workers]["state"].pop("data_source").startswith("ArrayRecordDataSource(3 files, 21 records")
  assert l_plain == g_plain
  # loader resumes Grain's states, with and without the worker.
  for workers in (0, 1):
    assert porting.plain(l.resume(g.states[workers], workers)) == g_plain[workers]["after"]
  assert g_plain[0]["batches"] == g_plain[1]["batches"]
  assert g_plain[0]["shapes"][0] == [[3, 4, 2, 3, 1], None, None]
  assert g_plain[0]["restored"] == g_plain[0]["after"]
  assert g_plain[1]["restored"] == g_plain[1]["after"]


# datarax's Grain bridges, trimmed to their Grain calls; `ListSource` stands
# in for a Datarax random-access source module.
DATARAX = """
from collections.abc import Sequence
from operator import index as to_index
from typing import Any, SupportsIndex
from unittest.mock import patch

import grain
import jax
import numpy as np
from grain.experimental import index_shuffle as grain_index_shuffle


def ensure_iter_dataset(source: Any) -> grain.IterDataset:
    if isinstance(source, grain.IterDataset):
        return source
    if isinstance(source, grain.MapDataset):
        return source.to_iter_dataset()
    if isinstance(source, Sequence) and not isinstance(source, str | bytes | bytearray):
        return grain.MapDataset.source(source).to_iter_dataset()
    raise TypeError(
        "Expected a Grain IterDataset or Sequence. One-shot Python iterators are "
        "not accepted because they cannot provide Grain iterator state."
    )


def validate_index_batch(indices, length):
    resolved = [int(index) for index in indices]
    for index in resolved:
        if index < 0 or index >= length:
            raise IndexError(f"Index {index} out of range for {length} records")
    return resolved


class _DataraxRandomAccessBase:
    def __init__(self, source: Any) -> None:
        self.source = source
        self.length = len(source)

    def __len__(self) -> int:
        return self.length

    def _read_index(self, record_key: SupportsIndex) -> Any:
        index = to_index(record_key)
        validate_index_batch([index], self.length)
        return self.source[index]

    def _getitems(self, indices):
        return self.get_batch(indices)

    def get_batch(self, indices):
        resolved = validate_index_batch(indices, self.length)
        getitems = getattr(self.source, "_getitems", None)
        if getitems is not None:
            return list(getitems(resolved))
        return [self.source[index] for index in resolved]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source={type(self.source).__name__}, length={self.length})"


class DataraxMapDatasetAdapter(_DataraxRandomAccessBase):
    def __getitem__(self, index: int) -> Any:
        return self._read_index(index)


class ListSource:
    # A finite random-access Datarax source (records as dicts of arrays).
    def __init__(self, name, n):
        self.records = [{"source": name, "x": np.arange(3) + 10 * i} for i in range(n)]

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]


def data_source_to_iter_dataset(source) -> grain.IterDataset:
    try:
        length = len(source)
    except NotImplementedError as exc:
        raise TypeError("Only finite random-access sources can be converted to Grain") from exc
    if length < 0:
        raise ValueError("Source length must be non-negative")
    return grain.MapDataset.source(DataraxMapDatasetAdapter(source)).to_iter_dataset()


def mix_streaming_sources(datasets, *, weights=None) -> grain.IterDataset:
    if not datasets:
        raise ValueError("At least one dataset is required")
    return grain.IterDataset.mix([ensure_iter_dataset(dataset) for dataset in datasets], weights=weights)


def interleave_streaming_sources(datasets, *, cycle_length=None, num_make_iter_threads=1,
                                 make_iter_buffer_size=1, iter_buffer_size=1) -> grain.IterDataset:
    if not datasets:
        raise ValueError("At least one dataset is required")
    iter_datasets = [ensure_iter_dataset(dataset) for dataset in datasets]
    return grain.experimental.InterleaveIterDataset(
        iter_datasets,
        cycle_length=cycle_length or len(iter_datasets),
        num_make_iter_threads=num_make_iter_threads,
        make_iter_buffer_size=make_iter_buffer_size,
        iter_buffer_size=iter_buffer_size,
    )


def repeat_streaming_records(dataset, *, num_epochs=None) -> grain.IterDataset:
    return grain.experimental.RepeatIterDataset(ensure_iter_dataset(dataset), num_epochs=num_epochs)


def limit_streaming_records(dataset, *, count: int) -> grain.IterDataset:
    if count < 0:
        raise ValueError("count must be non-negative")
    return grain.experimental.LimitIterDataset(ensure_iter_dataset(dataset), count=count)


def index_shuffle(index: int, seed: int, num_elements: int) -> int:
    if index < 0 or index >= num_elements:
        raise IndexError(f"Index {index} out of range for {num_elements} elements")
    if num_elements <= 1:
        return 0
    return grain_index_shuffle(index=index, max_index=num_elements - 1, seed=seed, rounds=4)


def get_batch_size(batch):
    leaves = jax.tree.leaves(batch)
    return leaves[0].shape[0] if leaves and hasattr(leaves[0], "shape") and leaves[0].shape else None


def rebatch_iterable(iterator, target_batch_size, *, drop_remainder=False, pad=False, pad_value=0):
    if target_batch_size <= 0:
        raise ValueError("target_batch_size must be positive")
    if drop_remainder and pad:
        raise ValueError("drop_remainder and pad are mutually exclusive")
    dataset = ensure_iter_dataset(iterator)
    rebatched = grain.experimental.RebatchIterDataset(dataset, batch_size=target_batch_size,
                                                      drop_remainder=drop_remainder)
    if not pad:
        return rebatched
    return rebatched.map(lambda batch: _pad_rebatched_payload(batch, target_batch_size, pad_value))


def _pad_rebatched_payload(batch, target_batch_size, pad_value):
    batch_size = get_batch_size(batch)
    if batch_size is None or batch_size >= target_batch_size:
        return batch
    records = [jax.tree.map(lambda leaf, index=index: leaf[index], batch) for index in range(batch_size)]
    return grain.experimental.batch_and_pad(records, batch_size=target_batch_size, pad_value=pad_value)


def shard_bounds(total_size, shard_options):
    # Datarax's own interval math, pinned to Grain's private even_split.
    from grain._src.core.sharding import even_split
    return even_split(total_size, shard_options)


results = {}
ds = ensure_iter_dataset([{"x": 0}, {"x": 1}])
results["ensure"] = [isinstance(ds, grain.IterDataset), list(ds)]
try:
    ensure_iter_dataset(iter([{"x": 0}]))
except TypeError as e:
    results["ensure_error"] = str(e)

left = data_source_to_iter_dataset(ListSource("left", 6))
right = data_source_to_iter_dataset(ListSource("right", 9))
mixed = mix_streaming_sources([left, right], weights=[0.25, 0.75])
it = iter(mixed)
results["mixed"] = [next(it) for _ in range(7)]
state = it.get_state()
results["mixed_after"] = [next(it) for _ in range(5)]
it2 = iter(mix_streaming_sources([data_source_to_iter_dataset(ListSource("left", 6)),
                                  data_source_to_iter_dataset(ListSource("right", 9))], weights=[0.25, 0.75]))
it2.set_state(state)
results["mixed_restored"] = [next(it2) for _ in range(5)]
results["mixed_state"] = state
results["mixed_all"] = [r["source"] for r in mix_streaming_sources([ListSource("a", 3).records, ListSource("b", 3).records])]

inter = interleave_streaming_sources([[{"x": "a0"}, {"x": "a1"}, {"x": "a2"}], [{"x": "b0"}], [{"x": "c0"}, {"x": "c1"}]])
results["interleave"] = [item["x"] for item in inter]
inter2 = interleave_streaming_sources([data_source_to_iter_dataset(ListSource(n, k)) for n, k in (("p", 4), ("q", 3), ("r", 2))], cycle_length=2,
                                      num_make_iter_threads=2, make_iter_buffer_size=2, iter_buffer_size=2)
results["interleave2"] = [(r["source"], int(r["x"][0])) for r in inter2]

dataset = ensure_iter_dataset([{"x": np.array(1)}, {"x": np.array(2)}, {"x": np.array(3)}])
limited = limit_streaming_records(repeat_streaming_records(dataset, num_epochs=2), count=5)
results["repeat_limit"] = [int(item["x"]) for item in limited]
lit = iter(limit_streaming_records(repeat_streaming_records(dataset), count=7))
results["repeat_limit_head"] = [int(next(lit)["x"]) for _ in range(4)]
results["repeat_limit_state"] = lit.get_state()
results["repeat_limit_rest"] = [int(x["x"]) for x in lit]
try:
    limit_streaming_records(dataset, count=-1)
except ValueError as e:
    results["limit_error"] = str(e)

results["shuffle"] = {n: [index_shuffle(i, 123, n) for i in range(n)] for n in (1, 2, 7, 64, 100)}
try:
    index_shuffle(5, 1, 5)
except IndexError as e:
    results["shuffle_error"] = str(e)

batches = grain.MapDataset.source([{"x": np.arange(4) * i, "y": np.full(4, i, np.float32)} for i in range(3)])
results["rebatch"] = list(rebatch_iterable(batches, 5))
results["rebatch_drop"] = list(rebatch_iterable(batches, 5, drop_remainder=True))
results["rebatch_pad"] = list(rebatch_iterable(batches, 5, pad=True, pad_value=-1))
results["batch_and_pad"] = grain.experimental.batch_and_pad([np.array([1, 2]), np.array([3, 4])], batch_size=4)
try:
    rebatch_iterable(batches, 5, drop_remainder=True, pad=True)
except ValueError as e:
    results["rebatch_error"] = str(e)

bounds = {}
for num_examples in (0, 1, 7, 10, 11, 100, 101):
    for shard_count in (1, 2, 3, 4):
        for shard_index in range(shard_count):
            for drop_remainder in (True, False):
                with patch("jax.process_count", return_value=shard_count), \\
                     patch("jax.process_index", return_value=shard_index):
                    options = grain.sharding.ShardByJaxProcess(drop_remainder=drop_remainder)
                key = f"{num_examples}/{shard_count}/{shard_index}/{drop_remainder}"
                bounds[key] = [options.shard_index, options.shard_count, list(shard_bounds(num_examples, options))]
results["bounds"] = bounds

device = jax.devices("cpu")[0]
stream = grain.experimental.device_put(grain.MapDataset.range(6).map(lambda i: {"i": np.full(2, i)}).to_iter_dataset(),
                                       device, cpu_buffer_size=2 * 2, device_buffer_size=2)
results["device_put"] = [np.asarray(b["i"]).tolist() for b in stream]
"""


def test_datarax_streaming_bridges_index_shuffle_rebatch_and_sharding_as_on_grain():
  g, l = porting.run_both(DATARAX)
  g_plain = porting.grain_keys(g.results)
  assert porting.grain_keys(l.results) == g_plain
  assert g_plain["ensure"] == [True, [{"x": 0}, {"x": 1}]]
  assert g_plain["mixed_restored"] == g_plain["mixed_after"]
  assert g_plain["interleave"] == ["a0", "b0", "c0", "a1", "c1", "a2"]
  assert g_plain["repeat_limit"] == [1, 2, 3, 1, 2]
  assert g_plain["repeat_limit_head"] + g_plain["repeat_limit_rest"] == [1, 2, 3, 1, 2, 3, 1]
  assert all(sorted(v) == list(range(int(n))) for n, v in g_plain["shuffle"].items())
  assert [len(b["x"]) for b in g_plain["rebatch"]] == [5, 5, 2]
  assert g_plain["rebatch_pad"][-1]["y"] == [2.0, 2.0, -1.0, -1.0, -1.0]
  assert g_plain["bounds"]["10/3/1/False"] == [1, 3, [4, 7]]
  assert g_plain["device_put"] == [[i, i] for i in range(6)]


# The ARC loader as the client writes it (no tqdm); `DATA` is a JSON-lines file.
ARC = """
import json

import jax
import grain
import numpy as np


class JsonDataSource(grain.sources.RandomAccessDataSource):
    def __init__(self, file_path):
        self.file_path = file_path
        self.data = [json.loads(line.strip()) for line in open(file_path, "r").readlines()]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]

    def __repr__(self) -> str:
        return f"JsonDataSource(file_path={self.file_path})"


class Parse(grain.transforms.Map):
    def map(self, record):
        return {
            "x": np.asarray(record["x"]),
            "y": np.asarray(record["y"]),
            "colour_aug": np.asarray(record["colour_aug"]),
            "d8_aug": np.asarray([record["d8_aug"]]),
            "example_idx": np.asarray([record["example_idx"]]),
            "aug_puzzle_idx": np.asarray([record["aug_puzzle_idx"]]),
            "puzzle_idx": np.asarray([record["puzzle_idx"]]),
        }


class TranslateAndPad(grain.transforms.RandomMap):
    def __init__(self, translate, max_grid_size=30):
        self.translate = translate
        self.max_grid_size = max_grid_size

    def _pad(self, x, pad_width, pad_value):
        return np.pad(x, pad_width=pad_width, mode="constant", constant_values=pad_value)

    def random_map(self, record, rng):
        x, y = record["x"], record["y"]
        if self.translate:
            if self.translate == "random":
                pad_c = rng.integers(0, self.max_grid_size - max(x.shape[0], y.shape[0]) + 1)
                pad_r = rng.integers(0, self.max_grid_size - max(x.shape[1], y.shape[1]) + 1)
            elif self.translate == "fixed":
                pad_c = np.random.default_rng(seed=record["aug_puzzle_idx"]).integers(
                    0, self.max_grid_size - max(x.shape[0], y.shape[0]) + 1)
                pad_r = np.random.default_rng(seed=record["aug_puzzle_idx"]).integers(
                    0, self.max_grid_size - max(x.shape[1], y.shape[1]) + 1)
        else:
            pad_c = 0
            pad_r = 0
        padded_x = self._pad(x, ((pad_c, self.max_grid_size - x.shape[0] - pad_c),
                                 (pad_r, self.max_grid_size - x.shape[1] - pad_r)), 11)
        padded_y = self._pad(y, ((pad_c, self.max_grid_size - y.shape[0] - pad_c),
                                 (pad_r, self.max_grid_size - y.shape[1] - pad_r)), 11)
        border_c = pad_c + x.shape[0]
        border_r = pad_r + x.shape[1]
        if border_c < self.max_grid_size:
            padded_x[border_c, pad_r:border_r] = 10
            padded_y[border_c, pad_r:border_r] = 10
        if border_r < self.max_grid_size:
            padded_x[pad_c:border_c, border_r] = 10
            padded_y[pad_c:border_c, border_r] = 10
        return {**record, "x": padded_x.flatten(), "y": padded_y.flatten()}


def get_data_loader(data_dir, batch_size, translate, max_grid_size, repeat=True, drop_remainder=True,
                    shard_by_jax_process=False):
    per_process_batch_size = batch_size // jax.process_count()
    data_source = JsonDataSource(data_dir)
    sampler = grain.samplers.IndexSampler(
        len(data_source),
        seed=0,
        shuffle=True,
        num_epochs=None if repeat else 1,
        shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=False) if shard_by_jax_process
        else grain.sharding.NoSharding(),
    )
    operations = [
        Parse(),
        TranslateAndPad(translate=translate, max_grid_size=max_grid_size),
        grain.transforms.Batch(batch_size=per_process_batch_size, drop_remainder=drop_remainder),
    ]
    return grain.DataLoader(data_source=data_source, operations=operations, sampler=sampler)


results = {}
for translate in ("random", "fixed", None):
    loader = get_data_loader(DATA, 4, translate, 6, repeat=False, drop_remainder=False,
                             shard_by_jax_process=translate == "fixed")
    results[str(translate)] = list(loader)
train = get_data_loader(DATA, 4, "random", 6)
it = iter(train)
results["train_head"] = [next(it) for _ in range(4)]
state = it.get_state()
results["train_next"] = [next(it) for _ in range(3)]
it2 = iter(get_data_loader(DATA, 4, "random", 6))
it2.set_state(state)
results["train_restored"] = [next(it2) for _ in range(3)]
results["state"] = json.loads(state.decode())
results["eval_dropped"] = len(list(get_data_loader(DATA, 4, None, 6, repeat=False)))
"""


def write_puzzles(tmp_path):
  rng = np.random.default_rng(1)
  path = tmp_path / "train.jsonl"
  with open(path, "w", encoding="utf-8") as f:
    for i in range(11):
      h, w = int(rng.integers(1, 5)), int(rng.integers(1, 5))
      f.write(json.dumps({
          "x": rng.integers(0, 10, (h, w)).tolist(), "y": rng.integers(0, 10, (h, w)).tolist(),
          "colour_aug": rng.permutation(10).tolist(), "d8_aug": int(rng.integers(8)), "example_idx": i % 3,
          "aug_puzzle_idx": i // 3, "puzzle_idx": i // 4, "puzzle_id": f"p{i // 4:03d}"}) + "\n")
  return str(path)


def test_arc_json_source_random_translate_and_pad_as_on_grain(tmp_path):
  g, l = porting.run_both(ARC, DATA=write_puzzles(tmp_path))
  g_plain = porting.grain_keys(g.results)
  assert porting.grain_keys(l.results) == g_plain
  assert [len(b["x"]) for b in g_plain["random"]] == [4, 4, 3]
  assert len(g_plain["random"][0]["x"][0]) == 36
  assert g_plain["train_restored"] == g_plain["train_next"] and g_plain["eval_dropped"] == 2
  assert g_plain["state"]["last_seen_indices"] == {"0": 15}
  assert g_plain["state"]["data_source"].startswith("JsonDataSource(file_path=")


# The transform module's Grain parts (no tokenizer: data_type "token"); the
# trainer's `apply` calls dataset-level transforms and maps Grain's.
PACKING = """
import dataclasses as dc
import typing as tp
from dataclasses import dataclass
from enum import auto, StrEnum

import grain
import numpy as np
from grain import transforms as grain_transforms


class DataType(StrEnum):
    CHAT = auto()
    TEXT = auto()
    TOKEN = auto()


class DatasetTransforms:
    # The client's base of dataset-level transforms (called on a dataset).
    def __call__(self, dataset):
        raise NotImplementedError


@dataclass
class ApplyFirstFitPacking(DatasetTransforms):
    length_struct: dict[str, int]
    num_packing_bins: int | None = None
    shuffle_bins: bool = True
    meta_features: tp.Sequence[str] = ()

    def __call__(self, dataset: grain.IterDataset) -> grain.IterDataset:
        bins = self.num_packing_bins or max(self.length_struct.values())
        packed = grain.experimental.FirstFitPackIterDataset(
            dataset,
            length_struct=self.length_struct,
            num_packing_bins=bins,
            shuffle_bins=self.shuffle_bins,
            meta_features=self.meta_features,
        )
        return packed


@dc.dataclass
class NestInputs(grain_transforms.Map):
    def map(self, features: dict[str, tp.Any]) -> dict[str, tp.Any]:
        if "inputs" in features:
            return features
        inputs: dict[str, tp.Any] = {
            "input_ids": features["input_ids"],
            "attention_mask": features["attention_mask"],
        }
        if "input_ids_segment_ids" in features:
            inputs["segment_ids"] = features["input_ids_segment_ids"]
        if "assistant_masks" in features:
            inputs["assistant_masks"] = features["assistant_masks"]
        mask = features["_mask"] if "_mask" in features else features["attention_mask"]
        return {"inputs": inputs, "labels": features["labels"], "_mask": mask}


def make(column, max_length, data_type=None, tokenizer=None, assistant_loss=False, packing=False,
         packing_bins=64):
    if data_type is None:
        raise ValueError("data_type is required")
    if data_type not in tuple(DataType):
        raise ValueError(f"Unsupported data_type {data_type!r}. Expected one of {tuple(DataType)!r}.")
    if data_type != DataType.TOKEN and tokenizer is None:
        raise ValueError(f"tokenizer is required unless data_type={DataType.TOKEN!r}")
    transforms = []
    if packing:
        length_struct = {
            "input_ids": max_length,
            "attention_mask": max_length,
            "labels": max_length,
            **({"_mask": max_length} if data_type != DataType.TOKEN else {}),
            **({"assistant_masks": max_length} if assistant_loss else {}),
        }
        transforms.append(ApplyFirstFitPacking(
            length_struct=length_struct,
            num_packing_bins=packing_bins,
            meta_features=("attention_mask", "labels")
            + (("_mask",) if data_type != DataType.TOKEN else ())
            + (("assistant_masks",) if assistant_loss else ()),
        ))
    transforms.append(NestInputs())
    return transforms


def apply(ds, transforms):
    # The trainer applies dataset-level transforms by calling them, and
    # Grain transforms with `map`.
    for t in transforms:
        ds = t(ds) if isinstance(t, DatasetTransforms) else ds.map(t)
    return ds


def records(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(2, 9))
        ids = rng.integers(1, 100, length + 1).astype(np.int32)
        out.append({"input_ids": ids[:-1], "attention_mask": np.ones(length, np.int32), "labels": ids[1:]})
    return out


results = {}
try:
    make("text", 8)
except ValueError as e:
    results["no_type"] = str(e)
try:
    make("text", 8, data_type="text")
except ValueError as e:
    results["no_tokenizer"] = str(e)
def pipeline(bins, shuffle):
    transforms = make("text", 10, data_type="token", packing=True, packing_bins=bins)
    transforms[0].shuffle_bins = shuffle
    return apply(grain.MapDataset.source(records(23, 0)).to_iter_dataset(), transforms).batch(2)


def resume(state, bins, shuffle):
    it = iter(pipeline(bins, shuffle))
    it.set_state(state)
    return list(it)


for bins, shuffle in ((4, True), (None, False)):
    it = iter(pipeline(bins, shuffle))
    head = [next(it) for _ in range(2)]
    state = it.get_state()
    rest = list(it)
    results[f"{bins}/{shuffle}"] = {"head": head, "rest": rest, "restored": resume(state, bins, shuffle),
                                    "state": state}
plain = apply(grain.MapDataset.source(records(5, 1)).to_iter_dataset(), make("text", 10, data_type="token"))
results["unpacked"] = list(plain)
try:
    too_long = apply(grain.MapDataset.source(records(5, 2)).to_iter_dataset(),
                     make("text", 4, data_type="token", packing=True, packing_bins=2))
    results["too_long"] = list(too_long)
except Exception as e:
    results["too_long"] = f"{type(e).__name__}: {e}"
"""


def test_first_fit_packing_with_meta_features_and_nest_inputs_as_on_grain():
  g, l = porting.run_both(PACKING)
  g_plain, l_plain = porting.grain_keys(g.results), porting.grain_keys(l.results)
  for key in ("4/True", "None/False"):
    # A packing state has loader's layout (README, CheckpointHandler row);
    # loader resumes Grain's at Grain's element.
    g_state, l_state = g_plain[key].pop("state"), l_plain[key].pop("state")
    assert g_state["next_row"] == l_state["next_row"] and g_state["counter"] == l_state["counter"]
    bins, shuffle = key.split("/")
    resumed = l.resume(g.results[key]["state"], None if bins == "None" else int(bins), shuffle == "True")
    assert porting.plain(resumed) == g_plain[key]["rest"]
  assert l_plain == g_plain
  assert g_plain["4/True"]["restored"] == g_plain["4/True"]["rest"]
  assert g_plain["4/True"]["head"][0]["inputs"]["segment_ids"][0] == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
  assert g_plain["too_long"].startswith(
      "ValueError: Inputs to PackedBatch must be truncated to max length. Exceeds: (feature_path, "
      "feature_length, max_length) = [((DictKey(key='attention_mask'),), 7, 4), ")


CKPT_HELPERS = """
import json
import os
from os import PathLike
from typing import Any, cast

import grain
import numpy as np
import orbax.checkpoint as ocp

GrainIterator = grain.DataLoaderIterator  # a `type` alias in the client (Python 3.12)


def _validated_checkpoint_path(path):
    path = str(path)
    if path.endswith(".orbax-checkpoint-tmp"):
        raise ValueError("checkpoint paths must not use Orbax's temporary suffix")
    return path


def save_legacy_v0_grain_iterator(path, iterator) -> None:
    _validate_iterator(iterator)
    checkpoint_path = _validated_checkpoint_path(path)
    with ocp.Checkpointer(_grain_handler()) as checkpointer:
        checkpointer.save(checkpoint_path, args=grain.checkpoint.CheckpointSave(iterator), force=False)


def load_legacy_v0_grain_iterator(path, iterator):
    _validate_iterator(iterator)
    checkpoint_path = _validated_checkpoint_path(path)
    with ocp.Checkpointer(_grain_handler()) as checkpointer:
        restored = checkpointer.restore(checkpoint_path, args=grain.checkpoint.CheckpointRestore(iterator))
    if not isinstance(restored, grain.DatasetIterator):
        raise TypeError("the legacy V0 Grain checkpoint did not restore a DatasetIterator")
    return restored


def _grain_handler() -> ocp.CheckpointHandler:
    return cast(ocp.CheckpointHandler, grain.checkpoint.CheckpointHandler())


def _validate_iterator(iterator: object) -> None:
    if not isinstance(iterator, grain.DatasetIterator):
        raise TypeError("iterator must be a Grain DatasetIterator")


def register_grain_iterator_handler(handler_registry) -> None:
    handler_registry.add("input_iter", grain.checkpoint.CheckpointSave,
                         cast(ocp.handlers.CheckpointHandler, grain.checkpoint.CheckpointHandler))
    handler_registry.add("input_iter", grain.checkpoint.CheckpointRestore,
                         cast(ocp.handlers.CheckpointHandler, grain.checkpoint.CheckpointHandler))


def make_grain_save_args(train_state, input_iter: GrainIterator) -> ocp.args.Composite:
    return ocp.args.Composite(train_state=ocp.args.PyTreeSave(train_state),
                              input_iter=grain.checkpoint.CheckpointSave(input_iter))


def make_grain_restore_args(abstract_train_state, input_iter: GrainIterator) -> ocp.args.Composite:
    return ocp.args.Composite(train_state=ocp.args.PyTreeRestore(abstract_train_state),
                              input_iter=grain.checkpoint.CheckpointRestore(input_iter))


def restored_input_iter(restored) -> GrainIterator:
    return restored["input_iter"]


def dataset_iterator():
    return iter(grain.MapDataset.range(20).shuffle(seed=3).map(lambda x: x * 10).batch(3).to_iter_dataset())


def data_loader():
    return grain.DataLoader(data_source=[{"x": np.int32(i)} for i in range(20)],
                            sampler=grain.samplers.IndexSampler(20, shuffle=True, seed=1, num_epochs=2),
                            operations=[grain.transforms.Batch(4)])


results = {}
it = dataset_iterator()
results["ds_head"] = [next(it) for _ in range(2)]
save_legacy_v0_grain_iterator(f"{DIR}/legacy", it)
results["ds_next"] = [next(it) for _ in range(2)]
restored = load_legacy_v0_grain_iterator(f"{DIR}/legacy", dataset_iterator())
results["ds_restored"] = [next(restored) for _ in range(2)]
results["ds_files"] = sorted(os.listdir(f"{DIR}/legacy"))
with open(f"{DIR}/legacy/process_0-of-1.json") as f:
    results["ds_file"] = json.loads(f.read())
for bad in (iter([1, 2]), [1, 2], grain.MapDataset.range(3)):
    try:
        save_legacy_v0_grain_iterator(f"{DIR}/bad", bad)
    except TypeError as e:
        results.setdefault("not_iterators", []).append(str(e))
try:
    save_legacy_v0_grain_iterator(f"{DIR}/x.orbax-checkpoint-tmp", dataset_iterator())
except ValueError as e:
    results["tmp_suffix"] = str(e)
loader_it = iter(data_loader())
results["dl_is_dataset_iterator"] = [isinstance(loader_it, grain.DatasetIterator),
                                     isinstance(loader_it, grain.DataLoaderIterator),
                                     isinstance(it, grain.DataLoaderIterator)]
results["alias"] = GrainIterator.__name__

registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
register_grain_iterator_handler(registry)
registry.add("train_state", ocp.args.PyTreeSave, ocp.PyTreeCheckpointHandler)
registry.add("train_state", ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler)
mngr = ocp.CheckpointManager(f"{DIR}/mngr", handler_registry=registry)
train_state = {"w": np.arange(4, dtype=np.float32), "step": np.int32(2)}
results["dl_head"] = [next(loader_it) for _ in range(2)]
mngr.save(2, args=make_grain_save_args(train_state, loader_it))
mngr.wait_until_finished()
results["dl_next"] = [next(loader_it) for _ in range(3)]
mngr2 = ocp.CheckpointManager(f"{DIR}/mngr", handler_registry=registry)
restored = mngr2.restore(mngr2.latest_step(), args=make_grain_restore_args(train_state, iter(data_loader())))
input_iter = restored_input_iter(restored)
results["dl_restored"] = [next(input_iter) for _ in range(3)]
results["train_state"] = restored["train_state"]
results["dl_rest"] = len(list(input_iter))
"""


def test_orbax_legacy_v0_and_handler_registry_helpers_as_on_grain(tmp_path):
  out = {}
  for lib in porting.LIBS:
    os.makedirs(tmp_path / lib)
    out[lib] = porting.grain_keys(porting.run(CKPT_HELPERS, lib, DIR=str(tmp_path / lib)).results)
  assert out["loader"] == out["grain"]
  g = out["grain"]
  assert g["ds_restored"] == g["ds_next"] and g["dl_restored"] == g["dl_next"]
  assert "process_0-of-1.json" in g["ds_files"]
  assert g["not_iterators"] == ["iterator must be a Grain DatasetIterator"] * 3
  assert g["alias"] == "DataLoaderIterator" and g["dl_rest"] == 5
  assert g["train_state"] == {"step": 2, "w": [0.0, 1.0, 2.0, 3.0]}


E1 = """
import hashlib
import json
import os
import sys

import msgpack
import numpy as np

N_TOTAL = 20
N_CHECKPOINT = 10
STATE_PATH = os.path.join(os.getcwd(), f"e1_state_{sys.argv[1]}.msgpack")


class Config:
    seed = 7
    batch_size = 3


class NumpyRows:
    # Stands in for `load_from_disk(...).with_format("numpy")`: rows as dicts of numpy values.
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.tokens = rng.integers(0, 1000, size=(n, 6)).astype(np.int64)
        self.label = rng.random(n).astype(np.float32)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return {"tokens": self.tokens[i], "label": self.label[i]}


def _hash_batch(batch: dict) -> str:
    h = hashlib.sha1()
    for k in sorted(batch.keys()):
        v = np.asarray(batch[k])
        h.update(k.encode())
        h.update(str(v.shape).encode())
        h.update(str(v.dtype).encode())
        h.update(v.tobytes())
    return h.hexdigest()[:16]


def build_grain_iter(config, grad_accum_steps):
    import grain

    hf_train = NumpyRows(29)
    ds = (
        grain.MapDataset.source(hf_train)
        .seed(config.seed)
        .shuffle()
        .repeat()
        .batch(config.batch_size * grad_accum_steps, drop_remainder=True)
        .to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=16))
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    )
    return iter(ds)


def main():
    config = Config()
    grad_accum_steps = 2
    it_a = build_grain_iter(config, grad_accum_steps)
    hashes_a = []
    for i in range(N_TOTAL):
        batch = next(it_a)
        hashes_a.append(_hash_batch(batch))
        if i + 1 == N_CHECKPOINT:
            saved_state = it_a.get_state()
            with open(STATE_PATH, "wb") as f:
                f.write(msgpack.packb(saved_state, use_bin_type=True))
    it_b = build_grain_iter(config, grad_accum_steps)
    with open(STATE_PATH, "rb") as f:
        restored = msgpack.unpackb(f.read(), raw=False)
    it_b.set_state(restored)
    hashes_b = [_hash_batch(next(it_b)) for _ in range(N_TOTAL - N_CHECKPOINT)]
    tail_a = hashes_a[N_CHECKPOINT:]
    matches = [a == b for a, b in zip(tail_a, hashes_b)]
    print(json.dumps({"hashes": hashes_a, "restored": hashes_b, "matches": sum(matches),
                      "last": {k: np.asarray(v).tolist() for k, v in batch.items()}}))


if __name__ == "__main__":
    from absl import flags
    flags.FLAGS.mark_as_parsed()  # Grain 0.2.18's mp_prefetch workers read its absl flags.
    sys.exit(main())
"""


def test_resume_parity_script_msgpack_state_under_mp_prefetch_as_on_grain(tmp_path):
  g = porting.run_script(E1, "grain", tmp_path, "grain")
  l = porting.run_script(E1, "loader", tmp_path, "loader")
  assert l == g
  assert g["matches"] == 10 and g["restored"] == g["hashes"][10:]
  assert len(set(g["hashes"])) > 10


# The trainer script's data part (its model, metrics, MLflow and Orbax parts
# left out); argv: the data folder, the boards to train on, the workers. The
# window is 1 << 5 rows here (1 << 23 in the client).
ZEUXO = """
import json
import math
import random
import sys
from pathlib import Path

import absl.flags
import grain
import numpy as np
import pyarrow.dataset as pds
from scipy.special import expit

SEED = 42
LOGISTIC_SCALING = 400.0
N_SQUARES = 4


def main():
    train_file = Path(sys.argv[1])
    batch_size = 1 << 3
    train_boards = int(sys.argv[2])
    iterations = train_boards // batch_size
    training_samples = [str(p.absolute()) for p in sorted(train_file.glob("setType=train/*.parquet"))]
    random.Random(SEED).shuffle(training_samples)
    train_rows = pds.dataset(training_samples).count_rows()
    epochs = math.ceil(train_boards / train_rows)
    dataset = (grain.experimental.WindowShuffleIterDataset(
        grain.experimental.ParquetIterDataset(training_samples * epochs),
        window_size=1 << 5,
        seed=SEED
        )
        .batch(batch_size, drop_remainder=True)
        .map(lambda batch: {
            "features": batch["features"],
            "label": expit(batch["eval"].astype(np.float32) / LOGISTIC_SCALING),
        })
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=int(sys.argv[3])))
    )
    steps = []
    for step, batch in enumerate(dataset):
        steps.append({"features": np.asarray(batch["features"]).tolist(),
                      "label": np.round(batch["label"], 6).tolist()})
        if step >= iterations - 1:
            break
    print(json.dumps({"epochs": epochs, "rows": train_rows, "steps": steps}))


if __name__ == "__main__":
    absl.flags.FLAGS.mark_as_parsed()  # avoid absl flag parsing errors when running as a script
    main()
"""


def write_boards(tmp_path):
  rng = np.random.default_rng(0)
  folder = tmp_path / "data" / "setType=train"
  os.makedirs(folder)
  first = 0
  for i in range(3):
    n = 10 + i
    features = [list(range(first + j, first + j + 4)) for j in range(n)]
    first += n
    pq.write_table(pa.table({"features": pa.array(features, pa.list_(pa.int8())),
                             "eval": pa.array(rng.integers(-900, 900, n).astype(np.int16))}),
                   folder / f"part-{i}.parquet")
  return str(tmp_path / "data")


def test_chess_eval_parquet_window_shuffle_batch_map_mp_prefetch_as_on_grain(tmp_path):
  data = write_boards(tmp_path)
  g = porting.run_script(ZEUXO, "grain", tmp_path, data, "48", "0")
  assert porting.run_script(ZEUXO, "loader", tmp_path, data, "48", "0") == g
  # Worker-count-invariant: loader's stream with workers is Grain's without.
  assert porting.run_script(ZEUXO, "loader", tmp_path, data, "48", "4") == g
  assert g["epochs"] == 2 and g["rows"] == 33 and len(g["steps"]) == 6
  rows = [tuple(r) for step in g["steps"] for r in step["features"]]
  assert all(list(r) == list(range(r[0], r[0] + 4)) and r[0] < 33 and rows.count(r) <= 2 for r in rows)
  assert all(0 < x < 1 for step in g["steps"] for x in step["label"])
