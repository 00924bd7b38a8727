"""bench/device.py and bench/device.sh's saved results: data, worker counts, rendering.

The measurements themselves need an accelerator and are never run here; these
tests check the parts that run anywhere, and that the saved GPU-machine results
still render to what bench/README.md shows.
"""

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import common  # pylint: disable=wrong-import-position
from bench import device  # pylint: disable=wrong-import-position
from bench import load  # pylint: disable=wrong-import-position

SAVED = os.path.join(REPO, "bench", "results", "device")


def test_worker_counts_reach_the_core_count():
  assert device.worker_counts(16) == [0, 1, 2, 4, 8, 16]
  assert device.worker_counts(2) == [0, 1, 2]
  assert device.worker_counts(6) == [0, 1, 2, 4, 6]


def test_child_env_keeps_the_callers_pythonpath(monkeypatch):
  monkeypatch.setenv("PYTHONPATH", "/tmp/site")
  env = common.child_env(TF_CPP_MIN_LOG_LEVEL="3")
  assert env["PYTHONPATH"].split(os.pathsep) == [common.REPO_ROOT, "/tmp/site"]
  assert env["TF_CPP_MIN_LOG_LEVEL"] == "3"
  monkeypatch.delenv("PYTHONPATH")
  assert common.child_env()["PYTHONPATH"] == common.REPO_ROOT


def test_data_is_train_jax_examples_and_is_reused(tmp_path):
  import loader  # pylint: disable=g-import-not-at-top

  from examples import train_jax  # pylint: disable=g-import-not-at-top
  paths = device.ensure_data(str(tmp_path), shards=2, records=5, processes=2)
  source = loader.ArrayRecordSource(str(tmp_path))
  assert len(source) == 10
  parse = train_jax.ParseAndNormalize()
  for i in range(10):
    example = parse(source[i])
    assert example["image"].shape == (784,) and 0 <= int(example["label"]) < 10
  mtimes = [os.stat(p).st_mtime_ns for p in paths]
  assert device.ensure_data(str(tmp_path), shards=2, records=5, processes=2) == paths
  assert [os.stat(p).st_mtime_ns for p in paths] == mtimes
  assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


@pytest.mark.parametrize("name, render", [("device.json", device.render_markdown),
                                          ("load_device.json", load.render_markdown)])
def test_saved_gpu_results_render_as_saved(name, render):
  with open(os.path.join(SAVED, name)) as f:
    res = json.load(f)
  assert render(res) == res["markdown"]
