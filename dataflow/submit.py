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

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Iterator, Sequence

if __name__ == "__main__":  # `python -m`: run as the console script (a missing extra, Ctrl-C at start-up: one line).
  from pipelines import entry_points  # pylint: disable=g-import-not-at-top
  entry_points.run_as_script(__spec__)

from converter import ConversionError
from converter.errors import escape_controls
from dataflow import flags, staging
from dataflow.checks import FlagError
from loader import ondisk
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


class DryRunStopped(ConversionError):
  """A dry run stopped by Ctrl-C, SIGTERM or SIGHUP; what it had written is removed."""

  def __init__(self, folder: str, signal_name: str):
    self.exit_code = 128 + getattr(signal, signal_name)  # As shells report it: SIGINT 130, SIGTERM 143.
    how = "interrupted" if signal_name == "SIGINT" else f"stopped by {signal_name}"
    super().__init__(f"dry run {how}; nothing was submitted and nothing was left in {escape_controls(folder)} "
                     "(what it had written was removed); run the same command again")


class _Signalled(BaseException):
  # A BaseException, as KeyboardInterrupt: Beam's stager catches Exception around its `pip freeze` and goes on.
  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.name = signal.Signals(signum).name


class SdistBuildError(ConversionError):
  """Beam could not build the toolkit's sdist that the workers install (--setup_file)."""


def _sdist_build_error(e: BaseException, setup_file: str | None, output: str) -> SdistBuildError | None:
  """One line for a failed sdist build inside Beam's staging (a RuntimeError holding the tracebacks), else None."""
  seen, failed = set(), None
  cur: BaseException | None = e
  while cur is not None and id(cur) not in seen:
    seen.add(id(cur))
    if isinstance(cur, (KeyboardInterrupt, _Signalled, DryRunStopped)):
      return None  # The build's child died of the same Ctrl-C: that is what happened, not a failed build.
    if isinstance(cur, subprocess.CalledProcessError) and "sdist" in [str(a) for a in cur.cmd or ()]:
      failed = cur
      break
    cur = cur.__cause__ or cur.__context__
  if failed is None:
    return None
  child = output + "\n" + (failed.output or b"").decode("utf-8", "replace")
  errors = [line.strip() for line in child.splitlines() if line.strip().lower().startswith("error")]
  cause = errors[-1] if errors else f"exit status {failed.returncode}"
  folder = os.path.dirname(setup_file) if setup_file else staging.checkout_root()
  if "Errno 27" in cause or "File too large" in cause:
    fix = "raise the file size limit (`ulimit -f`)"
  elif "Errno 28" in cause or "No space left" in cause:
    where = tempfile.gettempdir()
    if os.path.basename(where).startswith("arrayrecord-run-"):  # This run's own folder in $TMPDIR.
      where = os.path.dirname(where)
    fix = f"free space in {where} (where it is built) or point TMPDIR at a folder with room"
  else:
    fix = f"run `{os.path.basename(sys.executable)} -m build --sdist {folder}` to see why"
  return SdistBuildError(f"cannot build the sdist of {escape_controls(folder)} that Dataflow workers install "
                         f"(--setup_file): {escape_controls(cause)}; {fix}, or pass --setup_file none with an "
                         "--sdk_container_image that has the toolkit installed. Nothing was submitted.")


class _HeldStderr:
  """Standard error (file descriptor 2) held in memory while Beam builds and stages.

  Beam builds the sdist and lists the environment in child processes that write to our stderr; a Ctrl-C
  from the terminal reaches them too, and each printed its own KeyboardInterrupt traceback around our
  one line, and a failed build printed pages of them. What they wrote is passed on at the end, and dropped
  where our one line says what happened. A pipe, not a file: a full $TMPDIR must not fail their writes.
  """

  def __init__(self) -> None:
    self._saved: int | None = None
    self._reader: threading.Thread | None = None
    self._chunks: list[bytes] = []

  def __enter__(self) -> _HeldStderr:
    try:
      sys.stderr.flush()
      read_end, write_end = os.pipe()
    except (OSError, ValueError, AttributeError):  # No fd 2, no descriptors left: nothing is held.
      return self
    try:
      self._saved = os.dup(2)
      os.dup2(write_end, 2)
    except OSError:
      os.close(read_end)
      if self._saved is not None:
        os.close(self._saved)
        self._saved = None
      return self
    finally:
      os.close(write_end)

    def drain() -> None:
      with os.fdopen(read_end, "rb", buffering=0) as f:
        while chunk := f.read(1 << 16):
          self._chunks.append(chunk)

    self._reader = threading.Thread(target=drain, name="held-stderr", daemon=True)
    self._reader.start()
    return self

  def stop(self) -> str:
    """Gives fd 2 back; returns what was written to it meanwhile."""
    if self._saved is not None:
      with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
      os.dup2(self._saved, 2)
      os.close(self._saved)
      self._saved = None
      if self._reader is not None:
        self._reader.join(timeout=5)  # EOF once no child holds the pipe; one left running keeps it open.
    return b"".join(self._chunks).decode("utf-8", "replace")

  def __exit__(self, exc_type, *_) -> None:
    text = self.stop()
    self._chunks = []
    # Dropped where our one line says what happened: the children's tracebacks would bury it.
    if text and not (exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, _Signalled, DryRunStopped,
                                                                    SdistBuildError))):
      with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


def _build_trees(folder: str | None) -> set[str]:
  """The sdist build's release trees (`arrayrecord-toolkit-VERSION/`) in the setup.py's folder."""
  try:
    names = os.listdir(folder) if folder else []
  except OSError:
    return set()
  return {n for n in names if n.startswith(f"{staging.PACKAGE_NAME}-")
          and os.path.isdir(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n))}


@contextlib.contextmanager
def _staging(request: flags.Request) -> Iterator[None]:
  """Beam builds and stages the job: its children's stderr held back, a failed sdist build in one line.

  A build that is stopped or fails leaves its release tree in the checkout (setuptools copies the files
  there, and removes the copy only once the archive is made): a tree this run made is removed.
  """
  folder = os.path.dirname(request.setup_file) if request.setup_file else None
  trees = _build_trees(folder)
  with _HeldStderr() as held:
    try:
      yield
    except BaseException as e:
      for name in sorted(_build_trees(folder) - trees):
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
      failed = _sdist_build_error(e, request.setup_file, held.stop()) if isinstance(e, Exception) else None
      if failed is None:
        raise
      raise failed from None


def _empty_dry_run_dir(folder: str, created: bool) -> None:
  """Removes what a failed or stopped dry run wrote: the folder it made, or what it put in the empty one given."""
  if created:
    shutil.rmtree(folder, ignore_errors=True)
  elif os.path.isdir(folder):
    for name in os.listdir(folder):
      path = os.path.join(folder, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        with contextlib.suppress(OSError):
          os.remove(path)


_CLAIM = ".arrayrecord-dry-run-in-progress"


def _claim_dry_run_dir(folder: str) -> list[str]:
  """Makes `folder` this dry run's: made if missing, and claimed by a hidden file only one run can create.

  Two dry runs given one folder (or the same default one, started in the same second) both found it
  empty when their flags were checked, and each wrote its request over the other's. Returns the
  folders made, for removal if the dry run fails.

  Raises:
    DryRunError: another run holds or has filled the folder; nothing of it was touched.
  """
  created = ondisk.make_dirs(folder)
  claim = os.path.join(folder, _CLAIM)
  try:
    os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
  except FileExistsError:
    raise DryRunError(f"another dry run is writing to {escape_controls(folder)} now (its {_CLAIM} file is there; "
                      "after a killed one, remove the folder): wait for it, or pass another --dry-run-dir.") from None
  except OSError as e:
    ondisk.remove_empty_dirs(created)
    raise DryRunError(f"cannot write the dry run to {escape_controls(folder)}: {e.strerror or e}; nothing was left "
                      "there. Free space there or pass another --dry-run-dir.") from None
  others = sorted(set(os.listdir(folder)) - {_CLAIM})
  if others:  # Filled by another run after the flags found it empty.
    os.remove(claim)
    raise DryRunError(f"--dry-run-dir {escape_controls(folder)} was filled by another run after this one started "
                      f"({', '.join(others[:3])}); it was left as it is: pass another --dry-run-dir.")
  return created


def dry_run(request: flags.Request) -> Submission:
  """Writes the job request and staged files to request.dry_run_dir; no network.

  Raises:
    DryRunError: the folder cannot be written (read-only, full), or another
      dry run has it: what was written is removed, so a rerun finds it as before.
    DryRunStopped: Ctrl-C, SIGTERM or SIGHUP; likewise nothing is left.
  """
  from dataflow import beam_internals
  folder = request.dry_run_dir
  try:
    with cli.signals_raise(_Signalled):  # SIGTERM, SIGHUP unwind as Ctrl-C does, to clean up.
      created = _claim_dry_run_dir(folder)
      try:
        p = build_pipeline(request, beam_internals.DRY_RUN_FLAGS)
        written = beam_internals.write_job_request(p, folder, request.beam_args)
        os.remove(os.path.join(folder, _CLAIM))
      except BaseException:
        # Whatever stopped it, a part of a request must not read as one (and would make the rerun's folder
        # non-empty). The claim made the folder this run's alone: emptying it removes no one else's files.
        _empty_dry_run_dir(folder, bool(created))
        ondisk.remove_empty_dirs(created[:-1])
        raise
  except (OSError, beam_internals.DryRunWriteError) as e:
    error = e.error if isinstance(e, beam_internals.DryRunWriteError) else e
    raise DryRunError(f"cannot write the dry run to {folder}: {error.strerror or error}; "
                      "nothing was left there. Free space there or pass another --dry-run-dir.") from None
  except (KeyboardInterrupt, _Signalled) as e:
    raise DryRunStopped(folder, "SIGINT" if isinstance(e, KeyboardInterrupt) else e.name) from None
  return Submission(job_name=request.job_name, dry_run_dir=folder,
                    staged=written.staged, steps=written.steps)


def submit(request: flags.Request) -> Submission:
  """Submits the job; waits for it only if request.wait."""
  from dataflow import beam_internals
  with _staging(request):  # Not around the wait: the job's own messages come as they come.
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
      with _staging(request):
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
  except DryRunStopped as e:
    return cli.fail(flags.PROG, flags.one_line(str(e)), code=e.exit_code)
  except Exception as e:  # pylint: disable=broad-except
    msg = cli.user_error_from(e)
    if msg is None:
      raise
    return cli.fail(flags.PROG, flags.one_line(msg), code=1)
  print(report(submission))
  return 0 if submission.state in (None, "DONE") else 1


if __name__ == "__main__":
  sys.exit(main())
