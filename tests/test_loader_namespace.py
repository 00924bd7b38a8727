"""loader's public namespaces against Grain 0.2.18's, name by name.

`NOT_SUPPORTED` is the one list of Grain names loader deliberately lacks, with
the reason; the README's porting table is built from it. Every other public
Grain name must exist in the matching loader namespace, be the same kind of
thing (class, function, module, value), and be the same object wherever Grain
exports one object under several names.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys
import types

import pytest

import loader

grain = pytest.importorskip("grain")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Grain namespace -> loader namespace.
NAMESPACES = {
    "grain": "loader",
    "grain.python": "loader.python",
    "grain.experimental": "loader.experimental",
    "grain.python.experimental": "loader.python.experimental",
    "grain.sources": "loader.sources",
    "grain.transforms": "loader.transforms",
    "grain.samplers": "loader.samplers",
    "grain.sharding": "loader.sharding",
    "grain.checkpoint": "loader.checkpoint",
    "grain.multiprocessing": "loader.multiprocessing",
    "grain.constants": "loader.constants",
}

# (Grain namespace, name) -> why loader does not have it.
NOT_SUPPORTED = {
    ("grain", "monitoring"): "Grain's internal telemetry module, reachable only as an import side effect",
    ("grain", "proto"): "Grain's internal protocol buffers (execution summaries), not public API",
    ("grain.multiprocessing", "SharedMemoryArrayMetadata"):
        "manual hand-over of shared-memory arrays by name; loader's workers already pass every numpy "
        "array through shared memory",
}


def _import(name: str) -> types.ModuleType:
  return importlib.import_module(name)


def public_names(module: types.ModuleType) -> set[str]:
  return {n for n in dir(module) if not n.startswith("_")}


def kind(value) -> str:
  if isinstance(value, types.ModuleType):
    return "module"
  if isinstance(value, type):
    return "class"
  if inspect.isroutine(value):
    return "function"
  return "value"


@pytest.mark.parametrize("grain_ns", list(NAMESPACES))
def test_every_grain_name_exists_or_is_listed_as_not_supported(grain_ns):
  ours = _import(NAMESPACES[grain_ns])
  missing = {n for n in public_names(_import(grain_ns)) if not hasattr(ours, n)}
  listed = {n for ns, n in NOT_SUPPORTED if ns == grain_ns}
  assert missing == listed, (f"{NAMESPACES[grain_ns]} lacks {sorted(missing - listed)} (not in NOT_SUPPORTED); "
                             f"NOT_SUPPORTED lists {sorted(listed - missing)}, which exist")


def test_not_supported_names_exist_in_grain():
  for grain_ns, name in NOT_SUPPORTED:
    assert hasattr(_import(grain_ns), name), (grain_ns, name)


def _supported():
  for grain_ns, ours_ns in NAMESPACES.items():
    for name in sorted(public_names(_import(grain_ns))):
      if (grain_ns, name) not in NOT_SUPPORTED:
        yield grain_ns, ours_ns, name


def test_names_are_the_same_kind_as_in_grain():
  wrong = []
  for grain_ns, ours_ns, name in _supported():
    theirs, ours = getattr(_import(grain_ns), name), getattr(_import(ours_ns), name)
    if kind(theirs) != kind(ours):
      wrong.append(f"{ours_ns}.{name} is a {kind(ours)}, Grain's a {kind(theirs)}")
    elif isinstance(theirs, (str, int, frozenset)) and ours != theirs:
      wrong.append(f"{ours_ns}.{name} == {ours!r}, Grain's {theirs!r}")
  assert not wrong, "\n".join(wrong)


def test_one_object_under_several_names_as_in_grain():
  # E.g. grain.python.MapTransform is grain.transforms.Map, InMemoryDataSource
  # is grain.sources.SharedMemoryDataSource: isinstance checks must agree.
  groups = collections.defaultdict(list)
  for grain_ns, ours_ns, name in _supported():
    theirs = getattr(_import(grain_ns), name)
    if kind(theirs) in ("class", "function", "module"):
      groups[id(theirs)].append((ours_ns, name))
  differ = []
  for places in groups.values():
    objects = {id(getattr(_import(ns), n)) for ns, n in places}
    if len(objects) > 1:
      differ.append(" / ".join(f"{ns}.{n}" for ns, n in places))
  assert not differ, "Grain exports one object as each of these, loader several:\n" + "\n".join(differ)


def test_grain_python_style_import():
  # The two spellings Grain code uses, and the submodule import path.
  code = ("import loader.python as grain, loader.python.experimental; from loader.python import experimental; "
          "import loader as g2; assert grain.MapDataset is g2.MapDataset; "
          "assert grain.experimental.__name__ == 'loader.python.experimental'; print('ok')")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": _ROOT}, timeout=120).stdout
  assert out.strip() == "ok"


def test_import_loader_is_light():
  # Grain's namespaces are imported on first use, and none of loader's own
  # (sources, config, constants, multiprocessing, python) pulls in TF/JAX/...
  code = ("import sys, json, loader; lazy = sorted(m for m in ('loader.data_loader', 'loader.transforms', "
          "'loader.samplers', 'loader.sources', 'loader.python') if m in sys.modules); "
          "import loader.python, loader.sources, loader.multiprocessing, loader.constants; "
          "loader.config.update('py_debug_mode', True); loader.sources.RangeDataSource(0, 3, 1); "
          "heavy = sorted(m for m in ('tensorflow', 'jax', 'grain', 'apache_beam', 'pyarrow', 'orbax') "
          "if m in sys.modules); print(json.dumps([lazy, heavy]))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": _ROOT}, timeout=120).stdout
  assert json.loads(out) == [[], []]


def test_dir_and_star_import_list_the_lazy_names():
  assert {"DataLoader", "sources", "transforms", "checkpoint", "load", "config"} <= set(dir(loader))
  assert {"MapTransform", "PyGrainDatasetIterator", "INDEX"} <= set(dir(_import("loader.python")))
  namespace = {}
  exec("from loader import *", namespace)  # pylint: disable=exec-used
  assert namespace["DataLoader"] is loader.DataLoader and namespace["sources"] is loader.sources
  with pytest.raises(AttributeError, match="module 'loader' has no attribute 'nope'"):
    loader.nope  # pylint: disable=pointless-statement
  with pytest.raises(AttributeError, match="module 'loader.python' has no attribute 'nope'"):
    _import("loader.python").nope  # pylint: disable=pointless-statement


# --- options, config, constants: Grain's fields, defaults and keys ---------


@pytest.mark.parametrize("name", ["ReadOptions", "MultiprocessingOptions"])
def test_options_have_grains_fields_and_defaults(name):
  theirs, ours = getattr(grain, name), getattr(loader, name)
  their_fields = [(f.name, f.default) for f in dataclasses.fields(theirs)]
  our_fields = [(f.name, f.default) for f in dataclasses.fields(ours)]
  assert our_fields[:len(their_fields)] == their_fields  # Same order: positional calls agree.
  extra = {"chunk_size": None, **({"workers_run_main": True} if name == "MultiprocessingOptions" else {})}
  assert our_fields[len(their_fields):] == list(extra.items())
  assert dataclasses.asdict(ours()) == {**dataclasses.asdict(theirs()), **extra}
  assert loader.multiprocessing.MultiprocessingOptions is loader.MultiprocessingOptions


def test_options_positional_and_validation():
  assert loader.ReadOptions(4, 8) == loader.ReadOptions(num_threads=4, prefetch_buffer_size=8)
  assert dataclasses.asdict(grain.ReadOptions(4, 8)) == {"num_threads": 4, "prefetch_buffer_size": 8}
  mp = loader.MultiprocessingOptions(2, 3, True)
  assert (mp.num_workers, mp.per_worker_buffer_size, mp.enable_profiling) == (2, 3, True)
  for bad in ({"num_threads": -1}, {"prefetch_buffer_size": -1}):
    with pytest.raises(ValueError):
      grain.ReadOptions(**bad)
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must be an integer >= 0"):
      loader.ReadOptions(**bad)
  with pytest.raises(ValueError, match=r"enable_profiling must be True or False \(got enable_profiling='y'\)"):
    loader.MultiprocessingOptions(enable_profiling="y")
  with pytest.raises(ValueError, match=r"workers_run_main must be True or False \(got workers_run_main=0\)"):
    loader.MultiprocessingOptions(workers_run_main=0)
  # Mutable as Grain's, but assignments are validated too.
  ro = loader.ReadOptions()
  ro.num_threads = 2
  assert ro.num_threads == 2 and dataclasses.replace(ro, num_threads=3).num_threads == 3
  with pytest.raises(ValueError, match="num_threads must be an integer >= 0"):
    ro.num_threads = -1


def test_config_accepts_grains_keys():
  import absl.flags  # pylint: disable=g-import-not-at-top

  keys = sorted(f.name[len("grain_"):] for f in absl.flags.FLAGS.flags_by_module_dict()[
      "grain._src.core.config"])
  assert len(keys) == 12
  for key in keys:
    assert loader.config.get_or_default(key) == absl.flags.FLAGS[f"grain_{key}"].default, key
    assert getattr(loader.config, key) == loader.config.get_or_default(key)
    assert key in dir(loader.config)
  with pytest.raises(ValueError, match="Unrecognized config option"):
    grain.config.update("no_such_option", 1)
  with pytest.raises(ValueError, match="Unrecognized config option: 'no_such_option'; valid options: tf_"):
    loader.config.update("no_such_option", 1)
  with pytest.raises(ValueError, match="Unrecognized config option"):
    loader.config.no_such_option  # pylint: disable=pointless-statement
  with pytest.raises(ValueError, match="update()"):
    grain.config.py_debug_mode = True
  with pytest.raises(ValueError, match=r"loader.config.update\('py_debug_mode', True\)"):
    loader.config.py_debug_mode = True
  try:
    loader.config.update("py_debug_mode", True)
    loader.config.update("py_dataset_visualization_output_dir", "/tmp/viz")
    loader.config.update("py_traceback_filtering", "off")
    assert (loader.config.py_debug_mode, loader.config.py_dataset_visualization_output_dir,
            loader.config.py_traceback_filtering) == (True, "/tmp/viz", "off")
    with pytest.raises(ValueError, match=r"py_traceback_filtering must be one of 'auto', .* \(got 'bad'\)"):
      loader.config.update("py_traceback_filtering", "bad")
    with pytest.raises(ValueError, match=r"tf_lookup_batch_size must be an integer \(got '7'\)"):
      loader.config.update("tf_lookup_batch_size", "7")
  finally:
    for key in keys:
      loader.config.update(key, absl.flags.FLAGS[f"grain_{key}"].default)


def test_constants_equal_grains():
  for name in public_names(grain.constants):
    assert getattr(loader.constants, name) == getattr(grain.constants, name)
    assert getattr(_import("loader.python"), name) == getattr(grain.python, name)


def test_the_readme_status_table_counts_and_not_supported_rows_match():
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(_ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  start = text.index("<details><summary>Every public name of Grain 0.2.18")
  block = text[start:text.index("</details>", start)]
  counts = collections.Counter()
  not_supported = set()
  for line in block.splitlines():
    m = re.match(r"\| `([^`]+)`[^|]* \| (not supported|supported with a documented difference|supported) \|", line)
    if m:
      counts[m.group(2)] += 1
      if m.group(2) == "not supported":
        not_supported.add(m.group(1))
  total = sum(counts.values())
  assert (f"Totals: not supported: {counts['not supported']}, supported: {counts['supported']}, supported with a "
          f"documented difference: {counts['supported with a documented difference']} ({total} names)") in block
  assert not_supported == {name for _, name in NOT_SUPPORTED}
