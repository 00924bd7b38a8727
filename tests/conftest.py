"""Shared fixtures: TFRecords written by TensorFlow's own writer."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests import the packages from the checkout even without `pip install -e`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_tfrecords_tf(path: str, records, compression: str | None = None) -> str:
  """Writes records with tf.io.TFRecordWriter ('GZIP', 'ZLIB' or None)."""
  import tensorflow as tf  # Only tests use TensorFlow, as an independent implementation.
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with tf.io.TFRecordWriter(path, options=compression) as w:
    for r in records:
      w.write(r)
  return path


def read_array_record(path: str) -> list[bytes]:
  """All records of an ArrayRecord file, with array_record's own reader."""
  from array_record.python.array_record_module import ArrayRecordReader
  r = ArrayRecordReader(path)
  try:
    return list(r.read_all()) if r.num_records() else []
  finally:
    r.close()


@pytest.fixture
def tf_write():
  return write_tfrecords_tf


@pytest.fixture
def ar_read():
  return read_array_record
