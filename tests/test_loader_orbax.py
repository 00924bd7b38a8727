"""loader.checkpoint's Orbax integration with a real orbax.checkpoint.CheckpointManager.

The snippets are Grain's documented ones (`grain.checkpoint.CheckpointSave` /
`CheckpointRestore` as `CheckpointManager` args, and the handler named in a
Composite checkpoint as MaxText does), with `loader` in place of `grain`.
"""

from __future__ import annotations

import json

import numpy as np
import orbax.checkpoint as ocp
import pytest

import loader
from loader import checkpoint
from tests import loader_testing
from tests import porting


def _data_loader():
  sampler = loader.samplers.IndexSampler(20, shuffle=True, num_epochs=1, seed=7)
  return loader.DataLoader(data_source=list(range(20)), sampler=sampler,
                           operations=[loader.transforms.Batch(3)], shard_options=loader.sharding.NoSharding())


def _dataset():
  return loader.MapDataset.range(20).shuffle(seed=7).map(lambda x: x * 2).batch(3).to_iter_dataset()


def _assert_same(a, b):
  loader_testing.assert_streams_equal(a, b)


@pytest.mark.parametrize("make", [_data_loader, _dataset], ids=["DataLoaderIterator", "DatasetIterator"])
def test_checkpoint_manager_save_and_restore(tmp_path, make):
  it = iter(make())
  next(it)
  next(it)
  mngr = ocp.CheckpointManager(tmp_path / "orbax")
  assert mngr.save(step=2, args=checkpoint.CheckpointSave(it), force=True)
  mngr.wait_until_finished()
  files = list((tmp_path / "orbax" / "2").rglob("process_0-of-1.json"))
  assert len(files) == 1
  json.loads(files[0].read_text())  # Plain JSON, as Grain writes it.
  expected = loader_testing.take(it, None)

  restored = iter(make())
  out = mngr.restore(2, args=checkpoint.CheckpointRestore(restored))
  assert out is restored
  _assert_same(loader_testing.take(restored, None), expected)
  mngr.close()


def test_composite_checkpoint_with_model_state(tmp_path):
  it = iter(_data_loader())
  next(it)
  params = {"w": np.arange(4.0)}
  mngr = ocp.CheckpointManager(tmp_path / "orbax", item_names=("params", "data_iter"),
                               item_handlers={"data_iter": checkpoint.CheckpointHandler()})
  mngr.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                       data_iter=checkpoint.CheckpointSave(it)))
  mngr.wait_until_finished()
  expected = loader_testing.take(it, None)

  restored_it = iter(_data_loader())
  out = mngr.restore(1, args=ocp.args.Composite(params=ocp.args.StandardRestore(params),
                                                data_iter=checkpoint.CheckpointRestore(restored_it)))
  np.testing.assert_array_equal(out["params"]["w"], params["w"])
  _assert_same(loader_testing.take(restored_it, None), expected)
  mngr.close()


def test_grain_namespace_names(tmp_path):
  # `import loader.python as grain` spelling of the same classes.
  import loader.python as grain  # pylint: disable=g-import-not-at-top

  assert grain.PyGrainCheckpointSave is checkpoint.CheckpointSave
  assert grain.PyGrainCheckpointRestore is checkpoint.CheckpointRestore
  assert grain.PyGrainCheckpointHandler is checkpoint.CheckpointHandler
  assert checkpoint.CheckpointSave.__module__ == "loader.checkpoint"


def test_handler_reads_files_of_grains_handler(tmp_path):
  import grain  # pylint: disable=g-import-not-at-top

  grain_it = iter(grain.MapDataset.range(20).to_iter_dataset())
  next(grain_it)
  next(grain_it)
  grain.checkpoint.CheckpointHandler().save(tmp_path, item=grain_it)
  restored = checkpoint.CheckpointHandler().restore(tmp_path, args=checkpoint.CheckpointRestore(
      iter(loader.MapDataset.range(20).to_iter_dataset())))
  assert list(restored) == list(grain_it) == list(range(2, 20))


def test_missing_file_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match=r"No iterator state for this process \(0 of 1\): .*process_0-of-1.json does "
                                       r"not exist; the checkpoint holds no iterator state: restore from"):
    checkpoint.CheckpointHandler().restore(tmp_path, item=iter(_dataset()))
  # Saved by a job of two processes.
  (tmp_path / "process_0-of-2.json").write_text("{}")
  (tmp_path / "process_1-of-2.json").write_text("{}")
  with pytest.raises(ValueError, match=r"the checkpoint holds process_0-of-2.json, process_1-of-2.json: it was "
                                       r"saved by a job of another process count; restore it with as many "
                                       r"processes as saved it, not 1"):
    checkpoint.CheckpointHandler().restore(tmp_path, item=iter(_dataset()))


@pytest.mark.parametrize("content", [b"", b'{"next_index": 3', b"\xff\x00garbage"])
def test_a_damaged_state_file_is_named_in_one_line(tmp_path, content):
  (tmp_path / "process_0-of-1.json").write_bytes(content)
  with pytest.raises(ValueError, match=r"process_0-of-1.json is not an iterator state \(damaged or not JSON: "
                                       r".*\); restore another checkpoint step\.") as e:
    checkpoint.CheckpointHandler().restore(tmp_path, item=iter(_dataset()))
  assert "\n" not in str(e.value)


def test_a_refused_state_names_the_checkpoint_file(tmp_path):
  it = iter(_dataset())
  next(it)
  mngr = ocp.CheckpointManager(tmp_path / "orbax")
  mngr.save(step=1, args=checkpoint.CheckpointSave(it), force=True)
  mngr.wait_until_finished()
  other = iter(loader.MapDataset.range(20).shuffle(seed=8).map(lambda x: x * 2).batch(3).to_iter_dataset())
  with pytest.raises(ValueError, match=r"Cannot restore .*process_0-of-1.json: .*seed") as e:
    mngr.restore(1, args=checkpoint.CheckpointRestore(other))
  assert "\n" not in str(e.value)
  mngr.close()


class _Created:
  """Orbax's PathAwaitingCreation, for a directory that already exists."""

  def __init__(self, path):
    self._path = path

  async def await_creation(self):
    return self._path


def test_data_loader_iterator_async_save_and_load(tmp_path):
  # Orbax v1's StatefulCheckpointable protocol, which Grain's iterator implements.
  import asyncio  # pylint: disable=g-import-not-at-top

  it = iter(_data_loader())
  next(it)

  async def save():
    await (await it.save(_Created(tmp_path)))

  asyncio.run(save())
  expected = loader_testing.take(it, None)
  restored = iter(_data_loader())

  async def load():
    await (await restored.load(tmp_path))

  asyncio.run(load())
  _assert_same(loader_testing.take(restored, None), expected)


# MaxText-style: the manager is built with item_handlers before the code ever
# names CheckpointSave; Orbax matches args to handlers at that point.
ITEM_HANDLERS_FIRST = """
import json, sys
import grain
import orbax.checkpoint as ocp

directory = sys.argv[1]
ds = grain.MapDataset.source(list(range(30))).to_iter_dataset().batch(4)
manager = ocp.CheckpointManager(directory, item_names=("ds",),
                                item_handlers={"ds": grain.checkpoint.CheckpointHandler()})
it = iter(ds)
first = next(it).tolist()
manager.save(1, args=ocp.args.Composite(ds=grain.checkpoint.CheckpointSave(it)))
manager.wait_until_finished()
restored = iter(ds)
manager.restore(1, args=ocp.args.Composite(ds=grain.checkpoint.CheckpointRestore(restored)))
print(json.dumps([first, next(restored).tolist()]))
"""


@pytest.mark.parametrize("lib", porting.LIBS)
def test_a_manager_built_with_item_handlers_accepts_checkpoint_save_and_restore(lib, tmp_path):
  out = porting.run_script(ITEM_HANDLERS_FIRST, lib, tmp_path, str(tmp_path / "ckpt"))
  assert out == [[0, 1, 2, 3], [4, 5, 6, 7]]
