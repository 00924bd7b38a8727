"""`ZipMapDataset` / `ZipIterDataset`: tuples of the elements of several datasets (Grain's).

`ZipMapDataset` needs inputs of equal length and reads each with one batched
call per chunk (random access, runs in `mp_prefetch` workers). As in Grain, a
filtered-out element appears as None inside its tuple; the tuple itself is
never None.

`ZipIterDataset` holds no elements between calls; its state is Grain's
`{"parents": [state, ...]}`. With `strict=True` (default) inputs of unequal
length raise ValueError at the end, worded like Python's `zip(strict=True)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from loader import element_spec
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import state as state_lib

T = TypeVar("T")


class ZipMapDataset(map_lib.MapDataset[tuple]):
  """Element `i` is `(parents[0][i], parents[1][i], ...)`.

  Args:
    parents: MapDatasets of the same length.
  """

  _same_as_grain = True

  @property
  def _element_spec(self) -> Any:
    return tuple(element_spec.get_element_spec(p) for p in self._parents)

  def __init__(self, parents: Sequence[map_lib.MapDataset]):
    parents = tuple(parents)
    if not parents:
      raise ValueError("ZipMapDataset needs at least one parent.")
    for i, p in enumerate(parents):
      if not isinstance(p, map_lib.MapDataset):
        raise TypeError(f"ZipMapDataset: parents[{i}] is a {type(p).__name__}, not a MapDataset; "
                        "use ZipIterDataset for IterDatasets.")
    lengths = [len(p) for p in parents]
    if any(n != lengths[0] for n in lengths):
      raise ValueError(f"All parents of ZipMapDataset must have the same length (got lengths {lengths}).")
    super().__init__(parents)
    self._len = lengths[0]

  def __len__(self) -> int:
    return self._len

  def _op_repr(self) -> str:
    return ".zip()"

  def __repr__(self) -> str:
    return f"MapDataset[{', '.join(repr(p) for p in self._parents)}]{self._op_repr()}"

  @property
  def _records_per_element(self) -> int:
    return sum(p._records_per_element for p in self._parents)  # pylint: disable=protected-access

  @property
  def _may_contain_none(self) -> bool:
    # A tuple is an element even when it holds a None; but as in Grain, a
    # MapDataset.batch may not follow a filtered part (its holes would batch).
    return any(p._may_contain_none for p in self._parents)  # pylint: disable=protected-access

  def _getitems(self, indices: np.ndarray) -> list[tuple]:
    columns = [p._getitems(indices) for p in self._parents]  # pylint: disable=protected-access
    return list(zip(*columns))


class ZipIterDataset(iter_lib.IterDataset[tuple]):
  """Yields `(next(it_0), next(it_1), ...)` until an input is exhausted.

  Args:
    parents: IterDatasets (MapDatasets are iterated in order).
    strict: If True, inputs of different lengths raise ValueError at the end.
  """

  _same_as_grain = True

  @property
  def _element_spec(self) -> Any:
    return tuple(element_spec.get_element_spec(p) for p in self._parents)

  def __init__(self, parents: Sequence[iter_lib.IterDataset], *, strict: bool = True):
    parents = tuple(parents)
    if not parents:
      raise ValueError("ZipIterDataset needs at least one parent.")
    for i, p in enumerate(parents):
      if not isinstance(p, (iter_lib.IterDataset, map_lib.MapDataset)):
        raise TypeError(f"ZipIterDataset: parents[{i}] is a {type(p).__name__}, not an IterDataset.")
    super().__init__(tuple(p.to_iter_dataset() if isinstance(p, map_lib.MapDataset) else p for p in parents))
    self._strict = bool(strict)

  def _op_repr(self) -> str:
    return f".zip(strict={self._strict})"

  def __repr__(self) -> str:
    return f"IterDataset[{', '.join(repr(p) for p in self._parents)}]{self._op_repr()}"

  def __iter__(self) -> iter_lib.DatasetIterator[tuple]:
    return _ZipDatasetIterator([iter(p) for p in self._parents], strict=self._strict)


def _strict_zip_error(i: int, why: str) -> str:
  # Python's own wording for zip(strict=True).
  plural = " " if i == 1 else "s 1-"
  return f"ZipIterDataset argument {i + 1} is {why} than argument{plural}{i}"


class _ZipDatasetIterator(iter_lib.DatasetIterator[tuple]):

  _grain_state_keys = ("parents",)  # Grain's layout: its states restore here.

  def __init__(self, parents: list[iter_lib.DatasetIterator], *, strict: bool):
    super().__init__(parents)
    self._strict = strict

  def __next__(self) -> tuple:
    parents = self._parents
    items = []
    for i, it in enumerate(parents):
      try:
        items.append(next(it))
      except StopIteration as stop:
        if self._strict:
          if i > 0:
            raise ValueError(_strict_zip_error(i, "shorter")) from stop
          for j in range(1, len(parents)):
            try:
              next(parents[j])
            except StopIteration:
              continue
            raise ValueError(_strict_zip_error(j, "longer")) from stop
        raise
      except Exception:
        # The failing tuple is consumed, as an element is in Grain: the later
        # inputs skip their element too, so the next tuple stays aligned.
        for later in parents[i + 1:]:
          try:
            next(later)
          except Exception:  # pylint: disable=broad-except  # Its own error or end shows on the next call.
            pass
        raise
    return tuple(items)

  def get_state(self) -> dict[str, Any]:
    # strip: a state taken in a prefetch thread carries its own description.
    return {"parents": [state_lib.strip(p.get_state()) for p in self._parents]}

  def set_state(self, state: dict[str, Any]) -> None:
    owner = type(self).__name__
    state_lib.check_keys(state, ("parents",), owner)
    saved = state["parents"]
    if not isinstance(saved, list) or len(saved) != len(self._parents):
      raise state_lib.StateMismatchError(
          f"{owner}.set_state: expected states of {len(self._parents)} inputs (got {saved!r:.200}).")
    for p, s in zip(self._parents, saved):
      p.set_state(s)
