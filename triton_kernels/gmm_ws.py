"""gmm_ws_kernel: the Hopper (sm_90) gmm forward, warp-specialised, written in Gluon (Triton's tile-level language).

out rows of group g = lhs rows of g @ rhs[g]: lhs (M, K), rhs (G, K, N) or (G, N, K) with TRANSPOSE_RHS, out (M, N),
all 2-byte floats. No bias, activation or accumulation (jgmm's gmm_kernel covers those).

Persistent: one program per SM walks tiles t = program id, + programs, ...; a tile is one row tile (128 rows of
the schedule, below) x one column tile (BLOCK_N columns), in bands of GROUP_M row tiles, the row tile fastest. Per program, three partitions:
- a loader warp: per reduction step, TMA copies of lhs rows [row0, row0 + 128) (the bottom 64 only if they hold a row
  of the group) and the rhs tile of the tile's group into one of S shared-memory stages (mbarriers: `ready` when the
  bytes landed, `empty` when both consumers are done);
- two consumer warpgroups: consumer H owns rows [64 H, 64 H + 64) of the tile (a 64 x BLOCK_N fp32 accumulator,
  async wgmma). A consumer whose half holds no row of the group skips its MMAs, so the work pads to 64 rows while
  the rhs tile is read once per 128. A half goes out through shared memory and a TMA store; for a partial half (a
  group's last rows) through a descriptor made on the device that ends at its last row, which clips the store, so
  no tile writes a row of another.

schedule (1 + 4 R_MAX,) int32, from jgmm.backend_triton: [R, then per row tile r < R_MAX: group, first row, rows of
the group in it (0: a tile of rows outside every group, zeros to store), rows to store]; only r < R are used.
The rhs descriptor views rhs as (G * K, N) (K a multiple of BLOCK_K, so a step never reads another group's rows)
or, transposed, (G * N, K) (rows past the group's N only feed columns that are never stored).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

# TMA copies: Triton 3.6 names, renamed after it (async_load / async_store; the old names then raise).
_tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)
_tma_store = getattr(tma, "async_store", tma.async_copy_shared_to_global)

HALF = gl.constexpr(64)  # Rows per consumer warpgroup (the m64 of wgmma); a tile has 2 or 3 consumers.
NUM_WARPS = 4  # The default partition (consumer 0).
# Per consumer count: registers per thread at launch (all warps x them fit an SM's 64K), then per consumer thread
# and per loader thread once the partitions start (the loader's warpgroup holds idle padding warps).
REGISTERS = {2: (168, 232, 40), 3: (128, 160, 24)}


@gluon.jit
def _tile(schedule_ptr, t, num_n, R_MAX: gl.constexpr, GROUP_M: gl.constexpr):
  """(group, first row, rows of the group, rows to store, column tile) of tile t. L2-friendly order, as
  common.tile_coords: bands of GROUP_M row tiles, the row tile fastest inside a band."""
  per_band = GROUP_M * num_n
  band = t // per_band
  band_rows = gl.minimum(gl.load(schedule_ptr) - band * GROUP_M, GROUP_M)
  within = t - band * per_band
  r = band * GROUP_M + within % band_rows
  return (gl.load(schedule_ptr + 1 + r), gl.load(schedule_ptr + 1 + R_MAX + r),
          gl.load(schedule_ptr + 1 + 2 * R_MAX + r), gl.load(schedule_ptr + 1 + 3 * R_MAX + r), within // band_rows)


@gluon.jit
def _loader(lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K: gl.constexpr, N: gl.constexpr,
            R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
            TRANSPOSE_RHS: gl.constexpr, GROUP_M: gl.constexpr, C: gl.constexpr):
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = _tile(schedule_ptr, t, num_n, R_MAX, GROUP_M)
    if rows > 0:
      parts = gl.minimum((rows + HALF - 1) // HALF, C)  # 64-row parts holding a row of the group: the others' loads
      for kk in range(k_steps):                          # and MMAs are skipped.
        slot = step % S
        mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
        for c in gl.static_range(1, C + 1):
          mbarrier.expect(ready.index(slot), rhs_desc.block_type.nbytes + c * lhs_desc.block_type.nbytes,
                          pred=parts == c)
        for h in gl.static_range(C):
          _tma_load(lhs_desc, [row0 + h * HALF, kk * BLOCK_K], ready.index(slot), a_bufs.index(C * slot + h),
                    pred=h < parts)
        if TRANSPOSE_RHS:
          _tma_load(rhs_desc, [g * N + ni * BLOCK_N, kk * BLOCK_K], ready.index(slot), b_bufs.index(slot))
        else:
          _tma_load(rhs_desc, [g * K + kk * BLOCK_K, ni * BLOCK_N], ready.index(slot), b_bufs.index(slot))
        step += 1


@gluon.jit
def _store_half(desc, row, col, c_buf, acc):
  """One consumer's (64, BLOCK_N / 2) piece of its accumulator to out at [row, col] through c_buf and a TMA store."""
  tma.store_wait(pendings=0)  # The previous TMA store from c_buf has read it (and its descriptor).
  c_buf.store(acc.to(c_buf.dtype))
  fence_async_shared()
  _tma_store(desc, [row, col], c_buf)


@gluon.jit
def _consumer(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K: gl.constexpr,
              N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, GROUP_M: gl.constexpr, C: gl.constexpr,
              H: gl.constexpr):
  SUB: gl.constexpr = BLOCK_N // 2  # Columns per accumulator: two per consumer, so one (64, SUB) buffer stores both.
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, SUB, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, SUB], OUT_LAYOUT)
  c_buf = c_bufs.index(H)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row0, rows, store_rows, ni = _tile(schedule_ptr, t, num_n, R_MAX, GROUP_M)
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    half_store = gl.minimum(gl.maximum(store_rows - H * HALF, 0), HALF)
    acc0 = gl.zeros((HALF, SUB), dtype=gl.float32, layout=acc_layout)
    acc1 = gl.zeros((HALF, SUB), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      for kk in range(k_steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        a = a_bufs.index(C * slot + H)
        b = b_bufs.index(slot)
        if TRANSPOSE_RHS:
          b0 = b.slice(0, SUB, dim=0).permute((1, 0))
          b1 = b.slice(SUB, SUB, dim=0).permute((1, 0))
        else:
          b0 = b.slice(0, SUB, dim=1)
          b1 = b.slice(SUB, SUB, dim=1)
        acc0 = warpgroup_mma(a, b0, acc0, is_async=True)
        acc1 = warpgroup_mma(a, b1, acc1, is_async=True)
        acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))  # The previous step's are done.
        mbarrier.arrive(empty.index((step + kk + S - 1) % S), pred=kk > 0)  # The previous step's stage.
      acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
      mbarrier.arrive(empty.index((step + k_steps - 1) % S))
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      for kk in range(k_steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        mbarrier.arrive(empty.index(slot))
    if rows > 0:
      step += k_steps
    if half_store > 0:
      row = row0 + H * HALF
      desc = out_desc
      if half_store < HALF:  # A group's last rows: a descriptor ending at them clips the stores.
        desc = tma.make_tensor_descriptor(out_ptr, [row + half_store, N], [N, 1], [HALF, SUB], OUT_LAYOUT)
      _store_half(desc, row, ni * BLOCK_N, c_buf, acc0)
      _store_half(desc, row, ni * BLOCK_N + SUB, c_buf, acc1)  # Past N: the descriptor clips it.
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_ws_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr,
                  OUT_LAYOUT: gl.constexpr, GROUP_M: gl.constexpr, C: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  LOADER_REGS: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, BLOCK_K); rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, BLOCK_N), or
  (G * N, K), box (BLOCK_N, BLOCK_K); out (M, N) through out_ptr and descriptors made here (box (64, BLOCK_N / 2),
  shared-memory layout OUT_LAYOUT)."""
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [C * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [C, HALF, BLOCK_N // 2], OUT_LAYOUT)
  ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=C)  # Every consumer releases a stage.
  if C == 2:
    gl.warp_specialize([
        (_consumer, (lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                     BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, GROUP_M, C, 0)),
        (_consumer, (lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                     BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, GROUP_M, C, 1)),
        (_loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX, BLOCK_N, BLOCK_K, S,
                   TRANSPOSE_RHS, GROUP_M, C)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
  else:
    gl.static_assert(C == 3, "2 or 3 consumer warpgroups")
    gl.warp_specialize([
        (_consumer, (lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                     BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, GROUP_M, C, 0)),
        (_consumer, (lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                     BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, GROUP_M, C, 1)),
        (_consumer, (lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                     BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, GROUP_M, C, 2)),
        (_loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX, BLOCK_N, BLOCK_K, S,
                   TRANSPOSE_RHS, GROUP_M, C)),
    ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


def shared_layout(block_shape, dtype_name):
  """The shared-memory layout of a (rows, columns) tile of dtype_name ("bfloat16" or "float16") in gmm_ws_kernel:
  what its host descriptors and OUT_LAYOUT declare."""
  dtype = {"bfloat16": gl.bfloat16, "float16": gl.float16}[dtype_name]
  return gl.NVMMASharedLayout.get_default_for(list(block_shape), dtype)
