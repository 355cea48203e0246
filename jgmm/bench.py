"""Benchmark: jgmm against jax.lax.ragged_dot, a dense jnp.dot of the same FLOPs and torch._grouped_mm.

    python -m jgmm.bench [--out DIR] [--cases NAME,...] [--tune] [--fp8]

A script, not a test; it needs a GPU. For each MoE case (shapes of real models, bf16, balanced routing):
forward and forward+backward (jax.value_and_grad of a scalar loss; torch autograd) side by side in one
process. Prints ms (median of timed batches), TFLOP/s, % of speed of light (speed_of_light_ms with the H200
ceilings of moe_shapes.py, and with this GPU's own, measured at start by measure_ceilings) and ratios; writes
bench.json (and bench.png if matplotlib imports) to --out. Timing: wall clock around a batch of asynchronous calls
ended by one synchronisation (the same for JAX and torch), median of several batches, after warm-up.
Implementations are timed round-robin, batch by batch, so all see the same clocks (a GPU under full load
slows down within a second). jax.lax.ragged_dot does G times the work of a gmm: it runs forward only, and
is timed by a single warm call where one takes more than --ragged-cap seconds.

--tune sweeps candidate configs of every kernel each case runs (gmm forward, gmm with rhs transposed for
d lhs, tgmm for d rhs; --tune-ops picks) and writes tuned.json: the table this GPU reads with the fastest
configs put in, to ship as configs/<arch>-<model>.json (jgmm.config_table.table_files names it). Timings and
lessons of each kernel version: docs/perf-notes.md.

--fp8 runs the FP8 section instead (jgmm.bench_fp8: DeepGEMM's cases, torch's FP8 peers; --cases filters its
case names; --tune sweeps the FP8 kernels' configs first).
"""
import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import backend_triton, config_table
from jgmm.config import Config
from jgmm.ops import group_bounds

# From ../shared/perf/moe_shapes.py (the GPU machine gets only this repository): (name, M, K, N, G).
CASES = [
    ("mixtral8x7b-w1", 8192, 4096, 14336, 8),
    ("qwen3-30b-a3b-gateup", 32768, 2048, 1536, 128),
    ("dsv3-ep8-gateup", 32768, 7168, 4096, 32),
    ("dsv3-ep8-down", 32768, 2048, 7168, 32),
    ("decode-small", 512, 4096, 2048, 64),
]


def group_sizes(m, g, seed=0):
  rng = np.random.default_rng(seed)
  return rng.multinomial(m, np.full(g, 1.0 / g)).astype(np.int32)


H200_CEILINGS = (797e12, 4.3e12)  # bf16 FLOP/s and bytes/s measured on an H200: moe_shapes.py's defaults.


def speed_of_light_ms(m, k, n, g, peak_flops=H200_CEILINGS[0], bandwidth=H200_CEILINGS[1]):
  """Lower bound on one bf16 gmm: the larger of compute time and memory time (H200 ceilings by default)."""
  return 1e3 * max(2 * m * k * n / peak_flops, 2 * (m * k + g * k * n + m * n) / bandwidth)


def measure_ceilings(repeats=5):
  """(bf16 FLOP/s, bytes/s) of this GPU, measured as moe_shapes.py's H200 defaults were: an 8192^3 bf16 product
  (jnp.dot, random data) and an elementwise pass over 2 GiB (bytes read plus written). The fastest of `repeats`
  timings, so that the ceilings are not understated."""
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  a, b = (jax.random.normal(key, (8192, 8192), jnp.bfloat16) for key in (k1, k2))
  big = jax.random.uniform(k3, (2**29,), jnp.float32)
  dot, add = jax.jit(jnp.dot), jax.jit(lambda x: x + 1.0)
  dot_ms = min(time_ms(lambda: dot(a, b), _jax_sync, batches=1) for _ in range(repeats))
  add_ms = min(time_ms(lambda: add(big), _jax_sync, batches=1) for _ in range(repeats))
  return 2 * 8192**3 / dot_ms * 1e3, 2 * big.nbytes / add_ms * 1e3


def time_ms(fn, sync, min_batch_s=0.05, batches=7):
  """Median ms per call of fn() over `batches` timed batches (each ended by sync()), after warm-up."""
  return time_interleaved({"fn": (fn, sync)}, min_batch_s, batches)["fn"]


def time_interleaved(fns, min_batch_s=0.05, batches=7, cap_s=None):
  """{name: median ms per call} of fns {name: (fn, sync)}.

  Each fn is warmed up (compiled) and timed once to size its batch; then the batches run round-robin, one
  per fn in turn, so that every implementation sees the same clocks and temperature (a GPU at full load
  slows down within a second). A fn whose single warm call takes longer than cap_s is timed by that call.
  """
  reps, result = {}, {}
  for name, (fn, sync) in fns.items():
    sync(fn())
    start = time.perf_counter()
    sync(fn())
    per_call = max(time.perf_counter() - start, 1e-6)
    if cap_s is not None and per_call > cap_s:
      result[name] = 1e3 * per_call
    else:
      reps[name] = max(1, int(min_batch_s / per_call))
  samples = {name: [] for name in reps}
  for _ in range(batches):
    for name in reps:
      fn, sync = fns[name]
      start = time.perf_counter()
      for _ in range(reps[name] - 1):
        fn()
      sync(fn())
      samples[name].append((time.perf_counter() - start) / reps[name])
  result.update({name: 1e3 * statistics.median(times) for name, times in samples.items()})
  return result


def _jax_sync(x):
  jax.block_until_ready(x)


class Inputs:
  """bf16 random inputs of one case (fresh normal values, scaled to keep outputs O(1))."""

  def __init__(self, m, k, n, g, seed=0):
    key = jax.random.key(seed)
    k1, k2, k3 = jax.random.split(key, 3)
    self.sizes = group_sizes(m, g)
    self.x = (jax.random.normal(k1, (m, k), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    self.w = jax.random.normal(k2, (g, k, n), jnp.bfloat16)
    self.dout = jax.random.normal(k3, (m, n), jnp.bfloat16)
    self.group_sizes = jnp.asarray(self.sizes)


def _loss(out, dout):
  return jnp.vdot(out.astype(jnp.float32), dout.astype(jnp.float32))


def _jax_impls(inp):
  """{impl: (forward, forward+backward or None)}, each a no-argument call. Arrays are passed as arguments
  (never closed over, which would embed them in the program as constants)."""
  gmm_fwd = jax.jit(jgmm.gmm)
  gmm_fb = jax.jit(jax.value_and_grad(lambda x, w, gs, dout: _loss(jgmm.gmm(x, w, gs), dout), argnums=(0, 1)))
  ragged = jax.jit(jax.lax.ragged_dot)
  dense = jax.jit(jnp.dot)
  dense_fb = jax.jit(jax.value_and_grad(lambda x, w, dout: _loss(jnp.dot(x, w), dout), argnums=(0, 1)))
  x, w, gs, dout = inp.x, inp.w, inp.group_sizes, inp.dout
  w_dense = w[0]
  return {
      "jgmm": (lambda: gmm_fwd(x, w, gs), lambda: gmm_fb(x, w, gs, dout)),
      "ragged_dot": (lambda: ragged(x, w, gs), None),
      "dense_dot": (lambda: dense(x, w_dense), lambda: dense_fb(x, w_dense, dout)),
  }


def _torch_impls(inp, m, k, n, g):
  try:
    import torch
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
      return None, None
  except ImportError:
    return None, None
  torch.manual_seed(0)
  x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k**0.5
  w_nk = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)  # (G, K, N) with column-major planes
  dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
  offs = torch.cumsum(torch.as_tensor(inp.sizes, device="cuda"), 0).int()
  x_grad = x.clone().requires_grad_()
  w_grad = w_nk.clone().requires_grad_()

  def fwd():
    return torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)

  def fwd_bwd():  # The gradient of sum(out * dout), as jgmm's loss; out.backward(dout) adds no elementwise pass.
    x_grad.grad = w_grad.grad = None  # Assigned, not accumulated into the last call's gradients.
    out = torch._grouped_mm(x_grad, w_grad.transpose(-2, -1), offs=offs)
    out.backward(dout)
    return out

  def sync(_):
    torch.cuda.synchronize()

  return (fwd, fwd_bwd), sync


def bench_case(name, m, k, n, g, ragged_cap_s, ceilings):
  """Timings of every implementation on one case: forwards interleaved, then forward+backwards. % of speed of light
  against the H200 defaults (fwd_pct_sol) and against `ceilings`, this GPU's (fwd_pct_sol_device)."""
  flops = 2 * m * k * n
  inp = Inputs(m, k, n, g)
  impls = {impl: (fwd, fwd_bwd, _jax_sync) for impl, (fwd, fwd_bwd) in _jax_impls(inp).items()}
  torch_fns, torch_sync = _torch_impls(inp, m, k, n, g)
  if torch_fns is not None:
    impls["torch_grouped_mm"] = (*torch_fns, torch_sync)
  forward = {}
  for impl, (fwd, _, sync) in impls.items():
    try:
      sync(fwd())
      forward[impl] = (fwd, sync)
    except Exception as e:  # ragged_dot may run out of memory on the large cases.
      print(f"  {name} {impl}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
  fwd_ms = time_interleaved(forward, cap_s=ragged_cap_s)
  fwd_bwd_ms = time_interleaved({impl: (fb, sync) for impl, (_, fb, sync) in impls.items()
                                 if fb is not None and impl in forward})

  def floor(impl, peaks=H200_CEILINGS):  # The dense reference reads one (K, N) weight, not G: its floor is g = 1's.
    return speed_of_light_ms(m, k, n, 1 if impl == "dense_dot" else g, *peaks)

  rows = {}
  for impl, ms in fwd_ms.items():
    rows[impl] = {"fwd_ms": ms, "fwd_bwd_ms": fwd_bwd_ms.get(impl), "fwd_tflops": flops / ms / 1e9,
                  "fwd_pct_sol": 100 * floor(impl) / ms, "fwd_pct_sol_device": 100 * floor(impl, ceilings) / ms}
  return {"case": name, "m": m, "k": k, "n": n, "g": g, "sol_ms": floor("jgmm"),
          "sol_ms_device": floor("jgmm", ceilings), "impls": rows}


def _print_table(results):
  print("\n% SOL: of speed_of_light_ms with the H200 ceilings; % SOL here: with this GPU's measured ceilings.")
  print("| case | impl | fwd ms | TFLOP/s | % SOL | % SOL here | fwd+bwd ms | fwd vs torch | fwd+bwd vs torch |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in results:
    torch_row = r["impls"].get("torch_grouped_mm")
    for impl, row in r["impls"].items():
      fb = row["fwd_bwd_ms"]
      ratio = ratio_fb = ""
      if torch_row and impl != "torch_grouped_mm":
        ratio = f"{torch_row['fwd_ms'] / row['fwd_ms']:.2f}x"
        ratio_fb = f"{torch_row['fwd_bwd_ms'] / fb:.2f}x" if fb else ""
      print(f"| {r['case']} | {impl} | {row['fwd_ms']:.3f} | {row['fwd_tflops']:.0f} | {row['fwd_pct_sol']:.0f}% | "
            f"{row['fwd_pct_sol_device']:.0f}% | "
            f"{fb if fb is None else f'{fb:.3f}'} | {ratio} | {ratio_fb} |")
  with_torch = [r for r in results if "torch_grouped_mm" in r["impls"] and "jgmm" in r["impls"]]
  if with_torch:
    fwd = [r["impls"]["torch_grouped_mm"]["fwd_ms"] / r["impls"]["jgmm"]["fwd_ms"] for r in with_torch]
    fb = [r["impls"]["torch_grouped_mm"]["fwd_bwd_ms"] / r["impls"]["jgmm"]["fwd_bwd_ms"] for r in with_torch]
    print(f"\njgmm vs torch._grouped_mm geomean: forward {statistics.geometric_mean(fwd):.3f}x, "
          f"forward+backward {statistics.geometric_mean(fb):.3f}x")


def _plot(results, path):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return
  impls = sorted({i for r in results for i in r["impls"]})
  fig, ax = plt.subplots(figsize=(10, 4))
  width = 0.8 / len(impls)
  for j, impl in enumerate(impls):
    values = [r["impls"].get(impl, {}).get("fwd_pct_sol_device", 0) for r in results]
    ax.bar([i + j * width for i in range(len(results))], values, width, label=impl)
  ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))], [r["case"] for r in results], fontsize=8)
  ax.set_ylabel("forward, % of this GPU's speed of light")
  ax.axhline(100, color="k", lw=0.5)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------------------------------------
# Tuning

_GMM_CANDIDATES = [
    Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
    Config(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4),
    # Two programs per SM (98 KB of shared memory and <= 255 registers of 128 threads each).
    Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2),
    Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=3, programs_per_sm=2),
    Config(block_m=128, block_n=128, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2),
    # The warp-specialised Gluon kernel (gmm_kernel with the same tiles where it does not apply).
    Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True),
]
_SMALL_GMM_CANDIDATES = [
    Config(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=5),
    Config(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=6),
    Config(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=6),
    Config(block_m=16, block_n=128, block_k=64, num_warps=4, num_stages=8),
    Config(block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=4),
]
_TGMM_CANDIDATES = [
    Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
    Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
    Config(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
]
_SMALL_TGMM_CANDIDATES = [
    Config(block_m=128, block_n=256, block_k=16, num_warps=8, num_stages=3),
    Config(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=3),
    Config(block_m=128, block_n=128, block_k=16, num_warps=4, num_stages=4),
]


def tune_case(m, k, n, g, ops):
  """{table key: fields of the fastest config} for the kernels `ops` ("gmm": forward, "gmm_t": d lhs, "tgmm":
  d rhs) of one case's forward and backward."""
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  x, w, dout = inp.x, inp.w, inp.dout
  small = m / g <= 32

  def gmm(lhs, rhs, bounds, config, transpose_rhs):
    return backend_triton.gmm(lhs, rhs, bounds, None, None, transpose_rhs=transpose_rhs, out_dtype=jnp.bfloat16,
                              activation=None, save_preactivation=False, config=config)

  def tgmm(lhs, rhs, bounds, config):
    return backend_triton.tgmm(lhs, rhs, bounds, None, transpose_lhs=True, out_dtype=jnp.bfloat16,
                               bias_grad=False, config=config)

  kernels = {  # key: (candidates, fn(config, transpose) -> out, its array arguments)
      config_table.table_key("gmm", "bfloat16", m / g, k, n): (
          _SMALL_GMM_CANDIDATES if small else _GMM_CANDIDATES, functools.partial(gmm, transpose_rhs=False),
          (x, w, bounds)),
      config_table.table_key("gmm_t", "bfloat16", m / g, n, k): (
          _SMALL_GMM_CANDIDATES if small else _GMM_CANDIDATES, functools.partial(gmm, transpose_rhs=True),
          (dout, w, bounds)),
      config_table.table_key("tgmm", "bfloat16", m / g, k, n): (
          _SMALL_TGMM_CANDIDATES if small else _TGMM_CANDIDATES, tgmm, (x, dout, bounds)),
  }
  # gmm kernels: each candidate with TMA loads and with pointer loads, where the device has TMA.
  tma_variants = (True, False) if backend_triton._device().tma else (False,)
  best = {}
  for key, (candidates, run, arrays) in kernels.items():
    op = key.split("/")[0]
    if op not in ops:
      continue
    timings = []
    variants = (False,) if op == "tgmm" else tma_variants
    for config in [dataclasses.replace(c, tma=t) for c in candidates for t in variants]:
      jitted = jax.jit(functools.partial(run, config=config))
      try:
        ms = time_ms(lambda: jitted(*arrays), _jax_sync, min_batch_s=0.02, batches=5)
      except Exception as e:  # A config that does not compile or launch is skipped.
        print(f"  {key} {config}: failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
        continue
      timings.append((ms, config, jitted))
      print(f"  {key} {ms:.3f} ms {config}", flush=True)
    # Bursts drift with the GPU's clocks: the three fastest are timed again, interleaved, to pick one.
    finalists = sorted(timings, key=lambda t: t[0])[:3]
    if finalists:
      rerun = time_interleaved({i: (functools.partial(jitted, *arrays), _jax_sync)
                                for i, (_, _, jitted) in enumerate(finalists)}, min_batch_s=0.03, batches=5)
      i = min(rerun, key=rerun.get)
      best[key] = dataclasses.asdict(finalists[i][1])
      print(f"  best {key}: {rerun[i]:.3f} ms {finalists[i][1]}", flush=True)
  return best


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="bench_out", help="directory for bench.json, bench.png, tuned.json")
  parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
  parser.add_argument("--ragged-cap", type=float, default=1.0,
                      help="seconds: ragged_dot is timed by a single call once one call takes longer")
  parser.add_argument("--tune", action="store_true",
                      help="sweep configs; write tuned.json: this GPU's table updated with the fastest")
  parser.add_argument("--tune-ops", default="gmm,gmm_t,tgmm", help="kernels to tune: gmm, gmm_t, tgmm")
  parser.add_argument("--no-bench", action="store_true", help="with --tune: skip the benchmark")
  parser.add_argument("--fp8", action="store_true", help="the FP8 section (jgmm.bench_fp8) instead")
  args = parser.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    sys.exit("jgmm.bench needs a GPU")
  os.makedirs(args.out, exist_ok=True)
  if args.fp8:
    from jgmm import bench_fp8  # Imports jgmm.bench: a cycle resolved at call time.
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    bench_fp8.run(args.out, args.cases, args.tune)
    return
  cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
  device = jax.devices()[0]
  print(f"device: {device.device_kind}, jax {jax.__version__}", flush=True)
  if args.tune:
    gpu = backend_triton._device()
    table = {key: dataclasses.asdict(config) for key, config in config_table._table(gpu.arch, gpu.kind).items()}
    for name, m, k, n, g in cases:
      print(f"tuning {name}", flush=True)
      table.update(tune_case(m, k, n, g, args.tune_ops.split(",")))
    with open(os.path.join(args.out, "tuned.json"), "w") as f:
      json.dump({"entries": table}, f, indent=1, sort_keys=True)
    print(f"wrote tuned.json: this GPU's table, to ship as configs/{config_table.table_files(gpu.arch, gpu.kind)[0]}",
          flush=True)
  if args.no_bench:
    return
  ceilings = measure_ceilings()
  print(f"ceilings measured here: {ceilings[0] / 1e12:.0f} TFLOP/s bf16, {ceilings[1] / 1e12:.2f} TB/s "
        f"(H200 defaults: {H200_CEILINGS[0] / 1e12:.0f}, {H200_CEILINGS[1] / 1e12:.2f})", flush=True)
  results = []
  for name, m, k, n, g in cases:
    print(f"benchmarking {name}", flush=True)
    results.append(bench_case(name, m, k, n, g, args.ragged_cap, ceilings))
  _print_table(results)
  with open(os.path.join(args.out, "bench.json"), "w") as f:
    json.dump({"device": device.device_kind, "jax": jax.__version__, "ceilings": {"flops": ceilings[0],
               "bytes_per_s": ceilings[1]}, "results": results}, f, indent=1)
  _plot(results, os.path.join(args.out, "bench.png"))


if __name__ == "__main__":
  main()
