"""Tuned dispatch: which backend and kernel config each call uses, from tables in configs/ and user files.

A GPU reads configs/<arch>-<model>.json where one ships for its model (<model>: the device kind, lowercased, runs
of other characters as "_", e.g. sm90-nvidia_h100_80gb_hbm3.json), else configs/<arch>.json (sm90.json: tuned on
an H200). GPUs of one architecture can want different configs: on an H100 (less memory bandwidth, a smaller L2)
the warp-specialised gmm measured 5-12% slower than gmm_kernel where it is the fastest on an H200.
A shipped table may have an overlay per Triton version, <table>-triton<major>.<minor>.json (e.g.
sm90-nvidia_h100_80gb_hbm3-triton3.6.json), whose entries replace the table's while that Triton runs: where the
choice tuned under the newest Triton (what a pip user gets) runs differently under an older one (a config field the
older one lacks, such as cluster_size before Triton 3.7), the overlay holds the choice tuned under the older one.
JGMM_CONFIG_FILES=/a.json:/b.json merges user tables over it, earlier paths winning (any platform, the Triton
interpreter included). `jgmm-tune` (jgmm/tune.py) writes such files.

A table (JSON, schema 2, one entry per line):
  {"schema": 2, "comment": "optional: where the entries come from", "entries": [ENTRY, ...]}
  ENTRY: the key fields
    op: "gmm" (rhs (G, K, N)), "gmm_t" (rhs (G, N, K)), "tgmm" (out (G, K, N)), "masked" (w (G, N, K); with
      transpose, its d x: w (G, K, N)), or an FP8 op: "gmm_fp8", "gmm_t_fp8", "tgmm_fp8", "masked_fp8";
    in_dtype, out_dtype: "bf16", "fp16", "fp32", "fp8e4m3", "fp8e4m3fnuz", "fp8e5m2";
    rows: rows per group (M / G for gmm and tgmm, expected_m or max_m for masked) rounded up to a power of two;
    k: the reduction size, n: the output columns (gmm/masked: rhs columns, both halves with swiglu; tgmm: out
      (G, K, N)), g: the groups of the call, all exact;
    transpose: the op's transposed operand (gmm_t: true, gmm: false, masked: true for masked_gmm's d x (w read in
      place as (G, K, N)), tgmm: transpose_lhs);
    activation: null or the activation's name; bias: bias (gmm) or bias_grad (tgmm); accumulate: existing_out;
    scale: the FP8 scale recipe's name, null otherwise;
  and the choice: backend ("triton" or "xla"), config (jgmm.Config fields; null with backend "xla"), and what
  was measured, each null where unknown: us (microseconds per call), tflops, max_rel_err (max |out - xla's out|
  over max |xla's out|), gpu (jax's device_kind), jgmm and triton (versions). The shipped entries were migrated
  from schema 1 (keys of power-of-two buckets, configs only): their us, tflops, max_rel_err and jgmm are null.
Meaning of the blocks per op: gmm and masked tile the output (block_m rows x block_n columns) and step block_k
along K; tgmm tiles its (K, N) output with block_m along K and block_n along N and reduces block_k group rows per
step. With activation "swiglu", block_n counts output columns: each tile reads 2 * block_n rhs columns (gate and
up); an entry's config is used as written, the heuristic's block_n is halved.
A damaged or hand-edited file (bad JSON, an unknown or missing field, a wrong type, an invalid tile, a duplicated
key) raises TableError naming the file and the entry.

select() looks a call up at trace time, memoised per key and environment, in this order:
  override: the op's config= argument, else JGMM_CONFIG='{"block_m": 64, ...}' (JSON of Config fields);
  exact: the table entry of the key;
  padded: the entry of the same key with the nearest larger rows bucket the table holds (the call's groups
    padded up to it);
  nearest: the Triton entry with the same op, dtypes and flags nearest by distance() (sum over rows, K, N and G of
    |log2(size / tuned size)|) if at most MAX_DISTANCE; ties go to more rows, then the smaller key (an FP8
    entry's 2-CTA clusters lend as one CTA, padded or nearest: _lent);
  heuristic: heuristic(), shrunk to fit the GPU's shared memory.
An entry choosing backend "xla" makes the op run the portable backend (jgmm.backend_xla) for that key; nearest
neighbours lend only Triton configs (a backend's speed does not carry over to other sizes). An entry measured
with another Triton version applies, and the log says so.
Tables are read once per process and list of files (a file rewritten later is not reread).
JGMM_LOG_CONFIG=1 logs (absl, WARNING level so that it shows) each selection once: key, source, file, choice.
JGMM_CAPTURE_SHAPES=/path appends every key a process selects by padded, nearest or heuristic (untuned) to /path,
one JSON line each, once across processes (capture.py).
"""
import dataclasses
import functools
import importlib.metadata
import json
import math
import os
import re
from importlib import resources
from typing import NamedTuple

from absl import logging

from jgmm import capture
from jgmm.config import ROWS_192, Config, as_config

SCHEMA = 2
OPS = ("gmm", "gmm_t", "tgmm", "masked", "gmm_fp8", "gmm_t_fp8", "tgmm_fp8", "masked_fp8")
FP8_OPS = ("gmm_fp8", "gmm_t_fp8", "tgmm_fp8", "masked_fp8")
# The ops of the warp-specialised FP8 gmm kernel (K-major rhs), the only ones whose configs may have block_m = 192.
FP8_WS_OPS = ("gmm_t_fp8", "masked_fp8")
# The scale recipes of FP8 gmm and masked keys (backend_triton.fp8_recipe names them by the scales' shapes): name ->
# jgmm.quantize's recipes of (lhs or x, rhs or w as (G, N, K)); "channel" is quantize's "row" of (G, N, K) weights.
FP8_RECIPES = {"1x128-128x128": ("1x128", "128x128"), "1x128-channel": ("1x128", "row"),
               "row-128x128": ("row", "128x128"), "row-channel": ("row", "row")}
TGMM_FP8_RECIPE = "128x1"  # tgmm_fp8's one recipe: both operands' scales per 128 rows of M (jgmm.fp8).
FP8_SCALE_BLOCK = 128  # Elements of an FP8 scale block along the reduction (jgmm.quantize.BLOCK).
BACKENDS = ("triton", "xla")
MAX_DISTANCE = 2.0  # e.g. one size 4x off, or two sizes 2x off.
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8e4m3",
                "float8_e4m3fnuz": "fp8e4m3fnuz", "float8_e5m2": "fp8e5m2"}
_ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8e4m3": 1, "fp8e4m3fnuz": 1, "fp8e5m2": 1}
_ENV_CONFIG, _ENV_FILES, _ENV_LOG, _ENV_CAPTURE = ("JGMM_CONFIG", "JGMM_CONFIG_FILES", "JGMM_LOG_CONFIG",
                                                   "JGMM_CAPTURE_SHAPES")
# Shared memory a program may use, by architecture (bytes); unknown architectures get the smallest. sm90: 227 KiB
# less 1 KiB for the mbarriers of TMA pipelines and of the warp-specialised kernels (up to ~350 bytes, measured by
# tests/test_triton_kernels.py's cross-lowering), which shared_memory_bytes leaves out.
_SHARED_MEMORY = {"sm90": 226 * 1024, "sm80": 163 * 1024, "sm89": 99 * 1024, "sm86": 99 * 1024,
                  "gfx942": 64 * 1024, "gfx950": 160 * 1024}
_MIN_SHARED_MEMORY = 64 * 1024


class TableError(ValueError):
  """A table file that does not parse or holds an invalid entry."""


def _pow2_at_least(x):
  return 1 << max(0, math.ceil(x) - 1).bit_length()


def dtype_name(dtype) -> str:
  """The table's short name ("bf16", ...) of a numpy dtype name ("bfloat16", ...)."""
  return _DTYPE_NAMES[str(dtype)]


class Key(NamedTuple):
  """What a table entry is measured for (the fields are the module docstring's)."""
  op: str
  in_dtype: str
  out_dtype: str
  rows: int
  k: int
  n: int
  g: int
  transpose: bool = False
  activation: str | None = None
  bias: bool = False
  accumulate: bool = False
  scale: str | None = None

  def __str__(self):
    flags = [name for name in ("transpose", "bias", "accumulate") if getattr(self, name)]
    flags += [f"{name}={getattr(self, name)}" for name in ("activation", "scale") if getattr(self, name)]
    return "/".join([self.op, f"{self.in_dtype}->{self.out_dtype}", f"r{self.rows}", f"k{self.k}", f"n{self.n}",
                     f"g{self.g}", *flags])

  def shape(self):
    """Everything but the sizes: entries with the same shape() may lend each other configs."""
    return self._replace(rows=0, k=0, n=0, g=0)


def make_key(op: str, in_dtype: str, out_dtype: str, rows_per_group: float, k: int, n: int, g: int,
             **flags) -> Key:
  """The Key of one call: in_dtype/out_dtype numpy dtype names; rows_per_group any positive number (bucketed)."""
  return Key(op, dtype_name(in_dtype), dtype_name(out_dtype), _pow2_at_least(max(rows_per_group, 1)), int(k),
             int(n), int(g), **flags)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One table entry: the key, the choice (backend, config) and what was measured (None where unknown)."""
  key: Key
  backend: str
  config: Config | None
  us: float | None = None
  tflops: float | None = None
  max_rel_err: float | None = None
  gpu: str | None = None
  jgmm: str | None = None
  triton: str | None = None
  file: str | None = dataclasses.field(default=None, compare=False)  # where it was read; not written

  def to_json(self):
    fields = {**self.key._asdict(), "backend": self.backend,
              "config": None if self.config is None else dataclasses.asdict(self.config)}
    return fields | {name: getattr(self, name) for name in _MEASURED}


_MEASURED = ("us", "tflops", "max_rel_err", "gpu", "jgmm", "triton")
_NUMBER, _STRING = (int, float), (str,)
# Field: (types allowed, null allowed).
_FIELDS = {"op": (_STRING, False), "in_dtype": (_STRING, False), "out_dtype": (_STRING, False),
           "rows": ((int,), False), "k": ((int,), False), "n": ((int,), False), "g": ((int,), False),
           "transpose": ((bool,), False), "activation": (_STRING, True), "bias": ((bool,), False),
           "accumulate": ((bool,), False), "scale": (_STRING, True), "backend": (_STRING, False),
           "config": ((dict,), True), "us": (_NUMBER, True), "tflops": (_NUMBER, True),
           "max_rel_err": (_NUMBER, True), "gpu": (_STRING, True), "jgmm": (_STRING, True),
           "triton": (_STRING, True)}


def _parse_entry(fields):
  """Entry of one JSON object; ValueError saying what is wrong."""
  if not isinstance(fields, dict):
    raise ValueError(f"an entry must be a JSON object, got {type(fields).__name__}")
  unknown, missing = sorted(set(fields) - set(_FIELDS)), sorted(set(_FIELDS) - set(fields))
  if unknown or missing:
    raise ValueError(f"unknown fields {unknown}, missing fields {missing}")
  for name, (types, nullable) in _FIELDS.items():
    value = fields[name]
    ok = (value is None and nullable) or (isinstance(value, types) and (bool in types or type(value) is not bool))
    if not ok:
      raise ValueError(f"field {name!r} must be {'/'.join(t.__name__ for t in types)}"
                       f"{' or null' if nullable else ''}, got {value!r}")
  key = Key(**{name: fields[name] for name in Key._fields})
  if key.op not in OPS:
    raise ValueError(f"op must be one of {OPS}, got {key.op!r}")
  for name in ("in_dtype", "out_dtype"):
    if getattr(key, name) not in _ITEMSIZE:
      raise ValueError(f"{name} must be one of {tuple(_ITEMSIZE)}, got {getattr(key, name)!r}")
  if key.rows != _pow2_at_least(key.rows) or min(key.rows, key.k, key.n, key.g) < 1:
    raise ValueError(f"rows must be a power of two and rows, k, n, g positive, got {key.rows}, {key.k}, {key.n}, "
                     f"{key.g}")
  if fields["backend"] not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {fields['backend']!r}")
  if (fields["config"] is None) != (fields["backend"] == "xla"):
    raise ValueError("config must be an object of jgmm.Config fields with backend 'triton', null with 'xla'")
  config = None
  if fields["config"] is not None:
    unknown = sorted(set(fields["config"]) - {f.name for f in dataclasses.fields(Config)})
    if unknown:
      raise ValueError(f"config has unknown fields {unknown}")
    try:
      config = as_config(fields["config"], key.op in FP8_WS_OPS)
    except (TypeError, ValueError) as e:
      raise ValueError(f"invalid config: {e}") from None
  return Entry(key, fields["backend"], config, **{name: fields[name] for name in _MEASURED})


def parse_table(text: str, file: str) -> dict[Key, Entry]:
  """{Key: Entry} of a table's JSON text; TableError naming `file` and the entry where anything is invalid."""
  try:
    table = json.loads(text)
  except json.JSONDecodeError as e:
    raise TableError(f"{file}: not valid JSON: {e}") from None
  if not isinstance(table, dict) or table.get("schema") != SCHEMA:
    raise TableError(f"{file}: expected a JSON object with \"schema\": {SCHEMA} (see jgmm/config_table.py), got "
                     f"schema {table.get('schema') if isinstance(table, dict) else None!r}")
  unknown = sorted(set(table) - {"schema", "comment", "entries"})
  if unknown or not isinstance(table.get("entries"), list):
    raise TableError(f"{file}: expected the fields schema, comment (optional) and entries (a list); unknown: "
                     f"{unknown}")
  entries = {}
  for i, fields in enumerate(table["entries"]):
    try:
      entry = dataclasses.replace(_parse_entry(fields), file=file)
    except ValueError as e:
      name = {k: fields.get(k) for k in ("op", "rows", "k", "n", "g")} if isinstance(fields, dict) else None
      raise TableError(f"{file}: entry {i} {name}: {e}") from None
    if entry.key in entries:
      raise TableError(f"{file}: entry {i}: key {entry.key} appears twice")
    entries[entry.key] = entry
  return entries


def read_table(path: str) -> dict[Key, Entry]:
  """{Key: Entry} of the table file at `path` ({} if there is none)."""
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    return {}
  return parse_table(text, path)


def write_table(path: str, entries, comment: str | None = None) -> None:
  """Writes entries (an iterable of Entry) to `path` atomically (a temporary file, then os.replace): sorted, one
  entry per line (diffs show changed entries)."""
  rows = [json.dumps(e.to_json()) for e in sorted(entries, key=lambda e: str(e.key))]
  head = {"schema": SCHEMA, **({"comment": comment} if comment else {})}
  text = json.dumps(head, indent=1)[:-2] + ',\n "entries": [\n  ' + ",\n  ".join(rows) + "\n ]\n}\n"
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def table_files(arch, device_kind=None):
  """The names of the table files a GPU may read, in order: its model's (if device_kind), then its arch's."""
  model = [f"{arch}-{re.sub(r'[^a-z0-9]+', '_', device_kind.lower()).strip('_')}.json"] if device_kind else []
  return model + [f"{arch}.json"]


def overlay_file(name: str, triton: str) -> str:
  """The name of table `name`'s overlay for Triton version `triton` ("3.6.0": <stem>-triton3.6.json)."""
  return f"{name.removesuffix('.json')}-triton{'.'.join(triton.split('.')[:2])}.json"


def _shipped(name):
  """{Key: Entry} of configs/<name>; FileNotFoundError where configs/ holds none."""
  return parse_table(resources.files("jgmm.configs").joinpath(name).read_text(), f"jgmm/configs/{name}")


@functools.cache
def shipped_table(arch: str | None, device_kind: str | None = None, triton: str | None = None) -> dict[Key, Entry]:
  """{Key: Entry} of the first of table_files(arch, device_kind) that configs/ holds, or {} if none (or no arch),
  with its overlay for Triton version `triton` (overlay_file), where configs/ holds one, over it."""
  for name in table_files(arch, device_kind) if arch else ():
    try:
      table = _shipped(name)
    except FileNotFoundError:
      continue
    if triton:
      try:
        table.update(_shipped(overlay_file(name, triton)))
      except FileNotFoundError:  # No overlay for this Triton: the table as tuned.
        pass
    return table
  return {}


@functools.cache
def _merged_table(arch, device_kind, files):
  """{Key: Entry}: the user files (a ":"-separated list) over the shipped table (with the running Triton's
  overlay), earlier files winning."""
  merged = dict(shipped_table(arch, device_kind, triton_version()))
  for path in reversed([p for p in files.split(":") if p]):
    merged.update(read_table(path))
  return merged


def active_table(arch: str | None, device_kind: str | None = None) -> dict[Key, Entry]:
  """{Key: Entry} that select() reads now: the files of JGMM_CONFIG_FILES over the shipped table."""
  return _merged_table(arch, device_kind, os.environ.get(_ENV_FILES, ""))


def distance(a: Key, b: Key) -> float:
  """Sum over rows, K, N and G of |log2(a's size / b's size)|."""
  return sum(abs(math.log2(getattr(a, f) / getattr(b, f))) for f in ("rows", "k", "n", "g"))


def _tuned(key, table):
  """(source, Entry) of the table's entry for key (exact, padded or nearest), or (None, None)."""
  if key in table:
    return "exact", table[key]
  larger = [e for e in table.values() if e.key._replace(rows=key.rows) == key and e.key.rows > key.rows]
  if larger:
    return "padded", min(larger, key=lambda e: e.key.rows)
  near = [e for e in table.values()
          if e.backend == "triton" and e.key.shape() == key.shape() and distance(e.key, key) <= MAX_DISTANCE]
  if near:
    return "nearest", min(near, key=lambda e: (distance(e.key, key), -e.key.rows, str(e.key)))
  return None, None


class Selection(NamedTuple):
  """The choice for one call: backend "triton" (with config) or "xla" (config None)."""
  backend: str
  config: Config | None
  source: str  # "override", "exact", "padded", "nearest" or "heuristic"
  file: str | None  # the table file (or "JGMM_CONFIG") it came from
  entry: Entry | None  # the table entry, for exact, padded and nearest


def select(key: Key, *, arch: str | None, device_kind: str | None = None,
           override: Config | None = None) -> Selection:
  """The Selection for a call of `key` (see the module docstring) on a GPU of `arch` ("sm90", ...; None under the
  interpreter: user files and the heuristic only) and model `device_kind` (jax.Device.device_kind).
  override: the op's config= (a Config), which wins over everything."""
  env = tuple(os.environ.get(name, "") for name in (_ENV_CONFIG, _ENV_FILES, _ENV_LOG, _ENV_CAPTURE))
  return _select(key, arch, device_kind, override, env)


@functools.cache
def _select(key, arch, device_kind, override, env):
  config_env, files, log, capture_path = env
  if override is not None:
    selection = Selection("triton", override, "override", None, None)
  elif config_env:
    selection = Selection("triton", _env_config(config_env), "override", _ENV_CONFIG, None)
  else:
    source, entry = _tuned(key, _merged_table(arch, device_kind, files))
    if entry is None:
      selection = Selection("triton", heuristic_config(key, arch), "heuristic", None, None)
    else:
      selection = Selection(entry.backend, _lent(entry.config, key, source), source, entry.file, entry)
  if log not in ("", "0"):
    _log(key, selection)
  if capture_path and selection.source in ("padded", "nearest", "heuristic"):
    capture.append(capture_path, key._asdict())
  return selection


def _lent(config, key, source):
  """An entry's config as its source gives it to key: an FP8 entry's clusters (cluster_size 2) to its own key only,
  its neighbours (padded, nearest) getting the same tiles on one CTA, the kernel Triton 3.6 runs for the entry (a
  cluster tile of 2 block_m rows of one group pads small groups: 1.4x slower on masked 32 x 20, docs/perf-notes.md
  Session 36)."""
  if config is not None and config.cluster_size == 2 and key.op in FP8_OPS and source != "exact":
    return dataclasses.replace(config, cluster_size=1)
  return config


def _env_config(text):
  try:
    fields = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{_ENV_CONFIG} must be a JSON object of jgmm.Config fields, got {text!r}: {e}") from e
  if not isinstance(fields, dict):
    raise ValueError(f"{_ENV_CONFIG} must be a JSON object of jgmm.Config fields, got {text!r}")
  return as_config(fields)  # For every kernel call: no block_m = 192 (the FP8 ws kernel's only).


@functools.cache
def triton_version():
  try:
    return importlib.metadata.version("triton")
  except importlib.metadata.PackageNotFoundError:
    return None


def _log(key, selection):
  choice = "backend xla" if selection.backend == "xla" else f"{selection.config}"
  note = ""
  entry = selection.entry
  if entry is not None and entry.triton and entry.triton != triton_version():
    note = f" (measured with Triton {entry.triton}, running Triton {triton_version()})"
  if selection.source == "nearest":
    note += f" (tuned for {entry.key}, distance {distance(entry.key, key):.2f})"
  logging.warning("jgmm config: %s <- %s%s: %s%s", key, selection.source,
                  f" ({selection.file})" if selection.file else "", choice, note)


def shared_memory_bytes(op, config, in_itemsize, out_itemsize, swiglu=False):
  """Upper bound on the shared memory of a config (Triton 3.6, sm90): every pipeline stage's operand tiles,
  and the epilogue's layout-conversion buffer (one output tile)."""
  lhs_rows = config.block_m * config.block_k
  rhs_cols = (config.block_n * (2 if swiglu and op != "tgmm" else 1)) * config.block_k
  tile = config.block_m * config.block_n * out_itemsize
  return config.num_stages * (lhs_rows + rhs_cols) * in_itemsize + tile


def fits(key: Key, config: Config, arch: str | None) -> bool:
  """Whether config's shared memory (shared_memory_bytes) fits a program's on arch for a call of key."""
  return shared_memory_bytes(key.op, config, _ITEMSIZE[key.in_dtype], _ITEMSIZE[key.out_dtype],
                             key.activation == "swiglu") <= shared_memory_limit(arch)


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


def within_scale_block(config: Config) -> Config:
  """config with block_k at most FP8_SCALE_BLOCK: a K step of an FP8 kernel must stay inside one scale block."""
  return dataclasses.replace(config, block_k=min(config.block_k, FP8_SCALE_BLOCK))


def heuristic(op, dtype, rows_per_group, k, n):
  """A reasonable config from the problem's shape alone, for Hopper-sized shared memory (measured bests
  on an H200 for these buckets: see docs/perf-notes.md). dtype: the inputs' numpy dtype name."""
  if op.endswith("_fp8"):  # K steps of one 128-wide scale block; tiles of Hopper's FP8 wgmma (64-row warpgroups).
    if op == "tgmm_fp8":  # Warp-specialised where the operands are M-contiguous (fp8 tgmm's fast layout).
      config = Config(block_m=128, block_n=256 if n > 128 else 128, block_k=128, num_warps=8,
                      num_stages=3 if n > 128 else 4, tma=False, warp_specialized=True)
    elif op in FP8_WS_OPS:  # K-major rhs: Hopper's warp-specialised kernel (faster at any rows).
      config = Config(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, tma=False,
                      warp_specialized=True)
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


def heuristic_config(key: Key, arch: str | None) -> Config:
  """heuristic() for key (what select() gives an untuned key); with swiglu, block_n counts output columns (each
  tile reads 2 * block_n rhs columns), so it is halved; then shrunk to fit the shared memory of arch."""
  in_dtype = {short: name for name, short in _DTYPE_NAMES.items()}[key.in_dtype]
  config = heuristic(key.op, in_dtype, key.rows, key.k, key.n)
  if key.op in FP8_WS_OPS and arch == "sm90" and key.rows > 256:
    # 192 x 128 tiles, three consumer warpgroups (H100, both recipes, Triton 3.6 and 3.9): +4-25% over 128-row tiles
    # at 512 to 8192 rows per group (contiguous and masked); at ~192 rows per group, 192-row tiles cover groups of
    # 193-256 rows twice as 128-row ones do (-18% on 32 groups of ~192). Where the warp-specialised kernel does not
    # take a call, backend_triton runs 128-row tiles. (heuristic's 128 columns and 4 stages stay.)
    config = dataclasses.replace(config, block_m=ROWS_192)
  elif key.op == "tgmm_fp8" and arch == "sm90" and not key.transpose:
    # lhs (K, M): the warp-specialised kernel's layout. 128 wide, two products in flight per consumer (on the recipe's
    # group-aligned operands +18-23% over 256 wide, within noise elsewhere: docs/perf-notes.md "Session 21"), 5
    # stages where a 2-byte output leaves room (geometry.tgmm_fp8_ws_ok; +2-5%), else 4.
    config = dataclasses.replace(config, block_n=128, num_stages=5 if _ITEMSIZE[key.out_dtype] <= 2 else 4)
  elif key.op == "tgmm" and arch == "sm90" and key.transpose and key.rows >= 256:
    # lhs (M, K) read transposed, gmm's weight gradient: the warp-specialised tgmm (H100, Triton 3.6: 1.04-1.13x
    # tgmm_kernel on the bench's cases at these tiles, 1.09x at 256 rows per group, the fewest measured;
    # docs/perf-notes.md "Session 26"). tgmm_kernel runs the same tiles where it does not take a call (float32, a
    # bias gradient, existing_out). From 1024 rows per group, its tiles in bands of 8 K tiles (H100: 1.08-1.11x
    # row-major on the bench's three compute-bound cases, 2.2-2.9x fewer DRAM bytes; 0.99x at 256 rows per group:
    # docs/perf-notes.md "Session 39").
    config = dataclasses.replace(config, warp_specialized=True, band_tiles=8 if key.rows >= 1024 else 1)
  elif key.op in FP8_WS_OPS and key.scale == "row-channel" and key.n > 128 and _wide_fp8_waves(key) >= 4:
    # Row and channel scales apply once, in the epilogue: 256-wide tiles read 25% fewer bytes per FLOP (H100:
    # +5-14% on contiguous dsv3 shapes, +8% on 32 groups of ~192 rows, -5 to -11% on one group of 1024 rows, whose
    # 128 or 224 wide tiles fill under two waves). Block scales at 256 wide spill (docs/perf-notes.md). Not where
    # N <= 128: a tile's right half would hold no column of out (computed, never stored).
    config = dataclasses.replace(config, block_n=256, num_stages=3)
  swiglu = key.activation == "swiglu"
  if swiglu:
    config = dataclasses.replace(config, block_n=max(16, config.block_n // 2))
  return _fit_shared_memory(key.op, config, arch, _ITEMSIZE[key.in_dtype], _ITEMSIZE[key.out_dtype], swiglu)


def _wide_fp8_waves(key: Key) -> float:
  """Waves of gmm_fp8_ws_kernel's 128 x 256 tiles over an SM90 GPU's 132 SMs for key (rows per group bucketed)."""
  return key.g * -(-key.rows // 128) * -(-key.n // 256) / 132


def is_heuristic(entry: Entry, arch: str | None) -> bool:
  """Whether entry chooses what the heuristic would (Triton with heuristic_config) on arch."""
  return entry.backend == "triton" and entry.config == heuristic_config(entry.key, arch)
