# On the GPU machine (device tool), from the repo root: the owed FP8 GPU tests, then fp8_profile.py's timing and two
# Nsight Compute passes over gmm_fp8_ws_kernel (issue 15). Reports and tables under $OUT.
#   STEPS="tests time ncu src" bash docs/experiments/fp8_profile.sh
set -x
steps=${STEPS:-tests time ncu src}
python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit --format=csv,noheader
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [[ $steps == *tests* ]]; then
  python -m pytest -q -rf -n 6 -p no:cacheprovider tests/test_fp8_kernels.py tests/test_quantize_pair.py tests/test_bench.py \
    tests/test_fp8_recipe.py tests/test_fp8.py tests/test_grouped_matmul.py 2>&1 | tee $OUT/pytest.log | tail -n 8
fi
[[ $steps == *time* ]] && python docs/experiments/fp8_profile.py time 2>&1 | grep -v Warning | tee $OUT/time.log
metrics=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,sm__cycles_elapsed.avg.per_second,launch__registers_per_thread,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_wait
if [[ $steps == *ncu* ]]; then
  ncu --clock-control none --profile-from-start off --target-processes all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics $metrics -o $OUT/fp8 -f python docs/experiments/fp8_profile.py ncu > $OUT/ncu_run.log 2>&1
  grep profiled $OUT/ncu_run.log; tail -3 $OUT/ncu_run.log
  bash docs/experiments/ncu_tables.sh $OUT/fp8.ncu-rep $metrics
fi
if [[ $steps == *src* ]]; then  # Stall reasons per SASS instruction of the contiguous case's block-scaled kernels.
  ncu --clock-control none --profile-from-start off --target-processes all -k regex:fp8_ws --launch-count 2 \
    --section SourceCounters --section WarpStateStats -o $OUT/src -f \
    python docs/experiments/fp8_profile.py ncu blocks_128_s4,blocks_256_s3 > $OUT/src_run.log 2>&1
  tail -3 $OUT/src_run.log
  ncu -i $OUT/src.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2> $OUT/src_err.log
  ls -la $OUT; head -c 600 $OUT/src_err.log
fi
