"""Pytest set-up: 8 emulated CPU devices (for the pmap/shard_map tests), set before jax initialises."""
import os

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}".strip()
