"""Drop-in replacements for array_record.beam.pipelines, for people migrating.

Same names and calling convention (`args` dict, `pipeline_options`, an un-run
`beam.Pipeline` returned), without parsing sys.argv at import and without the
crash of the reference match-shards pipeline on current Beam.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import xxhash
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from converter import ConvertOptions, MatchFiles, OutputExistsError, TFRecordReader
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
  p = beam.Pipeline(options=pipeline_options or build.pipeline_options([]))
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
  def __init__(self, prefix: str, num_shards: int, suffix: str, writer_options: str, overwrite: bool):
    self._prefix, self._num_shards = prefix, num_shards
    self._suffix, self._writer_options = suffix, writer_options
    self._overwrite = overwrite

  def process(self, keyed):
    shard, records = keyed
    path = _reshard_path(self._prefix, shard, self._num_shards, self._suffix)
    if ondisk.is_local(path):
      ondisk.remove_stale_temps_of(path)  # Left by a killed (kill -9) run.
    # Without overwrite, a file another writer published meanwhile is not replaced either.
    expect = _writer.REPLACE_ANY if self._overwrite else None
    with _writer.ArrayRecordShardWriter(path, self._writer_options, expect=expect) as w:
      for r in records:
        if r is not None:
          w.write(r)
      w.commit()
    yield path


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
  p = beam.Pipeline(options=pipeline_options or build.pipeline_options([]))
  keyed = (p | "MatchInputs" >> MatchFiles(patterns)
           | "ReadAndKey" >> beam.ParDo(
               _KeyRecordsFn(num_shards, options.compression, options.on_corrupt)))
  every_shard = p | "AllShards" >> beam.Create([(i, None) for i in range(num_shards)])
  _ = ((keyed, every_shard) | "Merge" >> beam.Flatten()
       | "GroupByShard" >> beam.GroupByKey()
       | "WriteShards" >> beam.ParDo(_WriteShardFn(
           args["output"], num_shards, suffix, options.writer_options, existing == "overwrite")))
  return p
