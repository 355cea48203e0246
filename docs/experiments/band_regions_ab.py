"""A/B (issue 17, session 40): bands of row tiles that end with their group, against the orders before.

Session 39's DRAM counters put the forward's gmm_ws (bands of 8) at 2.2x the bytes its operands hold on mixtral, and
gmm_kernel at 1.5x on dsv3 gate-up: gmm_ws banded the row tiles of all groups together (a band straddled two groups
and read both weights), and common.tile_coords ended a group of 9 row tiles with a band of 1 (which read the group's
weights again). The tree now bands each group's row tiles and lets the last band take the rest. Variants per case
and product (forward "fwd": gmm; d lhs "dlhs": gmm with rhs transposed), each this GPU's table config unless named:
  tree    the tree's order
  before  the order before: gmm_ws through a schedule whose one region holds every row tile (its bands straddle
          groups as before; only the very last band differs), gmm_kernel with the tile_coords of before (below)
  ws8     the warp-specialised kernel, 128 x 256 x 64, 3 stages, bands of 8 (the tree's order)
  gk      gmm_kernel, 128 x 256 x 64, 3 stages, persistent, TMA (the tree's order)

    python docs/experiments/band_regions_ab.py time [CASE,...]      (BATCH_S=0.5: batches of 0.5 s, not 0.05)
    [SECONDS=2] python docs/experiments/band_regions_ab.py sustained [CASE,...]   (session 42: each variant alone
        for SECONDS under the power cap, 3 rounds, jgmm.timing.sustained_runs; interleaved batches share one clock,
        so they cannot show a variant's energy saving)
    VARIANTS=tree,before: only those variants
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        python docs/experiments/band_regions_ab.py ncu [CASE,...]
"""
import functools
import os
import statistics
import sys
import types
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, sustained_runs, time_interleaved
from jgmm.triton_kernels import gmm as gmm_kernels


@triton.jit
def tile_coords_before(local, m_tiles, N_TILES, GROUP_M: tl.constexpr):
  """common.tile_coords before session 40: the last band holds m_tiles % GROUP_M row tiles where that is not 0."""
  if GROUP_M == 1:
    return local // N_TILES, local % N_TILES
  tiles_per_band = GROUP_M * N_TILES
  band = local // tiles_per_band
  first_m = band * GROUP_M
  band_m = tl.minimum(m_tiles - first_m, GROUP_M)
  within = local - band * tiles_per_band
  return first_m + within % band_m, within // band_m


def with_globals(jit_fn, **names):
  """jit_fn's Python function compiled again with some of the names it calls bound to others."""
  fn = jit_fn.fn
  new = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__)
  new.__annotations__, new.__module__, new.__qualname__ = fn.__annotations__, fn.__module__, fn.__qualname__
  return triton.jit(new)


GMM_KERNEL_BEFORE = with_globals(gmm_kernels.gmm_kernel, group_tile=with_globals(gmm_kernels.group_tile,
                                                                                 tile_coords=tile_coords_before))
_row_tiles = backend_triton._row_tiles


def one_region_row_tiles(bounds, m, row_tiles, block_m):
  """_row_tiles with every row tile in one region: gmm_ws_kernel's bands over all groups' row tiles together."""
  schedule = _row_tiles(bounds, m, row_tiles, block_m)
  return schedule.at[1 + 4 * row_tiles:1 + 5 * row_tiles].set(0).at[1 + 5 * row_tiles:].set(schedule[0])


WS8 = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True, band_tiles=8)
GK = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)


def variants(name, m, k, n, g, device):
  """[(label, jitted fn, args)] of every variant of the case's forward and d lhs."""
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  runs = []
  for product, lhs, kk, nn, transpose in (("fwd", inp.x, k, n, False), ("dlhs", inp.dout, n, k, True)):
    key = config_table.make_key("gmm_t" if transpose else "gmm", "bfloat16", "bfloat16", m / g, kk, nn, g,
                                transpose=transpose)
    table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
    configs = {"tree": table, "before": table, "ws8": WS8, "gk": GK}
    for label, config in configs.items():
      if label not in os.environ.get("VARIANTS", ",".join(configs)).split(","):
        continue
      if label in ("ws8", "gk") and config == table:
        continue
      if label == "before" and table.warp_specialized and table.band_tiles > 1:
        patch = mock.patch.object(backend_triton, "_row_tiles", one_region_row_tiles)
      elif label == "before" and not table.warp_specialized:
        patch = mock.patch.object(backend_triton.gmm_kernels, "gmm_kernel", GMM_KERNEL_BEFORE)
      elif label == "before":
        continue  # Row-major gmm_ws: the same order before and after.
      else:
        patch = mock.patch.object(backend_triton, "_row_tiles", _row_tiles)  # No change.
      f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose,
                                    out_dtype=jnp.bfloat16, activation=None, save_preactivation=False,
                                    config=config))
      with patch:  # Compiled (and the schedule traced) inside it.
        jax.block_until_ready(f(lhs, inp.w, bounds))
      runs.append((f"{name} {product} {label}", f, (lhs, inp.w, bounds), config))
  return runs


if __name__ == "__main__":
  mode = sys.argv[1]
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down"]
  device = backend_triton._device()
  print(device.kind, flush=True)
  if mode == "ncu":
    import torch  # Its runtime's profiler switch covers the whole process.
    runs = [r for c in CASES if c[0] in names for r in variants(*c, device)]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, f, args, _ in runs:
      jax.block_until_ready(f(*args))
    torch.cuda.cudart().cudaProfilerStop()
    for i, (label, *_) in enumerate(runs):
      print(f"profiled {i}: {label}")
    sys.exit()
  rows = []
  for case in [c for c in CASES if c[0] in names]:
    runs = variants(*case, device)
    for product in ("fwd", "dlhs"):
      mine = [r for r in runs if r[0].split()[1] == product]
      outs = {label: np.asarray(f(*args), np.float32) for label, f, args, _ in mine}
      ref = outs[mine[0][0]]
      for label, out in outs.items():
        print(f"{label}: rel diff vs tree {np.linalg.norm(out - ref) / np.linalg.norm(ref):.1e}; "
              f"{next(r[3] for r in mine if r[0] == label)}", flush=True)
      fns = {label: (functools.partial(f, *args), jax_sync) for label, f, args, _ in mine}
      if mode == "sustained":
        ms = {label: statistics.median(run.ms for run in runs)
              for label, runs in sustained_runs(fns, float(os.environ.get("SECONDS", 2)), rounds=3).items()}
      else:
        ms = time_interleaved(fns, min_batch_s=float(os.environ.get("BATCH_S", 0.05)), batches=9)
      sol = speed_of_light_ms(*case[1:])
      rows += [(label, t, 100 * sol / t, ms[mine[0][0]] / t) for label, t in ms.items()]
  print(f"\n{device.kind}\n| case product variant | ms | %SOL | speedup vs tree |\n|---|---|---|---|")
  for label, t, sol, speedup in rows:
    print(f"| {label} | {t:.3f} | {sol:.0f}% | {speedup:.3f} |")
