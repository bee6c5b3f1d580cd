"""Timed graphs and their retiming (design notes §4; Leiserson & Saxe 1991; Parhi, VLSI DSP Systems ch. 2, 4).

A `TimedGraph` has nodes with computation times t(v) and edges with delays w(e) (iteration distances).
A retiming r: V → ℤ moves delays across nodes: w_r(u→v) = w(u→v) + r(v) − r(u). It is legal when every
w_r ≥ 0; around any cycle the r terms telescope, so no cycle's delay count changes.

What this module computes on such graphs:
- `iteration_bound`: T∞ = max over cycles of Σ t / Σ w — a lower bound on the period of any schedule,
  however retimed or unfolded. Exact (`Fraction`), with a critical cycle, by Howard's policy iteration
  (`_cycle_ratio`); 0 for acyclic graphs; `ZeroDelayCycleError` when a cycle has no delay.
- `clock_period`: the longest zero-delay path (what one period must fit without overlapping iterations).
- `wd_matrices`, `retime_to_period`, `min_period_retiming`: Leiserson–Saxe retiming to a target clock
  period. W(u,v) = fewest delays on a u⇝v path; D(u,v) = most time on a u⇝v path with W(u,v) delays.
  Period c is reachable iff the difference constraints r(u) − r(v) ≤ w(e) (every edge) and
  r(u) − r(v) ≤ W(u,v) − 1 (every pair with D(u,v) > c) are feasible; Bellman–Ford decides.
  W and D come from networkx's Floyd–Warshall (numpy) on one lexicographic key.
- `retiming_violations`, `is_legal_retiming`: legality of a retiming, or of a proposed retimed delay
  assignment: every delay ≥ 0 and every cycle's delay count unchanged. The latter holds iff the change
  w' − w is a potential difference r(v) − r(u); it is checked edge by edge against a spanning forest,
  which is the same as checking the delay count of every fundamental cycle.
- `solve_difference_constraints` (alias `least_retiming`): the solver every pass shares — the pointwise
  least r ≥ 0 with r(dst) ≥ r(src) + b for given (src, dst, b) constraints, by networkx's Bellman–Ford
  from a virtual source, or None if a positive cycle makes it infeasible; given a topological order of an
  acyclic system (the schedulers' lags, start times and loop lengths), one relaxation per constraint.

Graph algorithms are networkx's (topological order, Floyd–Warshall, Goldberg–Radzik's Bellman–Ford,
spanning forest; DAG longest paths are the difference-constraint solver in topological order); Howard's
maximum cycle ratio is our own (`_cycle_ratio`: networkx has none). Training graphs come in through
`layerpipe.retiming._delays` (`timed_graph`, `loop_bounds`, `solve_delays`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from layerpipe.retiming._cycle_ratio import ZeroDelayCycleError, cycle_of, max_cycle_ratio, zero_delay_graph

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "IterationBound",
    "TimedEdge",
    "TimedGraph",
    "ZeroDelayCycleError",
    "clock_period",
    "is_legal_retiming",
    "iteration_bound",
    "least_retiming",
    "min_period_retiming",
    "retime_to_period",
    "retimed_delays",
    "retiming_violations",
    "solve_difference_constraints",
    "wd_matrices",
]


@dataclass(frozen=True)
class TimedEdge:
    src: Hashable
    dst: Hashable
    delay: int


@dataclass(frozen=True)
class TimedGraph:
    """Nodes with computation times and edges with delays; nodes keep their given order."""

    nodes: tuple[Hashable, ...]
    time: Mapping[Hashable, int]
    edges: tuple[TimedEdge, ...]
    #: The builder knows the delay-0 edges are acyclic (a training graph's are, by construction), so
    #: `iteration_bound` does not search for a delay-free cycle.
    zero_delay_acyclic: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError("timed graph: duplicate nodes")
        for v in self.nodes:
            t = self.time.get(v)
            if not isinstance(t, (int, np.integer)) or t < 0:
                raise ValueError(f"timed graph: time of node {v!r} must be an integer >= 0, got {t!r}")
        known = set(self.nodes)
        for e in self.edges:
            if e.src not in known or e.dst not in known:
                raise ValueError(f"timed graph: edge {e.src!r}->{e.dst!r} has an unknown end")
            if e.delay < 0:
                raise ValueError(f"timed graph: edge {e.src!r}->{e.dst!r} has negative delay {e.delay}")

    @staticmethod
    def of_indices(nodes: tuple[Hashable, ...], times: Sequence[int], src: Sequence[int], dst: Sequence[int],
                   delays: Sequence[int], index: Mapping[Any, int] | None = None,
                   zero_delay_acyclic: bool = False) -> TimedGraph:
        """From nodes that are distinct by construction and edges as node indices (a training graph's own
        structure): the checks are on arrays, and the index arrays are kept instead of being looked up again
        from the nodes (hashing ~10⁵ tasks was most of a deep network's delay solve)."""
        times_a = np.asarray(times, dtype=np.int64)
        src_a, dst_a = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        delays_a = np.asarray(delays, dtype=np.int64)
        n = len(nodes)
        if len(times_a) != n or not (len(src_a) == len(dst_a) == len(delays_a)):
            raise ValueError("timed graph: one time per node and one src, dst and delay per edge")
        if n and times_a.min() < 0:
            v = nodes[int(np.argmin(times_a))]
            raise ValueError(f"timed graph: time of node {v!r} must be an integer >= 0, got {int(times_a.min())}")
        if len(src_a) and (min(src_a.min(), dst_a.min()) < 0 or max(src_a.max(), dst_a.max()) >= n):
            raise ValueError("timed graph: an edge has an unknown end")
        if len(delays_a) and delays_a.min() < 0:
            k = int(np.argmin(delays_a))
            raise ValueError(f"timed graph: edge {nodes[src_a[k]]!r}->{nodes[dst_a[k]]!r} has negative delay "
                             f"{int(delays_a[k])}")
        edges = tuple(map(TimedEdge, map(nodes.__getitem__, src_a.tolist()), map(nodes.__getitem__, dst_a.tolist()),
                          delays_a.tolist()))
        graph = object.__new__(TimedGraph)
        object.__setattr__(graph, "nodes", nodes)
        object.__setattr__(graph, "time", dict(zip(nodes, times_a.tolist(), strict=True)))
        object.__setattr__(graph, "edges", edges)
        object.__setattr__(graph, "zero_delay_acyclic", zero_delay_acyclic)
        # the cached properties, already known (cached_property reads the instance dict first)
        graph.__dict__.update(src=src_a, dst=dst_a, delays=delays_a, times=times_a,
                              index=index if index is not None else {v: i for i, v in enumerate(nodes)})
        return graph

    @staticmethod
    def build(time: Mapping[Hashable, int], edges: Iterable[tuple[Hashable, Hashable, int]]) -> TimedGraph:
        """From {node: time} (in node order) and (src, dst, delay) triples."""
        return TimedGraph(tuple(time), dict(time), tuple(TimedEdge(u, v, int(w)) for u, v, w in edges))

    @cached_property
    def index(self) -> dict[Hashable, int]:
        return {v: i for i, v in enumerate(self.nodes)}

    @cached_property
    def src(self) -> np.ndarray:
        return np.array([self.index[e.src] for e in self.edges], dtype=np.int64)

    @cached_property
    def dst(self) -> np.ndarray:
        return np.array([self.index[e.dst] for e in self.edges], dtype=np.int64)

    @cached_property
    def delays(self) -> np.ndarray:
        return np.array([e.delay for e in self.edges], dtype=np.int64)

    @cached_property
    def times(self) -> np.ndarray:
        return np.array([self.time[v] for v in self.nodes], dtype=np.int64)

    def with_delays(self, delays: Sequence[int]) -> TimedGraph:
        """The same graph with new edge delays (aligned with `edges`)."""
        if len(delays) != len(self.edges):
            raise ValueError(f"expected {len(self.edges)} delays, got {len(delays)}")
        edges = tuple(TimedEdge(e.src, e.dst, int(d)) for e, d in zip(self.edges, delays, strict=True))
        return TimedGraph(self.nodes, self.time, edges)

    def retimed(self, r: Mapping[Hashable, int]) -> TimedGraph:
        """The graph with delays w_r(u→v) = w + r(v) − r(u); raises if some w_r < 0."""
        problems = retiming_violations(self, retimed_delays(self, r))
        if problems:
            raise ValueError(f"illegal retiming: {problems[0]}")
        return self.with_delays(retimed_delays(self, r))


def retimed_delays(graph: TimedGraph, r: Mapping[Any, int]) -> list[int]:  # Any: keys are any node type
    """w_r(e) for every edge, in edge order (possibly negative: see `retiming_violations`)."""
    return [e.delay + r.get(e.dst, 0) - r.get(e.src, 0) for e in graph.edges]


# --- iteration bound and clock period -------------------------------------------------------------------


@dataclass(frozen=True)
class IterationBound:
    """T∞ and one critical cycle (nodes in edge order; empty for an acyclic graph)."""

    bound: Fraction
    cycle: tuple[Hashable, ...]
    cycle_time: int
    cycle_delays: int


def iteration_bound(graph: TimedGraph, policy: list[int] | None = None) -> IterationBound:
    """T∞ = max over cycles of (Σ node times) / (Σ edge delays), exactly, by Howard's policy iteration.

    `policy` carries Howard's policy from a graph with the same edges to the next (`max_cycle_ratio`)."""
    ratio, cycle, edges = max_cycle_ratio(len(graph.nodes), graph.src.tolist(), graph.dst.tolist(),
                                          graph.times.tolist(), graph.delays.tolist(),
                                          zero_delay_acyclic=graph.zero_delay_acyclic, policy=policy)
    nodes = tuple(graph.nodes[i] for i in cycle)
    return IterationBound(ratio, nodes, sum(graph.time[v] for v in nodes), sum(graph.edges[e].delay for e in edges))


def _zero_delay_dag(graph: TimedGraph) -> nx.DiGraph[int]:
    """The delay-0 edges as a networkx DAG over node indices; raises `ZeroDelayCycleError` on a cycle."""
    dag = zero_delay_graph(len(graph.nodes), graph.src.tolist(), graph.dst.tolist(), graph.delays.tolist())
    cycle = cycle_of(dag)
    if cycle is not None:
        raise ZeroDelayCycleError(cycle)
    return dag


def clock_period(graph: TimedGraph) -> int:
    """The longest path of node times over delay-0 edges: the critical path of one clock period.

    max over v of a(v) + t(v), a the least solution of a(v) ≥ a(u) + t(u) on the delay-0 edges (the
    earliest starts: `solve_difference_constraints` in networkx's topological order of those edges).
    """
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    n = len(graph.nodes)
    if not n:
        return 0
    dag = zero_delay_graph(n, graph.src.tolist(), graph.dst.tolist(), graph.delays.tolist())
    try:
        order = list(nx.topological_sort(dag))
    except nx.NetworkXUnfeasible:
        raise ZeroDelayCycleError(cycle_of(dag) or []) from None
    order += sorted(set(range(n)).difference(order))  # nodes without a delay-0 edge
    times = graph.times.tolist()
    src, dst = [u for u, _ in dag.edges], [v for _, v in dag.edges]
    start = solve_difference_constraints(n, src, dst, [times[u] for u in src], order=order)
    assert start is not None, "a DAG's difference constraints always have a solution"
    return int((start + graph.times).max())


# --- difference constraints ------------------------------------------------------------------------------


def solve_difference_constraints(n: int, src: np.ndarray | Sequence[int], dst: np.ndarray | Sequence[int],
                                 bound: np.ndarray | Sequence[int],
                                 order: Sequence[int] | None = None) -> np.ndarray | None:
    """The least integer vector r ≥ 0 with r[dst[i]] ≥ r[src[i]] + bound[i] for every i, or None.

    Feasible difference constraints form a lattice, so a least solution exists; it is the longest path
    from a virtual source joined to every node by a 0 edge, i.e. minus the shortest path over weights
    −bound (networkx's Goldberg–Radzik Bellman–Ford; a negative cycle there is a positive cycle of bounds:
    no solution). Of parallel constraints only the largest bound matters.

    `order`, a permutation of 0..n−1, is a hint for acyclic systems (the schedulers' lags and start times
    over one iteration's delay-0 precedence, solved thousands of times per schedule): when every
    constraint runs forward in it, the constraints taken by the position of their `dst` need one
    relaxation each — Bellman–Ford's round in topological order, which is exact on a DAG — with the same
    least solution. A constraint against the order falls back to the networkx Bellman–Ford.
    """
    if len(src) == 0:
        return np.zeros(n, dtype=np.int64)
    us, vs, bs = _as_list(src), _as_list(dst), _as_list(bound)
    if order is not None:
        least = _least_in_order(n, us, vs, bs, order)
        if least is not None:
            return None if least is _INFEASIBLE else np.array(least, dtype=np.int64)
    elif any(u == v and b > 0 for u, v, b in zip(us, vs, bs, strict=True)):
        return None  # r[v] ≥ r[v] + b
    import networkx as nx  # ~0.1 s of import: only off the ordered fast path (`explore` never needs it)

    weight: dict[tuple[int, int], int] = {}
    for u, v, b in zip(us, vs, bs, strict=True):
        if u != v:
            weight[(u, v)] = max(weight.get((u, v), b), b)
    graph: nx.DiGraph[int] = nx.DiGraph()  # the source's edges bring in every node
    graph.add_weighted_edges_from((n, v, 0) for v in range(n))
    graph.add_weighted_edges_from((u, v, -b) for (u, v), b in weight.items())
    try:
        _, dist = nx.goldberg_radzik(graph, n)  # Bellman–Ford with topological scans: ~2x fewer relaxations
    except nx.NetworkXUnbounded:
        return None
    r = np.zeros(n, dtype=np.int64)
    for v in range(n):
        r[v] = -dist[v]
    return r


def _as_list(values: np.ndarray | Sequence[int]) -> list[int] | Sequence[int]:
    return values.tolist() if isinstance(values, np.ndarray) else values  # read only, never copied


#: `_least_in_order`'s answer for a positive self-loop (r[v] ≥ r[v] + b, b > 0): no solution.
_INFEASIBLE: list[int] = []


def _least_in_order(n: int, us: Sequence[int], vs: Sequence[int], bs: Sequence[int],
                    order: Sequence[int]) -> list[int] | None:
    """The least r ≥ 0 when every constraint u→v has u before v in `order` (or u = v), `_INFEASIBLE` for a
    positive self-loop, None when some constraint runs against the order. Constraints are relaxed by the
    position of their head (kept as given when already in that order), so each tail is final when read."""
    pos = [-1] * n
    for i, v in enumerate(order):
        pos[v] = i
    if len(order) != n or -1 in pos:
        raise ValueError(f"order must be a permutation of 0..{n - 1}")
    head = [pos[v] for v in vs]
    last, in_order = -1, True
    for u, p, b in zip(us, head, bs, strict=True):
        tail = pos[u]
        if tail >= p:
            if tail > p:
                return None
            if b > 0:
                return _INFEASIBLE
        if p < last:
            in_order = False
        last = p
    r = [0] * n
    if in_order:
        for u, v, b in zip(us, vs, bs, strict=True):
            if r[u] + b > r[v]:
                r[v] = r[u] + b
        return r
    for i in sorted(range(len(us)), key=head.__getitem__):
        need = r[us[i]] + bs[i]
        if need > r[vs[i]]:
            r[vs[i]] = need
    return r


#: The name the passes have used since the first solver; the same function.
least_retiming = solve_difference_constraints


# --- legality ----------------------------------------------------------------------------------------------


def retiming_violations(graph: TimedGraph, new_delays: Sequence[int]) -> list[str]:
    """Why `new_delays` (aligned with the edges) is not a legal retiming of `graph`; [] if it is.

    Legal means every delay ≥ 0 and every cycle keeps its delay count. The second condition is checked as
    the equivalent statement that the changes w' − w are r(dst) − r(src) for some r: r is propagated over a
    spanning forest (undirected), and an edge that disagrees closes a fundamental cycle whose delay count
    changed.
    """
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    if len(new_delays) != len(graph.edges):
        return [f"expected {len(graph.edges)} delays, got {len(new_delays)}"]
    problems = [f"edge {e.src}->{e.dst} has {d} delays after retiming (must be >= 0)"
                for e, d in zip(graph.edges, new_delays, strict=True) if d < 0]
    change = [int(d) - e.delay for e, d in zip(graph.edges, new_delays, strict=True)]
    src, dst = graph.src.tolist(), graph.dst.tolist()
    first: dict[tuple[int, int], int] = {}  # an unordered node pair → its first edge (the tree edge if any)
    for k, (u, v) in enumerate(zip(src, dst, strict=True)):
        first.setdefault((u, v) if u <= v else (v, u), k)
    forest: nx.Graph[int] = nx.Graph()  # undirected: a tree edge may be walked against its direction
    forest.add_nodes_from(range(len(graph.nodes)))
    forest.add_edges_from(first)
    r = [0] * len(graph.nodes)  # every component's root (its first node) at 0
    for a, b in nx.dfs_edges(forest):  # the spanning trees of all components, in node order
        k = first[(a, b) if a <= b else (b, a)]
        r[b] = r[a] + change[k] if src[k] == a else r[a] - change[k]
    for k, e in enumerate(graph.edges):
        if r[dst[k]] - r[src[k]] != change[k]:
            problems.append(f"edge {e.src}->{e.dst} closes a cycle whose delay count changed")
    return problems


def is_legal_retiming(graph: TimedGraph, r: Mapping[Hashable, int]) -> bool:
    """Every retimed delay w(e) + r(v) − r(u) ≥ 0 (cycles keep their delays by construction of w_r)."""
    return not retiming_violations(graph, retimed_delays(graph, r))


# --- Leiserson–Saxe ---------------------------------------------------------------------------------------


def wd_matrices(graph: TimedGraph) -> tuple[np.ndarray, np.ndarray]:
    """W and D of Leiserson–Saxe by Floyd–Warshall (O(n³), for small graphs); W = -1 where v is unreachable.

    One shortest-path run on the lexicographic weight (w(e), −t(u)) encoded as w(e)·K − t(u) with K larger
    than any path's total time: the shortest key gives the fewest delays, then the most time among those.
    networkx's `floyd_warshall_numpy` works in float64, exact for integers below 2**53; larger keys are
    refused rather than rounded.
    """
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    n = len(graph.nodes)
    _zero_delay_dag(graph)  # raises on a delay-free cycle, whose lexicographic weight would be negative
    scale = int(graph.times.sum()) + 1
    max_key = (int(graph.delays.sum()) + 1) * scale
    if max_key >= 2**52:
        raise ValueError("graph too large for the exact float64 W/D encoding")
    times = graph.times.tolist()
    smallest: dict[tuple[int, int], int] = {}  # parallel edges: only the smallest key can be on a shortest path
    for u, v, w in zip(graph.src.tolist(), graph.dst.tolist(), graph.delays.tolist(), strict=True):
        k = w * scale - times[u]
        if k < smallest.get((u, v), k + 1):
            smallest[(u, v)] = k
    simple: nx.DiGraph[int] = nx.DiGraph()
    simple.add_nodes_from(range(n))
    simple.add_weighted_edges_from((u, v, k) for (u, v), k in smallest.items())
    dist = nx.floyd_warshall_numpy(simple, nodelist=range(n)) if n else np.zeros((0, 0))
    inf = np.iinfo(np.int64).max // 4
    key = np.where(np.isinf(dist), inf, dist).astype(np.int64)
    reachable = key < inf // 2
    w_mat = np.where(reachable, -((-key) // scale), -1)
    path_time = w_mat * scale - key  # time of every node on the path but the last
    d_mat = np.where(reachable, path_time + graph.times[None, :], -1)
    return w_mat, d_mat


def retime_to_period(graph: TimedGraph, period: int,
                     wd: tuple[np.ndarray, np.ndarray] | None = None) -> dict[Hashable, int] | None:
    """A legal retiming whose clock period is ≤ `period` (the least r ≥ 0), or None if there is none."""
    if len(graph.nodes) and int(graph.times.max()) > period:
        return None
    w_mat, d_mat = wd if wd is not None else wd_matrices(graph)
    # Constraints r(dst) ≥ r(src) + b: w_r(u→v) ≥ 0 reads r(v) ≥ r(u) − w; a too-long u⇝v path needs a
    # delay after retiming: W(u,v) + r(v) − r(u) ≥ 1.
    us, vs = np.nonzero((d_mat > period) & (w_mat >= 0))
    src = np.concatenate([graph.src, us])
    dst = np.concatenate([graph.dst, vs])
    bound = np.concatenate([-graph.delays, 1 - w_mat[us, vs]])
    r = least_retiming(len(graph.nodes), src, dst, bound)
    if r is None:
        return None
    return {v: int(r[i]) for i, v in enumerate(graph.nodes)}


def min_period_retiming(graph: TimedGraph) -> tuple[int, dict[Hashable, int]]:
    """The smallest clock period reachable by retiming and a retiming reaching it (binary search over D)."""
    wd = wd_matrices(graph)
    floor = int(graph.times.max()) if len(graph.nodes) else 0
    candidates = sorted({int(d) for d in np.unique(wd[1]) if d >= floor} | {floor})
    lo, hi = 0, len(candidates) - 1
    best = retime_to_period(graph, candidates[hi], wd)
    assert best is not None, "the largest D is always reachable without retiming"
    while lo < hi:
        mid = (lo + hi) // 2
        r = retime_to_period(graph, candidates[mid], wd)
        if r is None:
            lo = mid + 1
        else:
            hi, best = mid, r
    return candidates[lo], best
