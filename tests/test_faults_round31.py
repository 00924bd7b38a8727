"""Round 31 of the fault audit: opening ArrayRecord files under an address-space limit (`ulimit -v`).

Found by the 2026-12-07 audit, each case run for real before the fix:

- array_record starts a process-wide pool of 64 threads when a process opens its first ArrayRecord file for
  reading (ArrayRecordGlobalPool, on every ArrayRecordReader). Each thread needs its stack (8 MiB under the usual
  `ulimit -s`) and, once it allocates, a malloc arena (glibc reserves up to 128 MiB for one, up to 8 per core).
  Where a thread does not fit under RLIMIT_AS, array_record waits for it for ever: no error, no exit, and SIGTERM
  not acted on (the main thread waits in C++). A training script reading with the loader hung under `ulimit -v`
  with 700, 900 and even 1,200 MiB to spare (all killed after 30 s); `arrayrecord-verify` hung under
  `ulimit -v 800000` and 1,200,000 (the "left alone" of round 29); `arrayrecord-convert --skip-existing`, which
  reads the outputs it keeps, hung under `ulimit -v 1000000`.
- Under a limit too small to load array_record at all, the loader said "ArrayRecordSource needs the array_record
  package: pip install array-record" (an installed package), and verify printed an ImportError traceback. It
  now raises ReaderThreadsError saying array_record cannot be loaded under `ulimit -v` (seen by hand: with
  20 MiB to spare the same script also meets glibc's own abort or Python's "can't start new thread", depending
  on which allocation fails first, so no test pins it).

loader.reader_threads now checks the room before the first reader of a process opens: it caps glibc's malloc
arenas at what fits beside the threads' stacks (arenas past the cap are shared, never a failure; a cap the user
set is never raised), so the same script now reads with 900 MiB to spare; where even the stacks do not fit it
raises ReaderThreadsError (a MemoryError) in one line naming the file, the limit, the memory in use and the limit
to set. The CLIs print that line (exit 1), and nothing is changed.

The same hang under a container's process limit (cgroup pids.max, `docker --pids-limit 40`): now the same kind of
one-line error, naming the cgroup file, the limit and what runs. And under a user's process limit (`ulimit -u`,
RLIMIT_NPROC, which counts every thread of the user's processes; root is exempt): as `nobody` with a limit of 60
the first read hung (killed after 10 s); now the same kind of line says by how much to raise `ulimit -u`.

Also in this round: a TFRecord header whose length (its checksum valid) runs past a plain file's end was read
to the file's end before the record was called cut (300 MB of tail: 768 MB of memory; a tail bigger than
memory: "did not fit in memory" instead of "truncated"). The file's size now says so at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings

import pytest

import faults_testing as ft
import loader
import loader_testing
from loader import reader_threads

pytestmark = pytest.mark.timeout(300)

# Runs a console script in-process once its modules are imported, with `room` MiB of address space beyond what
# the process uses then: a limit relative to the process, so that it means the same on any machine.
_CLI_WITH_ROOM = textwrap.dedent("""
    import importlib, resource, sys
    from pipelines import entry_points
    script, room, argv = sys.argv[1], int(sys.argv[2]) << 20, sys.argv[3:]
    importlib.import_module(entry_points.SCRIPTS[script][0])
    used = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + room, resource.getrlimit(resource.RLIMIT_AS)[1]))
    sys.exit(entry_points.run(script, argv))
""")

# A training script's read: a global shuffle of every record, batched, in process.
_READ_WITH_ROOM = textwrap.dedent("""
    import json, resource, sys
    import loader
    paths, room = sys.argv[1:-1], int(sys.argv[-1]) << 20
    used = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + room, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
      ds = loader.MapDataset.source(loader.sources.ArrayRecordDataSource(paths)).shuffle(seed=0).batch(100)
      print(json.dumps({"records": sum(len(b) for b in ds.to_iter_dataset())}))
    except MemoryError as e:
      print(json.dumps({"error": type(e).__name__, "message": str(e)}))
""")


def _run(source: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
  try:
    return subprocess.run([sys.executable, "-c", source, *args], cwd=ft.REPO, env={**ft.env(), **env},
                          capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    pytest.fail(f"hung: no answer in {timeout} s (array_record waiting for reading threads that cannot start?)")


def _stack_mib() -> int:
  return reader_threads.POOL_THREADS * reader_threads._thread_stack_bytes(reader_threads._libc()) >> 20  # pylint: disable=protected-access


def test_the_loader_reads_under_a_tight_address_space_limit_or_says_what_limit_to_set(tmp_path):
  paths = loader_testing.write_array_records(tmp_path, 2, 1000)
  stacks = _stack_mib()
  outcomes = {}
  # Too little for the threads' stacks; stacks and a margin; more. Each hung before (all three here, 2 cores).
  for room in (stacks // 2, stacks + 400, stacks + 700):
    r = _run(_READ_WITH_ROOM, *paths, str(room))
    assert r.returncode == 0, r.stderr
    outcomes[room] = json.loads(r.stdout.strip().splitlines()[-1])
  refused = outcomes[stacks // 2]
  assert refused["error"] == "ReaderThreadsError", refused
  message = refused["message"]
  assert "\n" not in message and message.startswith(f"{paths[0]}: cannot open an ArrayRecord file"), message
  assert "`ulimit -v`" in message and "Raise `ulimit -v` to at least" in message and "KiB" in message, message
  # Where the stacks fit, it reads (arenas capped to what fits), or, on a machine whose threads took more
  # before the first file opened, says so in the same line: never a hang.
  assert outcomes[stacks + 700] == {"records": 2000}, outcomes
  assert outcomes[stacks + 400] == {"records": 2000} or outcomes[stacks + 400]["error"] == "ReaderThreadsError"


_READ_AFTER_THE_POOL_STARTED = textwrap.dedent("""
    import json, resource, sys
    from array_record.python.array_record_module import ArrayRecordReader
    import loader
    paths = sys.argv[1:]
    ArrayRecordReader(paths[0]).num_records()  # The pool starts here (a reader opened outside loader).
    used = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (used + (400 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
    ds = loader.MapDataset.source(loader.sources.ArrayRecordDataSource(paths)).shuffle(seed=0).batch(100)
    print(json.dumps({"records": sum(len(b) for b in ds.to_iter_dataset())}))
""")


def test_a_process_whose_reading_threads_run_already_is_not_refused(tmp_path):
  """Room for the threads is checked only before they may have started: a limit that leaves no room for
  another 64 threads' stacks, set once they run, must not stop a process that reads."""
  paths = loader_testing.write_array_records(tmp_path, 2, 1000)
  # Few malloc arenas: the source's own counting threads each took a new one (up to 128 MiB of address space)
  # and now and then one could not start in the 400 MiB left ("can't start new thread", 2 runs in 10).
  r = _run(_READ_AFTER_THE_POOL_STARTED, *paths, MALLOC_ARENA_MAX="2")
  assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1]) == {"records": 2000}, r.stderr


def _converted(tmp_path) -> tuple[str, str]:
  inp, out = tmp_path / "in", tmp_path / "out"
  inp.mkdir()
  ft.make_dataset(str(inp), shards=2, records=50, size=100)
  r = ft.run_cli("pipelines.convert", "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1")
  assert r.returncode == 0, r.stderr
  return str(inp), str(out)


def test_verify_and_a_resumed_convert_under_a_tight_limit_say_so_in_one_line_and_change_nothing(tmp_path):
  inp, out = _converted(tmp_path)
  before = {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}
  shard = os.path.join(out, ft.out_name("ds.tfrecord-00000-of-00002"))
  room = str(_stack_mib() // 2)
  for script, args in (("arrayrecord-verify", ["--input", os.path.join(inp, "*"), "--output", out]),
                       ("arrayrecord-convert", ["--input", os.path.join(inp, "*"), "--output", out, "--quiet",
                                                "--workers", "1", "--skip-existing"])):
    r = _run(_CLI_WITH_ROOM, script, room, *args)
    assert r.returncode == 1, (script, r.stdout, r.stderr)
    line = ft.one_line(r.stderr)
    assert line.startswith(f"{script}: error: ") and "cannot open an ArrayRecord file" in line, line
    assert "Raise `ulimit -v` to at least" in line and shard in line.replace(out + "/", out + os.sep), line
    assert {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))} == before
    assert ft.temps(str(tmp_path)) == []
  # With the limit the line names, both work.
  r = _run(_CLI_WITH_ROOM, "arrayrecord-verify", str(_stack_mib() + 700),
           "--input", os.path.join(inp, "*"), "--output", out)
  assert r.returncode == 0 and "2/2 shard(s) match" in r.stdout, (r.stdout, r.stderr)


def test_a_cap_on_malloc_arenas_the_user_set_is_kept(monkeypatch):
  monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  assert reader_threads._arena_cap() == 2  # pylint: disable=protected-access
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0:glibc.malloc.arena_max=3")
  assert reader_threads._arena_cap() == 3  # pylint: disable=protected-access
  monkeypatch.delenv("MALLOC_ARENA_MAX")
  monkeypatch.delenv("GLIBC_TUNABLES")
  assert reader_threads._arena_cap() == 8 * (os.cpu_count() or 1)  # pylint: disable=protected-access


def _bytes_read() -> int:
  """Bytes this process has read (read(2) and the like), from /proc/self/io."""
  with open("/proc/self/io", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_length_past_the_files_end_is_known_cut_without_reading_the_rest(tmp_path, on_corrupt):
  """A record header whose length (its checksum valid) runs past a plain file's end was read to the file's end
  before it was called cut: 300 MB after it took 768 MB of memory, and a tail bigger than memory ended in
  "did not fit in memory". The file's size says it at once; the error, and skip mode's scan, are unchanged."""
  import struct  # pylint: disable=g-import-not-at-top
  from converter.tfrecord import TFRecordReader  # pylint: disable=g-import-not-at-top
  head = struct.pack("<Q", 50 << 30)
  header = head + struct.pack("<I", ft._masked_crc(head))  # pylint: disable=protected-access
  paths = []
  for name, tail in (("warm-up", 100), ("h", 64 << 20)):
    paths.append(ft.write_tfrecords(tmp_path / f"{name}.tfrecord", [b"a", b"b"]))
    with open(paths[-1], "ab") as f:
      f.write(header + os.urandom(tail))
  ft.error_of(lambda: list(TFRecordReader(paths[0])))  # What the error path imports is read once, here.
  reader = TFRecordReader(paths[1], on_corrupt=on_corrupt)
  start = _bytes_read()
  if on_corrupt == "fail":
    e = ft.error_of(lambda: list(reader))
    assert (f"record 2 at byte offset 34 is corrupt: the file ends inside the record (header says 53687091200 "
            f"data bytes, {64 << 20} present") in str(e), e
    assert _bytes_read() - start < 16 << 20  # Its first chunk; the whole file before.
  else:  # The scan for a next record still reads on, a chunk at a time.
    assert list(reader) == [b"a", b"b"] and reader.stats.skipped == 1 and reader.stats.truncated


def _cgroup_tree(tmp_path, layout: str, limits: dict[str, tuple[str, int]]) -> tuple[str, str]:
  """A /proc/self/cgroup and a cgroup mount with pids.max / pids.current per folder, as the kernel shows them."""
  mounts = tmp_path / "sys"
  for folder, (limit, current) in limits.items():
    d = mounts / ("pids" if layout == "v1" else "") / folder.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "pids.max").write_text(limit + "\n")
    (d / "pids.current").write_text(f"{current}\n")
  leaf = max(limits, key=len)
  (tmp_path / "cgroup").write_text("4:memory:/x\n8:pids:" + leaf + "\n" if layout == "v1" else "0::" + leaf + "\n")
  return str(tmp_path / "cgroup"), str(mounts)


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_containers_process_limit_is_read_from_the_tightest_cgroup_of_the_process(tmp_path, layout):
  """Under a container's pids limit (docker --pids-limit 40) a training script hung the same way at its first
  read (64 threads that cannot start; seen with a real cgroup v1 pids.max of 40, killed after 30 s; with 90 it
  reads). The limit is read from /proc/self/cgroup's cgroups, the tightest of the process's and its parents'."""
  cgroup, mounts = _cgroup_tree(tmp_path, layout, {"/": ("max", 900), "/pod": ("1000", 300), "/pod/c": ("400", 5)})
  assert reader_threads._task_room(cgroup, mounts) == (  # pylint: disable=protected-access
      395, 400, f"{mounts}{'/pids' if layout == 'v1' else ''}/pod/c/pids.max")
  cgroup, mounts = _cgroup_tree(tmp_path / "b", layout, {"/": ("max", 900), "/pod": ("1000", 990), "/pod/c": ("max", 5)})
  assert reader_threads._task_room(cgroup, mounts)[:2] == (10, 1000)  # pylint: disable=protected-access
  cgroup, mounts = _cgroup_tree(tmp_path / "c", layout, {"/": ("max", 900), "/pod": ("max", 5)})
  assert reader_threads._task_room(cgroup, mounts) is None  # pylint: disable=protected-access


# A training script's first read as a user whose `ulimit -u` leaves `room` more threads than the user runs.
# Root is exempt from the limit, so as root the script first becomes `nobody` (what it reads is imported before:
# root's Python may not be readable by nobody).
_READ_UNDER_NPROC = textwrap.dedent("""
    import encodings.ascii, encodings.utf_8, concurrent.futures.thread, json, os, resource, sys
    from array_record.python import array_record_module
    import loader
    from loader import reader_threads
    paths, room = sys.argv[1:-1], int(sys.argv[-1])
    if os.geteuid() == 0:
      os.setgid(65534)
      os.setuid(65534)
    limit = reader_threads._user_tasks(os.getuid()) + room
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
    try:
      source = loader.ArrayRecordSource(paths)
      print(json.dumps({"records": len(source), "last": source[len(source) - 1].hex()}))
    except MemoryError as e:
      print(json.dumps({"error": type(e).__name__, "message": str(e)}))
""")


def test_a_users_process_limit_too_small_for_the_reading_threads_is_said_in_one_line(tmp_path):
  """Under `ulimit -u` (RLIMIT_NPROC, counting every thread of the user's processes) with room for fewer than
  the pool's 64 threads, the first read hung the same way (seen as `nobody` with a limit of 60, killed after
  10 s; 100 reads). Now: the one-line error saying by how much to raise `ulimit -u`; with room, it reads."""
  # Readable by `nobody`, unlike pytest's folders of root (where conftest points `tempfile` too).
  folder = tempfile.mkdtemp(prefix="nproc-", dir=os.environ.get("TMPDIR") or "/tmp")
  try:
    os.chmod(folder, 0o755)
    paths = loader_testing.write_array_records(folder, 2, 50)
    for p in paths:
      os.chmod(p, 0o644)
    refused, read = (json.loads(_run(_READ_UNDER_NPROC, *paths, str(room), timeout=60).stdout.splitlines()[-1])
                     for room in (30, 200))
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  assert read == {"records": 100, "last": loader_testing.record_bytes(99, 24).hex()}, read
  assert refused["error"] == "ReaderThreadsError", refused
  message = refused["message"]
  assert "\n" not in message and message.startswith(f"{paths[0]}: cannot open an ArrayRecord file under this "
                                                     "user's process limit (`ulimit -u` "), message
  assert "Raise `ulimit -u` (nproc in /etc/security/limits.conf) by at least " in message, message


def test_the_users_threads_are_counted_from_proc(tmp_path):
  """RLIMIT_NPROC counts the threads of every process of the real user: the scan adds up `Threads` of the
  processes whose real uid (the first of `Uid`) is the user's, and passes over entries it cannot read."""
  for pid, uid, threads in ((10, 1000, 3), (11, 1000, 64), (12, 0, 9), (13, 1001, 2)):
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t0\t{uid}\t{uid}\nThreads:\t{threads}\n")
  (tmp_path / "14").mkdir()  # A process gone between the listing and the read.
  (tmp_path / "self").mkdir()
  assert reader_threads._user_tasks(1000, str(tmp_path)) == 67  # pylint: disable=protected-access
  assert reader_threads._user_tasks(0, str(tmp_path)) == 9  # pylint: disable=protected-access


def test_a_process_forked_after_reads_is_warned_before_it_opens_a_file(tmp_path):
  """A child forked after its parent read ArrayRecord files, opening a new source, crashed with SIGSEGV in 29
  of 30 forks (abseil's Mutex under riegeli's BackgroundCleaner, whose thread the child does not have; Grain's
  ArrayRecordDataSource: 30 of 30); reading in its main thread hung now and then. array_record cannot be made
  safe there, so the child is told why before it opens the file (here as an error, so nothing is opened)."""
  paths = loader_testing.write_array_records(tmp_path, 2, 20)
  assert loader.ArrayRecordSource(paths)[3] == loader_testing.record_bytes(3, 24)

  def child() -> str:
    warnings.simplefilter("error", reader_threads.ForkedReaderWarning)
    loader.ArrayRecordSource(paths)
    return "opened"

  out = ft.in_fork(child)
  assert out.startswith(f"ForkedReaderWarning: {paths[0]}: this process (pid ") and "forked from process " in out
  assert "'spawn'" in out and "\n" not in out, out
  with warnings.catch_warnings():  # The parent itself is not a fork: no warning.
    warnings.simplefilter("error", reader_threads.ForkedReaderWarning)
    assert loader.ArrayRecordSource(paths)[5] == loader_testing.record_bytes(5, 24)
