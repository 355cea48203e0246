"""A/B (issue 17, session 43): gmm_ws's consumers load their next tile's coordinates while the current tile runs.

At each tile's start a consumer of gmm_ws_kernel calls tile_of, whose schedule loads (in bands: two dependent rounds,
the group's first row tile and row tiles, then the tile's group, rows and counts) it needs at once: the tensor cores
idle through their latency, after the epilogue, on every tile and in both consumers at once. Here the consumer loads
round 2 of tile t + P (P programs) and round 1 of tile t + 2P while tile t runs, so that each is in registers before
it is needed (tile indices past the last clamped to it: never a read outside the schedule). Everything else is
gmm_ws's. Prediction: ~500-1000 clocks a tile of ~33000 (dsv3 down's 32 K steps) to ~65000 (mixtral's 64): +1-3%
per clock interleaved, less sustained (under the power cap fewer idle clocks also raise the power per clock).

    python docs/experiments/coords_prefetch_ab.py check                 outputs of both against each other, float64
    python docs/experiments/coords_prefetch_ab.py time [CASE,...]       interleaved (BATCH_S, default 0.05)
    [SECONDS=2] python docs/experiments/coords_prefetch_ab.py sustained [CASE,...]   each alone, 3 rounds
    JAX_PLATFORMS=cpu python docs/experiments/coords_prefetch_ab.py compile   both compiled for sm_90 on a CPU-only
        machine (dsv3 down's forward): ptxas's registers and spills, the SASS's order of loads, wgmmas and waits
Variants per case and product (forward "fwd", d lhs "dlhs"): "ws8" (the warp-specialised kernel, 128 x 256 x 64,
3 stages, bands of 8) and "ws8 prefetch"; "ws" and "ws prefetch" row-major (bands of 1).
"""
import functools
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

if sys.argv[1:2] == ["compile"]:
  os.environ["JGMM_TARGET"] = "cuda:90"
import jax
import jax.numpy as jnp
import numpy as np
import triton
from band_regions_ab import timed_ms, with_globals
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from jgmm import backend_triton, oracle
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync
from jgmm.triton_kernels import gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, store_half


@gluon.jit
def clamped(t, total):
  """Tile t, or the last tile (0 where there is none) past the end: an index tile_of may read the schedule at."""
  return gl.maximum(gl.minimum(t, total - 1), 0)


@gluon.jit
def consumer_prefetch(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, ready, empty, cluster_empty,
                      K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr,
                      BLOCK_K: gl.constexpr, S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr,
                      H: gl.constexpr, BAND: gl.constexpr, CTAS: gl.constexpr):
  """gmm_ws.consumer (CTAS 1) with the next tiles' coordinates loaded a tile ahead (the module's docstring): tile_of's
  two rounds of loads, gmm_ws.region_of and gmm_ws.scheduled_tile, each an iteration before its values are used."""
  gl.static_assert(CTAS == 1, "one-CTA kernel only")
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  total = gl.load(schedule_ptr) * num_n
  pid = gl.program_id(0)
  programs = gl.num_programs(0)
  t0 = clamped(pid, total)
  first, count = gmm_ws.region_of(schedule_ptr, t0, num_n, R_MAX, BAND)
  _, row0, rows, store_rows, ni = gmm_ws.scheduled_tile(schedule_ptr, t0, first, count, num_n, R_MAX, BAND)
  first, count = gmm_ws.region_of(schedule_ptr, clamped(pid + programs, total), num_n, R_MAX, BAND)
  step = 0
  for t in range(pid, total, programs):
    row = row0 + H * HALF  # This tile's, before the next one's replace them.
    tile_rows = rows
    half_rows = gl.minimum(gl.maximum(rows - H * HALF, 0), HALF)
    half_store = gl.minimum(gl.maximum(store_rows - H * HALF, 0), HALF)
    col = ni * BLOCK_N
    # The tile after this one (round 2, its region loaded an iteration ago) and the region of the one after it.
    _, row0, rows, store_rows, ni = gmm_ws.scheduled_tile(schedule_ptr, clamped(t + programs, total), first, count,
                                                          num_n, R_MAX, BAND)
    first, count = gmm_ws.region_of(schedule_ptr, clamped(t + 2 * programs, total), num_n, R_MAX, BAND)
    acc = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, cluster_empty,
                              gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout), step, tile_rows,
                              half_rows, k_steps, S, TRANSPOSE_RHS, H, CTAS)
    if tile_rows > 0:
      step += k_steps
    if half_store > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, col, half_store, N, BLOCK_N, OUT_LAYOUT)
  tma.store_wait(pendings=0)


PREFETCH_KERNEL = with_globals(gmm_ws.gmm_ws_kernel, jit=gluon.jit, consumer=consumer_prefetch)
WS8 = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True, band_tiles=8)
WS = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True)
CONFIGS = {"ws8": WS8, "ws": WS}


def product(config, transpose, prefetch):
  """backend_triton.gmm jitted with config (gmm_ws_kernel, or the prefetching kernel where prefetch), traced now."""
  f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose,
                                out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
  kernel = PREFETCH_KERNEL if prefetch else gmm_ws.gmm_ws_kernel
  return f, mock.patch.object(gmm_ws, "gmm_ws_kernel", kernel)


def variants(name, m, k, n, g):
  """[(label, fn of no arguments)] of every variant of the case's forward and d lhs, compiled."""
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  runs = []
  for prod, lhs, transpose in (("fwd", inp.x, False), ("dlhs", inp.dout, True)):
    for label, config in CONFIGS.items():
      for prefetch in (False, True):
        f, patch = product(config, transpose, prefetch)
        with patch:
          jax.block_until_ready(f(lhs, inp.w, bounds))
        runs.append((f"{name} {prod} {label}{' prefetch' if prefetch else ''}", functools.partial(f, lhs, inp.w,
                                                                                                bounds)))
  return runs


def check():
  """Both kernels against the float64 oracle and each other on small cases: empty groups, a group's last band
  taking leftover row tiles, rows outside the groups (zeros), N not a multiple of the tile, fewer tiles than
  programs, G = 1, both rhs layouts."""
  rng = np.random.default_rng(0)
  cases = [([0, 300, 0, 1100, 17, 0, 700], 256, 640), ([2000], 128, 512), ([5, 3], 64, 256), ([900, 0, 1300], 192,
                                                                                            384)]
  for sizes, k, n in cases:
    m = sum(sizes) + 37  # Rows after the groups: zeros.
    g = len(sizes)
    for transpose in (False, True):
      lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
      rhs = jnp.asarray(rng.standard_normal((g, n, k) if transpose else (g, k, n)), jnp.bfloat16)
      bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, g, m)
      want = oracle.gmm(np.asarray(lhs, np.float64), np.asarray(rhs, np.float64), np.asarray(sizes),
                        transpose_rhs=transpose)
      for label, config in CONFIGS.items():
        outs = []
        for prefetch in (False, True):
          f, patch = product(config, transpose, prefetch)
          with patch:
            outs.append(np.asarray(f(lhs, rhs, bounds), np.float64))
        err = oracle.rel_err(outs[1], want)
        same = np.array_equal(outs[0], outs[1])
        print(f"sizes {sizes} k {k} n {n} transpose {transpose} {label}: prefetch rel err {err:.1e}, "
              f"identical to gmm_ws: {same}", flush=True)
        assert same and err < 1e-2, (sizes, k, n, transpose, label)
  print("PASS")


def compile_only():
  """Both kernels compiled for sm_90 on the CPU (JGMM_TARGET): ptxas's registers and spills, and the SASS's order
  of schedule loads (L: LDG), HGMMAs (H) and wgmma waits (w) per kernel: the prefetching consumer's loads for the
  next tile should sit among its HGMMAs, the tree's after its last wait."""
  from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel

  s = jax.ShapeDtypeStruct
  tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  m, k, n, g = 32768, 2048, 7168, 32  # dsv3 down's forward.
  for prefetch in (False, True):
    _compile._cache.clear()
    f, patch = product(WS8, False, prefetch)
    with patch:
      f.trace(s((m, k), jnp.bfloat16), s((g, k, n), jnp.bfloat16), s((g + 1,), jnp.int32)).lower(
          lowering_platforms=("cuda",))
    (compiled,) = _compile._cache.values()
    with tempfile.TemporaryDirectory() as d:
      with open(f"{d}/k.ptx", "w") as out:
        out.write(compiled.asm["ptx"])
      for tool in ("ptxas", "ptxas-blackwell"):
        run = subprocess.run([f"{tools}/{tool}", "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True, check=False)
        if "Unsupported .version" not in run.stderr:
          break
      run.check_returncode()
      sass = subprocess.run([f"{tools}/cuobjdump", "--dump-sass", f"{d}/k.cubin"], capture_output=True, text=True,
                            check=True).stdout
    marks = "".join("H" if "GMMA" in line else "w" if "WARPGROUP.DEPBAR" in line else "L"
                    for line in sass.splitlines() if re.search(r"GMMA|WARPGROUP\.DEPBAR|LDG", line))
    print(f"prefetch {prefetch}: " + "; ".join(line.split(": ", 1)[-1] for line in run.stderr.splitlines()
                                               if "Used" in line or "spill" in line))
    print(f"  LDG (L) / HGMMA (H) / wait (w) order: {marks}", flush=True)


if __name__ == "__main__":
  mode = sys.argv[1]
  if mode == "check":
    check()
    sys.exit()
  if mode == "compile":
    compile_only()
    sys.exit()
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down"]
  print(backend_triton._device().kind, flush=True)
  rows = []
  for case in [c for c in CASES if c[0] in names]:
    runs = variants(*case)
    for prod in ("fwd", "dlhs"):
      for label in CONFIGS:
        mine = {name: f for name, f in runs if name.split()[1:3] == [prod, label]}
        ms = timed_ms({name: (f, jax_sync) for name, f in mine.items()}, mode)
        sol = speed_of_light_ms(*case[1:])
        base = ms[next(iter(ms))]
        rows += [(name, t, 100 * sol / t, base / t) for name, t in ms.items()]
  print("\n| case product variant | ms | %SOL | speedup vs gmm_ws |\n|---|---|---|---|")
  for name, t, sol, speedup in rows:
    print(f"| {name} | {t:.3f} | {sol:.0f}% | {speedup:.3f} |")
