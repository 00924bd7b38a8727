"""`Record` and `RecordMetadata`: an element and where it came from, as in Grain.

The legacy `DataLoader` wraps every element in a `Record` while it flows
through the operations: the metadata carries the sampler index (which seeds
`RandomMap`'s generator) and the record key read from the data source. Users
only see the `data` of the final records, unless they write a legacy
`Operation`, which receives and yields records.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class RecordMetadata:
  """Where a record comes from.

  Attributes:
    index: Global sampler index (epochs included), unique per record.
    record_key: Index of the record in the data source; None once the record
      is no longer one source record (after a batch or legacy operation).
    rng: Generator for random transformations, seeded from the sampler seed
      and `index`; None when the sampler has no seed.
  """

  index: int
  record_key: int | None = None
  rng: np.random.Generator | None = None

  def remove_record_key(self) -> RecordMetadata:
    """This metadata without `record_key` (self if it has none)."""
    if self.record_key is None:
      return self
    return dataclasses.replace(self, record_key=None)

  def __str__(self) -> str:
    return f"RecordMetadata(index={self.index}, record_key={self.record_key}, rng={self.rng})"


@dataclasses.dataclass(slots=True)
class Record(Generic[T]):
  """An element (`data`) with its `metadata`."""

  metadata: RecordMetadata
  data: T
