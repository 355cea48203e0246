"""Flax NNX layers on jgmm.moe (needs flax; `import jgmm` never imports this module)."""
import jax
import jax.numpy as jnp
from flax import nnx

from jgmm import moe


class MoEMLP(nnx.Module):
  """A Mixture-of-Experts MLP: x (..., H) -> (..., H), top_k of num_experts experts per token.

  Parameters: router (H, E), w_gate_up (E, H, 2F) ([gate | up] columns for swiglu, else (E, H, F)),
  w_down (E, F, H), and with num_shared > 0 a dense shared expert shared_gate_up (H, 2Fs), shared_down (Fs, H).
  The router runs in float32; the experts in `dtype` (default: the parameters' dtype).
  Options (score, renormalize, capacity, impl, layout, backend) go to jgmm.moe.moe_mlp.
  """

  def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, *, num_shared: int = 0,
               activation: str = "swiglu", dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs, **moe_options):
    width = 2 * ffn if activation == "swiglu" else ffn
    init = lambda fan_in, *shape: nnx.Param(
        jax.random.normal(rngs.params(), shape, param_dtype) / jnp.sqrt(fan_in).astype(param_dtype))
    self.router = init(hidden, hidden, num_experts)
    self.w_gate_up = init(hidden, num_experts, hidden, width)
    self.w_down = init(ffn, num_experts, ffn, hidden)
    shared_width = 2 * num_shared if activation == "swiglu" else num_shared
    self.shared_gate_up = init(hidden, hidden, shared_width) if num_shared else None
    self.shared_down = init(num_shared, num_shared, hidden) if num_shared else None
    self.top_k, self.activation, self.dtype, self.moe_options = top_k, activation, dtype, moe_options

  def __call__(self, x, fp8_weights=None):
    """x (..., H) -> (..., H). fp8_weights: with impl="fp8", optional (jgmm.quantize_weights(w_gate_up),
    jgmm.quantize_weights(w_down)) of this layer's expert weights in the experts' dtype, made ahead (once per step
    for its micro-batches; remade after each update): jgmm.moe.expert_mlp's."""
    dtype = self.dtype or self.w_gate_up[...].dtype
    tokens = x.reshape(-1, x.shape[-1]).astype(dtype)
    logits = jnp.dot(tokens.astype(jnp.float32), self.router[...].astype(jnp.float32))
    shared = None
    if self.shared_gate_up is not None:
      shared = (self.shared_gate_up[...].astype(dtype), self.shared_down[...].astype(dtype))
    out = moe.moe_mlp(tokens, logits, self.w_gate_up[...].astype(dtype), self.w_down[...].astype(dtype),
                      self.top_k, activation=self.activation, shared_experts=shared, fp8_weights=fp8_weights,
                      **self.moe_options)
    return out.reshape(x.shape).astype(x.dtype)
