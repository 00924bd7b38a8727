"""Which part of the data each process reads: Grain's `grain.sharding` names.

`ShardOptions` is a frozen dataclass with Grain's fields, so its `repr` (which
Grain's `DataLoader` checkpoints embed through the sampler's repr) is
identical to Grain's.
"""

from __future__ import annotations

import dataclasses
import logging

from loader import checks

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ShardOptions:
  """How to split the data over processes (usually one per host).

  Attributes:
    shard_index: This process's shard, in [0, shard_count).
    shard_count: Number of shards.
    drop_remainder: If True every shard gets the same number of records and
      the remainder is dropped; if False the first `n % shard_count` shards
      get one record more.
  """

  shard_index: int
  shard_count: int
  drop_remainder: bool = False

  def __post_init__(self):
    count = checks.check_int(self.shard_count, "shard_count", minimum=1)
    index = checks.check_int(self.shard_index, "shard_index", minimum=0, maximum=count - 1)
    # Plain ints, so the repr (part of checkpoint fingerprints) reads as Grain's.
    object.__setattr__(self, "shard_count", count)
    object.__setattr__(self, "shard_index", index)
    object.__setattr__(self, "drop_remainder", bool(self.drop_remainder))


class NoSharding(ShardOptions):
  """Every process reads all the data."""

  def __init__(self):
    super().__init__(shard_index=0, shard_count=1, drop_remainder=False)


class ShardByJaxProcess(ShardOptions):
  """One shard per JAX process (`jax.process_index()` of `jax.process_count()`).

  Without JAX installed this is a single shard, as in Grain.
  """

  def __init__(self, drop_remainder: bool = False):
    index, count = get_process_index_and_count()
    super().__init__(shard_index=index, shard_count=count, drop_remainder=drop_remainder)


def even_split(num_examples: int, options: ShardOptions) -> tuple[int, int]:
  """[start, end) of shard `options.shard_index` of `num_examples` records.

  Shards are contiguous. Without `drop_remainder` the first
  `num_examples % shard_count` shards hold one record more; with it every
  shard holds `num_examples // shard_count` and the rest is dropped.
  """
  per_shard = num_examples // options.shard_count
  start = per_shard * options.shard_index
  end = start + per_shard
  remainder = num_examples % options.shard_count
  if remainder:
    if options.drop_remainder:
      _log.info("Dropping %d of %d records to give %d equal shards.", remainder, num_examples,
                options.shard_count)
    else:
      start += min(options.shard_index, remainder)
      end += min(options.shard_index + 1, remainder)
  return start, end


def get_process_index_and_count() -> tuple[int, int]:
  """(jax.process_index(), jax.process_count()), or (0, 1) without JAX."""
  try:
    # Lazy: `import loader` must not import JAX; only sharding by JAX process
    # and per-process checkpoint file names need it.
    import jax  # pylint: disable=g-import-not-at-top
  except ImportError:
    return 0, 1
  return jax.process_index(), jax.process_count()
