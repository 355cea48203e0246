"""Where qwen3-30b-a3b-gateup's forward time goes (session 5): the same gmm with the real (multinomial) group
sizes and with all groups of 256 rows (no 64-row padding, every tile whole), for the table's kernel and the
warp-specialised one, next to cuBLAS (jnp.dot) on the dense product of the same shape; interleaved.
python docs/experiments/qwen3_diag.py"""
import functools
import jax, jax.numpy as jnp, numpy as np
from jgmm import backend_triton, config_table
from jgmm.bench import Inputs, speed_of_light_ms
from jgmm.timing import jax_sync, time_interleaved
from jgmm.config import Config
from jgmm.ops import group_bounds

m, k, n, g = 32768, 2048, 1536, 128
inp = Inputs(m, k, n, g)
configs = {"table": config_table.select(config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g),
                                        arch="sm90").config,
           "ws": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True)}
fns = {}
for sizes_name, sizes in (("real sizes", inp.sizes), ("all 256", np.full(g, m // g, np.int32))):
  bounds = group_bounds(jnp.asarray(sizes), None, g, m)
  for name, config in configs.items():
    f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                  out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
    fns[f"{name}, {sizes_name}"] = (functools.partial(f, inp.x, inp.w, bounds), jax_sync)
fns["cuBLAS dense (M, K) x (K, N)"] = (functools.partial(jax.jit(jnp.dot), inp.x, inp.w[0]), jax_sync)
sol = speed_of_light_ms(m, k, n, g)
for name, t in time_interleaved(fns, min_batch_s=0.05, batches=7).items():
  print(f"| {name} | {t:.3f} ms | {100 * sol / t:.0f}% of the grouped floor |")
