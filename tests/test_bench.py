"""jgmm.bench's plot (CPU): written where it says, or a line saying why none was written; jgmm.bench_tuned's
model level lowers the layer with the tables and with the heuristic only (cross-lowered for sm_90 on the CPU); a
jgmm.bench_hetero FP8 case on the CPU (tiny shapes, one short timing batch); jgmm.timing.chain keeps every run, and
jgmm.bench_fp8 times its products through it; `jgmm.bench --fp8 --tune` tunes the keys its products select; the
FP8 recipe's case times fp8_gmm with the weights quantised in the call and ahead (also with wgrad_scale="group")
beside gmm (tiny, CPU), interleaved and, with --sustained, back to back;
bench.fwd_bwd's forward and backward for a given output cotangent; jgmm.timing.kernel_ms sums a call's matching
kernels (GPU) and raises where none is recorded (CPU); bench_fp8 prints the whole calls' and the kernels' tables;
jgmm.timing's interleaved and sustained runs and the bench's sustained table (CPU)."""
import collections
import functools
import io
import json
import os
import sys
import tempfile
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import jgmm
from jgmm import bench, bench_fp8, bench_hetero, bench_tuned, config_table, oracle, timing, tune


def _results():
  rng = np.random.default_rng()
  return [{"case": name, "impls": {impl: {"fwd_pct_sol_device": float(rng.uniform(10, 100))}
                                   for impl in ("jgmm", "ragged_dot")}} for name in ("a", "b")]


class PlotTest(absltest.TestCase):

  def test_writes_the_plot_and_says_where(self):
    path = os.path.join(self.enter_context(tempfile.TemporaryDirectory()), "bench.png")
    message = bench._plot(_results(), path)
    self.assertEqual(message, f"wrote the plot to {path}")
    with open(path, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

  def test_without_matplotlib_says_why_no_plot(self):
    path = os.path.join(self.enter_context(tempfile.TemporaryDirectory()), "bench.png")
    with mock.patch.dict(sys.modules, {"matplotlib": None, "matplotlib.pyplot": None}):
      message = bench._plot(_results(), path)
    self.assertIn("matplotlib is not installed", message)
    self.assertIn("jgmm[bench]", message)
    self.assertFalse(os.path.exists(path))


class BenchTunedTest(absltest.TestCase):

  def test_the_model_level_compares_the_tables_with_the_heuristic(self):
    path = os.path.join(self.enter_context(tempfile.TemporaryDirectory()), "table.json")
    m, g, h, i = 64, 4, 64, 32
    up = config_table.make_key("gmm", "bfloat16", "bfloat16", m / g, h, 2 * i, g, activation="swiglu")
    config_table.write_table(path, [config_table.Entry(up, "xla", None)])  # the up projection: the xla backend
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90", "JGMM_CONFIG_FILES": path}))
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    args = (bf16(m, h), bf16(g, h, 2 * i), bf16(g, i, h), jax.ShapeDtypeStruct((g,), jnp.int32))
    dout = jnp.zeros((m, h), jnp.bfloat16)
    kernels = lambda runs=1: [f.trace(*args).lower(lowering_platforms=("cuda",)).as_text().count(
        "triton_kernel_call") for f in bench_tuned.layer_fns(dout, runs)]
    tuned = kernels()
    with bench_tuned.table_only({}):
      heuristic = kernels()
    self.assertEqual([t + 1 for t in tuned], heuristic)  # forward and forward+backward: one Triton kernel fewer
    self.assertEqual(kernels(runs=3), [3 * t for t in tuned])  # chained: every run's kernels, none merged


class FwdBwdTest(absltest.TestCase):

  def test_the_forward_and_the_backward_for_the_given_output_cotangent(self):
    """bench.fwd_bwd(gmm): (out, d lhs, d rhs) for the cotangent dout (what torch's out.backward(dout) gives),
    against the float64 oracle; a group left empty. float32 at HIGHEST precision (on a GPU the default's TF32 would
    dominate the error)."""
    rng = np.random.default_rng()
    m, k, n, g = 40, 24, 16, 3
    x, dout = (rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (m, n)))
    w = rng.standard_normal((g, k, n)).astype(np.float32)
    sizes = np.array([25, 0, 15], np.int32)
    gmm = functools.partial(jgmm.gmm, precision=jax.lax.Precision.HIGHEST)
    out, dx, dw = bench.fwd_bwd(gmm)(x, w, jnp.asarray(sizes), dout)
    w_t = np.swapaxes(w, 1, 2)
    for actual, expected in ((out, oracle.gmm(x, w, sizes)), (dx, oracle.gmm(dout, w_t, sizes)),
                             (dw, oracle.tgmm(x, dout, sizes, transpose_lhs=True)[0])):
      np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


class ChainTest(absltest.TestCase):

  def test_every_run_stays_in_the_compiled_program(self):
    fn = lambda x, y, n: jnp.where(jnp.arange(32)[:, None] < n, jnp.tanh(x @ y), 0)  # as a masked product
    x, y = (jax.random.normal(k, (32, 32)) for k in jax.random.split(jax.random.key(0), 2))
    n = jnp.int32(20)
    chained = jax.jit(timing.chain(fn, 4))
    np.testing.assert_array_equal(chained(x, y, n), jax.jit(fn)(x, y, n))
    count_dots = lambda f: f.lower(x, y, n).compile().as_text().count(" dot(")
    self.assertEqual(count_dots(chained), 4)
    self.assertEqual(count_dots(jax.jit(lambda *a: [fn(*a) for _ in range(4)][-1])), 1)  # without the tie: merged

  def test_runs_fill_the_target_time(self):
    self.assertEqual(timing.chain_runs(1.0), 1)
    self.assertEqual(timing.chain_runs(0.1), 5)
    self.assertEqual(timing.chain_runs(0.001), 32)  # at most 32
    self.assertEqual(timing.chain_runs(0.0), 32)


class TimedRunsTest(absltest.TestCase):

  def test_each_fn_runs_back_to_back_every_other_round_reversed(self):
    """Every call of a run falls inside it or its settling before it; the runs do not overlap; the second round runs
    the fns in reverse order; each Run's calls are the calls made between its start and end."""
    calls = []  # (name, time.perf_counter()) of every call
    fns = {name: (functools.partial(lambda name: calls.append((name, time.perf_counter())), name), lambda _: None)
           for name in ("a", "b", "c")}
    runs = timing.sustained_runs(fns, 0.03, rounds=2, settle_s=0.01, rest_s=0.0, calls_per_sync=5)
    self.assertEqual({name: len(r) for name, r in runs.items()}, {"a": 2, "b": 2, "c": 2})
    order = sorted((run.start, name) for name, rs in runs.items() for run in rs)
    self.assertEqual([name for _, name in order], ["a", "b", "c", "c", "b", "a"])
    spans = sorted((run.start, run.end, name, run.calls) for name, rs in runs.items() for run in rs)
    previous_end = -np.inf
    for (start, end, name, count), following in zip(spans, spans[1:] + [(np.inf,)]):
      self.assertGreaterEqual(end - start, 0.03)
      self.assertLessEqual(end, following[0])
      timed = [t for n, t in calls if n == name and start <= t <= end]
      self.assertEqual(len(timed), count)
      self.assertEqual(count % 5, 0)
      self.assertTrue(any(n == name and previous_end < t < start for n, t in calls))  # settled first
      self.assertFalse(any(n != name and previous_end < t < end for n, t in calls))  # nothing else meanwhile
      previous_end = end
    run = runs["a"][0]
    self.assertAlmostEqual(run.ms, 1e3 * (run.end - run.start) / run.calls)
    wall_start, wall_end = run.wall
    self.assertAlmostEqual(wall_end - wall_start, run.end - run.start, places=5)
    self.assertLess(abs(time.time() - (time.perf_counter() + wall_start - run.start)), 0.01)

  def test_balanced_orders_are_permutations_and_each_fn_follows_each_other_equally_often(self):
    for n in range(8):
      orders = timing.balanced_orders(n)
      self.assertLen(orders, 2 * n if n % 2 and n > 1 else max(n, 1), n)
      for order in orders:
        self.assertEqual(sorted(order), list(range(n)), n)
      follows = collections.Counter(pair for order in orders for pair in zip(order, order[1:]))
      self.assertLen(follows, n * (n - 1), n)
      self.assertLessEqual(len(set(follows.values())), 1, n)

  def test_interleaved_batches_run_in_balanced_orders_and_a_slow_fn_once(self):
    """interleaved_runs: after one warm call each and one timing call, every round one batch of each fn in
    balanced_orders' order (3 batches asked of 2 fns: 4, two whole cycles), each Run spanning its batch's calls; a fn
    whose timing call took longer than cap_s: that call alone, no batch; interleaved_samples: the runs' ms."""
    calls = []

    def fn(name, seconds):
      calls.append((name, time.perf_counter()))
      time.sleep(seconds)

    fns = {name: (functools.partial(fn, name, seconds), lambda _: None)
           for name, seconds in (("a", 0.001), ("slow", 0.2), ("b", 0.002))}
    runs = timing.interleaved_runs(fns, min_batch_s=0.05, batches=3, cap_s=0.1)
    self.assertLen(runs["slow"], 1)
    self.assertEqual(runs["slow"][0].calls, 1)
    self.assertEqual([n for n, _ in calls].count("slow"), 2)  # the warm call and the timing call
    batches = sorted((run.start, name, run) for name in ("a", "b") for run in runs[name])
    self.assertEqual([name for _, name, _ in batches], ["a", "b", "b", "a"] * 2)
    for _, name, run in batches:
      inside = [t for n, t in calls if n == name and run.start <= t <= run.end]
      self.assertLen(inside, run.calls)
      self.assertGreater(run.calls, 1)
    self.assertEqual(runs["a"][0].calls, runs["a"][3].calls)
    with mock.patch.object(timing, "interleaved_runs", return_value=runs):
      self.assertEqual(timing.interleaved_samples(fns), {name: [r.ms for r in rs] for name, rs in runs.items()})

  def test_bench_case_times_ragged_dot_apart_from_the_interleave(self):
    """bench_case: the forwards' interleave holds every implementation but ragged_dot, whose batches run in a
    time_interleaved of their own, after it and with the ragged cap (a batch after ragged_dot's runs faster). The
    peers in the interleave are the machine's (torch._grouped_mm where torch has a GPU)."""
    calls = []

    def recorded(fns, cap_s=None):
      calls.append((sorted(fns), cap_s))
      return {name: 1.0 for name in fns}

    with mock.patch.object(bench, "time_interleaved", recorded):
      result = bench.bench_case("tiny", 64, 32, 48, 3, 0.25, bench.H200_CEILINGS)
    others = sorted(set(result["impls"]) - {"ragged_dot"})
    self.assertContainsSubset(["dense_dot", "jgmm"], others)
    self.assertEqual(calls, [(others, None), (["ragged_dot"], 0.25), (others, None)])

  def test_bench_case_reports_sustained_forward_and_backward_and_prints_them(self):
    """bench_case(sustained_s > 0) on a tiny CPU case: each implementation's sustained forward and forward+backward
    but ragged_dot's; _print_sustained's table and geomean over the torch rows (torch is absent on the CPU: added to
    the results here), and nothing printed without sustained runs."""
    fast = functools.partial(timing.sustained_runs, settle_s=0.0, rest_s=0.0)
    with mock.patch.object(bench, "sustained_runs", fast):
      result = bench.bench_case("tiny", 64, 32, 48, 3, 0.01, bench.H200_CEILINGS, sustained_s=0.02)
    rows = result["impls"]
    for impl in ("jgmm", "dense_dot"):
      self.assertGreater(rows[impl]["fwd_sustained_ms"], 0, impl)
      self.assertGreater(rows[impl]["fwd_bwd_sustained_ms"], 0, impl)
    self.assertNotIn("fwd_sustained_ms", rows["ragged_dot"])
    rows["torch_grouped_mm"] = dict(rows["jgmm"], fwd_sustained_ms=3 * rows["jgmm"]["fwd_sustained_ms"],
                                    fwd_bwd_sustained_ms=2 * rows["jgmm"]["fwd_bwd_sustained_ms"])
    out = io.StringIO()
    with mock.patch("sys.stdout", out):
      bench._print_sustained([result])
    text = out.getvalue()
    self.assertRegex(text, r"\| tiny \| jgmm \| [0-9.]+ \| [0-9]+ \| [0-9]+% \| [0-9.]+ \| 3\.00x \| 2\.00x \|")
    self.assertIn("sustained geomean: forward 3.000x, forward+backward 2.000x", text)
    out = io.StringIO()
    with mock.patch("sys.stdout", out):
      bench._print_sustained([bench.bench_case("tiny", 64, 32, 48, 3, 0.01, bench.H200_CEILINGS)])
    self.assertEqual(out.getvalue(), "")


_HAS_GPU = any(d.platform == "gpu" for d in jax.devices())


class KernelMsTest(absltest.TestCase):

  @absltest.skipUnless(_HAS_GPU, "needs a GPU")
  def test_a_calls_matching_kernels_summed(self):
    """Two independent products a call: about twice one's kernel time; a regex matching nothing: LookupError."""
    a, b, c, d = (jax.random.normal(key, (4096, 4096), jnp.bfloat16) for key in jax.random.split(jax.random.key(1), 4))
    one = jax.jit(lambda a, b: a @ b)
    two = jax.jit(lambda a, b, c, d: (a @ b, c @ d))
    timing.jax_sync((one(a, b), two(a, b, c, d)))
    gemm = bench_fp8.KERNELS["torch"]  # cuBLAS's names, whoever launches them
    once = timing.kernel_ms(lambda: one(a, b), timing.jax_sync, gemm)
    twice = timing.kernel_ms(lambda: two(a, b, c, d), timing.jax_sync, gemm)
    self.assertBetween(twice / once, 1.6, 2.4)
    start = time.perf_counter()
    timing.jax_sync(one(a, b))
    self.assertLess(once, 1e3 * (time.perf_counter() - start))
    with self.assertRaisesRegex(LookupError, "0 kernels matching 'no_such_kernel'"):
      timing.kernel_ms(lambda: one(a, b), timing.jax_sync, "no_such_kernel")

  @absltest.skipIf(_HAS_GPU, "the CPU's profiler")
  def test_no_kernels_on_the_cpu(self):
    fn = jax.jit(lambda x: x @ x)
    x = jnp.ones((64, 64))
    timing.jax_sync(fn(x))
    with self.assertRaisesRegex(LookupError, "0 kernels matching"):
      timing.kernel_ms(lambda: fn(x), timing.jax_sync, ".", flush_bytes=1 << 20)


class Fp8BenchTest(absltest.TestCase):

  def test_a_call_runs_the_product_runs_times(self):
    """bench_fp8's jgmm fns: one product's output, and (cross-lowered for sm_90) every run's kernel in the program."""
    g, rows, n, k = 2, 64, 256, 256
    for layout in ("masked", "contiguous"):
      x, w, groups, _ = bench_fp8._case_inputs(layout, g, rows, n, k)
      chained, single = (bench_fp8.jax_impls(layout, rows, x, w, groups, runs) for runs in (3, 1))
      self.assertEqual(set(chained), {"jgmm_fp8_blocks", "jgmm_fp8_rowwise", "jgmm_bf16"})
      for name, fn in chained.items():
        np.testing.assert_array_equal(np.asarray(fn(), np.float32), np.asarray(single[name](), np.float32))
      with mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}):
        kernels = lambda f: f.func.trace(*f.args).lower(lowering_platforms=("cuda",)).as_text().count(
            "triton_kernel_call")
        once = [kernels(f) for f in single.values()]
        self.assertGreater(min(once), 0, layout)
        self.assertEqual([kernels(f) for f in chained.values()], [3 * c for c in once], layout)


class Fp8BenchTuneTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    for name, value in (("MASKED_CASES", [(2, 20)]), ("CONTIGUOUS_CASES", [(2, 64)]), ("SHAPES", [(256, 384)])):
      self.enter_context(mock.patch.object(bench_fp8, name, value))

  def test_the_tuner_tunes_the_keys_the_bench_products_select(self):
    """tune_argv's keys (jgmm-tune --shape lines) are those the bench's FP8 products look up, both recipes."""
    self.enter_context(mock.patch.dict(os.environ, {"JGMM_TARGET": "cuda:90"}))
    self.assertEqual([c[0] for c in bench_fp8.cases()], ["masked-2x20-256-384", "contiguous-2x64-256-384"])
    selected = []
    xla = config_table.Selection("xla", None, "exact", None, None)
    for _, layout, g, rows, n, k in bench_fp8.cases():
      x, w, groups, _ = bench_fp8._case_inputs(layout, g, rows, n, k)
      fns = bench_fp8.jax_impls(layout, rows, x, w, groups, 1)
      with mock.patch.object(config_table, "select", lambda key, **_: selected.append(key) or xla):
        for name in ("jgmm_fp8_blocks", "jgmm_fp8_rowwise"):
          fns[name].func.trace(*fns[name].args).lower(lowering_platforms=("cuda",))
    self.assertLen(selected, 4)
    tuned = tune.calls(tune.parse_args(bench_fp8.tune_argv("", "out")))
    self.assertEqual({key for key, _ in tuned}, set(selected))
    self.assertEqual({(key.op, key.rows, m) for key, m in tuned}, {("masked_fp8", 32, 40), ("gmm_t_fp8", 64, 128)})

  def test_recipe_case_times_fp8_gmm_with_weights_quantised_in_the_call_and_ahead(self):
    result = bench_fp8.bench_recipe("tiny", 256, 256, 128, 2)
    ms = result["fwd_bwd_ms"]
    self.assertEqual(set(ms), {"fp8_gmm", "fp8_gmm_weights_ahead", "fp8_gmm_weights_ahead_wgrad_group", "gmm_bf16"})
    self.assertTrue(all(t > 0 for t in ms.values()), ms)
    with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
      bench_fp8._print([], [result])
    self.assertIn("recipe speedup weights ahead geomean", printed.getvalue())
    self.assertIn("recipe speedup weights ahead wgrad group geomean", printed.getvalue())

  def test_recipe_case_sustained_times_each_run_back_to_back_and_prints_a_second_table(self):
    fast = functools.partial(timing.sustained_runs, settle_s=0.0, rest_s=0.0)
    with mock.patch.object(timing, "sustained_runs", side_effect=fast) as sustained:
      result = bench_fp8.bench_recipe("tiny", 256, 256, 128, 2, sustained_s=0.02)
    self.assertEqual(set(sustained.call_args.args[0]), set(result["fwd_bwd_ms"]))
    ms = result["fwd_bwd_sustained_ms"]
    self.assertEqual(set(ms), set(result["fwd_bwd_ms"]))
    self.assertTrue(all(t > 0 for t in ms.values()), ms)
    self.assertAlmostEqual(result["sustained_speedup_weights_ahead"], ms["gmm_bf16"] / ms["fp8_gmm_weights_ahead"])
    with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
      bench_fp8._print([], [result])
    text = printed.getvalue()
    self.assertIn("(interleaved)", text)
    self.assertIn("(sustained: each back to back", text)
    self.assertIn("recipe sustained speedup weights ahead geomean", text)
    with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
      bench_fp8._print([], [{key: x for key, x in result.items() if "sustained" not in key}])
    self.assertNotIn("sustained", printed.getvalue())

  def test_bench_fp8_passes_sustained_seconds_to_the_recipe(self):
    out = self.enter_context(tempfile.TemporaryDirectory())
    gpu = mock.Mock(platform="gpu", device_kind="a GPU")
    with mock.patch.object(jax, "devices", return_value=[gpu]), mock.patch.object(bench_fp8, "run") as run, \
         mock.patch("sys.stdout", new_callable=io.StringIO):
      bench.main(["--fp8", "--cases", "recipe", "--sustained", "2.5", "--out", out])
    run.assert_called_once_with(out, "recipe", 2.5)

  def test_a_product_case_prints_the_whole_calls_and_the_kernels_alone(self):
    """Both tables printed; the kernels' times where a GPU records them (on the CPU: n/a, and the reason)."""
    out = self.enter_context(tempfile.TemporaryDirectory())
    with mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
      bench_fp8.run(out, "masked-2x20-256-384")
    tables = printed.getvalue().split("\nFP8 (")[1:]
    self.assertLen(tables, 2)
    self.assertIn("whole calls", tables[0])
    self.assertIn("DeepGEMM's method", tables[1])
    with open(os.path.join(out, "bench_fp8.json")) as f:
      impls = json.load(f)["results"][0]["impls"]
    jgmm_impls = ("jgmm_fp8_blocks", "jgmm_fp8_rowwise", "jgmm_bf16")
    self.assertContainsSubset(jgmm_impls, set(impls))
    self.assertTrue(all(impls[name]["tflops"] > 0 for name in jgmm_impls), impls)
    kernel_cells = [c.strip() for c in tables[1].splitlines()[-1].split("|")[4:7]]
    if _HAS_GPU:
      self.assertTrue(all(0 < impls[name]["kernel_ms"] < impls[name]["ms"] * 10 for name in jgmm_impls), impls)
      self.assertNotIn("n/a", kernel_cells)
    else:
      self.assertTrue(all(impls[name]["kernel_ms"] is None for name in jgmm_impls), impls)
      self.assertEqual(kernel_cells, ["n/a"] * 3)
      self.assertIn("jgmm_fp8_blocks: no kernel time", printed.getvalue())

  def test_bench_fp8_tune_runs_the_tuner_on_the_named_cases(self):
    out = self.enter_context(tempfile.TemporaryDirectory())
    with mock.patch.object(tune, "main") as tuner:
      bench.main(["--fp8", "--tune", "--no-bench", "--cases", "contiguous-2x64-256-384", "--out", out])
    tuner.assert_called_once_with(["--shape", "gmm_t_fp8,128,384,256,2", "--scale", "1x128-128x128,row-channel",
                                   "--out-dtype", "bfloat16", "--output", os.path.join(out, "tuned.json")])
    with mock.patch.object(tune, "main") as tuner, mock.patch("sys.stdout", new_callable=io.StringIO) as printed:
      bench.main(["--fp8", "--tune", "--no-bench", "--cases", "recipe", "--out", out])  # no product case: no tuner
    tuner.assert_not_called()
    self.assertIn("no FP8 product case selected", printed.getvalue())


class HeteroFp8CaseTest(absltest.TestCase):

  def test_fp8_case_against_bf16_jgmm_and_the_dot_loop(self):
    fast = functools.partial(timing.time_interleaved, min_batch_s=1e-4, batches=1)
    with mock.patch.object(bench_hetero, "time_interleaved", fast):
      result = bench_hetero.bench_case("tiny" + bench_hetero.FP8_SUFFIX, [(8, 16, 130), (3, 5, 7)])
    self.assertEqual(set(result["ms"]), {"jgmm", "jgmm_bf16", "dot_loop"})
    self.assertLess(result["rel_err_vs_xla"], 0.1)  # FP8's quantisation error, ~3e-2
    self.assertGreater(result["rel_err_vs_xla"], 1e-3)  # not the bf16 product
    self.assertEqual(bench_hetero.CASES["prefill16-fp8"], bench_hetero.CASES["prefill16"])


if __name__ == "__main__":
  absltest.main()
