"""An eighth set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found by the 2026-11-27 audit (round 11) in public code: an NNX pretraining
checkpoint that saves the iterator's state with Orbax's `StandardSave` beside
the model's (a state must be a pytree of numbers), a segmentation utility
that finds the `Batch` among `DataLoader._operations` and divides by
`_global_num_workers`, code that calls a `BatchOperation`'s default
`batch_fn`, JAX numbers given as sizes, seeds and mixing weights, and
`select_from_datasets` without a selection map.
"""

from __future__ import annotations

from tests import porting

STANDARD_SAVE = """
import tempfile
import orbax.checkpoint as ocp
import grain

def pipelines():
  base = grain.MapDataset.range(40)
  return {
      "batch": base.shuffle(seed=1).batch(2).to_iter_dataset(),
      "mix": grain.IterDataset.mix([base.to_iter_dataset(), grain.MapDataset.range(100, 140).to_iter_dataset()],
                                   [0.5, 0.5]),
      "iter batch": base.shuffle(seed=3).to_iter_dataset().batch(3),
  }

results = {}
directory = tempfile.mkdtemp()
names = tuple(pipelines())
manager = ocp.CheckpointManager(directory, item_names=names,
                                item_handlers={k: ocp.StandardCheckpointHandler() for k in names})
iterators = {k: iter(ds) for k, ds in pipelines().items()}
for it in iterators.values():
  next(it); next(it)
manager.save(2, args=ocp.args.Composite(**{k: ocp.args.StandardSave(it.get_state()) for k, it in iterators.items()}))
manager.wait_until_finished()
restored = manager.restore(2, args=ocp.args.Composite(**{k: ocp.args.StandardRestore() for k in names}))
for k, ds in pipelines().items():
  resumed = iter(ds)
  resumed.set_state(restored[k])
  results[k] = ([porting_plain(next(resumed)) for _ in range(3)], [porting_plain(next(iterators[k])) for _ in range(3)])
"""


def test_an_iterator_state_saved_with_orbax_standard_save_resumes():
  g, l = porting.run_both(STANDARD_SAVE, porting_plain=porting.plain)
  assert l.results == g.results
  assert all(resumed == expected for resumed, expected in l.results.values())


DATA_LOADER_ATTRIBUTES = """
import numpy as np
import grain.python as grain

def get_num_batches(loader):
  # The client's helper: the Batch among the operations, then the workers of all shards.
  batch = next(op for op in loader._operations if isinstance(op, grain.Batch))
  return 40 // batch.batch_size // loader._global_num_workers

results = {}
for workers, shards in [(0, 1), (2, 1), (0, 2)]:
  loader = grain.DataLoader(
      data_source=list(range(40)), sampler=grain.IndexSampler(40, grain.NoSharding(), num_epochs=1),
      operations=[grain.BatchOperation(4)],
      worker_count=workers, shard_options=grain.ShardOptions(0, shards) if shards > 1 else grain.NoSharding())
  results[(workers, shards)] = ([type(op).__name__ for op in loader._operations], get_num_batches(loader),
                                loader._local_num_workers)
op = grain.BatchOperation(2)
results["batch_fn"] = np.asarray(op.batch_fn([np.arange(2), np.arange(2)])).tolist()
"""


def test_data_loader_operations_and_worker_counts_as_clients_read_them():
  g, l = porting.run_both(DATA_LOADER_ATTRIBUTES)
  assert l.results == g.results


JAX_NUMBERS = """
import jax.numpy as jnp
import numpy as np
import grain

results = {}
base = grain.MapDataset.range(12)
results["batch"] = [b.tolist() for b in base.batch(jnp.int32(4))]
results["batch 0-d"] = [b.tolist() for b in base.batch(np.array(5))]
results["repeat"] = len(base.repeat(np.array(2)))
results["mix"] = [int(x) for x in grain.MapDataset.mix([base, grain.MapDataset.range(100, 112)],
                                                      jnp.array([1.0, 3.0]) / 4)][:8]
results["mix scalars"] = [int(x) for x in grain.MapDataset.mix([base, grain.MapDataset.range(100, 112)],
                                                              [jnp.float32(1.0), jnp.float32(3.0)])][:8]
results["shuffle 3.0"] = [int(x) for x in base.shuffle(seed=3.0)][:6]
results["window"] = [int(x) for x in grain.experimental.WindowShuffleMapDataset(base, window_size=jnp.int32(3),
                                                                               seed=jnp.int32(1))][:6]
results["limit"] = [int(x) for x in grain.experimental.LimitIterDataset(base.to_iter_dataset(), count=jnp.int32(3))]
results["select none"] = [int(x) for x in grain.MapDataset.select_from_datasets(
    [grain.MapDataset.range(3), grain.MapDataset.range(100, 103)], None)]
"""


def test_jax_and_numpy_numbers_as_sizes_seeds_and_weights():
  g, l = porting.run_both(JAX_NUMBERS)
  assert l.results == g.results
