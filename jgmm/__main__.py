"""`python -m jgmm` (or `jgmm-demo`): a small MoE layer's forward and backward on the present backend, checked
against the float64 oracle, then jgmm timed against jax.lax.ragged_dot.

Checks gmm (swiglu up-projection and down-projection), tgmm (the weight gradient jax.grad computes) and
masked_gmm against the float64 oracle, then times one gmm and its gradient against jax.lax.ragged_dot. Sizes
fit the platform: a GPU runs the MoE at 2048 token rows and times M=4096 K=512 N=512 G=64; a CPU runs 512 rows
and times M=1024 K=256 N=256 G=16 with fewer batches (ragged_dot computes every group's product for every row:
G times jgmm's work). Progress goes to stderr (a tqdm bar when tqdm is installed), results to stdout.
"""
import argparse
import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import oracle
from jgmm.timing import jax_sync, time_interleaved


@dataclasses.dataclass(frozen=True)
class Plan:
  """Sizes of one platform's run. moe: (tokens, top_k, experts, hidden, ffn); bench: (M, K, N, G); batches of
  at least min_batch_s seconds each; a call slower than cap_s (ragged_dot on a CPU) is timed by one call."""
  moe: tuple
  bench: tuple
  batches: int
  min_batch_s: float
  cap_s: float | None


PLANS = {
    "gpu": Plan(moe=(1024, 2, 8, 256, 512), bench=(4096, 512, 512, 64), batches=7, min_batch_s=0.05, cap_s=None),
    "cpu": Plan(moe=(256, 2, 8, 128, 256), bench=(1024, 256, 256, 16), batches=3, min_batch_s=0.1, cap_s=0.5),
}


def progress(tasks):
  """Yields (name, task) of the dict tasks, showing the running one on stderr: a tqdm bar if tqdm is installed,
  else a line per task."""
  try:
    from tqdm import tqdm
  except ImportError:
    for i, (name, task) in enumerate(tasks.items(), 1):
      print(f"jgmm demo [{i}/{len(tasks)}] {name}", file=sys.stderr, flush=True)
      yield name, task
    return
  with tqdm(tasks.items(), total=len(tasks), file=sys.stderr, desc="jgmm demo", leave=False) as bar:
    for name, task in bar:
      bar.set_postfix_str(name)
      yield name, task


def _check(name, actual, expected, tolerance):
  err = oracle.rel_err(actual, expected)
  return f"  {name:<34} relative error {err:.2e}  {'ok' if err < tolerance else 'FAILED'}", err < tolerance


def _correctness(plan, dtype, tolerance, rng):
  """Report lines and whether every op matched the oracle, for a swiglu MoE layer's forward and jax.grad."""
  tokens, top_k, experts, hidden, ffn = plan.moe
  m = tokens * top_k
  sizes = jnp.asarray(rng.multinomial(m, rng.dirichlet(np.ones(experts))), jnp.int32)
  x = jnp.asarray(rng.standard_normal((m, hidden)), dtype)
  w_up = jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / hidden**0.5, dtype)
  w_down = jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / ffn**0.5, dtype)

  @jax.jit
  def layer(x, w_up, w_down):  # One program: swiglu up-projection, down-projection, jax.vjp of the latter's weight.
    h = jgmm.gmm(x, w_up, sizes, activation="swiglu")
    out, down_vjp = jax.vjp(lambda w: jgmm.gmm(h, w, sizes), w_down)
    return h, out, down_vjp(2 * out)[0]  # The gradient of sum(out ** 2).

  h, out, dw_down = layer(x, w_up, w_down)
  max_m = 64
  x_masked = h[: experts * max_m].reshape(experts, max_m, ffn)
  masked_m = jnp.asarray(rng.integers(0, max_m + 1, experts), jnp.int32)
  w_masked = jnp.swapaxes(w_down, 1, 2)
  dout = 2.0 * np.asarray(out, np.float64)
  checks = [
      _check("gmm (swiglu up-projection)", h, oracle.gmm(x, w_up, sizes, activation_name="swiglu"), tolerance),
      _check("gmm (down-projection)", out, oracle.gmm(h, w_down, sizes), tolerance),
      _check("tgmm (grad of w_down)", dw_down, oracle.tgmm(h, dout, sizes, transpose_lhs=True)[0], tolerance),
      _check("masked_gmm", jgmm.masked_gmm(x_masked, w_masked, masked_m),
             oracle.masked_gmm(x_masked, w_masked, masked_m), tolerance),
  ]
  lines = [f"correctness against the float64 oracle ({m} token rows, {experts} experts):"]
  return lines + [line for line, _ in checks], all(ok for _, ok in checks)


def _timing_rows(plan, dtype, rng):
  """{row name: {"jgmm": fn, "ragged_dot": fn}} of no-argument calls at plan.bench's shape."""
  m, k, n, g = plan.bench
  sizes = jnp.asarray(rng.multinomial(m, np.full(g, 1.0 / g)), jnp.int32)
  x = jnp.asarray(rng.standard_normal((m, k)) / k**0.5, dtype)
  w = jnp.asarray(rng.standard_normal((g, k, n)), dtype)
  ops = {"jgmm": jgmm.gmm, "ragged_dot": jax.lax.ragged_dot}
  forward = {name: jax.jit(op) for name, op in ops.items()}
  grad = {name: jax.jit(jax.grad(lambda x, w, s, op=op: jnp.sum(op(x, w, s).astype(jnp.float32) ** 2),
                                 argnums=(0, 1)))
          for name, op in ops.items()}
  call = lambda f: lambda: f(x, w, sizes)
  return {"forward": {name: call(f) for name, f in forward.items()},
          "forward+backward": {name: call(f) for name, f in grad.items()}}


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jgmm", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--no-timing", action="store_true", help="check correctness only; skip the timing")
  parser.add_argument("--seed", type=int, default=None, help="random seed (default: fresh inputs every run)")
  args = parser.parse_args(argv)

  device = jax.devices()[0]
  plan = PLANS["gpu" if device.platform == "gpu" else "cpu"]
  dtype = jnp.bfloat16 if device.platform == "gpu" else jnp.float32
  tolerance = 2e-2 if dtype == jnp.bfloat16 else 1e-3
  rng = np.random.default_rng(args.seed)
  print(f"jgmm {jgmm.__version__} on {device.platform} ({device.device_kind}), {jnp.dtype(dtype).name} inputs",
        flush=True)
  tasks = {"check against the oracle": functools.partial(_correctness, plan, dtype, tolerance, rng)}
  if not args.no_timing:
    for row, fns in _timing_rows(plan, dtype, rng).items():
      tasks[row] = functools.partial(time_interleaved, {name: (f, jax_sync) for name, f in fns.items()},
                                     plan.min_batch_s, plan.batches, plan.cap_s)
  results = {name: task() for name, task in progress(tasks)}
  report, ok = results.pop("check against the oracle")
  print("\n".join(report))
  if results:
    m, k, n, g = plan.bench
    print(f"\ntiming, M={m} K={k} N={n} G={g} (median ms):")
    print(f"  {'':<18}{'jgmm':>10}{'ragged_dot':>12}{'speed-up':>10}")
    for row, ms in results.items():
      print(f"  {row:<18}{ms['jgmm']:>10.3f}{ms['ragged_dot']:>12.3f}{ms['ragged_dot'] / ms['jgmm']:>9.1f}x")
  if not ok:
    raise SystemExit("jgmm: results differ from the float64 oracle")


if __name__ == "__main__":
  main()
