"""A/B (issue 17, session 47): gmm_ws's consumers load their next tiles' coordinates while the current tile runs.

Session 44 measured this (its script: e365050's docs/experiments/coords_prefetch_ab.py) sustained only, 0.99-1.01x:
no direction. Session 47's timeline puts the coordinates at ~385 cycles a tile in both consumers at once (0.6% of a
mixtral forward tile, 1.1% of a dsv3 down one), and its tail split showed per-clock gains at about half their size
sustained, so a gain of this size is only visible interleaved. This is session 44's kernel on the current gmm_ws:
at each tile a consumer reads the schedule in two dependent rounds (in bands: the tile's region, then its group,
rows and counts: gmm_ws.tile_of); here it loads round 2 of tile t + P (P programs) and round 1 of tile t + 2P while
tile t runs (gmm_ws.region_of and scheduled_tile, tile_of's two rounds; indices past the last clamped to it: never a
read outside the schedule). Everything else is gmm_ws's. Floor: +0.6% (mixtral), +1.1% (down) per clock
interleaved; sustained about half.

    JAX_PLATFORMS=cpu python docs/experiments/coords_prefetch_ab.py sass   (CPU: registers, spills, wgmma sequences)
    python docs/experiments/coords_prefetch_ab.py check                    (GPU: outputs bit-identical to gmm_ws's)
    python docs/experiments/coords_prefetch_ab.py time [CASE,...]          (GPU: interleaved, forward and d lhs)
    [SECONDS=1] python docs/experiments/coords_prefetch_ab.py sustained [CASE,...]
"""
import functools
import os
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from jgmm import backend_triton
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.triton_kernels import gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, store_half

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tail_split_ab  # pylint: disable=wrong-import-position  (its timing and command line)

WS8 = tail_split_ab.WS8


@gluon.jit
def clamped(t, total):
  """Tile t, or the last tile (0 where there is none) past the end: an index the schedule may be read at."""
  return gl.maximum(gl.minimum(t, total - 1), 0)


@gluon.jit
def prefetch_consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K: gl.constexpr,
                      N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                      S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
                      BAND: gl.constexpr):
  """gmm_ws.consumer (one CTA) with the next tiles' coordinates loaded a tile ahead (the module's docstring)."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  total = gl.load(schedule_ptr) * num_n
  pid = gl.program_id(0)
  programs = gl.num_programs(0)
  first, count = gmm_ws.region_of(schedule_ptr, clamped(pid, total), num_n, R_MAX, BAND)
  _, row0, rows, store_rows, ni = gmm_ws.scheduled_tile(schedule_ptr, clamped(pid, total), first, count, num_n,
                                                        R_MAX, BAND)
  first, count = gmm_ws.region_of(schedule_ptr, clamped(pid + programs, total), num_n, R_MAX, BAND)
  step = 0
  for t in range(pid, total, programs):
    row = row0 + H * HALF  # This tile's, before the next one's replace them.
    tile_rows = rows
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    half_store = gl.minimum(gl.maximum(store_rows - H * HALF, 0), HALF)
    col = ni * BLOCK_N
    # The next tile (round 2; its region was loaded an iteration ago) and the region of the one after it.
    _, row0, rows, store_rows, ni = gmm_ws.scheduled_tile(schedule_ptr, clamped(t + programs, total), first, count,
                                                          num_n, R_MAX, BAND)
    first, count = gmm_ws.region_of(schedule_ptr, clamped(t + 2 * programs, total), num_n, R_MAX, BAND)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    acc = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, empty, acc, step, tile_rows, half_rows, k_steps, S,
                              TRANSPOSE_RHS, H, 1)
    if tile_rows > 0:
      step += k_steps
    if half_store > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, col, half_store, N, BLOCK_N, OUT_LAYOUT)
  tma.store_wait(pendings=0)


@gluon.jit
def prefetch_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                    R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                    TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  """gmm_ws_kernel (same parameters) with prefetch_consumer's consumers."""
  a_bufs, b_bufs, c_bufs, ready, empty = gmm_ws.allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (prefetch_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX, BLOCK_N,
                           BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND)),
      (prefetch_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX, BLOCK_N,
                           BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND)),
      (gmm_ws.loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N,
                       BLOCK_K, S, TRANSPOSE_RHS, BAND, 1)),
  ], [4, 1], [232, 40])


def ws_call(prefetch, transpose, config):
  """backend_triton.gmm (bf16 out) with config, jitted, through prefetch_kernel where prefetch (patched in while it
  is traced: call it once under `patched(prefetch)` first)."""
  return jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose,
                                   out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))


def patched(prefetch):
  """gmm_ws_kernel replaced by prefetch_kernel (prefetch) or left as it is."""
  return mock.patch.object(gmm_ws, "gmm_ws_kernel", prefetch_kernel if prefetch else gmm_ws.gmm_ws_kernel)


def pair(lhs, rhs, bounds, transpose, config=WS8):
  """(gmm_ws's call, prefetch_kernel's call) at config, without arguments, each traced and run once."""
  calls = []
  for prefetch in (False, True):
    f = ws_call(prefetch, transpose, config)
    with patched(prefetch):
      jax.block_until_ready(f(lhs, rhs, bounds))
    calls.append(functools.partial(f, lhs, rhs, bounds))
  return calls


def check():
  """prefetch_kernel's outputs against gmm_ws_kernel's, bit for bit: empty groups, a group's last band taking
  leftover row tiles, rows outside the groups (zeros), N not a multiple of the tile, fewer tiles than programs,
  G = 1, both rhs layouts, bands of 1 and 8."""
  rng = np.random.default_rng(0)
  failed = 0
  for sizes, k, n in (([0, 300, 0, 1100, 17, 0, 700], 256, 640), ([2000], 128, 512), ([5, 3], 64, 256),
                      ([900, 0, 1300], 192, 384), ([1000] * 8, 256, 4096)):
    m = sum(sizes) + 37  # Rows after the groups: zeros.
    g = len(sizes)
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, g, m)
    for transpose in (False, True):
      rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose else (g, k, n)), jnp.bfloat16)
      for band in (1, 8):
        config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                        band_tiles=band)
        want, got = (np.asarray(call(), np.float32) for call in pair(lhs, rhs, bounds, transpose, config))
        same = np.array_equal(got, want)
        failed += not same
        print(f"sizes {sizes} k {k} n {n} transpose {transpose} band {band}: {'identical' if same else 'DIFFERENT'}",
              flush=True)
  print("PASS" if not failed else f"FAIL ({failed} cases differ)")


def sass():
  """Both kernels compiled for sm_90 at dsv3 down's forward and mixtral's d lhs (bands of 8): sass_wgmma.report's
  lines."""
  os.environ["JGMM_TARGET"] = "cuda:90"  # Lowered for sm_90 on a CPU machine (backend_triton reads it per call).
  import sass_wgmma  # pylint: disable=import-outside-toplevel
  from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel
  s = jax.ShapeDtypeStruct
  for transpose, m, k, n, g in ((False, 32768, 2048, 7168, 32), (True, 8192, 14336, 4096, 8)):
    for prefetch in (False, True):
      _compile._cache.clear()  # pylint: disable=protected-access
      with patched(prefetch):
        ws_call(prefetch, transpose, WS8).trace(
            s((m, k), jnp.bfloat16), s((g, n, k) if transpose else (g, k, n), jnp.bfloat16),
            s((g + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
      (compiled,) = _compile._cache.values()  # pylint: disable=protected-access
      sass_wgmma.report(f"{'prefetch' if prefetch else 'gmm_ws'} transpose {transpose}", compiled,
                        *sass_wgmma.assemble(compiled), stores=True)


if __name__ == "__main__":
  tail_split_ab.main(sass, check, ["mixtral8x7b-w1", "dsv3-ep8-down"], pair=pair, labels=("ws", "prefetch"))
