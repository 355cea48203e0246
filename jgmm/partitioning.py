"""Sharding of jgmm's primitives: output shardings under explicit sharding, and SPMD partitioning rules.

Each primitive names the factor of every dimension of its operands and results (Einsum style):

  gmm        lhs (m, k), rhs (g, k, n) or (g, n, k), bounds (b), bias (g, n), existing_out (m, o)
             -> out (m, o), preactivation (m, n)        o = n, or N // 2 for swiglu
  tgmm       lhs (k, m) or (m, k), rhs (m, n), bounds (b), existing_out (g, k, n) -> out (g, k, n), dbias (g, n)
  masked_gmm x (g, m, k), w (g, n, k), masked_m (g) -> out (g, m, n)

A factor takes the mesh axes of the first operand (then result) that shards it, unless an earlier factor took
those axes or the factor must be replicated: k of gmm and masked_gmm (the contraction is not split), b (the
group bounds), and n and o under swiglu (its [gate | up] halves would not stay together). The results are
sharded by their factors' axes. Summed factors (g of gmm: rhs sharded over groups; m of tgmm) are in no
result: each shard computes its part and the parts are summed (psum) into a result replicated over them.

Under `jax.jit` the primitives are `custom_partitioning` functions: the SPMD partitioner calls `partition`,
which keeps every operand in the shards the rule above gives (no all-gather of a sharded factor that the rule
keeps) and runs the backend on each shard's block. Group bounds are global row and group indices, so a shard
rebases them: rows [i * m_local, (i + 1) * m_local) see clip(bounds - i * m_local, 0, m_local), and groups
[i * g_local, (i + 1) * g_local) see bounds[i * g_local : (i + 1) * g_local + 1].

Under explicit sharding (mesh axes of type Explicit) the abstract evaluation gives each result the sharding
of its factors' explicit axes, and the lowering runs the partitioned call with those axes made Auto.
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

_F32 = jnp.dtype(jnp.float32)
_NO_MESH = jax.sharding.AbstractMesh((), ())


class Rule(NamedTuple):
  operands: tuple[tuple[str, ...], ...]  # the factor of each dimension of each operand present
  results: tuple[tuple[str, ...], ...]
  replicated: tuple[str, ...]  # factors never sharded
  summed: tuple[str, ...]  # factors summed over: in operands only


class Static(NamedTuple):
  """What a partitioned call needs besides its operands (hashable: a custom_partitioning static argument)."""
  name: str
  present: tuple[bool, ...]
  params: tuple[tuple[str, object], ...]
  run: object  # run(*operands with None for absent ones, **params) -> list of results


def _gmm_rule(present, *, transpose_rhs, activation, save_preactivation, **_):
  out_n = "o" if activation == "swiglu" else "n"
  operands = (("m", "k"), ("g", "n", "k") if transpose_rhs else ("g", "k", "n"), ("b",), ("g", "n"), ("m", out_n))
  results = (("m", out_n),) + ((("m", "n"),) if save_preactivation else ())
  replicated = ("k", "b") + (("n", "o") if activation == "swiglu" else ())
  return Rule(tuple(o for o, p in zip(operands, present) if p), results, replicated, ("g",))


def _tgmm_rule(present, *, transpose_lhs, bias_grad, **_):
  operands = (("m", "k") if transpose_lhs else ("k", "m"), ("m", "n"), ("b",), ("g", "k", "n"))
  results = (("g", "k", "n"),) + ((("g", "n"),) if bias_grad else ())
  return Rule(tuple(o for o, p in zip(operands, present) if p), results, ("b",), ("m",))


def _masked_gmm_rule(present, **_):
  del present
  return Rule((("g", "m", "k"), ("g", "n", "k"), ("g",)), (("g", "m", "n"),), ("k",), ())


def _groups_only_rule(operands, results):
  """A rule that shards the group factor g alone (every other factor replicated): the masked gradient products.
  Primitives without a rule (the FP8 ops: their scales' ranks vary with the recipe) are left to the SPMD
  partitioner, which gathers their operands."""
  factors = set(sum(operands + results, ())) - {"g"}
  return lambda present, **_: Rule(tuple(d for d, p in zip(operands, present) if p), results, tuple(factors), ())


RULES = {"gmm": _gmm_rule, "tgmm": _tgmm_rule, "masked_gmm": _masked_gmm_rule,
         "masked_gmm_kn": _groups_only_rule((("g", "m", "k"), ("g", "k", "n"), ("g",)), (("g", "m", "n"),)),
         "masked_tgmm": _groups_only_rule((("g", "m", "k"), ("g", "m", "n"), ("g",)), (("g", "k", "n"),))}


def _entry_axes(entry):
  """The mesh axes of one PartitionSpec entry, as a tuple (empty: not sharded)."""
  if isinstance(entry, str):
    return (entry,)
  if isinstance(entry, tuple):
    return tuple(a for a in entry if isinstance(a, str))
  return ()  # None or PartitionSpec.UNCONSTRAINED


def factor_axes(rule, specs):
  """{factor: mesh axes} from the specs of the operands (then results) in `rule` order; first come first served."""
  axes, used = {}, set()
  for dims, spec in zip(rule.operands + rule.results, specs):
    for factor, entry in zip(dims, tuple(spec) + (None,) * len(dims)):
      names = _entry_axes(entry)
      if factor in axes or factor in rule.replicated or not names or used & set(names):
        continue
      axes[factor] = names
      used |= set(names)
  return axes


def _spec(dims, axes):
  return PartitionSpec(*(None if f not in axes else axes[f][0] if len(axes[f]) == 1 else axes[f] for f in dims))


def result_specs(rule, operand_specs):
  """The PartitionSpec of each result, from the operands' specs."""
  axes = factor_axes(rule, operand_specs)
  return [_spec(dims, axes) for dims in rule.results]


def explicit_result_shardings(rule, operand_avals):
  """NamedShardings of the results when an operand is sharded over Explicit mesh axes, else None (also for a
  primitive without a rule)."""
  if rule is None:
    return None
  meshes = {a.sharding.mesh for a in operand_avals if getattr(a.sharding, "mesh", None) is not None}
  meshes = [m for m in meshes if not m.empty and m.explicit_axes]
  if not meshes:
    return None
  if len(meshes) > 1:
    raise ValueError(f"jgmm: operands sharded over different meshes: {meshes}")
  mesh = meshes[0]
  return [NamedSharding(mesh, s) for s in result_specs(rule, [a.sharding.spec for a in operand_avals])]


def without_mesh():
  """A context in which arrays carry no sharding, whatever mesh is set."""
  return jax.sharding.use_abstract_mesh(_NO_MESH)


def reshard_as(x, aval):
  """x with aval's sharding where that is over Explicit mesh axes (a cotangent typed as its primal)."""
  want = aval.sharding
  if not want.mesh.explicit_axes or jax.typeof(x).sharding == want:
    return x
  return jax.sharding.reshard(x, want)


def replicated(x):
  """x replicated where it is sharded over Explicit mesh axes (the group sizes: every shard needs them all)."""
  sharding = jax.typeof(x).sharding
  if not sharding.mesh.explicit_axes or not any(_entry_axes(e) for e in sharding.spec):
    return x
  return jax.sharding.reshard(x, PartitionSpec())


# Per-shard computation.


def _shard_index(names):
  return lax.axis_index(names if len(names) > 1 else names[0])


def _local_rows(bounds, names, m_local):
  """bounds of global rows rebased to this shard's rows [i * m_local, (i + 1) * m_local)."""
  return jnp.clip(bounds - _shard_index(names) * m_local, 0, m_local).astype(bounds.dtype)


def _local_groups(bounds, names, g_local, num_shards):
  """bounds (G + 1,) of all groups -> (g_local + 1,) of this shard's groups; groups past G are empty."""
  padded = jnp.concatenate([bounds, jnp.broadcast_to(bounds[-1:], (g_local * num_shards + 1 - bounds.shape[0],))])
  return lax.dynamic_slice_in_dim(padded, _shard_index(names) * g_local, g_local + 1)


def _num_shards(mesh, names):
  return math.prod(mesh.shape[a] for a in names)


def fill(args, present):
  """The operand list with None in the slots `present` marks empty."""
  args = iter(args)
  return [next(args) if is_present else None for is_present in present]


def _gmm_local(static, mesh, axes, lhs, rhs, bounds, bias, existing_out):
  params = dict(static.params)
  if "m" in axes:
    bounds = _local_rows(bounds, axes["m"], lhs.shape[0])
  if "g" not in axes:
    return static.run(lhs, rhs, bounds, bias, existing_out, **params)
  # rhs holds groups [i * g_local, (i + 1) * g_local): each shard writes its groups' rows, exact zeros elsewhere,
  # and the psum adds them. existing_out's rows go to exactly one shard: its groups' rows, the rows before the
  # first group to shard 0, and the rows after the last group to the last shard.
  names, g_local = axes["g"], rhs.shape[0]
  num_shards = _num_shards(mesh, names)
  bounds = _local_groups(bounds, names, g_local, num_shards)
  if existing_out is not None:
    index, row = _shard_index(names), jnp.arange(lhs.shape[0])
    first = jnp.where(index == 0, 0, bounds[0])
    last = jnp.where(index == num_shards - 1, lhs.shape[0], bounds[-1])
    existing_out = jnp.where(((row >= first) & (row < last))[:, None], existing_out, 0).astype(existing_out.dtype)
  outs = static.run(lhs, rhs, bounds, bias, existing_out, **params)
  return [lax.psum(o, names) for o in outs]


def _tgmm_local(static, mesh, axes, lhs, rhs, bounds, existing_out):
  params = dict(static.params)
  if "g" in axes:
    names = axes["g"]
    num_shards = _num_shards(mesh, names)
    bounds = _local_groups(bounds, names, -(-(bounds.shape[0] - 1) // num_shards), num_shards)
  if "m" not in axes:
    return static.run(lhs, rhs, bounds, existing_out, **params)
  # Each shard's rows give a float32 partial sum; the psum adds them, then existing_out once.
  outs = static.run(lhs, rhs, _local_rows(bounds, axes["m"], rhs.shape[0]), None, **{**params, "out_dtype": _F32})
  outs = [lax.psum(o, axes["m"]) for o in outs]
  out = outs[0] if existing_out is None else existing_out.astype(_F32) + outs[0]
  return [out.astype(params["out_dtype"]), *outs[1:]]


def _masked_gmm_local(static, mesh, axes, x, w, masked_m):
  del mesh
  if "m" in axes:
    masked_m = _local_rows(masked_m, axes["m"], x.shape[1])
  return static.run(x, w, masked_m, **dict(static.params))


def _groups_local(static, mesh, axes, *args):
  del mesh, axes  # Only g is sharded: each shard's groups are a whole problem.
  return static.run(*args, **dict(static.params))


_LOCAL = {"gmm": _gmm_local, "tgmm": _tgmm_local, "masked_gmm": _masked_gmm_local, "masked_gmm_kn": _groups_local,
          "masked_tgmm": _groups_local}


def rule_of(name, present, params):
  """The primitive's Rule, or None where it has none."""
  return RULES[name](present, **params) if name in RULES else None


def _rule(static):
  return RULES[static.name](static.present, **dict(static.params))


def partition(static, mesh, arg_shapes, result_shape):
  """custom_partitioning's partition callback: (mesh, per-shard function, result and operand shardings)."""
  rule = _rule(static)
  specs = [getattr(x.sharding, "spec", ()) for x in (*arg_shapes, *result_shape)]
  axes = factor_axes(rule, specs)
  arg_shardings = tuple(NamedSharding(mesh, _spec(dims, axes)) for dims in rule.operands)
  result_shardings = [NamedSharding(mesh, _spec(dims, axes)) for dims in rule.results]

  def lower_fn(*args):
    # Per-shard arrays carry no sharding, whatever mesh the caller had set when the partitioner calls back.
    with without_mesh():
      return list(_LOCAL[static.name](static, mesh, axes, *fill(args, static.present)))

  return mesh, lower_fn, result_shardings, arg_shardings


def _sharding_rule(static, mesh, operand_types, result_types):
  del mesh, operand_types, result_types
  rule = _rule(static)
  factors = tuple(dict.fromkeys(sum(rule.operands + rule.results, ())))  # In order of appearance, as Shardy wants.
  einsum = ", ".join(" ".join(d) for d in rule.operands) + " -> " + ", ".join(" ".join(d) for d in rule.results)
  return einsum, dict(reduction_factors=tuple(f for f in factors if f in rule.summed),
                      need_replication_factors=tuple(f for f in factors if f in rule.replicated))


def _call(static, *args):
  return static.run(*fill(args, static.present), **dict(static.params))


_partitioned = custom_partitioning(_call, static_argnums=(0,))
_partitioned.def_partition(partition, sharding_rule=_sharding_rule)


def call(name, run, args, present, params, partition=True):
  """run(*operands, **params) on the operands present; partitioned by the rules above when `partition`, else
  left to the SPMD partitioner (which gathers: for host callbacks, which a partitioned call cannot hold).

  Traced under the operands' mesh: the lowering has no context mesh of its own."""
  avals = [jax.typeof(a) for a in args]
  meshes = [a.sharding.mesh for a in avals if not a.sharding.mesh.empty]
  if not meshes:
    return _call_maybe_partitioned(partition, name, run, args, present, params)
  mesh = meshes[0]
  # Inside shard_map (manual axes) the call is left whole: the partitioner does not call back into manual code.
  partition = partition and not mesh.manual_axes
  with jax.sharding.use_abstract_mesh(mesh):
    shardings = explicit_result_shardings(rule_of(name, present, params), avals)
    call = lambda *a: _call_maybe_partitioned(partition, name, run, a, present, params)
    if shardings is None:
      return call(*args)
    # Explicit axes: run with them made Auto (the partitioner shards the call), the results typed by the rule.
    return jax.sharding.auto_axes(call, axes=mesh.explicit_axes, out_sharding=shardings)(*args)


def _call_maybe_partitioned(partition, name, run, args, present, params):
  static = Static(name, present, tuple(sorted(params.items())), run)
  return (_partitioned if partition and name in RULES else _call)(static, *args)
