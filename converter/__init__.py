"""Beam building blocks that turn TFRecord shards into matched ArrayRecord shards."""

from converter.errors import ConversionError, CorruptRecordError, NoInputFilesError, OutputExistsError
from converter.manifest import MANIFEST_NAME, RecordDigest, build_manifest, read_manifest, write_manifest
from converter.naming import ShardName, common_dir, output_basename, output_path
from converter.options import WRITER_OPTION_KEYS, ConvertOptions, validate_writer_options
from converter.planning import ShardPlan, expand_patterns, match_pattern, plan_shards
from converter.tfrecord import TFRecordReader, detect_compression, read_tfrecords
from converter.transforms import ConvertToArrayRecord, MatchFiles

__all__ = [
    "ConversionError", "CorruptRecordError", "NoInputFilesError", "OutputExistsError",
    "MANIFEST_NAME", "RecordDigest", "build_manifest", "read_manifest", "write_manifest",
    "ShardName", "common_dir", "output_basename", "output_path",
    "WRITER_OPTION_KEYS", "ConvertOptions", "validate_writer_options",
    "ShardPlan", "expand_patterns", "match_pattern", "plan_shards",
    "TFRecordReader", "detect_compression", "read_tfrecords",
    "ConvertToArrayRecord", "MatchFiles",
]
