"""A/B (issue 17, session 55): gmm_kernel's group search in two reductions and two loads of bounds (group_tile, as
built) against the four reductions over the register table it replaced ("before": triton_kernels/gmm.py at BEFORE,
read from git and imported beside the package's, its gmm_kernel patched into backend_triton while tracing).

qwen3's d lhs (gmm_kernel, 64 x 256 x 64, one program an SM, 128 groups: 24 K steps a tile) ran 8% slower under
Triton 3.6 than 3.9 on one H200 (session 55); its SASS differs in the once-a-tile search (3.6: 49 BAR, 23 SHFL;
3.9: 36, 5). As built: 38 and 15 under 3.6, 28 and 5 under 3.9, 200-201 registers (208 / 202 before); the 8-warp
tables of 8 and 32 groups keep their barriers.

    python docs/experiments/group_search_ab.py sass          # CPU: both versions' SASS counts, both layouts
    python docs/experiments/group_search_ab.py time|sustained [CASE,...]   # GPU: SECONDS=1 for sustained
    (the device's copy of the checkout has no .git: BEFORE_FILE=gmm_before.py, before_kernel says how)

time/sustained: per bench case the table's gmm_kernel products (forward, d lhs; gmm_ws ones are skipped) on the
case's inputs and the whole forward+backward of jgmm.gmm, before and as built, outputs checked equal bit for bit.
"""
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp

import jgmm
from jgmm import backend_triton
from jgmm.bench import CASES, Inputs, fwd_bwd
from jgmm.ops import group_bounds
from jgmm.triton_kernels import gmm as gmm_kernels
from table_ab import gmm_call, patched_variants, table_gmm_products, timed  # docs/experiments/table_ab.py

BEFORE = "5391ddd"  # The last commit with the four-reduction search.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache
def before_kernel():
  """gmm_kernel of triton_kernels/gmm.py at BEFORE, imported as its own module (Triton reads its source file):
  from git, or where the checkout has no .git (the device machine's copy) from the file BEFORE_FILE names (made
  here with `git show 5391ddd:triton_kernels/gmm.py > gmm_before.py`, an untracked file that travels)."""
  path = os.environ.get("BEFORE_FILE")
  if path is None:
    path = os.path.join(tempfile.mkdtemp(), "gmm_before.py")
    with open(path, "w") as f:
      f.write(subprocess.run(["git", "-C", ROOT, "show", f"{BEFORE}:triton_kernels/gmm.py"], capture_output=True,
                             text=True, check=True).stdout)
  spec = importlib.util.spec_from_file_location("gmm_before", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.gmm_kernel


def variants(make):
  """{"before": (f, sync), "built": (f, sync)}: make() -> f (a jitted call on fixed inputs) traced and compiled with
  each kernel (outputs checked equal)."""
  return patched_variants(make, gmm_kernels, "gmm_kernel", {"before": before_kernel(), "built": gmm_kernels.gmm_kernel})


def product(transpose_rhs, config):
  return jax.jit(functools.partial(gmm_call(transpose_rhs), config=config))


def time(mode, names):
  device = backend_triton._device()  # pylint: disable=protected-access
  print(f"\n{device.kind}, {mode}, triton {__import__('triton').__version__}\n| case | product | before ms | "
        "built ms | speed-up |\n|---|---|---|---|---|", flush=True)
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    runs = {}
    for what, op, args, _, _, config in table_gmm_products(inp, bounds, m, k, n, g, device):
      if not config.warp_specialized:
        runs[what] = variants(lambda: functools.partial(product(op == "gmm_t", config), *args))  # noqa: B023
    runs["fwd+bwd"] = variants(  # A jitted call traced afresh under each kernel.
        lambda: functools.partial(fwd_bwd(jgmm.gmm), inp.x, inp.w, inp.group_sizes, inp.dout))  # noqa: B023
    for what, fns in runs.items():
      ms = timed(mode, fns)
      print(f"| {name} | {what} | {ms['before']:.3f} | {ms['built']:.3f} | {ms['before'] / ms['built']:.3f} |",
            flush=True)


def sass():
  """Both kernels' SASS counts on the table's gmm_kernel shapes (cross-compiled for sm_90a)."""
  os.environ["JGMM_TARGET"] = "cuda:90"
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from sass_wgmma import assemble  # pylint: disable=import-outside-toplevel
  from jgmm.config import Config  # pylint: disable=import-outside-toplevel
  from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel
  s, dt = jax.ShapeDtypeStruct, jnp.bfloat16
  cases = {"qwen3 fwd": (Config(64, 256, 32, 4, 4, programs_per_sm=2), False, 32768, 2048, 1536, 128),
           "qwen3 d lhs": (Config(64, 256, 64, 4, 4), True, 32768, 1536, 2048, 128),
           "mixtral d lhs": (Config(128, 256, 64, 8, 3), True, 8192, 14336, 4096, 8),
           "dsv3 down d lhs": (Config(128, 256, 64, 8, 3), True, 32768, 7168, 2048, 32)}
  for label, (config, transpose, m, k, n, g) in cases.items():
    for name, kernel in (("before", before_kernel()), ("built", gmm_kernels.gmm_kernel)):
      _compile._cache.clear()  # pylint: disable=protected-access
      with mock.patch.object(gmm_kernels, "gmm_kernel", kernel):
        product(transpose, config).trace(s((m, k), dt), s((g, n, k) if transpose else (g, k, n), dt),
                                         s((g + 1,), jnp.int32)).lower(lowering_platforms=("cuda",))
      (compiled,) = _compile._cache.values()  # pylint: disable=protected-access
      report, code = assemble(compiled)
      count = lambda pattern: sum(pattern in line for line in code.splitlines())  # noqa: E731,B023
      registers = report.split("Used ")[1].split(" registers")[0]
      print(f"{label}, {name}: {registers} registers, BAR {count('BAR.SYNC') + count('BAR.ARV')}, "
            f"SHFL {count('SHFL')}, REDUX {count('REDUX')}, LDG {count('LDG')}, HGMMA {count('GMMA')}")


if __name__ == "__main__":
  if sys.argv[1] == "sass":
    sass()
  else:
    time(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES])
