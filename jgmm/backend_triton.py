"""Triton backend: gmm, tgmm and masked_gmm as Triton kernels called through XLA custom calls (jgmm.ffi).

Same signatures and semantics as backend_xla. Called while lowering (inside jit), so only static shapes
and dtypes steer Python here; runtime values (bounds, masked_m) are read by the kernels alone, which never
read or write out of bounds whatever they hold.

The GPU the kernels are built for: JGMM_TARGET (e.g. cuda:90, which also lets a CPU-only machine lower
for a GPU), else the first GPU jax sees, else Triton's interpreter (TRITON_INTERPRET=1 on the CPU).
"""
import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_xla, config_table, ffi, quantize
from jgmm import config as config_lib
from jgmm.triton_kernels import geometry
from jgmm.triton_kernels import gmm as gmm_kernels
from jgmm.triton_kernels import gmm_fp8 as fp8_kernels
from jgmm.triton_kernels import gmm_fp8_ws
from jgmm.triton_kernels import gmm_fp8_ws_cluster
from jgmm.triton_kernels import gmm_ws
from jgmm.triton_kernels import gmm_ws_cluster
from jgmm.triton_kernels import quantize as quantize_kernels
from jgmm.triton_kernels import tgmm_fp8_ws
from jgmm.triton_kernels import tgmm as tgmm_kernels
from jgmm.triton_kernels import tgmm_ws

_DEFAULT_NUM_SMS = {90: 132, 80: 108}  # When lowering for JGMM_TARGET without such a GPU present.
_INTERPRETER_PROGRAMS = 4  # Programs of a persistent grid under the interpreter (each runs in turn).


@dataclasses.dataclass(frozen=True)
class _Device:
  arch: str | None  # "sm90", "gfx942", ...; None under the interpreter
  kind: str | None  # the GPU's model (jax.Device.device_kind), None where no GPU is present
  num_sms: int
  tma: bool  # whether gmm/masked_gmm may load through host-side tensor descriptors (TMA)

  @property
  def cuda(self) -> bool:
    return (self.arch or "").startswith("sm")


def _host_tma(capability):
  """Whether this CUDA device and jaxlib support host-side tensor descriptors (sm_90+, jaxlib >= 0.11)."""
  from jgmm.ffi import _jaxlib
  try:
    return capability >= 90 and _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda"))
  except RuntimeError:
    return False


def _descriptors(use_tma, lhs, lhs_block, rhs, rhs_view, rhs_block):
  """The tensor-descriptor args of gmm_kernel/masked_gmm_kernel: TMA descriptors over lhs and rhs viewed as
  rhs_view, or the plain arrays (unused by the kernel) on the pointer path."""
  if not use_tma:
    return lhs, rhs
  return ffi.TensorDescriptor(lhs, lhs_block), ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block)


def _row_tiles(bounds, m, row_tiles, block_m):
  """gmm_ws_kernel's schedule (1 + 6 * row_tiles,) int32: [row tiles in use R; per row tile r < row_tiles
  (meaningful for r < R) its group, first row, rows of its group in it, rows to store, the first row tile of its
  region (its group, or the rows before or after the groups) and the region's row tiles].

  Tiles of block_m rows cover each group's rows in turn, and the rows before the first group and after the last
  (rows of no group: 0 rows of a group, zeros to store). row_tiles >= cdiv(m, block_m) + G + 1 holds them all,
  whatever the (sanitised) bounds."""
  num_groups = bounds.shape[0] - 1
  # Regions: rows before the groups, the groups, rows after them.
  starts = jnp.concatenate([jnp.zeros(1, jnp.int32), bounds])
  ends = jnp.concatenate([bounds, jnp.full((1,), m, jnp.int32)])
  tiles = (ends - starts + block_m - 1) // block_m
  tiles_end = jnp.cumsum(tiles)
  r = jnp.arange(row_tiles, dtype=jnp.int32)
  region = jnp.minimum(jnp.sum(tiles_end[None, :] <= r[:, None], axis=1, dtype=jnp.int32), num_groups + 1)
  row0 = starts[region] + (r - (tiles_end - tiles)[region]) * block_m
  store_rows = jnp.clip(ends[region] - row0, 0, block_m)
  in_group = (region >= 1) & (region <= num_groups)
  group = jnp.clip(region - 1, 0, num_groups - 1)
  return jnp.concatenate([tiles_end[-1:], group, row0, jnp.where(in_group, store_rows, 0), store_rows,
                          (tiles_end - tiles)[region], tiles[region]])


def _gmm_ws(lhs, rhs, bounds, transpose_rhs, out_dtype, config, device):
  """gmm through gmm_ws_kernel (the caller checked that it applies; its last round in column halves where
  config.tail_split), or through gmm_ws_cluster_kernel on clusters of 2 CTAs where config.cluster_size is 2,
  config.block_n 128 or 256 and Triton has it (gmm_ws_cluster.supported)."""
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  row_tiles = geometry.cdiv(m, gmm_ws.BLOCK_M) + num_groups + 1
  cluster = config.cluster_size == 2 and config.block_n in (128, 256) and gmm_ws_cluster.supported()
  ctas = 2 if cluster else 1
  cols = ctas * config.block_n  # Columns of a program's (a cluster's) tile.

  def layout(block, dtype, cga):  # cga: how a cluster's CTAs share the box (gmm_ws_cluster's docstring).
    return gmm_ws.shared_layout(block, dtype.name, cga if cluster else None)

  def rhs_box(columns):
    return (columns, config.block_k) if transpose_rhs else (config.block_k, columns)

  lhs_block = (gmm_ws.HALF.value, config.block_k)
  rhs_view = (num_groups * n, k) if transpose_rhs else (num_groups * k, n)
  rhs_block = rhs_box(cols)
  out_block = (gmm_ws.HALF.value, cols)
  rhs_desc = ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block, layout=layout(
      rhs_block, rhs.dtype, gmm_ws_cluster.ROW_SPLIT if transpose_rhs else gmm_ws_cluster.COL_SPLIT))
  schedule = _row_tiles(bounds, m, row_tiles, gmm_ws.BLOCK_M)
  if cluster:
    kernel, descriptors, split = gmm_ws_cluster.gmm_ws_cluster_kernel, (rhs_desc,), {}
  else:  # The half tiles' rhs boxes (config.tail_split; Config keeps them 64 columns or more, the same layout);
    # without the split the schedule stands in, a placeholder the kernel never touches.
    rhs_half_desc = schedule
    if config.tail_split:
      half_block = rhs_box(cols // 2)
      rhs_half_desc = ffi.TensorDescriptor(rhs.reshape(rhs_view), half_block,
                                           layout=layout(half_block, rhs.dtype, None))
    kernel, descriptors, split = gmm_ws.gmm_ws_kernel, (rhs_desc, rhs_half_desc), {"SPLIT": config.tail_split}
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=layout(lhs_block, lhs.dtype, gmm_ws_cluster.SHARED)), *descriptors,
      schedule, m,
      kernel=kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(device.num_sms // ctas, row_tiles * geometry.cdiv(n, cols)),), num_ctas=ctas,
      num_warps=gmm_ws.NUM_WARPS, maxnreg=gmm_ws.MAXNREG, name="jgmm_gmm_ws_cluster" if cluster else "jgmm_gmm_ws",
      K=k, N=n, R_MAX=row_tiles, BLOCK_N=config.block_n, BLOCK_K=config.block_k, S=config.num_stages,
      TRANSPOSE_RHS=transpose_rhs, OUT_LAYOUT=layout(out_block, out_dtype, gmm_ws_cluster.COL_SPLIT),
      BAND=config.band_tiles, **split)


def _persistent_programs(config, device):
  """The persistent grid's size for `config` (None when not persistent)."""
  return config.programs_per_sm * device.num_sms if config.persistent else None


def _dot_precision(precision):
  """Triton's input_precision for float32 products: IEEE float32 for precision "highest" or under
  jax.default_matmul_precision("float32"/"highest"), else Triton's default (TF32 tensor cores on NVIDIA)."""
  default = jax.config.jax_default_matmul_precision
  return "ieee" if precision == "highest" or default in ("float32", "highest") else None


def _device():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  kind = gpus[0].device_kind if gpus else None
  named = os.environ.get("JGMM_TARGET")
  if named:
    platform, _, arch = named.partition(":")
    if platform == "cuda":
      capability = int(arch)
      num_sms = gpus[0].core_count if gpus else _DEFAULT_NUM_SMS.get(capability, 132)
      return _Device(f"sm{capability}", kind, num_sms, _host_tma(capability))
    return _Device(arch, kind, gpus[0].core_count if gpus else 304, False)
  if gpus:
    capability = str(gpus[0].compute_capability)
    if capability.startswith("gfx"):
      return _Device(capability.split(":")[0], kind, gpus[0].core_count, False)
    major, minor = capability.split(".")[:2]
    capability = int(major) * 10 + int(minor)
    return _Device(f"sm{capability}", kind, gpus[0].core_count, _host_tma(capability))
  return _Device(None, None, _INTERPRETER_PROGRAMS, True)


def gmm(lhs, rhs, bounds, bias, existing_out, *, transpose_rhs, out_dtype, activation, save_preactivation,
        config, precision=None):
  """out (M, N_out) = act(lhs rows of g @ rhs[g] + bias[g]) (+ existing_out), per group g.

  lhs (M, K); rhs (G, K, N), or (G, N, K) if transpose_rhs; bounds int32 (G + 1,), sanitised: rows of
  group g are [bounds[g], bounds[g + 1]); bias (G, N) or None; existing_out (M, N_out) out_dtype or None
  (aliased: the output reuses its buffer). Rows outside [bounds[0], bounds[G]) are zeros (or keep
  existing_out). activation None|"relu"|"gelu"|"gelu_tanh"|"silu"|"swiglu" (N_out = N / 2: silu(gate) * up
  of the [gate | up] column halves; N_out = N otherwise). Returns out, or (out, h) with h (M, N) = the
  pre-activation product + bias in out_dtype if save_preactivation.
  """
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  swiglu = activation == "swiglu"
  n_out = n // 2 if swiglu else n
  out_dtype = jnp.dtype(out_dtype)
  if m == 0:
    out = jnp.zeros((0, n_out), out_dtype) if existing_out is None else existing_out
    return (out, jnp.zeros((0, n), out_dtype)) if save_preactivation else out
  device = _device()
  choice = config_table.select(config_table.make_key(
      "gmm_t" if transpose_rhs else "gmm", lhs.dtype.name, out_dtype.name, m / num_groups, k, n, num_groups,
      transpose=transpose_rhs, activation=activation, bias=bias is not None, accumulate=existing_out is not None),
      arch=device.arch, device_kind=device.kind, override=config)
  if choice.backend == "xla":
    return backend_xla.gmm(lhs, rhs, bounds, bias, existing_out, transpose_rhs=transpose_rhs, out_dtype=out_dtype,
                           activation=activation, save_preactivation=save_preactivation, config=None,
                           precision=precision)
  config = choice.config
  if (config.warp_specialized and device.arch == "sm90" and device.tma and bias is None and existing_out is None
      and activation is None and not save_preactivation and lhs.dtype.name in ("bfloat16", "float16")
      and out_dtype.name in ("bfloat16", "float16") and geometry.gmm_ws_ok(
          m, k, n, num_groups, transpose_rhs, config.block_m, config.block_n, config.block_k, config.num_stages,
          config_table.shared_memory_limit(device.arch))):
    return _gmm_ws(lhs, rhs, bounds, transpose_rhs, out_dtype, config, device)
  use_tma = config.tma and device.tma and geometry.gmm_tma_ok(
      m, k, n_out, lhs.dtype.itemsize, out_dtype.itemsize, config.block_m, config.block_n, config.block_k)
  tma_store = config.tma_store and use_tma and geometry.gmm_tma_store_ok(m, n_out, out_dtype.itemsize,
                                                                        config.block_n)
  accumulate = existing_out is not None
  out_shapes = [jax.ShapeDtypeStruct((m, n_out), out_dtype),
                jax.ShapeDtypeStruct((m, n) if save_preactivation else (1,), out_dtype)]
  rhs_view = (num_groups, n // n_out, n_out, k) if transpose_rhs else (num_groups, k, n // n_out, n_out)

  def rhs_box(cols):
    return (1, 1, cols, config.block_k) if transpose_rhs else (1, config.block_k, 1, cols)

  lhs_desc, rhs_desc = _descriptors(use_tma, lhs, (config.block_m, config.block_k), rhs, rhs_view,
                                    rhs_box(config.block_n))
  tail_split = config.tail_split and config.persistent
  # Absent operands are passed as `bounds`, a placeholder the kernel never touches.
  rhs_half_desc = bounds
  if tail_split and use_tma:  # The last round's column halves: rhs boxes half as wide.
    rhs_half_desc = ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_box(config.block_n // 2))
  out, h = ffi.triton_call(
      lhs, rhs, lhs_desc, rhs_desc, rhs_half_desc, bounds, bounds if bias is None else bias,
      existing_out if accumulate else bounds, m,
      kernel=gmm_kernels.gmm_kernel, out_shape=out_shapes,
      grid=geometry.gmm_grid(m, n_out, num_groups, config.block_m, config.block_n,
                             _persistent_programs(config, device)),
      num_warps=config.num_warps, num_stages=config.num_stages,
      input_output_aliases={7: 0} if accumulate else None, name="jgmm_gmm",
      K=k, N=n, N_OUT=n_out, G=num_groups, G_POW2=geometry.group_table_lanes(num_groups), BLOCK_M=config.block_m,
      BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=geometry.GROUP_M, TRANSPOSE_RHS=transpose_rhs,
      HAS_BIAS=bias is not None, ACCUMULATE=accumulate, ACTIVATION=activation or "none",
      SAVE_PRE=save_preactivation, USE_TMA=use_tma, TMA_STORE=tma_store, DOT_PRECISION=_dot_precision(precision),
      TAIL_SPLIT=tail_split)
  return (out, h) if save_preactivation else out


def tgmm(lhs, rhs, bounds, existing_out, *, transpose_lhs, out_dtype, bias_grad, config, precision=None):
  """out (G, K, N): out[g] = lhs_KM[:, rows of g] @ rhs[rows of g] (+ existing_out[g]).

  lhs (K, M), or (M, K) read transposed if transpose_lhs; rhs (M, N); bounds int32 (G + 1,), sanitised;
  existing_out (G, K, N) out_dtype or None (aliased). Empty groups give exact zeros (or existing_out).
  Returns out, or (out, dbias) with dbias (G, N) float32 = per-group column sums of rhs if bias_grad.
  """
  m, n = rhs.shape
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  num_groups = bounds.shape[0] - 1
  out_dtype = jnp.dtype(out_dtype)
  if m == 0:
    out = jnp.zeros((num_groups, k, n), out_dtype) if existing_out is None else existing_out
    return (out, jnp.zeros((num_groups, n), jnp.float32)) if bias_grad else out
  device = _device()
  choice = config_table.select(config_table.make_key(
      "tgmm", lhs.dtype.name, out_dtype.name, m / num_groups, k, n, num_groups, transpose=transpose_lhs,
      bias=bias_grad, accumulate=existing_out is not None), arch=device.arch, device_kind=device.kind, override=config)
  if choice.backend == "xla":
    return backend_xla.tgmm(lhs, rhs, bounds, existing_out, transpose_lhs=transpose_lhs, out_dtype=out_dtype,
                            bias_grad=bias_grad, config=None, precision=precision)
  config = choice.config
  accumulate = existing_out is not None
  out_shapes = [jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
                jax.ShapeDtypeStruct((num_groups, n) if bias_grad else (1,), jnp.float32)]
  if (config.warp_specialized and device.arch == "sm90" and device.tma and transpose_lhs and not accumulate
      and lhs.dtype.name in ("bfloat16", "float16") and out_dtype.name in ("bfloat16", "float16")
      and geometry.tgmm_ws_ok(m, k, n, num_groups, config.block_m, config.block_n, config.block_k,
                              config.num_stages, config_table.shared_memory_limit(device.arch))):
    out, dbias = _tgmm_ws(lhs, rhs, bounds, out_shapes, bias_grad, config, device)
  else:
    out, dbias = ffi.triton_call(
        lhs, rhs, bounds, existing_out if accumulate else bounds, m,
        kernel=tgmm_kernels.tgmm_kernel, out_shape=out_shapes,
        grid=geometry.tgmm_grid(k, n, num_groups, config.block_m, config.block_n,
                                _persistent_programs(config, device)),
        num_warps=config.num_warps, num_stages=config.num_stages,
        input_output_aliases={3: 0} if accumulate else None, name="jgmm_tgmm",
        K=k, N=n, G=num_groups, G_POW2=geometry.group_table_lanes(num_groups), BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=geometry.GROUP_M, TRANSPOSE_LHS=transpose_lhs,
        ACCUMULATE=accumulate, BIAS_GRAD=bias_grad, DOT_PRECISION=_dot_precision(precision))
  return (out, dbias) if bias_grad else out


def _tgmm_ws(lhs, rhs, bounds, out_shapes, bias_grad, config, device):
  """(out, dbias) of out_shapes (tgmm's: dbias (G, N) float32 if bias_grad else a (1,) placeholder): tgmm of lhs
  (M, K) read transposed and rhs (M, N) through tgmm_ws_kernel (the caller checked that it applies)."""
  k = lhs.shape[1]
  n = rhs.shape[1]
  num_groups = bounds.shape[0] - 1
  out_dtype = out_shapes[0].dtype
  lhs_block, rhs_block = (config.block_k, gmm_ws.HALF.value), (config.block_k, config.block_n)
  out_block = (gmm_ws.HALF.value, config.block_n)
  tiles = num_groups * geometry.cdiv(k, tgmm_ws.BLOCK_M.value) * geometry.cdiv(n, config.block_n)
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=gmm_ws.shared_layout(lhs_block, lhs.dtype.name)),
      ffi.TensorDescriptor(rhs, rhs_block, layout=gmm_ws.shared_layout(rhs_block, rhs.dtype.name)), bounds,
      kernel=tgmm_ws.tgmm_ws_kernel, out_shape=out_shapes, grid=(min(device.num_sms, tiles),),
      num_warps=tgmm_ws.NUM_WARPS, maxnreg=tgmm_ws.MAXNREG, name="jgmm_tgmm_ws", G=num_groups, K=k, N=n,
      BLOCK_N=config.block_n, BLOCK_K=config.block_k, S=config.num_stages,
      OUT_LAYOUT=gmm_ws.shared_layout(out_block, out_dtype.name), BIAS_GRAD=bias_grad, BAND=config.band_tiles)


def _masked(x, w, masked_m, transpose_w, out_dtype, expected_m, config, precision):
  """masked_gmm_kernel: out[g] = x[g] @ (w[g].T if transpose_w (w (G, N, K)) else w[g] (w (G, K, N)))."""
  num_groups, max_m, k = x.shape
  n = w.shape[1] if transpose_w else w.shape[2]
  out_dtype = jnp.dtype(out_dtype)
  if max_m == 0:
    return jnp.zeros((num_groups, 0, n), out_dtype)
  device = _device()
  choice = config_table.select(config_table.make_key(
      "masked", x.dtype.name, out_dtype.name, expected_m or max_m, k, n, num_groups, transpose=not transpose_w),
      arch=device.arch, device_kind=device.kind, override=config)
  if choice.backend == "xla":
    return (backend_xla.masked_gmm if transpose_w else backend_xla.masked_gmm_kn)(
        x, w, masked_m, out_dtype=out_dtype, expected_m=expected_m, config=None, precision=precision)
  config = choice.config
  use_tma = config.tma and device.tma and geometry.gmm_tma_ok(
      num_groups * max_m, k, n, x.dtype.itemsize, out_dtype.itemsize, config.block_m, config.block_n,
      config.block_k)
  w_view, w_block = ((num_groups, 1, n, k), (1, 1, config.block_n, config.block_k)) if transpose_w else (
      (num_groups, k, 1, n), (1, config.block_k, 1, config.block_n))
  x_desc, w_desc = _descriptors(use_tma, x.reshape(num_groups * max_m, k), (config.block_m, config.block_k), w,
                                w_view, w_block)
  return ffi.triton_call(
      x, w, x_desc, w_desc, masked_m, max_m, kernel=gmm_kernels.masked_gmm_kernel,
      out_shape=jax.ShapeDtypeStruct((num_groups, max_m, n), out_dtype),
      grid=geometry.masked_grid(max_m, n, num_groups, config.block_m, config.block_n),
      num_warps=config.num_warps, num_stages=config.num_stages, name="jgmm_masked_gmm",
      K=k, N=n, G=num_groups, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=geometry.GROUP_M, USE_TMA=use_tma, DOT_PRECISION=_dot_precision(precision), TRANSPOSE_W=transpose_w)


def masked_gmm(x, w, masked_m, *, out_dtype, expected_m, config, precision=None):
  """out (G, max_m, N) = x[g] @ w[g].T on rows < masked_m[g], exact zeros on the others.

  x (G, max_m, K); w (G, N, K); masked_m int32 (G,), already clipped to [0, max_m]. expected_m (the
  typical masked_m, or None for max_m) picks the tuned config when config is None. Tiles wholly past
  masked_m[g] only write zeros.
  """
  return _masked(x, w, masked_m, True, out_dtype, expected_m, config, precision)


def masked_gmm_kn(x, w, masked_m, *, out_dtype, expected_m, config, precision=None):
  """out (G, max_m, N) = x[g] @ w[g] on rows < masked_m[g], exact zeros on the others; w (G, K, N).

  masked_gmm's input gradient: dx = masked_gmm_kn(dout, w) reads masked_gmm's w (G, N, K) as this (G, K', N')
  layout, no transpose materialised."""
  return _masked(x, w, masked_m, False, out_dtype, expected_m, config, precision)


def masked_tgmm(lhs, rhs, masked_m, *, out_dtype, config, precision=None):
  """out (G, K, N)[g] = lhs[g, :masked_m[g]].T @ rhs[g, :masked_m[g]]; lhs (G, max_m, K), rhs (G, max_m, N),
  masked_m clipped to [0, max_m]; empty groups are exact zeros. masked_gmm's weight gradient:
  dw = masked_tgmm(dout, x) (G, N, K). The tgmm kernel over the (G * max_m)-row views, group g's rows at
  g * max_m."""
  num_groups, max_m, k = lhs.shape
  n = rhs.shape[2]
  out_dtype = jnp.dtype(out_dtype)
  m = num_groups * max_m
  if m == 0:
    return jnp.zeros((num_groups, k, n), out_dtype)
  device = _device()
  key = config_table.make_key("tgmm", lhs.dtype.name, out_dtype.name, max_m, k, n, num_groups, transpose=True)
  choice = config_table.select(key, arch=device.arch, device_kind=device.kind, override=config)
  if choice.backend == "xla":
    return backend_xla.masked_tgmm(lhs, rhs, masked_m, out_dtype=out_dtype, config=None, precision=precision)
  config = choice.config
  if config.warp_specialized and choice.source != "override":
    # A table's tiles for tgmm_ws (contiguous groups only): this layout runs tgmm_kernel, at the heuristic's tiles.
    config = config_table.heuristic_config(key, device.arch)
  (out, _) = ffi.triton_call(
      lhs.reshape(m, k), rhs.reshape(m, n), masked_m, masked_m, m, kernel=tgmm_kernels.tgmm_kernel,
      out_shape=[jax.ShapeDtypeStruct((num_groups, k, n), out_dtype), jax.ShapeDtypeStruct((1,), jnp.float32)],
      grid=geometry.tgmm_grid(k, n, num_groups, config.block_m, config.block_n,
                              _persistent_programs(config, device)),
      num_warps=config.num_warps, num_stages=config.num_stages, name="jgmm_masked_tgmm",
      K=k, N=n, G=num_groups, G_POW2=geometry.group_table_lanes(num_groups), BLOCK_M=config.block_m,
      BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=geometry.GROUP_M, TRANSPOSE_LHS=True,
      ACCUMULATE=False, BIAS_GRAD=False, DOT_PRECISION=_dot_precision(precision), MASKED=True)
  return out


# ---------------------------------------------------------------------------------------------------------------
# FP8 with scales (jgmm.fp8; kernels in triton_kernels/gmm_fp8.py). Operands are FP8, or float32 holding FP8
# values under the interpreter (its FP8 dots are not trusted), which runs the same indexing and scaling. A scale
# of one dimension fewer than its operand is per row / per channel, else per block.


def fp8_recipe(lhs_blocks, rhs_blocks):
  """The scale recipe's name in config-table keys, e.g. "1x128-128x128" (blocks) or "row-channel"."""
  return f"{'1x128' if lhs_blocks else 'row'}-{'128x128' if rhs_blocks else 'channel'}"


def check_fp8_format(dtype, device):
  """FP8 kernels take the GPU's own format: float8_e4m3fnuz is ROCm's, which CUDA's tensor cores do not read."""
  if device.cuda and jnp.dtype(dtype) == jnp.float8_e4m3fnuz:
    raise TypeError(f"float8_e4m3fnuz operands (ROCm's FP8 format) have no Triton kernel on CUDA ({device.arch}): "
                    "quantise to float8_e4m3fn (jgmm.quantize(x, recipe, jnp.float8_e4m3fn)) or pass backend='xla'")


def _fp8_config(op, dtype, out_dtype, rows_per_group, k, n, g, scale, config, device, **flags):
  """The selected config of an FP8 op (None where the table picks the portable backend), within its scale block
  (config_table.within_scale_block).
  scale: fp8_recipe's name, or config_table.TGMM_FP8_RECIPE for tgmm."""
  check_fp8_format(dtype, device)
  choice = config_table.select(config_table.make_key(op, dtype.name, out_dtype.name, rows_per_group, k, n, g,
                                                     scale=scale, **flags),
                               arch=device.arch, device_kind=device.kind, override=config)
  if choice.backend == "xla":
    return None
  return config_table.within_scale_block(choice.config)


def _persistent_grid(tiles, config, device):
  return (min(tiles, _persistent_programs(config, device) or tiles),)


def _fp8_descriptors(lhs_rows, rhs, rhs_nk, config, device, out_dtype):
  """(use_tma, lhs_desc, rhs_desc) of an FP8 kernel: descriptors over lhs_rows (rows, K) and rhs (G, N, K) if
  rhs_nk else (G, K, N) where config, device and strides allow TMA, else the arrays (unused by the kernel)."""
  k, n = lhs_rows.shape[1], rhs.shape[1] if rhs_nk else rhs.shape[2]
  use_tma = config.tma and device.tma and geometry.gmm_tma_ok(
      lhs_rows.shape[0], k, n, lhs_rows.dtype.itemsize, out_dtype.itemsize, config.block_m, config.block_n,
      config.block_k)
  rhs_block = (1, config.block_n, config.block_k) if rhs_nk else (1, config.block_k, config.block_n)
  return (use_tma, *_descriptors(use_tma, lhs_rows, (config.block_m, config.block_k), rhs, rhs.shape, rhs_block))


def _fp8_ws_ok(config, device, rows, k, n, num_groups, out_dtype, fits=geometry.gmm_fp8_ws_ok):
  """Whether an FP8 op runs a warp-specialised kernel (config.warp_specialized, on sm_90; float8_e4m3fn, as
  check_fp8_format leaves on CUDA) whose shapes and tiling `fits` admits: gmm_fp8_ws_kernel (K-major rhs) by
  default, tgmm_fp8_ws_kernel with geometry.tgmm_fp8_ws_ok (rows: M)."""
  return (config.warp_specialized and device.arch == "sm90" and device.tma
          and fits(rows, k, n, num_groups, out_dtype.itemsize, config.block_m, config.block_n, config.block_k,
                   config.num_stages, config_table.shared_memory_limit(device.arch)))


def _fp8_tile_rows(config, lhs_scale, rhs_scale):
  """Rows of gmm_fp8_ws's row tiles for `config`: 2 config.block_m where the cluster kernel runs it
  (_fp8_cluster), else config.block_m."""
  return 2 * config.block_m if _fp8_cluster(config, lhs_scale, rhs_scale) else config.block_m


def _fp8_cluster(config, lhs_scale, rhs_scale):
  """Whether gmm_fp8_ws_cluster_kernel runs an FP8 product (config.cluster_size 2 on 128 x 128 or 192 x 128 tiles,
  the block recipe, a Triton with Gluon's clusters); gmm_fp8_ws_kernel else."""
  return (config.cluster_size == 2 and config.block_n == 128 and config.block_m in (128, 192) and lhs_scale.ndim == 2
          and rhs_scale.ndim == 3 and gmm_ws_cluster.supported())


def _gmm_fp8_ws(lhs, rhs, schedule, first_rows, lhs_scale, rhs_scale, out_dtype, config, device, masked_m_rows=0):
  """out (rows, N) of gmm_fp8_ws_kernel, or of gmm_fp8_ws_cluster_kernel (_fp8_cluster): lhs (rows, K), rhs (G, N,
  K), lhs_scale (rows, KB) or (rows,), rhs_scale (G, NB, KB) or (G, N); row tiles of _fp8_tile_rows rows starting
  at first_rows (R,): schedule holds them (_row_tiles' format), or for the masked layout of masked_m_rows (max_m)
  rows a group is masked_m (G,) itself (the kernel computes each tile). Block scales of lhs go to the kernel
  tile-major (_tile_scales)."""
  if _fp8_cluster(config, lhs_scale, rhs_scale):
    return _gmm_fp8_ws_cluster(lhs, rhs, schedule, first_rows, lhs_scale, rhs_scale, out_dtype, config, device,
                               masked_m_rows)
  row_tiles = first_rows.shape[0]
  m, k = lhs.shape
  num_groups, n, _ = rhs.shape
  block = gmm_fp8_ws.BLOCK.value
  lhs_block, rhs_block, out_block = (gmm_ws.HALF.value, block), (config.block_n, block), (gmm_ws.HALF.value, block)
  halves = config.block_m // gmm_ws.HALF.value
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=gmm_ws.shared_layout(lhs_block, lhs.dtype.name)),
      ffi.TensorDescriptor(rhs.reshape(num_groups * n, k), rhs_block,
                           layout=gmm_ws.shared_layout(rhs_block, rhs.dtype.name)),
      ffi.TensorDescriptor(_tile_scales(lhs_scale, first_rows, geometry.next_pow2(config.block_m)),
                           (1, geometry.next_pow2(config.block_m)), layout=gmm_fp8_ws.ROW_SCALE_LAYOUT),
      schedule, lhs_scale, rhs_scale, m,
      kernel=gmm_fp8_ws.gmm_fp8_ws_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(device.num_sms, row_tiles * geometry.cdiv(n, config.block_n)),),
      num_warps=gmm_fp8_ws.NUM_WARPS, maxnreg=gmm_fp8_ws.MAXNREG[halves], name="jgmm_gmm_fp8_ws",
      K=k, N=n, R_MAX=row_tiles, BLOCK_N=config.block_n, S=config.num_stages, LHS_BLOCKS=lhs_scale.ndim == 2,
      RHS_BLOCKS=rhs_scale.ndim == 3, OUT_LAYOUT=gmm_ws.shared_layout(out_block, out_dtype.name), HALVES=halves,
      MASKED_M=masked_m_rows)


def _gmm_fp8_ws_cluster(lhs, rhs, schedule, first_rows, lhs_scale, rhs_scale, out_dtype, config, device,
                        masked_m_rows):
  """_gmm_fp8_ws through gmm_fp8_ws_cluster_kernel (its docstring: the operands' views and boxes)."""
  row_tiles = first_rows.shape[0]
  m, k = lhs.shape
  num_groups, n, _ = rhs.shape
  block = gmm_fp8_ws.BLOCK.value
  k_blocks = rhs_scale.shape[2]
  rhs_scale = jnp.pad(rhs_scale, ((0, 0), (0, 0), (0, -k_blocks % 4))).reshape(-1, geometry.cdiv(k_blocks, 4) * 4)
  consumers = 2 * config.block_m // block
  scale_rows = geometry.next_pow2(consumers)  # (A TMA box's sides are powers of 2.)
  tile_scales = _tile_scales(lhs_scale, first_rows, scale_rows * block).reshape(-1, block)
  shared, rows, cols = gmm_ws_cluster.SHARED, gmm_ws_cluster.ROW_SPLIT, gmm_ws_cluster.COL_SPLIT  # Boxes' cga.
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, (block, block), layout=gmm_ws.shared_layout((block, block), lhs.dtype.name, rows)),
      ffi.TensorDescriptor(rhs.reshape(num_groups * n, k), (block, block),
                           layout=gmm_ws.shared_layout((block, block), rhs.dtype.name, shared)),
      ffi.TensorDescriptor(tile_scales, (scale_rows, block), layout=gmm_fp8_ws_cluster.scale_layout(cols)),
      ffi.TensorDescriptor(rhs_scale, (1, 4), layout=gmm_fp8_ws_cluster.scale_layout(shared)),
      schedule, m,
      kernel=gmm_fp8_ws_cluster.gmm_fp8_ws_cluster_kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=(min(device.num_sms // 2, row_tiles * geometry.cdiv(n, block)),), num_ctas=2,
      num_warps=gmm_fp8_ws_cluster.NUM_WARPS, maxnreg=gmm_fp8_ws.MAXNREG[consumers], name="jgmm_gmm_fp8_ws_cluster",
      K=k, N=n, R_MAX=row_tiles, S=config.num_stages,
      OUT_LAYOUT=gmm_ws.shared_layout((block, block), out_dtype.name, rows), MASKED_M=masked_m_rows,
      C=consumers)


def _tile_scales(lhs_scale, first_rows, width):
  """gmm_fp8_ws_kernel's lhs block scales, tile-major: (R * KB, width) float32 (width: a tile's rows rounded up to a
  power of 2; gmm_fp8_ws_cluster_kernel's: 128 x its consumers rounded up to a power of 2), whose row r * KB + kb
  holds K block kb's scales of the width rows from first_rows[r] (first_rows (R,); row M - 1's past M: the kernel
  reads zeros for lhs there and never stores those rows); a step's TMA copy then starts at a
  16-byte aligned address, which a tile starting at any row would not give, of lhs_scale (M, KB) or of its
  transpose (KB, M) (boxes of that transpose at a group's first row: an illegal instruction on the H100 where a
  group started at a row no multiple of 4, docs/perf-notes.md, session 34). With row scales (M,), a (1, W)
  placeholder the kernel never reads."""
  if lhs_scale.ndim == 1:
    return jnp.zeros((1, width), jnp.float32)
  rows = first_rows[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
  tiles = jnp.take(lhs_scale, rows, axis=0, mode="clip")  # (row_tiles, width, KB); one fusion (mode="fill": two)
  return tiles.transpose(0, 2, 1).reshape(-1, width)


def _plain_fp8_config(config, given, call):
  """config for the plain FP8 kernels (where the warp-specialised one does not run `call`), which have no 192-row
  tiles: a ValueError where the caller gave 192 rows (`given`), 128 rows where the table or heuristic chose them."""
  if config.block_m != config_lib.ROWS_192:
    return config
  if not given:
    return dataclasses.replace(config, block_m=128)
  raise ValueError(f"config.block_m = 192 runs on Hopper's warp-specialised FP8 kernel only, which does not take "
                   f"this call ({call}, config {config}): it needs sm_90, block_n = block_k = 128, K a multiple "
                   f"of 16, output rows of 16-byte multiples and num_stages that fit the shared memory with the "
                   f"192 x 128 output tile (3 for float32 out, 4 for bf16); use a power of two")


def _masked_first_rows(num_groups, max_m, block_m):
  """The first rows (G * cdiv(max_m, block_m),) int32 of the masked layout's row tiles, viewed as G * max_m rows:
  per group, one tile per block_m of its max_m rows (gmm_ws.tile_of's masked order); constants."""
  m_tiles = geometry.cdiv(max_m, block_m)
  r = np.arange(num_groups * m_tiles, dtype=np.int32)
  return jnp.asarray(r // m_tiles * max_m + r % m_tiles * block_m)


def gmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_rhs, out_dtype, config):
  """out (M, N) = (lhs * lhs_scale)[rows of g] @ (rhs[g] * rhs_scale[g]); rhs (G, N, K) if transpose_rhs, else
  (G, K, N); rows outside every group are zeros. Scales: backend_xla.gmm_fp8."""
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  out_dtype = jnp.dtype(out_dtype)
  if m == 0 or k == 0:  # An empty sum: zeros whatever the scales (the kernels load a K block's scales up front).
    return jnp.zeros((m, n), out_dtype)
  device, given = _device(), config is not None
  config = _fp8_config("gmm_t_fp8" if transpose_rhs else "gmm_fp8", lhs.dtype, out_dtype, m / num_groups, k, n,
                       num_groups, fp8_recipe(lhs_scale.ndim == 2, rhs_scale.ndim == 3), config, device,
                       transpose=transpose_rhs)
  if config is None:
    return backend_xla.gmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_rhs=transpose_rhs,
                               out_dtype=out_dtype, config=None)
  if transpose_rhs and _fp8_ws_ok(config, device, m, k, n, num_groups, out_dtype):
    tile_rows = _fp8_tile_rows(config, lhs_scale, rhs_scale)
    row_tiles = geometry.cdiv(m, tile_rows) + num_groups + 1
    schedule = _row_tiles(bounds, m, row_tiles, tile_rows)
    return _gmm_fp8_ws(lhs, rhs, schedule, schedule[1 + row_tiles:1 + 2 * row_tiles], lhs_scale, rhs_scale,
                       out_dtype, config, device)
  config = _plain_fp8_config(config, given, f"FP8 gmm of lhs {lhs.shape}, rhs {rhs.shape}")
  tiles = (geometry.cdiv(m, config.block_m) + num_groups + 1) * geometry.cdiv(n, config.block_n)
  use_tma, lhs_desc, rhs_desc = _fp8_descriptors(lhs, rhs, transpose_rhs, config, device, out_dtype)
  return ffi.triton_call(
      lhs, rhs, lhs_desc, rhs_desc, bounds, lhs_scale, rhs_scale, m, kernel=fp8_kernels.gmm_fp8_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype), grid=_persistent_grid(tiles, config, device),
      num_warps=config.num_warps, num_stages=config.num_stages, name="jgmm_gmm_fp8",
      K=k, N=n, G=num_groups, G_POW2=geometry.group_table_lanes(num_groups), BLOCK_M=config.block_m,
      BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=geometry.GROUP_M, RHS_NK=transpose_rhs,
      LHS_BLOCKS=lhs_scale.ndim == 2, RHS_BLOCKS=rhs_scale.ndim == 3, USE_TMA=use_tma,
      DOT_PRECISION=_dot_precision(None))


def masked_gmm_fp8(x, w, masked_m, x_scale, w_scale, *, out_dtype, expected_m, config):
  """out (G, max_m, N) = (x[g] * x_scale[g]) @ (w[g] * w_scale[g]).T on rows < masked_m[g] (clipped to
  [0, max_m]), exact zeros elsewhere. expected_m (or max_m) picks the tuned config when config is None."""
  num_groups, max_m, k = x.shape
  n = w.shape[1]
  out_dtype = jnp.dtype(out_dtype)
  if max_m == 0 or k == 0:  # As gmm_fp8's.
    return jnp.zeros((num_groups, max_m, n), out_dtype)
  device, given = _device(), config is not None
  config = _fp8_config("masked_fp8", x.dtype, out_dtype, expected_m or max_m, k, n, num_groups,
                       fp8_recipe(x_scale.ndim == 3, w_scale.ndim == 3), config, device)
  if config is None:
    return backend_xla.masked_gmm_fp8(x, w, masked_m, x_scale, w_scale, out_dtype=out_dtype, expected_m=expected_m,
                                      config=None)
  if _fp8_ws_ok(config, device, num_groups * max_m, k, n, num_groups, out_dtype):
    x_scale = x_scale.reshape(num_groups * max_m, *x_scale.shape[2:])
    out = _gmm_fp8_ws(x.reshape(num_groups * max_m, k), w, masked_m,
                      _masked_first_rows(num_groups, max_m, _fp8_tile_rows(config, x_scale, w_scale)), x_scale,
                      w_scale, out_dtype, config, device, masked_m_rows=max_m)
    return out.reshape(num_groups, max_m, n)
  config = _plain_fp8_config(config, given, f"FP8 masked_gmm of x {x.shape}, w {w.shape}")
  tiles = num_groups * geometry.cdiv(max_m, config.block_m) * geometry.cdiv(n, config.block_n)
  use_tma, x_desc, w_desc = _fp8_descriptors(x.reshape(num_groups * max_m, k), w, True, config, device, out_dtype)
  return ffi.triton_call(
      x, w, x_desc, w_desc, masked_m, x_scale, w_scale, max_m, kernel=fp8_kernels.masked_gmm_fp8_kernel,
      out_shape=jax.ShapeDtypeStruct((num_groups, max_m, n), out_dtype), grid=_persistent_grid(tiles, config, device),
      num_warps=config.num_warps, num_stages=config.num_stages, name="jgmm_masked_gmm_fp8",
      K=k, N=n, G=num_groups, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
      GROUP_M=geometry.GROUP_M, X_BLOCKS=x_scale.ndim == 3, W_BLOCKS=w_scale.ndim == 3, USE_TMA=use_tma,
      DOT_PRECISION=_dot_precision(None))


def _tgmm_fp8_ws(lhs, rhs, bounds, lhs_scale, rhs_scale, out_shape, config, device, rhs_scale_per_group,
                 transpose_out):
  """out (G, K, N), or (G, N, K) where transpose_out (out_shape), of tgmm_fp8_ws_kernel: lhs (K, M), rhs (N, M),
  bounds (G + 1,), lhs_scale (MB, K), rhs_scale (MB, N), or (G, N) where rhs_scale_per_group."""
  k, n, num_groups = lhs.shape[0], rhs.shape[0], bounds.shape[0] - 1
  block, half = gmm_fp8_ws.BLOCK.value, gmm_ws.HALF.value
  layout = gmm_ws.shared_layout
  tiles = num_groups * geometry.cdiv(k, block) * geometry.cdiv(n, config.block_n)
  out_box = (block, half) if transpose_out else (half, block)
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, (half, block), layout=layout((half, block), lhs.dtype.name)),
      ffi.TensorDescriptor(rhs, (config.block_n, block), layout=layout((config.block_n, block), rhs.dtype.name)),
      ffi.TensorDescriptor(lhs_scale, (1, block), layout=tgmm_fp8_ws.SCALE_LAYOUT),
      ffi.TensorDescriptor(rhs_scale, (1, config.block_n), layout=tgmm_fp8_ws.SCALE_LAYOUT),
      bounds, rhs_scale,
      kernel=tgmm_fp8_ws.tgmm_fp8_ws_kernel, out_shape=out_shape,
      grid=(min(device.num_sms, tiles),), num_warps=tgmm_fp8_ws.NUM_WARPS, maxnreg=tgmm_fp8_ws.MAXNREG,
      name="jgmm_tgmm_fp8_ws", G=num_groups, K=k, N=n, BLOCK_N=config.block_n, S=config.num_stages,
      OUT_LAYOUT=layout(out_box, out_shape.dtype.name), RHS_GROUPS=rhs_scale_per_group, TRANSPOSE_OUT=transpose_out,
      BAND=config.band_tiles)


def tgmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, *, transpose_lhs, transpose_rhs, out_dtype, config,
             rhs_scale_per_group=False, transpose_out=False):
  """out (G, K, N)[g] = (lhs * lhs_scale)_KM[:, rows of g] @ (rhs * rhs_scale)_MN[rows of g], scales per 128 rows
  of M, rhs's per group and column where rhs_scale_per_group (backend_xla.tgmm_fp8); empty groups are exact
  zeros. transpose_out: (G, N, K), each out[g] transposed (stored so by the kernels)."""
  n, m = rhs.shape if transpose_rhs else rhs.shape[::-1]
  k = lhs.shape[1] if transpose_lhs else lhs.shape[0]
  num_groups = bounds.shape[0] - 1
  out_dtype = jnp.dtype(out_dtype)
  out_shape = jax.ShapeDtypeStruct((num_groups, n, k) if transpose_out else (num_groups, k, n), out_dtype)
  if m == 0:
    return jnp.zeros(out_shape.shape, out_dtype)
  device = _device()
  config = _fp8_config("tgmm_fp8", lhs.dtype, out_dtype, m / num_groups, k, n, num_groups,
                       config_table.TGMM_FP8_RECIPE, config, device, transpose=transpose_lhs)
  if config is None:
    return backend_xla.tgmm_fp8(lhs, rhs, bounds, lhs_scale, rhs_scale, transpose_lhs=transpose_lhs,
                                transpose_rhs=transpose_rhs, out_dtype=out_dtype, config=None,
                                rhs_scale_per_group=rhs_scale_per_group, transpose_out=transpose_out)
  tiles = num_groups * geometry.cdiv(k, config.block_m) * geometry.cdiv(n, config.block_n)
  # The kernels read the scales as (cdiv(M, 128), K) and (cdiv(M, 128), N) (a step's as one contiguous row each),
  # or rhs's per group as (G, N).
  lhs_scale = lhs_scale if transpose_lhs else lhs_scale.T
  rhs_scale = rhs_scale.T if transpose_rhs else rhs_scale
  if not transpose_lhs and transpose_rhs and _fp8_ws_ok(config, device, m, k, n, num_groups, out_dtype,
                                                        fits=geometry.tgmm_fp8_ws_ok):
    return _tgmm_fp8_ws(lhs, rhs, bounds, lhs_scale, rhs_scale, out_shape, config, device, rhs_scale_per_group,
                        transpose_out)
  return ffi.triton_call(
      lhs, rhs, bounds, lhs_scale, rhs_scale, m, kernel=fp8_kernels.tgmm_fp8_kernel,
      out_shape=out_shape, grid=_persistent_grid(tiles, config, device),
      num_warps=config.num_warps, num_stages=config.num_stages, name="jgmm_tgmm_fp8",
      K=k, N=n, G=num_groups, G_POW2=geometry.group_table_lanes(num_groups), BLOCK_M=config.block_m,
      BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=geometry.GROUP_M, TRANSPOSE_LHS=transpose_lhs,
      TRANSPOSE_RHS=transpose_rhs, DOT_PRECISION=_dot_precision(None), RHS_GROUPS=rhs_scale_per_group,
      TRANSPOSE_OUT=transpose_out)


def quantize_pair_grouped(x, blocks, *, dtype, num_groups=None):
  """backend_xla.quantize_pair_grouped in one pass over x (quantize_pair_grouped_lanes_kernel on CUDA,
  quantize_pair_grouped_kernel elsewhere), where the FP8 format has a Triton kernel on this device (an FP8 value
  may differ by one step: quantize_pair says why); an empty x through backend_xla. Rows of x in no block are left
  unwritten in q and scale (fp8_gmm's blocks hold every row). With num_groups, qt's scales per group and column
  take a first pass over x (_group_scales)."""
  dtype = jnp.dtype(dtype)
  device = _device()
  check_fp8_format(dtype, device)
  if x.size == 0:
    return backend_xla.quantize_pair_grouped(x, blocks, dtype=dtype, num_groups=num_groups)
  if not device.cuda:
    return quantize_pair_grouped_plain(x, blocks, dtype, quantize.FP8_MAX[dtype], num_groups)
  return _quantize_pair_lanes(x, blocks, blocks.shape[1] * quantize_kernels.BLOCK.value, dtype,
                              "jgmm_quantize_pair_grouped_lanes", num_groups)


def quantize_pair_grouped_plain(x, blocks, q_dtype, fmax, num_groups=None):
  """(q, scale, qt, scale_t) of x (R, C) by quantize_pair_grouped_kernel (the interpreter's and ROCm's), q and qt
  in q_dtype, clipped to +-fmax (the tests read float32 under the interpreter, whose FP8 casts are not trusted);
  with num_groups, qt's scales per group and column (_group_scales), scale_t (C, num_groups)."""
  r, c = x.shape
  block, padded_blocks = quantize_kernels.BLOCK.value, blocks.shape[1]
  return _pair_call(x, blocks, num_groups, kernel=quantize_kernels.quantize_pair_grouped_kernel,
                    out_shape=_rowwise_pair_shapes(x, padded_blocks * block, padded_blocks, q_dtype),
                    grid=(padded_blocks, geometry.cdiv(c, block)), num_warps=quantize_kernels.NUM_WARPS,
                    name="jgmm_quantize_pair_grouped", R=r, C=c, PB=padded_blocks, FMAX=fmax)


def _group_scales(x, blocks, num_groups, fmax):
  """(num_groups + 1, C) float32: the scales of x's columns over each group's rows (jgmm.quantize's of
  block_column_amax_kernel's maxima; blocks' third row, each block's group; the last row: the rows after the
  groups)."""
  c, padded_blocks = x.shape[1], blocks.shape[1]
  shape = jax.ShapeDtypeStruct((num_groups + 1, c), jnp.int32)
  bits = ffi.triton_call(
      x, blocks, jnp.zeros(shape.shape, shape.dtype), kernel=quantize_kernels.block_column_amax_kernel,
      out_shape=shape, input_output_aliases={2: 0},
      grid=(padded_blocks, geometry.cdiv(c, quantize_kernels.BLOCK.value)), num_warps=quantize_kernels.NUM_WARPS,
      name="jgmm_block_column_amax", R=x.shape[0], C=c, PB=padded_blocks)
  return quantize.scale_of_amax(jax.lax.bitcast_convert_type(bits, jnp.float32), fmax)


def _pair_call(x, blocks, num_groups, *, out_shape, **call):
  """(q, scale, qt, scale_t) of a pair kernel (x_ptr, blocks_ptr, st_ptr, q_ptr, s_ptr, qt_ptr, ...): out_shape
  _rowwise_pair_shapes'; st an output, or, with num_groups, _group_scales' read through it (GIVEN_SCALE_T) and
  scale_t its per group (C, num_groups). The kernels write both scales transposed (scale (CB, R), scale_t (PB, C):
  a program's 128 of each in one contiguous run). XLA cancels scale_t's transpose here against the FP8 tgmm
  launcher's, which reads (PB, C); scale's is a small copy before the FP8 gmm (4-7 us on the dsv3 cases, an H100),
  less than the strided stores cost the kernels (~35 us)."""
  q, scale, qt, scale_t = out_shape
  if num_groups is None:
    scale_t, q, scale, qt = ffi.triton_call(x, blocks, out_shape=[scale_t, q, scale, qt], **call)
    return q, scale.T, qt, scale_t.T
  scales = _group_scales(x, blocks, num_groups, call["FMAX"])
  q, scale, qt = ffi.triton_call(x, blocks, scales, out_shape=[q, scale, qt], GIVEN_SCALE_T=True, **call)
  return q, scale.T, qt, scales[:num_groups].T


def _rowwise_pair_shapes(x, qt_rows, padded_blocks, dtype):
  """The pair kernels' outputs of a 1x128 quantisation of x (R, C) in both layouts: q (R, C), scale transposed
  (CB, R), qt (C, qt_rows), scale_t transposed (padded_blocks, C)."""
  r, c = x.shape
  cb = geometry.cdiv(c, quantize_kernels.BLOCK.value)
  return [jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct((cb, r), jnp.float32),
          jax.ShapeDtypeStruct((c, qt_rows), dtype), jax.ShapeDtypeStruct((padded_blocks, c), jnp.float32)]


def _quantize_pair_lanes(x, blocks, qt_rows, dtype, name, num_groups=None):
  """(q (R, C), scale (R, CB), qt (C, qt_rows), scale_t (C, PB)) of x (R, C) by quantize_pair_grouped_lanes_kernel
  (CUDA), x's rows in the blocks (2 or 3, PB) int32; num_groups as quantize_pair_grouped_plain's."""
  r, c = x.shape
  cb, padded_blocks = geometry.cdiv(c, quantize_kernels.BLOCK.value), blocks.shape[1]
  return _pair_call(x, blocks, num_groups, out_shape=_rowwise_pair_shapes(x, qt_rows, padded_blocks, dtype),
                    grid=(cb * padded_blocks,), name=name, R=r, C=c, PB=padded_blocks, RT=qt_rows,
                    **_lanes_launch(dtype))


def _lanes_launch(dtype):
  """quantize_pair_grouped_lanes_kernel's launch arguments that do not depend on x: the kernel, its warps,
  registers and register layouts, and the FP8 maximum of dtype."""
  tile, tile_t = quantize_kernels.lanes_layouts(quantize_kernels.LANES_WARPS)
  return dict(kernel=quantize_kernels.quantize_pair_grouped_lanes_kernel, num_warps=quantize_kernels.LANES_WARPS,
              maxnreg=quantize_kernels.LANES_MAXNREG, FMAX=quantize.FP8_MAX[dtype], TILE=tile, TILE_T=tile_t)


def _quantize_pair_blocks_lanes(x, blocks, dtype):
  """(q (G, R, C), scale (G, RB, CB), qt (G, C, R), scale_t (G, CB, RB)) of x (G, R, C) or (R, C) (then no G) in
  128x128 blocks by quantize_pair_grouped_lanes_kernel (CUDA, TILE_SCALES), blocks (2, RB) on the rows' grid."""
  *batch, r, c = x.shape
  cb, rb = geometry.cdiv(c, quantize_kernels.BLOCK.value), blocks.shape[1]
  scale_t, q, scale, qt = ffi.triton_call(
      x, blocks,
      out_shape=[jax.ShapeDtypeStruct((*batch, cb, rb), jnp.float32), jax.ShapeDtypeStruct(x.shape, dtype),
                 jax.ShapeDtypeStruct((*batch, rb, cb), jnp.float32), jax.ShapeDtypeStruct((*batch, c, r), dtype)],
      grid=(math.prod(batch) * cb * rb,), name="jgmm_quantize_pair_blocks_lanes", R=r, C=c, PB=rb, RT=r,
      TILE_SCALES=True, **_lanes_launch(dtype))
  return q, scale, qt, scale_t


def quantize_pair(x, *, recipe, dtype):
  """backend_xla.quantize_pair in one pass over x (quantize_pair_kernel; on CUDA quantize_pair_grouped_lanes_kernel,
  its blocks on the rows' 128-row grid), where the FP8 format has a Triton kernel on this device
  (check_fp8_format); an empty x and 128x128 blocks of a float32 x (triton_kernels/quantize.py's docstring says
  why) through backend_xla. jgmm.fp8.quantize_pair validated recipe and shape."""
  dtype = jnp.dtype(dtype)
  device = _device()
  check_fp8_format(dtype, device)
  if x.size == 0 or (recipe == "128x128" and x.dtype.itemsize != 2):
    return backend_xla.quantize_pair(x, recipe=recipe, dtype=dtype)
  *batch, r, c = x.shape
  g = batch[0] if batch else 1
  block = quantize_kernels.BLOCK.value
  rb, cb = geometry.cdiv(r, block), geometry.cdiv(c, block)
  rowwise = recipe == "1x128"
  if device.cuda:
    first = jnp.arange(rb, dtype=jnp.int32) * block
    blocks = jnp.stack([first, jnp.full_like(first, r)])  # [128 b, R): the rows' grid.
    if rowwise:
      return _quantize_pair_lanes(x, blocks, r, dtype, "jgmm_quantize_pair_lanes")
    return _quantize_pair_blocks_lanes(x, blocks, dtype)
  out_shape = [jax.ShapeDtypeStruct(x.shape, dtype),
               jax.ShapeDtypeStruct((r, cb) if rowwise else (*batch, rb, cb), jnp.float32),
               jax.ShapeDtypeStruct((*batch, c, r), dtype),
               jax.ShapeDtypeStruct((c, rb) if rowwise else (*batch, cb, rb), jnp.float32)]
  return tuple(ffi.triton_call(
      x, kernel=quantize_kernels.quantize_pair_kernel, out_shape=out_shape, grid=(rb, cb, g),
      num_warps=quantize_kernels.NUM_WARPS, name="jgmm_quantize_pair", R=r, C=c, FMAX=quantize.FP8_MAX[dtype],
      ROWWISE=rowwise))
