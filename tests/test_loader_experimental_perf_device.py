"""pick_performance_config and device_put: Grain 0.2.18's API and results."""

from __future__ import annotations

import dataclasses

import grain
import jax
import numpy as np
import pytest

import loader
from loader import experimental
from loader_testing import assert_restore_at_every_step_gives_same_stream


def _pipeline(lib, n=64, size=1000):
  # The batch on the MapDataset: elements of the random-access part are batches.
  return lib.MapDataset.range(n).map(lambda i: np.full((size,), i, np.float32)).batch(4).to_iter_dataset()


def test_performance_config_has_grains_structure():
  ours = experimental.pick_performance_config(_pipeline(loader), ram_budget_mb=1024, max_workers=3,
                                              max_buffer_size=None)
  theirs = grain.experimental.pick_performance_config(_pipeline(grain), ram_budget_mb=1024, max_workers=3,
                                                      max_buffer_size=None)
  assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
  assert isinstance(ours.multiprocessing_options, loader.MultiprocessingOptions)
  assert isinstance(ours.read_options, loader.ReadOptions)
  # A roomy budget: both use every worker allowed and Grain's largest buffer.
  assert ours.multiprocessing_options.num_workers == theirs.multiprocessing_options.num_workers == 3
  assert ours.read_options.prefetch_buffer_size == theirs.read_options.prefetch_buffer_size == 1000
  assert _pipeline(loader).mp_prefetch(ours.multiprocessing_options)  # Usable as is.


def test_tight_budgets_shrink_chunks_then_workers_and_buffers():
  roomy = experimental.pick_performance_config(_pipeline(loader, size=100_000), ram_budget_mb=4096, max_workers=4,
                                               max_buffer_size=64)
  assert roomy.multiprocessing_options.num_workers == 4 and roomy.multiprocessing_options.chunk_size is None
  tight = experimental.pick_performance_config(_pipeline(loader, size=100_000), ram_budget_mb=40, max_workers=4,
                                               max_buffer_size=64)
  assert tight.multiprocessing_options.num_workers == 4 and tight.multiprocessing_options.chunk_size >= 1
  assert tight.read_options.prefetch_buffer_size == 40 * 2**20 // (4 * 100_000 * 4)
  starved = experimental.pick_performance_config(_pipeline(loader, size=100_000), ram_budget_mb=2, max_workers=4,
                                                 max_buffer_size=64)
  assert starved.multiprocessing_options.num_workers < 4
  unlimited = experimental.pick_performance_config(_pipeline(loader), ram_budget_mb=None, max_workers=2,
                                                   max_buffer_size=7)
  assert (unlimited.multiprocessing_options.num_workers, unlimited.read_options.prefetch_buffer_size) == (2, 7)


def test_streams_without_random_access_get_no_workers(tmp_path):
  path = tmp_path / "empty.tfrecord"
  path.write_bytes(b"")
  config = experimental.pick_performance_config(experimental.TFRecordIterDataset(str(path)), ram_budget_mb=100,
                                                max_workers=8, max_buffer_size=None)
  assert config.multiprocessing_options.num_workers == 0
  with pytest.raises(ValueError, match="ram_budget_mb"):
    experimental.pick_performance_config(_pipeline(loader), ram_budget_mb=-1, max_workers=1, max_buffer_size=1)


def test_device_put_matches_grain():
  device = jax.devices()[0]
  ours = list(experimental.device_put(_pipeline(loader, n=10, size=3), device, cpu_buffer_size=2))
  theirs = list(grain.experimental.device_put(_pipeline(grain, n=10, size=3), device, cpu_buffer_size=2))
  assert all(isinstance(x, jax.Array) and x.devices() == {device} for x in ours)
  assert [np.asarray(x).tolist() for x in ours] == [np.asarray(x).tolist() for x in theirs]


@pytest.mark.parametrize("cpu,dev", [(3, 2), (0, 0)])
def test_device_put_restores_at_every_step(cpu, dev):
  device = jax.devices()[0]
  make = lambda: experimental.device_put(
      loader.MapDataset.range(24).shuffle(seed=1).to_iter_dataset().filter(lambda x: x % 3).batch(3), device,
      cpu_buffer_size=cpu, device_buffer_size=dev).map(np.asarray)
  assert assert_restore_at_every_step_gives_same_stream(make)


_UNFINISHED_DEVICE_PUT = """
import atexit, sys, threading
def check():  # Registered before loader's own exit handler, so it runs after it.
  alive = [t.name for t in threading.enumerate() if t.name == "loader-prefetch" and t.is_alive()]
  print("prefetch threads at exit:", len(alive), flush=True)
atexit.register(check)
import jax
import numpy as np
import loader
ds = loader.MapDataset.range(100).map(lambda x: np.full((2,), x)).to_iter_dataset()
it = iter(loader.experimental.device_put(ds, device=jax.devices()[0], cpu_buffer_size=2, device_buffer_size=2))
next(it); next(it)  # The script ends with the iterator unfinished and still referenced.
"""


def test_prefetch_threads_are_stopped_before_the_interpreter_finalizes(tmp_path):
  # A daemon thread inside jax.device_put at finalization aborts the process
  # (exit 134, "FATAL: exception not rethrown"); loader stops them at exit.
  import os, subprocess, sys  # pylint: disable=import-outside-toplevel,multiple-imports
  script = tmp_path / "train.py"
  script.write_text(_UNFINISHED_DEVICE_PUT)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert "prefetch threads at exit: 0" in out.stdout
