"""Shared helpers for the bench scripts.

- Generated TFRecord data, cached under bench/data/ (gitignored) with a
  meta.json that also holds per-shard digests, so outputs can be checked.
- Running one system in a subprocess and measuring its wall time and peak
  RSS (the whole process tree, so multi-process runners count in full).
- Reading ArrayRecord outputs back for correctness checks.
- Plain-text tables.

Import from a bench script with the repository root on sys.path:

  sys.path.insert(0, REPO_ROOT)
  from bench import common
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import xxhash

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(REPO_ROOT, "bench", "data")
RESULTS_DIR = os.path.join(REPO_ROOT, "bench", "results")
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

_DATA_FORMAT = "arrayrecord-toolkit/bench-data/v1"
_MASK64 = (1 << 64) - 1

# --------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class DataSet:
  """A cached set of generated TFRecord shards and what is known about them.

  Attributes:
    dir: Directory holding the shards and meta.json.
    pattern: Glob matching exactly the shards.
    files: Shard paths, sorted.
    shards: Number of shards.
    records_per_shard: Records in each shard.
    records: Total records.
    record_bytes: Target serialized size of one record.
    payload_bytes: Sum of record lengths (without TFRecord framing).
    file_bytes: Sum of shard file sizes (what MB/s is computed from).
    shard_digests: Per shard, converter.manifest.RecordDigest hexdigest of
      its record stream (order and boundaries count).
    multiset: Order-independent digest of all records (see multiset_digest).
    kind: How records were made.
  """

  dir: str
  pattern: str
  files: list[str]
  shards: int
  records_per_shard: int
  records: int
  record_bytes: int
  payload_bytes: int
  file_bytes: int
  shard_digests: list[str]
  multiset: str
  kind: str

  def summary(self) -> dict[str, Any]:
    """JSON-ready description (paths relative to the repository)."""
    return {
        "dir": os.path.relpath(self.dir, REPO_ROOT),
        "shards": self.shards,
        "records_per_shard": self.records_per_shard,
        "records": self.records,
        "record_bytes": self.record_bytes,
        "mean_record_bytes": round(self.payload_bytes / max(self.records, 1), 1),
        "payload_mb": round(self.payload_bytes / 1e6, 3),
        "file_mb": round(self.file_bytes / 1e6, 3),
        "kind": self.kind,
    }


def example_records(shard: int, records: int, record_bytes: int, seed: int = 0) -> Iterator[bytes]:
  """Serialized tf.train.Examples of about record_bytes bytes each.

  Features: `id` (int64), `label` (int64) and `payload` (bytes). The payload
  is half random bytes and half a per-label pattern repeated, so it is
  semi-compressible (like real features). Deterministic in (seed, shard).
  """
  from pipelines.make_example_data import encode_example
  rng = np.random.default_rng([seed, shard, 1])
  templates = np.random.default_rng([seed, 2]).integers(0, 256, size=(10, 64), dtype=np.uint8)

  def encode(i: int, label: int, payload: bytes) -> bytes:
    return encode_example({"id": ("int64", [shard * records + i]),
                           "label": ("int64", [label]),
                           "payload": ("bytes", [payload])})

  # Pick the payload size so the encoded record is close to record_bytes.
  overhead = len(encode(records, 9, b"x" * max(record_bytes - 40, 1))) - max(record_bytes - 40, 1)
  size = max(record_bytes - overhead, 1)
  n_random = size // 2
  labels = rng.integers(0, 10, size=records)
  noise = rng.integers(0, 256, size=(records, n_random), dtype=np.uint8)
  reps = -(-(size - n_random) // templates.shape[1])
  patterns = [np.tile(t, reps)[:size - n_random].tobytes() for t in templates]
  for i in range(records):
    label = int(labels[i])
    yield encode(i, label, noise[i].tobytes() + patterns[label])


def _shard_path(directory: str, shard: int, shards: int) -> str:
  return os.path.join(directory, f"bench-train.tfrecord-{shard:05d}-of-{shards:05d}")


def ensure_tfrecord_data(shards: int = 8, records_per_shard: int = 25_000, record_bytes: int = 1000,
                         seed: int = 0, data_dir: str = DATA_DIR, log=print) -> DataSet:
  """The generated TFRecord shards for these parameters; made once, then reused.

  The TFRecord framing is TensorFlow's (pipelines.make_example_data writes it;
  the project's tests check it against tf.io). meta.json is written last, so
  an interrupted generation is redone, not reused.
  """
  from converter.manifest import RecordDigest
  from pipelines.make_example_data import write_tfrecord_file
  name = f"tfrecord-s{shards}-r{records_per_shard}-b{record_bytes}-seed{seed}"
  directory = os.path.join(data_dir, name)
  meta_path = os.path.join(directory, "meta.json")
  meta = None
  if os.path.exists(meta_path):
    with open(meta_path) as f:
      meta = json.load(f)
    paths = [os.path.join(directory, b) for b in meta["files"]]
    sizes_ok = meta.get("format") == _DATA_FORMAT and all(
        os.path.exists(p) and os.path.getsize(p) == s for p, s in zip(paths, meta["file_sizes"]))
    if not sizes_ok:
      meta = None
  if meta is None:
    start = time.monotonic()
    if os.path.exists(directory):
      shutil.rmtree(directory)
    os.makedirs(directory)
    digests, multiset, payload = [], _Multiset(), 0
    for s in range(shards):
      digest = RecordDigest()
      def records(s=s, digest=digest):
        nonlocal payload
        for r in example_records(s, records_per_shard, record_bytes, seed):
          digest.update(r)
          multiset.add(r)
          payload += len(r)
          yield r
      write_tfrecord_file(_shard_path(directory, s, shards), records())
      digests.append(digest.hexdigest())
    files = [_shard_path(directory, s, shards) for s in range(shards)]
    meta = {
        "format": _DATA_FORMAT,
        "kind": "tf.train.Example {id, label, payload: 50% random + 50% repeated pattern}",
        "shards": shards, "records_per_shard": records_per_shard, "record_bytes": record_bytes,
        "seed": seed,
        "files": [os.path.basename(p) for p in files],
        "file_sizes": [os.path.getsize(p) for p in files],
        "payload_bytes": payload,
        "shard_digests": digests,
        "multiset": multiset.hexdigest(),
    }
    tmp = meta_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(meta, f, indent=1)
    os.replace(tmp, meta_path)
    log(f"Generated {shards} x {records_per_shard:,} records of ~{record_bytes} B into "
        f"{os.path.relpath(directory, REPO_ROOT)} in {time.monotonic() - start:.1f} s")
  files = [os.path.join(directory, b) for b in meta["files"]]
  return DataSet(
      dir=directory, pattern=os.path.join(directory, "bench-train.tfrecord-*"), files=files,
      shards=meta["shards"], records_per_shard=meta["records_per_shard"],
      records=meta["shards"] * meta["records_per_shard"], record_bytes=meta["record_bytes"],
      payload_bytes=meta["payload_bytes"], file_bytes=sum(meta["file_sizes"]),
      shard_digests=meta["shard_digests"], multiset=meta["multiset"], kind=meta["kind"])


def warm_page_cache(paths: Iterable[str], chunk: int = 16 << 20) -> None:
  """Reads files once so every system starts with them in the page cache."""
  for p in paths:
    with open(p, "rb") as f:
      while f.read(chunk):
        pass


# --------------------------------------------------------------------------
# Output checks.
# --------------------------------------------------------------------------


class _Multiset:
  """Order-independent digest: record count and sum of xxh3-64 of each record."""

  def __init__(self):
    self.count = 0
    self.total = 0

  def add(self, record: bytes) -> None:
    self.count += 1
    self.total = (self.total + xxhash.xxh3_64_intdigest(record)) & _MASK64

  def hexdigest(self) -> str:
    return f"n={self.count}:sum-xxh3_64={self.total:016x}"


def multiset_digest(records: Iterable[bytes]) -> str:
  """Digest of a bag of records: equal for the same records in any order/sharding."""
  m = _Multiset()
  for r in records:
    m.add(r)
  return m.hexdigest()


def read_array_record(path: str) -> Iterator[bytes]:
  """The records of one ArrayRecord file, in order (in slices, to bound memory)."""
  from array_record.python.array_record_module import ArrayRecordReader
  r = ArrayRecordReader(path)
  try:
    n = r.num_records()
    step = 4096
    for start in range(0, n, step):
      yield from r.read(start, min(start + step, n))
  finally:
    r.close()


def array_record_count(path: str) -> int:
  from array_record.python.array_record_module import ArrayRecordReader
  r = ArrayRecordReader(path)
  try:
    return r.num_records()
  finally:
    r.close()


def check_outputs(paths: Sequence[str], data: DataSet, matched: bool) -> tuple[bool, str, int]:
  """Checks ArrayRecord outputs against the input data set.

  Args:
    paths: The output files.
    data: The input.
    matched: True if output i must hold exactly the records of input shard i,
      in order (paths sorted like data.files); False to check only that all
      outputs together hold the same bag of records.

  Returns:
    (ok, message, records found).
  """
  from converter.manifest import RecordDigest
  paths = sorted(paths)
  counts = [array_record_count(p) for p in paths]
  total = sum(counts)
  if total != data.records:
    return False, f"{total:,} records in {len(paths)} file(s), expected {data.records:,}", total
  if matched:
    if len(paths) != data.shards:
      return False, f"{len(paths)} output files for {data.shards} input shards", total
    for i, p in enumerate(paths):
      d = RecordDigest()
      d.update_many(read_array_record(p))
      if d.hexdigest() != data.shard_digests[i]:
        return False, f"{os.path.basename(p)}: records differ from input shard {i}", total
    return True, (f"{len(paths)} files, {total:,} records, each identical (order too) to "
                  "its input shard"), total
  got = multiset_digest(r for p in paths for r in read_array_record(p))
  if got != data.multiset:
    return False, f"records differ from the input ({got} != {data.multiset})", total
  return True, (f"{len(paths)} files, {total:,} records, same records as the input "
                "(any order)"), total


# --------------------------------------------------------------------------
# Running a system in a subprocess.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Measured:
  """What run_measured saw of one subprocess.

  Attributes:
    returncode: The child's exit status.
    wall_s: Wall time from start to exit, seen from the parent (includes the
      interpreter start and imports).
    peak_rss_mb: Peak of the summed RSS of the child and all its descendants,
      sampled every `interval` seconds (MB = 1e6 bytes). Shared pages are
      counted once per process, so for multi-process runs this is an upper
      bound on what the tree needs.
    max_process_rss_mb: ru_maxrss from wait4: the largest single process of
      the tree (exact, not sampled).
    max_processes: Most processes seen in the tree at once.
    cpu_s: User + system CPU seconds of the child and the descendants it
      reaped (wait4). Less sensitive than wall time to other load on the
      machine.
    stdout: Captured stdout+stderr text.
  """

  returncode: int
  wall_s: float
  cpu_s: float
  peak_rss_mb: float
  max_process_rss_mb: float
  max_processes: int
  stdout: str


def run_measured(cmd: Sequence[str], *, timeout: float | None = None, env: dict | None = None,
                 cwd: str | None = None, interval: float = 0.02) -> Measured:
  """Runs cmd, sampling the RSS of its process tree; returns what it measured."""
  import tempfile

  import psutil
  fd, out_path = tempfile.mkstemp(prefix="bench-", suffix=".log")
  with os.fdopen(fd, "w+b") as out:
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd or REPO_ROOT)
    peak = [0, 0]  # bytes, processes
    done = threading.Event()

    def sample():
      try:
        root = psutil.Process(proc.pid)
      except psutil.Error:
        return
      while not done.is_set():
        total, n = 0, 0
        try:
          procs = [root] + root.children(recursive=True)
        except psutil.Error:
          break
        for p in procs:
          try:
            total += p.memory_info().rss
            n += 1
          except psutil.Error:
            pass
        peak[0] = max(peak[0], total)
        peak[1] = max(peak[1], n)
        done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = None if timeout is None else start + timeout
    status, rusage = None, None
    while status is None:
      pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
      if pid:
        status, rusage = st, ru
        break
      if deadline is not None and time.monotonic() > deadline:
        _kill_tree(proc.pid)
      time.sleep(0.01)
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    text = out.read().decode(errors="replace")
  os.remove(out_path)
  max_rss_kb = rusage.ru_maxrss  # kilobytes on Linux
  return Measured(returncode=proc.returncode, wall_s=wall,
                  cpu_s=rusage.ru_utime + rusage.ru_stime,
                  peak_rss_mb=max(peak[0], max_rss_kb * 1024) / 1e6,
                  max_process_rss_mb=max_rss_kb * 1024 / 1e6, max_processes=peak[1], stdout=text)


def tree_cpu_seconds() -> float:
  """User + system CPU seconds of this process and all its live descendants.

  Also counts the descendants this process has reaped. Call it at the start
  and the end of a measured window: the difference is the CPU the whole
  process tree (worker processes included) spent in that window.
  """
  import psutil
  root = psutil.Process()
  t = root.cpu_times()
  total = t.user + t.system + t.children_user + t.children_system
  for child in root.children(recursive=True):
    try:
      ct = child.cpu_times()
      total += ct.user + ct.system
    except psutil.Error:  # Exited between the listing and the read.
      pass
  return total


def _is_resource_tracker(p) -> bool:
  import psutil
  try:
    return "multiprocessing.resource_tracker" in " ".join(p.cmdline())
  except psutil.Error:
    return False


def end_descendants(timeout: float = 2.0) -> int:
  """Terminates (then kills) the processes this process started; returns how many were left.

  A benchmark child calls it before exiting so that worker processes a
  library failed to shut down do not outlive it (they would be re-parented
  and escape run_measured's tree kill). multiprocessing's resource tracker is
  left alone: it ignores SIGTERM, and when this process exits it sees its pipe
  close, unlinks any shared memory the workers leaked, and exits by itself.
  """
  import psutil
  children = [c for c in psutil.Process().children(recursive=True) if not _is_resource_tracker(c)]
  for c in children:
    try:
      c.terminate()
    except psutil.Error:
      pass
  _, alive = psutil.wait_procs(children, timeout=timeout)
  for c in alive:
    try:
      c.kill()
    except psutil.Error:
      pass
  return len(children)


def run_json_child(cmd: Sequence[str], tag: str, *, timeout: float, env: dict | None = None
                   ) -> tuple[dict | None, Measured]:
  """Runs cmd under run_measured; returns the JSON it printed after `tag` (None if none)."""
  m = run_measured(cmd, timeout=timeout, env=env)
  result = None
  for line in m.stdout.splitlines():
    if line.startswith(tag):
      result = json.loads(line[len(tag):])
  return result, m


def _kill_tree(pid: int) -> None:
  import psutil
  try:
    root = psutil.Process(pid)
    for p in root.children(recursive=True) + [root]:
      try:
        p.kill()
      except psutil.Error:
        pass
  except psutil.Error:
    pass


def child_env(**extra: str) -> dict[str, str]:
  """This process's environment for a child that imports the repository's packages.

  The repository goes in front of PYTHONPATH rather than replacing it: a
  machine whose packages are on PYTHONPATH (wheels unpacked into a folder)
  keeps them in the child.
  """
  path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
  return {**os.environ, **extra, "PYTHONPATH": path}


def fresh_dir(path: str) -> str:
  """An empty directory at path (removed first if it exists)."""
  if os.path.exists(path):
    shutil.rmtree(path)
  os.makedirs(path)
  return path


def machine_info() -> dict[str, Any]:
  import psutil
  info = {
      "cpu_count": os.cpu_count(),
      "python": platform.python_version(),
      "platform": platform.platform(),
      "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
  }
  try:
    info["load_avg_1m"] = round(os.getloadavg()[0], 2)
  except OSError:
    pass
  return info


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
  from importlib import metadata
  out = {}
  for n in names:
    try:
      out[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
      out[n] = None
  return out


# --------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
  """A plain-text table.

  Args:
    rows: Dicts; a missing or None value prints as '-'.
    columns: (header, key, format spec such as '.2f' or ',.0f' or '').
  """
  cells = [[h for h, _, _ in columns]]
  for r in rows:
    line = []
    for _, key, spec in columns:
      v = r.get(key)
      if v is None:
        line.append("-")
      elif isinstance(v, (int, float)) and spec:
        line.append(format(v, spec))
      else:
        line.append(str(v))
    cells.append(line)
  widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
  numeric = [all(_numeric(c[i]) for c in cells[1:]) for i in range(len(columns))]
  out = []
  for n, c in enumerate(cells):
    out.append("  ".join(v.rjust(w) if num and n else v.ljust(w)
                         for v, w, num in zip(c, widths, numeric)).rstrip())
    if n == 0:
      out.append("  ".join("-" * w for w in widths))
  return "\n".join(out)


def _numeric(s: str) -> bool:
  s = s.replace(",", "").replace("x", "").strip()
  if s == "-":
    return True
  try:
    float(s)
    return True
  except ValueError:
    return False


def write_json(path: str, obj: Any) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
    f.write("\n")
  os.replace(tmp, path)
  return path


def files_matching(pattern: str) -> list[str]:
  return sorted(glob.glob(pattern))
