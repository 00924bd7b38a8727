"""Re-sharding (pipelines.convert_tf_to_arrayrecord_disk) when outputs are in the way or publishing fails.

Found by a fault audit: a folder at one shard's name made an existing='overwrite' rerun fail while
publishing and delete the shards it had already replaced (the user was left with nothing); an overwrite
with another num_shards left the old set beside the new one (a reader of prefix-* read every record
twice); a rerun with another num_shards left the temps of a killed run for ever. Each case ran as a
script before the fix.
"""

from __future__ import annotations

import collections
import errno
import glob
import json
import os
import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import faults_testing as ft
import pipelines
from converter.errors import OutputError, OutputWriteError
from loader import ondisk
from pipelines import migration


@pytest.fixture
def src(tmp_path):
  """Two TFRecord files of distinct records; returns (glob, records)."""
  records = []
  for f in range(2):
    rs = [f"{f}:{i}".encode() for i in range(30)]
    ft.write_tfrecords(tmp_path / "in" / f"x.tfrecord-{f:05d}-of-00002", rs)
    records += rs
  return str(tmp_path / "in" / "*"), records


def reshard(num_shards: int, pattern: str, prefix: str, **extra):
  """The re-sharding pipeline, built (not run)."""
  return pipelines.convert_tf_to_arrayrecord_disk(
      num_shards=num_shards, args={"input": pattern, "output": prefix, **extra},
      pipeline_options=PipelineOptions([]))


def shard(prefix: str, i: int, n: int) -> str:
  return f"{prefix}-{i:05d}-of-{n:05d}.arrayrecord"


def old_set(prefix: str, n: int, skip: tuple[int, ...] = ()) -> dict[str, bytes]:
  """A set of `n` files under the shard names (what a user had); returns {path: bytes}."""
  os.makedirs(os.path.dirname(prefix), exist_ok=True)
  had = {}
  for i in range(n):
    if i not in skip:
      had[shard(prefix, i, n)] = f"old shard {i} of {n}".encode()
      with open(shard(prefix, i, n), "wb") as f:
        f.write(had[shard(prefix, i, n)])
  return had


def contents(folder: str) -> dict[str, bytes | None]:
  """Every entry of a folder (hidden ones too): a file's bytes, None for a folder."""
  out = {}
  for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    out[name] = None if os.path.isdir(path) else open(path, "rb").read()
  return out


def read_set(prefix: str, ar_read) -> list[bytes]:
  return [r for f in sorted(glob.glob(f"{prefix}-*")) for r in ar_read(f)]


@pytest.mark.parametrize("existing", ["error", "overwrite"])
def test_a_folder_at_a_shard_name_is_refused_before_any_work(tmp_path, src, existing):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 3, skip=(2,))
  os.makedirs(os.path.join(shard(prefix, 2, 3), "inside"))
  before = contents(str(tmp_path / "r"))
  with pytest.raises(OutputError) as e:  # Not "pass existing='overwrite'", which cannot replace a folder.
    reshard(3, src[0], prefix, existing=existing)
  assert str(e.value) == (f"Output {shard(prefix, 2, 3)} is a directory, where this run would write its file; "
                          "remove it or choose another --output.")
  assert contents(str(tmp_path / "r")) == before


def test_a_folder_that_appears_after_building_is_refused_when_the_run_starts(tmp_path, src):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 3)
  p = reshard(3, src[0], prefix, existing="overwrite")
  os.remove(shard(prefix, 2, 3))
  os.mkdir(shard(prefix, 2, 3))
  before = contents(str(tmp_path / "r"))
  with pytest.raises(OutputError, match=r"^Output .*/ds-00002-of-00003.arrayrecord is a directory, where this run "
                                        r"would write its file; remove it or choose another --output.$"):
    p.run().wait_until_finish()
  assert contents(str(tmp_path / "r")) == before  # Shards 0 and 1 are the user's still.


def test_a_folder_that_appears_while_the_shards_are_written_is_refused_before_any_is_published(tmp_path):
  # The publish step checks again under the lock, before its first rename.
  prefix = str(tmp_path / "r" / "ds")
  had = old_set(prefix, 3)
  written = []
  for i in range(3):
    tmp = ondisk.temp_name(shard(prefix, i, 3))
    with open(tmp, "wb") as f:
      f.write(b"new")
    written.append((shard(prefix, i, 3), tmp))
  os.remove(shard(prefix, 2, 3))
  os.mkdir(shard(prefix, 2, 3))
  fn = migration._PublishShardsFn(prefix, 3, ".arrayrecord", True)  # pylint: disable=protected-access
  with pytest.raises(OutputError, match="ds-00002-of-00003.arrayrecord is a directory"):
    list(fn.process(written))
  assert contents(str(tmp_path / "r")) == {**{os.path.basename(k): v for k, v in had.items()},
                                           "ds-00002-of-00003.arrayrecord": None}  # No temp, no lock file.


def test_a_failure_while_publishing_puts_back_every_file_it_replaced(tmp_path, src, monkeypatch):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 3, skip=(1,))  # Shard 1 is new: the only file undoing may remove.
  (tmp_path / "r" / "notes.txt").write_bytes(b"mine")
  before = contents(str(tmp_path / "r"))
  real = ondisk.publish_local

  def publish_local(tmp, final, expect=ondisk.REPLACE_ANY):
    if final == shard(prefix, 2, 3):  # As a flaky disk, or a file with the immutable attribute (EPERM).
      raise OSError(errno.EIO, os.strerror(errno.EIO), final)
    return real(tmp, final, expect)

  monkeypatch.setattr(ondisk, "publish_local", publish_local)
  with pytest.raises(OutputWriteError) as e:
    reshard(3, src[0], prefix, existing="overwrite").run().wait_until_finish()
  assert str(e.value) == (
      f"Re-sharding could not publish its shards at {shard(prefix, 2, 3)}: [Errno 5] Input/output error; nothing "
      "was changed: the files it had replaced or removed were put back, and no temp file was left. Check the disk "
      "(an I/O error), then run the re-sharding again.")
  assert contents(str(tmp_path / "r")) == before


def test_overwrite_with_another_shard_count_replaces_the_whole_set(tmp_path, src, ar_read):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 4)
  (tmp_path / "r" / "ds-other.arrayrecord").write_bytes(b"not a shard name: kept")
  reshard(2, src[0], prefix, existing="overwrite").run().wait_until_finish()
  assert sorted(os.listdir(tmp_path / "r")) == ["ds-00000-of-00002.arrayrecord", "ds-00001-of-00002.arrayrecord",
                                                "ds-other.arrayrecord"]
  (tmp_path / "r" / "ds-other.arrayrecord").unlink()
  assert collections.Counter(read_set(prefix, ar_read)) == collections.Counter(src[1])  # Each record once.


def test_a_failure_while_removing_the_other_set_puts_everything_back(tmp_path, src, monkeypatch):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 2)
  old_set(prefix, 4)
  before = contents(str(tmp_path / "r"))
  stuck, real = shard(prefix, 2, 4), os.rename

  def rename(a, b, **kw):
    if a == stuck:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), a)
    return real(a, b, **kw)

  monkeypatch.setattr(os, "rename", rename)
  with pytest.raises(OutputWriteError) as e:
    reshard(2, src[0], prefix, existing="overwrite").run().wait_until_finish()
  assert str(e.value) == (
      f"Re-sharding could not publish its shards at {stuck}: [Errno 13] Permission denied; nothing was changed: the "
      "files it had replaced or removed were put back, and no temp file was left. Fix the output folder's "
      "permissions, then run the re-sharding again.")
  assert contents(str(tmp_path / "r")) == before  # The old 2-shard set too, not the new one.


def test_overwrite_removes_only_files_of_the_other_set(tmp_path, src):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 4)
  os.remove(shard(prefix, 3, 4))
  os.mkdir(shard(prefix, 3, 4))
  before = contents(str(tmp_path / "r"))
  with pytest.raises(OutputError) as e:
    reshard(2, src[0], prefix, existing="overwrite")
  assert str(e.value) == (
      f"{shard(prefix, 3, 4)} is a directory named as a shard of another shard count under the prefix {prefix}; "
      f"existing='overwrite' removes that set, so that a reader of {prefix}-* does not mix it with these 2 shards, "
      "but removes only files: move it away, or re-shard under another prefix.")
  assert contents(str(tmp_path / "r")) == before


def test_overwrite_refuses_to_make_a_manifest_beside_the_shards_stale(tmp_path, src):
  prefix = str(tmp_path / "r" / "ds")
  old_set(prefix, 4)
  manifest = tmp_path / "r" / "manifest.json"
  manifest.write_text(json.dumps({"shards": [{"output": "ds-00001-of-00004.arrayrecord", "records": 1}]}))
  before = contents(str(tmp_path / "r"))
  with pytest.raises(OutputError) as e:
    reshard(2, src[0], prefix, existing="overwrite")
  assert str(e.value) == (
      f"{manifest} lists 1 file(s) that re-sharding with existing='overwrite' would replace or remove "
      f"({shard(prefix, 1, 4)}), so it would no longer describe its folder. Nothing was converted. Re-shard under a "
      "prefix in another folder, or move that manifest.json away first.")
  assert contents(str(tmp_path / "r")) == before


def test_a_rerun_with_another_shard_count_removes_the_temps_a_killed_run_left(tmp_path, src, ar_read):
  prefix = str(tmp_path / "r" / "ds")
  os.makedirs(tmp_path / "r")
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()  # A pid that no longer runs: as after kill -9.
  gone = ondisk.Owner(dead.pid, 1, ondisk.this_process().host)
  for i in range(4):
    with open(ondisk.temp_name(shard(prefix, i, 4), gone), "wb") as f:
      f.write(b"half a shard")
  live = ondisk.temp_name(shard(prefix, 0, 4))  # This process's: a live run's work, kept.
  with open(live, "wb") as f:
    f.write(b"being written")
  reshard(2, src[0], prefix).run().wait_until_finish()
  assert sorted(os.listdir(tmp_path / "r")) == sorted(
      [os.path.basename(live), "ds-00000-of-00002.arrayrecord", "ds-00001-of-00002.arrayrecord"])
  assert collections.Counter(read_set(prefix, ar_read)) == collections.Counter(src[1])


def test_a_retried_publish_step_keeps_the_other_set(tmp_path):
  # Its temps gone, a retry cannot tell whether an earlier try published the set or undid it:
  # removing the other shard count's set could then leave neither.
  prefix = str(tmp_path / "r" / "ds")
  had = old_set(prefix, 4)
  fn = migration._PublishShardsFn(prefix, 2, ".arrayrecord", True)  # pylint: disable=protected-access
  written = [(shard(prefix, i, 2), ondisk.temp_name(shard(prefix, i, 2))) for i in range(2)]
  assert list(fn.process(written)) == [shard(prefix, i, 2) for i in range(2)]
  assert contents(str(tmp_path / "r")) == {os.path.basename(k): v for k, v in had.items()}
