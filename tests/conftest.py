"""Pytest set-up, before jax initialises: 8 emulated CPU devices (for the pmap/shard_map tests); on a GPU, memory
allocated as needed instead of jax's default 75% up front, so the tests that run jgmm in a subprocess (the demo,
the tuner, train_moe) find GPU memory free."""
import os

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}".strip()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
