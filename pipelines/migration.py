"""Drop-in replacements for array_record.beam.pipelines, for people migrating.

Same names and calling convention (`args` dict, `pipeline_options`, an un-run
`beam.Pipeline` returned), without parsing sys.argv at import and without the
crash of the reference match-shards pipeline on current Beam.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any

import apache_beam as beam
import xxhash
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from converter import ConvertOptions, MatchFiles, OutputExistsError, TFRecordReader
from converter.errors import ConversionError, OutputError, OutputLockedError, OutputWriteError, write_fix
from converter import writer as _writer
from converter.planning import check_output_slot
from loader import ondisk
from pipelines import build


def _patterns(args: dict[str, Any]) -> list[str]:
  if "input" not in args or "output" not in args:
    raise ValueError(f"args needs 'input' and 'output' keys, got {sorted(args)}.")
  inp = args["input"]
  return [inp] if isinstance(inp, str) else list(inp)


def convert_tf_to_arrayrecord_disk_match_shards(
    args: dict[str, Any], pipeline_options: PipelineOptions | None = None) -> beam.Pipeline:
  """One ArrayRecord file per TFRecord file, same records, same order.

  Args:
    args: {'input': glob or list of globs, 'output': output directory}; optional
      'writer_options', 'compression', 'on_corrupt', 'existing' as in
      converter.ConvertToArrayRecord. (The reference wrote `output` as a file
      prefix; here names come from the inputs, so `output` is a directory.)
    pipeline_options: Beam options; DirectRunner if none.

  Returns:
    The pipeline, not yet run: call `.run()`.
  """
  patterns = _patterns(args)
  options = ConvertOptions(
      output_dir=args["output"], writer_options=args.get("writer_options", "group_size:1"),
      compression=args.get("compression", "auto"), on_corrupt=args.get("on_corrupt", "fail"),
      existing=args.get("existing", "error"))
  p = build.new_pipeline(pipeline_options)
  build.add_conversion(p, options, patterns=patterns)
  return p


class _KeyRecordsFn(beam.DoFn):
  """Reads one TFRecord file; keys each record by its output shard."""

  def __init__(self, num_shards: int, compression: str, on_corrupt: str):
    self._num_shards = num_shards
    self._compression, self._on_corrupt = compression, on_corrupt
    self.records = Metrics.counter(self.__class__, "records")

  def process(self, path: str):
    for j, record in enumerate(TFRecordReader(path, self._compression, self._on_corrupt)):
      # A hash of (file, index) spreads records evenly and reproducibly.
      shard = xxhash.xxh64_intdigest(f"{path}\0{j}".encode()) % self._num_shards
      self.records.inc()
      yield shard, record


def _reshard_path(prefix: str, shard: int, num_shards: int, suffix: str) -> str:
  return f"{prefix}-{shard:05d}-of-{num_shards:05d}{suffix}"


class _WriteShardFn(beam.DoFn):
  """Writes one output shard: local ones under a temp name (published together by _PublishShardsFn)."""

  def __init__(self, prefix: str, num_shards: int, suffix: str, writer_options: str, overwrite: bool):
    self._prefix, self._num_shards = prefix, num_shards
    self._suffix, self._writer_options = suffix, writer_options
    self._overwrite = overwrite
    self.shards = Metrics.counter(self.__class__, "shards_written")

  def process(self, keyed):
    shard, records = keyed
    path = _reshard_path(self._prefix, shard, self._num_shards, self._suffix)
    # Objects cannot be published as a set: each is published when written.
    local = ondisk.is_local(path)
    if local:
      ondisk.remove_stale_temps_of(path)  # Left by a killed (kill -9) run.
    expect = _writer.REPLACE_ANY if self._overwrite else None
    try:
      with _writer.ArrayRecordShardWriter(path, self._writer_options, expect=expect) as w:
        _write_all(w, records)
        w.commit(publish_file=not local)
    except OutputWriteError as e:  # Re-sharding has no --skip-existing: its advice is to run it again.
      raise OutputWriteError(e.path, e.reason, resume="run the re-sharding again (it writes every shard "
                             "anew; pass existing='overwrite' if some were published)",
                             temp_left=e.temp_left) from None
    self.shards.inc()
    yield path, w.staged


def _write_all(writer: Any, records: Any) -> None:
  for r in records:
    if r is not None:  # The empty marker every shard gets.
      writer.write(r)


class _PublishShardsFn(beam.DoFn):
  """Gives the written temps their final names all at once, under the output folder's lock.

  So a run killed before this step leaves no shard under a final name (its
  temps go in the next run), and two runs never mix their shards. With
  existing='overwrite' the shards of other shard counts under the prefix go
  too, after the new set is in place. The renames are one _SwapSet: a failure
  part way puts back every file they replaced or removed.
  """

  def __init__(self, prefix: str, num_shards: int, suffix: str, overwrite: bool):
    self._prefix, self._num_shards, self._suffix = prefix, num_shards, suffix
    self._overwrite = overwrite

  def process(self, written: list[tuple[str, str | None]]):
    staged = sorted((final, tmp) for final, tmp in written if tmp is not None)
    if not staged:
      yield from (final for final, _ in written)
      return
    folders = sorted({os.path.dirname(ondisk.local_abspath(final)) for final, _ in staged})
    locks, swap = [], _SwapSet()
    try:
      for folder in folders:
        swap.where = folder
        locks.append(ondisk.DirLock(folder).acquire())
      # Again under the lock, before any rename: what appeared since the run was built.
      others = _check_slots(self._prefix, self._num_shards, self._suffix, self._overwrite)
      if not self._overwrite:
        present = [final for final, tmp in staged if os.path.exists(final) and os.path.exists(tmp)]
        if present:
          raise OutputExistsError(present, "appeared while re-sharding (another run wrote them)")
        _refuse_other_shard_counts(self._prefix, self._num_shards, self._suffix)
      # No yield until all are renamed: the window in which a kill leaves part of the set is the renames'.
      whole = True
      for final, tmp in staged:
        if os.path.exists(tmp):
          swap.replace(tmp, final)
        else:  # A retry of this step: an earlier try published it, or undid the set and removed its temps.
          whole = False
      # After the new set is in place: a kill in between leaves both sets (the next overwrite
      # removes the other), never neither. A retry cannot tell that its set is in place: it keeps them.
      for other in (others if whole else []):
        swap.remove(other)
    except ondisk.LockedError as e:
      raise OutputLockedError(str(e)) from None
    except ondisk.LockPathError as e:
      raise OutputError(f"Cannot lock the output directory {swap.where}: {e}") from None
    except BaseException as e:
      lost = swap.undo()  # All or none: a set in part would read as the dataset.
      if isinstance(e, OSError) and not isinstance(e, ConversionError):
        raise _publish_error(swap.where, e, lost, self._prefix) from None
      raise
    else:
      swap.commit()
    finally:
      for lock in locks:
        lock.release()
      for _, tmp in staged:
        _writer.remove(tmp)
    yield from (final for final, _ in written)


class _SwapSet:
  """Renames done as one set: each file a rename replaces or removes waits under a hidden name until all are done.

  undo() puts every one of them back and removes only the files this set
  created, so a failure part way leaves the user what they had, not less.
  The hidden names are temp names of this process: what a killed run left
  goes with its other temps.
  """

  def __init__(self):
    self.where: str | None = None  # What is being changed now, for the error message.
    self._done: list[tuple[str, str | None]] = []  # (path, hidden name of its old file, or None: this set made it)

  def replace(self, tmp: str, final: str) -> None:
    self.where = final
    kept = self._keep(final)
    try:
      ondisk.publish_local(tmp, final, _writer.REPLACE_ANY)
    except BaseException:
      if kept is not None:
        self._done.append((final, kept))  # undo() puts it back (moved) or drops the extra link.
      raise
    self._done.append((final, kept))

  def remove(self, path: str) -> None:
    self.where = path
    hidden = ondisk.temp_name(ondisk.local_abspath(path))
    os.rename(path, hidden)
    self._done.append((path, hidden))

  @staticmethod
  def _keep(final: str) -> str | None:
    """A hidden name for the file at `final` (None if none), which stays in place until replaced."""
    if not os.path.lexists(final):
      return None
    hidden = ondisk.temp_name(ondisk.local_abspath(final))
    try:
      os.link(final, hidden, follow_symlinks=False)  # A symlink is kept as the link, not what it names.
    except OSError as e:
      if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
        raise
      os.rename(final, hidden)  # No hard link here: the old file steps aside until the new one is in.
    return hidden

  def undo(self) -> list[str]:
    """Puts back what the set replaced or removed, newest first; returns the paths that could not be."""
    lost = []
    for path, kept in reversed(self._done):
      try:
        if kept is None:
          _writer.remove(path)  # Created by this set: nothing was there before.
          continue
        os.replace(kept, path)  # Does nothing if `path` is still the same file (a link that was never replaced).
        if os.path.lexists(kept):
          os.remove(kept)
      except OSError:
        lost.append(path)
    self._done = []
    return lost

  def commit(self) -> None:
    """Drops the replaced and removed files: the whole set is in place."""
    for _, kept in self._done:
      if kept is not None:
        try:
          os.remove(kept)
        except OSError:
          pass  # A temp name of this process: a later run removes it once this one has exited.
    self._done = []


def _publish_error(path: str | None, error: OSError, lost: list[str], prefix: str) -> OutputWriteError:
  """One line for an OS error while publishing: which file, why, that nothing changed, and what to do."""
  reason = _writer.os_reason(error)
  if lost:
    shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
    undone = f"{len(lost)} file(s) could not be put back as they were ({shown}): check them"
  else:
    undone = "nothing was changed: the files it had replaced or removed were put back"
  path = path or prefix
  fix = write_fix(reason, path)
  e = OutputWriteError(path, reason, resume="run the re-sharding again")
  # Its own words: the shards were written; what failed is their publishing, which was undone.
  e.args = (f"Re-sharding could not publish its shards at {path}: {reason}; {undone}, and no temp file "
            f"was left. {fix[0].upper()}{fix[1:]}, then run the re-sharding again.",)
  return e


def _other_shard_counts(prefix: str, num_shards: int, suffix: str) -> list[str]:
  """What is named as a shard of another shard count under a local prefix (files or not); [] for a remote one."""
  if not ondisk.is_local(prefix):
    return []
  pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-\d{5}-of-(\d{5})" + re.escape(suffix) + r"\Z")
  folder = os.path.dirname(ondisk.local_abspath(prefix))
  try:
    names = os.listdir(folder)
  except OSError:
    return []
  return sorted(os.path.join(folder, n) for n in names if (m := pattern.match(n)) and int(m.group(1)) != num_shards)


def _refuse_other_shard_counts(prefix: str, num_shards: int, suffix: str) -> None:
  """Refuses to add shards next to a set of another shard count under the same prefix (readers would mix them)."""
  others = _other_shard_counts(prefix, num_shards, suffix)
  if others:
    raise OutputExistsError(others, f"are shards of another shard count under the prefix {prefix}, which a reader "
                                    f"of {prefix}-* would mix with these {num_shards}")


def _check_slots(prefix: str, num_shards: int, suffix: str, overwrite: bool) -> list[str]:
  """Refuses, before anything is written or replaced, a shard name that re-sharding cannot use.

  Each output name must be free or a file (not a folder, a FIFO, a broken
  link; as the match-shards planning checks). With `overwrite`, the shards of
  other shard counts under the prefix must be files too, as they will be
  removed, and no manifest.json beside them may list a file the run replaces
  or removes. Returns those other shards ([] for a remote prefix).
  """
  if not ondisk.is_local(prefix):
    return []
  finals = [_reshard_path(prefix, i, num_shards, suffix) for i in range(num_shards)]
  for final in finals:
    check_output_slot(final)
  if not overwrite:
    return []
  others = _other_shard_counts(prefix, num_shards, suffix)
  for other in others:
    try:
      mode = os.lstat(other).st_mode
    except FileNotFoundError:
      continue
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):  # Only files (and links) are removed, never a folder's content.
      what = "a directory" if stat.S_ISDIR(mode) else ondisk.special_file_kind(mode)
      raise OutputError(
          f"{other} is {what} named as a shard of another shard count under the prefix {prefix}; existing="
          f"'overwrite' removes that set, so that a reader of {prefix}-* does not mix it with these {num_shards} "
          "shards, but removes only files: move it away, or re-shard under another prefix.")
  _refuse_a_manifest_listing(prefix, [f for f in finals if os.path.lexists(f)] + others)
  return others


def _refuse_a_manifest_listing(prefix: str, paths: list[str]) -> None:
  """Refuses to replace or remove files that the folder's manifest.json lists: it would describe them no more.

  Re-sharding writes no manifest; one beside its shards is another
  conversion's (or written by hand), and the loader would then refuse the
  folder as stale. One that cannot be read lists nothing the loader would use.
  """
  folder = os.path.dirname(ondisk.local_abspath(prefix))
  path = ondisk.manifest_path(folder)
  try:
    manifest = ondisk.parse_manifest(ondisk.read_local(path), path, incomplete_ok=True)
    listed = {ondisk.local_abspath(s["output"]) for s in ondisk.resolved_shards(manifest, folder)
              if ondisk.is_local(s["output"])}
  except (OSError, ValueError):  # Missing, a folder, damaged (ManifestError is a ValueError).
    return
  hit = [p for p in paths if ondisk.local_abspath(p) in listed]
  if hit:
    shown = ", ".join(hit[:3]) + (f" and {len(hit) - 3} more" if len(hit) > 3 else "")
    raise OutputError(
        f"{path} lists {len(hit)} file(s) that re-sharding with existing='overwrite' would replace or remove "
        f"({shown}), so it would no longer describe its folder. Nothing was converted. Re-shard under a prefix "
        "in another folder, or move that manifest.json away first.")


def _remove_dead_runs_temps(folder: str) -> None:
  """Removes the temp files that dead processes (a killed run) left in `folder`, whatever name they were for.

  Each shard's writer clears only the temps of its own name; a killed run of
  another shard count left others. Only live processes' temps are kept (see
  loader.ondisk); not recursive: a prefix's folder may be a big shared one.
  """
  try:
    names = os.listdir(folder)
  except OSError:
    return
  dead = {t[0] for t in map(ondisk.parse_temp_name, names) if t and ondisk.is_alive(t[1]) is False}
  for base in sorted(dead):
    ondisk.remove_stale_temps_of(os.path.join(folder, base))


class _ReshardPipeline(beam.Pipeline):
  """A Beam pipeline that removes its shards' temp files when its run fails.

  Written shards wait under temp names for the publish step; a run that
  fails before it (a full disk, a bad input) leaves none of them behind.
  """

  output_folder: str | None = None
  # (prefix, num_shards, suffix, overwrite): the output names, checked again when the run starts.
  shards: tuple[str, int, str, bool] | None = None

  def run(self, *args, **kwargs):
    if self.shards is not None:
      _check_slots(*self.shards)  # What appeared since it was built, refused before any work.
    if self.output_folder is not None and os.path.isdir(self.output_folder):
      _remove_dead_runs_temps(self.output_folder)  # As the CLI does before converting.
    try:
      return super().run(*args, **kwargs)
    except BaseException:
      if self.output_folder is not None and os.path.isdir(self.output_folder):
        ondisk.remove_stale_temps(self.output_folder, also_own=True)
      raise


def convert_tf_to_arrayrecord_disk(
    num_shards: int = 1, args: dict[str, Any] | None = None,
    pipeline_options: PipelineOptions | None = None) -> beam.Pipeline:
  """Re-shards TFRecords (N files) into `num_shards` ArrayRecord files.

  Output names follow the reference: `{output}-SSSSS-of-NNNNN.arrayrecord`
  (override with args['file_name_suffix']). Every shard exists, even if empty.
  Records are assigned to shards by a hash of (file, index); order inside a
  shard follows Beam's grouping and is not defined, as in the reference. Use
  the match-shards pipeline to keep order. Existing outputs are refused unless
  args['existing'] == 'overwrite' (the reference replaced them silently).

  Local shards are written under temp names and get their final names
  together, once all are written, under the output folder's lock: a failed
  or killed run leaves none of them (a killed run's temps go in the next
  run), and two runs never mix their shards. (gs:// shards are published one
  by one as they are written.)

  existing='overwrite' replaces the dataset under the prefix: once the new
  set is in place, the shards of other shard counts under the same prefix
  are removed too (a reader of `{output}-*` would read both sets). If
  publishing fails part way, every file it replaced or removed is put back.
  An output name taken by a folder or a FIFO, or a manifest.json beside the
  shards that lists a file the run would replace or remove, is refused
  before any work.
  """
  if args is None:
    raise ValueError("args={'input': ..., 'output': ...} is required.")
  if not isinstance(num_shards, int) or num_shards <= 0:
    raise ValueError(f"num_shards must be a positive int, got {num_shards!r}.")
  patterns = _patterns(args)
  options = ConvertOptions(output_dir=args["output"],
                           writer_options=args.get("writer_options", "group_size:1"),
                           compression=args.get("compression", "auto"),
                           on_corrupt=args.get("on_corrupt", "fail"))
  suffix = args.get("file_name_suffix", ".arrayrecord")
  existing = args.get("existing", "error")
  if existing not in ("error", "overwrite"):
    raise ValueError(f"args['existing'] must be 'error' or 'overwrite' for re-sharding (got {existing!r}).")
  shards = (args["output"], num_shards, suffix, existing == "overwrite")
  _check_slots(*shards)  # First: a folder at an output name is no output that overwriting would replace.
  if existing == "error":
    present = [o for o in (_reshard_path(args["output"], i, num_shards, suffix) for i in range(num_shards))
               if _writer.exists(o)]
    if present:
      raise OutputExistsError(present, "would be replaced by re-sharding")
    _refuse_other_shard_counts(args["output"], num_shards, suffix)
  p = build.new_pipeline(pipeline_options, _ReshardPipeline)
  p.output_folder = os.path.dirname(ondisk.local_abspath(args["output"])) if ondisk.is_local(args["output"]) else None
  p.shards = shards
  keyed = (p | "MatchInputs" >> MatchFiles(patterns)
           | "ReadAndKey" >> beam.ParDo(
               _KeyRecordsFn(num_shards, options.compression, options.on_corrupt)))
  every_shard = p | "AllShards" >> beam.Create([(i, None) for i in range(num_shards)])
  _ = ((keyed, every_shard) | "Merge" >> beam.Flatten()
       | "GroupByShard" >> beam.GroupByKey()
       | "WriteShards" >> beam.ParDo(_WriteShardFn(
           args["output"], num_shards, suffix, options.writer_options, existing == "overwrite"))
       | "CollectShards" >> beam.combiners.ToList()
       | "PublishShards" >> beam.ParDo(_PublishShardsFn(args["output"], num_shards, suffix, existing == "overwrite")))
  return p
