"""A/B of gmm_kernel's tile order (bands of geometry.GROUP_M row tiles) and staging on one GPU, forward only, timed
interleaved with torch._grouped_mm; outputs checked against the table's config (session 8, H100: mixtral and
dsv3-down, the cases whose bar was within run-to-run spread). python docs/experiments/order_ab.py [case,...]"""
import dataclasses, functools, sys
from unittest import mock
import jax, jax.numpy as jnp, numpy as np
from jgmm import backend_triton, bench, config_table, timing
from jgmm.ops import group_bounds
from jgmm.triton_kernels import geometry

gpu = backend_triton._device()
names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-down"]
rows = []
for name, m, k, n, g in [c for c in bench.CASES if c[0] in names]:
  inp = bench.Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  table = config_table.select(config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g), arch=gpu.arch,
                              device_kind=gpu.kind).config
  variants = {f"table, bands {b}": (table, b) for b in (8, 4, 16, 32)}
  variants |= {f"stages {s} tma {t}, bands 8": (dataclasses.replace(table, num_stages=s, tma=t), 8)
               for s in (3, 4) for t in (True, False) if (s, t) != (table.num_stages, table.tma)}
  fns, ref = {}, None
  for cname, (cfg, group_m) in variants.items():
    f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                  out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=cfg))
    with mock.patch.object(geometry, "GROUP_M", group_m):  # Fixed when the call is traced.
      out = np.asarray(f(inp.x, inp.w, bounds), np.float32)
    ref = out if ref is None else ref
    print(f"{name} {cname} ({cfg}): rel diff vs table {np.linalg.norm(out - ref) / np.linalg.norm(ref):.2e}")
    fns[cname] = (functools.partial(f, inp.x, inp.w, bounds), timing.jax_sync)
  torch_impls = bench._torch_impls(inp, m, k, n, g)
  if torch_impls is not None:
    fns["torch._grouped_mm"] = (torch_impls[0][0], bench._torch_sync)
  ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=11)
  rows += [(name, c, t, ms["table, bands 8"] / t) for c, t in ms.items()]
print(f"\n{gpu.kind}\n| case | variant | ms | speedup vs table |")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} |")
