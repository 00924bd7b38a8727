"""Grain 0.2.18's packing tests, run on Grain and, with only the import line changed, on loader.

The cases are Grain's own tests (grain/_src/python/dataset/transformations/
packing_test.py with its cases in testing_util.py -- FirstFit and BestFit --,
packing_concat_then_split_test.py and
experimental/example_packing/pack_and_batch_test.py at v0.2.18), every
parameter combination, rewritten against the public names
(`grain.experimental.FirstFitPackIterDataset`, `BestFitPackIterDataset`,
`ConcatThenSplitIterDataset`, `BOSHandling`, `PackAndBatchOperation`,
`assert_equal_output_after_checkpoint`, `grain.Record` ...).

Every case asserts that loader's output equals Grain's: values, dtypes and
shapes of each output key (`*_segment_ids`, `*_positions`, meta features),
the number of elements, exceptions (type, and the message pattern Grain's test
matches), and checkpoints: each library restores a fresh iterator from its own
state at every step and must continue the same stream. Grain's own test file
passes on Grain (208 cases), so Grain's results are its tests' expectations.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, structure

HEAD = """
import grain
import ml_dtypes
import numpy as np


def outcome(fn):
  try:
    return ["ok", fn()]
  except Exception as e:  # pylint: disable=broad-except
    return ["raise", type(e).__name__, str(e)]


def take(it, n):
  out = []
  for _ in range(n):
    try:
      out.append(next(it))
    except StopIteration:
      break
  return out


def restore_everywhere(make_ds, limit=40):
  # The stream, and for each step k the stream of a fresh iterator restored
  # from the state taken before step k (each library with its own states).
  it = make_ds().__iter__()
  states, values = [], []
  for _ in range(limit):
    states.append(it.get_state())
    try:
      values.append(next(it))
    except StopIteration:
      break
  resumed = []
  for k, state in enumerate(states):
    fresh = make_ds().__iter__()
    fresh.set_state(state)
    resumed.append(take(fresh, limit - k))
  # Same iterator: restore an earlier state after reading on.
  again = []
  it = make_ds().__iter__()
  for k, state in enumerate(states):
    take(it, 2)
    it.set_state(state)
    again.append(take(it, 3))
  return values, resumed, again


def pack(packer, elements, length_struct, *, convert=True, num_packing_bins, **kwargs):
  # Grain's _common_test_body: shuffle_bins=False unless given.
  if convert:
    elements = [{k: np.asarray(v) for k, v in d.items()} for d in elements]
  kwargs.setdefault("shuffle_bins", False)
  ds = packer(grain.MapDataset.source(elements).to_iter_dataset(), num_packing_bins=num_packing_bins,
              length_struct=length_struct, **kwargs)
  return list(ds)


THREE = [
    {"inputs": [1, 2, 3], "targets": [10]},
    {"inputs": [4, 5], "targets": [20, 30, 40]},
    {"inputs": [6], "targets": [50, 60]},
]
"""

PACKERS = ("FirstFitPackIterDataset", "BestFitPackIterDataset")


def _run(body: str, packer: str | None = None):
  src = HEAD + (f"\nPACKER = grain.experimental.{packer}\n" if packer else "") + body
  return porting.run_both(src)


def _same(g, l):
  assert plain(l) == plain(g)
  assert structure(l) == structure(g)


def _same_outcome(g, l, pattern: str | None = None):
  """Both raised the same exception type (Grain's test's pattern in both messages), or both returned the same."""
  assert l[0] == g[0], (g, l)
  if g[0] == "raise":
    assert l[1] == g[1], (g, l)
    if pattern is not None:
      assert re.search(pattern, g[2]), g
      assert re.search(pattern, l[2]), (g, l)
  else:
    _same(g[1], l[1])


# ----------------------------------------------------------------------------
# FirstFitPackIterDataset / BestFitPackIterDataset (testing_util.py)
# ----------------------------------------------------------------------------

# name -> snippet setting `result` (the packed elements, via `outcome`).
PACK_CASES = {
    "packing_scenario_1": """
result = outcome(lambda: pack(PACKER, [{"features": [1, 1, 1, 1]}, {"features": [2] * 8}, {"features": [3, 3]}],
                              {"features": 10}, num_packing_bins=2))
""",
    "packing_scenario_2": """
result = outcome(lambda: pack(PACKER, [{"features": [1] * 10}, {"features": [2] * 15}, {"features": [3] * 4}],
                              {"features": 20}, num_packing_bins=2))
""",
    "packing_scenario_3": """
result = outcome(lambda: pack(PACKER, [{"features": [1] * 50}, {"features": [2] * 70}, {"features": [3] * 25},
                                       {"features": [4] * 40}], {"features": 100}, num_packing_bins=3))
""",
    "packing_scenario_4": """
result = outcome(lambda: pack(PACKER, [{"features": [1] * 10}, {"features": [2] * 15}, {"features": [3] * 4},
                                       {"features": [4] * 10}], {"features": 20}, num_packing_bins=3))
""",
    **{f"length_3_bins_{n}": f"""
result = outcome(lambda: pack(PACKER, THREE, {{"inputs": 3, "targets": 3}}, num_packing_bins={n}))
""" for n in (1, 2, 3)},
    "bfloat16": """
bf = ml_dtypes.bfloat16
elements = [{"soft_tokens": np.asarray([[[0.1, 0.2, 0.3]], [[0.4, 0.5, 0.6]], [[0.7, 0.8, 0.9]]], dtype=bf)},
            {"soft_tokens": np.asarray([[[1.1, 1.2, 1.3]], [[1.4, 1.5, 1.6]], [[1.7, 1.8, 1.9]]], dtype=bf)},
            {"soft_tokens": np.asarray([[[2.1, 2.2, 2.3]], [[2.4, 2.5, 2.6]], [[2.7, 2.8, 2.9]]], dtype=bf)}]
packed = outcome(lambda: pack(PACKER, elements, {"soft_tokens": 4}, num_packing_bins=3))
# bfloat16 values as float32 (plain() cannot compare bfloat16 scalars), dtypes kept by structure().
result = packed if packed[0] != "ok" else ["ok", [{k: v.astype(np.float32) for k, v in e.items()} for e in packed[1]]]
dtypes = None if packed[0] != "ok" else [{k: str(v.dtype) for k, v in e.items()} for e in packed[1]]
""",
    "missing_length_struct_feature": """
def f():
  ds = PACKER(grain.MapDataset.source([{"a": np.asarray([1, 2, 3]), "b": np.asarray([1, 2, 3])}]).to_iter_dataset(),
              num_packing_bins=1, length_struct={"a": 3})
  return next(iter(ds))
result = outcome(f)
""",
    **{f"shuffle_bins_{n}_bins": f"""
result = outcome(lambda: pack(PACKER, THREE, {{"inputs": 3, "targets": 3}}, num_packing_bins={n}, shuffle_bins=True))
""" for n in (3, 5)},
    **{f"epoch_aware_shuffle_bins_{n}_bins": f"""
elements = [{{"inputs": [1, 2, 3], "epoch": [2]}}, {{"inputs": [4, 5], "epoch": [3]}}, {{"inputs": [6], "epoch": [3]}},
            {{"inputs": [7], "epoch": [2]}}, {{"inputs": [8, 9, 10], "epoch": [2]}}]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 3, "epoch": 3}}, num_packing_bins={n}, shuffle_bins=True,
                              shuffle_bins_group_by_feature="epoch", meta_features=["epoch"]))
""" for n in (4, 5)},
    "epoch_aware_shuffle_bins_with_epoch0": """
elements = [{"inputs": [1, 2, 3], "epoch": [0]}, {"inputs": [4, 5], "epoch": [0]}, {"inputs": [6], "epoch": [0]},
            {"inputs": [7], "epoch": [0]}]
result = outcome(lambda: pack(PACKER, elements, {"inputs": 3, "epoch": 3}, num_packing_bins=5, shuffle_bins=True,
                              shuffle_bins_group_by_feature="epoch", meta_features=["epoch"]))
""",
    **{f"shuffle_seed_{s}": f"""
result = outcome(lambda: pack(PACKER, THREE, {{"inputs": 3, "targets": 3}}, num_packing_bins=5, seed={s},
                              shuffle_bins=True))
""" for s in (0, 42, 123)},
    "raw_ints": """
elements = [{"inputs": np.asarray([1, 2, 3]), "epoch": 1}, {"inputs": np.asarray([4, 5]), "epoch": 2},
            {"inputs": np.asarray([6]), "epoch": 3}]
result = outcome(lambda: pack(PACKER, elements, {"inputs": 3, "epoch": 3}, num_packing_bins=5, convert=False,
                              meta_features=["epoch"]))
""",
    **{f"length_{n}": f"""
result = outcome(lambda: pack(PACKER, THREE, {{"inputs": {n}, "targets": {n}}}, num_packing_bins={1 if n == 7 else 2}))
""" for n in (4, 5, 6, 7)},
    "different_lengths": """
result = outcome(lambda: pack(PACKER, THREE, {"inputs": 3, "targets": 4}, num_packing_bins=3))
""",
    "two_dimensional_features": """
elements = [
    {"input_tokens": [1, 2, 3], "input_vectors": [[0, 1, 2], [1, 2, 3], [2, 3, 4]], "targets": [10]},
    {"input_tokens": [4, 5], "input_vectors": [[3, 4, 5], [4, 5, 6]], "targets": [20, 30, 40]},
    {"input_tokens": [6], "input_vectors": [[5, 6, 7]], "targets": [50, 60]},
]
result = outcome(lambda: pack(PACKER, elements, {"input_tokens": 5, "input_vectors": 3, "targets": 5},
                              num_packing_bins=2))
""",
    **{f"meta_features_convert_{c}": f"""
elements = [{{"inputs": np.asarray([1, 2, 3]), "targets": np.asarray([10]), "meta_feature": 3}},
            {{"inputs": np.asarray([4, 5]), "targets": np.asarray([20, 30, 40]), "meta_feature": 7}},
            {{"inputs": np.asarray([6]), "targets": np.asarray([50, 60]), "meta_feature": 5}}]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 3, "targets": 4, "meta_feature": 3}}, num_packing_bins=3,
                              meta_features=["meta_feature"], convert={c}))
""" for c in (True, False)},
    **{f"nonint64_meta_feature_convert_{c}_values_{i}": f"""
values = [[3.5, 7.5, 5.5],
          [np.asarray(3.5), np.asarray(7.5), np.asarray(5.5)],
          [np.asarray(3.5, dtype=np.int32), np.asarray(7, dtype=np.int32), np.asarray(5, dtype=np.int32)]][{i}]
elements = [{{"inputs": np.asarray([1, 2, 3]), "targets": np.asarray([10]), "meta_feature": values[0]}},
            {{"inputs": np.asarray([4, 5]), "targets": np.asarray([20, 30, 40]), "meta_feature": values[1]}},
            {{"inputs": np.asarray([6]), "targets": np.asarray([50, 60]), "meta_feature": values[2]}}]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 3, "targets": 4, "meta_feature": 3}}, num_packing_bins=3,
                              meta_features=["meta_feature"], convert={c}))
""" for c in (True, False) for i in range(3)},
    **{f"pack_alignment_{a}_and_padding_struct": f"""
elements = [{{"inputs": [1, 2], "targets": [10]}}, {{"inputs": [3, 4, 5], "targets": [20, 30]}},
            {{"inputs": [6], "targets": [40, 50, 60]}}]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 8, "targets": 8}}, num_packing_bins=2,
                              pack_alignment_struct={{"inputs": {a}, "targets": {a}}},
                              padding_struct={{"inputs": 0, "targets": -1}}))
""" for a in (1, 4)},
    "max_sequences_per_bin": """
result = outcome(lambda: pack(PACKER, THREE, {"inputs": 6, "targets": 6}, num_packing_bins=2, max_sequences_per_bin=2))
""",
    "sequences_with_zeros": """
elements = [
    {"input_tokens": [8, 8], "input_vectors": np.empty((0, 3), dtype=np.int64), "targets": np.array([], dtype=np.int64)},
    {"input_tokens": [1], "input_vectors": [[0, 1, 2], [1, 2, 3], [2, 3, 4]], "targets": [10]},
    {"input_tokens": [4, 5], "input_vectors": [[3, 4, 5], [4, 5, 6]], "targets": [20, 30, 40]},
    {"input_tokens": [6], "input_vectors": [[5, 6, 7]], "targets": [50, 60]},
    {"input_tokens": np.array([], dtype=np.int64), "input_vectors": np.empty((0, 3), dtype=np.int64),
     "targets": np.array([], dtype=np.int64)},
]
result = outcome(lambda: pack(PACKER, elements, {"input_tokens": 5, "input_vectors": 3, "targets": 5},
                              num_packing_bins=2, max_sequences_per_bin=3))
""",
    **{f"non_sequence_meta_feature_convert_{c}": f"""
elements = [{{"inputs": np.asarray([i]), "targets": np.asarray([10 * i]), "image": np.ones((2, 2, 3), dtype=np.int32) * i}}
            for i in (1, 2, 3)]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 3, "targets": 3}}, num_packing_bins=1, meta_features=["image"],
                              convert={c}))
""" for c in (True, False)},
    **{f"non_sequence_meta_feature_variable_shapes_convert_{c}": f"""
elements = [{{"inputs": np.asarray([i]), "targets": np.asarray([10 * i]), "image": np.ones((n, 1, 3, 3), dtype=np.int32) * i}}
            for i, n in ((1, 2), (2, 1), (3, 3))]
result = outcome(lambda: pack(PACKER, elements, {{"inputs": 3, "targets": 3}}, num_packing_bins=1, meta_features=["image"],
                              convert={c}))
""" for c in (True, False)},
}


@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("name", sorted(PACK_CASES))
def test_pack(name, packer):
  g, l = _run(PACK_CASES[name], packer)
  assert g.result[0] == "ok", g.result  # Grain's test expects elements.
  _same_outcome(g.result, l.result)
  if name == "bfloat16":
    assert g.dtypes[0]["soft_tokens"] == "bfloat16"
    assert l.dtypes == g.dtypes


# Error cases: (snippet, the pattern Grain's test matches, or None).
PACK_ERRORS = {
    "variable_key_features": ("""
elements = [{"aaa": np.asarray([1, 2, 3]), "bbb": np.asarray([1, 2, 3])}, {"aaa": np.asarray([1, 2, 3])}]
ds = PACKER(grain.MapDataset.source(elements).to_iter_dataset(), num_packing_bins=1, length_struct={"aaa": 3, "bbb": 3})
result = outcome(lambda: next(iter(ds)))
""", "bbb"),
    **{f"max_sequences_per_bin_invalid_{v}": (f"""
result = outcome(lambda: [PACKER(grain.MapDataset.source([]).to_iter_dataset(), length_struct={{"inputs": 6, "targets": 6}},
                                 num_packing_bins=2, max_sequences_per_bin={v}), None][1])
""", re.escape(f"If specified, `max_sequences_per_bin` must be a positive integer, but got {v}."))
       for v in (0, -1)},
    **{f"nested_feature_meta_{m}": (f"""
rng = np.random.default_rng(42)
elements = [dict(row=rng.integers(0, 10, size=rng.integers(5, 30)), nested_feature=dict(inner_value=0))
            for _ in range(100)]
ds = PACKER(grain.MapDataset.source(elements).repeat().to_iter_dataset(), num_packing_bins=4,
            length_struct=dict(row=100, nested_feature=dict(inner_value=100)),
            meta_features=["nested_feature"] if {m} else [])
result = outcome(lambda: next(iter(ds)))
""", None if m else re.escape(
        "Failed to extract segment ids for 'nested_feature', which has type <class 'dict'> rather than np.ndarray."
        " Perhaps it should be marked as a meta feature?")) for m in (True, False)},
}


@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("name", sorted(PACK_ERRORS))
def test_pack_errors(name, packer):
  body, pattern = PACK_ERRORS[name]
  g, l = _run(body, packer)
  assert g.result[0] == ("ok" if pattern is None else "raise"), g.result
  _same_outcome(g.result, l.result, pattern)


@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("restore_at_step", [0, 1, 2, 3])
def test_pack_checkpointing(restore_at_step, packer):
  # Grain's test_checkpointing: set_state(get_state()) on the same iterator at one step, shuffle_bins=True.
  g, l = _run(f"""
def make():
  elements = [{{k: np.asarray(v) for k, v in d.items()}} for d in THREE]
  return PACKER(grain.MapDataset.source(elements).to_iter_dataset(), num_packing_bins=2,
                length_struct={{"inputs": 3, "targets": 3}}, shuffle_bins=True)
data_iter = make().__iter__()
actual = []
for step in range(5):
  state = data_iter.get_state()
  if step == {restore_at_step}:
    data_iter.set_state(state)
  try:
    actual.append(next(data_iter))
  except StopIteration:
    continue
result = actual
values, resumed, again = restore_everywhere(make)
""", packer)
  assert len(g.result) == 3
  _same(g.result, l.result)
  _same(g.values, l.values)
  _same(g.resumed, l.resumed)
  _same(g.again, l.again)
  for k, rest in enumerate(l.resumed):
    _same(l.values[k:], rest)


@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("shuffle_bins", [True, False])
def test_pack_deterministic_restore(shuffle_bins, packer):
  g, l = _run(f"""
rng = np.random.default_rng(42)
elements = [dict(row=rng.integers(0, 10, size=rng.integers(5, 30))) for _ in range(100)]
def make():
  return PACKER(grain.MapDataset.source(elements).repeat().to_iter_dataset(), num_packing_bins=4,
                length_struct=dict(row=100), shuffle_bins={shuffle_bins})
it = make().__iter__()
skipped = [next(it) for _ in range(10)]
state = it.get_state()
first = [next(it) for _ in range(3)]
it = make().__iter__()
it.set_state(state)
second = [next(it) for _ in range(3)]
values, resumed, again = restore_everywhere(make, limit=16)
""", packer)
  _same(g.skipped + g.first, l.skipped + l.first)
  _same(l.first, l.second)
  _same(g.values, l.values)
  _same(g.resumed, l.resumed)
  _same(g.again, l.again)
  for k, rest in enumerate(l.resumed):
    _same(l.values[k:], rest)


# ----------------------------------------------------------------------------
# ConcatThenSplitIterDataset (packing_concat_then_split_test.py)
# ----------------------------------------------------------------------------

CTS_HEAD = """
BOSHandling = grain.experimental.BOSHandling
CTS = grain.experimental.ConcatThenSplitIterDataset


# [1], [2, 2], [3, 3, 3], ..., [7] * 7, [1], [2, 2], ... with "index" 1, 2, ...
def dummy(num_observations):
  return (grain.MapDataset.range(1, 8).repeat()
          .map_with_index(lambda index, value: {"observation": np.repeat(value, value), "index": index + 1})
          [:num_observations].to_iter_dataset())
"""

CTS_CASES = {
    "meta_features_not_restricting_when_splitting_full_length_features": """
result = outcome(lambda: list(CTS(dummy(9), length_struct={"observation": 6, "index": 6}, meta_features={"index"},
                                  split_full_length_features=True)))
""",
    "meta_features_not_restricting": """
result = outcome(lambda: list(CTS(dummy(9), length_struct={"observation": 6, "index": 6}, meta_features={"index"},
                                  split_full_length_features=False)))
""",
    "meta_features_restricting": """
result = outcome(lambda: list(CTS(dummy(9), length_struct={"observation": 6, "index": 2}, meta_features={"index"},
                                  split_full_length_features=False)))
""",
    "replace_first_token_with_bos": """
result = outcome(lambda: list(CTS(dummy(9), length_struct={"observation": 6, "index": 6}, meta_features={"index"},
                                  split_full_length_features=False,
                                  bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_token_id=1000,
                                  bos_features={"observation"})))
""",
    "split_element_multiple_times": """
ds = grain.MapDataset.source([{"observation": np.arange(7)}, {"observation": np.arange(25)}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 10})))
""",
    "large_element_with_exact_fit_followed_by_small_elements": """
ds = grain.MapDataset.source([{"observation": np.arange(40)}, {"observation": np.arange(5)},
                              {"observation": np.arange(5)}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 10})))
""",
    "full_length_sequence_not_passed_through_immediately": """
ds = grain.MapDataset.source([{"observation": np.arange(1)}, {"observation": np.arange(10)},
                              {"observation": np.arange(5)}, {"observation": np.arange(5)}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 10}, split_full_length_features=False)))
""",
    "non_first_full_length_sequence_passed_through_immediately": """
ds = grain.MapDataset.source([{"observation": np.arange(5)}, {"observation": np.arange(5)},
                              {"observation": np.arange(10)}, {"observation": np.arange(5)},
                              {"observation": np.arange(5)}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 10}, split_full_length_features=False)))
""",
    "first_full_length_sequence_not_passed_through_immediately": """
ds = grain.MapDataset.source([{"observation": np.arange(10)}, {"observation": np.arange(5)},
                              {"observation": np.arange(5)}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 10}, split_full_length_features=False)))
""",
    "oversized_feature_first": """
ds = grain.MapDataset.source([{"observation": [2, 2], "index": 1}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"observation": 1, "index": 1}, split_full_length_features=False,
                                  meta_features={"index"})))
""",
    "oversized_feature_second": """
ds = grain.MapDataset.source([{"index": 1, "observation": [2, 2]}]).to_iter_dataset()
result = outcome(lambda: list(CTS(ds, length_struct={"index": 1, "observation": 1}, split_full_length_features=False,
                                  meta_features={"index"})))
""",
}


@pytest.mark.parametrize("name", sorted(CTS_CASES))
def test_concat_then_split(name):
  g, l = _run(CTS_HEAD + CTS_CASES[name])
  assert g.result[0] == "ok", g.result
  _same_outcome(g.result, l.result)


CTS_ERRORS = {
    "additional_sequence_length": """
ds = CTS(dummy(7), length_struct={"observation": 6, "index": 6, "does_not_exist": 6}, meta_features={"index"})
result = outcome(lambda: list(ds))
""",
    "missingsequence_length": """
ds = CTS(dummy(7), length_struct={"index": 6}, meta_features={"index"})
result = outcome(lambda: list(ds))
""",
}


@pytest.mark.parametrize("name", sorted(CTS_ERRORS))
def test_concat_then_split_errors(name):
  g, l = _run(CTS_HEAD + CTS_ERRORS[name])
  assert g.result[0] == "raise" and g.result[1] == "ValueError", g.result
  _same_outcome(g.result, l.result, "Parent element has structure")


@pytest.mark.parametrize("split_full_length_features", [True, False])
@pytest.mark.parametrize("checkpoint_steps", [(), (2,), (0, 3), (0, 1, 2, 3, 4, 5)])
def test_concat_then_split_checkpointing(checkpoint_steps, split_full_length_features):
  g, l = _run(CTS_HEAD + f"""
def make():
  return CTS(dummy(12), length_struct={{"observation": 8, "index": 6}}, meta_features={{"index"}},
             split_full_length_features={split_full_length_features})
def create_iter(state):
  it = make().__iter__()
  if state is not None:
    it.set_state(state)
  return it
ds_iter = create_iter(None)
result = []
for step in range(6):
  if step in {set(checkpoint_steps) or "set()"}:
    ds_iter = create_iter(ds_iter.get_state())
  result.append(next(ds_iter))
values, resumed, again = restore_everywhere(make)
""")
  assert len(g.result) == 6
  _same(g.result, l.result)
  _same(g.values, l.values)
  _same(g.resumed, l.resumed)
  _same(g.again, l.again)


@pytest.mark.parametrize("split_full_length_features", [True, False])
@pytest.mark.parametrize("recreate_iter", [True, False])
@pytest.mark.parametrize("num_observations", list(range(12)))
def test_concat_then_split_checkpointing_after_stop_iteration(num_observations, recreate_iter,
                                                              split_full_length_features):
  g, l = _run(CTS_HEAD + f"""
def create_iter(state):
  ds = CTS(dummy({num_observations}), length_struct={{"observation": 8, "index": 6}}, meta_features={{"index"}},
           split_full_length_features={split_full_length_features})
  it = ds.__iter__()
  if state is not None:
    it.set_state(state)
  return it
def f():
  ds_iter = create_iter(None)
  values = list(ds_iter)
  final_state = ds_iter.get_state()
  if {recreate_iter}:
    ds_iter = create_iter(final_state)
  else:
    ds_iter.set_state(final_state)
  after = outcome(lambda: next(ds_iter))
  return [values, after[:2], ds_iter.get_state() == final_state]
result = outcome(f)
""")
  assert g.result[0] == "ok", g.result
  assert g.result[1][1] == ["raise", "StopIteration"] and g.result[1][2] is True
  _same_outcome(g.result, l.result)


@pytest.mark.parametrize("split_full_length_features", [True, False])
@pytest.mark.parametrize("num_observations", list(range(1, 12)))
def test_concat_then_split_checkpointing_using_grain_built_in_tools(num_observations, split_full_length_features):
  g, l = _run(CTS_HEAD + f"""
def make():
  return CTS(dummy({num_observations}), length_struct={{"observation": 8, "index": 6}}, meta_features={{"index"}},
             split_full_length_features={split_full_length_features})
check = outcome(lambda: grain.experimental.assert_equal_output_after_checkpoint(make()))
values, resumed, again = restore_everywhere(make)
""")
  assert g.check == ["ok", None]
  assert l.check == ["ok", None], l.check
  _same(g.values, l.values)
  _same(g.resumed, l.resumed)
  _same(g.again, l.again)


# ----------------------------------------------------------------------------
# PackAndBatchOperation (experimental/example_packing/pack_and_batch_test.py)
# ----------------------------------------------------------------------------

PAB_HEAD = """
def pack_and_batch(elements, length_struct, batch_size, max_sequences_per_bin=None):
  records = [grain.Record(grain.RecordMetadata(index=i), {k: np.array(v) for k, v in d.items()})
             for i, d in enumerate(elements)]
  op = grain.experimental.PackAndBatchOperation(batch_size=batch_size, length_struct=length_struct,
                                                max_sequences_per_bin=max_sequences_per_bin)
  return [[r.metadata.index, r.metadata.record_key, type(r.data).__name__, list(r.data)] for r in op(records)]
"""

PAB_CASES = {
    **{f"length_{n}": f"""
result = outcome(lambda: pack_and_batch(THREE, {{"inputs": {n}, "targets": {n}}}, {b}))
""" for n, b in ((3, 3), (4, 2), (5, 2), (6, 1), (7, 1))},
    "different_lengths": """
result = outcome(lambda: pack_and_batch(THREE, {"inputs": 3, "targets": 4}, 3))
""",
    "two_dimensional_features": """
elements = [
    {"input_tokens": [1, 2, 3], "input_vectors": [[0, 1, 2], [1, 2, 3], [2, 3, 4]], "targets": [10]},
    {"input_tokens": [4, 5], "input_vectors": [[3, 4, 5], [4, 5, 6]], "targets": [20, 30, 40]},
    {"input_tokens": [6], "input_vectors": [[5, 6, 7]], "targets": [50, 60]},
]
result = outcome(lambda: pack_and_batch(elements, {"input_tokens": 5, "input_vectors": 3, "targets": 5}, 2))
""",
    "into_multiple_batches": """
result = outcome(lambda: pack_and_batch(THREE, {"inputs": 3, "targets": 3}, 2))
""",
    "different_data_types": """
elements = [{"inputs": [1, 2, 3], "targets": [10.0]}, {"inputs": [4, 5], "targets": [20.0, 30.0, 40.0]},
            {"inputs": [6], "targets": [50.0, 60.0]}]
result = outcome(lambda: pack_and_batch(elements, {"inputs": 3, "targets": 3}, 3))
""",
    "max_sequences_per_bin": """
result = outcome(lambda: pack_and_batch(THREE, {"inputs": 6, "targets": 6}, 2, max_sequences_per_bin=2))
""",
    "failure_due_to_max_sequences_per_bin": """
result = outcome(lambda: pack_and_batch([{"inputs": [1]}, {"inputs": [2]}, {"inputs": [3]}], {"inputs": 10}, 2,
                                        max_sequences_per_bin=1))
""",
}


@pytest.mark.parametrize("name", sorted(PAB_CASES))
def test_pack_and_batch(name):
  g, l = _run(PAB_HEAD + PAB_CASES[name])
  assert g.result[0] == "ok", g.result
  _same_outcome(g.result, l.result)


def test_pack_and_batch_in_data_loader():
  # How PackAndBatchOperation is used: as a DataLoader operation (0 workers).
  g, l = _run("""
source = [{k: np.array(v) for k, v in d.items()} for d in THREE * 3]
def f():
  loader = grain.DataLoader(
      data_source=source,
      sampler=grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=1),
      operations=[grain.experimental.PackAndBatchOperation(batch_size=2, length_struct={"inputs": 4, "targets": 4})],
      worker_count=0)
  return [list(b) for b in loader]
result = outcome(f)
""")
  assert g.result[0] == "ok", g.result
  _same_outcome(g.result, l.result)


# ----------------------------------------------------------------------------
# Beyond Grain's tests: variants of its cases a user writes.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("packer", PACKERS)
def test_pack_nested_meta_feature_with_several_leaves(packer):
  # test_nested_feature with values in the nested meta feature: each leaf is packed and padded to its length.
  g, l = _run("""
els = [{"a": np.arange(n), "m": {"x": np.arange(n) + 5, "y": np.array([n])}} for n in (1, 2, 3)]
result = outcome(lambda: pack(PACKER, els, {"a": 4, "m": {"x": 4, "y": 3}}, num_packing_bins=2, convert=False,
                              meta_features=["m"]))
""", packer)
  assert g.result[0] == "ok", g.result
  _same_outcome(g.result, l.result)


@pytest.mark.parametrize("packer", PACKERS)
def test_nested_meta_feature_batched_and_restored(packer):
  # A batch right after packing stacks whole windows (loader's fast path): nested leaves must stack too.
  g, l = _run("""
els = [{"a": np.arange(n), "m": {"y": np.array([n]), "x": np.arange(n) + 5}} for n in (1, 2, 3, 1, 4, 2, 2)]
make = lambda: PACKER(grain.MapDataset.source(els).to_iter_dataset(), length_struct={"a": 4, "m": {"x": 4, "y": 3}},
                      num_packing_bins=2, meta_features=["m"], seed=3).batch(2)
batches = list(make())
it = iter(make())
next(it)
state = it.get_state()
rest = list(it)
it = iter(make())
it.set_state(state)
result = [batches, rest, list(it)]
""", packer)
  assert plain(g.result) == plain(l.result) and structure(g.result) == structure(l.result)
  assert plain(l.result[1]) == plain(l.result[2])


@pytest.mark.parametrize("path", [
    "grain._src.python.dataset.transformations.packing import FirstFitPackIterDataset as P",
    "grain._src.python.dataset.transformations.packing import BestFitPackIterDataset as P",
])
def test_pack_via_src_path(path):
  g, l = _run(f"""
from {path}
result = outcome(lambda: pack(P, THREE, {{"inputs": 4, "targets": 4}}, num_packing_bins=2))
""")
  assert g.result[0] == "ok", g.result
  _same_outcome(g.result, l.result)


def test_concat_then_split_and_pack_and_batch_via_src_path():
  g, l = _run(CTS_HEAD + PAB_HEAD + """
from grain._src.python.dataset.transformations.packing_concat_then_split import BOSHandling as B
from grain._src.python.dataset.transformations.packing_concat_then_split import ConcatThenSplitIterDataset as C
from grain._src.python.experimental.example_packing.packing import PackAndBatchOperation as PAB
cts = outcome(lambda: list(C(dummy(9), length_struct={"observation": 6, "index": 6}, meta_features={"index"},
                             bos_handling=B.REPLACE_FIRST_TOKEN_WITH_BOS, bos_token_id=1000, bos_features={"observation"})))
records = [grain.Record(grain.RecordMetadata(index=i), {k: np.array(v) for k, v in d.items()}) for i, d in enumerate(THREE)]
pab = outcome(lambda: [[r.metadata.index, list(r.data)] for r in PAB(batch_size=2, length_struct={"inputs": 3, "targets": 3})(records)])
""")
  assert g.cts[0] == "ok" and g.pab[0] == "ok"
  _same_outcome(g.cts, l.cts)
  _same_outcome(g.pab, l.pab)
