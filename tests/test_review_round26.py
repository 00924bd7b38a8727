"""Review of 3807537 (sources name their content's hash in checkpoints): legacy states and robustness.

States saved before sources named a hash of their files' content must still
resume where an operation embeds its inputs' descriptions (ElasticIterator,
clipped to 160 characters; an interleave of a MapDataset of datasets, whose
digest covers them); a transient failure to read the files' ends must not
give the source another identity; and a long ArrayRecordDataSource repr must
not lose its file names and ranges.
"""

from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest

import loader
from loader import source as source_lib
from loader import state as state_lib
from loader_testing import take


@pytest.fixture(name="files")
def _files(tmp_path):
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  paths = []
  for name, n in (("a", 100), ("b", 200)):
    path = str(tmp_path / f"{name}.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    for i in range(n):
      writer.write(f"{name}{i}".encode())
    writer.close()
    paths.append(path)
  return paths


def _old_reprs(monkeypatch):
  """Sources' reprs as the version before content hashes wrote them (62adec1)."""
  def ar_repr(self):
    return f"ArrayRecordSource({len(self._paths)} files, {self._len} records, files_hash={self._files_hash()})"

  def ards_repr(self):
    text = f"ArrayRecordDataSource({len(self.paths)} files, {len(self)} records, files_hash={self._files_hash()}"
    if self._ranges is not None:
      text += f", ranges_hash={self._ranges['hash']}"
    return text + ")"

  monkeypatch.setattr(source_lib.ArrayRecordSource, "__repr__", ar_repr)
  monkeypatch.setattr(loader.sources.ArrayRecordDataSource, "__repr__", ards_repr)


def _identity(x):
  return x


def _elastic(paths):
  ds = loader.MapDataset.source(loader.ArrayRecordSource(paths)).shuffle(seed=42)
  for _ in range(6):  # The elastic op's description is then over 160 characters, clipped.
    ds = ds.map(_identity)
  return loader.experimental.ElasticIterator(ds, global_batch_size=4,
                                             shard_options=loader.sharding.ShardOptions(0, 1))


def _interleave(paths):
  # A MapDataset of datasets whose description names an ArrayRecordSource (hashed into the op's digest).
  names = loader.MapDataset.source(loader.ArrayRecordSource(paths))[:3]
  datasets = names.map(lambda b: loader.MapDataset.range(5).map(lambda i, b=b: (b, i)).to_iter_dataset())
  return loader.experimental.InterleaveIterDataset(datasets, cycle_length=2)


def _legacy_states(make, paths, monkeypatch, steps=3):
  """A version 5 and a version 4 state of `make(paths)` after `steps` elements, as the version before wrote them."""
  with monkeypatch.context() as m:
    _old_reprs(m)
    it = iter(make(paths))
    take(it, steps)
    state = it.get_state()
    description = state_lib.describe(make(paths))
  assert "content_hash" not in str(description) and "files_hash" in str(description)
  assert "content_hash" in str(state_lib.describe(make(paths)))
  v5 = state_lib.stamp(state_lib.strip(state), description)
  v4 = {**state_lib.strip(state), state_lib.VERSION_KEY: 4, state_lib.PIPELINE_KEY: list(description)}
  return v5, v4


@pytest.mark.parametrize("make", [_elastic, _interleave], ids=["elastic", "interleave_of_datasets"])
def test_states_saved_before_content_hashes_resume_where_an_op_embeds_its_inputs(files, monkeypatch, make):
  if make is _elastic:
    assert state_lib.describe(make(files))[0].endswith("...")  # Clipped: removing the hash is not enough.
  for old in _legacy_states(make, files, monkeypatch):
    it, reference = iter(make(files)), iter(make(files))
    it.set_state(old)
    take(reference, 3)
    assert repr(take(it, 4)) == repr(take(reference, 4))


def test_new_elastic_state_on_regenerated_files_is_still_refused(files, tmp_path):
  it = iter(_elastic(files))
  take(it, 2)
  state = it.get_state()
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  other = tmp_path / "other"
  other.mkdir()
  regenerated = []
  for path, n in zip(files, (100, 200)):
    target = str(other / os.path.basename(path))
    writer = ArrayRecordWriter(target, "group_size:1")
    for i in range(n):
      writer.write(f"{os.path.basename(path)[0]}{i + 1000}".encode())  # Same count, other records.
    writer.close()
    regenerated.append(target)
  with pytest.raises(state_lib.StateMismatchError):
    iter(_elastic(regenerated)).set_state(state)


def test_an_unreadable_moment_does_not_give_the_source_another_identity(files, monkeypatch):
  """With no file descriptor left (EMFILE) the hash was of the error text, cached: every later state refused."""
  good = repr(loader.ArrayRecordSource(files))
  source = loader.ArrayRecordSource(files)
  real_open = os.open

  def busy_open(path, *args, **kwargs):
    if str(path).endswith(".array_record"):
      raise OSError(errno.EMFILE, "Too many open files")
    return real_open(path, *args, **kwargs)

  with monkeypatch.context() as m:
    m.setattr(source_lib.os, "open", busy_open)
    busy = repr(source)
    make = lambda: loader.MapDataset.source(source).shuffle(seed=3).to_iter_dataset()
    it = iter(make())
    take(it, 5)
    state = it.get_state()
  assert "content_hash" not in busy and re.sub(r", content_hash=[0-9a-f]{8}", "", good) == busy
  assert repr(source) == good  # Not cached: read again once the files can be read.
  restored, reference = iter(make()), iter(make())
  restored.set_state(state)
  take(reference, 5)
  assert take(restored, 5) == take(reference, 5)


def test_long_array_record_data_source_repr_keeps_its_names_and_ranges(files):
  class Huge(loader.sources.ArrayRecordDataSource):
    # Stands for 20k files and 2e10 records (the repr only).
    paths = property(lambda self: ["f"] * 20000)

    def __len__(self):
      return 20_000_000_000

  description = state_lib.describe(loader.MapDataset.source(Huge([files[0] + "[5:50]", files[1]])))
  assert "files_hash=" in description[0] and "ranges_hash=" in description[0], description


def test_description_and_states_stay_plain(files):
  ds = loader.MapDataset.source(loader.ArrayRecordSource(files)).to_iter_dataset()
  description = state_lib.describe(ds)
  assert isinstance(description, list) and description == list(description)
  state = iter(ds).get_state()
  assert all(type(h) is int for h in state["pipeline"])
  assert np.asarray(state["pipeline"]).dtype == np.int64
