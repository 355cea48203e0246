"""Kernel configurations: the tile shape and launch parameters of one grouped-GEMM call."""
import dataclasses

_POWERS_OF_TWO = tuple(2**i for i in range(4, 10))  # 16 .. 512
ROWS_192 = 192  # block_m of the warp-specialised FP8 kernel's three-consumer tiles (Config's only other value).


@dataclasses.dataclass(frozen=True)
class Config:
  """Tiling of one op.

  block_m, block_n, block_k: tile of the output rows, output columns and reduction (16..512, powers of 2; block_m
    may also be 192 for FP8 gmm with K-major rhs and FP8 masked_gmm: the warp-specialised FP8 kernel's 192 x 128
    tiles, three consumer warpgroups, where it applies, an error elsewhere; the heuristic's choice on sm_90 above
    256 rows per group, where calls the kernel does not take run 128-row tiles).
  num_warps: warps per program (1, 2, 4, 8 or 16). num_stages: software-pipelining depth (1..8).
  persistent: programs_per_sm programs per SM looping over tiles (True) or one program per tile (False).
  programs_per_sm: the persistent grid's programs per SM (1..4; gmm and tgmm). 2 pays where two programs'
    shared memory and registers fit on one SM together: one's epilogue then overlaps the other's main loop.
  tma: gmm and masked_gmm on Hopper: load tiles through tensor descriptors (TMA) where the shapes allow
    (True), or always use plain pointer loads (False). tgmm_kernel always loads through pointers (measured faster
    than its earlier TMA path; the warp-specialised tgmm loads through TMA).
  tma_store: gmm_kernel with tma (Hopper): each output tile leaves through one TMA store clipped to its group's
    rows by a device-side "ragged" descriptor (common.store_group_tile; in two column halves, so that 4 stages of
    128 x 256 x 64 still fit), instead of masked pointer stores. Experimental (default off) until measured.
  warp_specialized: gmm on Hopper (sm_90): the warp-specialised Gluon kernel (triton_kernels/gmm_ws.py: a TMA
    loader warp and two consumer warpgroups, one program per SM) where it applies: 2-byte inputs and output, no
    bias, activation or existing_out, block_m 128, K a multiple of block_k unless rhs is transposed. num_stages
    is its ring of shared-memory stages; num_warps and programs_per_sm do not apply. Elsewhere gmm_kernel runs
    with this config. FP8 gmm with K-major rhs (transpose_rhs) and FP8 masked_gmm: the warp-specialised FP8
    kernel (triton_kernels/gmm_fp8_ws.py) where block_k is 128 and (block_m, block_n) is (128, 128), (128, 256)
    or (192, 128), K a multiple of 16 and the output's rows 16-byte multiples; the plain FP8 kernel elsewhere. FP8
    tgmm with lhs (K, M) and rhs (N, M): the warp-specialised FP8 tgmm (triton_kernels/tgmm_fp8_ws.py; block_n 128
    or 256, 2 or more stages) where M is a multiple of 16, K and N of 4 and the output's rows 16-byte multiples.
    bf16/fp16 tgmm with lhs (M, K) read transposed (gmm's weight gradient): the warp-specialised tgmm
    (triton_kernels/tgmm_ws.py, 128 x block_n tiles of out, block_k group rows a step; with or without the bias
    gradient) where it has no existing_out, block_m is 128 and K and N are multiples of 8; tgmm_kernel elsewhere.
  band_tiles: the bf16 warp-specialised gmm (warp_specialized): its persistent tile order, in bands of band_tiles
    row tiles with the row tile fastest inside a band (programs running at once then share rhs column panels: on
    an H100, 8 ran mixtral's forward 1.26x faster than row-major), or row-major (1). The warp-specialised tgmms
    (bf16 and FP8): each group's output tiles in bands of band_tiles K tiles, the K tile fastest inside a band
    (programs running at once then share rhs column panels of the group's rows; on an H100, 8 cut the bf16 weight
    gradient's DRAM reads 2.2x on mixtral and 2.9x on dsv3 gate-up and ran it 1.08-1.11x faster), or row-major (1).
    1..64; other kernels ignore it (gmm_kernel's order is bands of 8 row tiles of a group).
  cluster_size: the bf16 warp-specialised gmm: 2 runs it on clusters of two CTAs (triton_kernels/gmm_ws_cluster.py:
    a cluster computes 128 rows x 2 block_n columns, each K step's lhs tile loaded once and multicast into both
    CTAs, 17% fewer operand bytes at block_n 256) where block_n is 128 or 256 and Triton has Gluon's clusters
    (>= 3.7). The warp-specialised FP8 kernel with the block recipe (1x128 lhs, 128x128 rhs scales): 2 runs it on
    clusters of two CTAs (triton_kernels/gmm_fp8_ws_cluster.py: a cluster computes 2 block_m rows of one group x
    128 columns, each K step's rhs tile and block scales loaded once and multicast into both CTAs) where block_m is
    128 or 192, block_n 128 and Triton has Gluon's clusters. The one-CTA kernel runs elsewhere with the same tiles.
    1 or 2; other kernels ignore it.
  tail_split: persistent gmm_kernel and the one-CTA bf16 warp-specialised gmm: where the tile loop's last round
    holds at most half the grid's programs (T tiles on P programs: T mod P <= P / 2, a runtime count), each of its
    tiles runs as its two column halves (block_n / 2 wide) on two programs, so the round ends about half a tile
    sooner (on an H200 the compute-bound forwards and d lhs of mixtral and dsv3 gate-up 1.009-1.038x interleaved,
    1.009-1.023x sustained; qwen3's 0.97-1.00x: docs/perf-notes.md, Session 48). block_n >= 128; other kernels
    ignore it.
  """
  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3
  persistent: bool = True
  programs_per_sm: int = 1
  tma: bool = True
  tma_store: bool = False
  warp_specialized: bool = False
  band_tiles: int = 1
  cluster_size: int = 1
  tail_split: bool = False

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "programs_per_sm", "band_tiles",
                 "cluster_size"):
      if type(getattr(self, name)) is not int:
        raise TypeError(f"config.{name} must be a Python int, got {getattr(self, name)!r}")
    for name in ("persistent", "tma", "tma_store", "warp_specialized", "tail_split"):
      if type(getattr(self, name)) is not bool:
        raise TypeError(f"config.{name} must be a bool, got {getattr(self, name)!r}")
    for name in ("block_m", "block_n", "block_k"):
      if getattr(self, name) not in _POWERS_OF_TWO + ((ROWS_192,) if name == "block_m" else ()):
        raise ValueError(f"config.{name} must be a power of two in {_POWERS_OF_TWO}"
                         f"{' (or 192)' if name == 'block_m' else ''}, got {getattr(self, name)!r}")
    if self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"config.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")
    if not 1 <= self.num_stages <= 8:
      raise ValueError(f"config.num_stages must be an int in [1, 8], got {self.num_stages!r}")
    if not 1 <= self.programs_per_sm <= 4:
      raise ValueError(f"config.programs_per_sm must be an int in [1, 4], got {self.programs_per_sm!r}")
    if not 1 <= self.band_tiles <= 64:
      raise ValueError(f"config.band_tiles must be an int in [1, 64], got {self.band_tiles!r}")
    if self.cluster_size not in (1, 2):
      raise ValueError(f"config.cluster_size must be 1 or 2, got {self.cluster_size!r}")
    if self.tail_split and self.block_n < 128:
      raise ValueError(f"config.tail_split needs block_n >= 128 (halves of 64 columns or more), got block_n "
                       f"{self.block_n}")


def as_config(config, rows_192=False):
  """Returns `config` (a Config, a dict of Config fields, or None) as a Config or None; rows_192: whether the op
  takes block_m = 192 (FP8 gmm with K-major rhs and FP8 masked_gmm), a ValueError else."""
  if isinstance(config, dict):
    unknown = set(config) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
      raise ValueError(f"config has unknown keys {sorted(unknown)}; expected fields of jgmm.Config")
    config = Config(**config)
  elif config is not None and not isinstance(config, Config):
    raise TypeError(f"config must be a jgmm.Config, a dict or None, got {type(config).__name__}")
  if config is not None and config.block_m == ROWS_192 and not rows_192:
    raise ValueError("config.block_m = 192 applies to FP8 gmm with transpose_rhs=True and FP8 masked_gmm only (the "
                     "warp-specialised FP8 kernel's 192-row tiles); use a power of two here")
  return config
