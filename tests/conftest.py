"""Shared fixtures: TFRecords written by TensorFlow's own writer; garbage collection kept off Grain's threads."""

from __future__ import annotations

import functools
import gc
import os
import re
import sys
import tempfile

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


def pytest_collection_finish(session):  # pylint: disable=unused-argument
  """What is alive once every test module is imported (TensorFlow, JAX, Grain, the test modules) is kept out
  of later garbage collections: each full collection scanned all of it, ~0.3 s a time, after every test that
  runs Grain (see below), over ten minutes of a suite run on 2 cores."""
  gc.collect()
  gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_earlier_modules_left():
  """The same for what tests imported or cached since (TensorFlow, JAX and Grain are imported by tests too).
  Garbage goes first; only survivors are frozen. Measured: 6 port and fuzz files, 118 s with it, 129 s without.
  (Round 27's fuzz running past 9 minutes after the port tests was another cause: prefetch threads of dropped
  iterators that never stopped, see tests/test_faults_round32_loader.py.)"""
  gc.collect()
  gc.freeze()
  yield


@pytest.fixture(autouse=True, scope="session")
def _temp_files_under_pytests_own_folder(tmp_path_factory):
  """In-process temporary files go under pytest's base folder, which pytest prunes (it keeps 3 runs).

  Tests that run a user's own `beam.Pipeline()` on DirectRunner make Beam 2.77 start Prism's job server
  first; offline it fails and never removes the empty `beam-temp*` folder it made: 45-66 of them in /tmp
  per suite run. (The converter's own runs skip Prism: tests/test_migration.py checks they leave nothing.)
  Subprocesses keep the environment's TMPDIR.
  """
  previous = tempfile.tempdir
  tempfile.tempdir = str(tmp_path_factory.mktemp("tmp"))
  yield
  tempfile.tempdir = previous


@functools.lru_cache(maxsize=None)
def _runs_grain(test_file: str) -> bool:
  with open(test_file, encoding="utf-8") as f:
    return bool(re.search(r"^\s*(import grain|from grain\b)|importorskip\([\"']grain", f.read(), re.M))


@pytest.fixture(autouse=True)
def _collect_garbage_on_the_main_thread(request):
  """Cyclic garbage is collected on the test's own thread only, in tests that run Grain.

  Grain 0.2.18 closes a dropped iterator in `__del__`, which joins its prefetch threads. When the
  collector happens to run on one of Grain's own pool threads, that join waits for the thread doing it,
  and the pipeline (and, at exit, the interpreter) hangs for good. Seen here in a differential fuzz
  run: a `ThreadPrefetchIterDataset` under an interleave, collected inside a prefetch `__getitem__`.
  Automatic collection is off for the test and runs on this thread at its end.
  """
  if not _runs_grain(request.module.__file__) or not gc.isenabled():
    yield
    return
  gc.disable()
  try:
    yield
  finally:
    gc.collect()  # Before enabling: the first allocation after it, on any thread, would collect.
    gc.enable()


@pytest.fixture
def tf_write():
  return write_tfrecords_tf


@pytest.fixture
def ar_read():
  return read_array_record
