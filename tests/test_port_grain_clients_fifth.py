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
  source = globals()[name]
  grain_out = porting.script_output(source, "grain", tmp_path)
  loader_out = porting.script_output(source, "loader", tmp_path)
  assert grain_out.strip(), "the script printed nothing"
  assert loader_out == grain_out
