"""A/B of Config.tma_store (session 9): gmm forward (gmm) and d lhs (gmm_t) of each case with the table's config,
with gmm_kernel on TMA loads and pointer stores, and with TMA loads and the ragged TMA store (4 and 3 stages),
timed interleaved through backend_triton with precomputed bounds; outputs checked against the table's.
  python docs/experiments/tma_store_ab.py [case,...]"""
import dataclasses, functools, sys
import jax, jax.numpy as jnp, numpy as np
from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs
from jgmm.timing import jax_sync, time_interleaved
from jgmm.ops import group_bounds

gpu = backend_triton._device()
names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in CASES if c[0] != "decode-small"]
rows = []
for name, m, k, n, g in [c for c in CASES if c[0] in names]:
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  for op, transpose, args, shape in (("gmm", False, (inp.x, inp.w, bounds), (k, n)),
                                     ("gmm_t", True, (inp.dout, inp.w, bounds), (n, k))):
    key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, *shape, g, transpose=transpose)
    table = config_table.select(key, arch=gpu.arch, device_kind=gpu.kind).config
    plain = dataclasses.replace(table, tma=True, tma_store=False, warp_specialized=False)
    variants = {"table": table, "tma loads": plain,
                **{f"tma store s{s}": dataclasses.replace(plain, tma_store=True, num_stages=s) for s in (4, 3)}}
    fns, ref = {}, None
    for which, config in variants.items():
      f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose,
                                    out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
      out = np.asarray(f(*args), np.float32)
      ref = out if ref is None else ref
      print(f"{name} {op} {which} ({config}): rel diff vs table {np.linalg.norm(out - ref) / np.linalg.norm(ref):.2e}",
            flush=True)
      fns[which] = (functools.partial(f, *args), jax_sync)
    ms = time_interleaved(fns, min_batch_s=0.05, batches=11)
    rows += [(name, op, which, t, ms["table"] / t) for which, t in ms.items()]
print(f"\n{gpu.kind}\n| case | kernel | variant | ms | speedup vs table |\n|---|---|---|---|---|")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} |")
