"""A timeline of gmm_ws's tiles, per program and consumer, from the SM's cycle counter (issue 17, session 46).

Session 45 fitted ~2600 cycles lost per tile boundary of the warp-specialised forward; three experiments that should
have moved that (held stores, four stages, consumers started apart: sessions 45-46) moved the wall time by nothing.
This reads the boundary off the kernel itself: gmm_ws_kernel with its consumers writing %clock at five points of
each tile, launched through jgmm.ffi like backend_triton's own gmm_ws path (same descriptors, schedule, grid):
  0 the loop's top (the tile's turn)           1 its coordinates read (consumer_tile)
  2 its first stage's bytes landed (the first wgmma can issue; a half without MMAs: at once)
  3 its last wgmma done (warpgroup_mma_wait(0))
  4 its half's TMA store issued (gmm_ws.store_half)
(and 5: the tile's rows of its group, so that whole, partial and one-consumer tiles are timed apart) and each
consumer's entry and exit. Per case, over every program's tiles (both consumers), it prints the cycles of each phase,
the lag between the consumers' ends of a tile, each kind of tile's time, and the share of the programs' spans in
which neither consumer is between 2 and 3 (the tensor pipe surely idle: the boundary as the kernel lives it; idling
inside the K loop is not counted); from the global timer at each consumer's entry and exit (one clock for all SMs),
the SM time outside the programs (launch skew and the last wave's tail) and the clock rate. Session 46's first
version (21c09fe) could also start consumer 1 LAG steps late.

    python docs/experiments/tile_timeline.py [CASE,...]     (GPU; default mixtral8x7b-w1,dsv3-ep8-down, forward)
    JAX_PLATFORMS=cpu python docs/experiments/tile_timeline.py lower   (CPU: lowers it for sm_90: registers, spills)
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

import jgmm
from jgmm import backend_triton, ffi
from jgmm.bench import CASES, Inputs
from jgmm.ops import group_bounds
from jgmm.triton_kernels import geometry, gmm_ws
from jgmm.triton_kernels.gmm_ws import HALF, consumer_tile, store_half

POINTS = gl.constexpr(6)  # Per tile: the docstring's timestamps 0-4, then the tile's rows of its group (5).


@gluon.jit
def clock():
  """The SM's cycle counter's low 32 bits (int32: the trace is an int32 array, which JAX holds without x64; a
  program's span is far below 2^32 cycles, so differences taken modulo 2^32 are exact)."""
  return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def global_time():
  """The GPU's global nanosecond timer's low 32 bits (one clock for every SM, unlike %clock; wraps every 4.3 s)."""
  return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def timed_consumer(schedule_ptr, M, out_ptr, trace_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K: gl.constexpr,
                   N: gl.constexpr, R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   S: gl.constexpr, TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, H: gl.constexpr,
                   BAND: gl.constexpr, TILES: gl.constexpr):
  """gmm_ws.consumer (one CTA) writing the clock at the docstring's five points of each tile to trace_ptr
  (programs, TILES + 1, 2 consumers, POINTS) int32 (row TILES: the consumer's entry at 0, its exit at 4). A half
  without MMAs writes point 2 at once, so that 2-3 is its release of the stages (inside the other half's K loop)."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
  num_n: gl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  k_steps: gl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
  first = trace_ptr + (gl.program_id(0) * (TILES + 1) * 2 + H) * POINTS  # This consumer's points of tile 0.
  ends = first + TILES * 2 * POINTS  # Its entry's and exit's.
  gl.store(ends + 1, global_time())
  gl.store(ends, clock())
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [HALF, BLOCK_N], OUT_LAYOUT)
  step = 0
  i = 0
  for t in range(gl.program_id(0), gl.load(schedule_ptr) * num_n, gl.num_programs(0)):
    point = first + i * 2 * POINTS
    gl.store(point, clock())
    _, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H, BAND)
    gl.store(point + 1, clock())
    gl.store(point + 5, rows)
    acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      mbarrier.wait(ready.index(step % S), (step // S) & 1)  # tile_product's own wait on it then passes at once.
    gl.store(point + 2, clock())
    acc = gmm_ws.tile_product(a_bufs, b_bufs, ready, empty, empty, acc, step, rows, half_rows, k_steps, S,
                              TRANSPOSE_RHS, H, 1)
    gl.store(point + 3, clock())
    if rows > 0:
      step += k_steps
    if half_store > 0:
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK_N, half_store, N, BLOCK_N, OUT_LAYOUT)
    gl.store(point + 4, clock())
    i += 1
  tma.store_wait(pendings=0)
  gl.store(ends + 4, clock())
  gl.store(ends + 3, global_time())


@gluon.jit
def timeline_kernel(lhs_desc, rhs_desc, schedule_ptr, M, out_ptr, trace_ptr, K: gl.constexpr, N: gl.constexpr,
                    R_MAX: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, S: gl.constexpr,
                    TRANSPOSE_RHS: gl.constexpr, OUT_LAYOUT: gl.constexpr, BAND: gl.constexpr,
                    TILES: gl.constexpr):
  """gmm_ws_kernel (its parameters, the trace's pointer and TILES added) with timed_consumer's consumers."""
  a_bufs, b_bufs, c_bufs, ready, empty = gmm_ws.allocate(lhs_desc, rhs_desc, out_ptr, BLOCK_N, S, OUT_LAYOUT)
  gl.warp_specialize([
      (timed_consumer, (schedule_ptr, M, out_ptr, trace_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                        BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 0, BAND, TILES)),
      (timed_consumer, (schedule_ptr, M, out_ptr, trace_ptr, a_bufs, b_bufs, c_bufs, ready, empty, K, N, R_MAX,
                        BLOCK_N, BLOCK_K, S, TRANSPOSE_RHS, OUT_LAYOUT, 1, BAND, TILES)),
      (gmm_ws.loader, (lhs_desc, rhs_desc, schedule_ptr, a_bufs, b_bufs, ready, empty, empty, K, N, R_MAX, BLOCK_N,
                       BLOCK_K, S, TRANSPOSE_RHS, BAND, 1)),
  ], [4, 1], [232, 40])


def timeline(lhs, rhs, bounds, programs, block_n=256, block_k=64, stages=3, band=8):
  """(out (M, N) bf16, trace (programs, TILES + 1, 2, POINTS) int32, 0 where a program ran fewer tiles; the last
  row: each consumer's entry (point 0; %globaltimer_lo at 1) and exit (point 4; %globaltimer_lo at 3)):
  timeline_kernel launched as backend_triton._gmm_ws launches gmm_ws_kernel (forward, one CTA)."""
  m, k = lhs.shape
  g, _, n = rhs.shape
  row_tiles = geometry.cdiv(m, gmm_ws.BLOCK_M) + g + 1
  tiles = geometry.cdiv(row_tiles * geometry.cdiv(n, block_n), programs)
  lhs_block, rhs_block, out_block = (gmm_ws.HALF.value, block_k), (block_k, block_n), (gmm_ws.HALF.value, block_n)
  out, trace = ffi.triton_call(
      ffi.TensorDescriptor(lhs, lhs_block, layout=gmm_ws.shared_layout(lhs_block, "bfloat16")),
      ffi.TensorDescriptor(rhs.reshape(g * k, n), rhs_block, layout=gmm_ws.shared_layout(rhs_block, "bfloat16")),
      backend_triton._row_tiles(bounds, m, row_tiles, gmm_ws.BLOCK_M), m,  # pylint: disable=protected-access
      kernel=timeline_kernel, out_shape=[jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
                                         jax.ShapeDtypeStruct((programs, tiles + 1, 2, POINTS.value), jnp.int32)],
      zeroed_outputs=(1,), grid=(programs,), num_warps=gmm_ws.NUM_WARPS, maxnreg=gmm_ws.MAXNREG,
      name="jgmm_tile_timeline", K=k, N=n, R_MAX=row_tiles, BLOCK_N=block_n, BLOCK_K=block_k, S=stages,
      TRANSPOSE_RHS=False, OUT_LAYOUT=gmm_ws.shared_layout(out_block, "bfloat16"), BAND=band, TILES=tiles)
  return out, trace


def summary(trace, steps):
  """Medians (cycles) of the phases over every tile of every program and both consumers, the consumers' lag at a
  tile's end, the share of the programs' spans (first entry to last exit) with neither consumer between points 2 and
  3, and those spans against the tiles' ideal (steps x 1024 cycles a tile: two 64 x 256 x 64 wgmma steps at 2048 FMA
  a cycle)."""
  phases = {"coordinates (0-1)": (0, 1), "first stage wait (1-2)": (1, 2), "K loop (2-3)": (2, 3),
            "store (3-4)": (3, 4)}
  rows = {name: [] for name in phases}
  rows["to the next tile (4-next 0)"] = []
  rows["entry to the first tile"] = []
  rows["the last tile's store to exit"] = []
  lags, idle, spans, ideal = [], 0, [], 0
  kinds = {"128 rows": [], "65-127 rows": [], "1-64 rows (one consumer's MMAs)": []}
  for program in trace.astype(np.int64):
    signed = (program - program[-1, 0, 0] + 2**31) % 2**32 - 2**31  # From consumer 0's entry, wrap-free.
    ran = program[:-1, 0, 4] != 0
    p, ends = signed[:-1][ran], signed[-1]  # (tiles run, 2, POINTS); (2, POINTS)
    for name, (a, b) in phases.items():
      rows[name] += list((p[:, :, b] - p[:, :, a]).ravel())
    rows["to the next tile (4-next 0)"] += list((p[1:, :, 0] - p[:-1, :, 4]).ravel())
    rows["entry to the first tile"] += list(p[0, :, 0] - ends[:, 0])
    rows["the last tile's store to exit"] += list(ends[:, 4] - p[-1, :, 4])
    lags += list(p[:, 1, 3] - p[:, 0, 3])
    rows_of = program[:-1, 0, 5][ran]  # Unshifted: a count, not a time.
    tile = np.append(p[1:, 0, 0], ends[0, 4]) - p[:, 0, 0]  # Consumer 0's top of a tile to its next (or its exit).
    for name, pick in zip(kinds, (rows_of == 128, (rows_of > 64) & (rows_of < 128), (rows_of > 0) & (rows_of <= 64))):
      kinds[name] += list(tile[pick])
    events = sorted([(t, 1) for t in p[:, :, 2].ravel()] + [(t, -1) for t in p[:, :, 3].ravel()])
    busy, depth, since = 0, 0, None
    for t, d in events:
      if depth == 0 and d > 0:
        since = t
      depth += d
      if depth == 0:
        busy += t - since
    span = ends[:, 4].max() - ends[:, 0].min()
    idle += span - busy
    spans.append(span)
    ideal += len(p) * steps * 1024
  for name, values in rows.items():
    print(f"| {name} | {np.median(values):.0f} | {np.percentile(values, 10):.0f} | {np.percentile(values, 90):.0f} |")
  for name, values in ((name, values) for name, values in kinds.items() if values):
    print(f"| a tile of {name}: {len(values)}, top to top | {np.median(values):.0f} | "
          f"{np.percentile(values, 10):.0f} | {np.percentile(values, 90):.0f} |")
  print(f"| lag, consumer 1's K loop end - consumer 0's | {np.median(lags):.0f} | {np.percentile(lags, 10):.0f} | "
        f"{np.percentile(lags, 90):.0f} |")
  print(f"neither consumer in its K loop: {100 * idle / sum(spans):.2f}% of the programs' spans; the tiles' ideal "
        f"{100 * ideal / sum(spans):.1f}% of them; spans: median {np.median(spans):.0f}, max {max(spans)} cycles")
  ns = trace[:, -1, :, [1, 3]].astype(np.int64)  # (2 ends, programs, 2 consumers): %globaltimer_lo at entry, exit.
  ns = (ns - ns[0].min() + 2**31) % 2**32 - 2**31
  enter, leave = ns[0].min(axis=1), ns[1].max(axis=1)  # Per program, its first consumer in and its last out.
  wall = leave.max() - enter.min()
  ghz = np.median(np.asarray(spans) / (leave - enter))
  print(f"the kernel (global timer): {wall} ns; programs enter within {enter.max() - enter.min()} ns of the first and "
        f"leave {np.median(leave.max() - leave):.0f} ns (median; max {leave.max() - leave.min()}) before the last; "
        f"SM time outside the programs: {100 * (1 - (leave - enter).sum() / (len(enter) * wall)):.2f}%; "
        f"{ghz:.3f} GHz (program cycles / ns); the tiles' ideal {100 * ideal / (len(enter) * wall * ghz):.1f}% "
        "of the kernel's SM cycles")


def main(names):
  device = backend_triton._device()  # pylint: disable=protected-access
  for name, m, k, n, g in (c for c in CASES if c[0] in names):
    inp = Inputs(m, k, n, g)
    bounds = group_bounds(jnp.asarray(inp.sizes), None, g, m)
    ref = np.asarray(jgmm.gmm(inp.x, inp.w, jnp.asarray(inp.sizes)), np.float32)  # The table's gmm_ws, bands of 8.
    out, trace = timeline(inp.x, inp.w, bounds, device.num_sms)
    out, trace = timeline(inp.x, inp.w, bounds, device.num_sms)  # The second launch: warm.
    same = np.array_equal(np.asarray(out, np.float32), ref)
    print(f"\n{device.kind}, {name} forward, bands of 8, 3 stages; output equal to gmm's: {same}\n"
          "| phase (cycles) | median | 10% | 90% |\n|---|---|---|---|")
    summary(np.asarray(trace), k // 64)


if __name__ == "__main__":
  if sys.argv[1:] == ["lower"]:
    os.environ["JGMM_TARGET"] = "cuda:90"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sass_wgmma  # pylint: disable=import-outside-toplevel
    from jgmm.ffi import _compile  # pylint: disable=import-outside-toplevel
    s = jax.ShapeDtypeStruct
    jax.jit(lambda x, w, b: timeline(x, w, b, 132)).trace(
        s((8192, 4096), jnp.bfloat16), s((8, 4096, 14336), jnp.bfloat16), s((9,), jnp.int32)).lower(
            lowering_platforms=("cuda",))
    (compiled,) = _compile._cache.values()
    ptxas, _ = sass_wgmma.assemble(compiled)
    print("lowered for sm_90:", "; ".join(line.split(": ", 1)[-1] for line in ptxas.splitlines()
                                          if "Used" in line or "spill" in line))
  else:
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-down"])
