# On the GPU machine (device tool), from the repo root: Nsight Compute over docs/experiments/bf16_ncu.py's kernels
# (issue 17). Per kernel: time, SM clock, tensor-pipe activity, L2 and DRAM rates, registers, instructions executed
# (and the instruction mix, InstructionStats: what a kernel issues beside its MMAs, session 41's energy question), and
# the warp-state stall breakdown (details.txt). Reports under $OUT. SRC=1: instead, stall samples per SASS
# instruction (src.csv) of the first two gmm_ws kernels of those cases (the one-CTA warp-specialised kernel, where the
# table picks it).
#   bash docs/experiments/bf16_ncu.sh [CASE,...]
#   SRC=1 bash docs/experiments/bf16_ncu.sh [CASE,...]
set -x
python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [[ -n ${SRC:-} ]]; then
  ncu --clock-control none --profile-from-start off --target-processes all -k regex:gmm_ws --launch-count 2 \
    --section SourceCounters --section WarpStateStats -o $OUT/src -f python docs/experiments/bf16_ncu.py "$@" \
    > $OUT/src_run.log 2>&1
  tail -3 $OUT/src_run.log
  ncu -i $OUT/src.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2> $OUT/src_err.log
  exit
fi
metrics=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,launch__registers_per_thread,launch__grid_size,smsp__inst_executed.sum
ncu --clock-control none --profile-from-start off --target-processes all \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --metrics $metrics \
  -o $OUT/bf16 -f python docs/experiments/bf16_ncu.py "$@" > $OUT/ncu_run.log 2>&1
grep -v Warning $OUT/ncu_run.log | grep -i "GFLOP\|profiled\|error" ; tail -3 $OUT/ncu_run.log
bash docs/experiments/ncu_tables.sh $OUT/bf16.ncu-rep $metrics
