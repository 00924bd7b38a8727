"""`grain._src.python.dataset.sources`: see `loader._src`."""
