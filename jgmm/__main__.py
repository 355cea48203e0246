"""`python -m jgmm`: a small MoE layer's forward and backward on the present backend, checked and timed.

Checks gmm (swiglu up-projection and down-projection), tgmm (the weight gradient jax.grad computes) and
masked_gmm against the float64 oracle, then times jgmm against jax.lax.ragged_dot at M=4096, K=512, N=512, G=64.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import oracle

TOKENS, TOP_K, EXPERTS, HIDDEN, FFN = 1024, 2, 8, 256, 512
BENCH_SHAPE = (4096, 512, 512, 64)  # M, K, N, G


def _median_ms(f, *args, calls=20, repeats=7):
  """Median over `repeats` batches of ms per call, a batch being `calls` asynchronous calls and one wait (a
  wait per call would time the host's dispatch and synchronisation, ~60 us, more than these kernels)."""
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      out = f(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls)
  return 1e3 * float(np.median(times))


def _check(name, actual, expected, tolerance):
  err = oracle.rel_err(actual, expected)
  print(f"  {name:<34} relative error {err:.2e}  {'ok' if err < tolerance else 'FAILED'}")
  return err < tolerance


def main():
  device = jax.devices()[0]
  dtype = jnp.bfloat16 if device.platform == "gpu" else jnp.float32
  tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-3
  print(f"jgmm on {device.platform} ({device.device_kind}), {jnp.dtype(dtype).name} inputs")
  rng = np.random.default_rng()
  m = TOKENS * TOP_K
  sizes = jnp.asarray(rng.multinomial(m, rng.dirichlet(np.ones(EXPERTS))), jnp.int32)
  x = jnp.asarray(rng.standard_normal((m, HIDDEN)), dtype)
  w_up = jnp.asarray(rng.standard_normal((EXPERTS, HIDDEN, 2 * FFN)) / HIDDEN**0.5, dtype)
  w_down = jnp.asarray(rng.standard_normal((EXPERTS, FFN, HIDDEN)) / FFN**0.5, dtype)

  def moe(x, w_up, w_down):
    h = jgmm.gmm(x, w_up, sizes, activation="swiglu")
    return jgmm.gmm(h, w_down, sizes)

  loss = lambda *a: jnp.sum(moe(*a).astype(jnp.float32) ** 2)
  h = jax.jit(lambda x, w: jgmm.gmm(x, w, sizes, activation="swiglu"))(x, w_up)
  out = jax.jit(moe)(x, w_up, w_down)
  dw_down = jax.jit(jax.grad(loss, argnums=2))(x, w_up, w_down)
  x_masked = h[: EXPERTS * 64].reshape(EXPERTS, 64, FFN)
  masked_m = jnp.asarray(rng.integers(0, 65, EXPERTS), jnp.int32)
  w_masked = jnp.swapaxes(w_down, 1, 2)

  print("correctness against the float64 oracle:")
  ok = _check("gmm (swiglu up-projection)", h, oracle.gmm(x, w_up, sizes, activation_name="swiglu"), tolerance)
  ok &= _check("gmm (down-projection)", out, oracle.gmm(h, w_down, sizes), tolerance)
  dout = 2.0 * np.asarray(out, np.float64)
  ok &= _check("tgmm (grad of w_down)", dw_down, oracle.tgmm(h, dout, sizes, transpose_lhs=True)[0], tolerance)
  ok &= _check("masked_gmm", jgmm.masked_gmm(x_masked, w_masked, masked_m),
               oracle.masked_gmm(x_masked, w_masked, masked_m), tolerance)

  m, k, n, g = BENCH_SHAPE
  sizes = jnp.asarray(rng.multinomial(m, np.full(g, 1.0 / g)), jnp.int32)
  x, w = jnp.asarray(rng.standard_normal((m, k)), dtype), jnp.asarray(rng.standard_normal((g, k, n)), dtype)
  ragged = lambda x, w: jax.lax.ragged_dot(x, w, sizes)
  gemm = lambda x, w: jgmm.gmm(x, w, sizes)
  grad_of = lambda f: jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) ** 2), argnums=(0, 1)))
  rows = [("forward", jax.jit(gemm), jax.jit(ragged)), ("forward+backward", grad_of(gemm), grad_of(ragged))]
  print(f"\ntiming, M={m} K={k} N={n} G={g} (median ms):")
  print(f"  {'':<18}{'jgmm':>10}{'ragged_dot':>12}{'speed-up':>10}")
  for name, ours, theirs in rows:
    t_ours, t_theirs = _median_ms(ours, x, w), _median_ms(theirs, x, w)
    print(f"  {name:<18}{t_ours:>10.3f}{t_theirs:>12.3f}{t_theirs / t_ours:>9.1f}x")
  if not ok:
    raise SystemExit("jgmm: results differ from the float64 oracle")


if __name__ == "__main__":
  main()
