"""Submit the TFRecord -> ArrayRecord conversion to Google Cloud Dataflow.

  python -m dataflow.submit --input 'gs://BUCKET/tfr/train-*' --output gs://BUCKET/ar/ \
      --project my-project --region us-central1 --temp_location gs://BUCKET/tmp \
      [--max_num_workers 50] [--machine_type n2-standard-4] [converter flags as in
      pipelines.convert] [--dry-run [--dry-run-dir DIR]] [other Beam/Dataflow flags]
  python -m dataflow.submit --tfds-dataset-dir gs://BUCKET/tensorflow_datasets/mnist/3.0.1 \
      --out-dir gs://BUCKET/tfds_ar/mnist/3.0.1 --project ... (the same flags)

Every flag is checked offline first; a bad one is reported in one line before
anything is contacted. Inputs are listed by the workers (MatchFiles), so
submitting needs no access to the buckets. A TFDS dataset's dataset_info.json
names its shards, so TFDS mode reads it when submitting (also in a dry run).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
from typing import Sequence

if __name__ == "__main__":  # `python -m`: run as the console script (a missing extra, Ctrl-C at start-up: one line).
  from pipelines import entry_points  # pylint: disable=g-import-not-at-top
  entry_points.run_as_script(__spec__)

from converter import ConversionError
from converter.errors import escape_controls
from dataflow import flags
from dataflow.checks import FlagError
from pipelines import build, cli, run_tempdir

CONSOLE_URL = "https://console.cloud.google.com/dataflow/jobs/{region}/{job_id}?project={project}"


def console_url(project: str, region: str, job_id: str) -> str:
  return CONSOLE_URL.format(region=region, job_id=job_id, project=project)


@dataclasses.dataclass(frozen=True)
class Submission:
  """The outcome of run().

  Attributes:
    job_name: The Dataflow job name.
    job_id: The Dataflow job id; None for a dry run or a template.
    console_url: The job's page in the Cloud console, if a job was started.
    state: The final state when waited for (e.g. 'DONE'), else None.
    dry_run_dir: Where a dry run wrote job.json and the staged files.
    staged: {staged gs:// URL: local copy} of a dry run.
    steps: The pipeline's transform names of a dry run.
    template_location: Where Beam wrote the job instead of starting it
      (--template_location, as a Flex Template launcher asks).
  """

  job_name: str
  job_id: str | None = None
  console_url: str | None = None
  state: str | None = None
  dry_run_dir: str | None = None
  staged: dict[str, str] = dataclasses.field(default_factory=dict)
  steps: tuple[str, ...] = ()
  template_location: str | None = None


def build_pipeline(request: flags.Request, extra_flags: Sequence[str] = ()):
  """The conversion pipeline for DataflowRunner; inputs are matched on workers.

  In TFDS mode, pipelines.tfds_convert's pipeline: the shards named by
  dataset_info.json (read here), then the TFDS metadata, written last.
  """
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  options = PipelineOptions(list(request.beam_args) + list(extra_flags))
  if request.tfds_dataset_dir:
    from pipelines import tfds_convert  # Only TFDS mode needs it.
    return tfds_convert.build_tfds_pipeline(request.tfds_dataset_dir, request.tfds_out_dir,
                                            request.convert, options)
  p = beam.Pipeline(options=options)
  build.add_conversion(p, request.convert, patterns=list(request.patterns))
  return p


def check_tfds_dataset(request: flags.Request):
  """TFDS mode, before building the job: the dataset is readable and convertible.

  Reads dataset_info.json and lists the shards' folder (the only bucket
  access when submitting): a shard it names that is missing is refused here,
  not by a worker after the job has started. With neither --overwrite nor
  --skip-existing, an --out-dir that already holds a dataset_info.json is
  refused here; existing shards are found by the workers, as in the TFRecord
  mode.

  Returns:
    The plan (pipelines.tfds_convert.TfdsPlan).

  Raises:
    FlagError: one line naming the dataset and what is wrong.
  """
  from converter import ConversionError, OutputExistsError
  from converter import writer as _writer
  from loader import tfds as tfds_layout
  from pipelines import tfds_convert  # Only TFDS mode needs it.
  where = request.tfds_dataset_dir
  try:
    plan = tfds_convert.plan_tfds(where, request.tfds_out_dir)
    tfds_convert.tfds_convert_options(plan, request.convert)
    tfds_convert.check_shards_exist(plan)
    info = f"{plan.out_dir}/{tfds_layout.DATASET_INFO_NAME}"
    if not plan.in_place and request.convert.existing == "error" and _writer.exists(info):
      raise OutputExistsError([info])
  except (ValueError, ConversionError) as e:
    raise FlagError(flags.one_line(str(e))) from None
  except Exception as e:  # pylint: disable=broad-except  # Credentials, permissions, network.
    cause = flags.one_line(f"{type(e).__name__}: {e}")
    raise FlagError(f"Cannot read the TFDS dataset {where!r} from this machine ({cause}); "
                    "TFDS mode reads its dataset_info.json when submitting: check "
                    "`gcloud auth application-default login` and read access to the "
                    "bucket.") from None
  return plan


class DryRunError(ConversionError):
  """The dry run's folder could not be written; it is left as it was (empty or absent)."""


def dry_run(request: flags.Request) -> Submission:
  """Writes the job request and staged files to request.dry_run_dir; no network.

  Raises:
    DryRunError: the folder cannot be written (read-only, full): what was
      written is removed, so a rerun finds it as before.
  """
  from dataflow import beam_internals
  folder = request.dry_run_dir
  created = not os.path.lexists(folder)  # Else it is empty: flags refuse a non-empty one.
  try:
    os.makedirs(folder, exist_ok=True)
    p = build_pipeline(request, beam_internals.DRY_RUN_FLAGS)
    written = beam_internals.write_job_request(p, folder, request.beam_args)
  except (OSError, beam_internals.DryRunWriteError) as e:
    error = e.error if isinstance(e, beam_internals.DryRunWriteError) else e
    if created:
      shutil.rmtree(folder, ignore_errors=True)
    elif os.path.isdir(folder):
      for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        else:
          os.remove(path)
    raise DryRunError(f"cannot write the dry run to {folder}: {error.strerror or error}; "
                      "nothing was left there. Free space there or pass another --dry-run-dir.") from None
  return Submission(job_name=request.job_name, dry_run_dir=folder,
                    staged=written.staged, steps=written.steps)


def submit(request: flags.Request) -> Submission:
  """Submits the job; waits for it only if request.wait."""
  from dataflow import beam_internals
  result = build_pipeline(request).run()
  job_id = beam_internals.job_id(result)
  if job_id is None:
    template = flags.flag_value(request.beam_args, "template_location") or \
        flags.flag_value(request.beam_args, "dataflow_job_file")
    return Submission(job_name=request.job_name, template_location=template)
  state = None
  if request.wait:
    result.wait_until_finish()
    state = str(getattr(result.state, "name", result.state))
  return Submission(job_name=request.job_name, job_id=job_id, state=state,
                    console_url=console_url(request.project, request.region, job_id))


NO_CREDENTIALS = ("no Google Cloud credentials found; run `gcloud auth application-default "
                  "login` or set GOOGLE_APPLICATION_CREDENTIALS")


def check_credentials() -> None:
  """Fails in seconds without credentials (Beam would retry for minutes, with tracebacks).

  Asks google.auth.default() with a transport that refuses every request, so
  the check never touches the network: the GCE metadata probe fails at once
  and GCE is then recognised from the machine's own SMBIOS data.
  """
  import google.auth  # pylint: disable=g-import-not-at-top  # Only a real submit needs it.
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top

  def offline(*args, **kwargs):
    raise exceptions.TransportError("no network during the credentials check")

  auth_log = logging.getLogger("google.auth")
  level = auth_log.level
  auth_log.setLevel(logging.ERROR)  # Its failed-probe warnings would bury our one line.
  named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")  # google-auth reads it first, when not empty.
  try:
    google.auth.default(request=offline)
  except (exceptions.DefaultCredentialsError, OSError, ValueError) as e:
    if named:
      # The variable is set: "no credentials found ... set GOOGLE_APPLICATION_CREDENTIALS" would mislead.
      raise FlagError(bad_credentials_file(named, e)) from None
    if not isinstance(e, exceptions.DefaultCredentialsError):
      raise
    raise FlagError(NO_CREDENTIALS) from None
  finally:
    auth_log.setLevel(level)


def bad_credentials_file(path: str, error: BaseException) -> str:
  """One line on a GOOGLE_APPLICATION_CREDENTIALS that names no usable credentials file."""
  if os.path.isdir(path):
    why = "it is a folder"
  elif not os.path.lexists(path):
    why = "no such file"
  elif not os.path.exists(path):
    why = "a broken link"
  else:
    # google-auth's reason, on one line; its errors carry (message, cause) as their args.
    parts = [str(a) for a in error.args if isinstance(a, (str, BaseException))] or [str(error)]
    why = " ".join(": ".join(p.rstrip(".") for p in parts if p).split()) or type(error).__name__
  return (f"GOOGLE_APPLICATION_CREDENTIALS={escape_controls(path)} is not a usable credentials file ({why}); point "
          "it at a service account key or user credentials JSON file, or unset it to use the credentials of "
          "`gcloud auth application-default login`")


def run(argv: Sequence[str] | None = None) -> Submission:
  """Checks the flags, then submits (or dry-runs) the conversion job."""
  request = flags.parse(sys.argv[1:] if argv is None else argv)
  if not request.dry_run_dir:
    check_credentials()  # Before anything else contacts Google Cloud.
  what = ", ".join(request.patterns)
  if request.tfds_dataset_dir:
    plan = check_tfds_dataset(request)
    what = (f"TFDS dataset {plan.info['name']!r} ({len(plan.inputs)} shard(s) in "
            f"{request.tfds_dataset_dir})")
  # Beam's stager builds the sdist in a folder of $TMPDIR that it never
  # removes: one more per submission, unless it is this run's own.
  with run_tempdir.private_tempdir():
    if request.dry_run_dir:
      return dry_run(request)
    print(f"Submitting Dataflow job {request.job_name!r} (project {request.project}, region "
          f"{request.region}): {what} -> {request.convert.output_dir}", flush=True)
    return submit(request)


def report(s: Submission) -> str:
  if s.dry_run_dir:
    files = sorted(os.listdir(s.dry_run_dir))
    convert_steps = [n for n in s.steps if n.count("/") == 1 or n.startswith("WriteTfds")]
    return "\n".join([
        f"Dry run: nothing was submitted. The request for job {s.job_name!r} is in "
        f"{s.dry_run_dir}:",
        f"  files: {', '.join(files)}",
        "  job.json is the request body; workflow.tar.gz the toolkit sdist workers install; "
        "pipeline.pb (pipeline.json) the pipeline:",
        f"  steps: {', '.join(convert_steps)}",
    ])
  if s.job_id is None:
    return f"Wrote the job to {s.template_location}; no job was started."
  lines = [f"Submitted job {s.job_id} ({s.job_name}).", f"Console: {s.console_url}"]
  if s.state:
    lines.append(f"Final state: {s.state}")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
  logging.getLogger("apache_beam").setLevel(logging.WARNING)
  try:
    submission = run(argv)
  except FlagError as e:
    return cli.fail(flags.PROG, flags.one_line(str(e)))
  except Exception as e:  # pylint: disable=broad-except
    msg = cli.user_error_from(e)
    if msg is None:
      raise
    return cli.fail(flags.PROG, flags.one_line(msg), code=1)
  print(report(submission))
  return 0 if submission.state in (None, "DONE") else 1


if __name__ == "__main__":
  sys.exit(main())
