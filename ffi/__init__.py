"""jgmm.ffi: run @triton.jit kernels from JAX as XLA custom calls (CUDA, ROCm), or interpreted on the CPU.

    outs = ffi.triton_call(*args, kernel=k, out_shape=..., grid=..., **constexprs)   # inside jit

An argument may be ffi.TensorDescriptor(x, block_shape=(BM, BN), padding="zero") in place of an array x, for a
kernel param used as a tensor descriptor (`x_desc.load([i, j])`): jaxlib encodes a host-side TMA descriptor over
x's buffer at launch (CUDA sm_90+, jaxlib >= 0.11; NotImplementedError otherwise); under TRITON_INTERPRET=1 the
interpreter gets Triton's TensorDescriptor over the host copy of x.

Lowering needs the GPU's architecture: taken from the devices the computation runs on, or from
JGMM_TARGET=cuda:90 | cuda:80 | rocm:gfx942 | rocm:gfx950, which also lets a CPU-only machine lower for a GPU
platform. On the CPU platform, TRITON_INTERPRET=1 (read at lowering time) runs kernels in Triton's interpreter.
"""

from jgmm.ffi._call import TensorDescriptor, triton_call
from jgmm.ffi._compile import KernelCompileError
from jgmm.ffi.interpret import run_interpreted

__all__ = ["KernelCompileError", "TensorDescriptor", "run_interpreted", "triton_call"]
