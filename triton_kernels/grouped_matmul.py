"""Heterogeneous grouped GEMM: P independent products out[p] = lhs[p] @ rhs[p] of different sizes, one launch.

Problem p: lhs[p] (M_p, K_p), or (K_p, M_p) read transposed with TRANSPOSE_LHS; rhs[p] (K_p, N_p), or (N_p, K_p)
with TRANSPOSE_RHS; out[p] (M_p, N_p); all row-major, each its own buffer. Every M_p, N_p, K_p >= 1 (the caller
answers empty problems itself).

Many buffers, one launch: lhs_ptrs, rhs_ptrs and out_ptrs are Triton tuple params (one pointer param per buffer,
jgmm.ffi passes a tuple of arrays as one). A tuple is indexed only by constexprs, so a tile's base pointers are
picked with a chain of P selects over the tuple (select_pointer); unlike a table of addresses cast back to
pointers, a select keeps the params' 16-byte alignment, so loads stay vectorised. No operand is copied.

Schedule: a persistent grid; program i takes tiles i, i + programs, ... of the concatenated tile lists of all
problems, numbered slot by slot in the order of the problem table (the caller sorts the slots by decreasing K,
so the longest tiles go first and the tail is short), and within a problem in bands of GROUP_M row tiles
(common.tile_coords) so programs running together share operand panels in L2. The table problems_ptr is int32
(6, P_POW2), one column per slot (P_POW2 >= 32: geometry.group_table_lanes; padding columns past P never match):
  [0] tiles_end: tiles of slots 0..s (padding: 2^31 - 1), [1] first tile of s, [2] problem index p,
  [3] M_p, [4] N_p, [5] K_p.
A tile finds its slot with one vector reduction over tiles_end, then reads its column with scalar loads.

Offsets: a 64-bit base pointer per tile, within-tile offsets of int64 with OFFSET_64 (where some row length
times a block could pass 2^31), else int32. M_MULTIPLE, N_MULTIPLE, K_MULTIPLE: powers of 2 (at most 16) that
divide every problem's M, N, K; the compiler then knows the row lengths' alignment and vectorises the loads
along rows (cp.async of 16 bytes, which the software pipeline needs) where they are multiples of 16 bytes.

FP8 (grouped_matmul_fp8_kernel): FP8 operands (or, under the interpreter, float32 holding FP8 values) with
per-problem float32 scales in two more tuple params, lhs_scale_ptrs and rhs_scale_ptrs, in gmm_fp8_kernel's
recipes (triton_kernels/gmm_fp8.py, whose helpers apply them): lhs_scale[p] (M_p,) per row or (M_p, KB_p) per 1x128
block, rhs_scale[p] (N_p,) per channel or (NB_p, KB_p) per 128x128 block whatever rhs's layout (KB_p =
cdiv(K_p, 128), NB_p = cdiv(N_p, 128)). Block scales multiply each BLOCK_K step's product (BLOCK_K <= 128, a power
of 2, so a step lies in one block), row and channel scales the accumulator in the epilogue.
"""
import triton
import triton.language as tl

from jgmm.triton_kernels.common import store_tile, tile_coords
from jgmm.triton_kernels.gmm_fp8 import SCALE_BLOCK, scale_epilogue, scale_pointers, scaled_step

TABLE_FIELDS = 6  # Rows of the problem table: tiles_end, first tile, problem, M, N, K.


@triton.jit
def select_pointer(ptrs, p, P: tl.constexpr):
  """ptrs[p] for a runtime index p < P into a tuple of P pointers."""
  ptr = ptrs[0]
  for i in tl.static_range(1, P):
    ptr = tl.where(p == i, ptrs[i], ptr)
  return ptr


@triton.jit
def _load_multiple(ptr, MULTIPLE: tl.constexpr):
  """The int32 at ptr, a multiple of MULTIPLE, written so that the compiler sees it is one (tl.multiple_of on a
  loaded scalar does not reach the vectorisation of the loads it steers)."""
  return (tl.load(ptr) // MULTIPLE) * MULTIPLE


@triton.jit
def grouped_matmul_kernel(lhs_ptrs, rhs_ptrs, problems_ptr, out_ptrs,
                          P: tl.constexpr, P_POW2: tl.constexpr, NUM_TILES: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, TRANSPOSE_LHS: tl.constexpr, TRANSPOSE_RHS: tl.constexpr,
                          M_MULTIPLE: tl.constexpr, N_MULTIPLE: tl.constexpr, K_MULTIPLE: tl.constexpr,
                          OFFSET_64: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """All tiles of all P problems over a persistent grid (see the module docstring)."""
  _all_tiles(lhs_ptrs, rhs_ptrs, None, None, problems_ptr, out_ptrs, P, P_POW2, NUM_TILES, BLOCK_M, BLOCK_N,
             BLOCK_K, GROUP_M, TRANSPOSE_LHS, TRANSPOSE_RHS, M_MULTIPLE, N_MULTIPLE, K_MULTIPLE, OFFSET_64,
             DOT_PRECISION, False, False, False)


@triton.jit
def grouped_matmul_fp8_kernel(lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs,
                              P: tl.constexpr, P_POW2: tl.constexpr, NUM_TILES: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, TRANSPOSE_RHS: tl.constexpr,
                              M_MULTIPLE: tl.constexpr, N_MULTIPLE: tl.constexpr, K_MULTIPLE: tl.constexpr,
                              OFFSET_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
                              LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr):
  """grouped_matmul_kernel's tiles of FP8 problems, scaled (the module docstring's FP8 paragraph)."""
  tl.static_assert(BLOCK_K <= SCALE_BLOCK, "a K step must lie inside one 128-wide scale block")
  _all_tiles(lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs, P, P_POW2, NUM_TILES,
             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, False, TRANSPOSE_RHS, M_MULTIPLE, N_MULTIPLE, K_MULTIPLE,
             OFFSET_64, DOT_PRECISION, True, LHS_BLOCKS, RHS_BLOCKS)


@triton.jit
def _all_tiles(lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs,
               P: tl.constexpr, P_POW2: tl.constexpr, NUM_TILES: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, TRANSPOSE_LHS: tl.constexpr, TRANSPOSE_RHS: tl.constexpr,
               M_MULTIPLE: tl.constexpr, N_MULTIPLE: tl.constexpr, K_MULTIPLE: tl.constexpr,
               OFFSET_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
               SCALED: tl.constexpr, LHS_BLOCKS: tl.constexpr, RHS_BLOCKS: tl.constexpr):
  """The persistent loop of both kernels; the scale tuples are None unless SCALED."""
  OFFSET: tl.constexpr = tl.int64 if OFFSET_64 else tl.int32
  slots = tl.arange(0, P_POW2)
  tiles_end = tl.load(problems_ptr + slots)
  rows = tl.arange(0, BLOCK_M)
  cols = tl.arange(0, BLOCK_N)
  ks = tl.arange(0, BLOCK_K)
  for tile in range(tl.program_id(0), NUM_TILES, tl.num_programs(0)):
    slot = tl.sum((tiles_end <= tile).to(tl.int32), axis=0)
    column = problems_ptr + slot
    first_tile = tl.load(column + 1 * P_POW2)
    p = tl.load(column + 2 * P_POW2)
    m = _load_multiple(column + 3 * P_POW2, M_MULTIPLE)
    n = _load_multiple(column + 4 * P_POW2, N_MULTIPLE)
    k = _load_multiple(column + 5 * P_POW2, K_MULTIPLE)
    mi, ni = tile_coords(tile - first_tile, tl.cdiv(m, BLOCK_M), tl.cdiv(n, BLOCK_N), GROUP_M)
    row0 = mi.to(tl.int64) * BLOCK_M
    col0 = ni.to(tl.int64) * BLOCK_N
    row_mask = rows < m - row0
    col_mask = cols < n - col0

    if TRANSPOSE_LHS:  # lhs (K, M): element [r, c] at c * M + r
      a_ptr = select_pointer(lhs_ptrs, p, P) + row0
      a_offsets = rows[:, None] + ks.to(OFFSET)[None, :] * m
      a_step = BLOCK_K * m.to(tl.int64)
    else:  # lhs (M, K): element [r, c] at r * K + c
      a_ptr = select_pointer(lhs_ptrs, p, P) + row0 * k
      a_offsets = rows.to(OFFSET)[:, None] * k + ks[None, :]
      a_step = BLOCK_K
    if TRANSPOSE_RHS:  # rhs (N, K): element [r, c] at c * K + r
      b_ptr = select_pointer(rhs_ptrs, p, P) + col0 * k
      b_offsets = ks[:, None] + cols.to(OFFSET)[None, :] * k
      b_step = BLOCK_K
    else:  # rhs (K, N): element [r, c] at r * N + c
      b_ptr = select_pointer(rhs_ptrs, p, P) + col0
      b_offsets = ks.to(OFFSET)[:, None] * n + cols[None, :]
      b_step = BLOCK_K * n.to(tl.int64)

    if SCALED:
      sa_ptr, sb_ptr = scale_pointers(select_pointer(lhs_scale_ptrs, p, P), select_pointer(rhs_scale_ptrs, p, P),
                                      row0, rows, col0, cols, tl.cdiv(k, SCALE_BLOCK), OFFSET, LHS_BLOCKS,
                                      RHS_BLOCKS)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
      k_mask = ks < k - k0
      a = tl.load(a_ptr + a_offsets, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
      b = tl.load(b_ptr + b_offsets, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
      if SCALED:
        acc = scaled_step(acc, a, b, sa_ptr, sb_ptr, k0, row_mask, col_mask, LHS_BLOCKS, RHS_BLOCKS,
                          DOT_PRECISION)
      else:
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
      a_ptr += a_step
      b_ptr += b_step
    if SCALED:
      acc = scale_epilogue(acc, sa_ptr, sb_ptr, row_mask, col_mask, LHS_BLOCKS, RHS_BLOCKS)
    out_ptr = select_pointer(out_ptrs, p, P) + row0 * n + col0
    store_tile(out_ptr, rows, row_mask, cols, col_mask, n, acc, OFFSET)
