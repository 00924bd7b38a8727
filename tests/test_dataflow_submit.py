"""dataflow.submit: the offline dry run on a fresh copy of the checkout, and what a submit prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import types

import pytest

import gcs_emulator as emu
import repo_copy
from dataflow import submit

pytestmark = pytest.mark.timeout(300)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "arrayrecord-dry-run-test"
IMAGE = "us-central1-docker.pkg.dev/my-project/repo/arrayrecord-flex:1"
ARGV = ["--input", "gs://my-bucket/tfr/train-*", "--input", "gs://my-bucket/tfr/valid-*",
        "--output", "gs://my-bucket/ar/", "--project", "my-project", "--region", "us-central1",
        "--temp_location", "gs://my-bucket/tmp", "--job_name", JOB, "--max_num_workers", "7",
        "--machine_type", "n2-standard-4", "--sdk_container_image", IMAGE, "--skip-existing"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  """`python -m dataflow.submit ... --dry-run` in a subprocess: no credentials, no network."""
  base = tmp_path_factory.mktemp("dry")
  clone = repo_copy.fresh_copy(str(base / "clone"))
  out = str(base / "request")
  guard_log = str(base / "blocked.log")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
  tmpdir = base / "tmp"
  tmpdir.mkdir()
  env.update(PYTHONPATH=emu.guard_sitecustomize(str(base / "guard")), NETWORK_GUARD_LOG=guard_log,
             TMPDIR=str(tmpdir), HOME=str(base))
  proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *ARGV, "--dry-run",
                         "--dry-run-dir", out], cwd=clone, env=env, capture_output=True,
                        text=True, timeout=240)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  blocked = open(guard_log).read() if os.path.exists(guard_log) else ""
  with open(os.path.join(out, "job.json")) as f:
    job = json.load(f)
  return types.SimpleNamespace(clone=clone, out=out, stdout=proc.stdout, blocked=blocked, tmp_left=os.listdir(tmpdir),
                               job=job, options=job["environment"]["sdkPipelineOptions"]["options"],
                               pool=job["environment"]["workerPools"][0])


def test_dry_run_touches_no_network(dry_run):
  assert dry_run.blocked == ""
  assert "Dry run: nothing was submitted" in dry_run.stdout


def test_dry_run_leaves_nothing_in_tmpdir(dry_run):
  # Beam's stager builds the sdist in a folder of $TMPDIR that it never removes.
  assert dry_run.tmp_left == []


def test_dry_run_job_request(dry_run):
  job, options, pool = dry_run.job, dry_run.options, dry_run.pool
  assert job["name"] == JOB and job["type"] == "JOB_TYPE_BATCH"
  assert (options["project"], options["region"], options["runner"]) == (
      "my-project", "us-central1", "DataflowRunner")
  assert options["setup_file"] == os.path.join(dry_run.clone, "setup.py")
  # The request a real submission sends: the dry-run switches are back to their defaults.
  assert options["dry_run"] is False and options["no_auth"] is False
  assert "requirements_cache" not in options
  assert pool["autoscalingSettings"]["maxNumWorkers"] == 7
  assert pool["machineType"] == "n2-standard-4"
  assert pool["workerHarnessContainerImage"] == IMAGE
  assert options["temp_location"].startswith(f"gs://my-bucket/tmp/{JOB}.")


def test_dry_run_stages_the_toolkit_sdist_for_workers(dry_run):
  packages = {p["name"]: p["location"] for p in dry_run.pool["packages"]}
  assert packages["workflow.tar.gz"].startswith(f"storage.googleapis.com/my-bucket/tmp/{JOB}.")
  with tarfile.open(os.path.join(dry_run.out, "workflow.tar.gz")) as tar:
    names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    pkg_info = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/PKG-INFO"))).read()
  assert b"Name: arrayrecord-toolkit" in pkg_info
  for module in ("converter/transforms.py", "converter/writer.py", "converter/tfrecord.py",
                 "pipelines/build.py", "dataflow/submit.py", "setup.py"):
    assert module in names, module


def _sdist_requirements(sdist: str) -> tuple[set[str], str]:
  """(install_requires of the sdist, its requires.txt) as pip on a worker would see them."""
  with tarfile.open(sdist) as tar:
    names = {n.split("/", 1)[1]: n for n in tar.getnames() if "/" in n}
    assert "requirements.txt" in names, (
        "The toolkit sdist lacks requirements.txt, which setup.py reads: installing it on a "
        "Dataflow worker fails with FileNotFoundError. Add 'include requirements.txt' to "
        "MANIFEST.in.")
    requires = tar.extractfile(names["arrayrecord_toolkit.egg-info/requires.txt"]).read().decode()
  unconditional = requires.split("\n[", 1)[0]  # Extras follow as [name] sections.
  return {_dist_name(line) for line in unconditional.splitlines() if line.strip()}, requires


def _dist_name(requirement: str) -> str:
  return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


# Run in a subprocess: which third-party modules does the worker-side code import
# beyond what Beam's own DirectRunner machinery imports?
_WORKER_IMPORTS = r"""
import json, sys
import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

def top_level():  # Installed or checkout modules (not Cython's in-memory helpers).
  return {n.split(".")[0] for n, m in list(sys.modules.items()) if getattr(m, "__file__", None)}

with beam.Pipeline(runner=FnApiRunner()) as p:  # Beam's own baseline, same step kinds.
  _ = (p | beam.Create(["a", "b"]) | "L1" >> beam.combiners.ToList()
       | beam.FlatMap(lambda x: x) | beam.Reshuffle() | beam.Map(str.upper)
       | "L2" >> beam.combiners.ToList() | beam.Map(len))
before = top_level()
import pipelines.tfds_convert  # A worker imports it to unpickle the TFDS metadata step.
from converter import ConvertOptions
from pipelines import build, make_example_data
make_example_data.make_example_data(sys.argv[1] + "/tfr", shards=2, records_per_shard=5)
with beam.Pipeline(runner=FnApiRunner()) as p:  # The Dataflow job's steps, run here.
  build.add_conversion(p, ConvertOptions(output_dir=sys.argv[1] + "/ar"),
                       patterns=[sys.argv[1] + "/tfr/*"])
print(json.dumps(sorted(top_level() - before - set(sys.stdlib_module_names))))
"""


def _requirement_closure(dists: set[str]) -> set[str]:
  """The distributions and everything they require (without extras), as installed here."""
  from importlib import metadata
  seen, todo = set(), list(dists)
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for req in metadata.requires(name) or []:
      if "extra ==" not in req:
        todo.append(_dist_name(req))
  return seen


def test_staged_sdist_installs_everything_the_workers_import(dry_run, tmp_path):
  """Workers pip-install workflow.tar.gz without extras; their container brings Beam.

  So the sdist's install_requires (with their own dependencies) must cover
  every module the pipeline's DoFns import that Beam does not already.
  """
  from importlib import metadata
  requires, text = _sdist_requirements(os.path.join(dry_run.out, "workflow.tar.gz"))
  assert "apache-beam" not in requires, "Beam must stay an extra: " + text
  proc = subprocess.run([sys.executable, "-c", _WORKER_IMPORTS, str(tmp_path)],
                        cwd=dry_run.clone, capture_output=True, text=True, timeout=240,
                        env=dict(os.environ, PYTHONPATH=dry_run.clone))
  assert proc.returncode == 0, proc.stderr[-3000:]
  imported = set(json.loads(proc.stdout.strip().splitlines()[-1]))
  ours = {"converter", "loader", "pipelines", "dataflow"}
  assert {"converter", "pipelines"} <= imported
  by_module = metadata.packages_distributions()
  covered = _requirement_closure(requires)
  needed = {m: [_dist_name(d) for d in by_module.get(m, [m])] for m in imported - ours}
  assert {"array_record", "crc32c", "xxhash"} <= set(needed)
  missing = {m: d for m, d in needed.items() if not covered & set(d)}
  assert not missing, (f"Workers would lack {missing}: add them to requirements.txt "
                       f"(the sdist requires only {sorted(requires)}).")


def test_dry_run_pipeline_has_the_conversion_steps(dry_run):
  from apache_beam.portability.api import beam_runner_api_pb2
  from dataflow import beam_internals
  url = dry_run.options[beam_internals.PIPELINE_URL_OPTION]
  assert url.startswith(f"gs://my-bucket/tmp/{JOB}.") and url.endswith("/pipeline.pb")
  with open(os.path.join(dry_run.out, os.path.basename(url)), "rb") as f:
    pipeline = beam_runner_api_pb2.Pipeline.FromString(f.read())
  names = {t.unique_name for t in pipeline.components.transforms.values()}
  for step in ("MatchInputs/Patterns", "MatchInputs/Match", "ConvertToArrayRecord/PlanShards",
               "ConvertToArrayRecord/Distribute", "ConvertToArrayRecord/ConvertShards",
               "ConvertToArrayRecord/WriteManifest"):
    assert step in names, step
  assert "ConvertToArrayRecord/ConvertShards" in dry_run.stdout
  # The patterns travel in the pipeline, to be listed by the workers.
  with open(os.path.join(dry_run.out, "pipeline.json")) as f:
    assert json.load(f)["components"]["transforms"]


class _FakeResult:
  def __init__(self, job_id, final_state="DONE"):
    self._job = types.SimpleNamespace(id=job_id) if job_id else None
    self.state = None
    self._final_state = final_state

  def wait_until_finish(self):
    self.state = self._final_state


def _fake_pipeline(monkeypatch, result, tmp_path):
  # A real submit checks for credentials first (test_faults_dataflow_credentials).
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", emu.fake_adc(str(tmp_path / "adc.json")))
  seen = {}

  def build_pipeline(request, extra_flags=()):
    seen["request"] = request
    return types.SimpleNamespace(run=lambda: result)

  monkeypatch.setattr(submit, "build_pipeline", build_pipeline)
  return seen


def test_submit_prints_job_id_and_console_url(monkeypatch, capsys, tmp_path):
  seen = _fake_pipeline(monkeypatch, _FakeResult("2026-11-21_12_00_00-123"), tmp_path)
  assert submit.main(ARGV) == 0
  out = capsys.readouterr().out
  assert f"Submitting Dataflow job '{JOB}'" in out
  assert "Submitted job 2026-11-21_12_00_00-123" in out
  assert ("Console: https://console.cloud.google.com/dataflow/jobs/us-central1/"
          "2026-11-21_12_00_00-123?project=my-project") in out
  assert seen["request"].patterns == ("gs://my-bucket/tfr/train-*", "gs://my-bucket/tfr/valid-*")


@pytest.mark.parametrize("state,code", [("DONE", 0), ("FAILED", 1)])
def test_wait_reports_final_state(monkeypatch, capsys, state, code, tmp_path):
  _fake_pipeline(monkeypatch, _FakeResult("job-1", state), tmp_path)
  assert submit.main(ARGV + ["--wait"]) == code
  assert f"Final state: {state}" in capsys.readouterr().out


def test_template_launch_writes_the_job_instead_of_starting_it(monkeypatch, capsys, tmp_path):
  """A Flex Template launcher passes --template_location and booleans as =true."""
  _fake_pipeline(monkeypatch, _FakeResult(None), tmp_path)
  argv = [a for a in ARGV if a != "--skip-existing"] + [
      "--skip_existing=true", "--template_location=gs://my-bucket/staging/launch/job_object"]
  assert submit.main(argv) == 0
  assert ("Wrote the job to gs://my-bucket/staging/launch/job_object; no job was started."
          in capsys.readouterr().out)


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_a_dry_run_folder_that_cannot_be_written_is_one_line_and_left_empty(dry_run, tmp_path, how):
  import faults_testing as ft  # pylint: disable=g-import-not-at-top
  where = str(tmp_path / "mnt")
  with ft.tmpfs(where, "200k", read_only=how == "read-only"):
    target = os.path.join(where, "dr")
    argv = [*ARGV, "--dry-run", "--dry-run-dir", target]
    proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *argv], cwd=dry_run.clone,
                          capture_output=True, text=True, timeout=240, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 1, proc.stderr
    # Only the sdist builder's progress lines ("* Building sdist...") come before the error's one line.
    lines = [l for l in proc.stderr.strip().splitlines() if not l.startswith("* ")]
    assert len(lines) == 1 and lines[0].startswith(
        f"arrayrecord-dataflow: error: cannot write the dry run to {target}"), proc.stderr
    assert "nothing was left there" in lines[0]
    assert os.listdir(where) == []  # No partial workflow.tar.gz: a rerun finds the folder as before.
