"""The Triton backend (jgmm/backend_triton.py and its kernels) against a float64 numpy oracle.

CPU: the kernels run under Triton's interpreter (TRITON_INTERPRET=1) through jgmm.ffi, which NaN-poisons
every output buffer before the kernel runs, so an element the kernel forgets to write fails the check.
float32 only (the interpreter's bf16/fp16 dots are wrong), small tiles, both gmm load paths (tensor
descriptors, i.e. TMA, and pointers). Cross-lowering for sm_90 (JGMM_TARGET=cuda:90) proves the kernels compile.
GPU (skipped without one): bf16/fp16/fp32, real tiles, large odd shapes and offsets past 2^31.
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
import triton.language as tl
from absl.testing import absltest, parameterized

from jgmm import backend_triton, config_table, ffi, oracle
from jgmm.config import Config
from jgmm.ffi import _compile, _jaxlib
from jgmm.triton_kernels import gmm as gmm_kernels
from jgmm.triton_kernels import gmm_ws_cluster
from jgmm.triton_kernels.common import tile_coords

ON_GPU = any(d.platform == "gpu" for d in jax.devices())
SMALL = Config(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu", "swiglu")


# ---------------------------------------------------------------------------------------------------------
# The float64 oracle (jgmm.oracle) on `bounds`: rows [bounds[0], bounds[-1]) in groups, an empty group 0 before.


def _groups(bounds):
  """group_sizes and group_offset that jgmm.oracle reads as the local groups of `bounds`."""
  bounds = np.asarray(bounds)
  return np.concatenate([[bounds[0]], np.diff(bounds)]), 1


def gmm_oracle(lhs, rhs, bounds, bias, existing, transpose_rhs, activation):
  """(out, h) in float64: rows of group g get act(lhs @ rhs[g] + bias[g]) (+ existing), h is 0 elsewhere."""
  sizes, offset = _groups(bounds)
  out = oracle.gmm(lhs, rhs, sizes, bias=bias, transpose_rhs=transpose_rhs, group_offset=offset,
                   existing_out=existing, activation_name=activation)
  h = oracle.gmm(lhs, rhs, sizes, bias=bias, transpose_rhs=transpose_rhs, group_offset=offset)
  return out, h


def tgmm_oracle(lhs, rhs, bounds, existing, transpose_lhs):
  sizes, offset = _groups(bounds)
  return oracle.tgmm(lhs, rhs, sizes, transpose_lhs=transpose_lhs, group_offset=offset,
                     num_actual_groups=len(bounds) - 1, existing_out=existing)


masked_oracle = oracle.masked_gmm


def rel_err(actual, expected):
  return oracle.rel_err(np.asarray(actual, np.float32), expected)


class KernelTestBase(seeded.SeededTestCase):

  def normal(self, shape, dtype=jnp.float32):
    return jnp.asarray(self.rng.standard_normal(shape), dtype)

  def bounds(self, m, sizes, start=0):
    """int32 (G + 1,) bounds of consecutive groups of `sizes` rows starting at row `start` (sum <= m)."""
    bounds = start + np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    assert bounds[-1] <= m
    return bounds

  def random_bounds(self, m, groups):
    """Random groups with empty ones, an empty prefix and suffix."""
    start = int(self.rng.integers(0, max(1, m // 4)))
    stop = m - int(self.rng.integers(0, max(1, m // 4)))
    cuts = np.sort(self.rng.integers(start, stop + 1, groups - 1))
    return np.concatenate([[start], cuts, [stop]]).astype(np.int32)

  def assert_close(self, actual, expected, tol, what=""):
    actual = np.asarray(actual)
    self.assertFalse(np.isnan(actual.astype(np.float32)).any(), f"{what}: NaN (unwritten?), seed {self.seed}")
    err = rel_err(actual, expected)
    self.assertLess(err, tol, f"{what}: relative error {err:.3g}, seed {self.seed}")


def run_gmm(lhs, rhs, bounds, bias=None, existing=None, *, transpose_rhs=False, out_dtype=jnp.float32,
            activation=None, save_preactivation=False, config=SMALL):
  fn = jax.jit(lambda l, r, b, bi, e: backend_triton.gmm(
      l, r, b, bi, e, transpose_rhs=transpose_rhs, out_dtype=out_dtype, activation=activation,
      save_preactivation=save_preactivation, config=config))
  return fn(lhs, rhs, jnp.asarray(bounds), bias, existing)


def run_tgmm(lhs, rhs, bounds, existing=None, *, transpose_lhs=False, out_dtype=jnp.float32, bias_grad=False,
             config=SMALL):
  fn = jax.jit(lambda l, r, b, e: backend_triton.tgmm(
      l, r, b, e, transpose_lhs=transpose_lhs, out_dtype=out_dtype, bias_grad=bias_grad, config=config))
  return fn(lhs, rhs, jnp.asarray(bounds), existing)


def run_masked(x, w, masked_m, *, out_dtype=jnp.float32, config=SMALL):
  fn = jax.jit(lambda a, b, c: backend_triton.masked_gmm(a, b, c, out_dtype=out_dtype, expected_m=None, config=config))
  return fn(x, w, jnp.asarray(masked_m, jnp.int32))


# ---------------------------------------------------------------------------------------------------------
# CPU: the interpreter


class InterpretedTestBase(KernelTestBase):
  """The kernels under Triton's interpreter (TRITON_INTERPRET=1), never compiled for a GPU target."""

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    os.environ.pop("JGMM_TARGET", None)


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedGmmTest(InterpretedTestBase):

  @parameterized.product(
      (dict(m=37, k=33, n=24), dict(m=40, k=32, n=48), dict(m=50, k=7, n=32), dict(m=21, k=1, n=7),
       dict(m=33, k=32, n=1)),
      transpose_rhs=(False, True),
      tma=(False, True),
  )
  def test_layouts_and_odd_sizes(self, m, k, n, transpose_rhs, tma):
    groups = 3
    lhs, rhs = self.normal((m, k)), self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=16, block_n=16, block_k=16, tma=tma)
    out = run_gmm(lhs, rhs, bounds, transpose_rhs=transpose_rhs, config=config)
    self.assert_close(out, gmm_oracle(lhs, rhs, bounds, None, None, transpose_rhs, None)[0], 1e-5)

  @parameterized.product(transpose_rhs=(False, True), persistent=(False, True))
  def test_groups_of_many_row_tiles(self, transpose_rhs, persistent):
    """Groups of 10, 18, 8 and 21 row tiles of 16 rows (bands of 8 whose last one takes the rest, two bands in one
    group), the last row tile of each partial, rows before and after them: every tile once."""
    m, k, n = 900, 16, 40
    bounds = self.bounds(m, [150, 280, 128, 321], start=5)
    lhs, rhs = self.normal((m, k)), self.normal((4, n, k) if transpose_rhs else (4, k, n))
    config = Config(block_m=16, block_n=16, block_k=16, persistent=persistent)
    out = run_gmm(lhs, rhs, bounds, transpose_rhs=transpose_rhs, config=config)
    self.assert_close(out, gmm_oracle(lhs, rhs, bounds, None, None, transpose_rhs, None)[0], 1e-5)

  @parameterized.product(activation=ACTIVATIONS, transpose_rhs=(False, True), tma=(False, True))
  def test_activation_bias_and_preactivation(self, activation, transpose_rhs, tma):
    m, k, n, groups = 45, 32, 64, 4
    lhs, rhs = self.normal((m, k)), self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    bias = self.normal((groups, n))
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=16, block_n=16, block_k=32, tma=tma)
    out, h = run_gmm(lhs, rhs, bounds, bias, transpose_rhs=transpose_rhs, activation=activation,
                     save_preactivation=True, config=config)
    want_out, want_h = gmm_oracle(lhs, rhs, bounds, bias, None, transpose_rhs, activation)
    self.assertEqual(out.shape, want_out.shape)
    self.assert_close(out, want_out, 1e-5, "out")
    self.assert_close(h, want_h, 1e-5, "h")

  @parameterized.product(activation=(None, "silu", "swiglu"), tma=(False, True), save_preactivation=(False, True))
  def test_existing_out_accumulates_and_keeps_other_rows(self, activation, tma, save_preactivation):
    m, k, n, groups = 40, 16, 32, 3
    lhs, rhs = self.normal((m, k)), self.normal((groups, k, n))
    n_out = n // 2 if activation == "swiglu" else n
    existing = self.normal((m, n_out))
    bounds = self.bounds(m, [9, 0, 17], start=5)  # rows 0-4 and 31-39 in no group
    config = Config(block_m=16, block_n=16, block_k=16, tma=tma)
    result = run_gmm(lhs, rhs, bounds, None, existing, activation=activation,
                     save_preactivation=save_preactivation, config=config)
    want_out, want_h = gmm_oracle(lhs, rhs, bounds, None, existing, False, activation)
    out = result[0] if save_preactivation else result
    self.assert_close(out, want_out, 1e-5, "out")
    np.testing.assert_array_equal(out[:5], existing[:5])
    np.testing.assert_array_equal(out[31:], existing[31:])
    if save_preactivation:
      self.assert_close(result[1], want_h, 1e-5, "h")

  @parameterized.product(
      (dict(m=45, k=32, n=48, transpose_rhs=False, activation=None, existing=False),
       dict(m=40, k=16, n=64, transpose_rhs=True, activation="swiglu", existing=True),
       dict(m=70, k=48, n=20, transpose_rhs=False, activation="relu", existing=True)),
      save_preactivation=(False, True))
  def test_tma_store(self, m, k, n, transpose_rhs, activation, existing, save_preactivation):
    """Config.tma_store: out's tiles through the ragged descriptor, each clipped to its group's rows (the rows
    past a group's end in a tile belong to the next group or to no group, which NaN-poisoning would expose)."""
    groups = 4
    lhs, rhs = self.normal((m, k)), self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    n_out = n // 2 if activation == "swiglu" else n
    existing_out = self.normal((m, n_out)) if existing else None
    bounds = self.bounds(m, [7, 0, 19, 11], start=3)  # partial tiles, an empty group, rows in no group
    config = Config(block_m=16, block_n=16, block_k=16, tma=True, tma_store=True)
    with mock.patch.object(backend_triton.ffi, "triton_call", wraps=backend_triton.ffi.triton_call) as call:
      result = run_gmm(lhs, rhs, bounds, None, existing_out, transpose_rhs=transpose_rhs, activation=activation,
                       save_preactivation=save_preactivation, config=config)
    self.assertTrue(call.call_args.kwargs["TMA_STORE"])
    want_out, want_h = gmm_oracle(lhs, rhs, bounds, None, existing_out, transpose_rhs, activation)
    self.assert_close(result[0] if save_preactivation else result, want_out, 1e-5, "out")
    if save_preactivation:
      self.assert_close(result[1], want_h, 1e-5, "h")

  @parameterized.product(
      (dict(sizes=[16, 0, 9, 40], n_out=100, split=1), dict(sizes=[17, 15], n_out=200, split=2),
       dict(sizes=[13], n_out=200, split=2), dict(sizes=[40, 40, 5], n_out=100, split=0)),
      (dict(transpose_rhs=False, tma=False, activation=None, existing=False, tma_store=False),
       dict(transpose_rhs=True, tma=True, activation=None, existing=False, tma_store=False),
       dict(transpose_rhs=False, tma=True, activation="swiglu", existing=False, tma_store=False),
       dict(transpose_rhs=False, tma=True, activation="relu", existing=True, tma_store=True)),
  )
  def test_tail_split(self, sizes, n_out, split, transpose_rhs, tma, activation, existing, tma_store):
    """Config.tail_split: the interpreter's 4 programs run T tiles of 16 x 128 (n_out 100 or 200 columns: the
    second half of a tile partly or wholly past N); where T mod 4 is 1 or 2 (`split`), the last round's tiles run
    as halves of 64 columns, T = 2 all of them; T mod 4 = 3 runs whole. Both load paths, rhs transposed, swiglu
    with bias and the pre-activation, existing_out with TMA stores; rows before and after the groups."""
    n = 2 * n_out if activation == "swiglu" else n_out
    tiles = sum(-(-size // 16) for size in sizes) * -(-n_out // 128)
    self.assertEqual(tiles % 4 if 2 * (tiles % 4) <= 4 else 0, split, tiles)
    m, k, groups = sum(sizes) + 9, 24, len(sizes)
    lhs, rhs = self.normal((m, k)), self.normal((groups, n, k) if transpose_rhs else (groups, k, n))
    bias = self.normal((groups, n)) if activation else None
    existing_out = self.normal((m, n_out)) if existing else None
    bounds = self.bounds(m, sizes, start=4)
    config = Config(block_m=16, block_n=128, block_k=16, tma=tma, tma_store=tma_store, tail_split=True)
    with mock.patch.object(backend_triton.ffi, "triton_call", wraps=backend_triton.ffi.triton_call) as call:
      out, h = run_gmm(lhs, rhs, bounds, bias, existing_out, transpose_rhs=transpose_rhs, activation=activation,
                       save_preactivation=True, config=config)
    self.assertTrue(call.call_args.kwargs["TAIL_SPLIT"])
    want_out, want_h = gmm_oracle(lhs, rhs, bounds, bias, existing_out, transpose_rhs, activation)
    self.assert_close(out, want_out, 1e-5, "out")
    self.assert_close(h, want_h, 1e-5, "h")

  @parameterized.named_parameters(
      ("single_group", [37]),
      ("all_empty", [0, 0, 0]),
      ("empty_prefix_suffix", [0, 12, 0, 0, 9, 0]),
      ("one_row_groups", [1, 1, 1, 1, 1]),
  )
  def test_group_patterns(self, sizes):
    m, k, n = 37, 16, 32
    start = (m - sum(sizes)) // 2
    bounds = self.bounds(m, sizes, start=start)
    lhs, rhs = self.normal((m, k)), self.normal((len(sizes), k, n))
    for grid in ({"persistent": True}, {"persistent": True, "programs_per_sm": 2}, {"persistent": False}):
      config = Config(block_m=16, block_n=16, block_k=16, **grid)
      out = run_gmm(lhs, rhs, bounds, config=config)
      want = gmm_oracle(lhs, rhs, bounds, None, None, False, None)[0]
      self.assert_close(out, want, 1e-5, str(grid))
      np.testing.assert_array_equal(out[:bounds[0]], 0.0)  # Exact zeros outside the groups.
      np.testing.assert_array_equal(out[bounds[-1]:], 0.0)

  def test_m_zero(self):
    out, h = run_gmm(self.normal((0, 8)), self.normal((2, 8, 16)), np.zeros(3, np.int32), save_preactivation=True)
    self.assertEqual(out.shape, (0, 16))
    self.assertEqual(h.shape, (0, 16))

  def test_out_dtype_bfloat16(self):
    m, k, n, groups = 33, 32, 32, 2
    lhs, rhs = self.normal((m, k)), self.normal((groups, k, n))
    bounds = self.random_bounds(m, groups)
    out = run_gmm(lhs, rhs, bounds, out_dtype=jnp.bfloat16)
    self.assertEqual(out.dtype, jnp.bfloat16)
    self.assert_close(out, gmm_oracle(lhs, rhs, bounds, None, None, False, None)[0], 1e-2)

  def test_larger_tiles_and_default_config(self):
    m, k, n, groups = 150, 64, 96, 5
    lhs, rhs = self.normal((m, k)), self.normal((groups, n, k))
    bounds = self.random_bounds(m, groups)
    want = gmm_oracle(lhs, rhs, bounds, None, None, True, None)[0]
    for config in (Config(block_m=64, block_n=32, block_k=32), None):
      self.assert_close(run_gmm(lhs, rhs, bounds, transpose_rhs=True, config=config), want, 1e-5, str(config))


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedTgmmTest(InterpretedTestBase):

  @parameterized.product(
      (dict(m=40, k=32, n=48), dict(m=37, k=7, n=33), dict(m=29, k=1, n=16), dict(m=35, k=16, n=1)),
      transpose_lhs=(False, True),
      programs_per_sm=(None, 1, 2),  # None: one program per tile.
  )
  def test_layouts_and_sizes(self, m, k, n, transpose_lhs, programs_per_sm):
    groups = 4
    lhs, rhs = self.normal((m, k) if transpose_lhs else (k, m)), self.normal((m, n))
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=16, block_n=16, block_k=16, persistent=programs_per_sm is not None,
                    programs_per_sm=programs_per_sm or 1)
    out, dbias = run_tgmm(lhs, rhs, bounds, transpose_lhs=transpose_lhs, bias_grad=True, config=config)
    want, want_dbias = tgmm_oracle(lhs, rhs, bounds, None, transpose_lhs)
    self.assert_close(out, want, 1e-5, "out")
    self.assert_close(dbias, want_dbias, 1e-5, "dbias")

  def test_many_k_tiles(self):
    """K of 10 tiles of 16 (bands of 8 K tiles, the last one taking the rest) and 3 column tiles, 2 groups."""
    m, k, n = 60, 150, 40
    bounds = self.bounds(m, [25, 31], start=2)
    lhs, rhs = self.normal((m, k)), self.normal((m, n))
    out = run_tgmm(lhs, rhs, bounds, transpose_lhs=True, config=Config(block_m=16, block_n=16, block_k=16))
    self.assert_close(out, tgmm_oracle(lhs, rhs, bounds, None, True)[0], 1e-5)

  @parameterized.product(transpose_lhs=(False, True), persistent=(False, True))
  def test_empty_groups_are_exact_zeros_and_existing_accumulates(self, transpose_lhs, persistent):
    m, k, n = 40, 32, 32
    bounds = self.bounds(m, [0, 17, 0, 20, 0], start=2)
    lhs, rhs = self.normal((m, k) if transpose_lhs else (k, m)), self.normal((m, n))
    config = Config(block_m=16, block_n=16, block_k=16, persistent=persistent)
    out = run_tgmm(lhs, rhs, bounds, transpose_lhs=transpose_lhs, config=config)
    self.assert_close(out, tgmm_oracle(lhs, rhs, bounds, None, transpose_lhs)[0], 1e-5)
    for g in (0, 2, 4):
      np.testing.assert_array_equal(out[g], 0.0)
    existing = self.normal((5, k, n))
    out, dbias = run_tgmm(lhs, rhs, bounds, existing, transpose_lhs=transpose_lhs, bias_grad=True, config=config)
    want, want_dbias = tgmm_oracle(lhs, rhs, bounds, existing, transpose_lhs)
    self.assert_close(out, want, 1e-5, "out")
    self.assert_close(dbias, want_dbias, 1e-5, "dbias")
    np.testing.assert_array_equal(out[0], existing[0])

  def test_m_zero(self):
    out, dbias = run_tgmm(self.normal((0, 8)), self.normal((0, 16)), np.zeros(4, np.int32), transpose_lhs=True,
                          bias_grad=True)
    np.testing.assert_array_equal(out, np.zeros((3, 8, 16)))
    np.testing.assert_array_equal(dbias, np.zeros((3, 16)))

  def test_default_config(self):
    m, k, n = 70, 48, 40
    bounds = self.random_bounds(m, 3)
    lhs, rhs = self.normal((m, k)), self.normal((m, n))
    out = run_tgmm(lhs, rhs, bounds, transpose_lhs=True, config=None)
    self.assert_close(out, tgmm_oracle(lhs, rhs, bounds, None, True)[0], 1e-5)


@triton.jit
def _tile_coords_kernel(m_tiles, rows_ptr, cols_ptr, N_TILES: tl.constexpr, GROUP_M: tl.constexpr):
  row, col = tile_coords(tl.program_id(0), m_tiles, N_TILES, GROUP_M)
  tl.store(rows_ptr + tl.program_id(0), row)
  tl.store(cols_ptr + tl.program_id(0), col)


def banded_order(m_tiles, n_tiles, band):
  """[(row tile, column tile)] in common.tile_coords' documented order: bands of `band` row tiles, the last one
  also taking the m_tiles % band left over, the row tile fastest inside a band; row-major for band 1."""
  if band == 1:
    return [(r, c) for r in range(m_tiles) for c in range(n_tiles)]
  starts = list(range(0, m_tiles, band))[:max(m_tiles // band, 1)]
  return [(r, c) for start, end in zip(starts, starts[1:] + [m_tiles])
          for c in range(n_tiles) for r in range(start, end)]


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedTileOrderTest(InterpretedTestBase):

  @parameterized.parameters((9, 5, 8), (17, 3, 8), (7, 4, 8), (16, 2, 8), (10, 3, 3), (1, 6, 8), (5, 3, 1))
  def test_tile_coords(self, m_tiles, n_tiles, band):
    """Every tile once, in bands of `band` row tiles whose last one takes the rest (9 row tiles in bands of 8: one
    band of 9, where a band of 1 after 8 would read the whole rhs again for one row tile)."""
    tiles = m_tiles * n_tiles
    rows, cols = jax.jit(lambda: ffi.triton_call(
        m_tiles, kernel=_tile_coords_kernel, out_shape=[jax.ShapeDtypeStruct((tiles,), jnp.int32)] * 2,
        grid=(tiles,), N_TILES=n_tiles, GROUP_M=band))()
    self.assertEqual(list(zip(np.asarray(rows).tolist(), np.asarray(cols).tolist())),
                     banded_order(m_tiles, n_tiles, band))

  def test_ws_schedule_regions(self):
    """gmm_ws's schedule (backend_triton._row_tiles): per row tile, the first row tile and the row tiles of its
    region (rows before the groups, each group, an empty one too, rows after them), whose bands tile_of walks."""
    m, block_m = 1000, 128
    bounds = jnp.asarray([37, 37, 300, 301, 990], jnp.int32)
    row_tiles = -(-m // block_m) + bounds.shape[0]
    schedule = np.asarray(backend_triton._row_tiles(bounds, m, row_tiles, block_m))
    edges = [0, *np.asarray(bounds).tolist(), m]
    first, want = 0, []
    for start, end in zip(edges, edges[1:]):
      count = -(-(end - start) // block_m)
      want += [(first, count)] * count
      first += count
    self.assertEqual(schedule[0], len(want))
    got = schedule[1 + 4 * row_tiles:1 + 6 * row_tiles].reshape(2, row_tiles)[:, :len(want)]
    self.assertEqual(list(zip(*got.tolist())), want)
    row0 = schedule[1 + row_tiles:1 + 2 * row_tiles]
    for r, (first, _) in enumerate(want):  # A region's first tile starts at its first row.
      self.assertIn(row0[first], edges)
      self.assertEqual((row0[r] - row0[first]) % block_m, 0)


@absltest.skipIf(ON_GPU, "interpreter tests run on the CPU")
class InterpretedMaskedTest(InterpretedTestBase):

  @parameterized.product(
      (dict(max_m=37, k=32, n=24), dict(max_m=16, k=7, n=33), dict(max_m=5, k=1, n=1)),
      tma=(False, True),
  )
  def test_masked(self, max_m, k, n, tma):
    groups = 4
    x, w = self.normal((groups, max_m, k)), self.normal((groups, n, k))
    masked_m = np.array([0, max_m, *self.rng.integers(0, max_m + 1, groups - 2)], np.int32)
    out = run_masked(x, w, masked_m, config=Config(block_m=16, block_n=16, block_k=16, tma=tma))
    want = masked_oracle(x, w, masked_m)
    self.assert_close(out, want, 1e-5)
    np.testing.assert_array_equal(out[0], 0.0)


# ---------------------------------------------------------------------------------------------------------
# CPU: cross-lowering for Hopper compiles every kernel variant


@absltest.skipIf(ON_GPU, "lowers for a GPU the machine does not have")
@absltest.skipIf(not hasattr(gmm_kernels.gmm_kernel, "cache_key"),
                 "TRITON_INTERPRET=1 was set when the kernels were imported: they cannot be compiled")
@absltest.skipUnless(_jaxlib.has_plugin(), "cross-lowering needs jax's GPU plugin: pip install 'jgmm[cuda]'")
class CrossLoweringTest(parameterized.TestCase):

  def lower(self, fn, *args):
    """StableHLO of fn lowered for sm_90, and the Triton signatures of the kernels compiled for it."""
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    self.assertIn("triton_kernel_call", text)
    return text, [c.args[1] for c in compile_kernel.call_args_list]

  def assert_loads_through_tma(self, signatures, tma):
    """With tma (and a jaxlib that builds host TMA descriptors), the gmm kernel takes two tensor descriptors."""
    expected = 2 if tma and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")) else 0
    for signature in signatures:
      self.assertEqual(sum(t.startswith("tensordesc") for t in signature.values()), expected, signature)

  @parameterized.product(
      shape=((8192, 4096, 14336, 8), (512, 4096, 2048, 64), (1000, 2880, 5760, 4), (100, 7, 33, 3)),
      variant=("plain", "transposed_swiglu_bias"),
      tma=(False, True),
  )
  def test_gmm_compiles_for_sm90(self, shape, variant, tma):
    m, k, n, groups = shape
    dt = jnp.bfloat16
    s = jax.ShapeDtypeStruct
    transpose = variant != "plain"
    activation = "swiglu" if transpose else None
    config = Config(block_m=128, block_n=128, block_k=64, num_warps=8, tma=tma)
    _, signatures = self.lower(
        lambda l, r, b, bi: backend_triton.gmm(l, r, b, bi, None, transpose_rhs=transpose, out_dtype=dt,
                                               activation=activation, save_preactivation=transpose, config=config),
        s((m, k), dt), s((groups, n, k) if transpose else (groups, k, n), dt), s((groups + 1,), jnp.int32),
        s((groups, n), dt) if transpose else None)
    self.assert_loads_through_tma(signatures, tma and k % 8 == 0 and n % 16 == 0)

  @parameterized.parameters((1, 32), (8, 32), (32, 32), (33, 64))
  def test_group_tables_are_a_warp_wide(self, groups, lanes):
    """gmm_kernel's and tgmm_kernel's register-resident group tables get G_POW2 = max(32, next_pow2(G)) lanes (a
    table narrower than a warp ran gmm_kernel 20-27% slower at 2-16 groups on an H200)."""
    dt, s = jnp.bfloat16, jax.ShapeDtypeStruct
    m, k, n = 1000, 256, 384
    config = Config(block_m=64, block_n=128, block_k=64, num_warps=4)
    with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
        mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
      jax.jit(lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=False, out_dtype=dt,
                                                 activation=None, save_preactivation=False, config=config)).trace(
          s((m, k), dt), s((groups, k, n), dt), s((groups + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
      jax.jit(lambda l, r, b: backend_triton.tgmm(l, r, b, None, transpose_lhs=True, out_dtype=dt, bias_grad=False,
                                                  config=config)).trace(
          s((m, k), dt), s((m, n), dt), s((groups + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
    kernels = {c.args[0].__name__: c.args[2] for c in compile_kernel.call_args_list}
    self.assertEqual(set(kernels), {"gmm_kernel", "tgmm_kernel"})
    for name, constexprs in kernels.items():
      self.assertEqual((constexprs["G"], constexprs["G_POW2"]), (groups, lanes), name)

  @parameterized.parameters(3, 4)
  def test_gmm_tma_store_compiles_for_sm90(self, num_stages):
    """Config.tma_store: two TMA stores per tile (column halves) through an on-device descriptor (global scratch),
    loop still fused, within Hopper's shared memory with 4 stages of 128 x 256 x 64; plain stores without a jaxlib
    that builds host descriptors (no TMA loads, so no TMA store either)."""
    dt, s = jnp.bfloat16, jax.ShapeDtypeStruct
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=num_stages, tma_store=True)
    before = set(_compile._cache)
    self.lower(lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=False, out_dtype=dt,
                                                  activation=None, save_preactivation=False, config=config),
               s((8192, 4096), dt), s((8, 4096, 14336), dt), s((9,), jnp.int32))
    (compiled,) = [_compile._cache[key] for key in set(_compile._cache) - before]
    ttgir = compiled.asm["ttgir"]
    if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
      self.assertNotIn("async_tma_copy_local_to_global", ttgir)
      return
    self.assertEqual(ttgir.count("ttng.async_tma_copy_local_to_global"), 2)
    self.assertGreater(compiled.global_scratch_size, 0)
    self.assertEqual(ttgir.count("scf.for"), 2)  # the fused tile x K loop and the zero-tile loop
    self.assertLessEqual(compiled.shared_mem_bytes, 232448)  # sm_90's opt-in limit per block

  @parameterized.product(
      shape=((32768, 2048, 1536, 128), (100, 64, 40, 3), (1000, 72, 5760, 4)),
      transpose_rhs=(False, True),
      dt=(jnp.bfloat16, jnp.float16),
  )
  def test_gmm_ws_compiles_for_sm90(self, shape, transpose_rhs, dt):
    """The warp-specialised Gluon kernel where it applies (K a multiple of block_k unless rhs is transposed; in
    bands of 8 row tiles of a group with rhs transposed, row-major otherwise), gmm_kernel elsewhere and with a jaxlib
    that cannot build host TMA descriptors."""
    m, k, n, groups = shape
    s = jax.ShapeDtypeStruct
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                    band_tiles=8 if transpose_rhs else 1)
    _, signatures = self.lower(
        lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=transpose_rhs, out_dtype=dt,
                                           activation=None, save_preactivation=False, config=config),
        s((m, k), dt), s((groups, n, k) if transpose_rhs else (groups, k, n), dt), s((groups + 1,), jnp.int32))
    applies = (transpose_rhs or k % 64 == 0) and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda"))
    (signature,) = signatures
    self.assertEqual("OUT_LAYOUT" in signature, applies, signature)
    if applies:
      rhs_box = "256, 64" if transpose_rhs else "64, 256"
      self.assertTrue(signature["rhs_desc"].startswith(f"tensordesc<{'bf16' if dt == jnp.bfloat16 else 'fp16'}"
                                                       f"[{rhs_box}],NVMMASharedLayout("), signature)
      compiled = next(c for key, c in _compile._cache.items() if dict(key[1]) == signature)
      self.assertEqual(compiled.num_warps, 12)  # The consumer warpgroups and the loader warp, rounded up.
      self.assertLessEqual(compiled.shared_mem_bytes, 227 * 1024)

  @parameterized.product(
      (dict(dt=jnp.bfloat16, bias_grad=False), dict(dt=jnp.float16, bias_grad=False),
       dict(dt=jnp.float32, bias_grad=False), dict(dt=jnp.bfloat16, bias_grad=True)),
      shape=((8192, 4096, 14336, 8), (100, 64, 40, 3), (1000, 72, 2880, 4)),
      transpose_lhs=(False, True),
  )
  def test_tgmm_ws_compiles_for_sm90(self, dt, bias_grad, shape, transpose_lhs):
    """The warp-specialised tgmm where it applies (2-byte floats, lhs (M, K) read transposed; with or without the
    bias gradient), tgmm_kernel elsewhere and with a jaxlib that cannot build host TMA descriptors."""
    m, k, n, groups = shape
    s = jax.ShapeDtypeStruct
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                    band_tiles=8)
    _, signatures = self.lower(
        lambda l, r, b: backend_triton.tgmm(l, r, b, None, transpose_lhs=transpose_lhs, out_dtype=dt,
                                            bias_grad=bias_grad, config=config),
        s((m, k) if transpose_lhs else (k, m), dt), s((m, n), dt), s((groups + 1,), jnp.int32))
    applies = (transpose_lhs and dt != jnp.float32 and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")))
    (signature,) = signatures
    self.assertEqual("OUT_LAYOUT" in signature, applies, signature)
    if applies:
      self.assertIn("[64, 64],NVMMASharedLayout(", signature["lhs_desc"])
      self.assertIn("[64, 256],NVMMASharedLayout(", signature["rhs_desc"])
      compiled = next(c for key, c in _compile._cache.items() if dict(key[1]) == signature)
      self.assertEqual(compiled.num_warps, 12)  # The consumer warpgroups and the loader warp, rounded up.
      self.assertLessEqual(compiled.shared_mem_bytes, 227 * 1024)

  def test_masked_tgmm_takes_tgmm_kernel_tiles_where_a_table_chose_the_ws_tgmm(self):
    """masked_tgmm shares tgmm's keys; where a table's entry for the key is a tgmm_ws config (its tiles tuned for that
    kernel), the masked layout runs tgmm_kernel at the heuristic's tiles; an explicit config keeps its tiles."""
    groups, max_m, k, n = 8, 1024, 4096, 14336
    s, dt = jax.ShapeDtypeStruct, jnp.bfloat16
    key = config_table.make_key("tgmm", "bfloat16", "bfloat16", max_m, k, n, groups, transpose=True)
    ws = Config(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=6, warp_specialized=True)
    heuristic = config_table.heuristic_config(key, "sm90")
    self.assertNotEqual(heuristic.block_k, ws.block_k)
    for source, want in (("exact", heuristic), ("override", ws)):
      chosen = config_table.Selection("triton", ws, source, None, None)
      with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
          mock.patch.object(config_table, "select", return_value=chosen), \
          mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
        jax.jit(lambda x, d, mm: backend_triton.masked_tgmm(x, d, mm, out_dtype=dt, config=None)).trace(
            s((groups, max_m, k), dt), s((groups, max_m, n), dt), s((groups,), jnp.int32)).lower(
                lowering_platforms=("cuda",))
      (call,) = compile_kernel.call_args_list
      constexprs = call.args[2]
      self.assertTrue(constexprs["MASKED"])  # tgmm_kernel
      self.assertEqual((constexprs["BLOCK_N"], constexprs["BLOCK_K"], call.args[6]),
                       (want.block_n, want.block_k, want.num_stages), source)

  @parameterized.product(transpose_rhs=(False, True), warp_specialized=(False, True), split=(False, True))
  def test_tail_split_compiles_for_sm90(self, transpose_rhs, warp_specialized, split):
    """Config.tail_split: both kernels take a host descriptor of rhs boxes half as wide as rhs_desc's, in its
    layout (gmm_ws_kernel: a half lands in a stage's first columns); gmm_kernel makes no descriptor on the device
    (no global scratch) and, non-persistent, has no last round to split. Without the split the parameter is a
    placeholder pointer (no descriptor encoded per launch)."""
    dt, s = jnp.bfloat16, jax.ShapeDtypeStruct
    m, k, n, groups = 8192, 4096, 14336, 8
    for persistent in (True, False) if not warp_specialized else (True,):
      config = Config(128, 256, 64, 8, 3, persistent=persistent, warp_specialized=warp_specialized, band_tiles=8,
                      tail_split=split)
      with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}), \
          mock.patch.object(_compile, "compile_kernel", wraps=_compile.compile_kernel) as compile_kernel:
        jax.jit(lambda l, r, b: backend_triton.gmm(
            l, r, b, None, None, transpose_rhs=transpose_rhs, out_dtype=dt, activation=None,
            save_preactivation=False, config=config)).trace(
                s((m, k), dt), s((groups, n, k) if transpose_rhs else (groups, k, n), dt),
                s((groups + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
      (call,) = compile_kernel.call_args_list
      signature, constexprs = call.args[1], call.args[2]
      if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
        self.assertNotIn("SPLIT", constexprs)  # gmm_kernel
        continue
      compiled = _compile.compile_kernel(*call.args, **call.kwargs)  # The compiled kernel, from the cache.
      self.assertLessEqual(compiled.shared_mem_bytes, 227 * 1024)
      if warp_specialized:
        self.assertEqual(constexprs["SPLIT"], split)
        whole, half = ("256, 64", "128, 64") if transpose_rhs else ("64, 256", "64, 128")
        self.assertTrue(signature["rhs_desc"].startswith(f"tensordesc<bf16[{whole}],NVMMASharedLayout("), signature)
      else:
        self.assertEqual(constexprs["TAIL_SPLIT"], split and persistent)
        whole, half = ("1, 1, 256, 64", "1, 1, 128, 64") if transpose_rhs else ("1, 64, 1, 256", "1, 64, 1, 128")
        self.assertTrue(signature["rhs_desc"].startswith(f"tensordesc<bf16[{whole}]"), signature)
        self.assertEqual(compiled.global_scratch_size, 0)  # No descriptor made on the device.
      if split and persistent:
        self.assertEqual(signature["rhs_half_desc"], signature["rhs_desc"].replace(whole, half), signature)
      else:
        self.assertEqual(signature["rhs_half_desc"], "*i32", signature)

  @parameterized.parameters(False, True)
  def test_gmm_ws_cluster_compiles_for_sm90(self, transpose_rhs):
    """Config.cluster_size 2 (bands of 3 row tiles): under a Triton with Gluon's clusters (>= 3.7) the cluster kernel
    (2 CTAs a cluster, two multicast TMA loads: the lhs halves; the rhs box twice the CTA's columns, split between
    the CTAs), under an older one the one-CTA kernel with the same config."""
    m, k, n, groups = 1000, 4096, 1280, 4
    s, dt = jax.ShapeDtypeStruct, jnp.bfloat16
    config = Config(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=3, cluster_size=2)
    before = set(_compile._cache)
    _, signatures = self.lower(
        lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=transpose_rhs, out_dtype=dt,
                                           activation=None, save_preactivation=False, config=config),
        s((m, k), dt), s((groups, n, k) if transpose_rhs else (groups, k, n), dt), s((groups + 1,), jnp.int32))
    (signature,) = signatures
    if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
      self.assertNotIn("OUT_LAYOUT", signature)  # gmm_kernel
      return
    (compiled,) = [_compile._cache[key] for key in set(_compile._cache) - before]
    ctas = 2 if gmm_ws_cluster.supported() else 1
    self.assertEqual(compiled.num_ctas, ctas)
    ptx = compiled.asm["ptx"]
    self.assertEqual(".reqnctapercluster 2" in ptx, ctas == 2)
    self.assertEqual(len(re.findall(r"cp\.async\.bulk\.tensor\S*multicast::cluster", ptx)), 2 if ctas == 2 else 0)
    rhs_box = f"{256 * ctas}, 64" if transpose_rhs else f"64, {256 * ctas}"
    self.assertIn(f"[{rhs_box}]", signature["rhs_desc"])
    self.assertLessEqual(compiled.shared_mem_bytes, 227 * 1024)

  @parameterized.product(dt=(jnp.bfloat16, jnp.float32), tma=(False, True))
  def test_tgmm_and_masked_compile_for_sm90(self, dt, tma):
    s = jax.ShapeDtypeStruct
    m, k, n, groups = 4096, 2048, 1536, 16
    for transpose_lhs in (True, False):
      self.lower(
          lambda l, r, b: backend_triton.tgmm(l, r, b, None, transpose_lhs=transpose_lhs, out_dtype=dt,
                                              bias_grad=True, config=None),
          s((m, k) if transpose_lhs else (k, m), dt), s((m, n), dt), s((groups + 1,), jnp.int32))
    config = Config(block_m=64, block_n=128, block_k=32, tma=tma)
    _, signatures = self.lower(
        lambda x, w, mm: backend_triton.masked_gmm(x, w, mm, out_dtype=dt, expected_m=None, config=config),
        s((groups, 256, k), dt), s((groups, n, k), dt), s((groups,), jnp.int32))
    self.assert_loads_through_tma(signatures, tma)

  @parameterized.parameters(  # Configs at or near sm_90's limit, each path (TMA, pointers, ws, TMA store, swiglu).
      ("gmm", jnp.bfloat16, None, Config(128, 256, 64, 8, 3, warp_specialized=True)),
      ("gmm_t", jnp.bfloat16, None, Config(128, 128, 64, 8, 5, warp_specialized=True)),
      ("gmm", jnp.bfloat16, None, Config(128, 256, 64, 8, 3, tma_store=True)),
      ("gmm", jnp.float32, None, Config(64, 256, 32, 4, 4)), ("gmm", jnp.bfloat16, "swiglu", Config(64, 128, 64, 4, 4)),
      ("gmm_t", jnp.float32, None, Config(64, 128, 64, 4, 4)), ("gmm", jnp.bfloat16, None, Config(16, 128, 128, 4, 6)),
      ("tgmm", jnp.bfloat16, None, Config(128, 256, 64, 8, 3)), ("tgmm", jnp.float32, None, Config(128, 64, 64, 4, 6)),
      ("masked", jnp.bfloat16, None, Config(128, 256, 64, 8, 3)),
      ("gmm", jnp.bfloat16, None, Config(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8, tail_split=True)),
      ("gmm_t", jnp.bfloat16, None, Config(128, 256, 64, 8, 3, tail_split=True)),
      ("gmm", jnp.bfloat16, None, Config(128, 256, 64, 8, 3, tma_store=True, tail_split=True)),
      ("gmm", jnp.bfloat16, "swiglu", Config(64, 128, 64, 4, 4, tail_split=True)))
  def test_configs_that_fit_compile_within_sm90s_shared_memory(self, op, out_dtype, activation, config):
    """config_table.fits() (the heuristic's shrinking, the tuner's space) admits config on sm90, and the kernel
    Triton compiles for it stays within sm_90's 227 KiB per block (bf16 inputs; the Triton installed)."""
    from jgmm import config_table
    dt, s = jnp.bfloat16, jax.ShapeDtypeStruct
    m, k, n, groups = 4096, 2048, 2048, 4
    key = config_table.make_key(op, "bfloat16", jnp.dtype(out_dtype).name, m / groups, k, n, groups,
                                transpose=op in ("gmm_t", "tgmm"), activation=activation)
    self.assertTrue(config_table.fits(key, config, "sm90"), config)
    before = set(_compile._cache)
    if op == "tgmm":
      self.lower(lambda l, r, b: backend_triton.tgmm(l, r, b, None, transpose_lhs=True, out_dtype=out_dtype,
                                                     bias_grad=False, config=config),
                 s((m, k), dt), s((m, n), dt), s((groups + 1,), jnp.int32))
    elif op == "masked":
      self.lower(lambda x, w, mm: backend_triton.masked_gmm(x, w, mm, out_dtype=out_dtype, expected_m=None,
                                                            config=config),
                 s((groups, m // groups, k), dt), s((groups, n, k), dt), s((groups,), jnp.int32))
    else:
      transpose = op == "gmm_t"
      self.lower(lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=transpose,
                                                    out_dtype=out_dtype, activation=activation,
                                                    save_preactivation=False, config=config),
                 s((m, k), dt), s((groups, n, k) if transpose else (groups, k, n), dt), s((groups + 1,), jnp.int32))
    for compiled in (_compile._cache[new] for new in set(_compile._cache) - before):
      self.assertBetween(compiled.shared_mem_bytes, 1, 227 * 1024)


# ---------------------------------------------------------------------------------------------------------
# GPU

GPU_DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}
GPU_TOLERANCE = {"bf16": 1e-2, "f16": 3e-3, "f32": 3e-3}  # f32 dots use tf32 tensor cores


@absltest.skipIf(not ON_GPU, "needs a GPU")
class GpuKernelTest(KernelTestBase):

  @parameterized.product(
      (dict(m=1000, k=2880, n=5760), dict(m=777, k=7, n=33), dict(m=513, k=1, n=2880), dict(m=300, k=5760, n=1)),
      dtype=("bf16", "f16", "f32"),
      transpose_rhs=(False, True),
      path=("pointers", "tma", "tma_store"),
  )
  def test_gmm(self, m, k, n, dtype, transpose_rhs, path):
    """The table's config with pointer loads, TMA loads, or TMA loads and stores (Config.tma_store: gmm_kernel,
    not the ws kernel)."""
    groups = 6
    dt = GPU_DTYPES[dtype]
    lhs, rhs = self.normal((m, k), dt), self.normal((groups, n, k) if transpose_rhs else (groups, k, n), dt)
    bounds = self.random_bounds(m, groups)
    config = backend_triton.config_table.select(backend_triton.config_table.make_key(
        "gmm_t" if transpose_rhs else "gmm", np.dtype(dt).name, np.dtype(dt).name, m / groups, k, n, groups,
        transpose=transpose_rhs), arch="sm90").config
    # Both grid sizes without doubling the cases: two programs per SM with rhs transposed.
    config = dataclasses.replace(config, tma=path != "pointers", tma_store=path == "tma_store",
                                 warp_specialized=config.warp_specialized and path != "tma_store",
                                 programs_per_sm=2 if transpose_rhs else 1)
    out = run_gmm(lhs, rhs, bounds, transpose_rhs=transpose_rhs, out_dtype=dt, config=config)
    want = gmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, None, transpose_rhs, None)[0]
    self.assert_close(out, want, GPU_TOLERANCE[dtype])

  @parameterized.product(
      (dict(m=1000, k=2880, n=5760, groups=6), dict(m=777, k=128, n=264, groups=9), dict(m=300, k=72, n=8, groups=3),
       dict(m=50, k=64, n=512, groups=1), dict(m=4096, k=2048, n=1536, groups=16),
       dict(m=700, k=256, n=384, groups=48)),
      dtype=("bf16", "f16"),
      transpose_rhs=(False, True),
  )
  def test_gmm_ws(self, m, k, n, groups, dtype, transpose_rhs):
    """The warp-specialised kernel: random groups with empty ones, rows before and after them (zeros), tiles
    that end inside a group, N not a multiple of the tile, one group; K = 72 runs only with rhs transposed."""
    dt = GPU_DTYPES[dtype]
    lhs, rhs = self.normal((m, k), dt), self.normal((groups, n, k) if transpose_rhs else (groups, k, n), dt)
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True)
    out = run_gmm(lhs, rhs, bounds, transpose_rhs=transpose_rhs, out_dtype=dt, config=config)
    want = gmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, None, transpose_rhs, None)[0]
    self.assert_close(out, want, GPU_TOLERANCE[dtype])
    out = np.asarray(out, np.float32)
    np.testing.assert_array_equal(out[:bounds[0]], 0.0)
    np.testing.assert_array_equal(out[bounds[-1]:], 0.0)

  @parameterized.product(
      (dict(m=1000, k=2880, n=5760, groups=6), dict(m=777, k=128, n=264, groups=9), dict(m=300, k=72, n=8, groups=3),
       dict(m=50, k=64, n=512, groups=1), dict(m=4096, k=2048, n=1536, groups=16),
       dict(m=700, k=256, n=384, groups=48), dict(m=3000, k=128, n=520, groups=2)),
      transpose_rhs=(False, True),
      order=(dict(band_tiles=8, cluster_size=1, block_n=256, num_stages=3),
             dict(band_tiles=3, cluster_size=2, block_n=256, num_stages=3),
             dict(band_tiles=1, cluster_size=2, block_n=128, num_stages=5)),
  )
  def test_gmm_ws_tile_orders_and_clusters(self, m, k, n, groups, transpose_rhs, order):
    """test_gmm_ws's cases (bf16) and two groups of ~12 row tiles in bands of row tiles of a group (8, and 3; the
    last band of a group taking the rest) and on clusters of 2 CTAs (Config.cluster_size; the one-CTA kernel under a
    Triton without Gluon's clusters), 2 x 256 and 2 x 128 columns a cluster: N past the cluster's second tile, a
    cluster whose second tile lies entirely past N."""
    dt = jnp.bfloat16
    lhs, rhs = self.normal((m, k), dt), self.normal((groups, n, k) if transpose_rhs else (groups, k, n), dt)
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=128, block_k=64, num_warps=8, warp_specialized=True, **order)
    out = run_gmm(lhs, rhs, bounds, transpose_rhs=transpose_rhs, out_dtype=dt, config=config)
    want = gmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, None, transpose_rhs, None)[0]
    self.assert_close(out, want, GPU_TOLERANCE["bf16"])
    out = np.asarray(out, np.float32)
    np.testing.assert_array_equal(out[:bounds[0]], 0.0)
    np.testing.assert_array_equal(out[bounds[-1]:], 0.0)

  @parameterized.product(
      (dict(sizes=[0, 200, 1, 0, 250], k=128, n=512), dict(sizes=[1000, 0, 2000, 37, 1200], k=512, n=1280),
       dict(sizes=[1100, 900, 1024, 1030, 1018, 1024, 1000, 1096], k=256, n=2048),
       dict(sizes=[3000, 2000, 1, 3191], k=256, n=1536)),
      kernel=("ws", "gk", "gk_swiglu_bias"),
      transpose_rhs=(False, True),
  )
  def test_tail_split(self, sizes, k, n, kernel, transpose_rhs):
    """Config.tail_split on both persistent kernels, bf16, the table's tiles (128 x 256; 128 x 128 with swiglu): bit
    for bit the same config's output without it (a half sums the same products in the same order), and the oracle's
    within bf16 rounding. On 132 SMs the cases run every tile as halves (a few tiles), a last round of a few tiles
    as halves, and whole rounds only (T a multiple of 132 at 128 x 256); rows before and after the groups, an empty
    group, a group of one row."""
    dt = jnp.bfloat16
    m, groups = sum(sizes) + 100, len(sizes)
    swiglu = kernel == "gk_swiglu_bias"
    width = 2 * n if swiglu else n
    lhs = self.normal((m, k), dt)
    rhs = self.normal((groups, width, k) if transpose_rhs else (groups, k, width), dt)
    bias = self.normal((groups, width), dt) if swiglu else None
    bounds = self.bounds(m, sizes, start=60)
    base = Config(128, 128 if swiglu else 256, 64, 8, 3, warp_specialized=kernel == "ws",  # The table's tiles.
                  band_tiles=8 if kernel == "ws" else 1)
    whole, split = (run_gmm(lhs, rhs, bounds, bias, transpose_rhs=transpose_rhs, out_dtype=dt,
                            activation="swiglu" if swiglu else None, config=dataclasses.replace(base, tail_split=s))
                    for s in (False, True))
    np.testing.assert_array_equal(np.asarray(split, np.float32), np.asarray(whole, np.float32))
    want = gmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None if bias is None else np.float32(bias), None,
                      transpose_rhs, "swiglu" if swiglu else None)[0]
    self.assert_close(split, want, GPU_TOLERANCE["bf16"])

  @parameterized.product(activation=ACTIVATIONS, dtype=("bf16", "f32"))
  def test_gmm_epilogue(self, activation, dtype):
    m, k, n, groups = 1200, 512, 768, 8
    dt = GPU_DTYPES[dtype]
    lhs, rhs, bias = self.normal((m, k), dt), self.normal((groups, k, n), dt), self.normal((groups, n), dt)
    n_out = n // 2 if activation == "swiglu" else n
    existing = self.normal((m, n_out), dt)
    bounds = self.random_bounds(m, groups)
    out, h = run_gmm(lhs, rhs, bounds, bias, existing, out_dtype=dt, activation=activation,
                     save_preactivation=True, config=None)
    want_out, want_h = gmm_oracle(np.float32(lhs), np.float32(rhs), bounds, np.float32(bias),
                                  np.float32(existing), False, activation)
    self.assert_close(out, want_out, GPU_TOLERANCE[dtype], "out")
    self.assert_close(h, want_h, GPU_TOLERANCE[dtype], "h")

  @parameterized.product(
      (dict(m=1000, k=2880, n=5760), dict(m=777, k=7, n=33), dict(m=600, k=1, n=2880)),
      dtype=("bf16", "f16", "f32"),
      transpose_lhs=(False, True),
      programs_per_sm=(None, 1, 2),  # None: one program per tile.
  )
  def test_tgmm(self, m, k, n, dtype, transpose_lhs, programs_per_sm):
    groups = 5
    dt = GPU_DTYPES[dtype]
    lhs, rhs = self.normal((m, k) if transpose_lhs else (k, m), dt), self.normal((m, n), dt)
    bounds = self.bounds(m, [0, *self.rng.multinomial(m - 10, np.full(groups - 1, 1 / (groups - 1)))], start=4)
    config = backend_triton.config_table.select(backend_triton.config_table.make_key(
        "tgmm", np.dtype(dt).name, "float32", m / groups, k, n, groups, transpose=transpose_lhs, bias=True),
        arch="sm90").config
    config = dataclasses.replace(config, persistent=programs_per_sm is not None, programs_per_sm=programs_per_sm or 1)
    out, dbias = run_tgmm(lhs, rhs, bounds, transpose_lhs=transpose_lhs, out_dtype=jnp.float32, bias_grad=True,
                          config=config)
    want, want_dbias = tgmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, transpose_lhs)
    self.assert_close(out, want, GPU_TOLERANCE[dtype], "out")
    self.assert_close(dbias, want_dbias, 1e-5, "dbias")
    np.testing.assert_array_equal(out[0], 0.0)

  @parameterized.product(
      (dict(m=1000, k=2880, n=5760, groups=6), dict(m=777, k=136, n=264, groups=9), dict(m=300, k=72, n=8, groups=3),
       dict(m=50, k=64, n=512, groups=1), dict(m=4096, k=2048, n=1536, groups=16),
       dict(m=700, k=256, n=384, groups=48)),
      (dict(dtype="bf16", bias_grad=False), dict(dtype="f16", bias_grad=False), dict(dtype="bf16", bias_grad=True)),
      tile=(dict(block_n=256, num_stages=3, block_k=64), dict(block_n=128, num_stages=5, block_k=64),
            dict(block_n=256, num_stages=6, block_k=32, band_tiles=3)),
  )
  def test_tgmm_ws(self, m, k, n, groups, dtype, bias_grad, tile):
    """The warp-specialised tgmm: random groups with empty ones and rows before and after them, groups ending
    inside a step (their last step's rows past the group zeroed), groups of one step (48 groups of ~14 rows), K
    tiles of one consumer's half (K = 2880, 136, 72), N not a multiple of the tile, one group; tiles in bands of 3
    K tiles (the last band shorter at K = 2880 and 2048, wider than the group's K tiles at K <= 256); the bias gradient
    (column sums of rhs per group, consumer 0's on K tile 0) with rows outside the groups set to NaN in rhs: it
    selects them out, so they must not reach it (test_tgmm_ws_rows_outside_groups checks the product)."""
    dt = GPU_DTYPES[dtype]
    lhs, rhs = self.normal((m, k), dt), self.normal((m, n), dt)
    bounds = self.random_bounds(m, groups)
    config = Config(block_m=128, num_warps=8, warp_specialized=True, **tile)
    want, want_dbias = tgmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, True)
    got = run_tgmm(lhs, rhs, bounds, transpose_lhs=True, out_dtype=dt, bias_grad=bias_grad, config=config)
    out = got[0] if bias_grad else got
    self.assert_close(out, want, GPU_TOLERANCE[dtype])
    out = np.asarray(out, np.float32)
    for g in np.flatnonzero(np.diff(bounds) == 0):
      np.testing.assert_array_equal(out[g], 0.0)
    if bias_grad:
      self.assert_close(got[1], want_dbias, 1e-5, "dbias")
      np.testing.assert_array_equal(np.asarray(got[1])[np.diff(bounds) == 0], 0.0)
      outside = np.r_[:bounds[0], bounds[-1]:m]
      _, dbias = run_tgmm(lhs, rhs.at[outside].set(np.nan), bounds, transpose_lhs=True, out_dtype=dt, bias_grad=True,
                          config=config)
      self.assert_close(dbias, want_dbias, 1e-5, "dbias, NaN outside the groups")

  @parameterized.product(
      sizes=(dict(start=0, sizes=[10, 5, 0, 70, 200, 64, 1]),  # short groups at both ends
             dict(start=37, sizes=[20, 100, 3, 129]),  # rows before the groups, a short first group
             dict(start=0, sizes=[40]),  # fewer rows than a step, from row 0 (steps from row 40 - block_k)
             dict(start=0, sizes=[600])),  # every row in one group
      bias_grad=(False, True),
      block_k=(64, 32),
  )
  def test_tgmm_ws_rows_outside_groups(self, sizes, bias_grad, block_k):
    """tgmm_ws's steps near the groups' end read the block_k rows that end there (from a negative row where the groups
    start at row 0 and hold fewer): rows outside the groups (inf, -inf and NaN in both operands) must not reach the
    gradient or the bias gradient. The other groups' rows a step reads (zeroed in lhs) hold finite values here (an
    inf there reaches the group: tgmm_ws's documented limit)."""
    m, k, n = 600, 136, 264
    lhs, rhs = self.normal((m, k), jnp.bfloat16), self.normal((m, n), jnp.bfloat16)
    bounds = self.bounds(m, sizes["sizes"], start=sizes["start"])
    want, want_dbias = tgmm_oracle(np.float32(lhs), np.float32(rhs), bounds, None, True)
    outside = np.r_[:bounds[0], bounds[-1]:m]
    poison = np.resize(np.array([np.inf, -np.inf, np.nan], jnp.bfloat16), len(outside))[:, None]
    config = Config(block_m=128, block_n=128, block_k=block_k, num_warps=8, num_stages=4, warp_specialized=True)
    got = run_tgmm(lhs.at[outside].set(poison), rhs.at[outside].set(poison[::-1]), bounds, transpose_lhs=True,
                   out_dtype=jnp.bfloat16, bias_grad=bias_grad, config=config)
    self.assert_close(got[0] if bias_grad else got, want, GPU_TOLERANCE["bf16"])
    if bias_grad:
      self.assert_close(got[1], want_dbias, 1e-5, "dbias")

  @parameterized.parameters("bf16", "f16", "f32")
  def test_masked(self, dtype):
    dt = GPU_DTYPES[dtype]
    groups, max_m, k, n = 6, 300, 2880, 1000
    x, w = self.normal((groups, max_m, k), dt), self.normal((groups, n, k), dt)
    masked_m = np.array([0, max_m, 1, 63, 64, 200], np.int32)
    out = run_masked(x, w, masked_m, out_dtype=dt, config=None)
    self.assert_close(out, masked_oracle(np.float32(x), np.float32(w), masked_m), GPU_TOLERANCE[dtype])

  def test_offsets_past_int32(self):
    """out (M, N) with M * N > 2^31: the last rows' offsets need int64."""
    k, n, groups = 16, 5760, 2
    m = 2**31 // n + 1000
    lhs, rhs = self.normal((m, k), jnp.bfloat16), self.normal((groups, k, n), jnp.bfloat16)
    bounds = np.array([0, m // 2, m - 3], np.int32)
    rows = np.array([0, m // 2 - 1, m // 2, m - 4, m - 3, m - 1])
    want = np.zeros((len(rows), n))
    lhs_rows = np.float64(np.asarray(lhs[rows], np.float32))
    rhs64 = np.float64(np.asarray(rhs, np.float32))
    for i, r in enumerate(rows):
      g = np.searchsorted(bounds, r, side="right") - 1
      if g < groups:
        want[i] = lhs_rows[i] @ rhs64[g]
    for tma, ws in ((True, False), (False, False), (True, True)):
      config = Config(block_m=128, block_n=128, block_k=16, num_warps=8, tma=tma, warp_specialized=ws)
      got = np.asarray(run_gmm(lhs, rhs, bounds, out_dtype=jnp.bfloat16, config=config)[rows], np.float32)
      self.assertLess(rel_err(got, want), 1e-2, f"tma={tma} warp_specialized={ws}")
      np.testing.assert_array_equal(got[-2:], 0.0)


if __name__ == "__main__":
  absltest.main()
