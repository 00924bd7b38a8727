"""Round 19 of the fault audit (conversion side): gs:// buckets that do not exist or vanish mid-run, and
Dataflow flags that end in a line break.

Found by the 2026-12-05 fault audit; each case ran against the real CLI or builder before the fix:
`arrayrecord-convert --output gs://no-such-bucket/out` converted every shard and then failed with
"InvalidResponse: ('Request failed with status code', 404, 'Expected one of', <HTTPStatus.OK: 200>, ...)",
naming neither the bucket nor what to do; `--input 'gs://no-such-bucket/tfr/*'` failed with Beam's doubly
nested "BeamIOError: Match operation failed with exceptions {... NotFound('GET http://...')}"; a bucket
deleted while a shard was being uploaded gave the same bare 404; a 503 during an upload was reported as
"ServiceUnavailable: 503 ... (the storage server could not be reached; ...)" without naming the output; and `--project`, `--region`, `--job_name`,
`--machine_type`, `--labels`, `--service_account_email` and every gs:// flag accepted a value with a trailing
line break (Python's `$` matches before one), e.g. `--project $'my-project\\n'` from a pasted or YAML-block
value, which went into the job request.

Checked and already handled in this round (no test added, each ran for real): a data-CRC mismatch in the
last record, a last record whose length runs past the file's end, a damaged length CRC in the last record,
trailing garbage or zeros after the last record, a gzip input with a second member, with trailing zeros, or
with a cut second member, a .gz name on an uncompressed file and gzip data without one (auto, and a forced
--compression gzip), each with --on-corrupt fail and skip (file, record and byte offset named; with
--workers 2 the failed shard left nothing under its name); an input given twice (a file and a glob over it);
an output folder inside the input glob, rerun with `**` and --skip-existing; --skip-existing after kill -9
(marker, a finished shard, a temp file) with another --writer-options / --compression / --on-corrupt; TMPDIR
on tmpfs with the output on ext4; a 255-byte input name whose output name is 259 bytes (refused) and one
whose output name is 255 bytes (converted, temp name shortened); an input name holding a line break (shown
escaped); arrayrecord-verify against an output with two records swapped, one with a record's bytes changed
(count equal), and a manifest whose digest, record count or totals were edited (each a FAIL naming the file
and first differing record).

Not changed: one file given under two names through a link (a linked folder, a link beside its target, a
hard link) is converted twice, into two outputs. Refusing it was tried and dropped: content-addressed stores
(the Hugging Face cache, DVC, git-annex) link identical shards to one blob, and
test_faults_convert_process relies on a linked input converted beside its target.
"""

from __future__ import annotations

import os

import pytest

import faults_testing as ft
import gcs_emulator as emu
from converter import writer
from converter.errors import OutputWriteError
from dataflow import checks, flags

CONVERT = "pipelines.convert"
B = f"gs://{emu.BUCKET}"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator, one bucket with one TFRecord shard at gs://test-bucket/tfr/x.tfrecord."""
  folder = str(tmp_path_factory.mktemp("round19-gcs"))
  server = emu.Emulator(folder).start()
  with pytest.MonkeyPatch.context() as mp:
    for key, value in emu.emulator_env(server.host, folder).items():
      mp.setenv(key, value)
    try:
      emu.client().create_bucket(emu.BUCKET)
      local = ft.write_tfrecords(os.path.join(folder, "tfr", "x.tfrecord"), [bytes([i]) * 100 for i in range(5)])
      emu.upload(local, f"{B}/tfr/x.tfrecord")
      yield folder
    finally:
      server.stop()


def test_an_output_bucket_that_does_not_exist_is_named_before_any_work(gcs):
  r = ft.run_cli(CONVERT, "--input", f"{B}/tfr/*", "--output", "gs://no-such-bucket-r19/out", "--quiet",
                 "--workers", "1", "--project", emu.PROJECT, timeout=120)
  line = ft.one_line(r.stderr)
  assert r.returncode == 2, r.stderr
  assert "bucket gs://no-such-bucket-r19 does not exist" in line
  assert "Nothing was converted" in line and "gcloud storage buckets create gs://no-such-bucket-r19" in line
  assert "InvalidResponse" not in r.stderr and "Traceback" not in r.stderr
  assert set(emu.list_objects(f"{B}/")) == {f"{B}/tfr/x.tfrecord"}  # Nothing written anywhere.


def test_an_input_bucket_that_does_not_exist_is_named(gcs):
  r = ft.run_cli(CONVERT, "--input", "gs://no-such-bucket-r19/tfr/*", "--output", f"{B}/out-r19-in",
                 "--quiet", "--workers", "1", "--project", emu.PROJECT, timeout=120)
  line = ft.one_line(r.stderr)
  assert r.returncode == 2, r.stderr
  assert "'gs://no-such-bucket-r19/tfr/*'" in line and "bucket gs://no-such-bucket-r19 does not exist" in line
  assert "BeamIOError" not in r.stderr and "NotFound" not in r.stderr
  assert emu.list_objects(f"{B}/out-r19-in/") == {}


def test_a_bucket_deleted_during_the_upload_is_named_and_leaves_no_temp(gcs, tmp_path, monkeypatch):
  local_tmp = tmp_path / "local-tmp"
  local_tmp.mkdir()
  monkeypatch.setattr(writer.tempfile, "tempdir", str(local_tmp))
  emu.client().create_bucket("gone-bucket-r19")
  final = "gs://gone-bucket-r19/out/x.array_record"
  with pytest.raises(OutputWriteError) as e:
    with writer.ArrayRecordShardWriter(final, "group_size:1") as w:
      w.write(b"record")
      emu.client().bucket("gone-bucket-r19").delete(force=True)
      w.commit()
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"Cannot write {final}: its bucket gs://gone-bucket-r19 does not exist any more")
  assert "gcloud storage buckets create gs://gone-bucket-r19" in message
  assert os.listdir(local_tmp) == []


GOOD = ["--input", "gs://my-bucket/tfr/train-*", "--output", "gs://my-bucket/ar/", "--project", "my-project",
        "--region", "us-central1", "--temp_location", "gs://my-bucket/tmp"]


@pytest.mark.parametrize("flag,value", [
    ("--project", "my-project\n"), ("--region", "us-central1\n"), ("--temp_location", "gs://my-bucket/tmp\n"),
    ("--temp_location", "gs://my-bucket\n/tmp"), ("--output", "gs://my-bucket/ar\n"),
    ("--input", "gs://my-bucket/tfr/train-*\n"), ("--job_name", "my-job\n"), ("--machine_type", "n2-standard-4\n"),
    ("--labels", "team=ml\n"), ("--service_account_email", "w@my-project.iam.gserviceaccount.com\n"),
    ("--worker_zone", "us-central1-b\n"), ("--worker_region", "us-central1\n")])
def test_a_dataflow_flag_ending_in_a_line_break_is_refused_offline(flag, value):
  argv = list(GOOD)
  if flag in argv:
    argv[argv.index(flag) + 1] = value
  else:
    argv += [flag, value]
  error = ft.in_time(lambda: flags.parse(argv), 10)
  assert isinstance(error, checks.FlagError), error
  assert repr(value) in str(error) and "\n" not in str(error).replace(repr(value), "")


def test_the_same_flags_without_the_line_break_still_parse():
  request = flags.parse(GOOD + ["--job_name", "my-job", "--machine_type", "n2-standard-4", "--labels", "team=ml",
                                "--service_account_email", "w@my-project.iam.gserviceaccount.com",
                                "--worker_zone", "us-central1-b"])
  assert request.job_name == "my-job"


def test_a_server_error_during_an_upload_names_the_output_in_one_line(gcs, tmp_path, monkeypatch, capsys):
  from google.api_core import exceptions as gexc
  from pipelines import convert

  def failing_copy(src, dst, length=0):
    dst.write(src.read(100))  # Part of the file reaches GCS, then the server gives up.
    raise gexc.ServiceUnavailable("POST http://storage/upload: Backend Error\nretry later")

  local_tmp = tmp_path / "local-tmp"
  local_tmp.mkdir()
  monkeypatch.setattr(writer, "shutil", type("S", (), {"copyfileobj": staticmethod(failing_copy)}))
  monkeypatch.setattr(writer.tempfile, "tempdir", str(local_tmp))
  out = f"{B}/out-r19-503"
  code = convert.main(["--input", f"{B}/tfr/*", "--output", out, "--quiet", "--workers", "1",
                       "--project", emu.PROJECT])
  line = ft.one_line(capsys.readouterr().err)
  assert code == 1
  assert line.startswith(f"arrayrecord-convert: error: Cannot write {out}/x.array_record: the upload failed "
                         "(ServiceUnavailable: 503 POST http://storage/upload: Backend Error)")
  assert "no partial file was left under its name" in line and "--skip-existing" in line
  assert f"{out}/x.array_record" not in emu.list_objects(out + "/")
  assert not [n for n in emu.list_objects(out + "/") if ".tmp-" in n]
  assert os.listdir(local_tmp) == []
