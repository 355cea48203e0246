"""Portable pure-JAX backend: the CPU lowering, and `backend="xla"` on any platform.

Rows are cut into tiles of `tile_m` rows. A work item is one (group, row tile) pair whose rows overlap; there
are at most cdiv(M, tile_m) + G - 1 of them (megablox's schedule), so the FLOPs stay near 2*M*K*N rather than
the G-fold dense product of `jax.lax.ragged_dot`. A `lax.scan` over the work items does one dense dot per
item and writes (gmm) or accumulates (tgmm) only the rows of the item's group.

Zero carries start from `lax.full_like(lhs, ...)` so that inside shard_map they vary over lhs's mesh axes.

`bounds` (G + 1,) int32, sanitised by the caller: rows of local group g are [bounds[g], bounds[g + 1]), with
0 <= bounds[0] <= ... <= bounds[G] <= M.
"""
import jax
import jax.numpy as jnp
from jax import lax

from jgmm import activations, quantize

_F32 = jnp.float32


def _tile_m(m, num_groups, config):
  if config is not None:
    return config.block_m
  if not isinstance(m, int):  # Symbolic (jax.export): the largest tile.
    return 128
  rows_per_group = max(1, -(-m // num_groups))
  return min(128, max(16, 1 << (rows_per_group - 1).bit_length()))


def _work_items(bounds, m, tile_m):
  """(group, row tile, valid) of each work item, padded to the static bound cdiv(m, tile_m) + G - 1."""
  num_groups = bounds.shape[0] - 1
  starts, ends = bounds[:-1], bounds[1:]
  first_tile = starts // tile_m
  counts = jnp.where(ends > starts, (ends - 1) // tile_m - first_tile + 1, 0)
  offsets = jnp.cumsum(counts)
  num_items = -(-m // tile_m) + num_groups - 1
  item = jnp.arange(num_items, dtype=jnp.int32)
  group = jnp.sum(offsets[None, :] <= item[:, None], axis=1, dtype=jnp.int32)
  valid = group < num_groups
  group = jnp.minimum(group, num_groups - 1)
  tile = first_tile[group] + item - (offsets[group] - counts[group])
  return group, jnp.where(valid, tile, 0), valid


def _pad_rows(x, rows, axis=0):
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, rows - x.shape[axis])
  return jnp.pad(x, pad)


def _dot(x, y, contract, batch=((), ())):
  """Float32-accumulated product; float32 inputs multiply exactly (HIGHEST) whatever the caller's precision."""
  precision = lax.Precision.HIGHEST if x.dtype == _F32 else None
  return lax.dot_general(x, y, (contract, batch), precision=precision, preferred_element_type=_F32)


def gmm(lhs, rhs, bounds, bias, existing_out, *, transpose_rhs, out_dtype, activation,
        save_preactivation, config, precision=None):
  """out (M, N_out) = act(lhs rows of g @ rhs[g] + bias[g]) (+ existing_out); see module docstring."""
  del precision  # float32 products are exact here (_dot).
  m, _ = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  out_n = n // 2 if activation == "swiglu" else n
  out = lax.full_like(lhs, 0, out_dtype, (m, out_n)) if existing_out is None else existing_out
  preact = lax.full_like(lhs, 0, out_dtype, (m, n))
  if m == 0:
    return (out, preact) if save_preactivation else out
  tile_m = _tile_m(m, num_groups, config)
  rows = -(-m // tile_m) * tile_m
  lhs = _pad_rows(lhs, rows)
  contract = ((1,), (1,)) if transpose_rhs else ((1,), (0,))

  def step(carry, item):
    out, preact = carry
    group, tile, valid = item
    row0 = tile * tile_m
    h = _dot(lax.dynamic_slice_in_dim(lhs, row0, tile_m), rhs[group], contract)
    if bias is not None:
      h = h + bias[group].astype(_F32)
    row = row0 + jnp.arange(tile_m)
    in_group = (valid & (row >= bounds[group]) & (row < bounds[group + 1]))[:, None]
    old = lax.dynamic_slice_in_dim(out, row0, tile_m)
    new = jnp.where(in_group, (old.astype(_F32) + activations.apply(activation, h)).astype(out_dtype), old)
    out = lax.dynamic_update_slice_in_dim(out, new, row0, 0)
    if save_preactivation:
      old_h = lax.dynamic_slice_in_dim(preact, row0, tile_m)
      preact = lax.dynamic_update_slice_in_dim(preact, jnp.where(in_group, h.astype(out_dtype), old_h), row0, 0)
    return (out, preact), None

  carry = (_pad_rows(out, rows), _pad_rows(preact, rows) if save_preactivation else preact)
  (out, preact), _ = lax.scan(step, carry, _work_items(bounds, m, tile_m))
  return (out[:m], preact[:m]) if save_preactivation else out[:m]


def tgmm(lhs, rhs, bounds, existing_out, *, transpose_lhs, out_dtype, bias_grad, config, precision=None):
  """out (G, K, N): out[g] = lhs_KM[:, rows of g] @ rhs[rows of g] (+ existing_out); empty groups are 0."""
  del precision
  m, n = rhs.shape
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  num_groups = bounds.shape[0] - 1
  out = lax.full_like(lhs, 0, _F32, (num_groups, k, n))
  dbias = lax.full_like(lhs, 0, _F32, (num_groups, n))
  if m > 0:
    tile_m = _tile_m(m, num_groups, config)
    rows = -(-m // tile_m) * tile_m
    lhs = _pad_rows(lhs, rows, axis=0 if transpose_lhs else 1)
    rhs = _pad_rows(rhs, rows)

    def step(carry, item):
      out, dbias = carry
      group, tile, valid = item
      row0 = tile * tile_m
      row = row0 + jnp.arange(tile_m)
      in_group = valid & (row >= bounds[group]) & (row < bounds[group + 1])
      x = lax.dynamic_slice_in_dim(lhs, row0, tile_m, axis=0 if transpose_lhs else 1)
      x = jnp.where(in_group[:, None] if transpose_lhs else in_group[None, :], x, 0)
      y = jnp.where(in_group[:, None], lax.dynamic_slice_in_dim(rhs, row0, tile_m), 0)
      product = _dot(x, y, ((0,), (0,)) if transpose_lhs else ((1,), (0,)))
      out = out.at[group].add(product)
      dbias = dbias.at[group].add(jnp.sum(y.astype(_F32), axis=0)) if bias_grad else dbias
      return (out, dbias), None

    (out, dbias), _ = lax.scan(step, (out, dbias), _work_items(bounds, m, tile_m))
  if existing_out is not None:
    out = existing_out.astype(_F32) + out
  out = out.astype(out_dtype)
  return (out, dbias) if bias_grad else out


def _valid_rows(x, masked_m):
  """x (G, max_m, C) with rows >= masked_m[g] zeroed."""
  row = jnp.arange(x.shape[1])
  return jnp.where(row[None, :, None] < masked_m[:, None, None], x, 0)


def masked_gmm(x, w, masked_m, *, out_dtype, expected_m, config, precision=None):
  """out (G, max_m, N) = x[g] @ w[g].T on rows < masked_m[g], exact zeros elsewhere."""
  del expected_m, precision, config  # One batched dot: the dense layout leaves nothing to tile.
  return _valid_rows(_dot(x, w, ((2,), (2,)), batch=((0,), (0,))), masked_m).astype(out_dtype)


def masked_gmm_kn(x, w, masked_m, *, out_dtype, expected_m, config, precision=None):
  """out (G, max_m, N) = x[g] @ w[g] (w (G, K, N)) on rows < masked_m[g], exact zeros elsewhere."""
  del expected_m, precision, config
  return _valid_rows(_dot(x, w, ((2,), (1,)), batch=((0,), (0,))), masked_m).astype(out_dtype)


def masked_tgmm(lhs, rhs, masked_m, *, out_dtype, config, precision=None):
  """out (G, K, N)[g] = lhs[g, :masked_m[g]].T @ rhs[g, :masked_m[g]]; empty groups are exact zeros."""
  del precision, config
  return _dot(_valid_rows(lhs, masked_m), _valid_rows(rhs, masked_m), ((1,), (1,)), batch=((0,), (0,))).astype(
      out_dtype)


# ---------------------------------------------------------------------------------------------------------------
# FP8 with scales (jgmm.fp8): dequantised to float32 block by block (`quantize.dequantize`), then the products
# above, so the FLOPs stay those of one grouped product. A scale of one dimension fewer than its operand is per
# row / per channel, else per block (1x128 for activations, 128x128 for weights, 128x1 for tgmm's operands).


def _dequantize(q, scale, blocks):
  return quantize.dequantize(q, scale, "row" if scale.ndim < q.ndim else blocks)


def dequantized(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs):
  """(lhs * lhs_scale, rhs * rhs_scale as (..., N, K)) in float32: lhs (M, K) per row or 1x128 block; rhs (..., N, K)
  if transpose_rhs, else (..., K, N), rhs_scale indexed (..., N[/128], K/128) in both layouts."""
  return (_dequantize(lhs, lhs_scale, "1x128"),
          _dequantize(rhs if transpose_rhs else jnp.swapaxes(rhs, -1, -2), rhs_scale, "128x128"))


def gmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_rhs, out_dtype, config):
  """out (M, N) = (lhs * lhs_scale)[rows of g] @ (rhs[g] * rhs_scale[g]); rhs (G, N, K) if transpose_rhs, else
  (G, K, N); scales as jgmm.fp8.gmm documents (`dequantized`)."""
  lhs, rhs_nk = dequantized(lhs, rhs, lhs_scale, rhs_scale, transpose_rhs)
  return gmm(lhs, rhs_nk, bounds, None, None, transpose_rhs=True, out_dtype=out_dtype, activation=None,
             save_preactivation=False, config=config)


def masked_gmm_fp8(x, w, masked_m, x_scale, w_scale, *, out_dtype, expected_m, config):
  """out (G, max_m, N) = (x[g] * x_scale[g]) @ (w[g] * w_scale[g]).T on rows < masked_m[g], zeros elsewhere."""
  return masked_gmm(_dequantize(x, x_scale, "1x128"), _dequantize(w, w_scale, "128x128"), masked_m,
                    out_dtype=out_dtype, expected_m=expected_m, config=config)


def row_groups(bounds, m):
  """(M,) int32 local group of each row (clipped into [0, G)), and whether the row is in one."""
  row = jnp.arange(m)
  group = jnp.clip(jnp.searchsorted(bounds[1:], row, side="right", method="compare_all"), 0, bounds.shape[0] - 2)
  return group, (row >= bounds[0]) & (row < bounds[-1])


def tgmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_lhs, transpose_rhs, out_dtype, config,
             rhs_scale_per_group=False, transpose_out=False):
  """out (G, K, N)[g] = (lhs * lhs_scale)_KM[:, rows of g] @ (rhs * rhs_scale)_MN[rows of g]: scales per 128 rows
  of M (lhs_scale (cdiv(M, 128), K) with lhs (M, K), (K, cdiv(M, 128)) with lhs (K, M); rhs_scale
  (cdiv(M, 128), N) with rhs (M, N), (N, cdiv(M, 128)) with rhs (N, M)), or rhs's per group and column where
  rhs_scale_per_group (rhs_scale (G, N) with rhs (M, N), (N, G) with rhs (N, M)); transpose_out: (G, N, K)."""
  lhs = quantize.dequantize(lhs, lhs_scale, "128x1" if transpose_lhs else "1x128")
  if rhs_scale_per_group:  # Each row of M takes its group's scales (rows of no group are not summed).
    group, _ = row_groups(bounds, rhs.shape[1] if transpose_rhs else rhs.shape[0])
    rhs = rhs.astype(jnp.float32) * (rhs_scale[:, group] if transpose_rhs else rhs_scale[group])
  else:
    rhs = quantize.dequantize(rhs, rhs_scale, "1x128" if transpose_rhs else "128x1")
  rhs = rhs.T if transpose_rhs else rhs
  out = tgmm(lhs, rhs, bounds, None, transpose_lhs=transpose_lhs, out_dtype=out_dtype, bias_grad=False,
             config=config)
  return jnp.swapaxes(out, 1, 2) if transpose_out else out


def quantize_pair(x, *, recipe, dtype):
  """(q, scale, qt, scale_t): x (R, C) or (G, R, C) quantised (jgmm.quantize) per recipe ("1x128" or "128x128") in
  its own layout and transposed (the last two axes swapped). 128x128 blocks have the same scales either way: qt is
  q's transposed copy; 1x128 blocks of the transpose run along x's rows."""
  q, scale = quantize.quantize(x, recipe, dtype)
  if recipe == "128x128":
    return q, scale, jnp.swapaxes(q, -1, -2), jnp.swapaxes(scale, -1, -2)
  return (q, scale, *quantize.quantize(jnp.swapaxes(x, -1, -2), recipe, dtype))


def quantize_pair_grouped(x, blocks, *, dtype, num_groups=None):
  """(q, scale, qt, scale_t): x (R, C) quantised 1x128 (jgmm.quantize), and its rows regrouped into PB blocks of
  128 and transposed: qt (C, 128 PB) holds block b's rows (blocks (2 or 3, PB) int32: rows [first[b], min(first[b]
  + 128, end[b])) within [0, R), none where first[b] >= end[b]) in columns [128 b, 128 b + 128), zeros past them,
  quantised 1x128 (scale_t (C, PB)); or, given num_groups, with one scale per group and column (scale_t (C, G):
  group_column_scales over blocks' third row, each block's group; fp8_gmm's wgrad_scale="group")."""
  first, end = blocks[0], blocks[1]
  rows = first[:, None] + jnp.arange(128)
  valid = ((rows >= 0) & (rows < jnp.minimum(end, x.shape[0])[:, None])).reshape(-1)  # Rows outside x: zeros.
  if x.shape[0]:
    regrouped = jnp.where(valid[:, None], x[jnp.clip(rows.reshape(-1), 0, x.shape[0] - 1)], 0)
  else:  # No row to gather.
    regrouped = jnp.zeros((valid.shape[0], x.shape[1]), x.dtype)
  q_and_scale = quantize.quantize(x, "1x128", dtype)
  if num_groups is None:
    return (*q_and_scale, *quantize.quantize(regrouped.T, "1x128", dtype))
  fmax = quantize.FP8_MAX[jnp.dtype(dtype)]
  split = jnp.abs(regrouped.astype(jnp.float32)).reshape(-1, 128, x.shape[1])
  scales = group_column_scales(jnp.max(split, axis=1, initial=0.0), blocks[2], num_groups, fmax)
  per_row = jnp.repeat(scales[blocks[2]], 128, axis=0)  # (128 PB, C): each row's group's scales.
  qt = jnp.clip(regrouped.astype(jnp.float32) / per_row, -fmax, fmax).astype(dtype).T
  return (*q_and_scale, qt, scales[:num_groups].T)


def group_column_scales(amax, block_groups, num_groups, fmax):
  """(num_groups + 1, C) float32 scales, one per group and column: amax / fmax (1 where 0, as jgmm.quantize) of the
  largest of amax (PB, C) (per block and column) over the blocks of each group (block_groups (PB,) int32 in [0,
  num_groups]: num_groups for blocks of rows after the groups, or of none); NaN where any of them is NaN."""
  segments = dict(segment_ids=block_groups, num_segments=num_groups + 1, indices_are_sorted=True)
  group_amax = jnp.maximum(jax.ops.segment_max(amax, **segments), 0.0)  # An empty segment's -inf: 0.
  # NaN by a count, whatever a scatter's max does with it on the platform.
  has_nan = jax.ops.segment_sum(jnp.isnan(amax).astype(jnp.int32), **segments) > 0
  group_amax = jnp.where(has_nan, jnp.nan, group_amax)
  return quantize.scale_of_amax(group_amax, fmax)
