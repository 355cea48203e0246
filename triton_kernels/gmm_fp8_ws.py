"""gmm_fp8_ws_kernel: the Hopper (sm_90) FP8 gmm with fine-grained scales, warp-specialised in Gluon.

Rows of a tile's group g: out = (lhs * lhs_scale) @ (rhs[g] * rhs_scale[g]).T; lhs (rows, K) FP8, rhs (G, N, K) FP8
viewed as (G * N, K) (K-major: Hopper's FP8 wgmma reads B only K-major), out (rows, N). Scales as gmm_fp8.py's
(LHS_BLOCKS: lhs (rows, KB) per 1x128 block, else (rows,); RHS_BLOCKS: rhs (G, NB, KB) per 128x128 block, else
(G, N)). Used for the contiguous gmm with K-major rhs and the masked layout (lhs (G * max_m, K)).

gmm_ws.py's structure and code: one program per SM, its TMA loader warp, schedule and epilogue (TMA stores clipped
to a tile's rows), two consumer warpgroups of 64 rows each; here BLOCK_K = 128 (a step is one K scale block, the
last one partial: TMA reads zeros past K) and BLOCK_N = 128 (a column tile is one rhs scale block).

A consumer's main loop: each step's wgmma starts from zero in a fresh register accumulator (promotion: Hopper's FP8
wgmma accumulates with ~14 bits, gmm_fp8.py), and the float32 accumulator takes that product one step late,
scaled by its block scales (one FMA per element): step k's product is added while step k + 1's wgmma runs, so the
scaling stays off the tensor cores' critical path. Row and channel scales multiply the accumulator once, in the
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
MAXNREG = 168  # Registers per thread at launch; the consumers then take 232 (three 64 x 128 fp32 accumulators).


@gluon.jit
def _step_scale(sa_ptr, sb_ptr, kb, row_mask, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr,
                ROWS: gl.constexpr):
  """The (64,) scale of K block kb's product for the consumer's rows (1 where neither operand has block scales)."""
  scale = gl.full([HALF], 1.0, gl.float32, ROWS)
  if LHS_BLOCKS:
    scale = gl.load(sa_ptr + kb, mask=row_mask, other=0.0)
  if RHS_BLOCKS:
    scale = scale * gl.load(sb_ptr + kb)
  return scale


@gluon.jit
def _promote(acc, product, scale, BLOCKS: gl.constexpr):
  """acc + product, scaled per row by scale where an operand has block scales."""
  if BLOCKS:
    return acc + product * gl.expand_dims(scale, 1)
  else:
    return acc + product


@gluon.jit
def scaled_steps(acc, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sb_ptr, row_mask, S: gl.constexpr,
                 LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, H: gl.constexpr):
  """acc + consumer H's product over k_steps K blocks, from stage `step` on: each block's wgmmas from zero, then
  added with its block scales (sa_ptr, sb_ptr: _step_scale's) after the wait; every stage released."""
  ROWS: gl.constexpr = row_mask.type.layout
  for kk in range(k_steps):
    slot = (step + kk) % S
    scale = _step_scale(sa_ptr, sb_ptr, kk, row_mask, LHS_BLOCKS, RHS_BLOCKS, ROWS)
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    product = warpgroup_mma(a_bufs.index(2 * slot + H), b_bufs.index(slot).permute((1, 0)), acc, use_acc=False,
                            is_async=True)
    product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
    mbarrier.arrive(empty.index(slot))
    acc = _promote(acc, product, scale, LHS_BLOCKS or RHS_BLOCKS)
  return acc


@gluon.jit
def row_channel_scales(acc, sa_ptr, sb_ptr, row_mask, col_mask, LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr):
  """acc times its row scales (sa_ptr, unless LHS_BLOCKS) and channel scales (sb_ptr, unless RHS_BLOCKS)."""
  if not LHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sa_ptr, mask=row_mask, other=0.0), 1)
  if not RHS_BLOCKS:
    acc = acc * gl.expand_dims(gl.load(sb_ptr, mask=col_mask, other=0.0), 0)
  return acc


@gluon.jit
def _consumer(schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty,
              K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr, LHS_BLOCKS: gl.constexpr,
              RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32])
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  COLS: gl.constexpr = gl.SliceLayout(0, acc_layout)
  num_n: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H)
    row_mask = gl.arange(0, HALF, layout=ROWS) < half_rows
    cols = ni * BLOCK + gl.arange(0, BLOCK, layout=COLS)
    row64 = row.to(gl.int64) + gl.arange(0, HALF, layout=ROWS)
    if LHS_BLOCKS:
      sa_ptr = lhs_scale_ptr + row64 * k_steps
    else:
      sa_ptr = lhs_scale_ptr + row64
    if RHS_BLOCKS:
      sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_n + ni) * k_steps
    else:
      sb_ptr = rhs_scale_ptr + g.to(gl.int64) * N + cols
    acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      acc = scaled_steps(acc, a_bufs, b_bufs, ready, empty, step, k_steps, sa_ptr, sb_ptr, row_mask, S, LHS_BLOCKS,
                         RHS_BLOCKS, H)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      acc = row_channel_scales(acc, sa_ptr, sb_ptr, row_mask, cols < N, LHS_BLOCKS, RHS_BLOCKS)
      acc = gl.where(gl.expand_dims(row_mask, 1), acc, 0.0)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK, half_store, N, BLOCK, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_kernel(lhs_desc, rhs_desc, schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, K: gl.constexpr,
                      N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr, LHS_BLOCKS: gl.constexpr,
                      RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, 128); rhs_desc over rhs viewed (G * N, K), box (128, 128); out (M, N)
  through out_ptr and descriptors made here (box (64, 128), shared-memory layout OUT_LAYOUT)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK, S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K,
                   N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0)),
      (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K,
                   N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1)),
      (loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX, BLOCK, BLOCK, S, True)),
  ], [4, 1], [232, 40])
