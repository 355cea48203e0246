# On the GPU machine (device tool), from the repo root: Nsight Compute on tgmm_fp8_ws_kernel (fp8_gmm's d rhs of the
# dsv3 shapes; issue 15): speed of light, warp states and stall reasons per SASS instruction. Under $OUT.
#   KERNELS=tree bash docs/experiments/tgmm_fp8_ncu.sh
python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
metrics=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,dram__bytes_write.sum.per_second,sm__cycles_elapsed.avg.per_second,launch__registers_per_thread
ncu --clock-control none --profile-from-start off --target-processes all -k regex:tgmm_fp8 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
  --metrics $metrics -o $OUT/tgmm -f python docs/experiments/tgmm_fp8_ab.py ncu ${KERNELS:-tree} > $OUT/run.log 2>&1
tail -4 $OUT/run.log
ncu -i $OUT/tgmm.ncu-rep --page details --print-units base > $OUT/details.txt 2>&1
ncu -i $OUT/tgmm.ncu-rep --page raw --csv --metrics $metrics > $OUT/raw.csv 2>&1
ncu -i $OUT/tgmm.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2> $OUT/src_err.log
ls -la $OUT
