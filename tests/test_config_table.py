"""Config tables: lookup order (override, exact, padded, nearest, heuristic), merging of user files, logging,
capture from several processes, damaged files, and a table's "xla" choice reaching the ops."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import jgmm
from jgmm import capture, config_table, ffi, oracle, tune
from jgmm.config import Config
from jgmm.triton_kernels import geometry

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
A = Config(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=2)
B = Config(block_m=32, block_n=128, block_k=64, num_warps=4, num_stages=3)
C = Config(block_m=16, block_n=32, block_k=16, num_warps=2, num_stages=4)


def key(rows=64, k=256, n=512, g=8, op="gmm", **flags):
  return config_table.make_key(op, "bfloat16", "bfloat16", rows, k, n, g, transpose=op == "gmm_t", **flags)


def entry(k, config=A, backend="triton", **measured):
  return config_table.Entry(k, backend, None if backend == "xla" else config, **measured)


class TableTestBase(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir)
    env = {name: "" for name in ("JGMM_CONFIG", "JGMM_CONFIG_FILES", "JGMM_LOG_CONFIG", "JGMM_CAPTURE_SHAPES")}
    self.enter_context(mock.patch.dict(os.environ, env))

  def table(self, name, *entries):
    """Writes a user table file; returns its path."""
    path = os.path.join(self.dir, name)
    config_table.write_table(path, entries)
    return path

  def use(self, *paths):
    os.environ["JGMM_CONFIG_FILES"] = ":".join(paths)


class LookupTest(TableTestBase):

  def select(self, k, arch=None, **kwargs):
    return config_table.select(k, arch=arch, **kwargs)

  def test_order_exact_padded_nearest_heuristic(self):
    self.use(self.table("t.json", entry(key(rows=64), A), entry(key(rows=256), B), entry(key(rows=1024), C)))
    s = self.select(key(rows=64))
    self.assertEqual((s.source, s.config), ("exact", A))
    self.assertEqual(s.file, os.path.join(self.dir, "t.json"))
    # 100 rows per group: bucket 128, padded up to the next bucket the table holds (256), not 1024.
    self.assertEqual(self.select(key(rows=100))[:3], ("triton", B, "padded"))
    # No larger bucket: the nearest (1024 is 2^1 away in rows, 64 is 2^5 away).
    self.assertEqual(self.select(key(rows=2048))[:3], ("triton", C, "nearest"))
    # K 2x off (distance 1) and N 2x off: nearest; K 8x off (distance 3 > MAX_DISTANCE): the heuristic.
    self.assertEqual(self.select(key(rows=64, k=512, n=1024))[:3], ("triton", A, "nearest"))
    far = self.select(key(rows=64, k=2048))
    self.assertEqual((far.source, far.config), ("heuristic", config_table.heuristic_config(key(rows=64, k=2048),
                                                                                            None)))

  def test_nearest_needs_the_same_dtypes_and_flags_and_is_documented_distance(self):
    self.use(self.table("t.json", entry(key(k=256), A), entry(key(k=256, n=256, g=16), B),
                        entry(key(k=300), C, backend="xla")))
    # The xla entry (k=300) is nearest, but backends do not carry over: the nearest Triton entry does.
    self.assertEqual(self.select(key(k=290))[:3], ("triton", A, "nearest"))
    self.assertAlmostEqual(config_table.distance(key(k=256, n=256, g=16), key(k=512)), 1 + 1 + 1)
    for other in (key(k=290, activation="swiglu"), key(k=290, bias=True), key(k=290, accumulate=True),
                  key(k=290, op="gmm_t"), config_table.make_key("gmm", "float16", "float16", 64, 290, 512, 8),
                  config_table.make_key("gmm", "bfloat16", "float32", 64, 290, 512, 8)):
      self.assertEqual(self.select(other).source, "heuristic", other)

  def test_fp8_clusters_apply_to_their_own_key_and_lend_as_one_cta(self):
    """An FP8 entry with cluster_size 2 runs its clusters on its key only; padded and nearest keys get its tiles on
    one CTA (a cluster tile pads small groups). A bf16 entry's clusters lend as they are."""
    cluster = dataclasses.replace(A, block_m=128, block_n=128, block_k=128, warp_specialized=True, cluster_size=2)
    fp8 = lambda rows, k=7168: config_table.make_key("masked_fp8", "float8_e4m3fn", "bfloat16", rows, k, 4096, 32,
                                                   scale="1x128-128x128")
    self.use(self.table("t.json", entry(fp8(256), cluster), entry(key(rows=256), cluster)))
    self.assertEqual(self.select(fp8(256))[:3], ("triton", cluster, "exact"))
    one_cta = dataclasses.replace(cluster, cluster_size=1)
    self.assertEqual(self.select(fp8(32))[:3], ("triton", one_cta, "padded"))
    self.assertEqual(self.select(fp8(512))[:3], ("triton", one_cta, "nearest"))
    self.assertEqual(self.select(fp8(256, k=4096))[:3], ("triton", one_cta, "nearest"))
    self.assertEqual(self.select(key(rows=32))[:3], ("triton", cluster, "padded"))

  def test_xla_entries_apply_exactly_and_padded(self):
    self.use(self.table("t.json", entry(key(rows=256), backend="xla")))
    self.assertEqual(self.select(key(rows=256))[:3], ("xla", None, "exact"))
    self.assertEqual(self.select(key(rows=16))[:3], ("xla", None, "padded"))

  def test_override_wins_over_everything(self):
    self.use(self.table("t.json", entry(key(), A)))
    self.assertEqual(self.select(key(), override=B)[:4], ("triton", B, "override", None))
    os.environ["JGMM_CONFIG"] = json.dumps(dataclasses.asdict(C))
    self.assertEqual(self.select(key())[:4], ("triton", C, "override", "JGMM_CONFIG"))
    self.assertEqual(self.select(key(), override=B).config, B)  # config= beats JGMM_CONFIG.
    os.environ["JGMM_CONFIG"] = "[1]"
    with self.assertRaisesRegex(ValueError, "JGMM_CONFIG must be a JSON object"):
      self.select(key())
    os.environ["JGMM_CONFIG"] = json.dumps({"block_m": 192})  # For every kernel: not the FP8 ws kernel's rows.
    with self.assertRaisesRegex(ValueError, "config.block_m = 192 applies to FP8 gmm"):
      self.select(key())

  def test_earlier_files_win_and_user_files_beat_the_shipped_table(self):
    shipped = config_table.shipped_table("sm90")
    k, shipped_entry = next(iter(shipped.items()))
    mine = next(c for c in (A, B) if c != shipped_entry.config)
    first = self.table("first.json", entry(key(), A), entry(k, mine))
    second = self.table("second.json", entry(key(), B), entry(key(rows=256), C))
    self.use(first, second)
    self.assertEqual(self.select(key(), "sm90")[1:4], (A, "exact", first))
    self.assertEqual(self.select(key(rows=256), "sm90")[1:4], (C, "exact", second))
    self.assertEqual(self.select(k, "sm90")[1:4], (mine, "exact", first))
    self.use(second, first)
    self.assertEqual(self.select(key(), "sm90")[1:4], (B, "exact", second))
    self.use()
    self.assertEqual(self.select(k, "sm90")[1:4], (shipped_entry.config, "exact", shipped_entry.file))

  def test_heuristic_halves_block_n_for_swiglu_and_fits_shared_memory(self):
    plain, swiglu = self.select(key(rows=1024), "sm90").config, self.select(key(rows=1024, activation="swiglu"),
                                                                             "sm90").config
    self.assertEqual(swiglu.block_n, plain.block_n // 2)
    fp32 = config_table.make_key("gmm", "float32", "float32", 1024, 4096, 4096, 8)
    for arch in ("sm90", "sm86", None):
      config = self.select(fp32, arch).config
      self.assertLessEqual(config_table.shared_memory_bytes("gmm", config, 4, 4),
                           config_table.shared_memory_limit(arch))

  def test_heuristic_takes_192_rows_for_the_fp8_ws_ops_on_sm90_above_256_rows(self):
    for op in ("gmm_t_fp8", "masked_fp8", "tgmm_fp8", "gmm_fp8"):
      for rows, arch, out in ((512, "sm90", "bfloat16"), (8192, "sm90", "float32"), (256, "sm90", "bfloat16"),
                              (8192, "sm80", "bfloat16"), (8192, None, "bfloat16")):
        for scale in ("1x128-128x128", "row-channel"):
          k = config_table.make_key(op, "float8_e4m3fn", out, rows, 7168, 4096, 8, scale=scale)
          config = config_table.heuristic_config(k, arch)
          want = op in config_table.FP8_WS_OPS and arch == "sm90" and rows > 256
          self.assertEqual(config.block_m == 192, want, (k, arch))
          if want:  # Four stages in bf16; float32's 192 x 128 output tile leaves room for three.
            self.assertEqual((config.block_n, config.num_stages), (128, 4 if out == "bfloat16" else 3))
          self.assertLessEqual(config_table.shared_memory_bytes(op, config, 1, 2 if out == "bfloat16" else 4),
                               config_table.shared_memory_limit(arch))

  def test_heuristic_takes_256_wide_row_channel_fp8_tiles_only_past_128_columns(self):
    """Row and channel scales on sm90 at 4+ waves of 128 x 256 tiles: 256 wide where N > 128; at N <= 128 a tile's
    right half would hold no column of out, so 128 wide."""
    for op in ("gmm_t_fp8", "masked_fp8"):
      for n, want in ((4096, 256), (129, 256), (128, 128), (104, 128)):
        k = config_table.make_key(op, "float8_e4m3fn", "bfloat16", 200, 7168, n, 512, scale="row-channel")
        self.assertEqual(config_table.heuristic_config(k, "sm90").block_n, want, k)

  def test_heuristic_takes_the_ws_tgmm_for_the_gmm_backward_layout_on_sm90(self):
    """tgmm with lhs (M, K) read transposed from 256 rows per group on sm90 (measured there): the warp-specialised
    tgmm, at tiles its kernel takes (geometry.tgmm_ws_ok), in bands of 8 K tiles from 1024 rows per group;
    elsewhere tgmm_kernel's config (ws off, row-major)."""
    for arch in ("sm90", "sm80", None):
      for transpose in (False, True):
        for rows, n in ((64, 4096), (128, 4096), (256, 1536), (1024, 14336), (1024, 128)):
          k = config_table.make_key("tgmm", "bfloat16", "bfloat16", rows, 4096, n, 8, transpose=transpose)
          config = config_table.heuristic_config(k, arch)
          want = arch == "sm90" and transpose and rows >= 256
          self.assertEqual(config.warp_specialized, want, (k, arch))
          self.assertEqual(config.band_tiles, 8 if want and rows >= 1024 else 1, (k, arch))
          if want:
            self.assertTrue(geometry.tgmm_ws_ok(8 * rows, 4096, n, 8, config.block_m, config.block_n,
                                                config.block_k, config.num_stages,
                                                config_table.shared_memory_limit(arch)), k)

  def test_heuristic_tgmm_fp8_fits_its_warp_specialized_kernel(self):
    """tgmm_fp8 with lhs (K, M) on sm90: 128-wide tiles, 5 stages with a 2-byte output and 4 with float32, each within
    the shared memory the warp-specialised kernel needs (geometry.tgmm_fp8_ws_ok: a call that did not fit would run
    the plain kernel); lhs (M, K) (the plain kernel's layout) keeps the shape heuristic's tiles."""
    for out, stages in (("bfloat16", 5), ("float16", 5), ("float32", 4)):
      for transpose in (False, True):
        k = config_table.make_key("tgmm_fp8", "float8_e4m3fn", out, 1024, 7168, 4096, 32,
                                  scale=config_table.TGMM_FP8_RECIPE, transpose=transpose)
        config = config_table.heuristic_config(k, "sm90")
        if transpose:  # (its stages as many as fit)
          self.assertEqual(config.block_n, 256, out)
          continue
        self.assertEqual((config.block_n, config.num_stages), (128, stages), out)
        self.assertTrue(geometry.tgmm_fp8_ws_ok(32768, 7168, 4096, 32, jnp.dtype(out).itemsize, config.block_m,
                                                config.block_n, config.block_k, config.num_stages,
                                                config_table.shared_memory_limit("sm90")), out)
        self.assertFalse(geometry.tgmm_fp8_ws_ok(32768, 7168, 4096, 32, jnp.dtype(out).itemsize, config.block_m,
                                                 config.block_n, config.block_k, config.num_stages + 1,
                                                 config_table.shared_memory_limit("sm90")), out)
    # One stage would deadlock the 128-wide tile (it waits for the next step's stage before releasing its own).
    self.assertFalse(geometry.tgmm_fp8_ws_ok(32768, 7168, 4096, 32, 2, 128, 128, 128, 1, 10**6))

  def test_log_once_per_selection_with_source_file_and_triton_version(self):
    path = self.table("t.json", entry(key(), A, triton="0.0.1"))
    self.use(path)
    os.environ["JGMM_LOG_CONFIG"] = "1"
    with self.assertLogs(level="WARNING") as logs:
      self.select(key(), "sm90")
      self.select(key(), "sm90")  # memoised: no second line
      self.select(key(k=4096), "sm90")
    self.assertLen(logs.output, 2)
    self.assertIn(f"jgmm config: {key()} <- exact ({path}): {A}", logs.output[0])
    self.assertIn("measured with Triton 0.0.1, running Triton", logs.output[0])
    self.assertIn(f"{key(k=4096)} <- heuristic: Config(", logs.output[1])
    os.environ["JGMM_LOG_CONFIG"] = ""
    with self.assertNoLogs(level="WARNING"):
      self.select(key(rows=4), "sm90")


class ShippedTableTest(TableTestBase):

  def test_table_files_name_the_model_first(self):
    self.assertEqual(config_table.table_files("sm90", H100), ["sm90-nvidia_h100_80gb_hbm3.json", "sm90.json"])
    self.assertEqual(config_table.table_files("sm90", "NVIDIA H200"), ["sm90-nvidia_h200.json", "sm90.json"])
    self.assertEqual(config_table.table_files("sm80"), ["sm80.json"])

  def test_a_model_with_its_own_table_reads_it(self):
    sm90 = config_table.shipped_table("sm90")
    for kind in (H100, H200):
      own = config_table.shipped_table("sm90", kind, config_table.triton_version())  # What select() reads.
      self.assertLessEqual(set(sm90), set(own))  # A GPU's own table keeps the generic one's keys and adds more.
      differing = [k for k in own if k not in sm90 or own[k] != sm90[k]]
      self.assertNotEmpty(differing, kind)  # Else this test could not tell the tables apart.
      for k in differing:
        choice = config_table.select(k, arch="sm90", device_kind=kind)
        self.assertEqual((choice.source, choice.backend, choice.config), ("exact", own[k].backend, own[k].config))
        self.assertEqual(choice.file, own[k].file)  # The model's table (or its overlay for this Triton).
        self.assertStartsWith(os.path.basename(choice.file),
                              config_table.table_files("sm90", kind)[0].removesuffix(".json"), (kind, k))
        for other in (None, "NVIDIA B200"):  # GPUs without a table of their own read the generic one
          self.assertNotEqual(config_table.select(k, arch="sm90", device_kind=other).file, choice.file, k)

  def test_the_h100_and_h200_tables_cover_the_model_families(self):
    """Every key scripts/tune_tables.sh tunes (the four example families at ep 1 and 8, 1 to 16384 tokens, forward
    and backward ops, masked_gmm's d x products among them: masked keys with transpose) has an exact entry in both
    GPUs' tables, and no masked entry holds a key they do not make (the tuner keyed the d x products without
    transpose until 2026-11-26: those entries were never selected, and are gone)."""
    models = ("mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-20b")
    examples = os.path.join(os.path.dirname(__file__), "..", "examples", "models")
    args = tune.parse_args([f"--model-config={os.path.join(examples, m)}.json" for m in models] + ["--ep", "1,8"])
    keys = {key for key, _ in tune.calls(args)}
    self.assertLen(keys, 540)
    self.assertLen({k for k in keys if k.op == "masked" and k.transpose}, 108)
    for kind in (H100, H200):
      table = config_table.shipped_table("sm90", kind)
      self.assertEqual(sorted(map(str, keys - set(table))), [], kind)
      self.assertEqual([str(k) for k in table if k.op == "masked" and k not in keys], [], kind)

  def test_a_triton_overlay_replaces_its_tables_entries_under_that_triton(self):
    self.assertEqual(config_table.overlay_file("sm90-nvidia_h200.json", "3.6.0"), "sm90-nvidia_h200-triton3.6.json")
    name = config_table.table_files("sm90", H100)[0]
    overlay = config_table.parse_table(
        resources.files("jgmm.configs").joinpath(config_table.overlay_file(name, "3.6.0")).read_text(), "overlay")
    self.assertNotEmpty(overlay)
    base = config_table.shipped_table("sm90", H100)
    self.assertEqual(config_table.shipped_table("sm90", H100, "3.9.0"), base)  # No 3.9 overlay: the table.
    under_36 = config_table.shipped_table("sm90", H100, "3.6.1")
    self.assertEqual(set(under_36), set(base))  # An overlay replaces entries; it adds no key.
    for k, e in overlay.items():
      self.assertEqual(under_36[k].config, e.config, k)
      self.assertNotEqual(under_36[k].config, base[k].config, k)
      self.assertEqual(os.path.basename(under_36[k].file), config_table.overlay_file(name, "3.6.0"), k)
    self.assertEqual({k: e for k, e in under_36.items() if k not in overlay},
                     {k: e for k, e in base.items() if k not in overlay})
    # select() reads the running Triton's overlay (its memos cleared around each patched version).
    self.addCleanup(config_table._select.cache_clear)
    self.addCleanup(config_table._merged_table.cache_clear)
    k = next(iter(overlay))
    for version, want in (("3.6.0", overlay[k].config), ("3.9.0", base[k].config), (None, base[k].config)):
      config_table._merged_table.cache_clear()
      config_table._select.cache_clear()
      with mock.patch.object(config_table, "triton_version", return_value=version):
        self.assertEqual(config_table.select(k, arch="sm90", device_kind=H100).config, want, version)

  def test_every_shipped_table_parses_and_covers_the_bench_cases(self):
    """Every table covers the benchmark's keys; every Triton overlay (<table>-triton<version>.json) parses, holds
    entries measured under its version, only keys of its table, and only choices that differ from the table's."""
    names = [f.name for f in resources.files("jgmm.configs").iterdir() if f.name.endswith(".json")]
    overlays = [n for n in names if "-triton" in n]
    names = [n for n in names if n not in overlays]
    self.assertIn("sm90.json", names)
    for name in overlays:
      base, version = name.removesuffix(".json").rsplit("-triton", 1)
      self.assertEqual(config_table.overlay_file(base + ".json", version), name)
      table = config_table.parse_table(resources.files("jgmm.configs").joinpath(base + ".json").read_text(), base)
      for k, e in config_table.parse_table(resources.files("jgmm.configs").joinpath(name).read_text(), name).items():
        self.assertTrue(e.triton.startswith(version + "."), (name, k, e.triton))
        self.assertIn(k, table, name)
        self.assertNotEqual((e.backend, e.config), (table[k].backend, table[k].config), (name, k))
    cases = [(8192, 4096, 14336, 8), (32768, 2048, 1536, 128), (32768, 7168, 4096, 32), (32768, 2048, 7168, 32),
             (512, 4096, 2048, 64)]  # jgmm/bench.py's CASES, which the shipped entries were tuned on
    for name in names:
      entries = config_table.parse_table(resources.files("jgmm.configs").joinpath(name).read_text(), name)
      for m, k, n, g in cases:
        for op, kk, nn in (("gmm", k, n), ("gmm_t", n, k), ("tgmm", k, n)):
          want = config_table.make_key(op, "bfloat16", "bfloat16", m / g, kk, nn, g, transpose=op != "gmm")
          self.assertIn(want, entries, name)


class DamagedFileTest(TableTestBase):

  def good(self):
    return entry(key(), A, us=1.5).to_json()

  def assert_error(self, table, *patterns):
    path = os.path.join(self.dir, "bad.json")
    with open(path, "w") as f:
      f.write(table if isinstance(table, str) else json.dumps(table))
    self.use(path)
    for pattern in (path, *patterns):
      with self.assertRaisesRegex(config_table.TableError, pattern):
        config_table.select(key(rows=8, k=17), arch=None)

  def test_errors_name_the_file_the_entry_and_the_problem(self):
    table = lambda *entries: {"schema": 2, "entries": [self.good(), *entries]}
    self.assert_error('{"schema": 2, "entries": [', "not valid JSON")
    self.assert_error({"entries": []}, "schema")
    self.assert_error({"schema": 1, "entries": {}}, "schema")
    self.assert_error({"schema": 2, "entries": [], "extra": 1}, r"unknown: \['extra'\]")
    self.assert_error(table({**self.good(), "rows": 128, "block_m": 64}), r"entry 1 .*unknown fields \['block_m'\]")
    self.assert_error(table({**self.good(), "k": "256"}), r"entry 1 .*field 'k' must be int, got '256'")
    self.assert_error(table({**self.good(), "transpose": 0}), r"entry 1 .*'transpose' must be bool")
    self.assert_error(table({**self.good(), "us": True}), r"entry 1 .*'us' must be int/float or null")
    self.assert_error(table({**self.good(), "rows": 100}), r"entry 1 .*rows must be a power of two")
    self.assert_error(table({**self.good(), "op": "gemm"}), r"entry 1 .*op must be one of")
    self.assert_error(table({**self.good(), "in_dtype": "bfloat16"}), r"entry 1 .*in_dtype must be one of")
    self.assert_error(table({**self.good(), "backend": "cuda"}), r"entry 1 .*backend must be one of")
    self.assert_error(table({**self.good(), "backend": "xla"}), r"entry 1 .*config must be .* null with 'xla'")
    bad_tile = {**self.good(), "rows": 128, "config": {**self.good()["config"], "block_m": 48}}
    self.assert_error(table(bad_tile), r"entry 1 .*invalid config: config.block_m must be a power of two")
    rows_192 = {**self.good(), "rows": 128, "config": {**self.good()["config"], "block_m": 192}}
    self.assert_error(table(rows_192), r"entry 1 .*invalid config: config.block_m = 192 applies to FP8 gmm")
    self.assert_error(table({**self.good(), "rows": 128, "config": {"block_m": 64, "tile": 1}}),
                      r"entry 1 .*config has unknown fields \['tile'\]")
    self.assert_error(table(self.good()), r"entry 1: key .* appears twice")

  def test_fp8_ops_and_dtypes_are_valid_keys(self):
    fp8 = config_table.make_key("gmm_fp8", "float8_e4m3fn", "bfloat16", 64, 256, 512, 8, scale="rowwise")
    path = self.table("fp8.json", entry(fp8, B))
    self.assertEqual(config_table.read_table(path)[fp8].config, B)


class CaptureTest(TableTestBase):

  def test_untuned_keys_are_captured_once_from_four_processes_at_once(self):
    path = os.path.join(self.dir, "shapes.jsonl")
    self.use(self.table("t.json", entry(key(rows=64), A)))
    # Each process selects the shared keys 1..40 (in its own order) and 20 keys of its own, and the one tuned key.
    script = (
        "import random, sys\nfrom jgmm import config_table as t\nw = int(sys.argv[1])\n"
        "keys = [t.make_key('gmm', 'bfloat16', 'bfloat16', 64, 256, 512, g) for g in range(1, 41)]\n"
        "random.Random(w).shuffle(keys)\n"
        "keys += [t.make_key('tgmm', 'bfloat16', 'float32', 8, 100 + w, i + 1, 3) for i in range(20)]\n"
        "keys += [t.make_key('gmm', 'bfloat16', 'bfloat16', 64, 256, 512, 8)]\n"
        "for k in keys:\n  t.select(k, arch=None)\n")
    env = {**os.environ, "JGMM_CAPTURE_SHAPES": path}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)], env=env) for w in range(4)]
    self.assertEqual([p.wait() for p in procs], [0] * 4)
    with open(path) as f:
      lines = f.read().splitlines()
    keys = [config_table.Key(**json.loads(line)) for line in lines]
    self.assertLen(keys, len(set(keys)))  # no duplicate
    want = {config_table.make_key("gmm", "bfloat16", "bfloat16", 64, 256, 512, g) for g in range(1, 41)} - {key()}
    want |= {config_table.make_key("tgmm", "bfloat16", "float32", 8, 100 + w, i + 1, 3)
             for w in range(4) for i in range(20)}
    self.assertEqual(set(keys), want)  # none lost, none torn (each line parses), the tuned one left out
    self.assertEqual(capture.read(path), [json.loads(line) for line in lines])

  def test_read_names_a_damaged_line(self):
    path = os.path.join(self.dir, "shapes.jsonl")
    with open(path, "w") as f:
      f.write('{"op": "gmm"}\n{"op": \n')
    with self.assertRaisesRegex(ValueError, f"{path}:2: not a JSON line"):
      capture.read(path)


class XlaChoiceTest(TableTestBase):
  """A table entry choosing "xla" runs the portable backend inside the Triton backend (the CPU has no Triton: the
  Triton kernel launcher is replaced by a failure, so only the table's choice can make these calls work)."""

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.object(ffi, "triton_call", side_effect=AssertionError("a Triton kernel ran")))
    self.rng = np.random.default_rng()

  def normal(self, shape):
    return jnp.asarray(self.rng.standard_normal(shape), jnp.float32)

  def test_gmm_tgmm_masked(self):
    m, k, n, g = 48, 16, 24, 3
    sizes = jnp.asarray([20, 0, 28], jnp.int32)
    lhs, rhs, x, w = self.normal((m, k)), self.normal((g, k, n)), self.normal((g, 8, k)), self.normal((g, n, k))
    masked_m, dout = jnp.asarray([3, 8, 0], jnp.int32), self.normal((m, n))
    f32 = lambda op, k_, n_, **flags: config_table.make_key(op, "float32", "float32", m / g, k_, n_, g, **flags)
    self.use(self.table("xla.json", entry(f32("gmm", k, n), backend="xla"),
                        entry(f32("tgmm", k, n, transpose=True), backend="xla"),
                        entry(config_table.make_key("masked", "float32", "float32", 8, k, n, g), backend="xla")))
    with jax.default_matmul_precision("float32"):
      out = jax.jit(lambda a, b: jgmm.gmm(a, b, sizes, backend="triton"))(lhs, rhs)
      dw = jax.jit(lambda a, b: jgmm.tgmm(a, b, sizes, transpose_lhs=True, backend="triton"))(lhs, dout)
      masked = jax.jit(lambda a, b: jgmm.masked_gmm(a, b, masked_m, backend="triton"))(x, w)
    self.assertLess(oracle.rel_err(out, oracle.gmm(lhs, rhs, sizes)), 1e-5)
    self.assertLess(oracle.rel_err(dw, oracle.tgmm(lhs, dout, sizes, transpose_lhs=True)[0]), 1e-5)
    self.assertLess(oracle.rel_err(masked, oracle.masked_gmm(x, w, masked_m)), 1e-5)
    # Without an entry, the kernel is called, and the untuned key captured.
    os.environ["JGMM_CAPTURE_SHAPES"] = captured = os.path.join(self.dir, "shapes.jsonl")
    with self.assertRaisesRegex(Exception, "a Triton kernel ran"):
      jax.jit(lambda a, b: jgmm.gmm(a, b, sizes, preferred_element_type=jnp.bfloat16, backend="triton"))(lhs, rhs)
    bf16_out = config_table.make_key("gmm", "float32", "bfloat16", m / g, k, n, g)
    self.assertEqual(capture.read(captured), [bf16_out._asdict()])


if __name__ == "__main__":
  absltest.main()
