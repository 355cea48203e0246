"""Diagnostic copy of triton_kernels/tgmm_ws.py (issue 17, session 38): each consumer stores a tile's output while
the tensor cores run the next tile's first step, instead of between the two.

The tree's consumer ends a tile with: wait for the last wgmma, convert the 64 x BLOCK_N accumulator, write it to
shared memory, fence, TMA store; only then does it issue the next tile's first wgmma, so the tensor cores idle
through the epilogue (32 steps a tile on mixtral's weight gradient: the epilogue weighs 4x what it does in the
forward's 64-step tiles). Here the converted output (64 registers of packed 2-byte values) waits in registers; the
next tile's first wgmma is issued, then the pending output goes to shared memory and out
while it runs. Same products in the same order: outputs bit-identical to the tree's.

Same API as tgmm_ws (docs/experiments/tgmm_ws_overlap_ab.py patches it into backend_triton).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_ws import HALF, allocate, release, release_stages, store_half
from jgmm.triton_kernels.tgmm_ws import (BLOCK_M, MAXNREG, NUM_WARPS, _column_sums, _last_start, _loader, _tile,
                                         _zero_rows_outside)

__all__ = ["BLOCK_M", "MAXNREG", "NUM_WARPS", "tgmm_ws_kernel"]


@gluon.jit
def _consumer(bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G: gl.constexpr,
              K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, BIAS_GRAD: gl.constexpr, H: gl.constexpr):
  sums_layout: gl.constexpr = gl.BlockedLayout([16, BLOCK_N // 128], [1, 32], [1, 4], [1, 0])
  sums_here: gl.constexpr = BIAS_GRAD and H == 0
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  out_dtype: gl.constexpr = out_ptr.dtype.element_ty
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  last_start = _last_start(bounds_ptr, G, BLOCK_K)
  step = 0
  # The previous tile's output, converted and not yet stored (pending_rows > 0), at out rows pending_row.., columns
  # pending_col..
  pending = gl.zeros((HALF, BLOCK_N), dtype=out_dtype, layout=acc_layout)
  pending_row = 0
  pending_col = 0
  pending_rows = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    sums = gl.zeros((BLOCK_N,), gl.float32, gl.SliceLayout(0, sums_layout))
    if (half_rows > 0) & (steps > 0):
      for kk in range(steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        a = a_bufs.index(2 * slot + H)
        lo = start + kk * BLOCK_K  # The step's own rows: [lo, min(lo + BLOCK_K, end)), read from row m0.
        m0 = gl.minimum(lo, last_start)
        if (m0 < lo) | (m0 + BLOCK_K > end):
          _zero_rows_outside(a, m0, lo, end, BLOCK_K)
        acc = warpgroup_mma(a.permute((1, 0)), b_bufs.index(slot), acc, is_async=True)
        if pending_rows > 0:  # (Only at kk == 0: stored once.) Out while the tensor cores run this step.
          store_half(out_ptr, out_desc, c_bufs.index(H), pending, pending_row, pending_col, pending_rows, N,
                     BLOCK_N, OUT_LAYOUT)
          pending_rows = 0
        if sums_here:
          if ki == 0:
            sums += _column_sums(b_bufs.index(slot), m0, lo, end, BLOCK_K, BLOCK_N, sums_layout)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        release(empty, empty, (step + kk + S - 1) % S, kk > 0, 1)  # The previous step's stage.
      acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
      release(empty, empty, (step + steps - 1) % S, True, 1)
    elif steps > 0:  # The other half has K rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, steps, S)
    step += steps
    if half_rows > 0:
      if pending_rows > 0:  # This tile ran no wgmma of this consumer (an empty group): store it now.
        store_half(out_ptr, out_desc, c_bufs.index(H), pending, pending_row, pending_col, pending_rows, N, BLOCK_N,
                   OUT_LAYOUT)
      pending = acc.to(out_dtype)
      pending_row = g * K + ki * BLOCK_M + H * HALF
      pending_col = ni * BLOCK_N
      pending_rows = half_rows
    if sums_here:
      if ki == 0:
        cols = ni * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, sums_layout))
        gl.store(dbias_ptr + g.to(gl.int64) * N + cols, sums, mask=cols < N)
  if pending_rows > 0:
    store_half(out_ptr, out_desc, c_bufs.index(H), pending, pending_row, pending_col, pending_rows, N, BLOCK_N,
               OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_ws_kernel(lhs_desc, rhs_desc, bounds_ptr, out_ptr, dbias_ptr, G: gl.constexpr, K: gl.constexpr,
                   N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                   OUT_LAYOUT: gl.constexpr, BIAS_GRAD: gl.constexpr):
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K,
                   S, OUT_LAYOUT, BIAS_GRAD, 0)),
      (_consumer, (bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K,
                   S, OUT_LAYOUT, BIAS_GRAD, 1)),
      (_loader, (lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K, S)),
  ], [4, 1], [232, 40])
