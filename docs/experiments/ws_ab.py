"""A/B: the table's config against the warp-specialised Gluon kernel (Config.warp_specialized) in a few tile orders and
stagings, forward (gmm) and d lhs (gmm_t), through backend_triton with precomputed bounds, timed interleaved with
torch._grouped_mm (forward) where torch is importable; each output checked against the table's.
Session 4 ran it with docs/experiments/autows_gmm.diff applied (Triton's automatic warp specialisation, which hung);
session 5 with the Gluon kernel (triton_kernels/gmm_ws.py); session 8 with tiles claimed on demand (an atomic counter,
docs/experiments/ws_dynamic.diff), then with each consumer's accumulator split in two column halves (one output
buffer of 64 x 128 per consumer, leaving room for 4 stages) and bands of GROUP_M row tiles. python docs/experiments/ws_ab.py [case,...]"""
import functools, os, sys, time
from unittest import mock
import jax, jax.numpy as jnp, numpy as np
from jgmm import backend_triton, bench, config_table
from jgmm.config import Config
from jgmm.ops import group_bounds
from jgmm.triton_kernels import geometry

sys.path.insert(0, os.path.dirname(__file__))

WS = dict(block_m=128, block_n=256, num_warps=8, warp_specialized=True)
VARIANTS = {  # name: (config, "head" or None for the table's; geometry.GROUP_M when traced)
  "table": (None, geometry.GROUP_M),
  "ws HEAD 128 rowmajor": ("head", 1),
  "ws 128 bands8": (Config(**WS, block_k=64, num_stages=3), 8),
  "ws 192 bands8": (Config(**(WS | dict(block_m=192)), block_k=64, num_stages=3), 8),
  "ws 192 rowmajor": (Config(**(WS | dict(block_m=192)), block_k=64, num_stages=3), 1),
}


def static_ws(lhs, rhs, bounds, *, transpose_rhs, **_):
  """The ws kernel before session 8 (docs/experiments/gmm_ws_static.py: row tile by row tile, one (64, 256) output
  buffer per consumer, 3 stages) as backend_triton._gmm_ws called it then."""
  import gmm_ws_static as ws
  from jgmm import ffi
  m, k = lhs.shape
  num_groups = rhs.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  row_tiles = geometry.cdiv(m, 128) + num_groups + 1
  lhs_block, out_block = (64, 64), (64, 256)
  rhs_view, rhs_block = ((num_groups * n, k), (256, 64)) if transpose_rhs else ((num_groups * k, n), (64, 256))
  return ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=ws.shared_layout(lhs_block, "bfloat16")),
      ffi.TensorDescriptor(rhs.reshape(rhs_view), rhs_block, layout=ws.shared_layout(rhs_block, "bfloat16")),
      backend_triton._row_tiles(bounds, m, 128, row_tiles), m,
      kernel=ws.gmm_ws_kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
      grid=(min(gpu.num_sms, row_tiles * geometry.cdiv(n, 256)),), num_warps=4, maxnreg=168, name="static_ws",
      K=k, N=n, R_MAX=row_tiles, BLOCK_N=256, BLOCK_K=64, S=3, TRANSPOSE_RHS=transpose_rhs,
      OUT_LAYOUT=ws.shared_layout(out_block, "bfloat16"))


gpu = backend_triton._device()
names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in bench.CASES if c[0] != "decode-small"]
rows = []
for name, m, k, n, g in [c for c in bench.CASES if c[0] in names]:
  inp = bench.Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  for op in ("gmm", "gmm_t"):
    tr = op == "gmm_t"
    lhs, kk, nn = (inp.dout, n, k) if tr else (inp.x, k, n)
    fns, ref = {}, None
    for cname, (cfg, group_m) in VARIANTS.items():
      cfg = cfg or config_table.lookup(op, "bfloat16", m / g, kk, nn, arch=gpu.arch, out_dtype="bfloat16",
                                       device_kind=gpu.kind)
      f = jax.jit(functools.partial(static_ws if cfg == "head" else backend_triton.gmm, bias=None,
                                    existing_out=None, transpose_rhs=tr, out_dtype=jnp.bfloat16, activation=None,
                                    save_preactivation=False, config=cfg))
      try:
        t0 = time.time()
        with mock.patch.object(geometry, "GROUP_M", group_m):  # Fixed when the call is traced.
          out = f(lhs, inp.w, bounds)
        out.block_until_ready()
      except Exception as e:
        print(f"{name} {op} {cname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True); continue
      o = np.asarray(out, np.float32)
      ref = o if ref is None else ref
      err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
      print(f"{name} {op} {cname} ({cfg}): compile+run {time.time()-t0:.1f}s, rel diff vs table {err:.2e}", flush=True)
      fns[cname] = (functools.partial(f, lhs, inp.w, bounds), bench._jax_sync)
    if not tr:
      torch_fns, torch_sync = bench._torch_impls(inp, m, k, n, g)
      if torch_fns is not None:
        fns["torch._grouped_mm"] = (torch_fns[0], torch_sync)
    ms = bench.time_interleaved(fns, min_batch_s=0.05, batches=9)
    sol = bench.speed_of_light_ms(m, kk, nn, g)
    rows += [(name, op, c, t, 100 * sol / t, ms["table"] / t) for c, t in ms.items()]
print(f"\n{gpu.kind}\n| case | op | config | ms | %SOL (H200) | speedup vs table |")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.0f}% | {r[5]:.3f} |")
