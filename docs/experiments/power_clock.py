"""Is a kernel bound by the GPU's power cap? Runs each forward of jgmm.bench's cases (jgmm, torch._grouped_mm and the
dense product of the same FLOPs) back to back for a few seconds while nvidia-smi samples the SM clock and the power
draw every 20 ms; prints per implementation its TFLOP/s over that run and the median clock and power of the samples
taken during it (jgmm.timing.sustained_runs: timed after half a second, once the clock has settled), and from those
the share of the tensor cores' peak per clock (4096 bf16 FLOP per clock per SM) and the FLOPs per joule: under the
power cap the second sets the sustained rate. Issue 17, session 26; CONFIGS (session 40): jgmm's forward also through
each named config of CONFIG_CHOICES ("table" is the jgmm row). ROUNDS (session 41): each case's runs ROUNDS times, every
other round in reverse order (a run's rank must not be its place in the sequence); per implementation the median TFLOP/s
of its rounds, their range, and the clock and power of all its samples.

INTERLEAVE=BATCH_SECONDS: instead of sustained runs, ROUNDS rounds of one batch of about BATCH_SECONDS of each
implementation in turn (jgmm.timing.interleaved_runs, the benchmark's timing at 0.05; SECONDS unused): the clock and
power each implementation's batches see there, against the sustained runs', and (session 42) each implementation's rate
by the implementation whose batch ran just before it. ORDER=reverse: the implementations in the opposite order.
RAGGED=1 (session 43): jax.lax.ragged_dot's forward too, as in the benchmark's interleaved forwards (whose jgmm rate,
705 TFLOP/s on mixtral on an H200, is well above this script's interleave without it, 620 in session 42, and the
sustained 605, while torch's is 592-603 in all three: which predecessor gives jgmm its lead there?). Session 44: every
implementation's batch after ragged_dot's ran 8-13% faster than after any other; jgmm.bench now times ragged_dot
apart.
PRODUCT=dlhs: the backward's d lhs product (dout @ w[g].T, gmm with transpose_rhs) instead of the forward, the table's
and each config's, beside the dense product of the same FLOPs (torch's has no such call alone).

    [PRODUCT=dlhs] [INTERLEAVE=BATCH_SECONDS] [ORDER=reverse] python docs/experiments/power_clock.py [CASE,...]
      [SECONDS] [CONFIG,...] [ROUNDS]
"""
import functools
import os
import subprocess
import sys
import tempfile
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
    # Session 43: ws8 and its row-major form on clusters of 2 CTAs, the lhs tile multicast (cluster tile 128 x 512;
    # Triton >= 3.7, else the one-CTA kernel runs the same config).
    "ws8c2": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                    band_tiles=8, cluster_size=2),
    "wsc2": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                   cluster_size=2),
}
CONFIGS = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else []
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 1
DLHS = os.environ.get("PRODUCT", "forward") == "dlhs"
INTERLEAVE = float(os.environ.get("INTERLEAVE", "0"))
REVERSE = os.environ.get("ORDER") == "reverse"
RAGGED = os.environ.get("RAGGED") == "1"


def sampler(log):
  """nvidia-smi sampling of this process's GPU (nvidia-smi lists every GPU whatever CUDA_VISIBLE_DEVICES says) into the
  file log (a pipe would fill after ~40 s of samples and stall it)."""
  return subprocess.Popen(["nvidia-smi", "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
                           "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"],
                          stdout=log, text=True)


def samples_between(lines, t0, t1):
  """(clock MHz, power W) of the samples whose timestamps fall in [t0, t1] (time.time() seconds)."""
  picked = []
  for line in lines:
    stamp, clock, power = [f.strip() for f in line.split(",")]
    t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + stamp.split(".")[1])
    if t0 <= t <= t1:
      picked.append((float(clock), float(power)))
  return np.array(picked).reshape(-1, 2)


def print_by_predecessor(spans):
  """Per case and implementation, the median TFLOP/s of its batches by the implementation whose batch ran just
  before (interleaved_runs' balanced orders give each predecessor about equally many)."""
  print("\n| case | impl | after | TFLOP/s (median) | batches |\n|---|---|---|---|---|")
  for case in dict.fromkeys(name for name, _, _ in spans):
    batches = sorted((run.start, impl, flops / run.ms / 1e9)
                     for (name, impl, flops), runs in spans.items() if name == case for run in runs)
    rates = {}
    for (_, before, _), (_, impl, rate) in zip(batches, batches[1:]):
      rates.setdefault((impl, before), []).append(rate)
    for (impl, before), rs in sorted(rates.items()):
      print(f"| {case} | {impl} | {before} | {np.median(rs):.0f} | {len(rs)} |")


if __name__ == "__main__":
  cases = []
  for name, m, k, n, g in bench.CASES:
    if name not in NAMES:
      continue
    inp = bench.Inputs(m, k, n, g)
    if DLHS:
      dense = jax.jit(lambda dout, w: dout @ w.T)
      impls = {"jgmm": functools.partial(jax.jit(functools.partial(jgmm.gmm, transpose_rhs=True)), inp.dout, inp.w,
                                         inp.group_sizes),
               "dense_dot": functools.partial(dense, inp.dout, inp.w[0])}
    else:
      impls = {name_: fns[0] for name_, fns in bench._jax_impls(inp).items() if RAGGED or name_ != "ragged_dot"}
    for config in CONFIGS:
      f = jax.jit(functools.partial(jgmm.gmm, transpose_rhs=DLHS, config=CONFIG_CHOICES[config]))
      impls[f"jgmm {config}"] = functools.partial(f, inp.dout if DLHS else inp.x, inp.w, inp.group_sizes)
    torch_impls = None if DLHS else bench._torch_impls(inp, m, k, n, g)
    if torch_impls is not None:
      impls["torch_grouped_mm"] = torch_impls[0][0]
    fns = {}
    for impl, f in list(impls.items())[::-1 if REVERSE else 1]:
      sync = bench._torch_sync if impl.startswith("torch") else timing.jax_sync
      sync(f())  # Compiled before any timing.
      fns[impl] = (f, sync)
    cases.append((name, 2 * m * k * n, fns))
  log = tempfile.TemporaryFile("w+")
  proc = sampler(log)
  time.sleep(1.0)
  spans = {}  # (case, impl, FLOPs): [timing.Run of each round]
  for name, flops, fns in cases:
    timed = (timing.interleaved_runs(fns, INTERLEAVE, ROUNDS) if INTERLEAVE else
             timing.sustained_runs(fns, SECONDS, ROUNDS))
    for impl, runs in timed.items():
      spans[name, impl, flops] = runs
  proc.terminate()
  proc.wait()
  log.seek(0)
  lines = [line for line in log.read().splitlines() if line.count(",") == 2]
  sms = backend_triton._device().num_sms
  print("| case | impl | TFLOP/s (median) | range | SM clock MHz (median) | power W (median) | % of peak per clock "
        "| GFLOP/J | samples |\n|---|---|---|---|---|---|---|---|---|")
  for (name, impl, flops), runs in spans.items():
    s = np.concatenate([samples_between(lines, *run.wall) for run in runs])
    rates = [flops / run.ms / 1e9 for run in runs]
    tflops = np.median(rates)
    clock, power = (np.median(s[:, 0]), np.median(s[:, 1])) if len(s) else (float("nan"), float("nan"))
    per_clock = 100 * tflops * 1e12 / (sms * 4096 * clock * 1e6)
    print(f"| {name} | {impl} | {tflops:.0f} | {min(rates):.0f}-{max(rates):.0f} | {clock:.0f} | {power:.0f} | "
          f"{per_clock:.0f}% | {tflops * 1e3 / power:.0f} | {len(s)} |")
  if INTERLEAVE:
    print_by_predecessor(spans)
