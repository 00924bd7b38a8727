"""Decodes serialized `tf.train.Example` records without TensorFlow.

The converter keeps records byte-for-byte, so loaded records are still
serialized `tf.train.Example` protos. Importing TensorFlow (or even its
generated protobuf classes) in every data-loading worker costs seconds and
hundreds of MB, so this module reads the protobuf wire format directly:

  Example   { Features features = 1; }
  Features  { map<string, Feature> feature = 1; }
  Feature   { oneof kind { BytesList bytes_list = 1;
                           FloatList float_list = 2;
                           Int64List int64_list = 3; } }
  BytesList { repeated bytes value = 1; }
  FloatList { repeated float value = 1 [packed]; }
  Int64List { repeated int64 value = 1 [packed]; }

Results follow `tf.io.parse_single_example`, except that `VarLenFeature`
yields a dense 1-D array instead of a `SparseTensor`.

Usage:

  features = {
      "label": FixedLenFeature([], "int64"),
      "image": FixedLenFeature([], "bytes"),
      "tags": VarLenFeature("bytes"),
  }
  parse_example(record, features)  # {"label": array(3), ...}
  dataset.map(example_decoder(features))
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

__all__ = [
    "ExampleParseError",
    "FixedLenFeature",
    "VarLenFeature",
    "example_decoder",
    "parse_example",
    "parse_examples",
]

# Feature.kind field numbers, which double as our internal kind ids.
_BYTES = 1
_FLOAT = 2
_INT64 = 3
_KIND_NAMES = {_BYTES: "bytes_list", _FLOAT: "float_list", _INT64: "int64_list"}

_DTYPE_KINDS = {
    "int64": _INT64,
    "float32": _FLOAT,
    "bytes": _BYTES,
    "string": _BYTES,
    "object": _BYTES,
}
_KIND_DTYPES = {
    _INT64: np.dtype(np.int64),
    _FLOAT: np.dtype(np.float32),
    _BYTES: np.dtype(object),
}
_SPEC_DTYPE_NAMES = {_INT64: "int64", _FLOAT: "float32", _BYTES: "bytes"}

# Packed int64 payloads at least this long are decoded with numpy; below it
# the per-call numpy overhead exceeds a plain Python loop.
_NUMPY_VARINT_MIN_BYTES = 32

_UINT64_MASK = (1 << 64) - 1
_INT64_SIGN = 1 << 63
_unpack_float = struct.Struct("<f").unpack_from


class ExampleParseError(ValueError):
  """A record does not match the feature spec or is not a valid Example."""


class _Malformed(Exception):
  """Internal: wire-format error at a byte offset; rewrapped with context."""

  def __init__(self, offset: int, what: str):
    super().__init__(offset, what)
    self.offset = offset
    self.what = what


def _canonical_kind(dtype: Any) -> int:
  """Maps a user-supplied dtype to one of _BYTES, _FLOAT, _INT64."""
  if isinstance(dtype, str):
    name = dtype
  elif isinstance(dtype, (np.dtype, type)):
    try:
      np_dtype = np.dtype(dtype)
    except TypeError:
      name = getattr(dtype, "__name__", repr(dtype))
    else:
      name = "bytes" if np_dtype.kind == "S" else np_dtype.name
  else:
    # Duck-types tf.DType (tf.int64.name == "int64") without importing TF.
    name = getattr(dtype, "name", repr(dtype))
  try:
    return _DTYPE_KINDS[name]
  except KeyError:
    raise ValueError(
        f"Unsupported feature dtype {dtype!r}. Valid dtypes: "
        f"{sorted(_DTYPE_KINDS)} or np.int64, np.float32, bytes, object."
    ) from None


@dataclasses.dataclass(frozen=True, eq=False)
class FixedLenFeature:
  """A feature with a fixed number of values, returned as an array of `shape`.

  Attributes:
    shape: Output shape; the record must hold exactly `prod(shape)` values.
    dtype: "int64", "float32" or "bytes" (also np.int64, np.float32, bytes,
      object, "string"). Normalized to the output numpy dtype; bytes become
      an object array of `bytes`.
    default_value: Used when the key is absent. Must have `prod(shape)`
      elements (as in TF, scalars are not broadcast). None makes the key
      required.
  """

  shape: Sequence[int] | int
  dtype: Any
  default_value: Any = None

  def __post_init__(self):
    shape = self.shape
    if isinstance(shape, (int, np.integer)):
      shape = (shape,)
    try:
      shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
      raise ValueError(
          f"FixedLenFeature shape must be a sequence of ints (got {shape=})."
      ) from None
    if any(d < 0 for d in shape):
      raise ValueError(f"FixedLenFeature shape must be non-negative (got {shape=}).")
    kind = _canonical_kind(self.dtype)
    object.__setattr__(self, "shape", shape)
    object.__setattr__(self, "dtype", _KIND_DTYPES[kind])
    if self.default_value is not None:
      object.__setattr__(
          self, "default_value", self._normalize_default(self.default_value, kind)
      )

  def _normalize_default(self, value: Any, kind: int) -> np.ndarray:
    if kind == _BYTES:
      flat = np.asarray(value, dtype=object).reshape(-1)
      flat = np.array(
          [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat],
          dtype=object,
      ).reshape(-1)  # np.array of an empty list needs the explicit 1-D shape
    else:
      flat = np.asarray(value, dtype=self.dtype).reshape(-1)
    if flat.size != math.prod(self.shape):
      raise ValueError(
          f"FixedLenFeature default_value has {flat.size} elements but shape "
          f"{self.shape} needs {math.prod(self.shape)} (got {value=})."
      )
    out = flat.reshape(self.shape)
    out.flags.writeable = False  # shared across records; copied on use
    return out


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
  """A feature with any number of values, returned as a 1-D array.

  Unlike TF (which returns a SparseTensor) the result is dense. A missing key
  gives an empty array.

  Attributes:
    dtype: As for `FixedLenFeature`.
  """

  dtype: Any

  def __post_init__(self):
    object.__setattr__(self, "dtype", _KIND_DTYPES[_canonical_kind(self.dtype)])


FeatureSpec = Union[FixedLenFeature, VarLenFeature]


# ---------------------------------------------------------------------------
# Wire-format primitives. Offsets are absolute positions in the record so
# errors can point at the offending byte.


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
  """Returns (unsigned value, position after the varint)."""
  if pos >= end:
    raise _Malformed(pos, "truncated varint")
  b = buf[pos]
  if b < 0x80:
    return b, pos + 1
  start = pos
  result = b & 0x7F
  shift = 7
  pos += 1
  while pos < end:
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if b < 0x80:
      return result, pos
    shift += 7
    if shift >= 70:
      raise _Malformed(start, "varint longer than 10 bytes")
  raise _Malformed(start, "truncated varint")


def _read_length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
  """Reads a length prefix; returns (end of the delimited payload, start)."""
  if pos < end:
    length = buf[pos]
    if length < 0x80 and pos + 1 + length <= end:  # Fast path: short payload.
      return pos + 1 + length, pos + 1
  length, start = _read_varint(buf, pos, end)
  stop = start + length
  if stop > end:
    raise _Malformed(
        pos, f"length {length} overruns the enclosing message by {stop - end} bytes"
    )
  return stop, start


def _skip_field(buf: bytes, tag: int, pos: int, end: int, tag_pos: int) -> int:
  """Skips the payload of an unknown field; returns the next position."""
  if tag < 8:
    # Field number 0 never occurs in valid protobuf; zeroed or shifted bytes do.
    raise _Malformed(tag_pos, "field number 0")
  wire_type = tag & 7
  if wire_type == 0:
    return _read_varint(buf, pos, end)[1]
  if wire_type == 2:
    return _read_length(buf, pos, end)[0]
  if wire_type == 5:
    pos += 4
  elif wire_type == 1:
    pos += 8
  else:
    raise _Malformed(tag_pos, f"unsupported wire type {wire_type}")
  if pos > end:
    raise _Malformed(tag_pos, "truncated fixed-width field")
  return pos


def _index_features(
    buf: bytes, wanted: Mapping[bytes, Any] | None
) -> dict[bytes, list[tuple[int, int]]]:
  """Finds the Feature messages of an Example without decoding them.

  Args:
    buf: The serialized Example.
    wanted: Only keys in this mapping are kept; None keeps all.

  Returns:
    key -> (start, end) ranges of that key's Feature message. A key can have
    several ranges because protobuf merges repeated message fields; a later
    map entry with the same key replaces an earlier one.
  """
  found: dict[bytes, list[tuple[int, int]]] = {}
  end = len(buf)
  pos = 0
  while pos < end:
    tag_pos = pos
    tag = buf[pos]
    if tag == 0x0A:  # Example.features, length-delimited.
      feats_end, pos = _read_length(buf, pos + 1, end)
      while pos < feats_end:
        entry_tag_pos = pos
        tag = buf[pos]
        if tag != 0x0A:  # Not Features.feature: unknown field.
          tag, pos = _read_varint(buf, pos, feats_end)
          pos = _skip_field(buf, tag, pos, feats_end, entry_tag_pos)
          continue
        entry_end, pos = _read_length(buf, pos + 1, feats_end)
        key = b""
        ranges: list[tuple[int, int]] = []
        while pos < entry_end:
          field_pos = pos
          tag = buf[pos]
          if tag == 0x0A:  # MapEntry.key
            key_end, pos = _read_length(buf, pos + 1, entry_end)
            key = buf[pos:key_end]
            pos = key_end
          elif tag == 0x12:  # MapEntry.value
            value_end, pos = _read_length(buf, pos + 1, entry_end)
            ranges.append((pos, value_end))
            pos = value_end
          else:
            tag, pos = _read_varint(buf, pos, entry_end)
            pos = _skip_field(buf, tag, pos, entry_end, field_pos)
        if wanted is None or key in wanted:
          found[key] = ranges
    else:
      tag, pos = _read_varint(buf, pos, end)
      pos = _skip_field(buf, tag, pos, end, tag_pos)
  return found


def _feature_list(buf: bytes, ranges: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
  """Returns (kind, list-message ranges) of a Feature; kind 0 if unset.

  Follows protobuf merge rules for a oneof: a repeated occurrence of the same
  member merges (its lists concatenate), a different member replaces it.
  """
  kind = 0
  lists: list[tuple[int, int]] = []
  for pos, end in ranges:
    while pos < end:
      tag_pos = pos
      tag = buf[pos]
      field = tag >> 3
      if tag & 7 == 2 and 1 <= field <= 3:
        list_end, pos = _read_length(buf, pos + 1, end)
        if field != kind:
          kind = field
          lists = []
        lists.append((pos, list_end))
        pos = list_end
      else:
        tag, pos = _read_varint(buf, pos, end)
        pos = _skip_field(buf, tag, pos, end, tag_pos)
  return kind, lists


def _to_signed(v: int) -> int:
  v &= _UINT64_MASK
  return v - (1 << 64) if v & _INT64_SIGN else v


def _packed_varints_py(buf: bytes, pos: int, end: int, out: list[int]) -> None:
  while pos < end:
    b = buf[pos]
    if b < 0x80:
      out.append(b)
      pos += 1
    else:
      v, pos = _read_varint(buf, pos, end)
      out.append(_to_signed(v))


def _packed_varints_np(buf: bytes, pos: int, end: int) -> np.ndarray:
  """Vectorized varint decoding of a packed int64 payload."""
  raw = np.frombuffer(buf, np.uint8, count=end - pos, offset=pos)
  last = raw < 0x80  # True on the final byte of each varint.
  if last.all():
    return raw.astype(np.int64)
  if not last[-1]:
    start = pos + int(np.flatnonzero(last)[-1]) + 1 if last.any() else pos
    raise _Malformed(start, "truncated varint")
  ends = np.flatnonzero(last)
  starts = np.empty_like(ends)
  starts[0] = 0
  starts[1:] = ends[:-1] + 1
  lengths = ends - starts + 1
  if lengths.max() > 10:
    raise _Malformed(pos + int(starts[np.argmax(lengths)]), "varint longer than 10 bytes")
  digit = np.arange(raw.size) - np.repeat(starts, lengths)
  # Bits past 64 of a 10-byte varint fall off the uint64, which is exactly
  # protobuf's truncation; viewing as int64 gives two's complement.
  parts = (raw & 0x7F).astype(np.uint64) << (7 * digit).astype(np.uint64)
  return np.bitwise_or.reduceat(parts, starts).view(np.int64)


def _decode_list(buf: bytes, kind: int, lists: list[tuple[int, int]]) -> np.ndarray:
  """Decodes the `value` fields of BytesList/FloatList/Int64List ranges."""
  if kind == _BYTES:
    values: list[Any] = []
    for pos, end in lists:
      while pos < end:
        tag_pos = pos
        tag = buf[pos]
        if tag == 0x0A:
          value_end, pos = _read_length(buf, pos + 1, end)
          values.append(buf[pos:value_end])
          pos = value_end
        else:
          pos = _skip_list_field(buf, pos, end, tag_pos, "bytes_list")
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out

  if kind == _FLOAT:
    pieces: list[np.ndarray] = []
    singles: list[float] = []
    for pos, end in lists:
      while pos < end:
        tag_pos = pos
        tag = buf[pos]
        if tag == 0x0A:  # packed
          value_end, pos = _read_length(buf, pos + 1, end)
          if (value_end - pos) % 4:
            raise _Malformed(tag_pos, f"packed float_list of {value_end - pos} bytes is not a multiple of 4")
          if singles:
            pieces.append(np.array(singles, np.float32))
            singles = []
          pieces.append(np.frombuffer(buf, "<f4", count=(value_end - pos) // 4, offset=pos))
          pos = value_end
        elif tag == 0x0D:  # unpacked fixed32
          if pos + 5 > end:
            raise _Malformed(tag_pos, "truncated float")
          singles.append(_unpack_float(buf, pos + 1)[0])
          pos += 5
        else:
          pos = _skip_list_field(buf, pos, end, tag_pos, "float_list")
    if singles:
      pieces.append(np.array(singles, np.float32))
    if not pieces:
      return np.empty(0, np.float32)
    # Copy (astype) so results are writable and do not pin the record.
    if len(pieces) == 1:
      return pieces[0].astype(np.float32)
    return np.concatenate(pieces).astype(np.float32, copy=False)

  ints: list[int] = []
  arrays: list[np.ndarray] = []
  for pos, end in lists:
    while pos < end:
      tag_pos = pos
      tag = buf[pos]
      if tag == 0x0A:  # packed
        value_end, pos = _read_length(buf, pos + 1, end)
        if value_end - pos >= _NUMPY_VARINT_MIN_BYTES:
          if ints:
            arrays.append(np.array(ints, np.int64))
            ints = []
          arrays.append(_packed_varints_np(buf, pos, value_end))
        else:
          _packed_varints_py(buf, pos, value_end, ints)
        pos = value_end
      elif tag == 0x08:  # unpacked varint
        v, pos = _read_varint(buf, pos + 1, end)
        ints.append(_to_signed(v))
      else:
        pos = _skip_list_field(buf, pos, end, tag_pos, "int64_list")
  if not arrays:
    return np.array(ints, np.int64)
  if ints:
    arrays.append(np.array(ints, np.int64))
  return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _skip_list_field(buf: bytes, pos: int, end: int, tag_pos: int, list_name: str) -> int:
  tag, pos = _read_varint(buf, pos, end)
  if tag >> 3 == 1:
    # `value` with a wire type its type can never have: corruption, not an
    # unknown extension, so do not silently drop it.
    raise _Malformed(tag_pos, f"{list_name}.value has wire type {tag & 7}")
  return _skip_field(buf, tag, pos, end, tag_pos)


# ---------------------------------------------------------------------------
# Public API.


def _present_keys(buf: bytes) -> list[str]:
  try:
    found = _index_features(buf, None)
    return sorted(k.decode("utf-8", "backslashreplace") for k, r in found.items() if _feature_list(buf, r)[0])
  except _Malformed:
    return []


class _ExampleDecoder:
  """Picklable callable that parses one serialized Example (see example_decoder)."""

  def __init__(self, features: Mapping[str, FeatureSpec]):
    if not isinstance(features, Mapping):
      raise TypeError(f"features must be a mapping of name -> feature spec (got {features!r}).")
    specs: dict[bytes, tuple[str, FeatureSpec, int]] = {}
    for name, spec in features.items():
      if not isinstance(spec, (FixedLenFeature, VarLenFeature)):
        raise TypeError(
            f"Feature {name!r}: spec must be FixedLenFeature or VarLenFeature (got {spec!r})."
        )
      specs[name.encode("utf-8")] = (name, spec, _DTYPE_KINDS[spec.dtype.name])
    self._features = dict(features)
    self._specs = specs

  def __repr__(self) -> str:
    return f"example_decoder({self._features!r})"

  def __call__(self, serialized: bytes) -> dict[str, np.ndarray]:
    if not isinstance(serialized, bytes):
      if isinstance(serialized, str):
        raise TypeError("serialized must be bytes, not str.")
      serialized = bytes(serialized)
    buf = serialized
    try:
      found = _index_features(buf, self._specs)
    except _Malformed as e:
      raise ExampleParseError(
          f"Malformed Example at byte {e.offset} of {len(buf)}: {e.what}."
      ) from None
    except IndexError:
      raise ExampleParseError(f"Malformed Example: truncated ({len(buf)} bytes).") from None

    out: dict[str, np.ndarray] = {}
    for key, (name, spec, want) in self._specs.items():
      ranges = found.get(key)
      kind, lists = 0, []
      try:
        if ranges:
          kind, lists = _feature_list(buf, ranges)
        if kind and kind != want:
          raise ExampleParseError(
              f"Feature {name!r}: spec asks for {_SPEC_DTYPE_NAMES[want]} but the "
              f"record has a {_KIND_NAMES[kind]}."
          )
        # As in TF, a Feature with no list set counts as missing.
        values = _decode_list(buf, kind, lists) if kind else None
      except _Malformed as e:
        raise ExampleParseError(
            f"Feature {name!r}: malformed Example at byte {e.offset} of {len(buf)}: {e.what}."
        ) from None

      if isinstance(spec, VarLenFeature):
        out[name] = values if values is not None else np.empty(0, spec.dtype)
        continue
      if values is None:
        if spec.default_value is None:
          raise ExampleParseError(
              f"Feature {name!r} is required (no default_value) but missing from "
              f"the record. Present features: {_present_keys(buf)}."
          )
        out[name] = spec.default_value.copy()
        continue
      expected = math.prod(spec.shape)
      if values.size != expected:
        raise ExampleParseError(
            f"Feature {name!r} has {values.size} values but FixedLenFeature "
            f"shape {spec.shape} needs {expected}."
        )
      out[name] = values.reshape(spec.shape)
    return out


def example_decoder(features: Mapping[str, FeatureSpec]) -> Any:
  """Returns `fn(serialized) -> dict[str, np.ndarray]` for `Dataset.map`.

  The spec is validated once here rather than per record, and the callable
  pickles cleanly so it can be shipped to multiprocessing workers.

  Args:
    features: Feature name -> FixedLenFeature or VarLenFeature.
  """
  return _ExampleDecoder(features)


def parse_example(serialized: bytes, features: Mapping[str, FeatureSpec]) -> dict[str, np.ndarray]:
  """Parses one serialized `tf.train.Example`, like `tf.io.parse_single_example`.

  Args:
    serialized: The record (bytes, or any bytes-like object).
    features: Feature name -> FixedLenFeature or VarLenFeature. Keys of the
      record that are not in `features` are skipped without being decoded.

  Returns:
    Name -> numpy array: `spec.shape` for FixedLenFeature, 1-D for
    VarLenFeature; int64, float32, or object (holding `bytes`).

  Raises:
    ExampleParseError: A required key is missing, a value has the wrong type
      or count, or the record is not a valid Example.
  """
  return _ExampleDecoder(features)(serialized)


def parse_examples(
    serialized: Iterable[bytes], features: Mapping[str, FeatureSpec]
) -> dict[str, np.ndarray]:
  """Parses a batch of serialized Examples, like `tf.io.parse_example`.

  Args:
    serialized: Records to parse.
    features: As for `parse_example`.

  Returns:
    Name -> array with a leading batch dimension. FixedLenFeature values are
    stacked to `(batch, *shape)`; VarLenFeature values, which are ragged,
    come back as a 1-D object array holding one 1-D array per record.

  Raises:
    ExampleParseError: As for `parse_example`; the message names the record
      index.
  """
  decode = _ExampleDecoder(features)
  rows = []
  for i, record in enumerate(serialized):
    try:
      rows.append(decode(record))
    except ExampleParseError as e:
      raise ExampleParseError(f"Record {i}: {e}") from None
  out: dict[str, np.ndarray] = {}
  for name, spec in features.items():
    if isinstance(spec, FixedLenFeature):
      if rows:
        out[name] = np.stack([row[name] for row in rows])
      else:
        out[name] = np.empty((0, *spec.shape), spec.dtype)
    else:
      # Filled one by one: slice assignment would stack equal-length rows.
      ragged = np.empty(len(rows), dtype=object)
      for i, row in enumerate(rows):
        ragged[i] = row[name]
      out[name] = ragged
  return out
