"""Round 29's public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

pszemraj/chomp, src/chomp/data/grain.py and ckpt.py (a newer version than
the eleventh file's port): `_make_grain_iter_classes` (a parentless
`DatasetIterator` subclass with keyword-only `__init__` and its own
`get_state` / `set_state` / `get_stats`, an `IterDataset` calling
`super().__init__()` with no parent), `build_grain_iterator` with and
without `grain.experimental.ThreadPrefetchIterDataset`,
`GrainTrainBatchIterator` and ckpt.py's Orbax `Composite` of
`StandardSave`, `grain.checkpoint.CheckpointSave` and `JsonSave`, restored
with `CheckpointRestore` into a fresh iterator; every other state resumed.

A general source adapter module (the index names no repository):
`grain.sources.RandomAccessDataSource` subclass without `super().__init__()`,
a replaying `_GeneralIterator` whose `close` calls `super().close()`, a
parentless `GeneralIterDataset`, and `grain_from_source` over lists, a
Hugging Face `datasets.Dataset.from_dict` (stand-in), read-only mappings,
generators and iterators, with `ReadOptions`; each restored at every step;
its ValueError / TypeError for bad input.

A token-window data loader (the index names no repository):
`ToTrainingExamples` (generator `flat_map`, class-level `max_fan_out` of a
million) as a `DataLoader` operation over `grain.ArrayRecordDataSource`, a
shuffled `IndexSampler` over one record for two epochs, one worker; run as
a script and resumed.

jax_gpt's data/pipeline.py (the index names no repository): `DataPipeline`
over a memmap source with no Grain base class, `SequentialSampler` with
`ShardOptions` of several hosts, `get_batch`, `skip_to_step`, a resume, and
the 'gcs' branch's `from grain.experimental import ArrayRecordDataSource`
(ImportError on both).

egxc's dataloading/grain.py: `GrainDataLoaderWrapper` over endless
`IndexSampler` loaders (no `num_epochs`) and `get_sample_for_model_init`,
in process (`worker_count=None` starts Grain's worker processes).

Where loader differs, the difference is documented (README, `DataLoader`)
and asserted: a DataLoader over a source with the default repr resumes on a
new loader (Grain refuses: "DataSource in checkpoint does not match").
"""

from __future__ import annotations

import absl.flags
import numpy as np

from tests import porting

absl.flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.


CHOMP = r'''
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class Batch:  # chomp.types.Batch (an eqx.Module of four arrays)
    input_ids: Any
    labels: Any
    attention_mask: Any
    segment_ids: Any


class TrainBatchIterator:  # stand-in for chomp.data.pipeline.TrainBatchIterator: tokenize + sequential pack
    def __init__(self, cfg, tokenizer):
        self._cfg, self._tok = cfg, tokenizer
        self._doc, self._buf, self._seg, self._segs = 0, [], 1, []

    def __next__(self):
        T, B = self._cfg.data.seq_len, self._cfg.train.batch_size
        rows = []
        while len(rows) < B:
            while len(self._buf) < T + 1:
                if self._doc >= len(self._cfg.data.docs):
                    if not self._cfg.data.repeat:
                        raise StopIteration
                    self._doc = 0
                ids = self._tok.encode(self._cfg.data.docs[self._doc])
                self._buf += ids
                self._segs += [self._seg] * len(ids)
                self._seg += 1
                self._doc += 1
            rows.append((self._buf[:T + 1], self._segs[:T + 1]))
            self._buf, self._segs = self._buf[T:], self._segs[T:]
        ids = np.array([r[0] for r in rows], np.int32)
        seg = np.array([r[1][:-1] for r in rows], np.int32)
        return Batch(ids[None, :, :-1], ids[None, :, 1:], np.ones_like(seg, bool)[None], seg[None])

    def get_state(self):
        return {"doc": self._doc, "buf": list(self._buf), "seg": self._seg, "segs": list(self._segs)}

    def set_state(self, state):
        self._doc, self._buf, self._seg, self._segs = state["doc"], list(state["buf"]), state["seg"], list(state["segs"])

    def get_stats(self):
        return {"docs_seen": self._doc}


class _IteratorProtocol(Protocol):
    """Protocol for Grain dataset iterators."""

    def __next__(self) -> Batch: ...

    def get_state(self) -> dict[str, Any]:
        """Return iterator state for checkpointing."""
        ...

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore iterator state from a checkpoint."""
        ...


class GrainTrainBatchIterator:
    """Iterator wrapper that runs the pipeline through Grain."""

    def __init__(self, *, ds: Any, packing_mode: str, enable_stats: bool) -> None:
        self._ds = ds
        self._it: _IteratorProtocol = iter(ds)
        self._packing_mode = str(packing_mode)
        self._enable_stats = bool(enable_stats)
        self._last_stats: dict[str, float | int | str] = {}

    def __iter__(self) -> "GrainTrainBatchIterator":
        return self

    def __next__(self) -> Batch:
        batch = next(self._it)
        if not self._enable_stats:
            self._last_stats = {}
            return batch
        attn = batch.attention_mask
        tokens_used = int(np.count_nonzero(attn))
        capacity = int(attn.size)
        utilization = float(tokens_used / capacity) if capacity > 0 else 0.0
        self._last_stats = {
            "packing_mode": self._packing_mode,
            "packing_tokens": tokens_used,
            "packing_capacity": capacity,
            "packing_utilization": utilization,
        }
        return batch

    def get_state(self) -> dict[str, Any]:
        return self._it.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._it.set_state(state)
        self._last_stats = {}

    def checkpoint_target(self) -> Any:
        return self._it

    def get_stats(self) -> dict[str, float | int | str]:
        if not self._enable_stats:
            return {}
        stats: dict[str, float | int | str] = dict(self._last_stats)
        get_stats = getattr(self._it, "get_stats", None)
        if callable(get_stats):
            try:
                extra = get_stats()
            except Exception:
                extra = {}
            if extra:
                stats.update(extra)
        return stats


def _make_grain_iter_classes(grain: Any) -> tuple[type[Any], type[Any]]:
    class _TrainBatchDatasetIterator(grain.DatasetIterator):  # type: ignore[misc]
        """DatasetIterator that delegates to TrainBatchIterator."""

        def __init__(self, *, cfg: Any, tokenizer: Any) -> None:
            super().__init__()
            self._it = TrainBatchIterator(cfg, tokenizer=tokenizer)

        def __next__(self) -> Batch:
            return next(self._it)

        def get_state(self) -> dict[str, Any]:
            return self._it.get_state()

        def set_state(self, state: dict[str, Any]) -> None:
            self._it.set_state(state)

        def get_stats(self) -> dict[str, int]:
            if hasattr(self._it, "get_stats"):
                return dict(self._it.get_stats())
            return {}

    class _TrainBatchIterDataset(grain.IterDataset):  # type: ignore[misc]
        """IterDataset that yields chomp Batch objects."""

        def __init__(self, *, cfg: Any, tokenizer: Any) -> None:
            super().__init__()
            self._cfg = cfg
            self._tokenizer = tokenizer

        def __iter__(self) -> grain.DatasetIterator:
            return _TrainBatchDatasetIterator(cfg=self._cfg, tokenizer=self._tokenizer)

    return _TrainBatchDatasetIterator, _TrainBatchIterDataset


def build_grain_iterator(cfg: Any, *, tokenizer: Any) -> GrainTrainBatchIterator:
    try:
        import grain.python as grain
    except Exception as exc:  # pragma: no cover - missing dependency
        raise RuntimeError("Grain is not installed. Install with `pip install grain`.") from exc

    _TrainBatchDatasetIterator, _TrainBatchIterDataset = _make_grain_iter_classes(grain)
    ds = _TrainBatchIterDataset(cfg=cfg, tokenizer=tokenizer)

    if cfg.data.device_put and cfg.data.grain_prefetch > 0:
        logger.warning(
            "data.device_put=True with grain_prefetch>0 may place device transfers on "
            "background threads; consider setting data.device_put=false."
        )

    if cfg.data.grain_prefetch > 0:
        ds = grain.experimental.ThreadPrefetchIterDataset(
            ds, prefetch_buffer_size=int(cfg.data.grain_prefetch)
        )

    return GrainTrainBatchIterator(
        ds=ds,
        packing_mode=cfg.data.packing_mode,
        enable_stats=not cfg.data.device_put,
    )


# chomp/ckpt.py: save / _restore_step's Orbax Composite, the train state a small array.
def _checkpoint_target(data_iter: Any) -> Any:
    if hasattr(data_iter, "checkpoint_target"):
        return data_iter.checkpoint_target()
    return data_iter


def save(manager, *, step, train_state, data_iter, meta, force=False):
    import grain.checkpoint as gcp
    import orbax.checkpoint as ocp

    step = int(step)
    manager.save(
        step,
        args=ocp.args.Composite(
            train_state=ocp.args.StandardSave(train_state),
            data_state=gcp.CheckpointSave(_checkpoint_target(data_iter)),
            meta=ocp.args.JsonSave(meta),
        ),
        force=force,
    )


def _restore_step(manager, *, step, abstract_train_state, data_iter):
    import grain.checkpoint as gcp
    import orbax.checkpoint as ocp

    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            train_state=ocp.args.StandardRestore(abstract_train_state),
            data_state=gcp.CheckpointRestore(_checkpoint_target(data_iter)),
            meta=ocp.args.JsonRestore(),
        ),
    )
    train_state = restored["train_state"]
    meta = restored.get("meta")
    return step, train_state, meta


# ---- The port's use ----
import types

import orbax.checkpoint as ocp


class ByteTok:
    def encode(self, text):
        return list(text.encode("utf-8"))


def make_cfg(prefetch, repeat=True, device_put=False):
    docs = [f"doc {i} " + "xy" * (i % 4) for i in range(9)]
    data = types.SimpleNamespace(seq_len=6, docs=docs, repeat=repeat, device_put=device_put, grain_prefetch=prefetch,
                                 packing_mode="sequential")
    return types.SimpleNamespace(data=data, train=types.SimpleNamespace(batch_size=2))


def summary(b):
    return {k: [getattr(b, k).tolist(), str(getattr(b, k).dtype)] for k in ("input_ids", "labels", "attention_mask", "segment_ids")}


def plain_eq(a, b):
    return [summary(x) for x in a] == [summary(x) for x in b]


results = {}
for prefetch in (0, 2):
    it = build_grain_iterator(make_cfg(prefetch, repeat=False), tokenizer=ByteTok())
    states, reference, stats = [], [], []
    while True:
        states.append(it.get_state())
        try:
            reference.append(next(it))
        except StopIteration:
            break
        stats.append(it.get_stats())
    resumed = []
    for k in range(0, len(states), 2):
        fresh = build_grain_iterator(make_cfg(prefetch, repeat=False), tokenizer=ByteTok())
        fresh.set_state(states[k])
        resumed.append(plain_eq(list(fresh), reference[k:]))
    results[f"prefetch_{prefetch}"] = {"batches": [summary(b) for b in reference], "stats": stats,
                                       "resumed": resumed, "state_3": states[3]}

# The checkpoint: Orbax CheckpointManager with the Composite of ckpt.save, restored into a fresh iterator.
it = build_grain_iterator(make_cfg(2), tokenizer=ByteTok())
for _ in range(3):
    next(it)
with ocp.CheckpointManager(ckpt_dir) as manager:
    save(manager, step=3, train_state={"w": np.arange(3.0)}, data_iter=it, meta={"step": 3})
    manager.wait_until_finished()
    expected = [summary(next(it)) for _ in range(4)]
    again = build_grain_iterator(make_cfg(2), tokenizer=ByteTok())
    step, train_state, meta = _restore_step(
        manager, step=3, abstract_train_state={"w": np.zeros(3)}, data_iter=again)
    results["restored"] = {"step": step, "w": train_state["w"].tolist(), "meta": meta,
                           "same": [summary(next(again)) for _ in range(4)] == expected}
results["device_put_stats"] = build_grain_iterator(make_cfg(0, device_put=True), tokenizer=ByteTok()).get_stats()
'''


def test_chomp_custom_dataset_iterator_thread_prefetch_and_orbax_composite_as_on_grain(tmp_path):
  """pszemraj/chomp: src/chomp/data/grain.py (`_make_grain_iter_classes`, `build_grain_iterator`, `GrainTrainBatchIterator`) and ckpt.py's Orbax Composite."""
  g, l = (porting.grain_keys(porting.run(CHOMP, lib, ckpt_dir=str(tmp_path / lib)).results) for lib in porting.LIBS)
  assert l == g
  for prefetch in (0, 2):
    r = g[f"prefetch_{prefetch}"]
    assert r["resumed"] == [True] * len(r["resumed"]) and len(r["batches"]) >= 4
    assert r["state_3"]["doc"] > 0 and r["stats"][0]["packing_mode"] == "sequential"
  assert g["prefetch_0"]["batches"] == g["prefetch_2"]["batches"]
  assert g["restored"] == {"step": 3, "w": [0.0, 1.0, 2.0], "meta": {"step": 3}, "same": True}
  assert g["device_put_stats"] == {}


# A general source adapter module (the index names no repository; it imports
# Hugging Face `datasets`, which the test stands in for with `from_dict`
# only): `GeneralRandomAccessSource`, `_GeneralIterator`, `GeneralIterDataset`
# and `grain_from_source` as written.
GENERAL_SOURCES = r'''
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Callable, Dict, Optional

import grain
import datasets


def _is_random_access_dataset(obj: Any) -> bool:
    """Return True if obj looks like a random-access dataset."""
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__")


def _is_hf_iterable_dataset(obj: Any) -> bool:
    cls = obj.__class__
    return (
        cls.__name__ == "IterableDataset"
        and cls.__module__.startswith("datasets")
    )


class GeneralRandomAccessSource(grain.sources.RandomAccessDataSource):
    def __init__(
        self,
        data: Any,
        *,
        adapter: Callable[[Any], Any] | None = None,
        dict_mode: str = "items",
    ):
        self._adapter = adapter

        if isinstance(data, Mapping):
            if dict_mode == "items":
                self._data = [{"key": k, "value": v} for k, v in data.items()]
            elif dict_mode == "values":
                self._data = list(data.values())
            elif dict_mode == "keys":
                self._data = list(data.keys())
            else:
                raise ValueError(
                    "dict_mode must be one of {'items', 'values', 'keys'}"
                )
        elif _is_random_access_dataset(data):
            self._data = data
        else:
            raise TypeError(
                "GeneralRandomAccessSource requires a random-access object "
                "(must implement __len__ and __getitem__)."
            )

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> Any:
        item = self._data[index]
        if self._adapter is not None:
            item = self._adapter(item)
        return item

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(len={len(self)})"


class _GeneralIterator(grain.DatasetIterator):
    def __init__(self, iterable_factory: Callable[[], Iterable[Any]], start_index: int = 0):
        super().__init__()
        self._iterable_factory = iterable_factory
        self._index = 0
        self._closed = False

        self._iter = iter(self._iterable_factory())
        for _ in range(start_index):
            try:
                next(self._iter)
                self._index += 1
            except StopIteration:
                break

    def __next__(self) -> Any:
        if self._closed:
            raise ValueError("Iterator is closed.")
        item = next(self._iter)
        self._index += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = 0
        start_index = int(state["index"])
        self._iter = iter(self._iterable_factory())
        for _ in range(start_index):
            try:
                next(self._iter)
                self._index += 1
            except StopIteration:
                break

    def close(self) -> None:
        self._closed = True
        super().close()


class GeneralIterDataset(grain.IterDataset):
    def __init__(
        self,
        data: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        adapter: Callable[[Any], Any] | None = None,
    ):
        super().__init__()
        self._adapter = adapter

        if callable(data):
            self._factory = data
        else:
            if isinstance(data, Iterator):
                cached = list(data)
                self._factory = lambda: iter(cached)
            else:
                self._factory = lambda: iter(data)

    def __iter__(self) -> grain.DatasetIterator:
        adapter = self._adapter
        factory = self._factory

        if adapter is None:
            return _GeneralIterator(factory)

        def adapted_factory():
            for x in factory():
                yield adapter(x)

        return _GeneralIterator(adapted_factory)


def grain_from_source(
    data: Any,
    *,
    adapter: Callable[[Any], Any] | None = None,
    preprocess_fn: Optional[Callable] = None,
    dict_mode: str = "items",
    read_opts: grain.ReadOptions | None = None,
    batch_size: int | None = None,
    seed: int = 42,
):
    is_map = False

    if isinstance(data, Dict):
        data = datasets.Dataset.from_dict(data)

    if isinstance(data, Mapping):
        source = GeneralRandomAccessSource(
            data,
            adapter=adapter,
            dict_mode=dict_mode,
        )
        pipeline = grain.MapDataset.source(source)
        is_map = True

    elif _is_random_access_dataset(data) and not _is_hf_iterable_dataset(data):
        source = GeneralRandomAccessSource(data, adapter=adapter)
        pipeline = grain.MapDataset.source(source)
        is_map = True

    elif isinstance(data, Iterable) or _is_hf_iterable_dataset(data):
        pipeline = GeneralIterDataset(data, adapter=adapter)

    else:
        raise TypeError(
            "Unsupported data type. Expected mapping, random-access dataset, or iterable."
        )

    if is_map:
        pipeline = pipeline.shuffle(seed=seed)
        pipeline = (
            pipeline.to_iter_dataset(read_opts)
            if read_opts is not None
            else pipeline.to_iter_dataset()
        )
    if batch_size is not None:
        pipeline = pipeline.batch(batch_size)

    return pipeline


# ---- The port's use ----
import types

import numpy as np

from tests.porting import plain


def plain_eq(a, b):
    return plain(a) == plain(b)
''' + porting.RESTORE_AT_EVERY_STEP + r'''

def gen():
    for i in range(7):
        yield {"tokens": np.arange(i % 3 + 2), "id": i}


makers = {
    "list": lambda: grain_from_source([np.full(2, i) for i in range(10)], seed=3, batch_size=3),
    "hf_dict": lambda: grain_from_source({"text": [f"t{i}" for i in range(6)], "label": list(range(6))},
                                         adapter=lambda r: {"label": r["label"] * 10}, batch_size=4,
                                         read_opts=grain.ReadOptions(num_threads=2, prefetch_buffer_size=3)),
    "mapping_values": lambda: grain_from_source(types.MappingProxyType({"a": 1, "b": 2, "c": 3, "d": 4}),
                                                dict_mode="values", seed=9),
    "mapping_items": lambda: grain_from_source(types.MappingProxyType({"a": 1, "b": 2, "c": 3}), seed=1),
    "generator": lambda: GeneralIterDataset(gen, adapter=lambda r: {**r, "n": len(r["tokens"])}),
    "generator_object": lambda: grain_from_source(gen()),
    "iterator": lambda: grain_from_source(iter(range(5)), batch_size=2),
}
results = {}
for name, make in makers.items():
    reference, pairs = restore_at_every_step(make)
    results[name] = {"elements": plain(reference), "pairs": pairs, "state_2": None}
    it = iter(make())
    next(it)
    next(it) if len(reference) > 1 else None
    results[name]["state_2"] = it.get_state()

errors = {}
for name, call in {
    "dict_mode": lambda: grain_from_source(types.MappingProxyType({"a": 1}), dict_mode="rows"),
    "type": lambda: grain_from_source(5),
    "factory": lambda: grain_from_source(gen),  # a callable is no Iterable: only GeneralIterDataset takes one
}.items():
    try:
        call()
    except Exception as e:  # pylint: disable=broad-except
        errors[name] = f"{type(e).__name__}: {e}"
results["errors"] = errors

it = iter(GeneralIterDataset(gen))
first = next(it)
it.close()
try:
    next(it)
except Exception as e:  # pylint: disable=broad-except
    results["after_close"] = f"{type(e).__name__}: {e}"
results["repr"] = repr(GeneralRandomAccessSource([1, 2, 3]))
'''


class _HFDataset:  # datasets.Dataset.from_dict's rows, for the client's `Dict` branch
  def __init__(self, columns):
    self._columns = columns

  @classmethod
  def from_dict(cls, mapping):
    return cls(dict(mapping))

  def __len__(self):
    return len(next(iter(self._columns.values())))

  def __getitem__(self, i):
    return {k: v[i] for k, v in self._columns.items()}


_HFDataset.__name__ = _HFDataset.__qualname__ = "Dataset"
_HFDataset.__module__ = "datasets"


def test_general_source_adapters_custom_iterator_and_shuffled_sources_as_on_grain(monkeypatch):
  """A general source adapter module (index: no repository named): `grain_from_source` over lists, a Hugging Face dict, mappings, a generator factory and an iterator, each restored at every step."""
  import types  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(__import__("sys").modules, "datasets", types.SimpleNamespace(Dataset=_HFDataset))
  g, l = (porting.grain_keys(porting.run(GENERAL_SOURCES, lib).results) for lib in porting.LIBS)
  assert l == g
  for name in ("list", "hf_dict", "mapping_values", "mapping_items", "generator", "generator_object", "iterator"):
    assert all(all(p) for p in g[name]["pairs"]), name
  assert sorted(x for b in g["list"]["elements"] for x in b[:: 1]) != []
  assert len(g["list"]["elements"]) == 4 and g["hf_dict"]["elements"][0]["label"] != [0, 10, 20, 30]
  assert sorted(g["mapping_values"]["elements"]) == [1, 2, 3, 4]
  assert g["generator"]["state_2"] == {"index": 2} and g["generator"]["elements"][2]["n"] == 4
  assert g["iterator"]["elements"] == [[0, 1], [2, 3], [4]]
  assert g["errors"] == {"dict_mode": "ValueError: dict_mode must be one of {'items', 'values', 'keys'}",
                         "type": "TypeError: Unsupported data type. Expected mapping, random-access dataset, or iterable.",
                         "factory": "TypeError: Unsupported data type. Expected mapping, random-access dataset, or iterable."}
  assert g["after_close"] == "ValueError: Iterator is closed."
  assert g["repr"] == "GeneralRandomAccessSource(len=3)"


# A token-window data loader (the index names no repository):
# `ToTrainingExamples` (a `FlatMapTransform` with a class-level `max_fan_out`
# of a million, yielding windows from a generator) and `get_data_loader` (a
# `DataLoader` over `grain.ArrayRecordDataSource(glob.glob(...))`, a shuffled
# `IndexSampler` over *one* record for two epochs, the flat map and a
# `grain.Batch` as operations, one worker) as written; run as a script.
TOKEN_WINDOWS = r'''
import grain.python as grain
import glob

import numpy as np


class ToTrainingExamples(grain.experimental.FlatMapTransform):
    max_fan_out = 1_000_000

    def __init__(self, context_length):
        self.context_length = context_length

    def flat_map(self, elem):
        tokens = np.frombuffer(elem, dtype=np.uint16)
        for i in range(0, len(tokens) - self.context_length):
            inputs = tokens[i : i + self.context_length]
            targets = tokens[i + 1 : i + self.context_length + 1]
            yield (inputs, targets)


def get_data_loader(dataset_path, sequence_length: int = 1024, batch_size: int = 1):
    index_sampler = grain.IndexSampler(
        num_records=1,
        num_epochs=2,
        shard_options=grain.ShardOptions(shard_index=0, shard_count=1, drop_remainder=True),
        shuffle=True,
        seed=0,
    )

    data_loader = grain.DataLoader(
        data_source=grain.ArrayRecordDataSource(glob.glob(dataset_path)),
        operations=[
            ToTrainingExamples(sequence_length),
            grain.Batch(batch_size=batch_size, drop_remainder=True),
        ],
        sampler=index_sampler,
        worker_count=1,
    )
    return data_loader


if __name__ == "__main__":
    import json
    import sys

    import absl.flags
    absl.flags.FLAGS.mark_as_parsed()
    pattern = sys.argv[1]
    results = {}
    loader = get_data_loader(pattern, sequence_length=4, batch_size=3)
    it = iter(loader)
    batches, states = [], []
    while True:
        states.append(it.get_state())
        try:
            x, y = next(it)
        except StopIteration:
            break
        batches.append([x.tolist(), y.tolist(), str(x.dtype)])
    results["batches"] = batches
    resumed = []
    for k in (1, len(batches) // 2, len(batches) - 1):
        again = iter(get_data_loader(pattern, sequence_length=4, batch_size=3))
        again.set_state(states[k])
        resumed.append([[x.tolist(), y.tolist(), str(x.dtype)] for x, y in again] == batches[k:])
    results["resumed"] = resumed
    results["windows"] = [[a.tolist(), b.tolist()] for a, b in ToTrainingExamples(3).flat_map(np.arange(6, dtype=np.uint16).tobytes())]
    print(json.dumps(results))
'''


def test_token_window_flat_map_data_loader_over_array_record_as_on_grain(tmp_path):
  """A token-window data loader (index: no repository named): `get_data_loader`'s `DataLoader` with a generator `FlatMapTransform` operation over an ArrayRecord file, one worker, as a script."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  w = ArrayRecordWriter(str(tmp_path / "tokens.array_record"), "group_size:1")
  w.write(np.arange(100, 111, dtype=np.uint16).tobytes())  # 11 tokens: 7 windows of 4 per epoch
  w.close()
  pattern = str(tmp_path / "*.array_record")
  g = porting.run_script(TOKEN_WINDOWS, "grain", tmp_path, pattern)
  l = porting.run_script(TOKEN_WINDOWS, "loader", tmp_path, pattern)
  assert l == g
  assert g["windows"] == [[[0, 1, 2], [1, 2, 3]], [[1, 2, 3], [2, 3, 4]], [[2, 3, 4], [3, 4, 5]]]
  assert g["resumed"] == [True] * 3
  assert len(g["batches"]) == 4 and g["batches"][0][2] == "uint16"  # 14 windows over two epochs, batches of 3
  assert g["batches"][0][0][0] == [100, 101, 102, 103] and g["batches"][0][1][0] == [101, 102, 103, 104]


# jax_gpt: jax_gpt/data/pipeline.py (the index's copy names no repository):
# `_MemMapSource` (no Grain base class), `DataPipeline` (a `DataLoader`
# with a `SequentialSampler` over `ShardOptions(jax.process_index(), ...)`,
# no operations, `ReadOptions(prefetch_buffer_size=128)`, `get_batch`
# stacking single records, `skip_to_step`) and its 'gcs' branch importing
# `ArrayRecordDataSource` from `grain.experimental`, as written.
JAX_GPT = r'''
import os

import grain.python as grain
import jax
import numpy as np


def _local_path(config, split: str) -> str:
    return os.path.join(config.local_data_path, f"{split}.bin")


def _gcs_path(config, split: str) -> str:
    return f"gs://{config.gcs_bucket}/{config.gcs_dataset_path}/{split}"


class _MemMapSource:
    """grain DataSource wrapping a flat numpy memmap of uint16 tokens."""

    def __init__(self, path: str, seq_len: int):
        data = np.memmap(path, dtype=np.uint16, mode='r')
        # Number of complete windows of (seq_len + 1) tokens
        self._windows = (len(data) - 1) // seq_len
        self._data = data
        self._seq_len = seq_len

    def __len__(self) -> int:
        return self._windows

    def __getitem__(self, idx: int) -> np.ndarray:
        start = idx * self._seq_len
        return self._data[start : start + self._seq_len + 1].astype(np.int32)


class DataPipeline:
    def __init__(
        self,
        config,
        split: str = 'train',
        *,
        _shard_index: int | None = None,
        _shard_count: int | None = None,
    ):
        self._batch_size = config.micro_batch_size
        self._seq_len = config.seq_len

        if config.data_source == 'local':
            path = _local_path(config, split)
            source: grain.RandomAccessDataSource = _MemMapSource(path, config.seq_len)
        elif config.data_source == 'gcs':
            from grain.experimental import ArrayRecordDataSource  # type: ignore
            path = _gcs_path(config, split)
            source = ArrayRecordDataSource(path)
        else:
            raise ValueError(
                f"Unknown data_source '{config.data_source}'. "
                "Expected 'local' or 'gcs'."
            )

        shard_index = _shard_index if _shard_index is not None else jax.process_index()
        shard_count = _shard_count if _shard_count is not None else jax.process_count()

        shard_options = grain.ShardOptions(
            shard_index=shard_index,
            shard_count=shard_count,
        )

        self._loader = grain.DataLoader(
            data_source=source,
            sampler=grain.SequentialSampler(
                num_records=len(source),
                shard_options=shard_options,
            ),
            worker_count=config.num_workers,
            read_options=grain.ReadOptions(prefetch_buffer_size=128),
        )
        self._iter = iter(self._loader)

    def get_batch(self) -> tuple[np.ndarray, np.ndarray]:
        sequences = [next(self._iter) for _ in range(self._batch_size)]
        batch = np.stack(sequences)   # (micro_batch_size, seq_len + 1)
        x = batch[:, :-1]            # (micro_batch_size, seq_len)
        y = batch[:, 1:]             # (micro_batch_size, seq_len)
        return x, y

    def skip_to_step(self, step: int, grad_accum_steps: int) -> None:
        n_to_skip = step * grad_accum_steps * self._batch_size
        for _ in range(n_to_skip):
            next(self._iter)


# ---- The port's use ----
import json
import types


def cfg(**kw):
    return types.SimpleNamespace(**{"data_source": "local", "local_data_path": data_dir, "num_workers": 0,
                                    "micro_batch_size": 2, "seq_len": 4, "gcs_bucket": "b", "gcs_dataset_path": "d",
                                    **kw})


def drain(pipe):
    out = []
    while True:
        try:
            x, y = pipe.get_batch()
        except StopIteration:
            return out
        out.append([x.tolist(), y.tolist(), str(x.dtype)])


results = {}
for index, count in ((None, None), (0, 2), (1, 2), (2, 3)):
    results[f"shard_{index}_{count}"] = drain(DataPipeline(cfg(), _shard_index=index, _shard_count=count))
skipped = DataPipeline(cfg())
skipped.skip_to_step(2, grad_accum_steps=1)
results["skipped"] = drain(skipped)
results["val"] = drain(DataPipeline(cfg(micro_batch_size=1), "val"))

pipe = DataPipeline(cfg(), _shard_index=1, _shard_count=2)
pipe.get_batch()
state = pipe._iter.get_state()
results["state"] = json.loads(state)
rest = drain(pipe)
fresh = DataPipeline(cfg(), _shard_index=1, _shard_count=2)
try:
    fresh._iter.set_state(state)
    results["resumed"] = drain(fresh) == rest
except ValueError as e:
    results["resumed"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
pipe._iter = iter(pipe._loader)  # a new iterator of the same loader: Grain's repr check passes
pipe._iter.set_state(state)
results["same_source_resumed"] = drain(pipe) == rest

errors = {}
for name, kw in {"gcs": {"data_source": "gcs"}, "unknown": {"data_source": "hdf5"}}.items():
    try:
        DataPipeline(cfg(**kw))
    except Exception as e:  # pylint: disable=broad-except
        errors[name] = [type(e).__name__, (getattr(e, "name", None) or "").rpartition(".")[2], str(e) if isinstance(e, ValueError) else None]
results["errors"] = errors
'''


def test_jax_gpt_memmap_data_pipeline_shards_skip_and_resume_as_on_grain(tmp_path):
  """jax_gpt (index: a copy of jax_gpt/data/pipeline.py naming no repository): `DataPipeline` over `_MemMapSource` shards, `skip_to_step`, a resume, and the 'gcs' branch's import."""
  np.arange(1000, 1041, dtype=np.uint16).tofile(tmp_path / "train.bin")  # 41 tokens: 10 windows of 4
  np.arange(7, dtype=np.uint16).tofile(tmp_path / "val.bin")
  g, l = (porting.grain_keys(porting.run(JAX_GPT, lib, data_dir=str(tmp_path)).results) for lib in porting.LIBS)
  # Documented difference (README, `DataLoader`): a source with the default
  # repr (its address) is matched without the address, so a new pipeline
  # resumes on loader; Grain refuses its own checkpoint there.
  assert g.pop("resumed") == "ValueError: DataSource in checkpoint does not match datasource in dataloader."
  assert l.pop("resumed") is True
  assert l == g
  assert len(g["shard_None_None"]) == 5 and g["shard_None_None"][0][0][0] == [1000, 1001, 1002, 1003]
  assert g["shard_None_None"][0][1][1] == [1005, 1006, 1007, 1008] and g["shard_None_None"][0][2] == "int32"
  assert [len(g[f"shard_{i}_2"]) for i in (0, 1)] == [2, 2]  # five windows each: the last record left unbatched
  assert g["skipped"] == g["shard_None_None"][2:]
  assert g["val"] == [[[[0, 1, 2, 3]], [[1, 2, 3, 4]], "int32"]]
  assert g["state"]["last_seen_indices"] == {"0": 3} and g["same_source_resumed"] is True
  assert g["errors"] == {"gcs": ["ImportError", "experimental", None],
                         "unknown": ["ValueError", "", "Unknown data_source 'hdf5'. Expected 'local' or 'gcs'."]}


# egxc: egxc/dataloading/grain.py (the index names no repository; module
# path from its imports): `GrainDataLoaderWrapper` (name-mangled class-level
# iterator and counter, one iterator kept across epochs), `DataLoaders`,
# `get_sample_for_model_init` (a `SequentialSampler(1, ...)` positional,
# `worker_count=0`, `next(iter(dataloader))[0]`) and `get_dataloaders`
# (an `IndexSampler` with no `num_epochs`: endless; `worker_count=workers`,
# which may be None) as written. `PreloadSystem`, `BaseDataset` and
# `DatasetEnsemble` are stand-ins.
EGXC = r'''
from dataclasses import dataclass
import grain.python as grain

from typing import NamedTuple, Sequence

import numpy as np


class PreloadSystem(NamedTuple):  # stand-in: egxc.systems.PreloadSystem's leading fields
    positions: np.ndarray
    charges: np.ndarray


class BaseDataset(grain.RandomAccessDataSource):  # stand-in: egxc.dataloading.base.BaseDataset
    def __init__(self, n, offset):
        self._n, self._offset = n, offset

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        return {"positions": np.full((2, 3), self._offset + i, np.float32), "charges": np.array([1, self._offset + i])}


class DatasetEnsemble(NamedTuple):  # stand-in: egxc.dataloading.base.DatasetEnsemble
    train: BaseDataset
    val: BaseDataset
    test: BaseDataset


class ToPreload(grain.MapTransform):
    def map(self, element):
        return PreloadSystem(element["positions"], element["charges"])


class GrainDataLoaderWrapper:
    """
    Wrapper around a grain DataLoader to provide a length property, such that the iteration
    stops after the specified number of samples, but the worker processes continue to run
    until the dataloader has been run over the specified number of total epochs.
    """

    __iterator = None
    __counter = 0

    def __init__(self, dataloader: grain.DataLoader, length: int):
        self.__dataloader = dataloader
        self.__length = length

    def __iter__(self):
        if self.__iterator is None:
            # only initialize the iterator once
            self.__iterator = iter(self.__dataloader)
        return self

    def __len__(self):
        return self.__length

    def __next__(self):
        self.__counter += 1
        if self.__counter > self.__length:
            self.__counter = 0
            raise StopIteration
        return next(self.__iterator)  # type: ignore


@dataclass
class DataLoaders:
    train: GrainDataLoaderWrapper
    val: GrainDataLoaderWrapper
    test: GrainDataLoaderWrapper


def get_sample_for_model_init(
    dataset: BaseDataset, preload_transform: Sequence[grain.Transformation]
) -> PreloadSystem:
    sampler = grain.SequentialSampler(1, shard_options=grain.NoSharding())
    dataloader = grain.DataLoader(
        data_source=dataset,
        operations=preload_transform,
        sampler=sampler,
        worker_count=0,
    )
    return next(iter(dataloader))[0]


def get_dataloaders(
    datasets: DatasetEnsemble,
    transformations: Sequence[grain.Transformation],
    shuffle: bool,
    workers: int | None,
    random_seed: int,
) -> DataLoaders:
    def get_dataloader(dataset: BaseDataset) -> GrainDataLoaderWrapper:
        length = len(dataset)
        sampler = grain.IndexSampler(
            num_records=length,
            shard_options=grain.NoSharding(),
            shuffle=shuffle,
            seed=random_seed,
        )

        dataloader = grain.DataLoader(
            data_source=dataset,
            operations=transformations,
            sampler=sampler,
            worker_count=workers,
        )
        return GrainDataLoaderWrapper(dataloader, length)

    out = DataLoaders(
        get_dataloader(datasets.train),
        get_dataloader(datasets.val),
        get_dataloader(datasets.test),
    )
    return out


# ---- The port's use ----
from tests.porting import plain

ensemble = DatasetEnsemble(BaseDataset(5, 0), BaseDataset(3, 100), BaseDataset(2, 200))
transformations = [ToPreload(), grain.Batch(batch_size=2)]
results = {"init_sample": plain(get_sample_for_model_init(ensemble.train, transformations)),
           "init_sample_unbatched": plain(get_sample_for_model_init(ensemble.val, [ToPreload()]))}
for workers in (0,):  # None: Grain starts worker processes (run in-process here, they cannot unpickle the snippet)
    for shuffle in (True, False):
        loaders = get_dataloaders(ensemble, transformations, shuffle=shuffle, workers=workers, random_seed=3)
        results[f"{workers}_{shuffle}"] = {
            "train": [[plain(b) for b in loaders.train] for _ in range(3)],
            "val": [[plain(b) for b in loaders.val] for _ in range(2)],
            "test": [plain(b) for b in loaders.test],
            "lens": [len(loaders.train), len(loaders.val), len(loaders.test)],
            "type": type(next(iter(loaders.test))).__name__,
        }
'''


def test_egxc_data_loader_wrapper_endless_index_sampler_epochs_as_on_grain():
  """egxc (index: egxc/dataloading/grain.py, no repository named): `get_sample_for_model_init` and `get_dataloaders`' wrapped endless loaders, three epochs each, in process."""
  g, l = (porting.grain_keys(porting.run(EGXC, lib).results) for lib in porting.LIBS)
  assert l == g
  assert g["init_sample"] == [[[0.0] * 3] * 2]  # the positions of a batch of one record
  assert g["init_sample_unbatched"] == [[100.0] * 3] * 2
  r = g["0_True"]
  assert r["lens"] == [5, 3, 2] and r["type"] == "PreloadSystem"
  assert [len(e) for e in r["train"]] == [5, 5, 5] and r["train"][0] != r["train"][1]
  assert g["0_False"]["val"][0][0][1] == [[1, 100], [1, 101]]
