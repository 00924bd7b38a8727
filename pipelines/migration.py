"""Drop-in replacements for array_record.beam.pipelines, for people migrating.

Same names and calling convention (`args` dict, `pipeline_options`, an un-run
`beam.Pipeline` returned), without parsing sys.argv at import and without the
crash of the reference match-shards pipeline on current Beam.
"""

from __future__ import annotations

import os
import re
from typing import Any

import apache_beam as beam
import xxhash
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from converter import ConvertOptions, MatchFiles, OutputExistsError, TFRecordReader
from converter.errors import OutputLockedError, OutputWriteError
from converter import writer as _writer
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
                             "anew; pass existing='overwrite' if some were published)") from None
    self.shards.inc()
    yield path, w.staged


def _write_all(writer: Any, records: Any) -> None:
  for r in records:
    if r is not None:  # The empty marker every shard gets.
      writer.write(r)


class _PublishShardsFn(beam.DoFn):
  """Gives the written temps their final names all at once, under the output folder's lock.

  So a run killed before this step leaves no shard under a final name (its
  temps go in the next run), and two runs never mix their shards.
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
    locks, published = [], []
    try:
      for folder in folders:
        locks.append(ondisk.DirLock(folder).acquire())
      if not self._overwrite:
        present = [final for final, tmp in staged if os.path.exists(final) and os.path.exists(tmp)]
        if present:
          raise OutputExistsError(present, "appeared while re-sharding (another run wrote them)")
        _refuse_other_shard_counts(self._prefix, self._num_shards, self._suffix)
      # No yield until all are renamed: the window in which a kill leaves part of the set is the renames'.
      for final, tmp in staged:
        if os.path.exists(tmp):  # Gone: a retry of this step published it already.
          ondisk.publish_local(tmp, final, _writer.REPLACE_ANY)
          published.append(final)
    except ondisk.LockedError as e:
      raise OutputLockedError(str(e)) from None
    except BaseException:
      for final in published:  # All or none: a set in part would read as the dataset.
        _writer.remove(final)
      raise
    finally:
      for lock in locks:
        lock.release()
      for _, tmp in staged:
        _writer.remove(tmp)
    yield from (final for final, _ in written)


def _refuse_other_shard_counts(prefix: str, num_shards: int, suffix: str) -> None:
  """Refuses to add shards next to a set of another shard count under the same prefix (readers would mix them)."""
  if not ondisk.is_local(prefix):
    return
  pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-\d{5}-of-(\d{5})" + re.escape(suffix) + r"\Z")
  folder = os.path.dirname(ondisk.local_abspath(prefix))
  try:
    names = os.listdir(folder)
  except OSError:
    return
  others = sorted(os.path.join(folder, n) for n in names if (m := pattern.match(n)) and int(m.group(1)) != num_shards)
  if others:
    raise OutputExistsError(others, f"are shards of another shard count under the prefix {prefix}, which a reader "
                                    f"of {prefix}-* would mix with these {num_shards}")


class _ReshardPipeline(beam.Pipeline):
  """A Beam pipeline that removes its shards' temp files when its run fails.

  Written shards wait under temp names for the publish step; a run that
  fails before it (a full disk, a bad input) leaves none of them behind.
  """

  output_folder: str | None = None

  def run(self, *args, **kwargs):
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
  if existing == "error":
    present = [o for o in (_reshard_path(args["output"], i, num_shards, suffix) for i in range(num_shards))
               if _writer.exists(o)]
    if present:
      raise OutputExistsError(present, "would be replaced by re-sharding")
    _refuse_other_shard_counts(args["output"], num_shards, suffix)
  p = build.new_pipeline(pipeline_options, _ReshardPipeline)
  p.output_folder = os.path.dirname(ondisk.local_abspath(args["output"])) if ondisk.is_local(args["output"]) else None
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
