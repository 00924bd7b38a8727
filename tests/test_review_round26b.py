"""Review of a857a6a..ceaea03 (round 26b): DataLoader states saved before IndexSampler's repr showed
its arguments as given (seed=True, not seed=1) still restore."""

import json

import numpy as np
import pytest

import loader as grain

# What the previous version (a857a6a, 541682a) returned from get_state() after one batch of
# DataLoader(data_source=list(range(40)), sampler=IndexSampler(40, NoSharding(), shuffle=True,
# num_epochs=1, seed=True), operations=[Batch(4)], worker_count=0); the next batch was [31, 36, 24, 20].
_OLD_BOOL_SEED_STATE = {
    "version": 2, "last_seen_indices": {"0": 3}, "last_worker_index": -1, "worker_count": 0,
    "sampler": ("IndexSampler(num_records=40, shard_options=NoSharding(shard_index=0, shard_count=1, "
                "drop_remainder=False), shuffle=True, num_epochs=1, seed=1)"),
    "data_source": "<class 'list'>", "shard": [0, 1], "operations": ["batch(4, drop_remainder=False)"],
    "format": "arrayrecord-toolkit/DataLoader", "format_version": 3,
    "dataset": {"next_index": 4, "loader_state_version": 5,
                "pipeline": [5868775300332267541, 5154764706758708833, 5851433558117773219, 4901994143125783399]},
}


def _loader(seed, **kw):
  sampler = grain.python.IndexSampler(num_records=40, shard_options=grain.python.NoSharding(), shuffle=True,
                                      num_epochs=1, seed=seed, **kw)
  return grain.python.DataLoader(data_source=list(range(40)), sampler=sampler,
                                 operations=[grain.python.Batch(4)], worker_count=0)


def test_bool_seed_state_saved_before_restores():
  it = iter(_loader(True))
  it.set_state(json.dumps(_OLD_BOOL_SEED_STATE).encode())
  np.testing.assert_array_equal(next(it), [31, 36, 24, 20])


def test_bool_seed_repr_is_grains_and_new_states_restore():
  dl = _loader(True)
  assert "seed=True" in repr(dl._sampler)  # pylint: disable=protected-access
  it = iter(dl)
  next(it)
  state = it.get_state()
  want = next(it)
  it2 = iter(_loader(True))
  it2.set_state(state)
  np.testing.assert_array_equal(next(it2), want)


def test_int_seed_state_not_taken_for_another_seed():
  it = iter(_loader(1))
  it.set_state(json.dumps(_OLD_BOOL_SEED_STATE).encode())  # seed=1 is what seed=True was.
  np.testing.assert_array_equal(next(it), [31, 36, 24, 20])
  other = iter(_loader(2))
  with pytest.raises(ValueError):
    other.set_state(json.dumps(_OLD_BOOL_SEED_STATE).encode())


def test_grain_state_with_bool_seed_restores():
  import grain.python as grain_lib  # pylint: disable=g-import-not-at-top  # The reference, always installed.
  sampler = grain_lib.IndexSampler(num_records=40, shard_options=grain_lib.NoSharding(), shuffle=True,
                                   num_epochs=1, seed=True)
  dl = grain_lib.DataLoader(data_source=list(range(40)), sampler=sampler, operations=[grain_lib.Batch(4)],
                            worker_count=0)
  g = iter(dl)
  next(g)
  state = g.get_state()
  want = next(g)
  it = iter(_loader(True))
  it.set_state(state)
  np.testing.assert_array_equal(next(it), want)


# ---- ArrayRecordDataSource reprs over 120 characters leave their content hash out ----

def _long_source(tmp_path):
  import sys, os  # pylint: disable=g-import-not-at-top,multiple-imports
  sys.path.insert(0, os.path.dirname(__file__))
  import loader_testing  # pylint: disable=g-import-not-at-top
  from loader import sources  # pylint: disable=g-import-not-at-top
  files = loader_testing.write_array_records(tmp_path, 3, 7)

  class ArrayRecordDataSource(sources.ArrayRecordDataSource):  # Named as the real one: its repr is the same.
    def __len__(self):
      return 12345678901  # With 80000 files: a repr of 121 characters with its content hash.

    @property
    def paths(self):
      return list(super().paths) * 40000

  return ArrayRecordDataSource([files[0] + "[1:5]", files[2]])


def test_long_source_repr_is_the_one_states_saved_before_content_hashes_name(tmp_path):
  """A repr over 120 characters would name the source by its length alone: the content hash is left out,
  which is also how states saved before content hashes name it (files and ranges)."""
  src = _long_source(tmp_path)
  text = repr(src)
  assert "content_hash" not in text and "files_hash" in text and "ranges_hash" in text, text
  ds = grain.MapDataset.source(src).to_iter_dataset()
  assert "files_hash" in " ".join(grain.state.describe(ds))
  it = iter(ds)
  next(it)
  restored = iter(ds)
  restored.set_state(it.get_state())
