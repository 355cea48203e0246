"""The FP8 Triton kernels (triton_kernels/gmm_fp8.py through backend_triton.*_fp8) against the float64 oracle.

CPU: Triton's interpreter with float32 operands holding FP8 values (its FP8 dots are not trusted); the kernels
do not depend on the element type, so this runs all their indexing and scaling. jgmm.ffi NaN-poisons every
output first, so an element the kernel forgets fails. Cross-lowering for sm_90 with real FP8 operands proves
they compile to Hopper's FP8 wgmma; for sm_89 (mma.sync) and AMD's gfx942 (float8_e4m3fnuz, MFMA), that they compile
to those GPUs' FP8 instructions (compiled only: no such GPU to run them). GPU (skipped without one): FP8 against the
dequantised oracle and DeepGEMM's criterion against the bf16 product, through the public API.
"""
import dataclasses
import os
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
import triton
from absl.testing import absltest, parameterized

import jgmm
from jgmm import backend_triton, fp8, oracle, quantize
from jgmm.config import Config
from jgmm.ffi import _compile, _jaxlib
from jgmm.triton_kernels import gmm_fp8, gmm_ws_cluster

ON_GPU = any(d.platform == "gpu" for d in jax.devices())
SMALL = Config(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2, tma=False)
WS = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, warp_specialized=True)
# Against the float64 dequantised oracle on a GPU: Hopper's FP8 wgmma accumulates ~14 bits within a 128-wide K step
# (promoted to float32 between steps): ~2.5e-4 relative error at K = 7168 (1.9e-3 without the promotion).
GPU_TOL = 1e-3
RECIPES = (("row", "row"), ("1x128", "128x128"), ("row", "128x128"), ("1x128", "row"))
CLUSTERS = ((128, 128, 2), (192, 128, 2))  # Tiles on clusters of 2 CTAs (block_m, block_n, cluster_size).


class Fp8KernelTestBase(seeded.SeededTestCase):

  def quantized(self, shape, recipe, dtype=jnp.float8_e4m3fn):
    """(q, scale) of random rows of different magnitudes; q in `dtype` (float32 stands in for FP8 under the
    interpreter: the same values)."""
    x = self.rng.standard_normal(shape) * np.exp(self.rng.uniform(-2, 2, shape[:-1] + (1,)))
    q, scale = quantize.quantize(jnp.asarray(x, jnp.float32), recipe)
    return q.astype(dtype), scale

  def assert_close(self, actual, expected, tol, what=""):
    actual = np.asarray(actual, np.float32)
    self.assertFalse(np.isnan(actual).any(), f"{what}: NaN (unwritten?), seed {self.seed}")
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, tol, f"{what}: relative error {err:.3g}, seed {self.seed}")


def run_gmm(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_rhs, out_dtype=jnp.float32, config=SMALL):
  fn = jax.jit(lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=transpose_rhs, out_dtype=out_dtype,
                                                 config=config))
  return fn(lhs, rhs, jnp.asarray(bounds, jnp.int32), lhs_scale, rhs_scale)


def run_masked(x, w, masked_m, x_scale, w_scale, *, out_dtype=jnp.float32, config=SMALL):
  fn = jax.jit(lambda *a: backend_triton.masked_gmm_fp8(*a, out_dtype=out_dtype, expected_m=None, config=config))
  return fn(x, w, jnp.asarray(masked_m, jnp.int32), x_scale, w_scale)


def run_tgmm(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_lhs, transpose_rhs=False, out_dtype=jnp.float32,
             config=SMALL, rhs_scale_per_group=False, transpose_out=False):
  fn = jax.jit(lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                                                  out_dtype=out_dtype, config=config,
                                                  rhs_scale_per_group=rhs_scale_per_group,
                                                  transpose_out=transpose_out))
  return fn(lhs, rhs, jnp.asarray(bounds, jnp.int32), lhs_scale, rhs_scale)


def groups_of(bounds):
  """group_sizes and group_offset that jgmm.oracle reads as the groups of `bounds` (a leading empty group)."""
  bounds = np.asarray(bounds)
  return np.concatenate([[bounds[0]], np.diff(bounds)]), 1


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedFp8Test(Fp8KernelTestBase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    os.environ.pop("JGMM_TARGET", None)

  @parameterized.parameters(
      (1, RECIPES[0], True, False), (7, RECIPES[1], False, False), (129, RECIPES[1], True, False),
      (129, RECIPES[2], False, False), (200, RECIPES[3], True, False), (160, RECIPES[1], True, True),
      (96, RECIPES[2], False, True))
  def test_gmm(self, k, recipes, transpose_rhs, tma):
    """tma: tensor-descriptor loads (K a multiple of 16 for TMA's 16-byte strides in FP8)."""
    m, n, groups = 45, 136, 3  # N over one 128-column scale block, tiles across group boundaries
    lhs, lhs_scale = self.quantized((m, k), recipes[0], jnp.float32)
    rhs_nk, rhs_scale = self.quantized((groups, n, k), recipes[1], jnp.float32)
    rhs = rhs_nk if transpose_rhs else jnp.swapaxes(rhs_nk, 1, 2)
    bounds = np.array([3, 20, 20, 40], np.int32)  # rows 0-2 and 40-44 in no group (zeros), an empty group
    out = run_gmm(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs,
                  config=dataclasses.replace(SMALL, tma=tma))
    sizes, offset = groups_of(bounds)
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs_nk, rhs_scale, "128x128"),
                      sizes,
                      transpose_rhs=True, group_offset=offset)
    self.assert_close(out, want, 1e-5)
    np.testing.assert_array_equal(out[:3], 0.0)
    np.testing.assert_array_equal(out[40:], 0.0)

  @parameterized.parameters((7, RECIPES[0], False), (129, RECIPES[1], False), (33, RECIPES[2], False),
                            (144, RECIPES[1], True), (32, RECIPES[0], True))
  def test_masked(self, k, recipes, tma):
    groups, max_m, n = 5, 37, 140
    x, x_scale = self.quantized((groups, max_m, k), recipes[0], jnp.float32)
    w, w_scale = self.quantized((groups, n, k), recipes[1], jnp.float32)
    masked_m = np.array([0, max_m, 1, 17, 33], np.int32)
    out = run_masked(x, w, masked_m, x_scale, w_scale, config=dataclasses.replace(SMALL, tma=tma))
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"), masked_m)
    self.assert_close(out, want, 1e-5)
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(out[2, 1:], 0.0)

  @parameterized.parameters(
      # Groups that start and end inside 32-row steps, an empty one, one inside a single step, rows in no group.
      (True, False, 40, 24, [10, 10, 150, 151, 290]),
      (False, True, 7, 33, [10, 10, 150, 151, 290]),
      (True, True, 1, 16, [10, 10, 150, 151, 290]),
      # Groups on step boundaries (no partial first or last step), one of exactly one step, the last to M.
      (False, False, 130, 20, [0, 64, 96, 96, 300]),
      (False, True, 40, 24, [32, 64, 70, 75, 288]))
  def test_tgmm(self, transpose_lhs, transpose_rhs, k, n, bounds):
    m = 300  # three 128-row scale blocks, spanning groups
    bounds = np.array(bounds, np.int32)
    lhs_mk, lhs_mk_scale = self.quantized((m, k), "128x1", jnp.float32)
    rhs_mn, rhs_mn_scale = self.quantized((m, n), "128x1", jnp.float32)
    lhs, lhs_scale = (lhs_mk, lhs_mk_scale) if transpose_lhs else (lhs_mk.T, lhs_mk_scale.T)
    rhs, rhs_scale = (rhs_mn.T, rhs_mn_scale.T) if transpose_rhs else (rhs_mn, rhs_mn_scale)
    out = run_tgmm(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs)
    sizes, offset = groups_of(bounds)
    want, _ = oracle.tgmm(oracle.dequantize(lhs_mk, lhs_mk_scale, "128x1"),
                          oracle.dequantize(rhs_mn, rhs_mn_scale, "128x1"), sizes, transpose_lhs=True,
                          group_offset=offset, num_actual_groups=4)
    self.assert_close(out, want, 1e-5)
    for g in np.flatnonzero(np.diff(bounds) == 0):
      np.testing.assert_array_equal(out[g], 0.0)

  @parameterized.parameters((False, 40, 24, False), (True, 7, 33, False), (True, 130, 16, False), (True, 40, 33, True),
                            (False, 130, 16, True))
  def test_tgmm_rhs_scale_per_group(self, transpose_rhs, k, n, transpose_out):
    """rhs scaled per group and column (RHS_GROUPS): each step's product times its row scales alone, the tile times
    its group's column scales once; empty groups (NaN scales) stay exact zeros. transpose_out: the tiles stored
    transposed (TRANSPOSE_OUT), out (G, N, K)."""
    m, bounds = 300, np.array([10, 10, 150, 151, 290], np.int32)
    lhs_mk, lhs_mk_scale = self.quantized((m, k), "128x1", jnp.float32)
    rhs_mn = np.asarray(self.quantized((m, n), "128x1", jnp.float32)[0])
    group_scale = np.asarray(self.rng.uniform(0.5, 2.0, (4, n)), np.float32)
    group_scale[0] = np.nan  # The empty group's.
    rhs, rhs_scale = (rhs_mn.T, group_scale.T) if transpose_rhs else (rhs_mn, group_scale)
    out = run_tgmm(lhs_mk.T, jnp.asarray(rhs), bounds, lhs_mk_scale.T, jnp.asarray(rhs_scale), transpose_lhs=False,
                   transpose_rhs=transpose_rhs, rhs_scale_per_group=True, transpose_out=transpose_out)
    out = np.swapaxes(out, 1, 2) if transpose_out else out
    group_of_row = np.clip(np.searchsorted(bounds, np.arange(m), side="right") - 1, 0, 3)
    sizes, offset = groups_of(bounds)
    want, _ = oracle.tgmm(oracle.dequantize(lhs_mk, lhs_mk_scale, "128x1"),
                          rhs_mn.astype(np.float64) * np.nan_to_num(group_scale)[group_of_row], sizes,
                          transpose_lhs=True, group_offset=offset, num_actual_groups=4)
    self.assert_close(out[1:], want[1:], 1e-5)
    np.testing.assert_array_equal(out[0], 0.0)

  @parameterized.parameters((RECIPES[0],), (RECIPES[1],))
  def test_nan_scales_stay_in_their_rows(self, recipes):
    """NaN scales of valid rows give NaN rows; those of rows past masked_m (or of rows outside every group) never
    reach the output, which is exact zeros there."""
    groups, max_m, n, k = 2, 20, 24, 130
    x, x_scale = self.quantized((groups, max_m, k), recipes[0], jnp.float32)
    w, w_scale = self.quantized((groups, n, k), recipes[1], jnp.float32)
    x_scale = x_scale.at[0, 3].set(jnp.nan).at[1, 12:].set(jnp.nan)
    out = np.asarray(run_masked(x, w, np.array([20, 12], np.int32), x_scale, w_scale))
    self.assertTrue(np.isnan(out[0, 3]).all())
    np.testing.assert_array_equal(out[1, 12:], 0.0)
    self.assertFalse(np.isnan(np.delete(out[0], 3, axis=0)).any())
    lhs, lhs_scale = x.reshape(-1, k), x_scale.reshape(-1, *x_scale.shape[2:])
    out = np.asarray(run_gmm(lhs, w, np.array([0, 20, 32], np.int32), lhs_scale, w_scale, transpose_rhs=True))
    self.assertTrue(np.isnan(out[3]).all())
    np.testing.assert_array_equal(out[32:], 0.0)  # Rows 32-39 (NaN scales) are in no group.
    self.assertFalse(np.isnan(np.delete(out, 3, axis=0)).any())

  def test_public_api_on_the_interpreter(self):
    """jgmm.masked_gmm(backend="triton") with FP8 operands reaches the kernel (float32 dots there: the check
    is only that the call is wired, so a loose tolerance)."""
    groups, max_m, n, k = 2, 16, 32, 64
    x, x_scale = self.quantized((groups, max_m, k), "1x128")
    w, w_scale = self.quantized((groups, n, k), "128x128")
    masked_m = np.array([5, 16], np.int32)
    with mock.patch.dict(os.environ, {"JGMM_CONFIG": '{"block_m": 16, "block_n": 16, "block_k": 64}'}):
      out = jgmm.masked_gmm(x, w, jnp.asarray(masked_m), x_scale=x_scale, w_scale=w_scale,
                            preferred_element_type=jnp.float32, backend="triton")
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"), masked_m)
    self.assert_close(out, want, 1e-2)


# GPUs without Hopper's wgmma, lowered for on the CPU (none to run on): (JAX platform, FP8 format, the asm to read,
# the FP8 matrix instruction in it). Ada (sm_89): mma.sync on e4m3; AMD CDNA3 (gfx942): float8_e4m3fnuz through MFMA.
OTHER_TARGETS = {
    "cuda:89": ("cuda", jnp.float8_e4m3fn, "ptx", r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3"),
    "rocm:gfx942": ("rocm", jnp.float8_e4m3fnuz, "amdgcn", r"v_mfma_f32_\w+_fp8_fp8"),
}


@absltest.skipIf(ON_GPU, "lowers for a GPU the machine does not have")
@absltest.skipIf(not hasattr(gmm_fp8.gmm_fp8_kernel, "cache_key"),
                 "TRITON_INTERPRET=1 was set when the kernels were imported: they cannot be compiled")
class Fp8OtherTargetsTest(parameterized.TestCase):
  """The FP8 ops and fp8_gmm's training step lowered for GPUs without Hopper's wgmma: each through Triton kernels
  that multiply FP8 by FP8 (no dequantised product), in the platform's FP8 format."""

  def kernels(self, target, fn, *args):
    """The asm of every kernel fn lowers to for target."""
    platform, _, asm, _ = OTHER_TARGETS[target]
    if platform == "rocm" and "amd" not in triton.backends.backends:
      self.skipTest("this Triton build has no HIP backend")
    _compile._cache.clear()
    try:
      with mock.patch.dict(os.environ, {"JGMM_TARGET": target}):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    except _compile.KernelCompileError as e:
      if "libtriton_amd_codegen" not in str(e):
        raise
      self.skipTest(f"this Triton's HIP backend lacks its code generator library: {str(e)[-160:]}")
    self.assertIn("triton_kernel_call", text)
    return [c.asm[asm] for c in _compile._cache.values()]

  @parameterized.parameters(*OTHER_TARGETS)
  def test_ops(self, target):
    """gmm (block and row-channel recipes), masked_gmm and tgmm (lhs (K, M), rhs (N, M)): one FP8 kernel each."""
    s, f32, i32, f8 = jax.ShapeDtypeStruct, jnp.float32, jnp.int32, OTHER_TARGETS[target][1]
    m, k, n, g = 1024, 512, 256, 4
    ops = [
        (lambda *a: jgmm.gmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True),
         (s((m, k), f8), s((g, n, k), f8), s((g,), i32), s((m, k // 128), f32), s((g, n // 128, k // 128), f32))),
        (lambda *a: jgmm.gmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True),
         (s((m, k), f8), s((g, n, k), f8), s((g,), i32), s((m,), f32), s((g, n), f32))),
        (lambda *a: jgmm.masked_gmm(*a[:3], x_scale=a[3], w_scale=a[4]),
         (s((g, 256, k), f8), s((g, n, k), f8), s((g,), i32), s((g, 256, k // 128), f32),
          s((g, n // 128, k // 128), f32))),
        (lambda *a: jgmm.tgmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True),
         (s((k, m), f8), s((n, m), f8), s((g,), i32), s((k, m // 128), f32), s((n, m // 128), f32))),
    ]
    for fn, args in ops:
      (kernel,) = self.kernels(target, fn, *args)
      self.assertRegex(kernel, OTHER_TARGETS[target][3])

  @parameterized.parameters(*OTHER_TARGETS)
  def test_fp8_gmm_training_step(self, target):
    """fp8_gmm's gradients: the forward, d lhs and d rhs products in FP8, beside the quantisation kernels."""
    s, fp8_dtype = jax.ShapeDtypeStruct, OTHER_TARGETS[target][1]
    m, k, n, g = 2048, 256, 384, 4
    loss = lambda x, w, gs: jgmm.fp8_gmm(x, w, gs, fp8_dtype=fp8_dtype).astype(jnp.float32).sum()
    kernels = self.kernels(target, jax.value_and_grad(loss, argnums=(0, 1)), s((m, k), jnp.bfloat16),
                           s((g, k, n), jnp.bfloat16), s((g,), jnp.int32))
    self.assertEqual(sum(bool(re.search(OTHER_TARGETS[target][3], a)) for a in kernels), 3)


class TileScalesTest(parameterized.TestCase):
  """backend_triton._tile_scales: gmm_fp8_ws_kernel's lhs block scales, tile-major (its TMA copies start at
  16-byte aligned addresses whatever row a tile starts at), for tiles of 128 and 192 rows (the width a power of 2:
  128, 256), and gmm_fp8_ws_cluster_kernel's of 256 and 384 rows (256, 512)."""

  def check(self, lhs_scale, first_rows, block_m):
    width = {128: 128, 192: 256, 256: 256, 384: 512}[block_m]
    tiles = np.asarray(backend_triton._tile_scales(jnp.asarray(lhs_scale), first_rows, width))
    m, kb = lhs_scale.shape
    self.assertEqual(tiles.shape, (first_rows.shape[0] * kb, width))
    for r, first in enumerate(np.asarray(first_rows)):
      rows = first + np.arange(width)
      want = lhs_scale[np.minimum(rows, m - 1)].T  # Rows past M: row M - 1's (never stored).
      np.testing.assert_array_equal(tiles[r * kb:(r + 1) * kb], want)

  @parameterized.parameters(128, 192, 256, 384)
  def test_contiguous(self, block_m):
    """Groups starting at rows no multiple of 4, an empty group, rows after the last group."""
    m, kb = 1000, 3
    bounds = jnp.asarray([0, 5, 5, 262, 990], jnp.int32)
    row_tiles = -(-m // block_m) + bounds.shape[0]
    schedule = backend_triton._row_tiles(bounds, m, row_tiles, block_m)
    self.check(np.random.default_rng(0).random((m, kb), np.float32) + 0.5,
               schedule[1 + row_tiles:1 + row_tiles + int(schedule[0])], block_m)

  @parameterized.parameters(128, 192, 256, 384)
  def test_masked(self, block_m):
    """max_m = 37 (every group but the first starts at a row no multiple of 4), and 300 (tiles past max_m): one
    tile per block_m of each group's rows, in gmm_ws.tile_of's masked order."""
    for groups, max_m, kb in ((5, 37, 2), (3, 300, 2)):
      first_rows = backend_triton._masked_first_rows(groups, max_m, block_m)
      m_tiles = -(-max_m // block_m)
      np.testing.assert_array_equal(first_rows, [g * max_m + i * block_m for g in range(groups)
                                                 for i in range(m_tiles)])
      self.check(np.random.default_rng(1).random((groups * max_m, kb), np.float32) + 0.5, first_rows, block_m)

  def test_row_scales(self):
    """Row scales (M,) leave the kernel's lhs scale descriptor unread: a (1, W) placeholder."""
    tiles = backend_triton._tile_scales(jnp.ones((300,), jnp.float32), None, 256)
    self.assertEqual(tiles.shape, (1, 256))


@absltest.skipIf(ON_GPU, "lowers for a GPU the machine does not have")
@absltest.skipIf(not hasattr(gmm_fp8.gmm_fp8_kernel, "cache_key"),
                 "TRITON_INTERPRET=1 was set when the kernels were imported: they cannot be compiled")
class Fp8CrossLoweringTest(parameterized.TestCase):

  def ptx(self, fn, *args, tma=False):
    """The PTX of every kernel fn compiles for sm_90; with tma (and a jaxlib that builds host TMA descriptors) each
    takes its two operands through tensor descriptors."""
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    self.assertIn("triton_kernel_call", text)
    signatures = [dict(c.args[1]) for c in compile_kernel.call_args_list]
    self.assertNotEmpty(signatures)
    descriptors = 2 if tma and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")) else 0
    for signature in signatures:
      self.assertEqual(sum(str(t).startswith("tensordesc<fp8e4nv") for t in signature.values()), descriptors)
    return [c.asm["ptx"] for key, c in _compile._cache.items() if dict(key[1]) in signatures]

  def assert_fp8_wgmma(self, ptxs):
    for ptx in ptxs:
      self.assertIn(".target sm_90a", ptx)
      self.assertRegex(ptx, r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3")

  @parameterized.product(transpose_rhs=(True, False), recipes=(RECIPES[0], RECIPES[1]), tma=(False, True))
  def test_gmm(self, transpose_rhs, recipes, tma):
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    m, k, n, g = 8192, 7168, 4096, 8
    rhs_scale = s((g, n) if recipes[1] == "row" else (g, 32, 56), jnp.float32)
    config = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, tma=tma)
    fn = lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=transpose_rhs, out_dtype=jnp.bfloat16, config=config)
    self.assert_fp8_wgmma(self.ptx(
        fn, s((m, k), f8), s((g, n, k) if transpose_rhs else (g, k, n), f8), s((g + 1,), jnp.int32),
        s((m,) if recipes[0] == "row" else (m, 56), jnp.float32), rhs_scale, tma=tma))

  @parameterized.parameters((16, None), (256, None), (256, Config(block_m=128, block_n=128, block_k=128, tma=True)))
  def test_masked(self, expected_m, config):
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, max_m, k, n = 4, 1024, 7168, 4096
    fn = lambda *a: backend_triton.masked_gmm_fp8(*a, out_dtype=jnp.bfloat16, expected_m=expected_m, config=config)
    self.assert_fp8_wgmma(self.ptx(fn, s((g, max_m, k), f8), s((g, n, k), f8), s((g,), jnp.int32),
                                   s((g, max_m, 56), jnp.float32), s((g, 32, 56), jnp.float32),
                                   tma=True))  # A config's TMA loads, or the default there: WS.

  @parameterized.product(block_m=(128, 192), masked=(True, False))
  def test_clusters(self, block_m, masked):
    """cluster_size 2 with the block recipe: under a Triton with Gluon's clusters (>= 3.7) gmm_fp8_ws_cluster_kernel
    (2 CTAs a cluster, the rhs tile and its block scales by multicast TMA loads, the lhs box twice the CTA's rows),
    under an older one gmm_fp8_ws_kernel with the same tiles."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, rows, k, n = 4, 1000, 7168, 4096
    config = dataclasses.replace(WS, block_m=block_m, cluster_size=2)
    scales = (s((g, rows, 56) if masked else (rows, 56), jnp.float32), s((g, 32, 56), jnp.float32))
    if masked:
      fn = lambda x, w, mm, xs, ws: backend_triton.masked_gmm_fp8(x, w, mm, xs, ws, out_dtype=jnp.bfloat16,
                                                                  expected_m=None, config=config)
      args = (s((g, rows, k), f8), s((g, n, k), f8), s((g,), jnp.int32), *scales)
    else:
      fn = lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=True, out_dtype=jnp.bfloat16, config=config)
      args = (s((rows, k), f8), s((g, n, k), f8), s((g + 1,), jnp.int32), *scales)
    _compile._cache.clear()
    (ptx,) = self.ptx(fn, *args, tma=True)
    self.assert_fp8_wgmma([ptx])
    if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
      return  # The plain kernel: no warp-specialised one without host descriptors.
    (compiled,) = _compile._cache.values()
    ctas = 2 if gmm_ws_cluster.supported() else 1
    self.assertEqual(compiled.num_ctas, ctas)
    self.assertEqual(".reqnctapercluster 2" in ptx, ctas == 2)
    self.assertEqual(len(re.findall(r"cp\.async\.bulk\.tensor\S*multicast::cluster", ptx)), 2 if ctas == 2 else 0)
    self.assertLessEqual(compiled.shared_mem_bytes, 227 * 1024)

  @parameterized.product(recipes=(RECIPES[1], RECIPES[2]), masked=(True, False), k=(7168, 200),
                         config=(WS, dataclasses.replace(WS, block_n=256, num_stages=3),
                                 dataclasses.replace(WS, block_m=192), None))
  def test_warp_specialized(self, recipes, masked, k, config):
    """WS (128 x 128, 128 x 256 or 192 x 128 tiles), and the default config (heuristic) of these shapes:
    gmm_fp8_ws_kernel where the rows of lhs and rhs are 16-byte multiples for TMA (K % 16 == 0); the plain kernel
    with the same config elsewhere, which has no 192-row tiles: a ValueError naming the config."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, rows, n, kb = 4, 1000, 4096, -(-k // 128)
    lhs_scale = (rows,) if recipes[0] == "row" else (rows, kb)
    rhs = (s((g, n, k), f8), s((g, n) if recipes[1] == "row" else (g, 32, kb), jnp.float32))
    if config is not None and config.block_m == 192 and k % 16:
      with self.assertRaisesRegex(ValueError, r"config.block_m = 192 runs on Hopper's warp-specialised FP8 kernel"):
        self.ptx(lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=True, out_dtype=jnp.bfloat16, config=config),
                 s((rows, k), f8), rhs[0], s((g + 1,), jnp.int32), s(lhs_scale, jnp.float32), rhs[1])
      return
    with mock.patch.object(backend_triton, "_gmm_fp8_ws", wraps=backend_triton._gmm_fp8_ws) as ws_call:
      if masked:
        fn = lambda *a: backend_triton.masked_gmm_fp8(*a, out_dtype=jnp.bfloat16, expected_m=None, config=config)
        ptxs = self.ptx(fn, s((g, rows, k), f8), rhs[0], s((g,), jnp.int32), s((g, *lhs_scale), jnp.float32),
                        rhs[1], tma=k % 16 == 0)
      else:
        fn = lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=True, out_dtype=jnp.bfloat16, config=config)
        ptxs = self.ptx(fn, s((rows, k), f8), rhs[0], s((g + 1,), jnp.int32), s(lhs_scale, jnp.float32), rhs[1],
                        tma=k % 16 == 0)
    self.assert_fp8_wgmma(ptxs)
    self.assertEqual(ws_call.called, k % 16 == 0 and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")))

  @parameterized.product(masked=(True, False), k=(7168, 200))
  def test_heuristic_192_rows(self, masked, k):
    """The heuristic's 192-row tiles (1000 rows per group) on the warp-specialised kernel where it takes the call
    (K % 16 == 0); the plain kernel with 128-row tiles, no error, where it does not."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, rows, n, kb = 2, 1000, 4096, -(-k // 128)
    args = (s((g, n, k), f8), s((g,) if masked else (g + 1,), jnp.int32),
            s((g, rows, kb) if masked else (g * rows, kb), jnp.float32), s((g, 32, kb), jnp.float32))
    lhs = s((g, rows, k) if masked else (g * rows, k), f8)
    if masked:
      fn = lambda x, w, mm, xs, ws: backend_triton.masked_gmm_fp8(x, w, mm, xs, ws, out_dtype=jnp.bfloat16,
                                                                  expected_m=rows, config=None)
    else:
      fn = lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=True, out_dtype=jnp.bfloat16, config=None)
    with mock.patch.object(backend_triton, "_gmm_fp8_ws", wraps=backend_triton._gmm_fp8_ws) as ws_call, \
        mock.patch.object(backend_triton.ffi, "triton_call", wraps=backend_triton.ffi.triton_call) as call:
      self.assert_fp8_wgmma(self.ptx(fn, lhs, *args, tma=k % 16 == 0))
    ws = k % 16 == 0 and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda"))
    self.assertEqual(ws_call.called, ws)
    if ws:
      self.assertEqual(ws_call.call_args.args[7].block_m, 192)
      self.assertEqual(call.call_args.kwargs["HALVES"], 3)
    else:
      self.assertEqual(call.call_args.kwargs["BLOCK_M"], 128)

  @parameterized.product(transpose_lhs=(True, False), transpose_rhs=(True, False), m=(8192, 8200),
                         warp_specialized=(True, False))
  def test_tgmm(self, transpose_lhs, transpose_rhs, m, warp_specialized):
    """FP8 wgmma in every layout. In the M-contiguous one (lhs (K, M), rhs (N, M)): the warp-specialised kernel
    (TMA copies) where its rows of M bytes are 16-byte multiples; in the plain kernel the operands come through
    asynchronous copies there, the software pipeline's (other layouts are transposed through registers)."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    k, n, g, mb = 2048, 4096, 8, -(-m // 128)
    config = dataclasses.replace(WS, num_stages=3, warp_specialized=warp_specialized)
    fn = lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs,
                                            out_dtype=jnp.bfloat16, config=config)
    m_contiguous = transpose_rhs and not transpose_lhs
    ws = m_contiguous and warp_specialized and m % 16 == 0 and _jaxlib.supports_tma_descriptors(
        _jaxlib.plugin("cuda"))
    _compile._cache.clear()  # The kernels of other layouts have the same signature: keep only this one's.
    with mock.patch.object(backend_triton, "_tgmm_fp8_ws", wraps=backend_triton._tgmm_fp8_ws) as ws_call:
      (ptx,) = self.ptx(fn, s((m, k) if transpose_lhs else (k, m), f8), s((n, m) if transpose_rhs else (m, n), f8),
                        s((g + 1,), jnp.int32), s((mb, k) if transpose_lhs else (k, mb), jnp.float32),
                        s((n, mb) if transpose_rhs else (mb, n), jnp.float32), tma=ws)
    self.assert_fp8_wgmma([ptx])
    self.assertEqual(ws_call.called, ws)
    if ws:  # TMA loads (Triton 3.6 writes shared::cluster, later ones shared::cta).
      self.assertRegex(ptx, r"cp\.async\.bulk\.tensor\.2d\.shared::(cluster|cta)\.global")
    elif m_contiguous and m % 16 == 0:  # Rows of M bytes not 16-byte aligned: no 16-byte copies.
      self.assertIn("cp.async.cg.shared.global", ptx)

  @parameterized.product(masked=(False, True), n=(104, 128))
  def test_wide_row_scales_without_a_right_half(self, masked, n):
    """gmm_fp8_ws_kernel with row and channel scales on 256-wide tiles where N <= 128 (no tile has a right half):
    Triton finds the right half's epilogue dead, and its channel-scale load there crashed its lowering."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, rows, k = 4, 1000, 256
    config = dataclasses.replace(WS, block_n=256, num_stages=3)
    rhs = (s((g, n, k), f8), s((g, n), jnp.float32))
    with mock.patch.object(backend_triton, "_gmm_fp8_ws", wraps=backend_triton._gmm_fp8_ws) as ws_call:
      if masked:
        fn = lambda *a: backend_triton.masked_gmm_fp8(*a, out_dtype=jnp.bfloat16, expected_m=None, config=config)
        ptxs = self.ptx(fn, s((g, rows, k), f8), rhs[0], s((g,), jnp.int32), s((g, rows), jnp.float32), rhs[1],
                        tma=True)
      else:
        fn = lambda *a: backend_triton.gmm_fp8(*a, transpose_rhs=True, out_dtype=jnp.bfloat16, config=config)
        ptxs = self.ptx(fn, s((rows, k), f8), rhs[0], s((g + 1,), jnp.int32), s((rows,), jnp.float32), rhs[1],
                        tma=True)
    self.assert_fp8_wgmma(ptxs)
    self.assertTrue(ws_call.called)

  @parameterized.parameters((64, 104, 256, False), (64, 104, 256, True), (1000, 520, 128, True),
                            (1000, 520, 256, True))
  def test_tgmm_rhs_scale_per_group_one_tile(self, k, n, block_n, transpose_out):
    """The warp-specialised FP8 tgmm with RHS_GROUPS where K = 64 leaves consumer 1 no rows and N = 104 leaves a
    256-wide tile no right half: Triton finds those branches dead, and a scale load in them crashed its lowering
    (session 32, first seen on the GPU); and with its tiles stored transposed (TRANSPOSE_OUT), at those shapes and
    at partial tiles of both widths."""
    s, f8 = jax.ShapeDtypeStruct, jnp.float8_e4m3fn
    g, m = 12, 3008
    config = dataclasses.replace(WS, block_n=block_n, num_stages=3)
    fn = lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=False, transpose_rhs=True, out_dtype=jnp.float32,
                                            config=config, rhs_scale_per_group=True, transpose_out=transpose_out)
    _compile._cache.clear()
    with mock.patch.object(backend_triton, "_tgmm_fp8_ws", wraps=backend_triton._tgmm_fp8_ws) as ws_call:
      ptxs = self.ptx(fn, s((k, m), f8), s((n, m), f8), s((g + 1,), jnp.int32), s((k, -(-m // 128)), jnp.float32),
                      s((n, g), jnp.float32), tma=True)
    self.assert_fp8_wgmma(ptxs)
    self.assertTrue(ws_call.called)

  @parameterized.parameters(
      *[dict(transpose_rhs=t, wgrad_scale="128x1", k=2048, n=1024) for t in (False, True)],
      *[dict(transpose_rhs=t, wgrad_scale="group", k=k, n=n) for t in (False, True) for k, n in ((2048, 1024),
                                                                                                (1024, 2048))])
  def test_recipe_wgrad_scale(self, transpose_rhs, wgrad_scale, k, n):
    """fp8_gmm's training step for sm_90: with wgrad_scale="group" the narrower of the weight gradient's operands
    (dout where N < K, lhs where K < N) takes block_column_amax_kernel's pass and the lanes kernel reading its
    scales, and the FP8 tgmm is the warp-specialised kernel with RHS_GROUPS, storing its tiles transposed where
    that operand is not the one of the weights' layout (dout for (G, K, N)); with "128x1" neither."""
    s = jax.ShapeDtypeStruct
    g, m = 8, 8192
    fn = lambda x, w, gs, d: jax.vjp(lambda x, w: jgmm.fp8_gmm(x, w, gs, transpose_rhs=transpose_rhs,
                                                               wgrad_scale=wgrad_scale), x, w)[1](d)
    _compile._cache.clear()
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      jax.jit(fn).trace(s((m, k), jnp.bfloat16), s((g, n, k) if transpose_rhs else (g, k, n), jnp.bfloat16),
                        s((g,), jnp.int32), s((m, n), jnp.bfloat16)).lower(lowering_platforms=("cuda",))
    calls = [(c.args[0].__name__, dict(c.args[2])) for c in compile_kernel.call_args_list]
    names = [name for name, _ in calls]
    group = wgrad_scale == "group"
    self.assertEqual(names.count("block_column_amax_kernel"), int(group))
    lanes = [flags for name, flags in calls if name == "quantize_pair_grouped_lanes_kernel"]
    # The weights' 128x128 (TILE_SCALES), and lhs's and dout's, of which one reads the group scales.
    self.assertEqual(sorted(flags.get("TILE_SCALES", False) for flags in lanes), [False, False, True])
    self.assertEqual(sorted(flags.get("GIVEN_SCALE_T", False) for flags in lanes if not flags.get("TILE_SCALES")),
                     [False, group])
    (tgmm_flags,) = [flags for name, flags in calls if name == "tgmm_fp8_ws_kernel"]
    self.assertEqual(tgmm_flags.get("RHS_GROUPS", False), group)
    self.assertEqual(tgmm_flags.get("TRANSPOSE_OUT", False), group and (k < n) != transpose_rhs)
    for compiled in _compile._cache.values():
      self.assertIn(".target sm_90a", compiled.asm["ptx"])

  def test_rocm_format_on_cuda_says_what_to_do(self):
    """float8_e4m3fnuz (ROCm's) on CUDA: a TypeError naming the format and the fix, not a Triton compile error,
    from each public FP8 op; e4m3fn is accepted (test_gmm)."""
    s, fnuz, f32 = jax.ShapeDtypeStruct, jnp.float8_e4m3fnuz, jnp.float32
    m, k, n, g = 64, 256, 128, 2
    calls = {
        "gmm": (lambda *a: jgmm.gmm(a[0], a[1], a[2], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True),
                (s((m, k), fnuz), s((g, n, k), fnuz), s((g,), jnp.int32), s((m,), f32), s((g, n), f32))),
        "masked_gmm": (lambda *a: jgmm.masked_gmm(a[0], a[1], a[2], x_scale=a[3], w_scale=a[4]),
                       (s((g, m, k), fnuz), s((g, n, k), fnuz), s((g,), jnp.int32), s((g, m), f32), s((g, n), f32))),
        "grouped_matmul": (lambda *a: jgmm.grouped_matmul([a[0]], [a[1]], lhs_scales=[a[2]], rhs_scales=[a[3]],
                                                          transpose_rhs=True),
                           (s((m, k), fnuz), s((n, k), fnuz), s((m,), f32), s((n,), f32))),
    }
    for name, (fn, args) in calls.items():
      with self.subTest(name), mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
          self.assertRaisesRegex(TypeError, r"float8_e4m3fnuz .*ROCm.* no Triton kernel on CUDA \(sm90\).*"
                                 r"float8_e4m3fn.*backend='xla'"):
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


# ---------------------------------------------------------------------------------------------------------------
# GPU


@absltest.skipIf(not ON_GPU, "needs a GPU")
class GpuFp8Test(Fp8KernelTestBase):

  def fp8(self, x, recipe):
    return quantize.quantize(x, recipe)

  @parameterized.product(
      (dict(m=1000, k=7168, n=1024), dict(m=777, k=129, n=264), dict(m=300, k=7, n=33), dict(m=513, k=1, n=200)),
      recipes=RECIPES, transpose_rhs=(True, False))
  def test_gmm(self, m, k, n, recipes, transpose_rhs):
    groups = 6
    lhs, lhs_scale = self.quantized((m, k), recipes[0])
    rhs_nk, rhs_scale = self.quantized((groups, n, k), recipes[1])
    rhs = rhs_nk if transpose_rhs else jnp.swapaxes(rhs_nk, 1, 2)
    sizes = self.rng.multinomial(m - 10, np.full(groups, 1 / groups)).astype(np.int32)
    sizes[2] = 0
    out = jgmm.gmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                   transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32)
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs_nk, rhs_scale, "128x128"),
                      sizes,
                      transpose_rhs=True)
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(np.asarray(out)[m - 10:], 0.0)

  @parameterized.product(expected_m=(1, 64, 256), recipes=RECIPES[:2])
  def test_masked(self, expected_m, recipes):
    groups, max_m, n, k = 6, 300, 1000, 2880
    x, x_scale = self.quantized((groups, max_m, k), recipes[0])
    w, w_scale = self.quantized((groups, n, k), recipes[1])
    masked_m = np.array([0, max_m, 1, 63, 64, 200], np.int32)
    out = jgmm.masked_gmm(x, w, jnp.asarray(masked_m), x_scale=x_scale, w_scale=w_scale, expected_m=expected_m,
                          preferred_element_type=jnp.float32)
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"), masked_m)
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(np.asarray(out)[0], 0.0)

  @parameterized.product(transpose_lhs=(True, False), transpose_rhs=(True, False), m=(3000, 3008))
  def test_tgmm(self, transpose_lhs, transpose_rhs, m):
    k, n = 1000, 520
    lhs_mk, lhs_scale = self.quantized((m, k), "128x1")
    rhs_mn, rhs_scale = self.quantized((m, n), "128x1")
    lhs, lhs_scale_arg = (lhs_mk, lhs_scale) if transpose_lhs else (lhs_mk.T, lhs_scale.T)
    rhs, rhs_scale_arg = (rhs_mn.T, rhs_scale.T) if transpose_rhs else (rhs_mn, rhs_scale)
    sizes = np.array([0, 1000, 7, 1800, m - 2900], np.int32)  # 5 groups
    out = jgmm.tgmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale_arg, rhs_scale=rhs_scale_arg,
                    transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32)
    want, _ = oracle.tgmm(oracle.dequantize(lhs_mk, lhs_scale, "128x1"), oracle.dequantize(rhs_mn, rhs_scale, "128x1"),
                          sizes, transpose_lhs=True)
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(np.asarray(out)[0], 0.0)

  @parameterized.product(transpose_rhs=(True, False), recipes=RECIPES[:2], block_m=(64, 128))
  def test_tma(self, transpose_rhs, recipes, block_m):
    """Tensor-descriptor loads: tiles past a group's rows, N past the last column block, K past the last block."""
    m, k, n, groups = 1000, 2064, 1040, 5
    config = Config(block_m=block_m, block_n=128, block_k=128, num_warps=8 if block_m == 128 else 4, num_stages=4,
                    tma=True)
    lhs, lhs_scale = self.quantized((m, k), recipes[0])
    rhs_nk, rhs_scale = self.quantized((groups, n, k), recipes[1])
    rhs = rhs_nk if transpose_rhs else jnp.swapaxes(rhs_nk, 1, 2)
    sizes = np.array([300, 0, 177, 400, 100], np.int32)
    out = jgmm.gmm(lhs, rhs, jnp.asarray(sizes), lhs_scale=lhs_scale, rhs_scale=rhs_scale,
                   transpose_rhs=transpose_rhs, preferred_element_type=jnp.float32, config=config)
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs_nk, rhs_scale, "128x128"),
                      sizes,
                      transpose_rhs=True)
    self.assert_close(out, want, GPU_TOL, "gmm")
    x, x_scale = self.quantized((groups, 200, k), recipes[0])
    masked_m = np.array([0, 200, 1, 129, 64], np.int32)
    out = jgmm.masked_gmm(x, rhs_nk, jnp.asarray(masked_m), x_scale=x_scale, w_scale=rhs_scale,
                          preferred_element_type=jnp.float32, config=config)
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(rhs_nk, rhs_scale, "128x128"),
                             masked_m)
    self.assert_close(out, want, GPU_TOL, "masked")

  def poisoned(self, fn, *args):
    """fn(*args) (one output) after freeing a NaN array of the output's shape and dtype: the allocator hands that
    memory to the output, so an element the kernel leaves unwritten stays NaN."""
    out = jax.eval_shape(fn, *args)
    jnp.full(out.shape, jnp.nan, out.dtype).block_until_ready().delete()
    return fn(*args)

  @parameterized.product(k=(1, 7, 129, 144, 2064, 7168), recipes=RECIPES,
                         tile=((128, 128), (128, 256), (192, 128), *CLUSTERS))
  def test_warp_specialized_masked(self, k, recipes, tile):
    """gmm_fp8_ws_kernel (where K % 16 == 0; the plain kernel with the same config else, a ValueError for 192-row
    tiles), or gmm_fp8_ws_cluster_kernel (CLUSTERS: 256- and 384-row cluster tiles, the block recipe, Triton >= 3.7):
    masked_m of 0, max_m, random and out of range (clipped by jgmm.masked_gmm), rows past masked_m holding NaN data
    and scales, row tiles past max_m and column tiles past N, the last K block partial (K blocks not a multiple of
    4: the cluster kernel's padded rhs scales); masked_m 230 and 17 leave a 192-row tile at most 64 rows (one
    consumer's: 230 after a full tile, 17 in the first), zeros stored past them."""
    groups, max_m, n = 8, 300, 1000
    x, x_scale = self.quantized((groups, max_m, k), recipes[0])
    w, w_scale = self.quantized((groups, n, k), recipes[1])
    masked_m = np.array([0, max_m, self.rng.integers(1, max_m), 129, -5, max_m + 50, 230, 17], np.int32)
    valid = np.clip(masked_m, 0, max_m)
    want = oracle.masked_gmm(oracle.dequantize(x, x_scale, "1x128"), oracle.dequantize(w, w_scale, "128x128"), valid)
    past = jnp.asarray(np.arange(max_m)[None, :] >= valid[:, None])
    x_nan = jnp.where(past[..., None], jnp.nan, x.astype(jnp.float32)).astype(x.dtype)
    x_scale_nan = jnp.where(past.reshape(past.shape + (1,) * (x_scale.ndim - 2)), jnp.nan, x_scale)
    # float32 out: 192-row tiles fit the shared memory with three stages (a fourth would need 268 KB).
    config = dataclasses.replace(WS, block_m=tile[0], block_n=tile[1], num_stages=3 if tile[:2] != (128, 128) else 4,
                                 cluster_size=tile[2] if len(tile) > 2 else 1)
    fn = jax.jit(lambda *a: jgmm.masked_gmm(*a[:3], x_scale=a[3], w_scale=a[4], preferred_element_type=jnp.float32,
                                            config=config))
    if tile[0] == 192 and k % 16:
      with self.assertRaisesRegex(ValueError, r"config.block_m = 192 runs on Hopper's warp-specialised FP8 kernel"):
        fn(x_nan, w, jnp.asarray(masked_m), x_scale_nan, w_scale)
      return
    with mock.patch.object(backend_triton, "_gmm_fp8_ws", wraps=backend_triton._gmm_fp8_ws) as ws_call, \
        mock.patch.object(backend_triton, "_gmm_fp8_ws_cluster", wraps=backend_triton._gmm_fp8_ws_cluster) as cluster:
      out = np.asarray(self.poisoned(fn, x_nan, w, jnp.asarray(masked_m), x_scale_nan, w_scale))
    self.assertEqual(ws_call.called, k % 16 == 0)
    self.assertEqual(cluster.called, ws_call.called and tile in CLUSTERS and recipes == RECIPES[1]
                     and gmm_ws_cluster.supported())
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(out[np.asarray(past)], 0.0)

  @parameterized.product(k=(7, 144, 7168), recipes=RECIPES, n=(1000, 1104, 104), block_m=(128, 192, 256, 384))
  def test_warp_specialized_gmm(self, k, recipes, n, block_m):
    """gmm_fp8_ws_kernel on contiguous groups (K-major rhs), 128 x 128, 128 x 256 and 192 x 128 tiles, or
    gmm_fp8_ws_cluster_kernel's cluster tiles of 256 or 384 rows x 128 (block_m 256 and 384: CLUSTERS; the block
    recipe, Triton >= 3.7): an empty group, groups ending inside tiles (a 192-row tile with at most 64 rows among
    them), rows after the last group (zeros); N = 1104
    leaves a 256-wide tile with no right half, N = 104 every one (its right half's epilogue is then left out). K = 7
    runs the plain kernel (a ValueError for 192-row tiles)."""
    m, groups = 1000, 6
    config = {192: dataclasses.replace(WS, block_m=192, num_stages=3),  # float32 out
              256: dataclasses.replace(WS, cluster_size=2),
              384: dataclasses.replace(WS, block_m=192, num_stages=3, cluster_size=2)}.get(block_m, WS)
    config = dataclasses.replace(WS, block_n=256, num_stages=3) if n in (104, 1104) and block_m == 128 else config
    lhs, lhs_scale = self.quantized((m, k), recipes[0])
    rhs, rhs_scale = self.quantized((groups, n, k), recipes[1])
    # Groups of 250 and 30 rows end in a 192-row tile with at most 64 rows (one consumer's).
    sizes = np.concatenate([[250, 30], self.rng.multinomial(m - 290, np.full(groups - 2, 1 / (groups - 2)))])
    sizes = sizes.astype(np.int32)
    sizes[2] = 0
    fn = jax.jit(lambda *a: jgmm.gmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True,
                                     preferred_element_type=jnp.float32, config=config))
    if config.block_m == 192 and k % 16:
      with self.assertRaisesRegex(ValueError, r"config.block_m = 192 runs on Hopper's warp-specialised FP8 kernel"):
        fn(lhs, rhs, jnp.asarray(sizes), lhs_scale, rhs_scale)
      return
    with mock.patch.object(backend_triton, "_gmm_fp8_ws", wraps=backend_triton._gmm_fp8_ws) as ws_call, \
        mock.patch.object(backend_triton, "_gmm_fp8_ws_cluster", wraps=backend_triton._gmm_fp8_ws_cluster) as cluster:
      out = np.asarray(self.poisoned(fn, lhs, rhs, jnp.asarray(sizes), lhs_scale, rhs_scale))
    self.assertEqual(ws_call.called, k % 16 == 0)
    self.assertEqual(cluster.called, ws_call.called and block_m in (256, 384) and recipes == RECIPES[1]
                     and gmm_ws_cluster.supported())
    want = oracle.gmm(oracle.dequantize(lhs, lhs_scale, "1x128"), oracle.dequantize(rhs, rhs_scale, "128x128"),
                      sizes, transpose_rhs=True)
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(out[m - 10:], 0.0)

  @parameterized.product(k=(64, 960, 1000), n=(104, 520), out_dtype=(jnp.float32, jnp.bfloat16),
                         tiling=((128, 4, 1), (128, 2, 1), (256, 3, 1), (128, 4, 3)))
  def test_warp_specialized_tgmm(self, k, n, out_dtype, tiling):
    """tgmm_fp8_ws_kernel (lhs (K, M), rhs (N, M)): groups of 0, 1, 127, 128, 129 rows and several inside one
    128-row step (its columns of other groups zeroed in shared memory), rows after the last group holding NaN,
    K tiles with one or two 64-row halves, N past the last column tile; 128-wide tiles (two products in flight:
    groups of 1, 2, 3 and 6 steps; 2 stages, the fewest it takes) and 256-wide ones (a tile with no right half at
    N = 520); tiles in bands of 3 K tiles (the last one shorter at K = 960 and 1000, wider than K = 64's one)."""
    block_n, stages, band = tiling
    m = 3008
    sizes = np.array([0, 1, 127, 128, 129, 300, 5, 3, 0, 700, self.rng.integers(1, 1000), 0], np.int32)
    sizes[-1] = m - 40 - sizes.sum()
    lhs_mk, lhs_scale = self.quantized((m, k), "128x1")
    rhs_mn, rhs_scale = self.quantized((m, n), "128x1")
    want, _ = oracle.tgmm(oracle.dequantize(lhs_mk, lhs_scale, "128x1"), oracle.dequantize(rhs_mn, rhs_scale, "128x1"),
                          sizes, transpose_lhs=True)
    after = jnp.arange(m)[:, None] >= m - 40
    lhs_nan = jnp.where(after, jnp.nan, lhs_mk.astype(jnp.float32)).astype(lhs_mk.dtype)
    config = dataclasses.replace(WS, block_n=block_n, num_stages=stages, band_tiles=band)
    fn = jax.jit(lambda *a: jgmm.tgmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True,
                                      preferred_element_type=out_dtype, config=config))
    with mock.patch.object(backend_triton, "_tgmm_fp8_ws", wraps=backend_triton._tgmm_fp8_ws) as ws_call:
      out = np.asarray(self.poisoned(fn, lhs_nan.T, rhs_mn.T, jnp.asarray(sizes), lhs_scale.T, rhs_scale.T),
                       np.float32)
    self.assertTrue(ws_call.called)
    self.assert_close(out, want, GPU_TOL if out_dtype == jnp.float32 else 1e-2)
    np.testing.assert_array_equal(out[sizes == 0], 0.0)

  @parameterized.product(k=(64, 1000), n=(104, 520), tiling=((128, 4), (256, 3)), transpose_out=(False, True))
  def test_warp_specialized_tgmm_rhs_scale_per_group(self, k, n, tiling, transpose_out):
    """tgmm_fp8_ws_kernel with rhs scaled per group and column (RHS_GROUPS): test_warp_specialized_tgmm's groups
    and NaN rows after them; an empty group's NaN scales leave its zeros exact. transpose_out: its tiles stored
    transposed (TRANSPOSE_OUT), out (G, N, K)."""
    block_n, stages = tiling
    m = 3008
    sizes = np.array([0, 1, 127, 128, 129, 300, 5, 3, 0, 700, self.rng.integers(1, 1000), 0], np.int32)
    sizes[-1] = m - 40 - sizes.sum()
    lhs_mk, lhs_scale = self.quantized((m, k), "128x1")
    rhs_mn = self.quantized((m, n), "128x1")[0]
    group_scale = np.asarray(self.rng.uniform(0.5, 2.0, (len(sizes), n)), np.float32)
    group_scale[sizes == 0] = np.nan
    group_of_row = np.clip(np.searchsorted(np.cumsum(sizes), np.arange(m), side="right"), 0, len(sizes) - 1)
    rhs_deq = np.asarray(rhs_mn, np.float64) * np.nan_to_num(group_scale)[group_of_row]
    want, _ = oracle.tgmm(oracle.dequantize(lhs_mk, lhs_scale, "128x1"), rhs_deq, sizes, transpose_lhs=True)
    lhs_nan = jnp.where(jnp.arange(m)[:, None] >= m - 40, jnp.nan, lhs_mk.astype(jnp.float32)).astype(lhs_mk.dtype)
    config = dataclasses.replace(WS, block_n=block_n, num_stages=stages)
    fn = jax.jit(lambda *a: fp8.tgmm(*a[:3], lhs_scale=a[3], rhs_scale=a[4], transpose_rhs=True,
                                     preferred_element_type=jnp.float32, config=config, rhs_scale_per_group=True,
                                     transpose_out=transpose_out))
    with mock.patch.object(backend_triton, "_tgmm_fp8_ws", wraps=backend_triton._tgmm_fp8_ws) as ws_call:
      out = np.asarray(self.poisoned(fn, lhs_nan.T, rhs_mn.T, jnp.asarray(sizes), lhs_scale.T,
                                     jnp.asarray(group_scale.T)), np.float32)
    self.assertTrue(ws_call.called)
    self.assertEqual(out.shape, (len(sizes), n, k) if transpose_out else (len(sizes), k, n))
    out = np.swapaxes(out, 1, 2) if transpose_out else out
    self.assert_close(out, want, GPU_TOL)
    np.testing.assert_array_equal(out[sizes == 0], 0.0)

  @parameterized.parameters((4096, 7168), (7168, 2048))
  def test_deepgemm_criterion_gmm(self, n, k):
    groups, m = 4, 1000
    x = jnp.asarray(self.rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(self.rng.standard_normal((groups, n, k)), jnp.bfloat16)
    (xq, xs), (wq, ws) = quantize.quantize(x, "1x128"), quantize.quantize(w, "128x128")
    sizes = jnp.asarray([300, 0, 451, 249], jnp.int32)
    out = jgmm.gmm(xq, wq, sizes, lhs_scale=xs, rhs_scale=ws, transpose_rhs=True)
    want = jgmm.gmm(x, w, sizes, transpose_rhs=True)
    self.assertLess(oracle.deepgemm_diff(out, want), 1e-3)

  @parameterized.parameters((4096, 7168), (7168, 2048))
  def test_deepgemm_criterion(self, n, k):
    groups, max_m = 4, 256
    x = jnp.asarray(self.rng.standard_normal((groups, max_m, k)), jnp.bfloat16)
    w = jnp.asarray(self.rng.standard_normal((groups, n, k)), jnp.bfloat16)
    (xq, xs), (wq, ws) = quantize.quantize(x, "1x128"), quantize.quantize(w, "128x128")
    masked_m = np.array([256, 100, 0, 255], np.int32)
    out = jgmm.masked_gmm(xq, wq, jnp.asarray(masked_m), x_scale=xs, w_scale=ws, expected_m=256)
    want = jgmm.masked_gmm(x, w, jnp.asarray(masked_m))
    self.assertLess(oracle.deepgemm_diff(out, want), 1e-3)

  def test_offsets_past_int32(self):
    """masked out (G * max_m, N) past 2^31 elements."""
    groups, max_m, n, k = 2, 2**31 // 4096 // 2 + 512, 4096, 128
    x, x_scale = self.quantized((groups, max_m, k), "1x128")
    w, w_scale = self.quantized((groups, n, k), "128x128")
    masked_m = np.array([max_m - 3, max_m], np.int32)
    out = jgmm.masked_gmm(x, w, jnp.asarray(masked_m), x_scale=x_scale, w_scale=w_scale)
    rows = np.array([0, max_m - 4, max_m - 1])
    got = np.asarray(out[:, rows], np.float32)
    xd, wd = oracle.dequantize(x[:, rows], x_scale[:, rows], "1x128"), oracle.dequantize(w, w_scale, "128x128")
    want = np.einsum("gmk,gnk->gmn", xd, wd)
    want[0, 2] = 0.0
    self.assertLess(oracle.rel_err(got, want), 1e-2)
    np.testing.assert_array_equal(got[0, 2], 0.0)


if __name__ == "__main__":
  absltest.main()
