"""tgmm_fp8_ws_kernel with its two consumers splitting the tile's columns instead of its K rows (session 35, issue
15): a diagnostic copy for `tgmm_fp8_ab.py time tree@128@5,splitn@128@5` on ALIGNED=1 operands only (groups padded
to the 128-row grid, as fp8_gmm's backward gives: no step holds another group's rows, so this copy zeroes none;
128-wide tiles, K a multiple of 128, out (G, K, N), the 128x1 recipe).

Why: the tree's consumer H owns K rows [64 H, 64 H + 64) x 128 columns, so each thread holds 2 row scales and 32
column scales through the per-step promotion acc + product * sa[i] * sb[j]; the 32 column scales' registers beside
one accumulator and two products in flight are what the promotion costs (docs/perf-notes.md, session 29). Here
consumer H owns all 128 K rows x columns [64 H, 64 H + 64): two m64n64 products a step (the K halves), each thread
4 row scales and 16 column scales, the same accumulator and product registers, 14 fewer live. Cost: each consumer
reads both lhs halves and its rhs half twice (32 KB of shared memory a step instead of 24).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_ws import HALF, allocate, store_half
from jgmm.triton_kernels.tgmm_fp8_ws import (BLOCK, MAXNREG, NUM_WARPS, SCALE_LAYOUT, _loader,  # noqa: F401
                                             _tile)


@gluon.jit
def _issue(a_bufs, b_bufs, ready, acc, step, S: gl.constexpr, H: gl.constexpr):
  """Stage `step`'s two products (lhs halves 0 and 1 x this consumer's 64 rhs rows) issued once it has landed."""
  slot = step % S
  mbarrier.wait(ready.index(slot), (step // S) & 1)
  b = b_bufs.index(slot).slice(H * HALF, HALF).permute((1, 0))  # (128 rows of M, 64 columns)
  top = warpgroup_mma(a_bufs.index(2 * slot), b, acc, use_acc=False, is_async=True)
  bottom = warpgroup_mma(a_bufs.index(2 * slot + 1), b, acc, use_acc=False, is_async=True)
  return top, bottom


@gluon.jit
def _retire(acc_top, acc_bottom, top, bottom, sa_bufs, sb_bufs, empty, step, outstanding: gl.constexpr,
            S: gl.constexpr, H: gl.constexpr):
  """The two accumulators plus stage `step`'s products times sa[:, None] * sb[None, :], once they are done
  (`outstanding` later products in flight); releases the stage."""
  top, bottom = warpgroup_mma_wait(num_outstanding=outstanding, deps=(top, bottom))
  slot = step % S
  rows: gl.constexpr = gl.SliceLayout(1, acc_top.type.layout)
  sa = sa_bufs.index(slot).reshape([BLOCK])
  sb = gl.expand_dims(sb_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF).load(
      gl.SliceLayout(0, acc_top.type.layout)), 0)
  acc_top = acc_top + top * (gl.expand_dims(sa.slice(0, HALF).load(rows), 1) * sb)
  acc_bottom = acc_bottom + bottom * (gl.expand_dims(sa.slice(HALF, HALF).load(rows), 1) * sb)
  mbarrier.arrive(empty.index(slot))
  return acc_top, acc_bottom


@gluon.jit
def _reduce(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc_top, acc_bottom, step, steps, S: gl.constexpr,
            H: gl.constexpr):
  """The tree's _reduce_pipelined with a step's two products: step kk + 1's issued before step kk's promotion."""
  t0, b0 = _issue(a_bufs, b_bufs, ready, acc_top, step, S, H)
  for j in range((steps - 1) // 2):
    kk = 2 * j + 1
    t1, b1 = _issue(a_bufs, b_bufs, ready, acc_top, step + kk, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t0, b0, sa_bufs, sb_bufs, empty, step + kk - 1, 2, S, H)
    t0, b0 = _issue(a_bufs, b_bufs, ready, acc_top, step + kk + 1, S, H)
    acc_top, acc_bottom = _retire(acc_top, acc_bottom, t1, b1, sa_bufs, sb_bufs, empty, step + kk, 2, S, H)
  if steps % 2 == 0:
    t1, b1 = _issue(a_bufs, b_bufs, ready, acc_top, step + steps - 1, S, H)
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
  num_tiles: gl.constexpr = G * (K // BLOCK) * ((N + BLOCK - 1) // BLOCK)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, HALF], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, _, _, _, steps, _ = _tile(bounds_ptr, t, K, N, BLOCK)
    acc_top = gl.zeros((HALF, HALF), dtype=gl.float32, layout=acc_layout)
    acc_bottom = gl.zeros((HALF, HALF), dtype=gl.float32, layout=acc_layout)
    if steps > 0:
      acc_top, acc_bottom = _reduce(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc_top, acc_bottom, step, steps,
                                    S, H)
    step += steps
    col = ni * BLOCK + H * HALF
    if col < N:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc_top, g * K + ki * BLOCK, col, HALF, N, HALF, OUT_LAYOUT)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc_bottom, g * K + ki * BLOCK + HALF, col, HALF, N, HALF,
                 OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_fp8_ws_kernel(lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, rhs_scale_ptr, out_ptr, G: gl.constexpr,
                       K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                       OUT_LAYOUT: gl.constexpr, RHS_GROUPS: gl.constexpr = False,
                       TRANSPOSE_OUT: gl.constexpr = False):
  """The tree's arguments; 128-wide, 128x1 scales, out (G, K, N), K % 128 == 0 only."""
  gl.static_assert((BLOCK_N == BLOCK) and (not RHS_GROUPS) and (not TRANSPOSE_OUT) and (K % BLOCK == 0))
  a_bufs, b_bufs, _, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT, 2)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2, HALF, HALF], OUT_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)
  sb_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK_N], SCALE_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K, N, S,
                   OUT_LAYOUT, 0)),
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K, N, S,
                   OUT_LAYOUT, 1)),
      (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, G,
                 K, N, BLOCK_N, S, RHS_GROUPS)),
  ], [4, 1], [240, 24])
