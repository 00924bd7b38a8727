"""`grain.experimental.get_element_spec` on Grain and, with only the import line changed, on loader.

The cases are the element-spec tests of Grain 0.2.18's own test files
(batch, map, filter, slice, repeat, limit, rebatch, shuffle, mix, interleave,
zip, cache, base) and the stages around them, on the public names: each
pipeline's spec (shapes and dtypes, tree structure included), or the
exception type where Grain cannot tell (a source over a list, a map without
`output_spec`, a custom batch function, flat maps and packing).
"""

from __future__ import annotations

import pytest

from tests import porting

HEAD = """
import dataclasses
import functools
import grain
import numpy as np


def spec(ds):
  try:
    s = grain.experimental.get_element_spec(ds)
  except Exception as e:  # pylint: disable=broad-except
    kind = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
    return [kind.__name__, str(e)[:40]]
  return ["ok", described(s)]


def described(tree):
  if isinstance(tree, dict):
    return {k: described(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [type(tree).__name__] + [described(v) for v in tree]
  return [type(tree).__name__, list(tree.shape), str(np.dtype(tree.dtype))]


class ToDict(grain.transforms.Map):

  def map(self, x):
    return {"x": np.full((3,), x, np.float32), "id": x}

  def output_spec(self, input_spec):
    return {"x": grain.experimental.ShapeDtypeStruct(shape=(3,), dtype=np.float32), "id": input_spec}


class Noise(grain.transforms.RandomMap):

  def random_map(self, x, rng):
    return x + rng.random()

  def output_spec(self, input_spec):
    return grain.experimental.ShapeDtypeStruct(shape=input_spec.shape, dtype=np.float64)


class WithIndex(grain.transforms.MapWithIndex):

  def map_with_index(self, i, x):
    return (i, x)

  def output_spec(self, input_spec):
    return (grain.experimental.ShapeDtypeStruct(shape=(), dtype=np.int64), input_spec)


class Plain(grain.transforms.Map):

  def map(self, x):
    return x


class Even(grain.transforms.Filter):

  def filter(self, x):
    return x % 2 == 0


class Fan(grain.experimental.FlatMapTransform):

  max_fan_out = 2

  def flat_map(self, x):
    return [x, x]


r = grain.MapDataset.range(10)
it = r.to_iter_dataset()
"""

CASES = {
    "range_and_index_stages": """
result = [spec(r), spec(grain.MapDataset.range(2, 9, 3)), spec(r.shuffle(seed=1)), spec(r[2:7]), spec(r.repeat(3)),
          spec(r.seed(3)), spec(r.filter(Even())), spec(r.filter(lambda x: x > 2))]
""",
    "maps_with_and_without_output_spec": """
result = [spec(r.map(ToDict())), spec(r.random_map(Noise(), seed=1)), spec(r.map_with_index(WithIndex())),
          spec(r.map(Plain())), spec(r.map(lambda x: x)), spec(it.map(ToDict())), spec(it.random_map(Noise(), seed=1)),
          spec(it.map_with_index(WithIndex())), spec(it.map(Plain())), spec(r.map(ToDict()).map(Plain()))]
""",
    "batch": """
result = [spec(r.batch(3)), spec(r.batch(3, drop_remainder=True)), spec(it.batch(4)),
          spec(it.batch(4, drop_remainder=True)), spec(r.map(ToDict()).batch(2, drop_remainder=True)),
          spec(it.filter(Even()).batch(2)), spec(r.batch(2, batch_fn=lambda xs: np.stack(xs))),
          spec(r.batch(3, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=3))),
          spec(r.batch(2).batch(5, drop_remainder=True)), spec(grain.MapDataset.source([1, 2]).batch(2))]
""",
    "iter_stages": """
result = [spec(it), spec(it.filter(Even())),
          spec(it.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))),
          spec(grain.experimental.LimitIterDataset(it, 3)), spec(grain.experimental.RepeatIterDataset(it, 2)),
          spec(grain.experimental.CacheIterDataset(it)),
          spec(grain.experimental.RebatchIterDataset(it.batch(4), batch_size=3)),
          spec(grain.experimental.RebatchIterDataset(r.map(ToDict()).batch(4).to_iter_dataset(), batch_size=6)),
          spec(grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=2)),
          spec(grain.experimental.WithOptionsIterDataset(it, grain.experimental.DatasetOptions())),
          spec(it.seed(4))]
""",
    "combining_and_window_shuffles": """
result = [spec(grain.MapDataset.mix([r, r.map(ToDict())])), spec(grain.IterDataset.mix([it, it])),
          spec(grain.MapDataset.concatenate([r, r])), spec(grain.experimental.ZipMapDataset([r, r.map(ToDict())])),
          spec(grain.experimental.ZipIterDataset([it, it.batch(2)])),
          spec(grain.experimental.InterleaveIterDataset([it, it], cycle_length=2)),
          spec(grain.experimental.WindowShuffleMapDataset(r, window_size=3, seed=1)),
          spec(grain.experimental.WindowShuffleIterDataset(it, window_size=3, seed=1))]
""",
    "not_known": """
result = [spec(grain.MapDataset.source([1, 2, 3])), spec(grain.MapDataset.source(grain.sources.RangeDataSource(0, 5, 1))),
          spec(grain.experimental.FlatMapMapDataset(r, Fan())), spec(grain.experimental.FlatMapIterDataset(it, Fan())),
          spec(grain.experimental.FirstFitPackIterDataset(it.map(lambda x: {"a": np.arange(x)}),
                                                        length_struct={"a": 4}, num_packing_bins=2))]
""",
    "shape_dtype_struct": """
s = grain.experimental.ShapeDtypeStruct(shape=(1, 2), dtype=np.float32)
result = [isinstance(s, grain.experimental.ShapeDtypeStructProtocol), list(s.shape), str(np.dtype(s.dtype)),
          s == grain.experimental.ShapeDtypeStruct((1, 2), np.float32), dataclasses.is_dataclass(s),
          isinstance(object(), grain.experimental.ShapeDtypeStructProtocol)]
try:
  s.shape = (3,)
  result.append("mutable")
except dataclasses.FrozenInstanceError:
  result.append("frozen")
""",
}


@pytest.mark.parametrize("name", list(CASES))
def test_element_spec_equals_grain(name):
  g, l = porting.run_both(HEAD + CASES[name])
  assert l.result == g.result


def test_jax_shape_dtype_struct_meets_the_protocol():
  jax = pytest.importorskip("jax")
  g, l = porting.run_both("import grain\nimport jax\nimport numpy as np\n"
                          "result = isinstance(jax.ShapeDtypeStruct((1,), np.float32), "
                          "grain.experimental.ShapeDtypeStructProtocol)")
  assert l.result == g.result is True
  del jax


def test_python_experimental_names_are_the_same_objects():
  _, l = porting.run_both("import grain\nimport grain.python as gp\n"
                          "result = [gp.experimental.get_element_spec is grain.experimental.get_element_spec, "
                          "gp.experimental.ShapeDtypeStruct is grain.experimental.ShapeDtypeStruct]")
  assert l.result == [True, True]
