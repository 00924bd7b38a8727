"""`grain._src.python.dataset.dataset`: the dataset classes (loader's, the same objects as `loader.*`)."""

from loader.apply import apply_transformations
from loader.dataset_iterator import DatasetIterator
from loader.iter_dataset import IterDataset
from loader.map_dataset import MapDataset
from loader.stats import get_execution_summary

__all__ = ["DatasetIterator", "IterDataset", "MapDataset", "apply_transformations", "get_execution_summary"]
