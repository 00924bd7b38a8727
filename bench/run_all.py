"""Run every benchmark and write bench/README.md with tables and a chart.

  python bench/run_all.py [--quick]

Each benchmark runs its systems on the same data in one run and writes JSON
to bench/results/; this script renders them. Absolute numbers depend on the
machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# Quick mode: a smoke run that still exercises every system.
BENCHES = {
    "convert": ("convert.py", [], ["--records", "5000"]),
    # Two passes keep each row's best: 3 s windows on a shared 2-core VM are noisy.
    "load": ("load.py", ["--repeat", "2"], ["--quick"]),
}


# Runs made on a lent accelerator machine by bench/device.sh (never here, never
# in CI): rendered from their saved JSON, after this machine's sections.
DEVICE_RESULTS = (
    ("device/device.json", "Accelerator feeding (bench/device.py on a lent GPU machine)"),
    ("device/load_device.json", "load on the GPU machine's host (bench/load.py via bench/device.sh)"),
)


def wait_for_quiet(limit_s: float = 180.0, load: float = 0.8) -> None:
  """Waits (up to limit_s) until the 1-minute load average falls below `load`.

  The previous benchmark's own processes keep the load average up for a
  minute or two; starting the next one then would mark its run busy.
  """
  start = time.monotonic()
  while hasattr(os, "getloadavg") and os.getloadavg()[0] >= load:
    if time.monotonic() - start > limit_s:
      print(f"load average still {os.getloadavg()[0]:.2f} after {limit_s:.0f} s; going on",
            flush=True)
      return
    time.sleep(5)


def run_bench(name: str, quick: bool) -> dict:
  script, full_args, quick_args = BENCHES[name]
  if not quick:
    wait_for_quiet()
  out = os.path.join(RESULTS, f"{name}.json")
  cmd = [sys.executable, os.path.join(HERE, script), "--json", out] + (quick_args if quick else full_args)
  print("$", " ".join(cmd), flush=True)
  subprocess.run(cmd, check=True)
  with open(out) as f:
    return json.load(f)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
  if isinstance(v, int):
    return f"{v:,}"
  return "" if v is None else str(v)


def table(rows: list[dict]) -> str:
  keys: list[str] = []
  for r in rows:
    keys += [k for k in r if k not in keys and not isinstance(r[k], (dict, list))]
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |" for r in rows]
  return "\n".join(lines)


def chart(results: dict[str, dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 4.5))
  axes = [axes] if len(results) == 1 else list(axes)
  for ax, (name, res) in zip(axes, results.items()):
    # Conversion is compared per core (CPU seconds), loading by records per second.
    key, xlabel, log = (("per_core_mb_s", "MB per CPU second", False) if name == "convert"
                        else ("records_per_s", "records / s (log scale)", True))
    rows = [r for r in res["rows"] if r.get(key)]
    labels = [r["system"] for r in rows]
    values = [r[key] for r in rows]
    colors = ["tab:blue" if r["system"].startswith(("ours", "loader", "arrayrecord-toolkit"))
              else "tab:gray" for r in rows]
    ax.barh(labels, values, color=colors)
    if log:
      ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(f"{name} ({res.get('cpu_count', '?')} cores)")
    for y, v in enumerate(values):
      ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _scale_section(est: dict) -> list[str]:
  """The convert benchmark's paper estimate for a large Dataflow job."""
  a = est["assumptions"]
  return [
      f"### Scale estimate: {a['dataset_tb']} TB in {a['shards']:,} shards on Dataflow "
      "(on paper)", "",
      f"From the per-core rate measured above ({a['per_core_mb_s']:.1f} MB per CPU second, "
      f"assumed for a Dataflow vCPU too): {a['machine_type']} workers ({a['vcpus']} vCPUs, "
      f"{a['memory_gb']} GB; one Python SDK process per vCPU, each converting one "
      f"{est['shard_mb']:,.0f} MB shard at a time), {a['worker_startup_s']} s worker start-up "
      f"(VM boot, SDK container, installing the staged sdist), {a['upload_mb_s']} MB/s upload "
      f"per finished shard, {a['tail_s']} s for the manifest and teardown, all workers from "
      f"the start (`--num_workers` = `--max_num_workers`). Per shard: "
      f"{est['convert_s_per_shard']:.0f} s converting + {est['upload_s_per_shard']:.0f} s "
      f"uploading; {est['busy_vcpu_hours']:,.0f} busy vCPU-hours in all.", "",
      table(est["rows"]), "",
      "More workers shorten the job until one wave of shards covers every vCPU; past that "
      "only start-up remains, and worker-hours grow with the idle start-up and tail.", "",
  ]


def render(results: dict[str, dict]) -> str:
  when = datetime.date.today().isoformat()
  parts = [
      "# Benchmarks",
      "",
      f"Made by `python bench/run_all.py` on {when}: {os.cpu_count()} cores, "
      f"{platform.machine()}, Python {platform.python_version()}. Each table is one run "
      "of every system on the same data; absolute times on a shared 2-core machine are "
      "noisy, the ratios are what count.",
      "",
      "![throughput](throughput.png)",
  ]
  for name, res in results.items():
    parts += ["", f"## {name}", ""]
    if res.get("markdown"):  # A benchmark that renders its own section (load: several tables).
      parts += [res["markdown"].rstrip(), ""]
      continue
    if res.get("headline"):
      parts += [f"- {line}" for line in res["headline"]] + [""]
    if res.get("data"):
      parts += ["Data: " + ", ".join(f"{k}={_fmt(v)}" for k, v in res["data"].items()), ""]
    parts += [table(res["rows"]), ""]
    if res.get("ratios"):
      parts += ["Ratios:", ""] + [f"- {k}: **{_fmt(v)}**" for k, v in res["ratios"].items()] + [""]
    if res.get("notes"):
      parts += [f"- {n}" for n in res["notes"]] + [""]
    if res.get("scale_estimate"):
      parts += _scale_section(res["scale_estimate"])
    if res.get("guidance"):
      parts += ["### Shard size", ""] + [f"- {g}" for g in res["guidance"]] + [""]
  for path, title in DEVICE_RESULTS:
    saved = os.path.join(RESULTS, path)
    if os.path.exists(saved):
      with open(saved) as f:
        res = json.load(f)
      parts += ["", f"## {title}", "", f"Saved in bench/results/{path}; its logs lie beside it.", "",
                res["markdown"].rstrip(), ""]
  notes = os.path.join(HERE, "analysis.md")
  if os.path.exists(notes):  # Hand-written reading of the numbers, kept across re-runs.
    with open(notes) as f:
      parts += ["", f.read().strip()]
  return "\n".join(parts) + "\n"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="Small data, for a smoke run.")
  p.add_argument("--only", choices=sorted(BENCHES), action="append")
  p.add_argument("--render-only", action="store_true", help="Re-render from bench/results/*.json.")
  args = p.parse_args(argv)
  os.makedirs(RESULTS, exist_ok=True)
  results = {}
  for name in BENCHES:
    saved = os.path.join(RESULTS, f"{name}.json")
    if args.render_only or (args.only and name not in args.only):
      if os.path.exists(saved):  # Benchmarks not run now keep their last results.
        with open(saved) as f:
          results[name] = json.load(f)
    else:
      results[name] = run_bench(name, args.quick)
  chart(results, os.path.join(HERE, "throughput.png"))
  with open(os.path.join(HERE, "README.md"), "w") as f:
    f.write(render(results))
  print(f"Wrote {os.path.join(HERE, 'README.md')} and throughput.png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
