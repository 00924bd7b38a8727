"""TFDS folder layout (loader.tfds) and conversion plans, on hand-written dataset_info.json."""

from __future__ import annotations

import json
import os

import pytest

from converter import ConversionError
from loader import tfds as layout
from pipelines import tfds_convert


def _write_info(directory, splits, name="toy", **extra):
  os.makedirs(directory, exist_ok=True)
  info = {"name": name, "version": "1.0.0", "fileFormat": "tfrecord", **extra,
          "splits": [{"name": s, "shardLengths": [str(n) for n in lengths], **tmpl}
                     for s, lengths, tmpl in splits]}
  with open(os.path.join(directory, "dataset_info.json"), "w") as f:
    json.dump(info, f)
  return info


def test_shard_names_follow_tfds_naming():
  naming = pytest.importorskip("tensorflow_datasets.core.naming")
  for n, template in ((3, layout.DEFAULT_FILEPATH_TEMPLATE),
                      (123456, layout.DEFAULT_FILEPATH_TEMPLATE),
                      (2, "{SPLIT}/{DATASET}-{SHARD_INDEX}-{NUM_SHARDS}.{FILEFORMAT}")):
    info = {"name": "ds", "splits": [{"name": "train", "shardLengths": ["1"] * n,
                                      "filepathTemplate": template}]}
    ours = layout.shard_relpaths(info, "train", "array_record")
    tfds_template = naming.ShardedFileTemplate(
        data_dir="/d", template=template, dataset_name="ds", split="train",
        filetype_suffix="array_record")
    assert ours[-1] == tfds_template.relative_filepath(shard_index=n - 1, num_shards=n)
    assert ours[0] == tfds_template.relative_filepath(shard_index=0, num_shards=n)
    assert len(ours) == n


def test_split_lists_and_errors(tmp_path):
  d = str(tmp_path / "toy" / "1.0.0")
  _write_info(d, [("train", [2, 3], {}), ("test", [1], {})], alternativeFileFormats=["array_record"])
  for name in ("toy-train.array_record-00000-of-00002", "toy-train.array_record-00001-of-00002",
               "toy-test.array_record-00000-of-00001"):
    open(os.path.join(d, name), "wb").close()
  assert [os.path.basename(p) for p in layout.tfds_array_record_files(d, "test+train")] == [
      "toy-test.array_record-00000-of-00001", "toy-train.array_record-00000-of-00002",
      "toy-train.array_record-00001-of-00002"]
  with pytest.raises(ValueError, match=r"Split 'dev' .* available splits: \['train', 'test'\]"):
    layout.tfds_array_record_files(d, "dev")
  with pytest.raises(ValueError, match="selects records, not files"):
    layout.tfds_array_record_files(d, "train[:50%]")
  os.remove(os.path.join(d, "toy-test.array_record-00000-of-00001"))
  with pytest.raises(FileNotFoundError, match="--skip-existing"):
    layout.tfds_array_record_files(d, "test")


def test_a_split_without_shards_is_named(tmp_path):
  d = str(tmp_path / "toy" / "1.0.0")
  _write_info(d, [("train", [2], {}), ("empty", [], {})], alternativeFileFormats=["array_record"])
  open(os.path.join(d, "toy-train.array_record-00000-of-00001"), "wb").close()
  with pytest.raises(ValueError, match=r"Split 'empty' of .*toy/1.0.0 has no shards \(dataset_info.json lists none\)"):
    layout.tfds_array_record_files(d, "empty")
  assert len(layout.tfds_array_record_files(d, "train+empty")) == 1


def test_not_a_dataset_dir(tmp_path):
  d = tmp_path / "toy" / "1.0.0"
  _write_info(str(d), [("train", [1], {})])
  with pytest.raises(layout.NotATfdsDatasetError, match=r"Dataset versions found below it: \[.*1\.0\.0'\]"):
    layout.read_dataset_info(tmp_path)
  with pytest.raises(layout.NotATfdsDatasetError, match="does not exist"):
    layout.read_dataset_info(tmp_path / "missing")
  with pytest.raises(ValueError, match=r"no ArrayRecord files \(its file formats: \['tfrecord'\]\)"):
    layout.tfds_array_record_files(str(d), "train")
  (d / "dataset_info.json").write_text("{not json")
  with pytest.raises(layout.NotATfdsDatasetError, match="not valid JSON"):
    layout.read_dataset_info(d)


def test_a_missing_or_damaged_features_json_is_named(tmp_path):
  d = tmp_path / "toy" / "1.0.0"
  _write_info(str(d), [("train", [1], {})])
  with pytest.raises(layout.NotATfdsDatasetError, match=r"features.json does not exist: decoding records needs"):
    layout.tfds_feature_decoder(str(d))
  (d / "features.json").write_text('{"pythonClassName": "tensorflow_datasets.core.features.fea')
  with pytest.raises(layout.NotATfdsDatasetError, match=r"features.json is not valid JSON \(.*cut short\?\)"):
    layout.tfds_feature_decoder(str(d))


def test_unknown_template_variable_lists_valid_ones():
  info = {"name": "ds", "splits": [{"name": "a", "shardLengths": ["1"],
                                    "filepathTemplate": "{DATASET}.{FORMAT}-{SHARD_INDEX}"}]}
  with pytest.raises(ValueError, match=r"Unknown variable \{FORMAT\}.*\{FILEFORMAT\}"):
    layout.shard_relpaths(info, "a", "tfrecord")


def test_plan_maps_subfolder_templates_and_lists_metadata(tmp_path):
  d = str(tmp_path / "src")
  _write_info(d, [("train", [4, 4], {"filepathTemplate": "{SPLIT}/{DATASET}-{SHARD_X_OF_Y}.{FILEFORMAT}"}),
                  ("test", [3], {})])
  for name in ("features.json", "label.labels.txt", "manifest.json", ".hidden.tmp-1",
               "toy-test.tfrecord-00000-of-00001", "toy-test.array_record-00000-of-00001"):
    open(os.path.join(d, name), "w").close()
  plan = tfds_convert.plan_tfds(d, str(tmp_path / "out"))
  assert not plan.in_place
  assert plan.metadata_files == ("features.json", "label.labels.txt")
  assert [os.path.relpath(p, tmp_path) for p in plan.splits[0].outputs] == [
      "out/train/toy-00000-of-00002.array_record", "out/train/toy-00001-of-00002.array_record"]
  options = tfds_convert.tfds_convert_options(plan)  # The converter's names agree.
  assert options.input_root == d and options.output_dir == plan.out_dir
  assert tfds_convert.plan_tfds(d).in_place and tfds_convert.plan_tfds(d, d + "/").in_place


def test_plan_rejects_what_it_cannot_convert(tmp_path):
  d = str(tmp_path / "a")
  _write_info(d, [("train", [1], {"filepathTemplate": "{FILEFORMAT}/{SPLIT}-{SHARD_X_OF_Y}"})])
  plan = tfds_convert.plan_tfds(d, str(tmp_path / "out"))
  with pytest.raises(ConversionError, match="put {FILEFORMAT} in the file name"):
    tfds_convert.tfds_convert_options(plan)
  d = str(tmp_path / "b")
  _write_info(d, [("train", [1], {})], fileFormat="parquet")
  with pytest.raises(ValueError, match=r"stored as \['parquet'\]; .* stored as 'tfrecord'"):
    tfds_convert.plan_tfds(d, str(tmp_path / "out"))
  d = str(tmp_path / "c")
  _write_info(d, [("train", [1], {})], fileFormat="array_record", alternativeFileFormats=["tfrecord"])
  with pytest.raises(ValueError, match="already stored as 'array_record'"):
    tfds_convert.plan_tfds(d)
  assert tfds_convert.plan_tfds(d, str(tmp_path / "out")).inputs  # From the tfrecord copy.
  d = str(tmp_path / "d")
  _write_info(d, [("train", [], {})])
  with pytest.raises(ValueError, match="lists no shards"):
    tfds_convert.plan_tfds(d, str(tmp_path / "out"))


def test_subfolder_template_end_to_end(tmp_path, tf_write, ar_read, capsys):
  d = str(tmp_path / "toy" / "1.0.0")
  records = {0: [b"a0", b"a1"], 1: [b"b0"]}
  _write_info(d, [("train", [2, 1], {"filepathTemplate": "{SPLIT}/{DATASET}-{SHARD_X_OF_Y}.{FILEFORMAT}"})])
  for i, recs in records.items():
    tf_write(os.path.join(d, "train", f"toy-{i:05d}-of-00002.tfrecord"), recs)
  open(os.path.join(d, "notes.txt"), "w").write("keep me")
  out = str(tmp_path / "out" / "toy" / "1.0.0")
  assert tfds_convert.main(["--dataset_dir", d, "--out_dir", out, "--verify", "--quiet"]) == 0
  assert "Verified 2/2 shard(s)" in capsys.readouterr().out
  files = layout.tfds_array_record_files(out, "train")
  assert [ar_read(f) for f in files] == [records[0], records[1]]
  assert open(os.path.join(out, "notes.txt")).read() == "keep me"
  assert layout.read_dataset_info(out)["fileFormat"] == "array_record"


def test_shard_lengths_that_disagree_with_the_files_fail(tmp_path, tf_write, capsys):
  d = str(tmp_path / "toy" / "1.0.0")
  _write_info(d, [("train", [2], {})])
  tf_write(os.path.join(d, "toy-train.tfrecord-00000-of-00001"), [b"a", b"b", b"c"])
  out = str(tmp_path / "out")
  assert tfds_convert.main(["--dataset_dir", d, "--out_dir", out, "--quiet"]) != 0
  err = capsys.readouterr().err
  assert "3 records, expected 2" in err and "prepare the dataset again" in err
  assert not os.path.exists(os.path.join(out, "dataset_info.json"))


@pytest.mark.parametrize("lengths", [["12", "x"], "12", [1.5], [True], None, [-1]])
def test_damaged_shard_lengths_name_the_file_and_split(tmp_path, lengths):
  d = tmp_path / "toy" / "1.0.0"
  _write_info(str(d), [("train", [1], {})])
  info = json.loads((d / "dataset_info.json").read_text())
  info["splits"][0]["shardLengths"] = lengths
  (d / "dataset_info.json").write_text(json.dumps(info))
  with pytest.raises(layout.NotATfdsDatasetError,
                     match=r"dataset_info\.json': split 'train' has shardLengths .* prepare the dataset again"):
    layout.read_dataset_info(d)
