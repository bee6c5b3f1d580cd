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
"""

from __future__ import annotations

from collections.abc import Sequence

from layerpipe.retiming import solve_difference_constraints
from layerpipe.schedule._task_table import TaskTable, memo


def _solve(table: TaskTable, src: list[int], dst: list[int], bound: list[int], order: Sequence[int]) -> list[int]:
    """The least r ≥ 0 with r[dst] ≥ r[src] + bound (the retiming package's solver; `order` a topological
    order of the constraints). One iteration's delay-0 precedence is acyclic, so there is always one."""
    r = solve_difference_constraints(len(table), src, dst, bound, order=order)
    if r is None:
        raise AssertionError("difference constraints over delay-0 precedence have no solution")
    return r.tolist()


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
        if len(_LOOPS) >= _TIMELINES_KEPT:
            _LOOPS.pop(next(iter(_LOOPS)))  # oldest first
        found = _LOOPS[table.token] = _loop_lengths(table)
    return dict(found)


#: `loop_lengths`' memo by table content: the bounded search and the result's bound ask for the same table's.
_LOOPS: dict[int, dict[int, int]] = memo({})


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
        if len(_TIMELINES) >= _TIMELINES_KEPT:
            _TIMELINES.pop(next(iter(_TIMELINES)))  # oldest first
        dst, src = table.precedence
        rest = _solve(table, src, dst, [table.cost[w] for w in src], table.topo[::-1])
        tail = [c + r for c, r in zip(table.cost, rest, strict=True)]
        found = _TIMELINES[key] = tuple(sorted(range(len(table)), key=lambda v: (asap[v], -tail[v], v)))
    return list(found)


#: `timeline`'s memo by (table content, ASAP starts): every candidate placement of a search asks for its table's
#: (`_bodies.default_targets`).
_TIMELINES: dict[tuple[object, ...], tuple[int, ...]] = memo({})
_TIMELINES_KEPT = 32


def _longest_lags(table: TaskTable, start: Sequence[int], period: int,
                  arrival: dict[tuple[int, int], int]) -> list[int]:
    """The least lags ≥ 0 with lag_v ≥ lag_u + ⌈(ready_uv − start_v)/P⌉ on every delay-0 edge u→v, ready_uv
    the end of u or the planned arrival of its transfer (the retiming package's solver)."""
    src, _ = table.precedence
    ready = [start[u] + table.cost[u] for u in src]
    if arrival:
        edge = table.edge_index
        for pair, at in arrival.items():
            e = edge.get(pair)
            if e is not None:
                ready[e] = at
    return lags_from_ready(table, start, period, ready)


def lags_from_ready(table: TaskTable, start: Sequence[int], period: int, ready: Sequence[int]) -> list[int]:
    """`_longest_lags` with ready_uv given per precedence edge (aligned with `table.precedence`).

    When the table's edges run forward in index order (`TaskTable.forward`: every table the policies build),
    the least solution is one sweep over the edges in their order, relaxing lag_v ≥ lag_u + bound — what
    `solve_difference_constraints` does given that order, without checking the order on every call (the lag
    pass runs thousands of times per schedule); otherwise the solver itself."""
    src, dst = table.precedence
    if not table.forward:
        return _solve(table, src, dst, [-((start[v] - at) // period) for v, at in zip(dst, ready, strict=True)],
                      table.topo)
    r = [0] * len(table)
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
