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

All arithmetic is exact integers — a ratio is a pair (p, q) in lowest terms with q > 0, compared by
cross-multiplication (p·q' vs p'·q), potentials integers scaled by the ratio's q — so there is no
tolerance to tune and no `Fraction` in the loop (its comparisons were 40 % of the time, issue 14); ties
keep the current edge (strict improvement only), which together with the fixed root rule makes the
iteration terminate. Graphs are given as index arrays: node count, edge sources, edge targets, node
times, edge delays.

In-round propagation (our addition; the paper's first phase uses the values of the last evaluation
only): a node that moves to a successor of larger η takes that η at once, and its predecessors are looked
at again in the same round, a worklist over the in-edges. Plain Howard moves the better η one edge per
round, so on a chain of L layers the rounds grew with L (~144 at 500 layers) and the solver was
quadratic. Termination is kept: take the last node of a policy cycle to move in a round — its value
rose to its successor's, yet values never decrease along policy edges, so going round the cycle back to
it gives a contradiction. The new policy's cycles are therefore old cycles, every node reaches a cycle
at least as good as the value it was given, and each moved node strictly gains — Howard's measure.

Why hand-written: networkx has no maximum cycle ratio (nor mean) algorithm, and enumerating its
`simple_cycles` is exponential. The strongly connected components and the zero-delay acyclicity check
are list code here too (building networkx graphs for them was most of the time on 1000-layer chains);
the zero-delay cycle a message reports is still networkx's `find_cycle`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from fractions import Fraction
from math import gcd
from typing import TYPE_CHECKING

from layerpipe.dfg import topological_order

if TYPE_CHECKING:
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
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    graph: nx.DiGraph[int] = nx.DiGraph()
    graph.add_edges_from((u, v) for u, v, w in zip(src, dst, delay, strict=True) if w == 0)
    return graph


def find_zero_delay_cycle(n: int, src: Sequence[int], dst: Sequence[int], delay: Sequence[int]) -> list[int] | None:
    """A cycle made only of delay-0 edges (node indices in edge order), or None if the delay-0 subgraph is a DAG.

    The common answer (a DAG) comes from Kahn's topological sort on plain lists (`layerpipe.dfg.topological_order`);
    networkx finds the cycle to report only when there is one, so the message names the same cycle as before.
    """
    if topological_order(n, [(u, v) for u, v, w in zip(src, dst, delay, strict=True) if w == 0]) is not None:
        return None
    return cycle_of(zero_delay_graph(n, src, dst, delay))


def cycle_of(graph: nx.DiGraph[int]) -> list[int] | None:
    """A cycle of `graph` (nodes in edge order), or None for a DAG."""
    import networkx as nx  # ~0.1 s of import: loaded when used, not with the package

    if nx.is_directed_acyclic_graph(graph):  # a topological sort: far cheaper than find_cycle's edge DFS
        return None
    return [int(u) for u, _ in nx.find_cycle(graph)]


def _cyclic_edges(n: int, src: Sequence[int], dst: Sequence[int]) -> list[bool]:
    """Edges that lie inside one strongly connected component: only those can be on a cycle.

    Every node of a nontrivial component (or with a self-loop) keeps an out-edge inside it, which is what
    the policy iteration needs: each node must point somewhere a cycle can close. Tarjan's algorithm
    (SIAM J. Comput. 1972), iterative, on index lists: building a networkx graph for its
    `strongly_connected_components` cost more than the whole policy iteration at 1000 layers (issue 14).
    """
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(src, dst, strict=True):
        succ[u].append(v)
    index = [-1] * n  # discovery order
    low = [0] * n
    component = [-1] * n
    stack: list[int] = []
    count = found = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = count
        count += 1
        stack.append(root)
        frames = [(root, 0)]  # (node, next successor position)
        while frames:
            v, i = frames[-1]
            if i < len(succ[v]):
                frames[-1] = (v, i + 1)
                u = succ[v][i]
                if index[u] < 0:
                    index[u] = low[u] = count
                    count += 1
                    stack.append(u)
                    frames.append((u, 0))
                elif component[u] < 0 and index[u] < low[v]:  # on the stack: same component as v
                    low[v] = index[u]
                continue
            frames.pop()
            if frames and low[v] < low[frames[-1][0]]:
                low[frames[-1][0]] = low[v]
            if low[v] == index[v]:  # v is the root of a component: pop it
                while True:
                    u = stack.pop()
                    component[u] = found
                    if u == v:
                        break
                found += 1
    return [component[u] == component[v] for u, v in zip(src, dst, strict=True)]


def max_cycle_ratio(
    n: int, src: Sequence[int], dst: Sequence[int], time: Sequence[int], delay: Sequence[int], *,
    zero_delay_acyclic: bool = False, policy: list[int] | None = None,
) -> tuple[Fraction, list[int], list[int]]:
    """The maximum over cycles of Σ time / Σ delay, and one cycle attaining it as node and edge indices.

    The cycle's nodes are in edge order (edge i leaves node i). Returns (0, [], []) for an acyclic graph.
    Raises `ZeroDelayCycleError` if some cycle has no delay; `zero_delay_acyclic` says the caller knows there
    is none (a training graph's delay-0 edges are acyclic by construction) and skips the search.

    `policy` carries Howard's policy between graphs with the same edges (only times and delays differ, as a
    training graph before and after its gradient delays): a list of one out-edge per node starts the
    iteration there (nodes whose edge is not one of theirs start as usual), and on return it holds this
    run's final policy (an empty list: start as usual, then hold it). Howard converges from any policy; a
    start near the answer saves rounds (8 → 3 on a 1000-layer chain's delays).
    """
    zero = None if zero_delay_acyclic else find_zero_delay_cycle(n, src, dst, delay)
    if zero is not None:
        raise ZeroDelayCycleError(zero)
    inside = _cyclic_edges(n, src, dst)
    out: list[list[int]] = [[] for _ in range(n)]
    into: list[list[int]] = [[] for _ in range(n)]  # predecessors over cyclic edges, for the propagation
    for e, u in enumerate(src):
        if inside[e]:
            out[u].append(e)
            into[dst[e]].append(u)
    nodes = [v for v in range(n) if out[v]]
    if not nodes:
        return Fraction(0), [], []

    # Start from the out-edge with the fewest delays (cycles of few delays tend to have large ratios), or from
    # the given policy where it names one of the node's cyclic out-edges.
    given = policy if policy is not None and len(policy) == n else None
    start = [-1] * n
    for v in nodes:
        e = given[v] if given is not None else -1
        start[v] = e if 0 <= e < len(src) and src[e] == v and inside[e] else min(out[v], key=lambda k: (delay[k], k))
    if policy is not None:
        policy[:] = start  # the caller's list becomes this run's policy (updated in place below)
    else:
        policy = start
    num, den, x = [0] * n, [1] * n, [0] * n
    while True:
        cycles = _evaluate(nodes, policy, dst, time, delay, num, den, x)
        if not _improve_ratio(nodes, out, into, policy, dst, num, den) and \
                not _improve_potential(nodes, out, policy, dst, time, delay, num, den, x):
            break
    # the policy cycle of the largest ratio, the smallest root among equals (ratios compared exactly)
    best = cycles[0]
    for cycle in cycles[1:]:
        r, b = cycle[0], best[0]
        if num[r] * den[b] > num[b] * den[r] or (num[r] * den[b] == num[b] * den[r] and r < b):
            best = cycle
    return Fraction(num[best[0]], den[best[0]]), best, [policy[v] for v in best]


def _evaluate(
    nodes: list[int], policy: list[int], dst: Sequence[int], time: Sequence[int], delay: Sequence[int],
    num: list[int], den: list[int], x: list[int],
) -> list[list[int]]:
    """Value determination, in place: the ratio η = num/den of the cycle each node reaches and the potentials x.

    Potentials are kept as integers den·x, so that the second improvement phase, which only compares nodes
    of equal η, works on plain ints. Returns the policy cycles, each rotated to start at its smallest node.
    """
    done = bytearray(len(num))  # 1 once a node's η and x are set this round
    cycles: list[list[int]] = []
    on_walk: dict[int, int] = {}
    for start in nodes:
        if done[start]:
            continue
        walk: list[int] = []
        on_walk.clear()
        v = start
        while not done[v] and v not in on_walk:
            on_walk[v] = len(walk)
            walk.append(v)
            v = dst[policy[v]]
        if not done[v]:  # closed a new policy cycle: evaluate it from its smallest node
            cycle = walk[on_walk[v]:]
            k = cycle.index(min(cycle))
            cycle = cycle[k:] + cycle[:k]
            total, delays = sum(time[u] for u in cycle), sum(delay[policy[u]] for u in cycle)
            g = gcd(total, delays)
            p, q = total // g, delays // g
            root = cycle[0]
            num[root], den[root], x[root], done[root] = p, q, 0, 1
            for u in reversed(cycle[1:]):
                num[u], den[u], done[u] = p, q, 1
                x[u] = q * time[u] - p * delay[policy[u]] + x[dst[policy[u]]]
            cycles.append(cycle)
            walk = walk[: on_walk[v]]
        for u in reversed(walk):  # the tail leading into an evaluated node
            nxt = dst[policy[u]]
            p, q = num[u], den[u] = num[nxt], den[nxt]
            x[u] = q * time[u] - p * delay[policy[u]] + x[nxt]
            done[u] = 1
    return cycles


def _improve_ratio(
    nodes: list[int], out: list[list[int]], into: list[list[int]], policy: list[int], dst: Sequence[int],
    num: list[int], den: list[int],
) -> bool:
    """First improvement phase: head for a successor of larger η, propagated within the round (module doc).

    Updates the policy and, as working values, `num`/`den` (the next evaluation recomputes them exactly).
    False if no node moved.
    """
    changed = False
    queued = bytearray(len(num))
    work = deque(nodes)
    for v in nodes:
        queued[v] = 1
    while work:
        v = work.popleft()
        queued[v] = 0
        p, q, best = num[v], den[v], -1
        for e in out[v]:  # the largest successor η, the smallest edge among equals
            u = dst[e]
            if num[u] * q > p * den[u]:
                p, q, best = num[u], den[u], e
        if best < 0:
            continue
        policy[v], num[v], den[v] = best, p, q
        changed = True
        for u in into[v]:
            if not queued[u]:
                queued[u] = 1
                work.append(u)
    return changed


def _improve_potential(
    nodes: list[int], out: list[list[int]], policy: list[int], dst: Sequence[int], time: Sequence[int],
    delay: Sequence[int], num: list[int], den: list[int], x: list[int],
) -> bool:
    """Second improvement phase: among successors of equal η, a strictly larger potential (both scaled by den)."""
    changed = False
    for v in nodes:
        current, p, q = x[v], num[v], den[v]
        tv = q * time[v]
        for e in out[v]:
            u = dst[e]
            if num[u] == p and den[u] == q:  # lowest terms: equal ratios have equal pairs
                value = tv - p * delay[e] + x[u]
                if value > current:
                    current, policy[v] = value, e
                    changed = True
    return changed
