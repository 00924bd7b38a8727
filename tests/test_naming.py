"""Output naming: 1:1 shard names, folder layout, parse/format, collisions."""

from __future__ import annotations

import os

import pytest

from converter import ConversionError, ConvertOptions, ShardName, plan_shards
from converter.naming import common_dir, output_basename, output_path

# (input basename, expected output basename)
MAPPINGS = [
    ("mnist-train.tfrecord-00003-of-00016", "mnist-train.array_record-00003-of-00016"),
    ("part-00001-of-00004.tfrecord.gz", "part-00001-of-00004.array_record"),
    ("part-00001-of-00004.tfrecord.GZ", "part-00001-of-00004.array_record"),
    ("train.tfrecords", "train.array_record"),
    ("train.tfrecords-00000-of-00002.gz", "train.array_record-00000-of-00002"),
    ("val.tfrec", "val.array_record"),
    ("val.tfrec.zlib", "val.array_record"),
    ("x.tfrecord_1", "x.array_record_1"),
    ("data.bin", "data.bin.array_record"),
    ("part-r-00000", "part-r-00000.array_record"),
    ("noext", "noext.array_record"),
    ("x.tfrecordx", "x.tfrecordx.array_record"),
]


@pytest.mark.parametrize("name, expected", MAPPINGS)
def test_output_basename(name, expected):
  assert output_basename(name) == expected


def test_output_basename_custom_suffix():
  assert output_basename("a.tfrecord-00000-of-00001", "arrayrecord") == (
      "a.arrayrecord-00000-of-00001")
  assert output_basename("blob", "ar") == "blob.ar"


@pytest.mark.parametrize("suffix", ["", ".array_record", "a/b"])
def test_output_basename_rejects_bad_suffix(suffix):
  with pytest.raises(ValueError, match="bare extension"):
    output_basename("a.tfrecord", suffix)


@pytest.mark.parametrize("name", [n for n, _ in MAPPINGS] + [
    "mnist-test.array_record-00000-of-00001", "t.tfrecord.tfrecord", "a.tfrecord.deflate",
    "plain.gzip", "x-00002-of-00010"])
def test_shard_name_parse_format_round_trip(name):
  parsed = ShardName.parse(name)
  assert parsed.format_name() == name
  assert ShardName.parse(parsed.format_name()) == parsed


def test_shard_name_parts():
  s = ShardName.parse("mnist-train.tfrecord-00003-of-00016.gz")
  assert s == ShardName(prefix="mnist-train", format="tfrecord", rest="-00003-of-00016",
                        compression="gz")
  assert s.shard == (3, 16)
  out = s.with_format("array_record")
  assert out == ShardName(prefix="mnist-train", format="array_record", rest="-00003-of-00016")
  assert out.format_name() == "mnist-train.array_record-00003-of-00016"
  assert out.shard == (3, 16)
  # `.tfrecords` is one token, not `.tfrecord` + `s`.
  assert ShardName.parse("a.tfrecords").format == "tfrecords"
  # A shard number in the prefix (no format token) is still found.
  assert ShardName.parse("part-00001-of-00004.tfrecord").shard == (1, 4)
  assert ShardName.parse("plain").shard is None


def test_shard_name_built_by_hand_formats_and_parses():
  s = ShardName(prefix="ds-train", format="tfrecord", rest="-00007-of-00100")
  assert s.format_name() == "ds-train.tfrecord-00007-of-00100"
  assert ShardName.parse(s.format_name()) == s


def test_shard_name_parse_rejects_directories():
  with pytest.raises(ValueError, match="basename"):
    ShardName.parse("dir/a.tfrecord")


def test_output_path_keeps_relative_layout():
  assert output_path("/in/a/b/x.tfrecord", "/in", "/out") == "/out/a/b/x.array_record"
  assert output_path("/in/x.tfrecord", "/in", "/out/") == "/out/x.array_record"
  assert output_path("gs://bkt/in/s/x.tfrecord-00000-of-00001", "gs://bkt/in", "gs://o/p") == (
      "gs://o/p/s/x.array_record-00000-of-00001")
  # Same basename in two folders: two outputs.
  a = output_path("/in/train/part.tfrecord", "/in", "/out")
  b = output_path("/in/test/part.tfrecord", "/in", "/out")
  assert a == "/out/train/part.array_record"
  assert b == "/out/test/part.array_record"


def test_output_path_relative_inputs():
  # Inputs in the working directory have no directory part at all.
  assert output_path("x.tfrecord", "", "out") == "out/x.array_record"
  assert output_path("sub/y.tfrecord", "", "out") == "out/sub/y.array_record"
  assert output_path("./sub/y.tfrecord", "sub", "out") == "out/y.array_record"
  assert output_path("/x.tfrecord", "/", "/o") == "/o/x.array_record"


def test_output_path_rejects_input_outside_root():
  with pytest.raises(ValueError, match="not under the input root"):
    output_path("/elsewhere/x.tfrecord", "/in", "/out")
  with pytest.raises(ValueError, match="not under the input root"):
    output_path("gs://b/x.tfrecord", "/in", "/out")


def test_common_dir():
  assert common_dir(["/a/b/c/x", "/a/b/d/y", "/a/b/z"]) == "/a/b"
  assert common_dir(["/a/b/x"]) == "/a/b"
  assert common_dir(["/x", "/y"]) == "/"
  assert common_dir(["gs://b/x/y", "gs://b/x/z/w"]) == "gs://b/x"
  assert common_dir(["/a/bc/x", "/a/b/y"]) == "/a"  # Whole components only.
  with pytest.raises(ValueError, match="mix storage systems"):
    common_dir(["/a/x", "gs://b/y"])
  with pytest.raises(ValueError):
    common_dir([])


def test_plan_keeps_nested_layout_without_collisions(tmp_path):
  inputs = [str(tmp_path / "in" / p) for p in (
      "train/data.tfrecord-00000-of-00002", "train/data.tfrecord-00001-of-00002",
      "test/data.tfrecord-00000-of-00002", "deep/er/data.tfrecord-00000-of-00002")]
  plans = plan_shards(inputs, ConvertOptions(output_dir=str(tmp_path / "out")))
  got = {os.path.relpath(p.input, tmp_path / "in"): os.path.relpath(p.output, tmp_path / "out")
         for p in plans}
  assert got == {
      "train/data.tfrecord-00000-of-00002": "train/data.array_record-00000-of-00002",
      "train/data.tfrecord-00001-of-00002": "train/data.array_record-00001-of-00002",
      "test/data.tfrecord-00000-of-00002": "test/data.array_record-00000-of-00002",
      "deep/er/data.tfrecord-00000-of-00002": "deep/er/data.array_record-00000-of-00002",
  }
  assert all(p.action == "convert" for p in plans)


def test_plan_input_root_option(tmp_path):
  inp = str(tmp_path / "in" / "a" / "x.tfrecord")
  plans = plan_shards([inp], ConvertOptions(output_dir=str(tmp_path / "out"),
                                            input_root=str(tmp_path / "in")))
  assert plans[0].output == str(tmp_path / "out" / "a" / "x.array_record")


@pytest.mark.parametrize("names", [
    ("a.tfrecord", "a.tfrecord.gz"),
    ("a.tfrecord", "a.tfrecords"),
    ("a.tfrec", "a.tfrecord.zlib"),
])
def test_plan_detects_collisions(tmp_path, names):
  inputs = [str(tmp_path / n) for n in names]
  with pytest.raises(ConversionError) as e:
    plan_shards(inputs, ConvertOptions(output_dir=str(tmp_path / "out")))
  msg = str(e.value)
  for n in names:
    assert n in msg
  assert "a.array_record" in msg and "Rename" in msg
  assert not (tmp_path / "out").exists()


def test_plan_refuses_to_overwrite_an_input(tmp_path):
  # An input that already has the output's name would be replaced by its twin.
  inputs = [str(tmp_path / "x.tfrecord"), str(tmp_path / "x.array_record")]
  with pytest.raises(ConversionError, match="overwrite the input"):
    plan_shards(inputs, ConvertOptions(output_dir=str(tmp_path)))
