"""The FP8 cases of `python -m jgmm.bench --fp8` (blocks recipe) in each tiling of gmm_fp8_ws_kernel, the product
kernel alone (timing.kernel_ms, DeepGEMM's method), median us and TFLOP/s, the shipped tables' choice first ("table").

    python docs/experiments/fp8_tiles_kernel.py [CASES [TILINGS]]      (comma-separated: bench_fp8.cases names,
        default all, or other shapes named alike, e.g. contiguous-32x1024-4096-7168 (G x rows per group, N, K);
        TILINGS' names, default all)
The clusters (gmm_fp8_ws_cluster_kernel, rhs multicast) need Triton >= 3.7; under 3.6 they run 128 x 128.
"""
import dataclasses
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402

from jgmm import bench_fp8, timing  # noqa: E402
from jgmm.config import ROWS_192, Config  # noqa: E402

WS = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, tma=False, warp_specialized=True)
TILINGS = {"128x128": WS, "192x128": dataclasses.replace(WS, block_m=ROWS_192),
           "128x256": dataclasses.replace(WS, block_n=256, num_stages=3),
           "cluster": dataclasses.replace(WS, cluster_size=2),
           "cluster5": dataclasses.replace(WS, cluster_size=2, num_stages=5),
           "cluster192": dataclasses.replace(WS, block_m=ROWS_192, cluster_size=2)}
if len(sys.argv) > 2:  # Only these tilings, comma-separated.
  TILINGS = {name: TILINGS[name] for name in sys.argv[2].split(",")}

print("| case | table | " + " | ".join(TILINGS) + " |")
print("|---|---|" + "---|" * len(TILINGS))
wanted = sys.argv[1] if len(sys.argv) > 1 else ""
cases = bench_fp8.cases(wanted)
for name in set(filter(None, wanted.split(","))) - {case[0] for case in cases}:  # Other shapes, named alike.
  layout, grid, n, k = name.split("-")
  cases.append((name, layout, *map(int, grid.split("x")), int(n), int(k)))
for name, layout, g, rows, n, k in cases:
  x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
  xq, xs, wq, ws, gs = bench_fp8.fp8_operands(x, w, groups, bench_fp8.RECIPES["blocks"])
  cells = []
  for config in [None, *TILINGS.values()]:
    product = jax.jit(bench_fp8._product(layout, rows, config))
    call = lambda: product(xq, wq, gs, xs, ws)
    timing.jax_sync(call())
    ms = timing.kernel_ms(call, timing.jax_sync, bench_fp8.KERNELS["jgmm"], launches=7)
    cells.append(f"{1e3 * ms:.1f} us, {2 * valid * n * k / ms / 1e9:.0f}")
  print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
