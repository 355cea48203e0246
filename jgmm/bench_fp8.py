"""FP8 benchmark (`python -m jgmm.bench --fp8`): jgmm's FP8 masked and contiguous gmm beside their peers.

Cases of issue 15 (DeepGEMM's): masked G x expected_m in {1x1024, 2x512, 4x256, 32x192, 6x1024, 32x20} with
masked_m[g] uniform in [0.7, 1.3] x expected_m (DeepGEMM's test) and max_m = that bound rounded up to 128;
contiguous G x rows in {4x8192, 8x4096}; (N, K) in {(4096, 7168), (7168, 2048)}. Implementations, timed
interleaved in one process (timing.time_interleaved): jgmm FP8 with DeepSeek-V3 blocks (1x128 activations,
128x128 weights), jgmm FP8 per row / per channel, jgmm bf16, torch._scaled_grouped_mm (rowwise scales) where it
accepts the case, dense torch._scaled_mm (rowwise) of the same valid rows as the ceiling. TFLOP/s count the
valid rows' 2 * rows * N * K. DeepGEMM's published figures (H800, 1x128 / 128x128) are printed beside them.
The training recipe (jgmm.fp8_gmm) forward+backward against jgmm.gmm's on the dsv3 cases of bench.CASES, with the
weights quantised in the call (the bf16 weights given) and ahead of it (jgmm.quantize_weights outside the timed
call: a step's cost per micro-batch where its micro-batches reuse them), and ahead with wgrad_scale="group" (the
weight gradient's second operand scaled per group and column where M >= 512 G, as on the dsv3 cases; smaller M runs
"128x1"). `--sustained SECONDS` adds the recipe's table with each run back to back (bench.py's sustained runs: the
ratio at the clock each one's own power draw leaves it, what a training step's long runs hold; it can differ from
the interleaved one, whose batches share one clock: docs/perf-notes.md, session 54).
jgmm's products run `runs` times in one program (timing.chain, enough runs for ~0.5 ms at the FP8 peak): a masked
case's kernel takes 40-100 us, less than JAX's dispatch of a jitted call here, which one call per run would time
(session 16 measured 1x1024 (7168, 2048) at 46 us in Nsight Compute and 87 us a call). Each run after the first
adds a one-element update (a few us), so jgmm's figures are, if anything, low. torch's eager calls dispatch in
about 10 us and are timed one by one.
A second table times each implementation's product kernels alone, as DeepGEMM times its published figures
(timing.kernel_ms: the kernels' own durations from the profiler, the L2 flushed before each call, one call at a
time): jgmm's Triton kernel without the small XLA kernels before it, torch's GEMM kernels. The bar against
DeepGEMM's figures compares like with like there; the first table is what a call costs under sustained load.

`python -m jgmm.bench --fp8 --tune` first tunes the keys of the cases' FP8 products in both recipes (tune_argv:
jgmm-tune --shape lines) into out_dir/tuned.json, a table for JGMM_CONFIG_FILES or configs/; the products here
select their configs from the tables (config_table.select), as any call does.
"""
import functools
import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import bench, config_table, quantize, timing

MASKED_CASES = [(1, 1024), (2, 512), (4, 256), (32, 192), (6, 1024), (32, 20)]  # (G, expected_m)
CONTIGUOUS_CASES = [(4, 8192), (8, 4096)]  # (G, rows per group)
SHAPES = [(4096, 7168), (7168, 2048)]  # (N, K)
# DeepGEMM's published TFLOP/s (H800, FP8 1x128 / 128x128), keyed (layout, G, rows, N, K).
DEEPGEMM = {("masked", 1, 1024, 4096, 7168): 1233, ("masked", 2, 512, 4096, 7168): 1040,
            ("masked", 4, 256, 4096, 7168): 932, ("masked", 1, 1024, 7168, 2048): 925,
            ("masked", 2, 512, 7168, 2048): 916, ("masked", 4, 256, 7168, 2048): 815,
            ("contiguous", 4, 8192, 4096, 7168): 1346, ("contiguous", 8, 4096, 4096, 7168): 1346,
            ("contiguous", 4, 8192, 7168, 2048): 1214, ("contiguous", 8, 4096, 7168, 2048): 1214}
# Names of the product kernels whose durations the kernel columns count (timing.kernel_ms regexes): jgmm's Triton
# gmm kernels (not the XLA fusions before them), and torch's cuBLAS / CUTLASS GEMMs.
KERNELS = {"jgmm": r"^(masked_)?gmm_", "torch": r"(?i)gemm|nvjet|cutlass|xmma"}
RECIPE_CASES = ("dsv3-ep8-gateup", "dsv3-ep8-down")
# The FP8 recipes timed (jax_impls' jgmm_fp8_<name>): config_table.FP8_RECIPES names.
RECIPES = {"blocks": "1x128-128x128", "rowwise": "row-channel"}


def _case_inputs(layout, g, rows, n, k):
  """(x (G, max_m, K) masked or (M, K) contiguous, w (G, N, K), groups: masked_m or group sizes, valid rows) of a
  case, bf16 (fixed seeds: every variant and peer gets the same values)."""
  k1, k2 = jax.random.split(jax.random.key(0))
  w = jax.random.normal(k2, (g, n, k), jnp.bfloat16)
  if layout == "masked":
    max_m, masked_m = bench.masked_layout(g, rows)
    x = jax.random.normal(k1, (g, max_m, k), jnp.bfloat16)
    return x, w, masked_m, int(masked_m.sum())
  return jax.random.normal(k1, (g * rows, k), jnp.bfloat16), w, np.full(g, rows, np.int32), g * rows


def _product(layout, rows, config=None):
  """The jgmm op of a layout as product(x, w, groups, x_scale, w_scale) (scales None in bf16): masked_gmm with
  x (G, max_m, K), w (G, N, K), masked_m (G,), or gmm with lhs (M, K), K-major rhs (G, N, K), group sizes (G,).
  config: forced (docs/experiments' A/B scripts), or None: the tables' choice."""
  if layout == "masked":
    return lambda x, w, mm, xs, ws: jgmm.masked_gmm(x, w, mm, x_scale=xs, w_scale=ws, expected_m=rows, config=config)
  return lambda x, w, gs, xs, ws: jgmm.gmm(x, w, gs, lhs_scale=xs, rhs_scale=ws, transpose_rhs=True, config=config)


def _runs(valid, n, k):
  """timing.chain's runs for a product of valid rows: about 0.5 ms of GPU work at the FP8 peak."""
  return timing.chain_runs(2 * valid * n * k / bench.H200_FP8_FLOPS * 1e3)


def _chained(product, runs):
  """product with FP8 operands, `runs` times in one jitted program (args: xq, x_scale, wq, w_scale, groups)."""
  return jax.jit(timing.chain(lambda xq, xs, wq, ws, gs: product(xq, wq, gs, xs, ws), runs))


def fp8_operands(x, w, groups, recipe):
  """(xq, x_scale, wq, w_scale, groups) of a case quantised in `recipe` (a config_table.FP8_RECIPES name): the
  arguments of _chained's products."""
  x_recipe, w_recipe = config_table.FP8_RECIPES[recipe]
  return (*quantize.quantize(x, x_recipe), *quantize.quantize(w, w_recipe), jnp.asarray(groups))


def recipe_cases(wanted=""):
  """(name, layout, rows, N, K, valid rows, runs, recipe, fp8_operands) of each case of cases(wanted) in each of
  RECIPES (docs/experiments' A/B scripts)."""
  for name, layout, g, rows, n, k in cases(wanted):
    x, w, groups, valid = _case_inputs(layout, g, rows, n, k)
    for recipe in RECIPES.values():
      yield name, layout, rows, n, k, valid, _runs(valid, n, k), recipe, fp8_operands(x, w, groups, recipe)


def jax_impls(layout, rows, x, w, groups, runs):
  """{impl: fn} of jgmm on one case: FP8 with DeepSeek-V3 blocks (1x128 / 128x128), FP8 per row / per channel,
  bf16; a call of fn runs the product `runs` times (timing.chain). Each fn is functools.partial(jitted function,
  *its arguments)."""
  product = _product(layout, rows)
  gs = jnp.asarray(groups)
  fp8 = _chained(product, runs)
  impls = {}
  for name, recipe in RECIPES.items():
    impls[f"jgmm_fp8_{name}"] = functools.partial(fp8, *fp8_operands(x, w, gs, recipe))
  bf16 = jax.jit(timing.chain(lambda x, w, gs: product(x, w, gs, None, None), runs))
  return impls | {"jgmm_bf16": functools.partial(bf16, x, w, gs)}


def _torch_peers(layout, x, w_nk, rows_per_group, valid_rows):
  """{impl: fn} of torch's FP8 products (rowwise scales) on the same values, and torch's sync. Each peer is tried
  in the scale layouts torch versions have asked for; one that rejects them all is left out (reason printed)."""
  try:
    import torch
    if not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
      return {}, None
  except ImportError:
    return {}, None
  g, n, k = w_nk.shape

  def fp8_rows(a):  # rowwise FP8 of a bf16 tensor: (q, scale), one float32 scale per row of the last axis
    scale = a.abs().amax(dim=-1).float().clamp(min=1e-12) / 448.0
    return (a / scale[..., None]).to(torch.float8_e4m3fn), scale

  to_torch = lambda a: torch.tensor(np.asarray(a.astype(jnp.float32)), device="cuda").bfloat16()
  wq, ws = fp8_rows(to_torch(w_nk))  # (G, N, K) K-major: mat_b is its (G, K, N) column-major transpose
  xq, xs = fp8_rows(to_torch(x))  # (M, K) or (G, max_m, K)
  grouped = lambda scale_a, scale_b, **kw: (lambda: torch._scaled_grouped_mm(
      xq, wq.transpose(-2, -1), scale_a, scale_b, out_dtype=torch.bfloat16, **kw))
  if layout == "contiguous":
    offs = torch.cumsum(torch.full((g,), rows_per_group, device="cuda", dtype=torch.int32), 0, dtype=torch.int32)
    grouped_tries = [grouped(xs, ws, offs=offs), grouped(xs, ws.reshape(-1), offs=offs)]
  else:
    grouped_tries = [grouped(xs, ws), grouped(xs.reshape(-1), ws.reshape(-1))]
  # The ceiling: one dense FP8 product of the valid rows against one expert's (K, N) column-major weights.
  dense_x, dense_s = xq.reshape(-1, k)[:valid_rows], xs.reshape(-1, 1)[:valid_rows]
  dense_tries = [lambda: torch._scaled_mm(dense_x, wq[0].t(), dense_s, ws[0].reshape(1, -1), out_dtype=torch.bfloat16)]
  accepted = {}
  for name, tries in (("torch_scaled_grouped_mm", grouped_tries), ("torch_scaled_mm_dense", dense_tries)):
    for fn in tries:
      try:
        fn()
        torch.cuda.synchronize()
        accepted[name] = fn
        break
      except Exception as e:  # noqa: BLE001 - a peer that rejects the case is reported and left out
        print(f"  {name}: not run this way: {type(e).__name__}: {str(e)[:160]}", flush=True)
  return accepted, lambda _: torch.cuda.synchronize()


def bench_fp8_case(layout, g, rows, n, k):
  """Timings of one FP8 case: {impl: {"ms", "tflops"}} plus the case's description."""
  x, w_nk, groups, valid = _case_inputs(layout, g, rows, n, k)
  runs = _runs(valid, n, k)
  impls = jax_impls(layout, rows, x, w_nk, groups, runs)
  torch_fns, torch_sync = _torch_peers(layout, x, w_nk, rows, valid)
  fns = {name: (fn, timing.jax_sync) for name, fn in impls.items()}
  fns.update({name: (fn, torch_sync) for name, fn in torch_fns.items()})
  ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=5)
  ms = {name: t / runs if name in impls else t for name, t in ms.items()}
  kernel_ms = _kernel_ms(jax_impls(layout, rows, x, w_nk, groups, 1), torch_fns, torch_sync)
  flops = 2 * valid * n * k
  tflops = lambda t: flops / t / 1e9 if t else None
  return {"layout": layout, "g": g, "rows": rows, "n": n, "k": k, "valid_rows": valid, "jgmm_runs_per_call": runs,
          "deepgemm_tflops": DEEPGEMM.get((layout, g, rows, n, k)),
          "impls": {name: {"ms": t, "tflops": tflops(t), "kernel_ms": kernel_ms.get(name),
                           "kernel_tflops": tflops(kernel_ms.get(name))} for name, t in ms.items()}}


def _kernel_ms(jax_fns, torch_fns, torch_sync):
  """{impl: ms} of each implementation's product kernels alone, as DeepGEMM times its published figures
  (timing.kernel_ms: the L2 flushed before each call, the call's other kernels not counted): jgmm's
  (KERNELS["jgmm"]) from jax_fns (jax_impls' with runs=1), torch's GEMM kernels from torch_fns. An implementation
  whose kernels the profiler does not find is left out (reason printed)."""
  fns = {name: (fn, timing.jax_sync, KERNELS["jgmm"]) for name, fn in jax_fns.items()}
  fns |= {name: (fn, torch_sync, KERNELS["torch"]) for name, fn in torch_fns.items()}
  result = {}
  for name, (fn, sync, kernel) in fns.items():
    sync(fn())  # compiled outside the trace
    try:
      result[name] = timing.kernel_ms(fn, sync, kernel)
    except LookupError as e:
      print(f"  {name}: no kernel time: {e}", flush=True)
  return result


def bench_recipe(name, m, k, n, g, sustained_s=0.0):
  """fp8_gmm's forward+backward against gmm's (bf16), as bench.bench_case times them: fp8_gmm quantising the bf16
  weights in the call, and given them quantised ahead (rhs_fp8 = jgmm.quantize_weights(w), made outside the timed
  call: the cost per micro-batch where a step's micro-batches reuse the weights). sustained_s > 0: also each run
  back to back for sustained_s seconds, twice (timing.sustained_runs; fwd_bwd_sustained_ms, the median, and
  sustained_speedup*: the ratios at the clock each one's own power draw leaves it, as a training step's runs hold)."""
  inp = bench.Inputs(m, k, n, g)
  fp8, bf16 = bench.fwd_bwd(jgmm.fp8_gmm), bench.fwd_bwd(jgmm.gmm)
  fp8_ahead = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights))
  fp8_group = bench.fwd_bwd(lambda x, w, gs, weights: jgmm.fp8_gmm(x, w, gs, rhs_fp8=weights, wgrad_scale="group"))
  args = (inp.x, inp.w, inp.group_sizes, inp.dout)
  weights = jax.jit(jgmm.quantize_weights)(inp.w)
  fns = {"fp8_gmm": (lambda: fp8(*args), timing.jax_sync),
         "fp8_gmm_weights_ahead": (lambda: fp8_ahead(*args, weights), timing.jax_sync),
         "fp8_gmm_weights_ahead_wgrad_group": (lambda: fp8_group(*args, weights), timing.jax_sync),
         "gmm_bf16": (lambda: bf16(*args), timing.jax_sync)}
  ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=5)
  result = {"case": name, "m": m, "k": k, "n": n, "g": g, "fwd_bwd_ms": ms, **_speedups(ms),
            "fwd_bwd_tflops": {i: 6 * m * k * n / t / 1e9 for i, t in ms.items()}}
  if sustained_s > 0:
    runs = timing.sustained_runs(fns, sustained_s)
    sustained = {impl: statistics.median(run.ms for run in impl_runs) for impl, impl_runs in runs.items()}
    result["fwd_bwd_sustained_ms"] = sustained
    result |= {f"sustained_{key}": x for key, x in _speedups(sustained).items()}
  return result


def _speedups(ms):
  """{speedup*: gmm_bf16's ms over each fp8_gmm run's} of bench_recipe's {impl: ms}."""
  return {"speedup": ms["gmm_bf16"] / ms["fp8_gmm"],
          "speedup_weights_ahead": ms["gmm_bf16"] / ms["fp8_gmm_weights_ahead"],
          "speedup_weights_ahead_wgrad_group": ms["gmm_bf16"] / ms["fp8_gmm_weights_ahead_wgrad_group"]}


def _print(results, recipe):
  if results:
    _print_products(results)
  if recipe:
    _print_recipe(recipe)


def _print_products(results):
  for key, title in (("tflops", "whole calls, timed interleaved"),
                     ("kernel_tflops", "product kernels alone, DeepGEMM's method: timing.kernel_ms")):
    print(f"\nFP8 (TFLOP/s on the valid rows, {title}; DeepGEMM: published, H800)")
    print("| layout | G x rows | N, K | jgmm fp8 blocks | jgmm fp8 rowwise | jgmm bf16 | torch scaled_grouped_mm "
          "| torch scaled_mm dense | DeepGEMM | blocks vs DeepGEMM | blocks vs torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
      t = {name: row[key] for name, row in r["impls"].items() if row[key]}
      cell = lambda name: f"{t[name]:.0f}" if name in t else "n/a"
      deep = r["deepgemm_tflops"]
      vs_deep = f"{t['jgmm_fp8_blocks'] / deep:.2f}x" if deep and "jgmm_fp8_blocks" in t else ""
      torch_peer = t.get("torch_scaled_grouped_mm")
      vs_torch = f"{t['jgmm_fp8_blocks'] / torch_peer:.2f}x" if torch_peer and "jgmm_fp8_blocks" in t else ""
      print(f"| {r['layout']} | {r['g']}x{r['rows']} | {r['n']}, {r['k']} | {cell('jgmm_fp8_blocks')} | "
            f"{cell('jgmm_fp8_rowwise')} | {cell('jgmm_bf16')} | {cell('torch_scaled_grouped_mm')} | "
            f"{cell('torch_scaled_mm_dense')} | {deep or ''} | {vs_deep} | {vs_torch} |")


def _print_recipe(recipe):
  tables = (("", "fwd_bwd_ms", "interleaved"),
            ("sustained_", "fwd_bwd_sustained_ms", "sustained: each back to back, the median of two runs"))
  for prefix, ms_key, title in tables:
    if not all(ms_key in r for r in recipe):
      continue
    print(f"\nFP8 training recipe, forward+backward ({title})")
    print("| recipe case | fp8_gmm fwd+bwd ms | weights quantised ahead ms | ahead, wgrad_scale group ms | "
          "gmm bf16 fwd+bwd ms | speedup | speedup, weights ahead | speedup, ahead, wgrad group |")
    print("|---|---|---|---|---|---|---|---|")
    for r in recipe:
      ms = r[ms_key]
      print(f"| {r['case']} | {ms['fp8_gmm']:.3f} | {ms['fp8_gmm_weights_ahead']:.3f} | "
            f"{ms['fp8_gmm_weights_ahead_wgrad_group']:.3f} | {ms['gmm_bf16']:.3f} | {r[prefix + 'speedup']:.2f}x | "
            f"{r[prefix + 'speedup_weights_ahead']:.2f}x | {r[prefix + 'speedup_weights_ahead_wgrad_group']:.2f}x |")
    for key in ("speedup", "speedup_weights_ahead", "speedup_weights_ahead_wgrad_group"):
      geomean = statistics.geometric_mean([r[prefix + key] for r in recipe])
      print(f"recipe {(prefix + key).replace('_', ' ')} geomean: {geomean:.2f}x")


def cases(wanted=""):
  """[(name, layout, G, rows, N, K)] of the FP8 cases (module docstring), or of those named in `wanted` (comma-
  separated, e.g. "masked-1x1024-4096-7168"; other names, such as run()'s "recipe", select none here)."""
  names = set(filter(None, wanted.split(",")))
  every = [(f"{layout}-{g}x{rows}-{n}-{k}", layout, g, rows, n, k)
           for layout, grid in (("masked", MASKED_CASES), ("contiguous", CONTIGUOUS_CASES))
           for g, rows in grid for n, k in SHAPES]
  return [case for case in every if not names or case[0] in names]


def tune_argv(wanted, out_dir):
  """jgmm-tune's arguments for the FP8 products of cases(wanted) in each of RECIPES (bf16 out): masked_fp8 keys of
  G x rows (the expected_m a case passes; the tuner draws the valid rows as _case_inputs does: bench.masked_layout),
  gmm_t_fp8 keys of the contiguous cases; None where `wanted` names no product case (e.g. "recipe" alone)."""
  shapes = []
  for _, layout, g, rows, n, k in cases(wanted):
    shapes += ["--shape", f"{'masked_fp8' if layout == 'masked' else 'gmm_t_fp8'},{g * rows},{k},{n},{g}"]
  if not shapes:
    return None
  return [*shapes, "--scale", ",".join(RECIPES.values()), "--out-dtype", "bfloat16",
          "--output", os.path.join(out_dir, "tuned.json")]


def run(out_dir, wanted="", sustained_s=0.0):
  """The FP8 section: every case (or the names in `wanted`, e.g. "masked-1x1024-4096-7168,recipe"), printed and
  written to out_dir/bench_fp8.json; sustained_s > 0: the recipe's cases also sustained (bench_recipe)."""
  results = []
  for name, layout, g, rows, n, k in cases(wanted):
    print(f"benchmarking {name}", flush=True)
    try:
      results.append(bench_fp8_case(layout, g, rows, n, k))
    except Exception as e:  # noqa: BLE001 - one failing case must not hide the others' numbers
      print(f"  {name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
  recipe = []
  if not wanted or "recipe" in wanted.split(","):
    for case in bench.CASES:
      if case[0] in RECIPE_CASES:
        print(f"benchmarking recipe {case[0]}", flush=True)
        recipe.append(bench_recipe(*case, sustained_s=sustained_s))
  _print(results, recipe)
  with open(os.path.join(out_dir, "bench_fp8.json"), "w") as f:
    json.dump({"device": jax.devices()[0].device_kind, "results": results, "recipe": recipe}, f, indent=1)
