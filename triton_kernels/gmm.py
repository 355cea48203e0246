"""gmm and masked_gmm kernels: out rows of group g = act(lhs rows of g @ rhs[g] + bias[g]) (+ existing).

Shapes (row-major): lhs (M, K); rhs (G, K, N), or (G, N, K) with TRANSPOSE_RHS; bias (G, N); out and
existing (M, N_OUT); h (M, N), the pre-activation. With ACTIVATION == "swiglu", N = 2 * N_OUT: rhs columns
are [gate | up] and out = silu(gate) * up; every other activation has N == N_OUT.

Two load paths share all tile logic. USE_TMA: lhs and rhs tiles come through host-side tensor descriptors
(Hopper TMA; lhs_desc over lhs (M, K), rhs_desc over rhs viewed as (G, K, HALVES, N_OUT), or
(G, HALVES, N_OUT, K) when transposed, HALVES = N // N_OUT); otherwise masked pointer loads (sm80, ROCm,
strides that break TMA's 16-byte rules), and then lhs_desc/rhs_desc are unused. Stores are masked pointer
stores (a tile may end past its group), or with TMA_STORE (gmm_kernel, USE_TMA only) out's tiles leave through
a device-side descriptor that clips each to its group's rows (common.store_group_tile). Offsets are int64
wherever a product can pass 2^31.
"""
import triton
import triton.language as tl

from jgmm.triton_kernels.common import activation, group_rows_descriptor, store_group_tile, store_tile, tile_coords


@triton.jit
def _load_rhs(rhs_desc, g, half, n0, k0, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TRANSPOSE_RHS: tl.constexpr):
  """The (BLOCK_K, BLOCK_N) dot operand rhs[g, k0:, half * N_OUT + n0:] through the rhs descriptor."""
  if TRANSPOSE_RHS:
    b = rhs_desc.load([g, half, n0, k0]).reshape(BLOCK_N, BLOCK_K).T
  else:
    b = rhs_desc.load([g, k0, half, n0]).reshape(BLOCK_K, BLOCK_N)
  return b


@triton.jit
def gmm_tile(lhs_ptr, rhs_ptr, bias_ptr, existing_ptr, out_ptr, h_ptr, lhs_desc, rhs_desc, out_desc,
             g, row_start, m_g, store_rows, mi, ni,
             K: tl.constexpr, N: tl.constexpr, N_OUT: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             TRANSPOSE_RHS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
             ACTIVATION: tl.constexpr, SAVE_PRE: tl.constexpr, USE_TMA: tl.constexpr, TMA_STORE: tl.constexpr,
             DOT_PRECISION: tl.constexpr):
  """Computes and stores output tile (mi, ni) of group g.

  The group's rows are [row_start, row_start + m_g) of lhs/out; the tile may write rows below
  row_start + store_rows (store_rows >= m_g), and rows in [m_g, store_rows) get zeros. out_desc: with
  TMA_STORE, group_rows_descriptor over out (then row_start + store_rows < 2^31); unused otherwise.
  Pointer path: a 64-bit base pointer per operand tile plus int32 offsets within it (int64 only where a
  tile's offsets could pass 2^31), which keeps the pipelined loop's registers low.
  """
  SWIGLU: tl.constexpr = ACTIVATION == "swiglu"
  OFFSET: tl.constexpr = (tl.int64 if max(BLOCK_M, BLOCK_N) * max(K, N) >= 2**31 or BLOCK_K * N >= 2**31
                          else tl.int32)
  tile_rows = tl.arange(0, BLOCK_M)
  row_mask = mi * BLOCK_M + tile_rows < m_g
  tile_row0 = row_start.to(tl.int64) + mi * BLOCK_M
  n0 = ni * BLOCK_N
  tile_cols = tl.arange(0, BLOCK_N)
  col_mask = n0 + tile_cols < N_OUT
  ks = tl.arange(0, BLOCK_K)
  g64 = tl.cast(g, tl.int64)

  if not USE_TMA:
    a_ptr = lhs_ptr + tile_row0 * K
    a_offsets = tile_rows.to(OFFSET)[:, None] * K + ks[None, :]
    if TRANSPOSE_RHS:  # rhs plane (N, K): element [k, n] at n * K + k
      b_ptr = rhs_ptr + g64 * (K * N) + n0 * K
      b_offsets = tile_cols.to(OFFSET)[None, :] * K + ks[:, None]
      b_step: tl.constexpr = BLOCK_K
      up_offset: tl.constexpr = N_OUT * K
    else:  # rhs plane (K, N): element [k, n] at k * N + n
      b_ptr = rhs_ptr + g64 * (K * N) + n0
      b_offsets = ks.to(OFFSET)[:, None] * N + tile_cols[None, :]
      b_step: tl.constexpr = BLOCK_K * N
      up_offset: tl.constexpr = N_OUT

  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  if SWIGLU:
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k0 in range(0, K, BLOCK_K):
    if K % BLOCK_K == 0:
      k_mask = ks < BLOCK_K
    else:
      k_mask = ks < K - k0
    if USE_TMA:
      a = lhs_desc.load([tile_row0.to(tl.int32), k0])
      b = _load_rhs(rhs_desc, g, 0, n0, k0, BLOCK_N, BLOCK_K, TRANSPOSE_RHS)
    else:
      a = tl.load(a_ptr + a_offsets, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
      b = tl.load(b_ptr + b_offsets, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
    acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if SWIGLU:
      if USE_TMA:
        b_up = _load_rhs(rhs_desc, g, 1, n0, k0, BLOCK_N, BLOCK_K, TRANSPOSE_RHS)
      else:
        b_up = tl.load(b_ptr + up_offset + b_offsets, mask=k_mask[:, None] & col_mask[None, :], other=0.0)
      acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
    if not USE_TMA:
      a_ptr += BLOCK_K
      b_ptr += b_step

  if HAS_BIAS:
    bias_row = bias_ptr + g64 * N + n0 + tile_cols
    acc += tl.load(bias_row, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if SWIGLU:
      acc_up += tl.load(bias_row + N_OUT, mask=col_mask, other=0.0).to(tl.float32)[None, :]

  store_mask = mi * BLOCK_M + tile_rows < store_rows
  if SAVE_PRE:
    store_tile(h_ptr + tile_row0 * N + n0, tile_rows, store_mask, tile_cols, col_mask, N, acc, OFFSET)
    if SWIGLU:
      store_tile(h_ptr + tile_row0 * N + N_OUT + n0, tile_rows, store_mask, tile_cols, col_mask, N, acc_up,
                 OFFSET)
  if SWIGLU:
    y = acc * tl.sigmoid(acc) * acc_up
  else:
    y = activation(acc, ACTIVATION)
  y = tl.where(row_mask[:, None], y, 0.0)
  if ACCUMULATE:
    existing_offsets = tile_rows.to(OFFSET)[:, None] * N_OUT + tile_cols[None, :]
    y += tl.load(existing_ptr + tile_row0 * N_OUT + n0 + existing_offsets,
                 mask=store_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
  if TMA_STORE:
    store_group_tile(out_desc, row_start, store_rows, mi * BLOCK_M, n0, y.to(out_ptr.dtype.element_ty), BLOCK_M,
                     BLOCK_N)
  else:
    store_tile(out_ptr + tile_row0 * N_OUT + n0, tile_rows, store_mask, tile_cols, col_mask, N_OUT, y, OFFSET)


@triton.jit
def _zero_tile(ptr, row0, row_end, n0, row_stride: tl.constexpr, half_offset, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
  """ptr[row0:row_end (at most BLOCK_M rows), half_offset + n0: (below WIDTH)] = 0; row0 int64."""
  OFFSET: tl.constexpr = tl.int64 if BLOCK_M * row_stride >= 2**31 else tl.int32
  rows = tl.arange(0, BLOCK_M)
  cols = tl.arange(0, BLOCK_N)
  store_tile(ptr + row0 * row_stride + half_offset + n0, rows, row0 + rows < row_end, cols, n0 + cols < WIDTH,
             row_stride, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), OFFSET)


@triton.jit
def group_table(bounds_ptr, G: tl.constexpr, G_POW2: tl.constexpr, BLOCK_M: tl.constexpr, N_TILES: tl.constexpr):
  """gmm's register-resident group table from bounds (G + 1,): per group id (G_POW2 lanes, >= G and >= 32:
  geometry.group_table_lanes; lanes past G hold no tiles) its tiles (row tiles x N_TILES) and the tiles of groups
  0..g inclusive; and the number of group tiles."""
  group = tl.arange(0, G_POW2)
  in_table = group < G
  starts = tl.load(bounds_ptr + group, mask=in_table, other=0)
  rows = tl.load(bounds_ptr + group + 1, mask=in_table, other=0) - starts
  group_tiles = tl.cdiv(rows, BLOCK_M) * N_TILES
  tiles_end = tl.cumsum(group_tiles, axis=0)
  return group_tiles, tiles_end, tl.sum(group_tiles, axis=0)


@triton.jit
def group_tile(tile, bounds_ptr, group_tiles, tiles_end, BLOCK_M: tl.constexpr, N_TILES: tl.constexpr,
               GROUP_M: tl.constexpr):
  """(g, first row of g, rows of g, row tile, column tile) of group tile `tile`: g and its first tile are the count
  and the tiles of the groups whose tiles end at or before it (two reductions), its rows two loads of bounds."""
  before = tiles_end <= tile
  g = tl.sum(before.to(tl.int32), axis=0)
  first_tile = tl.sum(tl.where(before, group_tiles, 0), axis=0)
  row_start = tl.load(bounds_ptr + g)
  m_g = tl.load(bounds_ptr + g + 1) - row_start
  mi, ni = tile_coords(tile - first_tile, tl.cdiv(m_g, BLOCK_M), N_TILES, GROUP_M)
  return g, row_start, m_g, mi, ni


@triton.jit
def zero_tile_rows(z, first_row, last_row, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_TILES: tl.constexpr):
  """(first row (int64), end row, first column) of zero tile z: the tiles of rows [0, first_row), then of rows
  [last_row, M) (rows outside every group), N_TILES per row tile."""
  head_tiles = tl.cdiv(first_row, BLOCK_M) * N_TILES
  if z < head_tiles:
    row0 = (z // N_TILES) * BLOCK_M
    row_end = first_row
  else:
    row0 = last_row + ((z - head_tiles) // N_TILES) * BLOCK_M
    row_end = M
  return row0.to(tl.int64), row_end, (z % N_TILES) * BLOCK_N


@triton.jit
def store_zero_tiles(bounds_ptr, M, out_ptr, h_ptr, num_tiles, N: tl.constexpr, N_OUT: tl.constexpr,
                     G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACCUMULATE: tl.constexpr,
                     SAVE_PRE: tl.constexpr):
  """gmm_kernel's zero tiles, numbered from num_tiles (its group tiles') on, in this program's turn: zeros into out
  (not with ACCUMULATE) and h (with SAVE_PRE) on the rows outside every group."""
  N_TILES: tl.constexpr = (N_OUT + BLOCK_N - 1) // BLOCK_N
  HALVES: tl.constexpr = N // N_OUT
  num_programs = tl.num_programs(0)
  pid = tl.program_id(0)
  first_row = tl.load(bounds_ptr)
  last_row = tl.load(bounds_ptr + G)
  head_tiles = tl.cdiv(first_row, BLOCK_M) * N_TILES
  zero_tiles = head_tiles + tl.cdiv(M - last_row, BLOCK_M) * N_TILES
  # This program's first tile number past the group tiles, then every P-th.
  first_zero = pid + tl.cdiv(tl.maximum(num_tiles - pid, 0), num_programs) * num_programs
  for tile in range(first_zero, num_tiles + zero_tiles, num_programs):
    row0, row_end, n0 = zero_tile_rows(tile - num_tiles, first_row, last_row, M, BLOCK_M, BLOCK_N, N_TILES)
    if not ACCUMULATE:
      _zero_tile(out_ptr, row0, row_end, n0, N_OUT, 0, BLOCK_M, BLOCK_N, N_OUT)
    if SAVE_PRE:
      for half in tl.static_range(HALVES):
        _zero_tile(h_ptr, row0, row_end, n0, N, half * N_OUT, BLOCK_M, BLOCK_N, N_OUT)


@triton.jit
def gmm_kernel(lhs_ptr, rhs_ptr, lhs_desc, rhs_desc, rhs_half_desc, bounds_ptr, bias_ptr, existing_ptr, M, out_ptr,
               h_ptr, K: tl.constexpr, N: tl.constexpr, N_OUT: tl.constexpr, G: tl.constexpr, G_POW2: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               TRANSPOSE_RHS: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
               ACTIVATION: tl.constexpr, SAVE_PRE: tl.constexpr, USE_TMA: tl.constexpr, TMA_STORE: tl.constexpr,
               DOT_PRECISION: tl.constexpr, TAIL_SPLIT: tl.constexpr):
  """Grouped matmul over a static tile schedule.

  bounds (G + 1,) int32: rows of group g are [bounds[g], bounds[g + 1]). Tiles are numbered group by group
  (row tiles x column tiles each), then come the zero tiles covering rows [0, bounds[0]) and [bounds[G], M)
  (not with ACCUMULATE, which keeps those rows of existing; h gets zeros there either way). Program p takes
  tiles p, p + P, p + 2P, ... (P programs): one or a few per SM (persistent) or one per tile of the bound
  cdiv(M, BLOCK_M) + G + 1 (non-persistent). Each program keeps the group table (G_POW2 >= G entries) in
  registers and finds a tile's group with two vector reductions (group_tile), so the tile loop and the K loop fuse
  into one loop that the compiler pipelines across tiles (the next tile's loads overlap this tile's
  epilogue). lhs_desc/rhs_desc: see the module docstring. existing_ptr aliases out_ptr when ACCUMULATE;
  bias_ptr/existing_ptr/h_ptr/rhs_half_desc are unused placeholders when their flag is off. TMA_STORE (with
  USE_TMA, M <= 2^30): the group tiles of out are stored through a device-side descriptor (Triton global scratch);
  the zero tiles through pointers either way. TAIL_SPLIT (persistent grids, BLOCK_N >= 128): where the last round
  of group tiles (num_tiles mod P of them) holds at most P / 2, they run after the fused loop as their column
  halves, half (tile, piece) in program 2 (tile - kept) + piece; with USE_TMA their rhs boxes come through
  rhs_half_desc (rhs_desc's view, boxes BLOCK_N / 2 columns wide).
  """
  N_TILES: tl.constexpr = (N_OUT + BLOCK_N - 1) // BLOCK_N
  group_tiles, tiles_end, num_tiles = group_table(bounds_ptr, G, G_POW2, BLOCK_M, N_TILES)

  if TMA_STORE:
    out_desc = group_rows_descriptor(out_ptr, N_OUT, BLOCK_M, BLOCK_N // 2)
  else:
    out_desc = out_ptr

  num_programs = tl.num_programs(0)
  pid = tl.program_id(0)
  kept = num_tiles  # The tiles run whole: all, or those before a last round that runs as halves.
  if TAIL_SPLIT:
    if 2 * (num_tiles % num_programs) <= num_programs:
      kept = num_tiles - num_tiles % num_programs
  for tile in tl.range(pid, kept, num_programs, flatten=True):
    g, row_start, m_g, mi, ni = group_tile(tile, bounds_ptr, group_tiles, tiles_end, BLOCK_M, N_TILES, GROUP_M)
    gmm_tile(lhs_ptr, rhs_ptr, bias_ptr, existing_ptr, out_ptr, h_ptr, lhs_desc, rhs_desc, out_desc,
             g, row_start, m_g, m_g, mi, ni, K, N, N_OUT, BLOCK_M, BLOCK_N, BLOCK_K,
             TRANSPOSE_RHS, HAS_BIAS, ACCUMULATE, ACTIVATION, SAVE_PRE, USE_TMA, TMA_STORE, DOT_PRECISION)
  if TAIL_SPLIT:
    if pid < 2 * (num_tiles - kept):
      g, row_start, m_g, mi, ni = group_tile(kept + pid // 2, bounds_ptr, group_tiles, tiles_end, BLOCK_M,
                                             N_TILES, GROUP_M)
      if TMA_STORE:
        out_half_desc = group_rows_descriptor(out_ptr, N_OUT, BLOCK_M, BLOCK_N // 4)
      else:
        out_half_desc = out_ptr
      gmm_tile(lhs_ptr, rhs_ptr, bias_ptr, existing_ptr, out_ptr, h_ptr, lhs_desc, rhs_half_desc, out_half_desc,
               g, row_start, m_g, m_g, mi, 2 * ni + pid % 2, K, N, N_OUT, BLOCK_M, BLOCK_N // 2, BLOCK_K,
               TRANSPOSE_RHS, HAS_BIAS, ACCUMULATE, ACTIVATION, SAVE_PRE, USE_TMA, TMA_STORE, DOT_PRECISION)

  if SAVE_PRE or not ACCUMULATE:
    store_zero_tiles(bounds_ptr, M, out_ptr, h_ptr, num_tiles, N, N_OUT, G, BLOCK_M, BLOCK_N, ACCUMULATE, SAVE_PRE)


@triton.jit
def masked_gmm_kernel(x_ptr, w_ptr, x_desc, w_desc, masked_m_ptr, MAX_M, out_ptr,
                      K: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr, TRANSPOSE_W: tl.constexpr = True):
  """out[g] (MAX_M, N) = x[g] (MAX_M, K) @ w[g].T (w (G, N, K)) on rows < masked_m[g], zeros below; with
  TRANSPOSE_W False, w is (G, K, N) and out[g] = x[g] @ w[g] (the masked product's input gradient).

  Grid (cdiv(MAX_M, BLOCK_M) * cdiv(N, BLOCK_N), G); masked_m is clipped to [0, MAX_M] by the caller.
  With USE_TMA, x_desc is a descriptor over x viewed as (G * MAX_M, K) and w_desc over w viewed as
  (G, 1, N, K) ((G, K, 1, N) if not TRANSPOSE_W: gmm_kernel's rhs views); otherwise both are unused.
  Tiles wholly past masked_m[g] load nothing and only write zeros.
  """
  N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
  g = tl.program_id(1)
  mi, ni = tile_coords(tl.program_id(0), tl.cdiv(MAX_M, BLOCK_M), N_TILES, GROUP_M)
  m_g = tl.load(masked_m_ptr + g)
  row_start = tl.cast(g, tl.int64) * MAX_M
  if mi * BLOCK_M >= m_g:
    _zero_tile(out_ptr, row_start + mi * BLOCK_M, row_start + MAX_M, ni * BLOCK_N, N, 0, BLOCK_M, BLOCK_N, N)
  else:
    gmm_tile(x_ptr, w_ptr, x_ptr, x_ptr, out_ptr, out_ptr, x_desc, w_desc, out_ptr,
             g, row_start, m_g, MAX_M, mi, ni, K, N, N, BLOCK_M, BLOCK_N, BLOCK_K,
             TRANSPOSE_W, False, False, "none", False, USE_TMA, False, DOT_PRECISION)
