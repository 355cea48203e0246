"""jgmm under shard_map (expert sharding with group_offset), pmap and NamedSharding jit, on 8 CPU devices.

Run through pytest: tests/conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax
starts. Every result is checked against the float64 oracle on fresh random inputs.
"""
import functools
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jgmm
from jgmm import oracle

try:
  shard_map = jax.shard_map
except AttributeError:  # jax without the top-level alias.
  from jax.experimental.shard_map import shard_map

NUM_DEVICES = 8
M, K, N = 70, 12, 20  # M not a multiple of 8 or of any tile.
G_TOTAL = 16
G_LOCAL = G_TOTAL // NUM_DEVICES
TOL = 2e-5


def _sizes(rng, num_groups, m, kind):
  """(num_groups,) int32 group sizes: uniform, with empty groups, summing below m, or over m."""
  if kind == "uniform":
    return rng.multinomial(m, np.full(num_groups, 1.0 / num_groups)).astype(np.int32)
  if kind == "zeros":
    p = rng.dirichlet(np.ones(num_groups)) * (rng.random(num_groups) < 0.5)
    p[rng.integers(num_groups)] += 0.1
    return rng.multinomial(m, p / p.sum()).astype(np.int32)
  if kind == "sum_less":
    return rng.multinomial(m - 13, rng.dirichlet(np.ones(num_groups))).astype(np.int32)
  if kind == "sum_more":
    sizes = rng.multinomial(m + 9, rng.dirichlet(np.ones(num_groups))).astype(np.int32)
    sizes[rng.integers(num_groups)] = -5
    return sizes
  raise ValueError(kind)


def _normal(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape), jnp.float32)


SIZE_KINDS = [("uniform", "uniform", 0), ("zeros", "zeros", 1), ("sum_less", "sum_less", 2),
              ("sum_more", "sum_more", 3)]
# check_vma=True is shard_map's default; check_vma=False is the escape hatch.
SIZE_KINDS_VMA = [(f"{name}_check_vma_{vma}", kind, seed, vma)
                  for name, kind, seed in SIZE_KINDS for vma in (True, False)]


class ShardingTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.device_count() < NUM_DEVICES:
      self.skipTest(f"needs {NUM_DEVICES} devices, found {jax.device_count()}: run under pytest (tests/conftest.py "
                    f"sets XLA_FLAGS=--xla_force_host_platform_device_count={NUM_DEVICES}) or set that flag")
    self.mesh = Mesh(np.array(jax.devices()[:NUM_DEVICES]), ("expert",))

  def assert_close(self, actual, expected, what):
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, TOL, f"{what}: rel_err {err:.3g}")

  def _expert_sharded_gmm(self, check_vma, **options):
    """gmm over G_TOTAL groups, rhs sharded over experts; each device computes its G_LOCAL groups."""
    def local(lhs, rhs_local, group_sizes):
      offset = lax.axis_index("expert") * G_LOCAL
      return lax.psum(jgmm.gmm(lhs, rhs_local, group_sizes, group_offset=offset, **options), "expert")
    return jax.jit(shard_map(local, mesh=self.mesh, in_specs=(P(), P("expert"), P()), out_specs=P(),
                             check_vma=check_vma))

  # (a) shard_map expert sharding.
  @parameterized.named_parameters(SIZE_KINDS_VMA)
  def test_shard_map_gmm_expert_sharding(self, kind, seed, check_vma):
    rng = np.random.default_rng(100 + seed)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G_TOTAL, K, N), _sizes(rng, G_TOTAL, M, kind)
    out = self._expert_sharded_gmm(check_vma)(lhs, rhs, jnp.asarray(sizes))
    self.assert_close(out, oracle.gmm(lhs, rhs, sizes), f"gmm sizes={sizes}")

  @parameterized.named_parameters(SIZE_KINDS_VMA)
  def test_shard_map_tgmm_expert_sharding(self, kind, seed, check_vma):
    rng = np.random.default_rng(200 + seed)
    lhs, rhs, sizes = _normal(rng, K, M), _normal(rng, M, N), _sizes(rng, G_TOTAL, M, kind)

    def local(lhs, rhs, group_sizes):
      offset = lax.axis_index("expert") * G_LOCAL
      return jgmm.tgmm(lhs, rhs, group_sizes, group_offset=offset, num_actual_groups=G_LOCAL, bias_grad=True)

    sharded = jax.jit(shard_map(local, mesh=self.mesh, in_specs=(P(), P(), P()),
                                out_specs=(P("expert"), P("expert")), check_vma=check_vma))
    out, dbias = sharded(lhs, rhs, jnp.asarray(sizes))
    expected, expected_dbias = oracle.tgmm(lhs, rhs, sizes)
    self.assertEqual(out.shape, (G_TOTAL, K, N))
    self.assert_close(out, expected, f"tgmm sizes={sizes}")
    self.assert_close(dbias, expected_dbias, f"tgmm dbias sizes={sizes}")

  # (d) grad through the shard_map version.
  @parameterized.named_parameters(SIZE_KINDS_VMA)
  def test_shard_map_gmm_grad(self, kind, seed, check_vma):
    self._check_shard_map_gmm_grad(kind, seed, check_vma)

  def _check_shard_map_gmm_grad(self, kind, seed, check_vma, **options):
    rng = np.random.default_rng(300 + seed)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G_TOTAL, K, N), _sizes(rng, G_TOTAL, M, kind)
    cotangent = _normal(rng, M, N)
    sharded = self._expert_sharded_gmm(check_vma, **options)
    loss = lambda f: lambda lhs, rhs: jnp.sum(f(lhs, rhs, jnp.asarray(sizes)) * cotangent)
    dlhs, drhs = jax.jit(jax.grad(loss(sharded), argnums=(0, 1)))(lhs, rhs)
    ref_dlhs, ref_drhs = jax.grad(loss(jgmm.gmm), argnums=(0, 1))(lhs, rhs)
    # d/dlhs = cotangent rows of g @ rhs[g]^T; d/drhs[g] = lhs rows of g ^T @ cotangent rows of g.
    expected_dlhs = oracle.gmm(cotangent, rhs, sizes, transpose_rhs=True)
    expected_drhs = oracle.tgmm(lhs, cotangent, sizes, transpose_lhs=True)[0]
    self.assert_close(ref_dlhs, expected_dlhs, "unsharded dlhs")
    self.assert_close(ref_drhs, expected_drhs, "unsharded drhs")
    self.assert_close(dlhs, expected_dlhs, "shard_map dlhs")
    self.assert_close(drhs, expected_drhs, "shard_map drhs")
    np.testing.assert_allclose(dlhs, ref_dlhs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(drhs, ref_drhs, rtol=1e-5, atol=1e-5)

  def test_shard_map_gmm_grad_triton(self):
    """The Triton kernels (interpreted on the CPU: TRITON_INTERPRET=1) under shard_map, forward and backward."""
    if jax.devices()[0].platform == "cpu":
      self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    config = jgmm.Config(block_m=16, block_n=16, block_k=16, num_warps=1)
    self._check_shard_map_gmm_grad("uniform", 5, True, backend="triton", config=config)

  # (b) pmap over a batch of independent problems.
  def test_pmap_gmm(self):
    rng = np.random.default_rng(400)
    lhs, rhs = _normal(rng, NUM_DEVICES, M, K), _normal(rng, NUM_DEVICES, 4, K, N)
    sizes = np.stack([_sizes(rng, 4, M, kind) for kind, *_ in SIZE_KINDS * 2])
    bias = _normal(rng, NUM_DEVICES, 4, N)
    out = jax.pmap(lambda l, r, s, b: jgmm.gmm(l, r, s, bias=b))(lhs, rhs, jnp.asarray(sizes), bias)
    for i in range(NUM_DEVICES):
      self.assert_close(out[i], oracle.gmm(lhs[i], rhs[i], sizes[i], bias=bias[i]), f"problem {i}")

  def test_pmap_tgmm(self):
    rng = np.random.default_rng(401)
    lhs, rhs = _normal(rng, NUM_DEVICES, M, K), _normal(rng, NUM_DEVICES, M, N)
    sizes = np.stack([_sizes(rng, 4, M, kind) for kind, *_ in SIZE_KINDS * 2])
    out = jax.pmap(functools.partial(jgmm.tgmm, transpose_lhs=True))(lhs, rhs, jnp.asarray(sizes))
    for i in range(NUM_DEVICES):
      self.assert_close(out[i], oracle.tgmm(lhs[i], rhs[i], sizes[i], transpose_lhs=True)[0], f"problem {i}")

  def test_pmap_masked_gmm(self):
    rng = np.random.default_rng(402)
    x, w = _normal(rng, NUM_DEVICES, 3, 9, K), _normal(rng, NUM_DEVICES, 3, N, K)
    masked_m = rng.integers(-2, 12, (NUM_DEVICES, 3)).astype(np.int32)
    out = jax.pmap(jgmm.masked_gmm)(x, w, jnp.asarray(masked_m))
    for i in range(NUM_DEVICES):
      self.assert_close(out[i], oracle.masked_gmm(x[i], w[i], masked_m[i]), f"problem {i}")

  def test_pmap_gmm_grad(self):
    rng = np.random.default_rng(403)
    lhs, rhs = _normal(rng, NUM_DEVICES, M, K), _normal(rng, NUM_DEVICES, 4, K, N)
    sizes = np.stack([_sizes(rng, 4, M, kind) for kind, *_ in SIZE_KINDS * 2])
    cotangent = _normal(rng, NUM_DEVICES, M, N)
    grad = jax.grad(lambda l, r, s, c: jnp.sum(jgmm.gmm(l, r, s) * c), argnums=(0, 1))
    dlhs, drhs = jax.pmap(grad)(lhs, rhs, jnp.asarray(sizes), cotangent)
    for i in range(NUM_DEVICES):
      self.assert_close(dlhs[i], oracle.gmm(cotangent[i], rhs[i], sizes[i], transpose_rhs=True), f"dlhs {i}")
      self.assert_close(drhs[i], oracle.tgmm(lhs[i], cotangent[i], sizes[i], transpose_lhs=True)[0], f"drhs {i}")

  # (c) jit on inputs sharded by NamedSharding.
  @parameterized.named_parameters(SIZE_KINDS)
  def test_jit_named_sharding_gmm(self, kind, seed):
    rng = np.random.default_rng(500 + seed)
    m = 72  # Rows divisible by the 8 devices.
    lhs, rhs, sizes = _normal(rng, m, K), _normal(rng, G_TOTAL, K, N), _sizes(rng, G_TOTAL, m, kind)
    rows, replicated = NamedSharding(self.mesh, P("expert", None)), NamedSharding(self.mesh, P())
    lhs_sharded = jax.device_put(lhs, rows)
    rhs_replicated = jax.device_put(rhs, replicated)
    sizes_replicated = jax.device_put(jnp.asarray(sizes), replicated)
    out = jax.jit(jgmm.gmm)(lhs_sharded, rhs_replicated, sizes_replicated)
    self.assert_close(out, oracle.gmm(lhs, rhs, sizes), f"gmm sizes={sizes}")
    out_rows = jax.jit(jgmm.gmm, out_shardings=rows)(lhs_sharded, rhs_replicated, sizes_replicated)
    self.assertEqual(out_rows.sharding, rows)
    self.assert_close(out_rows, oracle.gmm(lhs, rhs, sizes), f"gmm row-sharded output sizes={sizes}")

  @parameterized.named_parameters(SIZE_KINDS)
  def test_jit_named_sharding_tgmm(self, kind, seed):
    rng = np.random.default_rng(600 + seed)
    m = 72
    lhs, rhs, sizes = _normal(rng, m, K), _normal(rng, m, N), _sizes(rng, G_TOTAL, m, kind)
    rows, replicated = NamedSharding(self.mesh, P("expert", None)), NamedSharding(self.mesh, P())
    out = jax.jit(functools.partial(jgmm.tgmm, transpose_lhs=True))(
        jax.device_put(lhs, rows), jax.device_put(rhs, rows), jax.device_put(jnp.asarray(sizes), replicated))
    self.assert_close(out, oracle.tgmm(lhs, rhs, sizes, transpose_lhs=True)[0], f"tgmm sizes={sizes}")


if __name__ == "__main__":
  absltest.main()
