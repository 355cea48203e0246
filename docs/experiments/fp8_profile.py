"""Where gmm_fp8_ws_kernel's time goes (issue 15): its 128- and 256-wide tiles, block and rowwise scales, stages.

python docs/experiments/fp8_profile.py time [VARIANT,...] [CASE INDEX,...]
    interleaved TFLOP/s of each variant (default: all) on each case (default: all; valid rows; each call chains the
    product as bench_fp8 does), each output checked against the first variant's (DeepGEMM's diff); a variant named
    KERNEL:VARIANT runs docs/experiments/gmm_fp8_ws_KERNEL.py, a changed copy of the kernel (base: the kernel before
    the change under test, `git show REV:triton_kernels/gmm_fp8_ws.py > docs/experiments/gmm_fp8_ws_base.py`); m192_*
    192-row tiles
python docs/experiments/fp8_profile.py ncu [VARIANT,...]
    each (case, variant) once more after a warm-up, between cudaProfilerStart/Stop, for
    `ncu --profile-from-start off` (docs/experiments/fp8_profile.sh), in the order printed
"""
import functools
import importlib
import os
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, bench_fp8, oracle, quantize, timing
from jgmm.config import Config

CASES = [("contiguous", 4, 8192, 4096, 7168), ("contiguous", 4, 8192, 7168, 2048), ("contiguous", 8, 4096, 4096, 7168),
         ("masked", 1, 1024, 7168, 2048), ("masked", 1, 1024, 4096, 7168), ("masked", 32, 192, 4096, 7168),
         ("masked", 2, 512, 4096, 7168), ("masked", 2, 512, 7168, 2048), ("masked", 4, 256, 4096, 7168),
         ("masked", 4, 256, 7168, 2048), ("masked", 6, 1024, 4096, 7168), ("masked", 6, 1024, 7168, 2048)]
VARIANTS = {  # name: (lhs recipe, rhs recipe, block_n, stages, block_m)
    "blocks_128_s4": ("1x128", "128x128", 128, 4, 128), "blocks_256_s3": ("1x128", "128x128", 256, 3, 128),
    "rows_128_s4": ("row", "row", 128, 4, 128), "rows_256_s3": ("row", "row", 256, 3, 128),
    "blocks_128_s5": ("1x128", "128x128", 128, 5, 128), "rows_128_s5": ("row", "row", 128, 5, 128),
    "m192_blocks_128_s4": ("1x128", "128x128", 128, 4, 192), "m192_rows_128_s4": ("row", "row", 128, 4, 192)}
sys.path.insert(0, os.path.dirname(__file__))
MODULES = {}  # {variant named KERNEL:VARIANT: the module docs/experiments/gmm_fp8_ws_KERNEL.py}


def case_fns(layout, g, rows, n, k):
  """({variant: fn}, valid rows, runs) of one case: each fn the public op on inputs quantised for its recipe, run
  `runs` times in one program (bench_fp8's inputs, op and chaining)."""
  x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
  gs = jnp.asarray(groups)
  runs = bench_fp8._runs(valid, n, k)
  fns = {}
  for name, (xr, wr, block_n, stages, block_m) in VARIANTS.items():
    args = (*quantize.quantize(x, xr), *quantize.quantize(w, wr), gs)
    config = Config(block_m=block_m, block_n=block_n, block_k=128, num_stages=stages, warp_specialized=True)
    f = bench_fp8._chained(bench_fp8._product(layout, rows, config), runs)
    if name in MODULES:  # Traced here with that copy of the kernel.
      with mock.patch.object(backend_triton, "gmm_fp8_ws", MODULES[name]):
        f = f.trace(*args).lower().compile()
    fns[name] = functools.partial(f, *args)
  return fns, valid, runs


if __name__ == "__main__":
  print(jax.devices()[0].device_kind, flush=True)
  if len(sys.argv) > 2:  # A subset of the variants, e.g. blocks_128_s4,base:blocks_128_s4
    names = sys.argv[2].split(",")
    MODULES = {name: importlib.import_module("gmm_fp8_ws_" + name.split(":")[0]) for name in names if ":" in name}
    VARIANTS = {name: VARIANTS[name.split(":")[-1]] for name in names}
  if len(sys.argv) > 3:  # A subset of the cases by index, e.g. 0,2,5
    CASES = [CASES[int(i)] for i in sys.argv[3].split(",")]
  if sys.argv[1] == "time":
    table = []
    for case in CASES:
      fns, valid, runs = case_fns(*case)
      outs = {}
      for name, f in fns.items():
        try:
          outs[name] = np.asarray(f(), np.float32)
        except Exception as e:  # noqa: BLE001 - a variant that fails is reported and left out
          print(f"{case} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
      ref = outs[next(iter(outs))]
      print(case, {name: f"{oracle.deepgemm_diff(out, ref):.1e}" for name, out in outs.items()}, flush=True)
      ms = timing.time_interleaved({name: (fns[name], timing.jax_sync) for name in outs}, min_batch_s=0.03,
                                   batches=7)
      _, _, _, n, k = case
      table.append((case, {name: 2 * valid * n * k * runs / t / 1e9 for name, t in ms.items()}))
      print(case, {name: round(v) for name, v in table[-1][1].items()}, flush=True)
    print("\n| case | " + " | ".join(VARIANTS) + " |\n|---|" + "---|" * len(VARIANTS))
    for case, tflops in table:
      print(f"| {case[0]} {case[1]}x{case[2]} ({case[3]}, {case[4]}) | "
            + " | ".join(f"{tflops[v]:.0f}" if v in tflops else "-" for v in VARIANTS) + " |")
  else:
    runs = []
    for case in CASES:
      fns = case_fns(*case)[0]
      runs += [(case, name, fns[name]) for name in VARIANTS]
    for _, _, f in runs:
      timing.jax_sync(f())
    import torch  # Its runtime's profiler switch covers the whole process.
    torch.cuda.cudart().cudaProfilerStart()
    for case, name, f in runs:
      timing.jax_sync(f())
    torch.cuda.cudart().cudaProfilerStop()
    for i, (case, name, _) in enumerate(runs):
      print(f"profiled {i}: {case} {name}")
