"""Small element helpers shared by the differential fuzz rounds (tests/test_fuzz_round*.py).

Plain functions at module level, so that both libraries (and worker
processes) can pickle the maps built from them.
"""
from __future__ import annotations

import contextlib
import copy
import signal
import time
import warnings
import zlib

import numpy as np
import pytest

import loader


class Hang(Exception):
  """A Grain call that ran past its `deadline`."""


@contextlib.contextmanager
def deadline(seconds, error=Hang):
  """Raises `error()` (Hang) in the block after `seconds` (Grain hangs on some pipelines a fuzz builds)."""
  def handler(signum, frame):  # pylint: disable=unused-argument
    raise error()

  # pytest-timeout's own SIGALRM timer is put back afterwards, less the time spent here: a hang after
  # this block must still end the test.
  start = time.monotonic()
  old = signal.signal(signal.SIGALRM, handler)
  outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
    if outer:
      signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))



class ListSource:
  """A random-access data source with a stable repr (Grain's DataLoader checks the source's repr).

  A round subclasses it at module level (worker processes pickle it by name) with its own `make(kind, i)`.
  """

  make = None

  def __init__(self, kind: str, n: int):
    self.kind, self.n = kind, n

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i):
    return type(self).make(self.kind, int(i))

  def __repr__(self) -> str:
    return f"ListSource({self.kind!r}, {self.n})"


def observe_both(observe, spec, grain_lib, seconds: float):
  """Grain's observation of `spec`, then loader's given Grain's states: (grain's, loader's, early result).

  The early result is what a round's compare returns at once: Grain hung (not comparable), or loader
  hung where Grain did not (a difference); None when both finished. Loader gets 4x Grain's time.
  """
  try:
    with deadline(seconds):
      g = observe(grain_lib, spec)
  except Hang:
    return None, None, ([], False, False)
  try:
    with deadline(seconds * 4):
      lo = observe(loader, spec, g.get("states"))
  except Hang:
    return g, None, ([("loader hangs",)], True, True)
  return g, lo, None

def canon(x):
  """A comparable form of an element: values, container types, numpy dtypes and shapes."""
  if isinstance(x, np.ndarray):
    return ("nd", x.dtype.str, x.shape, canon(x.tolist()) if x.dtype != object else [canon(v) for v in x.flat])
  if isinstance(x, np.generic):
    return ("np", x.dtype.str, x.item())
  if isinstance(x, dict):
    return (type(x).__name__, [(k, canon(v)) for k, v in x.items()])
  if isinstance(x, (tuple, list)):
    return (type(x).__name__, [canon(v) for v in x])
  if isinstance(x, bool) or x is None:
    return x
  if isinstance(x, (int, float, str, bytes)):
    return (type(x).__name__, x)
  return ("obj", type(x).__name__, repr(x))


def element_hash(x) -> int:
  return zlib.crc32(repr(canon(x)).encode())


def keeper(m, r):
  return lambda x: element_hash(x) % m != r


def failer(m):
  def fail(x):
    if element_hash(x) % m == 0:
      raise ValueError(f"bad element {x!r}")
    return x
  return fail


def leafmap(f, x):
  """`f` applied to every numeric leaf of a nested element; strings, bytes, bools and None kept."""
  if isinstance(x, dict):
    return {k: leafmap(f, v) for k, v in x.items()}
  if isinstance(x, tuple):
    return tuple(leafmap(f, v) for v in x)
  if isinstance(x, list):
    return [leafmap(f, v) for v in x]
  if x is None or isinstance(x, (str, bytes, bool, np.bool_)):
    return x
  if isinstance(x, np.ndarray) and x.dtype.kind not in "iuf":
    return x
  return f(x)


def adder(k):
  return lambda x: leafmap(lambda v: v + k, x)


def random_add(x, rng):
  k = int(rng.integers(0, 1000))
  return leafmap(lambda v: v + k, x)


@pytest.fixture(autouse=True)
def quiet():
  """Both libraries warn about pipelines a fuzz builds on purpose."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    yield


# Observing a stream: the same outcomes for Grain and loader, compared with loader's errors allowed to be
# subclasses of Grain's.


def attempt(f):
  try:
    return ("ok", f())
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))


def is_error(o) -> bool:
  return isinstance(o, tuple) and len(o) == 2 and o[0] == "ERR"


def next_canon(it):
  """The next element's canon, "END", or ("ERR", its error's type)."""
  try:
    return canon(next(it))
  except StopIteration:
    return "END"
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("ERR", type(e))


def stream(it, n):
  """Up to `n` outcomes of `next_canon`, stopping at the end or after 3 errors in a row."""
  out = []
  while len(out) < n:
    out.append(next_canon(it))
    if out[-1] == "END" or (len(out) >= 3 and all(is_error(o) for o in out[-3:])):
      break
  return out


def same_outcome(g, lo) -> bool:
  """Equal values, or both raise with loader's exception an instance of Grain's type."""
  if g == lo:
    return True
  return (isinstance(g, tuple) and isinstance(lo, tuple) and len(g) == len(lo) == 2 and g[0] == lo[0]
          and g[0] in ("raises", "ERR") and isinstance(g[1], type) and isinstance(lo[1], type)
          and issubclass(lo[1], g[1]))


def same_stream(g, lo) -> bool:
  if not isinstance(g, list) or not isinstance(lo, list):
    return same_outcome(g, lo)
  return len(g) == len(lo) and all(same_outcome(a, b) for a, b in zip(g, lo))


def restored(fresh, state, res, it=None):
  """Up to `res` outcomes after `state` is set on `it` (or on a `fresh()` iterator), or ("raises", type)."""
  try:
    if it is None:
      it = fresh()
    it.set_state(copy.deepcopy(state))
    return stream(it, res)
  except Hang:
    raise
  except Exception as e:  # pylint: disable=broad-except
    return ("raises", type(e))


def matches(got, want, res) -> bool:
  if isinstance(got, list) and len(want) < res and want[-1:] != ["END"]:
    got = got[:len(want)]  # The reference run stopped early (its cap, or errors in a row).
  return same_stream(want, got)


def observe_iteration(it, fresh, cap, res, other_states=None, also_refused=None) -> dict:
  """`it`'s stream with a state before each element, each state restored on a `fresh()` iterator and some
  on `it` itself (a rewind), and `other_states` (the other library's) restored: what differs from the stream.

  A restore of another library's state may be refused with `StateMismatchError` (README, "Checkpoint
  states"), or as `also_refused(outcome)` says.
  """
  states, elements = [], []
  for _ in range(cap):
    states.append(copy.deepcopy(it.get_state()))
    elements.append(next_canon(it))
    if elements[-1] == "END" or (len(elements) >= 3 and all(is_error(o) for o in elements[-3:])):
      break
  obs = {"stream": elements, "states": states}
  obs["restored"] = [restored(fresh, s, res) for s in states]
  obs["restore_bad"] = [k for k, got in enumerate(obs["restored"]) if not matches(got, elements[k:k + res], res)]
  obs["rewind_bad"] = [k for k in sorted({0, len(states) // 2, len(states) - 1})
                       if not matches(restored(fresh, states[k], res, it), elements[k:k + res], res)]
  if other_states is not None:
    bad = []
    for k, s in enumerate(other_states):
      got = restored(fresh, s, res)
      if isinstance(got, tuple) and (issubclass(got[1], loader.state.StateMismatchError)
                                     or (also_refused is not None and also_refused(got))):
        continue
      if not matches(got, elements[k:k + res], res):
        bad.append((k, got))
    obs["other_states_bad"] = bad
  return obs
