"""Faults on mp_prefetch's worker side, with real scripts, processes and files.

- Elements (and exceptions) of classes the training script defines come back
  as the consumer's own classes, however the workers started (the script run
  again, `python -c`, workers_run_main=False): cloudpickle sends those classes
  to the workers by value, and pickle refused to send their instances back.
- An element that a worker computes but the consumer cannot unpickle fails
  alone at its own position and is consumed, like a map's error; it used to
  fail its whole chunk again on every call, forever.
- A child forked with os.fork that exits normally leaves the parent's workers
  running; multiprocessing's exit hook in the child used to SIGTERM them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from loader_testing import write_array_records

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_array_records(tmp_path_factory.mktemp("workers"), 2, [150, 150])


def _run(args: list[str], tmp_path, timeout: int = 120) -> subprocess.CompletedProcess:
  out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": _ROOT})
  assert out.returncode == 0, out.stderr[-3000:]
  return out


_SCRIPT_CLASSES = textwrap.dedent("""
    import dataclasses, json, sys, typing
    import numpy as np
    import loader

    class Point(typing.NamedTuple):
      i: int
      extra: object

    @dataclasses.dataclass
    class Extra:
      pixels: np.ndarray

    class BadRecord(Exception):
      pass

    def parse(record):
      i = int.from_bytes(record[:8], "little")
      if i == 7:
        raise BadRecord(f"record {i}")
      return Point(i, Extra(np.full(4, i)))

    def run(files, workers_run_main):
      ds = (loader.MapDataset.source(loader.ArrayRecordSource(files)).map(parse).to_iter_dataset()
            .mp_prefetch(loader.MultiprocessingOptions(num_workers=2, workers_run_main=workers_run_main)))
      it, ids, caught, other = iter(ds), [], [], []
      while len(ids) + len(caught) + len(other) < 300 and len(other) < 3:
        try:
          x = next(it)
        except StopIteration:
          break
        except BadRecord as e:
          caught.append(str(e))
          continue
        except Exception as e:
          other.append(f"{type(e).__name__}: {e}")
          continue
        assert type(x) is Point and type(x.extra) is Extra, (type(x), type(x.extra))
        ids.append(x.i)
      return {"ids": ids, "caught": caught, "other": other}
""")


@pytest.mark.parametrize("how", ["guarded", "workers_run_main=False", "python -c"])
def test_elements_and_errors_of_the_scripts_classes_come_back_as_its_classes(files, tmp_path, how):
  if how == "python -c":
    args = ["-c", _SCRIPT_CLASSES + "print(json.dumps(run(sys.argv[1:], True)))", *files]
  else:
    script = tmp_path / "train.py"
    flag = how == "guarded"
    script.write_text(_SCRIPT_CLASSES + f'\nif __name__ == "__main__":\n  print(json.dumps(run(sys.argv[1:], {flag})))\n')
    args = [str(script), *files]
  import json  # pylint: disable=g-import-not-at-top
  result = json.loads(_run(args, tmp_path).stdout.strip().splitlines()[-1])
  assert result["other"] == []
  assert result["caught"] == ["record 7"]  # `except BadRecord` works: raised as itself.
  assert result["ids"] == [i for i in range(300) if i != 7]


_WORKER_ONLY_MODULE = textwrap.dedent("""
    import os, sys
    import loader

    def init(index, count):
      sys.path.insert(0, os.environ["WORKER_ONLY_PATH"])  # Only the workers can import worker_only_mod.

    def parse(record):
      i = int.from_bytes(record[:8], "little")
      if i == 40:
        import worker_only_mod
        return worker_only_mod.Thing(i)
      return i

    if __name__ == "__main__":
      ds = (loader.MapDataset.source(loader.ArrayRecordSource(sys.argv[1:])).map(parse).to_iter_dataset()
            .mp_prefetch(loader.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
      it, got, errors = iter(ds), [], []
      while len(errors) < 5:  # Before the fix: the same chunk failed on every call.
        try:
          got.append(next(it))
        except StopIteration:
          break
        except ModuleNotFoundError as e:
          errors.append((len(got), it.get_state()["next_index"], "element 40" in "".join(getattr(e, "__notes__", []))))
      print(got == [i for i in range(300) if i != 40], errors)
""")


def test_an_element_the_consumer_cannot_unpickle_fails_alone_and_is_consumed(files, tmp_path):
  script = tmp_path / "train.py"
  script.write_text(_WORKER_ONLY_MODULE)
  worker_only = tmp_path / "worker_only"
  worker_only.mkdir()
  (worker_only / "worker_only_mod.py").write_text("class Thing:\n  def __init__(self, i):\n    self.i = i\n")
  out = subprocess.run([sys.executable, str(script), *files], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": _ROOT, "WORKER_ONLY_PATH": str(worker_only)})
  assert out.returncode == 0, out.stderr[-3000:]
  # One error, after the 40 elements before it, with the state after it; the note names the element.
  assert out.stdout.strip().splitlines()[-1] == "True [(40, 41, True)]"


_FORKING_SCRIPT = textwrap.dedent("""
    import os, sys
    import loader

    def parse(record):
      return int.from_bytes(record[:8], "little")

    if __name__ == "__main__":
      ds = (loader.MapDataset.source(loader.ArrayRecordSource(sys.argv[1:])).shuffle(seed=1).map(parse)
            .to_iter_dataset().mp_prefetch(loader.MultiprocessingOptions(num_workers=2)))
      it = iter(ds)
      got = [next(it) for _ in range(20)]
      pid = os.fork()
      if pid == 0:
        sys.exit(0)  # An ordinary exit: atexit hooks run in the child.
      os.waitpid(pid, 0)
      got += list(it)
      print(sorted(got) == list(range(300)))
""")


def test_a_forked_child_that_exits_normally_leaves_the_parents_workers_running(files, tmp_path):
  script = tmp_path / "train.py"
  script.write_text(_FORKING_SCRIPT)
  out = _run([str(script), *files], tmp_path)
  assert out.stdout.strip().splitlines()[-1] == "True"
  assert "can only join a child process" not in out.stderr
