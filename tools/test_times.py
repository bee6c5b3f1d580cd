"""Per-test CPU times recorded by tests/conftest.py (`LAYERPIPE_TEST_CPU=PATH pytest ...`).

    .venv/bin/python tools/test_times.py PATH [PATH...] [--top N] [--tier all|fast|slow] [--by-file] [--workers 2]
                                         [--fast-ids FILE] [--write-order FILE [--min-cpu S]] [--fast-over S]

Prints, per tier (fast = not marked slow, slow = marked slow): the number of tests, their CPU sum, the
longest test, and an estimate of the wall time on W workers (max of sum/W and the longest test: a lower
bound, xdist cannot split a test); then the top N tests by CPU (and with --by-file the CPU per file).
A test recorded several times (the file was appended to by several runs) counts once: its last record.
The `<startup+collection>` lines (per process: interpreter start, imports, collection) are reported apart.
Several PATHs are read in order (a later record of a test wins). `--fast-ids FILE` re-tiers the records by
today's marks without rerunning anything: FILE lists the fast tier's node ids, one a line, as
`pytest --collect-only -q -m "not slow" > FILE` prints them; recorded tests not in it count as slow.
`--write-order FILE` writes the recorded CPU of every test of at least `--min-cpu` seconds (default 0.5) as
JSON, sorted by node id: tests/conftest.py hands tests to xdist workers longest first by that file
(tests/cpu_times.json), so the suite does not end on one long test while the other worker idles.
`--fast-over S` lists the fast tests of more than S CPU seconds (pyproject's slow marker says ~1 s) and exits 1
when there are any: the fast tier is `pytest -m "not slow"`, under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    nodeid: str
    slow: bool
    cpu: float
    wall: float | None
    worker: str


def load(paths: list[str]) -> tuple[list[Record], list[Record]]:
    """(tests, startup records); the last record of a test wins."""
    tests: dict[str, Record] = {}
    startup: list[Record] = []
    for path in paths:
        _load_one(path, tests, startup)
    return list(tests.values()), startup


def _load_one(path: str, tests: dict[str, Record], startup: list[Record]) -> None:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                rec = Record(str(raw["nodeid"]), bool(raw["slow"]), float(raw["cpu"]),
                             None if raw.get("wall") is None else float(raw["wall"]), str(raw.get("worker", "?")))
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"test_times: {path}:{lineno}: not a record ({exc})") from None
            if rec.nodeid.startswith("<"):
                startup.append(rec)
            else:
                tests[rec.nodeid] = rec


def summary(name: str, recs: list[Record], workers: int) -> str:
    total = sum(r.cpu for r in recs)
    longest = max((r.cpu for r in recs), default=0.0)
    wall = sum(r.wall or 0.0 for r in recs)
    estimate = max(total / workers, longest)
    return (f"{name:<5} {len(recs):>5} tests  CPU {total:8.1f} s  (wall here {wall:8.1f} s)  "
            f"longest {longest:6.1f} s  est. wall on {workers} workers >= {estimate:6.1f} s")


def write_order(tests: list[Record], path: str, min_cpu: float) -> None:
    """The order file tests/conftest.py reads: {"cpu_seconds": {nodeid: seconds}}, one test a line."""
    kept = {r.nodeid: r.cpu for r in sorted(tests, key=lambda r: r.nodeid) if r.cpu >= min_cpu}
    lines = [f"  {json.dumps(nodeid)}: {cpu}" for nodeid, cpu in kept.items()]
    text = '{"cpu_seconds": {\n' + ",\n".join(lines) + "\n}}\n"
    json.loads(text)  # what the reader will parse
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", metavar="PATH")
    ap.add_argument("--top", type=int, default=15, help="how many of the slowest tests to list (default 15)")
    ap.add_argument("--tier", choices=("all", "fast", "slow"), default="all", help="which tests the top list draws on")
    ap.add_argument("--by-file", action="store_true", help="also the CPU per test file")
    ap.add_argument("--workers", type=int, default=2, help="xdist workers for the wall estimate (default 2)")
    ap.add_argument("--fast-ids", metavar="FILE", help="node ids of today's fast tier (re-tiers the records)")
    ap.add_argument("--write-order", metavar="FILE", help="write the CPU seconds xdist orders by")
    ap.add_argument("--min-cpu", type=float, default=0.5, help="--write-order keeps tests of at least S CPU seconds")
    ap.add_argument("--fast-over", type=float, metavar="S", help="list fast tests over S CPU seconds; exit 1 if any")
    args = ap.parse_args(argv)
    if args.top < 0 or args.workers < 1 or args.min_cpu < 0:
        print("test_times: --top and --min-cpu must be >= 0 and --workers >= 1", file=sys.stderr)
        return 2
    try:
        tests, startup = load(args.paths)
        if args.fast_ids:
            with open(args.fast_ids, encoding="utf-8") as f:
                fast_ids = {line.strip() for line in f if "::" in line}
            tests = [Record(r.nodeid, r.nodeid not in fast_ids, r.cpu, r.wall, r.worker) for r in tests]
    except OSError as exc:
        print(f"test_times: {exc}", file=sys.stderr)
        return 2
    if args.write_order:
        try:
            write_order(tests, args.write_order, args.min_cpu)
        except OSError as exc:
            print(f"test_times: {exc}", file=sys.stderr)
            return 2
    fast = [r for r in tests if not r.slow]
    slow = [r for r in tests if r.slow]
    print(summary("fast", fast, args.workers))
    print(summary("slow", slow, args.workers))
    print(summary("all", tests, args.workers))
    if startup:
        print(f"startup+collection: {len(startup)} processes, CPU {sum(r.cpu for r in startup):.1f} s "
              f"(not in the sums above)")
    pool = {"all": tests, "fast": fast, "slow": slow}[args.tier]
    top = sorted(pool, key=lambda r: (-r.cpu, r.nodeid))[:args.top]
    if top:
        print(f"\ntop {len(top)} ({args.tier}) by CPU:")
        for r in top:
            wall = "" if r.wall is None else f"  wall {r.wall:7.2f}"
            print(f"{r.cpu:8.2f} s{wall}  {'slow' if r.slow else 'fast'}  {r.nodeid}")
    if args.by_file:
        per_file: dict[tuple[str, bool], float] = defaultdict(float)
        count: dict[tuple[str, bool], int] = defaultdict(int)
        for r in tests:
            key = (r.nodeid.split("::", 1)[0], r.slow)
            per_file[key] += r.cpu
            count[key] += 1
        print("\nCPU per file and tier:")
        for (file, is_slow), cpu in sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{cpu:8.2f} s  {count[(file, is_slow)]:>4} tests  {'slow' if is_slow else 'fast'}  {file}")
    if args.fast_over is not None:
        over = sorted((r for r in fast if r.cpu > args.fast_over), key=lambda r: (-r.cpu, r.nodeid))
        print(f"\n{len(over)} fast tests over {args.fast_over:g} s of CPU" + (" (mark them slow):" if over else ""))
        for r in over:
            print(f"{r.cpu:8.2f} s  {r.nodeid}")
        if over:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
