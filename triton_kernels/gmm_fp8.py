"""FP8 kernels with fine-grained scales: gmm (contiguous groups), masked gmm and tgmm (jgmm.fp8 documents the math).

Operands are FP8 (float8e4nv on NVIDIA: tl.dot lowers to Hopper's FP8 wgmma) or, under Triton's interpreter, float32
arrays holding the same values: the kernels never look at the element type, so a float32 run checks all the
indexing and scaling. Accumulation is float32.

Scales, float32, row-major:
  lhs: LHS_BLOCKS: (rows, KB) per 1x128 block, else (rows,) per row (rows: M, or G * MAX_M for the masked layout);
  rhs: RHS_BLOCKS: (G, NB, KB) per 128x128 block, else (G, N) per channel;
  with KB = cdiv(K, 128), NB = cdiv(N, 128). Block scales multiply each BLOCK_K step's product before it joins the
  accumulator (acc += dot(a, b) * sa[:, None] * sb[None, :]; BLOCK_K <= 128 keeps a step inside one block), row
  and channel scales multiply the accumulator once in the epilogue.
tgmm's scales run along M, per 128 rows on the global grid of M: lhs (MB, K) and rhs (MB, N) whatever the operands'
layouts (a step's scales are then one contiguous row of each), MB = cdiv(M, 128); its steps of BLOCK_K rows are
aligned to that grid (a step's first row is a multiple of BLOCK_K), so each step lies in one scale block.
Hopper's FP8 wgmma reads both operands K-major (here: M contiguous), so tgmm is fast with lhs (K, M) and rhs (N, M)
only: any other layout is transposed through registers on every step, with no asynchronous copies (4x slower on
an H100 at M = 32768, K = 7168, N = 4096).

Precision: Hopper's FP8 wgmma accumulates with reduced precision (~14 bits: a K = 7168 product accumulated
in one tl.dot measured 1.9e-3 relative error on an H100). As DeepGEMM does, each BLOCK_K (<= 128) step's product
starts from zero and is added to the float32 accumulator (promotion), also without block scales: ~2.5e-4.

Loads: USE_TMA, operand tiles come through host-side tensor descriptors (Hopper TMA): lhs_desc over lhs viewed as
(rows, K), rhs_desc over rhs (G, N, K) or (G, K, N) (zero padding past each group's K and N); a tile's rows past its
group read other rows, which only feed output rows that are zeroed or not stored. Otherwise masked pointer loads, and
lhs_desc / rhs_desc are unused. Offsets are int64 wherever a product can pass 2^31 (a 64-bit base per tile, int32
offsets within it where they fit).
"""
import triton
import triton.language as tl

from jgmm.triton_kernels.common import store_tile, tgmm_lhs_offsets, tile_coords
from jgmm.triton_kernels.gmm import _zero_tile, group_table, group_tile, zero_tile_rows

SCALE_BLOCK = tl.constexpr(128)  # Elements per scale block along K (and along M for tgmm).


@triton.jit
def scale_pointers(lhs_scale_ptr, rhs_scale_ptr, row0, rows, n0, cols, KB, OFFSET: tl.constexpr,
                   LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr):
  """Pointers to the scales of a tile's rows row0 + rows (lhs_scale_ptr over (rows, KB) if LHS_BLOCKS, else
  (rows,)) and columns n0 + cols (rhs_scale_ptr over one group's (NB, KB) if RHS_BLOCKS, else (N,))."""
  if LHS_BLOCKS:
    sa_ptr = lhs_scale_ptr + row0 * KB + rows.to(OFFSET) * KB
  else:
    sa_ptr = lhs_scale_ptr + row0 + rows
  if RHS_BLOCKS:
    sb_ptr = rhs_scale_ptr + ((n0 + cols) // SCALE_BLOCK) * KB
  else:
    sb_ptr = rhs_scale_ptr + n0 + cols
  return sa_ptr, sb_ptr


@triton.jit
def scaled_step(acc, a, b, sa_ptr, sb_ptr, k0, row_mask, col_mask, LHS_BLOCKS: tl.constexpr,
                RHS_BLOCKS: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """acc plus the K step at k0's product a @ b, times its scale block's scales where the recipe has blocks (a step
  of BLOCK_K <= 128 lies in one block). The product starts from zero either way: it is promoted to the float32
  accumulator every step (module docstring)."""
  if LHS_BLOCKS or RHS_BLOCKS:
    kb = k0 // SCALE_BLOCK
    if LHS_BLOCKS and RHS_BLOCKS:
      scale = (tl.load(sa_ptr + kb, mask=row_mask, other=0.0)[:, None] *
               tl.load(sb_ptr + kb, mask=col_mask, other=0.0)[None, :])
    elif LHS_BLOCKS:
      scale = tl.load(sa_ptr + kb, mask=row_mask, other=0.0)[:, None]
    else:
      scale = tl.load(sb_ptr + kb, mask=col_mask, other=0.0)[None, :]
    acc += tl.dot(a, b, input_precision=DOT_PRECISION) * scale  # One FMA per element (FP fusion).
  else:
    acc += tl.dot(a, b, input_precision=DOT_PRECISION)
  return acc


@triton.jit
def scale_epilogue(acc, sa_ptr, sb_ptr, row_mask, col_mask, LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr):
  """acc times the per-row (not LHS_BLOCKS) and per-channel (not RHS_BLOCKS) scales, once after the K loop."""
  if not LHS_BLOCKS:
    acc *= tl.load(sa_ptr, mask=row_mask, other=0.0)[:, None]
  if not RHS_BLOCKS:
    acc *= tl.load(sb_ptr, mask=col_mask, other=0.0)[None, :]
  return acc


@triton.jit
def _fp8_tile(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, lhs_scale_ptr, rhs_scale_ptr, out_ptr, g, tile_row0, m_valid,
              store_rows, n0, K: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, RHS_NK: tl.constexpr, LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr,
              USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """out[tile_row0 + i, n0 + j] = sum_k lhs[.., k] rhs[g][k, ..] scaled, for rows i < m_valid; rows in
  [m_valid, store_rows) get zeros, rows past store_rows are not written. tile_row0 int64; rhs (G, N, K) if
  RHS_NK else (G, K, N)."""
  KB: tl.constexpr = (K + SCALE_BLOCK - 1) // SCALE_BLOCK
  NB: tl.constexpr = (N + SCALE_BLOCK - 1) // SCALE_BLOCK
  OFFSET: tl.constexpr = tl.int64 if max(BLOCK_M, BLOCK_N) * max(K, N) >= 2**31 else tl.int32
  tl.static_assert(BLOCK_K <= SCALE_BLOCK, "a K step must lie inside one 128-wide scale block")
  rows = tl.arange(0, BLOCK_M)
  row_mask = rows < m_valid
  cols = tl.arange(0, BLOCK_N)
  col_mask = n0 + cols < N
  ks = tl.arange(0, BLOCK_K)
  g64 = tl.cast(g, tl.int64)
  a_ptr = lhs_ptr + tile_row0 * K
  a_offsets = rows.to(OFFSET)[:, None] * K + ks[None, :]
  if RHS_NK:  # rhs[g] (N, K): element [k, n] at n * K + k
    b_ptr = rhs_ptr + g64 * (K * N) + n0 * K
    b_offsets = cols.to(OFFSET)[None, :] * K + ks[:, None]
    b_step: tl.constexpr = BLOCK_K
  else:  # rhs[g] (K, N): element [k, n] at k * N + n
    b_ptr = rhs_ptr + g64 * (K * N) + n0
    b_offsets = ks.to(OFFSET)[:, None] * N + cols[None, :]
    b_step: tl.constexpr = BLOCK_K * N
  group_scales = rhs_scale_ptr + g64 * (NB * KB if RHS_BLOCKS else N)
  sa_ptr, sb_ptr = scale_pointers(lhs_scale_ptr, group_scales, tile_row0, rows, n0, cols, KB, OFFSET, LHS_BLOCKS,
                                  RHS_BLOCKS)

  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k0 in range(0, K, BLOCK_K):
    if USE_TMA:
      a = lhs_desc.load([tile_row0.to(tl.int32), k0])
      if RHS_NK:
        b = rhs_desc.load([g, n0, k0]).reshape(BLOCK_N, BLOCK_K).T
      else:
        b = rhs_desc.load([g, k0, n0]).reshape(BLOCK_K, BLOCK_N)
    else:
      k_mask = ks < K - k0
      a = tl.load(a_ptr + a_offsets, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
      b = tl.load(b_ptr + b_offsets, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
    acc = scaled_step(acc, a, b, sa_ptr, sb_ptr, k0, row_mask, col_mask, LHS_BLOCKS, RHS_BLOCKS, DOT_PRECISION)
    a_ptr += BLOCK_K
    b_ptr += b_step
  acc = scale_epilogue(acc, sa_ptr, sb_ptr, row_mask, col_mask, LHS_BLOCKS, RHS_BLOCKS)
  acc = tl.where(row_mask[:, None], acc, 0.0)
  store_tile(out_ptr + tile_row0 * N + n0, rows, rows < store_rows, cols, col_mask, N, acc, OFFSET)


@triton.jit
def gmm_fp8_kernel(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, bounds_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr,
                   K: tl.constexpr, N: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   RHS_NK: tl.constexpr, LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr, USE_TMA: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
  """out (M, N): rows of group g (bounds (G + 1,) int32: [bounds[g], bounds[g + 1])) = lhs rows @ rhs[g], scaled;
  rows outside every group are zeros.

  Persistent: program p takes tiles p, p + P, ...: the group tiles (group by group, row tiles x column tiles,
  found from the group table of G_POW2 >= G entries held in registers), then the zero tiles of rows [0, bounds[0])
  and [bounds[G], M).
  """
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  group_tiles, tiles_end, num_tiles = group_table(bounds_ptr, G, G_POW2, BLOCK_M, N_TILES)
  first_row = tl.load(bounds_ptr)
  last_row = tl.load(bounds_ptr + G)
  zero_tiles = (tl.cdiv(first_row, BLOCK_M) + tl.cdiv(M - last_row, BLOCK_M)) * N_TILES

  num_programs = tl.num_programs(0)
  for tile in range(tl.program_id(0), num_tiles + zero_tiles, num_programs):
    if tile < num_tiles:
      g, row_start, m_g, mi, ni = group_tile(tile, bounds_ptr, group_tiles, tiles_end, BLOCK_M, N_TILES, GROUP_M)
      m_left = m_g - mi * BLOCK_M
      _fp8_tile(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, lhs_scale_ptr, rhs_scale_ptr, out_ptr, g,
                row_start.to(tl.int64) + mi * BLOCK_M, m_left, m_left, ni * BLOCK_N, K, N, BLOCK_M, BLOCK_N, BLOCK_K,
                RHS_NK, LHS_BLOCKS, RHS_BLOCKS, USE_TMA, DOT_PRECISION)
    else:
      row0, row_end, n0 = zero_tile_rows(tile - num_tiles, first_row, last_row, M, BLOCK_M, BLOCK_N, N_TILES)
      _zero_tile(out_ptr, row0, row_end, n0, N, 0, BLOCK_M, BLOCK_N, N)


@triton.jit
def masked_gmm_fp8_kernel(x_ptr, w_ptr, x_desc, w_desc, masked_m_ptr, x_scale_ptr, w_scale_ptr, MAX_M, out_ptr,
                          K: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, X_BLOCKS: tl.constexpr, W_BLOCKS: tl.constexpr,
                          USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """out[g] (MAX_M, N) = x[g] (MAX_M, K) @ w[g].T (w (G, N, K)), scaled, on rows < masked_m[g] (clipped to
  [0, MAX_M] by the caller); zeros below. Persistent over G x row tiles x column tiles, group by group; tiles
  wholly past masked_m[g] load nothing and only write zeros. x and its scales are read as (G * MAX_M, ...)."""
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  m_tiles = tl.cdiv(MAX_M, BLOCK_M)
  group_tiles = m_tiles * N_TILES
  num_programs = tl.num_programs(0)
  for tile in range(tl.program_id(0), G * group_tiles, num_programs):
    g = tile // group_tiles
    mi, ni = tile_coords(tile - g * group_tiles, m_tiles, N_TILES, GROUP_M)
    m_g = tl.load(masked_m_ptr + g)
    row0 = tl.cast(g, tl.int64) * MAX_M + mi * BLOCK_M
    if mi * BLOCK_M >= m_g:
      _zero_tile(out_ptr, row0, row0 + MAX_M - mi * BLOCK_M, ni * BLOCK_N, N, 0, BLOCK_M, BLOCK_N, N)
    else:
      _fp8_tile(x_ptr, w_ptr, x_desc, w_desc, x_scale_ptr, w_scale_ptr, out_ptr, g, row0, m_g - mi * BLOCK_M,
                MAX_M - mi * BLOCK_M, ni * BLOCK_N, K, N, BLOCK_M, BLOCK_N, BLOCK_K, True, X_BLOCKS, W_BLOCKS,
                USE_TMA, DOT_PRECISION)


@triton.jit
def _tgmm_fp8_step(acc, lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, a_offsets, b_offsets, r0, start, end, M, ki,
                   ni, k_rows, k_mask, cols, n_mask, K: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TRANSPOSE_LHS: tl.constexpr,
                   TRANSPOSE_RHS: tl.constexpr, EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   RHS_GROUPS: tl.constexpr):
  """acc plus the scaled product of rows [r0, r0 + BLOCK_K) (r0 a multiple of BLOCK_K; RHS_GROUPS: by the row scales
  alone, the kernel's epilogue applies the group's column scales). EDGE: the step holds rows
  outside [start, end), masked one by one; otherwise every row is the group's and the loads are masked along K and N
  only, so that they stay vectorised along the rows (a per-row mask would cut them to single elements, and
  asynchronous copies, which the software pipeline needs, to nothing)."""
  local = tl.arange(0, BLOCK_K)
  r064 = tl.cast(r0, tl.int64)
  scale_row = r064 // SCALE_BLOCK
  if TRANSPOSE_LHS:
    a_ptr = lhs_ptr + r064 * K + ki * BLOCK_M
  else:
    a_ptr = lhs_ptr + tl.cast(ki * BLOCK_M, tl.int64) * M + r064
  if TRANSPOSE_RHS:
    b_ptr = rhs_ptr + tl.cast(ni * BLOCK_N, tl.int64) * M + r064
  else:
    b_ptr = rhs_ptr + r064 * N + ni * BLOCK_N
  sa = tl.load(lhs_scale_ptr + scale_row * K + k_rows, mask=k_mask, other=0.0)
  if EDGE:
    r_mask = (r0 + local >= start) & (r0 + local < end)
    a = tl.load(a_ptr + a_offsets, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
    b = tl.load(b_ptr + b_offsets, mask=r_mask[:, None] & n_mask[None, :], other=0.0)
  else:
    a = tl.load(a_ptr + a_offsets, mask=k_mask[:, None], other=0.0)
    b = tl.load(b_ptr + b_offsets, mask=n_mask[None, :], other=0.0)
  if RHS_GROUPS:
    return acc + tl.dot(a, b, input_precision=DOT_PRECISION) * sa[:, None]
  sb = tl.load(rhs_scale_ptr + scale_row * N + cols, mask=n_mask, other=0.0)
  return acc + tl.dot(a, b, input_precision=DOT_PRECISION) * sa[:, None] * sb[None, :]


@triton.jit
def tgmm_fp8_kernel(lhs_ptr, rhs_ptr, bounds_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr,
                    K: tl.constexpr, N: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    TRANSPOSE_LHS: tl.constexpr, TRANSPOSE_RHS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    RHS_GROUPS: tl.constexpr = False, TRANSPOSE_OUT: tl.constexpr = False):
  """out[g] (K, N) = lhs_KM[:, rows of g] @ rhs_MN[rows of g], scaled per 128 rows (module docstring); RHS_GROUPS:
  rhs_scale (G, N), one per group and column, applied once to a tile with rows (fp8_gmm's wgrad_scale="group");
  TRANSPOSE_OUT: out (G, N, K), out[g] transposed.

  lhs (K, M), or (M, K) if TRANSPOSE_LHS; rhs (M, N), or (N, M) if TRANSPOSE_RHS; bounds (G + 1,) int32. Output
  tiles BLOCK_M (along K) x BLOCK_N, G * cdiv(K, BLOCK_M) * cdiv(N, BLOCK_N) of them, persistent over the grid; each
  reduces its group's rows in steps of BLOCK_K rows aligned to multiples of BLOCK_K: the steps wholly inside the
  group in one pipelined loop, the first and last, partly outside it, with rows masked (_tgmm_fp8_step). Empty
  groups store exact zeros.
  """
  K_TILES: tl.constexpr = (K + BLOCK_M - 1) // BLOCK_M
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  OFFSET: tl.constexpr = tl.int64 if max(BLOCK_M, BLOCK_N, BLOCK_K) * max(K, N) >= 2**31 else tl.int32
  tl.static_assert(BLOCK_K <= SCALE_BLOCK, "a step of rows must lie inside one 128-row scale block")
  group = tl.arange(0, G_POW2)
  in_table = group < G
  starts = tl.load(bounds_ptr + group, mask=in_table, other=0)
  ends = tl.load(bounds_ptr + group + 1, mask=in_table, other=0)
  local = tl.arange(0, BLOCK_K)
  k_local = tl.arange(0, BLOCK_M)
  n_local = tl.arange(0, BLOCK_N)
  a_offsets = tgmm_lhs_offsets(M, K, BLOCK_M, BLOCK_K, TRANSPOSE_LHS, OFFSET)
  if TRANSPOSE_RHS:  # rhs (N, M): element [r, n] at n * M + r
    b_offsets = local[:, None] + n_local.to(tl.int64)[None, :] * M
  else:  # rhs (M, N): element [r, n] at r * N + n
    b_offsets = local.to(OFFSET)[:, None] * N + n_local[None, :]

  num_programs = tl.num_programs(0)
  for tile in range(tl.program_id(0), G * K_TILES * N_TILES, num_programs):
    g = tile // (K_TILES * N_TILES)
    ki, ni = tile_coords(tile - g * (K_TILES * N_TILES), K_TILES, N_TILES, GROUP_M)
    this_group = group == g
    start = tl.sum(tl.where(this_group, starts, 0), axis=0)
    end = tl.sum(tl.where(this_group, ends, 0), axis=0)
    k_rows = ki * BLOCK_M + k_local
    k_mask = k_rows < K
    cols = ni * BLOCK_N + n_local
    n_mask = cols < N
    body_start = tl.cdiv(start, BLOCK_K) * BLOCK_K  # The steps wholly inside [start, end): [body_start, body_end).
    body_end = (end // BLOCK_K) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if start < body_start:  # The step holding start (and end too, where the group lies inside one step).
      acc = _tgmm_fp8_step(acc, lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, a_offsets, b_offsets,
                           body_start - BLOCK_K, start, end, M, ki, ni, k_rows, k_mask, cols, n_mask, K, N,
                           BLOCK_M, BLOCK_N, BLOCK_K, TRANSPOSE_LHS, TRANSPOSE_RHS, True, DOT_PRECISION, RHS_GROUPS)
    for r0 in range(body_start, body_end, BLOCK_K):
      acc = _tgmm_fp8_step(acc, lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, a_offsets, b_offsets, r0, start,
                           end, M, ki, ni, k_rows, k_mask, cols, n_mask, K, N, BLOCK_M, BLOCK_N, BLOCK_K,
                           TRANSPOSE_LHS, TRANSPOSE_RHS, False, DOT_PRECISION, RHS_GROUPS)
    if (body_start <= body_end) & (body_end < end):  # The step holding end, after the body.
      acc = _tgmm_fp8_step(acc, lhs_ptr, rhs_ptr, lhs_scale_ptr, rhs_scale_ptr, a_offsets, b_offsets, body_end,
                           start, end, M, ki, ni, k_rows, k_mask, cols, n_mask, K, N, BLOCK_M, BLOCK_N, BLOCK_K,
                           TRANSPOSE_LHS, TRANSPOSE_RHS, True, DOT_PRECISION, RHS_GROUPS)
    if RHS_GROUPS:  # The group's channel scales (empty groups keep their exact zeros whatever their scales).
      if start < end:
        acc = scale_epilogue(acc, None, rhs_scale_ptr + tl.cast(g, tl.int64) * N + cols, None, n_mask, True, False)
    if TRANSPOSE_OUT:
      out_tile = out_ptr + (tl.cast(g, tl.int64) * N + ni * BLOCK_N) * K + ki * BLOCK_M
      store_tile(out_tile, n_local, n_mask, k_local, k_mask, K, tl.trans(acc), OFFSET)
    else:
      out_tile = out_ptr + (tl.cast(g, tl.int64) * K + ki * BLOCK_M) * N + ni * BLOCK_N
      store_tile(out_tile, k_local, k_mask, n_local, n_mask, N, acc, OFFSET)
