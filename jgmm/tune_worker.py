"""The tuner's worker process: `python -m jgmm.tune_worker`, started by jgmm.tune, never by hand.

It writes one JSON line to stdout first (the device), then reads jobs from stdin, one JSON line each, and answers
every job with JSON lines on stdout: {"event": "start", "i": i} before candidate i runs (so that the parent can
tell which one hangs), {"event": "result", "i": i, "us": ..., "max_rel_err": ..., "error": ...} after it, then
{"event": "done"}. Anything else the process prints goes to stderr.

A job: {"phase": "compile" | "screen" | "final", "key": Key fields, "m": total rows, "candidates": [{"backend":
"triton", "config": Config fields} | {"backend": "xla"}], "seconds": the batch length to time with, "platforms":
(compile) the platforms to lower for, e.g. ["cuda"] with JGMM_TARGET set, or null: the default, "sustained":
(final, optional) seconds of each sustained run, or 0}.
  compile: each candidate lowered on abstract inputs (so its Triton kernel compiled, into Triton's on-disk cache,
    which the timing worker then reads); nothing runs, so a process without a GPU can do it.
  screen: each candidate in turn: its first call (compile and run: "first_s" seconds), then a short timing
    (jgmm.timing.time_ms: 3 batches).
  final: every candidate run once and compared with the xla backend's output (max |out - ref| / max |ref|),
    then all timed interleaved (jgmm.timing.interleaved_samples: 7 rounds, rounded up to whole cycles of its
    balanced orders where one is no longer) or, where "sustained" > 0, each alone for that many seconds
    (jgmm.timing.sustained_runs: SUSTAINED_ROUNDS rounds, the rate a GPU holds under its power cap, which
    interleaved batches, sharing one clock, do not show); "samples_us" holds each round's time, "us" their median.
Calls go through jgmm's public ops (masked_gmm's d x: its primitive, which no public op passes a config to) with
backend= and config= forced, on fresh random inputs (balanced routing; FP8 ops': quantised once, so every candidate
reads the same FP8 values and scales), several runs of the op in one program for a small key (problem()); every
time reported is one run's.
"""
import importlib.metadata
import json
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import jgmm
from jgmm import bench, config_table, primitives, quantize, timing
from jgmm.config import Config

SUSTAINED_ROUNDS = 5  # A final phase's sustained rounds: tune.beats compares candidates round by round.
_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}
_FP8_DTYPES = {"fp8e4m3": jnp.float8_e4m3fn, "fp8e4m3fnuz": jnp.float8_e4m3fnuz}


def device():
  """{"platform", "gpu" (device_kind), "arch", "kind" (None without Triton), "triton" (whether Triton runs here),
  "triton_version", "jgmm_version"}."""
  first = jax.devices()[0]
  info = {"platform": first.platform, "gpu": first.device_kind, "arch": None, "kind": None,
          "triton": first.platform == "gpu" or os.environ.get("TRITON_INTERPRET") == "1",
          "triton_version": config_table.triton_version(),
          "jgmm_version": importlib.metadata.version("jgmm")}
  if info["triton"]:
    from jgmm import backend_triton
    gpu = backend_triton._device()
    info.update(arch=gpu.arch, kind=gpu.kind)
  return info


def _check_timeable(key):
  """ValueError unless problem() can build key's call: its op and dtypes; for FP8 keys, a scale recipe and flags
  that the FP8 ops' calls make (no bias, activation or existing_out; transpose: gmm_t_fp8's alone, or tgmm_fp8's
  transpose_lhs)."""
  fp8 = key.op in config_table.FP8_OPS
  in_dtypes = _FP8_DTYPES if fp8 else _DTYPES
  if key.op not in config_table.OPS or key.in_dtype not in in_dtypes or key.out_dtype not in _DTYPES:
    raise ValueError(f"jgmm.tune cannot time {key.op} with {key.in_dtype} -> {key.out_dtype} (inputs: one of "
                     f"{tuple(in_dtypes)}, outputs: one of {tuple(_DTYPES)})")
  if not fp8:
    recipes = (None,)
  elif key.op == "tgmm_fp8":
    recipes = (config_table.TGMM_FP8_RECIPE,)
  else:
    recipes = tuple(config_table.FP8_RECIPES)
  if key.scale not in recipes:
    raise ValueError(f"jgmm.tune cannot time {key.op} with scale {key.scale!r}: expected one of {recipes}")
  if fp8 and (key.bias or key.activation or key.accumulate
              or (key.op != "tgmm_fp8" and key.transpose != (key.op == "gmm_t_fp8"))):
    raise ValueError(f"jgmm.tune cannot time {key}: no FP8 call makes it (FP8 ops take no bias, activation or "
                     f"existing_out; transpose is gmm_t_fp8's, or tgmm_fp8's transpose_lhs)")


def problem(key, m, seed=0, abstract=False):
  """(arrays, call(backend, config) -> a jitted function of the arrays, flops, runs) of one key with m total rows:
  the function runs the op `runs` times in one program (timing.chain, enough runs for about 0.5 ms at the speed of
  light) on a GPU, so that timing it times the GPU's work, not the host's dispatch (divide by runs). abstract: the
  arrays' jax.ShapeDtypeStructs (enough to lower; nothing allocated) and one run.

  Inputs: fresh normal values (balanced routing: bench.group_sizes; masked: expected_m = m / G, each group's valid
  rows drawn from [0.7, 1.3] x expected_m in a (G, max_m, K) buffer, as DeepGEMM benchmarks it:
  bench.masked_layout). FP8 ops (key.op in config_table.FP8_OPS) get them quantised by jgmm.quantize with
  key.scale's recipe: every backend reads the same FP8 values and scales, so max_rel_err compares the products
  alone. The call goes through jgmm's
  public op as a real call of key makes it (the key select() looks up is key):
    gmm / gmm_t: jgmm.gmm, lhs (M, K), rhs (G, K, N) / (G, N, K) (transpose_rhs), with key's bias, activation and
      existing_out; gmm_fp8 / gmm_t_fp8 likewise with lhs_scale and rhs_scale (quantised as (G, N, K));
    tgmm: jgmm.tgmm, lhs (M, K) (transpose_lhs) or (K, M), rhs (M, N); tgmm_fp8: jgmm.tgmm with scales per 128 rows
      of M, lhs (K, M) and rhs (N, M) (transpose_rhs) as jgmm.fp8_gmm's backward calls it, or lhs (M, K) and
      rhs (M, N) where key.transpose (a key does not record rhs's layout);
    masked / masked_fp8: jgmm.masked_gmm, x (G, max_m, K), w (G, N, K), expected_m (x_scale and w_scale); masked
      with key.transpose: masked_gmm's d x product (primitives.masked_gmm_kn), w (G, K, N) read in place.
  """
  _check_timeable(key)
  fp8 = key.op in config_table.FP8_OPS
  in_dtype, out_dtype = (_FP8_DTYPES if fp8 else _DTYPES)[key.in_dtype], _DTYPES[key.out_dtype]
  g, k, n = key.g, key.k, key.n
  keys = iter(list(jax.random.split(jax.random.key(seed), 4)))
  dtype = jnp.float32 if fp8 else in_dtype  # FP8 operands: float32 values, then quantised
  normal = lambda shape, scale=1.0: (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)
  build = jax.eval_shape if abstract else lambda make: make()
  flops = 2 * m * k * n
  on_gpu = not abstract and jax.default_backend() == "gpu"  # elsewhere calls are synchronous: nothing to amortise
  floor_ms = bench.speed_of_light_ms(m, k, n, g, bench.H200_FP8_FLOPS if fp8 else bench.H200_CEILINGS[0],
                                     in_bytes=jnp.dtype(in_dtype).itemsize, out_bytes=jnp.dtype(out_dtype).itemsize)
  runs = timing.chain_runs(floor_ms) if on_gpu else 1
  jit = lambda op: jax.jit(timing.chain(op, runs))
  if key.op in ("masked", "masked_fp8"):  # expected_m = m / G; sizes: masked_m, flops of its valid rows
    max_m, sizes = bench.masked_layout(g, m // g, seed)
    flops = 2 * int(sizes.sum()) * k * n
  else:
    sizes = bench.group_sizes(m, g, seed)
  if fp8:
    arrays, op = _fp8_problem(key, m, normal, sizes, out_dtype, max_m if key.op == "masked_fp8" else None)
    return build(arrays), lambda backend, config: jit(op(backend, config)), flops, runs
  if key.op == "masked" and key.transpose:  # masked_gmm's d x: no public op takes a config for it
    arrays = build(lambda: (normal((g, max_m, k), k**-0.5), normal((g, k, n)), jnp.asarray(sizes)))
    return arrays, lambda backend, config: jit(lambda x, w, mm: primitives.masked_gmm_kn(
        x, w, mm, out_dtype=out_dtype, expected_m=m // g, precision=None, config=config, backend=backend)[0]), \
        flops, runs
  if key.op == "masked":
    arrays = build(lambda: (normal((g, max_m, k), k**-0.5), normal((g, n, k)), jnp.asarray(sizes)))
    return arrays, lambda backend, config: jit(lambda x, w, mm: jgmm.masked_gmm(
        x, w, mm, preferred_element_type=out_dtype, expected_m=m // g, config=config, backend=backend)), flops, runs
  if key.op == "tgmm":
    arrays = build(lambda: (normal((m, k) if key.transpose else (k, m), m**-0.5), normal((m, n)), jnp.asarray(sizes),
                            normal((g, k, n)).astype(out_dtype) if key.accumulate else None))
    return arrays, lambda backend, config: jit(lambda lhs, rhs, sizes, existing: jgmm.tgmm(
        lhs, rhs, sizes, transpose_lhs=key.transpose, preferred_element_type=out_dtype, existing_out=existing,
        bias_grad=key.bias, config=config, backend=backend)), flops, runs
  n_out = n // 2 if key.activation == "swiglu" else n
  arrays = build(lambda: (normal((m, k), k**-0.5), normal((g, n, k) if key.transpose else (g, k, n)),
                          jnp.asarray(sizes), normal((g, n)) if key.bias else None,
                          normal((m, n_out)).astype(out_dtype) if key.accumulate else None))
  return arrays, lambda backend, config: jit(
      lambda lhs, rhs, sizes, bias, existing: jgmm.gmm(
          lhs, rhs, sizes, bias=bias, transpose_rhs=key.transpose, preferred_element_type=out_dtype,
          existing_out=existing, activation=key.activation, config=config, backend=backend)), flops, runs


def _fp8_problem(key, m, normal, sizes, out_dtype, max_m):
  """(make_arrays: () -> the quantised arrays, op(backend, config) -> fn of them) of an FP8 key (problem()). The
  first array is the FP8 activations, which every run reads (timing.chain). masked_fp8: sizes are masked_m, x
  (G, max_m, K)."""
  g, k, n = key.g, key.k, key.n
  fp8 = lambda x, recipe: quantize.quantize(x, recipe, _FP8_DTYPES[key.in_dtype])  # (q, scale)
  if key.op == "tgmm_fp8":  # out (G, K, N): lhs (K, M) / rhs (N, M) per 1x128, or (M, K) / (M, N) per 128x1
    recipe, swap = ("128x1", lambda shape: shape) if key.transpose else ("1x128", lambda shape: shape[::-1])
    make = lambda: (*fp8(normal(swap((m, k))), recipe), *fp8(normal(swap((m, n))), recipe), jnp.asarray(sizes))
    return make, lambda backend, config: lambda lhs, lhs_scale, rhs, rhs_scale, sizes: jgmm.tgmm(
        lhs, rhs, sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, transpose_lhs=key.transpose,
        transpose_rhs=not key.transpose, preferred_element_type=out_dtype, config=config, backend=backend)
  lhs_recipe, rhs_recipe = config_table.FP8_RECIPES[key.scale]
  if key.op == "masked_fp8":
    make = lambda: (*fp8(normal((g, max_m, k)), lhs_recipe), *fp8(normal((g, n, k)), rhs_recipe), jnp.asarray(sizes))
    return make, lambda backend, config: lambda x, x_scale, w, w_scale, mm: jgmm.masked_gmm(
        x, w, mm, x_scale=x_scale, w_scale=w_scale, preferred_element_type=out_dtype, expected_m=m // g,
        config=config, backend=backend)

  def make():  # rhs quantised as (G, N, K) (its scales read the same in either layout), then laid out as (G, K, N)
    rhs, rhs_scale = fp8(normal((g, n, k)), rhs_recipe)
    return (*fp8(normal((m, k)), lhs_recipe), rhs if key.transpose else jnp.swapaxes(rhs, 1, 2), rhs_scale,
            jnp.asarray(sizes))
  return make, lambda backend, config: lambda lhs, lhs_scale, rhs, rhs_scale, sizes: jgmm.gmm(
      lhs, rhs, sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, transpose_rhs=key.transpose,
      preferred_element_type=out_dtype, config=config, backend=backend)


@jax.jit
def _rel_err(o, r):
  """max |o - r| / max |r| in float32, one fused reduction (no float32 copy of a many-GiB output)."""
  o, r = o.astype(jnp.float32), r.astype(jnp.float32)
  return jnp.max(jnp.abs(o - r)) / jnp.maximum(jnp.max(jnp.abs(r)), 1e-30)


def max_rel_err(out, ref):
  """max |out - ref| / max |ref| over every output (inf where out holds NaN or inf)."""
  worst = 0.0
  for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
    err = float(_rel_err(o, r))
    worst = max(worst, err if math.isfinite(err) else math.inf)
  return worst


def _config(candidate):
  return Config(**candidate["config"]) if candidate["backend"] == "triton" else None


class _Problem:
  """One key's inputs and its jitted calls, kept from the screen to the final phase (compiled once)."""

  def __init__(self, key, m, abstract):
    self.id = (key, m, abstract)
    self.arrays, self._call, self.flops, self.runs = problem(key, m, abstract=abstract)
    self._fns = {}

  def call(self, backend, config):
    if (backend, config) not in self._fns:
      self._fns[backend, config] = self._call(backend, config)
    return self._fns[backend, config]


_current = None  # the _Problem of the last job


def run_job(job, emit):
  """Answers one job (module docstring) through emit(dict)."""
  global _current
  key = config_table.Key(**job["key"])
  abstract = job["phase"] == "compile"
  if _current is None or _current.id != (key, job["m"], abstract):
    _current = None  # Frees the last key's arrays first.
    try:
      _current = _Problem(key, job["m"], abstract)
    except ValueError as e:  # an op the tuner cannot time: every candidate fails
      for i in range(len(job["candidates"])):
        emit({"event": "result", "i": i, "error": str(e)})
      emit({"event": "done"})
      return
  arrays, call, flops, runs = _current.arrays, _current.call, _current.flops, _current.runs
  candidates, seconds = job["candidates"], job["seconds"]
  if job["phase"] == "compile":
    for i, candidate in enumerate(candidates):
      emit({"event": "start", "i": i})
      try:
        platforms = job["platforms"] and tuple(job["platforms"])
        call(candidate["backend"], _config(candidate)).trace(*arrays).lower(lowering_platforms=platforms)
        emit({"event": "result", "i": i, "compiled": True})
      except Exception as e:
        emit({"event": "result", "i": i, "error": f"{type(e).__name__}: {str(e)[:300]}"})
  elif job["phase"] == "screen":
    for i, candidate in enumerate(candidates):
      emit({"event": "start", "i": i})
      try:
        fn = call(candidate["backend"], _config(candidate))
        start = time.perf_counter()
        timing.jax_sync(fn(*arrays))
        first_s = time.perf_counter() - start
        us = 1e3 * timing.time_ms(lambda: fn(*arrays), timing.jax_sync, min_batch_s=seconds, batches=3) / runs
        emit({"event": "result", "i": i, "us": us, "tflops": flops / us / 1e6, "first_s": first_s})
      except Exception as e:  # A candidate that does not compile or run is reported and skipped.
        emit({"event": "result", "i": i, "error": f"{type(e).__name__}: {str(e)[:300]}"})
  else:
    emit({"event": "start", "i": -1})
    ref = call("xla", None)(*arrays)
    fns, errors = {}, {}
    for i, candidate in enumerate(candidates):
      try:
        fn = call(candidate["backend"], _config(candidate))
        errors[i] = max_rel_err(fn(*arrays), ref)
        fns[i] = (lambda fn=fn: fn(*arrays), timing.jax_sync)
      except Exception as e:
        emit({"event": "result", "i": i, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    if job.get("sustained"):
      per_round = {i: [run.ms for run in runs]
                   for i, runs in timing.sustained_runs(fns, job["sustained"], SUSTAINED_ROUNDS).items()}
    else:
      per_round = timing.interleaved_samples(fns, min_batch_s=seconds, batches=7)
    for i, samples in per_round.items():
      ms = statistics.median(samples) / runs
      emit({"event": "result", "i": i, "us": 1e3 * ms, "samples_us": [1e3 * t / runs for t in samples],
            "tflops": flops / ms / 1e9, "max_rel_err": errors[i]})
  emit({"event": "done"})


def main():
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)  # Stray prints of the libraries go to stderr, not into the protocol.
  emit = lambda obj: out.write(json.dumps(obj) + "\n")
  emit({"event": "device", **device()})
  for line in sys.stdin:
    run_job(json.loads(line), emit)


if __name__ == "__main__":
  main()
