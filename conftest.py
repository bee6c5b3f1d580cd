"""Root conftest: puts the repository root on sys.path.

cocotb's runner replaces PYTHONPATH with the caller's sys.path, so benches launched from pytest find
the package and the test helpers through this.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
os.environ.setdefault("COCOTB_REWRITE_ASSERTION_FILES", "cocotb_*.py")
