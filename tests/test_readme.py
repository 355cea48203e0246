"""The README's python blocks run as written (on the CPU too), and what the API tour computes is right."""
import pathlib
import re

import jax
import numpy as np
from absl.testing import absltest

from jgmm import oracle

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
# The tour's float32 products: exact on the CPU; TF32 tensor cores on NVIDIA GPUs (relative error ~1e-3).
TOLERANCE = 1e-5 if jax.default_backend() == "cpu" else 1e-2


def python_blocks():
  return re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.M | re.S)


class ReadmeTest(absltest.TestCase):

  def test_the_api_tour_runs_and_its_results_match_the_oracle(self):
    blocks = python_blocks()
    self.assertLen(blocks, 2)  # the API tour; the MoE tour (tests/test_moe.py runs it)
    tour = {}
    exec(compile(blocks[0], f"{README}:api tour", "exec"), tour)  # pylint: disable=exec-used
    lhs, rhs, sizes = tour["lhs"], tour["rhs"], tour["group_sizes"]
    m, k, n, g, f = (tour[name] for name in "MKNGF")
    product = oracle.gmm(lhs, rhs, sizes)
    self.assertLess(oracle.rel_err(tour["out"], product), TOLERANCE)  # The last `out`: jgmm.ragged_dot's.
    self.assertEqual(tour["h"].shape, (m, f))
    y = np.asarray(tour["y"])
    self.assertEqual(y.shape, (g, 8, n))
    np.testing.assert_array_equal(y[1, 3:], 0.0)  # masked_m = [8, 3, 0, 5]: rows past each group's count are 0.
    np.testing.assert_array_equal(y[2], 0.0)
    want_dw, want_db = oracle.tgmm(lhs, tour["dout"], sizes, transpose_lhs=True)
    self.assertEqual(tour["dw"].shape, (g, k, n))
    self.assertLess(oracle.rel_err(tour["dw"], want_dw), TOLERANCE)
    self.assertLess(oracle.rel_err(tour["db"], want_db), TOLERANCE)
    want_grad = oracle.tgmm(lhs, 2 * product, sizes, transpose_lhs=True)[0]  # d sum(out ** 2) / d rhs.
    self.assertLess(oracle.rel_err(tour["grad_rhs"], want_grad), TOLERANCE)

if __name__ == "__main__":
  absltest.main()
