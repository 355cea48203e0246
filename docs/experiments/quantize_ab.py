"""fp8_gmm's grouped quantisation (issue 15) on the dsv3 operands: the plain kernel (quantize_pair_grouped_kernel,
the interpreter's and ROCm's) against the lanes kernel (CUDA's default), and a copy that reads and writes as many
bytes (the roofline); outputs compared bit for bit (NONFINITE=1: with a NaN and an inf in x). PAIR=1: the same for
quantize_pair's 1x128 (quantize_pair_kernel against the lanes kernel on the 128-row grid). WEIGHTS=1: quantize_pair's
128x128 of the dsv3 weights (G, K, N) (quantize_pair_kernel against the lanes kernel's TILE_SCALES; session 34). The
Gluon variants tried before the lanes kernel (32 lanes along the columns, a persistent TMA pipeline) are in commit
ffa835d.

    [PAIR=1 | WEIGHTS=1] python docs/experiments/quantize_ab.py \
        [plain,lanes,lanes@WARPS@MAXNREG[@WARPS_ALONG_COLUMNS],copy]
"""
import functools
import os
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench, ffi, fp8, timing
from jgmm.triton_kernels import quantize as quantize_kernels

PAIR = bool(os.environ.get("PAIR"))
WEIGHTS = bool(os.environ.get("WEIGHTS"))
sizes = bench.Inputs(32768, 128, 128, 32).group_sizes
blocks, _ = fp8._padded_groups(sizes, 32768)


def plain_pair(x):
  """quantize_pair_kernel's 1x128 (backend_triton.quantize_pair's off CUDA)."""
  r, c = x.shape
  rb, cb = -(-r // 128), -(-c // 128)
  return tuple(ffi.triton_call(x, kernel=quantize_kernels.quantize_pair_kernel,
                               out_shape=backend_triton._rowwise_pair_shapes(x, r, rb, jnp.float8_e4m3fn),
                               grid=(rb, cb, 1), num_warps=quantize_kernels.NUM_WARPS, R=r, C=c, FMAX=448.0,
                               ROWWISE=True))


def plain_weights(x):
  """quantize_pair_kernel's 128x128 of x (G, R, C) (backend_triton.quantize_pair's off CUDA)."""
  g, r, c = x.shape
  rb, cb = -(-r // 128), -(-c // 128)
  f32, f8 = jnp.float32, jnp.float8_e4m3fn
  return tuple(ffi.triton_call(
      x, kernel=quantize_kernels.quantize_pair_kernel, grid=(rb, cb, g), num_warps=quantize_kernels.NUM_WARPS,
      out_shape=[jax.ShapeDtypeStruct(x.shape, f8), jax.ShapeDtypeStruct((g, rb, cb), f32),
                 jax.ShapeDtypeStruct((g, c, r), f8), jax.ShapeDtypeStruct((g, cb, rb), f32)],
      R=r, C=c, FMAX=448.0, ROWWISE=False))


def plain(x):
  return backend_triton.quantize_pair_grouped_plain(x, blocks, jnp.float8_e4m3fn, 448.0)


def compiled(variant, x):
  if variant == "copy":  # 2 bytes read and 2 written an element, as the quantisation.
    return jax.jit(lambda a: jax.lax.bitcast_convert_type(a, jnp.int16) ^ 1).trace(x).lower().compile()
  if variant == "plain":
    return jax.jit(plain_weights if WEIGHTS else plain_pair if PAIR else plain).trace(x).lower().compile()
  _, *geometry = variant.split("@")  # lanes[@WARPS@MAXNREG[@WARPS_ALONG_COLUMNS]]
  warps, maxnreg, *along = map(int, geometry) if geometry else (quantize_kernels.LANES_WARPS,
                                                                 quantize_kernels.LANES_MAXNREG)
  layouts = functools.partial(quantize_kernels.lanes_layouts, warps_c=along[0] if along else 2)
  with mock.patch.object(quantize_kernels, "LANES_WARPS", warps), \
       mock.patch.object(quantize_kernels, "LANES_MAXNREG", maxnreg), \
       mock.patch.object(quantize_kernels, "lanes_layouts", layouts):
    if PAIR or WEIGHTS:
      recipe = "128x128" if WEIGHTS else "1x128"
      return jax.jit(lambda a: backend_triton.quantize_pair(a, recipe=recipe, dtype=jnp.float8_e4m3fn)).trace(
          x).lower().compile()
    return jax.jit(lambda a: backend_triton.quantize_pair_grouped(a, blocks, dtype=jnp.float8_e4m3fn)).trace(
        x).lower().compile()


if __name__ == "__main__":
  names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["plain", "lanes", "copy"]
  print("device:", jax.devices()[0].device_kind, flush=True)
  shapes = [(32, 7168, 4096), (32, 2048, 7168)] if WEIGHTS else [(32768, cols) for cols in (2048, 4096, 7168)]
  for shape in shapes:
    x = jax.random.normal(jax.random.key(0), shape, jnp.bfloat16)
    x = x.at[5, 7].set(jnp.nan).at[300, 9].set(jnp.inf) if os.environ.get("NONFINITE") else x
    fns = {name: compiled(name, x) for name in names}
    outputs = {n: [np.asarray(o.astype(jnp.float32)) for o in f(x)] for n, f in fns.items() if n != "copy"}
    first, *others = outputs
    for name in others:
      print(f"  {name}: outputs equal to {first}'s:", [bool(np.array_equal(a, b, equal_nan=True))
                                                      for a, b in zip(outputs[first], outputs[name])], flush=True)
    ms = timing.time_interleaved({n: (lambda f=f: f(x), timing.jax_sync) for n, f in fns.items()},
                                 min_batch_s=0.03, batches=5)
    for name, t in ms.items():
      print(f"  {shape} {name:14s} {t * 1e3:7.1f} us {4 * x.size / t / 1e9:6.2f} TB/s", flush=True)
