"""fp8_gmm's forward+backward with wgrad_scale="group" in both weights' layouts, bf16's beside it, interleaved,
weights quantised ahead (issue 15, the recipe's 1.3x on dsv3-ep8-down).

Session 33 ran it twice. Before the narrower operand was chosen (the layout decided: weights (G, K, N) scaled dout^T
(M x N), (G, N, K) lhs^T (M x K)), the same case in both layouts sized what scaling the other operand would gain,
the tgmm's output layout aside. After (both layouts scale the narrower; the tgmm stores its tiles transposed where
the weights' layout is the other one), it measures what the transposed store costs against the natural one.

    python docs/experiments/wgrad_layout_ab.py [CASES]     CASES: bench.CASES names, default the dsv3 pair
"""
import sys

import jax
import jax.numpy as jnp

import jgmm
from jgmm import bench, timing

wanted = sys.argv[1].split(",") if len(sys.argv) > 1 else ["dsv3-ep8-gateup", "dsv3-ep8-down"]
print(f"device: {jax.devices()[0].device_kind}")
for name, m, k, n, g in bench.CASES:
  if name not in wanted:
    continue
  inp = bench.Inputs(m, k, n, g)
  w_nk = jnp.swapaxes(inp.w, 1, 2)
  fns = {}
  for layout, w, transpose_rhs in (("kn", inp.w, False), ("nk", w_nk, True)):
    weights = jax.jit(jgmm.quantize_weights, static_argnames="transpose_rhs")(w, transpose_rhs=transpose_rhs)
    fp8 = bench.fwd_bwd(lambda x, w, gs, weights, t=transpose_rhs: jgmm.fp8_gmm(
        x, w, gs, transpose_rhs=t, rhs_fp8=weights, wgrad_scale="group"))
    bf16 = bench.fwd_bwd(lambda x, w, gs, t=transpose_rhs: jgmm.gmm(x, w, gs, transpose_rhs=t))
    args = (inp.x, w, inp.group_sizes, inp.dout)
    fns[f"fp8 group {layout}"] = (lambda f=fp8, a=args, wq=weights: f(*a, wq), timing.jax_sync)
    fns[f"bf16 {layout}"] = (lambda f=bf16, a=args: f(*a), timing.jax_sync)
  ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=7)
  print(f"{name}: " + ", ".join(f"{i} {t:.3f} ms" for i, t in ms.items())
        + f"; fp8 nk / kn {ms['fp8 group nk'] / ms['fp8 group kn']:.3f}"
        + f"; speedup kn {ms['bf16 kn'] / ms['fp8 group kn']:.3f}x, nk {ms['bf16 nk'] / ms['fp8 group nk']:.3f}x",
        flush=True)
