"""Re-export of jgmm.oracle for the tests (to be folded into imports)."""
from jgmm.oracle import *  # noqa: F401,F403
from jgmm.oracle import rel_err, row_ranges  # noqa: F401
