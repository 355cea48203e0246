"""jgmm.grouped_matmul (independent products of different sizes) against a float64 numpy oracle.

CPU: the XLA backend (all dtypes, jit/grad/jvp/vmap, bad input); the Triton kernel under TRITON_INTERPRET=1
(float32: the interpreter's 16-bit dots are wrong) through jgmm.ffi, which NaN-poisons every output buffer, so
an element the kernel forgets to write fails the check; cross-lowering for sm_90 (JGMM_TARGET=cuda:90): one
custom call per grouped product, forward and backward, with 16-byte pipelined loads.
FP8 (operands with scales, jgmm.quantize's recipes): against the float64 product of the dequantised operands on
the XLA backend and, under the interpreter, the kernel's indexing and scaling with float32 operands holding the
FP8 values (the interpreter's FP8 dots are not trusted, as in test_fp8_kernels); cross-lowering: Hopper's e4m3
wgmma in both rhs layouts, and launches whose params fit CUDA's 4 KiB.
GPU (skipped without one): bf16/fp16/fp32 at the default tiles, odd and large shapes, 64 problems, grad; FP8
against the oracle and DeepGEMM's criterion against the bf16 product.
"""
import importlib
import os
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from test_triton_kernels import GPU_TOLERANCE, KernelTestBase

import jgmm
from jgmm import oracle, quantize
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
# FP8: K of one partial scale block (1, 7, 50), of two (129, 200), N of two 128-wide blocks (130), empty problems.
MIXED_FP8 = ((5, 7, 1), (17, 33, 129), (1, 1, 7), (40, 9, 50), (0, 3, 4), (3, 0, 2), (4, 5, 0), (3, 130, 200))
# (lhs, rhs) scale recipes: per row / per channel, DeepSeek-V3's blocks, and the two mixed.
RECIPES = {"rowwise": ("row", "row"), "blocks": ("1x128", "128x128"), "row-blocks": ("row", "128x128"),
           "blocks-row": ("1x128", "row")}
SMALL_FP8 = Config(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=2)  # 2 K steps per scale block
_quantize = jax.jit(quantize.quantize, static_argnums=(1, 2))  # One compilation per shape, not one per op


def product_oracle(a, b, transpose_rhs):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return a @ (b.T if transpose_rhs else b)


class Base(KernelTestBase):  # a fresh seed per test (in failure messages), self.normal

  def problems(self, shapes, transpose_rhs, dtype=jnp.float32):
    lhs = [self.normal((m, k), dtype) for m, n, k in shapes]
    rhs = [self.normal((n, k) if transpose_rhs else (k, n), dtype) for m, n, k in shapes]
    return lhs, rhs

  def quantize_each(self, arrays, recipe, dtype=jnp.float8_e4m3fn):
    """[(q_i, scale_i, float64 q_i * scale_i)] with q_i, scale_i = jgmm.quantize.quantize(x_i, recipe, dtype) for
    2-D x_i, in one call (a call per shape would compile per shape): the x_i zero-padded to multiples of 128 rows and
    the widest K and stacked (the padding changes no block's amax), the results sliced."""
    shapes = [np.shape(x) for x in arrays]
    starts = np.cumsum([0] + [-(-m // 128) * 128 for m, _ in shapes])
    stacked = np.zeros((starts[-1], max(k for _, k in shapes)), np.float32)
    for x, (m, k), row in zip(arrays, shapes, starts):
      stacked[row:row + m, :k] = x
    q, scale = _quantize(stacked, recipe, dtype)
    dequantized = oracle.dequantize(q, scale, recipe)
    q, scale = np.asarray(q), np.asarray(scale)
    results = []
    for (m, k), row in zip(shapes, starts):
      rows = slice(row, row + m)
      scale_rows = slice(row // 128, row // 128 + -(-m // 128)) if recipe == "128x128" else rows
      scale_i = scale[rows] if recipe == "row" else scale[scale_rows, :-(-k // 128)]
      results.append((jnp.asarray(q[rows, :k]), jnp.asarray(scale_i), dequantized[rows, :k]))
    return results

  def fp8_problems(self, shapes, transpose_rhs, recipe, dtype=jnp.float8_e4m3fn):
    """((lhs, rhs, lhs_scales, rhs_scales), (lhs_f64, rhs_f64)): FP8 operands quantised from random rows of different
    magnitudes (a scale applied to the wrong rows or blocks shows), rhs_i as (N_i, K_i), then transposed unless
    transpose_rhs; their scales; and the dequantised operands (rhs_f64[i] (N_i, K_i))."""
    rows = lambda m, k: self.rng.standard_normal((m, k)) * np.exp(self.rng.uniform(-2, 2, (m, 1)))
    lhs, lhs_scales, lhs_f64 = zip(*self.quantize_each([rows(m, k) for m, n, k in shapes], RECIPES[recipe][0], dtype))
    rhs, rhs_scales, rhs_f64 = zip(*self.quantize_each([rows(n, k) for m, n, k in shapes], RECIPES[recipe][1], dtype))
    rhs = [b if transpose_rhs else b.T for b in rhs]
    return (list(lhs), rhs, list(lhs_scales), list(rhs_scales)), (lhs_f64, rhs_f64)

  def assert_products(self, outs, lhs, rhs, transpose_rhs, tol, out_dtype=None):
    self.assertLen(outs, len(lhs))
    for i, (out, a, b) in enumerate(zip(outs, lhs, rhs)):
      want = product_oracle(a, b, transpose_rhs)
      self.assertEqual(out.shape, want.shape, f"problem {i}")
      if out_dtype is not None:
        self.assertEqual(out.dtype, out_dtype, f"problem {i}")
      if want.size:
        # Relative to the product's norm, or, where the K terms cancel (a 1 x 1 output of 7 terms can be ~0), to
        # the terms' own size: the norm of |a| @ |b| over sqrt(K), which random terms' sums have.
        k = np.shape(a)[1]
        terms = np.linalg.norm(product_oracle(np.abs(a), np.abs(b), transpose_rhs)) / np.sqrt(max(k, 1))
        err = np.linalg.norm(np.asarray(out, np.float64) - want) / max(np.linalg.norm(want), terms, 1e-30)
        self.assertFalse(np.isnan(np.asarray(out, np.float32)).any(), f"problem {i}: NaN (unwritten or poisoned)")
        self.assertLess(err, tol, f"problem {i}, seed {self.seed}")

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

  @parameterized.parameters(("rowwise", False), ("blocks", True), ("row-blocks", True), ("blocks-row", False))
  def test_fp8(self, recipe, transpose_rhs):
    problems, dequantized = self.fp8_problems(MIXED_FP8, transpose_rhs, recipe)
    fn = jax.jit(lambda *a: jgmm.grouped_matmul(a[0], a[1], lhs_scales=a[2], rhs_scales=a[3], backend="xla",
                                                transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32))
    outs = fn(*problems)
    self.assert_products(outs, *dequantized, True, 1e-6, jnp.float32)
    self.assertTrue(all(not np.asarray(o).any() for o, (m, n, k) in zip(outs, MIXED_FP8) if k == 0))

  def test_fp8_one_problem_e4m3fnuz_to_bfloat16(self):
    problems, dequantized = self.fp8_problems([(9, 20, 130)], True, "blocks", jnp.float8_e4m3fnuz)
    outs = jgmm.grouped_matmul(problems[0], problems[1], lhs_scales=problems[2], rhs_scales=problems[3],
                               transpose_rhs=True, backend="xla")  # e4m3fnuz is ROCm's: not for CUDA's kernel
    self.assert_products(outs, *dequantized, True, 1e-2, jnp.bfloat16)  # bfloat16 by default

  def test_fp8_vmap(self):
    """A batch of lhs (and its scales) folds into M: one call; a batch of rhs (and its scales) maps over it."""
    shapes = MIXED_FP8[:2]
    (lhs, rhs, lhs_s, rhs_s), (lhs_f64, rhs_f64) = self.fp8_problems(shapes * 2, True, "blocks")
    stack = lambda arrays: [jnp.stack(pair) for pair in zip(arrays[:2], arrays[2:])]  # problem i: batch of 2
    fn = lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=True,
                                                  preferred_element_type=jnp.float32, backend="xla")
    folded = jax.vmap(fn, in_axes=(0, None, 0, None))
    outs = folded(stack(lhs), rhs[:2], stack(lhs_s), rhs_s[:2])
    for j in range(2):
      self.assert_products([o[j] for o in outs], lhs_f64[2 * j:2 * j + 2], rhs_f64[:2], True, 1e-6)
    outs = jax.vmap(fn, in_axes=(None, 0, None, 0))(lhs[:2], stack(rhs), lhs_s[:2], stack(rhs_s))
    for j in range(2):
      self.assert_products([o[j] for o in outs], lhs_f64[:2], rhs_f64[2 * j:2 * j + 2], True, 1e-6)
    jaxpr = str(jax.make_jaxpr(folded)(stack(lhs), rhs[:2], stack(lhs_s), rhs_s[:2]))
    self.assertEqual(jaxpr.count("jgmm_grouped_matmul"), 1)
    self.assertNotIn("while", jaxpr)

  def test_fp8_has_no_derivative(self):
    (lhs, rhs, lhs_s, rhs_s), _ = self.fp8_problems(MIXED_FP8[:2], False, "rowwise")
    fn = lambda l, ls: jnp.sum(jgmm.grouped_matmul(l, rhs, lhs_scales=ls, rhs_scales=rhs_s)[0].astype(jnp.float32))
    for argnums in (0, 1):
      with self.assertRaisesRegex(NotImplementedError, "no derivative w.r.t. FP8 operands.*jgmm.fp8_gmm"):
        jax.grad(fn, argnums=argnums)(lhs, lhs_s)

  def test_fp8_bad_input(self):
    f8 = jnp.float8_e4m3fn
    a, b, sa, sb = self.normal((4, 8)).astype(f8), self.normal((8, 5)).astype(f8), self.normal((4,)), self.normal((5,))
    scales = dict(lhs_scales=[sa], rhs_scales=[sb])
    blocks = dict(lhs_scales=[sa, self.normal((4, 1))], rhs_scales=[sb, sb])
    cases = [
        (([a], [b]), {}, TypeError,
         r"lhs_scales must be a list of float32 arrays, one per problem \(1\), with FP8 operands, got NoneType"),
        (([a], [b]), dict(lhs_scales=[sa]), TypeError, "rhs_scales must be a list .* got NoneType"),
        (([a], [b]), dict(lhs_scales=sa, rhs_scales=[sb]), TypeError, "lhs_scales must be a list .* got ArrayImpl"),
        (([a], [b]), dict(lhs_scales=[sa, sa], rhs_scales=[sb]), ValueError,
         r"lhs_scales must hold one scale array per problem \(1\), got 2"),
        (([a.astype(jnp.float32)], [b.astype(jnp.float32)]), scales, TypeError,
         r"lhs_list\[0\] must have dtype float8_e4m3fn or float8_e4m3fnuz .* got shape \(4, 8\) and dtype float32"),
        (([a, a.astype(jnp.bfloat16)], [b, b]), dict(lhs_scales=[sa, sa], rhs_scales=[sb, sb]), TypeError,
         r"lhs_list\[1\] must have dtype float8_e4m3fn or float8_e4m3fnuz .* dtype bfloat16"),
        (([a], [b.astype(jnp.float8_e4m3fnuz)]), scales, TypeError, r"rhs_list\[0\] must have the dtype of lhs_list"),
        (([a], [b]), dict(lhs_scales=[None], rhs_scales=[sb]), ValueError,
         r"lhs_scales\[0\] is required with the FP8 lhs_list\[0\]"),
        (([a], [b]), dict(lhs_scales=[sa[:3]], rhs_scales=[sb]), ValueError,
         r"lhs_scales\[0\] must have shape \(M_i,\) = \(4,\) \(per row\) or \(M_i, cdiv\(K_i, 128\)\) = \(4, 1\) "
         r"\(1x128 blocks\), got shape \(3,\)"),
        (([a], [b]), dict(lhs_scales=[sa], rhs_scales=[self.normal((8,))]), ValueError,
         r"rhs_scales\[0\] must have shape \(N_i,\) = \(5,\) \(per channel\) or "
         r"\(cdiv\(N_i, 128\), cdiv\(K_i, 128\)\) = \(1, 1\) \(128x128 blocks\), got shape \(8,\)"),
        (([a], [b]), dict(lhs_scales=[sa.astype(jnp.bfloat16)], rhs_scales=[sb]), TypeError,
         r"lhs_scales\[0\] must have dtype float32, got shape \(4,\) and dtype bfloat16"),
        (([a, a], [b, b]), blocks, ValueError,
         r"lhs_scales\[1\] and rhs_scales\[1\] must follow problem 0's recipe \(per row, per channel\): one recipe "
         r"for all problems, got 1x128 blocks, per channel"),
    ]
    for args, kwargs, error, message in cases:
      with self.assertRaisesRegex(error, message):
        jgmm.grouped_matmul(*args, **kwargs)
    with self.assertRaisesRegex(ValueError, "precision is not supported with FP8"):
      jgmm.grouped_matmul([a], [b], precision="highest", **scales)
    with self.assertRaisesRegex(TypeError, "preferred_element_type must be float32, bfloat16 or float16"):
      jgmm.grouped_matmul([a], [b], preferred_element_type=jnp.int32, **scales)


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

  def test_default_config_from_a_gmm_config_with_tail_split(self):
    """gmm's config for the largest problem may split its last round (Config.tail_split, block_n >= 128), which the
    heterogeneous kernels do not: shrunk to N = 30, its tile drops the split instead of failing Config's check."""
    lhs, rhs = self.problems([(20, 24, 9), (3, 40, 30)], False)
    with mock.patch.dict(os.environ, {"JGMM_CONFIG": '{"tail_split": true, "block_m": 16}'}):
      self.assert_products(self.run_triton(lhs, rhs, False, config=None), lhs, rhs, False, 1e-4)


  def run_fp8(self, lhs, rhs, lhs_scales, rhs_scales, transpose_rhs, config=SMALL_FP8):
    """The FP8 kernel on float32 operands holding the FP8 values (float32 outputs)."""
    f32 = lambda arrays: [x.astype(jnp.float32) for x in arrays]
    fn = jax.jit(lambda *a: gm._triton(a[0], a[1], a[2:], False, transpose_rhs, jnp.float32, None, config))
    return fn(f32(lhs), f32(rhs), lhs_scales, rhs_scales)

  @parameterized.parameters(("rowwise", False), ("blocks", True), ("row-blocks", False))
  def test_fp8(self, recipe, transpose_rhs):
    problems, dequantized = self.fp8_problems(MIXED_FP8, transpose_rhs, recipe)
    outs = self.run_fp8(*problems, transpose_rhs)
    self.assert_products(outs, *dequantized, True, 1e-6)
    self.assertTrue(all(not np.asarray(o).any() for o, (m, n, k) in zip(outs, MIXED_FP8) if k == 0))

  def test_fp8_64_problems_in_several_launches(self):
    shapes = [tuple(int(x) for x in self.rng.integers(1, 12, 3)) for _ in range(64)]
    problems, dequantized = self.fp8_problems(shapes, True, "blocks-row")
    with mock.patch.object(gm, "MAX_FP8_PROBLEMS_PER_LAUNCH", 30), \
        mock.patch.object(gm, "_launch", wraps=gm._launch) as launch:
      self.assert_products(self.run_fp8(*problems, True), *dequantized, True, 1e-6)
    self.assertEqual([len(call.args[0]) for call in launch.call_args_list], [30, 30, 4])

  def test_fp8_public_api(self):
    """jgmm.grouped_matmul(backend="triton") with FP8 operands reaches the FP8 kernel (FP8 dots in the interpreter:
    the check is only that the call is wired, so a loose tolerance)."""
    problems, dequantized = self.fp8_problems([(20, 24, 130)], False, "blocks")
    outs = jgmm.grouped_matmul(problems[0], problems[1], lhs_scales=problems[2], rhs_scales=problems[3],
                               config=SMALL_FP8, backend="triton")
    self.assert_products(outs, *dequantized, True, 1e-2, jnp.bfloat16)


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

  @parameterized.parameters((1, 32), (4, 32), (33, 64))
  def test_problem_table_is_a_warp_wide(self, problems, lanes):
    """The problem table the kernel reduces once a tile has max(32, next_pow2(P)) lanes (geometry.group_table_lanes:
    narrower, ptxas keeps the warp converged in the K loop around the reduction's shuffles)."""
    shapes = [(64 + 8 * p, 32, 48) for p in range(problems)]
    lhs, rhs = ([jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ss] for ss in zip(*[((m, k), (k, n))
                                                                                    for m, n, k in shapes]))
    before = set(_compile._cache)
    self.lower(lambda l, r: jgmm.grouped_matmul(l, r), list(lhs), list(rhs))
    widths = {(dict(key[2])["P"], dict(key[2])["P_POW2"]) for key in set(_compile._cache) - before}
    self.assertEqual(widths, {(problems, lanes)})

  def test_large_counts_split_into_launches(self):
    shapes = [(8, 16, 16)] * (gm.MAX_PROBLEMS_PER_LAUNCH + 3)
    lhs, rhs = ([jax.ShapeDtypeStruct(s, jnp.float16) for s in ss] for ss in zip(*[((m, k), (k, n))
                                                                                   for m, n, k in shapes]))
    text = self.lower(lambda l, r: jgmm.grouped_matmul(l, r), list(lhs), list(rhs))
    self.assertEqual(_custom_calls(text), 2)

  def fp8_args(self, shapes, transpose_rhs, recipe="blocks"):
    """(lhs, rhs, lhs_scales, rhs_scales) of FP8 problems in DeepSeek-V3's blocks (or per row and channel), as
    ShapeDtypeStructs."""
    s, f8, f32 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn, jnp.float32
    blocks = lambda size: -(-size // 128)
    rowwise = recipe == "rowwise"
    return ([s((m, k), f8) for m, n, k in shapes],
            [s((n, k) if transpose_rhs else (k, n), f8) for m, n, k in shapes],
            [s((m,) if rowwise else (m, blocks(k)), f32) for m, n, k in shapes],
            [s((n,) if rowwise else (blocks(n), blocks(k)), f32) for m, n, k in shapes])

  def lower_fp8(self, args, transpose_rhs):
    """The number of custom calls, and the PTX of the kernels compiled for them."""
    before = set(_compile._cache)
    fn = lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=transpose_rhs)
    calls = _custom_calls(self.lower(fn, *args))
    return calls, [_compile._cache[key].asm["ptx"] for key in set(_compile._cache) - before]

  @parameterized.parameters(False, True)
  def test_fp8_e4m3_wgmma(self, transpose_rhs):
    calls, ptxs = self.lower_fp8(self.fp8_args([(256, 512, 1024), (128, 256, 300), (64, 128, 129)], transpose_rhs),
                                 transpose_rhs)
    self.assertEqual(calls, 1)
    self.assertNotEmpty(ptxs)
    for ptx in ptxs:
      self.assertIn(".target sm_90a", ptx)
      self.assertRegex(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3")

  @parameterized.parameters("blocks", "rowwise")
  def test_fp8_warp_specialized_where_tma_reads_every_problem(self, recipe):
    """grouped_matmul_fp8_ws_kernel (its TMA loader warp and two consumer warpgroups, descriptors made on the
    device) where every K_i and output row is a 16-byte multiple and rhs is stored (N_i, K_i); the plain kernel
    where one problem's K_i is not, or rhs is (K_i, N_i)."""
    tma_shapes = [(37, 4096, 4096), (2048, 4096, 4096), (300, 1000, 256), (1, 8, 16)]
    for shapes, transpose_rhs, warp_specialized in ((tma_shapes, True, True), (tma_shapes + [(5, 8, 129)], True, False),
                                                    (tma_shapes, False, False)):
      with mock.patch.object(gm, "_launch_fp8_ws", wraps=gm._launch_fp8_ws) as ws_call:
        calls, ptxs = self.lower_fp8(self.fp8_args(shapes, transpose_rhs, recipe), transpose_rhs)
      self.assertEqual(calls, 1)
      self.assertEqual(ws_call.called, warp_specialized, (shapes, transpose_rhs))
      for ptx in ptxs:
        self.assertRegex(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3")
        self.assertEqual("cp.async.bulk.tensor" in ptx, warp_specialized)
        self.assertEqual("tensormap.cp_fenceproxy" in ptx, warp_specialized)  # descriptors made on the device

  def test_fp8_launches_fit_cuda_param_limit(self):
    """More problems than MAX_FP8_PROBLEMS_PER_LAUNCH take two launches, each kernel's params within 4 KiB."""
    args = self.fp8_args([(64, 64, 128)] * (gm.MAX_FP8_PROBLEMS_PER_LAUNCH + 1), True)
    calls, ptxs = self.lower_fp8(args, True)
    self.assertEqual(calls, 2)
    param_bytes = [sum(int(bits) // 8 for bits in re.findall(r"\.param \.[ub](\d+)", ptx)) for ptx in ptxs]
    self.assertLen(param_bytes, 2)
    self.assertLessEqual(max(param_bytes), 4096)
    self.assertGreater(max(param_bytes), 5 * 8 * gm.MAX_FP8_PROBLEMS_PER_LAUNCH)


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

  @parameterized.product(recipe=("rowwise", "blocks"), transpose_rhs=(False, True))
  def test_fp8(self, recipe, transpose_rhs):
    shapes = [(4096, 16, 1024), (1000, 72, 7168), (37, 1024, 512), (2048, 1536, 256), (1, 1, 1), (513, 7, 129),
              (0, 16, 16), (16, 16, 0), (129, 1000, 2049)]
    problems, dequantized = self.fp8_problems(shapes, transpose_rhs, recipe)
    outs = jax.jit(lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs,
                                                            transpose_rhs=transpose_rhs,
                                                            preferred_element_type=jnp.float32))(*problems)
    self.assert_products(outs, *dequantized, True, 1e-3)  # test_fp8_kernels' GPU_TOL

  def poisoned(self, fn, *args):
    """fn(*args) after freeing a NaN array as large as all its outputs: the allocator hands that memory to the
    outputs, so an element the kernel leaves unwritten stays NaN."""
    out_bytes = sum(o.size * o.dtype.itemsize for o in jax.tree.leaves(jax.eval_shape(fn, *args)))
    jnp.full((out_bytes // 4 + 1,), jnp.nan, jnp.float32).block_until_ready().delete()
    return fn(*args)

  @parameterized.product(recipe=("rowwise", "blocks"), out_dtype=("bf16", "f32"))
  def test_fp8_warp_specialized(self, recipe, out_dtype):
    """grouped_matmul_fp8_ws_kernel (every K_i a 16-byte multiple, rhs (N_i, K_i)): M_i ending inside either
    64-row half of a tile and on its edges, N_i inside a 128-wide tile, K_i ending inside a scale block, 40
    problems (tiles of several problems per program), outputs NaN-poisoned."""
    shapes = [(1, 16, 16), (63, 72, 144), (64, 128, 128), (65, 136, 7168), (127, 1000, 112), (128, 4096, 256),
              (129, 8, 4096), (1000, 264, 2048)]
    shapes += [(int(self.rng.integers(1, 700)), 8 * int(self.rng.integers(1, 128)), 16 * int(self.rng.integers(1, 64)))
               for _ in range(32)]
    problems, dequantized = self.fp8_problems(shapes, True, recipe)
    fn = jax.jit(lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=True,
                                                          preferred_element_type=DTYPES[out_dtype]))
    with mock.patch.object(gm, "_launch_fp8_ws", wraps=gm._launch_fp8_ws) as ws_call:
      outs = self.poisoned(fn, *problems)
    self.assertTrue(ws_call.called)
    self.assert_products(outs, *dequantized, True, 1e-3 if out_dtype == "f32" else 1e-2, DTYPES[out_dtype])

  def test_fp8_warp_specialized_nan_scale_stays_in_its_row(self):
    """A NaN lhs scale makes its own output row NaN and no other row or problem's (one scale per 1x128 block)."""
    shapes = [(200, 256, 512), (70, 128, 256), (3, 8, 16)]
    (lhs, rhs, lhs_scales, rhs_scales), _ = self.fp8_problems(shapes, True, "blocks")
    lhs_scales[0] = lhs_scales[0].at[130, 1].set(jnp.nan)
    outs = jax.jit(lambda *a: jgmm.grouped_matmul(a[0], a[1], lhs_scales=a[2], rhs_scales=a[3], transpose_rhs=True))(
        lhs, rhs, lhs_scales, rhs_scales)
    nan_rows = [np.isnan(np.asarray(o, np.float32)).any(axis=1) for o in outs]
    self.assertTrue(np.isnan(np.asarray(outs[0][130], np.float32)).all())
    self.assertEqual([int(r.sum()) for r in nan_rows], [1, 0, 0])

  def test_fp8_64_problems_deepgemm_criterion(self):
    """DeepGEMM's bar: 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3 against the bf16 product of the unquantised inputs."""
    shapes = [tuple(int(x) for x in self.rng.integers(1, 700, 3)) for _ in range(63)] + [(256, 4096, 7168)]
    lhs = [self.normal((m, k), jnp.bfloat16) for m, n, k in shapes]
    rhs = [self.normal((n, k), jnp.bfloat16) for m, n, k in shapes]
    (lhs_q, lhs_s, _), (rhs_q, rhs_s, _) = (
        [list(x) for x in zip(*self.quantize_each([np.asarray(x, np.float32) for x in xs], recipe))]
        for xs, recipe in ((lhs, "1x128"), (rhs, "128x128")))
    outs = jax.jit(lambda l, r, ls, rs: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=True))(
        lhs_q, rhs_q, lhs_s, rhs_s)
    want = jax.jit(lambda l, r: jgmm.grouped_matmul(l, r, transpose_rhs=True))(lhs, rhs)
    self.assertEqual({o.dtype for o in outs}, {jnp.dtype(jnp.bfloat16)})
    flat = lambda arrays: np.concatenate([np.asarray(x, np.float32).ravel() for x in arrays])
    self.assertLess(oracle.deepgemm_diff(flat(outs), flat(want)), 1e-3, f"seed {self.seed}")  # over all outputs


if __name__ == "__main__":
  absltest.main()
