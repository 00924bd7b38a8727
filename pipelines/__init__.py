"""Ready-made pipelines and command-line entry points built on `converter`.

Names are imported on first use: they need Apache Beam (the [beam] extra),
and `pipelines.entry_points` must import without it to say so.
"""

import importlib

_LAZY = {
    "add_conversion": "pipelines.build",
    "pipeline_options": "pipelines.build",
    "convert_tf_to_arrayrecord_disk": "pipelines.migration",
    "convert_tf_to_arrayrecord_disk_match_shards": "pipelines.migration",
}

__all__ = list(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
