# On the GPU machine (device tool), from the repo root: Nsight Compute on quantize_pair_grouped_kernel (fp8_gmm's
# backward's grouped quantisation of a (32768, 4096) bf16 operand, 32 groups; issue 15). Under $OUT.
#   bash docs/experiments/quantize_ncu.sh
python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
cat > /tmp/q.py <<'P'
import jax, jax.numpy as jnp, torch
from jgmm import bench, fp8, timing
gs = bench.Inputs(32768, 128, 128, 32).group_sizes
blocks, _ = fp8._padded_groups(gs, 32768)
x = jax.random.normal(jax.random.key(0), (32768, 4096), jnp.bfloat16)
f = jax.jit(lambda a: fp8._quantize_pair_grouped_p(a, blocks, dtype=jnp.float8_e4m3fn, backend=None))
timing.jax_sync(f(x))
torch.cuda.cudart().cudaProfilerStart(); timing.jax_sync(f(x)); torch.cuda.cudart().cudaProfilerStop()
P
ncu --clock-control none --profile-from-start off --target-processes all -k regex:quantize --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters -o $OUT/q -f python /tmp/q.py > $OUT/run.log 2>&1
ncu -i $OUT/q.ncu-rep --page details --print-units base > $OUT/details.txt 2>&1
ncu -i $OUT/q.ncu-rep --page source --csv --print-source sass > $OUT/src.csv 2>/dev/null
tail -2 $OUT/run.log; grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Block Limit" $OUT/details.txt
