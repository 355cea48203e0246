"""Upper bound of removing the XLA kernels before gmm_fp8_ws (issue 15, session 31): the tree against the same
kernel given its schedule and tile-major lhs block scales (or the rowwise placeholder) as constants computed ahead
(the most that an in-kernel schedule and scale read could save), on `python -m jgmm.bench --fp8`'s cases, both
recipes, timed interleaved as the benchmark times jgmm (timing.chain); outputs compared bit for bit.
    python docs/experiments/prologue_ab.py [name,...]   (names as bench_fp8's, e.g. masked-1x1024-4096-7168)"""
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench_fp8, ops, timing

REAL = {name: getattr(backend_triton, name) for name in ("_tile_scales", "_masked_row_tiles", "_row_tiles")}


def not_splat(value):
  """value, changed in its last element if all its elements are equal (XLA rebuilds a splat constant by a
  broadcast kernel; the kernel never reads that element)."""
  value = np.array(value)
  if value.size > 1 and np.all(value == value.flat[0]):
    value.flat[-1] += 1
  return value


def prologue(layout, rows, args):
  """(schedule, tile scales) the tree computes for these operands, as numpy arrays."""
  static = {}
  spies = {name: (lambda *a, name=name: static.setdefault(name, a[1:]) and REAL[name](*a)) for name in REAL}
  with mock.patch.multiple(backend_triton, **spies):
    jax.jit(lambda xq, xs, wq, ws, gs: bench_fp8._product(layout, rows)(xq, wq, gs, xs, ws)).trace(*args).lower(
        lowering_platforms=("cuda",))
  xq, xs, wq, _, gs = args
  if layout == "masked":
    schedule = jax.jit(REAL["_masked_row_tiles"], static_argnums=(1, 2))(gs, *static["_masked_row_tiles"])
    lhs_scale = xs.reshape(-1, *xs.shape[2:])
  else:
    bounds = ops.group_bounds(gs, None, wq.shape[0], xq.shape[0])
    schedule = jax.jit(REAL["_row_tiles"], static_argnums=(1, 2, 3))(bounds, *static["_row_tiles"])
    lhs_scale = xs
  row_tiles, block_m = static["_tile_scales"][1:]
  tiles = jax.jit(REAL["_tile_scales"], static_argnums=(2, 3))(lhs_scale, schedule, row_tiles, block_m)
  return np.asarray(schedule), not_splat(tiles)


table = []
for name, layout, rows, n, k, valid, runs, recipe, args in bench_fp8.recipe_cases(
    sys.argv[1] if len(sys.argv) > 1 else ""):
  schedule, tiles = prologue(layout, rows, args)
  fns, outs = {}, {}
  consts = {"_tile_scales": lambda *a: jnp.asarray(tiles), "_masked_row_tiles": lambda *a: jnp.asarray(schedule),
            "_row_tiles": lambda *a: jnp.asarray(schedule)}
  for variant, patches in (("tree", REAL), ("constants", consts)):
    with mock.patch.multiple(backend_triton, **patches):  # Read when the function is traced.
      fn = functools.partial(bench_fp8._chained(bench_fp8._product(layout, rows), runs), *args)
      outs[variant] = np.asarray(fn(), np.float32)
    fns[variant] = (fn, timing.jax_sync)
  same = np.array_equal(outs["tree"], outs["constants"])
  ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=7)
  tflops = {v: 2 * valid * n * k * runs / t / 1e9 for v, t in ms.items()}
  us = {v: t / runs * 1e3 for v, t in ms.items()}
  table.append((name, recipe, tflops, us, same))
  print(f"{name} {recipe}: " + ", ".join(f"{v} {t:.0f}" for v, t in tflops.items()) + f", same bits {same}",
        flush=True)

print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows (us per product)")
print("| case | scales | tree | prologue as constants | ratio | same bits |")
print("|---|---|---|---|---|---|")
for name, recipe, t, us, same in table:
  print(f"| {name} | {recipe} | {t['tree']:.0f} ({us['tree']:.1f}) | {t['constants']:.0f} ({us['constants']:.1f}) | "
        f"{t['constants'] / t['tree']:.3f} | {same} |")
