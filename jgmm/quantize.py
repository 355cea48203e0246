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

FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e4m3fnuz))
FP8_MAX = {jnp.dtype(jnp.float8_e4m3fn): 448.0, jnp.dtype(jnp.float8_e4m3fnuz): 240.0}
BLOCK = 128
RECIPES = ("row", "1x128", "128x128", "128x1")


def _cdiv(a, b):
  return -(-a // b)


def _blocks(recipe, shape):
  """The block size along each axis of `shape` for `recipe` (whole rows for "row")."""
  if recipe not in RECIPES:
    raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
  ndim = 2 if recipe in ("128x128", "128x1") else 1
  if len(shape) < ndim:
    raise ValueError(f"recipe {recipe!r} needs at least {ndim} dimensions, got shape {tuple(shape)}")
  trailing = {"row": (max(shape[-1], 1),), "1x128": (BLOCK,), "128x128": (BLOCK, BLOCK), "128x1": (BLOCK, 1)}[recipe]
  return (1,) * (len(shape) - len(trailing)) + trailing


def scale_shape(recipe, shape):
  """The shape of the scales `quantize(x, recipe)` returns for x of `shape`."""
  blocks = _blocks(recipe, shape)
  out = tuple(_cdiv(d, b) for d, b in zip(shape, blocks))
  return out[:-1] if recipe == "row" else out


def broadcast_scale(scale, recipe, shape):
  """The scales of x (`shape`) broadcast to its elements: each scale repeated over its block."""
  blocks = _blocks(recipe, shape)
  if recipe == "row":
    scale = scale[..., None]
  for axis, b in enumerate(blocks):
    if b > 1 and scale.shape[axis] != 1:
      scale = jnp.repeat(scale, b, axis=axis, total_repeat_length=scale.shape[axis] * b)
  return scale[tuple(slice(0, d) for d in shape)]


def _block_amax(x, blocks):
  """amax of |x| per block: x zero-padded to whole blocks, each axis split into (blocks, block size)."""
  padded = jnp.pad(jnp.abs(x), [(0, _cdiv(d, b) * b - d) for d, b in zip(x.shape, blocks)])
  split = padded.reshape([n for d, b in zip(x.shape, blocks) for n in (_cdiv(d, b), b)])
  return jnp.max(split, axis=tuple(range(1, split.ndim, 2)))


def quantize(x, recipe, dtype=jnp.float8_e4m3fn):
  """(q, scale): q (x's shape, dtype) = x / scale rounded to FP8, scale float32 (`scale_shape(recipe, x.shape)`)."""
  dtype = jnp.dtype(dtype)
  if dtype not in FP8_MAX:
    raise TypeError(f"dtype must be float8_e4m3fn or float8_e4m3fnuz, got {dtype}")
  x = jnp.asarray(x).astype(jnp.float32)
  amax = _block_amax(x, _blocks(recipe, x.shape))
  scale = jnp.where(amax == 0, 1.0, amax / FP8_MAX[dtype])
  scale = scale.reshape(scale_shape(recipe, x.shape))
  fmax = FP8_MAX[dtype]
  q = jnp.clip(x / broadcast_scale(scale, recipe, x.shape), -fmax, fmax).astype(dtype)
  return q, scale


def dequantize(q, scale, recipe, dtype=jnp.float32):
  """q * scale (each scale over its block) in `dtype`: the inverse of `quantize` up to FP8 rounding."""
  return (q.astype(jnp.float32) * broadcast_scale(scale.astype(jnp.float32), recipe, q.shape)).astype(dtype)
