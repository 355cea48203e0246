"""The FP8 tgmm's per-tile overhead (issue 15): fp8_gmm's weight-gradient product at M = 32768 on the dsv3 down
shape (K 2048, N 7168) and gate-up's (K 7168, N 4096) with G = 32, 16, 8, 4 groups of equal size (multiples of 128
rows: no zeroing), i.e. 8 to 64 reduction steps per output tile, the same FLOPs; the output shrinks with G.

python docs/experiments/tgmm_fp8_groups.py   (GPU; TFLOP/s of the table's FP8 tgmm and the bf16 tgmm per G)
"""
import jax
import jax.numpy as jnp

import jgmm
from jgmm import quantize, timing

M = int(__import__("os").environ.get("M", 32768))
if __name__ == "__main__":
  print("device:", jax.devices()[0].device_kind, flush=True)
  for k, n in ((2048, 7168), (7168, 4096)):
    kx, kd = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (M, k), jnp.bfloat16)
    dout = jax.random.normal(kd, (M, n), jnp.bfloat16)
    q = jax.jit(lambda a: quantize.quantize(a.T, "1x128"))
    (xt, xs), (dt, ds) = q(x), q(dout)
    for g in (32, 16, 8, 4):
      gs = jnp.full((g,), M // g, jnp.int32)
      fp8 = jax.jit(lambda a, sa, b, sb, gs: jgmm.tgmm(a, b, gs, lhs_scale=sa, rhs_scale=sb, transpose_rhs=True,
                                                        preferred_element_type=jnp.bfloat16))
      bf16 = jax.jit(lambda a, b, gs: jgmm.tgmm(a, b, gs, transpose_lhs=True))
      ms = timing.time_interleaved({"fp8": (lambda: fp8(xt, xs, dt, ds, gs), timing.jax_sync),
                                    "bf16": (lambda: bf16(x, dout, gs), timing.jax_sync)},
                                   min_batch_s=0.03, batches=7)
      flops = 2 * M * k * n
      print(f"K {k} N {n} G {g:2d} steps/tile {M // g // 128:3d} out {g * k * n * 2 / 1e9:.2f} GB: "
            + ", ".join(f"{name} {t:.3f} ms {flops / t / 1e9:.0f} TFLOP/s" for name, t in ms.items()), flush=True)
