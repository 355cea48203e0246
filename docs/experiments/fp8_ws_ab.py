"""A/B: FP8 v1 (gmm_fp8.py's persistent kernels, FP8 v1's default configs) against the warp-specialised FP8 kernel
(gmm_fp8_ws.py, Config.warp_specialized) with S stages and 128- or 256-wide tiles, on `python -m jgmm.bench --fp8`'s masked and contiguous
(K-major rhs) cases, DeepSeek-V3 blocks (1x128 / 128x128) and rowwise scales, timed interleaved; TFLOP/s on the
valid rows. Each variant's output is compared with v1's (DeepGEMM's 1 - 2 sum(xy) / sum(x^2 + y^2)).
    python docs/experiments/fp8_ws_ab.py [name,...]   (names as bench_fp8's, e.g. masked-1x1024-4096-7168)"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import bench_fp8, oracle, quantize, timing
from jgmm.config import Config

V1 = {False: Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, tma=False),
      True: Config(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=5, tma=False)}  # rows <= 64
WS = {**{f"ws_s{s}": Config(block_m=128, block_n=128, block_k=128, num_stages=s, warp_specialized=True)
         for s in (4, 5)},
      "ws_256_s3": Config(block_m=128, block_n=256, block_k=128, num_stages=3, warp_specialized=True)}
RECIPES = {"blocks": ("1x128", "128x128"), "rowwise": ("row", "row")}

wanted = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else None
rows_out = []
for layout, grid in (("masked", bench_fp8.MASKED_CASES), ("contiguous", bench_fp8.CONTIGUOUS_CASES)):
  for g, rows in grid:
    for n, k in bench_fp8.SHAPES:
      name = f"{layout}-{g}x{rows}-{n}-{k}"
      if wanted and name not in wanted:
        continue
      x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
      groups = jnp.asarray(groups)
      for recipe, (xr, wr) in RECIPES.items():
        (xq, xs), (wq, ws) = quantize.quantize(x, xr), quantize.quantize(w, wr)
        fns, ref = {}, None
        for cname, config in {"v1": V1[rows <= 64], **WS}.items():
          f = jax.jit(bench_fp8._product(layout, rows, config))
          args = (xq, wq, groups, xs, ws)
          try:
            out = np.asarray(f(*args), np.float32)
          except Exception as e:  # noqa: BLE001 - a variant that fails is reported and left out
            print(f"{name} {recipe} {cname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
          ref = out if ref is None else ref
          print(f"{name} {recipe} {cname}: diff vs v1 {oracle.deepgemm_diff(out, ref):.1e}", flush=True)
          fns[cname] = (lambda f=f, args=args: f(*args), timing.jax_sync)
        ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=5)
        tflops = {c: 2 * valid * n * k / t / 1e9 for c, t in ms.items()}
        rows_out.append((name, recipe, tflops))
        print(f"{name} {recipe}: " + ", ".join(f"{c} {v:.0f}" for c, v in tflops.items()), flush=True)

print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows")
print("| case | scales | v1 | " + " | ".join(WS) + " | best ws / v1 |")
print("|---|---|---|" + "---|" * len(WS) + "---|")
for name, recipe, t in rows_out:
  best = max((t[c] for c in WS if c in t), default=float("nan"))
  print(f"| {name} | {recipe} | {t.get('v1', float('nan')):.0f} | "
        + " | ".join(f"{t[c]:.0f}" if c in t else "-" for c in WS) + f" | {best / t.get('v1', float('nan')):.2f}x |")
