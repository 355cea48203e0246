"""The FP8 cases of `python -m jgmm.bench --fp8` timed as DeepGEMM times its published figures (its bench_kineto):
the GEMM kernel's own duration, one launch at a time, the L2 flushed before it, the clocks free (issue 15's
0.8x-of-DeepGEMM bar). Nsight Compute gives that (`--cache-control all`, its default, flushes the caches before each
kernel; `--clock-control none` leaves the boost clock). jgmm's blocks recipe (gmm_fp8_ws_kernel, without the small
XLA kernels before it) and cuBLAS's dense FP8 product of the same valid rows (rowwise scales) are measured the same
way, LAUNCHES launches each, the fastest kept.

    ncu --clock-control none --profile-from-start off --kernel-name regex:"gmm_fp8_ws|gemm|nvjet|xmma" \\
        --metrics gpu__time_duration.sum --csv python docs/experiments/fp8_kernel_only.py run [CASES] \\
        > kernels.csv 2> cases.txt
    python docs/experiments/fp8_kernel_only.py table kernels.csv cases.txt

CASES: bench_fp8.cases names, comma-separated (default: all).
"""
import csv
import sys

LAUNCHES = 3

if sys.argv[1] == "table":
  rows = [r for r in csv.reader(open(sys.argv[2])) if len(r) > 10]
  header = rows[0]
  name, value, launch = header.index("Kernel Name"), header.index("Metric Value"), header.index("ID")
  kernels = [(r[name], float(r[value].replace(",", "")) / 1e3) for r in sorted(rows[1:], key=lambda r: int(r[launch]))]
  cases = [line.split()[1:] for line in open(sys.argv[3]) if line.startswith("case ")]
  segments = []  # Per case: (jgmm's kernels, the dense product's kernels), in launch order.
  for kernel, us in kernels:
    ours = kernel.startswith("gmm_fp8_ws")
    if ours and (not segments or segments[-1][1]):
      segments.append(([], []))
    segments[-1][0 if ours else 1].append(us)
  assert len(segments) == len(cases), (len(segments), len(cases))
  print("| case | jgmm blocks us | TFLOP/s | cuBLAS dense us | TFLOP/s | DeepGEMM (H800) | jgmm vs DeepGEMM |")
  print("|---|---|---|---|---|---|---|")
  for (case, gflop, deepgemm), (ours, theirs) in zip(cases, segments):
    per = len(theirs) // LAUNCHES  # cuBLAS's kernels per product (a split-K reduction adds one)
    jgmm, dense = min(ours), min(sum(theirs[i * per:(i + 1) * per]) for i in range(LAUNCHES))
    tflops = lambda us, gflop=float(gflop): gflop / us * 1e3
    ref = float(deepgemm)
    print(f"| {case} | {jgmm:.1f} | {tflops(jgmm):.0f} | {dense:.1f} | {tflops(dense):.0f} | "
          + (f"{ref:.0f} | {tflops(jgmm) / ref:.2f}x |" if ref else " | |"))
  sys.exit()

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch's peers need room beside jax's arrays.
import jax  # noqa: E402
import torch  # noqa: E402  Its runtime's profiler switch covers the whole process.

from jgmm import bench_fp8, timing


def profiled(fn, sync):
  torch.cuda.cudart().cudaProfilerStart()
  for _ in range(LAUNCHES):
    sync(fn())
  torch.cuda.cudart().cudaProfilerStop()


for name, layout, g, rows, n, k in bench_fp8.cases(sys.argv[2] if len(sys.argv) > 2 else ""):
  x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
  product = jax.jit(bench_fp8._product(layout, rows))
  xq, xs, wq, ws, gs = bench_fp8.fp8_operands(x, w, groups, bench_fp8.RECIPES["blocks"])
  call = lambda: product(xq, wq, gs, xs, ws)
  dense = bench_fp8._torch_peers(layout, x, w, rows, valid)[0]["torch_scaled_mm_dense"]
  timing.jax_sync(call())  # Compiled outside the profiled ranges.
  dense()
  torch.cuda.synchronize()
  profiled(call, timing.jax_sync)
  profiled(dense, lambda _: torch.cuda.synchronize())
  print(f"case {name} {2 * valid * n * k / 1e9} {bench_fp8.DEEPGEMM.get((layout, g, rows, n, k)) or 0}",
        file=sys.stderr, flush=True)
