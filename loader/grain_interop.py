"""Libraries that accept Grain datasets accept loader's too (Keras's `model.fit`).

Keras 3 recognises a Grain dataset in two steps: a class named `MapDataset`
or `IterDataset` from a module whose name contains "grain" somewhere in its
MRO (`keras...data_adapters.is_grain_dataset`), then `isinstance` against the
real `grain.MapDataset` / `grain.IterDataset` (its GrainDatasetAdapter, which
imports Grain). loader's dataset classes therefore derive from the two empty
markers below, and are registered as virtual subclasses of Grain's abstract
dataset classes whenever Grain is imported in the same process (now, or
later through `_GrainWatcher`). Nothing here imports Grain.

`grain.DataLoader` is a concrete class: code that requires an instance of it
(Keras's `fit` on a DataLoader) needs Grain's own.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

# Grain's module that defines MapDataset and IterDataset (0.2.x).
_GRAIN_DATASET_MODULE = "grain._src.python.dataset.dataset"


class MapDataset:  # pylint: disable=too-few-public-methods
  """Marker base of loader.MapDataset: the name and module Keras looks for."""

  __slots__ = ()


class IterDataset:  # pylint: disable=too-few-public-methods
  """Marker base of loader.IterDataset: the name and module Keras looks for."""

  __slots__ = ()


def _register(grain_dataset: Any) -> None:
  # Lazy: this module is imported by map_dataset and iter_dataset themselves.
  from loader import iter_dataset  # pylint: disable=g-import-not-at-top
  from loader import map_dataset  # pylint: disable=g-import-not-at-top

  for theirs, ours in (("MapDataset", map_dataset.MapDataset), ("IterDataset", iter_dataset.IterDataset)):
    cls = getattr(grain_dataset, theirs, None)
    if cls is not None and hasattr(cls, "register"):
      cls.register(ours)


class _GrainWatcher(importlib.abc.MetaPathFinder):
  """Registers loader's classes right after Grain's dataset module is executed, then leaves."""

  def find_spec(self, fullname, path, target=None):  # pylint: disable=unused-argument
    if fullname != _GRAIN_DATASET_MODULE:
      return None
    sys.meta_path.remove(self)  # Once, and not for the lookup below.
    spec = importlib.util.find_spec(fullname)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    execute = spec.loader.exec_module

    def exec_module(module):
      execute(module)
      _register(module)

    spec.loader.exec_module = exec_module
    return spec


def install() -> None:
  """Registers now if Grain is imported, else when it is."""
  module = sys.modules.get(_GRAIN_DATASET_MODULE)
  if module is not None:
    _register(module)
  elif not any(isinstance(f, _GrainWatcher) for f in sys.meta_path):
    sys.meta_path.insert(0, _GrainWatcher())
