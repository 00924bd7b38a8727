"""Random-access data sources: ArrayRecord files, and adapters for any other.

A data source is anything with `__len__` and `__getitem__(int)` that is
picklable (the protocol Grain and `tfds.data_source` use). `ArrayRecordSource`
adds a batched `read(indices)` that issues one `ArrayRecordReader.read` per
file, which is what makes shuffled reading fast: a single-record read costs a
fixed ~0.1 ms that grows with the number of chunks in the file, and a batched
read amortises it (and releases the GIL).
"""

from __future__ import annotations

import collections
import copy
import concurrent.futures
import contextlib
import errno
import glob
import hashlib
import os
import re
import shlex
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, SupportsIndex, TypeVar, runtime_checkable

import numpy as np

from loader import checks
from loader import ondisk
from loader import reader_threads
from loader.ondisk import MANIFEST_NAME

T = TypeVar("T")

# Random access wants no readahead (it would read megabytes per record).
DEFAULT_READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
# A batched read costs about one pread and one thread-pool task per record;
# a span read copies everything between a file's first and last wanted record
# at once and decodes only the wanted records. Copying ~8 KiB from the page
# cache costs about as much as one pread, so a span read wins when the wanted
# records lie closer than that on average (8 files of 25k 1 KB records, 2
# cores, 4 threads: +6% at 1/8 of each file per call, +15% at 1/6, +20% at
# 1/3; -7% at 1/12, -30% at 1/25).
_SPAN_BYTES_PER_RECORD = 8 << 10
# The span is held in memory while it is decoded, per reading thread.
_MAX_SPAN_BYTES = 32 << 20
_GROUP_SIZE_RE = re.compile(r"(?:^|,)group_size:(\d+)")



_CONTENT_SAMPLE_BYTES = 4 << 10


def _file_ends(path: str) -> bytes | None:
  """A file's size and its first and last `_CONTENT_SAMPLE_BYTES` (see ArrayRecordSource._content_hash).

  A path that is not a readable file (gone, not allowed, not local) is named
  by its problem, which does not change from call to call; None where the
  file cannot be read just now (no file descriptor left, an I/O error): a
  hash of that error would stand for content that was never read. Reads name
  the problem; the checkpoint identity must not raise.
  """
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError as e:
    return f"{path}: {e.strerror}".encode() if e.errno in _LASTING_ERRNOS else None
  try:
    size = os.fstat(fd).st_size
    head = os.pread(fd, _CONTENT_SAMPLE_BYTES, 0)
    tail = os.pread(fd, _CONTENT_SAMPLE_BYTES, max(0, size - _CONTENT_SAMPLE_BYTES))
  except OSError as e:
    return f"{path}: {e.strerror}".encode() if e.errno in _LASTING_ERRNOS else None
  finally:
    os.close(fd)
  return struct.pack("<Q", size) + head + tail


# Errors of `_file_ends` that say what the path is, not what the system is going through.
_LASTING_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                             errno.ENAMETOOLONG, errno.ELOOP})

@runtime_checkable
class RandomAccessDataSource(Protocol[T]):
  """What `MapDataset.source` accepts: sized, indexable and picklable."""

  def __len__(self) -> int:
    ...

  def __getitem__(self, index: SupportsIndex) -> T:
    ...


class MissingFileError(FileNotFoundError, RuntimeError):
  """A path that names no file (a RuntimeError too: Grain's reader raises one there)."""


class NotArrayRecordError(ValueError, RuntimeError):
  """A file that is not a readable ArrayRecord file (a RuntimeError too, as Grain raises)."""


class TooManyOpenFilesError(OSError, RuntimeError):
  """The process may open no more files (EMFILE/ENFILE); a RuntimeError too, as Grain's reader raises."""


class FileChangedError(RuntimeError):
  """A file of an open ArrayRecordSource was truncated, replaced or deleted."""

  def __init__(self, path: str, change: str, record_index: int | None = None,
               source_index: int | None = None):
    self.path, self.change, self.record_index, self.source_index = path, change, record_index, source_index
    where = ("" if record_index is None else
             f" while reading record {record_index} (index {source_index} of the source)")
    super().__init__(
        f"{path} changed after the ArrayRecordSource was created ({change}){where}; records read "
        "from it now could be wrong or empty. Do not modify a dataset while it is read: "
        "let the writer finish, then create a new ArrayRecordSource.")

  def __reduce__(self):
    return (type(self), (self.path, self.change, self.record_index, self.source_index))


class CorruptRecordError(RuntimeError):
  """A record of an ArrayRecord file is damaged (checksum mismatch, bad chunk)."""

  def __init__(self, path: str, record_index: int | None, source_index: int | None,
               detail: str):
    self.path, self.record_index, self.source_index, self.detail = (
        path, record_index, source_index, detail)
    where = ("a record" if record_index is None else
             f"record {record_index} (index {source_index} of the source)")
    super().__init__(
        f"{path}: {where} is corrupt: {detail}. Re-create the file (e.g. convert it again "
        "with --overwrite) or restore it from a good copy.")

  def __reduce__(self):
    return (type(self), (self.path, self.record_index, self.source_index, self.detail))


def _describe_change(before: tuple | None, after: tuple | None) -> str:
  if after is None:
    return "it was deleted"
  if before is None:
    return "it was created"
  changes = []
  if before[:2] != after[:2]:
    changes.append("it was replaced by another file")
  if before[2] != after[2]:
    changes.append(f"size {before[2]} -> {after[2]} bytes")
  if before[3] != after[3] and not changes:
    changes.append("it was rewritten (modification time changed)")
  return ", ".join(changes) or "its metadata changed"


def _describe_non_array_record(path: str) -> str:
  """Says what a file that ArrayRecordReader rejects looks like instead."""
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      head = f.read(16)
      packed = f.read(1 << 12) if head[:2] == b"\x1f\x8b" else b""
  except OSError as e:
    return f"it cannot be read ({e})"
  if size == 0:
    return ("it is empty (0 bytes): an interrupted copy or conversion? Copy or convert it again, or remove it "
            "from the dataset's files")
  if head.startswith(ondisk.RIEGELI_SIGNATURE):
    return (f"it starts like one but its end cannot be read ({size} bytes): probably truncated "
            "(an interrupted copy or download) or damaged; copy or convert it again")
  if head[:2] == b"\x1f\x8b":
    try:  # What was compressed tells what to do.
      inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head + packed, 16)
    except zlib.error:
      inner = b""
    if inner.startswith(ondisk.RIEGELI_SIGNATURE):
      q, tmp = shlex.quote(path), shlex.quote(path + ".tmp")
      how = f"gunzip {q}" if path.endswith(".gz") else f"gunzip -c {q} > {tmp} && mv {tmp} {q}"  # gunzip wants .gz.
      return f"it is a gzip-compressed ArrayRecord file: decompress it first ({how})"
    if len(inner) >= 12 and _looks_like_tfrecord(inner):
      return "it is a gzip-compressed TFRecord file; convert it first (`arrayrecord-convert` reads it as it is)"
    return ("it is gzip-compressed (a compressed TFRecord file?): convert it (`arrayrecord-convert` reads "
            "compressed TFRecord files), or remove it from the dataset's files")
  if len(head) >= 12 and _looks_like_tfrecord(head):
    return ("it is a TFRecord file; convert it first (e.g. with "
            "`arrayrecord-convert`)")
  return (f"its first bytes are {head[:8]!r} ({size} bytes in total), not an ArrayRecord file's: copy or convert "
          "it again if it should be one, or remove it from the dataset's files")


def _looks_like_tfrecord(head: bytes) -> bool:
  # A TFRecord starts with uint64 length + masked crc32c of those 8 bytes.
  try:
    import crc32c  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  crc = crc32c.crc32c(head[:8])
  masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  return struct.unpack("<I", head[8:12])[0] == masked


def _group_size(writer_options: str) -> int | None:
  m = _GROUP_SIZE_RE.search(writer_options or "")
  return int(m.group(1)) if m else None


def _warn_group_size(path: str, writer_options: str) -> None:
  group_size = _group_size(writer_options)
  if group_size is not None and group_size > 1:
    warnings.warn(
        f"{path} was written with group_size:{group_size}: every random read "
        f"decodes a chunk of {group_size} records, which makes shuffled "
        "reading many times slower. Re-convert it with writer options "
        "'group_size:1' (`arrayrecord-convert --writer-options group_size:1`, "
        "the converter's default).",
        stacklevel=3,
    )


def _check_file(path: str) -> None:
  """Raises one line unless `path` is (a link to) a regular file: reading a FIFO or device could block for ever."""
  problem = ondisk.file_problem(path)
  if problem is None:
    return
  if problem.kind in ("missing", "broken link"):
    link = f": it {problem.what}; {problem.fix}." if problem.kind == "broken link" else _tilde_hint(path)
    if not link and path != path.strip():
      link = f": its name has a space or line break at an end; strip it ({path.strip()!r})."
    raise MissingFileError(f"ArrayRecord file not found: {ondisk.shown(path)}{link}")
  raise NotArrayRecordError(f"{ondisk.shown(path)} is not an ArrayRecord file: it {problem.what}; {problem.fix}.")


def _matched_files(matches: list[str], given: str) -> list[str]:
  """The files among a pattern's (or folder's) matches, sorted; folders among them are passed over.

  A match that is neither (a broken link, a FIFO) is refused in one line: passing over it would read a
  dataset short of that shard's records without a word.
  """
  files = []
  for f in sorted(matches):
    if os.path.isdir(f):
      continue
    if not os.path.isfile(f):
      try:
        _check_file(f)
      except (MissingFileError, NotArrayRecordError) as e:
        how = "holds" if os.path.isdir(given) else "matches"
        raise type(e)(f"{ondisk.shown(given)} {how} {ondisk.shown(f)}, which cannot be read: {e}") from None
    files.append(f)
  return files


def _refuse_manifest(path: str, given: str) -> None:
  """A converted folder's manifest given as a data file (directly, or matched by `folder/*`): say to pass the folder."""
  if os.path.basename(path) != MANIFEST_NAME:
    return
  folder = os.path.dirname(path) or "."
  how = "is" if path == given else f"matches {ondisk.shown(path)}, which is"
  raise NotArrayRecordError(
      f"{given!r} {how} the manifest of a converted folder, not an ArrayRecord file: pass the folder itself "
      f"({folder!r}), which reads the shards its manifest lists.")


def _tfrecords_hint(directory: str) -> str:
  """Advice for a folder that holds TFRecord files instead of ArrayRecord ones."""
  tfrecords = sorted(f for f in glob.glob(os.path.join(glob.escape(directory), "*tfrecord*")) if os.path.isfile(f))
  if not tfrecords:
    return ""
  return (f"; it holds TFRecord files ({os.path.basename(tfrecords[0])!r}"
          f"{f' and {len(tfrecords) - 1} more' if len(tfrecords) > 1 else ''}): convert them first with "
          f"arrayrecord-convert --input {shlex.quote(os.path.join(directory, '*'))} --output OUT_DIR, then pass OUT_DIR")


def _tilde_hint(path: str) -> str:
  """Advice for a missing path starting with '~', which Python (as Grain) takes literally."""
  head = ondisk.unexpanded_home(path)
  if head is None:
    return ""
  return (f": {head!r} is not expanded to a home folder here (only a shell does that); pass "
          f"os.path.expanduser({path!r}), i.e. {os.path.expanduser(path)!r}.")


def _open_reader(path: str, options: str):
  reader_cls = reader_threads.reader_class(path)
  _check_file(path)
  try:
    reader = reader_cls(path, options)
  except RuntimeError as e:
    if _out_of_file_descriptors(str(e)):
      raise _too_many_open_files(path) from e
    raise _unreadable(path, str(e)) from e
  # Depending on the options the reader may not raise on a bad file, only
  # report it through ok().
  if not reader.ok():
    try:
      reader.close()
    except RuntimeError as e:  # close() re-raises the reader's failure status.
      status = str(e)
    else:
      status = "not ok"
    if _out_of_file_descriptors(status):
      raise _too_many_open_files(path)
    raise _unreadable(path, status)
  return reader


def _out_of_file_descriptors(message: str) -> bool:
  return any(text in message for text in (os.strerror(errno.EMFILE), os.strerror(errno.ENFILE),
                                          "Errno 24", "Errno 23"))


def _too_many_open_files(path: str) -> TooManyOpenFilesError:
  return TooManyOpenFilesError(
      errno.EMFILE,
      f"{path}: cannot open it: this process has too many open files. ArrayRecordSource keeps one file "
      f"open per shard (in each worker process too): {ondisk.open_file_limit_advice('before building the source')}"
      ", or read fewer, larger shards.")


def _unreadable(path: str, reader_status: str) -> NotArrayRecordError:
  what = _describe_non_array_record(path)
  lead = "cannot be read as an ArrayRecord file" if what.startswith("it starts like one") else (
      "is not an ArrayRecord file")
  # The reader's own status, when it says anything (a cut file's last chunk gives an empty one).
  status = ondisk.one_line(reader_status)
  return NotArrayRecordError(f"{path} {lead}: {what}{f' (reader: {status})' if status else ''}.")


def _span_options(options: str) -> str:
  """`options` with a readahead buffer that holds any span: one read per call."""
  kept = [o for o in options.split(",") if o.strip() and not o.strip().startswith("readahead_buffer_size")]
  return ",".join([*kept, "readahead_buffer_size:1G"])  # The largest it takes.


def _count_records(path: str, options: str) -> tuple[int, str]:
  reader = _open_reader(path, options)
  try:
    return reader.num_records(), reader.writer_options_string()
  finally:
    reader.close()


def _read_manifest(directory: str) -> list[tuple[str, int]]:
  """(path, records) per shard, in the manifest's order; paths resolved in `directory`."""
  manifest = ondisk.read_manifest(directory)  # Checked; a bad one raises naming the file.
  path = ondisk.manifest_path(directory)
  shards = manifest["shards"]
  failed = [s["output"] for s in shards if s.get("status") == "failed"]
  if failed:
    raise ValueError(
        f"{path} lists {len(failed)} shard(s) whose conversion failed "
        f"(e.g. {failed[0]}); re-run the conversion before reading the dataset.")
  out = []
  named: dict[tuple[int, int], str] = {}  # The file (device, inode) each shard is -> the name that listed it first.
  for shard in shards:
    output = shard["output"]
    located = _locate_shard(directory, output, manifest)
    try:
      st = os.stat(located)
    except (OSError, ValueError):
      raise MissingFileError(f"{path} lists shard {output!r}, which is not at {located}: put it back, or convert "
                             "its input again (arrayrecord-convert --skip-existing redoes only missing shards).") from None
    # `x`, `./x`, its absolute path, a link to it or a hard link: one file, whose records would count twice.
    if (st.st_dev, st.st_ino) in named:
      raise ondisk.ManifestError(
          f"{path} lists shards {named[st.st_dev, st.st_ino]!r} and {output!r}, which are the same file "
          f"{os.path.realpath(located)}: its records would be read twice; remove one of them from the manifest, "
          "or delete the manifest and rerun the conversion with --skip-existing.")
    named[st.st_dev, st.st_ino] = output
    out.append((located, shard["records"]))
  return out


def _locate_shard(directory: str, output: str, manifest: dict[str, Any]) -> str:
  """Where a manifest's shard is: always looked for in `directory` first.

  Paths are stored relative to the dataset directory, so a copied dataset
  reads its own files. Older manifests stored absolute paths, and manifests
  written on Dataflow name gs:// outputs: such a path is re-based onto
  `directory` (or found by file name there) before it is used as is, so a
  copy never silently reads the original's files.
  """
  if ondisk.is_local(output) and not os.path.isabs(output):
    return os.path.join(directory, output)
  candidates = []
  old_base = manifest.get("output_dir")
  if isinstance(old_base, str) and old_base:
    rel = ondisk.to_stored(old_base, output)
    if rel != output:
      candidates.append(ondisk.resolve(directory, rel))
  candidates.append(os.path.join(directory, os.path.basename(output.rstrip("/"))))
  if ondisk.is_local(output):
    candidates.append(output)
  for c in candidates:
    if os.path.exists(c):
      return c
  return candidates[0]


_SHARD_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})(.*)$")


def _check_complete_directory(directory: str, found: list[str]) -> None:
  """Refuses a directory without a manifest that a conversion left incomplete.

  The converter writes manifest.json last; without it, a directory holding
  the converter's lock file, or only some of the `-NNNNN-of-MMMMM` shards of
  a name, is being written or was interrupted, and reading it would quietly
  train on part of the data. A glob of the files reads them anyway.
  """
  anyway = f"to read just these files anyway, pass a glob: {os.path.join(directory, '*.array_record*')!r}"
  if os.path.exists(os.path.join(directory, ondisk.LOCK_NAME)):
    raise ValueError(
        f"Directory {directory} has no {MANIFEST_NAME} and holds a conversion's lock file "
        f"({ondisk.LOCK_NAME}): a conversion is writing it or was interrupted. Wait for it to finish, "
        f"or rerun it with --skip-existing to complete it; {anyway}.")
  groups: dict[tuple[str, str, int], set[int]] = collections.defaultdict(set)
  for f in found:
    m = _SHARD_NAME.match(os.path.basename(f))
    if m:
      groups[(m.group(1), m.group(4), int(m.group(3)))].add(int(m.group(2)))
  for (head, tail, total), have in sorted(groups.items()):
    missing = sorted(set(range(total)) - have)
    if missing:
      shown = ", ".join(f"{head}-{i:05d}-of-{total:05d}{tail}" for i in missing[:3])
      more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
      raise ValueError(
          f"Directory {directory} has no {MANIFEST_NAME} and only {len(have)} of the {total} shards of "
          f"{head}-*-of-{total:05d}{tail} (missing: {shown}{more}): an interrupted or partial copy or "
          f"conversion? Complete it (the converter's --skip-existing resumes a run); {anyway}.")


def _resolve_paths(paths) -> list[tuple[str, int | None]]:
  """Expands paths/globs/directories into (file, known record count or None)."""
  if isinstance(paths, (str, os.PathLike)):
    items = [paths]
  elif isinstance(paths, Sequence):
    items = list(paths)
  else:
    raise TypeError(
        "paths must be a path, a glob pattern, a directory or a sequence of "
        f"paths (got {type(paths).__name__}).")
  if not items:
    raise ValueError("ArrayRecordSource needs at least one path (got an empty list).")
  files: list[tuple[str, int | None]] = []
  for i, item in enumerate(items):
    p = os.fspath(item)
    if not isinstance(p, str):
      raise TypeError(f"Paths must be str or os.PathLike (got {item!r}).")
    if not p.strip():
      raise MissingFileError(
          f"Path {i} of the {len(items)} given is blank ({p!r}); a file list read with .split('\\n') ends in "
          "one: leave blank entries out, e.g. [p for p in paths if p.strip()].")
    if os.path.isdir(p):
      if os.path.exists(os.path.join(p, MANIFEST_NAME)):
        files.extend(_read_manifest(p))
        continue
      found = _matched_files(glob.glob(os.path.join(glob.escape(p), "*.array_record*")), p)
      if not found:
        raise MissingFileError(f"Directory {ondisk.shown(p)} has neither a {MANIFEST_NAME} nor any "
                               f"*.array_record* files{_tfrecords_hint(p)}.")
      _check_complete_directory(p, found)
      files.extend((f, None) for f in found)
    elif os.path.isfile(p):  # A name with [ ] or * that exists is that file, as Grain reads it.
      _refuse_manifest(p, p)
      files.append((p, None))
    elif glob.has_magic(p):
      found = _matched_files(glob.glob(p), p)
      if not found:
        raise MissingFileError(f"No files match the pattern {p!r}{_tilde_hint(p) or '.'}")
      for f in found:
        _refuse_manifest(f, p)
      files.extend((f, None) for f in found)
    else:  # Missing, a broken link or a loop, a FIFO or device: one line saying which.
      _check_file(p)
      files.append((p, None))
  return files


_parallel = threading.local()
_pool_lock = threading.Lock()
_pool: tuple[int, int, concurrent.futures.ThreadPoolExecutor] | None = None  # (pid, size, pool)

_clock = threading.local()


def batched_read_seconds() -> float:
  """Wall seconds this thread has spent in batched source reads (see `BatchedSource`).

  The engine subtracts them from a chunk's time to tell per-element work
  (maps, per-index reads: worth spreading over threads) from batched reads
  (amortised per call: worth keeping in one call).
  """
  return getattr(_clock, "seconds", 0.0)


@contextlib.contextmanager
def _batched_read() -> Iterator[None]:
  t0 = time.perf_counter()
  try:
    yield
  finally:
    _clock.seconds = batched_read_seconds() + time.perf_counter() - t0


_reads_log = threading.local()


class _Raised:
  """A streaming source's read that raised, kept in place of its record (see BatchedSource.read)."""

  def __init__(self, error: Exception):
    self.error = error


def ignores_index(source: Any) -> bool:
  """Whether a source's `__getitem__` never reads its index: it streams (returns the next record).

  As MaxText's and maxdiffusion's HFDataSource do. Told from the method's
  bytecode; a method it cannot read (C, *args) counts as reading by index.
  """
  import dis  # pylint: disable=g-import-not-at-top  # Only for user sources without batched reads.
  code = getattr(getattr(type(source), "__getitem__", None), "__code__", None)
  if code is None or code.co_argcount < 2 or code.co_flags & 0x0C:  # CO_VARARGS | CO_VARKEYWORDS
    return False
  name = code.co_varnames[1]
  if name in code.co_cellvars or {"locals", "vars"} & set(code.co_names):
    return False  # Read by a nested function, or possibly through locals().
  for ins in dis.get_instructions(code):
    if "FAST" in ins.opname and (ins.argval == name or (isinstance(ins.argval, tuple) and name in ins.argval)):
      return False
  return True


@contextlib.contextmanager
def reads_kept_on_failure() -> Iterator[None]:
  """Within: what sources that may stream read by index is noted; if the block raises, each keeps it.

  The engine computes a chunk in one call and, if that raises, again one
  element at a time. A source that streams (its `__getitem__` ignores the
  index and returns the next record, as MaxText's and maxdiffusion's
  HFDataSource do) cannot give the records of the first try again: kept,
  they are given out again to reads of the same keys, in order (see
  BatchedSource.read), so the retry and the chunks after it see the records
  Grain's one-by-one reads would.
  """
  previous = getattr(_reads_log, "current", None)
  log: dict[BatchedSource, list[tuple[int, Any]]] = {}
  _reads_log.current = log
  try:
    yield
  except BaseException:
    for reader, pairs in log.items():
      reader._keep(pairs)  # pylint: disable=protected-access
    raise
  finally:
    _reads_log.current = previous


@contextlib.contextmanager
def parallel_reads(threads: int) -> Iterator[None]:
  """Within this block (in this thread), a read touching several files reads them with `threads` threads."""
  previous = getattr(_parallel, "threads", 1)
  _parallel.threads = threads
  try:
    yield
  finally:
    _parallel.threads = previous


def _read_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
  global _pool
  with _pool_lock:
    if _pool is None or _pool[0] != os.getpid() or _pool[1] < threads:
      # One pool per process (a forked child must not use the parent's). A
      # smaller pool it replaces is left to finish: another thread may still
      # be handing it reads.
      _pool = (os.getpid(), threads, concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="loader-read"))
    return _pool[2]


class ArrayRecordSource:
  """Random access to the records of one or more ArrayRecord files.

  Records are numbered across files in order: file 0's records first. Besides
  `len(src)` and `src[i]` (the Grain/TFDS data source protocol, so the source
  also plugs into `grain.MapDataset.source`), `src.read(indices)` reads many
  records with one batched `ArrayRecordReader.read` per file (of one span of
  the file, up to 32 MiB, when the wanted records lie close together).

  Readers are opened lazily, once per process: pickling drops them and a
  forked child reopens its own. One source may be read from several threads
  at once (the readers are thread-safe; opening is locked).

  Every batched read checks (one `stat` per file touched) that its files are
  the ones the source was created with: a file truncated, replaced or deleted
  since raises `FileChangedError` naming it, instead of returning empty or
  wrong records. Damaged data raises `CorruptRecordError` naming the file and
  the record; both survive the trip from an `mp_prefetch` worker.

  Example::

    src = ArrayRecordSource("/data/train")        # manifest.json or *.array_record*
    src = ArrayRecordSource("/data/train-*.array_record")
    records = src.read([17, 3, 17])               # list of bytes, in that order
  """

  def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike], *,
               reader_options: str = DEFAULT_READER_OPTIONS):
    """Resolves the files and counts their records.

    Counts come from the converter's `manifest.json` when a directory has one
    (then only the first file is opened, to check it); otherwise every file is
    opened once.

    Args:
      paths: A file, a glob pattern, a directory (its `manifest.json` shard order
        if present, else its sorted `*.array_record*` files), or a sequence of
        any of these.
      reader_options: `ArrayRecordReader` options; the default suits random access.
    """
    self._reader_options = reader_options
    resolved = _resolve_paths(paths)
    self._paths = [p for p, _ in resolved]
    # Opened by absolute path: a relative one read after os.chdir (a notebook's, a job's) or by workers
    # started later would name another file, or none. `paths` stays as given (as Grain's).
    self._abs_paths = [ondisk.local_abspath(p) for p in self._paths]
    # Identity (device, inode, size, mtime) of each file now: every read
    # checks it, so a file changed under the source raises instead of
    # returning wrong or empty records. Kept when pickled to workers.
    self._ids = [ondisk.file_id(p) for p in self._paths]
    self._expected = [n for _, n in resolved]  # From a manifest, checked on open.
    counts = list(self._expected)
    unknown = [i for i, n in enumerate(counts) if n is None]
    if unknown:
      with concurrent.futures.ThreadPoolExecutor(min(16, len(unknown))) as pool:
        results = list(pool.map(lambda i: _count_records(self._paths[i], reader_options), unknown))
      for i, (n, writer_options) in zip(unknown, results):
        counts[i] = n
        _warn_group_size(self._paths[i], writer_options)
    if len(unknown) < len(counts):
      # Counts came from a manifest; still fail fast on a wrong or missing file
      # rather than in the middle of training.
      first = next(i for i, n in enumerate(self._expected) if n is not None)
      n, writer_options = _count_records(self._paths[first], reader_options)
      self._check_count(first, n)
      _warn_group_size(self._paths[first], writer_options)
    self._counts = np.asarray(counts, dtype=np.int64)
    self._ends = np.cumsum(self._counts)
    self._starts = self._ends - self._counts
    self._len = int(self._ends[-1]) if len(self._ends) else 0
    self._init_process_state()

  @classmethod
  def from_tfds(cls, dataset_dir: str | os.PathLike, split: str, **kwargs: Any) -> ArrayRecordSource:
    """The ArrayRecord shards of a TFDS dataset version folder's `split`.

    Args:
      dataset_dir: The folder holding `dataset_info.json` (e.g.
        ~/tensorflow_datasets/mnist/3.0.1), converted to array_record.
      split: A split name, or several joined with '+' ('train+validation').
      **kwargs: Passed to `ArrayRecordSource` (e.g. `reader_options`).
    """
    from loader import tfds  # pylint: disable=g-import-not-at-top

    return cls(tfds.tfds_array_record_files(os.path.expanduser(os.fspath(dataset_dir)), split), **kwargs)

  def _init_process_state(self) -> None:
    self._readers: list[Any] = [None] * len(self._paths)
    self._span_readers: list[Any] = [None] * len(self._paths)
    self._lock = threading.Lock()
    self._pid = os.getpid()

  def _check_count(self, file_index: int, n: int) -> None:
    expected = self._expected[file_index]
    if expected is not None and n != expected:
      raise ValueError(
          f"{self._local_path(file_index)} has {n} records but its manifest says "
          f"{expected}; the manifest is stale or the file was replaced. Check the dataset with arrayrecord-verify, "
          "then rerun the conversion with --skip-existing (delete this file first if verify fails it) to rewrite "
          "the manifest.")

  @property
  def paths(self) -> list[str]:
    """The files, in record order."""
    return list(self._paths)

  @property
  def records_per_file(self) -> list[int]:
    return self._counts.tolist()

  def __len__(self) -> int:
    return self._len

  def __repr__(self) -> str:
    # The repr names the source in checkpoints (MapDataset states, DataLoader
    # states): files_hash tells other files, or the same files in another
    # order, apart even with equal counts (see _files_hash).
    return (f"ArrayRecordSource({len(self._paths)} files, {self._len} records, files_hash={self._files_hash()}"
            f"{self._content_part()})")

  def _content_part(self) -> str:
    """", content_hash=..." of the repr; nothing while describing a pipeline as states saved before it did,
    or where a file cannot be read now (a state saved then resumes as one saved before content hashes)."""
    from loader import state as state_lib  # pylint: disable=g-import-not-at-top
    if state_lib.describing_without_content_hashes():
      return ""
    content = self._content_hash()
    return "" if content is None else f", content_hash={content}"

  def _files_hash(self) -> str:
    """8 hex digits of the files' names (not directories) and record counts, in order.

    Names rather than paths, so a dataset copied elsewhere (another mount, a
    local copy of a bucket) resumes its checkpoints.
    """
    cached = self.__dict__.get("_files_hash_value")
    if cached is None:  # Once: checkpoints call repr on every get_state, and sources may have 10k files.
      names = "\n".join(f"{os.path.basename(p.rstrip('/'))}:{n}" for p, n in zip(self._paths, self._counts.tolist()))
      cached = self._files_hash_value = hashlib.sha1(names.encode()).hexdigest()[:8]
    return cached

  def _content_hash(self) -> str | None:
    """8 hex digits of the files' sizes and their first and last 4 KiB, in order.

    Tells apart files of the same names and record counts that hold other
    records (regenerated with another seed, re-converted from other input),
    so a checkpoint is not resumed on them. The head holds the first chunk's
    header with its data hash and the tail the index of chunk offsets; the
    whole files are not read (10k files cost 80 MB, not terabytes). None
    (and not cached: the next call reads again) where a file cannot be read
    now, e.g. with no file descriptor left: a hash of the error would name
    other content, and every state saved with it would be refused.
    """
    cached = self.__dict__.get("_content_hash_value")
    if cached is None:
      digest = hashlib.blake2b(digest_size=4)
      for i in range(len(self._paths)):
        ends = _file_ends(self._local_path(i))
        if ends is None:
          return None
        digest.update(ends)
      cached = self._content_hash_value = digest.hexdigest()
    return cached

  def __getstate__(self):
    state = self.__dict__.copy()
    del state["_readers"], state["_span_readers"], state["_lock"], state["_pid"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._init_process_state()

  def _reader(self, file_index: int, span: bool = False):
    if self._pid != os.getpid():
      # Forked: the parent's readers (and possibly a held lock) are not ours.
      self._init_process_state()
    readers = self._span_readers if span else self._readers
    reader = readers[file_index]
    if reader is None:
      with self._lock:
        reader = readers[file_index]
        if reader is None:
          self._check_unchanged(file_index)
          options = _span_options(self._reader_options) if span else self._reader_options
          reader = _open_reader(self._local_path(file_index), options)
          n = reader.num_records()
          self._check_count(file_index, n)
          if n != self._counts[file_index]:
            reader.close()
            raise self._changed(file_index, f"{n} records now, {self._counts[file_index]} before")
          readers[file_index] = reader
    return reader

  def _local_path(self, file_index: int) -> str:
    """The file's path as resolved when the source was created (whatever the working directory is now)."""
    absolute = self.__dict__.get("_abs_paths")  # None in a source pickled before it kept them.
    return self._paths[file_index] if absolute is None else absolute[file_index]

  def _check_unchanged(self, file_index: int, local: list[int] | None = None) -> None:
    now = ondisk.file_id(self._local_path(file_index))
    if now != self._ids[file_index]:
      # A folder, FIFO or broken link in its place was "replaced by another file" or "deleted".
      problem = ondisk.file_problem(self._local_path(file_index))
      change = ("now it " + problem.what.split(", not a regular file")[0]
                if problem is not None and problem.kind != "missing" else _describe_change(self._ids[file_index], now))
      raise self._changed(file_index, change, local)

  def _changed(self, file_index: int, change: str, local: list[int] | None = None) -> FileChangedError:
    """The error for a changed file, naming the first record of the read that found it."""
    first = local[0] if local else None
    return FileChangedError(self._local_path(file_index), change, first,
                            None if first is None else int(self._starts[file_index]) + first)

  def _spans(self, file_index: int, local: list[int]) -> bool:
    """Whether ascending `local` indices are read fastest as one span of the file."""
    if len(local) < 2:
      return False
    # The file's last 64 KiB block holds its postscript, not records.
    record_bytes = max(1, self._ids[file_index][2] - (64 << 10)) / max(1, int(self._counts[file_index]))
    span = (local[-1] - local[0] + 1) * record_bytes
    return span <= min(_MAX_SPAN_BYTES, len(local) * _SPAN_BYTES_PER_RECORD)

  def _read_file(self, file_index: int, local: list[int]) -> list[bytes]:
    """One batched read from one file, checked for changes and corruption.

    `local` is ascending when it has more than one index (see `read`).
    """
    try:
      reader = self._reader(file_index, span=self._spans(file_index, local))
    except FileChangedError as e:  # Found while opening: name the record this read wanted.
      raise self._changed(file_index, e.change, local) from None
    try:
      records = reader.read(local)
    except RuntimeError as e:
      self._check_unchanged(file_index, local)  # A truncated file reads as corrupt.
      raise self._corrupt(file_index, local, e) from e
    # Checked after the read: a file changed before or while reading never
    # returns what was read from it.
    self._check_unchanged(file_index, local)
    return records

  def _corrupt(self, file_index: int, local: list[int], error: RuntimeError) -> CorruptRecordError:
    # Only on failure: find the first record of the batch that cannot be read,
    # one record at a time.
    reader = self._reader(file_index)
    for i in sorted(set(local)):
      try:
        reader.read([i])
      except RuntimeError as e:
        return CorruptRecordError(self._local_path(file_index), i,
                                  int(self._starts[file_index]) + i, str(e))
    return CorruptRecordError(self._local_path(file_index), None, None, str(error))

  def _normalize(self, indices) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu" and idx.size:
      raise TypeError(f"Record indices must be integers (got dtype {idx.dtype}).")
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size:
      lo, hi = int(idx.min()), int(idx.max())
      if lo < -self._len or hi >= self._len:
        bad = lo if lo < -self._len else hi
        raise IndexError(f"Record index {bad} out of range for a source of {self._len} records.")
      if lo < 0:
        idx = np.where(idx < 0, idx + self._len, idx)
    return idx

  def read(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
    """Returns the records at `indices` (any order, repeats allowed) in that order.

    Issues one batched read per file touched, in ascending record order:
    ArrayRecordReader reads sorted indices ~10% faster than shuffled ones
    (8 files of 25k 1 KB records, 4-8k indices per call).
    """
    idx = self._normalize(indices)
    if idx.size == 1:  # ds[i] and per-element reads: half the cost of the general path.
      i = int(idx[0])
      f = int(np.searchsorted(self._ends, i, side="right"))
      return self._read_file(f, [i - int(self._starts[f])])
    return self._read_objects(idx).tolist()

  def _read_objects(self, idx: np.ndarray) -> np.ndarray:
    """`read` of normalized `idx`, as a 1-D object array (batches slice it without a list)."""
    n = idx.size
    out = np.empty(n, dtype=object)
    if n == 0:
      return out
    order = np.argsort(idx)
    ordered = idx[order]
    # Files are consecutive index ranges: each file's share is one run of `ordered`.
    first, last = np.searchsorted(self._ends, ordered[[0, -1]], side="right").tolist()
    cuts = np.searchsorted(ordered, self._ends[first:last], side="left").tolist()
    runs = [(f, lo, hi) for f, lo, hi in zip(range(first, last + 1), [0, *cuts], [*cuts, n])
            if hi > lo]
    read_run = lambda run: self._read_file(
        run[0], (ordered[run[1]:run[2]] - self._starts[run[0]]).tolist())
    threads = getattr(_parallel, "threads", 1)
    if threads > 1 and len(runs) > 1:
      # ArrayRecordReader.read releases the GIL: files are read side by side,
      # and each file's records are placed while later files are still read.
      results = _read_pool(threads).map(read_run, runs)
    else:
      results = map(read_run, runs)
    for (_, lo, hi), records in zip(runs, results):
      # Assigning into an object array from a list keeps each bytes object.
      out[order[lo:hi]] = records
    return out

  def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
    return self.read(indices)

  # Grain's batched-source protocol (SupportsBatchedReadRandomAccessDataSource).
  _getitems = __getitems__

  def __getitem__(self, index: SupportsIndex) -> bytes:
    i = checks.record_index(index)
    if not -self._len <= i < self._len:
      raise IndexError(f"Record index {i} out of range for a source of {self._len} records.")
    return self.read([i])[0]

  def close(self) -> None:
    """Closes this process's readers; they reopen on the next read."""
    with self._lock:
      for reader in self._readers + self._span_readers:
        if reader is not None:
          reader.close()
      self._readers = [None] * len(self._paths)
      self._span_readers = [None] * len(self._paths)

  def __enter__(self) -> ArrayRecordSource:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _owner(cls: type, name: str) -> type | None:
  """The class in `cls`'s MRO that defines attribute `name`."""
  return next((c for c in cls.__mro__ if name in vars(c)), None)


# Packages whose sources' `__getitems__` returns exactly what `__getitem__`
# returns index by index. Elsewhere it may not: a Hugging Face dataset with a
# transform pads each batch to its longest row. Grain 0.2.18 reads user
# sources by index only, so we use another `__getitems__` only from these.
_EXACT_GETITEMS_PACKAGES = ("array_record.", "grain.", "tensorflow_datasets.")


def may_yield_none(source: Any) -> bool:
  """Whether `source[i]` may be None for some i (checked for Python sequences, trusted for known sources)."""
  if isinstance(source, (ArrayRecordSource, range)):
    return False
  if isinstance(source, np.ndarray):
    return source.dtype == object and any(x is None for x in source.flat)
  if type(source) in (list, tuple):
    return any(x is None for x in source)
  # Loader's, array_record's, Grain's and TFDS's sources give records, never None.
  module = type(source).__module__
  return not (module.startswith(_EXACT_GETITEMS_PACKAGES) or module.split(".")[0] == "loader")


def _batched_method(source: Any) -> str | None:
  """The name of `source`'s batched read that agrees with its `__getitem__`, if any.

  That is `read` of an ArrayRecordSource, Grain's batched-read protocol
  (`_getitems`, which promises index-by-index elements), or `__getitems__`
  of array_record's, Grain's and TFDS's own sources. A subclass that
  overrides `__getitem__` (to decode records, say) but inherits the batched
  read would return different elements by batch than by index; Grain reads
  such a source by index, and so do we.
  """
  cls = type(source)
  getitem_owner = _owner(cls, "__getitem__")
  names = ("read", "__getitems__", "_getitems") if isinstance(source, ArrayRecordSource) else (
      "__getitems__", "_getitems")
  for name in names:
    owner = _owner(cls, name)
    if owner is None or getitem_owner is None or not issubclass(owner, getitem_owner):
      continue
    if (name == "__getitems__" and not isinstance(source, ArrayRecordSource)
        and not owner.__module__.startswith(_EXACT_GETITEMS_PACKAGES)):
      continue
    return name
  return None


class BatchedSource:
  """Gives any random-access source the batched `read(indices)` of ArrayRecordSource.

  Uses the wrapped source's own batched read when it has one (`read` of an
  ArrayRecordSource, `__getitems__` as in Grain's ArrayRecordDataSource and
  `tfds.data_source`, or Grain's `_getitems`) and it is defined alongside or
  below the source's `__getitem__`; otherwise, and for a single index (as
  Grain's `ds[i]` does), one `__getitem__` per index.
  """

  def __init__(self, source: Any):
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
      raise TypeError(
          "A data source needs __len__ and __getitem__ (the random-access "
          f"protocol); got {type(source).__name__}.")
    self.source = source
    self._batched = _batched_method(source)
    self._batched_works: bool | None = None  # Unknown until its first call.
    # An ArrayRecordSource whose reads are its own can give batches the
    # reader's object array directly (see read_array).
    cls = type(source)
    self._objects = (isinstance(source, ArrayRecordSource) and cls.read is ArrayRecordSource.read
                     and cls.__getitem__ is ArrayRecordSource.__getitem__)
    # A source whose __getitem__ ignores its index streams: it cannot read a
    # record again, so the records of a failed try are kept (see read).
    self._streams = self._batched is None and ignores_index(source)
    # (key, record) pairs kept from a failed try, per reading thread: the
    # engine may compute slices of a chunk side by side.
    self._read_before_failure = threading.local()

  def __len__(self) -> int:
    return len(self.source)

  def __repr__(self) -> str:
    return repr(self.source)

  @property
  def streams(self) -> bool:
    """Whether the source ignores the index it is asked and returns its next record."""
    return self._streams

  @property
  def reads_by_index(self) -> bool:
    """Whether a read surely returns the records of the indices asked: a batched
    read we trust (above) or a Python sequence, not a user source that might
    stream (ignore the index and return the next record)."""
    return self._batched is not None or type(self.source) in (range, list, tuple, np.ndarray)

  def read_array(self, indices: np.ndarray) -> np.ndarray | None:
    """The records at `indices` as an object array, for an ArrayRecordSource whose reads are its own; else None."""
    if not self._objects:
      return None
    src = self.source
    with _batched_read():
      return src._read_objects(src._normalize(indices))  # pylint: disable=protected-access

  def read(self, indices: np.ndarray) -> list[Any]:
    src = self.source
    if self._batched == "read":
      with _batched_read():
        return src.read(indices)  # Takes the array as it is: no round trip through a list.
    keys = np.asarray(indices, dtype=np.int64).tolist()
    if self._batched is not None and len(keys) > 1 and self._batched_works is not False:
      with _batched_read():
        if self._batched_works:
          out = list(getattr(src, self._batched)(keys))
        else:
          try:
            out = list(getattr(src, self._batched)(keys))
          except TypeError:
            # A `__getitems__` that fails on its first call, as that of
            # `tfds.testing.mock_data`'s sources (it cannot take the keys):
            # Grain reads by index only, so such a source works there; it is
            # read by index here too (a real error comes back from `__getitem__`).
            if self._batched != "__getitems__":
              raise
            out = None
        if out is not None and len(out) == len(keys):
          self._batched_works = True
          return out
        if out is not None:
          # Not one record per index (one skipped or added, a batch of
          # columns): the records after it would shift to other positions, and
          # differ with the chunking, that is with the worker count. Grain
          # 0.2.18 reads a source by index: so is this one from now on.
          warnings.warn(
              f"{type(src).__name__}.{self._batched} returned {len(out)} records for {len(keys)} indices; the "
              "source is read one index at a time instead (as Grain reads it), which is slower. Make "
              f"{self._batched} return one record per index, in their order.", RuntimeWarning, stacklevel=2)
        self._batched_works = False
    if not self._streams:
      return [src[i] for i in keys]  # A retry reads again: the same records, fresh.
    kept = self._kept()
    log = getattr(_reads_log, "current", None)
    noted = log.setdefault(self, []) if log is not None else None
    out = []
    for i in keys:
      if kept and kept[0][0] == i:
        record = kept.popleft()[1]
        if isinstance(record, _Raised):
          if noted is not None:
            noted.append((i, record))  # Kept again if this try fails too: a later retry raises here as well.
          raise record.error  # Where the stream raised on the first try: the retry raises there too.
      else:
        kept.clear()
        try:
          record = src[i]
        except Exception as e:
          if noted is not None:
            noted.append((i, _Raised(e)))
          raise
      if noted is not None:
        # A map that sets a key of its input (d["x"] = ...) must not see its own output on the retry.
        noted.append((i, copy.copy(record) if isinstance(record, (dict, list)) else record))
      out.append(record)
    return out

  def _kept(self) -> collections.deque[tuple[int, Any]]:
    """This thread's (key, record) pairs kept from a failed try (see reads_kept_on_failure)."""
    kept = getattr(self._read_before_failure, "pairs", None)
    if kept is None:
      kept = self._read_before_failure.pairs = collections.deque()
    return kept

  def _keep(self, pairs: list[tuple[int, Any]]) -> None:
    kept = self._kept()
    kept.extendleft(reversed(pairs))  # Before what is left of an earlier try: those keys come later.

  def __getstate__(self):
    state = self.__dict__.copy()
    del state["_read_before_failure"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._read_before_failure = threading.local()
