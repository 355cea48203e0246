"""A copy of triton_kernels/tgmm_fp8_ws.py (128-wide tiles only) for docs/experiments/tgmm_fp8_ab.py: each consumer
owns 64 columns (N) and all 128 rows (K) of a tile, as two m64n64 products per step, instead of 64 rows and 128
columns (one m64n128). A thread then holds 4 row scales and 16 column scales instead of 2 and 32 (the column scales'
registers are what the promotion costs: docs/perf-notes.md, session 29), for the same accumulator, the same
products in flight and the same shared-memory bytes per step. Rows outside a group are zeroed in each consumer's
own half of the rhs tile (its columns), not in the lhs tile both read.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_fp8_ws import BLOCK
from jgmm.triton_kernels.gmm_ws import HALF, allocate, release_stages, store_half
from jgmm.triton_kernels.tgmm_fp8_ws import MAXNREG, NUM_WARPS, SCALE_LAYOUT, _loader, _tile, _zero_other_rows

__all__ = ["MAXNREG", "NUM_WARPS", "SCALE_LAYOUT", "tgmm_fp8_ws_kernel"]


@gluon.jit
def _issue(a_bufs, b_bufs, ready, acc, step, m0, start, end, S: gl.constexpr, H: gl.constexpr):
  """The two products (top and bottom 64 rows) of stage `step` on this consumer's 64 columns, in flight."""
  slot = step % S
  mbarrier.wait(ready.index(slot), (step // S) & 1)
  b = b_bufs.index(slot).slice(H * HALF, HALF)  # (64 columns, 128 rows of M)
  if (m0 < start) | (m0 + BLOCK > end):
    _zero_other_rows(b, m0, start, end)
  b = b.permute((1, 0))
  top = warpgroup_mma(a_bufs.index(2 * slot), b, acc, use_acc=False, is_async=True)
  bottom = warpgroup_mma(a_bufs.index(2 * slot + 1), b, acc, use_acc=False, is_async=True)
  return top, bottom


@gluon.jit
def _retire(acc_top, acc_bottom, top, bottom, sa_bufs, sb_bufs, empty, step, outstanding: gl.constexpr,
            S: gl.constexpr, H: gl.constexpr):
  top, bottom = warpgroup_mma_wait(num_outstanding=outstanding, deps=(top, bottom))
  slot = step % S
  rows: gl.constexpr = gl.SliceLayout(1, acc_top.type.layout)
  sa = sa_bufs.index(slot).reshape([BLOCK])
  sb = sb_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF).load(gl.SliceLayout(0, acc_top.type.layout))
  sb = gl.expand_dims(sb, 0)
  acc_top = acc_top + top * (gl.expand_dims(sa.slice(0, HALF).load(rows), 1) * sb)
  acc_bottom = acc_bottom + bottom * (gl.expand_dims(sa.slice(HALF, HALF).load(rows), 1) * sb)
  mbarrier.arrive(empty.index(slot))
  return acc_top, acc_bottom


@gluon.jit
def _reduce_pipelined(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc_top, acc_bottom, step, first, steps,
                      start, end, S: gl.constexpr, H: gl.constexpr):
  t0, b0 = _issue(a_bufs, b_bufs, ready, acc_top, step, first * BLOCK, start, end, S, H)
  for j in range((steps - 1) // 2):
    kk = 2 * j + 1
    t1, b1 = _issue(a_bufs, b_bufs, ready, acc_top, step + kk, (first + kk) * BLOCK, start, end, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t0, b0, sa_bufs, sb_bufs, empty, step + kk - 1, 2, S, H)
    t0, b0 = _issue(a_bufs, b_bufs, ready, acc_top, step + kk + 1, (first + kk + 1) * BLOCK, start, end, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t1, b1, sa_bufs, sb_bufs, empty, step + kk, 2, S, H)
  if steps % 2 == 0:
    t1, b1 = _issue(a_bufs, b_bufs, ready, acc_top, step + steps - 1, (first + steps - 1) * BLOCK, start, end, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t0, b0, sa_bufs, sb_bufs, empty, step + steps - 2, 2, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t1, b1, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H)
  else:
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t0, b0, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H)
  return acc_top, acc_bottom


@gluon.jit
def _consumer(bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G: gl.constexpr,
              K: gl.constexpr, N: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 32])
  num_tiles: gl.constexpr = G * ((K + BLOCK - 1) // BLOCK) * ((N + BLOCK - 1) // BLOCK)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, HALF], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, first, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK)
    col = ni * BLOCK + H * HALF
    acc_top = gl.zeros((HALF, HALF), dtype=gl.float32, layout=acc_layout)
    acc_bottom = gl.zeros((HALF, HALF), dtype=gl.float32, layout=acc_layout)
    if (col < N) & (steps > 0):
      acc_top, acc_bottom = _reduce_pipelined(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc_top, acc_bottom,
                                              step, first, steps, start, end, S, H)
    elif steps > 0:  # The other consumer has columns: keep in step with the stages it consumes.
      release_stages(ready, empty, step, steps, S)
    step += steps
    if col < N:
      row = g * K + ki * BLOCK
      store_half(out_ptr, out_desc, c_bufs.index(H), acc_top, row, col, gl.minimum(rows, HALF), N, HALF, OUT_LAYOUT)
      if rows > HALF:
        store_half(out_ptr, out_desc, c_bufs.index(H), acc_bottom, row + HALF, col, rows - HALF, N, HALF,
                   OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_fp8_ws_kernel(lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, out_ptr, G: gl.constexpr, K: gl.constexpr,
                       N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """tgmm_fp8_ws.tgmm_fp8_ws_kernel's arguments, BLOCK_N = 128 only."""
  gl.static_assert(BLOCK_N == BLOCK)
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, HALF, S, OUT_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)
  sb_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K, N, S,
                   OUT_LAYOUT, 0)),
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K, N, S,
                   OUT_LAYOUT, 1)),
      (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, G,
                 K, N, BLOCK_N, S)),
  ], [4, 1], [240, 24])
