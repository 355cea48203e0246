set -x
python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit --format=csv,noheader
which ncu; ncu --version | tail -1
export PYTHONUNBUFFERED=1
[[ ${TESTS:-} ]] && python -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k "$TESTS" 2>&1 | tail -n 15
[[ ${SKIP_TIME:-} ]] || python docs/experiments/qwen3_profile.py time 2>&1 | grep -v Warning
[[ ${SKIP_NCU:-} ]] && exit 0
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # Else ncu backs up ~100 GB of preallocated memory at every replay pass.
ncu --clock-control none --profile-from-start off --target-processes all \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,sm__cycles_elapsed.avg.per_second \
  -o $OUT/q3 -f python docs/experiments/qwen3_profile.py ncu > $OUT/ncu_run.log 2>&1
tail -5 $OUT/ncu_run.log
ncu -i $OUT/q3.ncu-rep --page details --print-units base > $OUT/details.txt 2>&1
ncu -i $OUT/q3.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__registers_per_thread > $OUT/raw.csv 2>&1
python - <<'P'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/raw.csv")))
for r in rows: print(" | ".join(x[:40] for x in r))
P
