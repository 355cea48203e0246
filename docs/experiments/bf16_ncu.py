"""Where the bf16 forward's time goes on the compute-bound cases (issue 17): each kernel of jgmm.gmm (the table's
choice), of its forward+backward, of torch._grouped_mm's forward and forward+backward and (session 44) of the dense
product of the forward's FLOPs (cuBLAS, the ceiling jgmm's forward is measured against), run once after a warm-up
between cudaProfilerStart/Stop for `ncu --profile-from-start off` (docs/experiments/bf16_ncu.sh), with each case's
forward FLOPs.

python docs/experiments/bf16_ncu.py [CASE,...]     (jgmm.bench's case names; default the three compute-bound ones)
"""
import sys

import jax

from jgmm import bench, timing

NAMES = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down"]

if __name__ == "__main__":
  import torch  # Its runtime's profiler switch covers the whole process.
  print(jax.devices()[0].device_kind, flush=True)
  runs = []
  for name, m, k, n, g in bench.CASES:
    if name not in NAMES:
      continue
    inp = bench.Inputs(m, k, n, g)
    jax_impls = bench._jax_impls(inp)
    (gmm_fwd, gmm_fwd_bwd), (dense_fwd, _) = jax_impls["jgmm"], jax_impls["dense_dot"]
    (torch_fwd, torch_fwd_bwd), _ = bench._torch_impls(inp, m, k, n, g)
    print(f"{name}: forward {2 * m * k * n / 1e9:.1f} GFLOP", flush=True)
    runs += [(name, "jgmm forward", gmm_fwd, timing.jax_sync), (name, "jgmm forward+backward", gmm_fwd_bwd,
                                                                 timing.jax_sync),
             (name, "torch._grouped_mm forward", torch_fwd, bench._torch_sync),
             (name, "torch._grouped_mm forward+backward", torch_fwd_bwd, bench._torch_sync),
             (name, "dense jnp.dot forward (the same FLOPs, one weight)", dense_fwd, timing.jax_sync)]
  for *_, f, sync in runs:  # Compiled and warm before the profiled pass.
    sync(f())
  torch.cuda.synchronize()
  torch.cuda.cudart().cudaProfilerStart()
  for *_, f, sync in runs:
    sync(f())
  torch.cuda.cudart().cudaProfilerStop()
  for i, (case, what, *_) in enumerate(runs):
    print(f"profiled {i}: {case} {what}")
