"""Scheduling figures of issue 3: how close the `layerpipe` policy comes to the period bound, LayerPipe's
speedup over PipeDream at the paper's processor counts, and how long scheduling resnet50 takes.

Run: .venv/bin/python benchmarks/bench_schedule.py [--cost-model pe] [--lanes 64] [--overhead 16]

1. Over the zoo × N = 2..16: `layerpipe` period ÷ lower bound max(⌈Σc/N⌉, max c, pigeonhole bounds) —
   median and max — also with `keep_weights_together` (the RTL's mode) and under `max_staleness` = N
   (the bound then includes the loop bounds), and the worst staleness; and the period against the
   `optimal` policy's proven minimum where the graph is small enough.
2. At N = 7, 8, 9 per network: cycles per sample of PipeDream ÷ LayerPipe (the LayerPipe paper reports
   1.25× on average and up to 1.8× over PipeDream at 7–9 processors; these are our model's figures).
3. Wall time of `make_schedule("layerpipe", resnet50, 16)` (median of 5) and of every policy on resnet50
   for N = 1..16 (what the validation test sweeps).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from layerpipe.costs import make_cost_model
from layerpipe.errors import InputError
from layerpipe.network import load_network
from layerpipe.schedule import POLICIES, LayerPipeOptions, make_schedule

ZOO = ["mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50"]


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
    args = parser.parse_args()
    model = make_cost_model(args.cost_model, lanes=args.lanes, overhead=args.overhead)
    print(f"cost model {model.name} (lanes {args.lanes}, overhead {args.overhead})\n")

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

    print("\n3. scheduling time")
    net = load_network("resnet50")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        make_schedule("layerpipe", net, 16, model)
        times.append(time.perf_counter() - t0)
    print(f"   layerpipe, resnet50, N=16: {statistics.median(times) * 1000:.0f} ms (median of 5)")
    t0 = time.perf_counter()
    per_policy: dict[str, float] = {}
    for name in POLICIES:
        t1 = time.perf_counter()
        for n in range(1, 17):
            with contextlib.suppress(InputError):  # optimal refuses graphs this large at once
                make_schedule(name, net, n, model)
        per_policy[name] = time.perf_counter() - t1
    print(f"   all {len(POLICIES)} policies, resnet50, N=1..16: {time.perf_counter() - t0:.1f} s  "
          + "  ".join(f"{k} {v:.1f}" for k, v in per_policy.items()))


if __name__ == "__main__":
    main()
