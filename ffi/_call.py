"""triton_call: a JAX primitive that runs a @triton.jit kernel as an XLA custom call.

Lowerings: 'cuda' and 'rocm' compile the kernel with Triton for the device architecture and emit the typed-FFI
custom call `triton_kernel_call_ffi`; 'cpu' runs the kernel under Triton's interpreter through a host callback
when TRITON_INTERPRET=1 at lowering time, and raises otherwise.
"""

import dataclasses
import functools
import itertools
import operator
import os
from collections.abc import Sequence

import jax
import numpy as np
import triton
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from triton.compiler import make_backend
from triton.experimental.gluon.language import NVMMASharedLayout

from jgmm.ffi import _compile, _dtypes, _jaxlib
from jgmm.ffi.interpret import host_tensor_descriptor, run_interpreted

_MAX_GRID = (2**31 - 1, 65535, 65535)  # CUDA launch limits per axis (ROCm's are at least as large)


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
  """A host-side TMA tensor descriptor over a whole array, for a kernel's tensor-descriptor param.

    Pass it to triton_call in place of the array: the kernel param (used as `desc.load([i, j])`,
    `desc.store(...)`) gets a CUDA tensor map that jaxlib encodes over the array's buffer at launch, plus the
    shape and strides Triton's launcher passes with it. The descriptor spans base's full shape, row-major.

    base: a jax array, rank 1-5, every dimension >= 1 and < 2**31, rows a multiple of 16 bytes.
    block_shape: the tile one load/store moves, one power of 2 per dimension of base.
    padding: what loads read outside base: "zero", or "nan" (float dtypes only).
    layout: for a Gluon kernel, the shared-memory layout its param declares (a gluon NVMMASharedLayout); None
      for @triton.jit kernels, where Triton picks it.

    Needs a CUDA GPU with TMA (sm_90+) and jaxlib >= 0.11; runs anywhere under TRITON_INTERPRET=1.
    """

  base: object
  block_shape: tuple
  padding: str = "zero"
  layout: object = None


@dataclasses.dataclass(frozen=True)
class _Descriptor:
  """The static part of a TensorDescriptor argument; its base is the next array operand."""

  block_shape: tuple
  padding: str
  layout: object

  def triton_type(self, dtype) -> str:
    layout = "" if self.layout is None else f",{self.layout!r}"
    return f"tensordesc<{_dtypes.triton_type(dtype)}[{', '.join(map(str, self.block_shape))}]{layout}>"


@dataclasses.dataclass(frozen=True)
class _Scalar:
  """A python scalar kernel argument, static in the traced program."""

  triton_type: str
  value: bool | int | float


@dataclasses.dataclass(frozen=True)
class _Tuple:
  """A tuple-of-pointers kernel argument (a Triton tuple param); its arrays are the next `size` operands."""

  size: int


@dataclasses.dataclass(frozen=True)
class _Call:
  """Everything about one launch except the array operands; hashable (a primitive parameter).

    args: per positional kernel argument, None for an array operand (in operand order), a _Descriptor over the
      next array operand, a _Tuple over the next operands, or a _Scalar.
    aliases: (operand index, output index) pairs: the output's buffer is that operand's buffer.
    aliased_outputs_appended: whether the kernel takes a pointer param for aliased outputs too (all outputs
      appended after the args) or only for the others (the aliased operand's param is the output).
    out_params: per output param after the args, None for a pointer or the size of a tuple of pointers (over
      that many consecutive outputs); all None without tuple outputs.
    """

  kernel: object
  name: str
  args: tuple
  out_avals: tuple
  grid: tuple
  num_warps: int
  num_stages: int
  maxnreg: int | None
  num_ctas: int
  constexprs: tuple
  aliases: tuple
  aliased_outputs_appended: bool
  zeroed_outputs: tuple
  out_params: tuple

  @property
  def alias_of_output(self) -> dict:
    return {out: operand for operand, out in self.aliases}

  @property
  def appended_outputs(self) -> list:
    """Output indices that get a pointer param after the args, in param order."""
    return [k for k in range(len(self.out_avals)) if self.aliased_outputs_appended or k not in self.alias_of_output]

  def output_params(self, values: list) -> list:
    """`values` (one per appended output) grouped as the kernel's output params: tuples where out_params says."""
    values, params = iter(values), []
    for size in self.out_params:
      params.append(next(values) if size is None else tuple(next(values) for _ in range(size)))
    return params


triton_call_p = Primitive("jgmm_triton_call")
triton_call_p.multiple_results = True


def _abstract_eval(*avals, call: _Call):
  del avals
  return list(call.out_avals)


triton_call_p.def_abstract_eval(_abstract_eval)


@functools.partial(jax.jit, static_argnames="call")
def _impl(*operands, call: _Call):
  """Outside jit: compile the one call (cached per call) and run it."""
  return triton_call_p.bind(*operands, call=call)


triton_call_p.def_impl(_impl)


def _jvp(primals, tangents, *, call: _Call):
  del primals, tangents
  raise NotImplementedError(
      f"triton_call of {call.name!r} has no derivative rule: wrap it in jax.custom_vjp with a backward pass")


ad.primitive_jvps[triton_call_p] = _jvp


def _batch(operands, dims, *, call: _Call):
  """vmap: one launch per batch element, in a lax.map loop."""
  batched_index = [i for i, d in enumerate(dims) if d is not None]
  batched = [jax.numpy.moveaxis(operands[i], dims[i], 0) for i in batched_index]

  def one(slices):
    full = list(operands)
    for i, x in zip(batched_index, slices):
      full[i] = x
    return triton_call_p.bind(*full, call=call)

  return lax.map(one, batched), [0] * len(call.out_avals)


batching.primitive_batchers[triton_call_p] = _batch

# ---------------------------------------------------------------------------------------------------------------
# GPU lowering


def _lowering_target(platform: str, ctx) -> _compile.Target:
  named = _compile.env_target(platform)
  if named is not None:
    return named
  axis_context = ctx.module_context.axis_context
  devices = getattr(axis_context, "device_assignment", None)
  if devices is None and getattr(axis_context, "mesh", None) is not None:
    devices = getattr(axis_context.mesh, "devices", None)
  devices = list(np.asarray(devices, dtype=object).flat) if devices is not None else []
  if not devices:
    try:
      devices = jax.devices(platform)
    except RuntimeError:
      devices = []
  targets = {_compile.device_target(platform, d) for d in devices} - {None}
  if not targets:
    raise RuntimeError(
        f"cannot tell which {platform} GPU to compile the Triton kernel for (no {platform} device in this "
        f"computation); set {_compile.TARGET_ENV}, e.g. {_compile.TARGET_ENV}=cuda:90 or rocm:gfx942")
  if len(targets) > 1:
    raise ValueError(f"the computation spans GPUs of different architectures {sorted(map(str, targets))}; "
                     "one Triton custom call carries one binary")
  return targets.pop()


def _pointer_attrs(target: _compile.Target, aval) -> str:
  """Triton specialization of a pointer param: 16-byte aligned (XLA buffers are), and on ROCm within 2 GiB."""
  desc = "D"
  if target.platform == "rocm" and triton.knobs.amd.use_buffer_ops and aval.size * aval.dtype.itemsize < 2**31:
    desc += "S"
  return desc


def _specialize(call: _Call, target: _compile.Target, operand_avals):
  """Triton signature, constexprs, attrs for `call`, and per value jaxlib passes to the kernel: None (a constexpr
    1), ('array', buffer, aval) (also one per element of a tuple param), ('descriptor', buffer, aval, _Descriptor)
    or ('scalar', _Scalar)."""
  backend = make_backend(target.triton_target)
  fn = _compile.jit_function(call.kernel)
  constexprs = dict(call.constexprs)
  runtime_params = [p for p in fn.params if not p.is_constexpr]
  operand_iter = iter(range(len(operand_avals)))
  # Per runtime param: ('array', buffer index, aval), ('descriptor', buffer index, aval, _Descriptor),
  # ('tuple', ((buffer index, aval), ...)) or ('scalar', _Scalar).
  arg_values = []
  for arg in call.args:
    if isinstance(arg, _Scalar):
      arg_values.append(("scalar", arg))
    elif isinstance(arg, _Tuple):
      arg_values.append(("tuple", tuple((i, operand_avals[i]) for i in itertools.islice(operand_iter, arg.size))))
    else:
      i = next(operand_iter)
      arg_values.append(("array", i, operand_avals[i]) if arg is None else ("descriptor", i, operand_avals[i], arg))
  n_operands = len(operand_avals)
  outputs = [(n_operands + rank, call.out_avals[k]) for rank, k in enumerate(call.appended_outputs)]
  for param in call.output_params(outputs):
    arg_values.append(("tuple", param) if isinstance(param[0], tuple) else ("array", *param))
  signature, attrs, launch = {}, {}, []
  for p in fn.params:
    if p.is_constexpr:
      signature[p.name] = "constexpr"
  for p, (kind, *value) in zip(runtime_params, arg_values):
    if kind == "tuple":
      (elements,) = value
      signature[p.name] = tuple("*" + _dtypes.triton_type(aval.dtype) for _, aval in elements)
      for j, (buffer, aval) in enumerate(elements):
        if not (p.do_not_specialize or p.do_not_specialize_on_alignment):
          attrs[(p.num, j)] = backend.parse_attr(_pointer_attrs(target, aval))
        launch.append(("array", buffer, aval))
      continue
    if kind == "array":
      _, aval = value
      signature[p.name] = "*" + _dtypes.triton_type(aval.dtype)
      if not (p.do_not_specialize or p.do_not_specialize_on_alignment):
        attrs[(p.num,)] = backend.parse_attr(_pointer_attrs(target, aval))
      launch.append((kind, *value))
      continue
    if kind == "descriptor":
      _, aval, descriptor = value
      signature[p.name] = descriptor.triton_type(aval.dtype)
      launch.append((kind, *value))
      continue
    (scalar,) = value
    is_int = scalar.triton_type not in ("i1", "fp32")
    if is_int and scalar.value == 1 and not p.do_not_specialize:
      signature[p.name] = "constexpr"
      constexprs[p.name] = 1
      launch.append(None)
      continue
    signature[p.name] = scalar.triton_type
    if is_int and scalar.value % 16 == 0 and not (p.do_not_specialize or p.do_not_specialize_on_alignment):
      attrs[(p.num,)] = backend.parse_attr("D")
    launch.append((kind, scalar))
  return {p.name: signature[p.name] for p in fn.params}, constexprs, attrs, launch


def _descriptor_parameters(module, meta: dict, aval, descriptor: _Descriptor, call_name: str) -> list:
  """jaxlib parameters for one host tensor-descriptor param, as Triton's CUDA launcher expands it: the tensor
    map (encoded by jaxlib over the operand's buffer), then the shape as i32 and the strides as i64."""
  if meta.get("is_im2col") or meta.get("fp4_padded"):
    raise NotImplementedError(f"{call_name}: im2col and fp4-padded tensor descriptors are not supported")
  from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST  # only the CUDA backend has it

  shape = tuple(aval.shape)
  strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
  parameters = [
      _jaxlib.tma_descriptor_parameter(module,
                                       elem_type=TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
                                       swizzle=meta["swizzle"],
                                       shape=shape,
                                       strides=strides,
                                       block_shape=tuple(meta["block_size"]),
                                       nan_padding=descriptor.padding == "nan")
  ]
  parameters += [_jaxlib.scalar_parameter(module, dim, "i32") for dim in shape]
  parameters += [_jaxlib.scalar_parameter(module, stride, "i64") for stride in strides]
  return parameters


def _global_scratch(compiled: _compile.CompiledKernel, grid: tuple):
  """The aval of the global scratch a kernel needs (device-side tensor descriptors), or None.

    Triton addresses it as base + linear CTA id * per-CTA size, so it spans the whole grid's CTAs. XLA
    allocates it as one more result of the custom call, so the launch allocates nothing: an allocation at
    launch (jaxlib's own scratch) cannot be captured into XLA's command buffers (CUDA graphs).
    """
  if not compiled.global_scratch_size:
    return None
  align = compiled.global_scratch_align
  per_program = -(-compiled.global_scratch_size // align) * align
  return jax.core.ShapedArray((max(per_program * int(np.prod(grid)) * compiled.num_ctas, align),), np.uint8)


def _gpu_lowering(ctx, *operands, call: _Call, platform: str):
  target = _lowering_target(platform, ctx)
  module = _jaxlib.plugin(platform)
  has_descriptors = any(isinstance(arg, _Descriptor) for arg in call.args)
  if has_descriptors:
    _jaxlib.check_tma_descriptors(module, platform, call.name)
  signature, constexprs, attrs, launch = _specialize(call, target, ctx.avals_in)
  compiled = _compile.compile_kernel(call.kernel, signature, constexprs, attrs, target, call.num_warps, call.num_stages,
                                     call.maxnreg, call.num_ctas)
  if has_descriptors and not compiled.tensordesc_meta:
    raise NotImplementedError(
        f"{call.name}: Triton lowered the kernel's tensor-descriptor params to plain pointers for {target} (no "
        "TMA); host TensorDescriptor arguments need a GPU with TMA (cuda:90 or newer)")
  # Bytes to zero per buffer: zeroed outputs, on the operand buffer when the output aliases an operand.
  alias_of_output = call.alias_of_output
  appended = call.appended_outputs
  n_operands = len(operands)
  zero_bytes = {}
  for k in call.zeroed_outputs:
    aval = call.out_avals[k]
    buffer = alias_of_output[k] if k in alias_of_output else n_operands + appended.index(k)
    zero_bytes[buffer] = aval.size * aval.dtype.itemsize
  parameters = []
  descriptor_meta = iter(compiled.tensordesc_meta)
  for entry in launch:
    if entry is None:
      continue
    kind, *value = entry
    if kind == "scalar":
      (scalar,) = value
      parameters.append(_jaxlib.scalar_parameter(module, scalar.value, scalar.triton_type))
    elif kind == "descriptor":
      _, aval, descriptor = value
      parameters += _descriptor_parameters(module, next(descriptor_meta), aval, descriptor, call.name)
    else:
      buffer, _ = value
      parameters.append(_jaxlib.array_parameter(module, zero_bytes.get(buffer, 0), 16))
  scratch = _global_scratch(compiled, call.grid)
  if scratch is not None:
    # One more array parameter after the kernel's own: it fills the kernel's hidden global-scratch param
    # (jaxlib's own two trailing pointers then fill the profile-scratch slot and one past the end).
    parameters.append(_jaxlib.array_parameter(module, 0, compiled.global_scratch_align))
  opaque = _jaxlib.serialized_call(module,
                                   kernel_name=compiled.name,
                                   call_name=call.name,
                                   num_warps=compiled.num_warps,
                                   num_ctas=compiled.num_ctas,
                                   shared_mem_bytes=compiled.shared_mem_bytes,
                                   binary=compiled.binary,
                                   compute_capability=target.arch if target.platform == "cuda" else 0,
                                   grid=call.grid,
                                   parameters=parameters,
                                   cubin=compiled.asm["cubin"] if _compile.cubin_loads_everywhere(target) else None)
  # jaxlib hands the kernel its buffers in order (operands, then results): results whose buffer the kernel
  # takes as a param come first, then the scratch, and aliased results it does not take go last.
  scratch_result = len(call.out_avals)
  result_order = appended + ([scratch_result] if scratch is not None else [])
  result_order += [k for k in range(len(call.out_avals)) if k not in appended]
  result_avals = call.out_avals + (scratch,)
  custom_ctx = ctx.replace(avals_out=[result_avals[k] for k in result_order])
  rule = jax.ffi.ffi_lowering(_jaxlib.CUSTOM_CALL_TARGET,
                              api_version=4,
                              has_side_effect=False,
                              operand_output_aliases={
                                  operand: result_order.index(k) for operand, k in call.aliases
                              })
  results = rule(custom_ctx, *operands, opaque=opaque)
  by_output = dict(zip(result_order, results))
  return [by_output[k] for k in range(len(call.out_avals))]


for _platform in ("cuda", "rocm"):
  mlir.register_lowering(triton_call_p, functools.partial(_gpu_lowering, platform=_platform), platform=_platform)

# ---------------------------------------------------------------------------------------------------------------
# CPU lowering: Triton's interpreter in a host callback


def _poisoned(aval) -> np.ndarray:
  """An output buffer whose unwritten elements stand out: NaN for floats, the minimum for integers."""
  dtype = np.dtype(aval.dtype)
  if dtype == np.bool_:
    return np.ones(aval.shape, dtype)
  if np.issubdtype(dtype, np.integer):
    return np.full(aval.shape, np.iinfo(dtype).min, dtype)
  return np.full(aval.shape, np.nan, dtype)


def _run_on_host(call: _Call, *operands):
  inputs = [np.array(x, copy=True, order="C") for x in operands]
  alias_of_output = call.alias_of_output
  outputs = []
  for k, aval in enumerate(call.out_avals):
    if k in alias_of_output:
      buffer = inputs[alias_of_output[k]]
      if k in call.zeroed_outputs:
        buffer[...] = 0
    elif k in call.zeroed_outputs:
      buffer = np.zeros(aval.shape, aval.dtype)
    else:
      buffer = _poisoned(aval)
    outputs.append(buffer)
  operand_iter = iter(inputs)
  args = []
  for arg in call.args:
    if isinstance(arg, _Scalar):
      args.append(arg.value)
    elif isinstance(arg, _Descriptor):
      args.append(host_tensor_descriptor(next(operand_iter), arg.block_shape, arg.padding))
    elif isinstance(arg, _Tuple):
      args.append(tuple(itertools.islice(operand_iter, arg.size)))
    else:
      args.append(next(operand_iter))
  args += call.output_params([outputs[k] for k in call.appended_outputs])
  run_interpreted(call.kernel, call.grid, args, dict(call.constexprs))
  return outputs


def _cpu_lowering(ctx, *operands, call: _Call):
  if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError(
        f"Triton kernels need a GPU platform (cuda/rocm); platform 'cpu' cannot run kernel {call.name!r}. "
        "Set TRITON_INTERPRET=1 to interpret it on the host (slow, for tests).")
  if call.num_ctas != 1:
    raise NotImplementedError(f"{call.name}: Triton's interpreter has no clusters (num_ctas={call.num_ctas}); "
                              "run the kernel on a CUDA GPU (sm_90 or newer)")
  result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in call.out_avals]

  def host_call(*xs):
    return jax.pure_callback(functools.partial(_run_on_host, call), result_shapes, *xs)

  return mlir.lower_fun(host_call, multiple_results=True)(ctx, *operands)


mlir.register_lowering(triton_call_p, _cpu_lowering, platform="cpu")

# ---------------------------------------------------------------------------------------------------------------
# Public entry point


def _normalize_grid(grid, meta: dict, name: str) -> tuple:
  if callable(grid):
    grid = grid(meta)
  if isinstance(grid, int):
    grid = (grid,)
  try:
    grid = tuple(operator.index(g) for g in grid)
  except TypeError as e:
    raise TypeError(f"{name}: grid must be 1-3 python ints (or a callable of the metaparameters returning "
                    f"them), got {grid!r}") from e
  if not 1 <= len(grid) <= 3 or any(g < 0 for g in grid):
    raise ValueError(f"{name}: grid must be 1-3 non-negative ints, got {grid}")
  grid = grid + (1,) * (3 - len(grid))
  if any(g > limit for g, limit in zip(grid, _MAX_GRID)):
    raise ValueError(f"{name}: grid {grid} exceeds the launch limits {_MAX_GRID}")
  return grid


def _static_descriptor(descriptor: TensorDescriptor, i: int, name: str) -> _Descriptor:
  """Checks a TensorDescriptor argument at trace time; returns its static part."""
  base = descriptor.base
  what = f"{name}: argument {i} (TensorDescriptor)"
  if not (hasattr(base, "shape") and hasattr(base, "dtype")):
    raise TypeError(f"{what}: base must be a jax array, got {type(base).__name__}")
  _dtypes.triton_type(base.dtype)
  shape, itemsize = tuple(base.shape), np.dtype(base.dtype).itemsize
  if not 1 <= len(shape) <= 5 or not all(1 <= d < 2**31 for d in shape):
    raise ValueError(f"{what}: base must have rank 1-5 and dimensions in [1, 2**31), got shape {shape}")
  if len(shape) > 1 and shape[-1] * itemsize % 16:
    raise ValueError(f"{what}: base rows must be a multiple of 16 bytes (TMA strides), got shape {shape} of "
                     f"{np.dtype(base.dtype).name}")
  try:
    block_shape = tuple(operator.index(b) for b in descriptor.block_shape)
  except TypeError as e:
    raise TypeError(f"{what}: block_shape must be ints, got {descriptor.block_shape!r}") from e
  if len(block_shape) != len(shape) or any(b < 1 or b & (b - 1) for b in block_shape):
    raise ValueError(f"{what}: block_shape must be one power of 2 per dimension of base {shape}, got "
                     f"{block_shape}")
  if descriptor.padding not in ("zero", "nan"):
    raise ValueError(f"{what}: padding must be 'zero' or 'nan', got {descriptor.padding!r}")
  if descriptor.padding == "nan" and not jax.numpy.issubdtype(base.dtype, np.floating):
    raise ValueError(f"{what}: padding='nan' needs a floating-point base, got {np.dtype(base.dtype).name}")
  if descriptor.layout is not None and not isinstance(descriptor.layout, NVMMASharedLayout):
    raise TypeError(f"{what}: layout must be None or a gluon NVMMASharedLayout, got {descriptor.layout!r}")
  return _Descriptor(block_shape, descriptor.padding, descriptor.layout)


def triton_call(*args,
                kernel,
                out_shape,
                grid,
                num_warps: int = 4,
                num_stages: int = 3,
                maxnreg: int | None = None,
                num_ctas: int = 1,
                input_output_aliases: dict | None = None,
                zeroed_outputs: Sequence[int] = (),
                name: str | None = None,
                **constexprs):
  """Calls a @triton.jit (or @gluon.jit) kernel on JAX arrays; usable inside jit (vmap loops over the batch, no
    autodiff).

    Args:
      *args: the kernel's non-constexpr params in order: jax arrays (any shape, row-major, passed as pointers),
        tuples of jax arrays (for a Triton tuple param: a tuple of pointers, indexed in the kernel with constexpr
        indices), TensorDescriptors (for tensor-descriptor params: a host TMA descriptor over an array) and python
        bool/int/float scalars (static: baked into the compiled kernel's launch; ints equal to 1 and multiples of
        16 specialize the kernel as Triton's launcher does).
      kernel: a @triton.jit function.
      out_shape: a jax.ShapeDtypeStruct (then one array is returned) or a sequence of them (then a list).
        Each output gets a pointer param after all args, in order. An output aliased to an input (see
        input_output_aliases) either also gets one (the kernel then sees that buffer twice) or, if the kernel
        declares exactly one param fewer per aliased output, is written through the input's param. An element
        of the sequence may itself be a tuple of ShapeDtypeStructs: one tuple param of pointers, returned as a
        list of arrays in its place (no aliases then; output indices elsewhere count the arrays one by one).
      grid: 1-3 ints, or a callable(meta) -> ints where meta holds the constexprs, num_warps and num_stages.
      num_warps, num_stages, maxnreg: Triton compile options (maxnreg: registers per thread, 24-255, CUDA; None:
        Triton's default). A warp-specialised kernel launches with all its partitions' warps.
      num_ctas: CTAs per cluster (CUDA sm_90+, a Gluon kernel whose layouts say how the CTAs share each tensor, e.g.
        TMA multicast): grid counts clusters, and the launch runs num_ctas CTAs for each.
      input_output_aliases: {index into args: output index}: the output starts as (and reuses) that input, an
        array (not a TensorDescriptor).
      zeroed_outputs: output indices set to zero before the launch (the others start undefined).
      name: name of the call in errors and profiles; defaults to the kernel's name.
      **constexprs: the kernel's tl.constexpr params by name (defaults apply to those left out).

    Returns:
      The output array(s), shaped and typed as out_shape.
    """
  fn = _compile.jit_function(kernel)
  name = name or fn.__name__
  single = not isinstance(out_shape, Sequence)
  out_entries = [out_shape] if single else list(out_shape)
  entry_sizes = tuple(len(e) if isinstance(e, (tuple, list)) else None for e in out_entries)
  if any(size == 0 for size in entry_sizes):
    raise ValueError(f"{name}: a tuple of outputs in out_shape must not be empty")
  flat_shapes = [s for e in out_entries for s in (e if isinstance(e, (tuple, list)) else [e])]
  out_avals = tuple(jax.core.ShapedArray(tuple(s.shape), s.dtype) for s in flat_shapes)
  for aval in out_avals:
    _dtypes.triton_type(aval.dtype)

  constexpr_params = {p.name: p for p in fn.params if p.is_constexpr}
  unknown = set(constexprs) - set(constexpr_params)
  if unknown:
    raise TypeError(f"{name}: {sorted(unknown)} are not constexpr params of the kernel; its constexpr params "
                    f"are {sorted(constexpr_params)}")
  full_constexprs = {}
  for pname, p in constexpr_params.items():
    if pname in constexprs:
      full_constexprs[pname] = constexprs[pname]
    elif p.has_default:
      full_constexprs[pname] = p.default
    else:
      raise TypeError(f"{name}: missing constexpr param {pname!r}")

  operands, call_args, operand_index = [], [], {}
  for i, arg in enumerate(args):
    if isinstance(arg, (tuple, list)):
      if not arg or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in arg):
        raise TypeError(f"{name}: argument {i} must be a non-empty tuple of jax arrays, got {arg!r}")
      for x in arg:
        _dtypes.triton_type(x.dtype)
      call_args.append(_Tuple(len(arg)))
      operands += arg
    elif isinstance(arg, (bool, int, float, np.bool_, np.integer, np.floating)):
      value = arg.item() if isinstance(arg, np.generic) else arg
      call_args.append(_Scalar(_dtypes.scalar_type(value), value))
    elif isinstance(arg, TensorDescriptor):
      call_args.append(_static_descriptor(arg, i, name))
      operands.append(arg.base)
    elif hasattr(arg, "shape") and hasattr(arg, "dtype"):
      _dtypes.triton_type(arg.dtype)
      call_args.append(None)
      operand_index[i] = len(operands)
      operands.append(arg)
    else:
      raise TypeError(f"{name}: argument {i} must be a jax array, a tuple of them, a TensorDescriptor or a "
                      f"python bool/int/float, got {type(arg).__name__}")

  aliases = []
  for arg_i, out_k in (input_output_aliases or {}).items():
    if arg_i not in operand_index:
      raise ValueError(f"{name}: input_output_aliases key {arg_i} must index an array argument")
    if not 0 <= out_k < len(out_avals):
      raise ValueError(f"{name}: input_output_aliases value {out_k} is not an output index")
    operand = operands[operand_index[arg_i]]
    if tuple(operand.shape) != out_avals[out_k].shape or np.dtype(operand.dtype) != out_avals[out_k].dtype:
      raise ValueError(f"{name}: aliased argument {arg_i} has shape/dtype {tuple(operand.shape)} "
                       f"{np.dtype(operand.dtype)}, output {out_k} is {out_avals[out_k].str_short()}")
    aliases.append((operand_index[arg_i], out_k))
  if len({k for _, k in aliases}) != len(aliases):
    raise ValueError(f"{name}: input_output_aliases maps two inputs to one output")
  if aliases and any(size is not None for size in entry_sizes):
    raise ValueError(f"{name}: input_output_aliases cannot be combined with a tuple of outputs")
  zeroed = tuple(sorted(set(zeroed_outputs)))
  if any(not 0 <= k < len(out_avals) for k in zeroed):
    raise ValueError(f"{name}: zeroed_outputs {zeroed} must index outputs (0..{len(out_avals) - 1})")

  n_runtime = sum(not p.is_constexpr for p in fn.params)
  if n_runtime == len(args) + len(entry_sizes):
    aliased_outputs_appended, out_params = True, entry_sizes
  elif aliases and n_runtime == len(args) + len(entry_sizes) - len(aliases):
    aliased_outputs_appended, out_params = False, entry_sizes[len(aliases):]  # all None: no tuples with aliases
  else:
    raise TypeError(f"{name}: the kernel has {n_runtime} non-constexpr params, but {len(args)} args and "
                    f"{len(entry_sizes)} outputs (a tuple of them counting as one) were given")

  if maxnreg is not None and (type(maxnreg) is not int or not 24 <= maxnreg <= 255):
    raise ValueError(f"{name}: maxnreg must be None or an int in [24, 255] (registers per thread), got {maxnreg!r}")
  if type(num_ctas) is not int or num_ctas not in (1, 2, 4, 8, 16):
    raise ValueError(f"{name}: num_ctas must be an int in (1, 2, 4, 8, 16) (CTAs per cluster), got {num_ctas!r}")
  meta = dict(full_constexprs, num_warps=num_warps, num_stages=num_stages)
  call = _Call(kernel=kernel,
               name=name,
               args=tuple(call_args),
               out_avals=out_avals,
               grid=_normalize_grid(grid, meta, name),
               num_warps=int(num_warps),
               num_stages=int(num_stages),
               maxnreg=maxnreg,
               num_ctas=num_ctas,
               constexprs=tuple(sorted(full_constexprs.items())),
               aliases=tuple(sorted(aliases)),
               aliased_outputs_appended=aliased_outputs_appended,
               zeroed_outputs=zeroed,
               out_params=out_params)
  outs = triton_call_p.bind(*operands, call=call)
  if single:
    return outs[0]
  outs = iter(outs)
  return [next(outs) if size is None else [next(outs) for _ in range(size)] for size in entry_sizes]
