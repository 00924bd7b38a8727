"""Argument checks shared by every loader module: one wording, one place.

Numpy integers are accepted wherever Python ints are (indices and seeds often
come out of numpy code); bools are rejected as sizes (True as a batch size is a bug) but taken as
seeds, as Grain computes with them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

MAX_SEED = 2**32 - 1


def is_int(value: Any) -> bool:
  """An int, numpy integer, or an integer scalar array (numpy's 0-d, JAX's: what `jnp.int32(4)` gives); not a bool."""
  if isinstance(value, (bool, np.bool_)):
    return False
  if isinstance(value, (int, np.integer)):
    return True
  dtype = getattr(value, "dtype", None)
  return (getattr(value, "shape", None) == () and hasattr(value, "__index__") and dtype is not None
          and np.dtype(dtype).kind in "iu")


def check_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None,
              range_error: type[ValueError] = ValueError) -> int:
  """`value` as an int, or ValueError naming `name`, the value and the valid range (IntTypeError,
  also a TypeError, where `value` is no integer). `range_error`, a ValueError subclass, is raised for
  an integer out of range where Grain fails there with another type too (see ZeroSizeError)."""
  if is_int(value):
    value = int(value)  # Compared as a Python int: a JAX int32 would overflow against large bounds.
  if type(value) is not int or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
    if minimum is not None and maximum is not None:
      want = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
      want = "positive: an integer >= 1" if minimum == 1 else f"an integer >= {minimum}"  # Grain: "must be positive."
    elif maximum is not None:
      want = f"an integer <= {maximum}"
    else:
      want = "an integer"
    error = range_error if is_int(value) else IntTypeError
    raise error(f"{name} must be {want} (got {name}={value!r}).")
  return value


def int_error(value: Any) -> type[ValueError]:
  """The class to raise for a bad size `value`: IntTypeError where it is no integer, else ValueError.

  A value of another type (2.0, "2", None) is also a TypeError, as Grain's
  arithmetic on it raises.
  """
  return ValueError if is_int(value) else IntTypeError


def check_length_struct(length_struct: Any, owner: str, example: str) -> None:
  """Checks a packer's `length_struct` (feature name -> positive int); errors name `owner`."""
  if not isinstance(length_struct, Mapping) or not length_struct:
    raise ValueError(f"{owner}: length_struct must be a non-empty dict of feature name -> packed length, "
                     f"e.g. {example} (got {length_struct!r}).")
  for k, v in length_struct.items():
    if not isinstance(k, str) or not is_int(v) or v < 1:
      error = int_error(v) if isinstance(k, str) else ValueError
      raise error(f"{owner}: length_struct must map feature names to positive ints "
                  f"(got {k!r}: {v!r} in {length_struct!r}).")


class IntTypeError(TypeError, ValueError):
  """A size, count or index that is not an integer (`batch(2.0)`, `repeat("2")`, `batch(None)`).

  A TypeError as Grain's (which fails on it as soon as it computes with it), and
  a ValueError, as loader's range checks raise.
  """


class ArgumentTypeError(ValueError, TypeError):
  """An argument of the wrong type where Grain raises a ValueError (and loader used to raise a TypeError)."""


class RangeTypeError(ValueError, TypeError):
  """A value out of range where Grain 0.2.18 fails with a TypeError (its C++ index_shuffle, which
  window shuffles call, refuses a seed outside uint32)."""


class ZeroSizeError(ValueError, ZeroDivisionError):
  """A size or weight Grain 0.2.18 divides by zero with (`max_fan_out=0`, a window of 0 records, a
  negative mixing weight, whose weights may sum to 0): a ValueError, and Grain's ZeroDivisionError."""


class EmptyCycleError(ValueError, IndexError):
  """`cycle_length` below 1: a ValueError, and the IndexError Grain 0.2.18 raises from its empty cycle."""


class WeightOverflowError(ValueError, OverflowError):
  """An infinite mixing weight: a ValueError, and Grain 0.2.18's OverflowError (int(inf))."""


class OptionsTypeError(TypeError, AttributeError):
  """Options of the wrong type (`read_options=3`): a TypeError, and the AttributeError Grain 0.2.18
  raises reading their fields."""


class SeedTypeError(TypeError, ValueError):
  """A seed that is not an integer: a TypeError as Grain's (numpy's SeedSequence), and a ValueError."""


class EmptyDatasetError(IndexError, ZeroDivisionError):
  """A read (`ds[i]`, any index) from a dataset of length 0.

  An IndexError, as loader's reads out of range raise, and a ZeroDivisionError,
  as Grain 0.2.18 raises there (it takes the index modulo the length 0), so
  code that catches Grain's error catches this one.
  """


class FanOutMissingError(ValueError, AttributeError, TypeError):
  """A `FlatMapMapDataset` transform without `max_fan_out`: a ValueError, and what Grain 0.2.18 raises
  using it (AttributeError where it is missing, TypeError where it is None). Raised on first use, as in
  Grain: `len()`, `ds[i]`, `iter()`, and here also building a stage that takes the length (`shuffle`,
  `to_iter_dataset`)."""


class TransformTypeError(TypeError, AttributeError):
  """A transform that is neither callable nor has the method its stage calls (`FlatMapIterDataset(ds, 5)`):
  a TypeError, and the AttributeError Grain 0.2.18 raises looking the method up."""


class IndexTypeError(TypeError, AttributeError):
  """A record index that is not an integer (`source[1.5]`): a TypeError, and the AttributeError
  Grain 0.2.18's ArrayRecordDataSource raises there (it calls `index.__index__()`)."""


def record_index(key: Any) -> int:
  """`key.__index__()` as Grain's sources take it; an IndexTypeError naming a non-integer key."""
  try:
    return key.__index__()
  except AttributeError:
    raise IndexTypeError(f"Record indices are integers; got {key!r} ({type(key).__name__}): pass int(...) of it, "
                         "or read several records with __getitems__([...]).") from None


class WeightsCountError(ValueError, AssertionError):
  """`mix` weights whose count is not the datasets': a ValueError, and Grain 0.2.18's AssertionError."""


_FLOAT_SEEDS = ("integral", "truncate", "refuse")


def check_seed(seed: Any, what: str = "seed", *, any_size: bool = False, floats: str = "integral",
               range_error: type[ValueError] = ValueError) -> int:
  """A seed in [0, 2**32-1], as Grain's shuffles require; any size >= 0 with
  `any_size` (Grain's `seed()` and random maps hash it into a Philox key).

  A bool is the int it is (Grain computes with it). `floats` says what the op
  takes on Grain: "integral" 3.0 but not 1.5, "truncate" any number in range
  (`MapDataset.shuffle` takes `int(seed)`: 1.5 seeds as 1), "refuse" none
  (`seed()` and random maps hash it with numpy's SeedSequence, window shuffles
  pass it to C++: TypeError). `range_error` is raised for an integer out of
  range (a ValueError subclass; see RangeTypeError).
  """
  if floats not in _FLOAT_SEEDS:
    raise ValueError(f"floats must be one of {_FLOAT_SEEDS} (got {floats!r}).")
  if isinstance(seed, (bool, np.bool_)):
    seed = int(seed)
  if isinstance(seed, (float, np.floating)):
    if floats == "truncate" and math.isfinite(seed) and 0 <= seed < 2**32:
      seed = int(seed)
    elif floats == "integral" and float(seed).is_integer():
      seed = int(seed)
  if is_int(seed):
    seed = int(seed)
  if not is_int(seed) or seed < 0 or (not any_size and seed > MAX_SEED):
    # A number of the wrong kind or range is a bad value; anything else a bad type too.
    # (A float is a bad type, as numpy's SeedSequence, which Grain calls, says.)
    error = range_error if isinstance(seed, (int, np.integer)) else SeedTypeError
    wanted = "a non-negative integer" if any_size else "an integer between 0 and 2**32-1"
    raise error(f"{what}: seed must be {wanted} (got {seed=!r}).")
  return int(seed)


def seed_string(seed: Any) -> Any:
  """`seed()`'s seed as numpy's SeedSequence (which Grain hashes it with) reads it: '7' is 7.

  A command-line seed that was never converted to int works on Grain; other values pass unchanged.
  """
  if isinstance(seed, str) and seed.isascii() and seed.isdigit():
    return int(seed)
  return seed


# Base classes of Grain's (and loader's) transform objects: a subclass passed
# uninstantiated is a mistake, not a constructor to call per element.
_TRANSFORM_BASES = frozenset({
    "Map", "RandomMap", "TfRandomMap", "Filter", "FlatMap", "MapWithIndex", "MapTransform",
    "RandomMapTransform", "FilterTransform", "FlatMapTransform", "MapWithIndexTransform", "Transformation"})


def resolve_fn(transform: Any, method: str, what: str) -> Callable[..., Any]:
  """A callable, or the `method` of a Grain-style transform object.

  Transform objects work whether they subclass loader's classes, Grain's
  (`grain.transforms.Map` ...) or just define the method (duck typing).
  """
  fn = getattr(transform, method, None)
  if callable(fn) and not isinstance(transform, type):
    return fn
  if isinstance(transform, type) and any(c.__name__ in _TRANSFORM_BASES for c in transform.__mro__[1:]):
    raise TypeError(f"{what} expects an instance or a callable, not the class {transform.__name__}; "
                    f"did you mean {transform.__name__}()?")
  # Any other class is a callable too (Grain maps e.g. `ParquetIterDataset` over paths).
  if callable(transform):
    return transform

  def not_callable(*args, **kwargs):
    # Raised where Grain raises it: when an element is computed, not when the pipeline is built.
    raise TypeError(f"{type(transform).__name__!r} object is not callable: {what} expects a callable or an "
                    f"object with a .{method}() method (got {transform!r}).")

  not_callable.__qualname__ = not_callable.__name__ = type(transform).__name__
  return not_callable


def stop_iteration_error(fn: Callable[..., Any], error: StopIteration) -> RuntimeError:
  """What a user function's StopIteration becomes: an error, not a silent end of the stream.

  Raised out of a map or filter, StopIteration would look like the end of the
  data to every loop above it (PEP 479 makes generators turn it into a
  RuntimeError for the same reason). A source's StopIteration still ends a
  stream (a source that streams, see loader.source).
  """
  return RuntimeError(f"{fn_name(fn)} raised StopIteration ({error!r}); a map, filter, flat_map or batch_fn "
                      "must not end the stream: "
                      "catch it inside the function (e.g. next(it, None)) or end the data at its source.")


def call_user(fn: Callable[..., Any], *args: Any) -> Any:
  """`fn(*args)` for a user function called once per batch or split (see stop_iteration_error)."""
  try:
    return fn(*args)
  except StopIteration as e:
    raise stop_iteration_error(fn, e) from e


def fn_name(fn: Callable[..., Any]) -> str:
  """A short stable name for reprs and pipeline fingerprints."""
  owner = getattr(fn, "__self__", None)
  if owner is not None and not isinstance(owner, type):
    return f"{type(owner).__qualname__}.{getattr(fn, '__name__', '?')}"
  return getattr(fn, "__qualname__", None) or type(fn).__qualname__


# Grain's words first (client code matches them), then how to pass one.
_NO_SEED = {
    "random_map()": ("`random_map` requires a seed. Please either provide it with `ds.seed(seed)` before any random "
                     "transformations or pass it directly with `ds.random_map(transform, seed=seed)`."),
    "shuffle()": "`shuffle` requires a seed. Please provide it with `ds.seed(seed)` or pass `ds.shuffle(seed=seed)`.",
}


def seed_or_default(parent: Any, seed: int | None, what: str, *, any_size: bool = False,
                    floats: str = "integral") -> int:
  """The checked seed of an op on `parent`: `seed`, else derived from upstream `seed()` calls."""
  if seed is None:
    seed = default_seed(parent)
    if seed is None:
      raise ValueError(_NO_SEED.get(what) or
                       f"{what} needs a seed: pass seed=... or call ds.seed(...) earlier in the pipeline.")
    return seed
  return check_seed(seed, what, any_size=any_size, floats=floats)


def random_map_seed(parent: Any, seed: int | None, what: str) -> int:
  """`seed_or_default` for a random map, which takes seeds of any size (no floats) as Grain's."""
  return seed_or_default(parent, seed, what, any_size=True, floats="refuse")


def default_seed(parent: Any) -> int | None:
  """The seed of a random op added on top of `parent`, from upstream `seed()` calls.

  Grain's derivation: the (seed, distance from the op) pairs of the nearest
  `seed()` calls up each branch, hashed with a SeedSequence. Distinct per
  position in the pipeline, so two shuffles do not coincide, and
  `ds.seed(s).random_map(f)` draws what it draws on Grain (where the two
  pipelines have the same shape).
  """
  aggregated: list[int] = []
  to_visit = [(parent, 1)]
  while to_visit:
    node, depth = to_visit.pop(0)
    seed = getattr(node, "_seed_rng_seed", None)
    if getattr(node, "_seed_transparent", False):
      to_visit.extend((p, depth) for p in getattr(node, "parents", ()) or ())
    elif seed is None and getattr(node, "_hides_parent_seeds", False):
      continue  # As Grain's InterleaveIterDataset, which lists no parents: seeds under it reach no op above.
    elif seed is not None:
      # An IterDataset.seed() folded into the MapDataset lies one level deeper
      # than Grain's node above to_iter_dataset(): count it where Grain has it.
      aggregated.extend((seed, depth - 1 if getattr(node, "_iter_level_seed", False) else depth))
    else:
      to_visit.extend((p, depth + 1) for p in getattr(node, "parents", ()) or ())
  if not aggregated:
    return None
  return int(np.random.SeedSequence(aggregated).generate_state(1, dtype=np.uint32)[0])


@functools.lru_cache(maxsize=64)
def _philox_key(seed: int) -> int:
  # Philox(seed) hashes the seed into a key through a SeedSequence, which is
  # slow; the key is all a per-element generator needs.
  key = np.random.Philox(seed).state["state"]["key"]
  return int(key[0]) | (int(key[1]) << 64)


def element_rng(seed: int, index: int, *, op_seed: int = 0) -> np.random.Generator:
  """The random generator of the element at `index` (epochs included).

  The same generator as Grain's `random_map` (`Philox(seed)` with the counter
  set to `[0, 0, 0, index]`), so random maps draw the same values as on Grain.
  The index sits in the counter's top word: Philox increments the low word,
  so each element gets its own 2**192-block stream, no overlaps.
  """
  if index < 0:  # Grain puts the index in a uint64 counter word, which refuses it (ds[-1] of a random map).
    raise OverflowError(f"Python integer {index} out of bounds for uint64 (a random map's element index; "
                        "read a random map at indices >= 0).")
  if index >= 2**64:  # Too large for that word too: Grain's OverflowError (Philox's counter would take it).
    raise OverflowError(f"Python int too large to convert to C long (a random map's element index {index} "
                        "does not fit in uint64).")
  counter = (int(index) << 192) | (int(op_seed) << 128)
  return np.random.Generator(np.random.Philox(key=_philox_key(seed), counter=counter))
