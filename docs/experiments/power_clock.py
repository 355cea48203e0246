"""Is a kernel bound by the GPU's power cap? Runs each forward of jgmm.bench's cases (jgmm, torch._grouped_mm and the
dense product of the same FLOPs) back to back for a few seconds while nvidia-smi samples the SM clock and the power
draw every 20 ms; prints per implementation its TFLOP/s over that run and the median clock and power of the samples
taken during it (the first half second left out: the clock settles), and from those the share of the tensor cores'
peak per clock (4096 bf16 FLOP per clock per SM) and the FLOPs per joule: under the power cap the second sets the
sustained rate. Issue 17, session 26; CONFIGS (session 40): jgmm's forward also through each named config of
CONFIG_CHOICES ("table" is the jgmm row).

    python docs/experiments/power_clock.py [CASE,...] [SECONDS] [CONFIG,...]
"""
import functools
import subprocess
import sys
import time

import jax
import numpy as np

import jgmm
from jgmm import backend_triton, bench, timing
from jgmm.config import Config

NAMES = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-down"]
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
CONFIG_CHOICES = {  # The tables' bf16 forward kernels on the compute-bound cases.
    "ws8": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                  band_tiles=8),
    "gk": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    "gk64": Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2),
}
CONFIGS = sys.argv[3].split(",") if len(sys.argv) > 3 else []


def sampler():
  return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                           "-lms", "20"], stdout=subprocess.PIPE, text=True)


def samples_between(lines, t0, t1):
  """(clock MHz, power W) of the samples whose timestamps fall in [t0, t1] (time.time() seconds)."""
  picked = []
  for line in lines:
    stamp, clock, power = [f.strip() for f in line.split(",")]
    t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + stamp.split(".")[1])
    if t0 <= t <= t1:
      picked.append((float(clock), float(power)))
  return np.array(picked).reshape(-1, 2)


if __name__ == "__main__":
  runs = []
  for name, m, k, n, g in bench.CASES:
    if name not in NAMES:
      continue
    inp = bench.Inputs(m, k, n, g)
    impls = {name_: fns[0] for name_, fns in bench._jax_impls(inp).items() if name_ != "ragged_dot"}
    for config in CONFIGS:
      f = jax.jit(functools.partial(jgmm.gmm, config=CONFIG_CHOICES[config]))
      impls[f"jgmm {config}"] = functools.partial(f, inp.x, inp.w, inp.group_sizes)
    torch_impls = bench._torch_impls(inp, m, k, n, g)
    if torch_impls is not None:
      impls["torch_grouped_mm"] = torch_impls[0][0]
    for impl, f in impls.items():
      sync = bench._torch_sync if impl.startswith("torch") else timing.jax_sync
      sync(f())
      runs.append((name, impl, f, sync, 2 * m * k * n))
  proc = sampler()
  time.sleep(1.0)
  spans = []
  for name, impl, f, sync, flops in runs:
    t0 = time.time()
    calls = 0
    while time.time() - t0 < SECONDS:
      for _ in range(10):
        out = f()
      sync(out)
      calls += 10
    t1 = time.time()
    spans.append((name, impl, t0 + 0.5, t1, calls * flops / (t1 - t0) / 1e12))
    time.sleep(1.0)  # Idle between runs: each starts from the same clock.
  proc.terminate()
  lines = [line for line in proc.communicate()[0].splitlines() if line.count(",") == 2]
  sms = backend_triton._device().num_sms
  print("| case | impl | TFLOP/s | SM clock MHz (median) | power W (median) | % of peak per clock | GFLOP/J "
        "| samples |\n|---|---|---|---|---|---|---|---|")
  for name, impl, t0, t1, tflops in spans:
    s = samples_between(lines, t0, t1)
    clock, power = (np.median(s[:, 0]), np.median(s[:, 1])) if len(s) else (float("nan"), float("nan"))
    per_clock = 100 * tflops * 1e12 / (sms * 4096 * clock * 1e6)
    print(f"| {name} | {impl} | {tflops:.0f} | {clock:.0f} | {power:.0f} | {per_clock:.0f}% | "
          f"{tflops * 1e3 / power:.0f} | {len(s)} |")
