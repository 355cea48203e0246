"""gmm_fp8_ws_cluster_kernel: gmm_fp8_ws_kernel's block recipe on clusters of 2 CTAs, the rhs tile multicast (Hopper,
Triton >= 3.7).

out rows of group g = (lhs * lhs_scale) @ (rhs[g] * rhs_scale[g]).T with DeepSeek-V3's block scales (lhs 1x128,
rhs 128x128), as gmm_fp8_ws_kernel with LHS_BLOCKS and RHS_BLOCKS (same operands, schedule format, masked layout and
row logic). A cluster of 2 CTAs takes a cluster tile of 128 C rows of one group (a row tile of the schedule; C = 2
or 3 consumers, 128 or 192 rows a CTA) x 128 columns: each K step's rhs tile (the weights, the same for both CTAs)
is copied once, by CTA 0's TMA multicast into both CTAs' shared memory, so a weight panel goes through the L2 once
per 128 C rows of a group instead of once per 64 C (operand bytes per FLOP at C = 2: (128 + 64) / (128 x 128), 25%
fewer than a 128 x 128 tile's; the masked layout's small groups are bound by the L2's bandwidth,
docs/perf-notes.md).

Written at cluster level (Gluon: each layout's cga_layout says how the 2 CTAs share a tensor, gmm_ws_cluster's
SHARED / ROW_SPLIT / COL_SPLIT):
- Consumer H (H < C; one warpgroup in each CTA) owns rows [128 H, 128 H + 128) of the cluster tile, split by
  rows: CTA r computes rows 128 H + 64 r + [0, 64) (a 64 x 128 float32 accumulator a CTA, as gmm_fp8_ws's). Its lhs
  box (128, 128) is ROW_SPLIT (each CTA loads its 64 rows), as are its accumulator and output box.
- The rhs box (128, 128) of the (G * N, K) view, and the rhs block scales' (1, 4) box (the four K blocks from the
  16-byte aligned kk // 4 * 4 of rhs_scale viewed (G * NB, KB4), KB padded to a multiple of 4), are SHARED:
  multicast by CTA 0.
- The lhs block scales, tile-major as gmm_fp8_ws's with tiles of W = 128 P rows (P = C rounded up to a power of 2:
  backend_triton._tile_scales, row t * KB + kb holding K block kb's scales of tile t's W rows) viewed
  (R * KB * P, 128): a (P, 128) box a step, COL_SPLIT, so that CTA r holds consumer H's rows 128 H + 64 r + [0, 64)
  in row H of its half.
- program_id / num_programs count clusters; every scalar is per cluster tile, the same in both CTAs.
- Barriers as gmm_ws_cluster's: `ready[s]` per CTA (the bytes its CTA receives: its lhs rows, the multicast rhs tile
  and scales), `empty[s]` per CTA (its C consumers; its loader waits on it before loading its lhs rows),
  `cluster_empty[s]` in CTA 0 (all 2 C consumers: CTA 0's loader waits on it before multicasting into stage s of
  both CTAs). Consumer H skips its products where its 128 rows hold none of the group (then it waits for and
  releases the stages the other consumer uses); it computes where only CTA 0's 64 of them do (CTA 1's rows are
  never stored).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from jgmm.triton_kernels.gmm_fp8_ws import BLOCK
from jgmm.triton_kernels.gmm_ws import (_tma_load, consumer_tile, expect_boxes, release, release_stages,
                                        row_tiles_in_use, store_half, tile_of)

CONSUMER_M = gl.constexpr(128)  # Rows of a consumer in a cluster tile (64 a CTA).
NUM_WARPS = 4
# A stage's rhs block scales: the (1, 4) box lands in a (1, 32) row (a TMA destination must be 128-byte aligned).
SCALE_ROW = gl.constexpr(32)


def scale_layout(cga_layout):
  """The shared-memory layout of a scale box (float32, unswizzled) shared by the cluster's CTAs as cga_layout says."""
  return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2, cga_layout=cga_layout)


@gluon.jit
def _loader(lhs_desc, rhs_desc, sa_desc, sb_desc, schedule_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty,
            cluster_empty, K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr,
            MASKED_M: gl.constexpr, C: gl.constexpr):
  """Per step of each cluster tile holding rows of its group: waits until the stage's consumers released it (its
  CTA's two on `empty`, and in CTA 0 the cluster's four on cluster_empty), then fills it: the lhs boxes of the
  consumers whose 128 rows hold rows of the group (each CTA its 64 rows of each), the rhs tile and its block scales
  (multicast), the lhs block scales (each CTA its half)."""
  num_n: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  half: gl.constexpr = lhs_desc.nbytes_per_cta
  base: gl.constexpr = rhs_desc.nbytes_per_cta + sa_desc.nbytes_per_cta + sb_desc.nbytes_per_cta
  step = 0
  for t in range(gl.program_id(0), row_tiles_in_use(schedule_ptr, R_MAX, MASKED_M) * num_n, gl.num_programs(0)):
    g, row0, rows, _, ni = tile_of(schedule_ptr, t, num_n, R_MAX, 1, MASKED_M, C * CONSUMER_M)
    if rows > 0:
      for kk in range(k_steps):
        slot = step % S
        phase = ((step // S) & 1) ^ 1
        mbarrier.wait(empty.index(slot), phase)
        mbarrier.wait(cluster_empty.index(slot), phase)
        ready_bar = ready.index(slot)
        expect_boxes(ready_bar, base, half, rows, C, CONSUMER_M)
        for h in gl.static_range(C):
          _tma_load(lhs_desc, [row0 + h * CONSUMER_M, kk * BLOCK], ready_bar, a_bufs.index(C * slot + h),
                    pred=rows > h * CONSUMER_M)
        _tma_load(rhs_desc, [g * N + ni * BLOCK, kk * BLOCK], ready_bar, b_bufs.index(slot), multicast=True)
        _tma_load(sb_desc, [g * num_n + ni, kk // 4 * 4], ready_bar, sb_bufs.index(slot).slice(0, 4, 1),
                  multicast=True)
        _tma_load(sa_desc, [(t // num_n * k_steps + kk) * sa_desc.block_type.shape[0], 0], ready_bar,
                  sa_bufs.index(slot))
        step += 1


@gluon.jit
def _block_scale(sb_buf, kk):
  """The rhs block scale of K block kk from the stage's (1, 4) box (of K blocks kk // 4 * 4 on)."""
  four: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0], cga_layout=[[0]])
  v = sb_buf.reshape([SCALE_ROW]).slice(0, 4).load(four)
  return gl.sum(gl.where(gl.arange(0, 4, layout=four) == kk % 4, v, 0.0), axis=0)


@gluon.jit
def _consumer(schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
              K: gl.constexpr, N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr,
              H: gl.constexpr, MASKED_M: gl.constexpr, C: gl.constexpr):
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK, 32], cga_layout=[[1, 0]])  # Rows.
  ROWS: gl.constexpr = gl.SliceLayout(1, acc_layout)
  num_n: gl.constexpr = (N + BLOCK - 1) // BLOCK
  k_steps: gl.constexpr = (K + BLOCK - 1) // BLOCK
  out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [CONSUMER_M, BLOCK], OUT_LAYOUT)
  rows_in_half = gl.arange(0, CONSUMER_M, layout=ROWS)
  step = 0
  for t in range(gl.program_id(0), row_tiles_in_use(schedule_ptr, R_MAX, MASKED_M) * num_n, gl.num_programs(0)):
    g, row, rows, half_rows, half_store, ni = consumer_tile(schedule_ptr, t, num_n, R_MAX, H, 1, MASKED_M,
                                                            C * CONSUMER_M, CONSUMER_M)
    acc = gl.zeros((CONSUMER_M, BLOCK), dtype=gl.float32, layout=acc_layout)
    if half_rows > 0:
      for kk in range(k_steps):
        slot = (step + kk) % S
        mbarrier.wait(ready.index(slot), ((step + kk) // S) & 1)
        # From zero each step (promotion, gmm_fp8_ws._add_product; `acc` nominally read keeps its update first).
        product = warpgroup_mma(a_bufs.index(C * slot + H), b_bufs.index(slot).permute((1, 0)), acc, use_acc=False,
                                is_async=True)
        sa_buf = sa_bufs.index(slot)
        scale = sa_buf.reshape([sa_buf.shape[0] * CONSUMER_M]).slice(H * CONSUMER_M, CONSUMER_M).load(ROWS)
        scale = scale * _block_scale(sb_bufs.index(slot), kk)
        product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
        acc = acc + product * gl.expand_dims(scale, 1)
        release(empty, cluster_empty, slot, True, 2)
    elif rows > 0:  # The other consumer has rows: keep in step with the stages it consumes.
      release_stages(ready, empty, step, k_steps, S, cluster_empty, 2)
    if rows > 0:
      step += k_steps
    if half_store > 0:
      acc = gl.where(gl.expand_dims(rows_in_half < half_rows, 1), acc, 0.0)
      store_half(out_ptr, out_desc, c_bufs.index(H), acc, row, ni * BLOCK, half_store, N, BLOCK, OUT_LAYOUT,
                 HALF_M=CONSUMER_M)
  tma.store_wait(pendings=0)


@gluon.jit
def gmm_fp8_ws_cluster_kernel(lhs_desc, rhs_desc, sa_desc, sb_desc, schedule_ptr, M, out_ptr, K: gl.constexpr,
                              N: gl.constexpr, R_MAX: gl.constexpr, S: gl.constexpr, OUT_LAYOUT: gl.constexpr,
                              MASKED_M: gl.constexpr, C: gl.constexpr):
  """Launched with num_ctas = 2 and gmm_fp8_ws.MAXNREG[C] registers; C consumers (2 or 3: cluster tiles of 256 or 384
  rows, 128 or 192 a CTA). lhs_desc over lhs (M, K), box (128, 128), cga ROW_SPLIT; rhs_desc over rhs viewed (G * N,
  K), box (128, 128), SHARED; sa_desc over the tile-major lhs block scales viewed (R_MAX * KB * P, 128), box (P, 128)
  (P: C rounded up to a power of 2), COL_SPLIT; sb_desc over rhs_scale viewed (G * NB, KB4), box (1, 4), SHARED
  (scale_layout's); schedule_ptr: gmm_ws's schedule of 128 C-row tiles, or masked_m (G,) where MASKED_M (max_m) > 0;
  out (M, N) through out_ptr and descriptors made here (box (128, 128), OUT_LAYOUT with cga ROW_SPLIT)."""
  gl.static_assert(gl.num_ctas() == 2)
  a_bufs = gl.allocate_shared_memory(lhs_desc.dtype, [C * S] + lhs_desc.block_type.shape, lhs_desc.layout)
  b_bufs = gl.allocate_shared_memory(rhs_desc.dtype, [S] + rhs_desc.block_type.shape, rhs_desc.layout)
  sa_bufs = gl.allocate_shared_memory(gl.float32, [S] + sa_desc.block_type.shape, sa_desc.layout)
  sb_bufs = gl.allocate_shared_memory(gl.float32, [S, 1, SCALE_ROW], sb_desc.layout)
  c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [C, CONSUMER_M, BLOCK], OUT_LAYOUT)
  ready = mbarrier.allocate_mbarrier(batch=S)
  empty = mbarrier.allocate_mbarrier(batch=S)
  cluster_empty = mbarrier.allocate_mbarrier(batch=S, two_ctas=True)
  for s in gl.static_range(S):
    mbarrier.init(ready.index(s), count=1)
    mbarrier.init(empty.index(s), count=C)  # This CTA's consumers.
    mbarrier.init(cluster_empty.index(s), count=C)  # x 2 CTAs (Gluon doubles a two_ctas barrier's count).
  if C == 2:  # (Gluon's partition lists take no tuple built from constexpr layouts: written out twice.)
    gl.warp_specialize([
        (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
                     K, N, R_MAX, S, OUT_LAYOUT, 0, MASKED_M, C)),
        (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
                     K, N, R_MAX, S, OUT_LAYOUT, 1, MASKED_M, C)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, schedule_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready,
                   empty, cluster_empty, K, N, R_MAX, S, MASKED_M, C)),
    ], [4, 1], [240, 24])
  else:
    gl.warp_specialize([
        (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
                     K, N, R_MAX, S, OUT_LAYOUT, 0, MASKED_M, C)),
        (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
                     K, N, R_MAX, S, OUT_LAYOUT, 1, MASKED_M, C)),
        (_consumer, (schedule_ptr, M, out_ptr, a_bufs, b_bufs, c_bufs, sa_bufs, sb_bufs, ready, empty, cluster_empty,
                     K, N, R_MAX, S, OUT_LAYOUT, 2, MASKED_M, C)),
        (_loader, (lhs_desc, rhs_desc, sa_desc, sb_desc, schedule_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready,
                   empty, cluster_empty, K, N, R_MAX, S, MASKED_M, C)),
    ], [4, 4, 1], [160, 160, 24])
