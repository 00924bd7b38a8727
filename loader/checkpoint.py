"""Saving and restoring iterator positions as small JSON files, also through Orbax.

`save_state`/`restore_state` write one atomic JSON file. For training loops
that checkpoint with Orbax, `CheckpointHandler` and the `CheckpointSave` /
`CheckpointRestore` args work as Grain's do::

  mngr = orbax.checkpoint.CheckpointManager(directory)
  mngr.save(step, args=loader.checkpoint.CheckpointSave(iterator))
  mngr.restore(step, args=loader.checkpoint.CheckpointRestore(iterator))

Each process writes `process_<i>-of-<n>.json` (i, n from JAX when installed),
holding the iterator's state: a DataLoaderIterator's JSON bytes or a
DatasetIterator's dict as JSON, so Grain's and loader's handlers read each
other's files. Orbax is imported only when the args classes are first used.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pathlib
import re
import stat
import sys
from collections.abc import Callable
from typing import Any

from loader import ondisk
from loader import sharding
from loader import state as state_lib

_FORMAT = "arrayrecord-toolkit/loader-state"
_VERSION = 1


def _check_json_ints(value: Any, where: str) -> None:
  # States are nested dicts of ints (and lists of them); anything else would
  # not round-trip through JSON unchanged.
  if isinstance(value, dict):
    for k, v in value.items():
      if not isinstance(k, str):
        raise TypeError(f"Iterator state key {k!r} at {where} is not a string.")
      _check_json_ints(v, f"{where}.{k}")
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      _check_json_ints(v, f"{where}[{i}]")
  elif value is not None and not isinstance(value, (int, float, str, bool)):
    raise TypeError(f"Iterator state value at {where} is a {type(value).__name__}, not JSON-serialisable.")


def save_state(path: str | os.PathLike, iterator: Any) -> Any:
  """Writes `iterator.get_state()` to `path` atomically; returns the state.

  The file is written to a temporary name in the same directory, flushed to
  disk and renamed over `path`, so a crash leaves either the old or the new
  checkpoint, never a truncated one. Works for DatasetIterators (dict states)
  and DataLoaderIterators (JSON bytes states).
  """
  state = iterator.get_state()
  record = {"format": _FORMAT, "version": _VERSION}
  if isinstance(state, (bytes, bytearray)):
    # DataLoader states are JSON bytes (Grain's type); stored parsed so the
    # file stays readable, and turned back into bytes on restore.
    record.update(encoding="json-bytes", state=json.loads(state))
  else:
    _check_json_ints(state, "state")
    record["state"] = state
  path = os.fspath(path)
  directory = os.path.dirname(ondisk.local_abspath(path))
  data = json.dumps(record, indent=1, sort_keys=True)
  _check_replaceable(path)
  created: list[str] = []
  try:
    created = ondisk.make_dirs(directory)
    # The temp name records this process, so a save killed midway (kill -9)
    # leaves a file the next save recognises as nobody's and removes.
    ondisk.remove_stale_temps_of(path, also_others_if=_is_killed_save)
  except OSError as e:
    ondisk.remove_empty_dirs(created)
    raise _save_error(e, path) from e
  tmp = ondisk.temp_name(ondisk.local_abspath(path))
  try:
    _write_replacing(tmp, path, data)
  except BaseException as e:
    ondisk.remove_empty_dirs(created)
    if isinstance(e, OSError) and (not e.filename or e.filename == tmp):
      raise _save_error(e, path) from e  # A full disk says nothing about where it was writing.
    raise
  return state


def _write_replacing(tmp: str, path: str, text: str) -> None:
  """Writes `text` to the new file `tmp`, syncs it, and renames it to `path`; on any failure `tmp` is removed."""
  fd = None
  try:
    # Opened inside the `try`: a Ctrl-C right after it still removes the temp and closes the file.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "w") as f:
      fd = None  # The file object closes it from here.
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if fd is not None:
      os.close(fd)
    try:
      os.unlink(tmp)
    except OSError:  # Not made (on a read-only mount that is EROFS, not ENOENT): the caller's error
      pass           # says what to do.
    raise


# How save_state's files start (sorted keys, indent=1): with or without the DataLoader's encoding line.
_STARTS = tuple(f'{{\n{encoding} "format": "{_FORMAT}"'.encode() for encoding in ("", ' "encoding": "json-bytes",\n'))


def _is_killed_save(temp: str) -> bool:
  """Whether a dead process's temp file beside a state is a killed save_state's (kill -9, a preempted job).

  A job saving step_100.json, step_200.json, ... never saves to a killed save's name again, so only
  removing temps of the name being saved left its temp for ever. A regular file that is empty or starts
  as save_state's files do (its format line included: a single write puts it there) is one; a
  converter's temps, links and FIFOs are not.
  """
  try:
    # Not following a link, not blocking on a FIFO put there meanwhile; then a regular file only.
    fd = os.open(temp, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
      if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        return False
      head = f.read(len(max(_STARTS, key=len)))
  except OSError:
    return False  # Gone meanwhile, or not ours to read: the save goes on.
  return not head or head.startswith(_STARTS)  # Killed before its write, or during or after it.


_FORMAT_LINE = re.compile(rb'"format"\s*:\s*"' + re.escape(_FORMAT.encode()) + rb'"')
_PEEK_BYTES = 1 << 16
# A bigger file is read whole only if save_state's format line is in its first _PEEK_BYTES.
_BIG_STATE = 16 << 20


def _check_replaceable(path: str) -> None:
  """Refuses to replace what is not an earlier loader state (model weights, a device, a folder)."""
  stripped = ondisk.blank_at_an_end(path)
  if stripped is not None:
    raise ValueError(f"Cannot save the iterator state to {path!r}: a name in it has a space or line break at an "
                     "end, which would be part of the file's or folder's name (and a restore from the path "
                     f"without it would find nothing): strip it ({stripped!r}).")
  head = ondisk.unexpanded_home(path)
  if head is not None:
    # Taken as it is, it would make a folder named '~' in the current one (and a later `rm -rf ~` for it...).
    raise FileNotFoundError(errno.ENOENT, f"Cannot save the iterator state to {path}: {head!r} is not expanded to a "
                                          "home folder here (only a shell does that); pass "
                                          f"os.path.expanduser({path!r}), i.e. {os.path.expanduser(path)!r}", path)
  try:
    st = os.lstat(path)
  except NotADirectoryError:
    return  # The save itself names the part of the path that is not a folder.
  except FileNotFoundError:
    if not path or path.endswith(os.sep):
      # A folder that does not exist yet: the save would fail at the rename, blaming a file in the path.
      raise IsADirectoryError(errno.EISDIR, f"Cannot save the iterator state to {path!r}: it names a folder, not "
                                            "a file; give a file path, e.g. "
                                            f"{os.path.join(path or os.curdir, 'iterator_state.json')}", path) from None
    return
  except OSError:
    return  # The save itself will say what is wrong with the path.
  if stat.S_ISLNK(st.st_mode) and not path.endswith(os.sep):
    return  # The save replaces the link itself; what it points to is left as it is.
  if stat.S_ISLNK(st.st_mode):
    st = os.stat(path)
  if stat.S_ISDIR(st.st_mode):
    raise IsADirectoryError(errno.EISDIR, f"Cannot save the iterator state to {path}: it is a folder; give a file "
                                          f"path, e.g. {os.path.join(path, 'iterator_state.json')}", path)
  if not stat.S_ISREG(st.st_mode):
    raise FileExistsError(errno.EEXIST, f"Cannot save the iterator state to {path}: it exists and is not a regular "
                                        "file (a FIFO, socket or device); save elsewhere", path)
  if st.st_size == 0:
    return  # Nothing to lose.
  try:
    with open(path, "rb") as f:
      head = f.read(_PEEK_BYTES)
  except OSError:
    return
  # save_state writes sorted keys, so "format" comes within the first lines.
  if not _FORMAT_LINE.search(head):
    raise FileExistsError(errno.EEXIST, f"Cannot save the iterator state to {path}: it exists and is not a loader "
                                        f"state file ({st.st_size} bytes); save_state only replaces its own "
                                        "files: remove it or save elsewhere", path)


def _save_error(e: OSError, path: str) -> OSError:
  """One line for a failed save_state: the checkpoint's path, what became of it, what to do."""
  kept = "is unchanged" if os.path.exists(path) else "was not created"
  if e.errno == errno.ENOSPC and _no_free_inodes(path):
    # "Free space there" sent the user to `df -h`, which shows space free; the converter says this too.
    fix = ("Its filesystem has no free inodes left (`df -i` shows it), though it has free space: remove files "
           "there (old checkpoints?) or save elsewhere")
  elif e.errno in (errno.ENOSPC, errno.EDQUOT):
    fix = "Free space there or save elsewhere"
  elif isinstance(e, (FileExistsError, NotADirectoryError)):
    fix = _blocking_part(os.path.dirname(ondisk.local_abspath(path)))
  elif e.errno == errno.ENAMETOOLONG:
    fix = "A name in the path is longer than this filesystem allows: choose a shorter one"
  elif e.errno == errno.EFBIG:
    # RLIMIT_FSIZE (`ulimit -f`, a batch system's file size limit): neither the folder nor its mount is at fault.
    fix = ("The process's file size limit is smaller than the state: raise it (`ulimit -f`, or your job "
           "scheduler's file size limit) or save elsewhere")
  else:
    fix = "Save elsewhere, or fix the folder's permissions or mount"
  return OSError(e.errno, f"{e.strerror}: cannot save the iterator state to {path}; the file {kept}. {fix}", path)


def _no_free_inodes(path: str) -> bool:
  """Whether the filesystem `path` would be on has free blocks but no free inodes (files) left."""
  folder = os.path.dirname(ondisk.local_abspath(path))
  while not os.path.isdir(folder) and folder != os.path.dirname(folder):  # Folders a failed save did not make.
    folder = os.path.dirname(folder)
  try:
    st = os.statvfs(folder)
  except (OSError, ValueError):
    return False
  return st.f_files > 0 and st.f_favail == 0 and st.f_bavail > 0


def _blocking_part(directory: str) -> str:
  """What to do about a folder path that could not be made: a broken link in it is named, as it is no file."""
  part = directory
  while part != os.path.dirname(part):
    if os.path.islink(part) and not os.path.exists(part):
      return (f"{part} is a broken symbolic link (to {os.readlink(part)!r}, which does not exist): fix or remove the "
              "link, or save elsewhere")
    part = os.path.dirname(part)
  return "A part of its folder's path is a file: save elsewhere"


def load_state(path: str | os.PathLike) -> Any:
  """Reads a state written by `save_state` (bytes for a DataLoaderIterator's)."""
  path = os.fspath(path)
  try:
    # The start first: a multi-gigabyte file given by mistake (model weights, a dataset) is refused
    # without reading it whole into memory, which took 6 GB of RAM and 20 s for a 3 GB file.
    raw = ondisk.read_local(path, _BIG_STATE + 1, more=lambda head: _check_big_state(path, head))
  except ondisk.SpecialFileError as e:
    raise ValueError(f"{e}: pass the file save_state wrote.") from None
  except FileNotFoundError as e:
    head = ondisk.unexpanded_home(path)
    if head is not None:
      raise FileNotFoundError(e.errno, f"No iterator state at {path}: {head!r} is not expanded to a home folder "
                                       f"here (only a shell does that); pass os.path.expanduser({path!r})") from None
    stripped = ondisk.blank_at_an_end(path)
    if stripped is not None:
      raise FileNotFoundError(e.errno, f"No iterator state at {path!r}: a name in it has a space or line break "
                                       f"at an end: strip it ({stripped!r})") from None
    raise FileNotFoundError(e.errno, f"No iterator state at {ondisk.shown(os.fsdecode(path))}: check the path, "
                                     "or start from the beginning (a fresh iterator)") from None
  except IsADirectoryError as e:
    raise IsADirectoryError(e.errno, f"{path} is a directory, not an iterator state: pass the file save_state "
                                     "wrote (for an Orbax checkpoint, restore with Orbax's CheckpointManager)") from None
  except OSError as e:  # A link loop, a path that goes on after a file's name, a disk error.
    problem = ondisk.file_problem(path)
    what = (f"it {problem.what}; {problem.fix}" if problem is not None
            else f"{e.strerror}; check the disk and the file's permissions")
    raise OSError(e.errno, f"Cannot read the iterator state {path}: {what}, or restore from another "
                           "checkpoint") from None
  other = "restore from another checkpoint"
  if not raw.strip():
    raise ValueError(f"{path} is not a loader state file (it is empty: a save cut short?); {other}.")
  try:
    data = json.loads(raw.decode("utf-8"))
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not a loader state file (not UTF-8 text: byte {e.start} is "
                     f"{raw[e.start:e.start + 1]!r}); {other}.") from e
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not a loader state file (invalid JSON: {e}; cut short?); {other}.") from e
  except ValueError as e:
    # Python refuses integers of over 4300 digits (an edited or damaged file); its advice to raise
    # that limit would not help, as no position is that long.
    raise ValueError(f"{path} is not a loader state file (a number in it has more than "
                     f"{sys.get_int_max_str_digits()} digits: damaged or edited?); {other}.") from e
  except RecursionError:
    raise ValueError(f"{path} is not a loader state file (JSON nested too deeply); {other}.") from None
  if not isinstance(data, dict) or data.get("format") != _FORMAT or "state" not in data:
    raise ValueError(f"{path} is not a loader state file (expected format {_FORMAT!r}); {other}.")
  version = data.get("version")
  if version != _VERSION:
    if isinstance(version, int) and not isinstance(version, bool) and version > _VERSION:
      fix = ("it was written by a newer arrayrecord-toolkit: restore it with that version (pip install -U "
             f"arrayrecord-toolkit), or {other}")
    else:
      fix = f"the file was edited or damaged: {other}"
    raise ValueError(f"{path} has state file version {version!r}; this loader reads version {_VERSION}; {fix}.")
  if data.get("encoding") == "json-bytes":
    return json.dumps(data["state"], indent=4).encode()  # Indented as DataLoaderIterator.get_state (and Grain) writes it.
  return data["state"]


def _check_big_state(path: Any, head: bytes) -> None:
  """Refuses a file over `_BIG_STATE` bytes that does not start as save_state's do."""
  if not _FORMAT_LINE.search(head[:_PEEK_BYTES]):
    raise _not_a_state(path, head)


def _not_a_state(path: Any, head: bytes) -> ValueError:
  """A big file without save_state's format line at its start (save_state writes it within the first lines)."""
  try:
    size = f"{os.path.getsize(path):,} bytes"
  except OSError:
    size = f"over {_BIG_STATE:,} bytes"
  return ValueError(f"{ondisk.shown(os.fsdecode(path))} is not a loader state file ({size}, starting with "
                    f"{bytes(head[:16])!r}, without the format line {_FORMAT!r} that save_state writes at the "
                    "start: model weights or another file?); pass the file save_state wrote, or restore from "
                    "another checkpoint.")


def restore_state(path: str | os.PathLike, iterator: Any) -> Any:
  """Sets `iterator` to the state saved at `path`; returns the state."""
  state = load_state(path)
  _set_naming_file(iterator.set_state, state, path)
  return state


def _files_changed_since(iterator: Any, path: Any) -> list[str]:
  """The ArrayRecord files `iterator` reads whose modification time is later than the state file `path`'s."""
  from loader import source as source_lib  # pylint: disable=g-import-not-at-top
  try:
    saved_at = os.stat(path).st_mtime_ns
  except (OSError, TypeError, ValueError):
    return []
  roots = [getattr(iterator, "_loader_dataset", None),
           getattr(getattr(iterator, "_data_loader", None), "_data_source", None)]
  files: dict[str, None] = {}
  seen: set[int] = set()

  def visit(d: Any, depth: int) -> None:
    if d is None or depth > 256 or id(d) in seen:
      return
    seen.add(id(d))
    for s in (d, getattr(d, "_source", None)):
      if isinstance(s, source_lib.ArrayRecordSource):
        files.update(dict.fromkeys(s._local_path(i) for i in range(len(s.paths))))  # pylint: disable=protected-access
    for parent in getattr(d, "parents", ()) or ():
      visit(parent, depth + 1)

  for root in roots:
    visit(root, 0)
  changed = []
  for f in files:
    try:
      st = os.stat(f)
    except OSError:
      continue  # Gone: the refusal says what differs.
    if st.st_mtime_ns > saved_at:  # Not ctime: a chmod, a hard link or a copy at job start moves it.
      changed.append(f)
  return changed


def _set_naming_file(set_state_fn: Callable[[Any], None], state: Any, path: Any) -> None:
  """`set_state_fn(state)`; a refusal (which names what differs) also names the file the state came from."""
  try:
    set_state_fn(state)
  except (ValueError, TypeError) as e:
    changed = (_files_changed_since(getattr(set_state_fn, "__self__", None), path)
               if getattr(e, "concerns_sources", False) else [])
    why = ""
    if changed:
      more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
      why = (f" ({ondisk.shown(changed[0])}{more} was modified after this state was saved: a state holds positions "
             "in the files as they were; restore a state saved after the change, or start a fresh iterator)")
    try:
      named = type(e)(f"Cannot restore {os.fspath(path)}: {e}{why}")
    except Exception:  # pylint: disable=broad-except  # An exception class with another signature.
      e.add_note(f"(state file: {os.fspath(path)})")
      raise e from None
    raise named from e
  except KeyError as e:  # A StateKeyError is a ValueError too: named above.
    # A bare KeyError (a state lacking an entry its iterator reads) named neither the file nor what to do.
    entry = f"no {e.args[0]!r} entry" if len(e.args) == 1 else "an entry missing"
    raise state_lib.StateKeyError(f"Cannot restore {ondisk.shown(os.fspath(path))}: the state has {entry} where "
                                  "this iterator reads one: the file was edited or damaged; restore another "
                                  "checkpoint, or start a fresh iterator.") from e


# ---- Orbax -------------------------------------------------------------------


def _process_file(directory: Any) -> Any:
  index, count = sharding.get_process_index_and_count()
  if isinstance(directory, (str, os.PathLike)) and not hasattr(directory, "write_text"):
    directory = pathlib.Path(directory)
  return directory / f"process_{index}-of-{count}.json"


def _missing_state_error(path: Any) -> ValueError:
  """No file for this process: says which process files the checkpoint holds, and what to do."""
  try:
    present = sorted(p.name for p in path.parent.iterdir() if p.name.startswith("process_"))
  except (OSError, AttributeError):
    present = []
  index, count = sharding.get_process_index_and_count()
  if present:
    held = f"the checkpoint holds {', '.join(present[:4])}{' ...' if len(present) > 4 else ''}"
    fix = (f"it was saved by a job of another process count; restore it with as many processes as saved it, "
           f"not {count}")
  else:
    held, fix = "the checkpoint holds no iterator state", "restore from a checkpoint that saved this data iterator"
  return ValueError(f"No iterator state for this process ({index} of {count}): {path} does not exist; "
                    f"{held}: {fix}.")


def state_text(iterator: Any) -> str:
  state = iterator.get_state()
  if isinstance(state, (bytes, bytearray)):
    return state.decode()
  return json.dumps(state, indent=4)


def set_state_text(iterator: Any, text: str) -> None:
  # The iterator's own state type says how to read the file: DataLoader
  # iterators take JSON bytes, dataset iterators a dict. An object without
  # `get_state` (a DataLoader passed in place of its iterator, as in
  # `PyGrainCheckpointRestore(data_loader)`) is given bytes, as Grain's handler
  # gives anything that is no DatasetIterator, so it fails as Grain's does:
  # "'DataLoader' object has no attribute 'set_state'".
  get_state = getattr(iterator, "get_state", None)
  if get_state is None or isinstance(get_state(), (bytes, bytearray)):
    iterator.set_state(text.encode())
  else:
    iterator.set_state(json.loads(text))


async def background_save(directory: Any, state: str) -> None:
  """Writes `state` to this process's file once Orbax has created `directory`."""
  import asyncio  # pylint: disable=g-import-not-at-top  # Only Orbax users pay its ~30 ms import.
  directory = await directory.await_creation()
  await asyncio.to_thread(_write_process_file, _process_file(directory), state)


def _write_process_file(path: Any, text: str) -> None:
  """Writes this process's state file in an Orbax checkpoint folder; a failure names it and leaves no part.

  A local file is written as save_state writes one (a temp file renamed into place), so a save into a
  folder that already holds this process's file (the handler called directly, twice) keeps the old state
  if it fails (a full disk), and a symbolic link there is replaced, not written through.
  """
  name = str(path)
  if not ondisk.is_local(name):
    try:
      path.write_text(text)
    except OSError as e:
      try:
        path.unlink()
      except OSError:
        pass
      raise _save_error(e, name) from e
    return
  try:
    st = os.lstat(name)
  except OSError:
    st = None
  if st is not None and stat.S_ISDIR(st.st_mode):
    raise IsADirectoryError(errno.EISDIR, f"Cannot save the iterator state to {name}: a folder has its name; "
                                          "move the folder away, or save to another checkpoint folder", name)
  if st is not None and not stat.S_ISLNK(st.st_mode) and ondisk.special_file_kind(st.st_mode) is not None:
    raise FileExistsError(errno.EEXIST, f"Cannot save the iterator state to {name}: it exists and is not a regular "
                                        "file (a FIFO, socket or device); move it away, or save to another "
                                        "checkpoint folder", name)
  try:
    ondisk.remove_stale_temps_of(name)  # Of a save killed midway (kill -9).
  except OSError:
    pass  # The save itself says what is wrong with the folder.
  try:
    _write_replacing(ondisk.temp_name(ondisk.local_abspath(name)), name, text)
  except OSError as e:
    raise _save_error(e, name) from e


def _read_process_file(path: Any) -> bytes:
  """This process's state file in an Orbax checkpoint folder; one that is not a regular file is named.

  A local folder, broken link, link loop or FIFO at its name is named as such (a FIFO is never opened
  for reading: that would wait for ever for a writer), not reported as missing or as a bare OSError.
  """
  name = str(path)
  if not ondisk.is_local(name):
    if not path.exists():
      raise _missing_state_error(path)
    return path.read_bytes()
  problem = ondisk.file_problem(name)
  if problem is not None and problem.kind == "missing":
    raise _missing_state_error(path)
  if problem is None:
    try:
      return ondisk.read_local(name)
    except OSError as e:  # Replaced meanwhile; or a disk error.
      problem = ondisk.file_problem(name) or ondisk.FileProblem(f"cannot be read ({e.strerror})",
                                                                 "check the disk", "unreadable")
  fix = {"directory": "move the folder away", "special": "move it away"}.get(problem.kind, problem.fix)
  raise ValueError(f"Cannot restore the iterator state from {ondisk.shown(name)}: it {problem.what}; "
                   f"{fix}, or restore another checkpoint step.")


async def background_load(directory: Any, set_state_fn: Callable[[str], None]) -> None:
  """Reads this process's file under `directory` and passes its text to `set_state_fn`."""
  import asyncio  # pylint: disable=g-import-not-at-top
  path = _process_file(directory)
  _set_state_from_file(set_state_fn, path, await asyncio.to_thread(_read_process_file, path))


def _set_state_from_file(set_state_fn: Callable[[str], None], path: Any, raw: bytes) -> None:
  """Passes a state file's text on; a file that is no JSON text is named in one line."""
  try:
    text = raw.decode("utf-8")
    json.loads(text)
  except (UnicodeDecodeError, ValueError) as e:  # ValueError: also an integer of over 4300 digits.
    raise ValueError(f"{path} is not an iterator state (damaged or not JSON: {e}); restore another "
                     "checkpoint step.") from e
  _set_naming_file(set_state_fn, text, path)


class OrbaxCheckpointable:
  """Orbax v1's StatefulCheckpointable protocol, as Grain's iterators have it.

  Orbax calls `save`/`load` and runs the returned coroutines in a background
  thread; the state is taken when `save` is called.
  """

  async def save(self, directory: Any) -> Any:
    """A coroutine writing this state to `directory`/process_<i>-of-<n>.json."""
    return background_save(directory, state_text(self))

  async def load(self, directory: Any) -> Any:
    """A coroutine restoring the state that `save` wrote under `directory`."""
    return background_load(directory, lambda text: set_state_text(self, text))


class CheckpointHandler:
  """Orbax `CheckpointHandler` for loader (and Grain) iterators.

  Register-free use: pass `CheckpointSave(iterator)` / `CheckpointRestore(iterator)`
  as args to a `CheckpointManager`; or name it in `item_handlers`.
  """

  def __init__(self):
    # Orbax matches args to the handlers a manager was built with when it is
    # built: CheckpointSave/Restore must be registered by then, even if the
    # code names them only later (`item_handlers={"ds": CheckpointHandler()}`).
    if "orbax.checkpoint" in sys.modules:
      _orbax_args()

  def save(self, directory: Any, item: Any = None, args: Any = None) -> None:
    """Writes `item`'s (or `args.item`'s) state to this process's file in `directory`."""
    item = item if item is not None else args.item
    _write_process_file(_process_file(directory), state_text(item))

  def restore(self, directory: Any, item: Any = None, args: Any = None) -> Any:
    """Sets `item` (or `args.item`) to the state saved in `directory`; returns it."""
    item = item if item is not None else args.item
    path = _process_file(directory)
    _set_state_from_file(lambda text: set_state_text(item, text), path, _read_process_file(path))
    start = getattr(item, "start_prefetch", None)
    if start is not None:
      start()
    return item

  def structure(self, directory: Any) -> Any:
    del directory
    return None

  def metadata(self, directory: Any) -> Any:
    del directory
    return None

  def finalize(self, directory: Any) -> None:
    pass

  def close(self) -> None:
    pass

  @classmethod
  def typestr(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_ORBAX_ARGS: dict[str, type] = {}


def _orbax_args() -> dict[str, type]:
  """CheckpointSave/CheckpointRestore, registered with Orbax on first use."""
  if not _ORBAX_ARGS:
    try:
      # Lazy: Orbax imports JAX and TensorStore (seconds); only Orbax users pay.
      import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("loader.checkpoint.CheckpointSave/CheckpointRestore need Orbax: "
                        "pip install 'arrayrecord-toolkit[orbax]' (orbax-checkpoint).") from e

    @ocp.args.register_with_handler(CheckpointHandler, for_save=True)
    @dataclasses.dataclass
    class CheckpointSave(ocp.args.CheckpointArgs):
      """Orbax args: save `item`'s state with `CheckpointHandler`."""
      item: Any

    @ocp.args.register_with_handler(CheckpointHandler, for_restore=True)
    @dataclasses.dataclass
    class CheckpointRestore(ocp.args.CheckpointArgs):
      """Orbax args: restore `item` with `CheckpointHandler`."""
      item: Any

    for cls in (CheckpointSave, CheckpointRestore):
      cls.__module__ = __name__
      cls.__qualname__ = cls.__name__
    _ORBAX_ARGS.update(CheckpointSave=CheckpointSave, CheckpointRestore=CheckpointRestore)
  return _ORBAX_ARGS


def __getattr__(name: str) -> Any:
  if name in ("CheckpointSave", "CheckpointRestore"):
    return _orbax_args()[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
