"""What a scalar loss costs in a timed forward+backward (session 23): jgmm.gmm's jax.value_and_grad of vdot(out,
dout) (the benchmark's form until then) against bench.fwd_bwd (jax.vjp with the output cotangent dout, what torch's
out.backward(dout) computes), interleaved, on mixtral8x7b-w1 and dsv3-ep8-down.

python docs/experiments/loss_ab.py   (GPU)
"""
import jax
import jax.numpy as jnp

import jgmm
from jgmm import bench, timing

print(jax.devices()[0].device_kind)
for name, m, k, n, g in bench.CASES:
  if name not in ("mixtral8x7b-w1", "dsv3-ep8-down"):
    continue
  inp = bench.Inputs(m, k, n, g)
  loss = jax.jit(jax.value_and_grad(
      lambda x, w, gs, d: jnp.vdot(jgmm.gmm(x, w, gs).astype(jnp.float32), d.astype(jnp.float32)), argnums=(0, 1)))
  vjp = bench.fwd_bwd(jgmm.gmm)
  a = (inp.x, inp.w, inp.group_sizes, inp.dout)
  ms = timing.time_interleaved({"value_and_grad of vdot": (lambda: loss(*a), timing.jax_sync),
                                "vjp": (lambda: vjp(*a), timing.jax_sync)}, batches=7)
  print(name, {k: round(v, 3) for k, v in ms.items()})
