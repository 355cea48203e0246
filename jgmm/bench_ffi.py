"""Benchmark of the Triton -> XLA bridge (jgmm.ffi) on a GPU: `python -m jgmm.bench_ffi`.

1. Host overhead: median wall time of a jitted call (dispatch + launch + block_until_ready) of a trivial Triton
   kernel vs a jitted jnp.add of the same small arrays; the difference is the bridge's cost (target <= 5 us).
2. Compile time of a matmul kernel (bf16 tl.dot, 128x128x64 tiles) in a fresh process with an empty Triton cache,
   then again in a second process sharing that cache: lowering (Triton compile) drops to a cache load.
"""

import argparse
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

from jgmm import ffi


@triton.jit
def _add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
             mask=mask)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def _triton_add(x, y):
    return ffi.triton_call(x, y, x.size, kernel=_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=(triton.cdiv(x.size, 1024),), BLOCK=1024)


def _matmul(a, b):
    (m, k), (_, n) = a.shape, b.shape
    return ffi.triton_call(a, b, m, n, k, kernel=_matmul_kernel, out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
                           grid=(triton.cdiv(m, 128), triton.cdiv(n, 128)), num_warps=8, num_stages=3, BM=128,
                           BN=128, BK=64)


def host_overhead(size: int = 1024, calls: int = 3000) -> dict:
    """Median microseconds per blocking call, both functions timed interleaved."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(size, dtype=np.float32))
    y = jnp.asarray(rng.standard_normal(size, dtype=np.float32))
    functions = {"triton_call add": jax.jit(_triton_add), "jnp.add": jax.jit(jnp.add)}
    np.testing.assert_allclose(np.asarray(functions["triton_call add"](x, y)), np.asarray(x) + np.asarray(y),
                               rtol=1e-6)
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
    """Seconds to lower (incl. Triton compile), XLA-compile, and run once, a matmul kernel call."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((512, 256), dtype=np.float32), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((256, 384), dtype=np.float32), jnp.bfloat16)
    start = time.perf_counter()
    lowered = jax.jit(_matmul).lower(a, b)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    out = compiled(a, b).block_until_ready()
    ran_at = time.perf_counter()
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    error = float(np.max(np.abs(np.asarray(out, np.float64) - expected)) / np.max(np.abs(expected)))
    return {"lower_s": lowered_at - start, "xla_compile_s": compiled_at - lowered_at,
            "first_run_s": ran_at - compiled_at, "max_rel_error": error}


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

    print("\nmatmul kernel (bf16, 512x256 @ 256x384, 128x128x64 tiles), each in a new process")
    print(f"  {'process':<28} {'lower (Triton)':>15} {'XLA compile':>12} {'first run':>10} {'rel err':>9}")
    with tempfile.TemporaryDirectory(prefix="jgmm_triton_cache_") as cache_dir:
        env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, JAX_ENABLE_COMPILATION_CACHE="false")
        for label in ("1: empty Triton cache", "2: Triton on-disk cache"):
            result = subprocess.run([sys.executable, "-m", "jgmm.bench_ffi", "--compile-probe"], env=env,
                                    capture_output=True, text=True, check=True)
            probe = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"  {label:<28} {probe['lower_s']:>14.3f}s {probe['xla_compile_s']:>11.3f}s "
                  f"{probe['first_run_s']:>9.3f}s {probe['max_rel_error']:>9.1e}")
        print(f"  Triton cache entries after both: {len(os.listdir(cache_dir))}")


if __name__ == "__main__":
    main()
