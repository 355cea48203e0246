"""How much a coarser rhs scale costs the FP8 weight gradient (CPU, numpy; issue 15, perf-notes session 29).

dW = x^T dout over one group of M rows, x quantised per 128 rows of M (128x1, the recipe's), dout either 128x1 too (the
recipe's, 32 column scales a thread in tgmm_fp8_ws's promotion) or one scale per column over the group's rows (the
promotion would then need only the two row scales a thread holds, as the row-only diagnostic copy's ~1000 TFLOP/s).
Prints dW's relative Frobenius error against float64 for each, and bf16's, over token magnitudes spread by
exp(N(0, sigma)) with a few outlier tokens (x50).

python docs/experiments/wgrad_scale_error.py
"""
import jax.numpy as jnp
import numpy as np

M, K, N, FP8_MAX = 1024, 256, 256, 448.0


def quantized(a, scale):
  """a (float64) through float8_e4m3fn at scale (broadcast to a), dequantised."""
  return np.asarray(jnp.asarray(a / scale, jnp.float32).astype(jnp.float8_e4m3fn).astype(jnp.float32),
                    np.float64) * scale


def per_128_rows(a):
  blocks = a.reshape(M // 128, 128, -1)
  return quantized(blocks, np.abs(blocks).max(1, keepdims=True) / FP8_MAX).reshape(M, -1)


def bf16(a):
  return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)


if __name__ == "__main__":
  rng = np.random.default_rng(0)
  for sigma in (0.0, 1.0, 2.0, 3.0):
    errors = {"128x1": [], "per column": [], "bf16": []}
    for _ in range(3):
      x = rng.standard_normal((M, K)) * np.exp(rng.normal(0, 0.5, (M, 1)))
      dout = rng.standard_normal((M, N)) * np.exp(rng.normal(0, sigma, (M, 1))) * np.exp(rng.normal(0, 1, (1, N)))
      dout[rng.integers(0, M, 3)] *= 50
      exact = x.T @ dout
      error = lambda w: np.linalg.norm(w - exact) / np.linalg.norm(exact)
      x_q = per_128_rows(x)
      errors["128x1"].append(error(x_q.T @ per_128_rows(dout)))
      errors["per column"].append(error(x_q.T @ quantized(dout, np.abs(dout).max(0, keepdims=True) / FP8_MAX)))
      errors["bf16"].append(error(bf16(x).T @ bf16(dout)))
    print(f"token spread sigma {sigma}: " + ", ".join(f"{k} {np.mean(v):.2e}" for k, v in errors.items()))
