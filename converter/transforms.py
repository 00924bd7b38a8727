"""Beam PTransforms: match TFRecord inputs and convert each to its own ArrayRecord file."""

from __future__ import annotations

import secrets
import time
from typing import Any, Iterable

import apache_beam as beam
from apache_beam.metrics import Metrics

from converter import manifest as _manifest
from converter import writer as _writer
from converter.errors import (ConcurrentRunError, CorruptRecordError, DamagedSinceError, InputChangedError, InputError,
                              KeptOutputError, KeptOutputGoneError, RecordMemoryError)
from converter.manifest import RecordDigest
from converter.options import ConvertOptions
from converter.planning import ShardPlan, marker_entries, match_pattern, plan_shards
from converter.tfrecord import TFRecordReader
from loader import ondisk


class MatchFiles(beam.PTransform):
  """Expands glob patterns into file paths inside the pipeline.

  Listing happens on the workers (so submitting a gs:// job needs no access
  to the bucket); a pattern that matches nothing fails with its name.
  """

  def __init__(self, patterns: str | Iterable[str], skip_under: str | None = None):
    """`skip_under`: the conversion's output folder, whose own files (its ArrayRecord files, its manifest) a
    wildcard then leaves out, as arrayrecord-convert's --input does: a glob over a folder converted in place
    would otherwise list that run's outputs as inputs."""
    super().__init__()
    self._patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not self._patterns:
      raise ValueError("MatchFiles needs at least one pattern.")
    self._skip_under = skip_under

  def expand(self, pbegin):
    return (pbegin
            | "Patterns" >> beam.Create(self._patterns)
            | "Match" >> beam.FlatMap(match_pattern, skip_under=self._skip_under))


class _PlanFn(beam.DoFn):
  """Sees all input paths at once: names outputs, checks existing ones.

  Before any shard is converted, it replaces manifest.json by the marker of
  a run in progress (loader.ondisk.INCOMPLETE), so a run that stops or fails
  never leaves a directory that reads as complete; the final manifest
  replaces the marker at the end.
  """

  def __init__(self, options: ConvertOptions):
    self._options = options
    # Made once when the pipeline is built, so a retried planning step knows its own marker.
    self.run_id = secrets.token_hex(8)

  def process(self, inputs: list[str]):
    plans = plan_shards(inputs, self._options, run_id=self.run_id)
    if _needs_marker(plans, self._options.output_dir):
      _manifest.write_incomplete_manifest(
          self._options.output_dir, marker_entries(plans), writer_options=self._options.writer_options,
          existing=self._options.existing, run_id=self.run_id)
    yield from plans


def _needs_marker(plans: list[ShardPlan], output_dir: str) -> bool:
  """Whether a run must mark manifest.json as in progress before it converts.

  Always when it converts into a local directory (the loader reads those),
  and when it converts nothing but finds a stopped run's marker.
  Into gs:// and other remote prefixes, which the loader does not read, only
  when there is something a stopped run could leave mixed with new shards
  (outputs it keeps or replaces, or a manifest), not for a fresh prefix.
  """
  todo = [p for p in plans if p.action == "convert"]
  if not todo:
    # Every shard is kept, but a stopped run's marker is still there (it died
    # after its last shard, before its manifest): this run, which planning let
    # resume it, takes the marker over, so its final manifest may replace it.
    found = _manifest.find_manifest(output_dir)
    return found is not None and found.kind == "incomplete"
  if _writer.is_local(output_dir):
    return True
  return (len(todo) < len(plans) or any(p.replaces is not None for p in todo)
          or _writer.exists(_manifest.manifest_path(output_dir)))


class _ConvertShardFn(beam.DoFn):
  """Streams one TFRecord file into one ArrayRecord file."""

  def __init__(self, options: ConvertOptions):
    self._options = options
    self.records = Metrics.counter(self.__class__, "records")
    self.bytes_in = Metrics.counter(self.__class__, "bytes_in")
    self.bytes_out = Metrics.counter(self.__class__, "bytes_out")
    self.files = Metrics.counter(self.__class__, "files")
    self.files_kept = Metrics.counter(self.__class__, "files_kept_existing")
    self.files_failed = Metrics.counter(self.__class__, "files_failed")
    self.corrupt_skipped = Metrics.counter(self.__class__, "corrupt_records_skipped")

  def process(self, plan: ShardPlan):
    if plan.action == "keep":
      self.files_kept.inc()
      yield kept_shard_entry(plan)
      return
    opts = self._options
    reader = TFRecordReader(plan.input, compression=opts.compression, on_corrupt=opts.on_corrupt)
    digest = RecordDigest()
    start = time.monotonic()
    try:
      with _writer.ArrayRecordShardWriter(plan.output, opts.writer_options,
                                          expect=plan.replaces, root=opts.output_dir) as w:
        _manifest.write_digested(reader, w.write, digest)
        _check_unchanged(reader)  # Before publishing: records and sizes of one file.
        _check_no_loss(plan, reader)
        bytes_out = w.commit()
    except InputError as e:
      # It was a regular file when planned: found gone or unreadable while
      # converting, after other shards may have been written (exit 1, not 2).
      raise InputChangedError(e.path, e.problem) from None
    except RecordMemoryError:
      raise
    except MemoryError as e:
      # The writer's (the reader's own names the record's offset): one line naming the file, not a bare MemoryError.
      index, length, offset, compressed = getattr(e, "record_at", (reader.stats.records, None, None, False))
      raise RecordMemoryError(plan.input, index, offset, length, compressed=compressed) from None
    except CorruptRecordError as e:
      _check_unchanged(reader)  # A file rewritten under the reader looks damaged; say what happened.
      if opts.on_corrupt == "fail":
        raise
      # In 'skip' mode we only get here when the framing could not resync.
      self.files_failed.inc()
      self.corrupt_skipped.inc(reader.stats.skipped)
      yield {"input": plan.input, "output": plan.output, "status": "failed", "error": str(e),
             "records": None, "corrupt_records_skipped": reader.stats.skipped}
      return
    bytes_in = reader.opened_size if reader.opened_size is not None else _writer.file_size(plan.input)
    self.files.inc()
    self.records.inc(digest.records)
    self.bytes_in.inc(bytes_in)
    self.bytes_out.inc(bytes_out)
    self.corrupt_skipped.inc(reader.stats.skipped)
    yield {
        "input": plan.input,
        "output": plan.output,
        "status": "converted",
        "records": digest.records,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "record_bytes": reader.stats.bytes_records,
        "digest": digest.hexdigest(),
        "compression": reader.detected_compression,
        "corrupt_records_skipped": reader.stats.skipped,
        "input_truncated": reader.stats.truncated,
        "seconds": round(time.monotonic() - start, 3),
        **reader.opened_times,
    }


def _check_no_loss(plan: ShardPlan, reader: TFRecordReader) -> None:
  """Refuses to replace an output converted whole by one missing records of its input damaged since."""
  stats = reader.stats
  if plan.lossless_output and (stats.skipped or stats.truncated) and stats.first_loss is not None:
    raise DamagedSinceError(plan.input, plan.output, *stats.first_loss, stats.skipped, stats.truncated)


def _check_unchanged(reader: TFRecordReader) -> None:
  change = reader.change()
  if change is not None:
    raise InputChangedError(reader.path, change)


def kept_shard_entry(plan: ShardPlan) -> dict[str, Any]:
  """The manifest entry of a kept output, rebuilt from the file itself.

  The record count comes from the ArrayRecord footer. The earlier manifest's
  digest is carried over only when that entry still describes this file (same
  record count and size); otherwise (no manifest after a killed run, or a
  stale one) the file is read once to recompute it.
  """
  prev = plan.previous or {}
  try:
    bytes_out = _writer.file_size(plan.output)
  except FileNotFoundError:
    # Deleted after planning (on Dataflow a shuffle lies between): a bare "[Errno 2] No such file" before.
    raise KeptOutputGoneError(plan.output) from None
  try:
    records = (_manifest.array_record_count(plan.output) if _writer.is_local(plan.output)
               else None)
    trusted = (isinstance(prev.get("digest"), str) and prev.get("bytes_out") == bytes_out
               and isinstance(prev.get("records"), int)
               and (records is None or prev["records"] == records))
    if trusted:
      records, digest = prev["records"], prev["digest"]
    else:
      records, digest = _manifest.array_record_digest(plan.output)
  except RuntimeError as e:  # array_record's reader: damaged or cut short since planning.
    raise KeptOutputError(
        f"{plan.output} was to be kept (--skip-existing) but cannot be read as an ArrayRecord file "
        f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); other shards may have been "
        "converted already. Rerun with --overwrite to replace it, or remove it and rerun with --skip-existing.") from e
  keep = {k: prev[k] for k in ("compression", "record_bytes", "corrupt_records_skipped",
                               "input_truncated") if trusted and k in prev}
  try:
    bytes_in = _writer.file_size(plan.input)
  except FileNotFoundError:
    # Deleted since it was listed (a sync job, a producer rewriting its shards): said as for a shard being
    # converted, where this raised a bare "RuntimeError: FileNotFoundError: [Errno 2] ..." with a traceback.
    raise InputChangedError(plan.input, "does not exist") from None
  return {**keep, "input": plan.input, "output": plan.output, "status": "existing",
          "records": records, "bytes_in": bytes_in,
          "bytes_out": bytes_out, "digest": digest,
          "digest_from": "manifest" if trusted else "file", **(plan.input_times or {})}


def _check_marker_is_ours(results: list[dict[str, Any]], options: ConvertOptions, run_id: str) -> None:
  """Refuses to publish a manifest when another run replaced this run's marker meanwhile.

  The directory lock is the CLI's; runs through this PTransform alone can
  still race, and the last manifest written would then drop the other's shards.
  """
  found = _manifest.find_manifest(options.output_dir)
  marker = found.manifest if found is not None and found.kind == "incomplete" else None
  if marker is not None:
    if ondisk.marker_run(marker).get("id") != run_id:
      raise ConcurrentRunError(found.path, ondisk.marker_run(marker), after=True)
    return
  # A local run that converted anything wrote a marker (a remote one may not have).
  if not _writer.is_local(options.output_dir) or all(r["status"] == "existing" for r in results):
    return
  if (found is not None and found.kind == "complete"
      and {s["output"] for s in found.manifest["shards"]} == {r["output"] for r in results}):
    return  # This step retried: its manifest is already in place.
  raise ConcurrentRunError(_manifest.manifest_path(options.output_dir), {}, after=True)  # A finished run's: no `run`.


def _write_manifest(results: list[dict[str, Any]], options: ConvertOptions, run_id: str) -> str:
  _check_marker_is_ours(results, options, run_id)
  m = _manifest.build_manifest(results, writer_options=options.writer_options,
                               output_dir=options.output_dir)
  return _manifest.write_manifest(options.output_dir, m)


class ConvertToArrayRecord(beam.PTransform):
  """Converts each TFRecord file in a PCollection of paths to one ArrayRecord file.

  Records keep their order; output names map `.tfrecord` to `.array_record`
  (see converter.naming); the inputs' folder layout is kept under output_dir.
  Each file is streamed by one DoFn call, so memory does not grow with shard
  size. A manifest.json is written to output_dir at the end.

  Returns:
    A PCollection with one result dict per input shard (status, records,
    bytes, digest).
  """

  def __init__(self, output_dir: str, *, writer_options: str = "group_size:1",
               compression: str = "auto", on_corrupt: str = "fail",
               existing: str = "error", suffix: str = "array_record",
               input_root: str | None = None):
    super().__init__()
    self._options = ConvertOptions(
        output_dir=output_dir, writer_options=writer_options, compression=compression,
        on_corrupt=on_corrupt, existing=existing, suffix=suffix, input_root=input_root)

  @property
  def options(self) -> ConvertOptions:
    return self._options

  def expand(self, paths):
    plan = _PlanFn(self._options)
    results = (paths
               | "CollectInputs" >> beam.combiners.ToList()
               | "PlanShards" >> beam.ParDo(plan)
               | "Distribute" >> beam.Reshuffle()
               | "ConvertShards" >> beam.ParDo(_ConvertShardFn(self._options)))
    _ = (results
         | "CollectResults" >> beam.combiners.ToList()
         | "WriteManifest" >> beam.Map(_write_manifest, self._options, plan.run_id))
    return results

  def display_data(self):
    o = self._options
    return {"output_dir": o.output_dir, "writer_options": o.writer_options,
            "compression": o.compression, "on_corrupt": o.on_corrupt, "existing": o.existing}
