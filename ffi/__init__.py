"""jgmm.ffi: run @triton.jit kernels from JAX as XLA custom calls (CUDA, ROCm), or interpreted on the CPU.

    outs = ffi.triton_call(*args, kernel=k, out_shape=..., grid=..., **constexprs)   # inside jit

Lowering needs the GPU's architecture: taken from the devices the computation runs on, or from
JGMM_TARGET=cuda:90 | cuda:80 | rocm:gfx942 | rocm:gfx950, which also lets a CPU-only machine lower for a GPU
platform. On the CPU platform, TRITON_INTERPRET=1 (read at lowering time) runs kernels in Triton's interpreter.
"""

from jgmm.ffi._call import triton_call
from jgmm.ffi._compile import KernelCompileError
from jgmm.ffi.interpret import run_interpreted

__all__ = ["KernelCompileError", "run_interpreted", "triton_call"]
