"""One case's forward: gmm configs and torch._grouped_mm timed interleaved in one run (session 7: mixtral8x7b-w1 on
the H100, where jgmm and torch are within 2% of each other; the ws kernel's tile orders).
python docs/experiments/case_ab.py [case]"""
import dataclasses, functools, sys
from unittest import mock
import jax, jax.numpy as jnp
from jgmm import backend_triton, bench, config_table
from jgmm.triton_kernels import geometry
from jgmm.config import Config
from jgmm.ops import group_bounds

name, m, k, n, g = next(c for c in bench.CASES if c[0] == (sys.argv[1] if len(sys.argv) > 1 else "mixtral8x7b-w1"))
# The ws kernel's tile order: bands of geometry.GROUP_M row tiles (session 7), or row-major (GROUP_M = 1, before).
inp = bench.Inputs(m, k, n, g)
bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
gpu = backend_triton._device()
big = dict(block_m=128, block_n=256, block_k=64, num_warps=8)
configs = {
    "table": config_table.lookup("gmm", "bfloat16", m / g, k, n, arch=gpu.arch, out_dtype="bfloat16",
                                 device_kind=gpu.kind),
    "s3 tma": Config(**big, num_stages=3), "s4 tma": Config(**big, num_stages=4),
    "s3 ptr": Config(**big, num_stages=3, tma=False), "s4 ptr": Config(**big, num_stages=4, tma=False),
    "ws s3 bands of 8": Config(**big, num_stages=3, warp_specialized=True),
    "64x256x32 s4 2/SM": Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2),
}
ws = Config(**big, num_stages=3, warp_specialized=True)
variants = {cname: (config, geometry.GROUP_M) for cname, config in configs.items()}
variants |= {"ws s3 row-major": (ws, 1), "ws s4 bands of 8": (dataclasses.replace(ws, num_stages=4), 8)}
fns = {}
for cname, (config, group_m) in variants.items():
  f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
  with mock.patch.object(geometry, "GROUP_M", group_m):  # The tile order is fixed when the call is traced.
    bench._jax_sync(f(inp.x, inp.w, bounds))
  fns[cname] = (functools.partial(f, inp.x, inp.w, bounds), bench._jax_sync)
(torch_fwd, _), torch_sync = bench._torch_impls(inp, m, k, n, g)
fns["torch._grouped_mm"] = (torch_fwd, torch_sync)
ms = bench.time_interleaved(fns, min_batch_s=0.05, batches=11)
print(f"\n{name} forward on {gpu.kind}; table = {configs['table']}")
print("| impl | ms | vs torch |")
for cname, t in ms.items():
  print(f"| {cname} | {t:.3f} | {ms['torch._grouped_mm'] / t:.3f} |")
