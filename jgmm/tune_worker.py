"""The tuner's worker process: `python -m jgmm.tune_worker`, started by jgmm.tune, never by hand.

It writes one JSON line to stdout first (the device), then reads jobs from stdin, one JSON line each, and answers
every job with JSON lines on stdout: {"event": "start", "i": i} before candidate i runs (so that the parent can
tell which one hangs), {"event": "result", "i": i, "us": ..., "max_rel_err": ..., "error": ...} after it, then
{"event": "done"}. Anything else the process prints goes to stderr.

A job: {"phase": "compile" | "screen" | "final", "key": Key fields, "m": total rows, "candidates": [{"backend":
"triton", "config": Config fields} | {"backend": "xla"}], "seconds": the batch length to time with, "platforms":
(compile) the platforms to lower for, e.g. ["cuda"] with JGMM_TARGET set, or null: the default}.
  compile: each candidate lowered on abstract inputs (so its Triton kernel compiled, into Triton's on-disk cache,
    which the timing worker then reads); nothing runs, so a process without a GPU can do it.
  screen: each candidate in turn: its first call (compile and run: "first_s" seconds), then a short timing
    (jgmm.timing.time_ms: 3 batches).
  final: every candidate run once and compared with the xla backend's output (max |out - ref| / max |ref|),
    then all timed interleaved (jgmm.timing.interleaved_samples: 7 rounds; "samples_us" holds each round's time,
    "us" their median).
Calls go through jgmm's public ops with backend= and config= forced, on fresh random inputs (balanced routing),
several runs of the op in one program for a small key (problem()); every time reported is one run's.
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
from jgmm import bench, config_table, timing
from jgmm.config import Config

_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


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


def problem(key, m, seed=0, abstract=False):
  """(arrays, call(backend, config) -> a jitted function of the arrays, flops, runs) of one key with m total rows:
  the function runs the op `runs` times in one program (timing.chain, enough runs for about 0.5 ms at the speed of
  light) on a GPU, so that timing it times the GPU's work, not the host's dispatch (divide by runs). abstract: the
  arrays' jax.ShapeDtypeStructs (enough to lower; nothing allocated) and one run."""
  if key.op not in ("gmm", "gmm_t", "tgmm", "masked") or {key.in_dtype, key.out_dtype} - set(_DTYPES):
    raise ValueError(f"jgmm.tune cannot time {key.op} with {key.in_dtype} -> {key.out_dtype} yet")
  dtype, out_dtype = _DTYPES[key.in_dtype], _DTYPES[key.out_dtype]
  g, k, n = key.g, key.k, key.n
  keys = iter(list(jax.random.split(jax.random.key(seed), 4)))
  normal = lambda shape, scale=1.0: (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)
  build = jax.eval_shape if abstract else lambda make: make()
  flops = 2 * m * k * n
  on_gpu = not abstract and jax.default_backend() == "gpu"  # elsewhere calls are synchronous: nothing to amortise
  runs = timing.chain_runs(bench.speed_of_light_ms(m, k, n, g)) if on_gpu else 1
  jit = lambda op: jax.jit(timing.chain(op, runs))
  if key.op == "masked":
    arrays = build(lambda: (normal((g, m // g, k), k**-0.5), normal((g, n, k)), jnp.full((g,), m // g, jnp.int32)))
    return arrays, lambda backend, config: jit(lambda x, w, mm: jgmm.masked_gmm(
        x, w, mm, preferred_element_type=out_dtype, config=config, backend=backend)), flops, runs
  sizes = bench.group_sizes(m, g, seed)
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
    for i, samples in timing.interleaved_samples(fns, min_batch_s=seconds, batches=7).items():
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
