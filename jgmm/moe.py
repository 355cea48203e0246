"""Mixture-of-Experts layers on jgmm's grouped GEMMs: routing, token permutation, the expert MLP and an
expert-parallel recipe for shard_map.

Shapes: T tokens, H hidden width, E experts, k = top_k, n = T * k routed rows, F an expert's hidden width.
A routed slot (t, j) is token t's j-th choice; its flat index is t * k + j.

Semantics: expert ids outside [0, E) are dropped (their slots contribute 0); with a capacity, each expert
keeps its first `capacity` slots in flat (token-major) order and drops the rest. `Permutation.dropped`
reports both. Everything is differentiable in x, the router logits and the weights; no (T, E) one-hot and
no Python loop over experts is built; the sort is a stable argsort of the n expert ids.
"""
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jgmm import activations, fp8, ops, validation

FP8_DTYPE = jnp.dtype(jnp.float8_e4m3fn)  # The FP8 format of impl="fp8" (and of its fp8_weights).


class Permutation(NamedTuple):
  """What `unpermute` needs to scatter expert outputs back to their slots (a pytree of arrays).

  order: (n,) int32; sorted row i holds slot order[i].
  inverse: (n,) int32; slot s sits at sorted row inverse[s].
  dropped: (T, k) bool; slots that no expert computes (expert id outside [0, E), or over capacity).
  """
  order: jax.Array
  inverse: jax.Array
  dropped: jax.Array


def route(router_logits, top_k: int, *, score: str = "softmax", renormalize: bool = True, bias=None):
  """Top-k routing: router_logits (T, E) -> (weights (T, k) float32, expert_ids (T, k) int32).

  score: "softmax" (probabilities over all E experts) or "sigmoid" (independent gates, DeepSeek-V3).
  renormalize: divide the k selected scores by their sum (Mixtral, Qwen3, DeepSeek-V3).
  bias: optional (E,) added to the scores for the selection only (DeepSeek-V3's aux-loss-free balancing);
    the weights are the unbiased scores, and no gradient flows into bias.
  """
  validation.check_route(router_logits, top_k, score, renormalize, bias)
  logits = router_logits.astype(jnp.float32)
  scores = jax.nn.softmax(logits, axis=-1) if score == "softmax" else jax.nn.sigmoid(logits)
  selection = scores if bias is None else scores + lax.stop_gradient(bias.astype(jnp.float32))
  _, expert_ids = lax.top_k(lax.stop_gradient(selection), top_k)
  weights = jnp.take_along_axis(scores, expert_ids, axis=-1)
  if renormalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, expert_ids.astype(jnp.int32)


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
  """Rows per expert for a capacity factor: ceil(capacity_factor * T * k / E)."""
  return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _take_rows(x, index, inverse, fan_out):
  """x[index // fan_out] for a permutation `index` of (n,) with inverse `inverse`; x has n / fan_out rows.

  The backward is a gather too (g[inverse], summed over each row's fan_out copies), not a scatter-add.
  """
  return x[index // fan_out]


def _take_rows_fwd(x, index, inverse, fan_out):
  return _take_rows(x, index, inverse, fan_out), (index, inverse)


def _take_rows_bwd(fan_out, residuals, g):
  index, inverse = residuals
  dx = g[inverse].reshape(-1, fan_out, g.shape[-1])
  dx = dx[:, 0] if fan_out == 1 else jnp.sum(dx.astype(jnp.float32), axis=1).astype(g.dtype)
  return dx, None, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def permute(x, expert_ids, num_experts: int, *, capacity: int | None = None):
  """Sorts routed rows by expert: x (T, H), expert_ids (T, k) -> (rows (n, H), group_sizes (E,), Permutation).

  rows[i] = x[order[i] // k]: expert 0's rows first, each expert's in token order, dropped slots last (past
  sum(group_sizes)). capacity: optional rows per expert (see expert_capacity); slots past it are dropped.
  """
  validation.check_permute(x, expert_ids, num_experts, capacity)
  num_tokens, top_k = expert_ids.shape
  ids = expert_ids.reshape(-1).astype(jnp.int32)
  ids = jnp.where((ids >= 0) & (ids < num_experts), ids, num_experts)  # out of range: sorted last, dropped
  order = jnp.argsort(ids, stable=True).astype(jnp.int32)
  group_sizes = jnp.bincount(ids, length=num_experts + 1)[:num_experts].astype(jnp.int32)
  if capacity is not None:
    sorted_ids = ids[order]
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(group_sizes)])
    rank = jnp.arange(ids.shape[0], dtype=jnp.int32) - starts[sorted_ids]
    kept_ids = jnp.where(rank < capacity, sorted_ids, num_experts)
    order = order[jnp.argsort(kept_ids, stable=True)]
    group_sizes = jnp.minimum(group_sizes, capacity)
  rows_total = ids.shape[0]
  inverse = jnp.zeros(rows_total, jnp.int32).at[order].set(jnp.arange(rows_total, dtype=jnp.int32))
  dropped = (inverse >= jnp.sum(group_sizes)).reshape(num_tokens, top_k)
  return _take_rows(x, order, inverse, top_k), group_sizes, Permutation(order, inverse, dropped)


def unpermute(y, permutation: Permutation, weights=None):
  """Returns sorted rows to their slots: y (n, N) -> (T, k, N), or (T, N) = sum_j weights[:, j] * slot j.

  Dropped slots are exact zeros whatever y holds there. weights (T, k): the combination is in float32,
  the result in y's dtype.
  """
  num_tokens, top_k = permutation.dropped.shape
  validation.check_unpermute(y, permutation.order.shape[0], weights, num_tokens, top_k)
  slots = _take_rows(y, permutation.inverse, permutation.order, 1)
  slots = jnp.where(permutation.dropped.reshape(-1, 1), jnp.zeros((), y.dtype), slots)
  slots = slots.reshape(num_tokens, top_k, y.shape[1])
  if weights is None:
    return slots
  out = jnp.einsum("tk,tkn->tn", weights.astype(jnp.float32), slots.astype(jnp.float32))
  return out.astype(y.dtype)


def grouped_gemm(x, w, expert_ids, **gmm_options):
  """The expert-id form of gmm: out[t, j] = x[t] @ w[expert_ids[t, j]]; x (T, H), w (E, H, O) -> (T, k, O).

  Slots with an expert id outside [0, E) are zeros. gmm_options go to jgmm.gmm (backend, config, ...).
  """
  validation.check_grouped_gemm(x, w, expert_ids)
  rows, group_sizes, permutation = permute(x, expert_ids, w.shape[0])
  return unpermute(ops.gmm(rows, w, group_sizes, **gmm_options), permutation)


def _masked_layout(rows, group_sizes, max_rows):
  """Sorted rows (n, H) -> (E, max_rows, H) per-expert buffers (rows past max_rows are not computed)."""
  starts = jnp.cumsum(group_sizes) - group_sizes
  index = starts[:, None] + jnp.arange(max_rows, dtype=jnp.int32)[None, :]
  return jnp.take(rows, index, axis=0, mode="fill", fill_value=0)


def _from_masked_layout(y, group_sizes, num_rows):
  """(E, max_rows, N) per-expert outputs -> sorted rows (num_rows, N); rows past the groups are 0."""
  ends = jnp.cumsum(group_sizes)
  starts = ends - group_sizes
  row = jnp.arange(num_rows, dtype=jnp.int32)
  expert = jnp.clip(jnp.searchsorted(ends, row, side="right", method="compare_all"), 0, y.shape[0] - 1)
  slot = row - starts[expert]
  return jnp.where((slot < y.shape[1])[:, None], y[expert, jnp.minimum(slot, y.shape[1] - 1)], 0)


def expert_mlp(rows, group_sizes, w_gate_up, w_down, *, activation: str = "swiglu", impl: str = "jgmm",
               layout: str = "contiguous", max_rows_per_expert: int | None = None,
               fp8_weights: tuple[fp8.Fp8Weights, fp8.Fp8Weights] | None = None, backend: str | None = None):
  """Each expert's MLP on its rows: rows (n, H) sorted by expert, group_sizes (E,) -> (n, H).

  out[rows of e] = act(rows @ w_gate_up[e]) @ w_down[e]; w_gate_up (E, H, 2F) with [gate | up] columns for
  swiglu, else (E, H, F); w_down (E, F, H). Rows past sum(group_sizes) are 0.
  impl: "jgmm" (gmm with the fused activation), "fp8" (both products through jgmm.fp8_gmm, DeepSeek-V3's FP8
    recipe: activations quantised per 1x128 block, weights per 128x128, FP8 products forward and backward; the
    weights stay in their dtype as master weights) or "ragged_dot" (jax.lax.ragged_dot, the reference).
  layout: "contiguous" (gmm on the sorted rows) or "masked" (jgmm.masked_gmm on (E, max_rows_per_expert, H)
    per-expert buffers, the decode-time layout; it reads the weights transposed, a copy per call; default
    max_rows_per_expert = n, which never drops; rows past it are 0).
  fp8_weights: with impl="fp8", optional (jgmm.quantize_weights(w_gate_up), jgmm.quantize_weights(w_down)) made
    ahead, once for a step whose micro-batches reuse the weights (jgmm.fp8_gmm's rhs_fp8; gradients still go to
    w_gate_up and w_down).
  """
  validation.check_expert_mlp(rows, group_sizes, w_gate_up, w_down, activation, impl, layout, max_rows_per_expert,
                              fp8_weights, fp8.Fp8Weights, FP8_DTYPE)
  if layout == "masked":
    max_rows = rows.shape[0] if max_rows_per_expert is None else max_rows_per_expert
    buffers = _masked_layout(rows, group_sizes, max_rows)
    masked_m = jnp.minimum(group_sizes, max_rows)
    h = ops.masked_gmm(buffers, jnp.swapaxes(w_gate_up, 1, 2), masked_m, preferred_element_type=jnp.float32,
                       backend=backend)
    h = activations.apply(activation, h).astype(rows.dtype)
    y = ops.masked_gmm(h, jnp.swapaxes(w_down, 1, 2), masked_m, backend=backend)
    return _from_masked_layout(y, group_sizes, rows.shape[0])
  if impl == "ragged_dot":
    h = lax.ragged_dot(rows, w_gate_up, group_sizes, preferred_element_type=jnp.float32)
    h = activations.apply(activation, h).astype(rows.dtype)
    return lax.ragged_dot(h, w_down, group_sizes, preferred_element_type=jnp.float32).astype(rows.dtype)
  if impl == "fp8":
    gate_up_fp8, down_fp8 = fp8_weights or (None, None)
    h = fp8.fp8_gmm(rows, w_gate_up, group_sizes, preferred_element_type=jnp.float32, fp8_dtype=FP8_DTYPE,
                    rhs_fp8=gate_up_fp8, backend=backend)
    h = activations.apply(activation, h).astype(rows.dtype)
    return fp8.fp8_gmm(h, w_down, group_sizes, fp8_dtype=FP8_DTYPE, rhs_fp8=down_fp8, backend=backend)
  h = ops.gmm(rows, w_gate_up, group_sizes, activation=activation, backend=backend)
  return ops.gmm(h, w_down, group_sizes, backend=backend)


def _shared_mlp(x, shared_experts, activation):
  w_gate_up, w_down = shared_experts
  h = jnp.dot(x, w_gate_up, preferred_element_type=jnp.float32)
  h = activations.apply(activation, h).astype(x.dtype)
  return jnp.dot(h, w_down, preferred_element_type=jnp.float32)


def _combine(routed, x, shared_experts, activation):
  if shared_experts is None:
    return routed
  validation.check_shared_experts(x, shared_experts, activation)
  return (routed.astype(jnp.float32) + _shared_mlp(x, shared_experts, activation)).astype(x.dtype)


def moe_mlp(x, router_logits, w_gate_up, w_down, top_k: int, *, activation: str = "swiglu",
            score: str = "softmax", renormalize: bool = True, router_bias=None, shared_experts=None,
            capacity: int | None = None, return_dropped: bool = False, impl: str = "jgmm",
            layout: str = "contiguous", max_rows_per_expert: int | None = None,
            fp8_weights: tuple[fp8.Fp8Weights, fp8.Fp8Weights] | None = None, backend: str | None = None):
  """A Mixture-of-Experts MLP: x (T, H), router_logits (T, E) -> (T, H).

  out[t] = sum_j weights[t, j] * expert_mlp_{expert_ids[t, j]}(x[t]) (+ shared MLP(x[t])), with
  (weights, expert_ids) = route(router_logits, top_k, score=..., renormalize=..., bias=router_bias).
  w_gate_up (E, H, 2F) ([gate | up] columns for swiglu, else (E, H, F)), w_down (E, F, H), x's dtype.
  shared_experts: optional dense (w_gate_up (H, 2Fs), w_down (Fs, H)) applied to every token.
  capacity: optional rows per expert (dropless without); return_dropped: also return the (T, k) bool mask
  of dropped slots. impl, layout, max_rows_per_expert, fp8_weights, backend: as for expert_mlp.
  """
  validation.check_moe(x, router_logits, w_gate_up, w_down, activation)
  weights, expert_ids = route(router_logits, top_k, score=score, renormalize=renormalize, bias=router_bias)
  rows, group_sizes, permutation = permute(x, expert_ids, w_gate_up.shape[0], capacity=capacity)
  y = expert_mlp(rows, group_sizes, w_gate_up, w_down, activation=activation, impl=impl, layout=layout,
                 max_rows_per_expert=max_rows_per_expert, fp8_weights=fp8_weights, backend=backend)
  out = _combine(unpermute(y, permutation, weights), x, shared_experts, activation)
  return (out, permutation.dropped) if return_dropped else out


def load_balancing_loss(router_logits, expert_ids, num_experts: int):
  """Switch-Transformer auxiliary loss E * sum_e f_e * p_e: router_logits (T, E), expert_ids (T, k) -> ().

  f_e: fraction of routed slots sent to expert e (no gradient); p_e: mean softmax probability of e.
  Equals 1 for a perfectly balanced router.
  """
  counts = jnp.bincount(expert_ids.reshape(-1), length=num_experts)
  fraction = counts.astype(jnp.float32) / expert_ids.size
  mean_prob = jnp.mean(jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1), axis=0)
  return num_experts * jnp.sum(fraction * mean_prob)


# --------------------------------------------------------------------------------------------------------------
# Expert parallelism: call inside shard_map over an axis that shards both the tokens and the experts.


def _exclusive_cumsum(x, axis):
  return jnp.cumsum(x, axis=axis) - x


def _source_expert_ids(chunk_starts, chunk_sizes, local_experts, num_rows):
  """Local expert id of each received row (num_rows,); local_experts (the sentinel) for rows of no chunk.

  Received chunk c = source * local_experts + e starts at chunk_starts[c] (non-decreasing) with
  chunk_sizes[c] rows.
  """
  row = jnp.arange(num_rows, dtype=jnp.int32)
  chunk = jnp.searchsorted(chunk_starts, row, side="right", method="compare_all") - 1
  chunk = jnp.clip(chunk, 0, chunk_starts.shape[0] - 1)
  inside = row < chunk_starts[chunk] + chunk_sizes[chunk]
  return jnp.where(inside, chunk % local_experts, local_experts).astype(jnp.int32)


def _padded_blocks(rows, offsets, sizes, block):
  """(D, block, H) buffers: block d holds rows[offsets[d] : offsets[d] + sizes[d]], zeros after."""
  slot = jnp.arange(block, dtype=jnp.int32)[None, :]
  index = jnp.where(slot < sizes[:, None], offsets[:, None] + slot, rows.shape[0])
  return jnp.take(rows, index, axis=0, mode="fill", fill_value=0)


def default_dispatch() -> str:
  """"ragged" where jax has ragged_all_to_all and the default backend compiles it (not XLA:CPU), else "padded"."""
  ragged = hasattr(lax, "ragged_all_to_all") and jax.default_backend() != "cpu"
  return "ragged" if ragged else "padded"


def expert_parallel_moe_mlp(x, router_logits, w_gate_up, w_down, top_k: int, *, axis_name: str,
                            dispatch: str | None = None, activation: str = "swiglu", score: str = "softmax",
                            renormalize: bool = True, router_bias=None, shared_experts=None,
                            impl: str = "jgmm", layout: str = "contiguous", max_rows_per_expert: int | None = None,
                            fp8_weights: tuple[fp8.Fp8Weights, fp8.Fp8Weights] | None = None,
                            backend: str | None = None):
  """moe_mlp with the experts sharded over axis_name (D devices), for use inside shard_map. Dropless.

  On each device: x (T_local, H) its tokens, router_logits (T_local, E) over all E experts, w_gate_up
  (E / D, H, 2F) and w_down (E / D, F, H) its experts [i * E / D, (i + 1) * E / D) for axis index i; router_bias
  (E,) and shared_experts replicated. Returns (T_local, H), equal to moe_mlp on the gathered inputs.

  Each device routes and sorts its tokens, sends each device the rows for its experts, regroups what it
  received by local expert (group_sizes of its own experts), runs expert_mlp, and sends the results back.
  dispatch: "ragged" (jax.lax.ragged_all_to_all: only the routed rows travel), "padded" (jax.lax.all_to_all
  of (D, T_local * k, H) buffers: works on every backend), None for default_dispatch(). Each device holds
  a receive buffer of D * T_local * k rows (every routed row could pick its experts).
  fp8_weights: with impl="fp8", this device's experts' weights quantised ahead (expert_mlp's; quantize_weights of
  the whole weights shards with them along the experts, their first axis).
  """
  axis_size = lax.axis_size(axis_name)
  validation.check_moe(x, router_logits, w_gate_up, w_down, activation, axis_size, dispatch)
  mlp = functools.partial(expert_mlp, w_gate_up=w_gate_up, w_down=w_down, activation=activation, impl=impl,
                          layout=layout, max_rows_per_expert=max_rows_per_expert, fp8_weights=fp8_weights,
                          backend=backend)
  weights, expert_ids = route(router_logits, top_k, score=score, renormalize=renormalize, bias=router_bias)
  num_experts, local_experts = router_logits.shape[1], w_gate_up.shape[0]
  rows, group_sizes, permutation = permute(x, expert_ids, num_experts)
  if axis_size == 1:
    return _combine(unpermute(mlp(rows, group_sizes), permutation, weights), x, shared_experts, activation)
  dispatch = default_dispatch() if dispatch is None else dispatch
  me = lax.axis_index(axis_name)
  # counts[s, d, e]: rows device s sends to device d's local expert e; sizes[s, d] in total.
  counts = lax.all_gather(group_sizes.reshape(axis_size, local_experts), axis_name)
  sizes = jnp.sum(counts, axis=-1)
  send_sizes, recv_sizes = sizes[me], sizes[:, me]
  send_offsets = _exclusive_cumsum(sizes, 1)  # [s, d]: where s's rows for d start in s's sorted rows
  land_offsets = _exclusive_cumsum(sizes, 0)  # [s, d]: where s's rows land in d's receive buffer
  num_rows, buffer_rows = rows.shape[0], axis_size * rows.shape[0]
  if dispatch == "ragged":
    recv_starts = land_offsets[:, me]
    buffer = jnp.zeros_like(rows, shape=(buffer_rows, rows.shape[1]))  # varying over the axes rows vary over
    received = lax.ragged_all_to_all(rows, buffer, send_offsets[me], send_sizes, land_offsets[me], recv_sizes,
                                      axis_name=axis_name)
  else:
    recv_starts = jnp.arange(axis_size, dtype=jnp.int32) * num_rows
    blocks = _padded_blocks(rows, send_offsets[me], send_sizes, num_rows)
    received = lax.all_to_all(blocks, axis_name, 0, 0).reshape(buffer_rows, x.shape[1])
  recv_counts = counts[:, me, :]  # (D, E / D): rows for my experts from each source, in source order
  chunk_starts = (recv_starts[:, None] + _exclusive_cumsum(recv_counts, 1)).reshape(-1)
  local_ids = _source_expert_ids(chunk_starts, recv_counts.reshape(-1), local_experts, buffer_rows)
  local_rows, local_sizes, local_permutation = permute(received, local_ids[:, None], local_experts)
  results = unpermute(mlp(local_rows, local_sizes), local_permutation)[:, 0]
  if dispatch == "ragged":
    buffer = jnp.zeros_like(results, shape=rows.shape)
    sorted_y = lax.ragged_all_to_all(results, buffer, recv_starts, recv_sizes, send_offsets[:, me], send_sizes,
                                     axis_name=axis_name)
  else:
    returned = lax.all_to_all(results.reshape(axis_size, num_rows, -1), axis_name, 0, 0)
    row = jnp.arange(num_rows, dtype=jnp.int32)
    dest = jnp.clip(jnp.searchsorted(jnp.cumsum(send_sizes), row, side="right", method="compare_all"), 0, axis_size - 1)
    sorted_y = returned[dest, jnp.clip(row - send_offsets[me, dest], 0, num_rows - 1)]
  return _combine(unpermute(sorted_y, permutation, weights), x, shared_experts, activation)
