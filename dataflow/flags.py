"""Flags of `python -m dataflow.submit`, parsed and checked without the network.

Two modes: TFRecord files (--input PATTERN --output DIR) or a prepared TFDS
dataset (--tfds-dataset-dir DIR [--out-dir OUT], as `arrayrecord-tfds`).
Converter flags come from pipelines.cli (the same as `pipelines.convert`);
Dataflow flags keep Beam's spelling (`--temp_location`, dashes also work);
any other flag goes to Beam unchanged, after Beam confirms it knows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import re
from typing import Sequence

from converter import ConvertOptions, options
from dataflow import checks, staging
from dataflow.checks import FlagError
from pipelines import cli

PROG = "arrayrecord-dataflow"
RUNNER = "DataflowRunner"
# Converter flags a Flex Template exposes as parameters (see flex_template/metadata.json).
TEMPLATE_PARAMETERS = ("input", "output", "tfds_dataset_dir", "out_dir", "writer_options",
                       "compression", "on_corrupt", "overwrite", "skip_existing")
# Dataflow flags this tool checks, then hands to Beam as --NAME=VALUE.
DATAFLOW_FLAGS = ("project", "region", "temp_location", "staging_location", "job_name",
                  "service_account_email", "network", "subnetwork", "max_num_workers",
                  "machine_type", "sdk_container_image")
# Switches that also take `=true` / `=false`, as a Flex Template launcher passes them.
_SWITCHES = ("--overwrite", "--skip-existing", "--skip_existing", "--dry-run", "--dry_run",
             "--wait")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no", "")


class _Parser(argparse.ArgumentParser):
  """Reports a usage error as one FlagError line instead of exiting."""

  def error(self, message):
    raise FlagError(f"{message} (see {self.prog} --help).")


def parser() -> argparse.ArgumentParser:
  p = _Parser(
      prog=PROG, allow_abbrev=False,
      description="Submit the TFRecord -> ArrayRecord conversion to Google Cloud Dataflow. "
      "Input patterns are listed by the workers, so submitting needs no bucket access. "
      "Flags not listed here go to Beam (e.g. --num_workers, --no_use_public_ips, "
      "--experiments, --labels).")
  io = p.add_argument_group(
      "what to convert", "Either TFRecord files (--input, --output) or a TFDS dataset "
      "(--tfds-dataset-dir, --out-dir).")
  io.add_argument("--input", action="append", metavar="PATTERN",
                  help="TFRecord files: a gs:// file or glob, listed by the workers; repeatable.")
  io.add_argument("--output", metavar="GS_DIR",
                  help="With --input: gs:// folder for the ArrayRecord shards and manifest.json.")
  io.add_argument("--tfds-dataset-dir", "--tfds_dataset_dir", dest="tfds_dataset_dir",
                  metavar="GS_DIR", help="A prepared TFDS dataset stored as TFRecord: its "
                  "version folder, gs://.../NAME/VERSION, the one with dataset_info.json "
                  "(read when submitting). Converted to TFDS's array_record format.")
  io.add_argument("--out-dir", "--out_dir", dest="out_dir", metavar="GS_DIR",
                  help="With --tfds-dataset-dir: gs:// folder for the ArrayRecord dataset "
                  "(e.g. gs://BUCKET/tfds_ar/NAME/VERSION). Default: the dataset folder "
                  "itself, adding array_record as an alternative file format.")
  cli.add_converter_flags(p, io=False)
  g = p.add_argument_group("Dataflow")
  g.add_argument("--project", help="Google Cloud project id (required).")
  g.add_argument("--region", help="Dataflow region, e.g. us-central1 (required).")
  g.add_argument("--temp_location", "--temp-location", dest="temp_location", metavar="GS_DIR",
                 help="gs:// folder for Dataflow's temporary files (required).")
  g.add_argument("--staging_location", "--staging-location", dest="staging_location",
                 metavar="GS_DIR",
                 help="gs:// folder for staged packages (default: --temp_location).")
  g.add_argument("--job_name", "--job-name", dest="job_name",
                 help="Job name (default: arrayrecord-convert-YYYYMMDD-HHMMSS, UTC).")
  g.add_argument("--service_account_email", "--service-account-email",
                 dest="service_account_email", help="Worker service account.")
  g.add_argument("--network", help="VPC network for the workers.")
  g.add_argument("--subnetwork", help="regions/REGION/subnetworks/NAME or its full URL.")
  g.add_argument("--max_num_workers", "--max-num-workers", dest="max_num_workers", type=int,
                 metavar="N", help="Autoscaling ceiling. Parallelism is at most the number "
                 "of input shards.")
  g.add_argument("--machine_type", "--worker_machine_type", "--machine-type",
                 "--worker-machine-type", dest="machine_type",
                 help="Worker machine type, e.g. n2-standard-4.")
  g.add_argument("--sdk_container_image", "--sdk-container-image", dest="sdk_container_image",
                 metavar="IMAGE", help="Custom worker image (e.g. the Flex Template image).")
  g.add_argument("--setup_file", "--setup-file", dest="setup_file", metavar="PATH",
                 help="setup.py staged for the workers (default: this checkout's); "
                 f"'{staging.NO_SETUP_FILE}' when --sdk_container_image has the toolkit.")
  t = p.add_argument_group("this tool")
  t.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                 help="Build the exact job request offline (no credentials, no network) and "
                 "write job.json and the staged files to --dry-run-dir; submit nothing.")
  t.add_argument("--dry-run-dir", "--dry_run_dir", dest="dry_run_dir", metavar="DIR",
                 help="Empty or new folder for --dry-run (default: dataflow-dry-run/JOB_NAME; "
                 "implies --dry-run).")
  t.add_argument("--wait", action="store_true",
                 help="Wait for the job to finish; exit 1 unless it succeeds.")
  return p


@dataclasses.dataclass(frozen=True)
class Request:
  """A checked submission: what to convert, where, and the Beam flags to use."""

  convert: ConvertOptions
  patterns: tuple[str, ...]
  project: str
  region: str
  job_name: str
  beam_args: tuple[str, ...]
  setup_file: str | None
  dry_run_dir: str | None = None
  wait: bool = False
  # TFDS mode (patterns empty): the dataset version folder, and where the
  # ArrayRecord dataset goes (None: in place).
  tfds_dataset_dir: str | None = None
  tfds_out_dir: str | None = None


def normalize_switches(argv: Sequence[str]) -> list[str]:
  """`--overwrite=true` -> `--overwrite`, `--overwrite=false` -> nothing."""
  out = []
  for arg in argv:
    flag, eq, value = arg.partition("=")
    if eq and flag in _SWITCHES:
      if value.strip().lower() in _TRUE:
        out.append(flag)
      elif value.strip().lower() not in _FALSE:
        raise FlagError(f"{flag} takes true or false, got {value!r}.")
      continue
    out.append(arg)
  return out


def default_job_name(now: datetime.datetime | None = None) -> str:
  now = now or datetime.datetime.now(datetime.timezone.utc)
  return "arrayrecord-convert-" + now.strftime("%Y%m%d-%H%M%S")


def flag_value(extra: Sequence[str], name: str) -> str | None:
  """The value of --name in Beam's extra flags (`--name=v` or `--name v`)."""
  values = flag_values(extra, name)
  return values[0] if values else None


def flag_values(extra: Sequence[str], name: str) -> list[str]:
  """Every value of --name in Beam's extra flags, in order."""
  found = []
  for i, arg in enumerate(extra):
    if arg == f"--{name}" and i + 1 < len(extra):
      found.append(extra[i + 1])
    elif arg.startswith(f"--{name}="):
      found.append(arg.split("=", 1)[1])
  return found


def _check_worker_settings(args: argparse.Namespace, extra: Sequence[str]) -> None:
  """What Dataflow would reject only at submission, after staging: checked offline."""
  if args.machine_type is not None:
    checks.machine_type(args.machine_type)
  if args.sdk_container_image is not None:
    checks.container_image(args.sdk_container_image)
  for zone in flag_values(extra, "worker_zone") + flag_values(extra, "zone"):
    checks.worker_zone(zone)
  for region in flag_values(extra, "worker_region"):
    checks.worker_region(region)
  checks.labels(flag_values(extra, "labels") + flag_values(extra, "label"))
  for name in ("disk_size_gb", "number_of_worker_harness_threads"):
    for value in flag_values(extra, name):
      checks.positive_int(value, f"--{name}")


def _worker_location_region(extra: Sequence[str]) -> str | None:
  """The region the workers run in when --worker_region or --worker_zone pins them."""
  region = flag_value(extra, "worker_region")
  zone = flag_value(extra, "worker_zone") or flag_value(extra, "zone")
  return region or (zone.rsplit("-", 1)[0] if zone else None)


def _check_extra(extra: Sequence[str]) -> list[str]:
  """Beam flags passed through: the runner must be Dataflow; all must be Beam's."""
  runner = flag_value(extra, "runner")
  if runner is not None and runner.rsplit(".", 1)[-1] != RUNNER:
    raise FlagError(f"--runner {runner!r}: this tool submits to {RUNNER} only. Run other "
                    "runners (DirectRunner, FlinkRunner, SparkRunner) with "
                    "`python -m pipelines.convert --runner ...`.")
  stray, takes_value = [], False
  for arg in extra:
    if arg.startswith("-"):
      takes_value = "=" not in arg
    elif takes_value:
      takes_value = False
    else:
      stray.append(arg)
  if stray:
    raise FlagError(f"Unexpected argument(s) {' '.join(stray)!r}: give each input as "
                    "--input PATTERN and quote globs so the shell does not expand them.")
  from apache_beam.options.pipeline_options import PipelineOptions

  from pipelines import build  # pylint: disable=g-import-not-at-top  # Beam: after the missing-extra check.
  opts = PipelineOptions(list(extra))
  beam_log = logging.getLogger("apache_beam.options.pipeline_options")
  level = beam_log.level
  beam_log.setLevel(logging.ERROR)  # Its "Discarding unparseable args" would be a 2nd line.
  try:
    with build.beam_option_errors():
      known = opts.get_all_options(retain_unknown_options=False)
      unknown = sorted(set(opts.get_all_options(retain_unknown_options=True)) - set(known))
  except build.PipelineOptionError as e:
    raise FlagError(str(e)) from None
  finally:
    beam_log.setLevel(level)
  if unknown:
    raise FlagError(f"Unknown flag(s) {', '.join('--' + u for u in unknown)}: not a converter, "
                    f"Dataflow or Beam pipeline option (see {PROG} --help and "
                    "https://cloud.google.com/dataflow/docs/reference/pipeline-options).")
  kept, skip = [], False
  for arg in extra:  # --runner is set by this tool.
    if skip or arg.startswith("--runner="):
      skip = False
    elif arg == "--runner":
      skip = True
    else:
      kept.append(arg)
  return kept


def _dry_run_dir(args: argparse.Namespace, job_name: str) -> str | None:
  if not (args.dry_run or args.dry_run_dir):
    return None
  if args.dry_run_dir:
    stripped = options.line_break_at_an_end(args.dry_run_dir)
    if stripped is not None:  # A pasted or YAML-block value: it would make a folder named with the line break.
      raise FlagError(f"--dry-run-dir {args.dry_run_dir!r}: a name in it has a line break or tab at an end, which "
                      f"would become part of a folder's name: strip it (--dry-run-dir {stripped!r}).")
  path = os.path.abspath(args.dry_run_dir or os.path.join("dataflow-dry-run", job_name))
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise FlagError(f"--dry-run-dir {path!r} exists and is not an empty folder; "
                    "give a new or empty one.")
  return path


def _what_to_convert(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
  """(input patterns, output folder): TFRecord files, or a TFDS dataset (no patterns)."""
  if args.tfds_dataset_dir is not None:
    if args.input or args.output:
      raise FlagError("--tfds-dataset-dir converts a whole TFDS dataset; give its output "
                      "folder as --out-dir, not --input/--output.")
    dataset_dir = checks.tfds_dataset_dir(args.tfds_dataset_dir)
    if args.out_dir is None:
      return (), dataset_dir
    return (), checks.gcs_path(args.out_dir, "--out-dir", need_object=True,
                               example="gs://my-bucket/tfds_ar/mnist/3.0.1")
  if args.out_dir is not None:
    raise FlagError("--out-dir goes with --tfds-dataset-dir; the output folder of TFRecord "
                    "files given by --input is --output.")
  if not args.input or args.output is None:
    raise FlagError("--input and --output are required (e.g. --input 'gs://my-bucket/tfr/"
                    "train-*' --output gs://my-bucket/ar/), or --tfds-dataset-dir "
                    "gs://my-bucket/tensorflow_datasets/NAME/VERSION for a TFDS dataset.")
  patterns = tuple(checks.input_pattern(p) for p in args.input)
  return patterns, checks.gcs_path(args.output, "--output", need_object=False,
                                   example="gs://my-bucket/ar/")


def parse(argv: Sequence[str]) -> Request:
  """Parses and checks all flags. Offline: raises FlagError before any network use."""
  args, extra = parser().parse_known_args(normalize_switches(argv))
  for flag, value, example in (("--project", args.project, "my-project"),
                               ("--region", args.region, "us-central1"),
                               ("--temp_location", args.temp_location, "gs://my-bucket/tmp")):
    checks.require(value, flag, example)
  checks.project(args.project)
  checks.region(args.region)
  checks.gcs_path(args.temp_location, "--temp_location", need_object=True,
                  example="gs://my-bucket/tmp")
  if args.staging_location is not None:
    checks.gcs_path(args.staging_location, "--staging_location", need_object=True,
                    example="gs://my-bucket/staging")
  patterns, output_dir = _what_to_convert(args)
  job_name = checks.job_name(args.job_name) if args.job_name else default_job_name()
  if args.service_account_email is not None:
    checks.service_account(args.service_account_email)
  if args.network is not None:
    checks.network(args.network)
  extra = _check_extra(extra)
  _check_worker_settings(args, extra)
  if args.subnetwork is not None:
    workers_in = _worker_location_region(extra)
    checks.subnetwork(args.subnetwork, args.region, workers_in)
  checks.positive(args.max_num_workers, "--max_num_workers")
  try:
    convert = cli.converter_options(args, output_dir=output_dir)
  except (ValueError, TypeError) as e:
    raise FlagError(" ".join(str(e).split())) from None
  setup_file = staging.find_setup_file(args.setup_file)
  beam_args = [f"--runner={RUNNER}", f"--job_name={job_name}"]
  for name in DATAFLOW_FLAGS:
    value = getattr(args, name)
    if value is not None and name != "job_name":
      beam_args.append(f"--{name}={value}")
  if setup_file:
    beam_args.append(f"--setup_file={setup_file}")
  beam_args += extra
  from dataflow import beam_internals
  errors = beam_internals.check_options(beam_args)
  if errors:
    raise FlagError("Beam rejects the options: " + " ".join(" ".join(errors).split()))
  return Request(convert=convert, patterns=patterns, project=args.project,
                 region=args.region, job_name=job_name, beam_args=tuple(beam_args),
                 setup_file=setup_file, dry_run_dir=_dry_run_dir(args, job_name),
                 wait=args.wait, tfds_dataset_dir=args.tfds_dataset_dir,
                 tfds_out_dir=args.out_dir if args.tfds_dataset_dir else None)


def one_line(message: str) -> str:
  return re.sub(r"\s+", " ", message).strip()
