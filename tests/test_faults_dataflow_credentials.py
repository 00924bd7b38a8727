"""A real Dataflow submit without credentials fails in one line, before contacting anything."""

from __future__ import annotations

import os
import subprocess
import sys

import gcs_emulator as emu
import faults_testing as ft

ARGV = ["--input", "gs://my-bucket/tfr/train-*", "--output", "gs://my-bucket/ar/",
        "--project", "my-project", "--region", "us-central1",
        "--temp_location", "gs://my-bucket/tmp"]


def clean_env(base: str) -> dict[str, str]:
  """No credentials anywhere google-auth looks, and a guard that refuses the network."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR", "GCE_"))}
  env.update(PYTHONPATH=os.pathsep.join([emu.guard_sitecustomize(os.path.join(base, "guard")),
                                         ft.REPO]),
             NETWORK_GUARD_LOG=os.path.join(base, "blocked.log"), HOME=base,
             CLOUDSDK_CONFIG=os.path.join(base, "gcloud"))
  return env


def test_submit_without_credentials_fails_fast_in_one_line(tmp_path):
  env = clean_env(str(tmp_path))
  proc = subprocess.run([sys.executable, "-m", "dataflow.submit", *ARGV], cwd=ft.REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert ft.one_line(proc.stderr) == (
      "arrayrecord-dataflow: error: no Google Cloud credentials found; run `gcloud auth "
      "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS")
  assert "Submitting" not in proc.stdout  # Failed before anything else.
  log = tmp_path / "blocked.log"
  assert not log.exists() or log.read_text() == ""  # The check never tried the network.

