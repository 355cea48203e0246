"""jgmm.grouped_matmul (independent products of different sizes) against a float64 numpy oracle.

CPU: the XLA backend (all dtypes, jit/grad/jvp/vmap, bad input); the Triton kernel under TRITON_INTERPRET=1
(float32: the interpreter's 16-bit dots are wrong) through jgmm.ffi, which NaN-poisons every output buffer, so
an element the kernel forgets to write fails the check; cross-lowering for sm_90 (JGMM_TARGET=cuda:90): one
custom call per grouped product, forward and backward, with 16-byte pipelined loads.
GPU (skipped without one): bf16/fp16/fp32 at the default tiles, odd and large shapes, 64 problems, grad.
"""
import importlib
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from test_triton_kernels import GPU_TOLERANCE, KernelTestBase

import jgmm
from jgmm import oracle
from jgmm.config import Config
from jgmm.ffi import _compile
from jgmm.triton_kernels import grouped_matmul as kernels  # noqa: F401  (imported as @triton.jit, not under
# TRITON_INTERPRET=1 by the first interpreted test: its helpers would stay interpreted and fail to compile)

gm = importlib.import_module("jgmm.grouped_matmul")  # the module (jgmm.grouped_matmul is the function)
ON_GPU = any(d.platform == "gpu" for d in jax.devices())
SMALL = Config(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
TOLERANCE = {"f32": 5e-3 if ON_GPU else 2e-3, "bf16": 2e-2, "f16": 5e-3}  # GPU: TF32 on K <= 8 products
# (M, N, K) differing in each of M, N and K, with empty problems (M, N or K = 0: zeros).
MIXED = ((5, 7, 3), (17, 33, 20), (1, 1, 1), (40, 9, 50), (0, 3, 4), (3, 0, 2), (4, 5, 0), (16, 16, 16))


def product_oracle(a, b, transpose_rhs):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return a @ (b.T if transpose_rhs else b)


class Base(KernelTestBase):  # a fresh seed per test (in failure messages), self.normal

  def problems(self, shapes, transpose_rhs, dtype=jnp.float32):
    lhs = [self.normal((m, k), dtype) for m, n, k in shapes]
    rhs = [self.normal((n, k) if transpose_rhs else (k, n), dtype) for m, n, k in shapes]
    return lhs, rhs

  def assert_products(self, outs, lhs, rhs, transpose_rhs, tol, out_dtype=None):
    self.assertLen(outs, len(lhs))
    for i, (out, a, b) in enumerate(zip(outs, lhs, rhs)):
      want = product_oracle(a, b, transpose_rhs)
      self.assertEqual(out.shape, want.shape, f"problem {i}")
      if out_dtype is not None:
        self.assertEqual(out.dtype, out_dtype, f"problem {i}")
      if want.size:
        self.assertLess(oracle.rel_err(np.asarray(out, np.float32), want), tol, f"problem {i}, seed {self.seed}")

  def check_grads(self, fn, lhs, rhs, transpose_rhs, tol):
    """grad of sum_i <out_i, w_i> against dA_i = w_i B_i^T, dB_i = A_i^T w_i (float64)."""
    weights = [self.normal(product_oracle(a, b, transpose_rhs).shape) for a, b in zip(lhs, rhs)]
    loss = lambda l, r: sum(jnp.vdot(o.astype(jnp.float32), w) for o, w in zip(fn(l, r), weights))
    dlhs, drhs = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
    for i, (a, b, w, da, db) in enumerate(zip(lhs, rhs, weights, dlhs, drhs)):
      a64, b64, w64 = (np.asarray(x, np.float64) for x in (a, b, w))
      b_kn = b64.T if transpose_rhs else b64
      want_db = a64.T @ w64
      for name, got, want in (("dlhs", da, w64 @ b_kn.T), ("drhs", db, want_db.T if transpose_rhs else want_db)):
        self.assertEqual(got.shape, want.shape, f"{name}[{i}]")
        if want.size:
          self.assertLess(oracle.rel_err(np.asarray(got, np.float32), want), tol, f"{name}[{i}], seed {self.seed}")


# ---------------------------------------------------------------------------------------------------------------
# The XLA backend: semantics, autodiff, batching, errors


class XlaTest(Base):

  @parameterized.product(dtype=("f32", "bf16", "f16"), transpose_rhs=(False, True))
  def test_mixed_shapes(self, dtype, transpose_rhs):
    lhs, rhs = self.problems(MIXED, transpose_rhs, DTYPES[dtype])
    outs = jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs, backend="xla"))(lhs, rhs)
    self.assert_products(outs, lhs, rhs, transpose_rhs, TOLERANCE[dtype], DTYPES[dtype])
    self.assertTrue(all(not np.asarray(o).any() for o, (m, n, k) in zip(outs, MIXED) if k == 0))

  def test_preferred_element_type(self):
    lhs, rhs = self.problems(MIXED[:4], False, jnp.bfloat16)
    outs = jgmm.grouped_matmul(lhs, rhs, preferred_element_type=jnp.float32)
    self.assert_products(outs, lhs, rhs, False, 1e-5, jnp.float32)

  @parameterized.parameters(1, 64)
  def test_problem_counts(self, count):
    shapes = [tuple(int(x) for x in self.rng.integers(1, 9, 3)) for _ in range(count)]
    lhs, rhs = self.problems(shapes, False)
    self.assert_products(jgmm.grouped_matmul(lhs, rhs), lhs, rhs, False, TOLERANCE["f32"])

  @parameterized.parameters(False, True)
  def test_grad(self, transpose_rhs):
    lhs, rhs = self.problems(MIXED, transpose_rhs)
    self.check_grads(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs), lhs, rhs, transpose_rhs,
                     TOLERANCE["f32"])

  def test_grad_of_lhs_only_and_bf16_with_float32_output(self):
    lhs, rhs = self.problems(MIXED[:4], False, jnp.bfloat16)
    f = lambda l: sum(jnp.sum(o) for o in jgmm.grouped_matmul(l, rhs, preferred_element_type=jnp.float32))
    grads = jax.grad(f)(lhs)
    for g, a, b in zip(grads, lhs, rhs):
      self.assertEqual(g.dtype, jnp.bfloat16)
      want = np.ones((a.shape[0], b.shape[1])) @ np.asarray(b, np.float64).T
      self.assertLess(oracle.rel_err(np.asarray(g, np.float32), want), TOLERANCE["bf16"])

  def test_jvp(self):
    lhs, rhs = self.problems(MIXED, False)
    dlhs, drhs = self.problems(MIXED, False)
    outs, tangents = jax.jvp(jgmm.grouped_matmul, (lhs, rhs), (dlhs, drhs))
    self.assert_products(outs, lhs, rhs, False, TOLERANCE["f32"])
    for t, a, b, da, db in zip(tangents, lhs, rhs, dlhs, drhs):
      want = product_oracle(da, b, False) + product_oracle(a, db, False)
      if want.size:
        self.assertLess(oracle.rel_err(np.asarray(t), want), TOLERANCE["f32"])

  def test_vmap_over_lhs_folds_into_m(self):
    shapes = MIXED[:4]
    lhs = [self.normal((3, m, k)) for m, n, k in shapes]
    rhs = [self.normal((k, n)) for m, n, k in shapes]
    outs = jax.vmap(jgmm.grouped_matmul, in_axes=(0, None))(lhs, rhs)
    for j in range(3):
      self.assert_products([o[j] for o in outs], [a[j] for a in lhs], rhs, False, TOLERANCE["f32"])
    jaxpr = str(jax.make_jaxpr(jax.vmap(jgmm.grouped_matmul, in_axes=(0, None)))(lhs, rhs))
    self.assertEqual(jaxpr.count("jgmm_grouped_matmul"), 1)
    self.assertNotIn("while", jaxpr)

  def test_vmap_over_both(self):
    shapes = MIXED[:3]
    lhs = [self.normal((m, 2, k)) for m, n, k in shapes]
    rhs = [self.normal((2, n, k)) for m, n, k in shapes]
    outs = jax.vmap(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=True), in_axes=(1, 0))(lhs, rhs)
    for j in range(2):
      self.assert_products([o[j] for o in outs], [a[:, j] for a in lhs], [b[j] for b in rhs], True, TOLERANCE["f32"])

  def test_bad_input(self):
    a, b = self.normal((4, 8)), self.normal((8, 5))
    cases = [
        ((a, [b]), TypeError, "lhs_list must be a list"),
        (([], []), ValueError, "lhs_list must hold at least one problem"),
        (([a, a], [b]), ValueError, r"rhs_list must hold one array per lhs array \(2\), got 1"),
        (([a[0]], [b]), ValueError, r"lhs_list\[0\] must be 2-D \(M_i, K_i\), got shape \(8,\)"),
        (([a], [b[None]]), ValueError, r"rhs_list\[0\] must be 2-D \(K_i, N_i\), got shape \(1, 8, 5\)"),
        (([a, a], [b, self.normal((7, 5))]), ValueError, r"rhs_list\[1\] must have K_i = 8 .* got shape \(7, 5\)"),
        (([a, a.astype(jnp.bfloat16)], [b, b]), TypeError, r"lhs_list\[1\] must have the dtype of lhs_list\[0\]"),
        (([a], [b.astype(jnp.float16)]), TypeError, r"rhs_list\[0\] must have the dtype of lhs_list\[0\]"),
        (([a.astype(jnp.int32)], [b.astype(jnp.int32)]), TypeError, r"lhs_list\[0\] must have dtype float32"),
    ]
    for args, error, message in cases:
      with self.assertRaisesRegex(error, message):
        jgmm.grouped_matmul(*args)
    with self.assertRaisesRegex(ValueError, r"rhs_list\[0\] must have K_i = 8 .* layout \(N_i, K_i\)"):
      jgmm.grouped_matmul([a], [b], transpose_rhs=True)
    with self.assertRaisesRegex(TypeError, "transpose_rhs must be a Python bool"):
      jgmm.grouped_matmul([a], [b], transpose_rhs=1)
    with self.assertRaisesRegex(ValueError, "backend must be"):
      jgmm.grouped_matmul([a], [b], backend="cuda")


# ---------------------------------------------------------------------------------------------------------------
# CPU: the kernel under Triton's interpreter


@absltest.skipIf(ON_GPU, "on a GPU the kernel runs for real (GpuTest)")
class InterpretedTest(Base):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    os.environ.pop("JGMM_TARGET", None)

  def run_triton(self, lhs, rhs, transpose_rhs, config=SMALL):
    return jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs, config=config,
                                                    backend="triton"))(lhs, rhs)

  @parameterized.parameters(False, True)
  def test_mixed_shapes(self, transpose_rhs):
    lhs, rhs = self.problems(MIXED, transpose_rhs)
    outs = self.run_triton(lhs, rhs, transpose_rhs)
    self.assert_products(outs, lhs, rhs, transpose_rhs, 1e-4)
    self.assertTrue(all(not np.asarray(o).any() for o, (m, n, k) in zip(outs, MIXED) if k == 0))

  def test_one_problem_of_several_tiles_and_a_tiny_one(self):
    for shapes in ([(50, 40, 37)], [(1, 1, 1)]):
      lhs, rhs = self.problems(shapes, False)
      self.assert_products(self.run_triton(lhs, rhs, False), lhs, rhs, False, 1e-4)

  def test_64_problems(self):
    shapes = [tuple(int(x) for x in self.rng.integers(1, 12, 3)) for _ in range(64)]
    lhs, rhs = self.problems(shapes, False)
    self.assert_products(self.run_triton(lhs, rhs, False), lhs, rhs, False, 1e-4)

  def test_more_problems_than_one_launch_takes(self):
    shapes = [(3, 5, 2), (0, 2, 2), (7, 2, 9), (2, 2, 2), (9, 17, 3)]
    lhs, rhs = self.problems(shapes, True)
    with mock.patch.object(gm, "MAX_PROBLEMS_PER_LAUNCH", 2):
      outs = self.run_triton(lhs, rhs, True)
    self.assert_products(outs, lhs, rhs, True, 1e-4)

  @parameterized.parameters(False, True)
  def test_grad(self, transpose_rhs):
    """Backward calls: transpose_lhs (dB) and both rhs layouts (dA), through the kernel."""
    lhs, rhs = self.problems(MIXED, transpose_rhs)
    fn = lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs, config=SMALL, backend="triton")
    self.check_grads(fn, lhs, rhs, transpose_rhs, 1e-4)

  def test_default_config(self):
    lhs, rhs = self.problems([(20, 24, 9), (3, 40, 30)], False)
    self.assert_products(self.run_triton(lhs, rhs, False, config=None), lhs, rhs, False, 1e-4)


# ---------------------------------------------------------------------------------------------------------------
# CPU: lowering for sm_90


def _custom_calls(text):
  return text.count("@triton_kernel_call_ffi")


class CrossLoweringTest(Base):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}))

  def lower(self, fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

  @parameterized.parameters(False, True)
  def test_one_launch_forward_and_one_per_cotangent(self, transpose_rhs):
    shapes = [(4096, 16, 4096), (4096, 128, 4096), (37, 4096, 4096), (2048, 4096, 4096), (0, 8, 8)]
    s = jax.ShapeDtypeStruct
    lhs = [s((m, k), jnp.bfloat16) for m, n, k in shapes]
    rhs = [s((n, k) if transpose_rhs else (k, n), jnp.bfloat16) for m, n, k in shapes]
    fn = lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs)
    before = set(_compile._cache)
    self.assertEqual(_custom_calls(self.lower(fn, lhs, rhs)), 1)
    loss = lambda l, r: sum(jnp.sum(jnp.square(o.astype(jnp.float32))) for o in fn(l, r))  # needs the forward
    self.assertEqual(_custom_calls(self.lower(jax.grad(loss, argnums=(0, 1)), lhs, rhs)), 3)
    compiled = [_compile._cache[key] for key in set(_compile._cache) - before]
    self.assertNotEmpty(compiled)
    for kernel in compiled:
      self.assertIn(".target sm_90a", kernel.asm["ptx"])
      # Rows are 16-byte multiples: 16-byte async copies (the pipelined K loop), no scalar 2-byte loads.
      self.assertRegex(kernel.asm["ptx"], r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10")
      self.assertNotIn("ld.global.b16", kernel.asm["ptx"])

  def test_precision_highest_multiplies_float32_exactly(self):
    a, b = jax.ShapeDtypeStruct((40, 24), jnp.float32), jax.ShapeDtypeStruct((24, 33), jnp.float32)
    before = set(_compile._cache)
    self.lower(lambda x, y: jgmm.grouped_matmul([x], [y], precision="highest"), a, b)
    self.lower(lambda x, y: jgmm.grouped_matmul([x], [y]), a, b)
    precisions = {dict(key[2])["DOT_PRECISION"] for key in set(_compile._cache) - before}
    self.assertEqual(precisions, {"ieee", None})

  def test_large_counts_split_into_launches(self):
    shapes = [(8, 16, 16)] * (gm.MAX_PROBLEMS_PER_LAUNCH + 3)
    lhs, rhs = ([jax.ShapeDtypeStruct(s, jnp.float16) for s in ss] for ss in zip(*[((m, k), (k, n))
                                                                                   for m, n, k in shapes]))
    text = self.lower(lambda l, r: jgmm.grouped_matmul(l, r), list(lhs), list(rhs))
    self.assertEqual(_custom_calls(text), 2)


# ---------------------------------------------------------------------------------------------------------------
# GPU


@absltest.skipUnless(ON_GPU, "needs a GPU")
class GpuTest(Base):

  @parameterized.product(dtype=("bf16", "f16", "f32"), transpose_rhs=(False, True))
  def test_mixed_shapes(self, dtype, transpose_rhs):
    shapes = [(4096, 16, 1024), (1000, 72, 1024), (37, 1024, 512), (2048, 1536, 256), (1, 1, 1), (513, 7, 33),
              (0, 16, 16), (16, 16, 0), (129, 1000, 2049)]
    lhs, rhs = self.problems(shapes, transpose_rhs, DTYPES[dtype])
    outs = jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=transpose_rhs))(lhs, rhs)
    self.assert_products(outs, lhs, rhs, transpose_rhs, GPU_TOLERANCE[dtype], DTYPES[dtype])

  def test_64_problems_and_grad(self):
    shapes = [tuple(int(x) for x in self.rng.integers(1, 700, 3)) for _ in range(64)]
    lhs, rhs = self.problems(shapes, False, jnp.bfloat16)
    self.assert_products(jax.jit(jgmm.grouped_matmul)(lhs, rhs), lhs, rhs, False, GPU_TOLERANCE["bf16"])
    self.check_grads(jgmm.grouped_matmul, lhs, rhs, False, GPU_TOLERANCE["bf16"])

  def test_agrees_with_the_xla_backend(self):
    shapes = [(256, 128, 4096), (512, 16, 4096), (300, 64, 4096)]
    lhs, rhs = self.problems(shapes, False, jnp.bfloat16)
    triton_outs = jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, backend="triton"))(lhs, rhs)
    xla_outs = jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, backend="xla"))(lhs, rhs)
    for t, x in zip(triton_outs, xla_outs):
      self.assertLess(oracle.rel_err(np.asarray(t, np.float32), np.asarray(x, np.float32)), GPU_TOLERANCE["bf16"])


if __name__ == "__main__":
  absltest.main()
