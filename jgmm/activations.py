"""The fused activations of gmm, in JAX: the portable forward and every backend's backward.

h is the pre-activation product (+ bias), shape (M, N), float32. "swiglu" reads h as [gate | up] halves
and returns silu(gate) * up, shape (M, N // 2).
"""
import jax
import jax.numpy as jnp

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_TANH_C = 0.044715


def apply(activation, h):
  """act(h) for h (M, N) float32."""
  if activation is None:
    return h
  if activation == "relu":
    return jnp.maximum(h, 0.0)
  if activation == "gelu":
    return jax.nn.gelu(h, approximate=False)
  if activation == "gelu_tanh":
    return jax.nn.gelu(h, approximate=True)
  if activation == "silu":
    return jax.nn.silu(h)
  if activation == "swiglu":
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up
  raise ValueError(f"unknown activation {activation!r}")


def grad(activation, h, dout):
  """d loss / d h given h (M, N) and dout = d loss / d act(h), both float32."""
  if activation is None:
    return dout
  if activation == "swiglu":
    gate, up = jnp.split(h, 2, axis=-1)
    sig = jax.nn.sigmoid(gate)
    dsilu = sig * (1.0 + gate * (1.0 - sig))
    return jnp.concatenate([dout * up * dsilu, dout * gate * sig], axis=-1)
  _, vjp = jax.vjp(lambda x: apply(activation, x), h)
  return vjp(dout)[0]
