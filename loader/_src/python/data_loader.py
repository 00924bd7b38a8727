"""`grain._src.python.data_loader`: the legacy DataLoader (loader's, the same objects as `loader.*`)."""

from loader.data_loader import DataLoader
from loader.data_loader import DataLoaderIterator

PyGrainDatasetIterator = DataLoaderIterator

__all__ = ["DataLoader", "DataLoaderIterator", "PyGrainDatasetIterator"]
