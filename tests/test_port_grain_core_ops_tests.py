"""Grain 0.2.18's core transformation tests, run on Grain and, with only the import line changed, on loader.

Ported from grain/_src/python/dataset/transformations/{batch,map,filter,slice,
repeat,limit,flatmap,rebatch}_test.py at v0.2.18, rewritten against the public
names (`grain.MapDataset`, `grain.IterDataset`, `grain.experimental.*`,
`grain.transforms.*`) instead of the internal classes (`BatchMapDataset`,
`MapMapDataset`, `RepeatIterDataset` ...). Each case sets `result` in a snippet
that runs once on Grain and once on loader; loader's result must equal Grain's
(values, array shapes and dtypes, exception types and the message text Grain's
test checks), and Grain's result must equal the expectation of Grain's test
where it states one. Checkpoints are restored at every step on each library
with its own states.
"""

from __future__ import annotations

import pytest

from tests import porting
from tests.porting import plain, structure

HEAD = """
import dataclasses
import functools
import itertools
import re
import sys
import grain
import numpy as np


def catch(fn, pattern=None):
  '''["ok", value] or [the exception's nearest built-in type, whether its message matches `pattern`].

  The nearest built-in type: what an `except` clause written for Grain catches (a library's own
  subclass of ValueError counts as ValueError).
  '''
  try:
    return ["ok", fn()]
  except Exception as e:  # pylint: disable=broad-except
    kind = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
    return [kind.__name__, None if pattern is None else bool(re.search(pattern, str(e)))]


""" + porting.RESTORE_AT_EVERY_STEP_ASSERTED + """


def after_checkpoint(ds):
  '''The library's own public grain.experimental.assert_equal_output_after_checkpoint.'''
  grain.experimental.assert_equal_output_after_checkpoint(ds)
  return True


def next_indices(ds, steps):
  it = ds.__iter__()
  out = [grain.experimental.get_next_index(it)]
  for _ in range(steps):
    try:
      next(it)
    except StopIteration:
      out.append("stop")
    out.append(grain.experimental.get_next_index(it))
  return out


def set_next_indices(ds, indices):
  out = []
  for i in indices:
    it = ds.__iter__()
    grain.experimental.set_next_index(it, i)
    out.append(next(it))
  return out


class EmptyMapDataset(grain.MapDataset):

  def __init__(self):
    super().__init__(parents=[])

  def __len__(self):
    return 0

  def __getitem__(self, index):
    raise IndexError("Index out of range")


class MapWithElementSpecInference(grain.transforms.Map):

  def map(self, element):
    return {"parsed": np.full((10, 10), element), "nested": {"record": str(element)}}

  def output_spec(self, input_spec):
    assert input_spec == grain.experimental.ShapeDtypeStruct(shape=(), dtype=np.int64), input_spec
    return {
        "parsed": grain.experimental.ShapeDtypeStruct(shape=(10, 10), dtype=np.int64),
        "nested": {"record": grain.experimental.ShapeDtypeStruct(shape=(), dtype=str)},
    }


def spec(ds):
  s = grain.experimental.get_element_spec(ds)
  return repr(s)


@dataclasses.dataclass(frozen=True)
class MapWithNoTransform(grain.transforms.Map):

  def map(self, element):
    return element


@dataclasses.dataclass(frozen=True)
class MapWithTransform(grain.transforms.Map):

  def map(self, element):
    return element + 1


@dataclasses.dataclass(frozen=True)
class RandomMapWithTransform(grain.transforms.RandomMap):

  def random_map(self, element, rng):
    delta = 0.1
    return element + rng.uniform(-delta, delta)


@dataclasses.dataclass(frozen=True)
class RandomMapWithDeterminismTransform(grain.transforms.RandomMap):

  def random_map(self, element, rng):
    return element + rng.integers(0, 10)


@dataclasses.dataclass(frozen=True)
class AddIndexTransform(grain.transforms.MapWithIndex):

  def map_with_index(self, index, element):
    return (index, element)


@dataclasses.dataclass(frozen=True)
class FilterNoElements(grain.transforms.Filter):

  def filter(self, element):
    return True


@dataclasses.dataclass(frozen=True)
class FilterAllElements(grain.transforms.Filter):

  def filter(self, element):
    return False


@dataclasses.dataclass(frozen=True)
class FilterEvenElementsOnly(grain.transforms.Filter):

  def filter(self, element):
    return element % 2


@dataclasses.dataclass(frozen=True)
class FixedSizeSplitWithNoTransform(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element):
    for _ in range(self.max_fan_out):
      yield element


@dataclasses.dataclass(frozen=True)
class FixedSizeSplitWithTransform(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element):
    for _ in range(self.max_fan_out):
      yield element + 1


@dataclasses.dataclass(frozen=True)
class VariableSizeCappedSplitWithNoTransform(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element):
    return [element] * min(element, self.max_fan_out)


@dataclasses.dataclass(frozen=True)
class VariableSizeUncappedSplitWithNoTransform(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element):
    return [element] * element


class Unbatch(grain.experimental.FlatMapTransform):

  def flat_map(self, elements):
    return [e for e in elements]


class GetTestTreeElement(grain.transforms.Map):

  def map(self, x):
    return {f"key_{i}": np.full(2, x) for i in range(3)}

  def output_spec(self, _):
    return {f"key_{i}": grain.experimental.ShapeDtypeStruct(shape=(2,), dtype=np.int64) for i in range(3)}
"""

SAME_STRUCTURE = "Expected all input elements to have the same structure but got:"

# name -> (snippet setting `result`, Grain's test's expectation (of plain(result)) or None).
CASES = {}

# ---- batch_test.py ----------------------------------------------------------------------------

CASES["batch_mismatched_shapes_and_structures_raise"] = ("""
pattern = "Expected all input elements to have the same structure but got:"
shapes = [{"a": np.asarray([1, 2, 3])}, {"a": np.asarray([4, 5])}]
structures_2 = [{"a": np.asarray([1, 2, 3])}, {"b": np.asarray(0.5)}]
structures_3 = structures_2 + [{"c": np.asarray(True)}]
result = []
for values in (shapes, structures_2, structures_3):
  result.append(catch(lambda: grain.MapDataset.source(values).batch(len(values))[0], pattern))
  result.append(catch(lambda: list(grain.MapDataset.source(values).to_iter_dataset().batch(len(values))), pattern))
""", [["ValueError", True]] * 6)

CASES["batch_single_and_two_values_shapes"] = ("""
result = []
for values in ([np.asarray([1, 2, 3])], [np.asarray([1, 2, 3]), np.asarray([4, 5, 6])],
               [np.asarray([1, 2, 3]), [4, 5, 6]]):
  for ds in (grain.MapDataset.source(values).batch(len(values)),
             grain.MapDataset.source(values).to_iter_dataset().batch(len(values))):
    b = list(ds)[0]
    result.append([type(b).__name__, getattr(b, "shape", None), np.asarray(b).tolist()])
""", None)

CASES["batch_and_pad"] = ("""
pad = grain.experimental.batch_and_pad
result = [
    pad([1, 2, 3], batch_size=3, pad_value=0),
    pad([1, 2, 3], batch_size=5, pad_value=1),
    pad([{"a": np.array([1, 2, 3]), "b": np.array([[1.2], [0.2]], dtype=np.float32)},
         {"a": np.array([4, 5, 6]), "b": np.array([[323.1], [2222.3]], dtype=np.float32)}], batch_size=4, pad_value=0),
    pad([{"aa": {"a": np.array([1, 2, 3])}, "b": np.array([[1.2], [0.2]], dtype=np.float32)},
         {"aa": {"a": np.array([4, 5, 6])}, "b": np.array([[323.1], [2222.3]], dtype=np.float32)}], batch_size=4),
    catch(lambda: pad([], batch_size=1)),
    catch(lambda: pad([1, 2, 3], batch_size=2)),
    catch(lambda: pad([{"a": np.asarray([1, 2, 3])}, {"a": np.asarray([4, 5])}], batch_size=3),
          "Expected all input elements to have the same structure but got:"),
    catch(lambda: pad([{"a": np.asarray([1, 2, 3])}, {"b": np.asarray(0.5)}], batch_size=3),
          "Expected all input elements to have the same structure but got:"),
]
""", None)

CASES["batch_size_2_map_and_iter"] = ("""
arrays = [np.asarray([1, 2, 3]), np.asarray([4, 5, 6]), np.asarray([7, 8, 9]), np.asarray([10, 11, 12])]
result = []
for initial in (grain.MapDataset.range(0, 10), grain.MapDataset.source(arrays)):
  ds = initial.batch(batch_size=2)
  result.append([len(ds), [ds[i] for i in range(len(ds))]])
  result.append(list(initial.to_iter_dataset().batch(batch_size=2)))
""", [[5, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]], [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]],
      [2, [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]], [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]])

CASES["batch_custom_batch_fn_tuples"] = ("""
def _batch_fn(xs):
  return {"a": tuple(x["a"] for x in xs)}

src = grain.MapDataset.source([{"a": f"element_{i}"} for i in range(10)])
ds = src.batch(batch_size=2, batch_fn=_batch_fn)
result = [len(ds), [ds[i] for i in range(5)], list(src.to_iter_dataset().batch(batch_size=2, batch_fn=_batch_fn))]
result.append([type(b["a"]).__name__ for b in result[1]])
""", [5] + [[{"a": [f"element_{2 * i}", f"element_{2 * i + 1}"]} for i in range(5)]] * 2 + [["tuple"] * 5])

CASES["batch_size_3_drop_remainder"] = ("""
arrays = [np.asarray([0, 1, 2]), np.asarray([3, 4, 5]), np.asarray([6, 7, 8]), np.asarray([9, 10, 11])]
result = []
for initial in (grain.MapDataset.range(0, 10), grain.MapDataset.source(arrays)):
  for drop in (True, False):
    ds = initial.batch(batch_size=3, drop_remainder=drop)
    result.append([len(ds), [ds[i] for i in range(len(ds))], list(initial.to_iter_dataset().batch(3, drop_remainder=drop))])
""", [[3, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]] + [[[0, 1, 2], [3, 4, 5], [6, 7, 8]]],
      [4, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]] + [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]],
      [1, [[[0, 1, 2], [3, 4, 5], [6, 7, 8]]], [[[0, 1, 2], [3, 4, 5], [6, 7, 8]]]],
      [2, [[[0, 1, 2], [3, 4, 5], [6, 7, 8]], [[9, 10, 11]]], [[[0, 1, 2], [3, 4, 5], [6, 7, 8]], [[9, 10, 11]]]]])

CASES["batch_epoch_boundaries"] = ("""
result = []
for drop in (True, False):
  ds = grain.MapDataset.range(0, 10).batch(batch_size=3, drop_remainder=drop)
  result.append([len(ds), [ds[i] for i in range(4 * len(ds))]])
""", [[3, [[0, 1, 2], [3, 4, 5], [6, 7, 8]] * 4], [4, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]] * 4]])

CASES["batch_repeat_after_and_before_batch"] = ("""
result = []
for drop in (True, False):
  after = grain.MapDataset.range(0, 10).batch(batch_size=3, drop_remainder=drop).repeat(2)
  before = grain.MapDataset.range(0, 10).repeat(2).batch(batch_size=3, drop_remainder=drop)
  result.append([len(after), list(after), len(before), list(before)])
""", [[6, [[0, 1, 2], [3, 4, 5], [6, 7, 8]] * 2, 6, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1], [2, 3, 4], [5, 6, 7]]],
      [8, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]] * 2, 7,
       [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]]])

CASES["batch_after_filter_or_flat_map_raises"] = ("""
@dataclasses.dataclass(frozen=True)
class TestFlatMap(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element):
    for i in range(self.max_fan_out):
      yield i

result = [
    catch(lambda: grain.MapDataset.range(0, 10).filter(lambda x: x % 2 == 0).batch(3, drop_remainder=True),
          "`MapDataset.batch` can not follow `MapDataset.filter`"),
    catch(lambda: grain.experimental.FlatMapMapDataset(grain.MapDataset.range(0, 10), TestFlatMap(max_fan_out=5))
          .batch(2), "`MapDataset.batch` can not follow `FlatMapMapDataset`"),
    # A filter further up the chain is found too.
    catch(lambda: grain.MapDataset.range(0, 10).filter(lambda x: x % 2 == 0).map(lambda x: x).shuffle(1).batch(3),
          "`MapDataset.batch` can not follow `MapDataset.filter`"),
    catch(lambda: grain.MapDataset.range(10).batch(0), "batch_size must be positive"),
    catch(lambda: grain.MapDataset.range(10).to_iter_dataset().batch(0), "batch_size must be positive"),
    catch(lambda: grain.MapDataset.range(10).batch(-2), "batch_size must be positive"),
]
""", [["ValueError", True]] * 6)

CASES["batch_with_padding_batch_fn"] = ("""
batch_fn = functools.partial(grain.experimental.batch_and_pad, batch_size=4)
ds = grain.MapDataset.range(1, 10).map(lambda x: {"x": x})
result = [len(ds.batch(batch_size=4, batch_fn=batch_fn)), list(ds.batch(batch_size=4, batch_fn=batch_fn)),
          list(ds.to_iter_dataset().batch(batch_size=4, batch_fn=batch_fn))]
""", [3] + [[{"x": [1, 2, 3, 4]}, {"x": [5, 6, 7, 8]}, {"x": [9, 0, 0, 0]}]] * 2)

CASES["batch_iter_size_4_and_3"] = ("""
arrays = [np.asarray([1, 2, 3]), np.asarray([4, 5, 6]), np.asarray([7, 8, 9]), np.asarray([10, 11, 12])]
result = [list(grain.MapDataset.range(0, 12).to_iter_dataset().batch(batch_size=4)),
          list(grain.MapDataset.source(arrays).to_iter_dataset().batch(batch_size=4)),
          list(grain.MapDataset.range(0, 10).to_iter_dataset().batch(batch_size=3)),
          list(grain.MapDataset.range(0, 10).to_iter_dataset().batch(batch_size=3, drop_remainder=True))]
""", [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], [[[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]],
      [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]], [[0, 1, 2], [3, 4, 5], [6, 7, 8]]])

CASES["batch_iter_get_and_set_next_index"] = ("""
result = []
for batch_size, drop in ((2, False), (3, False), (3, True)):
  ds = grain.MapDataset.range(0, 10).to_iter_dataset().batch(batch_size=batch_size, drop_remainder=drop)
  n = len(list(ds))
  result.append([next_indices(ds, n + 1), set_next_indices(ds, list(reversed(range(n))))])
""", None)

CASES["batch_element_types"] = ("""
# What ds.batch makes of the element types users batch: scalars, strings, dicts, tuples, nested.
elements = {
    "ints": [1, 2, 3],
    "floats": [1.5, 2.5, 3.5],
    "bools": [True, False, True],
    "mixed_int_float": [1, 2.5, 3],
    "np_scalars": [np.int32(1), np.int32(2), np.int32(3)],
    "float32_arrays": [np.ones((2,), np.float32) * i for i in range(3)],
    "strings": ["a", "bb", "ccc"],
    "str_arrays": [np.asarray("a"), np.asarray("bbbbb"), np.asarray("cc")],
    "dicts": [{"x": i, "y": np.full((2, 2), i, np.int16)} for i in range(3)],
    "tuples": [(i, np.asarray([i, i])) for i in range(3)],
    "lists": [[i, i + 1] for i in range(3)],
    "nested": [{"a": {"b": (i, [i * 2, np.float64(i)])}, "c": "s"} for i in range(3)],
    "none_leaves": [{"a": i, "b": None} for i in range(3)],
    "2d_arrays": [np.arange(6).reshape(2, 3) + i for i in range(3)],
}
result = {}
for name, values in elements.items():
  for kind, ds in (("map", grain.MapDataset.source(values).batch(3)),
                   ("map_single", grain.MapDataset.source(values[:1]).batch(3)),
                   ("iter", grain.MapDataset.source(values).to_iter_dataset().batch(2))):
    out = catch(lambda: list(ds))
    result[f"{name}/{kind}"] = [out[0], out[1], porting_structure(out[1]) if out[0] == "ok" else None]
""", None)

CASES["batch_ragged_elements_raise"] = ("""
pattern = "Expected all input elements to have the same structure but got:"
cases = {
    "ragged_arrays": [np.zeros((2,)), np.zeros((3,))],
    "ragged_lists": [[1, 2], [3]],
    "dict_key_sets": [{"a": 1}, {"a": 1, "b": 2}],
    "tuple_vs_list": [(1, 2), [1, 2]],
    "ragged_2d": [np.zeros((2, 3)), np.zeros((3, 2))],
    "scalar_vs_array": [np.int64(1), np.zeros((2,))],
    "ragged_strings_in_dict": [{"t": np.zeros((2,)), "s": "x"}, {"t": np.zeros((4,)), "s": "y"}],
}
result = {}
for name, values in cases.items():
  result[name + "/map"] = catch(lambda: grain.MapDataset.source(values).batch(2)[0], pattern)
  result[name + "/iter"] = catch(lambda: list(grain.MapDataset.source(values).to_iter_dataset().batch(2)), pattern)
""", None)

CASES["batch_variable_length_strings"] = ("""
SHORT_STR = "short"
MEDIUM_STR = "this_is_a_medium_length_string"
LONG_STR = "<start_of_turn>user\\n311 : A28 B33 C102 D0<end_of_turn>\\n<start_of_turn>model\\n"
result = []
for values in ([SHORT_STR, MEDIUM_STR, LONG_STR], [LONG_STR, SHORT_STR], [SHORT_STR, LONG_STR]):
  for ds in (grain.MapDataset.source(values).to_iter_dataset().batch(3), grain.MapDataset.source(values).batch(3)):
    b = next(iter(ds))
    result.append([str(x) for x in b])
big = [np.full((6000,), SHORT_STR), np.full((6000,), LONG_STR)]
b = next(iter(grain.MapDataset.source(big).to_iter_dataset().batch(2)))
result.append([b.shape, str(b[1, 0]), str(b[0, 5999])])
""", None)

CASES["batch_shared_memory_output_method"] = ("""
# BatchIterDataset.enable_shared_memory_output is called on the object ds.batch returns.
values = ["short", "this_is_a_medium_length_string", "long" * 30]
ds = grain.MapDataset.source(values).to_iter_dataset().batch(3)
ds.enable_shared_memory_output()
b = next(iter(ds))
result = [[str(x) for x in b], isinstance(b, np.ndarray)]
arrays = [np.asarray([1, 2, 3]), np.asarray([4, 5, 6]), np.asarray([7, 8, 9]), np.asarray([10, 11, 12])]
ds = grain.MapDataset.source(arrays).to_iter_dataset().batch(2)
ds.enable_shared_memory_output()
out = list(ds)
result.append([np.asarray(x).tolist() for x in out])
mds = grain.MapDataset.source(arrays).batch(2)
mds.enable_shared_memory_output()
result.append([np.asarray(x).tolist() for x in mds])
""", None)

CASES["batch_element_spec"] = ("""
result = []
for batch_size, drop in ((3, True), (5, False)):
  for ds in (grain.MapDataset.range(0, 10).batch(batch_size, drop_remainder=drop),
             grain.MapDataset.range(0, 10).to_iter_dataset().batch(batch_size, drop_remainder=drop)):
    s = grain.experimental.get_element_spec(ds)
    result.append([s.shape, np.dtype(s.dtype).name])
ds = grain.MapDataset.range(0, 10).to_iter_dataset().map(MapWithElementSpecInference()).batch(3, drop_remainder=True)
result.append(spec(ds))
""", [[[3], "int64"]] * 2 + [[[None], "int64"]] * 2 + [
    "{'nested': {'record': ShapeDtypeStruct(shape=(3,), dtype=<class 'str'>)}, "
    "'parsed': ShapeDtypeStruct(shape=(3, 10, 10), dtype=<class 'numpy.int64'>)}"])

CASES["batch_checkpointing"] = ("""
result = [
    restore_at_every_step(lambda: grain.MapDataset.range(10).batch(3).to_iter_dataset()),
    restore_at_every_step(lambda: grain.MapDataset.range(10).to_iter_dataset().batch(3)),
    restore_at_every_step(lambda: grain.MapDataset.range(10).map(lambda x: {"a": x, "b": (x, str(x))})
                          .to_iter_dataset().batch(4, drop_remainder=True)),
    after_checkpoint(grain.MapDataset.range(10).to_iter_dataset().batch(3)),
]
""", None)


# ---- map_test.py ------------------------------------------------------------------------------

CASES["map_size_data_and_pickle"] = ("""
import cloudpickle
range_ds = grain.MapDataset.range(0, 10)
result = []
for cls in (MapWithNoTransform, MapWithTransform):
  ds = range_ds.map(cls())
  restored = cloudpickle.loads(cloudpickle.dumps(ds))
  result.append([len(ds), [ds[i] for i in range(len(ds))], len(restored), list(restored), [ds[i] for i in (0, 4, 8)]])
""", [[10, list(range(10)), 10, list(range(10)), [0, 4, 8]], [10, list(range(1, 11)), 10, list(range(1, 11)), [1, 5, 9]]])

CASES["map_checkpointing"] = ("""
result = [
    restore_at_every_step(lambda: grain.MapDataset.range(0, 10).map(MapWithTransform())),
    restore_at_every_step(lambda: grain.MapDataset.range(10).to_iter_dataset().map(MapWithTransform())),
    after_checkpoint(grain.MapDataset.range(0, 10).map(MapWithTransform())),
    after_checkpoint(grain.MapDataset.range(10).to_iter_dataset().map(MapWithTransform())),
]
""", [list(range(1, 11))] * 2 + [True, True])

CASES["map_element_spec_inference"] = ("""
ds = grain.MapDataset.range(0, 10)
result = [
    spec(ds.map(MapWithElementSpecInference())),
    spec(ds.to_iter_dataset().map(MapWithElementSpecInference())),
    catch(lambda: spec(ds.map(MapWithNoTransform())), "does not implement `output_spec`"),
    catch(lambda: spec(ds.to_iter_dataset().map(MapWithNoTransform())), "does not implement `output_spec`"),
    catch(lambda: spec(ds.batch(2).map(MapWithElementSpecInference()))),
]
""", None)

CASES["random_map_values_and_seeds"] = ("""
range_ds = grain.MapDataset.range(0, 10)
result = {}
ds = range_ds.random_map(RandomMapWithTransform(), seed=0)
result["len"] = len(ds)
result["values"] = [ds[i] for i in range(len(ds))]
result["close"] = bool(np.allclose(result["values"], list(range(10)), atol=0.1))
seeded1 = range_ds.seed(42).random_map(RandomMapWithTransform())
seeded2 = range_ds.seed(42).random_map(RandomMapWithTransform())
overridden = range_ds.seed(42).random_map(RandomMapWithTransform(), seed=43)
result["default_seed"] = [list(seeded1), list(seeded2)]
result["override_differs"] = bool(np.all(np.asarray(list(seeded1)) != np.asarray(list(overridden))))
result["overridden"] = list(overridden)
result["no_seed"] = [catch(lambda: range_ds.random_map(RandomMapWithTransform())),
                     catch(lambda: range_ds.random_map(lambda x, rng: x)),
                     catch(lambda: range_ds.to_iter_dataset().random_map(RandomMapWithTransform())),
                     catch(lambda: range_ds.to_iter_dataset().random_map(lambda x, rng: x))]
det = range_ds.random_map(RandomMapWithDeterminismTransform(), seed=42)
result["by_index"] = [[det[i] for i in idx] for idx in (list(range(10)), [0, 4, 8], [3, 1, 7, 2])]
result["cross_version"] = list(grain.MapDataset.range(10).seed(41).random_map(RandomMapWithDeterminismTransform())
                               .map(lambda x: x.item()))
result["iter_deterministic"] = [list(range_ds.to_iter_dataset().random_map(RandomMapWithDeterminismTransform(), seed=42))
                                for _ in range(3)]
it_ds = range_ds.to_iter_dataset()
result["iter_default_seed"] = [list(it_ds.seed(42).random_map(RandomMapWithTransform())),
                               list(it_ds.seed(42).random_map(RandomMapWithTransform())),
                               list(it_ds.seed(42).random_map(RandomMapWithTransform(), seed=43))]
result["iter_values"] = list(it_ds.random_map(RandomMapWithTransform(), seed=0))
result["types"] = [type(result["cross_version"][0]).__name__, type(det[0]).__name__, type(ds[0]).__name__]
""", None)

CASES["random_map_checkpointing"] = ("""
result = []
for seed in (0, 1, 42):
  result.append(restore_at_every_step(
      lambda: grain.MapDataset.range(0, 10).random_map(RandomMapWithTransform(), seed=seed)))
  result.append(restore_at_every_step(
      lambda: grain.MapDataset.range(0, 10).to_iter_dataset().random_map(RandomMapWithTransform(), seed=seed)))
  result.append(after_checkpoint(grain.MapDataset.range(0, 10).random_map(RandomMapWithTransform(), seed=seed)))
  result.append(after_checkpoint(
      grain.MapDataset.range(0, 10).to_iter_dataset().random_map(RandomMapWithTransform(), seed=seed)))
""", None)

CASES["map_iter_past_one_epoch_and_next_index"] = ("""
result = {}
it = iter(grain.MapDataset.range(10).to_iter_dataset().map(MapWithNoTransform()))
result["first_10"] = [next(it) for _ in range(10)]
result["past_end"] = catch(lambda: next(it))
base = grain.MapDataset.range(0, 20).to_iter_dataset()
for name, ds in (("map", base.map(MapWithNoTransform())),
                 ("random_map", base.random_map(RandomMapWithTransform(), seed=0)),
                 ("map_with_index", base.map_with_index(AddIndexTransform()))):
  result[name] = [next_indices(ds, 20), set_next_indices(ds, list(reversed(range(20)))) == list(ds)[::-1]]
""", None)

CASES["map_with_index"] = ("""
ds = grain.MapDataset.range(3, 6).map_with_index(AddIndexTransform())
result = [len(ds), [ds[i] for i in range(6)], [ds[i] for i in (4, 3, 5)],
          list(grain.MapDataset.range(10).to_iter_dataset().map_with_index(AddIndexTransform())),
          restore_at_every_step(lambda: grain.MapDataset.range(10).to_iter_dataset().map_with_index(AddIndexTransform())),
          after_checkpoint(grain.MapDataset.range(10).to_iter_dataset().map_with_index(AddIndexTransform()))]
it = iter(grain.MapDataset.range(10).to_iter_dataset().map_with_index(AddIndexTransform()))
for _ in range(10):
  next(it)
result.append(catch(lambda: next(it)))
""", [3, [[0, 3], [1, 4], [2, 5], [3, 3], [4, 4], [5, 5]], [[4, 4], [3, 3], [5, 5]], [[i, i] for i in range(10)],
      [[i, i] for i in range(10)], True, ["StopIteration", None]])


# ---- filter_test.py ---------------------------------------------------------------------------

CASES["filter_map_dataset"] = ("""
range_ds = grain.MapDataset.range(0, 10)
result = []
for f in (FilterNoElements(), FilterAllElements(), FilterEvenElementsOnly()):
  ds = range_ds.filter(f)
  result.append([len(ds), [ds[i] for i in range(len(ds))]])
ds = range_ds.filter(FilterEvenElementsOnly())
result.append([ds[i] for i in (0, 1, 4, 5, 8, 9)])
""", [[10, list(range(10))], [10, [None] * 10], [10, [None, 1, None, 3, None, 5, None, 7, None, 9]],
      [None, 1, None, 5, None, 9]])

CASES["filter_iter_dataset"] = ("""
range_iter = grain.MapDataset.range(0, 10).to_iter_dataset()
it = iter(range_iter.filter(FilterNoElements()))
result = [[next(it) for _ in range(10)]]
result.append(catch(lambda: next(iter(range_iter.filter(FilterAllElements())))))
it = iter(range_iter.filter(FilterEvenElementsOnly()))
result.append([next(it) for _ in range(5)])
result.append(restore_at_every_step(lambda: range_iter.filter(FilterEvenElementsOnly())))
""", [list(range(10)), ["StopIteration", None], [1, 3, 5, 7, 9], [1, 3, 5, 7, 9]])

CASES["filter_all_elements_raises_with_threshold_option"] = ("""
ds = grain.MapDataset.range(0, 1000).to_iter_dataset().filter(FilterAllElements())
ds = grain.experimental.WithOptionsIterDataset(ds, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.999))
# (Grain's test also matches the name of its internal iterator class, FilterDatasetIterator.)
result = [catch(lambda: list(ds), r"^Transformation .* skipped 100.00 % of the last seen 1000 elements."),
          catch(lambda: list(ds), r"skipped 100.00 % of the last seen 1000 elements")]
# Below the threshold: nothing raised.
ok = grain.MapDataset.range(0, 1000).to_iter_dataset().filter(lambda x: x % 2 == 0)
ok = grain.experimental.WithOptionsIterDataset(ok, grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.999))
result.append(len(list(ok)))
""", [["ValueError", True], ["ValueError", True], 500])

CASES["filter_element_spec"] = ("""
result = [spec(grain.MapDataset.range(0, 10).filter(FilterEvenElementsOnly())),
          spec(grain.MapDataset.range(0, 10).to_iter_dataset().filter(FilterEvenElementsOnly()))]
""", None)


# ---- slice_test.py ----------------------------------------------------------------------------

CASES["slice_len"] = ("""
result = [len(grain.MapDataset.range(20).slice(slice(start, 20, step)))
          for start, step in ((0, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 3), (30, 100))]
""", [20, 10, 10, 7, 7, 6, 0])

CASES["slice_getitem_iter_all_combinations"] = ("""
mismatches = []
for start, stop, step in itertools.product(range(-8, 8), range(-9, 8), [-2, -1, 1, 2]):
  expected = list(range(20))[start:stop:step]
  a = grain.MapDataset.range(20).slice(slice(start, stop, step))
  b = grain.MapDataset.range(20)[start:stop:step]
  got = [[a[i] for i in range(len(a))], [b[i] for i in range(len(b))], list(iter(a))]
  if any(g != expected for g in got):
    mismatches.append([start, stop, step, got])
result = mismatches
""", [])

CASES["slice_of_slice_and_next_epoch"] = ("""
ds = grain.MapDataset.range(20)
sliced = ds[2:18:2]
resliced = sliced[1:6:2]
result = [list(sliced), list(resliced), type(sliced).__name__ == type(resliced).__name__]
for args, indices in (((1, 8, 2), [0, 1, 3]), ((None, 5, None), [0, 1, 2, 3, 4]), ((8, 2, -2), [0, 2]),
                      ((5, None, None), [15, 16])):
  s = ds.slice(slice(*args))
  result.append([s[i] for i in indices])
s = ds.slice(slice(5))
result.append([len(s), s[5], s[13], s[42]])
result.append(list(ds.slice(slice(0, 15, 3)).slice(slice(0, 20, 2))))
result.append(len(EmptyMapDataset().slice(slice(0, 10))))
result.append(catch(lambda: ds.slice(5), "sl is not a slice: <class 'int'>"))
m = grain.MapDataset.range(10).map_with_index(lambda i, x: {"index": i, "value": x})
result.append(list(itertools.islice(m[: len(m)].repeat(), 20)) == list(itertools.islice(m.repeat(), 20)))
result.append(list(itertools.islice(m[: len(m)].repeat(), 20)))
""", [[2, 4, 6, 8, 10, 12, 14, 16], [4, 8, 12], True, [1, 3, 7], [0, 1, 2, 3, 4], [8, 4], [5, 6], [5, 0, 3, 2],
      [0, 6, 12], 0, ["ValueError", True], True, [{"index": i, "value": i % 10} for i in range(20)]])

CASES["slice_element_spec"] = ("""
s = grain.experimental.get_element_spec(grain.MapDataset.range(2).slice(slice(0, 1)))
result = [np.dtype(s.dtype).name, s.shape]
""", ["int64", []])


# ---- repeat_test.py ---------------------------------------------------------------------------

CASES["repeat_map_dataset"] = ("""
result = [len(grain.MapDataset.range(6)), len(grain.MapDataset.range(6).repeat(3)),
          list(grain.MapDataset.range(4).repeat(3)),
          list(grain.MapDataset.range(4).repeat(None)[0:12]),
          len(grain.MapDataset.range(6).repeat(num_epochs=None)) == sys.maxsize,
          catch(lambda: grain.MapDataset.range(6).repeat(None).repeat(2)),
          catch(lambda: grain.MapDataset.range(6).repeat(0)),
          catch(lambda: grain.MapDataset.range(6).repeat(-1)),
          len(EmptyMapDataset().repeat(None)),
          [grain.MapDataset.range(4).repeat(3)[i] for i in [0, 1, 4, 5, 8, 9]],
          [grain.MapDataset.range(4).repeat(None)[i] for i in range(12)]]
""", [6, 18, [0, 1, 2, 3] * 3, [0, 1, 2, 3] * 3, True, ["ValueError", None], ["ValueError", None],
      ["ValueError", None], 0, [0, 1, 0, 1, 0, 1], [0, 1, 2, 3] * 3])

CASES["repeat_random_transforms_across_epochs"] = ("""
num_examples = 1000
result = {}
for num_epochs, reseed, explicit in itertools.product([2, None], [True, False], [True, False]):
  ds = grain.MapDataset.range(num_examples)
  if explicit:
    ds = ds.shuffle(seed=42).random_map(lambda x, rng: x + rng.integers(10), seed=43)
  else:
    ds = ds.seed(42).shuffle().random_map(lambda x, rng: x + rng.integers(10))
  ds = ds.repeat(num_epochs=num_epochs, reseed_each_epoch=reseed)
  first = [int(x) for x in ds[:num_examples]]
  second = [int(x) for x in ds[num_examples: 2 * num_examples]]
  by_index = [int(ds[i]) for i in range(num_examples, num_examples + 20)]
  result[f"{num_epochs}/{reseed}/{explicit}"] = [first != second, set(first) != set(second),
                                                 first[:20], second[:20], by_index]
""", None)

CASES["repeat_iter_dataset"] = ("""
R = grain.experimental.RepeatIterDataset
result = [list(R(grain.MapDataset.range(4).to_iter_dataset(), num_epochs=3))]
out = []
for i, v in enumerate(R(grain.MapDataset.range(4).to_iter_dataset(), num_epochs=None)):
  if i == 12:
    break
  out.append(v)
result.append(out)
result.append(catch(lambda: R(grain.MapDataset.range(6).to_iter_dataset(), num_epochs=0)))
result.append(catch(lambda: R(grain.MapDataset.range(6).to_iter_dataset(), num_epochs=-1)))
result.append(list(R(EmptyMapDataset().to_iter_dataset(), num_epochs=2)))
for n in (1, 2, 5):
  result.append(restore_at_every_step(lambda: R(grain.MapDataset.range(3).to_iter_dataset(), num_epochs=n)))
  result.append(after_checkpoint(R(grain.MapDataset.range(3).to_iter_dataset(), num_epochs=n)))
""", [[0, 1, 2, 3] * 3, [0, 1, 2, 3] * 3, ["ValueError", None], ["ValueError", None], [],
      [0, 1, 2], True, [0, 1, 2] * 2, True, [0, 1, 2] * 5, True])

CASES["repeat_element_spec"] = ("""
result = []
for ds in (grain.MapDataset.range(2).repeat(2),
           grain.experimental.RepeatIterDataset(grain.MapDataset.range(2).to_iter_dataset(), num_epochs=2)):
  s = grain.experimental.get_element_spec(ds)
  result.append([np.dtype(s.dtype).name, s.shape])
""", [["int64", []]] * 2)


# ---- limit_test.py ----------------------------------------------------------------------------

CASES["limit"] = ("""
L = grain.experimental.LimitIterDataset
base = grain.MapDataset.range(0, 10).to_iter_dataset()
result = {}
result["non_positive"] = [catch(lambda: L(base, count=c)) for c in (0, -1, -5)]
it = iter(L(base, count=1))
result["stop"] = [next(it), catch(lambda: next(it))]
result["counts"] = [list(L(base, count=c)) for c in (1, 3, 5, 7, 10, 12)]
result["over_epochs"] = list(L(grain.MapDataset.range(0, 10).repeat(2).to_iter_dataset(), count=15))
batched = grain.MapDataset.range(0, 10).batch(3).to_iter_dataset()
result["after_batch"] = [list(L(batched, count=2)), list(L(batched, count=5))]
result["checkpoint"] = [restore_at_every_step(lambda: L(batched, count=2)), after_checkpoint(L(batched, count=2))]
""", {"non_positive": [["ValueError", None]] * 3, "stop": [0, ["StopIteration", None]],
      "counts": [list(range(c)) for c in (1, 3, 5, 7, 10)] + [list(range(10))],
      "over_epochs": list(range(10)) + list(range(5)),
      "after_batch": [[[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]],
      "checkpoint": [[[0, 1, 2], [3, 4, 5]], True]})

CASES["limit_next_index"] = ("""
L = grain.experimental.LimitIterDataset
limited = L(grain.MapDataset.range(0, 20).batch(3).to_iter_dataset(), count=2)
result = [next_indices(limited, 3)]
it = limited.__iter__()
grain.experimental.set_next_index(it, 1)
result.append(grain.experimental.get_next_index(it))
result.append(next(it))
result.append(grain.experimental.get_next_index(it))
result.append(catch(lambda: next(it)))
""", [[0, 1, 2, "stop", 2], 1, [3, 4, 5], 2, ["StopIteration", None]])

CASES["limit_element_spec"] = ("""
s = grain.experimental.get_element_spec(
    grain.experimental.LimitIterDataset(grain.MapDataset.range(0, 10).to_iter_dataset(), count=2))
result = [np.dtype(s.dtype).name, s.shape]
""", ["int64", []])


# ---- flatmap_test.py --------------------------------------------------------------------------

CASES["flat_map_map_dataset"] = ("""
F = grain.experimental.FlatMapMapDataset
range_ds = grain.MapDataset.range(0, 10)
result = {}
ds = F(range_ds, FixedSizeSplitWithNoTransform(max_fan_out=10))
result["fixed"] = [len(ds), [ds[i] for i in range(len(ds))]]
result["after_repeat"] = len(F(range_ds.repeat(), FixedSizeSplitWithNoTransform(max_fan_out=10))) == sys.maxsize
ds = F(range_ds, FixedSizeSplitWithTransform(max_fan_out=10))
result["fixed_transform"] = [ds[i] for i in range(len(ds))]
ds = F(range_ds, VariableSizeCappedSplitWithNoTransform(max_fan_out=10))
result["variable"] = [len(ds), [ds[i] for i in range(len(ds))]]
result["empty"] = len(F(grain.MapDataset.range(0, 0), VariableSizeCappedSplitWithNoTransform(max_fan_out=10)))
def too_many():
  ds = F(grain.MapDataset.range(0, 20), VariableSizeUncappedSplitWithNoTransform(max_fan_out=10))
  return [ds[i] for i in range(len(ds))]
result["fan_out_exceeds"] = catch(too_many)
result["with_filter"] = list(F(range_ds.filter(lambda x: x % 2 == 0), FixedSizeSplitWithTransform(max_fan_out=2)))
result["iterate"] = list(F(range_ds, VariableSizeCappedSplitWithNoTransform(max_fan_out=3)))
result["to_iter"] = list(F(range_ds, VariableSizeCappedSplitWithNoTransform(max_fan_out=3)).to_iter_dataset())
""", None)

CASES["flat_map_iter_dataset"] = ("""
data = [[0, 1, 2, 3], [], [4, 5], [6, 7, 8, 9], [], [], [10, 11, 12]]
make = lambda: grain.experimental.FlatMapIterDataset(grain.MapDataset.source(data).to_iter_dataset(), Unbatch())
result = [list(make())]
it = make().__iter__()
checkpoints, values = [], []
for _ in range(13):
  checkpoints.append(it.get_state())
  values.append(next(it))
for start in [0, 1, 5, 8, 9, 11, 12]:
  it.set_state(checkpoints[start])
  result.append([next(it) for _ in range(start, 13)] == values[start:])
result.append(restore_at_every_step(make))
""", [list(range(13))] + [True] * 7 + [list(range(13))])


# ---- rebatch_test.py --------------------------------------------------------------------------

REBATCH = [(2, 4, False), (4, 2, False), (3, 3, False), (3, 4, False), (2, 4, True), (4, 3, True)]

CASES["rebatch_tree_elements"] = ("""
result = []
for batch_size, rebatch_size, drop in %r:
  ds = grain.MapDataset.range(0, 10).map(GetTestTreeElement()).to_iter_dataset().batch(batch_size=batch_size)
  ds = grain.experimental.RebatchIterDataset(ds, batch_size=rebatch_size, drop_remainder=drop)
  result.append([[b["key_0"].tolist() for b in ds], [b["key_2"][:, 0].tolist() for b in ds]])
""" % (REBATCH,), [[[[[i, i] for i in range(k, min(k + r, 10 if not d else (10 // r) * r))]
                     for k in range(0, (10 if not d else (10 // r) * r), r)],
                    [[i for i in range(k, min(k + r, 10 if not d else (10 // r) * r))]
                     for k in range(0, (10 if not d else (10 // r) * r), r)]] for b, r, d in REBATCH])

CASES["rebatch_scalar_elements"] = ("""
result = []
for batch_size, rebatch_size, drop in [(3, 4, False), (4, 3, False), (4, 4, False), (3, 4, True), (4, 3, True)]:
  ds = grain.MapDataset.range(0, 10).to_iter_dataset().batch(batch_size=batch_size)
  result.append(list(grain.experimental.RebatchIterDataset(ds, batch_size=rebatch_size, drop_remainder=drop)))
""", [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]],
      [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 1, 2], [3, 4, 5], [6, 7, 8]]])

CASES["rebatch_checkpointing_and_errors"] = ("""
def make(batch_size, rebatch_size):
  ds = grain.MapDataset.range(0, 10).map(GetTestTreeElement()).to_iter_dataset().batch(batch_size=batch_size)
  return grain.experimental.RebatchIterDataset(ds, batch_size=rebatch_size)

result = []
for b, r in ((3, 4), (4, 3), (4, 4)):
  result.append(restore_at_every_step(lambda: make(b, r)))
  result.append(after_checkpoint(make(b, r)))
it = iter(make(3, 4))
result.append([len([next(it) for _ in range(3)]), catch(lambda: next(it))])
it = iter(make(4, 2))
result.append([len([next(it) for _ in range(5)]), catch(lambda: next(it))])
result.append(catch(lambda: make(2, -1)))
empty = grain.MapDataset.source([np.full((0, 3), 10), np.full((0, 3), 10), np.full((4, 3), 10)]).to_iter_dataset()
result.append(catch(lambda: next(iter(grain.experimental.RebatchIterDataset(empty, batch_size=2)))))
""", None)

CASES["rebatch_element_spec"] = ("""
result = []
for batch_size, rebatch_size, drop in %r:
  ds = grain.MapDataset.range(0, 10).map(GetTestTreeElement()).to_iter_dataset().batch(batch_size=batch_size)
  ds = grain.experimental.RebatchIterDataset(ds, batch_size=rebatch_size, drop_remainder=drop)
  result.append(spec(ds))
""" % (REBATCH,), None)


# ---- Beyond the test files: what users hit around batch / map / random_map / map_with_index ----

CASES["filter_warns_when_most_elements_are_dropped"] = (porting.CAPTURE_LOGS + """
handler = Capture()
logging.getLogger().addHandler(handler)
try:
  out = list(grain.MapDataset.range(0, 1000).to_iter_dataset().filter(FilterAllElements()))
finally:
  logging.getLogger().removeHandler(handler)
result = [out, len(handler.messages) > 0,
          any(re.search(r"skipped 100.00 % of the last seen 1000 elements", m) for m in handler.messages)]
""", None)

CASES["batch_fn_receives_list_and_partial_batches"] = ("""
seen = []

def batch_fn(values):
  seen.append([type(values).__name__, len(values)])
  return np.asarray(values).sum()

# The calls' order is not compared: loader computes batches ahead, on threads (README, "Computing ahead").
result = [list(grain.MapDataset.range(10).batch(4, batch_fn=batch_fn)), sorted(seen)]
seen.clear()
result += [list(grain.MapDataset.range(10).to_iter_dataset().batch(4, batch_fn=batch_fn)), sorted(seen)]
seen.clear()
result += [list(grain.MapDataset.range(10).batch(4, drop_remainder=True, batch_fn=batch_fn)), sorted(seen)]
seen.clear()
result += [list(grain.MapDataset.range(10).apply(grain.transforms.Batch(4, batch_fn=batch_fn))), sorted(seen)]
""", None)

CASES["batch_map_dataset_indexing"] = ("""
ds = grain.MapDataset.range(10).batch(3)
result = [ds[-1], ds[-4], list(ds[1:3]), list(ds[::2]), len(ds[1:]), ds[4], ds[7],
          list(grain.MapDataset.range(2).to_iter_dataset().batch(3, drop_remainder=True)),
          list(grain.MapDataset.range(2).batch(3, drop_remainder=True)), len(grain.MapDataset.range(2).batch(3, drop_remainder=True)),
          list(grain.MapDataset.range(0).batch(3)), list(grain.MapDataset.range(0).to_iter_dataset().batch(3))]
""", None)

CASES["batch_dtypes_and_structures_map_vs_iter"] = ("""
def element(i):
  return {"int": i, "float": float(i), "f32": np.float32(i), "bool": i % 2 == 0, "str": "s" * (i + 1),
          "bytes": b"b" * (i + 1), "arr": np.arange(3, dtype=np.uint8) + i, "tuple": (i, -i), "list": [i, [i, i]],
          "nested": {"x": np.zeros((2, 1), np.float16) + i}}
ds = grain.MapDataset.range(5).map(element)
batches = [list(ds.batch(2)), list(ds.to_iter_dataset().batch(2)), list(ds.batch(2, drop_remainder=True))]
result = [[{k: (v.tolist() if k != "bytes" else [bytes(x) for x in v]) if isinstance(v, np.ndarray) else porting_structure(v)
            for k, v in b.items()} for b in bs] for bs in batches]
result.append([porting_structure({k: v for k, v in b.items() if k != "bytes"}) for bs in batches for b in bs])
result.append([type(b["tuple"]).__name__ for bs in batches for b in bs] + [type(b["list"]).__name__ for bs in batches for b in bs])
""", None)

CASES["batch_then_map_and_unbatch"] = ("""
ds = grain.MapDataset.range(12).map(lambda x: {"x": x, "y": np.full((2,), x)}).batch(4)
ds = ds.map(lambda b: {"sum": b["x"].sum(), "y": b["y"] * 2}).repeat(2)
result = [len(ds), list(ds)]
it = grain.MapDataset.range(7).to_iter_dataset().batch(2).map(lambda b: b.tolist())
result.append(list(it))
""", None)

CASES["random_map_rng_and_draw_methods"] = ("""
def draws(x, rng):
  return {"bitgen": type(rng.bit_generator).__name__, "x": x, "int": rng.integers(0, 1000), "uniform": rng.random(),
          "normal": rng.normal(), "perm": rng.permutation(5), "choice": rng.choice(10, 3, replace=False),
          "int_arr": rng.integers(0, 10, size=4)}
result = {}
for kind, ds in (("map", grain.MapDataset.range(6).random_map(draws, seed=7)),
                 ("iter", grain.MapDataset.range(6).to_iter_dataset().random_map(draws, seed=7)),
                 ("map_seeded", grain.MapDataset.range(6).seed(7).random_map(draws)),
                 ("iter_seeded", grain.MapDataset.range(6).to_iter_dataset().seed(7).random_map(draws)),
                 ("big_seed", grain.MapDataset.range(6).random_map(draws, seed=2**40 + 3)),
                 ("np_seed", grain.MapDataset.range(6).random_map(draws, seed=np.int64(7)))):
  result[kind] = list(ds)
ds = grain.MapDataset.range(6).random_map(draws, seed=7)
result["by_index_again"] = [ds[5], ds[0], ds[5], ds[11]]
""", None)

CASES["random_map_after_filter_shuffle_slice_and_chained"] = ("""
def add(x, rng):
  return x * 1000 + int(rng.integers(0, 1000))
base = grain.MapDataset.range(20)
result = {
    "map_after_filter": [base.filter(lambda x: x % 3 != 0).random_map(add, seed=1)[i] for i in range(20)],
    "iter_after_filter": list(base.to_iter_dataset().filter(lambda x: x % 3 != 0).random_map(add, seed=1)),
    "map_filter_then_iter": list(base.filter(lambda x: x % 3 != 0).random_map(add, seed=1).to_iter_dataset()),
    "after_shuffle": list(base.shuffle(seed=3).random_map(add, seed=1)),
    "after_slice": list(base[5:15:2].random_map(add, seed=1)),
    "chained_seeded": list(base.seed(11).random_map(add).random_map(add).shuffle().random_map(add)),
    "chained_iter_seeded": list(base.seed(11).to_iter_dataset().random_map(add).random_map(add)),
    "after_batch_iter": [b.tolist() for b in base.to_iter_dataset().batch(3).random_map(lambda b, rng: b + rng.integers(0, 100), seed=2)],
    "after_repeat": list(base.repeat(2).random_map(add, seed=1)),
    "repeat_after": list(base.random_map(add, seed=1).repeat(2)),
    "repeat_after_no_reseed": list(base.random_map(add, seed=1).repeat(2, reseed_each_epoch=False)),
    "by_index_past_len": [base.random_map(add, seed=1)[i] for i in (0, 19, 20, 39, 40)],
    "mix": list(grain.MapDataset.mix([base.seed(5).random_map(add), base.seed(6).random_map(add)], [0.5, 0.5])),
    "concat": list(grain.MapDataset.concatenate([base[:5].random_map(add, seed=1), base[5:10].random_map(add, seed=1)])),
}
""", None)

CASES["random_map_restore_at_every_step"] = ("""
def add(x, rng):
  return x * 1000 + int(rng.integers(0, 1000))
result = [
    restore_at_every_step(lambda: grain.MapDataset.range(12).to_iter_dataset().filter(lambda x: x % 3 != 0)
                          .random_map(add, seed=1)),
    restore_at_every_step(lambda: grain.MapDataset.range(12).seed(3).shuffle().random_map(add).to_iter_dataset()
                          .random_map(add).batch(3)),
    restore_at_every_step(lambda: grain.MapDataset.range(6).random_map(add, seed=9).repeat(2).to_iter_dataset()),
]
""", None)

CASES["map_with_index_after_filter_repeat_and_iter"] = ("""
pair = lambda i, x: (i, x)
base = grain.MapDataset.range(10)
result = {
    "map_after_filter": [base.filter(lambda x: x % 3 == 0).map_with_index(pair)[i] for i in range(10)],
    "map_after_filter_iter": list(base.filter(lambda x: x % 3 == 0).map_with_index(pair)),
    "iter_after_filter": list(base.to_iter_dataset().filter(lambda x: x % 3 == 0).map_with_index(pair)),
    "after_repeat": list(base[:4].repeat(2).map_with_index(pair)),
    "repeat_after": list(base[:4].map_with_index(pair).repeat(2)),
    "by_index_past_len": [base[:4].map_with_index(pair)[i] for i in (4, 9)],
    "after_shuffle": list(base.shuffle(seed=2).map_with_index(pair)),
    "after_slice": list(base[3:9:2].map_with_index(pair)),
    "iter_after_batch": [(i, b.tolist()) for i, b in base.to_iter_dataset().batch(3).map_with_index(pair)],
    "restore_iter_after_filter": restore_at_every_step(
        lambda: base.to_iter_dataset().filter(lambda x: x % 3 == 0).map_with_index(pair)),
}
""", None)

CASES["map_returning_none_on_map_dataset"] = ("""
ds = grain.MapDataset.range(6).map(lambda x: None if x % 2 else x)
result = [len(ds), [ds[i] for i in range(6)], list(ds), list(ds.to_iter_dataset())]
""", None)

CASES["map_with_callable_objects_and_errors"] = ("""
class Doubler:

  def __call__(self, x):
    return 2 * x

class Boom(grain.transforms.Map):

  def map(self, x):
    if x == 3:
      raise KeyError("boom")
    return x

result = [list(grain.MapDataset.range(4).map(Doubler())), list(grain.MapDataset.range(4).to_iter_dataset().map(Doubler())),
          list(grain.MapDataset.range(4).map(functools.partial(lambda a, x: a + x, 10))),
          catch(lambda: grain.MapDataset.range(5).map(Boom())[3]),
          catch(lambda: list(grain.MapDataset.range(5).map(Boom()))),
          catch(lambda: list(grain.MapDataset.range(5).to_iter_dataset().map(Boom()))),
          catch(lambda: list(grain.MapDataset.range(5).to_iter_dataset().batch(2).map(Boom())))]
""", None)

CASES["seed_validation"] = ("""
result = [catch(lambda: list(grain.MapDataset.range(3).seed(-1).random_map(lambda x, rng: x))),
          catch(lambda: list(grain.MapDataset.range(3).random_map(lambda x, rng: x, seed=-1))),
          catch(lambda: list(grain.MapDataset.range(3).random_map(lambda x, rng: x, seed=2**64))),
          catch(lambda: list(grain.MapDataset.range(3).random_map(lambda x, rng: x, seed=1.5))),
          catch(lambda: list(grain.MapDataset.range(3).shuffle(seed=-5)))]
""", None)


CASES["batch_pytree_containers_and_key_order"] = ("""
import collections
Point = collections.namedtuple("Point", ["x", "y"])

@dataclasses.dataclass
class Box:
  v: int

elements = {
    "unsorted_keys": [{"b": i, "a": -i, "c": {"z": i, "y": 0}} for i in range(3)],
    "ordered_dict": [collections.OrderedDict([("b", i), ("a", i)]) for i in range(3)],
    "namedtuple": [Point(i, np.float32(i)) for i in range(3)],
    "dataclass_leaf": [Box(i) for i in range(3)],
    "empty_dict": [{} for _ in range(3)],
    "empty_tuple_in_dict": [{"a": (), "b": i} for i in range(3)],
    "jax_arrays": "jax",
}
result = {}
for name, values in elements.items():
  if values == "jax":
    import jax.numpy as jnp
    values = [jnp.arange(3) + i for i in range(3)]
  for kind, make in (("map", lambda: list(grain.MapDataset.source(values).batch(3))),
                     ("iter", lambda: list(grain.MapDataset.source(values).to_iter_dataset().batch(2)))):
    out = catch(make)
    if out[0] != "ok":
      result[f"{name}/{kind}"] = out
      continue
    b = out[1][0]
    desc = [type(b).__name__]
    if isinstance(b, dict):
      desc.append(list(b.keys()))
      desc.append([[type(v).__name__, list(v.keys()) if isinstance(v, dict) else None] for v in b.values()])
    if isinstance(b, tuple):
      desc.append([type(v).__name__ for v in b])
    if isinstance(b, np.ndarray):
      desc.append([b.dtype.kind, b.shape])
    result[f"{name}/{kind}"] = [desc, porting_structure(out[1]), repr(out[1])[:300] if name == "dataclass_leaf" else None]
""", None)

CASES["batch_mixed_dtypes_promote_like_np_stack"] = ("""
cases = {
    "int8_int16": [np.array([1], np.int8), np.array([2], np.int16)],
    "int16_int8": [np.array([1], np.int16), np.array([2], np.int8)],
    "f32_then_py_float": [np.float32(1.5), 2.25],
    "py_int_then_float": [1, 2.5],
    "bool_then_int": [True, 2],
    "int_then_bool": [2, True],
    "uint8_then_int": [np.uint8(200), 300],
    "int_then_big": [1, 2**40],
    "big_uint": [np.uint64(2**63), np.uint64(1)],
    "str_then_int": ["a", 1],
    "int_then_str": [1, "abc"],
    "f16_f64": [np.float16(1), np.float64(1e300)],
    "complex": [1, 2j],
    "none_none": [None, None],
    "obj_arrays": [np.array([1, "a"], dtype=object), np.array([2, "b"], dtype=object)],
    "list_of_str": [["a", "b"], ["cc", "d"]],
}
result = {}
for name, values in cases.items():
  for kind, make in (("map", lambda: grain.MapDataset.source(values).batch(2)[0]),
                     ("iter", lambda: next(iter(grain.MapDataset.source(values).to_iter_dataset().batch(2))))):
    out = catch(make)
    result[f"{name}/{kind}"] = [out[0], porting_structure(out[1]) if out[0] == "ok" else out[1],
                                repr(out[1]) if out[0] == "ok" else None]
""", None)

CASES["rebatch_more_inputs"] = ("""
R = grain.experimental.RebatchIterDataset
def run(make):
  return catch(lambda: [porting_structure(b) if not isinstance(b, np.ndarray) else b.tolist() for b in make()])
text = grain.MapDataset.range(7).map(lambda x: {"t": np.full((2,), x), "s": np.asarray("s" * (x + 1))})
result = {
    "after_filter": run(lambda: R(grain.MapDataset.range(20).to_iter_dataset().filter(lambda x: x % 3 != 0).batch(4),
                                  batch_size=5)),
    "padded_batches": run(lambda: R(grain.MapDataset.range(7).to_iter_dataset().batch(
        3, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=3)), batch_size=2)),
    "strings": run(lambda: [b["s"].tolist() for b in R(text.to_iter_dataset().batch(3), batch_size=2)]),
    "unbatched_input": run(lambda: R(grain.MapDataset.range(5).to_iter_dataset(), batch_size=2)),
    "mismatched_trailing": run(lambda: R(grain.MapDataset.source([np.zeros((2, 3)), np.zeros((2, 4))]).to_iter_dataset(),
                                         batch_size=4)),
    "one_big_batch": run(lambda: R(grain.MapDataset.source([np.arange(10)]).to_iter_dataset(), batch_size=3)),
    "restore_after_filter": restore_at_every_step(
        lambda: R(grain.MapDataset.range(20).to_iter_dataset().filter(lambda x: x % 3 != 0).batch(4), batch_size=5)),
    "zero": catch(lambda: R(grain.MapDataset.range(5).to_iter_dataset().batch(2), batch_size=0)),
}
""", None)

CASES["limit_more"] = ("""
L = grain.experimental.LimitIterDataset
result = {
    "after_filter": list(L(grain.MapDataset.range(20).to_iter_dataset().filter(lambda x: x % 2), count=4)),
    "infinite_repeat": list(L(grain.MapDataset.range(3).repeat().to_iter_dataset(), count=7)),
    "restore_after_filter": restore_at_every_step(
        lambda: L(grain.MapDataset.range(20).shuffle(seed=1).to_iter_dataset().filter(lambda x: x % 2), count=4)),
    "nested": list(L(L(grain.MapDataset.range(20).to_iter_dataset(), count=6), count=3)),
    "then_batch": list(L(grain.MapDataset.range(20).to_iter_dataset(), count=5).batch(2)),
    "float_count": catch(lambda: list(L(grain.MapDataset.range(20).to_iter_dataset(), count=2.0))),
}
""", None)

CASES["batch_infinite_and_shuffled_epochs"] = ("""
inf = grain.MapDataset.range(10).repeat().batch(3)
inf_drop = grain.MapDataset.range(10).repeat().batch(3, drop_remainder=True)
sh = grain.MapDataset.range(10).shuffle(seed=4).batch(3)
result = [len(inf), len(inf_drop), inf[0], inf[3], inf[10**6], [sh[i] for i in range(8)],
          list(grain.MapDataset.range(10).shuffle(seed=4).repeat(2).batch(4)),
          list(grain.MapDataset.range(10).seed(4).shuffle().batch(4).repeat(2)),
          restore_at_every_step(lambda: grain.MapDataset.range(10).shuffle(seed=4).batch(4).repeat(2).to_iter_dataset())]
""", None)

CASES["transform_kind_mismatches"] = ("""
result = {}
for kind, base in (("map", grain.MapDataset.range(4)), ("iter", grain.MapDataset.range(4).to_iter_dataset())):
  result[kind] = {
      "map_given_random_map": catch(lambda: list(base.map(RandomMapWithDeterminismTransform()))),
      "random_map_given_map": catch(lambda: list(base.random_map(MapWithTransform(), seed=1))),
      "map_given_filter": catch(lambda: list(base.map(FilterEvenElementsOnly()))),
      "filter_given_map": catch(lambda: list(base.filter(MapWithTransform()))),
      "map_with_index_given_map": catch(lambda: list(base.map_with_index(MapWithTransform()))),
      "map_given_map_with_index": catch(lambda: list(base.map(AddIndexTransform()))),
      "apply_random_map_no_seed": catch(lambda: list(base.apply([RandomMapWithDeterminismTransform()]))),
      "apply_random_map_seeded": catch(lambda: list(base.seed(3).apply([RandomMapWithDeterminismTransform()]))),
      "map_with_index_one_arg": catch(lambda: list(base.map_with_index(lambda x: x))),
      "random_map_one_arg": catch(lambda: list(base.random_map(lambda x: x, seed=1))),
  }
""", None)

CASES["errors_raised_at_construction_or_iteration"] = ("""
def when(make):
  try:
    ds = make()
  except Exception as e:  # pylint: disable=broad-except
    return ["construction", next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__]
  try:
    list(ds)
  except Exception as e:  # pylint: disable=broad-except
    return ["iteration", next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__]
  return ["none", None]

result = {}
for kind, base in (("map", grain.MapDataset.range(4)), ("iter", grain.MapDataset.range(4).to_iter_dataset())):
  result[kind] = {
      "map_given_random_map": when(lambda: base.map(RandomMapWithDeterminismTransform())),
      "random_map_given_map": when(lambda: base.random_map(MapWithTransform(), seed=1)),
      "filter_given_map": when(lambda: base.filter(MapWithTransform())),
      "random_map_no_seed": when(lambda: base.random_map(lambda x, rng: x)),
      "batch_zero": when(lambda: base.batch(0)),
      "map_with_index_one_arg": when(lambda: base.map_with_index(lambda x: x)),
  }
result["repeat_zero"] = when(lambda: grain.MapDataset.range(4).repeat(0))
result["limit_zero"] = when(lambda: grain.experimental.LimitIterDataset(grain.MapDataset.range(4).to_iter_dataset(), count=0))
result["rebatch_zero"] = when(lambda: grain.experimental.RebatchIterDataset(grain.MapDataset.range(4).to_iter_dataset().batch(2), batch_size=0))
result["slice_int"] = when(lambda: grain.MapDataset.range(4).slice(3))
result["mismatched_batch_map"] = when(lambda: grain.MapDataset.source([np.zeros(2), np.zeros(3)]).batch(2))
result["batch_after_filter"] = when(lambda: grain.MapDataset.range(4).filter(lambda x: x).batch(2))
""", None)

CASES["batch_of_python_strings_dtype"] = ("""
# Text features: Python str leaves (not bytes, whose batches are a documented difference).
cases = {
    "str": ["a", "bb", "ccc"],
    "np_str_": [np.str_("a"), np.str_("bb"), np.str_("ccc")],
    "dict_of_str": [{"text": "hello", "id": 1}, {"text": "hi", "id": 2}, {"text": "hey!", "id": 3}],
    "tuple_with_str": [("x", 1), ("yy", 2), ("zzz", 3)],
    "str_single_element_batch": ["only"],
}
result = {}
for name, values in cases.items():
  for kind, make in (("map", lambda: grain.MapDataset.source(values).batch(3)[0]),
                     ("iter", lambda: next(iter(grain.MapDataset.source(values).to_iter_dataset().batch(3)))),
                     ("apply_batch", lambda: next(iter(grain.MapDataset.source(values).to_iter_dataset()
                                                       .apply([grain.transforms.Batch(3)]))))):
    b = make()
    leaves = list(b.values()) if isinstance(b, dict) else (list(b) if isinstance(b, tuple) else [b])
    result[f"{name}/{kind}"] = [[leaf.dtype.str, leaf.tolist()] for leaf in leaves]
b = grain.MapDataset.source(["ab", "c"]).batch(2)[0]
result["np_char_upper"] = catch(lambda: np.char.upper(b).tolist())
result["astype_bytes"] = catch(lambda: np.char.encode(b).tolist())
""", None)

CASES["data_loader_batch_operation"] = ("""
# batch_test.py's DataLoader case, read with worker_count=0 (its shared-memory check is internal).
sampler = grain.samplers.IndexSampler(num_records=4, num_epochs=1, shuffle=False,
                                      shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1,
                                                                                drop_remainder=False))
dl = grain.DataLoader(data_source=[1, 2, 3, 4], sampler=sampler, operations=[grain.transforms.Batch(batch_size=2)],
                      worker_count=0)
result = [list(dl)]
dl = grain.DataLoader(data_source=["a", "bb", "ccc", "d"], sampler=sampler,
                      operations=[grain.transforms.Batch(batch_size=3)], worker_count=0)
result.append([[b.dtype.str, b.tolist()] for b in dl])
""", None)

PORTING_STRUCTURE = {"porting_structure": structure}


@pytest.mark.parametrize("name", sorted(CASES))
def test_behaviour_equals_grain(name):
  snippet, expected = CASES[name]
  g, l = porting.run_both(HEAD + snippet, **PORTING_STRUCTURE)
  if name in DOCUMENTED_DIFFERENCES:
    DOCUMENTED_DIFFERENCES[name](plain(g.result), plain(l.result))
  else:
    assert plain(l.result) == plain(g.result)
    assert structure(l.result) == structure(g.result)  # Same array shapes and dtypes.
  if expected is not None:
    assert plain(g.result) == expected


def _next_index_after_a_dropped_remainder(g, l):
  # README: after a drop_remainder batch has run out, get_next_index counts the
  # batches made; Grain also counts the one it dropped. Everything else is equal.
  *same, (g_indices, g_set) = g
  *ours, (l_indices, l_set) = l
  assert ours == same and l_set == g_set and l_indices[:-1] == g_indices[:-1]
  assert (g_indices[-1], l_indices[-1]) == (4, 3)


# Cases whose difference is deliberate and documented in README: what is equal, and what differs how.
DOCUMENTED_DIFFERENCES = {
    "batch_iter_get_and_set_next_index": _next_index_after_a_dropped_remainder,
}


# repeat_test.py's RepeatIterDataset over mp_prefetch: worker processes, so a script on each library.
MP_PREFETCH_REPEAT = """
import json
import os
from absl import flags
flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.
import grain


def main():
  ds = grain.MapDataset.range(20).to_iter_dataset()
  ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=3, per_worker_buffer_size=2))
  values = list(grain.experimental.RepeatIterDataset(ds, num_epochs=3))
  pids = grain.MapDataset.range(20).to_iter_dataset().map(lambda x: os.getpid())
  pids = pids.mp_prefetch(grain.MultiprocessingOptions(num_workers=3))
  pids = list(grain.experimental.RepeatIterDataset(pids, num_epochs=3))
  print(json.dumps({"values": [int(v) for v in values], "pid_count": len(pids), "distinct_pids": len(set(pids))}))


if __name__ == "__main__":
  main()
"""


def test_repeat_after_mp_prefetch(tmp_path):
  g = porting.run_script(MP_PREFETCH_REPEAT, "grain", tmp_path)
  l = porting.run_script(MP_PREFETCH_REPEAT, "loader", tmp_path)
  assert g["values"] == list(range(20)) * 3
  assert l == g
