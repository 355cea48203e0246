"""masked_gmm's gradient primitives, masked_gmm_kn (dx, w read in place) and masked_tgmm (dw), on every backend
against the float64 oracle: the portable one, the Triton kernels under the interpreter (float32; NaN-poisoned
outputs) and on a GPU (skipped without one). Also: they give jax.grad's values of jgmm.masked_gmm.
"""
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized

import jgmm
from jgmm import backend_triton, oracle, primitives  # backend_triton: the kernels, imported for compiling
from jgmm.config import Config

ON_GPU = any(d.platform == "gpu" for d in jax.devices())
SMALL = Config(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)


def masked_grads_oracle(x, w, dout, masked_m):
  """(dx, dw) in float64 of out[g, :m] = x[g, :m] @ w[g].T: dx = dout @ w, dw = dout^T x on valid rows."""
  x, w, dout = oracle.f64(x), oracle.f64(w), oracle.f64(dout)
  valid = (np.arange(x.shape[1])[None, :] < np.clip(masked_m, 0, x.shape[1])[:, None])[..., None]
  dout = np.where(valid, dout, 0.0)
  return np.einsum("gmn,gnk->gmk", dout, w), np.einsum("gmn,gmk->gnk", dout, np.where(valid, x, 0.0))


def grads(x, w, dout, masked_m, backend, config, dtype):
  masked_m = jnp.clip(jnp.asarray(masked_m), 0, x.shape[1]).astype(jnp.int32)
  fn = jax.jit(lambda x, w, dout, masked_m: (
      primitives.masked_gmm_kn(dout, w, masked_m, out_dtype=dtype, expected_m=None, precision=None, config=config,
                               backend=backend)[0],
      primitives.masked_tgmm(dout, x, masked_m, out_dtype=dtype, precision=None, config=config, backend=backend)[0]))
  return fn(x, w, dout, masked_m)


class MaskedGradTest(seeded.SeededTestCase):
  backend = "xla"
  config = None
  f32_tol = 1e-5

  def normal(self, shape, dtype=jnp.float32):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  def check(self, groups, max_m, k, n, masked_m, dtype=jnp.float32, tol=None):
    x, w, dout = self.normal((groups, max_m, k), dtype), self.normal((groups, n, k), dtype), self.normal(
        (groups, max_m, n), dtype)
    dx, dw = grads(x, w, dout, masked_m, self.backend, self.config, dtype)
    want_dx, want_dw = masked_grads_oracle(np.float32(x), np.float32(w), np.float32(dout), np.asarray(masked_m))
    for name, got, want in (("dx", dx, want_dx), ("dw", dw, want_dw)):
      got = np.asarray(got, np.float32)
      self.assertEqual(got.shape, want.shape, name)
      self.assertLess(oracle.rel_err(got, want), self.f32_tol if tol is None else tol, f"{name}, seed {self.seed}")
    valid = np.clip(np.asarray(masked_m), 0, max_m)
    for g in range(groups):
      np.testing.assert_array_equal(np.asarray(dx[g, valid[g]:], np.float32), 0.0)
      if valid[g] == 0:
        np.testing.assert_array_equal(np.asarray(dw[g], np.float32), 0.0)

  @parameterized.parameters((37, 33, 24), (16, 7, 40), (5, 1, 1))
  def test_against_oracle(self, max_m, k, n):
    groups = 5
    self.check(groups, max_m, k, n, np.array([0, max_m, self.rng.integers(1, max_m + 1), -3, max_m + 9], np.int32))

  def test_match_jax_grad_of_masked_gmm(self):
    groups, max_m, k, n = 3, 20, 24, 16
    x, w, dout = self.normal((groups, max_m, k)), self.normal((groups, n, k)), self.normal((groups, max_m, n))
    masked_m = jnp.asarray([4, 0, 20], jnp.int32)
    _, vjp = jax.vjp(lambda x, w: jgmm.masked_gmm(x, w, masked_m, backend="xla"), x, w)
    want_dx, want_dw = vjp(dout)
    dx, dw = grads(x, w, dout, masked_m, self.backend, self.config, jnp.float32)
    self.assertLess(oracle.rel_err(dx, want_dx), self.f32_tol)
    self.assertLess(oracle.rel_err(dw, want_dw), self.f32_tol)


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedMaskedGradTest(MaskedGradTest):
  backend = "triton"
  config = SMALL

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    os.environ.pop("JGMM_TARGET", None)


@absltest.skipIf(ON_GPU, "lowers for a GPU the machine does not have")
@absltest.skipIf(not hasattr(backend_triton.tgmm_kernels.tgmm_kernel, "cache_key"),
                 "TRITON_INTERPRET=1 was set when the kernels were imported: they cannot be compiled")
class CrossLoweringTest(parameterized.TestCase):

  @parameterized.parameters(jnp.bfloat16, jnp.float16)
  def test_compiles_for_sm90(self, dtype):
    s = jax.ShapeDtypeStruct
    groups, max_m, k, n = 8, 256, 7168, 4096
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}):
      text = jax.jit(lambda *a: grads(*a, "triton", None, dtype)).trace(
          s((groups, max_m, k), dtype), s((groups, n, k), dtype), s((groups, max_m, n), dtype),
          s((groups,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    self.assertEqual(text.count("triton_kernel_call"), 2)
    self.assertNotIn("transpose", text)  # w is read in place


@absltest.skipIf(not ON_GPU, "needs a GPU")
class GpuMaskedGradTest(MaskedGradTest):
  backend = "triton"
  f32_tol = 3e-3  # float32 dots on TF32 tensor cores

  @parameterized.parameters(jnp.bfloat16, jnp.float16)
  def test_large(self, dtype):
    groups, max_m, k, n = 6, 300, 2880, 1000
    self.check(groups, max_m, k, n, np.array([0, max_m, 1, 63, 64, 200], np.int32), dtype, 1e-2)


if __name__ == "__main__":
  absltest.main()
