"""examples/llm_pretrain.py runs end to end and resumes into another worker count exactly."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_llm_pretrain_resumes_with_another_worker_count(tmp_path):
  cmd = [sys.executable, os.path.join(REPO, "examples", "llm_pretrain.py"), "--workdir", str(tmp_path),
         "--docs", "200", "--seq-len", "128", "--batch-size", "4", "--steps", "6",
         "--workers", "0", "--resume-workers", "1"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "resumed stream equals the uninterrupted one: True" in proc.stdout
  assert "resumed losses equal the uninterrupted ones: True" in proc.stdout
  # The converter wrote its outputs and manifest for both corpora.
  for corpus in ("web", "code"):
    names = os.listdir(tmp_path / "array_record" / corpus)
    assert "manifest.json" in names and any(".array_record" in n for n in names)
