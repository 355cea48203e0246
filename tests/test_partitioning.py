"""jit of jgmm's ops on sharded inputs (8 emulated CPU devices): Explicit, Auto and mixed meshes.

Each case places the operands with NamedShardings, checks the result against the float64 oracle, checks the
result's sharding against the documented rule (jgmm/partitioning.py), and checks the compiled HLO: no
all-gather where the rule keeps every sharded factor, and an all-reduce where shards' parts are summed.
"""
import functools
import math
import os
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jgmm
# The Triton kernels imported (decorated) outside the interpreter, which one test turns on, so they also compile.
from jgmm import backend_triton, oracle, partitioning, primitives, quantize  # noqa: F401

NUM_DEVICES = 8
M, K, N, G = 72, 16, 24, 8
TOL = 2e-5
EXPLICIT, AUTO = AxisType.Explicit, AxisType.Auto
# name, mesh shape, axis names, axis types. "mixed" shards one factor over an Explicit axis, another over an Auto.
MESHES = {"explicit": ((8,), ("d",), (EXPLICIT,)), "auto": ((8,), ("d",), (AUTO,)),
          "mixed": ((4, 2), ("d", "a"), (EXPLICIT, AUTO))}


def _normal(rng, *shape):
  return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def _sizes(rng, num_groups, m):
  """Random group sizes with an empty group, summing to less than m."""
  sizes = rng.multinomial(m - 5, rng.dirichlet(np.ones(num_groups))).astype(np.int32)
  sizes[rng.integers(num_groups)] = 0
  return jnp.asarray(sizes)


class PartitioningTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.device_count() < NUM_DEVICES:
      self.skipTest(f"needs {NUM_DEVICES} devices: run under pytest (tests/conftest.py sets XLA_FLAGS)")

  def _mesh(self, kind):
    shape, names, types = MESHES[kind]
    return jax.make_mesh(shape, names, axis_types=types, devices=jax.devices()[:math.prod(shape)])

  def _run(self, kind, fn, args, specs, expected, out_specs, gathers=False, reduces=None):
    """jit(fn)(*args placed by specs) vs expected; the results' specs; all-gather/all-reduce in the compiled HLO."""
    mesh = self._mesh(kind)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    jitted = jax.jit(fn)
    with jax.set_mesh(mesh):
      outs = jitted(*placed)
      hlo = jitted.lower(*placed).compile().as_text()
    for i, (out, want, spec) in enumerate(zip(jax.tree.leaves(outs), expected, out_specs)):
      err = oracle.rel_err(out, want)
      self.assertLess(err, TOL, f"result {i}: rel_err {err:.3g}")
      if spec is None:  # Left to the Auto partitioner.
        continue
      self.assertTrue(out.sharding.is_equivalent_to(NamedSharding(mesh, spec), out.ndim),
                      f"result {i}'s sharding: {out.sharding.spec}, expected {spec}")
    if not gathers:
      self.assertNotIn("all-gather", hlo)
    if reduces is not None:
      self.assertEqual("all-reduce" in hlo, reduces)

  @parameterized.parameters(*MESHES)
  def test_gmm_rows(self, kind):
    rng = np.random.default_rng(1)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M)
    self._run(kind, jgmm.gmm, (lhs, rhs, sizes), (P("d"), P(), P()), [oracle.gmm(lhs, rhs, sizes)],
              [P("d")], reduces=False)

  @parameterized.parameters(*MESHES)
  def test_gmm_columns(self, kind):
    rng = np.random.default_rng(2)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, N, K), _sizes(rng, G, M)
    gmm = functools.partial(jgmm.gmm, transpose_rhs=True)
    self._run(kind, gmm, (lhs, rhs, sizes), (P(), P(None, "d"), P()),
              [oracle.gmm(lhs, rhs, sizes, transpose_rhs=True)], [P(None, "d")], reduces=False)

  def test_gmm_rows_and_columns(self):
    """Rows over the Explicit axis, columns over the Auto one: the result is sharded over both (typed by the first)."""
    rng = np.random.default_rng(3)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M)
    self._run("mixed", jgmm.gmm, (lhs, rhs, sizes), (P("d"), P(None, None, "a"), P()),
              [oracle.gmm(lhs, rhs, sizes)], [P("d", "a")], reduces=False)

  @parameterized.parameters(*MESHES)
  def test_gmm_groups_summed(self, kind):
    """rhs sharded over groups: each shard computes its groups' rows, an all-reduce sums them."""
    rng = np.random.default_rng(4)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M)
    bias, existing = _normal(rng, G, N), _normal(rng, M, N)
    gmm = lambda l, r, s, b, e: jgmm.gmm(l, r, s, bias=b, existing_out=e, activation="gelu")
    expected = oracle.gmm(lhs, rhs, sizes, bias=bias, existing_out=existing, activation_name="gelu")
    self._run(kind, gmm, (lhs, rhs, sizes, bias, existing), (P(), P("d"), P(), P("d"), P()), [expected], [P()],
              reduces=True)

  @parameterized.parameters(*MESHES)
  def test_gmm_rows_options(self, kind):
    """Rows sharded with bias, an activation, existing_out and a group offset (rhs holds 6 of 10 groups)."""
    rng = np.random.default_rng(5)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, 6, K, N), _sizes(rng, 10, M)
    bias, existing = _normal(rng, 6, N), _normal(rng, M, N)
    gmm = lambda l, r, s, b, e: jgmm.gmm(l, r, s, bias=b, existing_out=e, activation="silu", group_offset=3)
    expected = oracle.gmm(lhs, rhs, sizes, bias=bias, existing_out=existing, activation_name="silu", group_offset=3)
    self._run(kind, gmm, (lhs, rhs, sizes, bias, existing), (P("d"), P(), P(), P(), P("d")), [expected], [P("d")],
              reduces=False)

  @parameterized.parameters(*MESHES)
  def test_gmm_swiglu_columns_gathered(self, kind):
    """swiglu keeps rhs's [gate | up] halves together: its column sharding is gathered, the result is right."""
    rng = np.random.default_rng(6)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, 2 * N), _sizes(rng, G, M)
    gmm = functools.partial(jgmm.gmm, activation="swiglu")
    self._run(kind, gmm, (lhs, rhs, sizes), (P("d"), P(None, None, "d"), P()),
              [oracle.gmm(lhs, rhs, sizes, activation_name="swiglu")], [P("d")], gathers=True)

  def _check_gmm_grad(self, kind, seed, specs, out_specs):
    """d lhs and d rhs of sum(gmm(lhs, rhs) * cotangent), operands placed by specs."""
    rng = np.random.default_rng(seed)
    lhs, rhs, sizes, cotangent = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M), _normal(rng, M, N)
    loss = lambda l, r, s, c: jnp.sum(jgmm.gmm(l, r, s) * c)
    expected = [oracle.gmm(cotangent, rhs, sizes, transpose_rhs=True),
                oracle.tgmm(lhs, cotangent, sizes, transpose_lhs=True)[0]]
    self._run(kind, jax.grad(loss, argnums=(0, 1)), (lhs, rhs, sizes, cotangent), specs, expected, out_specs,
              reduces=True)

  @parameterized.parameters(*MESHES)
  def test_gmm_grad_rows(self, kind):
    """Data parallel: d lhs keeps the rows' sharding, d rhs sums the shards' parts; nothing is gathered."""
    self._check_gmm_grad(kind, 7, (P("d"), P(), P(), P("d")), [P("d"), P()])

  @parameterized.parameters(*MESHES)
  def test_gmm_grad_groups(self, kind):
    """Expert parallel: rhs sharded over groups, forward and backward."""
    # Under explicit sharding d rhs is typed as rhs; on an Auto mesh its sharding is the partitioner's choice.
    self._check_gmm_grad(kind, 8, (P(), P("d"), P(), P()), [P(), None if kind == "auto" else P("d")])

  @parameterized.parameters(*MESHES)
  def test_tgmm_k_and_n(self, kind):
    rng = np.random.default_rng(9)
    lhs, rhs, sizes = _normal(rng, K, M), _normal(rng, M, N), _sizes(rng, G, M)
    for specs, out_spec in [((P("d"), P(), P()), P(None, "d")), ((P(), P(None, "d"), P()), P(None, None, "d"))]:
      self._run(kind, jgmm.tgmm, (lhs, rhs, sizes), specs, [oracle.tgmm(lhs, rhs, sizes)[0]], [out_spec],
                reduces=False)

  @parameterized.parameters(*MESHES)
  def test_tgmm_rows_summed(self, kind):
    """Rows sharded (the weight gradient under data parallelism): float32 parts summed, existing_out added once."""
    rng = np.random.default_rng(10)
    lhs, rhs, sizes, existing = _normal(rng, M, K), _normal(rng, M, N), _sizes(rng, G, M), _normal(rng, G, K, N)
    tgmm = lambda l, r, s, e: jgmm.tgmm(l, r, s, transpose_lhs=True, existing_out=e, bias_grad=True)
    out, dbias = oracle.tgmm(lhs, rhs, sizes, transpose_lhs=True, existing_out=existing)
    self._run(kind, tgmm, (lhs, rhs, sizes, existing), (P("d"), P("d"), P(), P()), [out, dbias], [P(), P()],
              reduces=True)

  @parameterized.parameters(*MESHES)
  def test_tgmm_groups(self, kind):
    """existing_out sharded over groups: each shard computes its groups (16 of 18, from group_offset 1)."""
    rng = np.random.default_rng(11)
    lhs, rhs, sizes, existing = _normal(rng, K, M), _normal(rng, M, N), _sizes(rng, 18, M), _normal(rng, 16, K, N)
    tgmm = lambda l, r, s, e: jgmm.tgmm(l, r, s, existing_out=e, group_offset=1, num_actual_groups=16)
    expected = oracle.tgmm(lhs, rhs, sizes, existing_out=existing, group_offset=1, num_actual_groups=16)[0]
    self._run(kind, tgmm, (lhs, rhs, sizes, existing), (P(), P(), P(), P("d")), [expected], [P("d")],
              reduces=False)

  @parameterized.parameters(*MESHES)
  def test_masked_gmm(self, kind):
    rng = np.random.default_rng(12)
    x, w = _normal(rng, G, 16, K), _normal(rng, G, N, K)
    masked_m = jnp.asarray(rng.integers(-2, 20, G), jnp.int32)
    for specs, out_spec in [((P("d"), P("d"), P("d")), P("d")), ((P(None, "d"), P(), P()), P(None, "d")),
                            ((P(), P(None, "d"), P()), P(None, None, "d"))]:
      self._run(kind, jgmm.masked_gmm, (x, w, masked_m), specs, [oracle.masked_gmm(x, w, masked_m)], [out_spec],
                reduces=False)

  @parameterized.parameters(*MESHES)
  def test_gmm_sharded_group_sizes(self, kind):
    """group_sizes sharded too: every shard needs them all (gathered, a G-element vector)."""
    rng = np.random.default_rng(14)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M)
    self._run(kind, jgmm.gmm, (lhs, rhs, sizes), (P("d"), P(), P("d")), [oracle.gmm(lhs, rhs, sizes)], [P("d")],
              gathers=True)

  @parameterized.parameters(EXPLICIT, AUTO)
  def test_shard_map_over_one_axis(self, other_axis_type):
    """shard_map manual over the expert axis only, lhs rows sharded over the other (Explicit or Auto) axis."""
    rng = np.random.default_rng(15)
    lhs, rhs, sizes, cotangent = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M), _normal(rng, M, N)
    if jax.device_count() < 8:
      self.skipTest("needs 8 devices")
    mesh = jax.make_mesh((4, 2), ("e", "d"), axis_types=(EXPLICIT, other_axis_type), devices=jax.devices()[:8])

    def local(lhs, rhs_local, sizes):
      offset = jax.lax.axis_index("e") * (G // 4)
      return jax.lax.psum(jgmm.gmm(lhs, rhs_local, sizes, group_offset=offset), "e")

    expert_parallel = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("e"), P()), out_specs=P(), axis_names={"e"})
    loss = lambda l, r, s, c: jnp.sum(expert_parallel(l, r, s) * c)
    with jax.set_mesh(mesh):
      lhs_rows, rhs_experts = jax.device_put(lhs, P("d")), jax.device_put(rhs, P("e"))
      out = jax.jit(expert_parallel)(lhs_rows, rhs_experts, sizes)
      dlhs, drhs = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs_rows, rhs_experts, sizes, cotangent)
    self.assertLess(oracle.rel_err(out, oracle.gmm(lhs, rhs, sizes)), TOL)
    self.assertLess(oracle.rel_err(dlhs, oracle.gmm(cotangent, rhs, sizes, transpose_rhs=True)), TOL)
    self.assertLess(oracle.rel_err(drhs, oracle.tgmm(lhs, cotangent, sizes, transpose_lhs=True)[0]), TOL)

  @parameterized.parameters(*MESHES)
  def test_ragged_dot_rows(self, kind):
    rng = np.random.default_rng(13)
    lhs, rhs, sizes = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M)
    self._run(kind, jgmm.ragged_dot, (lhs, rhs, sizes), (P("d"), P(), P()), [oracle.gmm(lhs, rhs, sizes)], [P("d")],
              reduces=False)

  @parameterized.product(kind=tuple(MESHES), fp8=(False, True))
  def test_grouped_matmul_rows(self, kind, fp8):
    """Each lhs_i's rows (and, in FP8, its row scales) sharded, rhs_i replicated: out_i sharded like lhs_i."""
    rng = np.random.default_rng(17)
    shapes = [(16, 24, 12), (8, 8, 20)]  # (M_i, N_i, K_i)
    lhs, rhs = [_normal(rng, m, k) for m, _, k in shapes], [_normal(rng, n, k) for _, n, k in shapes]
    scales = []
    if fp8:  # Per-row / per-channel recipe; the oracle multiplies the dequantised operands.
      (lhs, lhs_s), (rhs, rhs_s) = (zip(*[quantize.quantize(x, "row") for x in xs]) for xs in (lhs, rhs))
      scales = [*lhs_s, *rhs_s]
    dequantized = lambda xs, ss: [oracle.dequantize(x, s, "row") for x, s in zip(xs, ss)] if fp8 else xs
    expected = [np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
                for a, b in zip(dequantized(lhs, scales[:2]), dequantized(rhs, scales[2:]))]

    def fn(l0, l1, r0, r1, *s):
      kwargs = dict(lhs_scales=list(s[:2]), rhs_scales=list(s[2:])) if fp8 else {}
      return jgmm.grouped_matmul([l0, l1], [r0, r1], transpose_rhs=True, preferred_element_type=jnp.float32,
                                 **kwargs)

    specs = (P("d"), P("d"), P(), P()) + ((P("d"), P("d"), P(), P()) if fp8 else ())
    self._run(kind, fn, (*lhs, *rhs, *scales), specs, expected, [P("d"), P("d")], reduces=False)

  def test_triton_interpreted_explicit(self):
    """Triton in its interpreter (host callbacks: gathered, not partitioned) on an Explicit mesh, with grad."""
    if jax.devices()[0].platform != "cpu":
      self.skipTest("the interpreter runs on the CPU")
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    rng = np.random.default_rng(16)
    lhs, rhs, sizes, cotangent = _normal(rng, M, K), _normal(rng, G, K, N), _sizes(rng, G, M), _normal(rng, M, N)
    config = jgmm.Config(block_m=16, block_n=16, block_k=16, num_warps=1)
    loss = lambda l, r, s, c: jnp.sum(jgmm.gmm(l, r, s, backend="triton", config=config) * c)
    expected = [oracle.gmm(cotangent, rhs, sizes, transpose_rhs=True),
                oracle.tgmm(lhs, cotangent, sizes, transpose_lhs=True)[0]]
    self._run("explicit", jax.grad(loss, argnums=(0, 1)), (lhs, rhs, sizes, cotangent), (P("d"), P(), P(), P("d")),
              expected, [P("d"), P()], gathers=True)


class CrossLoweringTest(parameterized.TestCase):
  """The per-shard functions the partitioner calls back for, lowered for an H100 (JGMM_TARGET=cuda:90) on the CPU:
  one Triton kernel on each shard's block, and an all-reduce only where parts are summed."""

  def setUp(self):
    super().setUp()
    if jax.device_count() < NUM_DEVICES:
      self.skipTest(f"needs {NUM_DEVICES} devices: run under pytest (tests/conftest.py sets XLA_FLAGS)")
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}))
    self.mesh = jax.make_mesh((8,), ("d",), axis_types=(AUTO,), devices=jax.devices()[:8])

  def _lower_shard(self, name, params, operands, results, slots):
    """StableHLO of the partitioned call's per-shard function: operands/results (shape, dtype, spec); the
    operands fill the first of the primitive's `slots` operand slots."""
    placed = lambda x: jax.ShapeDtypeStruct(x[0], x[1], sharding=NamedSharding(self.mesh, x[2]))
    present = (True,) * len(operands) + (False,) * (slots - len(operands))
    static = partitioning.Static(name, present, tuple(sorted(params.items())), primitives.backend_runner(name, "cuda"))
    mesh, lower_fn, result_shardings, arg_shardings = partitioning.partition(
        static, self.mesh, [placed(o) for o in operands], [placed(r) for r in results])
    for sharding, operand in zip(arg_shardings, operands):  # Nothing gathered.
      self.assertTrue(sharding.is_equivalent_to(NamedSharding(self.mesh, operand[2]), len(operand[0])))
    shard = jax.shard_map(lower_fn, mesh=mesh, in_specs=tuple(s.spec for s in arg_shardings),
                          out_specs=[s.spec for s in result_shardings], check_vma=False)
    args = [jax.ShapeDtypeStruct(o[0], o[1]) for o in operands]
    return jax.jit(shard).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

  def test_gmm_rows(self):
    bf16 = jnp.bfloat16
    params = dict(transpose_rhs=False, out_dtype=jnp.dtype(bf16), activation=None, save_preactivation=False,
                  config=None, backend=None)
    text = self._lower_shard("gmm", params, [((64, 16), bf16, P("d")), ((4, 16, 32), bf16, P()),
                                             ((5,), jnp.int32, P())], [((64, 32), bf16, P("d"))], slots=5)
    self.assertEqual(text.count("@triton_kernel_call_ffi("), 1, text)
    self.assertIn("tensor<8x16xbf16>", text)  # The kernel reads the shard's 8 rows.
    self.assertNotIn("all_reduce", text)

  def test_tgmm_rows_summed(self):
    bf16 = jnp.bfloat16
    params = dict(transpose_lhs=True, out_dtype=jnp.dtype(bf16), bias_grad=False, config=None, backend=None)
    text = self._lower_shard("tgmm", params, [((64, 16), bf16, P("d")), ((64, 32), bf16, P("d")),
                                              ((5,), jnp.int32, P())], [((4, 16, 32), bf16, P())], slots=4)
    self.assertEqual(text.count("@triton_kernel_call_ffi("), 1, text)
    self.assertIn("all_reduce", text)


class GpuPartitioningTest(PartitioningTest):
  """The same cases through the Triton kernels on 2 GPUs (exact float32 products); skipped without them."""

  def setUp(self):
    parameterized.TestCase.setUp(self)
    if jax.devices()[0].platform != "gpu" or jax.device_count() < 2:
      self.skipTest("needs 2 GPUs")
    self.enter_context(jax.default_matmul_precision("float32"))

  def _mesh(self, kind):
    _, names, types = MESHES[kind]
    shape = (2,) if len(names) == 1 else (2, 1)
    return jax.make_mesh(shape, names, axis_types=types, devices=jax.devices()[:2])


if __name__ == "__main__":
  absltest.main()
