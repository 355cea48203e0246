"""Where a back-to-back forward+backward's wall time goes (issue 15): kernels' own time against the GPU's idle
time between them, fp8_gmm (weights quantised ahead) and the bf16 gmm on the dsv3 cases, after a second of the
same calls (the clock as the benchmark's interleaved batches leave it).

    python docs/experiments/recipe_gaps.py [CALLS]

Per implementation: wall ms a call (CALLS calls queued, one sync), the traced span a call (first kernel's start to
last kernel's end, over CALLS), the kernels' summed time a call, the idle share of the span, and each kernel's mean
time (the kernels that recipe_kernels.py times once, cold, at the clock an idle GPU starts with).
"""
import collections
import glob
import sys
import tempfile
import time

import jax

import jgmm
from jgmm import bench, timing

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def device_events(trace_dir):
  """[(start_ns, end_ns, name)] of the trace's GPU kernels, by start."""
  data = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
  return sorted((e.start_ns, e.start_ns + e.duration_ns, e.name) for plane in data.planes
                if plane.name.startswith("/device:") for line in plane.lines for e in line.events)


def profile(call):
  """(wall ms a call, span ms a call, kernel ms a call, {kernel: mean ms a call}) of CALLS queued calls."""
  start = time.perf_counter()
  while time.perf_counter() - start < 1.0:
    out = call()
  timing.jax_sync(out)
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    outs = [call() for _ in range(CALLS)]
    timing.jax_sync(outs[-1])
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    events = device_events(trace_dir)
  span = (max(end for _, end, _ in events) - events[0][0]) / 1e6
  busy = sum(end - begin for begin, end, _ in events) / 1e6
  per_kernel = collections.defaultdict(float)
  for begin, end, name in events:
    per_kernel[name[:60]] += (end - begin) / 1e6 / CALLS
  return wall * 1e3 / CALLS, span / CALLS, busy / CALLS, per_kernel


for name, m, k, n, g in bench.CASES:
  if name not in ("dsv3-ep8-gateup", "dsv3-ep8-down"):
    continue
  inp = bench.Inputs(m, k, n, g)
  fp8 = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights))
  bf16 = bench.fwd_bwd(jgmm.gmm)
  args = (inp.x, inp.w, inp.group_sizes, inp.dout)
  weights = jax.jit(jgmm.quantize_weights)(inp.w)
  for label, call in (("fp8", lambda: fp8(*args, weights)), ("bf16", lambda: bf16(*args))):
    timing.jax_sync(call())
    wall, span, busy, per_kernel = profile(call)
    print(f"\n# {name} {label}: wall {wall:.3f} ms a call, span {span:.3f}, kernels {busy:.3f}, "
          f"idle {100 * (1 - busy / span):.1f}% of the span")
    for kernel, ms in sorted(per_kernel.items(), key=lambda item: -item[1]):
      if ms > 0.02:
        print(f"{ms * 1e3:9.1f} us  {kernel}")
