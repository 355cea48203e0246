"""Pytest set-up, before jax initialises: 8 emulated CPU devices (for the pmap/shard_map tests); on a GPU, memory
allocated as needed instead of jax's default 75% up front, so the tests that run jgmm in a subprocess (the demo,
the tuner, train_moe) find GPU memory free."""
import os

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}".strip()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _interpret_nan_max_with_numpy():
  """Triton's interpreter applies a reduction's combine function one element pair at a time (~1 s per 128 x 128
  reduction) unless it is one of Triton's own (max, min, sum: numpy's). The quantisation kernels reduce with
  triton_kernels.quantize._nan_max, a NaN-propagating max, which is numpy's max: taught to the interpreter here, the
  interpreted quantisation tests run tens of times faster (CI's time) on the same kernels, through the same masks,
  casts and stores (test_quantize_pair's test_nan_max_elementwise runs _nan_max itself). A Triton whose interpreter
  is laid out otherwise keeps its element-wise path."""
  import numpy as np
  from triton.runtime import interpreter

  from jgmm.triton_kernels import quantize

  reduce_ops = getattr(interpreter, "ReduceOps", None)
  if reduce_ops is None or not all(hasattr(reduce_ops, name) for name in ("apply_impl", "min_max")):
    return
  apply_impl = reduce_ops.apply_impl

  def apply_impl_with_nan_max(self, input):
    if getattr(self.combine_fn, "fn", None) is quantize._nan_max.fn:
      return self.min_max(input[0], val_reduce_op=np.max)
    return apply_impl(self, input)

  apply_impl_with_nan_max.elementwise = apply_impl  # The interpreter's own, for the test of _nan_max itself.
  reduce_ops.apply_impl = apply_impl_with_nan_max


_interpret_nan_max_with_numpy()


def pytest_addoption(parser):
  parser.addoption("--shard", metavar="I/N", default=None,
                   help="run only every N-th collected test from the I-th (0 <= I < N): a GPU suite longer than one "
                        "device call's limit runs as N calls (scripts/gpu.sh: SHARD=I/N)")


def pytest_collection_modifyitems(config, items):
  """--shard I/N (tests/sharding.py); every xdist worker collects in the same order and keeps the same tests."""
  import pytest

  import sharding

  spec = config.getoption("--shard")
  if spec is None:
    return
  try:
    kept, dropped = sharding.shard(items, spec)
  except ValueError as e:
    raise pytest.UsageError(str(e)) from None
  config.hook.pytest_deselected(items=dropped)
  items[:] = kept
