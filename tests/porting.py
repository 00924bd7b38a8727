"""Port-by-import harness: run Grain code as written, then with only its import lines changed.

A snippet is a source string written for Grain 0.2.18 (`import grain`,
`import grain.python as grain`, `from grain import python as grain`,
`from grain.experimental import X`, ...). `run_both` executes it once as is on
real Grain and once through `to_loader`, which rewrites those import lines and
nothing else, so a passing test is evidence that the port is a one-line change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBS = ("grain", "loader")

# `import grain...` / `from grain... import ...` at any indentation; `grain\b`
# leaves names such as `grain_utils` alone.
_GRAIN_IMPORT = re.compile(r"^(?P<indent>[ \t]*)(?P<kind>import|from)[ \t]+grain\b(?P<rest>[^\n]*)$", re.M)


def _rewrite(match: re.Match) -> str:
  indent, kind = match["indent"], match["kind"]
  rest, hash_, comment = match["rest"].partition("#")
  comment = f"  {hash_}{comment}" if hash_ else ""
  if kind == "from":  # from grain[.sub] import names
    return f"{indent}from loader{rest.rstrip()}{comment}"
  if "," in rest:
    raise ValueError(f"split this import into one module per line to port it: {match[0].strip()!r}")
  module, as_, alias = rest.partition(" as ")
  module = module.strip()
  if as_:
    return f"{indent}import loader{module} as {alias.strip()}{comment}"
  if module:  # `import grain.python` binds the name `grain`, which `import loader.python` would not.
    raise ValueError(f"write `import grain{module} as <name>` to port it: {match[0].strip()!r}")
  return f"{indent}import loader as grain{comment}"


def to_loader(source: str) -> str:
  """`source` with each Grain import line pointed at loader; every other line unchanged."""
  ported, count = _GRAIN_IMPORT.subn(_rewrite, source)
  if not count:
    raise ValueError("the snippet has no `import grain` / `from grain` line to port")
  return ported


def source_for(source: str, lib: str) -> str:
  if lib not in LIBS:
    raise ValueError(f"lib must be one of {LIBS} (got {lib!r})")
  source = textwrap.dedent(source)
  return source if lib == "grain" else to_loader(source)


def run(source: str, lib: str, **inputs: Any) -> types.SimpleNamespace:
  """Executes the snippet for `lib` in a fresh module; returns its globals.

  `inputs` are predefined globals (paths of the test's data, sizes). The module
  is not put in sys.modules, so cloudpickle sends the snippet's functions and
  classes to worker processes by value, as it does for a script's `__main__`.
  """
  module = types.ModuleType(f"snippet_{lib}")
  module.__dict__.update(inputs)
  # dont_inherit: this file's `from __future__ import annotations` must not turn
  # the snippet's annotations into strings (dataclasses would then look the
  # snippet's module up in sys.modules).
  code = compile(source_for(source, lib), f"<{lib} snippet>", "exec", dont_inherit=True)
  exec(code, module.__dict__)  # pylint: disable=exec-used
  return types.SimpleNamespace(**{k: v for k, v in module.__dict__.items() if not k.startswith("__")})


def run_both(source: str, **inputs: Any) -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
  """(Grain's globals, loader's globals) after running the snippet on each."""
  return run(source, "grain", **inputs), run(source, "loader", **inputs)


def run_script(source: str, lib: str, directory: str | os.PathLike, *args: str, timeout: float = 300) -> Any:
  """Runs the snippet as a `__main__` script (for worker processes); returns the JSON its last line prints."""
  return json.loads(script_output(source, lib, directory, *args, timeout=timeout).strip().splitlines()[-1])


def assert_prints_the_same(source: str, directory: str | os.PathLike, *args: str) -> str:
  """Runs the snippet as a script on Grain and on loader; their outputs must be equal (and not empty)."""
  grain_out = script_output(source, "grain", directory, *args)
  assert grain_out.strip(), "the script printed nothing"
  assert script_output(source, "loader", directory, *args) == grain_out
  return grain_out


def script_output(source: str, lib: str, directory: str | os.PathLike, *args: str, timeout: float = 300) -> str:
  """Runs the snippet as a `__main__` script; returns what it printed (AssertionError if it failed)."""
  path = os.path.join(os.fspath(directory), f"snippet_{lib}.py")
  with open(path, "w", encoding="utf-8") as f:
    f.write(source_for(source, lib))
  env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, path, *args], capture_output=True, text=True, timeout=timeout, env=env,
                        cwd=os.fspath(directory), check=False)
  if proc.returncode:
    raise AssertionError(f"{lib} script failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return proc.stdout


# Snippet source: a logging handler that keeps the warnings' messages (`Capture().messages`).
# The classes of Grain 0.2.18's docs/data_loader/transformations.md, as the
# page writes them (two test files port that page's cells around them).
# Snippet text: a state before every element, restored on a fresh iterator of a
# new dataset (a preemption) and, with `same_after_end`, on the same iterator
# after it ran to the end; each must give the rest again. Needs the snippet's
# own `plain_eq(a, b)`.
RESTORE_AT_EVERY_STEP = """
def restore_at_every_step(make, same_after_end=True):
  it = iter(make())
  states, reference = [], []
  while True:
    states.append(it.get_state())
    try:
      reference.append(next(it))
    except StopIteration:
      break
  out = []
  for k, state in enumerate(states):
    fresh = iter(make())
    fresh.set_state(state)
    pair = [plain_eq(list(fresh), reference[k:])]
    if same_after_end:
      it.set_state(state)
      pair.append(plain_eq(list(it), reference[k:]))
    out.append(pair)
  return reference, out
"""

# Snippet text: Grain's assert_equal_output_after_checkpoint, asserted inside the
# snippet on each library with its own states: the state before every element
# (and at the end) of one iterator, restored on a fresh iterator (a preemption)
# and on the same one after it ran to the end, gives the rest again. Returns
# the stream. Needs `numpy as np` in the snippet.
RESTORE_AT_EVERY_STEP_ASSERTED = """
def restore_at_every_step(make):
  reference = list(make())
  it = iter(make())
  states = []
  for expected in reference:
    states.append(it.get_state())
    np.testing.assert_equal(next(it), expected)
  states.append(it.get_state())
  for k, state in enumerate(states):
    fresh = iter(make())
    fresh.set_state(state)
    np.testing.assert_equal(list(fresh), reference[k:])
    it.set_state(state)
    np.testing.assert_equal(list(it), reference[k:])
  return reference
"""

TRANSFORMATIONS_PAGE_CLASSES = """
class PlusOne(grain.transforms.Map):

  def map(self, x: int) -> int:
    return x + 1


class PlusOneWithIndexKey(grain.transforms.MapWithIndex):

  def map_with_index(self, i: int, x: int) -> tuple[int, int]:
    return (x + 1, i)


class PlusRandom(grain.transforms.RandomMap):

  def random_map(self, x: int, rng: np.random.Generator) -> int:
    return x + rng.integers(100_000)


class FlatMapTransformExample(grain.experimental.FlatMapTransform):
  max_fan_out: int

  def flat_map(self, element: int):
    for _ in range(self.max_fan_out):
      yield element


class RemoveEvenElements(grain.transforms.Filter):

  def filter(self, element: int) -> bool:
    return element % 2
"""

# Section 5 of Grain 0.2.18's docs/tutorials/jax_training_tutorial.md ("Putting
# it all together") up to its training loop, which the two files porting that
# tutorial run for different numbers of steps.
JAX_TRAINING_TEMPLATE = """
BATCH_SIZE = 8
devices = jax.devices()
mesh = jax.sharding.Mesh(np.array(devices), axis_names=("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

def preprocess(r):
    return {"image": r["image"].astype(np.float32) / 255.0,
            "label": r["label"]}

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle().repeat()
    .map(preprocess)
    .batch(BATCH_SIZE, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds, device=sharding,
    cpu_buffer_size=4, device_buffer_size=2,
)

@jax.jit
def train_step(params, batch):
    # Replace with your real loss/update.
    return params + batch["image"].mean()

params = jnp.zeros(())
"""

CAPTURE_LOGS = """
import logging


class Capture(logging.Handler):

  def __init__(self, level=logging.WARNING):
    super().__init__(level)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())
"""


def plain(x: Any) -> Any:
  """Nested lists/dicts/scalars: compares element values whatever the container or array dtype.

  loader batches bytes into numpy object arrays where Grain makes fixed-width
  `S` arrays (a documented difference); both become lists of bytes here.
  """
  if not isinstance(x, np.ndarray) and hasattr(x, "__array__"):  # jax.Array and the like.
    x = np.asarray(x)
  if isinstance(x, np.ndarray):
    return [plain(v) for v in x] if x.ndim else plain(x.item())
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, dict):
    return {k: plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [plain(v) for v in x]
  return x


# loader's stamp on every state (README, "Checkpoint states").
STAMP_KEYS = ("loader_state_version", "pipeline")
# Keys a loader DataLoader state carries beside Grain's (README, "Checkpoint states").
DATA_LOADER_EXTRA_KEYS = ("shard", "operations", "format", "format_version", "dataset")


def grain_keys(x: Any) -> Any:
  """`x` through `plain`, its dicts without loader's own state keys: what Grain's states hold.

  A DataLoader state (it has `last_seen_indices`) also loses loader's extra
  keys, and its source's default repr what differs run to run (the snippet's
  module name, Grain's memory address).
  """
  x = plain(x)
  if isinstance(x, dict):
    extra = ()
    if "last_seen_indices" in x:
      extra = DATA_LOADER_EXTRA_KEYS
      if isinstance(x.get("data_source"), str):
        x = {**x, "data_source": re.sub(r"snippet_\w+\.| at 0x[0-9a-f]+", "", x["data_source"])}
    return {k: grain_keys(v) for k, v in x.items() if k not in STAMP_KEYS + extra}
  if isinstance(x, list):
    return [grain_keys(v) for v in x]
  return x


def run_both_grain_keys(source: str, **inputs: Any) -> tuple[Any, Any]:
  """`run_both`'s (Grain's results, loader's results), their states reduced by `grain_keys`."""
  g, l = run_both(source, **inputs)
  return grain_keys(g.results), grain_keys(l.results)


def key(x: Any) -> str:
  """A sortable, hashable key of an element's value (for comparing sets and multisets)."""
  return json.dumps(plain(x), sort_keys=True, default=repr)


def same_multiset(a: list, b: list) -> bool:
  return sorted(map(key, a)) == sorted(map(key, b))


def structure(x: Any) -> Any:
  """Shapes and dtype kinds of an element's arrays (bytes/str arrays count as 'bytes'/'str')."""
  if isinstance(x, dict):
    return {k: structure(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [structure(v) for v in x]
  if isinstance(x, np.ndarray):
    kind = x.dtype.kind
    if kind in "SO" and x.size and isinstance(x.flat[0], bytes):
      kind = "bytes"
    elif kind in "UO" and x.size and isinstance(x.flat[0], str):
      kind = "str"
    else:
      kind = str(x.dtype)
    return (x.shape, kind)
  return type(x).__name__
