"""CLI start-up cost (issue 14: `layerpipe --help` < 100 ms CPU with bytecode cached).

    .venv/bin/python benchmarks/bench_cli.py [--rounds 7]

Runs, interleaved round by round so the machine's load falls on all of them alike, a bare interpreter
(`python -c pass`), `layerpipe --help`, `layerpipe simulate --help` and an argument error (`layerpipe
simulate` with no network: exit 2 before any work), each a fresh process, and prints the child's CPU time
(user + system, from `resource.getrusage(RUSAGE_CHILDREN)`), min and median over the rounds, with each
command's ratio to the bare interpreter. CPU time, not wall time: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

TARGET_MS = 100.0


def _cpu_ms(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000.0 * ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    exe = Path(sys.executable).with_name("layerpipe")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "layerpipe.cli"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "layerpipe --help": [*cli, "--help"],
        "layerpipe simulate --help": [*cli, "simulate", "--help"],
        "layerpipe simulate (argument error)": [*cli, "simulate"],
    }
    for cmd in commands.values():  # warm the bytecode cache once
        _cpu_ms(cmd)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            times[name].append(_cpu_ms(cmd))
    load = os.getloadavg()[0]
    print(f"CLI start-up, CPU ms per process (min / median of {args.rounds} interleaved rounds); "
          f"load average {load:.2f} on {os.cpu_count()} cores")
    base = min(times["python -c pass"])
    for name, values in times.items():
        low = min(values)
        mark = "" if name == "python -c pass" else (
            f"  target < {TARGET_MS:.0f} ms: {'met' if low < TARGET_MS else 'MISSED'}")
        print(f"  {name:38s} {low:7.1f} / {statistics.median(values):7.1f}   x{low / base:5.2f} of bare python{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
