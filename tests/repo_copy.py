"""A copy of the checkout as a clone would have it (plus uncommitted work), nothing built."""

from __future__ import annotations

import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh_copy(dest: str) -> str:
  """Copies tracked and untracked-but-not-ignored files of the checkout to dest."""
  try:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
  except (OSError, subprocess.CalledProcessError):
    files = [os.path.relpath(os.path.join(d, f), REPO) for d, _, fs in os.walk(REPO)
             if not any(p in d for p in (".venv", ".git", "__pycache__")) for f in fs]
  for rel in filter(None, files):
    if os.path.isfile(os.path.join(REPO, rel)):
      os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
      shutil.copy2(os.path.join(REPO, rel), os.path.join(dest, rel))
  return dest
