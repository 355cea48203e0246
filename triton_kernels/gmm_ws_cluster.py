"""gmm_ws_cluster_kernel: gmm_ws_kernel on clusters of 2 CTAs, the lhs tile multicast (Hopper, Triton >= 3.7).

out rows of group g = lhs rows of g @ rhs[g], as gmm_ws_kernel (same operands, schedule and row logic); only the work
per program differs. A cluster of 2 CTAs takes a cluster tile of 128 rows (one row tile of the schedule) x 2 BLOCK_N
columns: CTA r computes columns [2 BLOCK_N c + BLOCK_N r, + BLOCK_N) with its own rhs tile, and the lhs halves of
each K step, the same for both, are copied once by CTA 0's loader, by TMA multicast into both CTAs' shared memory.
Operand bytes per FLOP at BLOCK_N = 256: (64 + 256) / (128 x 256), 17% fewer than gmm_ws_kernel's.

Written at cluster level (Gluon >= 3.7: each layout's cga_layout says how the 2 CTAs share a tensor):
- lhs halves (64, BLOCK_K): SHARED, the whole box in both CTAs (tma.async_load(multicast=True): CTA 0 issues it for
  both). rhs box of the (G * K, N) view (BLOCK_K, 2 BLOCK_N): COL_SPLIT, or of the transposed (G * N, K) view
  (2 BLOCK_N, BLOCK_K): ROW_SPLIT; each CTA loads its own BLOCK_N columns. Accumulators and output halves
  (64, 2 BLOCK_N): COL_SPLIT (64 x BLOCK_N fp32 per consumer warpgroup, as gmm_ws_kernel), stored by TMA (columns past
  N clipped by the descriptor, rows past the tile's by gmm_ws.store_half's clipped descriptor). A cluster's second
  column tile entirely past N computes on TMA zeros or the next group's rows and is never stored.
- program_id / num_programs count clusters: the persistent grid is at most SMs / 2 clusters, each walking cluster
  tiles t, t + clusters, ... in gmm_ws.tile_of's order (BAND). Every scalar (rows of the tile, halves, stores) is per
  row tile, the same in both CTAs: no rank, no per-CTA branch.
- Barriers, three per stage: `ready[s]` per CTA, count 1: the loader's expect of the bytes its CTA receives (the
  multicast lhs halves holding rows, its own rhs tile; CTA 1's expect may come after CTA 0's bytes landed: the
  tx-count goes negative and the phase cannot complete before the expect's arrival). `empty[s]` per CTA, count 2
  (its consumers): its loader waits on it before loading its rhs tile. `cluster_empty[s]` two_ctas (one barrier in
  CTA 0, count 2 x 2: all four consumers arrive, CTA 1's remotely): CTA 0's loader waits on it before multicasting
  into stage s of both CTAs. Consumers release a stage one step late (warpgroup_mma_wait(1)); a consumer whose half
  holds no row of the group waits for and releases the stages the other uses. Gluon ends a cluster kernel with a
  cluster barrier, so no CTA exits while the other still arrives on its barriers or multicasts into it.
- One loader warp and two consumer warpgroups per CTA, registers and shared memory per CTA as gmm_ws_kernel's.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from jgmm.triton_kernels.gmm_ws import HALF, consumer, loader

# cga_layout of the cluster-level tensors: the same in both CTAs, or split between them by rows or by columns (the
# accumulators: gmm_ws.consumer's with CTAS = 2).
SHARED = [[0, 0]]
ROW_SPLIT = [[1, 0]]
COL_SPLIT = [[0, 1]]


def supported():
  """Whether this Triton's Gluon has what the kernel needs (cluster mbarriers and TMA multicast: Triton >= 3.7)."""
  return hasattr(mbarrier, "allocate_mbarrier")


@gluon.jit
def gmm_ws_cluster_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                          R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                          TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  """Launched with num_ctas = 2 and gmm_ws.MAXNREG registers. lhs_desc over lhs (M, K), box (64, BLOCK_K), cga
  SHARED; rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, 2 BLOCK_N), cga COL_SPLIT, or (G * N, K), box
  (2 BLOCK_N, BLOCK_K), cga ROW_SPLIT; out (M, N) through out_ptr and descriptors made here (box (64, 2 BLOCK_N),
  OUT_LAYOUT with cga COL_SPLIT). schedule_ptr: gmm_ws_kernel's schedule of 128-row tiles."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [2 * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2, HALF, 2 * BLOCK_N], OUT_LAYOUT)
  ready = mbarrier.allocate_mbarrier(batch=S)
  empty = mbarrier.allocate_mbarrier(batch=S)
  cluster_empty = mbarrier.allocate_mbarrier(batch=S, two_ctas=True)
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=2)  # This CTA's consumers.
    mbarrier.init(cluster_empty.index(s), count=2)  # x 2 CTAs (Gluon doubles a two_ctas barrier's count).
  gl.warp_specialize([
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                  BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND, 2)),
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                  BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND, 2)),
      (loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K, N, R_MAX, BLOCK_N,
                BLOCK_K, S, TRANSPOSE_RHS, BAND, 2)),
  ], [4, 1], [232, 40])

