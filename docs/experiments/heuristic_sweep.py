"""Untuned keys (issue 17, session 52): what the sm_90 heuristic gives a bf16 forward against the other kernels, over
rows per group. Session 52's expert sweep (expert_count_power.py) found the heuristic's 64 x 256 gmm_kernel (two
programs an SM, its choice wherever K <= 2048) 20% behind gmm_ws at 8 groups of 4096 rows, level at 1 and 32 (the
cause: geometry.group_table_lanes; docs/perf-notes.md session 52).

For each SHAPE (M, K, N) and G in GROUPS (uniform groups of M / G rows), the forward on fresh inputs through
backend_triton.gmm with each config, interleaved; ms and speed-up over the heuristic's config.

    python docs/experiments/heuristic_sweep.py [M,K,N ...]   (default 32768,2048,1536 32768,2048,4096 16384,1024,2048)
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, config_table
from jgmm.config import Config
from jgmm.timing import jax_sync
from table_ab import timed  # docs/experiments/table_ab.py, beside this file

CONFIGS = {
    "gk64x2": Config(64, 256, 32, 4, 4, programs_per_sm=2),
    "gk128": Config(128, 256, 64, 8, 3),
    "gk128b": Config(128, 256, 64, 8, 4),
    "ws": Config(128, 256, 64, 8, 3, warp_specialized=True),
    "ws8": Config(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8),
}
GROUPS = (1, 4, 8, 16, 32, 128)


def main():
  shapes = [tuple(int(v) for v in s.split(",")) for s in sys.argv[1:]] or [(32768, 2048, 1536), (32768, 2048, 4096),
                                                                         (16384, 1024, 2048)]
  device = backend_triton._device()  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  print(f"\n{device.kind}\n| M, K, N | G | heuristic | " + " | ".join(CONFIGS) + " |\n|---|---|---|"
        + "---|" * len(CONFIGS), flush=True)
  call = functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                           out_dtype=jnp.bfloat16, activation=None, save_preactivation=False)
  for m, k, n in shapes:
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    for g in GROUPS:
      rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16)
      bounds = jnp.arange(g + 1, dtype=jnp.int32) * (m // g)
      key = config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g)
      heuristic = config_table.heuristic_config(key, device.arch)
      fns = {name: (functools.partial(jax.jit(functools.partial(call, config=c)), lhs, rhs, bounds), jax_sync)
             for name, c in {"heuristic": heuristic, **CONFIGS}.items()}
      ms = timed("time", fns)
      name = next((k_ for k_, c in CONFIGS.items() if c == heuristic), str(heuristic))
      cells = " | ".join(f"{ms[c]:.3f} ({ms['heuristic'] / ms[c]:.2f}x)" for c in CONFIGS)
      print(f"| {m}, {k}, {n} | {g} | {ms['heuristic']:.3f} ({name}) | {cells} |", flush=True)


if __name__ == "__main__":
  main()
