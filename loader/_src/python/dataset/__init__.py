"""`grain._src.python.dataset`: see `loader._src`."""
