"""Repro (H200, Triton 3.6.0, torch 2.11): Triton's automatic Hopper warp specialisation on a persistent
tile loop hangs. `python docs/experiments/autows_hang.py` prints the plain persistent kernel's time, then
never returns from the warp-specialised one (run it under `timeout`). See docs/perf-notes.md, session 4."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def persistent_matmul(a_desc, b_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      WS: tl.constexpr):
  num_n = tl.cdiv(N, BN)
  num_tiles = tl.cdiv(M, BM) * num_n
  for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), warp_specialize=WS):
    pid_m = tile // num_n
    pid_n = tile % num_n
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK):
      acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([k, pid_n * BN]), acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


if __name__ == "__main__":
  M = N = K = 8192
  a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
  b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
  ref = a.float() @ b.float()
  # num_warps=4 is what makes Triton 3.6 warp-specialise on sm_90 (12 warps: a producer and two consumers).
  for ws, num_warps in ((False, 8), (True, 4)):
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    run = lambda: persistent_matmul[(132,)](TensorDescriptor.from_tensor(a, [128, 64]),
                                            TensorDescriptor.from_tensor(b, [64, 256]), c, M, N, K, 128, 256, 64, ws,
                                            num_warps=num_warps, num_stages=3)
    ms = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
    err = ((c.float() - ref).norm() / ref.norm()).item()
    print(f"warp_specialize={ws}: {ms:.3f} ms, {2 * M * N * K / ms / 1e9:.0f} TFLOP/s, rel err {err:.1e}", flush=True)
