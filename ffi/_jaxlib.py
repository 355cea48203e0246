"""The one place that touches jaxlib's private Triton kernel-call API (``jax._src.lib.gpu_triton``).

Differences handled here, by feature detection on the installed jaxlib:
  * jax 0.10.2: ``TritonKernel(name, num_warps, num_ctas, shared_mem, ptx, ttir, compute_capability)``; no
    host-side TMA descriptor parameters (host TensorDescriptor arguments are refused).
  * jax 0.11.x / 0.12.x: ``TritonKernel(..., global_scratch_size=None, global_scratch_align=None)`` and
    ``create_tma_descriptor_parameter(elem_type, swizzle, shape, strides, block_shape, oob_fill)``: a parameter
    that takes the next buffer and encodes a CUDA tensor map over it at launch (NVIDIA only; strides in
    elements, row-major).
All versions launch the kernel with its parameters followed by two pointers for Triton's hidden params
(global scratch, profile scratch): null, or on 0.11+ a global scratch jaxlib allocates at every launch when
``global_scratch_size`` is set. jgmm.ffi never sets it (an allocation at launch cannot be captured into XLA's
command buffers): it passes an XLA-allocated buffer as one more array parameter, which lands in the kernel's
global-scratch slot (see _call.py). All versions serialize the call into the same ``TritonAnyKernelCall``
proto, read by the typed-FFI target ``triton_kernel_call_ffi`` (zlib-compressed, string attribute ``opaque``).

How the kernel becomes machine code (CUDA): jaxlib assembles the PTX it is handed with a ptxas it finds on the
machine (the CUDA toolkit of jax's plugin, /usr/local/cuda, PATH), never Triton's. From jaxlib 0.11.1 the proto's
``TritonKernel.module_image`` (field 11: ``object_file`` 1, ``kernel_name`` 2, ``shared_mem_bytes`` 3) may carry
the assembled binary instead, which jaxlib then loads as it is (cuModuleLoadData). The Python binding has no
argument for it, so the field is appended to the serialized proto (protobuf merges a repeated embedded message
into the first). jgmm hands jaxlib the cubin that Triton's bundled ptxas made (the binary Triton itself would
launch) where every driver of jax's plugin loads it (_compile.cubin_loads_everywhere: that ptxas is of the
plugin's CUDA major version or older), and keeps the PTX beside it (jaxlib keys its cache on it). JGMM_CUBIN=0
hands PTX only, for jaxlib's ptxas to assemble.
"""

import os
import re
import zlib

import jax
from jax._src.lib import version as _jaxlib_version

CUSTOM_CALL_TARGET = "triton_kernel_call_ffi"
SUPPORTED_JAXLIB = ((0, 10, 2), (0, 13, 0))  # [lowest, first unsupported)
MODULE_IMAGE_JAXLIB = (0, 11, 1)  # the first jaxlib whose TritonKernel proto takes an assembled binary
CUBIN_ENV = "JGMM_CUBIN"


def _gpu_triton():
  try:
    from jax._src.lib import gpu_triton
  except ImportError as e:
    raise RuntimeError("this jaxlib has no Triton kernel-call support (jax._src.lib.gpu_triton)") from e
  return gpu_triton


def check_supported() -> None:
  lowest, first_unsupported = SUPPORTED_JAXLIB
  version = tuple(_jaxlib_version[:3])
  if not lowest <= version < first_unsupported:
    raise RuntimeError(
        f"jgmm.ffi supports jaxlib >= {'.'.join(map(str, lowest))} and < "
        f"{'.'.join(map(str, first_unsupported))}; found jaxlib {jax.lib.__version__}. Its private Triton "
        "kernel-call API may differ: update ffi/_jaxlib.py after checking TritonKernel's signature.")


def has_plugin() -> bool:
  """Whether a jax GPU plugin's Triton bindings are installed: lowering a Triton kernel needs one, even on a CPU
  machine (jax-cuda13-plugin: pip install 'jgmm[cuda]')."""
  gpu_triton = _gpu_triton()
  return gpu_triton._cuda_triton is not None or gpu_triton._hip_triton is not None


def plugin(platform: str):
  """jaxlib's Triton bindings for 'cuda' or 'rocm'.

    Both plugins serialize the same proto, so when lowering for a platform whose plugin is not installed (e.g.
    'rocm' on a machine with the CUDA plugin) the other plugin's bindings serve.
    """
  check_supported()
  gpu_triton = _gpu_triton()
  own = gpu_triton._cuda_triton if platform == "cuda" else gpu_triton._hip_triton
  other = gpu_triton._hip_triton if platform == "cuda" else gpu_triton._cuda_triton
  module = own or other
  if module is None:
    raise RuntimeError(f"lowering a Triton kernel for {platform!r} needs a jax GPU plugin (jax-cuda13-plugin / "
                       "jax-rocm-plugin) installed, even to lower without a GPU: pip install 'jgmm[cuda]'")
  return module


def plugin_cuda_major() -> int | None:
  """The CUDA major version jax's CUDA plugin is built for (jax_cuda13_plugin: 13), or None without one."""
  module = _gpu_triton()._cuda_triton
  match = re.match(r"jax_cuda(\d+)_plugin", getattr(module, "__name__", ""))
  return int(match.group(1)) if match else None


def takes_cubin() -> bool:
  """Whether jgmm hands jaxlib an assembled cubin (jaxlib >= 0.11.1, unless JGMM_CUBIN=0)."""
  return tuple(_jaxlib_version[:3]) >= MODULE_IMAGE_JAXLIB and os.environ.get(CUBIN_ENV, "1") != "0"


def _varint(n: int) -> bytes:
  out = bytearray()
  while n > 0x7F:
    out.append(n & 0x7F | 0x80)
    n >>= 7
  out.append(n)
  return bytes(out)


def _field(number: int, value: bytes | int) -> bytes:
  """One serialized protobuf field: a varint (int value) or length-delimited (bytes value)."""
  if isinstance(value, int):
    return _varint(number << 3) + _varint(value)
  return _varint(number << 3 | 2) + _varint(len(value)) + value


def module_image_field(kernel_name: str, cubin: bytes, shared_mem_bytes: int) -> bytes:
  """Serialized TritonAnyKernelCall{kernel_call: {kernel: {module_image: {object_file, kernel_name, shared_mem}}}}:
    appended to a serialized call, it sets that call's module image."""
  image = _field(1, cubin) + _field(2, kernel_name.encode()) + _field(3, shared_mem_bytes)
  return _field(1, _field(1, _field(11, image)))


def supports_tma_descriptors(module) -> bool:
  return hasattr(module, "create_tma_descriptor_parameter")


def check_tma_descriptors(module, platform: str, kernel_name: str) -> None:
  """Raises NotImplementedError unless jaxlib can build host-side TMA descriptors for `platform`."""
  if platform != "cuda":
    raise NotImplementedError(
        f"kernel {kernel_name!r} takes a host TensorDescriptor; jaxlib {jax.lib.__version__} builds host-side "
        f"TMA descriptors only for NVIDIA GPUs, not {platform!r}")
  if not supports_tma_descriptors(module):
    raise NotImplementedError(
        f"kernel {kernel_name!r} takes a host TensorDescriptor; jaxlib {jax.lib.__version__} has no "
        "create_tma_descriptor_parameter (needs jaxlib >= 0.11)")


def array_parameter(module, bytes_to_zero: int, divisibility: int):
  return module.create_array_parameter(bytes_to_zero, divisibility)


def scalar_parameter(module, value, triton_type: str):
  return module.create_scalar_parameter(value, triton_type)


def tma_descriptor_parameter(module, *, elem_type: int, swizzle: int, shape: tuple, strides: tuple, block_shape: tuple,
                             nan_padding: bool):
  """A CUtensorMap over the next buffer (elem_type: host CUtensorMapDataType; strides in elements)."""
  return module.create_tma_descriptor_parameter(elem_type, swizzle, list(shape), list(strides), list(block_shape),
                                                int(nan_padding))


def serialized_call(module, *, kernel_name: str, call_name: str, num_warps: int, num_ctas: int, shared_mem_bytes: int,
                    binary: str, compute_capability: int, grid: tuple, parameters: list,
                    cubin: bytes | None = None) -> bytes:
  """The custom call's ``opaque`` attribute: a zlib-compressed TritonAnyKernelCall proto.

    num_ctas: CTAs per cluster: jaxlib launches grid[0] * num_ctas CTAs in clusters of (num_ctas, 1, 1).
    cubin: the kernel assembled for compute_capability, carried as its module image where takes_cubin().
    """
  kernel = module.TritonKernel(kernel_name, num_warps, num_ctas, shared_mem_bytes, binary, "", compute_capability)
  call = module.TritonKernelCall(kernel, *grid, parameters)
  proto = call.to_proto(call_name, b"")
  if cubin and takes_cubin():
    proto += module_image_field(kernel_name, cubin, shared_mem_bytes)
  return zlib.compress(proto)
