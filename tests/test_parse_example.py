"""Tests for loader.example: results must match tf.io.parse_single_example."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from loader import example as ex

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_INT64_EDGES = [0, 1, -1, 127, 128, 300, -300, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63)]


@pytest.fixture(scope="module")
def tf():
  return pytest.importorskip("tensorflow")


def _feature(tf, value):
  """Builds a tf.train.Feature from ("int64"|"float"|"bytes", values)."""
  kind, values = value
  if kind == "int64":
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  if kind == "float":
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))
  if kind == "bytes":
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
  return tf.train.Feature()


def _serialize(tf, features: dict) -> bytes:
  return tf.train.Example(
      features=tf.train.Features(feature={k: _feature(tf, v) for k, v in features.items()})
  ).SerializeToString()


def _tf_spec(tf, spec):
  tf_dtype = {"int64": tf.int64, "float32": tf.float32, "object": tf.string}[spec.dtype.name]
  if isinstance(spec, ex.VarLenFeature):
    return tf.io.VarLenFeature(tf_dtype)
  default = spec.default_value
  return tf.io.FixedLenFeature(
      list(spec.shape), tf_dtype, default_value=None if default is None else default.tolist()
  )


def _assert_matches_tf(tf, serialized: bytes, features: dict) -> dict:
  ours = ex.parse_example(serialized, features)
  theirs = tf.io.parse_single_example(
      serialized, {k: _tf_spec(tf, v) for k, v in features.items()}
  )
  assert ours.keys() == theirs.keys()
  for key, spec in features.items():
    want = theirs[key]
    want = want.values.numpy() if isinstance(want, tf.SparseTensor) else want.numpy()
    got = ours[key]
    assert isinstance(got, np.ndarray), key
    assert got.dtype == spec.dtype, key
    assert got.shape == np.shape(want), key
    np.testing.assert_array_equal(got, want, err_msg=key)
  return ours


def test_matches_tf_on_all_types_and_shapes(tf):
  rng = np.random.default_rng(0)
  floats = rng.standard_normal(37).astype(np.float32).tolist()
  records = {
      "id": ("int64", [12345678901]),
      "neg": ("int64", [-7]),
      "edges": ("int64", _INT64_EDGES),
      "matrix": ("int64", list(range(-3, 3))),
      "many_ints": ("int64", rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64).tolist()),
      "small_ints": ("int64", list(range(100))),  # all 1-byte varints
      "score": ("float", [0.5]),
      "floats": ("float", floats),
      "special": ("float", [np.inf, -np.inf, 3.4e38, -0.0, 1e-45]),
      "image": ("bytes", [bytes(range(256)) * 4]),
      "tags": ("bytes", [b"a", b"", b"\x00\xff", "ünï".encode()]),
      "empty_ints": ("int64", []),
      "empty_floats": ("float", []),
      "empty_bytes": ("bytes", []),
      "unrequested": ("bytes", [b"skipped"]),
  }
  features = {
      "id": ex.FixedLenFeature([], "int64"),
      "neg": ex.FixedLenFeature((), np.int64),
      "edges": ex.FixedLenFeature([len(_INT64_EDGES)], "int64"),
      "matrix": ex.FixedLenFeature([2, 3], "int64"),
      "many_ints": ex.VarLenFeature("int64"),
      "small_ints": ex.FixedLenFeature([10, 10], "int64"),
      "score": ex.FixedLenFeature([], "float32"),
      "floats": ex.VarLenFeature(np.float32),
      "special": ex.FixedLenFeature([5], np.float32),
      "image": ex.FixedLenFeature([], "bytes"),
      "tags": ex.VarLenFeature("string"),
      "empty_ints": ex.VarLenFeature("int64"),
      "empty_floats": ex.FixedLenFeature([0], "float32"),
      "empty_bytes": ex.VarLenFeature(object),
      "absent_var": ex.VarLenFeature("float32"),
      "absent_default": ex.FixedLenFeature([2], "int64", default_value=[4, -5]),
      "absent_bytes_default": ex.FixedLenFeature([], "bytes", default_value="hi"),
  }
  ours = _assert_matches_tf(tf, _serialize(tf, records), features)
  assert ours["image"][()] == bytes(range(256)) * 4
  assert ours["tags"].tolist() == [b"a", b"", b"\x00\xff", "ünï".encode()]
  assert "unrequested" not in ours


def test_feature_without_list_counts_as_missing(tf):
  serialized = _serialize(tf, {"a": ("none", None)})
  features = {
      "a": ex.FixedLenFeature([], "int64", default_value=9),
  }
  assert _assert_matches_tf(tf, serialized, features)["a"] == 9
  _assert_matches_tf(tf, serialized, {"a": ex.VarLenFeature("float32")})
  with pytest.raises(ex.ExampleParseError, match="'a' is required"):
    ex.parse_example(serialized, {"a": ex.FixedLenFeature([], "int64")})


def test_unpacked_and_split_encodings():
  # TF always writes packed lists, but parsers must also accept unpacked
  # values and lists split over several occurrences (protobuf merging).
  def ld(field, payload):
    return bytes([field << 3 | 2, len(payload)]) + payload

  def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
      if v < 0x80:
        return bytes(out + bytes([v]))
      out.append(v & 0x7F | 0x80)
      v >>= 7

  int_list = b"".join(b"\x08" + varint(v) for v in [1, -2]) + ld(1, varint(3) + varint(-(2**63)))
  float_list = b"\x0d" + struct.pack("<f", 1.5) + ld(1, struct.pack("<2f", 2.5, -3.0))
  # A second Feature message for the same entry merges; an int64_list
  # after a float_list replaces it (oneof semantics).
  ints_feature = ld(3, int_list[:2]) + ld(3, int_list[2:])
  entries = [
      ld(1, b"i") + ld(2, ints_feature),
      ld(1, b"f") + ld(2, ld(2, float_list)),
      ld(1, b"r") + ld(2, ld(2, float_list)) + ld(2, ld(3, b"\x08" + varint(7))),
      ld(1, b"u") + ld(2, ld(3, b"\x08" + varint(1))) + b"\x18\x05",  # unknown MapEntry field 3
  ]
  serialized = ld(1, b"".join(ld(1, e) for e in entries)) + b"\x10\x01"  # unknown field 2
  got = ex.parse_example(
      serialized,
      {
          "i": ex.VarLenFeature("int64"),
          "f": ex.VarLenFeature("float32"),
          "r": ex.FixedLenFeature([], "int64"),
          "u": ex.FixedLenFeature([], "int64"),
      },
  )
  assert got["i"].tolist() == [1, -2, 3, -(2**63)]
  assert got["f"].tolist() == [1.5, 2.5, -3.0]
  assert got["r"] == 7 and got["u"] == 1


def test_duplicate_key_last_wins(tf):
  first = _serialize(tf, {"a": ("int64", [1])})
  second = _serialize(tf, {"a": ("int64", [2])})
  _assert_matches_tf(tf, first + second, {"a": ex.FixedLenFeature([], "int64")})


def test_long_packed_varints_use_numpy_path_and_match_python_path(tf):
  values = _INT64_EDGES * 20
  serialized = _serialize(tf, {"x": ("int64", values)})
  got = ex.parse_example(serialized, {"x": ex.VarLenFeature("int64")})["x"]
  assert got.tolist() == values
  short = _serialize(tf, {"x": ("int64", values[:3])})
  assert ex.parse_example(short, {"x": ex.VarLenFeature("int64")})["x"].tolist() == values[:3]


def test_results_are_writable_copies(tf):
  serialized = _serialize(tf, {"f": ("float", [1.0, 2.0]), "i": ("int64", [1] * 50)})
  got = ex.parse_example(
      serialized, {"f": ex.FixedLenFeature([2], "float32"), "i": ex.VarLenFeature("int64")}
  )
  got["f"] *= 2
  got["i"] += 1
  assert got["f"].tolist() == [2.0, 4.0]


def test_default_is_not_shared_between_records():
  features = {"a": ex.FixedLenFeature([2], "float32", default_value=[1.0, 2.0])}
  first = ex.parse_example(b"", features)["a"]
  first[0] = 100.0
  assert ex.parse_example(b"", features)["a"].tolist() == [1.0, 2.0]


def test_missing_key_error_lists_present_keys(tf):
  serialized = _serialize(tf, {"b": ("int64", [1]), "a": ("float", [1.0])})
  with pytest.raises(ex.ExampleParseError, match=r"'label' is required.*\['a', 'b'\]"):
    ex.parse_example(serialized, {"label": ex.FixedLenFeature([], "int64")})


@pytest.mark.parametrize(
    "record, spec, message",
    [
        (("float", [1.0]), ex.FixedLenFeature([], "int64"), "asks for int64 but the record has a float_list"),
        (("int64", [1]), ex.VarLenFeature("bytes"), "asks for bytes but the record has a int64_list"),
        (("bytes", [b"x"]), ex.FixedLenFeature([], "float32"), "asks for float32 .* bytes_list"),
        # TF also rejects an empty list of the wrong type.
        (("int64", []), ex.VarLenFeature("float32"), "asks for float32 .* int64_list"),
    ],
)
def test_wrong_type_names_key(tf, record, spec, message):
  serialized = _serialize(tf, {"feat": record})
  with pytest.raises(ex.ExampleParseError, match=f"'feat'.*{message}"):
    ex.parse_example(serialized, {"feat": spec})


@pytest.mark.parametrize(
    "record, shape",
    [
        (("float", [1.0, 2.0]), [3]),
        (("int64", [1, 2, 3]), []),
        (("int64", []), []),
        (("bytes", [b"a", b"b"]), [1]),
    ],
)
def test_wrong_count_names_key_and_shape(tf, record, shape):
  serialized = _serialize(tf, {"feat": record})
  dtype = {"float": "float32", "int64": "int64", "bytes": "bytes"}[record[0]]
  n = len(record[1])
  with pytest.raises(ex.ExampleParseError, match=rf"'feat' has {n} values .*shape {tuple(shape)!r}".replace("(", r"\(").replace(")", r"\)")):
    ex.parse_example(serialized, {"feat": ex.FixedLenFeature(shape, dtype)})


@pytest.mark.parametrize(
    "serialized, offset",
    [
        (b"\x0a\x05abc", 1),  # length overruns the record
        (b"\x0a\x02\x0a\x80", 3),  # truncated varint (entry length)
        (b"\x0b", 0),  # group wire type
        (b"\x00\x00\x00", 0),  # field number 0, e.g. zero padding
        (b"\x0a\x03\x0a\x01\x0a", 5),  # truncated key length inside the entry
        (b"\x0a\x0b\x0a\x09\x0a\x01x\x12\x04\x12\x02\x0d\x00", 11),  # float_list.value wire type 5 truncated
    ],
)
def test_malformed_reports_byte_offset(serialized, offset):
  features = {"x": ex.VarLenFeature("float32")}
  with pytest.raises(ex.ExampleParseError, match=f"byte {offset} of {len(serialized)}"):
    ex.parse_example(serialized, features)


def test_malformed_packed_float_length(tf):
  good = _serialize(tf, {"f": ("float", [1.0, 2.0])})
  # Example > Features > entry > Feature > FloatList > packed value: each
  # enclosing length grows by one when we append a byte to the payload.
  bad = bytearray(good)
  length_offsets = [1, 3, 8, 10, 12]
  for i in length_offsets:
    bad[i] += 1
  bad += b"\x00"
  assert bad[length_offsets[-1] - 1] == 0x0A
  with pytest.raises(ex.ExampleParseError, match="'f'.*byte 11 .*not a multiple of 4"):
    ex.parse_example(bytes(bad), {"f": ex.VarLenFeature("float32")})


def test_invalid_specs():
  with pytest.raises(ValueError, match="Unsupported feature dtype 'float64'"):
    ex.FixedLenFeature([], "float64")
  with pytest.raises(ValueError, match="Unsupported feature dtype"):
    ex.VarLenFeature(np.int32)
  with pytest.raises(ValueError, match="has 1 elements but shape \\(3,\\) needs 3"):
    ex.FixedLenFeature([3], "float32", default_value=1.0)
  with pytest.raises(ValueError, match="non-negative"):
    ex.FixedLenFeature([-1], "int64")
  with pytest.raises(TypeError, match="'a': spec must be"):
    ex.example_decoder({"a": "int64"})
  with pytest.raises(TypeError, match="not str"):
    ex.parse_example("text", {"a": ex.VarLenFeature("int64")})


def test_dtype_spellings():
  assert ex.FixedLenFeature(3, "int64").shape == (3,)
  for dtype in ["int64", np.int64, np.dtype("int64")]:
    assert ex.VarLenFeature(dtype).dtype == np.int64
  for dtype in ["float32", np.float32]:
    assert ex.VarLenFeature(dtype).dtype == np.float32
  for dtype in ["bytes", "string", object, bytes, np.bytes_]:
    assert ex.VarLenFeature(dtype).dtype == object


def test_tf_dtypes_accepted_by_name(tf):
  assert ex.VarLenFeature(tf.string).dtype == object
  assert ex.FixedLenFeature([], tf.int64).dtype == np.int64
  assert ex.FixedLenFeature([], tf.float32).dtype == np.float32


def test_parse_examples_batches(tf):
  records = [
      _serialize(tf, {"label": ("int64", [i]), "x": ("float", [i, -i]), "tags": ("bytes", [b"t"] * i)})
      for i in range(4)
  ]
  features = {
      "label": ex.FixedLenFeature([], "int64"),
      "x": ex.FixedLenFeature([2], "float32"),
      "tags": ex.VarLenFeature("bytes"),
  }
  got = ex.parse_examples(records, features)
  assert got["label"].tolist() == [0, 1, 2, 3]
  assert got["x"].shape == (4, 2) and got["x"].dtype == np.float32
  assert got["tags"].dtype == object and got["tags"].shape == (4,)
  assert [len(t) for t in got["tags"]] == [0, 1, 2, 3]
  # Equal-length ragged rows must stay separate arrays, not stack to 2-D.
  same = ex.parse_examples(records[2:3] * 2, features)["tags"]
  assert same.shape == (2,) and same[0].tolist() == [b"t", b"t"]
  empty = ex.parse_examples([], features)
  assert empty["x"].shape == (0, 2) and empty["tags"].shape == (0,)
  with pytest.raises(ex.ExampleParseError, match="Record 1: Feature 'label'"):
    ex.parse_examples([records[0], _serialize(tf, {})], features)


def test_decoder_is_picklable_and_maps(tf):
  decode = ex.example_decoder({"label": ex.FixedLenFeature([], "int64")})
  decode = pickle.loads(pickle.dumps(decode))
  records = [_serialize(tf, {"label": ("int64", [i])}) for i in range(3)]
  assert [int(decode(r)["label"]) for r in records] == [0, 1, 2]
  assert decode(bytearray(records[1]))["label"] == 1
  assert decode(memoryview(records[2]))["label"] == 2


def test_import_does_not_load_tensorflow():
  code = (
      "import sys, loader.example as e; "
      "e.parse_example(b'', {'a': e.VarLenFeature('int64')}); "
      "bad = sorted(m for m in sys.modules if m.startswith("
      "('tensorflow', 'google.protobuf', 'jax'))); "
      "print(bad); sys.exit(1 if bad else 0)"
  )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # The bare `google` namespace package is preloaded by site .pth files of
  # google-cloud-* distributions, so only protobuf itself is checked.
  proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_corrupted_records_raise_parse_error_only(tf):
  # Truncations and byte flips must end in a result or ExampleParseError,
  # never an IndexError or a hang, wherever they land.
  serialized = _serialize(
      tf,
      {
          "i": ("int64", _INT64_EDGES * 3),
          "f": ("float", [1.0, 2.0, 3.0]),
          "b": ("bytes", [b"abc", b"de"]),
      },
  )
  features = {
      "i": ex.VarLenFeature("int64"),
      "f": ex.VarLenFeature("float32"),
      "b": ex.VarLenFeature("bytes"),
  }
  rng = np.random.default_rng(1)
  variants = [serialized[:n] for n in range(len(serialized))]
  for _ in range(2000):
    bad = bytearray(serialized)
    for pos in rng.integers(0, len(bad), rng.integers(1, 4)):
      bad[pos] = rng.integers(0, 256)
    variants.append(bytes(bad))
  for record in variants:
    try:
      ex.parse_example(record, features)
    except ex.ExampleParseError:
      pass
