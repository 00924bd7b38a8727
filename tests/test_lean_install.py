"""`pip install .` without extras, in a fresh venv: the loader works and Beam is absent.

Training code installs the toolkit only for `import loader`; Apache Beam and
its dependency tree come with the [beam] extra. This installs a fresh copy
of the checkout into a new venv from the package index (pip's cache makes
repeat runs quick; about 30 s here), then, in that venv, reads a dataset
the converter wrote and runs the console scripts, which must name the extra
to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import repo_copy

pytestmark = pytest.mark.timeout(600)

HEAVY = ("apache_beam", "tensorflow", "jax", "grain", "pyarrow", "google.cloud.storage")
SHARDS, RECORDS = 3, 40

_READ_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import loader
    import converter

    def ids(dataset_dir, workers):
      features = {"id": loader.FixedLenFeature([], "int64")}
      ds = (loader.MapDataset.source(loader.ArrayRecordSource(dataset_dir))
            .shuffle(seed=7)
            .map(lambda r: int(loader.parse_example(r, features)["id"]))
            .batch(16))
      it = ds.to_iter_dataset()
      if workers:  # Lambdas reach the worker through cloudpickle, a lean dependency.
        it = it.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
      return [int(x) for batch in it for x in batch]

    if __name__ == "__main__":
      dataset_dir, workers = sys.argv[1], int(sys.argv[2])
      try:
        converter.ConvertToArrayRecord
        transform_error = None
      except ImportError as e:
        transform_error = str(e)
      manifest = converter.read_manifest(dataset_dir)
      print(json.dumps({
          "ids": ids(dataset_dir, workers),
          "manifest_records": manifest["totals"]["records"],
          "imported": sorted(m for m in %r if m in sys.modules),
          "installed": sorted(m for m in %r if importlib.util.find_spec(m.split(".")[0])),
          "transform_error": transform_error,
      }))
""" % (HEAVY, HEAVY))


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
  env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
  env.pop("PYTHONPATH", None)  # Nothing from the checkout or the dev venv leaks in.
  return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=540, **kwargs)


@pytest.fixture(scope="module")
def lean(tmp_path_factory):
  """A new venv with a plain `pip install <fresh copy of the checkout>`."""
  base = tmp_path_factory.mktemp("lean")
  src = repo_copy.fresh_copy(str(base / "src"))
  venv = str(base / "venv")
  made = _run([sys.executable, "-m", "venv", venv])
  assert made.returncode == 0, made.stderr
  python = os.path.join(venv, "bin", "python")
  installed = _run([python, "-m", "pip", "install", "-q", src], cwd=str(base))
  assert installed.returncode == 0, installed.stdout + installed.stderr
  listed = _run([python, "-m", "pip", "list", "--format=json"])
  packages = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
  return {"base": base, "venv": venv, "python": python, "packages": packages}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """Example TFRecords converted by the real converter (this venv, DirectRunner)."""
  from pipelines import convert, make_example_data
  base = tmp_path_factory.mktemp("lean-data")
  make_example_data.make_example_data(str(base / "tfr"), shards=SHARDS, records_per_shard=RECORDS)
  out = str(base / "ar")
  convert.run(["--input", str(base / "tfr" / "*"), "--output", out, "--quiet"])
  return out


def test_lean_install_has_no_beam_or_tensorflow(lean):
  assert "arrayrecord-toolkit" in lean["packages"]
  for dist in ("array-record", "numpy", "cloudpickle"):
    assert dist in lean["packages"], dist
  for dist in ("apache-beam", "tensorflow", "tensorflow-cpu", "jax", "grain", "pyarrow",
               "google-cloud-storage", "grpcio"):
    assert dist not in lean["packages"], f"{dist} came with the lean install"


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_reads_a_converted_dataset_without_beam(lean, dataset, workers):
  script = lean["base"] / "read.py"
  script.write_text(_READ_SCRIPT)
  proc = _run([lean["python"], str(script), dataset, str(workers)], cwd=str(lean["base"]))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["imported"] == [] and got["installed"] == []
  assert got["manifest_records"] == SHARDS * RECORDS
  assert sorted(got["ids"]) == list(range(SHARDS * RECORDS))
  # The same pipeline in the full dev environment gives the same stream.
  import loader
  features = {"id": loader.FixedLenFeature([], "int64")}
  ds = (loader.MapDataset.source(loader.ArrayRecordSource(dataset)).shuffle(seed=7)
        .map(lambda r: int(loader.parse_example(r, features)["id"])).batch(16))
  assert got["ids"] == [int(x) for batch in ds.to_iter_dataset() for x in batch]
  assert "pip install 'arrayrecord-toolkit[beam]'" in got["transform_error"]


@pytest.mark.parametrize("script,extra,module", [
    ("arrayrecord-convert", "beam", "pipelines.convert"), ("arrayrecord-verify", "beam", "pipelines.verify"),
    ("arrayrecord-tfds", "beam", "pipelines.tfds_convert"), ("arrayrecord-dataflow", "gcp", "dataflow.submit")])
@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_console_scripts_name_the_extra_to_install(lean, script, extra, module, how):
  cmd = [os.path.join(lean["venv"], "bin", script)] if how == "console script" else [lean["python"], "-m", module]
  proc = _run(cmd + ["--input", "x", "--output", "y"], cwd=str(lean["base"]))
  assert proc.returncode == 2
  assert proc.stdout == ""
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith(f"{script}: error: Apache Beam is not installed")
  assert f"pip install 'arrayrecord-toolkit[{extra}]'" in lines[0]
