"""FP8 grouped GEMMs with fine-grained scales (DeepGEMM style), reached through jgmm.gmm / masked_gmm / tgmm.

An FP8 operand q (float8_e4m3fn on NVIDIA, float8_e4m3fnuz on ROCm) comes with float32 scales s and stands for
q * s, each scale over its block (jgmm.quantize makes both). Products accumulate in float32 and are written in
bfloat16 by default (float16 or float32 on request). Two recipes, told apart by the scales' shapes, and mixable:
  per row / per channel: lhs_scale (M,) or x_scale (G, max_m); rhs_scale / w_scale (G, N);
  DeepSeek-V3 blocks: activations 1x128, lhs_scale (M, cdiv(K, 128)) or x_scale (G, max_m, cdiv(K, 128));
    weights 128x128, rhs_scale / w_scale (G, cdiv(N, 128), cdiv(K, 128)), whatever rhs's layout.
K need not be a multiple of 128 (the last block is partial). Zero, inf or NaN scales propagate as IEEE
arithmetic says (a row with an inf scale gives inf or NaN; rows >= masked_m[g] stay exact zeros).

Layouts. Hopper's FP8 tensor cores (wgmma) read both operands K-major. masked_gmm's w (G, N, K) and gmm's rhs with
transpose_rhs=True (G, N, K) are; gmm's rhs (G, K, N) works too (Triton transposes tiles in shared memory on the
way), at some speed cost: store FP8 weights as (G, N, K).

tgmm (the weight gradient out[g] = lhs[rows of g]^T @ rhs[rows of g]) contracts over the grouped M dimension, so
its scales run along M: blocks of 128 rows of one column, on the global grid of M (row r is in block r // 128,
whatever group it belongs to; a block may span two groups, which is exact: scales are per element).
lhs_scale is (cdiv(M, 128), K) for lhs (M, K) (transpose_lhs, `quantize(lhs, "128x1")`) or (K, cdiv(M, 128))
for lhs (K, M) (`quantize(lhs, "1x128")`); rhs_scale (cdiv(M, 128), N) (`quantize(rhs, "128x1")`).

Each op is a primitive (jgmm.primitives) lowering to backend_*.<op>_fp8. There are no derivative rules: FP8
operands are inputs of a training recipe (`fp8_gmm`), not variables to differentiate.
"""
import jax
import jax.numpy as jnp

from jgmm import ops, primitives, validation


def requested(operands, scales):
  """Whether a call is an FP8 one: any scale given (not None) or any FP8 operand."""
  return any(s is not None for s in scales) or any(validation.is_fp8(a) for a in operands)


def _gmm_shapes(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_rhs, out_dtype, config):
  del bounds, lhs_scale, rhs_scale, config
  return [jax.core.ShapedArray((lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2]), out_dtype)]


def _masked_gmm_shapes(x, w, masked_m, x_scale, w_scale, *, out_dtype, expected_m, config):
  del masked_m, x_scale, w_scale, expected_m, config
  return [jax.core.ShapedArray((*x.shape[:2], w.shape[1]), out_dtype)]


def _tgmm_shapes(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_lhs, out_dtype, config):
  del lhs_scale, rhs_scale, config
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  return [jax.core.ShapedArray((bounds.shape[0] - 1, k, rhs.shape[1]), out_dtype)]


_gmm_p = primitives._define("gmm_fp8", _gmm_shapes)
_masked_gmm_p = primitives._define("masked_gmm_fp8", _masked_gmm_shapes)
_tgmm_p = primitives._define("tgmm_fp8", _tgmm_shapes)


def gmm(lhs, rhs, group_sizes, *, lhs_scale, rhs_scale, bias=None, transpose_rhs=False, preferred_element_type=None,
        group_offset=None, existing_out=None, activation=None, config=None, backend=None):
  """jgmm.gmm with FP8 lhs (M, K) and rhs (G, K, N) / (G, N, K): see the module docstring for the scales.
  bias, existing_out and activation are not supported with FP8 (a clear error)."""
  out_dtype, config, backend = validation.check_gmm_fp8(
      lhs, rhs, group_sizes, lhs_scale, rhs_scale, bias, transpose_rhs, preferred_element_type, group_offset,
      existing_out, activation, config, backend)
  bounds = ops.group_bounds(group_sizes, group_offset, rhs.shape[0], lhs.shape[0])
  (out,) = _gmm_p(*ops._vary_alike(lhs, rhs, bounds, lhs_scale, rhs_scale), transpose_rhs=transpose_rhs,
                  out_dtype=out_dtype, config=config, backend=backend)
  return out


def masked_gmm(x, w, masked_m, *, x_scale, w_scale, preferred_element_type=None, expected_m=None, config=None,
               backend=None):
  """jgmm.masked_gmm with FP8 x (G, max_m, K) and w (G, N, K): see the module docstring for the scales."""
  out_dtype, config, backend = validation.check_masked_gmm_fp8(x, w, masked_m, x_scale, w_scale,
                                                               preferred_element_type, expected_m, config, backend)
  masked_m = jnp.clip(masked_m, 0, x.shape[1]).astype(jnp.int32)
  (out,) = _masked_gmm_p(*ops._vary_alike(x, w, masked_m, x_scale, w_scale), out_dtype=out_dtype,
                         expected_m=expected_m, config=config, backend=backend)
  return out


def tgmm(lhs, rhs, group_sizes, *, lhs_scale, rhs_scale, transpose_lhs=False, preferred_element_type=None,
         group_offset=None, num_actual_groups=None, existing_out=None, bias_grad=False, config=None, backend=None):
  """jgmm.tgmm with FP8 lhs (K, M) / (M, K) and rhs (M, N), scales along M: see the module docstring.
  existing_out and bias_grad are not supported with FP8 (a clear error)."""
  m, num_groups, out_dtype, config, backend = validation.check_tgmm_fp8(
      lhs, rhs, group_sizes, lhs_scale, rhs_scale, transpose_lhs, preferred_element_type, group_offset,
      num_actual_groups, existing_out, bias_grad, config, backend)
  bounds = ops.group_bounds(group_sizes, group_offset, num_groups, m)
  (out,) = _tgmm_p(*ops._vary_alike(lhs, rhs, bounds, lhs_scale, rhs_scale), transpose_lhs=transpose_lhs,
                   out_dtype=out_dtype, config=config, backend=backend)
  return out
