"""Time the retiming pipeline on ResNet-50: build the DFG, its iteration bound, delays for even:8 / even:16,
and the networkx graph layer: the DFG as a networkx graph and as GraphML, Leiserson–Saxe W/D on LeNet-5.

Run: .venv/bin/python benchmarks/bench_retiming.py [--network resnet50] [--repeat 3]
Prints the best of `repeat` wall-clock times per step (milliseconds) and the results they produced.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50")
    parser.add_argument("--repeat", type=int, default=3)
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


if __name__ == "__main__":
    main()
