"""`python -m jgmm`: --help prints usage without running; the demo runs to the end within a time bound and
reports every op as matching the oracle; progress shows without tqdm too."""
import contextlib
import io
import subprocess
import sys
import time
from unittest import mock

import numpy as np
from absl.testing import absltest

from jgmm import __main__ as demo

# The demo takes ~15 s on a loaded 2-core CPU (README); the bound only catches a hang or a regression to minutes.
TIME_BOUND_S = 120


def _run(*args):
  start = time.perf_counter()
  result = subprocess.run([sys.executable, "-m", "jgmm", *args], capture_output=True, text=True,
                          timeout=TIME_BOUND_S)
  return result, time.perf_counter() - start


class DemoTest(absltest.TestCase):

  def test_help_prints_usage_and_does_not_run(self):
    result, _ = _run("--help")
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("usage: python -m jgmm", result.stdout)
    self.assertIn("--no-timing", result.stdout)
    self.assertNotIn("relative error", result.stdout)

  def test_demo_checks_every_op_and_times_them(self):
    result, seconds = _run()
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    for op in ("gmm (swiglu up-projection)", "gmm (down-projection)", "tgmm (grad of w_down)", "masked_gmm"):
      (line,) = [l for l in result.stdout.splitlines() if l.strip().startswith(op)]
      self.assertTrue(line.endswith(" ok"), line)
    timing = result.stdout[result.stdout.index("timing,"):].splitlines()
    for row in ("forward", "forward+backward"):
      (line,) = [l for l in timing if l.split() and l.split()[0] == row]
      jgmm_ms, ragged_ms, _ = line.split()[1:]
      self.assertGreater(float(jgmm_ms), 0)
      self.assertGreater(float(ragged_ms), 0)
    self.assertLess(seconds, TIME_BOUND_S)

  def test_progress_without_tqdm_prints_a_line_per_task(self):
    stderr = io.StringIO()
    with mock.patch.dict(sys.modules, {"tqdm": None}), contextlib.redirect_stderr(stderr):
      ran = [(name, task()) for name, task in demo.progress({"first": lambda: 1, "second": lambda: 2})]
    self.assertEqual(ran, [("first", 1), ("second", 2)])
    self.assertEqual(stderr.getvalue().splitlines(), ["jgmm demo [1/2] first", "jgmm demo [2/2] second"])

  def test_check_reports_a_mismatch(self):
    rng = np.random.default_rng()
    expected = rng.standard_normal((4, 3))
    line, ok = demo._check("op", expected + 0.1 * rng.standard_normal((4, 3)), expected, 1e-3)
    self.assertFalse(ok)
    self.assertTrue(line.endswith("FAILED"), line)


if __name__ == "__main__":
  absltest.main()
