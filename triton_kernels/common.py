"""Pieces shared by the gmm, masked and tgmm kernels: tile order, a tgmm's lhs offsets, activations, masked stores."""
import triton
import triton.language as tl


@triton.jit
def tile_coords(local, m_tiles, N_TILES, GROUP_M: tl.constexpr):
  """(row tile, column tile) of tile `local` in an (m_tiles x N_TILES) grid, L2-friendly order (N_TILES a
  constexpr or, for grouped_matmul's problems of different widths, a runtime value).

  Bands of GROUP_M row tiles, the last band also taking the m_tiles % GROUP_M left over (GROUP_M to 2 GROUP_M - 1
  row tiles; all m_tiles where fewer than GROUP_M): inside a band the row tile varies fastest, so programs running
  at the same time share each rhs column panel and the band's lhs rows, and no band of a few row tiles reads the
  whole rhs again for them (a group of 9 row tiles in bands of 8 and 1 read its weights twice: docs/perf-notes.md,
  Session 40). GROUP_M 1: row-major, the column tile fastest. Gluon kernels call it too (the warp-specialised
  kernels' orders).
  """
  if GROUP_M == 1:
    return local // N_TILES, local % N_TILES
  bands = tl.maximum(m_tiles // GROUP_M, 1)
  band = tl.minimum(local // (GROUP_M * N_TILES), bands - 1)
  first_m = band * GROUP_M
  band_m = tl.where(band == bands - 1, m_tiles - first_m, GROUP_M)
  within = local - first_m * N_TILES
  return first_m + within % band_m, within // band_m


@triton.jit
def tgmm_lhs_offsets(M, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TRANSPOSE_LHS: tl.constexpr,
                     OFFSET: tl.constexpr):
  """A tgmm's lhs tile offsets (BLOCK_M of K, BLOCK_K rows of M), element [k, r] of lhs (K, M), or of lhs (M, K)
  where TRANSPOSE_LHS, from the tile's first element: r * K + k in OFFSET, or k * M + r in int64 (M is a runtime
  value)."""
  rows = tl.arange(0, BLOCK_K)
  k_local = tl.arange(0, BLOCK_M)
  if TRANSPOSE_LHS:
    return rows.to(OFFSET)[None, :] * K + k_local[:, None]
  else:
    return k_local.to(tl.int64)[:, None] * M + rows[None, :]


@triton.jit
def activation(h, ACTIVATION: tl.constexpr):
  """act(h) for the float32 tile h; ACTIVATION: "none", "relu", "gelu", "gelu_tanh" or "silu"."""
  if ACTIVATION == "relu":
    y = tl.maximum(h, 0.0)
  elif ACTIVATION == "gelu":
    y = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
  elif ACTIVATION == "gelu_tanh":
    # 0.5 * (1 + tanh(u)) == sigmoid(2u)
    y = h * tl.sigmoid(1.5957691216057308 * (h + 0.044715 * h * h * h))
  elif ACTIVATION == "silu":
    y = h * tl.sigmoid(h)
  else:
    tl.static_assert(ACTIVATION == "none", "unknown activation")
    y = h
  return y


@triton.jit
def store_tile(tile_ptr, rows, row_mask, cols, col_mask, row_stride, value, OFFSET: tl.constexpr):
  """tile_ptr[rows * row_stride + cols] = value where row_mask & col_mask.

  tile_ptr points at the tile's first row (64-bit arithmetic done once); rows/cols index within the tile,
  and the offsets are OFFSET (int32 where rows * row_stride stays below 2^31, else int64): fewer registers
  than a tensor of 64-bit pointers.
  """
  offsets = rows.to(OFFSET)[:, None] * row_stride + cols[None, :]
  tl.store(tile_ptr + offsets, value.to(tile_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def group_rows_descriptor(ptr, COLS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
  """A device-side TMA descriptor over ptr (rows, COLS) row-major (COLS * itemsize a multiple of 16, at most 2^30
    rows), through which store_group_tile writes (BLOCK_ROWS, BLOCK_COLS) boxes clipped to one group's rows.

    Two leading coordinates turn a group's bounds into the descriptor's: with coordinates (c0, c1, c2, col) an
    element sits at c0 * (2^34 - COLS) + (c1 + c2) * COLS + col; c0 = 2^30 makes the first term -2^30 * COLS
    (2^64 wraps to 0 in byte addresses), c1 = group end and c2 = 2^30 - group rows + row make the address that of
    (group start + row, col), and the hardware's bound c2 < 2^30 stops the box at the group's last row.
    """
  return tl.make_tensor_descriptor(ptr, shape=[0x7FFF0000, 0x7FFF0000, 0x40000000, COLS],
                                   strides=[0x400000000 - COLS, COLS, COLS, 1],
                                   block_shape=[1, 1, BLOCK_ROWS, BLOCK_COLS])


@triton.jit
def store_group_tile(desc, first_row, rows, row0, col0, tile, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """Rows [row0, rows) of the (BLOCK_M, BLOCK_N) tile (of the destination's dtype) to rows first_row + row0... and
    columns col0... of desc's array (group_rows_descriptor with (BLOCK_M, BLOCK_N // 2) boxes), in two column
    halves; columns past the array's end are clipped too. first_row + rows and row0 < 2^30."""
  left, right = tile.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
  coords = [0x40000000, first_row + rows, 0x40000000 - rows + row0]
  desc.store(coords + [col0], left.reshape(1, 1, BLOCK_M, BLOCK_N // 2))
  desc.store(coords + [col0 + BLOCK_N // 2], right.reshape(1, 1, BLOCK_M, BLOCK_N // 2))
