"""Diagnosis: examples/train_jax.py's host pipeline in process, by ReadOptions / engine setting.

  python bench/diag_threads.py [--seconds 2.5] [--data bench/data/device]

Each variant runs in a fresh process (engine constants are patched in it).
Also runs N copies of the single-threaded in-process pipeline together: what
the machine gives N independent programs (the ceiling for N workers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # pylint: disable=wrong-import-position

VARIANTS = {
    "default ReadOptions()": {},
    "num_threads=0": {"num_threads": 0},
    "num_threads=1": {"num_threads": 1},
    "num_threads=2": {"num_threads": 2},
    "num_threads=4": {"num_threads": 4},
    "default, never split": {"patch": {"_SPLIT_SECONDS_PER_RECORD": 1e9}},
    "default, no re-probe": {"patch": {"_REPROBE_CHUNKS": 10**9}},
    "default, 4 read threads": {"read_threads": 4},
    "1 worker": {"workers": 1},
    "1 worker, never split": {"workers": 1, "patch": {"_SPLIT_SECONDS_PER_RECORD": 1e9}},
}


def child(spec: dict) -> dict:
  import loader  # pylint: disable=g-import-not-at-top
  from loader import engine  # pylint: disable=g-import-not-at-top

  from examples import train_jax  # pylint: disable=g-import-not-at-top
  for k, v in spec.get("patch", {}).items():
    setattr(engine, k, v)
  if "read_threads" in spec:
    n = spec["read_threads"]
    engine.reading_threads = lambda num_threads, n=n: max(1, min(num_threads, n))
  ro = loader.ReadOptions(num_threads=spec["num_threads"]) if "num_threads" in spec else None
  it = train_jax.make_iterator(spec["data"], 1024, spec.get("workers", 0), 0, read_options=ro)
  for _ in range(20):
    next(it)
  if spec.get("barrier"):  # Copies start their windows together.
    while time.time() < spec["barrier"]:
      time.sleep(0.001)
  cpu0, t0, n = common.tree_cpu_seconds(), time.perf_counter(), 0
  while time.perf_counter() - t0 < spec["seconds"]:
    next(it)
    n += 1
  wall = time.perf_counter() - t0
  cpu = common.tree_cpu_seconds() - cpu0
  it.close()
  return {"records_per_s": round(n * 1024 / wall), "cpu_cores": round(cpu / wall, 2)}


def run(specs: list[dict], timeout: float) -> list[dict]:
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(s)],
                            stdout=subprocess.PIPE, text=True, env=common.child_env()) for s in specs]
  out = []
  for p in procs:
    text, _ = p.communicate(timeout=timeout)
    line = [l for l in text.splitlines() if l.startswith("{")]
    out.append(json.loads(line[-1]) if line else {"error": text[-300:]})
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--seconds", type=float, default=2.5)
  p.add_argument("--data", default=os.path.join(common.REPO_ROOT, "bench", "data", "device"))
  p.add_argument("--copies", default="1,8,16")
  p.add_argument("--skip-variants", action="store_true", help="Only the N-copies ceiling.")
  p.add_argument("--child")
  args = p.parse_args(argv)
  if args.child:
    print(json.dumps(child(json.loads(args.child))), flush=True)
    return 0
  cores = os.cpu_count()
  results = {"cores": cores, "variants": {}, "copies": {}}
  for name, spec in ({} if args.skip_variants else VARIANTS).items():
    r = run([{**spec, "data": args.data, "seconds": args.seconds}], 60)[0]
    results["variants"][name] = r
    print(f"{name:<28} {r}", flush=True)
  for n in [int(c) for c in args.copies.split(",") if c and int(c) <= cores]:
    barrier = time.time() + 4.0
    rs = run([{"num_threads": 0, "data": args.data, "seconds": args.seconds, "barrier": barrier}] * n, 60)
    total = sum(r.get("records_per_s", 0) for r in rs)
    results["copies"][n] = {"total_records_per_s": total, "per_copy": [r.get("records_per_s") for r in rs]}
    print(f"{n:2d} copies of num_threads=0 together: {total:,} records/s", flush=True)
  print("DIAG " + json.dumps(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
