"""`grain._src.python.dataset.sources.tfrecord_dataset`: Grain's TFRecord classes, subclassable as Grain's.

MaxText extends `_TFRecordReader` (setting `self._reader` to a GCS blob reader)
and `_TFRecordDatasetIterator` (calling `DatasetIterator.__init__` and setting
`self._reader`), and `TFRecordIterDataset` (reading `self._path`).
"""

from loader.iter_sources.tfrecord import TFRecordIterDataset
from loader.iter_sources.tfrecord import _TFRecordDatasetIterator
from loader.iter_sources.tfrecord import _TFRecordReader

__all__ = ["TFRecordIterDataset", "_TFRecordDatasetIterator", "_TFRecordReader"]
