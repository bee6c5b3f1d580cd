"""Iteration distances on a periodic schedule's happens-before graph: the ring-buffer and link-queue depths
of the compiler (`hdl/_compiler.py`).

A slot of a per-iteration buffer may be rewritten only after every reader of the older iteration has run.
Rather than trusting the timing (stalls, resets change it), the depths come from happens-before: if reader(t)
must precede writer(t + d) along program order and data edges, d slots suffice. `Distances` measures d on the
periodic graph (the steady state); `UnrolledDistances` also on the unrolled op graph of the first
iterations, where paths through ops of iterations < 0 (skipped by the prologue) do not exist yet, and the
larger of the two is used. `UnrolledDistances.versions` does the same for rings of weight versions read at
max(0, t + c). The graph algorithms are networkx's (Bellman-Ford shortest paths and the negative-cycle test on
the periodic graph, a topological sort of the unrolled one).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from layerpipe.errors import InputError
from layerpipe.schedule import Slot

__all__ = ["DataEdge", "Distances", "TaskKey", "UnrolledDistances"]

TaskKey = tuple[str, int]
DataEdge = tuple[TaskKey, TaskKey, int]  #: (producer, consumer, delay): consumer(t + delay) needs producer(t)


class Distances:
    """Shortest iteration distances on the periodic happens-before graph.

    Nodes are tasks. Program order: entry i → entry i+1 of the same period moves from iteration j − λ_i to
    j − λ_{i+1} (weight λ_i − λ_{i+1}); the last entry → the first of the next period adds 1. Data edges
    src → dst with delay δ (dst(t + δ) needs src(t): δ = 0 for the values of one iteration, s + 1 for a weight
    copy U_l(t) → F_l(t + s + 1)) have weight δ. dist(Y, X) = d means Y(t) ⇝ X(t + d).
    """

    def __init__(self, bodies: list[list[Slot]], data_edges: Sequence[DataEdge]):
        # Parallel edges keep their smallest weight: shortest paths are the same.
        graph: nx.DiGraph = nx.DiGraph()

        def edge(u: TaskKey, v: TaskKey, w: int) -> None:
            if not graph.has_edge(u, v) or graph[u][v]["weight"] > w:
                graph.add_edge(u, v, weight=w)

        for body in bodies:
            for i, s in enumerate(body):
                nxt = body[(i + 1) % len(body)]
                edge((s.kind, s.layer), (nxt.kind, nxt.layer), s.lag - nxt.lag + (1 if i + 1 == len(body) else 0))
        for src, dst, delay in data_edges:
            edge(src, dst, delay)
        if nx.negative_edge_cycle(graph, weight="weight"):
            raise InputError("the periodic schedule deadlocks: a dependency cycle does not advance an iteration")
        self.graph = graph
        self._cache: dict[TaskKey, dict[TaskKey, int]] = {}

    def __call__(self, src: TaskKey, dst: TaskKey) -> int:
        if src not in self._cache:
            # Bellman-Ford (weights may be negative; no negative cycle, checked above).
            lengths = (nx.single_source_bellman_ford_path_length(self.graph, src, weight="weight")
                       if src in self.graph else {src: 0})
            self._cache[src] = {v: int(d) for v, d in lengths.items()}
        return self._cache[src].get(dst, 1 << 30)


class UnrolledDistances:
    """Iteration distances that also hold in the prologue, where the steady-state paths may not exist.

    A steady-state path Y(t) ⇝ X(t + d) can pass through ops of iterations < 0, which are skipped: early in
    a run the producer can then run further ahead than d. So the distance is also measured on the unrolled
    op graph of the first `window` iterations (program order of every PE, data edges of existing ops): for
    each t, the smallest iteration of X reachable from Y(t). Where none is reachable the producer is not
    held back at all, and the depth must cover every later iteration of the window. The result is the
    larger of the two, so ring slots are never rewritten before their readers end, whatever the timing.
    """

    def __init__(self, bodies: list[list[Slot]], data_edges: Sequence[DataEdge], steady: Distances,
                 samples: int) -> None:
        self.steady = steady
        max_lag = max((s.lag for body in bodies for s in body), default=0)
        horizon = 4 * (max_lag + 2) + 16
        self.window = min(samples, horizon)
        self.exact = samples <= horizon  # the window is the whole run
        # Ops of each PE in program order; node = (task, t).
        self.succ: dict[tuple[TaskKey, int], list[tuple[TaskKey, int]]] = {}
        for body in bodies:
            prev = None
            for j in range(self.window + max_lag):
                for slot in body:
                    t = j - slot.lag
                    if 0 <= t < self.window:
                        node = ((slot.kind, slot.layer), t)
                        self.succ[node] = []
                        if prev is not None:
                            self.succ[prev].append(node)
                        prev = node
        for src, dst, delay in data_edges:
            for t in range(self.window):
                if (src, t) in self.succ and (dst, t + delay) in self.succ:
                    self.succ[(src, t)].append((dst, t + delay))
        graph: nx.DiGraph = nx.DiGraph()
        graph.add_nodes_from(self.succ)
        graph.add_edges_from((n, m) for n, outs in self.succ.items() for m in outs)
        try:
            order = list(nx.topological_sort(graph))
        except nx.NetworkXUnfeasible:
            raise InputError("the periodic schedule deadlocks in its first iterations (a dependency cycle)") from None
        self.order = order
        self._reach: dict[TaskKey, dict[tuple[TaskKey, int], int]] = {}

    def _min_reach(self, target: TaskKey) -> dict[tuple[TaskKey, int], int]:
        """For every op, the smallest iteration of `target` reachable from it (itself included)."""
        if target not in self._reach:
            inf = 1 << 30
            best: dict[tuple[TaskKey, int], int] = {}
            for node in reversed(self.order):
                here = node[1] if node[0] == target else inf
                best[node] = min([here, *(best[m] for m in self.succ[node])])
            self._reach[target] = best
        return self._reach[target]

    def versions(self, reader: TaskKey, update: TaskKey, offset: int) -> int:
        """Slots a ring of versions needs so that version v = max(0, t + offset), read by reader(t), survives
        until reader(t) has run: its slot is rewritten by (or after) update(v + depth − 1), so reader(t) ⇝
        update(v + depth − 1) must hold. Early iterations read version 0 (the clamp), hence per-t terms."""
        need = self.steady(reader, update) - offset + 1
        reach = self._min_reach(update)
        last = self.window if self.exact else self.window // 2
        for t in range(last):
            r = reach.get((reader, t))
            if r is not None:
                need = max(need, (r if r < (1 << 30) else self.window) - max(0, t + offset) + 1)
        return need

    def __call__(self, reader: TaskKey, producer: TaskKey) -> int:
        d = self.steady(reader, producer)
        reach = self._min_reach(producer)
        # Without the whole run in the window, its last iterations lack the paths a longer run has.
        last = self.window if self.exact else self.window // 2
        for t in range(last):
            r = reach.get((reader, t))
            if r is None:
                continue
            d = max(d, r - t if r < (1 << 30) else self.window - t)
        return d
