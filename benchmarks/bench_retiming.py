"""Time the retiming pipeline on ResNet-50: build the DFG, its iteration bound, delays for even:8 / even:16,
and the networkx graph layer: the DFG as a networkx graph and as GraphML, Leiserson–Saxe W/D on LeNet-5.

Then the networkx graph layer against the hand-written code it replaced (issue 13: no slower by more than
10 %): every step that has an old counterpart, timed now and before side by side in one run (the old code is
read from git at 4c404fd^ by benchmarks/_retiming_before.py; `--before ''` skips it), CPU ms (min of
interleaved rounds), the ratio and whether both gave the same answer.

Then issue 14's depth sweep: the delay solver (`solve_delays` with the bounds before/after, and the
iteration bound alone) on `mlp:` chains of 100..2000 layers, today's Howard against the one before issue 14
(benchmarks/_howard_before.py: Fraction comparisons, no in-round propagation), side by side in one run,
CPU time (min of interleaved rounds), the log-log slope, and the targets (< 0.3 s at 1000 layers, slope ≤ 1.2
from 100 to 2000).

Run: .venv/bin/python benchmarks/bench_retiming.py [--network resnet50] [--repeat 3] [--sweep 100,...]
     [--before REV] [--chain 1000]
Prints the best of `repeat` wall-clock times per step (milliseconds) and the results they produced.
"""

from __future__ import annotations

import argparse
import math
import os
import time
import types
from collections.abc import Callable, Sequence
from typing import TypeVar

import _howard_before  # benchmarks/: the solver as it was, for the side-by-side sweep
import _retiming_before  # benchmarks/: the pre-networkx retiming, read from git
import numpy as np

import layerpipe.retiming._delays as delays_now
import layerpipe.retiming._leiserson_saxe as leiserson_saxe
from layerpipe.costs import CostModel, make_cost_model
from layerpipe.dfg import TrainingGraph, build_training_graph
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


def _before_solver(*args: object, zero_delay_acyclic: bool = False, policy: object = None) -> object:
    """The solver before issue 14, called as today's is (it always searched for a delay-free cycle itself)."""
    return _howard_before.max_cycle_ratio(*args)


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
            for key, fn in (("solve", now_fn), ("solve0", _before_solver)):
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
            leiserson_saxe.max_cycle_ratio = _before_solver
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


#: The networkx rows may cost at most this much more than the hand-written code (issue 13).
TARGET_NETWORKX_RATIO = 1.10


def _steps(mod: types.ModuleType, graph: TrainingGraph, stages: Sequence[int], model: CostModel,
           small: TrainingGraph) -> dict[str, Callable[[], object]]:
    """One retiming module's steps, each returning something comparable across the two versions."""
    costs = graph.costs(model)
    timed = mod.timed_graph(graph, costs)
    solution = mod.solve_delays(graph, stages)
    problem = delays_now._problem(graph, delays_now._stage_of_task(graph, stages), True)
    # the constraint system as the solver builds it (its edges as task indices: `_Problem`, since c28dd28)
    need = np.asarray(problem.required, dtype=np.int64) - problem.edge_delays
    bounds = delays_now._bounds(need, problem.group_of_edge, [solution.delays[layer] for layer in problem.layers])
    delayed = mod.timed_graph(graph, costs, solution.delays)
    retimed = mod.retimed_delays(timed, dict(solution.lags))
    small_timed = mod.timed_graph(small, small.costs(model))
    n = len(graph.tasks)

    def lags(r: object) -> object:
        return None if r is None else np.asarray(r).tolist()

    return {
        "iteration bound": lambda: mod.iteration_bound(timed).bound,
        "solve delays (+bounds)": lambda: dict(mod.solve_delays(graph, stages, model).delays),
        "solve delays": lambda: dict(mod.solve_delays(graph, stages).lags),
        "delays feasible": lambda: mod.delays_feasible(graph, stages, solution.delays),
        "difference constraints": lambda: lags(mod.least_retiming(n, problem.src, problem.dst, bounds)),
        "clock period": lambda: mod.clock_period(delayed),
        "legality check": lambda: mod.retiming_violations(timed, retimed),
        "loop bounds": lambda: [(b.layer, b.time, b.delays) for b in mod.loop_bounds(graph, costs)],
        "W/D matrices (lenet5)": lambda: [m.tolist() for m in mod.wd_matrices(small_timed)],
        "min-period retiming (lenet5)": lambda: mod.min_period_retiming(small_timed)[0],
    }


def networkx_side_by_side(spec: str, stage_spec: str, repeat: int, rev: str) -> None:
    """Each step now and with the hand-written code at `rev`, interleaved per round, CPU ms."""
    try:
        before = _retiming_before.load(rev)
    except _retiming_before.BeforeUnavailable as exc:
        print(f"\nnetworkx vs hand-written: no 'before' column ({exc})")
        return
    import layerpipe.retiming as now

    model = make_cost_model("pe")
    net = load_network(spec)
    graph = build_training_graph(net)
    stages = parse_stage_map(stage_spec, net, model)
    small = build_training_graph(load_network("lenet5"))
    rows = {"now": _steps(now, graph, stages, model, small), "before": _steps(before, graph, stages, model, small)}
    best = {(key, name): math.inf for key in rows for name in rows[key]}
    for _ in range(repeat):
        for name in rows["now"]:
            for key in ("now", "before"):
                best[(key, name)] = min(best[(key, name)], cpu_seconds(rows[key][name]))
    label = spec if len(spec) <= 24 else f"{spec[:spec.index(':') + 1]}{len(net)} layers"
    print(f"\nnetworkx graph layer vs the hand-written code at {rev}: {label}, {stage_spec}; CPU ms, min of "
          f"{repeat} interleaved rounds; load average {os.getloadavg()[0]:.2f}")
    print(f"  {'step':30s} {'now':>10} {'before':>10} {'now/before':>10}  same answer")
    over = []
    for name in rows["now"]:
        a, b = best[("now", name)] * 1e3, best[("before", name)] * 1e3
        same = rows["now"][name]() == rows["before"][name]()
        ratio = a / b if b > 0 else math.inf
        if ratio > TARGET_NETWORKX_RATIO:
            over.append(f"{name} {ratio:.2f}x")
        print(f"  {name:30s} {a:10.2f} {b:10.2f} {ratio:9.2f}x  {'yes' if same else 'NO'}")
    print(f"  over {TARGET_NETWORKX_RATIO:.2f}x: " + (", ".join(over) if over else "none"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sweep", default="100,200,500,1000,2000",
                        help="chain depths for the delay-solver sweep ('' to skip it)")
    parser.add_argument("--before-up-to", type=int, default=1000,
                        help="time the old solver only up to this depth (it takes ~17 s at 2000 layers)")
    parser.add_argument("--before", default=_retiming_before.BEFORE_NETWORKX,
                        help="git revision of the hand-written retiming to time side by side ('' to skip)")
    parser.add_argument("--chain", type=int, default=300,
                        help="also side by side on an mlp chain of this many layers (0 to skip)")
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
    if args.before:
        networkx_side_by_side(args.network, "even:8", max(args.repeat, 5), args.before)
        if args.chain:
            networkx_side_by_side("mlp:" + "-".join(["8"] * args.chain), "even:8", args.repeat, args.before)
    if args.sweep:
        depth_sweep([int(d) for d in args.sweep.split(",")], args.repeat, args.before_up_to)


if __name__ == "__main__":
    main()
