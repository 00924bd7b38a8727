"""Ready-made pipelines and command-line entry points built on `converter`."""

from pipelines.build import add_conversion, pipeline_options
from pipelines.migration import convert_tf_to_arrayrecord_disk, convert_tf_to_arrayrecord_disk_match_shards

__all__ = [
    "add_conversion",
    "pipeline_options",
    "convert_tf_to_arrayrecord_disk",
    "convert_tf_to_arrayrecord_disk_match_shards",
]
