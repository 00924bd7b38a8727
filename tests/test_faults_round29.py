"""Round 29 of the fault audit (conversion side): records too big for the memory a run may use, shards of many
big records, and standard output whose reader went away.

Found by the 2026-12-07 fault audit, each case run against the real CLI, reader and ArrayRecord writer before
the fix:

- `arrayrecord-convert` under a memory limit (`ulimit -v`, a container's or a batch job's limit) too small for
  one record (a 120 MB record under `ulimit -v 1000000`) said only "arrayrecord-convert: error: MemoryError":
  not the file, the record, its offset or size, nor what to do. It now says, in one line (a RecordMemoryError,
  still a MemoryError), which record of which file at which byte offset, how many data bytes, the limit, that
  nothing was written for the file and the shards written are kept, and to give the run more memory (or fewer
  --workers) and rerun with --skip-existing. The writer's std::bad_alloc (ArrayRecordWriter raises
  MemoryError, also again from close()) is named the same way, with the record's index and size.
- A shard of many big records (twelve 30 MB video clips) was converted holding up to 256 records at once
  (write_digested read a batch of 256 records, wrote them, then hashed them): peak memory 595 MB for a shard of
  twelve 30 MB records against 258 MB for one such record, growing with the shard's number of big records up
  to 256 times the record size. Batches are now also capped at 4 MiB of records (a bigger record is a batch of
  its own); peak memory for the same shard: 355 MB, and small records are batched as before.
- A GZIP or ZLIB input of padding or zeros (a 0.7 MB file of 60,000 records of 10 KB of zeros, common for padded
  features) was decoded a whole 4 MiB read at a time, up to ~1000 times its size: peak memory 1,338 MB for that
  file (it would be about 4 GB for each 4 MiB read of such data), growing with the compression ratio, not with
  the record. The decoder now gives at most 4 MiB a step (zlib's max_length; the rest of the input waits):
  206 MB for the same file.
- `arrayrecord-convert ... | head -1` whose reader had gone before the run's first line ("Converting ...")
  stopped the run with "arrayrecord-convert: error: BrokenPipeError: [Errno 32] Broken pipe (the storage server
  could not be reached; shards finished before are kept: when it is reachable again, rerun with
  --skip-existing)", exit 1: a BrokenPipeError is a ConnectionError, taken for the storage's. It now stops as
  it does when the summary meets the closed pipe (and as Unix tools do): exit 141, without a word, nothing left.
  The progress thread, whose first line to a pipe is due after 10 s, died on such a pipe with an "Exception in
  thread conversion-progress ... BrokenPipeError" traceback on stderr (seen with its Watcher and a real pipe,
  as a longer run piped into `head -1` meets it); it now stops printing and the run goes on.

Checked and already handled in this round (no test added, each ran for real): umask 077, 022 and 002 (outputs
and manifest get the umask's permissions, not a temp file's 0600); an input glob matching a link to /dev/zero
or a Unix socket (one line each, "not a regular file", no folder made); input folder and file names and an
--output holding spaces, `%`, `#`, `$` and non-ASCII letters (converted, named as given); an empty (zero-byte)
input (an empty shard, 0 records); a TMPDIR that does not exist (converted); temps named for a dead process beside
manifest.json and the lock (what a run killed while writing them leaves), removed by the next run with
--skip-existing or --overwrite; a file size limit
(`ulimit -f 140`) that 300 shards fit under but their manifest does not (one line naming manifest.json and the
limit, the marker kept); `ulimit -n 40` with --workers 2 (refused before any work, saying the limit needed);
a zero-byte file at an output name and a cut one with --skip-existing (the first refused as not an ArrayRecord
file; the cut one, with no manifest, converted again); a 4 GiB record under `ulimit -v` 2 GiB with --workers 2
(the worker's error reaches the user as the same one line, the other shard kept).

Found later the same day (round 31): the writer's out-of-memory under --on-corrupt skip named the record by its
index among the records written, with no offset; it now names the input's index and byte offset
(TFRecordReader.position / place).

Left alone: `arrayrecord-verify` under `ulimit -v 1000000` over a 120 MB record waited until `timeout` stopped
it (array_record's reader under a tight memory limit, as the loader's round 29 found; fixed in round 31: its
reading threads did not fit); with less memory it reports the record as above ("unreadable input: ...").
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import zlib

import pytest

import faults_testing as ft
from converter import manifest as _manifest
from converter.errors import RecordMemoryError
from converter.tfrecord import TFRecordReader
from converter.writer import ArrayRecordShardWriter
from pipelines import progress

CONVERT = "pipelines.convert"
pytestmark = pytest.mark.timeout(300)


def _tfrecord_with_a_huge_record(path: str, first: bytes, length: int) -> int:
  """A TFRecord file: `first`, then a record whose header claims `length` bytes (a sparse file of zeros).

  Returns the huge record's byte offset.
  """
  ft.write_tfrecords(path, [first])
  offset = os.path.getsize(path)
  head = struct.pack("<Q", length)
  with open(path, "ab") as f:
    f.write(head + struct.pack("<I", ft._masked_crc(head)))  # pylint: disable=protected-access
    f.truncate(offset + 12 + length + 4)  # Zeros that take no disk space.
  return offset


def test_a_record_too_big_for_the_memory_limit_is_named_with_its_file_record_and_offset(tmp_path, ar_read):
  inp, out = tmp_path / "in", tmp_path / "out"
  ft.write_tfrecords(inp / "a.tfrecord", [b"a%d" % i for i in range(5)])
  huge = str(inp / "b.tfrecord")
  offset = _tfrecord_with_a_huge_record(huge, b"first", 4 << 30)
  # 2 GiB: Beam's start-up fits (about 1.1 GB of address space here); a 4 GiB record cannot.
  r = ft.run_cli_in_memory(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1",
                           address_space=2 << 30, timeout=240)
  assert r.returncode == 1, r.stderr
  line = ft.one_line(r.stderr)
  assert f"{huge}: record 1 at byte offset {offset} (4,294,967,296 data bytes) did not fit in memory" in line, line
  assert "`ulimit -v`" in line and "--skip-existing" in line, line
  assert ft.temps(str(tmp_path)) == []
  assert not os.path.exists(out / "b.array_record")
  # The advice works: with the file repaired (here: replaced by a small one), the run completes.
  os.remove(huge)
  ft.write_tfrecords(huge, [b"b0", b"b1"])
  r = ft.run_cli(CONVERT, "--input", str(inp / "*"), "--output", str(out), "--quiet", "--workers", "1",
                 "--skip-existing", timeout=120)
  assert r.returncode == 0, r.stderr
  assert ar_read(str(out / "b.array_record")) == [b"b0", b"b1"]
  assert ar_read(str(out / "a.array_record")) == [b"a%d" % i for i in range(5)]
  assert json.loads((out / "manifest.json").read_text())["totals"]["records"] == 7
  assert ft.temps(str(tmp_path)) == []


_WRITER_OUT_OF_MEMORY = textwrap.dedent("""
    import os, resource, sys
    from converter import manifest, transforms
    from converter.options import ConvertOptions
    from converter.planning import plan_shards

    inp, out = sys.argv[1], sys.argv[2]
    real = manifest.write_digested

    on_corrupt = sys.argv[3] if len(sys.argv) > 3 else "fail"

    def limited(records, write, digest):
      def write_limited(record):
        if len(record) > 1 << 20:  # The real writer, with too little memory left for this record.
          vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
          resource.setrlimit(resource.RLIMIT_AS, (vm + (24 << 20), resource.RLIM_INFINITY))
        write(record)
      real(records, write_limited, digest)

    transforms._manifest.write_digested = limited
    options = ConvertOptions(output_dir=out, on_corrupt=on_corrupt)
    [plan] = plan_shards([inp], options)
    try:
      list(transforms._ConvertShardFn(options).process(plan))
    except MemoryError as e:
      resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
      print(type(e).__name__, e)
    """)


def test_the_writers_out_of_memory_names_the_file_and_record(tmp_path):
  inp = str(tmp_path / "in" / "v.tfrecord")
  ft.write_tfrecords(inp, [b"small", os.urandom(1000), os.urandom(200 << 20), b"after"])
  out = tmp_path / "out"
  out.mkdir()  # The CLI's guard makes it before any shard is converted.
  r = subprocess.run([sys.executable, "-c", _WRITER_OUT_OF_MEMORY, inp, str(out)], cwd=ft.REPO, env=ft.env(),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith(f"RecordMemoryError {inp}: record 2 at byte offset 1037 (209,715,200 data bytes) did "
                              "not fit in memory"), r.stdout + r.stderr
  assert "--skip-existing" in r.stdout
  assert ft.temps(str(tmp_path)) == [] and not os.path.exists(out / "v.array_record")


def test_the_writers_out_of_memory_names_the_input_record_after_skipped_ones(tmp_path):
  """With --on-corrupt skip the writer's record index was its index among the records written (2 for input
  record 3 after one skipped), and no offset was given: now the input's index and byte offset."""
  inp = str(tmp_path / "in" / "v.tfrecord")
  ft.write_tfrecords(inp, [b"small", os.urandom(1000), b"x" * 50, os.urandom(200 << 20), b"after"])
  with open(inp, "r+b") as f:  # Damage record 1's data: skipped whole.
    f.seek(21 + 12 + 500)
    f.write(b"\xff")
  out = tmp_path / "out"
  out.mkdir()
  r = subprocess.run([sys.executable, "-c", _WRITER_OUT_OF_MEMORY, inp, str(out), "skip"], cwd=ft.REPO,
                     env=ft.env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith(f"RecordMemoryError {inp}: record 3 at byte offset {21 + 1016 + 66} (209,715,200 data "
                             "bytes) did not fit in memory"), r.stdout + r.stderr
  assert ft.temps(str(tmp_path)) == [] and not os.path.exists(out / "v.array_record")


@pytest.mark.parametrize("damaged", ["data", "header", "two"])
def test_the_reader_places_each_record_it_hands_out_after_skipped_stretches(tmp_path, damaged):
  """The index and offset write_digested names a record by (TFRecordReader.position / place), for every record
  of a batch, with damaged records skipped inside it."""
  records = [b"r%d" % i * (i + 1) for i in range(12)]
  path = ft.write_tfrecords(tmp_path / "v.tfrecord", records)
  offsets = [sum(16 + len(r) for r in records[:i]) for i in range(len(records))]
  bad = {"data": [3], "header": [3], "two": [3, 7]}[damaged]
  with open(path, "r+b") as f:
    for i in bad:
      f.seek(offsets[i] + (12 if damaged != "header" else 2))
      f.write(b"\xff")
  reader = TFRecordReader(path, on_corrupt="skip")
  it = iter(reader)
  before = reader.position()
  batch = [next(it) for _ in range(len(records) - len(bad))]
  kept = [i for i in range(len(records)) if i not in bad]
  assert batch == [records[i] for i in kept]
  assert [reader.place(before, batch, j)[:2] for j in range(len(batch))] == [(i, offsets[i]) for i in kept]


def test_a_shard_of_big_records_is_not_held_whole_in_memory(tmp_path, ar_read):
  path = str(tmp_path / "clips.tfrecord")
  records = [os.urandom(1 << 20) for _ in range(24)]
  ft.write_tfrecords(path, records)
  reader = TFRecordReader(path)
  held, written = [], [0]
  digest = _manifest.RecordDigest()
  with ArrayRecordShardWriter(str(tmp_path / "clips.array_record"), "group_size:1") as w:
    def write(record: bytes) -> None:
      held.append(reader.stats.records - written[0])  # Read from the file but not yet written out.
      written[0] += 1
      w.write(record)
    _manifest.write_digested(reader, write, digest)
    w.commit()
  assert max(held) <= 4, f"up to {max(held)} records of 1 MiB were held at once"
  assert ar_read(str(tmp_path / "clips.array_record")) == records
  expected = _manifest.RecordDigest()
  for r in records:
    expected.update(r)
  assert digest.hexdigest() == expected.hexdigest() and digest.records == 24


def test_small_records_are_still_batched_and_digested_the_same(tmp_path):
  records = [b"r%d" % i * (i % 7) for i in range(1000)]
  held, written, out = [], [0], []
  produced = [0]

  def source():
    for r in records:
      produced[0] += 1
      yield r

  def write(record: bytes) -> None:
    held.append(produced[0] - written[0])
    written[0] += 1
    out.append(record)

  digest = _manifest.RecordDigest()
  _manifest.write_digested(source(), write, digest)
  assert out == records and max(held) == 256  # Batches of 256 small records, as before.
  expected = _manifest.RecordDigest()
  for r in records:
    expected.update(r)
  assert digest.hexdigest() == expected.hexdigest()


def test_a_record_memory_error_is_a_memory_error_and_survives_pickling():
  import pickle
  e = RecordMemoryError("in/x.tfrecord", 3, 120, 5 << 20)
  assert isinstance(e, MemoryError) and e.exit_code == 1
  again = pickle.loads(pickle.dumps(e))
  assert str(again) == str(e) and again.offset == 120
  assert "in/x.tfrecord: record 3 at byte offset 120 (5,242,880 data bytes) did not fit in memory" in str(e)


def test_stdout_whose_reader_went_away_stops_quietly_and_blames_no_storage_server(tmp_path):
  inp, out = tmp_path / "in", tmp_path / "out"
  ft.make_dataset(str(inp), 2, 10, 100)
  read_end, write_end = os.pipe()
  os.close(read_end)  # `arrayrecord-convert ... | head -1` whose head has already exited.
  try:
    r = subprocess.run([sys.executable, "-m", CONVERT, "--input", str(inp / "*"), "--output", str(out),
                        "--workers", "1"], cwd=ft.REPO, env=ft.env(), stdout=write_end, stderr=subprocess.PIPE,
                       text=True, timeout=120, preexec_fn=ft.default_signals)
  finally:
    os.close(write_end)
  # As after the summary's print (and as Unix tools do): exit 141 without a word, nothing left. It was exit 1
  # with "BrokenPipeError: [Errno 32] Broken pipe (the storage server could not be reached; ...)".
  assert "storage server" not in r.stderr, r.stderr
  assert (r.returncode, r.stderr) == (141, ""), r.stderr
  assert not out.exists() and ft.temps(str(tmp_path)) == []



def test_a_storage_broken_pipe_after_stdouts_reader_went_away_is_still_reported(monkeypatch, capsys):
  # Only the BrokenPipeError our own stdout raised ends quietly: an upload's later "Broken pipe" (the
  # progress thread having met the closed stdout first) keeps its one line and exit 1 (review of round 29).
  from pipelines import cli  # pylint: disable=g-import-not-at-top
  from pipelines.entry_points import _Stdout  # pylint: disable=g-import-not-at-top

  class _Closed:
    def write(self, text):
      raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
      pass

  stdout = _Stdout(_Closed())
  with pytest.raises(BrokenPipeError):
    stdout.write("progress line\n")
  assert stdout.reader_gone is not None
  monkeypatch.setattr(sys, "stdout", stdout)

  def upload():
    raise BrokenPipeError(32, "Broken pipe")

  assert cli.run_reporting_errors("arrayrecord-convert", upload) == (None, 1)
  assert "storage server could not be reached" in capsys.readouterr().err

  def summary():
    stdout.write("summary\n")

  with pytest.raises(BrokenPipeError):  # Our own stdout's: through to the console script (exit 141).
    cli.run_reporting_errors("arrayrecord-convert", summary)

def test_progress_lines_into_a_pipe_whose_reader_went_away_print_no_traceback(tmp_path, monkeypatch):
  shard = progress.Shard(input=str(tmp_path / "a.tfrecord"), output=str(tmp_path / "out" / "a.array_record"),
                         size=1000)
  (tmp_path / "out").mkdir()
  read_end, write_end = os.pipe()
  os.close(read_end)
  failed: list[BaseException] = []
  monkeypatch.setattr(threading, "excepthook", lambda args: failed.append(args.exc_value))
  out = os.fdopen(write_end, "w")
  try:
    with progress.Watcher([shard], out=out, interactive=False, poll_s=0.02, first_log_s=0.0):
      time.sleep(0.3)  # Several log lines due: a run longer than FIRST_LOG_S, piped into `head -1`.
  finally:
    try:
      out.close()
    except BrokenPipeError:
      pass
  assert failed == [], f"the progress thread died with {failed!r} (its traceback went to stderr)"


def test_a_gzip_input_of_padding_is_decoded_a_few_mib_at_a_time(tmp_path):
  # 20,000 records of 10 KB of zeros (padded features): 200 MB decoded, about 0.2 MB compressed, one read.
  record = bytes(10_000)
  path = str(tmp_path / "pad.tfrecord.gz")
  framed = open(ft.write_tfrecords(tmp_path / "one.tfrecord", [record]), "rb").read()
  with gzip.open(path, "wb", compresslevel=6) as f:
    for _ in range(20):
      f.write(framed * 1000)
  assert os.path.getsize(path) < (1 << 20)
  tracemalloc.start()
  try:
    count = sum(1 for r in TFRecordReader(path) if r == record)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert count == 20_000
  # Was 200 MB and more: the whole 4 MiB read decoded at once, up to ~1000 times its size.
  assert peak < (100 << 20), f"peak {peak >> 20} MiB of Python memory to read {count} records of 10 KB"


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_compressed_streams_ending_at_the_decoders_output_limit_read_whole(tmp_path, kind):
  # Guard for the fix above: members and records that end exactly where a decoding step stops.
  from converter import tfrecord  # pylint: disable=g-import-not-at-top
  for n in (tfrecord._CHUNK, 2 * tfrecord._CHUNK):  # pylint: disable=protected-access
    records = [bytes(n - 16 - 21), os.urandom(5)]  # Framed: n - 21 and 21 bytes, n in all.
    raw = open(ft.write_tfrecords(tmp_path / "raw.tfrecord", records), "rb").read()
    assert len(raw) == n
    path = tmp_path / f"x{n}.tfrecord"
    path.write_bytes(gzip.compress(raw) * 2 if kind == "gzip" else zlib.compress(raw))
    expected = records * 2 if kind == "gzip" else records
    assert list(TFRecordReader(str(path), compression=kind)) == expected


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_a_cut_compressed_stream_keeps_every_whole_record_zlib_decoded(tmp_path, kind):
  # With the decoding capped per step, zlib can still hold up to one match's bytes when the input runs out; a
  # cut stream dropped them with the truncation, and the whole record ending in them (review of round 29).
  # 36,200 framed records of 116 bytes: 4.2 MB, just past one decoding step (4 MiB); one of the cuts below ends
  # the input where that step stops inside a match.
  records = [b"a" * 100] * 36_200
  raw = open(ft.write_tfrecords(tmp_path / "raw.tfrecord", records), "rb").read()
  packed = gzip.compress(raw) if kind == "gzip" else zlib.compress(raw)
  lost = []
  for cut in range(4, 49):
    path = tmp_path / f"cut{cut}.tfrecord"
    path.write_bytes(packed[:-cut])
    d = zlib.decompressobj(31 if kind == "gzip" else 15)
    decoded = d.decompress(packed[:-cut])
    whole = 0
    pos = 0
    while pos + 12 <= len(decoded):  # Records zlib alone decodes whole from the cut stream.
      n = struct.unpack_from("<Q", decoded, pos)[0]
      if pos + 12 + n + 4 > len(decoded):
        break
      whole += 1
      pos += 12 + n + 4
    reader = TFRecordReader(str(path), compression=kind, on_corrupt="skip")
    got = list(reader)
    assert got == records[:len(got)]
    if len(got) != whole:
      lost.append((cut, whole, len(got)))
  assert not lost, f"(cut, records zlib decodes whole, records read): {lost}"


_VERIFY_OUT_OF_MEMORY = textwrap.dedent("""
    import resource, sys
    from pipelines import verify

    inp, out = sys.argv[1], sys.argv[2]
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
    c = verify.check_shard(inp, out, None, "auto")
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(c.problem)
    """)


def test_verify_out_of_memory_on_an_input_record_gives_verifys_advice_not_the_conversions(tmp_path):
  # RecordMemoryError is a ConversionError: verify reported it as "unreadable input" with the conversion's
  # advice (review of round 29). The shard is not at fault; the check needs more memory.
  huge, out = str(tmp_path / "b.tfrecord"), tmp_path / "b.array_record"
  offset = _tfrecord_with_a_huge_record(huge, b"first", 4 << 30)
  with ArrayRecordShardWriter(str(out), "group_size:1") as w:
    w.write(b"first")
    w.commit()
  r = subprocess.run([sys.executable, "-c", _VERIFY_OUT_OF_MEMORY, huge, str(out)], cwd=ft.REPO, env=ft.env(),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  line = r.stdout.strip()
  assert line.startswith(f"input {huge}: record 1 at byte offset {offset} (4,294,967,296 data bytes) did not fit "
                         "in memory"), line
  assert "give arrayrecord-verify more memory" in line and "--skip-existing" not in line, line
