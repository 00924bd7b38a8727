"""`grain._src.python`: see `loader._src`."""
