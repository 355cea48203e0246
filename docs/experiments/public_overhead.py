"""What the public jgmm.gmm costs over its kernel (session 50): per benchmark case, interleaved, the jitted
jgmm.gmm(x, w, group_sizes) (the benchmark's forward) and the same kernel and config through backend_triton.gmm on
bounds computed once outside (the kernel alone). Nothing else in the interleave: a batch after a near-idle one (a
tiny jitted call is host-bound) runs at a higher clock (session 44).

    python docs/experiments/public_overhead.py [CASE,...]
"""
import functools
import sys

import jax
import jax.numpy as jnp

import jgmm
from jgmm import backend_triton
from jgmm.bench import CASES, Inputs
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved


def main():
  names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in CASES]
  print("| case | jgmm.gmm ms | kernel alone ms | public - kernel us |\n|---|---|---|---|")
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = jax.jit(functools.partial(group_bounds, group_offset=None, num_groups=g, m=m))(inp.group_sizes)
    kernel = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                       out_dtype=jnp.bfloat16, activation=None, save_preactivation=False,
                                       config=None))
    public = jax.jit(jgmm.gmm)
    fns = {"public": (functools.partial(public, inp.x, inp.w, inp.group_sizes), jax_sync),
           "kernel": (functools.partial(kernel, inp.x, inp.w, bounds), jax_sync)}
    ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
    print(f"| {name} | {ms['public']:.4f} | {ms['kernel']:.4f} | "
          f"{1e3 * (ms['public'] - ms['kernel']):.1f} |", flush=True)


if __name__ == "__main__":
  main()
