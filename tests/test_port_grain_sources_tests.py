"""Grain 0.2.18's source / index-shuffle / autotune / device_put tests, run on Grain and on loader.

Ported from (grain/_src/python/... at v0.2.18) onto the public names:

- dataset/sources/parquet_dataset_test.py: `grain.experimental.ParquetIterDataset`
  (read, several files interleaved, `set_slice`, checkpointing, interleave and
  window shuffle over files), plus columns of other types, several row groups
  and unreadable files.
- dataset/sources/tfrecord_dataset_test.py: `grain.experimental.TFRecordIterDataset`
  (missing, empty and invalid files, read, checkpointing); the test's
  `testdata/morris_sequence_first_5.tfrecord` is written here with its five
  records, plus a file cut inside a record.
- experimental/index_shuffle/python/index_shuffle_test.py:
  `grain.experimental.index_shuffle`, every value compared with Grain's, and
  argument errors.
- dataset/transformations/prefetch_autotune_test.py: what is reachable through
  `grain.experimental.pick_performance_config` / `PerformanceConfig`. The
  tests that patch `prefetch_autotune.cpu_count` pass the same count as
  `max_workers` instead. Not ported, having no public name:
  `_get_element_size_bytes` (test_get_element_size_numpy/_dict/_list),
  `_get_num_workers` (test_get_num_workers_calculates_from_mean_element_size),
  `_get_buffer_size` (test_get_buffer_size, ..._calculates_correctly,
  ..._respects_max_threads_cap), `_find_prefetch_iter_dataset_parents` (the
  four test_find_prefetch_iter_dataset_parent_* tests),
  `_get_average_element_size_mb` (test_get_average_element_size_mb,
  ..._returns_zero_for_empty_dataset), and test_autotune_passes_worker_init_fn
  (it patches `_get_num_workers`).
- experimental/device_put/device_put_test.py: at v0.2.18 the file holds only
  its imports (no test method), so its subject, `grain.experimental.device_put`,
  is exercised here on JAX's CPU device: elements, dtypes, devices, buffer
  sizes, a `MapDataset` input, argument errors.

Each case runs one snippet on Grain and, with only its import line changed, on
loader, and compares loader's result with Grain's actual result (elements,
order, types and dtypes, exception types, the stream after restoring a state
taken before every element, on each library with its own states) and with
Grain's test's expectation where it states one. Exceptions are compared by
class: loader's must be an instance of the class Grain raised (loader's are
subclasses that name the file), and for sources loader's message must name
the file.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # CPU only, before any JAX import.

import pytest  # pylint: disable=g-import-not-at-top

from tests import porting  # pylint: disable=g-import-not-at-top
from tests.faults_testing import write_tfrecords  # pylint: disable=g-import-not-at-top
from tests.porting import plain, structure  # pylint: disable=g-import-not-at-top

HEAD = """
import os
import grain
import numpy as np


def caught(f):
  # The exception itself: its class is compared across the libraries.
  try:
    f()
  except Exception as e:
    return e
  return None


def host(x):
  # jax.Arrays as numpy ones (np.testing cannot compare them), in any nesting.
  if isinstance(x, dict):
    return {k: host(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [host(v) for v in x]
  return np.asarray(x) if hasattr(x, "__array__") and not isinstance(x, np.ndarray) else x


def plain_eq(a, b):
  try:
    np.testing.assert_equal(host(a), host(b))
    return True
  except AssertionError:
    return False


""" + porting.RESTORE_AT_EVERY_STEP

SOME_TEXT = [
    [f"This is the first file the {o} record" for o in ("first", "second", "third", "forth")],
    [f"This is the second file the {o} record" for o in ("first", "second", "third", "forth")],
]
INTERLEAVED_TEXT = [t for pair in zip(*SOME_TEXT) for t in pair]
WINDOWSHUFFLED_TEXT = [
    "This is the first file the second record",
    "This is the second file the first record",
    "This is the first file the first record",
    "This is the first file the third record",
    "This is the second file the second record",
    "This is the second file the third record",
    "This is the second file the forth record",
    "This is the first file the forth record",
]
MORRIS = [b"1", b"1 1", b"2 1", b"1 2 1 1", b"1 1 1 2 2 1"]


def _all_restored(n):  # restore_at_every_step's pairs for n elements.
  return [[True, True]] * (n + 1)


def _rows(texts):
  return [{"text": t} for t in texts]


# name -> (snippet setting `result` (and `errors`, exceptions by name), Grain's test's expectation or None).
CASES = {
    # ---- parquet_dataset_test.py ---------------------------------------------
    "parquet_read_row_group": ("""
result = list(grain.experimental.ParquetIterDataset(parquet_files[0]))
""", _rows(SOME_TEXT[0])),
    "parquet_read_multiple_files": ("""
result = list(grain.experimental.ParquetIterDataset(parquet_files))
""", _rows(INTERLEAVED_TEXT)),
    # test_sharding_multi_file and test_set_slice (the same steps in Grain's file).
    "parquet_set_slice": ("""
result = []
for sl in (slice(0, 1), slice(1, 2)):
  dataset = grain.experimental.ParquetIterDataset(parquet_files)
  dataset.set_slice(sl)
  result.append(list(dataset))
""", [_rows(SOME_TEXT[0]), _rows(SOME_TEXT[1])]),
    # test_checkpointing and test_checkpointing_multi_file.
    "parquet_checkpointing": ("""
result = []
for paths in (parquet_files[0], parquet_files):
  make = lambda: grain.experimental.ParquetIterDataset(paths)
  result.append([grain.experimental.assert_equal_output_after_checkpoint(make()), restore_at_every_step(make)])
it = iter(grain.experimental.ParquetIterDataset(parquet_files[0]))
states = [it.get_state() for _ in it] + [it.get_state()]  # One file's: after each row, and at the end.
""", [[None, [_rows(SOME_TEXT[0]), _all_restored(4)]], [None, [_rows(INTERLEAVED_TEXT), _all_restored(8)]]]),
    "parquet_sharded_files_and_interleaved_dataset": ("""
dataset = grain.MapDataset.source(parquet_files)
dataset = dataset.map(grain.experimental.ParquetIterDataset)
dataset = grain.experimental.InterleaveIterDataset(dataset, cycle_length=len(parquet_files))
result = [list(iter(dataset))]
dataset = grain.experimental.WindowShuffleIterDataset(dataset, window_size=3, seed=42)
result.append(list(iter(dataset)))
result.append(restore_at_every_step(lambda: dataset))
""", [_rows(INTERLEAVED_TEXT), _rows(WINDOWSHUFFLED_TEXT), [_rows(WINDOWSHUFFLED_TEXT), _all_restored(8)]]),
    # Not in Grain's file: columns of several types (nulls, lists, bytes)
    # over row groups of 3, restored at every step.
    "parquet_column_types_and_row_groups": ("""
make = lambda: grain.experimental.ParquetIterDataset(typed_parquet)
rows, restored = restore_at_every_step(make)
# repr shows each value with its numpy type (and NaN, which == would not match).
result = [[{k: repr(v) for k, v in row.items()} for row in rows], restored]
""", [None, _all_restored(8)]),
    "parquet_read_kwargs_and_errors": ("""
result = [{k: repr(v) for k, v in row.items()}
          for row in grain.experimental.ParquetIterDataset(typed_parquet, memory_map=True)]
errors = {
    "missing": caught(lambda: iter(grain.experimental.ParquetIterDataset(os.path.join(data_dir, "nope.parquet")))),
    "missing_in_list": caught(lambda: list(grain.experimental.ParquetIterDataset(
        [parquet_files[0], os.path.join(data_dir, "nope.parquet")]))),
    "empty": caught(lambda: iter(grain.experimental.ParquetIterDataset(empty_file))),
    "not_parquet": caught(lambda: iter(grain.experimental.ParquetIterDataset(text_file))),
    "bad_read_kwarg": caught(lambda: iter(grain.experimental.ParquetIterDataset(typed_parquet, no_such_option=1))),
}
""", None),
    # ---- tfrecord_dataset_test.py --------------------------------------------
    "tfrecord_read_and_empty": ("""
result = [list(grain.experimental.TFRecordIterDataset(morris)),
          list(grain.experimental.TFRecordIterDataset(empty_file))]
""", [MORRIS, []]),
    "tfrecord_checkpointing": ("""
import grain.python as pygrain  # As Grain's test imports it.
make = lambda: grain.experimental.TFRecordIterDataset(morris)
it = iter(make())
states = []
for _ in range(3):
  next(it)
  states.append(it.get_state())
result = [pygrain.experimental.assert_equal_output_after_checkpoint(make()), restore_at_every_step(make)]
""", [None, [MORRIS, _all_restored(5)]]),
    # test_nonexistent_tfrecord_file, test_invalid_tfrecord_file, and a file
    # cut inside its third record (the records before it come first).
    "tfrecord_errors": ("""
nonexistent = os.path.join(data_dir, "non_existent_file.tfrecord")
truncated = grain.experimental.TFRecordIterDataset(truncated_file)
it = iter(truncated)
result = [next(it), next(it)]
errors = {
    "nonexistent_list": caught(lambda: list(grain.experimental.TFRecordIterDataset(nonexistent))),
    "nonexistent_iter": caught(lambda: iter(grain.experimental.TFRecordIterDataset(nonexistent))),
    "invalid": caught(lambda: list(grain.experimental.TFRecordIterDataset(invalid_file))),
    "truncated": caught(lambda: next(it)),
    "directory": caught(lambda: iter(grain.experimental.TFRecordIterDataset(data_dir))),
}
""", [MORRIS[0], MORRIS[1]]),
    # ---- index_shuffle_test.py -----------------------------------------------
    "index_shuffle": ("""
max_index = 46_204
values = [grain.experimental.index_shuffle(x, max_index, seed=52, rounds=4) for x in range(max_index + 1)]
result = [values, sorted(values) == list(range(max_index + 1))]
""", [None, True]),
    "index_shuffle_huge_number": ("""
max_index = 1_234_567_891
values = [grain.experimental.index_shuffle(x, max_index, seed=27, rounds=4) for x in range(10_000)]
result = [values, len(set(values)), all(0 <= y <= max_index for y in values)]
""", [None, 10_000, True]),
    "index_shuffle_single_record": ("""
result = grain.experimental.index_shuffle(index=0, max_index=0, seed=0, rounds=4)
""", 0),
    # test_index_shuffle_invalid_rounds, _rounds_too_large and _invalid_index,
    # with their messages (Grain's test matches them by regex).
    "index_shuffle_invalid_arguments": ("""
import re
f = grain.experimental.index_shuffle
ROUNDS = r'rounds must be an even integer between 4 and 1024'
INDEX = r'index must be in \\[0, max_index\\]'
calls = {
    "rounds_2": (dict(index=0, max_index=8, seed=33, rounds=2), ROUNDS),
    "rounds_1025": (dict(index=0, max_index=8, seed=33, rounds=1025), ROUNDS),
    "rounds_5": (dict(index=0, max_index=8, seed=76, rounds=5), ROUNDS),
    "rounds_too_large": (dict(index=0, max_index=1, seed=0, rounds=4294967294), ROUNDS),
    "index_negative": (dict(index=-1, max_index=8, seed=33, rounds=4), INDEX),
    "index_past_max": (dict(index=9, max_index=8, seed=76, rounds=4), INDEX),
}
errors = {name: caught(lambda: f(**kwargs)) for name, (kwargs, _) in calls.items()}
result = {name: bool(re.search(regex, str(errors[name]))) for name, (_, regex) in calls.items()}
# Not in Grain's file: arguments outside the binding's C types (int64, uint32).
errors.update({
    "seed_negative": caught(lambda: f(0, 8, -1, 4)),
    "seed_too_big": caught(lambda: f(0, 8, 2**32, 4)),
    "rounds_past_uint32": caught(lambda: f(0, 8, 1, 2**32)),
    "index_float": caught(lambda: f(0.0, 8, 1, 4)),
    "max_index_past_int64": caught(lambda: f(0, 2**63, 1, 4)),
    "rounds_missing": caught(lambda: f(1, 8, 3)),
    "max_index_negative": caught(lambda: f(0, -1, 1, 4)),
})
""", {"rounds_2": True, "rounds_1025": True, "rounds_5": True, "rounds_too_large": True, "index_negative": True,
      "index_past_max": True}),
    # Not in Grain's file: values over every block size Grain uses (16-bit
    # blocks, max_index = 2**B where the block cannot hold it, up to int64),
    # rounds, seeds and numpy/bool arguments.
    "index_shuffle_across_block_sizes": ("""
rng = np.random.default_rng(7)
result = []
# Tiny domains: Grain walks ~2**16 / (max_index + 1) steps a call there (ms each).
result.append([grain.experimental.index_shuffle(i, m, 9, 4) for m in (1, 2, 10) for i in range(m + 1)])
for bits in (15, 16, 17, 18, 20, 31, 32, 33, 40, 62, 63):
  for max_index in [int(rng.integers(2**(bits - 1), 2**bits)) for _ in range(3)] + [2**bits - 1]:
    for rounds in (4, 6, 64):
      seed = int(rng.integers(0, 2**32))
      indices = sorted({0, max_index, *(int(i) for i in rng.integers(0, max_index + 1, size=4))})
      result.append([grain.experimental.index_shuffle(i, max_index, seed, rounds) for i in indices])
for bits in (16, 18, 20, 32):
  result.append([grain.experimental.index_shuffle(i, 2**bits, 3, 4) for i in (0, 5, 2**bits)])
result.append([grain.experimental.index_shuffle(True, 8, 1, 4),
               grain.experimental.index_shuffle(np.int64(3), np.int32(8), np.uint32(5), 4),
               grain.experimental.index_shuffle(7, 2**20, 2**32 - 1, 1024)])
""", None),
    # ---- prefetch_autotune_test.py (public names) ---------------------------
    # test_autotune_calculates_workers_correctly (cpu_count patched to 16 there).
    "autotune_calculates_workers": ("""
element = np.zeros(100 * 1024 * 1024, dtype=np.uint8)
ds = grain.MapDataset.source([element] * 10).to_iter_dataset()
config = grain.experimental.pick_performance_config(ds=ds, ram_budget_mb=1024, max_workers=16, max_buffer_size=None)
result = [config.multiprocessing_options.num_workers, config.read_options.prefetch_buffer_size,
          config.read_options.num_threads]
""", [10, 10, 16]),
    "autotune_respects_max_workers_cap": ("""
element = np.zeros(10 * 1024 * 1024, dtype=np.uint8)
ds = grain.MapDataset.source([element] * 10).to_iter_dataset()
config = grain.experimental.pick_performance_config(ds=ds, ram_budget_mb=1024, max_workers=8, max_buffer_size=None)
result = [config.multiprocessing_options.num_workers, config.read_options.prefetch_buffer_size,
          config.read_options.num_threads]
""", [8, None, None]),
    # test_autotune_with_insufficient_samples_defaults_to_max_workers (cpu_count patched to 12 there).
    "autotune_insufficient_samples": ("""
ds = grain.MapDataset.source([1, 2, 3]).to_iter_dataset()
config = grain.experimental.pick_performance_config(ds=ds, ram_budget_mb=1024, max_workers=12, max_buffer_size=None)
result = [config.multiprocessing_options.num_workers, config.read_options.prefetch_buffer_size,
          config.read_options.num_threads]
""", [12, None, None]),
    "autotune_mixed_datasets": ("""
element1, element2, element3 = (np.zeros(n * 1024 * 1024, dtype=np.uint8) for n in (1, 3, 5))
ds1 = grain.MapDataset.source([element1, element2, element3]).to_iter_dataset()
ds2 = grain.MapDataset.source([element1] * 10).to_iter_dataset()
ds3 = grain.MapDataset.source([element2, element3] * 5).to_iter_dataset()
mixed_ds = grain.IterDataset.mix([ds3, grain.IterDataset.mix([ds1, ds2])])
config = grain.experimental.pick_performance_config(
    mixed_ds, ram_budget_mb=500, max_workers=None, max_buffer_size=None)
result = [config.read_options.prefetch_buffer_size, list(mixed_ds)[:3] == list(mixed_ds)[:3]]
""", [71, True]),
    # Not in Grain's file: the config's classes and fields, the positional
    # call refused, and the stream untouched by sampling.
    "performance_config_api": ("""
import dataclasses
PerformanceConfig = grain.experimental.PerformanceConfig
config = grain.experimental.pick_performance_config(
    grain.MapDataset.range(20).to_iter_dataset(), ram_budget_mb=64, max_workers=2, max_buffer_size=5)
ds = grain.MapDataset.range(8).map(lambda x: x * 2).to_iter_dataset()
grain.experimental.pick_performance_config(ds, ram_budget_mb=64, max_workers=2, max_buffer_size=None)
result = [
    [f.name for f in dataclasses.fields(PerformanceConfig)], [PerformanceConfig().multiprocessing_options,
                                                              PerformanceConfig().read_options],
    hasattr(PerformanceConfig(), "__dict__"),
    [type(config).__name__, type(config.multiprocessing_options).__name__, type(config.read_options).__name__],
    isinstance(config.multiprocessing_options, grain.MultiprocessingOptions),
    isinstance(config.read_options, grain.ReadOptions),
    [config.multiprocessing_options.num_workers, config.read_options.prefetch_buffer_size,
     config.read_options.num_threads],
    list(ds),
]
errors = {"positional": caught(lambda: grain.experimental.pick_performance_config(ds, 64, 2, None))}
""", None),
    # ---- device_put (device_put_test.py has no test method at v0.2.18) -------
    "device_put": ("""
import jax
device = jax.devices()[0]
ds = grain.MapDataset.range(10).map(lambda x: {"a": np.full((2,), x, np.int32), "b": np.float64(x)}).to_iter_dataset()
make = lambda: grain.experimental.device_put(ds, device, cpu_buffer_size=3, device_buffer_size=2)
rows, restored = restore_at_every_step(make)
kinds = [[type(v).__name__, str(v.dtype), v.shape, [str(d) for d in v.devices()]] for v in rows[0].values()]
sharding = jax.sharding.SingleDeviceSharding(device)
result = [rows, kinds, restored,
          list(grain.experimental.device_put(ds, device, cpu_buffer_size=0, device_buffer_size=0)),
          list(grain.experimental.device_put(ds, sharding)),
          list(grain.experimental.device_put(grain.MapDataset.range(3), device)),
          [str(v.dtype) for v in grain.experimental.device_put(grain.MapDataset.range(3), device)],
          isinstance(make(), grain.IterDataset)]
errors = {
    # Refused when the pipeline is built, as Grain's prefetch refuses it.
    "cpu_buffer_negative": caught(lambda: grain.experimental.device_put(ds, device, cpu_buffer_size=-1)),
    "device_buffer_negative": caught(lambda: grain.experimental.device_put(ds, device, device_buffer_size=-1)),
    "bad_device": caught(lambda: list(grain.experimental.device_put(ds, "nope"))),
    "not_a_jax_type": caught(lambda: list(grain.experimental.device_put(
        grain.MapDataset.range(3).to_iter_dataset().map(lambda x: "s"), device))),
}
""", [None, None, _all_restored(10), None, None, [0, 1, 2], ["int32"] * 3, True]),
}

# Errors of sources: loader's message names the file (key -> the input naming it).
NAMES_FILE = {
    "missing": "missing_parquet", "missing_in_list": "missing_parquet", "empty": "empty_file",
    "not_parquet": "text_file", "nonexistent_list": "nonexistent_tfrecord", "nonexistent_iter": "nonexistent_tfrecord",
    "invalid": "invalid_file", "truncated": "truncated_file", "directory": "data_dir",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  # Only tests need it eagerly.
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  d = tmp_path_factory.mktemp("port_sources")
  parquet_files = []
  for i, texts in enumerate(SOME_TEXT):
    path = str(d / f"text-{i}.parquet")
    pq.write_table(pa.table({"text": texts}), path, row_group_size=2)
    parquet_files.append(path)
  typed = str(d / "typed.parquet")
  n = 8
  pq.write_table(pa.table({
      "i64": pa.array(range(n), pa.int64()),
      "f32": pa.array([x / 4 for x in range(n)], pa.float32()),
      "flag": pa.array([x % 3 == 0 for x in range(n)]),
      "raw": pa.array([b"\x00b%d" % x for x in range(n)], pa.binary()),
      "maybe": pa.array([None if x % 2 else x for x in range(n)], pa.int32()),
      "seq": pa.array([list(range(x % 3)) for x in range(n)], pa.list_(pa.int16())),
  }), typed, row_group_size=3)
  (d / "empty").write_bytes(b"")
  (d / "text.txt").write_text("not parquet\n")
  morris = write_tfrecords(d / "morris_sequence_first_5.tfrecord", MORRIS)
  with open(morris, "rb") as f:
    whole = f.read()
  (d / "truncated.tfrecord").write_bytes(whole[:36 + 12 + 1])  # Two records, then the third's header and 1 byte.
  (d / "truncated_length_file.tfrecord").write_bytes(b"1")  # Grain's test_invalid_tfrecord_file.
  return {
      "data_dir": str(d), "parquet_files": parquet_files, "typed_parquet": typed, "empty_file": str(d / "empty"),
      "text_file": str(d / "text.txt"), "morris": morris, "truncated_file": str(d / "truncated.tfrecord"),
      "invalid_file": str(d / "truncated_length_file.tfrecord"), "missing_parquet": str(d / "nope.parquet"),
      "nonexistent_tfrecord": str(d / "non_existent_file.tfrecord"),
  }


def _fill_unstated(got, expected):
  """`got` with the parts Grain's test does not state (None in `expected`) set to None."""
  if expected is None:
    return None
  if isinstance(expected, list) and isinstance(got, list) and len(got) == len(expected):
    return [_fill_unstated(g, e) for g, e in zip(got, expected)]
  return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_grain(name, data):
  snippet, expected = CASES[name]
  g, l = porting.run_both(HEAD + snippet, **data)
  got = plain(g.result)
  if expected is not None:  # Grain's test's expectation, where it states one.
    assert _fill_unstated(got, plain(expected)) == plain(expected)
  if name in DOCUMENTED_DIFFERENCES:
    DOCUMENTED_DIFFERENCES[name](got, plain(l.result))
  else:
    assert plain(l.result) == got
    assert structure(l.result) == structure(g.result)  # Same types, shapes and dtypes.
  _assert_same_errors(getattr(g, "errors", {}), getattr(l, "errors", {}), data)
  # States, where a case keeps them: Grain's layout (loader adds its stamp keys, README "Checkpoint states").
  assert porting.grain_keys(getattr(l, "states", None)) == plain(getattr(g, "states", None))


def _assert_same_errors(grain_errors, loader_errors, data):
  assert loader_errors.keys() == grain_errors.keys()
  for key, theirs in grain_errors.items():
    ours = loader_errors[key]
    assert theirs is not None, f"{key}: Grain raised nothing"
    assert isinstance(ours, type(theirs)), f"{key}: loader raised {ours!r}, Grain {theirs!r}"
    if key in NAMES_FILE:
      assert data[NAMES_FILE[key]] in str(ours), f"{key}: loader's message does not name the file: {ours}"
      assert "\n" not in str(ours), f"{key}: loader's message is not one line: {ours}"


def _own_memory_model(g, l):
  # README ("pick_performance_config"): the numbers come from loader's own
  # memory model (chunks a worker holds), so they differ from Grain's. The
  # read options' threads are Grain's, and loader's choice fits the budget:
  # each of its 2 * (per_worker_buffer_size + 1) chunks per worker holds one
  # 100 MiB element, 2 workers in 1024 MiB; the buffer holds 10 elements.
  assert g == [10, 10, 16] and l == [2, 10, 16]


def _own_buffer_per_part(g, l):
  # README ("pick_performance_config"): loader gives each of the 3 parts a
  # third of the 500 MiB and sizes its buffer by that part's elements (3.8 MiB
  # on average for the first five of ds3: 43); Grain averages over all parts (71).
  assert g == [71, True] and l == [43, True]


DOCUMENTED_DIFFERENCES = {
    "autotune_calculates_workers": _own_memory_model,
    "autotune_mixed_datasets": _own_buffer_per_part,
}
