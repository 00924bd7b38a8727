"""dataflow.submit flags: wrong or missing ones fail in one line, before any network use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import gcs_emulator as emu
from dataflow import flags, staging, submit

pytestmark = pytest.mark.timeout(120)

GOOD = ["--input", "gs://my-bucket/tfr/train-*", "--output", "gs://my-bucket/ar/",
        "--project", "my-project", "--region", "us-central1",
        "--temp_location", "gs://my-bucket/tmp"]


def _without(*names: str) -> list[str]:
  out, skip = [], False
  for arg in GOOD:
    if skip:
      skip = False
    elif arg in names:
      skip = True
    else:
      out.append(arg)
  return out


def _with(**values: str) -> list[str]:
  out = _without(*(f"--{k}" for k in values))
  for k, v in values.items():
    out += [f"--{k}", v]
  return out


@pytest.fixture
def offline(monkeypatch):
  """Fails the test if anything is submitted, dry-run or contacted."""
  def forbidden(*_):
    raise AssertionError("a job was built although the flags are wrong")
  monkeypatch.setattr(submit, "submit", forbidden)
  monkeypatch.setattr(submit, "dry_run", forbidden)
  with emu.network_guard() as blocked:
    yield
  assert blocked == [], f"network access attempted: {blocked}"


BAD = [
    (_without("--project"), "--project is required"),
    (_without("--region"), "--region is required"),
    (_without("--temp_location"), "--temp_location is required"),
    (_without("--input"), "--input and --output are required"),
    (_without("--output"), "--input and --output are required"),
    (_with(project="p"), "--project 'p' is not a valid project id"),
    (_with(project="My_Project"), "'My_Project' is not a valid project id"),
    (_with(project="123456789012"), "is a project number"),
    (_with(region="us-central1-a"), "'us-central1-a' is a zone"),
    (_with(region="moon"), "'moon' is not a Google Cloud region"),
    (_with(temp_location="/tmp/beam"), "--temp_location must be a Cloud Storage path"),
    (_with(temp_location="gs://ab/tmp"), "'ab', which is not a valid bucket name"),
    (_with(temp_location="gs://my-bucket"), "needs a folder inside the bucket"),
    (_with(staging_location="s3://b/x"), "--staging_location must be a Cloud Storage path"),
    (_with(output="out/"), "--output must be a Cloud Storage path gs://BUCKET/..., got 'out/'"),
    (_with(output="gs://x/ar"), "names the bucket 'x'"),
    (_with(input="data/train-*"), "--input 'data/train-*' is not on Cloud Storage"),
    (GOOD + ["--writer-options", "group_size:1,bogus:3"], "Unknown ArrayRecord writer option 'bogus'"),
    (GOOD + ["--writer-options", "group_size:x"], "Invalid ArrayRecord writer options 'group_size:x'"),
    (GOOD + ["--compression", "lz4"], "invalid choice: 'lz4'"),
    (GOOD + ["--overwrite", "--skip-existing"], "not allowed with argument"),
    (GOOD + ["--overwrite=maybe"], "--overwrite takes true or false, got 'maybe'"),
    (_with(job_name="My Job"), "--job_name 'My Job' is not valid"),
    (GOOD + ["--service_account_email", "worker"], "'worker' is not an email address"),
    (GOOD + ["--subnetwork", "my-subnet"], "'my-subnet' is not a subnetwork path"),
    (GOOD + ["--subnetwork", "regions/europe-west4/subnetworks/s"], "is in region 'europe-west4'"),
    (GOOD + ["--max_num_workers", "0"], "--max_num_workers must be a positive number"),
    (GOOD + ["--max_num_workers", "many"], "invalid int value: 'many'"),
    (GOOD + ["--runner", "DirectRunner"], "--runner 'DirectRunner': this tool submits to DataflowRunner"),
    (GOOD + ["--max_num_worker=3"], "Unknown flag(s) --max_num_worker"),
    (GOOD + ["gs://my-bucket/tfr/other-*"], "Unexpected argument(s) 'gs://my-bucket/tfr/other-*'"),
    (GOOD + ["--num_workers=9", "--max_num_workers=3"], "num_workers (9) cannot exceed max_num_workers (3)"),
    (GOOD + ["--setup_file", "/nonexistent/setup.py"], "--setup_file '/nonexistent/setup.py' is not"),
    # Beam's own parser refuses the value: its one line, not its ~140-line usage.
    (GOOD + ["--flexrs_goal", "CHEAP"], "argument --flexrs_goal: invalid choice: 'CHEAP' (choose from "
                                        "'COST_OPTIMIZED', 'SPEED_OPTIMIZED')"),
    (GOOD + ["--autoscaling_algorithm", "FOO"], "argument --autoscaling_algorithm: invalid choice: 'FOO'"),
    # What Dataflow would reject only after staging.
    (GOOD + ["--worker_zone", "us-central1"], "--worker_zone 'us-central1' is a region; give a zone"),
    (GOOD + ["--worker_region", "europe-west4-a"], "--worker_region 'europe-west4-a' is a zone"),
    (GOOD + ["--labels", "Team=ML Research"], "--labels 'Team=ML Research' is not a valid label"),
    (GOOD + ["--labels", "team=ML"], "--labels 'team=ML' is not a valid label"),
    (GOOD + ["--disk_size_gb", "-5"], "--disk_size_gb must be a positive integer, got '-5'"),
    (GOOD + ["--number_of_worker_harness_threads", "-1"], "--number_of_worker_harness_threads must be a positive"),
    (GOOD + ["--machine_type", "N2-STANDARD-4"], "(machine types are lower case: 'n2-standard-4')"),
    (GOOD + ["--machine_type", "bogus"], "--machine_type 'bogus' is not a machine type"),
    (GOOD + ["--sdk_container_image", "not an image"], "is not a container image path"),
    (GOOD + ["--subnetwork", "regions/europe-west4/subnetworks/s1", "--worker_zone", "us-east1-b"],
     "but the workers run in 'us-east1' (--worker_region / --worker_zone)"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m for _, m in BAD])
def test_bad_flags_fail_in_one_line_before_any_network_call(argv, message, offline, capsys):
  assert submit.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == ""
  assert err.endswith("\n") and err.count("\n") == 1, err
  assert err.startswith(f"{flags.PROG}: error: "), err
  assert message in err, err


def test_non_empty_dry_run_dir_is_refused(offline, capsys, tmp_path):
  (tmp_path / "old.json").write_text("{}")
  assert submit.main(GOOD + ["--dry-run-dir", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "is not an empty folder" in err


def test_good_flags_become_beam_flags():
  request = flags.parse(GOOD + [
      "--input", "gs://my-bucket/tfr/valid-*", "--overwrite=true", "--skip_existing=false",
      "--writer_options", "group_size:1,zstd:3", "--on_corrupt", "skip",
      "--max-num-workers", "8", "--worker_machine_type", "n2-standard-4",
      "--staging-location", "gs://my-bucket/staging", "--job_name", "convert-1",
      "--service_account_email", "w@my-project.iam.gserviceaccount.com",
      "--network", "vpc", "--subnetwork", "regions/us-central1/subnetworks/s",
      "--sdk_container_image", "us-docker.pkg.dev/my-project/r/img:1",
      "--runner=DataflowRunner", "--num_workers", "2", "--no_use_public_ips",
      "--experiments=shuffle_mode=service"])
  assert request.patterns == ("gs://my-bucket/tfr/train-*", "gs://my-bucket/tfr/valid-*")
  c = request.convert
  assert (c.output_dir, c.existing, c.on_corrupt, c.writer_options) == (
      "gs://my-bucket/ar/", "overwrite", "skip", "group_size:1,zstd:3")
  assert request.job_name == "convert-1" and request.dry_run_dir is None
  assert request.setup_file == os.path.join(staging.checkout_root(), "setup.py")
  assert list(request.beam_args) == [
      "--runner=DataflowRunner", "--job_name=convert-1", "--project=my-project",
      "--region=us-central1", "--temp_location=gs://my-bucket/tmp",
      "--staging_location=gs://my-bucket/staging",
      "--service_account_email=w@my-project.iam.gserviceaccount.com", "--network=vpc",
      "--subnetwork=regions/us-central1/subnetworks/s", "--max_num_workers=8",
      "--machine_type=n2-standard-4",
      "--sdk_container_image=us-docker.pkg.dev/my-project/r/img:1",
      f"--setup_file={request.setup_file}",
      "--num_workers", "2", "--no_use_public_ips", "--experiments=shuffle_mode=service"]


def test_defaults_and_switch_spellings():
  request = flags.parse(GOOD + ["--skip-existing=true", "--setup_file", "none", "--dry_run"])
  assert request.convert.existing == "skip" and request.convert.writer_options == "group_size:1"
  assert request.setup_file is None and not any("setup_file" in a for a in request.beam_args)
  assert request.job_name.startswith("arrayrecord-convert-")
  assert request.dry_run_dir == os.path.abspath(os.path.join("dataflow-dry-run", request.job_name))


def test_normalize_switches_leaves_other_flags_alone():
  assert flags.normalize_switches(
      ["--overwrite=True", "--wait=0", "--dry-run=yes", "--input=a=b", "--labels=x=true"]) == [
          "--overwrite", "--dry-run", "--input=a=b", "--labels=x=true"]


def test_help_lists_converter_and_dataflow_flags(capsys):
  with pytest.raises(SystemExit) as info:
    submit.main(["--help"])
  assert info.value.code == 0
  out = capsys.readouterr().out
  for flag in ("--input", "--writer-options", "--on-corrupt", "--skip-existing", "--project",
               "--temp_location", "--max_num_workers", "--machine_type", "--dry-run-dir"):
    assert flag in out


@pytest.mark.parametrize("argv,message", [
    (_without("--temp_location"), "--temp_location is required"),
    (GOOD + ["--max_num_worker=3", "--foo", "bar"], "Unknown flag(s) --foo, --max_num_worker"),
    (GOOD + ["--num_workers=9", "--max_num_workers=3"], "cannot exceed max_num_workers"),
    (GOOD + ["--writer-options", "group_size:x"], "Invalid ArrayRecord writer options"),
], ids=["missing", "unknown", "beam-check", "writer-options"])
def test_cli_prints_exactly_one_line(argv, message, tmp_path):
  """As a real process: nothing else (Beam's logging, warnings) reaches the terminal."""
  log = tmp_path / "blocked.log"
  env = dict(os.environ, PYTHONPATH=emu.guard_sitecustomize(str(tmp_path / "guard")),
             NETWORK_GUARD_LOG=str(log))
  proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *argv], cwd=staging.checkout_root(),
                        env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stdout == ""
  assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
  assert not log.exists(), log.read_text()
