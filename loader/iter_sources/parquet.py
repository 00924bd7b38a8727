"""`ParquetIterDataset`: rows of Parquet files as dicts of numpy values (Grain's).

Rows come row group by row group; each row is `{column: value}` with the
values numpy gives for the column (`pyarrow` `to_numpy()`). Several files are
interleaved with at most 16 open at once, as in Grain. State of one file is
Grain's: `{"row_group": g, "index_within_row_group": i}`. pyarrow is imported
when a file is opened (`pip install arrayrecord-toolkit[parquet]`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from loader import checks
from loader import iter_dataset as iter_lib
from loader import state as state_lib

_CYCLE_LENGTH = 16  # Files read at once, as in Grain.


class ParquetIterDataset(iter_lib.IterDataset):
  """Rows of one or more Parquet files.

  Args:
    path: A path or a sequence of paths. Several are interleaved, at most 16
      read at a time.
    **read_kwargs: Passed to `pyarrow.parquet.ParquetFile`.
  """

  _same_as_grain = True

  def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], **read_kwargs: Any):
    super().__init__()
    if isinstance(path, (str, bytes, os.PathLike)):
      self._paths = [path]
    else:
      self._paths = list(path)
    self._read_kwargs = read_kwargs

  def _op_repr(self) -> str:
    return f"ParquetIterDataset({[os.fspath(p) for p in self._paths]!r})"

  def __repr__(self) -> str:
    return self._op_repr()

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Keeps only the files `paths[sl]` (Grain's hook for sharding by file)."""
    del sequential_slice
    self._paths = self._paths[sl]

  def __iter__(self) -> iter_lib.DatasetIterator[dict[str, Any]]:
    if len(self._paths) == 1:
      return _ParquetIterator(self._paths[0], self._read_kwargs)
    # Lazy: interleave imports the dataset modules, which import loader.
    from loader.transformations import interleave  # pylint: disable=g-import-not-at-top

    files = [ParquetIterDataset(p, **self._read_kwargs) for p in self._paths]
    return iter(interleave.InterleaveIterDataset(files, cycle_length=_CYCLE_LENGTH))


class _ParquetIterator(iter_lib.DatasetIterator[dict[str, Any]]):

  _grain_state_keys = ("row_group", "index_within_row_group")  # Grain's layout: its states restore here.

  def __init__(self, path: Any, read_kwargs: dict[str, Any]):
    super().__init__()
    # Lazy: pyarrow is an optional dependency (the `parquet` extra) and costs
    # ~0.2 s to import; `import loader` must not pay for it.
    try:
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("ParquetIterDataset needs pyarrow: pip install 'arrayrecord-toolkit[parquet]'.") from e
    self._file = pq.ParquetFile(path, **read_kwargs)
    self._num_row_groups = self._file.num_row_groups
    self._row_group = 0
    self._index = 0
    self._columns: dict[str, Any] | None = None  # The current row group; None: read it.
    self._rows = 0

  def _load(self) -> None:
    table = self._file.read_row_group(self._row_group)
    self._columns = {table.field(i).name: table.column(i).to_numpy() for i in range(table.num_columns)}
    self._rows = len(table)

  def __next__(self) -> dict[str, Any]:
    while True:
      if self._row_group >= self._num_row_groups:
        raise StopIteration  # A file without row groups.
      if self._columns is None:
        self._load()
      if self._index < self._rows:
        i = self._index
        self._index += 1
        return {k: v[i] for k, v in self._columns.items()}
      if self._row_group + 1 >= self._num_row_groups:
        raise StopIteration  # The state stays at the end of the last group, as in Grain.
      self._row_group, self._index, self._columns = self._row_group + 1, 0, None

  def get_state(self) -> dict[str, Any]:
    return {"row_group": self._row_group, "index_within_row_group": self._index}

  def set_state(self, state: dict[str, Any]) -> None:
    state_lib.check_keys(state, ("row_group", "index_within_row_group"), type(self).__name__)
    self._row_group = checks.check_int(state["row_group"], "row_group", minimum=0,
                                       maximum=max(0, self._num_row_groups - 1))
    self._index = checks.check_int(state["index_within_row_group"], "index_within_row_group", minimum=0)
    self._columns = None

  def close(self) -> None:
    self._columns = None
    self._file.close()
    super().close()
