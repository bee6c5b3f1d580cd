"""Time the retiming pipeline on ResNet-50: build the DFG, its iteration bound, delays for even:8 / even:16,
and the networkx graph layer: the DFG as a networkx graph and as GraphML, Leiserson–Saxe W/D on LeNet-5.

Then issue 14's depth sweep: the delay solver (`solve_delays` with the bounds before/after, and the
iteration bound alone) on `mlp:` chains of 100..2000 layers, today's Howard against the one before issue 14
(benchmarks/_howard_before.py: Fraction comparisons, no in-round propagation), side by side in one run,
CPU time (min of interleaved rounds), the log-log slope, and the targets (< 0.3 s at 1000 layers, slope ≤ 1.2
from 100 to 2000).

Run: .venv/bin/python benchmarks/bench_retiming.py [--network resnet50] [--repeat 3] [--sweep 100,...]
Prints the best of `repeat` wall-clock times per step (milliseconds) and the results they produced.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from typing import TypeVar

import _howard_before  # benchmarks/: the solver as it was, for the side-by-side sweep

import layerpipe.retiming._leiserson_saxe as leiserson_saxe
from layerpipe.costs import make_cost_model
from layerpipe.dfg import build_training_graph
from layerpipe.network import load_network, to_graphml
from layerpipe.retiming import iteration_bound, solve_delays, timed_graph, wd_matrices
from layerpipe.stages import parse_stage_map

T = TypeVar("T")


def best_of(repeat: int, step: Callable[[], T]) -> tuple[float, T]:
    """Best wall-clock time in milliseconds over `repeat` runs, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = step()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best, result  # type: ignore[return-value]


#: issue 14's targets for the delay solver on a chain.
TARGET_1000_SECONDS = 0.3
TARGET_SLOPE = 1.2


def cpu_seconds(step: Callable[[], object]) -> float:
    start = time.process_time()
    step()
    return time.process_time() - start


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(time) against log(depth)."""
    xs, ys = [math.log(d) for d, _ in points], [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def depth_sweep(depths: list[int], repeat: int, before_up_to: int) -> None:
    """The delay solver against depth, now and before, interleaved in each round (same load for both)."""
    model = make_cost_model("pe")
    now_fn = leiserson_saxe.max_cycle_ratio
    print(f"\ndelay solver on mlp chains (even:8 stages), CPU s, min of {repeat} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"  {'layers':>6}  {'solve_delays now':>16}  {'before':>8}  {'ratio':>6}  "
          f"{'bound now':>9}  {'before':>8}  {'ratio':>6}")
    solve_now: list[tuple[int, float]] = []
    solve_before: list[tuple[int, float]] = []
    for depth in depths:
        net = load_network("mlp:" + "-".join(["8"] * depth))
        graph = build_training_graph(net)
        stages = parse_stage_map("even:8", net, model)
        delayed = timed_graph(graph, graph.costs(model), solve_delays(graph, stages).delays)
        best = {key: math.inf for key in ("solve", "solve0", "bound", "bound0")}
        for _ in range(repeat):
            for key, fn in (("solve", now_fn), ("solve0", _howard_before.max_cycle_ratio)):
                if key == "solve0" and depth > before_up_to:
                    continue
                leiserson_saxe.max_cycle_ratio = fn  # iteration_bound's solver: the only difference
                try:
                    best[key] = min(best[key], cpu_seconds(lambda g=graph, s=stages: solve_delays(g, s, model)))
                    bound_key = "bound" if key == "solve" else "bound0"
                    best[bound_key] = min(best[bound_key], cpu_seconds(lambda d=delayed: iteration_bound(d)))
                finally:
                    leiserson_saxe.max_cycle_ratio = now_fn
        if depth <= before_up_to:  # the same answer from both: the bound and the critical cycle
            now_bound = iteration_bound(delayed)
            leiserson_saxe.max_cycle_ratio = _howard_before.max_cycle_ratio
            try:
                assert iteration_bound(delayed) == now_bound, f"{depth} layers: the solvers disagree"
            finally:
                leiserson_saxe.max_cycle_ratio = now_fn
        solve_now.append((depth, best["solve"]))
        if math.isfinite(best["solve0"]):
            solve_before.append((depth, best["solve0"]))

        def cell(t: float) -> str:
            return f"{t:8.3f}" if math.isfinite(t) else f"{'not run':>8}"

        def ratio(a: float, b: float) -> str:
            return f"{b / a:5.1f}x" if math.isfinite(b) else f"{'':>6}"

        print(f"  {depth:6d}  {best['solve']:16.3f}  {cell(best['solve0'])}  {ratio(best['solve'], best['solve0'])}  "
              f"{best['bound']:9.3f}  {cell(best['bound0'])}  {ratio(best['bound'], best['bound0'])}")
    at_1000 = dict(solve_now).get(1000)
    if at_1000 is not None:
        verdict = "met" if at_1000 < TARGET_1000_SECONDS else "NOT met"
        print(f"  solve_delays at 1000 layers: {at_1000:.3f} s (target < {TARGET_1000_SECONDS} s: {verdict})")
    if len(solve_now) >= 2:
        now_slope = slope(solve_now)
        verdict = "met" if now_slope <= TARGET_SLOPE else "NOT met"
        print(f"  log-log slope {depths[0]}..{depths[-1]} layers: now {now_slope:.2f} (target <= {TARGET_SLOPE}: "
              f"{verdict})" + (f", before {slope(solve_before):.2f} ({solve_before[0][0]}..{solve_before[-1][0]})"
                               if len(solve_before) >= 2 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sweep", default="100,200,500,1000,2000",
                        help="chain depths for the delay-solver sweep ('' to skip it)")
    parser.add_argument("--before-up-to", type=int, default=1000,
                        help="time the old solver only up to this depth (it takes ~17 s at 2000 layers)")
    args = parser.parse_args()
    model = make_cost_model("pe")
    net = load_network(args.network)

    ms, graph = best_of(args.repeat, lambda: build_training_graph(net))
    print(f"{args.network}: {len(net)} layers, {len(graph.tasks)} tasks, {len(graph.edges)} edges")
    print(f"  build DFG                 {ms:9.1f} ms")
    costs = graph.costs(model)
    ms, bound = best_of(args.repeat, lambda: iteration_bound(timed_graph(graph, costs)))
    print(f"  iteration bound (Howard)  {ms:9.1f} ms   T_inf = {float(bound.bound):.0f} cycles/iteration "
          f"(critical cycle of {len(bound.cycle)} tasks, {bound.cycle_delays} delay)")
    for spec in ("even:8", "even:16"):
        stages = parse_stage_map(spec, net, model)
        ms, solution = best_of(args.repeat, lambda stages=stages: solve_delays(graph, stages, model))
        after = solution.bound_after
        assert after is not None
        print(f"  solve delays {spec:8s}     {ms:9.1f} ms   total D = {sum(solution.delays.values())}, "
              f"max D = {max(solution.delays.values())}, T_inf after = {float(after.bound):.0f} cycles/iteration "
              "(bounds before/after included)")
    ms, nx_graph = best_of(args.repeat, lambda: graph.to_networkx(model))
    print(f"  DFG to networkx           {ms:9.1f} ms   {nx_graph.number_of_nodes()} nodes, "
          f"{nx_graph.number_of_edges()} edges")
    ms, text = best_of(args.repeat, lambda: to_graphml(nx_graph))
    print(f"  DFG as GraphML            {ms:9.1f} ms   {len(text)} bytes")
    small = build_training_graph(load_network("lenet5"))
    timed = timed_graph(small, small.costs(model))
    ms, (w_mat, _) = best_of(args.repeat, lambda: wd_matrices(timed))
    print(f"  W/D matrices (lenet5)     {ms:9.1f} ms   {w_mat.shape[0]}x{w_mat.shape[1]} (Floyd-Warshall)")
    if args.sweep:
        depth_sweep([int(d) for d in args.sweep.split(",")], args.repeat, args.before_up_to)


if __name__ == "__main__":
    main()
