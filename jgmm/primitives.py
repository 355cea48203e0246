"""The JAX primitives behind jgmm's ops: abstract evaluation, batching, and a lowering per platform.

Each primitive has a backend function of the same name in `backend_triton` (Triton kernels through XLA
custom calls) and in `backend_xla` (pure JAX). The lowering picks one by the `backend` parameter: "xla",
"triton", or None = Triton on "cuda"/"rocm" and the portable implementation elsewhere. Triton on a
platform without Triton (the CPU) raises a clear error from jgmm.ffi unless TRITON_INTERPRET=1.

Optional operands (bias, existing_out) are left out of the bind; `present` records which slots are filled.
Operands are cast to vary over the same shard_map mesh axes before each bind (no-op outside shard_map), so the
outputs vary over them too. Symbolic (jax.export shape-polymorphic) shapes lower through the portable
implementation: Triton kernels are compiled for static shapes. Derivative rules: jgmm/autodiff.py. Sharding
(result shardings under explicit sharding, SPMD partitioning of the lowering): jgmm/partitioning.py.
"""
import functools
import importlib

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import core, dispatch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jgmm import backend_xla, partitioning
from jgmm.partitioning import fill

_TRITON_PLATFORMS = ("cuda", "rocm")


def _backend_module(backend, platform, static_shapes):
  if backend is None:
    backend = "triton" if platform in _TRITON_PLATFORMS and static_shapes else "xla"
  if backend == "triton" and not static_shapes:
    raise ValueError("backend='triton' needs static shapes (Triton kernels are compiled for them); got symbolic "
                     "dimensions (jax.export shape polymorphism): pass backend=None or 'xla' to use the portable "
                     "implementation for them")
  if backend == "xla":
    return backend_xla
  try:  # Imports triton: only where a Triton lowering is asked for.
    return importlib.import_module("jgmm.backend_triton")
  except ModuleNotFoundError as e:
    if e.name != "triton" and not (e.name or "").startswith("triton."):
      raise
    raise ModuleNotFoundError(
        f"jgmm's Triton backend (backend='triton', or the default on a {platform!r} GPU) needs the triton package, "
        "which is not installed: pip install triton (Linux; jgmm installs it there, with jax's CUDA plugin through "
        "pip install 'jgmm[cuda]'), or pass backend='xla' for the portable implementation", name=e.name) from e


@functools.cache
def backend_runner(name, platform):
  """run(*operands, backend, **params) -> list of results: `<backend>.<name>` as lowered for `platform`."""
  def run(*args, backend, **params):
    static_shapes = all(core.is_constant_shape(a.shape) for a in args if a is not None)
    out = getattr(_backend_module(backend, platform, static_shapes), name)(*args, **params)
    return list(out) if isinstance(out, tuple) else [out]
  return run


def _vary_alike(*arrays):
  """Casts arrays (None allowed) to vary over the union of their shard_map mesh axes (no-op outside one)."""
  varying = lambda a: jax.typeof(a).mat.varying
  axes = frozenset().union(*(varying(a) for a in arrays if a is not None))
  return [a if a is None or not axes - varying(a) else lax.pcast(a, tuple(axes - varying(a)), to="varying")
          for a in arrays]


def _define(name, abstract_eval):
  """A multiple-results primitive calling `<backend>.<name>(*operands, **params)`; returns its bind function,
  with the Primitive as its `primitive` attribute."""
  prim = Primitive(f"jgmm_{name}")
  prim.multiple_results = True
  prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
  dispatch.prim_requires_devices_during_lowering.add(prim)  # The lowering may emit a custom_partitioning call.

  def shapes(*avals, present, backend, **params):
    del backend
    outs = abstract_eval(*fill(avals, present), **params)
    # Sharded over Explicit mesh axes: the results are sharded as jgmm/partitioning.py's rules say.
    shardings = partitioning.explicit_result_shardings(partitioning.rule_of(name, present, params), avals)
    mat = avals[0].mat
    if shardings is None and not mat.varying:
      return outs
    # Inside shard_map: the operands vary over the same manual mesh axes (bind casts them); so do the outputs.
    shardings = shardings or [core.get_cur_mesh_sharding()] * len(outs)
    return [core.ShapedArray(o.shape, o.dtype, sharding=s, manual_axis_type=mat) for o, s in zip(outs, shardings)]

  prim.def_abstract_eval(shapes)

  def lower(platform):
    def run(*args, present, exporting, **params):
      # Triton off its GPU platforms runs in the interpreter, through host callbacks: not partitioned. Nor is
      # a call that jax.export serialises (a custom_partitioning call cannot be exported), which also runs the
      # portable implementation unless backend="triton" asks otherwise: an exported artifact then holds no
      # Triton binary built for one GPU model (and jax.export refuses Triton's custom call by default).
      if exporting and params["backend"] is None:
        params = dict(params, backend="xla")
      static_shapes = all(core.is_constant_shape(a.shape) for a in args)
      interpreted = (_backend_module(params["backend"], platform, static_shapes) is not backend_xla
                     and platform not in _TRITON_PLATFORMS)
      return partitioning.call(name, backend_runner(name, platform), args, present, params,
                               partition=not (interpreted or exporting))

    def rule(ctx, *args, **params):
      exporting = ctx.module_context.lowering_parameters.for_export
      return mlir.lower_fun(functools.partial(run, exporting=exporting), multiple_results=True)(ctx, *args, **params)
    return rule

  for platform in ("cpu", *_TRITON_PLATFORMS):
    mlir.register_lowering(prim, lower(platform), platform=platform)
  mlir.register_lowering(prim, lower(None))  # Any other platform: the portable implementation.

  def batch(args, dims, **params):
    # One call per batch element: lax.map over the batched operands, the others closed over.
    mapped = [jnp.moveaxis(a, d, 0) for a, d in zip(args, dims) if d is not None]

    def one(slices):
      slices = iter(slices)
      return prim.bind(*[a if d is None else next(slices) for a, d in zip(args, dims)], **params)

    outs = lax.map(one, mapped)
    return outs, [0] * len(outs)

  batching.primitive_batchers[prim] = batch

  def bind(*args, backend, **params):
    present = tuple(a is not None for a in args)
    operands = [a for a in _vary_alike(*args) if a is not None]
    return prim.bind(*operands, present=present, backend=backend, **params)

  bind.primitive = prim
  return bind


def _gmm_shapes(lhs, rhs, bounds, bias, existing_out, *, transpose_rhs, out_dtype, activation,
                save_preactivation, precision, config):
  del bounds, bias, existing_out, precision, config
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  m = lhs.shape[0]
  out = jax.core.ShapedArray((m, n // 2 if activation == "swiglu" else n), out_dtype)
  return [out, jax.core.ShapedArray((m, n), out_dtype)] if save_preactivation else [out]


def _tgmm_shapes(lhs, rhs, bounds, existing_out, *, transpose_lhs, out_dtype, bias_grad, precision, config):
  del existing_out, precision, config
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  num_groups, n = bounds.shape[0] - 1, rhs.shape[1]
  out = jax.core.ShapedArray((num_groups, k, n), out_dtype)
  return [out, jax.core.ShapedArray((num_groups, n), jnp.float32)] if bias_grad else [out]


def _masked_gmm_shapes(x, w, masked_m, *, out_dtype, expected_m, precision, config):
  del masked_m, expected_m, precision, config
  return [jax.core.ShapedArray((*x.shape[:2], w.shape[1]), out_dtype)]


def _masked_gmm_kn_shapes(x, w, masked_m, *, out_dtype, expected_m, precision, config):
  del masked_m, expected_m, precision, config
  return [jax.core.ShapedArray((*x.shape[:2], w.shape[2]), out_dtype)]


def _masked_tgmm_shapes(lhs, rhs, masked_m, *, out_dtype, precision, config):
  del masked_m, precision, config
  return [jax.core.ShapedArray((lhs.shape[0], lhs.shape[2], rhs.shape[2]), out_dtype)]


gmm = _define("gmm", _gmm_shapes)
tgmm = _define("tgmm", _tgmm_shapes)
masked_gmm = _define("masked_gmm", _masked_gmm_shapes)
# masked_gmm's gradients (w read in place): dx = masked_gmm_kn(dout, w) (w (G, N, K) read as (G, K', N')),
# dw = masked_tgmm(dout, x) (G, N, K); masked_m clipped to [0, max_m] by the caller.
masked_gmm_kn = _define("masked_gmm_kn", _masked_gmm_kn_shapes)
masked_tgmm = _define("masked_tgmm", _masked_tgmm_shapes)
