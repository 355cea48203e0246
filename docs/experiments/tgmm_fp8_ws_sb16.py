"""A diagnostic copy of triton_kernels/tgmm_fp8_ws.py (issue 15, session 37): the column scales (rhs's, per 128 rows
and column) come as bfloat16 (a (1, BLOCK_N) bf16 box: two scales in a 32-bit word, 16 registers a thread instead of
32) and are widened at the promotion; PREFETCH reads them before the wgmma wait. Timed by tgmm_fp8_ab.py against the
tree's kernel; its results differ by the scales' bf16 rounding.
"""
import jax.numpy as jnp

from jgmm import ffi
from jgmm.backend_triton import geometry, gmm_fp8_ws, gmm_ws

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_fp8_ws import BLOCK, row_channel_scales
from jgmm.triton_kernels.gmm_ws import HALF, _tma_load, allocate, release_stages, store_half
from jgmm.triton_kernels.tgmm_ws import group_tile, keep_only

NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch; the consumers then take 240, the loader 24.
# A step's scale rows (1 x 128 of lhs_scale, 1 x BLOCK_N of rhs_scale) come by TMA into unswizzled shared memory.
SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
SB_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


@gluon.jit
def _tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr):
  """tgmm_ws.group_tile's (group, K tile, N tile, first row, end) and the group's first step and steps on the
  128-row scale grid and the K rows in tile t."""
  g, ki, ni, start, end = group_tile(bounds_ptr, t, K, N, BLOCK_N)
  first = start // BLOCK
  steps = ((end + BLOCK - 1) // BLOCK - first) * (end > start).to(gl.int32)
  return g, ki, ni, start, end, first, steps, gl.minimum(K - ki * BLOCK, BLOCK)


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty,
            G: gl.constexpr, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
            RHS_GROUPS: gl.constexpr):
  num_tiles: gl.constexpr = G * ((K + BLOCK - 1) // BLOCK) * ((N + BLOCK_N - 1) // BLOCK_N)
  # One lhs half, the rhs tile and the scale rows (rhs's unless RHS_GROUPS).
  half_bytes: gl.constexpr = (lhs_desc.block_type.nbytes + rhs_desc.block_type.nbytes + sa_desc.block_type.nbytes
                              + (0 if RHS_GROUPS else sb_desc.block_type.nbytes))
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    _, ki, ni, _, _, first, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N)
    both = rows > HALF  # Else the bottom half holds no K row: its consumer skips it, so no load.
    for kk in range(steps):
      slot = step % S
      m0 = (first + kk) * BLOCK
      mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
      mbarrier.expect(ready.index(slot), half_bytes + lhs_desc.block_type.nbytes, pred=both)
      mbarrier.expect(ready.index(slot), half_bytes, pred=rows <= HALF)
      _tma_load(lhs_desc, [ki * BLOCK, m0], ready.index(slot), a_bufs.index(2 * slot))
      _tma_load(lhs_desc, [ki * BLOCK + HALF, m0], ready.index(slot), a_bufs.index(2 * slot + 1), pred=both)
      _tma_load(rhs_desc, [ni * BLOCK_N, m0], ready.index(slot), b_bufs.index(slot))
      _tma_load(sa_desc, [first + kk, ki * BLOCK], ready.index(slot), sa_bufs.index(slot))
      if not RHS_GROUPS:
        _tma_load(sb_desc, [first + kk, ni * BLOCK_N], ready.index(slot), sb_bufs.index(slot))
      step += 1


@gluon.jit
def _zero_other_rows(a_buf, m0, start, end):
  """Zeroes the columns of a_buf (64 K rows x 128 rows of M from m0) outside the group's rows [start, end)."""
  layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
  cols = m0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, layout))
  keep_only(a_buf, gl.expand_dims((cols >= start) & (cols < end), 0), layout)


@gluon.jit
def _add_scaled(acc, a, b, sa, sb_buf, RHS_GROUPS: gl.constexpr):
  """acc + (a @ b) * sa[:, None] * sb[None, :] (sb: 1 with RHS_GROUPS), the product's wgmmas from zero
  (promotion). The column scales sb (32 registers a thread) are read from sb_buf while the wgmmas run: two
  accumulators, a product and one sb fit."""
  product = warpgroup_mma(a, b, acc, use_acc=False, is_async=True)
  if RHS_GROUPS:
    product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
    return acc + product * gl.expand_dims(sa, 1)
  sb = sb_buf.load(gl.SliceLayout(0, acc.type.layout))
  product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
  return acc + product * (gl.expand_dims(sa, 1) * gl.expand_dims(sb.to(gl.float32), 0))


@gluon.jit
def _ready_lhs(a_bufs, ready, step, m0, start, end, S: gl.constexpr, H: gl.constexpr):
  """This consumer's lhs half of stage `step` once it has landed, other groups' rows zeroed (m0: its first row)."""
  slot = step % S
  mbarrier.wait(ready.index(slot), (step // S) & 1)
  a = a_bufs.index(2 * slot + H)
  if (m0 < start) | (m0 + BLOCK > end):
    _zero_other_rows(a, m0, start, end)
  return a


@gluon.jit
def _reduce_wide(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc, acc_right, step, first, steps, start, end,
                 S: gl.constexpr, H: gl.constexpr, RHS_GROUPS: gl.constexpr):
  """(acc, acc_right) after the tile's steps, 256 wide: per step the left then the right column half, each waited
  for and promoted before the next (two accumulators and one product fit the registers). _ready_lhs's wait and
  zeroing are written out here: with the row scales read between them ptxas spills 212 B, through _ready_lhs 260 B
  (`docs/experiments/tgmm_fp8_ab.py sass`)."""
  ROWS: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
  for kk in range(steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    sa = sa_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF).load(ROWS)
    sb = sb_bufs.index(slot).reshape([2 * BLOCK])
    a = a_bufs.index(2 * slot + H)
    m0 = (first + kk) * BLOCK
    if (m0 < start) | (m0 + BLOCK > end):
      _zero_other_rows(a, m0, start, end)
    b = b_bufs.index(slot)
    acc = _add_scaled(acc, a, b.slice(0, BLOCK).permute((1, 0)), sa, sb.slice(0, BLOCK), RHS_GROUPS)
    acc_right = _add_scaled(acc_right, a, b.slice(BLOCK, BLOCK).permute((1, 0)), sa, sb.slice(BLOCK, BLOCK),
                            RHS_GROUPS)
    mbarrier.arrive(empty.index(slot))
  return acc, acc_right


@gluon.jit
def _issue(a_bufs, b_bufs, ready, acc, step, m0, start, end, S: gl.constexpr, H: gl.constexpr):
  """Issues the product of stage `step` (128 wide) once its lhs half is ready; returns it in flight."""
  a = _ready_lhs(a_bufs, ready, step, m0, start, end, S, H)
  return warpgroup_mma(a, b_bufs.index(step % S).permute((1, 0)), acc, use_acc=False, is_async=True)


@gluon.jit
def _retire(acc, product, sa_bufs, sb_bufs, empty, step, outstanding: gl.constexpr, S: gl.constexpr,
            H: gl.constexpr, RHS_GROUPS: gl.constexpr, PREFETCH: gl.constexpr = False):
  """acc + product * sa[:, None] * sb[None, :] (sb: 1 with RHS_GROUPS) with stage `step`'s scales once the product
  is done (`outstanding` later products still in flight); releases the stage."""
  slot = step % S
  if PREFETCH:
    sb = sb_bufs.index(slot).reshape([BLOCK]).load(gl.SliceLayout(0, acc.type.layout))
  product = warpgroup_mma_wait(num_outstanding=outstanding, deps=(product,))
  sa = sa_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF).load(gl.SliceLayout(1, acc.type.layout))
  if not PREFETCH:
    sb = sb_bufs.index(slot).reshape([BLOCK]).load(gl.SliceLayout(0, acc.type.layout))
  acc = acc + product * (gl.expand_dims(sa, 1) * gl.expand_dims(sb.to(gl.float32), 0))
  mbarrier.arrive(empty.index(slot))
  return acc


@gluon.jit
def _reduce_pipelined(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc, step, first, steps, start, end,
                      S: gl.constexpr, H: gl.constexpr, RHS_GROUPS: gl.constexpr, PREFETCH: gl.constexpr):
  """acc after the tile's steps (steps > 0), 128 wide, two products in flight: step kk + 1's issued before step
  kk's is promoted. Unrolled by two, so that no loop-carried copy reads a product in flight (ptxas would serialise
  the wgmmas)."""
  p0 = _issue(a_bufs, b_bufs, ready, acc, step, first * BLOCK, start, end, S, H)
  for j in range((steps - 1) // 2):
    kk = 2 * j + 1
    p1 = _issue(a_bufs, b_bufs, ready, acc, step + kk, (first + kk) * BLOCK, start, end, S, H)
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + kk - 1, 1, S, H, RHS_GROUPS, PREFETCH)
    p0 = _issue(a_bufs, b_bufs, ready, acc, step + kk + 1, (first + kk + 1) * BLOCK, start, end, S, H)
    acc = _retire(acc, p1, sa_bufs, sb_bufs, empty, step + kk, 1, S, H, RHS_GROUPS, PREFETCH)
  if steps % 2 == 0:
    p1 = _issue(a_bufs, b_bufs, ready, acc, step + steps - 1, (first + steps - 1) * BLOCK, start, end, S, H)
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + steps - 2, 1, S, H, RHS_GROUPS, PREFETCH)
    acc = _retire(acc, p1, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H, RHS_GROUPS, PREFETCH)
  else:
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H, RHS_GROUPS, PREFETCH)
  return acc


@gluon.jit
def _group_scaled(acc, rhs_scale_ptr, g, col0, steps, N: gl.constexpr, RHS_GROUPS: gl.constexpr,
                  LIVE: gl.constexpr):
  """acc (64, 128) times group g's column scales from col0 on (rhs_scale (G, N)) with RHS_GROUPS where the group has
  rows (steps > 0; an empty group's zeros stay exact whatever its scales), else acc. LIVE: whether this consumer has
  K rows at all (K > 64 H); Triton 3.6 crashes lowering a load in a branch it has found dead (its pointer has no
  alignment), so none is emitted there."""
  if RHS_GROUPS and LIVE:  # As the forward's channel scales (an empty group's acc: zeros times 0).
    cols = col0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(0, acc.type.layout))
    acc = row_channel_scales(acc, None, rhs_scale_ptr + g.to(gl.int64) * N + cols, None, (cols < N) & (steps > 0),
                             True, False)
  return acc


@gluon.jit
def _store(out_ptr, out_desc, c_buf, acc, g, ki, col0, half_rows, H: gl.constexpr, K: gl.constexpr,
           N: gl.constexpr, OUT_LAYOUT: gl.constexpr, TRANSPOSE_OUT: gl.constexpr):
  """acc (64 K rows from 128 ki + 64 H, 128 columns of N from col0; half_rows of them rows of K) into out[g]: (K, N),
  or (N, K) where TRANSPOSE_OUT."""
  if TRANSPOSE_OUT:
    store_half(out_ptr, out_desc, c_buf, acc, g * N + col0, ki * BLOCK + H * HALF, N - col0, K, BLOCK, OUT_LAYOUT,
               True)
  else:
    store_half(out_ptr, out_desc, c_buf, acc, g * K + ki * BLOCK + H * HALF, col0, half_rows, N, BLOCK, OUT_LAYOUT)


@gluon.jit
def _consumer(bounds_ptr, rhs_scale_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty,
              G: gl.constexpr, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, H: gl.constexpr, RHS_GROUPS: gl.constexpr, TRANSPOSE_OUT: gl.constexpr,
              PREFETCH: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32])
  WIDE: gl.constexpr = BLOCK_N == 2 * BLOCK
  num_tiles: gl.constexpr = G * ((K + BLOCK - 1) // BLOCK) * ((N + BLOCK_N - 1) // BLOCK_N)
  if TRANSPOSE_OUT:
    out_desc = tma.make_tensor_descriptor(out_ptr, [G * N, K], [K, 1], [BLOCK, HALF], OUT_LAYOUT)
  else:
    out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, BLOCK], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, first, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if WIDE:
      acc_right = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if (half_rows > 0) & (steps > 0):
      if WIDE:
        acc, acc_right = _reduce_wide(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc, acc_right, step, first,
                                      steps, start, end, S, H, RHS_GROUPS)
      else:
        acc = _reduce_pipelined(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc, step, first, steps, start, end,
                                S, H, RHS_GROUPS, PREFETCH)
    elif steps > 0:  # The other half has K rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, steps, S)
    step += steps
    if half_rows > 0:
      acc = _group_scaled(acc, rhs_scale_ptr, g, ni * BLOCK_N, steps, N, RHS_GROUPS, K > H * HALF)
      _store(out_ptr, out_desc, c_bufs.index(H), acc, g, ki, ni * BLOCK_N, half_rows, H, K, N, OUT_LAYOUT,
             TRANSPOSE_OUT)
      if WIDE and N > BLOCK:  # (Where N <= 128 no tile has a right half: no load in that dead branch.)
        if ni * BLOCK_N + BLOCK < N:
          acc_right = _group_scaled(acc_right, rhs_scale_ptr, g, ni * BLOCK_N + BLOCK, steps, N, RHS_GROUPS,
                                    K > H * HALF)
          _store(out_ptr, out_desc, c_bufs.index(H), acc_right, g, ki, ni * BLOCK_N + BLOCK, half_rows, H, K, N,
                 OUT_LAYOUT, TRANSPOSE_OUT)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_fp8_ws_kernel(lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, rhs_scale_ptr, out_ptr, G: gl.constexpr,
                       K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                       OUT_LAYOUT: gl.constexpr, RHS_GROUPS: gl.constexpr = False,
                       TRANSPOSE_OUT: gl.constexpr = False, PREFETCH: gl.constexpr = False):
  """lhs_desc over lhs (K, M), box (64, 128); rhs_desc over rhs (N, M), box (BLOCK_N, 128); sa_desc over lhs_scale
  (MB, K), box (1, 128), and sb_desc over rhs_scale (MB, N), box (1, BLOCK_N), both in SCALE_LAYOUT (with
  RHS_GROUPS: rhs_scale (G, N), read through rhs_scale_ptr; sb_desc unread); bounds (G + 1,) int32; out (G, K, N)
  through out_ptr and descriptors made here over its (G * K, N) view (box (64, 128), shared-memory layout
  OUT_LAYOUT), or with TRANSPOSE_OUT out (G, N, K) over (G * N, K) (box (128, 64))."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT, 2,
                                                  TRANSPOSE_OUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)
  sb_bufs = gl.allocate_shared_memory(gl.bfloat16, [S, 1, BLOCK_N], SB_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, rhs_scale_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K,
                   N, BLOCK_N, S, OUT_LAYOUT, 0, RHS_GROUPS, TRANSPOSE_OUT, PREFETCH)),
      (_consumer, (bounds_ptr, rhs_scale_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K,
                   N, BLOCK_N, S, OUT_LAYOUT, 1, RHS_GROUPS, TRANSPOSE_OUT, PREFETCH)),
      (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, G,
                 K, N, BLOCK_N, S, RHS_GROUPS)),
  ], [4, 1], [240, 24])


def make_call(prefetch):
  """backend_triton._tgmm_fp8_ws's launch of this copy, rhs_scale rounded to bf16."""
  def call(lhs, rhs, bounds, lhs_scale, rhs_scale, out_shape, config, device, rhs_scale_per_group, transpose_out):
    assert not rhs_scale_per_group
    k, n, num_groups = lhs.shape[0], rhs.shape[0], bounds.shape[0] - 1
    block, half = gmm_fp8_ws.BLOCK.value, gmm_ws.HALF.value
    layout = gmm_ws.shared_layout
    tiles = num_groups * geometry.cdiv(k, block) * geometry.cdiv(n, config.block_n)
    out_box = (block, half) if transpose_out else (half, block)
    return ffi.triton_call(
        ffi.TensorDescriptor(lhs, (half, block), layout=layout((half, block), lhs.dtype.name)),
        ffi.TensorDescriptor(rhs, (config.block_n, block), layout=layout((config.block_n, block), rhs.dtype.name)),
        ffi.TensorDescriptor(lhs_scale, (1, block), layout=SCALE_LAYOUT),
        ffi.TensorDescriptor(rhs_scale.astype(jnp.bfloat16), (1, config.block_n), layout=SB_LAYOUT),
        bounds, rhs_scale,
        kernel=tgmm_fp8_ws_kernel, out_shape=out_shape,
        grid=(min(device.num_sms, tiles),), num_warps=NUM_WARPS, maxnreg=MAXNREG,
        name="jgmm_tgmm_fp8_ws", G=num_groups, K=k, N=n, BLOCK_N=config.block_n, S=config.num_stages,
        OUT_LAYOUT=layout(out_box, out_shape.dtype.name), RHS_GROUPS=False, TRANSPOSE_OUT=transpose_out,
        PREFETCH=prefetch)
  return call


call = make_call(False)
