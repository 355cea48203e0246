"""Is the warp-specialised forward held back by the L2 under load (issue 17, session 45)? Session 45's ncu: on mixtral
and dsv3 down, gmm_ws's tensor pipe idles 7-11% of its SMs' active cycles where cuBLAS's dense product of the same
FLOPs idles 1-3%, while gmm_ws moves 30% more L2 bytes a second (77% of the L2's peak against 57%), and its consumers
wait for their stages' bytes a third of their time. Here the same kernel and config (the table's) runs on fewer SMs
(persistent grids of 132, 88 and 44 programs by default), which takes load off the L2 but leaves each SM's pipeline
as it is: if the pipe's share of an active SM's cycles rises as the grid shrinks, the L2 under load holds it back; if
it stays, the SM's own pipeline (stages, epilogue, barriers) does. Each kernel runs once, after a warm-up, between
cudaProfilerStart/Stop, for `ncu --profile-from-start off` (grid_l2.sh).

python docs/experiments/grid_l2.py [CASE,...] [GRID,...]
"""
import dataclasses
import functools
import sys
from unittest import mock

import jax
import jax.numpy as jnp

from jgmm import backend_triton, bench, config_table
from jgmm.ops import group_bounds

NAMES = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-down"]
GRIDS = [int(g) for g in sys.argv[2].split(",")] if len(sys.argv) > 2 else [132, 88, 44]


def forward(inp, m, k, n, g, programs):
  """jgmm's forward of the case through backend_triton.gmm with the config a call selects (the GPU's table), traced
  with `programs` SMs; (that config, the call)."""
  device = backend_triton._device()
  key = config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g, transpose=False)
  config = config_table.select(key, arch=device.arch, device_kind=device.kind).config
  f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=None))
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  with mock.patch.object(backend_triton, "_device", lambda: dataclasses.replace(device, num_sms=programs)):
    f(inp.x, inp.w, bounds).block_until_ready()  # Traced and compiled (the grid fixed) while the patch holds.
  return config, functools.partial(f, inp.x, inp.w, bounds)


if __name__ == "__main__":
  import torch  # Its runtime's profiler switch covers the whole process.
  runs = []
  for name, m, k, n, g in [c for c in bench.CASES if c[0] in NAMES]:
    inp = bench.Inputs(m, k, n, g)
    for programs in GRIDS:
      config, f = forward(inp, m, k, n, g, programs)
      runs.append((name, programs, f))
      print(f"{name}: {m * k * n} FMA, config {config}, grid {programs}", flush=True)
  torch.cuda.synchronize()
  torch.cuda.cudart().cudaProfilerStart()
  for *_, f in runs:
    f().block_until_ready()
  torch.cuda.cudart().cudaProfilerStop()
  for i, (name, programs, _) in enumerate(runs):
    print(f"profiled {i}: {name} grid {programs}")
