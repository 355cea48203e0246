"""A/B of two config tables: for every case and kernel (gmm forward, gmm_t = d lhs, tgmm = d rhs) whose entries
differ, both configs timed interleaved through backend_triton with precomputed bounds (session 7: the H200-tuned
configs/sm90.json against one tuned on an H100).  python docs/experiments/table_ab.py CANDIDATE.json [case,...]
(CANDIDATE.json: a schema-2 table; python -m jgmm.bench_tuned now does this for any table.)"""
import functools, sys
import jax, jax.numpy as jnp
from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs
from jgmm.timing import jax_sync, time_interleaved
from jgmm.ops import group_bounds

candidate = {key: e.config for key, e in config_table.read_table(sys.argv[1]).items()}
names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES]
rows = []
for name, m, k, n, g in [c for c in CASES if c[0] in names]:
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  make = lambda op, kk, nn: config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op != "gmm")
  kernels = {
      "gmm": (make("gmm", k, n), (inp.x, inp.w, bounds),
              functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                out_dtype=jnp.bfloat16, activation=None, save_preactivation=False)),
      "gmm_t": (make("gmm_t", n, k), (inp.dout, inp.w, bounds),
                functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=True,
                                  out_dtype=jnp.bfloat16, activation=None, save_preactivation=False)),
      "tgmm": (make("tgmm", k, n), (inp.x, inp.dout, bounds),
               functools.partial(backend_triton.tgmm, existing_out=None, transpose_lhs=True, out_dtype=jnp.bfloat16,
                                 bias_grad=False)),
  }
  for op, (key, args, fn) in kernels.items():
    table = config_table.shipped_table("sm90")[key].config
    if candidate.get(key) == table:
      continue
    fns = {which: (functools.partial(jax.jit(functools.partial(fn, config=c)), *args), jax_sync)
           for which, c in (("table", table), ("candidate", candidate[key]))}
    ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
    rows.append((name, op, ms["table"], ms["candidate"]))
    print(f"| {name} | {op} | {ms['table']:.3f} | {ms['candidate']:.3f} | {ms['table'] / ms['candidate']:.3f} |",
          flush=True)
print("\n| case | kernel | table ms | candidate ms | speedup |")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} | {r[2] / r[3]:.3f} |")
