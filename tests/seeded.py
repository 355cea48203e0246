"""SeededTestCase: the test bases' fresh random inputs."""
import secrets

import numpy as np
from absl.testing import parameterized


class SeededTestCase(parameterized.TestCase):
  """self.seed, fresh for each test (no test passes on one lucky draw), and self.rng, a numpy Generator seeded with
  it: failure messages carry the seed, so a failure replays."""

  def setUp(self):
    super().setUp()
    self.seed = secrets.randbits(32)
    self.rng = np.random.default_rng(self.seed)
