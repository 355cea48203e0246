"""tgmm_ws_kernel: the Hopper (sm_90) tgmm of 2-byte floats (gmm's weight gradient), warp-specialised in Gluon.

out[g] (K, N) = lhs[rows of g].T @ rhs[rows of g]: lhs (M, K), rhs (M, N), out (G, K, N) viewed (G * K, N).

gmm_ws.py's structure: one program per SM walks output tiles of 128 x BLOCK_N: t = program id, + programs, ...; tile
t is group t // (KT * NT), then its K tile, then its N tile (a group's tiles are consecutive: its rows stay in L2). A
TMA loader warp fills S shared-memory stages; two consumer warpgroups, consumer H owning K rows [64 H, 64 H + 64) of
the tile, reduce the group's rows BLOCK_K at a time with the lhs half read transposed from shared memory (wgmma's
MN-major operand). A step starts at the group's first row plus a multiple of BLOCK_K (TMA reads at any row), so only
a group's last step can hold rows past its end (the next group's, or rows past M, which TMA reads as zeros). There,
before their wgmmas, the consumers zero those rows in shared memory: each its own lhs half and its half of the rhs
tile's columns (consumer 0 all of them when consumer 1 has no K rows in the tile), then they wait for each other on
an mbarrier, since each reads the whole rhs tile. So rows outside a group add nothing, whatever they hold (inf and
NaN included). A tile of an empty group stores zeros without loading.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from jgmm.triton_kernels.gmm_ws import HALF, _tma_load, allocate, release, release_stages, store_half

# A barrier of the partition's warps: Triton 3.6's name, renamed after it.
partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
BLOCK_M = gl.constexpr(128)  # K rows per tile: two consumers of 64.
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch: 12 warps x 168 fit an SM; the consumers then take 232.


@gluon.jit
def group_tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr):
  """(group, K tile, N tile, the group's first row, its end) of output tile t of 128 x BLOCK_N (group-major, then K
  tiles, then N tiles; this kernel's and tgmm_fp8_ws's order)."""
  num_k: gl.constexpr = (K + BLOCK_M - 1) // BLOCK_M
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  g = t // (num_k * num_n)
  return g, t % (num_k * num_n) // num_n, t % num_n, gl.load(bounds_ptr + g), gl.load(bounds_ptr + g + 1)


@gluon.jit
def _tile(bounds_ptr, t, K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
  """group_tile's (group, K tile, N tile, first row, end) and the group's steps and the K rows in tile t."""
  g, ki, ni, start, end = group_tile(bounds_ptr, t, K, N, BLOCK_N)
  return g, ki, ni, start, end, (end - start + BLOCK_K - 1) // BLOCK_K, gl.minimum(K - ki * BLOCK_M, BLOCK_M)


@gluon.jit
def _loader(lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G: gl.constexpr, K: gl.constexpr,
            N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr):
  """Per step of each tile: waits until both consumers released the stage, then copies the step's lhs halves (the
  bottom one only if the tile has K rows there) and rhs rows into it."""
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  half_bytes: gl.constexpr = lhs_desc.block_type.nbytes
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    _, ki, ni, start, _, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K)
    both = rows > HALF  # Else the bottom half holds no K row: its consumer skips it, so no load.
    for kk in range(steps):
      slot = step % S
      m0 = start + kk * BLOCK_K
      mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
      ready_bar = ready.index(slot)
      mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + 2 * half_bytes, pred=both)
      mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + half_bytes, pred=rows <= HALF)
      _tma_load(lhs_desc, [m0, ki * BLOCK_M], ready_bar, a_bufs.index(2 * slot))
      _tma_load(lhs_desc, [m0, ki * BLOCK_M + HALF], ready_bar, a_bufs.index(2 * slot + 1), pred=both)
      _tma_load(rhs_desc, [m0, ni * BLOCK_N], ready_bar, b_bufs.index(slot))
      step += 1


@gluon.jit
def _zero_rows_from(buf, first, ROWS: gl.constexpr, COLS: gl.constexpr):
  """Zeroes rows [first, ROWS) of buf (ROWS, COLS) in shared memory (one warpgroup), 16 x 64 elements at a time
  (slices of whole swizzle periods), skipping those wholly before row `first`."""
  gl.static_assert(ROWS % 16 == 0)
  layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16 x 64
  for i in gl.static_range(ROWS // 16):
    if 16 * i + 16 > first:
      keep = gl.expand_dims(16 * i + gl.arange(0, 16, layout=gl.SliceLayout(1, layout)) < first, 1)
      for j in gl.static_range(COLS // 64):
        part = buf.slice(16 * i, 16, dim=0).slice(64 * j, 64, dim=1)
        values = part.load(layout)
        part.store(gl.where(keep, values, gl.zeros_like(values)))


@gluon.jit
def _zero_rows_past(a_buf, b_buf, m0, end, both, BLOCK_K: gl.constexpr, BLOCK_N: gl.constexpr, H: gl.constexpr):
  """Zeroes the rows at or past `end` (the step's rows run from m0) of consumer H's lhs half a_buf (BLOCK_K, 64)
  and of its columns of the stage's rhs tile b_buf (BLOCK_K, BLOCK_N): half of them if both consumers work on the
  tile, else all."""
  _zero_rows_from(a_buf, end - m0, BLOCK_K, HALF)
  if both:
    _zero_rows_from(b_buf.slice(H * (BLOCK_N // 2), BLOCK_N // 2, dim=1), end - m0, BLOCK_K, BLOCK_N // 2)
  else:
    _zero_rows_from(b_buf, end - m0, BLOCK_K, BLOCK_N)
  fence_async_shared()  # The wgmmas read both through the async proxy.
  partition_barrier()  # Every warp of the warpgroup has written its part.


@gluon.jit
def _consumer(bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, zeroed, G: gl.constexpr,
              K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  """Consumer H: K rows [64 H, 64 H + 64) of each tile, a 64 x BLOCK_N fp32 accumulator."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  step = 0
  meetings = 0  # The consumers' waits for each other on `zeroed` so far (the same count in both).
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    both = rows > HALF
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    if (half_rows > 0) & (steps > 0):
      for kk in range(steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        a = a_bufs.index(2 * slot + H)
        m0 = start + kk * BLOCK_K
        if m0 + BLOCK_K > end:
          _zero_rows_past(a, b_bufs.index(slot), m0, end, both, BLOCK_K, BLOCK_N, H)
          mbarrier.arrive(zeroed, pred=both)  # This consumer's part of the rhs tile is zeroed ...
          mbarrier.wait(zeroed, meetings & 1, pred=both)  # ... and the other's.
        acc = warpgroup_mma(a.permute((1, 0)), b_bufs.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        release(empty, empty, (step + kk + S - 1) % S, kk > 0, 1)  # The previous step's stage.
      acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
      release(empty, empty, (step + steps - 1) % S, True, 1)
    elif steps > 0:  # The other half has K rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, steps, S)
    step += steps
    meetings += (both & (steps > 0) & ((end - start) % BLOCK_K != 0)).to(gl.int32)
    if half_rows > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, g * K + ki * BLOCK_M + H * HALF, ni * BLOCK_N, half_rows,
                 N, BLOCK_N, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_ws_kernel(lhs_desc, rhs_desc, bounds_ptr, out_ptr, G: gl.constexpr, K: gl.constexpr, N: gl.constexpr,
                   BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (BLOCK_K, 64); rhs_desc over rhs (M, N), box (BLOCK_K, BLOCK_N); bounds (G + 1,)
  int32, sanitised; out (G, K, N) through out_ptr and descriptors made here over its (G * K, N) view (box (64,
  BLOCK_N), shared-memory layout OUT_LAYOUT)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  zeroed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
  mbarrier.init(zeroed, count=2)  # Each consumer, after zeroing its part of a step's rows past a group's end.
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, zeroed, G, K, N, BLOCK_N, BLOCK_K, S,
                   OUT_LAYOUT, 0)),
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, zeroed, G, K, N, BLOCK_N, BLOCK_K,
                   S, OUT_LAYOUT, 1)),
      (_loader, (lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K, S)),
  ], [4, 1], [232, 40])
