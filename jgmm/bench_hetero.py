"""Benchmark of jgmm.grouped_matmul (independent products of different sizes, one launch) on a GPU.

    python -m jgmm.bench_hetero [--out DIR] [--cases NAME,...]

A script, not a test. Cases (bf16): 8 LoRA-style products (M = K = 4096, N = 16..128 of mixed ranks), 16 prefill
requests of 37..2048 tokens each times its own (4096, 4096) weight, and the sizes of Triton's grouped-GEMM
tutorial (one product each of 1024^3, 512^3, 256^3, 128^3; four N^3 products for N = 128..1024); and in FP8
(DeepSeek-V3's blocks: lhs 1x128, rhs 128x128, stored (N, K)), the LoRA and prefill shapes ("lora8-fp8",
"prefill16-fp8"). Implementations, forward only, timed interleaved with jgmm.timing.time_interleaved:
  jgmm:        jit(jgmm.grouped_matmul), one kernel launch (FP8 cases: on operands quantised beforehand, so the
               GEMMs alone are timed, as DeepGEMM's benchmarks do);
  jgmm_bf16:   FP8 cases: the same problems in bf16 through jit(jgmm.grouped_matmul);
  dot_loop:    a Python loop over a jitted jnp.dot, one dispatch and launch per problem (bf16);
  dot_jit:     bf16 cases: one jitted function of one jnp.dot per problem (XLA schedules P GEMMs in one program);
  torch_gmm:   bf16 cases: torch._grouped_mm where the problems fit its layouts (same K and N: 2D x 3D with
               offsets over inputs already concatenated into one buffer, which it needs; same M, N, K: 3D x 3D).
Prints ms per implementation, TFLOP/s of jgmm, jgmm's speedup over each, jgmm's relative error against the float32
product of the bf16 operands (FP8: ~3e-2, the quantisation's), and the geomean speedups of the bf16 and the FP8
cases; writes bench_hetero.json to --out.
"""
import argparse
import json
import math
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import quantize
from jgmm.timing import time_interleaved


def _prefill_lengths(count=16, low=37, high=2048, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.sort(rng.integers(low, high + 1, count))
  lengths[0], lengths[-1] = low, high
  return [int(x) for x in lengths]


# name -> list of (M, N, K).
CASES = {
    "lora8": [(4096, n, 4096) for n in (16, 32, 64, 128, 128, 64, 32, 16)],
    "prefill16": [(m, 4096, 4096) for m in _prefill_lengths()],
    "tutorial-mixed": [(s, s, s) for s in (1024, 512, 256, 128)],
    **{f"tutorial-4x{s}": [(s, s, s)] * 4 for s in (128, 256, 512, 1024)},
}
FP8_SUFFIX = "-fp8"
CASES.update({name + FP8_SUFFIX: CASES[name] for name in ("lora8", "prefill16")})


def _inputs(shapes, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2 * len(shapes))
  lhs = [(jax.random.normal(keys[2 * i], (m, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
         for i, (m, n, k) in enumerate(shapes)]
  rhs = [jax.random.normal(keys[2 * i + 1], (k, n), jnp.bfloat16) for i, (m, n, k) in enumerate(shapes)]
  return lhs, rhs


def _jax_impls(lhs, rhs):
  """{name: (fn, sync)}; arrays are arguments, never closed over (which would make them constants)."""
  grouped = jax.jit(jgmm.grouped_matmul)
  dot = jax.jit(jnp.dot)
  dots = jax.jit(lambda ls, rs: [jnp.dot(a, b) for a, b in zip(ls, rs)])
  sync = jax.block_until_ready
  return {
      "jgmm": (lambda: grouped(lhs, rhs), sync),
      "dot_loop": (lambda: [dot(a, b) for a, b in zip(lhs, rhs)], sync),
      "dot_jit": (lambda: dots(lhs, rhs), sync),
  }


def _fp8_impl(lhs, rhs):
  """(fn, sync) of jgmm.grouped_matmul on the problems quantised to FP8 (lhs_i 1x128, rhs_i (N_i, K_i) 128x128)."""
  lhs_q, lhs_s = zip(*[quantize.quantize(a, "1x128") for a in lhs])
  rhs_q, rhs_s = zip(*[quantize.quantize(b.T, "128x128") for b in rhs])
  grouped = jax.jit(lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=True))
  return lambda: grouped(lhs_q, rhs_q, lhs_s, rhs_s), jax.block_until_ready


def _torch_impl(shapes):
  """torch._grouped_mm on the case's layout, or None where the problems do not fit one or torch is missing."""
  try:
    import torch  # Only here: jgmm never needs torch.
  except ImportError:
    return None
  if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
    return None
  ms, ns, ks = (sorted({s[d] for s in shapes}) for d in range(3))
  if len(ns) > 1 or len(ks) > 1:
    return None
  n, k, g = ns[0], ks[0], len(shapes)
  w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)  # (G, K, N), column-major
  if len(ms) == 1:
    x = torch.randn(g, ms[0], k, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch._grouped_mm(x, w)
  else:
    x = torch.randn(sum(s[0] for s in shapes), k, device="cuda", dtype=torch.bfloat16)
    offs = torch.cumsum(torch.tensor([s[0] for s in shapes], device="cuda"), 0).int()
    fn = lambda: torch._grouped_mm(x, w, offs=offs)
  return fn, lambda _: torch.cuda.synchronize()


def bench_case(name, shapes):
  lhs, rhs = _inputs(shapes)
  fns = _jax_impls(lhs, rhs)
  if name.endswith(FP8_SUFFIX):
    fns = {"jgmm": _fp8_impl(lhs, rhs), "jgmm_bf16": fns["jgmm"], "dot_loop": fns["dot_loop"]}
  elif (torch_impl := _torch_impl(shapes)) is not None:
    fns["torch_gmm"] = torch_impl
  outs, want = fns["jgmm"][0](), [jnp.dot(a, b, preferred_element_type=jnp.float32) for a, b in zip(lhs, rhs)]
  err = max(float(jnp.linalg.norm(o.astype(jnp.float32) - w) / jnp.linalg.norm(w)) for o, w in zip(outs, want))
  ms = time_interleaved(fns)
  flops = sum(2 * m * n * k for m, n, k in shapes)
  return {"case": name, "problems": len(shapes), "shapes": shapes, "ms": ms, "rel_err_vs_xla": err,
          "jgmm_tflops": flops / ms["jgmm"] / 1e9, "speedup": {k: v / ms["jgmm"] for k, v in ms.items() if k != "jgmm"}}


def _geomean(values):
  return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="bench_out", help="directory for bench_hetero.json")
  parser.add_argument("--cases", default="", help=f"comma-separated case names (default: all of {list(CASES)})")
  args = parser.parse_args(argv)
  names = [c for c in args.cases.split(",") if c] or list(CASES)
  print(f"device: {jax.devices()[0].device_kind}")
  results = []
  for name in names:
    r = bench_case(name, CASES[name])
    results.append(r)
    timings = "  ".join(f"{k} {v:.3f}" for k, v in r["ms"].items())
    speedups = "  ".join(f"x{v:.2f} vs {k}" for k, v in r["speedup"].items())
    print(f"{name:16s} P={r['problems']:3d}  ms: {timings}  | jgmm {r['jgmm_tflops']:.0f} TFLOP/s  {speedups}"
          f"  (rel err {r['rel_err_vs_xla']:.1e})", flush=True)
  for fp8 in (False, True):
    kind = [r for r in results if r["case"].endswith(FP8_SUFFIX) == fp8]
    for impl in ("jgmm_bf16", "dot_loop", "dot_jit", "torch_gmm"):
      ratios = [r["speedup"][impl] for r in kind if impl in r["speedup"]]
      if ratios:
        print(f"geomean speedup of jgmm{' FP8' if fp8 else ''} over {impl}: x{_geomean(ratios):.3f} over "
              f"{len(ratios)} cases; slower on: {[r['case'] for r in kind if r['speedup'].get(impl, 2) < 1]}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_hetero.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
