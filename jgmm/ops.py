"""jgmm's public ops and their custom_vjp rules.

Runtime semantics, for every backend: negative group sizes count as 0; group boundaries are clipped at M
(rows past M are never read); group_offset is clipped to [0, len(group_sizes)] and groups past the end of
group_sizes are empty; masked_m is clipped to [0, max_m]. No input value makes any backend read or write
out of bounds.
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jgmm import activations, fp8, primitives, validation
from jgmm.config import Config


def group_bounds(group_sizes, group_offset, num_groups, m):
  """Row bounds (num_groups + 1,) int32 of the local groups [group_offset, group_offset + num_groups).

  Rows of local group g are [bounds[g], bounds[g + 1]); 0 <= bounds[0] <= ... <= bounds[-1] <= m whatever
  group_sizes (G_total,) and group_offset hold.
  """
  sizes = jnp.clip(group_sizes, 0, m).astype(jnp.int32)
  # min(a + b, m) without overflow: prefix sums clipped at m.
  ends = lax.associative_scan(lambda a, b: jnp.minimum(a, m - b) + b, sizes)
  edges = jnp.concatenate([jnp.zeros(1, jnp.int32), ends])
  if group_offset is None:
    return edges
  total = group_sizes.shape[0]
  edges = jnp.concatenate([edges, jnp.broadcast_to(ends[-1], (num_groups,))])
  offset = jnp.clip(jnp.reshape(jnp.asarray(group_offset), ()), 0, total).astype(jnp.int32)
  return lax.dynamic_slice(edges, (offset,), (num_groups + 1,))


def _vary_alike(*arrays):
  """Casts arrays (None allowed) to vary over the union of their shard_map mesh axes (no-op outside one)."""
  varying = lambda a: jax.typeof(a).mat.varying
  axes = frozenset().union(*(varying(a) for a in arrays if a is not None))
  return [a if a is None or not axes - varying(a) else lax.pcast(a, tuple(axes - varying(a)), to="varying")
          for a in arrays]


class _GmmStatic(NamedTuple):
  transpose_rhs: bool
  out_dtype: jnp.dtype
  activation: str | None
  accumulate: bool
  config: Config | None
  backend: str | None


class _TgmmStatic(NamedTuple):
  transpose_lhs: bool
  out_dtype: jnp.dtype
  bias_grad: bool
  accumulate: bool
  config: Config | None
  backend: str | None


def _gmm_call(lhs, rhs, bounds, bias, existing_out, s, save_preactivation):
  return primitives.gmm(lhs, rhs, bounds, bias, existing_out, transpose_rhs=s.transpose_rhs,
                        out_dtype=s.out_dtype, activation=s.activation,
                        save_preactivation=save_preactivation, config=s.config, backend=s.backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _gmm(lhs, rhs, bounds, bias, existing_out, s):
  return _gmm_call(lhs, rhs, bounds, bias, existing_out, s, save_preactivation=False)[0]


def _gmm_fwd(lhs, rhs, bounds, bias, existing_out, s):
  outs = _gmm_call(lhs, rhs, bounds, bias, existing_out, s, save_preactivation=s.activation is not None)
  return outs[0], (lhs, rhs, bounds, outs[-1] if s.activation else None, bias)


def _segment_sums(x, bounds):
  """(G, N) float32 sums of the rows of x (M, N) in each group."""
  num_groups = bounds.shape[0] - 1
  row = jnp.arange(x.shape[0])
  segment = jnp.searchsorted(bounds[1:], row, side="right")
  segment = jnp.where(row < bounds[0], num_groups, segment)
  return jax.ops.segment_sum(x.astype(jnp.float32), segment, num_segments=num_groups + 1)[:num_groups]


def _gmm_bwd(s, residuals, dout):
  lhs, rhs, bounds, preact, bias = residuals
  dh = dout
  if s.activation is not None:
    dh = activations.grad(s.activation, preact.astype(jnp.float32), dout.astype(jnp.float32))
  dh = dh.astype(lhs.dtype)
  backward = dict(config=None, backend=s.backend)
  (dlhs,) = primitives.gmm(dh, rhs, bounds, None, None, transpose_rhs=not s.transpose_rhs,
                           out_dtype=lhs.dtype, activation=None, save_preactivation=False, **backward)
  fuse_bias_grad = bias is not None and not s.transpose_rhs
  if s.transpose_rhs:  # drhs (G, N, K)[g] = dh[rows]^T @ lhs[rows]
    drhs_outs = primitives.tgmm(dh, lhs, bounds, None, transpose_lhs=True, out_dtype=rhs.dtype,
                                bias_grad=False, **backward)
  else:  # drhs (G, K, N)[g] = lhs[rows]^T @ dh[rows]
    drhs_outs = primitives.tgmm(lhs, dh, bounds, None, transpose_lhs=True, out_dtype=rhs.dtype,
                                bias_grad=fuse_bias_grad, **backward)
  dbias = None
  if bias is not None:
    dbias = (drhs_outs[1] if fuse_bias_grad else _segment_sums(dh, bounds)).astype(bias.dtype)
  return dlhs, drhs_outs[0], None, dbias, dout if s.accumulate else None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def gmm(lhs, rhs, group_sizes, *, bias=None, transpose_rhs=False, preferred_element_type=None,
        group_offset=None, existing_out=None, activation=None, config=None, backend=None, lhs_scale=None,
        rhs_scale=None):
  """Grouped matrix multiplication: out[rows of g] = act(lhs[rows of g] @ rhs[g] + bias[g]).

  Args:
    lhs: (M, K) float32, bfloat16 or float16, or FP8 (float8_e4m3fn / e4m3fnuz) with lhs_scale; rows grouped
      contiguously in group order.
    rhs: (G, K, N), or (G, N, K) when transpose_rhs (FP8: the faster layout); lhs's dtype.
    group_sizes: (G_total,) integer rows per group. G_total == G, or >= G with group_offset.
    bias: optional (G, N), added to the float32 accumulator before the activation.
    transpose_rhs: rhs is (G, N, K) and read transposed (no copy).
    preferred_element_type: output dtype (float32, bfloat16, float16); default lhs's dtype.
    group_offset: optional int or int array of shape () or (1,): compute only groups
      [group_offset, group_offset + G) of group_sizes with the local rhs (expert sharding).
    existing_out: optional (M, N_out) of the output dtype: the result is existing_out + the product on the
      computed groups' rows, and existing_out's values elsewhere (accumulation; aliased on GPU).
    activation: None, "relu", "gelu", "gelu_tanh", "silu", or "swiglu" (rhs columns are [gate | up]
      halves; N_out = N // 2, out = silu(gate) * up).
    config: optional jgmm.Config (or dict of its fields); default from the tuned table.
    backend: None (Triton on GPU, portable elsewhere), "triton" or "xla" (portable pure JAX).
    lhs_scale, rhs_scale: float32 scales of FP8 lhs and rhs (jgmm.fp8): lhs_scale (M,) per row or
      (M, cdiv(K, 128)) per 1x128 block; rhs_scale (G, N) per channel or (G, cdiv(N, 128), cdiv(K, 128)) per
      128x128 block. FP8 output defaults to bfloat16; no bias, existing_out or activation with FP8.

  Returns:
    (M, N_out) with N_out = N (N // 2 for swiglu). Rows outside the computed groups are 0 (or existing_out).
  """
  if fp8.requested((lhs, rhs), (lhs_scale, rhs_scale)):
    return fp8.gmm(lhs, rhs, group_sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, bias=bias,
                   transpose_rhs=transpose_rhs, preferred_element_type=preferred_element_type,
                   group_offset=group_offset, existing_out=existing_out, activation=activation, config=config,
                   backend=backend)
  m, _, _, _, out_dtype, config, backend = validation.check_gmm(
      lhs, rhs, group_sizes, bias, transpose_rhs, preferred_element_type, group_offset, existing_out,
      activation, config, backend)
  bounds = group_bounds(group_sizes, group_offset, rhs.shape[0], m)
  s = _GmmStatic(transpose_rhs, out_dtype, activation, existing_out is not None, config, backend)
  return _gmm(*_vary_alike(lhs, rhs, bounds, bias, existing_out), s)


def _tgmm_call(lhs, rhs, bounds, existing_out, s):
  return primitives.tgmm(lhs, rhs, bounds, existing_out, transpose_lhs=s.transpose_lhs,
                         out_dtype=s.out_dtype, bias_grad=s.bias_grad, config=s.config, backend=s.backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _tgmm(lhs, rhs, bounds, existing_out, s):
  outs = _tgmm_call(lhs, rhs, bounds, existing_out, s)
  return tuple(outs) if s.bias_grad else outs[0]


def _tgmm_fwd(lhs, rhs, bounds, existing_out, s):
  return _tgmm(lhs, rhs, bounds, existing_out, s), (lhs, rhs, bounds)


def _tgmm_bwd(s, residuals, cotangents):
  lhs, rhs, bounds = residuals
  dout, ddbias = cotangents if s.bias_grad else (cotangents, None)
  g = dout.astype(lhs.dtype)
  lhs_mk = lhs if s.transpose_lhs else lhs.T
  backward = dict(activation=None, save_preactivation=False, config=None, backend=s.backend)
  # d lhs_mk[rows of g] = rhs[rows] @ dout[g]^T: dout (G, K, N) read as a transposed rhs.
  (dlhs_mk,) = primitives.gmm(rhs, g, bounds, None, None, transpose_rhs=True, out_dtype=lhs.dtype, **backward)
  # d rhs[rows of g] = lhs_mk[rows] @ dout[g] (+ d dbias[g] on every row of g).
  (drhs,) = primitives.gmm(lhs_mk, g, bounds, ddbias, None, transpose_rhs=False, out_dtype=rhs.dtype,
                           **backward)
  return dlhs_mk if s.transpose_lhs else dlhs_mk.T, drhs, None, dout if s.accumulate else None


_tgmm.defvjp(_tgmm_fwd, _tgmm_bwd)


def tgmm(lhs, rhs, group_sizes, *, transpose_lhs=False, preferred_element_type=None, group_offset=None,
         num_actual_groups=None, existing_out=None, bias_grad=False, config=None, backend=None, lhs_scale=None,
         rhs_scale=None):
  """Transposed grouped matmul (the weight gradient): out[g] = lhs[:, rows of g] @ rhs[rows of g].

  Args:
    lhs: (K, M), or (M, K) when transpose_lhs (read transposed, no copy); float32/bfloat16/float16, or FP8 with
      lhs_scale.
    rhs: (M, N), lhs's dtype.
    group_sizes: (G_total,) integer rows per group.
    transpose_lhs: lhs is (M, K).
    preferred_element_type: output dtype; default lhs's dtype.
    group_offset: optional int or int array of shape () or (1,), first group computed.
    num_actual_groups: optional int G <= G_total: compute groups [group_offset, group_offset + G).
    existing_out: optional (G, K, N) of the output dtype, added to the result.
    bias_grad: also return the float32 (G, N) per-group column sums of rhs.
    config, backend: as for gmm.
    lhs_scale, rhs_scale: float32 scales of FP8 lhs and rhs (jgmm.fp8), per 128 rows of M of each column:
      lhs_scale (cdiv(M, 128), K) for lhs (M, K) or (K, cdiv(M, 128)) for lhs (K, M); rhs_scale
      (cdiv(M, 128), N). FP8 output defaults to bfloat16; no existing_out or bias_grad with FP8.

  Returns:
    (G, K, N); empty groups are exact zeros. With bias_grad, (out, dbias (G, N) float32).
  """
  if fp8.requested((lhs, rhs), (lhs_scale, rhs_scale)):
    return fp8.tgmm(lhs, rhs, group_sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, transpose_lhs=transpose_lhs,
                    preferred_element_type=preferred_element_type, group_offset=group_offset,
                    num_actual_groups=num_actual_groups, existing_out=existing_out, bias_grad=bias_grad,
                    config=config, backend=backend)
  m, _, _, num_groups, out_dtype, config, backend = validation.check_tgmm(
      lhs, rhs, group_sizes, transpose_lhs, preferred_element_type, group_offset, num_actual_groups,
      existing_out, bias_grad, config, backend)
  bounds = group_bounds(group_sizes, group_offset, num_groups, m)
  s = _TgmmStatic(transpose_lhs, out_dtype, bias_grad, existing_out is not None, config, backend)
  return _tgmm(*_vary_alike(lhs, rhs, bounds, existing_out), s)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _masked_gmm(x, w, masked_m, out_dtype, expected_m, config, backend):
  return primitives.masked_gmm(x, w, masked_m, out_dtype=out_dtype, expected_m=expected_m, config=config,
                               backend=backend)[0]


def _masked_gmm_fwd(x, w, masked_m, out_dtype, expected_m, config, backend):
  return _masked_gmm(x, w, masked_m, out_dtype, expected_m, config, backend), (x, w, masked_m)


def _masked_gmm_bwd(out_dtype, expected_m, config, backend, residuals, dout):
  del out_dtype, config
  x, w, masked_m = residuals
  dout = dout.astype(x.dtype)
  # dx[g] = dout[g] @ w[g]: w (G, N, K) read as the (G, K, N) layout.
  (dx,) = primitives.masked_gmm(dout, jnp.swapaxes(w, 1, 2), masked_m, out_dtype=x.dtype,
                                expected_m=expected_m, config=None, backend=backend)
  valid = (jnp.arange(x.shape[1])[None, :] < masked_m[:, None])[..., None]
  dw = jnp.einsum("gmn,gmk->gnk", jnp.where(valid, dout, 0), jnp.where(valid, x, 0),
                  preferred_element_type=jnp.float32)
  return dx, dw.astype(w.dtype), None


_masked_gmm.defvjp(_masked_gmm_fwd, _masked_gmm_bwd)


def masked_gmm(x, w, masked_m, *, preferred_element_type=None, expected_m=None, config=None, backend=None,
               x_scale=None, w_scale=None):
  """Masked grouped matmul (DeepGEMM style): out[g, :masked_m[g]] = x[g, :masked_m[g]] @ w[g].T.

  Args:
    x: (G, max_m, K) float32/bfloat16/float16, or FP8 with x_scale; rows >= masked_m[g] are ignored.
    w: (G, N, K), x's dtype.
    masked_m: (G,) integer valid rows per group, clipped to [0, max_m].
    preferred_element_type: output dtype; default x's dtype.
    expected_m: optional int, the typical masked_m, to choose the tuned config.
    config, backend: as for gmm.
    x_scale, w_scale: float32 scales of FP8 x and w (jgmm.fp8): x_scale (G, max_m) per row or
      (G, max_m, cdiv(K, 128)) per 1x128 block; w_scale (G, N) per channel or (G, cdiv(N, 128), cdiv(K, 128))
      per 128x128 block. FP8 output defaults to bfloat16.

  Returns:
    (G, max_m, N); rows >= masked_m[g] are exact zeros.
  """
  if fp8.requested((x, w), (x_scale, w_scale)):
    return fp8.masked_gmm(x, w, masked_m, x_scale=x_scale, w_scale=w_scale,
                          preferred_element_type=preferred_element_type, expected_m=expected_m, config=config,
                          backend=backend)
  out_dtype, config, backend = validation.check_masked_gmm(x, w, masked_m, preferred_element_type,
                                                           expected_m, config, backend)
  masked_m = jnp.clip(masked_m, 0, x.shape[1]).astype(jnp.int32)
  return _masked_gmm(*_vary_alike(x, w, masked_m), out_dtype, expected_m, config, backend)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
  """Drop-in replacement for `jax.lax.ragged_dot`: lhs (M, K), rhs (G, K, N), group_sizes (G,) -> (M, N).

  `precision` is accepted for compatibility; products accumulate in float32 whatever it says.
  """
  del precision
  return gmm(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type, group_offset=group_offset)
