"""Worker start-up: the training script's top level in workers, as in Grain.

Spawned workers import the parent's `__main__` again (as `__mp_main__`), so
top-level setup holds in them; Grain's workers do so and client code relies
on it. A script without an `if __name__ == "__main__":` guard would crash
there ("An attempt has been made to start a new process before the current
process has finished its bootstrapping phase"), so for such a script
loader's workers skip it and get the pipeline by value.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests import porting

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_UNGUARDED = textwrap.dedent("""
    import os, sys
    import loader

    with open(sys.argv[1], "a") as f:  # Every process that runs this script leaves its pid.
      f.write(f"{os.getpid()}\\n")

    def square(x):
      return x * x

    ds = loader.MapDataset.range(40).map(square).to_iter_dataset().batch(4).mp_prefetch(
        loader.MultiprocessingOptions(num_workers=2))
    print(sum(int(b.sum()) for b in ds))
""")


def _run_marking(script_text: str, tmp_path) -> tuple[subprocess.CompletedProcess, int]:
  """Runs the script; returns its result and how many processes ran its top level."""
  script = tmp_path / "train.py"
  script.write_text(script_text)
  marks = tmp_path / "pids.txt"
  out = subprocess.run([sys.executable, str(script), str(marks)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": _ROOT})
  assert out.returncode == 0, out.stderr
  return out, len(marks.read_text().split())


def test_script_without_main_guard_runs_and_is_not_reimported_by_workers(tmp_path):
  out, runs = _run_marking(_UNGUARDED, tmp_path)
  assert out.stdout.strip() == str(sum(x * x for x in range(40)))
  assert "bootstrapping" not in out.stderr
  assert runs == 1, "a worker re-ran the script"


# Top-level setup that a worker's map relies on: a registry filled at import.
_GUARDED = textwrap.dedent("""
    import json, os, sys
    import grain

    sys.path.insert(0, os.getcwd())
    import registry
    registry.REG["vocab"] = ["a", "b", "c"]
    with open("pids.txt", "a") as f:
      f.write(f"{os.getpid()}\\n")

    def lookup(i):
      return registry.REG["vocab"][i % 3]

    if __name__ == "__main__":
      from absl import flags
      flags.FLAGS.mark_as_parsed()
      ds = grain.MapDataset.range(4).map(lookup).to_iter_dataset().mp_prefetch(
          grain.MultiprocessingOptions(num_workers=2))
      print(json.dumps([str(x) for x in ds]))
""")


def test_workers_run_a_guarded_scripts_top_level_as_grains_do(tmp_path):
  got = {}
  for lib in porting.LIBS:
    d = tmp_path / lib
    d.mkdir()
    (d / "registry.py").write_text("REG = {}\n")
    got[lib] = porting.run_script(_GUARDED, lib, d)
    runs = len((d / "pids.txt").read_text().split())
    assert runs == 3, (lib, runs)  # The parent and each of the 2 workers.
  assert got["loader"] == got["grain"] == ["a", "b", "c", "a"]


_GUARDED_SKIPPED = textwrap.dedent("""
    import os, sys
    import numpy as np
    import loader

    with open(sys.argv[1], "a") as f:  # Every process that runs this script leaves its pid.
      f.write(f"{os.getpid()}\\n")
    OFFSET = 7  # Reaches the workers by value, with the function that uses it.

    class Shift(loader.transforms.Map):
      def map(self, x):
        return x + OFFSET

    if __name__ == "__main__":
      opts = loader.MultiprocessingOptions(num_workers=2, workers_run_main=False)
      ds = loader.MapDataset.range(40).map(Shift()).to_iter_dataset().batch(4).mp_prefetch(opts)
      print(sum(int(np.sum(b)) for b in ds))  # The map runs in the workers only.
""")


def test_workers_run_main_false_skips_a_guarded_scripts_top_level(tmp_path):
  out, runs = _run_marking(_GUARDED_SKIPPED, tmp_path)
  assert out.stdout.strip() == str(sum(x + 7 for x in range(40)))
  assert runs == 1, "a worker re-ran the script"
