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
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


class ZeroDelayCycleError(ValueError):
    """A cycle without delays: its iteration bound is infinite (no schedule can run it)."""

    def __init__(self, cycle: list[int]) -> None:
        super().__init__(f"cycle of {len(cycle)} nodes has no delay: the iteration bound is infinite")
        self.cycle = cycle


def find_zero_delay_cycle(n: int, src: Sequence[int], dst: Sequence[int], delay: Sequence[int]) -> list[int] | None:
    """A cycle made only of delay-0 edges (node indices in order), or None if the delay-0 subgraph is a DAG."""
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, v, w in zip(src, dst, delay, strict=True):
        if w == 0:
            indeg[v] += 1
            succ[u].append(v)
            pred[v].append(u)
    ready = [v for v in range(n) if indeg[v] == 0]
    removed = [False] * n
    while ready:
        u = ready.pop()
        removed[u] = True
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    left = [v for v in range(n) if not removed[v]]
    if not left:
        return None
    # Every node left has a delay-0 predecessor that is also left: walk backwards until a node repeats.
    seen: dict[int, int] = {}
    walk: list[int] = []
    v = left[0]
    while v not in seen:
        seen[v] = len(walk)
        walk.append(v)
        v = next(u for u in pred[v] if not removed[u])
    cycle = walk[seen[v]:]
    cycle.reverse()  # the walk followed edges backwards
    return cycle


def _cyclic_core(n: int, src: Sequence[int], dst: Sequence[int]) -> list[bool]:
    """Nodes that can reach a cycle: repeatedly drop nodes without an out-edge to a kept node."""
    outdeg = [0] * n
    pred: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(src, dst, strict=True):
        outdeg[u] += 1
        pred[v].append(u)
    keep = [True] * n
    sinks = [v for v in range(n) if outdeg[v] == 0]
    while sinks:
        v = sinks.pop()
        keep[v] = False
        for u in pred[v]:
            outdeg[u] -= 1
            if outdeg[u] == 0:
                sinks.append(u)
    return keep


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
    keep = _cyclic_core(n, src, dst)
    out: list[list[int]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(zip(src, dst, strict=True)):
        if keep[u] and keep[v]:
            out[u].append(e)
    nodes = [v for v in range(n) if keep[v]]
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
