"""Grain 0.2.18's data sources (`grain.sources`) on loader's batched reader.

* `ArrayRecordDataSource` takes Grain's arguments — a path, a list of paths, or
  TFDS-style file instructions (objects with `filename`, `skip`, `take`,
  `examples_in_shard`; also Grain's "file[start:end]" strings) and
  `reader_options` as a dict — and is an `ArrayRecordSource`, so pipelines read
  it with one batched read per file. Differences from Grain: out-of-range keys
  raise `IndexError` (Grain: `ValueError`); negative keys count from the end;
  a plain path may also be a directory or glob pattern (as for
  `ArrayRecordSource`). Grain's source is array_record's, and subclasses
  reach its private reader API: `_readers` (one per path entry, None until
  opened), `_read_instructions` (`filename`, `start`, `end`, `num_records`),
  `_reader_options_string` and `_reader_idx_and_position(key)` are here too.
* `RangeDataSource(start, stop, step)`: like Grain's, plus negative indices and
  a batched `__getitems__`.
* `SharedMemoryDataSource` (`grain.python.InMemoryDataSource`): as in Grain, a
  `multiprocessing.shared_memory.ShareableList`, so worker processes attach to
  one copy of the elements instead of unpickling their own. The same limits
  apply: int, float, bool, str, bytes (each < 10 MB) and None; call
  `unlink()` once no process needs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from multiprocessing import shared_memory
from typing import Any, SupportsIndex

import numpy as np

from loader import checks
from loader import ondisk
from loader import source as source_lib
from loader.source import RandomAccessDataSource

__all__ = [
    "ArrayRecordDataSource",
    "InMemoryDataSource",
    "RandomAccessDataSource",
    "RangeDataSource",
    "SharedMemoryDataSource",
]

_FILE_INSTRUCTION_FIELDS = ("filename", "skip", "take", "examples_in_shard")
# Grain's (and array_record's) spelling of "records start..end-1 of a file".
_RANGE_SUFFIX = re.compile(r"(.*)\[(\d+):(\d+)\]")
_ITER_BATCH = 1024


class RecordRangeError(ValueError, RuntimeError):
  """A record range past a file's end (a RuntimeError too: Grain's reader raises one when it reads past it)."""


def _is_file_instruction(path: Any) -> bool:
  # Duck-typed like array_record's runtime-checkable FileInstruction protocol,
  # so TFDS's objects work without importing TFDS.
  return all(hasattr(path, f) for f in _FILE_INSTRUCTION_FIELDS)


def _split_range(path: Any) -> tuple[Any, int | None, int | None]:
  """(file, first record, end) of one entry; None, None for a whole file."""
  if _is_file_instruction(path):
    return os.fspath(path.filename), int(path.skip), int(path.skip) + int(path.take)
  if not isinstance(path, (str, os.PathLike)):
    raise ValueError("Each path must be a str, an os.PathLike or a file instruction (with filename, skip, "
                     f"take, examples_in_shard); got {type(path).__name__}: {path!r}.")
  p = os.fspath(path)
  m = _RANGE_SUFFIX.fullmatch(p)
  if m and not os.path.exists(p):
    return m.group(1), int(m.group(2)), int(m.group(3))
  return p, None, None


def reader_options_string(reader_options: dict[str, Any] | str | None) -> str:
  """Grain's `reader_options` dict as an ArrayRecordReader option string.

  Options given override loader's random-access defaults (readahead off,
  no parallel prefetch); the rest of the defaults stay.
  """
  if reader_options is None:
    return source_lib.DEFAULT_READER_OPTIONS
  if isinstance(reader_options, str):
    return reader_options
  if not isinstance(reader_options, dict):
    raise TypeError("reader_options must be a dict such as {'index_storage_option': 'in_memory'} or None "
                    f"(got {reader_options!r}).")
  merged = dict(kv.split(":", 1) for kv in source_lib.DEFAULT_READER_OPTIONS.split(","))
  merged.update({str(k): str(v) for k, v in reader_options.items()})
  return ",".join(f"{k}:{v}" for k, v in merged.items())


class RecordKeyError(ValueError, IndexError):
  """A record key outside [0, len): Grain raises a ValueError, sequences an IndexError."""


class RangeArgumentError(ValueError, AssertionError):
  """A RangeDataSource step of 0 or a negative length: Grain 0.2.18 asserts them (AssertionError)."""


_MAX_NAMED_REPR = 120  # SourceMapDataset._source_text's limit.


@dataclasses.dataclass(frozen=True)
class _ReadInstruction:
  """array_record's `_ReadInstruction`: records [start, end) of `filename` (one per path entry)."""

  filename: str
  start: int
  end: int
  num_records: int = dataclasses.field(init=False)

  def __post_init__(self):
    object.__setattr__(self, "num_records", self.end - self.start)


def _grain_reader_options_string(reader_options: Any) -> str:
  """array_record's `_reader_options_string`: the caller's options only ("" for None)."""
  if reader_options is None:
    return ""
  if isinstance(reader_options, str):
    return reader_options
  return ",".join(f"{k}:{v}" for k, v in reader_options.items())


class ArrayRecordDataSource(source_lib.ArrayRecordSource):
  """Grain's `ArrayRecordDataSource`, read in batches by loader's pipelines.

  Example::

    src = loader.sources.ArrayRecordDataSource(["/data/a.array_record", "/data/b.array_record"])
    src = loader.sources.ArrayRecordDataSource(tfds_file_instructions)   # skip/take honoured
    src = loader.sources.ArrayRecordDataSource(path, reader_options={"index_storage_option": "in_memory"})
  """

  def __init__(self, paths: Any, reader_options: dict[str, Any] | str | None = None):
    """Opens nothing yet but each file once, to count its records.

    Args:
      paths: A path or file instruction, or a sequence of them. Paths may also
        be directories or glob patterns unless a file instruction or a
        "file[start:end]" range is among them.
      reader_options: ArrayRecordReader options as a dict (Grain's form), e.g.
        {"index_storage_option": "in_memory"}; None for loader's defaults.
    """
    entries = [paths] if isinstance(paths, (str, os.PathLike)) or _is_file_instruction(paths) else paths
    if not isinstance(entries, Sequence):
      raise ValueError("paths must be a path, a file instruction, or a sequence of them "
                       f"(got {type(paths).__name__}: {paths!r}).")
    if not entries:
      raise ValueError("ArrayRecordDataSource needs at least one path (got an empty sequence).")
    split = [_split_range(e) for e in entries]
    options = reader_options_string(reader_options)
    # Grain's source is array_record's, whose private reader API subclasses
    # reach (`_readers`, `_read_instructions`, `_reader_options_string`,
    # `_reader_idx_and_position`), e.g. to bound the open readers.
    self._reader_options_string = _grain_reader_options_string(reader_options)
    if all(start is None for _, start, _ in split):
      super().__init__([f for f, _, _ in split], reader_options=options)
      self._ranges = None
      return
    for (f, _, _), entry in zip(split, entries):
      if not os.path.isfile(f):
        raise source_lib.MissingFileError(f"{f} (from {entry!r}) is not a file; with file instructions or "
                                "'file[start:end]' ranges, every path must name one ArrayRecord file.")
    super().__init__([f for f, _, _ in split], reader_options=options)
    self._set_ranges(split)

  def _set_ranges(self, split: list[tuple[str, int | None, int | None]]) -> None:
    # Record k of entry e lives at key starts[e] + first[e] + k of the whole
    # files this source was opened on.
    counts = self.records_per_file
    first = np.zeros(len(split), dtype=np.int64)
    takes = np.asarray(counts, dtype=np.int64)
    for e, ((f, start, end), n) in enumerate(zip(split, counts)):
      if start is None:
        continue
      if not 0 <= start <= end <= n:
        why = ("its start must be at least 0 and at most its end" if not 0 <= start <= end else
               "it ends past the file's last record: is the range (a '[start:end]' suffix, or a TFDS file "
               "instruction's skip and take) right? If it was, the file was replaced by a shorter one or cut since")
        raise RecordRangeError(f"Record range [{start}:{end}) of {ondisk.shown(f)} is outside its {n} records: "
                               f"{why}; check the file, or read a range within [0:{n}].")
      first[e], takes[e] = start, end - start
    ends = np.cumsum(takes)
    offsets = self._starts + first - (ends - takes)
    # Hashed once: checkpoints call repr on every get_state.
    digest = hashlib.sha1(f"{ends.tolist()}:{offsets.tolist()}".encode()).hexdigest()[:8]
    self._ranges = {"ends": ends, "offsets": offsets, "hash": digest}

  def __len__(self) -> int:
    return self._len if self._ranges is None else int(self._ranges["ends"][-1])

  # ---- array_record's private reader API (`self._readers[i]` is entry i's reader, None until opened) ----

  @property
  def _read_instructions(self) -> list[_ReadInstruction]:
    """One `_ReadInstruction(filename, start, end)` per path entry, as array_record's.

    Built once: array_record's subclasses look it up per record (as its own
    `_ensure_reader_exists` does), and may assign it, as they can there.
    """
    built = self.__dict__.get("_read_instructions_list")
    if built is None:
      counts = self._counts
      if self._ranges is None:
        built = [_ReadInstruction(f, 0, int(n)) for f, n in zip(self._paths, counts)]
      else:
        ends = self._ranges["ends"]
        prev = np.concatenate([[0], ends[:-1]])
        firsts = self._ranges["offsets"] - self._starts + prev
        built = [_ReadInstruction(f, int(a), int(a + e - b)) for f, a, e, b in zip(self._paths, firsts, ends, prev)]
      self.__dict__["_read_instructions_list"] = built
    return built

  @_read_instructions.setter
  def _read_instructions(self, value: list[Any]) -> None:
    self.__dict__["_read_instructions_list"] = value

  def _reader_idx_and_position(self, record_key: SupportsIndex) -> tuple[int, int]:
    """(entry, record within its file) of `record_key`, as array_record's (a ValueError outside [0, len))."""
    key = record_key.__index__()
    if key < 0 or key >= len(self):
      raise ValueError("Record key should be in [0, num_records)")
    if self._ranges is None:
      entry = int(np.searchsorted(self._ends, key, side="right"))
      return entry, key - int(self._starts[entry])
    entry = int(np.searchsorted(self._ranges["ends"], key, side="right"))
    return entry, key + int(self._ranges["offsets"][entry]) - int(self._starts[entry])

  def __repr__(self) -> str:
    # Names the source in checkpoints, as ArrayRecordSource's does: other files,
    # another order or other record ranges with the same totals are told apart.
    text = f"ArrayRecordDataSource({len(self.paths)} files, {len(self)} records, files_hash={self._files_hash()}"
    if self._ranges is not None:
      text += f", ranges_hash={self._ranges['hash']}"
    content = self._content_part()
    # MapDataset.source names a source whose repr is over 120 characters by its length alone (see
    # SourceMapDataset._source_text): the content hash is left out rather than the names and ranges too.
    return text + (content if len(text) + len(content) < _MAX_NAMED_REPR else "") + ")"

  def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
    """Records at `indices` (any order, repeats allowed), one batched read per file."""
    if self._ranges is None:
      return super().read(indices)
    n = len(self)
    idx = np.asarray(indices)
    if idx.size and idx.dtype.kind not in "iu":
      raise TypeError(f"Record indices must be integers (got dtype {idx.dtype}).")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
      bad = int(idx.min()) if idx.min() < -n else int(idx.max())
      raise IndexError(f"Record index {bad} out of range for a source of {n} records.")
    idx = np.where(idx < 0, idx + n, idx)
    entry = np.searchsorted(self._ranges["ends"], idx, side="right")
    return super().read(idx + self._ranges["offsets"][entry])

  def __getitem__(self, record_key: SupportsIndex) -> bytes:  # Grain's parameter name.
    i = checks.record_index(record_key)
    if not 0 <= i < len(self):  # Grain's rule: no negative keys.
      raise RecordKeyError(f"Record key should be in [0, num_records): got {i} for a source of "
                           f"{len(self)} records.")
    return self.read([i])[0]

  def __iter__(self) -> Iterator[bytes]:
    for start in range(0, len(self), _ITER_BATCH):
      yield from self.read(np.arange(start, min(start + _ITER_BATCH, len(self))))


class RangeDataSource:
  """The integers `start, start + step, ...` before `stop`, like Grain's (and `range`)."""

  def __init__(self, start: int, stop: int, step: int):
    for name, value in (("start", start), ("stop", stop), ("step", step)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise checks.ArgumentTypeError(f"RangeDataSource {name} must be an integer (got {name}={value!r}).")
    if step == 0:  # Grain asserts these two.
      raise RangeArgumentError("RangeDataSource step must not be 0 (got step=0).")
    self._start, self._stop, self._step = int(start), int(stop), int(step)
    # Grain's length is ceil((stop - start) / step), and it rejects a negative
    # one (where `range` would be empty).
    self._len = -((self._start - self._stop) // self._step)
    if self._len < 0:
      raise RangeArgumentError(f"RangeDataSource({start}, {stop}, {step}) would have a negative length; "
                       "use stop >= start for step > 0 and stop <= start for step < 0.")

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, record_key: SupportsIndex) -> int:
    i = checks.record_index(record_key)
    if not 0 <= i < self._len:  # Grain's rule: no negative keys.
      raise IndexError(f"Index {i} out of range for {self._len} (a RangeDataSource).")
    return self._start + i * self._step

  def __getitems__(self, record_keys: Sequence[int]) -> list[int]:
    keys = np.asarray(record_keys, dtype=np.int64).reshape(-1)
    if keys.size and (keys.min() < 0 or keys.max() >= self._len):
      bad = int(keys.min()) if keys.min() < 0 else int(keys.max())
      raise IndexError(f"Index {bad} out of range for {self._len} (a RangeDataSource).")
    return (self._start + keys * self._step).tolist()

  def __repr__(self) -> str:
    return f"RangeDataSource(start={self._start}, stop={self._stop}, step={self._step})"


class SharedMemoryDataSource(shared_memory.ShareableList):
  """A sequence in shared memory that worker processes attach to, as in Grain.

  Pickling sends only the segment's name (spawned workers attach to the same
  memory). Values are limited to int, float, bool, str, bytes (< 10 MB each)
  and None, and the length is fixed.
  """

  def __init__(self, elements: Sequence[Any] | None = None, *, name: str | None = None):
    """Creates the shared list from `elements`, or attaches to the one called `name`."""
    if elements is None and name is None:
      raise ValueError("SharedMemoryDataSource needs elements (to create one) or name (to attach to one).")
    super().__init__(elements, name=name)

  def __str__(self) -> str:
    return f"InMemoryDataSource(name={self.shm.name}, len={len(self)})"

  def close(self) -> None:
    """Detaches this process; the memory stays until `unlink()`."""
    self.shm.close()

  def unlink(self) -> None:
    """Frees the shared memory (once, from one process)."""
    self.shm.unlink()


# grain.python's name for it.
InMemoryDataSource = SharedMemoryDataSource
