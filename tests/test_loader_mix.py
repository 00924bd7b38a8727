"""MapDataset.mix / concatenate / select_from_datasets and IterDataset.mix, against Grain 0.2.18."""

from __future__ import annotations

import sys

import grain
import numpy as np
import pytest

import loader
import loader.transforms
from loader import state as state_lib
from loader.transformations import mix as mix_lib
from loader_testing import assert_restore_at_every_step_gives_same_stream
from loader_testing import assert_streams_equal
from loader_testing import record_index
from loader_testing import write_array_records

M = loader.MapDataset
G = grain.MapDataset

_WEIGHTS = [None, [1, 1], [2, 1], [0.7, 0.3], [0.2, 0.5, 0.3], [1, 1000], [3, 0.5, 1e-3]]


def _inputs(lib, n):
  # Three inputs of different lengths, disjoint values.
  return [lib.range(0, 7), lib.range(100, 131), lib.range(1000, 1012)][:n]


def _n(weights):
  return 2 if weights is None else len(weights)


def _ours_at(ds, indices):
  return ds._getitems(np.asarray(indices, dtype=np.int64))  # pylint: disable=protected-access


# ---- MapDataset.mix --------------------------------------------------------


@pytest.mark.parametrize("weights", _WEIGHTS)
def test_map_mix_equals_grain_including_indices_past_the_length(weights):
  n = _n(weights)
  ours = M.mix(_inputs(M, n), weights)
  theirs = G.mix(_inputs(G, n), weights)
  assert len(ours) == len(theirs)
  assert list(ours) == list(theirs)
  # Past the length the interleaving continues into the inputs' next epochs.
  past = range(len(theirs), len(theirs) + 40)
  assert _ours_at(ours, past) == [theirs[i] for i in past]
  assert list(ours.repeat(2)) == list(theirs.repeat(2))
  assert list(ours[1:9:3]) == list(theirs[1:9:3])


def test_map_mix_dict_form_mixes_in_sorted_key_order_like_grains_tree_flattening():
  ours = M.mix({"web": M.range(0, 30), "code": M.range(100, 110)}, {"web": 0.75, "code": 0.25})
  theirs = G.mix([G.range(100, 110), G.range(0, 30)], [0.25, 0.75])
  assert list(ours) == list(theirs)


def test_map_mix_selection_matches_grains_formula_for_large_indices_and_proportions():
  from grain._src.python.dataset.transformations import mix as grain_mix  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  for proportions in [(100, 233), (100, 100000, 250), (100, 3_000_000), (7, 3, 5, 11)]:
    selector = mix_lib._ProportionalSelector(proportions)  # pylint: disable=protected-access
    ks = np.concatenate([np.arange(50), rng.integers(0, 10**12, 200)])
    got_d, got_k = selector.many(ks)
    want = [grain_mix._dataset_and_key_of_next_element(int(k), proportions) for k in ks]  # pylint: disable=protected-access
    assert list(zip(got_d.tolist(), got_k.tolist())) == want
    assert [selector.one(int(k)) for k in ks[:60]] == want[:60]


def test_map_mix_never_skips_or_repeats_an_input_element():
  ds = M.mix([M.range(0, 13), M.range(100, 150), M.range(1000, 1021)], [0.5, 0.3, 0.2])
  seen = {0: [], 1: [], 2: []}
  for x in _ours_at(ds, range(3 * len(ds))):
    seen[x // 100 if x < 1000 else 2].append(x)
  # Each input is read in order, epoch after epoch: nothing dropped or duplicated.
  for d, (start, size) in {0: (0, 13), 1: (100, 50), 2: (1000, 21)}.items():
    assert seen[d] == [start + i % size for i in range(len(seen[d]))]
  # One pass uses no element twice (Grain's length rule).
  first = list(ds)
  assert len(first) == len(set(first)) == len(ds)


def test_map_mix_of_infinite_inputs_is_infinite_like_grain():
  ours = M.mix([M.range(3).repeat(), M.range(10, 15).repeat()], [1, 2])
  theirs = G.mix([G.range(3).repeat(), G.range(10, 15).repeat()], [1, 2])
  assert len(ours) == len(theirs) == sys.maxsize
  assert _ours_at(ours, range(10**9, 10**9 + 12)) == [theirs[i] for i in range(10**9, 10**9 + 12)]


@pytest.mark.parametrize("weights", [[0, 1], [1, -1], [1, float("nan")], [False, 1]])
def test_map_mix_rejects_bad_weights(weights):
  with pytest.raises(ValueError, match="weights must be positive finite numbers"):
    M.mix([M.range(3), M.range(4)], weights)


def test_map_mix_errors_like_grain():
  for lib in (M, G):
    with pytest.raises(ValueError, match="positive length"):
      lib.mix([lib.range(3), lib.range(0)])
  with pytest.raises(ValueError, match="3 weights for 2 datasets"):
    M.mix([M.range(3), M.range(4)], [1, 2, 3])
  with pytest.raises(TypeError, match="not a MapDataset"):
    M.mix([M.range(3), M.range(4).to_iter_dataset()])
  with pytest.raises(ValueError, match="same keys"):
    M.mix({"a": M.range(3), "b": M.range(3)}, {"a": 1, "c": 1})


# ---- concatenate and select_from_datasets -----------------------------------


def test_concatenate_equals_grain_across_epochs_and_slices():
  def parts(lib):
    return [lib.range(0, 4), lib.range(10, 10), lib.range(20, 27), lib.range(30, 31)]

  ours, theirs = M.concatenate(parts(M)), G.concatenate(parts(G))
  assert len(ours) == len(theirs) == 12
  assert list(ours) == list(theirs)
  assert list(ours.repeat(3)) == list(theirs.repeat(3))
  assert list(ours[2:11:2]) == list(theirs[2:11:2])
  assert _ours_at(ours, range(12, 30)) == [theirs[i] for i in range(12, 30)]


def test_concatenate_reshuffles_shuffled_inputs_every_epoch():
  ds = M.concatenate([M.range(0, 20).shuffle(seed=3), M.range(100, 105)])
  epochs = [_ours_at(ds, range(e * 25, (e + 1) * 25)) for e in range(2)]
  assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(20)) + list(range(100, 105))
  assert epochs[0][:20] != epochs[1][:20]
  assert epochs[0][20:] == epochs[1][20:] == list(range(100, 105))


def test_concatenate_rejects_infinite_inputs_like_grain():
  for lib in (M, G):
    with pytest.raises(ValueError, match="Cannot concatenate infinite datasets"):
      lib.concatenate([lib.range(3), lib.range(2).repeat()])


class _EvenOdd(grain.transforms.DatasetSelectionMap):
  """Grain's own base class: evens from dataset 0, odds from dataset 1, 10 elements."""

  def __len__(self):
    return 10

  def __getitem__(self, index):
    return index % 2, index // 2


class _Reverse(loader.transforms.DatasetSelectionMap):

  def __len__(self):
    return 6

  def __getitem__(self, index):
    return 1 - index % 2, 5 - index // 2


def test_select_from_datasets_equals_grain_with_grain_and_loader_selection_maps():
  for selection_map in (_EvenOdd(), _Reverse()):
    ours = M.select_from_datasets([M.range(0, 10), M.range(100, 110)], selection_map)
    theirs = G.select_from_datasets([G.range(0, 10), G.range(100, 110)], selection_map)
    assert len(ours) == len(theirs)
    assert list(ours) == list(theirs)
    assert list(ours.batch(4)) and [b.tolist() for b in ours.batch(4)] == [b.tolist() for b in theirs.batch(4)]


def test_select_from_datasets_names_a_bad_mapping():

  class Bad(loader.transforms.DatasetSelectionMap):

    def __len__(self):
      return 3

    def __getitem__(self, index):
      return (2, 0) if index == 2 else (0, index)

  ds = M.select_from_datasets([M.range(5), M.range(5)], Bad())
  with pytest.raises(IndexError, match=r"mapped index 2 to \(dataset 2, index 0\); valid: dataset in \[0, 2\)"):
    list(ds)


# ---- IterDataset.mix ----------------------------------------------------------


def _iter_inputs(lib, n, filtered=False):
  dss = [lib.range(0, 7), lib.range(100, 131), lib.range(1000, 1012)][:n]
  if filtered:
    dss = [ds.filter(lambda x: x % 3 != 1) for ds in dss]
  return [ds.to_iter_dataset() for ds in dss]


@pytest.mark.parametrize("weights", _WEIGHTS)
@pytest.mark.parametrize("filtered", [False, True])
def test_iter_mix_equals_grain_and_stops_at_the_first_exhausted_input(weights, filtered):
  n = _n(weights)
  ours = list(loader.IterDataset.mix(_iter_inputs(M, n, filtered), weights))
  theirs = list(grain.IterDataset.mix(_iter_inputs(G, n, filtered), weights))
  assert ours == theirs


def test_iter_mix_dict_form_equals_grain_and_has_grains_state_shape():
  def make(lib):
    return lib.IterDataset.mix({"b": lib.MapDataset.range(10, 20).to_iter_dataset(),
                                "a": lib.MapDataset.range(5).to_iter_dataset()}, {"b": 2, "a": 1})

  ours, theirs = iter(make(loader)), iter(make(grain))
  for _ in range(4):
    assert next(ours) == next(theirs)
  assert state_lib.strip(ours.get_state())["parents"].keys() == theirs.get_state()["parents"].keys()
  mine = state_lib.strip(ours.get_state())
  assert {k: state_lib.strip(v) for k, v in mine["parents"].items()} == theirs.get_state()["parents"]
  assert (mine["index"], mine["stop"]) == (4, False)
  assert list(ours) == list(theirs)


def _mixture(lib, names, weights=None):
  pool = {"ds1": lib.MapDataset.range(10), "ds2": lib.MapDataset.range(10, 20),
          "ds3": lib.MapDataset.range(20, 30), "ds4": lib.MapDataset.range(30, 40)}
  datasets = {k: pool[k].to_iter_dataset() for k in names}
  return lib.IterDataset.mix(datasets, None if weights is None else dict(zip(names, weights)))


# (before: names, weights; after: names, weights), Grain's own recovery scenarios.
_MIXTURE_CHANGES = {
    "changed_weights": ((["ds1", "ds2", "ds3"], [0.2, 0.3, 0.5]), (["ds1", "ds2", "ds3"], [0.3, 0.3, 0.4])),
    "fewer_datasets": ((["ds1", "ds2", "ds3"], [0.2, 0.3, 0.5]), (["ds1", "ds2"], [0.5, 0.5])),
    "more_datasets": ((["ds1", "ds2"], None), (["ds1", "ds2", "ds3"], None)),
    "different_mixture": ((["ds1", "ds2", "ds3"], None), (["ds2", "ds4"], [0.6, 0.4])),
}


@pytest.mark.parametrize("change", sorted(_MIXTURE_CHANGES))
def test_iter_mix_resumes_under_a_changed_mixture_like_grain_and_maxtext(change):
  (names0, w0), (names1, w1) = _MIXTURE_CHANGES[change]
  streams = []
  for lib in (loader, grain):
    it = iter(_mixture(lib, names0, w0))
    before = [next(it) for _ in range(10)]
    state = it.get_state()
    resumed = iter(_mixture(lib, names1, w1))
    resumed.set_state(state)
    streams.append((before, list(resumed)))
  assert streams[0] == streams[1]


def test_iter_mix_resume_refuses_a_changed_input_and_a_changed_list_length():
  it = iter(_mixture(loader, ["ds1", "ds2"]))
  next(it)
  state = it.get_state()
  changed = loader.IterDataset.mix({"ds1": M.range(10).shuffle(seed=1).to_iter_dataset(),
                                    "ds2": M.range(10, 20).to_iter_dataset()})
  with pytest.raises(state_lib.StateMismatchError, match=r"input 'ds1'.*shuffle\(seed=1\)"):
    iter(changed).set_state(state)
  listed = iter(loader.IterDataset.mix([M.range(3).to_iter_dataset(), M.range(4).to_iter_dataset()]))
  next(listed)
  three = loader.IterDataset.mix([M.range(3).to_iter_dataset()] * 3)
  with pytest.raises(state_lib.StateMismatchError, match="state is for 2 inputs, this mixture has 3"):
    iter(three).set_state(listed.get_state())
  # Changed weights with the same inputs resume in the list form too (MaxText's `;` syntax), as in Grain.
  resumed = []
  for lib in (loader, grain):
    it = iter(lib.IterDataset.mix([lib.MapDataset.range(3).to_iter_dataset(),
                                   lib.MapDataset.range(10, 14).to_iter_dataset()]))
    next(it)
    reweighted = iter(lib.IterDataset.mix([lib.MapDataset.range(3).to_iter_dataset(),
                                           lib.MapDataset.range(10, 14).to_iter_dataset()], [1, 3]))
    reweighted.set_state(it.get_state())
    resumed.append(list(reweighted))
  assert resumed[0] == resumed[1]


def test_iter_mix_stays_stopped_after_restore_and_an_error_does_not_stop_it():
  ds = loader.IterDataset.mix([M.range(2).to_iter_dataset(), M.range(10, 20).to_iter_dataset()])
  it = iter(ds)
  assert list(it) == [0, 10, 1, 11]
  done = it.get_state()
  restored = iter(ds)
  restored.set_state(done)
  assert list(restored) == []

  failing = {"on": True}

  def flaky(x):
    if x == 11 and failing["on"]:
      raise RuntimeError("transient")
    return x

  ds = loader.IterDataset.mix([M.range(3).to_iter_dataset(), M.range(10, 13).to_iter_dataset().map(flaky)])
  it = iter(ds)
  assert [next(it) for _ in range(3)] == [0, 10, 1]
  with pytest.raises(RuntimeError, match="transient"):
    next(it)
  failing["on"] = False  # Grain would stop here for good; we go on after the consumed element.
  assert list(it) == [12, 2]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_grain_written_mix_state_resumes_exactly(shuffle):
  def make(lib):
    a = lib.MapDataset.range(20)
    a = a.shuffle(seed=3) if shuffle else a
    return lib.IterDataset.mix({"b": lib.MapDataset.range(100, 130).to_iter_dataset(), "a": a.to_iter_dataset()},
                               {"a": 0.4, "b": 0.6})

  assert list(make(loader)) == list(make(grain))
  theirs = iter(make(grain))
  for _ in range(7):
    next(theirs)
  ours = iter(make(loader))
  ours.set_state(theirs.get_state())
  assert list(ours) == list(theirs)


# ---- Checkpoints and worker counts ---------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("mix")
  return (write_array_records(root / "a", 2, [30, 25], prefix="a"),
          write_array_records(root / "b", 1, [40], prefix="b"))


def _map_pipeline(files):
  a, b = (M.source(loader.ArrayRecordSource(f)) for f in files)
  mixed = M.mix([a.shuffle(seed=4), b.map(lambda r: r)], [0.6, 0.4])
  # A loader selection map: a class from this module would make every worker
  # import this module, and with it Grain.
  picked = M.select_from_datasets([a, b], mix_lib.SelectionWithProportionsMap([a, b], [1, 3]))
  return M.concatenate([mixed, picked]).map(record_index).batch(4)


def test_map_ops_restore_at_every_step_also_into_two_workers(files):
  make = lambda: _map_pipeline(files).to_iter_dataset()
  two = lambda: _map_pipeline(files).to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=2))
  stream = assert_restore_at_every_step_gives_same_stream(make)
  assert_streams_equal(list(two()), stream)
  assert_restore_at_every_step_gives_same_stream(make, make_restore_ds=two, steps=[3, len(stream) - 1])


def _iter_pipeline(files, workers=None):
  a, b = (M.source(loader.ArrayRecordSource(f)).map(record_index) for f in files)
  a = a.shuffle(seed=9).to_iter_dataset().filter(lambda i: i % 5 != 0)
  b = b.repeat(2).to_iter_dataset()
  ds = loader.IterDataset.mix({"a": a, "b": b}, {"a": 0.3, "b": 0.7}).batch(3)
  if workers is not None:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  return ds


def test_iter_mix_restores_at_every_step_and_into_two_workers(files):
  stream = assert_restore_at_every_step_gives_same_stream(lambda: _iter_pipeline(files))
  assert len(stream) > 10
  assert_streams_equal(list(_iter_pipeline(files, workers=2)), stream)
  assert_restore_at_every_step_gives_same_stream(
      lambda: _iter_pipeline(files), make_restore_ds=lambda: _iter_pipeline(files, workers=2), steps=[5])


# ---- MaxText's mixture pipeline, ported by the import line -----------------------


def _maxtext_mixture(grain_module, mixture_config, shuffle):
  """MaxText's get_datasets (mixture_config branch, ArrayRecord), one host of one."""
  datasets = {}
  for name, config in mixture_config.items():
    ds = grain_module.MapDataset.source(grain_module.ArrayRecordDataSource(config["path"]))
    if shuffle:
      ds = ds.shuffle(seed=7)
    ds = ds.repeat(1)
    ds = ds[0::1]
    datasets[name] = ds.to_iter_dataset(read_options=grain_module.ReadOptions(num_threads=2,
                                                                              prefetch_buffer_size=16))
  total = sum(float(c["weight"]) for c in mixture_config.values())
  weights = {name: float(c["weight"]) / total for name, c in mixture_config.items()}
  return grain_module.IterDataset.mix(datasets, weights).map(_tagged)


def _tagged(record):
  # Sources differ in record size: (source tag, record index) is unique.
  return len(record), record_index(record)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  root = tmp_path_factory.mktemp("maxtext")
  return {f"ds{i}": write_array_records(root / f"ds{i}", 2, [12 + 5 * i, 9 + i], prefix=f"ds{i}",
                                        record_size=16 + 8 * i)
          for i in range(1, 4)}


def test_maxtext_mixture_resumes_under_a_new_mixture_config_like_grain(sources):
  import json  # pylint: disable=g-import-not-at-top
  import grain.python as grain_python  # pylint: disable=g-import-not-at-top
  import loader.python as loader_python  # pylint: disable=g-import-not-at-top

  before = {"ds1": {"path": sources["ds1"], "weight": 0.4}, "ds2": {"path": sources["ds2"], "weight": 0.6}}
  after = {"ds1": {"path": sources["ds1"], "weight": 0.5}, "ds2": {"path": sources["ds2"], "weight": 0.3},
           "ds3": {"path": sources["ds3"], "weight": 0.2}}
  results = []
  for module in (loader_python, grain_python):
    it = iter(_maxtext_mixture(module, before, shuffle=False))
    head = [next(it) for _ in range(15)]
    state = json.loads(json.dumps(it.get_state()))
    resumed = iter(_maxtext_mixture(module, after, shuffle=False))
    resumed.set_state(state)
    results.append((head, list(resumed)))
  assert results[0] == results[1]
  assert len(results[0][1]) > 5


def test_maxtext_shuffled_mixture_resume_continues_every_input_where_it_stopped(sources):
  import loader.python as loader_python  # pylint: disable=g-import-not-at-top

  config = {name: {"path": files, "weight": w} for (name, files), w in zip(sorted(sources.items()), [1, 2, 1])}
  it = iter(_maxtext_mixture(loader_python, config, shuffle=True))
  head = [next(it) for _ in range(20)]
  state = it.get_state()
  del config["ds2"]  # Remove an input, reweight the others.
  config["ds3"]["weight"] = 3
  # MaxText adds mp_prefetch after the mixture; with loader it loses nothing on a mixture change.
  resumed = iter(_maxtext_mixture(loader_python, config, shuffle=True).mp_prefetch(
      loader.MultiprocessingOptions(num_workers=1)))
  resumed.set_state(state)
  tail = list(resumed)
  for name in ("ds1", "ds3"):
    alone = list(M.source(loader.ArrayRecordSource(sources[name])).shuffle(seed=7).map(_tagged))
    seen = set(alone)
    mine = [x for x in head if x in seen] + [x for x in tail if x in seen]
    assert mine == alone[:len(mine)]  # Its own order, nothing repeated or skipped across the resume.


@pytest.mark.parametrize("form", ["numpy", "numpy_ints", "dict_values", "bools", "dict_weights_for_a_list"])
def test_weights_and_datasets_in_the_forms_grain_takes(form):
  # Normalised token counts come as numpy arrays; configs as dicts of datasets and weights.
  def build(lib):
    parts = {"a": lib.MapDataset.range(0, 7), "b": lib.MapDataset.range(100, 131)}
    datasets, weights = [parts["a"], parts["b"]], {
        "numpy": np.array([0.3, 0.7]), "numpy_ints": np.array([1, 2]), "dict_values": {"a": 0.3, "b": 0.7}.values(),
        "bools": [True, 1], "dict_weights_for_a_list": {"a": 1, "b": 2}}[form]
    if form == "dict_values":
      datasets = parts.values()
    if form == "dict_weights_for_a_list":
      return lib.IterDataset.mix([d.to_iter_dataset() for d in datasets], weights)
    return lib.MapDataset.mix(datasets, weights)
  ours, theirs = build(loader), build(grain)
  assert [int(x) for x in ours] == [int(x) for x in theirs]
