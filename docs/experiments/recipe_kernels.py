"""Every GPU kernel of one fp8_gmm forward+backward (weights quantised ahead) and of the bf16 gmm's, with its time,
on the dsv3 cases (issue 15): where the recipe's time goes, fusions and copies included.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python docs/experiments/recipe_kernels.py run [WGRAD_SCALE] > kernels.csv
    python docs/experiments/recipe_kernels.py table kernels.csv

WGRAD_SCALE: fp8_gmm's wgrad_scale, "128x1" (the default) or "group".
"""
import collections
import csv
import sys

if sys.argv[1] == "table":
  rows = [r for r in csv.reader(open(sys.argv[2])) if len(r) > 10]
  header = rows[0]
  name, value, launch = header.index("Kernel Name"), header.index("Metric Value"), header.index("ID")
  runs = collections.defaultdict(list)
  for r in rows[1:]:
    runs[int(r[launch])] = (r[name], float(r[value].replace(",", "")) / 1e3)
  for i, (kernel, us) in sorted(runs.items()):
    print(f"{i:4d} {us:9.1f} us  {kernel[:110]}")
  sys.exit()

import jax
import torch  # Its runtime's profiler switch covers the whole process.

import jgmm
from jgmm import bench, timing

wgrad_scale = sys.argv[2] if len(sys.argv) > 2 else "128x1"
for name, m, k, n, g in bench.CASES:
  if name not in ("dsv3-ep8-gateup", "dsv3-ep8-down"):
    continue
  inp = bench.Inputs(m, k, n, g)
  fp8 = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights, wgrad_scale=wgrad_scale))
  bf16 = bench.fwd_bwd(jgmm.gmm)
  args = (inp.x, inp.w, inp.group_sizes, inp.dout)
  weights = jax.jit(jgmm.quantize_weights)(inp.w)
  for _ in range(2):
    timing.jax_sync(fp8(*args, weights))
    timing.jax_sync(bf16(*args))
  print(f"# {name}: fp8 then bf16", file=sys.stderr, flush=True)
  torch.cuda.cudart().cudaProfilerStart()
  timing.jax_sync(fp8(*args, weights))
  torch.cuda.synchronize()
  timing.jax_sync(bf16(*args))
  torch.cuda.cudart().cudaProfilerStop()
