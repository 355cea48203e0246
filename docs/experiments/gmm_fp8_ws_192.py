"""Experiment (issue 15): gmm_fp8_ws_kernel with 192-row tiles, three consumer warpgroups of 64 rows at 160 registers.

A step of a 192 x 128 tile reads 24 KiB of lhs and 16 KiB of rhs for 6.3 MFLOP: 17% fewer bytes per FLOP than
128 x 128 (the kernel is bound by the L2's bandwidth there, docs/perf-notes.md, session 16), without the second
accumulator that makes 128 x 256 spill. The consumers are gmm_fp8_ws's (HALVES = 3); this file holds the loader of
three lhs halves and the launch. backend_triton builds the schedule and tile-major scales of 192-row tiles when
gmm_ws.BLOCK_M reads 192 (docs/experiments/fp8_profile.py's m192_* variants patch it while tracing).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from jgmm.triton_kernels.gmm_fp8_ws import (BLOCK, ROW_SCALE_LAYOUT, SCALE_LAYOUT, SCALES, _consumer,  # noqa: F401
                                            copy_rhs_scales)  # (ROW_SCALE_LAYOUT: backend_triton reads it here)
from jgmm.triton_kernels.gmm_ws import HALF, _tma_load, tile_of

C = gl.constexpr(3)  # Consumer warpgroups: 64 rows each.
NUM_WARPS = 4
MAXNREG = 128  # 16 warps x 128 fill the register file at launch; the consumers then take 160, the loader 24.


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty,
            K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
            LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  num_nb: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  base: gl.constexpr = rhs_desc.block_type.nbytes + (sa_desc.block_type.nbytes if LHS_BLOCKS else 0)
  half: gl.constexpr = lhs_desc.block_type.nbytes
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = tile_of(schedule_ptr, t, num_n, R_MAX)
    sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_nb + ni * (BLOCK_N // BLOCK)) * k_steps
    right = ni * BLOCK_N + BLOCK < N
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        bar = ready.index(slot)
        mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
        if RHS_BLOCKS:
          copy_rhs_scales(s_bufs.index(slot), bar, sb_ptr, kk, k_steps, right)
        mbarrier.expect(bar, base + half, pred=rows <= HALF)
        mbarrier.expect(bar, base + 2 * half, pred=(rows > HALF) & (rows <= 2 * HALF))
        mbarrier.expect(bar, base + 3 * half, pred=rows > 2 * HALF)
        for h in gl.static_range(C):
          _tma_load(lhs_desc, [row0 + h * HALF, kk * BLOCK], bar, a_bufs.index(C * slot + h), pred=rows > h * HALF)
        _tma_load(rhs_desc, [g * N + ni * BLOCK_N, kk * BLOCK], bar, b_bufs.index(slot))
        if LHS_BLOCKS:
          _tma_load(sa_desc, [t // num_n * k_steps + kk, 0], bar, sa_bufs.index(slot))
        step += 1


@gluon.jit
def gmm_fp8_ws_kernel(lhs_desc, rhs_desc, sa_desc, schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr,
                      K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                      LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [C * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [C, HALF, BLOCK], OUT_LAYOUT)
  s_bufs = gl.allocate_shared_memory(gl.float32, [S, SCALES], SCALE_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S] + sa_desc.block_type.shape, ROW_SCALE_LAYOUT)
  ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=C)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                   ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0, C)),
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                   ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1, C)),
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                   ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 2, C)),
      (_loader, (lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
                 empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS)),
  ], [4, 4, 1], [160, 160, 24])
