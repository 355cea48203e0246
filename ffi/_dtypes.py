"""Element types: numpy/JAX dtype -> Triton signature type; python scalar -> Triton scalar type."""

import numpy as np
import triton.language as tl

# Keyed by numpy dtype name (JAX dtypes are numpy/ml_dtypes dtypes).
_TRITON_TYPE = {
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
    "float8_e4m3fnuz": "fp8e4b8",
    "float8_e5m2fnuz": "fp8e5b16",
}


def triton_type(dtype) -> str:
  """Triton's name for an element type, e.g. float32 -> 'fp32', float8_e4m3fn -> 'fp8e4nv'."""
  name = np.dtype(dtype).name
  if name not in _TRITON_TYPE:
    raise TypeError(f"dtype {name} has no Triton equivalent; supported: {sorted(_TRITON_TYPE)}")
  return _TRITON_TYPE[name]


def triton_dtype(dtype) -> tl.dtype:
  return tl.str_to_ty(triton_type(dtype), None)


def scalar_type(value) -> str:
  """Triton type of a python scalar parameter, as Triton's own launcher would choose it."""
  if isinstance(value, bool):
    return "i1"
  if isinstance(value, int):
    if -(2**31) <= value < 2**31:
      return "i32"
    if 2**31 <= value < 2**32:
      return "u32"
    if -(2**63) <= value < 2**63:
      return "i64"
    if 2**63 <= value < 2**64:
      return "u64"
    raise ValueError(f"integer scalar {value} does not fit 64 bits")
  if isinstance(value, float):
    return "fp32"
  raise TypeError(f"scalar parameters must be python bool/int/float, got {type(value).__name__}")
