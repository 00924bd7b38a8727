"""Worker start-up: workers never re-run the training script.

Spawned workers normally import the parent's `__main__` again: slow when the
script imports JAX at top level, and a crash ("An attempt has been made to
start a new process before the current process has finished its
bootstrapping phase") for a script without an `if __name__ == "__main__":`
guard. loader's workers get the pipeline by value instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def test_script_without_main_guard_runs_and_is_not_reimported_by_workers(tmp_path):
  script = tmp_path / "train.py"
  script.write_text(_UNGUARDED)
  marks = tmp_path / "pids.txt"
  out = subprocess.run([sys.executable, str(script), str(marks)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": _ROOT})
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == str(sum(x * x for x in range(40)))
  assert "bootstrapping" not in out.stderr
  assert len(marks.read_text().split()) == 1, "a worker re-ran the script"
