"""gmm_fp8_ws_kernel: the Hopper (sm_90) FP8 gmm with fine-grained scales, warp-specialised in Gluon.

Rows of a tile's group g: out = (lhs * lhs_scale) @ (rhs[g] * rhs_scale[g]).T; lhs (rows, K) FP8, rhs (G, N, K) FP8
viewed as (G * N, K) (K-major: Hopper's FP8 wgmma reads B only K-major), out (rows, N). Scales as gmm_fp8.py's
(LHS_BLOCKS: lhs (rows, KB) per 1x128 block, else (rows,); RHS_BLOCKS: rhs (G, NB, KB) per 128x128 block, else
(G, N)). Used for the contiguous gmm with K-major rhs and the masked layout (lhs (G * max_m, K)).

gmm_ws.py's structure and code: one program per SM, its TMA loader warp, schedule and epilogue (TMA stores clipped
to a tile's rows), two consumer warpgroups of 64 rows each; here BLOCK_K = 128 (a step is one K scale block, the
last one partial: TMA reads zeros past K) and BLOCK_N = 128 or 256 (one or two rhs scale blocks).

A consumer's main loop: each step's wgmmas start from zero in a fresh register accumulator (promotion: Hopper's FP8
wgmma accumulates with ~14 bits, gmm_fp8.py); after the wait, the float32 accumulator takes that product scaled by
its block scales (one FMA per element), while the other consumer's wgmmas keep the tensor cores busy (ptxas
serialises a wgmma whose accumulator registers are read before it completes: docs/perf-notes.md). A 256-wide tile
does its two column halves one after the other (two float32 accumulators and one product fit the registers), so a
step reads the lhs tile once for 256 columns. Row and channel scales multiply the accumulator once, in the
epilogue. A tile's rows past its group's rows (masked: past masked_m[g]) are stored as zeros, whatever their
operands or scales hold.

schedule: gmm_ws's (1 + 4 R_MAX,) int32 (per 128-row tile: group, first row, rows of the group, rows to store);
backend_triton builds one for the masked layout too (a tile per 128 of each group's max_m rows).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_ws import HALF, allocate, consumer_tile, loader, release_stages, store_half

BLOCK = gl.constexpr(128)  # BLOCK_N and BLOCK_K: one 128-wide scale block each.
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch; the consumers then take 240 (three 64 x 128 fp32 accumulators).


@gluon.jit
def _row_scale(sa_ptr, sa_rows, kb, row_mask, LHS_BLOCKS: gl.constexpr, ROWS: gl.constexpr):
  """The (64,) lhs block scales of K block kb for the consumer's rows (sa_ptr + sa_rows + kb: int32 offsets from one
  scalar pointer, as 64-bit pointers per row would hold four registers all along), or 1 without block scales."""
  if LHS_BLOCKS:
    return gl.load(sa_ptr + sa_rows + kb, mask=row_mask, other=0.0)
  return gl.full([HALF], 1.0, gl.float32, ROWS)


@gluon.jit
def _add_product(acc, a, b, after, scale, sb_ptr, kb, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  """acc + a @ b, the wgmmas from zero (promotion), scaled per row by scale (the lhs block scales) and by the rhs
  block scale at sb_ptr + kb, loaded while the wgmmas run (its product with scale waits for it: before the wgmmas,
  that wait would delay them; measured 0.91-0.93x), where the recipe has them. The wgmma nominally reads `after`
  (use_acc=False ignores its value): given the accumulator updated last, LLVM keeps that update before these wgmmas
  instead of sinking it past them (two products live at once: spills)."""
  product = warpgroup_mma(a, b, after, use_acc=False, is_async=True)
  if RHS_BLOCKS:
    scale = scale * gl.load(sb_ptr + kb)
  product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
  if LHS_BLOCKS or RHS_BLOCKS:
    return acc + product * gl.expand_dims(scale, 1)
  return acc + product


@gluon.jit
def scaled_steps(acc, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_rows, sb_ptr, row_mask, S: gl.constexpr,
                 LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, H: gl.constexpr):
  """acc + consumer H's product with a 128-wide rhs tile over k_steps K blocks, from stage `step` on (_add_product
  per block, its lhs scales loaded before the stage's wait); every stage released."""
  ROWS: gl.constexpr = row_mask.type.layout
  for kk in range(k_steps):
    slot = (step + kk) % S
    scale = _row_scale(sa_ptr, sa_rows, kk, row_mask, LHS_BLOCKS, ROWS)
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    acc = _add_product(acc, a_bufs.index(2 * slot + H), b_bufs.index(slot).permute((1, 0)), acc, scale, sb_ptr, kk,
                       LHS_BLOCKS, RHS_BLOCKS)
    mbarrier.arrive(empty.index(slot))
  return acc


@gluon.jit
def _wide_steps(acc, acc_right, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_rows, sb_ptr, row_mask, right,
                S: gl.constexpr, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, H: gl.constexpr):
  """scaled_steps with a 256-wide rhs tile: per K block its two 128-column halves one after the other, into acc and
  (if right) acc_right (two float32 accumulators and one product fit the registers; a step reads the lhs tile once
  for 256 columns). sb_ptr: the left half's rhs block scales (the right half's follow them)."""
  ROWS: gl.constexpr = row_mask.type.layout
  for kk in range(k_steps):
    slot = (step + kk) % S
    scale = _row_scale(sa_ptr, sa_rows, kk, row_mask, LHS_BLOCKS, ROWS)
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    a = a_bufs.index(2 * slot + H)
    b = b_bufs.index(slot)
    acc = _add_product(acc, a, b.slice(0, BLOCK).permute((1, 0)), acc_right, scale, sb_ptr, kk, LHS_BLOCKS,
                       RHS_BLOCKS)
    if right:
      acc_right = _add_product(acc_right, a, b.slice(BLOCK, BLOCK).permute((1, 0)), acc, scale, sb_ptr + k_steps, kk,
                               LHS_BLOCKS, RHS_BLOCKS)
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
def _consumer(schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty,
              K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
              LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32])
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  COLS: gl.constexpr = gl.SliceLayout(0, acc_layout)
  WIDE: gl.constexpr = BLOCK_N == 2 * BLOCK
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  num_nb: gl.constexpr = (N + BLOCK - 1) // BLOCK  # rhs scale blocks along N
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  lhs_scale_row: gl.constexpr = k_steps if LHS_BLOCKS else 1  # Elements per row of lhs_scale.
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK], OUT_LAYOUT)
  # Offsets of the consumer's rows' scales in int32 (a pointer per row would hold 64-bit registers all along).
  sa_rows = gl.arange(0, HALF, layout=ROWS) * lhs_scale_row
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H)
    row_mask = gl.arange(0, HALF, layout=ROWS) < half_rows
    sa_ptr = lhs_scale_ptr + row.to(gl.int64) * lhs_scale_row
    col0 = ni * BLOCK_N
    right = col0 + BLOCK < N  # A wide tile's right half holds columns of out.
    sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_nb + col0 // BLOCK) * k_steps  # The left half's blocks.
    acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if WIDE:
      acc_right = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      if WIDE:
        acc, acc_right = _wide_steps(acc, acc_right, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_rows,
                                     sb_ptr, row_mask, right, S, LHS_BLOCKS, RHS_BLOCKS, H)
      else:
        acc = scaled_steps(acc, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_rows, sb_ptr, row_mask, S,
                           LHS_BLOCKS, RHS_BLOCKS, H)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      cols = col0 + gl.arange(0, BLOCK, layout=COLS)
      acc = row_channel_scales(acc, sa_ptr + sa_rows, rhs_scale_ptr + g.to(gl.int64) * N + cols, row_mask, cols < N,
                               LHS_BLOCKS, RHS_BLOCKS)
      acc = gl.where(gl.expand_dims(row_mask, 1), acc, 0.0)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, col0, half_store, N, BLOCK, OUT_LAYOUT)
      if WIDE:
        if right:
          cols = cols + BLOCK
          acc_right = row_channel_scales(acc_right, sa_ptr + sa_rows, rhs_scale_ptr + g.to(gl.int64) * N + cols,
                                         row_mask, cols < N, LHS_BLOCKS, RHS_BLOCKS)
          acc_right = gl.where(gl.expand_dims(row_mask, 1), acc_right, 0.0)
          store_half(out_ptr, out_desc, c_bufs.index(H), acc_right, row, col0 + BLOCK, half_store, N, BLOCK,
                     OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_kernel(lhs_desc, rhs_desc, schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, K: gl.constexpr,
                      N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                      LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, 128); rhs_desc over rhs viewed (G * N, K), box (BLOCK_N, 128); out (M, N)
  through out_ptr and descriptors made here (box (64, 128), shared-memory layout OUT_LAYOUT)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K,
                   N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0)),
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K,
                   N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1)),
      (loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX, BLOCK_N, BLOCK, S,
                 True)),
  ], [4, 1], [240, 24])
