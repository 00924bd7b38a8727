"""Benchmark: TFRecord -> ArrayRecord conversion, this converter vs the alternatives.

  .venv/bin/python bench/convert.py [--shards 8 --records 25000 --record-bytes 1000] \
      [--repeat 3] [--systems ours-direct,ref-disk,...] [--profile ours-direct] \
      [--json bench/results/convert.json]

On one generated data set (cached in bench/data/), each system runs in its own
subprocess, writing to a fresh directory:

  (a) this converter (pipelines.convert.main) on Beam's DirectRunner, default
      single worker, and with --direct_running_mode multi_processing
      --direct_num_workers 2;
  (b) the reference array_record.beam.pipelines.convert_tf_to_arrayrecord_disk
      on DirectRunner (and its _match_shards variant, which may crash);
  (c) a tight single-process loop, TFRecord -> ArrayRecordWriter('group_size:1'),
      reading with converter.TFRecordReader, and with tf.data.TFRecordDataset;
  and diagnostic rows: the converter's inner loop without Beam (reader +
  atomic writer + digest), the converter with --runner FnApiRunner (what
  DirectRunner falls back to, without trying Prism first), and the converter
  on 1 record per shard (its fixed cost).

Systems run round-robin --repeat times (default 3; the machine is shared);
each row reports its fastest run. For this converter, the output files' mtimes
and the manifest's per-shard seconds split the call into startup (before the
first shard starts), shard conversion, and tail (manifest, teardown).

`seconds` is the system's own run (pipeline construction + run, or the loop),
timed inside the subprocess after its imports; `process_s` is the whole
subprocess as the parent saw it (interpreter start, imports, run, exit).
Peak RSS is the peak of the summed RSS of the subprocess tree. Every output is
read back and checked against the input (record count and content) before a
row counts; a row that fails the check is excluded from the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shlex
import shutil
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(_HERE) not in sys.path:
  sys.path.insert(0, os.path.dirname(_HERE))

from bench import common  # pylint: disable=wrong-import-position

WRITER_OPTIONS = "group_size:1"
MP_FLAGS = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
# This converter's systems: the Beam flags each passes to pipelines.convert.main.
CONVERTER_FLAGS = {
    "ours-direct": ["--runner", "DirectRunner"],
    "ours-direct-mp2": ["--runner", "DirectRunner", *MP_FLAGS],
    "ours-fnapi": ["--runner", "FnApiRunner"],
    "ours-tiny": ["--runner", "DirectRunner"],
}
REF_OUTPUT_PREFIX = "part"

# name -> (group, label). Order is the run order (and table order).
SYSTEMS = {
    "loop-reader": ("c", "(c) loop: converter.TFRecordReader -> ArrayRecordWriter"),
    "ours-direct": ("a", "(a) this converter, DirectRunner (default, 1 worker)"),
    "ref-disk": ("b", "(b) reference convert_tf_to_arrayrecord_disk, DirectRunner"),
    "ours-direct-mp2": ("a", "(a) this converter, DirectRunner multi_processing x2"),
    "loop-tfdata": ("c", "(c) loop: tf.data.TFRecordDataset -> ArrayRecordWriter"),
    "ref-match-shards": ("b", "(b) reference ..._disk_match_shards, DirectRunner"),
    "ours-core-no-beam": ("diag", "diag: this converter's shard loop without Beam "
                          "(reader + atomic writer + digest)"),
    "ours-fnapi": ("diag", "diag: this converter, --runner FnApiRunner (no Prism attempt)"),
    "ours-tiny": ("diag", "diag: this converter, DirectRunner, 1 record/shard (fixed cost)"),
}
# Deterministic failures: run once even with --repeat.
RUN_ONCE = ("ref-match-shards",)
A_MAIN, A_MP, B_MAIN, C_MAIN, TINY = (
    "ours-direct", "ours-direct-mp2", "ref-disk", "loop-reader", "ours-tiny")
TARGETS = {"a_throughput_vs_b_min": 4.0, "a_time_vs_c_max": 1.3, "a_peak_rss_mb_max": 400.0}


# --------------------------------------------------------------------------
# Child side: runs one system and writes what it timed to a JSON file.
# --------------------------------------------------------------------------


class _BeamLogTimes:
  """Records when DirectRunner tries Prism and falls back (log messages, not code changes)."""

  def __init__(self):
    import logging
    self.events: list[tuple[float, str]] = []
    outer = self

    class Handler(logging.Handler):

      def emit(self, record):
        outer.events.append((time.monotonic(), record.getMessage()))

    for name in ("apache_beam.runners.direct.direct_runner",
                 "apache_beam.runners.portability.prism_runner"):
      lg = logging.getLogger(name)
      lg.setLevel(logging.INFO)
      lg.addHandler(Handler())
      lg.propagate = False

  def summary(self, start: float) -> dict:
    out = {}
    prism = [t for t, m in self.events if "PrismRunner" in m and "Running pipeline" in m]
    fallback = [t for t, m in self.events if "Falling back" in m]
    download = [ln.strip() for _, m in self.events for ln in m.splitlines()
                if "Downloading prism" in ln or "Unable to fetch" in ln]
    if prism:
      out["prism_tried_at_s"] = round(prism[0] - start, 3)
      if fallback:
        out["prism_attempt_s"] = round(fallback[0] - prism[0], 3)
    out["prism_fell_back"] = bool(fallback)
    if download:
      out["prism_log"] = download[-1][:300]
    return out


def _child_converter(spec: dict, extra_flags: list[str]) -> dict:
  t_imp = time.monotonic()
  from pipelines import convert
  logs = _BeamLogTimes()
  import_s = time.monotonic() - t_imp
  argv = ["--input", spec["pattern"], "--output", spec["out"], "--writer-options", WRITER_OPTIONS,
          *extra_flags]
  rc, timing = _run(spec, lambda: convert.main(argv))
  if rc != 0:
    raise RuntimeError(f"pipelines.convert.main returned {rc}")
  return {**timing, "import_s": import_s, "argv": argv, **logs.summary(timing["start"])}


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
  logs = _BeamLogTimes()
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
  return {**timing, "import_s": import_s, **logs.summary(timing["start"])}


def _child_loop_reader(spec: dict, core: bool) -> dict:
  t_imp = time.monotonic()
  # TFRecordReader opens files through Beam FileSystems, as in the converter.
  import apache_beam.io.filesystems  # pylint: disable=unused-import
  from array_record.python.array_record_module import ArrayRecordWriter
  from converter import writer as ar_writer
  from converter.manifest import RecordDigest
  from converter.naming import output_basename
  from converter.tfrecord import TFRecordReader
  import_s = time.monotonic() - t_imp

  def loop():
    for path in spec["files"]:
      out = os.path.join(spec["out"], output_basename(os.path.basename(path)))
      if core:  # What _ConvertShardFn.process does for one shard, minus Beam.
        digest = RecordDigest()
        update = digest.update
        with ar_writer.ArrayRecordShardWriter(out, WRITER_OPTIONS) as w:
          write = w.write
          for record in TFRecordReader(path):
            write(record)
            update(record)
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


def _cpu_s() -> float:
  """CPU seconds of this process and of its children reaped so far (Beam's workers)."""
  import resource
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _run(spec: dict, fn):
  """Runs fn (under cProfile if asked); returns (its result, timing dict)."""
  start_epoch, cpu0 = time.time(), _cpu_s()
  _RUN_START.append(time.monotonic())
  ret = _maybe_profiled(spec, fn)
  seconds = time.monotonic() - _RUN_START[0]
  return ret, {"seconds": seconds, "cpu_s": _cpu_s() - cpu0, "start": _RUN_START[0],
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
           if os.path.isfile(p) and os.path.basename(p) != "manifest.json"]
  return sorted(files), True


def verify(system: str, out: str, data: common.DataSet, child: dict) -> tuple[bool, str, dict]:
  files, matched = _outputs(system, out)
  extra = {"files_out": len(files), "bytes_out": sum(os.path.getsize(p) for p in files)}
  stray = [p for p in files if ".tmp-" in os.path.basename(p)]
  if stray:
    return False, f"temporary files left: {[os.path.basename(p) for p in stray][:3]}", extra
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
    shard_s = [s["seconds"] for s in manifest["shards"]]
    extra["shard_work_s"] = round(sum(shard_s), 3)
    extra["shard_max_s"] = round(max(shard_s), 3)
    extra.update(_timeline(manifest["shards"], child))
    msg += "; manifest totals and digests match"
  return ok, msg, extra


def _timeline(shards: list[dict], child: dict) -> dict:
  """When shard work ran inside the pipeline call, from output mtimes (set at close).

  startup_s: from the start of the call until the first shard began converting
  (runner startup, planning, the Prism attempt, earlier stages).
  tail_s: from the last shard's file until the call returned (manifest, teardown).
  """
  t0, t1 = child["start_epoch"], child["start_epoch"] + child["seconds"]
  ends = [os.path.getmtime(s["output"]) for s in shards]
  begins = [e - s["seconds"] for e, s in zip(ends, shards)]
  return {"startup_s": round(min(begins) - t0, 3), "tail_s": round(t1 - max(ends), 3),
          "shard_span_s": round(max(ends) - min(begins), 3)}


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
  row = {"system": system, "label": label, "group": group,
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
               import_s=round(child["import_s"], 3))
    for k in ("prism_tried_at_s", "prism_attempt_s", "prism_fell_back", "prism_log"):
      if k in child:
        row[k] = child[k]
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
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    best["max_process_rss_mb"] = max(r["max_process_rss_mb"] for r in runs)
  if best["status"] == "ok":
    recs = data.records
    best["records_per_s"] = round(recs / best["seconds"], 1)
    best["mb_per_s"] = round(data.file_bytes / 1e6 / best["seconds"], 2)
  return best


def _add_row_ratios(rows: list[dict]) -> None:
  by = {r["system"]: r for r in rows if r["status"] == "ok"}
  b, c = by.get(B_MAIN), by.get(C_MAIN)
  for r in rows:
    if r["status"] != "ok" or r["system"] == TINY:
      continue
    if b:
      r["throughput_vs_b"] = round(b["seconds"] / r["seconds"], 2)
      r["cpu_throughput_vs_b"] = round(b["cpu_s"] / r["cpu_s"], 2)
    if c:
      r["time_vs_c"] = round(r["seconds"] / c["seconds"], 2)
      r["cpu_vs_c"] = round(r["cpu_s"] / c["cpu_s"], 2)


def _verdict(ok: bool, target: str) -> str:
  return f"{'met' if ok else 'MISSED'} ({target})"


def _ratios(rows: list[dict]) -> dict:
  """Flat {name: scalar}: the targets for (a), and where (a)'s time goes."""
  by = {r["system"]: r for r in rows if r["status"] == "ok"}
  ratios: dict = {
      "definition": "throughput_vs_b = b.seconds / a.seconds; time_vs_c = a.seconds / "
                    "c.seconds; cpu_* use CPU seconds instead of wall seconds",
      "a_system": A_MAIN, "b_system": B_MAIN, "c_system": C_MAIN,
  }
  for prefix, name in (("a", A_MAIN), ("a_mp2", A_MP)):
    a = by.get(name)
    if not a:
      continue
    if "throughput_vs_b" in a:
      ratios[f"{prefix}_throughput_vs_b"] = a["throughput_vs_b"]
      ratios[f"{prefix}_throughput_vs_b_target"] = _verdict(
          a["throughput_vs_b"] >= TARGETS["a_throughput_vs_b_min"],
          f">= {TARGETS['a_throughput_vs_b_min']:g}x")
      ratios[f"{prefix}_cpu_throughput_vs_b"] = a["cpu_throughput_vs_b"]
    if "time_vs_c" in a:
      ratios[f"{prefix}_time_vs_c"] = a["time_vs_c"]
      ratios[f"{prefix}_time_vs_c_target"] = _verdict(
          a["time_vs_c"] <= TARGETS["a_time_vs_c_max"], f"<= {TARGETS['a_time_vs_c_max']:g}x")
      ratios[f"{prefix}_cpu_vs_c"] = a["cpu_vs_c"]
    ratios[f"{prefix}_peak_rss_mb"] = a["peak_rss_mb"]
    ratios[f"{prefix}_peak_rss_target"] = _verdict(
        a["peak_rss_mb"] < TARGETS["a_peak_rss_mb_max"], f"< {TARGETS['a_peak_rss_mb_max']:g} MB")
  a, c, tiny = by.get(A_MAIN), by.get(C_MAIN), by.get(TINY)
  if a and "startup_s" in a:
    ratios["a_startup_s"] = a["startup_s"]
    ratios["a_tail_s"] = a["tail_s"]
    if "prism_attempt_s" in a:
      ratios["a_prism_attempt_s"] = a["prism_attempt_s"]
  if a and c:
    ratios["a_minus_c_s"] = round(a["seconds"] - c["seconds"], 3)
  if tiny:
    ratios["fixed_cost_s"] = tiny["seconds"]
  return ratios


# The JSON rows: these keys in this order (None where they do not apply), so a
# table renders with the same columns for every row; the rest goes to "detail".
ROW_KEYS = ("system", "role", "status", "seconds", "records_per_s", "mb_per_s", "peak_rss_mb",
            "throughput_vs_b", "time_vs_c", "cpu_s", "cpu_throughput_vs_b", "cpu_vs_c",
            "process_s", "processes", "startup_s", "tail_s", "error", "label")
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
    ("seconds", "seconds", ".2f"), ("process s", "process_s", ".2f"),
    ("records/s", "records_per_s", ",.0f"), ("MB/s", "mb_per_s", ".1f"),
    ("peak RSS MB", "peak_rss_mb", ".0f"), ("procs", "processes", "d"),
    ("thr vs (b)", "throughput_vs_b", ".2f"), ("time vs (c)", "time_vs_c", ".2f"),
    ("cpu s", "cpu_s", ".2f"), ("cpu thr vs (b)", "cpu_throughput_vs_b", ".2f"),
    ("cpu vs (c)", "cpu_vs_c", ".2f"),
]


def parent_main(args) -> int:
  machine = common.machine_info()
  print(f"cpu_count={os.cpu_count()}  load_avg_1m={machine.get('load_avg_1m')}  "
        f"python={sys.version.split()[0]}", flush=True)
  data = common.ensure_tfrecord_data(args.shards, args.records, args.record_bytes, seed=args.seed)
  tiny = None
  systems = args.systems
  if TINY in systems:
    tiny = common.ensure_tfrecord_data(args.shards, 1, args.record_bytes, seed=args.seed)
  common.warm_page_cache(data.files)
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
        row = run_system(name, tiny if name == TINY else data, run_dir, args, rep)
        runs[name].append(row)
        shown = f"{row['seconds']:.2f} s" if row.get("seconds") is not None else row["status"]
        print(f"  [{rep + 1}/{args.repeat}] {name:18s} {shown:>10s}  "
              f"process {row['process_s']:.1f} s  peak RSS {row['peak_rss_mb']:.0f} MB  "
              f"{row.get('check') or row.get('error', '')}", flush=True)
  finally:
    if not args.keep_outputs:
      shutil.rmtree(run_dir, ignore_errors=True)
  rows = [_merge_runs(runs[n], tiny if n == TINY else data) for n in systems]
  for r in rows:
    r["role"] = ROLES[r["group"]]
    if r["system"] == TINY and r["status"] == "ok":
      r["records_per_s"] = r["mb_per_s"] = None  # 1 record per shard: not a throughput.
  _add_row_ratios(rows)
  ratios = _ratios(rows)

  print()
  print(common.format_table(rows, COLUMNS))
  print()
  for r in rows:
    print(f"  {r['system']:18s} {r['label']}")
  _print_summary(rows, ratios)

  if args.json:
    result = {
        "benchmark": "convert",
        "command": " ".join(shlex.quote(a) for a in [
            os.path.relpath(sys.executable, common.REPO_ROOT), "bench/convert.py", *args.argv]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "machine": {**machine, "load_avg_1m_end": common.machine_info().get("load_avg_1m")},
        "versions": common.package_versions(["apache-beam", "array-record", "tensorflow-cpu",
                                             "tensorflow", "crc32c", "xxhash"]),
        "data": {**data.summary(), "writer_options": WRITER_OPTIONS},
        "repeat": args.repeat,
        "targets": TARGETS,
        "rows": [_json_row(r) for r in rows],
        "ratios": ratios,
        "notes": [
            "Roles: (a) this converter, (b) the reference array_record.beam.pipelines, "
            "(c) a tight single-process loop; diag rows explain where (a)'s time goes.",
            "seconds: the system's run inside its subprocess, after imports (pipeline "
            "construction + run, or the loop); process_s adds interpreter start, imports, exit.",
            "MB/s: TFRecord input file bytes / seconds (MB = 1e6 bytes).",
            "peak_rss_mb: peak of the summed RSS of the subprocess tree (sampled every 20 ms) "
            "or the largest single process (wait4 ru_maxrss), whichever is larger.",
            "throughput_vs_b = b.seconds / row.seconds; time_vs_c = row.seconds / c.seconds "
            f"with b = {B_MAIN}, c = {C_MAIN}.",
            "cpu_s: user+system CPU seconds of the run (the subprocess and the Beam workers it "
            "reaped): wall times on a shared machine swing with other load, CPU seconds less.",
            "startup_s / tail_s (this converter): from the call's start to the first shard's "
            "start, and from the last shard's end to the call's return (output mtimes and "
            "the manifest's per-shard seconds).",
            "Every 'ok' row's output was read back: record count, and per-shard ordered digests "
            "(matched-shard systems) or the bag of records (the reference reshards).",
            "With --repeat N the fastest run is reported (a row is ok only if every run's "
            "output checked out); peak RSS is the max over runs.",
        ],
    }
    common.write_json(args.json, result)
    print(f"\nWrote {os.path.relpath(os.path.abspath(args.json), common.REPO_ROOT)}")
  return 0 if all(r["status"] in ("ok", "crashes") for r in rows) else 1


def _print_summary(rows: list[dict], ratios: dict) -> None:
  print()
  for prefix, name in (("a", A_MAIN), ("a_mp2", A_MP)):
    if f"{prefix}_peak_rss_mb" not in ratios:
      continue
    parts = []
    if f"{prefix}_throughput_vs_b" in ratios:
      parts.append(f"{ratios[f'{prefix}_throughput_vs_b']:.2f}x (b)'s throughput: "
                   f"{ratios[f'{prefix}_throughput_vs_b_target']}")
    if f"{prefix}_time_vs_c" in ratios:
      parts.append(f"{ratios[f'{prefix}_time_vs_c']:.2f}x (c)'s time: "
                   f"{ratios[f'{prefix}_time_vs_c_target']}")
    parts.append(f"peak RSS {ratios[f'{prefix}_peak_rss_mb']:.0f} MB: "
                 f"{ratios[f'{prefix}_peak_rss_target']}")
    if f"{prefix}_cpu_throughput_vs_b" in ratios and f"{prefix}_cpu_vs_c" in ratios:
      parts.append(f"by CPU seconds: {ratios[f'{prefix}_cpu_throughput_vs_b']:.2f}x (b)'s "
                   f"throughput, {ratios[f'{prefix}_cpu_vs_c']:.2f}x (c)'s time")
    print(f"{name}: " + "; ".join(parts))
  by = {r["system"]: r for r in rows}
  for name in CONVERTER_FLAGS:
    a = by.get(name)
    if not a or a.get("status") != "ok" or "shard_work_s" not in a:
      continue
    line = (f"{name}: {a['seconds']:.2f} s call = {a['startup_s']:.2f} s before the first shard "
            f"started + {a['shard_span_s']:.2f} s converting shards (their DoFn time sums to "
            f"{a['shard_work_s']:.2f} s) + {a['tail_s']:.2f} s after the last")
    if "prism_attempt_s" in a:
      line += f"; the startup includes {a['prism_attempt_s']:.2f} s trying Prism"
    print(line)
  for r in rows:
    if r["status"] != "ok":
      print(f"{r['system']}: {r['status']}: {r.get('error') or r.get('check')}")


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shards", type=int, default=8)
  p.add_argument("--records", type=int, default=25_000, help="Records per shard.")
  p.add_argument("--record-bytes", type=int, default=1000, help="Target serialized record size.")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--repeat", type=int, default=3,
                 help="Runs per system, interleaved round-robin; the fastest verified run is "
                 "reported (default %(default)s: the machine is shared, so single runs are noisy).")
  p.add_argument("--systems", default=",".join(SYSTEMS),
                 help=f"Comma-separated subset of: {', '.join(SYSTEMS)}.")
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
