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
RB = cdiv(R, 128), CB = cdiv(C, 128). Elements past R or C are read as zeros and not written. A block holding NaN
gets a NaN scale and NaN values (the zero padding of a grouped transposed block too), one holding inf (and no NaN)
an inf scale, zeros and NaN where x is inf, as jgmm.quantize's division gives. On CUDA the grouped quantisation
and quantize_pair (both recipes) run quantize_pair_grouped_lanes_kernel (Gluon, at the end of this file), elsewhere
quantize_pair_grouped_kernel and quantize_pair_kernel.
x is 2-byte with 128x128 blocks: for float32 x one of the two stores wrote wrong values on an H100 (Triton 3.6,
whether or not q and qt were one value), so jgmm quantises float32 weights through XLA. This is what
DeepSeek-V3's training recipe quantises: activations 1x128 for the forward and their transpose for the weight
gradient, weights 128x128 read K-major by one product and N-major by the other.
"""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

BLOCK = tl.constexpr(128)
NUM_WARPS = 4  # Measured faster than 8 and 16 (H100): more programs per SM overlap their loads and stores.
NAN = tl.constexpr(tl.PropagateNan.ALL)


@triton.jit
def _nan_max(a, b):
  return tl.maximum(a, b, propagate_nan=NAN)


@triton.jit
def _scale(amax, FMAX: tl.constexpr):
  return tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, FMAX))


@triton.jit
def _quantize(x, scale, dtype, FMAX: tl.constexpr):
  """x times the scale's reciprocal (rounded once, per row or column), clipped, rounded to dtype: a division per
  element instead made the transposing kernel twice as slow (H100)."""
  return tl.clamp(x * tl.math.div_rn(1.0, scale), -FMAX, FMAX, propagate_nan=NAN).to(dtype)


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
    scale = _scale(tl.reduce(tl.abs(x), 1, _nan_max), FMAX)
    scale_t = _scale(tl.reduce(tl.abs(x), 0, _nan_max), FMAX)
    tl.store(s_ptr + (g.to(tl.int64) * R + rows) * CB + cb, scale, mask=rows < R)
    tl.store(st_ptr + (g.to(tl.int64) * C + cols) * RB + rb, scale_t, mask=cols < C)
    q = _quantize(x, scale[:, None], dtype, FMAX)
    qt = _quantize(x, scale_t[None, :], dtype, FMAX)
  else:
    scale = _scale(tl.reduce(tl.reduce(tl.abs(x), 1, _nan_max), 0, _nan_max), FMAX)
    tl.store(s_ptr + (g * RB + rb) * CB + cb, scale)
    tl.store(st_ptr + (g * CB + cb) * RB + rb, scale)
    q = _quantize(x, scale, dtype, FMAX)
    qt = q
  tl.store(q_ptr + tile + offsets, q, mask=mask)
  offsets_t = local.to(OFFSET)[:, None] * R + local[None, :]  # [c, r] of the transposed tile.
  tl.store(qt_ptr + tile_t + offsets_t, tl.trans(qt), mask=tl.trans(mask))


@triton.jit
def quantize_pair_grouped_kernel(x_ptr, blocks_ptr, st_ptr, q_ptr, s_ptr, qt_ptr, R: tl.constexpr, C: tl.constexpr,
                                 PB: tl.constexpr, FMAX: tl.constexpr, GIVEN_SCALE_T: tl.constexpr = False):
  """x (R, C) with its rows regrouped into PB blocks of 128 (blocks (2 or 3, PB) int32, of which rows 0 and 1 are
  read: block b holds rows [first[b], min(first[b] + 128, end[b])), none where first[b] >= end[b]; fp8_gmm's
  backward gives each group's rows from a block of its own on, so that no block holds rows of two groups). 1x128
  blocks: q (R, C) with s transposed, (CB, R), each row written by the block holding it; qt (C, 128 PB) with st
  transposed, (PB, C): block b's rows as qt's columns [128 b, 128 b + 128), zeros past its rows (both scales
  transposed so that a program writes its 128 of each contiguously; jgmm's caller transposes them). GIVEN_SCALE_T:
  st is an input, qt's scales per group and column (G + 1, C) (fp8_gmm's wgrad_scale="group"), block b's read at its
  group (blocks' third row) instead of computed. One program per block and 128 columns of x: grid (PB, CB). Rows of
  x in no block are neither read nor written."""
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
  scale = _scale(tl.reduce(tl.abs(x), 1, _nan_max), FMAX)
  tl.store(s_ptr + cb.to(tl.int64) * R + rows, scale, mask=valid)
  if GIVEN_SCALE_T:
    scale_t = tl.load(st_ptr + tl.load(blocks_ptr + 2 * PB + pb).to(tl.int64) * C + cols, mask=cols < C, other=1.0)
  else:
    scale_t = _scale(tl.reduce(tl.abs(x), 0, _nan_max), FMAX)
    tl.store(st_ptr + pb.to(tl.int64) * C + cols, scale_t, mask=cols < C)
  dtype = q_ptr.dtype.element_ty
  tl.store(q_ptr + tile + offsets, _quantize(x, scale[:, None], dtype, FMAX), mask=mask)
  qt = tl.trans(_quantize(x, scale_t[None, :], dtype, FMAX))  # [c, r]
  tile_t = cb.to(tl.int64) * BLOCK * RP + pb * BLOCK
  offsets_t = local.to(OFFSET)[:, None] * RP + local[None, :]
  tl.store(qt_ptr + tile_t + offsets_t, qt, mask=(cols < C)[:, None])


@triton.jit
def block_column_amax_kernel(x_ptr, blocks_ptr, amax_ptr, R: tl.constexpr, C: tl.constexpr, PB: tl.constexpr):
  """amax (G + 1, C) int32, zeros on entry: the float32 bits of the largest |x| of each column over the rows of each
  group's blocks of quantize_pair_grouped_kernel (blocks (3, PB): the third row, each block's group in [0, G]), by
  an atomic integer max per block and column: the bits of non-negative floats order as the floats do, and a NaN's
  lie above inf's, so a group's column holding a NaN gets a NaN (0 for a group without rows). One program per block
  and 128 columns: grid (PB, CB)."""
  pb, cb = tl.program_id(0), tl.program_id(1)
  local = tl.arange(0, BLOCK)
  first = tl.load(blocks_ptr + pb)
  rows = first + local
  cols = cb * BLOCK + local
  valid = (rows >= 0) & (rows < tl.minimum(tl.load(blocks_ptr + PB + pb), R))
  OFFSET: tl.constexpr = tl.int64 if BLOCK * C >= 2**31 else tl.int32
  offsets = local.to(OFFSET)[:, None] * C + local[None, :]
  x = tl.load(x_ptr + first.to(tl.int64) * C + cb * BLOCK + offsets, mask=valid[:, None] & (cols < C)[None, :],
              other=0.0)
  amax = tl.reduce(tl.abs(x.to(tl.float32)), 0, _nan_max)
  group = tl.load(blocks_ptr + 2 * PB + pb)
  tl.atomic_max(amax_ptr + group.to(tl.int64) * C + cols, amax.to(tl.int32, bitcast=True), mask=cols < C,
                sem="relaxed")


# quantize_pair_grouped_lanes_kernel (CUDA): 8 warps at most 128 registers each, two programs per SM. Measured
# (H100, (32768, C) bf16, C 2048-7168): 18-21% faster than quantize_pair_grouped_kernel, 79-82% of the throughput
# of a copy of the same bytes (docs/experiments/quantize_ab.py).
LANES_WARPS = 8
LANES_MAXNREG = 128


def lanes_layouts(num_warps: int, warps_c: int = 2):
  """(TILE, TILE_T) of quantize_pair_grouped_lanes_kernel (num_warps a power of two up to 32): a 128 x 128 tile
  over 4 x 8 lanes (rows x columns) and the warps (min(num_warps, warps_c) along the columns: a power of two up
  to 16), each thread holding a block of rows x columns of it; TILE orders a thread's registers along the columns
  (x's loads and q's stores), TILE_T the same elements along the rows (qt's stores: its rows are x's columns), so
  the transpose moves no data between threads."""
  # At 8 warps a thread's 8 x 8 block: 16-byte loads of x, 8-byte stores of q's and qt's rows (H100: 2-4% faster
  # than 16 x 4 (warps_c 4), 4-byte stores of q; 4 x 16 (warps_c 1), 4-byte stores of qt's rows, 25-37% slower).
  warps_c = min(num_warps, warps_c)
  warps_r = num_warps // warps_c
  rows, cols = 128 // 4 // warps_r, 128 // 8 // warps_c
  powers = lambda n: [1 << b for b in range(n.bit_length() - 1)]
  regs_r, regs_c = [[p, 0] for p in powers(rows)], [[0, p] for p in powers(cols)]
  lane_bases = [[0, cols * p] for p in powers(8)] + [[rows * p, 0] for p in powers(4)]
  warp_bases = [[0, 8 * cols * p] for p in powers(warps_c)] + [[4 * rows * p, 0] for p in powers(warps_r)]
  tile = lambda regs: gl.DistributedLinearLayout(regs, lane_bases, warp_bases, [], [128, 128])
  return tile(regs_c + regs_r), tile(regs_r + regs_c)


@gluon.jit
def quantize_pair_grouped_lanes_kernel(x_ptr, blocks_ptr, st_ptr, q_ptr, s_ptr, qt_ptr, R: gl.constexpr,
                                       C: gl.constexpr, PB: gl.constexpr, RT: gl.constexpr, FMAX: gl.constexpr,
                                       TILE: gl.constexpr, TILE_T: gl.constexpr, GIVEN_SCALE_T: gl.constexpr = False,
                                       TILE_SCALES: gl.constexpr = False):
  """quantize_pair_grouped_kernel's outputs (float8_e4m3fn q and qt) with a layout that stores both from registers
  (lanes_layouts; the plain kernel transposes through shared memory a byte at a time) and each row's and column's
  scale and reciprocal computed by one thread (two at 8 warps), not by every thread holding the row or column.
  No clamp: CUDA's conversion to FP8 saturates (cvt.rn.satfinite) and keeps NaN. One program per 128 columns and block,
  columns first (x's rows and q's read and written whole by neighbouring programs): grid (CB * PB,). qt (C, RT):
  RT = 128 PB (quantize_pair_grouped_kernel's qt), or R with blocks on the 128-row grid (quantize_pair_kernel's
  1x128 qt: blocks [128 b, R), PB = cdiv(R, 128)); qt's columns past RT are not written. GIVEN_SCALE_T: st is an
  input (G + 1, C), read at each block's group instead of computed (quantize_pair_grouped_kernel's).
  TILE_SCALES: quantize_pair_kernel's 128x128 blocks of x (G, R, C) (q (G, R, C), qt (G, C, RT = R), blocks on the
  128-row grid): one scale a tile, s (G, PB, CB) and st (G, CB, PB); grid (G * CB * PB,), matrix after matrix."""
  CB: gl.constexpr = (C + BLOCK - 1) // BLOCK
  OFFSET: gl.constexpr = gl.int64 if BLOCK * max(C, RT) >= 2**31 else gl.int32
  ONE: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])  # A row's or column's scale a thread.
  g, tile_id = gl.program_id(0) // (CB * PB), gl.program_id(0) % (CB * PB)
  cb, pb = tile_id % CB, tile_id // CB
  first = gl.load(blocks_ptr + pb)
  end = gl.minimum(gl.load(blocks_ptr + PB + pb), R)
  r_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE))
  c_local = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE))
  rows, cols = first + r_local, cb * BLOCK + c_local
  mask = gl.expand_dims((rows >= 0) & (rows < end), 1) & gl.expand_dims(cols < C, 0)
  # 64-bit bases per tile, offsets within it in OFFSET: x and q at [r, c] -> r * C + c, qt at [c, r] -> c * RT + r.
  tile = (g.to(gl.int64) * R + first) * C + cb * BLOCK
  offsets = gl.expand_dims(r_local.to(OFFSET), 1) * C + gl.expand_dims(c_local, 0)
  x = gl.load(x_ptr + tile + offsets, mask=mask, other=0.0).to(gl.float32)
  dtype: gl.constexpr = q_ptr.dtype.element_ty
  if TILE_SCALES:
    scale = _scale(gl.reduce(gl.reduce(gl.abs(x), 1, _nan_max), 0, _nan_max), FMAX)
    gl.store(s_ptr + (g * PB + pb) * CB + cb, scale)
    gl.store(st_ptr + (g * CB + cb) * PB + pb, scale)
    inverse = gl.div_rn(1.0, scale)
    gl.store(q_ptr + tile + offsets, (x * inverse).to(dtype), mask=mask)
    # x's float32 registers renamed, no data moved (q's converted instead: wrong values, packed 8-bit registers).
    qt = (gl.convert_layout(x, TILE_T) * inverse).to(dtype)
  else:
    one = gl.arange(0, BLOCK, layout=ONE)
    scale = _scale(gl.convert_layout(gl.reduce(gl.abs(x), 1, _nan_max), ONE), FMAX)
    gl.store(s_ptr + cb.to(gl.int64) * R + first + one, scale, mask=(first + one >= 0) & (first + one < end))
    if GIVEN_SCALE_T:
      group = gl.load(blocks_ptr + 2 * PB + pb)
      scale_t = gl.load(st_ptr + group.to(gl.int64) * C + cb * BLOCK + one, mask=cb * BLOCK + one < C, other=1.0)
    else:
      scale_t = _scale(gl.convert_layout(gl.reduce(gl.abs(x), 0, _nan_max), ONE), FMAX)
      gl.store(st_ptr + pb.to(gl.int64) * C + cb * BLOCK + one, scale_t, mask=cb * BLOCK + one < C)
    inverse = gl.convert_layout(gl.div_rn(gl.full_like(scale, 1.0), scale), gl.SliceLayout(1, TILE))
    inverse_t = gl.convert_layout(gl.div_rn(gl.full_like(scale_t, 1.0), scale_t), gl.SliceLayout(0, TILE))
    gl.store(q_ptr + tile + offsets, (x * gl.expand_dims(inverse, 1)).to(dtype), mask=mask)
    qt = gl.convert_layout((x * gl.expand_dims(inverse_t, 0)).to(dtype), TILE_T)  # Registers renamed.
  rt = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, TILE_T))
  ct = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, TILE_T))
  tile_t = (g.to(gl.int64) * C + cb * BLOCK) * RT + pb * BLOCK
  offsets_t = gl.expand_dims(ct.to(OFFSET), 0) * RT + gl.expand_dims(rt, 1)
  gl.store(qt_ptr + tile_t + offsets_t, qt,
           mask=gl.expand_dims(pb * BLOCK + rt < RT, 1) & gl.expand_dims(cb * BLOCK + ct < C, 0))
