"""gmm_ws_mc_kernel: the bf16 gmm_ws_kernel on clusters of 2 CTAs, the lhs tile multicast (experiment).

Triton >= 3.7 only (Gluon's Hopper TMA multicast and cluster barriers; Triton 3.6's Gluon has neither: importing
this file there raises ImportError). Not wired into jgmm: _gmm_ws_mc has backend_triton._gmm_ws's signature, so that
it replaces it under mock.patch (`patched()`), and jgmm.gmm with a warp-specialised config then runs it.

python docs/experiments/gmm_ws_multicast.py check
    on a GPU: random bf16 inputs through jgmm.gmm with this kernel patched in, against jgmm.gmm on backend="xla"
    (float32 out): both layouts of rhs, N / BLOCK_N odd and even and N past the last tile, K 4096, 72 (rhs
    transposed: a partial step) and 64, an empty group, rows before and after the groups (zeros in both), tiles of
    256 (3 stages) and 128 (5 stages) columns per CTA; PASS/FAIL per case.
python docs/experiments/gmm_ws_multicast.py time [CASE,...] [VARIANT,...]
    on a GPU: forward (gmm) and d lhs (gmm_t: dout (M, N) times w (G, K, N) transposed) of jgmm.bench's cases
    (default mixtral8x7b-w1, dsv3-ep8-gateup, dsv3-ep8-down), timed interleaved (jgmm.timing.time_interleaved):
    VARIANTS (default table,ws,mc): "table" the table's config, "ws" gmm_ws_kernel at 128 x 256 x 64 S=3, "mc"
    this kernel at 128 x 256 x 64 per CTA S=3 (cluster tile 128 x 512), "mc128" at 128 x 128 x 64 per CTA S=5
    (cluster tile 128 x 256), "wsb" and "mcb" ws and mc with the tiles in bands of JGMM_BAND (default 8) row tiles
    (gmm_ws.tile_of's BAND); ms, % of speed of light (H200 ceilings and this GPU's, measured first), speedup vs
    the table, relative difference of the output vs the table's.
python docs/experiments/gmm_ws_multicast.py ptx
    on the CPU (JAX_PLATFORMS=cpu JGMM_TARGET=cuda:90): cross-compiles the kernel for sm_90 on PTX_CASES and prints
    per compiled kernel: `.reqnctapercluster 2`, the multicast TMA loads in the PTX, the setmaxnreg values, ptxas
    (-arch=sm_90a -v) registers and spill bytes, shared memory per CTA; then the largest S that fits per tile.

Design (docs/perf-notes.md, "TMA multicast: what it takes"; the FP8 port, commit b2d4832,
docs/experiments/gmm_fp8_ws_multicast.py and multicast_notes.md, whose mechanics this follows):
- A cluster of 2 CTAs takes a cluster tile of 128 rows (one row tile of gmm_ws's schedule) x 2 BLOCK_N columns:
  CTA r (r = %cluster_ctarank) computes output columns [2 BLOCK_N c + BLOCK_N r, + BLOCK_N) with its own rhs tile.
  The lhs halves of a K step (two (64, BLOCK_K) boxes) are the same for both: CTA 0's loader copies them once by
  TMA multicast into both CTAs' shared memory. Operand bytes per FLOP at BLOCK_N = 256: (64 + 256) / (128 x 256)
  instead of gmm_ws's (128 + 256) / (128 x 256), 17% fewer.
- Written at cluster level, as Gluon >= 3.7 has it: each layout's cga_layout says how the CTAs share a tensor. lhs
  halves (64, BLOCK_K): SHARED [[0, 0]], the whole box in both CTAs (tma.async_load(multicast=True): CTA 0 issues
  it with ctaMask 0b11). rhs box of the (G * K, N) view (BLOCK_K, 2 BLOCK_N): COL_SPLIT [[0, 1]], or of the
  transposed (G * N, K) view (2 BLOCK_N, BLOCK_K): ROW_SPLIT [[1, 0]]; each CTA loads its BLOCK_N columns of out.
  Accumulators and output halves (64, 2 BLOCK_N): COL_SPLIT, each CTA 64 x BLOCK_N (gmm_ws's 64 x 256 fp32
  accumulator per consumer warpgroup), stored through the same TMA store (columns past N clipped by the
  descriptor, rows past the tile's by gmm_ws.store_half's clipped descriptor).
- A cluster's second column tile entirely past N (N / BLOCK_N odd) computes on TMA zeros (rhs (G * K, N): columns
  past N) or the next group's rows (rhs transposed), never stored.
- program_id / num_programs count clusters: the persistent grid is min(SMs / 2, cluster tiles), each cluster
  walking cluster tiles t, t + clusters, ... (row tile t // cdiv(N, 2 BLOCK_N), column tile t % cdiv(...)), gmm_ws's
  schedule otherwise. All scalar logic (rows of the tile, halves, stores) is per row tile, the same in both CTAs.
- Barriers, allocated and initialised before warp_specialize (Gluon then fences the inits cluster-wide), three per
  stage as the FP8 port's (Gluon 3.9 waits on a two_ctas barrier in CTA 0 only, so one cluster barrier cannot also
  guard CTA 1's own rhs stage):
  `ready[s]` per CTA, count 1: the loader's expect of the bytes its CTA receives (the lhs halves holding rows,
  multicast by CTA 0, plus its own rhs tile; CTA 1's expect may come after CTA 0's bytes landed: the tx-count goes
  negative and the phase cannot complete before the expect's arrival);
  `empty[s]` per CTA, count 2 (its consumers): its loader waits on it before loading its rhs tile;
  `cluster_empty[s]` two_ctas, one barrier in CTA 0 of count 2 x 2 that all four consumers arrive on (a remote
  arrive from CTA 1): CTA 0's loader waits on it before multicasting into stage s, so no stage of either CTA is
  overwritten before all four consumers released it. CTA 1's consumers release step n - S only after its ready
  phase of n - S completed, so the multicast of step n lands in phase n. The consumers release a stage one step
  late (after the next step's wgmma is issued, warpgroup_mma_wait(1)), as gmm_ws's. The kernel ends with Gluon's
  cluster barrier, so no CTA exits while the other still arrives on its barriers or multicasts into it.
- One loader warp and two consumer warpgroups per CTA, registers as gmm_ws's (launch 168, consumers 232, loader 40);
  shared memory per CTA as gmm_ws's (S stages of a 128 x BLOCK_K lhs tile and a BLOCK_K x BLOCK_N rhs tile, two
  64 x BLOCK_N output halves): 213344 B at 128 x 256 x 64 S=3 (S=4 does not fit), 229784 B at 128 x 128 x 64 S=6
  (the largest S there).
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
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm import ffi
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, consumer_tile, store_half, tile_of

if not hasattr(mbarrier, "allocate_mbarrier"):
  raise ImportError("gmm_ws_multicast.py needs Triton >= 3.7 (Gluon's cluster mbarriers and TMA multicast)")

NUM_WARPS = gmm_ws.NUM_WARPS  # The default partition (consumer 0); 12 warps per CTA in all.
MAXNREG = gmm_ws.MAXNREG  # Registers per thread at launch; the consumers then take 232, the loader 40.
# cga_layout of the cluster-level tensors: the same in both CTAs, split by rows or by columns.
SHARED = [[0, 0]]
ROW_SPLIT = [[1, 0]]
COL_SPLIT = [[0, 1]]
ACC_CGA = gl.constexpr(COL_SPLIT)


@gluon.jit
def _loader(lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K: gl.constexpr,
            N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
            TRANSPOSE_RHS: gl.constexpr, BAND: gl.constexpr):
  """Per stage: waits until this CTA's consumers released it (and in CTA 0 all four, cluster_empty), loads this
  CTA's rhs tile, and in CTA 0 multicasts the lhs halves holding rows of the group into both CTAs; ready expects
  the bytes this CTA receives."""
  half: gl.constexpr = lhs_desc.nbytes_per_cta  # A whole (64, BLOCK_K) half in each CTA.
  base: gl.constexpr = rhs_desc.nbytes_per_cta
  cluster_n: gl.constexpr = 2 * BLOCK_N
  num_nc: gl.constexpr = (N + cluster_n - 1) // cluster_n
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_nc, gl.num_programs(0)):
    g, row0, rows, _, nc = tile_of(schedule_ptr, t, num_nc, R_MAX, BAND)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        mbarrier.wait(cluster_empty.index(slot), phase)  # CTA 0 only (Gluon: a two_ctas barrier's wait).
        ready_bar = ready.index(slot)
        mbarrier.expect(ready_bar, base + 2 * half, pred=rows > HALF)
        mbarrier.expect(ready_bar, base + half, pred=rows <= HALF)
        tma.async_load(lhs_desc, [row0, kk * BLOCK_K], ready_bar, a_bufs.index(2 * slot), multicast=True)
        tma.async_load(lhs_desc, [row0 + HALF, kk * BLOCK_K], ready_bar, a_bufs.index(2 * slot + 1),
                       pred=rows > HALF, multicast=True)
        if TRANSPOSE_RHS:
          tma.async_load(rhs_desc, [g * N + nc * cluster_n, kk * BLOCK_K], ready_bar, b_bufs.index(slot))
        else:
          tma.async_load(rhs_desc, [g * K + kk * BLOCK_K, nc * cluster_n], ready_bar, b_bufs.index(slot))
        step += 1


@gluon.jit
def _release(empty, cluster_empty, slot, pred):
  """A consumer is done with stage slot (if pred): its CTA's empty barrier and CTA 0's cluster_empty."""
  mbarrier.arrive(empty.index(slot), pred=pred)
  mbarrier.arrive(cluster_empty.index(slot), pred=pred)


@gluon.jit
def reduce_steps(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, k_steps, S: gl.constexpr,
                 TRANSPOSE_RHS: gl.constexpr, H: gl.constexpr):
  """acc + consumer H's products over k_steps stages from `step` on (gmm_ws's main loop), each stage released one
  step late on both its barriers (_release)."""
  for kk in range(k_steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    b = b_bufs.index(slot)
    if TRANSPOSE_RHS:
      b = b.permute((1, 0))
    acc = warpgroup_mma(a_bufs.index(2 * slot + H), b, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    _release(empty, cluster_empty, (step + kk + S - 1) % S, kk > 0)  # The previous step's stage.
  acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
  _release(empty, cluster_empty, (step + k_steps - 1) % S, True)
  return acc


@gluon.jit
def release_steps(ready, empty, cluster_empty, step, k_steps, S: gl.constexpr):
  """gmm_ws.release_stages on both barriers: a consumer whose half holds no row keeps its phases in step."""
  for kk in range(k_steps):
    slot = (step + kk) % S
    mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
    _release(empty, cluster_empty, slot, True)


@gluon.jit
def _consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K: gl.constexpr,
              N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr):
  """gmm_ws's consumer H (rows [64 H, 64 H + 64) of the tile) with a cluster-level (64, 2 BLOCK_N) accumulator,
  64 x BLOCK_N in each CTA."""
  cluster_n: gl.constexpr = 2 * BLOCK_N
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16], cga_layout=ACC_CGA)
  num_nc: gl.constexpr = (N + cluster_n - 1) // cluster_n
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, cluster_n], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_nc, gl.num_programs(0)):
    _, row, rows, half_rows, half_store, nc = consumer_tile(schedule_ptr, t, num_nc, R_MAX, H, BAND)
    acc = gl.zeros((HALF, cluster_n), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      acc = reduce_steps(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, k_steps, S, TRANSPOSE_RHS, H)
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_steps(ready, empty, cluster_empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, nc * cluster_n, half_store, N, cluster_n, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def allocate_cluster(lhs_desc, rhs_desc, out_ptr, OUT_BOX: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr):
  """A cluster kernel's shared memory (gmm_ws.allocate's, at cluster level): S stages of two lhs boxes and one rhs
  box, an output box OUT_BOX per consumer, and the stages' three barriers (the module docstring's protocol)."""
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [2 * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2] + OUT_BOX, OUT_LAYOUT)
  ready = mbarrier.allocate_mbarrier(batch=S)
  empty = mbarrier.allocate_mbarrier(batch=S)
  cluster_empty = mbarrier.allocate_mbarrier(batch=S, two_ctas=True)
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=2)  # This CTA's consumers.
    mbarrier.init(cluster_empty.index(s), count=2)  # x 2 CTAs (Gluon doubles a two_ctas barrier's count).
  return a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty


@gluon.jit
def gmm_ws_mc_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                     R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                     TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr = 1):
  """Launched with num_ctas = 2 and MAXNREG registers. lhs_desc over lhs (M, K), box (64, BLOCK_K), cga SHARED;
  rhs_desc over rhs viewed (G * K, N), box (BLOCK_K, 2 BLOCK_N), cga COL_SPLIT, or (G * N, K), box
  (2 BLOCK_N, BLOCK_K), cga ROW_SPLIT; out (M, N) through out_ptr and descriptors made here (box (64, 2 BLOCK_N),
  OUT_LAYOUT with cga COL_SPLIT). schedule_ptr: gmm_ws's schedule of 128-row tiles."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty = allocate_cluster(lhs_desc, rhs_desc, out_ptr,
                                                                       [HALF, 2 * BLOCK_N], S, OUT_LAYOUT)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND)),
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND)),
      (_loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K, N, R_MAX, BLOCK_N,
                 BLOCK_K, S, TRANSPOSE_RHS, BAND)),
  ], [4, 1], [232, 40])


def _layout(block, dtype_name, cga_layout):
  """The shared layout of a cluster-level box of dtype_name (gmm_ws.shared_layout's, with a cga_layout)."""
  dtype = {"bfloat16": gl.bfloat16, "float16": gl.float16}[dtype_name]
  return gl.NVMMASharedLayout.get_default_for(list(block), dtype, cga_layout=cga_layout)


def _gmm_ws_mc(lhs, rhs, bounds, transpose_rhs, out_dtype, config, device, band=1):
  """backend_triton._gmm_ws's signature and result through gmm_ws_mc_kernel: 128-row tiles by config.block_n (128
  or 256) columns per CTA (twice that per cluster) by config.block_k, num_stages S as config's, clusters of 2 CTAs,
  a persistent grid of min(SMs // 2, cluster tiles) clusters; band: gmm_ws.tile_of's BAND (cluster tiles in bands
  of `band` row tiles)."""
  from jgmm import backend_triton
  if config.block_m != gmm_ws.BLOCK_M or config.block_n not in (128, 256):
    raise ValueError(f"gmm_ws_mc_kernel takes 128 x 128 or 128 x 256 tiles per CTA, got config {config}")
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  row_tiles = geometry.cdiv(m, gmm_ws.BLOCK_M) + num_groups + 1
  cluster_n = 2 * config.block_n
  lhs_block = (HALF.value, config.block_k)
  rhs_view, rhs_block, rhs_cga = ((num_groups * n, k), (cluster_n, config.block_k), ROW_SPLIT) if transpose_rhs else (
      (num_groups * k, n), (config.block_k, cluster_n), COL_SPLIT)
  out_block = (HALF.value, cluster_n)
  tiles = row_tiles * geometry.cdiv(n, cluster_n)
  # Clusters resident at once may be fewer than SMs / 2 (cuOccupancyMaxActiveClusters; GPCs of odd SM counts):
  # JGMM_MC_CLUSTERS=60 (say) sizes the persistent grid instead, so that no cluster runs in a second wave.
  clusters = int(os.environ.get("JGMM_MC_CLUSTERS", device.num_sms // 2))
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=_layout(lhs_block, lhs.dtype.name, SHARED)),
      ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block, layout=_layout(rhs_block, rhs.dtype.name, rhs_cga)),
      backend_triton._row_tiles(bounds, m, row_tiles, gmm_ws.BLOCK_M), m,
      kernel=gmm_ws_mc_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(clusters, tiles),), num_ctas=2,
      num_warps=NUM_WARPS, maxnreg=MAXNREG, name="jgmm_gmm_ws_mc",
      K=k, N=n, R_MAX=row_tiles, BLOCK_N=config.block_n, BLOCK_K=config.block_k, S=config.num_stages,
      TRANSPOSE_RHS=transpose_rhs, OUT_LAYOUT=_layout(out_block, jnp.dtype(out_dtype).name, COL_SPLIT), BAND=band)


# ---------------------------------------------------------------------------------------------------------------
# CLI: `check` (GPU correctness against backend="xla"), `time` (GPU A/B), `ptx` (CPU cross-compilation).

def ws_config(block_n=256, stages=3):
  """The warp-specialised config of 128 x block_n x 64 tiles, `stages` stages (gmm_ws's, or this kernel's per CTA
  under Launches)."""
  from jgmm.config import Config
  return Config(block_m=128, block_n=block_n, block_k=64, num_warps=8, num_stages=stages, warp_specialized=True)


MC_CONFIGS = {256: ws_config(256, 3), 128: ws_config(128, 5)}  # `check` and `time`'s mc, mc128.
SMEM_LIMIT = 232448  # sm_90's shared memory per CTA (227 KB).


def smem_bytes(block_n, stages, block_k=64):
  """Shared memory per CTA of this kernel (bf16 in and out) at 128 x block_n x block_k, `stages` stages: the stages'
  lhs and rhs tiles, two 64 x block_n output halves, 3 S mbarriers (Triton's count, which `ptx` prints, is 280 B
  more)."""
  return stages * (128 * block_k + block_k * block_n) * 2 + 2 * 64 * block_n * 2 + 3 * stages * 8


def max_stages(block_n, block_k=64):
  """The largest S whose shared memory fits SMEM_LIMIT."""
  return max(s for s in range(1, 16) if smem_bytes(block_n, s, block_k) <= SMEM_LIMIT)


class Launches:
  """mock.patch of backend_triton._gmm_ws by this kernel's launcher, counting the launches it builds (a shape that
  gmm_ws does not take runs another kernel: the check would then test that one)."""

  def __init__(self, launcher=None):
    self.count = 0
    self._launcher = launcher or _gmm_ws_mc

  def _launch(self, *args):
    self.count += 1
    return self._launcher(*args)

  def __enter__(self):
    from unittest import mock
    from jgmm import backend_triton
    self._patch = mock.patch.object(backend_triton, "_gmm_ws", self._launch)
    self._patch.__enter__()
    return self

  def __exit__(self, *exc):
    return self._patch.__exit__(*exc)


# (M, K, N, transpose_rhs, BLOCK_N per CTA). Group sizes SIZES (group_offset 1: rows [0, 37) before the groups,
# rows [888, M) after them; an empty group; tiles of 128 rows holding 44, 40, 27 and 36 + 64 rows: partial halves,
# a half of none). N / 256: 2 (one cluster column tile), 3 (the second cluster's CTA 1 entirely past N), 2.5; at
# BLOCK_N 128, N / 128 = 3. K = 72: a partial step (rhs transposed only: gmm_ws takes K % BLOCK_K != 0 only then),
# K = 64: one step.
CHECK_CASES = [(1000, 4096, 512, False, 256), (1000, 4096, 512, True, 256), (1000, 4096, 768, False, 256),
               (1000, 4096, 768, True, 256), (1000, 4096, 640, False, 256), (1000, 4096, 640, True, 256),
               (1000, 72, 768, True, 256), (1000, 64, 768, False, 256), (1000, 4096, 384, False, 128),
               (1000, 4096, 384, True, 128), (1000, 72, 384, True, 128)]
SIZES = [37, 300, 0, 40, 411, 100]


def case_args(m, k, n, transpose_rhs, seed=0):
  """(lhs, rhs, group_sizes) of a check case: bf16 normal values scaled so that out is O(1)."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  lhs = (jax.random.normal(k1, (m, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
  groups = len(SIZES) - 1
  rhs = jax.random.normal(k2, (groups, n, k) if transpose_rhs else (groups, k, n), jnp.bfloat16)
  return lhs, rhs, jnp.asarray(SIZES, jnp.int32)


def product(transpose_rhs, backend, config=None, out_dtype=jnp.bfloat16):
  """jgmm.gmm of (lhs, rhs, group_sizes) with group_offset 1 on `backend`."""
  import jgmm
  return lambda lhs, rhs, sizes: jgmm.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs, group_offset=1,
                                          preferred_element_type=out_dtype, config=config, backend=backend)


def check(configs=None, launches_of=None, sizes=SIZES):
  """Each of CHECK_CASES on the GPU with this kernel patched in, against backend="xla" with float32 out: relative
  error (Frobenius, as the repository's GPU tests) and PASS (< 1e-2, their bf16 bound, this kernel launched, rows
  outside the groups zeros in both) or FAIL. configs {BLOCK_N: Config} and launches_of (a Launches class) default
  to this file's; sizes: the group sizes (as many as SIZES; gmm_ws_multicast_rhs.py passes its own of each)."""
  configs, launches_of = configs or MC_CONFIGS, launches_of or Launches
  from jgmm import oracle
  print(jax.devices()[0].device_kind, flush=True)
  failed = 0
  start = time.time()
  for m, k, n, transpose_rhs, block_n in CHECK_CASES:
    args = (*case_args(m, k, n, transpose_rhs)[:2], jnp.asarray(sizes, jnp.int32))
    ref = np.asarray(jax.jit(product(transpose_rhs, "xla", out_dtype=jnp.float32))(*args), np.float32)
    with launches_of() as launches:
      f = jax.jit(product(transpose_rhs, "triton", configs[block_n])).trace(*args).lower().compile()
    out = np.asarray(f(*args), np.float32)
    first, last = sizes[0], sum(sizes)
    zeros = all(np.all(x[:first] == 0) and np.all(x[last:] == 0) for x in (out, ref))
    err = oracle.rel_err(out, ref) if np.all(np.isfinite(out)) else float("inf")
    ok = err < 1e-2 and zeros and launches.count == 1
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'} M={m} K={k} N={n} transpose_rhs={transpose_rhs} BLOCK_N={block_n} "
          f"(N/BLOCK_N={n / block_n:g}): rel error {err:.2e}, rows outside the groups zeros: {zeros}, "
          f"launches of this kernel: {launches.count}", flush=True)
  print(f"{'ALL PASS' if not failed else f'{failed} FAILED'} in {time.time() - start:.0f} s")
  return failed


TIME_CASES = ("mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down")


def time_ab(names=TIME_CASES, variants=("table", "ws", "mc"), more_configs=None, more_launchers=None):
  """ws_ab.py's A/B of backend_triton.gmm (precomputed bounds, bf16 out) with `variants` (see the module's
  docstring), forward and d lhs, timed interleaved: a markdown table at the end. more_configs {variant: Config} and
  more_launchers {variant: Launches class} add another file's kernels (gmm_ws_multicast_rhs.py's)."""
  from jgmm import backend_triton
  band = int(os.environ.get("JGMM_BAND", 8))
  launchers = {"mc": Launches, "mc128": Launches, "mcb": lambda: Launches(functools.partial(_gmm_ws_mc, band=band)),
               "wsb": lambda: Launches(functools.partial(backend_triton._gmm_ws, band=band)), **(more_launchers or {})}
  from jgmm import config_table, oracle
  from jgmm.bench import CASES, Inputs, measure_ceilings, speed_of_light_ms
  from jgmm.ops import group_bounds
  from jgmm.timing import jax_sync, time_interleaved
  ceilings = measure_ceilings()
  print(f"{jax.devices()[0].device_kind}; ceilings measured here: {ceilings[0] / 1e12:.0f} TFLOP/s bf16, "
        f"{ceilings[1] / 1e12:.2f} TB/s", flush=True)
  rows = []
  for name, m, k, n, g in [c for c in CASES if c[0] in names]:
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    for op in ("gmm", "gmm_t"):
      tr = op == "gmm_t"
      lhs = inp.dout if tr else inp.x
      kk, nn = (n, k) if tr else (k, n)
      table = config_table.select(config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=tr),
                                  arch="sm90").config
      configs = {"table": table, "ws": ws_config(), "wsb": ws_config(), "mc": MC_CONFIGS[256], "mcb": MC_CONFIGS[256],
                 "mc128": MC_CONFIGS[128],
                 **(more_configs or {})}
      fns, ref = {}, None
      for variant in variants:
        f = functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=tr,
                              out_dtype=jnp.bfloat16, activation=None, save_preactivation=False,
                              config=configs[variant])
        t0 = time.time()
        try:
          if variant in launchers:
            with launchers[variant]() as launches:
              compiled = jax.jit(f).trace(lhs, inp.w, bounds).lower().compile()
            assert launches.count == 1, f"{variant}: the multicast kernel was not launched"
          else:
            compiled = jax.jit(f).trace(lhs, inp.w, bounds).lower().compile()
          out = compiled(lhs, inp.w, bounds)
          out.block_until_ready()
        except Exception as e:
          print(f"{name} {op} {variant}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
          continue
        o = np.asarray(out, np.float32)
        ref = o if ref is None else ref
        print(f"{name} {op} {variant}: compile+run {time.time() - t0:.1f}s, rel diff vs {variants[0]} "
              f"{oracle.rel_err(o, ref):.2e}", flush=True)
        fns[variant] = (functools.partial(compiled, lhs, inp.w, bounds), jax_sync)
      ms = time_interleaved(fns, min_batch_s=0.05, batches=7)
      sol, sol_here = speed_of_light_ms(m, kk, nn, g), speed_of_light_ms(m, kk, nn, g, *ceilings)
      base = ms.get("table")
      for variant, t in ms.items():
        rows.append((name, op, variant, t, 100 * sol / t, 100 * sol_here / t, base / t if base else float("nan")))
        print(f"{name} {op} {variant}: {t:.3f} ms", flush=True)
  print("\n| case | op | variant | ms | % SOL (H200) | % SOL here | speedup vs table |\n|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f}% | {r[5]:.0f}% | {r[6]:.3f} |")


# (M, K, N, transpose_rhs, BLOCK_N, S): the check's groups (M = 900: 3 groups of 300 rows, SIZES-like rows outside
# in `check` only), N / 256 = 2, 1.5, 2.5 and N / 128 = 3; K 4096 and 72 (rhs transposed); the largest S per tile.
PTX_CASES = [(900, 4096, 512, False, 256, 3), (900, 4096, 512, True, 256, 3), (900, 4096, 384, False, 256, 3),
             (900, 4096, 384, True, 256, 3), (900, 4096, 640, False, 256, 3), (900, 4096, 640, True, 256, 3),
             (900, 72, 640, True, 256, 3), (900, 4096, 384, False, 128, 5), (900, 4096, 384, True, 128, 5),
             (900, 4096, 384, False, 128, max_stages(128)), (900, 72, 384, True, 128, 5)]


def ptx_report():
  """Cross-compiles each of PTX_CASES for sm_90 (CPU, JGMM_TARGET=cuda:90): contiguous groups of 300 rows through
  jgmm.gmm with this kernel patched in; one line per compiled kernel, then the largest S per tile."""
  import re
  import subprocess
  import tempfile
  import triton
  import jgmm
  from jgmm.ffi import _compile
  bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  # Triton 3.9 bundles CUDA 12.8's ptxas and CUDA 13.4's (ptxas-blackwell); only the latter reads PTX ISA 9.0.
  ptxas = next(p for p in (f"{bin_dir}/ptxas-blackwell", f"{bin_dir}/ptxas") if os.path.exists(p))
  for m, k, n, transpose_rhs, block_n, stages in PTX_CASES:
    groups = m // 300
    lhs = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((groups, n, k) if transpose_rhs else (groups, k, n), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)
    _compile._cache.clear()
    f = functools.partial(jgmm.gmm, transpose_rhs=transpose_rhs, config=ws_config(block_n, stages), backend="triton")
    with Launches() as launches:
      jax.jit(f).trace(lhs, rhs, sizes).lower(lowering_platforms=("cuda",))
    kernels = [c for key, c in _compile._cache.items() if key[0] is gmm_ws_mc_kernel]
    what = f"M={m} K={k} N={n} transpose_rhs={transpose_rhs} BLOCK_N={block_n} (N/BLOCK_N={n / block_n:g}) S={stages}"
    if launches.count != 1 or len(kernels) != 1:
      print(f"{what}: NOT COMPILED (launches {launches.count}, kernels {len(kernels)})", flush=True)
      continue
    (compiled,) = kernels
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
      with open(f"{d}/k.ptx", "w") as fh:
        fh.write(ptx)
      info = subprocess.run([ptxas, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                            capture_output=True, text=True).stderr
    used = re.search(r"Used (\d+) registers", info)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    warnings = [line for line in info.splitlines() if "C75" in line or "arning" in line or "rror" in line]
    print(f"{what}: reqnctapercluster 2: {'.reqnctapercluster 2' in ptx}, "
          f"multicast loads: {len(re.findall(r'bulk.tensor.*multicast::cluster', ptx))}, "
          f"setmaxnreg: {sorted(set(re.findall(r'setmaxnreg.(?:inc|dec).sync.aligned.u32\s+(\d+)', ptx)))}, "
          f"ptxas registers: {used and used.group(1)}, spills (stores, loads): {spills}, "
          f"shared memory per CTA: {compiled.shared_mem_bytes} B (formula {smem_bytes(block_n, stages)}), "
          f"warps {compiled.num_warps}, ctas {compiled.num_ctas}" + (f", ptxas: {warnings}" if warnings else ""),
          flush=True)
  for block_n in (256, 128):
    s = max_stages(block_n)
    print(f"largest S at 128 x {block_n} x 64 per CTA: {s} ({smem_bytes(block_n, s)} B of {SMEM_LIMIT}; S={s + 1}: "
          f"{smem_bytes(block_n, s + 1)} B)")


if __name__ == "__main__":
  if sys.argv[1:2] == ["ptx"]:
    ptx_report()
  elif sys.argv[1:2] == ["check"]:
    sys.exit(1 if check() else 0)
  elif sys.argv[1:2] == ["time"]:
    time_ab(*(tuple(arg.split(",")) for arg in sys.argv[2:4]))
  else:
    print(__doc__)
