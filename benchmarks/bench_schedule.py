"""Scheduling figures of issue 3: how close the `layerpipe` policy comes to the period bound, LayerPipe's
speedup over PipeDream at the paper's processor counts, and how long scheduling resnet50 takes.

Run: .venv/bin/python benchmarks/bench_schedule.py [--cost-model pe] [--lanes 64] [--overhead 16]

1. Over the zoo × N = 2..16: `layerpipe` period ÷ lower bound max(⌈Σc/N⌉, max c, pigeonhole bounds) —
   median and max — also with `keep_weights_together` (the RTL's mode) and under `max_staleness` = N
   (the bound then includes the loop bounds), and the worst staleness; and the period against the
   `optimal` policy's proven minimum where the graph is small enough.
2. At N = 7, 8, 9 per network: cycles per sample of PipeDream ÷ LayerPipe (the LayerPipe paper reports
   1.25× on average and up to 1.8× over PipeDream at 7–9 processors; these are our model's figures).
3. CPU time of `make_schedule("layerpipe", resnet50, 16)` (median of 5) and of every policy on resnet50
   for N = 1..16 (what the validation test sweeps).
4. Synchronous schedulers vs N (issue 14): CPU time of `1f1b` on a 256-layer MLP at N = 16 … 256 (one step of
   2N micro-batches, timed on the compiled engine), the log-log slope from the smallest to the largest N that
   scheduled, refusals named; target: N = 256 schedules in < 1 s (and near-linear in N).

CPU time of this process, not wall: the machine is shared. Sections 3 and 4 print the load average with their
figures. `--sections 3,4` runs only those (1 and 2 take minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

from _machine import kernels, load  # a sibling: benchmarks/ is on sys.path when run as a script

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import POLICIES, LayerPipeOptions, make_schedule

ZOO = ["mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50"]
SYNC_MLP = "mlp:" + "-".join(["64"] * 257)  # 256 layers
SYNC_NS = (16, 32, 64, 128, 256)
TARGET_SYNC_SECONDS = 1.0  # 1f1b on the 256-layer MLP at N = 256


Row = tuple[str, int, float, int]  # network, N, period / bound, max staleness


def bound_ratios(model, together: bool, staleness_n: bool = False) -> tuple[list[float], list[Row]]:
    """layerpipe period / bound over zoo × N = 2..16 (with `staleness_n`: under max_staleness = N)."""
    ratios, rows = [], []
    for spec in ZOO:
        net = load_network(spec)
        for n in range(2, 17):
            options = LayerPipeOptions(keep_weights_together=together, max_staleness=n if staleness_n else None)
            m = make_schedule("layerpipe", net, n, model, options).metrics
            ratio = m.cycles_per_sample / m.lower_bound_cycles
            ratios.append(ratio)
            rows.append((spec, n, ratio, m.max_staleness))
    return ratios, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost-model", default="pe")
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--overhead", type=int, default=16)
    parser.add_argument("--sections", default="1,2,3,4", help="comma-separated section numbers to run")
    args = parser.parse_args()
    sections = {int(x) for x in args.sections.split(",")}
    model = make_cost_model(args.cost_model, lanes=args.lanes, overhead=args.overhead)
    print(f"cost model {model.name} (lanes {args.lanes}, overhead {args.overhead})\n")
    if 1 in sections:
        bounds_section(model)
    if 2 in sections:
        speedup_section(model)
    if 3 in sections:
        timing_section(model)
    if 4 in sections:
        synchronous_section(model)


def bounds_section(model) -> None:
    print("1. layerpipe period / lower bound over zoo x N=2..16")
    for together, bounded in ((False, False), (True, False), (False, True)):
        ratios, rows = bound_ratios(model, together, bounded)
        worst = max(rows, key=lambda r: r[2])
        label = "keep_weights_together" if together else "max_staleness=N" if bounded else "default"
        print(f"   {label:22s} median {statistics.median(ratios):.4f}  max {max(ratios):.4f} "
              f"({worst[0]} N={worst[1]})  share at bound {sum(r <= 1.0 for r in ratios) / len(ratios):.0%}  "
              f"worst staleness {max(r[3] for r in rows)}")

    gaps = []
    for spec in ("mlp:784-256-128-10", "lenet5"):
        net = load_network(spec)
        for n in range(2, 9):
            best = make_schedule("optimal", net, n, model).metrics.period_cycles
            gaps.append(make_schedule("layerpipe", net, n, model).metrics.period_cycles / best)
    print(f"   layerpipe / proven optimum (mlp:784-256-128-10, lenet5; N=2..8): median {statistics.median(gaps):.4f} "
          f" max {max(gaps):.4f}")



def speedup_section(model) -> None:
    print("\n2. speedup of layerpipe over pipedream (cycles per sample), N = 7, 8, 9")
    speedups = []
    for spec in ZOO:
        net = load_network(spec)
        cells = []
        for n in (7, 8, 9):
            lp = make_schedule("layerpipe", net, n, model).metrics.cycles_per_sample
            pd = make_schedule("pipedream", net, n, model).metrics.cycles_per_sample
            speedups.append(pd / lp)
            cells.append(f"N={n}: {pd / lp:5.2f}x")
        print(f"   {spec:20s} " + "  ".join(cells))
    print(f"   mean {statistics.mean(speedups):.2f}x  geomean {statistics.geometric_mean(speedups):.2f}x  "
          f"max {max(speedups):.2f}x  (paper: 1.25x average, up to 1.8x)")



def timing_section(model) -> None:
    print(f"\n3. scheduling time (CPU); {load()}; {kernels()}")
    net = load_network("resnet50")
    times = []
    for _ in range(5):
        t0 = time.process_time()
        make_schedule("layerpipe", net, 16, model)
        times.append(time.process_time() - t0)
    print(f"   layerpipe, resnet50, N=16: {statistics.median(times) * 1000:.0f} ms (median of 5)")
    t0 = time.process_time()
    per_policy: dict[str, float] = {}
    for name in POLICIES:
        t1 = time.process_time()
        for n in range(1, 17):
            with contextlib.suppress(InputError):  # optimal refuses graphs this large at once
                make_schedule(name, net, n, model)
        per_policy[name] = time.process_time() - t1
    print(f"   all {len(POLICIES)} policies, resnet50, N=1..16: {time.process_time() - t0:.1f} s  "
          + "  ".join(f"{k} {v:.1f}" for k, v in per_policy.items()))


def synchronous_section(model) -> None:
    print(f"\n4. 1f1b on a 256-layer MLP vs N (CPU seconds); {load()}; target: N = 256 in < {TARGET_SYNC_SECONDS} s")
    net = load_network(SYNC_MLP)
    timed: dict[int, float] = {}
    for n in SYNC_NS:
        t0 = time.process_time()
        try:
            period = make_schedule("1f1b", net, n, model).metrics.period_cycles
        except InputError as exc:
            print(f"   N={n:<4} refused after {time.process_time() - t0:.2f} s: {exc}")
            continue
        timed[n] = time.process_time() - t0
        print(f"   N={n:<4} {timed[n]:7.2f} s  step period {period} cycles  ({load()})")
    if len(timed) >= 2:
        lo, hi = min(timed), max(timed)
        slope = math.log(timed[hi] / timed[lo]) / math.log(hi / lo)
        print(f"   log-log slope N={lo}..{hi}: {slope:.2f}")
    last = timed.get(SYNC_NS[-1])
    verdict = "met" if last is not None and last < TARGET_SYNC_SECONDS else "NOT met"
    shown = f"{last:.2f} s" if last is not None else "refused"
    print(f"   N={SYNC_NS[-1]}: {shown} (target < {TARGET_SYNC_SECONDS} s: {verdict})")


if __name__ == "__main__":
    main()
