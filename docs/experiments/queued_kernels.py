"""Where a queued call's wall time goes: the kernels' own time against the GPU's idle time between them, after a
second of the same calls (the clock as back-to-back runs leave it), per kernel.

    python docs/experiments/queued_kernels.py recipe [CALLS]
        fp8_gmm's forward+backward (weights quantised ahead) and the bf16 gmm's on the dsv3 cases (issue 15)
    python docs/experiments/queued_kernels.py bf16 CASE,... [CALLS]
        jgmm.gmm's forward and forward+backward on bench.CASES names, e.g. qwen3-30b-a3b-gateup (issue 17: a case
        whose time differs between version sets; run it under each)

Per implementation: wall ms a call (CALLS calls queued, default 20, one sync), the traced span a call (first
kernel's start to last kernel's end), the kernels' summed time a call, the idle share of the span, and each kernel's
mean time a call (recipe_kernels.py times each once, cold, at the clock an idle GPU starts with).
"""
import collections
import sys
import time

import jax

import jgmm
from jgmm import bench, timing

MODE = sys.argv[1]
CASES = ("dsv3-ep8-gateup", "dsv3-ep8-down") if MODE == "recipe" else tuple(sys.argv[2].split(","))
REST = sys.argv[2:] if MODE == "recipe" else sys.argv[3:]
CALLS = int(REST[0]) if REST else 20


def profile(call):
  """(wall ms a call, span ms a call, kernel ms a call, {kernel: mean ms a call}) of CALLS queued calls (one
  sync, timing.traced_events)."""
  start = time.perf_counter()
  while time.perf_counter() - start < 1.0:
    out = call()
  timing.jax_sync(out)
  wall = []

  def queued():
    start = time.perf_counter()
    outs = [call() for _ in range(CALLS)]
    timing.jax_sync(outs[-1])
    wall.append(time.perf_counter() - start)

  events = timing.traced_events(queued)
  if not events:
    sys.exit("no GPU kernel was traced: this script needs a GPU")
  span = (max(end for _, end, _ in events) - events[0][0]) / 1e6
  busy = sum(end - begin for begin, end, _ in events) / 1e6
  per_kernel = collections.defaultdict(float)
  for begin, end, name in events:
    per_kernel[name[:60]] += (end - begin) / 1e6 / CALLS
  return wall[0] * 1e3 / CALLS, span / CALLS, busy / CALLS, per_kernel


def calls(inp):
  """{label: a call returning its outputs} of MODE on one case's inputs."""
  args = (inp.x, inp.w, inp.group_sizes, inp.dout)
  if MODE == "recipe":
    fp8 = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights))
    bf16 = bench.fwd_bwd(jgmm.gmm)
    weights = jax.jit(jgmm.quantize_weights)(inp.w)
    return {"fp8": lambda: fp8(*args, weights), "bf16": lambda: bf16(*args)}
  forward, fwd_bwd = jax.jit(jgmm.gmm), bench.fwd_bwd(jgmm.gmm)
  return {"forward": lambda: forward(*args[:3]), "fwd+bwd": lambda: fwd_bwd(*args)}


print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, triton {__import__('triton').__version__}")
for name, m, k, n, g in bench.CASES:
  if name not in CASES:
    continue
  for label, call in calls(bench.Inputs(m, k, n, g)).items():
    timing.jax_sync(call())
    wall, span, busy, per_kernel = profile(call)
    print(f"\n# {name} {label}: wall {wall:.3f} ms a call, span {span:.3f}, kernels {busy:.3f}, "
          f"idle {100 * (1 - busy / span):.1f}% of the span")
    for kernel, ms in sorted(per_kernel.items(), key=lambda item: -item[1]):
      if ms > 0.002:
        print(f"{ms * 1e3:9.1f} us  {kernel}")
