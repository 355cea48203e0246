"""quantize_pair and fp8_gmm's grouped quantize_pair (1x128) on the dsv3 operands under num_warps 4, 8 and 16
(issue 15): GB/s of each, interleaved. (Commit 2031212 also tried maxnreg 168 and 128: no gain.)

    python docs/experiments/quantize_warps.py
"""
from unittest import mock

import jax
import jax.numpy as jnp

import jgmm
from jgmm import bench, fp8, timing
from jgmm.triton_kernels import quantize as quantize_kernels

print("device:", jax.devices()[0].device_kind, flush=True)
gs = bench.Inputs(32768, 128, 128, 32).group_sizes
blocks, _ = fp8._padded_groups(gs, 32768)
for cols in (4096, 7168):
  x = jax.random.normal(jax.random.key(0), (32768, cols), jnp.bfloat16)
  fns = {}
  for warps in (4, 8, 16):
    with mock.patch.object(quantize_kernels, "NUM_WARPS", warps):
      grouped = jax.jit(lambda a: fp8._quantize_pair_grouped_p(a, blocks, dtype=jnp.float8_e4m3fn,
                                                               backend=None)).trace(x).lower().compile()
      pair = jax.jit(lambda a: jgmm.quantize_pair(a, "1x128")).trace(x).lower().compile()
    label = f"w{warps}"
    fns[f"grouped {label}"] = (lambda f=grouped: f(x), timing.jax_sync)
    fns[f"pair {label}"] = (lambda f=pair: f(x), timing.jax_sync)
  ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=5)
  for label, t in ms.items():
    print(f"  (32768, {cols}) {label:16s} {t * 1e3:7.1f} us {4 * x.size / t / 1e6:6.0f} GB/s", flush=True)
