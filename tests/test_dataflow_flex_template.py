"""The Flex Template's metadata, Dockerfile and recipe stay in step with the CLI.

Docker is not available here, so the image itself is not built.
"""

from __future__ import annotations

import json
import os
import re

import apache_beam
import pytest

from dataflow import flags

pytestmark = pytest.mark.timeout(60)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLEX = os.path.join(REPO, "dataflow", "flex_template")
SAMPLE = {"input": "gs://my-bucket/tfr/train-*", "output": "gs://my-bucket/ar/",
          "writer_options": "group_size:1,zstd:3", "compression": "gzip", "on_corrupt": "skip",
          "overwrite": "true", "skip_existing": "false"}
# What the launcher adds to the parameters: the job's Dataflow options.
LAUNCHER_FLAGS = ["--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
                  "--temp_location=gs://my-bucket/tmp", "--staging_location=gs://my-bucket/staging",
                  "--job_name=arrayrecord-flex", "--template_location=gs://my-bucket/staging/job"]


@pytest.fixture(scope="module")
def metadata():
  with open(os.path.join(FLEX, "metadata.json")) as f:
    return json.load(f)


def _option(dest: str):
  return next(a for a in flags.parser()._actions if a.dest == dest)  # pylint: disable=protected-access


def test_parameters_are_the_converter_flags(metadata):
  names = [p["name"] for p in metadata["parameters"]]
  assert len(names) == len(set(names))
  assert set(names) == set(flags.TEMPLATE_PARAMETERS)
  converter_dests = {a.dest for a in flags.parser()._actions  # pylint: disable=protected-access
                     if a.dest not in ("help", "dry_run", "dry_run_dir", "wait", "setup_file")
                     and a.dest not in flags.DATAFLOW_FLAGS}
  assert converter_dests == set(flags.TEMPLATE_PARAMETERS)
  for name in names:  # The launcher passes each as --NAME=VALUE.
    assert f"--{name}" in _option(name).option_strings, name


def test_required_and_optional_parameters_match_the_cli(metadata):
  for p in metadata["parameters"]:
    assert p.get("isOptional", False) == (not _option(p["name"]).required), p["name"]
    assert p["label"] and p["helpText"]


def test_parameter_regexes_accept_exactly_the_cli_choices(metadata):
  params = {p["name"]: p for p in metadata["parameters"]}
  for name, value in SAMPLE.items():
    assert all(re.fullmatch(r, value) for r in params[name].get("regexes", [])), name
  for name in ("compression", "on_corrupt"):
    (regex,) = params[name]["regexes"]
    assert set(re.findall(r"[a-z]+", regex)) == set(_option(name).choices), name
  assert not re.fullmatch(params["input"]["regexes"][0], "data/train-*")


def test_a_launcher_command_line_parses(metadata):
  argv = [f"--{k}={v}" for k, v in SAMPLE.items()] + LAUNCHER_FLAGS
  request = flags.parse(argv)
  assert request.patterns == (SAMPLE["input"],)
  assert (request.convert.existing, request.convert.compression, request.convert.on_corrupt) == (
      "overwrite", "gzip", "skip")
  assert "--template_location=gs://my-bucket/staging/job" in request.beam_args
  assert request.dry_run_dir is None


def test_dockerfile_uses_the_beam_sdk_image_and_the_entry_point():
  with open(os.path.join(FLEX, "Dockerfile")) as f:
    text = f.read()
  # The image carries its own Python (whatever the machine that builds it runs): the
  # workers' SDK image and the launcher base must name the same one, and Beam's version is ours.
  (py, beam) = re.findall(r"^ARG BEAM_IMAGE=apache/beam_python(3\.\d+)_sdk:(\S+)$", text, flags=re.M)[0]
  assert beam == apache_beam.__version__
  assert f"ARG LAUNCHER_IMAGE=gcr.io/dataflow-templates-base/python{py.replace('.', '')}-template-launcher-base:" in text
  assert tuple(map(int, py.split("."))) >= (3, 11)
  assert "python_template_launcher" in text and 'ENTRYPOINT ["/opt/apache/beam/boot"]' in text
  (entry,) = re.findall(r'FLEX_TEMPLATE_PYTHON_PY_FILE="\$\{WORKDIR\}/([^"]+)"', text)
  assert os.path.isfile(os.path.join(REPO, entry)), entry
  for copied in re.findall(r"^COPY (?!--)(\S+)", text, flags=re.M):
    assert os.path.exists(os.path.join(REPO, copied)), copied
  with open(os.path.join(REPO, entry)) as f:
    assert "submit.main()" in f.read()


def test_readme_has_the_build_and_run_recipe():
  with open(os.path.join(FLEX, "README.md")) as f:
    text = f.read()
  for needle in ("gcloud dataflow flex-template build", "--metadata-file dataflow/flex_template/metadata.json",
                 "-f dataflow/flex_template/Dockerfile", "gcloud dataflow flex-template run",
                 "--template-file-gcs-location", "sdk_container_image="):
    assert needle in text, needle
  for name in SAMPLE:
    if name in ("input", "output"):
      assert f"--parameters {name}=" in text
