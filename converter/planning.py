"""Input expansion and the input -> output plan, checked before any work."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import functools
import glob
import os
import posixpath
import re
import stat
import warnings
from typing import Any, Iterable

from converter import writer as _writer
from converter.errors import (ConcurrentRunError, ConversionError, ForeignManifestError, ManifestExistsError,
                              NewerManifestError, NoInputFilesError, OutputError, OutputExistsError,
                              UnfinishedRunError)
from converter.manifest import MANIFEST_NAME, FoundManifest, find_manifest
from converter.naming import common_dir, output_path, split_uri
from converter.options import ConvertOptions
from converter.tfrecord import TFRecordReader, check_regular_file
from loader import ondisk
from loader import reader_threads


# Beam's glob-to-regex leaves a `[[]` (an escaped '[', as the advice below writes it) for re to read, and re then
# warns "FutureWarning: Possible nested set" on stderr, two lines above the run's one-line error or summary.
warnings.filterwarnings("ignore", message="Possible nested set", category=FutureWarning,
                        module=r"(apache_beam\.io\.filesystem|converter\.planning)\Z")


def match_pattern(pattern: str, skip_under: str | None = None) -> list[str]:
  """Files matching one glob (local or gs://), sorted; raises if none match.

  Like the shell's, a wildcard does not match names starting with '.' (a
  `.DS_Store`, or a converter's own hidden temp file) unless the pattern's
  part says '.' itself. What a wildcard matches that cannot be an input is
  left out too: directories, and (when `skip_under` is an output directory
  strictly inside the folder the pattern lists) that run's own outputs. A
  path given without wildcards is taken as given, and refused if it is no
  regular file.
  """
  from apache_beam.io.filesystems import FileSystems
  # Beam's local glob lists nothing for a pattern without a directory part
  # (`*.tfrecord`), so local patterns are matched as absolute paths.
  local = split_uri(pattern)[0] == ""
  query = ondisk.local_abspath(pattern) if local else pattern
  try:
    metadata = _match_remote(query) if not local and "*" in query else FileSystems.match([query])[0].metadata_list
  except Exception as e:  # Beam raises BeamIOError for a missing directory.
    bucket = _writer.missing_bucket(query)
    if bucket is not None:  # Beam's own error nests its listing's NotFound twice over.
      raise NoInputFilesError(pattern, f"The bucket gs://{bucket} does not exist (or these credentials "
                                       "cannot see it): check the bucket name and --project") from None
    if "No files found" in str(e) or "not found" in str(e).lower():
      raise NoInputFilesError(pattern, _no_files_hint(pattern, query)) from None
    raise
  wanted = _GlobFilter(query, skip_under)
  paths = sorted(m.path for m in metadata
                 if not m.path.rstrip("/").endswith("/" + MANIFEST_NAME) and wanted(m.path))
  if local and wanted.magic:
    # What Beam's listing misses, the shell's glob (and Python's) finds: a broken link (Beam drops it; a
    # missing shard must not go unnoticed), a name with a backslash (Beam's `*` is `[^/\\]*`, for Windows
    # paths; such a file comes from a Windows tool's archive), and the files at the top of a `**/` (Beam's
    # needs one folder at least).
    found = set(paths)
    for p in _local_glob(query):
      if p not in found and wanted(p) and posixpath.basename(p) != MANIFEST_NAME:
        paths.append(p)
    paths = [p for p in sorted(paths) if not os.path.isdir(p)]  # `in/*` also lists in/some_folder.
  if local:
    if not wanted.magic and not paths and os.path.islink(query):
      paths = [query]  # A broken link given by name, where Beam finds no file: refused below.
    for p in paths:
      check_regular_file(p)  # A directory or FIFO given by name, or a FIFO or broken link matched.
  if not paths:
    raise NoInputFilesError(pattern, _outputs_only_hint(pattern, metadata, wanted, skip_under)
                            or _no_files_hint(pattern, query))
  return paths


def _local_glob(query: str) -> list[str]:
  """The paths a local glob matches: `**` is any number of folders (none too) and does not enter linked folders
  (a link to `.` would make it endless; Beam's listing does not either); other parts match one name each
  (following links). Folders are listed as they are found; nothing is read."""
  parts = query.split("/")
  fixed = 0
  while fixed < len(parts) and not glob.has_magic(parts[fixed]):
    fixed += 1
  found: set[str] = set()

  def walk(folder: str, rest: list[str]) -> None:
    part, after = rest[0], rest[1:]
    if part == "**":
      if after:
        walk(folder, after)  # No folder at all.
      for entry in _entries(folder):
        if not after:
          found.add(entry.path)  # Every entry below, broken links too (folders are dropped later).
        if entry.is_dir(follow_symlinks=False):
          walk(entry.path, rest)
      return
    if not glob.has_magic(part):
      path = os.path.join(folder, part)
      if not after:
        if os.path.lexists(path):
          found.add(path)
      elif os.path.isdir(path):
        walk(path, after)
      return
    for entry in _entries(folder):
      if fnmatch.fnmatchcase(entry.name, part):
        if not after:
          found.add(entry.path)
        elif entry.is_dir():
          walk(entry.path, after)

  if fixed < len(parts):
    walk("/".join(parts[:fixed]) or "/", parts[fixed:])
  return sorted(found)


def _entries(folder: str) -> list[os.DirEntry]:
  try:
    with os.scandir(folder) as it:
      return list(it)
  except OSError:
    return []  # Gone, or not listable: Beam's listing (or the hint for no match) says so.


# Beam's glob translates `*` to this, which never matches a backslash (for Windows paths).
_BEAM_STAR = r"[^/\\]*"


def _match_remote(query: str) -> list[Any]:
  """FileSystems.match for a gs:// pattern with a `*`, whose `*` also matches a backslash and whose `**/` also
  matches no folder, as the shell's do.

  Beam's own match lists every object under the pattern's fixed prefix, then filters them with a regex whose
  `*` is `[^/\\]*`, so `gs://b/tfr/*` left out an object named `tfr/a\\b.tfrecord` without a word. The same
  one listing is asked for here (the prefix and `**`), and filtered with `*` as `[^/]*`.
  """
  from apache_beam.io.filesystem import FileSystem  # pylint: disable=g-import-not-at-top
  from apache_beam.io.filesystems import FileSystems  # pylint: disable=g-import-not-at-top
  prefix = re.match(r"^[^[*?]*", query).group(0)
  # `**/` may also be no folder at all (Beam's `.*/` needs one), as in the shell's and Python's glob; in the
  # translation a literal '.' is escaped, so `/.*` before a `/` comes only from a whole `**` part (each of
  # `**/**/` too).
  regex = re.compile(re.sub(r"/\.\*(?=/)", "(?:/.*)?", FileSystem.translate_pattern(query).replace(_BEAM_STAR, "[^/]*")))
  listed = FileSystems.match([prefix + "**"])[0].metadata_list
  matched = [m for m in listed if regex.match(m.path)]
  if not matched:  # Beam's own words for a pattern that matches nothing (a hint is added from them).
    return FileSystems.match([query])[0].metadata_list
  return matched


def _outputs_only_hint(pattern: str, metadata: list[Any], wanted: _GlobFilter, skip_under: str | None) -> str | None:
  """Advice when a pattern matched files, but only the output folder's own (its shards, its manifest)."""
  if skip_under is None or not wanted.magic:
    return None
  owned = [m.path for m in metadata if m.path.rstrip("/").endswith("/" + MANIFEST_NAME) or wanted.is_output(m.path)]
  if not owned:
    return None
  manifests = sum(p.rstrip("/").endswith("/" + MANIFEST_NAME) for p in owned)
  kinds = [f"{len(owned) - manifests} ArrayRecord file(s)"] * (len(owned) > manifests) + [MANIFEST_NAME] * (manifests > 0)
  return (f"Only the output folder's own files are there ({' and '.join(kinds)} in {skip_under}), and those are "
          f"never inputs: give the TFRecord files (the inputs a conversion's {MANIFEST_NAME} lists)")


class _GlobFilter:
  """Whether a path a pattern matched is one the shell's glob would give (see match_pattern)."""

  def __init__(self, query: str, skip_under: str | None):
    scheme, rest = split_uri(query)
    parts = rest.split("/")
    fixed = 0
    while fixed < len(parts) and not glob.has_magic(parts[fixed]):
      fixed += 1
    self.magic = fixed < len(parts)
    self._scheme, self._parts, self._fixed = scheme, parts, fixed
    self._converted_in = None
    if skip_under is not None and self.magic and scheme == split_uri(skip_under)[0]:
      out = ondisk.local_abspath(skip_under) if scheme == "" else split_uri(skip_under)[1]
      # ArrayRecord files there are outputs (of this run's interrupted start, for one); its TFRecord files are
      # inputs, even where the output folder is one of several the pattern lists (`data/*/*.tfrecord`).
      self._converted_in = out.rstrip("/") + "/"

  def is_output(self, path: str) -> bool:
    """Whether a matched path is one of the output folder's own files, never an input."""
    if not self.magic:
      return False
    rest = split_uri(path)[1].rstrip("/")
    # A gs:// object is read (a request each) only where its name is an output's.
    return (self._converted_in is not None and rest.startswith(self._converted_in)
            and (self._scheme == "" or "array_record" in posixpath.basename(rest))
            and _starts_as_array_record(path))

  def __call__(self, path: str) -> bool:
    if not self.magic:
      return True
    if self.is_output(path):
      return False
    rest = split_uri(path)[1].rstrip("/")
    got = rest.split("/")[self._fixed:]
    wild = self._parts[self._fixed:]
    if "**" not in wild and len(got) != len(wild):
      return False  # Beam's `?` and `[...]` match a '/', the shell's and Python's never do.
    if "**" in wild:
      # Beam's regex lets `?` and `[...]` match a '/' here too: the parts are matched again, one name each.
      if not _names_match(got, wild):
        return False
      dots_asked = any(w.startswith(".") for w in wild)
      return dots_asked or not any(g.startswith(".") for g in got)
    return all(w.startswith(".") or not g.startswith(".") for g, w in zip(got, wild))


def _names_match(names: list[str], parts: list[str]) -> bool:
  """Whether path names match pattern parts, a `**` part standing for any number of names (none included)."""
  @functools.lru_cache(maxsize=None)  # Several `**` parts would otherwise retry the same tails.
  def match(i: int, j: int) -> bool:
    if j == len(parts):
      return i == len(names)
    if parts[j] == "**":
      return any(match(k, j + 1) for k in range(i, len(names) + 1))
    return i < len(names) and fnmatch.fnmatchcase(names[i], parts[j]) and match(i + 1, j + 1)
  return match(0, 0)


def _no_files_hint(pattern: str, query: str) -> str | None:
  """Why a pattern may match nothing: a manifest named as an input, a folder this user cannot list, or '['."""
  if posixpath.basename(query.rstrip("/")) == MANIFEST_NAME and not glob.has_magic(query):
    return (f"{pattern} is a conversion's {MANIFEST_NAME}, not a TFRecord file: a shell that expands an "
            "unquoted --input DIR/* passes it (and any outputs there) as inputs; quote the pattern "
            "(--input 'DIR/*')")
  if pattern != pattern.strip():
    # A pattern pasted from a YAML block, read from a file with its line break, or `--input "$X "`: the
    # blank at its end is part of the name, which no file has.
    return (f"It has a space or line break at an end, which is part of the pattern: strip it "
            f"(--input {pattern.strip()!r})")
  head = ondisk.unexpanded_home(pattern) if split_uri(query)[0] == "" else None
  if head is not None:
    home = os.path.expanduser(pattern)
    instead = f"write the path out ({home!r})" if home != pattern else "write the path out"
    rest = pattern[len(head) + 1:]
    outside = f", or keep the ~ outside the quotes (--input {head}/'{rest}')" if rest else ""
    return f"It starts with {head!r}, which only a shell expands, and not inside quotes: {instead}{outside}"
  if split_uri(query)[0] == "" and glob.has_magic(query):
    parts = query.split("/")
    folder = "/".join(parts[:next(i for i, part in enumerate(parts) if glob.has_magic(part))]) or "/"
    try:
      os.listdir(folder)
    except PermissionError as e:
      return (f"its folder {folder} cannot be listed ({os.strerror(e.errno)}): give this user read "
              "permission on it, or name the files without wildcards")
    except OSError:
      pass
  return _bracket_hint(pattern)


def _bracket_hint(pattern: str) -> str | None:
  """Advice when `[` or `]` in a pattern were meant literally (they are a glob class)."""
  if "[" not in pattern:
    return None
  local = split_uri(pattern)[0] == ""
  if (os.path.lexists(pattern) if local else not any(c in pattern for c in "*?")):
    return (f"'[' and ']' are a glob character class, so the file named {pattern!r} does not "
            f"match itself; escape '[' as '[[]': --input {glob.escape(pattern)!r}")
  # Only '[' is escaped: glob.escape would also make the pattern's `*` and `?` literal, so `d[1]/*.tfrecord`
  # got the advice `d[[]1]/[*].tfrecord`, which matches only a file named `*.tfrecord`. Locally given only where
  # the escaped pattern finds files: one that still finds none (a pattern escaped already) has another fault.
  literal = pattern.replace("[", "[[]")
  if (not glob.glob(literal)) if local else "[[]" in pattern:
    return None
  return ("'[' and ']' in a pattern are a glob character class; to match them literally "
          f"escape '[' as '[[]' (e.g. --input {literal!r})")


def expand_patterns(patterns: str | Iterable[str], skip_under: str | None = None) -> list[str]:
  """All files matching any of the patterns, sorted and de-duplicated.

  `skip_under`: the run's output directory, whose files a wildcard does not
  take as inputs (see match_pattern).
  """
  if isinstance(patterns, str):
    patterns = [patterns]
  patterns = list(patterns)
  if not patterns:
    raise ValueError("No input patterns given.")
  files: set[str] = set()
  for p in patterns:
    if isinstance(p, str) and not p.strip():
      # An empty pattern would match the current directory and be refused as a folder the user never named.
      raise ValueError(f"An input pattern is empty ({p!r}); give a file or a glob, e.g. --input 'data/*.tfrecord'.")
    files.update(match_pattern(p, skip_under))
  return sorted(files)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
  """One unit of work: convert `input` to `output`, or keep an existing output."""

  input: str
  output: str
  action: str  # 'convert' or 'keep'
  previous: dict[str, Any] | None = None
  # What publishing may replace at `output` (writer.output_identity() when
  # planned): None means nothing, so a file another run wrote meanwhile is
  # never clobbered.
  replaces: Any = None
  # A complete output converted without loss from this input before the input changed: a redo that
  # skips records (on_corrupt='skip', the input damaged since) must not replace it.
  lossless_output: bool = False
  # A kept output's input times, taken when it was judged unchanged (the manifest records these,
  # not a later stat: an input rewritten after planning then differs at the next resume).
  input_times: dict[str, int] | None = None


def _complete_local_array_record(path: str) -> bool:
  ArrayRecordReader = reader_threads.reader_class(path)  # pylint: disable=invalid-name
  try:
    r = ArrayRecordReader(path)
    r.num_records()
    r.close()
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def _starts_as_array_record(path: str) -> bool | PermissionError:
  try:
    return _writer.read_head(path, len(ondisk.RIEGELI_SIGNATURE)) == ondisk.RIEGELI_SIGNATURE
  except PermissionError as e:  # Not "no ArrayRecord": unknown, and the fix differs.
    return e
  except OSError:
    return False


def _not_array_record(paths: list[str]) -> list[str]:
  """Those of `paths` that do not start as ArrayRecord files (gs:// objects are read side by side).

  Raises OutputError for one that cannot be read at all.
  """
  with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(paths)))) as pool:
    results = list(pool.map(_starts_as_array_record, paths))
  for p, ok in zip(paths, results):
    if isinstance(ok, PermissionError):
      raise OutputError(f"Output {p} exists but cannot be read ({ok.strerror or ok}), so --skip-existing cannot "
                        "tell whether it is complete; fix its permissions (e.g. chmod u+r) and rerun, or pass "
                        "--overwrite to replace it.")
  return [p for p, ok in zip(paths, results) if not ok]


def check_output_slot(path: str) -> None:
  """Refuses, before any work, an output name taken by something no file can replace, or too long."""
  _check_name_length(path)
  fix = "remove it or choose another --output"
  try:
    mode = os.lstat(path).st_mode
  except FileNotFoundError:
    return
  except NotADirectoryError:
    bad = os.path.dirname(path)
    while not os.path.lexists(bad):  # The first part of the path that exists is the file.
      bad = os.path.dirname(bad)
    raise OutputError(f"Output {path} cannot be written: {bad} is a file, where this run needs a "
                      f"folder; {fix}.") from None
  if stat.S_ISLNK(mode):
    if not os.path.exists(path):
      raise OutputError(f"Output {path} is a symbolic link to {os.readlink(path)!r}, which does not "
                        "exist; remove the link or choose another --output.")
    mode = os.stat(path).st_mode
  if stat.S_ISDIR(mode):
    raise OutputError(f"Output {path} is a directory, where this run would write its file; {fix}.")
  if not stat.S_ISREG(mode):
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) \
        else "a device" if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else "not a regular file"
    raise OutputError(f"Output {path} is {kind}, where this run would write its file; {fix}.")


def _check_name_length(path: str) -> None:
  """Refuses an output whose name, or its temp file's name, the filesystem cannot hold."""
  folder = os.path.dirname(ondisk.local_abspath(path))
  while not os.path.isdir(folder) and folder != os.path.dirname(folder):
    folder = os.path.dirname(folder)
  try:
    name_max = os.pathconf(folder, "PC_NAME_MAX")
  except (OSError, ValueError):
    name_max = 255
  name = os.path.basename(path)
  size = len(os.fsencode(name))
  # The longest temp name any of this run's processes can give it (it holds a
  # cut of a long name, and the host name, which may be long).
  temp = os.path.basename(ondisk.temp_name(path, ondisk.Owner(10**7 - 1, 10**12, ondisk.this_process().host)))
  longest = max(size, len(os.fsencode(temp)))
  if longest > name_max:
    what = f"its temp file's name is {longest} bytes" if longest > size else f"it is {size} bytes"
    raise OutputError(
        f"Output name {name!r} cannot be written here: {what}, past this filesystem's {name_max}-byte limit. "
        f"Rename the inputs so that their output names (named after them) are shorter.")


def _manifest_policy(options: ConvertOptions, outputs: list[str], existing: list[str],
                     run_id: str | None) -> tuple[dict[str, dict[str, Any]], dict[str, Any], str | None]:
  """Applies the `existing` policy to a manifest.json already in the output directory.

  Every run replaces manifest.json (first by the marker of a run in progress,
  at the end by its manifest), so: someone else's file is replaced only with
  existing='overwrite'; a finished run's only by overwrite, or by a resume
  that keeps all the shards it lists (else another split's shards would drop
  out of the dataset); an unfinished run's marker only by overwrite or a
  resume (skip), which redoes the shards that run had planned to replace and
  had not replaced yet.

  Returns:
    ({output: earlier manifest entry} of shards a resume may keep, with what
    that manifest said of them; {output: identity it had when an unfinished
    run planned to replace it}; the writer options that manifest records; the outputs of those that
    were whole when it found their inputs changed, see ShardPlan.lossless_output).
  """
  found: FoundManifest | None = find_manifest(options.output_dir)
  marker = found.manifest if found is not None and found.kind == "incomplete" else None
  # A retried planning step finds the marker its own run wrote.
  own = marker is not None and run_id is not None and ondisk.marker_run(marker).get("id") == run_id
  if marker is not None and not own and ondisk.marker_run_alive(marker):
    raise ConcurrentRunError(found.path, ondisk.marker_run(marker))
  if found is None or options.existing == "overwrite":
    return {}, {}, None, set()
  if found.kind == "foreign":
    raise ForeignManifestError(found.path, found.problem)
  if found.kind == "newer":
    raise NewerManifestError(found.path, found.problem)
  # The marker of a run that wrote or kept no shard at all guards nothing.
  if marker is not None and not own and not any(_writer.exists(s["output"]) for s in marker["shards"]):
    return {}, {}, None, set()
  if options.existing == "error" and not own:
    if marker is not None:
      raise UnfinishedRunError(found.path, ondisk.unfinished_run_message(found.path, marker))
    if existing:
      raise OutputExistsError(existing)
    raise ManifestExistsError(found.path, None)
  if found.kind == "damaged":
    return {}, {}, None, set()  # Kept shards are rebuilt from their files, so nothing is lost.
  planned = set(outputs)
  shards = found.manifest["shards"]
  dropped = sorted(s["output"] for s in shards if s["output"] not in planned)
  if dropped:
    raise ManifestExistsError(found.path, dropped)
  written_with = found.manifest.get("writer_options")
  written_with = written_with if isinstance(written_with, str) else None
  if marker is None:
    return {s["output"]: s for s in shards if s.get("status") != "failed"}, {}, written_with, set()
  previous = {s["output"]: s for s in shards if s.get("status") == "existing"}
  stale = {s["output"]: s.get("replaces") for s in shards
           if s.get("status") == "pending" and s.get("replaces") is not None}
  # Whole outputs whose inputs changed, which the unfinished run had not replaced yet.
  guarded = {s["output"] for s in shards if s["output"] in stale and s.get("lossless_output") is True}
  return previous, stale, written_with, guarded


def _real(path: str) -> str:
  return os.path.realpath(path) if _writer.is_local(path) else path


def file_key(path: str) -> tuple[int, int] | None:
  """(device, inode) of an existing local file or folder, else None."""
  if not _writer.is_local(path):
    return None
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_dev, st.st_ino


def _same_input(entry: dict[str, Any] | None, path: str) -> bool:
  """Whether an earlier manifest's entry for a kept output was converted from `path`.

  The same file; a copy of it (same size, same first and last MiB); or, where
  the recorded input is gone (the inputs moved since), one of the same name
  and size.
  Without an entry (a run killed before its manifest) it cannot be told: the
  output is kept, as it is what a resume keeps.
  """
  before = (entry or {}).get("input")
  if not isinstance(before, str):
    return True
  if _real(before) == _real(path):
    return True
  if _writer.exists(before):
    # Still there: a copy of it (same bytes), or another file of the same
    # name and size (another split's shard, say).
    return _same_ends(before, path)
  size = (entry or {}).get("bytes_in")
  return (posixpath.basename(before) == posixpath.basename(path) and isinstance(size, int)
          and size == _writer.file_size(path))


def _first_records_differ(path: str, output: str, compression: str) -> bool:
  """Whether a local output's first record is not its input's (False where either cannot be read).

  Asked only of outputs no manifest entry describes (the manifest deleted, or shards copied without it):
  a same-named shard of another split has the same name and often the same size.
  """
  if not (_writer.is_local(path) and _writer.is_local(output)):
    return False
  ArrayRecordReader = reader_threads.reader_class(output)  # pylint: disable=invalid-name
  try:
    first_in = next(iter(TFRecordReader(path, compression=compression)), None)
    reader = ArrayRecordReader(output)
    try:
      first_out = reader.read([0])[0] if reader.num_records() else None
    finally:
      reader.close()
  except Exception:  # pylint: disable=broad-except
    return False  # A damaged first record (converted with on_corrupt='skip'?) cannot tell.
  return first_in != first_out


_END_BYTES = 1 << 20


def _same_ends(a: str, b: str) -> bool:
  """Whether two local files have the same size and the same first and last MiB (a copy); False for remote ones."""
  if not (_writer.is_local(a) and _writer.is_local(b)):
    return False
  try:
    size = os.path.getsize(a)
    if size != os.path.getsize(b):
      return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
      if fa.read(_END_BYTES) != fb.read(_END_BYTES):
        return False
      tail = max(0, size - _END_BYTES)
      fa.seek(tail)
      fb.seek(tail)
      return fa.read() == fb.read()
  except OSError:
    return False


def _lossy(entry: dict[str, Any] | None) -> bool:
  """Whether an earlier manifest's entry says its shard skipped corrupt records or ended at a truncated input."""
  entry = entry or {}
  skipped = entry.get("corrupt_records_skipped")
  return bool(entry.get("input_truncated")) or (isinstance(skipped, int) and skipped > 0)


_INPUT_TIMES = ("input_mtime_ns", "input_ctime_ns")


def input_times(path: str) -> dict[str, int]:
  """A local input's modification and inode change times (ns) as the manifest records them; {} if unknown."""
  if not _writer.is_local(path):
    return {}
  try:
    st = os.stat(path)
  except OSError:
    return {}
  return {"input_mtime_ns": st.st_mtime_ns, "input_ctime_ns": st.st_ctime_ns}


def _whole(entry: dict[str, Any] | None) -> bool:
  """Whether a manifest entry says its output holds every record of its input (not merely nothing said)."""
  return (entry is not None and entry.get("corrupt_records_skipped") == 0
          and entry.get("input_truncated") is False)


def _rewritten_since(path: str, output: str, entry: dict[str, Any] | None) -> bool:
  """Whether the input an output was converted from was modified after the output was written."""
  before = (entry or {}).get("input")
  if not (_writer.is_local(path) and _writer.is_local(output)) or (
      isinstance(before, str) and _real(before) != _real(path)):
    return False  # A copy or a move of the recorded input is judged by _same_input.
  try:
    st = os.stat(path)
    # Another size than the manifest's: another file now, whatever its times say (a link
    # retargeted to an older file, say: `in/x.tfrecord -> v2/x.tfrecord`).
    size = (entry or {}).get("bytes_in")
    if isinstance(size, int) and not isinstance(size, bool) and size != st.st_size:
      return True
    # The input's times as the conversion opened it, where the manifest records them: any
    # change is a rewrite, and no clock is compared (one set back after the output was written,
    # or an input dated in the future, would mislead the comparison below).
    recorded = [(entry or {}).get(k) for k in _INPUT_TIMES]
    if all(isinstance(t, int) and not isinstance(t, bool) for t in recorded):
      return recorded != [st.st_mtime_ns, st.st_ctime_ns]
    # The inode change time too: `cp -p`, `rsync -a` and `tar x` set the old
    # modification time on new content, but cannot set that one back.
    return max(st.st_mtime_ns, st.st_ctime_ns) > os.stat(output).st_mtime_ns
  except OSError:
    return False


def _check_folders_free(outputs: dict[str, str], output_dir: str) -> None:
  """Refuses an output whose folder is another output's file name, or the run's manifest or lock file."""
  reserved = {ondisk.manifest_path(output_dir): "the run's manifest",
              ondisk.join(output_dir, ondisk.LOCK_NAME): "the run's lock file"}
  for o, i in outputs.items():
    if o in reserved:
      raise ConversionError(f"The input {i!r} would be written to {o!r}, which is {reserved[o]}. Rename the input "
                            "or convert it into another output directory.")
    folder = posixpath.dirname(o)  # Local paths too: this runs on POSIX only (see DirLock).
    while len(folder) > len(output_dir.rstrip("/")):
      taken = outputs.get(folder)
      what = f"the output of {taken!r}" if taken is not None else reserved.get(folder)
      if what is not None:
        raise ConversionError(
            f"The input {i!r} would be written to {o!r}, inside {folder!r}, which is also {what}. Rename the "
            "input's folder or convert the two into different output directories.")
      folder = posixpath.dirname(folder)


def _still_stale(path: str, planned_identity: Any) -> bool:
  """Whether an output an unfinished run planned to replace still holds what it planned to replace."""
  if not _writer.is_local(path) or not isinstance(planned_identity, list):
    return True  # Remote objects cannot be told apart: redo them.
  return ondisk.file_id(path) == tuple(planned_identity)


def plan_shards(inputs: list[str], options: ConvertOptions,
                run_id: str | None = None) -> list[ShardPlan]:
  """Maps inputs to outputs and applies the `existing` policy.

  Args:
    inputs: The input files.
    options: The conversion options.
    run_id: The id of the run planning (written into its marker), so a
      retried planning step is not refused by its own run's marker.

  Raises:
    OutputExistsError: outputs (or a manifest.json) exist and options.existing
      == 'error', or a manifest.json would be replaced that the policy keeps.
    OutputError: an output name is taken by a directory, a broken link...
    ConversionError: two inputs map to one output name.
  """
  if not inputs:
    raise ValueError("No input files to convert.")
  bucket = _writer.missing_bucket(options.output_dir)
  if bucket is not None:  # Else every shard's upload fails after its conversion, with a bare HTTP 404.
    raise OutputError(f"--output {options.output_dir}: its bucket gs://{bucket} does not exist (or these "
                      f"credentials cannot see it). Nothing was converted. Create it (gcloud storage buckets "
                      f"create gs://{bucket}) or fix the bucket name in --output.")
  inputs = sorted(set(inputs))
  for i in inputs:
    if _writer.is_local(i) and os.path.lexists(i):
      check_regular_file(i)  # A directory, FIFO or broken link; missing ones fail when read.
  root = options.input_root or common_dir(inputs)
  outputs = [output_path(i, root, options.output_dir, options.suffix) for i in inputs]
  seen: dict[str, str] = {}
  # Compared as resolved paths and file identities: a relative --output, an
  # output folder that is a link to the input folder, or a hard link must not
  # let an output replace an input.
  on_disk = {_real(i): i for i in inputs}
  on_disk.update({key: i for i in inputs if (key := file_key(i)) is not None})
  for i, o in zip(inputs, outputs):
    if o in seen:
      raise ConversionError(
          f"Inputs {seen[o]!r} and {i!r} would both be written to {o!r}. Rename "
          "one of them or convert them into different output directories.")
    same = on_disk.get(_real(o)) or on_disk.get(file_key(o))
    if same is not None and _starts_as_array_record(same) is True:
      raise ConversionError(
          f"The input {same!r} is an ArrayRecord file, where the output of {i!r} goes (an earlier conversion's "
          "output?): leave it out of the inputs (a glob that matches only the TFRecord files; with the Python "
          "API, MatchFiles(patterns, skip_under=output_dir) leaves out the output folder's own files as "
          "arrayrecord-convert does).")
    if same is not None:
      raise ConversionError(f"Output {o!r} would overwrite the input {same!r} (the same file on disk); "
                            "choose another --output.")
    if _writer.is_local(o):
      check_output_slot(o)
    seen[o] = i
  _check_folders_free(seen, options.output_dir)
  existing = [o for o in outputs if _writer.exists(o)]
  previous, stale, written_with, guarded = _manifest_policy(options, outputs, existing, run_id)
  if existing and options.existing == "error":
    raise OutputExistsError(existing)
  plans = []
  existing_set = set(existing)
  complete: set[str] = set()
  redo: set[str] = set()
  if options.existing == "skip":
    # A damaged ArrayRecord file is redone, and so is one that an unfinished
    # --overwrite run had not replaced yet; a file that is no ArrayRecord at
    # all (the user's own, under an output name) is replaced only with
    # existing='overwrite'.
    redo = {o for o in existing if o in stale and _still_stale(o, stale[o])}
    complete = {o for o in existing if o not in redo and
                (not _writer.is_local(o) or _complete_local_array_record(o))}
    # A local file's footer was read above; a gs:// object (published only
    # whole) is read up to its signature, so a foreign one is refused before
    # anything is converted rather than when its digest is taken.
    foreign = _not_array_record([o for o in existing if o not in redo
                                 and (o not in complete or not _writer.is_local(o))])
    complete -= set(foreign)
    if foreign:
      raise OutputExistsError(foreign, "are not ArrayRecord files, so --skip-existing can neither keep "
                                       "nor replace them")
  # Redone rather than kept: a shard that lost records when this run must lose
  # none, and one whose input was rewritten after it (re-downloaded, repaired).
  # Taken before judging: an input rewritten meanwhile differs from these at the next resume.
  times = {o: input_times(i) for i, o in zip(inputs, outputs) if o in complete}
  rewritten = {o for i, o in zip(inputs, outputs) if o in complete and _rewritten_since(i, o, previous.get(o))}
  lossless = {o for o in rewritten if _whole(previous.get(o))}
  lossless |= redo & guarded
  complete = {o for o in complete if o not in rewritten
              and not (options.on_corrupt == "fail" and _lossy(previous.get(o)))}
  if complete and written_with is not None and written_with != options.writer_options:
    raise OutputExistsError(sorted(complete), (
        f"were written with --writer-options {written_with!r} (manifest.json says so), not this run's "
        f"{options.writer_options!r}, so --skip-existing would mix the two in one dataset; rerun with "
        f"--writer-options {written_with!r} to resume"))
  unrecorded = [f"{o} (first record not {i}'s)" for i, o in zip(inputs, outputs)
                if o in complete and o not in previous and _first_records_differ(i, o, options.compression)]
  if unrecorded:
    raise OutputExistsError(unrecorded, "hold other records than their inputs and no manifest.json says what they "
                                        "were converted from (another split's shards?), so --skip-existing cannot "
                                        "keep them")
  others = [f"{o} (from {previous[o]['input']}, not {i})" for i, o in zip(inputs, outputs)
            if o in complete and not _same_input(previous.get(o), i)]
  if others:
    raise OutputExistsError(others, "were converted from other inputs, as the manifest says, so --skip-existing "
                                    "cannot keep them")
  for i, o in zip(inputs, outputs):
    if o in complete:
      plans.append(ShardPlan(input=i, output=o, action="keep", previous=previous.get(o), input_times=times[o]))
    else:
      replaces = _writer.output_identity(o) if o in existing_set else None
      plans.append(ShardPlan(input=i, output=o, action="convert", replaces=replaces,
                             lossless_output=o in lossless))
  return plans


def marker_entries(plans: list[ShardPlan]) -> list[dict[str, Any]]:
  """What a run's marker (manifest.json while it runs) says of each planned shard."""
  entries = []
  for p in plans:
    if p.action == "convert":
      replaces = list(p.replaces) if isinstance(p.replaces, tuple) else p.replaces
      entries.append({"input": p.input, "output": p.output, "status": "pending", "replaces": replaces,
                      **({"lossless_output": True} if p.lossless_output else {})})
    else:
      carried = {k: v for k, v in (p.previous or {}).items()
                 if k in ("records", "digest", "bytes_out", "compression", "record_bytes",
                          "corrupt_records_skipped", "input_truncated")}
      entries.append({**carried, **(p.input_times or {}), "input": p.input, "output": p.output,
                      "status": "existing"})
  return entries
