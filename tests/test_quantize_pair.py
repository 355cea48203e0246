"""jgmm.quantize_pair: an operand and its transpose quantised in one pass (triton_kernels/quantize.py).

Portable backend: equal to jgmm.quantize of x and of x swapped. The kernel, against a numpy oracle of its math
(scale = amax / FMAX, q = x * (1 / scale), float32, IEEE): on the CPU under Triton's interpreter with float32
outputs standing in for FP8 (the interpreter's FP8 casts are not trusted), bit for bit; on the GPU in FP8 (the
oracle rounded by ml_dtypes), bit for bit, and within one FP8 step of the portable backend (which divides).
Cross-lowering: the default on CUDA is the kernel.
"""
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized
from triton.runtime import interpreter

import jgmm
from jgmm import backend_triton, backend_xla, ffi, fp8, quantize
from jgmm.ffi import _compile
from jgmm.triton_kernels import quantize as quantize_kernels

try:
  shard_map = jax.shard_map
except AttributeError:  # jax without the top-level alias.
  from jax.experimental.shard_map import shard_map

ON_GPU = any(d.platform == "gpu" for d in jax.devices())
CASES = (dict(shape=(300, 260), recipe="1x128"), dict(shape=(130, 7), recipe="1x128"),
         dict(shape=(3, 130, 257), recipe="128x128"), dict(shape=(128, 256), recipe="128x128"))


def kernel_oracle(x, recipe, fmax):
  """quantize_pair_kernel's (q, scale, qt, scale_t) in numpy float32, q and qt not yet rounded to FP8."""
  x = np.asarray(x, np.float32)
  x3 = x.reshape((-1, *x.shape[-2:]))
  g, r, c = x3.shape
  rb, cb = -(-r // 128), -(-c // 128)
  blocks = np.pad(x3, ((0, 0), (0, rb * 128 - r), (0, cb * 128 - c))).reshape(g, rb, 128, cb, 128)
  as_scale = lambda amax: np.where(amax == 0, np.float32(1), amax / np.float32(fmax)).astype(np.float32)
  per_element = lambda s: np.broadcast_to(s, blocks.shape).reshape(g, rb * 128, cb * 128)[:, :r, :c]
  if recipe == "1x128":
    scale = as_scale(np.abs(blocks).max(axis=4, keepdims=True))  # Per row per 128 columns.
    scale_t = as_scale(np.abs(blocks).max(axis=2, keepdims=True))  # Per column per 128 rows.
    out_scale = scale[..., 0].reshape(g, rb * 128, cb)[:, :r]
    out_scale_t = scale_t[:, :, 0].transpose(0, 2, 3, 1).reshape(g, cb * 128, rb)[:, :c]
  else:
    scale = scale_t = as_scale(np.abs(blocks).max(axis=(2, 4), keepdims=True))
    out_scale = scale[:, :, 0, :, 0]
    out_scale_t = out_scale.transpose(0, 2, 1)
  quantized = lambda s: np.clip(x3 * (np.float32(1) / per_element(s)), -fmax, fmax)
  reshape = lambda a, shape: a.reshape(shape) if x.ndim == 3 else a[0]
  return (reshape(quantized(scale), x.shape), reshape(out_scale, out_scale.shape),
          reshape(quantized(scale_t).transpose(0, 2, 1), (*x.shape[:-2], c, r)),
          reshape(out_scale_t, out_scale_t.shape))


# fp8_gmm's backward's grouped quantisation: sizes of the groups (then the rows after them) and M.
# The interpreter's cases: CASES cut to one whole and one partial block along each edge (it takes about a second
# per 128 x 128 program: CI's time).
INTERPRETED = (dict(shape=(200, 140), recipe="1x128"), CASES[1], dict(shape=(2, 130, 140), recipe="128x128"), CASES[3])
GROUPED = (dict(sizes=(0, 1, 127, 128, 129, 300), m=1000), dict(sizes=(600, 600), m=1000), dict(sizes=(0, 0), m=130),
           dict(sizes=(256,), m=256))


def blocks_of(sizes, m):
  """quantize_pair_grouped's blocks (3, cdiv(m, 128) + len(sizes)) int32 of runs of rows (the groups clipped to m,
  then the rows after them) each padded to a multiple of 128 rows: each block's first row, its run's end and its
  run (len(sizes) for the rows after the groups and for blocks of no row)."""
  bounds = np.concatenate([[0], np.minimum(np.cumsum(sizes), m), [m]])
  first, end, run = [], [], []
  for r, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
    first += list(range(start, stop, 128))
    end += [stop] * len(range(start, stop, 128))
    run += [r] * len(range(start, stop, 128))
  pad = -(-m // 128) + len(sizes) - len(first)
  return jnp.asarray([first + [0] * pad, end + [0] * pad, run + [len(sizes)] * pad], jnp.int32)


def grouped_oracle(x, blocks, fmax):
  """quantize_pair_grouped_kernel's (q, scale, qt, scale_t) in numpy float32, q and qt not yet rounded to FP8: each
  block's rows copied to its 128 rows of a zero matrix, whose transpose is quantised 1x128."""
  x = np.asarray(x, np.float32)
  return (*kernel_oracle(x, "1x128", fmax)[:2], *kernel_oracle(regrouped_of(x, blocks), "1x128", fmax)[2:])


def regrouped_of(x, blocks):
  """x's rows in the blocks' 128-row slots of a zero matrix (128 PB, C), float32."""
  x = np.asarray(x, np.float32)
  first, end = np.asarray(blocks)[:2]
  regrouped = np.zeros((128 * len(first), x.shape[1]), np.float32)
  for b, (start, stop) in enumerate(zip(first, end)):
    rows = x[start:min(stop, start + 128)]
    regrouped[128 * b:128 * b + len(rows)] = rows
  return regrouped


def per_group_oracle(x, blocks, num_groups, fmax, scale_t=None):
  """quantize_pair_grouped's (q, scale, qt, scale_t) with num_groups, in numpy float32, q and qt not yet rounded:
  qt's scale per group (blocks' third row) and column, amax / fmax over the group's rows (1 where 0), scale_t (C,
  G) (or the given scale_t for qt, e.g. a kernel's: XLA's division may differ from numpy's by an ulp); q = x * (1 /
  scale) as the kernels compute it."""
  regrouped = regrouped_of(x, blocks)
  group = np.asarray(blocks)[2]
  amax = np.zeros((num_groups + 1, regrouped.shape[1]), np.float32)
  for b, g in enumerate(group):  # np.maximum: NaN propagates.
    amax[g] = np.maximum(amax[g], np.abs(regrouped[128 * b:128 * b + 128]).max(axis=0))
  scales = np.where(amax == 0, np.float32(1), amax / np.float32(fmax)).astype(np.float32)
  if scale_t is not None:
    scales[:num_groups] = np.asarray(scale_t).T
  per_row = np.repeat(scales[group], 128, axis=0)
  qt = np.clip(regrouped * (np.float32(1) / per_row), -fmax, fmax).T
  return (*kernel_oracle(np.asarray(x, np.float32), "1x128", fmax)[:2], qt, scales[:num_groups].T)


def plain_grouped_kernel(x, blocks, out_dtype):
  """quantize_pair_grouped_kernel's (q, scale, qt, scale_t) of x (R, C), q and qt in out_dtype (float32 under the
  interpreter, whose FP8 casts are not trusted)."""
  return jax.jit(lambda x, blocks: backend_triton.quantize_pair_grouped_plain(x, blocks, out_dtype, 448.0))(x, blocks)


class QuantizePairTestBase(seeded.SeededTestCase):

  def operand(self, shape, dtype=jnp.bfloat16, nonfinite=False):
    """Rows of different magnitudes, the first five all zero (scale 1); with nonfinite, a NaN in the last row's
    first column and an inf in the last column of the middle row (their blocks: NaN scales and values, an inf
    scale with zeros and a NaN)."""
    x = self.rng.standard_normal(shape) * np.exp(self.rng.uniform(-3, 3, shape[:-1] + (1,)))
    x[..., :5, :] = 0.0
    if nonfinite:
      x[..., -1, 0] = np.nan
      x[..., shape[-2] // 2, -1] = np.inf
    return jnp.asarray(x, dtype)


class PortableTest(QuantizePairTestBase):

  @parameterized.product(CASES, dtype=(jnp.float8_e4m3fn, jnp.float8_e4m3fnuz))
  def test_matches_quantize(self, shape, recipe, dtype):
    x = self.operand(shape)
    q, scale, qt, scale_t = jgmm.quantize_pair(x, recipe, dtype, backend="xla")
    want_q, want_scale = quantize.quantize(x, recipe, dtype)
    want_qt, want_scale_t = quantize.quantize(jnp.swapaxes(x, -1, -2), recipe, dtype)
    for got, want in ((q, want_q), (scale, want_scale), (qt, want_qt), (scale_t, want_scale_t)):
      self.assertEqual((got.shape, got.dtype), (want.shape, want.dtype))
      np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))

  def test_transforms(self):
    """vmap over a batch, shard_map over row blocks of 128 (each shard's quantisation is the global one's rows and
    columns), and jit on inputs sharded over a jax.make_mesh mesh: the portable backend's, bit for bit (on a GPU
    the default is the kernel, one FP8 step from it: GpuTest)."""
    P = jax.sharding.PartitionSpec
    want = lambda x: backend_xla.quantize_pair(x, recipe="1x128", dtype=jnp.float8_e4m3fn)
    portable = lambda x: jgmm.quantize_pair(x, "1x128", backend="xla")
    assert_equal = lambda got, expected: [np.testing.assert_array_equal(np.asarray(a, np.float32),
                                                                        np.asarray(b, np.float32))
                                          for a, b in zip(got, expected, strict=True)]
    batch = self.operand((3, 130, 70))
    assert_equal(jax.jit(jax.vmap(portable))(batch), [jnp.stack(parts) for parts in zip(*map(want, batch))])
    if jax.device_count() < 8:
      self.skipTest(f"the sharded half needs 8 devices, found {jax.device_count()}: run under pytest on the CPU "
                    "(tests/conftest.py sets XLA_FLAGS)")
    x = self.operand((8 * 128, 200))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("e",))
    sharded = shard_map(portable, mesh=mesh, in_specs=P("e"), out_specs=(P("e"), P("e"), P(None, "e"), P(None, "e")))
    assert_equal(jax.jit(sharded)(x), want(x))
    x_sharded = jax.device_put(x, jax.sharding.NamedSharding(jax.make_mesh((8,), ("e",)), P("e")))
    assert_equal(jax.jit(portable)(x_sharded), want(x))

  @parameterized.parameters(*GROUPED)
  def test_grouped(self, sizes, m):
    """fp8_gmm's backward's quantize_pair_grouped: q and scale are quantize's; the transpose holds each run of rows
    from a multiple of 128 on (zeros between and after), each block of one run only, quantised 1x128."""
    x = self.operand((m, 200))
    blocks = blocks_of(sizes, m)
    got = fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, backend="xla")
    want = grouped_oracle(x, blocks, 448.0)
    for k, (a, b, what) in enumerate(zip(got, want, ("q", "scale", "qt", "scale_t"))):
      b = np.asarray(np.asarray(b).astype(jnp.float8_e4m3fn), np.float32) if k % 2 == 0 else b
      self.assertEqual(a.shape, b.shape, what)
      # The portable backend divides by the scale, the oracle multiplies by its reciprocal: one FP8 step apart
      # where they differ at all; XLA's division, a float32 ulp.
      np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=2**-3 if k % 2 == 0 else 2**-22,
                                 atol=2**-9 if k % 2 == 0 else 0, err_msg=f"{what}, seed {self.seed}")
    q, scale = quantize.quantize(x, "1x128")
    np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(q, np.float32))
    np.testing.assert_array_equal(got[1], scale)

  @parameterized.parameters(dict(sizes=(0, 1, 127, 128, 129, 300), m=3072), dict(sizes=(600, 600), m=1000),
                            dict(sizes=(0, 0, 0), m=1536), dict(sizes=(2**30, 7, -5), m=1536),
                            dict(sizes=(0, 1, 127, 128, 129, 300), m=3071))
  def test_padded_groups(self, sizes, m):
    """fp8_gmm pads its groups where that adds at most M / 4 rows (M >= 512 G): the blocks of each group's rows (the
    rows after them too) and the padded sizes; huge or negative sizes are clipped as gmm clips them."""
    padding = fp8._padded_groups(jnp.asarray(sizes, jnp.int32), m)
    if m < 512 * len(sizes):
      self.assertIsNone(padding)
      return
    clipped = np.diff(np.concatenate([[0], np.minimum(np.cumsum(np.maximum(sizes, 0)), m)]))
    np.testing.assert_array_equal(padding[0], blocks_of(clipped, m))
    np.testing.assert_array_equal(padding[1], -(-clipped // 128) * 128)

  @parameterized.named_parameters(
      ("recipe", dict(recipe="128x1"), ValueError, r"recipe must be '1x128' or '128x128', got '128x1'"),
      ("rank_1x128", dict(x=jnp.zeros((2, 3, 4))), ValueError, r"x must be \(R, C\) for recipe '1x128', got shape"),
      ("rank_128x128", dict(x=jnp.zeros((5,)), recipe="128x128"), ValueError,
       r"x must be \(R, C\) or \(G, R, C\) for recipe '128x128', got shape \(5,\)"),
      ("x_dtype", dict(x=jnp.zeros((4, 4), jnp.int32)), TypeError,
       r"x must be bfloat16, float16 or float32, got int32"),
      ("dtype", dict(dtype=jnp.bfloat16), TypeError, r"dtype must be float8_e4m3fn or float8_e4m3fnuz, got bfloat16"),
      ("backend", dict(backend="cuda"), ValueError, r"backend must be None, 'triton' or 'xla', got 'cuda'"))
  def test_bad_input(self, changes, error, message):
    args = dict(x=jnp.zeros((4, 4), jnp.bfloat16), recipe="1x128", dtype=jnp.float8_e4m3fn, backend=None) | changes
    with self.assertRaisesRegex(error, message):
      jgmm.quantize_pair(args["x"], args["recipe"], args["dtype"], backend=args["backend"])


  @parameterized.parameters(*GROUPED)
  def test_grouped_per_group(self, sizes, m):
    """fp8_gmm's wgrad_scale="group": qt scaled per group and column (scale_t (C, G)), q and scale unchanged."""
    x = self.operand((m, 200))
    blocks = blocks_of(sizes, m)
    got = fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, num_groups=len(sizes), backend="xla")
    want = per_group_oracle(x, blocks, len(sizes), 448.0)
    for k, (a, b, what) in enumerate(zip(got, want, ("q", "scale", "qt", "scale_t"))):
      b = np.asarray(np.asarray(b).astype(jnp.float8_e4m3fn), np.float32) if k % 2 == 0 else b
      self.assertEqual(a.shape, b.shape, what)
      # As test_grouped: the portable backend divides, the oracle multiplies by the reciprocal.
      np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=2**-3 if k % 2 == 0 else 2**-22,
                                 atol=2**-9 if k % 2 == 0 else 0, err_msg=f"{what}, seed {self.seed}")


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedTest(QuantizePairTestBase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    os.environ.pop("JGMM_TARGET", None)

  @parameterized.parameters(*INTERPRETED, dict(INTERPRETED[0], nonfinite=True), dict(INTERPRETED[2], nonfinite=True))
  def test_kernel(self, shape, recipe, nonfinite=False):
    """Every element and scale of both layouts, partial blocks at both edges, all-zero rows; NaN and inf in one case
    per recipe."""
    self.check_kernel(shape, recipe, nonfinite)

  def test_nan_max_elementwise(self):
    """test_kernel's NaN and inf case on a small x with the interpreter applying the kernel's combine function
    _nan_max pair by pair (tests/conftest.py hands its reductions to numpy's max elsewhere)."""
    ops = interpreter.ReduceOps
    with mock.patch.object(ops, "apply_impl", getattr(ops.apply_impl, "elementwise", ops.apply_impl)), \
        mock.patch.object(ops, "generic_reduce", autospec=True, side_effect=ops.generic_reduce) as pairwise:
      self.check_kernel((130, 7), "1x128", nonfinite=True)
    self.assertEqual(pairwise.call_count, 4)  # Each of the two programs' rows and columns.

  def check_kernel(self, shape, recipe, nonfinite):
    x = self.operand(shape, nonfinite=nonfinite)
    g, r, c = (1, *shape) if len(shape) == 2 else shape
    rb, cb = -(-r // 128), -(-c // 128)
    rowwise = recipe == "1x128"
    out_shape = [jax.ShapeDtypeStruct(shape, jnp.float32),
                 jax.ShapeDtypeStruct((r, cb) if rowwise else (*shape[:-2], rb, cb), jnp.float32),
                 jax.ShapeDtypeStruct((*shape[:-2], c, r), jnp.float32),
                 jax.ShapeDtypeStruct((c, rb) if rowwise else (*shape[:-2], cb, rb), jnp.float32)]
    got = jax.jit(lambda x: ffi.triton_call(
        x, kernel=quantize_kernels.quantize_pair_kernel, out_shape=out_shape, grid=(rb, cb, g),
        num_warps=quantize_kernels.NUM_WARPS, R=r, C=c, FMAX=448.0, ROWWISE=rowwise))(x)
    for a, b, what in zip(got, kernel_oracle(x, recipe, 448.0), ("q", "scale", "qt", "scale_t")):
      np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}, seed {self.seed}")


  @parameterized.parameters(dict(GROUPED[0], c=100), dict(GROUPED[1], c=100), dict(GROUPED[2], c=130),
                            dict(GROUPED[3], c=130), dict(GROUPED[2], c=130, nonfinite=True))
  def test_grouped_kernel(self, sizes, m, c, nonfinite=False):
    """quantize_pair_grouped_kernel: every element and scale of both layouts against the oracle, bit for bit, c
    columns (a partial block, after a whole one at 130); NaN and inf in one case."""
    x = self.operand((m, c), nonfinite=nonfinite)
    blocks = blocks_of(sizes, m)
    got = plain_grouped_kernel(x, blocks, jnp.float32)
    for a, b, what in zip(got, grouped_oracle(x, blocks, 448.0), ("q", "scale", "qt", "scale_t")):
      np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}, seed {self.seed}")


  @parameterized.parameters(dict(sizes=(0, 1, 127, 129), m=300, c=100), dict(GROUPED[2], c=100),
                            dict(GROUPED[3], c=130, nonfinite=True))
  def test_grouped_kernel_per_group(self, sizes, m, c, nonfinite=False):
    """block_column_amax_kernel and quantize_pair_grouped_kernel reading the group scales: every element and scale
    against the oracle, bit for bit, one column block or two (a partial one); a NaN makes its group's column scale
    and qt column NaN, an inf its scale inf (then zeros and a NaN), other groups unchanged."""
    x = self.operand((m, c), nonfinite=nonfinite)
    blocks = blocks_of(sizes, m)
    got = jax.jit(lambda x, b: backend_triton.quantize_pair_grouped_plain(x, b, jnp.float32, 448.0, len(sizes)))(
        x, blocks)
    want = per_group_oracle(x, blocks, len(sizes), 448.0)
    np.testing.assert_allclose(np.asarray(got[3]), want[3], rtol=2**-22, err_msg=f"seed {self.seed}")  # XLA's /
    given = per_group_oracle(x, blocks, len(sizes), 448.0, got[3])
    for a, b, what in zip(got[:2], given, ("q", "scale")):
      np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}, seed {self.seed}")
    # qt's columns of the groups, bit for bit given the kernel's scales; those of the rows after the groups (whose
    # scales the kernel does not return) within XLA's division's ulp.
    in_groups = np.repeat(np.asarray(blocks)[2] < len(sizes), 128)
    np.testing.assert_array_equal(np.asarray(got[2])[:, in_groups], given[2][:, in_groups], f"seed {self.seed}")
    np.testing.assert_allclose(np.asarray(got[2]), given[2], rtol=2**-21, err_msg=f"seed {self.seed}")

  def test_grouped_kernel_blocks_outside_x(self):
    """Blocks reaching before row 0 or past R read and write only x's rows (zeros for the rest), as the portable
    backend does."""
    x = self.operand((200, 130))
    blocks = jnp.asarray([[-50, 100, 250], [60, 400, 251]], jnp.int32)
    got = plain_grouped_kernel(x, blocks, jnp.float32)
    regrouped = np.zeros((384, 130), np.float32)
    regrouped[50:110] = np.asarray(x[:60], np.float32)  # block 0: rows -50..77 of which 0..59
    regrouped[128:228] = np.asarray(x[100:200], np.float32)  # block 1: rows 100..199
    for a, b, what in zip(got[2:], kernel_oracle(regrouped, "1x128", 448.0)[2:], ("qt", "scale_t")):
      np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{what}, seed {self.seed}")
    portable = fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, backend="xla")
    np.testing.assert_allclose(np.asarray(portable[3]), np.asarray(got[3]), rtol=2**-22)  # XLA's division: an ulp


class CrossLoweringTest(parameterized.TestCase):

  @parameterized.product(CASES, dtype=(jnp.bfloat16, jnp.float16, jnp.float32))
  def test_default_on_cuda(self, shape, recipe, dtype):
    """The lanes kernel on the 128-row grid (with 128x128 blocks its TILE_SCALES), except for float32 x with
    128x128 blocks (XLA's passes: triton_kernels/quantize.py says why)."""
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      text = jax.jit(lambda x: jgmm.quantize_pair(x, recipe)).trace(
          jax.ShapeDtypeStruct(shape, dtype)).lower(lowering_platforms=("cuda",)).as_text()
    kernel = recipe == "1x128" or dtype != jnp.float32
    self.assertEqual("triton_kernel_call" in text, kernel)
    self.assertEqual([(c.args[0].__name__, c.args[2].get("TILE_SCALES", False))
                      for c in compile_kernel.call_args_list],
                     [("quantize_pair_grouped_lanes_kernel", recipe == "128x128")] if kernel else [])


  @parameterized.parameters(jnp.bfloat16, jnp.float16, jnp.float32)
  def test_grouped_on_cuda(self, dtype):
    """The grouped quantisation on CUDA is the lanes kernel (the plain one runs under the interpreter and on ROCm),
    for each x dtype."""
    blocks = blocks_of((0, 1, 127, 128, 129, 300), 1000)
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      jax.jit(lambda x: fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, backend="triton")).trace(
          jax.ShapeDtypeStruct((1000, 260), dtype)).lower(lowering_platforms=("cuda",))
    self.assertEqual([c.args[0].__name__ for c in compile_kernel.call_args_list],
                     ["quantize_pair_grouped_lanes_kernel"])

  @parameterized.parameters((32768, 32, True), (4096, 32, False))
  def test_recipe_on_cuda(self, m, groups, grouped):
    """fp8_gmm's gradient quantises lhs and dout with each group padded to the 128-row grid (the lanes kernel's
    padded blocks) where that adds at most a quarter to M (M >= 512 rows a group), on M's grid (the lanes kernel's
    blocks of 128 rows) elsewhere; its weight gradient runs the warp-specialised FP8 tgmm either way."""
    s = jax.ShapeDtypeStruct
    grad = jax.grad(lambda x, w, sizes: jgmm.fp8_gmm(x, w, sizes).astype(jnp.float32).sum(), (0, 1))
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      jax.jit(grad).trace(s((m, 256), jnp.bfloat16), s((groups, 256, 384), jnp.bfloat16),
                          s((groups,), jnp.int32)).lower(lowering_platforms=("cuda",))
    kernels = [c.args[0].__name__ for c in compile_kernel.call_args_list]
    self.assertIn("tgmm_fp8_ws_kernel", kernels)
    self.assertNotIn("quantize_pair_kernel", kernels)
    # The grouped quantisation (PB past M's grid) or 1x128 on M's grid, both by the lanes kernel; the weights'
    # 128x128 by the lanes kernel too (TILE_SCALES: PB the weights' 2 row blocks).
    lanes = [(c.args[2]["PB"], c.args[2].get("TILE_SCALES", False)) for c in compile_kernel.call_args_list
             if c.args[0].__name__ == "quantize_pair_grouped_lanes_kernel"]
    self.assertEqual(sorted(tile for _, tile in lanes), [False, False, True])  # lhs, dout; the weights
    self.assertTrue(all((pb > -(-m // 128)) == grouped for pb, tile in lanes if not tile), lanes)


@absltest.skipIf(not ON_GPU, "needs a GPU")
class GpuTest(QuantizePairTestBase):

  @parameterized.parameters(*[  # Where the kernel runs (test_default_on_cuda).
      dict(case, dtype=dtype)
      for case in (*CASES, dict(shape=(4096, 7168), recipe="1x128"), dict(shape=(50, 200), recipe="1x128"),
                   dict(shape=(4, 2048, 896), recipe="128x128"))
      for dtype in (jnp.bfloat16, jnp.float16, jnp.float32) if case["recipe"] == "1x128" or dtype != jnp.float32])
  def test_kernel(self, shape, recipe, dtype):
    x = self.operand(shape, dtype)
    got = jax.jit(lambda x: jgmm.quantize_pair(x, recipe, backend="triton"))(x)
    self.assert_kernel_outputs(got, kernel_oracle(x, recipe, 448.0),
                               backend_xla.quantize_pair(x, recipe=recipe, dtype=jnp.float8_e4m3fn))

  @parameterized.parameters(*GROUPED, dict(sizes=(1000, 0, 3000, 5, 123), m=8192))
  def test_grouped_kernel(self, sizes, m):
    x = self.operand((m, 7168 if m == 8192 else 260))
    blocks = blocks_of(sizes, m)
    got = jax.jit(lambda x, b: fp8._quantize_pair_grouped_p(x, b, dtype=jnp.float8_e4m3fn, backend="triton"))(
        x, blocks)
    self.assert_kernel_outputs(got, grouped_oracle(x, blocks, 448.0),
                               fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, backend="xla"))

  @parameterized.parameters(*GROUPED, dict(sizes=(1000, 0, 3000, 5, 123), m=8192),
                            dict(GROUPED[0], nonfinite=True))
  def test_grouped_kernel_per_group(self, sizes, m, nonfinite=False):
    """Scales per group and column (block_column_amax_kernel, then the lanes kernel reading them): the scales the
    oracle's within an ulp (XLA's division; a NaN's group column NaN, an inf's inf); given them, q, scale and qt's
    columns of the groups the oracle's bit for bit; q and qt within one FP8 step of the portable backend."""
    x = self.operand((m, 7168 if m == 8192 else 260), nonfinite=nonfinite)
    blocks = blocks_of(sizes, m)
    quantized = lambda backend: jax.jit(lambda x, b: fp8._quantize_pair_grouped_p(
        x, b, dtype=jnp.float8_e4m3fn, num_groups=len(sizes), backend=backend))(x, blocks)
    got = [np.asarray(a, np.float32) for a in quantized("triton")]
    np.testing.assert_allclose(got[3], per_group_oracle(x, blocks, len(sizes), 448.0)[3], rtol=2**-22,
                               err_msg=f"seed {self.seed}")
    want = per_group_oracle(x, blocks, len(sizes), 448.0, got[3])
    rounded = lambda a: np.asarray(np.asarray(a).astype(jnp.float8_e4m3fn), np.float32)
    in_groups = np.repeat(np.asarray(blocks)[2] < len(sizes), 128)
    np.testing.assert_array_equal(got[0], rounded(want[0]), f"q, seed {self.seed}")
    np.testing.assert_array_equal(got[1], want[1], f"scale, seed {self.seed}")
    np.testing.assert_array_equal(got[2][:, in_groups], rounded(want[2])[:, in_groups], f"qt, seed {self.seed}")
    for a, near, what in zip(got[::2], quantized("xla")[::2], ("q", "qt")):
      near = np.asarray(near, np.float32)
      np.testing.assert_allclose(a, near, rtol=2**-3, atol=2**-9, err_msg=f"{what}, seed {self.seed}")
      self.assertLess(np.mean(a != near), 0.01, f"{what}: too many differ from the portable backend")

  @parameterized.product(dtype=(jnp.bfloat16, jnp.float16, jnp.float32), c=(7, 257, 4096),
                         outside=(False, True))
  def test_lanes_kernel(self, dtype, c, outside):
    """CUDA's grouped kernel (the lanes kernel, backend_triton's default there) against the plain one (checked
    against the oracle by InterpretedTest and test_grouped_kernel) bit for bit: each x dtype, column counts on and
    off a thread's 8-column block, blocks of groups or blocks reaching before row 0 and past R, NaN and inf; q and
    scale on the rows the blocks hold (the others are not written)."""
    x = self.operand((1000, c), dtype, nonfinite=True)
    blocks = (jnp.asarray([[-50, 100, 250, 990], [60, 400, 251, 5000]], jnp.int32) if outside
              else blocks_of((0, 1, 127, 128, 129, 300), 1000))
    plain = plain_grouped_kernel(x, blocks, jnp.float8_e4m3fn)
    lanes = jax.jit(lambda x, b: fp8._quantize_pair_grouped_p(x, b, dtype=jnp.float8_e4m3fn, backend="triton"))(
        x, blocks)
    first, end = np.asarray(blocks)[:2]
    held = np.zeros(1000, bool)
    for start, stop in zip(first, end):
      held[max(start, 0):max(min(stop, start + 128, 1000), 0)] = True
    for k, (a, b, what) in enumerate(zip(lanes, plain, ("q", "scale", "qt", "scale_t"))):
      a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
      a, b = (a[held], b[held]) if k < 2 else (a, b)
      np.testing.assert_array_equal(a, b, err_msg=f"{what}, seed {self.seed}")

  @parameterized.parameters(dict(recipe="1x128"), dict(recipe="128x128"), dict(recipe="grouped"))
  def test_nonfinite(self, recipe):
    """NaN and inf as the oracle (and jgmm.quantize) give them: a block holding NaN all NaN, one holding inf an inf
    scale, zeros, and NaN at the inf; each kernel's against the oracle bit for bit, NaN where the portable's is."""
    x = self.operand((1000, 260), nonfinite=True)
    if recipe == "grouped":
      blocks = blocks_of((0, 1, 127, 128, 129, 300), 1000)
      run = lambda backend: fp8._quantize_pair_grouped_p(x, blocks, dtype=jnp.float8_e4m3fn, backend=backend)
      oracle = grouped_oracle(x, blocks, 448.0)
    else:
      run = lambda backend: jgmm.quantize_pair(x, recipe, backend=backend)
      oracle = kernel_oracle(x, recipe, 448.0)
    got, portable = jax.jit(lambda: run("triton"))(), run("xla")
    for k, (a, want, near, what) in enumerate(zip(got, oracle, portable, ("q", "scale", "qt", "scale_t"))):
      a = np.asarray(a, np.float32)
      want = np.asarray(np.asarray(want).astype(jnp.float8_e4m3fn), np.float32) if k % 2 == 0 else want
      self.assertTrue(np.isnan(a).any(), what)  # The test's NaN reached this output.
      np.testing.assert_array_equal(a, want, err_msg=f"{what} against the oracle, seed {self.seed}")
      np.testing.assert_array_equal(np.isnan(a), np.isnan(np.asarray(near, np.float32)), err_msg=what)

  def assert_kernel_outputs(self, got, oracle, portable):
    """A kernel's (q, scale, qt, scale_t): the oracle's bit for bit (its FP8 values rounded by ml_dtypes), and the
    portable backend's within one FP8 step or a float32 ulp."""
    for k, (a, want, near, what) in enumerate(zip(got, oracle, portable, ("q", "scale", "qt", "scale_t"))):
      self.assertEqual((a.shape, a.dtype), (near.shape, near.dtype), what)
      a = np.asarray(a, np.float32)
      want = np.asarray(np.asarray(want).astype(jnp.float8_e4m3fn), np.float32) if k % 2 == 0 else want
      np.testing.assert_array_equal(a, want, err_msg=f"{what} against the oracle, seed {self.seed}")
      # The portable backend: scales within a float32 ulp (XLA's division on the GPU), FP8 values within one step
      # (3 mantissa bits) where they differ at all.
      near = np.asarray(near, np.float32)
      np.testing.assert_allclose(a, near, rtol=2**-3 if k % 2 == 0 else 2**-22, atol=2**-9 if k % 2 == 0 else 0,
                                 err_msg=f"{what} against the portable backend, seed {self.seed}")
      if k % 2 == 0:
        self.assertLess(np.mean(a != near), 0.01, f"{what}: too many differ from the portable backend")

  def test_vmap(self):
    """The kernel under vmap: each element of the batch quantised as the kernel quantises it alone, bit for bit."""
    batch = self.operand((3, 300, 260))
    kernel = lambda x: jgmm.quantize_pair(x, "1x128", backend="triton")
    want = [jnp.stack(parts) for parts in zip(*map(jax.jit(kernel), batch))]
    for got, expected in zip(jax.jit(jax.vmap(kernel))(batch), want, strict=True):
      np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


if __name__ == "__main__":
  absltest.main()
