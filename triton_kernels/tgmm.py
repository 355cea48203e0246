"""tgmm kernel: out[g] (K, N) = lhs_KM[:, rows of g] @ rhs[rows of g] (+ existing[g]), fp32 accumulation.

Shapes (row-major): lhs (K, M), or (M, K) with TRANSPOSE_LHS (read transposed, never materialised);
rhs (M, N); out and existing (G, K, N); dbias (G, N) float32 column sums of rhs over each group's rows.
The output tile is BLOCK_M (along K) x BLOCK_N; BLOCK_K rows of the group are reduced per step.
"""
import triton
import triton.language as tl

from jgmm.triton_kernels.common import store_tile, tile_coords


@triton.jit
def _tgmm_tile(lhs_ptr, rhs_ptr, existing_ptr, out_ptr, dbias_ptr, lhs_desc, rhs_desc, out_desc,
               M, g, row_start, m_g, ki, ni,
               K: tl.constexpr, N: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               TRANSPOSE_LHS: tl.constexpr, ACCUMULATE: tl.constexpr, BIAS_GRAD: tl.constexpr,
               USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """Output tile (ki, ni) of group g, whose rows are [row_start, row_start + m_g).

  With USE_TMA the whole BLOCK_K-row chunks go through the copy engine and only the last partial chunk
  through masked loads; without, every chunk is a masked load. Rows outside the group are never read.
  """
  k_idx = ki * BLOCK_M + tl.arange(0, BLOCK_M)
  k_mask = k_idx < K
  n_idx = ni * BLOCK_N + tl.arange(0, BLOCK_N)
  n_mask = n_idx < N
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  col_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)

  if USE_TMA:
    full_chunks = m_g // BLOCK_K
    for j in range(full_chunks):
      r = row_start + j * BLOCK_K
      a = lhs_desc.load([r, ki * BLOCK_M]).T
      b = rhs_desc.load([r, ni * BLOCK_N])
      acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
      if BIAS_GRAD:
        col_sum += tl.sum(b.to(tl.float32), axis=0)
    tail_start = full_chunks * BLOCK_K
  else:
    tail_start = 0

  # Masked chunks: 64-bit base pointers per chunk, int32 offsets within it where they cannot pass 2^31.
  OFFSET: tl.constexpr = tl.int64 if max(BLOCK_M, BLOCK_K) * max(K, N) >= 2**31 else tl.int32
  local = tl.arange(0, BLOCK_K)
  k_local = tl.arange(0, BLOCK_M)
  n_local = tl.arange(0, BLOCK_N)
  chunk_row0 = row_start.to(tl.int64) + tail_start
  if TRANSPOSE_LHS:  # lhs (M, K): element [k, r] at r * K + k
    a_ptr = lhs_ptr + chunk_row0 * K + ki * BLOCK_M
    a_offsets = local.to(OFFSET)[None, :] * K + k_local[:, None]
    a_step: tl.constexpr = BLOCK_K * K
  else:  # lhs (K, M): element [k, r] at k * M + r; M is only known at run time: int64 offsets
    a_ptr = lhs_ptr + tl.cast(ki * BLOCK_M, tl.int64) * M + chunk_row0
    a_offsets = k_local.to(tl.int64)[:, None] * M + local[None, :]
    a_step: tl.constexpr = BLOCK_K
  b_ptr = rhs_ptr + chunk_row0 * N + ni * BLOCK_N
  b_offsets = local.to(OFFSET)[:, None] * N + n_local[None, :]
  for r0 in range(tail_start, m_g, BLOCK_K):
    r_mask = local < m_g - r0
    a = tl.load(a_ptr + a_offsets, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
    b = tl.load(b_ptr + b_offsets, mask=r_mask[:, None] & n_mask[None, :], other=0.0)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if BIAS_GRAD:
      col_sum += tl.sum(b.to(tl.float32), axis=0)
    a_ptr += a_step
    b_ptr += BLOCK_K * N

  tile_row0 = tl.cast(g, tl.int64) * K + ki * BLOCK_M  # First row of the tile in out viewed as (G * K, N).
  out_offsets = k_local.to(OFFSET)[:, None] * N + n_local[None, :]
  if ACCUMULATE:
    acc += tl.load(existing_ptr + tile_row0 * N + ni * BLOCK_N + out_offsets,
                   mask=k_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
  if USE_TMA:
    out_desc.store([g, ki * BLOCK_M, ni * BLOCK_N],
                   acc.to(out_ptr.dtype.element_ty).reshape(1, BLOCK_M, BLOCK_N))
  else:
    store_tile(out_ptr + tile_row0 * N + ni * BLOCK_N, k_local, k_mask, n_local, n_mask, N, acc, OFFSET)
  if BIAS_GRAD:
    if ki == 0:
      tl.store(dbias_ptr + tl.cast(g, tl.int64) * N + n_idx, col_sum, mask=n_mask)


@triton.jit
def tgmm_kernel(lhs_ptr, rhs_ptr, bounds_ptr, existing_ptr, M, out_ptr, dbias_ptr,
                K: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                TRANSPOSE_LHS: tl.constexpr, ACCUMULATE: tl.constexpr, BIAS_GRAD: tl.constexpr,
                USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """G * cdiv(K, BLOCK_M) * cdiv(N, BLOCK_N) output tiles, group by group; program p takes tiles p, p + P, ...

  P is one or a few programs per SM (persistent) or the number of tiles (one tile each). bounds (G + 1,) int32.
  Empty groups store exact zeros (or existing). existing_ptr aliases out_ptr when ACCUMULATE; existing_ptr
  and dbias_ptr are placeholders when their flag is off.
  """
  K_TILES: tl.constexpr = (K + BLOCK_M - 1) // BLOCK_M
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  TILES_PER_GROUP: tl.constexpr = K_TILES * N_TILES
  lhs_desc = None
  rhs_desc = None
  out_desc = None
  if USE_TMA:
    # A (K, M) lhs would need TMA boxes starting at any row, but a box's innermost start must be 16-byte
    # aligned: only the transposed layout (M, K) goes through TMA.
    tl.static_assert(TRANSPOSE_LHS, "TMA needs lhs in (M, K) layout")
    lhs_desc = tl.make_tensor_descriptor(lhs_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_K, BLOCK_M])
    rhs_desc = tl.make_tensor_descriptor(rhs_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[G, K, N], strides=[K * N, N, 1],
                                         block_shape=[1, BLOCK_M, BLOCK_N])
  for tile in range(tl.program_id(0), G * TILES_PER_GROUP, tl.num_programs(0)):
    g = tile // TILES_PER_GROUP
    ki, ni = tile_coords(tile - g * TILES_PER_GROUP, K_TILES, N_TILES, GROUP_M)
    row_start = tl.load(bounds_ptr + g)
    m_g = tl.load(bounds_ptr + g + 1) - row_start
    _tgmm_tile(lhs_ptr, rhs_ptr, existing_ptr, out_ptr, dbias_ptr, lhs_desc, rhs_desc, out_desc,
               M, g, row_start, m_g, ki, ni, K, N, BLOCK_M, BLOCK_N, BLOCK_K,
               TRANSPOSE_LHS, ACCUMULATE, BIAS_GRAD, USE_TMA, DOT_PRECISION)
