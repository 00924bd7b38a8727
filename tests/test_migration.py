"""Drop-in replacements for array_record.beam.pipelines, and import hygiene."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import pipelines
from converter import OutputExistsError, read_manifest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def inputs(tmp_path, tf_write):
  """Four TF-written shards (one GZIP) with distinct records; returns (dir, {name: records})."""
  inp = tmp_path / "in"
  recs = {}
  for s in range(4):
    name = f"m.tfrecord-{s:05d}-of-00004"
    recs[name] = [f"{s}:{i}".encode() for i in range(15 + 5 * s)] + [b""]
    tf_write(str(inp / name), recs[name], "GZIP" if s == 1 else None)
  return inp, recs


def test_match_shards_returns_unrun_pipeline(tmp_path, inputs, ar_read):
  inp, recs = inputs
  out = tmp_path / "out"
  p = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
      args={"input": str(inp / "*"), "output": str(out)},
      pipeline_options=PipelineOptions(["--runner", "DirectRunner"]))
  assert isinstance(p, beam.Pipeline)
  assert not out.exists()  # Nothing happens before run().
  result = p.run()
  result.wait_until_finish()
  assert sorted(os.listdir(out)) == sorted(
      [n.replace(".tfrecord", ".array_record") for n in recs] + ["manifest.json"])
  for name, r in recs.items():
    assert ar_read(str(out / name.replace(".tfrecord", ".array_record"))) == r
  assert read_manifest(str(out))["totals"]["records"] == sum(map(len, recs.values()))


def test_match_shards_passes_options_and_list_of_patterns(tmp_path, inputs, ar_read):
  inp, recs = inputs
  out = tmp_path / "out"
  names = sorted(recs)
  p = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
      args={"input": [str(inp / names[0]), str(inp / names[3])], "output": str(out),
            "writer_options": "group_size:1,zstd:1", "existing": "error"},
      pipeline_options=PipelineOptions([]))
  p.run().wait_until_finish()
  assert ar_read(str(out / names[3].replace(".tfrecord", ".array_record"))) == recs[names[3]]
  m = read_manifest(str(out))
  assert m["writer_options"] == "group_size:1,zstd:1" and m["totals"]["shards"] == 2


def test_match_shards_checks_args_before_building():
  with pytest.raises(ValueError, match="'input' and 'output'"):
    pipelines.convert_tf_to_arrayrecord_disk_match_shards(args={"input": "x"})
  with pytest.raises(ValueError, match="Valid keys"):
    pipelines.convert_tf_to_arrayrecord_disk_match_shards(
        args={"input": "x", "output": "y", "writer_options": "nope:1"})


@pytest.mark.parametrize("num_shards", [3, 1])
def test_reshard_n_to_m(tmp_path, inputs, ar_read, num_shards):
  inp, recs = inputs
  prefix = tmp_path / "out" / "resharded"
  p = pipelines.convert_tf_to_arrayrecord_disk(
      num_shards=num_shards, args={"input": str(inp / "*"), "output": str(prefix)},
      pipeline_options=PipelineOptions([]))
  assert not prefix.parent.exists()
  p.run().wait_until_finish()
  expected = [f"resharded-{i:05d}-of-{num_shards:05d}.arrayrecord" for i in range(num_shards)]
  assert sorted(os.listdir(prefix.parent)) == expected
  got = []
  for name in expected:
    shard = ar_read(str(prefix.parent / name))
    if num_shards > 1:
      assert shard, f"{name} is empty"  # 94 records spread by hash.
    got.extend(shard)
  want = [r for rs in recs.values() for r in rs]
  assert collections.Counter(got) == collections.Counter(want)


def test_reshard_more_shards_than_records(tmp_path, tf_write, ar_read):
  src = tf_write(str(tmp_path / "in" / "few.tfrecord"), [b"1", b"2"])
  prefix = tmp_path / "out" / "s"
  p = pipelines.convert_tf_to_arrayrecord_disk(
      num_shards=5, args={"input": src, "output": str(prefix), "file_name_suffix": ".ar"},
      pipeline_options=PipelineOptions([]))
  p.run().wait_until_finish()
  names = sorted(os.listdir(prefix.parent))
  assert names == [f"s-{i:05d}-of-00005.ar" for i in range(5)]  # Every shard exists.
  assert sorted(r for n in names for r in ar_read(str(prefix.parent / n))) == [b"1", b"2"]


def test_reshard_never_replaces_existing_outputs_without_overwrite(tmp_path, tf_write, ar_read):
  src = tf_write(str(tmp_path / "in" / "few.tfrecord"), [b"1", b"2"])
  prefix = tmp_path / "out" / "s"
  prefix.parent.mkdir()
  mine = prefix.parent / "s-00001-of-00002.arrayrecord"
  mine.write_bytes(b"mine")
  args = {"input": src, "output": str(prefix)}
  with pytest.raises(OutputExistsError, match="1 existing output file.* would be replaced by re-sharding"):
    pipelines.convert_tf_to_arrayrecord_disk(num_shards=2, args=args, pipeline_options=PipelineOptions([]))
  assert mine.read_bytes() == b"mine" and os.listdir(prefix.parent) == [mine.name]
  p = pipelines.convert_tf_to_arrayrecord_disk(num_shards=2, args={**args, "existing": "overwrite"},
                                               pipeline_options=PipelineOptions([]))
  p.run().wait_until_finish()
  names = sorted(os.listdir(prefix.parent))
  assert sorted(r for n in names for r in ar_read(str(prefix.parent / n))) == [b"1", b"2"]


def test_reshard_removes_the_temps_a_killed_run_left(tmp_path, tf_write, ar_read):
  from loader import ondisk
  src = tf_write(str(tmp_path / "in" / "few.tfrecord"), [b"1", b"2", b"3"])
  prefix = tmp_path / "out" / "s"
  prefix.parent.mkdir()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()  # A pid that no longer runs: as after kill -9.
  stale = ondisk.temp_name(str(prefix.parent / "s-00001-of-00002.arrayrecord"),
                           ondisk.Owner(dead.pid, 1, ondisk.this_process().host))
  with open(stale, "wb") as f:
    f.write(b"half a shard")
  p = pipelines.convert_tf_to_arrayrecord_disk(num_shards=2, args={"input": src, "output": str(prefix)},
                                               pipeline_options=PipelineOptions([]))
  p.run().wait_until_finish()
  names = sorted(os.listdir(prefix.parent))
  assert names == ["s-00000-of-00002.arrayrecord", "s-00001-of-00002.arrayrecord"]
  assert sorted(r for n in names for r in ar_read(str(prefix.parent / n))) == [b"1", b"2", b"3"]


def test_reshard_rejects_bad_arguments():
  with pytest.raises(ValueError, match="num_shards"):
    pipelines.convert_tf_to_arrayrecord_disk(num_shards=0, args={"input": "x", "output": "y"})
  with pytest.raises(ValueError, match="required"):
    pipelines.convert_tf_to_arrayrecord_disk(num_shards=2)


def _python(code: str, *argv: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": REPO}
  return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=180)


def test_import_does_not_parse_argv():
  # Flags the reference pipelines would choke on (or require) at import time.
  r = _python("import pipelines, pipelines.convert, pipelines.verify; print('imported')",
              "--junk", "--input", "--output=/nonexistent", "-h")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "imported"


def test_import_does_not_import_tensorflow():
  code = ("import sys, converter, pipelines, pipelines.convert, pipelines.verify, "
          "pipelines.migration, pipelines.make_example_data\n"
          "print(sorted(m for m in sys.modules\n"
          "             if m == 'tensorflow' or m.startswith('tensorflow.')))")
  r = _python(code)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "[]"


def test_reshard_publishes_all_shards_or_none(tmp_path, tf_write, ar_read):
  import faults_testing as ft
  src = tf_write(str(tmp_path / "in" / "few.tfrecord"), [b"1", b"2", b"3"])
  prefix = tmp_path / "out" / "s"
  prefix.parent.mkdir()
  p = pipelines.convert_tf_to_arrayrecord_disk(num_shards=3, args={"input": src, "output": str(prefix)},
                                               pipeline_options=PipelineOptions([]))
  theirs = prefix.parent / "s-00001-of-00003.arrayrecord"
  theirs.write_bytes(b"another run's shard")  # Published by another run after this one was built.
  with pytest.raises(Exception, match=r"1 existing output file\(s\) appeared while re-sharding \(another run wrote "
                                      r"them\): .*s-00001-of-00003.arrayrecord"):
    p.run().wait_until_finish()
  assert os.listdir(prefix.parent) == [theirs.name] and theirs.read_bytes() == b"another run's shard"
  # A full disk while writing: no shard under a final name, no temp file left.
  rng = __import__("numpy").random.default_rng(0)
  big = tf_write(str(tmp_path / "in2" / "big.tfrecord"), [rng.bytes(60_000) for _ in range(12)])
  with ft.tmpfs(str(tmp_path / "small"), "300k") as mount:
    p = pipelines.convert_tf_to_arrayrecord_disk(num_shards=4, args={"input": big, "output": f"{mount}/s"},
                                                 pipeline_options=PipelineOptions([]))
    with pytest.raises(Exception, match="No space left on device"):
      p.run().wait_until_finish()
    assert os.listdir(mount) == []


def test_reshard_refuses_to_add_a_set_of_another_shard_count_under_the_same_prefix(tmp_path, tf_write, ar_read):
  src = tf_write(str(tmp_path / "in" / "few.tfrecord"), [b"1", b"2", b"3"])
  prefix = tmp_path / "out" / "s"
  prefix.parent.mkdir()
  args = {"input": src, "output": str(prefix)}
  pipelines.convert_tf_to_arrayrecord_disk(num_shards=2, args=args, pipeline_options=PipelineOptions([])).run()
  with pytest.raises(OutputExistsError, match=r"2 existing output file\(s\) are shards of another shard count under "
                                              r"the prefix .*/s, which a reader of .*/s-\* would mix with these 3"):
    pipelines.convert_tf_to_arrayrecord_disk(num_shards=3, args=args, pipeline_options=PipelineOptions([]))
  assert sorted(os.listdir(prefix.parent)) == ["s-00000-of-00002.arrayrecord", "s-00001-of-00002.arrayrecord"]


@pytest.mark.parametrize("function", ["convert_tf_to_arrayrecord_disk_match_shards", "convert_tf_to_arrayrecord_disk"])
def test_api_runs_leave_nothing_in_tmpdir_and_skip_prism(tmp_path, inputs, ar_read, function):
  # DirectRunner would first try to download Prism (network) and leave its
  # empty beam-temp* folder behind when it falls back.
  inp, recs = inputs
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  kwargs = {"args": {"input": str(inp / "*"), "output": str(tmp_path / "out")}}
  if function == "convert_tf_to_arrayrecord_disk":
    kwargs = {"num_shards": 2, "args": {"input": str(inp / "*"), "output": str(tmp_path / "out" / "x")}}
  script = (f"import pipelines; p = pipelines.{function}(**{kwargs!r}); "
            "print(type(p.runner).__name__); p.run().wait_until_finish()")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                        env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": str(scratch)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["FnApiRunner"]
  assert "prism" not in proc.stderr.lower()
  assert not os.listdir(scratch)
  written = [r for f in sorted((tmp_path / "out").iterdir()) if f.name != "manifest.json" for r in ar_read(str(f))]
  assert collections.Counter(written) == collections.Counter(r for rs in recs.values() for r in rs)
