"""A/B (issue 17, session 52): the group table of gmm_kernel, tgmm_kernel and gmm_fp8_kernel at least a warp wide
(geometry.group_table_lanes: >= 32 lanes) against next_pow2(G) lanes (before; patched in while tracing "narrow").

heuristic_sweep.py found gmm_kernel 25-34% behind gmm_ws at 4-16 uniform groups and level at 1, 32 and 128 groups,
on the same tiles; a first A/B (the width set by an environment variable on 5056c84's tree, not committed) put it on
the table's width: 2-16 groups 0.409-0.429 ms with next_pow2(G) lanes, 0.339-0.345 with 32 (M 32768, K 2048, N
1536). This one measures the change as built, on products and on mixtral's forward+backward (whose d lhs runs
gmm_kernel on 8 groups), interleaved.

    python docs/experiments/group_table_width.py          # gmm_kernel, tgmm_kernel, mixtral's d lhs
    python docs/experiments/group_table_width.py hetero   # jgmm.grouped_matmul's problem table (session 53)

"hetero" times jgmm.grouped_matmul on jgmm.bench_hetero's cases of 2-16 problems (bf16 and FP8), its problem table
(jgmm/grouped_matmul.py, _problem_table) next_pow2(P) columns wide against group_table_lanes'.
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import backend_triton, bench, bench_hetero, config_table
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.triton_kernels import geometry
from table_ab import patched_variants, timed  # docs/experiments/table_ab.py, beside this file


def narrow_and_wide(make):
  """{"narrow": (f, sync), "wide": (f, sync)}: make() -> f (a jitted call on fixed inputs), traced and compiled
  with next_pow2(G) lanes and with group_table_lanes' (the outputs checked equal)."""
  return patched_variants(make, geometry, "group_table_lanes",
                          {"narrow": geometry.next_pow2, "wide": geometry.group_table_lanes})


def row(what, fns):
  ms = timed("time", fns)
  print(f"| {what} | {ms['narrow']:.3f} | {ms['wide']:.3f} | {ms['narrow'] / ms['wide']:.3f} |", flush=True)


def main():
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)  # noqa: E731
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}\n| product | narrow ms | wide ms | speed-up |\n|---|---|---|---|", flush=True)
  m, k, n = 32768, 2048, 1536
  gk64 = Config(64, 256, 32, 4, 4, programs_per_sm=2)  # The sm_90 heuristic's where K <= 2048.
  for g in (4, 8, 16, 32):
    lhs, rhs, bounds = normal(m, k), normal(g, k, n), jnp.arange(g + 1, dtype=jnp.int32) * (m // g)
    row(f"gmm_kernel 64 x 256 x 32 fwd, {g} groups of {m // g}, K {k}, N {n}", narrow_and_wide(
        lambda: functools.partial(jax.jit(functools.partial(
            backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False, out_dtype=jnp.bfloat16,
            activation=None, save_preactivation=False, config=gk64)), lhs, rhs, bounds)))
  g = 8
  x, dout, bounds = normal(m, k), normal(m, n), jnp.arange(g + 1, dtype=jnp.int32) * (m // g)
  row(f"tgmm_kernel 128 x 256 x 64, {g} groups of {m // g}, K {k}, N {n}", narrow_and_wide(
      lambda: functools.partial(jax.jit(functools.partial(
          backend_triton.tgmm, existing_out=None, transpose_lhs=True, out_dtype=jnp.bfloat16, bias_grad=False,
          config=Config(128, 256, 64, 8, 3))), x, dout, bounds)))
  name, m, k, n, g = next(c for c in bench.CASES if c[0] == "mixtral8x7b-w1")
  inp = bench.Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  key = config_table.make_key("gmm_t", "bfloat16", "bfloat16", m / g, n, k, g, transpose=True)
  dlhs = config_table.select(key, arch=device.arch, device_kind=device.kind).config
  row(f"{name} d lhs (table: {'gmm_ws' if dlhs.warp_specialized else 'gmm_kernel'})", narrow_and_wide(
      lambda: functools.partial(jax.jit(functools.partial(
          backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=True, out_dtype=jnp.bfloat16,
          activation=None, save_preactivation=False, config=dlhs)), inp.dout, inp.w, bounds)))
  row(f"{name} fwd+bwd (jgmm.gmm)", narrow_and_wide(
      lambda: functools.partial(bench.fwd_bwd(jgmm.gmm).lower(inp.x, inp.w, inp.group_sizes, inp.dout).compile(),
                                inp.x, inp.w, inp.group_sizes, inp.dout)))


def hetero():
  kind = backend_triton._device().kind  # pylint: disable=protected-access
  print(f"\n{kind}\n| grouped_matmul case | narrow ms | wide ms | speed-up |\n|---|---|---|---|", flush=True)
  for name, shapes in bench_hetero.CASES.items():
    if len(shapes) >= 32:  # The same 32 or more columns both ways.
      continue
    lhs, rhs = bench_hetero._inputs(shapes)  # pylint: disable=protected-access
    if name.endswith(bench_hetero.FP8_SUFFIX):
      make = lambda: bench_hetero._fp8_impl(lhs, rhs)[0]  # pylint: disable=protected-access  # noqa: E731
    else:
      make = lambda: functools.partial(jax.jit(lambda l, r: jgmm.grouped_matmul(l, r)), lhs, rhs)  # noqa: E731
    row(f"{name} ({len(shapes)} problems)", narrow_and_wide(make))


if __name__ == "__main__":
  hetero() if sys.argv[1:] == ["hetero"] else main()
