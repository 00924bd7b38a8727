"""`loader.experimental`: Grain 0.2.18's grain.experimental names, lazily imported."""

from __future__ import annotations

import os
import subprocess
import sys

import grain
import pytest

import loader
from loader import experimental

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_grain_name_is_supported_or_explained():
  grain_names = {n for n in dir(grain.experimental) if not n.startswith("_")}
  assert set(experimental.__all__) | set(experimental.UNSUPPORTED) == grain_names
  assert not set(experimental.__all__) & set(experimental.UNSUPPORTED)
  for name in experimental.__all__:
    assert getattr(experimental, name) is not None
  assert set(experimental.__all__) <= set(dir(experimental))


def test_unknown_names_raise_attribute_error():
  with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
    experimental.NoSuchThing  # pylint: disable=pointless-statement


def test_import_is_cheap_and_lazy():
  code = ("import sys, loader.experimental; "
          "print(sorted(m for m in sys.modules if m.startswith(('loader.transformations.', 'loader.iter_sources.', "
          "'pyarrow', 'jax', 'grain', 'tensorflow', 'apache_beam'))))")
  out = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stderr


class _Split:
  """Duck-typed FlatMap: both libraries accept it."""

  max_fan_out = 2

  def flat_map(self, x):
    return [x, x + 100] if x % 3 else []


def _snippet(lib):
  """Grain code using grain.experimental, run unchanged on either library."""
  ds = lib.MapDataset.range(30).to_iter_dataset()
  ds = lib.experimental.FlatMapIterDataset(ds, _Split())
  ds = lib.experimental.LimitIterDataset(ds, 25)
  ds = lib.experimental.RebatchIterDataset(ds.batch(4), 3)
  ds = lib.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2)
  ds = lib.experimental.RepeatIterDataset(ds, 2)
  flat = lib.experimental.FlatMapMapDataset(lib.MapDataset.range(10), _Split())
  return [b.tolist() for b in ds], [flat[i] for i in range(len(flat))]


def test_grain_snippet_runs_unchanged():
  assert _snippet(loader) == _snippet(grain)
  import loader.python as grain_python  # pylint: disable=g-import-not-at-top

  assert grain_python.experimental.LimitIterDataset is experimental.LimitIterDataset
