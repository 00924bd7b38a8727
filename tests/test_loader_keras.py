"""Keras 3's `model.fit` / `evaluate` / `predict` on loader datasets, as on Grain's.

Keras recognises Grain datasets by class name and module, then by
`isinstance` against Grain's classes (keras/src/trainers/data_adapters);
loader's datasets pass both when Grain is installed (loader/grain_interop.py).
The same script runs on Grain and, with only the import changed, on loader.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import porting

KERAS_FIT = """
import json
import os
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
import keras
import grain

x = np.random.RandomState(0).rand(64, 4).astype("float32")
y = (x.sum(1) > 2).astype("float32")
rows = [(x[i], y[i]) for i in range(64)]
out = {}
for kind in ("map", "iter"):
  ds = grain.MapDataset.source(rows).shuffle(seed=3)
  if kind == "map":
    ds = ds.batch(8)
  else:
    ds = ds.to_iter_dataset().batch(8)
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
  model.compile("sgd", "binary_crossentropy")
  history = model.fit(ds, epochs=2, verbose=0)
  out[kind] = {"loss": [round(v, 5) for v in history.history["loss"]],
               "eval": round(float(model.evaluate(ds, verbose=0)), 5),
               "predict": list(model.predict(ds, verbose=0).shape)}
print(json.dumps(out))
"""


def test_keras_fit_evaluate_predict_take_loader_datasets(tmp_path):
  got = {}
  for lib in porting.LIBS:
    d = tmp_path / lib
    d.mkdir()
    got[lib] = porting.run_script(KERAS_FIT, lib, d, timeout=600)
  assert got["loader"] == got["grain"]
  assert got["loader"]["map"]["predict"] == [64, 1]


@pytest.mark.parametrize("first", ["loader", "grain"])
def test_grain_classes_recognise_loader_datasets_whichever_is_imported_first(first):
  second = "grain" if first == "loader" else "loader"
  code = (f"import sys, {first}\n"
          f"assert '{second}' not in sys.modules\n"
          f"import {second}\n"
          "ds = loader.MapDataset.range(4)\n"
          "assert isinstance(ds, grain.MapDataset) and isinstance(ds.to_iter_dataset(), grain.IterDataset)\n"
          "assert not isinstance(grain.MapDataset.range(4), loader.MapDataset)\n"
          "print('ok')\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": porting.REPO})
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
