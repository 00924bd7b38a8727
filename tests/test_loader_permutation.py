"""Grain's index shuffle, vectorised: same values as Grain's C++, bijective, O(1) memory."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest
from grain.experimental import index_shuffle as grain_index_shuffle

import loader
from loader import permutation
from loader.permutation import IndexPermutation

from porting import run_both

SIZES = list(range(0, 40)) + [63, 64, 65, 255, 256, 257, 1000, 4093, 65536, 65537, 65538, 100_003]


def _max_indices():
  # Every block size Grain distinguishes, at and around its powers of two
  # (including max_index = 2**k, which the C++ block cannot hold).
  out = {1, 2, 3, 9, 10, 100, 1000, 65534, 65535, 65536, 65537, 65538, 2**63 - 1}
  for k in range(17, 63, 3):
    out |= {2**k - 1, 2**k, 2**k + 1}
  return sorted(out)


@pytest.mark.parametrize("max_index", _max_indices())
def test_values_equal_grains_index_shuffle(max_index):
  rng = random.Random(max_index)
  for seed in (0, 1, 42, 2**32 - 1):
    for rounds in (4, 6, 10):
      indices = sorted({0, max_index, max_index // 2, *(rng.randint(0, max_index) for _ in range(5))})
      want = [grain_index_shuffle(index=i, max_index=max_index, seed=seed, rounds=rounds) for i in indices]
      assert [permutation.index_shuffle(i, max_index, seed, rounds) for i in indices] == want
      got = permutation.shuffle_positions(np.array(indices, dtype=np.int64), max_index, seed, rounds,
                                          bijective=False)
      assert got.tolist() == want


@pytest.mark.parametrize("n", [65537, 2**18 + 1])
def test_where_grains_shuffle_repeats_a_record_ours_keeps_every_record(n):
  # Grain's block of 16 (18) bits cannot hold max_index = 2**16 (2**18): it
  # shuffles the last position like position 0. Ours differs there only.
  sample = np.array([0, 1, 12345, n - 2, n - 1])
  want = [grain_index_shuffle(index=int(i), max_index=n - 1, seed=9, rounds=4) for i in sample]
  assert want[0] == want[-1]
  got = IndexPermutation(n, 9)(sample).tolist()
  assert got[:-1] == want[:-1] and got[-1] == n - 1
  assert np.array_equal(np.sort(IndexPermutation(n, 9)(np.arange(n))), np.arange(n))


def test_a_whole_small_domain_equals_grain():
  for n in (2, 10, 777):
    want = [grain_index_shuffle(index=i, max_index=n - 1, seed=5, rounds=4) for i in range(n)]
    assert IndexPermutation(n, 5)(np.arange(n)).tolist() == want


def test_index_shuffle_rejects_what_grain_rejects():
  for bad in (3, 2, 1026):
    with pytest.raises(ValueError, match="rounds must be an even integer"):
      loader.experimental.index_shuffle(index=0, max_index=5, seed=0, rounds=bad)
  with pytest.raises(ValueError, match="index must be in"):
    loader.experimental.index_shuffle(index=6, max_index=5, seed=0, rounds=4)
  with pytest.raises(ValueError, match="index must be in"):
    loader.experimental.index_shuffle(index=-1, max_index=5, seed=0, rounds=4)


def test_index_shuffle_ports_by_import():
  snippet = """
from grain.experimental import index_shuffle
order = [index_shuffle(index=i, max_index=99, seed=1234, rounds=4) for i in range(100)]
"""
  g, l = run_both(snippet)
  assert l.order == g.order and sorted(l.order) == list(range(100))


@pytest.mark.parametrize("size", SIZES)
def test_is_a_permutation(size):
  for seed in (0, 1, 2**32 - 1):
    out = IndexPermutation(size, seed)(np.arange(size))
    assert out.dtype == np.int64
    assert np.array_equal(np.sort(out), np.arange(size))


def test_batched_and_scalar_evaluation_agree():
  p = IndexPermutation(12345, 7)
  idx = np.array([12344, 0, 5, 5, 999])
  assert p(idx).tolist() == [p[int(i)] for i in idx]
  with pytest.raises(IndexError, match="12345 out of range"):
    p[12345]


def test_positions_are_roughly_uniform():
  n, trials = 8, 4000
  counts = np.zeros((n, n))
  for s in range(trials):
    counts[np.arange(n), IndexPermutation(n, s)(np.arange(n))] += 1
  # Every (position -> target) cell near trials/n = 500; binomial sd ~ 21.
  assert counts.min() > 400 and counts.max() < 600


class _VirtualSource:
  """10**10 records; record i is i (no storage at all)."""

  def __len__(self):
    return 10**10

  def __getitem__(self, i):
    return i


def test_shuffling_ten_billion_records_uses_flat_memory():
  ds = loader.MapDataset.source(_VirtualSource()).shuffle(seed=3)
  assert len(ds) == 10**10
  tracemalloc.start()
  try:
    it = iter(ds.to_iter_dataset())
    got = [next(it) for _ in range(20_000)]
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert len(set(got)) == len(got)
  assert all(0 <= x < 10**10 for x in got)
  assert got[:3] == [grain_index_shuffle(index=i, max_index=10**10 - 1, seed=3, rounds=4) for i in range(3)]
  # A materialised permutation would be 80 GB; we allow 8 MB for buffers.
  assert peak < 8 << 20, peak
  # Random access far into the dataset, and the state stays tiny.
  assert 0 <= ds[10**10 - 1] < 10**10
  assert it.get_state()["next_index"] == 20_000
