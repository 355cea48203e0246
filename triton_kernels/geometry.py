"""Launch geometry of the kernels: grid sizes and when Hopper tensor descriptors (TMA) may be used.

Pure Python on static shapes; callers pass the device's multiprocessor count and element sizes in bytes.
"""
GROUP_M = 8  # Row tiles per band of the L2-friendly tile order (common.tile_coords).
_INT32_LIMIT = 2**31


def cdiv(a, b):
  return -(-a // b)


def next_pow2(x):
  return 1 << max(0, x - 1).bit_length()


def gmm_grid(m, n_out, num_groups, block_m, block_n, persistent_programs):
  """Programs of gmm_kernel: one per tile, or at most persistent_programs (a persistent grid; None: not
  persistent)."""
  max_tiles = gmm_row_tile_bound(m, num_groups, block_m) * cdiv(n_out, block_n)
  return (min(persistent_programs or max_tiles, max_tiles),)


def gmm_row_tile_bound(m, num_groups, block_m):
  """Most row tiles any bounds give: one partial tile at most per group and per run of rows outside the
  groups (before and after them)."""
  return cdiv(m, block_m) + num_groups + 2


def tgmm_grid(k, n, num_groups, block_m, block_n, persistent_programs):
  """Programs of tgmm_kernel: one per output tile, or at most persistent_programs (None: not persistent)."""
  tiles = num_groups * cdiv(k, block_m) * cdiv(n, block_n)
  return (min(persistent_programs or tiles, tiles),)


def masked_grid(max_m, n, num_groups, block_m, block_n):
  return (cdiv(max_m, block_m) * cdiv(n, block_n), num_groups)


def _strides_ok(row_lengths, itemsize):
  return all(length * itemsize % 16 == 0 for length in row_lengths)


def gmm_tma_ok(m, k, n_out, in_itemsize, out_itemsize):
  """Whether gmm_kernel/masked_gmm_kernel may use TMA: every row stride of lhs, rhs (both layouts, both
  swiglu halves), out and h a multiple of 16 bytes, rows addressable in int32. (Boxes start at multiples
  of the block along the innermost axis, so their starts are aligned too; Triton splits a block dimension
  over 256, a TMA box's limit, into several copies.)"""
  return (_strides_ok((k, n_out), in_itemsize) and _strides_ok((n_out,), out_itemsize) and m < _INT32_LIMIT)
