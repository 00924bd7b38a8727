"""Writes files so that the final name appears only once the file is complete.

ArrayRecordWriter only takes a local path. Local outputs are written to a
hidden temp file beside the final one (named after its owner, see
loader.ondisk.temp_name) and published without clobbering a file another run
wrote meanwhile. Remote outputs (gs://...) are written to a local temp file,
uploaded to a hidden temp object beside the final one, then renamed through
Beam FileSystems.
"""

from __future__ import annotations

import dataclasses
import errno
import filecmp
import functools
import os
import re
import shutil
import tempfile
from typing import Any

from converter.errors import ClobberedOutputError, ConversionError, OutputWriteError, is_remote_not_found
from converter.naming import split_uri
from loader import ondisk
from loader.ondisk import REPLACE_ANY, is_local

_COPY_CHUNK = 16 << 20
# OS errors a writer reports only as text (ArrayRecordWriter raises RuntimeError).
_NAMED_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES,
                 errno.EPERM, errno.EIO, errno.ENOENT)

__all__ = ["REPLACE_ANY", "ArrayRecordShardWriter", "exists", "file_size", "is_local",
           "local_temp_path", "output_identity", "publish", "read_bytes", "read_head", "write_bytes_atomic"]


def os_reason(error: BaseException) -> str:
  """An OS error as `[Errno 28] No space left on device`, also from a writer's message."""
  if isinstance(error, OSError) and error.errno:
    return f"[Errno {error.errno}] {error.strerror or os.strerror(error.errno)}"
  text = str(error)
  for code in _NAMED_ERRNOS:
    if os.strerror(code) in text:
      return f"[Errno {code}] {os.strerror(code)}"
  return text.split(";")[0].strip() or type(error).__name__


def missing_bucket(path: str) -> str | None:
  """The bucket of a gs:// path if it does not exist, else None (also when that cannot be told)."""
  scheme, rest = split_uri(path)
  if scheme != "gs://":
    return None
  bucket = rest.split("/", 1)[0]
  try:
    from apache_beam.io.filesystems import FileSystems
    client = FileSystems.get_filesystem(path)._gcsIO().client  # pylint: disable=protected-access
    # One try, no retries: a server that cannot be reached must not add Beam's two minutes of retrying.
    found = client.lookup_bucket(bucket, retry=None, timeout=20)
  except Exception:  # pylint: disable=broad-except  # No permission to look, a network error: the work says.
    return None
  return bucket if found is None else None


def exists(path: str) -> bool:
  if is_local(path):
    return os.path.exists(path)
  from apache_beam.io.filesystems import FileSystems
  return FileSystems.exists(path)


def file_size(path: str) -> int:
  if is_local(path):
    return os.path.getsize(path)
  from apache_beam.io.filesystem import BeamIOError
  from apache_beam.io.filesystems import FileSystems
  # The object itself, not a match: a glob takes the '[1]' of `gs://b/run[1]/x.tfrecord` for a character class,
  # so an input a listing had just found (and its output, named after it) was "No such file or object".
  try:
    return FileSystems.get_filesystem(path).metadata(path).size_in_bytes
  except BeamIOError as e:
    if is_remote_not_found(e):
      raise FileNotFoundError(errno.ENOENT, "No such file or object", path) from None
    raise


def remote_folder_listing(folder: str) -> dict[str, Any]:
  """{name: Beam FileMetadata} of the objects directly in a remote (gs://) folder.

  The folder's name is escaped for Beam's glob ('[', '*' and '?' in it are meant literally), and the one
  listing under it is filtered here: Beam's `*` never matches a backslash, and left such objects out.
  """
  import glob  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  prefix = folder.rstrip("/") + "/"
  found = FileSystems.match([glob.escape(prefix) + "**"])[0].metadata_list
  names = ((m.path[len(prefix):], m) for m in found if m.path.startswith(prefix))
  return {name: m for name, m in names if name and "/" not in name}


def output_identity(path: str) -> Any:
  """What publish() may replace at `path`: None if nothing is there.

  Local files are identified by inode, size and mtime, so a file another run
  published after planning is never replaced. Remote objects can only be told
  apart by existence here (see the converter README on gs:// limits).
  """
  if is_local(path):
    return ondisk.file_id(path)
  return REPLACE_ANY if exists(path) else None


def publish(local_tmp: str, final_path: str, expect: Any = REPLACE_ANY) -> None:
  """Moves a finished local file to final_path; the final name appears last.

  Args:
    local_tmp: The finished file (from local_temp_path).
    final_path: Its final name.
    expect: What may be at final_path (output_identity() at planning time):
      None means nothing, so a file that appeared meanwhile is never replaced.

  Raises:
    ClobberedOutputError: final_path is not what `expect` says.
  """
  if is_local(final_path):
    os.makedirs(os.path.dirname(ondisk.local_abspath(final_path)), exist_ok=True)
    try:
      ondisk.publish_local(local_tmp, final_path, expect)
    except ondisk.ClobberError as e:
      # A retried bundle (or a twin run) that wrote the very same bytes is no
      # clobbering: keep the file that is there.
      if not filecmp.cmp(local_tmp, final_path, shallow=False):
        raise ClobberedOutputError(str(e)) from None
      os.remove(local_tmp)
    return
  from apache_beam.io.filesystems import FileSystems
  remote_tmp = ondisk.temp_name(final_path)
  try:
    with open(local_tmp, "rb") as src, FileSystems.create(remote_tmp) as dst:
      shutil.copyfileobj(src, dst, _COPY_CHUNK)
    # A runner retrying a bundle after its publish finds its own output there:
    # the same size (conversion is deterministic) is taken as that case.
    if expect is None and FileSystems.exists(final_path) and \
        file_size(final_path) != os.path.getsize(local_tmp):
      raise ClobberedOutputError(str(ondisk.ClobberError(final_path)))
    # A GCS rename is a server-side copy that replaces the destination in one
    # step, so an overwritten output is never missing; elsewhere make room first.
    if split_uri(final_path)[0] != "gs://" and FileSystems.exists(final_path):
      FileSystems.delete([final_path])
    FileSystems.rename([remote_tmp], [final_path])
  except BaseException:
    _silent_delete(remote_tmp)
    raise
  finally:
    os.remove(local_tmp)


def remove(path: str) -> None:
  """Deletes a file or object (local or remote); nothing if it is gone already."""
  if is_local(path):
    try:
      os.remove(path)
    except FileNotFoundError:
      pass
    return
  from apache_beam.io.filesystems import FileSystems
  if FileSystems.exists(path):
    FileSystems.delete([path])


def _silent_delete(path: str) -> None:
  try:
    from apache_beam.io.filesystems import FileSystems
    if FileSystems.exists(path):
      FileSystems.delete([path])
  except Exception:  # pylint: disable=broad-except
    pass  # Best effort: a hidden temp object never shadows a final name.


def local_temp_path(final_path: str, root: str | None = None) -> str:
  """A local path to write to before publish(): beside the final file if local.

  With `root` (the run's output folder), its subfolders are created as
  needed, but not `root` itself: gone, it was moved or deleted during the run.
  """
  if is_local(final_path):
    parent = os.path.dirname(ondisk.local_abspath(final_path))
    _check_root(root)
    os.makedirs(parent, exist_ok=True)
    return ondisk.temp_name(ondisk.local_abspath(final_path))
  return staging_file()


def _open_dir(path: str) -> int | None:
  try:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  except OSError:
    return None  # Removed by path then.


def _check_root(root: str | None) -> None:
  if root is not None and is_local(root) and not os.path.isdir(root):
    raise FileNotFoundError(errno.ENOENT, f"the output folder {root} is gone (moved or deleted while this run "
                                          "wrote it?)", root)


# Local copies of remote files: `arrayrecord-<pid>-<random>@<host>.tmp` in
# $TMPDIR, so that what a killed (kill -9) run left is known to be nobody's and
# removed (by a process of the same host and pid namespace: see ondisk._hostname).
_STAGING_RE = re.compile(r"arrayrecord-(\d+)-[^/@]*(?:@(?P<host>[^/@]+))?\.tmp\Z")
_swept = False


def staging_file() -> str:
  """A new empty local file (in $TMPDIR) for a copy of a remote file; the caller removes it."""
  global _swept
  if not _swept:
    _swept = True
    sweep_dead_staging(tempfile.gettempdir())
  me = ondisk.this_process()
  fd, path = tempfile.mkstemp(prefix=f"arrayrecord-{me.pid}-", suffix=f"@{me.host}.tmp")
  os.close(fd)
  return path


def sweep_dead_staging(directory: str) -> None:
  """Removes the staging files in `directory` of processes (on this host) that no longer run."""
  here = ondisk.this_process()
  try:
    names = os.listdir(directory)
  except OSError:
    return
  staged = []
  for name in names:
    m = _STAGING_RE.match(name)
    if m:  # A name without a host is an older version's: taken as this host's.
      owner = dataclasses.replace(here, pid=int(m[1]), start=0, host=m["host"] or here.host)
      staged.append((os.path.join(directory, name), owner))
  ondisk.remove_dead_owners(staged, keep_going_on=OSError)  # Skipping another user's, or one already gone.


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes a small file (the manifest) under its final name in one step."""
  try:
    if is_local(path):
      os.makedirs(os.path.dirname(ondisk.local_abspath(path)), exist_ok=True)
      ondisk.write_bytes_atomic(path, data)
      return
    tmp = local_temp_path(path)
    try:
      with open(tmp, "wb") as f:
        f.write(data)
      publish(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  except OSError as e:
    raise OutputWriteError(path, os_reason(e)) from e


def read_head(path: str, n: int) -> bytes:
  """The first `n` bytes of a file or object (fewer if it is shorter): one small ranged read on gs://."""
  if is_local(path):
    return ondisk.read_local(path, n)
  # FileSystems.open would fetch a 16 MB buffer for these few bytes.
  with _gcsio().open(path, read_buffer_size=max(1, n)) as f:
    return f.read(n)


@functools.lru_cache(maxsize=1)
def _gcsio() -> Any:
  from apache_beam.io.gcp import gcsio
  return gcsio.GcsIO()


def read_bytes(path: str) -> bytes:
  if is_local(path):
    return ondisk.read_local(path)
  from apache_beam.io.filesystems import FileSystems
  with FileSystems.open(path) as f:
    return f.read()


class ArrayRecordShardWriter:
  """Context manager: write records, then commit() publishes the file.

  Leaving the block without commit() (an exception, a corrupt input, Ctrl-C)
  removes the temp file, even when closing the writer fails (a full disk), so
  a failed or retried attempt never leaves a partial file under the final
  name or a stray temp file. A write that fails (disk full, permissions)
  raises OutputWriteError naming the final file and the OS error.
  """

  def __init__(self, final_path: str, writer_options: str, expect: Any = REPLACE_ANY, root: str | None = None):
    self.final_path = final_path
    self.root = root  # The run's output folder: never re-created (see local_temp_path).
    self.writer_options = writer_options
    self.expect = expect
    self._tmp: str | None = None
    self._writer = None
    self.bytes_out = 0
    self.staged: str | None = None  # The written temp file, after commit(publish=False).
    self.temp_left: tuple[str, str] | None = None  # (temp file, why) when removing it failed.
    # The temp file's folder, held open: if the output folder is moved away mid-write, the temp
    # file is still removed where it now is, not looked for (and missed) under its old path.
    self._dir_fd: int | None = None

  def __enter__(self) -> ArrayRecordShardWriter:
    from array_record.python.array_record_module import ArrayRecordWriter
    try:
      self._tmp = local_temp_path(self.final_path, self.root)
      self._dir_fd = _open_dir(os.path.dirname(self._tmp))
      self._writer = ArrayRecordWriter(self._tmp, self.writer_options)
    except (OSError, RuntimeError) as e:
      self._remove_tmp()
      raise OutputWriteError(self.final_path, os_reason(e), temp_left=self.temp_left) from e
    self.write = self._writer.write
    return self

  def commit(self, publish_file: bool = True) -> int:
    """Closes the writer and publishes the file; returns its size in bytes.

    With publish_file=False the complete file stays under its temp name
    (`staged`), for the caller to publish with others as one set; it is then
    the caller's to remove.
    """
    writer, self._writer = self._writer, None
    try:
      writer.close()
      self.bytes_out = os.path.getsize(self._tmp)
      _check_root(self.root)
      if publish_file:
        publish(self._tmp, self.final_path, self.expect)
    except (OSError, RuntimeError) as e:
      raise OutputWriteError(self.final_path, os_reason(e)) from e
    except ConversionError:
      raise
    except Exception as e:
      # The GCS client's errors are no OSError: a bucket deleted mid-run gives a bare HTTP 404, a server
      # error a bare 5xx, neither naming the file.
      if is_local(self.final_path):
        raise
      # Only a 404 asks whether the bucket is gone (google-resumable-media's InvalidResponse, or NotFound).
      bucket = missing_bucket(self.final_path) if " 404" in f" {e}" else None
      if bucket is not None:
        raise OutputWriteError(
            self.final_path, f"its bucket gs://{bucket} does not exist any more (deleted during the run?)",
            fix=f"create the bucket again (gcloud storage buckets create gs://{bucket}) or convert into "
                "another --output", resume="rerun (the shards written before went with the bucket)") from e
      detail = (str(e).strip().splitlines() or [""])[0][:300]
      raise OutputWriteError(
          self.final_path, f"the upload failed ({type(e).__name__}{': ' + detail if detail else ''})",
          fix="check the bucket, your access to it and the connection (a server error often passes)") from e
    # Only now: if publishing fails, __exit__ removes the temp file.
    self.staged, self._tmp = (None if publish_file else self._tmp), None
    self._close_dir()
    return self.bytes_out

  def _close_dir(self) -> None:
    fd, self._dir_fd = self._dir_fd, None
    if fd is not None:
      os.close(fd)

  def _remove_tmp(self) -> None:
    tmp, self._tmp = self._tmp, None
    fd = self._dir_fd
    try:
      if tmp is None:
        return
      if fd is not None:
        os.remove(os.path.basename(tmp), dir_fd=fd)
      else:
        os.remove(tmp)
    except FileNotFoundError:
      pass
    except OSError as e:  # An immutable folder, a read-only filesystem: the next run removes it (a dead run's temp).
      self.temp_left = (tmp, os_reason(e))
    finally:
      self._close_dir()

  def __exit__(self, exc_type, exc, tb) -> None:
    try:
      if self._writer is not None:
        writer, self._writer = self._writer, None
        try:
          writer.close()
        except (RuntimeError, MemoryError):
          pass  # Already failing (a full disk; std::bad_alloc again, after the write's); the temp file goes anyway.
    finally:
      self._remove_tmp()
    # ArrayRecordWriter.write reports a full disk as a RuntimeError.
    if isinstance(exc, RuntimeError) and not isinstance(exc, ConversionError):
      raise OutputWriteError(self.final_path, os_reason(exc), temp_left=self.temp_left) from exc
    if isinstance(exc, OutputWriteError) and self.temp_left is not None and exc.temp_left is None:
      # Its message said the temp file went: it did not.
      raise OutputWriteError(exc.path, exc.reason, exc.resume, temp_left=self.temp_left) from exc.__cause__
