"""gmm_swap_kernel: the Hopper (sm_90) gmm forward with token rows on the MMA's N side (swap-AB), warp-specialised,
in Gluon.

out rows of group g = lhs rows of g @ rhs[g]: lhs (M, K), rhs (G, K, N) or (G, N, K) with TRANSPOSE_RHS, out (M, N),
all 2-byte floats. No bias, activation or accumulation (jgmm's gmm_kernel covers those).

Why: wgmma's M side comes in 64s, so a row tile pads a group's rows to 64; its N side comes in 8s. Here the MMA
computes out^T: M = 64 output columns per consumer, N = the tile's token rows. A tile is one chunk of a group's
rows (up to 256, or up to 320 for a group's last chunk: a 256-token MMA plus a tail of 16-64 tokens) x 128 output
columns, so a group of up to 320 rows reads each rhs tile once and pads its rows to 64 (up to 256) or 16 (past 256).

Persistent: one program per SM walks tiles t = program id, + programs, ...; tile t is chunk t // column tiles x
column tile t % column tiles. Per program, three partitions:
- a loader warp: per reduction step, TMA copies of the chunk's lhs rows in boxes of 64 (only those holding a row of
  the chunk) and the two 64-column halves of the rhs tile into one of S shared-memory stages;
- two consumer warpgroups: consumer H owns output columns [64 H, 64 H + 64) of the tile: a 64 x N_MAIN fp32
  accumulator (and 64 x TAIL for a tail), async wgmma with the rhs half as A (transposed from shared memory where
  rhs is (G, K, N)) and the lhs rows as B. The epilogue transposes the accumulators into shared memory and stores
  them with TMA in boxes of 64 rows through a descriptor made on the device that ends at the chunk's last row to
  store (it clips the store: no tile writes a row of another).

schedule (1 + 4 C_MAX,) int32, from jgmm.backend_triton: [C, then per chunk c < C_MAX: group, first row, rows of the
group in it (0: rows outside every group, zeros to store), rows to store]; only c < C are used.
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

BOX = gl.constexpr(64)  # Token rows per lhs load and per output store; output columns per consumer.
MAIN = gl.constexpr(256)  # Tokens of the main MMA (wgmma's largest N).
CHUNK_ROWS = 256  # Rows of a group's chunks but its last,
LAST_CHUNK_ROWS = 320  # which may hold up to MAIN + BOX.
BLOCK_N = gl.constexpr(128)  # Output columns per tile: two consumers of BOX.
NUM_WARPS = 4  # The default partition (consumer 0); the launch runs 12 warps in all.
MAXNREG = 168  # Registers per thread at launch: 12 warps x 168 fit an SM; the consumers then take 232.


@gluon.jit
def _chunk(schedule_ptr, t, num_n, C_MAX: gl.constexpr):
  """(group, first row, rows of the group, rows to store, column tile) of tile t."""
  c = t // num_n
  return (gl.load(schedule_ptr + 1 + c), gl.load(schedule_ptr + 1 + C_MAX + c),
          gl.load(schedule_ptr + 1 + 2 * C_MAX + c), gl.load(schedule_ptr + 1 + 3 * C_MAX + c), t % num_n)


@gluon.jit
def _loader(lhs_desc, rhs_desc, schedule_ptr, x_main, x_tail, w_bufs, ready, empty, K: gl.constexpr, N: gl.constexpr,
            C_MAX: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr):
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  box_bytes: gl.constexpr = lhs_desc.block_type.nbytes
  rhs_bytes: gl.constexpr = 2 * rhs_desc.block_type.nbytes
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = _chunk(schedule_ptr, t, num_n, C_MAX)
    boxes = (rows + BOX - 1) // BOX
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
        for b in gl.static_range(1, 6):
          mbarrier.expect(ready.index(slot), rhs_bytes + b * box_bytes, pred=boxes == b)
        for b in gl.static_range(4):
          _tma_load(lhs_desc, [row0 + b * BOX, kk * BLOCK_K], ready.index(slot),
                    x_main.index(slot).slice(b * BOX, BOX), pred=b < boxes)
        _tma_load(lhs_desc, [row0 + MAIN, kk * BLOCK_K], ready.index(slot), x_tail.index(slot), pred=boxes > 4)
        for h in gl.static_range(2):
          if TRANSPOSE_RHS:
            _tma_load(rhs_desc, [g * N + ni * BLOCK_N + h * BOX, kk * BLOCK_K], ready.index(slot),
                      w_bufs.index(2 * slot + h))
          else:
            _tma_load(rhs_desc, [g * K + kk * BLOCK_K, ni * BLOCK_N + h * BOX], ready.index(slot),
                      w_bufs.index(2 * slot + h))
        step += 1


@gluon.jit
def _store(out_ptr, acc, c_buf, row0, store_rows, col, N: gl.constexpr, TOKENS: gl.constexpr,
           OUT_LAYOUT: gl.constexpr):
  """Stores acc (64 columns x TOKENS tokens, fp32) as out rows [row0, row0 + TOKENS) below row0 + store_rows,
  columns [col, col + 64), through c_buf (at least TOKENS rows)."""
  c_buf.slice(0, TOKENS).store(gl.permute(acc, (1, 0)).to(out_ptr.dtype.element_ty))
  fence_async_shared()
  clipped = tma.make_tensor_descriptor(out_ptr, [row0 + store_rows, N], [N, 1], [BOX, BOX], OUT_LAYOUT)
  for b in gl.static_range((TOKENS + BOX - 1) // BOX):
    if b * BOX < store_rows:
      _tma_store(clipped, [row0 + b * BOX, col], c_buf.slice(b * BOX, BOX))


@gluon.jit
def _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N: gl.constexpr,
          k_steps: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr,
          H: gl.constexpr, N_MAIN: gl.constexpr, TAIL: gl.constexpr):
  """One tile of consumer H: the main MMA over N_MAIN tokens (and TAIL more), then its epilogue. Each variant is a
  whole function so no accumulator flows out of a branch (else ptxas serialises the wgmmas)."""
  acc = gl.zeros((BOX, N_MAIN), dtype=gl.float32,
                 layout=gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N_MAIN, 16]))
  if TAIL > 0:
    acc_t = gl.zeros((BOX, TAIL), dtype=gl.float32,
                     layout=gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TAIL, 16]))
  for kk in range(k_steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    w = w_bufs.index(2 * slot + H)
    if not TRANSPOSE_RHS:
      w = w.permute((1, 0))
    acc = warpgroup_mma(w, x_main.index(slot).slice(0, N_MAIN).permute((1, 0)), acc, is_async=True)
    if TAIL > 0:
      acc_t = warpgroup_mma(w, x_tail.index(slot).slice(0, TAIL).permute((1, 0)), acc_t, is_async=True)
      acc, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_t))
    else:
      acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    mbarrier.arrive(empty.index((step + kk + S - 1) % S), pred=kk > 0)  # The previous step's stage.
  if TAIL > 0:
    acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
  else:
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
  mbarrier.arrive(empty.index((step + k_steps - 1) % S))
  tma.store_wait(pendings=0)  # This consumer's previous TMA stores have read its buffers.
  _store(out_ptr, acc, c_main, row0, store_rows, col, N, N_MAIN, OUT_LAYOUT)
  if TAIL > 0:
    _store(out_ptr, acc_t, c_tail, row0 + MAIN, store_rows - MAIN, col, N, TAIL, OUT_LAYOUT)


@gluon.jit
def _zeros(out_ptr, c_main, c_tail, row0, store_rows, col, N: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """Zeros in out rows [row0, row0 + store_rows) (at most MAIN + BOX), columns [col, col + 64)."""
  layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, MAIN, 16])
  tail_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BOX, 16])
  tma.store_wait(pendings=0)
  _store(out_ptr, gl.zeros((BOX, MAIN), dtype=gl.float32, layout=layout), c_main, row0, store_rows, col, N, MAIN,
         OUT_LAYOUT)
  _store(out_ptr, gl.zeros((BOX, BOX), dtype=gl.float32, layout=tail_layout), c_tail, row0 + MAIN, store_rows - MAIN,
         col, N, BOX, OUT_LAYOUT)


@gluon.jit
def _consumer(schedule_ptr, out_ptr, x_main, x_tail, w_bufs, c_mains, c_tails, ready, empty, K: gl.constexpr, N: gl.constexpr,
              C_MAX: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  c_main = c_mains.index(H)
  c_tail = c_tails.index(H)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row0, rows, store_rows, ni = _chunk(schedule_ptr, t, num_n, C_MAX)
    col = ni * BLOCK_N + H * BOX
    if rows == 0:
      _zeros(out_ptr, c_main, c_tail, row0, store_rows, col, N, OUT_LAYOUT)
    elif rows <= BOX:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, BOX, 0)
    elif rows <= 2 * BOX:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, 2 * BOX, 0)
    elif rows <= MAIN:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, MAIN, 0)
    elif rows <= MAIN + 16:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, MAIN, 16)
    elif rows <= MAIN + 32:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, MAIN, 32)
    else:
      _tile(out_ptr, x_main, x_tail, w_bufs, c_main, c_tail, ready, empty, step, row0, store_rows, col, N, k_steps, S,
            TRANSPOSE_RHS, OUT_LAYOUT, H, MAIN, BOX)
    if rows > 0:
      step += k_steps
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_swap_kernel(lhs_desc, rhs_desc, schedule_ptr, out_ptr, K: gl.constexpr, N: gl.constexpr, C_MAX: gl.constexpr,
                    BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """lhs_desc over lhs (M, K), box (64, BLOCK_K); rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, 64), or
  (G * N, K), box (64, BLOCK_K); out (M, N) through out_ptr and descriptors made here (box (64, 64), shared-memory
  layout OUT_LAYOUT)."""
  x_main = gl.allocate_shared_memory(lhs_desc.dtype, [S, MAIN, BLOCK_K], lhs_desc.layout)
  x_tail = gl.allocate_shared_memory(lhs_desc.dtype, [S, BOX, BLOCK_K], lhs_desc.layout)
  w_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [2 * S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_mains = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2, MAIN, BOX], OUT_LAYOUT)
  c_tails = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2, BOX, BOX], OUT_LAYOUT)
  ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=2)  # Both consumers release a stage.
  gl.warp_specialize([
      (_consumer, (schedule_ptr, out_ptr, x_main, x_tail, w_bufs, c_mains, c_tails, ready, empty, K, N, C_MAX, BLOCK_K, S, TRANSPOSE_RHS,
                   OUT_LAYOUT, 0)),
      (_consumer, (schedule_ptr, out_ptr, x_main, x_tail, w_bufs, c_mains, c_tails, ready, empty, K, N, C_MAX, BLOCK_K, S, TRANSPOSE_RHS,
                   OUT_LAYOUT, 1)),
      (_loader, (lhs_desc, rhs_desc, schedule_ptr, x_main, x_tail, w_bufs, ready, empty, K, N, C_MAX, BLOCK_K, S,
                 TRANSPOSE_RHS)),
  ], [4, 1], [232, 40])
