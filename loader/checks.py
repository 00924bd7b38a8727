"""Argument checks shared by every loader module: one wording, one place.

Numpy integers are accepted wherever Python ints are (indices and seeds often
come out of numpy code); bools are rejected (True as a batch size is a bug).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from loader import permutation

MAX_SEED = 2**32 - 1


def is_int(value: Any) -> bool:
  return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
  """`value` as an int, or ValueError naming `name`, the value and the valid range."""
  if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
    if minimum is not None and maximum is not None:
      want = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
      want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    elif maximum is not None:
      want = f"an integer <= {maximum}"
    else:
      want = "an integer"
    raise ValueError(f"{name} must be {want} (got {name}={value!r}).")
  return int(value)


def check_seed(seed: Any, what: str = "seed") -> int:
  """A seed in [0, 2**32-1], as Grain requires."""
  if not is_int(seed) or not 0 <= seed <= MAX_SEED:
    raise ValueError(f"{what}: seed must be an integer between 0 and 2**32-1 (got {seed=!r}).")
  return int(seed)


def resolve_fn(transform: Any, method: str, what: str) -> Callable[..., Any]:
  """A callable, or the `method` of a Grain-style transform object.

  Transform objects work whether they subclass loader's classes, Grain's
  (`grain.transforms.Map` ...) or just define the method (duck typing).
  """
  fn = getattr(transform, method, None)
  if callable(fn) and not isinstance(transform, type):
    return fn
  # A class is a callable too (Grain maps e.g. `ParquetIterDataset` over paths).
  if callable(transform):
    return transform
  raise TypeError(f"{what} expects a callable or an object with a .{method}() method (got {transform!r}).")


def fn_name(fn: Callable[..., Any]) -> str:
  """A short stable name for reprs and pipeline fingerprints."""
  owner = getattr(fn, "__self__", None)
  if owner is not None and not isinstance(owner, type):
    return f"{type(owner).__qualname__}.{getattr(fn, '__name__', '?')}"
  return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def derive_seed(base: int, depth: int) -> int:
  """The seed of the random op `depth` steps below a `seed(base)` call.

  Distinct per position in the pipeline, so two shuffles do not coincide.
  """
  return permutation.splitmix64((base << 16) ^ depth) & MAX_SEED


def element_rng(seed: int, index: int) -> np.random.Generator:
  """The random generator of the element at `index` (epochs included)."""
  # The index sits in the counter's top 64 bits: Philox increments the low
  # word, so each element gets its own 2**192-block stream, no overlaps.
  return np.random.Generator(np.random.Philox(key=seed, counter=int(index) << 192))
