"""Heterogeneous grouped GEMM: independent products of different (M, N, K), in one kernel launch on GPUs.

    outs = jgmm.grouped_matmul([a0, a1, ...], [b0, b1, ...])     # outs[i] = a_i @ b_i

gmm covers groups that share K and N and sit in one buffer; this is the general case (batched requests of
different lengths, LoRA adapters of different ranks, heads of several tasks), after Triton's grouped-GEMM
tutorial.

FP8: float8_e4m3fn operands (float8_e4m3fnuz on ROCm) with float32 scales, each problem's in gmm's recipes
(jgmm.fp8), all problems in one:

    outs = jgmm.grouped_matmul(lhs_q, rhs_q, lhs_scales=lhs_s, rhs_scales=rhs_s)   # bfloat16 by default

  per row / per channel: lhs_scales[i] (M_i,), rhs_scales[i] (N_i,);
  DeepSeek-V3 blocks: lhs_scales[i] (M_i, cdiv(K_i, 128)) (1x128), rhs_scales[i] (cdiv(N_i, 128), cdiv(K_i, 128))
    (128x128) whatever rhs's layout (jgmm.quantize.quantize(rhs_i, "128x128") of rhs_i (N_i, K_i), or of rhs_i.T).
Store FP8 rhs as (N_i, K_i) with transpose_rhs=True: Hopper's FP8 tensor cores read both operands K-major, and
(K_i, N_i) tiles are transposed in shared memory on the way (as for gmm). No derivatives w.r.t. FP8 operands
(jgmm.fp8_gmm is the FP8 training recipe).

Design. One JAX primitive, grouped_matmul_p, over the operands lhs_0..lhs_{P-1}, rhs_0..rhs_{P-1} (FP8: the lhs
operands, the lhs scales, the rhs operands, the rhs scales: each operand's scales on its side), with params
transpose_lhs (lhs_i stored (K_i, M_i); only the backward uses it), transpose_rhs, scaled, out_dtype, precision,
config and backend. It is bilinear, so it has a JVP rule (f(dA, B) + f(A, dB)) and a transpose rule whose
cotangents are again grouped matmuls of all problems at once (dA_i = dC_i B_i^T, dB_i = A_i^T dC_i, each a
single launch, through transpose_lhs/transpose_rhs instead of transposed copies); jit, grad, jax.jvp and
vmap (a batch of lhs only folds into M: one launch; otherwise a lax.map over the batch) follow.

Lowering: "xla" (the CPU, or backend="xla"): one dense dot per problem (FP8: of the operands dequantised to
float32, as jgmm.fp8's portable backend does). "triton" (CUDA/ROCm, or the CPU
under TRITON_INTERPRET=1): one persistent kernel (triton_kernels/grouped_matmul.py) over the tiles of all
problems, each operand and output its own buffer: jgmm.ffi passes the lists as Triton tuple params (one
pointer param each), and a static int32 table (built at trace time: shapes are static) maps tiles to
problems (FP8: grouped_matmul_fp8_kernel, the scales in two more tuple params; on sm_90 where TMA reads every
problem, grouped_matmul_fp8_ws_kernel, warp-specialised, over the same table). Empty problems (M, N or K = 0)
never reach the kernel: they are zeros. A launch takes at most MAX_PROBLEMS_PER_LAUNCH problems (three 8-byte
pointer params each), MAX_FP8_PROBLEMS_PER_LAUNCH with FP8 (five); more problems take more launches.
"""
import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jgmm import backend_xla, validation
from jgmm.config import Config

# CUDA limits a kernel's params to 4 KiB; the per-problem pointers take at most 3 KiB of them (the rest: the
# table's pointer and Triton's scratch pointers).
_POINTER_PARAM_BYTES = 3 * 1024
MAX_PROBLEMS_PER_LAUNCH = _POINTER_PARAM_BYTES // (3 * 8)  # 128: lhs, rhs and out pointers
MAX_FP8_PROBLEMS_PER_LAUNCH = _POINTER_PARAM_BYTES // (5 * 8)  # 76: and the two scales' pointers
_TRITON_PLATFORMS = ("cuda", "rocm")


def grouped_matmul(lhs_list: Sequence[jax.Array], rhs_list: Sequence[jax.Array], *,
                   lhs_scales: Sequence[jax.Array] | None = None, rhs_scales: Sequence[jax.Array] | None = None,
                   transpose_rhs: bool = False, preferred_element_type: jnp.dtype | None = None,
                   precision: lax.PrecisionLike = None, config: Config | dict | None = None,
                   backend: str | None = None) -> list[jax.Array]:
  """Independent matrix products of different sizes: outs[i] = lhs_list[i] @ rhs_list[i].

  Args:
    lhs_list: P >= 1 arrays, lhs_i (M_i, K_i), float32, bfloat16 or float16 (all one dtype), or FP8
      (float8_e4m3fn, float8_e4m3fnuz on ROCm) with lhs_scales and rhs_scales.
    rhs_list: P arrays, rhs_i (K_i, N_i), or (N_i, K_i) when transpose_rhs (out_i = lhs_i @ rhs_i.T); lhs's dtype.
    lhs_scales, rhs_scales: with FP8 operands, P float32 arrays each: lhs_i stands for lhs_i * lhs_scales[i] and
      rhs_i for rhs_i * rhs_scales[i], each scale over its block (jgmm.quantize makes them): lhs_scales[i] (M_i,)
      per row or (M_i, cdiv(K_i, 128)) per 1x128 block; rhs_scales[i] (N_i,) per channel or
      (cdiv(N_i, 128), cdiv(K_i, 128)) per 128x128 block, whatever rhs's layout. As for gmm, the lhs and rhs
      recipes may differ; all problems take the same pair.
    transpose_rhs: the layout of every rhs_i.
    preferred_element_type: the outputs' dtype (float32, bfloat16, float16), default the inputs' dtype
      (bfloat16 for FP8); products accumulate in float32 either way.
    precision: as jax.lax.dot's; lax.Precision.HIGHEST (or "highest", F32_F32_F32) makes the Triton kernel
      multiply float32 inputs exactly instead of on TF32 tensor cores (as jax.default_matmul_precision does).
      None with FP8.
    config: a jgmm.Config (or a dict of its fields) for the Triton kernel: block_m/block_n/block_k tile every
      problem, num_warps, num_stages, programs_per_sm (the persistent grid); None picks one from the largest
      problem's shape. With FP8 on sm_90, warp_specialized picks the warp-specialised kernel where it applies
      (rhs (N_i, K_i), every K_i and output row a 16-byte multiple; 128 x 128 x 128 tiles, num_stages stages).
      Other fields do not apply.
    backend: None (Triton on GPUs, XLA elsewhere), "triton" or "xla" (one dense dot per problem).

  Returns:
    A list of P arrays, out_i (M_i, N_i). Any M_i, N_i, K_i may be 0 (K_i = 0 gives zeros).

  jit, grad, jax.jvp and vmap apply; FP8 calls have no derivative (NotImplementedError: jgmm.fp8_gmm trains in
  FP8).
  """
  scaled, out_dtype, precision, config, backend = validation.check_grouped_matmul(
      lhs_list, rhs_list, lhs_scales, rhs_scales, transpose_rhs, preferred_element_type, precision, config, backend)
  operands = (*lhs_list, *lhs_scales, *rhs_list, *rhs_scales) if scaled else (*lhs_list, *rhs_list)
  return grouped_matmul_p.bind(*operands, transpose_lhs=False, transpose_rhs=transpose_rhs, scaled=scaled,
                               out_dtype=out_dtype, precision=precision, config=config, backend=backend)


# ---------------------------------------------------------------------------------------------------------------
# The primitive


def _split(operands):
  """The halves of the operands: lhs and rhs, or for a scaled call its lhs side (lhs, lhs_scales) and rhs side."""
  return operands[:len(operands) // 2], operands[len(operands) // 2:]


def _unpack(operands, scaled):
  """(lhs, rhs, scales) lists of P operands, scales = (lhs_scales, rhs_scales) if scaled else None."""
  lhs_side, rhs_side = _split(operands)
  if not scaled:
    return lhs_side, rhs_side, None
  lhs, lhs_scales = _split(lhs_side)
  rhs, rhs_scales = _split(rhs_side)
  return lhs, rhs, (lhs_scales, rhs_scales)


def _problem_shape(lhs_shape, rhs_shape, transpose_lhs, transpose_rhs):
  """(M, N, K) of one problem."""
  m, k = lhs_shape[::-1] if transpose_lhs else lhs_shape
  n = rhs_shape[0] if transpose_rhs else rhs_shape[1]
  return m, n, k


grouped_matmul_p = Primitive("jgmm_grouped_matmul")
grouped_matmul_p.multiple_results = True
grouped_matmul_p.def_impl(lambda *args, **params: dispatch.apply_primitive(grouped_matmul_p, *args, **params))


@grouped_matmul_p.def_abstract_eval
def _abstract_eval(*avals, transpose_lhs, transpose_rhs, scaled, out_dtype, precision, config, backend):
  del precision, config, backend
  lhs, rhs, _ = _unpack(avals, scaled)
  return [jax.core.ShapedArray(_problem_shape(a.shape, b.shape, transpose_lhs, transpose_rhs)[:2], out_dtype)
          for a, b in zip(lhs, rhs)]


def _bind(lhs, rhs, transpose_lhs, transpose_rhs, out_dtype, precision, config, backend):
  """An unscaled call."""
  return grouped_matmul_p.bind(*lhs, *rhs, transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs, scaled=False,
                               out_dtype=out_dtype, precision=precision, config=config, backend=backend)


def _jvp(primals, tangents, **params):
  """f is bilinear: df = f(dA, B) + f(A, dB), each term one grouped call (omitted where its tangents are zero).
  FP8 calls have no derivative."""
  if params["scaled"]:
    raise NotImplementedError(
        "jgmm.grouped_matmul has no derivative w.r.t. FP8 operands or their scales (inputs of a training recipe, "
        "as for jgmm.gmm's FP8 path): differentiate jgmm.fp8_gmm, which quantises bfloat16/float32 operands and "
        "computes forward and backward in FP8, or wrap the FP8 operands in jax.lax.stop_gradient")
  lhs, rhs = _split(primals)
  dlhs, drhs = _split(tangents)
  outs = grouped_matmul_p.bind(*primals, **params)
  terms = []
  if any(type(t) is not ad.Zero for t in dlhs):
    terms.append(grouped_matmul_p.bind(*map(ad.instantiate_zeros, dlhs), *rhs, **params))
  if any(type(t) is not ad.Zero for t in drhs):
    terms.append(grouped_matmul_p.bind(*lhs, *map(ad.instantiate_zeros, drhs), **params))
  return outs, [sum(parts[1:], parts[0]) for parts in zip(*terms)]


def _transpose(cts, *operands, transpose_lhs, transpose_rhs, scaled, out_dtype, precision, config, backend):
  """Cotangents of the undefined operands (all lhs_i or all rhs_i that are undefined): one grouped call.

    With A_i (M, K), B_i (K, N) the logical operands and dC_i (M, N): dA_i = dC_i B_i^T and dB_i = A_i^T dC_i,
    written in the layouts the operands are stored in. Cotangents are cast to the operands' dtype. Unscaled calls
    only (scaled ones have no JVP to transpose).
    """
  del scaled, out_dtype, config
  lhs, rhs = _split(operands)
  wanted_lhs = [i for i, x in enumerate(lhs) if ad.is_undefined_primal(x)]
  wanted_rhs = [i for i, x in enumerate(rhs) if ad.is_undefined_primal(x)]
  if wanted_lhs and wanted_rhs:
    raise NotImplementedError("grouped_matmul is bilinear: transposing it w.r.t. lhs and rhs at once is undefined")
  wanted = wanted_lhs or wanted_rhs
  undefined = lhs if wanted_lhs else rhs
  dtype = undefined[wanted[0]].aval.dtype
  dc = [ad.instantiate_zeros(cts[i]).astype(dtype) for i in wanted]
  a, b = [lhs[i] for i in wanted], [rhs[i] for i in wanted]
  call = dict(out_dtype=dtype, precision=precision, config=None, backend=backend)
  if wanted_lhs:
    grads = (_bind(b, dc, transpose_rhs, True, **call) if transpose_lhs else
             _bind(dc, b, False, not transpose_rhs, **call))
  else:
    grads = (_bind(dc, a, True, transpose_lhs, **call) if transpose_rhs else
             _bind(a, dc, not transpose_lhs, False, **call))
  result = [None] * len(operands)
  offset = 0 if wanted_lhs else len(lhs)
  for i, grad in zip(wanted, grads):
    result[offset + i] = grad
  return result


ad.primitive_jvps[grouped_matmul_p] = _jvp
ad.primitive_transposes[grouped_matmul_p] = _transpose


def _batch(operands, dims, *, transpose_lhs, transpose_rhs, **params):
  """vmap: a batch over the lhs side only (lhs and its scales, untransposed) folds into M (one call); anything
  else maps over the batch."""
  lhs_side, rhs_side = _split(operands)
  lhs_dims, rhs_dims = _split(dims)
  size = next(x.shape[d] for x, d in zip(operands, dims) if d is not None)
  if all(d is None for d in rhs_dims) and not transpose_lhs:
    lhs_side = [jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
                for x, d in zip(lhs_side, lhs_dims)]  # (size, M_i, ...), folded to (size * M_i, ...)
    outs = grouped_matmul_p.bind(*[x.reshape(-1, *x.shape[2:]) for x in lhs_side], *rhs_side, transpose_lhs=False,
                                 transpose_rhs=transpose_rhs, **params)
    return [o.reshape(size, -1, o.shape[-1]) for o in outs], [0] * len(outs)

  def one(slices):
    slices = iter(slices)
    return grouped_matmul_p.bind(*[x if d is None else next(slices) for x, d in zip(operands, dims)],
                                 transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs, **params)

  outs = lax.map(one, [jnp.moveaxis(x, d, 0) for x, d in zip(operands, dims) if d is not None])
  return outs, [0] * len(outs)


batching.primitive_batchers[grouped_matmul_p] = _batch

# ---------------------------------------------------------------------------------------------------------------
# Lowerings


def _xla(lhs, rhs, scales, transpose_lhs, transpose_rhs, out_dtype, precision, config):
  """One dense dot per problem; FP8 operands (scales = (lhs_scales, rhs_scales)) dequantised to float32 first, then
  multiplied exactly."""
  del config
  if scales is not None:
    lhs, rhs = zip(*[backend_xla.dequantized(*operands, transpose_rhs) for operands in zip(lhs, rhs, *scales)])
    transpose_rhs, precision = True, "highest"
  contract = (((0 if transpose_lhs else 1,), (1 if transpose_rhs else 0,)), ((), ()))
  return [lax.dot_general(a, b, contract, precision=precision and lax.Precision.HIGHEST,
                          preferred_element_type=out_dtype).astype(out_dtype) for a, b in zip(lhs, rhs)]


def _default_config(shapes, dtype, out_dtype, transpose_rhs, recipe, device):
  """The config gmm would take for the largest problem's (M, K, N) as one group (JGMM_CONFIG, the tuned table or
  the heuristic; FP8 gmm's for the scale recipe's name `recipe`), its tile shrunk to the largest M and N, without
  gmm's tail_split (these kernels run every tile whole; a tile under 128 columns cannot take it)."""
  from jgmm import config_table
  from jgmm.triton_kernels import geometry
  max_m, max_n, max_k = (max(s[d] for s in shapes) for d in range(3))
  op = ("gmm_t" if transpose_rhs else "gmm") + ("_fp8" if recipe else "")
  key = config_table.make_key(op, dtype.name, out_dtype.name, max_m, max_k, max_n, 1, transpose=transpose_rhs,
                              scale=recipe)
  choice = config_table.select(key, arch=device.arch, device_kind=device.kind)
  config = choice.config if choice.backend == "triton" else config_table.heuristic_config(key, device.arch)
  return dataclasses.replace(config, block_m=min(config.block_m, max(16, geometry.next_pow2(max_m))),
                             block_n=min(config.block_n, max(16, geometry.next_pow2(max_n))), tail_split=False)


def _fp8_ws_ok(shapes, out_dtype, transpose_rhs, config, device):
  """Whether FP8 problems run grouped_matmul_fp8_ws_kernel: rhs stored (N_i, K_i), and every problem one that FP8
  gmm's warp-specialised kernel would run with config in its 128 x 128 x 128 tiles (backend_triton._fp8_ws_ok)."""
  from jgmm import backend_triton
  tiles = dataclasses.replace(config, block_m=128, block_n=128, block_k=128)
  return transpose_rhs and all(backend_triton._fp8_ws_ok(tiles, device, m, k, n, 1, jnp.dtype(out_dtype))
                               for m, n, k in shapes)


def _problem_table(shapes, config):
  """grouped_matmul_kernel's int32 (6, P_POW2) table (slots sorted by decreasing K; P_POW2 at least a warp's 32
  lanes, geometry.group_table_lanes: the kernel reduces over it once a tile) and its tile count."""
  from jgmm.triton_kernels import geometry
  from jgmm.triton_kernels import grouped_matmul as kernels
  order = sorted(range(len(shapes)), key=lambda p: -shapes[p][2])
  table = np.zeros((kernels.TABLE_FIELDS, geometry.group_table_lanes(len(shapes))), np.int32)
  table[0] = 2**31 - 1
  tiles = np.array([geometry.cdiv(shapes[p][0], config.block_m) * geometry.cdiv(shapes[p][1], config.block_n)
                    for p in order], np.int64)
  ends = np.cumsum(tiles)
  for field, values in enumerate((ends, ends - tiles, order, *zip(*[shapes[p] for p in order]))):
    table[field, :len(shapes)] = values
  return table, int(ends[-1])


def _power_of_2_dividing(values):
  """The largest power of 2, at most 16, that divides every one of `values`."""
  common = math.gcd(*values)
  return min(16, common & -common)


def _launch_fp8_ws(lhs, rhs, scales, shapes, out_dtype, config, device, flags):
  """One grouped_matmul_fp8_ws_kernel launch (where _fp8_ws_ok) over problems with M, N, K >= 1."""
  from jgmm import ffi
  from jgmm.triton_kernels import gmm_fp8_ws, gmm_ws
  from jgmm.triton_kernels import grouped_matmul_fp8_ws as kernels
  block, half = gmm_fp8_ws.BLOCK.value, gmm_ws.HALF.value
  table, num_tiles = _problem_table(shapes, dataclasses.replace(config, block_m=block, block_n=block))
  if flags["LHS_BLOCKS"]:  # The kernel reads a step's 1x128 lhs block scales by TMA: transposed (KB_p, M_p to 4).
    scales = ([jnp.pad(s.T, ((0, 0), (0, -s.shape[0] % 4))) for s in scales[0]], scales[1])
  return ffi.triton_call(
      tuple(lhs), tuple(rhs), *map(tuple, scales), jnp.asarray(table), kernel=kernels.grouped_matmul_fp8_ws_kernel,
      out_shape=[tuple(jax.ShapeDtypeStruct((m, n), out_dtype) for m, n, _ in shapes)],
      grid=(min(num_tiles, device.num_sms),), num_warps=gmm_fp8_ws.NUM_WARPS, maxnreg=gmm_fp8_ws.MAXNREG[2],
      name="jgmm_grouped_matmul_fp8_ws", P=len(shapes), P_POW2=table.shape[1], NUM_TILES=num_tiles,
      S=config.num_stages, LHS_LAYOUT=gmm_ws.shared_layout((half, block), lhs[0].dtype.name),
      RHS_LAYOUT=gmm_ws.shared_layout((block, block), rhs[0].dtype.name),
      OUT_LAYOUT=gmm_ws.shared_layout((half, block), jnp.dtype(out_dtype).name), **flags)[0]


def _launch(lhs, rhs, scales, shapes, transpose_lhs, transpose_rhs, out_dtype, precision, config, device):
  """One grouped_matmul_kernel launch over problems with M, N, K >= 1; with scales = (lhs_scales, rhs_scales),
  grouped_matmul_fp8_ws_kernel's where _fp8_ws_ok, else grouped_matmul_fp8_kernel's, its block_k at most one
  128-wide scale block."""
  from jgmm import backend_triton, config_table, ffi
  from jgmm.triton_kernels import grouped_matmul as kernels
  if scales is None:
    kernel, name, recipe = kernels.grouped_matmul_kernel, "jgmm_grouped_matmul", None
    flags = {"TRANSPOSE_LHS": transpose_lhs}
  else:
    kernel, name = kernels.grouped_matmul_fp8_kernel, "jgmm_grouped_matmul_fp8"
    flags = {"LHS_BLOCKS": scales[0][0].ndim == 2, "RHS_BLOCKS": scales[1][0].ndim == 2}
    recipe = backend_triton.fp8_recipe(flags["LHS_BLOCKS"], flags["RHS_BLOCKS"])
    backend_triton.check_fp8_format(lhs[0].dtype, device)
  default = config is None
  config = config or _default_config(shapes, lhs[0].dtype, out_dtype, transpose_rhs, recipe, device)
  if scales is not None:
    if _fp8_ws_ok(shapes, out_dtype, transpose_rhs, config, device):
      return _launch_fp8_ws(lhs, rhs, scales, shapes, out_dtype, config, device, flags)
    if default and config.warp_specialized:
      # The plain kernel comes nearest to the ws kernel's two consumer warpgroups per SM with two programs of one
      # warpgroup per SM (prefill16-fp8 on an H100: 1.05-1.19x its 128-row tiles of 8 warps).
      config = dataclasses.replace(config, block_m=min(config.block_m, 64), num_warps=4, programs_per_sm=2,
                                   warp_specialized=False)
    config = config_table.within_scale_block(config)
  table, num_tiles = _problem_table(shapes, config)
  m_multiple, n_multiple, k_multiple = (_power_of_2_dividing([s[d] for s in shapes]) for d in range(3))
  widest_block = max(config.block_m, config.block_n, config.block_k)
  return ffi.triton_call(
      tuple(lhs), tuple(rhs), *map(tuple, scales or ()), jnp.asarray(table), kernel=kernel,
      out_shape=[tuple(jax.ShapeDtypeStruct((m, n), out_dtype) for m, n, _ in shapes)],
      grid=(min(num_tiles, config.programs_per_sm * device.num_sms),), num_warps=config.num_warps,
      num_stages=config.num_stages, name=name,
      P=len(shapes), P_POW2=table.shape[1], NUM_TILES=num_tiles, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
      BLOCK_K=config.block_k, GROUP_M=8, TRANSPOSE_RHS=transpose_rhs,
      M_MULTIPLE=m_multiple, N_MULTIPLE=n_multiple, K_MULTIPLE=k_multiple,
      OFFSET_64=widest_block * max(max(shape) for shape in shapes) >= 2**31,
      DOT_PRECISION=backend_triton._dot_precision(precision), **flags)[0]


def _triton(lhs, rhs, scales, transpose_lhs, transpose_rhs, out_dtype, precision, config):
  """Zeros for the empty problems, the others in launches of at most MAX_PROBLEMS_PER_LAUNCH problems
  (MAX_FP8_PROBLEMS_PER_LAUNCH with scales = (lhs_scales, rhs_scales))."""
  from jgmm import backend_triton
  shapes = [_problem_shape(a.shape, b.shape, transpose_lhs, transpose_rhs) for a, b in zip(lhs, rhs)]
  outs = [jnp.zeros((m, n), out_dtype) for m, n, _ in shapes]
  live = [p for p, shape in enumerate(shapes) if min(shape) > 0]
  device = backend_triton._device() if live else None
  limit = MAX_PROBLEMS_PER_LAUNCH if scales is None else MAX_FP8_PROBLEMS_PER_LAUNCH
  for start in range(0, len(live), limit):
    chunk = live[start:start + limit]
    pick = lambda arrays: [arrays[p] for p in chunk]
    results = _launch(pick(lhs), pick(rhs), scales and tuple(map(pick, scales)), pick(shapes), transpose_lhs,
                      transpose_rhs, out_dtype, precision, config, device)
    for p, out in zip(chunk, results):
      outs[p] = out
  return outs


def _lowering(platform):
  def run(*operands, transpose_lhs, transpose_rhs, scaled, out_dtype, precision, config, backend):
    use_triton = backend == "triton" or (backend is None and platform in _TRITON_PLATFORMS)
    return (_triton if use_triton else _xla)(*_unpack(operands, scaled), transpose_lhs, transpose_rhs, out_dtype,
                                             precision, config)
  return mlir.lower_fun(run, multiple_results=True)


for _platform in ("cpu", *_TRITON_PLATFORMS):
  mlir.register_lowering(grouped_matmul_p, _lowering(_platform), platform=_platform)
mlir.register_lowering(grouped_matmul_p, _lowering(None))
