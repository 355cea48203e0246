"""pytest's --shard I/N (tests/sharding.py, wired in tests/conftest.py): the shards are disjoint and cover the
collection; a bad I/N is an error naming the option."""
import pathlib
import re
import subprocess
import sys

from absl.testing import absltest

import sharding


class ShardTest(absltest.TestCase):

  def test_shards_are_disjoint_and_cover_the_items(self):
    items = [f"test_{j}" for j in range(11)]
    for count in (1, 2, 3, 11, 12):
      shards = [sharding.shard(items, f"{index}/{count}") for index in range(count)]
      with self.subTest(count=count):
        self.assertCountEqual(sum((kept for kept, _ in shards), []), items)
        for kept, dropped in shards:
          self.assertCountEqual(kept + dropped, items)
        sizes = [len(kept) for kept, _ in shards]
        self.assertLessEqual(max(sizes) - min(sizes), 1)
    self.assertEqual(sharding.shard(items, "1/3")[0], ["test_1", "test_4", "test_7", "test_10"])

  def test_bad_spec_names_the_option(self):
    for spec in ("3/3", "-1/2", "1", "a/b", "1/0", "1/2/3", ""):
      with self.subTest(spec=spec), self.assertRaisesRegex(
          ValueError, "^" + re.escape(f"--shard: expected I/N with integers 0 <= I < N, got {spec!r}") + "$"):
        sharding.shard(["test_0"], spec)

  def test_pytest_runs_only_the_shard(self):
    """The option reaches pytest's collection: this file's tests, every second one from the second."""
    this = pathlib.Path(__file__)
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--shard=1/2", str(this)], cwd=this.parent.parent, capture_output=True, text=True,
                         timeout=300, check=False)
    self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
    names = [line.rsplit("::", 1)[1] for line in run.stdout.splitlines() if "::" in line]
    self.assertEqual(names, ["test_pytest_runs_only_the_shard"])  # The second of the three by name (unittest's order).


if __name__ == "__main__":
  absltest.main()
