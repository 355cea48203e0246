"""The bf16 weight gradient's DRAM traffic by tile order (issue 17, session 39): jgmm.bench's tgmm (lhs (M, K) read
transposed) through the table's config with band_tiles B for each B given, each run once after a warm-up between
cudaProfilerStart/Stop, for

    ncu --clock-control none --profile-from-start off --kernel-name regex:tgmm_ws \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum --csv \
        python docs/experiments/tgmm_order_ncu.py CASE[,CASE...] B[,B...]
"""
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp

from jgmm import backend_triton, bench, config_table
from jgmm.ops import group_bounds

if __name__ == "__main__":
  import torch  # Its runtime's profiler switch covers the whole process.
  names, bands = sys.argv[1].split(","), [int(b) for b in sys.argv[2].split(",")]
  device = backend_triton._device()
  runs = []
  for name, m, k, n, g in [c for c in bench.CASES if c[0] in names]:
    inp = bench.Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    key = config_table.make_key("tgmm", "bfloat16", "bfloat16", m / g, k, n, g, transpose=True)
    table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
    for band in bands:
      f = jax.jit(functools.partial(backend_triton.tgmm, existing_out=None, transpose_lhs=True,
                                    out_dtype=jnp.bfloat16, bias_grad=False,
                                    config=dataclasses.replace(table, band_tiles=band)))
      runs.append((f"{name} band_tiles={band}", functools.partial(f, inp.x, inp.dout, bounds)))
  for _, f in runs:
    jax.block_until_ready(f())
  torch.cuda.synchronize()
  torch.cuda.cudart().cudaProfilerStart()
  for _, f in runs:
    jax.block_until_ready(f())
  torch.cuda.cudart().cudaProfilerStop()
  for i, (what, _) in enumerate(runs):
    print(f"profiled {i}: {what}")
