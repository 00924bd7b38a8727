"""Convert TFRecord shards to matched ArrayRecord shards.

  python -m pipelines.convert --input 'data/train.tfrecord-*' --output out/ \
      [--writer-options group_size:1] [--compression auto] [--on-corrupt fail] \
      [--overwrite | --skip-existing] [Beam flags, e.g. --direct_num_workers 2 \
      --direct_running_mode multi_processing]
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

if __name__ == "__main__":  # `python -m`: run as the console script (a missing extra, Ctrl-C at start-up: one line).
  from pipelines import entry_points  # pylint: disable=g-import-not-at-top
  entry_points.run_as_script(__spec__)


from converter import expand_patterns, read_manifest
from converter.guard import ConversionGuard
from converter.errors import escape_controls
from pipelines import build, cli, local_run, workers

PROG = "arrayrecord-convert"


def _parser() -> argparse.ArgumentParser:
  p = cli.ArgumentParser(
      prog=PROG, description="Convert TFRecord shards to matched ArrayRecord shards "
      "with Apache Beam (DirectRunner unless --runner says otherwise). Unknown flags "
      "go to Beam.")
  cli.add_converter_flags(p)
  workers.add_flag(p)
  p.add_argument("--quiet", action="store_true",
                 help="Print only the summary (no progress line).")
  return p


def summarize(manifest: dict, seconds: float, output_dir: str) -> str:
  t = manifest["totals"]
  mb_in = t["bytes_in"] / 1e6
  # The rate counts only what this run read, not shards kept from an earlier run.
  mb_read = sum(s.get("bytes_in") or 0 for s in manifest["shards"]
                if s["status"] == "converted") / 1e6
  lines = [
      f"Converted {t['converted']} file(s), kept {t['existing']} existing, failed {t['failed']}: "
      f"{t['records']:,} records, {mb_in:.1f} MB in, {t['bytes_out'] / 1e6:.1f} MB out "
      f"in {seconds:.1f} s ({mb_read / max(seconds, 1e-9):.1f} MB/s).",
  ]
  trusted = sum(s.get("digest_from") == "manifest" for s in manifest["shards"] if s["status"] == "existing")
  if trusted:
    # Kept shards are not re-read (that would cost a conversion's reading
    # time); damage done to them since the last run shows only on a re-read.
    lines.append(f"Kept {trusted} shard(s) as the earlier manifest describes them (size and record count "
                 f"checked, records not re-read); arrayrecord-verify re-reads them.")
  if t["corrupt_records_skipped"]:
    # A damaged stretch is skipped whole: how many records it held is unknown.
    lines.append(f"Skipped {t['corrupt_records_skipped']} corrupt record(s) (a damaged stretch of "
                 "several records counts once); see the manifest.")
  cut = [s["input"] for s in manifest["shards"] if s.get("input_truncated")]
  if cut:
    shown = ", ".join(cut[:3]) + (f" and {len(cut) - 3} more" if len(cut) > 3 else "")
    lines.append(f"{len(cut)} input(s) end early (truncated, or damaged to the end): their records after "
                 f"the damage are lost: {shown}. Re-download them and rerun with --overwrite to convert "
                 "them whole.")
  for s in manifest["shards"]:
    if s["status"] == "failed":
      lines.append(f"FAILED {s['input']}: {s['error']}")
  if manifest.get("_workers"):
    lines.append(manifest["_workers"])
  lines.append(f"Output: {output_dir} (manifest: {output_dir.rstrip('/')}/manifest.json)")
  # One line each, also where an input's name holds a newline.
  return "\n".join(escape_controls(line) for line in lines)


def run(argv: Sequence[str] | None = None) -> dict:
  """Runs the conversion; returns the manifest. Raises on bad input."""
  args, beam_args = _parser().parse_known_args(argv)
  opts = build.pipeline_options(beam_args)
  unknown = cli.unknown_beam_flags(opts, beam_args)
  if unknown:
    raise ValueError(f"Unknown flag(s) {', '.join(unknown)}: neither a converter flag "
                     "(see --help) nor a Beam pipeline option.")
  options = cli.converter_options(args)
  files = expand_patterns(args.input, skip_under=args.output)
  guard = ConversionGuard(files, options)  # Checks, locks the output dir, plans: before any work.
  todo = sum(p.action == "convert" for p in guard.plans)
  seconds, local = local_run.run(
      guard, args, beam_args,
      lambda runner, mode: (f"Converting {todo} of {len(guard.plans)} file(s) to {options.output_dir} "
                            f"(writer options {options.writer_options!r}, runner {runner}, {mode})..."),
      lambda p: build.add_conversion(p, options, files=files))
  manifest = read_manifest(options.output_dir)
  manifest["_seconds"] = seconds
  manifest["_workers"] = local.summary
  return manifest


def main(argv: Sequence[str] | None = None) -> int:
  manifest, code = cli.run_reporting_errors(PROG, lambda: run(argv))
  if code is not None:
    return code
  seconds = manifest.pop("_seconds")
  print(summarize(manifest, seconds, manifest["output_dir"]))
  return 1 if manifest["totals"]["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
