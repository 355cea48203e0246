"""Bad calls: each raises ValueError/TypeError at trace time, with a message naming the argument and what
was expected. Every case runs eagerly, under jax.jit(...).trace and under jax.eval_shape."""
import os
import re
import subprocess
import sys
import textwrap
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import jgmm
from jgmm import oracle, primitives

M, K, N, G = 8, 4, 6, 3
_RNG = np.random.default_rng(20240602)


def _rand(*shape, dtype=jnp.float32):
  return jnp.asarray(_RNG.standard_normal(shape), dtype)


def _sizes(*shape, dtype=jnp.int32):
  return jnp.asarray(_RNG.integers(1, 4, shape), dtype)


LHS, RHS, GS = _rand(M, K), _rand(G, K, N), _sizes(G)
TLHS, TRHS = _rand(K, M), _rand(M, N)  # tgmm: lhs (K, M), rhs (M, N)
X, W, MASKED_M = _rand(2, 5, K), _rand(2, N, K), _sizes(2)  # masked_gmm: x (G, max_m, K), w (G, N, K)


def _gmm(**changes):
  return jgmm.gmm, {"lhs": LHS, "rhs": RHS, "group_sizes": GS, **changes}


def _tgmm(**changes):
  return jgmm.tgmm, {"lhs": TLHS, "rhs": TRHS, "group_sizes": GS, **changes}


def _masked(**changes):
  return jgmm.masked_gmm, {"x": X, "w": W, "masked_m": MASKED_M, **changes}


def _ragged(**changes):
  return jgmm.ragged_dot, {"lhs": LHS, "rhs": RHS, "group_sizes": GS, **changes}


# (name, (op, kwargs), exception, regex on the message). The regex names the argument, what was expected
# and (where there is one) what was seen.
CASES = [
    # gmm: ranks and shapes.
    ("gmm_lhs_rank3", _gmm(lhs=_rand(2, M, K)), ValueError, r"lhs must be 2-D \(M, K\), got shape \(2, 8, 4\)"),
    ("gmm_lhs_rank1", _gmm(lhs=_rand(M)), ValueError, r"lhs must be 2-D \(M, K\), got shape \(8,\)"),
    ("gmm_rhs_rank2", _gmm(rhs=_rand(K, N)), ValueError, r"rhs must be 3-D \(G, K, N\), got shape \(4, 6\)"),
    ("gmm_rhs_rank2_transposed", _gmm(rhs=_rand(N, K), transpose_rhs=True), ValueError,
     r"rhs must be 3-D \(G, N, K\), got shape \(6, 4\)"),
    ("gmm_k_mismatch", _gmm(rhs=_rand(G, K + 1, N)), ValueError,
     r"rhs must have K = 4 .*\(G, K, N\).*got shape \(3, 5, 6\)"),
    ("gmm_k_mismatch_transposed", _gmm(rhs=_rand(G, N, K + 1), transpose_rhs=True), ValueError,
     r"rhs must have K = 4 .*\(G, N, K\).*got shape \(3, 6, 5\)"),
    ("gmm_gnk_weight_without_transpose", _gmm(rhs=_rand(G, N, K)), ValueError,
     r"rhs must have K = 4 .*\(G, K, N\).*got shape \(3, 6, 4\); for a \(G, N, K\) rhs .*pass transpose_rhs=True"),
    ("gmm_gkn_weight_with_transpose", _gmm(rhs=_rand(G, K, N), transpose_rhs=True), ValueError,
     r"rhs must have K = 4 .*\(G, N, K\).*got shape \(3, 4, 6\); for a \(G, K, N\) rhs leave transpose_rhs=False"),
    ("gmm_no_groups", _gmm(rhs=_rand(0, K, N), group_sizes=_sizes(0)), ValueError,
     r"rhs must hold at least one group, got shape \(0, 4, 6\)"),
    # gmm: group_sizes.
    ("gmm_group_sizes_float", _gmm(group_sizes=_rand(G)), TypeError,
     r"group_sizes must have an integer dtype.*got shape \(3,\) and dtype float32"),
    ("gmm_group_sizes_bool", _gmm(group_sizes=jnp.array([True, False, True])), TypeError,
     r"group_sizes must have an integer dtype.*dtype bool"),
    ("gmm_group_sizes_rank2", _gmm(group_sizes=_sizes(G, 1)), ValueError,
     r"group_sizes must be 1-D \(G,\), got shape \(3, 1\)"),
    ("gmm_group_sizes_scalar", _gmm(group_sizes=jnp.int32(M)), ValueError,
     r"group_sizes must be 1-D \(G,\), got shape \(\)"),
    ("gmm_group_sizes_too_short", _gmm(group_sizes=_sizes(G - 1)), ValueError,
     r"group_sizes must have shape \(G,\) = \(3,\) matching rhs \(3, 4, 6\), got shape \(2,\)"),
    ("gmm_group_sizes_too_long_without_offset", _gmm(group_sizes=_sizes(G + 1)), ValueError,
     r"group_sizes must have shape \(G,\) = \(3,\).*got shape \(4,\).*group_offset"),
    ("gmm_group_sizes_shorter_than_rhs_with_offset", _gmm(group_sizes=_sizes(G - 1), group_offset=0),
     ValueError, r"group_sizes must have at least G = 3 entries.*got shape \(2,\)"),
    ("gmm_group_sizes_list", _gmm(group_sizes=[3, 3, 2]), TypeError,
     r"group_sizes must be an array of shape \(G,\), got list"),
    # gmm: dtypes and non-arrays.
    ("gmm_lhs_int8", _gmm(lhs=_rand(M, K, dtype=jnp.int8), rhs=_rand(G, K, N, dtype=jnp.int8)), TypeError,
     r"lhs must have dtype float32, bfloat16 or float16, got shape \(8, 4\) and dtype int8"),
    # float64 with x64 off: only a numpy array can hold it; it is refused, not silently downcast.
    ("gmm_lhs_numpy_float64", _gmm(lhs=np.asarray(LHS, np.float64)), TypeError,
     r"lhs must have dtype float32, bfloat16 or float16, got shape \(8, 4\) and dtype float64"),
    ("gmm_rhs_dtype_mismatch", _gmm(rhs=_rand(G, K, N, dtype=jnp.bfloat16)), TypeError,
     r"rhs must have the dtype of lhs \(float32\), got shape \(3, 4, 6\) and dtype bfloat16"),
    ("gmm_lhs_list", _gmm(lhs=np.asarray(LHS).tolist()), TypeError,
     r"lhs must be an array of shape \(M, K\), got list"),
    ("gmm_rhs_none", _gmm(rhs=None), TypeError, r"rhs must be an array of shape \(G, K, N\), got NoneType"),
    # gmm: bias and existing_out.
    ("gmm_bias_wrong_n", _gmm(bias=_rand(G, N - 1)), ValueError,
     r"bias must have shape \(G, N\) = \(3, 6\), got shape \(3, 5\)"),
    ("gmm_bias_rank1", _gmm(bias=_rand(N)), ValueError, r"bias must be 2-D \(G, N\), got shape \(6,\)"),
    ("gmm_bias_int", _gmm(bias=_sizes(G, N)), TypeError,
     r"bias must have dtype float32, bfloat16 or float16, got shape \(3, 6\) and dtype int32"),
    ("gmm_existing_out_wrong_shape", _gmm(existing_out=_rand(M, N - 1)), ValueError,
     r"existing_out must have shape \(M, N_out\) = \(8, 6\), got shape \(8, 5\)"),
    ("gmm_existing_out_swiglu_shape", _gmm(existing_out=_rand(M, N), activation="swiglu"), ValueError,
     r"existing_out must have shape \(M, N_out\) = \(8, 3\), got shape \(8, 6\)"),
    ("gmm_existing_out_wrong_dtype", _gmm(existing_out=_rand(M, N, dtype=jnp.float16)), TypeError,
     r"existing_out must have the output dtype float32, got shape \(8, 6\) and dtype float16"),
    ("gmm_existing_out_not_preferred_type",
     _gmm(existing_out=_rand(M, N), preferred_element_type=jnp.bfloat16), TypeError,
     r"existing_out must have the output dtype bfloat16, got shape \(8, 6\) and dtype float32"),
    # gmm: group_offset.
    ("gmm_group_offset_float_array", _gmm(group_offset=jnp.float32(1)), TypeError,
     r"group_offset must be an int or an integer array of shape \(\) or \(1,\)"),
    ("gmm_group_offset_python_float", _gmm(group_offset=1.0), TypeError,
     r"group_offset must be an int or an integer array of shape \(\) or \(1,\), got 1.0"),
    ("gmm_group_offset_bool", _gmm(group_offset=True), TypeError,
     r"group_offset must be an int or an integer array.*got True"),
    ("gmm_group_offset_vector", _gmm(group_offset=jnp.array([0, 1], jnp.int32)), ValueError,
     r"group_offset must have shape \(\) or \(1,\), got shape \(2,\) and dtype int32"),
    # gmm: static options.
    ("gmm_bad_activation", _gmm(activation="tanh"), ValueError, r"activation must be one of .*'swiglu'.*got 'tanh'"),
    ("gmm_swiglu_odd_n", _gmm(rhs=_rand(G, K, 5), activation="swiglu"), ValueError,
     r"activation='swiglu' needs an even N .*got N = 5"),
    ("gmm_preferred_int32", _gmm(preferred_element_type=jnp.int32), TypeError,
     r"preferred_element_type must be float32, bfloat16 or float16 or None, got int32"),
    ("gmm_preferred_float64", _gmm(preferred_element_type=np.float64), TypeError,
     r"preferred_element_type must be float32, bfloat16 or float16 or None, got float64"),
    ("gmm_preferred_not_a_dtype", _gmm(preferred_element_type="float33"), TypeError,
     r"preferred_element_type must be a dtype \(float32, bfloat16 or float16\) or None, got 'float33'"),
    ("gmm_backend_unknown", _gmm(backend="cuda"), ValueError, r"backend must be None, 'triton' or 'xla', got 'cuda'"),
    ("gmm_backend_case", _gmm(backend="XLA"), ValueError, r"backend must be None, 'triton' or 'xla', got 'XLA'"),
    ("gmm_transpose_rhs_int", _gmm(transpose_rhs=1), TypeError, r"transpose_rhs must be a Python bool, got 1"),
    ("gmm_transpose_rhs_numpy_bool", _gmm(transpose_rhs=np.bool_(False)), TypeError,
     r"transpose_rhs must be a Python bool, got .*False"),
    ("gmm_config_unknown_key", _gmm(config={"block_q": 64}), ValueError,
     r"config has unknown keys \['block_q'\]; expected fields of jgmm.Config"),
    ("gmm_config_block_not_power_of_two", _gmm(config={"block_m": 100}), ValueError,
     r"config.block_m must be a power of two in \(16, 32, 64, 128, 256, 512\) \(or 192\), got 100"),
    ("gmm_config_rows_192_bf16", _gmm(config={"block_m": 192}), ValueError,
     r"config.block_m = 192 applies to FP8 gmm with transpose_rhs=True and FP8 masked_gmm only"),
    ("gmm_config_num_warps_3", _gmm(config={"num_warps": 3}), ValueError,
     r"config.num_warps must be one of 1, 2, 4, 8, 16, got 3"),
    ("gmm_config_string", _gmm(config="fast"), TypeError, r"config must be a jgmm.Config, a dict or None, got str"),
    # tgmm.
    ("tgmm_lhs_rank3", _tgmm(lhs=_rand(1, K, M)), ValueError, r"lhs must be 2-D \(K, M\), got shape \(1, 4, 8\)"),
    ("tgmm_rhs_rank3", _tgmm(rhs=_rand(1, M, N)), ValueError, r"rhs must be 2-D \(M, N\), got shape \(1, 8, 6\)"),
    ("tgmm_m_mismatch", _tgmm(rhs=_rand(M - 1, N)), ValueError,
     r"rhs must be \(M, N\) with M = 8 \(lhs is \(4, 8\) in layout \(K, M\)\), got shape \(7, 6\)"),
    ("tgmm_m_mismatch_transpose_lhs", _tgmm(lhs=_rand(M, K), rhs=_rand(K, N), transpose_lhs=True), ValueError,
     r"rhs must be \(M, N\) with M = 8 \(lhs is \(8, 4\) in layout \(M, K\)\), got shape \(4, 6\)"),
    ("tgmm_rhs_dtype_mismatch", _tgmm(rhs=_rand(M, N, dtype=jnp.float16)), TypeError,
     r"rhs must have the dtype of lhs \(float32\), got shape \(8, 6\) and dtype float16"),
    ("tgmm_lhs_int32", _tgmm(lhs=_sizes(K, M), rhs=_sizes(M, N)), TypeError,
     r"lhs must have dtype float32, bfloat16 or float16, got shape \(4, 8\) and dtype int32"),
    ("tgmm_no_groups", _tgmm(group_sizes=_sizes(0)), ValueError,
     r"group_sizes must hold at least one group, got shape \(0,\)"),
    ("tgmm_group_sizes_float", _tgmm(group_sizes=_rand(G)), TypeError,
     r"group_sizes must have an integer dtype.*dtype float32"),
    ("tgmm_num_actual_groups_zero", _tgmm(num_actual_groups=0, group_offset=0), ValueError,
     r"num_actual_groups must be a Python int in \[1, 3\] \(len\(group_sizes\)\) or None, got 0"),
    ("tgmm_num_actual_groups_too_many", _tgmm(num_actual_groups=G + 1, group_offset=0), ValueError,
     r"num_actual_groups must be a Python int in \[1, 3\].*got 4"),
    ("tgmm_num_actual_groups_float", _tgmm(num_actual_groups=2.0, group_offset=0), TypeError,
     r"num_actual_groups must be a Python int in \[1, 3\].*got 2.0"),
    ("tgmm_num_actual_groups_without_offset", _tgmm(num_actual_groups=2), ValueError,
     r"num_actual_groups < len\(group_sizes\) needs group_offset.*num_actual_groups=2"),
    ("tgmm_group_offset_matrix", _tgmm(group_offset=_sizes(1, 1)), ValueError,
     r"group_offset must have shape \(\) or \(1,\), got shape \(1, 1\)"),
    ("tgmm_existing_out_wrong_shape", _tgmm(existing_out=_rand(G, K, N + 1)), ValueError,
     r"existing_out must have shape \(G, K, N\) = \(3, 4, 6\), got shape \(3, 4, 7\)"),
    ("tgmm_existing_out_all_groups_with_num_actual",
     _tgmm(existing_out=_rand(G, K, N), num_actual_groups=2, group_offset=1), ValueError,
     r"existing_out must have shape \(G, K, N\) = \(2, 4, 6\), got shape \(3, 4, 6\)"),
    ("tgmm_existing_out_rank2", _tgmm(existing_out=_rand(K, N)), ValueError,
     r"existing_out must be 3-D \(G, K, N\), got shape \(4, 6\)"),
    ("tgmm_existing_out_wrong_dtype", _tgmm(existing_out=_rand(G, K, N, dtype=jnp.bfloat16)), TypeError,
     r"existing_out must have the output dtype float32, got shape \(3, 4, 6\) and dtype bfloat16"),
    ("tgmm_bias_grad_string", _tgmm(bias_grad="yes"), TypeError, r"bias_grad must be a Python bool, got 'yes'"),
    ("tgmm_transpose_lhs_none", _tgmm(transpose_lhs=None), TypeError, r"transpose_lhs must be a Python bool, got None"),
    ("tgmm_preferred_int8", _tgmm(preferred_element_type=jnp.int8), TypeError,
     r"preferred_element_type must be float32, bfloat16 or float16 or None, got int8"),
    ("tgmm_backend_unknown", _tgmm(backend="gpu"), ValueError, r"backend must be None, 'triton' or 'xla', got 'gpu'"),
    ("tgmm_config_rows_192", _tgmm(config={"block_m": 192}), ValueError, r"config.block_m = 192 applies to FP8 gmm"),
    ("tgmm_config_bad_type", _tgmm(config=["block_m", 64]), TypeError,
     r"config must be a jgmm.Config, a dict or None, got list"),
    # masked_gmm.
    ("masked_x_rank2", _masked(x=_rand(5, K)), ValueError, r"x must be 3-D \(G, max_m, K\), got shape \(5, 4\)"),
    ("masked_w_rank2", _masked(w=_rand(N, K)), ValueError, r"w must be 3-D \(G, N, K\), got shape \(6, 4\)"),
    ("masked_w_group_mismatch", _masked(w=_rand(3, N, K)), ValueError,
     r"w must be \(G, N, K\) with G = 2 and K = 4 \(x is \(2, 5, 4\)\), got shape \(3, 6, 4\)"),
    ("masked_w_k_mismatch", _masked(w=_rand(2, N, K + 1)), ValueError,
     r"w must be \(G, N, K\) with G = 2 and K = 4 .*got shape \(2, 6, 5\)"),
    ("masked_w_dtype_mismatch", _masked(w=_rand(2, N, K, dtype=jnp.float16)), TypeError,
     r"w must have the dtype of x \(float32\), got shape \(2, 6, 4\) and dtype float16"),
    ("masked_x_int8", _masked(x=_rand(2, 5, K, dtype=jnp.int8)), TypeError,
     r"x must have dtype float32, bfloat16 or float16, got shape \(2, 5, 4\) and dtype int8"),
    ("masked_m_wrong_length", _masked(masked_m=_sizes(3)), ValueError,
     r"masked_m must have shape \(G,\) = \(2,\), got shape \(3,\)"),
    ("masked_m_rank2", _masked(masked_m=_sizes(2, 1)), ValueError, r"masked_m must be 1-D \(G,\), got shape \(2, 1\)"),
    ("masked_m_float", _masked(masked_m=_rand(2)), TypeError,
     r"masked_m must have an integer dtype.*got shape \(2,\) and dtype float32"),
    ("masked_m_tuple", _masked(masked_m=(1, 2)), TypeError, r"masked_m must be an array of shape \(G,\), got tuple"),
    ("masked_expected_m_negative", _masked(expected_m=-1), ValueError,
     r"expected_m must be a non-negative Python int or None, got -1"),
    ("masked_expected_m_float", _masked(expected_m=2.0), TypeError,
     r"expected_m must be a non-negative Python int or None, got 2.0"),
    ("gmm_group_offset_past_int32", _gmm(group_offset=2**40), ValueError,
     r"group_offset must fit in int32, got 1099511627776"),
    ("masked_preferred_bool", _masked(preferred_element_type=jnp.bool_), TypeError,
     r"preferred_element_type must be float32, bfloat16 or float16 or None, got bool"),
    ("masked_backend_unknown", _masked(backend="pallas"), ValueError,
     r"backend must be None, 'triton' or 'xla', got 'pallas'"),
    ("masked_config_rows_192_bf16", _masked(config={"block_m": 192}), ValueError,
     r"config.block_m = 192 applies to FP8 gmm with transpose_rhs=True and FP8 masked_gmm only"),
    ("masked_config_num_stages", _masked(config={"num_stages": 0}), ValueError,
     r"config.num_stages must be an int in \[1, 8\], got 0"),
    # ragged_dot (the drop-in) goes through the same checks.
    ("ragged_dot_k_mismatch", _ragged(rhs=_rand(G, K + 2, N)), ValueError, r"rhs must have K = 4 .*got shape \(3, 6, 6\)"),
    ("ragged_dot_group_sizes_length", _ragged(group_sizes=_sizes(G + 2)), ValueError,
     r"group_sizes must have shape \(G,\) = \(3,\).*got shape \(5,\)"),
    ("ragged_dot_group_sizes_float", _ragged(group_sizes=_rand(G)), TypeError,
     r"group_sizes must have an integer dtype.*dtype float32"),
]

# jgmm.Config built directly (not traced: it is a static value).
CONFIG_CASES = [
    ("block_m_100", {"block_m": 100}, ValueError, r"config.block_m must be a power of two .*got 100"),
    ("block_n_1024", {"block_n": 1024}, ValueError, r"config.block_n must be a power of two .*got 1024"),
    ("block_k_8", {"block_k": 8}, ValueError, r"config.block_k must be a power of two in \(16, .*got 8"),
    ("block_k_float", {"block_k": 64.0}, TypeError, r"config.block_k must be a Python int, got 64.0"),
    ("num_warps_3", {"num_warps": 3}, ValueError, r"config.num_warps must be one of 1, 2, 4, 8, 16, got 3"),
    ("num_stages_9", {"num_stages": 9}, ValueError, r"config.num_stages must be an int in \[1, 8\], got 9"),
    ("persistent_int", {"persistent": 1}, TypeError, r"config.persistent must be a bool, got 1"),
    ("programs_per_sm_0", {"programs_per_sm": 0}, ValueError,
     r"config.programs_per_sm must be an int in \[1, 4\], got 0"),
    ("programs_per_sm_float", {"programs_per_sm": 2.0}, TypeError,
     r"config.programs_per_sm must be a Python int, got 2.0"),
    ("tma_str", {"tma": "yes"}, TypeError, r"config.tma must be a bool, got 'yes'"),
    ("tma_store_int", {"tma_store": 1}, TypeError, r"config.tma_store must be a bool, got 1"),
    ("band_tiles_0", {"band_tiles": 0}, ValueError, r"config.band_tiles must be an int in \[1, 64\], got 0"),
    ("band_tiles_float", {"band_tiles": 8.0}, TypeError, r"config.band_tiles must be a Python int, got 8.0"),
    ("cluster_size_4", {"cluster_size": 4}, ValueError, r"config.cluster_size must be 1 or 2, got 4"),
    ("tail_split_int", {"tail_split": 1}, TypeError, r"config.tail_split must be a bool, got 1"),
    ("tail_split_block_n_64", {"tail_split": True, "block_n": 64}, ValueError,
     r"config.tail_split needs block_n >= 128 \(halves of 64 columns or more\), got block_n 64"),
]


def _traced_call(op, kwargs, trace):
  """Calls op with its array arguments as jit/eval_shape inputs; the other arguments are static."""
  arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
  static = {k: v for k, v in kwargs.items() if k not in arrays}
  fn = lambda arrays: op(**arrays, **static)
  if trace == "eager":
    return fn(arrays)
  if trace == "jit_trace":
    return jax.jit(fn).trace(arrays)
  return jax.eval_shape(fn, {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in arrays.items()})


class BadCallTest(parameterized.TestCase):

  def test_catalogue_size(self):
    self.assertGreaterEqual(len(CASES) + len(CONFIG_CASES), 35)
    self.assertLen({name for name, *_ in CASES}, len(CASES))

  @parameterized.named_parameters(
      (f"{name}_{trace}", call, error, regex, trace)
      for name, call, error, regex in CASES for trace in ("eager", "jit_trace", "eval_shape"))
  def test_bad_call(self, call, error, regex, trace):
    op, kwargs = call
    with self.assertRaisesRegex(error, regex) as raised:
      _traced_call(op, kwargs, trace)
    self.assertIs(type(raised.exception), error)  # not a subclass (e.g. a jax-internal error type)

  @parameterized.named_parameters(CONFIG_CASES)
  def test_bad_config(self, fields, error, regex):
    with self.assertRaisesRegex(error, regex):
      jgmm.Config(**fields)


class GoodCallControlTest(absltest.TestCase):
  """The unchanged arguments the bad calls start from are valid: each error comes from the one change."""

  def test_baselines_match_oracle(self):
    self.enter_context(jax.default_matmul_precision("float32"))  # No TF32 on GPUs: exact float32 products.
    self.assertLess(oracle.rel_err(jgmm.gmm(LHS, RHS, GS), oracle.gmm(LHS, RHS, GS)), 1e-5)
    self.assertLess(oracle.rel_err(jgmm.ragged_dot(LHS, RHS, GS), oracle.gmm(LHS, RHS, GS)), 1e-5)
    self.assertLess(oracle.rel_err(jgmm.tgmm(TLHS, TRHS, GS), oracle.tgmm(TLHS, TRHS, GS)[0]), 1e-5)
    self.assertLess(oracle.rel_err(jgmm.masked_gmm(X, W, MASKED_M), oracle.masked_gmm(X, W, MASKED_M)), 1e-5)

  def test_edge_values_that_are_valid(self):
    offset_out = jgmm.gmm(LHS, RHS[:2], _sizes(G + 2), group_offset=np.int64(1))  # numpy int scalar offset
    self.assertEqual(offset_out.shape, (M, N))
    self.assertEqual(jgmm.masked_gmm(X, W, MASKED_M, expected_m=0).shape, (2, 5, N))
    self.assertEqual(jgmm.gmm(LHS, RHS, GS, config=jgmm.Config(block_m=16)).shape, (M, N))


class TritonOnCpuTest(parameterized.TestCase):
  """backend="triton" where Triton cannot run (the CPU, no TRITON_INTERPRET) is a clear error, not a crash."""

  @parameterized.named_parameters(
      ("gmm", lambda: jgmm.gmm(_rand(13, 11), _rand(3, 11, 7), jnp.array([5, 0, 8]), backend="triton")),
      ("tgmm", lambda: jgmm.tgmm(_rand(11, 13), _rand(13, 7), jnp.array([5, 0, 8]), backend="triton")),
      ("masked_gmm", lambda: jgmm.masked_gmm(_rand(3, 13, 11), _rand(3, 7, 11), jnp.array([5, 0, 8]),
                                             backend="triton")),
  )
  def test_triton_backend_on_cpu(self, call):
    if jax.default_backend() != "cpu":
      self.skipTest(f"checks the CPU platform; the default backend is {jax.default_backend()}")
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with mock.patch.dict(os.environ, environ, clear=True):
      with self.assertRaises(Exception) as raised:
        jax.block_until_ready(call())
    message = str(raised.exception)
    self.assertNotIsInstance(raised.exception, ImportError, message)
    self.assertRegex(message, re.compile(r"triton", re.I))
    self.assertRegex(message, re.compile(r"\bcpu\b|platform", re.I))


class TritonMissingTest(absltest.TestCase):
  """backend="triton" where the triton package is not installed: an error naming the fix, whatever the platform."""

  def test_missing_triton_names_the_fix(self):
    # A fresh process in which `import triton` fails, as where triton is not installed (None in sys.modules).
    program = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None
        import jax.numpy as jnp
        import jgmm
        try:
          jgmm.gmm(jnp.ones((17, 5)), jnp.ones((2, 5, 3)), jnp.array([9, 8]), backend="triton")
        except ModuleNotFoundError as e:
          print(e)
        """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    for fix in ("needs the triton package", "pip install triton", "jgmm[cuda]", "backend='xla'"):
      self.assertIn(fix, result.stdout)

  def test_other_missing_modules_are_not_reworded(self):
    with mock.patch.object(primitives.importlib, "import_module",
                           side_effect=ModuleNotFoundError("No module named 'numpy.foo'", name="numpy.foo")):
      with self.assertRaisesRegex(ModuleNotFoundError, r"^No module named 'numpy.foo'$"):
        primitives._backend_module("triton", "cuda", static_shapes=True)


if __name__ == "__main__":
  absltest.main()
