"""Fails loudly when a Beam upgrade moves the internals dataflow/beam_internals.py relies on.

If one of these fails after upgrading apache-beam: read the new
apache_beam/runners/dataflow/ code, fix dataflow/beam_internals.py, run
tests/test_dataflow_submit.py, then bump TESTED_BEAM_VERSION.
"""

from __future__ import annotations

import inspect
import os
import re

import apache_beam
import pytest
from apache_beam.options import pipeline_options as po
from apache_beam.runners.dataflow import dataflow_runner
from apache_beam.runners.dataflow.internal import apiclient

from dataflow import beam_internals

pytestmark = pytest.mark.timeout(60)


def _params(fn) -> list[str]:
  return list(inspect.signature(fn).parameters)


def test_beam_version_is_the_tested_one():
  assert apache_beam.__version__.startswith(beam_internals.TESTED_BEAM_VERSION + "."), (
      f"apache-beam {apache_beam.__version__} is installed but dataflow/beam_internals.py was "
      f"checked against {beam_internals.TESTED_BEAM_VERSION}: re-check it (see this file's "
      "docstring), then bump TESTED_BEAM_VERSION.")


def test_the_install_pins_the_tested_beam_minor():
  # A fresh `pip install .[beam]` must not pick a Beam whose internals were never checked.
  setup = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.py")).read()
  major, minor = beam_internals.TESTED_BEAM_VERSION.split(".")
  assert re.search(rf'_BEAM_VERSIONS = ">={major}\.{minor}\.0,<{major}\.{int(minor) + 1}"', setup)


def test_dry_run_returns_the_job_before_any_client_is_made():
  source = inspect.getsource(dataflow_runner.DataflowRunner.run_pipeline)
  dry = source.index("if test_options.dry_run:")
  assert "result.job = self.job" in source[dry:dry + 300]
  assert source.index("apiclient.Job(options, self.proto_pipeline)") < dry
  assert dry < source.index("apiclient.DataflowApplicationClient(")


def test_job_description_uploads_only_through_stage_file():
  client = apiclient.DataflowApplicationClient
  assert _params(client.__init__) == ["self", "options", "root_staging_location"]
  assert _params(client.create_job_description) == ["self", "job"]
  assert _params(client.stage_file) == [
      "self", "gcs_or_local_path", "file_name", "stream", "mime_type", "total_size"]
  assert _params(client.stage_file) == _params(beam_internals._LocalStagingClient.stage_file)
  describe = inspect.getsource(client.create_job_description)
  assert "self._stage_resources(" in describe and "self.stage_file_with_retry(" in describe
  # Artifacts: _stage_resources -> _LegacyDataflowStager.stage_artifact -> _gcs_file_copy
  # -> (caching off) _uncached_gcs_file_copy -> stage_file_with_retry -> stage_file.
  assert "self._dataflow_application_client._gcs_file_copy(" in inspect.getsource(
      apiclient._LegacyDataflowStager.stage_artifact)
  assert "self._uncached_gcs_file_copy(" in inspect.getsource(client._gcs_file_copy)
  assert "self.stage_file_with_retry(" in inspect.getsource(client._uncached_gcs_file_copy)
  assert "self.stage_file(" in inspect.getsource(client.stage_file_with_retry)
  # Credentials are looked up in __init__ only, and only without no_auth.
  init = inspect.getsource(client.__init__)
  assert "if self.google_cloud_options.no_auth:" in init
  assert "no_auth" not in describe


def test_job_has_what_a_dry_run_reads():
  assert "self.root_staging_location =" in inspect.getsource(apiclient.Job.__init__)
  assert callable(apiclient.Job.json)
  assert '"pipelineUrl"' in inspect.getsource(apiclient.Environment.__init__).replace("'", '"')


def test_options_a_dry_run_sets_and_restores_exist():
  views = {"no_auth": po.GoogleCloudOptions, "enable_artifact_caching": po.GoogleCloudOptions,
           "dry_run": po.TestOptions, "requirements_cache": po.SetupOptions}
  options = po.PipelineOptions(list(beam_internals.DRY_RUN_FLAGS))
  assert options.view_as(po.GoogleCloudOptions).no_auth is True
  assert options.view_as(po.TestOptions).dry_run == "True"
  assert options.view_as(po.SetupOptions).requirements_cache == "skip"
  assert {beam_internals._dest(f) for f in beam_internals.DRY_RUN_FLAGS} <= set(views)
  for name, view in views.items():
    assert hasattr(options.view_as(view), name), name


def test_template_runs_have_no_job():
  init = inspect.getsource(dataflow_runner.DataflowPipelineResult.__init__)
  assert "self._job = job" in init
  assert beam_internals.job_id(dataflow_runner.DataflowPipelineResult(None, None)) is None
  job = type("Job", (), {"id": "2026-01-01_00_00_00-1"})()
  assert beam_internals.job_id(dataflow_runner.DataflowPipelineResult(job, None)) == job.id


def test_offline_option_checks():
  base = ["--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
          "--temp_location=gs://my-bucket/tmp", "--job_name=j"]
  assert beam_internals.check_options(base) == []
  errors = beam_internals.check_options(base + ["--num_workers=5", "--max_num_workers=2"])
  assert any("cannot exceed max_num_workers" in e for e in errors)
