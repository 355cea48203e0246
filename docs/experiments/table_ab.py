"""A/B of a candidate table against the table this GPU reads now (the shipped one with its Triton overlay, under
JGMM_CONFIG_FILES): for every benchmark case with a kernel (gmm forward, gmm_t = d lhs, tgmm = d rhs) whose entry
differs, both configs on the same inputs through backend_triton with precomputed bounds, and the case's whole
forward+backward (bench.fwd_bwd of jgmm.gmm) compiled under each table; interleaved, or each alone for SECONDS
(sustained: the GPU's clock under its power cap).

    python docs/experiments/table_ab.py time|sustained CANDIDATE.json [CASE,...]
    (CANDIDATE.json: a schema-2 table, e.g. jgmm-tune's --output; session 7 first, session 50 both timings)
"""
import functools
import os
import statistics
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, fwd_bwd
from jgmm.bench_tuned import table_only
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, sustained_runs, time_interleaved


def timed(mode, fns):
  """{name: ms} of fns {name: (fn, sync)}, each called once first."""
  for fn, sync in fns.values():
    sync(fn())
  if mode == "sustained":
    return {name: statistics.median(run.ms for run in runs)
            for name, runs in sustained_runs(fns, float(os.environ.get("SECONDS", 1)), rounds=3).items()}
  return time_interleaved(fns, min_batch_s=0.05, batches=9)


def gmm_call(transpose_rhs):
  """backend_triton.gmm as the benchmark's bf16 products run it (the forward, or the d lhs with transpose_rhs), its
  config left to pass."""
  return functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=transpose_rhs,
                           out_dtype=jnp.bfloat16, activation=None, save_preactivation=False)


def table_gmm_products(inp, bounds, m, k, n, g, device):
  """(product, op, args, K, N, config) of a bench case's forward ("fwd", gmm, lhs x) and d lhs ("dlhs", gmm_t, lhs
  dout), config the one config_table.select gives their key on `device`."""
  for product, op, lhs, kk, nn in (("fwd", "gmm", inp.x, k, n), ("dlhs", "gmm_t", inp.dout, n, k)):
    key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op == "gmm_t")
    yield (product, op, (lhs, inp.w, bounds), kk, nn,
           config_table.select(key, arch=device.arch, device_kind=device.kind).config)


def patched_variants(make, target, attribute, values):
  """{name: (f, jax_sync)} for values {name: value}: make() -> f (a jitted call on fixed inputs) traced and compiled
  with target.attribute patched to each value, the outputs checked equal bit for bit."""
  fns, outs = {}, {}
  for name, value in values.items():
    with mock.patch.object(target, attribute, value):
      f = make()
      outs[name] = jax.tree.map(lambda x: np.asarray(x, np.float32), f())
    fns[name] = (f, jax_sync)
  first, *rest = outs.values()
  for out in rest:
    jax.tree.map(np.testing.assert_array_equal, first, out)
  return fns


def main():
  mode, path = sys.argv[1], sys.argv[2]
  names = sys.argv[3].split(",") if len(sys.argv) > 3 else [c[0] for c in CASES]
  device = backend_triton._device()  # pylint: disable=protected-access
  active = config_table.active_table(device.arch, device.kind)
  candidate = active | config_table.read_table(path)
  print(f"\n{device.kind}, {mode}, {path} against the active table\n| case | product | table ms | candidate ms | "
        "speedup |\n|---|---|---|---|---|", flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    products = {
        "gmm": ((k, n), (inp.x, inp.w, bounds), gmm_call(False)),
        "gmm_t": ((n, k), (inp.dout, inp.w, bounds), gmm_call(True)),
        "tgmm": ((k, n), (inp.x, inp.dout, bounds), functools.partial(
            backend_triton.tgmm, existing_out=None, transpose_lhs=True, out_dtype=jnp.bfloat16, bias_grad=False)),
    }
    differs = False
    for op, ((kk, nn), args, call) in products.items():
      key = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op != "gmm")
      configs = {which: entries[key].config for which, entries in (("table", active), ("candidate", candidate))
                 if key in entries}
      if len(configs) < 2 or configs["table"] == configs["candidate"]:
        continue
      differs = True
      ms = timed(mode, {which: (functools.partial(jax.jit(functools.partial(call, config=c)), *args), jax_sync)
                        for which, c in configs.items()})
      print(f"| {name} | {op} | {ms['table']:.3f} | {ms['candidate']:.3f} | {ms['table'] / ms['candidate']:.3f} |",
            flush=True)
    if not differs:
      continue
    args = (inp.x, inp.w, inp.group_sizes, inp.dout)
    compiled = {}
    for which, entries in (("table", active), ("candidate", candidate)):
      with table_only(entries):
        compiled[which] = fwd_bwd(jgmm.gmm).lower(*args).compile()
    assert compiled["table"].as_text() != compiled["candidate"].as_text(), "both tables compiled the same program"
    ms = timed(mode, {which: (functools.partial(f, *args), jax_sync) for which, f in compiled.items()})
    print(f"| {name} | fwd+bwd | {ms['table']:.3f} | {ms['candidate']:.3f} | {ms['table'] / ms['candidate']:.3f} |",
          flush=True)


if __name__ == "__main__":
  main()
