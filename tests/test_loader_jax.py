"""Tests for loader.jax and examples/train_jax.py.

JAX reads XLA_FLAGS once, at first import, and other test modules may have
imported it already, so every JAX check runs in a fresh subprocess with 8
fake CPU devices: `python tests/test_loader_jax.py CASE [ARGS]` calls
`_case_CASE(*ARGS)` below.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUM_DEVICES = 8


def _run_case(name: str, *args: str, timeout: int = 240) -> str:
  env = dict(os.environ)
  env.update(
      XLA_FLAGS=f"--xla_force_host_platform_device_count={_NUM_DEVICES}",
      JAX_PLATFORMS="cpu",
      TF_CPP_MIN_LOG_LEVEL="3",
      PYTHONPATH=os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p),
  )
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), name, *args],
      cwd=_ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert proc.returncode == 0, f"case {name} failed:\n{proc.stdout}\n{proc.stderr[-6000:]}"
  return proc.stdout


class _FakeHostIterator:
  """Numpy batches with the loader iterators' checkpoint interface."""

  def __init__(self, num_records: int = 100, batch_size: int = 8):
    self._x = np.arange(num_records * 3, dtype=np.float32).reshape(num_records, 3)
    self._batch_size = batch_size
    self._state = {"next_index": 0}
    self.reads = 0

  def __iter__(self):
    return self

  def __next__(self):
    i = self._state["next_index"]
    if i + self._batch_size > len(self._x):
      raise StopIteration
    # Mutated in place and handed out live by get_state: the prefetcher
    # must copy the states it stores.
    self._state["next_index"] = i + self._batch_size
    self.reads += 1
    return {"x": self._x[i : i + self._batch_size], "id": (np.arange(i, i + self._batch_size),)}

  def get_state(self):
    return self._state

  def set_state(self, state):
    self._state = dict(state)


def _ids(batch) -> list[int]:
  return np.asarray(batch["id"][0]).tolist()


# ---------------------------------------------------------------------------
# Cases (run in the subprocess).


def _case_device_put():
  import jax

  from loader import jax as ljax

  assert jax.device_count() == _NUM_DEVICES
  sharding = ljax.batch_sharding()
  host = {
      "x": np.arange(16 * 3, dtype=np.float32).reshape(16, 3),
      "nested": (np.arange(16, dtype=np.int32), [np.ones((16, 2, 2), bool)]),
  }
  out = ljax.device_put(host, sharding)
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(host)
  for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(host)):
    assert isinstance(got, jax.Array)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.sharding == sharding
    shards = got.addressable_shards
    assert len(shards) == _NUM_DEVICES
    assert {s.device for s in shards} == set(jax.devices())
    assert all(s.data.shape == (2, *want.shape[1:]) for s in shards)
    np.testing.assert_array_equal(np.asarray(got), want)
    for s in shards:  # each device holds its own slice of the batch
      np.testing.assert_array_equal(np.asarray(s.data), want[s.index])

  assert isinstance(ljax.device_put(host)["x"], jax.Array)  # default sharding

  try:
    ljax.device_put({"img": np.array([b"a"] * 8, dtype=object)}, sharding)
    raise AssertionError("object leaf accepted")
  except TypeError as e:
    assert "['img']" in str(e) and "object" in str(e), e
  try:
    ljax.device_put({"x": [np.zeros(12)]}, sharding)
    raise AssertionError("indivisible batch accepted")
  except ValueError as e:
    assert "['x'][0]" in str(e) and "(12,)" in str(e), e


def _case_batch_sharding():
  import jax
  from jax.sharding import Mesh, PartitionSpec

  from loader import jax as ljax

  default = ljax.batch_sharding()
  assert default.mesh.shape == {"data": _NUM_DEVICES}
  assert default.spec == PartitionSpec("data")

  subset = ljax.batch_sharding(jax.devices()[:4], axis_name="batch")
  x = ljax.device_put(np.arange(8), subset)
  assert len(x.addressable_shards) == 4 and subset.spec == PartitionSpec("batch")

  mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("data", "model"))
  x = ljax.device_put(np.arange(4), ljax.batch_sharding(mesh))
  # Split over "data", replicated over "model".
  assert sorted(s.data.tolist() for s in x.addressable_shards) == [[0, 1]] * 4 + [[2, 3]] * 4
  try:
    ljax.batch_sharding(mesh, axis_name="batch")
    raise AssertionError("missing axis accepted")
  except ValueError as e:
    assert "'batch'" in str(e) and "('data', 'model')" in str(e), e


def _case_prefetch_matches_host():
  import jax

  from loader import jax as ljax

  sharding = ljax.batch_sharding()
  want = [_ids(b) for b in _FakeHostIterator()]
  assert len(want) == 12
  for size in (0, 1, 2, 5, 20):
    host = _FakeHostIterator()
    it = ljax.prefetch_to_device(host, sharding, size=size)
    got = []
    for batch in it:
      assert isinstance(batch["x"], jax.Array) and batch["x"].sharding == sharding
      np.testing.assert_array_equal(
          np.asarray(batch["x"]), np.arange(len(got) * 24, len(got) * 24 + 24).reshape(8, 3)
      )
      got.append(_ids(batch))
      # Never more than `size` batches read ahead of the caller.
      assert host.reads <= len(got) + size, (size, host.reads, len(got))
      if len(got) + size <= len(want):
        assert host.reads == len(got) + size, (size, host.reads, len(got))
    assert got == want, size
    try:
      next(it)
      raise AssertionError("exhausted iterator yielded")
    except StopIteration:
      pass

  # Any iterable works when no checkpointing is asked for.
  plain = ljax.DevicePrefetchIterator([{"a": np.ones(8)}] * 3, sharding)
  assert len(list(plain)) == 3
  try:
    plain.get_state()
    raise AssertionError("get_state without host support")
  except TypeError as e:
    assert "get_state" in str(e)


def _case_prefetch_state_roundtrip():
  from loader import jax as ljax

  sharding = ljax.batch_sharding()
  for size in (0, 1, 3):
    it = ljax.DevicePrefetchIterator(_FakeHostIterator(), sharding, buffer_size=size)
    states, batches = [], []
    while True:
      states.append(it.get_state())
      try:
        batches.append(_ids(next(it)))
      except StopIteration:
        break
    # The state is the host's position of the next batch the caller gets,
    # not the prefetcher's read position.
    assert [s["next_index"] for s in states] == [8 * k for k in range(len(states))], states

    for k, state in enumerate(states):
      fresh = ljax.prefetch_to_device(_FakeHostIterator(), sharding, size=size)
      fresh.set_state(state)
      assert fresh.get_state() == state
      assert [_ids(b) for b in fresh] == batches[k:], (size, k)

    # Rewinding the same iterator mid-stream drops the stale prefetched batches.
    it = ljax.prefetch_to_device(_FakeHostIterator(), sharding, size=size)
    for _ in range(5):
      next(it)
    it.set_state(states[2])
    assert _ids(next(it)) == batches[2]
    it.set_state(states[7])
    assert [_ids(b) for b in it] == batches[7:]
    it.close()


def _case_prefetch_loader_pipeline():
  import loader
  from loader import jax as ljax

  sharding = ljax.batch_sharding()
  data = np.arange(100, dtype=np.int64)

  def make():
    return (
        loader.MapDataset.source(data)
        .shuffle(seed=3)
        .map(lambda v: {"v": np.int32(v), "sq": np.float32(v) ** 2})
        .batch(8, drop_remainder=True)
        .to_iter_dataset()
    )

  want = [b["v"].tolist() for b in iter(make())]
  flat = sum(want, [])
  assert len(want) == 12 and flat != sorted(flat)  # shuffled
  it = ljax.prefetch_to_device(iter(make()), sharding, size=2)
  states, got = [], []
  for batch in it:
    got.append(np.asarray(batch["v"]).tolist())
    np.testing.assert_array_equal(np.asarray(batch["sq"]), np.asarray(batch["v"], np.float32) ** 2)
    states.append(it.get_state())
  assert got == want
  for k in (0, 4, 10):
    resumed = ljax.prefetch_to_device(iter(make()), sharding, size=2)
    resumed.set_state(states[k])
    assert [np.asarray(b["v"]).tolist() for b in resumed] == want[k + 1 :], k


def _case_prefetch_error_at_its_step():
  # A batch that cannot be put on device (an object field in host batch 2)
  # fails at its own step, after the good batches prefetched before it.
  import loader
  from loader import jax as ljax

  def row(i):
    return {"x": np.float32(i), "s": b"t" if 16 <= i < 24 else np.float32(0)}

  ds = loader.MapDataset.range(40).map(row).batch(8, drop_remainder=True).to_iter_dataset()
  it = ljax.prefetch_to_device(iter(ds), size=2)
  firsts = [float(next(it)["x"][0]) for _ in range(2)]
  assert firsts == [0.0, 8.0], firsts
  try:
    next(it)
    raise AssertionError("batch 2 was put on device")
  except TypeError as e:
    assert "Batch leaf ['s'] has dtype object" in str(e), e
  assert [float(b["x"][0]) for b in it] == [24.0, 32.0]  # The stream goes on after the failed batch.
  print("ok")


def _case_no_jax_on_import():
  import loader  # noqa: F401
  import loader.example  # noqa: F401
  import loader.jax  # noqa: F401

  assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))


def _case_train(data_dir: str, workers: str):
  sys.path.insert(0, os.path.join(_ROOT, "examples"))
  import train_jax

  workers = int(workers)
  kwargs = dict(batch_size=32, seed=0, log_every=10)
  losses = train_jax.train(data_dir, steps=40, workers=workers, **kwargs)
  assert len(losses) == 40
  first, last = np.mean(losses[:5]), np.mean(losses[-5:])
  print(f"first={first:.4f} last={last:.4f}")
  assert last < 0.5 * first, losses

  # Stopping at step 25 and resuming (with another worker count) replays
  # exactly the uninterrupted run.
  ckpt = os.path.join(data_dir, "ckpt")
  head = train_jax.train(data_dir, steps=25, workers=0, checkpoint=ckpt, checkpoint_every=10, **kwargs)
  assert sorted(os.listdir(ckpt)) == ["step_00000020", "step_00000025"]
  tail = train_jax.train(data_dir, steps=40, workers=workers, checkpoint=ckpt, **kwargs)
  assert head + tail == losses, (head + tail, losses)


# ---------------------------------------------------------------------------
# Tests (run by pytest).


def test_device_put_builds_sharded_global_arrays():
  _run_case("device_put")


def test_batch_sharding():
  _run_case("batch_sharding")


def test_prefetch_yields_host_sequence():
  _run_case("prefetch_matches_host")


def test_prefetch_state_roundtrip():
  _run_case("prefetch_state_roundtrip")


def test_prefetch_raises_a_bad_batchs_error_at_its_own_step():
  assert "ok" in _run_case("prefetch_error_at_its_step")


def test_prefetch_with_loader_pipeline():
  import loader

  if not hasattr(loader, "MapDataset"):
    pytest.skip("loader.MapDataset not available yet")
  _run_case("prefetch_loader_pipeline")


def test_importing_loader_does_not_import_jax():
  _run_case("no_jax_on_import")


def test_train_example_loss_decreases_and_resumes(tmp_path):
  tf = pytest.importorskip("tensorflow")
  import loader

  if not hasattr(loader, "ArrayRecordSource"):
    pytest.skip("loader.ArrayRecordSource not available yet")
  from array_record.python.array_record_module import ArrayRecordWriter

  rng = np.random.default_rng(0)
  num_classes, image_size = 10, 28 * 28
  # As in pipelines/make_example_data.py: a per-label template plus noise,
  # so the label is learnable from the pixels.
  templates = rng.integers(0, 256, (num_classes, image_size))
  record_id = 0
  for shard in range(2):
    writer = ArrayRecordWriter(str(tmp_path / f"train.array_record-{shard:05d}-of-00002"), "group_size:1")
    for _ in range(300):
      label = int(rng.integers(num_classes))
      noise = rng.integers(0, 256, image_size)
      pixels = (0.6 * templates[label] + 0.4 * noise).astype(np.uint8)
      example = tf.train.Example(
          features=tf.train.Features(
              feature={
                  "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[record_id])),
                  "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                  "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixels.tobytes()])),
              }
          )
      )
      writer.write(example.SerializeToString())
      record_id += 1
    writer.close()
  out = _run_case("train", str(tmp_path), "2", timeout=400)
  assert "first=" in out


if __name__ == "__main__":
  globals()[f"_case_{sys.argv[1]}"](*sys.argv[2:])
