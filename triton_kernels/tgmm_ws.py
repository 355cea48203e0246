"""tgmm_ws_kernel: the Hopper (sm_90) tgmm of 2-byte floats (gmm's weight gradient), warp-specialised in Gluon.

out[g] (K, N) = lhs[rows of g].T @ rhs[rows of g]: lhs (M, K), rhs (M, N), out (G, K, N) viewed (G * K, N).

gmm_ws.py's structure: one program per SM walks output tiles of 128 x BLOCK_N: t = program id, + programs, ...; tile
t is group t // (KT * NT), then its K and N tiles in bands of BAND K tiles (group_tile; a group's tiles are
consecutive: its rows stay in L2, and programs running at once share the rhs columns of a band). A
TMA loader warp fills S shared-memory stages; two consumer warpgroups, consumer H owning K rows [64 H, 64 H + 64) of
the tile, reduce the group's rows BLOCK_K at a time with the lhs half read transposed from shared memory (wgmma's
MN-major operand). Step s reads BLOCK_K rows from the group's first row + s * BLOCK_K (TMA reads at any row), or
from the groups' end (bounds[G]) - BLOCK_K where that is earlier, so that no step reads a row outside the groups
(before bounds[0], or from bounds[G] on: they may hold anything); rows before 0 or past M read as zeros. The one
exception: where bounds[0] > 0 and all groups together hold fewer than BLOCK_K rows, steps start at bounds[0] and
read past bounds[G]. Each consumer zeroes its lhs half's rows outside the step's own (rows of other groups or of the
previous step) before its wgmma, so they add nothing; their rhs rows still meet those zeros, so an inf or NaN in
rhs in another group's rows within BLOCK_K rows of a group makes that group's gradient NaN (tgmm_kernel never reads
them). A tile of an empty group stores zeros without loading.

With BIAS_GRAD, also dbias (G, N) float32: the column sums of rhs over each group's rows (gmm's bias gradient).
Consumer 0 adds up the rhs tile of each step of the tiles of K tile 0 in its registers while that step's wgmma runs
(rows outside the step's own selected out, so they add nothing whatever they hold) and stores them with the tile.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from jgmm.triton_kernels.common import tile_coords
from jgmm.triton_kernels.gmm_ws import HALF, _tma_load, allocate, release, release_stages, store_half

# A barrier of the partition's warps: Triton 3.6's name, renamed after it.
_partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
BLOCK_M = gl.constexpr(128)  # K rows per tile: two consumers of 64.
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch: 12 warps x 168 fit an SM; the consumers then take 232.


@gluon.jit
def group_tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BAND: gl.constexpr = 1):
  """(group, K tile, N tile, the group's first row, its end) of output tile t of 128 x BLOCK_N (this kernel's and
  tgmm_fp8_ws's order): group-major, then in bands of BAND K tiles, the K tile fastest inside a band
  (common.tile_coords' order over the group's K tiles; BAND 1: row-major, the N tile fastest). A wave of programs
  then reads the rhs columns of a few N tiles and the lhs columns of a band, where row-major reads all of the group's
  rhs columns (on an H100, bands of 8 read 2.2-2.9x fewer DRAM bytes on the bench's compute-bound weight gradients:
  docs/perf-notes.md, Session 39)."""
  num_k: gl.constexpr = (K + BLOCK_M - 1) // BLOCK_M
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  g = t // (num_k * num_n)
  ki, ni = tile_coords(t - g * (num_k * num_n), num_k, num_n, BAND)
  return g, ki, ni, gl.load(bounds_ptr + g), gl.load(bounds_ptr + g + 1)


@gluon.jit
def _tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
          BAND: gl.constexpr):
  """group_tile's (group, K tile, N tile, first row, end) and the group's steps and the K rows in tile t."""
  g, ki, ni, start, end = group_tile(bounds_ptr, t, K, N, BLOCK_N, BAND)
  return g, ki, ni, start, end, (end - start + BLOCK_K - 1) // BLOCK_K, gl.minimum(K - ki * BLOCK_M, BLOCK_M)


@gluon.jit
def _last_start(bounds_ptr, G: gl.constexpr, BLOCK_K: gl.constexpr):
  """The last row a step may start at: BLOCK_K rows before the groups' end (bounds[G]), or bounds[0] if later and > 0
  (rows before it are outside the groups; before row 0 they read as zeros)."""
  first = gl.load(bounds_ptr)
  return gl.maximum(gl.load(bounds_ptr + G) - BLOCK_K, first - BLOCK_K * (first == 0).to(gl.int32))


@gluon.jit
def _loader(lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G: gl.constexpr, K: gl.constexpr,
            N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, BAND: gl.constexpr):
  """Per step of each tile: waits until both consumers released the stage, then copies the step's lhs halves (the
  bottom one only if the tile has K rows there) and rhs rows into it."""
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  half_bytes: gl.constexpr = lhs_desc.block_type.nbytes
  last_start = _last_start(bounds_ptr, G, BLOCK_K)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    _, ki, ni, start, _, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K, BAND)
    both = rows > HALF  # Else the bottom half holds no K row: its consumer skips it, so no load.
    for kk in range(steps):
      slot = step % S
      m0 = gl.minimum(start + kk * BLOCK_K, last_start)
      mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
      ready_bar = ready.index(slot)
      mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + 2 * half_bytes, pred=both)
      mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + half_bytes, pred=rows <= HALF)
      _tma_load(lhs_desc, [m0, ki * BLOCK_M], ready_bar, a_bufs.index(2 * slot))
      _tma_load(lhs_desc, [m0, ki * BLOCK_M + HALF], ready_bar, a_bufs.index(2 * slot + 1), pred=both)
      _tma_load(rhs_desc, [m0, ni * BLOCK_N], ready_bar, b_bufs.index(slot))
      step += 1


@gluon.jit
def keep_only(a_buf, keep, layout: gl.constexpr):
  """Zeroes a_buf's elements where keep (broadcast to a_buf's shape in `layout`) is false, before a wgmma reads it
  (this kernel's and tgmm_fp8_ws's zeroing of rows outside a group)."""
  a = a_buf.load(layout)
  a_buf.store(gl.where(keep, a, gl.zeros_like(a)))
  fence_async_shared()  # The wgmma reads a_buf through the async proxy.
  _partition_barrier()  # Every warp of the warpgroup has written its part.


@gluon.jit
def _rows_in(m0, lo, end, ROWS: gl.constexpr, layout: gl.constexpr):
  """(ROWS, 1) in `layout`: whether rows m0 .. m0 + ROWS - 1 lie in [lo, end)."""
  rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
  return gl.expand_dims((rows >= lo) & (rows < end), 1)


@gluon.jit
def _zero_rows_outside(a_buf, m0, lo, end, BLOCK_K: gl.constexpr):
  """Zeroes the rows of a_buf (BLOCK_K rows of lhs from row m0 x 64 of K) outside [lo, end)."""
  layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
  keep_only(a_buf, _rows_in(m0, lo, end, BLOCK_K, layout), layout)


@gluon.jit
def _column_sums(b_buf, m0, lo, end, BLOCK_K: gl.constexpr, BLOCK_N: gl.constexpr, LAYOUT: gl.constexpr):
  """Float32 sums over the rows in [lo, end) of the rhs tile b_buf (BLOCK_K rows from row m0, BLOCK_N columns), by
  one warpgroup in LAYOUT (a thread holds whole columns: no reduction across threads), 16 rows at a time."""
  sums = gl.zeros((BLOCK_N,), gl.float32, gl.SliceLayout(0, LAYOUT))
  for i in gl.static_range(BLOCK_K // 16):
    keep = _rows_in(m0 + 16 * i, lo, end, 16, LAYOUT)
    values = b_buf.slice(16 * i, 16, dim=0).load(LAYOUT).to(gl.float32)
    sums += gl.sum(gl.where(keep, values, gl.zeros_like(values)), axis=0)
  return sums


@gluon.jit
def _consumer(bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G: gl.constexpr,
              K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, BIAS_GRAD: gl.constexpr, BAND: gl.constexpr, H: gl.constexpr):
  """Consumer H: K rows [64 H, 64 H + 64) of each tile, a 64 x BLOCK_N fp32 accumulator; with BIAS_GRAD, consumer
  0 also the column sums of the tiles of K tile 0 (_column_sums, into dbias (G, N))."""
  sums_layout: gl.constexpr = gl.BlockedLayout([16, BLOCK_N // 128], [1, 32], [1, 4], [1, 0])
  sums_here: gl.constexpr = BIAS_GRAD and H == 0
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  last_start = _last_start(bounds_ptr, G, BLOCK_K)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K, BAND)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    sums = gl.zeros((BLOCK_N,), gl.float32, gl.SliceLayout(0, sums_layout))
    if (half_rows > 0) & (steps > 0):
      for kk in range(steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        a = a_bufs.index(2 * slot + H)
        lo = start + kk * BLOCK_K  # The step's own rows: [lo, min(lo + BLOCK_K, end)), read from row m0.
        m0 = gl.minimum(lo, last_start)
        if (m0 < lo) | (m0 + BLOCK_K > end):
          _zero_rows_outside(a, m0, lo, end, BLOCK_K)
        acc = warpgroup_mma(a.permute((1, 0)), b_bufs.index(slot), acc, is_async=True)
        if sums_here:
          if ki == 0:
            sums += _column_sums(b_bufs.index(slot), m0, lo, end, BLOCK_K, BLOCK_N, sums_layout)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        release(empty, empty, (step + kk + S - 1) % S, kk > 0, 1)  # The previous step's stage.
      acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
      release(empty, empty, (step + steps - 1) % S, True, 1)
    elif steps > 0:  # The other half has K rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, steps, S)
    step += steps
    if half_rows > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, g * K + ki * BLOCK_M + H * HALF, ni * BLOCK_N, half_rows,
                 N, BLOCK_N, OUT_LAYOUT)
    if sums_here:
      if ki == 0:
        cols = ni * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, sums_layout))
        gl.store(dbias_ptr + g.to(gl.int64) * N + cols, sums, mask=cols < N)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_ws_kernel(lhs_desc, rhs_desc, bounds_ptr, out_ptr, dbias_ptr, G: gl.constexpr, K: gl.constexpr,
                   N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                   OUT_LAYOUT: gl.constexpr, BIAS_GRAD: gl.constexpr, BAND: gl.constexpr):
  """lhs_desc over lhs (M, K), box (BLOCK_K, 64); rhs_desc over rhs (M, N), box (BLOCK_K, BLOCK_N); bounds (G + 1,)
  int32, sanitised; out (G, K, N) through out_ptr and descriptors made here over its (G * K, N) view (box (64,
  BLOCK_N), shared-memory layout OUT_LAYOUT); dbias (G, N) float32 with BIAS_GRAD (else never touched)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K,
                   S, OUT_LAYOUT, BIAS_GRAD, BAND, 0)),
      (_consumer, (bounds_ptr, out_ptr, dbias_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K,
                   S, OUT_LAYOUT, BIAS_GRAD, BAND, 1)),
      (_loader, (lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K, S, BAND)),
  ], [4, 1], [232, 40])
