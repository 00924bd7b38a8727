"""`RngPool`: Grain's per-element random generators, as `grain.experimental.RngPool`."""

from __future__ import annotations

import numpy as np

from loader import checks


class RngPool:
  """Hands out Grain's generator for an element: `Philox(seed)` at counter `[0, 0, op_seed, index]`.

  Grain pools the generators to save their construction; ours are built from a
  cached key, so `release_rng` has nothing to keep. Draws equal Grain's.
  """

  def __init__(self, seed: int):
    self._seed = checks.check_int(seed, "RngPool seed", minimum=0)

  def __reduce__(self):
    return (RngPool, (self._seed,))

  def acquire_rng(self, index: int, *, op_seed: int = 0) -> np.random.Generator:
    """The generator of element `index` (for operation `op_seed`), reset to its first draw."""
    index = checks.check_int(index, "index", minimum=0, maximum=2**64 - 1)
    op_seed = checks.check_int(op_seed, "op_seed", minimum=0, maximum=2**64 - 1)
    return checks.element_rng(self._seed, index, op_seed=op_seed)

  def release_rng(self, rng: np.random.Generator) -> None:
    """Grain's pool takes the generator back; nothing to do here."""
    del rng
