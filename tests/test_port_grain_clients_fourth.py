"""A fourth set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found by the 2026-11-26 audit (round 4) in public code: google-deepmind/simply
(simply/data_lib.py: frozen-dataclass MapTransforms, ConcatThenSplit /
FirstFitPack / pad, `MapDataset.mix` then packing, packing then
`IterDataset.mix`), small clients using a numpy array as a source, positional
`ReadOptions` / `MultiprocessingOptions` and `ThreadPrefetchIterDataset`, a
meta-learning data stream (a MapDataset subclass, ZipMapDataset,
DatasetSelectionMap past `len`, `select_from_datasets`), GRPO data helpers
(`LimitIterDataset` or `ds[:n]` after a batch), an audio eval loader
(`LimitIterDataset` under `mp_prefetch`), a custom sampler importing Grain's
private `index_shuffle_module`, batch error helpers using
`grain._src.core.tree_lib.spec_like`, and a cryo-EM loader
(`InterleaveIterDataset` over a MapDataset whose elements are no datasets,
`pick_performance_config(ram_budget_mb=0)`).

Scripts run as `__main__` on each library in a fresh process; their output
must be the same. Where README.md ("Porting from Grain") documents a
difference -- `LimitIterDataset` under workers limits loader's one stream --
the test asserts exactly how the two differ.
"""

from __future__ import annotations

import pytest

from tests import porting

# google-deepmind/simply simply/data_lib.py: the whole pipeline, with state round trips.
SIMPLY = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import dataclasses, json
import grain.python as grain
import numpy as np

class Src:
  def __init__(self, n, off=0):
    self.ex = [{'text': 'abcdefghij'[: (i * 7 + off) % 9 + 2], 'id': i} for i in range(n)]
  def __len__(self): return len(self.ex)
  def __getitem__(self, i): return self.ex[i]

@dataclasses.dataclass(frozen=True)
class TFExampleDeserializeTransform(grain.MapTransform):
  def map(self, f):
    return dict(f)

@dataclasses.dataclass(frozen=True)
class TokenizeTransform(grain.MapTransform):
  data_key: str = 'text'
  def map(self, f):
    t = f[self.data_key]
    return {'tokens': np.array([ord(c) - 96 for c in t] + [1], dtype=np.int32)}

@dataclasses.dataclass(frozen=True)
class NextTokenPredTransform(grain.MapTransform):
  def map(self, f):
    tokens = f['tokens']
    return {'decoder_input_tokens': tokens[:-1].astype(np.int32),
            'decoder_target_tokens': tokens[1:].astype(np.int32),
            'decoder_loss_weights': np.ones(len(tokens) - 1, np.float32)}

@dataclasses.dataclass(frozen=True)
class TruncateTransform(grain.MapTransform):
  seq_len: int
  def map(self, f):
    return {k: (v[-self.seq_len:] if isinstance(v, np.ndarray) and v.ndim == 1 else v) for k, v in f.items()}

@dataclasses.dataclass(frozen=True)
class PadTransform(grain.MapTransform):
  seq_len: int
  pad_id: int = 0
  def map(self, f):
    out = {}
    for k, v in f.items():
      if k.endswith('_tokens'):
        out[k] = np.pad(v, (0, self.seq_len - len(v)), constant_values=self.pad_id).astype(np.int32)
      elif k.endswith('_weights'):
        out[k] = np.pad(v, (0, self.seq_len - len(v))).astype(np.float32)
      else:
        out[k] = v
    return out

SEQ = 8
LS = {'decoder_input_tokens': SEQ, 'decoder_target_tokens': SEQ, 'decoder_loss_weights': SEQ}

def fixed(ds, method, seed=0):
  if method == 'concat_split':
    return grain.experimental.ConcatThenSplitIterDataset(parent=ds, length_struct=LS)
  if method == 'first_fit':
    return grain.experimental.FirstFitPackIterDataset(parent=ds.map(TruncateTransform(SEQ)), length_struct=LS, num_packing_bins=4, seed=seed, shuffle_bins=True)
  if method == 'pad':
    return ds.map(TruncateTransform(SEQ)).map(PadTransform(SEQ))
  return ds

def mapds(n, seed, shuffle, epochs, off=0):
  ds = grain.MapDataset.source(Src(n, off)).map(TFExampleDeserializeTransform()).map(TokenizeTransform()).map(NextTokenPredTransform())
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(epochs)

def finalize(ds, workers):
  ds = ds.batch(3, drop_remainder=True)
  return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2))

def dump(b):
  return {k: (v.dtype.str, v.shape, v.tolist()) for k, v in sorted(b.items())}

def take(it, n):
  return [dump(next(it)) for _ in range(n)]

for method in ['concat_split', 'first_fit', 'pad']:
  for shuffle, epochs in [(True, None), (False, 2)]:
    ds = finalize(fixed(mapds(20, 3, shuffle, epochs).to_iter_dataset(), method), 0)
    it = iter(ds)
    a = take(it, 3)
    st = it.get_state()
    b = take(it, 3)
    it2 = iter(ds); it2.set_state(st)
    c = take(it2, 3)
    print(method, shuffle, json.dumps(a)[:2000], b == c)
    if epochs == 2:
      print('count', sum(1 for _ in iter(ds)))

# mix then pack
dss = [mapds(10, 3 + i, True, None, off=i) for i in range(2)]
ds = finalize(fixed(grain.MapDataset.mix(dss, weights=[0.7, 0.3]).to_iter_dataset(), 'first_fit'), 0)
it = iter(ds); print('mixmap', json.dumps(take(it, 3))[:1500])
st = it.get_state(); b = take(it, 2); it2 = iter(ds); it2.set_state(st); print('mixmap restore', take(it2, 2) == b)
# pack then mix
dss = [fixed(mapds(10, 3 + i, True, None, off=i).to_iter_dataset(), 'concat_split') for i in range(2)]
ds = finalize(grain.IterDataset.mix(dss, weights=[0.7, 0.3]), 0)
it = iter(ds); print('mixiter', json.dumps(take(it, 3))[:1500])
st = it.get_state(); b = take(it, 2); it2 = iter(ds); it2.set_state(st); print('mixiter restore', take(it2, 2) == b)
"""

# Small clients: numpy sources, positional options, ThreadPrefetchIterDataset, jax.tree.map after mp_prefetch.
SMALL_CLIENTS = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import grain
import numpy as np
import jax

def main():
  # numpy array as source, shuffle/repeat/batch (27715483593, 15521653319)
  data = np.arange(40, dtype=np.float32).reshape(20, 2)
  ds = grain.MapDataset.source(np.array(data)[..., None]).shuffle(42).repeat().to_iter_dataset().batch(4)
  it = iter(ds)
  b = next(it); print("np-src", b.dtype, b.shape, b[:, :, 0].tolist())
  print("len", len(grain.MapDataset.source(data)), grain.MapDataset.source(data)[3].tolist(), type(grain.MapDataset.source(data)[3]).__name__)
  # mp_prefetch with pick config after batch (27715483593); workers = cpu count
  ds2 = grain.MapDataset.source(np.array(data)[..., None]).shuffle(42).repeat().to_iter_dataset()
  pc = grain.experimental.pick_performance_config(ds=ds2, ram_budget_mb=1024 * 4, max_workers=None, max_buffer_size=None)
  it2 = iter(ds2.batch(4).mp_prefetch(pc.multiprocessing_options))
  got = [next(it2)[:, :, 0].tolist() for _ in range(3)]
  print("mp np-src sorted", sorted(sum(sum(got, []), [])) == sorted(sum(sum([next(it)[:, :, 0].tolist() for _ in range(0)], []), [])) or None, len(got))
  # positional ReadOptions / MultiprocessingOptions (67209458824)
  ro = grain.ReadOptions(4, 8); mo = grain.MultiprocessingOptions(2, 3)
  print("pos", ro.num_threads, ro.prefetch_buffer_size, mo.num_workers, mo.per_worker_buffer_size, mo.enable_profiling)
  # seed().shuffle() no arg, batch before to_iter_dataset, mp_prefetch 2 workers (56321450837)
  rows = [{"input_ids": np.arange(3) + i, "label": i} for i in range(24)]
  ds3 = (grain.MapDataset.source(rows).seed(7).shuffle().repeat().batch(4, drop_remainder=True)
         .to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=16))
         .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
  it3 = iter(ds3)
  out = [next(it3) for _ in range(8)]
  print("seeded", [o["label"].tolist() for o in out], out[0]["input_ids"].dtype, out[0]["input_ids"].shape)
  st = it3.get_state()
  nxt = [next(it3)["label"].tolist() for _ in range(3)]
  it3b = iter(ds3); it3b.set_state(st)
  print("restore", nxt == [next(it3b)["label"].tolist() for _ in range(3)])
  # map to jax arrays after mp_prefetch (55618357114)
  ds4 = ds3.map(lambda x: jax.tree.map(jax.numpy.asarray, x))
  e = next(iter(ds4)); print("jax", type(e["label"]).__name__, e["label"].tolist())
  # arbitrary attribute on a dataset (53200951984)
  try:
    ds3.dataset_statistics = {"mean": 1}
    w = grain.experimental.ThreadPrefetchIterDataset(ds3, prefetch_buffer_size=2)
    print("attr", ds3.dataset_statistics, [next(iter(w))["label"].tolist()])
  except Exception as ex:
    print("attr", type(ex).__name__, ex)
  # start_prefetch on ThreadPrefetch over mp_prefetch (grain prefetch_test)
  ds5 = grain.MapDataset.source([1, 2, 3]).repeat().to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
  ds5 = grain.experimental.ThreadPrefetchIterDataset(ds5, prefetch_buffer_size=10)
  it5 = ds5.__iter__()
  try:
    it5.start_prefetch(); print("start_prefetch ok", [next(it5) for _ in range(5)])
  except Exception as ex:
    print("start_prefetch", type(ex).__name__, ex)
  del it5
  it6 = iter(grain.MapDataset.source([1, 2, 3]).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
  try:
    it6.start_prefetch(); print("mp start_prefetch ok", list(it6))
  except Exception as ex:
    print("mp start_prefetch", type(ex).__name__, ex)

if __name__ == "__main__":
  main()
"""

# A meta-learning repo's data stream.
SELECT_ZIP = """
from absl import flags; flags.FLAGS.mark_as_parsed()
from dataclasses import dataclass
import grain
from grain.experimental import ZipMapDataset
from grain.transforms import DatasetSelectionMap
import jax
import numpy as np

class Extent(grain.MapDataset):
  def __init__(self, parent, length):
    super().__init__(parent)
    self.length = length
  def __len__(self):
    return self.length
  def __getitem__(self, index):
    return self._parent[index]

def stacked(copies):
  return ZipMapDataset(copies).map(lambda items: jax.tree.map(lambda *xs: np.stack(xs), *items))

@dataclass(frozen=True)
class Schedule(DatasetSelectionMap):
  groups: int
  per_pass: int
  n: int
  seed: int
  def __len__(self):
    return self.groups * self.per_pass
  def __getitem__(self, u):
    cycle, r = divmod(u, self.groups * self.per_pass)
    g, e = divmod(r, self.per_pass)
    consumed = cycle * self.per_pass + e
    order = np.random.default_rng(self.seed + cycle).permutation(self.groups)
    task = int(order[g])
    passes, within = divmod(consumed, self.per_pass)
    return (task, passes * self.n + within) if within < self.n else (self.groups, 0)

def drawn(xs, ys, seed):
  order = grain.MapDataset.range(len(xs)).seed(seed).shuffle()
  ex = order.map(lambda j: (xs[j], ys[j]))
  def on_x(xy, rng):
    x, y = xy
    return x + rng.normal(size=x.shape).astype(np.float32), y
  return ex.random_map(on_x)

def main():
  rng = np.random.default_rng(0)
  tasks = [(rng.normal(size=(5, 2)).astype(np.float32), np.arange(5, dtype=np.int32) + 10 * t) for t in range(3)]
  streams = [drawn(x, y, 100 + i) for i, (x, y) in enumerate(tasks)]
  masks = grain.MapDataset.source([jax.tree.map(np.full_like, streams[0][0], (-1.0, -1))])
  sel = grain.MapDataset.select_from_datasets([*streams, masks], Schedule(3, 6, 5, 9))
  print("sel len", len(sel), [int(sel[i][1]) for i in range(len(sel))])
  print("sel past len", [int(sel[i][1]) for i in range(18, 24)], [round(float(sel[i][0][0]), 4) for i in range(3)])
  ex = stacked([sel, sel.map(lambda xy: (xy[0] * 2, xy[1]))]).batch(2)
  print("stacked", len(ex), ex[0][0].shape, ex[0][1].tolist(), ex[0][0].dtype)
  L = 2
  def step(j, _):
    return jax.tree.map(lambda a: np.take(a, j % L, axis=0), ex[j // L])
  ticks = grain.MapDataset.range(len(ex) * L).map_with_index(step)
  print("ticks", len(ticks), [t[1].tolist() for t in ticks][:6])
  trainee = ticks
  validation = grain.MapDataset.range(3).map(lambda i: np.int64(i * 100))
  z = ZipMapDataset([trainee, Extent(validation, len(trainee))]).repeat(2)
  print("zip", len(z), [int(e[1]) for e in z][:20])
  it = iter(z.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
  a = [next(it) for _ in range(5)]
  st = it.get_state(); b = [int(next(it)[1]) for _ in range(4)]
  it2 = iter(z.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))); it2.set_state(st)
  print("mp", [int(e[1]) for e in a], [e[0][1].tolist() for e in a[:2]], b == [int(next(it2)[1]) for _ in range(4)])
  try:
    print(z[len(z) + 3][1])
  except Exception as e:
    print("past", type(e).__name__, e)
  try:
    Extent(validation, 10)[7]
    print("extent7", Extent(validation, 10)[7])
  except Exception as e:
    print("extent7", type(e).__name__, e)

if __name__ == "__main__":
  main()
"""

# GRPO data helpers: a filter, a batch after to_iter_dataset, then LimitIterDataset or ds[:n].
GRPO_LIMIT = """
import grain
import numpy as np

def make(filter_, num_batches, bs=3):
  rows = [{"prompts": "p" * (i % 7), "answer": str(i)} for i in range(30)]
  dataset = grain.MapDataset.source(rows).shuffle(seed=42).map(lambda x: {**x, "len": len(x["prompts"])})
  if filter_:
    dataset = dataset.filter(lambda x: x["len"] <= 4).to_iter_dataset()
  dataset = dataset.batch(bs)
  if num_batches is not None:
    if isinstance(dataset, grain.MapDataset):
      dataset = dataset[:num_batches]
    else:
      dataset = grain.experimental.LimitIterDataset(dataset, count=num_batches)
  return dataset

for f in [True, False]:
  ds = make(f, 4)
  out = [(list(b["answer"]), b["answer"].dtype.str, b["len"].tolist()) for b in ds]
  print(f, type(ds).__name__, out)
  it = iter(ds); next(it); st = it.get_state(); r = [list(b["answer"]) for b in it]
  it2 = iter(ds); it2.set_state(st); print("restore", r == [list(b["answer"]) for b in it2])
"""


@pytest.mark.parametrize("name", ["SIMPLY", "SMALL_CLIENTS", "SELECT_ZIP", "GRPO_LIMIT"])
def test_client_script_prints_the_same(name, tmp_path):
  porting.assert_prints_the_same(globals()[name], tmp_path)


# An audio repo's eval loader: LimitIterDataset(num_samples) after
# to_iter_dataset(ReadOptions(num_threads=0, prefetch_buffer_size=0)), then a
# batch_fn batch, then mp_prefetch.
LIMIT_UNDER_WORKERS = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import json
import grain
import numpy as np

def batch_fn(xs):
  return {"x": np.stack([x["x"] for x in xs]), "n": len(xs)}

def build(workers, num_samples=5, bs=2):
  ds = grain.MapDataset.range(20).map(lambda i: {"x": np.full((3,), i, np.float32)})
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  ds = grain.experimental.LimitIterDataset(ds, num_samples)
  ds = ds.batch(bs, drop_remainder=False, batch_fn=batch_fn)
  if workers > 0:
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1))
  return ds

if __name__ == "__main__":
  print(json.dumps({w: [b["x"][:, 0].astype(int).tolist() for b in build(w)] for w in (0, 2)}))
"""


def test_limit_under_workers_limits_the_stream_not_each_worker(tmp_path):
  g = porting.run_script(LIMIT_UNDER_WORKERS, "grain", tmp_path)
  l = porting.run_script(LIMIT_UNDER_WORKERS, "loader", tmp_path)
  assert l["0"] == g["0"] == [[0, 1], [2, 3], [4]]
  # README "Porting from Grain", worker-count-invariant batching: Grain limits
  # each worker's slice (worker w reads w, w+2, ...), loader the one stream.
  assert l["2"] == l["0"]
  assert sorted(x for b in g["2"] for x in b) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


# A custom sampler importing Grain's private index_shuffle module; arguments
# outside the binding's C types are Grain's TypeError.
INDEX_SHUFFLE = """
from grain._src.python.experimental.index_shuffle.python import index_shuffle_module as index_shuffle
import grain
import numpy as np

values = [[index_shuffle.index_shuffle(i, max_index=9, seed=43, rounds=4) for i in range(10)],
          [index_shuffle.index_shuffle(i, 99, 7, 8) for i in range(5)],
          [grain.experimental.index_shuffle(i, max_index=2**40, seed=2**32 - 1, rounds=4) for i in range(3)],
          index_shuffle.index_shuffle(np.int64(3), max_index=np.int64(9), seed=np.int64(1), rounds=4),
          index_shuffle.index_shuffle(True, max_index=9, seed=1, rounds=4)]
errors = []
for bad in [dict(index=10, max_index=9, seed=1, rounds=4), dict(index=-1, max_index=9, seed=1, rounds=4),
            dict(index=0, max_index=9, seed=-1, rounds=4), dict(index=0, max_index=9, seed=2**32, rounds=4),
            dict(index=0, max_index=9, seed=1.5, rounds=4), dict(index=0, max_index=9, seed=1, rounds=0),
            dict(index=0, max_index=9, seed=1, rounds=-2), dict(index=0, max_index=2**64, seed=1, rounds=4)]:
  try:
    index_shuffle.index_shuffle(**bad)
    errors.append(None)
  except (TypeError, ValueError) as e:
    errors.append(type(e))
"""


def test_index_shuffle_values_and_argument_errors():
  g, l = porting.run_both(INDEX_SHUFFLE)
  assert l.values == g.values
  assert g.errors == [ValueError, ValueError, TypeError, TypeError, TypeError, ValueError, TypeError, TypeError]
  assert [issubclass(e, t) for e, t in zip(l.errors, g.errors)] == [True] * len(g.errors)


# Batch error helpers (Grain's own `_make_batch` messages, copied by clients).
TREE_LIB = """
import collections
import dataclasses
from grain._src.core import tree_lib
import numpy as np

@dataclasses.dataclass
class D:
  a: np.ndarray
  b: int

P = collections.namedtuple("P", "x y")
cases = [[{"x": np.zeros((2, 3), np.int32)}],
         {"a": np.zeros((2,), np.float32), "b": [1, 2, 3], "c": (1, "a"), "d": "str", "e": b"xy", "f": 3.0},
         [np.zeros(2), np.zeros(3)], {"d": D(np.ones((4,), np.int64), 3)}, P(np.zeros(1), [1.0, 2.0]), [],
         {"k": [[1, 2], [3]]}]
specs = [tree_lib.spec_like(c) for c in cases]
sizes = [tree_lib.estimate_byte_size(c) for c in cases] + [tree_lib.estimate_byte_size(b"abc"),
                                                          tree_lib.estimate_byte_size("héllo")]
up_to = [repr(tree_lib.map_structure_up_to({"a": 0, "b": (0, 0)}, repr, {"a": [1, 2], "b": (np.zeros(1), {"q": 1})})),
         repr(tree_lib.map_structure_up_to(collections.defaultdict(list, {"z": 1}), lambda x: x + 1, {"z": 1})),
         repr(tree_lib.map_structure_up_to(P(0, 0), lambda x: x * 2, P(1, [2])))]
"""


def test_tree_lib_spec_like_byte_size_and_up_to():
  g, l = porting.run_both(TREE_LIB)
  assert g.specs[0] == "list<dict>[1]"
  assert (l.specs, l.sizes, l.up_to) == (g.specs, g.sizes, g.up_to)


# A cryo-EM loader's "hierarchical" mode interleaves a MapDataset of
# (image, index) tuples, which are no datasets; and it sizes workers with
# pick_performance_config.
CRYO = """
import grain
import numpy as np

ds = grain.MapDataset.source([(np.zeros(2), i) for i in range(4)])
try:
  next(iter(grain.experimental.InterleaveIterDataset(ds, cycle_length=2)))
  raised = None
except AssertionError as e:
  raised = AssertionError

config = grain.experimental.pick_performance_config(ds=grain.MapDataset.range(20).map(lambda i: np.full((8,), i)),
                                                    ram_budget_mb=0, max_workers=12, max_buffer_size=7)
picked = (config.multiprocessing_options.num_workers, config.read_options.prefetch_buffer_size)
"""


def test_interleave_of_non_datasets_and_a_zero_memory_budget():
  g, l = porting.run_both(CRYO)
  assert l.raised is g.raised is AssertionError
  # README: the numbers are loader's own; a zero budget means no workers on both.
  assert l.picked[0] == g.picked[0] == 0
