"""The on-disk format of a converted dataset, in one stdlib-only place.

A dataset directory holds ArrayRecord shards and `manifest.json`. The
converter writes it, `arrayrecord-verify` checks it and `ArrayRecordSource`
reads it; all three use this module, which imports only the standard library
(the converter and the pipelines import it; it never imports them):

- the manifest: its name, a validating parser and a writer. Shard paths are
  stored relative to the dataset directory (absolute only for files elsewhere),
  so a copied or moved dataset reads its own files;
- path helpers for local paths and URIs (gs://...);
- crash-safe local writes: a hidden temp file beside the final one whose name
  carries its owner (pid, process start, host), so a later run can tell a dead
  run's leftovers from a live run's work, and a publish step that never
  replaces a file it did not expect to replace;
- `DirLock`, the one-writer-per-output-directory lock;
- the marker of a run in progress: a run replaces manifest.json by a manifest
  with status INCOMPLETE (its plan) before it changes any shard, and by the
  finished manifest at its end; readers refuse the marker in one line, so a
  stopped or failed run never leaves a directory that reads as complete.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import json
import os
import posixpath
import re
import resource
import secrets
import socket
import stat
from typing import Any, Callable, Iterable

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "arrayrecord-toolkit/manifest"
# Version 2 stores shard paths relative to the dataset directory; version 1
# (absolute paths) is still read.
MANIFEST_VERSION = 2
LOCK_NAME = ".arrayrecord-toolkit.lock"
# Every ArrayRecord (Riegeli) file starts with this block header signature.
RIEGELI_SIGNATURE = b"\x83\xaf\x70\xd1\x0d\x88\x4a\x3f"
STATUSES = ("converted", "existing", "failed")
# manifest.json's top-level `status` while a run is changing the directory: the
# run writes this marker before it touches any shard and replaces it with the
# finished manifest at its end, so a directory that a stopped or failed run left
# half old, half new is never read as complete.
INCOMPLETE = "incomplete"


class ManifestError(ValueError):
  """A manifest that cannot be used; the message names the file and what to do."""


class IncompleteManifestError(ManifestError):
  """manifest.json marks a conversion that has not finished: the shards may mix old and new data."""

  def __init__(self, path: str, manifest: dict[str, Any]):
    self.path, self.manifest = path, manifest
    super().__init__(unfinished_run_message(path, manifest))


# ---------------------------------------------------------------- paths

_URI_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)(.*)$")


def non_utf8_name(path: str) -> str | None:
  """`path` printable (bad bytes as \\xNN) if it is not valid UTF-8 text, which Beam cannot pass on; else None.

  Linux allows any bytes in a name; Python keeps the undecodable ones as surrogates.
  """
  try:
    path.encode("utf-8")
  except UnicodeEncodeError:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
  return None


def special_file_kind(mode: int) -> str | None:
  """What a file that is not a regular one or a directory is ("a FIFO (named pipe)", ...); None for those two."""
  if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
    return None
  if stat.S_ISFIFO(mode):
    return "a FIFO (named pipe)"
  if stat.S_ISSOCK(mode):
    return "a socket"
  if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
    return "a device"
  return "not a regular file"


class SpecialFileError(OSError):
  """A FIFO, socket or device where a small regular file (a manifest, a state) was expected."""


def read_local(path: str, n: int = -1, *, more: Callable[[bytes], None] | None = None) -> bytes:
  """The first `n` bytes (all if n < 0) of a local file; a FIFO or device raises SpecialFileError.

  Opened without blocking, so a FIFO is refused instead of waiting for ever for
  a writer; FileNotFoundError and IsADirectoryError come as from `open`. With
  `more`, a file longer than `n` bytes is shown to `more(first_n_bytes)` (which
  raises to refuse it), then read whole from the same handle: read once, and
  the same file even if the name is replaced meanwhile.
  """
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  try:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
      raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    kind = special_file_kind(mode)
    if kind is not None:
      raise SpecialFileError(f"{path} is {kind}, not a regular file (reading it could block for ever); "
                             "move it away")
    os.set_blocking(fd, True)
    f = os.fdopen(fd, "rb")
  except BaseException:
    os.close(fd)
    raise
  with f:
    head = f.read(n)
    if more is None or n < 0 or len(head) < n:
      return head
    more(head)
    return head + f.read()


def open_file_limit_advice(when: str) -> str:
  """What to do when a process may open no more files: `when` says before what the limit must be raised."""
  soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
  return (f"raise the open-file limit (now {soft}: `ulimit -n 65536` in the shell, or "
          f"resource.setrlimit(resource.RLIMIT_NOFILE, ...) {when})")


@dataclasses.dataclass(frozen=True)
class FileProblem:
  """Why a local path cannot be read as a data file, in words for an error line: `{path} {what}; {fix}`."""

  what: str
  fix: str
  kind: str  # "missing", "broken link", "unreadable" (a link loop too), "directory" or "special".


def unexpanded_home(path: str | bytes) -> str | None:
  """The leading `~` or `~user` of `path` when only a shell would have expanded it (it names a home folder
  and nothing of that name exists here), else None. Python, Grain and Beam take such a path literally."""
  head = os.fsdecode(path).split(os.sep)[0]
  if head.startswith("~") and os.path.expanduser(head) != head and not os.path.lexists(head):
    return head
  return None


def file_problem(path: str) -> FileProblem | None:
  """None if `path` is a regular file or a link to one; else what is wrong and what to do.

  Reading a FIFO or a device could block for ever, so those are problems
  too. One `stat`; the loader and the converter word their errors from it.
  """
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    if os.path.islink(path):
      return FileProblem(f"is a broken symbolic link (to {os.readlink(path)!r}, which does not exist)",
                         "fix or remove the link", "broken link")
    return FileProblem("does not exist", "check the path", "missing")
  except OSError as e:  # A link loop, a folder above it without search permission.
    if e.errno == errno.ELOOP:
      return FileProblem("is a symbolic link that leads back to itself (a loop)", "fix or remove the link", "unreadable")
    if e.errno == errno.ENOTDIR:  # Not a permission problem: the path goes on after a file's name.
      head = path.rstrip(os.sep)
      while os.path.dirname(head) not in ("", head) and not (os.path.lexists(head) and not os.path.isdir(head)):
        head = os.path.dirname(head)
      kind = "a file, not a folder" if os.path.isfile(head) else "not a folder"
      return FileProblem(f"cannot be opened: {head} is {kind}", "check the path (a '/' after a file's name?)",
                         "unreadable")
    return FileProblem(f"cannot be opened ({e.strerror})", "check its permissions and those of its folders",
                       "unreadable")
  if stat.S_ISDIR(mode):
    return FileProblem("is a directory", "give the files in it", "directory")
  kind = special_file_kind(mode)
  if kind is not None:
    return FileProblem(f"is {kind}, not a regular file (reading it could block for ever)",
                       "pass the data files themselves (copy the data to a regular file first)", "special")
  return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(path: str) -> str:
  """`path` as an error shows it: quoted where it would hide something (blank, a line break or other
  control character, a space at an end), so the message stays one line and the odd part is seen."""
  if not path or path != path.strip() or _CONTROL.search(path):
    return repr(path)
  return path


LINE_BREAKS = "\r\n\t\v\f"


def blank_at_an_end(path: Any, chars: str | None = None) -> str | None:
  """`path` with its names stripped, when a name it would create has `chars` (any whitespace by
  default) at an end; None otherwise.

  A path read from a config file or a command's output with its line break, used as it is, makes a
  file or folder whose name ends in it, shown as another one. Names that exist already are the
  user's to have; a URI (gs://) never exists as a local path.
  """
  if not isinstance(path, str):
    return None
  parts = path.split(os.sep)
  for i, part in enumerate(parts):
    if part != part.strip(chars) and not os.path.lexists(os.sep.join(parts[:i + 1])):
      return os.sep.join(p.strip() for p in parts)
  return None


def one_line(text: Any) -> str:
  """`text` (a library's error, often several lines) on one line, its lines joined with '; '."""
  return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def split_uri(path: str) -> tuple[str, str]:
  """Splits `gs://b/x/y` into (`gs://`, `b/x/y`); local paths get an empty scheme."""
  m = _URI_RE.match(path)
  return (m.group(1), m.group(2)) if m else ("", path)


def is_local(path: str) -> bool:
  return split_uri(path)[0] == ""


def join(directory: str, name: str) -> str:
  """`directory/name` for local paths and URIs alike."""
  if is_local(directory):
    return os.path.join(directory, name)
  return directory.rstrip("/") + "/" + name


def local_abspath(path: str) -> str:
  """`os.path.abspath`, except that `..` after a symlink goes where the kernel goes.

  abspath drops `link/..` as text, which names another directory than the one
  the system opens when `link` is a symlink; such paths resolve their links.
  """
  path = os.fspath(path)
  head, tail = os.path.split(path)
  if tail in (os.pardir, os.curdir):
    return os.path.realpath(path)
  if os.pardir in head.split(os.sep):
    # The folder resolved as the kernel resolves it; the name itself (maybe a
    # symlink that a save replaces) kept.
    return os.path.join(os.path.realpath(head), tail)
  return os.path.abspath(path)


def absolute(path: str) -> str:
  """`path` as paths are compared: local ones absolute and normalised, URIs without a trailing '/'."""
  return local_abspath(path) if is_local(path) else path.rstrip("/")


def to_stored(directory: str, path: str) -> str:
  """How a manifest stores `path`: relative to `directory` if inside it, else as is."""
  base, full = absolute(directory), absolute(path)
  if split_uri(base)[0] != split_uri(full)[0]:
    return path
  if is_local(full):
    rel = os.path.relpath(full, base)
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel
  prefix = base + "/"
  return full[len(prefix):] if full.startswith(prefix) else path


def resolve(directory: str, stored: str) -> str:
  """The full path of a manifest path: relative ones are under `directory`."""
  if not is_local(stored) or os.path.isabs(stored):
    return stored
  return join(directory, stored)


def manifest_path(directory: str) -> str:
  return join(directory, MANIFEST_NAME)


# ---------------------------------------------------------------- manifest


def parse_manifest(data: bytes | str, path: str, *, incomplete_ok: bool = False) -> dict[str, Any]:
  """The manifest in `data` (read from `path`), checked; paths stay as stored.

  Only `shards` (a list of {output, records, status}) is required, so a
  hand-written manifest that names its shards works; a `format` other than
  ours is refused, and so is the marker of a run that has not finished
  (status INCOMPLETE) unless `incomplete_ok` (the converter resuming it).

  Raises:
    ManifestError: naming `path` and what is wrong.
  """
  redo = "rewrite it, or delete it and rerun the conversion with --skip-existing"
  try:
    manifest = json.loads(data)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ManifestError(f"{path} is not valid JSON ({e}); {redo}.") from None
  except RecursionError:
    raise ManifestError(f"{path} is not a manifest (its JSON is nested too deeply); {redo}.") from None
  if not isinstance(manifest, dict):
    raise ManifestError(f"{path} holds a JSON {type(manifest).__name__}, not a manifest "
                        f"object; {redo}.")
  fmt = manifest.get("format", MANIFEST_FORMAT)
  if fmt != MANIFEST_FORMAT:
    raise ManifestError(f"{path} is not an arrayrecord-toolkit manifest (format={fmt!r}, "
                        f"expected {MANIFEST_FORMAT!r}); move it out of the dataset directory.")
  version = manifest.get("version", 1)
  if not isinstance(version, int) or isinstance(version, bool) or version < 1:
    raise ManifestError(f"{path} has version {version!r}, expected an int from 1 to {MANIFEST_VERSION}; {redo}.")
  if version > MANIFEST_VERSION:
    raise ManifestError(f"{path} has version {version}, newer than this arrayrecord-toolkit reads (up to "
                        f"{MANIFEST_VERSION}); upgrade arrayrecord-toolkit.")
  unfinished = manifest.get("status") == INCOMPLETE
  if unfinished and not incomplete_ok:
    raise IncompleteManifestError(path, manifest)
  shards = manifest.get("shards")
  if not isinstance(shards, list):
    raise ManifestError(f"{path} has no 'shards' list; {redo}.")
  seen: dict[str, int] = {}
  for i, s in enumerate(shards):
    if not isinstance(s, dict) or not isinstance(s.get("output"), str) or not s["output"]:
      raise ManifestError(f"{path}: shard {i} needs 'output' (a path), got {s!r}; {redo}.")
    if s["output"] in seen:  # Read twice, its records would count twice.
      raise ManifestError(f"{path}: shards {seen[s['output']]} and {i} both name {s['output']!r}; {redo}.")
    seen[s["output"]] = i
    if "input" in s and not isinstance(s["input"], str):
      raise ManifestError(f"{path}: shard {i} ({s['output']}) has 'input' {s['input']!r}, expected a path; "
                          f"{redo}.")
    if unfinished:
      continue  # A marker's entries are plans ('pending') or kept shards, checked when resumed.
    status = s.get("status", "converted")
    if status not in STATUSES:
      raise ManifestError(f"{path}: shard {i} ({s['output']}) has status {status!r}, expected "
                          f"one of {STATUSES}; {redo}.")
    records = s.get("records")
    ok_records = isinstance(records, int) and not isinstance(records, bool) and records >= 0
    if status != "failed" and not ok_records:
      raise ManifestError(f"{path}: shard {i} ({s['output']}) needs 'records' (an int >= 0), "
                          f"got {records!r}; {redo}.")
  return manifest


def read_manifest(directory: str) -> dict[str, Any] | None:
  """The checked manifest of a local dataset directory, or None if it has none."""
  path = manifest_path(directory)
  try:
    data = read_local(path)
  except FileNotFoundError:
    return None
  except SpecialFileError as e:
    raise ManifestError(f"{e}.") from None
  except OSError as e:
    raise ManifestError(f"{path} cannot be read ({e}).") from None
  return parse_manifest(data, path)


def marker_run(manifest: dict[str, Any]) -> dict[str, Any]:
  """The `run` a marker records (who writes the directory), {} if it records none."""
  run = manifest.get("run")
  return run if isinstance(run, dict) else {}


def marker_run_alive(manifest: dict[str, Any]) -> bool | None:
  """Whether the run a marker names still runs; None when it runs on another host (unknowable)."""
  run = marker_run(manifest)
  alive = recorded_process_alive(run)
  if alive and run.get("pid") == os.getpid() and run.get("host") == _hostname():
    return False  # A pipeline run in this very process, which has returned or raised.
  return alive


def unfinished_run_message(path: str, manifest: dict[str, Any]) -> str:
  """One line for the marker of an unfinished run: who wrote it and what to rerun."""
  run = marker_run(manifest)
  who = f"pid {run.get('pid')} on host {run.get('host')}, started {run.get('started')}"
  alive = marker_run_alive(manifest)
  if alive:
    return (f"{path} marks a conversion that is still writing this directory ({who}); wait for "
            "it to finish before reading the dataset.")
  how = " (an --overwrite run)" if run.get("existing") == "overwrite" else ""
  rerun = ("rerun that conversion with --skip-existing instead of --overwrite to complete it "
           "(shards still holding old data are redone)" if how else
           "rerun that conversion with --skip-existing to complete it")
  if alive is None:  # Another host: it may still run.
    return (f"{path} marks a conversion{how} that has not finished ({who}): some shards may be "
            f"missing or hold older data. If that run has stopped, {rerun}.")
  return (f"{path} marks a conversion{how} that did not finish ({who}): some shards may be missing "
          f"or hold older data. {rerun[0].upper()}{rerun[1:]}.")


def incomplete_manifest(shards: Iterable[dict[str, Any]], *, output_dir: str, writer_options: str,
                        run: dict[str, Any]) -> dict[str, Any]:
  """The marker a run writes as manifest.json before it changes any shard.

  Args:
    shards: One entry per planned shard with full `input`/`output` paths:
      status 'pending' (to convert; `replaces` is file_id() of the file it will
      replace, None if none, REPLACE_ANY where unknowable) or 'existing' (kept,
      with what the earlier manifest said of it).
    output_dir: The dataset directory; paths are stored relative to it.
    writer_options: The run's ArrayRecord writer options.
    run: Who runs it and how: pid, host, process_start, started, existing, id.
  """
  stored = []
  for entry in sorted(shards, key=lambda r: r["output"]):
    entry = dict(entry)
    for key in ("input", "output"):
      if isinstance(entry.get(key), str):
        entry[key] = to_stored(output_dir, entry[key])
    stored.append(entry)
  return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "status": INCOMPLETE,
          "run": dict(run), "output_dir": output_dir, "writer_options": writer_options,
          "shards": stored}


def dump_manifest(manifest: dict[str, Any]) -> bytes:
  return json.dumps(manifest, indent=1).encode()


def build_manifest(results: Iterable[dict[str, Any]], *, output_dir: str,
                   writer_options: str) -> dict[str, Any]:
  """A manifest for per-shard results whose paths are full; stores them relative."""
  shards = sorted(results, key=lambda r: r["output"])
  ok = [r for r in shards if r["status"] != "failed"]

  def total(key, rows):
    return sum(r.get(key) or 0 for r in rows)

  stored = []
  for r in shards:
    entry = dict(r)
    for key in ("input", "output"):
      if isinstance(entry.get(key), str):
        entry[key] = to_stored(output_dir, entry[key])
    stored.append(entry)
  return {
      "format": MANIFEST_FORMAT,
      "version": MANIFEST_VERSION,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "output_dir": output_dir,
      "writer_options": writer_options,
      "totals": {
          "shards": len(shards),
          "converted": sum(r["status"] == "converted" for r in shards),
          "existing": sum(r["status"] == "existing" for r in shards),
          "failed": sum(r["status"] == "failed" for r in shards),
          "records": total("records", ok),
          "bytes_in": total("bytes_in", ok),
          "bytes_out": total("bytes_out", ok),
          "corrupt_records_skipped": total("corrupt_records_skipped", shards),
      },
      "shards": stored,
  }


def resolved_shards(manifest: dict[str, Any], directory: str) -> list[dict[str, Any]]:
  """The manifest's shard entries with `input` and `output` as full paths.

  Version 1 manifests stored absolute paths (and manifests written by hand or
  on Dataflow may name gs:// outputs); one inside the manifest's own
  `output_dir` is re-based onto `directory`, so a copied dataset still names
  its own files, as the loader reads them (loader.source._locate_shard).
  """
  old_base = manifest.get("output_dir")
  out = []
  for s in manifest["shards"]:
    entry = dict(s)
    for key in ("input", "output"):
      value = entry.get(key)
      if not isinstance(value, str):
        continue
      if isinstance(old_base, str) and old_base:
        rel = to_stored(old_base, value)
        if rel != value:
          value = rel
      entry[key] = resolve(directory, value)
    out.append(entry)
  return out


# ---------------------------------------------------------------- owners


@dataclasses.dataclass(frozen=True)
class Owner:
  """A process, told apart from a later one that reuses its pid by its start time."""

  pid: int
  start: int  # Clock ticks after boot (Linux /proc); 0 where unknown.
  host: str


def _process_start(pid: int) -> int | None:
  """The start time of `pid` in clock ticks; 0 if unknown here; None if it is gone."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read()
  except FileNotFoundError:
    return None
  except OSError:
    return 0
  # The command name (field 2) may hold spaces and parentheses: split after it.
  fields = stat[stat.rindex(b")") + 2:].split()
  if fields[0] == b"Z":  # A zombie has exited.
    return None
  return int(fields[19])


# The kernel's inode number of the first pid namespace (PROC_PID_INIT_INO): the host's own.
_INIT_PID_NAMESPACE = 0xEFFFFFFC


def pid_namespace() -> int:
  """The inode number of this process's pid namespace; the host's own (`_INIT_PID_NAMESPACE`) off Linux."""
  try:
    return os.stat("/proc/self/ns/pid").st_ino
  except OSError:  # Not Linux: one namespace as far as this code can tell.
    return _INIT_PID_NAMESPACE


def _hostname() -> str:
  """This machine's name, plus its pid namespace when that is not the host's own.

  Pids are only comparable inside one pid namespace: containers that share a
  host name (`docker run --network host`) and an output volume must not take
  each other's live processes for dead ones, so each namespace counts as a
  host of its own. Part of file names: short and free of separators.
  """
  name = re.sub(r"[^A-Za-z0-9.\-]", "_", socket.gethostname())[:63] or "localhost"
  namespace = pid_namespace()
  if namespace != _INIT_PID_NAMESPACE:
    name = f"{name[:48]}.pidns-{namespace:x}"
  return name


def this_process() -> Owner:
  pid = os.getpid()
  return Owner(pid=pid, start=_process_start(pid) or 0, host=_hostname())


def is_alive(owner: Owner) -> bool | None:
  """Whether `owner` still runs; None when it runs on another host or pid namespace (unknowable here)."""
  if owner.host != _hostname():
    return None
  try:
    os.kill(owner.pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # Exists, owned by another user.
  start = _process_start(owner.pid)
  if start is None:
    return False
  return not (owner.start and start and start != owner.start)  # Else the pid was reused.


def recorded_process_alive(info: dict[str, Any]) -> bool | None:
  """`is_alive` of the process a lock file or a run marker records (pid, process_start, host).

  False when the record names no usable pid and host.
  """
  pid, start, host = info.get("pid"), info.get("process_start"), info.get("host")
  if not (isinstance(pid, int) and isinstance(host, str)):
    return False
  return is_alive(Owner(pid, start if isinstance(start, int) else 0, host))


# ---------------------------------------------------------------- temp files

# DOTALL and \Z: a name may hold a newline, and `$` also matches before a final one.
_TEMP_RE = re.compile(r"\A\.(?P<base>.+)\.tmp-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]+@(?P<host>[^/@]+)\Z", re.DOTALL)


def make_dirs(path: str) -> list[str]:
  """Creates `path` and its missing parents; returns those created, outermost first."""
  missing = []
  d = path
  while d and not os.path.isdir(d) and d != os.path.dirname(d):
    missing.append(d)
    d = os.path.dirname(d)
  created = []
  try:
    for m in reversed(missing):
      try:
        os.mkdir(m)
      except FileExistsError:
        if not os.path.isdir(m):
          raise
        continue  # Made meanwhile by someone else: not ours to remove.
      created.append(m)
  except OSError:
    remove_empty_dirs(created)
    raise
  return created


def remove_empty_dirs(created: list[str]) -> None:
  """Removes folders make_dirs created, innermost first, as long as they are empty."""
  for d in reversed(created):
    try:
      os.rmdir(d)  # Only if still empty: never anything written meanwhile.
    except OSError:
      break


_TEMP_BASE_MAX = 128  # Bytes of the final name a temp name holds; the rest is the owner (up to ~100 bytes).


def temp_name(final_path: str, owner: Owner | None = None) -> str:
  """A hidden path beside `final_path` whose name records the owning process."""
  o = owner or this_process()
  head, tail = posixpath.split(final_path) if not is_local(final_path) else os.path.split(final_path)
  name = f".{temp_base(tail)}.tmp-{o.pid}-{o.start}-{secrets.token_hex(4)}@{o.host}"
  return join(head, name) if head else name


def temp_base(final_name: str) -> str:
  """The part of a temp name that stands for `final_name` (parse_temp_name's `base`).

  A long name is cut and given a digest of the whole, so that its temp name
  fits the filesystem's 255-byte limit whenever the final name does.
  """
  raw = os.fsencode(final_name)
  if len(raw) <= _TEMP_BASE_MAX:
    return final_name
  digest = hashlib.sha256(raw).hexdigest()[:16]
  return raw[:_TEMP_BASE_MAX - 17].decode("utf-8", "ignore") + "~" + digest  # "ignore": a character cut in two.


def parse_temp_name(name: str) -> tuple[str, Owner] | None:
  """(temp_base of the final basename, owner) of a temp file name made by temp_name, else None."""
  m = _TEMP_RE.match(name)
  if not m:
    return None
  return m.group("base"), Owner(int(m.group("pid")), int(m.group("start")), m.group("host"))


def temp_files(directory: str) -> list[tuple[str, Owner]]:
  """Temp files under a local directory (recursively), with their owners."""
  found = []
  # Hidden folders too: the output mirrors the inputs' folders, `.x/` included.
  for root, _, files in os.walk(directory):
    for name in files:
      parsed = parse_temp_name(name)
      if parsed:
        found.append((os.path.join(root, name), parsed[1]))
  return found


def remove_stale_temps(directory: str, *, also_own: bool = False) -> list[str]:
  """Removes temp files of dead processes on this host; returns their paths.

  A temp file whose owner still runs, or runs on another host, is kept: it may
  be a live run's work. `also_own` also removes this process's temp files
  (after an interrupted run).
  """
  return remove_dead_owners(temp_files(directory), also_own=also_own)


def remove_stale_temps_of(final_path: str, *, also_others_if: Callable[[str], bool] | None = None) -> list[str]:
  """Removes the temp files beside `final_path` of dead processes on this host; returns their paths.

  Those temp_name made for `final_path` are removed; with `also_others_if`, so are those made for other
  names in the same folder for which it returns True (it is asked only about dead owners' files).
  One listing of the folder serves both.
  """
  directory = os.path.dirname(local_abspath(final_path))
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  base = temp_base(os.path.basename(final_path))
  own, others = [], []
  for name in names:
    parsed = parse_temp_name(name)
    if parsed is not None:
      (own if parsed[0] == base else others).append((os.path.join(directory, name), parsed[1]))
  # A save goes on whatever stale file it cannot remove (another user's, say).
  removed = remove_dead_owners(own, keep_going_on=OSError)
  if also_others_if is not None:
    removed += remove_dead_owners(others, keep_going_on=OSError, only_if=also_others_if)
  return removed


def remove_dead_owners(temps: list[tuple[str, Owner]], *, also_own: bool = False,
                       keep_going_on: type[OSError] = FileNotFoundError,
                       only_if: Callable[[str], bool] | None = None) -> list[str]:
  """Removes those of `temps` whose owner is dead (or, with `also_own`, is this process); returns them.

  `only_if`, when given, must also return True for a path before it is removed. A removal failing
  with `keep_going_on` is skipped; other errors propagate.
  """
  me = this_process()
  removed = []
  for path, owner in temps:
    if not (is_alive(owner) is False or (also_own and owner == me)):
      continue
    if only_if is not None and not only_if(path):
      continue
    try:
      os.remove(path)
      removed.append(path)
    except keep_going_on:
      pass
  return removed


# ---------------------------------------------------------------- publishing

REPLACE_ANY = "any"


def file_id(path: str) -> tuple[int, int, int, int] | None:
  """Identity of a local file (device, inode, size, mtime); None if missing."""
  try:
    st = os.stat(path)
  except (FileNotFoundError, NotADirectoryError):  # Or a file where a folder on its path should be.
    return None
  return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ClobberError(FileExistsError):
  """The final name changed after planning: another writer published there."""

  def __init__(self, path: str):
    super().__init__(
        errno.EEXIST,
        f"{path} was written by another process while this run was converting; nothing "
        "was replaced. Make sure only one conversion writes to this directory, then rerun "
        "with --skip-existing")
    self.path = path

  def __str__(self) -> str:
    return self.strerror


def publish_local(tmp: str, final: str, expect: Any = REPLACE_ANY) -> None:
  """Moves a finished temp file to `final` without clobbering another writer's file.

  Args:
    tmp: The finished file, on the same filesystem as `final`.
    final: The name it gets.
    expect: None: `final` must not exist (linked, so it is never replaced);
      a file_id(): `final` must still be that file; REPLACE_ANY: replace it.

  Raises:
    ClobberError: `final` is not what `expect` says; `tmp` is left in place.
  """
  if expect is None:
    try:
      os.link(tmp, final)
    except FileExistsError:
      raise ClobberError(final) from None
    except OSError as e:
      if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
        raise
      # No hard links here (e.g. some FUSE and SMB mounts): rename after a check.
      if os.path.lexists(final):
        raise ClobberError(final) from None
      os.rename(tmp, final)
      return
    os.remove(tmp)
    return
  if expect != REPLACE_ANY and file_id(final) != tuple(expect):
    raise ClobberError(final)
  os.replace(tmp, final)


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes a small local file so that readers see the old or the new content, never a part."""
  tmp = temp_name(local_abspath(path))
  try:
    with open(tmp, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


# ---------------------------------------------------------------- lock


class LockedError(RuntimeError):
  """Another live process holds the directory's lock."""

  def __init__(self, directory: str, lock_path: str, holder: dict[str, Any] | None):
    self.directory, self.lock_path, self.holder = directory, lock_path, holder
    if holder:
      who = (f"pid {holder.get('pid')} on host {holder.get('host')}, started "
             f"{holder.get('started')}")
      stop = f"stop it (`kill {holder.get('pid')}` on {holder.get('host')})"
      if recorded_process_alive(holder) is False:
        # Its worker processes inherited the lock and die with it: moments, not minutes.
        super().__init__(
            f"{directory} is still locked by the worker processes of a conversion whose main process "
            f"({who}) has exited; they stop with it within moments: retry shortly.")
        return
    else:
      who, stop = "a process that has not written its details yet", "stop it"
    super().__init__(
        f"{directory} is being written by another conversion ({who}); wait for it to "
        f"finish. If that run is stuck, {stop}: the lock ({lock_path}) is released when "
        "its process exits, so a lock left by a killed run never blocks.")


class LockPathError(ValueError):
  """Something other than a lock file (a link, a folder) sits at a directory's lock file name."""


class DirLock:
  """An exclusive lock on a local output directory, held by one process at a time.

  It is an advisory `flock` on a hidden file in the directory, so the kernel
  drops it when the holder exits, however it exits: a dead run never leaves a
  lock that blocks. The file records the holder (pid, host, start time) for
  the message the next writer gets; it is removed on release.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self.path = os.path.join(directory, LOCK_NAME)
    self._fd: int | None = None

  def acquire(self) -> DirLock:
    import fcntl  # pylint: disable=g-import-not-at-top  # POSIX only; imported where needed.
    while True:
      fd = self._open()
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise LockedError(self.directory, self.path, holder) from None
      except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP):
          return self  # No locks on this filesystem: run unlocked.
        raise
      # The holder before us may have removed the file after we opened it:
      # then we locked a deleted file; start again on the current one.
      try:
        held, current = os.fstat(fd), os.stat(self.path)
        if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
          break
      except FileNotFoundError:
        pass
      os.close(fd)
    me = this_process()
    info = {"pid": me.pid, "host": me.host, "process_start": me.start,
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(info).encode())
    except OSError:  # A full disk, say: the lock file is ours to remove (we hold it).
      self._fd = fd
      self.release()
      raise
    self._fd = fd
    return self

  def _open(self) -> int:
    """The lock file, opened for writing; never a link, which would make us overwrite what it points to."""
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise LockPathError(f"{self.path} is a symbolic link, not this tool's lock file; remove it (what it points "
                            "to is not touched) and rerun.") from None
      if e.errno == errno.EISDIR:
        raise LockPathError(f"{self.path} is a folder, not this tool's lock file; move it away and rerun.") from None
      raise
    st = os.fstat(fd)
    if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
      return fd  # Removed meanwhile by its holder's release: acquire() sees the inode change and opens again.
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
      os.close(fd)
      what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
      raise LockPathError(f"{self.path} is {what}, not this tool's lock file; remove it (the other name keeps "
                          "its data) and rerun.")
    return fd

  @property
  def fd(self) -> int | None:
    """The descriptor holding the flock (None when not held): a child that inherits it holds the lock too."""
    return self._fd

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.remove(self.path)  # Under the lock, so nobody else is holding it.
    except FileNotFoundError:
      pass
    fd, self._fd = self._fd, None  # Forgotten first: a Ctrl-C here must not let __del__ close it twice.
    os.close(fd)  # Drops the flock.

  def __enter__(self) -> DirLock:
    return self.acquire()

  def __del__(self):
    # A run that fails between taking the lock and its `with` block must not
    # keep the directory locked for the rest of a long-lived process.
    if getattr(self, "_fd", None) is not None:
      self.release()

  def __exit__(self, *exc) -> None:
    self.release()


def lock_holder(directory: str) -> dict[str, Any] | None:
  """What the lock file of a local directory says of its holder (pid, host...), if readable."""
  try:
    with open(os.path.join(directory, LOCK_NAME), "rb") as f:
      holder = json.loads(f.read(4096))
  except (OSError, ValueError):
    return None
  return holder if isinstance(holder, dict) else None


def _read_holder(fd: int) -> dict[str, Any] | None:
  try:
    data = os.pread(fd, 4096, 0)
    holder = json.loads(data)
    return holder if isinstance(holder, dict) else None
  except (OSError, ValueError):
    return None
