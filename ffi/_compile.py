"""Compile a @triton.jit kernel for one GPU architecture, with an in-process cache.

Triton's own on-disk cache (TRITON_CACHE_DIR, default ~/.triton/cache) makes a second process skip the
compiler passes; the in-process cache makes re-lowering within one process free.
"""

import dataclasses
import os
import tempfile
import threading

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from jgmm.ffi import _jaxlib

TARGET_ENV = "JGMM_TARGET"


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


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
  name: str  # the symbol in the binary
  binary: str  # PTX text (cuda) or a path to the hsaco file (rocm, jaxlib reads it from disk)
  num_warps: int  # warps to launch: the requested ones plus any warp-specialised partitions Triton added
  asm: dict  # Triton's intermediate and final artifacts: ttir, ttgir, llir, ptx/cubin or amdgcn/hsaco
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
                   num_stages: int) -> CompiledKernel:
  """Compiles `kernel` with Triton for `target` (cached in-process by all these arguments).

    signature: {param name: Triton type ('*fp32', 'i32', ... or 'constexpr')} for every kernel param.
    constexprs: {param name: value} for the params typed 'constexpr'.
    attrs: {(param index,): [['tt.divisibility', 16], ...]} specialization hints that the launch guarantees.
    """
  fn = jit_function(kernel)
  key = (fn, tuple(signature.items()), tuple(sorted(constexprs.items())),
         tuple(sorted((k, repr(v)) for k, v in attrs.items())), target, num_warps, num_stages)
  with _cache_lock:
    cached = _cache.get(key)
  if cached is not None:
    return cached
  source = ASTSource(fn, signature, constexprs, attrs)
  try:
    compiled = triton.compile(source,
                              target=target.triton_target,
                              options={
                                  "num_warps": num_warps,
                                  "num_stages": num_stages
                              })
  except Exception as e:  # Triton raises CompilationError, RuntimeError (MLIR passes), AssertionError, ...
    raise KernelCompileError(f"Triton failed to compile kernel {fn.__name__!r} for {target} (num_warps={num_warps}, "
                             f"num_stages={num_stages}, constexprs={constexprs}): {type(e).__name__}: {e}") from e
  metadata = compiled.metadata
  if target.platform == "cuda":
    binary = compiled.asm["ptx"]
  else:
    fd, binary = tempfile.mkstemp(suffix=".hsaco", dir=_hsaco_dir.name)
    with os.fdopen(fd, "wb") as f:
      f.write(compiled.asm["hsaco"])
  result = CompiledKernel(name=metadata.name,
                          binary=binary,
                          num_warps=metadata.num_warps,
                          asm=dict(compiled.asm),
                          shared_mem_bytes=metadata.shared,
                          global_scratch_size=getattr(metadata, "global_scratch_size", None) or 0,
                          global_scratch_align=getattr(metadata, "global_scratch_align", None) or 1,
                          tensordesc_meta=tuple(getattr(metadata, "tensordesc_meta", None) or ()),
                          target=target)
  with _cache_lock:
    _cache[key] = result
  return result
