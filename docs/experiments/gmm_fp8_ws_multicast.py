"""gmm_fp8_ws_mc_kernel: gmm_fp8_ws_kernel on clusters of 2 CTAs, the lhs tile multicast (issue 15, experiment).

Triton >= 3.7 only (Gluon's Hopper TMA multicast and clusters; Triton 3.6's Gluon has neither). Not wired into
jgmm: _gmm_fp8_ws_mc has backend_triton._gmm_fp8_ws's signature, so that it can replace it under mock.patch
(docs/experiments/fp8_profile.py's mc_* variants, `check` below).

python docs/experiments/gmm_fp8_ws_multicast.py check [HALVES] [STAGES]
    on a GPU: random FP8 inputs through jgmm.gmm / jgmm.masked_gmm with this kernel patched in (contiguous and
    masked, N / 128 even and odd, K 7168 and 144, both scale recipes), against backend="xla"; PASS/FAIL per case
    (rows past a group's masked_m must be zeros in both). HALVES: 2 (128-row tiles, default) or 3 (192-row
    tiles); STAGES default 4. About 2 minutes each.
python docs/experiments/gmm_fp8_ws_multicast.py ptx [HALVES,...]
    on the CPU (JAX_PLATFORMS=cpu JGMM_TARGET=cuda:90): cross-compiles the kernel for sm_90 on those shapes and
    prints what docs/experiments/multicast_notes.md records (cluster and multicast in the PTX, ptxas registers and
    spills, shared memory per CTA).

Design (docs/perf-notes.md, "TMA multicast: what it takes"):
- A cluster of 2 CTAs takes a cluster tile of 128 rows (one row tile of the schedule, HALVES = 2; or 192 rows,
  HALVES = 3, three consumers per CTA at 160 registers as gmm_fp8_ws's) x 256 columns:
  CTA r (r = %cluster_ctarank) the 128 x 128 output tile of columns [256 c + 128 r, + 128), its own rhs tile and
  rhs block scales. The lhs tile of a K step (and its lhs block scales) is the same for both: CTA 0's loader copies
  it once by TMA multicast into both CTAs' shared memory, so each stage's lhs crosses L2 once per cluster (operand
  bytes per FLOP (128 + 64) / (128 x 128) instead of (128 + 128) / (128 x 128)).
- Written at cluster level, as Gluon >= 3.7 has it: each layout's cga_layout says how the CTAs share a tensor. lhs
  halves (64, 128) and the lhs block scales (1, 128) or (1, 256): [[0, 0]], the whole box in both CTAs
  (tma.async_load with multicast=True: CTA 0 issues it, ctaMask 0b11); rhs box (256, 128) of the (G * N, K) view:
  [[1, 0]], each CTA loads its 128 rows (columns of out); accumulators (64, 256): [[0, 1]], each CTA 64 x 128;
  output halves (64, 256): [[0, 1]], each CTA stores its 64 x 128 through the same TMA store (columns past N clipped
  by the descriptor; a cluster's second column tile past N, N / 128 odd, stores nothing and its rhs rows are the
  next group's or TMA zeros, never stored).
- program_id / num_programs count clusters: the persistent grid is min(SMs / 2, cluster tiles), each cluster
  walking cluster tiles t, t + clusters, ... (row tile t // cdiv(N, 256), cluster column tile t % cdiv(N, 256)),
  gmm_ws's schedule otherwise. All scalar logic (rows of the tile, halves, stores) is per row tile, the same in
  both CTAs.
- The rhs block scale of a stage differs per CTA: the loader copies rhs_scale[g, 2 c + r, kk] 64 times by cp.async
  into the stage's (64,) float buffer, its address from the CTA rank (inline PTX: Gluon has no rank scalar); the
  buffer's layout says "the same in both CTAs" (cga_layout [[0]]), as the consumers' per-row vector (a slice of
  the [[0, 1]] accumulator layout has cga [[0]]) must, while each CTA holds its own value: sound because nothing
  reads it across CTAs (a CTA-local cp.async, a CTA-local ld.shared, an elementwise product with the CTA's own
  accumulator). An honest per-column vector would cost 32 registers per thread at 240.
- Barriers (allocated and initialised before warp_specialize: Gluon then fences the inits cluster-wide):
  `ready[s]` per CTA (count 1), expecting the bytes the CTA receives: the full lhs halves (and lhs block scales)
  multicast by CTA 0 plus its own rhs tile; CTA 1's expect may come after CTA 0's multicast bytes landed in it (the
  tx-count goes negative, the phase cannot complete before the expect's arrival). `empty[s]` per CTA (count HALVES:
  its consumers) guards the CTA's own rhs tile and scales; `cluster_empty[s]` allocated two_ctas=True is one
  barrier in CTA 0 (count 2 x HALVES) on which both CTAs' consumers arrive (mbarrier.arrive.shared::cluster to CTA
  0's address): CTA 0's loader waits on it before multicasting into a stage, so no stage is overwritten in either
  CTA before all 2 HALVES consumers released it (Gluon lowers the wait on a two_ctas barrier in CTA 0 only). CTA 1's
  multicast bytes of step n land in phase n of its ready barrier: CTA 1's consumers released step n - S only
  after that phase n - S completed. The kernel ends with Gluon's cluster barrier, so no CTA exits while the other
  still arrives on its barriers or multicasts into it.
"""
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm import ffi
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_fp8_ws import _add_product, _async_load, row_channel_scales
from jgmm.triton_kernels.gmm_ws import HALF, consumer_tile, store_half, tile_of

BLOCK = gl.constexpr(128)  # BLOCK_N per CTA and BLOCK_K.
CLUSTER_N = gl.constexpr(256)  # Columns of a cluster tile.
NUM_WARPS = 4
# Registers per thread at launch by HALVES, as gmm_fp8_ws.MAXNREG: two consumers then take 240, or three 160 (one
# 64 x 128 float32 accumulator per CTA and a product), the loader 24.
MAXNREG = {2: 168, 3: 128}
# Shared layouts of a stage's buffers in the cluster: the same in both CTAs ([[0, ...]]: lhs, lhs block scales,
# the per-CTA rhs block scale, see above), split by rhs rows ([[1, 0]]) or output columns ([[0, 1]]).
SHARED = [[0, 0]]
RHS_SPLIT = [[1, 0]]
OUT_SPLIT = [[0, 1]]
ACC_CGA = gl.constexpr(OUT_SPLIT)
ROW_SCALE_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2, cga_layout=SHARED)
RHS_SCALE_LAYOUT = gl.SwizzledSharedLayout(1, 1, 1, [0], cga_layout=[[0]])


@gluon.jit
def cta_rank():
  """This CTA's rank in its cluster (0 or 1)."""
  return gl.inline_asm("mov.u32 $0, %cluster_ctarank;", "=r", [], gl.int32, is_pure=True)


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready, empty,
            cluster_empty, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr,
            LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, HALVES: gl.constexpr):
  """Per stage: waits until this CTA's consumers released it (and in CTA 0 all four, cluster_empty), copies this
  CTA's rhs block scale (cp.async, 64 copies, none past N) and its rhs rows, and in CTA 0 multicasts the lhs
  halves holding rows of the group and the lhs block scales into both CTAs; ready expects the bytes this CTA
  receives."""
  half: gl.constexpr = lhs_desc.nbytes_per_cta  # A whole (64, 128) half in each CTA.
  base: gl.constexpr = rhs_desc.nbytes_per_cta + (sa_desc.nbytes_per_cta if LHS_BLOCKS else 0)
  num_nc: gl.constexpr = (N + CLUSTER_N - 1) // CLUSTER_N
  num_nb: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  rank = cta_rank()
  copies = gl.full([HALF], 0, gl.int32, layout=gl.BlockedLayout([2], [32], [1], [0], cga_layout=[[0]]))
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_nc, gl.num_programs(0)):
    g, row0, rows, _, nc = tile_of(schedule_ptr, t, num_nc, R_MAX)
    ni = 2 * nc + rank  # This CTA's column tile.
    sb_ptr = rhs_scale_ptr + (g.to(gl.int64) * num_nb + ni) * k_steps
    inside = ni * BLOCK < N
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        mbarrier.wait(cluster_empty.index(slot), phase)  # CTA 0 only (Gluon: a two_ctas barrier's wait).
        ready_bar = ready.index(slot)
        if RHS_BLOCKS:  # Before the expect (cp.async.mbarrier.arrive joins the phase the expect closes).
          _async_load(s_bufs.index(slot), sb_ptr + kk + copies, mask=(copies == 0) & inside)
          async_copy.mbarrier_arrive(ready_bar)
        for i in gl.static_range(HALVES):  # One expect fires: the bytes of the HALVES - i halves holding rows.
          if i == 0:
            mbarrier.expect(ready_bar, base + HALVES * half, pred=rows > (HALVES - 1) * HALF)
          elif i == HALVES - 1:
            mbarrier.expect(ready_bar, base + half, pred=rows <= HALF)
          else:
            mbarrier.expect(ready_bar, base + (HALVES - i) * half,
                            pred=(rows > (HALVES - 1 - i) * HALF) & (rows <= (HALVES - i) * HALF))
        tma.async_load(lhs_desc, [row0, kk * BLOCK], ready_bar, a_bufs.index(HALVES * slot), multicast=True)
        for h in gl.static_range(1, HALVES):
          tma.async_load(lhs_desc, [row0 + h * HALF, kk * BLOCK], ready_bar, a_bufs.index(HALVES * slot + h),
                         pred=rows > h * HALF, multicast=True)
        tma.async_load(rhs_desc, [g * N + nc * CLUSTER_N, kk * BLOCK], ready_bar, b_bufs.index(slot))
        if LHS_BLOCKS:
          tma.async_load(sa_desc, [t // num_nc * k_steps + kk, 0], ready_bar, sa_bufs.index(slot), multicast=True)
        step += 1


@gluon.jit
def _release(empty, cluster_empty, slot):
  """A consumer is done with stage slot: its CTA's empty barrier and CTA 0's cluster_empty."""
  mbarrier.arrive(empty.index(slot))
  mbarrier.arrive(cluster_empty.index(slot))


@gluon.jit
def _consumer(schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs, ready,
              empty, cluster_empty, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr,
              LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
              HALVES: gl.constexpr):
  """gmm_fp8_ws's consumer H (rows [64 H, 64 H + 64) of the tile) with a cluster-level (64, 256) accumulator,
  64 x 128 in each CTA."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32], cga_layout=ACC_CGA)
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  COLS: gl.constexpr = gl.SliceLayout(0, acc_layout)
  num_nc: gl.constexpr = (N + CLUSTER_N - 1) // CLUSTER_N
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, CLUSTER_N], OUT_LAYOUT)
  rows_in_half = gl.arange(0, HALF, layout=ROWS)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_nc, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, nc = consumer_tile(schedule_ptr, t, num_nc, R_MAX, H)
    row_mask = rows_in_half < half_rows
    col0 = nc * CLUSTER_N
    acc = gl.zeros((HALF, CLUSTER_N), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      for kk in range(k_steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        acc = _add_product(acc, a_bufs.index(HALVES * slot + H), b_bufs.index(slot).permute((1, 0)), acc,
                           sa_bufs.index(slot), s_bufs.index(slot), H, 0, LHS_BLOCKS, RHS_BLOCKS)
        _release(empty, cluster_empty, slot)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      for kk in range(k_steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        _release(empty, cluster_empty, slot)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      cols = col0 + gl.arange(0, CLUSTER_N, layout=COLS)  # This CTA's 128 columns.
      sa_ptrs = lhs_scale_ptr + row.to(gl.int64) + rows_in_half  # Row scales (without LHS_BLOCKS).
      acc = row_channel_scales(acc, sa_ptrs, rhs_scale_ptr + g.to(gl.int64) * N + cols, row_mask, cols < N,
                               LHS_BLOCKS, RHS_BLOCKS)
      acc = gl.where(gl.expand_dims(row_mask, 1), acc, 0.0)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, col0, half_store, N, CLUSTER_N, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_mc_kernel(lhs_desc, rhs_desc, sa_desc, schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr,
                         K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr,
                         LHS_BLOCKS: gl.constexpr, RHS_BLOCKS: gl.constexpr, OUT_LAYOUT: gl.constexpr,
                         HALVES: gl.constexpr):
  """Launched with num_ctas = 2 and MAXNREG[HALVES] registers. lhs_desc over lhs (M, K), box (64, 128), cga SHARED;
  rhs_desc over rhs viewed (G * N, K), box (256, 128), cga RHS_SPLIT; sa_desc over the tile-major lhs block scales
  (R_MAX * KB, W), box (1, W), W = 128 (HALVES 2) or 256 (HALVES 3), ROW_SCALE_LAYOUT (read with LHS_BLOCKS only);
  lhs_scale_ptr: row scales (without LHS_BLOCKS); rhs_scale_ptr: (G, NB, KB) block or (G, N) channel scales; out
  (M, N) through descriptors made here (box (64, 256), OUT_LAYOUT with cga OUT_SPLIT). Row tiles of 64 HALVES rows
  of gmm_ws's schedule: HALVES consumers per CTA (2 at 240 registers, or 3 at 160)."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [HALVES * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [HALVES, HALF, CLUSTER_N], OUT_LAYOUT)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S] + sa_desc.block_type.shape, sa_desc.layout)
  s_bufs = gl.allocate_shared_memory(gl.float32, [S, HALF], RHS_SCALE_LAYOUT)
  ready = mbarrier.allocate_mbarrier(batch=S)
  empty = mbarrier.allocate_mbarrier(batch=S)
  cluster_empty = mbarrier.allocate_mbarrier(batch=S, two_ctas=True)
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=HALVES)  # This CTA's consumers.
    mbarrier.init(cluster_empty.index(s), count=HALVES)  # x 2 CTAs (Gluon multiplies a two_ctas barrier's count).
  if HALVES == 2:  # (Gluon's partition lists take no tuple built from constexpr layouts: written out twice.)
    gl.warp_specialize([
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0, HALVES)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1, HALVES)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
                   empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, HALVES)),
    ], [4, 1], [240, 24])
  else:
    gl.warp_specialize([
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 0, HALVES)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 1, HALVES)),
        (_consumer, (schedule_ptr, lhs_scale_ptr, rhs_scale_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, s_bufs,
                     ready, empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, OUT_LAYOUT, 2, HALVES)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, schedule_ptr, rhs_scale_ptr, a_bufs, b_bufs, sa_bufs, s_bufs, ready,
                   empty, cluster_empty, K, N, R_MAX, S, LHS_BLOCKS, RHS_BLOCKS, HALVES)),
    ], [4, 4, 1], [160, 160, 24])

def _layout(block, dtype_name, cga_layout):
  return gl.NVMMASharedLayout.get_default_for(list(block), {"bfloat16": gl.bfloat16, "float16": gl.float16,
                                                            "float32": gl.float32,
                                                            "float8_e4m3fn": gl.float8e4nv}[dtype_name],
                                              cga_layout=cga_layout)


def _gmm_fp8_ws_mc(lhs, rhs, schedule, row_tiles, lhs_scale, rhs_scale, out_dtype, config, device):
  """backend_triton._gmm_fp8_ws's signature and result through gmm_fp8_ws_mc_kernel: tiles of config.block_m rows
  (128: HALVES 2, or 192: HALVES 3) by block_n 128 per CTA (256 per cluster), num_stages S as config's, clusters of
  2 CTAs, a persistent grid of min(SMs // 2, cluster tiles) clusters."""
  from jgmm import backend_triton
  if config.block_m not in (128, 192) or config.block_n != 128:
    raise ValueError(f"gmm_fp8_ws_mc_kernel takes 128 or 192 x 128 tiles per CTA, got config {config}")
  halves = config.block_m // HALF.value
  scale_width = geometry.next_pow2(config.block_m)  # _tile_scales' width: 128 or 256.
  m, k = lhs.shape
  num_groups, n, _ = rhs.shape
  block, half, cluster_n = BLOCK.value, HALF.value, CLUSTER_N.value
  lhs_block, rhs_block, out_block = (half, block), (cluster_n, block), (half, cluster_n)
  tiles = row_tiles * geometry.cdiv(n, cluster_n)
  # Clusters resident at once may be fewer than SMs / 2 (cuOccupancyMaxActiveClusters; GPCs of odd SM counts):
  # JGMM_MC_CLUSTERS=62 (say) sizes the persistent grid instead, so that no cluster runs in a second wave.
  clusters = int(os.environ.get("JGMM_MC_CLUSTERS", device.num_sms // 2))
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=_layout(lhs_block, lhs.dtype.name, SHARED)),
      ffi.TensorDescriptor(rhs.reshape(num_groups * n, k), rhs_block,
                           layout=_layout(rhs_block, rhs.dtype.name, RHS_SPLIT)),
      ffi.TensorDescriptor(backend_triton._tile_scales(lhs_scale, schedule, row_tiles, config.block_m),
                           (1, scale_width), layout=ROW_SCALE_LAYOUT),
      schedule, lhs_scale, rhs_scale, m,
      kernel=gmm_fp8_ws_mc_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(clusters, tiles),), num_ctas=2,
      num_warps=NUM_WARPS, maxnreg=MAXNREG[halves], name="jgmm_gmm_fp8_ws_mc",
      K=k, N=n, R_MAX=row_tiles, S=config.num_stages, LHS_BLOCKS=lhs_scale.ndim == 2,
      RHS_BLOCKS=rhs_scale.ndim == 3, OUT_LAYOUT=_layout(out_block, jnp.dtype(out_dtype).name, OUT_SPLIT),
      HALVES=halves)


# ---------------------------------------------------------------------------------------------------------------
# CLI: `ptx` (CPU cross-compilation) and `check` (GPU correctness against backend="xla").

# (layout, groups, rows per group (masked: max_m), N, K): N / 128 even (512) and odd (384, 640), K 7168, 2048 and
# 144 (not a multiple of 128: the last step's TMA reads zeros past K). Contiguous groups of uneven sizes (tiles
# that straddle groups, half-empty tiles), masked with masked_m < max_m (a group of none).
CASES = [("contiguous", 3, 300, 512, 7168), ("contiguous", 3, 300, 384, 7168), ("contiguous", 4, 200, 640, 2048),
         ("contiguous", 3, 300, 384, 144), ("masked", 3, 256, 512, 7168), ("masked", 3, 256, 384, 7168),
         ("masked", 2, 192, 640, 2048), ("masked", 3, 256, 384, 144)]
CHECK_CASES = [case for case in CASES if case[4] != 2048]  # `check` within two minutes (its compiles).
# `check 3` (192-row tiles): the contiguous K=144 case with 4 groups of N=640 instead, whose tiles of 192 rows hold
# 192, 85 | 60 | 192, 192, 79 rows (the 3 expects: 3, 2 and 1 halves of rows), N / 128 = 5.
CHECK_CASES_192 = [("contiguous", 4, 200, 640, 144) if case == ("contiguous", 3, 300, 384, 144) else case
                   for case in CHECK_CASES]
RECIPES = {"blocks": ("1x128", "128x128"), "rows": ("row", "row")}


def _groups(layout, g, rows):
  """masked_m (masked) or group sizes (contiguous, summing to g * rows) of a case."""
  if layout == "masked":
    return np.array([rows - 37, 0, 129, 64][:g], np.int32)
  sizes = np.array([rows + 77, rows - 140, 0, rows + 63][:g], np.int32)
  sizes[-1] += g * rows - sizes.sum()
  return sizes


def product(layout, rows, backend, stages=4, block_m=128):
  """The public op of a layout: (x, w, groups, x_scale, w_scale) -> out, on `backend` ("triton": block_m x 128
  tiles on the warp-specialised kernel, whichever _gmm_fp8_ws is in place)."""
  import jgmm
  from jgmm.config import Config
  config = Config(block_m=block_m, block_n=128, block_k=128, num_stages=stages, warp_specialized=True) \
      if backend == "triton" else None
  if layout == "masked":
    return lambda x, w, gs, xs, ws: jgmm.masked_gmm(x, w, gs, x_scale=xs, w_scale=ws, config=config, backend=backend)
  return lambda x, w, gs, xs, ws: jgmm.gmm(x, w, gs, lhs_scale=xs, rhs_scale=ws, transpose_rhs=True, config=config,
                                           backend=backend)


def case_args(layout, g, rows, n, k, recipe, seed=0):
  """(xq, wq, groups, x_scale, w_scale) of a case: random values quantised with `recipe`."""
  from jgmm import quantize
  k1, k2 = jax.random.split(jax.random.key(seed))
  shape = (g, rows, k) if layout == "masked" else (g * rows, k)
  # Magnitudes that differ per 128-column block of w and per K block, so that a scale of the wrong block (the
  # other CTA's, the next step's) shows as a large error rather than a few percent.
  x = jax.random.normal(k1, shape, jnp.float32) * (1 + jnp.arange(k) // 128 % 3).astype(jnp.float32)
  w = jax.random.normal(k2, (g, n, k), jnp.float32) * (1 + 2 * (jnp.arange(n) // 128))[:, None].astype(jnp.float32)
  xq, xs = quantize.quantize(x, RECIPES[recipe][0])
  wq, ws = quantize.quantize(w, RECIPES[recipe][1])
  return xq, wq, jnp.asarray(_groups(layout, g, rows)), xs, ws


def patched():
  """mock.patch of backend_triton._gmm_fp8_ws by this kernel's launcher."""
  from unittest import mock
  from jgmm import backend_triton
  return mock.patch.object(backend_triton, "_gmm_fp8_ws", _gmm_fp8_ws_mc)


def ptx_report(halves=(2, 3)):
  """Cross-compiles each case and recipe for sm_90 (CPU, JGMM_TARGET=cuda:90) with tiles of 64 HALVES rows for each
  of `halves`: one line per compiled kernel."""
  import re
  import subprocess
  import tempfile
  import triton
  from jgmm.ffi import _compile
  bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  # Triton 3.9 bundles CUDA 12.8's ptxas and CUDA 13.4's (ptxas-blackwell); only the latter reads PTX ISA 9.0.
  ptxas = next(p for p in (f"{bin_dir}/ptxas-blackwell", f"{bin_dir}/ptxas") if os.path.exists(p))
  extra = [("contiguous", 4, 200, 640, 144)]  # CHECK_CASES_192's own case.
  for h, case in [(h, case) for h in halves for case in (CASES if h == 2 else CASES + extra)]:
    layout, g, rows, n, k = case
    for recipe in RECIPES:
      args = jax.eval_shape(functools.partial(case_args, *case, recipe))
      _compile._cache.clear()
      with patched():
        jax.jit(product(layout, rows, "triton", block_m=64 * h)).trace(*args).lower(lowering_platforms=("cuda",))
      (compiled,) = [c for key, c in _compile._cache.items() if key[0] is gmm_fp8_ws_mc_kernel]
      ptx = compiled.asm["ptx"]
      with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
          f.write(ptx)
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                              capture_output=True, text=True).stderr
      used = re.search(r"Used (\d+) registers", info)
      spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
      warnings = [line for line in info.splitlines() if "C75" in line or "arning" in line]
      print(f"HALVES={h} {layout} G={g} rows={rows} N={n} (N/128={-(-n // 128)}) K={k} {recipe}: "
            f"reqnctapercluster 2: {'.reqnctapercluster 2' in ptx}, "
            f"multicast loads: {len(re.findall(r'bulk.tensor.*multicast::cluster', ptx))}, "
            f"setmaxnreg: {sorted(set(re.findall(r'setmaxnreg.(?:inc|dec).sync.aligned.u32\s+(\d+)', ptx)))}, "
            f"ptxas registers: {used and used.group(1)}, spills (stores, loads): {spills}, "
            f"shared memory per CTA: {compiled.shared_mem_bytes} B, warps {compiled.num_warps}, "
            f"ctas {compiled.num_ctas}" + (f", ptxas warnings: {warnings}" if warnings else ""), flush=True)


def check(halves=2, stages=4):
  """Each check case and recipe on the GPU with this kernel patched in (tiles of 64 HALVES rows: CHECK_CASES for
  HALVES 2, CHECK_CASES_192 for 3), against backend="xla": max |out - ref| / max |ref| and PASS (< 2e-2, FP8
  products in bf16 out) or FAIL."""
  print(jax.devices()[0].device_kind, f"HALVES={halves}", f"S={stages}", flush=True)
  failed = 0
  start = time.time()
  for case in CHECK_CASES if halves == 2 else CHECK_CASES_192:
    layout, g, rows, n, k = case
    for recipe in RECIPES:
      args = case_args(*case, recipe)
      ref = np.asarray(jax.jit(product(layout, rows, "xla"))(*args), np.float32)
      with patched():
        f = jax.jit(product(layout, rows, "triton", stages, 64 * halves)).trace(*args).lower().compile()
      out = np.asarray(f(*args), np.float32)
      err = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))
      ok = err < 2e-2 and np.all(np.isfinite(out))
      failed += not ok
      print(f"{'PASS' if ok else 'FAIL'} HALVES={halves} {layout} G={g} rows={rows} N={n} K={k} {recipe}: "
            f"max rel error {err:.2e}", flush=True)
  print(f"{'ALL PASS' if not failed else f'{failed} FAILED'} in {time.time() - start:.0f} s")
  return failed


if __name__ == "__main__":
  if sys.argv[1:2] == ["ptx"]:
    ptx_report(tuple(map(int, sys.argv[2].split(","))) if sys.argv[2:3] else (2, 3))
  elif sys.argv[1:2] == ["check"]:
    sys.exit(1 if check(*map(int, sys.argv[2:4])) else 0)
  else:
    print(__doc__)
