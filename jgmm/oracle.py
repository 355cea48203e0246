"""Float64 numpy oracle of jgmm's ops (the documented runtime semantics of jgmm/ops.py), for tests and `python -m jgmm`."""
import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def activation(name, h):
  if name is None:
    return h
  if name == "relu":
    return np.maximum(h, 0.0)
  if name == "gelu":
    return 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
  if name == "gelu_tanh":
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
  if name == "silu":
    return h / (1.0 + np.exp(-h))
  if name == "swiglu":
    gate, up = np.split(h, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up
  raise ValueError(name)


def row_ranges(group_sizes, m, group_offset=None, num_groups=None):
  """[(start, end)] of the local groups: negative sizes are 0, bounds clipped at m, offset clipped."""
  sizes = np.asarray(group_sizes, np.int64)
  num_groups = len(sizes) if num_groups is None else num_groups
  offset = 0 if group_offset is None else int(np.clip(np.asarray(group_offset).reshape(()), 0, len(sizes)))
  ends = np.minimum(np.cumsum(np.maximum(sizes, 0)), m)
  starts = np.concatenate([[0], ends[:-1]])
  ranges = [(int(starts[g]), int(ends[g])) if g < len(sizes) else (int(ends[-1]),) * 2
            for g in range(offset, offset + num_groups)]
  return ranges


def f64(x):
  return np.asarray(x, np.float64)


def gmm(lhs, rhs, group_sizes, *, bias=None, transpose_rhs=False, group_offset=None, existing_out=None,
        activation_name=None):
  lhs, rhs = f64(lhs), f64(rhs)
  if transpose_rhs:
    rhs = np.swapaxes(rhs, 1, 2)
  m, n = lhs.shape[0], rhs.shape[2]
  out_n = n // 2 if activation_name == "swiglu" else n
  out = np.zeros((m, out_n)) if existing_out is None else f64(existing_out).copy()
  for g, (start, end) in enumerate(row_ranges(group_sizes, m, group_offset, rhs.shape[0])):
    h = lhs[start:end] @ rhs[g] + (0.0 if bias is None else f64(bias)[g])
    out[start:end] += activation(activation_name, h)
  return out


def tgmm(lhs, rhs, group_sizes, *, transpose_lhs=False, group_offset=None, num_actual_groups=None,
         existing_out=None):
  lhs, rhs = f64(lhs), f64(rhs)
  lhs_km = lhs.T if transpose_lhs else lhs
  ranges = row_ranges(group_sizes, rhs.shape[0], group_offset, num_actual_groups)
  out = np.zeros((len(ranges), lhs_km.shape[0], rhs.shape[1]))
  dbias = np.zeros((len(ranges), rhs.shape[1]))
  for g, (start, end) in enumerate(ranges):
    out[g] = lhs_km[:, start:end] @ rhs[start:end]
    dbias[g] = rhs[start:end].sum(axis=0)
  if existing_out is not None:
    out += f64(existing_out)
  return out, dbias


def masked_gmm(x, w, masked_m):
  x, w = f64(x), f64(w)
  out = np.einsum("gmk,gnk->gmn", x, w)
  rows = np.arange(x.shape[1])[None, :, None]
  return np.where(rows < np.clip(np.asarray(masked_m), 0, x.shape[1])[:, None, None], out, 0.0)


def dequantize(q, scale, recipe):
  """The float64 value of an FP8 operand q with its scales (jgmm.quantize's recipe; a scale of one dimension
  fewer than q is per row whatever `recipe` says)."""
  from jgmm import quantize  # jax: only for the FP8 checks
  recipe = "row" if np.ndim(scale) < np.ndim(q) else recipe
  return f64(np.asarray(q, np.float32)) * f64(quantize.broadcast_scale(scale, recipe, q.shape))


def deepgemm_diff(x, y):
  """DeepGEMM's calc_diff 1 - 2 sum(x y) / sum(x^2 + y^2): 0 for equal arrays; < 1e-3 is its bar for an FP8
  product against the bf16 one."""
  x, y = f64(x), f64(y)
  return 1.0 - 2.0 * np.sum(x * y) / np.sum(x * x + y * y)


def rel_err(actual, expected):
  actual, expected = f64(actual), f64(expected)
  assert not np.isnan(actual).any(), "NaN in the result (unwritten or poisoned elements)"
  return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
