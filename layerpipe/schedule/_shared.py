"""Passes every layer-level policy is built from (design notes §5).

A periodic schedule is fixed by three choices: which processor runs each task (placement), where in the
period each task starts (start offsets; a processor's body), and the iteration lag of each task. The
policies differ only in how they make the first two; the lags always come from `minimal_lags`.

- `TaskTable`     — the training graph in index form: costs, delay-0 precedence, a topological order.
- `asap_times`    — start times of one iteration on unlimited processors (the critical-path shape).
- `balance`       — LPT (or a given start) plus move/swap repair: items (tasks or groups of tasks) onto N
                    processors, minimising the largest load, which is the period of a gap-free body.
- `timeline` / `timeline_partition` — one iteration's tasks in critical-path order, cut into N runs.
- `order_bodies` / `contiguous_starts` — a processor's tasks in a chosen order, packed from offset 0.
- `pack_circular` — a body packed around the period at or after target offsets (a task may wrap past P).
- `best_ordering` — the body orders and packings worth trying for a placement, best by staleness.
- `minimal_lags`  — the smallest legal lags for a placement and starts: a longest path over the delay-0
                    edges, lag_v ≥ lag_u + ⌈(start_u + c_u − start_v)/P⌉.
- `modulo_list_schedule` — placement and starts together, each task at its earliest fit after its
                    producers in a per-processor modulo reservation table (used under a staleness bound,
                    where how early the backward of a layer comes back matters, not only the load).
- `partition_contiguous` — min-max split of a sequence into contiguous parts (from `layerpipe.stages`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from layerpipe.costs import CostModel
from layerpipe.dfg import Task, TrainingGraph
from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._comm import Comm, channel_timing
from layerpipe.schedule._deps import layer_task_edges
from layerpipe.schedule._ir import PeriodicSchedule, Slot
from layerpipe.stages import partition_contiguous  # the one contiguous partitioner; re-exported for the policies


@dataclass(frozen=True)
class TaskTable:
    """A training graph in index form for the scheduling passes."""

    graph: TrainingGraph
    tasks: tuple[Task, ...]
    cost: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]  # delay-0 precedence predecessors (the dependency rules of `_deps`)
    topo: tuple[int, ...]
    #: Words each precedence edge carries, aligned with `preds` (what crosses when the ends are apart).
    pred_words: tuple[tuple[int, ...], ...] = ()
    #: Weight reads (U task, reader task, |W| words): the reader gets every new version from U.
    weight_reads: tuple[tuple[int, int, int], ...] = ()

    @staticmethod
    def of(graph: TrainingGraph, model: CostModel) -> TaskTable:
        costs = graph.costs(model)
        order = graph.intra_iteration_order()
        index = {t: i for i, t in enumerate(order)}
        words: list[dict[int, int]] = [{} for _ in order]
        for e in layer_task_edges(graph):
            if e.delay == 0:
                u, v = index[Task(e.src[1], e.src[0])], index[Task(e.dst[1], e.dst[0])]
                words[v][u] = words[v].get(u, 0) + e.words
        preds = tuple(tuple(sorted(w)) for w in words)
        reads = tuple(sorted((index[e.src], index[e.dst], e.words) for e in graph.edges if e.role == "weights"))
        return TaskTable(graph, tuple(order), tuple(costs[t] for t in order), preds, tuple(range(len(order))),
                         tuple(tuple(words[v][u] for u in ps) for v, ps in enumerate(preds)), reads)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def total(self) -> int:
        return sum(self.cost)

    def weight_loops(self) -> list[tuple[int, int, int]]:
        """(layer, index of the task holding F_l, index of the task holding U_l) per weight layer."""
        where = {(t.layer, a): i for i, t in enumerate(self.tasks) for a in t.kind}
        return [(t.layer, where[(t.layer, "F")], i) for i, t in enumerate(self.tasks) if t.has("U")]


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


# ------------------------------------------------------------------------------------------- balance


def balance(weights: Sequence[int], num_procs: int, initial: Sequence[int] | None = None,
            rounds: int = 2000) -> list[int]:
    """Items onto processors minimising the largest load: LPT (or `initial`), then moves and swaps off the
    busiest processor while they lower it. Deterministic (ties by index). Returns each item's processor."""
    proc = [0] * len(weights)
    members: list[list[int]] = [[] for _ in range(num_procs)]
    load = [0] * num_procs
    if initial is not None:
        for i, p in enumerate(initial):
            proc[i] = p
            members[p].append(i)
            load[p] += weights[i]
    else:
        heap = [(0, p) for p in range(num_procs)]
        for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
            lo, p = heapq.heappop(heap)
            proc[i] = p
            members[p].append(i)
            load[p] = lo + weights[i]
            heapq.heappush(heap, (load[p], p))
    for _ in range(rounds):
        if not _improve_busiest(weights, proc, members, load):
            break
    return proc


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


def timeline_partition(weights: Sequence[int], order: Sequence[int], num_procs: int) -> list[int]:
    """Processor per item: `order` cut into min(N, n) contiguous runs of min-max load, run k on processor k.
    Consecutive work shares a processor, so a body holds one stretch of the iteration and its offsets
    follow the iteration's own timeline (few lag increments, low staleness)."""
    runs = partition_contiguous([weights[i] for i in order], min(num_procs, len(order)))
    proc = [0] * len(weights)
    for k, run in enumerate(runs):
        for pos in run:
            proc[order[pos]] = k
    return proc


def prefix_targets(table: TaskTable, order: Sequence[int]) -> list[int]:
    """Start of each task if the iteration ran serially in `order`."""
    at, out = 0, [0] * len(table)
    for v in order:
        out[v] = at
        at += table.cost[v]
    return out


def _improve_busiest(weights: Sequence[int], proc: list[int], members: list[list[int]], load: list[int]) -> bool:
    """One move or swap that lowers the busiest processor without raising any other to its load.

    For item i (weight w) on the busiest processor and a processor q, a swap with j changes both loads by
    d = w − w_j; the best d is the one closest to (peak − load_q)/2, found by bisection in q's sorted weights.
    """
    top = max(range(len(load)), key=lambda p: (load[p], -p))
    peak = load[top]
    best: tuple[int, int, int, int] | None = None  # (new pair max, item, to-proc, swapped item or -1)
    by_weight = [sorted((weights[j], j) for j in members[q]) for q in range(len(load))]
    for i in members[top]:
        w = weights[i]
        for q in range(len(load)):
            room = peak - load[q]
            if q == top or room <= 0:
                continue
            if w < room:
                key = max(peak - w, load[q] + w)
                if best is None or key < best[0]:
                    best = (key, i, q, -1)
            ws = by_weight[q]
            # want w_j = w − d with 0 < d < room, d near room/2: w_j near w − room/2
            k = bisect.bisect_left(ws, (w - room // 2, -1))
            for cand in (k - 1, k):
                if 0 <= cand < len(ws):
                    d = w - ws[cand][0]
                    if 0 < d < room:
                        key = max(peak - d, load[q] + d)
                        if best is None or key < best[0]:
                            best = (key, i, q, ws[cand][1])
    if best is None:
        return False
    _, i, q, j = best
    _move(i, top, q, weights, proc, members, load)
    if j >= 0:
        _move(j, q, top, weights, proc, members, load)
    return True


def _move(i: int, src: int, dst: int, weights: Sequence[int], proc: list[int], members: list[list[int]],
          load: list[int]) -> None:
    members[src].remove(i)
    members[dst].append(i)
    load[src] -= weights[i]
    load[dst] += weights[i]
    proc[i] = dst


# ------------------------------------------------------------------------------------ bodies and lags


def order_bodies(placement: Sequence[int], num_procs: int, key: Callable[[int], tuple]) -> list[list[int]]:
    """Each processor's tasks sorted by `key`."""
    bodies: list[list[int]] = [[] for _ in range(num_procs)]
    for v, p in enumerate(placement):
        bodies[p].append(v)
    return [sorted(body, key=key) for body in bodies]


def contiguous_starts(bodies: Sequence[Sequence[int]], cost: Sequence[int]) -> list[int]:
    """Pack every body from offset 0 in its order, without gaps."""
    start = [0] * len(cost)
    for body in bodies:
        at = 0
        for v in body:
            start[v] = at
            at += cost[v]
    return start


def minimal_lags(table: TaskTable, start: Sequence[int], period: int, comm: Comm | None = None) -> list[int]:
    """The smallest non-negative lags under which every delay-0 edge u→v is met:
    (lag_v − lag_u)·P + start_v ≥ ready_uv, i.e. lag_v ≥ lag_u + ⌈(ready_uv − start_v)/P⌉, where ready_uv is
    start_u + c_u, or the planned arrival of the transfer when `comm` puts u and v on different processors.

    A longest path in topological order; the order edges U_l(t−1) → U_l(t) hold for any lags (one slot
    per period), and weight edges are version reads, not precedence.
    """
    return comm_timing(table, start, period, comm)[0]


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


#: Rounds of re-planning the channels with the consumers' plan times (their program order) as the tie order.
COMM_ROUNDS = 4


def comm_timing(table: TaskTable, start: Sequence[int], period: int,
                comm: Comm | None = None) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Minimal lags and the planned arrival offset of every transfer (`_comm.channel_timing`).

    The queue order of one producer's consumers on a channel is their program order, which depends on the
    lags; the channels are planned with the start offsets first, then with the resulting plan times, until
    the lags stop changing.
    """
    if comm is None or comm.free:
        return _longest_lags(table, start, period, {}), {}
    arrival = channel_timing(table, comm, start, period)
    lag = _longest_lags(table, start, period, arrival)
    for _ in range(COMM_ROUNDS):
        plan = [lag[v] * period + start[v] for v in range(len(table))]
        arrival = channel_timing(table, comm, start, period, plan)
        again = _longest_lags(table, start, period, arrival)
        if again == lag:
            break
        lag = again
    return lag, arrival


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


def periodic_from(table: TaskTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int],
                  period: int, num_procs: int, arrival: dict[tuple[int, int], int] | None = None) -> PeriodicSchedule:
    """The IR form of a timing; `arrival` (planned transfers) sets how late each remote weight read sees a
    new version (`PeriodicSchedule.read_delays`)."""
    bodies: list[list[Slot]] = [[] for _ in range(num_procs)]
    for v, t in enumerate(table.tasks):
        bodies[placement[v]].append(Slot(start[v], t.kind, t.layer, lag[v]))
    costs = {(t.kind, t.layer): c for t, c in zip(table.tasks, table.cost, strict=True)}
    delays = {}
    for u, x, _ in table.weight_reads:
        if arrival and (u, x) in arrival:
            delays[(table.tasks[x].kind, table.tasks[x].layer)] = arrival[(u, x)] - start[u] - table.cost[u]
    return PeriodicSchedule(period, tuple(tuple(sorted(b)) for b in bodies), costs, delays)


# ------------------------------------------------------------------------- modulo list scheduling


def modulo_list_schedule(
    table: TaskTable,
    period: int,
    num_procs: int,
    priority: Sequence[int],
    group: Sequence[int] | None = None,
    fixed: Sequence[int] | None = None,
) -> tuple[list[int], list[int]] | None:
    """Place and time tasks one by one in `priority` (a topological order): each goes to the processor
    where it can start earliest after its producers, in a free interval of that processor's period.

    `group[v]` ties tasks to one processor (the first placed picks it, with room for the whole group);
    `fixed[v]` pins a task to a processor. Returns (placement, absolute start of iteration 0) or None
    when some task finds no free interval (fragmentation or load above the period).
    """
    n = len(table)
    free: list[list[tuple[int, int]]] = [[(0, period)] for _ in range(num_procs)]
    room = [period] * num_procs  # free cycles not yet promised to a started group
    group_cost: dict[int, int] = {}
    group_proc: dict[int, int] = {}
    if group is not None:
        for v in range(n):
            group_cost[group[v]] = group_cost.get(group[v], 0) + table.cost[v]
    proc = [-1] * n
    sigma = [0] * n
    for v in priority:
        c = table.cost[v]
        ready = max((sigma[u] + table.cost[u] for u in table.preds[v]), default=0)
        g = group[v] if group is not None else None
        if fixed is not None:
            candidates: Sequence[int] = (fixed[v],)
        elif g is not None and g in group_proc:
            candidates = (group_proc[g],)
        else:
            candidates = range(num_procs)
        best: tuple[int, int] | None = None
        for p in candidates:
            if g is not None and g not in group_proc and room[p] < group_cost[g]:
                continue
            at = _earliest_fit(free[p], ready, c, period)
            if at is not None and (best is None or at < best[0]):
                best = (at, p)
        if best is None:
            return None
        at, p = best
        _occupy(free[p], at % period, c)
        if g is None:
            room[p] -= c
        elif g not in group_proc:
            group_proc[g] = p
            room[p] -= group_cost[g]
        proc[v], sigma[v] = p, at
    return proc, sigma


def _earliest_fit(free: list[tuple[int, int]], ready: int, cost: int, period: int) -> int | None:
    if cost == 0:
        return ready
    offset = ready % period
    base = ready - offset
    for a, b in free:
        s = max(a, offset)
        if s + cost <= b:
            return base + s
    for a, b in free:
        if b - a >= cost:
            return base + period + a
    return None


def _occupy(free: list[tuple[int, int]], start: int, cost: int) -> None:
    if cost == 0:
        return
    for k, (a, b) in enumerate(free):
        if a <= start and start + cost <= b:
            pieces = [(x, y) for x, y in ((a, start), (start + cost, b)) if y > x]
            free[k : k + 1] = pieces
            return
    raise AssertionError("occupy outside a free interval")


# ------------------------------------------------------------------------------- choosing an order


@dataclass(frozen=True)
class Timing:
    """Starts and lags of a placement, with the per-layer staleness they give."""

    start: list[int]
    lag: list[int]
    staleness: dict[int, int]
    #: Planned arrival of every transfer (u, v), from the start of u's period (empty on `shared`).
    arrival: dict[tuple[int, int], int] = field(default_factory=dict)

    def score(self) -> tuple[int, int, int]:
        """Smaller is better: worst staleness, total staleness, deepest lag (activation memory)."""
        return (max(self.staleness.values(), default=0), sum(self.staleness.values()), max(self.lag, default=0))


def time_bodies(table: TaskTable, bodies: Sequence[Sequence[int]], period: int, comm: Comm | None = None) -> Timing:
    """Gap-free starts in the given body orders and the minimal lags for them."""
    return timed(table, contiguous_starts(bodies, table.cost), period, comm)


def timed(table: TaskTable, start: list[int], period: int, comm: Comm | None = None) -> Timing:
    """The minimal lags for these starts (transfers planned on `comm`) and the staleness they give."""
    lag, arrival = comm_timing(table, start, period, comm)
    return timing_of(table, start, lag, period, arrival)


def timing_of(table: TaskTable, start: list[int], lag: list[int], period: int,
              arrival: dict[tuple[int, int], int] | None = None) -> Timing:
    spans = loop_spans(table, start, lag, period, arrival)
    return Timing(start, lag, {layer: staleness_from_span(s, period) for layer, s in spans.items()},
                  dict(arrival or {}))


def best_ordering(
    table: TaskTable, placement: Sequence[int], num_procs: int, period: int, keys: Sequence[Callable[[int], tuple]],
    targets: Sequence[Sequence[int]] = (), interconnect: Interconnect = SHARED,
) -> Timing:
    """The best (by `Timing.score`) of: gap-free bodies in each order of `keys`, and, for each target
    timing in `targets`, bodies ordered by target offset and packed around the period (`pack_circular`).
    Transfers between processors are planned on `interconnect` (the period must fit its busiest channel)."""
    comm = Comm(placement, interconnect, num_procs)
    candidates = [time_bodies(table, order_bodies(placement, num_procs, key), period, comm) for key in keys]
    candidates += [_pack_to(table, placement, num_procs, period, target, comm) for target in targets]
    return min(candidates, key=Timing.score)


def _pack_to(table: TaskTable, placement: Sequence[int], num_procs: int, period: int,
             target: Sequence[int], comm: Comm | None = None) -> Timing:
    """Bodies ordered by target offset, packed around the period at or after those offsets, minimal lags."""
    bodies = order_bodies(placement, num_procs, lambda v: (target[v] % period, target[v], v))
    return pack_bodies(table, bodies, period, target, comm)


def pack_bodies(table: TaskTable, bodies: Sequence[Sequence[int]], period: int, target: Sequence[int],
                comm: Comm | None = None) -> Timing:
    """Bodies in the given orders packed around the period, each task at or after its target offset
    (`pack_circular`), with the minimal lags for those starts."""
    start = [0] * len(table)
    for body in bodies:
        for v, at in zip(body, pack_circular([target[v] % period for v in body], [table.cost[v] for v in body],
                                             period), strict=True):
            start[v] = at
    return timed(table, start, period, comm)


def pack_circular(release: Sequence[int], cost: Sequence[int], period: int) -> list[int]:
    """Starts (mod P) for tasks in the given order, each at or after its release offset, without overlap
    around the period (a task may wrap past P). The load must be ≤ P.

    Tasks go one after another from `carry`, the cycle the previous period's last task ends (relative to
    this period); the carry is raised to its fixpoint, which exists because the body fits in P.
    """
    if not release:
        return []
    if sum(cost) > period:
        raise ValueError(f"body of {sum(cost)} cycles does not fit the period {period}")
    # The last end is max(an end fixed by some release, carry + load − P); with load ≤ P the second pass,
    # started from the first pass's overflow, never overflows past its own first start.
    carry = -period
    while True:
        at, starts = carry, []
        for r, c in zip(release, cost, strict=True):
            at = max(r, at)
            starts.append(at)
            at += c
        overflow = at - period
        if overflow <= starts[0]:
            return [s % period for s in starts]
        carry = overflow


def list_targets(table: TaskTable, placement: Sequence[int], num_procs: int, priority: Sequence[int]) -> list[int]:
    """Start times of one iteration run alone on the placement (each processor serial, tasks in
    `priority`, a topological order): where each task would like to sit in the period."""
    free = [0] * num_procs
    at = [0] * len(table)
    for v in priority:
        p = placement[v]
        at[v] = max([free[p]] + [at[u] + table.cost[u] for u in table.preds[v]])
        free[p] = at[v] + table.cost[v]
    return at


def asap_keys(asap: Sequence[int], period: int) -> list[Callable[[int], tuple]]:
    """The two gap-free body orders worth trying for a placement: by earliest start in one iteration, and
    by that start modulo the period (which interleaves forward and backward work like 1F1B)."""
    return [lambda v: (asap[v], v), lambda v: (asap[v] % period, asap[v], v)]


def default_targets(table: TaskTable, placement: Sequence[int], num_procs: int, asap: Sequence[int]) -> list[list[int]]:
    """Target timings for `best_ordering`: ASAP with unlimited processors, one iteration on the placement,
    and the iteration run serially along its timeline."""
    order = timeline(table, asap)
    return [list(asap), list_targets(table, placement, num_procs, order), prefix_targets(table, order)]
