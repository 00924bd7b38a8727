"""Benchmark: TFRecord -> ArrayRecord conversion: per-core cost, and speed-up with workers.

  .venv/bin/python bench/convert.py [--shards 8 --records 160000 --record-bytes 1000] \
      [--repeat 3] [--systems ours-auto,ours-1worker,...] [--profile ours-1worker] \
      [--json bench/results/convert.json]

Every system here is bound by ArrayRecordWriter (zstd on each ~1 KB record
with group_size:1, about 80% of the time), so two numbers say how good the
converter is, measured on one generated data set (default 8 shards, 1.3 GB):

  per-core cost vs the writer-bound loop: CPU seconds per MB of this
    converter / those of (c), a tight single-process loop TFRecordReader ->
    ArrayRecordWriter. Target <= 1.1x. CPU seconds count every process of
    the system (Beam's worker processes too), so they do not move with load.
  speed-up with N workers: wall time of a forced 1-worker run (--workers 1) /
    that of the default run (--workers auto, which uses min(cores, shards)
    worker processes on an input this large), Beam's worker start-up and shutdown
    included. Target >= 1.5x on 2 cores at >= 1.2 GB.

Systems, each in its own subprocess writing to a fresh directory:

  (a) this converter, pipelines.convert.run: default flags (ours-auto) and
      --workers 1 (ours-1worker);
  (b) the reference array_record.beam.pipelines.convert_tf_to_arrayrecord_disk
      on DirectRunner, on the first shards only (--ref-max-mb): it holds every
      record in memory (1.9 GB RSS per 200 MB); and its _match_shards variant,
      which crashes on Beam 2.77;
  (c) tight single-process loops into ArrayRecordWriter('group_size:1'),
      reading with converter.TFRecordReader (the yardstick) or tf.data;
  diag: the converter's shard loop without Beam (reader + atomic writer +
      digest), and the converter on 1 record per shard (its fixed cost).

Systems run round-robin --repeat times (the machine is shared); each row
reports its fastest run. From the measured per-core rate the results also
give a paper estimate for 10 TB in 10,000 shards on Dataflow (scale_estimate).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import re
import shlex
import shutil
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(_HERE) not in sys.path:
  sys.path.insert(0, os.path.dirname(_HERE))

from bench import common  # pylint: disable=wrong-import-position

WRITER_OPTIONS = "group_size:1"
# This converter's systems: the flags each passes to pipelines.convert.run.
CONVERTER_FLAGS = {
    "ours-auto": [],
    "ours-1worker": ["--workers", "1"],
    "ours-tiny": [],
    # As many workers as --workers auto starts on the big input (the usable cores).
    "ours-tiny-workers": ["--workers", "{cores}"],
}
REF_OUTPUT_PREFIX = "part"

# name -> (group, label). Order is the run order (and table order).
SYSTEMS = {
    "loop-reader": ("c", "(c) loop: converter.TFRecordReader -> ArrayRecordWriter, 1 process"),
    "ours-1worker": ("a", "(a) this converter, --workers 1 (in-process)"),
    "ours-auto": ("a", "(a) this converter, default flags (--workers auto)"),
    "ref-disk": ("b", "(b) reference convert_tf_to_arrayrecord_disk, DirectRunner "
                 "(first shards only)"),
    "loop-tfdata": ("c", "(c) loop: tf.data.TFRecordDataset -> ArrayRecordWriter"),
    "ref-match-shards": ("b", "(b) reference ..._disk_match_shards, DirectRunner"),
    "ours-core-no-beam": ("diag", "diag: this converter's shard loop without Beam "
                          "(reader + atomic writer + digest)"),
    "ours-tiny": ("diag", "diag: this converter, 1 record/shard (fixed cost)"),
    "ours-tiny-workers": ("diag", "diag: this converter, 1 record/shard, --workers <cores> "
                          "(fixed cost of Beam's worker processes)"),
}
# Deterministic failures: run once even with --repeat.
RUN_ONCE = ("ref-match-shards",)
AUTO, ONE, LOOP, REF, TINY = "ours-auto", "ours-1worker", "loop-reader", "ref-disk", "ours-tiny"
TINY_WORKERS = "ours-tiny-workers"
TINY_SYSTEMS = (TINY, TINY_WORKERS)
REF_SYSTEMS = ("ref-disk", "ref-match-shards")
TARGETS = {"per_core_cost_vs_loop_max": 1.1, "speedup_min": 1.5, "speedup_min_input_mb": 1200,
           "peak_rss_mb_max": 400.0}

# The paper estimate for Dataflow: what is assumed besides the measured rate.
SCALE = {
    "dataset_tb": 10, "shards": 10_000, "machine_type": "n2-standard-4", "vcpus": 4,
    "memory_gb": 16,
    # Dataflow worker VM start: boot, SDK container, pip install of the staged sdist.
    "worker_startup_s": 180,
    # Each output is written to local disk, then uploaded as one stream.
    "upload_mb_s": 100,
    # Manifest and teardown after the last shard.
    "tail_s": 60,
    "workers": (50, 250, 1000, 2500),
}


# --------------------------------------------------------------------------
# Child side: runs one system and writes what it timed to a JSON file.
# --------------------------------------------------------------------------


class _TreeCpu:
  """CPU seconds of this process and of every process it starts.

  RUSAGE_CHILDREN misses Beam's SDK worker processes: Beam starts each
  through /bin/sh and kills the shell at the end, so nobody waits for the
  Python process under it. A thread samples every descendant's CPU times
  (psutil) and keeps the last value seen per process; its own CPU is left
  out of the total.
  """

  def __init__(self, interval: float = 0.1):
    self._interval = interval
    self._seen: dict[tuple[int, float], float] = {}
    self._stop = threading.Event()
    self._sampler_cpu = 0.0
    self._thread = threading.Thread(target=self._sample, daemon=True)

  def _sample(self):
    import psutil
    me = psutil.Process()
    t0 = time.thread_time()
    while True:
      for child in me.children(recursive=True):
        try:
          with child.oneshot():
            t = child.cpu_times()
            self._seen[(child.pid, child.create_time())] = t.user + t.system
        except psutil.Error:
          pass
      if self._stop.wait(self._interval):
        break
    self._sampler_cpu = time.thread_time() - t0

  @staticmethod
  def _own() -> float:
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime

  def __enter__(self):
    self._own0 = self._own()
    self._thread.start()
    return self

  def __exit__(self, *_):
    self._stop.set()
    self._thread.join()
    own = self._own() - self._own0 - self._sampler_cpu
    self.children_s = sum(self._seen.values())
    self.processes = len(self._seen)
    self.total_s = own + self.children_s


def _child_converter(spec: dict, extra_flags: list[str]) -> dict:
  t_imp = time.monotonic()
  from loader import ondisk
  from pipelines import convert, workers
  import_s = time.monotonic() - t_imp
  argv = ["--input", spec["pattern"], "--output", spec["out"], "--writer-options", WRITER_OPTIONS,
          *(f.format(cores=workers.usable_cores()) for f in extra_flags)]
  manifest, timing = _run(spec, lambda: convert.run(argv))
  shards = ondisk.resolved_shards(manifest, spec["out"])
  return {**timing, "import_s": import_s, "argv": argv, "workers_line": manifest.get("_workers"),
          "manifest_shards": [{"output": s["output"], "seconds": s["seconds"]} for s in shards]}


def _import_reference():
  """Imports array_record.beam.pipelines without letting it parse our argv."""
  saved = sys.argv
  sys.argv = [sys.argv[0]]
  try:
    from array_record.beam import pipelines as ref
  finally:
    sys.argv = saved
  return ref


def _child_reference(spec: dict, match_shards: bool) -> dict:
  t_imp = time.monotonic()
  import logging
  logging.getLogger("apache_beam").setLevel(logging.ERROR)
  from apache_beam.options.pipeline_options import PipelineOptions
  ref = _import_reference()
  import_s = time.monotonic() - t_imp
  args = {"input": spec["pattern"], "output": os.path.join(spec["out"], REF_OUTPUT_PREFIX)}
  opts = PipelineOptions(["--runner=DirectRunner"])

  def run():
    if match_shards:
      p = ref.convert_tf_to_arrayrecord_disk_match_shards(args=args, pipeline_options=opts)
    else:
      p = ref.convert_tf_to_arrayrecord_disk(num_shards=spec["shards"], args=args,
                                             pipeline_options=opts)
    p.run().wait_until_finish()

  _, timing = _run(spec, run)
  return {**timing, "import_s": import_s}


def _child_loop_reader(spec: dict, core: bool) -> dict:
  t_imp = time.monotonic()
  # TFRecordReader opens files through Beam FileSystems, as in the converter.
  import apache_beam.io.filesystems  # pylint: disable=unused-import
  from array_record.python.array_record_module import ArrayRecordWriter
  from converter import writer as ar_writer
  from converter.manifest import RecordDigest, write_digested
  from converter.naming import output_basename
  from converter.tfrecord import TFRecordReader
  import_s = time.monotonic() - t_imp

  def loop():
    for path in spec["files"]:
      out = os.path.join(spec["out"], output_basename(os.path.basename(path)))
      if core:  # What _ConvertShardFn.process does for one shard, minus Beam.
        with ar_writer.ArrayRecordShardWriter(out, WRITER_OPTIONS) as w:
          write_digested(TFRecordReader(path), w.write, RecordDigest())
          w.commit()
      else:
        w = ArrayRecordWriter(out, WRITER_OPTIONS)
        write = w.write
        for record in TFRecordReader(path):
          write(record)
        w.close()

  _, timing = _run(spec, loop)
  return {**timing, "import_s": import_s}


def _child_loop_tfdata(spec: dict) -> dict:
  t_imp = time.monotonic()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  from array_record.python.array_record_module import ArrayRecordWriter
  from converter.naming import output_basename
  import_s = time.monotonic() - t_imp

  def loop():
    for path in spec["files"]:
      out = os.path.join(spec["out"], output_basename(os.path.basename(path)))
      w = ArrayRecordWriter(out, WRITER_OPTIONS)
      write = w.write
      # Batching amortises tf.data's per-element cost; records stay in order.
      ds = tf.data.TFRecordDataset(path, buffer_size=4 << 20).batch(256)
      for batch in ds.as_numpy_iterator():
        for record in batch:
          write(record)
      w.close()

  _, timing = _run(spec, loop)
  return {**timing, "import_s": import_s}


_RUN_START: list[float] = []


def _run(spec: dict, fn):
  """Runs fn (under cProfile if asked); returns (its result, timing dict)."""
  start_epoch = time.time()
  with _TreeCpu() as cpu:
    _RUN_START.append(time.monotonic())
    ret = _maybe_profiled(spec, fn)
    seconds = time.monotonic() - _RUN_START[0]
  return ret, {"seconds": seconds, "cpu_s": cpu.total_s, "worker_cpu_s": cpu.children_s,
               "child_processes": cpu.processes, "start": _RUN_START[0],
               "start_epoch": start_epoch}


def _maybe_profiled(spec: dict, fn):
  if not spec.get("profile"):
    return fn()
  import cProfile
  import io
  import pstats
  prof = cProfile.Profile()
  try:
    return prof.runcall(fn)
  finally:
    prof.dump_stats(spec["profile_raw"])
    for key in ("cumulative", "tottime"):
      s = io.StringIO()
      pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
      with open(f"{spec['profile']}.{key}.txt", "w") as f:
        f.write(s.getvalue())


def child_main(system: str, spec_json: str) -> int:
  spec = json.loads(spec_json)
  result = {"system": system}
  try:
    if system in CONVERTER_FLAGS:
      result.update(_child_converter(spec, CONVERTER_FLAGS[system]))
    elif system == "ref-disk":
      result.update(_child_reference(spec, match_shards=False))
    elif system == "ref-match-shards":
      result.update(_child_reference(spec, match_shards=True))
    elif system == "loop-reader":
      result.update(_child_loop_reader(spec, core=False))
    elif system == "ours-core-no-beam":
      result.update(_child_loop_reader(spec, core=True))
    elif system == "loop-tfdata":
      result.update(_child_loop_tfdata(spec))
    else:
      raise ValueError(f"unknown system {system!r}")
    result["status"] = "ok"
  except Exception as e:  # pylint: disable=broad-except
    import traceback
    traceback.print_exc()
    frame = traceback.extract_tb(e.__traceback__)[-1]
    where = f"{_short_path(frame.filename)}:{frame.lineno} in {frame.name}"
    result["status"] = "error"
    result["error"] = f"{type(e).__name__}: {_last_meaningful_line(str(e))} (at {where})"
    if _RUN_START:
      result["seconds_to_failure"] = round(time.monotonic() - _RUN_START[0], 3)
  common.write_json(spec["result"], result)
  return 0


def _short_path(path: str) -> str:
  for marker in ("site-packages/", common.REPO_ROOT + "/"):
    if marker in path:
      return path.split(marker, 1)[1]
  return path


def _last_meaningful_line(text: str) -> str:
  lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
  picks = [ln for ln in lines if "Error" in ln or "Exception" in ln]
  return (picks[-1] if picks else lines[-1] if lines else "")[:300]


# --------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------


def _outputs(system: str, out: str) -> tuple[list[str], bool]:
  """(output files, whether they must match the inputs 1:1 in order)."""
  if SYSTEMS[system][0] == "b":
    return common.files_matching(os.path.join(out, REF_OUTPUT_PREFIX + "*.arrayrecord")), False
  files = [p for p in glob.glob(os.path.join(out, "**", "*"), recursive=True)
           if os.path.isfile(p) and os.path.basename(p) != "manifest.json"
           and not os.path.basename(p).startswith(".")]
  return sorted(files), True


def verify(system: str, out: str, data: common.DataSet, child: dict) -> tuple[bool, str, dict]:
  files, matched = _outputs(system, out)
  hidden = [p for p in glob.glob(os.path.join(out, "**", ".*"), recursive=True)
            if ".tmp-" in os.path.basename(p)]
  extra = {"files_out": len(files), "bytes_out": sum(os.path.getsize(p) for p in files)}
  if hidden:
    return False, f"temporary files left: {[os.path.basename(p) for p in hidden][:3]}", extra
  if SYSTEMS[system][0] == "b" and len(files) != data.shards:
    return False, f"{len(files)} output files, asked for num_shards={data.shards}", extra
  ok, msg, n = common.check_outputs(files, data, matched=matched)
  extra["records_out"] = n
  if ok and system in CONVERTER_FLAGS:
    with open(os.path.join(out, "manifest.json")) as f:
      manifest = json.load(f)
    t = manifest["totals"]
    if t["records"] != data.records or t["converted"] != data.shards or t["failed"]:
      return False, f"manifest totals disagree: {t}", extra
    digests = [s["digest"] for s in sorted(manifest["shards"], key=lambda s: s["output"])]
    if digests != data.shard_digests:
      return False, "manifest digests differ from the input's", extra
    shards = child["manifest_shards"]
    extra["shard_work_s"] = round(sum(s["seconds"] for s in shards), 3)
    extra.update(_timeline(shards, child))
    msg += "; manifest totals and digests match"
  return ok, msg, extra


def _timeline(shards: list[dict], child: dict) -> dict:
  """When shard work ran inside the call, from output mtimes (set when published).

  startup_s: from the start of the call until the first shard began converting
  (planning, runner and worker start-up, earlier stages).
  tail_s: from the last shard's file until the call returned (manifest, teardown).
  """
  t0, t1 = child["start_epoch"], child["start_epoch"] + child["seconds"]
  ends = [os.path.getmtime(s["output"]) for s in shards]
  begins = [e - s["seconds"] for e, s in zip(ends, shards)]
  return {"startup_s": round(min(begins) - t0, 3), "tail_s": round(t1 - max(ends), 3),
          "shard_span_s": round(max(ends) - min(begins), 3)}


def _workers(line: str | None) -> int | None:
  """Worker processes from the converter's 'Workers: ...' summary line."""
  if not line:
    return None
  if line.startswith("Workers: in-process"):
    return 1
  m = re.match(r"Workers: (\d+) worker processes", line)
  return int(m.group(1)) if m else None


def run_system(system: str, data: common.DataSet, run_dir: str, args, repeat_index: int) -> dict:
  group, label = SYSTEMS[system]
  out = common.fresh_dir(os.path.join(run_dir, f"{system}-{repeat_index}"))
  out_data = os.path.join(out, "out")
  result_path = os.path.join(out, "result.json")
  spec = {"pattern": data.pattern, "files": data.files, "shards": data.shards,
          "out": out_data, "result": result_path}
  if system in args.profile:
    prof_dir = os.path.join(common.RESULTS_DIR, "profiles")
    os.makedirs(prof_dir, exist_ok=True)
    spec["profile"] = os.path.join(prof_dir, f"convert-{system}")
    # The raw profile is large: it goes with the (gitignored) data.
    spec["profile_raw"] = os.path.join(common.DATA_DIR, f"profile-convert-{system}.prof")
  if system not in CONVERTER_FLAGS:
    os.makedirs(out_data)  # pipelines.convert makes its own output dir.
  cmd = [sys.executable, os.path.abspath(__file__), "--child", system, "--spec", json.dumps(spec)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
  m = common.run_measured(cmd, timeout=args.timeout, env=env)
  row = {"system": system, "label": label, "group": group, "mb": round(data.file_bytes / 1e6, 1),
         "process_s": round(m.wall_s, 3), "process_cpu_s": round(m.cpu_s, 3),
         "peak_rss_mb": round(m.peak_rss_mb, 1),
         "max_process_rss_mb": round(m.max_process_rss_mb, 1), "processes": m.max_processes}
  child = {}
  if os.path.exists(result_path):
    with open(result_path) as f:
      child = json.load(f)
  if m.returncode != 0 or not child:
    row.update(status="error", error=f"subprocess exit {m.returncode}: "
               f"{_last_meaningful_line(m.stdout)}")
  elif child["status"] != "ok":
    # The reference match_shards variant is expected to land here on Beam 2.77.
    row.update(status="crashes" if system in RUN_ONCE else "error",
               error=child.get("error"), seconds_to_failure=child.get("seconds_to_failure"))
  else:
    ok, msg, extra = verify(system, out_data, data, child)
    row.update(extra)
    row.update(status="ok" if ok else "wrong-output", check=msg,
               seconds=round(child["seconds"], 3), cpu_s=round(child["cpu_s"], 3),
               worker_cpu_s=round(child["worker_cpu_s"], 3), import_s=round(child["import_s"], 3))
    if "workers_line" in child:
      row["workers"] = _workers(child["workers_line"])
      row["workers_line"] = child["workers_line"]
  if row["status"] != "ok":
    row["log_tail"] = m.stdout[-1500:]
  if not args.keep_outputs:
    shutil.rmtree(out, ignore_errors=True)
  return row


def _merge_runs(runs: list[dict], data: common.DataSet) -> dict:
  """One row per system: the fastest run; peaks are the max over runs.

  A system counts as ok only if every run's output checked out; otherwise
  its row is the first failing run.
  """
  bad = [r for r in runs if r["status"] != "ok"]
  best = dict(bad[0] if bad else min(runs, key=lambda r: r["seconds"]))
  best["runs"] = len(runs)
  if len(runs) > 1:
    best["all_seconds"] = [r.get("seconds") for r in runs]
    best["all_cpu_s"] = [r.get("cpu_s") for r in runs]
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    best["max_process_rss_mb"] = max(r["max_process_rss_mb"] for r in runs)
  if best["status"] == "ok":
    mb = data.file_bytes / 1e6
    best["mb_per_s"] = round(mb / best["seconds"], 2)
    # CPU time swings less than wall time with other load: the least over runs.
    best["cpu_s"] = min(r["cpu_s"] for r in runs)
    best["per_core_mb_s"] = round(mb / best["cpu_s"], 2)
  return best


def _add_row_ratios(rows: list[dict]) -> None:
  by = {r["system"]: r for r in rows if r["status"] == "ok"}
  loop = by.get(LOOP)
  for r in rows:
    if r["status"] == "ok" and loop and r["system"] not in TINY_SYSTEMS:
      r["per_core_cost_vs_loop"] = round(loop["per_core_mb_s"] / r["per_core_mb_s"], 3)


def _verdict(ok: bool, target: str) -> str:
  return f"{'met' if ok else 'MISSED'} ({target})"


def _headline(rows: list[dict], data: common.DataSet, cores: int) -> tuple[dict, list[str]]:
  """The two numbers this benchmark is for, with their targets; flat and as sentences."""
  by = {r["system"]: r for r in rows if r["status"] == "ok"}
  ratios: dict = {"cores": cores, "input_mb": round(data.file_bytes / 1e6, 1)}
  lines = []
  loop, auto, one = by.get(LOOP), by.get(AUTO), by.get(ONE)
  cost_max = TARGETS["per_core_cost_vs_loop_max"]
  for name in (AUTO, ONE):
    r = by.get(name)
    if r and loop:
      cost = r["per_core_cost_vs_loop"]
      ratios[f"{name}_per_core_cost_vs_loop"] = cost
      ratios[f"{name}_per_core_cost_target"] = _verdict(cost <= cost_max, f"<= {cost_max:g}x")
      lines.append(
          f"Per-core cost vs the writer-bound loop, {name}: {cost:.2f}x "
          f"({r['per_core_mb_s']:.1f} vs {loop['per_core_mb_s']:.1f} MB per CPU second): "
          f"{ratios[f'{name}_per_core_cost_target']}.")
  if auto and one:
    speedup = round(one["seconds"] / auto["seconds"], 2)
    n, mb = auto.get("workers"), data.file_bytes / 1e6
    ratios["auto_workers"] = n
    ratios["speedup_with_n_workers"] = speedup
    target = f">= {TARGETS['speedup_min']:g}x on {cores} cores at >= " \
             f"{TARGETS['speedup_min_input_mb'] / 1000:g} GB"
    if mb < TARGETS["speedup_min_input_mb"]:
      verdict = f"not judged: the input is {mb:,.0f} MB ({target})"
    else:
      verdict = _verdict(speedup >= TARGETS["speedup_min"] and (n or 1) > 1, target)
    ratios["speedup_target"] = verdict
    lines.append(
        f"Speed-up with {n} worker(s) (--workers auto) vs --workers 1: {speedup:.2f}x "
        f"({one['seconds']:.1f} s -> {auto['seconds']:.1f} s on {mb:,.0f} MB, "
        f"{auto.get('startup_s', float('nan')):.1f} s before the first shard started): "
        f"{verdict}.")
  if one:
    rss_max = TARGETS["peak_rss_mb_max"]
    ratios["ours_1worker_peak_rss_mb"] = one["peak_rss_mb"]
    ratios["ours_1worker_peak_rss_target"] = _verdict(one["peak_rss_mb"] < rss_max,
                                                      f"< {rss_max:g} MB")
  if by.get(TINY):
    ratios["fixed_cost_s"] = by[TINY]["seconds"]
  fixed = by.get(TINY_WORKERS)
  if auto and loop and fixed and auto.get("workers") and auto["workers"] > 1:
    # Beam's worker processes cost the same CPU (imports, SDK harness) whatever the
    # input: the marginal rate is what a bigger input converges to.
    marginal_cpu = auto["cpu_s"] - fixed["cpu_s"]
    marginal = round(loop["per_core_mb_s"] / (data.file_bytes / 1e6 / marginal_cpu), 3)
    ratios["ours-auto_worker_fixed_cpu_s"] = round(fixed["cpu_s"], 2)
    ratios["ours-auto_marginal_per_core_cost_vs_loop"] = marginal
    ratios["ours-auto_marginal_per_core_cost_target"] = _verdict(marginal <= cost_max,
                                                                 f"<= {cost_max:g}x")
    lines.append(
        f"Per-core cost vs the writer-bound loop, ours-auto without the fixed CPU of starting "
        f"{auto['workers']} Beam worker processes ({fixed['cpu_s']:.1f} CPU s, row "
        f"{TINY_WORKERS}): {marginal:.2f}x: "
        f"{ratios['ours-auto_marginal_per_core_cost_target']}.")
  for r in rows:
    if r.get("per_core_mb_s"):
      ratios[f"per_core_mb_s_{r['system']}"] = r["per_core_mb_s"]
  return ratios, lines


def scale_estimate(per_core_mb_s: float) -> dict:
  """Wall time and worker-hours for SCALE's dataset on Dataflow, on paper.

  Assumes a Dataflow vCPU converts at the per-core rate measured here, one
  shard per vCPU at a time (the DoFn holds the GIL while zstd compresses,
  so extra threads per process add shards in flight, not throughput), and
  that each output is uploaded after it is written.
  """
  a = SCALE
  shard_mb = a["dataset_tb"] * 1e6 / a["shards"]
  convert_s, upload_s = shard_mb / per_core_mb_s, shard_mb / a["upload_mb_s"]
  shard_s = convert_s + upload_s
  rows = []
  for w in a["workers"]:
    waves = math.ceil(a["shards"] / (w * a["vcpus"]))
    wall = a["worker_startup_s"] + waves * shard_s + a["tail_s"]
    rows.append({"max_num_workers": w, "vcpus": w * a["vcpus"], "waves": waves,
                 "wall_h": round(wall / 3600, 2), "worker_hours": round(w * wall / 3600, 1),
                 "vcpu_hours": round(w * a["vcpus"] * wall / 3600, 1)})
  return {
      "assumptions": {**{k: v for k, v in a.items() if k != "workers"},
                      "per_core_mb_s": per_core_mb_s},
      "shard_mb": shard_mb,
      "convert_s_per_shard": round(convert_s, 1),
      "upload_s_per_shard": round(upload_s, 1),
      "busy_vcpu_hours": round(a["shards"] * shard_s / 3600, 1),
      "rows": rows,
  }


def guidance(per_core_mb_s: float | None) -> list[str]:
  """Shard-size advice that follows from the measurements."""
  rate = per_core_mb_s or 30.0
  return [
      "Parallelism is the number of input shards: each shard is streamed start to end by one "
      "worker thread (one Python process per vCPU on Dataflow), so a job never finishes "
      "before its largest shard, and vCPUs beyond the number of shards sit idle.",
      "Aim for shards of 100 MB to 1 GB, and several times more shards than vCPUs. Smaller "
      "shards pay a fixed cost each (open, upload, server-side rename: a few GCS requests, "
      "well under a second); larger ones lengthen the tail and need more local disk.",
      f"A single huge file is converted by one worker at one core's rate ({rate:.0f} MB/s "
      f"here: {10_000 / rate / 60:.0f} min for 10 GB), whatever the number of workers. "
      "Split it first: `pipelines.convert_tf_to_arrayrecord_disk(num_shards=M, ...)` "
      "re-shards it into M ArrayRecord files in one job (the reading stays one stream, but "
      "at reader speed, several times the writer's; the zstd writing is spread over M "
      "shards; record order across files is not kept), or have the producer write more "
      "shards (for TFDS: DownloadConfig(num_shards=...)).",
      "Local disk on Dataflow: every shard in flight keeps its output on the worker's disk "
      "until it is uploaded: budget vCPUs x threads per process x output shard size; cap "
      "the threads with --number_of_worker_harness_threads and raise --disk_size_gb for "
      "GB-sized shards.",
      "On one machine, --workers auto starts min(cores, shards) worker processes only when "
      "the input is big enough to repay their ~2.5 s of extra wall time (a few hundred MB on 2 "
      "cores); --workers N forces a count.",
  ]


# The JSON rows: these keys in this order (None where they do not apply), so a
# table renders with the same columns for every row; the rest goes to "detail".
ROW_KEYS = ("system", "role", "status", "mb", "seconds", "mb_per_s", "cpu_s", "per_core_mb_s",
            "per_core_cost_vs_loop", "workers", "processes", "peak_rss_mb", "startup_s",
            "tail_s", "error", "label")
ROLES = {"a": "(a)", "b": "(b)", "c": "(c)", "diag": "diag"}


def _json_row(row: dict) -> dict:
  row = {**row, "role": ROLES[row["group"]]}
  if row.get("error"):
    row["error"] = " ".join(str(row["error"]).split())  # One line for tables.
  out = {k: row.get(k) for k in ROW_KEYS}
  out["detail"] = {k: v for k, v in row.items() if k not in ROW_KEYS and k != "group"}
  return out


COLUMNS = [
    ("system", "system", ""), ("role", "role", ""), ("status", "status", ""),
    ("MB", "mb", ",.0f"), ("seconds", "seconds", ".2f"), ("MB/s", "mb_per_s", ".1f"),
    ("cpu s", "cpu_s", ".2f"), ("MB/cpu s", "per_core_mb_s", ".1f"),
    ("cost vs (c)", "per_core_cost_vs_loop", ".2f"), ("workers", "workers", "d"),
    ("procs", "processes", "d"), ("peak RSS MB", "peak_rss_mb", ".0f"),
    ("startup s", "startup_s", ".2f"),
]


def _reference_data(data: common.DataSet, args) -> common.DataSet:
  """The first shards of the data, up to --ref-max-mb (the reference holds all in memory)."""
  shard_mb = data.file_bytes / 1e6 / data.shards
  keep = max(1, min(data.shards, int(args.ref_max_mb // shard_mb)))
  if keep == data.shards:
    return data
  return common.ensure_tfrecord_data(keep, args.records, args.record_bytes, seed=args.seed)


def parent_main(args) -> int:
  machine = common.machine_info()
  from pipelines.workers import usable_cores  # No Beam import: it is lazy there.
  cores = usable_cores()
  print(f"cpu_count={os.cpu_count()}  usable_cores={cores}  "
        f"load_avg_1m={machine.get('load_avg_1m')}  python={sys.version.split()[0]}", flush=True)
  data = common.ensure_tfrecord_data(args.shards, args.records, args.record_bytes, seed=args.seed)
  systems = args.systems
  datasets = {n: data for n in systems}
  for name in TINY_SYSTEMS:
    if name in systems:
      datasets[name] = common.ensure_tfrecord_data(args.shards, 1, args.record_bytes,
                                                   seed=args.seed)
  if any(n in REF_SYSTEMS for n in systems):
    ref = _reference_data(data, args)
    datasets.update({n: ref for n in REF_SYSTEMS if n in systems})
  common.warm_page_cache(sorted({f for d in datasets.values() for f in d.files}))
  s = data.summary()
  print(f"data: {s['shards']} shards x {s['records_per_shard']:,} records, mean "
        f"{s['mean_record_bytes']} B/record, {s['file_mb']} MB of TFRecord ({s['dir']})",
        flush=True)
  run_dir = os.path.join(common.DATA_DIR, "runs", f"convert-{os.getpid()}")
  common.fresh_dir(run_dir)
  runs: dict[str, list[dict]] = {n: [] for n in systems}
  try:
    for rep in range(args.repeat):
      for name in systems:
        if rep and name in RUN_ONCE:
          continue
        row = run_system(name, datasets[name], run_dir, args, rep)
        runs[name].append(row)
        shown = f"{row['seconds']:.2f} s" if row.get("seconds") is not None else row["status"]
        cpu = f"cpu {row['cpu_s']:.1f} s" if row.get("cpu_s") is not None else ""
        print(f"  [{rep + 1}/{args.repeat}] {name:18s} {shown:>10s}  {cpu:>12s}  "
              f"peak RSS {row['peak_rss_mb']:.0f} MB  {row.get('workers_line') or ''}  "
              f"{row.get('check') or row.get('error', '')}", flush=True)
  finally:
    if not args.keep_outputs:
      shutil.rmtree(run_dir, ignore_errors=True)
  rows = [_merge_runs(runs[n], datasets[n]) for n in systems]
  for r in rows:
    r["role"] = ROLES[r["group"]]
    if r["system"] in TINY_SYSTEMS and r["status"] == "ok":
      r["mb_per_s"] = r["per_core_mb_s"] = None  # 1 record per shard: not a throughput.
  _add_row_ratios(rows)
  ratios, headline = _headline(rows, data, cores)
  by = {r["system"]: r for r in rows if r["status"] == "ok"}
  rate = (by.get(ONE) or by.get(AUTO) or {}).get("per_core_mb_s")
  scale = scale_estimate(rate) if rate else None

  print()
  print(common.format_table(rows, COLUMNS))
  print()
  for r in rows:
    print(f"  {r['system']:18s} {r['label']}")
  print()
  for line in headline:
    print(line)
  for r in rows:
    if r["status"] != "ok":
      print(f"{r['system']}: {r['status']}: {r.get('error') or r.get('check')}")
  if scale:
    print(f"\nDataflow, on paper: {SCALE['dataset_tb']} TB in {SCALE['shards']:,} shards on "
          f"{SCALE['machine_type']} at {rate:.1f} MB/s per vCPU: "
          f"{scale['busy_vcpu_hours']:,.0f} busy vCPU-hours")
    for row in scale["rows"]:
      print(f"  max_num_workers {row['max_num_workers']:>5,}: {row['wall_h']:.2f} h wall, "
            f"{row['worker_hours']:,.0f} worker-hours")

  if args.json:
    result = {
        "benchmark": "convert",
        "command": " ".join(shlex.quote(a) for a in [
            os.path.relpath(sys.executable, common.REPO_ROOT), "bench/convert.py", *args.argv]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "usable_cores": cores,
        "machine": {**machine, "load_avg_1m_end": common.machine_info().get("load_avg_1m")},
        "versions": common.package_versions(["apache-beam", "array-record", "tensorflow-cpu",
                                             "tensorflow", "crc32c", "xxhash"]),
        "data": {**data.summary(), "writer_options": WRITER_OPTIONS},
        "reference_data": datasets[REF].summary() if REF in datasets else None,
        "repeat": args.repeat,
        "targets": TARGETS,
        "headline": headline,
        "rows": [_json_row(r) for r in rows],
        "ratios": ratios,
        "scale_estimate": scale,
        "guidance": guidance(rate),
        "notes": [
            "Roles: (a) this converter, (b) the reference array_record.beam.pipelines, "
            "(c) tight single-process loops into ArrayRecordWriter (the writer-bound "
            "yardstick); diag rows explain where (a)'s time goes.",
            "seconds: the system's run inside its subprocess, after imports (pipeline "
            "construction + run, or the loop), the fastest of the runs.",
            "cpu_s: user+system CPU seconds of the run in every process of the system (Beam's "
            "worker processes sampled with psutil), the least of the runs; MB/cpu s = input "
            "MB / cpu_s is the per-core rate; cost vs (c) = (c)'s rate / the row's rate.",
            "MB: TFRecord input file bytes (MB = 1e6 bytes) of that row's data: the reference "
            "runs on the first shards only (--ref-max-mb), because it groups every record in "
            "memory.",
            "workers: worker processes the converter ran (its summary's 'Workers:' line).",
            "peak_rss_mb: peak of the summed RSS of the subprocess tree (sampled every 20 ms) "
            "or the largest single process, whichever is larger.",
            "startup_s (this converter): from the call's start to the first shard's start "
            "(output mtimes and the manifest's per-shard seconds): planning, runner and "
            "worker start-up.",
            "Every 'ok' row's output was read back: record count, and per-shard ordered digests "
            "(matched-shard systems) or the bag of records (the reference reshards).",
            "Without the fixed cost (ours-auto): ours-auto's CPU seconds minus those of "
            "ours-tiny-workers (the same worker count on 1 record per shard: Beam's imports "
            "and SDK harness in each worker process, paid once per run whatever the size).",
            "This converter writes a batch of 256 records and then hashes it for the "
            "manifest digest; the (c) loop alternates read and write per record. Batches keep "
            "zstd's tables and the reader's buffer in cache, which is why (a) can cost less "
            "than (c).",
        ],
    }
    common.write_json(args.json, result)
    print(f"\nWrote {os.path.relpath(os.path.abspath(args.json), common.REPO_ROOT)}")
  return 0 if all(r["status"] in ("ok", "crashes") for r in rows) else 1


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shards", type=int, default=8)
  p.add_argument("--records", type=int, default=160_000,
                 help="Records per shard (default: 8 x 160,000 x ~1 KB = 1.3 GB).")
  p.add_argument("--record-bytes", type=int, default=1000, help="Target serialized record size.")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--repeat", type=int, default=3,
                 help="Runs per system, interleaved round-robin; the fastest verified run is "
                 "reported (default %(default)s: the machine is shared, so single runs are noisy).")
  p.add_argument("--systems", default=",".join(SYSTEMS),
                 help=f"Comma-separated subset of: {', '.join(SYSTEMS)}.")
  p.add_argument("--ref-max-mb", type=float, default=250,
                 help="The reference systems convert the first shards up to this many MB "
                 "(default %(default)s; they hold every record in memory).")
  p.add_argument("--profile", default="",
                 help="Comma-separated systems to run under cProfile (slower, main process "
                 "only); text summaries go to bench/results/profiles/, the raw .prof to "
                 "bench/data/.")
  p.add_argument("--timeout", type=float, default=1800, help="Seconds per system run.")
  p.add_argument("--keep-outputs", action="store_true")
  p.add_argument("--json", help="Write the results as JSON here.")
  p.add_argument("--child", help=argparse.SUPPRESS)
  p.add_argument("--spec", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    return child_main(args.child, args.spec)
  args.argv = argv
  args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
  args.profile = [s.strip() for s in args.profile.split(",") if s.strip()]
  unknown = [s for s in args.systems + args.profile if s not in SYSTEMS]
  if unknown:
    p.error(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
  if args.shards < 1 or args.records < 1 or args.record_bytes < 64 or args.repeat < 1:
    p.error("need --shards >= 1, --records >= 1, --record-bytes >= 64, --repeat >= 1")
  return parent_main(args)


if __name__ == "__main__":
  sys.exit(main())
