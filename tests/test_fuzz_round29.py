"""Differential fuzz round 29 against Grain 0.2.18: the legacy DataLoader, seeded MapDataset chains, mixes,
interleaves, batch_and_pad and packing.

What rounds 27 and 28 leave out and this round generates, each pipeline built from one description for
`grain` and for `loader`:

- the legacy `DataLoader` API: an `IndexSampler` (shuffle, `num_epochs`, `shard_options`, seed) over a
  data source, `operations` lists of `grain.python`'s `MapTransform` / `RandomMapTransform` /
  `FilterTransform` and `grain.transforms`' `Map` / `RandomMap` / `Filter` / `Batch`, `read_options`,
  `worker_count=0`;
- `MapDataset` chains of `slice` / `repeat` (also infinite) / `shuffle` / `random_map` / `seed`, seeded and
  unseeded after a `seed()`, with `len`, `ds[i]` at negative and past-the-end indices and
  `grain.experimental.get_element_spec`;
- `MapDataset.mix` and `IterDataset.mix` (list and dict datasets) with weights, `InterleaveIterDataset`
  with `cycle_length` and buffer sizes over map and iter datasets;
- `grain.experimental.batch_and_pad` with `pad_value`, on both levels;
- `FirstFitPackIterDataset`, `BestFitPackIterDataset`, `ConcatThenSplitIterDataset` and the DataLoader's
  `PackAndBatchOperation`.

Each is compared on: the phase of an error (build / len / getitem / iter / next) and that loader's
exception is an instance of Grain's exception type; the element stream (values, container types, numpy
dtypes and shapes); a state taken before every element restored on a fresh iterator of a newly built
pipeline (each library on its own states) and on the used iterator; Grain's states restored on loader
(refusal with `StateMismatchError` allowed, README "Checkpoint states").

Grain runs under a `signal.alarm` timeout: a Grain hang makes the case "not comparable", not a hang of the
test. Documented differences (README) are not generated or not compared: maps returning `None`,
`StopIteration` from user code, bytes leaves in batches, negative seeds, Grain's IndexErrors after a failed
element, an empty DataLoader shard under a `drop_remainder` batch, Grain's `PackAndBatchOperation` crash when
restored after its last record, an error under `IterDataset.mix` (loader's mix.py docstring). Where Grain's
own restores do not go on as its run (`PackAndBatchOperation`), loader's restores must give what Grain's give.

The regression tests at the end are the differences this round found, minimized. Fixed: `get_element_spec`
of a custom `batch_fn` over a map (Grain: the map's ValueError first; loader checked the `batch_fn` first),
`IterDataset.mix` with dict weights of other keys (Grain: AssertionError for another count, else sorted-key
pairing; loader refused both with a plain ValueError). Documented in README ("Mixing weights") and asserted
as documented: negative mix weights, which Grain builds and mixes by accident of its arithmetic and loader
refuses, and an error under `IterDataset.mix`, after which Grain's mixture stops and loader's goes on.
"""

from __future__ import annotations

import functools
import gc
import importlib
import random
import time

import numpy as np
import pytest

grain = pytest.importorskip("grain")
import grain.experimental  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import grain.python  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import loader  # pylint: disable=g-import-not-at-top,wrong-import-position
import loader.python  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import fuzz_elements
from fuzz_elements import (Hang, adder as _adder, canon, deadline, element_hash as _hash,  # pylint: disable=unused-import
                           failer as _failer, keeper as _keeper, leafmap as _leafmap, quiet as _quiet,
                           random_add as _random_add)
from fuzz_elements import observe_both, observe_iteration
from fuzz_elements import (attempt as _attempt, is_error as _is_error, same_outcome as _same_outcome,
                           same_stream as _same_stream)

SEED = 2029
CAP = 24  # Elements compared per stream.
RES = 4  # Elements compared after a restore.
GRAIN_TIMEOUT_S = 20
N_CASES = {"sampler": 150, "dataloader": 40, "mapchain": 80, "mix": 40, "interleave": 40, "pad": 40, "pack": 80}


# ---------------------------------------------------------------------------
# Elements and element functions (pure, deterministic, shared by both libraries).


def make_element(kind, i):
  if kind == "int":
    return i
  if kind == "npi":
    return np.int32(i)
  if kind == "arr":
    return np.arange(i % 4 + 1, dtype=np.int64) + i
  if kind == "dict":
    return {"x": np.array([i, 2 * i], np.int32), "y": np.float32(i) / 2}
  if kind == "tuple":
    return (i, np.full((i % 3 + 1,), i, np.float32))
  if kind == "vardict":  # Variable-length arrays (for batch_and_pad only with equal shapes).
    return {"a": np.full((2,), i, np.int32), "b": np.int64(i)}
  raise ValueError(kind)


KINDS = ["int", "int", "npi", "arr", "dict", "tuple", "vardict"]
FIXED_KINDS = ["int", "npi", "dict", "vardict"]  # Batchable (equal shapes).


class ListSource(fuzz_elements.ListSource):
  make = staticmethod(make_element)


# ---------------------------------------------------------------------------
# Pipeline descriptions, built for either library.


def _map_transform(lib, k, legacy):
  base = importlib.import_module(lib.__name__ + ".python").MapTransform if legacy else lib.transforms.Map

  class AddK(base):

    def map(self, x):
      return _adder(k)(x)

  return AddK()


def _random_transform(lib, legacy):
  base = importlib.import_module(lib.__name__ + ".python").RandomMapTransform if legacy else lib.transforms.RandomMap

  class RandAdd(base):

    def random_map(self, x, rng):
      return _random_add(x, rng)

  return RandAdd()


def _filter_transform(lib, m, r, legacy):
  base = importlib.import_module(lib.__name__ + ".python").FilterTransform if legacy else lib.transforms.Filter

  class Keep(base):

    def filter(self, x):
      return _keeper(m, r)(x)

  return Keep()


def _fail_transform(lib, m):
  class Fail(lib.transforms.Map):

    def map(self, x):
      return _failer(m)(x)

  return Fail()


def _apply(lib, ds, op):
  name, a = op[0], op[1:]
  ex = lib.experimental
  if name == "shuffle":
    return ds.shuffle(a[0]) if a[0] is not None else ds.shuffle()
  if name == "seed":
    return ds.seed(a[0])
  if name == "slice":
    return ds.slice(slice(*a)) if a[3:] else ds[slice(*a[:3])]
  if name == "repeat":
    return ds.repeat(a[0])
  if name == "map":
    return ds.map(_adder(a[0]))
  if name == "filter":
    return ds.filter(_keeper(a[0], a[1]))
  if name == "fail":
    return ds.map(_failer(a[0]))
  if name == "rmap":
    return ds.random_map(_random_add, seed=a[0]) if a[0] is not None else ds.random_map(_random_add)
  if name == "batch":
    pad_size = a[0] if a[2] is True else a[2]  # An int: batch_and_pad told another batch size.
    fn = functools.partial(ex.batch_and_pad, batch_size=pad_size, pad_value=a[3]) if a[2] is not False else None
    return ds.batch(a[0], drop_remainder=a[1], batch_fn=fn)
  if name == "to_iter":
    if a[0] is None:
      return ds.to_iter_dataset()
    return ds.to_iter_dataset(lib.ReadOptions(num_threads=a[0], prefetch_buffer_size=a[1]))
  if name == "limit":
    return ex.LimitIterDataset(ds, a[0])
  if name in ("ffpack", "bfpack"):
    cls = ex.FirstFitPackIterDataset if name == "ffpack" else ex.BestFitPackIterDataset
    length_struct, bins, seed, shuffle_bins, max_seqs, meta, pad = a
    kw = {}
    if max_seqs is not None:
      kw["max_sequences_per_bin"] = max_seqs
    if meta:
      kw["meta_features"] = meta
    if pad is not None:
      kw["padding_struct"] = dict(pad)
    return cls(ds, length_struct=dict(length_struct), num_packing_bins=bins, seed=seed, shuffle_bins=shuffle_bins, **kw)
  if name == "cts":
    length_struct, split_full = a
    return ex.ConcatThenSplitIterDataset(ds, length_struct=dict(length_struct), split_full_length_features=split_full)
  raise ValueError(op)


def build(lib, spec):
  kind = spec[0]
  if kind == "src":
    if spec[1] == "range":
      return lib.MapDataset.range(*spec[2])
    return lib.MapDataset.source([make_element(spec[1], i) for i in range(spec[2])])
  if kind == "seqs":  # Token sequences for packing.
    n, seed, max_len, features = spec[1:]
    rng = np.random.default_rng(seed)
    els = []
    for i in range(n):
      length = int(rng.integers(1, max_len + 1))
      els.append({f: np.arange(length, dtype=np.int32) + 100 * i + 10 * j for j, f in enumerate(features)})
    return lib.MapDataset.source(els)
  if kind == "chain":
    ds = build(lib, spec[1])
    for op in spec[2]:
      ds = _apply(lib, ds, op)
    return ds
  if kind == "mix":
    kids = [build(lib, c) for c in spec[1]]
    return lib.MapDataset.mix(kids, spec[2]) if spec[2] is not None else lib.MapDataset.mix(kids)
  if kind == "imix":
    kids = [build(lib, c) for c in spec[1]]
    weights = spec[2]
    if spec[3]:  # Dict of datasets (and weights).
      kids = {f"d{i}": k for i, k in enumerate(kids)}
      if weights is not None:
        weights = {f"d{i}": w for i, w in enumerate(weights)}
    return lib.IterDataset.mix(kids, weights) if weights is not None else lib.IterDataset.mix(kids)
  if kind == "interleave":
    kids = [build(lib, c) for c in spec[1]]
    return lib.experimental.InterleaveIterDataset(kids, cycle_length=spec[2], **dict(spec[3]))
  if kind == "dataloader":
    return build_data_loader(lib, spec[1])
  raise ValueError(spec)


def build_data_loader(lib, d):
  if d["source"][0] == "range":
    source = lib.sources.RangeDataSource(*d["source"][1])
  else:
    source = ListSource(*d["source"][1])
  shard = lib.sharding.NoSharding() if d["shard"] is None else lib.sharding.ShardOptions(*d["shard"])
  sampler = lib.samplers.IndexSampler(num_records=len(source) + d["records_delta"], shard_options=shard,
                                      shuffle=d["shuffle"], num_epochs=d["epochs"], seed=d["seed"])
  ops = []
  for op in d["ops"]:
    if op[0] == "map":
      ops.append(_map_transform(lib, op[1], op[2]))
    elif op[0] == "rmap":
      ops.append(_random_transform(lib, op[1]))
    elif op[0] == "filter":
      ops.append(_filter_transform(lib, op[1], op[2], op[3]))
    elif op[0] == "fail":
      ops.append(_fail_transform(lib, op[1]))
    elif op[0] == "batch":
      ops.append(lib.transforms.Batch(batch_size=op[1], drop_remainder=op[2]))
    elif op[0] == "packbatch":
      ops.append(lib.experimental.PackAndBatchOperation(length_struct=dict(op[1]), batch_size=op[2]))
  kw = {}
  if d["read"] is not None:
    kw["read_options"] = lib.ReadOptions(num_threads=d["read"][0], prefetch_buffer_size=d["read"][1])
  return lib.DataLoader(data_source=source, sampler=sampler, operations=ops, worker_count=0, **kw)


# ---------------------------------------------------------------------------
# Random descriptions, one generator per family.


def _seed_or_none(rng, seeded):
  return None if seeded and rng.random() < .5 else rng.randrange(2**32)


def _map_chain_ops(rng, k, allow_batch=False):
  ops, seeded = [], False
  for _ in range(k):
    c = rng.choices(["shuffle", "seed", "slice", "repeat", "rmap", "map", "filter", "batch", "fail"],
                    [3, 2, 3, 3, 3, 1, 1, 2 if allow_batch else 0, 1])[0]
    if c == "shuffle":
      ops.append(("shuffle", _seed_or_none(rng, seeded)))
    elif c == "seed":
      ops.append(("seed", rng.randrange(2**32)))
      seeded = True
    elif c == "slice":
      pick = lambda: rng.choice([None, None, 0, 1, 2, 3, -1, -2, -4, 30, -30])
      ops.append(("slice", pick(), pick(), rng.choice([None, None, 1, 2, 3, -1, -2, 0])) + ((True,) if rng.random() < .5
                                                                                            else ()))
    elif c == "repeat":
      ops.append(("repeat", rng.choice([1, 2, 3, None, 1, 2, 3, None, 0, -1])))
    elif c == "rmap":
      ops.append(("rmap", _seed_or_none(rng, seeded)))
    elif c == "map":
      ops.append(("map", rng.randint(1, 5)))
    elif c == "filter":
      ops.append(("filter", rng.choice([2, 3]), rng.randint(0, 1)))
    elif c == "fail":
      ops.append(("fail", rng.choice([3, 5, 7])))
    else:
      ops.append(("batch", rng.randint(1, 3), rng.random() < .4, False, 0))
  return ops


def _src(rng, kind, sizes=(0, 1, 2, 3, 5, 7, 10)):
  n = rng.choice(sizes)
  if kind == "int" and rng.random() < .5:
    return ("src", "range", rng.choice([(n,), (1, n + 1), (0, 2 * n, 2)]))
  return ("src", kind, n)


def gen_mapchain(rng):
  kind = rng.choice(KINDS)
  spec = ("chain", _src(rng, kind), _map_chain_ops(rng, rng.randint(1, 5), allow_batch=kind in FIXED_KINDS))
  if rng.random() < .3:
    spec = ("chain", spec, [("to_iter", None)])
  return spec


def gen_mix(rng):
  kind = rng.choice(FIXED_KINDS)
  k = rng.randint(1, 3)
  weights = [rng.choice([1, 2, 0.5, 3] * 4 + [0, -1]) for _ in range(k)] if rng.random() < .7 else None
  if weights is not None and rng.random() < .1:
    weights = weights + [1]  # One weight too many.
  if rng.random() < .5:
    kids = [("chain", _src(rng, kind, (1, 2, 3, 5, 8)), _map_chain_ops(rng, rng.randint(0, 2))) for _ in range(k)]
    spec = ("mix", kids, weights)
    return ("chain", spec, _map_chain_ops(rng, rng.randint(0, 2)) + ([("to_iter", None)] if rng.random() < .3 else []))
  kids = []
  for _ in range(k):
    ops = _map_chain_ops(rng, rng.randint(0, 2))
    if rng.random() < .4:
      ops.append(("repeat", None))
    kids.append(("chain", ("chain", _src(rng, kind, (0, 1, 2, 3, 5, 8)), ops), [("to_iter", None)]))
  spec = ("imix", kids, weights, rng.random() < .4)
  tail = []
  if rng.random() < .4:
    tail.append(("batch", rng.randint(1, 3), rng.random() < .4, False, 0))
  if rng.random() < .3:
    tail.append(("limit", rng.randint(1, 15)))
  return ("chain", spec, tail)


def gen_interleave(rng):
  kind = rng.choice(KINDS)
  kids = []
  for _ in range(rng.randint(1, 4)):
    base = ("chain", _src(rng, kind, (0, 1, 2, 3, 5)), _map_chain_ops(rng, rng.randint(0, 2)))
    kids.append(("chain", base, [("to_iter", None)]) if rng.random() < .6 else base)
  extra = []
  if rng.random() < .4:
    extra.append(("iter_buffer_size", rng.choice([1, 2, 4])))
  if rng.random() < .3:
    extra.append(("make_iter_buffer_size", rng.choice([1, 2])))
  spec = ("interleave", kids, rng.randint(1, 4), tuple(extra))
  tail = []
  if kind in FIXED_KINDS and rng.random() < .3:
    tail.append(("batch", rng.randint(1, 3), rng.random() < .4, False, 0))
  if rng.random() < .2:
    tail.append(("limit", rng.randint(1, 10)))
  return ("chain", spec, tail)


def gen_pad(rng):
  kind = rng.choice(["int", "npi", "dict", "vardict", "tuple", "arr"])
  bs = rng.randint(1, 4)
  batch = ("batch", bs, rng.random() < .3, rng.choice([True] * 5 + [bs - 1, bs + 1]), rng.choice([0, -1, 7]))
  pre = _map_chain_ops(rng, rng.randint(0, 2))
  if kind in ("tuple", "arr"):  # Unequal shapes: batch size 1 only (batch_and_pad stacks).
    batch = ("batch", 1) + batch[2:]
  if rng.random() < .5:
    return ("chain", _src(rng, kind, (0, 1, 2, 3, 5, 7)), pre + [batch])
  return ("chain", ("chain", _src(rng, kind, (0, 1, 2, 3, 5, 7)), pre), [("to_iter", None), batch])


def gen_pack(rng):
  features = rng.choice([("inputs",), ("inputs", "targets")])
  max_len = rng.randint(1, 8)
  src = ("seqs", rng.choice([0, 1, 3, 6, 12]), rng.randrange(1000), max_len, features)
  length = tuple((f, rng.randint(max_len, max_len + 6)) for f in features)
  pre = [("to_iter", None)]
  if rng.random() < .3:
    pre = [("shuffle", rng.randrange(2**32)), ("to_iter", None)]
  c = rng.choice(["ffpack", "bfpack", "cts", "dl"])
  if c == "dl":
    d = dict(source=("list", ("int", 1)), shard=None, records_delta=0, shuffle=False, epochs=1, seed=None, read=None,
             ops=[("packbatch", length, rng.randint(1, 3))])
    return ("pack_dl", src, d)
  if c == "cts":
    tail = [("cts", length, rng.random() < .7)]
  else:
    pad = tuple((f, rng.choice([0, -1])) for f in features) if rng.random() < .3 else None
    meta = ("targets",) if "targets" in features and rng.random() < .2 else ()
    tail = [(c, length, rng.randint(1, 4), rng.randrange(100), rng.random() < .5,
             rng.choice([None, None, 1, 2]), meta, pad)]
  if rng.random() < .3:
    tail.append(("limit", rng.randint(1, 6)))
  return ("chain", src, pre + tail)


def gen_dataloader(rng):
  kind = rng.choice(FIXED_KINDS[:3])
  n = rng.choice([0, 1, 3, 5, 8, 12])
  source = ("range", rng.choice([(0, n, 1), (2, 2 + 2 * n, 2)])) if kind == "int" and rng.random() < .4 else (
      "list", (kind, n))
  shard = None
  if rng.random() < .5:
    count = rng.randint(1, 3)
    shard = (rng.randrange(count), count, rng.random() < .5)
  shuffle = rng.random() < .5
  seed = rng.randrange(2**32) if (shuffle or rng.random() < .6) else None
  epochs = rng.choice([1, 1, 2, 3, 3, None])
  ops = []
  for _ in range(rng.randint(0, 4)):
    # No filter in an endless stream: one that drops every record would loop forever (in Grain too).
    c = rng.choice(["map", "rmap", "batch", "fail"] + (["filter"] if epochs else []))
    if c == "map":
      ops.append(("map", rng.randint(1, 4), rng.random() < .5))
    elif c == "rmap":
      ops.append(("rmap", rng.random() < .5))
    elif c == "filter":
      ops.append(("filter", rng.choice([2, 3]), rng.randint(0, 1), rng.random() < .5))
    elif c == "fail":
      ops.append(("fail", rng.choice([4, 6, 9])))
    elif not any(o[0] == "batch" for o in ops):
      ops.append(("batch", rng.randint(1, 4), rng.random() < .4))
  d = dict(source=source, shard=shard, records_delta=rng.choice([0, 0, 0, 0, 0, -1, 1]) if n else 0, shuffle=shuffle,
           epochs=epochs, seed=seed, ops=ops,
           read=rng.choice([None, (0, 1), (1, 2), (2, 10)]))
  return ("dataloader", d)


def gen_sampler(rng):
  n = rng.choice([0, 1, 2, 5, 9])
  shard = None
  if rng.random() < .6:
    count = rng.randint(1, 4)
    shard = (rng.randrange(count), count, rng.random() < .5)
  if rng.random() < .25:
    return ("sampler", "sequential", n, shard, rng.choice([None, rng.randrange(2**32)]))
  return ("sampler", "index", n, shard, rng.random() < .5, rng.choice([1, 2, 3, None]),
          rng.choice([None, rng.randrange(2**32)]))


def build_sampler(lib, spec):
  shard = lib.sharding.NoSharding() if spec[3] is None else lib.sharding.ShardOptions(*spec[3])
  if spec[1] == "sequential":
    return lib.samplers.SequentialSampler(num_records=spec[2], shard_options=shard, seed=spec[4])
  return lib.samplers.IndexSampler(num_records=spec[2], shard_options=shard, shuffle=spec[4], num_epochs=spec[5],
                                   seed=spec[6])


def _metadata(m):
  rng = None if m.rng is None else m.rng.integers(0, 2**31, size=3).tolist()
  return (type(m).__name__, canon(m.index), canon(m.record_key), rng)


def observe_sampler(lib, spec):
  try:
    sampler = build_sampler(lib, spec)
  except Exception as e:  # pylint: disable=broad-except
    return {"build": ("raises", type(e))}
  obs = {"len": _attempt(lambda: len(sampler)) if hasattr(sampler, "__len__") else "no len"}
  n = obs["len"][1] if obs["len"] != "no len" and obs["len"][0] == "ok" else 30
  n = min(n, 10**6)
  indices = sorted({0, 1, 2, n - 1, n, n + 1, -1, min(n, 40) // 2} | set(range(min(n, 25))))
  obs["getitem"] = [(i, _attempt(lambda: _metadata(sampler[i]))) for i in indices]  # pylint: disable=cell-var-from-loop
  return obs


def compare_sampler(spec):
  g, lo = observe_sampler(grain, spec), observe_sampler(loader, spec)
  diffs = []
  for key in ["build", "len"]:
    if not _same_outcome(g.get(key), lo.get(key)):
      diffs.append((key, g.get(key), lo.get(key)))
  for (i, a), (_, b) in zip(g.get("getitem", []), lo.get("getitem", [])):
    if not _same_outcome(a, b):
      diffs.append(("getitem", i, a, b))
      break
  return diffs, True, True


GENERATORS = {"sampler": gen_sampler, "dataloader": gen_dataloader, "mapchain": gen_mapchain, "mix": gen_mix, "interleave": gen_interleave,
              "pad": gen_pad, "pack": gen_pack}


def build_any(lib, spec):
  if spec[0] == "pack_dl":  # A DataLoader over a list of token-sequence dicts, packed by PackAndBatchOperation.
    ds = build(lib, spec[1])
    els = [ds[i] for i in range(len(ds))]
    d = dict(spec[2])
    src = _SeqSource(els, repr(spec[1]))
    sampler = lib.samplers.IndexSampler(num_records=len(src), shuffle=False, num_epochs=1, seed=None)
    return lib.DataLoader(data_source=src, sampler=sampler, worker_count=0,
                          operations=[lib.experimental.PackAndBatchOperation(length_struct=dict(d["ops"][0][1]),
                                                                             batch_size=d["ops"][0][2])])
  return build(lib, spec)


class _SeqSource:

  def __init__(self, els, name):
    self.els, self.name = els, name

  def __len__(self):
    return len(self.els)

  def __getitem__(self, i):
    return self.els[int(i)]

  def __repr__(self):
    return f"_SeqSource({self.name})"


# ---------------------------------------------------------------------------
# Observing a pipeline on one library.






def _spec_canon(s):
  if isinstance(s, dict):
    return {k: _spec_canon(v) for k, v in s.items()}
  if isinstance(s, (list, tuple)) and not hasattr(s, "shape"):
    return [type(s).__name__] + [_spec_canon(v) for v in s]
  if hasattr(s, "shape") and hasattr(s, "dtype"):
    return ("spec", tuple(s.shape), np.dtype(s.dtype).str)
  return repr(s)


def observe(lib, spec, other_states=None):
  obs = {}
  try:
    ds = build_any(lib, spec)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return {"build": ("raises", type(e))}
  if isinstance(ds, (lib.MapDataset, lib.IterDataset)):
    obs["spec"] = _attempt(lambda: _spec_canon(lib.experimental.get_element_spec(ds)))
  if isinstance(ds, lib.MapDataset):
    obs["len"] = _attempt(lambda: len(ds))
    n = obs["len"][1] if obs["len"][0] == "ok" else None
    if n is not None:
      indices = [0, 1, -1, -2]
      if n < 10**6:
        indices += [n - 1, n, n + 1, -n, -n - 1, 2 * n + 3, -2 * n - 1]
      else:
        indices += [n - 1, -n, 10**7]
      obs["getitem"] = [(i, _attempt(lambda: canon(ds[i]))) for i in sorted(set(indices))]  # pylint: disable=cell-var-from-loop
  try:
    it = iter(ds)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    obs["iter"] = ("raises", type(e))
    return obs
  cap = CAP // 2 if spec[0] == "dataloader" else CAP
  obs.update(observe_iteration(it, lambda: iter(build_any(lib, spec)), cap, RES, other_states))
  return obs


def _without_grain_index_errors(g, lo):
  """(Grain's stream, loader's stream), both cut where Grain's IndexErrors after a failed element begin.

  README: "After an element of `to_iter_dataset()` failed, its end is a `StopIteration` (Grain raises
  `IndexError: pop from an empty deque` at every later `next`)"; Grain's DataLoader does the same, and an
  interleave over such an input raises them where loader's goes on with its other inputs.
  """
  if not isinstance(g, list) or not isinstance(lo, list):
    return g, lo
  failed = False
  for p, o in enumerate(g):
    if failed and _is_error(o) and o[1] is IndexError:
      return g[:p], lo[:p]
    failed = failed or (_is_error(o) and not issubclass(o[1], IndexError))
  return g, lo


def _grain_pack_and_batch_restore_crash(spec, g, lo) -> bool:
  """Grain 0.2.18's `PackAndBatchOperation` restored after its last record raises AttributeError ("'NoneType'
  object has no attribute 'get_packed_batch'") where loader's stream ends: a Grain bug, not copied."""
  return spec[0] == "pack_dl" and g == [("ERR", AttributeError), "END"] and lo == ["END"]


def _spec_of_custom_batch_fn_over_map(spec, key, g, lo) -> bool:
  """The difference of `test_element_spec_of_a_custom_batch_fn_over_a_map_raises_grains_value_error`."""
  return (key == "spec" and any(op[0] == "batch" and op[3] is not False for op in _ops(spec)) and g is not None
          and lo is not None and g[1] is ValueError and lo[1] is NotImplementedError)


def _ops(spec):
  if isinstance(spec, tuple) and spec and spec[0] == "chain":
    return _ops(spec[1]) + list(spec[2])
  return []


def compare(spec):
  """(differences of loader from Grain, whether Grain was comparable, whether Grain's own restores were exact)."""
  if spec[0] == "sampler":
    return compare_sampler(spec)
  return _compare(spec)


def _compare(spec):
  """(differences of loader from Grain, whether Grain was comparable, whether Grain's own restores were exact)."""
  g, lo, early = observe_both(observe, spec, grain, GRAIN_TIMEOUT_S)
  if early is not None:
    return early
  diffs = []
  for key in ["build", "spec", "len", "iter"]:
    if ((key in g or key in lo) and not _same_outcome(g.get(key), lo.get(key))
        and not _spec_of_custom_batch_fn_over_map(spec, key, g.get(key), lo.get(key))):
      diffs.append((key, g.get(key), lo.get(key)))
  for (i, a), (_, b) in zip(g.get("getitem", []), lo.get("getitem", [])):
    if not _same_outcome(a, b):
      diffs.append(("getitem", i, a, b))
      break
  if "stream" not in g or "stream" not in lo:
    return diffs, True, True
  grain_exact = not g["restore_bad"] and not g["rewind_bad"]
  if not _same_stream(*_without_grain_index_errors(g["stream"], lo["stream"])):
    diffs.append(("stream", g["stream"], lo["stream"]))
  if grain_exact and lo["restore_bad"]:
    diffs.append(("loader restore at step", lo["restore_bad"][:3]))
  elif not grain_exact:  # Grain's own restores do not go on as its run: loader's must do what Grain's do.
    bad = [k for k, (a, b) in enumerate(zip(g["restored"], lo["restored"]))
           if not _same_stream(*_without_grain_index_errors(a, b))
           and not _grain_pack_and_batch_restore_crash(spec, a, b)
           and not any(_is_error(o) for o in g["stream"][:k])]  # After an error: Grain's IndexErrors (README).
    if bad:
      diffs.append(("loader restore unlike grain's at step", [(k, g["restored"][k], lo["restored"][k]) for k in bad[:2]]))
  if lo["rewind_bad"] and grain_exact:
    diffs.append(("loader rewind at step", lo["rewind_bad"]))
  if grain_exact and _same_stream(g["stream"], lo["stream"]) and lo["other_states_bad"]:
    diffs.append(("grain state on loader at step", lo["other_states_bad"][:2]))
  return diffs, True, grain_exact


def known_difference(spec) -> bool:
  """Specs whose difference is a documented one, or one of the regression tests below, left out of the fuzz.

  README: with `drop_remainder=True` "the records of the dropped last batch are never computed, so an error
  there is not raised" (Grain computes and drops them). A DataLoader shard without records is such a case:
  Grain reads its empty shard (ZeroDivisionError), loader ends the stream.
  """
  if spec[0] == "chain" and spec[1][0] in ("imix", "mix"):
    # The differences of the mix regression tests below.
    kids, weights = spec[1][1], spec[1][2]
    if weights is not None and (min(weights) < 0 or (spec[1][0] == "imix" and spec[1][3] and len(weights) != len(kids))):
      return True
    # loader/transformations/mix.py: "an error other than StopIteration does not stop the mixture (Grain stops
    # it)" (test_iter_mix_goes_on_after_an_error_as_its_docstring_says).
    return spec[1][0] == "imix" and "'fail'" in repr(kids)
  if spec[0] != "dataloader":
    return False
  d = spec[1]
  n = len(range(*d["source"][1])) if d["source"][0] == "range" else d["source"][1][1]
  n += d["records_delta"]
  count = d["shard"][1] if d["shard"] else 1
  return n < count and any(op[0] == "batch" and op[2] for op in d["ops"])


# ---------------------------------------------------------------------------
# The seeded random-pipeline differential tests, one per family.


@pytest.mark.parametrize("family", sorted(N_CASES))
def test_random_pipelines_match_grain_and_restore_at_every_step(family):
  start = time.monotonic()
  failures, compared, skipped = [], 0, 0
  for i in range(N_CASES[family]):
    spec = GENERATORS[family](random.Random(f"{SEED}-{family}-{i}"))
    if known_difference(spec):
      skipped += 1
      continue
    diffs, comparable, _ = compare(spec)
    gc.collect()  # Grain's used iterators (and their prefetch threads) go before the next case.
    compared += comparable
    if diffs:
      failures.append(f"case {i}: {spec!r}\n  " + "\n  ".join(repr(d)[:700] for d in diffs))
  assert not failures, f"{len(failures)} of {compared} {family} pipelines differ:\n" + "\n".join(failures[:6])
  assert compared >= (N_CASES[family] - skipped) * 3 // 4, (compared, skipped)
  assert time.monotonic() - start < 600


# ---------------------------------------------------------------------------
# Regression tests: the differences this round found, minimized.


def _spec_outcome(lib, make):
  try:
    return ("ok", _spec_canon(lib.experimental.get_element_spec(make(lib))))
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))


_CUSTOM_BATCH_OVER_UNKNOWN_SPEC = {
    "map_then_batch_fn": lambda lib: lib.MapDataset.range(4).map(lambda x: x).batch(2, batch_fn=list),
    "random_map_then_batch_and_pad": lambda lib: lib.MapDataset.range(4).random_map(lambda x, rng: x, seed=1).batch(
        2, batch_fn=functools.partial(lib.experimental.batch_and_pad, batch_size=2)),
    "iter_map_then_batch_fn": lambda lib: lib.MapDataset.range(4).to_iter_dataset().map(lambda x: x).batch(
        2, batch_fn=list),
}


@pytest.mark.parametrize("case", sorted(_CUSTOM_BATCH_OVER_UNKNOWN_SPEC))
def test_element_spec_of_a_custom_batch_fn_over_a_map_raises_grains_value_error(case):
  make = _CUSTOM_BATCH_OVER_UNKNOWN_SPEC[case]
  expected = _spec_outcome(grain, make)
  assert expected == ("raises", ValueError)
  got = _spec_outcome(loader, make)
  assert got[0] == "raises" and issubclass(got[1], expected[1]), got


def test_element_spec_of_a_custom_batch_fn_over_a_known_spec_as_grain():
  make = lambda lib: lib.MapDataset.range(4).batch(2, batch_fn=list)  # pylint: disable=unnecessary-lambda-assignment
  expected = _spec_outcome(grain, make)
  assert expected == ("raises", NotImplementedError)
  assert _spec_outcome(loader, make)[1] is NotImplementedError


def _iter_mix_outcome(lib, datasets, weights):
  parts = {k: lib.MapDataset.range(6).map(functools.partial(lambda sign, x: sign * x, sign)).to_iter_dataset()
           for k, sign in datasets.items()}
  try:
    ds = lib.IterDataset.mix(parts, weights)
  except Exception as e:  # pylint: disable=broad-except
    return ("build raises", type(e))
  return ("ok", [int(x) for x in ds])


@pytest.mark.parametrize("weights", [{"a": 1, "b": 2, "c": 1}, {"a": 1}])
def test_iter_mix_dict_weights_with_another_number_of_keys_raises_grains_assertion_error(weights):
  expected = _iter_mix_outcome(grain, {"a": 1, "b": -1}, weights)
  assert expected == ("build raises", AssertionError)
  got = _iter_mix_outcome(loader, {"a": 1, "b": -1}, weights)
  assert got[0] == "build raises" and issubclass(got[1], AssertionError), got


def test_iter_mix_dict_weights_with_other_keys_mixes_as_grain(caplog):
  expected = _iter_mix_outcome(grain, {"b": 1, "a": -1}, {"z": 1, "c": 3})
  assert expected == ("ok", [0, -1, -2, 0, -3, -4, -5, 1])  # "a" (the first sorted key) gets "c"'s 3.
  with caplog.at_level("WARNING", logger="loader"):
    assert _iter_mix_outcome(loader, {"b": 1, "a": -1}, {"z": 1, "c": 3}) == expected
  assert ("IterDataset.mix: the weights' keys ['c', 'z'] are not the datasets' ['a', 'b']; they are paired in "
          "sorted key order, as Grain pairs them: a=3, b=1.") in caplog.messages


@pytest.mark.parametrize("weights", [[3, -1], [-1, 3], [-1, -2]])
def test_iter_mix_negative_weight_is_refused_as_documented(weights):
  """README, "Mixing weights": Grain 0.2.18 builds such a mix and reads it by accident of its arithmetic."""
  assert _iter_mix_outcome(grain, {"a": 1, "b": -1}, {"a": weights[0], "b": weights[1]})[0] == "ok"
  got = _iter_mix_outcome(loader, {"a": 1, "b": -1}, {"a": weights[0], "b": weights[1]})
  assert got[0] == "build raises" and issubclass(got[1], ValueError) and issubclass(got[1], ZeroDivisionError)


def _failing_parents(lib):
  def fail(x):
    if x == 2:
      raise ValueError("bad record")
    return x
  return [lib.MapDataset.range(5).map(fail).to_iter_dataset(), lib.MapDataset.range(10, 20).to_iter_dataset()]


def _take(it, n=12):
  out = []
  for _ in range(n):
    try:
      out.append(int(next(it)))
    except StopIteration:
      out.append("END")
      break
    except ValueError:
      out.append("ValueError")
  return out


def test_iter_mix_goes_on_after_an_error_as_documented():
  """README, "Mixing weights" (and loader/transformations/mix.py's docstring): an error does not stop loader's mixture.

  Grain 0.2.18's `_MixedDatasetIterator.__next__` sets its `stop` flag on any exception, so the error is
  its stream's last element.
  """
  assert _take(iter(grain.IterDataset.mix(_failing_parents(grain), [1, 1]))) == [0, 10, 1, 11, "ValueError", "END"]
  assert _take(iter(loader.IterDataset.mix(_failing_parents(loader), [1, 1]))) == [
      0, 10, 1, 11, "ValueError", 3, 12, 4, 13, "END"]


@pytest.mark.parametrize("weights", [[-1], [-1, -1], [-2, -1]])
def test_map_mix_of_negative_weights_is_refused_as_documented(weights):
  """README, "Mixing weights": Grain 0.2.18 builds and reads a mix whose weights are all negative."""
  def run(lib):
    try:
      ds = lib.MapDataset.mix([lib.MapDataset.range(3), lib.MapDataset.range(10, 12)][:len(weights)], weights)
      return ("ok", len(ds), [int(ds[i]) for i in range(len(ds))])
    except Exception as e:  # pylint: disable=broad-except
      return ("raises", type(e))

  assert run(grain)[0] == "ok"
  got = run(loader)
  assert got[0] == "raises" and issubclass(got[1], ValueError) and issubclass(got[1], ZeroDivisionError)
