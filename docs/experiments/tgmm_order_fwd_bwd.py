"""jgmm's forward+backward on jgmm.bench's cases with the bf16 weight gradient's tiles in the tables' order against
the same with that tgmm row-major (band_tiles 1), and torch._grouped_mm's, timed interleaved in one process (issue
17, session 39). python docs/experiments/tgmm_order_fwd_bwd.py [CASE,...]"""
import dataclasses
import sys
from unittest import mock

from jgmm import bench, config_table, timing

select = config_table.select


def row_major_tgmm(key, **kw):
  """config_table.select with a tgmm's band_tiles set to 1."""
  choice = select(key, **kw)
  if key.op != "tgmm" or choice.config is None:
    return choice
  return choice._replace(config=dataclasses.replace(choice.config, band_tiles=1))


names = sys.argv[1].split(",") if len(sys.argv) > 1 else [c[0] for c in bench.CASES if c[0] != "decode-small"]
rows = []
for name, m, k, n, g in [c for c in bench.CASES if c[0] in names]:
  inp = bench.Inputs(m, k, n, g)
  fns = {"tables": (bench._jax_impls(inp)["jgmm"][1], timing.jax_sync)}
  with mock.patch.object(config_table, "select", row_major_tgmm):
    row_major = bench._jax_impls(inp)["jgmm"][1]
    timing.jax_sync(row_major())  # Traced (and its configs chosen) under the patch.
  fns["tgmm row-major"] = (row_major, timing.jax_sync)
  torch_impls = bench._torch_impls(inp, m, k, n, g)
  if torch_impls is not None:
    fns["torch._grouped_mm"] = (torch_impls[0][1], bench._torch_sync)
  ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=11)
  rows += [(name, c, t, ms["tgmm row-major"] / t, ms.get("torch._grouped_mm", float("nan")) / t)
           for c, t in ms.items()]
print("| case | forward+backward | ms | speedup vs row-major tgmm | vs torch |\n|---|---|---|---|---|")
for r in rows:
  print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} |")
