"""gmm_ws_kernel: the Hopper (sm_90) gmm forward, warp-specialised, written in Gluon (Triton's tile-level language).

out rows of group g = lhs rows of g @ rhs[g]: lhs (M, K), rhs (G, K, N) or (G, N, K) with TRANSPOSE_RHS, out (M, N),
all 2-byte floats. No bias, activation or accumulation (jgmm's gmm_kernel covers those).

Persistent: one program per SM walks tiles t = program id, + programs, ...; tile t is a row tile (128 rows of the
schedule, below) x a column tile (BLOCK_N columns), row-major (BAND = 1) or in bands of BAND row tiles (tile_of).
Per program, three partitions:
- a loader warp: per reduction step, TMA copies of lhs rows [row0, row0 + 128) (the bottom 64 only if they hold a row
  of the group) and the rhs tile of the tile's group into one of S shared-memory stages (mbarriers: `ready` when the
  bytes landed, `empty` when both consumers are done);
- two consumer warpgroups: consumer H owns rows [64 H, 64 H + 64) of the tile (a 64 x BLOCK_N fp32 accumulator,
  async wgmma). A consumer whose half holds no row of the group skips its MMAs, so the work pads to 64 rows while
  the rhs tile is read once per 128. A half goes out through shared memory and a TMA store; for a partial half (a
  group's last rows) through a descriptor made on the device that ends at its last row, which clips the store, so
  no tile writes a row of another.

schedule (1 + 6 R_MAX,) int32, from jgmm.backend_triton: [R, then per row tile r < R_MAX: group, first row, rows of
the group in it (0: a tile of rows outside every group, zeros to store), rows to store, the first row tile of its
group (or of the rows before or after the groups) and that group's row tiles]; only r < R are used.
The rhs descriptor views rhs as (G * K, N) (K a multiple of BLOCK_K, so a step never reads another group's rows)
or, transposed, (G * N, K) (rows past the group's N only feed columns that are never stored).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from jgmm.triton_kernels.common import tile_coords

# TMA copies: Triton 3.6 names, renamed after it (async_load / async_store; the old names then raise).
_tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)
_tma_store = getattr(tma, "async_store", tma.async_copy_shared_to_global)

BLOCK_M = 128  # Rows per tile: two consumers of 64 (the m64 of wgmma).
HALF = gl.constexpr(64)
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch: 12 warps x 168 fit an SM; the consumers then take 232.


@gluon.jit
def tile_of(schedule_ptr, t, num_n, R_MAX: gl.constexpr, BAND: gl.constexpr = 1, MASKED_M: gl.constexpr = 0,
            TILE_M: gl.constexpr = BLOCK_M):
  """(group, first row, rows of the group, rows to store, column tile) of tile t: row-major over (row tiles,
  num_n), or with BAND > 1 in bands of BAND row tiles of one group (or of the rows before or after the groups), the
  row tile fastest inside a band (common.tile_coords over the group's row tiles: programs running at once share rhs
  panels, and a band never straddles two groups, whose weights it would read both).

  MASKED_M > 0: the masked layout of MASKED_M rows a group (lhs (G * MASKED_M, K)), no schedule: schedule_ptr is
  masked_m (G,) and row tile r = g * cdiv(MASKED_M, TILE_M) + i holds rows [i TILE_M, (i + 1) TILE_M) of group g
  (R_MAX = G * cdiv(MASKED_M, TILE_M) of them; BAND 1), its rows < masked_m[g] those of the group."""
  if MASKED_M > 0:
    gl.static_assert(BAND == 1, "the masked layout's tiles run row-major")
    m_tiles: gl.constexpr = (MASKED_M + TILE_M - 1) // TILE_M
    r = t // num_n
    g = r // m_tiles
    first = (r - g * m_tiles) * TILE_M
    rows = gl.minimum(gl.maximum(gl.load(schedule_ptr + g) - first, 0), TILE_M)
    return g, g * MASKED_M + first, rows, gl.minimum(MASKED_M - first, TILE_M), t % num_n
  else:
    first, count = region_of(schedule_ptr, t, num_n, R_MAX, BAND)
    return scheduled_tile(schedule_ptr, t, first, count, num_n, R_MAX, BAND)


@gluon.jit
def region_of(schedule_ptr, t, num_n, R_MAX: gl.constexpr, BAND: gl.constexpr):
  """tile_of's first round of schedule loads for tile t (BAND > 1): the first row tile and the row tiles of the
  region of row tile t // num_n (its group, or the rows before or after the groups); 0s row-major (no load)."""
  if BAND == 1:
    return t * 0, t * 0
  else:
    return (gl.load(schedule_ptr + 1 + 4 * R_MAX + t // num_n), gl.load(schedule_ptr + 1 + 5 * R_MAX + t // num_n))


@gluon.jit
def scheduled_tile(schedule_ptr, t, first, count, num_n, R_MAX: gl.constexpr, BAND: gl.constexpr):
  """tile_of's second round: (group, first row, rows of the group, rows to store, column tile) of tile t, whose
  region_of is (first, count)."""
  if BAND == 1:
    r, ni = t // num_n, t % num_n
  else:
    i, ni = tile_coords(t - first * num_n, count, num_n, BAND)
    r = first + i
  return (gl.load(schedule_ptr + 1 + r), gl.load(schedule_ptr + 1 + R_MAX + r),
          gl.load(schedule_ptr + 1 + 2 * R_MAX + r), gl.load(schedule_ptr + 1 + 3 * R_MAX + r), ni)


@gluon.jit
def row_tiles_in_use(schedule_ptr, R_MAX: gl.constexpr, MASKED_M: gl.constexpr = 0):
  """The row tiles tile_of walks: the schedule's count, or all R_MAX of the masked layout (MASKED_M > 0)."""
  if MASKED_M > 0:
    return R_MAX
  else:
    return gl.load(schedule_ptr)


@gluon.jit
def consumer_tile(schedule_ptr, t, num_n, R_MAX: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr = 1,
                  MASKED_M: gl.constexpr = 0, TILE_M: gl.constexpr = BLOCK_M, HALF_M: gl.constexpr = HALF):
  """Tile t (tile_of's) for consumer H of HALF_M rows: (group, first row of its half, rows of the group in the tile,
  rows of the group in its half, rows to store of its half, column tile)."""
  g, row0, rows, store_rows, ni = tile_of(schedule_ptr, t, num_n, R_MAX, BAND, MASKED_M, TILE_M)
  half_rows = gl.minimum(gl.maximum(rows - H * HALF_M, 0), HALF_M)
  half_store = gl.minimum(gl.maximum(store_rows - H * HALF_M, 0), HALF_M)
  return g, row0 + H * HALF_M, rows, half_rows, half_store, ni


@gluon.jit
def split_schedule(schedule_ptr, num_n, SPLIT: gl.constexpr):
  """(kept, total): the tile loop's tiles [0, kept) are tile_of's, run whole; with SPLIT, where the last round of
  tile_of's `wide` tiles (wide mod programs of them) fits the grid twice over, its tiles run as their column halves,
  tiles [kept, total) (two per tile of the round: split_tile)."""
  wide = gl.load(schedule_ptr) * num_n
  kept = wide
  if SPLIT:
    last = wide % gl.num_programs(0)
    if 2 * last <= gl.num_programs(0):
      kept = wide - last
  return kept, 2 * wide - kept


@gluon.jit
def split_tile(t, kept, SPLIT: gl.constexpr):
  """(tile_of's tile, piece) of tile t of split_schedule's loop: piece -1 for a whole tile (always without SPLIT),
  else its column half (0, 1) of tile kept + (t - kept) // 2. (Gluon tests `piece < 0` at run time even where piece
  is the literal -1: callers branch on `not SPLIT or piece < 0`, which SPLIT = False settles when compiling.)"""
  if SPLIT:
    wide = t
    piece = t - t - 1
    if t >= kept:
      wide = kept + (t - kept) // 2
      piece = (t - kept) % 2
    return wide, piece
  else:
    return t, -1


@gluon.jit
def loader(lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K: gl.constexpr,
           N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
           TRANSPOSE_RHS: gl.constexpr, BAND: gl.constexpr, CTAS: gl.constexpr, rhs_half_desc=None,
           SPLIT: gl.constexpr = False):
  """Per step of each tile holding rows of its group: waits until the consumers released the stage (with CTAS = 2,
  gmm_ws_cluster_kernel's, also the cluster's four on cluster_empty: a wait in CTA 0 only), then fills it
  (load_stage; a tile is CTAS BLOCK_N columns wide). SPLIT (CTAS = 1): over split_schedule's tiles, a half's rhs box
  through rhs_half_desc (rhs_desc's view, boxes BLOCK_N / 2 wide) into the stage's first columns."""
  gl.static_assert(CTAS == 1 or not SPLIT, "clusters run their tiles whole")
  cols: gl.constexpr = CTAS * BLOCK_N
  num_n: gl.constexpr = (N + cols - 1) // cols
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  kept, total = split_schedule(schedule_ptr, num_n, SPLIT)
  step = 0
  for t in range(gl.program_id(0), total, gl.num_programs(0)):
    wide, piece = split_tile(t, kept, SPLIT)
    g, row0, rows, _, ni = tile_of(schedule_ptr, wide, num_n, R_MAX, BAND)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        empty_bar = empty.index(slot)
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty_bar, phase)
        if CTAS == 2:
          mbarrier.wait(cluster_empty.index(slot), phase)
        if not SPLIT or piece < 0:
          load_stage(lhs_desc, rhs_desc, a_bufs, b_bufs, ready.index(slot), slot, g, row0, rows, ni, kk, K, N, cols,
                     BLOCK_K, TRANSPOSE_RHS, CTAS=CTAS)
        else:
          load_stage(lhs_desc, rhs_half_desc, a_bufs, b_bufs, ready.index(slot), slot, g, row0, rows, 2 * ni + piece,
                     kk, K, N, BLOCK_N // 2, BLOCK_K, TRANSPOSE_RHS, COLS=BLOCK_N // 2)
        step += 1


@gluon.jit
def expect_boxes(ready_bar, BASE: gl.constexpr, BOX: gl.constexpr, rows, BOXES: gl.constexpr, BOX_M: gl.constexpr):
  """One expect on ready_bar, of BASE bytes and BOX more per lhs box holding rows of the tile: box j holds its rows
  [j BOX_M, (j + 1) BOX_M), and the tile has rows > 0 (more than BOXES BOX_M fill every box; a box without rows is
  not loaded)."""
  for i in gl.static_range(BOXES):  # One expect fires: the bytes of the BOXES - i boxes holding rows.
    if i == 0:
      mbarrier.expect(ready_bar, BASE + BOXES * BOX, pred=rows > (BOXES - 1) * BOX_M)
    elif i == BOXES - 1:
      mbarrier.expect(ready_bar, BASE + BOX, pred=rows <= BOX_M)
    else:
      mbarrier.expect(ready_bar, BASE + (BOXES - i) * BOX,
                      pred=(rows > (BOXES - 1 - i) * BOX_M) & (rows <= (BOXES - i) * BOX_M))


@gluon.jit
def load_stage(lhs_desc, rhs_desc, a_bufs, b_bufs, ready_bar, slot, g, row0, rows, ni, kk, K: gl.constexpr,
               N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, TRANSPOSE_RHS: gl.constexpr,
               EXTRA_BYTES: gl.constexpr = 0, HALVES: gl.constexpr = 2, CTAS: gl.constexpr = 1,
               COLS: gl.constexpr = 0):
  """The loader's TMA copies of step kk of a tile (group g, its rows from row0, column tile ni) into stage slot,
  counted by ready_bar: the tile's lhs halves of 64 rows (HALVES of them, a_bufs[HALVES * slot + h]) that hold rows
  of the group (a consumer whose half holds none skips it, so no load), the rhs tile (and EXTRA_BYTES the caller
  copies by TMA into the stage). CTAS = 2 (gmm_ws_cluster_kernel, BLOCK_N the cluster tile's columns): each CTA
  expects the bytes it receives, and the lhs halves, the same in both CTAs, come by CTA 0's multicast. COLS > 0: an
  rhs box of COLS = BLOCK_N columns narrower than the stage's buffer (rhs_desc's), into its first columns
  (rhs_stage)."""
  if CTAS == 1:
    half: gl.constexpr = lhs_desc.block_type.nbytes
    base: gl.constexpr = rhs_desc.block_type.nbytes + EXTRA_BYTES
  else:
    half: gl.constexpr = lhs_desc.nbytes_per_cta  # A whole (64, BLOCK_K) half in each CTA.
    base: gl.constexpr = rhs_desc.nbytes_per_cta + EXTRA_BYTES
  expect_boxes(ready_bar, base, half, rows, HALVES, HALF)
  for h in gl.static_range(HALVES):
    has_rows = True if h == 0 else rows > h * HALF  # Half 0 always: loaders call only where rows > 0.
    if CTAS == 1:  # (Triton 3.6's copy takes no multicast argument.)
      _tma_load(lhs_desc, [row0 + h * HALF, kk * BLOCK_K], ready_bar, a_bufs.index(HALVES * slot + h), pred=has_rows)
    else:
      _tma_load(lhs_desc, [row0 + h * HALF, kk * BLOCK_K], ready_bar, a_bufs.index(HALVES * slot + h), pred=has_rows,
                multicast=True)
  if TRANSPOSE_RHS:
    _tma_load(rhs_desc, [g * N + ni * BLOCK_N, kk * BLOCK_K], ready_bar, rhs_stage(b_bufs, slot, True, COLS))
  else:
    _tma_load(rhs_desc, [g * K + kk * BLOCK_K, ni * BLOCK_N], ready_bar, rhs_stage(b_bufs, slot, False, COLS))


@gluon.jit
def rhs_stage(b_bufs, slot, TRANSPOSE_RHS: gl.constexpr, COLS: gl.constexpr = 0):
  """Stage slot's rhs buffer ((BLOCK_K, BLOCK_N), or (BLOCK_N, BLOCK_K) where TRANSPOSE_RHS), or where COLS > 0 the
  subview of its first COLS output columns (the leading COLS rows of the transposed buffer)."""
  b = b_bufs.index(slot)
  if COLS > 0:
    if TRANSPOSE_RHS:
      b = b.slice(0, COLS, dim=0)
    else:
      b = b.slice(0, COLS, dim=1)
  return b


@gluon.jit
def allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr,
             HALVES: gl.constexpr = 2, TRANSPOSE_OUT: gl.constexpr = False):
  """A program's shared memory: S stages of HALVES lhs halves and one rhs tile (the descriptors' boxes), an output
  half per consumer (64 x BLOCK_N, or BLOCK_N x 64 where TRANSPOSE_OUT), and the stages' `ready` (the loader's bytes
  landed) and `empty` (every consumer is done) mbarriers."""
  return allocate_boxes(lhs_desc.dtype, gl.constexpr(lhs_desc.block_type.shape), gl.constexpr(lhs_desc.layout),
                        rhs_desc.dtype, gl.constexpr(rhs_desc.block_type.shape), gl.constexpr(rhs_desc.layout),
                        out_ptr.dtype.element_ty, BLOCK_N, S, OUT_LAYOUT, HALVES, TRANSPOSE_OUT)


@gluon.jit
def allocate_boxes(lhs_dtype: gl.constexpr, LHS_BOX: gl.constexpr, LHS_LAYOUT: gl.constexpr, rhs_dtype: gl.constexpr,
                   RHS_BOX: gl.constexpr, RHS_LAYOUT: gl.constexpr, out_dtype: gl.constexpr, BLOCK_N: gl.constexpr,
                   S: gl.constexpr, OUT_LAYOUT: gl.constexpr, HALVES: gl.constexpr = 2,
                   TRANSPOSE_OUT: gl.constexpr = False):
  """allocate's buffers and barriers for lhs halves of LHS_BOX and rhs tiles of RHS_BOX (lists of two sizes)."""
  a_bufs = gl.allocate_shared_memory(lhs_dtype, [HALVES * S] + LHS_BOX, LHS_LAYOUT)
  b_bufs = gl.allocate_shared_memory(rhs_dtype, [S] + RHS_BOX, RHS_LAYOUT)
  if TRANSPOSE_OUT:
    c_bufs = gl.allocate_shared_memory(out_dtype, [HALVES, BLOCK_N, HALF], OUT_LAYOUT)
  else:
    c_bufs = gl.allocate_shared_memory(out_dtype, [HALVES, HALF, BLOCK_N], OUT_LAYOUT)
  ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=HALVES)  # Every consumer releases a stage.
  return a_bufs, b_bufs, c_bufs, ready, empty


@gluon.jit
def release(empty, cluster_empty, slot, pred, CTAS: gl.constexpr):
  """A consumer is done with stage slot (if pred): its CTA's empty barrier and, on clusters of 2 CTAs (CTAS), CTA 0's
  cluster_empty (gmm_ws_cluster's protocol)."""
  mbarrier.arrive(empty.index(slot), pred=pred)
  if CTAS == 2:
    mbarrier.arrive(cluster_empty.index(slot), pred=pred)


@gluon.jit
def release_stages(ready, empty, step, k_steps, S: gl.constexpr, cluster_empty=None, CTAS: gl.constexpr = 1):
  """A consumer whose half of the tile holds no row: waits for and releases (`release`) the k_steps stages from
  `step` on, so that its phases stay in step with the other consumer's."""
  for kk in range(k_steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    release(empty, cluster_empty, slot, True, CTAS)


@gluon.jit
def store_half(out_ptr, out_desc, c_buf, acc, row, col, rows, WIDTH: gl.constexpr, BLOCK_N: gl.constexpr,
               OUT_LAYOUT: gl.constexpr, TRANSPOSE: gl.constexpr = False, HALF_M: gl.constexpr = HALF):
  """acc (HALF_M, BLOCK_N), or its transpose where TRANSPOSE, into out (.., WIDTH) at [row, col], rows [row, row +
  rows) of it at most, through c_buf (HALF_M, BLOCK_N), or (BLOCK_N, HALF_M), and a TMA store: out_desc's (over out,
  box c_buf's shape) where the box holds rows of out only, else a descriptor ending at its last row, which clips the
  store (no tile writes a row of another); columns past WIDTH are clipped by the view itself."""
  box_rows: gl.constexpr = BLOCK_N if TRANSPOSE else HALF_M
  box_cols: gl.constexpr = HALF_M if TRANSPOSE else BLOCK_N
  tma.store_wait(pendings=0)  # This consumer's previous TMA store has read c_buf (and its descriptor).
  if TRANSPOSE:
    c_buf.permute((1, 0)).store(acc.to(out_ptr.dtype.element_ty))
  else:
    c_buf.store(acc.to(out_ptr.dtype.element_ty))
  fence_async_shared()
  if rows >= box_rows:
    _tma_store(out_desc, [row, col], c_buf)
  else:
    clipped = tma.make_tensor_descriptor(out_ptr, [row + rows, WIDTH], [WIDTH, 1], [box_rows, box_cols], OUT_LAYOUT)
    _tma_store(clipped, [row, col], c_buf)


@gluon.jit
def consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K: gl.constexpr,
             N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
             TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr,
             CTAS: gl.constexpr, SPLIT: gl.constexpr = False):
  """Consumer H: rows [64 H, 64 H + 64) of each tile, a 64 x BLOCK_N fp32 accumulator per CTA. CTAS = 2
  (gmm_ws_cluster_kernel): a tile is 2 BLOCK_N columns wide, its accumulator and output halves cluster-level tensors
  split by columns (each CTA BLOCK_N), and every stage is also released on the cluster's cluster_empty (unused with
  CTAS = 1). SPLIT (CTAS = 1): over split_schedule's tiles, a column half through a 64 x BLOCK_N / 2 accumulator,
  the stages' and the output buffer's first BLOCK_N / 2 columns and a descriptor of half-wide boxes."""
  cols: gl.constexpr = CTAS * BLOCK_N
  NARROW: gl.constexpr = BLOCK_N // 2
  if CTAS == 1:
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
  else:
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16], cga_layout=[[0, 1]])
  num_n: gl.constexpr = (N + cols - 1) // cols
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, cols], OUT_LAYOUT)
  if SPLIT:
    half_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, NARROW, 16])
    out_half_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, NARROW], OUT_LAYOUT)
  kept, total = split_schedule(schedule_ptr, num_n, SPLIT)
  step = 0
  for t in range(gl.program_id(0), total, gl.num_programs(0)):
    wide, piece = split_tile(t, kept, SPLIT)
    _, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, wide, num_n, R_MAX, H, BAND)
    if not SPLIT or piece < 0:
      acc = gl.zeros((HALF, cols), dtype=gl.float32, layout=acc_layout)
      acc = tile_product(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, rows, half_rows, k_steps, S,
                         TRANSPOSE_RHS, H, CTAS)
      if half_store > 0:
        store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * cols, half_store, N, cols, OUT_LAYOUT)
    else:
      acc_half = gl.zeros((HALF, NARROW), dtype=gl.float32, layout=half_layout)
      acc_half = tile_product(a_bufs, b_bufs, ready, empty, cluster_empty, acc_half, step, rows, half_rows, k_steps,
                              S, TRANSPOSE_RHS, H, CTAS, COLS=NARROW)
      if half_store > 0:
        store_half(out_ptr, out_half_desc, c_bufs.index(H).slice(0, NARROW, dim=1), acc_half, row,
                   ni * BLOCK_N + piece * NARROW, half_store, N, NARROW, OUT_LAYOUT)
    if rows > 0:
      step += k_steps
  tma.store_wait(pendings=0)


@gluon.jit
def tile_product(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, rows, half_rows, k_steps,
                 S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, H: gl.constexpr, CTAS: gl.constexpr,
                 COLS: gl.constexpr = 0):
  """Consumer H's K loop of a tile whose group has `rows` rows in it, `half_rows` in the consumer's half: acc (zeros)
  plus the products of the k_steps stages from `step` on, each stage released once read (`release`); a half
  without rows of a tile with rows waits for and releases the same stages (release_stages), so that both consumers'
  phases stay in step. COLS > 0: acc (64, COLS), the product of the stages' first COLS columns (rhs_stage)."""
  if half_rows > 0:
    for kk in range(k_steps):
      slot = (step + kk) % S
      mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
      b = rhs_stage(b_bufs, slot, TRANSPOSE_RHS, COLS)
      if TRANSPOSE_RHS:
        b = b.permute((1, 0))
      acc = warpgroup_mma(a_bufs.index(2 * slot + H), b, acc, is_async=True)
      acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
      release(empty, cluster_empty, (step + kk + S - 1) % S, kk > 0, CTAS)  # The previous step's stage.
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    release(empty, cluster_empty, (step + k_steps - 1) % S, True, CTAS)
  elif rows > 0:
    release_stages(ready, empty, step, k_steps, S, cluster_empty, CTAS)
  return acc


@gluon.jit
def gmm_ws_kernel(lhs_desc, rhs_desc, rhs_half_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                  R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                  TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr, SPLIT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, BLOCK_K); rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, BLOCK_N), or
  (G * N, K), box (BLOCK_N, BLOCK_K); out (M, N) through out_ptr and descriptors made here (box (64, BLOCK_N),
  shared-memory layout OUT_LAYOUT); BAND: tile_of's order. SPLIT: the last round's tiles as column halves
  (split_schedule), their rhs boxes through rhs_half_desc (rhs_desc's view, boxes BLOCK_N / 2 wide, of the same
  shared-memory layout; without SPLIT a placeholder, never read)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N,
                  BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND, 1, SPLIT)),
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N,
                  BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND, 1, SPLIT)),
      (loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N, BLOCK_K,
                S, TRANSPOSE_RHS, BAND, 1, rhs_half_desc, SPLIT)),
  ], [4, 1], [232, 40])


def shared_layout(block_shape, dtype_name, cga_layout=None):
  """The shared-memory layout of a (rows, columns) tile of dtype_name (a numpy name: "bfloat16", "float16",
  "float32", "float8_e4m3fn") in gmm_ws_kernel, gmm_ws_cluster_kernel or gmm_fp8_ws_kernel: what their host
  descriptors and OUT_LAYOUT declare. cga_layout: for a cluster-level box, how the cluster's CTAs share it
  (gmm_ws_cluster.SHARED, ROW_SPLIT or COL_SPLIT; Triton >= 3.7); None outside clusters."""
  dtype = {"bfloat16": gl.bfloat16, "float16": gl.float16, "float32": gl.float32,
           "float8_e4m3fn": gl.float8e4nv}[dtype_name]
  cluster = {} if cga_layout is None else {"cga_layout": cga_layout}
  return gl.NVMMASharedLayout.get_default_for(list(block_shape), dtype, **cluster)
