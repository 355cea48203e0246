"""Benchmark: jgmm against jax.lax.ragged_dot, a dense jnp.dot of the same FLOPs, torch._grouped_mm and (where
importable) OpenAI's triton_kernels.

    python -m jgmm.bench [--out DIR] [--cases NAME,...] [--sustained SECONDS] [--tune] [--fp8]   (or: jgmm-bench ...)

A script, not a test; it needs a GPU. For each MoE case (shapes of real models, bf16, balanced routing):
forward and forward+backward (the forward and the backward for a given output cotangent dout: jax.vjp, and torch's
out.backward(dout)) side by side in one process. Prints ms (median of timed batches), TFLOP/s, % of speed of light
(speed_of_light_ms with the H200 ceilings of moe_shapes.py, and with this GPU's own, measured at start by
measure_ceilings) and ratios; writes bench.json (and bench.png if matplotlib imports: the [bench] extra) to --out
and says where. Timing (jgmm.timing): wall clock around a batch of asynchronous calls ended by one synchronisation
(the same for JAX and torch), median of several batches, after warm-up.
Implementations are timed in rounds, batch by batch, so all see the same clocks (a GPU under full load
slows down within a second), each round in another of jgmm.timing.balanced_orders' orders: under the power cap a
batch inherits the clock the one before it left (a fixed order sped jgmm's batches, which always followed torch's,
by 2.3-4.0%: session 42). Interleaved batches share one clock, so they show each kernel's work per clock but not its
energy per FLOP (--sustained below does). jax.lax.ragged_dot does G times the work of a gmm: it runs forward only,
in batches of its own after the interleave (the batch after one of ragged_dot's ran 8-13% faster, whichever the
implementation: session 44), and is timed by a single warm call where one takes more than --ragged-cap seconds.
--sustained SECONDS adds a second table: each forward and forward+backward (ragged_dot's aside) run back to back for
SECONDS after half a second's settling, twice, in reverse order the second time (jgmm.timing.sustained_runs). A GPU
under its power cap (the H100's and H200's 700 W) lowers its clock within a fraction of a second of full load, and
by how much depends on the kernel's energy per FLOP, not only its work per clock: interleaved batches of 50 ms see
a clock that a sustained run does not keep, so the two tables can rank implementations differently (session 41:
docs/perf-notes.md).

triton_kernels (python/triton_kernels of the Triton repository: a peer to measure, never a dependency of jgmm)
is timed where it imports, forward only: its ragged matmul_ogs on the case's group sizes, with the ragged
metadata built once outside the timing (as torch's group offsets are), on torch's inputs, its output checked
against torch's. JGMM_TRITON_KERNELS=DIR puts DIR (the folder holding the triton_kernels package) first on
sys.path: from the repository root a plain `import triton_kernels` finds jgmm's own kernels folder instead.

--tune first tunes every kernel each case runs (gmm forward, gmm with rhs transposed for d lhs, tgmm for d rhs;
--tune-ops picks) with jgmm-tune (jgmm/tune.py) into DIR/tuned.json, a table to use with JGMM_CONFIG_FILES or
to merge into configs/<arch>-<model>.json (jgmm.config_table.table_files names it); the benchmark that follows
does not read it unless JGMM_CONFIG_FILES names it. Timings and lessons of each kernel version:
docs/perf-notes.md.

--fp8 runs the FP8 section instead (jgmm.bench_fp8: DeepGEMM's cases, torch's FP8 peers; --cases filters its
case names); with --tune, jgmm-tune first tunes its cases' FP8 products (both scale recipes) into DIR/tuned.json
(bench_fp8.tune_argv; --tune-ops does not apply).
"""
import argparse
import json
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
import triton

import jgmm
from jgmm import tune
from jgmm.timing import jax_sync, sustained_runs, time_interleaved, time_ms

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


def masked_layout(g, expected_m, seed=0):
  """(max_m, masked_m (G,) int32) of a masked (decode) case as DeepGEMM benchmarks it: each group's valid rows
  drawn uniformly from the integers int(0.7 expected_m) to int(1.3 expected_m) (at expected_m = 1: 0 or 1), max_m
  = int(1.3 expected_m) + 1 rounded up to a multiple of 128 (the buffer bench_fp8 has always used)."""
  rng = np.random.default_rng(seed)
  masked_m = rng.integers(int(0.7 * expected_m), int(1.3 * expected_m) + 1, g).astype(np.int32)
  return -(-(int(1.3 * expected_m) + 1) // 128) * 128, masked_m


H200_CEILINGS = (797e12, 4.3e12)  # bf16 FLOP/s and bytes/s measured on an H200: moe_shapes.py's defaults.
H200_FP8_FLOPS = 2 * H200_CEILINGS[0]  # FP8 tensor cores (Hopper): twice bf16's rate.


def speed_of_light_ms(m, k, n, g, peak_flops=H200_CEILINGS[0], bandwidth=H200_CEILINGS[1], in_bytes=2, out_bytes=2):
  """Lower bound on one gmm of lhs (m, k), rhs (g, k, n), out (m, n): the larger of compute time and memory time
  (H200's bf16 ceilings by default; peak_flops=H200_FP8_FLOPS for FP8). in_bytes, out_bytes: bytes per input and
  output element (bf16: 2; FP8 inputs: 1)."""
  return 1e3 * max(2 * m * k * n / peak_flops, (in_bytes * (m * k + g * k * n) + out_bytes * m * n) / bandwidth)


def measure_ceilings(repeats=5):
  """(bf16 FLOP/s, bytes/s) of this GPU, measured as moe_shapes.py's H200 defaults were: an 8192^3 bf16 product
  (jnp.dot, random data) and an elementwise pass over 2 GiB (bytes read plus written). The fastest of `repeats`
  timings, so that the ceilings are not understated."""
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  a, b = (jax.random.normal(key, (8192, 8192), jnp.bfloat16) for key in (k1, k2))
  big = jax.random.uniform(k3, (2**29,), jnp.float32)
  dot, add = jax.jit(jnp.dot), jax.jit(lambda x: x + 1.0)
  dot_ms = min(time_ms(lambda: dot(a, b), jax_sync, batches=1) for _ in range(repeats))
  add_ms = min(time_ms(lambda: add(big), jax_sync, batches=1) for _ in range(repeats))
  return 2 * 8192**3 / dot_ms * 1e3, 2 * big.nbytes / add_ms * 1e3


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


def forward_and_cotangents(fn, primals, dout):
  """(fn(*primals), *the cotangents of primals for the output cotangent dout): a forward+backward as torch's
  out.backward(dout) computes it (jax.vjp). No scalar loss: a loss such as vdot(out, dout) adds a pass over out and
  dout (on dsv3-ep8-down ~0.3 ms of ~5 on an H100) that torch's side does not run."""
  out, vjp = jax.vjp(fn, *primals)
  return (out, *vjp(dout))


def fwd_bwd(fn):
  """fn(x, w, gs, *rest) -> out as a jitted (x, w, gs, dout, *rest) -> (out, d x, d w)
  (forward_and_cotangents)."""
  return jax.jit(lambda x, w, gs, dout, *rest: forward_and_cotangents(lambda x, w: fn(x, w, gs, *rest), (x, w), dout))


def _jax_impls(inp):
  """{impl: (forward, forward+backward or None)}, each a no-argument call. Arrays are passed as arguments
  (never closed over, which would embed them in the program as constants)."""
  gmm_fwd = jax.jit(jgmm.gmm)
  gmm_fb = fwd_bwd(jgmm.gmm)
  ragged = jax.jit(jax.lax.ragged_dot)
  dense = jax.jit(jnp.dot)
  dense_fb = fwd_bwd(lambda x, w, _: jnp.dot(x, w))
  x, w, gs, dout = inp.x, inp.w, inp.group_sizes, inp.dout
  w_dense = w[0]
  return {
      "jgmm": (lambda: gmm_fwd(x, w, gs), lambda: gmm_fb(x, w, gs, dout)),
      "ragged_dot": (lambda: ragged(x, w, gs), None),
      "dense_dot": (lambda: dense(x, w_dense), lambda: dense_fb(x, w_dense, gs, dout)),
  }


def _torch_sync(_):
  import torch
  torch.cuda.synchronize()


def _torch_impls(inp, m, k, n, g):
  """((forward, forward+backward) of torch._grouped_mm, its inputs (x, w_nk, offs)), or None without torch."""
  try:
    import torch
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
      return None
  except ImportError:
    return None
  torch.manual_seed(0)
  x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k**0.5
  w_nk = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)  # (G, K, N) with column-major planes
  dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
  offs = torch.cumsum(torch.as_tensor(inp.sizes, device="cuda"), 0).int()
  x_grad = x.clone().requires_grad_()
  w_grad = w_nk.clone().requires_grad_()

  def fwd():
    return torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)

  def fwd_bwd():  # out and the gradients for the output cotangent dout, as fwd_bwd's jax.vjp.
    x_grad.grad = w_grad.grad = None  # Assigned, not accumulated into the last call's gradients.
    out = torch._grouped_mm(x_grad, w_grad.transpose(-2, -1), offs=offs)
    out.backward(dout)
    return out

  return (fwd, fwd_bwd), (x, w_nk, offs)


TRITON_KERNELS_ENV = "JGMM_TRITON_KERNELS"


def triton_kernels_peer():
  """OpenAI's triton_kernels as a namespace (matmul_ogs, RoutingData, make_ragged_tensor_metadata), or None where
  it does not import (the reason is printed where JGMM_TRITON_KERNELS names a folder)."""
  folder = os.environ.get(TRITON_KERNELS_ENV)
  if folder:
    sys.path.insert(0, os.path.abspath(folder))
  try:
    from triton_kernels.matmul_ogs import RoutingData, matmul_ogs
    from triton_kernels.tensor import make_ragged_tensor_metadata
  except Exception as e:  # ImportError, or a triton_kernels that does not match this Triton
    if folder:
      print(f"triton_kernels from {folder} does not import: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return None
  return argparse.Namespace(matmul_ogs=matmul_ogs, RoutingData=RoutingData,
                            make_ragged_tensor_metadata=make_ragged_tensor_metadata)


def _triton_kernels_forward(peer, m, g, torch_inputs):
  """Forward of triton_kernels' ragged matmul on torch's inputs (w made row-major (G, K, N)); raises where its
  output differs from torch._grouped_mm's."""
  import torch
  x, w_nk, offs = torch_inputs
  w = w_nk.transpose(-2, -1).contiguous()
  sizes = torch.diff(offs, prepend=offs.new_zeros(1)).int()
  metadata = peer.make_ragged_tensor_metadata(sizes, m)
  routing = peer.RoutingData(None, metadata.slice_sizes, g, 1, metadata)

  def fwd():
    return peer.matmul_ogs(x, w, None, routing)

  expected = torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs).float()
  error = (fwd().reshape(expected.shape).float() - expected).abs().max().item()
  scale = expected.abs().max().item()
  if not error <= 0.02 * scale:
    raise ValueError(f"triton_kernels' output differs from torch's by {error:.3g} (largest |value| {scale:.3g})")
  return fwd


def bench_case(name, m, k, n, g, ragged_cap_s, ceilings, peer=None, sustained_s=0.0):
  """Timings of every implementation on one case: forwards interleaved, then forward+backwards. % of speed of light
  against the H200 defaults (fwd_pct_sol) and against `ceilings`, this GPU's (fwd_pct_sol_device). peer: what
  triton_kernels_peer() returned. sustained_s > 0: also each forward and forward+backward (ragged_dot's aside) run
  back to back for sustained_s seconds, twice (jgmm.timing.sustained_runs; fwd_sustained_ms, fwd_bwd_sustained_ms:
  the median of the two)."""
  flops = 2 * m * k * n
  inp = Inputs(m, k, n, g)
  impls = {impl: (fwd, fwd_bwd, jax_sync) for impl, (fwd, fwd_bwd) in _jax_impls(inp).items()}
  torch_impls = _torch_impls(inp, m, k, n, g)
  if torch_impls is not None:
    torch_fns, torch_inputs = torch_impls
    impls["torch_grouped_mm"] = (*torch_fns, _torch_sync)
    if peer is not None:
      try:
        impls["triton_kernels"] = (_triton_kernels_forward(peer, m, g, torch_inputs), None, _torch_sync)
      except Exception as e:  # A triton_kernels that does not run with this Triton, or a wrong output.
        print(f"  {name} triton_kernels: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
  forward = {}
  for impl, (fwd, _, sync) in impls.items():
    try:
      sync(fwd())
      forward[impl] = (fwd, sync)
    except Exception as e:  # ragged_dot may run out of memory on the large cases.
      print(f"  {name} {impl}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
  # ragged_dot's batches run apart, after the others': in the interleave a batch after one of ragged_dot's ran 8-13%
  # faster than after any other, whichever the implementation (session 44, H200: power_clock.py with RAGGED=1).
  fwd_ms = time_interleaved({impl: fns for impl, fns in forward.items() if impl != "ragged_dot"})
  fwd_ms |= time_interleaved({impl: fns for impl, fns in forward.items() if impl == "ragged_dot"}, cap_s=ragged_cap_s)
  fwd_bwd_ms = time_interleaved({impl: (fb, sync) for impl, (_, fb, sync) in impls.items()
                                 if fb is not None and impl in forward})

  def floor(impl, peaks=H200_CEILINGS):  # The dense reference reads one (K, N) weight, not G: its floor is g = 1's.
    return speed_of_light_ms(m, k, n, 1 if impl == "dense_dot" else g, *peaks)

  rows = {}
  for impl, ms in fwd_ms.items():
    rows[impl] = {"fwd_ms": ms, "fwd_bwd_ms": fwd_bwd_ms.get(impl), "fwd_tflops": flops / ms / 1e9,
                  "fwd_pct_sol": 100 * floor(impl) / ms, "fwd_pct_sol_device": 100 * floor(impl, ceilings) / ms}
  if sustained_s > 0:
    sustained = {(impl, "fwd"): fns for impl, fns in forward.items() if impl != "ragged_dot"}
    sustained |= {(impl, "fwd_bwd"): (fb, sync) for impl, (_, fb, sync) in impls.items()
                  if fb is not None and impl in forward}
    for (impl, product), runs in sustained_runs(sustained, sustained_s).items():
      rows[impl][f"{product}_sustained_ms"] = statistics.median(run.ms for run in runs)
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
  _print_sustained(results)
  with_peer = [r for r in results if "triton_kernels" in r["impls"] and "jgmm" in r["impls"]]
  if with_peer:
    fwd = {r["case"]: r["impls"]["triton_kernels"]["fwd_ms"] / r["impls"]["jgmm"]["fwd_ms"] for r in with_peer}
    print("jgmm vs triton_kernels forward: " + ", ".join(f"{case} {x:.2f}x" for case, x in fwd.items()) +
          f"; geomean {statistics.geometric_mean(fwd.values()):.3f}x")


def _print_sustained(results):
  """The sustained runs' table and geomeans (bench_case's sustained_s), where the results hold them."""
  if not any("fwd_sustained_ms" in row for r in results for row in r["impls"].values()):
    return
  print("\nSustained (each run back to back under the power cap, jgmm.timing.sustained_runs; median of two runs):")
  print("| case | impl | fwd ms | TFLOP/s | % SOL here | fwd+bwd ms | fwd vs torch | fwd+bwd vs torch |")
  print("|---|---|---|---|---|---|---|---|")
  ratios = {"fwd": [], "fwd_bwd": []}
  for r in results:
    flops, torch_row = 2 * r["m"] * r["k"] * r["n"], r["impls"].get("torch_grouped_mm", {})
    for impl, row in r["impls"].items():
      if "fwd_sustained_ms" not in row:
        continue
      cells = {}
      for product in ratios:
        ms, torch_ms = row.get(f"{product}_sustained_ms"), torch_row.get(f"{product}_sustained_ms")
        cells[product] = "" if ms is None else f"{ms:.3f}"
        cells[f"{product} ratio"] = ""
        if ms and torch_ms and impl != "torch_grouped_mm":
          cells[f"{product} ratio"] = f"{torch_ms / ms:.2f}x"
          if impl == "jgmm":
            ratios[product].append(torch_ms / ms)
      ms = row["fwd_sustained_ms"]  # % SOL here scales with 1 / ms (dense_dot's floor is its own: g = 1's).
      print(f"| {r['case']} | {impl} | {cells['fwd']} | {flops / ms / 1e9:.0f} | "
            f"{row['fwd_pct_sol_device'] * row['fwd_ms'] / ms:.0f}% | {cells['fwd_bwd']} | {cells['fwd ratio']} | "
            f"{cells['fwd_bwd ratio']} |")
  if ratios["fwd"]:
    print(f"\njgmm vs torch._grouped_mm sustained geomean: forward {statistics.geometric_mean(ratios['fwd']):.3f}x" +
          (f", forward+backward {statistics.geometric_mean(ratios['fwd_bwd']):.3f}x" if ratios["fwd_bwd"] else ""))


def _plot(results, path):
  """Bar chart of each case's forward % of this GPU's speed of light, written to path. Returns a line saying where
  it went, or why none was written."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return "no plot written: matplotlib is not installed (pip install 'jgmm[bench]' or matplotlib)"
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
  plt.close(fig)
  return f"wrote the plot to {path}"


def tune_argv(cases, ops, out):
  """jgmm-tune's arguments for the kernels `ops` of each case's forward and backward (gmm, gmm_t, tgmm)."""
  shapes = []
  for _, m, k, n, g in cases:
    for op, kk, nn in (("gmm", k, n), ("gmm_t", n, k), ("tgmm", k, n)):
      shapes += ["--shape", f"{op},{m},{kk},{nn},{g}"]
  return [*shapes, "--ops", ops, "--output", os.path.join(out, "tuned.json")]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="bench_out", help="directory for bench.json, bench.png, tuned.json")
  parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
  parser.add_argument("--ragged-cap", type=float, default=1.0,
                      help="seconds: ragged_dot is timed by a single call once one call takes longer")
  parser.add_argument("--tune", action="store_true",
                      help="tune the cases' kernels first (jgmm-tune): DIR/tuned.json, a table for JGMM_CONFIG_FILES")
  parser.add_argument("--tune-ops", default="gmm,gmm_t,tgmm", help="kernels to tune: gmm, gmm_t, tgmm (not --fp8)")
  parser.add_argument("--no-bench", action="store_true", help="with --tune: skip the benchmark")
  parser.add_argument("--fp8", action="store_true", help="the FP8 section (jgmm.bench_fp8) instead")
  parser.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                      help="also run each forward and forward+backward back to back for SECONDS, twice (with --fp8: "
                           "the training recipe's forward+backward)")
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.fp8:
    from jgmm import bench_fp8  # Imports jgmm.bench: a cycle resolved at call time.
    tune_args = bench_fp8.tune_argv(args.cases, args.out)
  else:
    cases = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    tune_args = tune_argv(cases, args.tune_ops, args.out)
  if args.tune and tune_args is None:
    print("--tune: no FP8 product case selected (--cases), nothing to tune", flush=True)
  elif args.tune:  # Before this process takes the GPU (and most of its memory): the tuner's worker needs it.
    tune.main(tune_args)
  if args.no_bench:
    return
  if jax.devices()[0].platform != "gpu":
    sys.exit("jgmm.bench needs a GPU")
  if args.fp8:
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    bench_fp8.run(args.out, args.cases, args.sustained)
    return
  device = jax.devices()[0]
  print(f"device: {device.device_kind}, jax {jax.__version__}, triton {triton.__version__}", flush=True)
  ceilings = measure_ceilings()
  print(f"ceilings measured here: {ceilings[0] / 1e12:.0f} TFLOP/s bf16, {ceilings[1] / 1e12:.2f} TB/s "
        f"(H200 defaults: {H200_CEILINGS[0] / 1e12:.0f}, {H200_CEILINGS[1] / 1e12:.2f})", flush=True)
  peer = triton_kernels_peer()
  results = []
  for name, m, k, n, g in cases:
    print(f"benchmarking {name}", flush=True)
    results.append(bench_case(name, m, k, n, g, args.ragged_cap, ceilings, peer, args.sustained))
  _print_table(results)
  json_path = os.path.join(args.out, "bench.json")
  with open(json_path, "w") as f:
    json.dump({"device": device.device_kind, "jax": jax.__version__, "triton": triton.__version__,
               "ceilings": {"flops": ceilings[0], "bytes_per_s": ceilings[1]}, "results": results}, f, indent=1)
  print(f"wrote the results to {json_path}")
  print(_plot(results, os.path.join(args.out, "bench.png")))


if __name__ == "__main__":
  main()
