"""A model of the DRAM bytes a persistent grouped-GEMM forward reads (issue 17, session 42), to rank tile orders on
a CPU before GPU time is spent on them.

Model: P programs take tiles p, p + P, ... of the kernel's tile order; they run in lockstep waves (every tile takes
the same time), and inside a wave step s of every tile reads its lhs chunk (the tile's rows x BLOCK_K) and its rhs
chunk (BLOCK_K x the tile's columns of its group's weights). The L2 is one fully associative LRU cache of L2_MB
(Hopper's is two partitions with their own policies: this is the ideal). DRAM bytes: the chunks that miss. Outputs
are not counted (written once whatever the order).

Orders: "ws" (gmm_ws_kernel: row tiles of all groups in one sequence, BAND row tiles the fastest inside a band;
"ws-group": the bands of each group's own row tiles, the last band taking the rest: the order since session 42),
"gk" (gmm_kernel: tiles numbered group by group, each group's row tiles in bands of 8 with the last band taking the
rest). "serpentine K": the same with every other wave running its K steps last to first (it starts on the chunks
the wave before left in the L2).

Checked against Nsight Compute's dram__bytes_read (session 40, one launch): ws on mixtral 2.18 GB modelled against
2.11-2.19 measured, gk on dsv3 gate-up 2.96 against 2.93; ws-group on mixtral 1.01 against 1.25 (real programs drift
apart, which lockstep waves do not).

    python docs/experiments/l2_model.py [CASE,...] [L2_MB]   (default L2_MB 50, the H100's)
"""
import collections
import sys

from jgmm.bench import CASES, group_sizes


def banded(m_tiles, n_tiles, band):
  """[(row tile, column tile)] in bands of `band` row tiles, the last band taking the rest (common.tile_coords)."""
  bands = max(m_tiles // band, 1)
  starts = [b * band for b in range(bands)]
  return [(r, c) for start, end in zip(starts, starts[1:] + [m_tiles]) for c in range(n_tiles)
          for r in range(start, end)]


def tiles(order, sizes, n, block_m, block_n, band):
  """[(group, first row, column tile)] of the kernel's tile order."""
  n_tiles = -(-n // block_n)
  firsts = [sum(sizes[:g]) for g in range(len(sizes))]
  row_tiles = [(g, firsts[g] + i * block_m) for g, rows in enumerate(sizes) for i in range(-(-rows // block_m))]
  if order == "ws":  # One sequence of all groups' row tiles (the bands before session 42 straddle groups).
    old = []
    for first in range(0, len(row_tiles), band):
      chunk = row_tiles[first:first + band]
      old += [(*chunk[r], c) for c in range(n_tiles) for r in range(len(chunk))]
    return old
  out = []
  for g, rows in enumerate(sizes):
    mine = [t for t in row_tiles if t[0] == g]
    out += [(*mine[r], c) for r, c in banded(len(mine), n_tiles, band)]
  return out


def dram_bytes(order, m, k, n, g, block_m, block_n, block_k, band, programs, l2_bytes, serpentine=False):
  sizes = list(group_sizes(m, g))
  order_tiles = tiles(order, sizes, n, block_m, block_n, band)
  cache, used, missed = collections.OrderedDict(), 0, 0
  lhs_chunk, rhs_chunk = block_m * block_k * 2, block_k * block_n * 2
  for wave in range(0, len(order_tiles), programs):
    running = order_tiles[wave:wave + programs]
    steps = range(-(-k // block_k))
    for step in steps[::-1] if serpentine and (wave // programs) % 2 else steps:
      for group, row0, col in running:
        for key, size in ((("x", row0, step), lhs_chunk), (("w", group, col, step), rhs_chunk)):
          if key in cache:
            cache.move_to_end(key)
            continue
          missed += size
          cache[key] = size
          used += size
          while used > l2_bytes:
            used -= cache.popitem(last=False)[1]
  return missed


if __name__ == "__main__":
  names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mixtral8x7b-w1", "dsv3-ep8-gateup", "dsv3-ep8-down"]
  l2_bytes = float(sys.argv[2] if len(sys.argv) > 2 else 50) * 2**20
  print("| case | order | tile | programs | model GB | serpentine K | floor GB |\n|---|---|---|---|---|---|---|")
  for name, m, k, n, g in CASES:
    if name not in names:
      continue
    floor = 2 * (m * k + g * k * n) / 1e9
    for order, (bm, bn, bk), band, programs in (("ws", (128, 256, 64), 8, 132), ("ws-group", (128, 256, 64), 8, 132),
                                                ("gk", (128, 256, 64), 8, 132), ("gk", (64, 256, 32), 8, 264)):
      gb = [dram_bytes(order, m, k, n, g, bm, bn, bk, band, programs, l2_bytes, s) / 1e9 for s in (False, True)]
      print(f"| {name} | {order} | {bm}x{bn}x{bk} | {programs} | {gb[0]:.2f} | {gb[1]:.2f} | {floor:.2f} |",
            flush=True)
