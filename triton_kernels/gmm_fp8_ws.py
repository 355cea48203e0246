"""gmm_fp8_ws_kernel: the Hopper (sm_90) FP8 gmm with fine-grained scales, warp-specialised in Gluon.

Rows of a tile's group g: out = (lhs * lhs_scale) @ (rhs[g] * rhs_scale[g]).T; lhs (rows, K) FP8, rhs (G, N, K) FP8
viewed as (G * N, K) (K-major: Hopper's FP8 wgmma reads B only K-major), out (rows, N). Scales as gmm_fp8.py's
(LHS_BLOCKS: lhs (rows, KB) per 1x128 block, else (rows,); RHS_BLOCKS: rhs (G, NB, KB) per 128x128 block, else
(G, N)); with LHS_BLOCKS the kernel reads the lhs block scales tile-major (backend_triton._tile_scales: (R_MAX * KB,
128), row r * KB + kb the K block kb scales of row tile r's 128 rows). Used for the contiguous gmm with K-major rhs
and the masked layout (lhs (G * max_m, K)).

gmm_ws.py's structure and code: one program per SM, its TMA loader warp, schedule and epilogue (TMA stores clipped
to a tile's rows), consumer warpgroups of 64 rows each; here BLOCK_K = 128 (a step is one K scale block, the last
one partial: TMA reads zeros past K), and tiles of 128 rows (HALVES = 2: two consumers at 240 registers) by
BLOCK_N = 128 or 256 (one or two rhs scale blocks), or of 192 rows (HALVES = 3: three consumers at 160 registers)
by 128, which reads 17% fewer bytes per FLOP than 128 x 128 where the L2's bandwidth bounds the kernel
(docs/perf-notes.md).

The loader puts a step's block scales into its stage beside the operands: the tile's lhs scales by TMA (a (1, 128)
or (1, 256) box of the tile-major scales, on the stage's `ready` barrier with the operands), the rhs block scales by
cp.async (one or two floats, each copied 64 times). A consumer's main loop: each step's wgmmas start from zero in a
fresh register accumulator (promotion: Hopper's FP8 wgmma accumulates with ~14 bits, gmm_fp8.py); while they run,
it reads the step's scales from shared memory (no global load waits in the loop: each waited on the saturated L2,
docs/perf-notes.md); after the wait, the float32 accumulator takes that product scaled by its block scales (one
FMA per element), while the other consumers' wgmmas keep the tensor cores busy (ptxas serialises a wgmma whose
accumulator registers are read before it completes: docs/perf-notes.md). A 256-wide tile does its two column
halves one after the other (two float32 accumulators and one product fit the registers), so a step reads the lhs
tile once for 256 columns. Row and channel scales multiply the accumulator once, in the epilogue. A tile's rows
past its group's rows (masked: past masked_m[g]) are stored as zeros, whatever their operands or scales hold.

schedule: gmm_ws's (1 + 6 R_MAX,) int32 (per row tile of 64 HALVES rows: group, first row, rows of the group, rows
to store); for the masked layout (MASKED_M = max_m > 0) masked_m itself, from which gmm_ws.tile_of computes each
tile (one per 64 HALVES of each group's max_m rows): no XLA kernel builds a schedule before the launch.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_ws import (HALF, _tma_load, allocate, consumer_tile, load_stage, release_stages,
                                        row_tiles_in_use, store_half, tile_of)

# cp.async copies: Triton 3.6's name, renamed async_load after it (the old name then raises).
_async_load = getattr(async_copy, "async_load", async_copy.async_copy_global_to_shared)

BLOCK = gl.constexpr(128)  # BLOCK_N and BLOCK_K: one 128-wide scale block each.
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
# Registers per thread at launch, by HALVES (12 or 16 warps fill the register file); then two consumers take 240
# (three 64 x 128 fp32 accumulators at 256 wide) or three take 160 (two), the loader 24.
MAXNREG = {2: 168, 3: 128}
# A stage's rhs block scales (float32): of the left and of the right 128 columns, 64 copies each (a consumer reads
# a (64,) row vector of either).
SCALES = gl.constexpr(128)
SCALE_LAYOUT = gl.SwizzledSharedLayout(1, 1, 1, [0])
# A stage's lhs block scales, a (1, 128) row of the tile-major scales, come by TMA into unswizzled shared memory.
ROW_SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def copy_rhs_scales(s_buf, ready_bar, sb_ptr, kk, k_steps, right):
  """The loader's asynchronous copies of K block kk's rhs block scales into s_buf (SCALES's layout): sb_ptr + kk,
  and sb_ptr + k_steps + kk if right; ready_bar's phase completes only once they have landed (issued before the
  stage's expect: cp.async.mbarrier.arrive adds its arrival to the phase the expect's TMA bytes close)."""
  i = gl.arange(0, BLOCK, layout=gl.BlockedLayout([4], [32], [1], [0]))
  upper = i >= HALF
  _async_load(s_buf, sb_ptr + upper.to(gl.int32) * k_steps + kk, mask=(~upper) | right)
  async_copy.mbarrier_arrive(ready_bar)


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty,
            K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
            LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, HALVES: gl.constexpr, MASKED_M: gl.constexpr):
  """gmm_ws's loader, each stage with its block scales where the recipe has them: the lhs ones by TMA with the
  operands (counted by the same expect), the rhs ones by copy_rhs_scales (issued before that expect)."""
  sa_bytes: gl.constexpr = sa_desc.block_type.nbytes if LHS_BLOCKS else 0
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  num_nb: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  step = 0
  for t in range(gl.program_id(0), row_tiles_in_use(schedule_ptr, R_MAX, MASKED_M) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = tile_of(schedule_ptr, t, num_n, R_MAX, 1, MASKED_M, HALVES * HALF)
    sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_nb + ni * (BLOCK_N // BLOCK)) * k_steps
    right = ni * BLOCK_N + BLOCK < N  # A wide tile's right half holds columns of out.
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
        if RHS_BLOCKS:
          copy_rhs_scales(s_bufs.index(slot), ready.index(slot), sb_ptr, kk, k_steps, right)
        load_stage(lhs_desc, rhs_desc, a_bufs, b_bufs, ready.index(slot), slot, g, row0, rows, ni, kk, K, N,
                   BLOCK_N, BLOCK, True, sa_bytes, HALVES)
        if LHS_BLOCKS:  # After the expect, as every TMA copy on the barrier.
          _tma_load(sa_desc, [t // num_n * k_steps + kk, 0], ready.index(slot), sa_bufs.index(slot))
        step += 1


@gluon.jit
def _add_product(acc, a, b, after, sa_buf, s_buf, H: gl.constexpr, R: gl.constexpr, LHS_BLOCKS: gl.constexpr,
                 RHS_BLOCKS: gl.constexpr):
  """acc + a @ b, the wgmmas from zero (promotion), scaled per row by the stage's block scales where the recipe has
  them (consumer H's 64 lhs scales in sa_buf times the rhs block scale of column half R in s_buf), read from shared
  memory while the wgmmas run. The wgmma nominally reads `after` (use_acc=False ignores its value): given the
  accumulator updated last, LLVM keeps that update before these wgmmas instead of sinking it past them (two
  products live at once: spills)."""
  product = warpgroup_mma(a, b, after, use_acc=False, is_async=True)
  ROWS: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
  if LHS_BLOCKS:
    scale = sa_buf.reshape([sa_buf.shape[1]]).slice(H * HALF, HALF).load(ROWS)
    if RHS_BLOCKS:
      scale = scale * s_buf.slice(R * HALF, HALF).load(ROWS)
  elif RHS_BLOCKS:
    scale = s_buf.slice(R * HALF, HALF).load(ROWS)
  product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
  if LHS_BLOCKS or RHS_BLOCKS:
    return acc + product * gl.expand_dims(scale, 1)
  return acc + product


@gluon.jit
def scaled_steps(acc, acc_right, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty, step, k_steps, S: gl.constexpr,
                 LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, WIDE: gl.constexpr, H: gl.constexpr,
                 HALVES: gl.constexpr):
  """(acc, acc_right) + consumer H's products with its rhs tile over k_steps K blocks, from stage `step` on
  (_add_product per block; a stage holds HALVES lhs halves, a_bufs[HALVES * slot + H] consumer H's); every stage
  released. WIDE: a 256-wide rhs tile, per K block its two 128-column halves one after the other into acc and
  acc_right (two float32 accumulators and one product fit the registers; a step reads the lhs tile once for 256
  columns; a right half past N, TMA zeros or the next group's rows, is computed and never stored); else acc_right
  is returned as given."""
  for kk in range(k_steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    a = a_bufs.index(HALVES * slot + H)
    b = b_bufs.index(slot)
    s_buf = s_bufs.index(slot)
    sa_buf = sa_bufs.index(slot)
    if WIDE:
      acc = _add_product(acc, a, b.slice(0, BLOCK).permute((1, 0)), acc_right, sa_buf, s_buf, H, 0, LHS_BLOCKS,
                         RHS_BLOCKS)
      acc_right = _add_product(acc_right, a, b.slice(BLOCK, BLOCK).permute((1, 0)), acc, sa_buf, s_buf, H, 1,
                               LHS_BLOCKS, RHS_BLOCKS)
    else:
      acc = _add_product(acc, a, b.permute((1, 0)), acc, sa_buf, s_buf, H, 0, LHS_BLOCKS, RHS_BLOCKS)
    mbarrier.arrive(empty.index(slot))
  return acc, acc_right


@gluon.jit
def row_channel_scales(acc, sa_ptrs, sb_ptr, row_mask, col_mask, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  """acc times its row scales (the (64,) pointers sa_ptrs, unless LHS_BLOCKS) and channel scales (sb_ptr, unless
  RHS_BLOCKS)."""
  if not LHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sa_ptrs, mask=row_mask, other=0.0), 1)
  if not RHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sb_ptr, mask=col_mask, other=0.0), 0)
  return acc


@gluon.jit
def _consumer(schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs, ready,
              empty, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
              LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
              HALVES: gl.constexpr, MASKED_M: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32])
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  COLS: gl.constexpr = gl.SliceLayout(0, acc_layout)
  WIDE: gl.constexpr = BLOCK_N == 2 * BLOCK
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK], OUT_LAYOUT)
  rows_in_half = gl.arange(0, HALF, layout=ROWS)
  step = 0
  for t in range(gl.program_id(0), row_tiles_in_use(schedule_ptr, R_MAX, MASKED_M) * num_n, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H, 1, MASKED_M,
                                                            HALVES * HALF)
    row_mask = rows_in_half < half_rows
    col0 = ni * BLOCK_N
    right = col0 + BLOCK < N  # A wide tile's right half holds columns of out.
    acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    acc_right = acc
    if WIDE:
      acc_right = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      acc, acc_right = scaled_steps(acc, acc_right, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty, step, k_steps, S,
                                    LHS_BLOCKS, RHS_BLOCKS, WIDE, H, HALVES)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      cols = col0 + gl.arange(0, BLOCK, layout=COLS)
      sa_ptrs = lhs_scale_ptr + row.to(gl.int64) + rows_in_half  # Row scales (without LHS_BLOCKS).
      acc = row_channel_scales(acc, sa_ptrs, rhs_scale_ptr + g.to(gl.int64) * N + cols, row_mask, cols < N,
                               LHS_BLOCKS, RHS_BLOCKS)
      acc = gl.where(gl.expand_dims(row_mask, 1), acc, 0.0)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, col0, half_store, N, BLOCK, OUT_LAYOUT)
      if WIDE and N > BLOCK:  # (Where N <= 128 no tile has a right half: Triton 3.6 crashes lowering a load in a
        if right:             # branch it has proven dead, so none is emitted.)
          cols = cols + BLOCK
          acc_right = row_channel_scales(acc_right, sa_ptrs, rhs_scale_ptr + g.to(gl.int64) * N + cols,
                                         row_mask, cols < N, LHS_BLOCKS, RHS_BLOCKS)
          acc_right = gl.where(gl.expand_dims(row_mask, 1), acc_right, 0.0)
          store_half(out_ptr, out_desc, c_bufs.index(H), acc_right, row, col0 + BLOCK, half_store, N, BLOCK,
                     OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_kernel(lhs_desc, rhs_desc, sa_desc, schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr,
                      K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                      LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr,
                      HALVES: gl.constexpr, MASKED_M: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, 128); rhs_desc over rhs viewed (G * N, K), box (BLOCK_N, 128); sa_desc over
  the tile-major lhs block scales (R_MAX * KB, W), box (1, W), W the tile's 64 HALVES rows rounded up to a power of
  2, in ROW_SCALE_LAYOUT (read with LHS_BLOCKS only); lhs_scale_ptr: the row scales (read without LHS_BLOCKS only);
  schedule_ptr: the schedule, or masked_m (G,) where MASKED_M (max_m of the masked layout) > 0; out (M, N) through
  out_ptr and descriptors made here (box (64, 128), shared-memory layout OUT_LAYOUT). Tiles of 64 HALVES rows
  (HALVES 2, or 3 with BLOCK_N = 128), launched with MAXNREG[HALVES] registers."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT, HALVES)
  s_bufs = gl.allocate_shared_memory(gl.float32, [S, SCALES], SCALE_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S] + sa_desc.block_type.shape, ROW_SCALE_LAYOUT)
  if HALVES == 2:  # (Gluon's partition lists take no tuple built from constexpr layouts: written out twice.)
    gl.warp_specialize([
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0, HALVES, MASKED_M)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1, HALVES, MASKED_M)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
                   empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, HALVES, MASKED_M)),
    ], [4, 1], [240, 24])
  else:
    gl.warp_specialize([
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0, HALVES, MASKED_M)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1, HALVES, MASKED_M)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 2, HALVES, MASKED_M)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
                   empty, K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, HALVES, MASKED_M)),
    ], [4, 4, 1], [160, 160, 24])
