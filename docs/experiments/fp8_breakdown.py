"""Where the FP8 training recipe (jgmm.fp8_gmm) and the heterogeneous FP8 case spend their time (issues 15, 18).

    python docs/experiments/fp8_breakdown.py [recipe] [hetero] [tgmm]

recipe: each piece of fp8_gmm's forward and backward timed alone (jitted, interleaved) on the dsv3 cases of
jgmm.bench (the quantisations as XLA passes and as quantize_pair's one pass), beside the bf16 products they replace
and the whole fwd+bwd of both.
hetero: bench_hetero's prefill16-fp8 case under several configs of the heterogeneous FP8 kernels (the
warp-specialised one and the plain one), beside its bf16 kernel and the bf16 jnp.dot loop.
tgmm: the recipe's FP8 tgmm (lhs^T (K, M), dout^T (N, M)) under the plain kernel and the warp-specialised one at 3 to 5
stages and 128 x 256 tiles at 2 or 3, beside the bf16 tgmm.
"""
import functools
import sys

import jax
import jax.numpy as jnp

import jgmm
from jgmm import bench, bench_hetero, fp8, quantize, timing
from jgmm.config import Config


def recipe(name, m, k, n, g):
  inp = bench.Inputs(m, k, n, g)
  x, w, gs, dout = inp.x, inp.w, inp.group_sizes, inp.dout
  q_rows = jax.jit(lambda a: quantize.quantize(a, "1x128"))
  q_cols = jax.jit(lambda a: quantize.quantize(a, "128x1"))
  q_rows_t = jax.jit(lambda a: quantize.quantize(a.T, "1x128"))
  q_weights_t = jax.jit(lambda w: quantize.quantize(jnp.swapaxes(w, 1, 2), "128x128"))
  q_weights = jax.jit(lambda w: quantize.quantize(w, "128x128"))
  xq, xs = q_rows(x)
  wq, ws = q_weights_t(w)
  dq, ds = q_rows(dout)
  xt, xts = q_cols(x)
  dt, dts = q_cols(dout)
  xtt, xtts = q_rows_t(x)
  dtt, dtts = q_rows_t(dout)
  gmm_fp8 = jax.jit(lambda a, s, b, t, gs: jgmm.gmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_rhs=True))
  dlhs_fp8 = jax.jit(lambda a, s, b, t, gs: jgmm.gmm(a, jnp.swapaxes(b, 1, 2), gs, lhs_scale=s,
                                                     rhs_scale=jnp.swapaxes(t, 1, 2), transpose_rhs=True))
  tgmm_fp8 = jax.jit(lambda a, s, b, t, gs: jgmm.tgmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_lhs=True))
  tgmm_fp8_km = jax.jit(lambda a, s, b, t, gs: jgmm.tgmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_rhs=True))
  gmm = jax.jit(lambda a, b, gs: jgmm.gmm(a, b, gs))
  gmm_t = jax.jit(lambda a, b, gs: jgmm.gmm(a, b, gs, transpose_rhs=True))
  tgmm = jax.jit(lambda a, b, gs: jgmm.tgmm(a, b, gs, transpose_lhs=True))
  wt_copy = jax.jit(lambda b: jnp.swapaxes(b, 1, 2) + 0)
  pair_rows, pair_blocks = (jax.jit(lambda a, r=r: jgmm.quantize_pair(a, r)) for r in ("1x128", "128x128"))
  blocks, padded_sizes = fp8._padded_groups(gs, m)  # fp8_gmm's backward's group-aligned transposes.
  pair_grouped = jax.jit(lambda a: fp8._quantize_pair_grouped_p(a, blocks, dtype=jnp.float8_e4m3fn, backend=None))
  _, _, xpt, xpts = pair_grouped(x)
  _, _, dpt, dpts = pair_grouped(dout)
  fp8_fb, bf16_fb = bench.fwd_bwd(jgmm.fp8_gmm), bench.fwd_bwd(jgmm.gmm)
  s = timing.jax_sync
  fns = {
      "q x 1x128": (lambda: q_rows(x), s),
      "q w swapped (G,N,K) 128x128": (lambda: q_weights_t(w), s),
      "q w (G,K,N) 128x128": (lambda: q_weights(w), s),
      "q dout 1x128": (lambda: q_rows(dout), s),
      "q x 128x1": (lambda: q_cols(x), s),
      "q dout 128x1": (lambda: q_cols(dout), s),
      "q x^T (K,M) 1x128": (lambda: q_rows_t(x), s),
      "q dout^T (N,M) 1x128": (lambda: q_rows_t(dout), s),
      "wq transposed copy": (lambda: wt_copy(wq), s),
      "quantize_pair x 1x128": (lambda: pair_rows(x), s),
      "quantize_pair dout 1x128": (lambda: pair_rows(dout), s),
      "quantize_pair w 128x128": (lambda: pair_blocks(w), s),
      "quantize_pair_grouped x": (lambda: pair_grouped(x), s),
      "quantize_pair_grouped dout": (lambda: pair_grouped(dout), s),
      "fwd gmm_t fp8": (lambda: gmm_fp8(xq, xs, wq, ws, gs), s),
      "dlhs gmm fp8 (+swapaxes)": (lambda: dlhs_fp8(dq, ds, wq, ws, gs), s),
      "drhs tgmm fp8 (M,K)x(M,N)": (lambda: tgmm_fp8(xt, xts, dt, dts, gs), s),
      "drhs tgmm fp8 (K,M)x(N,M)": (lambda: tgmm_fp8_km(xtt, xtts, dtt, dtts, gs), s),
      "drhs tgmm fp8 padded groups": (lambda: tgmm_fp8_km(xpt, xpts, dpt, dpts, padded_sizes), s),
      "fwd gmm bf16": (lambda: gmm(x, w, gs), s),
      "dlhs gmm_t bf16": (lambda: gmm_t(dout, w, gs), s),
      "drhs tgmm bf16": (lambda: tgmm(x, dout, gs), s),
      "fp8_gmm fwd+bwd": (lambda: fp8_fb(x, w, gs, dout), s),
      "gmm bf16 fwd+bwd": (lambda: bf16_fb(x, w, gs, dout), s),
  }
  ms = timing.time_interleaved(fns, min_batch_s=0.03, batches=5)
  print(f"\n{name} (M={m}, K={k}, N={n}, G={g})")
  for piece, t in ms.items():
    print(f"  {piece:28s} {t:8.3f} ms")


# The configs both FP8 experiments try (the default: the heuristic's or the table's).
CONFIGS = {
    "default": None,
    "128x128x128 w8 s4": Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4),
    "128x128x64 w8 s5": Config(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5),
    "64x128x128 w4 s5": Config(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=5),
    "64x128x128 w4 s4 2/SM": Config(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4,
                                    programs_per_sm=2),
    "64x128x128 w4 s3 3/SM": Config(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3,
                                    programs_per_sm=3),
    "128x128x128 w8 s2 2/SM": Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=2,
                                     programs_per_sm=2),
}


def _time_configs(title, op, args, peers, flops, configs=CONFIGS):
  """op(*args, config=...) jitted under every config of configs, timed interleaved with peers {name: (fn, sync)}."""
  fns = {}
  for label, config in configs.items():
    f = jax.jit(functools.partial(op, config=config))
    fns["fp8 " + label] = (lambda f=f: f(*args), timing.jax_sync)
  ms = timing.time_interleaved({**fns, **peers}, min_batch_s=0.03, batches=5)
  print("\n" + title)
  for label, t in ms.items():
    print(f"  {label:28s} {t:8.3f} ms  {flops / t / 1e9:6.0f} TFLOP/s")


def hetero():
  shapes = bench_hetero.CASES["prefill16-fp8"]
  lhs, rhs = bench_hetero._inputs(shapes)
  lhs_q, lhs_s = zip(*[quantize.quantize(a, "1x128") for a in lhs])
  rhs_q, rhs_s = zip(*[quantize.quantize(b.T, "128x128") for b in rhs])
  op = lambda l, r, ls, rs, config: jgmm.grouped_matmul(l, r, lhs_scales=ls, rhs_scales=rs, transpose_rhs=True,
                                                        config=config)
  impls = bench_hetero._jax_impls(lhs, rhs)
  ws = Config(block_m=128, block_n=128, block_k=128, num_warps=4, num_stages=4, warp_specialized=True)
  configs = {"default": None, "ws s4": ws, "ws s5": Config(**{**ws.__dict__, "num_stages": 5}),
             "plain 64x128x128 w4 s4 2/SM": CONFIGS["64x128x128 w4 s4 2/SM"],
             "plain 128x128x128 w8 s4": CONFIGS["128x128x128 w8 s4"]}
  _time_configs("prefill16-fp8", op, (lhs_q, rhs_q, lhs_s, rhs_s),
                {"bf16 jgmm": impls["jgmm"], "bf16 dot_loop": impls["dot_loop"]},
                sum(2 * m * n * k for m, n, k in shapes), configs)


def tgmm_configs(name, m, k, n, g):
  """The FP8 tgmm of fp8_gmm's backward (lhs^T (K, M), dout^T (N, M)) under several configs."""
  inp = bench.Inputs(m, k, n, g)
  q = jax.jit(lambda a: quantize.quantize(a.T, "1x128"))
  (xt, xts), (dt, dts) = q(inp.x), q(inp.dout)
  op = lambda a, s, b, t, gs, config: jgmm.tgmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_rhs=True,
                                                config=config)
  tgmm = jax.jit(lambda a, b, gs: jgmm.tgmm(a, b, gs, transpose_lhs=True))
  ws = Config(block_m=128, block_n=128, block_k=128, num_stages=4, warp_specialized=True)
  configs = {"default": None, "plain 128x128x128 w8 s3": Config(block_m=128, block_n=128, block_k=128, num_warps=8,
                                                                 num_stages=3),
             **{f"ws s{s}": Config(**{**ws.__dict__, "num_stages": s}) for s in (3, 4, 5)},
             **{f"ws 128x256 s{s}": Config(**{**ws.__dict__, "block_n": 256, "num_stages": s}) for s in (2, 3)}}
  _time_configs(f"tgmm fp8 {name} (M={m}, K={k}, N={n}, G={g})", op, (xt, xts, dt, dts, inp.group_sizes),
                {"bf16 tgmm": (lambda: tgmm(inp.x, inp.dout, inp.group_sizes), timing.jax_sync)}, 2 * m * k * n,
                configs)


if __name__ == "__main__":
  what = sys.argv[1:] or ["recipe", "hetero", "tgmm"]
  print("device:", jax.devices()[0].device_kind)
  if "hetero" in what:
    hetero()
  for case in bench.CASES:
    if case[0] in ("dsv3-ep8-gateup", "dsv3-ep8-down"):
      if "recipe" in what:
        recipe(*case)
      if "tgmm" in what:
        tgmm_configs(*case)
