"""quantize_pair_kernel: an operand quantised to FP8 in two layouts, itself and its transpose, in one pass;
quantize_pair_grouped_kernel: the same with x's rows regrouped in the transpose, so that its 1x128 blocks start at
each group's first row.

x (G, R, C) (G = 1 for a matrix) is read once, a 128 x 128 tile per program (grid (cdiv(R, 128), cdiv(C, 128), G)),
and written as q (G, R, C) and qt (G, C, R), FP8, with float32 scales amax / FMAX (1 where a block is all zeros,
jgmm.quantize's rule) and q = clip(x * (1 / scale), -FMAX, FMAX) rounded to nearest (jgmm.quantize divides: the two
differ by one FP8 step where x / scale lies within a float32 ulp of a rounding boundary):
  ROWWISE (1x128 blocks of each layout): s (G, R, CB), one per row of x per 128 columns, and st (G, C, RB), one per
    column of x per 128 rows (qt's rows);
  otherwise (128x128 blocks): s (G, RB, CB), one per tile, and st (G, CB, RB), the same scales (a transposed block
    has the block's amax).
RB = cdiv(R, 128), CB = cdiv(C, 128). Elements past R or C are read as zeros and not written. x is 2-byte with
128x128 blocks: for float32 x one of the two stores wrote wrong values on an H100 (Triton 3.6, whether or not q and
qt were one value), so jgmm quantises float32 weights through XLA. This is what
DeepSeek-V3's training recipe quantises: activations 1x128 for the forward and their transpose for the weight
gradient, weights 128x128 read K-major by one product and N-major by the other.
"""
import triton
import triton.language as tl

BLOCK = tl.constexpr(128)
NUM_WARPS = 4  # Measured faster than 8 and 16 (H100): more programs per SM overlap their loads and stores.


@triton.jit
def _scale(amax, FMAX: tl.constexpr):
  return tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, FMAX))


@triton.jit
def _quantize(x, scale, dtype, FMAX: tl.constexpr):
  """x times the scale's reciprocal (rounded once, per row or column), clipped, rounded to dtype: a division per
  element instead made the transposing kernel twice as slow (H100)."""
  return tl.clamp(x * tl.math.div_rn(1.0, scale), -FMAX, FMAX).to(dtype)


@triton.jit
def quantize_pair_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: tl.constexpr, C: tl.constexpr,
                         FMAX: tl.constexpr, ROWWISE: tl.constexpr):
  RB: tl.constexpr = (R + BLOCK - 1) // BLOCK
  CB: tl.constexpr = (C + BLOCK - 1) // BLOCK
  OFFSET: tl.constexpr = tl.int64 if BLOCK * max(R, C) >= 2**31 else tl.int32  # Within a tile's rows.
  rb, cb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
  local = tl.arange(0, BLOCK)
  rows, cols = rb * BLOCK + local, cb * BLOCK + local
  mask = (rows < R)[:, None] & (cols < C)[None, :]
  # 64-bit bases per tile, offsets within it in OFFSET: x and q at [r, c] -> r * C + c, qt at [c, r] -> c * R + r.
  tile = g.to(tl.int64) * R * C + rb.to(tl.int64) * BLOCK * C + cb * BLOCK
  tile_t = g.to(tl.int64) * R * C + cb.to(tl.int64) * BLOCK * R + rb * BLOCK
  offsets = local.to(OFFSET)[:, None] * C + local[None, :]
  x = tl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(tl.float32)
  dtype = q_ptr.dtype.element_ty
  if ROWWISE:
    scale = _scale(tl.max(tl.abs(x), axis=1), FMAX)
    scale_t = _scale(tl.max(tl.abs(x), axis=0), FMAX)
    tl.store(s_ptr + (g.to(tl.int64) * R + rows) * CB + cb, scale, mask=rows < R)
    tl.store(st_ptr + (g.to(tl.int64) * C + cols) * RB + rb, scale_t, mask=cols < C)
    q = _quantize(x, scale[:, None], dtype, FMAX)
    qt = _quantize(x, scale_t[None, :], dtype, FMAX)
  else:
    scale = _scale(tl.max(tl.max(tl.abs(x), axis=1), axis=0), FMAX)
    tl.store(s_ptr + (g * RB + rb) * CB + cb, scale)
    tl.store(st_ptr + (g * CB + cb) * RB + rb, scale)
    q = _quantize(x, scale, dtype, FMAX)
    qt = q
  tl.store(q_ptr + tile + offsets, q, mask=mask)
  offsets_t = local.to(OFFSET)[:, None] * R + local[None, :]  # [c, r] of the transposed tile.
  tl.store(qt_ptr + tile_t + offsets_t, tl.trans(qt), mask=tl.trans(mask))


@triton.jit
def quantize_pair_grouped_kernel(x_ptr, blocks_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, R: tl.constexpr, C: tl.constexpr,
                                 PB: tl.constexpr, FMAX: tl.constexpr):
  """x (R, C) with its rows regrouped into PB blocks of 128 (blocks (2, PB) int32: block b holds rows [first[b],
  min(first[b] + 128, end[b])), none where first[b] >= end[b]; fp8_gmm's backward gives each group's rows from a
  block of its own on, so that no block holds rows of two groups). 1x128 blocks: q (R, C) with s (R, CB), as
  quantize_pair_kernel's, each row written by the block holding it; qt (C, 128 PB) with st (C, PB): block b's rows as
  qt's columns [128 b, 128 b + 128), zeros past its rows. One program per block and 128 columns of x: grid (PB, CB).
  Rows of x in no block are neither read nor written."""
  CB: tl.constexpr = (C + BLOCK - 1) // BLOCK
  RP: tl.constexpr = PB * BLOCK
  pb, cb = tl.program_id(0), tl.program_id(1)
  local = tl.arange(0, BLOCK)
  first = tl.load(blocks_ptr + pb)
  rows = first + local
  cols = cb * BLOCK + local
  valid = (rows >= 0) & (rows < tl.minimum(tl.load(blocks_ptr + PB + pb), R))  # Any blocks: never out of x.
  mask = valid[:, None] & (cols < C)[None, :]
  # 64-bit bases per tile, offsets within it in OFFSET (64-bit pointers per element cost twice the registers).
  OFFSET: tl.constexpr = tl.int64 if BLOCK * max(C, RP) >= 2**31 else tl.int32
  tile = first.to(tl.int64) * C + cb * BLOCK
  offsets = local.to(OFFSET)[:, None] * C + local[None, :]
  x = tl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(tl.float32)
  scale = _scale(tl.max(tl.abs(x), axis=1), FMAX)
  scale_t = _scale(tl.max(tl.abs(x), axis=0), FMAX)
  tl.store(s_ptr + rows.to(tl.int64) * CB + cb, scale, mask=valid)
  tl.store(st_ptr + cols.to(tl.int64) * PB + pb, scale_t, mask=cols < C)
  dtype = q_ptr.dtype.element_ty
  tl.store(q_ptr + tile + offsets, _quantize(x, scale[:, None], dtype, FMAX), mask=mask)
  qt = tl.trans(_quantize(x, scale_t[None, :], dtype, FMAX))  # [c, r]
  tile_t = cb.to(tl.int64) * BLOCK * RP + pb * BLOCK
  offsets_t = local.to(OFFSET)[:, None] * RP + local[None, :]
  tl.store(qt_ptr + tile_t + offsets_t, qt, mask=(cols < C)[:, None])
