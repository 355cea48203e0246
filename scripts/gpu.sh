#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root, in one call: install, the GPU tests, the demo,
# the bridge's overhead benchmark, the grouped-GEMM benchmark and the heterogeneous one (about 8 minutes on an H100).
#   bash scripts/gpu.sh            (writes logs and JSON under $OUT when set)
#   STEPS=tests bash scripts/gpu.sh / STEPS=bench bash scripts/gpu.sh: one half, where one call's time limit
#   cannot hold both. SUSTAINED=SECONDS: the grouped-GEMM benchmark's --sustained table too (~2.5 minutes more at 1).
#   SHARD=I/N: every N-th test from the I-th only (tests/sharding.py), so that a suite longer than a call runs in N.
set -uo pipefail
out=${OUT:-/tmp/jgmm-out}
steps=${STEPS:-tests bench}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [[ $steps == *tests* ]]; then
  # Several test processes share the GPU (tests/conftest.py turns off jax's up-front allocation): one process took
  # more than a call's 10 minutes in session 10, six took 5. Under Triton 3.9 and jax 0.12 (scripts/gpu_triton39.sh)
  # the suite without test_fuzz took 510-545 s with TEST_WORKERS=14 on an H200 (sessions 38, 43): set it there, with
  # SHARD=0/2 and SHARD=1/2 in two calls.
  python -m pytest -q -rf -n "${TEST_WORKERS:-6}" -p no:cacheprovider ${SHARD:+--shard=$SHARD} tests ${PYTEST_ARGS:-} \
    2>&1 | tee "$out/pytest.log" | tail -n 25
fi
if [[ $steps == *bench* ]]; then
  python -m jgmm 2>&1 | tee "$out/demo.log"
  python -m jgmm.bench_ffi 2>&1 | tee "$out/bench_ffi.log"
  python -m jgmm.bench --ragged-cap "${RAGGED_CAP:-0.1}" --sustained "${SUSTAINED:-0}" --out "$out" 2>&1 \
    | tee "$out/bench.log"
  python -m jgmm.bench_hetero 2>&1 | tee "$out/bench_hetero.log"
fi
