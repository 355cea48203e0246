"""tgmm_fp8_ws_kernel: the Hopper (sm_90) FP8 tgmm with 128x1 scales, warp-specialised in Gluon.

out[g] (K, N) = (lhs * lhs_scale)[:, rows of g] @ ((rhs * rhs_scale)[:, rows of g]).T: lhs (K, M) and rhs (N, M)
FP8, both M-contiguous (the contraction runs along M: K-major operands, the only ones Hopper's FP8 wgmma reads),
scales float32 (MB, K) and (MB, N) per 128 rows of M on M's global grid (gmm_fp8.py's tgmm), MB = cdiv(M, 128);
out (G, K, N) viewed (G * K, N).

gmm_fp8_ws.py's structure: one program per SM walks output tiles of 128 x BLOCK_N (128 or 256): t = program id, +
programs, ...; tile t is group t // (KT * NT), then its K and N tiles in bands of BAND K tiles (tgmm_ws.group_tile;
a group's tiles are consecutive: its rows stay in L2). A TMA loader warp fills S shared-memory stages; two consumer
warpgroups, consumer H owning K rows [64 H, 64 H + 64) of the tile, reduce the 128-row steps of M that hold rows of
the group, on the scale grid: steps [start // 128, cdiv(end, 128)). Per step and 128 columns, the wgmmas start from
zero and a float32 accumulator takes the product times sa[:, None] * sb[None, :] after the wait (promotion, as in
gmm_fp8_ws); a 256-wide tile does its two column halves one after the other (two float32 accumulators and one
product fit the registers; two products would not), so each step reads the lhs tile once for 256 columns. A 128-wide
tile keeps two products in flight instead: each consumer issues step s + 1's wgmmas before it waits for step s's and
promotes them (one float32 accumulator and two products fit), so its tensor cores run while it promotes (+24% on the
H200 without the zeroing below, docs/perf-notes.md "Session 21"). A group's first and last steps also hold rows of
other groups (or rows of none) unless its rows start and end on the 128-row grid (fp8_gmm's backward pads each group
to it): before its wgmma, each consumer zeroes those columns of its own lhs half in shared memory (the loader copies
all 128 rows of a step; TMA reads zeros past M). A tile of an empty group stores zeros without loading.
RHS_GROUPS: rhs's scales are one per group and column instead (rhs_scale (G, N), fp8_gmm's wgrad_scale="group"):
the promotion multiplies by the row scales alone and the epilogue by the tile's column scales, once (the 32 column
scales a thread would read per step are what the promotion costs: 1.48x faster on the H100 without them,
docs/perf-notes.md, sessions 29 and 31).
TRANSPOSE_OUT: out (G, N, K) instead, each tile stored transposed (fp8_gmm's weight gradient where the operand
scaled per group is lhs^T: its group scales stay column scales of the tile, applied once).
"""
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


@gluon.jit
def _tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BAND: gl.constexpr):
  """tgmm_ws.group_tile's (group, K tile, N tile, first row, end) and the group's first step and steps on the
  128-row scale grid and the K rows in tile t."""
  g, ki, ni, start, end = group_tile(bounds_ptr, t, K, N, BLOCK_N, BAND)
  first = start // BLOCK
  steps = ((end + BLOCK - 1) // BLOCK - first) * (end > start).to(gl.int32)
  return g, ki, ni, start, end, first, steps, gl.minimum(K - ki * BLOCK, BLOCK)


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty,
            G: gl.constexpr, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
            RHS_GROUPS: gl.constexpr, BAND: gl.constexpr):
  num_tiles: gl.constexpr = G * ((K + BLOCK - 1) // BLOCK) * ((N + BLOCK_N - 1) // BLOCK_N)
  # One lhs half, the rhs tile and the scale rows (rhs's unless RHS_GROUPS).
  half_bytes: gl.constexpr = (lhs_desc.block_type.nbytes + rhs_desc.block_type.nbytes + sa_desc.block_type.nbytes
                              + (0 if RHS_GROUPS else sb_desc.block_type.nbytes))
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    _, ki, ni, _, _, first, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BAND)
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
  return acc + product * (gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0))


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
            H: gl.constexpr, RHS_GROUPS: gl.constexpr):
  """acc + product * sa[:, None] * sb[None, :] (sb: 1 with RHS_GROUPS) with stage `step`'s scales once the product
  is done (`outstanding` later products still in flight); releases the stage."""
  product = warpgroup_mma_wait(num_outstanding=outstanding, deps=(product,))
  slot = step % S
  sa = sa_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF).load(gl.SliceLayout(1, acc.type.layout))
  if RHS_GROUPS:
    acc = acc + product * gl.expand_dims(sa, 1)
  else:
    sb = sb_bufs.index(slot).reshape([BLOCK]).load(gl.SliceLayout(0, acc.type.layout))
    acc = acc + product * (gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0))
  mbarrier.arrive(empty.index(slot))
  return acc


@gluon.jit
def _reduce_pipelined(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, acc, step, first, steps, start, end,
                      S: gl.constexpr, H: gl.constexpr, RHS_GROUPS: gl.constexpr):
  """acc after the tile's steps (steps > 0), 128 wide, two products in flight: step kk + 1's issued before step
  kk's is promoted. Unrolled by two, so that no loop-carried copy reads a product in flight (ptxas would serialise
  the wgmmas)."""
  p0 = _issue(a_bufs, b_bufs, ready, acc, step, first * BLOCK, start, end, S, H)
  for j in range((steps - 1) // 2):
    kk = 2 * j + 1
    p1 = _issue(a_bufs, b_bufs, ready, acc, step + kk, (first + kk) * BLOCK, start, end, S, H)
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + kk - 1, 1, S, H, RHS_GROUPS)
    p0 = _issue(a_bufs, b_bufs, ready, acc, step + kk + 1, (first + kk + 1) * BLOCK, start, end, S, H)
    acc = _retire(acc, p1, sa_bufs, sb_bufs, empty, step + kk, 1, S, H, RHS_GROUPS)
  if steps % 2 == 0:
    p1 = _issue(a_bufs, b_bufs, ready, acc, step + steps - 1, (first + steps - 1) * BLOCK, start, end, S, H)
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + steps - 2, 1, S, H, RHS_GROUPS)
    acc = _retire(acc, p1, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H, RHS_GROUPS)
  else:
    acc = _retire(acc, p0, sa_bufs, sb_bufs, empty, step + steps - 1, 0, S, H, RHS_GROUPS)
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
              BAND: gl.constexpr):
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
    g, ki, ni, start, end, first, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BAND)
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
                                S, H, RHS_GROUPS)
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
                       TRANSPOSE_OUT: gl.constexpr = False, BAND: gl.constexpr = 1):
  """lhs_desc over lhs (K, M), box (64, 128); rhs_desc over rhs (N, M), box (BLOCK_N, 128); sa_desc over lhs_scale
  (MB, K), box (1, 128), and sb_desc over rhs_scale (MB, N), box (1, BLOCK_N), both in SCALE_LAYOUT (with
  RHS_GROUPS: rhs_scale (G, N), read through rhs_scale_ptr; sb_desc unread); bounds (G + 1,) int32; out (G, K, N)
  through out_ptr and descriptors made here over its (G * K, N) view (box (64, 128), shared-memory layout
  OUT_LAYOUT), or with TRANSPOSE_OUT out (G, N, K) over (G * N, K) (box (128, 64))."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT, 2,
                                                  TRANSPOSE_OUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)
  sb_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK_N], SCALE_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, rhs_scale_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K,
                   N, BLOCK_N, S, OUT_LAYOUT, 0, RHS_GROUPS, TRANSPOSE_OUT, BAND)),
      (_consumer, (bounds_ptr, rhs_scale_ptr, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, G, K,
                   N, BLOCK_N, S, OUT_LAYOUT, 1, RHS_GROUPS, TRANSPOSE_OUT, BAND)),
      (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, bounds_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, G,
                 K, N, BLOCK_N, S, RHS_GROUPS, BAND)),
  ], [4, 1], [240, 24])
