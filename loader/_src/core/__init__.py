"""`grain._src.core`: see `loader._src`."""
