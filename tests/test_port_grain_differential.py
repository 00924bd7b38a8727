"""Differential fuzz test: random pipelines run on Grain 0.2.18 and on loader, compared.

A fixed seed generates `N_CASES` pipelines: a `MapDataset` source
(`MapDataset.range(n)` / `range(start, stop, step)`, `MapDataset.source` of a
list of ints or of dicts of numpy arrays; sizes 0, 1 and odd ones), or a
`mix` (with and without weights) / `concatenate` / `select_from_datasets` (a
round-robin `DatasetSelectionMap`) of 2-3 such sources with short chains;
then a random chain of `MapDataset` ops: `shuffle` with a seed or after
`seed()`, `seed`, slices `ds[a:b:c]` (negative and out-of-range bounds,
negative steps), `repeat(k)` and `repeat()`, `map` (a callable or a
`transforms.Map`; one that turns elements into tuples), `filter`,
`random_map`, `map_with_index` (callables or the transform classes), `batch`
(with and without `drop_remainder`, sometimes a `batch_fn`); then, for about
half, `to_iter_dataset()` with or without `ReadOptions` (0, 1, 2 or 16
threads, buffers 1, 4, 500) and a chain of `IterDataset` ops (`map`,
`filter`, `batch`, `random_map`, `map_with_index`, `seed`; all the ops
Grain 0.2.18's `IterDataset` has, but `mp_prefetch`/`prefetch`, which start
workers). Each pipeline is built from one description for `grain` and for
`loader` and compared on:

- the element stream (up to `CAP` elements): values, containers and dtypes;
- `len(ds)`, and `ds[i]` for indices in range, negative and past the length
  (Grain's epochs; for an infinite dataset also past int64) on a `MapDataset`;
- checkpoints: `get_state()` at a random step, then a new iterator given that
  state must go on as the original did and end in the same state (on each
  library), and Grain's state given to loader's iterator must go on as
  Grain's did, unless loader refuses it with `StateMismatchError` (README,
  "Checkpoint states": Grain states are accepted only where the resume is
  exact; the test counts refusals, none at present);
- the error for invalid ops (`batch(0)`/`batch(-1)` on both levels, a slice
  step of 0, `repeat(0)`/`repeat(-1)`, an empty `mix`, weights of another
  count or a zero weight, a shuffle or random map without a seed, reading an
  empty dataset, a `MapDataset.batch` after a filter): both raise at the same
  point (building, `len()`, iterating or `ds[i]`), and loader's error is an
  instance of Grain's error type (loader may raise a subclass with a clearer
  message).

Not generated, because README's "Deliberate differences" documents them:
worker processes (`mp_prefetch`: per-worker streams), negative `seed()`
values and negative mix weights (loader refuses them), bytes/str leaves in
batches, maps that raise or raise `StopIteration` (only a batch of
mismatched shapes fails mid-stream here, compared by error type), maps
returning `None` after `to_iter_dataset()`, maps changing their input in
place, and shuffles of 2**16+1 or more records. Filters after an infinite
`repeat()` are left out: one that drops every element makes both streams
hang. One Grain bug is not replicated and is counted apart
(`grain_len_overflow`): Grain computes some lengths of infinite datasets past
sys.maxsize (`ds.repeat().batch(1)`: a float's ceil, 2**63), which `len()`
and so `iter()` refuse with an OverflowError, where loader caps the length.

A failing case names its index and its description, which reads like the
code building it; `build(lib, _case(i))` rebuilds case `i`. The regression
tests at the end are the differences this fuzz found, minimized.
"""

from __future__ import annotations

import itertools
import random
import sys
import warnings

import numpy as np
import pytest

grain = pytest.importorskip("grain")
import loader  # pylint: disable=g-import-not-at-top,wrong-import-position
from loader import state as loader_state  # pylint: disable=wrong-import-position

LIBS = {"grain": grain, "loader": loader}
SEED = 20260612
N_CASES = 1000
CAP = 60  # Elements compared per stream (an infinite repeat is cut there).
RESUME = 8  # Elements compared after a restored state.


# ---------------------------------------------------------------------------
# Element functions, shared by both libraries (pure, deterministic).


def _tree(f, x):
  """`f` applied to every numeric leaf of `x` (dicts, tuples, lists, arrays, numbers)."""
  if isinstance(x, dict):
    return {k: _tree(f, v) for k, v in x.items()}
  if isinstance(x, tuple):
    return tuple(_tree(f, v) for v in x)
  if isinstance(x, list):
    return [_tree(f, v) for v in x]
  return f(x)


def _total(x) -> int:
  if isinstance(x, dict):
    return sum(_total(v) for v in x.values())
  if isinstance(x, (tuple, list)):
    return sum(_total(v) for v in x)
  return int(np.sum(x))


def _adder(k):
  return lambda x: _tree(lambda v: v + k, x)


def _keeper(m, r):
  return lambda x: _total(x) % m != r


def _random_adder(x, rng):
  k = int(rng.integers(0, 1000))
  return _tree(lambda v: v + k, x)


def _index_adder(i, x):
  return _tree(lambda v: v + 1000 * i, x)


def _pair(x):
  return (x, _tree(lambda v: v * 2, x))


def _stack_as_list(xs):  # A batch_fn.
  return [_tree(lambda v: v + 1, x) for x in xs]


def _map_transform(lib, k):
  return type("AddK", (lib.transforms.Map,), {"map": lambda self, x: _adder(k)(x)})()


def _filter_transform(lib, m, r):
  return type("Keep", (lib.transforms.Filter,), {"filter": lambda self, x: _keeper(m, r)(x)})()


def _random_map_transform(lib):
  return type("RandomAdd", (lib.transforms.RandomMap,), {"random_map": lambda self, x, rng: _random_adder(x, rng)})()


def _index_map_transform(lib):
  return type("IndexAdd", (lib.transforms.MapWithIndex,), {"map_with_index": lambda self, i, x: _index_adder(i, x)})()


def _round_robin(lib, n_children, length):
  """A selection map taking the children in turn (any index: Grain passes past-the-end ones on)."""

  def getitem(self, index):
    return index % n_children, index // n_children

  return type("RoundRobin", (lib.transforms.DatasetSelectionMap,), {
      "__len__": lambda self: length, "__getitem__": getitem})()


# ---------------------------------------------------------------------------
# Pipeline specs: nested tuples, turned into a dataset for either library.


def _source_len(src) -> int:
  kind = src[0]
  if kind == "range":
    return len(range(*src[1:]))
  return len(src[1]) if kind == "ints" else src[1]


def _build_source(lib, src):
  kind = src[0]
  if kind == "range":
    return lib.MapDataset.range(*src[1:])
  if kind == "ints":
    return lib.MapDataset.source(list(src[1]))
  n = src[1]
  return lib.MapDataset.source([{"x": np.array([i, 2 * i, 3], dtype=np.int32), "y": np.int64(i)}
                                for i in range(n)])


def _describe_source(src) -> str:
  kind = src[0]
  if kind == "range":
    return f"MapDataset.range({', '.join(map(str, src[1:]))})"
  if kind == "ints":
    return f"MapDataset.source({list(src[1])})"
  return f"MapDataset.source(dicts({src[1]}))"


def _apply(lib, ds, op):
  name, args = op[0], op[1:]
  if name == "shuffle":
    return ds.shuffle(seed=args[0]) if args[0] is not None else ds.shuffle()
  if name == "seed":
    return ds.seed(args[0])
  if name == "slice":
    return ds[slice(*args)]
  if name == "repeat":
    return ds.repeat(args[0])
  if name == "map":
    return ds.map(_map_transform(lib, args[0]) if args[1] else _adder(args[0]))
  if name == "pair":
    return ds.map(_pair)
  if name == "filter":
    return ds.filter(_filter_transform(lib, *args[:2]) if args[2] else _keeper(*args[:2]))
  if name == "random_map":
    fn = _random_map_transform(lib) if args[1] else _random_adder
    return ds.random_map(fn, seed=args[0]) if args[0] is not None else ds.random_map(fn)
  if name == "map_with_index":
    return ds.map_with_index(_index_map_transform(lib) if args[0] else _index_adder)
  if name == "batch":
    return ds.batch(args[0], drop_remainder=args[1], batch_fn=_stack_as_list if args[2] else None)
  if name == "to_iter":
    if args[0] is None:
      return ds.to_iter_dataset()
    return ds.to_iter_dataset(lib.ReadOptions(num_threads=args[0], prefetch_buffer_size=args[1]))
  raise ValueError(op)


def _describe_op(op) -> str:
  name, args = op[0], op[1:]
  if name == "shuffle":
    return f".shuffle(seed={args[0]})" if args[0] is not None else ".shuffle()"
  if name == "slice":
    return "[" + ":".join("" if a is None else str(a) for a in args) + "]"
  if name == "map":
    return f".map({'AddK' if args[1] else 'add'}({args[0]}))"
  if name == "pair":
    return ".map(lambda x: (x, 2 * x))"
  if name == "filter":
    return f".filter({'Keep' if args[2] else 'lambda x: '}(total(x) % {args[0]} != {args[1]}))"
  if name == "random_map":
    fn = "RandomAdd()" if args[1] else "random_add"
    return f".random_map({fn}, seed={args[0]})" if args[0] is not None else f".random_map({fn})"
  if name == "map_with_index":
    return f".map_with_index({'IndexAdd()' if args[0] else 'index_add'})"
  if name == "batch":
    return f".batch({args[0]}, drop_remainder={args[1]}{', batch_fn=add_one_to_list' if args[2] else ''})"
  if name == "to_iter":
    if args[0] is None:
      return ".to_iter_dataset()"
    return f".to_iter_dataset(ReadOptions(num_threads={args[0]}, prefetch_buffer_size={args[1]}))"
  return f".{name}({', '.join(map(repr, args))})"


def _build_base(lib, base):
  kind = base[0]
  if kind == "source":
    return _build_source(lib, base[1])
  children = [_build_chain(lib, c) for c in base[1]]
  if kind == "mix":
    return lib.MapDataset.mix(children, base[2]) if base[2] is not None else lib.MapDataset.mix(children)
  if kind == "concat":
    return lib.MapDataset.concatenate(children)
  if kind == "select":
    return lib.MapDataset.select_from_datasets(children, _round_robin(lib, len(children), len(children) * base[2]))
  raise ValueError(base)


def _describe_base(base) -> str:
  kind = base[0]
  if kind == "source":
    return _describe_source(base[1])
  children = ", ".join(_describe_chain(c) for c in base[1])
  if kind == "mix":
    return f"MapDataset.mix([{children}]{'' if base[2] is None else f', {base[2]}'})"
  if kind == "concat":
    return f"MapDataset.concatenate([{children}])"
  return f"MapDataset.select_from_datasets([{children}], RoundRobin(rounds={base[2]}))"


def _build_chain(lib, chain):
  base, ops = chain
  ds = _build_base(lib, base)
  for op in ops:
    ds = _apply(lib, ds, op)
  return ds


def _describe_chain(chain) -> str:
  base, ops = chain
  return _describe_base(base) + "".join(_describe_op(op) for op in ops)


# ---------------------------------------------------------------------------
# Random generation.


def _random_source(rng: random.Random):
  n = rng.choice([0, 1, 1, 2, 3, 5, 7, 8, 10, 13, 16, 21, 31])
  kind = rng.choice(["range", "range", "ints", "dicts"])
  if kind == "range":
    if rng.random() < 0.3:
      start, step = rng.randint(-5, 5), rng.choice([1, 2, 3])
      return ("range", start, start + n * step, step)
    return ("range", n)
  if kind == "ints":
    return ("ints", tuple(rng.randint(-50, 50) for _ in range(n)))
  return ("dicts", n)


def _random_map_op(rng: random.Random, seeded: bool, allow_batch: bool, allow_infinite: bool, invalid: bool):
  """One MapDataset op; returns (op, seeded after it)."""
  choices = ["shuffle", "seed", "slice", "repeat", "map", "filter", "random_map", "map_with_index", "pair"]
  weights = [3, 1, 3, 2, 3, 2, 2, 2, 1]
  if allow_batch:
    choices.append("batch")
    weights.append(3)
  name = rng.choices(choices, weights)[0]
  if name == "shuffle":
    use_default = seeded and rng.random() < 0.4
    return ("shuffle", None if use_default or (invalid and not seeded) else rng.randrange(2**32)), seeded
  if name == "seed":
    return ("seed", rng.randrange(2**40)), True
  if name == "slice":
    pick = lambda: rng.choice([None, None, 0, 1, 2, 3, 5, -1, -2, -4, 40])
    step = 0 if invalid else rng.choice([None, 1, 1, 2, 3, -1, -2])
    return ("slice", pick(), pick(), step), seeded
  if name == "repeat":
    if invalid:
      return ("repeat", rng.choice([0, -1])), seeded
    return ("repeat", None if allow_infinite and rng.random() < 0.15 else rng.randint(1, 3)), seeded
  if name == "map":
    return ("map", rng.randint(1, 9), rng.random() < 0.3), seeded
  if name == "filter":
    return ("filter", rng.choice([2, 3, 5]), rng.randint(0, 1), rng.random() < 0.3), seeded
  if name == "random_map":
    use_default = (seeded and rng.random() < 0.5) or (invalid and not seeded)
    return ("random_map", None if use_default else rng.randrange(2**32), rng.random() < 0.3), seeded
  if name == "map_with_index":
    return ("map_with_index", rng.random() < 0.3), seeded
  if name == "pair":
    return ("pair",), seeded
  size = rng.choice([0, -1]) if invalid else rng.choice([1, 2, 3, 4, 5])
  return ("batch", size, rng.random() < 0.4, rng.random() < 0.15), seeded


def _random_chain(rng: random.Random, depth: int, invalid_at: int | None):
  """(base, ops) of a MapDataset; `invalid_at`: the op index made invalid (or None)."""
  if depth == 0 and rng.random() < 0.25:
    k = rng.choice([2, 2, 3])
    kind = rng.choice(["mix", "concat", "select"])
    if kind == "concat" or rng.random() < 0.5:  # Children of one element kind, so batches stack.
      src = _random_source(rng)
      sources = [(src[0], *src[1:]) for _ in range(k)]
      if src[0] == "ints":
        sources = [("ints", tuple(rng.randint(-50, 50) for _ in range(len(src[1])))) for _ in range(k)]
    else:
      kind0 = rng.choice(["range", "dicts"])
      sources = []
      for _ in range(k):
        s = _random_source(rng)
        sources.append(("range", _source_len(s)) if kind0 == "range" else ("dicts", _source_len(s)))
    children = []
    for s in sources:
      ops = []
      for _ in range(rng.randint(0, 2)):
        op, _ = _random_map_op(rng, False, allow_batch=False, allow_infinite=False, invalid=False)
        if (op[0] in ("shuffle", "random_map") and op[1] is None) or op[0] == "pair":
          continue
        ops.append(op)
      children.append((("source", s), ops))
    lens = [_source_len(s) for s in sources]
    if kind == "mix":
      weights = None if rng.random() < 0.4 else [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(k)]
      if invalid_at == -1:
        weights = rng.choice([[], [1.0] * (k + 1), [0.0] + [1.0] * (k - 1)])
        if not weights:
          children = []
      base = ("mix", children, weights)
    elif kind == "concat":
      base = ("concat", children)
    else:
      base = ("select", children, min(lens) if min(lens) else 0)
  else:
    base = ("source", _random_source(rng))
  ops, seeded = [], False
  for j in range(rng.choice([0, 1, 2, 3, 3, 4, 5])):
    op, seeded = _random_map_op(rng, seeded, allow_batch=True, allow_infinite=True, invalid=(j == invalid_at))
    ops.append(op)
  return base, _finite_filters(ops)


def _finite_filters(ops):
  """`ops` without the filters after an infinite repeat (one that drops all would make the stream hang)."""
  out, infinite = [], False
  for op in ops:
    infinite = infinite or op == ("repeat", None)
    if not (infinite and op[0] == "filter"):
      out.append(op)
  return out


def _random_iter_ops(rng: random.Random, invalid: bool):
  ops = []
  for _ in range(rng.choice([0, 1, 1, 2, 3])):
    name = rng.choice(["map", "filter", "batch", "batch", "random_map", "map_with_index", "seed", "pair"])
    if name == "map":
      ops.append(("map", rng.randint(1, 9), rng.random() < 0.3))
    elif name == "filter":
      ops.append(("filter", rng.choice([2, 3, 5]), rng.randint(0, 1), rng.random() < 0.3))
    elif name == "batch":
      ops.append(("batch", rng.choice([1, 2, 3, 4]), rng.random() < 0.4, rng.random() < 0.15))
    elif name == "random_map":
      ops.append(("random_map", rng.randrange(2**32), rng.random() < 0.3))
    elif name == "map_with_index":
      ops.append(("map_with_index", rng.random() < 0.3))
    elif name == "pair":
      ops.append(("pair",))
    else:
      ops.append(("seed", rng.randrange(2**40)))
  if invalid:
    ops.append(("batch", rng.choice([0, -3]), False, False))
  return ops


def _case(i: int):
  """Case `i`: (MapDataset chain, to_iter op or None, IterDataset ops, the resume step's fraction)."""
  rng = random.Random(SEED * 100_003 + i)
  invalid = rng.random() < 0.08
  where = rng.choice(["map", "mix", "iter"]) if invalid else None
  invalid_at = (-1 if where == "mix" else (rng.randint(0, 2) if where == "map" else None))
  chain = _random_chain(rng, 0, invalid_at)
  to_iter = None
  iter_ops = []
  if rng.random() < 0.5 or where == "iter":
    to_iter = ("to_iter", rng.choice([None, 0, 1, 2, 16]), rng.choice([1, 4, 500]))
    iter_ops = _random_iter_ops(rng, where == "iter")
    if ("repeat", None) in chain[1]:
      iter_ops = [op for op in iter_ops if op[0] != "filter"]
  return chain, to_iter, iter_ops, rng.random()


def describe(case) -> str:
  chain, to_iter, iter_ops, _ = case
  text = _describe_chain(chain)
  if to_iter is not None:
    text += _describe_op(to_iter) + "".join(_describe_op(op) for op in iter_ops)
  return text


def build(lib, case):
  chain, to_iter, iter_ops, _ = case
  ds = _build_chain(lib, chain)
  if to_iter is not None:
    ds = _apply(lib, ds, to_iter)
    for op in iter_ops:
      if op[0] == "seed":
        ds = ds.seed(op[1])
      else:
        ds = _apply(lib, ds, op)
  return ds


# ---------------------------------------------------------------------------
# Running and comparing.


def canon(x):
  """A comparable form of an element: values, container kinds and numpy dtypes."""
  if isinstance(x, np.ndarray):
    return ("ndarray", x.dtype.str, x.shape, canon(x.tolist()) if x.dtype != object else [canon(v) for v in x.flat])
  if isinstance(x, np.generic):
    return ("np", x.dtype.str, x.item())
  if isinstance(x, dict):
    return ("dict", [(k, canon(v)) for k, v in x.items()])
  if isinstance(x, (tuple, list)):
    return (type(x).__name__, [canon(v) for v in x])
  if isinstance(x, bool) or x is None:
    return x
  if isinstance(x, int):
    return ("int", x)
  return (type(x).__name__, x)


def _error(e: BaseException):
  return ("raises", type(e), str(e)[:200])


def _grain_length_overflow(obs) -> bool:
  """Grain's length of a dataset computed past sys.maxsize, which len() refuses (see compare)."""
  return (isinstance(obs, tuple) and obs[0] == "raises" and obs[1] is OverflowError
          and "index-sized integer" in obs[2])


def _attempt(f):
  try:
    return f()
  except Exception as e:  # pylint: disable=broad-except
    return _error(e)


def _take(it, n):
  out = []
  for x in itertools.islice(it, n):
    out.append(canon(x))
  return out


def _close(it):
  close = getattr(it, "close", None)
  if close is not None:
    close()


def observe(lib, case):
  """What the pipeline does on `lib`: a dict of comparable observations, and the Grain-side state."""
  obs = {}
  try:
    ds = build(lib, case)
  except Exception as e:  # pylint: disable=broad-except
    return {"build": _error(e)}, None
  is_map = isinstance(ds, lib.MapDataset)
  obs["len"] = _attempt(lambda: len(ds)) if is_map else "iter"
  if isinstance(obs["len"], tuple):
    return obs, ds
  n = obs["len"] if is_map else None
  it = _attempt(lambda: iter(ds))
  stream = it if isinstance(it, tuple) else _attempt(lambda: _take(it, CAP))
  if not isinstance(it, tuple):
    _close(it)
  obs["stream"] = stream
  if is_map and n is not None:
    # Past the end and negative: Grain's epochs; for an infinite dataset (len
    # sys.maxsize or a batch's float-rounded share of it) past int64 too.
    indices = list(range(min(n, CAP)))
    indices += [n - 1, n - 2, -1, -2, -n, -n - 1, n, n + 1, 2 * n + 3] if n else [0, -1, 3]
    obs["getitem"] = [(i, _attempt(lambda i=i: canon(ds[i]))) for i in indices]
  obs["stream_len"] = len(stream) if isinstance(stream, list) else None
  return obs, ds


def _resume(lib_ds, state, count, with_state=False):
  it = iter(lib_ds)
  try:
    it.set_state(state)
    taken = _take(it, count)
    return (taken, it.get_state()) if with_state else taken
  finally:
    _close(it)


def check_states(case, desc, grain_ds, loader_ds, total):
  """get_state at a step k; a new iterator from that state goes on alike (each lib, and Grain's on loader)."""
  k = int(case[3] * (total + 1))
  rests, states = {}, {}
  for name, ds in (("grain", grain_ds), ("loader", loader_ds)):
    it = iter(ds)
    _take(it, k)
    states[name] = it.get_state()
    rests[name] = _take(it, RESUME)
    end_state = it.get_state()
    _close(it)
    again, again_state = _resume(ds, states[name], RESUME, with_state=True)
    assert again == rests[name], f"{name}: restored state goes on differently at step {k}: {desc}"
    assert canon(again_state) == canon(end_state), f"{name}: restored iterator's state differs at step {k}: {desc}"
  assert rests["loader"] == rests["grain"], f"streams after step {k} differ: {desc}"
  try:
    cross = _resume(loader_ds, states["grain"], RESUME)
  except loader_state.StateMismatchError:
    return "refused"
  assert cross == rests["grain"], f"Grain's state at step {k} restored on loader goes on differently: {desc}"
  return "resumed"


def _compare_errors(g, l, what, desc):
  if isinstance(g, tuple) and g and g[0] == "raises":
    assert isinstance(l, tuple) and l and l[0] == "raises", (
        f"{what}: Grain raises {g[1].__name__} ({g[2]}), loader gives {l!r}: {desc}")
    assert issubclass(l[1], g[1]), (f"{what}: Grain raises {g[1].__name__} ({g[2]}), loader {l[1].__name__} "
                                    f"({l[2]}): {desc}")
    return True
  return False


def compare(case, desc, stats):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    g_obs, g_ds = observe(grain, case)
    l_obs, l_ds = observe(loader, case)
  if any(_grain_length_overflow(g_obs.get(k)) for k in ("build", "len", "stream")):
    # Grain computes some lengths of infinite datasets past sys.maxsize (`batch(1)`: ceil(sys.maxsize / 1)
    # as a float is 2**63), which len() and so iter() refuse with an OverflowError; loader caps that one at
    # sys.maxsize and goes on (a Grain bug, not replicated), or raises the same error (a repeat of such a
    # slice: when to_iter_dataset() is called, Grain's at iter()).
    assert any(_grain_length_overflow(l_obs.get(k)) for k in ("build", "len", "stream")) or (
        l_obs["len"] == "iter" or l_obs["len"] <= sys.maxsize), desc
    stats["grain_len_overflow"] += 1
    return
  if "build" in g_obs or "build" in l_obs:
    stats["build_error"] += 1
    assert "build" in g_obs, f"loader raises {l_obs['build'][1].__name__} when built, Grain does not: {desc}"
    assert "build" in l_obs, f"Grain raises {g_obs['build'][1].__name__} when built, loader does not: {desc}"
    _compare_errors(g_obs["build"], l_obs["build"], "build", desc)
    return
  if not _compare_errors(g_obs["len"], l_obs["len"], "len", desc):
    assert g_obs["len"] == l_obs["len"], f"len: Grain {g_obs['len']}, loader {l_obs['len']}: {desc}"
  if "stream" not in g_obs or "stream" not in l_obs:  # len() raised on both.
    stats["len_error"] += 1
    return
  if not _compare_errors(g_obs["stream"], l_obs["stream"], "iteration", desc):
    assert l_obs["stream"] == g_obs["stream"], (
        f"streams differ: {desc}\ngrain:  {g_obs['stream']}\nloader: {l_obs['stream']}")
  else:
    stats["stream_error"] += 1
    return
  for (i, g), (_, l) in zip(g_obs.get("getitem", []), l_obs.get("getitem", [])):
    if not _compare_errors(g, l, f"ds[{i}]", desc):
      assert l == g, f"ds[{i}] differs: {desc}\ngrain:  {g}\nloader: {l}"
  stats["cases"] += 1
  stats[check_states(case, desc, g_ds, l_ds, g_obs["stream_len"])] += 1


def test_random_pipelines_match_grain():
  stats = {"cases": 0, "build_error": 0, "stream_error": 0, "refused": 0, "resumed": 0, "grain_len_overflow": 0,
           "len_error": 0}
  for i in range(N_CASES):
    case = _case(i)
    compare(case, f"case {i}: {describe(case)}", stats)
  print(stats)
  # The generator must keep exercising what it is meant to.
  assert stats["cases"] > 800 and stats["build_error"] > 50 and stats["resumed"] > 700, stats


# ---------------------------------------------------------------------------
# Regressions: the differences this fuzz found, each minimized.


def _both(make):
  """make(lib) on Grain and on loader: (value, or the error's type) each."""
  out = []
  for lib in (grain, loader):
    try:
      out.append(canon(make(lib)))
    except Exception as e:  # pylint: disable=broad-except
      out.append(type(e))
  return out


@pytest.mark.parametrize("make", [
    lambda lib: lib.MapDataset.range(0)[0],
    lambda lib: lib.MapDataset.source([])[-1],
    lambda lib: lib.MapDataset.range(5)[5:][0],
    lambda lib: lib.MapDataset.range(0).shuffle(seed=1).batch(2)[3],
    lambda lib: lib.MapDataset.concatenate([lib.MapDataset.range(0)])[0],
])
def test_reading_an_empty_dataset_raises_grains_zero_division_error(make):
  # Grain takes the index modulo the length 0; loader's IndexError is now also that ZeroDivisionError.
  with pytest.raises(ZeroDivisionError):
    make(grain)
  with pytest.raises(ZeroDivisionError):
    make(loader)
  with pytest.raises(IndexError):
    make(loader)


@pytest.mark.parametrize("weights", [[1.0], [1.0, 2.0, 3.0]])
def test_mix_weights_of_another_count_raise_grains_assertion_error(weights):
  for lib in (grain, loader):
    with pytest.raises(AssertionError):
      lib.MapDataset.mix([lib.MapDataset.range(3), lib.MapDataset.range(4)], weights)
    with pytest.raises(AssertionError):
      lib.IterDataset.mix([lib.MapDataset.range(3).to_iter_dataset(), lib.MapDataset.range(4).to_iter_dataset()],
                          weights)
  with pytest.raises(ValueError):
    loader.MapDataset.mix([loader.MapDataset.range(3), loader.MapDataset.range(4)], weights)


@pytest.mark.parametrize("sl, index", [(slice(-4, -2, 3), -2), (slice(-4, -2, 3), -3), (slice(-4, -2, 1), -3)])
def test_negative_epoch_of_a_slice_of_an_infinite_dataset(sl, index):
  # Epoch -2 of the slice starts below int64 in Grain's Python ints; int64 wrapped it to another element.
  g, l = _both(lambda lib: lib.MapDataset.range(3).repeat()[sl][index])
  assert l == g


@pytest.mark.parametrize("index", [2**63 + 4, 2**64, -2**64])
@pytest.mark.parametrize("op", ["plain", "shuffle", "batch", "slice"])
def test_index_past_int64_reads_grains_epoch(index, op):
  def make(lib):
    ds = lib.MapDataset.range(5).repeat()
    ds = {"plain": ds, "shuffle": ds.shuffle(seed=3), "batch": ds.batch(3), "slice": ds[-7::2]}[op]
    return ds[index]

  g, l = _both(make)
  assert l == g and not isinstance(g, type)


def test_random_map_index_past_uint64_raises_grains_overflow_error():
  # Grain's generator takes the index in a uint64 counter word; past it, Philox's wider counter took it.
  for lib in (grain, loader):
    ds = lib.MapDataset.range(5).repeat().random_map(_random_adder, seed=1)[::3]
    with pytest.raises(OverflowError):
      ds[2 * len(ds) + 1]  # Parent index 2 * sys.maxsize + 3 = 2**64 + 1.


@pytest.mark.parametrize("size, at", [(4, -1), (4, -2), (4, "last"), (4, "last-1"), (5, "last"), (5, -1)])
@pytest.mark.parametrize("batch_fn", [None, _stack_as_list])
def test_last_batches_of_an_infinite_dataset(size, at, batch_fn):
  # sys.maxsize records, batched: the last batch is partial (int64 overflowed computing its end), and
  # Grain's length (a float's ceil) may count batches past the end, which batch no elements.
  def make(lib):
    ds = lib.MapDataset.range(16).repeat().batch(size, batch_fn=batch_fn)
    i = {"last": len(ds) - 1, "last-1": len(ds) - 2}.get(at, at)
    return ds[i]

  g, l = _both(make)
  assert l == g


def test_selection_map_keys_past_int64():
  # Grain passes the selection map's keys on as Python ints; loader's int64 refused them.
  def make(lib):
    sel = lib.MapDataset.select_from_datasets([lib.MapDataset.range(4), lib.MapDataset.range(16).shuffle(seed=2)],
                                              _round_robin(lib, 2, 32))
    return [sel[2**64 + 10], sel[2**64 + 11], sel.repeat().shuffle(seed=1).batch(2).batch(5)[2**62 + 3]]

  g, l = _both(make)
  assert l == g and not isinstance(g, type)


def test_negative_index_of_an_empty_selection_reads_through_the_selection_map():
  # A selection map of length 0 still maps -1 (to dataset 1, key -1): Grain reads it, as loader now does.
  def make(lib):
    ds = lib.MapDataset.select_from_datasets([lib.MapDataset.range(2), lib.MapDataset.range(3)],
                                             _round_robin(lib, 2, 0)).map_with_index(_index_adder)
    return len(ds), ds[-1]

  g, l = _both(make)
  assert l == g == canon((0, -1000 + 2))


def test_grain_state_through_an_iterator_level_seed_resumes_on_loader():
  # IterDataset.seed() passes its parent's iterator on, in both: Grain's state was refused though exact.
  def make(lib):
    return lib.MapDataset.range(10).to_iter_dataset().map(_adder(1)).batch(2).seed(7)

  theirs = iter(make(grain))
  next(theirs)
  state = theirs.get_state()
  ours = iter(make(loader))
  ours.set_state(state)
  assert [canon(x) for x in ours] == [canon(x) for x in theirs]
