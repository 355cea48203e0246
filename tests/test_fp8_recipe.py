"""jgmm.fp8_gmm, the FP8 training recipe, against the bf16 gmm: forward and gradients within DeepGEMM's
criterion 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 (FP8's 3-bit mantissa: ~3-5% relative error per product), on
the portable backend; a short training run follows the bf16 loss curve.
"""
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

  def test_bad_arguments(self):
    with self.assertRaisesRegex(TypeError, "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 8, 4)), jnp.asarray([4]), fp8_dtype=jnp.bfloat16)
    with self.assertRaisesRegex(ValueError, "rhs must have K = 8"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 7, 4)), jnp.asarray([4]))


if __name__ == "__main__":
  absltest.main()
