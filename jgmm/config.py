"""Kernel configurations: the tile shape and launch parameters of one grouped-GEMM call."""
import dataclasses

_POWERS_OF_TWO = tuple(2**i for i in range(4, 10))  # 16 .. 512


@dataclasses.dataclass(frozen=True)
class Config:
  """Tiling of one op.

  block_m, block_n, block_k: tile of the output rows, output columns and reduction (16..512, powers of 2).
  num_warps: warps per program (1, 2, 4, 8 or 16). num_stages: software-pipelining depth (1..8).
  persistent: one program per SM looping over tiles (True) or one program per tile (False).
  """
  block_m: int = 128
  block_n: int = 128
  block_k: int = 64
  num_warps: int = 4
  num_stages: int = 3
  persistent: bool = True

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_k"):
      value = getattr(self, name)
      if type(value) is not int or value not in _POWERS_OF_TWO:
        raise ValueError(f"config.{name} must be a power of two in {_POWERS_OF_TWO}, got {value!r}")
    if type(self.num_warps) is not int or self.num_warps not in (1, 2, 4, 8, 16):
      raise ValueError(f"config.num_warps must be one of 1, 2, 4, 8, 16, got {self.num_warps!r}")
    if type(self.num_stages) is not int or not 1 <= self.num_stages <= 8:
      raise ValueError(f"config.num_stages must be an int in [1, 8], got {self.num_stages!r}")
    if type(self.persistent) is not bool:
      raise ValueError(f"config.persistent must be a bool, got {self.persistent!r}")


def as_config(config):
  """Returns `config` (a Config, a dict of Config fields, or None) as a Config or None."""
  if config is None or isinstance(config, Config):
    return config
  if isinstance(config, dict):
    unknown = set(config) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
      raise ValueError(f"config has unknown keys {sorted(unknown)}; expected fields of jgmm.Config")
    return Config(**config)
  raise TypeError(f"config must be a jgmm.Config, a dict or None, got {type(config).__name__}")
