"""Can one consumer warpgroup keep the H100/H200 tensor pipe busy alone? (issue 17, session 46's "Next")

Session 46 ran gmm_ws's two consumers a few K steps apart, so that one consumer's tile boundary would fall while the
other still issued wgmmas: no change at all in active cycles. Either the lag did not survive, or one consumer's
wgmmas cannot fill the pipe alone. This measures the second directly: a persistent program per SM issues wgmmas on
operands that stay in shared memory (no loads, no barriers), and its FMA rate is compared across
  wg1        one warpgroup, 64 x 256 accumulator, STEP_K-deep steps, warpgroup_mma_wait(1) after each (gmm_ws's
             consumer alone)
  wg1_wait0  the same with warpgroup_mma_wait(0) (no step in flight while the next is issued)
  wg2        two warpgroups (8 warps, a 128 x 256 accumulator split by rows: gmm_ws's two consumers in lockstep)
for STEP_K 64 (gmm_ws's BLOCK_K) and 128. If wg1 runs near wg2's rate, one consumer fills the pipe and ping-pong
schemes (or a lag that survives) can hide a tile boundary; if it runs near half, only the consumer in the boundary
can keep its own wgmmas going (two accumulators), or a third consumer.

    python docs/experiments/pipe_fill.py          (GPU: torch for the launch and the timing)
    python docs/experiments/pipe_fill.py sass     (CPU: compiles each variant for sm_90, ptxas's registers and spills)
"""
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

COLS = 256  # The accumulator's columns: gmm_ws's BLOCK_N.
N = gl.constexpr(COLS)


@gluon.jit
def pipe_kernel(a_ptr, b_ptr, out_ptr, STEPS: gl.constexpr, STEP_K: gl.constexpr, WAIT: gl.constexpr,
                WARPS: gl.constexpr):
  """STEPS wgmma steps of (16 WARPS, STEP_K) x (STEP_K, N) into one fp32 accumulator, operands read once into shared
  memory; the accumulator's sum per program to out_ptr (so the wgmmas are live)."""
  rows: gl.constexpr = 16 * WARPS
  load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, N, 16])
  a_rows = gl.arange(0, rows, layout=gl.SliceLayout(1, load_layout))
  a_cols = gl.arange(0, STEP_K, layout=gl.SliceLayout(0, load_layout))
  a = gl.load(a_ptr + a_rows[:, None] * STEP_K + a_cols[None, :])
  b_rows = gl.arange(0, STEP_K, layout=gl.SliceLayout(1, load_layout))
  b_cols = gl.arange(0, N, layout=gl.SliceLayout(0, load_layout))
  b = gl.load(b_ptr + b_rows[:, None] * N + b_cols[None, :])
  a_smem = gl.allocate_shared_memory(gl.bfloat16, [rows, STEP_K],
                                     gl.NVMMASharedLayout.get_default_for([rows, STEP_K], gl.bfloat16), a)
  b_smem = gl.allocate_shared_memory(gl.bfloat16, [STEP_K, N],
                                     gl.NVMMASharedLayout.get_default_for([STEP_K, N], gl.bfloat16), b)
  fence_async_shared()
  acc = gl.zeros((rows, N), dtype=gl.float32, layout=acc_layout)
  for _ in range(STEPS):
    acc = warpgroup_mma(a_smem, b_smem, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=WAIT, deps=(acc,))
  acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
  gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, axis=1), axis=0))


# label: (STEP_K, WAIT, WARPS)
VARIANTS = {f"{name} k{step_k}": (step_k, wait, warps) for step_k in (64, 128)
            for name, wait, warps in (("wg1", 1, 4), ("wg1_wait0", 0, 4), ("wg2", 1, 8))}


def sass():
  """Each variant compiled for sm_90 on the CPU: ptxas's registers and spills, its HGMMAs and wgmma waits."""
  import collections  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import triton  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
  from triton.experimental.gluon._runtime import GluonASTSource  # pylint: disable=import-outside-toplevel
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import sass_wgmma  # pylint: disable=import-outside-toplevel
  signature = {"a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*fp32", "STEPS": "constexpr", "STEP_K": "constexpr",
               "WAIT": "constexpr", "WARPS": "constexpr"}
  for label, (step_k, wait, warps) in VARIANTS.items():
    source = GluonASTSource(pipe_kernel, signature, {"STEPS": 1000, "STEP_K": step_k, "WAIT": wait, "WARPS": warps})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptxas, sass_text = sass_wgmma.assemble(compiled)
    used = [line.split(": ", 1)[-1] for line in ptxas.splitlines() if "Used" in line or "spill" in line]
    waits = [line.split("gsb0, ")[-1].split()[0] for line in sass_text.splitlines() if "WARPGROUP.DEPBAR" in line]
    print(f"{label}: {'; '.join(used)}; {sass_text.count('HGMMA')} HGMMAs, waits (count per depth) "
          f"{dict(collections.Counter(waits))}")


def measure(steps=20000, rounds=7):
  """Each variant on one program per SM, interleaved rounds: median ms, FMA rate (TFMA/s) and that rate against the
  two warpgroups' of the same STEP_K."""
  import statistics  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  props = torch.cuda.get_device_properties(0)
  sms = props.multi_processor_count
  gen = torch.Generator(device="cuda").manual_seed(0)
  a = torch.randn((128, 128), device="cuda", dtype=torch.bfloat16, generator=gen)
  b = torch.randn((128, COLS), device="cuda", dtype=torch.bfloat16, generator=gen)
  out = torch.full((sms,), float("nan"), device="cuda")
  times = {label: [] for label in VARIANTS}

  def launch(step_k, wait, warps):
    pipe_kernel[(sms,)](a, b, out, STEPS=steps, STEP_K=step_k, WAIT=wait, WARPS=warps, num_warps=warps)

  for variant in VARIANTS.values():  # Compile and warm up.
    launch(*variant)
  torch.cuda.synchronize()
  assert torch.isfinite(out).all(), "the accumulators' sums are not finite"
  for _ in range(rounds):
    for label, variant in VARIANTS.items():
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record()
      launch(*variant)
      end.record()
      end.synchronize()
      times[label].append(start.elapsed_time(end))
  print(f"{props.name}, {sms} programs x {steps} steps, median of {rounds} interleaved rounds")
  print("| variant | ms | TFMA/s | vs wg2 of the same STEP_K |\n|---|---|---|---|")
  for label, (step_k, _, warps) in VARIANTS.items():
    ms = statistics.median(times[label])
    fma = sms * steps * 16 * warps * step_k * COLS
    ref_label = f"wg2 k{step_k}"
    ref_rate = sms * steps * 128 * step_k * COLS / statistics.median(times[ref_label])
    print(f"| {label} | {ms:.3f} | {fma / ms / 1e9:.1f} | {fma / ms / ref_rate:.3f} |")


if __name__ == "__main__":
  if sys.argv[1:] == ["sass"]:
    sass()
  else:
    measure()
