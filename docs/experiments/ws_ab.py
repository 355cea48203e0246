"""A/B: the table's config against configs of the warp-specialised Gluon kernel (Config.warp_specialized),
forward (gmm) and d lhs (gmm_t), through backend_triton with precomputed bounds, timed interleaved.
Session 4 ran it with commit b72a6b0 checked out (Triton's automatic warp specialisation, which
hung); session 5 with the Gluon kernel (triton_kernels/gmm_ws.py); session 24 with its tile bands and clusters
(the configs below; config names as a second argument pick some).
python docs/experiments/ws_ab.py [case,...] [config,...]"""
import functools, sys, time
import jax, jax.numpy as jnp, numpy as np
from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.timing import jax_sync, time_interleaved
from jgmm.config import Config
from jgmm.ops import group_bounds

WS = {
  "ws128x256x64s3": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True),
  "ws128x256x32s6": Config(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=6, warp_specialized=True),
  "ws128x128x64s5": Config(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, warp_specialized=True),
  # Session 24: tile bands and 2-CTA clusters (Config.band_tiles, cluster_size; clusters need Triton >= 3.7).
  "ws_band8": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                     band_tiles=8),
  "ws_cluster": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                       cluster_size=2),
  "ws_cluster_band8": Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, warp_specialized=True,
                             band_tiles=8, cluster_size=2),
}
names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in CASES if c[0] != "decode-small"]
picked = sys.argv[2].split(",") if len(sys.argv) > 2 else list(WS)
rows = []
for name, m, k, n, g in [c for c in CASES if c[0] in names]:
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  for op in ("gmm", "gmm_t"):
    tr = op == "gmm_t"
    lhs = inp.dout if tr else inp.x
    kk, nn = (n, k) if tr else (k, n)
    table = config_table.select(config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=tr),
                                arch="sm90").config
    fns, ref = {}, None
    for cname, cfg in {"table": table, **{c: WS[c] for c in picked}}.items():
      f = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=tr,
                                    out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=cfg))
      try:
        t0 = time.time(); out = f(lhs, inp.w, bounds); out.block_until_ready()
      except Exception as e:
        print(f"{name} {op} {cname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True); continue
      o = np.asarray(out, np.float32)
      ref = o if ref is None else ref
      err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
      print(f"{name} {op} {cname}: compile+run {time.time()-t0:.1f}s, rel diff vs table {err:.2e}", flush=True)
      fns[cname] = (functools.partial(f, lhs, inp.w, bounds), jax_sync)
    ms = time_interleaved(fns, min_batch_s=0.05, batches=7)
    sol = speed_of_light_ms(m, kk, nn, g)
    rows += [(name, op, c, t, 100 * sol / t, ms["table"] / t) for c, t in ms.items()]
print("\n| case | op | config | ms | %SOL | speedup vs table |")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f}% | {r[5]:.3f} |")
