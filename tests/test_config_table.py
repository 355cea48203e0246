"""Config tables: a GPU reads the table tuned on its model where one ships, else its architecture's."""
import json
from importlib import resources

from absl.testing import absltest

from jgmm import config_table
from jgmm.config import Config

H100 = "NVIDIA H100 80GB HBM3"


def _entries(name):
  return json.loads(resources.files("jgmm.configs").joinpath(name).read_text())["entries"]


class ConfigTableTest(absltest.TestCase):

  def test_table_files_name_the_model_first(self):
    self.assertEqual(config_table.table_files("sm90", H100), ["sm90-nvidia_h100_80gb_hbm3.json", "sm90.json"])
    self.assertEqual(config_table.table_files("sm90", "NVIDIA H200"), ["sm90-nvidia_h200.json", "sm90.json"])
    self.assertEqual(config_table.table_files("sm80"), ["sm80.json"])

  def test_a_model_with_its_own_table_reads_it(self):
    h100, sm90 = _entries(config_table.table_files("sm90", H100)[0]), _entries("sm90.json")
    differing = [key for key in h100 if Config(**h100[key]) != Config(**sm90[key])]
    self.assertNotEmpty(differing)  # Else this test could not tell the tables apart.
    for key in differing:
      op, dtype, rows, k, n = key.split("/")
      dtype_name = {short: name for name, short in config_table._DTYPE_NAMES.items()}[dtype]
      args = (op, dtype_name, int(rows[1:]), int(k[1:]), int(n[1:]))
      out_dtype = args[1]
      self.assertEqual(config_table.lookup(*args, arch="sm90", out_dtype=out_dtype, device_kind=H100),
                       Config(**h100[key]), key)
      self.assertEqual(config_table.lookup(*args, arch="sm90", out_dtype=out_dtype), Config(**sm90[key]), key)
      self.assertEqual(config_table.lookup(*args, arch="sm90", out_dtype=out_dtype, device_kind="NVIDIA H200"),
                       Config(**sm90[key]), key)

  def test_every_shipped_table_parses(self):
    names = [f.name for f in resources.files("jgmm.configs").iterdir() if f.name.endswith(".json")]
    self.assertIn("sm90.json", names)
    for name in names:
      for key, fields in _entries(name).items():
        self.assertLen(key.split("/"), 5, f"{name}: {key}")
        Config(**fields)


if __name__ == "__main__":
  absltest.main()
