"""Accelerator feeding: the loader driving a JAX train step on the machine's device.

  python bench/device.py --json bench/results/device.json

Issue 11 item 6. The host pipeline is examples/train_jax.py's own
(ArrayRecordSource -> shuffle -> parse + normalize -> batch -> repeat ->
mp_prefetch), on MNIST-sized Examples written straight to ArrayRecord. On
`jax.devices()[0]` it measures:

  * host pipeline alone, by worker count: records/s, CPU cores busy, scaling
    against W x one worker (up to the machine's core count);
  * host-to-device copy: `jax.device_put` of one host batch, waited for (GB/s);
  * compute-bound: steps/s of each model's train step on a batch already on
    the device, with no input at all;
  * fed: steps/s of the same step fed through `loader.jax.prefetch_to_device`
    (size 2, and 0 for no prefetch) from the pipeline with W workers. A fed
    rate under the compute-bound one means the step is input-bound.

Runs anywhere JAX runs (its CPU backend too); the figures mean something on an
accelerator. The top level imports neither JAX nor the loader: worker
processes re-run it when they start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

if __package__ in (None, ""):  # Run as a script: make `bench` and `examples` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # pylint: disable=wrong-import-position

BATCH = 1024
SEED = 0
WARMUP_STEPS = 20
# (name, hidden layer widths): examples/train_jax.py's MLP, and two wider ones
# whose steps take long enough on an accelerator to be compute-bound.
MODELS = (("train_jax MLP 784-64-10", (64,)),
          ("MLP 784-4096x2-10", (4096, 4096)),
          ("MLP 784-8192x4-10", (8192, 8192, 8192, 8192)))
# (model index, prefetch size) fed runs; worker counts come from the core count.
FED_PREFETCH = 2


def worker_counts(cores: int) -> list[int]:
  return sorted({w for w in (0, 1, 2, 4, 8, cores) if w <= cores})


def _write_shard(args: tuple[str, int, int, int]) -> str:
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
  from pipelines import make_example_data  # pylint: disable=g-import-not-at-top
  path, shard, records, first_id = args
  tmp = f"{path}.tmp-{os.getpid()}"
  writer = ArrayRecordWriter(tmp, "group_size:1")
  for record in make_example_data.examples(shard, records, SEED, first_id=first_id):
    writer.write(record)
  writer.close()
  os.replace(tmp, path)
  return path


def ensure_data(directory: str, shards: int, records: int, processes: int) -> list[str]:
  """`shards` ArrayRecord files of examples/train_jax.py's Examples (kept across runs)."""
  import multiprocessing  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  paths = [os.path.join(directory, f"train.array_record-{s:05d}-of-{shards:05d}") for s in range(shards)]
  stamp = os.path.join(directory, "stamp.json")
  want = {"shards": shards, "records": records, "seed": SEED}
  if os.path.exists(stamp) and all(os.path.exists(p) for p in paths):
    with open(stamp) as f:
      if json.load(f) == want:
        return paths
  jobs = [(p, s, records, s * records) for s, p in enumerate(paths)]
  with multiprocessing.get_context("spawn").Pool(max(1, min(processes, shards))) as pool:
    pool.map(_write_shard, jobs)
  common.write_json(stamp, want)
  return paths


def _window(step: Callable[[], Any], seconds: float, done: Callable[[Any], None]) -> dict:
  """Calls step() for `seconds` (then waits for the last result); counts and times the calls."""
  cpu0, t0, n, last = common.tree_cpu_seconds(), time.perf_counter(), 0, None
  while time.perf_counter() - t0 < seconds:
    last = step()
    n += 1
  done(last)
  wall = time.perf_counter() - t0
  cpu = common.tree_cpu_seconds() - cpu0
  return {"calls": n, "seconds": round(wall, 3), "per_s": round(n / wall, 2), "cpu_cores": round(cpu / wall, 2)}


def host_rates(data_dir: str, workers: list[int], seconds: float) -> list[dict]:
  """The host pipeline alone: batches pulled as fast as it gives them."""
  from examples import train_jax  # pylint: disable=g-import-not-at-top
  rows = []
  for w in workers:
    t0 = time.perf_counter()
    it = train_jax.make_iterator(data_dir, BATCH, w, SEED)
    first = next(it)
    first_s = time.perf_counter() - t0
    for _ in range(WARMUP_STEPS - 1):
      next(it)
    assert first["image"].shape == (BATCH, 28 * 28) and first["image"].dtype == np.float32, first["image"].shape
    r = _window(lambda: next(it), seconds, lambda _: None)
    it.close()
    rows.append({"workers": w, "records_per_s": round(r["per_s"] * BATCH), "cpu_cores": r["cpu_cores"],
                 "first_batch_s": round(first_s, 3)})
    print(f"[host] {w:2d} workers: {rows[-1]['records_per_s']:>10,} records/s, "
          f"{r['cpu_cores']:.1f} cores busy, 1st batch {first_s:.2f} s", flush=True)
  one = next((r["records_per_s"] for r in rows if r["workers"] == 1), None)
  for r in rows:
    if one and r["workers"] >= 1:
      r["scaling_vs_1_worker"] = round(r["records_per_s"] / (r["workers"] * one), 3)
  return rows


def _model(widths: tuple[int, ...]):
  """(init params, jitted train step) of an MLP 784 -> widths -> 10 with plain SGD."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  sizes = (28 * 28, *widths, 10)
  rng = np.random.default_rng(SEED)
  params = [(rng.standard_normal((a, b), np.float32) * np.sqrt(2 / a), np.zeros(b, np.float32))
            for a, b in zip(sizes[:-1], sizes[1:])]

  def loss_fn(params, batch):
    h = batch["image"]
    for w, b in params[:-1]:
      h = jax.nn.relu(h @ w + b)
    logits = h @ params[-1][0] + params[-1][1]
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, batch["label"][:, None], axis=1))

  @jax.jit
  def step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss

  return params, step, sum(w.size + b.size for w, b in params)


def device_rates(data_dir: str, workers: list[int], seconds: float, models=MODELS) -> dict:
  """Host-to-device copy, and each model's steps/s on device-resident input and fed by the loader."""
  import jax  # pylint: disable=g-import-not-at-top

  from examples import train_jax  # pylint: disable=g-import-not-at-top
  from loader import jax as loader_jax  # pylint: disable=g-import-not-at-top

  sharding = loader_jax.batch_sharding()
  it = train_jax.make_iterator(data_dir, BATCH, 0, SEED)
  host_batch = next(it)
  it.close()
  batch_bytes = sum(v.nbytes for v in host_batch.values())
  jax.block_until_ready(loader_jax.device_put(host_batch, sharding))
  copy = _window(lambda: jax.block_until_ready(loader_jax.device_put(host_batch, sharding)),
                 min(seconds, 2.0), lambda _: None)
  transfer = {"batch_mb": round(batch_bytes / 1e6, 3), "device_put_per_s": copy["per_s"],
              "device_put_gb_s": round(copy["per_s"] * batch_bytes / 1e9, 2)}
  print(f"[copy] device_put of one {batch_bytes / 1e6:.1f} MB batch, waited for: "
        f"{transfer['device_put_gb_s']} GB/s", flush=True)

  device_batch = loader_jax.device_put(host_batch, sharding)
  rows = []
  for name, widths in models:
    params, step, n_params = _model(widths)
    state = {"params": jax.device_put(params)}

    def run_step(batch, state=state, step=step):
      state["params"], loss = step(state["params"], batch)
      return loss

    for _ in range(3):  # Compiles, then warms.
      jax.block_until_ready(run_step(device_batch))
    compute = _window(lambda: run_step(device_batch), seconds, jax.block_until_ready)
    row = {"model": name, "params_m": round(n_params / 1e6, 2), "compute_steps_per_s": compute["per_s"],
           "compute_records_per_s": round(compute["per_s"] * BATCH), "fed": []}
    print(f"[compute] {name}: {compute['per_s']:,.1f} steps/s on a device-resident batch", flush=True)
    # The small model is fed by every worker count; the wide ones by the extremes.
    fed_workers = workers if widths == MODELS[0][1] else sorted({min(2, max(workers)), max(workers)})
    cases = [(w, FED_PREFETCH) for w in fed_workers]
    if widths == MODELS[0][1]:
      cases.append((max(workers), 0))
    for w, size in cases:
      host = train_jax.make_iterator(data_dir, BATCH, w, SEED)
      with loader_jax.prefetch_to_device(host, sharding, size=size) as batches:
        for _ in range(WARMUP_STEPS):
          loss = run_step(next(batches))
        jax.block_until_ready(loss)
        fed = _window(lambda: run_step(next(batches)), seconds, jax.block_until_ready)
        last_loss = float(run_step(next(batches)))
      share = fed["per_s"] / compute["per_s"]
      row["fed"].append({"workers": w, "prefetch": size, "steps_per_s": fed["per_s"],
                         "records_per_s": round(fed["per_s"] * BATCH), "of_compute_bound": round(share, 3),
                         "h2d_gb_s": round(fed["per_s"] * batch_bytes / 1e9, 2), "cpu_cores": fed["cpu_cores"],
                         "bound": "compute" if share >= 0.95 else "input", "loss": round(last_loss, 4)})
      print(f"[fed] {name}: {w:2d} workers, prefetch {size}: {fed['per_s']:,.1f} steps/s "
            f"({share:.0%} of compute-bound), loss {last_loss:.3f}", flush=True)
    rows.append(row)
  return {"transfer": transfer, "models": rows}


def render_markdown(res: dict) -> str:
  """bench/README.md's section for this benchmark."""
  dev, m = res["device"], res["machine"]
  lines = [
      f"Made by `{res['command']}` on {res['created'][:10]}: {dev['kind']} ({dev['platform']}, "
      f"{dev['count']} device(s)), {m['cpu_count']} cores, JAX {res['versions'].get('jax')}. "
      f"Data: {res['data']['shards']} ArrayRecord files x {res['data']['records']:,} MNIST-sized "
      f"Examples; batch {res['batch_size']}; {res['settings']['seconds']} s windows after "
      f"{WARMUP_STEPS} warm-up batches.",
      "",
      "### Host pipeline alone (examples/train_jax.py's), by worker count",
      "",
      "| workers | records/s | CPU cores busy | scaling vs W x 1 worker | 1st batch s |",
      "|---:|---:|---:|---:|---:|",
  ]
  for r in res["host"]:
    lines.append(f"| {r['workers']} | {r['records_per_s']:,} | {r['cpu_cores']:.1f} | "
                 f"{r.get('scaling_vs_1_worker', '-')} | {r['first_batch_s']} |")
  t = res["device_rates"]["transfer"]
  lines += [
      "",
      f"### Host-to-device copy: one {t['batch_mb']} MB batch, `loader.jax.device_put` waited for: "
      f"**{t['device_put_gb_s']} GB/s** ({t['device_put_per_s']:,.0f} batches/s)",
      "",
      "### Train steps: compute-bound (input already on device) vs fed by the loader",
      "",
      "| model | params (M) | workers | prefetch_to_device size | steps/s | records/s | of compute-bound | bound by "
      "| host-to-device GB/s | CPU cores busy |",
      "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
  ]
  for row in res["device_rates"]["models"]:
    lines.append(f"| {row['model']} | {row['params_m']} | - (device-resident batch) | - | "
                 f"{row['compute_steps_per_s']:,.1f} | {row['compute_records_per_s']:,} | 1.00 | - | - | - |")
    for f in row["fed"]:
      lines.append(f"| {row['model']} | {row['params_m']} | {f['workers']} | {f['prefetch']} | "
                   f"{f['steps_per_s']:,.1f} | {f['records_per_s']:,} | {f['of_compute_bound']:.2f} | "
                   f"{f['bound']} | {f['h2d_gb_s']} | {f['cpu_cores']:.1f} |")
  lines += ["", "A fed step at >= 0.95 of its compute-bound rate counts as compute-bound."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shards", type=int, default=16)
  p.add_argument("--records", type=int, default=16_000, help="Records per shard.")
  p.add_argument("--seconds", type=float, default=3.0, help="Measured seconds per case.")
  p.add_argument("--max-workers", type=int, default=None, help="Most worker processes tried (default: cores).")
  p.add_argument("--models", type=int, default=len(MODELS),
                 help=f"How many of the {len(MODELS)} models to run, smallest first (the wide ones crawl on a CPU).")
  p.add_argument("--data-dir", default=os.path.join(common.REPO_ROOT, "bench", "data", "device"))
  p.add_argument("--json", help="Write the results (with their markdown) here.")
  args = p.parse_args(argv)
  import jax  # pylint: disable=g-import-not-at-top

  cores = os.cpu_count() or 1
  workers = worker_counts(min(cores, args.max_workers or cores))
  started = time.monotonic()
  t = time.monotonic()
  paths = ensure_data(args.data_dir, args.shards, args.records, cores)
  # Measured from the page cache with nothing being written back: on the first
  # H100 run, the first case measured right after writing the data ran at a
  # third of its later rate (bench/results/device/rerun_checks.log).
  os.sync()
  common.warm_page_cache(paths)
  print(f"data: {args.shards} x {args.records:,} records in {time.monotonic() - t:.1f} s", flush=True)
  devices = jax.devices()
  res = {
      "benchmark": "device",
      "command": " ".join(["python", "bench/device.py", *(argv if argv is not None else sys.argv[1:])]),
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": common.machine_info(),
      "device": {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices)},
      "versions": common.package_versions(["jax", "jaxlib", "array-record", "numpy"]),
      "batch_size": BATCH,
      "data": {"shards": args.shards, "records": args.records},
      "settings": {"seconds": args.seconds, "workers": workers},
  }
  res["host"] = host_rates(args.data_dir, workers, args.seconds)
  res["device_rates"] = device_rates(args.data_dir, workers, args.seconds, MODELS[:args.models])
  res["settings"]["wall_s"] = round(time.monotonic() - started, 1)
  res["markdown"] = render_markdown(res)
  print(res["markdown"])
  if args.json:
    common.write_json(args.json, res)
    print(f"Wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
