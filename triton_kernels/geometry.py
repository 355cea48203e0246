"""Launch geometry of the kernels: grid sizes and when Hopper tensor descriptors (TMA) may be used.

Pure Python on static shapes; callers pass the device's multiprocessor count and element sizes in bytes.
"""
GROUP_M = 8  # Row tiles per band of the L2-friendly tile order (common.tile_coords).
_TMA_MAX_BLOCK = 256  # Largest box dimension of a tensor descriptor.
_INT32_LIMIT = 2**31
RAGGED_WINDOW = 2**30  # Rows a ragged descriptor (common.group_rows_descriptor) can address.


def cdiv(a, b):
  return -(-a // b)


def next_pow2(x):
  return 1 << max(0, x - 1).bit_length()


def group_table_lanes(num_groups):
  """Lanes of a group (or problem) table held in registers and reduced once a tile (G_POW2 of gmm_kernel,
  tgmm_kernel, gmm_fp8_kernel, tgmm_fp8_kernel; P_POW2 of grouped_matmul_kernel): a power of two >= num_groups and
  >= 32, a warp's lanes. Narrower, Triton reduces it with shuffles, around which ptxas keeps the warp converged on
  every iteration of the loop: gmm_kernel ran 20-27% slower at 2 to 16 groups on an H200 (the same tiles as at 32
  groups; docs/perf-notes.md, session 52)."""
  return max(32, next_pow2(num_groups))


def gmm_grid(m, n_out, num_groups, block_m, block_n, persistent_programs):
  """Programs of gmm_kernel: one per tile, or at most persistent_programs (a persistent grid; None: not
  persistent). Any bounds give at most cdiv(M, block_m) + G + 1 row tiles (one partial tile per group,
  plus the zero tiles of the rows before the first and after the last group)."""
  max_tiles = (cdiv(m, block_m) + num_groups + 1) * cdiv(n_out, block_n)
  return (min(persistent_programs or max_tiles, max_tiles),)


def tgmm_grid(k, n, num_groups, block_m, block_n, persistent_programs):
  """Programs of tgmm_kernel: one per output tile, or at most persistent_programs (None: not persistent)."""
  tiles = num_groups * cdiv(k, block_m) * cdiv(n, block_n)
  return (min(persistent_programs or tiles, tiles),)


def masked_grid(max_m, n, num_groups, block_m, block_n):
  return (cdiv(max_m, block_m) * cdiv(n, block_n), num_groups)


def _strides_ok(row_lengths, itemsize):
  return all(length * itemsize % 16 == 0 for length in row_lengths)


def _blocks_ok(*blocks):
  return all(b <= _TMA_MAX_BLOCK for b in blocks)


def gmm_tma_ok(m, k, n_out, in_itemsize, out_itemsize, block_m, block_n, block_k):
  """Whether gmm_kernel/masked_gmm_kernel may use TMA: every row stride of lhs, rhs (both layouts, both
  swiglu halves), out and h a multiple of 16 bytes, boxes of at most 256, rows addressable in int32.
  (Boxes start at multiples of the block along the innermost axis, so their starts are aligned too.)"""
  return (_strides_ok((k, n_out), in_itemsize) and _strides_ok((n_out,), out_itemsize)
          and _blocks_ok(block_m, block_n, block_k) and m < _INT32_LIMIT)


def gmm_tma_store_ok(m, n_out, out_itemsize, block_n):
  """Whether gmm_kernel, loading through TMA (gmm_tma_ok), may also store out through a ragged descriptor
  (common.group_rows_descriptor): rows within its window, half a tile's row (the store box) at least 16 bytes."""
  return m <= RAGGED_WINDOW and block_n // 2 * out_itemsize >= 16 and n_out < _INT32_LIMIT


def gmm_ws_ok(m, k, n, num_groups, transpose_rhs, block_m, block_n, block_k, num_stages, shared_memory):
  """Whether gmm_ws_kernel (2-byte inputs and output) runs this shape and tiling: 128-row tiles, boxes of at
  most 256, TMA row strides of 16 bytes, a whole number of reduction steps per group unless rhs is transposed
  (a step must not read the next group's rows), descriptor coordinates in int32, and its shared memory (S
  stages of a 128-row lhs tile and an rhs tile, two 64-row output tiles) within shared_memory bytes."""
  stages = num_stages * (block_m * block_k + block_k * block_n) * 2
  return (block_m == 128 and _blocks_ok(block_n, block_k) and _strides_ok((k, n), 2)
          and (transpose_rhs or k % block_k == 0) and max(m, num_groups * max(k, n)) < _INT32_LIMIT
          and stages + 2 * 64 * block_n * 2 <= shared_memory)


def tgmm_ws_ok(m, k, n, num_groups, block_m, block_n, block_k, num_stages, shared_memory):
  """Whether tgmm_ws_kernel (2-byte lhs (M, K), rhs (M, N) and output) runs this shape and tiling: gmm_ws_ok's
  tiles, strides, shared memory and int32 coordinates (out viewed (G * K, N)), with no whole-step rule (a step
  starts at its group's first row, and the rows a last step reads past its group are zeroed)."""
  return gmm_ws_ok(m, k, n, num_groups, True, block_m, block_n, block_k, num_stages, shared_memory)


def gmm_fp8_ws_ok(m, k, n, num_groups, out_itemsize, block_m, block_n, block_k, num_stages, shared_memory):
  """Whether gmm_fp8_ws_kernel (FP8 inputs, K-major rhs) runs this shape and tiling: tiles of 128 x block_n (128 or
  256) x 128 or of 192 x 128 x 128, TMA row strides of 16 bytes (lhs and rhs rows of K FP8 bytes, out rows of N
  elements), descriptor coordinates in int32, and its shared memory (S stages of a block_m-row lhs tile, a
  block_n x 128 rhs tile, 128 rhs and next_pow2(block_m) lhs float32 scales; a 64 x 128 output tile per 64 rows)
  within shared_memory bytes."""
  scales = 4 * (128 + next_pow2(block_m))
  return ((block_m, block_n) in ((128, 128), (128, 256), (192, 128)) and block_k == 128 and _strides_ok((k,), 1)
          and _strides_ok((n,), out_itemsize) and max(m, num_groups * n) < _INT32_LIMIT
          and num_stages * ((block_m + block_n) * 128 + scales) + block_m * 128 * out_itemsize <= shared_memory)


def tgmm_fp8_ws_ok(m, k, n, num_groups, out_itemsize, block_m, block_n, block_k, num_stages, shared_memory):
  """Whether tgmm_fp8_ws_kernel (lhs (K, M), rhs (N, M) FP8) runs this shape and tiling: tiles of 128 x block_n
  (128 or 256) x 128, TMA row strides of 16 bytes (operand rows of M FP8 bytes, float32 scale rows of K and N,
  out rows of N elements), descriptor coordinates in int32 (M, and out viewed (G * K, N)), and its shared memory
  (S stages of a 128-row lhs tile, a block_n-row rhs tile and their scale rows, two 64 x 128 output tiles) within
  shared_memory bytes; at least 2 stages (a 128-wide tile waits for step s + 1's stage before it releases step s's:
  one stage would deadlock)."""
  return (block_m == block_k == 128 and block_n in (128, 256) and num_stages >= 2 and _strides_ok((m,), 1)
          and _strides_ok((k, n), 4) and _strides_ok((n,), out_itemsize) and max(m, num_groups * k) < _INT32_LIMIT
          and num_stages * (128 + block_n) * (128 + 4) + 2 * 64 * 128 * out_itemsize <= shared_memory)
