"""jgmm.bench's plot (CPU): written where it says, or a line saying why none was written."""
import os
import sys
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest

from jgmm import bench


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


if __name__ == "__main__":
  absltest.main()
