"""FP8 quantisation for jgmm's FP8 ops: q = x / scale in float8, scale = amax of the block / the format's max.

    q, scale = jgmm.quantize.quantize(x, "1x128")             # float8_e4m3fn, amax / 448
    x_back = jgmm.quantize.dequantize(q, scale, "1x128")      # float32, q * scale

Recipes (blocks along the trailing axes; a trailing axis not a multiple of the block has a partial last block):
  "row"     x (..., K)    -> scale (...,): one scale per row (activations per row; weights (G, N, K) per output
            channel N).
  "1x128"   x (..., K)    -> scale (..., cdiv(K, 128)): 128 consecutive elements of a row (DeepSeek-V3
            activations).
  "128x128" x (..., N, K) -> scale (..., cdiv(N, 128), cdiv(K, 128)): square blocks (DeepSeek-V3 weights).
  "128x1"   x (..., M, C) -> scale (..., cdiv(M, 128), C): 128 consecutive rows of a column (FP8 tgmm's operands,
            blocks along the grouped M dimension: jgmm.fp8 explains why).
Scales are float32. An all-zero block gets scale 1 (q = 0); a block holding inf or NaN gets a non-finite
scale and its elements propagate as IEEE division says. dtype: float8_e4m3fn (NVIDIA, max 448) or
float8_e4m3fnuz (ROCm, max 240).
"""
import jax.numpy as jnp

from jgmm import validation

FP8_MAX = {jnp.dtype(jnp.float8_e4m3fn): 448.0, jnp.dtype(jnp.float8_e4m3fnuz): 240.0}
BLOCK = 128
RECIPES = ("row", "1x128", "128x128", "128x1")


def _count(size, block):
  """Blocks of `block` elements along an axis of `size`; a block of 0 ("row" of an empty row) is the whole axis."""
  return -(-size // block) if block else 1


def _blocks(recipe, shape):
  """The block size along each axis of `shape` for `recipe` (whole rows for "row")."""
  if recipe not in RECIPES:
    raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
  ndim = 2 if recipe in ("128x128", "128x1") else 1
  if len(shape) < ndim:
    raise ValueError(f"recipe {recipe!r} needs at least {ndim} dimensions, got shape {tuple(shape)}")
  trailing = {"row": (shape[-1],), "1x128": (BLOCK,), "128x128": (BLOCK, BLOCK), "128x1": (BLOCK, 1)}[recipe]
  return (1,) * (len(shape) - len(trailing)) + trailing


def scale_shape(recipe, shape):
  """The shape of the scales `quantize(x, recipe)` returns for x of `shape`."""
  blocks = _blocks(recipe, shape)
  out = tuple(_count(d, b) for d, b in zip(shape, blocks))
  return out[:-1] if recipe == "row" else out


def _split(x, blocks):
  """x zero-padded to whole blocks and reshaped to (count, block) per axis: (n0, b0, n1, b1, ...)."""
  padded = jnp.pad(x, [(0, _count(d, b) * b - d) for d, b in zip(x.shape, blocks)])
  return padded.reshape([n for d, b in zip(x.shape, blocks) for n in (_count(d, b), b)])


def _merge(split, shape):
  """The inverse of _split: (n0, b0, n1, b1, ...) back to `shape` (padding dropped)."""
  padded = split.reshape([split.shape[i] * split.shape[i + 1] for i in range(0, split.ndim, 2)])
  return padded[tuple(slice(0, d) for d in shape)]


def _per_block(scale, recipe, shape):
  """scale (`scale_shape`) as (n0, 1, n1, 1, ...): one value per block, broadcasting over _split's layout."""
  counts = [_count(d, b) for d, b in zip(shape, _blocks(recipe, shape))]
  return scale.reshape([n for c in counts for n in (c, 1)])


def broadcast_scale(scale, recipe, shape):
  """The scales of x (`shape`) broadcast to its elements: each scale over its block."""
  blocks = _blocks(recipe, shape)
  per_block = _per_block(scale, recipe, shape)
  return _merge(jnp.broadcast_to(per_block, [n for c, b in zip(per_block.shape[::2], blocks) for n in (c, b)]),
                shape)


def scale_of_amax(amax, fmax):
  """A block's scale from its largest magnitude amax: amax / fmax, 1 where amax is 0 (an all-zero block)."""
  return jnp.where(amax == 0, 1.0, amax / fmax)


def quantize(x, recipe, dtype=jnp.float8_e4m3fn):
  """(q, scale): q (x's shape, dtype) = x / scale rounded to FP8, scale float32 (`scale_shape(recipe, x.shape)`).

  Blocks are reshapes of x (no gathers): one reduction and one elementwise pass, which XLA fuses."""
  dtype = validation.check_fp8_dtype("dtype", dtype)
  x = jnp.asarray(x)
  fmax = FP8_MAX[dtype]
  split = _split(x.astype(jnp.float32), _blocks(recipe, x.shape))
  amax = jnp.max(jnp.abs(split), axis=tuple(range(1, split.ndim, 2)), keepdims=True, initial=0.0)  # 0: empty
  scale = scale_of_amax(amax, fmax)
  q = _merge(jnp.clip(split / scale, -fmax, fmax).astype(dtype), x.shape)
  return q, scale.reshape(scale_shape(recipe, x.shape))


def dequantize(q, scale, recipe, dtype=jnp.float32):
  """q * scale (each scale over its block) in `dtype`: the inverse of `quantize` up to FP8 rounding."""
  split = _split(q.astype(jnp.float32), _blocks(recipe, q.shape))
  return _merge(split * _per_block(scale.astype(jnp.float32), recipe, q.shape), q.shape).astype(dtype)
