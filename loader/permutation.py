"""Stateless pseudo-random permutations of `range(n)` for global shuffling.

`IndexPermutation(n, seed, epoch)` maps positions to shuffled positions without
ever materialising an array of `n` indices: memory is O(1) in `n`, so a
10**10-record dataset shuffles as cheaply as a small one.

Construction: a Feistel network on the mixed-radix domain `Z_a x Z_b` with
`a = ceil(sqrt(n))`, `b = ceil(n / a)` (so `a * b` exceeds `n` by less than
`a`), alternating the modulus each round, as in the FFX/FF1 format-preserving
ciphers. Each round is invertible whatever the round function, so the network
is a bijection on `[0, a*b)`; values landing in `[n, a*b)` are re-encrypted
until they fall inside `[0, n)` (cycle walking), which keeps it a bijection on
`[0, n)`. A power-of-two Feistel would overshoot `n` by up to 4x and walk
several times per chunk; here walks are rare. Everything is vectorised over
numpy uint64, so a chunk of indices costs a few dozen array operations.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_M64 = (1 << 64) - 1
_ROUNDS = 6  # Even, so the halves end in (Z_a, Z_b); 4 already gives a PRP.
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S31 = np.uint64(31)
_S29 = np.uint64(29)


def splitmix64(x: int) -> int:
  """SplitMix64 finaliser of a 64-bit integer (a cheap, well-mixed hash)."""
  x = (x + 0x9E3779B97F4A7C15) & _M64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
  return x ^ (x >> 31)


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
  # Hashing (seed, epoch) jointly, not seed + epoch as Grain does, keeps
  # (seed=0, epoch=1) and (seed=1, epoch=0) from sharing a permutation.
  state = splitmix64(splitmix64(seed & _M64) ^ (epoch & _M64))
  keys = []
  for _ in range(_ROUNDS):
    state = splitmix64(state)
    keys.append(state)
  return tuple(keys)


def _reduce(x: np.ndarray, modulus: np.uint64, tmp: np.ndarray) -> None:
  """x %= modulus, in place (`tmp` is scratch space of x's shape)."""
  np.floor_divide(x, modulus, out=tmp)
  tmp *= modulus
  x -= tmp


class IndexPermutation:
  """A seeded bijection on `[0, size)`, evaluated for arrays of positions.

  Attributes:
    size: Number of positions permuted.
  """

  def __init__(self, size: int, seed: int, epoch: int = 0):
    if not 0 <= size <= 2**63:
      raise ValueError(f"size must be in [0, 2**63] (got {size=}).")
    self.size = int(size)
    a = math.isqrt(self.size - 1) + 1 if self.size > 1 else 1
    self._a = np.uint64(a)
    self._b = np.uint64(-(-self.size // a) if self.size else 1)
    self._keys = [np.uint64(k) for k in _round_keys(int(seed), int(epoch))]

  def _encrypt(self, x: np.ndarray) -> np.ndarray:
    # `a - (a // m) * m` instead of `a % m`: numpy divides by a scalar with
    # libdivide for `//` but not for `%`, which makes a chunk's permutation
    # ~2x faster with the same results. In place, to spare temporaries.
    b = self._b
    left = x // b  # In Z_a.
    right = x - left * b  # In Z_b.
    moduli = (self._a, b)
    f = np.empty_like(left)
    tmp = np.empty_like(left)
    for i, key in enumerate(self._keys):
      # Round function: a splitmix-style mixer of (right + key).
      np.add(right, key, out=f)
      f *= _MUL1
      np.right_shift(f, _S31, out=tmp)
      f ^= tmp
      f *= _MUL2
      np.right_shift(f, _S29, out=tmp)
      f ^= tmp
      modulus = moduli[i % 2]
      _reduce(f, modulus, tmp)
      left += f  # Both below the modulus: no overflow.
      _reduce(left, modulus, tmp)
      left, right = right, left
    left *= b
    left += right
    return left

  def __call__(self, positions: np.ndarray) -> np.ndarray:
    """Returns the shuffled position of each of `positions` (as int64)."""
    pos = np.asarray(positions)
    if self.size <= 1:
      return pos.astype(np.int64, copy=True)
    with np.errstate(over="ignore"):  # uint64 arithmetic is meant to wrap.
      out = self._encrypt(pos.astype(np.uint64))
      limit = np.uint64(self.size)
      outside = np.flatnonzero(out >= limit)
      while outside.size:
        walked = self._encrypt(out[outside])
        out[outside] = walked
        outside = outside[walked >= limit]
    return out.astype(np.int64)

  def __getitem__(self, position: int) -> int:
    if not 0 <= position < self.size:
      raise IndexError(f"Position {position} out of range for a permutation of size {self.size}.")
    return int(self(np.array([position], dtype=np.int64))[0])
