"""A/B (issue 17, session 46): gmm_ws_kernel whose two consumers run a few K steps apart.

Session 45 put the warp-specialised forward's largest loss at the tile boundary: the tensor pipe idles ~2600 cycles
from a tile's last wgmma to the next tile's first (4% of mixtral's 64-step tiles, 8% of dsv3 down's 32-step ones).
Both consumers reach it at once: they wait on the same stages, so they finish a tile together, and both convert,
store and set up the next tile while nothing is issued. Session 46's held stores (`deferred4` below; the whole-half
variant, 678ad35) moved the stores under the next tile's wgmmas and gained ~1% of active cycles, no time.

Here consumer 1 starts LAG K steps after consumer 0 (a one-time mbarrier: consumer 0 arrives once it has issued its
LAG-th step). Nothing else holds the lag: consumer 0 reaches each boundary first, and while it stores and sets up
the next tile consumer 1 still has steps to issue, alone on the tensor pipe (one warpgroup's m64n256 wgmmas can
fill it: CUTLASS's ping-pong runs one at a time); then consumer 0 starts the next tile while consumer 1 is in its
boundary. The stages bound the lag: consumer 0 runs at most S - 1 steps ahead, less the loads' latency. Floor: the
pipe busy for the lag's steps at twice a consumer's shared rate (~500 cycles a step) of each ~2600-cycle boundary,
+1% (mixtral) and +2% (down) a step of lag, if the consumers' ready waits do not cost more than that.

Kernels ("ws" is gmm_ws_kernel as the table runs it):
  ws_lag1, ws_lag2    gmm_ws's consumers, consumer 1 LAG steps behind (the config's 3 stages)
  deferred4           consumers that hold a finished half in registers and store its lower 128 columns under the
                      next tile's first step, its upper ones under the second, through 64 x 128 buffers, which leave
                      room for a fourth stage (229704 B)
  deferred4_lag2, deferred4_lag3   deferred4 with consumer 1 LAG steps behind (4 stages)
Each is gmm_ws_kernel with the consumer changed (one-CTA only), launched through backend_triton's own gmm_ws path
with gmm_ws.gmm_ws_kernel patched while the call is traced.

    JAX_PLATFORMS=cpu python docs/experiments/consumer_skew_ab.py sass     (on the CPU: ptxas's registers, spills and
        C75xx warnings, and the sequence of HGMMAs (H), wgmma waits (wN), STSM stores (S) and TMA stores (T) of each
        kernel, mixtral's forward tiling)
    python docs/experiments/consumer_skew_ab.py check                      (GPU: outputs bit-identical to gmm_ws's)
    python docs/experiments/consumer_skew_ab.py time [CASE,...]            (GPU: interleaved, forward and d lhs)
    [SECONDS=1] python docs/experiments/consumer_skew_ab.py sustained [CASE,...]
    SCRIPT=docs/experiments/consumer_skew_ab.py bash docs/experiments/grid_l2.sh ncu [CASE,...]   (GPU: the tensor
        pipe's share of active cycles of each kernel, ncu with clocks locked)
"""
import dataclasses
import functools
import os
import statistics
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, sustained_runs, time_interleaved
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, consumer_tile, release_stages, store_half


@gluon.jit
def rhs_tile(b_bufs, slot, TRANSPOSE_RHS: gl.constexpr):
  """Stage slot's rhs tile as wgmma's (BLOCK_K, BLOCK_N) operand."""
  b = b_bufs.index(slot)
  if TRANSPOSE_RHS:
    b = b.permute((1, 0))
  return b


@gluon.jit
def column_half(x, UPPER: gl.constexpr):
  """Columns [0, n / 2) (or [n / 2, n) where UPPER) of x (rows, n). In a wgmma accumulator's layout every thread
  holds columns all along n, so this moves no data between threads (session 19's store_quarters, cf37df9)."""
  lower, upper = gl.split(gl.permute(gl.reshape(x, [x.shape[0], 2, x.shape[1] // 2]), [0, 2, 1]))
  return upper if UPPER else lower


@gluon.jit
def store_part(out_ptr, out_desc, c_buf, held, row, col, rows, N: gl.constexpr, BLOCK_N: gl.constexpr,
               OUT_LAYOUT: gl.constexpr, PART: gl.constexpr):
  """The held half (64, BLOCK_N), already in the output dtype: its columns' lower or upper half (PART 0 or 1) to out
  rows [row, row + rows) if it has rows to store (gmm_ws.store_half through c_buf)."""
  if rows > 0:
    store_half(out_ptr, out_desc, c_buf, column_half(held, PART), row, col + PART * (BLOCK_N // 2), rows, N,
               BLOCK_N // 2, OUT_LAYOUT)


@gluon.jit
def mma_step(a_bufs, b_bufs, ready, skew, acc, step, H: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr,
             LAG: gl.constexpr, USE_ACC: gl.constexpr = True):
  """Waits for stage `step`'s bytes and issues its wgmmas on consumer H's lhs half (async; USE_ACC False: acc's
  values are not read, the product overwrites them); consumer 0 then arrives on skew if this is its step LAG."""
  slot = step % S
  mbarrier.wait(ready.index(slot), (step // S) & 1)
  acc = warpgroup_mma(a_bufs.index(2 * slot + H), rhs_tile(b_bufs, slot, TRANSPOSE_RHS), acc, use_acc=USE_ACC,
                      is_async=True)
  if LAG > 0 and H == 0:
    mbarrier.arrive(skew, pred=step == LAG)
  return acc


@gluon.jit
def skew_start(skew, LAG: gl.constexpr, H: gl.constexpr):
  """Consumer 1 waits until consumer 0 has issued its step LAG (or ended with fewer)."""
  if LAG > 0 and H == 1:
    mbarrier.wait(skew, 0)


@gluon.jit
def skew_end(skew, steps, LAG: gl.constexpr, H: gl.constexpr):
  """Consumer 0's arrival where its `steps` steps never reached step LAG (so that consumer 1 does not wait forever)."""
  if LAG > 0 and H == 0:
    mbarrier.arrive(skew, pred=steps <= LAG)


@gluon.jit
def skewed_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew, K: gl.constexpr,
                    N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                    S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
                    BAND: gl.constexpr, LAG: gl.constexpr):
  """gmm_ws.consumer (one CTA), consumer 1 starting LAG steps after consumer 0."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  skew_start(skew, LAG, H)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H, BAND)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      for kk in range(k_steps):
        acc = mma_step(a_bufs, b_bufs, ready, skew, acc, step + kk, H, S, TRANSPOSE_RHS, LAG)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((step + kk + S - 1) % S), pred=kk > 0)  # The previous step's stage.
      acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
      mbarrier.arrive(empty.index((step + k_steps - 1) % S))
    elif rows > 0:  # The other half has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK_N, half_store, N, BLOCK_N, OUT_LAYOUT)
  skew_end(skew, step, LAG, H)
  tma.store_wait(pendings=0)


@gluon.jit
def deferred_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew, K: gl.constexpr,
                      N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                      S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
                      BAND: gl.constexpr, LAG: gl.constexpr):
  """gmm_ws.consumer (one CTA) with each tile's half held in registers, in the output dtype, its lower columns stored
  after the next tile's first K step is issued and its upper ones after the second (through a 64 x BLOCK_N / 2
  buffer: room for a fourth stage); at once where this consumer has no MMAs in the next tile, and at the end. The
  first step overwrites the accumulator (use_acc=False) instead of adding to zeros written before it. Consumer 1
  starts LAG steps after consumer 0."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  out_dtype: gl.constexpr = out_ptr.dtype.element_ty
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  peeled: gl.constexpr = 2 if k_steps > 1 else 1  # K steps issued before the loop.
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N // 2], OUT_LAYOUT)
  c_buf = c_bufs.index(H)
  held = gl.zeros((HALF, BLOCK_N), dtype=out_dtype, layout=acc_layout)
  held_row = 0
  held_col = 0
  held_rows = 0
  acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
  skew_start(skew, LAG, H)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H, BAND)
    if half_rows > 0:
      acc = mma_step(a_bufs, b_bufs, ready, skew, acc, step, H, S, TRANSPOSE_RHS, LAG, USE_ACC=False)
      store_part(out_ptr, out_desc, c_buf, held, held_row, held_col, held_rows, N, BLOCK_N, OUT_LAYOUT, 0)
      acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # Step 0's wgmmas stay in flight.
      if peeled == 2:
        acc = mma_step(a_bufs, b_bufs, ready, skew, acc, step + 1, H, S, TRANSPOSE_RHS, LAG)
        store_part(out_ptr, out_desc, c_buf, held, held_row, held_col, held_rows, N, BLOCK_N, OUT_LAYOUT, 1)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index(step % S))
      else:  # A one-step K: the upper columns at once.
        store_part(out_ptr, out_desc, c_buf, held, held_row, held_col, held_rows, N, BLOCK_N, OUT_LAYOUT, 1)
      for kk in range(peeled, k_steps):
        acc = mma_step(a_bufs, b_bufs, ready, skew, acc, step + kk, H, S, TRANSPOSE_RHS, LAG)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((step + kk - 1) % S))  # The previous step's stage.
      acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
      mbarrier.arrive(empty.index((step + k_steps - 1) % S))
    else:
      acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)  # Zeros to store, if any.
      for part in gl.static_range(2):
        store_part(out_ptr, out_desc, c_buf, held, held_row, held_col, held_rows, N, BLOCK_N, OUT_LAYOUT, part)
      if rows > 0:  # The other half has rows: keep in step with the stages it consumes.
        release_stages(ready, empty, step, k_steps, S)
    if rows > 0:
      step += k_steps
    held = acc.to(out_dtype)
    held_row = row
    held_col = ni * BLOCK_N
    held_rows = half_store
  for part in gl.static_range(2):
    store_part(out_ptr, out_desc, c_buf, held, held_row, held_col, held_rows, N, BLOCK_N, OUT_LAYOUT, part)
  skew_end(skew, step, LAG, H)
  tma.store_wait(pendings=0)


@gluon.jit
def consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew, K: gl.constexpr, N: gl.constexpr,
             R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
             TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr,
             DEFERRED: gl.constexpr, LAG: gl.constexpr):
  """deferred_consumer where DEFERRED, else skewed_consumer."""
  if DEFERRED:
    deferred_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew, K, N, R_MAX, BLOCK_N,
                      BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, H, BAND, LAG)
  else:
    skewed_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew, K, N, R_MAX, BLOCK_N,
                    BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, H, BAND, LAG)


@gluon.jit
def skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr,
              BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr,
              OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr, DEFERRED: gl.constexpr, LAG: gl.constexpr):
  """gmm_ws_kernel's body with skewed_consumer's consumers (or deferred_consumer's, with output buffers of BLOCK_N / 2
  columns, where DEFERRED) and the skew mbarrier."""
  a_bufs, b_bufs, c_bufs, ready, empty = gmm_ws.allocate_boxes(
      lhs_desc.dtype, gl.constexpr(lhs_desc.block_type.shape), gl.constexpr(lhs_desc.layout), rhs_desc.dtype,
      gl.constexpr(rhs_desc.block_type.shape), gl.constexpr(rhs_desc.layout), out_ptr.dtype.element_ty,
      BLOCK_N // 2 if DEFERRED else BLOCK_N, S, OUT_LAYOUT)
  skew = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
  mbarrier.init(skew.index(0), count=1)
  gl.warp_specialize([
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew.index(0), K, N, R_MAX,
                  BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND, DEFERRED, LAG)),
      (consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, skew.index(0), K, N, R_MAX,
                  BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND, DEFERRED, LAG)),
      (gmm_ws.loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N,
                       BLOCK_K, S, TRANSPOSE_RHS, BAND, 1)),
  ], [4, 1], [232, 40])


# The kernels: gmm_ws_kernel's parameters, skew_body's DEFERRED and LAG fixed.
@gluon.jit
def gmm_ws_lag1_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                       R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                       TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K, N, R_MAX, BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS,
            OUT_LAYOUT, BAND, False, 1)


@gluon.jit
def gmm_ws_lag2_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                       R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                       TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K, N, R_MAX, BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS,
            OUT_LAYOUT, BAND, False, 2)


@gluon.jit
def deferred4_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                     R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                     TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K, N, R_MAX, BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS,
            OUT_LAYOUT, BAND, True, 0)


@gluon.jit
def deferred4_lag2_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                          R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                          TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K, N, R_MAX, BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS,
            OUT_LAYOUT, BAND, True, 2)


@gluon.jit
def deferred4_lag3_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                          R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                          TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  skew_body(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K, N, R_MAX, BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS,
            OUT_LAYOUT, BAND, True, 3)


WS8 = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True, band_tiles=8)
# label: (kernel, stages: None for the config's)
KERNELS = {"ws": (gmm_ws.gmm_ws_kernel, None), "ws_lag1": (gmm_ws_lag1_kernel, None),
           "ws_lag2": (gmm_ws_lag2_kernel, None), "deferred4": (deferred4_kernel, 4),
           "deferred4_lag2": (deferred4_lag2_kernel, 4), "deferred4_lag3": (deferred4_lag3_kernel, 4)}
HALF_BUFFERS = (deferred4_kernel, deferred4_lag2_kernel, deferred4_lag3_kernel)


def traced(label, lhs, rhs, bounds, transpose, config, lower=False):
  """backend_triton.gmm (bf16 out) jitted with `config` (KERNELS[label]'s stages), gmm_ws_kernel replaced by
  KERNELS[label]'s kernel while it is traced and compiled (lower: lowered for CUDA only, on a CPU machine); the
  jitted call."""
  kernel, stages = KERNELS[label]
  config = dataclasses.replace(config, num_stages=stages or config.num_stages)
  f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose,
                                out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
  whole_buffers_ok = geometry.gmm_ws_ok

  def half_buffers_ok(*args):  # deferred_consumer's output buffers: 64 x BLOCK_N / 2 a consumer, not x BLOCK_N.
    *rest, block_n, block_k, num_stages, shared_memory = args
    return whole_buffers_ok(*rest, block_n, block_k, num_stages, shared_memory + 64 * block_n * 2)

  with (mock.patch.object(gmm_ws, "gmm_ws_kernel", kernel),
        mock.patch.object(geometry, "gmm_ws_ok", half_buffers_ok if kernel in HALF_BUFFERS else
                          whole_buffers_ok)):
    if lower:
      f.trace(lhs, rhs, bounds).lower(lowering_platforms=("cuda",))
    else:
      jax.block_until_ready(f(lhs, rhs, bounds))
  return f


def sass():
  """Each kernel compiled for sm_90 at mixtral's forward (bands of 8): sass_wgmma.report's lines, stores too."""
  os.environ["JGMM_TARGET"] = "cuda:90"  # Lowered for sm_90 on a CPU machine (backend_triton reads it per call).
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import sass_wgmma  # pylint: disable=import-outside-toplevel
  from jgmm.ffi import _compile
  s = jax.ShapeDtypeStruct
  m, k, n, g = 8192, 4096, 14336, 8
  for label in KERNELS:
    _compile._cache.clear()
    traced(label, s((m, k), jnp.bfloat16), s((g, k, n), jnp.bfloat16), s((g + 1,), jnp.int32), False, WS8,
           lower=True)
    (compiled,) = _compile._cache.values()
    sass_wgmma.report(label, compiled, *sass_wgmma.assemble(compiled), stores=True)


def check():
  """Each kernel's outputs against gmm_ws_kernel's, bit for bit: empty groups, a group of one row, groups ending
  mid-tile, both rhs layouts, rows outside the groups (zeros), bands of 1 and 8, a tile count that is not a multiple
  of the grid."""
  rng = np.random.default_rng(0)
  failed = 0
  for m, k, n, sizes, band in ((512, 128, 256, [0, 200, 1, 0, 250], 1), (1000, 256, 384, [300, 0, 129, 64], 8),
                               (4096, 512, 1024, [1000, 0, 2000, 37, 600], 8), (640, 64, 256, [640], 1)):
    g = len(sizes)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, g, m)
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                    band_tiles=band)
    for transpose in (False, True):
      rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose else (g, k, n)), jnp.bfloat16)
      outs = {label: np.asarray(traced(label, lhs, rhs, bounds, transpose, config)(lhs, rhs, bounds), np.float32)
              for label in KERNELS}
      differ = [label for label, out in outs.items() if not np.array_equal(out, outs["ws"])]
      failed += len(differ)
      print(f"m {m} k {k} n {n} sizes {sizes} band {band} transpose {transpose}: "
            f"{'DIFFERENT: ' + ', '.join(differ) if differ else 'identical'}", flush=True)
  print("PASS" if not failed else f"FAIL ({failed} cases differ)")


def calls(names):
  """(case, product, kernel label, call) for the forward ("fwd") and d lhs ("dlhs") of each named case and each
  kernel, at the table's gmm_ws config (bands of 8 where the table's is not the one-CTA warp-specialised kernel),
  compiled."""
  device = backend_triton._device()
  for case in [c for c in CASES if c[0] in names]:
    name, m, k, n, g = case
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    for product, lhs, kk, nn, transpose in (("fwd", inp.x, k, n, False), ("dlhs", inp.dout, n, k, True)):
      key = config_table.make_key("gmm_t" if transpose else "gmm", "bfloat16", "bfloat16", m / g, kk, nn, g,
                                  transpose=transpose)
      table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
      config = table if table.warp_specialized and table.cluster_size == 1 else WS8
      for label in KERNELS:
        yield case, product, label, functools.partial(traced(label, lhs, inp.w, bounds, transpose, config), lhs,
                                                      inp.w, bounds)


def timed(mode, names):
  """calls' kernels interleaved (or sustained, each alone), per case and product: ms and speedup over gmm_ws."""
  groups = {}
  for (name, m, k, n, g), product, label, call in calls(names):
    groups.setdefault((name, m, k, n, g, product), {})[label] = (call, jax_sync)
  rows = []
  for (name, m, k, n, g, product), fns in groups.items():
    if mode == "sustained":
      ms = {label: statistics.median(run.ms for run in runs)
            for label, runs in sustained_runs(fns, float(os.environ.get("SECONDS", 1)), rounds=3).items()}
    else:
      ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
    kk, nn = (n, k) if product == "dlhs" else (k, n)
    sol = speed_of_light_ms(m, kk, nn, g)
    rows += [(f"{name} {product} {label}", t, 100 * sol / t, ms["ws"] / t) for label, t in ms.items()]
  print(f"\n{backend_triton._device().kind}, {mode}\n| case product kernel | ms | %SOL | speedup vs gmm_ws |\n"
        "|---|---|---|---|")
  for label, t, sol, speedup in rows:
    print(f"| {label} | {t:.3f} | {sol:.0f}% | {speedup:.3f} |")


def profiled(names):
  """Each kernel's forward and d lhs of each case once, between cudaProfilerStart/Stop, in grid_l2.py's output
  lines (for grid_l2.sh's table of the tensor pipe's share of active cycles)."""
  import torch  # pylint: disable=import-outside-toplevel  (its runtime's profiler switch covers the process)
  runs = []
  for (name, m, k, n, _), product, label, call in calls(names):
    runs.append((name, product, label, call))
    print(f"{name}: {m * k * n} FMA", flush=True)
  torch.cuda.synchronize()
  torch.cuda.cudart().cudaProfilerStart()
  for *_, call in runs:
    jax.block_until_ready(call())
  torch.cuda.cudart().cudaProfilerStop()
  for i, (name, product, label, _) in enumerate(runs):
    print(f"profiled {i}: {name} {product} {label}")


if __name__ == "__main__":
  mode = sys.argv[1]
  cases = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mixtral8x7b-w1", "dsv3-ep8-down"]
  if mode == "sass":
    sass()
  elif mode == "check":
    check()
  elif mode == "ncu":
    profiled(cases)
  else:
    timed(mode, cases)
