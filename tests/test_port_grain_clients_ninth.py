"""A ninth set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found by the 2026-12-05 audit (round 12): training scripts that compute the
per-host batch size or the packed length with `/` (`global_batch_size /
jax.process_count()` is a float) and pass it to `batch`, `transforms.Batch`,
`repeat`, an `IndexSampler` or a packer, catching Grain's TypeError to report
it; and pipelines whose maps return `None` for records to drop, random maps
before and after `repeat`, and empty sources, as Grain's docs and clients
write them.
"""

from __future__ import annotations

from tests import porting

FLOAT_SIZES = """
import numpy as np
import grain

NUM_HOSTS = 2
GLOBAL_BATCH = 8
per_host = GLOBAL_BATCH / NUM_HOSTS  # 4.0: a float, the mistake.

def outcome(make):
  try:
    return ["ok", [np.asarray(x).tolist() for x in make()]]
  except TypeError as e:  # What a script written for Grain catches.
    return ["TypeError", isinstance(e, TypeError)]
  except Exception as e:  # pylint: disable=broad-except
    return ["other", type(e).__name__]

ds = grain.MapDataset.range(10)
tokens = ds.map(lambda i: {"x": np.arange(i % 3 + 1)})
results = {
    "map batch": outcome(lambda: ds.batch(per_host)),
    "iter batch": outcome(lambda: ds.to_iter_dataset().batch(per_host)),
    "map batch None": outcome(lambda: ds.batch(None)),
    "map batch str": outcome(lambda: ds.batch("4")),
    "np float": outcome(lambda: ds.batch(np.float32(per_host))),
    "repeat": outcome(lambda: ds.repeat(GLOBAL_BATCH / 4)),
    "limit None": outcome(lambda: grain.experimental.LimitIterDataset(ds.to_iter_dataset(), count=None)),
    "data loader Batch": outcome(lambda: grain.DataLoader(
        data_source=list(range(10)), sampler=grain.samplers.IndexSampler(10, num_epochs=1),
        operations=[grain.transforms.Batch(per_host)])),
    "sampler num_records": outcome(lambda: grain.DataLoader(
        data_source=list(range(10)), sampler=grain.samplers.IndexSampler(len(ds) / 1, num_epochs=1), operations=[])),
    "first fit length": outcome(lambda: grain.experimental.FirstFitPackIterDataset(
        tokens.to_iter_dataset(), length_struct={"x": 8 / 2}, num_packing_bins=2)),
    "best fit length": outcome(lambda: grain.experimental.BestFitPackIterDataset(
        tokens.to_iter_dataset(), length_struct={"x": 8 / 2}, num_packing_bins=2)),
    "concat then split length": outcome(lambda: grain.experimental.ConcatThenSplitIterDataset(
        tokens.to_iter_dataset(), length_struct={"x": "4"})),
    "integral sizes still work": outcome(lambda: ds.batch(GLOBAL_BATCH // NUM_HOSTS)),
}
"""


def test_a_float_size_is_a_type_error_as_on_grain():
  g, l = porting.run_both(FLOAT_SIZES)
  assert l.results == g.results
  assert [k for k, v in g.results.items() if v[0] != "TypeError"] == ["integral sizes still work"]


MAPS_RETURNING_NONE = """
import grain

ds = grain.MapDataset.range(8).map(lambda x: None if x % 3 == 0 else x * 10)
evens = grain.MapDataset.range(10).filter(lambda x: x % 2 == 0)
results = {
    "by index": [ds[i] for i in range(8)],
    "list": list(ds),
    "iter": list(ds.to_iter_dataset()),
    "iter batch": [b.tolist() for b in ds.to_iter_dataset().batch(2)],
    "filter len and index": (len(evens), [evens[i] for i in range(10)]),
    "filter map": list(evens.map(lambda x: x + 1)),
}
it = iter(evens.to_iter_dataset())
next(it), next(it)
state = it.get_state()
rest = list(it)
resumed = iter(evens.to_iter_dataset())
resumed.set_state(state)
results["resumed"] = (rest, list(resumed))
"""


def test_maps_returning_none_drop_records_as_on_grain():
  g, l = porting.run_both(MAPS_RETURNING_NONE)
  assert l.results == g.results
  assert g.results["iter"] == [10, 20, 40, 50, 70]


EPOCH_SEMANTICS = """
import grain

ds = grain.MapDataset.range(5)
r = lambda x, rng: (x, int(rng.integers(1000)))
results = {
    "random map then repeat": list(ds.random_map(r, seed=1).repeat(2)),
    "repeat then random map": list(ds.repeat(2).random_map(r, seed=1)),
    "seeded shuffle repeat random map": list(ds.seed(3).shuffle().repeat(2).random_map(r)),
    "repeat batch": [b.tolist() for b in ds.repeat(2).batch(3)],
    "batch repeat": [b.tolist() for b in ds.batch(3).repeat(2)],
    "batch shuffle": [b.tolist() for b in ds.batch(2).shuffle(seed=4)],
    "shuffle by index over epochs": [ds.shuffle(seed=4)[i] for i in range(12)],
    "repeat shuffle slice": list(ds.repeat(3).shuffle(seed=2)[3:9]),
    "slice then random map": list(ds[2:4].random_map(r, seed=1)),
    "filter then random map": list(ds.filter(lambda x: x % 2).random_map(r, seed=1)),
    "filter iter random map": list(ds.filter(lambda x: x % 2).to_iter_dataset().random_map(r, seed=1)),
    "two seeds": list(ds.seed(1).random_map(r).seed(2).random_map(r)),
    "seed kw on seeded": list(ds.seed(1).random_map(r, seed=7)),
    "two shuffles": list(ds.seed(1).shuffle().shuffle()),
}
"""


def test_random_maps_shuffles_and_repeats_across_epochs_as_on_grain():
  g, l = porting.run_both(EPOCH_SEMANTICS)
  assert l.results == g.results


EMPTY_SOURCES = """
import grain

def outcome(make):
  try:
    return ["ok", [x.tolist() if hasattr(x, "tolist") else x for x in make()]]
  except Exception as e:  # pylint: disable=broad-except
    return [next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__]

e = grain.MapDataset.source([])
r3 = grain.MapDataset.range(3)
results = {
    "len": len(e), "list": outcome(lambda: e), "shuffle": outcome(lambda: e.shuffle(seed=1)),
    "batch": outcome(lambda: e.batch(2)), "batch len": len(e.batch(2)), "repeat": outcome(lambda: e.repeat(3)),
    "iter": outcome(lambda: e.to_iter_dataset()), "iter batch": outcome(lambda: e.to_iter_dataset().batch(2)),
    "mix": outcome(lambda: grain.MapDataset.mix([e, r3], [1, 1])),
    "concatenate": outcome(lambda: grain.MapDataset.concatenate([e, r3])),
    "iter mix": outcome(lambda: grain.IterDataset.mix([e.to_iter_dataset(), r3.to_iter_dataset()], [1, 1])),
    "all filtered": outcome(lambda: grain.MapDataset.range(5).filter(lambda x: False).to_iter_dataset().batch(2)),
    "empty sampler": outcome(lambda: grain.DataLoader(data_source=[], sampler=grain.samplers.IndexSampler(
        0, num_epochs=1, shuffle=True, seed=1), operations=[])),
    "window shuffle": outcome(lambda: grain.experimental.WindowShuffleIterDataset(
        e.to_iter_dataset(), window_size=3, seed=1)),
    "slice past end": outcome(lambda: grain.MapDataset.range(5)[10:]),
}
"""


def test_empty_sources_as_on_grain():
  g, l = porting.run_both(EMPTY_SOURCES)
  assert l.results == g.results
