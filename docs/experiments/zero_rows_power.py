"""Do the tensor cores draw less power on rows of zeros? (issue 17, session 47)

gmm_ws pads every group's last tile to 64 rows: its wgmmas also multiply the rows after the group's end (the next
group's lhs rows, read and thrown away): 2.3% of mixtral's forward MMAs, 3.2% of dsv3's. Under the power cap the
clock follows the energy per cycle, so if a wgmma on rows of zeros costs less energy, loading zeros there (a TMA
descriptor that ends at the group's last row) would buy clock. This measures the slope: the dense product (cuBLAS,
jnp.dot) and jgmm.gmm on mixtral's forward shape, with the last FRACTION x 128 rows of every 128-row block of the
lhs zeroed (the rest fresh normal values), each run back to back (jgmm.timing.sustained_runs: 1.5 s after 0.5 s of
settling, ROUNDS rounds in alternating orders) while nvidia-smi samples the SM clock and the power draw. Prints per
variant: TFLOP/s (every FLOP, the zero rows' too), the median clock and power, and the speed against no zeros.

    python docs/experiments/zero_rows_power.py [ROUNDS]     (GPU)
"""
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import bench, timing

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from power_clock import samples_between, sampler  # pylint: disable=wrong-import-position

FRACTIONS = (0.0, 0.125, 0.25, 0.5)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def zero_tails(x, fraction):
  """x (M, K) with rows [128 i + 128 (1 - fraction), 128 (i + 1)) of every 128-row block set to zero."""
  keep = (jnp.arange(x.shape[0]) % 128) < round(128 * (1 - fraction))
  return jnp.where(keep[:, None], x, 0).astype(x.dtype)


def main():
  _, m, k, n, g = next(c for c in bench.CASES if c[0] == "mixtral8x7b-w1")
  inputs = bench.Inputs(m, k, n, g)
  dense_w = inputs.w[0]
  dense = jax.jit(lambda x: jnp.dot(x, dense_w, preferred_element_type=jnp.bfloat16))
  grouped = jax.jit(lambda x: jgmm.gmm(x, inputs.w, inputs.group_sizes))
  fns = {}
  for fraction in FRACTIONS:
    x = zero_tails(inputs.x, fraction)
    for name, fn in (("dense", dense), ("jgmm", grouped)):
      fn(x).block_until_ready()
      fns[f"{name} {fraction}"] = (lambda fn=fn, x=x: fn(x), jax.block_until_ready)
  with tempfile.TemporaryFile("w+") as log:
    proc = sampler(log)
    time.sleep(0.5)
    runs = timing.sustained_runs(fns, 1.5, ROUNDS)
    proc.terminate()
    proc.wait()
    log.seek(0)
    lines = [line for line in log if line.count(",") == 2]
  flop = 2 * m * k * n
  print(f"{jax.devices()[0].device_kind}, mixtral8x7b-w1's forward shape ({m} x {k} x {n}, {g} groups for jgmm)\n"
        "| variant, zeroed share of rows | TFLOP/s (rounds' median) | MHz | W | vs no zeros |\n|---|---|---|---|---|")
  rates = {}
  for name, name_runs in runs.items():
    rates[name] = np.median([run.calls * flop / (run.wall[1] - run.wall[0]) / 1e12 for run in name_runs])
    samples = np.concatenate([samples_between(lines, *run.wall) for run in name_runs])
    base = rates[name.split()[0] + " 0.0"]
    print(f"| {name} | {rates[name]:.0f} | {np.median(samples[:, 0]):.0f} | {np.median(samples[:, 1]):.0f} | "
          f"{rates[name] / base:.3f} |")


if __name__ == "__main__":
  main()
