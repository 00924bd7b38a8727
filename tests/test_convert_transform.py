"""ConvertToArrayRecord in a real Beam pipeline (DirectRunner)."""

from __future__ import annotations

import json
import os

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from converter import ConvertToArrayRecord, MatchFiles, RecordDigest, read_manifest


def records_for(name: str, n: int) -> list[bytes]:
  return [f"{name}/{i}|".encode() * (1 + i % 5) for i in range(n)]


def offsets(records: list[bytes]) -> list[int]:
  out = [0]
  for r in records:
    out.append(out[-1] + 12 + len(r) + 4)
  return out


def flip(path: str, offset: int) -> None:
  with open(path, "rb") as f:
    data = bytearray(f.read())
  data[offset] ^= 0xFF
  with open(path, "wb") as f:
    f.write(bytes(data))


def run_convert(files: list[str], output_dir: str, **kwargs):
  """Runs the transform over `files`; returns (result dicts, PipelineResult)."""
  with beam.Pipeline(options=PipelineOptions([])) as p:
    results = (p | "Files" >> beam.Create(sorted(files))
               | "Convert" >> ConvertToArrayRecord(output_dir, **kwargs))
    _ = (results | beam.combiners.ToList()
         | beam.Map(_save, output_dir + ".results.json"))
  with open(output_dir + ".results.json") as f:
    return json.load(f), p.result


def _save(results, path):
  with open(path, "w") as f:
    json.dump(results, f)


def counter(result, name: str) -> int:
  found = result.metrics().query(MetricsFilter().with_name(name))["counters"]
  return sum(c.committed for c in found)


def all_files(root) -> list[str]:
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, fs in os.walk(root) for f in fs)


def test_one_to_one_names_order_and_manifest(tmp_path, tf_write, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  layout = {  # input (relative) -> (expected output, TF compression)
      "mnist-train.tfrecord-00003-of-00016": ("mnist-train.array_record-00003-of-00016", None),
      "mnist-train.tfrecord-00004-of-00016": ("mnist-train.array_record-00004-of-00016", None),
      "part-00001-of-00004.tfrecord.gz": ("part-00001-of-00004.array_record", "GZIP"),
      "x.tfrecords": ("x.array_record", None),
      "y.tfrec": ("y.array_record", "ZLIB"),
      "noext": ("noext.array_record", None),
      "train/same.tfrecord": ("train/same.array_record", None),
      "test/same.tfrecord": ("test/same.array_record", "GZIP"),
      "deep/er/z.tfrecord-00000-of-00001": ("deep/er/z.array_record-00000-of-00001", None),
  }
  written = {}
  for i, (rel, (_, comp)) in enumerate(sorted(layout.items())):
    recs = records_for(rel, 20 + 7 * i) + [b""]
    written[rel] = recs
    tf_write(str(inp / rel), recs, comp)
  results, result = run_convert([str(inp / r) for r in layout], str(out))

  assert all_files(out) == sorted([o for o, _ in layout.values()] + ["manifest.json"])
  for rel, (orel, _) in layout.items():
    assert ar_read(str(out / orel)) == written[rel], rel  # Same records, same order.

  manifest = read_manifest(str(out))
  # On disk, outputs are stored relative to the output directory (a copied
  # dataset names its own files); inputs elsewhere stay absolute.
  stored = json.loads((out / "manifest.json").read_text())
  assert sorted(s["output"] for s in stored["shards"]) == sorted(o for o, _ in layout.values())
  assert {s["input"] for s in stored["shards"]} == {s["input"] for s in manifest["shards"]}
  by_input = {os.path.relpath(s["input"], inp): s for s in manifest["shards"]}
  assert set(by_input) == set(layout)
  for rel, (orel, comp) in layout.items():
    s = by_input[rel]
    digest = RecordDigest()
    digest.update_many(written[rel])
    assert s["output"] == str(out / orel)
    assert s["status"] == "converted"
    assert s["records"] == len(written[rel])
    assert s["digest"] == digest.hexdigest()
    assert s["bytes_in"] == os.path.getsize(inp / rel)
    assert s["bytes_out"] == os.path.getsize(out / orel)
    assert s["record_bytes"] == sum(map(len, written[rel]))
    assert s["compression"] == {None: "none", "GZIP": "gzip", "ZLIB": "zlib"}[comp]
    assert s["corrupt_records_skipped"] == 0
  t = manifest["totals"]
  assert t["shards"] == t["converted"] == len(layout)
  assert t["records"] == sum(map(len, written.values()))
  assert t["bytes_in"] == sum(s["bytes_in"] for s in manifest["shards"])
  assert manifest["writer_options"] == "group_size:1"
  assert sorted(r["output"] for r in results) == sorted(s["output"] for s in manifest["shards"])
  assert counter(result, "records") == t["records"]
  assert counter(result, "files") == len(layout)


def test_empty_input_gives_empty_valid_output(tmp_path, tf_write, ar_read):
  src = tf_write(str(tmp_path / "in" / "empty.tfrecord"), [])
  gz = tf_write(str(tmp_path / "in" / "empty2.tfrecord.gz"), [], "GZIP")
  assert os.path.getsize(src) == 0
  run_convert([src, gz], str(tmp_path / "out"))
  from array_record.python.array_record_module import ArrayRecordReader
  for name in ("empty.array_record", "empty2.array_record"):
    reader = ArrayRecordReader(str(tmp_path / "out" / name))
    assert reader.num_records() == 0
    reader.close()
    assert ar_read(str(tmp_path / "out" / name)) == []
  shards = read_manifest(str(tmp_path / "out"))["shards"]
  assert [s["records"] for s in shards] == [0, 0]
  assert all(s["digest"] == RecordDigest().hexdigest() for s in shards)


def test_large_and_zero_byte_records(tmp_path, tf_write, ar_read):
  recs = [b"", os.urandom(5 * 1024 * 1024), b"", b"tail"]
  src = tf_write(str(tmp_path / "in" / "big.tfrecord.gz"), recs, "GZIP")
  run_convert([src], str(tmp_path / "out"), writer_options="group_size:1,zstd:1")
  assert ar_read(str(tmp_path / "out" / "big.array_record")) == recs
  assert read_manifest(str(tmp_path / "out"))["writer_options"] == "group_size:1,zstd:1"


def _three_inputs(tmp_path, tf_write):
  inp = tmp_path / "in"
  recs = {n: records_for(n, 10) for n in ("a", "b", "c")}
  paths = {n: tf_write(str(inp / f"{n}.tfrecord"), r) for n, r in recs.items()}
  return recs, paths


def test_corrupt_record_fail(tmp_path, tf_write):
  recs, paths = _three_inputs(tmp_path, tf_write)
  off = offsets(recs["b"])
  flip(paths["b"], off[3] + 12 + 2)
  out = tmp_path / "out"
  with pytest.raises(Exception) as e:
    run_convert(list(paths.values()), str(out))
  msg = str(e.value)
  assert paths["b"] in msg and "record 3" in msg and f"byte offset {off[3]}" in msg
  assert "on_corrupt='skip'" in msg
  # Nothing under the final name, and no temp file left behind.
  assert not (out / "b.array_record").exists()
  assert not any(".tmp-" in f for f in all_files(tmp_path))


def test_corrupt_record_skip(tmp_path, tf_write, ar_read):
  recs, paths = _three_inputs(tmp_path, tf_write)
  flip(paths["b"], offsets(recs["b"])[3] + 12 + 2)
  out = tmp_path / "out"
  results, result = run_convert(list(paths.values()), str(out), on_corrupt="skip")
  assert ar_read(str(out / "b.array_record")) == recs["b"][:3] + recs["b"][4:]
  assert ar_read(str(out / "a.array_record")) == recs["a"]
  manifest = read_manifest(str(out))
  by_name = {os.path.basename(s["input"]): s for s in manifest["shards"]}
  assert by_name["b.tfrecord"]["corrupt_records_skipped"] == 1
  assert by_name["b.tfrecord"]["records"] == 9
  digest = RecordDigest()
  digest.update_many(recs["b"][:3] + recs["b"][4:])
  assert by_name["b.tfrecord"]["digest"] == digest.hexdigest()
  assert by_name["a.tfrecord"]["corrupt_records_skipped"] == 0
  assert manifest["totals"]["corrupt_records_skipped"] == 1
  assert counter(result, "corrupt_records_skipped") == 1
  assert len(results) == 3


def test_damaged_header_resyncs_with_skip(tmp_path, tf_write, ar_read):
  recs, paths = _three_inputs(tmp_path, tf_write)
  flip(paths["c"], offsets(recs["c"])[5] + 2)
  out = tmp_path / "out"
  run_convert(list(paths.values()), str(out), on_corrupt="skip")
  assert ar_read(str(out / "c.array_record")) == recs["c"][:5] + recs["c"][6:]
  assert read_manifest(str(out))["totals"]["corrupt_records_skipped"] == 1


def test_unrecoverable_file_is_reported_failed(tmp_path, tf_write, ar_read):
  recs, paths = _three_inputs(tmp_path, tf_write)
  flip(paths["b"], offsets(recs["b"])[9] + 2)  # Last header: nothing valid follows.
  out = tmp_path / "out"
  results, result = run_convert(list(paths.values()), str(out), on_corrupt="skip")
  assert not (out / "b.array_record").exists()
  assert ar_read(str(out / "a.array_record")) == recs["a"]
  assert ar_read(str(out / "c.array_record")) == recs["c"]
  manifest = read_manifest(str(out))
  failed = [s for s in manifest["shards"] if s["status"] == "failed"]
  assert [os.path.basename(s["input"]) for s in failed] == ["b.tfrecord"]
  assert "no valid record follows" in failed[0]["error"]
  assert manifest["totals"]["failed"] == 1 and manifest["totals"]["converted"] == 2
  assert manifest["totals"]["records"] == 20  # Failed shards do not count.
  assert counter(result, "files_failed") == 1
  assert not any(".tmp-" in f for f in all_files(tmp_path))


@pytest.mark.parametrize("comp", [None, "GZIP"])
def test_truncated_input(tmp_path, tf_write, ar_read, comp):
  recs = records_for("t", 400)
  src = tf_write(str(tmp_path / "in" / "t.tfrecord"), recs, comp)
  with open(src, "rb") as f:
    data = f.read()
  with open(src, "wb") as f:
    f.write(data[:-9])  # Inside the last record (plain) or the gzip trailer.
  out = tmp_path / "out"
  with pytest.raises(Exception, match="truncated"):
    run_convert([src], str(out))
  assert not (out / "t.array_record").exists()
  run_convert([src], str(out), on_corrupt="skip")
  got = ar_read(str(out / "t.array_record"))
  assert got == recs[:len(got)] and len(got) >= len(recs) - 1
  shard = read_manifest(str(out))["shards"][0]
  assert shard["status"] == "converted" and shard["input_truncated"]
  assert shard["records"] == len(got)


def test_existing_error_inside_pipeline(tmp_path, tf_write):
  _, paths = _three_inputs(tmp_path, tf_write)
  out = tmp_path / "out"
  run_convert(list(paths.values()), str(out))
  mtimes = {f: os.stat(out / f).st_mtime_ns for f in all_files(out)}
  with pytest.raises(Exception) as e:
    run_convert(list(paths.values()), str(out))
  msg = str(e.value)  # Raised on a worker; the paths must survive Beam's re-raise.
  assert msg.startswith("3 output file(s) already exist: ")
  assert str(out / "a.array_record") in msg and "--overwrite" in msg
  assert {f: os.stat(out / f).st_mtime_ns for f in all_files(out)} == mtimes


def test_invalid_options_fail_at_construction(tmp_path):
  with pytest.raises(ValueError) as e:
    ConvertToArrayRecord(str(tmp_path), writer_options="group_size:1,bogus:3")
  assert "bogus" in str(e.value) and "group_size" in str(e.value) and "zstd" in str(e.value)
  with pytest.raises(ValueError, match="Valid keys"):
    ConvertToArrayRecord(str(tmp_path), writer_options="group_size:zero")
  with pytest.raises(ValueError, match="on_corrupt"):
    ConvertToArrayRecord(str(tmp_path), on_corrupt="ignore")
  with pytest.raises(ValueError, match="existing"):
    ConvertToArrayRecord(str(tmp_path), existing="replace")
  with pytest.raises(ValueError, match="compression"):
    ConvertToArrayRecord(str(tmp_path), compression="bz2")
  assert os.listdir(tmp_path) == []


def test_match_files_and_display_data(tmp_path, tf_write, ar_read):
  inp = tmp_path / "in"
  tf_write(str(inp / "d.tfrecord-00000-of-00002"), [b"0"])
  tf_write(str(inp / "d.tfrecord-00001-of-00002"), [b"1", b"2"])
  out = tmp_path / "out"
  transform = ConvertToArrayRecord(str(out), existing="overwrite")
  assert transform.display_data()["output_dir"] == str(out)
  assert transform.options.existing == "overwrite"
  with beam.Pipeline(options=PipelineOptions([])) as p:
    _ = p | MatchFiles(str(inp / "d.tfrecord-*")) | transform
  assert ar_read(str(out / "d.array_record-00001-of-00002")) == [b"1", b"2"]
  assert ar_read(str(out / "d.array_record-00000-of-00002")) == [b"0"]


def test_match_files_no_match_names_pattern(tmp_path):
  pattern = str(tmp_path / "nothing-*.tfrecord")
  with pytest.raises(Exception) as e:
    with beam.Pipeline(options=PipelineOptions([])) as p:
      _ = p | MatchFiles(pattern) | ConvertToArrayRecord(str(tmp_path / "out"))
  assert pattern in str(e.value)
  assert str(e.value).count("No files match") == 1
  assert not (tmp_path / "out").exists()
