"""The scheduler's longest paths through the retiming package's one solver (issue 13, build 2).

`solve_difference_constraints` with a topological `order` (the one relaxation per constraint the schedulers
use thousands of times per schedule) against its networkx Bellman–Ford path; and the passes of
`layerpipe.schedule._lags` — ASAP times, the timeline's remaining paths, weight-loop lengths and minimal
lags — against their definitions: every constraint met, every value 0 or tight on one of its constraints
(which, in topological order, is the least solution), loop lengths against networkx's DAG longest path.
"""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerpipe.costs import make_cost_model
from layerpipe.dfg import build_training_graph
from layerpipe.network import Network, load_network
from layerpipe.retiming import solve_difference_constraints
from layerpipe.schedule._comm_timing import minimal_lags
from layerpipe.schedule._lags import asap_times, loop_lengths, timeline
from layerpipe.schedule._task_table import TaskTable
from tests.strategies import networks


@st.composite
def ordered_systems(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int], list[int]]:
    """n nodes, a permutation `order` and constraints that run forward in it (self-loops included)."""
    n = draw(st.integers(1, 8))
    order = draw(st.permutations(list(range(n))))
    rows = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(-4, 6)), max_size=16))
    src, dst, bound = [], [], []
    for i, j, b in rows:
        lo, hi = sorted((i, j))
        src.append(order[lo])
        dst.append(order[hi])
        bound.append(b)
    return n, order, src, dst, bound


@settings(max_examples=300, deadline=None)
@given(ordered_systems())
def test_ordered_solver_is_bellman_fords_least_solution(case: tuple[int, list[int], list[int], list[int],
                                                                    list[int]]) -> None:
    n, order, src, dst, bound = case
    fast = solve_difference_constraints(n, src, dst, bound, order=order)
    slow = solve_difference_constraints(n, src, dst, bound)
    if slow is None:  # only a positive self-loop makes a forward system infeasible
        assert fast is None
        assert any(u == v and b > 0 for u, v, b in zip(src, dst, bound, strict=True))
        return
    assert fast is not None
    assert fast.dtype == slow.dtype and fast.tolist() == slow.tolist()
    shuffled = list(range(len(src)))  # the constraints' own order does not matter
    random.Random(len(src)).shuffle(shuffled)
    again = solve_difference_constraints(n, [src[i] for i in shuffled], [dst[i] for i in shuffled],
                                         np.array([bound[i] for i in shuffled]), order=order)
    assert again is not None and again.tolist() == slow.tolist()


def test_a_constraint_against_the_order_falls_back_to_bellman_ford() -> None:
    # 0 → 1 → 2 with order (2, 1, 0): every constraint runs backwards, the answer is still the least one.
    assert solve_difference_constraints(3, [0, 1], [1, 2], [2, 3], order=[2, 1, 0]).tolist() == [0, 2, 5]
    # A positive cycle is infeasible whatever the order hint says.
    assert solve_difference_constraints(2, [0, 1], [1, 0], [1, 0], order=[0, 1]) is None
    assert solve_difference_constraints(2, [0, 1], [1, 0], [1, -1], order=[0, 1]).tolist() == [0, 1]
    assert solve_difference_constraints(2, [1], [1], [1], order=[0, 1]) is None
    assert solve_difference_constraints(2, [], [], [], order=[1, 0]).tolist() == [0, 0]


def test_the_order_must_be_a_permutation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        solve_difference_constraints(3, [0], [1], [1], order=[0, 1])
    with pytest.raises(ValueError, match="permutation"):
        solve_difference_constraints(2, [0], [1], [1], order=[0, 0])


def _edges(table: TaskTable) -> list[tuple[int, int]]:
    return [(u, v) for v, ps in enumerate(table.preds) for u in ps]


def _assert_least(values: list[int], rows: list[tuple[int, int, int]]) -> None:
    """values ≥ 0 meet every row (u, v, b): values[v] ≥ values[u] + b, and each is 0 or tight on a row."""
    assert min(values, default=0) >= 0
    tight = {v for u, v, b in rows if values[v] == values[u] + b}
    for u, v, b in rows:
        assert values[v] >= values[u] + b, (u, v, b)
    assert all(x == 0 or v in tight for v, x in enumerate(values))


def _check_passes(table: TaskTable, rnd: random.Random) -> None:
    edges = _edges(table)
    asap = asap_times(table)
    _assert_least(asap, [(u, v, table.cost[u]) for u, v in edges])

    order = timeline(table, asap)
    assert sorted(order) == list(range(len(table)))
    position = {v: i for i, v in enumerate(order)}
    assert all(position[u] < position[v] for u, v in edges)  # a topological order
    tail = list(table.cost)  # remaining path, by the definition, in reverse topological order
    for v in reversed(table.topo):
        tail[v] = table.cost[v] + max((tail[w] for u, w in edges if u == v), default=0)
    assert order == sorted(range(len(table)), key=lambda v: (asap[v], -tail[v], v))

    for period in (max(table.cost) or 1, max(1, table.total // 3), table.total + 1):
        start = [rnd.randrange(period) for _ in range(len(table))]
        lag = minimal_lags(table, start, period)
        _assert_least(lag, [(u, v, -((start[v] - start[u] - table.cost[u]) // period)) for u, v in edges])

    dag: nx.DiGraph[int] = nx.DiGraph(edges)
    dag.add_nodes_from(range(len(table)))
    lengths = loop_lengths(table)
    for layer, f, u in table.weight_loops():
        if u == f or not nx.has_path(dag, f, u):
            assert lengths[layer] == table.cost[f]
            continue
        between = (nx.descendants(dag, f) & nx.ancestors(dag, u)) | {f, u}
        sub = dag.subgraph(between).copy()
        for a, b in sub.edges:
            sub.edges[a, b]["w"] = table.cost[b]
        assert lengths[layer] == table.cost[f] + nx.dag_longest_path_length(sub, weight="w")


@settings(max_examples=60, deadline=None)
@given(networks(max_layers=10), st.sampled_from(["macs", "pe"]), st.integers(0, 2**16))
def test_scheduler_passes_are_the_least_solutions(net: Network, model: str, seed: int) -> None:
    _check_passes(TaskTable.of(build_training_graph(net), make_cost_model(model)), random.Random(seed))


@pytest.mark.parametrize("spec", ["lenet5", "resnet18"])
def test_scheduler_passes_on_the_zoo(spec: str) -> None:
    _check_passes(TaskTable.of(build_training_graph(load_network(spec)), make_cost_model("pe")), random.Random(13))


@settings(max_examples=60, deadline=None)
@given(networks(max_layers=10), st.sampled_from(["macs", "pe"]))
def test_loop_bounds_are_longest_paths_of_the_loop(net: Network, model: str) -> None:
    # retiming's loop bounds by the same solver: a real F_l ⇝ U_l path over delay-0 edges, as long as
    # networkx's DAG longest path between the two.
    from layerpipe.dfg import iter_loops
    from layerpipe.retiming import loop_bounds

    graph = build_training_graph(net)
    costs = graph.costs(make_cost_model(model))
    dag: nx.DiGraph[object] = nx.DiGraph((e.src, e.dst) for e in graph.edges if e.delay == 0)
    dag.add_nodes_from(graph.tasks)
    loops = dict(iter_loops(graph))
    bounds = loop_bounds(graph, costs, {layer: 2 for layer in loops})
    assert [b.layer for b in bounds] == list(loops)
    for b in bounds:
        weight_edge = loops[b.layer]
        assert b.path[0] == weight_edge.dst and b.path[-1] == weight_edge.src
        assert all(dag.has_edge(u, v) for u, v in zip(b.path, b.path[1:], strict=False))
        assert b.time == sum(costs[t] for t in b.path)
        assert b.delays == weight_edge.delay + 2
        between = (nx.descendants(dag, b.path[0]) & nx.ancestors(dag, b.path[-1])) | {b.path[0], b.path[-1]}
        sub = dag.subgraph(between).copy()
        for u, v in sub.edges:
            sub.edges[u, v]["w"] = costs[v]
        assert b.time == costs[b.path[0]] + nx.dag_longest_path_length(sub, weight="w")
