"""Grain's legacy `DataLoader`, built on loader's engine.

`DataLoader(data_source=..., sampler=..., operations=[...], worker_count=N)`
becomes one pipeline (built by `loader.data_loader_pipeline`)::

  MapDataset over sampler positions (`Record`s where an operation reads metadata)
    -> the operations as map/filter/batch, folded into the MapDataset while
       they are random access (up to the first batch that follows a filter,
       FlatMap or custom Operation)
    -> .to_iter_dataset(read_options) -> the remaining operations, sequential
    -> .map(record.data) -> .mp_prefetch(num_workers=N) when N > 0

so the stream is the one `worker_count=0` gives, whatever N: unlike Grain,
batches never mix per-worker streams, and a checkpoint restores with any
worker count. With `worker_count=0` the stream is Grain's (a shuffled
sampler uses Grain's index shuffle).

Checkpoints. `DataLoaderIterator.get_state()` returns JSON bytes with Grain's
keys (`version`, `last_seen_indices`, `last_worker_index`, `worker_count`,
`sampler`, `data_source`; the position given as if this DataLoader's workers
had read the records round-robin) plus loader's exact engine state and what
the position means (shard, operation chain). `set_state` refuses a state of
another pipeline with a one-line error naming the difference; where Grain's
position keys were edited (to skip ahead, say), they decide the position. It
also reads the states Grain 0.2.18's DataLoader writes: a Grain state is
resumed at exactly Grain's position when our pipeline can express it (the
consumed records form a prefix of the stream, in the same order), and
refused with an explanation otherwise.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
import numbers
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from loader import checks
from loader import checkpoint as checkpoint_lib
from loader import data_loader_pipeline as pipeline_lib
from loader import iter_dataset
from loader import map_dataset
from loader import operations as ops_lib
from loader import options as options_lib
from loader import samplers as samplers_lib
from loader import sharding
from loader import state as state_lib
from loader import transforms

_STATE_FORMAT = "arrayrecord-toolkit/DataLoader"
# Version 2 states also carry Grain's keys ("version" is Grain's there);
# version 1 states kept ours in "version". Version 3 counts the engine's
# position in records, as Grain does (a batch may start at any record);
# earlier versions counted folded batches.
_STATE_VERSION = 3
_V2_STATE_VERSION = 2
_STATE_VERSION_KEY = "format_version"
_V1_STATE_VERSION = 1
_GRAIN_STATE_VERSION = 2
# The keys of Grain's DataLoader state that give the position, and all of them.
_GRAIN_POSITION_KEYS = ("version", "last_seen_indices", "last_worker_index", "worker_count")
_GRAIN_STATE_KEYS = {*_GRAIN_POSITION_KEYS, "sampler", "data_source"}
# The first sentence of Grain 0.2.18's refusal of a state whose sampler / source repr differs.
_GRAIN_MISMATCH_WORDS = {"sampler": "Sampler in checkpoint does not match dataloader sampler. ",
                         "data_source": "DataSource in checkpoint does not match datasource in dataloader. "}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _another_pipeline(key: str, saved: Any, mine: str, whose: str = "DataLoader", why: str = "") -> str:
  """The refusal of a state saved by another pipeline; Grain's sentence first (clients match it, e.g.
  assertRaisesRegex on "DataSource in checkpoint")."""
  return (f"{_GRAIN_MISMATCH_WORDS.get(key, '')}{whose} state is for another pipeline: {key} {saved!r} != this "
          f"DataLoader's {mine}{why}; restore it into the DataLoader that saved it, or start a fresh iterator.")


def _stable_repr(obj: Any) -> str:
  # Default reprs hold the object's address, which differs between runs and
  # would make every checkpoint foreign; the class name is what's compared.
  return _ADDRESS.sub("", repr(obj))


def _source_repr(source: Any) -> str:
  # As Grain: in-memory sequences are named by type, not printed.
  if isinstance(source, (list, tuple, np.ndarray)):
    return str(type(source))
  return _stable_repr(source)


def _sampler_repr_before_given_args(sampler: Any) -> str | None:
  """An IndexSampler's repr as DataLoader states saved before its repr showed the arguments as given
  (seed=True, not seed=1) name it; None for other samplers."""
  if type(sampler).__repr__ is not samplers_lib.IndexSampler.__repr__:
    return None
  return _ADDRESS.sub("", sampler._repr_before_given_args())  # pylint: disable=protected-access


def _repr_before_short_sources(source: Any) -> str | None:
  """A MapDataset data_source's repr as states saved before short source reprs name it; None if the same."""
  chain = []
  node = source
  while isinstance(node, map_dataset.MapDataset) and len(node._parents) == 1:  # pylint: disable=protected-access
    chain.append(node._op_repr())  # pylint: disable=protected-access
    node = node._parent  # pylint: disable=protected-access
  if not isinstance(node, map_dataset.SourceMapDataset):
    return None
  text = _ADDRESS.sub("", node._repr_before_short_sources() + "".join(reversed(chain)))  # pylint: disable=protected-access
  return None if text == _source_repr(source) else text


def _grain_source_reprs(source: Any) -> set[str]:
  """The reprs Grain may have recorded for `source` in a checkpoint."""
  reprs = {_source_repr(source)}
  paths = getattr(source, "paths", None)
  if type(source).__name__ == "ArrayRecordDataSource" and isinstance(paths, (list, tuple)):
    # Grain's ArrayRecordDataSource names itself by a hash of its file paths.
    digest = hashlib.sha1()
    for p in paths:
      digest.update(os.fspath(p).encode())
    reprs.add(f"ArrayRecordDataSource(hash_of_paths={digest.hexdigest()})")
  return reprs


# Grain 0.2.18's datasets have no __repr__: a DataLoader state names a
# MapDataset data_source by the default object repr, e.g.
# "<grain._src.python.dataset.transformations.map.MapMapDataset object at 0x...>".
_GRAIN_DATASET_REPR = re.compile(r"<grain\._src\.python\.[\w.]+\.(\w+) object>")


def _is_grain_dataset_repr(source: Any, text: str) -> bool:
  """Whether `text` (its address removed) is Grain's default repr of a dataset like `source`.

  loader's MapDataset classes carry Grain's class names; a client's subclass
  is named by its own module and qualified name, as Grain names it.
  """
  if not isinstance(source, map_dataset.MapDataset):
    return False
  from loader.transformations import select  # pylint: disable=g-import-not-at-top  (it imports map_dataset)

  if isinstance(source, select.SelectMapDataset):  # `mix` and `select_from_datasets`: Grain's MixedMapDataset.
    # Grain names a mixture by its parents' lengths and its selection map's repr.
    parents = source._parents  # pylint: disable=protected-access
    selection_map = source._selection_map  # pylint: disable=protected-access
    return text == _ADDRESS.sub("", f"MixedMapDataset(parent_lengths={[len(p) for p in parents]}, "
                                    f"selection_map={selection_map!r})")
  cls = type(source)
  if cls.__module__.split(".")[0] != "loader":
    return text == f"<{cls.__module__}.{cls.__qualname__} object>"
  match = _GRAIN_DATASET_REPR.fullmatch(text)
  if match is None:
    return False
  if isinstance(source, map_dataset.SourceMapDataset) and isinstance(source._source, range):  # pylint: disable=protected-access
    return match[1] == "RangeMapDataset"  # Grain's class for MapDataset.range.
  return match[1] == cls.__name__


def _as_shard_options(value: Any, what: str) -> sharding.ShardOptions:
  if isinstance(value, sharding.ShardOptions):
    return value
  try:  # Grain's ShardOptions or any object with its fields.
    return sharding.ShardOptions(value.shard_index, value.shard_count, value.drop_remainder)
  except AttributeError:
    raise TypeError(f"{what} must be a loader.sharding.ShardOptions (got {value!r}).") from None


def _as_read_options(value: Any) -> options_lib.ReadOptions:
  if value is None or isinstance(value, options_lib.ReadOptions):
    return value or options_lib.ReadOptions()
  return options_lib.ReadOptions(num_threads=value.num_threads, prefetch_buffer_size=value.prefetch_buffer_size)


def _multiprocessing_options(worker_count: int, worker_buffer_size: int,
                             enable_profiling: bool) -> options_lib.MultiprocessingOptions:
  kwargs: dict[str, Any] = {"num_workers": worker_count, "per_worker_buffer_size": worker_buffer_size}
  if "enable_profiling" in {f.name for f in dataclasses.fields(options_lib.MultiprocessingOptions)}:
    kwargs["enable_profiling"] = enable_profiling
  return options_lib.MultiprocessingOptions(**kwargs)


class DataLoader:
  """Reads `sampler`'s records from `data_source` and applies `operations`.

  Args:
    data_source: Random-access source (`__len__`, `__getitem__`), e.g.
      `loader.sources.ArrayRecordDataSource`, a TFDS data source or a list.
    sampler: `IndexSampler`/`SequentialSampler` or any object mapping a global
      index to a `RecordMetadata`.
    operations: Transformations applied in order (see `loader.transforms`).
    worker_count: Worker processes (0: in this process; None: os.cpu_count()).
      The produced stream does not depend on it.
    worker_buffer_size: Chunks each worker computes ahead.
    shard_options: This process's shard; None takes the sampler's.
    read_options: Reader threads and buffering in the computing process.
    enable_profiling: Passed to `MultiprocessingOptions` where supported.
  """

  def __init__(self, *, data_source: Any, sampler: Any, operations: Sequence[Any] = (),
               worker_count: int | None = 0, worker_buffer_size: int = 1,
               shard_options: sharding.ShardOptions | None = None,
               read_options: options_lib.ReadOptions | None = None, enable_profiling: bool = False):
    if worker_count is None:
      worker_count = os.cpu_count() or 1  # Grain's default.
    # Grain's words for a negative count, then loader's (the type check) for the rest.
    if checks.is_int(worker_count) and worker_count < 0:
      worker_count = int(worker_count)
      raise ValueError(f"Worker count should be greater than or equal zero.Current worker_count is {worker_count}. "
                       f"worker_count must be an integer >= 0 (got worker_count={worker_count!r}).")
    if checks.is_int(worker_buffer_size) and worker_buffer_size < 0:
      worker_buffer_size = int(worker_buffer_size)
      raise ValueError("Worker buffer size must be greater than or equal zero."
                       f"Current worker_buffer_size is {worker_buffer_size}. worker_buffer_size must be an "
                       f"integer >= 0 (got worker_buffer_size={worker_buffer_size!r}).")
    worker_count = checks.check_int(worker_count, "worker_count", minimum=0)
    worker_buffer_size = checks.check_int(worker_buffer_size, "worker_buffer_size", minimum=0)
    if shard_options is None:
      # Grain's older API kept sharding on the sampler.
      if getattr(sampler, "_shard_options", None) is None:
        raise ValueError("DataLoader needs shard_options, e.g. shard_options=loader.sharding.NoSharding() "
                         "(the sampler has none to take them from).")
      shard_options = sampler._shard_options  # pylint: disable=protected-access
    self._shard_options = _as_shard_options(shard_options, "shard_options")
    self._data_source = data_source
    self._sampler = sampler
    operations = list(operations)
    self._ops = [pipeline_lib.resolve(op, i) for i, op in enumerate(operations)]
    # The operations as given (clients look for their Batch there), BatchOperation made a Batch as in Grain.
    self._operations = [transforms.Batch(op.batch_size, op.drop_remainder, op.batch_fn)
                        if type(op) is ops_lib.BatchOperation else op for op in operations]  # pylint: disable=unidiomatic-typecheck
    self._read_options = _as_read_options(read_options)
    self._multiprocessing_options = _multiprocessing_options(worker_count, worker_buffer_size, enable_profiling)
    self._pipeline = pipeline_lib.build(data_source, sampler, self._shard_options, self._ops,
                                        self._read_options, self._multiprocessing_options)

  @property
  def multiprocessing_options(self) -> options_lib.MultiprocessingOptions:
    return self._multiprocessing_options

  @property
  def _local_num_workers(self) -> int:
    """Worker processes of this shard, at least 1 (Grain's private name)."""
    return max(self._multiprocessing_options.num_workers, 1)

  @property
  def _global_num_workers(self) -> int:
    """Worker processes of all shards (Grain's private name; clients divide batch counts by it)."""
    return self._local_num_workers * self._shard_options.shard_count

  @property
  def _dataset(self) -> iter_dataset.IterDataset:
    """The IterDataset that iterators of this loader iterate (Grain's private name).

    Clients wrap it, e.g. `dl._dataset = WithOptionsIterDataset(dl._dataset,
    options)`; the wrapper must keep its parent's elements and state.
    """
    return self._pipeline.dataset

  @_dataset.setter
  def _dataset(self, value: iter_dataset.IterDataset) -> None:
    if not isinstance(value, iter_dataset.IterDataset):
      raise TypeError(f"DataLoader._dataset must be an IterDataset (got {type(value).__name__}).")
    self._pipeline = dataclasses.replace(self._pipeline, dataset=value)

  def __iter__(self) -> DataLoaderIterator:
    return DataLoaderIterator(self)

  # ---- Checkpoint fingerprint ----

  def _fingerprint(self) -> dict[str, Any]:
    """What a position means: a state only restores where all of this matches."""
    return {
        "sampler": _stable_repr(self._sampler),
        "data_source": _source_repr(self._data_source),
        "shard": [self._shard_options.shard_index, self._shard_options.shard_count],
        "operations": [op.descriptor for op in self._ops],
    }

  def _grain_position(self, consumed: int) -> dict[str, Any]:
    """Grain's position keys for `consumed` records of this shard, with this DataLoader's worker count.

    Code that reads or edits `last_seen_indices` (to skip ahead, say) then
    works as with Grain; `_grain_consumed` reads the keys back.
    """
    return self._grain_position_for(consumed, self._multiprocessing_options.num_workers)

  def _worker_layout(self, worker_count: int) -> tuple[int, int, int, int]:
    """(shard_index, shard_count, workers, stride) of Grain's round-robin layout.

    Grain's worker w reads this shard's positions w, w + workers, ...; its
    last_seen index is the global sampler index of the last one it read.
    """
    shard_index, shard_count = self._shard_options.shard_index, self._shard_options.shard_count
    workers = max(worker_count, 1)
    return shard_index, shard_count, workers, workers * shard_count

  def _grain_position_for(self, consumed: int, worker_count: int) -> dict[str, Any]:
    shard_index, shard_count, workers, stride = self._worker_layout(worker_count)
    seen = {str(w): shard_index + w * shard_count + (max(0, -(-(consumed - w) // workers)) - 1) * stride
            for w in range(workers)}
    return {"version": _GRAIN_STATE_VERSION, "last_seen_indices": seen,
            "last_worker_index": (consumed % workers) - 1 if worker_count else -1,
            "worker_count": worker_count}

  def _check_grain_sources(self, state: dict[str, Any]) -> None:
    """Raises ValueError unless a Grain state is for this pipeline (Grain's own check) and translatable."""
    if state["version"] != _GRAIN_STATE_VERSION:
      raise ValueError(f"Grain DataLoader state version {state['version']!r} is not supported "
                       f"(loader reads Grain's version {_GRAIN_STATE_VERSION}).")
    expected = {"sampler": {_stable_repr(self._sampler)}, "data_source": _grain_source_reprs(self._data_source)}
    for key, mine in expected.items():
      text = _ADDRESS.sub("", str(state[key]))
      if key == "data_source" and _is_grain_dataset_repr(self._data_source, text):
        continue
      if text not in mine:
        raise ValueError(_another_pipeline(key, state[key], " or ".join(map(repr, sorted(mine))),
                                           whose="Grain DataLoader"))
    if not self._positions_translate():
      raise ValueError("Cannot resume a Grain DataLoader state in a pipeline with a FlatMap: Grain's positions "
                       "there do not map onto loader's.")

  def _positions_translate(self) -> bool:
    """Whether Grain's record positions map onto ours (not through a FlatMap).

    A custom Operation's position is the records it pulled, in both (what it
    buffered is lost on a restore, in both).
    """
    return not any(op.kind == "flat_map" for op in self._ops)

  def _grain_consumed(self, state: dict[str, Any]) -> int:
    """Records of this shard that Grain's position keys say were consumed.

    Raises ValueError unless they form a prefix of our stream, in our order.
    """
    grain_workers = checks.check_int(state["worker_count"], "Grain state worker_count", minimum=0)
    shard_index, shard_count, workers, stride = self._worker_layout(grain_workers)
    seen = state["last_seen_indices"]
    try:
      listed = [seen[str(w)] for w in range(workers)]
    except (KeyError, TypeError):
      # Grain's own lookup raises the same KeyError / TypeError.
      raise (state_lib.StateKeyError if isinstance(seen, dict) else state_lib.StateTypeError)(
          f"This DataLoader state's last_seen_indices {seen!r} do not list workers 0..{workers - 1} as Grain's do "
          f"for worker_count={grain_workers}: it was edited or damaged; restore another checkpoint, or start a "
          "fresh iterator.") from None
    listed_keys = {str(w) for w in range(workers)}
    extra = [k for k in seen if k not in listed_keys]
    if extra and grain_workers != self._multiprocessing_options.num_workers:
      # Translated to another worker count, the entries past worker_count's were dropped and their records
      # handed out again (an edited worker_count); Grain refuses any other worker count.
      raise state_lib.StateMismatchError(
          f"This DataLoader state's last_seen_indices {seen!r} list workers {', '.join(map(repr, extra))} that "
          f"its worker_count={grain_workers} does not have: it was edited or damaged; restore another "
          "checkpoint, or start a fresh iterator.")
    # Numbers only, as Grain's arithmetic on them (which takes True and 1.5 too) needs: "3" is its TypeError.
    wrong = [v for v in listed
             if not (isinstance(v, numbers.Integral) or isinstance(v, numbers.Real) and math.isfinite(v))]
    if wrong:
      raise state_lib.StateTypeError(
          f"This DataLoader state's last_seen_indices {seen!r} hold {wrong[0]!r}, not a record index: it was "
          "edited or damaged; restore another checkpoint, or start a fresh iterator.")
    offsets = [int(v) - shard_index - w * shard_count for w, v in enumerate(listed)]
    # Grain's next_index is this floor division, also for indices of another layout: out of range, its
    # IndexError comes first.
    consumed = [o // stride + 1 for o in offsets]
    k = sum(consumed)
    if min(consumed) < 0 or k > self._pipeline.num_positions:
      # Grain's IndexError ("next_index out of range"), where a clamped position would end or restart the epoch.
      raise state_lib.PositionOutOfRangeError(
          f"This DataLoader state's last_seen_indices {seen!r} are out of range: they say {k} records of this "
          f"shard's {self._pipeline.num_positions} were read. Were they edited? Restore another checkpoint, or "
          "start a fresh iterator.")
    if any(o % stride for o in offsets):
      raise state_lib.StateMismatchError(
          f"This Grain state was written by another shard or worker layout: its last seen indices {seen} are not "
          f"those of shard {shard_index} of {shard_count} with {grain_workers} workers; restore it into the "
          "DataLoader that saved it, or start a fresh iterator.")
    if any(n != max(0, -(-(k - w) // workers)) for w, n in enumerate(consumed)):
      raise state_lib.StateMismatchError(
          f"Cannot resume this Grain state exactly: its {workers} workers had read {consumed} records each, "
          f"which is not the first {k} records of the stream (loader's stream does not depend on the worker "
          f"count). Restart from a loader checkpoint or from a Grain state taken with worker_count=0.")
    return k


def _positions(state: Any) -> list[int]:
  """Every prefix position ("next_index") in an engine state."""
  if not isinstance(state, dict):
    return []
  return [p for key, value in state.items()
          for p in ([value] if key == "next_index" and checks.is_int(value) else _positions(value))]


def _replace_position(state: Any, position: int) -> tuple[Any, int]:
  """`state` with its one prefix position ("next_index") set to `position`."""
  if isinstance(state, dict):
    out, found = {}, 0
    for key, value in state.items():
      if key == "next_index" and checks.is_int(value):
        out[key], hits = position, 1
      else:
        out[key], hits = _replace_position(value, position)
      found += hits
    return out, found
  return state, 0


class _StrStateDecodeError(json.JSONDecodeError, AttributeError):
  """A str given as the state that is not JSON: Grain's `state.decode()` raises AttributeError on any str."""


def _decode(state: Any) -> dict[str, Any]:
  if isinstance(state, str):
    # Loader takes a state's JSON as str too (read from a file as text); what is not JSON is also Grain's error.
    try:
      json.loads(state)
    except json.JSONDecodeError as e:
      raise _StrStateDecodeError(f"DataLoader state is not JSON ({e.msg}); pass the bytes "
                                 "DataLoaderIterator.get_state() returned (not a str). At", e.doc, e.pos) from None
    except ValueError:
      pass  # Worded below.
  if isinstance(state, (bytes, bytearray)):
    try:
      state = bytes(state).decode()
    except UnicodeDecodeError as e:  # Its type kept, as Grain's decode raises it.
      raise UnicodeDecodeError(e.encoding, e.object, e.start, e.end,
                               f"{e.reason}; a DataLoader state is the JSON bytes DataLoaderIterator.get_state() "
                               "returned (this is not: another file, or damaged?)") from None
  if isinstance(state, str):
    try:
      state = json.loads(state)
    except json.JSONDecodeError as e:  # Raised as such (a ValueError), as Grain's: clients catch it.
      raise json.JSONDecodeError(f"DataLoader state is not JSON ({e.msg}); pass the bytes "
                                 "DataLoaderIterator.get_state() returned. At", e.doc, e.pos) from e
    except ValueError as e:  # An integer of over 4300 digits: edited or damaged, no position is that long.
      raise ValueError(f"DataLoader state has a number of more than {sys.get_int_max_str_digits()} digits "
                       "(damaged or edited?); pass the bytes DataLoaderIterator.get_state() returned.") from e
  if not isinstance(state, dict):
    error = _NotADictStateError if isinstance(state, (list, str, int, float, bool)) else _NotBytesStateError
    raise error(f"DataLoader state must be the JSON bytes DataLoaderIterator.get_state() returned "
                f"(got {type(state).__name__}).")
  return state


class _NotADictStateError(TypeError, ValueError):
  """A state that decodes to no dict (e.g. a JSON string: a state `json.dump`ed once more).

  A TypeError as Grain's (its `state["worker_count"]` on a str or list), which
  clients catch; also a ValueError, as loader raised before.
  """


class _NotBytesStateError(_NotADictStateError, AttributeError):
  """A state that is no bytes, str or dict (None, an object): also the AttributeError of Grain's `state.decode()`."""


class _ForeignDictStateError(state_lib.StateMismatchError, AttributeError):
  """A dict given as the state that is no DataLoader state: Grain's `state.decode()` raises AttributeError."""


class DataLoaderIterator(checkpoint_lib.OrbaxCheckpointable, collections.abc.Iterator):
  """Iterator of a `DataLoader`, with Grain's bytes get_state()/set_state().

  Close it (or use it as a context manager) to stop worker processes early.
  """

  def __init__(self, data_loader: DataLoader, state: bytes | None = None, validate_state: bool = True):
    # validate_state: Grain's switch for comparing a state's worker count and
    # sampler with the loader's. Accepted; loader always checks the pipeline
    # description, since a state of another pipeline would resume elsewhere.
    del validate_state
    self._data_loader = data_loader
    self._iterator = iter(data_loader._pipeline.dataset)  # pylint: disable=protected-access
    self._ended = False
    self._exhausted = False  # The stream ended (StopIteration); see _at_end.
    if state is not None:
      self.set_state(state)

  def __iter__(self) -> DataLoaderIterator:
    return self

  def __next__(self) -> Any:
    if self._ended:
      raise StopIteration
    try:
      return next(self._iterator)
    except StopIteration:
      self._exhausted = True
      raise
    except Exception as e:
      # A legacy MapOperation/FilterOperation's error ends the stream, as
      # Grain's generator does (other operations' errors consume the element).
      self._ended = getattr(e, ops_lib.ENDS_STREAM, False) is True
      raise

  def _consumed(self, dataset_state: Any) -> int | None:
    """Records of this shard consumed at `dataset_state`; None where Grain's keys cannot say it."""
    loader = self._data_loader
    pipeline = loader._pipeline  # pylint: disable=protected-access
    positions = _positions(dataset_state)
    if len(positions) != 1 or not loader._positions_translate():  # pylint: disable=protected-access
      return None
    return min(positions[0], pipeline.num_positions)

  def _at_end(self, dataset_state: Any) -> Any:
    """`dataset_state`, moved past the shard's last records once the stream has ended.

    A batch with drop_remainder=True folded into the random-access part never
    reads the records of its last, partial batch, so the engine's position
    stops up to one batch (`records_per_position`) short of the shard's end.
    Grain's batch reads them before it drops them: its state after the end
    counts every record (last_seen_indices name the last one), and a resume
    from it, even with other operations (drop_remainder=False), reads none of
    them again. A stream that ended elsewhere (a source that streams) keeps its
    position.
    """
    if not self._exhausted:
      return dataset_state
    pipeline = self._data_loader._pipeline  # pylint: disable=protected-access
    positions = _positions(dataset_state)
    if (len(positions) == 1 and checks.is_int(positions[0])
        and pipeline.num_positions - pipeline.records_per_position < positions[0] < pipeline.num_positions):
      return _replace_position(dataset_state, pipeline.num_positions)[0]
    return dataset_state

  def get_state(self) -> bytes:
    """The position as JSON bytes (write it to a file as is).

    Besides loader's exact engine state it holds Grain's keys
    (`last_seen_indices`, `last_worker_index`, `worker_count`, ...), so code
    that reads or edits them works as with Grain.
    """
    loader = self._data_loader
    dataset_state = self._at_end(self._iterator.get_state())
    consumed = self._consumed(dataset_state)
    grain_keys = {} if consumed is None else loader._grain_position(consumed)  # pylint: disable=protected-access
    state = {**grain_keys, **loader._fingerprint(),  # pylint: disable=protected-access
             "format": _STATE_FORMAT, _STATE_VERSION_KEY: _STATE_VERSION, "dataset": dataset_state}
    return json.dumps(state, indent=4).encode()

  def set_state(self, state: bytes) -> None:
    """Moves to `state`: from this pipeline's `get_state()` (any worker count) or Grain's DataLoader."""
    given_dict = isinstance(state, dict)
    state = _decode(state)
    self._ended = self._exhausted = False
    if state.get("format") == _STATE_FORMAT:
      self._set_own_state(state)
    elif set(state) == _GRAIN_STATE_KEYS:
      self._set_grain_state(state)
    else:
      message = (f"Not a DataLoader state (keys {sorted(state)}); expected the bytes "
                 "DataLoaderIterator.get_state() returned, from loader or Grain 0.2.18 (Grain's states of "
                 "pipelines with a FlatMap are dataset states, which loader cannot resume).")
      # Without one of Grain's keys, Grain's set_state raises KeyError on it: a StateKeyError is one too.
      raise (_ForeignDictStateError(message) if given_dict
             else state_lib.mismatch(state, _GRAIN_STATE_KEYS, message))

  def _set_own_state(self, state: dict[str, Any]) -> None:
    # Version 1 kept ours in "version", which is Grain's since version 2.
    version = state[_STATE_VERSION_KEY] if _STATE_VERSION_KEY in state else state.get("version")
    if version not in (_STATE_VERSION, _V2_STATE_VERSION, _V1_STATE_VERSION):
      newer = isinstance(version, int) and not isinstance(version, bool) and version > _STATE_VERSION
      fix = ("a newer arrayrecord-toolkit wrote it: resume with that version, or start a fresh iterator" if newer
             else "it was edited or damaged: restore another checkpoint, or start a fresh iterator")
      raise ValueError(f"DataLoader state version {version!r} is not supported "
                       f"(this loader reads versions {_V1_STATE_VERSION} to {_STATE_VERSION}); {fix}.")
    if "dataset" not in state:  # Else a bare KeyError('dataset') below.
      raise state_lib.StateKeyError(
          f"DataLoader state (version {version}) has no 'dataset' entry, where its position is (keys "
          f"{sorted(state)}): it was edited or damaged; restore another checkpoint, or start a fresh iterator.")
    if version != _STATE_VERSION:
      state = {**state, "dataset": self._in_records(state["dataset"])}
    source = self._data_loader._data_source  # pylint: disable=protected-access
    differ = [(key, mine) for key, mine in self._data_loader._fingerprint().items()  # pylint: disable=protected-access
              if state.get(key) != mine and not state_lib.same_but_for_source_identity(state.get(key), mine)
              and not (key == "data_source" and state.get(key) is not None
                       and state.get(key) == _repr_before_short_sources(source))
              and not (key == "sampler" and state.get(key) is not None
                       and state.get(key) == _sampler_repr_before_given_args(self._data_loader._sampler))]  # pylint: disable=protected-access
    if ([key for key, _ in differ] == ["operations"] and version != _V1_STATE_VERSION and "last_seen_indices" in state
        and self._data_loader._positions_translate()):  # pylint: disable=protected-access
      # As Grain: other operations (another batch size, a new map) on the
      # same sampler and source resume after the same records.
      self._set_position(self._data_loader._grain_consumed(state), "state saved with other operations")  # pylint: disable=protected-access
      return
    if differ:
      key, mine = differ[0]
      saved = state.get(key)
      changed = (key == "data_source" and isinstance(saved, str) and isinstance(mine, str) and saved != mine
                 and state_lib.without_content_hash(saved) == state_lib.without_content_hash(mine))
      why = (" (the same file names and record counts, but the files' content changed since the state was saved: "
             "regenerated or replaced?)" if changed else "")
      error = state_lib.StateMismatchError(_another_pipeline(key, saved, repr(mine), why=why))
      error.concerns_sources = key == "data_source" and not changed  # Else it says so itself.
      raise error
    if version != _V1_STATE_VERSION and "last_seen_indices" in state:
      try:
        grain_keys = {k: state[k] for k in _GRAIN_POSITION_KEYS}
      except KeyError as e:
        raise ValueError(f"DataLoader state has last_seen_indices but no {e.args[0]!r}; was it edited by hand?") from None
      written = self._consumed(state["dataset"])
      workers = checks.check_int(state["worker_count"], "DataLoader state worker_count", minimum=0)
      seen = state["last_seen_indices"]
      # A worker_count that last_seen_indices do not list (edited, damaged) goes to the check below
      # before a position with one entry per worker is built for it.
      listed = isinstance(seen, dict) and len(seen) == max(workers, 1)
      if written is not None and (not listed or grain_keys != self._data_loader._grain_position_for(  # pylint: disable=protected-access
          written, workers)):
        # Someone edited Grain's keys (to skip ahead, say): they say where to go.
        self._set_position(self._data_loader._grain_consumed(state))  # pylint: disable=protected-access
        return
    self._iterator.set_state(state["dataset"])

  def _in_records(self, dataset_state: Any) -> Any:
    """A version 1 or 2 engine state (its position counted folded batches) counting records."""
    pipeline = self._data_loader._pipeline  # pylint: disable=protected-access
    positions = _positions(dataset_state)
    per = pipeline.records_per_position
    if per == 1 or len(positions) != 1 or not checks.is_int(positions[0]):
      return dataset_state
    state = _replace_position(dataset_state, min(positions[0] * per, pipeline.num_positions))[0]
    saved = state.get(state_lib.PIPELINE_KEY)
    if isinstance(saved, list) and "to_iter_dataset()" in saved:  # Its description then said so too.
      at = saved.index("to_iter_dataset()")
      state[state_lib.PIPELINE_KEY] = saved[:at] + [f"to_iter_dataset(unit={per})"] + saved[at + 1:]
    return state

  def _set_grain_state(self, state: dict[str, Any]) -> None:
    loader = self._data_loader
    loader._check_grain_sources(state)  # pylint: disable=protected-access
    self._set_position(loader._grain_consumed(state))  # pylint: disable=protected-access

  def _set_position(self, k: int, what: str = "Grain state") -> None:
    """Moves to just after the first `k` records of this shard (read from a `what`)."""
    pipeline = self._data_loader._pipeline  # pylint: disable=protected-access
    per = pipeline.records_per_position
    position = min(k, pipeline.num_positions)
    if position % per and position < pipeline.num_positions and not pipeline.realigns:
      raise ValueError(f"Cannot resume this {what} exactly: it stopped after {k} records, inside one of "
                       f"this DataLoader's batches of {per} records; resume with operations whose batch size "
                       f"divides {k}, or start the epoch over.")
    template, found = _replace_position(self._iterator.get_state(), position)
    if found != 1:
      raise RuntimeError(f"Cannot translate a Grain state: the engine state has {found} positions "
                         "('next_index'), expected 1.")
    self._iterator.set_state(template)

  def start_prefetch(self) -> None:
    """Starts computing elements in the background (idempotent; no-op where there is nothing to start)."""
    start = getattr(self._iterator, "start_prefetch", None)
    if start is not None:
      start()

  def close(self) -> None:
    """Stops worker processes and threads."""
    self._iterator.close()

  def __enter__(self) -> DataLoaderIterator:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # Orbax's StatefulCheckpointable protocol (orbax.checkpoint.v1), as Grain's.

  async def save(self, directory: Any):
    """Returns a coroutine that writes the current state under `directory`."""
    return checkpoint_lib.background_save(directory, self.get_state().decode())

  async def load(self, directory: Any):
    """Returns a coroutine that reads the state under `directory` and sets it."""
    return checkpoint_lib.background_load(directory, lambda text: self.set_state(text.encode()))

  def __str__(self) -> str:
    return f"DataLoaderIterator(state={self.get_state().decode()})"


def load(source: Any, *, num_epochs: int | None = None, shuffle: bool = False, seed: int | None = None,
         shard_options: sharding.ShardOptions = sharding.NoSharding(), transformations: Sequence[Any] = (),
         batch_size: int | None = None, drop_remainder: bool = False, worker_count: int | None = 0,
         read_options: options_lib.ReadOptions | None = None) -> DataLoader:
  """A `DataLoader` over `source` with an `IndexSampler`, like `grain.load`."""
  sampler = samplers_lib.IndexSampler(num_records=len(source), shuffle=shuffle, seed=seed,
                                      num_epochs=num_epochs, shard_options=shard_options)
  transformations = list(transformations)
  if batch_size is not None:
    transformations.append(transforms.Batch(batch_size, drop_remainder=drop_remainder))
  return DataLoader(data_source=source, sampler=sampler, operations=transformations,
                    worker_count=worker_count, read_options=read_options)
