"""`device_put`: a stream moved onto accelerators with two prefetch buffers (Grain's).

Stage 1 keeps `cpu_buffer_size` host elements ready in a thread; stage 2 calls
`jax.device_put` and keeps `device_buffer_size` transferred elements ahead.
Both stages are thread prefetchers whose state is the position after the last
element handed out, so a checkpoint never skips the elements still sitting in
the buffers. For global `jax.Array`s over several hosts, see
`loader.jax.prefetch_to_device`.
"""

from __future__ import annotations

from typing import Any

from loader import checks
from loader import iter_dataset as iter_lib
from loader import map_dataset as map_lib
from loader import sequential


def device_put(ds: iter_lib.IterDataset | map_lib.MapDataset, device: Any, *, cpu_buffer_size: int = 4,
               device_buffer_size: int = 2) -> iter_lib.IterDataset:
  """Returns `ds` with elements put on `device` ahead of the consumer.

  Args:
    ds: The stream to move (a `MapDataset` is read in order, as Grain's).
    device: What `jax.device_put` accepts: a device, a `Sharding`, or a pytree
      of them matching the elements.
    cpu_buffer_size: Host elements prefetched in a thread (0: none).
    device_buffer_size: Elements kept on device ahead (0: none).
  """
  cpu_buffer_size = checks.check_int(cpu_buffer_size, "cpu_buffer_size", minimum=0)
  device_buffer_size = checks.check_int(device_buffer_size, "device_buffer_size", minimum=0)
  # Lazy: `import loader` must not import JAX (workers never need it). Imported
  # here, not per element, so a missing JAX fails at pipeline construction.
  import jax  # pylint: disable=g-import-not-at-top

  if isinstance(ds, map_lib.MapDataset):  # Grain's prefetch takes one too: its elements in order.
    ds = ds.to_iter_dataset()
  ds = ds.prefetch(cpu_buffer_size)
  # A sequential map, never folded into a random-access part: device
  # transfers must run in this process, not in mp_prefetch workers.
  ds = sequential.MapIterDataset(ds, _DevicePut(jax.device_put, device))
  return ds.prefetch(device_buffer_size)


class _DevicePut:
  """`jax.device_put(x, device)`, with a stable name for state descriptions."""

  def __init__(self, put: Any, device: Any):
    self._put = put
    self._device = device

  def __call__(self, x: Any) -> Any:
    return self._put(x, self._device)

  def __repr__(self) -> str:
    return "device_put"
