"""Seeded random fuzz of gmm, tgmm, masked_gmm and ragged_dot against the float64 oracle.

backend="xla" everywhere, and backend="triton" on a GPU (the interpreter is too slow for thousands of cases).

Shapes are fixed per variant, so each variant compiles once; group_sizes, group_offset and masked_m are
runtime values drawn adversarially (uniform, skewed, zero groups, all zero, one-hot, sum < M, sum > M,
negative, 2**31 - 1, int32 extremes; offsets negative or past G_total), in an integer dtype drawn per case
(int8 .. uint32, values saturated into its range as a caller's would be; M > 127 so that an int8 clip bound
would wrap). Every case draws fresh data from
np.random.default_rng(seed); a failure prints the seed, and `_run_case(variant, seed)` reproduces it.
"""
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import jgmm
from jgmm import oracle

INT32_MAX = 2**31 - 1
INT32_MIN = -2**31
M, K, N = 131, 19, 33  # Not multiples of any tile; M past int8's range.
G_TOTAL, G_LOCAL = 12, 5
MAX_M = 133  # masked_gmm rows per group, past int8's range.
INT_DTYPES = (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)
CASES_PER_VARIANT = 200
SIZE_KINDS = ("uniform", "skewed", "zeros", "all_zero", "one_hot", "sum_less", "sum_more", "negative", "huge",
              "extremes")


def _group_sizes(kind, num_groups, m, rng):
  """(num_groups,) int32 group sizes of the given kind."""
  spread = rng.dirichlet(np.full(num_groups, 1.0))
  if kind == "uniform":
    sizes = rng.multinomial(m, np.full(num_groups, 1.0 / num_groups))
  elif kind == "skewed":
    sizes = rng.multinomial(m, rng.dirichlet(np.full(num_groups, 0.1)))
  elif kind == "zeros":
    keep = rng.random(num_groups) < 0.4
    keep[rng.integers(num_groups)] = True
    sizes = rng.multinomial(m, np.where(keep, spread, 0.0) / np.where(keep, spread, 0.0).sum())
  elif kind == "all_zero":
    sizes = np.zeros(num_groups, np.int64)
  elif kind == "one_hot":
    sizes = np.zeros(num_groups, np.int64)
    sizes[rng.integers(num_groups)] = m
  elif kind == "sum_less":
    sizes = rng.multinomial(rng.integers(0, m), spread)
  elif kind == "sum_more":
    sizes = rng.multinomial(m + rng.integers(1, 3 * m), spread)
  elif kind == "negative":
    sizes = rng.multinomial(m, spread)
    negative = rng.random(num_groups) < 0.4
    sizes[negative] = -rng.integers(1, INT32_MAX, negative.sum(), endpoint=True)
  elif kind == "huge":
    sizes = rng.multinomial(m, spread)
    sizes[rng.random(num_groups) < 0.3] = INT32_MAX
  elif kind == "extremes":
    sizes = rng.choice([INT32_MIN, -1, 0, 1, m - 1, m, m + 1, INT32_MAX], num_groups)
  else:
    raise ValueError(kind)
  return np.asarray(sizes, np.int32)


def _group_offset(rng, total):
  """A group offset in [-3, total + 3], sometimes an int32 extreme."""
  if rng.random() < 0.1:
    return np.int32(rng.choice([INT32_MIN, INT32_MAX]))
  return np.int32(rng.integers(-3, total + 4))


def _in_dtype(values, dtype):
  """Integer values saturated into dtype's range and cast to it (what a caller holding them in dtype has)."""
  info = np.iinfo(dtype)
  return np.clip(np.asarray(values, np.int64), info.min, info.max).astype(dtype)


def _normal(rng, shape, dtype):
  """Fresh standard-normal data, rounded to dtype; returned as (jax array, the rounded float64 values)."""
  x = jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
  return x, oracle.f64(x)


def _covered_rows(ranges, m):
  covered = np.zeros(m, bool)
  for start, end in ranges:
    covered[start:end] = True
  return covered


# Variants: name -> (op, static keyword arguments, flags for the runtime inputs). Flags: "bias",
# "existing_out", "offset" (group_offset with G_LOCAL local groups), "bf16", "one_group" (G_total = 1).
VARIANTS = {
    "gmm": ("gmm", {}, ()),
    "gmm_bias": ("gmm", {}, ("bias",)),
    "gmm_transpose_rhs": ("gmm", {"transpose_rhs": True}, ()),
    "gmm_existing_out": ("gmm", {}, ("existing_out",)),
    "gmm_offset": ("gmm", {}, ("offset",)),
    "gmm_offset_bias_transpose_existing_out": ("gmm", {"transpose_rhs": True}, ("offset", "bias", "existing_out")),
    "gmm_bf16": ("gmm", {}, ("bf16", "bias")),
    "gmm_one_group": ("gmm", {}, ("one_group", "bias")),
    "ragged_dot": ("ragged_dot", {}, ()),
    "tgmm": ("tgmm", {}, ()),
    "tgmm_transpose_lhs": ("tgmm", {"transpose_lhs": True}, ()),
    "tgmm_bias_grad": ("tgmm", {"bias_grad": True}, ()),
    "tgmm_existing_out": ("tgmm", {"transpose_lhs": True}, ("existing_out",)),
    "tgmm_offset_num_actual_groups": ("tgmm", {"num_actual_groups": G_LOCAL, "bias_grad": True}, ("offset",)),
    "tgmm_one_group": ("tgmm", {"bias_grad": True}, ("one_group",)),
    "masked_gmm": ("masked_gmm", {}, ()),
}


ON_GPU = jax.default_backend() == "gpu"
# The Triton kernels are fuzzed too where they run for real. Their float32 products use TF32 tensor cores.
BACKENDS = ("xla", "triton") if ON_GPU else ("xla",)


@functools.cache
def _compiled(variant, backend):
  op, static, _ = VARIANTS[variant]
  if op == "ragged_dot":  # No backend argument: the default (Triton on a GPU).
    return jax.jit(jgmm.ragged_dot)
  return jax.jit(functools.partial(getattr(jgmm, op), backend=backend, **static))


def _run_case(variant, seed, backend="xla"):
  """Runs one case; returns a list of failure descriptions (empty when it matches the oracle)."""
  op, static, flags = VARIANTS[variant]
  rng = np.random.default_rng(seed)
  kind = SIZE_KINDS[seed % len(SIZE_KINDS)]
  int_dtype = INT_DTYPES[rng.integers(len(INT_DTYPES))]
  dtype = jnp.bfloat16 if "bf16" in flags else jnp.float32
  uses_triton = ON_GPU and (backend == "triton" or op == "ragged_dot")
  tolerance = 1e-2 if "bf16" in flags else 2e-3 if uses_triton else 2e-5
  g_total = 1 if "one_group" in flags else G_TOTAL
  fn = _compiled(variant, backend)
  failures = []

  def check(name, actual, expected, exact_mask=None):
    err = oracle.rel_err(actual, expected)
    if not err < tolerance:
      failures.append(f"{name}: rel_err {err:.3g} >= {tolerance}")
    if exact_mask is not None and exact_mask.any():
      diff = np.abs(oracle.f64(actual) - expected)[exact_mask]
      if diff.max() != 0:
        failures.append(f"{name}: elements outside the computed groups differ by up to {diff.max():.3g}")

  if op in ("gmm", "ragged_dot"):
    offset = _in_dtype(_group_offset(rng, G_TOTAL), int_dtype) if "offset" in flags else None
    num_groups = G_LOCAL if "offset" in flags else g_total
    sizes = _in_dtype(_group_sizes(kind, g_total, M, rng), int_dtype)
    lhs, lhs64 = _normal(rng, (M, K), dtype)
    transpose = static.get("transpose_rhs", False)
    rhs, rhs64 = _normal(rng, (num_groups, N, K) if transpose else (num_groups, K, N), dtype)
    kwargs, expect_kwargs = {}, {}
    if "bias" in flags:
      kwargs["bias"], expect_kwargs["bias"] = _normal(rng, (num_groups, N), dtype)
    if "existing_out" in flags:
      kwargs["existing_out"], expect_kwargs["existing_out"] = _normal(rng, (M, N), dtype)
    if offset is not None:
      kwargs["group_offset"] = expect_kwargs["group_offset"] = offset
    out = fn(lhs, rhs, jnp.asarray(sizes), **kwargs)
    expected = oracle.gmm(lhs64, rhs64, sizes, transpose_rhs=transpose, **expect_kwargs)
    covered = _covered_rows(oracle.row_ranges(sizes, M, offset, num_groups), M)
    check("out", out, expected, np.broadcast_to(~covered[:, None], expected.shape))
  elif op == "tgmm":
    offset = _in_dtype(_group_offset(rng, G_TOTAL), int_dtype) if "offset" in flags else None
    num_groups = static.get("num_actual_groups", g_total)
    sizes = _in_dtype(_group_sizes(kind, g_total, M, rng), int_dtype)
    transpose = static.get("transpose_lhs", False)
    lhs, lhs64 = _normal(rng, (M, K) if transpose else (K, M), dtype)
    rhs, rhs64 = _normal(rng, (M, N), dtype)
    kwargs, expect_kwargs = {}, {}
    if "existing_out" in flags:
      kwargs["existing_out"], expect_kwargs["existing_out"] = _normal(rng, (num_groups, K, N), dtype)
    if offset is not None:
      kwargs["group_offset"] = expect_kwargs["group_offset"] = offset
    outs = fn(lhs, rhs, jnp.asarray(sizes), **kwargs)
    expected, expected_dbias = oracle.tgmm(lhs64, rhs64, sizes, transpose_lhs=transpose,
                                           num_actual_groups=static.get("num_actual_groups"), **expect_kwargs)
    empty = np.array([start == end for start, end in oracle.row_ranges(sizes, M, offset, num_groups)])
    out = outs[0] if static.get("bias_grad") else outs
    check("out", out, expected, np.broadcast_to(empty[:, None, None], expected.shape))
    if static.get("bias_grad"):
      if outs[1].dtype != jnp.float32:
        failures.append(f"dbias dtype {outs[1].dtype}, expected float32")
      check("dbias", outs[1], expected_dbias, np.broadcast_to(empty[:, None], expected_dbias.shape))
  else:  # masked_gmm
    num_groups = 6
    masked_m = rng.integers(-4, MAX_M + 5, num_groups)
    masked_m[rng.random(num_groups) < 0.15] = rng.choice([INT32_MIN, 0, MAX_M, INT32_MAX])
    masked_m = _in_dtype(masked_m, int_dtype)
    x, x64 = _normal(rng, (num_groups, MAX_M, K), dtype)
    w, w64 = _normal(rng, (num_groups, N, K), dtype)
    out = fn(x, w, jnp.asarray(masked_m))
    expected = oracle.masked_gmm(x64, w64, masked_m)
    invalid_rows = np.arange(MAX_M)[None, :] >= np.clip(masked_m, 0, MAX_M)[:, None]
    check("out", out, expected, np.broadcast_to(invalid_rows[:, :, None], expected.shape))
  return [f"variant={variant} backend={backend} seed={seed} kind={kind} sizes dtype={np.dtype(int_dtype).name}: {f}"
          for f in failures]


class FuzzTest(parameterized.TestCase):

  @parameterized.named_parameters((f"{name}_{backend}", name, backend) for name in VARIANTS for backend in BACKENDS)
  def test_against_oracle(self, variant, backend):
    first_seed = zlib.crc32(variant.encode()) % 1_000_000 * 1_000
    failures = []
    for seed in range(first_seed, first_seed + CASES_PER_VARIANT):
      failures += _run_case(variant, seed, backend)
    self.assertEmpty(failures, f"{len(failures)} failures; reproduce one with "
                               f"_run_case({variant!r}, seed, {backend!r}). First ones:\n" + "\n".join(failures[:10]))


if __name__ == "__main__":
  absltest.main()
