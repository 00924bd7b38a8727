"""Moves host batches onto JAX devices as global, sharded `jax.Array`s.

JAX is imported inside the functions only: `import loader` must stay cheap
for data-loading worker processes, which never touch a device.

  sharding = batch_sharding()               # split dim 0 over all devices
  it = prefetch_to_device(dataset_iter, sharding, size=2)
  for batch in it:
    state = train_step(state, batch)
  checkpoint = it.get_state()               # resumes at the next batch
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
  import jax

__all__ = [
    "DevicePrefetchIterator",
    "batch_sharding",
    "device_put",
    "prefetch_to_device",
]


def batch_sharding(
    mesh_or_devices: jax.sharding.Mesh | Sequence[jax.Device] | None = None,
    axis_name: str = "data",
) -> jax.sharding.NamedSharding:
  """Returns a sharding that splits the leading (batch) dimension.

  Args:
    mesh_or_devices: A `Mesh` that has `axis_name`, or devices to build a 1-D
      mesh from. None uses `jax.devices()` (every device of every process).
    axis_name: Mesh axis that the batch dimension is split over.
  """
  # Lazy: importing loader.jax must not import JAX (pipelines are built without it).
  import jax  # pylint: disable=g-import-not-at-top

  if isinstance(mesh_or_devices, jax.sharding.Mesh):
    mesh = mesh_or_devices
    if axis_name not in mesh.axis_names:
      raise ValueError(
          f"Mesh has no axis {axis_name!r}; its axes are {mesh.axis_names}."
      )
  else:
    devices = jax.devices() if mesh_or_devices is None else list(mesh_or_devices)
    if not devices:
      raise ValueError("batch_sharding needs at least one device.")
    mesh = jax.sharding.Mesh(np.asarray(devices), (axis_name,))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis_name))


def device_put(batch: Any, sharding: jax.sharding.Sharding | None = None) -> Any:
  """Turns a pytree of per-process numpy batches into global `jax.Array`s.

  Each leaf is this process's slice of the global batch, so in a multi-host
  job the global leading dimension is `process_count` times the local one
  (`jax.make_array_from_process_local_data`). In a single process the result
  equals the input, spread over the devices.

  Leaves must be numeric or bool arrays; their dtypes follow JAX's config,
  so int64 becomes int32 unless `jax_enable_x64` is set. Object arrays (such as `bytes` from
  `parse_example`) and strings cannot live on a device; rather than drop
  them silently this raises, so remove them in a `.map` before batching.

  Args:
    batch: Pytree (dicts, tuples, ...) of numpy arrays or array-likes.
    sharding: Applied to every leaf. None means `batch_sharding()`.

  Returns:
    The same pytree structure with `jax.Array` leaves.

  Raises:
    TypeError: A leaf cannot be put on a device; the message names its path.
    ValueError: A leaf does not fit the sharding (e.g. the batch size is not
      divisible by the number of devices); the message names its path.
  """
  # Lazy: importing loader.jax must not import JAX (pipelines are built without it).
  import jax  # pylint: disable=g-import-not-at-top

  if sharding is None:
    sharding = batch_sharding()

  def put(path, leaf):
    where = jax.tree_util.keystr(path) or "<root>"
    array = np.asarray(leaf)
    if array.dtype.kind not in "biufc":
      raise TypeError(
          f"Batch leaf {where} has dtype {array.dtype}, which cannot be put on "
          "a device. Decode or drop it (e.g. in a .map) before batching."
      )
    try:
      return jax.make_array_from_process_local_data(sharding, array)
    except (ValueError, TypeError) as e:
      message = f"Batch leaf {where} with shape {array.shape}: {e}"
      try:
        error = type(e)(message)  # Keeps subclasses such as IndivisibleError.
      except Exception:  # pylint: disable=broad-except
        e.add_note(message)
        raise e from None
      raise error from e

  return jax.tree_util.tree_map_with_path(put, batch)


class _Failed:
  """A prefetched batch that could not be read or put on device: its error."""

  __slots__ = ("error",)

  def __init__(self, error: Exception):
    self.error = error


class DevicePrefetchIterator(Iterator[Any]):
  """Keeps `buffer_size` batches on device ahead of the one being consumed.

  Filling is synchronous, as in `flax.jax_utils.prefetch_to_device`: JAX
  dispatches transfers asynchronously, so batches queued here copy to the
  devices while the previous step computes, and keeping host reads on the
  caller's thread makes the checkpoint state exact without locking. Heavy
  host work belongs in the host pipeline's worker processes.

  Each buffered batch is stored with the host state from just before it was
  read, so `get_state()` points at the next batch the *caller* will see, not
  past the ones already prefetched. Restoring it replays those batches.
  """

  def __init__(
      self,
      host_iterator: Iterable[Any],
      sharding: jax.sharding.Sharding | None = None,
      buffer_size: int = 2,
  ):
    """Initializes the iterator; nothing is read until the first `next`.

    Args:
      host_iterator: Yields pytrees of numpy arrays. For `get_state` and
        `set_state` it must have those methods too (loader iterators do).
        An iterable is turned into an iterator with `iter()`.
      sharding: Passed to `device_put`; None means `batch_sharding()`.
      buffer_size: Batches kept on device beyond the one returned; 0
        disables prefetching. Each costs one batch of device memory.
    """
    if not isinstance(buffer_size, int) or buffer_size < 0:
      raise ValueError(f"buffer_size must be an int >= 0 (got {buffer_size=}).")
    self._host = iter(host_iterator)
    self._sharding = sharding
    self._buffer_size = buffer_size
    # (host state before the batch, device batch), oldest first.
    self._buffer: collections.deque[tuple[Any, Any]] = collections.deque()
    self._read: tuple[Any, Any] | None = None  # (host state, host batch) read but not yet put.
    self._exhausted = False
    self._closed = False

  def __iter__(self) -> DevicePrefetchIterator:
    return self

  def __next__(self) -> Any:
    if self._closed:
      raise StopIteration
    # The batch returned now plus `buffer_size` ahead: the transfer queued
    # here overlaps with the step the caller is about to run.
    self._fill(self._buffer_size + 1)
    if not self._buffer:
      raise StopIteration
    item = self._buffer.popleft()[1]
    if isinstance(item, _Failed):
      raise item.error  # At the step of the batch that failed, after the good ones before it.
    return item

  def _fill(self, size: int) -> None:
    if self._sharding is None:
      self._sharding = batch_sharding()
    while len(self._buffer) < size and not self._exhausted:
      if self._buffer and isinstance(self._buffer[-1][1], _Failed):
        return  # Nothing is read past a failed batch before its error is raised.
      if self._read is None:
        # Deep copy: an iterator may hand out (and later mutate) its live dict.
        state = copy.deepcopy(self._host.get_state()) if self._checkpointable else None
        try:
          host_batch = next(self._host)
        except StopIteration:
          self._exhausted = True
          return
        except Exception as e:  # pylint: disable=broad-except  # Raised at its own step, see __next__.
          self._buffer.append((state, _Failed(e)))
          continue
        # Kept until it is on the device: a Ctrl-C during the copy must not lose it.
        self._read = (state, host_batch)
      state, host_batch = self._read
      try:
        item = device_put(host_batch, self._sharding)
      except Exception as e:  # pylint: disable=broad-except  # Raised at its own step, see __next__.
        item = _Failed(e)
      self._read = None
      self._buffer.append((state, item))

  @property
  def _checkpointable(self) -> bool:
    return hasattr(self._host, "get_state")

  def get_state(self) -> dict[str, Any]:
    """Returns the host state at which the next batch returned will be read."""
    self._require_checkpointable("get_state")
    if self._buffer:
      state = self._buffer[0][0]
    elif self._read is not None:  # Read from the host, not yet on the device (a Ctrl-C came).
      state = self._read[0]
    else:
      state = self._host.get_state()
    return copy.deepcopy(state)

  def set_state(self, state: dict[str, Any]) -> None:
    """Drops the prefetched batches and moves the host iterator to `state`."""
    self._require_checkpointable("set_state")
    self._buffer.clear()
    self._read = None
    self._exhausted = False
    self._host.set_state(state)

  def _require_checkpointable(self, method: str) -> None:
    if not hasattr(self._host, method):
      raise TypeError(
          f"{method} needs a host iterator with get_state/set_state; "
          f"{type(self._host).__name__} has no {method}."
      )

  def close(self) -> None:
    """Frees the buffered device batches and closes the host iterator."""
    self._closed = True
    self._buffer.clear()
    close = getattr(self._host, "close", None)
    if close is not None:
      close()

  def __enter__(self) -> DevicePrefetchIterator:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def prefetch_to_device(
    iterator: Iterable[Any],
    sharding: jax.sharding.Sharding | None = None,
    size: int = 2,
) -> DevicePrefetchIterator:
  """Wraps a host iterator so batches arrive on device `size` steps early.

  Args:
    iterator: Host iterator (or iterable) of numpy pytrees; see
      `DevicePrefetchIterator`.
    sharding: For `device_put`; None splits the batch over all devices.
    size: Batches to keep on device ahead of the consumer.
  """
  return DevicePrefetchIterator(iterator, sharding, buffer_size=size)
