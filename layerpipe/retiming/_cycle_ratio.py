"""Maximum cycle ratio by Howard's policy iteration, in exact rational arithmetic.

The iteration bound of a dataflow graph is T∞ = max over cycles C of (Σ_{v∈C} t(v)) / (Σ_{e∈C} w(e)),
node times t over edge delays w. Enumerating cycles is exponential; Howard's algorithm (Cochet-Terrasson,
Cohen, Gaubert, McGettrick, Quadrat 1998; Dasdan's survey 2004 found it the fastest in practice) iterates
over *policies* — one chosen out-edge per node — and converges in a handful of rounds even on graphs of
thousands of edges.

A policy makes every node point at one successor, so each node reaches exactly one policy cycle. Value
determination gives each node the ratio η of the cycle it reaches and a potential x with
x(v) = t(v) − η·w(π(v)) + x(succ(v)) (x = 0 at a canonical root of each cycle). Improvement first moves
nodes towards successors of larger η; when no such move exists, it moves a node to an edge with the same η
and a strictly larger x-value. When neither applies, every edge v→u satisfies η(u) ≤ η(v) and
x(v) ≥ t(v) − η·w + x(u); summing the latter around any cycle proves no cycle beats the policy's best.

All arithmetic is exact — ratios are `Fraction`s, potentials integers scaled by the ratio's denominator —
so there is no tolerance to tune; ties keep the current edge (strict improvement only), which together
with the fixed root rule makes the iteration terminate. Graphs are given as index arrays: node count,
edge sources, edge targets, node times, edge delays.

Why hand-written: networkx has no maximum cycle ratio (nor mean) algorithm, and enumerating its
`simple_cycles` is exponential; the graph work around it (strongly connected components, the zero-delay
cycle search) is networkx's.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import networkx as nx


class ZeroDelayCycleError(ValueError):
    """A cycle without delays: its iteration bound is infinite (no schedule can run it)."""

    def __init__(self, cycle: list[int]) -> None:
        super().__init__(f"cycle of {len(cycle)} nodes has no delay: the iteration bound is infinite")
        self.cycle = cycle


def zero_delay_graph(n: int, src: Sequence[int], dst: Sequence[int], delay: Sequence[int]) -> nx.DiGraph[int]:
    """The delay-0 edges over nodes 0..n−1, in edge order (so networkx's traversals are deterministic).

    Nodes without a delay-0 edge are left out: no cycle or path passes them, and adding 300 nodes one by
    one costs as much as the cycle check itself.
    """
    graph: nx.DiGraph[int] = nx.DiGraph()
    graph.add_edges_from((u, v) for u, v, w in zip(src, dst, delay, strict=True) if w == 0)
    return graph


def find_zero_delay_cycle(n: int, src: Sequence[int], dst: Sequence[int], delay: Sequence[int]) -> list[int] | None:
    """A cycle made only of delay-0 edges (node indices in edge order), or None if the delay-0 subgraph is a DAG."""
    return cycle_of(zero_delay_graph(n, src, dst, delay))


def cycle_of(graph: nx.DiGraph[int]) -> list[int] | None:
    """A cycle of `graph` (nodes in edge order), or None for a DAG."""
    if nx.is_directed_acyclic_graph(graph):  # a topological sort: far cheaper than find_cycle's edge DFS
        return None
    return [int(u) for u, _ in nx.find_cycle(graph)]


def _cyclic_edges(n: int, src: Sequence[int], dst: Sequence[int]) -> list[bool]:
    """Edges that lie inside one strongly connected component: only those can be on a cycle.

    Every node of a nontrivial component (or with a self-loop) keeps an out-edge inside it, which is what
    the policy iteration needs: each node must point somewhere a cycle can close.
    """
    graph: nx.DiGraph[int] = nx.DiGraph(zip(src, dst, strict=True))  # every end of an edge is a node
    component = {v: k for k, members in enumerate(nx.strongly_connected_components(graph)) for v in members}
    return [component[u] == component[v] for u, v in zip(src, dst, strict=True)]


def max_cycle_ratio(
    n: int, src: Sequence[int], dst: Sequence[int], time: Sequence[int], delay: Sequence[int]
) -> tuple[Fraction, list[int], list[int]]:
    """The maximum over cycles of Σ time / Σ delay, and one cycle attaining it as node and edge indices.

    The cycle's nodes are in edge order (edge i leaves node i). Returns (0, [], []) for an acyclic graph.
    Raises `ZeroDelayCycleError` if some cycle has no delay.
    """
    zero = find_zero_delay_cycle(n, src, dst, delay)
    if zero is not None:
        raise ZeroDelayCycleError(zero)
    inside = _cyclic_edges(n, src, dst)
    out: list[list[int]] = [[] for _ in range(n)]
    for e, u in enumerate(src):
        if inside[e]:
            out[u].append(e)
    nodes = [v for v in range(n) if out[v]]
    if not nodes:
        return Fraction(0), [], []

    # Start from the out-edge with the fewest delays: cycles of few delays tend to have large ratios.
    policy = {v: min(out[v], key=lambda e: (delay[e], e)) for v in nodes}
    while True:
        eta, x, cycles = _evaluate(nodes, policy, dst, time, delay)
        if not _improve(nodes, out, policy, eta, x, dst, time, delay):
            break
    best = max(cycles, key=lambda c: (eta[c[0]], -c[0]))
    return eta[best[0]], best, [policy[v] for v in best]


def _evaluate(
    nodes: list[int], policy: dict[int, int], dst: Sequence[int], time: Sequence[int], delay: Sequence[int]
) -> tuple[dict[int, Fraction], dict[int, int], list[list[int]]]:
    """Value determination: the ratio η = p/q of the cycle each node reaches and the potentials x.

    Potentials are kept as integers q·x (q the denominator of the node's own η), so that the second
    improvement phase, which only compares nodes of equal η, works on plain ints.
    """
    eta: dict[int, Fraction] = {}
    x: dict[int, int] = {}
    cycles: list[list[int]] = []
    on_walk: dict[int, int] = {}
    for start in nodes:
        if start in eta:
            continue
        walk: list[int] = []
        on_walk.clear()
        v = start
        while v not in eta and v not in on_walk:
            on_walk[v] = len(walk)
            walk.append(v)
            v = dst[policy[v]]
        if v in on_walk:  # closed a new policy cycle: evaluate it from its smallest node
            cycle = walk[on_walk[v]:]
            k = cycle.index(min(cycle))
            cycle = cycle[k:] + cycle[:k]
            ratio = Fraction(sum(time[u] for u in cycle), sum(delay[policy[u]] for u in cycle))
            p, q = ratio.numerator, ratio.denominator
            root = cycle[0]
            eta[root], x[root] = ratio, 0
            for u in reversed(cycle[1:]):
                eta[u] = ratio
                x[u] = q * time[u] - p * delay[policy[u]] + x[dst[policy[u]]]
            cycles.append(cycle)
            walk = walk[: on_walk[v]]
        for u in reversed(walk):  # the tail leading into an evaluated node
            nxt = dst[policy[u]]
            ratio = eta[u] = eta[nxt]
            x[u] = ratio.denominator * time[u] - ratio.numerator * delay[policy[u]] + x[nxt]
    return eta, x, cycles


def _improve(
    nodes: list[int],
    out: list[list[int]],
    policy: dict[int, int],
    eta: dict[int, Fraction],
    x: dict[int, int],
    dst: Sequence[int],
    time: Sequence[int],
    delay: Sequence[int],
) -> bool:
    """One policy improvement step; False when the policy is optimal."""
    changed = False
    for v in nodes:  # first: head for a successor whose cycle has a larger ratio
        best = max(out[v], key=lambda e: (eta[dst[e]], -e))
        if eta[dst[best]] > eta[v]:
            policy[v] = best
            changed = True
    if changed:
        return True
    for v in nodes:  # then: among equal ratios, take a strictly larger potential (both scaled by q)
        current, ratio = x[v], eta[v]
        p, q = ratio.numerator, ratio.denominator
        for e in out[v]:
            u = dst[e]
            if eta[u] is ratio or eta[u] == ratio:
                value = q * time[v] - p * delay[e] + x[u]
                if value > current:
                    current, policy[v] = value, e
                    changed = True
    return changed
