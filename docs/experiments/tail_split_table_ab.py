"""A/B (issue 17, session 48): Config.tail_split on the table's configs, the benchmark's cases.

For each case's forward (gmm) and d lhs (gmm_t) whose table config runs a persistent kernel at block_n >= 128 (one
CTA), that config without tail_split and with it, on the same inputs: interleaved, or each alone for SECONDS
(sustained, the GPU's clock under its power cap). Session 47's prototypes (docs/experiments/tail_split_ab.py,
gk_tail_split_ab.py, coords_prefetch_ab.py at commit 387b2ad) measured the same on the kernels alone.

    python docs/experiments/tail_split_table_ab.py time [CASE,...]
    [SECONDS=1] python docs/experiments/tail_split_table_ab.py sustained [CASE,...]
"""
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp

from jgmm import backend_triton
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync
from table_ab import gmm_call, table_gmm_products, timed  # docs/experiments/table_ab.py, beside this file


def main():
  mode = sys.argv[1]
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES]
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}, {mode}\n| case | product | kernel | without ms | with ms | %SOL with | speedup |\n"
        "|---|---|---|---|---|---|---|", flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    for product, op, args, kk, nn, config in table_gmm_products(inp, bounds, m, k, n, g, device):
      if config is None or config.block_n < 128 or not config.persistent or config.cluster_size > 1:
        continue
      fns = {split: (functools.partial(jax.jit(functools.partial(gmm_call(op == "gmm_t"), config=dataclasses.replace(
          config, tail_split=split))), *args), jax_sync) for split in (False, True)}
      ms = timed(mode, fns)
      kernel = "gmm_ws" if config.warp_specialized else "gmm_kernel"
      print(f"| {name} | {product} | {kernel} | {ms[False]:.3f} | {ms[True]:.3f} | "
            f"{100 * speed_of_light_ms(m, kk, nn, g) / ms[True]:.0f}% | {ms[False] / ms[True]:.3f} |", flush=True)


if __name__ == "__main__":
  main()
