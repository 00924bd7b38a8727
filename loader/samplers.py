"""Samplers: which record the legacy `DataLoader` reads at each step (Grain's `grain.samplers`).

A sampler maps a global index (epochs included) to a `RecordMetadata` naming
the record key. `IndexSampler` reproduces Grain's: it shards the record keys
into contiguous pieces, shuffles each epoch with a new permutation (Grain's
order), and seeds each record's generator exactly as Grain
does (`Philox(key=seed + index)`), so random transformations produce the same
values for the same index. Its `repr` equals Grain's, which matters because
DataLoader checkpoints embed it.
"""

from __future__ import annotations

import sys
from typing import Protocol

import numpy as np

from loader import checks
from loader import map_dataset
from loader import record
from loader import sharding


class Sampler(Protocol):
  """Interface of a sampler: global index -> RecordMetadata (IndexError past the end)."""

  def __getitem__(self, index: int) -> record.RecordMetadata:
    ...


def record_rng(seed: int, index: int) -> np.random.Generator:
  """The generator Grain's samplers attach to the record at `index`."""
  return np.random.Generator(np.random.Philox(key=seed + index))


def _check_num_records(num_records) -> int:
  if not checks.is_int(num_records) or num_records <= 0:
    raise checks.int_error(num_records)(f"A sampler needs num_records > 0 (got {num_records=!r}).")
  return int(num_records)


def _check_python_int_seed(seed: object) -> None:
  """Refuses an `IndexSampler` seed that is not a Python int, as Grain 0.2.18 does.

  Grain's `IndexSampler` raises this TypeError ("Expected seed of int type")
  for a numpy or JAX integer (`rng.integers(0, sys.maxsize)`, `np.int64(5)`)
  when it shuffles, and fails on `seed.bit_length()` when it does not (an
  AttributeError there; the same TypeError here). Taking such seeds would run
  code that fails on Grain, and would refuse one past 2**32 with a ValueError
  where Grain's TypeError is what clients catch; so this is a plain TypeError,
  not loader's `SeedTypeError` (also a ValueError).
  """
  if seed is not None and not isinstance(seed, int):
    raise TypeError(f"Expected seed of int type. Got seed with type {type(seed)}")


class SequentialSampler:
  """Records in order, once. Sharding is left to the `DataLoader`."""

  def __init__(self, num_records: int, shard_options: sharding.ShardOptions = sharding.NoSharding(),
               seed: int | None = None):
    self._num_records = _check_num_records(num_records)
    self._shard_options = shard_options
    if shard_options.drop_remainder:
      self._max_index = self._num_records // shard_options.shard_count * shard_options.shard_count
    else:
      self._max_index = self._num_records
    self._seed = None if seed is None else checks.check_seed(seed, "SequentialSampler")

  def __len__(self) -> int:
    return self._max_index

  def __repr__(self) -> str:
    return f"SequentialSampler(num_records={self._num_records}, shard_options={self._shard_options!r})"

  def __getitem__(self, index: int) -> record.RecordMetadata:
    if not 0 <= index < self._max_index:
      raise IndexError(f"Sampler index {index} out of range [0, {self._max_index}).")
    rng = None if self._seed is None else record_rng(self._seed, index)
    return record.RecordMetadata(index=index, record_key=index, rng=rng)

  def _keys_of(self, indices: np.ndarray) -> np.ndarray:
    return indices

  @property
  def _rng_seed(self) -> int | None:
    return self._seed


class IndexSampler:
  """Shards, shuffles and repeats the record keys of one data source.

  Args:
    num_records: Records in the data source.
    shard_options: Contiguous shard of the record keys this sampler covers.
      Pass the same options to the `DataLoader`.
    shuffle: Shuffle globally (within the shard), with a new order each epoch.
    num_epochs: Epochs to produce; None repeats forever.
    seed: Seed in [0, 2**32-1] for shuffling and for the per-record generators
      of random transformations. Required when `shuffle` is True. A Python
      int: a numpy integer is refused with Grain's TypeError.
  """

  def __init__(self, num_records: int, shard_options: sharding.ShardOptions = sharding.NoSharding(),
               shuffle: bool = False, num_epochs: int | None = None, seed: int | None = None):
    self._num_records = _check_num_records(num_records)
    # The repr shows the arguments as given, as Grain's (num_epochs=2.0, seed=True).
    self._repr_args = (num_epochs, seed)
    if num_epochs is not None:
      if isinstance(num_epochs, float) and num_epochs.is_integer():
        num_epochs = int(num_epochs)  # Grain only multiplies and compares it.
      num_epochs = checks.check_int(num_epochs, "num_epochs", minimum=1)
    if shuffle and seed is None:
      raise ValueError("Shuffling requires specifying a seed. IndexSampler(shuffle=True) needs a seed, e.g. "
                       "IndexSampler(..., shuffle=True, seed=0).")
    _check_python_int_seed(seed)
    # Grain takes a bool seed as the int it is (its Philox key is seed + index).
    self._seed = None if seed is None else checks.check_seed(int(seed) if isinstance(seed, bool) else seed,
                                                             "IndexSampler")
    self._shard_options = shard_options
    self._shuffle = bool(shuffle)
    self._num_epochs = num_epochs
    self._max_index = None if num_epochs is None else num_epochs * self._num_records
    keys = map_dataset.MapDataset.range(self._num_records)
    self._keys_per_epoch = self._num_records
    if shard_options.shard_count > 1:
      start, end = sharding.even_split(self._num_records, shard_options)
      keys = keys.slice(slice(start, end))
      self._keys_per_epoch = end - start
      if self._max_index is not None and shard_options.drop_remainder:
        self._max_index = min(self._max_index, self._keys_per_epoch * shard_options.shard_count * num_epochs)
    if self._shuffle:
      keys = keys.shuffle(seed=self._seed)
    # Index i of `keys` past its length is epoch i // len: MapDataset nodes
    # read later epochs (reshuffled) for such indices, as Grain's do. Grain's
    # names: subclasses may replace `_record_keys` (a MapDataset of record
    # keys by sampler position) and change `_max_index`.
    self._record_keys = keys

  def __len__(self) -> int:
    return sys.maxsize if self._max_index is None else self._max_index

  def __repr__(self) -> str:
    return (f"IndexSampler(num_records={self._num_records}, shard_options={self._shard_options!r}, "
            f"shuffle={self._shuffle}, num_epochs={self._repr_args[0]}, seed={self._repr_args[1]})")

  def _repr_before_given_args(self) -> str:
    """The repr as DataLoader states saved before it showed the arguments as given named this sampler
    (seed=1 for seed=True): such a state still restores."""
    return (f"IndexSampler(num_records={self._num_records}, shard_options={self._shard_options!r}, "
            f"shuffle={self._shuffle}, num_epochs={self._num_epochs}, seed={self._seed})")

  def __getitem__(self, index: int) -> record.RecordMetadata:
    if index < 0 or (self._max_index is not None and index >= self._max_index):
      raise IndexError(f"Sampler index {index} out of range [0, {self._max_index}).")
    key = int(self._keys_of(np.array([index], dtype=np.int64))[0])
    rng = None if self._seed is None else record_rng(self._seed, index)
    return record.RecordMetadata(index=index, record_key=key, rng=rng)

  def _keys_of(self, indices: np.ndarray) -> np.ndarray:
    """Record keys of global sampler indices `indices`, in one batched call."""
    positions = indices // self._shard_options.shard_count
    keys = self._record_keys
    if isinstance(keys, map_dataset.MapDataset):
      return np.asarray(keys._getitems(positions), dtype=np.int64)  # pylint: disable=protected-access
    # A subclass may set any sequence (an array of keys): indexed as Grain does.
    return np.asarray([keys[p] for p in positions.tolist()], dtype=np.int64)

  @property
  def _rng_seed(self) -> int | None:
    return self._seed
