"""Writes files so that the final name appears only once the file is complete.

ArrayRecordWriter only takes a local path. Local outputs are written to a
hidden temp file beside the final one and renamed (atomic on POSIX). Remote
outputs (gs://...) are written to a local temp file, uploaded to a hidden
temp object beside the final one, then renamed through Beam FileSystems.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import uuid

from converter.naming import split_uri

_COPY_CHUNK = 16 << 20


def is_local(path: str) -> bool:
  return split_uri(path)[0] == ""


def _temp_name(final_path: str) -> str:
  head, tail = posixpath.split(final_path)
  return posixpath.join(head, f".{tail}.tmp-{uuid.uuid4().hex[:12]}")


def exists(path: str) -> bool:
  if is_local(path):
    return os.path.exists(path)
  from apache_beam.io.filesystems import FileSystems
  return FileSystems.exists(path)


def file_size(path: str) -> int:
  if is_local(path):
    return os.path.getsize(path)
  from apache_beam.io.filesystems import FileSystems
  return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def publish(local_tmp: str, final_path: str) -> None:
  """Moves a finished local file to final_path; the final name appears last."""
  if is_local(final_path):
    os.makedirs(os.path.dirname(os.path.abspath(final_path)), exist_ok=True)
    os.replace(local_tmp, final_path)
    return
  from apache_beam.io.filesystems import FileSystems
  remote_tmp = _temp_name(final_path)
  try:
    with open(local_tmp, "rb") as src, FileSystems.create(remote_tmp) as dst:
      shutil.copyfileobj(src, dst, _COPY_CHUNK)
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


def _silent_delete(path: str) -> None:
  try:
    from apache_beam.io.filesystems import FileSystems
    if FileSystems.exists(path):
      FileSystems.delete([path])
  except Exception:  # pylint: disable=broad-except
    pass  # Best effort: a hidden temp object never shadows a final name.


def local_temp_path(final_path: str) -> str:
  """A local path to write to before publish(): beside the final file if local."""
  if is_local(final_path):
    parent = os.path.dirname(os.path.abspath(final_path))
    os.makedirs(parent, exist_ok=True)
    return _temp_name(os.path.abspath(final_path))
  fd, path = tempfile.mkstemp(prefix="arrayrecord-", suffix=".tmp")
  os.close(fd)
  return path


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes a small file (the manifest) under its final name in one step."""
  tmp = local_temp_path(path)
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    publish(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def read_bytes(path: str) -> bytes:
  if is_local(path):
    with open(path, "rb") as f:
      return f.read()
  from apache_beam.io.filesystems import FileSystems
  with FileSystems.open(path) as f:
    return f.read()


class ArrayRecordShardWriter:
  """Context manager: write records, then commit() publishes the file.

  Leaving the block without commit() (an exception, a corrupt input) removes
  the temp file, so a failed or retried attempt never leaves a partial file
  under the final name.
  """

  def __init__(self, final_path: str, writer_options: str):
    self.final_path = final_path
    self.writer_options = writer_options
    self._tmp: str | None = None
    self._writer = None
    self.bytes_out = 0

  def __enter__(self) -> ArrayRecordShardWriter:
    from array_record.python.array_record_module import ArrayRecordWriter
    self._tmp = local_temp_path(self.final_path)
    self._writer = ArrayRecordWriter(self._tmp, self.writer_options)
    self.write = self._writer.write
    return self

  def commit(self) -> int:
    """Closes the writer and publishes the file; returns its size in bytes."""
    self._writer.close()
    self._writer = None
    self.bytes_out = os.path.getsize(self._tmp)
    publish(self._tmp, self.final_path)
    self._tmp = None  # Only now: if publishing fails, __exit__ removes the temp file.
    return self.bytes_out

  def __exit__(self, *exc) -> None:
    if self._writer is not None:
      self._writer.close()
    if self._tmp is not None and os.path.exists(self._tmp):
      os.remove(self._tmp)
