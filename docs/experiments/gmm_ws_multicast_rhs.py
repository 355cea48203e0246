"""gmm_ws_mc_rhs_kernel: the bf16 gmm_ws_kernel on clusters of 2 CTAs, the rhs tile multicast (experiment).

The second variant of docs/experiments/gmm_ws_multicast.py (the lhs multicast, "the lhs file" below), whose
mechanics, launch, patching and commands this follows and whose helpers it imports (this file's directory is on
sys.path when it runs as a script). Triton >= 3.7 only (importing it under 3.6 raises ImportError, as the lhs file).
Not wired into jgmm: _gmm_ws_mc_rhs has backend_triton._gmm_ws's signature, so that it replaces it under mock.patch
(`Launches`). Status: cross-compiles for sm_90a under Triton 3.9 (`ptx`); not run on a GPU yet.

python docs/experiments/gmm_ws_multicast_rhs.py check
    on a GPU: the lhs file's check cases (both rhs layouts, N / BLOCK_N even, odd and partial, K 4096, 72 and 64,
    tiles of 256 (3 stages) and 128 (5 stages) columns) with this kernel patched in, against backend="xla" (float32
    out), on group sizes SIZES (below: groups of odd row-tile counts, an empty group, pairs whose rows end in
    either CTA's part of either half, rows before and after the groups); PASS/FAIL per case.
python docs/experiments/gmm_ws_multicast_rhs.py time [CASE,...] [VARIANT,...]
    on a GPU: the lhs file's `time` (jgmm.bench's cases, forward and d lhs, timed interleaved) with VARIANTS
    (default table,ws,mc,mcr): "table", "ws", "mc" and "mc128" as the lhs file's, "mcr" this kernel at 128 x 256
    x 64 per CTA S=3 (cluster tile 256 x 256), "mcr128" at 128 x 128 x 64 per CTA S=5 (cluster tile 256 x 128).
python docs/experiments/gmm_ws_multicast_rhs.py ptx
    on the CPU (JAX_PLATFORMS=cpu JGMM_TARGET=cuda:90): the lhs file's `ptx` report for this kernel on PTX_CASES
    (the lhs file's shapes and more groups: M = 1500, 5 groups).
python docs/experiments/gmm_ws_multicast_rhs.py dry
    on the CPU: cross-lowers `check`'s cases for sm_90 (this kernel the one launched, once per case), and runs the
    kernel's row and tile arithmetic in numpy on the schedule of SIZES (every output row written once, by the
    right group's product or zeros), against a float64 reference.

Design (decisions; docs/perf-notes.md, "TMA multicast: what it takes"):
- Cluster tile: 256 rows of one group x BLOCK_N columns (gmm_ws's 128-row tiles paired). The schedule is
  backend_triton._row_tiles with 256-row tiles (`_pair_tiles`): per pair, the group, first row, rows of the group
  (<= 256) and rows to store, the rows outside every group in pairs of their own (zeros stored). It is the brief's
  schedule of 128-row tiles with each group's (and each outside region's) tile count rounded up to even, written
  per pair: the padding tile of an odd count is the second half of its group's last pair (0 rows: no loads, no
  MMAs, no stores; it shares the pair's barrier phases by construction). No new schedule code is needed.
- Rows of a pair between the CTAs: interleaved, not one row tile per CTA. Cluster half H (H = consumer 0, 1) is
  rows [row0 + 128 H, + 128) of the pair, a cluster-level (128, *) box split by rows (cga ROW_SPLIT [[1, 0]]):
  CTA r holds and computes rows [row0 + 128 H + 64 r, + 64), consumer H (so each CTA still computes 128 rows, two
  64-row wgmma halves, as gmm_ws). Why: Gluon's cluster-level TMA copies and stores give CTA r the part
  coordinate + 64 r of a ROW_SPLIT box (the lhs file's notes: a split box's coordinate gets rank x part added), so
  with interleaved rows every address, predicate, expect and store is the same scalar in both CTAs: no rank, no
  per-CTA branch, no per-CTA schedule entry. With one row tile per CTA (CTA r at row0 + 128 r) the lhs copy, the
  store coordinate and the clipped store's last row would each need the rank (inline PTX, as the FP8 port's
  cta_rank()). Interleaving also balances a group's last pair: a pair of 100 rows gives each CTA 64 rows (50 and 36
  of the group) instead of 100 to CTA 0 and none to CTA 1.
- Rank handling: none. A half whose cluster half holds rows computes in both CTAs, even where CTA 1's 64 rows hold
  none of the group (a pair of <= 64 + 128 H rows in half H): CTA 1 then multiplies rows of the next group or TMA
  zeros, never stored (the clipped store: a descriptor ending at the half's last row, which leaves CTA 1's box
  entirely out of bounds). This costs no time: CTA 0's part of the same half holds rows and the two CTAs run in
  step (cluster_empty), so the cluster's pace is CTA 0's. (Per-CTA branches on a rank from inline PTX would be
  legal in the lowered code, wgmma and the loads being CTA-local, but would gain nothing here.)
- The rhs multicast: CTA 0 loads the whole rhs box (BLOCK_K, BLOCK_N) of the (G * K, N) view, or (BLOCK_N, BLOCK_K)
  of the transposed (G * N, K) view, and multicasts it (tma.async_load(multicast=True) on a SHARED [[0, 0]] box:
  Gluon 3.9 issues it from CTA 0 with ctaMask 0b11). CUTLASS's split (each CTA loads half the box and multicasts
  it to both) has no Gluon 3.9 form found: a multicast copy into a broadcast box is issued by the lead CTA (CTA 0)
  only, whatever the box.
- Each CTA's lhs: the cluster half H box (128, BLOCK_K), ROW_SPLIT, loaded without multicast (each CTA its 64
  rows, 8 KB at BLOCK_K = 64, as gmm_ws's halves); half 1 only where the pair has rows past 128.
- Operand bytes per FLOP: per CTA and K step 128 lhs rows and BLOCK_N / 2 rhs columns' worth (the rhs crosses L2
  once per cluster): (128 + 256 / 2) / (128 x 256) at BLOCK_N = 256, 33% below gmm_ws's (128 + 256) / (128 x 256)
  (the lhs file's: 17%).
- Barriers: the lhs file's three per stage, the roles swapped. `ready[s]` per CTA, count 1: the loader's expect of
  the bytes its CTA receives (the whole rhs box, multicast by CTA 0, plus its own lhs parts of the halves that hold
  rows; CTA 1's expect may come after CTA 0's bytes landed: its tx-count goes negative and the phase cannot
  complete before the expect's arrival). `empty[s]` per CTA, count 2: its loader waits on it before loading its
  own lhs parts. `cluster_empty[s]` two_ctas (one barrier in CTA 0, count 2 x 2, all four consumers arrive):
  CTA 0's loader waits on it before multicasting the rhs into stage s of both CTAs. Both CTAs walk the same pairs
  and steps (rows > 0 is the pair's), so the phases stay in step, as in the lhs file. Consumers release a stage
  one step late (warpgroup_mma_wait(1)); a consumer whose cluster half holds no row waits for and releases the
  stages the other consumer uses; the kernel ends with Gluon's cluster barrier.
- Accumulators (128, BLOCK_N) per consumer at cluster level, ROW_SPLIT: 64 x BLOCK_N fp32 per CTA (gmm_ws's).
  Output halves (128, BLOCK_N), OUT_LAYOUT with cga ROW_SPLIT, stored by one cluster-level TMA store per half at
  [row0 + 128 H, column]: out_desc for a whole half, else a descriptor made on the device ending at the half's last
  row (columns past N clipped by the descriptor, as gmm_ws).
- One loader warp and two consumer warpgroups per CTA at gmm_ws's registers (launch 168, consumers 232, loader
  40); shared memory per CTA the lhs file's (S stages of 128 x BLOCK_K lhs rows and a BLOCK_K x BLOCK_N rhs box,
  two 64 x BLOCK_N output halves): S = 3 at 128 x 256 x 64, S = 6 at 128 x 128 x 64 the largest.
- Persistent grid of min(SMs / 2, cluster tiles) clusters (program_id / num_programs count clusters), cluster
  tile t = pair t // cdiv(N, BLOCK_N), column tile t % cdiv(N, BLOCK_N); JGMM_MC_CLUSTERS overrides SMs / 2.

CPU evidence (Triton 3.9.0, JGMM_TARGET=cuda:90, ptxas of CUDA 13.4 -arch=sm_90a): `ptx` compiles all 14 PTX_CASES
with `.reqnctapercluster 2`, setmaxnreg 232 / 40 (and Triton's 120 / 256), 168 registers, 0 spill bytes, 213344 B
shared memory per CTA at 128 x 256 x 64 S=3 (S=4 does not fit), 197008 B at 128 x 128 x 64 S=5, 229784 B at S=6
(the largest). Multicast copies per K step: the rhs box only, issued under `%cluster_ctarank == 0` with ctaMask 3:
4 of (64, 64) for the (64, 256) box of the (G * K, N) view (128-byte swizzle rows), 2 at BLOCK_N = 128, 1 for the
transposed view's (256, 64) box (2 where K = 72 unrolls two steps). The lhs copies are CTA-local with row
coordinate row0 (+ 128) + (rank << 6), the stores' rows + (rank << 6), the expects 49152 / 40960 B (rhs 32 KB + 2
or 1 lhs parts of 8 KB). `dry`: the 11 check cases cross-lower, this kernel launched and compiled once each; the
emulation writes every output element once and matches the float64 reference exactly.
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # The lhs file, when imported from elsewhere.
import gmm_ws_multicast as mc  # noqa: E402
from gmm_ws_multicast import (MAXNREG, NUM_WARPS, ROW_SPLIT, SHARED, _layout, case_args,  # noqa: E402
                              reduce_steps, release_steps)

from jgmm import ffi  # noqa: E402
from jgmm.triton_kernels import geometry, gmm_ws  # noqa: E402
from jgmm.triton_kernels.gmm_ws import tile_of  # noqa: E402

PAIR_M = 2 * gmm_ws.BLOCK_M  # Rows of a cluster tile: two row tiles of one group.
CLUSTER_HALF = gl.constexpr(gmm_ws.BLOCK_M)  # Rows of a cluster-level half (consumer H's), 64 in each CTA.
ACC_CGA = gl.constexpr(ROW_SPLIT)


@gluon.jit
def _loader(lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K: gl.constexpr,
            N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
            TRANSPOSE_RHS: gl.constexpr):
  """Per stage: waits until this CTA's consumers released it (and in CTA 0 all four, cluster_empty), loads this
  CTA's parts of the lhs halves holding rows of the pair, and in CTA 0 multicasts the rhs box into both CTAs;
  ready expects the bytes this CTA receives."""
  half: gl.constexpr = lhs_desc.nbytes_per_cta  # This CTA's 64 rows of a (128, BLOCK_K) half.
  base: gl.constexpr = rhs_desc.nbytes_per_cta  # The whole rhs box in each CTA.
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = tile_of(schedule_ptr, t, num_n, R_MAX)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        mbarrier.wait(cluster_empty.index(slot), phase)  # CTA 0 only (Gluon: a two_ctas barrier's wait).
        ready_bar = ready.index(slot)
        mbarrier.expect(ready_bar, base + 2 * half, pred=rows > CLUSTER_HALF)
        mbarrier.expect(ready_bar, base + half, pred=rows <= CLUSTER_HALF)
        tma.async_load(lhs_desc, [row0, kk * BLOCK_K], ready_bar, a_bufs.index(2 * slot))
        tma.async_load(lhs_desc, [row0 + CLUSTER_HALF, kk * BLOCK_K], ready_bar, a_bufs.index(2 * slot + 1),
                       pred=rows > CLUSTER_HALF)
        if TRANSPOSE_RHS:
          tma.async_load(rhs_desc, [g * N + ni * BLOCK_N, kk * BLOCK_K], ready_bar, b_bufs.index(slot),
                         multicast=True)
        else:
          tma.async_load(rhs_desc, [g * K + kk * BLOCK_K, ni * BLOCK_N], ready_bar, b_bufs.index(slot),
                         multicast=True)
        step += 1


@gluon.jit
def _store_half(out_ptr, out_desc, c_buf, acc, row, col, half_store, N: gl.constexpr, BLOCK_N: gl.constexpr,
                OUT_LAYOUT: gl.constexpr):
  """gmm_ws.store_half for a cluster-level (128, BLOCK_N) half: rows [row, row + half_store) of out (half_store <=
  128) = the first rows of acc, through c_buf and one TMA store (CTA r's 64 rows at row + 64 r); a partial half
  through a descriptor ending at its last row, which clips the store (a CTA part past it stores nothing)."""
  tma.store_wait(pendings=0)  # This consumer's previous TMA store has read c_buf (and its descriptor).
  c_buf.store(acc.to(out_ptr.dtype.element_ty))
  fence_async_shared()
  if half_store == CLUSTER_HALF:
    tma.async_store(out_desc, [row, col], c_buf)
  else:
    clipped = tma.make_tensor_descriptor(out_ptr, [row + half_store, N], [N, 1], [CLUSTER_HALF, BLOCK_N], OUT_LAYOUT)
    tma.async_store(clipped, [row, col], c_buf)


@gluon.jit
def _consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K: gl.constexpr,
              N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr):
  """gmm_ws's consumer H for cluster half H (rows [128 H, 128 H + 128) of the pair) with a cluster-level
  (128, BLOCK_N) accumulator, 64 x BLOCK_N in each CTA."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16], cga_layout=ACC_CGA)
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [CLUSTER_HALF, BLOCK_N], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row0, rows, store_rows, ni = tile_of(schedule_ptr, t, num_n, R_MAX)
    half_rows = gl.minimum(gl.maximum(rows - H * CLUSTER_HALF, 0), CLUSTER_HALF)
    half_store = gl.minimum(gl.maximum(store_rows - H * CLUSTER_HALF, 0), CLUSTER_HALF)
    acc = gl.zeros((CLUSTER_HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      acc = reduce_steps(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, k_steps, S, TRANSPOSE_RHS, H)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_steps(ready, empty, cluster_empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      _store_half(out_ptr, out_desc, c_bufs.index(H), acc, row0 + H * CLUSTER_HALF, ni * BLOCK_N, half_store, N,
                  BLOCK_N, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_ws_mc_rhs_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                         R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                         TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """Launched with num_ctas = 2 and MAXNREG registers. lhs_desc over lhs (M, K), box (128, BLOCK_K), cga ROW_SPLIT;
  rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, BLOCK_N), or (G * N, K), box (BLOCK_N, BLOCK_K), cga SHARED;
  out (M, N) through out_ptr and descriptors made here (box (128, BLOCK_N), OUT_LAYOUT with cga ROW_SPLIT).
  schedule_ptr: _pair_tiles' schedule of 256-row pairs (R_MAX of them)."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty = mc.allocate_cluster(
      lhs_desc, rhs_desc, out_ptr, [CLUSTER_HALF, BLOCK_N], S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0)),
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1)),
      (_loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K, N, R_MAX, BLOCK_N,
                 BLOCK_K, S, TRANSPOSE_RHS)),
  ], [4, 1], [232, 40])


def num_pairs(m, num_groups):
  """Schedule entries that hold every pair, whatever the bounds (_row_tiles' bound at 256 rows)."""
  return geometry.cdiv(m, PAIR_M) + num_groups + 1


def _pair_tiles(bounds, m, pairs):
  """The schedule of cluster tiles' rows: gmm_ws's row tiles with each region's (group's, or the rows before or
  after the groups') count rounded up to even, one entry per pair of them, i.e. backend_triton._row_tiles of
  256-row tiles: [pairs in use; per pair its group, first row, rows of the group (<= 256; 0 outside the groups),
  rows to store]."""
  from jgmm import backend_triton
  return backend_triton._row_tiles(bounds, m, pairs, PAIR_M)


def _gmm_ws_mc_rhs(lhs, rhs, bounds, transpose_rhs, out_dtype, config, device):
  """backend_triton._gmm_ws's signature and result through gmm_ws_mc_rhs_kernel: 128-row tiles per CTA (256-row
  pairs per cluster) by config.block_n (128 or 256) columns by config.block_k, num_stages S as config's, clusters
  of 2 CTAs, a persistent grid of min(SMs // 2, cluster tiles) clusters."""
  if config.block_m != gmm_ws.BLOCK_M or config.block_n not in (128, 256):
    raise ValueError(f"gmm_ws_mc_rhs_kernel takes 128 x 128 or 128 x 256 tiles per CTA, got config {config}")
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  pairs = num_pairs(m, num_groups)
  lhs_block = (CLUSTER_HALF.value, config.block_k)
  rhs_view, rhs_block = ((num_groups * n, k), (config.block_n, config.block_k)) if transpose_rhs else (
      (num_groups * k, n), (config.block_k, config.block_n))
  out_block = (CLUSTER_HALF.value, config.block_n)
  tiles = pairs * geometry.cdiv(n, config.block_n)
  clusters = int(os.environ.get("JGMM_MC_CLUSTERS", device.num_sms // 2))  # As the lhs file's.
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=_layout(lhs_block, lhs.dtype.name, ROW_SPLIT)),
      ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block, layout=_layout(rhs_block, rhs.dtype.name, SHARED)),
      _pair_tiles(bounds, m, pairs), m,
      kernel=gmm_ws_mc_rhs_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(clusters, tiles),), num_ctas=2,
      num_warps=NUM_WARPS, maxnreg=MAXNREG, name="jgmm_gmm_ws_mc_rhs",
      K=k, N=n, R_MAX=pairs, BLOCK_N=config.block_n, BLOCK_K=config.block_k, S=config.num_stages,
      TRANSPOSE_RHS=transpose_rhs, OUT_LAYOUT=_layout(out_block, jnp.dtype(out_dtype).name, ROW_SPLIT))


# ---------------------------------------------------------------------------------------------------------------
# CLI: `check` (GPU), `time` (GPU A/B), `ptx` and `dry` (CPU).

class Launches(mc.Launches):
  """The lhs file's mock.patch of backend_triton._gmm_ws, launching this kernel."""

  def _launch(self, *args):
    self.count += 1
    return _gmm_ws_mc_rhs(*args)


MCR_CONFIGS = mc.MC_CONFIGS  # `check` and `time`'s mcr, mcr128: the lhs variant's tiles and stages.
# Group sizes of `check` and `dry` (group_offset 1: rows [0, 37) before the groups, [1000 - 73, 1000) after them).
# Pairs of 256 rows: 300 = 256 + 44 (3 row tiles, odd: the last pair's half 1 is the padding tile; its half 0 has
# 44 rows in CTA 0's part, none in CTA 1's), an empty group, 40, 450 = 256 + 194 (the last pair's half 1: 64 rows
# in CTA 0, 2 in CTA 1), 100 (half 0: 64 in CTA 0, 36 in CTA 1); outside, 37 and 73 rows (pairs of zeros).
SIZES = [37, 300, 0, 40, 450, 100]


def check():
  """The lhs file's check with this kernel (MCR_CONFIGS, this file's Launches, SIZES)."""
  return mc.check(MCR_CONFIGS, Launches, SIZES)


def time_ab(names=mc.TIME_CASES, variants=("table", "ws", "mc", "mcr")):
  """The lhs file's time_ab with this kernel's variants ("mcr", "mcr128") beside its own."""
  mc.time_ab(names, variants, {"mcr": MCR_CONFIGS[256], "mcr128": MCR_CONFIGS[128]},
             {"mcr": Launches, "mcr128": Launches})


# (M, K, N, transpose_rhs, BLOCK_N, S): the lhs file's shapes (M = 900: 3 groups) and M = 1500 (5 groups: `ptx`
# makes M // 300 groups; the sizes are runtime values, so only M and G, i.e. R_MAX, reach the compiled kernel).
PTX_CASES = mc.PTX_CASES + [(1500, 4096, 512, False, 256, 3), (1500, 4096, 768, True, 256, 3),
                            (1500, 72, 384, True, 128, mc.max_stages(128))]


def ptx_report():
  """The lhs file's `ptx` report for this kernel on PTX_CASES (its function, with this file's launcher, kernel and
  cases patched into its module)."""
  from unittest import mock
  with mock.patch.object(mc, "Launches", Launches), mock.patch.object(mc, "gmm_ws_mc_kernel", gmm_ws_mc_rhs_kernel), \
       mock.patch.object(mc, "PTX_CASES", PTX_CASES):
    mc.ptx_report()


def emulate(lhs, rhs, bounds, transpose_rhs, block_n):
  """This kernel's row and tile arithmetic in numpy (float64 products): per cluster tile, half H and CTA r, the
  rows it multiplies (when its cluster half holds rows; past M: TMA zeros) and the rows it stores (its part of the
  half, clipped at the half's rows to store). Returns (out, writes): writes counts the stores of each element."""
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  pairs = num_pairs(m, num_groups)
  sched = np.asarray(_pair_tiles(jnp.asarray(bounds), m, pairs))
  used, group, first, in_group, store = (sched[0], sched[1:1 + pairs], sched[1 + pairs:1 + 2 * pairs],
                                         sched[1 + 2 * pairs:1 + 3 * pairs], sched[1 + 3 * pairs:])
  a = np.concatenate([np.asarray(lhs, np.float64), np.zeros((PAIR_M, k))])  # TMA zeros past M.
  w = np.asarray(rhs, np.float64)
  out, writes = np.zeros((m, n)), np.zeros((m, n), np.int64)
  half, part = CLUSTER_HALF.value, CLUSTER_HALF.value // 2
  for p in range(used):
    for ni in range(geometry.cdiv(n, block_n)):
      cols = slice(ni * block_n, min(n, (ni + 1) * block_n))
      b = (w[group[p]].T if transpose_rhs else w[group[p]])[:, cols]
      for h in range(2):
        half_rows = min(max(in_group[p] - h * half, 0), half)
        half_store = min(max(store[p] - h * half, 0), half)
        for r in range(2):
          lo = first[p] + h * half + r * part
          acc = a[lo:lo + part] @ b if half_rows > 0 else np.zeros((part, b.shape[1]))
          end = min(first[p] + h * half + half_store, lo + part, m)  # The clipped store.
          if end > lo:
            out[lo:end, cols] = acc[:end - lo]
            writes[lo:end, cols] += 1
  return out, writes


def dry():
  """CPU: `check`'s cases cross-lowered for sm_90 (this kernel launched once, compiled once), then emulate() on
  SIZES against a float64 reference (every element written once, relative error ~1e-16)."""
  import jgmm
  from jgmm.ffi import _compile
  from jgmm.ops import group_bounds
  failed = 0
  for m, k, n, transpose_rhs, block_n in mc.CHECK_CASES:
    lhs, rhs, sizes = case_args(m, k, n, transpose_rhs)
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (lhs, rhs, sizes)]
    _compile._cache.clear()
    f = functools.partial(jgmm.gmm, transpose_rhs=transpose_rhs, group_offset=1, config=MCR_CONFIGS[block_n],
                          backend="triton")
    what = f"M={m} K={k} N={n} transpose_rhs={transpose_rhs} BLOCK_N={block_n}"
    try:
      with Launches() as launches:
        jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",))
      kernels = [c for key, c in _compile._cache.items() if key[0] is gmm_ws_mc_rhs_kernel]
      ok = launches.count == 1 and len(kernels) == 1
      detail = f"launches {launches.count}, kernels compiled {len(kernels)}"
    except Exception as e:
      ok, detail = False, f"{type(e).__name__}: {str(e)[:500]}"
    # The emulation, in float64 on the same inputs and SIZES.
    bounds = np.asarray(group_bounds(jnp.asarray(SIZES, jnp.int32), 1, len(SIZES) - 1, m))
    out, writes = emulate(lhs, rhs, bounds, transpose_rhs, block_n)
    a, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ref = np.zeros_like(out)
    for g in range(len(SIZES) - 1):
      lo, hi = bounds[g], bounds[g + 1]
      ref[lo:hi] = a[lo:hi] @ (w[g].T if transpose_rhs else w[g])
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    once = bool(np.all(writes == 1))
    ok = ok and once and err < 1e-12
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'} {what}: cross-lowered ({detail}); emulation: every element written once "
          f"{once}, rel error {err:.1e}", flush=True)
  print("ALL PASS" if not failed else f"{failed} FAILED")
  return failed


if __name__ == "__main__":
  if sys.argv[1:2] == ["ptx"]:
    ptx_report()
  elif sys.argv[1:2] == ["dry"]:
    sys.exit(1 if dry() else 0)
  elif sys.argv[1:2] == ["check"]:
    sys.exit(1 if check() else 0)
  elif sys.argv[1:2] == ["time"]:
    time_ab(*(tuple(arg.split(",")) for arg in sys.argv[2:4]))
  else:
    print(__doc__)
