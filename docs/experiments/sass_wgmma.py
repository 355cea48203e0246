"""Are the warp-specialised kernel's wgmmas pipelined? Compiles gmm_ws_kernel for sm_90 on a CPU-only machine (qwen3's
shape) and prints ptxas's resource line and C75xx warnings, and the SASS's sequence of HGMMA (H) and wgmma waits
(wN: WARPGROUP.DEPBAR.LE gsb0, N). A pipelined main loop reads like HHHHw1; `Hw0` after every HGMMA means ptxas
serialised them (session 6).
    JAX_PLATFORMS=cpu python docs/experiments/sass_wgmma.py BLOCK_M:BLOCK_N:STAGES:{n|t} ...   (t: rhs transposed)
fp8:blocks / fp8:rowwise compile gmm_fp8_ws_kernel instead (masked, DeepSeek-V3's (4096, 7168); QGMMA shows as H):
its consumers' steps read HHHHw0 (the four k32 wgmmas of a 128-wide K block, then the wait before the scaling);
fp8:blocks:BLOCK_M:BLOCK_N:STAGES:K another tiling and K (default 128:128:4:7168).
tgmm[:BLOCK_N:STAGES[:bias]] compiles the bf16 tgmm_ws_kernel (gmm's weight gradient of dsv3 gate-up: M = 32768, K =
7168, N = 4096, 32 groups; 128 x 256, 3 stages by default; `bias` with the bias gradient).
fp8:tgmm[:BLOCK_N] compiles tgmm_fp8_ws_kernel (fp8_gmm's d rhs of dsv3 gate-up: K = 7168, N = 4096, M = 32768; 128 x
256 (or BLOCK_N), 3 stages).
gk:G compiles gmm_kernel at the sm_90 heuristic's 64 x 256 x 32 (two programs an SM) on qwen3's M, K, N with G groups.
Every report also counts the SASS's convergence instructions (WARPSYNC, BSSY, BSYNC, BRA.DIV), shuffles and warp
reductions (REDUX): session 52 found a group table narrower than a warp reduced by shuffles, for which ptxas kept
the warp converged on every iteration of gmm_kernel's fused loop (17 such instructions against 0; 20-27% slower).
The PTX goes to Triton's ptxas, or to its ptxas-blackwell where that one is too old for the PTX's version (Triton
3.9's bundled ptxas reads PTX 8.8, jgmm writes 9.0 for CUDA 13's); PTX_DIR=... also writes each kernel's PTX there.
A lesson kept here: with a loop trip count the compiler knows, ptxas serialised a consumer loop that keeps two
products in flight (C7514), while the same loop with a runtime count pipelined (docs/perf-notes.md, session 25)."""
import os
import re
import subprocess
import sys
import tempfile

os.environ["JGMM_TARGET"] = "cuda:90"
import jax, jax.numpy as jnp, triton
from jgmm import backend_triton
from jgmm.config import Config
from jgmm.ffi import _compile

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def assemble(compiled, ptx_name=None):
  """(ptxas -v's report, the SASS) of a compiled kernel's PTX for sm_90a (PTX_DIR: the PTX also written there, as
  ptx_name.ptx)."""
  with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/k.ptx", "w") as f:
      f.write(compiled.asm["ptx"])
    if os.environ.get("PTX_DIR") and ptx_name:
      with open(os.path.join(os.environ["PTX_DIR"], ptx_name + ".ptx"), "w") as f:
        f.write(compiled.asm["ptx"])
    for tool in ("ptxas", "ptxas-blackwell"):
      run = subprocess.run([f"{BIN}/{tool}", "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True)
      if "Unsupported .version" not in run.stderr:
        break
    run.check_returncode()
    return run.stderr, subprocess.run([f"{BIN}/cuobjdump", "--dump-sass", f"{d}/k.cubin"], capture_output=True,
                                      text=True, check=True).stdout


def report(label, compiled, ptxas, sass, stores=False):
  """Prints the kernel's warps and shared memory, ptxas's resource lines and C75xx warnings, and its sequence of
  HGMMAs (H) and wgmma waits (wN); with stores, also its STSMs (S) and TMA stores (T)."""
  ops = ("GMMA", "WARPGROUP.DEPBAR") + (("STSM", "UTMASTG") if stores else ())
  seq = "".join("H" if "GMMA" in line else "S" if "STSM" in line else "T" if "UTMASTG" in line else
                "w" + re.search(r"gsb0, 0x([0-9a-f]+)", line).group(1)
                for line in sass.splitlines() if any(op in line for op in ops))
  print(f"{label}: {compiled.num_warps} warps, {compiled.shared_mem_bytes} B shared memory")
  for line in ptxas.splitlines():
    if any(word in line for word in ("Used", "C75", "spill")):
      print("  ptxas:", re.sub(r"^ptxas(-blackwell)? info\s*: ", "", line)[:160])
  print(f"  {'HGMMA/wait/STSM/TMA-store' if stores else 'HGMMA/wait'} sequence:", seq)
  count = lambda pattern: len(re.findall(pattern, sass))  # noqa: E731
  print(f"  convergence instructions {count(r'WARPSYNC|BSSY|BSYNC|BRA[.]DIV')}, SHFL {count('SHFL')}, "
        f"REDUX {count('REDUX')}")


if __name__ == "__main__":
  m, k, n, g = 32768, 2048, 1536, 128
  s, dt = jax.ShapeDtypeStruct, jnp.bfloat16
  for arg in sys.argv[1:]:
    _compile._cache.clear()
    if arg.startswith("fp8:tgmm"):
      f8, fk, fn, fm, fg = jnp.float8_e4m3fn, 7168, 4096, 32768, 32
      config = Config(block_m=128, block_n=int((arg.split(":")[2:] or [256])[0]), block_k=128, num_stages=3,
                      warp_specialized=True)
      jax.jit(lambda *a: backend_triton.tgmm_fp8(*a, transpose_lhs=False, transpose_rhs=True, out_dtype=dt,
                                                 config=config)).trace(
          s((fk, fm), f8), s((fn, fm), f8), s((fg + 1,), jnp.int32), s((fk, fm // 128), jnp.float32),
          s((fn, fm // 128), jnp.float32)).lower(lowering_platforms=("cuda",))
    elif arg.startswith("tgmm"):
      block_n, stages, *bias = (arg.split(":")[1:] or ["256", "3"])
      config = Config(block_m=128, block_n=int(block_n), block_k=64, num_warps=8, num_stages=int(stages),
                      warp_specialized=True)
      jax.jit(lambda *a: backend_triton.tgmm(*a, None, transpose_lhs=True, out_dtype=dt, bias_grad=bool(bias),
                                             config=config)).trace(
          s((32768, 7168), dt), s((32768, 4096), dt), s((33,), jnp.int32)).lower(lowering_platforms=("cuda",))
    elif arg.startswith("gk:"):
      groups = int(arg.split(":")[1])
      config = Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2)
      jax.jit(lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=False, out_dtype=dt,
                                                 activation=None, save_preactivation=False, config=config)).trace(
          s((m, k), dt), s((groups, k, n), dt), s((groups + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
    elif arg.startswith("fp8:"):
      block_m, block_n, stages, fk = map(int, arg.split(":")[2:] or (128, 128, 4, 7168))
      blocks, f8, fg, fm, fn = arg.startswith("fp8:blocks"), jnp.float8_e4m3fn, 4, 1024, 4096
      config = Config(block_m=block_m, block_n=block_n, block_k=128, num_stages=stages, warp_specialized=True)
      jax.jit(lambda *a: backend_triton.masked_gmm_fp8(*a, out_dtype=dt, expected_m=None, config=config)).trace(
          s((fg, fm, fk), f8), s((fg, fn, fk), f8), s((fg,), jnp.int32),
          s((fg, fm, fk // 128) if blocks else (fg, fm), jnp.float32),
          s((fg, fn // 128, fk // 128) if blocks else (fg, fn), jnp.float32)).lower(lowering_platforms=("cuda",))
    else:
      block_m, block_n, stages, layout = arg.split(":")
      tr = layout == "t"
      config = Config(block_m=int(block_m), block_n=int(block_n), block_k=64, num_warps=8, num_stages=int(stages),
                      warp_specialized=True)
      jax.jit(lambda l, r, b: backend_triton.gmm(l, r, b, None, None, transpose_rhs=tr, out_dtype=dt, activation=None,
                                                 save_preactivation=False, config=config)).trace(
          s((m, k), dt), s((g, n, k) if tr else (g, k, n), dt), s((g + 1,), jnp.int32)).lower(
              lowering_platforms=("cuda",))
    (compiled,) = _compile._cache.values()
    report(arg, compiled, *assemble(compiled, arg.replace(":", "_")))
