"""Derivative rules of jgmm's primitives (JVP and transpose), so every JAX transformation composes with them.

Each product is linear in each float operand given the others: gmm in lhs, and in (rhs, bias) together; tgmm
in lhs and in rhs; masked_gmm in x and in w; existing_out enters every output once, linearly. A JVP rule
therefore writes the tangent as primitive calls that each take one tangent operand (symbolic-zero tangents skip
their call), and the transpose rules turn those calls into the backward kernels:
  gmm:        d lhs = gmm(dout, rhs read the other way)      d rhs, d bias = tgmm(lhs, dout) (+ fused column sums)
  tgmm:       d lhs = gmm(rhs, dout read transposed)         d rhs = gmm(lhs, dout) (+ d dbias per row of a group)
  masked_gmm: d x = masked_gmm_kn(dout, w) (w read in place)  d w = masked_tgmm(dout, x) (valid rows per group)
  masked_gmm_kn and masked_tgmm (masked_gmm's backward products) transpose into the same three primitives.
Every such call is again a primitive with these rules: grad of grad, jvp of grad and Hessian-vector products
work. gmm's fused activation is differentiated through its saved pre-activation h: the activation's
derivative is rematerialised from h (jax.checkpoint), so reverse mode keeps h alone, as a custom_vjp would.
Backward calls choose their own tuned configs (config=None) on the same backend with the same precision.
"""
import jax
import jax.numpy as jnp
from jax.interpreters import ad

from jgmm import activations, backend_xla, partitioning, primitives

_F32 = jnp.float32


def _is_zero(tangent):
  return tangent is None or type(tangent) is ad.Zero


def _zero_tangent(x):
  return ad.Zero(jax.typeof(x).to_tangent_aval())


def _aval(x):
  return x.aval if ad.is_undefined_primal(x) else jax.typeof(x)


def _bias_rows(bias, bounds, m, dtype):
  """(M, N) bias[g] on each row of group g, zeros on rows of no group."""
  group, in_group = backend_xla.row_groups(bounds, m)
  return jnp.where(in_group[:, None], bias[group], 0).astype(dtype)


def _segment_sums(x, bounds):
  """(G, N) float32 sums of the rows of x (M, N) in each group."""
  group, in_group = backend_xla.row_groups(bounds, x.shape[0])
  rows = jnp.where(in_group[:, None], x.astype(_F32), 0)
  return jax.ops.segment_sum(rows, group, num_segments=bounds.shape[0] - 1)


def _activation_jvp(activation, h, t_h, out_dtype):
  """The tangent of act(h) along t_h (both (M, N) out_dtype), the derivative recomputed from h."""
  def tangent(h, t_h):
    act = lambda x: activations.apply(activation, x)
    return jax.jvp(act, (h.astype(_F32),), (t_h.astype(_F32),))[1].astype(out_dtype)
  return jax.checkpoint(tangent)(h, t_h)


# gmm: out = existing_out + act(h) on the computed groups' rows, h = lhs @ rhs[g] + bias[g].

def _gmm_jvp(primals, tangents, *, present, backend, transpose_rhs, out_dtype, activation, save_preactivation,
             precision, config):
  lhs, rhs, bounds, bias, existing_out = primitives.fill(primals, present)
  t_lhs, t_rhs, _, t_bias, t_existing = primitives.fill(tangents, present)
  static = dict(transpose_rhs=transpose_rhs, out_dtype=out_dtype, precision=precision, backend=backend)
  keep_h = activation is not None or save_preactivation
  outs = primitives.gmm(lhs, rhs, bounds, bias, existing_out, activation=activation, save_preactivation=keep_h,
                        config=config, **static)
  linear = dict(activation=None, save_preactivation=False, config=None, **static)
  # The tangent of h, with t_existing folded in where no activation comes between.
  t_h = None if activation is not None or save_preactivation or _is_zero(t_existing) else t_existing
  t_bias = None if _is_zero(t_bias) else t_bias
  if not _is_zero(t_rhs):
    (t_h,) = primitives.gmm(lhs, t_rhs, bounds, t_bias, t_h, **linear)
  elif t_bias is not None:
    t_h = _bias_rows(t_bias, bounds, lhs.shape[0], out_dtype) + (0 if t_h is None else t_h)
  if not _is_zero(t_lhs):
    (t_h,) = primitives.gmm(t_lhs, rhs, bounds, None, t_h, **linear)
  if activation is None and not save_preactivation:
    return outs, [_zero_tangent(outs[0]) if t_h is None else t_h]
  t_out = None if t_h is None else _activation_jvp(activation, outs[1], t_h, out_dtype)
  if not _is_zero(t_existing):
    t_out = t_existing if t_out is None else t_out + t_existing
  tangents_out = [_zero_tangent(outs[0]) if t_out is None else t_out]
  if save_preactivation:
    tangents_out.append(_zero_tangent(outs[1]) if t_h is None else t_h)
  return outs[:len(tangents_out)], tangents_out


def _gmm_transpose(cts, lhs, rhs, bounds, *optional, present, backend, transpose_rhs, out_dtype, activation,
                   save_preactivation, precision, config):
  del out_dtype, config
  assert activation is None and not save_preactivation, "only gmm's linear calls are transposed"
  bias, existing_out = primitives.fill(optional, present[3:])
  (ct,) = cts
  if type(ct) is ad.Zero:
    return [None] * (3 + len(optional))
  static = dict(activation=None, save_preactivation=False, precision=precision, config=None, backend=backend)
  ct_lhs = ct_rhs = ct_bias = None
  if ad.is_undefined_primal(lhs):  # d lhs[rows of g] = dout[rows] @ rhs[g]^T
    (ct_lhs,) = primitives.gmm(ct.astype(rhs.dtype), rhs, bounds, None, None, transpose_rhs=not transpose_rhs,
                               out_dtype=lhs.aval.dtype, **static)
  bias_undefined = bias is not None and ad.is_undefined_primal(bias)
  if ad.is_undefined_primal(rhs):
    dh = ct.astype(lhs.dtype)
    fuse_bias = bias_undefined and not transpose_rhs
    tgmm = dict(out_dtype=rhs.aval.dtype, precision=precision, config=None, backend=backend)
    if transpose_rhs:  # d rhs (G, N, K)[g] = dout[rows]^T @ lhs[rows]
      (ct_rhs,) = primitives.tgmm(dh, lhs, bounds, None, transpose_lhs=True, bias_grad=False, **tgmm)
    else:  # d rhs (G, K, N)[g] = lhs[rows]^T @ dout[rows], and d bias[g] its column sums
      outs = primitives.tgmm(lhs, dh, bounds, None, transpose_lhs=True, bias_grad=fuse_bias, **tgmm)
      ct_rhs, ct_bias = outs if fuse_bias else (outs[0], None)
  if bias_undefined and ct_bias is None:
    ct_bias = _segment_sums(ct, bounds)
  if ct_bias is not None:
    ct_bias = ct_bias.astype(bias.aval.dtype)
  ct_existing = ct if existing_out is not None and ad.is_undefined_primal(existing_out) else None
  return [ct_lhs, ct_rhs, None] + [c for c, p in zip((ct_bias, ct_existing), present[3:]) if p]


# tgmm: out[g] = existing_out[g] + lhs_KM[:, rows of g] @ rhs[rows of g]; dbias[g] = column sums of rhs[rows].

def _tgmm_jvp(primals, tangents, *, present, backend, transpose_lhs, out_dtype, bias_grad, precision, config):
  lhs, rhs, bounds, existing_out = primitives.fill(primals, present)
  t_lhs, t_rhs, _, t_existing = primitives.fill(tangents, present)
  static = dict(transpose_lhs=transpose_lhs, out_dtype=out_dtype, precision=precision, backend=backend)
  outs = primitives.tgmm(lhs, rhs, bounds, existing_out, bias_grad=bias_grad, config=config, **static)
  t_out = None if _is_zero(t_existing) else t_existing
  t_dbias = None
  if not _is_zero(t_rhs):
    t_outs = primitives.tgmm(lhs, t_rhs, bounds, t_out, bias_grad=bias_grad, config=None, **static)
    t_out, t_dbias = t_outs if bias_grad else (t_outs[0], None)
  if not _is_zero(t_lhs):
    (t_out,) = primitives.tgmm(t_lhs, rhs, bounds, t_out, bias_grad=False, config=None, **static)
  tangents_out = [_zero_tangent(outs[0]) if t_out is None else t_out]
  if bias_grad:
    tangents_out.append(_zero_tangent(outs[1]) if t_dbias is None else t_dbias)
  return outs, tangents_out


def _tgmm_transpose(cts, lhs, rhs, bounds, *optional, present, backend, transpose_lhs, out_dtype, bias_grad,
                    precision, config):
  del out_dtype, config
  ct_out, ct_dbias = cts if bias_grad else (cts[0], None)
  ct_out = None if type(ct_out) is ad.Zero else ct_out
  ct_dbias = None if ct_dbias is None or type(ct_dbias) is ad.Zero else ct_dbias
  static = dict(activation=None, save_preactivation=False, precision=precision, config=None, backend=backend)
  ct_lhs = ct_rhs = None
  if ad.is_undefined_primal(lhs) and ct_out is not None:
    # d lhs_MK[rows of g] = rhs[rows] @ dout[g]^T: dout (G, K, N) read as a transposed rhs.
    (ct_lhs,) = primitives.gmm(rhs, ct_out.astype(rhs.dtype), bounds, None, None, transpose_rhs=True,
                               out_dtype=lhs.aval.dtype, **static)
    ct_lhs = ct_lhs if transpose_lhs else ct_lhs.T
  if ad.is_undefined_primal(rhs):
    m = rhs.aval.shape[0]
    if ct_out is not None:  # d rhs[rows of g] = lhs_MK[rows] @ dout[g] (+ d dbias[g])
      lhs_mk = lhs if transpose_lhs else lhs.T
      (ct_rhs,) = primitives.gmm(lhs_mk, ct_out.astype(lhs.dtype), bounds, ct_dbias, None, transpose_rhs=False,
                                 out_dtype=rhs.aval.dtype, **static)
    elif ct_dbias is not None:
      ct_rhs = _bias_rows(ct_dbias, bounds, m, rhs.aval.dtype)
  existing_undefined = present[3] and ad.is_undefined_primal(optional[0])
  ct_existing = [ct_out] if existing_undefined else [None] * len(optional)
  return [ct_lhs, ct_rhs, None] + ct_existing


# The masked family, each linear in its two float operands a, b (the third is masked_m; rows >= masked_m[g] are
# neither read nor written):
#   masked_gmm     out[g, :m] = a[g, :m] @ b[g]^T   (b (G, N, K))
#   masked_gmm_kn  out[g, :m] = a[g, :m] @ b[g]     (b (G, K, N), read in place)
#   masked_tgmm    out[g] = a[g, :m]^T @ b[g, :m]
# Each cotangent is again one of the three, reading dout in place: no transposed copies.

def _bilinear_jvp(bind, **defaults):
  """The JVP of a primitive linear in each of its two float operands (the third is masked_m)."""
  def jvp(primals, tangents, *, present, backend, **params):
    del present
    a, b, masked_m = primals
    t_a, t_b, _ = tangents
    outs = bind(a, b, masked_m, backend=backend, **params)
    params = {**params, **defaults}
    terms = [bind(t, other, masked_m, backend=backend, **params)[0] if first else
             bind(other, t, masked_m, backend=backend, **params)[0]
             for first, t, other in ((True, t_a, b), (False, t_b, a)) if not _is_zero(t)]
    return outs, [sum(terms[1:], terms[0]) if terms else _zero_tangent(outs[0])]
  return jvp


def _masked_transpose(ct_a, ct_b):
  """A transpose rule from two cotangent formulas: ct_a(dout, b) and ct_b(dout, a) -> (bind, first, second), the
  primitive that computes the cotangent of a (resp. b) and its two float operands (dout cast to the other's dtype)."""
  def transpose(cts, a, b, masked_m, *, present, backend, out_dtype, precision, config, expected_m=None):
    del present, out_dtype, config
    (ct,) = cts
    if type(ct) is ad.Zero:
      return [None, None, None]
    result = []
    for operand, formula, other in ((a, ct_a, b), (b, ct_b, a)):
      if not ad.is_undefined_primal(operand):
        result.append(None)
        continue
      bind, first, second = formula(ct.astype(_aval(other).dtype), other)
      extra = {} if bind is primitives.masked_tgmm else dict(expected_m=expected_m)
      (value,) = bind(first, second, masked_m, out_dtype=operand.aval.dtype, precision=precision, config=None,
                      backend=backend, **extra)
      result.append(value)
    return result + [None]
  return transpose


# masked_gmm: d a = dout @ b (kn, b read in place); d b = dout^T @ a (tgmm).
_masked_gmm_transpose = _masked_transpose(lambda ct, b: (primitives.masked_gmm_kn, ct, b),
                                          lambda ct, a: (primitives.masked_tgmm, ct, a))
# masked_gmm_kn: d a = dout @ b^T (masked_gmm with b (G, K, N) as its (G, N', K')); d b = a^T @ dout (tgmm).
_masked_gmm_kn_transpose = _masked_transpose(lambda ct, b: (primitives.masked_gmm, ct, b),
                                             lambda ct, a: (primitives.masked_tgmm, a, ct))
# masked_tgmm: d a[g, :m] = b[g, :m] @ dout[g]^T (masked_gmm, dout as (G, N', K')); d b[g, :m] = a[g, :m] @ dout[g].
_masked_tgmm_transpose = _masked_transpose(lambda ct, b: (primitives.masked_gmm, b, ct),
                                           lambda ct, a: (primitives.masked_gmm_kn, a, ct))


def _typed_as_primals(transpose):
  """The transpose rule with each cotangent resharded as its primal: under explicit sharding the primitive that
  computes it types its result by its own operands (jgmm/partitioning.py), e.g. d rhs of a group-sharded rhs."""
  def rule(cts, *primals, **params):
    return [c if c is None or not ad.is_undefined_primal(p) else partitioning.reshard_as(c, p.aval)
            for c, p in zip(transpose(cts, *primals, **params), primals)]
  return rule


for _bind, _jvp, _transpose in ((primitives.gmm, _gmm_jvp, _gmm_transpose),
                                (primitives.tgmm, _tgmm_jvp, _tgmm_transpose),
                                (primitives.masked_gmm, _bilinear_jvp(primitives.masked_gmm, config=None),
                                 _masked_gmm_transpose),
                                (primitives.masked_gmm_kn, _bilinear_jvp(primitives.masked_gmm_kn, config=None),
                                 _masked_gmm_kn_transpose),
                                (primitives.masked_tgmm, _bilinear_jvp(primitives.masked_tgmm, config=None),
                                 _masked_tgmm_transpose)):
  ad.primitive_jvps[_bind.primitive] = _jvp
  ad.primitive_transposes[_bind.primitive] = _typed_as_primals(_transpose)
