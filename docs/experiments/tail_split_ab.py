"""A/B (issue 17, session 47): gmm_ws_kernel whose last, partial round of tiles runs as twice as many column halves.

The tile timeline (tile_timeline.py, session 47) put 2.6% of mixtral's forward SM time (1.9% of dsv3 down's) outside
the programs: a persistent grid of P programs runs T tiles in ceil(T / P) rounds, and the last round holds only
T mod P of them (mixtral: 3752 tiles = 28 x 132 + 56, so 76 SMs idle for a tile's time at the end; down: 7672 = 58
x 132 + 16). Here, where 2 (T mod P) <= P, each tile of that last round is split into its two column halves (64 x
BLOCK_N / 2 a consumer: the same stages, the rhs box and the output box half as wide), 2 (T mod P) tiles for the
round, so it ends about half a tile sooner. Floor: mixtral +1.5%, down +0.8% per clock (the half tiles move more
bytes per FMA, but the round runs on under P SMs); sustained less, as idle SMs also draw less power.

The split kernel is gmm_ws_kernel's loader and consumers over the split schedule (split_tile): the wide tiles are
gmm_ws's (gmm_ws.load_stage, tile_product, store_half); a half runs the same three with COLS = BLOCK_N / 2 (the
stage buffers' first BLOCK_N / 2 columns, a shared-memory subview: gmm_ws.rhs_stage), a descriptor of half-wide rhs
boxes and the output buffer's first BLOCK_N / 2 columns.

    JAX_PLATFORMS=cpu python docs/experiments/tail_split_ab.py sass   (CPU: registers, spills, wgmma sequences)
    python docs/experiments/tail_split_ab.py check                    (GPU: outputs bit-identical to gmm_ws's)
    python docs/experiments/tail_split_ab.py time [CASE,...]          (GPU: interleaved, forward and d lhs)
    [SECONDS=1] python docs/experiments/tail_split_ab.py sustained [CASE,...]
gk_tail_split_ab.py and coords_prefetch_ab.py run their A/Bs through this script's timed() and main().
"""
import functools
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from jgmm import backend_triton, ffi
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, sustained_runs, time_interleaved
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, consumer_tile, store_half, tile_of

DEVICE = backend_triton._device  # pylint: disable=protected-access
WS8 = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True, band_tiles=8)


@gluon.jit
def split_schedule(schedule_ptr, num_n):
  """(kept, total): tiles [0, kept) of gmm_ws's order run whole; where its last round's tiles, `wide - kept` of them,
  fit the grid twice over, they run as halves, tiles [kept, total) (two per wide tile)."""
  wide = gl.load(schedule_ptr) * num_n
  last = wide % gl.num_programs(0)
  kept = wide
  if 2 * last <= gl.num_programs(0):
    kept = wide - last
  return kept, 2 * wide - kept


@gluon.jit
def split_tile(t, kept):
  """(wide tile, piece) of tile t of the split schedule: piece -1 for a whole tile, else its column half (0, 1) of
  wide tile kept + (t - kept) // 2."""
  wide = t
  piece = t - t - 1
  if t >= kept:
    wide = kept + (t - kept) // 2
    piece = (t - kept) % 2
  return wide, piece


@gluon.jit
def split_loader(lhs_desc, rhs_desc, rhs_half_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K: gl.constexpr,
                 N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                 TRANSPOSE_RHS: gl.constexpr, BAND: gl.constexpr):
  """gmm_ws.loader (one CTA) over the split schedule: a half's rhs box through rhs_half_desc (COLS = BLOCK_N / 2)."""
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  kept, total = split_schedule(schedule_ptr, num_n)
  step = 0
  for t in range(gl.program_id(0), total, gl.num_programs(0)):
    wide, piece = split_tile(t, kept)
    g, row0, rows, _, ni = tile_of(schedule_ptr, wide, num_n, R_MAX, BAND)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        mbarrier.wait(empty.index(slot), ((step // S) & 1) ^ 1)
        if piece < 0:
          gmm_ws.load_stage(lhs_desc, rhs_desc, a_bufs, b_bufs, ready.index(slot), slot, g, row0, rows, ni, kk, K,
                            N, BLOCK_N, BLOCK_K, TRANSPOSE_RHS)
        else:
          gmm_ws.load_stage(lhs_desc, rhs_half_desc, a_bufs, b_bufs, ready.index(slot), slot, g, row0, rows,
                            2 * ni + piece, kk, K, N, BLOCK_N // 2, BLOCK_K, TRANSPOSE_RHS, COLS=BLOCK_N // 2)
        step += 1


@gluon.jit
def split_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K: gl.constexpr, N: gl.constexpr,
                   R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                   TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr):
  """gmm_ws.consumer (one CTA) over the split schedule: a half through a 64 x BLOCK_N / 2 accumulator, the output
  buffer's first BLOCK_N / 2 columns and a descriptor of half-wide boxes."""
  NARROW: gl.constexpr = BLOCK_N // 2
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  half_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, NARROW, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  out_half_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, NARROW], OUT_LAYOUT)
  kept, total = split_schedule(schedule_ptr, num_n)
  step = 0
  for t in range(gl.program_id(0), total, gl.num_programs(0)):
    wide, piece = split_tile(t, kept)
    _, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, wide, num_n, R_MAX, H, BAND)
    if piece < 0:
      acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
      acc = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, empty, acc, step, rows, half_rows, k_steps, S,
                                TRANSPOSE_RHS, H, 1)
      if half_store > 0:
        store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK_N, half_store, N, BLOCK_N, OUT_LAYOUT)
    else:
      acc_half = gl.zeros((HALF, NARROW), dtype=gl.float32, layout=half_layout)
      acc_half = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, empty, acc_half, step, rows, half_rows, k_steps,
                                     S, TRANSPOSE_RHS, H, 1, COLS=NARROW)
      if half_store > 0:
        store_half(out_ptr, out_half_desc, c_bufs.index(H).slice(0, NARROW, dim=1), acc_half, row,
                   ni * BLOCK_N + piece * NARROW, half_store, N, NARROW, OUT_LAYOUT)
    if rows > 0:
      step += k_steps
  tma.store_wait(pendings=0)


@gluon.jit
def split_kernel(lhs_desc, rhs_desc, rhs_half_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                 R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                 TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  """gmm_ws_kernel's parameters and rhs_half_desc (rhs_desc's view, boxes BLOCK_N / 2 wide), split_consumer's
  consumers and split_loader's loader."""
  a_bufs, b_bufs, c_bufs, ready, empty = gmm_ws.allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (split_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX, BLOCK_N,
                        BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND)),
      (split_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX, BLOCK_N,
                        BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND)),
      (split_loader, (lhs_desc, rhs_desc, rhs_half_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, K, N, R_MAX,
                      BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, BAND)),
  ], [4, 1], [232, 40])


@functools.partial(jax.jit, static_argnames=("transpose", "config"))
def split_gmm(lhs, rhs, bounds, transpose, config):
  """gmm (bf16 out) through split_kernel, launched as backend_triton._gmm_ws launches gmm_ws_kernel (one CTA)."""
  m, k = lhs.shape
  g = rhs.shape[0]
  n = rhs.shape[1] if transpose else rhs.shape[2]
  bn, bk = config.block_n, config.block_k
  row_tiles = geometry.cdiv(m, gmm_ws.BLOCK_M) + g + 1
  view = (g * n, k) if transpose else (g * k, n)
  box, half_box = ((bn, bk), (bn // 2, bk)) if transpose else ((bk, bn), (bk, bn // 2))
  lhs_block, out_block = (gmm_ws.HALF.value, bk), (gmm_ws.HALF.value, bn)
  assert gmm_ws.shared_layout(half_box, "bfloat16") == gmm_ws.shared_layout(box, "bfloat16")  # The subviews'.
  assert gmm_ws.shared_layout((64, bn // 2), "bfloat16") == gmm_ws.shared_layout(out_block, "bfloat16")
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=gmm_ws.shared_layout(lhs_block, "bfloat16")),
      ffi.TensorDescriptor(rhs.reshape(view), box, layout=gmm_ws.shared_layout(box, "bfloat16")),
      ffi.TensorDescriptor(rhs.reshape(view), half_box, layout=gmm_ws.shared_layout(half_box, "bfloat16")),
      backend_triton._row_tiles(bounds, m, row_tiles, gmm_ws.BLOCK_M), m,  # pylint: disable=protected-access
      kernel=split_kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
      grid=(min(DEVICE().num_sms, row_tiles * geometry.cdiv(n, bn)),),
      num_warps=gmm_ws.NUM_WARPS, maxnreg=gmm_ws.MAXNREG, name="jgmm_gmm_ws_split", K=k, N=n, R_MAX=row_tiles,
      BLOCK_N=bn, BLOCK_K=bk, S=config.num_stages, TRANSPOSE_RHS=transpose,
      OUT_LAYOUT=gmm_ws.shared_layout(out_block, "bfloat16"), BAND=config.band_tiles)


@functools.partial(jax.jit, static_argnames=("transpose", "config"))
def ws_gmm(lhs, rhs, bounds, transpose, config):
  """gmm (bf16 out) through backend_triton's gmm_ws path with `config`."""
  return backend_triton.gmm(lhs, rhs, bounds, bias=None, existing_out=None, transpose_rhs=transpose,
                            out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config)


def sass():
  """split_kernel compiled for sm_90 at mixtral's forward and d lhs (bands of 8): sass_wgmma.report's lines, stores
  too."""
  os.environ["JGMM_TARGET"] = "cuda:90"  # Lowered for sm_90 on a CPU machine (backend_triton reads it per call).
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import sass_wgmma  # pylint: disable=import-outside-toplevel
  from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel
  s = jax.ShapeDtypeStruct
  for transpose, k, n in ((False, 4096, 14336), (True, 14336, 4096)):
    _compile._cache.clear()  # pylint: disable=protected-access
    rhs = s((8, n, k) if transpose else (8, k, n), jnp.bfloat16)
    split_gmm.trace(s((8192, k), jnp.bfloat16), rhs, s((9,), jnp.int32), transpose, WS8).lower(
        lowering_platforms=("cuda",))
    (compiled,) = _compile._cache.values()  # pylint: disable=protected-access
    sass_wgmma.report(f"transpose {transpose}", compiled, *sass_wgmma.assemble(compiled), stores=True)


def check():
  """split_kernel's outputs against gmm_ws_kernel's, bit for bit: grids with every tile split (fewer tiles than
  half the grid), some split and none split; empty groups, a group of one row, groups ending mid-tile, rows outside
  the groups, both rhs layouts, bands of 1 and 8, N not a multiple of the tile."""
  rng = np.random.default_rng(0)
  failed = 0
  for m, k, n, sizes, band in ((512, 128, 256, [0, 200, 1, 0, 250], 1), (1000, 256, 384, [300, 0, 129, 64], 8),
                               (4096, 512, 1024, [1000, 0, 2000, 37, 600], 8), (640, 64, 320, [640], 1),
                               (8192, 256, 1280, [3000, 2000, 1, 3191], 8), (16896, 128, 512, [16896], 1)):
    g = len(sizes)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, g, m)
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                    band_tiles=band)
    for transpose in (False, True):
      rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose else (g, k, n)), jnp.bfloat16)
      want = np.asarray(ws_gmm(lhs, rhs, bounds, transpose, config), np.float32)
      got = np.asarray(split_gmm(lhs, rhs, bounds, transpose, config), np.float32)
      same = np.array_equal(got, want)
      failed += not same
      print(f"m {m} k {k} n {n} sizes {sizes} band {band} transpose {transpose}: "
            f"{'identical' if same else 'DIFFERENT'}", flush=True)
  print("PASS" if not failed else f"FAIL ({failed} cases differ)")


def ws_pair(lhs, rhs, bounds, transpose):
  """(gmm_ws's call, split_kernel's call) at WS8, without arguments."""
  return tuple(functools.partial(f, lhs, rhs, bounds, transpose, WS8) for f in (ws_gmm, split_gmm))


def timed(mode, names, pair=ws_pair, labels=("ws", "split")):
  """The two calls of pair(lhs, rhs, bounds, transpose) on the forward and d lhs of each named case, interleaved (or
  sustained, each alone): ms and speedup over the first (labels: their names)."""
  rows = []
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    for product, lhs, kk, nn, transpose in (("fwd", inp.x, k, n, False), ("dlhs", inp.dout, n, k, True)):
      fns = {label: (call, jax_sync) for label, call in zip(labels, pair(lhs, inp.w, bounds, transpose))}
      for fn, sync in fns.values():
        sync(fn())
      if mode == "sustained":
        ms = {label: statistics.median(run.ms for run in runs)
              for label, runs in sustained_runs(fns, float(os.environ.get("SECONDS", 1)), rounds=3).items()}
      else:
        ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
      sol = speed_of_light_ms(m, kk, nn, g)
      rows += [(f"{name} {product} {label}", t, 100 * sol / t, ms[labels[0]] / t) for label, t in ms.items()]
  print(f"\n{DEVICE().kind}, {mode}\n| case product kernel | ms | %SOL | speedup vs {labels[0]} |\n|---|---|---|---|")
  for label, t, sol, speedup in rows:
    print(f"| {label} | {t:.3f} | {sol:.0f}% | {speedup:.3f} |")


def main(sass_mode, check_mode, default_cases, **timed_args):
  """The command line of this script and gk_tail_split_ab's: sass, check, or time / sustained [CASE,...]."""
  mode = sys.argv[1]
  if mode == "sass":
    sass_mode()
  elif mode == "check":
    check_mode()
  else:
    timed(mode, sys.argv[2].split(",") if len(sys.argv) > 2 else default_cases, **timed_args)


if __name__ == "__main__":
  main(sass, check, ["mixtral8x7b-w1", "dsv3-ep8-down"])
