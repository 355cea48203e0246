"""Experiment (issue 17, session 52): gmm_kernel asking the L2 for the rhs tile PREFETCH steps ahead of its TMA loads
(cp.async.bulk.prefetch.L2, JGMM_PREFETCH read when a kernel is traced), the table's configs, the benchmark's cases.

    python docs/experiments/prefetch_ab.py time|sustained [CASE,...] [AHEAD,...]   (default AHEAD 0,4,8,16)
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync
from table_ab import timed  # docs/experiments/table_ab.py, beside this file


def main():
  mode = sys.argv[1]
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES]
  aheads = [int(a) for a in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0, 4, 8, 16]
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}, {mode}\n| case | product | " + " | ".join(f"ahead {a}" for a in aheads) + " |\n|---|---|"
        + "---|" * len(aheads), flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    for product, op, lhs, kk, nn in (("fwd", "gmm", inp.x, k, n), ("dlhs", "gmm_t", inp.dout, n, k)):
      key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op == "gmm_t")
      config = config_table.select(key, arch=device.arch, device_kind=device.kind).config
      if config is None or config.warp_specialized:
        continue
      fns, outs = {}, {}
      for a in aheads:
        os.environ["JGMM_PREFETCH"] = str(a)
        f = functools.partial(jax.jit(functools.partial(
            backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=op == "gmm_t", out_dtype=jnp.bfloat16,
            activation=None, save_preactivation=False, config=config)), lhs, inp.w, bounds)
        outs[a] = np.asarray(f().astype(jnp.float32))  # Traced (and compiled) under this JGMM_PREFETCH.
        fns[a] = (f, jax_sync)
      same = all(np.array_equal(outs[a], outs[aheads[0]]) for a in aheads)
      ms = timed(mode, fns)
      sol = speed_of_light_ms(m, kk, nn, g)
      cells = " | ".join(f"{ms[a]:.3f} ({ms[aheads[0]] / ms[a]:.3f}x)" for a in aheads)
      print(f"| {name} | {product} ({100 * sol / ms[aheads[0]]:.0f}%, same output {same}) | {cells} |", flush=True)


if __name__ == "__main__":
  main()
