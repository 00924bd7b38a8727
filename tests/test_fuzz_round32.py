"""Differential fuzz round 32 against Grain 0.2.18: checkpoint round trips and the iterator protocol.

Rounds 27-31 compared element streams and restores at every step. What this round generates, each pipeline
built from one description for `grain` and for `loader`:

- seeded `MapDataset` chains (`source` of a list of ints or of dicts, `range`) of `shuffle`, `seed()`,
  `random_map` (seeded, or by the `seed()` below it), `map_with_index`, `filter`, `slice`, `repeat`, `batch`,
  `map`, then `to_iter_dataset(ReadOptions(...))` and `IterDataset` `map` / `filter` / `batch` / `random_map` /
  `map_with_index`, `ThreadPrefetchIterDataset`, `InterleaveIterDataset`, `IterDataset.mix`, `LimitIterDataset`,
  `WithOptionsIterDataset(DatasetOptions(...))` and an `IterDataset.seed()` whose default seed reaches a
  `random_map` through a `WithOptionsIterDataset`;
- the legacy `DataLoader` (`IndexSampler` with shuffle, `num_epochs`, `shard_options`, seed; `Map` /
  `RandomMap` / `Filter` / `Batch` operations; `read_options`; `worker_count=0`).

Each is compared on what a client of the iterator protocol and of checkpoints sees:

- `iter(it) is it`; a second `iter(ds)` that starts at the beginning, independent of a first one already
  advanced, which then goes on where it was;
- `next()` after `StopIteration` (again `StopIteration`), also after a `set_state` of the end-of-stream state
  on a fresh iterator;
- `get_state()`: JSON-able wherever Grain's is, through `json.dumps` / `json.loads` restoring the same stream;
  Grain's top-level keys present with Grain's values where they are plain numbers (a client reads
  `state["next_index"]`), and a DataLoader's JSON keys;
- a state taken at every step restored on a fresh iterator (each library on its own states) and on the used
  iterator; Grain's states restored on loader (refusal with `StateMismatchError` allowed, README "Checkpoint
  states");
- `copy.deepcopy` of an iterator (the exception type where Grain's raises); `pickle` of the dataset (the
  exception type, or the unpickled dataset's stream);
- `len()` of the final dataset, and on a final `MapDataset` `ds[i]` at negative, in-range and past-the-end
  indices (the next epoch) and `ds[a:b:c]` with negative and out-of-range bounds;
- `grain.checkpoint.CheckpointHandler` (`PyGrainCheckpointHandler`) save into `tmp_path` at a random step and
  restore on a fresh iterator, compared element by element, also Grain's checkpoint directory restored by
  loader's handler.

Not compared: `repr` of datasets and iterators (Grain's is the object's default repr with its address; loader's
describes the pipeline); the extra `loader_state_version` / `pipeline` keys of loader's states (README,
"Checkpoint states"); the nested layout under an iterator-level `map_with_index` / `random_map`, which loader
folds into the random-access part (`{"next_index": ...}` where Grain nests `{"parent": ..., "counter": ...}`;
Grain's such states restore on loader); `copy.copy` of an iterator, supported by neither library (Grain 0.2.18's
shallow copy of a `to_iter_dataset()` iterator shares its prefetch buffer and raises `IndexError: pop from an
empty deque`; loader's shares its engine with the original, so each disturbs the other's stream).

Also compared: a state read back right after `set_state` (a checkpoint saved right after a restore) is the state
given where Grain's is, and restores the same stream; states are snapshots (later `next()` calls do not change a
state returned earlier, and a client emptying the dict it gave to `set_state` does not change the restore); bad
states a client could hand over (`None`, `{}`, a key dropped, `next_index` negative, past the end or a str;
for a DataLoader bytes that are no JSON) raise loader errors that are instances of Grain's types, or are refused
with `StateMismatchError` where Grain takes them. Outside the fuzz: Orbax's `CheckpointManager` with
`CheckpointSave` / `CheckpointRestore` on 8 generated pipelines (also Grain's checkpoint restored by loader), and
one `mp_prefetch` pipeline with a worker (states, `CheckpointHandler` save and restore, Grain's checkpoint on
loader).

Generated per run: N_CASES (104) pipelines in 4 parts. The streams, states and checkpoints agreed. Found and pinned
or reported:

- not copied, pinned on both sides: Grain 0.2.18's `DataLoader` never pickles (a lambda local to
  `DataLoader._create_dataset`); loader's pickles and gives the same batches
  (test_data_loader_pickles_where_grains_does_not);
- not copied, pinned on both sides: Grain 0.2.18's `InterleaveIterDataset` iterator keeps the lists of the state
  given to `set_state`, so a client emptying that dict afterwards gets an `IndexError` in the stream; loader's
  `set_state` copies it (test_set_state_copies_the_state_where_grains_interleave_keeps_the_clients_lists);
- allowed: `copy.deepcopy` of an iterator with nothing left to read ahead (an interleave of empty inputs) works in
  loader, its copy going on as the original; Grain's raises TypeError (its threads' locks) as for any iterator;
- fixed (loader/data_loader.py): `DataLoaderIterator.set_state` of a Grain-style state without some of Grain's keys
  (`b"{}"`, or without `last_seen_indices` / `sampler` / `worker_count`) raised loader's `StateMismatchError`, which
  was no `KeyError` as Grain's error is: now a `StateKeyError`
  (test_data_loader_state_without_grains_keys_raises_a_key_error_as_grain); a Grain state whose
  `last_seen_indices` are not of this shard's layout raised a plain `ValueError`: now Grain's IndexError
  (`PositionOutOfRangeError`) where they are past the shard's end, else a `StateMismatchError` refusal (Grain
  resumes at its floor division) (test_data_loader_state_of_another_shard_layout_raises_grains_types).
"""

from __future__ import annotations

import copy
import gc
import json
import pickle
import random
import time

import numpy as np
import pytest

grain = pytest.importorskip("grain")
import grain.checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import grain.experimental  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import grain.python  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
from etils import epath  # pylint: disable=g-import-not-at-top,wrong-import-position
import loader  # pylint: disable=g-import-not-at-top,wrong-import-position
import loader.checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import fuzz_elements
from fuzz_elements import (Hang, attempt, deadline, leafmap, matches, next_canon,  # pylint: disable=unused-import
                           observe_iteration, quiet as _quiet, same_outcome, same_stream, stream)

# Grain 0.2.18 iterators that fail to deepcopy leave half-built copies whose __del__ raises (unraisable).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

SEED = 2032
N_CASES = 104
CAP = 8  # Elements compared per stream.
RES = 3  # Elements compared after a restore.
GRAIN_TIMEOUT_S = 10


# ---------------------------------------------------------------------------
# Picklable elements and transforms (module level: both libraries pickle them).


def make_element(kind: str, i: int):
  if kind == "int":
    return i
  return {"x": np.int32(i), "y": np.arange(2, dtype=np.int64) + i}


class AddK:
  """x + k on every numeric leaf."""

  def __init__(self, k: int):
    self.k = k

  def __call__(self, x):
    return leafmap(lambda v: v + self.k, x)


class Keep:
  """Keeps elements whose first leaf is not r mod m."""

  def __init__(self, m: int, r: int):
    self.m, self.r = m, r

  def __call__(self, x) -> bool:
    return int(np.asarray(_first_leaf(x)).ravel()[0]) % self.m != self.r


def _first_leaf(x):
  while isinstance(x, (dict, list, tuple)):
    x = next(iter(x.values())) if isinstance(x, dict) else x[0]
  return x


class RandAdd:
  """Adds a random int drawn from the element's generator."""

  def __call__(self, x, rng):
    k = int(rng.integers(0, 1000))
    return leafmap(lambda v: v + k, x)


class AddIndex:
  """Adds 1000 * the element's index."""

  def __call__(self, i, x):
    return leafmap(lambda v: v + 1000 * i, x)


class ListSource(fuzz_elements.ListSource):
  make = staticmethod(make_element)


# ---------------------------------------------------------------------------
# Pipelines, built from one description for both libraries.


def _apply_map(lib, ds, op):
  name, a = op[0], op[1:]
  if name == "shuffle":
    return ds.shuffle(a[0]) if a[0] is not None else ds.shuffle()
  if name == "seed":
    return ds.seed(a[0])
  if name == "rmap":
    return ds.random_map(RandAdd(), seed=a[0]) if a[0] is not None else ds.random_map(RandAdd())
  if name == "mwi":
    return ds.map_with_index(AddIndex())
  if name == "filter":
    return ds.filter(Keep(a[0], a[1]))
  if name == "slice":
    return ds[slice(*a)]
  if name == "repeat":
    return ds.repeat(a[0])
  if name == "batch":
    return ds.batch(a[0], drop_remainder=a[1])
  if name == "map":
    return ds.map(AddK(a[0]))
  raise ValueError(f"unknown op {op!r}")


def _to_iter(lib, ds, read):
  if read is None:
    return ds.to_iter_dataset()
  return ds.to_iter_dataset(lib.ReadOptions(num_threads=read[0], prefetch_buffer_size=read[1]))


def _apply_iter(lib, ds, op):
  name, a = op[0], op[1:]
  ex = lib.experimental
  if name in ("seed", "rmap", "mwi", "filter", "batch", "map"):
    return _apply_map(lib, ds, op)
  if name == "tprefetch":
    return ex.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=a[0])
  if name == "limit":
    return ex.LimitIterDataset(ds, a[0])
  if name == "options":
    return ex.WithOptionsIterDataset(ds, ex.DatasetOptions(filter_warn_threshold_ratio=a[0]))
  if name == "interleave":
    other = lib.MapDataset.range(a[1], a[1] + a[2]).to_iter_dataset()
    return ex.InterleaveIterDataset([ds, other], cycle_length=a[0])
  if name == "mix":
    other = lib.MapDataset.range(a[1], a[1] + a[2]).to_iter_dataset()
    return lib.IterDataset.mix([ds, other], list(a[0])) if a[0] is not None else lib.IterDataset.mix([ds, other])
  raise ValueError(f"unknown op {op!r}")


def build(lib, spec):
  if spec[0] == "dl":
    return build_data_loader(lib, spec[1])
  _, src, map_ops, read, iter_ops = spec
  if src[0] == "range":
    ds = lib.MapDataset.range(*src[1])
  else:
    ds = lib.MapDataset.source(ListSource(src[1], src[2]))
  for op in map_ops:
    ds = _apply_map(lib, ds, op)
  if read == "map":  # A final MapDataset.
    return ds
  ds = _to_iter(lib, ds, read)
  for op in iter_ops:
    ds = _apply_iter(lib, ds, op)
  return ds


def _transform(lib, op):
  t = lib.transforms
  if op[0] == "map":
    k = op[1]

    class AddOp(t.Map):

      def map(self, x):
        return AddK(k)(x)

    return AddOp()
  if op[0] == "rmap":

    class RandOp(t.RandomMap):

      def random_map(self, x, rng):
        return RandAdd()(x, rng)

    return RandOp()
  if op[0] == "filter":
    m, r = op[1], op[2]

    class KeepOp(t.Filter):

      def filter(self, x):
        return Keep(m, r)(x)

    return KeepOp()
  if op[0] == "batch":
    return t.Batch(batch_size=op[1], drop_remainder=op[2])
  raise ValueError(f"unknown op {op!r}")


def build_data_loader(lib, d):
  source = ListSource(d["kind"], d["n"])
  shard = lib.sharding.NoSharding() if d["shard"] is None else lib.sharding.ShardOptions(*d["shard"])
  sampler = lib.samplers.IndexSampler(num_records=d["n"], shard_options=shard, shuffle=d["shuffle"],
                                      num_epochs=d["epochs"], seed=d["seed"])
  kw = {}
  if d["read"] is not None:
    kw["read_options"] = lib.ReadOptions(num_threads=d["read"][0], prefetch_buffer_size=d["read"][1])
  return lib.DataLoader(data_source=source, sampler=sampler, operations=[_transform(lib, o) for o in d["ops"]],
                        worker_count=0, **kw)


# ---------------------------------------------------------------------------
# Generators.


def _gen_map_ops(rng, kind, seeded):
  ops = []
  for _ in range(rng.randint(0, 5)):
    r = rng.random()
    if r < .15:
      ops.append(("shuffle", rng.randrange(2**32) if not seeded or rng.random() < .5 else None))
    elif r < .25:
      ops.append(("seed", rng.randrange(2**31)))
      seeded = True
    elif r < .4:
      ops.append(("rmap", rng.randrange(2**31) if not seeded or rng.random() < .5 else None))
    elif r < .5:
      ops.append(("mwi",))
    elif r < .62:
      ops.append(("filter", rng.randint(2, 4), rng.randrange(2)))
    elif r < .74:
      ops.append(("slice", rng.choice([None, 0, 1, -3, 2]), rng.choice([None, -1, 7, 30]), rng.choice([None, 1, 2, -1])))
    elif r < .84:
      ops.append(("repeat", rng.randint(1, 3)))
    elif r < .92 and kind != "batched":
      ops.append(("batch", rng.randint(1, 4), rng.random() < .4))
      kind = "batched"
    else:
      ops.append(("map", rng.randint(1, 9)))
  return ops, seeded


def _gen_iter_ops(rng, seeded, batched):
  ops = []
  for _ in range(rng.randint(0, 4)):
    r = rng.random()
    if r < .12:
      ops.append(("map", rng.randint(1, 9)))
    elif r < .22:
      ops.append(("filter", rng.randint(2, 4), rng.randrange(2)))
    elif r < .32 and not batched:
      ops.append(("batch", rng.randint(1, 3), rng.random() < .3))
      batched = True
    elif r < .42:
      ops.append(("rmap", rng.randrange(2**31) if not seeded or rng.random() < .5 else None))
    elif r < .5:
      ops.append(("mwi",))
    elif r < .6:
      ops.append(("tprefetch", rng.choice([0, 1, 3])))
    elif r < .68:
      ops.append(("limit", rng.randint(1, 15)))
    elif r < .78:
      ops.append(("options", rng.choice([None, .95])))
    elif r < .88:
      # Seeds through a WithOptionsIterDataset reach the random map above it.
      ops += [("seed", rng.randrange(2**31)), ("options", None), ("rmap", None)]
      seeded = True
    elif not batched:  # The other input is ints: only where this one's elements are ints too.
      if rng.random() < .5:
        ops.append(("interleave", rng.randint(1, 3), rng.randint(100, 200), rng.randint(0, 6)))
      else:
        ops.append(("mix", rng.choice([None, (1, 1), (2, 1), (1, 3)]), rng.randint(100, 200), rng.randint(1, 6)))
  return ops


def gen(rng):
  if rng.random() < .2:
    n = rng.randint(0, 14)
    return ("dl", {
        "kind": "int", "n": n, "shuffle": rng.random() < .6,
        "epochs": rng.choice([1, 1, 2, 3]), "seed": rng.randrange(2**31),
        # An empty shard is left out (README: Grain's IndexError at every next after its first error).
        "shard": rng.choice([None, None, (0, 2, True), (1, 2, False), (2, 3, False)]) if n >= 3 else None,
        "read": rng.choice([None, (0, 4), (2, 3), (1, 1)]),
        "ops": tuple(rng.choice([("map", 3), ("rmap",), ("filter", 3, 1), ("map", 5)]) for _ in range(rng.randint(0, 2)))
        + ((("batch", rng.randint(1, 3), rng.random() < .3),) if rng.random() < .4 else ()),
    })
  kind = rng.choice(["int", "int", "dict"])
  src = ("range", tuple(rng.choice([(0, 0), (7,), (3, 15), (2, 20, 3)]))) if kind == "int" and rng.random() < .5 \
      else ("source", kind, rng.randint(0, 14))
  seeded = False
  map_ops, seeded = _gen_map_ops(rng, kind, seeded)
  if rng.random() < .25:
    return ("ds", src, tuple(map_ops), "map", ())
  read = rng.choice([None, (0, 4), (1, 1), (2, 8), (4, 4)])
  batched = any(o[0] == "batch" for o in map_ops)
  iter_ops = _gen_iter_ops(rng, seeded, batched or kind != "int")
  return ("ds", src, tuple(map_ops), read, tuple(iter_ops))


# ---------------------------------------------------------------------------
# Observing and comparing.


def _json_able(state) -> bool:
  try:
    json.dumps(state if not isinstance(state, bytes) else state.decode())
    return True
  except (TypeError, ValueError, UnicodeDecodeError):
    return False


def _json_round_trip(state):
  if isinstance(state, bytes):
    return json.dumps(json.loads(state.decode())).encode()
  return json.loads(json.dumps(state))


def _client_view(state):
  """What a client may read off a state: top-level keys with their plain numbers (a DataLoader's JSON parsed)."""
  if isinstance(state, bytes):
    state = json.loads(state.decode())
  if not isinstance(state, dict):
    return ("other", type(state).__name__)
  return {k: (v if isinstance(v, (int, float, bool)) or v is None else type(v).__name__) for k, v in state.items()}


def observe(lib, spec, other=None):
  """Everything compared for one pipeline; `other` is Grain's observation (its states are restored here)."""
  obs = {}
  try:
    ds = build(lib, spec)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return {"build": ("raises", type(e))}
  obs["len"] = attempt(lambda: len(ds))
  if spec[0] == "ds":  # Grain's DataLoader never pickles (test_data_loader_pickles_where_grains_does_not).
    obs["pickle"] = attempt(lambda: len(pickle.dumps(ds)) > 0)
  if obs.get("pickle", ("",))[0] == "ok":
    obs["unpickled"] = attempt(lambda: stream(iter(pickle.loads(pickle.dumps(ds))), 6))
  if spec[0] == "ds" and spec[3] == "map":
    n = obs["len"][1] if obs["len"][0] == "ok" else 5
    idx = sorted({0, 1, -1, -2, n - 1, n, n + 1, 2 * n + 1, -n, -n - 1, 3 * n + 2})
    obs["getitem"] = [attempt(lambda i=i: next_canon(iter([ds[i]]))) for i in idx]
    obs["slices"] = [attempt(lambda s=s: stream(iter(ds[s]), 8)) for s in
                     (slice(-3, None), slice(None, -2), slice(n - 1, n + 5), slice(None, None, -1),
                      slice(-n - 4, 2), slice(1, None, 2))]
  try:
    it = iter(ds)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    obs["iter"] = ("raises", type(e))
    return obs
  obs["iter_is_it"] = iter(it) is it
  s0 = it.get_state()
  obs["state_type"] = type(s0).__name__  # bytes for a DataLoader, a dict for a dataset.
  obs["json"] = _json_able(s0)
  obs["view"] = _client_view(s0)
  fresh = lambda: iter(build(lib, spec))
  obs.update(observe_iteration(it, fresh, CAP, RES, other.get("states") if other else None))
  # next() after the end: StopIteration again (also from a state at the end restored on a fresh iterator).
  if obs["stream"][-1:] == ["END"]:
    done = fresh()
    stream(done, CAP + 1)
    obs["after_end"] = [next_canon(done) for _ in range(2)]
    end = iter(build(lib, spec))
    end.set_state(copy.deepcopy(obs["states"][-1]))
    obs["restored_end"] = [next_canon(end) for _ in range(3)]
  if len(obs["states"]) > 2:
    # A state restored in the middle, run past the end: StopIteration again at every later next().
    mid = iter(build(lib, spec))
    mid.set_state(copy.deepcopy(obs["states"][len(obs["states"]) // 2]))
    obs["mid_to_end"] = stream(mid, CAP + 1)[-1:] + [next_canon(mid) for _ in range(2)]
  obs["aliasing"] = _aliasing(lib, spec)
  obs["restate"] = _restate(lib, ds, obs["states"])
  base = (other or obs)["states"][min(1, len((other or obs)["states"]) - 1)]
  obs["bad_states"] = [_bad_restore(lib, spec, b) for b in _bad_states(base)]
  obs["views"] = [_client_view(s) for s in obs["states"]]
  obs["json_all"] = all(_json_able(s) for s in obs["states"])
  if obs["json_all"]:
    obs["json_restored"] = [_restored(fresh, _json_round_trip(s)) for s in obs["states"][::3]]
  # A second iterator is independent of a first one already advanced.
  first = iter(ds)
  head = [next_canon(first) for _ in range(2)]
  second = iter(ds)
  obs["second"] = (head, stream(second, 4), stream(first, 2))
  obs["deepcopy"] = _deepcopy_outcome(lib, spec)
  return obs


def _clear(state) -> None:
  """Empties a state's containers in place, as a client reusing its dict would."""
  if isinstance(state, dict):
    for v in state.values():
      _clear(v)
    state.clear()
  elif isinstance(state, list):
    for v in state:
      _clear(v)
    state.clear()


def _aliasing(lib, spec):
  """Whether states returned earlier change as the iterator goes on, and whether a state given to set_state
  and then emptied by the client changes the restored stream: (states changed, restored stream)."""
  it = iter(build(lib, spec))
  raw, frozen = [], []
  for _ in range(4):
    raw.append(it.get_state())
    frozen.append(copy.deepcopy(raw[-1]))
    next_canon(it)
  changed = [k for k, (a, b) in enumerate(zip(raw, frozen)) if repr(a) != repr(b)]
  again = iter(build(lib, spec))
  given = copy.deepcopy(frozen[1])
  again.set_state(given)
  _clear(given)
  return changed, stream(again, RES)


def _restate(lib, ds, states):
  """For states taken at some steps, set on a second iterator of the same dataset object: whether get_state()
  right after set_state gives the state back (a checkpoint saved right after a restore), and the stream after
  that state set on a third iterator."""
  out = []
  for k in sorted({1, len(states) - 1}):
    if k >= len(states):
      continue
    it = iter(ds)
    it.set_state(copy.deepcopy(states[k]))
    again = it.get_state()
    same = _normal(again) == _normal(states[k])
    third = iter(ds)
    third.set_state(copy.deepcopy(again))
    out.append((same, stream(third, RES)))
  return out


def _normal(state):
  return json.loads(state.decode()) if isinstance(state, bytes) else json.loads(json.dumps(state, default=repr))


def _bad_states(state) -> list:
  """States a client could hand over by mistake, derived from one of Grain's."""
  if isinstance(state, bytes):
    d = json.loads(state.decode())
    out = [b"{}", b"not json", None, b"[]"]
    for key in ("last_seen_indices", "sampler", "worker_count"):
      if key in d:
        out.append(json.dumps({k: v for k, v in d.items() if k != key}).encode())
    if "last_seen_indices" in d:  # Past the end, of this layout or not.
      out += [json.dumps({**d, "last_seen_indices": {"0": n}}).encode() for n in (10**6, 10**6 + 1)]
    return out
  out = [None, {}]
  if isinstance(state, dict):
    out.append({k: v for k, v in state.items() if k != next(iter(state), None)})
    if isinstance(state.get("next_index"), int):
      out += [{**state, "next_index": -1}, {**state, "next_index": 10**6}, {**state, "next_index": "1"}]
  return out


def _bad_restore(lib, spec, state):
  """The outcome of a bad state: its error's type, or the stream after it."""
  it = iter(build(lib, spec))
  try:
    it.set_state(copy.deepcopy(state))
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))
  return ("ok", stream(it, 2))


def _restored(fresh, state):
  it = fresh()
  try:
    it.set_state(state)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))
  return stream(it, RES)


def _deepcopy_outcome(lib, spec):
  it = iter(build(lib, spec))
  head = next_canon(it)
  try:
    twin = copy.deepcopy(it)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))
  return (head, stream(twin, 3), stream(it, 3))


def _handler(lib, step):
  """`grain.checkpoint.CheckpointHandler`, or the same class as `grain.python.PyGrainCheckpointHandler`."""
  return (lib.python.PyGrainCheckpointHandler if step % 2 else lib.checkpoint.CheckpointHandler)()


def _checkpoint(lib, spec, directory, step):
  """Saves with the library's CheckpointHandler after `step` elements; the elements after it, restored."""
  it = iter(build(lib, spec))
  for _ in range(step):
    next_canon(it)
  directory.mkdir(parents=True, exist_ok=True)
  _handler(lib, step).save(epath.Path(directory), item=it)
  want = stream(it, RES)
  return want


def _checkpoint_restore(lib, spec, directory, step):
  it = iter(build(lib, spec))
  try:
    _handler(lib, step).restore(epath.Path(directory), item=it)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))
  return stream(it, RES)


def _checkpoint_diffs(spec, tmp, step):
  diffs = []
  with deadline(GRAIN_TIMEOUT_S):
    g_want = _checkpoint(grain, spec, tmp / "grain", step)
    g_got = _checkpoint_restore(grain, spec, tmp / "grain", step)
  gc.collect()
  l_want = _checkpoint(loader, spec, tmp / "loader", step)
  l_got = _checkpoint_restore(loader, spec, tmp / "loader", step)
  if not same_stream(g_want, l_want):
    diffs.append(("checkpoint stream", g_want, l_want))
  if same_stream(g_got, g_want) and not same_stream(l_got, l_want):
    diffs.append(("checkpoint restore", l_want, l_got))
  g_on_l = _checkpoint_restore(loader, spec, tmp / "grain", step)
  if same_stream(g_got, g_want) and not (isinstance(g_on_l, tuple)
                                          and issubclass(g_on_l[1], loader.state.StateMismatchError)):
    if not same_stream(g_on_l, g_want):
      diffs.append(("grain checkpoint on loader", g_want, g_on_l))
  return diffs


def _view_diff(g, lo, data_loader: bool) -> bool:
  """A top-level number of Grain's that loader's state holds with another value, Grain's `next_index` missing
  from loader's state, or (a DataLoader's JSON, whose fields clients read) any of Grain's keys missing.

  An iterator-level `map_with_index` / `random_map` is folded into loader's random-access part (README,
  "Computing ahead"): its state is then the part's `{"next_index": ...}`, not Grain's
  `{"parent": ..., "counter" / "index_for_rng": ...}`; Grain's such states restore on loader.
  """
  if not isinstance(g, dict) or not isinstance(lo, dict):
    return g != lo
  if data_loader and set(g) - set(lo):
    return True
  if "next_index" in g and "next_index" not in lo:
    return True
  return any(k in lo and isinstance(v, (int, float)) and lo[k] != v for k, v in g.items())


def compare(spec, tmp):
  try:
    with deadline(GRAIN_TIMEOUT_S):
      g = observe(grain, spec)
  except Hang:
    return [], False
  gc.collect()
  try:
    with deadline(GRAIN_TIMEOUT_S * 4):
      lo = observe(loader, spec, g)
  except Hang:
    return [("loader hangs",)], True
  diffs = []
  for key in ("build", "len", "pickle", "unpickled", "getitem", "slices", "iter", "iter_is_it", "state_type", "json",
              "json_all", "after_end", "restored_end", "mid_to_end", "second", "deepcopy"):
    a, b = g.get(key), lo.get(key)
    if a is None and b is None:
      continue
    if key == "deepcopy" and isinstance(a, tuple) and a[0] == "raises":
      # Grain's refuses (its threads' locks); loader's refuses too, or (an iterator with nothing left to read
      # ahead) its copy goes on as the original does.
      ok = (isinstance(b, tuple) and b[0] == "raises") or (len(b) == 3 and same_stream(b[1], b[2]))
    elif key == "json_all":
      ok = b or not a
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and key != "len" and key != "pickle":
      ok = same_stream(list(a), list(b)) if key in ("getitem", "slices") else _nested_same(a, b)
    else:
      ok = same_outcome(a, b)
    if not ok:
      diffs.append((key, a, b))
  for k, (a, b) in enumerate(zip(g.get("bad_states", []), lo.get("bad_states", []))):
    # Loader may refuse a state Grain takes (README, "Checkpoint states"); where Grain raises, loader's error
    # must be an instance of Grain's type.
    if a[0] == "raises" and not same_outcome(a, b):
      diffs.append(("bad state", k, a, b))
    elif a[0] == "ok" and not (b[0] == "raises" and issubclass(b[1], loader.state.StateMismatchError)) \
        and not _nested_same(a, b):
      diffs.append(("bad state", k, a, b))
  if "stream" not in g or "stream" not in lo:
    return diffs, True
  grain_exact = not g["restore_bad"] and not g["rewind_bad"]
  if not same_stream(g["stream"], lo["stream"]):
    diffs.append(("stream", g["stream"], lo["stream"]))
  if lo["restore_bad"] or lo["rewind_bad"]:
    diffs.append(("loader restore at step", lo["restore_bad"][:3], lo["rewind_bad"]))
  if grain_exact and same_stream(g["stream"], lo["stream"]) and lo["other_states_bad"]:
    diffs.append(("grain state on loader at step", lo["other_states_bad"][:2]))
  dl = spec[0] == "dl"
  if _view_diff(g["view"], lo["view"], dl) or any(_view_diff(a, b, dl) for a, b in zip(g["views"], lo["views"])):
    diffs.append(("state view", g["views"][:4], lo["views"][:4]))
  if "aliasing" in lo:
    # Loader's states are snapshots and set_state copies what it is given, whatever Grain does (Grain's interleave
    # keeps the given lists: test_set_state_copies_the_state_where_grains_interleave_keeps_the_clients_lists).
    changed, after = lo["aliasing"]
    if changed or not matches(after, lo["stream"][1:1 + RES], RES):
      diffs.append(("aliasing", g.get("aliasing"), lo["aliasing"]))
  for k, (a, b) in enumerate(zip(g.get("restate", []), lo.get("restate", []))):
    # Each library on its own states: a state read back right after set_state restores the same stream, and is
    # the same state where Grain's is.
    if a[0] and not b[0]:
      diffs.append(("state after set_state", k, a, b))
  lo_want = [lo["stream"][k:k + RES] for k in sorted({1, len(lo["states"]) - 1})
             if k < len(lo["states"])]
  if [k for k, (b, w) in enumerate(zip(lo.get("restate", []), lo_want)) if not same_stream(b[1][:len(w)], w)]:
    diffs.append(("restore of the state read after set_state", lo["restate"], lo_want))
  if "json_restored" in lo:
    want = [lo["stream"][k:k + RES] for k in range(0, len(lo["states"]), 3)]
    bad = [k for k, (got, w) in enumerate(zip(lo["json_restored"], want)) if not same_stream(got[:len(w)], w)]
    if bad:
      diffs.append(("json round trip restore", bad))
  if grain_exact and same_stream(g["stream"], lo["stream"]):
    step = random.Random(repr(spec)).randint(0, len(g["stream"]))
    diffs += _checkpoint_diffs(spec, tmp, step)
  return diffs, True


def _nested_same(a, b) -> bool:
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_nested_same(x, y) for x, y in zip(a, b))
  return same_outcome(a, b)


# ---------------------------------------------------------------------------
# The seeded random-pipeline differential test.


@pytest.mark.parametrize("part", range(4))
def test_random_pipelines_checkpoint_and_iterate_as_grain(part, tmp_path):
  start = time.monotonic()
  failures, compared, n = [], 0, 0
  for i in range(part, N_CASES, 4):
    spec = gen(random.Random(f"{SEED}-{i}"))
    n += 1
    diffs, comparable = compare(spec, tmp_path / f"case{i}")
    gc.collect()  # Grain's used iterators go before the next case.
    compared += comparable
    if diffs:
      failures.append(f"case {i}: {spec!r}\n  " + "\n  ".join(repr(d)[:900] for d in diffs))
  assert not failures, f"{len(failures)} of {compared} pipelines differ:\n" + "\n".join(failures[:8])
  assert compared >= n * 9 // 10, (compared, n)
  assert time.monotonic() - start < 300  # A budget against a runaway case, not a speed test.


# ---------------------------------------------------------------------------
# Orbax's CheckpointManager with CheckpointSave / CheckpointRestore, on some of the generated pipelines.


def _orbax_round_trip(lib, spec, directory, step, restore_lib=None):
  """(the stream after `step` elements, the stream restored from `directory` by `restore_lib`'s args)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  it = iter(build(lib, spec))
  for _ in range(step):
    next_canon(it)
  with ocp.CheckpointManager(directory) as mngr:
    save = lib.python.PyGrainCheckpointSave if step % 2 else lib.checkpoint.CheckpointSave
    mngr.save(step, args=save(it))
    mngr.wait_until_finished()
  want = stream(it, RES + 2)
  restore_lib = restore_lib or lib
  again = iter(build(restore_lib, spec))
  with ocp.CheckpointManager(directory) as mngr:
    try:
      restore = restore_lib.python.PyGrainCheckpointRestore if step % 2 else restore_lib.checkpoint.CheckpointRestore
      mngr.restore(step, args=restore(again))
    except Exception as e:  # pylint: disable=broad-except
      return want, ("raises", type(e))
  return want, stream(again, RES + 2)


def _orbax_specs():
  """Generated pipelines whose Grain stream has no error (so Grain's own restores are exact)."""
  rng = random.Random(f"{SEED}-orbax")
  specs = []
  while len(specs) < 8:
    spec = gen(rng)
    if spec[0] == "dl" or spec[3] != "map":
      specs.append(spec)
  return specs


@pytest.mark.parametrize("k", range(8))
def test_orbax_checkpoint_manager_round_trip_as_grain(k, tmp_path):
  """Orbax's `CheckpointManager` saves an iterator with `grain.checkpoint.CheckpointSave` at a step and restores a
  fresh one with `CheckpointRestore`: loader's restored stream is Grain's, and loader's `CheckpointRestore` reads
  Grain's checkpoint (or refuses it with `StateMismatchError`, README "Checkpoint states")."""
  spec = _orbax_specs()[k]
  step = 1 + k % 3
  with deadline(GRAIN_TIMEOUT_S * 2):
    g_want, g_got = _orbax_round_trip(grain, spec, tmp_path / "grain", step)
  gc.collect()
  l_want, l_got = _orbax_round_trip(loader, spec, tmp_path / "loader", step)
  assert same_stream(g_want, l_want), (spec, g_want, l_want)
  assert same_stream(l_want, l_got), (spec, l_want, l_got)
  if same_stream(g_want, g_got):
    _, cross = _orbax_round_trip(grain, spec, tmp_path / "grain2", step, restore_lib=loader)
    gc.collect()
    assert same_stream(g_want, cross) or (cross[0] == "raises"
                                          and issubclass(cross[1], loader.state.StateMismatchError)), (spec, cross)


# ---------------------------------------------------------------------------
# Worker processes: states and checkpoints under mp_prefetch (two cases; workers are slow to start).


def _mp(lib, workers):
  ds = lib.MapDataset.range(11).shuffle(7).map(AddK(2)).batch(2).to_iter_dataset()
  return ds.mp_prefetch(lib.MultiprocessingOptions(num_workers=workers)).map(AddK(1))


@pytest.mark.parametrize("workers", [1])
def test_mp_prefetch_states_are_json_and_checkpoint_round_trip_as_grain(workers, tmp_path):
  """With an `mp_prefetch` worker: the same batches as Grain, states JSON-able as Grain's, and a `CheckpointHandler`
  save after 2 batches (loader's, and Grain's) restored by loader on a fresh iterator going on as the run did."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.
  out = {}
  for lib in (grain, loader):
    with deadline(60):
      it = iter(_mp(lib, workers))
      head = stream(it, 2)
      state = it.get_state()
      json.dumps(state)
      (tmp_path / lib.__name__).mkdir()
      lib.checkpoint.CheckpointHandler().save(epath.Path(tmp_path / lib.__name__), item=it)
      out[lib] = (head, stream(it, 8))
      it.close()
    gc.collect()
  assert out[loader] == out[grain]
  assert out[loader][1][-1] == "END"
  for saved_by in (loader, grain):  # With one worker, Grain's state resumes exactly on loader (README).
    again = iter(_mp(loader, workers))
    loader.checkpoint.CheckpointHandler().restore(epath.Path(tmp_path / saved_by.__name__), item=again)
    assert stream(again, 8) == out[grain][1], saved_by
    again.close()


# ---------------------------------------------------------------------------
# Regression tests: what this round found, minimized.


def _data_loader(lib, ops=()):
  sampler = lib.samplers.IndexSampler(num_records=7, shuffle=True, num_epochs=1, seed=1)
  return lib.DataLoader(data_source=ListSource("int", 7), sampler=sampler, operations=list(ops), worker_count=0)


@pytest.mark.parametrize("batch", [False, True])
def test_data_loader_pickles_where_grains_does_not(batch):
  """Not copied: Grain 0.2.18's `DataLoader` never pickles, by an accident of its implementation (a lambda local to
  `DataLoader._create_dataset`, or `_RecordBatchFn` local to `_apply_transform_to_dataset` with a `Batch`); loader's
  pickles and the copy gives the same batches. The iterators refuse to pickle in both (their threads' locks)."""

  def ops(lib):
    return [lib.transforms.Batch(2)] if batch else []

  with pytest.raises(AttributeError, match="Can't pickle local object"):
    pickle.dumps(_data_loader(grain, ops(grain)))
  want = [np.asarray(x).tolist() for x in _data_loader(grain, ops(grain))]
  copied = pickle.loads(pickle.dumps(_data_loader(loader, ops(loader))))
  assert [np.asarray(x).tolist() for x in copied] == want
  for lib in (grain, loader):
    it = iter(_data_loader(lib, ops(lib)))
    next(it)
    with pytest.raises((TypeError, AttributeError)):
      pickle.dumps(it)
  gc.collect()


def test_iterator_protocol_details_as_grain():
  """The protocol details the fuzz compares, on one pipeline: `iter(it) is it`; next() after the end keeps raising
  StopIteration, also after a set_state of the end state; a second iter(ds) starts over while the first goes on;
  a state is a snapshot (later next() calls do not change it) and JSON-able, with Grain's `next_index`; deepcopy
  of an iterator raises TypeError in both."""

  def run(lib):
    ds = lib.MapDataset.range(9).shuffle(4).map(AddK(1)).filter(Keep(3, 0)).to_iter_dataset()
    ds = lib.experimental.WithOptionsIterDataset(ds.seed(5), lib.experimental.DatasetOptions()).random_map(RandAdd())
    it = iter(ds)
    first = next(it)
    state = it.get_state()
    snapshot = json.loads(json.dumps(state))
    second = iter(ds)
    out = {"is": iter(it) is it, "restart": next(second) == first, "rest": [next(it) for _ in range(2)]}
    out["snapshot"] = json.loads(json.dumps(state)) == snapshot
    out["tail"] = list(it) + [next_canon(it), next_canon(it)]
    end = iter(ds)
    end.set_state(it.get_state())
    out["end"] = [next_canon(end) for _ in range(2)]
    with pytest.raises(TypeError):
      copy.deepcopy(it)
    out["next_index"] = {k: v for k, v in state.items() if k == "next_index"}
    return out

  expected = run(grain)
  gc.collect()
  assert expected["is"] and expected["restart"] and expected["snapshot"]
  assert expected["end"] == ["END", "END"] and expected["tail"][-2:] == ["END", "END"]
  assert run(loader) == expected


def test_set_state_copies_the_state_where_grains_interleave_keeps_the_clients_lists():
  """Not copied: Grain 0.2.18's `InterleaveIterDataset` iterator keeps the lists of the state given to `set_state`
  (`iterators_in_use_indices`, `exhausted`, ...) and goes on reading them, so a client that reuses or empties that
  dict afterwards gets an `IndexError` in place of the next input's first element. Loader's `set_state` copies
  what it is given: the stream is the one of an untouched state."""

  def run(lib, clear):
    ds = lib.experimental.InterleaveIterDataset([lib.MapDataset.range(4).to_iter_dataset(),
                                                 lib.MapDataset.range(10, 12).to_iter_dataset()], cycle_length=1)
    it = iter(ds)
    next(it)
    given = copy.deepcopy(it.get_state())
    fresh = iter(ds)
    fresh.set_state(given)
    if clear:
      _clear(given)
    return stream(fresh, 8)

  expected = run(grain, clear=False)
  assert expected == [("int", 1), ("int", 2), ("int", 3), ("int", 10), ("int", 11), "END"]
  assert run(grain, clear=True) == expected[:3] + [("ERR", IndexError)] + expected[3:]
  gc.collect()
  assert run(loader, clear=False) == expected
  assert run(loader, clear=True) == expected


def _sharded_data_loader(lib):
  sampler = lib.samplers.IndexSampler(num_records=9, shard_options=lib.sharding.ShardOptions(1, 2, False),
                                      shuffle=False, num_epochs=1, seed=1)
  return lib.DataLoader(data_source=ListSource("int", 9), sampler=sampler, worker_count=0)


def _set_state_outcome(lib, make, state: bytes):
  it = iter(make(lib))
  try:
    it.set_state(state)
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))
  return ("ok", stream(it, 5))


@pytest.mark.parametrize("drop", [None, "last_seen_indices", "sampler", "worker_count"])
def test_data_loader_state_without_grains_keys_raises_a_key_error_as_grain(drop):
  """Fixed: a DataLoader state without one of Grain's keys (`b"{}"`, or Grain's state less a key): Grain 0.2.18's
  `set_state` raises KeyError on the key; loader refused it with a `StateMismatchError` that was no KeyError, so
  a client's `except KeyError` missed it. Now a `StateKeyError` (both)."""
  full = json.loads(iter(_data_loader(grain)).get_state().decode())
  state = b"{}" if drop is None else json.dumps({k: v for k, v in full.items() if k != drop}).encode()
  expected = _set_state_outcome(grain, _data_loader, state)
  gc.collect()
  assert expected == ("raises", KeyError)
  got = _set_state_outcome(loader, _data_loader, state)
  assert got[0] == "raises" and issubclass(got[1], KeyError) and issubclass(got[1], loader.state.StateMismatchError)


@pytest.mark.parametrize("seen, grain_outcome", [
    (10**6, ("raises", IndexError)),  # Past the shard's end, of another layout: Grain's IndexError.
    (10**6 + 1, ("raises", IndexError)),  # Past the end, of this layout.
    (2, ("ok", [("int", 6), ("int", 7), ("int", 8), "END"])),  # Of another layout: Grain resumes somewhere.
])
def test_data_loader_state_of_another_shard_layout_raises_grains_types(seen, grain_outcome):
  """Fixed: a Grain DataLoader state of shard 1 of 2 whose `last_seen_indices` are not this shard's (edited, or of
  another shard). Past the shard's end Grain 0.2.18 raises IndexError ("Checkpoint `next_index` ... is out of
  range"); loader raised a plain ValueError for another layout. In range, Grain resumes at its floor division;
  loader refused with a plain ValueError, which is no `StateMismatchError` (README, "Checkpoint states")."""
  full = json.loads(iter(_sharded_data_loader(grain)).get_state().decode())
  state = json.dumps({**full, "last_seen_indices": {"0": seen}}).encode()
  assert _set_state_outcome(grain, _sharded_data_loader, state) == grain_outcome
  gc.collect()
  got = _set_state_outcome(loader, _sharded_data_loader, state)
  if grain_outcome[0] == "raises":
    assert got[0] == "raises" and issubclass(got[1], IndexError), got
  else:
    assert got == ("raises", loader.state.StateMismatchError)
