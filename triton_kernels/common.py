"""Pieces shared by the gmm, masked and tgmm kernels: tile order, activations, masked stores."""
import triton
import triton.language as tl


@triton.jit
def tile_coords(local, m_tiles, N_TILES, GROUP_M: tl.constexpr):
  """(row tile, column tile) of tile `local` in an (m_tiles x N_TILES) grid, L2-friendly order (N_TILES a
  constexpr or, for grouped_matmul's problems of different widths, a runtime value).

  Bands of GROUP_M row tiles: inside a band the row tile varies fastest, so programs running at the same
  time share each rhs column panel and the band's lhs rows.
  """
  tiles_per_band = GROUP_M * N_TILES
  band = local // tiles_per_band
  first_m = band * GROUP_M
  band_m = tl.minimum(m_tiles - first_m, GROUP_M)
  within = local - band * tiles_per_band
  return first_m + within % band_m, within // band_m


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
