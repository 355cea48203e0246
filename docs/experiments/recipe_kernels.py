"""Every GPU kernel of one fp8_gmm forward+backward (weights quantised ahead) and of the bf16 gmm's, with its time,
on the dsv3 cases (issue 15): where the recipe's time goes, fusions and copies included. The kernels' own times
from JAX's profiler (jgmm.timing.traced_kernels), the third call of each (two warm-ups), the caches as the calls
leave them.

    python docs/experiments/recipe_kernels.py [WGRAD_SCALE]

WGRAD_SCALE: fp8_gmm's wgrad_scale, "128x1" (the default) or "group".
"""
import sys

import jax

import jgmm
from jgmm import bench, timing

wgrad_scale = sys.argv[1] if len(sys.argv) > 1 else "128x1"
for name, m, k, n, g in bench.CASES:
  if name not in ("dsv3-ep8-gateup", "dsv3-ep8-down"):
    continue
  inp = bench.Inputs(m, k, n, g)
  fp8 = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights, wgrad_scale=wgrad_scale))
  bf16 = bench.fwd_bwd(jgmm.gmm)
  args = (inp.x, inp.w, inp.group_sizes, inp.dout)
  weights = jax.jit(jgmm.quantize_weights)(inp.w)
  for label, call in (("fp8", lambda: timing.jax_sync(fp8(*args, weights))),
                      ("bf16", lambda: timing.jax_sync(bf16(*args)))):
    call()
    call()
    kernels = timing.traced_kernels(call)
    print(f"\n# {name} {label}: {len(kernels)} kernels, {sum(ms for _, ms in kernels) * 1e3:.0f} us")
    for kernel, ms in kernels:
      print(f"{ms * 1e3:9.1f} us  {kernel[:110]}")
