"""tgmm_fp8_ws_kernel against changed copies of it (issue 15), on fp8_gmm's d rhs of the dsv3 shapes (128 x 256, 3
stages, the heuristic's tiles there).

python docs/experiments/tgmm_fp8_ab.py sass|time KERNEL,...
    KERNEL: tree (triton_kernels/tgmm_fp8_ws.py) or the name of a copy docs/experiments/tgmm_fp8_ws_KERNEL.py.
    sass (CPU, JAX_PLATFORMS=cpu): ptxas's spill line for each; time (GPU): TFLOP/s of each, interleaved, each
    output's DeepGEMM diff from the first kernel's printed and the bf16 tgmm's time beside them.
"""
import importlib
import os
import subprocess
import sys
import tempfile
from unittest import mock

if sys.argv[1] == "sass":
  os.environ["JGMM_TARGET"] = "cuda:90"
import jax
import jax.numpy as jnp
import numpy as np
import triton

import jgmm
from jgmm import backend_triton, bench, oracle, quantize, timing
from jgmm.config import Config
from jgmm.ffi import _compile
from jgmm.triton_kernels import tgmm_fp8_ws

sys.path.insert(0, os.path.dirname(__file__))
CONFIG = Config(block_m=128, block_n=256, block_k=128, num_stages=3, warp_specialized=True)
CASES = [case for case in bench.CASES if case[0] in ("dsv3-ep8-gateup", "dsv3-ep8-down")]


def op(a, s, b, t, gs):
  return jgmm.tgmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_rhs=True, config=CONFIG)


def compiled(module, args):
  """op under `module`'s kernel, compiled."""
  with mock.patch.object(backend_triton, "tgmm_fp8_ws", module):
    return jax.jit(op).trace(*args).lower().compile()


def cross_compiled(module, args):
  """`module`'s kernel for sm_90, compiled on the CPU (backend_triton's call, as tests/test_fp8_kernels.py's)."""
  _compile._cache.clear()
  with mock.patch.object(backend_triton, "tgmm_fp8_ws", module):
    jax.jit(lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=False, transpose_rhs=True, out_dtype=jnp.bfloat16,
                                               config=CONFIG)).trace(*args).lower(lowering_platforms=("cuda",))
  (kernel,) = _compile._cache.values()
  return kernel


if __name__ == "__main__":
  modules = {name: tgmm_fp8_ws if name == "tree" else importlib.import_module("tgmm_fp8_ws_" + name)
             for name in sys.argv[2].split(",")}
  print("device:", jax.devices()[0].device_kind, flush=True)
  for name, m, k, n, g in CASES:
    if sys.argv[1] == "sass":
      f8, s = jnp.float8_e4m3fn, jax.ShapeDtypeStruct
      args = (s((k, m), f8), s((n, m), f8), s((g + 1,), jnp.int32), s((k, -(-m // 128)), jnp.float32),
              s((n, -(-m // 128)), jnp.float32))
      for label, module in modules.items():
        kernel = cross_compiled(module, args)
        with tempfile.TemporaryDirectory() as d:
          with open(f"{d}/k.ptx", "w") as f:
            f.write(kernel.asm["ptx"])
          bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
          out = subprocess.run([f"{bin_dir}/ptxas", "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                               capture_output=True, text=True, check=True).stderr
        print(name, label, [line.split(":")[-1].strip() for line in out.splitlines() if "spill" in line])
      break  # One shape tells the registers.
    inp = bench.Inputs(m, k, n, g)
    q = jax.jit(lambda a: quantize.quantize(a.T, "1x128"))
    args = (*q(inp.x), *q(inp.dout), inp.group_sizes)
    fns = {label: compiled(module, args) for label, module in modules.items()}
    outs = {label: np.asarray(f(*args), np.float32) for label, f in fns.items()}
    ref = next(iter(outs.values()))
    print(name, {label: f"{oracle.deepgemm_diff(out, ref):.1e}" for label, out in outs.items()}, flush=True)
    bf16 = jax.jit(lambda a, b, gs: jgmm.tgmm(a, b, gs, transpose_lhs=True))
    ms = timing.time_interleaved({**{label: (lambda f=f: f(*args), timing.jax_sync) for label, f in fns.items()},
                                  "bf16 tgmm": (lambda: bf16(inp.x, inp.dout, inp.group_sizes), timing.jax_sync)},
                                 min_batch_s=0.03, batches=7)
    for label, t in ms.items():
      print(f"  {name} {label:12s} {t:7.3f} ms {2 * m * k * n / t / 1e9:6.0f} TFLOP/s", flush=True)
