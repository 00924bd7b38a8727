#!/usr/bin/env bash
# Issue 11 item 6 in one call on a lent accelerator machine (never in CI):
#   bench/device.py, bench/diag_threads.py, examples/train_jax.py (with a checkpoint resume), then
#   bench/load.py's loader / Grain-batched / raw rows at that machine's core count.
# Wheels the machine lacks (array-record, grain, crc32c, portpicker) travel in
# .whl/ (see bench/README.md, "Accelerator"). Logs and JSON go to $OUT.
# DEVICE_ARGS / LOAD_ARGS add arguments (a CPU smoke run: DEVICE_ARGS="--models 1").
set -u -o pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
start=$SECONDS
stage() { echo "=== $1 (t=$((SECONDS - start)) s)"; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 - <<'EOF' 2>&1 | tee "$OUT/env.txt" || exit 1
import importlib.metadata as md, os, sys
import jax, array_record.python.array_record_module, crc32c, xxhash, psutil, cloudpickle
import loader
print(sys.version.split()[0], os.cpu_count(), "cores", jax.devices())
for n in ("jax", "jaxlib", "numpy", "array-record", "grain", "cloudpickle"):
  try:
    print(n, md.version(n))
  except md.PackageNotFoundError:
    print(n, "missing")
EOF

stage "bench/device.py"
timeout 240 python3 bench/device.py --json "$OUT/device.json" ${DEVICE_ARGS:-} 2>&1 | tee "$OUT/device.log"

stage "examples/train_jax.py"
rm -rf /tmp/ckpt
timeout 60 python3 examples/train_jax.py --data bench/data/device --steps 300 --batch-size 1024 \
  --workers 8 --log-every 50 --checkpoint /tmp/ckpt --checkpoint-every 150 2>&1 | tee "$OUT/train_jax.log"
timeout 60 python3 examples/train_jax.py --data bench/data/device --steps 600 --batch-size 1024 \
  --workers 8 --log-every 50 --checkpoint /tmp/ckpt --checkpoint-every 150 2>&1 | tee -a "$OUT/train_jax.log"

stage "bench/load.py"
# BUDGET: seconds for this whole script (a device call may run 600 s); load.py
# stops 40 s early, leaving the ceiling run below its time.
BUDGET=${BUDGET:-580}
left=$((BUDGET - 40 - (SECONDS - start)))
timeout $((left > 60 ? left : 60)) python3 bench/load.py --records 12500 --seconds 2 --warmup 0.5 \
  --sweep-seconds 1 --workloads nomap,map --systems loader,grain-batched,raw --startup-runs 1 \
  --slice-rounds 6 --slice-window 0.5 --timeout 60 --json "$OUT/load_device.json" ${LOAD_ARGS:-} 2>&1 | tee "$OUT/load.log"
stage "bench/diag_threads.py (the N-copies ceiling for bench/device.py's worker scaling)"
left=$((BUDGET - (SECONDS - start)))
timeout $((left > 20 ? left : 20)) python3 bench/diag_threads.py --skip-variants 2>&1 | tee "$OUT/diag_threads.log"
stage "done"
