"""arrayrecord-dataflow --tfds-dataset-dir: flags, the offline dry run, and the job end to end.

A small TFDS dataset (TFRecord, 2 splits x 2 shards) is prepared with TFDS
here and uploaded to a local GCS emulator. The dry run builds the Dataflow
request from it with no credentials and no network beyond the emulator; the
end-to-end test runs the very pipeline the job would run on DirectRunner
against the emulator and reads the result with tfds.builder_from_directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import gcs_emulator as emu
import repo_copy
from dataflow import flags, submit

tfds = pytest.importorskip("tensorflow_datasets")

pytestmark = pytest.mark.timeout(300)

NAME, VERSION = "ar_toolkit_dataflow_toy", "1.0.0"
SPLITS = {"train": 12, "test": 5}
B = f"gs://{emu.BUCKET}"
SRC = f"{B}/tensorflow_datasets/{NAME}/{VERSION}"
DATAFLOW = ["--project", "my-project", "--region", "us-central1",
            "--temp_location", "gs://my-bucket/tmp", "--setup_file", "none"]


class ArToolkitDataflowToy(tfds.core.GeneratorBasedBuilder):
  """Tiny dataset: an int, a class label and text."""

  VERSION = tfds.core.Version(VERSION)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "id": np.int64, "label": tfds.features.ClassLabel(names=["a", "b", "c"]),
        "text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(0, SPLITS["train"]),
            "test": self._generate_examples(100, SPLITS["test"])}

  def _generate_examples(self, first, n):
    for i in range(first, first + n):
      yield i, {"id": i, "label": i % 3, "text": f"example {i}"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """(local dataset folder, {split: examples in order}) of the TFRecord source."""
  builder = ArToolkitDataflowToy(data_dir=str(tmp_path_factory.mktemp("tfds")),
                                 file_format="tfrecord")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=2))
  read_config = tfds.ReadConfig(interleave_cycle_length=1)
  expected = {s: list(tfds.as_numpy(builder.as_dataset(split=s, shuffle_files=False,
                                                       read_config=read_config)))
              for s in SPLITS}
  return str(builder.data_dir), expected


@pytest.fixture(scope="module")
def gcs(tmp_path_factory, dataset):
  """The emulator holding the dataset under SRC; the network guard on."""
  folder = str(tmp_path_factory.mktemp("gcs"))
  server = emu.Emulator(folder).start()
  with pytest.MonkeyPatch.context() as mp:
    env = emu.emulator_env(server.host, folder)
    for key, value in env.items():
      mp.setenv(key, value)
    try:
      with emu.network_guard() as blocked:
        emu.client().create_bucket(emu.BUCKET)
        for name in sorted(os.listdir(dataset[0])):
          emu.upload(os.path.join(dataset[0], name), f"{SRC}/{name}")
        yield {"folder": folder, "env": env, "blocked": blocked}
        assert [b for b in blocked if b not in emu.EXPECTED_REFUSALS] == []
    finally:
      server.stop()


def _tfds_argv(out: str | None, *more: str) -> list[str]:
  return ["--tfds-dataset-dir", SRC, *(["--out-dir", out] if out else []), *DATAFLOW, *more]


# --- Flags: offline, one line each ----------------------------------------------------


def test_tfds_flags_become_a_request():
  request = flags.parse(_tfds_argv(f"{B}/tfds_ar/{NAME}/{VERSION}/", "--skip-existing"))
  assert request.patterns == ()
  assert (request.tfds_dataset_dir, request.tfds_out_dir) == (
      SRC, f"{B}/tfds_ar/{NAME}/{VERSION}/")
  assert request.convert.output_dir == f"{B}/tfds_ar/{NAME}/{VERSION}/"
  assert request.convert.existing == "skip"
  in_place = flags.parse(_tfds_argv(None))
  assert in_place.tfds_out_dir is None and in_place.convert.output_dir == SRC


@pytest.mark.parametrize("argv,message", [
    (_tfds_argv(None, "--input", f"{B}/tfr/*"), "not --input/--output"),
    (_tfds_argv(None, "--output", f"{B}/ar"), "not --input/--output"),
    (["--input", f"{B}/tfr/*", "--output", f"{B}/ar", "--out-dir", f"{B}/o/1", *DATAFLOW],
     "--out-dir goes with --tfds-dataset-dir"),
    (["--tfds-dataset-dir", "/data/tensorflow_datasets/mnist/3.0.1", *DATAFLOW],
     "--tfds-dataset-dir '/data/tensorflow_datasets/mnist/3.0.1' is not on Cloud Storage"),
    (["--tfds-dataset-dir", "gs://my-bucket", *DATAFLOW], "needs a folder inside the bucket"),
    (_tfds_argv("/tmp/out"), "--out-dir must be a Cloud Storage path"),
], ids=["input", "output", "out-dir", "local", "bucket-only", "local-out"])
def test_bad_tfds_flags_fail_in_one_line_offline(argv, message, capsys):
  with emu.network_guard() as blocked:
    assert submit.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.count("\n") == 1 and message in err, err
  assert blocked == []


def test_missing_dataset_and_existing_output_are_one_line_errors(gcs, capsys):
  assert submit.main(["--tfds-dataset-dir", f"{B}/tensorflow_datasets/nope/1.0.0",
                      *DATAFLOW, "--dry-run"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "dataset_info.json" in err, err
  taken = f"{B}/tfds_ar/taken/{VERSION}"
  emu.client().bucket(emu.BUCKET).blob(f"tfds_ar/taken/{VERSION}/dataset_info.json") \
      .upload_from_string("{}")
  assert submit.main(_tfds_argv(taken, "--dry-run")) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "1 output file(s) already exist" in err, err
  assert f"{taken}/dataset_info.json" in err


def test_a_missing_shard_is_refused_before_the_job_and_the_local_run(gcs, dataset, capsys, tmp_path):
  from pipelines import tfds_convert
  src = f"{B}/missing_shard/{NAME}/{VERSION}"
  names = sorted(os.listdir(dataset[0]))
  gone = next(n for n in names if "-train.tfrecord-00000-" in n)
  for name in names:
    if name != gone:
      emu.upload(os.path.join(dataset[0], name), f"{src}/{name}")
  out = f"{B}/missing_shard_out/{NAME}/{VERSION}"
  argv_dataflow = ["--tfds-dataset-dir", src, "--out-dir", out, *DATAFLOW, "--dry-run",
                   "--dry-run-dir", str(tmp_path / "request")]
  for prog, main, argv in (("arrayrecord-dataflow", submit.main, argv_dataflow),
                           ("arrayrecord-tfds", tfds_convert.main, ["--dataset_dir", src, "--out_dir", out, "--quiet"])):
    code, err = main(argv), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: 1 of 4 TFRecord shard(s) named by {src}/dataset_info.json are missing, "
                          f"e.g. '{src}/{gone}'. The dataset is incomplete; prepare it again."), err
  assert not list(emu.client().bucket(emu.BUCKET).list_blobs(prefix="missing_shard_out/"))
  assert not (tmp_path / "request").exists()


# --- The dry run, as a process on a fresh copy of the checkout ------------------------


def test_dry_run_builds_the_tfds_job_offline(gcs, tmp_path):
  clone = repo_copy.fresh_copy(str(tmp_path / "clone"))
  out_dir, request_dir = f"{B}/tfds_ar/dry/{NAME}/{VERSION}", str(tmp_path / "request")
  guard_log = tmp_path / "blocked.log"
  env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
  env.update(gcs["env"], PYTHONPATH=emu.guard_sitecustomize(str(tmp_path / "guard")),
             NETWORK_GUARD_LOG=str(guard_log), HOME=str(tmp_path), TMPDIR=str(tmp_path))
  argv = [a for a in _tfds_argv(out_dir, "--job_name", "tfds-dry-run") if a not in (
      "--setup_file", "none")]  # Stage the clone's sdist, as a real submission does.
  proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *argv, "--dry-run-dir",
                         request_dir], cwd=clone, env=env, capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert not guard_log.exists(), guard_log.read_text()
  assert "Dry run: nothing was submitted" in proc.stdout
  assert "ConvertToArrayRecord/ConvertShards" in proc.stdout
  assert "WriteTfdsMetadata" in proc.stdout
  with open(os.path.join(request_dir, "job.json")) as f:
    job = json.load(f)
  assert job["name"] == "tfds-dry-run"
  assert "workflow.tar.gz" in {p["name"] for p in job["environment"]["workerPools"][0]["packages"]}
  with open(os.path.join(request_dir, "pipeline.json")) as f:
    pipeline = f.read()
  for step in ("ConvertToArrayRecord/PlanShards", "ConvertToArrayRecord/ConvertShards",
               "CollectTfdsResults", "WriteTfdsMetadata"):
    assert step in pipeline, step
  assert emu.list_objects(out_dir + "/") == {}  # A dry run writes nothing to the bucket.


# --- The job's pipeline, run on DirectRunner against the emulator ---------------------


def _download_dir(prefix: str, local: str) -> str:
  for path in emu.list_objects(prefix + "/"):
    emu.download(path, os.path.join(local, path[len(prefix) + 1:]))
  return local


def test_the_job_pipeline_end_to_end_reads_with_tfds(gcs, dataset, tmp_path, capsys):
  out_dir = f"{B}/tfds_ar/e2e/{NAME}/{VERSION}"
  request = flags.parse(_tfds_argv(out_dir))
  plan = submit.check_tfds_dataset(request)
  assert len(plan.inputs) == 4
  submit.build_pipeline(request, ["--runner=DirectRunner"]).run().wait_until_finish()

  objects = emu.list_objects(out_dir + "/")
  assert not [o for o in objects if ".tmp-" in o], objects
  local = _download_dir(out_dir, str(tmp_path / NAME / VERSION))
  info = json.load(open(os.path.join(local, "dataset_info.json")))
  assert info["fileFormat"] == "array_record"
  builder = tfds.builder_from_directory(local)
  for split, want in dataset[1].items():
    source = builder.as_data_source(split=split)
    got = [source[i] for i in range(len(source))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert sorted(g) == sorted(w)
      for k in w:
        np.testing.assert_array_equal(g[k], w[k])


def test_submit_names_the_dataset_and_its_shards(gcs, monkeypatch, capsys):
  """What a real submission prints; the job itself is replaced by a finished fake."""
  built = []

  class _StartedJob:  # What DataflowRunner.run returns once the job is created.
    _job = types.SimpleNamespace(id="2026-11-23_01_02_03-42")
    state = None

  def build_pipeline(request, extra_flags=()):
    built.append(request)
    return types.SimpleNamespace(run=_StartedJob)

  monkeypatch.setattr(submit, "build_pipeline", build_pipeline)
  out_dir = f"{B}/tfds_ar/submitted/{NAME}/{VERSION}"
  assert submit.main(_tfds_argv(out_dir, "--job_name", "tfds-job")) == 0
  out = capsys.readouterr().out
  assert (f"Submitting Dataflow job 'tfds-job' (project my-project, region us-central1): "
          f"TFDS dataset '{NAME}' (4 shard(s) in {SRC}) -> {out_dir}") in out
  assert "Submitted job 2026-11-23_01_02_03-42 (tfds-job)." in out
  assert built[0].tfds_dataset_dir == SRC
