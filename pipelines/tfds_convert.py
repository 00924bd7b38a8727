"""Convert a prepared TFDS dataset (TFRecord shards) to TFDS's ArrayRecord format.

  python -m pipelines.tfds_convert --dataset_dir ~/tensorflow_datasets/mnist/3.0.1 \
      --out_dir /data/mnist_ar/mnist/3.0.1 [--writer-options group_size:1] \
      [--overwrite | --skip-existing] [--verify] [Beam flags, e.g. --runner ...]

With --out_dir, OUT gets `name-split.array_record-0000X-of-0000N` shards, a
dataset_info.json whose fileFormat is array_record (same splits and shard
lengths) and copies of every other metadata file (features.json, label
files, ...), so `tfds.builder_from_directory(OUT).as_data_source(split)`
reads it. Without --out_dir (or with OUT == DIR) the ArrayRecord shards go
beside the TFRecord ones and array_record is added to the dataset's
alternativeFileFormats; the TFRecord files are not touched.

The converter's manifest.json (per shard record counts and digests, used by
--skip-existing) is written into OUT as well; TFDS ignores files it does not
know.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import os
import posixpath
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

if __name__ == "__main__":  # `python -m`: run as the console script (a missing extra, Ctrl-C at start-up: one line).
  from pipelines import entry_points  # pylint: disable=g-import-not-at-top
  entry_points.run_as_script(__spec__)

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from converter import (MANIFEST_NAME, ConversionError, ConvertOptions, OutputExistsError, ShardPlan,
                       plan_shards, read_manifest)
from converter import writer as _writer
from converter.naming import output_path
from loader import ondisk
from loader import reader_threads
from loader import tfds as _layout
from converter.guard import ConversionGuard
from pipelines import build, cli, convert, local_run, progress, verify, workers

PROG = "arrayrecord-tfds"
INPUT_FORMAT = "tfrecord"
_log = logging.getLogger(__name__)


def _join(directory: str, relpath: str) -> str:
  return posixpath.join(directory.rstrip("/"), relpath)


def _same_dir(a: str, b: str) -> bool:
  if _writer.is_local(a) and _writer.is_local(b):
    return os.path.realpath(a) == os.path.realpath(b)
  return a.rstrip("/") == b.rstrip("/")


def _clean_dir(path: str) -> str:
  if not path or not isinstance(path, str):
    raise ValueError(f"Expected a directory path, got {path!r}.")
  if _writer.is_local(path):
    return ondisk.local_abspath(os.path.expanduser(path))
  return path.rstrip("/")


@dataclasses.dataclass(frozen=True)
class SplitPlan:
  """The shards of one split: inputs, outputs and records per shard."""

  name: str
  inputs: tuple[str, ...]
  outputs: tuple[str, ...]
  shard_lengths: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TfdsPlan:
  """What converting one TFDS dataset folder reads and writes.

  Attributes:
    dataset_dir: The dataset version folder with dataset_info.json.
    out_dir: Where the ArrayRecord dataset goes; equal to dataset_dir in
      in-place mode.
    info: The source dataset_info.json, parsed.
    splits: Per split shard lists, in dataset_info.json order.
    metadata_files: Paths relative to dataset_dir of the non-shard files
      copied to out_dir (empty in in-place mode); dataset_info.json is
      rewritten, not copied.
  """

  dataset_dir: str
  out_dir: str
  info: Mapping[str, Any]
  splits: tuple[SplitPlan, ...]
  metadata_files: tuple[str, ...] = ()

  @property
  def in_place(self) -> bool:
    return _same_dir(self.dataset_dir, self.out_dir)

  @property
  def inputs(self) -> list[str]:
    return [p for s in self.splits for p in s.inputs]

  @property
  def expected_records(self) -> dict[str, int]:
    return {o: n for s in self.splits for o, n in zip(s.outputs, s.shard_lengths)}


def _list_files(directory: str) -> list[str]:
  """Basenames of the plain files directly in `directory`."""
  if _writer.is_local(directory):
    return sorted(n for n in os.listdir(directory)
                  if os.path.isfile(os.path.join(directory, n)))
  return sorted(_writer.remote_folder_listing(directory))


def _metadata_files(dataset_dir: str, info: Mapping[str, Any]) -> tuple[str, ...]:
  """Every top-level file that is not a shard (of any format), dataset_info or our manifest."""
  shard_res = [_layout.shard_name_regex(info, s) for s in _layout.split_names(info)]
  skip = {_layout.DATASET_INFO_NAME, MANIFEST_NAME}
  return tuple(n for n in _list_files(dataset_dir)
               if n not in skip and not n.startswith(".")
               and not any(r.match(n) for r in shard_res))


def plan_tfds(dataset_dir: str, out_dir: str | None = None) -> TfdsPlan:
  """Reads dataset_info.json and maps each TFRecord shard to its ArrayRecord name.

  Raises:
    NotATfdsDatasetError: dataset_dir has no dataset_info.json.
    ValueError: the dataset is not stored as TFRecord, has no shards, or (in
      place) already is ArrayRecord.
  """
  dataset_dir = _clean_dir(dataset_dir)
  out_dir = dataset_dir if out_dir is None else _clean_dir(out_dir)
  info = _layout.read_dataset_info(dataset_dir)
  formats = _layout.available_file_formats(info)
  in_place = _same_dir(dataset_dir, out_dir)
  if INPUT_FORMAT not in formats:
    raise ValueError(
        f"TFDS dataset {dataset_dir!r} is stored as {formats}; {PROG} converts datasets "
        f"stored as {INPUT_FORMAT!r}.")
  if in_place and info.get("fileFormat") == _layout.ARRAY_RECORD:
    raise ValueError(f"TFDS dataset {dataset_dir!r} is already stored as "
                     f"{_layout.ARRAY_RECORD!r}; nothing to convert.")
  splits = []
  for name in _layout.split_names(info):
    rel_in = _layout.shard_relpaths(info, name, INPUT_FORMAT)
    rel_out = _layout.shard_relpaths(info, name, _layout.ARRAY_RECORD)
    splits.append(SplitPlan(
        name=name,
        inputs=tuple(_join(dataset_dir, r) for r in rel_in),
        outputs=tuple(_join(out_dir, r) for r in rel_out),
        shard_lengths=tuple(_layout.shard_lengths(info, name))))
  if not any(s.inputs for s in splits):
    raise ValueError(f"TFDS dataset {dataset_dir!r} lists no shards in any split "
                     f"(splits: {[s.name for s in splits]}); nothing to convert.")
  metadata = () if in_place else _metadata_files(dataset_dir, info)
  return TfdsPlan(dataset_dir=dataset_dir, out_dir=out_dir, info=info, splits=tuple(splits),
                  metadata_files=metadata)


def tfds_convert_options(plan: TfdsPlan, options: ConvertOptions | None = None) -> ConvertOptions:
  """The converter options for a plan: output_dir/input_root set, names checked.

  The converter names outputs by replacing `.tfrecord` with `.array_record`
  and keeping the folder layout under input_root; this checks that this
  gives exactly TFDS's names for every shard.
  """
  options = options or ConvertOptions(output_dir=plan.out_dir)
  if options.suffix != _layout.ARRAY_RECORD:
    raise ValueError(f"TFDS reads ArrayRecord shards named '.{_layout.ARRAY_RECORD}'; got "
                     f"suffix={options.suffix!r}.")
  options = dataclasses.replace(options, output_dir=plan.out_dir, input_root=plan.dataset_dir)
  for s in plan.splits:
    for i, o in zip(s.inputs, s.outputs):
      ours = output_path(i, plan.dataset_dir, plan.out_dir, options.suffix)
      if ours != o:
        raise ConversionError(
            f"Split {s.name!r}: filepathTemplate "
            f"{_layout.filepath_template(plan.info, s.name)!r} names the ArrayRecord shard "
            f"{o!r}, but the converter would write {ours!r}. Templates must put "
            "{FILEFORMAT} in the file name, e.g. "
            f"{_layout.DEFAULT_FILEPATH_TEMPLATE!r}.")
  return options


def check_shards_exist(plan: TfdsPlan) -> None:
  """Refuses a dataset whose dataset_info.json names shards that are not there (one listing per folder)."""
  missing = progress.missing_files(plan.inputs)
  if missing:
    raise ConversionError(
        f"{len(missing)} of {len(plan.inputs)} TFRecord shard(s) named by "
        f"{_join(plan.dataset_dir, _layout.DATASET_INFO_NAME)} are missing, e.g. "
        f"{missing[0]!r}. The dataset is incomplete; prepare it again.")


def check_inputs_and_outputs(plan: TfdsPlan, options: ConvertOptions) -> list:
  """Up-front checks of a run: inputs exist, outputs per options.existing.

  Returns:
    The converter's ShardPlans.
  """
  check_shards_exist(plan)
  shard_plans = plan_shards(plan.inputs, options)
  if not plan.in_place and options.existing == "error":
    names = [_layout.DATASET_INFO_NAME, *plan.metadata_files]
    existing = [p for p in (_join(plan.out_dir, n) for n in names) if _writer.exists(p)]
    if existing:
      raise OutputExistsError(existing)
  if not plan.in_place and options.existing == "skip":
    _check_metadata_to_keep(plan)
  return shard_plans


def _retract_array_record_format(plan: TfdsPlan, shard_plans: Sequence[ShardPlan]) -> None:
  """Before existing ArrayRecord shards are replaced, TFDS stops seeing them as a dataset.

  An interrupted run then leaves no dataset_info.json that names a mix of old
  and new shards (out of place: it is removed; in place: array_record leaves
  alternativeFileFormats). The run's last step writes it again.
  """
  if not any(s.action == "convert" and s.replaces is not None for s in shard_plans):
    return
  path = _join(plan.out_dir, _layout.DATASET_INFO_NAME)
  if not plan.in_place:
    if _writer.exists(path):
      _writer.remove(path)
    return
  info = _layout.read_dataset_info(plan.dataset_dir)
  if _layout.ARRAY_RECORD in info.get("alternativeFileFormats", []):
    info["alternativeFileFormats"] = [f for f in info["alternativeFileFormats"] if f != _layout.ARRAY_RECORD]
    _writer.write_bytes_atomic(path, json.dumps(info, indent=2, sort_keys=True).encode())


def _check_metadata_to_keep(plan: TfdsPlan) -> None:
  """A resume (--skip-existing) replaces metadata only where it is this conversion's own.

  Metadata files must equal the source's, and a dataset_info.json must be an
  ArrayRecord conversion of the same dataset (name, config, version, splits);
  anything else is another dataset's, which only --overwrite replaces.
  """
  other = []
  for name in plan.metadata_files:
    path = _join(plan.out_dir, name)
    if _writer.exists(path) and _writer.read_bytes(path) != _writer.read_bytes(_join(plan.dataset_dir, name)):
      other.append(path)
  info_path = _join(plan.out_dir, _layout.DATASET_INFO_NAME)
  if _writer.exists(info_path):
    try:
      info = json.loads(_writer.read_bytes(info_path))
    except ValueError:
      info = None
    same = isinstance(info, dict) and info.get("fileFormat") == _layout.ARRAY_RECORD and all(
        info.get(k) == plan.info.get(k) for k in ("name", "configName", "version")) and (
        [s.get("name") for s in info.get("splits", [])] == [s.get("name") for s in plan.info.get("splits", [])])
    if not same:
      other.append(info_path)
  if other:
    raise OutputExistsError(other, "are not this conversion's (another dataset's, or the source's TFRecord "
                                   "dataset itself), so --skip-existing would replace them")



def _count_records(path: str) -> int | None:
  if not _writer.is_local(path):
    return None
  r = reader_threads.reader_class(path)(path)
  try:
    return r.num_records()
  finally:
    r.close()


def _tfds_root(dataset_dir: str, info: Mapping[str, Any]) -> str:
  """The data_dir TFDS would name for a dataset folder (strips name/[config/]version)."""
  parts = [info["name"], info.get("configName"), info.get("version")]
  tail = "/".join(p for p in parts if p)
  d = dataset_dir.rstrip("/")
  return d[: -len(tail)].rstrip("/") if tail and d.endswith("/" + tail) else d


def output_dataset_info(plan: TfdsPlan, counts: Mapping[str, int]) -> dict[str, Any]:
  """dataset_info.json for out_dir.

  Out of place: fileFormat array_record, no alternative formats (only
  ArrayRecord shards are written there), the source recorded in
  dataSourceAccesses, shard lengths as written. In place: the dataset_info
  now on disk with array_record added to alternativeFileFormats.
  """
  if plan.in_place:
    info = _layout.read_dataset_info(plan.dataset_dir)  # Latest, not the plan's copy.
    alternatives = list(info.get("alternativeFileFormats", []))
    if _layout.ARRAY_RECORD not in _layout.available_file_formats(info):
      info["alternativeFileFormats"] = alternatives + [_layout.ARRAY_RECORD]
    return info
  info = json.loads(json.dumps(plan.info))
  info["fileFormat"] = _layout.ARRAY_RECORD
  info.pop("alternativeFileFormats", None)
  for split in info.get("splits", []):
    s = next(sp for sp in plan.splits if sp.name == split["name"])
    written = [counts.get(o, n) for o, n in zip(s.outputs, s.shard_lengths)]
    if tuple(written) != s.shard_lengths:
      split["shardLengths"] = [str(n) for n in written]
      stats = split.get("statistics")
      if isinstance(stats, dict) and "numExamples" in stats:
        stats["numExamples"] = str(sum(written))
  info.setdefault("dataSourceAccesses", []).append({
      "accessTimestampMs": str(int(time.time() * 1000)),
      "tfdsDataset": {k: v for k, v in {
          "name": plan.info["name"],
          "config": plan.info.get("configName"),
          "version": plan.info.get("version"),
          "dataDir": _tfds_root(plan.dataset_dir, plan.info),
      }.items() if v},
  })
  return info


def finalize_metadata(results: Sequence[Mapping[str, Any]], plan: TfdsPlan,
                      options: ConvertOptions) -> str:
  """Checks the converted shards against dataset_info.json, then writes the metadata.

  Runs once, after every shard is converted (a pipeline step, so it also
  runs on remote runners). Metadata files are copied first and
  dataset_info.json is written last, so a TFDS folder only appears complete.

  Returns:
    The path of the written dataset_info.json.

  Raises:
    ConversionError: a shard failed, is missing, or (in place, where TFDS
      keeps one shard length list for all formats) has another record count
      than dataset_info.json says.
  """
  by_output = {r["output"]: r for r in results}
  expected = plan.expected_records
  ok = ("converted", "existing")
  failed = [o for o in expected if by_output.get(o, {}).get("status") not in ok]
  if failed:
    raise ConversionError(
        f"{len(failed)} shard(s) were not converted, e.g. {failed[0]!r}; "
        f"{_layout.DATASET_INFO_NAME} in {plan.out_dir!r} was not written. See the manifest.")
  counts: dict[str, int] = {}
  for o in expected:
    n = by_output[o].get("records")
    n = _count_records(o) if n is None else n
    if n is not None:
      counts[o] = n
  differ = [(o, expected[o], counts[o]) for o in expected
            if o in counts and counts[o] != expected[o]]
  if differ:
    o, want, got = differ[0]
    detail = (f"{len(differ)} shard(s) have another record count than {_layout.DATASET_INFO_NAME} "
              f"says, e.g. {o!r}: {got} records, expected {want}")
    if options.on_corrupt != "skip":
      raise ConversionError(
          f"{detail}. The source's TFRecord shards disagree with its "
          f"{_layout.DATASET_INFO_NAME}; prepare the dataset again. "
          f"{_layout.DATASET_INFO_NAME} was not written to {plan.out_dir!r}.")
    if plan.in_place:
      raise ConversionError(
          f"{detail}. {_layout.DATASET_INFO_NAME} was not changed, so TFDS will not read "
          "these ArrayRecord files. Convert into a separate --out_dir with --on-corrupt skip "
          "to get a dataset of the readable records.")
    _log.warning("%s (corrupt records skipped); the output's shard lengths say what was "
                 "written.", detail)
  if not plan.in_place:
    for rel in plan.metadata_files:
      _writer.write_bytes_atomic(_join(plan.out_dir, rel),
                                 _writer.read_bytes(_join(plan.dataset_dir, rel)))
  info = output_dataset_info(plan, counts)
  path = _join(plan.out_dir, _layout.DATASET_INFO_NAME)
  _writer.write_bytes_atomic(path, json.dumps(info, indent=2, sort_keys=True).encode())
  return path


def add_tfds_conversion(p: beam.Pipeline, plan: TfdsPlan,
                        options: ConvertOptions | None = None) -> beam.PCollection:
  """Adds converting a planned TFDS dataset to a pipeline; returns per shard results."""
  options = tfds_convert_options(plan, options)
  results = build.add_conversion(p, options, files=plan.inputs)
  _ = (results
       | "CollectTfdsResults" >> beam.combiners.ToList()
       | "WriteTfdsMetadata" >> beam.Map(finalize_metadata, plan, options))
  return results


def build_tfds_pipeline(dataset_dir: str, out_dir: str | None,
                        options: ConvertOptions | None,
                        pipeline_options: PipelineOptions) -> beam.Pipeline:
  """A pipeline (not yet run) converting one TFDS dataset folder; any runner.

  Reads dataset_info.json when called (the launcher needs access to it);
  shards are read and written by the workers. `options.output_dir` is
  replaced by out_dir (None: in place).
  """
  plan = plan_tfds(dataset_dir, out_dir)
  p = build.new_pipeline(pipeline_options)
  add_tfds_conversion(p, plan, options)
  return p


def verify_tfds(plan: TfdsPlan, compression: str = "auto",
                workers: int | None = None) -> list[verify.ShardCheck]:
  """Re-reads every TFRecord shard and its ArrayRecord shard; compares digests."""
  manifest = read_manifest(plan.out_dir) or {}
  expected = {s["output"]: s for s in manifest.get("shards", [])}
  pairs = [(i, o) for s in plan.splits for i, o in zip(s.inputs, s.outputs)]
  with concurrent.futures.ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(
        lambda io: verify.check_shard(io[0], io[1], expected.get(io[1]), compression, convert="arrayrecord-tfds"),
        pairs))


def _parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(
      prog=PROG, allow_abbrev=False,
      description="Convert a prepared TFDS dataset from TFRecord to TFDS's ArrayRecord format "
      "with Apache Beam (DirectRunner unless --runner says otherwise). Unknown flags go to Beam.")
  p.add_argument("--dataset_dir", "--dataset-dir", dest="dataset_dir", required=True,
                 metavar="DIR", help="One dataset version folder, the one with "
                 "dataset_info.json (e.g. ~/tensorflow_datasets/mnist/3.0.1).")
  p.add_argument("--out_dir", "--out-dir", dest="out_dir", metavar="OUT",
                 help="Folder for the ArrayRecord dataset. Default: DIR itself (adds "
                 "array_record as an alternative file format; TFRecords stay).")
  cli.add_converter_flags(p, io=False)
  p.add_argument("--verify", action="store_true",
                 help="Afterwards re-read every shard pair and compare record digests.")
  workers.add_flag(p)
  p.add_argument("--quiet", action="store_true",
                 help="Print only the summary (no progress line).")
  return p


def _summary(plan: TfdsPlan) -> str:
  info = _layout.read_dataset_info(plan.out_dir)  # As written: shard lengths may have changed.
  splits = ", ".join(
      f"{name}: {sum(_layout.shard_lengths(info, name)):,} records in "
      f"{len(_layout.shard_lengths(info, name))} shard(s)" for name in _layout.split_names(info))
  load = f"Load it with tfds.builder_from_directory({plan.out_dir!r}).as_data_source(split)."
  if plan.in_place:
    return (f"Added {_layout.ARRAY_RECORD} to the file formats of {plan.dataset_dir} "
            f"({splits}).\n{load}")
  return f"TFDS dataset in {_layout.ARRAY_RECORD} format: {plan.out_dir} ({splits}).\n{load}"


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the conversion; returns the manifest (plus `_plan`, `_seconds`, `_checks`)."""
  args, beam_args = _parser().parse_known_args(argv)
  plan = plan_tfds(args.dataset_dir, args.out_dir)
  options = tfds_convert_options(plan, cli.converter_options(args, output_dir=plan.out_dir))
  # Checks, locks the output dir and plans, before any work starts.
  guard = ConversionGuard(plan.inputs, options, plan=lambda _, o: check_inputs_and_outputs(plan, o))
  shard_plans = guard.plans
  todo = sum(s.action == "convert" for s in shard_plans)
  mode = "in place" if plan.in_place else f"to {plan.out_dir}"

  def add(p: beam.Pipeline) -> None:
    _retract_array_record_format(plan, shard_plans)
    add_tfds_conversion(p, plan, options)

  seconds, local = local_run.run(
      guard, args, beam_args,
      lambda runner, workers_mode: (f"Converting {todo} of {len(shard_plans)} shard(s) of TFDS dataset "
                                    f"{plan.info['name']!r} ({plan.dataset_dir}) {mode} (writer options "
                                    f"{options.writer_options!r}, runner {runner}, {workers_mode})..."),
      add)
  manifest = read_manifest(plan.out_dir)
  manifest["_seconds"] = seconds
  manifest["_workers"] = local.summary
  manifest["_plan"] = plan
  manifest["_checks"] = verify_tfds(plan, options.compression) if args.verify else None
  return manifest


def main(argv: Sequence[str] | None = None) -> int:
  manifest, code = cli.run_reporting_errors(PROG, lambda: run(argv), output_flag="--out_dir")
  if code is not None:
    return code
  seconds, plan, checks = manifest.pop("_seconds"), manifest.pop("_plan"), manifest.pop("_checks")
  print(convert.summarize(manifest, seconds, plan.out_dir))
  print(_summary(plan))
  code = 1 if manifest["totals"]["failed"] else 0
  if checks is not None:
    bad = [c for c in checks if not c.ok]
    for c in bad:
      print(f"FAIL {c.output}: {c.problem}")
    print(f"Verified {len(checks) - len(bad)}/{len(checks)} shard(s): record digests "
          f"{'match' if not bad else 'DIFFER'}.")
    code = code or (1 if bad else 0)
  return code


if __name__ == "__main__":
  sys.exit(main())
