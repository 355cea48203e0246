"""The FP8 gmm's product kernel (the tables' tiles) on contiguous groups of 960, 1024 and 1152 rows (dsv3 gate-up's
N 4096, K 7168, 32 groups), three launches each, for `ncu --kernel-name regex:gmm_fp8_ws --metrics ...`: is the
192-row tiles' rate bound by the L2's bytes (a group's last tile of 64 rows reads the same rhs tile as a full one)?
Issue 15, session 37.
    python docs/experiments/fp8_l2_probe.py"""
import jax

from jgmm import bench_fp8

for rows in (960, 1024, 1152):
  x, w, groups, valid = bench_fp8._case_inputs("contiguous", 32, rows, 4096, 7168)
  xq, xs, wq, ws, gs = bench_fp8.fp8_operands(x, w, groups, bench_fp8.RECIPES["blocks"])
  product = jax.jit(bench_fp8._product("contiguous", rows))
  for _ in range(3):
    jax.block_until_ready(product(xq, wq, gs, xs, ws))
  print("ran", rows, flush=True)
