"""Does a case's time follow its inputs' bits? (issue 17: qwen3's forward+backward 4-5% slower under jax 0.11.2 /
Triton 3.6 than under jax 0.12.0.1 / Triton 3.9 on one machine, every one of its kernels alike.)

    python docs/experiments/input_bits.py save FILE [CASE]
        bench.Inputs of CASE (default qwen3-30b-a3b-gateup) generated here: their hashes and distinct values
        printed, saved to FILE (.npz, the bf16 bits as uint16)
    python docs/experiments/input_bits.py time FILE,...|- [CASE] [SECONDS]
        jgmm.gmm's forward+backward on the generated inputs ("here"), on each FILE's, and on "wide" inputs (every
        operand normal in float32, then bf16: full mantissas, where jax.random.normal in bfloat16 gives 128 values),
        interleaved (timing.time_interleaved) and back to back (timing.sustained_runs, SECONDS each, default 1)
"""
import hashlib
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jgmm
from jgmm import bench, timing

MODE, FILES = sys.argv[1], sys.argv[2]
CASE = sys.argv[3] if len(sys.argv) > 3 else "qwen3-30b-a3b-gateup"
SECONDS = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
_, M, K, N, G = next(case for case in bench.CASES if case[0] == CASE)
NAMES = ("x", "w", "dout")


def describe(label, arrays):
  for name, array in zip(NAMES, arrays):
    bits = np.asarray(array).view(np.uint16)
    sample = bits.reshape(-1)[:1 << 20]  # np.unique over a whole operand takes minutes on the GPU machine's CPU.
    print(f"{label} {name}: md5 {hashlib.md5(bits.tobytes()).hexdigest()[:12]}, {len(np.unique(sample))} distinct "
          f"in its first 2^20, mantissa's last bit set {np.mean(sample & 1):.3f}")


def wide_inputs():
  keys = jax.random.split(jax.random.key(7), 3)
  shapes = ((M, K), (G, K, N), (M, N))
  scales = (1 / np.sqrt(K), 1.0, 1.0)
  return [(jax.random.normal(key, shape, jnp.float32) * s).astype(jnp.bfloat16)
          for key, shape, s in zip(keys, shapes, scales)]


print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, triton {__import__('triton').__version__}")
here = bench.Inputs(M, K, N, G)
generated = (here.x, here.w, here.dout)
describe("here", generated)
if MODE == "save":
  np.savez(FILES, **{name: np.asarray(a).view(np.uint16) for name, a in zip(NAMES, generated)})
else:
  sets = {"here": generated, "wide": wide_inputs()}
  for path in FILES.split(",") if FILES != "-" else ():
    saved = np.load(path)
    sets[path] = [jnp.asarray(saved[name].view(jnp.bfloat16)) for name in NAMES]
  for label, arrays in sets.items():
    describe(label, arrays)
  fwd_bwd = bench.fwd_bwd(jgmm.gmm)
  fns = {label: (lambda x=x, w=w, d=d: fwd_bwd(x, w, here.group_sizes, d), timing.jax_sync)
         for label, (x, w, d) in sets.items()}
  interleaved = timing.time_interleaved(fns, batches=14)
  sustained = timing.sustained_runs(fns, SECONDS)
  print(f"\n{CASE} forward+backward, ms: interleaved / sustained ({SECONDS:g} s x 2 rounds)")
  for label in sets:
    print(f"  {label:24s} {interleaved[label]:.3f} / {statistics.median(r.ms for r in sustained[label]):.3f}")
