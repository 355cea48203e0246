"""One test base for jgmm's public ops, run against every backend.

`XlaOpsTest` runs the portable implementation on whatever platform is present. `TritonOpsTest` runs the
Triton kernels: on a GPU for real, on the CPU under Triton's interpreter (TRITON_INTERPRET=1; the bridge
NaN-poisons every output before the kernel runs), where it keeps to float32 (the interpreter's bf16/fp16 dots
are wrong) and small tiles.
"""
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized
from jax.test_util import check_grads

import jgmm
from jgmm import oracle, ops

ON_GPU = jax.devices()[0].platform == "gpu"
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
TOLERANCE = {"f32": 2e-3, "bf16": 2e-2, "f16": 5e-3}
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu", "swiglu")


def group_sizes(kind, m, g, rng):
  if kind == "uniform":
    sizes = rng.multinomial(m, np.full(g, 1.0 / g))
  elif kind == "skewed":
    sizes = rng.multinomial(m, rng.dirichlet(np.full(g, 0.2)))
  elif kind == "zeros":
    sizes = rng.multinomial(m, np.where(np.arange(g) % 2, 0.0, 1.0) / ((g + 1) // 2))
  elif kind == "all_zero":
    sizes = np.zeros(g)
  elif kind == "one_hot":
    sizes = np.zeros(g)
    sizes[rng.integers(g)] = m
  elif kind == "short":  # sum < M: trailing rows belong to no group
    sizes = rng.multinomial(m // 2, np.full(g, 1.0 / g))
  elif kind == "over":  # sum > M: clipped at M
    sizes = rng.multinomial(2 * m, np.full(g, 1.0 / g))
  elif kind == "negative":
    sizes = rng.multinomial(m, np.full(g, 1.0 / g)) - rng.integers(0, 2, g) * m
  else:
    raise ValueError(kind)
  return np.asarray(sizes, np.int32)


GROUP_KINDS = ("uniform", "skewed", "zeros", "all_zero", "one_hot", "short", "over", "negative")


class OpsTestBase(seeded.SeededTestCase):
  backend = "xla"
  interpret = False

  def setUp(self):
    super().setUp()
    self.config = jgmm.Config(block_m=16, block_n=16, block_k=16, num_warps=1) if self.interpret else None

  def skip_unless_supported(self, dtype_name="f32", big=False):
    if self.interpret and (dtype_name != "f32" or big):
      self.skipTest("Triton's interpreter computes bf16/fp16 dots wrongly and is slow: float32, small shapes only")

  def normal(self, shape, dtype):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  def assert_close(self, actual, expected, dtype_name):
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, TOLERANCE[dtype_name], f"relative error {err:.3g} (seed {self.seed})")

  def check_grads(self, f, args):
    # Finite differences need exact float32 products (TF32's 1e-3 error swamps them) and a step between
    # float32 rounding (JAX's default 1e-4: 1 failure in 450 seeds, another in a local suite run) and the
    # activations' curvature (1e-2 failed swiglu on 1 seed in 60): 3e-3 passed 150 seeds of each activation.
    with jax.default_matmul_precision("float32"):
      check_grads(f, args, order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=3e-3)

  def gmm(self, lhs, rhs, sizes, **kwargs):
    """jgmm.gmm under jit; array keyword arguments are traced too."""
    return self._jit(jgmm.gmm, lhs, rhs, sizes, **kwargs)

  def tgmm(self, lhs, rhs, sizes, **kwargs):
    return self._jit(jgmm.tgmm, lhs, rhs, sizes, **kwargs)

  def _jit(self, op, *args, **kwargs):
    arrays = {key: v for key, v in kwargs.items() if hasattr(v, "shape")}
    static = {key: v for key, v in kwargs.items() if key not in arrays}
    run = lambda a, kw: op(*a, **kw, **static, config=self.config, backend=self.backend)
    return jax.jit(run)(args, arrays)

  @parameterized.product(kind=GROUP_KINDS, dtype=("f32", "bf16", "f16"), transpose_rhs=(False, True))
  def test_gmm(self, kind, dtype, transpose_rhs):
    self.skip_unless_supported(dtype)
    m, k, n, g = 80, 24, 40, 5
    sizes = group_sizes(kind, m, g, self.rng)
    lhs = self.normal((m, k), DTYPES[dtype])
    rhs = self.normal((g, n, k) if transpose_rhs else (g, k, n), DTYPES[dtype])
    out = self.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs)
    self.assertEqual(out.dtype, DTYPES[dtype])
    expected = oracle.gmm(lhs, rhs, sizes, transpose_rhs=transpose_rhs)
    self.assert_close(out, expected, dtype)
    uncovered = expected == 0
    np.testing.assert_array_equal(np.asarray(out, np.float64)[uncovered.all(axis=1)], 0.0)

  @parameterized.product(k=(1, 7, 2880), n=(1, 7, 130))
  def test_gmm_odd_sizes(self, k, n):
    self.skip_unless_supported(big=k > 100)
    m, g = 37, 3
    sizes = group_sizes("uniform", m, g, self.rng)
    lhs, rhs = self.normal((m, k), jnp.float32), self.normal((g, k, n), jnp.float32)
    self.assert_close(self.gmm(lhs, rhs, sizes), oracle.gmm(lhs, rhs, sizes), "f32")

  @parameterized.parameters(*ACTIVATIONS)
  def test_gmm_bias_activation(self, activation):
    m, k, n, g = 64, 16, 32, 4
    sizes = group_sizes("skewed", m, g, self.rng)
    lhs, rhs, bias = self.normal((m, k), jnp.float32), self.normal((g, k, n), jnp.float32), self.normal((g, n), jnp.float32)
    out = self.gmm(lhs, rhs, sizes, bias=bias, activation=activation)
    expected = oracle.gmm(lhs, rhs, sizes, bias=bias, activation_name=activation)
    self.assertEqual(out.shape, expected.shape)
    self.assert_close(out, expected, "f32")

  @parameterized.product(out_dtype=("f32", "bf16"), kind=("short", "uniform"))
  def test_gmm_existing_out_and_preferred_type(self, out_dtype, kind):
    self.skip_unless_supported(out_dtype)
    m, k, n, g = 48, 16, 24, 3
    sizes = group_sizes(kind, m, g, self.rng)
    lhs, rhs = self.normal((m, k), jnp.float32), self.normal((g, k, n), jnp.float32)
    existing = self.normal((m, n), DTYPES[out_dtype])
    out = self.gmm(lhs, rhs, sizes, preferred_element_type=DTYPES[out_dtype], existing_out=existing)
    self.assertEqual(out.dtype, DTYPES[out_dtype])
    self.assert_close(out, oracle.gmm(lhs, rhs, sizes, existing_out=existing), out_dtype)

  @parameterized.parameters(0, 2, 5, -3, 9)
  def test_gmm_group_offset(self, offset):
    m, k, n, g_total, g_local = 60, 8, 16, 7, 3
    sizes = group_sizes("uniform", m, g_total, self.rng)
    lhs, rhs = self.normal((m, k), jnp.float32), self.normal((g_local, k, n), jnp.float32)
    out = self.gmm(lhs, rhs, sizes, group_offset=jnp.int32(offset))
    self.assert_close(out, oracle.gmm(lhs, rhs, sizes, group_offset=offset), "f32")

  def test_gmm_empty_and_single_group(self):
    lhs, rhs = self.normal((0, 8), jnp.float32), self.normal((2, 8, 4), jnp.float32)
    self.assertEqual(self.gmm(lhs, rhs, np.zeros(2, np.int32)).shape, (0, 4))
    lhs, rhs = self.normal((19, 8), jnp.float32), self.normal((1, 8, 4), jnp.float32)
    sizes = np.array([19], np.int32)
    self.assert_close(self.gmm(lhs, rhs, sizes), oracle.gmm(lhs, rhs, sizes), "f32")

  @parameterized.product(kind=GROUP_KINDS, transpose_lhs=(False, True), dtype=("f32", "bf16"))
  def test_tgmm(self, kind, transpose_lhs, dtype):
    self.skip_unless_supported(dtype)
    m, k, n, g = 70, 12, 20, 5
    sizes = group_sizes(kind, m, g, self.rng)
    lhs = self.normal((m, k) if transpose_lhs else (k, m), DTYPES[dtype])
    rhs = self.normal((m, n), DTYPES[dtype])
    # rhs (M, N) as given, and as (N, M) with transpose_rhs: the same product.
    out_t, dbias_t = self.tgmm(lhs, rhs.T, sizes, transpose_lhs=transpose_lhs, transpose_rhs=True, bias_grad=True)
    out, dbias = self.tgmm(lhs, rhs, sizes, transpose_lhs=transpose_lhs, bias_grad=True)
    np.testing.assert_array_equal(np.asarray(out_t, np.float32), np.asarray(out, np.float32))
    # The same sums, in float32 within rounding: XLA may add a transposed operand's rows in another order (jax
    # 0.12 on the GPU: a few ulps apart).
    self.assertLess(oracle.rel_err(dbias_t, dbias), 1e-5)
    expected, expected_dbias = oracle.tgmm(lhs, rhs, sizes, transpose_lhs=transpose_lhs)
    self.assertEqual(dbias.dtype, jnp.float32)
    self.assert_close(out, expected, dtype)
    self.assert_close(dbias, expected_dbias, "f32")
    for g, (start, end) in enumerate(oracle.row_ranges(sizes, m)):
      if start == end:
        np.testing.assert_array_equal(np.asarray(out[g], np.float64), 0.0)

  @parameterized.parameters(0, 3, 6)
  def test_tgmm_offset_and_existing_out(self, offset):
    m, k, n, g_total, g_local = 50, 8, 12, 8, 3
    sizes = group_sizes("uniform", m, g_total, self.rng)
    lhs, rhs = self.normal((k, m), jnp.float32), self.normal((m, n), jnp.float32)
    existing = self.normal((g_local, k, n), jnp.float32)
    out = self.tgmm(lhs, rhs, sizes, group_offset=offset, num_actual_groups=g_local, existing_out=existing)
    expected, _ = oracle.tgmm(lhs, rhs, sizes, group_offset=offset, num_actual_groups=g_local,
                              existing_out=existing)
    self.assert_close(out, expected, "f32")

  @parameterized.product(dtype=("f32", "bf16"), pattern=("mixed", "full", "none"))
  def test_masked_gmm(self, dtype, pattern):
    self.skip_unless_supported(dtype)
    g, max_m, k, n = 4, 24, 16, 20
    masked_m = {"mixed": np.array([5, 0, 24, -2]), "full": np.full(g, 99), "none": np.zeros(g)}[pattern]
    x, w = self.normal((g, max_m, k), DTYPES[dtype]), self.normal((g, n, k), DTYPES[dtype])
    out = jax.jit(lambda *a: jgmm.masked_gmm(*a, expected_m=8, config=self.config, backend=self.backend))(
        x, w, jnp.asarray(masked_m, jnp.int32))
    expected = oracle.masked_gmm(x, w, masked_m)
    if pattern != "none":
      self.assert_close(out, expected, dtype)
    np.testing.assert_array_equal(np.asarray(out, np.float64)[expected == 0], 0.0)

  @parameterized.parameters(None, "silu", "swiglu")
  def test_gmm_grads(self, activation):
    m, k, n, g = 24, 8, 12, 3
    sizes = group_sizes("skewed", m, g, self.rng)
    lhs, rhs, bias = self.normal((m, k), jnp.float32), self.normal((g, k, n), jnp.float32), self.normal((g, n), jnp.float32)
    f = lambda x, w, b: jgmm.gmm(x, w, sizes, bias=b, activation=activation, config=self.config, backend=self.backend)
    self.check_grads(f, (lhs, rhs, bias))

  def test_gmm_grads_transposed_with_existing(self):
    m, k, n, g = 24, 8, 12, 3
    sizes = group_sizes("short", m, g, self.rng)
    lhs, rhs = self.normal((m, k), jnp.float32), self.normal((g, n, k), jnp.float32)
    bias, existing = self.normal((g, n), jnp.float32), self.normal((m, n), jnp.float32)
    f = lambda x, w, b, e: jgmm.gmm(x, w, sizes, bias=b, transpose_rhs=True, existing_out=e,
                                     config=self.config, backend=self.backend)
    self.check_grads(f, (lhs, rhs, bias, existing))

  @parameterized.product(transpose_lhs=(False, True), transpose_rhs=(False, True))
  def test_tgmm_grads(self, transpose_lhs, transpose_rhs):
    m, k, n, g = 24, 8, 12, 3
    sizes = group_sizes("zeros", m, g, self.rng)
    lhs = self.normal((m, k) if transpose_lhs else (k, m), jnp.float32)
    rhs = self.normal((n, m) if transpose_rhs else (m, n), jnp.float32)
    f = lambda x, y: jgmm.tgmm(x, y, sizes, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                               bias_grad=True, config=self.config, backend=self.backend)
    self.check_grads(f, (lhs, rhs))

  def test_masked_gmm_grads(self):
    x, w = self.normal((3, 8, 6), jnp.float32), self.normal((3, 5, 6), jnp.float32)
    masked_m = jnp.array([3, 0, 8], jnp.int32)
    f = lambda a, b: jgmm.masked_gmm(a, b, masked_m, config=self.config, backend=self.backend)
    self.check_grads(f, (x, w))

  def test_vmap(self):
    b, m, k, n, g = 3, 20, 8, 12, 3
    lhs, rhs = self.normal((b, m, k), jnp.float32), self.normal((g, k, n), jnp.float32)
    sizes = np.stack([group_sizes("uniform", m, g, self.rng) for _ in range(b)])
    out = jax.vmap(lambda x, s: jgmm.gmm(x, rhs, s, config=self.config, backend=self.backend))(lhs, sizes)
    for i in range(b):
      self.assert_close(out[i], oracle.gmm(lhs[i], rhs, sizes[i]), "f32")

  def test_ragged_dot_drop_in(self):
    self.skip_unless_supported()
    m, k, n, g = 40, 16, 24, 4
    sizes = group_sizes("uniform", m, g, self.rng)
    lhs, rhs = self.normal((m, k), jnp.float32), self.normal((g, k, n), jnp.float32)
    expected = jax.lax.ragged_dot(lhs, rhs, jnp.asarray(sizes), precision=jax.lax.Precision.HIGHEST)
    self.assert_close(jax.jit(jgmm.ragged_dot)(lhs, rhs, sizes), expected, "f32")


class XlaOpsTest(OpsTestBase):
  backend = "xla"


class TritonOpsTest(OpsTestBase):
  backend = "triton"
  interpret = not ON_GPU

  def setUp(self):
    if self.interpret:
      self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    super().setUp()


class GroupBoundsTest(seeded.SeededTestCase):
  """ops.group_bounds against int64 prefix sums: by a cumsum where G * M < 2^31, by a scan clipped at M past it
  (every group full there overflows an int32 cumsum)."""

  @parameterized.product(m=(1000, 2**29), kind=("random", "full", "huge", "negative"), offset=(None, 3))
  def test_group_bounds(self, m, kind, offset):
    total, g = 12, 8
    sizes = {"random": self.rng.integers(0, 2 * m // total, total), "full": np.full(total, m),
             "huge": self.rng.integers(2**31, 2**32, total), "negative": self.rng.integers(-m, m, total)}[kind]
    sizes = np.asarray(sizes, np.int32 if kind == "negative" else np.uint32)
    ends = np.minimum(np.cumsum(np.clip(sizes.astype(np.int64), 0, m)), m)
    edges = np.concatenate([[0], ends, np.full(g, ends[-1])])
    first, count = (offset, g) if offset else (0, total)
    bounds = jax.jit(lambda s: ops.group_bounds(s, offset, count, m))(jnp.asarray(sizes))
    np.testing.assert_array_equal(bounds, edges[first:first + count + 1])
    self.assertEqual(bounds.dtype, jnp.int32)


del OpsTestBase  # Run only through the backend subclasses.

if __name__ == "__main__":
  absltest.main()
