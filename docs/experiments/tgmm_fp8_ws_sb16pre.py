"""tgmm_fp8_ws_sb16.py with PREFETCH (session 37 diagnostic)."""
from tgmm_fp8_ws_sb16 import make_call

call = make_call(True)
