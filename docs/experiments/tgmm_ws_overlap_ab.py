"""A/B (issue 17, session 38): triton_kernels/tgmm_ws.py ("tree") against docs/experiments/tgmm_ws_overlap.py
("overlap": a tile's output stored while the next tile's first wgmma runs), patched into backend_triton.

python docs/experiments/tgmm_ws_overlap_ab.py sass     (CPU) ptxas's spill line and the consumers' SASS order
python docs/experiments/tgmm_ws_overlap_ab.py check    (GPU) outputs and bias gradients equal to the tree's, bit for
                                                      bit, on small shapes (empty groups, a last K tile of <= 64 rows)
python docs/experiments/tgmm_ws_overlap_ab.py time [CASE,...]   (GPU) the bench cases' weight gradients at the
                                                      table's tiles, interleaved
"""
import functools
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

from jgmm import backend_triton, config_table
from jgmm.bench import CASES, Inputs, speed_of_light_ms
from jgmm.config import Config
from jgmm.ffi import _compile
from jgmm.ops import group_bounds
from jgmm.timing import jax_sync, time_interleaved
from jgmm.triton_kernels import tgmm_ws

sys.path.insert(0, os.path.dirname(__file__))
import tgmm_ws_overlap  # noqa: E402

KERNELS = {"tree": tgmm_ws, "overlap": tgmm_ws_overlap}
WIDE = Config(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=6, warp_specialized=True)
NARROW = Config(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, warp_specialized=True)


def weight_gradient(kernel, config, bias_grad):
  """backend_triton.tgmm (lhs (M, K) read transposed, bf16 out) through `kernel`'s module, jitted."""
  f = functools.partial(backend_triton.tgmm, existing_out=None, transpose_lhs=True, out_dtype=jnp.bfloat16,
                        bias_grad=bias_grad, config=config)

  def run(*args):
    with mock.patch.object(backend_triton, "tgmm_ws", KERNELS[kernel]):
      return f(*args)

  return jax.jit(run)


def sass():
  m, k, n, g = 4096, 512, 512, 4
  args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
          jax.ShapeDtypeStruct((g + 1,), jnp.int32))
  bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
  for kernel in KERNELS:
    for config in (WIDE, NARROW):
      for bias_grad in (False, True):
        _compile._cache.clear()
        weight_gradient(kernel, config, bias_grad).trace(*args).lower(lowering_platforms=("cuda",))
        (compiled,) = _compile._cache.values()
        with tempfile.TemporaryDirectory() as tmp:
          ptx = os.path.join(tmp, "k.ptx")
          with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
          out = subprocess.run([os.path.join(bin_dir, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o",
                                os.path.join(tmp, "k.cubin")], capture_output=True, text=True).stderr
          sass_text = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", os.path.join(tmp, "k.cubin")],
                                     capture_output=True, text=True).stdout
        spills = [line.strip() for line in out.splitlines() if "spill" in line]
        order = "".join("H" if "HGMMA" in s else "S" if "STSM" in s else "w" if "WARPGROUP.DEPBAR" in s else ""
                        for s in sass_text.splitlines())
        print(f"{kernel} {config.block_n}x{config.block_k}s{config.num_stages} bias={bias_grad}: {spills}; "
              f"{order[:160]}", flush=True)


def check():
  rng = np.random.default_rng(0)
  cases = [(600, 136, 264, [0, 250, 0, 30, 180, 0, 140]), (700, 72, 520, [0, 0, 350, 0, 350])]
  for m, k, n, sizes in cases:
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    bounds = group_bounds(jnp.asarray(sizes, jnp.int32), None, len(sizes), m)
    for config, bias_grad in ((WIDE, False), (WIDE, True), (NARROW, False)):
      want, got = (weight_gradient(kernel, config, bias_grad)(lhs, rhs, bounds) for kernel in KERNELS)
      want, got = (jax.tree.map(lambda x: np.asarray(x, np.float32), r) for r in (want, got))
      same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
      print(f"m {m} k {k} n {n} sizes {sizes} {config.block_n}x{config.block_k} bias {bias_grad}: "
            f"{'identical' if same else 'DIFFERENT'}", flush=True)


def time(names):
  device = backend_triton._device()
  rows = []
  for name, m, k, n, g in [c for c in CASES if c[0] in names]:
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    config = config_table.select(config_table.make_key("tgmm", "bfloat16", "bfloat16", m / g, k, n, g, transpose=True),
                                 arch=device.arch, device_kind=device.kind).config
    fns = {kernel: (functools.partial(weight_gradient(kernel, config, False), inp.x, inp.dout, bounds), jax_sync)
           for kernel in KERNELS}
    outs = [np.asarray(f(), np.float32) for f, _ in fns.values()]
    print(f"{name}: {config}; outputs {'identical' if np.array_equal(*outs) else 'DIFFERENT'}", flush=True)
    ms = time_interleaved(fns, min_batch_s=0.05, batches=9)
    sol = speed_of_light_ms(m, k, n, g)
    rows += [(name, kernel, t, 100 * sol / t, ms["tree"] / t) for kernel, t in ms.items()]
  print(f"\n{device.kind}, Triton {triton.__version__}")
  print("| case | kernel | ms | %SOL | speedup vs tree |\n|---|---|---|---|---|")
  for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f}% | {r[4]:.3f} |")


if __name__ == "__main__":
  if sys.argv[1] == "sass":
    sass()
  elif sys.argv[1] == "check":
    check()
  else:
    time(sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES if c[0] != "decode-small"])
