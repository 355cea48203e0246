"""A/B (issue 17, session 47): gmm_kernel whose last, partial round of tiles runs as twice as many column halves.

tail_split_ab.py's idea (session 47: +1.4% on mixtral's forward, +4.8% on its d lhs interleaved, on gmm_ws) for the
persistent Triton kernel, which the H200's table picks for mixtral's d lhs (8 rounds of 132 tiles + 16), dsv3
gate-up's forward (33 rounds + 28) and d lhs (58 + 16): where the last round holds at most half the grid's
programs, each of its tiles runs as its two column halves (gmm_tile with BLOCK_N / 2, the rhs through a device-made
descriptor of half-wide boxes), one a program, after the fused loop over the whole rounds. Floor: the last round
about half a tile shorter: mixtral's d lhs +5%, gate-up +1.4%, its d lhs +0.8% per clock; less sustained.

gmm_split_kernel has gmm_kernel's parameters and runs in its place through backend_triton.gmm (mock.patch).

    JAX_PLATFORMS=cpu python docs/experiments/gk_tail_split_ab.py check    (CPU, Triton's interpreter: outputs equal
        to gmm_kernel's, float32, both load paths, TMA stores, swiglu with bias, both rhs layouts; 4 programs)
    JAX_PLATFORMS=cpu python docs/experiments/gk_tail_split_ab.py sass     (CPU: both kernels for sm_90 at mixtral's
        d lhs, the table's config: registers, spills, shared memory)
    python docs/experiments/gk_tail_split_ab.py check                      (GPU: bf16, bit-identical)
    python docs/experiments/gk_tail_split_ab.py time [CASE,...]            (GPU: interleaved, forward and d lhs)
    [SECONDS=1] python docs/experiments/gk_tail_split_ab.py sustained [CASE,...]
"""
import functools
import os
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jgmm import backend_triton
from jgmm.bench import group_sizes
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.triton_kernels import gmm as gmm_kernels
from jgmm.triton_kernels.common import group_rows_descriptor
from jgmm.triton_kernels.gmm import gmm_tile, group_table, group_tile, store_zero_tiles

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tail_split_ab  # pylint: disable=wrong-import-position  (its timing and command line)

GK = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)  # The table's gmm_kernel entries.


@triton.jit
def half_rhs_descriptor(rhs_ptr, K: tl.constexpr, N: tl.constexpr, N_OUT: tl.constexpr, G: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TRANSPOSE_RHS: tl.constexpr):
  """backend_triton's rhs descriptor (rhs viewed (G, K, N // N_OUT, N_OUT), or (G, N // N_OUT, N_OUT, K) where
  transposed) made on the device, with boxes BLOCK_N / 2 columns wide."""
  if TRANSPOSE_RHS:
    return tl.make_tensor_descriptor(rhs_ptr, shape=[G, N // N_OUT, N_OUT, K], strides=[N * K, N_OUT * K, K, 1],
                                     block_shape=[1, 1, BLOCK_N // 2, BLOCK_K])
  else:
    return tl.make_tensor_descriptor(rhs_ptr, shape=[G, K, N // N_OUT, N_OUT], strides=[K * N, N, N_OUT, 1],
                                     block_shape=[1, BLOCK_K, 1, BLOCK_N // 2])


@triton.jit
def gmm_split_kernel(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, bounds_ptr, bias_ptr, existing_ptr, M, out_ptr, h_ptr,
                     K: tl.constexpr, N: tl.constexpr, N_OUT: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     TRANSPOSE_RHS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
                     ACTIVATION: tl.constexpr, SAVE_PRE: tl.constexpr, USE_TMA: tl.constexpr,
                     TMA_STORE: tl.constexpr, DOT_PRECISION: tl.constexpr):
  """gmm_kernel with its group tiles [kept, num_tiles) (the last round, where it is at most half the grid) run as
  column halves, tile kept + p // 2's half p % 2 in program p."""
  N_TILES: tl.constexpr = (N_OUT + BLOCK_N - 1) // BLOCK_N
  group, starts, rows, group_tiles, tiles_end, num_tiles = group_table(bounds_ptr, G, G_POW2, BLOCK_M, N_TILES)
  if TMA_STORE:
    out_desc = group_rows_descriptor(out_ptr, N_OUT, BLOCK_M, BLOCK_N // 2)
    out_half_desc = group_rows_descriptor(out_ptr, N_OUT, BLOCK_M, BLOCK_N // 4)
  else:
    out_desc = out_ptr
    out_half_desc = out_ptr
  num_programs = tl.num_programs(0)
  pid = tl.program_id(0)
  kept = num_tiles
  if 2 * (num_tiles % num_programs) <= num_programs:
    kept = num_tiles - num_tiles % num_programs
  for tile in tl.range(pid, kept, num_programs, flatten=True):
    g, row_start, m_g, mi, ni = group_tile(tile, group, starts, rows, group_tiles, tiles_end, BLOCK_M, N_TILES,
                                           GROUP_M)
    gmm_tile(lhs_ptr, rhs_ptr, bias_ptr, existing_ptr, out_ptr, h_ptr, lhs_desc, rhs_desc, out_desc,
             g, row_start, m_g, m_g, mi, ni, K, N, N_OUT, BLOCK_M, BLOCK_N, BLOCK_K,
             TRANSPOSE_RHS, HAS_BIAS, ACCUMULATE, ACTIVATION, SAVE_PRE, USE_TMA, TMA_STORE, DOT_PRECISION)
  if pid < 2 * (num_tiles - kept):
    g, row_start, m_g, mi, ni = group_tile(kept + pid // 2, group, starts, rows, group_tiles, tiles_end, BLOCK_M,
                                           N_TILES, GROUP_M)
    if USE_TMA:
      rhs_half_desc = half_rhs_descriptor(rhs_ptr, K, N, N_OUT, G, BLOCK_N, BLOCK_K, TRANSPOSE_RHS)
    else:
      rhs_half_desc = rhs_desc
    gmm_tile(lhs_ptr, rhs_ptr, bias_ptr, existing_ptr, out_ptr, h_ptr, lhs_desc, rhs_half_desc, out_half_desc,
             g, row_start, m_g, m_g, mi, 2 * ni + pid % 2, K, N, N_OUT, BLOCK_M, BLOCK_N // 2, BLOCK_K,
             TRANSPOSE_RHS, HAS_BIAS, ACCUMULATE, ACTIVATION, SAVE_PRE, USE_TMA, TMA_STORE, DOT_PRECISION)

  if SAVE_PRE or not ACCUMULATE:
    store_zero_tiles(bounds_ptr, M, out_ptr, h_ptr, num_tiles, N, N_OUT, G, BLOCK_M, BLOCK_N, ACCUMULATE, SAVE_PRE)


def gmm_call(split, transpose, config, **kwargs):
  """backend_triton.gmm with `config`, jitted, through gmm_split_kernel where split (patched in while it is traced:
  call it once under `patched(split)` first)."""
  return jax.jit(lambda l, r, b, *bias: backend_triton.gmm(
      l, r, b, bias[0] if bias else None, None, transpose_rhs=transpose, save_preactivation=False, config=config,
      **kwargs))


def patched(split):
  """gmm_kernel replaced by gmm_split_kernel (split) or left as it is."""
  return mock.patch.object(gmm_kernels, "gmm_kernel", gmm_split_kernel if split else gmm_kernels.gmm_kernel)


def compiled_pair(transpose, config, args, **kwargs):
  """(gmm_kernel's call, gmm_split_kernel's call) on args, each traced and run once with its kernel."""
  calls = []
  for split in (False, True):
    f = gmm_call(split, transpose, config, **kwargs)
    with patched(split):
      jax.block_until_ready(f(*args))
    calls.append(functools.partial(f, *args))
  return calls


def check():
  """gmm_split_kernel's outputs against gmm_kernel's: on the CPU (the interpreter's 4 programs, float32, 16 x 16
  tiles) within float32 rounding of the same sums, on the GPU (bf16, 128 x 256 tiles) bit for bit. The cases give
  last rounds that split (1 or 2 tiles of 4 programs; 16 of 132), that do not (3 of 4), and every tile split."""
  on_gpu = jax.devices()[0].platform == "gpu"
  rng = np.random.default_rng(0)
  dtype = jnp.bfloat16 if on_gpu else jnp.float32
  block = (128, 256, 64) if on_gpu else (16, 16, 16)
  shapes = ([(512, 128, 256, [0, 200, 1, 0, 250]), (1000, 256, 384, [300, 0, 129, 64]),
             (4300, 512, 512, [1000, 0, 2000, 37, 1200]), (8192, 256, 2048, list(group_sizes(8192, 8))),
             (640, 64, 320, [640])]
            if on_gpu else [(70, 16, 16, [16, 0, 9, 40]), (32, 24, 48, [17, 15]), (13, 8, 16, [13]),
                            (37, 8, 16, [37])])
  programs = backend_triton._device().num_sms  # pylint: disable=protected-access  (the interpreter's: 4)
  failed = 0
  for m, k, n, sizes in shapes:
    g = len(sizes)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, g, m)
    for tma, tma_store, transpose, activation in ((False, False, False, None), (True, False, False, None),
                                                  (True, False, True, None), (True, True, False, None),
                                                  (False, False, True, "swiglu"), (True, False, False, "swiglu")):
      config = Config(block_m=block[0], block_n=block[1], block_k=block[2], num_warps=8 if on_gpu else 4,
                      num_stages=3, tma=tma, tma_store=tma_store)
      rhs = jnp.asarray(rng.standard_normal((g, 2 * n, k) if transpose else (g, k, 2 * n)), dtype)
      args = (lhs, rhs, bounds) + ((jnp.asarray(rng.standard_normal((g, 2 * n)), dtype),) if activation else ())
      want, got = (np.asarray(call(), np.float32) for call in compiled_pair(
          transpose, config, args, out_dtype=dtype, activation=activation))
      ok = np.array_equal(got, want) if on_gpu else np.allclose(got, want, rtol=1e-5, atol=1e-5)
      failed += not ok
      n_out = n if activation else 2 * n
      tiles = sum(-(-size // block[0]) for size in sizes) * -(-n_out // block[1])
      last = tiles % programs
      print(f"m {m} k {k} n_out {n_out} sizes {sizes} tma {tma} tma_store {tma_store} transpose {transpose} "
            f"activation {activation}, {tiles} tiles = {tiles // programs} x {programs} + {last} "
            f"({'split' if 2 * last <= programs and last else 'whole'}): {'equal' if ok else 'DIFFERENT'}",
            flush=True)
  print("PASS" if not failed else f"FAIL ({failed} cases differ)")


def sass():
  """Both kernels compiled for sm_90 at mixtral's d lhs with GK: sass_wgmma.report's lines."""
  os.environ["JGMM_TARGET"] = "cuda:90"  # Lowered for sm_90 on a CPU machine (backend_triton reads it per call).
  import sass_wgmma  # pylint: disable=import-outside-toplevel
  from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel
  s = jax.ShapeDtypeStruct
  for split in (False, True):
    _compile._cache.clear()  # pylint: disable=protected-access
    with patched(split):
      gmm_call(split, True, GK, out_dtype=jnp.bfloat16, activation=None).trace(
          s((8192, 14336), jnp.bfloat16), s((8, 4096, 14336), jnp.bfloat16), s((9,), jnp.int32)).lower(
              lowering_platforms=("cuda",))
    (compiled,) = _compile._cache.values()  # pylint: disable=protected-access
    sass_wgmma.report("gmm_split_kernel" if split else "gmm_kernel", compiled, *sass_wgmma.assemble(compiled))


if __name__ == "__main__":
  tail_split_ab.main(sass, check, ["mixtral8x7b-w1", "dsv3-ep8-gateup"], labels=("gk", "split"),
                     pair=lambda lhs, rhs, bounds, transpose: compiled_pair(
                         transpose, GK, (lhs, rhs, bounds), out_dtype=jnp.bfloat16, activation=None))
