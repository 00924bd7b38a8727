"""Reads the layout of a TFDS dataset directory; decodes its records.

A prepared TFDS dataset is one folder per version,

  ~/tensorflow_datasets/mnist/3.0.1/
    dataset_info.json        splits, shard lengths, file format(s), name
    features.json            feature spec (+ e.g. `label.labels.txt`)
    mnist-train.array_record-00000-of-00001

Shard names come from each split's `filepathTemplate` (default
`{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`). This module reads the layout
from dataset_info.json with the standard library only; tensorflow_datasets is
imported only by the functions that decode features or resolve split slicing.

  files = tfds_array_record_files("~/tensorflow_datasets/mnist/3.0.1", "train")
  decode = tfds_feature_decoder("~/tensorflow_datasets/mnist/3.0.1")
  decode(record)  # {"image": array(...), "label": 3}
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ARRAY_RECORD",
    "DATASET_INFO_NAME",
    "DEFAULT_FILEPATH_TEMPLATE",
    "NotATfdsDatasetError",
    "ShardSlice",
    "available_file_formats",
    "filepath_template",
    "read_dataset_info",
    "shard_lengths",
    "shard_name_regex",
    "shard_relpaths",
    "split_names",
    "tfds_array_record_files",
    "tfds_feature_decoder",
    "tfds_read_instructions",
]

ARRAY_RECORD = "array_record"
DATASET_INFO_NAME = "dataset_info.json"
DEFAULT_FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_TEMPLATE_VARS = ("DATASET", "SPLIT", "FILEFORMAT", "SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y")
_MIN_SHARD_DIGITS = 5  # As tensorflow_datasets.core.naming.
_TFDS_HINT = ("Install tensorflow-datasets (pip install 'arrayrecord-toolkit[tfds]' or "
              "pip install tensorflow-datasets).")


class NotATfdsDatasetError(ValueError):
  """A directory is not one prepared TFDS dataset version."""


def _is_local(path: str) -> bool:
  return re.match(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://", path) is None


def _join(directory: str, relpath: str) -> str:
  if _is_local(directory):
    return os.path.join(directory, relpath)
  return posixpath.join(directory.rstrip("/"), relpath)


def _normalize_dir(dataset_dir: str | os.PathLike) -> str:
  path = os.fspath(dataset_dir)
  if not isinstance(path, str) or not path:
    raise TypeError(f"dataset_dir must be a non-empty path, got {dataset_dir!r}.")
  return os.path.expanduser(path) if _is_local(path) else path.rstrip("/")


def _read_text(path: str) -> str | None:
  """The file's text, or None if it does not exist (local or any Beam filesystem)."""
  if _is_local(path):
    try:
      with open(path, encoding="utf-8") as f:
        return f.read()
    except FileNotFoundError:
      return None
  from apache_beam.io.filesystems import FileSystems  # Only for gs:// and other URIs.
  if not FileSystems.exists(path):
    return None
  with FileSystems.open(path) as f:
    return f.read().decode("utf-8")


def _versions_below(directory: str, depth: int = 3) -> list[str]:
  """Local dataset version folders under `directory`, for the error message."""
  found = []
  for root, dirs, files in os.walk(directory):
    if DATASET_INFO_NAME in files:
      found.append(root)
    if root[len(directory):].count(os.sep) >= depth - 1:
      dirs[:] = []
    dirs[:] = sorted(d for d in dirs if not d.startswith(("incomplete.", ".")))
  return sorted(found)[:5]


def read_dataset_info(dataset_dir: str | os.PathLike) -> dict[str, Any]:
  """The parsed dataset_info.json of a dataset version folder.

  Raises:
    NotATfdsDatasetError: the folder has no (readable) dataset_info.json.
  """
  dataset_dir = _normalize_dir(dataset_dir)
  path = _join(dataset_dir, DATASET_INFO_NAME)
  text = _read_text(path)
  if text is None:
    hint = ("Give the folder of one prepared dataset version, e.g. "
            "~/tensorflow_datasets/mnist/3.0.1.")
    if _is_local(dataset_dir) and os.path.isdir(dataset_dir):
      below = _versions_below(dataset_dir)
      if below:
        hint = f"Dataset versions found below it: {below}."
    elif _is_local(dataset_dir):
      hint = "The directory does not exist."
    raise NotATfdsDatasetError(
        f"{dataset_dir!r} is not a TFDS dataset directory: it has no {DATASET_INFO_NAME}. {hint}")
  try:
    info = json.loads(text)
  except json.JSONDecodeError as e:
    raise NotATfdsDatasetError(f"{path!r} is not valid JSON: {e}.") from None
  if (not isinstance(info, dict) or not info.get("name")
      or not isinstance(info.get("splits", []), list)):
    raise NotATfdsDatasetError(
        f"{path!r} does not look like a TFDS dataset_info.json (it needs 'name' and 'splits').")
  for split in info.get("splits", []):
    _check_shard_lengths(path, split)
  return info


def _check_shard_lengths(path: str, split: Any) -> None:
  """Refuses a split whose shardLengths are not record counts (int64s are strings in proto JSON)."""
  if not isinstance(split, dict):
    raise NotATfdsDatasetError(f"{path!r}: a split is {split!r} where an object with 'name' belongs. "
                               "The file is damaged or not written by TFDS; prepare the dataset again.")
  lengths = split.get("shardLengths", [])
  counts = lengths if isinstance(lengths, list) else [lengths]
  bad = [n for n in counts if isinstance(n, bool) or not isinstance(n, (int, str)) or not str(n).isdigit()]
  if bad or not isinstance(lengths, list):
    raise NotATfdsDatasetError(
        f"{path!r}: split {split.get('name')!r} has shardLengths {lengths!r} where a list of record "
        "counts (e.g. [\"1024\", \"1024\"]) belongs. The file is damaged or not written by TFDS; "
        "prepare the dataset again (or restore its dataset_info.json).")


def available_file_formats(info: Mapping[str, Any]) -> list[str]:
  """The main file format first, then the alternative ones (TFDS default: tfrecord)."""
  formats = [info.get("fileFormat") or "tfrecord"]
  formats += [f for f in info.get("alternativeFileFormats", []) if f not in formats]
  return formats


def split_names(info: Mapping[str, Any]) -> list[str]:
  return [s["name"] for s in info.get("splits", [])]


def _split(info: Mapping[str, Any], split: str) -> Mapping[str, Any]:
  for s in info.get("splits", []):
    if s.get("name") == split:
      return s
  raise ValueError(
      f"Split {split!r} is not in dataset {info.get('name')!r}; available splits: "
      f"{split_names(info)}.")


def shard_lengths(info: Mapping[str, Any], split: str) -> list[int]:
  """Records per shard of a split (int64s are strings in proto JSON)."""
  return [int(n) for n in _split(info, split).get("shardLengths", [])]


def _check_template(template: str) -> None:
  for _, field, _, _ in string.Formatter().parse(template):
    if field is not None and field not in _TEMPLATE_VARS:
      raise ValueError(
          f"Unknown variable {{{field}}} in filepathTemplate {template!r}. Valid variables: "
          f"{', '.join('{' + v + '}' for v in _TEMPLATE_VARS)}.")


def filepath_template(info: Mapping[str, Any], split: str) -> str:
  template = _split(info, split).get("filepathTemplate") or DEFAULT_FILEPATH_TEMPLATE
  _check_template(template)
  return template


def shard_relpaths(info: Mapping[str, Any], split: str, file_format: str) -> list[str]:
  """Shard paths of a split relative to the dataset folder, in record order.

  Follows tensorflow_datasets.core.naming.ShardedFileTemplate: shard numbers
  have at least 5 digits, more if the shard count needs them.
  """
  template = filepath_template(info, split)
  n = len(_split(info, split).get("shardLengths", []))
  width = max(len(str(n)), _MIN_SHARD_DIGITS)
  out = []
  for i in range(n):
    index, count = f"{i:0{width}d}", f"{n:0{width}d}"
    out.append(template.format(DATASET=info["name"], SPLIT=split, FILEFORMAT=file_format,
                               SHARD_INDEX=index, NUM_SHARDS=count,
                               SHARD_X_OF_Y=f"{index}-of-{count}"))
  return out


def shard_name_regex(info: Mapping[str, Any], split: str) -> re.Pattern[str]:
  """Matches the relative path of any shard of the split, in any file format."""
  parts = []
  for literal, field, _, _ in string.Formatter().parse(filepath_template(info, split)):
    parts.append(re.escape(literal))
    if field is not None:
      parts.append({
          "DATASET": re.escape(info["name"]),
          "SPLIT": re.escape(split),
          "FILEFORMAT": r"\w+",
          "SHARD_INDEX": r"\d{5,}",
          "NUM_SHARDS": r"\d{5,}",
          "SHARD_X_OF_Y": r"\d{5,}-of-\d{5,}",
      }[field])
  return re.compile("".join(parts) + "$")


def _parse_split_arg(split: str) -> list[str]:
  if not isinstance(split, str) or not split.strip():
    raise ValueError(f"split must be a split name such as 'train', got {split!r}.")
  if "[" in split or "(" in split:
    raise ValueError(
        f"Split slicing ({split!r}) selects records, not files. Use "
        "tfds_read_instructions(dataset_dir, split) for a list of (file, start, stop) "
        "ranges, or give whole split names ('train' or 'train+test').")
  return [s.strip() for s in split.split("+")]


def _require_array_record(dataset_dir: str, info: Mapping[str, Any]) -> None:
  formats = available_file_formats(info)
  if ARRAY_RECORD not in formats:
    raise ValueError(
        f"TFDS dataset {dataset_dir!r} has no ArrayRecord files (its file formats: {formats}). "
        f"Convert it first: arrayrecord-tfds --dataset_dir {dataset_dir}")


def tfds_array_record_files(dataset_dir: str | os.PathLike, split: str) -> list[str]:
  """Ordered ArrayRecord shard paths of a split of a TFDS dataset folder.

  Args:
    dataset_dir: One dataset version folder (the one with dataset_info.json).
    split: A split name, or several joined with '+' ('train+validation');
      their shards are listed in that order. Slicing ('train[:10%]') is not a
      file list: see tfds_read_instructions.

  Raises:
    NotATfdsDatasetError: no dataset_info.json in dataset_dir.
    ValueError: unknown split, or the dataset has no ArrayRecord files.
    FileNotFoundError: a local shard named by dataset_info.json is missing.
  """
  dataset_dir = _normalize_dir(dataset_dir)
  names = _parse_split_arg(split)
  info = read_dataset_info(dataset_dir)
  _require_array_record(dataset_dir, info)
  files = []
  for name in names:
    files += [_join(dataset_dir, r) for r in shard_relpaths(info, name, ARRAY_RECORD)]
  if not files:  # A split TFDS lists with no shards (no examples): nothing to read.
    raise ValueError(f"Split {split!r} of {dataset_dir} has no shards ({DATASET_INFO_NAME} lists none): "
                     "it holds no examples to read.")
  if _is_local(dataset_dir):
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
      raise FileNotFoundError(
          f"{len(missing)} ArrayRecord shard(s) named by {DATASET_INFO_NAME} are missing, "
          f"e.g. {missing[0]!r}. Re-run the conversion (arrayrecord-tfds --dataset_dir "
          f"{dataset_dir} --skip-existing).")
    _refuse_unfinished_conversion(dataset_dir)
  return files


def _refuse_unfinished_conversion(dataset_dir: str) -> None:
  """Raises IncompleteManifestError while a conversion into `dataset_dir` has not finished.

  Its shards may then be a mix of old and new data, even where dataset_info.json
  is still there (from before an interrupted --overwrite).
  """
  from loader import ondisk  # pylint: disable=g-import-not-at-top
  try:
    ondisk.read_manifest(dataset_dir)
  except ondisk.IncompleteManifestError:
    raise
  except ondisk.ManifestError:
    pass  # A damaged manifest says nothing of the run; dataset_info.json describes the dataset.


@dataclasses.dataclass(frozen=True)
class ShardSlice:
  """Records [start, stop) of one ArrayRecord shard."""

  path: str
  start: int
  stop: int

  @property
  def num_records(self) -> int:
    return self.stop - self.start


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"Reading TFDS features or split slices needs tensorflow-datasets: {e}. "
                      f"{_TFDS_HINT}") from None
  return tfds


def tfds_read_instructions(dataset_dir: str | os.PathLike, split: str) -> list[ShardSlice]:
  """Which records of which ArrayRecord shards a TFDS split expression selects.

  Accepts everything TFDS accepts ('train[:10%]', 'train[5:-5]+test',
  'train[:50%](pct1_dropremainder)'), resolved by tensorflow_datasets itself.
  Shards the selection does not touch are left out.
  """
  dataset_dir = _normalize_dir(dataset_dir)
  info = read_dataset_info(dataset_dir)
  _require_array_record(dataset_dir, info)
  tfds = _import_tfds()
  builder_info = tfds.builder_from_directory(dataset_dir).info
  if builder_info.file_format is None or builder_info.file_format.value != ARRAY_RECORD:
    builder_info.set_file_format(ARRAY_RECORD, override=True, override_if_initialized=True)
  try:
    instructions = builder_info.splits[split].file_instructions
  except (KeyError, ValueError, AssertionError) as e:
    raise ValueError(f"Bad split {split!r} for {dataset_dir!r}: {e} Available splits: "
                     f"{split_names(info)}.") from None
  slices = [ShardSlice(path=os.fspath(fi.filename), start=fi.skip, stop=fi.skip + fi.take)
             for fi in instructions if fi.take > 0]
  _check_lengths_match_files(dataset_dir, info, {s.path for s in slices})
  return slices


def _check_lengths_match_files(dataset_dir: str, info: Mapping[str, Any], paths: set[str]) -> None:
  """Refuses slices computed from shardLengths that the local shards contradict (an edited dataset_info.json).

  TFDS cuts a split expression into record ranges from those lengths alone;
  wrong ones would select other records without any error.
  """
  if not _is_local(dataset_dir):
    return
  from loader import source  # pylint: disable=g-import-not-at-top  # Its reader, opened on the footer only.
  wanted = {os.path.abspath(p) for p in paths}
  for split in split_names(info):
    relpaths = shard_relpaths(info, split, ARRAY_RECORD)
    for relpath, expected in zip(relpaths, shard_lengths(info, split)):
      path = _join(dataset_dir, relpath)
      if os.path.abspath(path) not in wanted:
        continue
      try:
        actual, _ = source._count_records(path, "readahead_buffer_size:0")  # pylint: disable=protected-access
      except (OSError, ValueError, RuntimeError):
        continue  # Missing or damaged: reading it says so, naming it.
      if actual != expected:
        raise ValueError(
            f"{_join(dataset_dir, DATASET_INFO_NAME)} says {relpath} (split {split!r}) holds {expected} records, "
            f"but the file holds {actual}: split slices would select other records. Restore the "
            f"{DATASET_INFO_NAME} that came with these shards, or convert the dataset again.")


class _TfdsFeatureDecoder:
  """Picklable: only the folder and decoders travel; features load on first use."""

  def __init__(self, dataset_dir: str, decoders: Any = None):
    self.dataset_dir = dataset_dir
    self.decoders = decoders
    self._features = None

  @property
  def features(self):
    if self._features is None:
      tfds = _import_tfds()
      self._features = tfds.builder_from_directory(self.dataset_dir).info.features
    return self._features

  def __call__(self, record: bytes) -> dict[str, Any]:
    return self.features.deserialize_example_np(record, decoders=self.decoders)

  def __getstate__(self):
    return {"dataset_dir": self.dataset_dir, "decoders": self.decoders, "_features": None}

  def __repr__(self) -> str:
    return f"tfds_feature_decoder({self.dataset_dir!r})"


def tfds_feature_decoder(dataset_dir: str | os.PathLike,
                         decoders: Any = None) -> Callable[[bytes], dict[str, Any]]:
  """A callable decoding one serialized record with the dataset's features.

  Uses `FeaturesDict.deserialize_example_np` of tensorflow_datasets: NumPy
  outputs, no TensorFlow import (images need OpenCV or Pillow). The callable
  pickles as the folder path, so it can go to data-loading worker processes.

  Args:
    dataset_dir: One dataset version folder (with dataset_info.json and
      features.json).
    decoders: Optional TFDS decoders, e.g. `{"image": tfds.decode.SkipDecoding()}`.

  Raises:
    ImportError: tensorflow-datasets is not installed.
    NotATfdsDatasetError: no dataset_info.json in dataset_dir.
  """
  dataset_dir = _normalize_dir(dataset_dir)
  read_dataset_info(dataset_dir)  # A clear error for a wrong folder.
  _check_features_json(dataset_dir)
  decoder = _TfdsFeatureDecoder(dataset_dir, decoders)
  _ = decoder.features  # Fail here, not in a worker, if features.json is bad.
  return decoder


def _check_features_json(dataset_dir: str) -> None:
  """One line naming features.json when it is missing or not JSON (TFDS's own errors point elsewhere)."""
  path = _join(dataset_dir, "features.json")
  fix = "copy it from the TFDS dataset folder that was converted, or convert that folder again"
  text = _read_text(path)
  if text is None:
    raise NotATfdsDatasetError(f"{path} does not exist: decoding records needs the dataset's feature spec; "
                               f"{fix}.")
  try:
    json.loads(text)
  except ValueError as e:
    raise NotATfdsDatasetError(f"{path} is not valid JSON ({e}; cut short?); {fix}.") from None
