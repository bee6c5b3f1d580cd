"""Longest paths over one iteration's delay-0 precedence (design notes §5): the critical-path shape, the
weight-loop lengths, and the lags a placement and its start offsets need.

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

from layerpipe.schedule._task_table import TaskTable


def asap_times(table: TaskTable) -> list[int]:
    """Earliest start of every task of one iteration with unlimited processors."""
    start = [0] * len(table)
    for v in table.topo:  # tasks are stored in topological order
        start[v] = max((start[u] + table.cost[u] for u in table.preds[v]), default=0)
    return start


def loop_lengths(table: TaskTable) -> dict[int, int]:
    """T_loop(l): the longest chain of work from the start of F_l to the end of U_l (one weight loop)."""
    succs: list[list[int]] = [[] for _ in table.tasks]
    for v, ps in enumerate(table.preds):
        for u in ps:
            succs[u].append(v)
    out: dict[int, int] = {}
    for layer, f, u in table.weight_loops():
        dist = {f: table.cost[f]}
        for v in table.topo[f:]:  # topological order: everything reachable from f comes after it
            if v in dist:
                for w in succs[v]:
                    dist[w] = max(dist.get(w, 0), dist[v] + table.cost[w])
        out[layer] = dist.get(u, table.cost[f])
    return out


def timeline(table: TaskTable, asap: Sequence[int]) -> list[int]:
    """A topological order that follows one iteration's critical shape: by ASAP start, then the task with the
    longer remaining path first (so E_l comes before the G_l nothing waits on)."""
    tail = [0] * len(table)
    succs: list[list[int]] = [[] for _ in table.tasks]
    for v, ps in enumerate(table.preds):
        for u in ps:
            succs[u].append(v)
    for v in reversed(table.topo):
        tail[v] = table.cost[v] + max((tail[w] for w in succs[v]), default=0)
    return sorted(range(len(table)), key=lambda v: (asap[v], -tail[v], v))


def _longest_lags(table: TaskTable, start: Sequence[int], period: int,
                  arrival: dict[tuple[int, int], int]) -> list[int]:
    lag = [0] * len(table)
    for v in table.topo:
        for u in table.preds[v]:
            ready = arrival.get((u, v), start[u] + table.cost[u])
            need = lag[u] - ((start[v] - ready) // period)  # lag_u + ceil((ready − start_v) / P)
            if need > lag[v]:
                lag[v] = need
    return lag


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
