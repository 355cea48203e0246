"""jgmm.ffi: run @triton.jit kernels from JAX as XLA custom calls (CUDA, ROCm), or interpreted on the CPU.

    outs = ffi.triton_call(*args, kernel=k, out_shape=..., grid=..., **constexprs)   # inside jit

An argument may be ffi.TensorDescriptor(x, block_shape=(BM, BN), padding="zero") in place of an array x, for a
kernel param used as a tensor descriptor (`x_desc.load([i, j])`): jaxlib encodes a host-side TMA descriptor over
x's buffer at launch (CUDA sm_90+, jaxlib >= 0.11; NotImplementedError otherwise); under TRITON_INTERPRET=1 the
interpreter gets Triton's TensorDescriptor over the host copy of x.

Lowering needs the GPU's architecture: taken from the devices the computation runs on, or from
JGMM_TARGET=cuda:90 | cuda:80 | rocm:gfx942 | rocm:gfx950, which also lets a CPU-only machine lower for a GPU
platform. On the CPU platform, TRITON_INTERPRET=1 (read at lowering time) runs kernels in Triton's interpreter.

CUDA machine code: Triton's PTX carries the newest ISA version its bundled ptxas knows (Triton 3.9: 9.4), which
the ptxas jaxlib runs (CUDA 13.0's on a CUDA 13.0 machine) rejects. So jgmm (1) compiles for at most the PTX ISA
of CUDA <major>.0 of jax's plugin (9.0 for jax_cuda13_plugin; JGMM_PTX_VERSION overrides; our kernels' PTX and
SASS do not change), and (2) on jaxlib >= 0.11.1 hands jaxlib the cubin Triton's own ptxas assembled, which
jaxlib loads without running any ptxas (JGMM_CUBIN=0: PTX only). See _compile.py and _jaxlib.py.
"""

from jgmm.ffi._call import TensorDescriptor, triton_call
from jgmm.ffi._compile import KernelCompileError
from jgmm.ffi.interpret import run_interpreted

__all__ = ["KernelCompileError", "TensorDescriptor", "run_interpreted", "triton_call"]
