"""Design points per second of `layerpipe explore` on a zoo sweep, with 1 and 2 local processes.

    .venv/bin/python benchmarks/bench_explore.py

Each point schedules the network, simulates enough iterations for the steady state and appends one row.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from layerpipe.dse import SweepSpec, run_sweep

SPEC = SweepSpec(
    networks=("mlp:784-256-128-10", "lenet5", "alexnet", "resnet18"),
    num_procs=(2, 4, 8),
    policies=("layerpipe", "pipedream", "1f1b", "ooo"),
    max_staleness=(None, 4),
)


def main() -> None:
    points = len(SPEC.points())
    print(f"sweep: {points} points ({', '.join(SPEC.networks)} × N {SPEC.num_procs} × {', '.join(SPEC.policies)})")
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 2):
            out = Path(tmp) / f"r{jobs}.csv"
            t0 = time.perf_counter()
            run_sweep(SPEC, out, jobs=jobs, progress=False)
            dt = time.perf_counter() - t0
            print(f"jobs={jobs}: {points} points in {dt:.1f} s = {points / dt:.2f} points/s")


if __name__ == "__main__":
    main()
