"""tgmm kernel: out[g] (K, N) = lhs_KM[:, rows of g] @ rhs[rows of g] (+ existing[g]), fp32 accumulation.

Shapes (row-major): lhs (K, M), or (M, K) with TRANSPOSE_LHS (read transposed, never materialised);
rhs (M, N); out and existing (G, K, N); dbias (G, N) float32 column sums of rhs over each group's rows.
The output tile is BLOCK_M (along K) x BLOCK_N; BLOCK_K rows of the group are reduced per step, through
masked pointer loads (64-bit base per step, int32 offsets within it where they cannot pass 2^31).
"""
import triton
import triton.language as tl

from jgmm.triton_kernels.common import store_tile, tgmm_lhs_offsets, tile_coords


@triton.jit
def _tile(tile, group, starts, group_rows, K_TILES: tl.constexpr, N_TILES: tl.constexpr,
          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
  """(g, first row, rows, ki, ni, steps) of output tile `tile`, looked up in the register-resident group
  table (group ids, first rows, row counts); steps = max(cdiv(rows, BLOCK_K), 1): an empty group's tile
  takes one step that loads nothing and stores zeros."""
  g = tile // (K_TILES * N_TILES)
  ki, ni = tile_coords(tile - g * (K_TILES * N_TILES), K_TILES, N_TILES, GROUP_M)
  this_group = group == g
  row_start = tl.sum(tl.where(this_group, starts, 0), axis=0)
  rows = tl.sum(tl.where(this_group, group_rows, 0), axis=0)
  return g, row_start, rows, ki, ni, tl.maximum(tl.cdiv(rows, BLOCK_K), 1)


@triton.jit
def tgmm_kernel(lhs_ptr, rhs_ptr, bounds_ptr, existing_ptr, M, out_ptr, dbias_ptr,
                K: tl.constexpr, N: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                TRANSPOSE_LHS: tl.constexpr, ACCUMULATE: tl.constexpr, BIAS_GRAD: tl.constexpr,
                DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr = False):
  """G * cdiv(K, BLOCK_M) * cdiv(N, BLOCK_N) output tiles, group by group; program p takes tiles p, p + P, ...

  P is one or a few programs per SM (persistent) or the number of tiles (one tile each). bounds (G + 1,)
  int32; G_POW2 >= G entries of the group table live in registers. A tile reduces over its group's rows in
  BLOCK_K-row steps, a count that varies per group, which Triton's loop fusion does not take; so the
  program's tiles and steps are one flat loop written in the fused form by hand: the loop state advances to
  the next tile at the top of an iteration (nothing else there, so the pipeliner runs it, and the loads it
  addresses, iterations ahead) and a tile's epilogue runs at the bottom of its last step. The next tile's
  first loads are thus in flight during this tile's epilogue. Rows outside a group are never read; empty
  groups store exact zeros (or existing). existing_ptr aliases out_ptr when ACCUMULATE; existing_ptr and
  dbias_ptr are placeholders when their flag is off.
  MASKED (the masked layout's weight gradient): M = G * MAX_M rows, group g's are [g * MAX_M, g * MAX_M + m_g),
  and bounds_ptr points at masked_m (G,) instead, clipped to [0, MAX_M] by the caller.
  """
  K_TILES: tl.constexpr = (K + BLOCK_M - 1) // BLOCK_M
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  TILES_PER_GROUP: tl.constexpr = K_TILES * N_TILES
  OFFSET: tl.constexpr = tl.int64 if max(BLOCK_M, BLOCK_K) * max(K, N) >= 2**31 else tl.int32
  pid = tl.program_id(0)
  num_programs = tl.num_programs(0)

  group = tl.arange(0, G_POW2)
  in_table = group < G
  if MASKED:
    starts = group * (M // G)
    group_rows = tl.load(bounds_ptr + group, mask=in_table, other=0)
  else:
    starts = tl.load(bounds_ptr + group, mask=in_table, other=0)
    group_rows = tl.load(bounds_ptr + group + 1, mask=in_table, other=0) - starts
  first = group * TILES_PER_GROUP
  mine = (tl.cdiv(tl.maximum(first + TILES_PER_GROUP - pid, 0), num_programs) -
          tl.cdiv(tl.maximum(first - pid, 0), num_programs))
  # This program's steps: per group, its tiles of the group times the group's steps per tile.
  total_steps = tl.sum(tl.where(in_table, mine * tl.maximum(tl.cdiv(group_rows, BLOCK_K), 1), 0), axis=0)

  local = tl.arange(0, BLOCK_K)
  k_local = tl.arange(0, BLOCK_M)
  n_local = tl.arange(0, BLOCK_N)
  a_offsets = tgmm_lhs_offsets(M, K, BLOCK_M, BLOCK_K, TRANSPOSE_LHS, OFFSET)
  b_offsets = local.to(OFFSET)[:, None] * N + n_local[None, :]
  existing_offsets = k_local.to(OFFSET)[:, None] * N + n_local[None, :]

  tile = pid
  g, row_start, rows, ki, ni, steps = _tile(tile, group, starts, group_rows, K_TILES, N_TILES, BLOCK_K, GROUP_M)
  step = -1
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  col_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
  for _ in range(0, total_steps):
    step += 1
    if step == steps:  # Top: the program's next tile (loop state only).
      tile += num_programs
      g, row_start, rows, ki, ni, steps = _tile(tile, group, starts, group_rows, K_TILES, N_TILES, BLOCK_K, GROUP_M)
      step = 0
    r0 = step * BLOCK_K
    chunk_row0 = row_start.to(tl.int64) + r0
    if TRANSPOSE_LHS:
      a_ptr = lhs_ptr + chunk_row0 * K + ki * BLOCK_M
    else:
      a_ptr = lhs_ptr + tl.cast(ki * BLOCK_M, tl.int64) * M + chunk_row0
    r_mask = local < rows - r0
    k_mask = ki * BLOCK_M + k_local < K
    n_mask = ni * BLOCK_N + n_local < N
    a = tl.load(a_ptr + a_offsets, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
    b = tl.load(rhs_ptr + chunk_row0 * N + ni * BLOCK_N + b_offsets, mask=r_mask[:, None] & n_mask[None, :],
                other=0.0)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if BIAS_GRAD:
      col_sum += tl.sum(b.to(tl.float32), axis=0)
    if step == steps - 1:  # Bottom: the tile's last step: store it.
      tile_start = (tl.cast(g, tl.int64) * K + ki * BLOCK_M) * N + ni * BLOCK_N
      if ACCUMULATE:
        acc += tl.load(existing_ptr + tile_start + existing_offsets, mask=k_mask[:, None] & n_mask[None, :],
                       other=0.0).to(tl.float32)
      store_tile(out_ptr + tile_start, k_local, k_mask, n_local, n_mask, N, acc, OFFSET)
      if BIAS_GRAD:
        if ki == 0:
          tl.store(dbias_ptr + tl.cast(g, tl.int64) * N + ni * BLOCK_N + n_local, col_sum, mask=n_mask)
        col_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
      acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
