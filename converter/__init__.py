"""Beam building blocks that turn TFRecord shards into matched ArrayRecord shards."""

from converter.errors import (ConcurrentRunError, ConversionError, CorruptRecordError, NoInputFilesError,
                              NotTFRecordError, OutputExistsError)
from converter.manifest import MANIFEST_NAME, RecordDigest, build_manifest, read_manifest, write_manifest
from converter.naming import ShardName, common_dir, output_basename, output_path
from converter.options import WRITER_OPTION_KEYS, ConvertOptions, validate_writer_options
from converter.planning import ShardPlan, expand_patterns, match_pattern, plan_shards
from converter.tfrecord import TFRecordReader, detect_compression, read_tfrecords

# The PTransforms need Apache Beam (the [beam] extra); everything else here
# imports without it, so they are loaded on first use.
_BEAM_NAMES = ("ConvertToArrayRecord", "MatchFiles")

__all__ = [
    "ConcurrentRunError", "ConversionError", "CorruptRecordError", "NoInputFilesError", "NotTFRecordError",
    "OutputExistsError",
    "MANIFEST_NAME", "RecordDigest", "build_manifest", "read_manifest", "write_manifest",
    "ShardName", "common_dir", "output_basename", "output_path",
    "WRITER_OPTION_KEYS", "ConvertOptions", "validate_writer_options",
    "ShardPlan", "expand_patterns", "match_pattern", "plan_shards",
    "TFRecordReader", "detect_compression", "read_tfrecords",
    "ConvertToArrayRecord", "MatchFiles",
]


def __getattr__(name):
  if name in _BEAM_NAMES:
    try:
      from converter import transforms  # pylint: disable=g-import-not-at-top
    except ModuleNotFoundError as e:
      if e.name != "apache_beam":
        raise
      raise ImportError(f"converter.{name} needs Apache Beam: pip install "
                        "'arrayrecord-toolkit[beam]'") from e
    return getattr(transforms, name)
  raise AttributeError(f"module 'converter' has no attribute {name!r}")
