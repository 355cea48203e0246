"""Where qwen3-30b-a3b-gateup's forward time goes, with hardware counters (session 7).

python docs/experiments/qwen3_profile.py time   -- interleaved timings: the public jgmm.gmm (bounds and kernel),
                                                   the table's kernel and the warp-specialised one with
                                                   precomputed bounds (real sizes, all groups of 256), cuBLAS dense
python docs/experiments/qwen3_profile.py ncu    -- each of those once more after a warm-up, between
                                                   cudaProfilerStart/Stop, for `ncu --profile-from-start off`
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
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
fns = {"jgmm.gmm (public)": functools.partial(jax.jit(jgmm.gmm), inp.x, inp.w, inp.group_sizes)}
for sizes_name, sizes in (("real", inp.sizes), ("all256", np.full(g, m // g, np.int32))):
  bounds = group_bounds(jnp.asarray(sizes), None, g, m)
  for name, config in configs.items():
    f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                  out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
    fns[f"{name} {sizes_name}"] = functools.partial(f, inp.x, inp.w, bounds)
fns["cuBLAS dense"] = functools.partial(jax.jit(jnp.dot), inp.x, inp.w[0])

if sys.argv[1] == "time":
  outs = {name: np.asarray(f(), np.float32) for name, f in fns.items() if "dense" not in name}
  for name, out in outs.items():
    ref = outs["table " + name.split()[-1]] if name.split()[-1] in ("real", "all256") else outs["table real"]
    print(f"{name}: rel diff vs the table's kernel {np.linalg.norm(out - ref) / np.linalg.norm(ref):.2e}")
  sol = speed_of_light_ms(m, k, n, g)
  for name, t in time_interleaved({k_: (f, jax_sync) for k_, f in fns.items()}, batches=9).items():
    print(f"| {name} | {t:.3f} ms | {100 * sol / t:.0f}% |")
else:
  for f in fns.values():
    jax_sync(f())
  import torch  # Its runtime's profiler switch covers the whole process.
  torch.cuda.cudart().cudaProfilerStart()
  for name, f in fns.items():
    jax_sync(f())
  torch.cuda.cudart().cudaProfilerStop()
  print("profiled:", list(fns))
