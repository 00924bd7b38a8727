"""Errors a user can act on: each names the file, the place and what to do."""

from __future__ import annotations


class ConversionError(Exception):
  """Base class for errors raised by the converter."""

  # Beam re-raises a DoFn's exception as `type(exn)(message + step, ...)`,
  # which would pass our message where a path or pattern belongs. Our messages
  # already name the file, so let Beam re-raise them unchanged.
  _tagged_with_step = True

  def __reduce__(self):
    # Rebuild from args and fields; __init__ takes fields, not the message.
    return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
  e = cls.__new__(cls)
  e.args = args
  e.__dict__.update(state)
  return e


class CorruptRecordError(ConversionError):
  """A TFRecord record failed its length or data checksum, or was cut short."""

  def __init__(self, path: str, record_index: int, offset: int, reason: str,
               compressed: bool = False):
    self.path = path
    self.record_index = record_index
    self.offset = offset
    self.reason = reason
    where = "byte offset (in the decompressed stream)" if compressed else "byte offset"
    super().__init__(
        f"{path}: record {record_index} at {where} {offset} is corrupt: {reason}. "
        "Nothing was written for this file. Re-create or re-download the file, "
        "or convert with on_corrupt='skip' (CLI: --on-corrupt skip) to keep the "
        "readable records and count the rest as skipped.")


class NoInputFilesError(ConversionError):
  """An input pattern matched no files."""

  def __init__(self, pattern: str):
    self.pattern = pattern
    super().__init__(
        f"No files match the input pattern {pattern!r}. Check the path and the "
        "glob (quote it so your shell does not expand it).")


class OutputExistsError(ConversionError):
  """Outputs exist and neither overwrite nor skip was asked for."""

  def __init__(self, paths: list[str]):
    self.paths = list(paths)
    shown = ", ".join(self.paths[:5]) + (f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else "")
    super().__init__(
        f"{len(self.paths)} output file(s) already exist: {shown}. Nothing was "
        "converted. Pass existing='overwrite' (CLI: --overwrite) to replace "
        "them, or existing='skip' (CLI: --skip-existing) to keep them and "
        "convert only the missing shards.")
