"""Every GPU kernel of one jitted FP8 product (jgmm.bench --fp8's case), blocks then rowwise, five calls each, or
with `chained` two calls of the benchmark's chain of the product (bench_fp8._chained: `runs` products in one program,
each after the first behind a one-element update of x): run under Nsight Compute to see the kernels XLA runs around
gmm_fp8_ws (the tile-major lhs block scales or the row scales' placeholder, the contiguous layout's schedule, the
chain's updates) and their times (`ncu --metrics gpu__time_duration.sum --csv python
docs/experiments/fp8_launches.py CASE [chained]`; the GPU image has no Nsight Systems). Issue 15, sessions 30, 34.
    python docs/experiments/fp8_launches.py [masked-1x1024-4096-7168] [chained]"""
import sys

import jax

from jgmm import bench_fp8

name = sys.argv[1] if len(sys.argv) > 1 else "masked-1x1024-4096-7168"
chained = sys.argv[2:] == ["chained"]
(_, layout, g, rows, n, k), = bench_fp8.cases(name)
x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
for recipe in bench_fp8.RECIPES.values():
  xq, xs, wq, ws, gs = bench_fp8.fp8_operands(x, w, groups, recipe)
  if chained:
    runs = bench_fp8._runs(valid, n, k)
    chain = bench_fp8._chained(bench_fp8._product(layout, rows), runs)
    for _ in range(2):  # The second call's kernels: the first also compiles (XLA's autotuning kernels).
      out = chain(xq, xs, wq, ws, gs)
  else:
    runs, product = 5, jax.jit(bench_fp8._product(layout, rows))
    for _ in range(runs):
      out = product(xq, wq, gs, xs, ws)
  jax.block_until_ready(out)
  print(recipe, "done:", runs, "products", flush=True)
