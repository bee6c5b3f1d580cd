"""Issue 9's figures, in one run: LayerPipe vs PipeDream on three interconnects, and the scheduler's speed.

Run: .venv/bin/python benchmarks/bench_interconnect.py [--procs 7,8,9] [--quick]

1. The report's headline table: the zoo at N = 7, 8, 9 on `shared`, `rtl` (links:2:64, the generated
   hardware at 64 lanes) and a GPU-like `links:2:1/16`, at batch 1 and batch 32, `pe` cost model (64 lanes,
   16 cycles per op): cycles per sample of LayerPipe and of PipeDream's planner (stages and replicas), their
   ratio, words per sample of each, and whether LayerPipe moved fewer words. Ratios are of figures computed
   side by side in this run.
2. Time to schedule resnet50 at N = 16 on `links:2:16` with the `layerpipe` policy: CPU seconds (min of 3,
   garbage collector on, as users run it). Target: under 2 s on one core.
The machine's load average is printed first: the timing is CPU time, but a loaded machine still slows it.
"""

from __future__ import annotations

import argparse
import os
import time

from layerpipe.costs import PEModel
from layerpipe.interconnect import parse_interconnect
from layerpipe.network import load_network
from layerpipe.schedule import make_schedule

ZOO = ("mlp:784-256-128-10", "lenet5", "alexnet", "vgg16", "resnet18", "resnet50")
INTERCONNECTS = ("shared", "rtl", "links:2:1/16")
BATCHES = (1, 32)
TARGET_SECONDS = 2.0


def headline(procs: tuple[int, ...], networks: tuple[str, ...]) -> None:
    model = PEModel(64, 16)
    print(f"{'interconnect':18} {'batch':>5} {'network':20} {'N':>2} {'LP cyc/sample':>14} {'PD cyc/sample':>14} "
          f"{'PD/LP':>6} {'LP words':>12} {'PD words':>12} fewer")
    for spec in INTERCONNECTS:
        ic = parse_interconnect(spec, lanes=model.lanes)
        for batch in BATCHES:
            ratios, fewer = [], 0
            for name in networks:
                net = load_network(name, batch)
                for n in procs:
                    lp = make_schedule("layerpipe", net, n, model, interconnect=ic).metrics
                    pd = make_schedule("pipedream", net, n, model, interconnect=ic).metrics
                    ratio = pd.cycles_per_sample / lp.cycles_per_sample
                    less = lp.traffic_words_per_sample < pd.traffic_words_per_sample
                    ratios.append(ratio)
                    fewer += less
                    print(f"{ic.resolved():18} {batch:>5} {name:20} {n:>2} {lp.cycles_per_sample:>14,.0f} "
                          f"{pd.cycles_per_sample:>14,.0f} {ratio:>5.2f}x {lp.traffic_words_per_sample:>12,.0f} "
                          f"{pd.traffic_words_per_sample:>12,.0f} {'yes' if less else 'no'}", flush=True)
            print(f"-- {ic.resolved()}, batch {batch}: mean PD/LP {sum(ratios) / len(ratios):.3f}x, "
                  f"min {min(ratios):.3f}x, max {max(ratios):.3f}x; LayerPipe moved fewer words in "
                  f"{fewer}/{len(ratios)} rows\n", flush=True)


def schedule_time() -> None:
    net, model = load_network("resnet50"), PEModel(64, 16)
    ic = parse_interconnect("links:2:16")
    times = []
    for _ in range(3):
        t0 = time.process_time()
        result = make_schedule("layerpipe", net, 16, model, interconnect=ic)
        times.append(time.process_time() - t0)
    best = min(times)
    print(f"layerpipe on resnet50, N = 16, links:2:16: {best:.3f} s CPU (min of 3; target < {TARGET_SECONDS} s: "
          f"{'met' if best < TARGET_SECONDS else 'NOT met'}); {result.metrics.cycles_per_sample:,.0f} cycles/sample")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="7,8,9")
    parser.add_argument("--quick", action="store_true", help="mlp and lenet5 only")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    schedule_time()
    headline(tuple(int(n) for n in args.procs.split(",")), ZOO[:2] if args.quick else ZOO)


if __name__ == "__main__":
    main()
