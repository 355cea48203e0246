"""jgmm.fp8_gmm, the FP8 training recipe, against the bf16 gmm: forward and gradients within DeepGEMM's
criterion 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 (FP8's 3-bit mantissa: ~3-5% relative error per product), on
the portable backend; a short training run follows the bf16 loss curve.
"""
import dataclasses
import secrets

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import jgmm
from jgmm import oracle

CRITERION = 1e-3


class Fp8RecipeTest(parameterized.TestCase):
  backend = None  # The platform's default: the kernels on a GPU, the portable backend elsewhere.

  def setUp(self):
    super().setUp()
    self.seed = secrets.randbits(32)
    self.rng = np.random.default_rng(self.seed)

  def normal(self, shape, dtype=jnp.bfloat16):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  @parameterized.parameters(
      dict(m=200, k=300, n=136, transpose_rhs=False, group_offset=None),
      dict(m=160, k=129, n=70, transpose_rhs=True, group_offset=None),
      dict(m=256, k=256, n=128, transpose_rhs=False, group_offset=1))
  def test_forward_and_grads_follow_bf16(self, m, k, n, transpose_rhs, group_offset):
    groups = 3
    lhs = self.normal((m, k))
    rhs = self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    sizes = jnp.asarray([m // 5, 0, m // 2, m // 4] if group_offset is not None else [m // 3, 0, m // 2], jnp.int32)
    dout = self.normal((m, n))

    def run(fn):
      out, vjp = jax.vjp(lambda l, r: fn(l, r, sizes, transpose_rhs=transpose_rhs, group_offset=group_offset,
                                         backend=self.backend), lhs, rhs)
      return (out, *vjp(dout))

    got = jax.jit(lambda: run(jgmm.fp8_gmm))()
    want = jax.jit(lambda: run(jgmm.gmm))()
    for name, a, b in zip(("out", "dlhs", "drhs"), got, want):
      self.assertEqual(a.shape, b.shape, name)
      self.assertEqual(a.dtype, b.dtype, name)
      self.assertFalse(np.isnan(np.asarray(a, np.float32)).any(), name)
      self.assertLess(oracle.deepgemm_diff(a, b), CRITERION, f"{name}, seed {self.seed}")
    offset = group_offset or 0
    out = np.asarray(got[0], np.float32)
    np.testing.assert_array_equal(out[:int(np.sum(sizes[:offset]))], 0.0)  # rows of no computed group
    np.testing.assert_array_equal(out[int(np.sum(sizes[:offset + groups])):], 0.0)

  def test_training_follows_bf16(self):
    """Fit a grouped linear map: 30 SGD steps in FP8 and in bf16 from the same start; the losses agree to 5%."""
    m, k, n, groups = 256, 128, 128, 4
    sizes = jnp.full((groups,), m // groups, jnp.int32)
    x = self.normal((m, k), jnp.float32)
    target = jgmm.gmm(x, self.normal((groups, k, n), jnp.float32), sizes) / np.sqrt(k)
    w0 = jnp.asarray(self.rng.standard_normal((groups, k, n)) * 0.1, jnp.bfloat16)

    def train(fn):
      def loss(w):
        return jnp.mean((fn(x.astype(jnp.bfloat16), w, sizes, backend=self.backend).astype(jnp.float32) - target)**2)

      @jax.jit
      def step(w):
        value, grad = jax.value_and_grad(loss)(w)
        return (w.astype(jnp.float32) - 2.0 * grad.astype(jnp.float32)).astype(w.dtype), value

      losses, w = [], w0
      for _ in range(30):
        w, value = step(w)
        losses.append(float(value))
      return np.array(losses)

    fp8_losses, bf16_losses = train(jgmm.fp8_gmm), train(jgmm.gmm)
    self.assertLess(bf16_losses[-1], 0.5 * bf16_losses[0])  # It learns...
    np.testing.assert_allclose(fp8_losses, bf16_losses, rtol=0.05)  # ...and FP8 follows.

  @parameterized.parameters(False, True)
  def test_weights_quantised_ahead(self, transpose_rhs):
    """fp8_gmm on quantize_weights(rhs), inside the differentiated function: the same output and gradients as on rhs
    (both quantise rhs in one quantize_pair pass under differentiation), bit for bit; its forward alone within the
    criterion of the bf16 gmm."""
    m, k, n, groups = 192, 160, 136, 3
    lhs = self.normal((m, k))
    rhs = self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    sizes = jnp.asarray([m // 3, 0, m // 2], jnp.int32)
    dout = self.normal((m, n))
    kw = dict(transpose_rhs=transpose_rhs, backend=self.backend)

    def run(quantized_ahead):
      def fn(l, r):
        return jgmm.fp8_gmm(l, jgmm.quantize_weights(r, **kw) if quantized_ahead else r, sizes, **kw)
      out, vjp = jax.vjp(fn, lhs, rhs)
      return (out, *vjp(dout))

    got, want = jax.jit(lambda: run(True))(), jax.jit(lambda: run(False))()
    for name, a, b in zip(("out", "dlhs", "drhs"), got, want):
      self.assertFalse(np.isnan(np.asarray(a, np.float32)).any(), name)
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), name)
    weights = jax.jit(lambda r: jgmm.quantize_weights(r, **kw))(rhs)  # A pytree through jit, in and out.
    out = jax.jit(lambda l, w: jgmm.fp8_gmm(l, w, sizes, **kw))(lhs, weights)
    self.assertLess(oracle.deepgemm_diff(out, jgmm.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs)), CRITERION,
                    f"seed {self.seed}")

  def test_weights_quantised_once_for_micro_batches(self):
    """Gradient accumulation: weights quantised once for two micro-batches give rhs the sum of the gradients that
    each micro-batch gives on its own."""
    m, k, n, groups = 128, 256, 128, 2
    xs = [self.normal((m, k), jnp.float32) for _ in range(2)]
    sizes = jnp.asarray([m // 4, 3 * m // 4], jnp.int32)
    rhs = self.normal((groups, k, n), jnp.float32)

    def loss(x, w):
      return jnp.sum(jgmm.fp8_gmm(x, w, sizes, backend=self.backend).astype(jnp.float32) ** 2)

    once = jax.jit(jax.grad(lambda r: sum(loss(x, w) for w in [jgmm.quantize_weights(r, backend=self.backend)]
                                          for x in xs)))(rhs)
    each = sum(jax.jit(jax.grad(lambda r, x=x: loss(x, r)))(rhs) for x in xs)
    self.assertEqual(once.dtype, rhs.dtype)
    self.assertGreater(float(jnp.max(jnp.abs(once))), 0.0)
    np.testing.assert_allclose(np.asarray(once), np.asarray(each), rtol=1e-5, atol=1e-5)

  def test_bad_weights(self):
    rhs = jnp.ones((2, 256, 128), jnp.bfloat16)  # (G, K, N): K = 256, N = 128
    lhs, sizes = jnp.ones((8, 256), jnp.bfloat16), jnp.asarray([4, 4])
    weights = jgmm.quantize_weights(rhs)
    with self.assertRaisesRegex(ValueError, "rhs is Fp8Weights of weights with transpose_rhs=False, but the call "
                                "passes transpose_rhs=True"):
      jgmm.fp8_gmm(lhs, weights, sizes, transpose_rhs=True)
    with self.assertRaisesRegex(TypeError, r"rhs.nk must have fp8_dtype \(float8_e4m3fnuz\), got shape "
                                r"\(2, 128, 256\) and dtype float8_e4m3fn"):
      jgmm.fp8_gmm(lhs, weights, sizes, fp8_dtype=jnp.float8_e4m3fnuz)
    with self.assertRaisesRegex(ValueError, r"rhs.kn must have shape \(G, K, N\) = \(2, 256, 128\), got shape "
                                r"\(2, 128, 256\)"):
      jgmm.fp8_gmm(lhs, dataclasses.replace(weights, kn=weights.nk), sizes)
    with self.assertRaisesRegex(TypeError, "rhs.kn_scale must have dtype float32, got .* bfloat16"):
      jgmm.fp8_gmm(lhs, dataclasses.replace(weights, kn_scale=weights.kn_scale.astype(jnp.bfloat16)), sizes)
    with self.assertRaisesRegex(ValueError, r"rhs.nk_scale must have shape \(G, cdiv\(N, 128\), cdiv\(K, 128\)\) = "
                                r"\(2, 1, 2\) \(128x128 blocks\), got shape \(2, 2, 1\)"):
      jgmm.fp8_gmm(lhs, dataclasses.replace(weights, nk_scale=weights.kn_scale), sizes)
    with self.assertRaisesRegex(ValueError, r"rhs must have K = 128 \(lhs is \(8, 128\)\)"):  # gmm's checks
      jgmm.fp8_gmm(lhs[:, :128], weights, sizes)
    with self.assertRaisesRegex(ValueError, r"rhs must be 3-D \(G, N, K\), got shape \(256, 128\)"):
      jgmm.quantize_weights(rhs[0], transpose_rhs=True)
    with self.assertRaisesRegex(TypeError, "transpose_rhs must be a Python bool, got 1"):
      jgmm.quantize_weights(rhs, transpose_rhs=1)
    with self.assertRaisesRegex(TypeError, "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got int8"):
      jgmm.quantize_weights(rhs, fp8_dtype=jnp.int8)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(TypeError, "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 8, 4)), jnp.asarray([4]), fp8_dtype=jnp.bfloat16)
    with self.assertRaisesRegex(ValueError, "rhs must have K = 8"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 7, 4)), jnp.asarray([4]))


if __name__ == "__main__":
  absltest.main()
