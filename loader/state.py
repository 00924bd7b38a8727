"""Self-describing iterator states: what a checkpoint says about its pipeline.

Every state returned by `get_state()` of an iterator made by `iter(dataset)`
carries, besides the position, the format version and a fingerprint of the
pipeline it belongs to: one integer per operation, a hash of its description
(`describe`), e.g. of `["source(ArrayRecordSource(8 files, 200000 records))",
"shuffle(seed=42)", "map(parse)", "to_iter_dataset()", "batch(32,
drop_remainder=True)"]`. Integers, not the strings: a state is then a pytree
of ints, floats, bools and None, as Grain's are, which Orbax's
`StandardSave` and `jax.tree` functions take. `set_state` compares the
fingerprint with its own pipeline's and refuses a state from another
pipeline, naming the first of its operations that differs. States of format
version 4 and before hold the strings themselves; they still restore.

Operations that do not change the stream (`mp_prefetch`, `prefetch`) are left
out, so a state restores into any worker count or prefetch setting.

States without a fingerprint (written by Grain, or by hand) are *foreign*.
They are accepted only where our stream provably equals Grain's for the same
pipeline (Grain's shuffles included; no random_map or other operation whose
stream is not pinned to Grain's by a test), and
translated to our position unit; anything else is refused rather than
resumed at a different element.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loader import checks

VERSION = 5
# Version 4 described the pipeline with strings (now their fingerprints); its
# states, and those of the versions below it that it read, still restore.
_TEXT_VERSION = 4
# Version 2 shuffled in another order (before shuffles followed Grain's): its
# states still resume pipelines without a shuffle.
_SHUFFLE_FREE_VERSIONS = (2,)
# Up to version 3, a batch after to_iter_dataset() counted batches (now
# elements, as Grain's state does): those states resume pipelines without one.
_BATCH_COUNTING_VERSIONS = (2, 3)
# Keys added to the state of the outermost iterator.
VERSION_KEY = "loader_state_version"
PIPELINE_KEY = "pipeline"
_STAMP_KEYS = (VERSION_KEY, PIPELINE_KEY)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_OP_CHARS = 160
# ArrayRecordSource's repr gained the hash of its file names and counts, and
# later ArrayRecordDataSource's too (with its record ranges), and later both a
# hash of the files' content; a state saved before any of these names those
# sources without it and still resumes.
_SOURCE_IDENTITY = re.compile(
    r", files_hash=[0-9a-f]{8}(, ranges_hash=[0-9a-f]{8})?(, content_hash=[0-9a-f]{8})?")
_DATA_SOURCE_IDENTITY = re.compile(
    r"(ArrayRecordDataSource\([^()]*?), files_hash=[0-9a-f]{8}(, ranges_hash=[0-9a-f]{8})?(, content_hash=[0-9a-f]{8})?")
_CONTENT_IDENTITY = re.compile(r", content_hash=[0-9a-f]{8}")


class StateMismatchError(ValueError):
  """A state that does not belong to this pipeline (or cannot be resumed exactly)."""


class StateTypeError(StateMismatchError, TypeError):
  """A state that is not the dict get_state() returns, or holds a value of the wrong type (a TypeError too, as Grain raises)."""


class StateKeyError(StateMismatchError, KeyError):
  """A state without a key this iterator reads (a KeyError too, as Grain raises)."""

  def __str__(self) -> str:  # KeyError's would show the message as a quoted repr.
    return str(self.args[0]) if self.args else ""


def mismatch(state: Any, keys: Sequence[str], message: str) -> StateMismatchError:
  """The StateMismatchError for a state that is not a dict with `keys`, of the type Grain raises there."""
  if not isinstance(state, dict):
    return StateTypeError(message)
  if not set(keys) <= set(state):
    return StateKeyError(message)
  return StateMismatchError(message)


class PositionOutOfRangeError(StateMismatchError, IndexError):
  """A state's position past the end of this dataset (an IndexError too, as Grain raises)."""


def _clean(text: str) -> str:
  # Object addresses differ between runs; they must not make a state foreign.
  text = _ADDRESS.sub("", text)
  return text if len(text) <= _MAX_OP_CHARS else text[:_MAX_OP_CHARS - 3] + "..."


class Description(list):
  """What `describe` returns: the operation strings, and `legacy`, the pipeline as described before
  sources named their content's hash (None where that is the same)."""

  legacy: list[str] | None = None


_LEGACY = threading.local()


def describing_without_content_hashes() -> bool:
  """Whether `describe` is describing a pipeline as it did before sources named their content's hash.

  Sources' reprs leave it out then. Removing it from the finished strings is not
  enough: an operation that embeds its inputs' descriptions (ElasticIterator,
  an interleave of a MapDataset of datasets) was clipped to 160 characters or
  hashed with it, and a repr over 120 characters names the source by its length.
  """
  return getattr(_LEGACY, "on", False)


@contextlib.contextmanager
def _without_content_hashes():
  before = describing_without_content_hashes()
  _LEGACY.on = True
  try:
    yield
  finally:
    _LEGACY.on = before


def describe(ds: Any) -> list[str]:
  """The pipeline of `ds` as a list of operation strings, sources first.

  Works on MapDataset and IterDataset trees (anything with `parents`). A node
  with several parents is one entry listing its inputs' descriptions. The
  list is a `Description`, whose `legacy` is the description of before
  sources named their content's hash, which states saved then fingerprint.
  """
  ops = _describe(ds)
  if describing_without_content_hashes():
    return ops
  out = Description(ops)
  if any(_CONTENT_IDENTITY.search(op) for op in ops):
    try:
      with _without_content_hashes():
        legacy = _describe(ds)
    except Exception:  # pylint: disable=broad-except  # Then only the strings with the hash removed are tried.
      legacy = None
    out.legacy = legacy if legacy != ops else None
  return out


def _describe(ds: Any) -> list[str]:
  if getattr(ds, "_state_transparent", False):
    return _describe(ds._parents[0])  # pylint: disable=protected-access
  parents = tuple(getattr(ds, "parents", ()) or ())
  if getattr(ds, "_state_hides_inputs", False):
    parents = ()  # Its own state checks each input (IterDataset.mix: the mixture may change on resume).
  op = ds._state_op() if hasattr(ds, "_state_op") else _default_op(ds)  # pylint: disable=protected-access
  op = _clean(op)
  if not parents:
    return [op]
  if len(parents) == 1:
    return _describe(parents[0]) + [op]  # Not `describe`: the legacy description is made once, at the top.
  inputs = " | ".join(" ".join(_describe(p)) for p in parents)
  return [f"{op}[{inputs}]"]


def _default_op(ds: Any) -> str:
  op_repr = getattr(ds, "_op_repr", None)
  if callable(op_repr):
    return op_repr().lstrip(".")
  return type(ds).__name__


def _user_defined(ds: Any) -> bool:
  return not type(ds).__module__.startswith("loader.")


def same_as_grain(ds: Any) -> bool:
  """True if every operation of `ds` yields Grain's exact stream for the same input.

  A user's own dataset class computes its elements itself, on either library.
  """
  return not any_in_pipeline(ds, lambda d: not (getattr(d, "_same_as_grain", False) or _user_defined(d)))


def any_in_pipeline(ds: Any, predicate: Callable[[Any], bool]) -> bool:
  """Whether `predicate` holds for `ds` or any dataset it reads from."""
  return predicate(ds) or any(any_in_pipeline(p, predicate) for p in (getattr(ds, "parents", ()) or ()))


def has_user_iterator(ds: Any) -> bool:
  """Whether a user's own IterDataset class (whose iterator's state layout is its own) is in `ds`'s pipeline."""
  from loader import iter_dataset  # pylint: disable=g-import-not-at-top  # It imports this module.
  return any_in_pipeline(ds, lambda d: isinstance(d, iter_dataset.IterDataset) and _user_defined(d))


# Grain's mp_prefetch keeps its workers' states in an interleave's layout
# (one iterator per worker, each over its slice `[w::num_workers]` of the source).
_GRAIN_WORKERS_KEYS = frozenset({"next_index_in_cycle", "next_index_in_datasets", "iterators_in_use_indices",
                                 "iterators_in_use_states", "exhausted", "future_states"})


def unwrap_grain_workers(state: Any, ds: Any, owner: str) -> Any:
  """A Grain `mp_prefetch` state of `ds` as the state of the pipeline it prefetches.

  With one worker Grain's stream is the one without workers, so its single
  worker's state is the position; with more, each worker shuffled and read a
  slice of the source of its own, a stream loader (whose stream is the same
  for any worker count) does not produce: refused in one line.
  """
  if not (isinstance(state, dict) and state.keys() == _GRAIN_WORKERS_KEYS
          and any_in_pipeline(ds, lambda d: getattr(d, "_grain_workers_layout", False))):
    return state
  workers = state["iterators_in_use_states"]
  if isinstance(workers, list) and len(workers) == 1 and not state["future_states"]:
    return workers[0]
  count = len(workers) if isinstance(workers, list) else workers
  raise StateMismatchError(
      f"{owner}.set_state: this is a Grain mp_prefetch state of {count} workers; Grain's stream with more than "
      "one worker is not the one without workers (each worker shuffles and reads its own slice of the source), "
      "and loader's stream is the same for any worker count, so that position does not exist here. A Grain "
      "state saved with num_workers=1 (or 0) resumes exactly; otherwise restore a state saved by loader, or "
      "start over.")


def is_stamped(state: Any) -> bool:
  # The version key decides: a custom iterator's state may hold a "pipeline" key of its own.
  return isinstance(state, dict) and VERSION_KEY in state


# Where `stamp` keeps a custom iterator's state that is not a dict, or that
# uses a key of ours itself; `strip` gives it back as it was.
_WRAPPED_KEY = "wrapped_state"


def stamp(state: Any, description: Sequence[str]) -> dict[str, Any]:
  if not isinstance(state, dict) or any(k in state for k in (*_STAMP_KEYS, _WRAPPED_KEY)):
    state = {_WRAPPED_KEY: state}
  out = dict(state)
  out[VERSION_KEY] = VERSION
  out[PIPELINE_KEY] = fingerprint(description)
  return out


def plain(state: Any) -> Any:
  """`state` with numpy (or JAX) scalars and 0-d arrays as Python ones, lists and dicts kept.

  What `jax.tree.map(np.asarray, state)` or a checkpoint library made of a
  state restores like the state itself, as on Grain, whose states are
  plain numbers too.
  """
  if isinstance(state, dict):
    return {k: plain(v) for k, v in state.items()}
  if isinstance(state, (list, tuple)):
    return type(state)(plain(v) for v in state) if type(state) in (list, tuple) else state
  if isinstance(state, (bool, int, float, str, type(None))):
    return state
  if isinstance(state, np.generic) or (getattr(state, "shape", None) == () and hasattr(state, "__array__")):
    return np.asarray(state).item()
  return state


def _hash(text: str, bits: int) -> int:
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") >> (32 - bits)


def fingerprint(description: Sequence[str]) -> list[int]:
  """One non-negative integer below 2**63 (an int64) per operation of a pipeline `description`.

  Its high 31 bits hash the operation without its sources' identity (the
  hash of their file names), the low 32 bits all of it: a refusal can then
  tell other files of the same counts from another operation. A batch
  folded into to_iter_dataset() is fingerprinted as the batch after it
  (see `_unfold_batches`): the two name one stream.
  """
  return _op_fingerprints(_unfold_batches(description))


def _op_fingerprints(ops: Sequence[str]) -> list[int]:
  return [_hash(_SOURCE_IDENTITY.sub("", op), 31) << 32 | _hash(op, 32) for op in ops]


def strip(state: Any) -> Any:
  if not is_stamped(state):
    return state
  out = {k: v for k, v in state.items() if k not in _STAMP_KEYS}
  return out[_WRAPPED_KEY] if out.keys() == {_WRAPPED_KEY} else out


def not_a_dict(state: Any, owner: str) -> StateTypeError:
  """The error for a dataset iterator's state that is no dict (a DataLoader's bytes, say)."""
  whose = ""
  if isinstance(state, (bytes, bytearray)) and b'"last_seen_indices"' in state[:1 << 16]:
    whose = ("; these bytes are a DataLoader's state (Grain's or loader's): restore them into the iterator of "
             "the DataLoader that saved them")
  return StateTypeError(f"{owner}.set_state expects the dict returned by get_state() (got {type(state).__name__}: "
                        f"{state!r:.200}){whose}.")


def check(state: Any, description: Sequence[str], owner: str) -> None:
  """Raises StateMismatchError unless a stamped `state` belongs to `description`."""
  if not isinstance(state, dict):
    raise not_a_dict(state, owner)
  version = state.get(VERSION_KEY)
  saved = state.get(PIPELINE_KEY)
  legacy = getattr(description, "legacy", None)
  if version == VERSION and isinstance(saved, list) and all(checks.is_int(h) for h in saved):
    _check_fingerprint([int(h) for h in saved], list(description), owner, legacy)
    return
  if (version in _BATCH_COUNTING_VERSIONS and isinstance(saved, list)
      and not any("to_iter_dataset(unit=" in str(op) for op in saved)
      and (version not in _SHUFFLE_FREE_VERSIONS or not any("shuffle" in str(op) for op in saved))):
    version = _TEXT_VERSION
  if version not in (VERSION, _TEXT_VERSION):
    raise StateMismatchError(
        f"{owner}.set_state: state format version {version!r} is not supported by this loader "
        f"(it reads versions {_TEXT_VERSION} and {VERSION}); restart the iterator or use the loader version "
        "that wrote it.")
  if version == VERSION or not isinstance(saved, list) or not all(isinstance(s, str) for s in saved):
    raise StateMismatchError(
        f"{owner}.set_state: the state's {PIPELINE_KEY!r} entry is damaged: {saved!r:.200}; it was edited or "
        "written by other code: restore a state exactly as get_state() returned it, or start the iterator afresh.")
  _check_text(saved, list(description), owner, legacy)


_ON_PURPOSE = (" If the pipeline was changed on purpose, set_state(loader.state.strip(state)) resumes at the "
               "state's position where that is exact, as Grain would.")


def _check_fingerprint(saved: list[int], mine: list[str], owner: str, legacy: list[str] | None = None) -> None:
  ops, ours = _unfold_batches(mine), fingerprint(mine)
  if saved == ours or _same_but_for_folding(saved, ops):
    return
  if _saved_before_content_hashes(saved, mine, legacy):
    return
  for i, (a, b) in enumerate(zip(saved, ours)):
    if a != b:
      hint = (" (the same number of files and records, but other file names or the files in another order, or "
              "files of the same names whose content changed since the state was saved)"
              if a >> 32 == b >> 32 and _SOURCE_IDENTITY.search(ops[i]) else "")
      error = StateMismatchError(
          f"{owner}.set_state: this state was saved from a different pipeline: its operation {i} is not "
          f"{ops[i]!r} as in this one{hint} (this pipeline: {' -> '.join(ops)}).{_ON_PURPOSE}")
      error.concerns_sources = bool(_SOURCE_IDENTITY.search(ops[i]))  # restore_state then looks at the files.
      raise error
  if len(saved) > len(ours):
    which, extra = "the saved pipeline", f" {len(saved) - len(ours)} more operation(s)"
  else:
    which, extra = "this pipeline", f" the extra operation(s) {ops[len(saved):]}"
  # `which` carries its own article: "the this pipeline" read as a typo in the one line a user gets.
  raise StateMismatchError(
      f"{owner}.set_state: this state was saved from a different pipeline: {which} has{extra} "
      f"(this pipeline: {' -> '.join(ops)}).{_ON_PURPOSE}")


def _saved_before_content_hashes(saved: list[int], mine: list[str], legacy: list[str] | None = None) -> bool:
  """Whether `saved` fingerprints `mine` as described before sources named their content's hash.

  `legacy` is that description where `describe` made it (see Description);
  otherwise the hashes are removed from `mine`'s strings. Such a state cannot
  vouch for the files' content; it resumes as it did then.
  """
  for old in (legacy, [_CONTENT_IDENTITY.sub("", op) for op in mine]):
    if old is None or list(old) == mine:
      continue
    if saved == fingerprint(old) or _same_but_for_folding(saved, _unfold_batches(old)):
      return True
  return False


def _check_text(saved: list[str], mine: list[str], owner: str, legacy: list[str] | None = None) -> None:
  """`check` of a version 4 (or older) state, which describes its pipeline with strings."""
  if saved == mine or same_but_for_source_identity(saved, mine):
    return
  unfolded_saved, unfolded_mine = _unfold_batches(saved), _unfold_batches(mine)
  if unfolded_saved == unfolded_mine or same_but_for_source_identity(unfolded_saved, unfolded_mine):
    return
  if legacy is not None and not any(_CONTENT_IDENTITY.search(t) for t in saved):  # Saved before content hashes.
    legacy = list(legacy)
    if saved == legacy or _unfold_batches(saved) == _unfold_batches(legacy):
      return
    if (same_but_for_source_identity(saved, legacy)
        or same_but_for_source_identity(_unfold_batches(saved), _unfold_batches(legacy))):
      return
  for i, (a, b) in enumerate(zip(saved, mine)):
    if a != b:
      hint = (" (the same number of files and records, but other file names or the files in another order)"
              if _SOURCE_IDENTITY.sub("", a) == _SOURCE_IDENTITY.sub("", b) else "")
      raise StateMismatchError(
          f"{owner}.set_state: this state was saved from a different pipeline: operation {i} is "
          f"{a!r} in the saved pipeline but {b!r} in this one{hint} (saved: {' -> '.join(saved)}).{_ON_PURPOSE}")
  longer, which = (saved, "the saved pipeline") if len(saved) > len(mine) else (mine, "this pipeline")
  raise StateMismatchError(
      f"{owner}.set_state: this state was saved from a different pipeline: {which} has the extra "
      f"operation(s) {longer[min(len(saved), len(mine)):]} (saved: {' -> '.join(saved)}).{_ON_PURPOSE}")


_FOLDED_UNIT = re.compile(r"to_iter_dataset\(unit=(\d+)\)")
_BATCH_SIZE = re.compile(r"batch\((\d+)[,)]")


def _unfold_batches(ops: Sequence[str]) -> list[str]:
  """`ops` with a batch folded into to_iter_dataset() written as the batch after it.

  A batch right after to_iter_dataset() is computed with the reads (folded)
  where no element can be None and no mp_prefetch comes between them; the
  state is the same either way (elements read), so the two descriptions
  name one stream.
  """
  out = list(ops)
  for j, op in enumerate(out):
    unit = _FOLDED_UNIT.fullmatch(op)
    if not unit:
      continue
    # The batches folded into it come right before it; their sizes multiply to its unit.
    i, product = j, 1
    while i > 0 and _BATCH_SIZE.match(out[i - 1]) and product < int(unit.group(1)):
      i -= 1
      product *= int(_BATCH_SIZE.match(out[i]).group(1))
    if i < j and product == int(unit.group(1)):
      out[i:j + 1] = ["to_iter_dataset()", *out[i:j]]
  return out


# A map or filter right after to_iter_dataset() is folded into the MapDataset
# before it (described before "to_iter_dataset()") unless an mp_prefetch comes
# between them; either way it sees the same elements and the state holds the
# same position (a map_with_index or random_map after mp_prefetch counts in its
# own state, so they do not move), so the two descriptions name one stream.
_IN_ORDER_OPS = ("map", "filter")
# A batch of 1 folded into to_iter_dataset() leaves no unit to tell it by, and
# gives the same elements and positions before it as after it.
_BATCH_OF_ONE = re.compile(r"batch\(1, drop_remainder=(True|False)\)")
_TO_ITER = re.compile(r"to_iter_dataset\(\)|to_iter_dataset\(unit=\d+\)")


def _fold_in_order(ops: Sequence[str]) -> list[str]:
  """`ops` with each to_iter_dataset() moved before the maps and filters right before it, batches unfolded."""
  def move(ops: list[str]) -> list[str]:
    out = list(ops)
    for j, op in enumerate(out):
      if _TO_ITER.fullmatch(op):
        i = j
        while i > 0 and (out[i - 1] in _IN_ORDER_OPS
                         or op == "to_iter_dataset()" and _BATCH_OF_ONE.fullmatch(out[i - 1])):
          i -= 1
        out[i:j + 1] = [op, *out[i:j]]
    return out

  return move(_unfold_batches(move(list(ops))))


def _same_but_for_folding(saved: list[int], ops: list[str]) -> bool:
  """Whether `saved` fingerprints `ops` with its maps and filters folded elsewhere around to_iter_dataset()."""
  units, sizes = {1}, [int(m.group(1)) for m in map(_BATCH_SIZE.match, ops) if m]
  for i in range(len(sizes)):
    product = 1
    for size in sizes[i:]:
      product *= size
      units.add(product)
  names = sorted({*ops, "to_iter_dataset()", *(f"to_iter_dataset(unit={u})" for u in units)})
  by_hash = dict(zip(_op_fingerprints(names), names))
  if not all(h in by_hash for h in saved):
    return False
  return _fold_in_order([by_hash[h] for h in saved]) == _fold_in_order(ops)


def without_content_hash(text: str) -> str:
  """A description with its sources' content hashes left out (what else it says of them stays)."""
  return _CONTENT_IDENTITY.sub("", text)


def same_but_for_source_identity(saved: Any, mine: Any) -> bool:
  """Whether a `saved` description from before sources had an identity equals `mine` without them.

  Saved before any source had one: no identity at all. Saved after
  ArrayRecordSource's but before ArrayRecordDataSource's: only the latter's
  are missing. Saved before sources named their content's hash: only those
  are missing.
  """
  texts = saved if isinstance(saved, list) else [saved]
  if not all(isinstance(t, str) for t in texts):
    return False
  if not any(_CONTENT_IDENTITY.search(t) for t in texts):  # Saved before sources named their content's hash.
    mine = [_CONTENT_IDENTITY.sub("", m) for m in mine] if isinstance(mine, list) else (
        _CONTENT_IDENTITY.sub("", mine) if isinstance(mine, str) else mine)
    if mine == saved:
      return True

  def without(pattern: re.Pattern, replacement: str) -> Any:
    strip = lambda x: pattern.sub(replacement, x) if isinstance(x, str) else x
    return [strip(m) for m in mine] if isinstance(mine, list) else strip(mine)

  if without(_DATA_SOURCE_IDENTITY, r"\1") == saved:
    return True
  return not any(_SOURCE_IDENTITY.search(t) for t in texts) and without(_SOURCE_IDENTITY, "") == saved


def check_keys(state: Any, keys: Sequence[str], owner: str) -> None:
  """Raises a clear error unless `state` is a dict with exactly `keys`."""
  if not isinstance(state, dict) or set(state) != set(keys):
    raise mismatch(state, keys,
                   f"{owner}.set_state: expected a state dict with keys {sorted(keys)}, got "
                   f"{state!r:.300}. Was it saved from a different pipeline?")
