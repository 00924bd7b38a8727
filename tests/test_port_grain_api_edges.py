"""Grain 0.2.18's API contract at its edges, probed on Grain and, with only the import line changed, on loader.

Stream equality is fuzzed elsewhere (test_port_grain_differential*.py); here
each probe is a short snippet that client code or a client's test suite might
run, and what is compared is its outcome:

* Python protocols: `len()` (of a MapDataset after filter / slice / repeat /
  batch; of an IterDataset or iterator: TypeError), `bool()`, `iter()` twice,
  `iter(it) is it`, `next()` after the end, `__getitem__` with slices
  (negative steps, out of range, slice of a slice), negative and numpy
  indices, `pickle` / `copy.copy` / `copy.deepcopy` of datasets and iterators,
  `repr` / `str`, `isinstance` relations (also `grain.python.*` against
  `grain.*`), `parents`, `MapDataset[int]` in annotations, and subclasses that
  call `super().__init__(parents)`.
* Argument validation: batch sizes, drop_remainder, seeds (None, negative,
  huge, floats, bools, numpy ints, strings), shuffle without a seed, repeat
  counts, slice steps, non-callable maps and filters, range arguments,
  ReadOptions / MultiprocessingOptions / ShardOptions, IndexSampler,
  DataLoader, mixing weights, and Grain's experimental helpers
  (`apply_transformations`, `batch_and_pad`, `get_element_spec`,
  `RebatchIterDataset`, limits, window shuffles, interleave, flat maps).

The rule (`assert_same_outcome`): where Grain returns, loader returns the same
value; where Grain raises, loader raises an instance of Grain's exception
class (loader's message may be clearer; loader uses dual-type errors such as
`checks.ZeroSizeError(ValueError, ZeroDivisionError)` where Grain's type is
odd). Where loader refuses a bad argument when the pipeline is built and Grain
only when it is iterated, `test_loader_refuses_early_with_the_error_grain_raises_later`
checks that loader's early error is an instance of Grain's later one.
"""

from __future__ import annotations

import pytest

from tests import porting
from tests.porting import plain

HEAD = """
import copy
import itertools
import pickle
import numpy as np
import grain
R = grain.MapDataset.range
X = grain.experimental
"""


def outcome(snippet: str, lib: str) -> tuple[str, object]:
  """("ok", the snippet's `result`) or ("raise", the exception)."""
  try:
    ns = porting.run(HEAD + snippet, lib)
  except Exception as e:  # pylint: disable=broad-except
    return "raise", e
  return "ok", plain(getattr(ns, "result", None))


def assert_same_outcome(snippet: str) -> None:
  kind, grain_value = outcome(snippet, "grain")
  loader_kind, loader_value = outcome(snippet, "loader")
  if kind == "raise":
    assert loader_kind == "raise", f"Grain raises {grain_value!r}; loader returned {loader_value!r}"
    assert isinstance(loader_value, type(grain_value)), (
        f"Grain raises {type(grain_value).__name__}({grain_value}); loader raises "
        f"{type(loader_value).__name__}({loader_value}), not an instance of Grain's class")
  else:
    assert loader_kind == "ok", f"Grain returns {grain_value!r}; loader raises {loader_value!r}"
    assert loader_value == grain_value


def next_after_end(make_iterator: str) -> str:
  return f"""
it = {make_iterator}
list(it)
result = []
for _ in range(2):
  try:
    next(it)
    result.append('value')
  except StopIteration:
    result.append('stop')
"""


PROTOCOLS = {
    "len_filter": "result = len(R(10).filter(lambda x: x % 2))",
    "len_slices": "result = [len(R(10)[2:8:3]), len(R(10)[::-1]), len(R(10)[100:200]), len(R(10)[-3:]), "
                  "len(R(10)[2:8][1:3]), len(R(10)[::-3]), len(R(3)[2**70:])]",
    "len_repeat": "result = [len(R(10).repeat(3)), len(R(10).repeat(None)), len(R(10).repeat()), "
                  "len(R(5).repeat(None)[3:10]), len(R(5).repeat(None)[::2])]",
    "len_batch": "result = [len(R(10).batch(3)), len(R(10).batch(3, drop_remainder=True)), len(R(0).batch(3))]",
    "len_other_ops": "result = [len(R(5).map_with_index(lambda i, x: x)), len(R(5).random_map(lambda x, r: x, seed=1)), "
                     "len(grain.MapDataset.mix([R(2), R(3)])), len(X.ZipMapDataset([R(3), R(5)]))]",
    "len_iter_dataset": "result = len(R(10).to_iter_dataset())",
    "len_iterator": "result = len(iter(R(10).to_iter_dataset()))",
    "len_map_iterator": "result = len(iter(R(10)))",
    "bool_map": "result = [bool(R(0)), bool(R(3)), bool(R(3).repeat()), bool(R(0).filter(lambda x: True)), "
                "bool(R(3).filter(lambda x: False))]",
    "bool_iter": "result = [bool(R(0).to_iter_dataset()), bool(iter(R(0).to_iter_dataset()))]",
    "iter_twice_map": "ds = R(5); a = iter(ds); next(a); b = iter(ds); result = [next(b), list(a)]",
    "iter_twice_iter": "ds = R(5).to_iter_dataset(); a = iter(ds); next(a); b = iter(ds); result = [next(b), list(a)]",
    "iter_of_iterator": "it = iter(R(5).to_iter_dataset()); result = [iter(it) is it, iter(iter(R(2))) is not None]",
    "next_after_end": next_after_end("iter(R(2).to_iter_dataset())"),
    "next_after_end_map": next_after_end("iter(R(2))"),
    "next_after_end_batch": next_after_end("iter(R(5).to_iter_dataset().batch(2))"),
    "state_after_end": "it = iter(R(3).to_iter_dataset()); list(it); s = it.get_state(); "
                       "result = [s['next_index'], list(it)]",
    "builtins": "result = [list(reversed(R(4))), 2 in R(4), 9 in R(4), list(enumerate(R(3))), "
                "list(zip(R(3), R(3).to_iter_dataset())), R(3) == R(3), type(hash(R(3))).__name__]",
    "slices": "ds = R(10); result = [list(ds[::-1]), list(ds[::-2]), list(ds[8:2:-2]), list(ds[100:200]), "
              "list(ds[-3:]), list(ds[2:8][1:3]), list(ds[1:9:2][::-1]), list(ds[-100:100]), list(ds[3:1])]",
    "slice_of_map": "ds = R(10).map(lambda x: x * 2); result = [list(ds[::-3]), list(ds[2:][::2][1:])]",
    "slice_step_0": "result = R(10)[::0]",
    "slice_iter_dataset": "result = R(3).to_iter_dataset()[0:2]",
    "getitem_iter_dataset": "result = R(3).to_iter_dataset()[0]",
    "indices": "result = [R(10)[-1], R(10)[-10], R(10)[np.int64(3)], R(10)[np.int32(-2)], R(10)[np.uint8(4)], "
               "R(10)[np.array(3)], R(10)[True], R(10)[10], R(10)[25], R(10)[-11], R(3)[2**70], "
               "R(5).repeat()[-1], R(5).repeat(2)[-1]]",
    "index_str": "result = R(10)['a']",
    "index_none": "result = R(10)[None]",
    "index_list": "result = R(10)[[1, 2]]",
    "source_wraps_index": "result = grain.MapDataset.source([1, 2, 3])[5]",
    "pickle_map_dataset": "ds = R(10).map(abs).batch(2); result = list(pickle.loads(pickle.dumps(ds)))",
    "pickle_iter_dataset": "ds = R(10).map(abs).to_iter_dataset(); result = list(pickle.loads(pickle.dumps(ds)))",
    "pickle_lambda_map": "pickle.dumps(R(10).map(lambda x: x))",
    "pickle_iterator": "it = iter(R(10).to_iter_dataset()); next(it); result = list(pickle.loads(pickle.dumps(it)))",
    "pickle_map_iterator": "it = iter(R(10)); next(it); result = list(pickle.loads(pickle.dumps(it)))",
    "copy_map_dataset": "ds = R(10).map(abs); result = [list(copy.copy(ds)), list(copy.deepcopy(ds))]",
    "copy_iter_dataset": "ds = R(10).map(abs).to_iter_dataset(); result = [list(copy.copy(ds)), list(copy.deepcopy(ds))]",
    # A copy of an iterator with a stage after the prefetch shares that stage's parent, in both.
    "copy_chained_iterator": "it = iter(R(10).to_iter_dataset().map(abs)); next(it); c = copy.copy(it); "
                             "result = [list(c), list(it)]",
    "deepcopy_iterator": "it = iter(R(10).to_iter_dataset()); next(it); c = copy.deepcopy(it); result = [list(c), list(it)]",
    "deepcopy_map_iterator": "it = iter(R(10)); next(it); c = copy.deepcopy(it); result = [list(c), list(it)]",
    "repr_str": "ds = R(10).map(abs).filter(bool); xs = [repr(ds), str(ds), repr(ds.to_iter_dataset()), "
                "str(iter(ds.to_iter_dataset())), repr(iter(ds)), repr(ds.to_iter_dataset().batch(2).mp_prefetch()), "
                "str(R(4).batch(2)), repr(X.LimitIterDataset(ds.to_iter_dataset(), 2))]; "
                "result = [type(x).__name__ for x in xs]",
    "isinstance": """
import collections.abc as abc
ds = R(3); ids = ds.to_iter_dataset(); it = iter(ids)
result = [isinstance(ds, grain.MapDataset), isinstance(ds, grain.IterDataset), isinstance(ids, grain.MapDataset),
          isinstance(ids, grain.IterDataset), isinstance(it, grain.DatasetIterator), isinstance(it, grain.IterDataset),
          isinstance(iter(ds), grain.DatasetIterator), isinstance(ids, grain.DatasetIterator),
          issubclass(grain.DatasetIterator, grain.IterDataset), isinstance(ds.batch(2), grain.MapDataset),
          isinstance(ids.batch(2), grain.IterDataset), isinstance(ds, abc.Sequence), isinstance(ds, abc.Iterable),
          isinstance(it, abc.Iterator), isinstance(ids, abc.Iterable), isinstance(ds, abc.Sized),
          isinstance(X.ZipMapDataset([ds]), grain.MapDataset), isinstance(X.LimitIterDataset(ids, 1), grain.IterDataset)]
""",
    "python_namespace": """
import grain.python as gp
result = [gp.MapDataset is grain.MapDataset, gp.IterDataset is grain.IterDataset,
          gp.DatasetIterator is grain.DatasetIterator, gp.DataLoader is grain.DataLoader,
          gp.ReadOptions is grain.ReadOptions, gp.MultiprocessingOptions is grain.MultiprocessingOptions,
          gp.MapTransform is grain.transforms.Map, gp.RandomMapTransform is grain.transforms.RandomMap,
          gp.FilterTransform is grain.transforms.Filter, gp.Batch is grain.transforms.Batch,
          gp.IndexSampler is grain.samplers.IndexSampler, gp.ShardOptions is grain.sharding.ShardOptions,
          gp.ArrayRecordDataSource is grain.sources.ArrayRecordDataSource,
          gp.RangeDataSource is grain.sources.RangeDataSource, gp.Record is grain.Record,
          gp.RecordMetadata is grain.RecordMetadata]
""",
    "parents": "ds = R(3); m = ds.map(abs); b = m.batch(2); i = b.to_iter_dataset(); "
               "result = [ds.parents == [], m.parents[0] is ds, len(b.parents), i.parents[0] is b, "
               "type(i.parents).__name__, type(m.parents).__name__, grain.MapDataset.mix([ds, ds]).parents[1] is ds]",
    "class_getitem": "def f(ds: grain.MapDataset[int]) -> grain.IterDataset[str]: pass\n"
                     "result = [f.__annotations__['ds'].__origin__ is grain.MapDataset, "
                     "f.__annotations__['return'].__origin__ is grain.IterDataset, "
                     "grain.DatasetIterator[int].__origin__ is grain.DatasetIterator, grain.MapDataset[int].__args__ == (int,)]",
    "subclass_map_dataset": """
class Doubled(grain.MapDataset):
  def __init__(self, parent):
    super().__init__(parent)
  def __len__(self):
    return len(self._parent)
  def __getitem__(self, i):
    if isinstance(i, slice):
      return self.slice(i)
    return self._parent[i] * 2
ds = Doubled(R(4))
result = [list(ds), list(ds.map(abs)), ds.parents[0] is not None, list(ds[1:3]), list(ds.to_iter_dataset()),
          isinstance(ds, grain.MapDataset)]
""",
    "subclass_map_dataset_two_parents": """
class Zip2(grain.MapDataset):
  def __init__(self, a, b):
    super().__init__([a, b])
  def __len__(self):
    return min(len(p) for p in self.parents)
  def __getitem__(self, i):
    return tuple(p[i] for p in self.parents)
ds = Zip2(R(4), R(10, 13))
result = [list(ds), len(ds.parents)]
""",
    "subclass_iter_dataset": """
class It(grain.DatasetIterator):
  def __init__(self, parent):
    super().__init__(parent)
  def __next__(self):
    return next(self._parent) + 100
  def get_state(self):
    return self._parent.get_state()
  def set_state(self, s):
    self._parent.set_state(s)
class Ds(grain.IterDataset):
  def __init__(self, parent):
    super().__init__(parent)
  def __iter__(self):
    return It(self._parent.__iter__())
ds = Ds(R(4).to_iter_dataset())
it = iter(ds); next(it); s = it.get_state(); a = list(it); it.set_state(s)
result = [a, list(it), list(ds.map(abs)), isinstance(it, grain.DatasetIterator), len(ds.parents)]
""",
    "subclass_without_parents": """
class It(grain.DatasetIterator):
  def __init__(self):
    super().__init__()
    self.i = 0
  def __next__(self):
    self.i += 1
    if self.i > 3:
      raise StopIteration
    return self.i
  def get_state(self):
    return {'i': self.i}
  def set_state(self, s):
    self.i = s['i']
class Ds(grain.IterDataset):
  def __init__(self):
    super().__init__()
  def __iter__(self):
    return It()
result = [list(Ds()), list(Ds().map(lambda x: x * 10)), Ds().parents]
""",
}


def _validation_probes() -> dict[str, str]:
  probes = {}
  sizes = {"0": "0", "neg": "-1", "none": "None", "float": "2.0", "float_half": "2.5", "np": "np.int64(3)", "str": "'2'"}
  for name, arg in sizes.items():
    probes[f"map_batch_{name}"] = f"result = list(R(10).batch({arg}))"
    probes[f"iter_batch_{name}"] = f"result = list(R(10).to_iter_dataset().batch({arg}))"
  for name, arg in {"str": "'yes'", "none": "None", "int1": "1", "int0": "0", "np_bool": "np.bool_(True)"}.items():
    probes[f"map_drop_remainder_{name}"] = f"result = list(R(10).batch(3, drop_remainder={arg}))"
    probes[f"iter_drop_remainder_{name}"] = f"result = list(R(10).to_iter_dataset().batch(3, drop_remainder={arg}))"
  seeds = {"none": "None", "neg": "-1", "huge": "2**64", "2**32": "2**32", "max": "2**32-1", "float": "1.5",
           "np": "np.int64(7)", "np_uint": "np.uint32(7)", "str": "'7'", "bool": "True", "neg_big": "-2**63",
           "float_huge": "2.0**40"}
  for name, arg in seeds.items():
    probes[f"shuffle_seed_{name}"] = f"result = list(R(10).shuffle(seed={arg}))"
    probes[f"shuffle_seed_build_{name}"] = f"R(10).shuffle(seed={arg}); result = 1"
    probes[f"ds_seed_{name}"] = f"result = list(R(10).seed({arg}).shuffle())"
    probes[f"iter_ds_seed_{name}"] = f"result = list(R(10).to_iter_dataset().seed({arg}).random_map(lambda x, rng: int(rng.integers(100))))"
    probes[f"random_map_seed_{name}"] = f"result = list(R(10).random_map(lambda x, rng: int(rng.integers(100)), seed={arg}))"
  for name in ("neg", "huge", "2**32", "bool", "np", "neg_big", "str", "float"):
    probes[f"window_shuffle_seed_{name}"] = (
        f"result = list(X.WindowShuffleIterDataset(R(10).to_iter_dataset(), window_size=3, seed={seeds[name]}))")
  probes.update({
      "shuffle_without_seed": "result = list(R(10).shuffle())",
      "shuffle_without_seed_build": "R(10).shuffle(); result = 1",
      "random_map_without_seed": "result = list(R(10).random_map(lambda x, rng: x))",
      "iter_random_map_without_seed": "result = list(R(10).to_iter_dataset().random_map(lambda x, rng: x))",
      "seed_string_then_shuffle": "result = [list(R(10).seed('7').shuffle()) == list(R(10).seed(7).shuffle())]",
  })
  for name, arg in {"0": "0", "neg": "-1", "none": "None", "float": "2.0", "np": "np.int64(2)", "str": "'2'"}.items():
    probes[f"map_repeat_{name}"] = f"ds = R(3).repeat({arg}); result = [len(ds), list(ds[:7])]"
    probes[f"repeat_iter_dataset_{name}"] = (
        f"result = list(itertools.islice(X.RepeatIterDataset(R(3).to_iter_dataset(), {arg}), 7))")
  for name, arg in {"int": "3", "none": "None", "str": "'abc'"}.items():
    for where, ds in {"map": "R(3)", "iter": "R(3).to_iter_dataset()"}.items():
      probes[f"{where}_map_not_callable_{name}"] = f"{ds}.map({arg}); result = 1"
      probes[f"{where}_map_not_callable_{name}_iterated"] = f"result = list({ds}.map({arg}))"
      probes[f"{where}_filter_not_callable_{name}"] = f"{ds}.filter({arg}); result = 1"
      probes[f"{where}_filter_not_callable_{name}_iterated"] = f"result = list({ds}.filter({arg}))"
    probes[f"map_with_index_not_callable_{name}"] = f"result = list(R(3).map_with_index({arg}))"
    probes[f"random_map_not_callable_{name}"] = f"result = list(R(3).random_map({arg}, seed=1))"
  probes.update({
      "filter_returns_int": "result = list(R(5).filter(lambda x: x % 2))",
      "filter_returns_none": "result = list(R(5).filter(lambda x: None))",
      "filter_returns_array": "result = list(R(5).filter(lambda x: np.array(x % 2)))",
      "iter_filter_returns_array": "result = list(R(5).to_iter_dataset().filter(lambda x: np.array(x % 2)))",
      "range_float": "result = list(R(3.0))",
      "range_negative": "result = list(R(-3))",
      "range_step_0": "result = list(R(0, 10, 0))",
      "range_np": "result = list(R(np.int64(3)))",
      "range_negative_step": "result = list(R(10, 0, -3))",
      "range_none": "result = list(R(None))",
      "range_stop_none": "result = list(R(2, None))",
      "source_iterator": "result = list(grain.MapDataset.source(iter([1, 2])))",
      "source_generator": "result = list(grain.MapDataset.source(x for x in [1, 2]))",
      "source_str": "result = list(grain.MapDataset.source('abc'))",
      "source_dict": "result = list(grain.MapDataset.source({0: 'a', 1: 'b'}))",
      "source_array": "result = list(grain.MapDataset.source(np.arange(4)))",
      "to_iter_dataset_bad_read_options": "result = list(R(3).to_iter_dataset(read_options=3))",
      "to_iter_dataset_dict_read_options": "result = list(R(3).to_iter_dataset(read_options={'num_threads': 2}))",
      "to_iter_dataset_none": "result = list(R(3).to_iter_dataset(None)) + list(R(3).to_iter_dataset(allow_nones=True))",
  })
  return probes


MO = "grain.multiprocessing.MultiprocessingOptions"
RO = "grain.ReadOptions"
SO = "grain.sharding.ShardOptions"
NS = "shard_options=grain.sharding.NoSharding()"
IS = "grain.samplers.IndexSampler"
SAMPLER = f"sampler={IS}(num_records=6, {NS}, num_epochs=1)"


def _options_probes() -> dict[str, str]:
  probes = {
      "read_options_positional": f"o = {RO}(2, 3); result = [o.num_threads, o.prefetch_buffer_size]",
      "options_eq_hash": f"result = [{RO}() == {RO}(), {RO}(num_threads=3) == {RO}(), {MO}() == {MO}(), "
                         f"{MO}(num_workers=3) == {MO}()]",
      "options_unhashable": f"result = hash({RO}())",
      "options_mutable": f"o = {RO}(); o.num_threads = 3; m = {MO}(); m.num_workers = 3; result = [o.num_threads, m.num_workers]",
      "options_replace": f"import dataclasses; o = dataclasses.replace({RO}(), num_threads=4); "
                         f"m = dataclasses.replace({MO}(), num_workers=4); "
                         "result = [o.num_threads, o.prefetch_buffer_size, m.num_workers, m.per_worker_buffer_size]",
      "options_unknown_keyword": f"{RO}(threads=3)",
      "options_repr": f"result = [repr({RO}()), repr({MO}()), repr({RO}(num_threads=2)), repr({MO}(num_workers=3))]",
      "no_sharding": "o = grain.sharding.NoSharding(); result = [o.shard_index, o.shard_count, o.drop_remainder]",
      "sampler_getitem_out_of_range": f"result = {IS}(num_records=5, {NS}, num_epochs=1)[5]",
      "sampler_getitem_negative": f"result = {IS}(num_records=5, {NS}, num_epochs=1)[-1]",
      "sampler_len": f"result = len({IS}(num_records=5, {NS}, num_epochs=1))",
      "sampler_iter": f"result = [r.index for r in {IS}(num_records=5, {NS}, num_epochs=1)]",
      "sequential_sampler": f"s = grain.samplers.SequentialSampler(num_records=5, {NS}); result = [s[i].index for i in range(5)]",
      "sequential_sampler_out_of_range": f"result = grain.samplers.SequentialSampler(num_records=5, {NS})[5]",
      "sequential_sampler_empty": f"grain.samplers.SequentialSampler(num_records=0, {NS})",
      "data_loader_iter_twice": f"dl = grain.DataLoader(data_source=list(range(6)), {SAMPLER}); a = iter(dl); next(a); "
                                "b = iter(dl); result = [next(b), list(a), iter(a) is a]",
      "data_loader_len": f"result = len(grain.DataLoader(data_source=list(range(6)), {SAMPLER}))",
      "data_loader_next_after_end": next_after_end(f"iter(grain.DataLoader(data_source=list(range(2)), {SAMPLER}))"),
      "data_loader_deepcopy": f"result = list(copy.deepcopy(grain.DataLoader(data_source=list(range(6)), {SAMPLER})))",
      "data_loader_iterator_deepcopy": f"it = iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})); next(it); "
                                       "c = copy.deepcopy(it); result = [list(c), list(it)]",
      "data_loader_isinstance": f"it = iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})); "
                                "result = [isinstance(it, grain.DataLoaderIterator), isinstance(it, grain.DatasetIterator), "
                                f"isinstance(grain.DataLoader(data_source=[1], {SAMPLER}), grain.IterDataset)]",
      "data_loader_state_garbage": f"it = iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})); it.set_state(b'garbage')",
      "state_types": f"result = [type(iter(R(5).to_iter_dataset()).get_state()).__name__, "
                     f"type(iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})).get_state()).__name__]",
      "dataset_set_state_none": "iter(R(5).to_iter_dataset()).set_state(None)",
      "dataset_set_state_empty": "iter(R(5).to_iter_dataset()).set_state({})",
      "dataset_set_state_bytes": "iter(R(5).to_iter_dataset()).set_state(b'x')",
      "batch_transform_attributes": "b = grain.transforms.Batch(3, drop_remainder=True); result = [b.batch_size, b.drop_remainder]",
      "batch_transform_float_used": f"result = list(grain.DataLoader(data_source=list(range(6)), {SAMPLER}, "
                                    "operations=[grain.transforms.Batch(2.0)]))",
      "array_record_missing_file": "grain.sources.ArrayRecordDataSource('/nonexistent/file.array_record')",
      "array_record_missing_files": "grain.sources.ArrayRecordDataSource(['/nonexistent/file.array_record'])",
      "array_record_no_files": "result = len(grain.sources.ArrayRecordDataSource([]))",
      "array_record_none": "grain.sources.ArrayRecordDataSource(None)",
      "array_record_int": "grain.sources.ArrayRecordDataSource(3)",
      "range_data_source": "s = grain.sources.RangeDataSource(0, 10, 2); result = [len(s), s[1], s[-1], repr(s)]",
      "range_data_source_out_of_range": "result = grain.sources.RangeDataSource(0, 10, 2)[7]",
  }
  for name, kw in {"zero": "num_workers=0", "buffer_0": "per_worker_buffer_size=0", "buffer_neg": "per_worker_buffer_size=-1"}.items():
    probes[f"mp_options_{name}"] = f"o = {MO}({kw}); result = [o.num_workers, o.per_worker_buffer_size, " \
                                   "list(R(6).to_iter_dataset().mp_prefetch(o))]"
  for name, kw in {"neg": "num_threads=-1", "zero": "num_threads=0", "none": "num_threads=None",
                   "buffer_0": "prefetch_buffer_size=0", "buffer_neg": "prefetch_buffer_size=-1",
                   "buffer_none": "prefetch_buffer_size=None"}.items():
    probes[f"read_options_{name}"] = f"o = {RO}({kw}); result = list(R(6).to_iter_dataset(read_options=o))"
  for name, kw in {"index_out_of_range": "shard_index=2, shard_count=2", "index_neg": "shard_index=-1, shard_count=2",
                   "count_0": "shard_index=0, shard_count=0", "count_neg": "shard_index=0, shard_count=-1",
                   "index_float": "shard_index=0.0, shard_count=2", "index_none": "shard_index=None, shard_count=2",
                   "np": "shard_index=np.int64(1), shard_count=np.int64(2)",
                   "ok": "shard_index=1, shard_count=2, drop_remainder=True"}.items():
    probes[f"shard_options_{name}"] = (
        f"o = {SO}({kw}); s = {IS}(num_records=7, shard_options=o, shuffle=False, num_epochs=1); "
        "result = [o.shard_index, o.shard_count, o.drop_remainder, [s[i].index for i in range(3)]]")
  for name, kw in {"records_0": f"num_records=0, {NS}", "records_neg": f"num_records=-1, {NS}",
                   "records_float": f"num_records=5.0, {NS}", "records_none": f"num_records=None, {NS}",
                   "no_shard_options": "num_records=5", "shard_options_none": "num_records=5, shard_options=None",
                   "shuffle_without_seed": f"num_records=5, {NS}, shuffle=True",
                   "seed_neg": f"num_records=5, {NS}, shuffle=True, seed=-1",
                   "seed_huge": f"num_records=5, {NS}, shuffle=True, seed=2**32",
                   "seed_float": f"num_records=5, {NS}, shuffle=True, seed=1.5",
                   "seed_np": f"num_records=5, {NS}, shuffle=True, seed=np.int64(3)",
                   "seed_bool": f"num_records=5, {NS}, shuffle=True, seed=True",
                   "seed_without_shuffle": f"num_records=5, {NS}, seed=3",
                   "epochs_0": f"num_records=5, {NS}, num_epochs=0", "epochs_neg": f"num_records=5, {NS}, num_epochs=-1",
                   "epochs_float": f"num_records=5, {NS}, num_epochs=2.0"}.items():
    probes[f"index_sampler_{name}"] = (f"s = {IS}({kw}); "
                                       "result = [s[i].index for i in range(3)] + [s[i].rng is None for i in range(2)] + [repr(s)]")
  for name, kw in {"source_none": "data_source=None", "sampler_none": "data_source=list(range(6)), sampler=None",
                   "workers_neg": f"data_source=list(range(6)), {SAMPLER}, worker_count=-1",
                   "operations_none": f"data_source=list(range(6)), {SAMPLER}, operations=None",
                   "operations_single": f"data_source=list(range(6)), {SAMPLER}, operations=grain.transforms.Batch(2)",
                   "operations_tuple": f"data_source=list(range(6)), {SAMPLER}, operations=(grain.transforms.Batch(2),)",
                   "operations_int": f"data_source=list(range(6)), {SAMPLER}, operations=[3]",
                   "operations_lambda": f"data_source=list(range(6)), {SAMPLER}, operations=[lambda x: x]",
                   "worker_buffer_0": f"data_source=list(range(6)), {SAMPLER}, worker_buffer_size=0",
                   "read_options_int": f"data_source=list(range(6)), {SAMPLER}, read_options=3",
                   "shard_options": f"data_source=list(range(6)), {SAMPLER}, {NS}",
                   "positional_source": f"list(range(6)), {SAMPLER}"}.items():
    kw = kw if "sampler=" in kw else f"{kw}, {SAMPLER}"
    probes[f"data_loader_{name}"] = f"result = list(grain.DataLoader({kw}))"
  return probes


_FLAT_MAP = "class F(X.FlatMapTransform):\n  max_fan_out = {fan_out}\n  def flat_map(self, x):\n    return {out}\n"
_PLUS_ONE = "class T(grain.transforms.Map):\n  def map(self, x):\n    return x + 1\n"

EXPERIMENTAL = {
    "apply_single": _PLUS_ONE + "result = list(X.apply_transformations(R(3), T()))",
    "apply_list": _PLUS_ONE + "result = list(X.apply_transformations(R(3), [T(), T()]))",
    "apply_tuple": _PLUS_ONE + "result = list(X.apply_transformations(R(3), (T(), T())))",
    "apply_empty": "ds = R(3); out = X.apply_transformations(ds, []); result = [list(out), out is ds]",
    "apply_empty_iter": "ds = R(3).to_iter_dataset(); out = X.apply_transformations(ds, []); result = [list(out), out is ds]",
    "apply_callable": "result = list(X.apply_transformations(R(3), lambda x: x))",
    "apply_batch": "result = list(X.apply_transformations(R(5), grain.transforms.Batch(2)))",
    "apply_filter_iter": "class F(grain.transforms.Filter):\n  def filter(self, x):\n    return x % 2\n"
                         "result = list(X.apply_transformations(R(5).to_iter_dataset(), F()))",
    "apply_int": "X.apply_transformations(R(3), 3)",
    "apply_none": "X.apply_transformations(R(3), None)",
    "batch_and_pad_values": "result = [X.batch_and_pad([np.int64(1), np.int64(2)], batch_size=5), "
                            "X.batch_and_pad([{'a': np.int64(1)}], batch_size=2, pad_value=-1)]",
    "batch_and_pad_float_size": "result = X.batch_and_pad([np.int64(1), np.int64(2)], batch_size=2.0)",
    "batch_and_pad_size_0": "result = X.batch_and_pad([np.int64(1), np.int64(2)], batch_size=0)",
    "batch_and_pad_size_neg": "result = X.batch_and_pad([np.int64(1), np.int64(2)], batch_size=-1)",
    "batch_and_pad_too_many": "result = X.batch_and_pad([np.int64(1), np.int64(2)], batch_size=1)",
    "batch_and_pad_empty": "result = X.batch_and_pad([], batch_size=2)",
    "batch_and_pad_as_batch_fn": "import functools\n"
                                 "result = list(R(5).to_iter_dataset().batch(3, batch_fn=functools.partial(X.batch_and_pad, batch_size=3)))",
    "batch_and_pad_batch_larger_than_data": "import functools\n"
                                            "result = list(R(3).batch(10, batch_fn=functools.partial(X.batch_and_pad, batch_size=10)))",
    "batch_and_pad_a_dataset": "result = list(X.batch_and_pad(R(3).to_iter_dataset(), batch_size=10))",
    "element_spec_map": "result = repr(X.get_element_spec(R(3).map(lambda x: np.zeros((2, x + 1), np.float32))))",
    "element_spec_range": "result = repr(X.get_element_spec(R(3)))",
    "element_spec_batch": "result = repr(X.get_element_spec(R(4).map(lambda x: {'a': np.zeros(3, np.int32)}).batch(2)))",
    "element_spec_iter": "result = repr(X.get_element_spec(R(4).map(lambda x: np.zeros(3, np.int32)).to_iter_dataset().batch(2)))",
    "element_spec_source": "result = repr(X.get_element_spec(grain.MapDataset.source([np.zeros(2)])))",
    "element_spec_empty": "result = repr(X.get_element_spec(R(0).map(lambda x: np.zeros(3))))",
    "rebatch_0": "result = list(X.RebatchIterDataset(R(6).to_iter_dataset().batch(2), batch_size=0))",
    "rebatch_neg": "result = list(X.RebatchIterDataset(R(6).to_iter_dataset().batch(2), batch_size=-1))",
    "rebatch_float": "result = list(X.RebatchIterDataset(R(6).to_iter_dataset().batch(2), batch_size=3.0))",
    "rebatch": "result = list(X.RebatchIterDataset(R(7).to_iter_dataset().batch(2), batch_size=3))",
    "rebatch_drop_remainder": "result = list(X.RebatchIterDataset(R(7).to_iter_dataset().batch(2), batch_size=3, drop_remainder=True))",
    "limit_0": "result = list(X.LimitIterDataset(R(6).to_iter_dataset(), 0))",
    "limit_neg": "result = list(X.LimitIterDataset(R(6).to_iter_dataset(), -1))",
    "limit_none": "result = list(X.LimitIterDataset(R(6).to_iter_dataset(), None))",
    "limit_big": "result = list(X.LimitIterDataset(R(6).to_iter_dataset(), 100))",
    "limit_float": "result = list(X.LimitIterDataset(R(6).to_iter_dataset(), 2.0))",
    "window_shuffle_map_window_0": "result = list(X.WindowShuffleMapDataset(R(6), window_size=0, seed=1))",
    "window_shuffle_big_window": "result = sorted(X.WindowShuffleIterDataset(R(6).to_iter_dataset(), window_size=100, seed=1))",
    "interleave_cycle_0": "result = list(X.InterleaveIterDataset([R(3).to_iter_dataset()], cycle_length=0))",
    "interleave": "result = list(X.InterleaveIterDataset(R(3).map(lambda i: R(i * 10, i * 10 + 2).to_iter_dataset()), cycle_length=2))",
    "zip_map_empty": "result = list(X.ZipMapDataset([]))",
    "zip_iter_empty": "result = list(X.ZipIterDataset([]))",
    "concatenate_empty": "result = list(grain.MapDataset.concatenate([]))",
    "concatenate_one": "result = list(grain.MapDataset.concatenate([R(2)]))",
    "mix_empty": "result = list(grain.MapDataset.mix([]))",
    "mix_weight_count": "result = list(grain.MapDataset.mix([R(2), R(3)], [1]))",
    "mix_weights_summing_to_0": "result = list(grain.MapDataset.mix([R(2), R(3)], [1, -1])[:5])",
    "mix_negative_weight": "result = list(grain.MapDataset.mix([R(2), R(3)], [1, -2])[:5])",
    "mix_zero_weights": "result = list(grain.MapDataset.mix([R(2), R(3)], [0, 1])[:5])",
    "mix_infinite_weight": "result = list(grain.MapDataset.mix([R(2), R(3)], [float('inf'), 1])[:5])",
    "mix_nan_weight": "result = list(grain.MapDataset.mix([R(2), R(3)], [float('nan'), 1])[:5])",
    "mix_str_weight": "result = list(grain.MapDataset.mix([R(2), R(3)], ['a', 1])[:5])",
    "mix_iter_weight_count": "result = list(itertools.islice(grain.IterDataset.mix([R(2).to_iter_dataset(), R(3).to_iter_dataset()], [1]), 5))",
    "mix_iter_one": "result = list(grain.IterDataset.mix([R(2).to_iter_dataset()]))",
    "flat_map_fan_out_0": _FLAT_MAP.format(fan_out=0, out="[x]") + "result = list(X.FlatMapMapDataset(R(3), F()))",
    "flat_map_over_fan_out": _FLAT_MAP.format(fan_out=1, out="[x, x]") + "result = list(X.FlatMapMapDataset(R(3), F()))",
    "flat_map_iter_over_fan_out": _FLAT_MAP.format(fan_out=1, out="[x, x]")
                                  + "result = list(X.FlatMapIterDataset(R(3).to_iter_dataset(), F()))",
    "thread_prefetch_0": "result = list(X.ThreadPrefetchIterDataset(R(3).to_iter_dataset(), prefetch_buffer_size=0))",
    "thread_prefetch_neg": "result = list(X.ThreadPrefetchIterDataset(R(3).to_iter_dataset(), prefetch_buffer_size=-1))",
    "index_shuffle": "result = [X.index_shuffle(i, max_index=4, seed=3, rounds=4) for i in range(5)]",
    "index_shuffle_out_of_range": "result = X.index_shuffle(5, max_index=4, seed=3, rounds=4)",
    "index_shuffle_negative": "result = X.index_shuffle(-1, max_index=4, seed=3, rounds=4)",
    "index_shuffle_negative_seed": "result = X.index_shuffle(1, max_index=4, seed=-3, rounds=4)",
    "index_shuffle_float": "result = X.index_shuffle(1.0, max_index=4, seed=3, rounds=4)",
    "next_index": "it = iter(R(5).to_iter_dataset()); next(it); result = X.get_next_index(it)",
    "next_index_after_map": "it = iter(R(5).to_iter_dataset().map(abs)); next(it); result = X.get_next_index(it)",
    "set_next_index": "it = iter(R(5).to_iter_dataset()); X.set_next_index(it, 3); result = list(it)",
    "set_next_index_neg": "it = iter(R(5).to_iter_dataset()); X.set_next_index(it, -1); result = list(it)",
    "set_next_index_past_end": "it = iter(R(5).to_iter_dataset()); X.set_next_index(it, 10); result = list(it)",
    "with_options": "result = list(X.WithOptionsIterDataset(R(3).to_iter_dataset(), X.DatasetOptions()))",
    "with_options_int": "result = list(X.WithOptionsIterDataset(R(3).to_iter_dataset(), 3))",
}


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_protocols_like_grain(name):
  assert_same_outcome(PROTOCOLS[name])


VALIDATION = _validation_probes()


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_argument_validation_like_grain(name):
  assert_same_outcome(VALIDATION[name])


OPTIONS = _options_probes()


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_options_samplers_and_data_loader_like_grain(name):
  assert_same_outcome(OPTIONS[name])


@pytest.mark.parametrize("name", sorted(EXPERIMENTAL))
def test_experimental_helpers_like_grain(name):
  assert_same_outcome(EXPERIMENTAL[name])


# (built on loader, built and iterated on Grain): loader refuses these when the
# pipeline is built, Grain when it is iterated; the error must be Grain's kind.
EARLY = {
    "map_batch_float": ("R(10).batch(2.5)", "list(R(10).batch(2.5))"),
    "iter_batch_float": ("R(10).to_iter_dataset().batch(2.0)", "list(R(10).to_iter_dataset().batch(2.0))"),
    "map_repeat_float": ("R(3).repeat(2.0)", "list(R(3).repeat(2.0))"),
    "seed_negative": ("R(10).seed(-1)", "list(R(10).seed(-1).shuffle())"),
    "seed_float": ("R(10).seed(1.5)", "list(R(10).seed(1.5).shuffle())"),
    "source_none": ("grain.MapDataset.source(None)", "list(grain.MapDataset.source(None))"),
    "source_int": ("grain.MapDataset.source(5)", "list(grain.MapDataset.source(5))"),
    "read_options_int": ("R(3).to_iter_dataset(read_options=3)", "list(R(3).to_iter_dataset(read_options=3))"),
    "with_options_int": ("X.WithOptionsIterDataset(R(3).to_iter_dataset(), 3)",
                         "list(X.WithOptionsIterDataset(R(3).to_iter_dataset(), 3))"),
    "flat_map_fan_out_0": (_FLAT_MAP.format(fan_out=0, out="[x]") + "X.FlatMapMapDataset(R(3), F())",
                           _FLAT_MAP.format(fan_out=0, out="[x]") + "list(X.FlatMapMapDataset(R(3), F()))"),
    "window_shuffle_map_window_0": ("X.WindowShuffleMapDataset(R(6), window_size=0, seed=1)",
                                    "list(X.WindowShuffleMapDataset(R(6), window_size=0, seed=1))"),
    "data_loader_source_none": (f"grain.DataLoader(data_source=None, {SAMPLER})",
                                f"list(grain.DataLoader(data_source=None, {SAMPLER}))"),
    "data_loader_operations_int": (f"grain.DataLoader(data_source=[1, 2], {SAMPLER}, operations=[3])",
                                   f"list(grain.DataLoader(data_source=[1, 2], {SAMPLER}, operations=[3]))"),
}


@pytest.mark.parametrize("name", sorted(EARLY))
def test_loader_refuses_early_with_the_error_grain_raises_later(name):
  build, build_and_iterate = EARLY[name]
  kind, grain_error = outcome(build_and_iterate, "grain")
  assert kind == "raise", grain_error
  kind, loader_error = outcome(build, "loader")
  assert kind == "raise", f"loader built it; Grain fails on it with {grain_error!r}"
  assert isinstance(loader_error, type(grain_error)), (loader_error, grain_error)


# Types of wrong arguments whose error Grain raises as an AttributeError or AssertionError (its `.decode`, its
# option fields, its assert); loader's errors are also of those types.
ODD_ERROR_TYPES = {
    "mp_prefetch_int": "result = list(R(6).to_iter_dataset().mp_prefetch(2))",
    "mp_prefetch_dict": "result = list(R(6).to_iter_dataset().mp_prefetch({'num_workers': 0}))",
    "range_data_source_step_0": "grain.sources.RangeDataSource(0, 10, 0)",
    "data_loader_set_state_none": f"it = iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})); it.set_state(None)",
    "data_loader_set_state_dict": f"it = iter(grain.DataLoader(data_source=list(range(6)), {SAMPLER})); it.set_state({{}})",
}


@pytest.mark.parametrize("name", sorted(ODD_ERROR_TYPES))
def test_errors_of_the_odd_types_grain_raises(name):
  assert_same_outcome(ODD_ERROR_TYPES[name])
