"""A/B: backend_triton._gmm_fp8_ws with its lhs block scales gathered tile-major with mode="clip" (the tree: one XLA
fusion before the kernel) against the gather before (mode="fill": two), on the same kernel and `python -m jgmm.bench
--fp8`'s cases, both recipes, timed interleaved as the benchmark times jgmm (timing.chain); TFLOP/s on the valid
rows; outputs compared bit for bit. Issue 15, session 30.
    python docs/experiments/lhs_scales_ab.py [name,...]   (names as bench_fp8's, e.g. masked-1x1024-4096-7168)"""
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench_fp8, timing
from jgmm.triton_kernels import geometry


def tile_scales(lhs_scale, schedule, row_tiles, block_m):
  """backend_triton._tile_scales as it was (zeros past M: mode="fill")."""
  width = geometry.next_pow2(block_m)
  if lhs_scale.ndim == 1:
    return jnp.zeros((1, width), jnp.float32)
  first = schedule[1 + row_tiles:1 + 2 * row_tiles]
  rows = first[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
  tiles = jnp.take(lhs_scale, rows, axis=0, mode="fill", fill_value=0)
  return tiles.transpose(0, 2, 1).reshape(-1, width)


table = []
for name, layout, rows, n, k, valid, runs, recipe, args in bench_fp8.recipe_cases(
    sys.argv[1] if len(sys.argv) > 1 else ""):
  fns, outs = {}, {}
  for variant, gather in (("before", tile_scales), ("tree", backend_triton._tile_scales)):
    with mock.patch.object(backend_triton, "_tile_scales", gather):  # Read when the function is traced.
      fn = functools.partial(bench_fp8._chained(bench_fp8._product(layout, rows), runs), *args)
      outs[variant] = np.asarray(fn(), np.float32)
    fns[variant] = (fn, timing.jax_sync)
  same = np.array_equal(outs["before"], outs["tree"])
  ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=7)
  tflops = {v: 2 * valid * n * k * runs / t / 1e9 for v, t in ms.items()}
  table.append((name, recipe, tflops, same))
  print(f"{name} {recipe}: " + ", ".join(f"{v} {t:.0f}" for v, t in tflops.items()) + f", same bits {same}",
        flush=True)

print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows")
print("| case | scales | before | tree | ratio | same bits |")
print("|---|---|---|---|---|---|")
for name, recipe, t, same in table:
  print(f"| {name} | {recipe} | {t['before']:.0f} | {t['tree']:.0f} | {t['tree'] / t['before']:.3f} | {same} |")
