"""jgmm.fp8_gmm, the FP8 training recipe, against the bf16 gmm: forward and gradients within DeepGEMM's
criterion 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 (FP8's 3-bit mantissa: ~3-5% relative error per product), on
the portable backend; a short training run follows the bf16 loss curve.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized

import jgmm
from jgmm import oracle, quantize

CRITERION = 1e-3


class Fp8RecipeTest(seeded.SeededTestCase):
  backend = None  # The platform's default: the kernels on a GPU, the portable backend elsewhere.

  def normal(self, shape, dtype=jnp.bfloat16):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  @parameterized.parameters(
      dict(m=200, k=300, n=136, transpose_rhs=False, group_offset=None),
      dict(m=160, k=129, n=70, transpose_rhs=True, group_offset=None),
      dict(m=256, k=256, n=128, transpose_rhs=False, group_offset=1),
      dict(m=2048, k=256, n=128, transpose_rhs=True, group_offset=1),  # lhs^T / dout^T with groups padded
      dict(m=2048, k=256, n=128, transpose_rhs=False, group_offset=1, wgrad_scale="group"),
      dict(m=2048, k=256, n=128, transpose_rhs=True, group_offset=None, wgrad_scale="group"),
      dict(m=2048, k=128, n=256, transpose_rhs=False, group_offset=None, wgrad_scale="group"),
      dict(m=2048, k=128, n=256, transpose_rhs=True, group_offset=1, wgrad_scale="group"))
  def test_forward_and_grads_follow_bf16(self, m, k, n, transpose_rhs, group_offset, wgrad_scale=None):
    groups = 3
    lhs = self.normal((m, k))
    rhs = self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    sizes = jnp.asarray([m // 5, 0, m // 2, m // 4] if group_offset is not None else [m // 3, 0, m // 2], jnp.int32)
    dout = self.normal((m, n))

    def run(fn):
      out, vjp = jax.vjp(lambda l, r: fn(l, r, sizes, transpose_rhs=transpose_rhs, group_offset=group_offset,
                                         backend=self.backend), lhs, rhs)
      return (out, *vjp(dout))

    got = jax.jit(lambda: run(functools.partial(jgmm.fp8_gmm, wgrad_scale=wgrad_scale or "128x1")))()
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

  @parameterized.parameters(dict(m=1600, transpose_rhs=False, aligned=True, last=700),
                            dict(m=1600, transpose_rhs=True, aligned=True, last=700),
                            dict(m=1600, transpose_rhs=False, aligned=True, last=2**30),  # clipped at M
                            dict(m=1000, transpose_rhs=False, aligned=False, last=700))
  def test_weight_gradient_blocks(self, m, transpose_rhs, aligned, last):
    """drhs multiplies lhs^T and dout^T quantised per 128 rows of M: from each group's first row on (no block spans
    two groups) where padding the groups to that grid (128 rows at most each) adds at most a quarter to M, on M's
    global grid elsewhere. Group 0's rows are 1e-5 times the others': a block spanning groups 0 and 2 rounds them
    to FP8 on group 2's scale. drhs against float64 oracles of both blocks: close to its own, far from the other's
    at group 0; groups past M are clipped to it."""
    k, n, sizes = 160, 136, np.array([100, 0, last], np.int32)
    rows = np.arange(m)[:, None]
    lhs = jnp.where(rows < 100, 1e-5, 1.0) * self.normal((m, k), jnp.float32)
    rhs = self.normal((3, n, k) if transpose_rhs else (3, k, n), jnp.float32)
    dout = self.normal((m, n), jnp.float32)
    fn = lambda l, r: jgmm.fp8_gmm(l, r, jnp.asarray(sizes), transpose_rhs=transpose_rhs, backend=self.backend)
    _, vjp = jax.vjp(fn, lhs, rhs)
    drhs = np.asarray(jax.jit(vjp)(dout)[1], np.float64)

    def deq_t(a, first, last):  # rows [first, last) of a, transposed and quantised 1x128 from `first` on.
      return oracle.dequantize(*quantize.quantize(a[first:last].T, "1x128"), "1x128")

    starts = np.minimum(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]), m)
    for want_aligned in (True, False):
      want = np.zeros_like(drhs)
      for g, (first, last) in enumerate(zip(starts[:-1], starts[1:])):
        if want_aligned:
          a, b = deq_t(lhs, first, last), deq_t(dout, first, last)
        else:
          a, b = deq_t(lhs, 0, m)[:, first:last], deq_t(dout, 0, m)[:, first:last]
        want[g] = (b @ a.T) if transpose_rhs else (a @ b.T)
      error = np.abs(drhs[0] - want[0]).max() / np.abs(want[0]).max()
      if want_aligned == aligned:
        self.assertLess(error, 1e-2, f"seed {self.seed}")
        self.assertLess(np.abs(drhs - want).max() / np.abs(want).max(), 1e-2, f"seed {self.seed}")
      else:
        self.assertGreater(error, 0.2, f"seed {self.seed}")

  @parameterized.product(transpose_rhs=(False, True), kn=((160, 136), (136, 160)))
  def test_weight_gradient_per_group(self, transpose_rhs, kn):
    """wgrad_scale="group": the narrower of the weight gradient's operands (dout^T where N < K, lhs^T where K < N;
    in either weights' layout, the tgmm storing its tiles transposed where needed) is quantised with one scale per
    group and column. In group 2 that operand's rows after its first 128 are 1e-6 times the others (the other
    operand's 1e6 times: their products weigh as much): on the group's scale they round to zero, on their own
    128-row blocks' they do not. drhs against float64 oracles of both: close to the per-group one, far from the
    128x1 one at group 2; dlhs and the forward are those of "128x1"."""
    (k, n), m, sizes = kn, 2400, np.array([500, 0, 1100, 600], np.int32)
    lhs_grouped = k < n
    rows = np.arange(m)[:, None]
    tiny = (rows >= 628) & (rows < 1600)  # Group 2's rows (500-1600) after its first 128.
    coarse, fine = (1e-6 * tiny + (1 - tiny)), (1e6 * tiny + (1 - tiny))
    lhs = self.normal((m, k), jnp.float32) * (coarse if lhs_grouped else fine)
    dout = self.normal((m, n), jnp.float32) * (fine if lhs_grouped else coarse)
    rhs = self.normal((4, n, k) if transpose_rhs else (4, k, n), jnp.float32)
    run = lambda scale: jax.jit(jax.vjp(lambda l, r: jgmm.fp8_gmm(
        l, r, jnp.asarray(sizes), transpose_rhs=transpose_rhs, wgrad_scale=scale, backend=self.backend),
        lhs, rhs)[1])(dout)
    (dlhs, drhs), (dlhs_128, _) = run("group"), run("128x1")
    np.testing.assert_array_equal(np.asarray(dlhs), np.asarray(dlhs_128))
    drhs = np.asarray(drhs, np.float64)
    starts = np.concatenate([[0], np.cumsum(sizes)])

    def deq_t(a, first, last, per_group):  # rows [first, last) of a, transposed, per 128 rows or per group.
      a_t = np.asarray(a[first:last], np.float32).T
      if per_group:
        scale = np.maximum(np.abs(a_t).max(axis=1, keepdims=True, initial=0.0), 1e-30) / 448.0
        return np.asarray(np.asarray(a_t / scale).astype(jnp.float8_e4m3fn), np.float64) * scale
      return oracle.dequantize(*quantize.quantize(jnp.asarray(a_t), "1x128"), "1x128")

    for per_group in (True, False):
      want = np.zeros_like(drhs)
      for g, (first, last) in enumerate(zip(starts[:-1], starts[1:])):
        a = deq_t(lhs, first, last, per_group and lhs_grouped)
        b = deq_t(dout, first, last, per_group and not lhs_grouped)
        want[g] = (b @ a.T) if transpose_rhs else (a @ b.T)
      error = np.abs(drhs[2] - want[2]).max() / np.abs(want[2]).max()
      if per_group:
        self.assertLess(error, 2e-2, f"seed {self.seed}")
        self.assertLess(np.abs(drhs - want).max() / np.abs(want).max(), 2e-2, f"seed {self.seed}")
      else:
        self.assertGreater(error, 0.2, f"seed {self.seed}")

  def test_reverse_mode_only(self):
    """The README's one exception to forward mode: fp8_gmm's gradient is a recipe (a custom_vjp)."""
    lhs, rhs = self.normal((64, 32)), self.normal((2, 32, 16))
    sizes = jnp.asarray([30, 34], jnp.int32)
    with self.assertRaisesRegex(TypeError, "can't apply forward-mode autodiff"):
      jax.jvp(lambda l: jgmm.fp8_gmm(l, rhs, sizes, backend=self.backend), (lhs,), (lhs,))

  @parameterized.parameters(dict(m=256, wgrad_scale="128x1", lr=2.0), dict(m=2048, wgrad_scale="group", lr=8.0))
  def test_training_follows_bf16(self, m, wgrad_scale, lr):
    """Fit a grouped linear map: 30 SGD steps in FP8 and in bf16 from the same start; the losses agree to 5%
    (wgrad_scale="group" where the groups are padded: M >= 512 G)."""
    k, n, groups = 128, 128, 4
    sizes = jnp.full((groups,), m // groups, jnp.int32)
    x = self.normal((m, k), jnp.float32)
    target = jgmm.gmm(x, self.normal((groups, k, n), jnp.float32), sizes) / np.sqrt(k)
    w0 = jnp.asarray(self.rng.standard_normal((groups, k, n)) * 0.1, jnp.bfloat16)

    def train(fn):
      def loss(w):
        return jnp.mean((fn(x.astype(jnp.bfloat16), w, sizes).astype(jnp.float32) - target)**2)

      @jax.jit
      def step(w):
        value, grad = jax.value_and_grad(loss)(w)
        return (w.astype(jnp.float32) - lr * grad.astype(jnp.float32)).astype(w.dtype), value

      losses, w = [], w0
      for _ in range(30):
        w, value = step(w)
        losses.append(float(value))
      return np.array(losses)

    fp8_losses = train(functools.partial(jgmm.fp8_gmm, wgrad_scale=wgrad_scale, backend=self.backend))
    bf16_losses = train(functools.partial(jgmm.gmm, backend=self.backend))
    self.assertLess(bf16_losses[-1], 0.5 * bf16_losses[0])  # It learns...
    np.testing.assert_allclose(fp8_losses, bf16_losses, rtol=0.05)  # ...and FP8 follows.

  @parameterized.parameters(False, True)
  def test_weights_quantised_ahead(self, transpose_rhs):
    """fp8_gmm with rhs_fp8 = quantize_weights(rhs) made inside the differentiated function: the same output and
    gradients as without it (both quantise rhs in one quantize_pair pass under differentiation), bit for bit; made
    outside and passed through jit, the forward within the criterion of the bf16 gmm."""
    m, k, n, groups = 192, 160, 136, 3
    lhs = self.normal((m, k))
    rhs = self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    sizes = jnp.asarray([m // 3, 0, m // 2], jnp.int32)
    dout = self.normal((m, n))
    kw = dict(transpose_rhs=transpose_rhs, backend=self.backend)

    def run(ahead):
      def fn(l, r):
        return jgmm.fp8_gmm(l, r, sizes, rhs_fp8=jgmm.quantize_weights(r, **kw) if ahead else None, **kw)
      out, vjp = jax.vjp(fn, lhs, rhs)
      return (out, *vjp(dout))

    got, want = jax.jit(lambda: run(True))(), jax.jit(lambda: run(False))()
    for name, a, b in zip(("out", "dlhs", "drhs"), got, want):
      self.assertFalse(np.isnan(np.asarray(a, np.float32)).any(), name)
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), name)
    weights = jax.jit(lambda r: jgmm.quantize_weights(r, **kw))(rhs)  # A pytree through jit, in and out.
    out = jax.jit(lambda l, r, w: jgmm.fp8_gmm(l, r, sizes, rhs_fp8=w, **kw))(lhs, rhs, weights)
    self.assertLess(oracle.deepgemm_diff(out, jgmm.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs)), CRITERION,
                    f"seed {self.seed}")

  def test_products_read_rhs_fp8(self):
    """The products read rhs_fp8, not rhs: given the weights of another rhs, the output is that rhs's product, and
    under differentiation the output and gradients are bit for bit fp8_gmm's on that rhs."""
    lhs, sizes, dout = self.normal((64, 256)), jnp.asarray([40, 24], jnp.int32), self.normal((64, 128))
    rhs, other = self.normal((2, 256, 128)), self.normal((2, 256, 128))
    other_fp8 = jgmm.quantize_weights(other, backend=self.backend)
    got = jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=other_fp8, backend=self.backend)
    self.assertLess(oracle.deepgemm_diff(got, jgmm.gmm(lhs, other, sizes)), CRITERION, f"seed {self.seed}")
    self.assertGreater(oracle.deepgemm_diff(got, jgmm.gmm(lhs, rhs, sizes)), 0.1)

    def run(r, weights):
      out, vjp = jax.vjp(lambda l, r: jgmm.fp8_gmm(l, r, sizes, rhs_fp8=weights, backend=self.backend), lhs, r)
      return (out, *vjp(dout))

    for a, b in zip(jax.jit(run)(rhs, other_fp8), jax.jit(lambda r: run(r, None))(other)):
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))

  def test_weights_quantised_once_for_micro_batches(self):
    """Gradient accumulation, one gradient call per micro-batch: with the weights quantised once outside them, each
    micro-batch's gradient (w.r.t. rhs) is, bit for bit, the one fp8_gmm gives quantising rhs itself."""
    m, k, n, groups = 128, 256, 128, 2
    sizes = jnp.asarray([m // 4, 3 * m // 4], jnp.int32)
    rhs = self.normal((groups, k, n), jnp.float32)
    weights = jax.jit(functools.partial(jgmm.quantize_weights, backend=self.backend))(rhs)

    @jax.jit
    def grad(x, r, w):
      return jax.grad(lambda r: jnp.sum(jgmm.fp8_gmm(x, r, sizes, rhs_fp8=w, backend=self.backend) ** 2))(r)

    for _ in range(2):
      x = self.normal((m, k), jnp.float32)
      once, own = grad(x, rhs, weights), grad(x, rhs, None)
      self.assertGreater(float(jnp.max(jnp.abs(once))), 0.0)
      np.testing.assert_array_equal(np.asarray(once), np.asarray(own))

  def test_bad_weights(self):
    rhs = jnp.ones((2, 256, 128), jnp.bfloat16)  # (G, K, N): K = 256, N = 128
    lhs, sizes = jnp.ones((8, 256), jnp.bfloat16), jnp.asarray([4, 4])
    weights = jgmm.quantize_weights(rhs)
    with self.assertRaisesRegex(TypeError, r"rhs_fp8 must be jgmm.Fp8Weights \(jgmm.quantize_weights of the weights\), "
                                "got tuple"):
      jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=(weights.nk, weights.nk_scale, weights.kn, weights.kn_scale))
    with self.assertRaisesRegex(ValueError, r"rhs_fp8 was made with transpose_rhs=False, but the call reads weights "
                                r"with transpose_rhs=True: make it with quantize_weights\(..., transpose_rhs=True\)"):
      jgmm.fp8_gmm(lhs, jnp.swapaxes(rhs, 1, 2), sizes, transpose_rhs=True, rhs_fp8=weights)
    with self.assertRaisesRegex(TypeError, r"rhs_fp8.nk must have the call's FP8 format float8_e4m3fnuz, got shape "
                                r"\(2, 128, 256\) and dtype float8_e4m3fn: make it with quantize_weights\(..., "
                                r"fp8_dtype=jnp.float8_e4m3fnuz\)"):
      jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=weights, fp8_dtype=jnp.float8_e4m3fnuz)
    with self.assertRaisesRegex(ValueError, r"rhs_fp8.kn must have shape \(G, K, N\) = \(2, 256, 128\), got shape "
                                r"\(2, 128, 256\)"):
      jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=dataclasses.replace(weights, kn=weights.nk))
    with self.assertRaisesRegex(ValueError, r"rhs_fp8.nk must have shape \(G, N, K\) = \(2, 128, 256\), got shape "
                                r"\(3, 128, 256\)"):  # Weights of another rhs.
      jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=jgmm.quantize_weights(jnp.ones((3, 256, 128), jnp.bfloat16)))
    with self.assertRaisesRegex(TypeError, "rhs_fp8.kn_scale must have dtype float32, got .* bfloat16"):
      jgmm.fp8_gmm(lhs, rhs, sizes,
                   rhs_fp8=dataclasses.replace(weights, kn_scale=weights.kn_scale.astype(jnp.bfloat16)))
    with self.assertRaisesRegex(ValueError, r"rhs_fp8.nk_scale must have shape \(G, cdiv\(N, 128\), cdiv\(K, 128\)\) "
                                r"= \(2, 1, 2\) \(128x128 blocks\), got shape \(2, 2, 1\)"):
      jgmm.fp8_gmm(lhs, rhs, sizes, rhs_fp8=dataclasses.replace(weights, nk_scale=weights.kn_scale))
    with self.assertRaisesRegex(ValueError, r"rhs must be 3-D \(G, N, K\), got shape \(256, 128\)"):
      jgmm.quantize_weights(rhs[0], transpose_rhs=True)
    with self.assertRaisesRegex(TypeError, "transpose_rhs must be a Python bool, got 'no'"):
      jgmm.quantize_weights(rhs, transpose_rhs="no")
    with self.assertRaisesRegex(TypeError, "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got int8"):
      jgmm.quantize_weights(rhs, fp8_dtype=jnp.int8)
    with self.assertRaisesRegex(ValueError, "backend must be None, 'triton' or 'xla', got 'bogus'"):
      jgmm.quantize_weights(rhs, backend="bogus")

  def test_bad_arguments(self):
    with self.assertRaisesRegex(TypeError, "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 8, 4)), jnp.asarray([4]), fp8_dtype=jnp.bfloat16)
    with self.assertRaisesRegex(ValueError, "rhs must have K = 8"):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 7, 4)), jnp.asarray([4]))
    with self.assertRaisesRegex(TypeError, 'wgrad_scale must be a str, "128x1" or "group", got NoneType'):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 8, 4)), jnp.asarray([4]), wgrad_scale=None)
    with self.assertRaisesRegex(ValueError, 'wgrad_scale must be "128x1" or "group", got \'1x128\''):
      jgmm.fp8_gmm(jnp.ones((4, 8)), jnp.ones((1, 8, 4)), jnp.asarray([4]), wgrad_scale="1x128")


if __name__ == "__main__":
  absltest.main()
