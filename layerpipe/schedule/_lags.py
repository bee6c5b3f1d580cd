"""Longest paths over one iteration's delay-0 precedence (design notes §5): the critical-path shape, the
weight-loop lengths, and the lags a placement and its start offsets need. Every one is a system of difference
constraints solved by the retiming package's one solver (`solve_difference_constraints`, in topological order:
retiming is the scheduler's core — the lags of a periodic schedule are a retiming of its training graph).

- `asap_times`    — start times of one iteration on unlimited processors (the critical-path shape).
- `timeline`      — one iteration's tasks in critical-path order (ASAP start, then longer remaining path).
- `loop_lengths`  — T_loop(l), the longest chain of work from the start of F_l to the end of U_l.
- `_longest_lags` — the smallest legal lags for starts and transfer arrivals: a longest path over the delay-0
                    edges, lag_v ≥ lag_u + ⌈(ready_uv − start_v)/P⌉ (`_comm_timing.minimal_lags` wraps it).
- `loop_spans` / `staleness_from_span` — per weight layer, the cycles from F_l to U_l's weights being readable,
                    and the staleness that span gives.
- `StalenessFloor` — a floor under the staleness of any timing of given starts, from the longest lag path
                    F_l → U_l (the bounded search rules probes out with it before planning their transfers).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from layerpipe._memo import BoundedMemo
from layerpipe.interconnect import Interconnect
from layerpipe.retiming import solve_difference_constraints
from layerpipe.schedule._task_table import TaskTable


def _solve(table: TaskTable, src: list[int], dst: list[int], bound: list[int], order: Sequence[int]) -> list[int]:
    """The least r ≥ 0 with r[dst] ≥ r[src] + bound (the retiming package's solver; `order` a topological
    order of the constraints). One iteration's delay-0 precedence is acyclic, so there is always one."""
    r = solve_difference_constraints(len(table), src, dst, bound, order=order)
    if r is None:
        raise AssertionError("difference constraints over delay-0 precedence have no solution")
    return r.tolist()


def _raised(table: TaskTable, src: list[int], dst: list[int], bound: list[int], r: list[int]) -> list[int]:
    """The least solution ≥ r of r[dst] ≥ r[src] + bound: each task's incoming constraints relaxed in a
    topological order of the (acyclic) delay-0 precedence."""
    into: list[list[tuple[int, int]]] = [[] for _ in range(len(table))]
    for u, v, b in zip(src, dst, bound, strict=True):
        into[v].append((u, b))
    for v in table.topo:
        for u, b in into[v]:
            if r[u] + b > r[v]:
                r[v] = r[u] + b
    return r


def asap_times(table: TaskTable) -> list[int]:
    """Earliest start of every task of one iteration with unlimited processors: the least start ≥ 0 with
    start_v ≥ start_u + c_u on every delay-0 edge u→v."""
    src, dst = table.precedence
    return _solve(table, src, dst, [table.cost[u] for u in src], table.topo)


def loop_lengths(table: TaskTable) -> dict[int, int]:
    """T_loop(l): the longest chain of work from the start of F_l to the end of U_l (one weight loop).

    One system per loop over every delay-0 edge, r_w ≥ r_v + c_w, plus a virtual node z (r_z = 0) with
    r_F ≥ r_z + M, M above any path's work: a node reachable from F_l gets M + its longest path from F_l,
    any other less than M. U_l out of reach leaves F_l alone (c_F)."""
    found = _LOOPS.get(table.token)
    if found is None:
        found = _LOOPS.add(table.token, _loop_lengths(table))
    return dict(found)


#: `loop_lengths`' memo by table content: the bounded search and the result's bound ask for the same table's.
_LOOPS: BoundedMemo[int, dict[int, int]] = BoundedMemo(32)


def _loop_lengths(table: TaskTable) -> dict[int, int]:
    n = len(table)
    src, dst = table.precedence
    big = table.total + 1
    order = [n, *table.topo]
    bound = [table.cost[w] for w in dst]
    out: dict[int, int] = {}
    for layer, f, u in table.weight_loops():
        r = solve_difference_constraints(n + 1, [n, *src], [f, *dst], [big, *bound], order=order)
        if r is None:
            raise AssertionError("difference constraints over delay-0 precedence have no solution")
        after = int(r[u]) - big
        out[layer] = table.cost[f] + (after if after >= 0 else 0)
    return out


def timeline(table: TaskTable, asap: Sequence[int]) -> list[int]:
    """A topological order that follows one iteration's critical shape: by ASAP start, then the task with the
    longer remaining path first (so E_l comes before the G_l nothing waits on).

    The remaining path of v is c_v + r_v for the least r ≥ 0 with r_u ≥ r_w + c_w on every edge u→w (the
    constraints run against the edges: the reversed topological order is theirs)."""
    key = (table.token, tuple(asap))
    found = _TIMELINES.get(key)
    if found is None:
        dst, src = table.precedence
        rest = _solve(table, src, dst, [table.cost[w] for w in src], table.topo[::-1])
        tail = [c + r for c, r in zip(table.cost, rest, strict=True)]
        found = _TIMELINES.add(key, tuple(sorted(range(len(table)), key=lambda v: (asap[v], -tail[v], v))))
    return list(found)


#: `timeline`'s memo by (table content, ASAP starts): every candidate placement of a search asks for its table's
#: (`_bodies.default_targets`).
_TIMELINES: BoundedMemo[tuple[object, ...], tuple[int, ...]] = BoundedMemo(32)


def _longest_lags(table: TaskTable, start: Sequence[int], period: int,
                  arrival: dict[tuple[int, int], int], floor: Sequence[int] | None = None) -> list[int]:
    """The least lags ≥ 0 (≥ `floor` when given) with lag_v ≥ lag_u + ⌈(ready_uv − start_v)/P⌉ on every
    delay-0 edge u→v, ready_uv the end of u or the planned arrival of its transfer (the retiming package's
    solver)."""
    src, _ = table.precedence
    cost = table.cost
    ready = [start[u] + cost[u] for u in src]
    if arrival:
        edge = table.edge_index
        for pair, at in arrival.items():
            e = edge.get(pair)
            if e is not None:
                ready[e] = at
    return lags_from_ready(table, start, period, ready, floor)


def lags_from_ready(table: TaskTable, start: Sequence[int], period: int, ready: Sequence[int],
                    floor: Sequence[int] | None = None) -> list[int]:
    """`_longest_lags` with ready_uv given per precedence edge (aligned with `table.precedence`).

    When the table's edges run forward in index order (`TaskTable.forward`: every table the policies build),
    the least solution is one sweep over the edges in their order, relaxing lag_v ≥ lag_u + bound — what
    `solve_difference_constraints` does given that order, without checking the order on every call (the lag
    pass runs thousands of times per schedule); otherwise the solver itself, then relaxed from `floor` in
    topological order. With a `floor` the sweep starts from it, so a raised lag carries to its successors:
    the larger of a floor and the least solution from zero is not a solution (a raised producer's consumer
    would start before its input arrives)."""
    src, dst = table.precedence
    if not table.forward:
        bound = [-((start[v] - at) // period) for v, at in zip(dst, ready, strict=True)]
        least = _solve(table, src, dst, bound, table.topo)
        if floor is None:
            return least
        return _raised(table, src, dst, bound, [max(a, b) for a, b in zip(least, floor, strict=True)])
    r = [0] * len(table) if floor is None else list(floor)
    for u, v, at in zip(src, dst, ready, strict=True):
        need = r[u] - ((start[v] - at) // period)
        if need > r[v]:
            r[v] = need
    return r


def loop_spans(table: TaskTable, start: Sequence[int], lag: Sequence[int], period: int,
               arrival: dict[tuple[int, int], int] | None = None) -> dict[int, int]:
    """Per weight layer: cycles from the start of F_l(t) to U_l(t)'s weights being readable by F_l — the end
    of U_l(t), or the arrival of its transfer when F_l runs elsewhere — in the periodic timing.

    F_l(t + k) reads g_l(t) only if those weights are there, so a span ≤ (k+1)·P means staleness ≤ k.
    """
    arrival = arrival or {}
    return {layer: (lag[u] - lag[f]) * period + arrival.get((u, f), start[u] + table.cost[u]) - start[f]
            for layer, f, u in table.weight_loops()}


def staleness_from_span(span: int, period: int) -> int:
    return max(0, -(-span // period) - 1)


# --- the staleness floor ------------------------------------------------------------------------------------
# LayerPipe's bounded search (`_layerpipe._bounded`) probes periods: at each it list-schedules a placement and
# its starts, then plans the transfers on the interconnect (`_comm_timing.timed`: channel packing and lags) to
# learn the staleness, and the probe fails when some layer's exceeds the bound k. On resnet18 at N = 6 and 8
# under k = 4 every probe below the serial fallback fails, and the planning is most of each probe's cost.
#
# The floor needs no packing. Whatever the channels do, a transfer arrives no earlier than its producer's end
# plus its hold and the latency (`_comm.pack`: a transfer departs at or after its release), so the lags `timed`
# returns satisfy, on every precedence edge u→v, lag_v − lag_u ≥ ⌈(start_u + c_u + x_uv − start_v)/P⌉ with x_uv
# that uncontended transfer time when u and v are on different processors (0 on `shared`, and 0 for the listed
# lags of a list schedule, which hold without transfers). Along every path from F_l to U_l those bounds add up,
# so lag_U − lag_F is at least the longest such path, and the span from F_l to U_l's weights being readable
# (`loop_spans`: readable no earlier than U_l's end) gives a staleness at least the one that span gives.
# A layer whose floor is above k proves the probe fails; the timing it would have computed is never needed.
#
# Only a couple of layers are tried per probe (the one that proved the last failure, then the longest loop):
# each costs one sweep over the loop's edges, a fraction of a timing, and a probe that succeeds pays for them.

#: Layers tried per probe: the last layer that proved a failure, then the longest loops.
TRIES = 2

_UNREACHED = -(1 << 62)


class StalenessFloor:
    """The floor for one table on one interconnect, over the placements and starts of one search."""

    def __init__(self, table: TaskTable, interconnect: Interconnect) -> None:
        self.table = table
        self.usable = table.forward  # edges by head in topological (index) order: one sweep is a longest path
        src, dst = table.precedence
        self.src, self.dst, self.cost = src, dst, table.cost
        # Uncontended transfer time of each edge when its ends are apart (the least over edges of one pair)
        least: dict[tuple[int, int], int] = {}
        if not interconnect.is_shared:
            for v, ps in enumerate(table.preds):
                for u, w in zip(ps, table.pred_words[v], strict=True):
                    x = interconnect.transfer_cycles(w)
                    least[(u, v)] = min(least.get((u, v), x), x)
        self.transfer = [least.get((u, v), 0) for u, v in zip(src, dst, strict=True)]
        lengths = loop_lengths(table)
        # The longest loops first: their F runs earliest and reads the stalest weights
        self.loops = sorted(table.weight_loops(), key=lambda loop: (-lengths.get(loop[0], 0), loop[0]))
        self.last: tuple[int, int, int] | None = None
        self._edges: dict[tuple[int, int, int], list[tuple[int, int, int, int, int, int]]] = {}  # `_loop_edges`
        self._heads: dict[tuple[int, int, int], list[int]] = {}  # the heads of those edges

    def layer_floor(self, loop: tuple[int, int, int], placement: Sequence[int], start: Sequence[int],
                    period: int) -> int:
        """The least staleness layer `loop` = (layer, F task, U task) can have under any lags these starts and
        the placement's transfers allow."""
        _, f, u = loop
        edges = self._loop_edges(loop)
        if not edges:
            return 0  # no path from F to U
        # The longest lag path from f over the loop's edges (`_loop_edges`), by head in index order: every edge
        # into a task is relaxed before any edge out of it is read. Tasks by their place among the loop's heads
        # (f: −1, the last entry)
        reach = [_UNREACHED] * len(self._heads[loop]) + [0]
        for a, b, i, j, c_a, x in edges:
            need = reach[i] - ((start[b] - (start[a] + c_a + (x if placement[a] != placement[b] else 0))) // period)
            if need > reach[j]:
                reach[j] = need
        return staleness_from_span(reach[-2] * period + start[u] + self.cost[u] - start[f], period)

    def _loop_edges(self, loop: tuple[int, int, int]) -> list[tuple[int, int, int, int, int, int]]:
        """(tail, head, their places in `layer_floor`'s lags, cost of the tail, transfer when apart) of the edges
        on some path from the loop's F to its U, by head in index order (the table's edge order): the only edges
        whose relaxation reaches U. Found once per loop; the probes of a search read them for every placement."""
        found = self._edges.get(loop)
        if found is None:
            _, f, u = loop
            src, dst, cost, transfer = self.src, self.dst, self.cost, self.transfer
            span = range(bisect_right(dst, f), bisect_right(dst, u))  # heads f+1..u: a path from f runs forward
            ahead = {f}
            for e in span:
                if src[e] in ahead:
                    ahead.add(dst[e])
            behind = {u}  # tasks with a path to u
            for e in reversed(span):
                if dst[e] in behind:
                    behind.add(src[e])
            kept = [e for e in span if src[e] in ahead and dst[e] in behind]
            heads = self._heads[loop] = sorted({dst[e] for e in kept})  # u last: every kept path ends there
            place = {v: i for i, v in enumerate(heads)}
            place[f] = -1
            found = self._edges[loop] = [(src[e], dst[e], place[src[e]], place[dst[e]], cost[src[e]], transfer[e])
                                         for e in kept]
        return found

    def above(self, placement: Sequence[int], start: Sequence[int], period: int, bound: int) -> bool:
        """Whether some layer's floor (of the few tried) is above `bound`: every timing of these starts on this
        placement then has a staleness above it."""
        if not self.usable or period <= 0:
            return False
        tried = [self.last] if self.last is not None else []
        tried += [loop for loop in self.loops[:TRIES] if loop not in tried]
        for loop in tried[:TRIES]:
            if self.layer_floor(loop, placement, start, period) > bound:
                self.last = loop
                return True
        return False
