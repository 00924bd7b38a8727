"""gs:// end to end against a local GCS emulator: Beam's real GCS filesystem, no cloud.

TFRecords written by TensorFlow are uploaded to gs://test-bucket/...; the
conversion runs on DirectRunner and reads and writes through Beam's GCS
filesystem; outputs are downloaded and read with array_record's reader.
Every test runs under a guard that refuses non-loopback network access.
"""

from __future__ import annotations

import json
import os
import random
import types

import pytest

import gcs_emulator as emu
from conftest import read_array_record, write_tfrecords_tf

pytestmark = pytest.mark.timeout(300)

B = f"gs://{emu.BUCKET}"
SHARDS = {  # object name under tfr/ -> (number of records, compression)
    "train.tfrecord-00000-of-00003": (40, None),
    "train.tfrecord-00001-of-00003": (1, "GZIP"),
    "train.tfrecord-00002-of-00003": (0, None),
    "sub/valid.tfrecord-00000-of-00001": (25, "ZLIB"),
}


def _records(name: str, n: int) -> list[bytes]:
  rng = random.Random(name)
  return [rng.randbytes(rng.choice([0, 1, 7, 300, 5000])) for _ in range(n)]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator with the TFRecord shards under gs://test-bucket/tfr/."""
  folder = str(tmp_path_factory.mktemp("gcs"))
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  guard_dir = emu.guard_sitecustomize(os.path.join(folder, "guard"))
  server = emu.Emulator(folder).start()
  with pytest.MonkeyPatch.context() as mp:
    for key, value in emu.emulator_env(server.host, folder).items():
      mp.setenv(key, value)
    # Beam's multi-processing workers: find the checkout, and guard the network too.
    mp.setenv("PYTHONPATH", os.pathsep.join([guard_dir, repo, os.environ.get("PYTHONPATH", "")]))
    mp.setenv("NETWORK_GUARD_LOG", os.path.join(folder, "blocked.log"))
    try:
      with emu.network_guard() as blocked:
        emu.client().create_bucket(emu.BUCKET)
        expected = {}
        for name, (n, compression) in SHARDS.items():
          records = _records(name, n)
          local = write_tfrecords_tf(os.path.join(folder, "tfr", name), records, compression)
          emu.upload(local, f"{B}/tfr/{name}")
          expected[name] = records
        yield {"expected": expected, "folder": folder, "blocked": blocked,
               "blocked_log": os.path.join(folder, "blocked.log")}
    finally:
      server.stop()


@pytest.fixture(autouse=True)
def _no_network_attempts(gcs):
  yield
  logged = open(gcs["blocked_log"]).read().splitlines() if os.path.exists(gcs["blocked_log"]) else []
  attempts = [a for a in gcs["blocked"] + logged if a not in emu.EXPECTED_REFUSALS]
  assert not attempts, f"network access attempted: {attempts}"


def _out_name(tfr_name: str) -> str:
  return tfr_name.replace(".tfrecord", ".array_record")


def _convert(output: str, *flags: str) -> dict:
  from pipelines import convert
  return convert.run(["--input", f"{B}/tfr/train.tfrecord-*", "--input", f"{B}/tfr/sub/*",
                      "--output", output, "--quiet", "--project", emu.PROJECT, *flags])


def _run_in_pipeline(output: str, *, existing: str = "error", on_corrupt: str = "fail",
                     patterns=None, beam_flags=()) -> None:
  """The Dataflow path: inputs matched and outputs checked inside the pipeline."""
  import apache_beam as beam
  from converter import ConvertOptions
  from pipelines import build
  options = ConvertOptions(output_dir=output, existing=existing, on_corrupt=on_corrupt,
                           input_root=f"{B}/tfr")
  opts = build.pipeline_options([f"--project={emu.PROJECT}", *beam_flags])
  with beam.Pipeline(options=opts) as p:
    build.add_conversion(p, options, patterns=patterns or [f"{B}/tfr/train.tfrecord-*",
                                                           f"{B}/tfr/sub/*"])


def _check_outputs(gcs, output: str) -> dict:
  """Outputs match inputs 1:1 by name and content; returns the manifest."""
  objects = emu.list_objects(output + "/")
  want = {f"{output}/{_out_name(n)}" for n in SHARDS} | {f"{output}/manifest.json"}
  assert set(objects) == want
  for name, records in gcs["expected"].items():
    local = emu.download(f"{output}/{_out_name(name)}",
                         os.path.join(gcs["folder"], "dl", output[5:], _out_name(name)))
    assert read_array_record(local) == records, name
  manifest = json.loads(emu.client().bucket(emu.BUCKET).blob(
      output[len(B) + 1:] + "/manifest.json").download_as_bytes())
  assert manifest["totals"]["records"] == sum(len(r) for r in gcs["expected"].values())
  return manifest


def test_convert_cli_round_trip_on_gcs(gcs):
  out = f"{B}/out/cli"
  manifest = _convert(out)
  assert manifest["totals"]["converted"] == len(SHARDS)
  _check_outputs(gcs, out)
  assert {s["compression"] for s in manifest["shards"]} == {"none", "gzip", "zlib"}


def test_existing_outputs_error_skip_overwrite_on_gcs(gcs):
  from converter import OutputExistsError
  out = f"{B}/out/policy"
  _convert(out)
  before = emu.list_objects(out + "/")
  with pytest.raises(OutputExistsError):  # Checked before the pipeline starts.
    _convert(out)
  with pytest.raises(Exception, match="output file\\(s\\) already exist"):  # Checked on workers.
    _run_in_pipeline(out)
  assert emu.list_objects(out + "/") == before

  dropped = f"{out}/{_out_name('train.tfrecord-00001-of-00003')}"
  emu.client().bucket(emu.BUCKET).blob(dropped[len(B) + 1:]).delete()
  manifest = _convert(out, "--skip-existing")
  after = emu.list_objects(out + "/")
  assert {s["output"]: s["status"] for s in manifest["shards"]} == {
      f"{out}/{_out_name(n)}": "converted" if f"{out}/{_out_name(n)}" == dropped else "existing"
      for n in SHARDS}
  for path, meta in before.items():
    if path not in (dropped, f"{out}/manifest.json"):
      assert after[path]["generation"] == meta["generation"], path
  _check_outputs(gcs, out)

  manifest = _convert(out, "--overwrite")
  assert manifest["totals"]["converted"] == len(SHARDS)
  final = emu.list_objects(out + "/")
  assert all(final[p]["generation"] != after[p]["generation"] for p in after)
  _check_outputs(gcs, out)


def test_skip_existing_refuses_a_foreign_object_up_front_and_names_a_damaged_one(gcs):
  from converter import OutputExistsError
  from pipelines import cli
  out = f"{B}/out/foreign"
  _convert(out)
  bucket = emu.client().bucket(emu.BUCKET)
  first = f"{out}/{_out_name(next(iter(SHARDS)))}"
  kept = bucket.blob(first[len(B) + 1:]).download_as_bytes()
  local = os.path.join(gcs["folder"], "foreign")
  with open(local, "wb") as f:
    f.write(b"the user's own notes, not an ArrayRecord file\n" * 50)
  emu.upload(local, first)
  before = emu.list_objects(out + "/")
  with pytest.raises(OutputExistsError, match=f"are not ArrayRecord files.*{first}"):
    _convert(out, "--skip-existing")  # Read up to its signature while planning, before any work.
  assert emu.list_objects(out + "/") == before

  # An ArrayRecord object cut short (its signature is there; its size no longer
  # the manifest's) is named when its digest is taken.
  with open(local, "wb") as f:
    f.write(kept[:1000])
  emu.upload(local, first)
  with pytest.raises(Exception) as info:
    _convert(out, "--skip-existing")
  line = cli.user_error_from(info.value)
  assert line is not None and "\n" not in line, info.value
  assert line.startswith(f"{first} was to be kept (--skip-existing) but cannot be read as an ArrayRecord file")
  assert "Rerun with --overwrite" in line
  _convert(out, "--overwrite")
  _check_outputs(gcs, out)


def test_corrupt_record_fails_and_leaves_no_partial_object(gcs, tf_write):
  from pipelines import cli
  data = bytearray(open(tf_write(os.path.join(gcs["folder"], "bad", "bad.tfrecord-00000-of-00001"),
                                 _records("bad", 30)), "rb").read())
  data[len(data) // 2] ^= 0xFF
  local = os.path.join(gcs["folder"], "bad", "corrupt")
  with open(local, "wb") as f:
    f.write(bytes(data))
  emu.upload(local, f"{B}/tfr/bad/bad.tfrecord-00000-of-00001")
  patterns = [f"{B}/tfr/bad/*", f"{B}/tfr/train.tfrecord-*"]
  out = f"{B}/out/corrupt"
  try:
    with pytest.raises(Exception) as info:
      _run_in_pipeline(out, patterns=patterns)
    assert "is corrupt" in cli.user_error_from(info.value)
    objects = emu.list_objects(out + "/")
    assert f"{out}/bad/{_out_name('bad.tfrecord-00000-of-00001')}" not in objects
    assert not [o for o in objects if ".tmp-" in o], objects
    assert f"{out}/manifest.json" not in objects

    _run_in_pipeline(f"{B}/out/corrupt-skip", on_corrupt="skip", patterns=patterns)
    manifest = json.loads(emu.client().bucket(emu.BUCKET).blob(
        "out/corrupt-skip/manifest.json").download_as_bytes())
    assert manifest["totals"]["corrupt_records_skipped"] == 1
    assert manifest["totals"]["converted"] == 4
  finally:
    emu.client().bucket(emu.BUCKET).blob("tfr/bad/bad.tfrecord-00000-of-00001").delete()


def test_upload_failure_leaves_no_partial_object(gcs, monkeypatch):
  from converter import writer
  out = f"{B}/out/upload-fail"

  def failing_copy(src, dst, length=0):
    dst.write(src.read(100))  # Part of the file reaches GCS, then the upload breaks.
    raise ConnectionResetError("injected: upload interrupted")

  monkeypatch.setattr(writer, "shutil", types.SimpleNamespace(copyfileobj=failing_copy))
  local_tmp = os.path.join(gcs["folder"], "local-tmp")
  os.makedirs(local_tmp, exist_ok=True)
  monkeypatch.setattr(writer.tempfile, "tempdir", local_tmp)
  with pytest.raises(Exception, match="injected: upload interrupted"):
    _run_in_pipeline(out)
  assert emu.list_objects(out + "/") == {}  # Neither the final name nor the temp object.
  assert not [f for f in os.listdir(local_tmp) if f.startswith("arrayrecord-")]


def test_rename_failure_leaves_no_partial_object(gcs, monkeypatch):
  from apache_beam.io.filesystems import FileSystems
  from converter import writer
  final = f"{B}/out/rename-fail/x.array_record"

  def failing_rename(src, dst):
    raise OSError("injected: rename failed")

  monkeypatch.setattr(FileSystems, "rename", failing_rename)
  with pytest.raises(OSError, match="injected"):
    with writer.ArrayRecordShardWriter(final, "group_size:1") as w:
      w.write(b"record")
      w.commit()
  assert emu.list_objects(f"{B}/out/rename-fail/") == {}


def test_multi_processing_direct_runner_on_gcs(gcs):
  out = f"{B}/out/multi"
  _run_in_pipeline(out, beam_flags=["--direct_running_mode=multi_processing",
                                    "--direct_num_workers=2"])
  manifest = _check_outputs(gcs, out)
  assert manifest["totals"]["converted"] == len(SHARDS)


def test_converting_in_place_on_gcs_resumes(gcs):
  """Outputs in the inputs' own folder: the same wildcard later lists them, and they are not inputs."""
  from pipelines import convert
  folder = f"{B}/inplace"
  names = ["a.tfrecord-00000-of-00002", "a.tfrecord-00001-of-00002"]
  for name in names:
    local = write_tfrecords_tf(os.path.join(gcs["folder"], "inplace", name), _records(name, 5), None)
    emu.upload(local, f"{folder}/{name}")
  args = ["--input", f"{folder}/*", "--output", folder, "--quiet", "--project", emu.PROJECT]
  assert convert.run(args)["totals"]["converted"] == 2
  emu.client().bucket(emu.BUCKET).blob(f"inplace/{_out_name(names[1])}").delete()
  manifest = convert.run(args + ["--skip-existing"])
  assert sorted((os.path.basename(s["input"]), s["status"]) for s in manifest["shards"]) == [
      (names[0], "existing"), (names[1], "converted")]
  for name in names:
    local = emu.download(f"{folder}/{_out_name(name)}", os.path.join(gcs["folder"], "dl-inplace", name))
    assert read_array_record(local) == _records(name, 5)


def test_a_double_star_pattern_on_gcs_also_matches_the_objects_at_its_top(gcs):
  # As the shell's globstar and Python's glob: `tfr/**/*` is every object under tfr/, tfr/train.* included
  # (Beam's own `**/` needs one folder at least, and listed only tfr/sub/*).
  from converter import expand_patterns
  got = expand_patterns([f"{B}/tfr/**/*"])
  assert got == sorted(f"{B}/tfr/{name}" for name in SHARDS)


@pytest.mark.parametrize("pattern", ["**/*", "**/**/*", "**/**/*.tfrecord-*", "**/sub/*", "**/**/sub/**/*", "*/**/*",
                                     "sub/**/*", "**/s?b/*", "**/su[a-c]/valid.*", "**/train.tfrecord-0000?-*"])
def test_double_star_patterns_on_gcs_match_what_they_match_in_a_local_folder(gcs, tmp_path, pattern):
  from converter import expand_patterns
  for name in SHARDS:
    os.makedirs(os.path.dirname(tmp_path / "tfr" / name), exist_ok=True)
    (tmp_path / "tfr" / name).write_bytes(b"")
  local = [os.path.relpath(p, tmp_path) for p in expand_patterns([f"{tmp_path}/tfr/{pattern}"])]
  remote = [p[len(B) + 1:] for p in expand_patterns([f"{B}/tfr/{pattern}"])]
  assert remote == local and local, (remote, local)


@pytest.mark.parametrize("pattern", ["**/sub?valid.tfrecord-*", "**/sub[/]valid.tfrecord-*"])
def test_question_marks_and_classes_on_gcs_never_match_a_slash_beside_a_double_star(gcs, pattern):
  # Beam's regex makes `?` a '.' and keeps `[/]`: both matched tfr/sub/valid.* (the shell's never do).
  from converter import expand_patterns
  from converter.errors import NoInputFilesError
  with pytest.raises(NoInputFilesError, match="No files match"):
    expand_patterns([f"{B}/tfr/{pattern}"])


def test_the_dataflow_path_converting_in_place_resumes_with_the_same_pattern(gcs):
  """arrayrecord-dataflow lists its inputs in the pipeline: MatchFiles(skip_under=output) leaves its outputs out."""
  folder = f"{B}/inplace-df"
  names = ["d.tfrecord-00000-of-00002", "d.tfrecord-00001-of-00002"]
  for name in names:
    local = write_tfrecords_tf(os.path.join(gcs["folder"], "inplace-df", name), _records(name, 4), None)
    emu.upload(local, f"{folder}/{name}")
  from converter import ConvertOptions
  import apache_beam as beam
  from pipelines import build

  def run(existing):
    options = ConvertOptions(output_dir=folder, existing=existing)
    with beam.Pipeline(options=build.pipeline_options([f"--project={emu.PROJECT}"])) as p:
      build.add_conversion(p, options, patterns=[f"{folder}/*"])

  run("error")
  emu.client().bucket(emu.BUCKET).blob(f"inplace-df/{_out_name(names[1])}").delete()
  run("skip")  # The same pattern now also lists the first run's outputs; they are not inputs.
  manifest = json.loads(emu.client().bucket(emu.BUCKET).blob("inplace-df/manifest.json").download_as_bytes())
  assert sorted((os.path.basename(s["input"]), s["status"]) for s in manifest["shards"]) == [
      (names[0], "existing"), (names[1], "converted")]
  for name in names:
    local = emu.download(f"{folder}/{_out_name(name)}", os.path.join(gcs["folder"], "dl-inplace-df", name))
    assert read_array_record(local) == _records(name, 4)
