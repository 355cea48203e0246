"""What grouping costs: each forward of jgmm.bench's cases against the same kernel on one group of all M rows (one
weight matrix, as a dense product), timed interleaved with torch._grouped_mm on the same two layouts and the dense
jnp.dot. If one group runs as fast as the dense product, the grouped case loses to it through its G weight matrices
(HBM and L2 traffic, tile order), not through the kernel's main loop. Issue 17, session 26.

    python docs/experiments/group_penalty.py [CASE,...]
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench, config_table
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved

NAMES = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-down"]

if __name__ == "__main__":
  import torch
  print("| case | impl | groups | ms | TFLOP/s |")
  print("|---|---|---|---|---|")
  for name, m, k, n, g in bench.CASES:
    if name not in NAMES:
      continue
    inp = bench.Inputs(m, k, n, g)
    config = config_table.select(config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g),
                                 arch="sm90").config
    f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                  out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
    one = jnp.asarray([m], jnp.int32)
    bounds = {g: group_bounds(inp.group_sizes, None, g, m), 1: group_bounds(one, None, 1, m)}
    w = {g: inp.w, 1: inp.w[:1]}
    x_t = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    w_t = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    offs = {g: torch.cumsum(torch.as_tensor(inp.sizes, device="cuda"), 0).int(),
            1: torch.as_tensor([m], device="cuda", dtype=torch.int32)}
    dense = jax.jit(jnp.dot)
    fns = {("jgmm", gg): (functools.partial(f, inp.x, w[gg], bounds[gg]), jax_sync) for gg in (g, 1)}
    fns.update({("torch_grouped_mm", gg): (functools.partial(
        torch._grouped_mm, x_t, w_t[:gg].transpose(-2, -1), offs=offs[gg]), bench._torch_sync) for gg in (g, 1)})
    fns[("dense_dot", 1)] = (functools.partial(dense, inp.x, inp.w[0]), jax_sync)
    ref = np.asarray(fns[("jgmm", 1)][0](), np.float32)
    want = np.asarray(fns[("dense_dot", 1)][0](), np.float32)
    print(f"# {name}: config {config}; one group vs dense rel diff "
          f"{np.linalg.norm(ref - want) / np.linalg.norm(want):.2e}", flush=True)
    ms = time_interleaved(fns, min_batch_s=0.05, batches=7)
    for (impl, gg), t in ms.items():
      print(f"| {name} | {impl} | {gg} | {t:.3f} | {2 * m * k * n / t / 1e9:.0f} |", flush=True)
