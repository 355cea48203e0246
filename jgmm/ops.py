"""jgmm's public ops: validation, group bounds, and one primitive call each (derivatives: jgmm/autodiff.py).

Runtime semantics, for every backend: negative group sizes count as 0; group boundaries are clipped at M
(rows past M are never read); group_offset is clipped to [0, len(group_sizes)] and groups past the end of
group_sizes are empty; masked_m is clipped to [0, max_m]. Sizes of any integer dtype are widened before they
are clipped (int64 values past int32 saturate, never wrap). No input value makes any backend read or write
out of bounds.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jgmm import autodiff, fp8, partitioning, primitives, validation  # noqa: F401 (autodiff registers the rules)
from jgmm.config import Config

_INT32_MAX = np.iinfo(np.int32).max


def clip_to_int32(values, upper):
  """Integer `values` (any integer dtype) clipped to [0, upper] as int32, compared in a dtype wide enough to
  hold both (a narrow dtype would wrap `upper`; int64 values past int32 would wrap when narrowed first)."""
  if jnp.iinfo(values.dtype).max > _INT32_MAX:
    return jnp.clip(values, 0, upper).astype(jnp.int32)
  return jnp.clip(values.astype(jnp.int32), 0, upper)


def group_bounds(group_sizes, group_offset, num_groups, m):
  """Row bounds (num_groups + 1,) int32 of the local groups [group_offset, group_offset + num_groups).

  Rows of local group g are [bounds[g], bounds[g + 1]); 0 <= bounds[0] <= ... <= bounds[-1] <= m whatever
  group_sizes (G_total,) and group_offset hold.
  """
  sizes = clip_to_int32(partitioning.replicated(group_sizes), m)  # Every shard needs all the sizes.
  # Where no prefix sum can overflow (M known, not symbolic): one cumsum, one small GPU kernel before the product.
  if isinstance(m, (int, np.integer)) and sizes.shape[0] * m < 2**31:
    ends = jnp.minimum(jnp.cumsum(sizes, dtype=jnp.int32), m)
  else:  # min(a + b, m) without overflow: prefix sums clipped at m (a scan of log2(G) levels, 2-3 kernels).
    ends = lax.associative_scan(lambda a, b: jnp.minimum(a, m - b) + b, sizes)
  edges = jnp.concatenate([jnp.zeros(1, jnp.int32), ends])
  if group_offset is None:
    return edges
  total = group_sizes.shape[0]
  edges = jnp.concatenate([edges, jnp.broadcast_to(ends[-1], (num_groups,))])
  offset = clip_to_int32(jnp.reshape(jnp.asarray(group_offset), ()), total)
  return lax.dynamic_slice(edges, (offset,), (num_groups + 1,))


def gmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, bias: jax.Array | None = None,
        transpose_rhs: bool = False, preferred_element_type: jnp.dtype | None = None,
        group_offset: int | jax.Array | None = None, existing_out: jax.Array | None = None,
        activation: str | None = None, precision: lax.PrecisionLike = None, config: Config | dict | None = None,
        backend: str | None = None, lhs_scale: jax.Array | None = None, rhs_scale: jax.Array | None = None
        ) -> jax.Array:
  """Grouped matrix multiplication: out[rows of g] = act(lhs[rows of g] @ rhs[g] + bias[g]).

  Args:
    lhs: (M, K) float32, bfloat16 or float16, or FP8 (float8_e4m3fn / e4m3fnuz) with lhs_scale; rows grouped
      contiguously in group order.
    rhs: (G, K, N), or (G, N, K) when transpose_rhs (FP8: the faster layout); lhs's dtype (cast fp32 master
      weights to it: `rhs.astype(lhs.dtype)`; the gradient flows back through the cast).
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
    precision: as for jax.lax.dot: lax.Precision.HIGHEST ("highest", "float32") multiplies float32 inputs
      exactly on GPUs too; anything else lets NVIDIA GPUs use TF32 tensor cores for them (as XLA does).
      jax.default_matmul_precision("float32") at lowering time also asks for exact products.
    config: optional jgmm.Config (or dict of its fields); default from the tuned table.
    backend: None (Triton on GPU, portable elsewhere and for symbolic shapes), "triton" or "xla" (portable).
    lhs_scale, rhs_scale: float32 scales of FP8 lhs and rhs (jgmm.fp8): lhs_scale (M,) per row or
      (M, cdiv(K, 128)) per 1x128 block; rhs_scale (G, N) per channel or (G, cdiv(N, 128), cdiv(K, 128)) per
      128x128 block. FP8 output defaults to bfloat16; no bias, existing_out, activation or precision with FP8.

  Returns:
    (M, N_out) with N_out = N (N // 2 for swiglu). Rows outside the computed groups are 0 (or existing_out).
  """
  if validation.fp8_requested((lhs, rhs), (lhs_scale, rhs_scale)):
    return fp8.gmm(lhs, rhs, group_sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, bias=bias,
                   transpose_rhs=transpose_rhs, preferred_element_type=preferred_element_type,
                   group_offset=group_offset, existing_out=existing_out, activation=activation, precision=precision,
                   config=config, backend=backend)
  m, _, _, _, out_dtype, precision, config, backend = validation.check_gmm(
      lhs, rhs, group_sizes, bias, transpose_rhs, preferred_element_type, group_offset, existing_out,
      activation, precision, config, backend)
  bounds = group_bounds(group_sizes, group_offset, rhs.shape[0], m)
  return primitives.gmm(lhs, rhs, bounds, bias, existing_out, transpose_rhs=transpose_rhs, out_dtype=out_dtype,
                        activation=activation, save_preactivation=False, precision=precision, config=config,
                        backend=backend)[0]


def tgmm(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, transpose_lhs: bool = False,
         transpose_rhs: bool = False, preferred_element_type: jnp.dtype | None = None,
         group_offset: int | jax.Array | None = None, num_actual_groups: int | None = None,
         existing_out: jax.Array | None = None, bias_grad: bool = False,
         precision: lax.PrecisionLike = None, config: Config | dict | None = None,
         backend: str | None = None, lhs_scale: jax.Array | None = None,
         rhs_scale: jax.Array | None = None,
         rhs_scale_per_group: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
  """Transposed grouped matmul (the weight gradient): out[g] = lhs[:, rows of g] @ rhs[rows of g].

  Args:
    lhs: (K, M), or (M, K) when transpose_lhs (read transposed, no copy); float32/bfloat16/float16, or FP8 with
      lhs_scale.
    rhs: (M, N), or (N, M) when transpose_rhs; lhs's dtype.
    group_sizes: (G_total,) integer rows per group.
    transpose_lhs: lhs is (M, K).
    transpose_rhs: rhs is (N, M): read in place with FP8 (with lhs (K, M), the layout Hopper's FP8 tensor cores
      read), through one transposed copy otherwise.
    preferred_element_type: output dtype; default lhs's dtype.
    group_offset: optional int or int array of shape () or (1,), first group computed.
    num_actual_groups: optional int G <= G_total: compute groups [group_offset, group_offset + G).
    existing_out: optional (G, K, N) of the output dtype, added to the result.
    bias_grad: also return the float32 (G, N) per-group column sums of rhs.
    precision, config, backend: as for gmm.
    lhs_scale, rhs_scale: float32 scales of FP8 lhs and rhs (jgmm.fp8), per 128 rows of M of each column:
      lhs_scale (cdiv(M, 128), K) for lhs (M, K) or (K, cdiv(M, 128)) for lhs (K, M); rhs_scale
      (cdiv(M, 128), N) for rhs (M, N) or (N, cdiv(M, 128)) for rhs (N, M). FP8 output defaults to bfloat16;
      no existing_out, bias_grad or precision with FP8.
    rhs_scale_per_group: FP8 only: rhs_scale holds one scale per group of group_sizes and column instead, (G_total,
      N) for rhs (M, N) or (N, G_total) for rhs (N, M) (fp8_gmm's wgrad_scale="group": the kernels apply it once
      per output tile, not on every 128 rows).

  Returns:
    (G, K, N); empty groups are exact zeros. With bias_grad, (out, dbias (G, N) float32). Rows outside the groups
    never reach the result, whatever they hold, but for the warp-specialised kernels on Hopper
    (Config.warp_specialized), which read whole reduction steps and multiply the rows in them outside the group by
    zeros in lhs only:
    - bf16/fp16 with transpose_lhs: steps of config.block_k rows, some of them another group's: an inf or NaN in
      rhs in another group's rows within block_k rows of a group makes that group's result NaN; where all groups
      together hold fewer than block_k rows and start past row 0, so do rows after the groups.
    - FP8 with lhs (K, M) and rhs (N, M): 128-row steps on M's scale grid: a NaN in rhs in a group's first or last
      step outside the group (another group's rows, or rows of none) makes that group's result NaN.
  """
  if validation.fp8_requested((lhs, rhs), (lhs_scale, rhs_scale)):
    return fp8.tgmm(lhs, rhs, group_sizes, lhs_scale=lhs_scale, rhs_scale=rhs_scale, transpose_lhs=transpose_lhs,
                    transpose_rhs=transpose_rhs, preferred_element_type=preferred_element_type,
                    group_offset=group_offset, num_actual_groups=num_actual_groups, existing_out=existing_out,
                    bias_grad=bias_grad, precision=precision, config=config, backend=backend,
                    rhs_scale_per_group=rhs_scale_per_group)
  m, _, _, num_groups, out_dtype, precision, config, backend = validation.check_tgmm(
      lhs, rhs, group_sizes, transpose_lhs, transpose_rhs, preferred_element_type, group_offset, num_actual_groups,
      existing_out, bias_grad, precision, config, backend, rhs_scale_per_group=rhs_scale_per_group)
  bounds = group_bounds(group_sizes, group_offset, num_groups, m)
  outs = primitives.tgmm(lhs, rhs.T if transpose_rhs else rhs, bounds, existing_out, transpose_lhs=transpose_lhs,
                         out_dtype=out_dtype, bias_grad=bias_grad, precision=precision, config=config, backend=backend)
  return tuple(outs) if bias_grad else outs[0]


def masked_gmm(x: jax.Array, w: jax.Array, masked_m: jax.Array, *, preferred_element_type: jnp.dtype | None = None,
               expected_m: int | None = None, precision: lax.PrecisionLike = None,
               config: Config | dict | None = None, backend: str | None = None, x_scale: jax.Array | None = None,
               w_scale: jax.Array | None = None) -> jax.Array:
  """Masked grouped matmul (DeepGEMM style): out[g, :masked_m[g]] = x[g, :masked_m[g]] @ w[g].T.

  Args:
    x: (G, max_m, K) float32/bfloat16/float16, or FP8 with x_scale; rows >= masked_m[g] are ignored.
    w: (G, N, K), x's dtype.
    masked_m: (G,) integer valid rows per group, clipped to [0, max_m].
    preferred_element_type: output dtype; default x's dtype.
    expected_m: optional int, the typical masked_m, to choose the tuned config.
    precision, config, backend: as for gmm.
    x_scale, w_scale: float32 scales of FP8 x and w (jgmm.fp8): x_scale (G, max_m) per row or
      (G, max_m, cdiv(K, 128)) per 1x128 block; w_scale (G, N) per channel or (G, cdiv(N, 128), cdiv(K, 128))
      per 128x128 block. FP8 output defaults to bfloat16; no precision with FP8.

  Returns:
    (G, max_m, N); rows >= masked_m[g] are exact zeros.
  """
  if validation.fp8_requested((x, w), (x_scale, w_scale)):
    return fp8.masked_gmm(x, w, masked_m, x_scale=x_scale, w_scale=w_scale,
                          preferred_element_type=preferred_element_type, expected_m=expected_m, precision=precision,
                          config=config, backend=backend)
  out_dtype, precision, config, backend = validation.check_masked_gmm(x, w, masked_m, preferred_element_type,
                                                                      expected_m, precision, config, backend)
  masked_m = clip_to_int32(masked_m, x.shape[1])
  return primitives.masked_gmm(x, w, masked_m, out_dtype=out_dtype, expected_m=expected_m, precision=precision,
                               config=config, backend=backend)[0]


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, precision: lax.PrecisionLike = None,
               preferred_element_type: jnp.dtype | None = None, group_offset: jax.Array | None = None,
               out_sharding=None) -> jax.Array:
  """Drop-in replacement for `jax.lax.ragged_dot`: lhs (m, k), rhs (g, k, n), group_sizes (g,) -> (m, n).

  Same signature, argument checks and dtype rules as the installed jax.lax.ragged_dot: the output dtype is
  lax's (mixed input dtypes are promoted as lax does); float32/bfloat16/float16 products run on jgmm's kernels
  (inputs cast to their promoted dtype), other dtypes (integers, float64 under jax_enable_x64) go to
  jax.lax.ragged_dot itself. precision=lax.Precision.HIGHEST gives exact float32 products on GPUs.
  group_offset (shape () or (1,)) computes groups [group_offset, group_offset + g) of a longer group_sizes,
  which lax.ragged_dot does not implement. out_sharding, where the installed jax takes it, reshards the result.
  """
  lax_kwargs = dict(precision=precision, preferred_element_type=preferred_element_type)
  if out_sharding is not None:
    lax_kwargs["out_sharding"] = out_sharding
  lhs, rhs, group_sizes = (jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in (lhs, rhs, group_sizes))
  for name, x in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)):
    if not isinstance(x, jax.Array):
      raise TypeError(f"ragged_dot: {name} must be a jax or numpy array, got {type(x).__name__}")
  specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (lhs, rhs, group_sizes)]
  if group_offset is not None:  # lax.ragged_dot implements no group_offset: check the local groups' call.
    specs[2] = jax.ShapeDtypeStruct(rhs.shape[:1], group_sizes.dtype)
  compute_dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
  try:
    with partitioning.without_mesh():  # The dtype and checks only: lax infers no result sharding on Explicit axes.
      out_dtype = jax.eval_shape(functools.partial(lax.ragged_dot, **lax_kwargs), *specs).dtype
  except (TypeError, ValueError):  # jgmm's checks name the argument, what they saw and what they expected.
    lhs_spec, rhs_spec = (jax.ShapeDtypeStruct(x.shape, compute_dtype) for x in (lhs, rhs))
    validation.check_gmm(lhs_spec, rhs_spec, group_sizes, None, False, preferred_element_type, group_offset, None,
                         None, precision, None, None)
    raise
  if compute_dtype not in validation.FLOAT_DTYPES or out_dtype not in validation.FLOAT_DTYPES:
    return lax.ragged_dot(lhs, rhs, group_sizes, group_offset=group_offset, **lax_kwargs)
  out = gmm(lhs.astype(compute_dtype), rhs.astype(compute_dtype), group_sizes, preferred_element_type=out_dtype,
            group_offset=group_offset, precision=precision)
  return out if out_sharding is None else jax.sharding.reshard(out, out_sharding)
