"""Root conftest: puts the repository root on sys.path, and lets Python keep compiled modules.

cocotb's runner replaces PYTHONPATH with the caller's sys.path, so benches launched from pytest find
the package and the test helpers through this.

PYTHONDONTWRITEBYTECODE (set in the shell this project is developed and its CI is run in) makes every
process compile every module it imports from source, and pytest rewrite every test module's asserts again:
~5 s of CPU per collecting process (each xdist worker, before its first test) and ~0.2 s per CLI subprocess
the tests start. For the test run only, the variable is dropped, so the suite and the processes it starts
write and reuse the caches (`__pycache__/`, ignored by git; CPython and pytest write them atomically, so
concurrent workers are safe).
"""

import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
os.environ.setdefault("COCOTB_REWRITE_ASSERTION_FILES", "cocotb_*.py")
# Here, before xdist starts its workers (this file is loaded first), so they and every subprocess inherit it.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False
