"""tgmm_ws_kernel: the Hopper (sm_90) tgmm of 2-byte floats (gmm's weight gradient), warp-specialised in Gluon.

out[g] (K, N) = lhs[rows of g].T @ rhs[rows of g]: lhs (M, K), rhs (M, N), out (G, K, N) viewed (G * K, N).

gmm_ws.py's structure: one program per SM walks output tiles of 128 x BLOCK_N: t = program id, + programs, ...; tile
t is group t // (KT * NT), then its K tile, then its N tile (a group's tiles are consecutive: its rows stay in L2). A
TMA loader warp fills S shared-memory stages; two consumer warpgroups, consumer H owning K rows [64 H, 64 H + 64) of
the tile, reduce the group's rows BLOCK_K at a time with the lhs half read transposed from shared memory (wgmma's
MN-major operand). A step starts at the group's first row plus a multiple of BLOCK_K (TMA reads at any row), so only
a group's last step can hold rows past its end (the next group's, or rows past M): the loader copies that step
through descriptors it makes on the device, ending at the group's end, so TMA writes zeros for those rows of both
operands and they add nothing, whatever the rows hold (inf and NaN included). A tile of an empty group stores zeros
without loading.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_ws import HALF, _tma_load, allocate, release, release_stages, store_half

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
def _load_step(lhs_desc, rhs_desc, a_bufs, b_bufs, ready, empty, step, m0, ki, ni, rows, BLOCK_N: gl.constexpr,
               S: gl.constexpr):
  """Waits until both consumers released stage step % S, then copies lhs rows [m0, m0 + BLOCK_K) (its halves of the
  tile's K rows; the bottom one only if the tile has K rows there) and those rows of rhs's column tile into it."""
  slot = step % S
  both = rows > HALF  # Else the bottom half holds no K row: its consumer skips it, so no load.
  half_bytes: gl.constexpr = lhs_desc.block_type.nbytes
  mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
  ready_bar = ready.index(slot)
  mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + 2 * half_bytes, pred=both)
  mbarrier.expect(ready_bar, rhs_desc.block_type.nbytes + half_bytes, pred=rows <= HALF)
  _tma_load(lhs_desc, [m0, ki * BLOCK_M], ready_bar, a_bufs.index(2 * slot))
  _tma_load(lhs_desc, [m0, ki * BLOCK_M + HALF], ready_bar, a_bufs.index(2 * slot + 1), pred=both)
  _tma_load(rhs_desc, [m0, ni * BLOCK_N], ready_bar, b_bufs.index(slot))


@gluon.jit
def _loader(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G: gl.constexpr,
            K: gl.constexpr, N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr):
  """Each tile's steps into the stages (_load_step). A last step holding rows past the group's end goes through
  descriptors over lhs and rhs that end there, made before its wait for a free stage. They overwrite the previous
  such step's (one scratch copy each per program), so first its copies must have landed: certain once its stage was
  refilled (the refill waited for the consumers' release), else waited for on its `ready` barrier."""
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  step = 0
  tail = -2 * S  # The step of the previous copy through descriptors made here (none yet: far enough back).
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    _, ki, ni, start, end, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K)
    past_end = (steps > 0) & ((end - start) % BLOCK_K != 0)  # The last step holds rows past the end.
    whole = steps - past_end.to(gl.int32)
    for kk in range(whole):
      _load_step(lhs_desc, rhs_desc, a_bufs, b_bufs, ready, empty, step + kk, start + kk * BLOCK_K, ki, ni, rows,
                 BLOCK_N, S)
    if past_end:
      mbarrier.wait(ready.index(tail % S), (tail // S) & 1, pred=step + whole - tail <= S)
      tail = step + whole
      lhs_end = tma.make_tensor_descriptor(lhs_ptr, [end, K], [K, 1], lhs_desc.block_type.shape, lhs_desc.layout)
      rhs_end = tma.make_tensor_descriptor(rhs_ptr, [end, N], [N, 1], rhs_desc.block_type.shape, rhs_desc.layout)
      _load_step(lhs_end, rhs_end, a_bufs, b_bufs, ready, empty, tail, start + whole * BLOCK_K, ki, ni, rows, BLOCK_N,
                 S)
    step += steps


@gluon.jit
def _consumer(bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G: gl.constexpr, K: gl.constexpr,
              N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  """Consumer H: K rows [64 H, 64 H + 64) of each tile, a 64 x BLOCK_N fp32 accumulator."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_tiles: gl.constexpr = G * ((K + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
  out_desc = tma.make_tensor_descriptor(out_ptr, [G * K, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
    g, ki, ni, start, end, steps, rows = _tile(bounds_ptr, t, K, N, BLOCK_N, BLOCK_K)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    if (half_rows > 0) & (steps > 0):
      for kk in range(steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        acc = warpgroup_mma(a_bufs.index(2 * slot + H).permute((1, 0)), b_bufs.index(slot), acc, is_async=True)
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
  tma.store_wait(pendings=0)


@gluon.jit
def tgmm_ws_kernel(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, bounds_ptr, out_ptr, G: gl.constexpr, K: gl.constexpr,
                   N: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                   OUT_LAYOUT: gl.constexpr):
  """lhs (M, K) at lhs_ptr and through lhs_desc, box (BLOCK_K, 64); rhs (M, N) at rhs_ptr and through rhs_desc, box
  (BLOCK_K, BLOCK_N) (the loader makes descriptors ending at a group's end from the pointers); bounds (G + 1,) int32,
  sanitised; out (G, K, N) through out_ptr and descriptors made here over its (G * K, N) view (box (64,
  BLOCK_N), shared-memory layout OUT_LAYOUT)."""
  a_bufs, b_bufs, c_bufs, ready, empty = allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K, S,
                   OUT_LAYOUT, 0)),
      (_consumer, (bounds_ptr, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, G, K, N, BLOCK_N, BLOCK_K, S,
                   OUT_LAYOUT, 1)),
      (_loader, (lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, bounds_ptr, a_bufs, b_bufs, ready, empty, G, K, N, BLOCK_N,
                 BLOCK_K, S)),
  ], [4, 1], [232, 40])
