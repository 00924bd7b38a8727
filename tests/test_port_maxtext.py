"""MaxText's Grain input pipeline, on Grain 0.2.18 and, with only the import lines changed, on loader.

Source: github.com/AI-Hypercomputer/maxtext, src/maxtext/input_pipeline/
grain_data_processing.py (get_datasets' ArrayRecord branches,
_apply_mapdataset_transforms, pretrain_preprocessing_pipeline),
data_processing_utils.py (parse_and_keep_features, format_and_batch,
apply_multiprocessing_and_prefetch), input_pipeline_utils.py (ParseFeatures,
NormalizeFeatures, Rekey, PadOrTrimToMaxLength's text path, ShiftData),
grain_tokenizer.py (TokenizeAndTrim, TokenizeAndChunk) and
src/maxtext/common/grain_utility.py (the JSON iterator checkpoint). The code is
kept as MaxText writes it, trimmed to the branches used here; what MaxText
gets from elsewhere is replaced by stand-ins: a byte tokenizer for the
SentencePiece/HF tokenizer, a descriptor-built `example_pb2` with
tf.train.Example's wire format for MaxText's generated one, a SimpleNamespace
for the config, and `jax.process_count()` is 1.

Shuffles (the record shuffle, the file shuffle and the window shuffle) are
Grain's, so in one process batches must equal Grain's exactly, shuffled or
not. Grain's worker processes batch each worker's records separately (loader's
stream is the one of 0 workers), so with workers the tests compare the
multiset of rows (one row per record without packing). A state written to
JSON must resume the same stream (loader: also with another worker count).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, same_multiset, structure

MAXTEXT = '''
import dataclasses
import functools
import glob
import json
import threading
import types
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import jax
import numpy as np

import grain.python as grain
from grain.experimental import ElasticIterator
from grain.experimental import BestFitPackIterDataset, pick_performance_config
from grain.experimental import TFRecordIterDataset


# ---- Stand-ins for what MaxText imports from elsewhere ----------------------

def _example_message_class():
  """maxtext.input_pipeline.protos.example_pb2.Example: tf.train.Example's wire format, without TensorFlow."""
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
  pool = descriptor_pool.Default()
  try:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("maxtext_stand_in.Example"))
  except KeyError:
    pass
  F = descriptor_pb2.FieldDescriptorProto
  f = descriptor_pb2.FileDescriptorProto(name="maxtext_stand_in/example.proto", package="maxtext_stand_in",
                                         syntax="proto3")
  for name, kind in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64)):
    f.message_type.add(name=name).field.add(name="value", number=1, label=F.LABEL_REPEATED, type=kind)
  feature = f.message_type.add(name="Feature")
  feature.oneof_decl.add(name="kind")
  for number, (name, kind) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                         ("int64_list", "Int64List")), 1):
    feature.field.add(name=name, number=number, label=F.LABEL_OPTIONAL, type=F.TYPE_MESSAGE,
                      type_name=f".maxtext_stand_in.{kind}", oneof_index=0)
  features = f.message_type.add(name="Features")
  entry = features.nested_type.add(name="FeatureEntry")
  entry.options.map_entry = True
  entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
  entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL, type=F.TYPE_MESSAGE,
                  type_name=".maxtext_stand_in.Feature")
  features.field.add(name="feature", number=1, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                     type_name=".maxtext_stand_in.Features.FeatureEntry")
  f.message_type.add(name="Example").field.add(name="features", number=1, label=F.LABEL_OPTIONAL,
                                              type=F.TYPE_MESSAGE, type_name=".maxtext_stand_in.Features")
  try:
    pool.Add(f)
  except (TypeError, ValueError):  # Another thread added it first.
    pass
  return message_factory.GetMessageClass(pool.FindMessageTypeByName("maxtext_stand_in.Example"))


example_pb2 = types.SimpleNamespace(Example=lambda: _example_message_class()())


class ByteTokenizer:
  """Stands in for MaxText's SentencePiece/HF tokenizer: one id per byte."""
  pad_id = 0
  unk_id = 2
  bos_id = 1

  def encode(self, text):
    return [b + 3 for b in text.encode()]


def build_tokenizer(tokenizer_path, tokenizer_type, add_bos, add_eos, hf_access_token=None):
  return ByteTokenizer()


# ---- input_pipeline_utils.py ------------------------------------------------

def make_tfrecord_iter_dataset(path: str):
  """Returns the appropriate TFRecordIterDataset for local or GCS paths."""
  # MaxText reads gs:// paths with subclasses of Grain-internal readers (grain._src...):
  # see GCS_TFRECORD below; the drivers here read local paths with the public class.
  return TFRecordIterDataset(path)


def compute_file_sharding(file_count, host_index, host_count):
  """Compute per-host file slicing and optional row-shard parameters."""
  if file_count >= host_count:
    return slice(host_index, None, host_count), max(file_count // host_count, 1), None
  file_idx = host_index % file_count
  row_shard_idx = host_index // file_count
  row_shard_count = (host_count // file_count) + (1 if file_idx < (host_count % file_count) else 0)
  row_shard = (row_shard_idx, row_shard_count) if row_shard_count > 1 else None
  return slice(file_idx, None, file_count), 1, row_shard


class _IndexShardDatasetIterator(grain.DatasetIterator):
  """Iterator that yields every nth element of its parent (round-robin by index)."""

  def __init__(self, parent: grain.DatasetIterator, host_index: int, host_count: int):
    super().__init__(parent)
    self._host_index = host_index
    self._host_count = host_count
    self._next_index = 0

  def __next__(self):
    while True:
      value = next(self._parent)
      current = self._next_index
      self._next_index += 1
      if current % self._host_count == self._host_index:
        return value

  def get_state(self):
    return {
        "next_index": self._next_index,
        "parent": self._parent.get_state(),
    }

  def set_state(self, state):
    self._next_index = state["next_index"]
    self._parent.set_state(state["parent"])


class IndexShardIterDataset(grain.IterDataset):
  """Shards an IterDataset across hosts by element index (host i keeps records where idx % N == i)."""

  def __init__(self, parent: grain.IterDataset, host_index: int, host_count: int):
    super().__init__(parent)
    self._host_index = host_index
    self._host_count = host_count

  def __iter__(self) -> _IndexShardDatasetIterator:
    return _IndexShardDatasetIterator(
        self._parent.__iter__(),
        host_index=self._host_index,
        host_count=self._host_count,
    )


class ParseFeatures(grain.MapTransform):
  """Parse serialized tf.train.Example protos for arrayrecord/tfrecord datasets."""

  def __init__(self, data_columns, tokenize):
    self.data_columns = list(data_columns)
    self.tokenize = tokenize

  def map(self, element):
    """Parse a serialized tf.train.Example proto and extract features."""
    example = example_pb2.Example()
    example.ParseFromString(element)
    features = example.features.feature

    missing = [c for c in self.data_columns if c not in features]
    if missing:
      raise ValueError(
          f"Column {missing} not found in dataset. Available columns: {sorted(features.keys())}. "
          "Please set train_data_columns or eval_data_columns accordingly."
      )

    parsed = {}
    for col in self.data_columns:
      if col in features:
        f = features[col]

        # Dynamically check proto field type instead of relying on the tokenize flag
        if len(f.float_list.value) > 0:
          parsed[col] = np.array(f.float_list.value, dtype=np.float32)
        elif len(f.int64_list.value) > 0:
          parsed[col] = np.array(f.int64_list.value, dtype=np.int32)
        elif len(f.bytes_list.value) > 0:
          parsed[col] = np.array(f.bytes_list.value, dtype=object)
        else:
          parsed[col] = np.array([])

    return parsed


@dataclasses.dataclass
class NormalizeFeatures(grain.MapTransform):
  """Normalize text feature keys."""

  def __init__(self, column_names, tokenize):
    self.column_names = column_names
    self.tokenize = tokenize

  def map(self, element):
    if self.tokenize:
      return {col: element[col][0].decode() for col in self.column_names}
    else:
      return {col: element[col] for col in self.column_names}


@dataclasses.dataclass
class Rekey(grain.MapTransform):
  """Rename keys according to a mapping dict"""

  def __init__(self, mapping_dict, keep_old_keys=False):
    self.mapping_dict = mapping_dict
    self.keep_old_keys = keep_old_keys

  def map(self, element):
    old_keys = set()
    for new_key, old_key in self.mapping_dict.items():
      element[new_key] = element[old_key]
      old_keys.add(old_key)
    if not self.keep_old_keys:
      for key in old_keys:
        del element[key]
    return element


@dataclasses.dataclass
class PadOrTrimToMaxLength(grain.MapTransform):
  """Pads or trims each input to the specified length (the text path)."""

  def __init__(self, max_length: int, pad_id: int = 0, add_true_length: bool = False):
    self.max_length = max_length
    self.pad_id = pad_id
    self.add_true_length = add_true_length

  def _pad_text(self, x: np.ndarray, max_length: int, pad_id: int) -> np.ndarray:
    pad_amount = max(max_length - x.shape[0], 0)
    pad_amount = [(0, pad_amount)] + [(0, 0)] * (len(x.shape) - 1)
    return np.pad(x, pad_amount, constant_values=pad_id)[: self.max_length]

  def map(self, element):
    """map to each element"""
    data_columns = list(element.keys())
    for data_column in data_columns:
      element[f"{data_column}_segmentation"] = (element[data_column] != self.pad_id)
      element[f"{data_column}_segmentation"] = element[f"{data_column}_segmentation"].astype(np.int32)
      element[f"{data_column}_position"] = np.arange(element[data_column].shape[0], dtype=np.int32)
      if self.add_true_length:
        element[f"{data_column}_true_length"] = np.array([element[data_column].shape[0]], dtype=np.int32)
    for key, _ in element.items():
      if "true_length" not in key:
        element[key] = self._pad_text(element[key], self.max_length, self.pad_id)
    return element


def shift_left(x, pad_id, axis=1):
  """Shift to the left and pad."""
  pad_widths = [(0, 0)] * len(x.shape)
  pad_widths[axis] = (0, 1)
  slices = [
      slice(None),
  ] * len(x.shape)
  slices[axis] = slice(1, None)
  padded = np.pad(x, pad_widths, mode="constant", constant_values=x.dtype.type(pad_id))
  return padded[tuple(slices)]


def shift_and_refine(x, ignored_ids, axis=1):
  """Shift inputs, set segmentation to 0 when target element is in ignored_ids if provided"""
  x["targets"] = shift_left(x["targets"], ignored_ids[0], axis=axis)
  x["targets_segmentation"] = shift_left(x["targets_segmentation"], 0, axis=axis)
  for ignore_id in ignored_ids:
    x["targets_segmentation"] = np.where(x["targets"] != ignore_id, x["targets_segmentation"], 0)

  return x


@dataclasses.dataclass
class ShiftData(grain.MapTransform):
  """Shift inputs and refine annotations."""

  def __init__(self, ignored_ids, axis=1):
    self.ignored_ids = ignored_ids
    self.axis = axis

  def map(self, element):
    return shift_and_refine(element, ignored_ids=self.ignored_ids, axis=self.axis)


# ---- grain_tokenizer.py -----------------------------------------------------

@dataclasses.dataclass
class TokenizerTransformBase:
  """Base class for tokenizer transforms with common functionality."""

  # pylint: disable=attribute-defined-outside-init
  feature_names: str | Sequence[str]
  sequence_length: int | Sequence[int]
  tokenizer: Any

  def __post_init__(self):
    self._processor = None
    self._initialize_processor_lock = threading.Lock()
    # Convert single values to lists for consistent processing
    if isinstance(self.feature_names, str):
      self.feature_names = [self.feature_names]
    if isinstance(self.sequence_length, int):
      self.sequence_length = [self.sequence_length] * len(self.feature_names)

  def _get_processor(self):
    if self._processor is None:
      with self._initialize_processor_lock:
        if self._processor is None:  # Ensures only one thread initializes processor.
          self._processor = self.tokenizer
    return self._processor

  def _encode(self, text: str) -> list[int]:
    """Common method to encode text using the tokenizer."""
    processor = self._get_processor()
    return processor.encode(text)

  def __getstate__(self):
    state = self.__dict__.copy()
    del state["_processor"]
    del state["_initialize_processor_lock"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._processor = None
    self._initialize_processor_lock = threading.Lock()


@dataclasses.dataclass
class TokenizeAndTrim(TokenizerTransformBase, grain.MapTransform):
  """Tokenize and trim features to sequence length."""

  def map(self, element: dict[str, Any]) -> dict[str, Any]:
    """Maps to each element."""
    for feature_name, max_length in zip(self.feature_names, self.sequence_length, strict=True):
      text = element[feature_name]
      token_ids = self._encode(text)[:max_length]
      element[feature_name] = np.asarray(token_ids, dtype=np.int32)
    return element


@dataclasses.dataclass
class TokenizeAndChunk(TokenizerTransformBase, grain.experimental.FlatMapTransform):
  """Tokenize and chunk features into multiple examples of sequence length."""

  max_fan_out: int = 2048

  def __post_init__(self):
    super().__post_init__()
    # TokenizeAndChunk only supports single feature for chunking
    assert len(self.feature_names) == 1, "TokenizeAndChunk only supports single feature name"
    assert len(self.sequence_length) == 1, "TokenizeAndChunk only supports single sequence length"
    self.feature_name = self.feature_names[0]  # For backward compatibility
    self.sequence_length = self.sequence_length[0]  # Convert back to int for chunking

  def flat_map(self, element: dict[str, Any]) -> list[dict[str, Any]]:
    """Tokenize and chunk text into multiple examples of sequence length."""
    text = element[self.feature_name]
    chunk_size = self.sequence_length

    token_ids = self._encode(text)

    if not token_ids:
      return []

    output_elements = []
    for start_idx in range(0, len(token_ids), chunk_size):
      chunk = np.asarray(token_ids[start_idx : start_idx + chunk_size], dtype=np.int32)
      new_element = {self.feature_name: chunk}
      output_elements.append(new_element)

    return output_elements


# ---- data_processing_utils.py -----------------------------------------------

def parse_and_keep_features(dataset, config, data_columns, tokenize):
  """Parse arrayrecord features or keep specified columns for other formats."""
  dataset = dataset.map(ParseFeatures(data_columns, tokenize))
  dataset = dataset.map(NormalizeFeatures(data_columns, tokenize))
  return dataset


def get_tokenizer_and_pad_id(config):
  """Builds tokenizer and extracts pad_id safely."""
  tokenizer_model = build_tokenizer(
      config.tokenizer_path,
      config.tokenizer_type,
      config.add_bos,
      config.add_eos,
      config.hf_access_token,
  )
  if tokenizer_model.pad_id is not None:
    pad_id = tokenizer_model.pad_id
  elif tokenizer_model.unk_id is not None:
    pad_id = tokenizer_model.unk_id
  else:
    pad_id = 0
  return tokenizer_model, pad_id


def get_local_batch_size(config):
  """Computes local batch size based on process count and expansion factor."""
  batch_size = config.global_batch_size_to_load // jax.process_count()
  return batch_size


def format_and_batch(dataset, config, batch_size, pad_id, data_columns, tokenizer_model, shift=True):
  """Packs or pads the dataset, batches it, and optionally shifts tokens for next-token prediction."""
  if config.packing:
    length_struct = {col: config.max_target_length for col in data_columns}
    max_segments = config.max_segments_per_seq
    if max_segments is not None and max_segments <= 0:
      max_segments = None
    if config.grain_packing_type == "first_fit":
      dataset = grain.experimental.FirstFitPackIterDataset(
          dataset,
          length_struct=length_struct,
          num_packing_bins=batch_size,
          max_sequences_per_bin=max_segments,
      )
    elif config.grain_packing_type == "best_fit":
      dataset = BestFitPackIterDataset(dataset, length_struct=length_struct, num_packing_bins=batch_size)
    elif config.grain_packing_type == "concat_then_split":
      if config.add_bos and hasattr(tokenizer_model, "bos_id"):
        dataset = grain.experimental.ConcatThenSplitIterDataset(
            dataset,
            length_struct=length_struct,
            bos_handling=grain.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
            bos_token_id=tokenizer_model.bos_id,
        )
      else:
        dataset = grain.experimental.ConcatThenSplitIterDataset(dataset, length_struct=length_struct)
    else:
      raise ValueError(f"Unknown packing type: {config.packing}")

    rekey_dict = {
        "targets_segmentation": "targets_segment_ids",
        "inputs_segmentation": "inputs_segment_ids",
        "targets_position": "targets_positions",
        "inputs_position": "inputs_positions",
    }
    dataset = dataset.map(Rekey(rekey_dict))
  else:
    dataset = dataset.map(PadOrTrimToMaxLength(config.max_target_length, pad_id))

  if config.grain_use_elastic_iterator:
    # ElasticIterator batches internally, so return the pre-batch dataset.
    if shift:
      dataset = dataset.map(ShiftData(ignored_ids=[pad_id], axis=0))
    return dataset

  batch_fn = functools.partial(grain.experimental.batch_and_pad, batch_size=batch_size, pad_value=pad_id)
  dataset = dataset.batch(batch_size, batch_fn=batch_fn)
  if shift:
    dataset = dataset.map(ShiftData(ignored_ids=[pad_id], axis=1))
  return dataset


def apply_multiprocessing_and_prefetch(dataset, config, grain_worker_count, grain_per_worker_buffer_size):
  """Applies multiprocessing and prefetching configurations to the dataset."""
  if config.grain_use_elastic_iterator:
    # ElasticIterator applies multiprocessing itself.
    return dataset
  multiprocessing_options = (
      pick_performance_config(
          ds=dataset,
          ram_budget_mb=config.grain_ram_budget_mb,
          max_workers=None,
          max_buffer_size=None,
      ).multiprocessing_options
      if grain_worker_count == -1
      else grain.MultiprocessingOptions(
          num_workers=grain_worker_count,
          per_worker_buffer_size=grain_per_worker_buffer_size,
      )
  )
  return dataset.mp_prefetch(multiprocessing_options)


# ---- grain_data_processing.py -----------------------------------------------

def find_data_files(data_file_pattern, hf_access_token=None):
  """Find data files matching the pattern."""
  data_files = glob.glob(str(Path(data_file_pattern).expanduser().resolve()))
  if not data_files:
    raise FileNotFoundError(f"No files found matching pattern: {data_file_pattern}")
  return data_files


def _apply_mapdataset_transforms(
    dataset,
    shuffle,
    shuffle_seed,
    num_epoch,
    dataloading_host_index,
    dataloading_host_count,
    grain_num_threads,
    grain_prefetch_buffer_size,
    elastic=False,
):
  """Apply standard shuffle, repeat, shard, and iter conversion transforms."""
  if shuffle:
    dataset = dataset.shuffle(seed=shuffle_seed)
  dataset = dataset.repeat(num_epoch)
  if elastic:
    return dataset
  dataset = dataset[dataloading_host_index::dataloading_host_count]  # sharding
  dataset = dataset.to_iter_dataset(
      read_options=grain.ReadOptions(
          num_threads=grain_num_threads,
          prefetch_buffer_size=grain_prefetch_buffer_size,
      )
  )
  return dataset


def get_datasets(
    data_file_pattern,
    data_file_type,
    shuffle,
    shuffle_seed,
    shuffle_buffer_size,
    num_epoch,
    dataloading_host_index,
    dataloading_host_count,
    grain_worker_count,
    grain_num_threads,
    grain_prefetch_buffer_size,
    grain_data_source_max_workers,
    mixture_config_path=None,
    elastic=False,
    hf_access_token=None,
    grain_index_storage_option=None,
):
  """Load dataset from array_record files for using with grain"""
  if data_file_type == "arrayrecord":
    # Helper function to find files, create data source, and wrap in MapDataset
    def create_dataset_from_pattern(pattern):
      files = find_data_files(pattern, hf_access_token=hf_access_token)
      reader_options = (
          {"index_storage_option": grain_index_storage_option} if grain_index_storage_option is not None else None
      )
      source = grain.ArrayRecordDataSource(files, reader_options=reader_options)
      return grain.MapDataset.source(source)

    # Handle mixture config with named datasets, allows flexibility in recovering checkpoints
    if mixture_config_path:
      with open(mixture_config_path, "r", encoding="utf-8") as f:
        mixture_config = json.load(f)

      paths = [config["path"] for config in mixture_config.values()]
      weights = [float(config["weight"]) for config in mixture_config.values()]

      executor = futures.ThreadPoolExecutor(max_workers=grain_data_source_max_workers)
      dataset_list = list(executor.map(create_dataset_from_pattern, paths))
      executor.shutdown(wait=True)

      datasets_dict = dict(zip(mixture_config.keys(), dataset_list))

      for name, ds in datasets_dict.items():
        datasets_dict[name] = _apply_mapdataset_transforms(
            ds,
            shuffle,
            shuffle_seed,
            num_epoch,
            dataloading_host_index,
            dataloading_host_count,
            grain_num_threads,
            grain_prefetch_buffer_size,
        )

      # Normalize weights
      total_weight = sum(weights)
      weights_dict = {name: weight / total_weight for name, weight in zip(mixture_config.keys(), weights)}

      dataset = grain.IterDataset.mix(datasets_dict, weights_dict)
      return dataset
    elif ";" in data_file_pattern:
      data_file_patterns, weights = zip(*[pattern.split(",") for pattern in data_file_pattern.split(";")])
      assert len(data_file_patterns) == len(weights), "Number of data file patterns and weights must match"
      weights = [float(weight) for weight in weights]
      weights = [round(weight / sum(weights), 4) for weight in weights]

      executor = futures.ThreadPoolExecutor(max_workers=grain_data_source_max_workers)
      dataset_list = list(executor.map(create_dataset_from_pattern, data_file_patterns))
      executor.shutdown(wait=True)

      for d, _ in enumerate(dataset_list):
        dataset_list[d] = _apply_mapdataset_transforms(
            dataset_list[d],
            shuffle,
            shuffle_seed,
            num_epoch,
            dataloading_host_index,
            dataloading_host_count,
            grain_num_threads,
            grain_prefetch_buffer_size,
        )
      dataset = grain.IterDataset.mix(dataset_list, weights)
      return dataset
    else:
      # Single pattern case - no need for parallelization
      dataset = create_dataset_from_pattern(data_file_pattern)
      dataset = _apply_mapdataset_transforms(
          dataset,
          shuffle,
          shuffle_seed,
          num_epoch,
          dataloading_host_index,
          dataloading_host_count,
          grain_num_threads,
          grain_prefetch_buffer_size,
          elastic=elastic,
      )
      return dataset
  elif data_file_type in ("tfrecord",):
    data_files = find_data_files(data_file_pattern, hf_access_token=hf_access_token)
    file_slice, files_per_host, row_shard = compute_file_sharding(
        len(data_files), dataloading_host_index, dataloading_host_count
    )
    if grain_worker_count > files_per_host:
      raise ValueError(
          f"grain_worker_count ({grain_worker_count}) exceeds the number of {data_file_type} files "
          f"per host ({files_per_host}). "
          f"Lower grain_worker_count to at most {files_per_host}."
      )
    dataset = grain.MapDataset.source(data_files)
    if shuffle:
      dataset = dataset.shuffle(seed=shuffle_seed)
    dataset = dataset.repeat(num_epoch)
    dataset = dataset[file_slice]
    dataset = dataset.map(make_tfrecord_iter_dataset)
    cycle_length = min(files_per_host, grain_num_threads)
    dataset = grain.experimental.InterleaveIterDataset(dataset, cycle_length=cycle_length)
    if row_shard is not None:
      dataset = IndexShardIterDataset(dataset, host_index=row_shard[0], host_count=row_shard[1])
    if shuffle:
      dataset = grain.experimental.WindowShuffleIterDataset(dataset, window_size=shuffle_buffer_size, seed=shuffle_seed)
    return dataset
  raise ValueError(f"grain pipeline supports (arrayrecord, tfrecord) as grain_file_type here, but got {data_file_type}")


def pretrain_preprocessing_pipeline(
    dataset,
    config,
    data_columns,
    tokenize,
    grain_worker_count,
    grain_per_worker_buffer_size,
):
  """Use grain pipeline to pre-process the dataset and return iterators for pretrain"""
  columns_to_parse = list(data_columns)
  dataset = parse_and_keep_features(dataset, config, columns_to_parse, tokenize)

  assert len(data_columns) == 1
  text_column = data_columns[0]

  tokenizer_model, pad_id = get_tokenizer_and_pad_id(config)

  if tokenize:
    if config.use_truncation:
      dataset = dataset.map(TokenizeAndTrim(text_column, config.max_target_length, tokenizer_model))
    else:
      dataset = dataset.apply(TokenizeAndChunk(text_column, config.max_target_length, tokenizer_model))

  pipeline_columns = ["inputs", "targets"]
  rekey_dict = {col: text_column for col in pipeline_columns}

  dataset = dataset.map(Rekey(rekey_dict, keep_old_keys=False))

  batch_size = get_local_batch_size(config)
  dataset = format_and_batch(dataset, config, batch_size, pad_id, tuple(pipeline_columns), tokenizer_model)

  dataset = apply_multiprocessing_and_prefetch(dataset, config, grain_worker_count, grain_per_worker_buffer_size)
  return dataset


def _make_elastic_iterator(dataset, config, preprocessing_fn, shard_index=None, shard_count=None, mp_opts=None):
  """Applies preprocessing_fn then wraps the result with ElasticIterator."""
  ds = preprocessing_fn(dataset=dataset)
  return ElasticIterator(
      ds,
      global_batch_size=config.global_batch_size_to_load,
      shard_options=grain.ShardOptions(
          shard_index=shard_index if shard_index is not None else jax.process_index(),
          shard_count=shard_count if shard_count is not None else jax.process_count(),
      ),
      read_options=grain.ReadOptions(
          num_threads=config.grain_num_threads,
          prefetch_buffer_size=config.grain_prefetch_buffer_size,
      ),
      multiprocessing_options=mp_opts,
  )


# ---- common/grain_utility.py: the iterator's JSON checkpoint ----------------

def _state_to_text(iterator) -> str:
  """Serializes an iterator's state (grain DatasetIterator -> json, else bytes)."""
  if isinstance(iterator, grain.DatasetIterator):
    return json.dumps(iterator.get_state(), indent=4)
  return iterator.get_state().decode()


def _set_state_from_text(iterator, text: str) -> None:
  """Inverse of :func:`_state_to_text`."""
  if isinstance(iterator, grain.DatasetIterator):
    iterator.set_state(json.loads(text))
  else:
    iterator.set_state(text.encode())


# ---- The training job: config, one host's iterator, checkpoint files --------

def make_config(**overrides):
  config = dict(
      grain_train_files=train_files, grain_file_type="arrayrecord", enable_data_shuffling=False,
      data_shuffle_seed=7, grain_shuffle_buffer_size=100, num_epoch=1, grain_worker_count=0,
      grain_per_worker_buffer_size=2, grain_num_threads=2, grain_prefetch_buffer_size=16,
      grain_data_source_max_workers=2, grain_index_storage_option=None, grain_train_mixture_config_path=None,
      grain_ram_budget_mb=1024, train_data_columns=["text"], tokenize_train_data=True, use_truncation=True,
      max_target_length=32, global_batch_size_to_load=4, packing=False, grain_packing_type="first_fit",
      max_segments_per_seq=None, tokenizer_path="stand-in", tokenizer_type="bytes", add_bos=False, add_eos=False,
      hf_access_token=None, grain_use_elastic_iterator=False)
  config.update(overrides)
  return types.SimpleNamespace(**config)


def make_train_iterator(config, dataloading_host_index=0, dataloading_host_count=1):
  train_ds = get_datasets(
      config.grain_train_files,
      config.grain_file_type,
      shuffle=config.enable_data_shuffling,
      shuffle_seed=config.data_shuffle_seed,
      shuffle_buffer_size=config.grain_shuffle_buffer_size,
      num_epoch=config.num_epoch,
      dataloading_host_index=dataloading_host_index,
      dataloading_host_count=dataloading_host_count,
      grain_worker_count=config.grain_worker_count,
      grain_num_threads=config.grain_num_threads,
      grain_prefetch_buffer_size=config.grain_prefetch_buffer_size,
      grain_data_source_max_workers=config.grain_data_source_max_workers,
      grain_index_storage_option=config.grain_index_storage_option,
      mixture_config_path=config.grain_train_mixture_config_path,
      elastic=config.grain_use_elastic_iterator,
  )
  preprocessing_fn = functools.partial(
      pretrain_preprocessing_pipeline,
      config=config,
      data_columns=config.train_data_columns,
      tokenize=config.tokenize_train_data,
      grain_worker_count=config.grain_worker_count,
      grain_per_worker_buffer_size=config.grain_per_worker_buffer_size,
  )
  if config.grain_use_elastic_iterator:
    mp_options = (
        grain.MultiprocessingOptions(
            num_workers=config.grain_worker_count,
            per_worker_buffer_size=config.grain_per_worker_buffer_size,
        )
        if config.grain_worker_count > 0
        else None
    )
    return _make_elastic_iterator(train_ds, config, preprocessing_fn, shard_index=dataloading_host_index,
                                  shard_count=dataloading_host_count, mp_opts=mp_options)
  train_dataloader = preprocessing_fn(dataset=train_ds)
  return iter(train_dataloader)


def save_data_checkpoint(iterator, directory, process_index=0, process_count=1):
  path = Path(directory) / f"process_{process_index}-of-{process_count}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(_state_to_text(iterator))


def restore_data_checkpoint(iterator, directory, process_index=0, process_count=1):
  _set_state_from_text(iterator, (Path(directory) / f"process_{process_index}-of-{process_count}.json").read_text())
  return iterator
'''

NUM_FILES, RECORDS_PER_FILE = 2, 20


def _text(i: int) -> str:
  return f"doc {i}: " + "lorem ipsum " * (i % 5)  # 8 to 58 bytes: some rows trimmed to 32, others padded.


@pytest.fixture(scope="module")
def train_files(tmp_path_factory):
  """tf.train.Example records with a 'text' feature, in ArrayRecord files (MaxText's C4 layout)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  # MaxText's ArrayRecord data is tf.train.Example.
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp("maxtext")
  files = {}
  for name, offset in (("c4", 0), ("wiki", 1000)):
    for f in range(NUM_FILES):
      writer = ArrayRecordWriter(str(root / f"{name}-train.array_record-{f:05d}-of-{NUM_FILES:05d}"), "group_size:1")
      for i in range(offset + f * RECORDS_PER_FILE, offset + (f + 1) * RECORDS_PER_FILE):
        feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[_text(i).encode()]))
        writer.write(tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString())
      writer.close()
    files[name] = str(root / f"{name}-train.array_record-*")
  for f in range(NUM_FILES):
    with tf.io.TFRecordWriter(str(root / f"c4-train.tfrecord-{f:05d}-of-{NUM_FILES:05d}")) as writer:
      for i in range(f * RECORDS_PER_FILE, (f + 1) * RECORDS_PER_FILE):
        feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[_text(i).encode()]))
        writer.write(tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString())
  files["c4_tfrecord"] = str(root / "c4-train.tfrecord-*")
  return files


def _rows(batches) -> list:
  """One entry per non-padding row: its (inputs, targets) tokens, as lists."""
  rows = []
  for b in batches:
    for k in range(len(b["inputs"])):
      if int(np.sum(b["inputs_segmentation"][k])):
        rows.append((plain(b["inputs"][k]), plain(b["targets"][k])))
  return rows


def _expected_inputs(ids, length=32):
  return sorted([([c + 3 for c in _text(i).encode()][:length] + [0] * length)[:length] for i in ids])


DRIVE_IN_PROCESS = '''
batches, checkpointed = {}, {}
for host in range(2):
  config = make_config(enable_data_shuffling=shuffle)
  it = make_train_iterator(config, dataloading_host_index=host, dataloading_host_count=2)
  batches[host] = list(it)
  # Preempted after 2 steps: the JSON state goes to disk, a new job restores it.
  it = make_train_iterator(config, dataloading_host_index=host, dataloading_host_count=2)
  head = [next(it), next(it)]
  save_data_checkpoint(it, f"{checkpoint_dir}/host{host}", host, 2)
  restored = restore_data_checkpoint(make_train_iterator(config, host, 2), f"{checkpoint_dir}/host{host}", host, 2)
  checkpointed[host] = head + list(restored)
'''


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
def test_maxtext_pipeline_on_two_hosts_and_json_resume(train_files, tmp_path, shuffle):
  g, l = [porting.run(MAXTEXT + DRIVE_IN_PROCESS, lib, train_files=train_files["c4"], shuffle=shuffle,
                      checkpoint_dir=str(tmp_path / lib)) for lib in porting.LIBS]
  keys = {"inputs", "targets", "inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position"}
  for ns in (g, l):
    for host in range(2):
      assert [len(ns.batches[host])] == [5]  # 20 rows per host, 4 per batch.
      assert all(set(b) == keys for b in ns.batches[host])
      assert plain(ns.checkpointed[host]) == plain(ns.batches[host])
    all_rows = _rows(ns.batches[0]) + _rows(ns.batches[1])
    assert sorted(r[0] for r in all_rows) == _expected_inputs(range(40))
  assert structure(g.batches[0]) == structure(l.batches[0])
  for host in range(2):  # Shuffled or not, exactly Grain's batches on each host (Grain's shuffle).
    assert plain(l.batches[host]) == plain(g.batches[host])


DRIVE_WORKERS = '''
from absl import flags
flags.FLAGS.mark_as_parsed()  # MaxText runs under absl.app, which parses the flags Grain's workers read.

config = make_config(grain_worker_count=2)
it = make_train_iterator(config, dataloading_host_index=0, dataloading_host_count=1)
head = [next(it) for _ in range(3)]
save_data_checkpoint(it, checkpoint_dir)
tail = list(it)
restored = restore_data_checkpoint(make_train_iterator(config), checkpoint_dir)
resumed = list(restored)
'''


def test_maxtext_pipeline_with_worker_processes_and_json_resume(train_files, tmp_path):
  g, l = [porting.run(MAXTEXT + DRIVE_WORKERS, lib, train_files=train_files["c4"],
                      checkpoint_dir=str(tmp_path / lib)) for lib in porting.LIBS]
  for ns in (g, l):
    assert len(ns.head) + len(ns.tail) == 10
    assert plain(ns.resumed) == plain(ns.tail)  # The JSON state resumes exactly where it was taken.
    assert sorted(r[0] for r in _rows(ns.head + ns.tail)) == _expected_inputs(range(40))
  # Grain's two workers batch their own records; loader's stream is the in-process one.
  assert same_multiset(_rows(g.head + g.tail), _rows(l.head + l.tail))
  in_process = porting.run(MAXTEXT + "batches = list(make_train_iterator(make_config()))", "loader",
                           train_files=train_files["c4"])
  assert plain(l.head + l.tail) == plain(in_process.batches)
  # loader: the state of the 2-worker job resumes in an in-process job, and the other way round.
  other = porting.run(MAXTEXT + """
restored = restore_data_checkpoint(make_train_iterator(make_config(grain_worker_count=0)), checkpoint_dir)
resumed = list(restored)
""", "loader", train_files=train_files["c4"], checkpoint_dir=str(tmp_path / "loader"))
  assert plain(other.resumed) == plain(l.tail)


DRIVE_PACKING_AND_MIXTURE = '''
with open(mixture_path, "w") as f:
  json.dump({"c4": {"path": train_files["c4"], "weight": 0.7}, "wiki": {"path": train_files["wiki"], "weight": 0.3}}, f)
config = make_config(grain_train_mixture_config_path=mixture_path, packing=True, grain_packing_type=packing_type,
                     use_truncation=False, max_target_length=16, add_bos=True, num_epoch=1)
it = make_train_iterator(config)
batches = list(it)
it = make_train_iterator(config)
head = [next(it) for _ in range(3)]
save_data_checkpoint(it, checkpoint_dir)
resumed = list(restore_data_checkpoint(make_train_iterator(config), checkpoint_dir))
'''


@pytest.mark.parametrize("packing_type", ["first_fit", "best_fit", "concat_then_split"])
def test_maxtext_packed_mixture_equals_grain_and_resumes(train_files, tmp_path, packing_type):
  g, l = [porting.run(MAXTEXT + DRIVE_PACKING_AND_MIXTURE, lib, train_files=train_files,
                      packing_type=packing_type, mixture_path=str(tmp_path / f"{lib}_mixture.json"),
                      checkpoint_dir=str(tmp_path / lib)) for lib in porting.LIBS]
  assert len(g.batches) > 3
  # In one process nothing is random here: loader packs and mixes exactly as Grain does.
  assert structure(l.batches) == structure(g.batches)
  assert plain(l.batches) == plain(g.batches)
  for ns in (g, l):
    assert plain(ns.head + ns.resumed) == plain(ns.batches)
    assert {b["inputs"].shape for b in ns.batches} == {(4, 16)}


DRIVE_TFRECORD = '''
batches, checkpointed = {}, {}
for host in range(3):  # More hosts than files: hosts 0 and 2 share file 0, by record index.
  config = make_config(grain_file_type="tfrecord", enable_data_shuffling=shuffle, grain_shuffle_buffer_size=8)
  batches[host] = list(make_train_iterator(config, dataloading_host_index=host, dataloading_host_count=3))
  it = make_train_iterator(config, dataloading_host_index=host, dataloading_host_count=3)
  head = [next(it)]
  save_data_checkpoint(it, f"{checkpoint_dir}/host{host}", host, 3)
  restored = restore_data_checkpoint(make_train_iterator(config, host, 3), f"{checkpoint_dir}/host{host}", host, 3)
  checkpointed[host] = head + list(restored)
'''


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
def test_maxtext_tfrecord_branch_with_row_sharding_and_json_resume(train_files, tmp_path, shuffle):
  g, l = [porting.run(MAXTEXT + DRIVE_TFRECORD, lib, train_files=train_files["c4_tfrecord"], shuffle=shuffle,
                      checkpoint_dir=str(tmp_path / lib)) for lib in porting.LIBS]
  for ns in (g, l):
    assert [len(_rows(ns.batches[h])) for h in range(3)] == [10, 20, 10]
    for host in range(3):
      assert plain(ns.checkpointed[host]) == plain(ns.batches[host])
    assert sorted(r[0] for h in range(3) for r in _rows(ns.batches[h])) == _expected_inputs(range(40))
  for host in range(3):  # Shuffled or not, exactly Grain's batches (Grain's file and window shuffles).
    assert plain(l.batches[host]) == plain(g.batches[host])


# ElasticIterator: MaxText writes its state (one global position) to process_0.json
# from process 0 only, so a job restarted with another host count can resume.
DRIVE_ELASTIC = '''
batches, resumed = {}, {}
for host in range(2):
  config = make_config(grain_use_elastic_iterator=True, num_epoch=1)
  batches[host] = [next(it) for it in [make_train_iterator(config, host, 2)] for _ in range(4)]
  it = make_train_iterator(config, host, 2)
  head = [next(it), next(it)]
  if host == 0:
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    (Path(checkpoint_dir) / "process_0.json").write_text(json.dumps(it.get_state(), indent=4))
# Restart on one host: it resumes the global position with the whole batch.
config = make_config(grain_use_elastic_iterator=True, num_epoch=1)
it = make_train_iterator(config, 0, 1)
it.set_state(json.loads((Path(checkpoint_dir) / "process_0.json").read_text()))
one_host_after_restart = [next(it) for _ in range(2)]
'''


def test_maxtext_elastic_iterator_and_host_count_change(train_files, tmp_path):
  g, l = [porting.run(MAXTEXT + DRIVE_ELASTIC, lib, train_files=train_files["c4"],
                      checkpoint_dir=str(tmp_path / lib)) for lib in porting.LIBS]
  # Nothing random: exactly Grain's per-host batches and restart batches.
  assert structure(l.batches) == structure(g.batches)
  assert plain(l.batches) == plain(g.batches)
  assert plain(l.one_host_after_restart) == plain(g.one_host_after_restart)
  assert {b["inputs"].shape for b in g.batches[0]} == {(2, 32)}
  assert {b["inputs"].shape for b in g.one_host_after_restart} == {(4, 32)}


# Switching mid-training: the job ran on Grain and wrote its JSON checkpoint;
# the same job, its import line changed, restores it on loader. loader must
# resume at exactly the element Grain would, or refuse in one clear line.
DRIVE_WRITE = '''
if mixture:
  with open(f"{checkpoint_dir}/mixture.json", "w") as f:
    json.dump({"c4": {"path": train_files["c4"], "weight": 0.7},
               "wiki": {"path": train_files["wiki"], "weight": 0.3}}, f)
  overrides["grain_train_mixture_config_path"] = f"{checkpoint_dir}/mixture.json"
config = make_config(**overrides)
it = make_train_iterator(config)
head = [next(it) for _ in range(2)]
save_data_checkpoint(it, checkpoint_dir)
tail = list(it)
'''

DRIVE_READ = '''
if mixture:
  overrides["grain_train_mixture_config_path"] = f"{checkpoint_dir}/mixture.json"
it = make_train_iterator(make_config(**overrides))
try:
  restore_data_checkpoint(it, checkpoint_dir)
  resumed, error = list(it), None
except ValueError as e:
  resumed, error = None, e
'''


@pytest.mark.parametrize("case", ["in_order", "shuffled", "packed_mixture"])
def test_maxtext_checkpoint_written_on_grain_resumes_exactly_on_loader(train_files, tmp_path, case):
  overrides, mixture = {
      "in_order": ({}, False),
      "shuffled": ({"enable_data_shuffling": True}, False),
      "packed_mixture": ({"packing": True, "use_truncation": False, "max_target_length": 16}, True),
  }[case]
  files = train_files if mixture else train_files["c4"]
  g = porting.run(MAXTEXT + DRIVE_WRITE, "grain", train_files=files, checkpoint_dir=str(tmp_path),
                  overrides=dict(overrides), mixture=mixture)
  l = porting.run(MAXTEXT + DRIVE_READ, "loader", train_files=files, checkpoint_dir=str(tmp_path),
                  overrides=dict(overrides), mixture=mixture)
  # Grain's position means the same element here: the shuffle, and the packing
  # and mixing (see test_maxtext_packed_mixture_equals_grain_and_resumes), are Grain's.
  assert l.error is None
  assert plain(l.resumed) == plain(g.tail)


# input_pipeline_utils.py reads gs:// TFRecord files with subclasses of Grain's
# private reader classes, imported from grain._src. Here a bucket is a local
# folder: the stand-in for gcs_utils opens gs://<bucket>/<name> from it.
GCS_TFRECORD = '''
import glob
import os

import grain.python as grain
from grain._src.python.dataset.sources.tfrecord_dataset import _TFRecordReader, _TFRecordDatasetIterator  # pylint: disable=protected-access
from grain.experimental import TFRecordIterDataset


def parse_gcs_bucket_and_prefix(path):  # maxtext.utils.gcs_utils stand-in
  bucket, _, blob = path[len("gs://"):].partition("/")
  return bucket, blob


def open_blob(bucket_name, blob_name):  # storage.Client().bucket(b).blob(n).open("rb") stand-in
  return open(os.path.join(bucket_root, bucket_name, blob_name), "rb")


class _GCSTFRecordReader(_TFRecordReader):
  """Extends Grain's _TFRecordReader to open TFRecord files from GCS via streaming BlobReader."""

  def __init__(self, path: str):
    # Skip parent __init__ (which calls open(path, "rb")) and open via GCS BlobReader instead.
    bucket_name, blob_name = parse_gcs_bucket_and_prefix(path)
    self._reader = open_blob(bucket_name, blob_name)


class _GCSTFRecordDatasetIterator(_TFRecordDatasetIterator):
  """Extends Grain's _TFRecordDatasetIterator to use _GCSTFRecordReader for GCS paths."""

  def __init__(self, path: str):
    # Skip parent __init__ (which creates _TFRecordReader); use GCS-aware reader instead.
    grain.DatasetIterator.__init__(self)
    self._reader = _GCSTFRecordReader(path)


class GCSTFRecordIterDataset(TFRecordIterDataset):
  """Extends Grain's TFRecordIterDataset to support GCS paths."""

  def __iter__(self) -> grain.DatasetIterator:  # pylint: disable=non-iterator-returned
    return _GCSTFRecordDatasetIterator(self._path)


def make_tfrecord_iter_dataset(path: str):
  """Returns the appropriate TFRecordIterDataset for local or GCS paths."""
  if path.startswith("gs://"):
    return GCSTFRecordIterDataset(path)
  return TFRecordIterDataset(path)


paths = [f"gs://bucket/{os.path.basename(p)}" for p in sorted(glob.glob(pattern))]
ds = grain.MapDataset.source(paths).map(make_tfrecord_iter_dataset)
ds = grain.experimental.InterleaveIterDataset(ds, cycle_length=2)
it = iter(ds)
head = [next(it) for _ in range(7)]
state = it.get_state()
rest = list(it)
resumed = iter(ds)
resumed.set_state(state)
after_restore = list(resumed)
'''


def test_maxtext_gcs_tfrecord_subclasses_of_grains_private_reader(train_files, tmp_path):
  import os
  import shutil
  bucket = tmp_path / "buckets" / "bucket"
  bucket.mkdir(parents=True)
  for path in sorted(__import__("glob").glob(train_files["c4_tfrecord"])):
    shutil.copy(path, bucket / os.path.basename(path))
  g, l = porting.run_both(GCS_TFRECORD, pattern=str(bucket / "*"), bucket_root=str(tmp_path / "buckets"))
  assert len(g.head) == 7 and len(g.head) + len(g.rest) == 40
  assert l.head == g.head and l.rest == g.rest
  assert l.after_restore == g.after_restore == g.rest
