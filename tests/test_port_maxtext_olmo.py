"""MaxText's OLMo Grain loader: a DataLoader over a custom, infinite sampler, on Grain and on loader.

Source: github.com/AI-Hypercomputer/maxtext, src/maxtext/input_pipeline/
olmo_data_grain.py (OlmoNpyDataSource, OlmoIndexSampler, ShiftToInputsTargets,
make_olmo_grain_data_loader) and tests/unit/input_pipeline/
olmo_data_grain_resume_test.py. The pattern: a sampler with no `__len__`
whose `__getitem__` returns `grain.RecordMetadata` for any index (training
never ends), a source with its own `__getstate__` and a stable `__repr__`
(Grain's DataLoader checkpoint compares reprs), `shard_options` on the
DataLoader, and resume either from the iterator state or by restarting the
sampler at a step. The grain-facing code is kept as MaxText writes it,
trimmed; its index (olmo_data.py: token files cut into fixed-length
instances) is a small stand-in, and the n-gram filter is left out.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import porting
from tests.porting import plain

OLMO = '''
import hashlib
import json
import os
import sys
import threading

import grain
import numpy as np


class OlmoNpyIndex:  # Stand-in for olmo_data.OlmoNpyIndex: token files cut into windows.

  def __init__(self, paths, sequence_length):
    self.paths = list(paths)
    self.sequence_length = sequence_length
    self.dtype = "uint32"
    self.counts = [os.path.getsize(p) // 4 // sequence_length for p in self.paths]
    self.total_instances = sum(self.counts)
    self.fingerprint = hashlib.sha256(repr((self.paths, sequence_length)).encode()).hexdigest()[:16]


def global_to_local(index, instance_id):
  for file_idx, n in enumerate(index.counts):
    if instance_id < n:
      return file_idx, instance_id * index.sequence_length
    instance_id -= n
  raise IndexError(instance_id)


class OlmoNpyDataSource(grain.sources.RandomAccessDataSource):

  def __init__(self, index):
    self._index = index
    self._dtype = np.dtype(index.dtype)
    self._sequence_length = index.sequence_length
    self._mmaps = {}

  def __len__(self) -> int:
    return self._index.total_instances

  def __getitem__(self, instance_id: int):
    file_idx, token_offset = global_to_local(self._index, instance_id)
    path = self._index.paths[file_idx]
    arr = self._mmaps.get(path)
    if arr is None:
      arr = self._mmaps[path] = np.memmap(path, dtype=self._dtype, mode="r")
    tokens = np.array(arr[token_offset : token_offset + self._sequence_length], copy=True)
    return {"tokens": tokens, "instance_id": int(instance_id), "file_id": int(file_idx)}

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_mmaps"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._mmaps = {}

  def __repr__(self) -> str:
    return f"OlmoNpyDataSource(fingerprint={self._index.fingerprint!r}, seq={self._sequence_length})"


class OlmoIndexSampler:

  def __init__(self, *, total_instances, seed, shard_index=0, shard_count=1, shuffle=True, initial_step=0):
    self._total = int(total_instances)
    self._seed = int(seed)
    self._shard_index = int(shard_index)
    self._shard_count = int(shard_count)
    self._shuffle = bool(shuffle)
    self._initial_step = int(initial_step)
    self._cached_epoch = None
    self._cached_shard_indices = None
    self._cache_lock = threading.Lock()

  @property
  def num_local_instances_per_epoch(self) -> int:
    return self._total // self._shard_count

  def shard_indices(self, *, seed, epoch):
    if not self._shuffle:
      full = np.arange(self._total, dtype=np.uint64)
    else:
      digest = hashlib.sha256(f"olmo-shuffle:{int(seed)}:{int(epoch)}".encode("utf-8")).digest()
      full = np.random.default_rng(int.from_bytes(digest[:8], "little")).permutation(self._total)
    n_per = self.num_local_instances_per_epoch
    start = self._shard_index * n_per
    return full[start:start + n_per]

  def _shard_indices_for_epoch(self, epoch):
    with self._cache_lock:
      if self._cached_epoch == epoch and self._cached_shard_indices is not None:
        return self._cached_shard_indices
      shard = self.shard_indices(seed=self._seed, epoch=epoch)
      self._cached_epoch = epoch
      self._cached_shard_indices = shard
      return shard

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_cache_lock"] = None
    state["_cached_epoch"] = None
    state["_cached_shard_indices"] = None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._cache_lock = threading.Lock()

  def __getitem__(self, index: int) -> grain.RecordMetadata:
    if index < 0:
      raise IndexError(f"sampler index must be non-negative, got {index}")
    n_per = self.num_local_instances_per_epoch
    absolute = index + self._initial_step
    epoch = absolute // n_per
    in_epoch = absolute % n_per
    shard = self._shard_indices_for_epoch(epoch)
    record_key = int(shard[in_epoch])
    return grain.RecordMetadata(index=index, record_key=record_key)

  def __repr__(self) -> str:
    return (f"OlmoIndexSampler(total_instances={self._total}, seed={self._seed}, "
            f"shard_index={self._shard_index}, shard_count={self._shard_count}, shuffle={self._shuffle})")


class ShiftToInputsTargets(grain.transforms.Map):

  def map(self, element):
    tokens = element["tokens"].astype(np.int32, copy=False)
    L = tokens.shape[0]
    seg_value = np.int32(1) if bool(element.get("instance_mask", True)) else np.int32(0)
    targets = np.empty(L, dtype=np.int32)
    targets[:-1] = tokens[1:]
    targets[-1] = 0
    targets_seg = np.full(L, seg_value, dtype=np.int32)
    targets_seg[-1] = 0
    return {"inputs": tokens, "targets": targets, "inputs_position": np.arange(L, dtype=np.int32),
            "inputs_segmentation": np.ones(L, dtype=np.int32), "targets_segmentation": targets_seg}


def make_olmo_grain_data_loader(index, *, seed, batch_size, shard_index, shard_count,
                                grain_worker_count=0, grain_worker_buffer_size=1, initial_step=0):
  source = OlmoNpyDataSource(index)
  sampler = OlmoIndexSampler(total_instances=index.total_instances, seed=seed, shard_index=shard_index,
                             shard_count=shard_count, initial_step=initial_step)
  ops = [ShiftToInputsTargets(), grain.transforms.Batch(batch_size=batch_size, drop_remainder=True)]
  shard_options = grain.sharding.ShardOptions(shard_index=shard_index, shard_count=shard_count, drop_remainder=True)
  return grain.DataLoader(data_source=source, sampler=sampler, operations=ops, shard_options=shard_options,
                          worker_count=grain_worker_count, worker_buffer_size=grain_worker_buffer_size)


def take(iterator, n):
  return [{k: v.tolist() for k, v in next(iterator).items()} for _ in range(n)]


if __name__ == "__main__":
  from absl import flags
  flags.FLAGS.mark_as_parsed()
  paths = []
  for i, n in enumerate((256, 160)):
    path = f"f_{i:03d}.bin"
    np.arange(1000 * i, 1000 * i + n, dtype=np.uint32).tofile(path)
    paths.append(path)
  index = OlmoNpyIndex(paths, sequence_length=4)  # 104 instances.
  workers, shard_index, shard_count = (int(a) for a in sys.argv[1:4])
  kwargs = dict(seed=7, batch_size=4, shard_index=shard_index, shard_count=shard_count,
                grain_worker_count=workers)
  out = {}
  it = iter(make_olmo_grain_data_loader(index, **kwargs))
  out["stream"] = take(it, 40)  # Past one epoch of this host's share.
  it = iter(make_olmo_grain_data_loader(index, **kwargs))
  take(it, 5)
  state = it.get_state()
  out["state_is_bytes"] = isinstance(state, bytes)
  restored = iter(make_olmo_grain_data_loader(index, **kwargs))
  restored.set_state(state)
  out["after_restore"] = take(restored, 6)
  # Resume by restarting the sampler: its repr ignores initial_step, so the state still applies.
  offset = iter(make_olmo_grain_data_loader(index, initial_step=5 * 4, **kwargs))
  out["initial_step"] = take(offset, 6)
  other_seed = iter(make_olmo_grain_data_loader(index, **{**kwargs, "seed": 8}))
  try:
    other_seed.set_state(state)
    out["other_seed"] = "applied"
  except ValueError:
    out["other_seed"] = "ValueError"
  print(json.dumps(out))
'''


@pytest.mark.parametrize("workers,shard_index,shard_count", [(0, 0, 1), (0, 1, 2), (2, 0, 1)])
def test_olmo_data_loader_on_grain_and_loader(tmp_path, workers, shard_index, shard_count):
  got = {}
  for lib in porting.LIBS:
    d = tmp_path / lib
    d.mkdir()
    got[lib] = porting.run_script(OLMO, lib, d, str(workers), str(shard_index), str(shard_count))
  g, l = got["grain"], got["loader"]
  assert len(l["stream"]) == 40 and all(len(b["inputs"]) == 4 for b in l["stream"])
  if workers:
    # Grain's workers batch their own records (worker w: every 2nd one); loader's
    # stream is the one of 0 workers. The same rows arrive.
    rows = lambda stream: sorted(map(tuple, (r for b in stream for r in b["inputs"])))
    assert rows(l["stream"]) == rows(g["stream"])
    d = tmp_path / "loader-0"
    d.mkdir()
    assert l == porting.run_script(OLMO, "loader", d, "0", str(shard_index), str(shard_count))
  else:
    assert l["stream"] == g["stream"]
    assert l["initial_step"] == g["initial_step"]
  for ns in (g, l):
    assert ns["after_restore"] == ns["stream"][5:11]
  assert l["state_is_bytes"] == g["state_is_bytes"]
  assert l["other_seed"] == g["other_seed"]
