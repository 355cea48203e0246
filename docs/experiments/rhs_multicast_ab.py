"""Experiment (issue 17, session 52): the bf16 warp-specialised gmm on 2-CTA clusters with the rhs tile multicast,
on the H200's L2-bound case (qwen3: 128 experts' weights streamed through the L2, sessions 5-7).

Session 24 measured this design (commit 61fb830, docs/experiments/gmm_ws_multicast_rhs.py) on the H100's mixtral and
dsv3 cases only (0.98-1.03x: the pairs' odd tails), never on qwen3 or an H200. Ported here to today's gmm_ws helpers
(tile_of with bands, consumer_tile, tile_product, store_half, expect_boxes): the cluster tile is 256 rows of one
group (two of gmm_ws's 128-row tiles: the schedule is backend_triton._row_tiles at 256 rows) x BLOCK_N columns;
cluster half H (consumer H) is rows [128 H, 128 H + 128) of it, a (128, *) box split by rows between the CTAs (CTA r
holds rows + 64 r), so every scalar is the same in both CTAs; CTA 0 multicasts the whole rhs box (BLOCK_K, BLOCK_N)
into both CTAs (the rhs crosses the L2 once per cluster: (128 + 256 / 2) / (128 x 256) operand bytes per FLOP at
BLOCK_N 256, 33% below gmm_ws's), each CTA loads its own 64 lhs rows of each half holding rows. Barriers: gmm_ws_cluster's
three per stage with the operands' roles swapped (`ready` per CTA, `empty` per CTA count 2, `cluster_empty` in CTA 0
count 2 x 2 before the multicast). Triton >= 3.7 (Gluon clusters).

    python docs/experiments/rhs_multicast_ab.py check           (GPU: PASS/FAIL per case against float64)
    python docs/experiments/rhs_multicast_ab.py time [CASE,...]  (GPU: forward and d lhs, interleaved)
    [SECONDS=1] python docs/experiments/rhs_multicast_ab.py sustained [CASE,...]
    (UNIFORM=1: every group m / G rows, no tails)
    python docs/experiments/rhs_multicast_ab.py experts         (GPU: qwen3's forward with 128, 32, 8, 1 experts)
    JAX_PLATFORMS=cpu JGMM_TARGET=cuda:90 python docs/experiments/rhs_multicast_ab.py ptx   (CPU: cross-compile)
"""
import functools
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from jgmm import backend_triton, config_table, ffi
from jgmm.config import Config
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_ws_cluster import ROW_SPLIT, SHARED

PAIR_M = gl.constexpr(2 * gmm_ws.BLOCK_M)  # Rows of a cluster tile.
PART = gl.constexpr(gmm_ws.BLOCK_M)  # Rows of a cluster half (consumer H's), 64 in each CTA.


@gluon.jit
def _loader(lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K: gl.constexpr,
            N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
            TRANSPOSE_RHS: gl.constexpr, BAND: gl.constexpr):
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = gmm_ws.tile_of(schedule_ptr, t, num_n, R_MAX, BAND)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        mbarrier.wait(cluster_empty.index(slot), phase)  # CTA 0 only (a two_ctas barrier's wait).
        ready_bar = ready.index(slot)
        gmm_ws.expect_boxes(ready_bar, rhs_desc.nbytes_per_cta, lhs_desc.nbytes_per_cta, rows, 2, PART)
        for h in gl.static_range(2):
          has_rows = True if h == 0 else rows > h * PART
          tma.async_load(lhs_desc, [row0 + h * PART, kk * BLOCK_K], ready_bar, a_bufs.index(2 * slot + h),
                         pred=has_rows)
        if TRANSPOSE_RHS:
          tma.async_load(rhs_desc, [g * N + ni * BLOCK_N, kk * BLOCK_K], ready_bar, b_bufs.index(slot),
                         multicast=True)
        else:
          tma.async_load(rhs_desc, [g * K + kk * BLOCK_K, ni * BLOCK_N], ready_bar, b_bufs.index(slot),
                         multicast=True)
        step += 1


@gluon.jit
def _consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K: gl.constexpr,
              N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
              TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr, BAND: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16], cga_layout=[[1, 0]])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [PART, BLOCK_N], OUT_LAYOUT)
  step = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    _, row, rows, half_rows, half_store, ni = gmm_ws.consumer_tile(schedule_ptr, t, num_n, R_MAX, H, BAND,
                                                                   TILE_M=PAIR_M, HALF_M=PART)
    acc = gl.zeros((PART, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    acc = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, cluster_empty, acc, step, rows, half_rows, k_steps, S,
                              TRANSPOSE_RHS, H, 2)
    if half_store > 0:
      gmm_ws.store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK_N, half_store, N, BLOCK_N,
                        OUT_LAYOUT, HALF_M=PART)
    if rows > 0:
      step += k_steps
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_ws_rhs_mc_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, K: gl.constexpr, N: gl.constexpr,
                         R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                         TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr):
  """num_ctas = 2. lhs_desc box (128, BLOCK_K) ROW_SPLIT; rhs_desc over (G * K, N) box (BLOCK_K, BLOCK_N) or
  (G * N, K) box (BLOCK_N, BLOCK_K), SHARED; out boxes (128, BLOCK_N) OUT_LAYOUT ROW_SPLIT; schedule of 256-row
  tiles."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [2 * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2, PART, BLOCK_N], OUT_LAYOUT)
  ready = mbarrier.allocate_mbarrier(batch=S)
  empty = mbarrier.allocate_mbarrier(batch=S)
  cluster_empty = mbarrier.allocate_mbarrier(batch=S, two_ctas=True)
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=2)
    mbarrier.init(cluster_empty.index(s), count=2)
  gl.warp_specialize([
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND)),
      (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty, K, N, R_MAX,
                   BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND)),
      (_loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, cluster_empty, K, N, R_MAX, BLOCK_N,
                 BLOCK_K, S, TRANSPOSE_RHS, BAND)),
  ], [4, 1], [232, 40])


def gmm_rhs_mc(lhs, rhs, bounds, *, transpose_rhs, config, num_sms):
  """lhs (M, K) @ rhs per group (bounds (G + 1,) int32) through gmm_ws_rhs_mc_kernel: config's block_n (128 or
  256), block_k, num_stages, band_tiles; a persistent grid of min(num_sms // 2, cluster tiles) clusters."""
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  pairs = geometry.cdiv(m, PAIR_M.value) + num_groups + 1
  layout = lambda block, dtype, cga: gmm_ws.shared_layout(block, jnp.dtype(dtype).name, cga)  # noqa: E731
  lhs_block = (PART.value, config.block_k)
  rhs_view, rhs_block = ((num_groups * n, k), (config.block_n, config.block_k)) if transpose_rhs else (
      (num_groups * k, n), (config.block_k, config.block_n))
  out_block = (PART.value, config.block_n)
  tiles = pairs * geometry.cdiv(n, config.block_n)
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=layout(lhs_block, lhs.dtype, ROW_SPLIT)),
      ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block, layout=layout(rhs_block, rhs.dtype, SHARED)),
      backend_triton._row_tiles(bounds, m, pairs, PAIR_M.value), m,  # pylint: disable=protected-access
      kernel=gmm_ws_rhs_mc_kernel, out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
      grid=(min(num_sms // 2, tiles),), num_ctas=2, num_warps=gmm_ws.NUM_WARPS, maxnreg=gmm_ws.MAXNREG,
      name="jgmm_gmm_ws_rhs_mc", K=k, N=n, R_MAX=pairs, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      S=config.num_stages, TRANSPOSE_RHS=transpose_rhs, OUT_LAYOUT=layout(out_block, lhs.dtype, ROW_SPLIT),
      BAND=config.band_tiles)


VARIANTS = {  # name: (kernel, config): "table" is the table's config through backend_triton.gmm.
    "ws": ("ws", Config(128, 256, 64, 8, 3, warp_specialized=True)),
    "mcl": ("ws", Config(128, 256, 64, 8, 3, warp_specialized=True, cluster_size=2)),
    "mcr": ("mcr", Config(128, 256, 64, 8, 3, warp_specialized=True)),
    "mcr_b4": ("mcr", Config(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=4)),
    "mcr128": ("mcr", Config(128, 128, 64, 8, 5, warp_specialized=True)),
}


def product(kind, config, transpose_rhs, num_sms):
  """f(lhs, rhs, bounds) jitted: the variant's forward (gmm) or d lhs (transpose_rhs) product."""
  if kind == "mcr":
    return jax.jit(functools.partial(gmm_rhs_mc, transpose_rhs=transpose_rhs, config=config, num_sms=num_sms))
  return jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose_rhs,
                                   out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))


CHECK_SIZES = ([37, 300, 0, 40, 450, 100], [256, 257, 255, 1, 128, 129, 511, 513])  # Rows before: sizes[0].


def check():
  """GPU: every variant's output against float64 on groups with odd row-tile counts, empty groups, tails in either
  CTA's part of either half, rows before and after the groups (zeros); both rhs layouts, K 4096 and 72 (transposed
  only: the (G * K, N) view needs K a multiple of BLOCK_K), N a multiple of BLOCK_N and not."""
  rng = np.random.default_rng(0)
  device = backend_triton._device()  # pylint: disable=protected-access
  failed = 0
  for sizes in CHECK_SIZES:
    for k, n, transpose_rhs in ((4096, 768, False), (4096, 640, True), (72, 384, True), (1024, 1536, False)):
      m, g = sum(sizes) + 73, len(sizes) - 1
      lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
      rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose_rhs else (g, k, n)), jnp.bfloat16)
      bounds = np.concatenate([[sizes[0]], sizes[0] + np.cumsum(sizes[1:])]).astype(np.int32)
      a, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
      want = np.zeros((m, n))
      for i in range(g):
        lo, hi = bounds[i], bounds[i + 1]
        want[lo:hi] = a[lo:hi] @ (w[i].T if transpose_rhs else w[i])
      for name, (kind, config) in VARIANTS.items():
        if kind == "mcr" and config.block_n > n:
          continue
        out = np.asarray(product(kind, config, transpose_rhs, device.num_sms)(lhs, rhs, jnp.asarray(bounds)),
                         np.float64)
        err = np.linalg.norm(out - want) / np.linalg.norm(want)
        ok = err < 1e-2 and not np.any(np.isnan(out)) and not np.any(out[:bounds[0]]) and not np.any(out[bounds[-1]:])
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name} sizes={sizes} k={k} n={n} transpose_rhs={transpose_rhs}: rel err "
              f"{err:.2e}", flush=True)
  print("ALL PASS" if not failed else f"{failed} FAILED", flush=True)
  return failed


def time_ab(mode, names):
  """Forward and d lhs of the benchmark's cases: the table's config and every variant, same inputs."""
  from jgmm.bench import CASES, Inputs, speed_of_light_ms
  from jgmm.ops import group_bounds
  from jgmm.timing import jax_sync
  sys.path.insert(0, __file__.rsplit("/", 1)[0])
  from table_ab import timed  # docs/experiments/table_ab.py
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}, {mode}\n| case | product | table | " + " | ".join(VARIANTS) + " |\n|---|---|---|"
        + "---|" * len(VARIANTS), flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    sizes = np.full(g, m // g, np.int32) if os.environ.get("UNIFORM") else inp.sizes  # UNIFORM=1: no group tails.
    bounds = group_bounds(jnp.asarray(sizes), None, g, m)
    for prod, op, lhs, kk, nn in (("fwd", "gmm", inp.x, k, n), ("dlhs", "gmm_t", inp.dout, n, k)):
      key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op == "gmm_t")
      table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
      fns = {"table": (functools.partial(product("table", table, op == "gmm_t", device.num_sms), lhs, inp.w,
                                         bounds), jax_sync)}
      for v, (kind, config) in VARIANTS.items():
        if kind == "mcr" and op == "gmm" and kk % config.block_k:
          continue
        fns[v] = (functools.partial(product(kind, config, op == "gmm_t", device.num_sms), lhs, inp.w, bounds),
                  jax_sync)
      ms = timed(mode, fns)
      sol = speed_of_light_ms(m, kk, nn, g)
      cells = " | ".join(f"{ms[v]:.3f} ({ms['table'] / ms[v]:.3f}x)" if v in ms else "-" for v in VARIANTS)
      print(f"| {name} | {prod} | {ms['table']:.3f} ({100 * sol / ms['table']:.0f}%) | {cells} |", flush=True)


def experts():
  """GPU: qwen3's forward (M 32768, K 2048, N 1536) on the table's qwen3 config and on "ws", uniform groups, with
  128, 32, 8 and 1 experts: the same FLOPs and L2 traffic per tile, the weights' DRAM bytes 805 MB down to 6 MB."""
  from jgmm.timing import jax_sync
  sys.path.insert(0, __file__.rsplit("/", 1)[0])
  from table_ab import timed  # docs/experiments/table_ab.py
  device = backend_triton._device()  # pylint: disable=protected-access
  m, k, n = 32768, 2048, 1536
  key = config_table.make_key("gmm", "bfloat16", "bfloat16", m / 128, k, n, 128)
  table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
  rng = np.random.default_rng(0)
  lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  print(f"\n{device.kind}; table config {table}\n| experts | table ms | ws ms |\n|---|---|---|", flush=True)
  for g in (128, 32, 8, 1):
    rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16)
    bounds = jnp.arange(g + 1, dtype=jnp.int32) * (m // g)
    ms = timed("time", {name: (functools.partial(product(kind, config, False, device.num_sms), lhs, rhs, bounds),
                               jax_sync) for name, (kind, config) in (("table", ("table", table)), ("ws",
                                                                                                VARIANTS["ws"]))})
    print(f"| {g} | {ms['table']:.3f} | {ms['ws']:.3f} |", flush=True)


def ptx():
  """CPU (JGMM_TARGET=cuda:90): cross-compiles the kernel on a few shapes; prints clusters, multicasts, registers
  and shared memory."""
  from unittest import mock
  from jgmm.ffi import _compile
  s = jax.ShapeDtypeStruct
  for m, k, n, g, transpose_rhs, name in ((32768, 2048, 1536, 128, False, "mcr"), (32768, 1536, 2048, 128, True,
                                                                                  "mcr"),
                                          (1000, 72, 384, 4, True, "mcr128"), (8192, 4096, 14336, 8, False,
                                                                               "mcr_b4")):
    config = VARIANTS[name][1]
    with mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      before = set(_compile._cache)
      jax.jit(functools.partial(gmm_rhs_mc, transpose_rhs=transpose_rhs, config=config, num_sms=132)).trace(
          s((m, k), jnp.bfloat16), s((g, n, k) if transpose_rhs else (g, k, n), jnp.bfloat16),
          s((g + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
      (compiled,) = [_compile._cache[key] for key in set(_compile._cache) - before]
    text = compiled.asm["ptx"]
    print(f"{name} M={m} K={k} N={n} G={g} transpose_rhs={transpose_rhs}: num_ctas {compiled.num_ctas}, "
          f"reqnctapercluster {'.reqnctapercluster 2' in text}, multicast copies "
          f"{len(re.findall(r'cp.async.bulk.tensor[^;]*multicast::cluster', text))}, shared "
          f"{compiled.shared_mem_bytes} B, calls {compile_kernel.call_count}", flush=True)


if __name__ == "__main__":
  what = sys.argv[1] if len(sys.argv) > 1 else ""
  if what == "check":
    sys.exit(1 if check() else 0)
  elif what in ("time", "sustained"):
    from jgmm.bench import CASES
    time_ab(what, sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES])
  elif what == "experts":
    experts()
  elif what == "ptx":
    ptx()
  else:
    print(__doc__)
