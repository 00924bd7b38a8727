"""pipelines.tfds_convert and loader.tfds on a small TFDS dataset built here.

The dataset is prepared once per module by a GeneratorBasedBuilder defined
below (TFRecord, 3 splits x 3 shards, no downloads); each test converts a
copy, so the tests do not depend on each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from loader import tfds as tfds_loader  # pylint: disable=g-import-not-at-top
from pipelines import build, tfds_convert  # pylint: disable=g-import-not-at-top

NAME = "ar_toolkit_toy"
VERSION = "1.0.0"
SPLITS = {"train": 20, "validation": 9, "test": 7}
NUM_SHARDS = 3
LABELS = ["cat", "dog", "bird"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ArToolkitToy(tfds.core.GeneratorBasedBuilder):
  """Tiny dataset: int, class label, PNG image and text features."""

  VERSION = tfds.core.Version(VERSION)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "id": np.int64,
            "label": tfds.features.ClassLabel(names=LABELS),
            "image": tfds.features.Image(shape=(4, 4, 3)),
            "text": tfds.features.Text(),
        }),
        supervised_keys=("image", "label"))

  def _split_generators(self, dl_manager):
    del dl_manager
    offsets = np.cumsum([0] + list(SPLITS.values()))
    return {name: self._generate_examples(n, int(off))
            for (name, n), off in zip(SPLITS.items(), offsets)}

  def _generate_examples(self, n, offset):
    for i in range(offset, offset + n):
      yield i, {"id": i, "label": i % 3, "image": np.full((4, 4, 3), i, np.uint8),
                "text": f"example {i}"}


def _assert_same_examples(got, want):
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want)):
    assert sorted(g) == sorted(w), i
    for k in w:
      np.testing.assert_array_equal(g[k], w[k], err_msg=f"example {i}, feature {k!r}")


def _data_source_examples(source):
  return [source[i] for i in range(len(source))]


def _dir_digest(path):
  """Name -> sha256 of every file: shows a folder was not touched."""
  return {n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest()
          for n in sorted(os.listdir(path))}


def _convert(capsys, *args):
  rc = tfds_convert.main([*args, "--quiet"])
  return rc, capsys.readouterr()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """(dataset_dir, {split: examples read in order by TFDS as_dataset})."""
  data_dir = tmp_path_factory.mktemp("tfds_source")
  builder = ArToolkitToy(data_dir=str(data_dir), file_format="tfrecord")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(num_shards=NUM_SHARDS))
  read_config = tfds.ReadConfig(interleave_cycle_length=1)  # Shard by shard, in order.
  expected = {
      split: list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False,
                                                   read_config=read_config)))
      for split in SPLITS
  }
  return str(builder.data_dir), expected


@pytest.fixture
def dataset_dir(source, tmp_path):
  """A fresh copy of the prepared source dataset, laid out as <root>/<name>/<version>."""
  copy = tmp_path / "src" / NAME / VERSION
  shutil.copytree(source[0], copy)
  return str(copy)


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
  """The source converted to a separate folder with the CLI's main()."""
  out_root = tmp_path_factory.mktemp("tfds_out")
  out = str(out_root / NAME / VERSION)
  rc = tfds_convert.main(["--dataset_dir", source[0], "--out_dir", out, "--verify", "--quiet"])
  assert rc == 0
  return out


def test_source_has_several_shards_per_split(source):
  info = tfds_loader.read_dataset_info(source[0])
  assert info["fileFormat"] == "tfrecord"
  assert {s: len(examples) for s, examples in source[1].items()} == SPLITS
  assert {s["name"]: len(s["shardLengths"]) for s in info["splits"]} == {
      s: NUM_SHARDS for s in SPLITS}


def test_separate_dir_is_a_tfds_array_record_dataset(source, converted):
  src_dir, _ = source
  names = sorted(os.listdir(converted))
  shards = [f"{NAME}-{s}.array_record-{i:05d}-of-{NUM_SHARDS:05d}"
            for s in SPLITS for i in range(NUM_SHARDS)]
  assert names == sorted(shards + ["dataset_info.json", "features.json", "label.labels.txt",
                                   "manifest.json"])
  for name in ("features.json", "label.labels.txt"):
    with open(os.path.join(src_dir, name), "rb") as a, open(os.path.join(converted, name), "rb") as b:
      assert a.read() == b.read()
  src_info = tfds_loader.read_dataset_info(src_dir)
  out_info = tfds_loader.read_dataset_info(converted)
  assert out_info["fileFormat"] == "array_record"
  assert "alternativeFileFormats" not in out_info
  assert out_info["splits"] == src_info["splits"]  # Names, templates, shard lengths, bytes.
  assert out_info["dataSourceAccesses"][-1]["tfdsDataset"]["name"] == NAME

  builder = tfds.builder_from_directory(converted)
  assert builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD
  assert builder.info.features["label"].names == LABELS
  for split, n in SPLITS.items():
    assert builder.info.splits[split].num_examples == n
    assert len(builder.info.splits[split].get_available_shards(
        builder.data_path, file_format=tfds.core.FileFormat.ARRAY_RECORD)) == NUM_SHARDS


def test_separate_dir_reads_the_same_examples_in_order(source, converted):
  _, expected = source
  builder = tfds.builder_from_directory(converted)
  root = os.path.dirname(os.path.dirname(converted))
  for split in SPLITS:
    _assert_same_examples(_data_source_examples(builder.as_data_source(split=split)),
                          expected[split])
    by_name = tfds.data_source(NAME, split=split, data_dir=root, download=False)
    _assert_same_examples(_data_source_examples(by_name), expected[split])


def test_in_place_adds_array_record_and_keeps_tfrecords(source, dataset_dir, capsys):
  _, expected = source
  before = _dir_digest(dataset_dir)
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir)
  assert rc == 0, out.err
  after = _dir_digest(dataset_dir)
  for name, digest in before.items():
    if name != "dataset_info.json":
      assert after[name] == digest, f"{name} changed"
  added = sorted(set(after) - set(before))
  assert added == sorted(
      ["manifest.json"] + [f"{NAME}-{s}.array_record-{i:05d}-of-{NUM_SHARDS:05d}"
                           for s in SPLITS for i in range(NUM_SHARDS)])
  info = tfds_loader.read_dataset_info(dataset_dir)
  assert info["fileFormat"] == "tfrecord"
  assert info["alternativeFileFormats"] == ["array_record"]

  builder = tfds.builder_from_directory(dataset_dir)
  for split in SPLITS:
    _assert_same_examples(_data_source_examples(builder.as_data_source(split=split)),
                          expected[split])
  # TFRecord stays the main format, used by tf.data. (A fresh builder: as_data_source
  # switches its builder's info to array_record.)
  builder = tfds.builder_from_directory(dataset_dir)
  assert builder.info.file_format == tfds.core.FileFormat.TFRECORD
  train = tfds.as_numpy(builder.as_dataset(
      split="train", shuffle_files=False,
      read_config=tfds.ReadConfig(interleave_cycle_length=1)))
  _assert_same_examples(list(train), expected["train"])

  rc, out = _convert(capsys, "--dataset_dir", dataset_dir)
  assert rc == 2 and "already exist" in out.err and "--skip-existing" in out.err
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir, "--out_dir", dataset_dir,
                     "--skip-existing")
  assert rc == 0, out.err
  assert tfds_loader.read_dataset_info(dataset_dir)["alternativeFileFormats"] == ["array_record"]


def test_existing_outputs_are_an_error_and_nothing_changes(source, converted, capsys):
  before = _dir_digest(converted)
  rc, out = _convert(capsys, "--dataset_dir", source[0], "--out_dir", converted)
  assert rc == 2
  assert "already exist" in out.err and "--overwrite" in out.err
  assert _dir_digest(converted) == before


def test_build_tfds_pipeline_overwrites_metadata_too(source, converted, tmp_path):
  out = str(tmp_path / NAME / VERSION)
  shutil.copytree(converted, out)
  with open(os.path.join(out, "features.json"), "w") as f:
    f.write("{}")  # Stale metadata must be replaced.
  options = tfds_convert.ConvertOptions(output_dir="ignored", existing="overwrite")
  p = tfds_convert.build_tfds_pipeline(source[0], out, options, build.pipeline_options([]))
  p.run().wait_until_finish()
  with open(os.path.join(source[0], "features.json")) as a, open(os.path.join(out, "features.json")) as b:
    assert json.load(a) == json.load(b)
  _assert_same_examples(
      _data_source_examples(tfds.builder_from_directory(out).as_data_source(split="test")),
      source[1]["test"])


def test_no_dataset_info_names_the_directory(dataset_dir, tmp_path, capsys):
  parent = os.path.dirname(dataset_dir)
  rc, out = _convert(capsys, "--dataset_dir", parent, "--out_dir", str(tmp_path / "o"))
  assert rc == 2
  assert repr(parent) in out.err and "dataset_info.json" in out.err
  assert dataset_dir in out.err  # Points at the version folder below it.
  assert not os.path.exists(tmp_path / "o")


def test_corrupt_shard_fails_with_the_converters_error(source, dataset_dir, tmp_path, capsys):
  shard = os.path.join(dataset_dir, f"{NAME}-train.tfrecord-00001-of-{NUM_SHARDS:05d}")
  data = bytearray(open(shard, "rb").read())
  data[20] ^= 0xFF  # Inside the first record's data: its CRC no longer matches.
  with open(shard, "wb") as f:
    f.write(data)
  out_dir = tmp_path / "o"
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir, "--out_dir", str(out_dir))
  assert rc != 0
  assert shard in out.err and "is corrupt" in out.err
  assert not (out_dir / "dataset_info.json").exists()

  # Skipping corrupt records: the output's shard lengths say what was written.
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir, "--out_dir", str(out_dir),
                     "--on-corrupt", "skip", "--overwrite")
  assert rc == 0, out.err
  assert "19 records in 3 shard(s)" in out.out
  src = tfds_loader.shard_lengths(tfds_loader.read_dataset_info(dataset_dir), "train")
  lengths = tfds_loader.shard_lengths(tfds_loader.read_dataset_info(str(out_dir)), "train")
  assert lengths == [src[0], src[1] - 1, src[2]]  # The first record of shard 1 is gone.
  train = tfds.builder_from_directory(str(out_dir)).as_data_source(split="train")
  want = source[1]["train"]
  _assert_same_examples(_data_source_examples(train), want[:src[0]] + want[src[0] + 1:])

  # In place, TFDS keeps one shard length list for all formats: refuse, change nothing.
  info_before = open(os.path.join(dataset_dir, "dataset_info.json")).read()
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir, "--on-corrupt", "skip")
  assert rc != 0 and "dataset_info.json was not changed" in out.err
  assert open(os.path.join(dataset_dir, "dataset_info.json")).read() == info_before


def test_missing_shard_is_reported_before_converting(dataset_dir, tmp_path, capsys):
  shard = os.path.join(dataset_dir, f"{NAME}-test.tfrecord-00002-of-{NUM_SHARDS:05d}")
  os.remove(shard)
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir, "--out_dir", str(tmp_path / "o"))
  assert rc == 2 and shard in out.err and "missing" in out.err
  assert not (tmp_path / "o").exists()


def test_loader_file_list_matches_tfds(converted):
  builder = tfds.builder_from_directory(converted)
  for split in SPLITS:
    files = tfds_loader.tfds_array_record_files(converted, split)
    want = [os.fspath(fi.filename) for fi in builder.info.splits[split].file_instructions]
    assert files == want
    assert all(os.path.exists(f) for f in files)
  both = tfds_loader.tfds_array_record_files(converted, "train+test")
  assert both == (tfds_loader.tfds_array_record_files(converted, "train")
                  + tfds_loader.tfds_array_record_files(converted, "test"))
  with pytest.raises(ValueError, match="tfds_read_instructions"):
    tfds_loader.tfds_array_record_files(converted, "train[:10%]")
  with pytest.raises(ValueError, match=r"available splits: \['train', 'validation', 'test'\]"):
    tfds_loader.tfds_array_record_files(converted, "training")


def test_loader_read_instructions_follow_tfds_slicing(source, converted):
  from array_record.python.array_record_module import ArrayRecordReader
  decode = tfds_loader.tfds_feature_decoder(converted)
  for split_arg, want in (("train[:25%]", source[1]["train"][:5]),
                          ("train[6:15]+test[-2:]", source[1]["train"][6:15] + source[1]["test"][-2:])):
    got = []
    for s in tfds_loader.tfds_read_instructions(converted, split_arg):
      reader = ArrayRecordReader(s.path)
      got += [decode(r) for r in reader.read(s.start, s.stop)]
      reader.close()
    _assert_same_examples(got, want)


def test_read_instructions_refuse_shard_lengths_the_files_contradict(converted, tmp_path):
  # An edited dataset_info.json (same total, lengths moved between shards)
  # would make TFDS select other records without any error.
  import shutil  # pylint: disable=import-outside-toplevel
  copy = str(tmp_path / "copy")
  shutil.copytree(converted, copy)
  path = os.path.join(copy, "dataset_info.json")
  with open(path) as f:
    info = json.load(f)
  train = next(s for s in info["splits"] if s["name"] == "train")
  lengths = [int(n) for n in train["shardLengths"]]
  train["shardLengths"] = [str(lengths[0] - 1), str(lengths[1] + 1), *map(str, lengths[2:])]
  with open(path, "w") as f:
    json.dump(info, f)
  with pytest.raises(ValueError, match=rf"dataset_info.json says .*-train.array_record-00000-of-\d+ \(split 'train'\) "
                                       rf"holds {lengths[0] - 1} records, but the file holds {lengths[0]}"):
    tfds_loader.tfds_read_instructions(copy, "train[:25%]")
  assert tfds_loader.tfds_read_instructions(copy, "test[:2]")  # Other splits' shards agree.


def test_loader_decoder_matches_tfds_and_pickles(source, converted):
  from array_record.python.array_record_module import ArrayRecordReader
  decode = pickle.loads(pickle.dumps(tfds_loader.tfds_feature_decoder(converted)))
  got = []
  for path in tfds_loader.tfds_array_record_files(converted, "validation"):
    reader = ArrayRecordReader(path)
    got += [decode(r) for r in reader.read_all()]
    reader.close()
  _assert_same_examples(got, source[1]["validation"])
  assert got[0]["text"] == b"example %d" % got[0]["id"]


def test_loader_decoder_works_in_place_and_without_tensorflow(source, dataset_dir, capsys):
  rc, out = _convert(capsys, "--dataset_dir", dataset_dir)
  assert rc == 0, out.err
  code = (
      "import sys\n"
      "import loader, loader.tfds as t\n"
      "assert 'tensorflow_datasets' not in sys.modules and 'tensorflow' not in sys.modules\n"
      "from array_record.python.array_record_module import ArrayRecordReader\n"
      f"files = t.tfds_array_record_files({dataset_dir!r}, 'test')\n"
      f"d = t.tfds_feature_decoder({dataset_dir!r})\n"
      "ex = d(ArrayRecordReader(files[0]).read([0])[0])\n"
      "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
      "print(int(ex['id']))\n")
  env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
  res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
  assert res.returncode == 0, res.stderr
  assert int(res.stdout.strip()) == int(source[1]["test"][0]["id"])


def test_skip_existing_never_replaces_another_datasets_metadata(source, dataset_dir, tmp_path, capsys):
  # --out_dir is the user's own TFRecord dataset folder: a resume must not
  # take its dataset_info.json and label files for this conversion's.
  out = str(tmp_path / "theirs" / NAME / VERSION)
  shutil.copytree(dataset_dir, out)
  with open(os.path.join(out, "label.labels.txt"), "w") as f:
    f.write("x\ny\nz\n")
  before = _dir_digest(out)
  rc, got = _convert(capsys, "--dataset_dir", source[0], "--out_dir", out, "--skip-existing")
  assert rc == 2
  assert "are not this conversion's" in got.err and "dataset_info.json" in got.err and "label.labels.txt" in got.err
  assert _dir_digest(out) == before


def test_an_overwrite_takes_dataset_info_away_before_it_replaces_shards(source, converted, tmp_path):
  # A stopped --overwrite must not leave a dataset_info.json naming a mix of
  # old and new shards; the loader also refuses the folder while its marker says unfinished.
  from converter.manifest import write_incomplete_manifest  # pylint: disable=g-import-not-at-top
  from loader import ondisk  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / NAME / VERSION)
  shutil.copytree(converted, out)
  plan = tfds_convert.plan_tfds(source[0], out)
  options = tfds_convert.tfds_convert_options(plan, tfds_convert.ConvertOptions(output_dir=out, existing="overwrite"))
  shard_plans = tfds_convert.check_inputs_and_outputs(plan, options)
  tfds_convert._retract_array_record_format(plan, shard_plans)  # pylint: disable=protected-access
  assert not os.path.exists(os.path.join(out, "dataset_info.json"))
  shutil.copy(os.path.join(converted, "dataset_info.json"), out)  # As if it were still there...
  write_incomplete_manifest(out, [], writer_options="group_size:1", existing="overwrite", run_id="x")
  with pytest.raises(ondisk.IncompleteManifestError):  # ...the marker keeps the loader off the mix.
    tfds_loader.tfds_array_record_files(out, "train")


def test_an_in_place_overwrite_takes_array_record_out_of_the_formats_first(source, dataset_dir, capsys):
  rc, _ = _convert(capsys, "--dataset_dir", dataset_dir)
  assert rc == 0
  info = tfds_loader.read_dataset_info(dataset_dir)
  assert "array_record" in info["alternativeFileFormats"]
  plan = tfds_convert.plan_tfds(dataset_dir, None)
  options = tfds_convert.tfds_convert_options(plan, tfds_convert.ConvertOptions(output_dir=dataset_dir,
                                                                                existing="overwrite"))
  tfds_convert._retract_array_record_format(plan, tfds_convert.check_inputs_and_outputs(plan, options))  # pylint: disable=protected-access
  assert "array_record" not in tfds_loader.read_dataset_info(dataset_dir).get("alternativeFileFormats", [])
  rc, _ = _convert(capsys, "--dataset_dir", dataset_dir, "--overwrite")  # The finished run adds it back.
  assert rc == 0 and "array_record" in tfds_loader.read_dataset_info(dataset_dir)["alternativeFileFormats"]
