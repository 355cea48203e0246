"""Kernel configs: the tuned tables in configs/, a heuristic fallback, and the JGMM_CONFIG override.

A GPU reads configs/<arch>-<model>.json where one was tuned on its model (<model>: the device kind, lowercased, runs
of other characters as "_", e.g. sm90-nvidia_h100_80gb_hbm3.json), else configs/<arch>.json (sm90.json: tuned on
an H200). GPUs of one architecture can want different configs: on an H100 (less memory bandwidth, a smaller L2)
the warp-specialised gmm measured 5-12% slower than gmm_kernel where it is the fastest on an H200.

Table keys are "<op>/<dtype>/r<rows per group>/k<K>/n<N>", each size rounded up to a power of two:
  op: "gmm" (rhs (G, K, N)), "gmm_t" (rhs (G, N, K)), "tgmm" (out (G, K, N)), "masked" (w (G, N, K)), and the
    FP8 ops with scales (jgmm.fp8) "gmm_fp8", "masked_fp8", "tgmm_fp8" (block_k <= 128: one scale block per step);
  dtype: the input element type, "bf16", "fp16", "fp32", "fp8e4m3" (float8_e4m3fn) or "fp8e4m3fnuz";
  rows per group: M / G for gmm and tgmm, expected_m (or max_m) for masked.
Values are Config fields. Meaning of the blocks per op: gmm and masked tile the output (block_m rows x
block_n columns) and step block_k along K; tgmm tiles its (K, N) output with block_m along K and block_n
along N and reduces block_k group rows per step. With activation="swiglu", block_n counts output columns:
each tile reads 2 * block_n rhs columns (gate and up), so the lookup halves the block_n it finds.

JGMM_CONFIG='{"block_m": 64, ...}' (JSON of Config fields) overrides every looked-up config, for tuning.
"""
import dataclasses
import functools
import json
import os
import re
from importlib import resources

from jgmm.config import Config

_ENV = "JGMM_CONFIG"
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8e4m3",
                "float8_e4m3fnuz": "fp8e4m3fnuz"}
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1}
FP8_OPS = ("gmm_fp8", "masked_fp8", "tgmm_fp8")
# Shared memory a program may use, by architecture (bytes); unknown architectures get the smallest.
_SHARED_MEMORY = {"sm90": 227 * 1024, "sm80": 163 * 1024, "sm89": 99 * 1024, "sm86": 99 * 1024,
                  "gfx942": 64 * 1024, "gfx950": 160 * 1024}
_MIN_SHARED_MEMORY = 64 * 1024


def _pow2_at_least(x):
  return 1 << max(0, int(x) - 1).bit_length()


def table_key(op, dtype, rows_per_group, k, n):
  return (f"{op}/{_DTYPE_NAMES[dtype]}/r{_pow2_at_least(max(rows_per_group, 1))}/k{_pow2_at_least(k)}"
          f"/n{_pow2_at_least(n)}")


def table_files(arch, device_kind=None):
  """The names of the table files a GPU may read, in order: its model's (if device_kind), then its arch's."""
  model = [f"{arch}-{re.sub(r'[^a-z0-9]+', '_', device_kind.lower()).strip('_')}.json"] if device_kind else []
  return model + [f"{arch}.json"]


@functools.cache
def _table(arch, device_kind=None):
  """{key: Config} of the first of table_files(arch, device_kind) that configs/ holds, or {} if none."""
  for name in table_files(arch, device_kind):
    try:
      text = resources.files("jgmm.configs").joinpath(name).read_text()
    except FileNotFoundError:
      continue
    return {key: Config(**fields) for key, fields in json.loads(text)["entries"].items()}
  return {}


def shared_memory_bytes(op, config, in_itemsize, out_itemsize, swiglu=False):
  """Upper bound on the shared memory of a config (Triton 3.6, sm90): every pipeline stage's operand tiles,
  and the epilogue's layout-conversion buffer (one output tile)."""
  lhs_rows = config.block_m * config.block_k
  rhs_cols = (config.block_n * (2 if swiglu and op != "tgmm" else 1)) * config.block_k
  tile = config.block_m * config.block_n * out_itemsize
  return config.num_stages * (lhs_rows + rhs_cols) * in_itemsize + tile


def shared_memory_limit(arch):
  """Bytes of shared memory one program may use on `arch` (the smallest known for an unknown one)."""
  return _SHARED_MEMORY.get(arch, _MIN_SHARED_MEMORY)


def _fit_shared_memory(op, config, arch, in_itemsize, out_itemsize, swiglu):
  """Shrinks a heuristic config until it fits the shared memory: fewer pipeline stages (down to 2), then
  block_k down to 32, block_n and block_m down to 64, block_k down to 16."""
  limit = shared_memory_limit(arch)
  steps = (("num_stages", 2), ("block_k", 32), ("block_n", 64), ("block_m", 64), ("block_k", 16))
  while shared_memory_bytes(op, config, in_itemsize, out_itemsize, swiglu) > limit:
    for field, floor in steps:
      value = getattr(config, field)
      if value > floor:
        config = dataclasses.replace(config, **{field: value - 1 if field == "num_stages" else value // 2})
        break
    else:
      break
  return config


def heuristic(op, dtype, rows_per_group, k, n):
  """A reasonable config from the problem's shape alone, for Hopper-sized shared memory (measured bests
  on an H200 for these buckets: see docs/perf-notes.md)."""
  if op in FP8_OPS:  # K steps of one 128-wide scale block; tiles of Hopper's FP8 wgmma (64-row warpgroup tiles).
    if op == "tgmm_fp8":
      config = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, tma=False)
    elif rows_per_group <= 64:
      config = Config(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=5, tma=False)
    else:
      config = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, tma=False)
  elif op == "tgmm":
    config = Config(block_m=128, block_n=128 if n <= 128 else 256, block_k=16 if rows_per_group <= 32 else 64,
                    num_warps=8, num_stages=3, tma=False)  # tgmm loads through pointers either way.
  elif rows_per_group <= 16:
    config = Config(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=5)
  elif rows_per_group <= 32:
    config = Config(block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=4)
  elif rows_per_group <= 96:
    config = Config(block_m=64, block_n=128 if n <= 2048 else 256, block_k=64, num_warps=4, num_stages=4)
  elif op == "gmm" and k <= 2048:
    # Short reductions: two programs per SM, so one's epilogue overlaps the other's main loop (measured on
    # an H200: -7% at K = 2048 with 1024 rows per group, -12% with 256; +9% at K = 4096).
    config = Config(block_m=64, block_n=256, block_k=32, num_warps=4, num_stages=4, programs_per_sm=2)
  else:
    config = Config(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
  if dtype == "float32":  # Twice the bytes per element: half the reduction step, at most 128 columns.
    config = dataclasses.replace(config, block_k=max(16, config.block_k // 2), block_n=min(128, config.block_n))
  return config


def lookup(op, dtype, rows_per_group, k, n, *, arch, out_dtype, swiglu=False, device_kind=None):
  """The config for one call: JGMM_CONFIG, else the tuned table entry, else the heuristic.

  op: "gmm", "gmm_t", "tgmm" or "masked"; dtype/out_dtype: numpy dtype names of the inputs and the output;
  arch: e.g. "sm90" (None under the interpreter: heuristic only); n: rhs columns (both swiglu halves);
  device_kind: the GPU's model as jax names it (jax.Device.device_kind), which picks its own table if one ships.
  """
  override = os.environ.get(_ENV)
  if override:
    try:
      fields = json.loads(override)
    except json.JSONDecodeError as e:
      raise ValueError(f"{_ENV} must be a JSON object of jgmm.Config fields, got {override!r}: {e}") from e
    if not isinstance(fields, dict):
      raise ValueError(f"{_ENV} must be a JSON object of jgmm.Config fields, got {override!r}")
    return Config(**fields)
  config = _table(arch, device_kind).get(table_key(op, dtype, rows_per_group, k, n)) if arch else None
  measured = config is not None and out_dtype == dtype  # Table entries were measured with out = in dtype.
  if config is None:
    config = heuristic(op, dtype, rows_per_group, k, n)
  if swiglu:  # The same shared memory and registers: two column blocks per tile.
    config = dataclasses.replace(config, block_n=max(16, config.block_n // 2))
  if measured:
    return config
  return _fit_shared_memory(op, config, arch, _ITEMSIZE[dtype], _ITEMSIZE[out_dtype], swiglu)
