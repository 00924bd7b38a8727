"""The console scripts: check that Apache Beam is installed, then run the CLI.

`pip install arrayrecord-toolkit` is the lean install for training code
(`import loader`); the converter needs Beam, which comes with an extra. This
module uses only the standard library, so a missing extra is reported in one
line naming the command to run instead of a ModuleNotFoundError traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Sequence

PACKAGE = "arrayrecord-toolkit"
# Console script -> (module with main(), extra it needs, modules that extra provides).
SCRIPTS = {
    "arrayrecord-convert": ("pipelines.convert", "beam", ("apache_beam",)),
    "arrayrecord-verify": ("pipelines.verify", "beam", ("apache_beam",)),
    "arrayrecord-tfds": ("pipelines.tfds_convert", "beam", ("apache_beam",)),
    # DataflowRunner needs Beam's Google Cloud clients as well.
    "arrayrecord-dataflow": ("dataflow.submit", "gcp",
                             ("apache_beam", "google.cloud.storage", "google.auth")),
}


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # A parent package is missing.
    return False


def missing_extra(script: str) -> str | None:
  """The one-line error for a script whose extra is not installed, else None."""
  _, extra, modules = SCRIPTS[script]
  absent = [m for m in modules if not _installed(m)]
  if not absent:
    return None
  what = "Apache Beam" if "apache_beam" in absent else f"Beam's Google Cloud clients ({absent[0]})"
  return (f"{script}: error: {what} is not installed; this command needs the [{extra}] extra: "
          f"pip install '{PACKAGE}[{extra}]' (or, in a checkout, pip install -e '.[{extra}]').")


def exit_if_extra_missing(module: str) -> None:
  """For `python -m <module>` (called before its heavy imports): the script's one line and exit 2."""
  for script, (main_module, _, _) in SCRIPTS.items():
    error = missing_extra(script) if main_module == module else None
    if error:
      print(error, file=sys.stderr)
      raise SystemExit(2)


def run_as_script(spec: Any) -> None:
  """For `python -m <module>`, called before its heavy imports: runs it as its console script, then exits.

  So `python -m pipelines.convert` and `arrayrecord-convert` behave alike: a
  missing extra, or Ctrl-C while Beam is being imported, is one line, not a
  traceback. A module run by file path (no spec) goes on as a plain script.
  """
  module = getattr(spec, "name", None)
  for script, (main_module, _, _) in SCRIPTS.items():
    if main_module == module:
      raise SystemExit(run(script))


def _open_closed_std_streams() -> None:
  """Gives a closed standard stream (`>&-`, `2>&-`, a daemon's) /dev/null.

  Python leaves sys.stdout None then, and the first print of a run failed
  after its work ("AttributeError: 'NoneType' object has no attribute
  'write'", with a traceback); and the first file the run opened would get
  descriptor 1 or 2, into which anything written to the stream (a worker
  process's output, a library's message) would go.
  """
  for fd in (0, 1, 2):
    try:
      os.fstat(fd)
    except OSError:
      null = os.open(os.devnull, os.O_RDWR)
      if null != fd:
        os.dup2(null, fd)
        os.close(null)
  if sys.stdout is None:
    sys.stdout = open(1, "w", closefd=False)  # pylint: disable=consider-using-with
  if sys.stderr is None:
    sys.stderr = open(2, "w", closefd=False)  # pylint: disable=consider-using-with


def run(script: str, argv: Sequence[str] | None = None) -> int:
  """Runs a console script's main(argv); exit code 2 when its extra is missing."""
  _open_closed_std_streams()
  try:
    exit_if_extra_missing(SCRIPTS[script][0])
  except SystemExit as e:
    return e.code
  try:
    module = importlib.import_module(SCRIPTS[script][0])
  except KeyboardInterrupt:
    # Ctrl-C while Beam (or TensorFlow) is still being imported: before any work.
    print(f"{script}: interrupted while starting; nothing was changed", file=sys.stderr)
    return 130
  out = sys.stdout = _Stdout(sys.stdout)
  try:
    code = module.main(argv)
    out.flush()
    if out.error is not None:
      what = "check" if script == "arrayrecord-verify" else "run"
      ended = "succeeded" if code == 0 else f"ended with exit status {code}"
      print(f"{script}: error: could not write to standard output ({out.error}), so what it printed after "
            f"that is lost; the {what} itself went on to the end and {ended}. "
            f"{_LOST_OUTPUT_HINT.get(script, '')}".rstrip(), file=sys.stderr)
      return code or 1
    return code
  except KeyboardInterrupt:
    # main() reports an interrupted run itself; this is Ctrl-C outside of one.
    print(f"{script}: interrupted", file=sys.stderr)
    return 130
  except BrokenPipeError:
    # The reader of our output went away (`... | head`): stop quietly, as
    # Unix tools do, instead of a traceback; nothing is left half-written.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141
  finally:
    if sys.stdout is out:  # Called in-process (tests): the caller's stream back.
      sys.stdout = out._stream  # pylint: disable=protected-access


_LOST_OUTPUT_HINT = {
    "arrayrecord-convert": "Its manifest.json records the result: arrayrecord-verify shows it.",
    "arrayrecord-tfds": "Its manifest.json records the result: arrayrecord-verify shows it.",
    "arrayrecord-verify": "Send standard output where there is room and rerun it to see the report.",
}


class _Stdout:
  """sys.stdout that outlives a failed write: `> log` on a full disk (or /dev/full, a lost NFS mount).

  Python would raise OSError from the first print ("Converting ..."), and the
  run would fail before any work naming only "No space left on device", which
  reads as the output's disk; or, from the summary's print, a traceback after
  a finished run. Its output is informational: the run goes on without it and
  says once at the end, on stderr, that it was lost. A reader gone away
  (BrokenPipeError, `| head`) is still raised, as run() handles it.
  """

  def __init__(self, stream: Any):
    self._stream = stream
    self.error: OSError | None = None
    # The BrokenPipeError our own reader's going raised: cli.run_reporting_errors lets that one (and only that
    # one: a storage upload's broken pipe is still reported) through to run().
    self.reader_gone: BrokenPipeError | None = None

  def _lost(self, e: OSError) -> None:
    self.error = e
    try:  # What is still buffered would fail again when Python flushes it at exit.
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, self._stream.fileno())
      os.close(devnull)
    except (OSError, ValueError, AttributeError):
      pass

  def write(self, text: str) -> int:
    if self.error is None:
      try:
        return self._stream.write(text)
      except BrokenPipeError as e:
        self.reader_gone = e
        raise
      except OSError as e:
        self._lost(e)
    return len(text)

  def flush(self) -> None:
    if self.error is None:
      try:
        self._stream.flush()
      except BrokenPipeError as e:
        self.reader_gone = e
        raise
      except OSError as e:
        self._lost(e)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stream, name)


def convert() -> int:
  return run("arrayrecord-convert")


def verify() -> int:
  return run("arrayrecord-verify")


def tfds() -> int:
  return run("arrayrecord-tfds")


def dataflow() -> int:
  return run("arrayrecord-dataflow")
