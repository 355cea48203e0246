"""Benchmark of the Triton -> XLA bridge (jgmm.ffi) on a GPU: `python -m jgmm.bench_ffi`.

1. Host overhead: median wall time of a jitted call (dispatch + launch + block_until_ready) of a trivial Triton
   kernel vs a jitted jnp.add of the same small arrays; the difference is the bridge's cost (target <= 5 us).
2. Compile time of the gmm kernel (a jgmm.gmm call) in a fresh process with an empty Triton cache,
   then again in a second process sharing that cache: lowering (Triton compile) drops to a cache load.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jgmm
from jgmm import ffi, oracle

PROBE_SHAPE = (4096, 1024, 1024, 8)  # M, K, N, G


@triton.jit
def _add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _triton_add(x, y):
  return ffi.triton_call(x,
                         y,
                         x.size,
                         kernel=_add_kernel,
                         out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         grid=(triton.cdiv(x.size, 1024),),
                         BLOCK=1024)


def host_overhead(size: int = 1024, calls: int = 3000) -> dict:
  """Median microseconds per blocking call, both functions timed interleaved."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(size, dtype=np.float32))
  y = jnp.asarray(rng.standard_normal(size, dtype=np.float32))
  functions = {"triton_call add": jax.jit(_triton_add), "jnp.add": jax.jit(jnp.add)}
  np.testing.assert_allclose(np.asarray(functions["triton_call add"](x, y)), np.asarray(x) + np.asarray(y), rtol=1e-6)
  times = {name: [] for name in functions}
  for _ in range(200):  # warm up
    for f in functions.values():
      f(x, y).block_until_ready()
  for _ in range(calls):
    for name, f in functions.items():
      start = time.perf_counter()
      f(x, y).block_until_ready()
      times[name].append(time.perf_counter() - start)
  return {name: 1e6 * float(np.median(t)) for name, t in times.items()}


def compile_probe() -> dict:
  """Seconds to lower (incl. Triton compile), XLA-compile, and run once, a jgmm.gmm call (the gmm kernel)."""
  rng = np.random.default_rng(0)
  m, k, n, g = PROBE_SHAPE
  x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32), jnp.bfloat16)
  sizes = jnp.asarray(rng.multinomial(m, np.full(g, 1.0 / g)), jnp.int32)
  start = time.perf_counter()
  lowered = jax.jit(functools.partial(jgmm.gmm, backend="triton")).lower(x, w, sizes)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  compiled_at = time.perf_counter()
  out = compiled(x, w, sizes).block_until_ready()
  ran_at = time.perf_counter()
  return {
      "lower_s": lowered_at - start,
      "xla_compile_s": compiled_at - lowered_at,
      "first_run_s": ran_at - compiled_at,
      "rel_error": float(oracle.rel_err(out, oracle.gmm(x, w, sizes)))
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--compile-probe", action="store_true", help=argparse.SUPPRESS)
  if parser.parse_args().compile_probe:
    print(json.dumps(compile_probe()))
    return
  device = jax.devices()[0]
  if device.platform != "gpu":
    sys.exit(f"bench_ffi needs a GPU; jax's default device is {device}")
  print(f"device: {device.device_kind}   jax {jax.__version__}   triton {triton.__version__}")

  overhead = host_overhead()
  print("\nhost overhead, 1024 x fp32, median of 3000 blocking calls")
  for name, us in overhead.items():
    print(f"  {name:<18} {us:8.1f} us")
  extra = overhead["triton_call add"] - overhead["jnp.add"]
  print(f"  {'difference':<18} {extra:8.1f} us   (target <= 5 us: {'met' if extra <= 5 else 'MISSED'})")

  print("\njgmm.gmm (gmm kernel, bf16, M=%d K=%d N=%d G=%d), each in a new process" % PROBE_SHAPE)
  print(f"  {'process':<28} {'lower (Triton)':>15} {'XLA compile':>12} {'first run':>10} {'rel err':>9}")
  with tempfile.TemporaryDirectory(prefix="jgmm_triton_cache_") as cache_dir:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, JAX_ENABLE_COMPILATION_CACHE="false")
    for label in ("1: empty Triton cache", "2: Triton on-disk cache"):
      result = subprocess.run([sys.executable, "-m", "jgmm.bench_ffi", "--compile-probe"],
                              env=env,
                              capture_output=True,
                              text=True,
                              check=True)
      probe = json.loads(result.stdout.strip().splitlines()[-1])
      print(f"  {label:<28} {probe['lower_s']:>14.3f}s {probe['xla_compile_s']:>11.3f}s "
            f"{probe['first_run_s']:>9.3f}s {probe['rel_error']:>9.1e}")
    print(f"  Triton cache entries after both: {len(os.listdir(cache_dir))}")


if __name__ == "__main__":
  main()
