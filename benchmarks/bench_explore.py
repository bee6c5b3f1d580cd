"""Design points per CPU-second of `layerpipe explore` on issue 14's sweep, and what the plots cost.

    .venv/bin/python benchmarks/bench_explore.py [--rounds 3] [--jobs]

The sweep: lenet5, resnet18, alexnet × N = 2, 3, 4, 6, 8 × layerpipe (staleness unbounded and ≤ 4), pipedream,
gpipe, 1f1b, zb-h1, ooo = 105 points. Each point schedules the network, simulates it twice (K and 2K
iterations, the steady state of `SimResult.steady_cycles_per_iteration`) and appends one row. Printed, side by
side in one run (min of `--rounds` interleaved rounds):

- in process: `run_sweep` alone (points per CPU-second of this process) and where its time goes (the
  scheduler, `make_schedule`, against the simulator, `simulate_policy_pair` / `simulate_policy_result`), the
  same sweep with the simulator's dependencies built op by op as before issue 14 (one `Dependency` per edge),
  the same sweep with one simulation of K iterations per point (what the steady state's pair of runs costs over
  one: the 2K run, and the K run where it is not read off the 2K run's start, `layerpipe.sim._prefix`), then
  `save_pareto` with both plots and with none (what `explore --plots none` saves);
- the whole CLI process (`layerpipe explore ... --no-progress`, CPU of the child, bytecode cached), with plots
  and without;
- with `--jobs` (or alone, `--jobs-only`): `run_sweep` with 1 and 2 jobs (a process, then it and a forked worker),
  each run in a fresh process as `explore --jobs` runs it, wall clock (the figure that scales with cores), min of
  `--rounds`, with the load average before and after each run, the CPU the run's processes used per wall second
  (2.0 = both cores busy for it) and the CPU the rest of the machine used meanwhile (/proc/stat's busy time less
  this process tree's). The target is judged only when, during every run, the other processes used under a
  quarter of a core: the machine was otherwise idle. (The load average cannot
  say that: the runs themselves raise it, a 2-core run by ~0.15 per 5 s.) Elsewhere than Linux the figure is
  printed and marked "not judged".

Every timed sweep starts from empty memos (`layerpipe._memo.clear_memos`), as a
fresh `layerpipe explore` process does: the scheduler memoises pure passes (timings, placements, plans)
within a process, so without this the rounds after the first, and forked `--jobs` workers, would reuse the
first round's work.

Targets (issue 14, "done when"): ≥ 200 points per CPU-second in process, ≥ 100 for the whole CLI run with
plots, `--jobs 2` ≥ 1.7× `--jobs 1` on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _machine import kernels, load  # siblings: benchmarks/ is on sys.path when run as a script
from bench_cli import CACHING_ENV

from layerpipe._memo import clear_memos
from layerpipe.dse import COLUMNS, ResultsFile, SweepSpec, run_sweep, save_pareto

NETWORKS = ("lenet5", "resnet18", "alexnet")
NUM_PROCS = (2, 3, 4, 6, 8)
POLICIES = ("layerpipe", "pipedream", "gpipe", "1f1b", "zb-h1", "ooo")
STALENESS = (None, 4)
SPEC = SweepSpec(networks=NETWORKS, num_procs=NUM_PROCS, policies=POLICIES, max_staleness=STALENESS)

TARGET_IN_PROCESS = 200.0  # points per CPU-second
TARGET_CLI = 100.0  # points per CPU-second of the whole CLI process, plots included
TARGET_JOBS_SPEEDUP = 1.7  # --jobs 2 over --jobs 1, idle 2-core machine
IDLE_OTHERS = 0.25  # cores the other processes may use during the --jobs runs for the machine to count as idle


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


@contextlib.contextmanager
def timing_calls(spent: dict[str, float]) -> Iterator[None]:
    """CPU seconds inside the scheduler and the simulator, as `evaluate_point` calls them (it imports the
    names from their modules at each call)."""
    import layerpipe.schedule.policies as policies
    import layerpipe.sim as sim

    def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - t0
        return call

    saved = policies.make_schedule, sim.simulate_policy_result, sim.simulate_policy_runs, sim.simulate_policy_pair
    policies.make_schedule = timed("schedule", saved[0])  # type: ignore[assignment]
    sim.simulate_policy_result = timed("simulate", saved[1])  # type: ignore[assignment]
    sim.simulate_policy_runs = timed("simulate", saved[2])  # type: ignore[assignment]
    sim.simulate_policy_pair = timed("simulate", saved[3])  # type: ignore[assignment]
    try:
        yield
    finally:
        (policies.make_schedule, sim.simulate_policy_result, sim.simulate_policy_runs,
         sim.simulate_policy_pair) = saved


@contextlib.contextmanager
def op_by_op_dependencies() -> Iterator[None]:
    """The simulator's dependencies as before issue 14: `dependencies()`'s objects, op by op."""
    import layerpipe.schedule._engine as engine

    saved = engine._array_dependencies
    engine._array_dependencies = lambda *args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        engine._array_dependencies = saved


@contextlib.contextmanager
def one_run_steady_state() -> Iterator[None]:
    """`evaluate_point`'s steady state as before its second run: one run of K iterations, its own slope."""
    import layerpipe.dse._evaluate as evaluate
    import layerpipe.sim as sim

    def one_run(result: object, network: object, model: object, config: object) -> tuple[object, float]:
        run = sim.simulate_policy_result(result, network, model,  # type: ignore[arg-type]
                                         evaluate.simulated_iterations(result), config)  # type: ignore[arg-type]
        return run, run.cycles_per_iteration

    saved = evaluate.steady_simulation
    evaluate.steady_simulation = one_run  # type: ignore[assignment]
    try:
        yield
    finally:
        evaluate.steady_simulation = saved


def in_process(tmp: Path) -> dict[str, float]:
    """CPU seconds of one sweep in this process (and inside its scheduler and simulator), of the sweep with
    dependencies op by op, and of saving its Pareto files with and without plots."""
    out = tmp / f"in-{time.monotonic_ns()}.csv"
    spent: dict[str, float] = {}
    clear_memos()
    with timing_calls(spent):
        t0 = time.process_time()
        run_sweep(SPEC, out, jobs=1, progress=False)
        sweep = time.process_time() - t0
    clear_memos()
    with op_by_op_dependencies():
        t0 = time.process_time()
        run_sweep(SPEC, tmp / f"old-{time.monotonic_ns()}.csv", jobs=1, progress=False)
        old = time.process_time() - t0
    clear_memos()
    with one_run_steady_state():
        t0 = time.process_time()
        run_sweep(SPEC, tmp / f"one-{time.monotonic_ns()}.csv", jobs=1, progress=False)
        one_run = time.process_time() - t0
    rows = ResultsFile(out).read_rows()
    t0 = time.process_time()
    save_pareto(rows, tmp / "plots", COLUMNS)
    plots = time.process_time() - t0
    t0 = time.process_time()
    save_pareto(rows, tmp / "noplots", COLUMNS, plots=())
    csv_only = time.process_time() - t0
    return {"sweep": sweep, "scheduler": spent["schedule"], "simulator": spent["simulate"], "op by op": old,
            "one run": one_run,
            "pareto+plots": plots, "pareto only": csv_only}


def cli_process(tmp: Path, plots: bool) -> float:
    """CPU seconds (user + system) of a whole `layerpipe explore` process on the sweep."""
    out = tmp / f"cli-{time.monotonic_ns()}"
    out.mkdir()
    argv = [sys.executable, "-m", "layerpipe.cli", "explore", *NETWORKS,
            "-n", ",".join(map(str, NUM_PROCS)), "--policies", ",".join(POLICIES), "--max-staleness", "4",
            "--out", str(out / "r.csv"), "--no-progress"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Bytecode written where stale, as a user's install has it (`bench_cli.CACHING_ENV`); the rounds keep the min.
    subprocess.run(argv if plots else [*argv, "--plots", "none"], check=True, capture_output=True, env=CACHING_ENV)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", action="store_true", help="also time --jobs 1 against --jobs 2 (wall clock)")
    parser.add_argument("--jobs-only", action="store_true", help="only time --jobs 1 against --jobs 2")
    parser.add_argument("--one-run", type=int, help=argparse.SUPPRESS)  # a fresh process timing one run (`--jobs`)
    args = parser.parse_args()
    if args.one_run:
        with tempfile.TemporaryDirectory() as name:
            print(json.dumps(one_run(Path(name), args.one_run)))
        return
    if args.jobs_only:
        jobs_benchmark(args.rounds)
        return
    points = len(SPEC.points())
    print(f"sweep: {points} points ({', '.join(NETWORKS)} × N {NUM_PROCS} × {', '.join(POLICIES)}, "
          f"layerpipe at staleness {STALENESS}); {load()}; {kernels()}")
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for _ in range(args.rounds):  # interleaved: each figure sees the same machine
            for key, seconds in in_process(tmp).items():
                best[key] = min(best.get(key, float("inf")), seconds)
            for plots in (True, False):
                key = "cli" if plots else "cli, --plots none"
                best[key] = min(best.get(key, float("inf")), cli_process(tmp, plots))
        rate = points / best["sweep"]
        print(f"in process, run_sweep:        {best['sweep']:6.2f} s CPU = {rate:6.1f} points per CPU-second "
              f"(target >= {TARGET_IN_PROCESS:.0f}: {verdict(rate >= TARGET_IN_PROCESS)}); {load()}")
        print(f"  of which the scheduler {best['scheduler']:.2f} s ({best['scheduler'] / best['sweep']:.0%}), "
              f"the simulator {best['simulator']:.2f} s ({best['simulator'] / best['sweep']:.0%}) "
              f"(best rounds of each)")
        old = points / best["op by op"]
        print(f"  dependencies op by op:      {best['op by op']:6.2f} s CPU = {old:6.1f} points per CPU-second "
              f"(the arrays: {best['op by op'] / best['sweep']:.2f}x)")
        one = points / best["one run"]
        print(f"  one simulation per point:   {best['one run']:6.2f} s CPU = {one:6.1f} points per CPU-second "
              f"(the steady state's pair of runs over one: {best['sweep'] / best['one run']:.2f}x)")
        print(f"save_pareto with both plots:  {best['pareto+plots']:6.2f} s CPU; pareto.csv only "
              f"{best['pareto only']:.3f} s ({best['pareto+plots'] / max(best['pareto only'], 1e-6):.0f}x)")
        cli = points / best["cli"]
        print(f"CLI process with plots:       {best['cli']:6.2f} s CPU = {cli:6.1f} points per CPU-second "
              f"(target >= {TARGET_CLI:.0f}: {verdict(cli >= TARGET_CLI)})")
        bare = best["cli, --plots none"]
        print(f"CLI process, --plots none:    {bare:6.2f} s CPU = {points / bare:6.1f} points per CPU-second "
              f"(plots {best['cli'] / bare:.2f}x of it)")
        if args.jobs:
            jobs_benchmark(args.rounds)


def one_run(tmp: Path, jobs: int) -> dict[str, float | None]:
    """One `run_sweep` of `jobs` jobs in this (fresh) process, as `layerpipe explore --jobs` runs it: after the
    imports and a one-point-per-policy sweep of a tiny network (the modules a sweep loads when first needed, and
    the C kernels), so that the run's heap is a fresh CLI process's. Its wall clock, the CPU its processes used
    and the CPU the rest of the machine used meanwhile (None off Linux)."""
    run_sweep(SweepSpec(networks=("mlp:4-4",), num_procs=(2,), policies=POLICIES), tmp / "warm.csv", jobs=1,
              progress=False)
    load_before = os.getloadavg()[0]
    machine0, cpu0, t0 = _machine_busy(), _cpu_with_children(), time.perf_counter()
    run_sweep(SPEC, tmp / "run.csv", jobs=jobs, progress=False)
    seconds = time.perf_counter() - t0
    ours = _cpu_with_children() - cpu0
    machine1 = _machine_busy()
    others = None if machine0 is None or machine1 is None else (machine1 - machine0 - ours) / seconds
    return {"seconds": seconds, "busy": ours / seconds, "others": others, "load_before": load_before,
            "load_after": os.getloadavg()[0]}


def jobs_benchmark(rounds: int) -> None:
    """`run_sweep` wall clock with 1 and 2 jobs (this process, and this process and one forked worker), each run in
    a fresh process (`one_run`: a forked worker copies its parent's pages as either writes, so a process that ran
    sweeps before — this one, after the sections above — is not what `explore --jobs 2` forks), interleaved, min
    of `rounds`, with the load, the CPU its processes used per second and the cores the rest of the machine used
    meanwhile."""
    wall: dict[int, float] = {}
    busy: dict[int, float] = {}
    loads: list[float] = []
    others: list[float | None] = []
    for _ in range(rounds):
        for jobs in (1, 2):
            done = subprocess.run([sys.executable, __file__, "--one-run", str(jobs)], check=True, capture_output=True,
                                  text=True, env=CACHING_ENV)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            loads += [run["load_before"], run["load_after"]]
            others.append(run["others"])
            if run["seconds"] < wall.get(jobs, float("inf")):
                wall[jobs], busy[jobs] = run["seconds"], run["busy"]
    speedup = wall[1] / wall[2]
    known = [o for o in others if o is not None]
    idle = len(known) == len(others) and max(known) < IDLE_OTHERS
    if idle:
        verdict_text = f"target >= {TARGET_JOBS_SPEEDUP}: {verdict(speedup >= TARGET_JOBS_SPEEDUP)}"
    elif len(known) < len(others):
        verdict_text = f"target >= {TARGET_JOBS_SPEEDUP}: not judged, no /proc/stat to tell the other processes' CPU"
    else:
        verdict_text = (f"target >= {TARGET_JOBS_SPEEDUP} on an otherwise idle machine: not judged, other "
                        f"processes used up to {max(known):.2f} cores (>= {IDLE_OTHERS})")
    other_text = f"other processes {min(known):.2f}..{max(known):.2f} cores; " if known else ""
    print(f"run_sweep wall clock, fresh processes (min of {rounds}): --jobs 1 {wall[1]:.2f} s ({busy[1]:.2f} CPU-s "
          f"per s), --jobs 2 {wall[2]:.2f} s ({busy[2]:.2f} CPU-s per s) = {speedup:.2f}x ({verdict_text}; "
          f"{other_text}load average {min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} cores)")


def _machine_busy() -> float | None:
    """CPU seconds every process of the machine has used (/proc/stat: all but idle and iowait), None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / ticks


def _cpu_with_children() -> float:
    """CPU seconds of this process and its waited-for children (the pool's workers, once it has shut down)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

if __name__ == "__main__":
    main()
