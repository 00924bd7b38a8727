"""pipelines.make_example_data writes files TensorFlow reads as tf.train.Example."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pipelines import make_example_data as med


def read_with_tf(paths) -> list:
  import tensorflow as tf
  ds = tf.data.TFRecordDataset([str(p) for p in paths])
  return [tf.train.Example.FromString(r.numpy()) for r in ds]


def feature_values(example, name):
  f = example.features.feature[name]
  kind = f.WhichOneof("kind")
  return kind, list(getattr(f, kind).value)


def test_tensorflow_reads_expected_features(tmp_path, capsys):
  out = tmp_path / "data"
  assert med.main(["--output", str(out), "--shards", "3", "--records-per-shard", "40",
                   "--seed", "7"]) == 0
  assert "Wrote 3 shard(s) x 40 records" in capsys.readouterr().out
  names = sorted(os.listdir(out))
  assert names == [f"example-train.tfrecord-{s:05d}-of-00003" for s in range(3)]
  examples = read_with_tf([out / n for n in names])
  assert len(examples) == 120
  templates = med._templates(7).astype(np.float64)
  correct = 0
  for i, ex in enumerate(examples):
    assert sorted(ex.features.feature) == ["id", "image", "label"]
    assert feature_values(ex, "id") == ("int64_list", [i])  # Ids run on across shards.
    kind, (label,) = feature_values(ex, "label")
    assert kind == "int64_list" and 0 <= label < med.NUM_CLASSES
    kind, (image,) = feature_values(ex, "image")
    assert kind == "bytes_list" and len(image) == med.IMAGE_SIZE
    pixels = np.frombuffer(image, np.uint8).astype(np.float64)
    correct += int(np.argmin(((templates - pixels) ** 2).sum(axis=1)) == label)
  assert correct >= 0.95 * len(examples)  # The label is learnable from the image.


def test_files_are_deterministic(tmp_path):
  a = med.make_example_data(str(tmp_path / "a"), shards=2, records_per_shard=5, seed=3)
  b = med.make_example_data(str(tmp_path / "b"), shards=2, records_per_shard=5, seed=3)
  c = med.make_example_data(str(tmp_path / "c"), shards=2, records_per_shard=5, seed=4)
  for x, y, z in zip(a, b, c):
    assert open(x, "rb").read() == open(y, "rb").read()
    assert open(x, "rb").read() != open(z, "rb").read()
  assert not [f for f in os.listdir(tmp_path / "a") if ".tmp-" in f]


def test_encode_example_matches_tensorflow(tmp_path):
  import tensorflow as tf
  features = {
      "ints": ("int64", [0, 1, -1, 2**40, -(2**63), 2**63 - 1]),
      "floats": ("float", [1.5, -0.25, 0.0]),
      "bytes": ("bytes", [b"", b"\x00\xff", "é".encode()]),
      "empty": ("int64", []),
  }
  expected = tf.train.Example(features=tf.train.Features(feature={
      "ints": tf.train.Feature(int64_list=tf.train.Int64List(value=features["ints"][1])),
      "floats": tf.train.Feature(float_list=tf.train.FloatList(value=features["floats"][1])),
      "bytes": tf.train.Feature(bytes_list=tf.train.BytesList(value=features["bytes"][1])),
      "empty": tf.train.Feature(int64_list=tf.train.Int64List(value=[])),
  }))
  encoded = med.encode_example(features)
  assert tf.train.Example.FromString(encoded) == expected
  path = tmp_path / "one.tfrecord"
  med.write_tfrecord_file(str(path), [encoded, b""])
  assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == [encoded, b""]


def test_rejects_bad_sizes(tmp_path):
  with pytest.raises(ValueError, match="shards > 0"):
    med.make_example_data(str(tmp_path), shards=0)
  with pytest.raises(ValueError, match="records_per_shard >= 0"):
    med.make_example_data(str(tmp_path), shards=1, records_per_shard=-1)


def test_interrupted_write_leaves_nothing(tmp_path):
  def records():
    yield b"one"
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    med.write_tfrecord_file(str(tmp_path / "x.tfrecord-00000-of-00001"), records())
  assert os.listdir(tmp_path) == []


def test_existing_files_are_kept_unless_overwrite(tmp_path, capsys):
  out = tmp_path / "data"
  out.mkdir()
  mine = out / "example-train.tfrecord-00001-of-00002"
  mine.write_bytes(b"MY PRECIOUS DATA")
  assert med.main(["--output", str(out), "--shards", "2", "--records-per-shard", "3"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and str(mine) in err and "--overwrite" in err and "nothing was written" in err
  assert sorted(os.listdir(out)) == [mine.name] and mine.read_bytes() == b"MY PRECIOUS DATA"
  assert med.main(["--output", str(out), "--shards", "2", "--records-per-shard", "3", "--overwrite"]) == 0
  assert len(read_with_tf([mine])) == 3
  # A file that appears while one is written (a second run) is not replaced.
  race = tmp_path / "race.tfrecord"
  def records():
    yield b"one"
    race.write_bytes(b"THE OTHER RUN'S")
  with pytest.raises(FileExistsError, match="appeared while it was written"):
    med.write_tfrecord_file(str(race), records())
  assert race.read_bytes() == b"THE OTHER RUN'S" and os.listdir(tmp_path / "data") and \
      sorted(os.listdir(tmp_path)) == ["data", "race.tfrecord"]


def test_temps_of_killed_runs_are_removed(tmp_path):
  import subprocess
  import sys
  out = tmp_path / "data"
  code = ("import sys; from pipelines import make_example_data as med\n"
          "def records():\n  yield b'x' * 100\n  sys.stdout.write('writing\\n'); sys.stdout.flush()\n"
          "  import time; time.sleep(60)\n  yield b''\n"
          f"import os; os.makedirs({str(out)!r}, exist_ok=True)\n"
          f"med.write_tfrecord_file({str(out / 'example-train.tfrecord-00000-of-00001')!r}, records())\n")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert proc.stdout.readline() == "writing\n"
  proc.kill()  # SIGKILL: its temp file stays.
  proc.wait()
  assert [f for f in os.listdir(out) if ".tmp-" in f]
  med.make_example_data(str(out), shards=1, records_per_shard=2)
  assert os.listdir(out) == ["example-train.tfrecord-00000-of-00001"]
