"""A/B of ops.group_bounds (session 50): the public jgmm.gmm, forward and forward+backward, compiled with the cumsum
that group_bounds runs where no prefix sum can overflow and with the clipped scan it ran before (patched in while
compiling), interleaved in one process, three rounds per case.

    python docs/experiments/group_bounds_ab.py CASE,...
"""
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp
from jax import lax

import jgmm
from jgmm import ops, partitioning
from jgmm.bench import CASES, Inputs, fwd_bwd
from jgmm.timing import jax_sync, time_interleaved


def scan_bounds(group_sizes, group_offset, num_groups, m):
  """group_bounds before session 50 (group_offset None only): prefix sums clipped at m by a scan."""
  del group_offset, num_groups
  sizes = ops.clip_to_int32(partitioning.replicated(group_sizes), m)
  ends = lax.associative_scan(lambda a, b: jnp.minimum(a, m - b) + b, sizes)
  return jnp.concatenate([jnp.zeros(1, jnp.int32), ends])


def compiled(args, dout):
  """(forward, forward+backward) of jgmm.gmm, compiled. A fresh function each time: jax.jit(jgmm.gmm) twice would
  share one trace, and the patch would not reach the second."""
  return (jax.jit(lambda *a: jgmm.gmm(*a)).lower(*args).compile(), fwd_bwd(jgmm.gmm).lower(*args, dout).compile())


def main():
  names = sys.argv[1].split(",")
  print("| case | forward: scan / cumsum ms | speedup | forward+backward: scan / cumsum ms | speedup |\n"
        "|---|---|---|---|---|")
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    args = (inp.x, inp.w, inp.group_sizes)
    fwd, fb = {}, {}
    fwd["cumsum"], fb["cumsum"] = compiled(args, inp.dout)
    with mock.patch.object(ops, "group_bounds", scan_bounds):
      fwd["scan"], fb["scan"] = compiled(args, inp.dout)
    assert fwd["scan"].as_text() != fwd["cumsum"].as_text(), "the patch did not reach the program"
    for _ in range(3):
      ms = time_interleaved({v: (functools.partial(f, *args), jax_sync) for v, f in fwd.items()},
                            min_batch_s=0.05, batches=9)
      ms_fb = time_interleaved({v: (functools.partial(f, *args, inp.dout), jax_sync) for v, f in fb.items()},
                               min_batch_s=0.05, batches=9)
      print(f"| {name} | {ms['scan']:.4f} / {ms['cumsum']:.4f} | {ms['scan'] / ms['cumsum']:.4f} | "
            f"{ms_fb['scan']:.4f} / {ms_fb['cumsum']:.4f} | {ms_fb['scan'] / ms_fb['cumsum']:.4f} |", flush=True)


if __name__ == "__main__":
  main()
