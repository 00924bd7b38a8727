"""Grain's index shuffle, evaluated for whole arrays of positions.

`index_shuffle(i, max_index, seed, rounds)` returns what Grain's C++
`grain.experimental.index_shuffle` returns, so `MapDataset.shuffle`,
`WindowShuffle*` and `IndexSampler` visit records in Grain's exact order.
The construction (Grain's, which follows TensorFlow's random_index_shuffle): a
Simon-style Feistel cipher on blocks of `B` bits, `B` the smallest even
number >= max(16, ceil(log2(max_index))), round keys from C++'s
`std::seed_seq{seed}`, and cycle walking (re-encrypting until the value is
<= max_index). Nothing of size `max_index` is ever materialised, so shuffling
10**10 records costs as little memory as shuffling ten.

Ours is vectorised with numpy over uint32 halves: a 64k-position chunk takes a
few milliseconds. Small domains (16-bit blocks, up to 65,537 positions), where
walks are long, are solved once per seed over the whole block by pointer
doubling and cached.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from loader import checks

_M32 = 0xFFFFFFFF
_MIN_BLOCK_BITS = 16
DEFAULT_ROUNDS = 4
_WALK_BUDGET = 2048  # Cipher rounds one `index_shuffle` call walks before it builds a 16-bit block's table.


def seed_seq_generate(seed: int, n: int) -> list[int]:
  """`std::seed_seq{seed}.generate(out, out + n)` of C++ (its algorithm is fixed by the standard)."""
  v = [seed & _M32]
  s = len(v)
  b = [0x8B8B8B8B] * n
  if n == 0:
    return b
  t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
  p = (n - t) // 2
  q = p + t
  m = max(s + 1, n)
  mix = lambda x: x ^ (x >> 27)
  for k in range(m):
    r1 = (1664525 * mix(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n])) & _M32
    r2 = (r1 + (s if k == 0 else (k % n + (v[k - 1] if k <= s else 0)))) & _M32
    b[(k + p) % n] = (b[(k + p) % n] + r1) & _M32
    b[(k + q) % n] = (b[(k + q) % n] + r2) & _M32
    b[k % n] = r2
  for k in range(m, m + n):
    r3 = (1566083941 * mix((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & _M32)) & _M32
    r4 = (r3 - k % n) & _M32
    b[(k + p) % n] ^= r3
    b[(k + q) % n] ^= r4
    b[k % n] = r4
  return b


def block_bits(max_index: int) -> int:
  """Grain's block size in bits for positions in [0, max_index] (the C++ computes it in double)."""
  bits = math.ceil(math.log2(float(max_index)))
  return max(bits + bits % 2, _MIN_BLOCK_BITS)


def check_rounds(rounds: int) -> int:
  if not isinstance(rounds, (int, np.integer)) or isinstance(rounds, bool) or not (
      4 <= rounds <= 1024 and rounds % 2 == 0):
    raise ValueError(f"rounds must be an even integer between 4 and 1024, but got rounds = {rounds!r}")
  return int(rounds)


class _Cipher:
  """Grain's Simon-style block cipher on `2 * word` bits, for uint64 arrays."""

  def __init__(self, word: int, seed: int, rounds: int):
    self.word = word
    self._mask = np.uint32((1 << word) - 1)
    # A round key is XORed into a `word`-bit half: only its low bits count.
    self._keys = [np.uint32(k & ((1 << word) - 1)) for k in seed_seq_generate(seed, rounds)]
    self._int_keys = [int(k) for k in self._keys]
    self._shifts = {r: (np.uint32(r), np.uint32(word - r)) for r in (1, 2, 8)}

  def _rotl(self, x: np.ndarray, r: int) -> np.ndarray:
    left, right = self._shifts[r]
    out = np.left_shift(x, left)
    out |= x >> right
    if self.word < 32:
      out &= self._mask
    return out

  def _f(self, x: np.ndarray) -> np.ndarray:
    out = self._rotl(x, 1)
    out &= self._rotl(x, 8)
    out ^= self._rotl(x, 2)
    return out

  def encrypt(self, value: np.ndarray) -> np.ndarray:
    """Encrypts uint64 `value` (its bits above the block are dropped, as the C++ bitsets do)."""
    w = np.uint64(self.word)
    left = (value >> w).astype(np.uint32) & self._mask
    right = value.astype(np.uint32) & self._mask
    keys = self._keys
    for i in range(0, len(keys), 2):
      left ^= self._f(right)
      left ^= keys[i]
      right ^= self._f(left)
      right ^= keys[i + 1]
    out = left.astype(np.uint64) << w
    out |= right
    return out

  def walk_one(self, value: int, max_index: int, max_steps: int | None = None) -> int | None:
    """`encrypt` of one position with cycle walking, in Python ints; None after `max_steps` steps.

    For a single `index_shuffle` call numpy's per-operation cost dominates
    (~0.3 ms a call, dozens of times Grain's C++); plain ints take a few microseconds.
    """
    word, mask = self.word, int(self._mask)
    keys = self._int_keys
    rotl = lambda x, r: ((x << r) | (x >> (word - r))) & mask
    steps = 0
    while max_steps is None or steps < max_steps:
      steps += 1
      left, right = (value >> word) & mask, value & mask
      for i in range(0, len(keys), 2):
        left ^= (rotl(right, 1) & rotl(right, 8)) ^ rotl(right, 2) ^ keys[i]
        right ^= (rotl(left, 1) & rotl(left, 8)) ^ rotl(left, 2) ^ keys[i + 1]
      value = (left << word) | right
      if value <= max_index:
        return value
    return None


@functools.lru_cache(maxsize=16)
def _small_table(seed: int, rounds: int, max_index: int) -> np.ndarray:
  """Shuffled position of every position in [0, max_index], for 16-bit blocks.

  A walk can be long here (for 10 positions, ~6,500 steps on average), so walk
  the whole block at once by pointer doubling: jump[y] is reached from y in
  one or more steps through values all above max_index; doubling the jumps
  until they land inside takes at most 17 rounds over 65,536 entries.
  """
  cipher = _Cipher(_MIN_BLOCK_BITS // 2, seed, rounds)
  jump = cipher.encrypt(np.arange(1 << _MIN_BLOCK_BITS, dtype=np.uint64)).astype(np.int64)
  outside = np.flatnonzero(jump > max_index)
  # After k rounds an unresolved jump spans >= 2**k steps, so 17 rounds cover
  # any cycle; what is still outside then lies on cycles that never come
  # inside, which no position in [0, max_index] reaches.
  for _ in range(_MIN_BLOCK_BITS + 1):
    if not outside.size:
      break
    jump[outside] = jump[jump[outside]]
    outside = outside[jump[outside] > max_index]
  # max_index = 65536 does not fit the block: the C++ encrypts its low 16 bits.
  return jump[np.arange(max_index + 1) & 0xFFFF]


def shuffle_positions(positions: np.ndarray, max_index: int, seed: int, rounds: int = DEFAULT_ROUNDS, *,
                      bijective: bool = True) -> np.ndarray:
  """`index_shuffle(p, max_index, seed, rounds)` of every p in `positions` (int64, all in [0, max_index]).

  With `bijective` (for shuffling datasets), one case where Grain's is not a
  permutation is repaired: when `max_index` is 2**B for Grain's block of B bits
  (a dataset of 65,537, 262,145, ... records), the block cannot hold
  `max_index`, so Grain maps it where it maps 0 (one record twice per epoch,
  the last never). Positions below it are a bijection onto [0, max_index)
  there, so `max_index` maps to itself and every other position stays Grain's.
  """
  pos = np.asarray(positions, dtype=np.int64)
  if max_index == 0:
    return np.zeros_like(pos)
  seed &= _M32
  bits = block_bits(max_index)
  if bijective and max_index == 1 << bits:
    out = shuffle_positions(pos, max_index, seed, rounds, bijective=False)
    out[pos == max_index] = max_index
    return out
  if bits == _MIN_BLOCK_BITS:
    return _small_table(seed, rounds, int(max_index))[pos]
  cipher = _cipher(bits // 2, seed, rounds)
  limit = np.uint64(max_index)
  out = cipher.encrypt(pos.astype(np.uint64))
  outside = np.flatnonzero(out > limit)
  while outside.size:  # Cycle walking; at least 1/4 of the block is inside.
    walked = cipher.encrypt(out[outside])
    out[outside] = walked
    outside = outside[walked > limit]
  return out.astype(np.int64)


@functools.lru_cache(maxsize=64)
def _cipher(word: int, seed: int, rounds: int) -> _Cipher:
  return _Cipher(word, seed, rounds)


class IndexShuffleArgumentError(TypeError, ValueError):
  """An `index_shuffle` argument outside its C type: a TypeError as Grain's binding raises, and a ValueError."""


# Grain's C++ binding: int64 positions, uint32 seed and rounds.
_INDEX_SHUFFLE_RANGES = {"index": (-2**63, 2**63), "max_index": (-2**63, 2**63), "seed": (0, 2**32),
                         "rounds": (0, 2**32)}


def index_shuffle(index: int, max_index: int, seed: int, rounds: int) -> int:
  """Grain's `grain.experimental.index_shuffle`: position `index` of a seeded permutation of [0, max_index]."""
  for name, value in (("index", index), ("max_index", max_index), ("seed", seed), ("rounds", rounds)):
    low, high = _INDEX_SHUFFLE_RANGES[name]
    # bool is an int here: Grain's binding takes True as 1.
    if not isinstance(value, (int, np.integer)) or not low <= value < high:
      raise IndexShuffleArgumentError(
          f"index_shuffle: {name} must be an integer in [{low}, {high}) (got {name}={value!r}).")
  rounds = check_rounds(int(rounds))
  seed = checks.check_seed(int(seed), "index_shuffle")
  index, max_index = int(index), int(max_index)
  if not 0 <= index <= max_index:
    raise ValueError(f"index must be in [0, max_index], but got index = {index} and max_index = {max_index}")
  if max_index == 0:
    return 0
  bits = block_bits(max_index)
  cipher = _cipher(bits // 2, seed & _M32, rounds)
  if bits > _MIN_BLOCK_BITS:  # At least 1/4 of the block is inside: walks are short.
    return cipher.walk_one(index, max_index)
  # A small domain in a 16-bit block: a walk averages 2**16 / (max_index + 1)
  # steps. Short ones are walked; a long one builds (and caches) the table of
  # the whole block for this seed, ~40 ms, which later calls share.
  key = (seed & _M32, rounds, max_index)
  if key in _TABLED:  # This seed's table was wanted before: walks here are long.
    return int(_small_table(*key)[index])
  shuffled = cipher.walk_one(index, max_index, max_steps=max(8, _WALK_BUDGET // rounds))
  if shuffled is None:
    with _TABLED_LOCK:  # Callers may be threads (a sampler under a thread pool).
      _TABLED[key] = None
      while len(_TABLED) > 16:  # As many as _small_table caches.
        del _TABLED[next(iter(_TABLED))]
    shuffled = int(_small_table(*key)[index])
  return shuffled


_TABLED: dict[tuple[int, int, int], None] = {}  # Keys of the tables index_shuffle built, oldest first.
_TABLED_LOCK = threading.Lock()


class IndexPermutation:
  """Grain's shuffle of `[0, size)` for one seed, evaluated for arrays of positions.

  Attributes:
    size: Number of positions permuted.
  """

  def __init__(self, size: int, seed: int):
    if not 0 <= size <= 2**63:
      raise ValueError(f"size must be in [0, 2**63] (got {size=}).")
    self.size = int(size)
    self.seed = int(seed) & _M32

  def __call__(self, positions: np.ndarray) -> np.ndarray:
    """Returns the shuffled position of each of `positions` (as int64)."""
    pos = np.asarray(positions)
    if self.size <= 1:
      return pos.astype(np.int64, copy=True)
    return shuffle_positions(pos, self.size - 1, self.seed)

  def __getitem__(self, position: int) -> int:
    if not 0 <= position < self.size:
      raise IndexError(f"Position {position} out of range for a permutation of size {self.size}.")
    return int(self(np.array([position], dtype=np.int64))[0])
