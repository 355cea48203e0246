"""Compile a @triton.jit kernel for one GPU architecture, with an in-process cache.

Triton's own on-disk cache (TRITON_CACHE_DIR, default ~/.triton/cache) makes a second process skip the
compiler passes; the in-process cache makes re-lowering within one process free.

PTX version (CUDA): Triton stamps its PTX with the newest ISA its bundled ptxas knows (Triton 3.9: 9.4, from
CUDA 13.4), which an older CUDA's ptxas rejects. jgmm asks Triton (its `ptx_version` option, which Triton's
passes also see) for at most the ISA of the first release of the CUDA major version that jax's GPU plugin is
built for (jax_cuda13_plugin: CUDA 13.0, ISA 9.0; jax_cuda12_plugin: 8.0), which every ptxas jaxlib accepts
for that plugin can assemble, but never below the lowest ISA that can target the GPU (ptx_version).
JGMM_PTX_VERSION=9.2 (say) names the version instead.
"""

import dataclasses
import functools
import os
import tempfile
import threading

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from jgmm.ffi import _jaxlib

TARGET_ENV = "JGMM_TARGET"
PTX_VERSION_ENV = "JGMM_PTX_VERSION"


class KernelCompileError(RuntimeError):
  """Triton could not compile a kernel (the message names the kernel and the target)."""


@dataclasses.dataclass(frozen=True)
class Target:
  """One GPU architecture: platform 'cuda' with compute capability (90 = sm_90) or 'rocm' with a gfx arch."""

  platform: str
  arch: int | str

  @property
  def triton_target(self) -> GPUTarget:
    if self.platform == "cuda":
      return GPUTarget("cuda", self.arch, 32)
    return GPUTarget("hip", self.arch, 64)

  def __str__(self):
    return f"{self.platform}:{self.arch}"


def parse_target(text: str) -> Target:
  """'cuda:90' / 'cuda:80' / 'rocm:gfx942' / 'rocm:gfx950' -> Target."""
  platform, _, arch = text.strip().partition(":")
  if platform == "cuda" and arch.isdigit():
    return Target("cuda", int(arch))
  if platform == "rocm" and arch.startswith("gfx"):
    return Target("rocm", arch)
  raise ValueError(f"{TARGET_ENV}={text!r}: expected 'cuda:<compute capability>' such as cuda:90, or "
                   "'rocm:<gfx arch>' such as rocm:gfx942")


def env_target(platform: str) -> Target | None:
  """The architecture named by JGMM_TARGET, if it names `platform`."""
  text = os.environ.get(TARGET_ENV)
  if not text:
    return None
  target = parse_target(text)
  return target if target.platform == platform else None


def device_target(platform: str, device) -> Target | None:
  """The architecture of one jax device, or None if it is not a `platform` GPU."""
  capability = getattr(device, "compute_capability", None)
  if not capability:
    return None
  if platform == "cuda" and "." in str(capability):
    major, minor = str(capability).split(".")[:2]
    return Target("cuda", int(major) * 10 + int(minor))
  if platform == "rocm":
    if str(capability).startswith("gfx"):
      return Target("rocm", str(capability).split(":")[0])
    return Target("rocm", _jaxlib.plugin("rocm").get_arch_details(device.local_hardware_id).split(":")[0])
  return None


# The lowest PTX ISA version that can target each compute capability (NVIDIA's PTX ISA notes; the 'a' variants
# Triton uses from sm_90 on). Below it LLVM aborts the process, so a lower JGMM_PTX_VERSION is refused first.
_MIN_PTX_VERSION = {80: 70, 86: 71, 87: 74, 89: 78, 90: 80, 100: 86, 101: 86, 103: 88, 110: 90, 120: 87, 121: 88}


def ptx_version(target: Target) -> int | None:
  """The PTX ISA version (major * 10 + minor) to compile `target` for; None for ROCm.

    JGMM_PTX_VERSION if set; else Triton's own for the target, capped at the ISA of CUDA <jax plugin major>.0 but
    never below the lowest that targets the architecture (a ptxas that knows the GPU knows that one too).
    """
  if target.platform != "cuda":
    return None
  lowest = _MIN_PTX_VERSION.get(target.arch)
  text = os.environ.get(PTX_VERSION_ENV)
  if text:
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and len(minor) == 1):
      raise ValueError(f"{PTX_VERSION_ENV}={text!r}: expected a PTX ISA version such as 9.0 or 8.7")
    version = int(major) * 10 + int(minor)
    if lowest is not None and version < lowest:
      raise ValueError(f"{PTX_VERSION_ENV}={text!r} cannot target {target}: it needs PTX {lowest // 10}.{lowest % 10} "
                       "or newer")
    return version
  own = _triton_ptx_version(target)
  cuda_major = _jaxlib.plugin_cuda_major()
  if lowest is None or cuda_major is None:
    return own
  from triton.backends.nvidia import compiler as nvidia_compiler  # only where Triton has its NVIDIA backend

  return min(own, max(lowest, nvidia_compiler.ptx_get_version(f"{cuda_major}.0")))


def cubin_loads_everywhere(target: Target) -> bool:
  """Whether the cubin Triton's bundled ptxas makes for `target` loads on every driver jax's CUDA plugin runs on:
    that ptxas is of the plugin's CUDA major version or older (newer minor versions load through CUDA's minor
    version compatibility; a newer major version does not, e.g. Triton 3.9's CUDA 13.4 cubins on a CUDA 12 driver)."""
  cuda_major = _jaxlib.plugin_cuda_major()
  if target.platform != "cuda" or cuda_major is None:
    return False
  from triton.backends.nvidia import compiler as nvidia_compiler

  return _triton_ptx_version(target) < nvidia_compiler.ptx_get_version(f"{cuda_major + 1}.0")


@functools.cache
def _triton_ptx_version(target: Target) -> int:
  """The PTX version Triton picks for a CUDA target by itself: the newest its bundled ptxas assembles. (Options
  as compile_kernel's: Triton 3.9 warns about its FP fusion default wherever options leave it unset.)"""
  from triton.backends.nvidia import compiler as nvidia_compiler

  options = make_backend(target.triton_target).parse_options({"enable_fp_fusion": True})
  return nvidia_compiler.get_ptx_version_from_options(options, target.arch)


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
  name: str  # the symbol in the binary
  binary: str  # PTX text (cuda) or a path to the hsaco file (rocm, jaxlib reads it from disk)
  asm: dict  # Triton's intermediate and final artifacts: ttir, ttgir, llir, ptx/cubin or amdgcn/hsaco
  num_warps: int  # warps a launch runs: more than asked for where the kernel is warp-specialised
  num_ctas: int  # CTAs per cluster (CUDA sm_90+; 1: no cluster)
  shared_mem_bytes: int
  global_scratch_size: int
  global_scratch_align: int
  tensordesc_meta: tuple  # per tensor-descriptor param, Triton's TMA layout (dicts); empty if lowered to pointers
  target: Target


_cache: dict = {}
_cache_lock = threading.Lock()
_hsaco_dir = tempfile.TemporaryDirectory(prefix="jgmm_hsaco_")


def jit_function(kernel) -> JITFunction:
  """The JITFunction for a @triton.jit kernel, also when it was decorated under TRITON_INTERPRET=1."""
  if isinstance(kernel, JITFunction):
    return kernel
  if isinstance(kernel, InterpretedFunction):
    compiled = getattr(kernel, "_jgmm_jit_function", None)
    if compiled is None:
      compiled = JITFunction(kernel.fn)
      kernel._jgmm_jit_function = compiled
    return compiled
  raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")


def compile_kernel(kernel, signature: dict, constexprs: dict, attrs: dict, target: Target, num_warps: int,
                   num_stages: int, maxnreg: int | None = None, num_ctas: int = 1) -> CompiledKernel:
  """Compiles `kernel` (@triton.jit, or Gluon's @gluon.jit) with Triton for `target` (cached in-process by all
    these arguments).

    signature: {param name: Triton type ('*fp32', 'i32', ... or 'constexpr')} for every kernel param.
    constexprs: {param name: value} for the params typed 'constexpr'.
    attrs: {(param index,): [['tt.divisibility', 16], ...]} specialization hints that the launch guarantees.
    maxnreg: registers per thread at launch (CUDA), which a warp-specialised Gluon kernel redistributes.
    num_ctas: CTAs per cluster (CUDA sm_90+), which a Gluon kernel's layouts describe (their cga_layout).
    """
  fn = jit_function(kernel)
  ptx = ptx_version(target)
  key = (fn, tuple(signature.items()), tuple(sorted(constexprs.items())),
         tuple(sorted((k, repr(v)) for k, v in attrs.items())), target, num_warps, num_stages, maxnreg, num_ctas, ptx)
  with _cache_lock:
    cached = _cache.get(key)
  if cached is not None:
    return cached
  source = (GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource)(fn, signature, constexprs, attrs)
  # Multiply-adds contracted to FMAs, as the kernels were tuned and tested: Triton 3.9 warns that its default
  # (TRITON_DEFAULT_FP_FUSION) turns to off in 3.10. From Triton 3.9, TRITON_FORCE_DISABLE_FP_FUSION=1 still turns
  # it off.
  options = {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True}
  if maxnreg is not None:
    options["maxnreg"] = maxnreg
  if num_ctas != 1:
    options["num_ctas"] = num_ctas
  if ptx is not None:
    options["ptx_version"] = ptx
  try:
    compiled = triton.compile(source, target=target.triton_target, options=options)
  except Exception as e:  # Triton raises CompilationError, RuntimeError (MLIR passes), AssertionError, ...
    ptx_note = "" if ptx is None else f", PTX {ptx // 10}.{ptx % 10} (set {PTX_VERSION_ENV} to change it)"
    raise KernelCompileError(f"Triton failed to compile kernel {fn.__name__!r} for {target} (num_warps={num_warps}, "
                             f"num_stages={num_stages}, num_ctas={num_ctas}, constexprs={constexprs}{ptx_note}): "
                             f"{type(e).__name__}: {e}") from e
  metadata = compiled.metadata
  if target.platform == "cuda":
    binary = compiled.asm["ptx"]
  else:
    fd, binary = tempfile.mkstemp(suffix=".hsaco", dir=_hsaco_dir.name)
    with os.fdopen(fd, "wb") as f:
      f.write(compiled.asm["hsaco"])
  result = CompiledKernel(name=metadata.name,
                          binary=binary,
                          asm=dict(compiled.asm),
                          num_warps=metadata.num_warps,
                          num_ctas=getattr(metadata, "num_ctas", 1),
                          shared_mem_bytes=metadata.shared,
                          global_scratch_size=getattr(metadata, "global_scratch_size", None) or 0,
                          global_scratch_align=getattr(metadata, "global_scratch_align", None) or 1,
                          tensordesc_meta=tuple(getattr(metadata, "tensordesc_meta", None) or ()),
                          target=target)
  with _cache_lock:
    _cache[key] = result
  return result
