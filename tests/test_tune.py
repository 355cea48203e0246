"""jgmm-tune on the CPU: model-config shapes per family, the tuner's choice with candidates that hang, crash, fail
or are wrong (a scripted worker), and a real tuner killed mid-run that resumes."""
import dataclasses
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import jgmm
from jgmm import backend_triton, config_table, model_shapes, moe, quantize, timing, tune, tune_worker
from jgmm.config import Config
from jgmm.triton_kernels import geometry, gmm_fp8

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "models")


def _example(name):
  with open(os.path.join(EXAMPLES, name)) as f:
    return json.load(f)


class ModelShapesTest(absltest.TestCase):

  def test_each_family_reads_its_field_names(self):
    for name, want in [("mixtral-8x7b.json", (8, 2, 4096, 14336)), ("deepseek-v3.json", (256, 8, 7168, 2048)),
                       ("qwen3-30b-a3b.json", (128, 8, 2048, 768)), ("gpt-oss-20b.json", (32, 4, 2880, 2880))]:
      self.assertEqual(model_shapes.moe_dims(_example(name)), model_shapes.MoeDims(*want), name)
    nested = {"text_config": _example("qwen3-30b-a3b.json")}
    self.assertEqual(model_shapes.moe_dims(nested).experts, 128)

  def test_missing_fields_and_bad_ep_are_errors(self):
    config = _example("mixtral-8x7b.json")
    del config["num_local_experts"]
    with self.assertRaisesRegex(ValueError, r"mine.json: .*'num_local_experts', 'n_routed_experts', 'num_experts'"):
      model_shapes.moe_dims(config, "mine.json")
    with self.assertRaisesRegex(ValueError, "--ep must divide the 8 experts, got 3"):
      model_shapes.layer_calls(model_shapes.moe_dims(_example("mixtral-8x7b.json")), 3, [1])

  def test_forward_backward_and_masked_calls(self):
    dims = model_shapes.moe_dims(_example("deepseek-v3.json"))
    calls = model_shapes.layer_calls(dims, 8, [4096, 1])
    g, h, i = 32, 7168, 2048
    big = {(k.op, k.k, k.n, k.transpose, k.activation): m for k, m in calls if k.rows == 1024}
    self.assertEqual(big, {
        ("gmm", h, 2 * i, False, "swiglu"): 32768, ("gmm", i, h, False, None): 32768,  # forward
        ("gmm_t", 2 * i, h, True, None): 32768, ("gmm_t", h, i, True, None): 32768,  # d lhs
        ("tgmm", h, 2 * i, True, None): 32768, ("tgmm", i, h, True, None): 32768,  # d rhs
        ("masked", h, 2 * i, False, None): 32768, ("masked", i, h, False, None): 32768,
        ("masked", 2 * i, h, True, None): 32768, ("masked", h, i, True, None): 32768})  # masked and its d x
    # One token: 8 rows over 32 experts; masked keeps one row per expert.
    small = [(k, m) for k, m in calls if k.rows == 1]
    self.assertLen(small, 10)
    self.assertEqual({m for k, m in small if k.op == "masked"}, {g})
    self.assertEqual({m for k, m in small if k.op != "masked"}, {8})
    self.assertTrue(all(k.g == g and k.in_dtype == k.out_dtype == "bf16" for k, _ in calls))
    # Token counts landing in one bucket give one key each.
    self.assertLen(model_shapes.layer_calls(dims, 8, [1, 2]), 10)

  def test_calls_merge_inputs_filter_ops_and_drop_repeats(self):
    path = os.path.join(tempfile.mkdtemp(), "shapes.jsonl")
    self.addCleanup(shutil.rmtree, os.path.dirname(path))
    captured = config_table.make_key("masked", "bfloat16", "bfloat16", 8, 64, 32, 4)
    with open(path, "w") as f:
      f.write(json.dumps(captured._asdict()) + "\n")
    args = tune.parse_args(["--capture", path, "--shape", "gmm,64,32,48,4", "--shape", "gmm,60,32,48,4",
                            "--model-config", os.path.join(EXAMPLES, "mixtral-8x7b.json"), "--tokens", "1",
                            "--ops", "gmm,masked"])
    calls = tune.calls(args)
    self.assertEqual(calls[:2], [(captured, 32), (config_table.make_key("gmm", "bfloat16", "bfloat16", 16, 32, 48, 4),
                                                  64)])
    self.assertEqual({k.op for k, _ in calls}, {"gmm", "masked"})
    self.assertLen(calls, 2 + 2 + 4)  # capture, one --shape (the other repeats its key), mixtral's gmm and masked

  def test_model_configs_repeat_and_ep_takes_a_list(self):
    paths = [os.path.join(EXAMPLES, name) for name in ("mixtral-8x7b.json", "qwen3-30b-a3b.json")]
    args = tune.parse_args(["--model-config", paths[0], "--model-config", paths[1], "--ep", "1,8", "--tokens", "64"])
    want = {k for path in paths for ep in (1, 8)
            for k, _ in model_shapes.layer_calls(model_shapes.moe_dims(json.load(open(path))), ep, [64])}
    self.assertEqual({k for k, _ in tune.calls(args)}, want)
    self.assertEqual({k.g for k in want}, {8, 1, 128, 16})  # both families at both ep

  def test_fp8_calls_per_recipe(self):
    dims = model_shapes.moe_dims(_example("deepseek-v3.json"))
    calls = model_shapes.layer_calls(dims, 8, [4096], fp8_recipes=["1x128-128x128", "row-channel"])
    h, i, blocks = 7168, 2048, "1x128-128x128"
    fp8 = {(k.op, k.k, k.n, k.transpose, k.scale): m for k, m in calls if k.op in config_table.FP8_OPS}
    self.assertEqual(fp8, {
        **{(op, kk, nn, op == "gmm_t_fp8", scale): 32768 for scale in (blocks, "row-channel")
           for op in ("gmm_t_fp8", "masked_fp8") for kk, nn in ((h, 2 * i), (i, h))},  # forward, masked
        ("gmm_t_fp8", 2 * i, h, True, blocks): 32768, ("gmm_t_fp8", h, i, True, blocks): 32768,  # d lhs (fp8_gmm)
        ("tgmm_fp8", h, 2 * i, False, "128x1"): 32768, ("tgmm_fp8", i, h, False, "128x1"): 32768})  # d rhs
    self.assertEqual({(k.op, k.k, k.n, k.scale) for k, _ in calls if k.out_dtype == "fp32"},
                     {("gmm_t_fp8", h, 2 * i, blocks)})  # fp8_gmm's gate-up forward, as jgmm.moe asks for it
    self.assertTrue(all((k.in_dtype, k.rows, k.g) == ("fp8e4m3", 1024, 32) and k.out_dtype in ("bf16", "fp32")
                        for k, _ in calls if k.op in config_table.FP8_OPS))
    self.assertEqual([c for c in calls if c[0].op not in config_table.FP8_OPS],
                     model_shapes.layer_calls(dims, 8, [4096]))  # the bf16 calls as before

  def test_fp8_calls_are_the_keys_the_fp8_expert_mlp_selects_forward_and_backward(self):
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))  # quantize_pair's kernel lowers
    dims = model_shapes.MoeDims(experts=4, top_k=2, hidden=256, intermediate=192)
    tokens, g, h, i = 64, 4, 256, 192

    def layer(x, w_up, w_down, sizes):
      return moe.expert_mlp(x, sizes, w_up, w_down, impl="fp8", backend="triton")

    loss = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(layer(*a).astype(jnp.float32)), argnums=(0, 1, 2)))
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    selected = []
    xla = config_table.Selection("xla", None, "exact", None, None)
    with mock.patch.object(config_table, "select", lambda key, **_: selected.append(key) or xla):
      loss.trace(bf16(tokens * 2, h), bf16(g, h, 2 * i), bf16(g, i, h), jax.ShapeDtypeStruct((g,), jnp.int32)).lower()
    want = model_shapes.layer_calls(dims, 1, [tokens], fp8_recipes=["1x128-128x128"])
    self.assertLen(selected, 6)
    self.assertEqual(set(selected), {k for k, _ in want if k.op in ("gmm_t_fp8", "tgmm_fp8")})


class Fp8CliTest(absltest.TestCase):

  def test_fp8_shapes_take_each_scale_recipe_and_their_dtypes(self):
    args = tune.parse_args(["--shape", "gmm_t_fp8,64,256,128,2", "--shape", "tgmm_fp8,64,256,128,2",
                            "--shape", "masked_fp8,64,256,128,2", "--shape", "gmm_fp8,64,256,128,2",
                            "--shape", "gmm,64,256,128,2", "--scale", "1x128-128x128,row-channel",
                            "--out-dtype", "float32", "--fp8-dtype", "float8_e4m3fnuz"])
    calls = tune.calls(args)
    self.assertEqual({(k.op, k.scale, k.transpose) for k, _ in calls}, {
        ("gmm_t_fp8", "1x128-128x128", True), ("gmm_t_fp8", "row-channel", True), ("tgmm_fp8", "128x1", False),
        ("masked_fp8", "1x128-128x128", False), ("masked_fp8", "row-channel", False),
        ("gmm_fp8", "1x128-128x128", False), ("gmm_fp8", "row-channel", False), ("gmm", None, False)})
    self.assertEqual({(k.in_dtype, k.out_dtype, k.rows, k.k, k.n, k.g, m) for k, m in calls if k.op != "gmm"},
                     {("fp8e4m3fnuz", "fp32", 32, 256, 128, 2, 64)})
    (bf16,) = [k for k, _ in calls if k.op == "gmm"]
    self.assertEqual((bf16.in_dtype, bf16.out_dtype), ("bf16", "fp32"))
    default = tune.calls(tune.parse_args(["--shape", "masked_fp8,64,256,128,2"]))
    self.assertEqual([(k.in_dtype, k.out_dtype, k.scale) for k, _ in default], [("fp8e4m3", "bf16", "1x128-128x128")])

  def test_model_config_fp8_and_captured_fp8_keys_are_tuned_and_filtered_by_ops(self):
    path = os.path.join(self.enter_context(tempfile.TemporaryDirectory()), "shapes.jsonl")
    captured = _fp8_key("masked_fp8", 8, 64, 32, 4, scale="row-channel")
    with open(path, "w") as f:
      f.write(json.dumps(captured._asdict()) + "\n")
    mixtral = os.path.join(EXAMPLES, "mixtral-8x7b.json")
    args = tune.parse_args(["--capture", path, "--model-config", mixtral, "--tokens", "16", "--fp8", "1x128-128x128"])
    calls = tune.calls(args)
    self.assertEqual(calls[0], (captured, 32))
    want = model_shapes.layer_calls(model_shapes.moe_dims(_example("mixtral-8x7b.json")), 1, [16],
                                    fp8_recipes=["1x128-128x128"])
    self.assertEqual(calls[1:], want)
    self.assertLen([k for k, _ in want if k.op in config_table.FP8_OPS], 8)
    args = tune.parse_args(["--capture", path, "--model-config", mixtral, "--tokens", "16", "--fp8", "row-channel",
                            "--ops", "tgmm_fp8,masked_fp8"])
    self.assertEqual({(k.op, k.scale) for k, _ in tune.calls(args)}, {("masked_fp8", "row-channel")})

  def test_bad_fp8_options_name_the_flag_the_value_and_what_is_expected(self):
    shape = ["--shape", "gmm_t_fp8,64,256,128,2"]
    for argv, message in [
        ([*shape, "--scale", "1x128,row"], r"argument --scale: expected FP8 scale recipes, comma-separated, of "
                                           r"1x128-128x128, 1x128-channel, row-128x128, row-channel; got '1x128,row'"),
        ([*shape, "--scale", "128x1"], r"argument --scale: .*got '128x1'"),
        (["--model-config", "m.json", "--fp8", "blocks"], r"argument --fp8: expected FP8 scale recipes.*got 'blocks'"),
        ([*shape, "--ops", "gmm,gmm_fp9"], r"argument --ops: expected ops, comma-separated, of gmm, .*masked_fp8; "
                                           r"got 'gmm,gmm_fp9'"),
        ([*shape, "--dtype", "float8_e4m3fn"], r"argument --dtype: expected one of bfloat16, float16, float32 "
                                               r"\(FP8 ops' inputs are --fp8-dtype\), got 'float8_e4m3fn'"),
        ([*shape, "--out-dtype", "float8_e4m3fn"], r"argument --out-dtype: expected one of bfloat16"),
        ([*shape, "--fp8-dtype", "float8_e5m2"], r"argument --fp8-dtype: invalid choice: 'float8_e5m2'")]:
      with self.subTest(argv=argv), mock.patch("sys.stderr", new_callable=io.StringIO) as err:
        with self.assertRaises(SystemExit):
          tune.parse_args(argv)
        self.assertRegex(err.getvalue(), message)
    for text, message in [("gmm_fp9,64,256,128,2", r"--shape: op must be one of gmm, .*, got 'gmm_fp9'"),
                          ("tgmm_fp8,64,256,128", r"--shape wants op,M,K,N,G .*got 'tgmm_fp8,64,256,128'"),
                          ("masked_fp8,64,256,128,0", r"--shape: M, K, N and G must be positive, got"),
                          ("masked,132,64,64,8", r"a masked op's M is G x rows .* got M = 132, G = 8")]:
      with self.subTest(text=text), self.assertRaisesRegex(SystemExit, message):
        tune.calls(tune.parse_args(["--shape", text]))


# A scripted worker: candidate block_m 32 hangs, 64 crashes the process, 128 fails to compile (in the compile phase
# too); screened time = block_n (xla: FAKE_XLA_US); in the final phase block_n 16 is wrong (max_rel_err 0.5), the
# phase takes FAKE_FINAL_S seconds, and a candidate's 7 round times are that time, or those FAKE_ROUNDS (a JSON list,
# one item per final-phase job in turn) gives it: {"<block_n>" or "xla": [us, ...]}.
_FAKE_WORKER = textwrap.dedent("""
    import json, os, sys, time
    def emit(obj):
      sys.stdout.write(json.dumps(obj) + "\\n")
      sys.stdout.flush()
    def us(c):
      return float(os.environ["FAKE_XLA_US"]) if c["backend"] == "xla" else float(c["config"]["block_n"])
    emit({"event": "device", "platform": "fake", "gpu": "Fake GPU", "arch": None, "kind": None, "triton": True,
          "triton_version": "9.9", "jgmm_version": "0.0"})
    rounds = json.loads(os.environ.get("FAKE_ROUNDS", "[]"))
    for line in sys.stdin:
      job = json.loads(line)
      if job["phase"] == "compile":
        for i, c in enumerate(job["candidates"]):
          emit({"event": "start", "i": i})
          block_m = c["config"]["block_m"]
          if block_m == 32:
            time.sleep(60)
          if block_m == 64:
            os._exit(3)
          emit({"event": "result", "i": i, **({"error": "CompileError"} if block_m == 128 else {"compiled": True})})
      elif job["phase"] == "screen":
        for i, c in enumerate(job["candidates"]):
          emit({"event": "start", "i": i})
          block_m = c.get("config", {}).get("block_m")
          if block_m == 32:
            time.sleep(60)
          if block_m == 64:
            os._exit(3)
          if block_m == 128:
            emit({"event": "result", "i": i, "error": "CompileError: out of resources"})
          else:
            emit({"event": "result", "i": i, "us": us(c), "tflops": 1.0})
      else:
        emit({"event": "start", "i": -1})
        time.sleep(float(os.environ.get("FAKE_FINAL_S", 0)))
        scripted = rounds.pop(0) if rounds else {}
        for i, c in enumerate(job["candidates"]):
          wrong = c["backend"] == "triton" and c["config"]["block_n"] == 16
          samples = scripted.get("xla" if c["backend"] == "xla" else str(c["config"]["block_n"]), [us(c)] * 7)
          emit({"event": "result", "i": i, "us": sorted(samples)[3], "samples_us": samples, "tflops": 2.0,
                "max_rel_err": 0.5 if wrong else 1e-4})
      emit({"event": "done"})
    """)


class TunerChoiceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir)
    configs = [Config(16, 16, 16, 4, 2), Config(16, 32, 16, 4, 2), Config(32, 32, 16, 4, 2), Config(64, 32, 16, 4, 2),
               Config(128, 32, 16, 4, 2), Config(16, 64, 16, 4, 2)]
    path = os.path.join(self.dir, "candidates.json")
    with open(path, "w") as f:
      json.dump([{"block_m": c.block_m, "block_n": c.block_n, "block_k": c.block_k, "num_warps": c.num_warps,
                  "num_stages": c.num_stages} for c in configs], f)
    self.args = tune.parse_args(["--shape", "gmm,64,32,48,4", "--timeout", "1.5", "--candidates", path])
    self.key, self.m = tune.calls(self.args)[0]

  def worker(self, xla_us, final_s=0, rounds=()):
    self.enter_context(mock.patch.dict(os.environ, {"FAKE_XLA_US": str(xla_us), "FAKE_FINAL_S": str(final_s),
                                                    "FAKE_ROUNDS": json.dumps(list(rounds))}))
    worker = tune.Worker(verbose=False, command=[sys.executable, "-c", _FAKE_WORKER])
    self.addCleanup(worker.stop)
    return worker

  def run_tuner(self, xla_us, jobs=0, rounds=()):
    worker = self.worker(xla_us, rounds=rounds)
    worker.start()
    precompiler = None
    if jobs:
      precompiler = tune.Precompiler(jobs, None, self.args.timeout, False, worker.command)
      self.addCleanup(precompiler.stop)
      precompiler.submit(self.key, self.m, tune.key_candidates(self.key, self.args, worker.device))
    reports = []
    entry = tune.tune_key(worker, self.key, self.m, self.args, lambda phase, c, e: reports.append((phase, c, e)),
                          precompiler)
    return entry, reports

  def test_hangs_crashes_and_failures_are_skipped_and_wrong_results_rejected(self):
    entry, reports = self.run_tuner(xla_us=1000)
    self.assertEqual((entry.backend, entry.config), ("triton", Config(16, 32, 16, 4, 2)))
    self.assertEqual((entry.us, entry.max_rel_err, entry.gpu, entry.triton), (32.0, 1e-4, "Fake GPU", "9.9"))
    label = lambda phase, c: c["config"]["block_m"] if phase == "screen" else (phase, c["config"]["block_n"])
    errors = {label(phase, c): e["error"] for phase, c, e in reports if "error" in e}
    self.assertRegex(errors[32], "timed out after 2 s")
    self.assertRegex(errors[64], r"the worker died \(exit status 3\)")
    self.assertRegex(errors[128], "CompileError")
    self.assertRegex(errors[("final", 16)], r"max_rel_err 0.5 > ")
    screened = [c for phase, c, e in reports if phase == "screen" and "us" in e]
    self.assertEqual(screened[0]["config"], config_table.heuristic_config(self.key, None).__dict__)  # always tried
    self.assertEqual(screened[-1], {"backend": "xla"})

  def test_sustained_s_goes_to_the_final_phase(self):
    jobs = []
    worker = mock.Mock(run=lambda job, timeout: jobs.append(job) or iter(()))
    cands = [{"backend": "xla"}]
    for argv, sustained in (([], 0.0), (["--sustained-s", "2"], 2.0)):
      args = tune.parse_args(["--shape", "gmm,64,32,48,4", *argv])
      self.assertEqual(tune._final(worker, self.key, self.m, cands, [0], args, lambda *_: None), {})
      self.assertEqual(jobs[-1]["sustained"], sustained)
    with mock.patch("sys.stderr", io.StringIO()) as err, self.assertRaises(SystemExit):
      tune.parse_args(["--shape", "gmm,64,32,48,4", "--sustained-s", "-1"])
    self.assertIn("--sustained-s: expected seconds >= 0 (0: interleaved), got -1.0", err.getvalue())

  def test_xla_wins_where_faster(self):
    entry, _ = self.run_tuner(xla_us=5)
    self.assertEqual((entry.backend, entry.config, entry.us), ("xla", None, 5.0))

  def test_candidates_that_fail_to_compile_ahead_are_not_screened(self):
    entry, reports = self.run_tuner(xla_us=1000, jobs=2)
    self.assertEqual((entry.backend, entry.config), ("triton", Config(16, 32, 16, 4, 2)))
    errors = {c["config"]["block_m"]: e["error"] for phase, c, e in reports if phase == "compile" and "error" in e}
    self.assertRegex(errors[32], "compiling: timed out after 2 s")
    self.assertRegex(errors[64], r"compiling: the worker died \(exit status 3\)")
    self.assertEqual(errors[128], "CompileError")
    screened = [c for phase, c, _ in reports if phase == "screen"]
    self.assertTrue(screened and all(c.get("config", {}).get("block_m") not in errors for c in screened))
    compiled = [c for phase, c, e in reports if phase == "compile" and e.get("compiled")]
    self.assertEqual(compiled, [c for c in screened if c["backend"] == "triton"])

  def test_seed_tables_add_their_config_and_few_candidates_skip_the_screen(self):
    seed = Config(16, 64, 16, 4, 2)  # 64 us in the scripted worker; the heuristic's block_n 128: 128 us
    other_key = config_table.make_key("gmm", "bfloat16", "bfloat16", 16, 32, 96, 4)
    table = os.path.join(self.dir, "other_gpu.json")
    config_table.write_table(table, [config_table.Entry(self.key, "triton", seed, us=1.0, gpu="Other GPU"),
                                     config_table.Entry(other_key, "triton", Config(16, 16, 16, 4, 2))])
    self.args = tune.parse_args(["--shape", "gmm,64,32,48,4", "--timeout", "1.5", "--space", "none",
                                 "--seed-table", table])
    entry, reports = self.run_tuner(xla_us=1000)
    self.assertEqual((entry.backend, entry.config, entry.us, entry.gpu), ("triton", seed, 64.0, "Fake GPU"))
    # The seed and the heuristic: 2 <= 3 finalists. Final: the seed, the heuristic's config, xla; confirm: two.
    self.assertEqual([phase for phase, _, _ in reports], ["final"] * 3 + ["confirm"] * 2)
    self.args.finalists = 1  # Two Triton candidates for one finalist place: screened first.
    _, reports = self.run_tuner(xla_us=1000)
    self.assertEqual([phase for phase, _, _ in reports], ["screen"] * 3 + ["final"] * 3 + ["confirm"] * 2)
    with self.assertRaisesRegex(SystemExit, "--seed-table: no such file: /nonexistent.json"):
      tune.parse_args(["--shape", "gmm,64,32,48,4", "--seed-table", "/nonexistent.json"])

  def test_min_gain_keeps_the_heuristic_unless_beaten_beyond_it(self):
    self.args.min_gain = 3.0  # block_n 32 (32 us) is not 4x faster than the heuristic's block_n 128 (128 us)
    heuristic = config_table.heuristic_config(self.key, None)
    self.assertEqual(heuristic.block_n, 128)
    entry, _ = self.run_tuner(xla_us=1000)
    self.assertEqual((entry.backend, entry.config, entry.us), ("triton", heuristic, 128.0))
    entry, _ = self.run_tuner(xla_us=5)  # 25x faster
    self.assertEqual((entry.backend, entry.us), ("xla", 5.0))

  def test_the_heuristic_stays_unless_beaten_in_the_rounds_and_again_in_a_confirming_round(self):
    heuristic = config_table.heuristic_config(self.key, None)  # block_n 128; the best finalist: block_n 32
    slow, fast = [128.0] * 7, [32.0] * 7
    lucky = [32.0] * 4 + [200.0] * 3  # the fastest median, but slower than the heuristic in 3 rounds of 7
    entry, reports = self.run_tuner(xla_us=1000, rounds=[{"32": lucky}])
    self.assertEqual((entry.config, entry.us), (heuristic, 128.0))
    self.assertNotIn("confirm", {phase for phase, _, _ in reports})  # not beaten: no confirming round
    entry, reports = self.run_tuner(xla_us=1000, rounds=[{"32": fast}, {"32": slow, "128": fast}])
    self.assertEqual((entry.config, entry.us), (heuristic, 128.0))  # the confirming round disagrees
    confirmed = [(c["config"]["block_n"], e["us"]) for phase, c, e in reports if phase == "confirm"]
    self.assertEqual(confirmed, [(32, 128.0), (128, 32.0)])
    entry, _ = self.run_tuner(xla_us=1000, rounds=[{"32": fast}, {"32": [30.0] * 7}])
    self.assertEqual((entry.config.block_n, entry.us), (32, 30.0))  # confirmed: the confirming round's time
    entry, _ = self.run_tuner(xla_us=5, rounds=[{}, {"xla": [500.0] * 7}])
    self.assertEqual(entry.config, heuristic)  # xla too must be confirmed

  def test_beats_needs_the_median_gain_and_5_of_7_rounds(self):
    slow = [100.0, 100, 100, 100, 100, 100, 100]
    self.assertTrue(tune.beats([90.0, 90, 90, 90, 90, 101, 300], slow, 0.01))  # two rounds lost (a stall)
    self.assertFalse(tune.beats([90.0, 90, 90, 90, 101, 101, 101], slow, 0.01))  # three lost
    self.assertFalse(tune.beats([99.5] * 7, slow, 0.01))  # faster every round, but within min_gain
    self.assertTrue(tune.beats([98.0] * 7, slow, 0.01))
    self.assertFalse(tune.beats(slow, slow, 0.0))
    with self.assertRaises(ValueError):
      tune.beats([1.0] * 6, slow, 0.01)  # rounds must pair

  def test_recheck_keeps_entries_that_hold_up_replaces_the_rest_and_resumes(self):
    heuristic = config_table.heuristic_config(self.key, None)
    keys = [config_table.make_key("gmm", "bfloat16", "bfloat16", 16, 32, n, 4) for n in (48, 96, 192, 384)]
    self.assertTrue(all(config_table.heuristic_config(k, None) == heuristic for k in keys))
    # 32 us and 256 us in the scripted worker, the heuristic's config 128 us; `big` does not fit() (64 KiB here): a
    # table's config is timed all the same (it ran where it was tuned).
    fast, big = Config(16, 32, 16, 4, 2), Config(128, 256, 64, 8, 4)
    self.assertFalse(config_table.fits(keys[1], big, None))
    entry = config_table.Entry
    entries = [entry(keys[0], "triton", fast, us=1.0), entry(keys[1], "triton", big, us=2.0),
               entry(keys[2], "triton", heuristic, us=3.0), entry(keys[3], "xla", None)]
    source, output = os.path.join(self.dir, "shipped.json"), os.path.join(self.dir, "rechecked.json")
    config_table.write_table(source, entries, comment="the shipped table")
    self.args = tune.parse_args(["--recheck", source, "--output", output, "--timeout", "1.5", "--jobs", "0",
                                 "--profile-file", os.path.join(self.dir, "profile.jsonl")])
    todo = tune.calls(self.args)
    self.assertEqual(dict(todo), {k: 64 for k in keys})  # M = rows x G
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      tune.tune(self.args, todo, self.worker(xla_us=1000))
    self.assertIn("3 keys to recheck, 1 the heuristic's or rechecked", out.getvalue())
    table = config_table.read_table(output)
    self.assertEqual({k: (e.backend, e.config, e.us) for k, e in table.items()},
                     {keys[0]: ("triton", fast, 32.0), keys[1]: ("triton", heuristic, 128.0),
                      keys[2]: ("triton", heuristic, 3.0), keys[3]: ("triton", heuristic, 128.0)})
    with open(output) as f:
      self.assertEqual(json.load(f)["comment"], "the shipped table")
    with open(os.path.join(self.dir, "profile.jsonl")) as f:
      timed = {(r["key"], json.dumps(r["candidate"])) for r in map(json.loads, f)}
    self.assertLen(timed, 6)  # each rechecked entry's choice and the heuristic's config: nothing else
    self.assertIn((str(keys[1]), json.dumps({"backend": "triton", "config": big.__dict__})), timed)
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      tune.tune(self.args, todo, self.worker(xla_us=1000))  # rerun: all rechecked
    self.assertIn("0 keys to recheck, 4 the heuristic's or rechecked", out.getvalue())
    self.args.output = source
    with self.assertRaisesRegex(SystemExit, "--recheck: --output must be another file than TABLE"):
      tune.tune(self.args, todo, self.worker(xla_us=1000))
    with self.assertRaisesRegex(SystemExit, "--recheck: no such file: /nonexistent.json"):
      tune.parse_args(["--recheck", "/nonexistent.json"])

  def test_time_limit_stops_before_a_key_and_a_rerun_resumes_largest_first(self):
    output = os.path.join(self.dir, "table.json")
    self.args = tune.parse_args(["--shape", "gmm,64,32,48,4", "--shape", "gmm,64,32,96,4", "--output", output,
                                 "--candidates", os.path.join(self.dir, "candidates.json"), "--timeout", "1.5",
                                 "--jobs", "0", "--time-limit", "1.5"])
    todo = tune.calls(self.args)
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      tune.tune(self.args, todo, self.worker(xla_us=1000, final_s=1.0))  # each key takes over 1 s
    self.assertIn("tuned 1 of 2 keys; rerun to resume", out.getvalue())
    (first,) = config_table.read_table(output)
    self.assertEqual(first.n, 96)  # the larger key first
    self.args.time_limit = None
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      tune.tune(self.args, todo, self.worker(xla_us=1000))
    self.assertIn("1 keys to tune, 1 already tuned", out.getvalue())
    self.assertIn("tuned 2 of 2 keys (", out.getvalue())
    self.assertLen(config_table.read_table(output), 2)


class CandidatesTest(absltest.TestCase):

  def test_spaces_fit_the_shared_memory_and_keep_the_ws_kernel_to_gmm(self):
    for op in ("gmm", "gmm_t", "tgmm", "masked"):
      for rows in (8, 1024):
        activation = "swiglu" if op == "gmm" else None  # swiglu tiles read twice the rhs columns
        k = config_table.make_key(op, "bfloat16", "bfloat16", rows, 4096, 4096, 8, activation=activation)
        for space in ("small", "full"):
          configs = tune.candidate_space(k, space)
          self.assertNotEmpty(configs)
          self.assertEqual(any(c.warp_specialized for c in configs), op in ("gmm", "gmm_t") and rows == 1024
                           and space == "small", (op, rows, space))
          cands = tune.candidates(k, configs, "sm90", ["triton", "xla"])
          self.assertEqual(cands[0]["config"], config_table.heuristic_config(k, "sm90").__dict__)
          self.assertEqual(cands[-1], {"backend": "xla"})
          fitting = [Config(**c["config"]) for c in cands[:-1]]
          self.assertTrue(all(config_table.fits(k, c, "sm90") for c in fitting))
          self.assertLen(fitting, len({*fitting}))
          if op == "tgmm":  # tgmm loads through pointers either way: no TMA variants
            self.assertFalse(any(c.tma for c in configs))
    big = Config(128, 256, 64, 8, 4)  # over fits()'s bound on sm90 in bf16, yet measured in a table: a candidate
    self.assertEqual([c["config"] for c in tune.candidates(k, [big], "sm90", ["triton"])], [cands[0]["config"]])
    self.assertEqual([c["config"] for c in tune.candidates(k, [], "sm90", ["triton"], measured=[big])][1:],
                     [big.__dict__])
    small = config_table.make_key("gmm", "bfloat16", "bfloat16", 8, 4096, 4096, 8)
    self.assertLess(len(tune.candidates(small, tune.candidate_space(small, "small"), "sm86", ["triton"])),
                    len(tune.candidates(small, tune.candidate_space(small, "small"), "sm90", ["triton"])))

  def test_bf16_ws_orders_and_clusters_are_screened_where_they_run(self):
    """gmm and gmm_t keys screen the ws kernel in bands of 8, and on 2-CTA clusters only where this Triton has them
    (elsewhere the cluster configs would time the one-CTA kernel again), and Config.tail_split on both persistent
    kernels; masked keys and tgmm keys with lhs (K, M) screen none of them (the transposed tgmm's bands:
    test_bf16_tgmm_screens_its_ws_kernel_in_the_gmm_backward_layout)."""
    for supported in (False, True):
      with mock.patch.object(tune.gmm_ws_cluster, "supported", return_value=supported):
        for op in ("gmm", "gmm_t", "tgmm", "masked"):
          key = config_table.make_key(op, "bfloat16", "bfloat16", 1024, 4096, 14336, 8, transpose=op == "gmm_t")
          configs = tune.candidate_space(key, "small")
          ws = op in ("gmm", "gmm_t")
          self.assertEqual(any(c.band_tiles == 8 and c.cluster_size == 1 for c in configs), ws, (op, supported))
          self.assertEqual(any(c.cluster_size == 2 for c in configs), ws and supported, (op, supported))
          self.assertEqual({c.warp_specialized for c in configs if c.tail_split}, {False, True} if ws else set())
          self.assertTrue(all(c.warp_specialized for c in configs if c.band_tiles > 1 or c.cluster_size > 1))

  def test_bf16_tgmm_screens_its_ws_kernel_in_the_gmm_backward_layout(self):
    """tgmm keys of 2-byte floats with lhs (M, K) read transposed (gmm's weight gradient) above 32 rows per group
    screen the warp-specialised tgmm's tilings, each within its shared memory; other tgmm keys screen none."""
    limit = config_table.shared_memory_limit("sm90")
    for dtype in ("bfloat16", "float16", "float32"):
      for transpose in (False, True):
        for rows in (16, 1024):
          key = config_table.make_key("tgmm", dtype, dtype, rows, 4096, 14336, 8, transpose=transpose)
          ws = [c for c in tune.candidate_space(key, "small") if c.warp_specialized]
          want = dtype != "float32" and transpose and rows > 32
          self.assertEqual({(c.block_n, c.block_k, c.num_stages, c.band_tiles) for c in ws},
                           {(256, 64, 3, 1), (256, 32, 6, 1), (128, 64, 5, 1), (256, 32, 6, 8), (256, 64, 3, 8)}
                           if want else set(), key)
          for c in ws:
            self.assertTrue(geometry.tgmm_ws_ok(8192, 4096, 14336, 8, c.block_m, c.block_n, c.block_k,
                                                c.num_stages, limit), c)

  def test_fp8_spaces_step_within_a_scale_block_and_screen_each_kernels_ws_tilings(self):
    self.assertEqual(config_table.FP8_SCALE_BLOCK, gmm_fp8.SCALE_BLOCK.value)
    fp8_ws = {(128, 128), (128, 256), (192, 128)}
    ws_tilings = {"gmm_fp8": set(), "gmm_t_fp8": fp8_ws, "masked_fp8": fp8_ws, "tgmm_fp8": {(128, 128), (128, 256)}}
    for op in config_table.FP8_OPS:
      for rows in (8, 1024):
        k = _fp8_key(op, rows, 7168, 4096, 8)
        for space in ("small", "full"):
          configs = tune.candidate_space(k, space)
          self.assertEqual({(c.block_m, c.block_n) for c in configs if c.warp_specialized}, ws_tilings[op], op)
          self.assertEqual(any(c.tma for c in configs), op != "tgmm_fp8", (op, space))  # tgmm: pointer loads
          wide_k = Config(128, 128, 256, 8, 3)  # a measured (seed table) config steps within a scale block too
          fitting = [Config(**c["config"]) for c in tune.candidates(k, configs, "sm90", ["triton"], [wide_k])]
          self.assertTrue(all(c.block_k <= 128 for c in fitting), (op, space))
          self.assertIn(Config(128, 128, 128, 8, 3), fitting)
          self.assertEqual(fitting[0], config_table.heuristic_config(k, "sm90"))
          self.assertLen(fitting, len({*fitting}))
    limit = config_table.shared_memory_limit("sm90")  # each tgmm ws tiling fits its kernel's shared memory
    for c in tune.candidate_space(_fp8_key("tgmm_fp8", 1024, 7168, 4096, 8), "small"):
      if c.warp_specialized:
        self.assertTrue(geometry.tgmm_fp8_ws_ok(8192, 7168, 4096, 8, 2, c.block_m, c.block_n, c.block_k,
                                                c.num_stages, limit), c)

  def test_fp8_configs_that_run_alike_are_screened_once(self):
    key = _fp8_key("masked_fp8", 1024, 7168, 4096, 8)
    heuristic = config_table.heuristic_config(key, "sm90")
    wide, plain = Config(64, 128, 256, 4, 3, tma=False), Config(64, 128, 128, 4, 3, tma=False)
    cands = tune.candidates(key, [plain], "sm90", ["triton"],
                            measured=[wide, dataclasses.replace(heuristic, block_k=256)])
    # block_k 256 runs as 128 (config_table.within_scale_block): one candidate each, the heuristic's first.
    self.assertEqual([Config(**c["config"]) for c in cands], [heuristic, plain])
    bf16 = config_table.make_key("masked", "bfloat16", "bfloat16", 1024, 7168, 4096, 8)
    self.assertIn(wide.__dict__, [c["config"] for c in tune.candidates(bf16, [], "sm90", ["triton"], [wide])])


def _fp8_key(op, rows, k, n, g, scale="1x128-128x128", out_dtype="bfloat16"):
  """The Key of a call of an FP8 op as jgmm makes it (tgmm_fp8: lhs (K, M), as jgmm.fp8_gmm's backward)."""
  return config_table.make_key(op, "float8_e4m3fn", out_dtype, rows, k, n, g, transpose=op == "gmm_t_fp8",
                               scale=config_table.TGMM_FP8_RECIPE if op == "tgmm_fp8" else scale)


class WorkerTest(absltest.TestCase):

  @absltest.skipIf(jax.default_backend() == "gpu", "a GPU runs the real kernel (TF32), not the interpreter")
  def test_triton_candidates_run_and_are_checked_under_the_interpreter(self):
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    key = config_table.make_key("gmm", "float32", "float32", 16, 32, 48, 4)
    config = {"block_m": 16, "block_n": 32, "block_k": 16, "num_warps": 4, "num_stages": 2}
    events = []
    tune_worker.run_job({"phase": "final", "key": key._asdict(), "m": 64, "seconds": 0.001,
                         "candidates": [{"backend": "triton", "config": config}, {"backend": "xla"}]}, events.append)
    results = {e["i"]: e for e in events if e["event"] == "result"}
    self.assertEqual(events[0], {"event": "start", "i": -1})
    self.assertEqual(events[-1], {"event": "done"})
    self.assertLess(results[0]["max_rel_err"], 1e-5)  # Triton's interpreter against the xla backend
    self.assertEqual(results[1]["max_rel_err"], 0.0)
    self.assertTrue(all(r["us"] > 0 and r["tflops"] > 0 for r in results.values()))
    for r in results.values():  # 7 rounds rounded up to whole cycles of timing.balanced_orders(2)'s two orders.
      self.assertLen(r["samples_us"], 8)
      self.assertAlmostEqual(r["us"], statistics.median(r["samples_us"]), delta=1e-9 * r["us"])

  def test_a_sustained_final_phase_times_each_candidate_alone_round_by_round(self):
    """"sustained": seconds > 0: the final phase's samples are timing.sustained_runs' rounds (SUSTAINED_ROUNDS of
    them, that many seconds each), not interleaved batches."""
    key = config_table.make_key("gmm", "float32", "float32", 16, 32, 48, 4)
    calls, real = [], timing.sustained_runs

    def sustained_runs(fns, seconds, rounds):
      calls.append((sorted(fns), seconds, rounds))
      return real(fns, seconds, rounds, settle_s=0.0, rest_s=0.0)

    self.enter_context(mock.patch.object(timing, "sustained_runs", sustained_runs))
    self.enter_context(mock.patch.object(timing, "interleaved_samples", side_effect=AssertionError("interleaved")))
    events = []
    tune_worker.run_job({"phase": "final", "key": key._asdict(), "m": 64, "seconds": 0.001, "sustained": 0.01,
                         "candidates": [{"backend": "xla"}, {"backend": "xla"}]}, events.append)
    results = {e["i"]: e for e in events if e["event"] == "result"}
    self.assertEqual(calls, [([0, 1], 0.01, tune_worker.SUSTAINED_ROUNDS)])
    for result in results.values():
      self.assertLen(result["samples_us"], tune_worker.SUSTAINED_ROUNDS)
      self.assertAlmostEqual(result["us"], statistics.median(result["samples_us"]), delta=1e-9 * result["us"])
      self.assertEqual(result["max_rel_err"], 0.0)

  def test_on_a_gpu_a_small_key_runs_chained_and_no_run_is_merged(self):
    key = config_table.make_key("gmm", "float32", "float32", 128, 64, 32, 1)  # one row tile: XLA drops the offset
    with mock.patch.object(jax, "default_backend", lambda: "gpu"):
      arrays, call, _, runs = tune_worker.problem(key, 128)
    self.assertEqual(runs, 32)
    self.assertEqual(call("xla", None).lower(*arrays).compile().as_text().count(" dot("), runs)
    with mock.patch.object(jax, "default_backend", lambda: "cpu"):  # There calls are synchronous: one run.
      self.assertEqual(tune_worker.problem(key, 128)[3], 1)

  def test_the_compile_phase_lowers_for_the_gpu_without_one(self):
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}))
    key = config_table.make_key("gmm", "bfloat16", "bfloat16", 64, 64, 128, 2)
    good = {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 3}
    events = []
    tune_worker.run_job({"phase": "compile", "key": key._asdict(), "m": 128, "seconds": 0, "platforms": ["cuda"],
                         "candidates": [{"backend": "triton", "config": good},
                                        {"backend": "triton", "config": {**good, "block_k": 2}}]}, events.append)
    results = {e["i"]: e for e in events if e["event"] == "result"}
    self.assertEqual(results[0], {"event": "result", "i": 0, "compiled": True})
    self.assertIn("block_k must be a power of two", results[1]["error"])  # reported, not raised
    self.assertEqual(events[-1], {"event": "done"})


class MaskedWorkerTest(absltest.TestCase):

  def test_masked_problems_compute_their_product_and_select_the_keys_layer_calls_makes(self):
    """The layer's masked products and their d x (masked_gmm_kn, with transpose, w (G, K, N) read in place)."""
    dims = model_shapes.MoeDims(experts=4, top_k=2, hidden=64, intermediate=48)
    calls = [(k, m) for k, m in model_shapes.layer_calls(dims, 1, [96], "float32") if k.op == "masked"]
    self.assertEqual(sorted((k.k, k.n, k.transpose) for k, _ in calls),
                     [(48, 64, False), (64, 48, True), (64, 96, False), (96, 64, True)])
    for key, m in calls:
      with self.subTest(key=str(key)):
        arrays, call, _, _ = tune_worker.problem(key, m)
        out = np.asarray(call("xla", None)(*arrays), np.float64)
        x, w, masked_m = (np.asarray(a, np.float64) for a in arrays)
        w_kn = w if key.transpose else w.transpose(0, 2, 1)  # the product's (G, K, N)
        valid = np.arange(x.shape[1])[None, :, None] < masked_m[:, None, None]
        np.testing.assert_allclose(out, np.where(valid, x @ w_kn, 0.0), rtol=1e-5, atol=1e-5)
        self.assertEqual(x.shape[2], key.k)
        selected = []
        xla = config_table.Selection("xla", None, "exact", None, None)
        with mock.patch.object(config_table, "select", lambda key, **_: selected.append(key) or xla):
          call("triton", None).trace(*arrays).lower()
        self.assertEqual(selected, [key])


# (op, scale, transpose) of each FP8 call the tuner builds: every op, every recipe, both tgmm_fp8 layouts.
_FP8_PROBLEMS = [("gmm_fp8", "1x128-128x128", False), ("gmm_t_fp8", "row-channel", True),
                 ("gmm_t_fp8", "1x128-channel", True), ("masked_fp8", "row-128x128", False),
                 ("tgmm_fp8", "128x1", False), ("tgmm_fp8", "128x1", True)]


class Fp8WorkerTest(absltest.TestCase):

  def test_each_fp8_problem_runs_its_public_op_and_selects_the_key_it_tunes(self):
    g, k, n = 2, 256, 384  # K != N and K not a multiple of N: a layout mix-up fails validation
    for op, scale, transpose in _FP8_PROBLEMS:
      key = config_table.make_key(op, "float8_e4m3fn", "float32", 48, k, n, g, transpose=transpose, scale=scale)
      with self.subTest(key=str(key)):
        events = []
        tune_worker.run_job({"phase": "final", "key": key._asdict(), "m": 96, "seconds": 0.001,
                             "candidates": [{"backend": "xla"}]}, events.append)
        (result,) = [e for e in events if e["event"] == "result"]
        self.assertEqual(result["max_rel_err"], 0.0, result)
        arrays, call, flops, _ = tune_worker.problem(key, 96)
        self.assertTrue(any(a.dtype == jnp.float8_e4m3fn for a in arrays))
        out = call("xla", None)(*arrays)
        if op == "masked_fp8":  # 48 rows expected per group, 0.7-1.3x of it valid, in a buffer of 128
          masked_m = np.asarray(arrays[-1])
          self.assertTrue(np.all((masked_m >= 33) & (masked_m <= 62)), masked_m)
          self.assertEqual(flops, 2 * int(masked_m.sum()) * k * n)
          self.assertEqual((out.dtype, out.shape), (jnp.float32, (g, 128, n)))
          valid = np.arange(128)[None, :] < masked_m[:, None]
          self.assertGreater(float(jnp.min(jnp.max(jnp.abs(out), axis=-1)[valid])), 0.0)  # every valid row
          self.assertEqual(float(jnp.max(jnp.abs(out[~valid]))), 0.0)
        else:
          self.assertEqual(flops, 2 * 96 * k * n)
          self.assertEqual((out.dtype, out.shape), (jnp.float32, (g, k, n) if op == "tgmm_fp8" else (96, n)))
          self.assertGreater(float(jnp.min(jnp.max(jnp.abs(out), axis=-1))), 0.0)  # every row computed
        selected = []
        xla = config_table.Selection("xla", None, "exact", None, None)
        with mock.patch.object(config_table, "select", lambda key, **_: selected.append(key) or xla):
          call("triton", None).trace(*arrays).lower()  # backend_triton looks the call up (and runs xla's)
        self.assertEqual(selected, [key])

  def test_keys_no_fp8_call_makes_are_refused(self):
    good = _fp8_key("gmm_t_fp8", 64, 256, 256, 2)
    for key, message in [(good._replace(scale="128x1"), r"scale '128x1': expected one of \('1x128-128x128'"),
                         (_fp8_key("tgmm_fp8", 64, 256, 256, 2)._replace(scale=None), r"scale None: expected"),
                         (good._replace(in_dtype="bf16"), r"bf16 -> bf16 \(inputs: one of \('fp8e4m3'"),
                         (good._replace(out_dtype="fp8e4m3"), r"outputs: one of \('bf16', 'fp16', 'fp32'\)"),
                         (good._replace(transpose=False), "no FP8 call makes it"),
                         (good._replace(bias=True), "no FP8 call makes it"),
                         (config_table.make_key("gmm", "bfloat16", "bfloat16", 8, 64, 64, 2, scale="row-channel"),
                          r"gmm with scale 'row-channel': expected one of \(None,\)")]:
      with self.subTest(key=str(key)):
        with self.assertRaisesRegex(ValueError, message):
          tune_worker.problem(key, 128, abstract=True)
        events = []
        tune_worker.run_job({"phase": "screen", "key": key._asdict(), "m": 128, "seconds": 0.001,
                             "candidates": [{"backend": "xla"}]}, events.append)
        self.assertRegex(events[0]["error"], "jgmm.tune cannot time")  # reported, not raised

  def test_on_a_gpu_fp8_chains_runs_by_the_fp8_peak(self):
    shape = (4096, 4096, 4096, 1)  # compute-bound: FP8 runs at twice bf16's rate, so twice the runs fill 0.5 ms
    bf16 = config_table.make_key("gmm_t", "bfloat16", "bfloat16", *shape, transpose=True)
    with mock.patch.object(jax, "default_backend", lambda: "gpu"):
      runs = {key.op: tune_worker.problem(key, 4096)[3] for key in (bf16, _fp8_key("gmm_t_fp8", *shape))}
    self.assertEqual(runs, {"gmm_t": 3, "gmm_t_fp8": 6})

  def test_the_compile_phase_lowers_each_fp8_ws_tiling_to_its_ws_kernel(self):
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}))
    if not backend_triton._device().tma:
      self.skipTest("this jaxlib's CUDA plugin has no TMA descriptors: the ws kernels do not run")
    for op, kernel in (("gmm_t_fp8", "_gmm_fp8_ws"), ("masked_fp8", "_gmm_fp8_ws"), ("tgmm_fp8", "_tgmm_fp8_ws")):
      key = _fp8_key(op, 128, 256, 256, 2)
      cands = [c for c in tune.candidates(key, tune.candidate_space(key, "small"), "sm90", ["triton"])
               if c["config"]["warp_specialized"]]
      events = []
      with mock.patch.object(backend_triton, kernel, wraps=getattr(backend_triton, kernel)) as ws:
        tune_worker.run_job({"phase": "compile", "key": key._asdict(), "m": 256, "seconds": 0,
                             "platforms": ["cuda"], "candidates": cands}, events.append)
      self.assertEqual([e.get("compiled") for e in events if e["event"] == "result"], [True] * len(cands), events)
      self.assertEqual(ws.call_count, len(cands), op)


class Fp8EndToEndTest(absltest.TestCase):

  def test_a_tuned_fp8_entry_is_what_a_real_call_selects(self):
    """The tuner (its worker process on the CPU: the xla backend alone) writes tgmm_fp8's entry for a --shape; jgmm's
    FP8 tgmm in jgmm.fp8_gmm's backward layout then selects exactly that entry."""
    output = os.path.join(self.enter_context(tempfile.TemporaryDirectory()), "table.json")
    self.enter_context(mock.patch.dict(os.environ, {"JAX_PLATFORMS": "cpu"}))
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      tune.main(["--shape", "tgmm_fp8,256,256,128,2", "--backends", "xla", "--output", output, "--jobs", "0",
                 "--screen-s", "0.001", "--final-s", "0.001", "--timeout", "60"])
    self.assertIn("tuned 1 of 1 keys", out.getvalue())
    (entry,) = config_table.read_table(output).values()
    self.assertEqual(entry.key, _fp8_key("tgmm_fp8", 128, 256, 128, 2))
    self.assertEqual((entry.backend, entry.max_rel_err), ("xla", 0.0))
    self.assertGreater(entry.us, 0)
    m, k, n = 256, 256, 128
    lhs = quantize.quantize(jax.random.normal(jax.random.key(1), (k, m)), "1x128")  # lhs^T (K, M), as fp8_gmm's
    rhs = quantize.quantize(jax.random.normal(jax.random.key(2), (n, m)), "1x128")  # dout^T (N, M)
    tgmm = lambda backend: jax.jit(lambda l, ls, r, rs: jgmm.tgmm(
        l, r, jnp.array([128, 128]), lhs_scale=ls, rhs_scale=rs, transpose_rhs=True, backend=backend))
    selections = []
    select = config_table.select
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_CONFIG_FILES": output}))
    with mock.patch.object(config_table, "select", lambda *a, **kw: selections.append(select(*a, **kw)) or
                           selections[-1]):
      out = tgmm("triton")(*lhs, *rhs)  # backend_triton looks the call up: the entry chooses xla's backend
    self.assertEqual([(s.source, s.backend, s.file, s.entry) for s in selections], [("exact", "xla", output, entry)])
    self.assertTrue(jnp.array_equal(out, tgmm("xla")(*lhs, *rhs)))


class ResumeTest(absltest.TestCase):

  def test_a_killed_tuner_keeps_finished_keys_and_resumes(self):
    out_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out_dir)
    output = os.path.join(out_dir, "table.json")
    shapes = [("--shape", f"gmm,{16 * g},16,24,{g}") for g in (2, 3)]
    argv = [sys.executable, "-m", "jgmm.tune", *sum(shapes, ()), "--dtype", "float32", "--backends", "xla",
            "--output", output, "--screen-s", "0.001", "--final-s", "0.001", "--timeout", "60"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    first = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not os.path.exists(output) and first.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the tuner and its worker, mid-run
    first.wait()
    partial = config_table.read_table(output)
    self.assertLen(partial, 1)  # the finished key kept; the run was cut short
    profile = os.path.join(out_dir, "profile.jsonl")
    done = subprocess.run([*argv, "--profile-file", profile], env=env, capture_output=True, text=True, timeout=120)
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    self.assertIn("1 keys to tune, 1 already tuned", done.stdout)
    table = config_table.read_table(output)
    self.assertLen(table, 2)
    for key, entry in partial.items():
      self.assertEqual(table[key], entry)  # not retuned
    self.assertTrue(all(e.backend == "xla" and e.us > 0 and e.max_rel_err == 0 for e in table.values()))
    with open(profile) as f:
      records = [json.loads(line) for line in f]
    (rest,) = set(table) - set(partial)
    self.assertEqual([(r["key"], r["phase"], r["candidate"]) for r in records],
                     [(str(rest), "final", {"backend": "xla"})])  # one candidate: no screen
    self.assertEqual(records[-1]["us"], table[rest].us)
    self.assertEqual(sorted(os.listdir(out_dir)), ["profile.jsonl", "table.json"])  # no temporary file left


if __name__ == "__main__":
  absltest.main()
