"""What 128 experts' weights cost qwen3's forward, by clock and per clock (issue 17, session 52).

qwen3's forward (M 32768, K 2048, N 1536, uniform groups) with 128, 32, 8 and 1 experts: the same tiles, FLOPs and L2
traffic per tile, the weights' DRAM bytes 805 MB down to 6 MB. Each run back to back for SECONDS (sustained, ROUNDS
rounds, every other reversed) on CONFIG (default: the H200 table's qwen3 forward, gmm_kernel 64 x 256 x 32, 2
programs an SM) while nvidia-smi samples the SM clock and power (power_clock.py's sampler): TFLOP/s, clock, power,
share of the tensor cores' peak per clock, GFLOP per joule.

    python docs/experiments/expert_count_power.py [SECONDS] [ROUNDS] [gk64|ws]
"""
import functools
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jgmm import backend_triton, timing
from jgmm.config import Config
from power_clock import sampler, samples_between  # docs/experiments/power_clock.py, beside this file

CONFIGS = {"gk64": Config(64, 256, 32, 4, 4, programs_per_sm=2), "ws": Config(128, 256, 64, 8, 3,
                                                                              warp_specialized=True)}


def main():
  seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
  config = CONFIGS[sys.argv[3] if len(sys.argv) > 3 else "gk64"]
  m, k, n = 32768, 2048, 1536
  rng = np.random.default_rng(0)
  lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  call = jax.jit(functools.partial(backend_triton.gmm, bias=None, existing_out=None, transpose_rhs=False,
                                   out_dtype=jnp.bfloat16, activation=None, save_preactivation=False, config=config))
  fns = {}
  for g in (128, 32, 8, 1):
    rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16)
    f = functools.partial(call, lhs, rhs, jnp.arange(g + 1, dtype=jnp.int32) * (m // g))
    timing.jax_sync(f())
    fns[f"{g} experts"] = (f, timing.jax_sync)
  log = tempfile.TemporaryFile("w+")
  proc = sampler(log)
  time.sleep(1.0)
  runs = timing.sustained_runs(fns, seconds, rounds)
  proc.terminate()
  proc.wait()
  log.seek(0)
  lines = [line for line in log.read().splitlines() if line.count(",") == 2]
  sms = backend_triton._device().num_sms  # pylint: disable=protected-access
  print(f"{config}\n| experts | ms | TFLOP/s | SM clock MHz | power W | % of peak per clock | GFLOP/J | samples |\n"
        "|---|---|---|---|---|---|---|---|")
  for name, rs in runs.items():
    s = np.concatenate([samples_between(lines, *r.wall) for r in rs])
    ms = np.median([r.ms for r in rs])
    tflops = 2 * m * k * n / ms / 1e9
    clock, power = np.median(s[:, 0]), np.median(s[:, 1])
    print(f"| {name} | {ms:.3f} | {tflops:.0f} | {clock:.0f} | {power:.0f} | "
          f"{100 * tflops * 1e12 / (sms * 4096 * clock * 1e6):.0f}% | {tflops * 1e3 / power:.0f} | {len(s)} |",
          flush=True)


if __name__ == "__main__":
  main()
