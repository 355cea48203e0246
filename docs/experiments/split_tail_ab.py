"""A/B: gmm_fp8_ws_kernel with its last partial wave split along K (gmm_fp8_ws.MAX_PARTS = 4, work_split) against
whole tiles only (MAX_PARTS = 1), on `python -m jgmm.bench --fp8`'s masked and contiguous cases, both recipes (the
tables' tilings), timed interleaved in one process as the benchmark times jgmm (timing.chain); TFLOP/s on the valid rows. Each case's
outputs are compared (DeepGEMM's 1 - 2 sum(xy) / sum(x^2 + y^2); the split tiles add their parts in another order).
    python docs/experiments/split_tail_ab.py [name,...]   (names as bench_fp8's, e.g. masked-1x1024-4096-7168)"""
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import bench_fp8, config_table, oracle, quantize, timing
from jgmm.triton_kernels import gmm_fp8_ws

table = []
for name, layout, g, rows, n, k in bench_fp8.cases(sys.argv[1] if len(sys.argv) > 1 else ""):
  x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
  runs = bench_fp8._runs(valid, n, k)
  for recipe in bench_fp8.RECIPES.values():
    x_recipe, w_recipe = config_table.FP8_RECIPES[recipe]
    args = (*quantize.quantize(x, x_recipe), *quantize.quantize(w, w_recipe), jnp.asarray(groups))
    fns, outs = {}, {}
    for variant, max_parts in (("whole", 1), ("split", 4)):
      with mock.patch.object(gmm_fp8_ws, "MAX_PARTS", max_parts):  # Read when the function is traced.
        fn = functools.partial(bench_fp8._chained(bench_fp8._product(layout, rows), runs), *args)
        outs[variant] = np.asarray(fn(), np.float32)
      fns[variant] = (fn, timing.jax_sync)
    diff = oracle.deepgemm_diff(outs["split"], outs["whole"])
    ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=7)
    tflops = {v: 2 * valid * n * k * runs / t / 1e9 for v, t in ms.items()}
    table.append((name, recipe, tflops, diff))
    print(f"{name} {recipe}: " + ", ".join(f"{v} {t:.0f}" for v, t in tflops.items()) + f", diff {diff:.1e}",
          flush=True)

print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows")
print("| case | scales | whole tiles | split tail | ratio | diff |")
print("|---|---|---|---|---|---|")
for name, recipe, t, diff in table:
  print(f"| {name} | {recipe} | {t['whole']:.0f} | {t['split']:.0f} | {t['split'] / t['whole']:.3f} | "
        f"{diff:.1e} |")
