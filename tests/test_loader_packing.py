"""Packing (first-fit, best-fit, concat-then-split) and batch_and_pad against Grain 0.2.18.

Each parity test runs the same pipeline on real Grain and on loader, from the
same elements in the same order, and compares every packed example (keys,
dtypes, shapes, values), and the error if the input makes Grain raise.
"""

from __future__ import annotations

import functools
import json

import grain  # The reference: Grain 0.2.18 (dev extra).
import numpy as np
import pytest

import loader
from loader.transformations import batch_and_pad as batch_and_pad_lib
from loader.transformations import concat_then_split as cts_lib
from loader.transformations import packing as packing_lib
from loader.transformations import packing_utils
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import take
from loader_testing import take_with_errors

OPS = {
    "first_fit": (lambda: grain.experimental.FirstFitPackIterDataset, packing_lib.FirstFitPackIterDataset),
    "best_fit": (lambda: grain.experimental.BestFitPackIterDataset, packing_lib.BestFitPackIterDataset),
    "concat_then_split": (lambda: grain.experimental.ConcatThenSplitIterDataset,
                          cts_lib.ConcatThenSplitIterDataset),
}


def _run(ds) -> tuple[list, type | None]:
  """All elements, and the type of the error that ended the stream (None at its end)."""
  out = []
  try:
    for x in ds:
      out.append(x)
  except Exception as e:  # pylint: disable=broad-except
    return out, type(e)
  return out, None


def _both(op: str, elements: list, **kwargs) -> tuple[tuple[list, type | None], tuple[list, type | None]]:
  grain_op, our_op = OPS[op]
  if "bos_handling" in kwargs:
    name = kwargs["bos_handling"]
    g_kwargs = dict(kwargs, bos_handling=grain.experimental.BOSHandling[name])
    kwargs = dict(kwargs, bos_handling=cts_lib.BOSHandling[name])
  else:
    g_kwargs = kwargs
  theirs = _run(grain_op()(grain.MapDataset.source(elements).to_iter_dataset(), **g_kwargs))
  ours = _run(our_op(loader.MapDataset.source(elements).to_iter_dataset(), **kwargs))
  return theirs, ours


def assert_same_as_grain(op: str, elements: list, **kwargs) -> list:
  (theirs, their_error), (ours, our_error) = _both(op, elements, **kwargs)
  assert theirs, "the case should produce packed examples"
  assert_streams_equal(ours, theirs)
  assert our_error == their_error
  return ours


def ragged(n: int, seed: int, lengths: dict, *, scalars: tuple = (), extra: bool = True) -> list[dict]:
  """Dicts of random token arrays; `lengths[k] = (low, high, dtype[, trailing shape])`."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    x = {}
    for k, (lo, hi, dtype, *trailing) in lengths.items():
      shape = (int(rng.integers(lo, hi + 1)), *(trailing[0] if trailing else ()))
      x[k] = rng.integers(1, 1000, size=shape).astype(dtype)
    for k in scalars:
      x[k] = i
    if extra:
      x["text"] = f"doc {i}".encode()  # Not packed: dropped by the bin packers.
    out.append(x)
  return out


# ---- First-fit / best-fit --------------------------------------------------------


def mostly_equal_lengths(n: int, seed: int) -> list[dict]:
  """inputs/targets of equal length (one shared layout), but every 9th element differs."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    k = int(rng.integers(1, 9))
    x = rng.integers(1, 1000, size=k + 1).astype(np.int32)
    targets = x[1:] if i % 9 != 5 else x[2:]
    out.append({"inputs": x[:-1], "targets": targets})
  return out


BIN_CASES = {
    "dict_features_and_meta": dict(
        elements=lambda s: ragged(80, s, {"inputs": (0, 11, np.int32), "targets": (1, 9, np.int64),
                                          "seg_meta": (1, 3, np.int32)}, scalars=("doc_id",)),
        length_struct={"inputs": 12, "targets": 10, "seg_meta": 4}, num_packing_bins=3,
        meta_features=["seg_meta", "doc_id"]),
    "no_shuffle": dict(
        elements=lambda s: ragged(60, s, {"inputs": (1, 16, np.int32)}),
        length_struct={"inputs": 16}, num_packing_bins=4, shuffle_bins=False),
    "seeded_shuffle_grouped": dict(
        elements=lambda s: ragged(60, s, {"inputs": (1, 8, np.int32), "targets": (1, 8, np.int32)}),
        length_struct={"inputs": 16, "targets": 16}, num_packing_bins=5, seed=7,
        shuffle_bins_group_by_feature="inputs_segment_ids"),
    "alignment_padding_max_sequences": dict(
        elements=lambda s: ragged(70, s, {"inputs": (0, 9, np.int32), "targets": (1, 5, np.float32)}),
        length_struct={"inputs": 16, "targets": 12}, num_packing_bins=4, max_sequences_per_bin=2,
        pack_alignment_struct={"inputs": 4, "targets": 1}, padding_struct={"inputs": -1, "targets": None}),
    "multidim_and_scalar_features": dict(
        elements=lambda s: ragged(50, s, {"emb": (1, 6, np.float32, (3,))}, scalars=("flag",)),
        length_struct={"emb": 8, "flag": 3}, num_packing_bins=3),
    "exact_fit": dict(
        elements=lambda s: ragged(12, s, {"inputs": (8, 8, np.int32)}),
        length_struct={"inputs": 8}, num_packing_bins=4, shuffle_bins=False),
    "final_partial_window": dict(
        elements=lambda s: ragged(3, s, {"inputs": (2, 3, np.int32)}),
        length_struct={"inputs": 8}, num_packing_bins=4),
    # Above packing_utils._PY_SCAN_MAX_BINS bins the row search is vectorised.
    "many_bins": dict(
        elements=lambda s: ragged(300, s, {"inputs": (1, 12, np.int32), "targets": (0, 8, np.int32)}),
        length_struct={"inputs": 16, "targets": 12}, num_packing_bins=40),
    "many_bins_max_sequences": dict(
        elements=lambda s: ragged(300, s, {"inputs": (0, 12, np.int32)}),
        length_struct={"inputs": 16}, num_packing_bins=40, max_sequences_per_bin=3),
    "few_bins_zero_lengths_max_sequences": dict(
        elements=lambda s: ragged(100, s, {"inputs": (0, 6, np.int32)}),
        length_struct={"inputs": 10}, num_packing_bins=5, max_sequences_per_bin=2),
    # While lengths agree across features the window keeps one layout; the
    # element that breaks it gives each feature its own, mid-window.
    "equal_lengths_then_one_differs": dict(
        elements=lambda s: mostly_equal_lengths(60, s), length_struct={"inputs": 12, "targets": 12}, num_packing_bins=4),
    # A shared layout over values that are not arrays (scalars: one token each).
    "shared_scalars": dict(
        elements=lambda s: [{"a": i, "b": float(i) / 2} for i in range(20 + s)],
        length_struct={"a": 5, "b": 5}, num_packing_bins=3),
    "one_bin": dict(
        elements=lambda s: ragged(30, s, {"inputs": (1, 6, np.int32)}),
        length_struct={"inputs": 8}, num_packing_bins=1),
}


@pytest.mark.parametrize("op", ["first_fit", "best_fit"])
@pytest.mark.parametrize("case", sorted(BIN_CASES))
def test_bin_packing_equals_grain(op, case):
  max_scan_bins = packing_utils._PY_SCAN_MAX_BINS  # pylint: disable=protected-access
  assert BIN_CASES["many_bins"]["num_packing_bins"] > max_scan_bins
  kwargs = dict(BIN_CASES[case])
  make_elements = kwargs.pop("elements")
  for seed in range(3):
    assert_same_as_grain(op, make_elements(seed), **kwargs)


@pytest.mark.parametrize("op", ["first_fit", "best_fit"])
@pytest.mark.parametrize("case", ["no_shuffle", "seeded_shuffle_grouped", "alignment_padding_max_sequences",
                                  "equal_lengths_then_one_differs",
                                  "multidim_and_scalar_features", "final_partial_window", "many_bins"])
@pytest.mark.parametrize("batch_size,drop_remainder", [(1, False), (2, False), (3, True), (5, False), (7, True)])
def test_default_batch_after_packing_equals_grain(op, case, batch_size, drop_remainder):
  # batch() right after packing stacks whole runs of rows at once (stacked_rows);
  # the batches must be Grain's: rows within and across windows, the remainder.
  kwargs = dict(BIN_CASES[case])
  elements = kwargs.pop("elements")(0)
  grain_op, our_op = OPS[op]
  theirs = list(grain_op()(grain.MapDataset.source(elements).to_iter_dataset(), **kwargs)
                .batch(batch_size, drop_remainder=drop_remainder))
  ours_ds = our_op(loader.MapDataset.source(elements).to_iter_dataset(), **kwargs).batch(
      batch_size, drop_remainder=drop_remainder)
  assert len(theirs) >= (0 if case == "final_partial_window" else 2)
  assert_streams_equal(list(ours_ds), theirs)
  assert_restore_at_every_step_gives_same_stream(lambda: our_op(
      loader.MapDataset.source(elements).to_iter_dataset(), **kwargs).batch(batch_size, drop_remainder=drop_remainder))


def test_batch_after_packing_consumes_the_rows_read_before_an_error():
  # As with batch over next(): an error while filling a window loses the rows
  # this batch already took, and the next batch goes on after the failure.
  def make(lib, experimental, fail_at):
    def check(x):
      if int(x["inputs"][0]) == fail_at:
        raise ValueError("bad element")
      return x
    elements = [{"inputs": np.full(n, i, np.int32)} for i, n in enumerate([3, 4, 2, 5, 3, 6, 1, 4, 5, 2, 3, 6])]
    ds = lib.MapDataset.source(elements).to_iter_dataset().map(check)
    ds = experimental.FirstFitPackIterDataset(ds, length_struct={"inputs": 8}, num_packing_bins=2, seed=3)
    return ds.batch(3)

  def run(ds):
    return take_with_errors(iter(ds), 12, errors=ValueError)

  for fail_at in (2, 5, 9):
    theirs = run(make(grain, grain.experimental, fail_at))
    ours = run(make(loader, loader.experimental, fail_at))
    assert [type(x) for x in ours] == [type(x) for x in theirs]
    assert "bad element" in ours
    assert_streams_equal([x for x in ours if isinstance(x, dict)], [x for x in theirs if isinstance(x, dict)])


@pytest.mark.parametrize("op", ["first_fit", "best_fit"])
def test_element_longer_than_length_raises_like_grain(op):
  elements = ragged(20, 0, {"inputs": (1, 6, np.int32)})
  elements[13]["inputs"] = np.arange(1, 10, dtype=np.int32)  # 9 > 8.
  (theirs, their_error), (ours, our_error) = _both(op, elements, length_struct={"inputs": 8}, num_packing_bins=2)
  assert their_error is ValueError and our_error is ValueError
  assert_streams_equal(ours, theirs)
  # Grain's message, its key path included.
  with pytest.raises(ValueError, match=r"max length. Exceeds: \(feature_path, feature_length, max_length\) = "
                                       r"\[\(\(DictKey\(key='inputs'\),\), 9, 8\)\]$"):
    list(OPS[op][1](loader.MapDataset.source(elements).to_iter_dataset(), length_struct={"inputs": 8},
                    num_packing_bins=2))


def test_packed_example_layout():
  elements = [{"inputs": np.array([5, 6, 7]), "id": 1}, {"inputs": np.array([8, 9]), "id": 2}]
  ds = packing_lib.FirstFitPackIterDataset(loader.MapDataset.source(elements).to_iter_dataset(),
                                           length_struct={"inputs": 6}, num_packing_bins=2, shuffle_bins=False,
                                           meta_features=["id"])
  (x,) = list(ds)
  assert list(x) == ["id", "inputs", "inputs_positions", "inputs_segment_ids"]
  assert x["id"] == [1, 2]
  np.testing.assert_array_equal(x["inputs"], [5, 6, 7, 8, 9, 0])
  np.testing.assert_array_equal(x["inputs_segment_ids"], [1, 1, 1, 2, 2, 0])
  np.testing.assert_array_equal(x["inputs_positions"], [0, 1, 2, 0, 1, 0])
  assert x["inputs_segment_ids"].dtype == np.int32 and x["inputs"].dtype == np.int64


def test_bin_packing_argument_errors():
  src = loader.MapDataset.range(3).to_iter_dataset()
  ff = packing_lib.FirstFitPackIterDataset
  with pytest.raises(ValueError, match="length_struct"):
    ff(src, length_struct=[8], num_packing_bins=2)
  with pytest.raises(ValueError, match="num_packing_bins"):
    ff(src, length_struct={"a": 8}, num_packing_bins=0)
  with pytest.raises(ValueError, match="max_sequences_per_bin"):
    ff(src, length_struct={"a": 8}, num_packing_bins=2, max_sequences_per_bin=0)
  with pytest.raises(ValueError, match="a_positions"):
    ff(src, length_struct={"a": 8}, num_packing_bins=2, shuffle_bins_group_by_feature="b")
  with pytest.raises(ValueError, match="padding_struct"):
    ff(src, length_struct={"a": 8}, num_packing_bins=2, padding_struct={"b": 0})
  with pytest.raises(ValueError, match=r"\['meta'\]"):
    ff(src, length_struct={"a": 8}, num_packing_bins=2, meta_features="meta")
  elements = [{"b": np.arange(3)}]
  with pytest.raises(KeyError, match="'a'"):
    list(ff(loader.MapDataset.source(elements).to_iter_dataset(), length_struct={"a": 8}, num_packing_bins=2))


# ---- Concat-then-split ---------------------------------------------------------


def _same_lengths(n: int, seed: int, lo: int, hi: int, keys=("inputs", "targets")) -> list[dict]:
  """MaxText's pretraining shape: targets is a copy of inputs."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    tokens = rng.integers(3, 1000, size=int(rng.integers(lo, hi + 1))).astype(np.int32)
    out.append({k: tokens.copy() for k in keys})
  return out


CTS_CASES = {
    "single_feature": dict(elements=lambda s: _same_lengths(60, s, 1, 30, keys=("inputs",)),
                           length_struct={"inputs": 16}),
    "maxtext_inputs_targets": dict(elements=lambda s: _same_lengths(60, s, 1, 40),
                                   length_struct={"inputs": 16, "targets": 16}),
    "bos": dict(elements=lambda s: _same_lengths(60, s, 1, 40), length_struct={"inputs": 16, "targets": 16},
                bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS", bos_features=["inputs", "targets"], bos_token_id=1),
    "full_length_passthrough": dict(elements=lambda s: _same_lengths(60, s, 4, 12, keys=("inputs",)),
                                    length_struct={"inputs": 8}, split_full_length_features=False),
    "meta_and_ragged_features": dict(
        elements=lambda s: ragged(60, s, {"inputs": (0, 11, np.int32), "targets": (1, 9, np.int64),
                                          "meta": (1, 2, np.int32)}, extra=False),
        length_struct={"inputs": 8, "targets": 8, "meta": 3}, meta_features=["meta"]),
    "meta_ragged_no_full_split": dict(
        elements=lambda s: ragged(60, s, {"inputs": (0, 11, np.int32), "targets": (1, 9, np.int64),
                                          "meta": (1, 2, np.int32)}, extra=False),
        length_struct={"inputs": 8, "targets": 6, "meta": 3}, meta_features=["meta"],
        split_full_length_features=False),
    "multidim_and_scalar_meta": dict(
        elements=lambda s: ragged(40, s, {"emb": (1, 9, np.float32, (2,))}, scalars=("doc",), extra=False),
        length_struct={"emb": 6, "doc": 2}, meta_features=["doc"]),
}


@pytest.mark.parametrize("case", sorted(CTS_CASES))
def test_concat_then_split_equals_grain(case):
  kwargs = dict(CTS_CASES[case])
  make_elements = kwargs.pop("elements")
  for seed in range(3):
    assert_same_as_grain("concat_then_split", make_elements(seed), **kwargs)


def test_concat_then_split_bos_on_empty_tail_continues_where_grain_raises():
  # With features of different lengths a split can leave an empty part at the
  # end of a buffer; Grain then writes BOS one past the end (IndexError). We
  # emit Grain's examples up to there and carry on.
  kwargs = dict(length_struct={"inputs": 8, "targets": 8}, bos_handling="REPLACE_FIRST_TOKEN_WITH_BOS",
                bos_features=["inputs"], bos_token_id=99)
  for seed in range(4):
    elements = ragged(60, seed, {"inputs": (1, 11, np.int32), "targets": (1, 9, np.int64)}, extra=False)
    (theirs, their_error), (ours, our_error) = _both("concat_then_split", elements, **kwargs)
    assert our_error is None and their_error in (None, IndexError)
    assert_streams_equal(ours[:len(theirs)], theirs)


def test_concat_then_split_layout():
  elements = [{"t": np.array([1, 2, 3])}, {"t": np.array([4, 5, 6, 7])}, {"t": np.array([8])}]
  ds = cts_lib.ConcatThenSplitIterDataset(loader.MapDataset.source(elements).to_iter_dataset(),
                                          length_struct={"t": 5})
  out = list(ds)
  assert [list(x) for x in out] == [["t", "t_segment_ids", "t_positions"]] * 2
  np.testing.assert_array_equal(out[0]["t"], [1, 2, 3, 4, 5])
  np.testing.assert_array_equal(out[0]["t_segment_ids"], [1, 1, 1, 2, 2])
  np.testing.assert_array_equal(out[1]["t"], [6, 7, 8, 0, 0])
  # As in Grain, the continuation of a split element restarts at position 0.
  np.testing.assert_array_equal(out[1]["t_positions"], [0, 1, 0, 0, 0])


def test_concat_then_split_errors():
  src = loader.MapDataset.source([{"a": np.arange(3), "b": np.arange(2)}]).to_iter_dataset()
  cts = cts_lib.ConcatThenSplitIterDataset
  with pytest.raises(ValueError, match="bos_token_id"):
    cts(src, length_struct={"a": 4}, bos_handling=cts_lib.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS)
  with pytest.raises(ValueError, match="must not be set"):
    cts(src, length_struct={"a": 4}, bos_token_id=1)
  with pytest.raises(ValueError, match="overlap"):
    cts(src, length_struct={"a": 4}, meta_features=["a"], bos_features=["a"],
        bos_handling=cts_lib.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, bos_token_id=1)
  with pytest.raises(ValueError, match=r"structure \['a', 'b'\] but target sequence length is \{'a': 4\}\. There must be a sequence length for each feature"):
    list(cts(src, length_struct={"a": 4}))
  with pytest.raises(ValueError, match="meta features are longer"):
    list(cts(src, length_struct={"a": 4, "b": 1}, meta_features=["b"]))
  # Grain's own enum members are accepted too.
  ds = cts(src, length_struct={"a": 4, "b": 4},
           bos_handling=grain.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
           bos_features=["a"], bos_token_id=9)
  assert next(iter(ds))["a"][0] == 9


# ---- batch_and_pad -----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4])
def test_batch_and_pad_equals_grain(n):
  values = [{"tokens": np.arange(i, i + 3, dtype=np.int32), "w": np.float32(i), "pair": (i, np.ones(2) * i)}
            for i in range(n)]
  theirs = grain.experimental.batch_and_pad(values, batch_size=4, pad_value=-1)
  ours = batch_and_pad_lib.batch_and_pad(values, batch_size=4, pad_value=-1)
  assert_streams_equal([ours], [theirs])


def test_batch_and_pad_as_batch_fn_equals_grain():
  fn = functools.partial(grain.experimental.batch_and_pad, batch_size=3)
  ours_fn = functools.partial(batch_and_pad_lib.batch_and_pad, batch_size=3)
  theirs = list(grain.MapDataset.range(1, 5).to_iter_dataset().batch(3, batch_fn=fn))
  ours = list(loader.MapDataset.range(1, 5).to_iter_dataset().batch(3, batch_fn=ours_fn))
  assert_streams_equal(ours, theirs)
  np.testing.assert_array_equal(ours[1], [4, 0, 0])


def test_batch_and_pad_errors():
  with pytest.raises(ValueError, match="0 values"):
    batch_and_pad_lib.batch_and_pad([], batch_size=2)
  with pytest.raises(ValueError, match="Cannot batch 3 values to batch_size=2"):
    batch_and_pad_lib.batch_and_pad([1, 2, 3], batch_size=2)


# ---- A MaxText-style pipeline ------------------------------------------------------


def _texts(n: int, seed: int) -> list[bytes]:
  rng = np.random.default_rng(seed)
  words = [b"the", b"a", b"packing", b"loader", b"grain", b"token", b"of", b"model"]
  return [b" ".join(words[j] for j in rng.integers(0, len(words), size=int(rng.integers(1, 30))))
          for _ in range(n)]


def _make_tokenize():
  # A local function: cloudpickle sends it by value, so mp_prefetch workers
  # need not import this test module (and Grain with it) to unpickle it.
  def tokenize(text: bytes) -> dict[str, np.ndarray]:
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.int32)[:64]
    return {"inputs": tokens, "targets": tokens}

  return tokenize


def pack_pipeline(lib, experimental, texts, *, kind: str = "first_fit", batch_size: int = 4):
  ds = lib.MapDataset.source(texts).map(_make_tokenize()).to_iter_dataset()
  length_struct = {"inputs": 64, "targets": 64}
  if kind == "first_fit":
    ds = experimental.FirstFitPackIterDataset(ds, length_struct=length_struct, num_packing_bins=batch_size)
  elif kind == "best_fit":
    ds = experimental.BestFitPackIterDataset(ds, length_struct=length_struct, num_packing_bins=batch_size)
  else:
    ds = experimental.ConcatThenSplitIterDataset(ds, length_struct=length_struct)
  return ds.batch(batch_size, batch_fn=functools.partial(experimental.batch_and_pad, batch_size=batch_size))


@pytest.mark.parametrize("kind", ["first_fit", "best_fit", "concat_then_split"])
def test_maxtext_style_pipeline_batches_equal_grain(kind):
  # The same Grain code, with `grain` = loader: loader.experimental re-exports these modules' names.
  assert loader.experimental.FirstFitPackIterDataset is packing_lib.FirstFitPackIterDataset
  texts = _texts(120, 0)
  theirs = list(pack_pipeline(grain, grain.experimental, texts, kind=kind))
  ours = list(pack_pipeline(loader, loader.experimental, texts, kind=kind))
  assert len(ours) > 5
  assert_streams_equal(ours, theirs)


def test_packed_batches_same_for_any_worker_count():
  texts = _texts(150, 1)
  theirs = list(pack_pipeline(grain, grain.experimental, texts))
  for workers in (0, 1, 2):
    ds = pack_pipeline(loader, loader.experimental, texts)
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
    assert_streams_equal(list(ds), theirs)


# ---- Checkpoints -------------------------------------------------------------------


RESTORE_CASES = {
    "first_fit_meta_shuffled": lambda: packing_lib.FirstFitPackIterDataset(
        loader.MapDataset.source(ragged(40, 3, {"inputs": (1, 9, np.int32)}, scalars=("id",))).to_iter_dataset(),
        length_struct={"inputs": 12}, num_packing_bins=3, meta_features=["id"], seed=5),
    "best_fit_grouped": lambda: packing_lib.BestFitPackIterDataset(
        loader.MapDataset.source(ragged(40, 4, {"inputs": (1, 9, np.int32)})).to_iter_dataset(),
        length_struct={"inputs": 12}, num_packing_bins=3, shuffle_bins_group_by_feature="inputs_segment_ids"),
    "first_fit_after_filter_then_batch": lambda: packing_lib.FirstFitPackIterDataset(
        loader.MapDataset.source(ragged(50, 5, {"inputs": (1, 9, np.int32)})).to_iter_dataset()
        .filter(lambda x: len(x["inputs"]) != 4),
        length_struct={"inputs": 12}, num_packing_bins=3).batch(2),
    "concat_then_split": lambda: cts_lib.ConcatThenSplitIterDataset(
        loader.MapDataset.source(_same_lengths(40, 6, 1, 20)).to_iter_dataset(),
        length_struct={"inputs": 8, "targets": 8}),
    "concat_then_split_meta_passthrough": lambda: cts_lib.ConcatThenSplitIterDataset(
        loader.MapDataset.source(ragged(40, 7, {"inputs": (0, 11, np.int32), "meta": (1, 2, np.int32)},
                                        extra=False)).to_iter_dataset(),
        length_struct={"inputs": 8, "meta": 3}, meta_features=["meta"], split_full_length_features=False),
}


@pytest.mark.parametrize("case", sorted(RESTORE_CASES))
def test_restore_at_every_step(case):
  assert_restore_at_every_step_gives_same_stream(RESTORE_CASES[case])


@pytest.mark.parametrize("case", ["first_fit_meta_shuffled", "concat_then_split_meta_passthrough"])
def test_state_round_trips_through_json_at_every_step(case):
  make = RESTORE_CASES[case]
  with iter(make()) as it:
    states, stream = [], []
    while True:
      states.append(json.dumps(it.get_state()))
      try:
        stream.append(next(it))
      except StopIteration:
        break
  for k in range(0, len(states), 3):
    with iter(make()) as it:
      it.set_state(json.loads(states[k]))
      assert_streams_equal(list(it), stream[k:])


@pytest.mark.parametrize("kind", ["first_fit", "concat_then_split"])
def test_restore_into_two_workers(kind):
  texts = _texts(100, 2)
  def make(workers):
    ds = pack_pipeline(loader, loader.experimental, texts, kind=kind)
    return ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))

  assert_restore_at_every_step_gives_same_stream(lambda: make(0), make_restore_ds=lambda: make(2), steps=(1, 4))


def test_state_layout():
  elements = ragged(200, 8, {"inputs": (1, 9, np.int32)})
  ds = packing_lib.FirstFitPackIterDataset(loader.MapDataset.source(elements).to_iter_dataset(),
                                           length_struct={"inputs": 16}, num_packing_bins=4)
  with iter(ds) as it:
    take(it, 37)
    state = it.get_state()
  assert {"replay_from", "skip", "next_row", "counter"} <= set(state)
  assert state["counter"] == 37 and 0 <= state["next_row"] < 4
  # A restore reads at most two windows (4 rows of <= 16 elements each) before
  # the row it resumes at.
  assert 0 <= state["skip"] <= 64


@pytest.mark.parametrize("kind", ["FirstFitPackIterDataset", "BestFitPackIterDataset"])
def test_grain_refuses_a_loader_packing_state_and_loader_still_reads_its_older_layout(kind):
  # Going back to Grain with a loader checkpoint: Grain reads "parent" as the
  # start of the packed window, ours is a replay position: Grain must fail on
  # it, not resume at other rows. States loader wrote before (that position
  # under "parent") still resume here.

  def make(lib):
    lengths = [3, 5, 2, 7, 4, 1, 6, 2, 3, 5, 8, 1, 1, 4, 6, 2, 7, 3]
    src = lib.MapDataset.source([{"t": np.arange(n)} for n in lengths]).to_iter_dataset()
    return getattr(lib.experimental, kind)(src, length_struct={"t": 8}, num_packing_bins=2, shuffle_bins=False)

  for k in range(12):
    it = iter(make(loader))
    take(it, k)
    state = it.get_state()
    rest = [x["t"].tolist() for x in it]
    bare = {key: v for key, v in state.items() if key not in ("pipeline", "loader_state_version")}
    with pytest.raises(KeyError, match="parent"):
      iter(make(grain)).set_state(bare)
    older = {("parent" if key == "replay_from" else key): v for key, v in state.items()}
    again = iter(make(loader))
    again.set_state(older)
    assert [x["t"].tolist() for x in again] == rest, k


def test_state_of_another_packing_configuration_is_refused():
  elements = ragged(50, 9, {"inputs": (1, 9, np.int32)})
  make = lambda bins: packing_lib.FirstFitPackIterDataset(  # pylint: disable=g-long-lambda
      loader.MapDataset.source(elements).to_iter_dataset(), length_struct={"inputs": 16}, num_packing_bins=bins)
  with iter(make(4)) as it:
    take(it, 5)
    state = it.get_state()
  with iter(make(3)) as it, pytest.raises(ValueError, match="num_packing_bins=3"):
    it.set_state(state)


@pytest.mark.parametrize("ids", [[b"doc0", b"doc1"], ["doc0", "doc1"]], ids=["bytes", "str"])
@pytest.mark.parametrize("cls", ["FirstFitPackIterDataset", "BestFitPackIterDataset"])
def test_a_string_meta_feature_pads_with_empty_strings_as_grain(cls, ids):
  docs = [{"inputs": np.array([5, 6, 7], np.int32), "doc": np.array([ids[0]])},
          {"inputs": np.array([8, 9], np.int32), "doc": np.array([ids[1]])}]

  def packed(lib):
    return list(getattr(lib.experimental, cls)(lib.MapDataset.source(docs).to_iter_dataset(),
                                                length_struct={"inputs": 8, "doc": 4}, num_packing_bins=1,
                                                meta_features=["doc"]))
  ours, theirs = packed(loader), packed(grain)
  assert ours[0]["doc"].tolist() == theirs[0]["doc"].tolist() == [ids[0], ids[1], ids[0][:0], ids[0][:0]]
  assert ours[0]["doc"].dtype == theirs[0]["doc"].dtype


@pytest.mark.parametrize("kind", ["FirstFitPackIterDataset", "BestFitPackIterDataset", "ConcatThenSplitIterDataset"])
def test_a_state_grain_wrote_resumes_here_at_every_step(kind):
  """Moving a packed-LM training run from Grain: its checkpoint's data state continues the same stream."""

  def element(i):
    return {"tokens": np.arange(1 + (i * 7) % 9, dtype=np.int32) + 100 * i, "weights": np.full(1 + i % 3, i)}

  def make(lib):
    parent = lib.MapDataset.range(40).shuffle(seed=3).map(element).to_iter_dataset()
    lengths = {"tokens": 10, "weights": 5}
    if kind == "ConcatThenSplitIterDataset":
      return lib.experimental.ConcatThenSplitIterDataset(parent, length_struct=lengths)
    return getattr(lib.experimental, kind)(parent, length_struct=lengths, num_packing_bins=3, shuffle_bins=True,
                                            seed=5)

  def plain(x):
    return {k: v.tolist() for k, v in sorted(x.items())}

  theirs = iter(make(grain))
  states, stream = [], []
  while True:
    states.append(json.loads(json.dumps(theirs.get_state())))
    try:
      stream.append(plain(next(theirs)))
    except StopIteration:
      break
  assert len(stream) > 10
  assert [plain(x) for x in make(loader)] == stream
  for k, state in enumerate(states):
    ours = iter(make(loader))
    ours.set_state(state)
    assert [plain(x) for x in ours] == stream[k:], f"after restoring Grain's state at step {k}"
