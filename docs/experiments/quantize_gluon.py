"""quantize_pair_grouped_kernel (plain Triton) against a Gluon kernel whose layouts need no shared-memory transpose
(issue 15): each thread holds a (128 / WARPS) x 4 block of the tile, 32 lanes along the columns and the warps along
the rows, so that q's rows and qt's rows (x's columns) are both stored from registers; the plain kernel's transpose
takes 128 byte-wide shared loads a thread.

    JAX_PLATFORMS=cpu python docs/experiments/quantize_gluon.py sass     # registers, shared-memory instructions
    python docs/experiments/quantize_gluon.py time                       # GB/s, interleaved, outputs compared
"""
import os
import subprocess
import sys
import tempfile
from unittest import mock

if sys.argv[1] == "sass":
  os.environ["JGMM_TARGET"] = "cuda:90"
import jax
import jax.numpy as jnp
import numpy as np
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import triton.language as tl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from jgmm import backend_triton, bench, ffi, fp8, quantize, timing
from jgmm.ffi import _compile
from jgmm.triton_kernels import quantize as quantize_kernels

BLOCK = gl.constexpr(128)
NAN_ALL = gl.constexpr(tl.PropagateNan.ALL)
_tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)


@gluon.jit
def _nan_max(a, b):
  return gl.maximum(a, b, propagate_nan=NAN_ALL)


@gluon.jit
def _issue(x_desc, blocks_ptr, bufs, ready, i, count, CB: gl.constexpr, S: gl.constexpr):
  """TMA load of this program's i-th tile (if it has one) into stage i % S."""
  t = gl.program_id(0) + i * gl.num_programs(0)
  pred = i < count
  first = gl.load(blocks_ptr + t // CB, mask=pred, other=0)
  mbarrier.expect(ready.index(i % S), x_desc.block_type.nbytes, pred=pred)
  _tma_load(x_desc, [first, (t % CB) * BLOCK], ready.index(i % S), bufs.index(i % S), pred=pred)


@gluon.jit
def tma_kernel(x_desc, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: gl.constexpr, C: gl.constexpr, PB: gl.constexpr,
               FMAX: gl.constexpr, S: gl.constexpr):
  WARPS: gl.constexpr = gl.num_warps()
  TILE: gl.constexpr = gl.BlockedLayout([BLOCK // WARPS, BLOCK // 32], [1, 32], [WARPS, 1], [1, 0])
  TILE_T: gl.constexpr = gl.BlockedLayout([BLOCK // WARPS, BLOCK // 32], [1, 32], [WARPS, 1], [0, 1])
  CB: gl.constexpr = (C + BLOCK - 1) // BLOCK
  RP: gl.constexpr = PB * BLOCK
  OFFSET: gl.constexpr = gl.int64 if BLOCK * max(C, RP) >= 2**31 else gl.int32
  programs = gl.num_programs(0)
  count = (PB * CB - gl.program_id(0) + programs - 1) // programs
  bufs = gl.allocate_shared_memory(x_desc.dtype, [S, BLOCK, BLOCK], x_desc.layout)
  ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
  for i in gl.static_range(S - 1):
    _issue(x_desc, blocks_ptr, bufs, ready, i, count, CB, S)
  r_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE))
  c_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE))
  rt = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE_T))
  ct = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE_T))
  offsets = gl.expand_dims(r_local.to(OFFSET), 1) * C + gl.expand_dims(c_local, 0)
  offsets_t = gl.expand_dims(ct.to(OFFSET), 0) * RP + gl.expand_dims(rt, 1)  # [r, c] -> qt[c, r]
  dtype: gl.constexpr = q_ptr.dtype.element_ty
  for i in range(count):
    _issue(x_desc, blocks_ptr, bufs, ready, i + S - 1, count, CB, S)  # Stage (i - 1) % S: read by all last time.
    t = gl.program_id(0) + i * programs
    pb, cb = t // CB, t % CB
    first = gl.load(blocks_ptr + pb)
    rows, cols = first + r_local, cb * BLOCK + c_local
    valid = (rows >= 0) & (rows < gl.minimum(gl.load(blocks_ptr + PB + pb), R))
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols < C, 0)
    mbarrier.wait(ready.index(i % S), (i // S) & 1)
    x = bufs.index(i % S).load(TILE)
    gl.thread_barrier()
    x = gl.where(mask, x.to(gl.float32), 0.0)
    ax = gl.abs(x)
    scale = _scale(gl.reduce(ax, 1, _nan_max), FMAX)
    scale_t = _scale(gl.reduce(ax, 0, _nan_max), FMAX)
    gl.store(s_ptr + rows.to(gl.int64) * CB + cb, scale, mask=valid)
    gl.store(st_ptr + cols.to(gl.int64) * PB + pb, scale_t, mask=cols < C)
    tile = first.to(gl.int64) * C + cb * BLOCK
    gl.store(q_ptr + tile + offsets, _quantize(x, gl.expand_dims(scale, 1), dtype, FMAX), mask=mask)
    qt = gl.convert_layout(_quantize(x, gl.expand_dims(scale_t, 0), dtype, FMAX), TILE_T)
    tile_t = cb.to(gl.int64) * BLOCK * RP + pb * BLOCK
    gl.store(qt_ptr + tile_t + offsets_t, qt, mask=gl.expand_dims(cb * BLOCK + ct < C, 0))


def tile_layouts(warps):
  """(TILE, TILE_T): 4 x 8 lanes of a (128 / 4 / WR) x (128 / 8 / WC) block each, warps WR x WC; the same
  elements, registers ordered along columns (TILE: loads, q) or rows (TILE_T: qt's rows are x's columns)."""
  wc = {4: 2, 8: 4, 16: 4}[warps]
  wr = warps // wc
  rt, ct = 128 // 4 // wr, 128 // 8 // wc
  bits = lambda n: [1 << b for b in range(n.bit_length() - 1)]
  regs_r, regs_c = [[v, 0] for v in bits(rt)], [[0, v] for v in bits(ct)]
  lanes = [[0, ct * v] for v in bits(8)] + [[rt * v, 0] for v in bits(4)]
  warp_bases = [[0, 8 * ct * v] for v in bits(wc)] + [[4 * rt * v, 0] for v in bits(wr)]
  make = lambda regs: gl.DistributedLinearLayout(regs, lanes, warp_bases, [], [128, 128])
  return make(regs_c + regs_r), make(regs_r + regs_c)


@gluon.jit
def lin_kernel(x_ptr, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: gl.constexpr, C: gl.constexpr, PB: gl.constexpr,
               FMAX: gl.constexpr, TILE: gl.constexpr, TILE_T: gl.constexpr, COLUMNS_FIRST: gl.constexpr):
  CB: gl.constexpr = (C + BLOCK - 1) // BLOCK
  RP: gl.constexpr = PB * BLOCK
  OFFSET: gl.constexpr = gl.int64 if BLOCK * max(C, RP) >= 2**31 else gl.int32
  if COLUMNS_FIRST:
    cb, pb = gl.program_id(0), gl.program_id(1)
  else:
    pb, cb = gl.program_id(0), gl.program_id(1)
  first = gl.load(blocks_ptr + pb)
  r_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE))
  c_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE))
  rows, cols = first + r_local, cb * BLOCK + c_local
  valid = (rows >= 0) & (rows < gl.minimum(gl.load(blocks_ptr + PB + pb), R))
  mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols < C, 0)
  tile = first.to(gl.int64) * C + cb * BLOCK
  offsets = gl.expand_dims(r_local.to(OFFSET), 1) * C + gl.expand_dims(c_local, 0)
  x = gl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(gl.float32)
  ax = gl.abs(x)
  # Each scale and its reciprocal computed once (a thread each), not by every thread holding its row or column.
  ONE: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
  one = gl.arange(0, BLOCK, layout=ONE)
  scale = _scale(gl.convert_layout(gl.reduce(ax, 1, _nan_max), ONE), FMAX)
  scale_t = _scale(gl.convert_layout(gl.reduce(ax, 0, _nan_max), ONE), FMAX)
  gl.store(s_ptr + (first + one).to(gl.int64) * CB + cb, scale, mask=(first + one >= 0) & (first + one < gl.minimum(gl.load(blocks_ptr + PB + pb), R)))
  gl.store(st_ptr + (cb * BLOCK + one).to(gl.int64) * PB + pb, scale_t, mask=cb * BLOCK + one < C)
  inv = gl.convert_layout(gl.div_rn(gl.full_like(scale, 1.0), scale), gl.SliceLayout(1, TILE))
  inv_t = gl.convert_layout(gl.div_rn(gl.full_like(scale_t, 1.0), scale_t), gl.SliceLayout(0, TILE))
  dtype: gl.constexpr = q_ptr.dtype.element_ty
  gl.store(q_ptr + tile + offsets, (x * gl.expand_dims(inv, 1)).to(dtype), mask=mask)
  qt = gl.convert_layout((x * gl.expand_dims(inv_t, 0)).to(dtype), TILE_T)
  rt = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE_T))
  ct = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE_T))
  tile_t = cb.to(gl.int64) * BLOCK * RP + pb * BLOCK
  offsets_t = gl.expand_dims(ct.to(OFFSET), 0) * RP + gl.expand_dims(rt, 1)  # [r, c] -> qt[c, r]
  gl.store(qt_ptr + tile_t + offsets_t, qt, mask=gl.expand_dims(cb * BLOCK + ct < C, 0))


def lin_call(x, blocks, *, dtype, warps, maxnreg=None, columns_first=False):
  r, c = x.shape
  padded_blocks = blocks.shape[1]
  cb = -(-c // 128)
  out_shape = [jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct((r, cb), jnp.float32),
               jax.ShapeDtypeStruct((c, padded_blocks * 128), dtype),
               jax.ShapeDtypeStruct((c, padded_blocks), jnp.float32)]
  tile, tile_t = tile_layouts(warps)
  return tuple(ffi.triton_call(
      x, blocks, kernel=lin_kernel, out_shape=out_shape, grid=(cb, padded_blocks) if columns_first else (padded_blocks, cb), num_warps=warps, maxnreg=maxnreg,
      name="jgmm_quantize_pair_grouped_lin", R=r, C=c, PB=padded_blocks, FMAX=quantize.FP8_MAX[jnp.dtype(dtype)],
      TILE=tile, TILE_T=tile_t, COLUMNS_FIRST=columns_first))


def tma_call(x, blocks, *, dtype, warps, programs_per_sm, stages):
  r, c = x.shape
  padded_blocks = blocks.shape[1]
  cb = -(-c // 128)
  out_shape = [jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct((r, cb), jnp.float32),
               jax.ShapeDtypeStruct((c, padded_blocks * 128), dtype),
               jax.ShapeDtypeStruct((c, padded_blocks), jnp.float32)]
  layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * x.dtype.itemsize, rank=2)
  num_sms = backend_triton._device().num_sms
  return tuple(ffi.triton_call(
      ffi.TensorDescriptor(x, (128, 128), layout=layout), blocks, kernel=tma_kernel, out_shape=out_shape,
      grid=(min(programs_per_sm * num_sms, padded_blocks * cb),), num_warps=warps,
      name="jgmm_quantize_pair_grouped_tma", R=r, C=c, PB=padded_blocks, FMAX=quantize.FP8_MAX[jnp.dtype(dtype)], S=stages))


@gluon.jit
def _scale(amax, FMAX: gl.constexpr):
  return gl.where(amax == 0.0, 1.0, gl.div_rn(amax, FMAX))


@gluon.jit
def _quantize(x, scale, dtype: gl.constexpr, FMAX: gl.constexpr):
  return (x * gl.div_rn(gl.full_like(scale, 1.0), scale)).to(dtype)  # The conversion saturates (satfinite).


@gluon.jit
def kernel(x_ptr, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: gl.constexpr, C: gl.constexpr, PB: gl.constexpr,
             FMAX: gl.constexpr):
    WARPS: gl.constexpr = gl.num_warps()
    TILE: gl.constexpr = gl.BlockedLayout([BLOCK // WARPS, BLOCK // 32], [1, 32], [WARPS, 1], [1, 0])
    TILE_T: gl.constexpr = gl.BlockedLayout([BLOCK // WARPS, BLOCK // 32], [1, 32], [WARPS, 1], [0, 1])
    CB: gl.constexpr = (C + BLOCK - 1) // BLOCK
    RP: gl.constexpr = PB * BLOCK
    OFFSET: gl.constexpr = gl.int64 if BLOCK * max(C, RP) >= 2**31 else gl.int32
    pb, cb = gl.program_id(0), gl.program_id(1)
    first = gl.load(blocks_ptr + pb)
    end = gl.minimum(gl.load(blocks_ptr + PB + pb), R)
    r_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE))
    c_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE))
    rows, cols = first + r_local, cb * BLOCK + c_local
    valid = (rows >= 0) & (rows < end)
    mask = gl.expand_dims(valid, 1) & gl.expand_dims(cols < C, 0)
    tile = first.to(gl.int64) * C + cb * BLOCK
    offsets = gl.expand_dims(r_local.to(OFFSET), 1) * C + gl.expand_dims(c_local, 0)
    x = gl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(gl.float32)
    ax = gl.abs(x)
    scale = _scale(gl.max(ax, axis=1), FMAX)
    scale_t = _scale(gl.max(ax, axis=0), FMAX)
    gl.store(s_ptr + rows.to(gl.int64) * CB + cb, scale, mask=valid)
    gl.store(st_ptr + cols.to(gl.int64) * PB + pb, scale_t, mask=cols < C)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    gl.store(q_ptr + tile + offsets, _quantize(x, gl.expand_dims(scale, 1), dtype, FMAX), mask=mask)
    qt = gl.convert_layout(_quantize(x, gl.expand_dims(scale_t, 0), dtype, FMAX), TILE_T)
    rt = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE_T))
    ct = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE_T))
    tile_t = cb.to(gl.int64) * BLOCK * RP + pb * BLOCK
    offsets_t = gl.expand_dims(ct.to(OFFSET), 0) * RP + gl.expand_dims(rt, 1)  # [r, c] -> qt[c, r]
    gl.store(qt_ptr + tile_t + offsets_t, qt, mask=gl.expand_dims(cb * BLOCK + ct < C, 0))


VARIANTS = {"tree": (quantize_kernels.quantize_pair_grouped_kernel, 4), "g4": (kernel, 4), "g8": (kernel, 8), "g16": (kernel, 16)}
gs = bench.Inputs(32768, 128, 128, 32).group_sizes
blocks, _ = fp8._padded_groups(gs, 32768)


def lowered(variant, x, **platforms):
  """backend_triton.quantize_pair_grouped of x under `variant`'s kernel, lowered (traced under the patch)."""
  if variant.startswith("tma"):  # tmaWARPS.PROGRAMS_PER_SM.STAGES
    warps, per_sm, stages = map(int, variant[3:].split("."))
    return jax.jit(lambda a: tma_call(a, blocks, dtype=jnp.float8_e4m3fn, warps=warps, programs_per_sm=per_sm,
                                      stages=stages)).trace(x).lower(**platforms)
  if variant == "copy":  # The roofline: 2 bytes read and 2 written an element.
    return jax.jit(lambda a: jax.lax.bitcast_convert_type(a, jnp.int16) ^ 1).trace(x).lower(**platforms)
  if variant.startswith("lin"):  # linWARPS
    warps, maxnreg, order = (variant[3:] + "..").split(".")[:3]  # linWARPS[.MAXNREG[.c]]: c, columns first
    return jax.jit(lambda a: lin_call(a, blocks, dtype=jnp.float8_e4m3fn, warps=int(warps),
                                      maxnreg=int(maxnreg) if maxnreg else None, columns_first=order == "c")).trace(
        x).lower(**platforms)
  kernel, warps = VARIANTS[variant]
  with mock.patch.object(quantize_kernels, "quantize_pair_grouped_kernel", kernel), \
       mock.patch.object(quantize_kernels, "NUM_WARPS", warps):
    return jax.jit(lambda a: backend_triton.quantize_pair_grouped(a, blocks, dtype=jnp.float8_e4m3fn)).trace(
        x).lower(**platforms)


if __name__ == "__main__" and sys.argv[0].endswith("quantize_gluon.py"):
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
  if sys.argv[1] == "sass":
    x = jax.ShapeDtypeStruct((32768, 4096), jnp.bfloat16)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in names:
      _compile._cache.clear()
      lowered(name, x, lowering_platforms=("cuda",))
      (kernel,) = _compile._cache.values()
      with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
          f.write(kernel.asm["ptx"])
        info = subprocess.run([f"{bin_dir}/ptxas", "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([f"{bin_dir}/cuobjdump", "--dump-sass", f"{d}/k.cubin"], capture_output=True,
                              text=True, check=True).stdout
      ops = [line.split(";")[0].split()[1 if line.split()[1].startswith("@") is False else 2]
             for line in sass.splitlines() if line.strip().startswith("/*") and ";" in line]
      counts = {}
      for op in ops:
        counts[op.split(".")[0]] = counts.get(op.split(".")[0], 0) + 1
      print(name, [l.strip() for l in info.splitlines() if "registers" in l or "spill" in l],
            {k: v for k, v in sorted(counts.items()) if k in ("LDS", "STS", "LDG", "STG", "SHFL", "BAR", "PRMT", "F2FP")},
            "total", len(ops))
    sys.exit()
  print("device:", jax.devices()[0].device_kind, flush=True)
  for cols in (4096, 7168):
    x = jax.random.normal(jax.random.key(0), (32768, cols), jnp.bfloat16)
    x = x.at[5, 7].set(jnp.nan).at[300, 9].set(jnp.inf) if os.environ.get("NONFINITE") else x
    fns = {name: lowered(name, x).compile() for name in names}
    ref = [np.asarray(o.astype(jnp.float32)) for o in fns[names[0]](x)]
    for name in [n for n in names[1:] if n != "copy"]:
      out = [np.asarray(o.astype(jnp.float32)) for o in fns[name](x)]
      print(f"  {name}: outputs equal to {names[0]}'s:", [bool(np.array_equal(a, b, equal_nan=True))
                                                        for a, b in zip(ref, out)], flush=True)
    ms = timing.time_interleaved({n: (lambda f=f: f(x), timing.jax_sync) for n, f in fns.items()},
                                 min_batch_s=0.03, batches=5)
    for name, t in ms.items():
      print(f"  (32768, {cols}) {name:8s} {t * 1e6:7.1f} us {4 * x.size / t / 1e9:6.0f} GB/s", flush=True)
