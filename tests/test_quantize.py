"""jgmm.quantize against a numpy loop over the blocks: scale shapes, amax / max, round trip, partial blocks."""
import itertools

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from jgmm import quantize

FMAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}
DTYPES = {"e4m3fn": jnp.float8_e4m3fn, "e4m3fnuz": jnp.float8_e4m3fnuz}
BLOCKS = {"row": None, "1x128": (128,), "128x128": (128, 128), "128x1": (128, 1)}


def numpy_quantize(x, recipe, fmax, np_dtype):
  """(q, scale) by an explicit loop over the blocks of the trailing axes, in float64."""
  x = np.asarray(x, np.float64)
  block = (x.shape[-1],) if recipe == "row" else BLOCKS[recipe]
  trailing = x.shape[-len(block):]
  counts = [-(-d // b) for d, b in zip(trailing, block)]
  scale = np.zeros(x.shape[:-len(block)] + tuple(counts))
  q = np.zeros_like(x)
  for lead in np.ndindex(*x.shape[:-len(block)]):
    for idx in itertools.product(*map(range, counts)):
      sl = lead + tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block))
      amax = np.abs(x[sl]).max()
      s = np.float32(amax / fmax) if amax > 0 else 1.0
      scale[lead + idx] = s
      q[sl] = np.clip(x[sl] / s, -fmax, fmax)
  scale = scale[..., 0] if recipe == "row" else scale
  return q.astype(np_dtype), scale


class QuantizeTest(parameterized.TestCase):

  @parameterized.product(
      (dict(recipe="row", shape=(5, 7)), dict(recipe="row", shape=(2, 3, 129)), dict(recipe="1x128", shape=(6, 1)),
       dict(recipe="1x128", shape=(3, 4, 300)), dict(recipe="128x128", shape=(2, 130, 257)),
       dict(recipe="128x128", shape=(7, 128)), dict(recipe="128x1", shape=(300, 5)),
       dict(recipe="128x1", shape=(1, 3))),
      fmt=("e4m3fn", "e4m3fnuz"),
  )
  def test_against_numpy(self, recipe, shape, fmt):
    rng = np.random.default_rng(0)
    # Rows of very different magnitudes, so a scale applied to the wrong block shows.
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-4, 4, shape[:-1] + (1,)))
    x = x.astype(np.float32)
    q, scale = quantize.quantize(jnp.asarray(x), recipe, DTYPES[fmt])
    want_q, want_scale = numpy_quantize(x, recipe, FMAX[fmt], np.dtype(DTYPES[fmt]))
    self.assertEqual(q.dtype, jnp.dtype(DTYPES[fmt]))
    self.assertEqual(scale.dtype, jnp.float32)
    self.assertEqual(scale.shape, quantize.scale_shape(recipe, shape))
    self.assertEqual(scale.shape, want_scale.shape)
    np.testing.assert_allclose(scale, want_scale, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(q, np.float32), want_q.astype(np.float32))
    # Every block's largest element maps to the format's max; the round trip is within FP8's rounding: half a
    # unit of its 3-bit mantissa, or of its smallest subnormal step (2^-9) times the scale.
    self.assertEqual(float(jnp.max(jnp.abs(q.astype(jnp.float32)))), FMAX[fmt])
    back = quantize.dequantize(q, scale, recipe)
    tol = np.abs(x) * 2.0**-4 + np.asarray(quantize.dequantize(jnp.ones_like(q), scale, recipe)) * 2.0**-9
    self.assertTrue(np.all(np.abs(np.asarray(back) - x) <= tol))

  def test_scale_shapes(self):
    self.assertEqual(quantize.scale_shape("row", (4096, 7168)), (4096,))
    self.assertEqual(quantize.scale_shape("row", (32, 4096, 7168)), (32, 4096))
    self.assertEqual(quantize.scale_shape("1x128", (8, 256, 129)), (8, 256, 2))
    self.assertEqual(quantize.scale_shape("128x128", (32, 4096, 7168)), (32, 32, 56))
    self.assertEqual(quantize.scale_shape("128x128", (3, 129, 1)), (3, 2, 1))
    self.assertEqual(quantize.scale_shape("128x1", (1000, 7)), (8, 7))

  def test_zero_and_nonfinite_blocks(self):
    x = np.zeros((2, 256), np.float32)
    x[1, 3] = np.inf
    x[1, 200] = np.nan
    q, scale = quantize.quantize(x, "1x128")
    np.testing.assert_array_equal(scale[0], [1.0, 1.0])  # All-zero blocks: scale 1, q 0.
    np.testing.assert_array_equal(np.asarray(q[0], np.float32), 0.0)
    self.assertEqual(scale[1, 0], np.inf)
    self.assertTrue(np.isnan(scale[1, 1]))

  def test_empty_rows(self):
    """K = 0: per-row scales of empty rows are 1 (one scale per row, as for any K), and dequantising gives (M, 0)."""
    for recipe, scale_shape in (("row", (3,)), ("1x128", (3, 0)), ("128x128", (1, 0))):
      q, scale = quantize.quantize(jnp.ones((3, 0)), recipe)
      self.assertEqual((q.shape, scale.shape), ((3, 0), scale_shape))
      np.testing.assert_array_equal(scale, 1.0)
      self.assertEqual(quantize.dequantize(q, scale, recipe).shape, (3, 0))
      self.assertEqual(quantize.scale_shape(recipe, (3, 0)), scale_shape)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "recipe must be one of"):
      quantize.quantize(jnp.ones((4, 4)), "2x2")
    with self.assertRaisesRegex(ValueError, "needs at least 2 dimensions"):
      quantize.quantize(jnp.ones((4,)), "128x128")
    with self.assertRaisesRegex(TypeError, "float8_e4m3fn or float8_e4m3fnuz"):
      quantize.quantize(jnp.ones((4, 4)), "row", jnp.bfloat16)


if __name__ == "__main__":
  absltest.main()
