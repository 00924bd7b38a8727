"""Every use of Beam internals by the Dataflow submitter, in one place.

Beam has no public API to build a Dataflow job request without sending it,
to check DataflowRunner options offline, or to read the job id of a run
that only wrote a template. These helpers use the Beam 2.77 internals that
do it; tests/test_dataflow_beam_internals.py fails loudly if an upgrade
moves any of them.

Dry run, in Beam's own steps:
  1. `Pipeline.run()` with TestOptions.dry_run translates the pipeline, builds
     the worker environment (the sdist from --setup_file) and the
     `apiclient.Job`, then returns before any client is made.
  2. `DataflowApplicationClient.create_job_description(job)` stages the
     artifacts and the pipeline proto and fills in the job request. Its one
     upload step, `stage_file`, is overridden to write into a local folder,
     so the request keeps the real gs:// staging URLs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Sequence

from apache_beam.options.pipeline_options import (GoogleCloudOptions, PipelineOptions, SetupOptions,
                                                  TestOptions)
from apache_beam.runners.dataflow.internal import apiclient
from apache_beam.utils import retry

TESTED_BEAM_VERSION = "2.77"
# Appended to the flags of a dry run: no credentials, no submission, and no
# `pip download` of a --requirements_file at submit time.
DRY_RUN_FLAGS = ("--no_auth", "--dry_run=True", "--requirements_cache=skip")
JOB_FILE = "job.json"
PIPELINE_JSON_FILE = "pipeline.json"
# The key in job.json's environment.sdkPipelineOptions.options that points at
# the staged pipeline proto (Runner v2 jobs carry no steps in job.json).
PIPELINE_URL_OPTION = "pipelineUrl"


def check_options(beam_args: Sequence[str]) -> list[str]:
  """Beam's own DataflowRunner option checks, run without the network.

  Pipeline() runs the same checks, but for a real submission they first
  probe the temp bucket's soft-delete policy; with dry_run set they do not.
  """
  from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
  from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
  options = PipelineOptions(list(beam_args) + ["--dry_run=True"])
  return PipelineOptionsValidator(options, DataflowRunner()).validate()


class DryRunWriteError(retry.PermanentException):
  """A staged file of a dry run could not be written (Beam does not retry this one)."""

  def __init__(self, path: str, error: OSError):
    super().__init__(f"{path}: {error.strerror or error}")
    self.error = error


class _LocalStagingClient(apiclient.DataflowApplicationClient):
  """A Dataflow client whose uploads land in a local folder, keyed by gs:// URL."""

  def __init__(self, options: PipelineOptions, root_staging_location: str, local_dir: str):
    super().__init__(options, root_staging_location)
    self._local_dir = local_dir
    self.staged: dict[str, str] = {}

  def stage_file(self, gcs_or_local_path, file_name, stream,
                 mime_type="application/octet-stream", total_size=None):
    local = os.path.join(self._local_dir, os.path.basename(file_name))
    tmp = f"{local}.tmp-{os.getpid()}"
    try:  # Under its final name only once whole.
      with open(tmp, "wb") as f:
        f.write(stream.read())
      os.replace(tmp, local)
    except OSError as e:
      with contextlib.suppress(OSError):
        os.remove(tmp)
      # Permanent: Beam would retry a write to a full or read-only disk for minutes.
      raise DryRunWriteError(local, e) from e
    self.staged[gcs_or_local_path.rstrip("/") + "/" + file_name] = local


@dataclasses.dataclass(frozen=True)
class JobRequest:
  """What a dry run wrote.

  Attributes:
    staged: {staged gs:// URL: local path} for every staged file.
    steps: Unique names of the pipeline's transforms, outermost first.
  """

  staged: dict[str, str]
  steps: tuple[str, ...]


def _dest(flag: str) -> str:
  return flag.lstrip("-").split("=", 1)[0]


def write_job_request(pipeline, local_dir: str, user_args: Sequence[str]) -> JobRequest:
  """Builds the Dataflow job request of a pipeline and writes it to local_dir.

  The pipeline's options must include DRY_RUN_FLAGS. Writes job.json (the
  request body), pipeline.json (the staged pipeline proto, readable) and every
  staged file under its staged name (workflow.tar.gz is the --setup_file sdist,
  pipeline.pb the pipeline).

  Args:
    pipeline: A beam.Pipeline for DataflowRunner, not yet run.
    local_dir: An existing folder.
    user_args: The flags without DRY_RUN_FLAGS: their values of the dry-run
      options are put back, so the request is the one a submission sends.

  Returns:
    The staged files and the pipeline's steps.
  """
  from google.protobuf import json_format
  result = pipeline.run()
  job = result.job
  cloud = job.options.view_as(GoogleCloudOptions)
  cloud.enable_artifact_caching = False  # Caching looks up gs:// objects.
  client = _LocalStagingClient(job.options, job.root_staging_location, local_dir)
  user = PipelineOptions(list(user_args)).get_all_options()
  for view in (GoogleCloudOptions, TestOptions, SetupOptions):
    for flag in DRY_RUN_FLAGS:
      if hasattr(job.options.view_as(view), _dest(flag)):
        setattr(job.options.view_as(view), _dest(flag), user[_dest(flag)])
  client.create_job_description(job)
  with open(os.path.join(local_dir, JOB_FILE), "w", encoding="utf-8") as f:
    f.write(job.json())
  with open(os.path.join(local_dir, PIPELINE_JSON_FILE), "w", encoding="utf-8") as f:
    f.write(json_format.MessageToJson(job.proto_pipeline))
  transforms = job.proto_pipeline.components.transforms.values()
  steps = sorted((t.unique_name for t in transforms if t.unique_name),
                 key=lambda n: (n.count("/"), n))
  return JobRequest(staged=dict(client.staged), steps=tuple(steps))


def job_id(result) -> str | None:
  """The Dataflow job id, or None when the run only wrote a template."""
  job = getattr(result, "_job", None)
  return getattr(job, "id", None) or None
