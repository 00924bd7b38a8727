"""Re-read TFRecord inputs and their ArrayRecord outputs; compare counts and digests.

  python -m pipelines.verify --input 'data/train.tfrecord-*' --output out/

Exits non-zero if any shard is missing, differs, or disagrees with the manifest.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import re
import signal
import sys
from typing import Any, Sequence

if __name__ == "__main__":  # `python -m`: run as the console script (a missing extra, Ctrl-C at start-up: one line).
  from pipelines import entry_points  # pylint: disable=g-import-not-at-top
  entry_points.run_as_script(__spec__)

from converter import (ConversionError, RecordDigest, TFRecordReader, common_dir, expand_patterns,
                       output_path, read_manifest)
from converter import writer as _writer
from converter.errors import CorruptRecordError, RecordMemoryError, escape_controls
from converter.manifest import READ_BLOCK, ManifestError, array_record_digest, manifest_path
from loader import ondisk
from loader import reader_threads
from pipelines import cli

PROG = "arrayrecord-verify"

__all__ = ["ShardCheck", "array_record_digest", "check_manifest", "check_shard", "coverage_notes", "main",
           "stray_outputs", "tfrecord_digest", "unchecked_shards", "verify"]


@dataclasses.dataclass
class ShardCheck:
  input: str
  output: str
  input_records: int | None = None
  output_records: int | None = None
  input_digest: str | None = None
  output_digest: str | None = None
  problem: str | None = None

  @property
  def ok(self) -> bool:
    return self.problem is None


def tfrecord_digest(path: str, compression: str = "auto",
                    on_corrupt: str = "fail") -> tuple[int, str]:
  digest = RecordDigest()
  digest.update_many(TFRecordReader(path, compression=compression, on_corrupt=on_corrupt))
  return digest.records, digest.hexdigest()


def _corrupt_input(e: CorruptRecordError, expected: dict | None, on_corrupt: str) -> str:
  """What a corrupt input record means when its output exists, and what to run."""
  where = (f"input {e.path}: record {e.record_index} at byte offset {e.offset} is corrupt "
           f"({e.reason})")
  if on_corrupt == "skip":
    return f"unreadable: {where}, even skipping corrupt records"
  skipped = (expected or {}).get("corrupt_records_skipped")
  if skipped:
    return (f"{where}; the manifest records {skipped} corrupt record(s) skipped when it was converted: "
            "rerun arrayrecord-verify with --on-corrupt skip to compare the records that were kept")
  if expected is not None and skipped == 0:
    return (f"{where}; the manifest records no corrupt record when it was converted, so the input "
            "changed or was damaged since: the output may be the only good copy; keep it, and "
            "re-create or re-download the input")
  return (f"{where}; its output exists, so it was probably converted with --on-corrupt skip: rerun "
          "arrayrecord-verify with --on-corrupt skip to compare the records that were kept")


_CONVERT = "the conversion"  # What check_shard's advice reruns unless told the command.
_SHOWN = 3  # Unchecked manifest shards named in full.


def _redo(out: str, convert: str) -> str:
  """How to replace one damaged output: --skip-existing keeps a same-size file, so it goes first."""
  return (f"delete {out} and rerun {convert} with --skip-existing to convert it again (or rerun with "
          "--overwrite to convert everything again)")


def _byte_offset(error: str) -> int | None:
  """The byte offset array_record's error names ("...; at byte 50576"), if any."""
  found = re.findall(r"\bat byte (\d+)", error)
  return int(found[-1]) if found else None


def _first_unreadable_record(path: str) -> tuple[int, int] | None:
  """(index, record count) of the first record of a local ArrayRecord file that cannot be read.

  None where no record can be read at all (a footer cut off or garbage: the
  reader then counts 0 records) or for a remote file.
  """
  if not ondisk.is_local(path):
    return None
  ArrayRecordReader = reader_threads.reader_class(path)  # pylint: disable=invalid-name
  try:
    reader = ArrayRecordReader(path, "readahead_buffer_size:0")
  except (OSError, RuntimeError, ValueError):
    return None
  try:
    n = reader.num_records()
    for start in range(0, n, READ_BLOCK):
      try:
        reader.read(start, min(n, start + READ_BLOCK))
        continue
      except RuntimeError:
        pass
      for i in range(start, min(n, start + READ_BLOCK)):
        try:
          reader.read(i, i + 1)
        except RuntimeError:
          return i, n
    return None
  finally:
    with contextlib.suppress(RuntimeError):  # The reader's status: the damage we already know.
      reader.close()


def _unreadable_output(out: str, e: Exception, convert: str) -> str:
  reason = ondisk.one_line(e)
  offset = _byte_offset(reason)
  at = f", damaged at byte offset {offset}" if offset is not None else ""
  bad = _first_unreadable_record(out)
  where = (f"record {bad[0]} of {bad[1]} cannot be read{at}" if bad is not None
           else f"no record can be read (its index is damaged or the file is cut short){at}")
  said = f" (array_record: {reason})" if reason else ""  # A file cut at a block boundary: no message.
  return f"unreadable output: {where}{said}: {_redo(out, convert)}"


def _first_difference(inp: str, out: str, compression: str, on_corrupt: str) -> int | None:
  """Index of the first record where a local output and its input differ.

  Where one holds the other's records and more, that is the shorter one's
  count. None if they are the same or cannot be re-read (a remote output).
  """
  if not ondisk.is_local(out):
    return None
  ArrayRecordReader = reader_threads.reader_class(out)  # pylint: disable=invalid-name
  try:
    records = iter(TFRecordReader(inp, compression=compression, on_corrupt=on_corrupt))
    reader = ArrayRecordReader(out, "readahead_buffer_size:0")
    try:
      n = reader.num_records()
      for start in range(0, n, READ_BLOCK):
        for i, got in enumerate(reader.read(start, min(n, start + READ_BLOCK)), start):
          if next(records, None) != got:
            return i
    finally:
      reader.close()
    return n if next(records, None) is not None else None
  except (ConversionError, OSError, RuntimeError, ValueError):  # Changed since it was digested.
    return None


def _differs(c: ShardCheck, expected: dict | None, first: int | None, convert: str) -> str:
  """Why an output differs from its input, from which record, and which side changed."""
  if c.input_records != c.output_records:
    what = f"record count differs: input {c.input_records}, output {c.output_records}"
    if first is not None:
      shorter = "output" if c.output_records < c.input_records else "input"
      what += f"; the first record that differs is record {first}" + (
          f", which the {shorter} does not have (the records before it agree)"
          if first == min(c.input_records, c.output_records) else "")
  else:
    what = "content differs (same count, different records or order)"
    if first is not None:
      what += f"; the first record that differs is record {first}"
  digest = (expected or {}).get("digest")
  if digest is not None and digest == c.output_digest and expected.get("records") == c.output_records:
    return (f"{what}; {c.output} still matches the manifest's digest, so the input {c.input} changed "
            f"since it was converted: if the input is right now, {_redo(c.output, convert)}; if not, keep "
            "the output, it is the good copy")
  if digest is not None:
    what += f"; {c.output} no longer matches the manifest's digest either, so the output changed"
  return f"{what}: {_redo(c.output, convert)}"


def check_shard(inp: str, out: str, expected: dict | None, compression: str,
                on_corrupt: str = "fail", convert: str = _CONVERT) -> ShardCheck:
  """Compares one input with its output and the manifest's entry for it.

  `convert` is the command the advice reruns (default: "the conversion").
  """
  c = ShardCheck(input=inp, output=out)
  problem = ondisk.file_problem(out) if _writer.is_local(out) else None
  if problem is not None and problem.kind != "missing":  # A FIFO would block the reader for ever.
    c.problem = f"output {out} {problem.what}; move it away and rerun {convert} with --skip-existing to write the shard"
    return c
  if not _writer.exists(out):
    c.problem = f"output missing: rerun {convert} with --skip-existing to convert it"
    return c
  try:
    c.input_records, c.input_digest = tfrecord_digest(inp, compression, on_corrupt)
  except RecordMemoryError as e:  # Not the shard's fault: say so, and what to give this check.
    c.problem = (f"input {ondisk.one_line(e.what)}: this shard was not checked; give arrayrecord-verify more "
                 "memory (raise `ulimit -v` or the container's memory limit) and run it again")
    return c
  except CorruptRecordError as e:
    c.problem = ondisk.one_line(_corrupt_input(e, expected, on_corrupt))
    return c
  except (ConversionError, OSError, RuntimeError, ValueError) as e:
    c.problem = f"unreadable input: {ondisk.one_line(e)}"
    return c
  try:
    c.output_records, c.output_digest = array_record_digest(out)
  except (ConversionError, OSError, RuntimeError, ValueError) as e:
    c.problem = _unreadable_output(out, e, convert)
    return c
  if c.input_records != c.output_records or c.input_digest != c.output_digest:
    c.problem = _differs(c, expected, _first_difference(inp, out, compression, on_corrupt), convert)
  elif expected is not None and expected.get("status") == "failed":
    c.problem = ("the manifest lists this shard as failed, yet the file is complete; rerun "
                 f"{convert} with --skip-existing to update the manifest")
  elif expected is not None and expected.get("records") != c.output_records:
    c.problem = (f"the manifest says {expected.get('records')!r} records, the file has "
                 f"{c.output_records} (as many as its input): rerun {convert} with --skip-existing "
                 "to rewrite the manifest from the file")
  elif expected is not None and expected.get("digest") not in (None, c.output_digest):
    c.problem = (f"output differs from the manifest's digest ({expected.get('digest')}, the file's is "
                 f"{c.output_digest}) though it matches its input {inp}: the manifest was edited, or input "
                 f"and output both changed since; {_redo(out, convert)}")
  return c


def _manifest_outputs(manifest: dict) -> dict[str, tuple[str, dict]]:
  """{input: (its output, manifest entry)}; read_manifest resolved the paths."""
  return {s["input"]: (s["output"], s) for s in manifest.get("shards", []) if s.get("input")}


def check_manifest(manifest: dict[str, Any], output_dir: str) -> list[str]:
  """Problems of the manifest itself: totals that disagree with its shards."""
  path = manifest_path(output_dir)
  shards = manifest.get("shards", [])
  totals = manifest.get("totals")
  if not isinstance(totals, dict):
    return []  # A hand-written manifest may list shards only.
  problems = []
  ok = [s for s in shards if s.get("status") != "failed"]
  sums = {"shards": len(shards), "records": sum(s.get("records") or 0 for s in ok),
          "bytes_out": sum(s.get("bytes_out") or 0 for s in ok)}
  for key, value in sums.items():
    if key in totals and totals[key] != value:
      problems.append(f"{path}: totals.{key} is {totals[key]!r} but its shards add up to "
                      f"{value}; rerun the conversion with --skip-existing to rewrite it")
  return problems


def verify(patterns: Sequence[str], output_dir: str, compression: str = "auto",
           on_corrupt: str = "fail",
           suffix: str = "array_record", workers: int | None = None) -> list[ShardCheck]:
  """Checks every input against its output; returns one ShardCheck per shard."""
  inputs = expand_patterns(patterns, skip_under=output_dir)
  root = common_dir(inputs)
  manifest = read_manifest(output_dir)
  known = {ondisk.absolute(i): entry for i, entry in _manifest_outputs(manifest or {}).items()}
  # The manifest knows where each input went, which naming alone cannot tell
  # when only some of the converted patterns are checked (another common dir).
  outputs = [known[ondisk.absolute(i)][0] if ondisk.absolute(i) in known else output_path(i, root, output_dir, suffix)
             for i in inputs]
  expected = {ondisk.absolute(o): s for o, s in known.values()}
  listed = {ondisk.absolute(s["output"]) for s in (manifest or {}).get("shards", [])}
  path = manifest_path(output_dir)

  def check(io: tuple[str, str]) -> ShardCheck:
    inp, out = io
    if manifest is not None and ondisk.absolute(out) not in listed and not _writer.exists(out):
      return ShardCheck(input=inp, output=out, problem=(
          f"output missing and not listed in {path}: this input was not converted into {output_dir} (an input "
          "added since, or an --input that matches more than the conversion's?); convert it with "
          "arrayrecord-convert --skip-existing, or leave it out of --input"))
    if manifest is not None and ondisk.absolute(out) not in listed:
      # Readers of the directory go by the manifest: this shard is not in the dataset.
      return ShardCheck(input=inp, output=out, problem=(
          f"not listed in {path}, so readers of the dataset leave it out (input {inp}); rerun the "
          "conversion with --skip-existing to rewrite the manifest"))
    c = check_shard(inp, out, expected.get(ondisk.absolute(out)), compression, on_corrupt,
                    convert="arrayrecord-convert")
    if c.problem and _outside(out, output_dir):
      # Not this tool's file to delete or rewrite: the manifest entry is what is wrong.
      reason = c.problem.split(":")[0]
      c.problem = (f"{reason}; {path} lists it outside the dataset folder {output_dir} (an edited manifest?): "
                   "fix that entry, or rerun the conversion with --overwrite to write the shard in the folder "
                   "(this file is left alone)")
    return c
  # Reading releases the GIL in the ArrayRecord reader and crc32c.
  with concurrent.futures.ThreadPoolExecutor(workers or min(8, os.cpu_count() or 1)) as pool:
    return list(pool.map(check, zip(inputs, outputs)))


def _outside(path: str, directory: str) -> bool:
  """Whether a local `path` lies outside the local `directory`."""
  if not (ondisk.is_local(path) and ondisk.is_local(directory)):
    return False
  a, d = os.path.realpath(path), os.path.realpath(directory)
  return os.path.commonpath([a, d]) != d


def stray_outputs(output_dir: str, checks: Sequence[ShardCheck], suffix: str = "array_record") -> list[str]:
  """ArrayRecord files in a local output folder that neither the manifest nor the checked inputs account for.

  The dataset (its manifest) leaves them out, but a reader given a wildcard
  over the folder reads them too.
  """
  manifest = read_manifest(output_dir) if ondisk.is_local(output_dir) else None
  if manifest is None:
    return []  # Without a manifest, other inputs' outputs cannot be told from strays.
  known = {ondisk.absolute(s["output"]) for s in manifest.get("shards", []) if isinstance(s.get("output"), str)}
  known.update(ondisk.absolute(c.output) for c in checks)
  strays = []
  for root, dirs, files in os.walk(output_dir):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    strays.extend(path for name in sorted(files) if f".{suffix}" in name and not name.startswith(".")
                  and ondisk.absolute(path := os.path.join(root, name)) not in known)
  return strays


def unchecked_shards(manifest: dict[str, Any] | None, checks: Sequence[ShardCheck]) -> list[dict[str, Any]]:
  """The manifest's shards that no check covered: no --input matched their inputs (or those are gone)."""
  checked = {ondisk.absolute(c.output) for c in checks}
  return [s for s in (manifest or {}).get("shards", [])
          if isinstance(s.get("output"), str) and ondisk.absolute(s["output"]) not in checked]


def _unchecked_entry(shard: dict[str, Any]) -> str:
  inp = shard.get("input")
  if not isinstance(inp, str):
    return f"{shard['output']} (the manifest names no input)"
  gone = ondisk.is_local(inp) and not os.path.lexists(inp)
  return f"{shard['output']} (input {inp}{', which no longer exists' if gone else ''})"


def coverage_notes(output_dir: str, manifest: dict[str, Any] | None, checks: Sequence[ShardCheck]) -> list[str]:
  """What the check did not cover: the whole manifest (there is none), or the shards of inputs not given."""
  if manifest is None:
    return [f"no manifest.json in {output_dir}: compared each input with the output its name maps to only "
            "(no manifest counts or digests to check, no stray files to find; a reader of the folder takes "
            "every ArrayRecord file in it)"]
  left = unchecked_shards(manifest, checks)
  if not left:
    return []
  shown = ", ".join(_unchecked_entry(s) for s in left[:_SHOWN])
  more = f" and {len(left) - _SHOWN} more" if len(left) > _SHOWN else ""
  return [f"{len(left)} of {len(manifest.get('shards', []))} shard(s) in {manifest_path(output_dir)} left "
          f"unchecked, as no --input matched their inputs: {shown}{more}; give their inputs to check them"]


class _Stopped(Exception):
  """SIGTERM (`kill`, `timeout`) or SIGHUP (a closed terminal) while checking."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.name, self.code = signal.Signals(signum).name, 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
  cli.printable_streams()
  p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=(
      "arrayrecord-convert --skip-existing keeps an existing shard whose size and record count match its "
      "manifest without re-reading its records; this command re-reads them."))
  p.add_argument("--input", action="extend", nargs="+", required=True, metavar="PATTERN")
  p.add_argument("--output", required=True, metavar="DIR")
  p.add_argument("--compression", default="auto", choices=("auto", "gzip", "zlib", "none"))
  p.add_argument("--on-corrupt", "--on_corrupt", dest="on_corrupt", default="fail",
                 choices=("fail", "skip"),
                 help="Use 'skip' for outputs converted with --on-corrupt skip: the "
                 "inputs are then re-read skipping the same damaged records.")
  args = p.parse_args(argv)
  if ondisk.is_local(args.output) and not os.path.isdir(args.output):
    what = "is a file, not a directory" if os.path.exists(args.output) else "does not exist"
    if args.output != args.output.strip() and os.path.isdir(args.output.strip()):
      # A pasted or YAML-block value with its line break: the folder without it is there.
      return cli.fail(PROG, f"--output {ondisk.shown(args.output)} {what}: it has a space or line break at an "
                            f"end; strip it (--output {args.output.strip()!r}).")
    return cli.fail(PROG, f"--output {args.output} {what}: give the directory the conversion wrote "
                          "(arrayrecord-convert --output).")
  try:
    with cli.signals_raise(_Stopped):
      checks = verify(args.input, args.output, args.compression, args.on_corrupt)
      manifest = read_manifest(args.output)
      manifest_problems = check_manifest(manifest or {}, args.output)
      strays = stray_outputs(args.output, checks)
      notes = coverage_notes(args.output, manifest, checks)
  except ManifestError as e:
    return cli.fail(PROG, str(e), code=1)  # The dataset is broken, not the command line.
  except KeyboardInterrupt:
    cli.say(f"{PROG}: interrupted; nothing was changed, rerun to check again")
    return 130
  except _Stopped as e:
    cli.say(f"{PROG}: stopped by {e.name}; nothing was changed, rerun to check again")
    return e.code
  except (ConversionError, ValueError) as e:
    return cli.fail(PROG, str(e))
  except reader_threads.ReaderThreadsError as e:  # This process's limits, not the data: nothing was checked.
    return cli.fail(PROG, str(e), code=1)
  bad = [c for c in checks if not c.ok]
  for c in checks:
    status = "OK  " if c.ok else "FAIL"
    # A newline in a shard's name would split its line (and the problem's joining of a library's
    # lines would cut the name): its paths are shown escaped first.
    problem = str(c.problem or c.output_digest)
    for path in {c.input, c.output}:
      problem = problem.replace(path, escape_controls(path)) if path else problem
    print(f"{status} {escape_controls(c.output)}  records={c.output_records}  {ondisk.one_line(problem)}")
  for problem in manifest_problems:
    print(escape_controls(f"FAIL {problem}"))
  for path in strays:
    print(f"WARN {escape_controls(path)}: not in the manifest and converted from none of the inputs; the dataset leaves it "
          "out, but a wildcard over the folder reads it: remove it if it is not yours")
  for note in notes:
    print(escape_controls(f"NOTE {note}"))
  total = sum(c.output_records or 0 for c in checks)
  print(f"{len(checks) - len(bad)}/{len(checks)} shard(s) match ({total:,} records).")
  return 1 if bad or manifest_problems else 0


if __name__ == "__main__":
  sys.exit(main())
