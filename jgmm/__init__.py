"""jgmm: grouped matrix multiplication for JAX (Mixture-of-Experts gmm, tgmm and masked gmm).

Ops (shapes in each docstring): `gmm`, `tgmm`, `masked_gmm`, and `ragged_dot`, a drop-in replacement for
`jax.lax.ragged_dot`; `grouped_matmul`, independent products of different sizes in one launch. Each is a JAX
primitive with autodiff rules, lowered to Triton kernels on GPUs and to a portable pure-JAX implementation
elsewhere (`backend="xla"` forces it anywhere).
`jgmm.moe`: routing, permutation, the MoE MLP and its expert-parallel form; `jgmm.nnx` (needs flax, imported
only on request): a Flax NNX MoE layer. FP8 operands with scales (`jgmm.quantize` makes them; jgmm.fp8 documents
them; `quantize_pair` quantises an operand and its transpose in one pass) and `fp8_gmm`, a gmm trained in FP8
(`quantize_weights` quantises its weights once for the calls of a step).
"""
__version__ = "0.1.0"  # The one place the version is written: pyproject.toml reads it.

from jgmm.config import Config
from jgmm import moe, quantize
from jgmm.fp8 import Fp8Weights, fp8_gmm, quantize_pair, quantize_weights
from jgmm.grouped_matmul import grouped_matmul
from jgmm.ops import gmm, masked_gmm, ragged_dot, tgmm

__all__ = ["__version__", "Config", "Fp8Weights", "fp8_gmm", "gmm", "grouped_matmul", "masked_gmm", "moe",
           "quantize", "quantize_pair", "quantize_weights", "ragged_dot", "tgmm"]
