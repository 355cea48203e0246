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
for lhs (K, M) (`quantize(lhs, "1x128")`); rhs_scale (cdiv(M, 128), N) for rhs (M, N) (`quantize(rhs, "128x1")`)
or (N, cdiv(M, 128)) for rhs (N, M) (transpose_rhs, `quantize(rhs, "1x128")`). Store both M-contiguous, lhs (K, M)
and rhs (N, M): Hopper's FP8 wgmma reads K-major operands (the contracted M here), and the kernel transposes any
other layout through registers, unpipelined (on an H100 at M = 32768, K = 7168, N = 4096, G = 32: 27.4 ms for
lhs (M, K) with rhs (M, N); 2.9 ms for lhs (K, M) with rhs (N, M), where a warp-specialised kernel runs;
docs/perf-notes.md).

Each op is a primitive (jgmm.primitives) lowering to backend_*.<op>_fp8. There are no derivative rules: FP8
operands are inputs of a training recipe (`fp8_gmm`), not variables to differentiate.

`fp8_gmm` is that recipe (DeepSeek-V3's): a gmm of bf16/fp32 operands computed in FP8, forward and backward (its
weight gradient's lhs^T and dout^T with each group padded to the 128-row grid where that is cheap, so that no scale
block spans two groups);
`quantize_weights` quantises its weights ahead (`Fp8Weights`, fp8_gmm's rhs_fp8), once for the calls of a step
that reuse them.
"""
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jgmm import ops, primitives, quantize, validation


def _gmm_shapes(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_rhs, out_dtype, config):
  del bounds, lhs_scale, rhs_scale, config
  return [jax.core.ShapedArray((lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2]), out_dtype)]


def _masked_gmm_shapes(x, w, masked_m, x_scale, w_scale, *, out_dtype, expected_m, config):
  del masked_m, x_scale, w_scale, expected_m, config
  return [jax.core.ShapedArray((*x.shape[:2], w.shape[1]), out_dtype)]


def _tgmm_shapes(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_lhs, transpose_rhs, out_dtype, config,
                 rhs_scale_per_group=False, transpose_out=False):
  del lhs_scale, rhs_scale, config, rhs_scale_per_group
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  n = rhs.shape[0] if transpose_rhs else rhs.shape[1]
  return [jax.core.ShapedArray((bounds.shape[0] - 1, *((n, k) if transpose_out else (k, n))), out_dtype)]


def _quantize_pair_shapes(x, *, recipe, dtype):
  *batch, r, c = x.shape
  rb, cb = -(-r // 128), -(-c // 128)
  scales = [(r, cb), (c, rb)] if recipe == "1x128" else [(*batch, rb, cb), (*batch, cb, rb)]
  return [jax.core.ShapedArray(x.shape, dtype), jax.core.ShapedArray(scales[0], jnp.float32),
          jax.core.ShapedArray((*batch, c, r), dtype), jax.core.ShapedArray(scales[1], jnp.float32)]


def _quantize_pair_grouped_shapes(x, blocks, *, dtype, num_groups=None):
  r, c = x.shape
  padded_blocks = blocks.shape[1]
  return [jax.core.ShapedArray(x.shape, dtype), jax.core.ShapedArray((r, -(-c // 128)), jnp.float32),
          jax.core.ShapedArray((c, 128 * padded_blocks), dtype),
          jax.core.ShapedArray((c, padded_blocks if num_groups is None else num_groups), jnp.float32)]


_gmm_p = primitives._define("gmm_fp8", _gmm_shapes)
_quantize_pair_p = primitives._define("quantize_pair", _quantize_pair_shapes)
_quantize_pair_grouped_p = primitives._define("quantize_pair_grouped", _quantize_pair_grouped_shapes)
_masked_gmm_p = primitives._define("masked_gmm_fp8", _masked_gmm_shapes)
_tgmm_p = primitives._define("tgmm_fp8", _tgmm_shapes)


def gmm(lhs, rhs, group_sizes, *, lhs_scale, rhs_scale, bias=None, transpose_rhs=False, preferred_element_type=None,
        group_offset=None, existing_out=None, activation=None, precision=None, config=None, backend=None):
  """jgmm.gmm with FP8 lhs (M, K) and rhs (G, K, N) / (G, N, K): see the module docstring for the scales.
  bias, existing_out, activation and precision are not supported with FP8 (a clear error)."""
  out_dtype, config, backend = validation.check_gmm_fp8(
      lhs, rhs, group_sizes, lhs_scale, rhs_scale, bias, transpose_rhs, preferred_element_type, group_offset,
      existing_out, activation, precision, config, backend)
  bounds = ops.group_bounds(group_sizes, group_offset, rhs.shape[0], lhs.shape[0])
  (out,) = _gmm_p(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs, out_dtype=out_dtype,
                  config=config, backend=backend)
  return out


def masked_gmm(x, w, masked_m, *, x_scale, w_scale, preferred_element_type=None, expected_m=None, precision=None,
               config=None, backend=None):
  """jgmm.masked_gmm with FP8 x (G, max_m, K) and w (G, N, K): see the module docstring for the scales."""
  out_dtype, config, backend = validation.check_masked_gmm_fp8(
      x, w, masked_m, x_scale, w_scale, preferred_element_type, expected_m, precision, config, backend)
  (out,) = _masked_gmm_p(x, w, ops.clip_to_int32(masked_m, x.shape[1]), x_scale, w_scale, out_dtype=out_dtype,
                         expected_m=expected_m, config=config, backend=backend)
  return out


def tgmm(lhs, rhs, group_sizes, *, lhs_scale, rhs_scale, transpose_lhs=False, transpose_rhs=False,
         preferred_element_type=None, group_offset=None, num_actual_groups=None, existing_out=None, bias_grad=False,
         precision=None, config=None, backend=None, rhs_scale_per_group: bool = False, transpose_out: bool = False):
  """jgmm.tgmm with FP8 lhs (K, M) / (M, K) and rhs (M, N) / (N, M), scales along M: see the module docstring
  (lhs (K, M) and rhs (N, M) are the fast layouts on Hopper). rhs_scale_per_group: rhs_scale holds one scale per
  group of group_sizes and column instead, (G, N) for rhs (M, N) or (N, G) for rhs (N, M) (fp8_gmm's
  wgrad_scale="group"; the kernels apply it once per output tile, not per 128 rows, so an inf scale meets the
  tile's sum: inf, or NaN where that sum is 0, where the portable backend, scaling rhs first, gives NaN wherever a
  product is 0). transpose_out: return (G, N, K), each out[g] transposed (the kernels store their tiles so: fp8_gmm's
  weight gradient where the operand scaled per group is not the one the weights' layout puts second). existing_out,
  bias_grad and precision are not supported with FP8 (a clear error)."""
  m, num_groups, out_dtype, config, backend = validation.check_tgmm_fp8(
      lhs, rhs, group_sizes, lhs_scale, rhs_scale, transpose_lhs, transpose_rhs, preferred_element_type,
      group_offset, num_actual_groups, existing_out, bias_grad, precision, config, backend, rhs_scale_per_group,
      transpose_out)
  bounds = ops.group_bounds(group_sizes, group_offset, num_groups, m)
  if rhs_scale_per_group:  # The computed groups' scales, in bounds' order (ones for groups past the end: empty).
    axis = 1 if transpose_rhs else 0
    total = rhs_scale.shape[axis]
    first = 0 if group_offset is None else ops.clip_to_int32(jnp.reshape(jnp.asarray(group_offset), ()), total)
    padded = jnp.pad(rhs_scale, [(0, num_groups if a == axis else 0) for a in range(2)], constant_values=1.0)
    rhs_scale = lax.dynamic_slice_in_dim(padded, first, num_groups, axis=axis)
  (out,) = _tgmm_p(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                   out_dtype=out_dtype, config=config, rhs_scale_per_group=rhs_scale_per_group,
                   transpose_out=transpose_out, backend=backend)
  return out


# ---------------------------------------------------------------------------------------------------------------
# The training recipe


class _RecipeStatic(NamedTuple):
  transpose_rhs: bool
  out_dtype: jnp.dtype
  lhs_dtype: jnp.dtype
  fp8_dtype: jnp.dtype
  config: object
  backend: str | None
  wgrad_group_operand: str | None  # wgrad_scale="group": the operand ("lhs" or "dout") scaled per group; else None.


def quantize_pair(x: jax.Array, recipe: str, dtype=jnp.float8_e4m3fn, *, backend: str | None = None):
  """x quantised (jgmm.quantize's math) in its own layout and transposed, in one pass over x on the GPU.

  Args:
    x: (R, C) with recipe "1x128", or (R, C) / (G, R, C) with "128x128"; bfloat16, float16 or float32.
    recipe: "1x128": q (R, C) with scale (R, cdiv(C, 128)), and qt (C, R) with scale_t (C, cdiv(R, 128)) (1x128
      blocks of x.T: x's columns per 128 rows). "128x128": q (..., R, C) with scale (..., RB, CB), and qt
      (..., C, R) with scale_t (..., CB, RB), the same block scales transposed.
    dtype: the FP8 format.
    backend: None (Triton on a GPU, else the portable implementation), "triton" or "xla".

  Returns:
    (q, scale, qt, scale_t): what quantize(x) and quantize(x swapped) give, except that the GPU kernel multiplies
    by the scale's reciprocal where quantize divides: an FP8 value may then differ by one step, where x / scale lies
    within a float32 ulp of a rounding boundary (and XLA's own division on a GPU may differ from IEEE's by an ulp).
    Non-finite x as in quantize, on both backends: a block holding NaN has a NaN scale and NaN values; one holding
    inf (no NaN) an inf scale, zeros, and NaN where x is inf.
  """
  dtype, backend = validation.check_quantize_pair(x, recipe, dtype, backend)
  return tuple(_quantize_pair_p(x, recipe=recipe, dtype=dtype, backend=backend))


@functools.partial(jax.tree_util.register_dataclass, data_fields=("nk", "nk_scale", "kn", "kn_scale"),
                   meta_fields=("transpose_rhs",))
@dataclasses.dataclass(frozen=True)
class Fp8Weights:
  """fp8_gmm's weights quantised ahead (quantize_weights makes them), for its rhs_fp8 argument.

  nk, nk_scale: the weights in FP8 as (G, N, K) with 128x128 block scales (G, cdiv(N, 128), cdiv(K, 128)) float32,
    the K-major layout of the forward product.
  kn, kn_scale: the same blocks as (G, K, N) with scales (G, cdiv(K, 128), cdiv(N, 128)), d lhs's.
  transpose_rhs: the layout of the weights they were made from (static).
  """
  nk: jax.Array
  nk_scale: jax.Array
  kn: jax.Array
  kn_scale: jax.Array
  transpose_rhs: bool


def quantize_weights(rhs: jax.Array, *, transpose_rhs: bool = False, fp8_dtype=jnp.float8_e4m3fn,
                     backend: str | None = None) -> Fp8Weights:
  """rhs quantised for fp8_gmm ahead of its calls: per 128x128 block, in both layouts the recipe reads (one pass
  over rhs on the GPU, quantize_pair). No gradient flows through it.

  fp8_gmm quantises its weights on every call (on an H100, ~1.7 ms of DeepSeek-V3's gate-up weights at 8-way expert
  parallelism); where one step runs several calls through the same weights (micro-batches, gradient
  accumulation), quantise them once per step and pass the result as fp8_gmm's rhs_fp8 beside rhs, inside or
  outside the differentiated function: the gradient still goes to rhs.

  Args:
    rhs: (G, K, N), or (G, N, K) when transpose_rhs; bfloat16, float16 or float32.
    transpose_rhs: rhs's layout, as fp8_gmm's argument (the calls must pass the same).
    fp8_dtype: float8_e4m3fn (NVIDIA) or float8_e4m3fnuz (ROCm), as fp8_gmm's argument.
    backend: None (Triton on a GPU, else the portable implementation), "triton" or "xla".

  Returns:
    Fp8Weights of rhs.
  """
  validation.check_quantize_weights(rhs, transpose_rhs, fp8_dtype)
  return Fp8Weights(*_weight_layouts(lax.stop_gradient(rhs), transpose_rhs, fp8_dtype, backend), transpose_rhs)


def _weight_layouts(rhs, transpose_rhs, fp8_dtype, backend):
  """(nk, nk_scale, kn, kn_scale) of rhs (Fp8Weights' arrays), in one quantize_pair pass: (G, N, K) for the
  forward (contracting K), (G, K, N) for d lhs (contracting N)."""
  q, scale, qt, scale_t = quantize_pair(rhs, "128x128", fp8_dtype, backend=backend)
  return (q, scale, qt, scale_t) if transpose_rhs else (qt, scale_t, q, scale)


# The recipe's weight gradient reads lhs^T and dout^T with each group's rows padded to the 128-row grid of their
# scales (no block then spans two groups: the FP8 tgmm skips zeroing them) where the padding (under 128 columns per
# group, and M's last partial block) adds at most about this share to their M.
_MAX_PADDING = 0.25


def _padded_groups(group_sizes, m):
  """(blocks, padded sizes) for the weight gradient's operands, or None where padding them costs too much: the G
  groups (clipped to m) and then the rows after them, each padded to a multiple of 128 rows, as blocks (3, cdiv(m,
  128) + G) int32 of 128 rows (the first row, the end of its group, and its group, G for the rows after the groups
  or none: backend_*.quantize_pair_grouped's argument; each group but the last adds at most one partial block);
  padded sizes (G,) int32, the groups' rows so padded (the tgmm's group_sizes)."""
  num_groups = group_sizes.shape[0]
  padded_blocks = -(-m // 128) + num_groups
  if 128 * num_groups > _MAX_PADDING * m or 128 * padded_blocks >= 2**31:  # (int32 row indices)
    return None
  edges = jnp.concatenate([ops.group_bounds(group_sizes, None, num_groups, m), jnp.full((1,), m, jnp.int32)])
  padded_sizes = -(-(edges[1:] - edges[:-1]) // 128) * 128
  padded = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(padded_sizes, dtype=jnp.int32)])
  column = 128 * jnp.arange(padded_blocks, dtype=jnp.int32)  # Each block's first padded row.
  # compare_all: one fused comparison, where the default binary search is a while loop (12 small GPU kernels).
  run = jnp.clip(jnp.searchsorted(padded, column, side="right", method="compare_all") - 1, 0, num_groups)
  used = column < padded[-1]  # Blocks past the padded rows hold none: (0, 0).
  blocks = jnp.stack([jnp.where(used, edges[run] + column - padded[run], 0), jnp.where(used, edges[run + 1], 0),
                      jnp.where(used, run, num_groups)])
  return blocks, padded_sizes[:num_groups]


def _quantize_rows(x, padding, s, per_group=False):
  """quantize_pair(x, "1x128") for the recipe: (q, scale, qt, scale_t), qt's groups padded where `padding`
  (_padded_groups') is not None; per_group (with padding): qt's scales one per group and column, scale_t (C, G)."""
  if padding is None:
    return quantize_pair(x, "1x128", s.fp8_dtype, backend=s.backend)
  return tuple(_quantize_pair_grouped_p(x, padding[0], dtype=s.fp8_dtype,
                                        num_groups=padding[1].shape[0] if per_group else None, backend=s.backend))


def _group_scaled(s, padding, operand):
  """Whether the weight gradient's `operand` ("lhs" or "dout") is quantised per group and column (wgrad_scale
  "group", where the groups are padded)."""
  return padding is not None and s.wgrad_group_operand is not None and operand == s.wgrad_group_operand


def _gmm_t(lhs_q, lhs_scale, rhs_nk, rhs_nk_scale, group_sizes, group_offset, out_dtype, s, config=None):
  return gmm(lhs_q, rhs_nk, group_sizes, lhs_scale=lhs_scale, rhs_scale=rhs_nk_scale, transpose_rhs=True,
             preferred_element_type=out_dtype, group_offset=group_offset, config=config, backend=s.backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fp8_gmm(lhs, rhs, group_sizes, group_offset, weights, s):
  """The forward alone: lhs 1x128; the weights `weights` (FP8 (nk, nk_scale, kn, kn_scale) of rhs) or, without
  them, rhs 128x128 in its own layout and, where rhs is (G, K, N), one FP8 transposed copy into the K-major
  (G, N, K) that FP8 wgmma reads (a block's scale is the same whichever way the block is read)."""
  if weights is not None:
    rhs_q, rhs_scale = weights[:2]
  else:
    rhs_q, rhs_scale = quantize.quantize(rhs, "128x128", s.fp8_dtype)
    if not s.transpose_rhs:
      rhs_q, rhs_scale = jnp.swapaxes(rhs_q, 1, 2), jnp.swapaxes(rhs_scale, 1, 2)
  return _gmm_t(*quantize.quantize(lhs, "1x128", s.fp8_dtype), rhs_q, rhs_scale, group_sizes, group_offset,
                s.out_dtype, s, s.config)


def _fp8_gmm_fwd(lhs, rhs, group_sizes, group_offset, weights, s):
  """The forward for training: lhs and (without `weights`) the weights each quantised in both layouts in one pass
  (quantize_pair, or _quantize_rows for lhs); the backward's layouts are the residuals (FP8 lhs^T (K, M), or
  (K, M') with its groups padded, instead of lhs)."""
  padding = _padded_groups(group_sizes, lhs.shape[0])
  lhs_q, lhs_scale, lhs_t, lhs_t_scale = _quantize_rows(lhs, padding, s, _group_scaled(s, padding, "lhs"))
  if weights is None:
    weights = _weight_layouts(rhs, s.transpose_rhs, s.fp8_dtype, s.backend)
  nk, kn = weights[:2], weights[2:]
  out = _gmm_t(lhs_q, lhs_scale, *nk, group_sizes, group_offset, s.out_dtype, s, s.config)
  return out, (lhs_t, lhs_t_scale, *kn, group_sizes, group_offset, padding)


def _fp8_gmm_bwd(s, residuals, dout):
  lhs_t, lhs_t_scale, rhs_kn, rhs_kn_scale, group_sizes, group_offset, padding = residuals
  # dout 1x128 along N for dlhs = dout @ rhs[g]^T, and dout^T (N, M) per 128 rows of M for drhs, in one pass.
  dout_q, dout_scale, dout_t, dout_t_scale = _quantize_rows(dout, padding, s, _group_scaled(s, padding, "dout"))
  dlhs = _gmm_t(dout_q, dout_scale, rhs_kn, rhs_kn_scale, group_sizes, group_offset, s.lhs_dtype, s)
  # drhs = lhs[rows]^T @ dout[rows] per group, contracting M: lhs^T (K, M) and dout^T (N, M), M-contiguous, the
  # K-major layout FP8 tgmm reads at speed (each group's rows from a multiple of 128 on where padded). The tgmm's
  # rhs is the operand scaled per group, if any (its scales are the output tile's column scales), else the one of
  # the weights' layout; it stores its tiles transposed where the two differ.
  per_group = _group_scaled(s, padding, s.wgrad_group_operand)
  rhs_is_lhs = s.wgrad_group_operand == "lhs" if per_group else s.transpose_rhs
  a, a_scale, b, b_scale = ((dout_t, dout_t_scale, lhs_t, lhs_t_scale) if rhs_is_lhs else
                            (lhs_t, lhs_t_scale, dout_t, dout_t_scale))
  drhs = tgmm(a, b, group_sizes if padding is None else padding[1], lhs_scale=a_scale, rhs_scale=b_scale,
              transpose_rhs=True, preferred_element_type=s.lhs_dtype, group_offset=group_offset,
              num_actual_groups=rhs_kn.shape[0], backend=s.backend, rhs_scale_per_group=per_group,
              transpose_out=rhs_is_lhs != s.transpose_rhs)
  return dlhs, drhs, None, None, None  # No cotangent for the FP8 weights: rhs's is drhs.


_fp8_gmm.defvjp(_fp8_gmm_fwd, _fp8_gmm_bwd)


def fp8_gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_rhs: bool = False,
            preferred_element_type=None, group_offset=None, fp8_dtype=jnp.float8_e4m3fn,
            rhs_fp8: Fp8Weights | None = None, wgrad_scale: str = "128x1", config=None,
            backend: str | None = None) -> jax.Array:
  """gmm computed in FP8 for training (DeepSeek-V3's recipe), differentiable: out[rows of g] = lhs[rows] @ rhs[g].

  Forward: lhs quantised per 1x128 block, rhs per 128x128 block, one FP8 gmm reading rhs as (G, N, K). Under
  differentiation each is quantised in both layouts in one pass: the residuals are lhs^T (K, M) per 128 rows of M
  (see the padding below) and the weights as (G, K, N), in FP8, instead of lhs and rhs.
  Backward: dout quantised per 1x128 block and, transposed, per 128 rows of M, in one pass; dlhs = dout @ rhs[g]^T
  by an FP8 gmm on the (G, K, N) weights; drhs by an FP8 tgmm of lhs^T (K, M) and dout^T (N, M) (jgmm.fp8's tgmm
  recipe, in its fast layout). Where M >= 512 G (G: group_sizes' length), the transposed copies hold each group's
  rows from a multiple of 128 on (zero-padded: under 128 (G + 1) more columns, about a quarter of M): their 128-row
  scale blocks then start at each group's first row and never span two groups, and the tgmm skips the zeroing of
  other groups' rows (13-22% of its time on an H200); elsewhere the blocks lie on M's global grid. The gradients
  are those of the quantised products (a recipe, not the exact derivative of the FP8 forward).

  Args:
    lhs: (M, K) bfloat16/float16/float32, rows grouped contiguously in group order.
    rhs: (G, K, N), or (G, N, K) when transpose_rhs; lhs's dtype.
    group_sizes: (G_total,) integer rows per group (G_total == G, or > G with group_offset).
    preferred_element_type: output dtype; default lhs's dtype.
    group_offset: optional int or int array, first local group (expert sharding), as for gmm.
    fp8_dtype: float8_e4m3fn (NVIDIA) or float8_e4m3fnuz (ROCm).
    rhs_fp8: optional quantize_weights(rhs, transpose_rhs=..., fp8_dtype=...) made ahead (once for a step's
      micro-batches): the products read it instead of quantising rhs, and the gradient still goes to rhs. It must
      be made from this rhs: a stale one gives the products of the weights it was made from. Under differentiation
      the results are those without it bit for bit (both quantise rhs by quantize_pair); the forward alone may
      differ by one FP8 step per element (quantize_pair against jgmm.quantize, see quantize_pair).
    wgrad_scale: "128x1" (DeepSeek-V3's) or "group": one of the weight gradient's operands takes one scale per
      group and column instead of one per 128 rows and column, where the groups are padded (M >= 512 G; elsewhere
      "128x1"): the narrower, lhs^T where K < N, dout^T where N < K (on a tie dout^T for rhs (G, K, N), lhs^T for
      (G, N, K)). Its FP8 tgmm then multiplies each step's product by the other operand's scales alone and the
      group's once per tile (storing the tile transposed where the weights' layout asks): 1.48x faster on an H100
      at the dsv3 shapes, for a first pass over that operand (its group maxima) and a coarser scale (dW ~6-15% more
      error than 128x1 against float64 on outlier tokens, within the FP8 product's own ~3%: docs/perf-notes.md,
      sessions 29 and 31).
    config, backend: as for gmm (config applies to the forward product).

  Returns:
    (M, N); rows outside the computed groups are 0.
  """
  # The checks of the bf16 product validate every argument (shapes, dtypes, groups) at trace time.
  _, k, n, _, out_dtype, _, config, backend = validation.check_gmm(
      lhs, rhs, group_sizes, None, transpose_rhs, preferred_element_type, group_offset, None, None, None, config,
      backend)
  fp8_dtype = validation.check_fp8_dtype("fp8_dtype", fp8_dtype)
  if not isinstance(wgrad_scale, str):
    raise TypeError(f'wgrad_scale must be a str, "128x1" or "group", got {type(wgrad_scale).__name__}')
  if wgrad_scale not in ("128x1", "group"):
    raise ValueError(f'wgrad_scale must be "128x1" or "group", got {wgrad_scale!r}')
  weights = None
  if rhs_fp8 is not None:
    validation.check_fp8_weights(rhs_fp8, Fp8Weights, rhs.shape[0], k, n, transpose_rhs, fp8_dtype)
    weights = (rhs_fp8.nk, rhs_fp8.nk_scale, rhs_fp8.kn, rhs_fp8.kn_scale)
  group_operand = None  # The narrower (fewer bytes for the pass that takes its group maxima); on a tie, the layout's.
  if wgrad_scale == "group":
    group_operand = "lhs" if k < n or (k == n and transpose_rhs) else "dout"
  s = _RecipeStatic(transpose_rhs, out_dtype, jnp.dtype(lhs.dtype), fp8_dtype, config, backend, group_operand)
  offset = None if group_offset is None else jnp.asarray(group_offset, jnp.int32)  # An operand of the custom_vjp.
  return _fp8_gmm(lhs, rhs, group_sizes, offset, weights, s)
