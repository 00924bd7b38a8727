"""`batch_and_pad`: a `batch_fn` that pads a short last batch (Grain's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from loader import batching
from loader import checks

T = TypeVar("T")


def _pad_leaves(batch: Any, padding_size: int, pad_value: Any) -> Any:
  """Appends `padding_size` rows of `pad_value` to every leaf (plain dicts' keys sorted, as Grain's)."""
  def pad(leaf):
    if not padding_size or leaf is None:  # None is an empty subtree in Grain's pytrees: kept, not padded.
      return leaf
    padding = np.full((padding_size, *leaf.shape[1:]), pad_value, dtype=leaf.dtype)
    return np.concatenate([leaf, padding], axis=0)
  return batching.map_leaves(pad, batch)


def _structure(x: Any) -> Any:
  """The pytree structure of `x` as Grain's tree functions compare it (None: an empty subtree)."""
  if x is None:
    return None
  if isinstance(x, Mapping):
    keys = sorted(x) if type(x) is dict else list(x)  # pylint: disable=unidiomatic-typecheck
    return type(x), tuple(keys), tuple(_structure(x[k]) for k in keys)
  if isinstance(x, (list, tuple)):
    return type(x), tuple(_structure(v) for v in x)
  return "leaf"


def _shown(x: Any) -> str:
  """`x`'s structure in one line: containers with their types and keys, leaves as type and shape."""
  if x is None:
    return "None"
  if isinstance(x, Mapping):
    inner = ", ".join(f"{k!r}: {_shown(v)}" for k, v in x.items())
    return f"{type(x).__name__}{{{inner}}}"
  if isinstance(x, (list, tuple)):
    return f"{type(x).__name__}[{', '.join(_shown(v) for v in x)}]"
  return f"{getattr(x, 'dtype', type(x).__name__)}{list(np.shape(x))}"


def _check_same_structure(values: Sequence[Any]) -> None:
  # Grain pads by mapping over the structure all elements share, so elements
  # of unequal structure (a full batch of them is an object array) fail there.
  first = _structure(values[0])
  for i, v in enumerate(values[1:], 1):
    if _structure(v) != first:
      raise ValueError(f"Expected all input elements to have the same structure but got: element {i} is "
                       f"{_shown(v):.300}, element 0 is {_shown(values[0]):.300}; give every element the same "
                       "containers (types, keys, lengths) to pad a short batch.")


def batch_and_pad(values: Sequence[T], *, batch_size: int, pad_value: Any = 0) -> T:
  """Batches `values` and pads the batch with `pad_value` up to `batch_size` rows.

  Pass it to `batch` to keep the last, short batch at full size instead of
  dropping it::

    batch_fn = functools.partial(loader.experimental.batch_and_pad, batch_size=3)
    ds.batch(3, batch_fn=batch_fn)   # [1, 2, 3], [4, 0, 0]

  Args:
    values: Elements of one structure (dicts, tuples, lists of arrays/scalars).
    batch_size: Rows of the result; at least `len(values)`.
    pad_value: Fills every leaf of the padding rows (cast to the leaf's dtype).

  Returns:
    The batched elements, every leaf with a leading axis of `batch_size`
    (dict keys sorted, as in Grain).
  """
  if isinstance(batch_size, float) and batch_size.is_integer():
    batch_size = int(batch_size)  # Grain only compares and subtracts it: batch_size=2.0 works there.
  batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
  if not values:
    raise ValueError("Cannot batch 0 values.")
  if len(values) > batch_size:
    raise ValueError(f"Cannot batch {len(values)} values to batch_size={batch_size}; "
                     "pass the same batch_size to batch() and to batch_and_pad.")
  if len(values) < batch_size:
    _check_same_structure(values)
  return _pad_leaves(batching.make_batch(values), batch_size - len(values), pad_value)
