"""A/B: backend_triton._gmm_fp8_ws with its lhs block scales gathered tile-major with mode="clip" (the tree: one XLA
fusion before the kernel) against the wrapper before (mode="fill": two), on the same kernel and `python -m jgmm.bench
--fp8`'s cases, both recipes, timed interleaved as the benchmark times jgmm (timing.chain); TFLOP/s on the valid
rows; outputs compared bit for bit. Issue 15, session 30.
    python docs/experiments/lhs_scales_ab.py [name,...]   (names as bench_fp8's, e.g. masked-1x1024-4096-7168)"""
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench_fp8, config_table, ffi, quantize, timing
from jgmm.triton_kernels import geometry, gmm_fp8_ws, gmm_ws

def tile_scales(lhs_scale, schedule, row_tiles, block_m):
  """The tile-major lhs block scales as the wrapper before made them (zeros past M)."""
  width = geometry.next_pow2(block_m)
  if lhs_scale.ndim == 1:
    return jnp.zeros((1, width), jnp.float32)
  first = schedule[1 + row_tiles:1 + 2 * row_tiles]
  rows = first[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
  tiles = jnp.take(lhs_scale, rows, axis=0, mode="fill", fill_value=0)
  return tiles.transpose(0, 2, 1).reshape(-1, width)


def head_gmm_fp8_ws(lhs, rhs, schedule, row_tiles, lhs_scale, rhs_scale, out_dtype, config, device):
  """backend_triton._gmm_fp8_ws as it was."""
  m, k = lhs.shape
  num_groups, n, _ = rhs.shape
  block = gmm_fp8_ws.BLOCK.value
  lhs_block, rhs_block, out_block = (gmm_ws.HALF.value, block), (config.block_n, block), (gmm_ws.HALF.value, block)
  halves = config.block_m // gmm_ws.HALF.value
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=gmm_ws.shared_layout(lhs_block, lhs.dtype.name)),
      ffi.TensorDescriptor(rhs.reshape(num_groups * n, k), rhs_block,
                           layout=gmm_ws.shared_layout(rhs_block, rhs.dtype.name)),
      ffi.TensorDescriptor(tile_scales(lhs_scale, schedule, row_tiles, config.block_m),
                           (1, geometry.next_pow2(config.block_m)), layout=gmm_fp8_ws.ROW_SCALE_LAYOUT),
      schedule, lhs_scale, rhs_scale, m,
      kernel=gmm_fp8_ws.gmm_fp8_ws_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(device.num_sms, row_tiles * geometry.cdiv(n, config.block_n)),),
      num_warps=gmm_fp8_ws.NUM_WARPS, maxnreg=gmm_fp8_ws.MAXNREG[halves], name="jgmm_gmm_fp8_ws_head",
      K=k, N=n, R_MAX=row_tiles, BLOCK_N=config.block_n, S=config.num_stages, LHS_BLOCKS=lhs_scale.ndim == 2,
      RHS_BLOCKS=rhs_scale.ndim == 3, OUT_LAYOUT=gmm_ws.shared_layout(out_block, out_dtype.name), HALVES=halves)


table = []
for name, layout, g, rows, n, k in bench_fp8.cases(sys.argv[1] if len(sys.argv) > 1 else ""):
  x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
  runs = bench_fp8._runs(valid, n, k)
  for recipe in bench_fp8.RECIPES.values():
    x_recipe, w_recipe = config_table.FP8_RECIPES[recipe]
    args = (*quantize.quantize(x, x_recipe), *quantize.quantize(w, w_recipe), jnp.asarray(groups))
    fns, outs = {}, {}
    for variant in ("head", "tree"):
      wrapper = head_gmm_fp8_ws if variant == "head" else backend_triton._gmm_fp8_ws
      with mock.patch.object(backend_triton, "_gmm_fp8_ws", wrapper):  # Read when the function is traced.
        fn = functools.partial(bench_fp8._chained(bench_fp8._product(layout, rows), runs), *args)
        outs[variant] = np.asarray(fn(), np.float32)
      fns[variant] = (fn, timing.jax_sync)
    same = np.array_equal(outs["head"], outs["tree"])
    ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=7)
    tflops = {v: 2 * valid * n * k * runs / t / 1e9 for v, t in ms.items()}
    table.append((name, recipe, tflops, same))
    print(f"{name} {recipe}: " + ", ".join(f"{v} {t:.0f}" for v, t in tflops.items()) + f", same bits {same}",
          flush=True)

print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows")
print("| case | scales | before | tree | ratio | same bits |")
print("|---|---|---|---|---|---|")
for name, recipe, t, same in table:
  print(f"| {name} | {recipe} | {t['head']:.0f} | {t['tree']:.0f} | {t['tree'] / t['head']:.3f} | {same} |")
