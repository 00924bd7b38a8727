"""A fifth set of public Grain client patterns, run on Grain 0.2.18 and, with only the import line changed, on loader.

Found by the 2026-11-26 audit (round 5) in public code: google/tunix
(`script_utils.get_dataset`: an optional field that an extractor may leave
None, batched with the others), MaxText's OLMo loader (tests/
test_port_maxtext_olmo.py), Keras's Grain adapter (tests/test_loader_keras.py),
a raster-tile client that wraps `DataLoader._dataset` in
`WithOptionsIterDataset`, and clients that log datasets.

Scripts run as `__main__` on each library in a fresh process; their output
must be the same.
"""

from __future__ import annotations

import pytest

from tests import porting

# google/tunix: {"question", "answer"} rows where `answer` may be None; Grain
# batches such a field into an object array unless the batch's first row is
# None (then its tree map raises, as for a list after None).
OPTIONAL_FIELD = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import grain
rows = [{"q": "a", "answer": "1"}, {"q": "b", "answer": None}, {"q": "c", "answer": "3"}]
cases = [
    ("MapDataset.batch", lambda: grain.MapDataset.source(rows).batch(3)[0]),
    ("IterDataset.batch", lambda: next(iter(grain.MapDataset.source(rows).to_iter_dataset().batch(3)))),
    ("DataLoader Batch", lambda: next(iter(grain.DataLoader(
        data_source=rows, sampler=grain.samplers.SequentialSampler(3, grain.sharding.NoSharding()),
        operations=[grain.transforms.Batch(3)])))),
    ("bytes then None", lambda: grain.MapDataset.source([b"x", None, b"z"]).batch(3)[0]),
    ("int then None", lambda: grain.MapDataset.source([1, None, 3]).batch(3)[0]),
    ("None first", lambda: grain.MapDataset.source(rows[1:] + rows[:1]).batch(3)[0]),
    ("list then None", lambda: grain.MapDataset.source([{"x": [1, 2]}, {"x": None}]).batch(2)[0]),
    ("all None", lambda: grain.MapDataset.source([{"x": None, "y": 1}, {"x": None, "y": 2}]).batch(2)[0]),
]
for name, make in cases:
  try:
    b = make()
    shown = ({k: None if v is None else (str(v.dtype), v.tolist()) for k, v in b.items()} if isinstance(b, dict)
             else (str(b.dtype), b.tolist()))
    print(name, shown)
  except Exception as e:
    print(name, "raises", type(e).__name__)
"""


@pytest.mark.parametrize("name", ["OPTIONAL_FIELD"])
def test_client_script_prints_the_same(name, tmp_path):
  porting.assert_prints_the_same(globals()[name], tmp_path)


# A raster-tile client: on Windows with workers it wraps the DataLoader's
# private `_dataset` in WithOptionsIterDataset (DatasetOptions(min_shm_size=...)).
RASTER = """
from absl import flags; flags.FLAGS.mark_as_parsed()
import json, sys
import numpy as np
import grain

class RandomSample(grain.transforms.RandomMap):
  def random_map(self, sample_id, rng):
    return np.full((1, 4, 4), sample_id / 10.0, np.float32) + rng.uniform(size=(1, 4, 4)).astype(np.float32)

def get_dataloader(worker_count, wrap):
  source = grain.sources.RangeDataSource(0, 10, 1)
  sampler = grain.samplers.IndexSampler(num_records=10, num_epochs=None, shuffle=False, seed=42)
  dl = grain.DataLoader(data_source=source, sampler=sampler,
                        operations=[RandomSample(), grain.transforms.Batch(batch_size=4, drop_remainder=True)],
                        worker_count=worker_count, worker_buffer_size=1)
  if wrap:
    dl._dataset = grain.experimental.WithOptionsIterDataset(
        dl._dataset, grain.experimental.DatasetOptions(min_shm_size=sys.maxsize))
  return dl

if __name__ == "__main__":
  workers = int(sys.argv[1])
  out = {"has_dataset": hasattr(get_dataloader(0, False), "_dataset")}
  for wrap in (False, True):
    it = iter(get_dataloader(workers, wrap))
    first = [np.round(next(it), 4).tolist() for _ in range(2)]
    state = it.get_state()
    after = [np.round(next(it), 4).tolist() for _ in range(2)]
    resumed = iter(get_dataloader(workers, wrap))
    resumed.set_state(state)
    out[str(wrap)] = {"first": first, "after": after, "resumed": [np.round(next(resumed), 4).tolist() for _ in range(2)]}
  print(json.dumps(out))
"""


def test_data_loader_dataset_can_be_wrapped_as_in_grain(tmp_path):
  g = porting.run_script(RASTER, "grain", tmp_path, "0")
  l = porting.run_script(RASTER, "loader", tmp_path, "0")
  assert l == g and g["has_dataset"]
  assert g["True"] == g["False"] and g["True"]["resumed"] == g["True"]["after"]
  # With workers, loader's stream is the one of 0 workers (README "Porting from Grain").
  assert porting.run_script(RASTER, "loader", tmp_path, "2") == l


# Clients catch NotImplementedError around apply_transformations (Grain's type
# for a plain function); loader's error is also the TypeError it raised before.
APPLY_PLAIN_FUNCTION = """
import grain
for name, call in [("apply", lambda: grain.MapDataset.range(3).apply([lambda x: x * 2])),
                   ("apply_transformations", lambda: grain.experimental.apply_transformations(
                       grain.MapDataset.range(3).to_iter_dataset(), [lambda x: x * 2]))]:
  try:
    call()
    print(name, "applied")
  except NotImplementedError:
    print(name, "NotImplementedError")
"""


def test_apply_of_a_plain_function_is_grains_not_implemented_error(tmp_path):
  g = porting.assert_prints_the_same(APPLY_PLAIN_FUNCTION, tmp_path)
  assert g.split() == ["apply", "NotImplementedError", "apply_transformations", "NotImplementedError"]
