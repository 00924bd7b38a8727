"""Differential fuzz round 31 against Grain 0.2.18: LLM-style packing pipelines over the whole space of options.

Round 29 packed short token sequences (one or two features of one length, every document shorter than the
sequence length) straight from a source. What this round generates, each pipeline built from one description
for `grain` and for `loader`:

- documents of several features whose lengths differ within a document (int32 / int64 tokens, float32 rows of
  shape (T, 2), bool masks, 0-d scalars, a per-document `lang` id and a `doc` id used as meta features, extra
  features that the packer drops), some of them longer than the sequence length (Grain's ValueError in place
  of an element, and the stream going on after it);
- a pre-packing part: a mixture (`MapDataset.mix` or `IterDataset.mix`, list or dict, with or without weights)
  of two such sources, `shuffle`, `repeat`, `filter`, `map`, `WindowShuffleIterDataset`, `LimitIterDataset`;
- `FirstFitPackIterDataset` / `BestFitPackIterDataset` with `num_packing_bins`, `seed`, `shuffle_bins`,
  `shuffle_bins_group_by_feature`, sequence and non-sequence `meta_features`, `pack_alignment_struct`,
  `padding_struct`, `max_sequences_per_bin`; `ConcatThenSplitIterDataset` with `meta_features`,
  `split_full_length_features` and `REPLACE_FIRST_TOKEN_WITH_BOS`;
- a post-packing part: `batch` (with `drop_remainder`), a second packer, `map`, `LimitIterDataset`.

Each is compared on: the phase of an error (build / iter / next); the element stream (values, container types,
numpy dtypes and shapes, object arrays of meta features; an error's type in place of an element); a state taken
before every element restored on a fresh iterator of a newly built pipeline (each library on its own states) and
on the used iterator; Grain's states restored on loader (refusal with `StateMismatchError` allowed, README
"Checkpoint states"). Where Grain's own restores do not go on as its run, loader's restores are compared with
Grain's restores.

Documented differences (README) are not generated: `REPLACE_FIRST_TOKEN_WITH_BOS` on a feature shorter than
another (only generated with one sequence feature), an error upstream of a window shuffle (no failing maps; the
packer's too-long errors are downstream of it), an error under `IterDataset.mix`. Where Grain's restores do not go
on as its run because of an error in the stream, loader's may go on exactly instead (README, "An element whose
computation raises").

Generated per run: N_CASES (150) pipelines in 4 parts. The regression tests at the end are the differences this
round found, minimized:

- fixed: a packer whose input's elements were all too long: at the input's end Grain raises IndexError at every
  later `next` (its empty packed batch), loader raised a ValueError;
- fixed: a too-long element was raised again when a restore re-packed its window; a packer over a packer then
  counted that error as one of its input rows and gave an extra packed row after a restore (Grain: the end). A
  too-long element is now consumed and counted like an input element that failed;
- not fixed, pinned on both sides: `ConcatThenSplitIterDataset` with a 0-d feature that is no meta feature and
  fills its length before the others (Grain's PyGrainInternalError, "a bug in ConcatThenSplit..."; loader packs
  it as a length-1 sequence); left out of the fuzz by `_grain_cts_scalar_bug`.
"""

from __future__ import annotations

import copy
import gc
import logging
import random
import time

import numpy as np
import pytest

grain = pytest.importorskip("grain")
import grain.experimental  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import loader  # pylint: disable=g-import-not-at-top,wrong-import-position
from grain._src.core import exceptions as grain_exceptions  # pylint: disable=g-import-not-at-top,wrong-import-position
from fuzz_elements import (Hang, adder as _adder, deadline, keeper as _keeper,  # pylint: disable=unused-import
                           quiet as _quiet)
from fuzz_elements import observe_both, observe_iteration
from fuzz_elements import is_error as _is_error, same_outcome as _same_outcome, same_stream as _same_stream

SEED = 2031
N_CASES = 150
CAP = 16  # Elements compared per stream.
RES = 4  # Elements compared after a restore.
GRAIN_TIMEOUT_S = 10


# ---------------------------------------------------------------------------
# Documents and pipelines, built from one description for both libraries.

_KINDS = {
    "tok": lambda n, base: np.arange(n, dtype=np.int32) + base,
    "tok64": lambda n, base: np.arange(n, dtype=np.int64) * 3 + base,
    "emb": lambda n, base: (np.arange(2 * n, dtype=np.float32).reshape(n, 2) + base) / 4,
    "mask": lambda n, base: (np.arange(n) + base) % 3 == 0,
}


def make_docs(n, seed, features, extras):
  """`n` documents: {feature: array of its own random length} plus 0-d / id features."""
  rng = np.random.default_rng(seed)
  docs = []
  for i in range(n):
    d = {}
    for name, kind, lo, hi in features:
      d[name] = _KINDS[kind](int(rng.integers(lo, hi + 1)), 100 * i + 7 * len(d))
    if "lang" in extras:
      d["lang"] = np.int32(int(rng.integers(0, 3)))
    if "doc" in extras:
      d["doc"] = i
    if "extra" in extras:
      d["extra"] = np.arange(int(rng.integers(1, 30)), dtype=np.int16)
    docs.append(d)
  return docs


def _src(lib, s):
  _, n, seed, features, extras, ops = s
  ds = lib.MapDataset.source(make_docs(n, seed, features, extras))
  for op in ops:
    ds = _apply(lib, ds, op)
  return ds


def _apply(lib, ds, op):
  name, a = op[0], op[1:]
  ex = lib.experimental
  if name == "shuffle":
    return ds.shuffle(a[0])
  if name == "repeat":
    return ds.repeat(a[0])
  if name == "rrepeat":
    return ex.RepeatIterDataset(ds, a[0])
  if name == "filter":
    return ds.filter(_keeper(a[0], a[1]))
  if name == "map":
    return ds.map(_adder(a[0]))
  if name == "to_iter":
    return ds.to_iter_dataset()
  if name == "wshuffle":
    return ex.WindowShuffleIterDataset(ds, window_size=a[0], seed=a[1])
  if name == "limit":
    return ex.LimitIterDataset(ds, a[0])
  if name == "batch":
    return ds.batch(a[0], drop_remainder=a[1])
  if name in ("ffpack", "bfpack"):
    cls = ex.FirstFitPackIterDataset if name == "ffpack" else ex.BestFitPackIterDataset
    kw = dict(a[0])
    for k in ("length_struct", "padding_struct", "pack_alignment_struct"):
      if k in kw:
        kw[k] = dict(kw[k])
    if "meta_features" in kw:
      kw["meta_features"] = list(kw["meta_features"])
    return cls(ds, **kw)
  if name == "cts":
    kw = dict(a[0])
    kw["length_struct"] = dict(kw["length_struct"])
    if "meta_features" in kw:
      kw["meta_features"] = list(kw["meta_features"])
    if kw.pop("bos", None) is not None:
      kw.update(bos_handling=ex.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_features=list(a[1]), bos_token_id=a[2])
    return ex.ConcatThenSplitIterDataset(ds, **kw)
  raise ValueError(op)


def build(lib, spec):
  """spec = ("pipe", pre, mix, post): pre = source specs, mix = how they are combined, post = ops."""
  _, srcs, mix, post = spec
  kids = [_src(lib, s) for s in srcs]
  if mix is None:
    ds = kids[0]
  elif mix[0] == "mapmix":
    ds = lib.MapDataset.mix(kids, mix[1]) if mix[1] is not None else lib.MapDataset.mix(kids)
  else:  # itermix
    kids = [k.to_iter_dataset() if isinstance(k, lib.MapDataset) else k for k in kids]
    weights = mix[1]
    if mix[2]:
      kids = {f"d{i}": k for i, k in enumerate(kids)}
      weights = {f"d{i}": w for i, w in enumerate(weights)} if weights is not None else None
    ds = lib.IterDataset.mix(kids, weights) if weights is not None else lib.IterDataset.mix(kids)
  for op in post:
    ds = _apply(lib, ds, op)
  return ds


# ---------------------------------------------------------------------------
# Generators.


def _gen_features(rng, seq_len):
  """(features, length_struct): 1 to 3 sequence features, each with its own lengths and target length."""
  names = rng.sample(["inputs", "targets", "emb", "mask", "ids64"], rng.randint(1, 3))
  kind = {"inputs": "tok", "targets": "tok", "emb": "emb", "mask": "mask", "ids64": "tok64"}
  features, length = [], []
  long_feature = rng.choice(names) if rng.random() < .2 else None
  for name in names:
    target = rng.choice([seq_len, seq_len, seq_len + rng.randint(1, 5), max(1, seq_len - rng.randint(1, 3))])
    # Some documents longer than the target: the packer's ValueError.
    hi = target + 1 if name == long_feature else rng.randint(1, target)
    features.append((name, kind[name], rng.choice([1, 1, 0]) if rng.random() < .2 else 1, hi))
    length.append((name, target))
  return tuple(features), tuple(length)


def _gen_source(rng, features, extras, iterish, mixed=False):
  ops = []
  if rng.random() < .3:
    ops.append(("shuffle", rng.randrange(2**32)))
  if rng.random() < .2:
    ops.append(("repeat", rng.randint(1, 3)))
  if rng.random() < .2:
    ops.append(("filter", rng.randint(2, 5), rng.randrange(2)))
  if iterish:
    ops.append(("to_iter",))
  return ("src", rng.choice([0, 2, 8, 20, 40, 60, 60] if not mixed else [2, 8, 20, 40]), rng.randrange(1000), features, extras, tuple(ops))


def _gen_packer(rng, c, length, extras, seq_features):
  names = [n for n, _ in length]
  if c == "cts":
    # Every feature needs a length here (else Grain's ValueError at every element, generated rarely).
    kw = {"length_struct": length + tuple((e, rng.randint(1, 6)) for e in extras if e != "extra"),
          "split_full_length_features": rng.random() < .6}
    meta = []
    if "doc" in extras and rng.random() < .5:
      meta = ["doc"]  # A 0-d meta feature: duplicated when its document is split.
    if len(names) > 1 and rng.random() < .2:
      meta.append(names[-1])  # A sequence meta feature: never split.
    if meta:
      kw["meta_features"] = tuple(meta)
    # REPLACE_FIRST_TOKEN_WITH_BOS only with one feature (README: Grain's IndexError on a shorter one).
    if len(kw["length_struct"]) == 1 and seq_features[0][1] in ("tok", "tok64") and rng.random() < .4:
      kw["bos"] = True
      return (c, tuple(sorted(kw.items())), tuple(names), rng.choice([0, 1, 99]))
    return (c, tuple(sorted(kw.items())), (), None)
  kw = {"length_struct": length, "num_packing_bins": rng.randint(1, 5)}
  if rng.random() < .7:
    kw["seed"] = rng.randrange(10000)
  if rng.random() < .7:
    kw["shuffle_bins"] = rng.random() < .6
  meta = []
  if "doc" in extras and rng.random() < .4:
    meta.append("doc")  # Not in length_struct: a list per bin (object array).
  if "lang" in extras and rng.random() < .4:
    meta.append("lang")
    if rng.random() < .5:
      kw["length_struct"] = kw["length_struct"] + (("lang", rng.randint(2, 6)),)  # A sequence meta feature.
  if meta:
    kw["meta_features"] = tuple(meta)
  if rng.random() < .3:
    groupable = names + [m for m in meta if m != "doc"] + [f"{n}_segment_ids" for n in names]
    kw["shuffle_bins_group_by_feature"] = rng.choice(groupable)
  if rng.random() < .25:
    kw["pack_alignment_struct"] = tuple((n, rng.randint(1, 3)) for n, _ in kw["length_struct"])
  if rng.random() < .25:
    kw["padding_struct"] = tuple((n, rng.choice([0, -1, 7])) for n, _ in kw["length_struct"])
  if rng.random() < .3:
    kw["max_sequences_per_bin"] = rng.randint(1, 3)
  return (c, tuple(sorted(kw.items())))


def gen(rng):
  seq_len = rng.randint(2, 10)
  features, length = _gen_features(rng, seq_len)
  extras = tuple(e for e in ("lang", "doc", "extra") if rng.random() < .5)
  packer = rng.choice(["ffpack", "ffpack", "bfpack", "bfpack", "cts", "cts"])
  if packer == "cts" and rng.random() < .95:
    extras = tuple(e for e in extras if e != "extra")
  if any(k == "mask" for _, k, _, _ in features) and rng.random() < .5:
    extras = tuple(e for e in extras if e != "extra")
  mix = None
  if rng.random() < .4:
    iterish = rng.random() < .5
    srcs = tuple(_gen_source(rng, features, extras, iterish, True) for _ in range(2))
    weights = tuple(rng.choice([1, 2, 3, .5]) for _ in srcs) if rng.random() < .7 else None
    mix = ("itermix", weights, rng.random() < .4) if iterish else ("mapmix", weights)
  else:
    srcs = (_gen_source(rng, features, extras, False),)
  post = []
  if mix is None or mix[0] == "mapmix":
    if rng.random() < .3:
      post.append(("map", rng.randint(1, 9)))
    post.append(("to_iter",))
  if rng.random() < .3:
    post.append(("wshuffle", rng.randint(1, 8), rng.randrange(1000)))
  if rng.random() < .15:
    post.append(("rrepeat", rng.randint(1, 2)))
  if rng.random() < .15:
    post.append(("limit", rng.randint(1, 12)))
  post.append(_gen_packer(rng, packer, length, extras, features))
  if rng.random() < .12:  # Packing packed rows again, to twice their length (their other features dropped).
    again = tuple((n, 2 * m) for n, m in length)
    post.append((rng.choice(["ffpack", "bfpack"]),
                 (("length_struct", again), ("num_packing_bins", rng.randint(1, 3)), ("seed", rng.randrange(99)))))
  r = rng.random()
  if r < .35:
    post.append(("batch", rng.randint(1, 4), rng.random() < .4))
  elif r < .5:
    post.append(("limit", rng.randint(1, 8)))
  if rng.random() < .15:
    post.append(("map", rng.randint(1, 9)))
  return ("pipe", srcs, mix, tuple(post))


# ---------------------------------------------------------------------------
# Observing and comparing.






def observe(lib, spec, other_states=None):
  obs = {}
  try:
    ds = build(lib, spec)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return {"build": ("raises", type(e))}
  try:
    it = iter(ds)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return {"iter": ("raises", type(e))}
  obs.update(observe_iteration(it, lambda: iter(build(lib, spec)), CAP, RES, other_states))
  return obs


def _grain_cts_scalar_bug(g) -> bool:
  """Grain's PyGrainInternalError ("This is a bug in ConcatThenSplitPackDatasetIterator", or "No elements to pack")
  where a 0-d feature that is no meta feature fills its length before the others."""
  outcomes = list(g.get("stream", [])) + [o for r in g.get("restored", []) for o in (r if isinstance(r, list) else [r])]
  return any(isinstance(o, tuple) and len(o) == 2 and isinstance(o[1], type)
             and issubclass(o[1], grain_exceptions.PyGrainInternalError) for o in outcomes)


def compare(spec):
  """(differences of loader from Grain, whether Grain was comparable, whether Grain's own restores were exact)."""
  g, lo, early = observe_both(observe, spec, grain, GRAIN_TIMEOUT_S)
  if early is not None:
    return early
  if _grain_cts_scalar_bug(g):
    # test_concat_then_split_of_a_full_0d_feature_packs_where_grain_raises_its_internal_error: not copied. Loader
    # still restores exactly on its own states.
    return ([("loader restore at step", lo["restore_bad"][:3])] if lo.get("restore_bad") else []), True, False
  diffs = []
  for key in ["build", "iter"]:
    if (key in g or key in lo) and not _same_outcome(g.get(key), lo.get(key)):
      diffs.append((key, g.get(key), lo.get(key)))
  if "stream" not in g or "stream" not in lo:
    return diffs, True, True
  grain_exact = not g["restore_bad"] and not g["rewind_bad"]
  if not _same_stream(g["stream"], lo["stream"]):
    diffs.append(("stream", g["stream"], lo["stream"]))
  if grain_exact and lo["restore_bad"]:
    diffs.append(("loader restore at step", lo["restore_bad"][:3]))
  elif not grain_exact:  # Grain's own restores do not go on as its run: loader's must do what Grain's do.
    # README ("An element whose computation raises"): loader's state counts a failed element, so its restores
    # go on exactly after a failure where Grain's do not: a loader restore that is exact is fine there.
    failed = any(_is_error(o) for o in lo["stream"])
    bad = [k for k, (a, b) in enumerate(zip(g["restored"], lo["restored"]))
           if not _same_stream(a, b) and not (failed and k not in lo["restore_bad"])]
    if bad:
      diffs.append(("loader restore unlike grain's at step",
                    [(k, g["restored"][k], lo["restored"][k]) for k in bad[:2]]))
  if lo["rewind_bad"] and grain_exact:
    diffs.append(("loader rewind at step", lo["rewind_bad"]))
  if grain_exact and _same_stream(g["stream"], lo["stream"]) and lo["other_states_bad"]:
    diffs.append(("grain state on loader at step", lo["other_states_bad"][:2]))
  return diffs, True, grain_exact


# ---------------------------------------------------------------------------
# The seeded random-pipeline differential test.


@pytest.mark.parametrize("part", range(4))
def test_random_packing_pipelines_match_grain_and_restore_at_every_step(part):
  start = time.monotonic()
  failures, compared, n = [], 0, 0
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.CRITICAL)  # ConcatThenSplit logs an error per meta feature that limits packing.
  try:
    for i in range(part, N_CASES, 4):
      spec = gen(random.Random(f"{SEED}-{i}"))
      n += 1
      diffs, comparable, _ = compare(spec)
      gc.collect()  # Grain's used iterators go before the next case.
      compared += comparable
      if diffs:
        failures.append(f"case {i}: {spec!r}\n  " + "\n  ".join(repr(d)[:900] for d in diffs))
  finally:
    absl_logger.setLevel(level)
  assert not failures, f"{len(failures)} of {compared} pipelines differ:\n" + "\n".join(failures[:6])
  assert compared >= n * 9 // 10, (compared, n)
  # A budget against a runaway case, not a speed test: ~20 s a part on an idle 2-core machine.
  assert time.monotonic() - start < 600


# ---------------------------------------------------------------------------
# Regression tests: the differences this round found, minimized.


def _tokens(lengths, key="inputs"):
  return [{key: np.arange(n, dtype=np.int32) + 10 * i} for i, n in enumerate(lengths)]


def _take(it, n=8, key="inputs"):
  """Up to `n` outcomes: a row's `key` as a list, an error's type, or "END"."""
  out = []
  for _ in range(n):
    try:
      out.append(next(it)[key].tolist())
    except StopIteration:
      out.append("END")
      break
    except Exception as e:  # pylint: disable=broad-except
      out.append(type(e))
  return out


def _packer(lib, best_fit):
  ex = lib.experimental
  return ex.BestFitPackIterDataset if best_fit else ex.FirstFitPackIterDataset


@pytest.mark.parametrize("best_fit", [False, True])
@pytest.mark.parametrize("shuffle_bins", [False, True])
@pytest.mark.parametrize("batch", [None, 2])
def test_pack_of_only_too_long_elements_raises_grains_index_error_at_the_end(best_fit, shuffle_bins, batch):
  """Every element is too long: each raises Grain's ValueError, and then, at the input's end, Grain 0.2.18 packs an
  empty window whose first row does not exist: IndexError at every later `next`. Loader raised a ValueError
  ("the state points at row 0 of a packed window that has 0 rows")."""

  def run(lib):
    ds = lib.MapDataset.source(_tokens([5, 4])).to_iter_dataset()
    ds = _packer(lib, best_fit)(ds, length_struct={"inputs": 3}, num_packing_bins=3, shuffle_bins=shuffle_bins)
    if batch:
      ds = ds.batch(batch)
    return _take(iter(ds), 5)

  expected = run(grain)
  assert expected == [ValueError, ValueError, IndexError, IndexError, IndexError]
  assert run(loader) == expected


def test_pack_with_a_too_long_element_only_at_the_start_packs_the_rest_as_grain():
  """The empty window is only an error at the input's end: later elements fill it, in both libraries."""

  def run(lib):
    ds = lib.MapDataset.source(_tokens([5, 1, 4, 2])).to_iter_dataset()
    return _take(iter(lib.experimental.FirstFitPackIterDataset(
        ds, length_struct={"inputs": 3}, num_packing_bins=2, shuffle_bins=False)))

  expected = run(grain)
  assert expected == [ValueError, ValueError, [10, 30, 31], "END"]
  assert run(loader) == expected


def _two_packers(lib):
  ds = lib.MapDataset.source(_tokens([2, 2, 3, 1, 4, 1])).to_iter_dataset()
  ds = lib.experimental.FirstFitPackIterDataset(ds, length_struct={"inputs": 3}, num_packing_bins=2,
                                                shuffle_bins=False)
  return lib.experimental.FirstFitPackIterDataset(ds, length_struct={"inputs": 6}, num_packing_bins=1,
                                                  shuffle_bins=False)


def _states_and_stream(lib, make, n=8):
  it = iter(make(lib))
  states, out = [], []
  for _ in range(n):
    states.append(copy.deepcopy(it.get_state()))
    out += _take(it, 1)
    if out[-1] == "END":
      break
  return states, out


def _restored_take(lib, make, state, n=4):
  it = iter(make(lib))
  it.set_state(copy.deepcopy(state))
  return _take(it, n)


def test_packing_packed_rows_restores_the_end_after_a_too_long_element_as_grain():
  """A packer over a packer whose input had a too-long element: the state taken before the end restored on a fresh
  iterator ends, as Grain's does. Loader's inner packer raised the too-long element's ValueError again while
  re-packing its window, and the outer packer's restore counted that error as one of its input rows: it gave one
  more packed row ([30, 50, 0, 0, 0, 0]) before the end."""
  g_states, g_out = _states_and_stream(grain, _two_packers)
  l_states, l_out = _states_and_stream(loader, _two_packers)
  assert g_out == l_out == [ValueError, [0, 1, 0, 10, 11, 0], [20, 21, 22, 30, 50, 0], "END"]
  assert _restored_take(grain, _two_packers, g_states[-1]) == ["END"]
  assert _restored_take(loader, _two_packers, l_states[-1]) == ["END"]
  # Loader's states restore exactly at every step; Grain's states given to loader go on as Grain's restores (its
  # state after the error is its state before it: the error comes again).
  for k, s in enumerate(l_states):
    assert _restored_take(loader, _two_packers, s) == l_out[k:k + 4], k
  for k, s in enumerate(g_states):
    assert _restored_take(loader, _two_packers, s) == _restored_take(grain, _two_packers, s), k


def _one_packer(lib):
  ds = lib.MapDataset.source(_tokens([2, 2, 3, 1, 4, 1])).to_iter_dataset()
  return lib.experimental.FirstFitPackIterDataset(ds, length_struct={"inputs": 3}, num_packing_bins=2,
                                                  shuffle_bins=False)


def test_pack_restore_after_a_too_long_element_goes_on_exactly_as_documented():
  """README ("An element whose computation raises"): the failed element is consumed and loader's state counts it,
  so a restore goes on exactly after the failure. Grain 0.2.18's packer keeps the window's start as its state and
  raises the too-long element's ValueError again when it re-packs the window."""
  g_states, g_out = _states_and_stream(grain, _one_packer)
  l_states, l_out = _states_and_stream(loader, _one_packer)
  assert g_out == l_out == [[0, 1, 0], [10, 11, 0], ValueError, [20, 21, 22], [30, 50, 0], "END"]
  # The state after the error (before [20, 21, 22]), and the one after [20, 21, 22].
  assert _restored_take(grain, _one_packer, g_states[3]) == [ValueError, [20, 21, 22], [30, 50, 0], "END"]
  assert _restored_take(grain, _one_packer, g_states[4]) == [ValueError, [30, 50, 0], "END"]
  assert _restored_take(loader, _one_packer, l_states[3]) == [[20, 21, 22], [30, 50, 0], "END"]
  assert _restored_take(loader, _one_packer, l_states[4]) == [[30, 50, 0], "END"]


def _cts_with_a_0d_feature(lib):
  els = [{"inputs": np.arange(2, dtype=np.int32) + 10 * i, "lang": np.int32(i)} for i in range(4)]
  ds = lib.MapDataset.source(els).to_iter_dataset()
  return lib.experimental.ConcatThenSplitIterDataset(ds, length_struct={"inputs": 6, "lang": 2})


def test_concat_then_split_of_a_full_0d_feature_packs_where_grain_raises_its_internal_error():
  """Not fixed (reported): a 0-d feature that is no meta feature and reaches its length before the others. Grain
  0.2.18 splits it at 0 yet packs it whole, overflows its buffer and raises PyGrainInternalError ("... This is a
  bug in ConcatThenSplitPackDatasetIterator"), losing the packed rows; loader packs it as a length-1 sequence,
  as Grain's docstring says ("Scalars are treated as 1-dimensional arrays of size 1")."""
  assert _take(iter(_cts_with_a_0d_feature(grain))) == [grain_exceptions.PyGrainInternalError, [30, 31, 0, 0, 0, 0],
                                                        "END"]
  assert _take(iter(_cts_with_a_0d_feature(loader))) == [[0, 1, 10, 11, 20, 21], [30, 31, 0, 0, 0, 0], "END"]
  assert _take(iter(_cts_with_a_0d_feature(loader)), key="lang") == [[0, 1], [2, 3], "END"]
