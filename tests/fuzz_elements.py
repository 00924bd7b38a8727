"""Small element helpers shared by the differential fuzz rounds (tests/test_fuzz_round*.py).

Plain functions at module level, so that both libraries (and worker
processes) can pickle the maps built from them.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest


def leafmap(f, x):
  """`f` applied to every numeric leaf of a nested element; strings, bytes, bools and None kept."""
  if isinstance(x, dict):
    return {k: leafmap(f, v) for k, v in x.items()}
  if isinstance(x, tuple):
    return tuple(leafmap(f, v) for v in x)
  if isinstance(x, list):
    return [leafmap(f, v) for v in x]
  if x is None or isinstance(x, (str, bytes, bool, np.bool_)):
    return x
  if isinstance(x, np.ndarray) and x.dtype.kind not in "iuf":
    return x
  return f(x)


def adder(k):
  return lambda x: leafmap(lambda v: v + k, x)


def random_add(x, rng):
  k = int(rng.integers(0, 1000))
  return leafmap(lambda v: v + k, x)


@pytest.fixture(autouse=True)
def quiet():
  """Both libraries warn about pipelines a fuzz builds on purpose."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    yield
