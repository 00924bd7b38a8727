"""bench/load.py run as a training script is: JAX imported at the top level.

The start-up rows of bench/load.py run their child through this file. Spawned
worker processes (loader's and Grain's) run a script's top level again before
they compute anything, so each worker pays this import too, as it would in a
real training script.
"""

import os
import sys

import jax  # pylint: disable=unused-import  # What the start-up rows measure.

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import load  # pylint: disable=wrong-import-position

if __name__ == "__main__":
  sys.exit(load.main())
