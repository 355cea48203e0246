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
# A step's scale row (1 x 128 float32, by TMA) in unswizzled shared memory.
SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def _add_product(acc, a, b, after, scale, sa_buf, sb_ptr, kb, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  """acc + a @ b, the wgmmas from zero (promotion), scaled per row by scale (the lhs block scales) and by the rhs
  block scale at sb_ptr + kb (loaded while the wgmmas run) where the recipe has them. The wgmma nominally reads
  `after` (use_acc=False ignores its value): pass the accumulator updated last, so that LLVM keeps its update
  before these wgmmas instead of sinking it past them (two products live at once: spills)."""
  product = warpgroup_mma(a, b, after, use_acc=False, is_async=True)
  if RHS_BLOCKS:
    sb = gl.load(sb_ptr + kb)
  product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
  if sa_buf is not None:
    scale = sa_buf.load(gl.SliceLayout(1, acc.type.layout))
  if RHS_BLOCKS:
    scale = scale * sb
  if LHS_BLOCKS or RHS_BLOCKS:
    return acc + product * gl.expand_dims(scale, 1)
  return acc + product


@gluon.jit
def scaled_steps(acc, acc_right, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_bufs, sb_ptr, row_mask, right,
                 S: gl.constexpr, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, H: gl.constexpr,
                 WIDE: gl.constexpr):
  """(acc, acc_right) + consumer H's products over k_steps K blocks from stage `step` on, every stage released:
  with a 128-wide rhs tile into acc, or (WIDE) with the two 128-column halves of a 256-wide one into acc and (if
  right) acc_right, one after the other. The lhs block scales (LHS_BLOCKS): from sa_bufs, the shared-memory buffers
  of a stage's 128 row scales that the loader fills (read once the stage is ready: no pointers held in registers),
  or without them from sa_ptr, a (64,) pointer tensor to each row's (KB,) scales. sb_ptr: the left half's rhs block
  scales."""
  ROWS: gl.constexpr = row_mask.type.layout
  for kk in range(k_steps):
    slot = (step + kk) % S
    scale = gl.full([HALF], 1.0, gl.float32, ROWS)
    if LHS_BLOCKS and sa_bufs is None:
      scale = gl.load(sa_ptr + kk, mask=row_mask, other=0.0)
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    sa_buf = None
    if LHS_BLOCKS and sa_bufs is not None:
      sa_buf = sa_bufs.index(slot).reshape([BLOCK]).slice(H * HALF, HALF)
    a = a_bufs.index(2 * slot + H)
    b = b_bufs.index(slot)
    if WIDE:
      acc = _add_product(acc, a, b.slice(0, BLOCK).permute((1, 0)), acc_right, scale, sa_buf, sb_ptr, kk, LHS_BLOCKS,
                         RHS_BLOCKS)
      if right:
        acc_right = _add_product(acc_right, a, b.slice(BLOCK, BLOCK).permute((1, 0)), acc, scale, sa_buf, sb_ptr,
                                 kk + k_steps, LHS_BLOCKS, RHS_BLOCKS)
    else:
      acc = _add_product(acc, a, b.permute((1, 0)), acc, scale, sa_buf, sb_ptr, kk, LHS_BLOCKS, RHS_BLOCKS)
    mbarrier.arrive(empty.index(slot))
  return acc, acc_right


@gluon.jit
def row_channel_scales(acc, sa_ptr, sb_ptr, row_mask, col_mask, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  """acc times its row scales (sa_ptr, unless LHS_BLOCKS) and channel scales (sb_ptr, unless RHS_BLOCKS)."""
  if not LHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sa_ptr, mask=row_mask, other=0.0), 1)
  if not RHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sb_ptr, mask=col_mask, other=0.0), 0)
  return acc


@gluon.jit
def _consumer(schedule_ptr, lhs_scale, sa_bufs, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty,
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
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H)
    row_mask = gl.arange(0, HALF, layout=ROWS) < half_rows
    sa_ptr = None
    if not LHS_BLOCKS:  # Row scales, for the epilogue (block scales come through sa_bufs).
      sa_ptr = lhs_scale + row.to(gl.int64) + gl.arange(0, HALF, layout=ROWS)
    col0 = ni * BLOCK_N
    right = col0 + BLOCK < N  # A wide tile's right half holds columns of out.
    sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_nb + col0 // BLOCK) * k_steps  # The left half's blocks.
    acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    acc_right = acc
    if half_rows > 0:
      acc, acc_right = scaled_steps(acc, acc_right, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sa_bufs,
                                    sb_ptr, row_mask, right, S, LHS_BLOCKS, RHS_BLOCKS, H, WIDE)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      for i in gl.static_range(2 if WIDE else 1):  # The tile's 128-column halves.
        if i == 0 or right:
          cols = col0 + i * BLOCK + gl.arange(0, BLOCK, layout=COLS)
          out = row_channel_scales(acc_right if i else acc, sa_ptr, rhs_scale_ptr + g.to(gl.int64) * N + cols,
                                   row_mask, cols < N, LHS_BLOCKS, RHS_BLOCKS)
          out = gl.where(gl.expand_dims(row_mask, 1), out, 0.0)
          store_half(out_ptr, out_desc, c_bufs.index(H), out, row, col0 + i * BLOCK, half_store, N, BLOCK,
                     OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_kernel(lhs_desc, rhs_desc, schedule_ptr, lhs_scale, rhs_scale_ptr, M, out_ptr, K: gl.constexpr,
                      N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, S: gl.constexpr,
                      LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, 128); rhs_desc over rhs viewed (G * N, K), box (BLOCK_N, 128); lhs_scale:
  with LHS_BLOCKS a descriptor over the block scales stored transposed, (KB, M') with M' >= M (the rows' scales of a
  K block in one row), box (1, 128) in SCALE_LAYOUT, else a pointer to the (M,) row scales; out (M, N) through
  out_ptr and descriptors made here (box (64, 128), shared-memory layout OUT_LAYOUT)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], SCALE_LAYOUT)  # Used with LHS_BLOCKS.
  gl.warp_specialize([
      (_consumer, (schedule_ptr, lhs_scale, sa_bufs, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty,
                   K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0)),
      (_consumer, (schedule_ptr, lhs_scale, sa_bufs, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty,
                   K, N, R_MAX, BLOCK_N, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1)),
      (loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX, BLOCK_N, BLOCK, S,
                 True, LHS_BLOCKS, lhs_scale, sa_bufs)),
  ], [4, 1], [240, 24])
