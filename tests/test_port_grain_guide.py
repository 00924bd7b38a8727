"""The Grain + ArrayRecord guide's code, on Grain 0.2.18 and, with only the import line changed, on loader.

Source: "Building High-Performance Data Pipelines with Grain and ArrayRecord"
(developers.googleblog.com, Oct 2025). Its steps: (1) convert TFRecord shards
of tf.train.Example to ArrayRecord with Apache Beam; (2) read them with
`grain.sources.ArrayRecordDataSource`, `MapDataset.source(...).shuffle(seed)
.map(parse).batch(drop_remainder=True)`, `to_iter_dataset()` and
`mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=...))`;
(3) checkpoint the data iterator together with the model state through Orbax
(`grain.checkpoint.CheckpointSave` / `CheckpointRestore` in an
`ocp.args.Composite`) and resume. The snippets below follow those steps with
the guide's API calls (the page's exact text was not at hand, so the parse
function and names are this test's); sizes are shrunk. Step 1 uses this
toolkit's drop-in for `array_record.beam.pipelines`.

The shuffle is Grain's, so loader's batches must equal Grain's exactly, with
the guide's worker processes too: its batches are made in the MapDataset,
before `mp_prefetch`, so Grain's workers read whole batches and Grain takes
them in turn, which is loader's order. (Grain's batches depend on the worker
count, a deliberate difference, where a batch is made of a worker's slice of
the records, as `IterDataset.batch` or DataLoader operations are; not here.)
Within a library, a restored iterator must continue exactly where the
checkpoint was taken.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import porting
from tests.porting import plain, structure

NUM_RECORDS = 96  # 3 batches of 32 per epoch: drop_remainder drops nothing, whatever the shuffle.


def _example(i: int) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  # The guide's data is tf.train.Example.
  image = ((np.arange(64) + i) % 256).astype(np.uint8).tobytes()
  return tf.train.Example(features=tf.train.Features(feature={
      "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
  })).SerializeToString()


@pytest.fixture(scope="module")
def array_record_files(tmp_path_factory):
  """Step 1 of the guide: TFRecord shards converted to ArrayRecord with a Beam pipeline."""
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  import pipelines  # pylint: disable=g-import-not-at-top
  from tests.conftest import write_tfrecords_tf  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp("guide")
  half = NUM_RECORDS // 2
  for shard in range(2):
    write_tfrecords_tf(str(root / "tfrecord" / f"train.tfrecord-{shard:05d}-of-00002"),
                       [_example(i) for i in range(shard * half, (shard + 1) * half)])
  pipeline = pipelines.convert_tf_to_arrayrecord_disk_match_shards(
      args={"input": str(root / "tfrecord" / "*"), "output": str(root / "array_record")},
      pipeline_options=PipelineOptions(["--runner", "DirectRunner"]))
  pipeline.run().wait_until_finish()
  return sorted(str(p) for p in (root / "array_record").glob("train.array_record-*"))


# Step 2: the input pipeline.
GUIDE_PIPELINE = """
from absl import flags
flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags.

import grain
import numpy as np
import tensorflow as tf

data_source = grain.sources.ArrayRecordDataSource(file_paths)


class ParseAndNormalize(grain.transforms.Map):
  \"\"\"Parses a serialized tf.train.Example into a normalized image and its label.\"\"\"

  def map(self, record):
    example = tf.train.Example.FromString(record)
    features = example.features.feature
    image = np.frombuffer(features["image"].bytes_list.value[0], dtype=np.uint8)
    image = image.reshape(8, 8, 1).astype(np.float32) / 255.0
    return {"image": image, "label": features["label"].int64_list.value[0]}


seed = 42
batch_size = 32

dataset = (
    grain.MapDataset.source(data_source)
    .shuffle(seed=seed)
    .map(ParseAndNormalize())
    .batch(batch_size=batch_size, drop_remainder=True)
)

multiprocessing_options = grain.multiprocessing.MultiprocessingOptions(num_workers=num_workers)
dataset = dataset.to_iter_dataset().mp_prefetch(multiprocessing_options)

batches = []
for batch in dataset:
  batches.append(batch)
"""


def test_guide_pipeline_reads_every_record_once_per_epoch(array_record_files):
  g, l = porting.run_both(GUIDE_PIPELINE, file_paths=array_record_files, num_workers=2)
  assert len(g.data_source) == len(l.data_source) == NUM_RECORDS
  assert g.data_source[5] == l.data_source[5] == _example(5)  # The raw record, exactly.
  assert len(g.batches) == len(l.batches) == NUM_RECORDS // 32
  assert [structure(b) for b in l.batches] == [structure(b) for b in g.batches] == [
      {"image": ((32, 8, 8, 1), "float32"), "label": ((32,), "int64")}] * 3
  labels = lambda ns: sorted(int(v) for b in ns.batches for v in b["label"])
  assert labels(g) == labels(l) == list(range(NUM_RECORDS))
  # Grain's shuffle, and the batches are made before mp_prefetch: Grain's
  # workers read whole batches, taken in turn, so the stream is loader's.
  assert plain(l.batches) == plain(g.batches)


# Step 3: checkpoint the data iterator with the model state, and resume.
GUIDE_CHECKPOINT = GUIDE_PIPELINE.replace("""
batches = []
for batch in dataset:
  batches.append(batch)
""", "").replace("""    .batch(batch_size=batch_size, drop_remainder=True)
)""", """    .batch(batch_size=batch_size, drop_remainder=True)
    .repeat()  # Several epochs, as in training.
)""") + """
import orbax.checkpoint as ocp

state = {"params": np.zeros(4, np.float32)}  # Stands for the train state.
mngr = ocp.CheckpointManager(
    checkpoint_dir, options=ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=2))

data_iterator = iter(dataset)
seen, states = [], {}
for step in range(1, 6):
  batch = next(data_iterator)
  state = {"params": state["params"] + batch["image"].mean()}
  seen.append(batch["label"])
  states[step] = state
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data_iter=grain.checkpoint.CheckpointSave(data_iterator)))
mngr.wait_until_finished()
saved_step = mngr.latest_step()
after_checkpoint = [next(data_iterator)["label"] for _ in range(4)]

# After a preemption: the same pipeline, restored from the latest checkpoint.
restored_iterator = iter(dataset)
restored = mngr.restore(saved_step, args=ocp.args.Composite(
    state=ocp.args.StandardRestore(state),
    data_iter=grain.checkpoint.CheckpointRestore(restored_iterator)))
after_restore = [next(restored_iterator)["label"] for _ in range(4)]
mngr.close()
"""


def test_guide_checkpoint_resumes_where_it_stopped(array_record_files, tmp_path):
  # In-process (num_workers=0) here: worker processes are covered above and in test_port_maxtext.py.
  results = [porting.run(GUIDE_CHECKPOINT, lib, file_paths=array_record_files, checkpoint_dir=str(tmp_path / lib),
                         num_workers=0) for lib in porting.LIBS]
  for ns in results:
    assert ns.saved_step == 4  # save_interval_steps=2: steps 2 and 4 were saved.
    # The checkpoint of step 4 resumes with step 5's batch.
    assert plain(ns.after_restore) == plain(ns.seen[4:] + ns.after_checkpoint[:3])
    np.testing.assert_array_equal(ns.restored["state"]["params"], ns.states[4]["params"])
    # Batches 1..5 then 5 more: every epoch (3 batches) holds each record once.
    stream = [int(v) for b in ns.seen + ns.after_checkpoint for v in b]
    for epoch in range(3):
      assert sorted(stream[epoch * 96:(epoch + 1) * 96]) == list(range(NUM_RECORDS))
  g, l = results
  assert len(g.seen) == len(l.seen)
  # In one process the shuffle is Grain's: the same labels at every step, before and after the restore.
  for name in ("seen", "after_checkpoint", "after_restore"):
    assert plain(getattr(l, name)) == plain(getattr(g, name)), name
  np.testing.assert_allclose(l.restored["state"]["params"], g.restored["state"]["params"], rtol=1e-6)
