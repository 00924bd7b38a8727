"""Test helpers: a local GCS emulator for gs:// paths, and a guard against the network.

The emulator is `gcp-storage-emulator` (PyPI) in a subprocess on 127.0.0.1.
google-cloud-storage sends every request to STORAGE_EMULATOR_HOST when it is
set, and Beam's GCS filesystem (apache_beam/io/gcp/gcsio.py) builds its
client with google-cloud-storage, so Beam's gs:// reads, writes, globs and
renames all go to the emulator.

Credentials: Beam asks google.auth.default() for credentials (with 4 retries,
about 25 s per process) before making a client. `emulator_env` points
GOOGLE_APPLICATION_CREDENTIALS at a throwaway authorized-user file whose
access token never expires, so google-auth returns at once and never
refreshes; the emulator ignores the token. NO_GCE_CHECK stops google-auth
from probing the GCE metadata server.

The network guard refuses every connection and name lookup that is not
loopback, at once, so a test that would reach the internet fails fast and
says where instead of hanging. `guard_sitecustomize` installs the same guard
in subprocesses (CLI runs, Beam's multi-processing workers) via PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

PROJECT = "test-project"
BUCKET = "test-bucket"
# Beam 2.77's DirectRunner first tries the Prism runner, which downloads its
# binary from github.com; refused, DirectRunner falls back to its in-process
# FnApiRunner. Any other refused lookup or connection fails a test.
EXPECTED_REFUSALS = ("lookup github.com",)

# Kept as source so subprocesses can run it from a sitecustomize.py.
_GUARD_SOURCE = r'''
import ipaddress as _ipaddress
import os as _os
import socket as _socket

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def _is_local_host(host):
  if host is None:
    return True
  if isinstance(host, bytes):
    host = host.decode("ascii", "replace")
  host = str(host).strip("[]").split("%")[0]
  if host.lower() in _LOCAL_NAMES or host == "":
    return True
  try:
    ip = _ipaddress.ip_address(host)
  except ValueError:
    return False
  return ip.is_loopback or ip.is_unspecified


def _note(what):
  log = _os.environ.get("NETWORK_GUARD_LOG")
  if log:
    with open(log, "a") as f:
      f.write(what + "\n")
  _BLOCKED.append(what)


_BLOCKED = []


def install():
  real_getaddrinfo = _socket.getaddrinfo
  real_connect = _socket.socket.connect
  real_connect_ex = _socket.socket.connect_ex

  def getaddrinfo(host, *args, **kwargs):
    if not _is_local_host(host):
      _note(f"lookup {host}")
      raise _socket.gaierror(_socket.EAI_NONAME,
                             f"network guard: lookup of {host!r} refused (tests run offline)")
    return real_getaddrinfo(host, *args, **kwargs)

  def _check(sock, address):
    if sock.family in (_socket.AF_INET, _socket.AF_INET6) and not _is_local_host(address[0]):
      _note(f"connect {address[0]}:{address[1]}")
      raise ConnectionRefusedError(
          f"network guard: connection to {address[0]}:{address[1]} refused (tests run offline)")

  def connect(self, address):
    _check(self, address)
    return real_connect(self, address)

  def connect_ex(self, address):
    _check(self, address)
    return real_connect_ex(self, address)

  _socket.getaddrinfo = getaddrinfo
  _socket.socket.connect = connect
  _socket.socket.connect_ex = connect_ex

  def uninstall():
    _socket.getaddrinfo = real_getaddrinfo
    _socket.socket.connect = real_connect
    _socket.socket.connect_ex = real_connect_ex

  return uninstall
'''


def _guard_module():
  namespace: dict = {"__name__": "network_guard"}
  exec(compile(_GUARD_SOURCE, "network_guard", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


@contextlib.contextmanager
def network_guard():
  """In this process: refuse non-loopback connections; yields the list of refusals."""
  guard = _guard_module()
  uninstall = guard["install"]()
  try:
    yield guard["_BLOCKED"]
  finally:
    uninstall()


def guard_sitecustomize(folder: str) -> str:
  """Writes a sitecustomize.py that installs the guard; put `folder` on PYTHONPATH."""
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
    f.write(_GUARD_SOURCE + "\ninstall()\n")
  return folder


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def fake_adc(path: str) -> str:
  """A throwaway authorized-user credentials file with a token that never expires."""
  with open(path, "w") as f:
    json.dump({"type": "authorized_user", "client_id": "emulator", "client_secret": "emulator",
               "refresh_token": "emulator", "token": "emulator-token",
               "expiry": "2999-01-01T00:00:00Z"}, f)
  return path


def emulator_env(host: str, folder: str) -> dict[str, str]:
  """Environment variables that send google-cloud-storage (and Beam) to the emulator."""
  return {
      "STORAGE_EMULATOR_HOST": host,
      "GOOGLE_APPLICATION_CREDENTIALS": fake_adc(os.path.join(folder, "adc.json")),
      "GOOGLE_CLOUD_PROJECT": PROJECT,
      "NO_GCE_CHECK": "true",
  }


class Emulator:
  """gcp-storage-emulator in a subprocess, in memory, on a free loopback port."""

  def __init__(self, folder: str):
    self.folder = folder
    self.port = free_port()
    self.host = f"http://127.0.0.1:{self.port}"
    self._proc: subprocess.Popen | None = None
    self._log = os.path.join(folder, "emulator.log")

  def start(self, timeout: float = 30.0) -> Emulator:
    with open(self._log, "wb") as log:
      self._proc = subprocess.Popen(
          [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
           "--port", str(self.port), "--in-memory", "--quiet"],
          stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self._proc.poll() is not None:
        raise RuntimeError(f"GCS emulator exited with {self._proc.returncode}: {self.log()}")
      try:
        with urllib.request.urlopen(self.host + "/", timeout=1):
          return self
      except OSError:
        time.sleep(0.1)
    self.stop()
    raise RuntimeError(f"GCS emulator did not answer on {self.host} in {timeout} s: {self.log()}")

  def log(self) -> str:
    with open(self._log, "rb") as f:
      return f.read().decode(errors="replace")[-2000:]

  def stop(self) -> None:
    if self._proc is not None and self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    self._proc = None

  def wipe(self) -> None:
    """Deletes every object and bucket."""
    with urllib.request.urlopen(self.host + "/wipe", timeout=10):
      pass


def client():
  """A google-cloud-storage client for the emulator (STORAGE_EMULATOR_HOST must be set)."""
  from google.auth.credentials import AnonymousCredentials
  from google.cloud import storage
  return storage.Client(project=PROJECT, credentials=AnonymousCredentials())


def split(gs_path: str) -> tuple[str, str]:
  bucket, _, name = gs_path[len("gs://"):].partition("/")
  return bucket, name


def upload(local_path: str, gs_path: str) -> str:
  bucket, name = split(gs_path)
  client().bucket(bucket).blob(name).upload_from_filename(local_path)
  return gs_path


def download(gs_path: str, local_path: str) -> str:
  bucket, name = split(gs_path)
  os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
  client().bucket(bucket).blob(name).download_to_filename(local_path)
  return local_path


def list_objects(gs_prefix: str) -> dict[str, dict]:
  """{gs:// path: {'size', 'generation', 'md5'}} of all objects under a prefix."""
  bucket, prefix = split(gs_prefix)
  return {f"gs://{bucket}/{b.name}": {"size": b.size, "generation": b.generation,
                                      "md5": b.md5_hash}
          for b in client().list_blobs(bucket, prefix=prefix)}
