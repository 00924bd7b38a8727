"""Transformation base classes, as Grain's `grain.transforms`.

Subclass these (or Grain's own classes, or just define the method: transforms
are resolved by duck typing, see `loader.checks.resolve_fn`) and pass
instances to `MapDataset.map/random_map/filter/...` or to `DataLoader`'s
`operations=[...]`. Implementations must be thread-safe and picklable: they run
in reader threads and worker processes.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Union

import numpy as np

from loader import checks


class Map(abc.ABC):
  """A 1:1 transformation of elements."""

  @abc.abstractmethod
  def map(self, element):
    """Maps a single element."""


class RandomMap(abc.ABC):
  """A random 1:1 transformation; `rng` depends only on the seed and the index."""

  @abc.abstractmethod
  def random_map(self, element, rng: np.random.Generator):
    """Maps a single element with a per-element generator."""


class TfRandomMap(abc.ABC):
  """Grain's TF-flavoured random map; here it receives a numpy generator too."""

  @abc.abstractmethod
  def np_random_map(self, element, rng: np.random.Generator):
    """Maps a single element with a per-element generator."""


class MapWithIndex(abc.ABC):
  """A 1:1 transformation of (index, element)."""

  @abc.abstractmethod
  def map_with_index(self, index: int, element):
    """Maps a single element given its index."""


class Filter(abc.ABC):
  """Keeps the elements for which `filter` returns True."""

  @abc.abstractmethod
  def filter(self, element) -> bool:
    """True to keep `element`."""


class FlatMap(abc.ABC):
  """Splits each element into up to `max_fan_out` elements.

  Attributes:
    max_fan_out: Upper bound on the number of elements one element yields.
  """

  max_fan_out: int

  @abc.abstractmethod
  def flat_map(self, element) -> Sequence[Any]:
    """The elements `element` splits into."""


@dataclasses.dataclass(frozen=True)
class Batch:
  """Groups consecutive elements into batches (a `DataLoader` operation).

  Attributes:
    batch_size: Elements per batch.
    drop_remainder: Drop a last batch smaller than `batch_size`.
    batch_fn: Builds a batch from a list of elements; default
      `loader.batching.make_batch` (numeric and str leaves stacked, bytes
      leaves in numpy object arrays).
  """

  batch_size: int
  drop_remainder: bool = False
  batch_fn: Callable[[Sequence[Any]], Any] | None = None

  def __post_init__(self):
    object.__setattr__(self, "batch_size", checks.check_int(self.batch_size, "batch_size", minimum=1))


class DatasetSelectionMap(abc.ABC):
  """Routes a global index to (dataset index, index within that dataset).

  Used to mix or concatenate datasets deterministically; must be stateless and
  picklable since workers call it concurrently.
  """

  @abc.abstractmethod
  def __len__(self) -> int:
    """Number of addressable elements over all constituent datasets."""

  @abc.abstractmethod
  def __getitem__(self, index: int) -> tuple[int, int]:
    """(constituent dataset index, index within it) for global `index`."""


Transformation = Union[Batch, Map, RandomMap, TfRandomMap, Filter, FlatMap, MapWithIndex]
Transformations = Sequence[Transformation]

# Names of Grain's legacy `grain.python` namespace.
MapTransform = Map
RandomMapTransform = RandomMap
FilterTransform = Filter
FlatMapTransform = FlatMap
MapWithIndexTransform = MapWithIndex

__all__ = [
    "Batch",
    "DatasetSelectionMap",
    "Filter",
    "FilterTransform",
    "FlatMap",
    "FlatMapTransform",
    "Map",
    "MapTransform",
    "MapWithIndex",
    "MapWithIndexTransform",
    "RandomMap",
    "RandomMapTransform",
    "TfRandomMap",
    "Transformation",
    "Transformations",
]
