"""FP8 gmm / masked_gmm / tgmm through the public API (jgmm.fp8) on the portable backend, and their bad calls.

The oracle is the float64 product of the dequantised operands (q * scale, jgmm.oracle), so the FP8 ops are
checked to float32 accuracy with float32 output; DeepGEMM's criterion 1 - 2 sum(xy) / sum(x^2 + y^2) < 1e-3
checks the FP8 result against the product of the unquantised inputs.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized

import jgmm
from jgmm import fp8, oracle, quantize

try:
  shard_map = jax.shard_map
except AttributeError:  # jax without the top-level alias.
  from jax.experimental.shard_map import shard_map

E4M3 = {"e4m3fn": jnp.float8_e4m3fn, "e4m3fnuz": jnp.float8_e4m3fnuz}


class Fp8TestBase(seeded.SeededTestCase):
  backend = "xla"

  def normal(self, shape):
    # Rows of different magnitudes, so a scale applied to the wrong rows or blocks shows.
    return jnp.asarray(self.rng.standard_normal(shape) * np.exp(self.rng.uniform(-2, 2, shape[:-1] + (1,))),
                       jnp.float32)

  def quantized(self, shape, recipe, fmt="e4m3fn"):
    return quantize.quantize(self.normal(shape), recipe, E4M3[fmt])

  def assert_close(self, actual, expected, tol=1e-5):
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, tol, f"relative error {err:.3g}, seed {self.seed}")


class Fp8OpsTest(Fp8TestBase):

  @parameterized.parameters(
      (1, ("row", "row"), True), (7, ("1x128", "128x128"), False), (129, ("1x128", "128x128"), True),
      (129, ("row", "128x128"), False), (7, ("1x128", "row"), True), (129, ("row", "row"), False))
  def test_gmm(self, k, recipes, transpose_rhs):
    m, n, groups = 70, 136, 4
    lhs_recipe, rhs_recipe = recipes
    lhs, lhs_scale = self.quantized((m, k), lhs_recipe)
    rhs_nk, rhs_scale = self.quantized((groups, n, k), rhs_recipe)
    rhs = rhs_nk if transpose_rhs else jnp.swapaxes(rhs_nk, 1, 2)
    sizes = np.array([20, 0, 33, 10], np.int32)  # 7 rows in no group: zeros
    out = jgmm.gmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                   transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32, backend=self.backend)
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs_nk, rhs_scale, "128x128"),
                      sizes,
                      transpose_rhs=True)
    self.assertEqual(out.dtype, jnp.float32)
    self.assert_close(out, want)
    np.testing.assert_array_equal(out[63:], 0.0)

  @parameterized.product(recipes=(("row", "row"), ("1x128", "128x128")), n=(6, 16))  # 16: a TMA-aligned N
  def test_gmm_and_masked_with_k_0_give_zeros(self, recipes, n):
    lhs, lhs_scale = quantize.quantize(jnp.zeros((9, 0)), recipes[0])
    rhs, rhs_scale = quantize.quantize(jnp.zeros((2, n, 0)), recipes[1])
    out = jgmm.gmm(lhs, rhs, jnp.array([4, 5], jnp.int32), lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                   transpose_rhs=True, backend=self.backend)
    self.assertEqual((out.shape, out.dtype), ((9, n), jnp.bfloat16))
    np.testing.assert_array_equal(out, 0.0)
    x, x_scale = quantize.quantize(jnp.zeros((2, 9, 0)), recipes[0])
    out = jgmm.masked_gmm(x, rhs, jnp.array([4, 9], jnp.int32), x_scale=x_scale, w_scale=rhs_scale,
                          backend=self.backend)
    self.assertEqual((out.shape, out.dtype), ((2, 9, n), jnp.bfloat16))
    np.testing.assert_array_equal(out, 0.0)

  def test_gmm_group_offset_and_bf16_output(self):
    m, k, n = 50, 200, 40
    lhs, lhs_scale = self.quantized((m, k), "1x128", "e4m3fnuz")
    rhs, rhs_scale = self.quantized((2, n, k), "128x128", "e4m3fnuz")
    sizes = np.array([5, 20, 15, 10], np.int32)
    out = jgmm.gmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale, rhs_scale=rhs_scale, transpose_rhs=True,
                   group_offset=1, backend=self.backend)
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs, rhs_scale, "128x128"), sizes,
                      transpose_rhs=True, group_offset=1)
    self.assertEqual(out.dtype, jnp.bfloat16)
    self.assert_close(out, want, 1e-2)

  @parameterized.parameters((1, ("1x128", "128x128")), (7, ("row", "row")), (129, ("1x128", "128x128")),
                            (129, ("row", "128x128")))
  def test_masked_gmm(self, k, recipes):
    groups, max_m, n = 5, 33, 130
    x, x_scale = self.quantized((groups, max_m, k), recipes[0])
    w, w_scale = self.quantized((groups, n, k), recipes[1])
    # Empty, full, random, and out of range both ways (clipped to [0, max_m]).
    masked_m = np.array([0, max_m, self.rng.integers(1, max_m), -4, max_m + 7], np.int32)
    out = jgmm.masked_gmm(x, w, jnp.asarray(masked_m), x_scale=x_scale, w_scale=w_scale,
                          preferred_element_type=jnp.float32, backend=self.backend)
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"), masked_m)
    self.assert_close(out, want)
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(out[3], 0.0)

  @parameterized.parameters((True, False, 129), (False, False, 7), (True, False, 1), (False, True, 129),
                            (True, True, 7))
  def test_tgmm(self, transpose_lhs, transpose_rhs, k):
    m, n = 300, 20  # 128-row scale blocks that span groups
    sizes = np.array([0, 100, 0, 150, 30], np.int32)  # 20 rows in no group
    lhs_mk, rhs_mn = self.normal((m, k)), self.normal((m, n))
    if transpose_lhs:
      lhs, lhs_scale = quantize.quantize(lhs_mk, "128x1")
    else:
      lhs, lhs_scale = quantize.quantize(lhs_mk.T, "1x128")
    if transpose_rhs:
      rhs, rhs_scale = quantize.quantize(rhs_mn.T, "1x128")
    else:
      rhs, rhs_scale = quantize.quantize(rhs_mn, "128x1")
    out = jgmm.tgmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                    transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32,
                    backend=self.backend)
    rhs_deq = oracle.dequantize(rhs, rhs_scale, "1x128" if transpose_rhs else "128x1")
    want, _ = oracle.tgmm(oracle.dequantize(lhs, lhs_scale, "128x1" if transpose_lhs else "1x128"),
                          rhs_deq.T if transpose_rhs else rhs_deq, sizes, transpose_lhs=transpose_lhs)
    self.assert_close(out, want)
    np.testing.assert_array_equal(out[0], 0.0)

  def test_deepgemm_criterion_k7168(self):
    """Quantised 1x128 / 128x128 against the float64 product of the unquantised bf16 inputs, K = 7168."""
    groups, max_m, n, k = 2, 16, 64, 7168
    x = jnp.asarray(self.rng.standard_normal((groups, max_m, k)), jnp.bfloat16)
    w = jnp.asarray(self.rng.standard_normal((groups, n, k)), jnp.bfloat16)
    (xq, xs), (wq, ws) = quantize.quantize(x, "1x128"), quantize.quantize(w, "128x128")
    masked_m = np.array([max_m, 9], np.int32)
    out = jgmm.masked_gmm(xq, wq, jnp.asarray(masked_m), x_scale=xs, w_scale=ws, backend=self.backend)
    self.assertLess(oracle.deepgemm_diff(out, oracle.masked_gmm(x, w, masked_m)), 1e-3)

  def test_nonfinite_and_zero_scales(self):
    """A NaN, inf or zero scale gives what IEEE arithmetic on q * scale gives, in its own rows only; rows past
    masked_m stay exact zeros whatever their scales."""
    groups, max_m, n, k = 2, 8, 16, 40
    x, x_scale = self.quantized((groups, max_m, k), "row")
    w, w_scale = self.quantized((groups, n, k), "row")
    x_scale = x_scale.at[0, 1].set(jnp.nan).at[0, 2].set(jnp.inf).at[0, 3].set(0.0).at[1, 6].set(jnp.nan)
    masked_m = np.array([8, 5], np.int32)
    out = np.asarray(jgmm.masked_gmm(x, w, jnp.asarray(masked_m), x_scale=x_scale, w_scale=w_scale,
                                     preferred_element_type=jnp.float32, backend=self.backend))
    self.assertTrue(np.isnan(out[0, 1]).all())
    self.assertTrue(np.isinf(out[0, 2]).all() or np.isnan(out[0, 2]).any())
    np.testing.assert_array_equal(out[0, 3], 0.0)
    np.testing.assert_array_equal(out[1, 5:], 0.0)  # The NaN scale of row 6 is past masked_m.
    finite = [0, 4, 5, 6, 7]
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "row"), oracle.dequantize(w, w_scale, "row"), masked_m)
    self.assert_close(out[0, finite], want[0, finite])
    self.assert_close(out[1, :5], want[1, :5])

  def test_shard_map_over_experts(self):
    """Expert parallelism: masked FP8 experts and the FP8 recipe's gmm sharded over 8 devices (groups split, the
    scales sharded with their operands; group_offset for the contiguous layout)."""
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("e",))
    groups, max_m, n, k = 8, 6, 16, 136
    x, x_scale = self.quantized((groups, max_m, k), "1x128")
    w, w_scale = self.quantized((groups, n, k), "128x128")
    masked_m = jnp.asarray(self.rng.integers(0, max_m + 1, groups), jnp.int32)
    fn = shard_map(lambda *a: jgmm.masked_gmm(a[0], a[1], a[2], x_scale=a[3], w_scale=a[4],
                                              preferred_element_type=jnp.float32, backend=self.backend),
                   mesh=mesh, in_specs=(P("e"),) * 5, out_specs=P("e"))
    out = jax.jit(fn)(x, w, masked_m, x_scale, w_scale)
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"),
                             masked_m)
    self.assert_close(out, want)
    m = 40
    lhs = jnp.asarray(self.rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(self.rng.standard_normal((groups, k, n)), jnp.float32)
    sizes = jnp.asarray(self.rng.multinomial(m, np.full(groups, 1 / groups)), jnp.int32)

    def local(lhs, rhs, sizes):  # Every device holds all rows and its expert; the partial outputs are summed.
      offset = jax.lax.axis_index("e")
      return jax.lax.psum(jgmm.fp8_gmm(lhs, rhs, sizes, group_offset=offset, backend=self.backend), "e")

    out = jax.jit(shard_map(local, mesh=mesh, in_specs=(P(), P("e"), P()), out_specs=P()))(lhs, rhs, sizes)
    want = jax.jit(lambda: jgmm.fp8_gmm(lhs, rhs, sizes, backend=self.backend))()
    self.assert_close(out, want, 1e-6)

  def test_jit_and_vmap(self):
    groups, max_m, n, k = 3, 8, 16, 40
    x, x_scale = self.quantized((2, groups, max_m, k), "1x128")
    w, w_scale = self.quantized((groups, n, k), "row")
    masked_m = jnp.asarray([3, 8, 0], jnp.int32)
    fn = jax.jit(jax.vmap(lambda a, s: jgmm.masked_gmm(a, w, masked_m, x_scale=s, w_scale=w_scale,
                                                       preferred_element_type=jnp.float32, backend=self.backend)))
    out = fn(x, x_scale)
    for b in range(2):
      self.assert_close(out[b], oracle.masked_gmm(oracle.dequantize(x[b], x_scale[b], "1x128"),
                                                  oracle.dequantize(w, w_scale, "row"), masked_m))

  @parameterized.parameters((False, None, False), (True, None, False), (False, 1, False), (True, 2, False),
                            (False, 3, False), (True, np.array([3]), False), (True, None, True), (False, 1, True))
  def test_tgmm_rhs_scale_per_group(self, transpose_rhs, group_offset, transpose_out):
    """rhs scaled per group and column (rhs_scale_per_group): each row of rhs takes its group's scales (of the
    computed groups, group_offset on, an int or an array of shape (1,); groups past the end are empty); lhs per 128
    rows of M; empty groups are zeros whatever their scales. transpose_out (jgmm.fp8.tgmm's, fp8_gmm's weight
    gradient's): each group's result transposed, (G, N, K)."""
    m, k, n = 300, 129, 20
    sizes = np.array([0, 100, 0, 150, 30], np.int32)  # 20 rows in no group
    num_groups = 3 if group_offset is not None else None
    lhs, lhs_scale = quantize.quantize(self.normal((m, k)), "128x1")
    rhs_mn = np.asarray(quantize.quantize(self.normal((m, n)), "128x1")[0], np.float32)
    group_scale = np.asarray(self.rng.uniform(0.5, 2.0, (5, n)), np.float32)
    group_scale[[0, 2]] = np.nan  # The empty groups'.
    rhs = jnp.asarray(rhs_mn.T if transpose_rhs else rhs_mn, jnp.float8_e4m3fn)
    tgmm = functools.partial(fp8.tgmm, transpose_out=True) if transpose_out else jgmm.tgmm
    out = tgmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale,
               rhs_scale=jnp.asarray(group_scale.T if transpose_rhs else group_scale), transpose_lhs=True,
               transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32, group_offset=group_offset,
               num_actual_groups=num_groups, rhs_scale_per_group=True, backend=self.backend)
    out = np.swapaxes(out, 1, 2) if transpose_out else out
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    group_of_row = np.clip(np.searchsorted(bounds, np.arange(m), side="right") - 1, 0, len(sizes) - 1)
    rhs_deq = rhs_mn.astype(np.float64) * np.nan_to_num(group_scale)[group_of_row]  # Empty groups: no row.
    want, _ = oracle.tgmm(oracle.dequantize(lhs, lhs_scale, "128x1"), rhs_deq, sizes, transpose_lhs=True,
                          group_offset=group_offset, num_actual_groups=num_groups)
    self.assert_close(out, want)
    offset = 0 if group_offset is None else int(np.reshape(group_offset, ()))
    local_sizes = np.concatenate([sizes, np.zeros(3, np.int32)])[offset:offset + out.shape[0]]
    for g in np.flatnonzero(local_sizes == 0):
      np.testing.assert_array_equal(out[g], 0.0)

  def test_tgmm_vmap_m_contiguous(self):
    """vmap over FP8 tgmm's fast layout (lhs (K, M), rhs (N, M)), the batch on rhs and its scales only."""
    m, k, n = 300, 40, 24
    sizes = jnp.asarray([100, 0, 170], jnp.int32)
    lhs, lhs_scale = self.quantized((k, m), "1x128")
    rhs, rhs_scale = self.quantized((2, n, m), "1x128")
    fn = jax.jit(jax.vmap(lambda b, t: jgmm.tgmm(lhs, b, sizes, lhs_scale=lhs_scale, rhs_scale=t, transpose_rhs=True,
                                                 preferred_element_type=jnp.float32, backend=self.backend)))
    out = fn(rhs, rhs_scale)
    for i in range(2):
      want, _ = oracle.tgmm(oracle.dequantize(lhs, lhs_scale, "1x128"),
                            oracle.dequantize(rhs[i], rhs_scale[i], "1x128").T, np.asarray(sizes))
      self.assert_close(out[i], want)


# ---------------------------------------------------------------------------------------------------------------
# Bad calls: each a TypeError / ValueError at trace time naming the argument.

F8 = jnp.float8_e4m3fn
S = jax.ShapeDtypeStruct


def _gmm_args(**changes):
  args = dict(lhs=S((64, 200), F8), rhs=S((4, 96, 200), F8), group_sizes=S((4,), jnp.int32),
              lhs_scale=S((64, 2), jnp.float32), rhs_scale=S((4, 1, 2), jnp.float32), transpose_rhs=True)
  return {**args, **changes}


def _masked_args(**changes):
  args = dict(x=S((4, 32, 200), F8), w=S((4, 96, 200), F8), masked_m=S((4,), jnp.int32),
              x_scale=S((4, 32), jnp.float32), w_scale=S((4, 96), jnp.float32))
  return {**args, **changes}


def _tgmm_args(**changes):
  args = dict(lhs=S((300, 40), F8), rhs=S((300, 24), F8), group_sizes=S((4,), jnp.int32),
              lhs_scale=S((3, 40), jnp.float32), rhs_scale=S((3, 24), jnp.float32), transpose_lhs=True)
  return {**args, **changes}


BAD_CALLS = {
    "gmm_mixed_dtypes": (jgmm.gmm, _gmm_args(rhs=S((4, 96, 200), jnp.bfloat16)), TypeError,
                         r"rhs must have dtype float8_e4m3fn.*bfloat16"),
    "gmm_fp8_without_scales": (jgmm.gmm, _gmm_args(lhs_scale=None, rhs_scale=None), ValueError,
                               r"lhs_scale is required with the FP8 lhs.*\(M,\) = \(64,\).*\(64, 2\).*got None"),
    "gmm_scales_for_bf16": (jgmm.gmm, _gmm_args(lhs=S((64, 200), jnp.bfloat16), rhs=S((4, 96, 200), jnp.bfloat16)),
                            TypeError, r"lhs must have dtype float8_e4m3fn.*bfloat16"),
    "gmm_lhs_scale_shape": (jgmm.gmm, _gmm_args(lhs_scale=S((64, 3), jnp.float32)), ValueError,
                            r"lhs_scale must have shape \(M,\) = \(64,\) \(per row\) or .* = \(64, 2\).*\(64, 3\)"),
    "gmm_rhs_scale_dtype": (jgmm.gmm, _gmm_args(rhs_scale=S((4, 1, 2), jnp.bfloat16)), TypeError,
                            r"rhs_scale must have dtype float32, got shape \(4, 1, 2\) and dtype bfloat16"),
    "gmm_rhs_scale_shape": (jgmm.gmm, _gmm_args(rhs_scale=S((4, 2, 1), jnp.float32)), ValueError,
                            r"rhs_scale must have shape \(G, N\) = \(4, 96\).*\(4, 1, 2\).*got shape \(4, 2, 1\)"),
    "gmm_fp8_mixed_formats": (jgmm.gmm, _gmm_args(rhs=S((4, 96, 200), jnp.float8_e4m3fnuz)), TypeError,
                              r"rhs must have the dtype of lhs \(float8_e4m3fn\)"),
    "gmm_fp8_activation": (jgmm.gmm, _gmm_args(activation="silu"), ValueError,
                           r"activation is not supported with FP8"),
    "gmm_fp8_bias": (jgmm.gmm, _gmm_args(bias=S((4, 96), jnp.float32)), ValueError, r"bias is not supported with FP8"),
    "masked_mixed_dtypes": (jgmm.masked_gmm, _masked_args(x=S((4, 32, 200), jnp.bfloat16)), TypeError,
                            r"x must have dtype float8_e4m3fn.*bfloat16"),
    "masked_without_w_scale": (jgmm.masked_gmm, _masked_args(w_scale=None), ValueError,
                               r"w_scale is required with the FP8 w.*\(G, N\) = \(4, 96\)"),
    "masked_x_scale_shape": (jgmm.masked_gmm, _masked_args(x_scale=S((4, 31), jnp.float32)), ValueError,
                             r"x_scale must have shape \(G, max_m\) = \(4, 32\).*\(4, 32, 2\).*\(4, 31\)"),
    "masked_scale_not_array": (jgmm.masked_gmm, _masked_args(x_scale=2.0), TypeError,
                               r"x_scale must be a float32 array"),
    "tgmm_lhs_scale_shape": (jgmm.tgmm, _tgmm_args(lhs_scale=S((40, 3), jnp.float32)), ValueError,
                             r"lhs_scale must have shape \(cdiv\(M, 128\), K\) = \(3, 40\).*\(40, 3\)"),
    "tgmm_km_lhs_scale_shape": (jgmm.tgmm, _tgmm_args(lhs=S((40, 300), F8), transpose_lhs=False), ValueError,
                                r"lhs_scale must have shape \(K, cdiv\(M, 128\)\) = \(40, 3\).*\(3, 40\)"),
    "tgmm_rhs_scale_missing": (jgmm.tgmm, _tgmm_args(rhs_scale=None), ValueError, r"rhs_scale is required"),
    "tgmm_nm_rhs_scale_shape": (jgmm.tgmm, _tgmm_args(rhs=S((24, 300), F8), transpose_rhs=True), ValueError,
                                r"rhs_scale must have shape \(N, cdiv\(M, 128\)\) = \(24, 3\).*\(3, 24\)"),
    "tgmm_nm_rhs_rows": (jgmm.tgmm, _tgmm_args(rhs=S((300, 24), F8), transpose_rhs=True), ValueError,
                         r"rhs must be \(N, M\) with M = 300 .*got shape \(300, 24\)"),
    "tgmm_bias_grad": (jgmm.tgmm, _tgmm_args(bias_grad=True), ValueError, r"bias_grad is not supported with FP8"),
    "tgmm_per_group_shape": (jgmm.tgmm, _tgmm_args(rhs_scale_per_group=True), ValueError,
                             r"rhs_scale must have shape \(G, N\) = \(4, 24\) \(per group and column\), got shape "
                             r"\(3, 24\)"),
    "tgmm_nm_per_group_shape": (jgmm.tgmm, _tgmm_args(rhs=S((24, 300), F8), rhs_scale=S((4, 24), jnp.float32),
                                                      transpose_rhs=True, rhs_scale_per_group=True), ValueError,
                                r"rhs_scale must have shape \(N, G\) = \(24, 4\)"),
    "tgmm_per_group_without_fp8": (jgmm.tgmm, _tgmm_args(lhs=S((300, 40), jnp.bfloat16), rhs=S((300, 24), jnp.bfloat16),
                                                         lhs_scale=None, rhs_scale=None, rhs_scale_per_group=True),
                                   ValueError, r"rhs_scale_per_group=True applies to FP8 lhs and rhs with lhs_scale"),
    "tgmm_per_group_not_bool": (jgmm.tgmm, _tgmm_args(rhs_scale_per_group=1), TypeError,
                                r"rhs_scale_per_group must be a Python bool, got 1"),
    "tgmm_transpose_out_not_bool": (fp8.tgmm, _tgmm_args(transpose_out="yes"), TypeError,
                                    r"transpose_out must be a Python bool, got 'yes'"),
}


class Fp8BadCallTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(name, *case) for name, case in BAD_CALLS.items()])
  def test_bad_call(self, op, kwargs, error, regex):
    positional = list(kwargs.values())[:3]
    keywords = dict(list(kwargs.items())[3:])
    arrays = {k: v for k, v in keywords.items() if isinstance(v, S)}
    static = {k: v for k, v in keywords.items() if not isinstance(v, S)}
    with self.assertRaisesRegex(error, regex) as raised:
      jax.jit(lambda *p, **a: op(*p, **a, **static)).trace(*positional, **arrays)
    self.assertIs(type(raised.exception), error)


if __name__ == "__main__":
  absltest.main()
