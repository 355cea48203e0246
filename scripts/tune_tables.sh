#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root: one call's worth of tuning this GPU's table for the four
# shipped model configs (examples/models: Mixtral, DeepSeek-V3, Qwen3-MoE, gpt-oss) at --ep 1,8 and 1..16384
# tokens, forward and backward ops (gmm, gmm_t, tgmm, masked). Rerun it until it says every key is tuned: each run
# resumes where the last stopped.
#   bash scripts/tune_tables.sh [TABLE]    TABLE: default configs/<this GPU's table name>, e.g.
#                                          configs/sm90-nvidia_h100_80gb_hbm3.json
#   TIME_LIMIT=420: the tuner's --time-limit (seconds); BENCH=1: then python -m jgmm.bench_tuned (each key tuned vs
#   the heuristic, and the geomean) for what is left of BUDGET=540 seconds; JOBS: the tuner's --jobs (default: the
#   CPU cores less two, the timing worker's and the tuner's); TUNE_ARGS: more tuner options, e.g. to tune from
#   another GPU's choices: TUNE_ARGS="--space none --seed-table configs/sm90-nvidia_h100_80gb_hbm3.json", or the
#   models' FP8 calls too (jgmm.fp8_gmm's forward and backward, FP8 masked): TUNE_ARGS="--fp8 1x128-128x128".
#   RECHECK=1: instead, jgmm-tune --recheck TABLE (its entries that differ from the heuristic's config, timed against
#   it again: kept or replaced) into /tmp/jgmm-recheck/<TABLE's name> (a rerun on the same, warm machine resumes),
#   copied to $OUT.
# A TABLE that does not exist yet starts as a copy of the table this GPU reads now (e.g. configs/sm90.json on an
# H200), whose entries it would otherwise hide (a GPU reads the first of configs/<arch>-<model>.json and
# configs/<arch>.json that exists). With $OUT set (the device tool's folder that comes back), the tuner writes
# $OUT/<TABLE's name>, starting from TABLE: copy it over TABLE before the next run.
set -uo pipefail
out=${OUT:-}
log_dir=${out:-/tmp/jgmm-out}
mkdir -p "$log_dir"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=${TQDM_MININTERVAL:-20}
python -m pip install -q --no-deps --no-build-isolation -e . >"$log_dir/install.log" 2>&1 || { cat "$log_dir/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# This GPU's table name, and the table it reads now (to start a missing TABLE from).
read -r name shipped < <(python - <<'EOF'
import os
from jgmm import backend_triton, config_table
gpu = backend_triton._device()
names = config_table.table_files(gpu.arch, gpu.kind)
print(names[0], next((f"configs/{n}" for n in names if os.path.exists(f"configs/{n}")), "-"))
EOF
)
table=${1:-configs/$name}
if [[ ! -e $table && $shipped != - ]]; then
  cp "$shipped" "$table"
  echo "started $table from $shipped"
fi
common=(--time-limit "${TIME_LIMIT:-420}" --jobs "${JOBS:-$(( $(nproc) - 2 ))}"
        --profile-file "$log_dir/tune-profile.jsonl")
if [[ ${RECHECK:-0} == 1 ]]; then
  output=/tmp/jgmm-recheck/$(basename "$table")  # starts as TABLE: its entries equal to TABLE's are still to recheck
  mkdir -p /tmp/jgmm-recheck
  [[ -e $output ]] || cp "$table" "$output"
  python -m jgmm.tune --recheck "$table" --output "$output" "${common[@]}" ${TUNE_ARGS:-} 2>&1 | tee "$log_dir/tune.log"
  if [[ -n $out ]]; then cp "$output" "$out/"; output=$out/$(basename "$table"); fi
else
  output=$table
  if [[ -n $out ]]; then
    output=$out/$(basename "$table")
    if [[ -e $table ]]; then cp "$table" "$output"; fi
  fi
  models=(examples/models/{mixtral-8x7b,deepseek-v3,qwen3-30b-a3b,gpt-oss-20b}.json)
  python -m jgmm.tune "${models[@]/#/--model-config=}" --ep 1,8 --tokens 1,16,64,256,1024,4096,16384 \
    --output "$output" "${common[@]}" ${TUNE_ARGS:-} 2>&1 | tee "$log_dir/tune.log"
fi
left=$(( ${BUDGET:-540} - SECONDS ))
if [[ ${BENCH:-0} == 1 && $left -gt 60 ]]; then
  python -m jgmm.bench_tuned --table "$output" --time-limit $(( left - 45 )) --out "$log_dir/bench_tuned.json" \
    2>&1 | tee "$log_dir/bench_tuned.log"
fi
echo "$(grep -oE '(tun|recheck)ed [0-9]+ of [0-9]+ keys.*' "$log_dir/tune.log" | tail -n 1); table: $output${out:+ (copy it to $table)}"
