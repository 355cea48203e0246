"""Spike (session 4, docs/perf-notes.md): a Hopper warp-specialised matmul written in Gluon, Triton 3.6.

Per program (persistent, one per SM): two consumer warpgroups, each computing whole 64 x BN tiles (every
other tile of the program) with async wgmma, and one TMA loader warp per consumer, each pair through its
own ring of S shared-memory stages; the epilogue goes through shared memory and a TMA store (a grouped kernel
would need it clipped to the group's rows). Plain (M, K) x (K, N) bf16 against cuBLAS: correct, 66-87% of
cuBLAS as it stands.
  python docs/experiments/gluon_ws_matmul.py [small [programs]]     (needs a Hopper GPU and torch)
"""
import sys
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier, warpgroup_mma, warpgroup_mma_wait, fence_async_shared


# Two rings of S stages, one per consumer: tile j of a program goes through ring j % 2, so each consumer
# waits only on its own ring's barriers (an mbarrier parity wait cannot tell phases two apart).
@gluon.jit
def _slot(j, kk, k_steps, S: gl.constexpr):
  n = (j // 2) * k_steps + kk
  return (j % 2) * S + n % S, (n // S) & 1


@gluon.jit
def _grid(M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
  """Column tiles, tiles, reduction steps. A program's tiles are pid, pid + P, ...; consumer and loader WHICH
  take every other one of them, starting with the program's WHICH-th."""
  num_n = gl.cdiv(N, BN)
  return num_n, gl.cdiv(M, BM) * num_n, gl.cdiv(K, BK)


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM: gl.constexpr, BN: gl.constexpr,
            BK: gl.constexpr, S: gl.constexpr, WHICH: gl.constexpr):
  num_n, num_tiles, k_steps = _grid(M, N, K, BM, BN, BK)
  j = WHICH
  for tile in range(gl.program_id(0) + WHICH * gl.num_programs(0), num_tiles, 2 * gl.num_programs(0)):
    off_m = (tile // num_n) * BM
    off_n = (tile % num_n) * BN
    for kk in range(k_steps):
      slot, phase = _slot(j, kk, k_steps, S)
      mbarrier.wait(empty.index(slot), phase ^ 1)
      mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
      tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], ready.index(slot), a_bufs.index(slot))
      tma.async_copy_global_to_shared(b_desc, [kk * BK, off_n], ready.index(slot), b_bufs.index(slot))
    j += 2


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
              S: gl.constexpr, WHICH: gl.constexpr):
  mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
  num_n, num_tiles, k_steps = _grid(M, N, K, BM, BN, BK)
  j = WHICH
  for tile in range(gl.program_id(0) + WHICH * gl.num_programs(0), num_tiles, 2 * gl.num_programs(0)):
    off_m = (tile // num_n) * BM
    off_n = (tile % num_n) * BN
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_layout)
    for kk in range(k_steps):
      slot, phase = _slot(j, kk, k_steps, S)
      mbarrier.wait(ready.index(slot), phase)
      acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot), acc, is_async=True)
      acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
      n = (j // 2) * k_steps + kk
      mbarrier.arrive(empty.index(WHICH * S + (n + S - 1) % S), pred=kk > 0)  # the previous step's slot
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    last, _ = _slot(j, k_steps - 1, k_steps, S)
    mbarrier.arrive(empty.index(last))
    tma.store_wait(pendings=0)
    c_bufs.index(WHICH).store(acc.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_bufs.index(WHICH))
    j += 2
  tma.store_wait(pendings=0)


@gluon.jit
def ws_matmul(a_desc, b_desc, c_desc, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr):
  a_bufs = gl.allocate_shared_memory(gl.bfloat16, [2 * S, BM, BK], a_desc.layout)
  b_bufs = gl.allocate_shared_memory(gl.bfloat16, [2 * S, BK, BN], b_desc.layout)
  c_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BM, BN], c_desc.layout)
  ready = gl.allocate_shared_memory(gl.int64, [2 * S, 1], mbarrier.MBarrierLayout())
  empty = gl.allocate_shared_memory(gl.int64, [2 * S, 1], mbarrier.MBarrierLayout())
  for s in gl.static_range(2 * S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=1)
  gl.warp_specialize([
      (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, M, N, K, BM, BN, BK, S, 0)),
      (_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, M, N, K, BM, BN, BK, S, 1)),
      (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM, BN, BK, S, 0)),
      (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM, BN, BK, S, 1)),
  ], [4, 1, 1], [232, 40, 40])


def run(a, b, c, BM=64, BN=256, BK=64, S=4, programs=132):
  M, K = a.shape
  N = b.shape[1]
  a_desc = TensorDescriptor.from_tensor(a, [BM, BK], gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16))
  b_desc = TensorDescriptor.from_tensor(b, [BK, BN], gl.NVMMASharedLayout.get_default_for([BK, BN], gl.bfloat16))
  c_desc = TensorDescriptor.from_tensor(c, [BM, BN], gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16))
  tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
  ws_matmul[(min(programs, tiles),)](a_desc, b_desc, c_desc, M, N, K, BM, BN, BK, S, num_warps=4, maxnreg=168)


if __name__ == "__main__":
  import torch
  PROGRAMS = int(sys.argv[2]) if len(sys.argv) > 2 else 132
  shapes = ((1000, 768, 512), (2000, 1024, 512)) if "small" in sys.argv else ((8192, 8192, 8192), (32768, 1536, 2048), (32768, 7168, 2048), (1000, 768, 520))
  for M, N, K in shapes:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    for S, BK in ((4, 32), (2, 64), (3, 32)):
      c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
      run(a, b, c, BK=BK, S=S, programs=PROGRAMS); torch.cuda.synchronize()
      err = ((c.float() - ref).norm() / ref.norm()).item()
      t = triton.testing.do_bench(lambda: run(a, b, c, BK=BK, S=S, programs=PROGRAMS), warmup=50, rep=300, return_mode="median")
      print(f"gluon ws {M}x{N}x{K} S={S} BK={BK}: {t:.3f} ms {2*M*N*K/t/1e9:.0f} TFLOP/s err {err:.1e}", flush=True)
    t = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    print(f"cublas   {M}x{N}x{K}: {t:.3f} ms {2*M*N*K/t/1e9:.0f} TFLOP/s", flush=True)
