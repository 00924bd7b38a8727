"""`ParquetIterDataset`: rows of Parquet files as dicts of numpy values (Grain's).

Rows come row group by row group; each row is `{column: value}` with the
values numpy gives for the column (`pyarrow` `to_numpy()`). Several files are
interleaved with at most 16 open at once, as in Grain. State of one file is
Grain's: `{"row_group": g, "index_within_row_group": i}`. pyarrow is imported
when a file is opened (`pip install arrayrecord-toolkit[parquet]`).

A file that cannot be opened or read raises one line naming it (and the row
group, its first row and byte offset) and what to do, as a `ParquetReadError`
that is also of the class pyarrow raised (ArrowInvalid, OSError...), which
Grain's ParquetIterDataset passes through: `except` clauses written for those
still catch it, and pyarrow's error is its `__cause__`. A missing file is a
`loader.source.MissingFileError` (a FileNotFoundError); a damaged row group a
`loader.source.CorruptRecordError` too. The state stays at the row group, so a
retry reads it again.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any

from loader import checks
from loader import iter_dataset as iter_lib
from loader import ondisk
from loader import source as source_lib
from loader import state as state_lib

_CYCLE_LENGTH = 16  # Files read at once, as in Grain.


class ParquetReadError(Exception):
  """A Parquet file that cannot be opened, or a row group of it that cannot be read.

  Raised as a class made from this one and the error pyarrow raised (so also
  an ArrowInvalid, OSError, FileNotFoundError...: what Grain's
  ParquetIterDataset raises there). Attributes: path, row_group and
  first_row (None where the file could not be opened), offset (byte offset of
  the row group's first column chunk, None where unknown), detail (pyarrow's
  message on one line).
  """

  def __init__(self, message: str, path: str, row_group: int | None = None, first_row: int | None = None,
               offset: int | None = None, detail: str = ""):
    BaseException.__init__(self, message)
    self.path, self.row_group, self.first_row, self.offset, self.detail = path, row_group, first_row, offset, detail
    self.record_index = self.source_index = None  # CorruptRecordError's fields, where it is one.

  def __str__(self) -> str:  # One line, whatever the pyarrow class's own __str__ (KeyError's quotes).
    return str(self.args[0]) if self.args else ""

  def __reduce__(self):
    fields = (self.path, self.row_group, self.first_row, self.offset, self.detail)
    os_fields = (getattr(self, "errno", None), getattr(self, "strerror", None), getattr(self, "filename", None))
    return (_rebuild, (self._bases, str(self), fields, os_fields))

  _bases: tuple[type, ...] = ()


_CLASSES: dict[tuple[type, ...], type] = {}


def _error_class(bases: tuple[type, ...]) -> type:
  """The ParquetReadError class that is also each of `bases` (made once per combination)."""
  cls = _CLASSES.get(bases)
  if cls is None:
    name = "Parquet" + bases[-1].__name__
    cls = type(name, (ParquetReadError, *bases), {"__module__": __name__, "__qualname__": name,
                                                   "__doc__": ParquetReadError.__doc__, "_bases": bases})
    _CLASSES[bases] = cls
  return cls


def _rebuild(bases: tuple[type, ...], message: str, fields: tuple, os_fields: tuple) -> ParquetReadError:
  """Unpickles a ParquetReadError: its class is made again from the classes it was made from."""
  error = _error_class(bases)(message, *fields)
  if isinstance(error, OSError):
    error.errno, error.strerror, error.filename = os_fields
  return error


def _io_error(error: BaseException) -> bool:
  """An error of the disk or the network (it has an errno), not of the file's contents."""
  return isinstance(error, OSError) and bool(error.errno) and not isinstance(error, FileNotFoundError)


def _damage(error: BaseException) -> bool:
  """Damaged contents: neither an I/O error nor a feature this pyarrow lacks."""
  return not _io_error(error) and type(error).__name__ != "ArrowNotImplementedError"


def _name(path: Any) -> str:
  if isinstance(path, (str, bytes, os.PathLike)):
    name = os.fspath(path)
    return name.decode(errors="replace") if isinstance(name, bytes) else name
  return str(getattr(path, "name", None) or getattr(path, "path", None) or repr(path))


def _one_line(error: BaseException) -> str:
  return ondisk.one_line(error).rstrip(".") or type(error).__name__


def _wrap(error: BaseException, message: str, path: str, corrupt: bool = False, **fields: Any) -> BaseException:
  """`error` as a ParquetReadError that is also of its class (and CorruptRecordError where `corrupt`)."""
  base = type(error)
  if base is FileNotFoundError:
    base = source_lib.MissingFileError  # A FileNotFoundError too, as ArrayRecordSource raises.
  bases = (source_lib.CorruptRecordError, base) if corrupt else (base,)
  try:
    wrapped = _error_class(bases)(message, path, detail=_one_line(error), **fields)
  except TypeError:  # A class that cannot be combined (a layout conflict): left as pyarrow raised it.
    return error
  if isinstance(error, OSError):
    wrapped.errno, wrapped.strerror, wrapped.filename = error.errno, error.strerror, error.filename
  return wrapped


def _advice(error: BaseException, opening: bool) -> str:
  """What to do about pyarrow's `error`, as a sentence."""
  if _io_error(error):  # The disk or the network.
    stays = "" if opening else " (the iterator stays at this row group)"
    return f"Check the disk or the storage, then retry{stays}; if the file is damaged, re-create or re-download it."
  if type(error).__name__ == "ArrowNotImplementedError":
    return ("This pyarrow cannot read it: upgrade pyarrow or re-write the file with options it supports; if the "
            "file is damaged (truncated or altered), re-create or re-download it.")
  if opening:
    return "Re-create or re-download it if it is damaged (truncated or altered), or pass only Parquet files."
  return "The file is damaged (truncated or altered): re-create or re-download it."


def _refuse_special_file(path: Any) -> None:
  """A FIFO or device would block the read for ever: an OSError instead (worded by the caller)."""
  if isinstance(path, (str, os.PathLike)) and ondisk.is_local(os.fspath(path)):
    problem = ondisk.file_problem(os.fspath(path))
    if problem is not None and problem.kind == "special":
      raise OSError(errno.EINVAL, f"it {problem.what}")


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
    self._path = _name(path)
    try:
      _refuse_special_file(path)
      self._file = pq.ParquetFile(path, **read_kwargs)
    except (OSError, _arrow_exception()) as e:
      raise self._open_error(path, e) from e
    self._num_row_groups = self._file.num_row_groups
    self._row_group = 0
    self._index = 0
    self._columns: dict[str, Any] | None = None  # The current row group; None: read it.
    self._rows = 0

  def _open_error(self, path: Any, error: BaseException) -> BaseException:
    name = self._path
    local = isinstance(path, (str, os.PathLike)) and ondisk.is_local(name)
    problem = ondisk.file_problem(name) if local else None
    if problem is not None:
      return _wrap(error, f"{name}: cannot open it as a Parquet file: it {problem.what}; {problem.fix}.", name)
    if isinstance(error, FileNotFoundError):
      return _wrap(error, f"{name}: cannot open it as a Parquet file: it does not exist; check the path.", name)
    size = ""
    if local:
      try:
        size = f" ({os.path.getsize(name):,} bytes)"
      except OSError:
        pass
    return _wrap(error, f"{name}{size} is not a readable Parquet file: {_one_line(error)}. "
                 f"{_advice(error, opening=True)}", name)

  def _load(self) -> None:
    try:
      table = self._file.read_row_group(self._row_group)
      columns = {table.field(i).name: table.column(i).to_numpy() for i in range(table.num_columns)}
    except (OSError, _arrow_exception()) as e:
      raise self._row_group_error(e) from e
    self._columns = columns
    self._rows = len(table)

  def _row_group_error(self, error: BaseException) -> BaseException:
    g = self._row_group
    first_row = offset = None
    where = ""
    try:
      metadata = self._file.metadata
      first_row = sum(metadata.row_group(i).num_rows for i in range(g))
      group = metadata.row_group(g)
      rows = group.num_rows
      where = f" (rows {first_row} to {first_row + rows - 1}" if rows else f" (no rows, after row {first_row}"
      starts = []
      for c in range(group.num_columns):
        column = group.column(c)
        page = column.dictionary_page_offset if column.has_dictionary_page else None
        starts.append(page if page is not None else column.data_page_offset)
      offset = min(s for s in starts if s is not None)
      where += f", at byte offset {offset})"
    except Exception:  # pylint: disable=broad-except  # Metadata that does not say: the group alone is named.
      where += ")" if where else ""
    return _wrap(error, f"{self._path}: row group {g} of {self._num_row_groups}{where} cannot be read: "
                 f"{_one_line(error)}. {_advice(error, opening=False)}", self._path, corrupt=_damage(error),
                 row_group=g, first_row=first_row, offset=offset)

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


def _arrow_exception() -> type:
  import pyarrow  # pylint: disable=g-import-not-at-top  # Only once a file is opened (pyarrow is loaded then).
  return pyarrow.ArrowException
