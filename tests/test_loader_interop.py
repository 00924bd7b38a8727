"""Interop with Grain and the import-time contract of the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import loader
from loader_testing import record_index
from loader_testing import write_array_records

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("interop"), 2, [6, 9])


def test_our_source_plugs_into_grain(files):
  grain = pytest.importorskip("grain")
  src = loader.ArrayRecordSource(files)
  ds = grain.MapDataset.source(src).shuffle(seed=1)
  assert sorted(record_index(r) for r in ds) == list(range(15))
  assert record_index(grain.MapDataset.source(src)[14]) == 14


def test_grain_source_plugs_into_our_dataset(files):
  grain = pytest.importorskip("grain")
  gsrc = grain.sources.ArrayRecordDataSource(files)
  ours = loader.MapDataset.source(gsrc).shuffle(seed=5).batch(4)
  theirs = loader.MapDataset.source(loader.ArrayRecordSource(files)).shuffle(seed=5).batch(4)
  assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


def test_grain_style_code_ports_by_changing_the_import(files):
  grain = pytest.importorskip("grain")

  def flatten(batches):
    return sorted(int(x) for b in batches for x in b)

  ref = flatten(grain.MapDataset.source(grain.sources.ArrayRecordDataSource(files)).map(record_index)
                .filter(lambda i: i % 2 == 0).to_iter_dataset().batch(3))
  ours = flatten(loader.MapDataset.source(loader.ArrayRecordSource(files)).map(record_index)
                 .filter(lambda i: i % 2 == 0).to_iter_dataset().batch(3)
                 .mp_prefetch(loader.MultiprocessingOptions(num_workers=0)))
  assert ours == ref == list(range(0, 15, 2))


def test_import_loader_imports_no_tensorflow_jax_or_grain():
  code = ("import sys, json, loader; loader.MapDataset.range(3).shuffle(seed=1); "
          "print(json.dumps(sorted(m for m in ('tensorflow', 'jax', 'grain', 'torch') if m in sys.modules)))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": _ROOT}, timeout=60).stdout
  assert json.loads(out) == []


def test_public_api():
  for name in ["ArrayRecordSource", "MapDataset", "IterDataset", "DatasetIterator", "MultiprocessingOptions",
               "ReadOptions", "save_state", "restore_state", "parse_example", "FixedLenFeature", "VarLenFeature",
               "WorkerError"]:
    assert hasattr(loader, name), name
  assert set(loader.__all__) >= {"ArrayRecordSource", "MapDataset", "jax"}
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    loader.nope  # pylint: disable=pointless-statement


def test_loader_jax_is_lazy():
  code = ("import sys, loader; assert 'loader.jax' not in sys.modules; m = loader.jax; "
          "assert m.__name__ == 'loader.jax'; print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": _ROOT}, timeout=60).stdout
  assert out.strip() == "False"  # Touching loader.jax must not import JAX itself.
