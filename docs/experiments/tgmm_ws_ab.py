"""A/B: the weight gradient (tgmm, lhs (M, K) read transposed) of jgmm.bench's cases through the table's config (this
GPU's table), tgmm_kernel ("plain", the tables' choice before session 26) and the warp-specialised tgmm
(triton_kernels/tgmm_ws.py) in several tilings, timed interleaved. Issue 17, session 26. CONFIG "table@bB": the
table's config with band_tiles B (session 39: the tile order).

    python docs/experiments/tgmm_ws_ab.py [CASE,...] [CONFIG,...]
"""
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved

WS = {
    "plain": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, tma=False),  # tgmm_kernel
    "ws256s3": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True),
    "ws128s5": Config(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, warp_specialized=True),
    "ws256k32s6": Config(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=6, warp_specialized=True),
}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in CASES if c[0] != "decode-small"]
picked = sys.argv[2].split(",") if len(sys.argv) > 2 else list(WS)
device = backend_triton._device()
rows = []
for name, m, k, n, g in [c for c in CASES if c[0] in names]:
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  table = config_table.select(config_table.make_key("tgmm", "bfloat16", "bfloat16", m / g, k, n, g, transpose=True),
                              arch=device.arch, device_kind=device.kind).config
  fns, ref = {}, None
  variants = {c: dataclasses.replace(table, band_tiles=int(c[7:])) if c.startswith("table@b") else WS[c]
              for c in picked}
  for cname, config in {"table": table, **variants}.items():
    f = jax.jit(functools.partial(backend_triton.tgmm, existing_out=None, transpose_lhs=True, out_dtype=jnp.bfloat16,
                                  bias_grad=False, config=config))
    out = np.asarray(f(inp.x, inp.dout, bounds), np.float32)
    ref = out if ref is None else ref
    print(f"{name} {cname}: rel diff vs table {np.linalg.norm(out - ref) / np.linalg.norm(ref):.2e}", flush=True)
    fns[cname] = (functools.partial(f, inp.x, inp.dout, bounds), jax_sync)
  ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
  sol = speed_of_light_ms(m, k, n, g)
  rows += [(name, c, t, 100 * sol / t, ms["table"] / t) for c, t in ms.items()]
print(f"\n{device.kind}; table: {table}")
print("| case | config | ms | %SOL | speedup vs table |\n|---|---|---|---|---|")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f}% | {r[4]:.3f} |")
