"""What the block scales cost gmm_fp8_ws (issue 15, session 31): the tree against copies of
triton_kernels/gmm_fp8_ws.py made here by deleting work (diagnostics: their results are wrong by design), on
`python -m jgmm.bench --fp8`'s cases with DeepSeek-V3 blocks (and the tree on rowwise scales beside them), timed
interleaved as the benchmark times jgmm (timing.chain); TFLOP/s on the valid rows; a FILE.py variant's blocks
output compared with the tree's bit for bit.
  norhs: no rhs block scale (the loader's cp.async copies and the consumers' reads of them removed);
  nolhs: no lhs block scales (their TMA copy and reads removed);
  none: neither (the per-step promotion adds the product unscaled).
  FILE.py: a copy of gmm_fp8_ws in docs/experiments (e.g. the kernel before a change, from git show).
    python docs/experiments/fp8_scales_ab.py [name,... [variant,...]]   (names as bench_fp8's, e.g.
    masked-1x1024-4096-7168; variants: tree (always first), norhs, nolhs, none (the default), FILE.py)"""
import functools
import importlib.util
import inspect
import os
import sys
import tempfile
from unittest import mock

import jax
import numpy as np

from jgmm import backend_triton, bench_fp8, timing
from jgmm.triton_kernels import gmm_fp8_ws

RHS_COPY = "        if RHS_BLOCKS:\n          copy_rhs_scales("
RHS_READ = "      scale = scale * s_buf.slice(R * HALF, HALF).load(ROWS)\n"
LHS_BYTES = "sa_bytes: gl.constexpr = sa_desc.block_type.nbytes if LHS_BLOCKS else 0"
LHS_COPY = "        if LHS_BLOCKS:  # After the expect"
LHS_READ = "  if LHS_BLOCKS:\n    scale = sa_buf"
PROMOTE = "  if LHS_BLOCKS or RHS_BLOCKS:\n    return acc + product"
EDITS = {
    "norhs": [(RHS_COPY, RHS_COPY.replace("RHS_BLOCKS", "False")), (RHS_READ, "      scale = scale + 0.0\n")],
    "nolhs": [(LHS_BYTES, "sa_bytes: gl.constexpr = 0"), (LHS_COPY, LHS_COPY.replace("LHS_BLOCKS", "False")),
              (LHS_READ, LHS_READ.replace("LHS_BLOCKS", "False"))],
    "none": [(RHS_COPY, RHS_COPY.replace("RHS_BLOCKS", "False")), (LHS_BYTES, "sa_bytes: gl.constexpr = 0"),
             (LHS_COPY, LHS_COPY.replace("LHS_BLOCKS", "False")), (PROMOTE, PROMOTE.replace("LHS_BLOCKS or RHS_BLOCKS",
                                                                                              "False"))],
}


def copy_module(name, directory):
  """gmm_fp8_ws with EDITS[name] applied, imported from `directory`; or docs/experiments/`name` (a .py file)."""
  if name.endswith(".py"):
    path = os.path.join(os.path.dirname(__file__), name)
  else:
    source = inspect.getsource(gmm_fp8_ws)
    for old, new in EDITS[name]:
      assert source.count(old) == 1, (name, old)
      source = source.replace(old, new)
    path = os.path.join(directory, f"gmm_fp8_ws_{name}.py")
    with open(path, "w") as f:
      f.write(source)
  spec = importlib.util.spec_from_file_location(f"gmm_fp8_ws_{name.removesuffix('.py')}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


if __name__ == "__main__":
  with tempfile.TemporaryDirectory() as directory:
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else list(EDITS)
    modules = {"tree": gmm_fp8_ws, **{name: copy_module(name, directory) for name in variants}}
    table = []
    for name, layout, g, rows, n, k in bench_fp8.cases(sys.argv[1] if len(sys.argv) > 1 else ""):
      x, w, groups, valid = bench_fp8._case_inputs(layout, g, rows, n, k)
      runs = bench_fp8._runs(valid, n, k)
      fns, outs = {}, {}
      for recipe in bench_fp8.RECIPES.values():
        args = bench_fp8.fp8_operands(x, w, groups, recipe)
        for label, module in modules.items() if recipe == "1x128-128x128" else [("rowwise tree", gmm_fp8_ws)]:
          with mock.patch.object(backend_triton, "gmm_fp8_ws", module):  # Read when the function is traced.
            fn = functools.partial(bench_fp8._chained(bench_fp8._product(layout, rows), runs), *args)
            outs[label] = np.asarray(fn(), np.float32)
          fns[label] = (fn, timing.jax_sync)
      same = {label: bool(np.array_equal(out, outs["tree"])) for label, out in outs.items() if label.endswith(".py")}
      ms = timing.time_interleaved(fns, min_batch_s=0.05, batches=7)
      tflops = {v: 2 * valid * n * k * runs / t / 1e9 for v, t in ms.items()}
      table.append((name, tflops))
      print(f"{name}: " + ", ".join(f"{v} {t:.0f}" for v, t in tflops.items()) + f"; same bits as the tree: {same}",
            flush=True)
    print(f"\n{jax.devices()[0].device_kind}: TFLOP/s on the valid rows (blocks unless named)")
    labels = list(table[0][1])
    print("| case | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for name, t in table:
      print(f"| {name} | " + " | ".join(f"{t[v]:.0f}" for v in labels) + " |")
