"""issue 14's "before": Howard's maximum cycle ratio as it was (commit 7337b52), kept only so that
benchmarks/bench_retiming.py can time it side by side with `layerpipe.retiming._cycle_ratio` in one run.

Fraction comparisons in the hot loop and no in-round propagation (a better ratio moves one edge per
round, so the rounds grow with depth). Not used by the package; the graph helpers are the package's.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from layerpipe.retiming._cycle_ratio import ZeroDelayCycleError, cycle_of, zero_delay_graph


def max_cycle_ratio(
    n: int, src: Sequence[int], dst: Sequence[int], time: Sequence[int], delay: Sequence[int]
) -> tuple[Fraction, list[int], list[int]]:
    """The maximum over cycles of Σ time / Σ delay, and one cycle attaining it as node and edge indices.

    The cycle's nodes are in edge order (edge i leaves node i). Returns (0, [], []) for an acyclic graph.
    Raises `ZeroDelayCycleError` if some cycle has no delay.
    """
    zero = cycle_of(zero_delay_graph(n, src, dst, delay))  # networkx, as before
    if zero is not None:
        raise ZeroDelayCycleError(zero)
    inside = _cyclic_edges_networkx(n, src, dst)
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


def _cyclic_edges_networkx(n: int, src: Sequence[int], dst: Sequence[int]) -> list[bool]:
    """Edges inside one strongly connected component, by networkx (as before issue 14)."""
    import networkx as nx

    graph: nx.DiGraph[int] = nx.DiGraph(zip(src, dst, strict=True))
    component = {v: k for k, members in enumerate(nx.strongly_connected_components(graph)) for v in members}
    return [component[u] == component[v] for u, v in zip(src, dst, strict=True)]
