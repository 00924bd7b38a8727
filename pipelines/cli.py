"""Flags shared by the converter CLIs (local, Dataflow, TFDS)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Callable

from converter import ConvertOptions, ConversionError
from converter.errors import Interrupted, escape_controls, root_cause_line
from converter.tfrecord import COMPRESSIONS
from loader import reader_threads

if TYPE_CHECKING:  # The dataflow package imports this module before it can say Beam is missing.
  from apache_beam.options.pipeline_options import PipelineOptions


def add_converter_flags(parser: argparse.ArgumentParser, *, io: bool = True) -> None:
  if io:
    # nargs="+": an unquoted glob that the shell expanded into many files
    # converts them all (with "append" only the first was taken and the rest
    # went unnoticed to Beam's flags).
    parser.add_argument("--input", action="extend", nargs="+", required=True, metavar="PATTERN",
                        help="TFRecord files or globs (local or gs://); several may follow one --input, "
                        "and --input is repeatable.")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="Output directory for the ArrayRecord shards and manifest.json.")
  parser.add_argument("--writer-options", "--writer_options", dest="writer_options",
                      default="group_size:1",
                      help="ArrayRecord writer options (default: %(default)s; group_size:1 "
                      "is what random access / global shuffle needs).")
  parser.add_argument("--compression", choices=COMPRESSIONS, default="auto",
                      help="Input compression; 'auto' detects GZIP/ZLIB from the content.")
  parser.add_argument("--on-corrupt", "--on_corrupt", dest="on_corrupt",
                      choices=("fail", "skip"), default="fail",
                      help="On a corrupt record: stop (fail) or drop it and count it (skip).")
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--overwrite", action="store_true", help="Replace existing outputs.")
  group.add_argument("--skip-existing", "--skip_existing", dest="skip_existing",
                     action="store_true",
                     help="Keep existing outputs whose size and record count match (resume; records are not "
                          "re-read: arrayrecord-verify checks content).")


def check_no_tilde(path: Any, flag: str = "--output") -> None:
  """Refuses a path starting with `~` (`--output '~/data'`, quoted): only a shell expands it.

  Taken as it is, it would make a folder named `~` in the current directory,
  reported as "Output: ~/data", so the dataset would be looked for in the home
  folder (and a later `rm -rf ~`, meant for the stray folder, removes that).
  """
  if isinstance(path, str) and re.match(r"~[\w.-]*(/|\Z)", path):
    home = os.path.expanduser(path)
    instead = f"Write the path out ({home})" if home != path else "Write the path out"
    raise ValueError(f"{flag} {path!r} starts with '~', which only a shell expands (it was quoted), so it would "
                     f"make a folder named {path.split('/')[0]!r} in the current directory. {instead}, or "
                     f"./{path} for a folder of that name.")


def converter_options(args: argparse.Namespace, output_dir: str | None = None) -> ConvertOptions:
  existing = "overwrite" if args.overwrite else "skip" if args.skip_existing else "error"
  check_no_tilde(output_dir or args.output)
  return ConvertOptions(output_dir=output_dir or args.output, writer_options=args.writer_options,
                        compression=args.compression, on_corrupt=args.on_corrupt,
                        existing=existing)


def unknown_beam_flags(opts: PipelineOptions, argv: Sequence[str] = ()) -> list[str]:
  """Flags that are neither ours nor Beam's, which Beam would silently drop (typos).

  Named as typed in `argv` (Beam turns `--on-corupt` into `on_corupt`).
  """
  known = opts.get_all_options(drop_default=False)
  everything = opts.get_all_options(retain_unknown_options=True)
  typed = {a.split("=", 1)[0].lstrip("-").replace("-", "_"): a.split("=", 1)[0]
           for a in argv if isinstance(a, str) and a.startswith("--")}
  return sorted(typed.get(k, "--" + k) for k in everything if k not in known)


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser, whose "expected ... argument" error says how to pass a value starting with '-'."""

  def error(self, message: str):
    if "expected one argument" in message or "expected at least one argument" in message:
      flag = message.split(":", 1)[0].replace("argument ", "").split("/")[0]
      message += (" (a value starting with '-', such as a file named -x.tfrecord, reads as a flag: "
                  f"write {flag}=-x.tfrecord or {flag} ./-x.tfrecord)")
    super().error(message)


def printable_streams() -> None:
  """Lets stdout and stderr print any path: a character the terminal's encoding lacks shows as \\xNN.

  With PYTHONIOENCODING=ascii (or a C locale) a non-ASCII file name in a
  result line would otherwise raise UnicodeEncodeError and hide the result.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):  # Replaced by a test harness, or closed.
      pass


def say(line: str) -> None:
  """One line on stderr; nothing if there is no terminal any more (after SIGHUP)."""
  try:
    # Also for a ValueError or OSError naming a file whose name holds a newline.
    print(escape_controls(line), file=sys.stderr, flush=True)
  except (OSError, ValueError):
    pass


def fail(prog: str, message: str, code: int = 2) -> int:
  say(f"{prog}: error: {message}")
  return code


_WORKER_ERROR = re.compile(r"^(?:converter\.errors|loader\.reader_threads)\.\w+: (.+)$", re.M)


def user_error_from(exc: BaseException) -> str | None:
  """Our own error message inside a runner's wrapped exception, if there is one."""
  seen = set()
  e: BaseException | None = exc
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, ConversionError):
      return str(e)
    e = e.__cause__ or e.__context__
  text = str(exc)
  # A worker process's error reaches us as its traceback text; its last line
  # of ours reads "converter.errors.XxxError: <message>".
  ours = _WORKER_ERROR.findall(text)
  if ours:
    return ours[-1].split(" [while running")[0].strip()
  for marker in (" is corrupt: ", " output file(s) already exist", "No files match the input pattern"):
    i = text.find(marker)
    if i >= 0:
      # Runners wrap the message in their own text; cut out our sentence.
      start = text.rfind("\n", 0, i) + 1
      for prefix in ("CorruptRecordError: ", "OutputExistsError: ", "NoInputFilesError: "):
        j = text.find(prefix, start, i)
        if j >= 0:
          start = j + len(prefix)
      end = text.find("\n", i)
      line = text[start:end if end >= 0 else None]
      return line.split(" [while running")[0].strip()
  return None


def run_reporting_errors(prog: str, run: Callable[[], Any], output_flag: str = "--output") -> tuple[Any, int | None]:
  """Runs a conversion; our errors become one line on stderr and an exit code.

  `output_flag`: this CLI's name for the output folder's flag (arrayrecord-tfds:
  --out_dir), which the converter's messages call --output.

  Returns:
    (result, None) on success, or (None, exit code): 2 for bad arguments or
    inputs found before the run, 1 for a run that failed on bad data.
  """
  def report(message: str, code: int) -> int:
    if output_flag != "--output":
      message = re.sub(r"--output\b", output_flag, message)
    return fail(prog, message, code=code)

  printable_streams()
  # Beam would log each error with a traceback before we print our line.
  logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
  try:
    return run(), None
  except Interrupted as e:
    say(f"{prog}: {e}")
    return None, e.exit_code
  except KeyboardInterrupt:
    say(f"{prog}: interrupted; rerun with --skip-existing to resume")
    return None, Interrupted.exit_code
  except (ConversionError, ValueError, TypeError) as e:
    # Found while converting (corrupt record, disk full): a failed run (1), not a usage error (2).
    code = getattr(e, "exit_code", 2)
    return None, report(str(e).split(" [while running")[0], code)
  except reader_threads.ReaderThreadsError as e:  # This process's limits: a failed run, not a usage error.
    return None, report(str(e), 1)
  except Exception as e:  # pylint: disable=broad-except
    gone = getattr(sys.stdout, "reader_gone", None)
    if gone is not None and gone in (e, e.__cause__, e.__context__):
      # Our own output's reader went away (`... | head -1`): the console script stops quietly (exit 141), as
      # after the summary; this was "Broken pipe (the storage server could not be reached ...)", exit 1.
      raise
    # The runner's own failure: its root cause in one line, not a Beam traceback.
    msg = user_error_from(e) or root_cause_line(e)
    if _lost_connection(e) or re.search(r"Connection(Refused|Reset|Aborted)?Error|Connection refused", msg):
      msg += (" (the storage server could not be reached; shards finished before are kept: when it is "
              "reachable again, rerun with --skip-existing)")
    return None, report(msg.split(" [while running")[0], 1)


def _lost_connection(e: BaseException) -> bool:
  """Whether a failure's cause chain holds a connection error (gs:// unreachable, say)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, ConnectionError) or type(e).__name__ in ("ServiceUnavailable", "RetryError"):
      return True
    e = e.__cause__ or e.__context__
  return False


@contextlib.contextmanager
def worker_stderr_held_back(worker_processes: int | None) -> Iterator[None]:
  """Holds back what worker processes write to stderr until the run ends.

  Beam's SDK worker processes inherit our stderr and print every failed
  bundle's traceback there (~60 lines) before the run fails; we then print
  the cause in one line. Their stderr goes to an unlinked temporary file
  instead, replayed at the end unless the run failed with one of our own
  errors (or was interrupted), which the one line already says. Our own
  messages still go straight to the terminal.
  """
  if not worker_processes or worker_processes <= 1:
    yield
    return
  previous = sys.stderr
  previous.flush()
  try:
    on_fd2 = previous.fileno() == 2
  except (AttributeError, OSError, ValueError):  # Replaced by the caller (a test's capture, say).
    on_fd2 = False
  held = tempfile.TemporaryFile()
  terminal = os.dup(2)
  os.dup2(held.fileno(), 2)
  if on_fd2:
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1, encoding=previous.encoding or "utf-8",
                           errors="backslashreplace")
  replay = True
  try:
    yield
  except KeyboardInterrupt:
    replay = False
    raise
  except Exception as e:  # pylint: disable=broad-except
    replay = user_error_from(e) is None  # Ours (ConversionError included): its one line says it all.
    raise
  finally:
    if on_fd2:
      sys.stderr.close()
      sys.stderr = previous
    os.dup2(terminal, 2)
    os.close(terminal)
    with held:
      if replay:
        held.seek(0)
        text = held.read()
        if text:
          previous.flush()
          os.write(2, text)


@contextlib.contextmanager
def signals_raise(error: Callable[[int], BaseException]) -> Iterator[None]:
  """Within: SIGTERM (`kill`, `timeout`) and SIGHUP raise `error(signum)`, so the run unwinds as on Ctrl-C.

  Left as they are off the main thread, and where the caller ignores them
  (nohup) or set its own handler.
  """
  old = {}
  if threading.current_thread() is threading.main_thread():
    def on_signal(signum, frame):
      del frame
      raise error(signum)
    for signum in (signal.SIGTERM, signal.SIGHUP):
      if signal.getsignal(signum) is signal.SIG_DFL:
        old[signum] = signal.signal(signum, on_signal)
  try:
    yield
  finally:
    for signum, handler in old.items():
      signal.signal(signum, handler)
