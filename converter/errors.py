"""Errors a user can act on: each names the file, the place and what to do."""

from __future__ import annotations

import re
import signal as _signal

try:  # Imported now: with no memory left, as when it is needed, an import can fail too.
  import resource as _resource
except ImportError:  # Not on every platform.
  _resource = None


class ConversionError(Exception):
  """Base class for errors raised by the converter."""

  # The CLIs' exit status: 2 for what is found before any work (usage,
  # inputs, outputs); subclasses found while converting say 1.
  exit_code = 2

  # Beam re-raises a DoFn's exception as `type(exn)(message + step, ...)`,
  # which would pass our message where a path or pattern belongs. Our messages
  # already name the file, so let Beam re-raise them unchanged.
  _tagged_with_step = True

  def __reduce__(self):
    # Rebuild from args and fields; __init__ takes fields, not the message.
    return (_rebuild, (type(self), self.args, self.__dict__))

  def __str__(self) -> str:
    return escape_controls(super().__str__())


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def escape_controls(text: str) -> str:
  """`text` with control characters shown as escapes (`\\n`, `\\x1b`).

  Linux allows a newline in a file name: printed raw, it would split the
  error's one line in two, and a worker's error (read back from its traceback
  text line by line) would be cut at the name, losing record, offset and advice.
  """
  return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _rebuild(cls, args, state):
  e = cls.__new__(cls)
  e.args = args
  e.__dict__.update(state)
  return e


class CorruptRecordError(ConversionError):
  """A TFRecord record failed its length or data checksum, or was cut short."""

  exit_code = 1

  def __init__(self, path: str, record_index: int, offset: int, reason: str,
               compressed: bool = False, skipping: bool = False):
    self.path = path
    self.record_index = record_index
    self.offset = offset
    self.reason = reason
    where = "byte offset (in the decompressed stream)" if compressed else "byte offset"
    advice = ("Re-create or re-download the file." if skipping else
              "Re-create or re-download the file, or convert with on_corrupt='skip' (CLI: --on-corrupt "
              "skip) to keep the readable records and count the rest as skipped.")
    super().__init__(
        f"{path}: record {record_index} at {where} {offset} is corrupt: {reason}. "
        f"Nothing was written for this file. {advice}")


def _memory_limit() -> str:
  """ulimit -v as ' (this process may use at most N MiB: `ulimit -v`)', or '' when unlimited."""
  if _resource is None:
    return ""
  try:
    soft = _resource.getrlimit(_resource.RLIMIT_AS)[0]
  except (OSError, ValueError):
    return ""
  return "" if soft == _resource.RLIM_INFINITY else f" (this process may use at most {soft >> 20:,} MiB: `ulimit -v`)"


class RecordMemoryError(ConversionError, MemoryError):
  """A record that did not fit in the converting process's memory (a MemoryError while it was read or written).

  A MemoryError too, so code that handles running out of memory keeps handling it.
  """

  exit_code = 1  # Found while converting: shards may have been written.

  def __init__(self, path: str, record_index: int, offset: int | None, length: int | None,
               compressed: bool = False):
    self.path, self.record_index, self.offset, self.length = path, record_index, offset, length
    self.compressed = compressed
    where = "" if offset is None else \
        f" at {'decompressed byte offset' if compressed else 'byte offset'} {offset}"
    size = "" if length is None else f" ({length:,} data bytes)"
    # What happened, without advice (arrayrecord-verify gives its own).
    self.what = f"{path}: record {record_index}{where}{size} did not fit in memory{_memory_limit()}"
    super().__init__(
        f"{self.what}. Give the run more "
        "memory (raise `ulimit -v` or the container's or job's memory limit, or use fewer --workers) and run it "
        "again; a conversion wrote nothing for this file and keeps the shards already written (rerun it with "
        "--skip-existing).")

  def __reduce__(self):
    # MemoryError's own __new__ refuses ConversionError's rebuild (cls.__new__(cls)); from the fields then.
    return (_rebuild_memory_error, (type(self), self.args, self.__dict__))


def _rebuild_memory_error(cls, args, state):
  e = cls(state["path"], state["record_index"], state["offset"], state["length"], state["compressed"])
  e.args = args  # The message as the process that raised it wrote it (its memory limit).
  e.__dict__.update(state)
  return e


class NotTFRecordError(CorruptRecordError):
  """An input's first bytes, and all bytes after them that were looked at, hold no TFRecord record."""

  def __init__(self, path: str, what: str, compressed: bool = False, skipping: bool = False):
    super().__init__(path, 0, 0, what, compressed=compressed, skipping=skipping)
    self.args = (f"{path} is not a TFRecord file: {what}. Nothing was written for this file. Give "
                 "only TFRecord files as inputs (narrow the --input pattern), or re-create the file if it "
                 "should be one.",)

  def __str__(self) -> str:
    return escape_controls(self.args[0])


class NoInputFilesError(ConversionError):
  """An input pattern matched no files."""

  def __init__(self, pattern: str, hint: str | None = None):
    self.pattern = pattern
    advice = hint or ("Check the path and the glob (quote it so your shell does not "
                      "expand it)")
    super().__init__(f"No files match the input pattern {pattern!r}. {advice}.")


class OutputExistsError(ConversionError):
  """Outputs exist and neither overwrite nor skip was asked for."""

  def __init__(self, paths: list[str], problem: str | None = None):
    self.paths = list(paths)
    shown = ", ".join(self.paths[:5]) + (f" and {len(self.paths) - 5} more" if len(self.paths) > 5 else "")
    if problem is None:
      super().__init__(
          f"{len(self.paths)} output file(s) already exist: {shown}. Nothing was "
          "converted. Pass existing='overwrite' (CLI: --overwrite) to replace "
          "them, or existing='skip' (CLI: --skip-existing) to keep them and "
          "convert only the missing shards.")
    else:
      super().__init__(
          f"{len(self.paths)} existing output file(s) {problem}: {shown}. Nothing was converted. "
          "Move them away, or pass existing='overwrite' (CLI: --overwrite) to replace them.")


class ManifestExistsError(OutputExistsError):
  """The output directory's manifest.json describes shards this run would drop from it."""

  def __init__(self, path: str, dropped: list[str] | None):
    self.paths = [path]
    if dropped is None:
      what = "exists"
      fix = ("Convert into another directory, or pass existing='overwrite' (CLI: --overwrite) to replace it, "
             "or existing='skip' (CLI: --skip-existing) to resume the run that wrote it")
    else:
      shown = ", ".join(dropped[:3]) + (f" and {len(dropped) - 3} more" if len(dropped) > 3 else "")
      what = f"lists {len(dropped)} shard(s) this run does not convert ({shown})"
      fix = ("Convert each dataset or split into its own directory, or pass existing='overwrite' "
             "(CLI: --overwrite) to write a manifest of this run's shards only")
    ConversionError.__init__(
        self, f"{path} {what}; this run would replace it, and the shards it lists would drop out of the "
        f"dataset. Nothing was converted. {fix}.")


class ForeignManifestError(OutputExistsError):
  """The output directory holds a manifest.json that the converter did not write."""

  def __init__(self, path: str, problem: str):
    self.paths = [path]
    ConversionError.__init__(
        self, f"{path} was not written by the converter ({problem}); this run would replace it "
        "with its own manifest. Nothing was converted. Move it out of the output directory or "
        "choose another --output, or pass existing='overwrite' (CLI: --overwrite) to replace it.")


class NewerManifestError(OutputExistsError):
  """The output directory's manifest.json was written by a newer arrayrecord-toolkit."""

  def __init__(self, path: str, problem: str):
    self.paths = [path]
    ConversionError.__init__(
        self, f"{path} was written by a newer arrayrecord-toolkit ({problem}); this run cannot tell which "
        "shards it lists and would replace it with its own manifest. Nothing was converted. Upgrade "
        "arrayrecord-toolkit to resume or extend that conversion, or pass existing='overwrite' (CLI: "
        "--overwrite) to replace it.")


class UnfinishedRunError(OutputExistsError):
  """manifest.json marks a run into this directory that did not finish (no flag given)."""

  def __init__(self, path: str, marker_message: str):
    self.paths = [path]
    ConversionError.__init__(
        self, f"{marker_message} Nothing was converted; pass existing='overwrite' (CLI: "
        "--overwrite) instead to convert everything again.")


class InputError(ConversionError):
  """An input that cannot be converted as given (a directory, a FIFO, a broken link...)."""

  def __init__(self, path: str, problem: str, fix: str):
    self.path, self.problem, self.fix = path, problem, fix
    super().__init__(f"Input {path} {problem}; {fix}.")


class InputChangedError(ConversionError):
  """An input that was there when the run was planned vanished, changed or became unreadable while converting."""

  exit_code = 1  # Found while converting: shards were already written.

  def __init__(self, path: str, problem: str):
    self.path, self.problem = path, problem
    gone = problem == "does not exist"
    changed = problem.startswith(("was replaced", "was modified"))
    what = "disappeared while converting (it was there when the run started)" if gone else \
        f"{problem} while converting"
    if changed:
      what = f"{problem}: it changed while it was converted, so its shard was not written"
    not_a_file = problem.startswith("was replaced by a folder") or \
        problem.startswith("was replaced by something that is not a regular file")
    fix = ("Put it back" if gone else "Put the file back in its place" if not_a_file else
           "Let whatever writes it finish" if changed else "Fix it")
    super().__init__(
        f"Input {path} {what}; the shards already written are kept. {fix}, then rerun with "
        "--skip-existing to convert the rest.")


class DamagedSinceError(ConversionError):
  """--skip-existing redid a shard whose input changed, and the input now loses records its output holds."""

  exit_code = 1  # Found while converting: shards were already written.

  def __init__(self, path: str, output: str, record_index: int, offset: int, skipped: int, truncated: bool):
    self.path, self.output, self.record_index, self.offset = path, output, record_index, offset
    lost = "is cut short or damaged to its end" if truncated else f"has {skipped} damaged record(s)"
    super().__init__(
        f"Input {path} changed since {output} was converted from it whole, and now {lost}, from record "
        f"{record_index} at byte offset {offset}; {output} was kept, not replaced, and the shards already "
        "written are kept. Restore or re-download the input and rerun with --skip-existing, or delete "
        f"{output} and rerun with --skip-existing to keep only the records still readable.")


class CompressionMismatchError(CorruptRecordError):
  """--compression names a format the file is not in (so record 0 cannot be read)."""

  exit_code = 2  # Usually found before any work, from the files' first bytes.

  def __init__(self, path: str, asked: str, found: str):
    self.path, self.asked, self.found = path, asked, found
    self.record_index, self.offset = 0, 0
    looks = "uncompressed" if found == "none" else f"{found}-compressed"
    self.reason = f"not {asked}-compressed (it looks {looks})"
    ConversionError.__init__(self, 
        f"{path} is not {asked}-compressed (it looks {looks}), but --compression {asked} "
        "was given. Use --compression auto (compression='auto') to detect it per file.")


class OutputError(ConversionError):
  """The output location cannot be used, found before any work starts."""


class KeptOutputError(OutputError):
  """An output a resume was to keep was deleted or damaged after the run planned it."""

  exit_code = 1  # Found while converting: shards may have been written.


class KeptOutputGoneError(KeptOutputError):
  """An output a resume was to keep was deleted after the run planned it."""

  def __init__(self, path: str):
    self.path = path
    super().__init__(f"{path} was to be kept (--skip-existing) but is gone (deleted during the run?); other "
                     "shards may have been converted already. Rerun with --skip-existing to convert it again.")


class OutputWriteError(ConversionError, OSError):
  """Writing an output failed (disk full, permissions); its temp file was removed.

  An OSError too, so code that handles I/O failures keeps handling it.
  """

  exit_code = 1

  def __init__(self, path: str, reason: str,
               resume: str = "rerun with --skip-existing to keep the shards already written",
               temp_left: tuple[str, str] | None = None, fix: str | None = None):
    self.path, self.reason, self.resume, self.temp_left = path, reason, resume, temp_left
    if temp_left is None:
      temp = "Its temp file was removed and no partial file was left under its name"
    else:  # E.g. an immutable folder: the temp cannot go, but must not be said to be gone.
      temp = (f"No partial file was left under its name, but its temp file {temp_left[0]} could not be removed "
              f"({temp_left[1]}; the next run into this folder removes it)")
    super().__init__(f"Cannot write {path}: {reason}. {temp}; {fix or write_fix(reason, path)}, then {resume}.")


def write_fix(reason: str, path: str | None = None) -> str:
  """What to do about a failed write, from the `[Errno N] ...` at the start of its reason."""
  import errno
  code = reason[len("[Errno "):].split("]", 1)[0] if reason.startswith("[Errno ") else ""
  if code == str(errno.ENOSPC) and path is not None and _no_free_inodes(path):
    return "the output's filesystem has no free inodes left (`df -i`): remove files there or write elsewhere"
  fixes = {errno.ENOSPC: "free space on the output's disk",
           errno.EDQUOT: "free space or raise your disk quota",
           errno.EFBIG: "raise the file size limit (`ulimit -f`) or write to a filesystem that holds larger files",
           errno.EACCES: "fix the output folder's permissions",
           errno.EPERM: "fix the output folder's permissions (or its immutable attribute: `lsattr`)",
           errno.EROFS: "write to a filesystem mounted read-write",
           errno.EIO: "check the disk (an I/O error)",
           errno.ENOENT: "put the output folder back (or convert into a new --output)"}
  return fixes.get(int(code) if code.isdigit() else None, "fix the cause (free space, permissions)")


def _no_free_inodes(path: str) -> bool:
  import os
  folder = os.path.dirname(path) or "."
  try:
    st = os.statvfs(folder)
  except (OSError, ValueError):
    return False
  return st.f_files > 0 and st.f_favail == 0 and st.f_bavail > 0


class OutputLockedError(ConversionError):
  """Another conversion is writing to the same output directory."""


class ConcurrentRunError(OutputLockedError):
  """Another conversion is writing the same output directory now, or replaced this run's marker."""

  def __init__(self, path: str, run: dict, *, after: bool = False):
    who = (f" (pid {run.get('pid')} on host {run.get('host')}, started {run.get('started')})"
           if run.get("pid") is not None else "")
    if after:
      self.exit_code = 1  # Shards were written.
      message = (f"Another conversion replaced {path} while this one ran{who}: two runs wrote "
                 "this directory at once, so its manifest does not list this run's shards. Convert "
                 "into one directory one run at a time (arrayrecord-convert locks it), then rerun "
                 "this conversion.")
    else:
      message = (f"{path} marks a conversion that is still writing this directory{who}. Nothing "
                 "was converted; wait for it to finish, or convert into another directory.")
    super().__init__(message)


class ClobberedOutputError(ConversionError):
  """An output appeared or changed after planning: another writer published it."""

  exit_code = 1


class Interrupted(ConversionError):
  """The run was stopped (Ctrl-C, SIGTERM, SIGHUP); complete shards are kept, temp files removed."""

  exit_code = 130  # 128 + SIGINT, as shells report it.

  def __init__(self, complete: int, total: int, signal_name: str | None = None,
               overwrite: bool = False):
    self.complete, self.total = complete, total
    if signal_name and signal_name != "SIGINT" and hasattr(_signal, signal_name):
      self.exit_code = 128 + getattr(_signal, signal_name)  # SIGTERM 143, SIGHUP 129.
    how = f"stopped by {signal_name}" if signal_name and signal_name != "SIGINT" else "interrupted"
    # A resume of an --overwrite run redoes the shards it had not replaced yet
    # (the directory's marker names them), so --skip-existing is right for both.
    flag = ("--skip-existing instead of --overwrite to resume (shards still holding old data are "
            "redone)" if overwrite else "--skip-existing to resume")
    if not total:  # Stopped while planning: nothing was written.
      super().__init__(f"{how} before any shard was converted; nothing was changed; rerun the same command")
      return
    super().__init__(f"{how}; {complete} of {total} shards complete; rerun with {flag}")


def _subclasses(cls: type) -> list[type]:
  out = []
  for sub in cls.__subclasses__():
    out += [sub] + _subclasses(sub)
  return out


def root_cause_line(exc: BaseException) -> str:
  """One line for a failed run: our own error if one is inside, else the root cause.

  A runner wraps a worker's exception in its own (often as text only, with
  the worker's traceback): look for our error's `Name: message` line first,
  then report the innermost exception of the chain.
  """
  seen: set[int] = set()
  chain = []
  e: BaseException | None = exc
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    chain.append(e)
    if isinstance(e, ConversionError):
      return str(e).split(" [while running")[0]
    e = e.__cause__ or e.__context__
  names = "|".join(c.__name__ for c in _subclasses(ConversionError))
  for text in (str(c) for c in chain):
    found = re.findall(rf"(?:^|\W)(?:{names}): (.+)", text)
    if found:
      return found[-1].split(" [while running")[0].strip()
  root = chain[-1]
  lines = [l.strip() for l in str(root).splitlines() if l.strip()]
  # A wrapped traceback ends with the original `Type: message` line.
  message = lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
  message = message.split(" [while running")[0]
  kind = type(root).__name__
  return message if message.startswith(kind) else f"{kind}: {message}".rstrip(": ")


def is_remote_not_found(error: BaseException) -> bool:
  """Whether a gs:// storage error says the object does not exist.

  google's own `NotFound` (code 404) when the client reads it; a BeamIOError
  whose causes are 404s when Beam's filesystem asks for its metadata.
  """
  if type(error).__module__.startswith("google.") and getattr(error, "code", None) == 404:
    return True
  causes = getattr(error, "exception_details", None)
  return isinstance(causes, dict) and any(getattr(c, "code", None) == 404 for c in causes.values())
