"""Every transformation jax.lax.ragged_dot supports, on jgmm's ops, compared with lax itself.

Forward mode (jvp, jacfwd, linearize), second order (grad of grad, Hessian-vector products), jax.export with
symbolic M, K and N, and the drop-in contract of jgmm.ragged_dot: the same calls run through jax.lax.ragged_dot
and jgmm.ragged_dot and must agree in dtype and value. Group sizes of every integer dtype lax accepts are
widened before they are clipped (a narrow dtype once wrapped the clip bound M). Each test draws fresh data.

`XlaTransformsTest` runs the portable backend; `TritonTransformsTest` the Triton kernels (on the CPU under the
interpreter, float32 and small tiles). GPU-only: precision=HIGHEST gives exact float32 products.
"""
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized
from jax import export, lax
from jax.test_util import check_grads

import jgmm
from jgmm import oracle

ON_GPU = jax.devices()[0].platform == "gpu"
# Exported calls run the portable path (exact float32) and direct calls the default one: TF32 kernels on a GPU.
EXACT_VS_DEFAULT = 5e-3 if ON_GPU else 1e-5
PLATFORM = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())  # jax.export's name for this one
HIGHEST = lax.Precision.HIGHEST
INT_DTYPES = (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)


def dense_ragged_dot(x, w, sizes):
  """ragged_dot as a dense G-fold product in plain jnp, for derivatives lax.ragged_dot lacks (its grad of grad
  with respect to rhs raises NotImplementedError)."""
  ends = jnp.cumsum(sizes)
  rows = jnp.arange(x.shape[0])[:, None]
  in_group = ((rows >= ends - sizes) & (rows < ends)).astype(x.dtype)  # (M, G)
  return jnp.einsum("mg,mk,gkn->mn", in_group, x, w, precision=HIGHEST)


class TransformsTestBase(seeded.SeededTestCase):
  backend = "xla"
  interpret = False

  def setUp(self):
    super().setUp()
    self.config = jgmm.Config(block_m=16, block_n=16, block_k=16, num_warps=1) if self.interpret else None
    self.ops = dict(config=self.config, backend=self.backend)

  def normal(self, *shape, dtype=jnp.float32):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  def sizes(self, m, g):
    sizes = self.rng.multinomial(m, self.rng.dirichlet(np.ones(g)))
    sizes[self.rng.integers(g)] = 0  # an empty group
    return jnp.asarray(sizes, jnp.int32)

  def assert_close(self, actual, expected, tol=2e-4):
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, tol, f"relative error {err:.3g} (seed {self.seed})")

  def check_grads(self, f, args, order, modes):
    with jax.default_matmul_precision("float32"):
      check_grads(f, args, order=order, modes=modes, atol=2e-2, rtol=2e-2, eps=3e-3)

  # Forward mode and second order, each op with every operand differentiated.

  @parameterized.parameters(None, "gelu", "swiglu")
  def test_gmm_forward_mode_and_second_order(self, activation):
    m, k, n, g = 20, 8, 12, 3
    sizes = self.sizes(m, g)
    out_n = n // 2 if activation == "swiglu" else n
    args = (self.normal(m, k), self.normal(g, k, n), self.normal(g, n), self.normal(m, out_n))
    f = lambda x, w, b, e: jgmm.gmm(x, w, sizes, bias=b, existing_out=e, activation=activation, **self.ops)
    self.check_grads(f, args, order=2, modes=("fwd", "rev"))

  def test_gmm_transposed_with_offset_second_order(self):
    m, k, n, g_total, g = 24, 8, 12, 5, 2
    sizes = self.sizes(m, g_total)
    args = (self.normal(m, k), self.normal(g, n, k))
    f = lambda x, w: jgmm.gmm(x, w, sizes, transpose_rhs=True, group_offset=jnp.int32(2), **self.ops)
    self.check_grads(f, args, order=2, modes=("fwd", "rev"))

  @parameterized.parameters(False, True)
  def test_tgmm_forward_mode_and_second_order(self, transpose_lhs):
    m, k, n, g = 20, 6, 10, 3
    sizes = self.sizes(m, g)
    args = (self.normal(*((m, k) if transpose_lhs else (k, m))), self.normal(m, n), self.normal(g, k, n))
    f = lambda x, y, e: jgmm.tgmm(x, y, sizes, transpose_lhs=transpose_lhs, existing_out=e, bias_grad=True,
                                  **self.ops)
    self.check_grads(f, args, order=2, modes=("fwd", "rev"))

  def test_masked_gmm_forward_mode_and_second_order(self):
    masked_m = jnp.asarray([5, 0, 8], jnp.int32)
    f = lambda x, w: jgmm.masked_gmm(x, w, masked_m, **self.ops)
    self.check_grads(f, (self.normal(3, 8, 6), self.normal(3, 5, 6)), order=2, modes=("fwd", "rev"))

  def test_jacobians_linearize_hvp_and_hessian(self):
    if self.interpret:
      self.skipTest("the interpreter runs each of the vmapped kernel calls in turn (30 s); the GPU runs this")
    m, k, n, g = 9, 4, 3, 3
    sizes = self.sizes(m, g)
    x, w = self.normal(m, k), self.normal(g, k, n)
    ours = lambda x, w: jgmm.gmm(x, w, sizes, precision=HIGHEST, **self.ops)
    ref = lambda x, w: lax.ragged_dot(x, w, sizes, precision=HIGHEST)
    dense = lambda x, w: dense_ragged_dot(x, w, sizes)
    for transform in (jax.jacfwd, jax.jacrev):  # lax.ragged_dot's batching rule refuses some of these
      for argnums in (0, 1):
        self.assert_close(transform(ours, argnums)(x, w), transform(dense, argnums)(x, w))
    tx, tw = self.normal(m, k), self.normal(g, k, n)
    out, linear = jax.linearize(ours, x, w)
    self.assert_close(out, ref(x, w))
    self.assert_close(linear(tx, tw), jax.jvp(ref, (x, w), (tx, tw))[1])
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
    hvp = lambda f: jax.jvp(jax.grad(loss(f), argnums=(0, 1)), (x, w), (tx, tw))[1]
    for ours_part, ref_part in zip(hvp(ours), hvp(ref)):
      self.assert_close(ours_part, ref_part)
    hessian = lambda f: jax.hessian(loss(f), argnums=(0, 1))(x, w)
    for ours_part, ref_part in zip(jax.tree.leaves(hessian(ours)), jax.tree.leaves(hessian(dense))):
      self.assert_close(ours_part, ref_part)

  def test_grad_of_grad_matches_a_dense_reference(self):
    m, k, n, g = 16, 6, 5, 4
    sizes = self.sizes(m, g)
    x, w = self.normal(m, k), self.normal(g, k, n)
    inner = lambda f: lambda x, w: jnp.sum(jnp.tanh(f(x, w)))
    outer = lambda f: lambda x, w: jnp.sum(jax.grad(inner(f), argnums=(0, 1))(x, w)[1] ** 2)
    ours = lambda x, w: jgmm.gmm(x, w, sizes, precision=HIGHEST, **self.ops)
    ref = lambda x, w: dense_ragged_dot(x, w, sizes)
    for got, want in zip(jax.grad(outer(ours), argnums=(0, 1))(x, w), jax.grad(outer(ref), argnums=(0, 1))(x, w)):
      self.assert_close(got, want)


class XlaTransformsTest(TransformsTestBase):
  backend = "xla"

  # jax.export: symbolic M, K and N lower through the portable implementation on every platform.

  @parameterized.parameters("cpu", "cuda")
  def test_export_with_symbolic_m_k_n(self, platform):  # run where exported for this platform
    g = 3
    m, k, n = export.symbolic_shape("m, k, n")
    specs = (jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((g, k, n), jnp.float32),
             jax.ShapeDtypeStruct((g,), jnp.int32))
    fns = {"ragged_dot": jgmm.ragged_dot, "gmm_swiglu_bias": lambda x, w, s: jgmm.gmm(
        x, jnp.concatenate([w, w], axis=2), s, activation="swiglu", bias=jnp.ones((g, 2 * w.shape[2]))),
           "tgmm": lambda x, w, s: jgmm.tgmm(x, jgmm.gmm(x, w, s), s, transpose_lhs=True)}
    for fn in fns.values():
      exported = export.export(jax.jit(fn), platforms=(platform,))(*specs)
      if platform != PLATFORM:
        continue
      for shape in ((11, 4, 5), (40, 7, 2)):
        x, w = self.normal(shape[0], shape[1]), self.normal(g, shape[1], shape[2])
        sizes = self.sizes(shape[0], g)
        self.assert_close(exported.call(x, w, sizes), fn(x, w, sizes), tol=EXACT_VS_DEFAULT)

  def test_export_gradient_with_symbolic_m(self):
    (m,) = export.symbolic_shape("m")
    loss = lambda x, w, s: jnp.sum(jgmm.gmm(x, w, s, activation="silu") ** 2)
    specs = (jax.ShapeDtypeStruct((m, 6), jnp.float32), jax.ShapeDtypeStruct((3, 6, 4), jnp.float32),
             jax.ShapeDtypeStruct((3,), jnp.int32))
    exported = export.export(jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=(PLATFORM,))(*specs)
    x, w, sizes = self.normal(13, 6), self.normal(3, 6, 4), self.sizes(13, 3)
    for got, want in zip(exported.call(x, w, sizes), jax.grad(loss, argnums=(0, 1))(x, w, sizes)):
      self.assert_close(got, want, tol=EXACT_VS_DEFAULT)

  def test_export_of_a_sharded_call(self):
    """jax.export of a call partitioned over 8 devices (a custom_partitioning call is not exportable: the export
    lowering leaves the op to the SPMD partitioner)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))
    rows, replicated = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)) for spec in (("d",), ()))
    fn = jax.jit(lambda x, w, s: jgmm.gmm(x, w, s, activation="silu"), in_shardings=(rows, replicated, replicated))
    x, w, sizes = self.normal(64, 8), self.normal(3, 8, 5), self.sizes(64, 3)
    exported = export.export(fn)(x, w, sizes)
    self.assertEqual(exported.nr_devices, mesh.size)
    got = exported.call(jax.device_put(x, rows), w, sizes)
    self.assert_close(got, oracle.gmm(x, w, np.asarray(sizes), activation_name="silu"), tol=1e-5)

  def test_export_needs_a_static_group_count(self):
    (g,) = export.symbolic_shape("g")
    specs = (jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((g, 4, 5), jnp.float32),
             jax.ShapeDtypeStruct((g,), jnp.int32))
    with self.assertRaisesRegex(ValueError, "rhs must have a static group count"):
      export.export(jax.jit(jgmm.gmm))(*specs)

  def test_symbolic_shapes_refuse_an_explicit_triton_backend(self):
    (m,) = export.symbolic_shape("m")
    specs = (jax.ShapeDtypeStruct((m, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4, 5), jnp.float32),
             jax.ShapeDtypeStruct((2,), jnp.int32))
    fn = jax.jit(lambda x, w, s: jgmm.gmm(x, w, s, backend="triton"))
    with self.assertRaisesRegex(ValueError, "backend='triton' needs static shapes"):
      export.export(fn, platforms=("cuda",))(*specs)

  # The drop-in contract: the same call through lax and jgmm.

  @parameterized.parameters(
      ("float32", "float32", None, None), ("bfloat16", "float32", None, None),
      ("float16", "bfloat16", None, None), ("bfloat16", "bfloat16", "float32", None),
      ("float32", "float32", "bfloat16", HIGHEST), ("float32", "float32", None, "highest"),
      ("float32", "float32", None, (HIGHEST, lax.Precision.DEFAULT)), ("int32", "int32", None, None), ("float32", "float32", "int32", None),
      ("int8", "bfloat16", None, None))
  def test_ragged_dot_matches_lax(self, lhs_dtype, rhs_dtype, preferred, precision):
    m, k, n, g = 21, 6, 7, 4
    sizes = self.sizes(m, g)
    x = jnp.asarray(self.rng.integers(-3, 4, (m, k)), lhs_dtype)
    w = jnp.asarray(self.rng.integers(-3, 4, (g, k, n)), rhs_dtype)
    kwargs = dict(precision=precision, preferred_element_type=preferred)
    want = lax.ragged_dot(x, w, sizes, **kwargs)
    for fn in (jgmm.ragged_dot, jax.jit(jgmm.ragged_dot, static_argnames=("precision", "preferred_element_type"))):
      got = fn(x, w, sizes, **kwargs)
      self.assertEqual(got.dtype, want.dtype)
      self.assertEqual(got.shape, want.shape)
      np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))  # small integers

  def test_ragged_dot_takes_numpy_and_float64_as_lax_does(self):
    m, k, n, g = 10, 3, 4, 2
    x, w = self.rng.standard_normal((m, k)), self.rng.standard_normal((g, k, n))
    sizes = np.array([4, 6], np.int64)
    want = lax.ragged_dot(x, w, sizes, precision=HIGHEST)
    got = jgmm.ragged_dot(x, w, sizes, precision=HIGHEST)
    self.assertEqual(got.dtype, want.dtype)
    self.assert_close(got, want, tol=1e-6)
    with self.assertRaises(TypeError):
      jgmm.ragged_dot(x.tolist(), w, sizes)

  def test_ragged_dot_group_offset_beyond_lax(self):
    m, k, n = 30, 5, 6
    sizes = self.sizes(m, 6)
    x, w = self.normal(m, k), self.normal(2, k, n)
    got = jgmm.ragged_dot(x, w, sizes, group_offset=jnp.array([3], jnp.int32))
    self.assert_close(got, oracle.gmm(x, w, np.asarray(sizes), group_offset=3), tol=2e-3)

  def test_ragged_dot_signature_matches_lax(self):
    import inspect
    ours = inspect.signature(jgmm.ragged_dot).parameters
    for name, param in inspect.signature(lax.ragged_dot).parameters.items():
      self.assertIn(name, ours)
      self.assertEqual(ours[name].default, param.default, name)
      self.assertEqual(ours[name].kind, param.kind, name)

  # Integer dtypes of group sizes and masked_m: widened before clipping, never wrapped.

  @parameterized.parameters(*INT_DTYPES)
  def test_group_sizes_of_every_integer_dtype(self, dtype):
    m, k, n = 265, 4, 3
    values = np.array([2, 14, 10, 53, 40, 8, 8])
    x, w = self.normal(m, k), self.normal(len(values), k, n)
    got = jax.jit(lambda s: jgmm.gmm(x, w, s, **self.ops))(jnp.asarray(values.astype(dtype)))
    self.assert_close(got, oracle.gmm(x, w, values), tol=1e-5)
    dw = jgmm.tgmm(x, self.normal(m, n), jnp.asarray(values.astype(dtype)), transpose_lhs=True, **self.ops)
    self.assertEqual(dw.shape, (len(values), k, n))

  def test_wide_group_sizes_saturate(self):
    m, k, n = 40, 4, 3
    x, w = self.normal(m, k), self.normal(3, k, n)
    sizes = jnp.asarray(np.array([2**32 - 1, 5, 2**31 + 7], np.uint32))
    self.assert_close(jgmm.gmm(x, w, sizes, **self.ops), oracle.gmm(x, w, np.array([m, 0, 0])), tol=1e-5)
    offset = jnp.asarray(np.uint32(2**32 - 2))  # past every group: nothing computed
    out = jgmm.gmm(x, w[:1], jnp.asarray([m, 0, 0], jnp.int8), group_offset=offset, **self.ops)
    np.testing.assert_array_equal(np.asarray(out), 0.0)

  @parameterized.parameters(np.int8, np.uint8, np.int16)
  def test_masked_m_of_narrow_dtypes(self, dtype):
    g, max_m, k, n = 2, 200, 4, 3
    masked_m = np.array([100, 7]).astype(dtype)
    x, w = self.normal(g, max_m, k), self.normal(g, n, k)
    got = jgmm.masked_gmm(x, w, jnp.asarray(masked_m), **self.ops)
    self.assert_close(got, oracle.masked_gmm(x, w, masked_m.astype(np.int64)), tol=1e-5)


class TritonTransformsTest(TransformsTestBase):
  backend = "triton"
  interpret = not ON_GPU

  def setUp(self):
    if self.interpret:
      self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    super().setUp()

  @absltest.skipUnless(ON_GPU, "exact float32 products on the GPU's kernels")
  def test_precision_highest_is_exact_float32(self):
    m, k, n, g = 256, 1024, 256, 4
    sizes = self.sizes(m, g)
    x, w = self.normal(m, k) * 1e3 + 1, self.normal(g, k, n) + 1
    expected = oracle.gmm(x, w, np.asarray(sizes))
    exact = jax.jit(lambda a, b: jgmm.ragged_dot(a, b, sizes, precision=HIGHEST))(x, w)
    tf32 = jax.jit(lambda a, b: jgmm.ragged_dot(a, b, sizes))(x, w)
    self.assertLess(oracle.rel_err(exact, expected), 1e-5)
    self.assertGreater(oracle.rel_err(tf32, expected), 1e-5)
    # The backward kernels keep the precision: d x = 2 out @ w[g]^T.
    dx = jax.jit(jax.grad(lambda a: jnp.sum(jgmm.ragged_dot(a, w, sizes, precision=HIGHEST) ** 2)))(x)
    self.assertLess(oracle.rel_err(dx, oracle.gmm(2 * expected, w, np.asarray(sizes), transpose_rhs=True)), 1e-5)


del TransformsTestBase  # Run only through the backend subclasses.

if __name__ == "__main__":
  absltest.main()
