"""Experiment (issue 17, session 52): gmm_ws's loader asking the L2 for the rhs tile PREFETCH steps ahead of its TMA
loads (prefetch.global.L2 of each 128-byte line by inline PTX, from a group's first row tile only; JGMM_PREFETCH, read when a kernel is traced), on the table's gmm_ws
configs and on 128 x 256 x 64 (3 stages) where the table runs gmm_kernel; the benchmark's cases, UNIFORM=1: groups
of m / G rows.

    python docs/experiments/prefetch_ab.py time|sustained [CASE,...] [AHEAD,...]   (default AHEAD 0,2,4,8)
"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync
from table_ab import timed  # docs/experiments/table_ab.py, beside this file

WS = Config(128, 256, 64, 8, 3, warp_specialized=True)


def main():
  mode = sys.argv[1]
  names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES]
  aheads = [int(a) for a in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0, 2, 4, 8]
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}, {mode}, uniform {bool(os.environ.get('UNIFORM'))}\n| case | product | "
        + " | ".join(f"ahead {a}" for a in aheads) + " |\n|---|---|" + "---|" * len(aheads), flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    sizes = np.full(g, m // g, np.int32) if os.environ.get("UNIFORM") else inp.sizes
    bounds = group_bounds(jnp.asarray(sizes), None, g, m)
    for product, op, lhs, kk, nn in (("fwd", "gmm", inp.x, k, n), ("dlhs", "gmm_t", inp.dout, n, k)):
      key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op == "gmm_t")
      config = config_table.select(key, arch=device.arch, device_kind=device.kind).config
      if not config.warp_specialized or config.tail_split or config.band_tiles > 1:
        config = WS
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
      print(f"| {name} | {product} band {config.band_tiles} ({100 * sol / ms[aheads[0]]:.0f}%, same {same}) | "
            f"{cells} |", flush=True)


if __name__ == "__main__":
  main()
