"""Run every benchmark script in this folder, one after another, and print their figures.

    .venv/bin/python benchmarks/run_all.py            # all
    .venv/bin/python benchmarks/run_all.py sim rtl    # those whose name contains a word
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(p for p in here.glob("bench_*.py") if not argv or any(w in p.stem for w in argv))
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=here.parent)
        print(f"== {script.name}: exit {rc} in {time.perf_counter() - t0:.1f} s\n", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
