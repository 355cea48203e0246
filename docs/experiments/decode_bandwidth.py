"""How far decode-small's forward is from the GPU's read bandwidth (issue 17, session 49).

decode-small (M 512, K 4096, N 2048, G 64: ~8 rows a group) reads 1.07 GB of weights for 0.5 GFLOP: its floor is
the memory's. The benchmark's bandwidth ceiling (measure_ceilings) is an elementwise pass, half of whose bytes are
writes; the gmm's bytes are nearly all reads. This times, interleaved: a read-only pass (a sum over 2 GiB of bf16),
the elementwise pass, and the gmm under the table's config and some others (block_n, block_k, stages, programs per
SM, TMA), each as bytes moved per second (the gmm's: lhs + weights + out, as speed_of_light_ms counts them).

    python docs/experiments/decode_bandwidth.py
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved


def main():
  name, m, k, n, g = next(c for c in CASES if c[0] == "decode-small")
  inp = Inputs(m, k, n, g)
  bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
  device = backend_triton._device()  # pylint: disable=protected-access
  key = config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, k, n, g)
  table = config_table.select(key, arch=device.arch, device_kind=device.kind).config
  variants = {"table": table}
  changes = [{field: value} for field, values in (
      ("block_n", (64, 256)), ("block_k", (64, 256)), ("num_stages", (3, 4, 6, 8)), ("programs_per_sm", (2,)),
      ("tma", (not table.tma,)), ("persistent", (False,))) for value in values]
  changes += [{"block_n": 256, "num_stages": 3}, {"block_k": 256, "num_stages": 3}, {"block_n": 64, "num_stages": 8},
              {"block_n": 64, "programs_per_sm": 2, "num_stages": 3}]
  for change in changes:
    config = dataclasses.replace(table, **change)
    if config_table.fits(key, config, device.arch) and config != table:
      variants[", ".join(f"{field} {value}" for field, value in change.items())] = config
  gmm_bytes = 2 * (m * k + g * k * n + m * n)
  big = jax.random.normal(jax.random.key(1), (2**30,), jnp.bfloat16)  # 2 GiB
  fns = {"read-only sum (2 GiB)": (functools.partial(jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32)), big),
                                   jax_sync),
         "elementwise x + 1 (2 GiB in, 2 GiB out)": (functools.partial(jax.jit(lambda x: x + 1), big), jax_sync)}
  for label, config in variants.items():
    call = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                     out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
    fns[f"gmm {label}"] = (functools.partial(call, inp.x, inp.w, bounds), jax_sync)
  ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
  moved = {"read-only sum (2 GiB)": big.nbytes, "elementwise x + 1 (2 GiB in, 2 GiB out)": 2 * big.nbytes}
  print(f"\n{device.kind}, {name}, table: {table}\n| what | ms | TB/s |\n|---|---|---|")
  for label, t in ms.items():
    print(f"| {label} | {t:.4f} | {moved.get(label, gmm_bytes) / t / 1e9:.2f} |")


if __name__ == "__main__":
  main()
