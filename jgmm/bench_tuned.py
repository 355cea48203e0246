"""Benchmark: tuned dispatch (the tables) against the heuristic, per key and for a whole MoE layer. Needs a GPU.

    python -m jgmm.bench_tuned [--table FILE] [--model-config CONFIG ... --ep 1,8 --tokens 1,16,...] [--out FILE]

Per key, the largest first, until --time-limit seconds (0: none): every entry of --table (default: the tables this
GPU reads now, JGMM_CONFIG_FILES over the shipped one) that differs from the heuristic's Triton config, timed
interleaved against it on the same inputs (jgmm.tune_worker.problem, M = rows * G); prints tuned us, heuristic us
and their ratio, marks SLOWER where the tuned choice is slower beyond --noise, and the geomean of heuristic /
tuned over those keys and over all entries (an entry that is the heuristic's config counts 1.0, untimed).
Model level (--model-config, repeatable; each --ep): one MoE layer (gmm with swiglu up, gmm down; model_shapes.py's
shapes) forward and forward+backward at each token count, compiled once with the tables (and --table) and once with
the heuristic only, timed interleaved. A small key or layer runs several times in one program (jgmm.timing.chain),
so that the GPU's time is timed, not the host's dispatch; times are per run.
"""
import argparse
import contextlib
import json
import os
import statistics
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import backend_triton, bench, config_table, model_shapes, timing, tune, tune_worker


@contextlib.contextmanager
def table_only(entries):
  """Inside: select() reads `entries` ({Key: Entry}) as the whole table ({}: override and heuristic only). Compile
  (lower) inside, run anywhere."""
  config_table._select.cache_clear()
  with mock.patch.object(config_table, "_merged_table", lambda *args: entries):
    yield
  config_table._select.cache_clear()


def bench_keys(entries, arch, noise, time_limit=None, batch_s=0.05):
  """([row] of each entry that is not the heuristic's config, the largest (in flops) first: tuned vs the
  heuristic's config, timed interleaved, none started after time_limit seconds; the number of entries that are)."""
  rows, same, start = [], 0, time.monotonic()
  for entry in sorted(entries, key=lambda e: -e.key.rows * e.key.g * e.key.k * e.key.n):
    key = entry.key
    if config_table.is_heuristic(entry, arch):
      same += 1
      continue
    if time_limit is not None and time.monotonic() - start > time_limit:
      print(f"| stopped at --time-limit {time_limit:.0f} s |")
      break
    try:
      arrays, call, _, runs = tune_worker.problem(key, key.rows * key.g)
    except ValueError as e:  # an op the tuner cannot time yet
      print(f"| {key} | skipped: {e} |")
      continue
    tuned = call(entry.backend, entry.config)
    fns = {"tuned": (lambda: tuned(*arrays), timing.jax_sync)}
    heuristic = call("triton", config_table.heuristic_config(key, arch))
    fns["heuristic"] = (lambda: heuristic(*arrays), timing.jax_sync)
    ms = timing.time_interleaved(fns, min_batch_s=batch_s)
    row = {"key": str(key), "backend": entry.backend, "tuned_us": 1e3 * ms["tuned"] / runs,
           "heuristic_us": 1e3 * ms["heuristic"] / runs, "speedup": ms["heuristic"] / ms["tuned"]}
    row["slower"] = row["speedup"] < 1 - noise
    print(f"| {row['key']} | {entry.backend} | {row['tuned_us']:.1f} | {row['heuristic_us']:.1f} | "
          f"{row['speedup']:.3f}x{' SLOWER' if row['slower'] else ''} |", flush=True)
    rows.append(row)
  return rows, same


def layer_fns(dout, runs):
  """(forward, forward+backward) of one MoE layer (gmm with swiglu up, gmm down) of (x, w_up, w_down, group sizes),
  each run `runs` times in one program (timing.chain), jitted afresh: select() runs while lowering and jax reuses a
  function's lowering, so the tables and the heuristic need functions each."""
  def layer(x, w_up, w_down, sizes):
    return jgmm.gmm(jgmm.gmm(x, w_up, sizes, activation="swiglu"), w_down, sizes)
  layer_fwd_bwd = lambda x, w_up, w_down, sizes: bench.forward_and_cotangents(
      lambda x, a, b: layer(x, a, b, sizes), (x, w_up, w_down), dout)
  return tuple(jax.jit(timing.chain(f, runs)) for f in (layer, layer_fwd_bwd))


def bench_model(dims, ep, tokens):
  """[row] per token count: the MoE layer's forward and forward+backward, tables vs heuristic only."""
  rows = []
  g = dims.experts // ep
  for t in tokens:
    m = t * dims.top_k
    keys = jax.random.split(jax.random.key(t), 4)
    sizes = jnp.asarray(bench.group_sizes(m, g))
    x = (jax.random.normal(keys[0], (m, dims.hidden), jnp.float32) / np.sqrt(dims.hidden)).astype(jnp.bfloat16)
    w_up = (jax.random.normal(keys[1], (g, dims.hidden, 2 * dims.intermediate)) / np.sqrt(dims.hidden)
            ).astype(jnp.bfloat16)
    w_down = (jax.random.normal(keys[2], (g, dims.intermediate, dims.hidden)) / np.sqrt(dims.intermediate)
              ).astype(jnp.bfloat16)
    dout = jax.random.normal(keys[3], (m, dims.hidden), jnp.bfloat16)
    args = (x, w_up, w_down, sizes)
    runs = timing.chain_runs(bench.speed_of_light_ms(m, dims.hidden, 2 * dims.intermediate, g)
                             + bench.speed_of_light_ms(m, dims.intermediate, dims.hidden, g))
    compiled = {"tuned": [f.lower(*args).compile() for f in layer_fns(dout, runs)]}
    with table_only({}):
      compiled["heuristic"] = [f.lower(*args).compile() for f in layer_fns(dout, runs)]
    row = {"tokens": t, "m": m, "g": g}
    for i, phase in enumerate(("fwd", "fwd_bwd")):
      ms = {name: total / runs for name, total in timing.time_interleaved(
          {name: (lambda f=fns[i]: f(*args), timing.jax_sync) for name, fns in compiled.items()}).items()}
      row |= {f"{phase}_tuned_ms": ms["tuned"], f"{phase}_heuristic_ms": ms["heuristic"],
              f"{phase}_speedup": ms["heuristic"] / ms["tuned"]}
    print(f"| {t} | {m} | {row['fwd_tuned_ms']:.3f} | {row['fwd_heuristic_ms']:.3f} | {row['fwd_speedup']:.3f}x | "
          f"{row['fwd_bwd_tuned_ms']:.3f} | {row['fwd_bwd_heuristic_ms']:.3f} | {row['fwd_bwd_speedup']:.3f}x |",
          flush=True)
    rows.append(row)
  return rows


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--table", help="a table file (jgmm-tune --output): its entries, and used by the model level")
  p.add_argument("--model-config", action="append", default=[],
                 help="a Hugging Face MoE config: also bench one layer at each --tokens (repeatable)")
  p.add_argument("--ep", type=tune.ints, default=[1], help="comma-separated: each is benched")
  p.add_argument("--tokens", type=tune.ints, default=[1, 16, 64, 256, 1024, 4096, 16384])
  p.add_argument("--time-limit", type=float, help="seconds after which no more keys start (0: the model level only)")
  p.add_argument("--noise", type=float, default=0.03, help="relative slowdown still counted as noise")
  p.add_argument("--batch-s", type=float, default=0.05, help="seconds per timed batch of a key (7 batches each)")
  p.add_argument("--out", default="bench_tuned.json", help="the JSON results file")
  args = p.parse_args(argv)
  if jax.devices()[0].platform != "gpu":
    raise SystemExit("jgmm.bench_tuned needs a GPU")
  gpu = backend_triton._device()
  if args.table:
    os.environ["JGMM_CONFIG_FILES"] = ":".join(p for p in (args.table, os.environ.get("JGMM_CONFIG_FILES")) if p)
  entries = (config_table.read_table(args.table) if args.table else config_table.active_table(gpu.arch, gpu.kind))
  print(f"device: {jax.devices()[0].device_kind}; {len(entries)} table entries\n")
  print("| key | tuned backend | tuned us | heuristic us | heuristic / tuned |\n|---|---|---|---|---|")
  keys, same = bench_keys(entries.values(), gpu.arch, args.noise, args.time_limit, args.batch_s)
  speedups = [r["speedup"] for r in keys]
  if speedups:
    print(f"\ngeomean heuristic / tuned over the {len(speedups)} keys timed: "
          f"{statistics.geometric_mean(speedups):.3f}x; over them and the {same} entries that are the heuristic's "
          f"config: {statistics.geometric_mean(speedups + [1.0] * same):.3f}x; slower than the heuristic beyond "
          f"{args.noise:.0%}: {sum(r['slower'] for r in keys)}")
  model = []
  for path in args.model_config:
    with open(path) as f:
      dims = model_shapes.moe_dims(json.load(f), path)
    for ep in args.ep:
      print(f"\nMoE layer {path} {dims}, ep {ep} (ms)\n")
      print("| tokens | M | fwd tuned | fwd heuristic | fwd gain | fwd+bwd tuned | fwd+bwd heuristic | fwd+bwd gain |")
      print("|---|---|---|---|---|---|---|---|")
      model += [{"model_config": path, "ep": ep, **row} for row in bench_model(dims, ep, args.tokens)]
  with open(args.out, "w") as f:
    json.dump({"device": jax.devices()[0].device_kind, "keys": keys, "heuristic_entries": same, "model": model}, f,
              indent=1)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
