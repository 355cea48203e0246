"""tgmm_fp8_ws_kernel against changed copies of it (issue 15), on fp8_gmm's d rhs of the dsv3 shapes (128 x 256, 3
stages, the heuristic's tiles there).

python docs/experiments/tgmm_fp8_ab.py sass|time|ncu KERNEL,...
    KERNEL: tree (triton_kernels/tgmm_fp8_ws.py) or the name of a copy docs/experiments/tgmm_fp8_ws_KERNEL.py,
    optionally @BLOCK_N@STAGES[@BAND] (default @256@3), e.g. pipe@128@5.
    sass (CPU, JAX_PLATFORMS=cpu): ptxas's spill line for each; time (GPU): TFLOP/s of each, interleaved, each
    output's DeepGEMM diff from the first kernel's printed and the bf16 tgmm's time beside them (ALIGNED=1: on
    fp8_gmm's backward's operands, each group padded to the 128-row grid; GROUP=1 with ALIGNED=1: wgrad_scale="group"'s,
    dout^T scaled per group and column, the kernels run with RHS_GROUPS); ncu (GPU): each
    kernel once per case after a warm-up, between cudaProfilerStart/Stop, for `ncu --profile-from-start off`
    (docs/experiments/tgmm_fp8_ncu.sh).
"""
import dataclasses
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
from jgmm import backend_triton, bench, fp8, oracle, quantize, timing
from jgmm.config import Config
from jgmm.ffi import _compile
from jgmm.triton_kernels import tgmm_fp8_ws

sys.path.insert(0, os.path.dirname(__file__))
CONFIG = Config(block_m=128, block_n=256, block_k=128, num_stages=3, warp_specialized=True)
GROUP = bool(os.environ.get("GROUP"))
CASES = [case for case in bench.CASES if case[0] in ("dsv3-ep8-gateup", "dsv3-ep8-down")]


def config_of(label):
  """The Config of a KERNEL[@BLOCK_N@STAGES] label."""
  _, *geometry = label.split("@")
  if not geometry:
    return CONFIG
  band = int(geometry[2]) if len(geometry) > 2 else CONFIG.band_tiles  # @BAND: band_tiles (session 39).
  return dataclasses.replace(CONFIG, block_n=int(geometry[0]), num_stages=int(geometry[1]), band_tiles=band)


def compiled(module, args, config):
  """The public tgmm under `module`'s kernel, compiled."""
  op = lambda a, s, b, t, gs: jgmm.tgmm(a, b, gs, lhs_scale=s, rhs_scale=t, transpose_rhs=True, config=config,
                                       rhs_scale_per_group=GROUP)
  with mock.patch.object(backend_triton, "tgmm_fp8_ws", module):
    return jax.jit(op).trace(*args).lower().compile()


def cross_compiled(module, args, config):
  """`module`'s kernel for sm_90, compiled on the CPU (backend_triton's call, as tests/test_fp8_kernels.py's)."""
  _compile._cache.clear()
  with mock.patch.object(backend_triton, "tgmm_fp8_ws", module):
    jax.jit(lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=False, transpose_rhs=True, out_dtype=jnp.bfloat16,
                                               config=config)).trace(*args).lower(lowering_platforms=("cuda",))
  (kernel,) = _compile._cache.values()
  return kernel


if __name__ == "__main__":
  modules = {label: tgmm_fp8_ws if label.split("@")[0] == "tree"
             else importlib.import_module("tgmm_fp8_ws_" + label.split("@")[0]) for label in sys.argv[2].split(",")}
  print("device:", jax.devices()[0].device_kind, flush=True)
  for name, m, k, n, g in CASES:
    if sys.argv[1] == "sass":
      f8, s = jnp.float8_e4m3fn, jax.ShapeDtypeStruct
      args = (s((k, m), f8), s((n, m), f8), s((g + 1,), jnp.int32), s((k, -(-m // 128)), jnp.float32),
              s((n, -(-m // 128)), jnp.float32))
      for label, module in modules.items():
        kernel = cross_compiled(module, args, config_of(label))
        with tempfile.TemporaryDirectory() as d:
          with open(f"{d}/k.ptx", "w") as f:
            f.write(kernel.asm["ptx"])
          bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
          out = subprocess.run([f"{bin_dir}/ptxas", "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                               capture_output=True, text=True, check=True).stderr
          sass = subprocess.run([f"{bin_dir}/cuobjdump", "--dump-sass", f"{d}/k.cubin"], capture_output=True,
                                text=True, check=True).stdout
        waits = "".join("H" if "GMMA" in line else "w" + line.split("gsb0, ")[1][:3] for line in sass.splitlines()
                        if "GMMA" in line or "WARPGROUP.DEPBAR" in line)
        print(name, label, [line.split(":")[-1].strip() for line in out.splitlines() if "spill" in line], waits,
              [line for line in out.splitlines() if "C75" in line])
      break  # One shape tells the registers.
    inp = bench.Inputs(m, k, n, g)
    q = jax.jit(lambda a: quantize.quantize(a.T, "1x128"))
    args = (*q(inp.x), *q(inp.dout), inp.group_sizes)
    if os.environ.get("ALIGNED"):  # fp8_gmm's backward's operands: each group padded to the 128-row grid.
      blocks, padded_sizes = fp8._padded_groups(inp.group_sizes, m)
      q = jax.jit(lambda a, groups=None: fp8._quantize_pair_grouped_p(a, blocks, dtype=jnp.float8_e4m3fn,
                                                                      num_groups=groups, backend=None)[2:],
                  static_argnums=1)
      args = (*q(inp.x), *q(inp.dout, g if GROUP else None), padded_sizes)
    fns = {label: compiled(module, args, config_of(label)) for label, module in modules.items()}
    if sys.argv[1] == "ncu":
      for f in fns.values():
        timing.jax_sync(f(*args))
      import torch  # Its runtime's profiler switch covers the whole process.
      torch.cuda.cudart().cudaProfilerStart()
      for label, f in fns.items():
        timing.jax_sync(f(*args))
        print("profiled", name, label, flush=True)
      torch.cuda.cudart().cudaProfilerStop()
      continue
    outs = {label: np.asarray(f(*args), np.float32) for label, f in fns.items()}
    ref = next(iter(outs.values()))
    print(name, {label: f"{oracle.deepgemm_diff(out, ref):.1e}" for label, out in outs.items()}, flush=True)
    bf16 = jax.jit(lambda a, b, gs: jgmm.tgmm(a, b, gs, transpose_lhs=True))
    ms = timing.time_interleaved({**{label: (lambda f=f: f(*args), timing.jax_sync) for label, f in fns.items()},
                                  "bf16 tgmm": (lambda: bf16(inp.x, inp.dout, inp.group_sizes), timing.jax_sync)},
                                 min_batch_s=0.03, batches=7)
    for label, t in ms.items():
      print(f"  {name} {label:12s} {t:7.3f} ms {2 * m * k * n / t / 1e9:6.0f} TFLOP/s", flush=True)
