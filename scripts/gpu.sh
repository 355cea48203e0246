#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root, in one call: install, the GPU tests, the demo,
# the bridge's overhead benchmark, then the grouped-GEMM benchmark, whose table prints last.
#   bash scripts/gpu.sh            (writes logs and JSON under $OUT when set)
#   STEPS=tests bash scripts/gpu.sh / STEPS=bench bash scripts/gpu.sh: one half, where one call's time limit
#   cannot hold both.
set -uo pipefail
out=${OUT:-/tmp/jgmm-out}
steps=${STEPS:-tests bench}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [[ $steps == *tests* ]]; then
  python -m pytest -q -p no:cacheprovider tests ${PYTEST_ARGS:-} 2>&1 | tee "$out/pytest.log" | tail -n 25
fi
if [[ $steps == *bench* ]]; then
  python -m jgmm 2>&1 | tee "$out/demo.log"
  python -m jgmm.bench_ffi 2>&1 | tee "$out/bench_ffi.log"
  python -m jgmm.bench --out "$out" 2>&1 | tee "$out/bench.log"
fi
