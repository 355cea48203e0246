"""A/B of gmm_ws_kernel's L2 prefetch of the rhs tile PREFETCH steps ahead (JGMM_WS_PREFETCH, read when a call is
traced; 0: none), forward (gmm) and d lhs (gmm_t) of jgmm.bench's cases, in tile bands of 8 and row-major,
timed interleaved. Issue 17, session 26: grouping costs the kernel 5-16% against one group of all rows
(group_penalty.py), as if each step's weights came from HBM.

    python docs/experiments/prefetch_ab.py [CASE,...] [PREFETCH,...]
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved

names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down"]
distances = [int(d) for d in sys.argv[2].split(",")] if len(sys.argv) > 2 else [0, 4, 8]
rows = []
for name, m, k, n, g in [c for c in CASES if c[0] in names]:
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  for op in ("gmm", "gmm_t"):
    tr = op == "gmm_t"
    lhs = inp.dout if tr else inp.x
    kk, nn = (n, k) if tr else (k, n)
    fns, ref = {}, None
    for band in (8, 1):
      config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                      band_tiles=band)
      for d in distances:
        os.environ["JGMM_WS_PREFETCH"] = str(d)
        f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=tr,
                                      out_dtype=jnp.bfloat16, activation=None, save_preactivation=False,
                                      config=config))
        out = np.asarray(f(lhs, inp.w, bounds), np.float32)
        ref = out if ref is None else ref
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        print(f"{name} {op} band {band} prefetch {d}: rel diff {err:.1e}", flush=True)
        fns[f"band{band}_pf{d}"] = (functools.partial(f, lhs, inp.w, bounds), jax_sync)
    ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
    sol = speed_of_light_ms(m, kk, nn, g)
    for c, t in ms.items():
      base = ms[c.split("_")[0] + "_pf0"]
      rows.append((name, op, c, t, 100 * sol / t, base / t))
print("\n| case | op | variant | ms | %SOL | speedup vs no prefetch |\n|---|---|---|---|---|---|")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f}% | {r[5]:.3f} |")
