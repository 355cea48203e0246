"""Every GPU kernel of one jitted FP8 product (jgmm.bench --fp8's case), blocks then rowwise, five calls each: run
under Nsight Compute to see the kernels XLA runs around gmm_fp8_ws (its schedule, the tile-major lhs block scales or
the row scales' placeholder) and their times (`ncu --metrics gpu__time_duration.sum --csv python
docs/experiments/fp8_launches.py CASE`; the GPU image has no Nsight Systems). Issue 15, session 30.
    python docs/experiments/fp8_launches.py [masked-1x1024-4096-7168]"""
import sys

import jax
import jax.numpy as jnp

from jgmm import bench_fp8, config_table, quantize

name = sys.argv[1] if len(sys.argv) > 1 else "masked-1x1024-4096-7168"
(_, layout, g, rows, n, k), = bench_fp8.cases(name)
x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
for recipe in bench_fp8.RECIPES.values():
  x_recipe, w_recipe = config_table.FP8_RECIPES[recipe]
  (xq, xs), (wq, ws) = quantize.quantize(x, x_recipe), quantize.quantize(w, w_recipe)
  product = jax.jit(bench_fp8._product(layout, rows))
  for _ in range(5):
    out = product(xq, wq, jnp.asarray(groups), xs, ws)
  jax.block_until_ready(out)
  print(recipe, "done", flush=True)
