"""grouped_matmul_fp8_ws_kernel: heterogeneous FP8 products with fine-grained scales, warp-specialised in Gluon (sm_90).

Problem p: out[p] (M_p, N_p) = (lhs[p] * lhs_scale[p]) @ (rhs[p] * rhs_scale[p]).T, lhs[p] (M_p, K_p) and rhs[p]
(N_p, K_p) FP8 (K-major: Hopper's FP8 wgmma reads B only K-major), each its own buffer, passed as Triton tuple
params as in grouped_matmul.py (whose problem table, slots sorted by decreasing K, this kernel reads: tiles of
128 x 128). Scales as grouped_matmul_fp8_kernel's (LHS_BLOCKS: per 1x128 block, here transposed, (KB_p, M_p
rounded up to a multiple of 4), else (M_p,); RHS_BLOCKS: (NB_p, KB_p) per 128x128 block, else (N_p,)). Every M_p,
N_p, K_p >= 1; K_p a multiple of 16 and N_p of 16 bytes of the output (TMA row strides).

gmm_fp8_ws.py's structure (a TMA loader warp, two consumer warpgroups of 64 rows, S stages of one 128-wide K scale
block each, promotion of each block's product into the float32 accumulator with its scales) over the tiles of all
problems: program i takes tiles i, i + programs, ...; a tile's problem is found by walking the table's tiles_end
from the previous tile's slot (a program's tiles only move forward). With no operand in one buffer, the
descriptors are made on the device: the loader makes lhs[p]'s and rhs[p]'s (and lhs_scale[p]'s: a step's 128 row
scales come by TMA, the rhs block scale by cp.async, into the stage as in gmm_fp8_ws.py) for each tile, the
consumers out[p]'s for each store. TMA reads zeros past a problem's rows, columns and K (the partial last scale
block), and its stores clip at out[p]'s edges, so no tile reads or writes another problem's memory. A descriptor's
bytes are rewritten in place each tile: before it changes to another problem, the loader waits until the copies
issued with the old one have landed (a consumer rewrites out[p]'s after its previous store completed).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from jgmm.triton_kernels.gmm_fp8_ws import (BLOCK, ROW_SCALE_LAYOUT, SCALE_LAYOUT, SCALES, copy_rhs_scales,
                                            row_channel_scales, scaled_steps)
from jgmm.triton_kernels.gmm_ws import (HALF, _tma_load, _tma_store, allocate_boxes, expect_boxes,
                                        release_stages)


@gluon.jit
def _select(ptrs, p, P: gl.constexpr):
  """ptrs[p] for a runtime index p < P into a tuple of P pointers (a chain of selects: tuples take constexpr
  indices only)."""
  ptr = ptrs[0]
  for i in gl.static_range(1, P):
    ptr = gl.where(p == i, ptrs[i], ptr)
  return ptr


@gluon.jit
def _tile(problems_ptr, tile, slot, P_POW2: gl.constexpr):
  """(slot, problem, M, N, K, first row, first column) of tile, whose slot is slot or later."""
  while gl.load(problems_ptr + slot) <= tile:
    slot += 1
  column = problems_ptr + slot
  local = tile - gl.load(column + P_POW2)
  n = gl.load(column + 4 * P_POW2)
  num_n = (n + BLOCK - 1) // BLOCK
  return (slot, gl.load(column + 2 * P_POW2), gl.load(column + 3 * P_POW2), n, gl.load(column + 5 * P_POW2),
          (local // num_n) * BLOCK, (local % num_n) * BLOCK)


@gluon.jit
def _loader(lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
            empty, P: gl.constexpr, P_POW2: gl.constexpr, NUM_TILES: gl.constexpr, S: gl.constexpr,
            LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, LHS_LAYOUT: gl.constexpr, RHS_LAYOUT: gl.constexpr):
  half_bytes: gl.constexpr = HALF * BLOCK
  tile_bytes: gl.constexpr = BLOCK * BLOCK + (4 * BLOCK if LHS_BLOCKS else 0)  # The rhs tile, the lhs scales.
  step = 0
  slot = 0
  loaded = -1  # The problem the descriptors were last made for.
  for tile in range(gl.program_id(0), NUM_TILES, gl.num_programs(0)):
    slot, p, m, n, k, row0, col0 = _tile(problems_ptr, tile, slot, P_POW2)
    if p != loaded:  # The copies in flight read the old descriptors: let them land first.
      for i in range(gl.maximum(step - S, 0), step):
        mbarrier.wait(ready.index(i % S), (i // S) & 1)
      loaded = p
    lhs_desc = tma.make_tensor_descriptor(_select(lhs_ptrs, p, P), [m, k], [k, 1], [HALF, BLOCK], LHS_LAYOUT)
    rhs_desc = tma.make_tensor_descriptor(_select(rhs_ptrs, p, P), [n, k], [k, 1], [BLOCK, BLOCK], RHS_LAYOUT)
    both = m - row0 > HALF  # Else the bottom half holds no row: its consumer skips it, so no load.
    k_steps = (k + BLOCK - 1) // BLOCK
    if LHS_BLOCKS:  # lhs_scale[p] transposed, (KB_p, M_p rounded up to 4).
      m4 = (m + 3) // 4 * 4
      sa_desc = tma.make_tensor_descriptor(_select(lhs_scale_ptrs, p, P), [k_steps, m4], [m4, 1], [1, BLOCK],
                                           ROW_SCALE_LAYOUT)
    sb_ptr = _select(rhs_scale_ptrs, p, P) + (col0 // BLOCK).to(gl.int64) * k_steps
    for kk in range(k_steps):
      s = step % S
      mbarrier.wait(empty.index(s), ((step // S) & 1) ^ 1)
      if RHS_BLOCKS:
        copy_rhs_scales(s_bufs.index(s), ready.index(s), sb_ptr, kk, k_steps, False)
      expect_boxes(ready.index(s), tile_bytes, half_bytes, m - row0, 2, HALF)
      _tma_load(lhs_desc, [row0, kk * BLOCK], ready.index(s), a_bufs.index(2 * s))
      _tma_load(lhs_desc, [row0 + HALF, kk * BLOCK], ready.index(s), a_bufs.index(2 * s + 1), pred=both)
      _tma_load(rhs_desc, [col0, kk * BLOCK], ready.index(s), b_bufs.index(s))
      if LHS_BLOCKS:
        _tma_load(sa_desc, [kk, row0], ready.index(s), sa_bufs.index(s))
      step += 1


@gluon.jit
def _consumer(lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs, ready,
              empty, P: gl.constexpr, P_POW2: gl.constexpr, NUM_TILES: gl.constexpr, S: gl.constexpr,
              LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32])
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  COLS: gl.constexpr = gl.SliceLayout(0, acc_layout)
  c_buf = c_bufs.index(H)
  step = 0
  slot = 0
  for tile in range(gl.program_id(0), NUM_TILES, gl.num_programs(0)):
    slot, p, m, n, k, row0, col0 = _tile(problems_ptr, tile, slot, P_POW2)
    k_steps = (k + BLOCK - 1) // BLOCK
    row = row0 + H * HALF
    half_rows = gl.minimum(gl.maximum(m - row, 0), HALF)
    row_mask = gl.arange(0, HALF, layout=ROWS) < half_rows
    cols = col0 + gl.arange(0, BLOCK, layout=COLS)
    if half_rows > 0:
      acc = gl.zeros((HALF, BLOCK), dtype=gl.float32, layout=acc_layout)
      acc, _ = scaled_steps(acc, acc, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty, step, k_steps, S, LHS_BLOCKS,
                            RHS_BLOCKS, False, H, 2)
      sa_ptrs = _select(lhs_scale_ptrs, p, P) + row.to(gl.int64) + gl.arange(0, HALF, layout=ROWS)
      acc = row_channel_scales(acc, sa_ptrs, _select(rhs_scale_ptrs, p, P) + cols, row_mask, cols < n, LHS_BLOCKS,
                               RHS_BLOCKS)
      out_ptr = _select(out_ptrs, p, P)
      tma.store_wait(pendings=0)  # This consumer's previous store has read c_buf and its descriptor.
      c_buf.store(acc.to(out_ptr.dtype.element_ty))
      fence_async_shared()
      out_desc = tma.make_tensor_descriptor(out_ptr, [m, n], [n, 1], [HALF, BLOCK], OUT_LAYOUT)
      _tma_store(out_desc, [row, col0], c_buf)  # Clipped at out[p]'s last row and column.
    else:  # The top half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    step += k_steps
  tma.store_wait(pendings=0)


@gluon.jit
def grouped_matmul_fp8_ws_kernel(lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs,
                                 P: gl.constexpr, P_POW2: gl.constexpr, NUM_TILES: gl.constexpr, S: gl.constexpr,
                                 LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, LHS_LAYOUT: gl.constexpr,
                                 RHS_LAYOUT: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """The module docstring's products; LHS_LAYOUT, RHS_LAYOUT, OUT_LAYOUT: the shared-memory layouts of a (64, 128)
  lhs half, a (128, 128) rhs tile and a (64, 128) output half (gmm_ws.shared_layout)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate_boxes(
      lhs_ptrs[0].dtype.element_ty, [HALF, BLOCK], LHS_LAYOUT, rhs_ptrs[0].dtype.element_ty, [BLOCK, BLOCK],
      RHS_LAYOUT, out_ptrs[0].dtype.element_ty, BLOCK, S, OUT_LAYOUT)
  s_bufs = gl.allocate_shared_memory(gl.float32, [S, SCALES], SCALE_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, BLOCK], ROW_SCALE_LAYOUT)
  gl.warp_specialize([
      (_consumer, (lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                   ready, empty, P, P_POW2, NUM_TILES, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0)),
      (_consumer, (lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, out_ptrs, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                   ready, empty, P, P_POW2, NUM_TILES, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1)),
      (_loader, (lhs_ptrs, rhs_ptrs, lhs_scale_ptrs, rhs_scale_ptrs, problems_ptr, a_bufs, b_bufs, sa_bufs, s_bufs,
                 ready, empty, P, P_POW2, NUM_TILES, S, LHS_BLOCKS, RHS_BLOCKS, LHS_LAYOUT, RHS_LAYOUT)),
  ], [4, 1], [232, 40])
