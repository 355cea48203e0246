"""jgmm.moe (routing, permutation, grouped_gemm, moe_mlp, the expert-parallel recipe) and jgmm.nnx.

Every result is checked against a float64 numpy oracle that loops over tokens and experts, on fresh random
inputs; gradients against jax.grad of a pure-jnp reference. The expert-parallel tests run on the 8 emulated
CPU devices of tests/conftest.py.
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import seeded
from absl.testing import absltest, parameterized
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jgmm
from jgmm import moe, oracle

try:
  shard_map = jax.shard_map
except AttributeError:  # jax without the top-level alias.
  from jax.experimental.shard_map import shard_map

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_DEVICES = 8
T, H, E, F, TOP_K = 29, 12, 8, 10, 2
ON_GPU = jax.default_backend() == "gpu"
# float32 products: exact here, TF32 tensor cores on NVIDIA GPUs (relative error ~1e-3).
TOL = 5e-3 if ON_GPU else 2e-5
GRAD_TOL = 5e-3 if ON_GPU else 1e-4


def _normal(rng, *shape, dtype=jnp.float32):
  return jnp.asarray(rng.standard_normal(shape), dtype)


def _logits(rng, num_tokens, num_experts):
  """(T, E) float32 router logits, about standard normal, each row's values at least 1e-3 apart: no two experts tie
  in float32 scores where the float64 oracle ranks them (two normals within ~1e-7 of each other did: a flaky
  top-k)."""
  rows = np.sort(rng.standard_normal((num_tokens, num_experts)), axis=-1) + 1e-3 * np.arange(num_experts)
  return jnp.asarray(rng.permuted(rows, axis=-1), jnp.float32)


def _expert_ids(rng, num_tokens, num_experts, top_k):
  """(T, k) distinct expert ids per token, skewed towards a few experts (so capacity drops some)."""
  p = rng.dirichlet(np.full(num_experts, 0.5))
  return np.stack([rng.choice(num_experts, top_k, replace=False, p=p) for _ in range(num_tokens)]).astype(np.int32)


# --------------------------------------------------------------------------------------------------------------
# float64 oracles (loops over tokens and experts)


def route_oracle(logits, top_k, score, renormalize, bias):
  logits = oracle.f64(logits)
  if score == "softmax":
    scores = np.exp(logits - logits.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
  else:
    scores = 1.0 / (1.0 + np.exp(-logits))
  selection = scores + (0.0 if bias is None else oracle.f64(bias))
  ids = np.argsort(-selection, axis=-1, kind="stable")[:, :top_k]
  weights = np.take_along_axis(scores, ids, axis=-1)
  if renormalize:
    weights /= weights.sum(-1, keepdims=True)
  return weights, ids


def permute_oracle(ids, num_experts, capacity=None):
  """(order, group_sizes, dropped): slots grouped by expert in token order, the first `capacity` kept."""
  num_tokens, top_k = ids.shape
  order, sizes, dropped = [], np.zeros(num_experts, np.int64), np.ones((num_tokens, top_k), bool)
  for e in range(num_experts):
    for t in range(num_tokens):
      for j in range(top_k):
        if ids[t, j] == e and (capacity is None or sizes[e] < capacity):
          order.append(t * top_k + j)
          sizes[e] += 1
          dropped[t, j] = False
  return np.asarray(order, np.int64), sizes, dropped


def mlp_oracle(x, w_gate_up, w_down, activation):
  return oracle.activation(activation, oracle.f64(x) @ oracle.f64(w_gate_up)) @ oracle.f64(w_down)


def moe_oracle(x, logits, w_gate_up, w_down, top_k, *, activation="swiglu", score="softmax", renormalize=True,
               bias=None, capacity=None, shared=None):
  weights, ids = route_oracle(logits, top_k, score, renormalize, bias)
  _, _, dropped = permute_oracle(ids, w_gate_up.shape[0], capacity)
  out = np.zeros(x.shape)
  for t in range(x.shape[0]):
    for j in range(top_k):
      if not dropped[t, j]:
        out[t] += weights[t, j] * mlp_oracle(x[t], w_gate_up[ids[t, j]], w_down[ids[t, j]], activation)
    if shared is not None:
      out[t] += mlp_oracle(x[t], *shared, activation)
  return out


def moe_reference(x, logits, w_gate_up, w_down, top_k, score="softmax"):
  """Pure-jnp moe_mlp (swiglu, dropless) for jax.grad: gathers each slot's expert weights."""
  weights, ids = moe.route(logits, top_k, score=score)
  h = jnp.einsum("th,tkhf->tkf", x, w_gate_up[ids])
  gate, up = jnp.split(h, 2, axis=-1)
  y = jnp.einsum("tkf,tkfh->tkh", jax.nn.silu(gate) * up, w_down[ids])
  return jnp.einsum("tk,tkh->th", weights, y)


class MoeTestBase(seeded.SeededTestCase):

  def assert_close(self, actual, expected, what, tol=TOL):
    err = oracle.rel_err(actual, expected)
    self.assertLess(err, tol, f"{what}: rel_err {err:.3g} (seed {self.seed})")

  def weights(self, num_experts=E, hidden=H, ffn=F, gated=True):
    scale = 1.0 / np.sqrt(hidden)
    return (_normal(self.rng, num_experts, hidden, (2 if gated else 1) * ffn) * scale,
            _normal(self.rng, num_experts, ffn, hidden) * scale)


class MoeTest(MoeTestBase):

  @parameterized.product(score=("softmax", "sigmoid"), renormalize=(True, False), biased=(False, True),
                         top_k=(1, 3))
  def test_route(self, score, renormalize, biased, top_k):
    logits = _logits(self.rng, T, E)
    bias = _normal(self.rng, E) if biased else None
    weights, ids = jax.jit(lambda l, b: moe.route(l, top_k, score=score, renormalize=renormalize, bias=b))(
        logits, bias)
    expected_weights, expected_ids = route_oracle(logits, top_k, score, renormalize, bias)
    self.assertEqual(ids.dtype, jnp.int32)
    np.testing.assert_array_equal(ids, expected_ids, f"seed {self.seed}")
    self.assert_close(weights, expected_weights, "weights")

  def test_route_gradient_skips_the_bias(self):
    logits, bias = _logits(self.rng, T, E), _normal(self.rng, E)
    loss = lambda l, b: jnp.sum(moe.route(l, TOP_K, score="sigmoid", bias=b)[0] * jnp.arange(TOP_K))
    dlogits, dbias = jax.grad(loss, argnums=(0, 1))(logits, bias)
    self.assertGreater(float(jnp.abs(dlogits).sum()), 0.0)
    np.testing.assert_array_equal(dbias, np.zeros(E))

  @parameterized.parameters(None, 0, 3, 100)
  def test_permute_unpermute(self, capacity):
    x = _normal(self.rng, T, H)
    ids = _expert_ids(self.rng, T, E, TOP_K)
    ids[3, 1], ids[7, 0] = -1, E  # out of range: dropped
    order, sizes, dropped = permute_oracle(ids, E, capacity)
    rows, group_sizes, permutation = jax.jit(lambda x, i: moe.permute(x, i, E, capacity=capacity))(x, ids)
    np.testing.assert_array_equal(group_sizes, sizes, f"seed {self.seed}")
    np.testing.assert_array_equal(permutation.dropped, dropped, f"seed {self.seed}")
    np.testing.assert_array_equal(rows[:len(order)], np.asarray(x)[order // TOP_K])
    y = _normal(self.rng, T * TOP_K, 7)
    y = y.at[len(order):].set(jnp.nan)  # rows of dropped slots: never read into the result
    weights = _normal(self.rng, T, TOP_K)
    slots, combined = moe.unpermute(y, permutation), moe.unpermute(y, permutation, weights)
    expected = np.zeros((T * TOP_K, 7))
    expected[order] = np.asarray(y, np.float64)[:len(order)]
    expected = expected.reshape(T, TOP_K, 7)
    self.assert_close(slots, expected, "unpermute")
    self.assert_close(combined, np.einsum("tk,tkn->tn", oracle.f64(weights), expected), "combine")

  def test_permute_gradients(self):
    x, w = _normal(self.rng, T, H), _normal(self.rng, T, TOP_K)
    ids = _expert_ids(self.rng, T, E, TOP_K)
    proj = _normal(self.rng, H, 5)

    def loss(x, w):  # a row-dependent function between permute and unpermute
      rows, _, permutation = moe.permute(x, ids, E)
      scale = jnp.arange(rows.shape[0], dtype=jnp.float32)[:, None] / rows.shape[0]
      return jnp.sum(jnp.sin(moe.unpermute(jnp.tanh(rows @ proj) * scale, permutation, w)))

    def reference(x, w):
      _, _, permutation = moe.permute(x, ids, E)
      scale = (permutation.inverse.astype(jnp.float32) / (T * TOP_K)).reshape(T, TOP_K, 1)
      return jnp.sum(jnp.sin(jnp.einsum("tk,tkn->tn", w, jnp.tanh(x @ proj)[:, None] * scale)))

    grads = [jax.jit(jax.grad(fn, (0, 1)))(x, w) for fn in (loss, reference)]
    for got, want, name in zip(*grads, "xw"):
      self.assert_close(got, want, f"d{name}")

  @parameterized.parameters(jnp.float32, jnp.bfloat16)
  def test_grouped_gemm(self, dtype):
    x, w = _normal(self.rng, T, H, dtype=dtype), _normal(self.rng, E, H, 9, dtype=dtype)
    ids = _expert_ids(self.rng, T, E, 3)
    ids[5, 2] = E + 4  # out of range: zeros
    out = jax.jit(moe.grouped_gemm)(x, w, ids)
    self.assertEqual(out.shape, (T, 3, 9))
    self.assertEqual(out.dtype, dtype)
    expected = np.zeros((T, 3, 9))
    for t in range(T):
      for j in range(3):
        if 0 <= ids[t, j] < E:
          expected[t, j] = oracle.f64(x[t]) @ oracle.f64(w[ids[t, j]])
    self.assert_close(out, expected, "grouped_gemm", TOL if dtype == jnp.float32 else 2e-2)

  @parameterized.named_parameters(
      ("swiglu_softmax", "swiglu", "softmax", False, None, "contiguous"),
      ("gelu_sigmoid_bias", "gelu", "sigmoid", True, None, "contiguous"),
      ("swiglu_shared", "swiglu", "softmax", False, "shared", "contiguous"),
      ("silu_capacity", "silu", "softmax", False, "capacity", "contiguous"),
      ("swiglu_masked", "swiglu", "softmax", False, None, "masked"),
      ("swiglu_masked_shared", "swiglu", "sigmoid", True, "shared", "masked"),
  )
  def test_moe_mlp(self, activation, score, biased, extra, layout):
    gated = activation == "swiglu"
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    if extra == "capacity":  # Skewed: expert 0 in every token's top 2, so 29 rows for a capacity of 8.
      logits = logits.at[:, 0].add(10.0)
    w_gate_up, w_down = self.weights(gated=gated)
    bias = _normal(self.rng, E) if biased else None
    shared = self.weights(num_experts=1, ffn=6, gated=gated) if extra == "shared" else None
    shared = None if shared is None else (shared[0][0], shared[1][0])
    capacity = moe.expert_capacity(T, TOP_K, E, 1.0) if extra == "capacity" else None
    fn = lambda *a: moe.moe_mlp(*a, TOP_K, activation=activation, score=score, router_bias=bias,
                                shared_experts=shared, capacity=capacity, layout=layout, return_dropped=True)
    out, dropped = jax.jit(fn)(x, logits, w_gate_up, w_down)
    expected = moe_oracle(x, logits, w_gate_up, w_down, TOP_K, activation=activation, score=score, bias=bias,
                          capacity=capacity, shared=shared)
    self.assert_close(out, expected, "moe_mlp")
    _, ids = route_oracle(logits, TOP_K, score, True, bias)
    np.testing.assert_array_equal(dropped, permute_oracle(ids, E, capacity)[2])
    if extra == "capacity":
      self.assertGreater(int(dropped.sum()), 0, "expert 0 should overflow capacity 1.0")

  def test_moe_mlp_ragged_dot_impl(self):
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    w_gate_up, w_down = self.weights()
    out = moe.moe_mlp(x, logits, w_gate_up, w_down, TOP_K, impl="ragged_dot")
    self.assert_close(out, moe_oracle(x, logits, w_gate_up, w_down, TOP_K), "ragged_dot impl")

  def test_moe_mlp_fp8_impl(self):
    # FP8 (e4m3: 3 mantissa bits, unit roundoff 2^-4) operands in both products: the result and every gradient
    # follow the exact ones to FP8 rounding (measured 5-9% on three seeds), far from the O(1) error of a wrong product.
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    w_gate_up, w_down = self.weights()
    proj = _normal(self.rng, H)
    fp8_mlp = lambda *a: moe.moe_mlp(*a, TOP_K, impl="fp8")
    out = jax.jit(fp8_mlp)(x, logits, w_gate_up, w_down)
    self.assert_close(out, moe_oracle(x, logits, w_gate_up, w_down, TOP_K), "fp8 impl", 0.12)
    loss = lambda fn: lambda *a: jnp.sum(jnp.tanh(fn(*a)) * proj)
    got = jax.jit(jax.grad(loss(fp8_mlp), argnums=(0, 1, 2, 3)))(x, logits, w_gate_up, w_down)
    want = jax.jit(jax.grad(loss(lambda *a: moe_reference(*a, TOP_K)), argnums=(0, 1, 2, 3)))(
        x, logits, w_gate_up, w_down)
    for g, r, name in zip(got, want, ("x", "router_logits", "w_gate_up", "w_down")):
      self.assertEqual(g.dtype, r.dtype, name)
      self.assert_close(g, r, f"fp8 impl d{name}", 0.15)

  def test_moe_mlp_fp8_weights_quantised_ahead(self):
    """impl="fp8" with fp8_weights made once outside the gradient, of other weights: the output and every gradient
    bit for bit those of impl="fp8" on those weights (the products read the copies; the weights' gradients reach
    the weights passed)."""
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    w_gate_up, w_down = self.weights()
    other = self.weights()
    proj = _normal(self.rng, H)
    ahead = jax.jit(lambda *w: tuple(jgmm.quantize_weights(a) for a in w))(*other)

    @jax.jit
    def value_and_grads(x, logits, w_gate_up, w_down, fp8_weights):
      fn = lambda *a: jnp.sum(jnp.tanh(moe.moe_mlp(*a, TOP_K, impl="fp8", fp8_weights=fp8_weights)) * proj)
      return jax.value_and_grad(fn, argnums=(0, 1, 2, 3))(x, logits, w_gate_up, w_down)

    got, want = value_and_grads(x, logits, w_gate_up, w_down, ahead), value_and_grads(x, logits, *other, None)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      self.assertFalse(np.isnan(np.asarray(g)).any())
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    self.assertGreater(float(jnp.max(jnp.abs(got[1][2]))), 0.0)  # d w_gate_up reaches the weights

  def test_masked_layout_rows_past_max_rows_are_zero(self):
    rows = _normal(self.rng, 20, H)
    sizes = jnp.asarray([9, 0, 6, 5], jnp.int32)
    w_gate_up, w_down = self.weights(num_experts=4)
    out = moe.expert_mlp(rows, sizes, w_gate_up, w_down, layout="masked", max_rows_per_expert=6)
    expected, start = np.zeros((20, H)), 0
    for e, size in enumerate(np.asarray(sizes)):
      kept = min(size, 6)
      expected[start:start + kept] = mlp_oracle(rows[start:start + kept], w_gate_up[e], w_down[e], "swiglu")
      start += size
    self.assert_close(out, expected, "masked layout")

  @parameterized.parameters("contiguous", "masked")
  def test_moe_mlp_gradients(self, layout):
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    w_gate_up, w_down = self.weights()
    proj = _normal(self.rng, H)
    loss = lambda fn: lambda *a: jnp.sum(jnp.tanh(fn(*a)) * proj)
    ours = loss(lambda *a: moe.moe_mlp(*a, TOP_K, layout=layout))
    reference = loss(lambda *a: moe_reference(*a, TOP_K))
    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3)))(x, logits, w_gate_up, w_down)
    want = jax.jit(jax.grad(reference, argnums=(0, 1, 2, 3)))(x, logits, w_gate_up, w_down)
    for g, r, name in zip(got, want, ("x", "router_logits", "w_gate_up", "w_down")):
      self.assert_close(g, r, f"d{name}", GRAD_TOL)

  def test_load_balancing_loss(self):
    logits = _logits(self.rng, T, E)
    ids = _expert_ids(self.rng, T, E, TOP_K)
    probs = np.exp(oracle.f64(logits))
    probs /= probs.sum(-1, keepdims=True)
    fraction = np.bincount(ids.reshape(-1), minlength=E) / ids.size
    expected = E * np.sum(fraction * probs.mean(0))
    self.assert_close(moe.load_balancing_loss(logits, ids, E), expected, "aux loss")


class ReadmeMoeTourTest(MoeTestBase):

  def test_the_moe_tour_runs_and_matches_the_oracle(self):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```$", readme, flags=re.M | re.S) if "from jgmm import moe" in b]
    tour = {}
    exec(compile(block, "README.md:moe tour", "exec"), tour)  # pylint: disable=exec-used
    x, logits, w_gate_up, w_down, k = (tour[n] for n in ("x", "router_logits", "w_gate_up", "w_down", "k"))
    expected = moe_oracle(x, logits, w_gate_up, w_down, k)
    self.assert_close(tour["out"], expected, "moe_mlp")
    self.assert_close(tour["out_ep"], expected, "expert_parallel_moe_mlp")
    self.assertEqual(tour["dropped"].shape, (x.shape[0], k))
    per_slot = np.einsum("th,tkho->tko", oracle.f64(x), oracle.f64(tour["w"])[np.asarray(tour["ids"])])
    self.assert_close(tour["per_slot"], per_slot, "grouped_gemm")
    self.assert_close(tour["combined"], np.einsum("tk,tko->to", oracle.f64(tour["weights"]), per_slot), "unpermute")


class MoeValidationTest(MoeTestBase):

  def test_bad_inputs(self):
    x, logits = _normal(self.rng, T, H), _logits(self.rng, T, E)
    w_gate_up, w_down = self.weights()
    ids = _expert_ids(self.rng, T, E, TOP_K)
    cases = [
        (ValueError, r"top_k must be a Python int >= 1 <= 8, got 9", lambda: moe.route(logits, 9)),
        (ValueError, r"score must be one of .*'tanh'", lambda: moe.route(logits, 2, score="tanh")),
        (ValueError, r"bias must have shape \(E,\) = \(8,\), got shape \(7,\)",
         lambda: moe.route(logits, 2, bias=jnp.zeros(7))),
        (TypeError, r"router_logits must have dtype .*got shape \(29, 8\) and dtype int32",
         lambda: moe.route(logits.astype(jnp.int32), 2)),
        (TypeError, r"expert_ids must have an integer dtype.*float32",
         lambda: moe.permute(x, ids.astype(np.float32), E)),
        (ValueError, r"expert_ids must be \(T, top_k\) with T = 29 .*got shape \(28, 2\)",
         lambda: moe.permute(x, ids[:-1], E)),
        (ValueError, r"capacity must be a non-negative Python int or None, got -1",
         lambda: moe.permute(x, ids, E, capacity=-1)),
        (ValueError, r"y must have T \* top_k = 58 rows .*got shape \(57, 3\)",
         lambda: moe.unpermute(jnp.zeros((57, 3)), moe.permute(x, ids, E)[2])),
        (ValueError, r"weights must have shape \(T, top_k\) = \(29, 2\), got shape \(29, 3\)",
         lambda: moe.unpermute(jnp.zeros((58, 3)), moe.permute(x, ids, E)[2], jnp.zeros((29, 3)))),
        (ValueError, r"w must be \(E, H, O\) with H = 12 .*got shape \(8, 11, 4\)",
         lambda: moe.grouped_gemm(x, jnp.zeros((E, 11, 4)), ids)),
        (ValueError, r"w_gate_up must be \(E, H, 2F\) \(\[gate \| up\] halves\) with H = 12 .*\(8, 12, 7\)",
         lambda: moe.moe_mlp(x, logits, jnp.zeros((E, H, 7)), w_down, 2)),
        (ValueError, r"w_down must have shape \(E, F, H\) = \(8, 10, 12\), got shape \(8, 10, 11\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up, jnp.zeros((E, F, 11)), 2)),
        (TypeError, r"w_down must have the dtype of x \(float32\), got .*bfloat16",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down.astype(jnp.bfloat16), 2)),
        (ValueError, r"w_gate_up must hold E = 8 experts \(router_logits is \(29, 8\)\), got shape \(4, 12, 20\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up[:4], w_down[:4], 2)),
        (ValueError, r"router_logits must be \(T, E\) with T = 29 .*got shape \(30, 8\)",
         lambda: moe.moe_mlp(x, jnp.zeros((30, E)), w_gate_up, w_down, 2)),
        (ValueError, r"activation must be one of .*None",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, activation=None)),
        (ValueError, r"impl must be one of .*'cublas'",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="cublas")),
        (ValueError, r"layout='masked' .*no impl='fp8'",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8", layout="masked")),
        (ValueError, r"layout='masked' .*no impl='ragged_dot'",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="ragged_dot", layout="masked")),
        (ValueError, r"fp8_weights \(the weights quantised ahead\) go with impl='fp8', got impl='jgmm'",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, fp8_weights=(w_gate_up, w_down))),
        (TypeError, r"fp8_weights\[0\] must be jgmm.Fp8Weights \(jgmm.quantize_weights of the weights\), got ",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8", fp8_weights=(w_gate_up, w_down))),
        (ValueError, r"fp8_weights\[0\] was made with transpose_rhs=True, but the call reads weights with "
         r"transpose_rhs=False: make it with quantize_weights\(..., transpose_rhs=False\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8", fp8_weights=(
             jgmm.quantize_weights(jnp.swapaxes(w_gate_up, 1, 2), transpose_rhs=True), None))),
        (TypeError, r"fp8_weights\[1\].nk must have the call's FP8 format float8_e4m3fn, got .* float8_e4m3fnuz: "
         r"make it with quantize_weights\(..., fp8_dtype=jnp.float8_e4m3fn\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8", fp8_weights=(
             jgmm.quantize_weights(w_gate_up),
             # The portable backend: a GPU has no Triton kernel for ROCm's format.
             jgmm.quantize_weights(w_down, fp8_dtype=jnp.float8_e4m3fnuz, backend="xla")))),
        (TypeError, r"fp8_weights must be a pair .* got Fp8Weights",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8",
                             fp8_weights=jgmm.quantize_weights(w_gate_up))),
        (ValueError, r"fp8_weights\[1\].nk must have shape \(G, N, K\) = \(8, 12, 10\), got shape \(8, 20, 12\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, impl="fp8",
                             fp8_weights=(jgmm.quantize_weights(w_gate_up),) * 2)),
        (TypeError, r"shared_experts must be a pair",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2, shared_experts=w_down)),
        (ValueError, r"shared_experts\[1\] must have shape \(F, H\) = \(5, 12\), got shape \(6, 12\)",
         lambda: moe.moe_mlp(x, logits, w_gate_up, w_down, 2,
                             shared_experts=(jnp.zeros((H, 10)), jnp.zeros((6, H))))),
    ]
    for error, message, call in cases:
      with self.subTest(message):
        with self.assertRaisesRegex(error, message):
          call()


# --------------------------------------------------------------------------------------------------------------
# Expert parallelism on 8 emulated devices


def _emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                                axis_name, axis_index_groups=None):
  """jax.lax.ragged_all_to_all's documented semantics from all_gather (XLA:CPU does not compile the real one)."""
  del recv_sizes, axis_index_groups
  me = lax.axis_index(axis_name)
  operands, starts, sizes, lands = (lax.all_gather(a, axis_name) for a in
                                    (operand, input_offsets, send_sizes, output_offsets))
  row = jnp.arange(output.shape[0])
  for source in range(operands.shape[0]):  # the test's 8 devices; jgmm.moe has no such loop
    start, size, land = starts[source, me], sizes[source, me], lands[source, me]
    inside = (row >= land) & (row < land + size)
    taken = jnp.take(operands[source], start + row - land, axis=0, mode="clip")
    output = jnp.where(inside[:, None], taken, output)
  return output


class ExpertParallelTest(MoeTestBase):

  def setUp(self):
    super().setUp()
    if jax.device_count() < NUM_DEVICES:
      self.skipTest(f"needs {NUM_DEVICES} devices: run under pytest (tests/conftest.py sets XLA_FLAGS)")
    self.mesh = Mesh(np.array(jax.devices()[:NUM_DEVICES]), ("expert",))

  def _inputs(self, num_experts, tokens_per_device=5):
    tokens = NUM_DEVICES * tokens_per_device
    x, logits = _normal(self.rng, tokens, H), _logits(self.rng, tokens, num_experts)
    logits = logits + jnp.asarray(self.rng.normal(0, 2, num_experts), jnp.float32)  # unbalanced load
    return (x, logits, *self.weights(num_experts=num_experts))

  def _sharded(self, **options):
    fn = lambda *a: moe.expert_parallel_moe_mlp(*a, TOP_K, axis_name="expert", **options)
    return jax.jit(shard_map(fn, mesh=self.mesh, in_specs=(P("expert"),) * 4, out_specs=P("expert")))

  @parameterized.parameters((8, "contiguous", "padded"), (16, "contiguous", "ragged"), (16, "masked", "padded"),
                            (8, "masked", "ragged"))
  def test_matches_one_device(self, num_experts, layout, dispatch):
    inputs = self._inputs(num_experts)
    with mock.patch.object(lax, "ragged_all_to_all", _emulated_ragged_all_to_all):
      got = self._sharded(layout=layout, dispatch=dispatch)(*inputs)
    self.assert_close(got, moe.moe_mlp(*inputs, TOP_K), "expert parallel vs one device")
    self.assert_close(got, moe_oracle(*inputs, TOP_K), "expert parallel vs oracle")

  @parameterized.parameters("padded", "ragged")
  def test_gradients_match_one_device(self, dispatch):
    inputs = self._inputs(16)
    proj = _normal(self.rng, H)
    loss = lambda fn: lambda *a: jnp.sum(jnp.tanh(fn(*a)) * proj)
    with mock.patch.object(lax, "ragged_all_to_all", _emulated_ragged_all_to_all):
      got = jax.jit(jax.grad(loss(self._sharded(dispatch=dispatch)), argnums=(0, 1, 2, 3)))(*inputs)
    want = jax.jit(jax.grad(loss(lambda *a: moe.moe_mlp(*a, TOP_K)), argnums=(0, 1, 2, 3)))(*inputs)
    for g, r, name in zip(got, want, ("x", "router_logits", "w_gate_up", "w_down")):
      self.assert_close(g, r, f"d{name}", GRAD_TOL)

  def test_fp8_weights_quantised_ahead(self):
    """impl="fp8" with fp8_weights: quantize_weights of the whole weights, sharded with them along the experts, made
    of other weights: output and gradients bit for bit those on the other weights."""
    x, logits, w_gate_up, w_down = self._inputs(8)
    other = self.weights(num_experts=8)
    ahead = tuple(jgmm.quantize_weights(w) for w in other)

    def sharded(fp8_weights):
      def fn(x, logits, w_gate_up, w_down, *fp8_weights):
        return moe.expert_parallel_moe_mlp(x, logits, w_gate_up, w_down, TOP_K, axis_name="expert", impl="fp8",
                                           dispatch="padded", fp8_weights=fp8_weights or None)
      mapped = shard_map(fn, mesh=self.mesh, in_specs=(P("expert"),) * (4 + len(fp8_weights)),
                         out_specs=P("expert"))
      loss = lambda *a: jnp.sum(jnp.tanh(mapped(*a, *fp8_weights)))
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))

    got = sharded(ahead)(x, logits, w_gate_up, w_down)
    want = sharded(())(x, logits, *other)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    self.assertGreater(float(jnp.max(jnp.abs(got[1][2]))), 0.0)

  def test_shared_experts_and_bias(self):
    inputs = self._inputs(16)
    bias = _normal(self.rng, 16)
    shared = tuple(w[0] for w in self.weights(num_experts=1, ffn=6))
    fn = lambda *a: moe.expert_parallel_moe_mlp(*a, TOP_K, axis_name="expert", router_bias=bias,
                                                 shared_experts=shared, score="sigmoid")
    got = jax.jit(shard_map(fn, mesh=self.mesh, in_specs=(P("expert"),) * 4, out_specs=P("expert")))(*inputs)
    self.assert_close(got, moe_oracle(*inputs, TOP_K, score="sigmoid", bias=bias, shared=shared), "shared + bias")

  def test_ragged_dispatch_lowers_for_cuda(self):
    """The real ragged_all_to_all in the StableHLO of the ragged path, lowered for CUDA on this CPU machine."""
    inputs = self._inputs(16)
    fn = self._sharded(dispatch="ragged", backend="xla")
    if importlib.util.find_spec("jax_plugins.xla_cuda13") is None:
      self.skipTest("lowering for cuda needs jax's CUDA plugin: pip install 'jgmm[cuda]'")
    text = fn.trace(*inputs).lower(lowering_platforms=("cuda",)).as_text()
    self.assertIn("ragged_all_to_all", text)

  def test_wrong_expert_shard_is_an_error(self):
    x, logits, w_gate_up, w_down = self._inputs(16)
    fn = lambda *a: moe.expert_parallel_moe_mlp(*a, TOP_K, axis_name="expert")
    sharded = shard_map(fn, mesh=self.mesh, in_specs=(P("expert"), P("expert"), P(), P()), out_specs=P("expert"))
    with self.assertRaisesRegex(ValueError, r"w_gate_up must hold E / 8 expert shards = 2 experts"):
      sharded(x, logits, w_gate_up, w_down)

  def test_dispatch_is_validated(self):
    with self.assertRaisesRegex(ValueError, r"dispatch must be one of .*'nccl'"):
      self._sharded(dispatch="nccl")(*self._inputs(8))


GPUS = [d for d in jax.devices() if d.platform == "gpu"]


@absltest.skipUnless(len(GPUS) >= 2, "needs 2+ GPUs (the real ragged_all_to_all; XLA:CPU does not compile it)")
class ExpertParallelGpuTest(MoeTestBase):

  @parameterized.parameters("ragged", "padded")
  def test_matches_one_device(self, dispatch):
    mesh = Mesh(np.array(GPUS), ("expert",))
    tokens, num_experts = 64 * len(GPUS), 4 * len(GPUS)
    x, logits = _normal(self.rng, tokens, H), _logits(self.rng, tokens, num_experts)
    w_gate_up, w_down = self.weights(num_experts=num_experts)
    fn = lambda *a: moe.expert_parallel_moe_mlp(*a, TOP_K, axis_name="expert", dispatch=dispatch)
    sharded = jax.jit(shard_map(fn, mesh=mesh, in_specs=(P("expert"),) * 4, out_specs=P("expert")))
    proj = _normal(self.rng, H)
    loss = lambda f: lambda *a: jnp.sum(jnp.tanh(f(*a)) * proj)
    with jax.default_matmul_precision("float32"):
      got = sharded(x, logits, w_gate_up, w_down)
      grads = jax.jit(jax.grad(loss(sharded), argnums=(0, 2)))(x, logits, w_gate_up, w_down)
      want = jax.jit(jax.grad(loss(lambda *a: moe.moe_mlp(*a, TOP_K)), argnums=(0, 2)))(x, logits, w_gate_up, w_down)
    self.assert_close(got, moe_oracle(x, logits, w_gate_up, w_down, TOP_K), "expert parallel on GPUs", GRAD_TOL)
    for g, r, name in zip(grads, want, ("x", "w_gate_up")):
      self.assert_close(g, r, f"d{name}", GRAD_TOL)


# --------------------------------------------------------------------------------------------------------------
# Flax NNX module and the training example

HAVE_FLAX = importlib.util.find_spec("flax") is not None


@absltest.skipUnless(HAVE_FLAX, "flax is not installed (jgmm.nnx is optional)")
class NnxTest(MoeTestBase):

  def test_moe_mlp_module(self):
    from flax import nnx
    from jgmm import nnx as jgmm_nnx
    layer = jgmm_nnx.MoEMLP(H, F, E, TOP_K, num_shared=6, rngs=nnx.Rngs(self.seed % 2**31))
    x = _normal(self.rng, 3, 7, H)
    out = nnx.jit(lambda m, x: m(x))(layer, x)
    self.assertEqual(out.shape, (3, 7, H))
    tokens = oracle.f64(x).reshape(-1, H)
    logits = tokens @ oracle.f64(layer.router[...])
    shared = (layer.shared_gate_up[...], layer.shared_down[...])
    expected = moe_oracle(tokens, logits, oracle.f64(layer.w_gate_up[...]), oracle.f64(layer.w_down[...]), TOP_K,
                          shared=[oracle.f64(w) for w in shared])
    self.assert_close(out.reshape(-1, H), expected, "nnx.MoEMLP", GRAD_TOL)
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(layer)
    self.assertGreater(float(jnp.abs(grads.w_gate_up[...]).sum()), 0.0)
    self.assertGreater(float(jnp.abs(grads.router[...]).sum()), 0.0)

  def test_fp8_weights(self):
    """impl="fp8" with the layer's weights quantised ahead: the products read them (the output follows the
    layer's own within FP8 rounding, and another layer's weights give another output)."""
    from flax import nnx
    from jgmm import nnx as jgmm_nnx
    layers = [jgmm_nnx.MoEMLP(H, F, E, TOP_K, impl="fp8", rngs=nnx.Rngs(self.seed % 2**31 + i)) for i in range(2)]
    x = _normal(self.rng, 3, 7, H)
    ahead = [tuple(jgmm.quantize_weights(w[...]) for w in (layer.w_gate_up, layer.w_down)) for layer in layers]
    run = nnx.jit(lambda m, x, w: m(x, fp8_weights=w))
    own, other, plain = run(layers[0], x, ahead[0]), run(layers[0], x, ahead[1]), run(layers[0], x, None)
    self.assert_close(own, plain, "fp8_weights of the layer's own weights", 0.05)
    self.assertGreater(float(jnp.max(jnp.abs(other - plain))), 0.1)


HAVE_OPTAX = importlib.util.find_spec("optax") is not None


@absltest.skipUnless(HAVE_OPTAX, "optax is not installed (the example trains with it)")
class TrainExampleTest(absltest.TestCase):

  def test_train_moe_runs_on_8_emulated_devices(self):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip())
    out_dir = self.enter_context(tempfile.TemporaryDirectory())
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_moe.py"), "--tiny", "--steps", "3", "--fp8",
         "--out", out_dir], env=env, capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
    self.assertIn("devices: 8", result.stdout)
    self.assertRegex(result.stdout, r"tokens/s")
    self.assertRegex(result.stdout, r"final loss [0-9.]+")
    # The FP8 run follows the bf16 one: 3 steps from the same initialisation move the loss by ~0.05.
    fp8_gap = re.search(r"fp8 vs jgmm: max \|loss difference\| ([0-9.e+-]+)", result.stdout)
    self.assertIsNotNone(fp8_gap, result.stdout[-3000:])
    self.assertLess(float(fp8_gap.group(1)), 0.02)
    self.assertTrue(os.path.exists(os.path.join(out_dir, "train_moe_loss.png")) or "matplotlib" in result.stdout)


if __name__ == "__main__":
  absltest.main()
