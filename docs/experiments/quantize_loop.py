"""quantize_pair_grouped_kernel against a persistent copy whose programs loop over blocks with the next block's
loads in flight (tl.range num_stages), on the dsv3 operands (issue 15): GB/s, interleaved, outputs compared.

    python docs/experiments/quantize_loop.py
"""
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jgmm import bench, fp8, ffi, timing
from jgmm.triton_kernels import quantize as quantize_kernels
from jgmm.triton_kernels.quantize import BLOCK, _quantize, _scale


@triton.jit
def looped_kernel(x_ptr, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: tl.constexpr, C: tl.constexpr,
                  PB: tl.constexpr, FMAX: tl.constexpr, STAGES: tl.constexpr):
  CB: tl.constexpr = (C + BLOCK - 1) // BLOCK
  RP: tl.constexpr = PB * BLOCK
  cb = tl.program_id(1)
  local = tl.arange(0, BLOCK)
  cols = cb * BLOCK + local
  OFFSET: tl.constexpr = tl.int64 if BLOCK * max(C, RP) >= 2**31 else tl.int32
  offsets = local.to(OFFSET)[:, None] * C + local[None, :]
  offsets_t = local.to(OFFSET)[:, None] * RP + local[None, :]
  for pb in tl.range(tl.program_id(0), PB, tl.num_programs(0), num_stages=STAGES):
    first = tl.load(blocks_ptr + pb)
    rows = first + local
    valid = rows < tl.load(blocks_ptr + PB + pb)
    mask = valid[:, None] & (cols < C)[None, :]
    tile = first.to(tl.int64) * C + cb * BLOCK
    x = tl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = _scale(tl.max(tl.abs(x), axis=1), FMAX)
    scale_t = _scale(tl.max(tl.abs(x), axis=0), FMAX)
    tl.store(s_ptr + rows.to(tl.int64) * CB + cb, scale, mask=valid)
    tl.store(st_ptr + cols.to(tl.int64) * PB + pb, scale_t, mask=cols < C)
    dtype = q_ptr.dtype.element_ty
    tl.store(q_ptr + tile + offsets, _quantize(x, scale[:, None], dtype, FMAX), mask=mask)
    qt = tl.trans(_quantize(x, scale_t[None, :], dtype, FMAX))
    tile_t = cb.to(tl.int64) * BLOCK * RP + pb * BLOCK
    tl.store(qt_ptr + tile_t + offsets_t, qt, mask=(cols < C)[:, None])


def call(kernel, x, blocks, grid_rows, **extra):
  r, c = x.shape
  pb, cb = blocks.shape[1], -(-c // 128)
  out_shape = [jax.ShapeDtypeStruct(x.shape, jnp.float8_e4m3fn), jax.ShapeDtypeStruct((r, cb), jnp.float32),
               jax.ShapeDtypeStruct((c, 128 * pb), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((c, pb), jnp.float32)]
  return ffi.triton_call(x, blocks, kernel=kernel, out_shape=out_shape, grid=(grid_rows, cb),
                         num_warps=quantize_kernels.NUM_WARPS, R=r, C=c, PB=pb, FMAX=448.0, **extra)


if __name__ == "__main__":
  print("device:", jax.devices()[0].device_kind, flush=True)
  sms = jax.devices()[0].core_count if hasattr(jax.devices()[0], "core_count") else 132
  gs = bench.Inputs(32768, 128, 128, 32).group_sizes
  blocks, _ = fp8._padded_groups(gs, 32768)
  for cols in (4096, 7168):
    x = jax.random.normal(jax.random.key(0), (32768, cols), jnp.bfloat16)
    cb = -(-cols // 128)
    fns = {"tree": jax.jit(lambda x, b: call(quantize_kernels.quantize_pair_grouped_kernel, x, b, b.shape[1]))}
    for per_sm in (2, 4):
      for stages in (1, 2, 3):
        rows = max(1, per_sm * sms // cb)
        fns[f"loop {per_sm}/SM s{stages}"] = jax.jit(
            lambda x, b, rows=rows, stages=stages: call(looped_kernel, x, b, rows, STAGES=stages))
    outs = {k: [np.asarray(o, np.float32) for o in f(x, blocks)] for k, f in fns.items()}
    for k, o in outs.items():
      assert all(np.array_equal(a, b) for a, b in zip(o, outs["tree"])), k
    ms = timing.time_interleaved({k: (lambda f=f: f(x, blocks), timing.jax_sync) for k, f in fns.items()},
                                 min_batch_s=0.03, batches=5)
    for label, t in ms.items():
      print(f"  (32768, {cols}) {label:16s} {t * 1e3:7.1f} us {4 * x.size / t / 1e6:6.0f} GB/s", flush=True)
