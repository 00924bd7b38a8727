"""The end-to-end demo: example TFRecords -> ArrayRecord (Beam DirectRunner) ->
verify -> globally shuffled loading with multiprocess prefetch -> JAX training steps.

  python examples/demo.py [--workdir demo_data] [--shards 8] [--records-per-shard 5000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import loader  # noqa: E402


def _step(title: str) -> None:
  print(f"\n== {title}", flush=True)


def load_throughput(data_dir: str, workers: int, batch_size: int,
                    seed: int = 42) -> tuple[int, float, float]:
  """One shuffled epoch through the loader.

  Returns:
    (records, seconds after the first batch, seconds to the first batch); the
    first includes starting the worker processes.
  """
  decode = loader.example.example_decoder({  # Picklable: workers import only `loader`.
      "id": loader.FixedLenFeature([], "int64"),
      "label": loader.FixedLenFeature([], "int64"),
      "image": loader.FixedLenFeature([], "bytes"),
  })
  ds = (loader.MapDataset.source(loader.ArrayRecordSource(data_dir))
        .shuffle(seed=seed)
        .map(decode)
        .batch(batch_size, drop_remainder=False)
        .to_iter_dataset())
  if workers:
    ds = ds.mp_prefetch(loader.MultiprocessingOptions(num_workers=workers))
  start = time.perf_counter()
  with iter(ds) as it:
    first = next(it)
    t_first = time.perf_counter()
    n = len(first["label"])
    for batch in it:
      n += len(batch["label"])
  end = time.perf_counter()
  # The first batch's records are not counted in the steady-state rate.
  return n - len(first["label"]), end - t_first, t_first - start


def main(argv=None) -> int:
  # Imported here, not at module level: loader workers are spawned processes
  # that re-import this script, and they should not pay for Beam.
  from converter import read_manifest
  from pipelines import convert, make_example_data, verify

  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="demo_data")
  p.add_argument("--shards", type=int, default=8)
  p.add_argument("--records-per-shard", type=int, default=5000)
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--steps", type=int, default=60)
  args = p.parse_args(argv)
  tfr_dir = os.path.join(args.workdir, "tfrecord")
  ar_dir = os.path.join(args.workdir, "array_record")
  shutil.rmtree(args.workdir, ignore_errors=True)

  _step(f"1/5 Example data: {args.shards} TFRecord shards x {args.records_per_shard} records")
  make_example_data.main(["--output", tfr_dir, "--shards", str(args.shards),
                          "--records-per-shard", str(args.records_per_shard)])

  _step("2/5 Convert on Beam DirectRunner (one ArrayRecord shard per TFRecord shard)")
  pattern = os.path.join(tfr_dir, "*.tfrecord-*")
  start = time.perf_counter()
  rc = convert.main(["--input", pattern, "--output", ar_dir])
  convert_s = time.perf_counter() - start
  if rc:
    return rc
  manifest = read_manifest(ar_dir)
  mb = manifest["totals"]["bytes_in"] / 1e6

  _step("3/5 Verify: re-read both sides, compare counts and digests")
  rc = verify.main(["--input", pattern, "--output", ar_dir])
  if rc:
    return rc

  _step(f"4/5 Load: global shuffle + map + batch, mp_prefetch with {args.workers} workers")
  records, load_s, startup_s = load_throughput(ar_dir, args.workers, batch_size=256)
  print(f"One shuffled epoch: first batch after {startup_s:.2f} s (worker start-up), then "
        f"{records:,} records in {load_s:.2f} s ({records / load_s:,.0f} records/s)")

  _step(f"5/5 Train a small JAX model for {args.steps} steps on the converted data")
  from examples import train_jax
  losses = train_jax.train(ar_dir, steps=args.steps, workers=args.workers, log_every=20)

  k = max(1, len(losses) // 10)
  first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
  print("\n== Summary")
  print(f"  records:    {manifest['totals']['records']:,} in {manifest['totals']['shards']} shards")
  print(f"  converted:  {mb:.1f} MB in {convert_s:.1f} s ({mb / convert_s:.1f} MB/s, incl. Beam start-up)")
  print(f"  verified:   all shards match (counts and xxh3 digests)")
  print(f"  loaded:     {records / load_s:,.0f} records/s (shuffled, parsed, batched; "
        f"{args.workers} workers; {startup_s:.1f} s start-up not included)")
  print(f"  training:   loss {first:.3f} -> {last:.3f} over {len(losses)} steps "
        f"({'going down' if last < first else 'NOT going down'})")
  return 0 if last < first else 1


if __name__ == "__main__":
  sys.exit(main())
