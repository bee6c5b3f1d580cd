"""The scheduler passes as they were before issue 13/14's speed work, kept as the slow references the fast paths
are tested against (tests/test_schedule_fast_paths.py): `improve` re-reading every edge of an item per trial
move, `periodic_versions` sweeping all 4D periods of reads, `_pack_channels` sorting each queue with a key
function. Copied from commit 92d1fb8 (layerpipe/schedule/_placement.py, _validate.py, _comm.py) with only the
names changed; not used by the package. Also, from commit 6b4e035 (before the scheduler's second speed pass):
`modulo_list_schedule` scanning every processor's free list, and `comm_timing`'s rounds re-planning every
channel and solving the lags with the retiming package's solver every round. And from commit 8e92819:
`balance` sorting every processor's weights afresh each round (`reference_balance`).

And from commit e482f42 (layerpipe/schedule/_deps.py): `_stage_dependencies` as it was before it built each
op's tuple at once and asked for first forwards by key, and (layerpipe/schedule/_validate.py) `validate_periodic`
as it was before it read the unfolded edges as tuples, and `_check_duplicates` and `_check_counts` before their
checks on sets (tests/test_validate_fast_paths.py); and (layerpipe/schedule/_engine.py) the event-driven engine
`_events` before it skipped the steps without transfers and started a processor's next op inline, and
`_planned_order` before it sorted and floored a planned bus as arrays (tests/test_schedule_fast_paths.py).

Also the inputs those tests share: the interconnects they draw from (`SPECS`), their hypothesis settings
(`FAST`), a task table of a generated network (`task_table`) and a random placement of items (`random_placement`).
"""

from __future__ import annotations

import bisect
import heapq
import random
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

from hypothesis import HealthCheck, settings

from layerpipe.costs import MacsModel, PEModel
from layerpipe.dfg import TrainingGraph, build_training_graph
from layerpipe.interconnect import Interconnect, compiled_bus_key, parse_interconnect
from layerpipe.schedule._bodies import _earliest_fit, _occupy  # unchanged by the fast paths: shared
from layerpipe.schedule._comm import Comm, Transfer, _fifo_departures, channel_timing
from layerpipe.schedule._comm_timing import COMM_ROUNDS
from layerpipe.schedule._deps import (
    ROLE_STEP,
    STAGE_GRADIENT_KINDS,
    Dependency,
    StageInfo,
    _lookup,
    _microbatches,
)
from layerpipe.schedule._engine import BusOrder, CompiledSchedule, _cross_transfers, link_hold_cycles
from layerpipe.schedule._ir import Op, OpKey, OpSchedule, ScheduleError, tie_rank
from layerpipe.schedule._lags import _solve
from layerpipe.schedule._layerpipe import group_items, weight_groups
from layerpipe.schedule._op_sweep import _check_finished
from layerpipe.schedule._periodic import PeriodicSchedule
from layerpipe.schedule._placement import LIGHT_TARGETS, MAX_MOVES
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import copies, unfolded_edges
from layerpipe.schedule._validate import (
    _disjoint_arcs,
    _expected_keys,
    _fail,
    _label,
    _periodic_grid,
    _sibling,
    periodic_staleness,
)

__all__ = ["improve_case", "reference_balance", "reference_check_counts", "reference_check_duplicates",
           "reference_comm_timing", "reference_events", "reference_improve", "reference_modulo_list_schedule",
           "reference_pack_channels", "reference_periodic_versions", "reference_planned_order",
           "reference_stage_dependencies", "reference_validate_periodic"]


class _State:
    """Loads, channel holds and words of a placement, kept up to date under moves of whole items."""

    def __init__(self, table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
                 members: Sequence[Sequence[int]]) -> None:
        self.table, self.ic, self.n = table, interconnect, num_procs
        self.place = list(placement)
        self.members = members
        self.item_of = [0] * len(table)
        for i, tasks in enumerate(members):
            for v in tasks:
                self.item_of[v] = i
        self.item_cost = [sum(table.cost[v] for v in tasks) for tasks in members]
        self.load = [0] * num_procs
        for v, p in enumerate(self.place):
            self.load[p] += table.cost[v]
        # Every data edge once: (producer, consumer, words, hold).
        self.edges: list[tuple[int, int, int, int]] = []
        for v, ps in enumerate(table.preds):
            for u, w in zip(ps, table.pred_words[v], strict=True):
                self.edges.append((u, v, w, interconnect.hold(w)))
        for u, x, w in table.weight_reads:
            self.edges.append((u, x, w, interconnect.hold(w)))
        self.item_edges: list[list[int]] = [[] for _ in members]
        for k, (u, v, _, _) in enumerate(self.edges):
            iu, iv = self.item_of[u], self.item_of[v]
            if iu != iv:
                self.item_edges[iu].append(k)
                self.item_edges[iv].append(k)
        self.chan: dict[int, int] = {}
        self.words = 0
        for u, v, w, h in self.edges:
            if self.place[u] != self.place[v]:
                self.words += w
                if h:
                    c = interconnect.channel(self.place[u], self.place[v], num_procs)
                    self.chan[c] = self.chan.get(c, 0) + h
        self._histogram()

    def _histogram(self) -> None:
        """How many resources (processors and channels) carry each load, and those loads, largest first:
        what a move's effect on (period, resources at the period) is read from without a full scan."""
        self.hist: dict[int, int] = {}
        for x in (*self.load, *self.chan.values()):
            self.hist[x] = self.hist.get(x, 0) + 1
        self.levels = sorted(self.hist, reverse=True)

    def channel(self, p: int, q: int) -> int:
        return self.ic.channel(p, q, self.n)

    def key(self) -> tuple[int, int, int]:
        top = self.levels[0]
        return top, self.hist[top], self.words

    def delta(self, item: int, dst: int) -> tuple[dict[int, int], int]:
        """Channel hold changes and the change in words if `item` moved to `dst`."""
        src = self.place[self.members[item][0]]
        changes: dict[int, int] = {}
        dw = 0
        shared = self.ic.is_shared
        for k in self.item_edges[item]:
            u, v, w, h = self.edges[k]
            mine_is_u = self.item_of[u] == item
            other = self.place[v] if mine_is_u else self.place[u]
            before = (src, other) if mine_is_u else (other, src)
            after = (dst, other) if mine_is_u else (other, dst)
            if before[0] != before[1]:
                dw -= w
                if h and not shared:
                    c = self.channel(*before)
                    changes[c] = changes.get(c, 0) - h
            if after[0] != after[1]:
                dw += w
                if h and not shared:
                    c = self.channel(*after)
                    changes[c] = changes.get(c, 0) + h
        return changes, dw

    def key_after(self, item: int, dst: int) -> tuple[int, int, int]:
        src = self.place[self.members[item][0]]
        c = self.item_cost[item]
        changes, dw = self.delta(item, dst)
        # The resources the move touches, old value → new value; every other resource keeps its load.
        touched = [(self.load[src], self.load[src] - c), (self.load[dst], self.load[dst] + c)]
        touched += [(self.chan.get(ch, 0), self.chan.get(ch, 0) + d) for ch, d in changes.items() if d]
        adjust: dict[int, int] = {}
        for old, new in touched:
            if old:
                adjust[old] = adjust.get(old, 0) - 1
            if new:
                adjust[new] = adjust.get(new, 0) + 1
        top = max((v for v, d in adjust.items() if d > 0), default=0)
        for level in self.levels:  # the largest load still held after the move
            if level <= top:
                break
            if self.hist[level] + adjust.get(level, 0) > 0:
                top = level
                break
        at_top = self.hist.get(top, 0) + adjust.get(top, 0)
        return top, at_top, self.words + dw

    def move(self, item: int, dst: int) -> None:
        src = self.place[self.members[item][0]]
        changes, dw = self.delta(item, dst)
        for ch, d in changes.items():
            value = self.chan.get(ch, 0) + d
            if value:
                self.chan[ch] = value
            else:
                self.chan.pop(ch, None)
        self.words += dw
        self.load[src] -= self.item_cost[item]
        self.load[dst] += self.item_cost[item]
        for v in self.members[item]:
            self.place[v] = dst
        self._histogram()

    def candidate_moves(self) -> list[tuple[int, int]]:
        """(item, destination) pairs that touch a bottleneck resource."""
        top, _, _ = self.key()
        moves: set[tuple[int, int]] = set()
        # Off a busiest processor: to one of the least loaded processors, or to where the item's data goes.
        light = sorted(range(self.n), key=lambda q: (self.load[q], q))[:LIGHT_TARGETS]
        for p, x in enumerate(self.load):
            if x == top:
                items = {self.item_of[v] for v, q in enumerate(self.place) if q == p}
                for i in items:
                    near = {self.place[v] for k in self.item_edges[i] for v in self.edges[k][:2]}
                    moves |= {(i, q) for q in (*light, *near) if q != p}
        hot = {ch for ch, x in self.chan.items() if x == top}
        if hot:
            for u, v, _, h in self.edges:
                pu, pv = self.place[u], self.place[v]
                if h and pu != pv and self.channel(pu, pv) in hot:
                    moves.add((self.item_of[u], pv))
                    moves.add((self.item_of[v], pu))
        return sorted(moves)


def reference_improve(table: TaskTable, placement: Sequence[int], num_procs: int, interconnect: Interconnect,
            members: Sequence[Sequence[int]], max_words: float | None = None) -> list[int]:
    """A placement no single move of an item off a bottleneck improves, by (period, resources at the period,
    words per iteration), never exceeding `max_words` words per iteration when given."""
    state = _State(table, placement, num_procs, interconnect, members)
    for _ in range(MAX_MOVES):
        current = state.key()
        best: tuple[tuple[int, int, int], int, int] | None = None
        for item, dst in state.candidate_moves():
            after = state.key_after(item, dst)
            if max_words is not None and after[2] > max_words and after[2] > current[2]:
                continue
            if after < current and (best is None or (after, item, dst) < best):
                best = (after, item, dst)
        if best is None:
            break
        state.move(best[1], best[2])
    return state.place


def reference_periodic_versions(schedule: PeriodicSchedule, graph: TrainingGraph) -> dict[int, int]:
    """Weight versions of each layer held at once in the steady state of the periodic timing: the current
    version plus every version a forward has read and its backward has not finished with (under `stash`
    E_l(t) uses the version F_l(t) read; without a stash edge, while the forward runs). Counted the way the
    simulator's memory sweep counts them (`layerpipe.sim._memory`), on the periodic timing itself: a window
    of iterations deep in the steady state, versions read from `read_pins`, update ends from the U slots.
    """
    stashing = {e.dst.layer for e in graph.edges if e.role == "stash"}
    pins = schedule.read_pins()
    slots = {(s.kind, s.layer, s.phase): s for body in schedule.bodies for s in body}
    period, unfold = schedule.period, schedule.unfold
    depth = max((s.lag for s in slots.values()), default=0) + 2
    out: dict[int, int] = {}
    for layer in graph.network.layers:
        if not layer.has_weights:
            continue
        back = next((t.kind for t in graph.tasks if t.layer == layer.index and "E" in t.kind), None)
        if layer.index not in stashing:
            back = "F"  # no stash: a forward holds its version only while it runs (2BW's floor makes it older)
        if back is None or ("U", layer.index) not in schedule.costs:
            out[layer.index] = 1
            continue
        g, per = schedule.group(layer.index), schedule.phases("U", layer.index)
        c_u, c_e = schedule.costs[("U", layer.index)], schedule.costs[(back, layer.index)]
        periods = 4 * depth
        updates = [slots[("U", layer.index, q)] for q in range(per)]
        ends = sorted(j * period + u.start + c_u for j in range(periods) for u in updates
                      if per * (j - u.lag) + u.phase >= 0)
        events: list[tuple[int, int, int]] = []  # (time, +1/−1, version): a forward's read until its E ends
        for j in range(periods):
            for k in range(unfold):
                f, e = slots[("F", layer.index, k)], slots[(back, layer.index, k)]
                t = unfold * (j - f.lag) + k
                if t < 0 or ("F", layer.index, k) not in pins:
                    continue
                begin = j * period + f.start
                finish = (t // unfold + e.lag) * period + e.start + c_e
                events.append((begin, t // g - pins[("F", layer.index, k)], finish))
        lo, hi = 2 * depth * period, 3 * depth * period
        out[layer.index] = _most_versions_held(events, ends, lo, hi)
    return out


def _most_versions_held(events: list[tuple[int, int, int]], ends: list[int], lo: int, hi: int) -> int:
    """The most distinct versions held at a time τ in [lo, hi): the versions of the reads (begin, version,
    finish) with begin ≤ τ < finish, plus the current one (updates ended by τ). A sweep over the event times
    with a count per active version (readers of one version overlap)."""
    begins = sorted((b, v) for b, v, _ in events)
    finishes = sorted((f, v) for _, v, f in events)
    active: dict[int, int] = {}
    best, i, k = 1, 0, 0
    for tau in sorted({b for b, _ in begins} | {f for f, _ in finishes} | set(ends)):
        while i < len(begins) and begins[i][0] <= tau:
            active[begins[i][1]] = active.get(begins[i][1], 0) + 1
            i += 1
        while k < len(finishes) and finishes[k][0] <= tau:
            v = finishes[k][1]
            active[v] -= 1
            if not active[v]:
                del active[v]
            k += 1
        if lo <= tau < hi:
            current = bisect_right(ends, tau)
            best = max(best, len(active) + (current not in active))
    return best



def reference_pack_channels(table: TaskTable, comm: Comm, start: Sequence[int], period: int,
                   consumer_time: Sequence[int] | None, found: Sequence[Transfer]) -> dict[tuple[int, int], int]:
    """Arrivals of `found`, each channel packed around the period in its FIFO order (`channel_timing`)."""
    latency = comm.interconnect.latency
    key_of = consumer_time if consumer_time is not None else start
    by_channel: dict[int, list[Transfer]] = {}
    for t in found:
        by_channel.setdefault(t.channel, []).append(t)
    place = comm.placement
    arrival: dict[tuple[int, int], int] = {}
    for queue in by_channel.values():
        # The queue's FIFO order in one period: release offset modulo P (a producer ending past P releases in
        # the next period, ahead of that period's later releases), earlier periods first on a tie; equal
        # releases in the consumer's program order — its processor, then its plan time in the same frame (a
        # weight read is consumed at least one iteration later) — as the simulator's engine queues them.
        def order(t: Transfer) -> tuple[int, ...]:
            r = start[t.src] + table.cost[t.src]
            frame = (key_of[t.src] // period if consumer_time is not None else 0) + r // period
            when = key_of[t.dst] - frame * period + (period if t.weight else 0)
            return (r % period, -(r // period), place[t.dst], when, t.dst, t.src)

        def bus_order(t: Transfer) -> tuple[object, ...]:
            # A bus is compiled: the one order `compiled_bus_key` defines, on plan times taken in the window
            # of the release (the simulator applies it to the absolute planned times).
            release = key_of[t.src] + table.cost[t.src]
            window = release - release % period
            consumer = table.tasks[t.dst]
            return (compiled_bus_key(release - window, key_of[t.src] - window, place[t.dst],
                                     key_of[t.dst] + (period if t.weight else 0) - window,
                                     tie_rank(consumer.kind, consumer.layer), place[t.src]), t.dst, t.src)

        queue.sort(key=bus_order if comm.interconnect.kind == "bus" else order)
        ends = [start[t.src] + table.cost[t.src] for t in queue]
        depart = _fifo_departures([r % period for r in ends], [t.hold for t in queue], period)
        for t, r, d in zip(queue, ends, depart, strict=True):
            arrival[(t.src, t.dst)] = d + (r - r % period) + t.hold + latency
    return arrival


# --- from commit 6b4e035 ------------------------------------------------------------------------------------


def reference_modulo_list_schedule(
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


def reference_comm_timing(table: TaskTable, start: Sequence[int], period: int,
                          comm: Comm | None) -> tuple[list[int], dict[tuple[int, int], int]]:
    """`_comm_timing` as it was: `channel_timing` and the solver every round until the lags stop changing."""
    if comm is None:
        return _reference_longest_lags(table, start, period, {}), {}
    arrival = channel_timing(table, comm, start, period)
    lag = _reference_longest_lags(table, start, period, arrival)
    for _ in range(COMM_ROUNDS):
        plan = [lag[v] * period + start[v] for v in range(len(table))]
        arrival = channel_timing(table, comm, start, period, plan)
        again = _reference_longest_lags(table, start, period, arrival)
        if again == lag:
            break
        lag = again
    return lag, arrival


def _reference_longest_lags(table: TaskTable, start: Sequence[int], period: int,
                            arrival: dict[tuple[int, int], int]) -> list[int]:
    src, dst = table.precedence
    end = [s + c for s, c in zip(start, table.cost, strict=True)]
    bound = [-((start[v] - arrival.get((u, v), end[u])) // period) for u, v in zip(src, dst, strict=True)]
    return _solve(table, src, dst, bound, table.topo)


SPECS = ("shared", "links:0:1", "links:2:1", "links:1:1/8", "links:3:2", "bus:2:3", "bus:0:1/2", "rtl")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def task_table(net, overhead: int) -> TaskTable:
    """`net`'s task table under `PEModel(lanes=4, overhead)`, or `MacsModel` for overhead 0."""
    model = PEModel(lanes=4, overhead=overhead) if overhead else MacsModel()
    return TaskTable.of(build_training_graph(net), model)


def random_placement(num_tasks: int, members: Sequence[Sequence[int]], num_procs: int,
                     rng: random.Random) -> list[int]:
    """Each item (its member tasks together) on a random processor: the task → processor list."""
    placement = [0] * num_tasks
    for tasks in members:
        proc = rng.randrange(num_procs)
        for v in tasks:
            placement[v] = proc
    return placement


def improve_case(net, n: int, spec: str, overhead: int, together: bool, seed: int,
                 bounded: bool) -> tuple[TaskTable, Interconnect, list, list[int], int | None]:
    """An `improve` input from drawn values: the network's table, the interconnect, its items (weight groups kept
    together or not), a random placement of them, and a words bound below the table's total (or None)."""
    table = task_table(net, overhead)
    _, members = group_items(table, weight_groups(table, together))
    rng = random.Random(seed)
    placement = random_placement(len(table), members, n, rng)
    words = sum(w for ws in table.pred_words for w in ws) + sum(w for _, _, w in table.weight_reads)
    return table, parse_interconnect(spec, lanes=4), members, placement, rng.randrange(words + 1) if bounded else None


def reference_balance(weights: Sequence[int], num_procs: int, initial: Sequence[int] | None = None,
                      rounds: int = 2000) -> list[int]:
    """`_balance.balance` before its sorted weights were kept across rounds (commit 8e92819)."""
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
        if not _reference_improve_busiest(weights, proc, members, load):
            break
    return proc


def _reference_improve_busiest(weights: Sequence[int], proc: list[int], members: list[list[int]],
                               load: list[int]) -> bool:
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
    _reference_move(i, top, q, weights, proc, members, load)
    if j >= 0:
        _reference_move(j, q, top, weights, proc, members, load)
    return True


def _reference_move(i: int, src: int, dst: int, weights: Sequence[int], proc: list[int], members: list[list[int]],
          load: list[int]) -> None:
    members[src].remove(i)
    members[dst].append(i)
    load[src] -= weights[i]
    load[dst] += weights[i]
    proc[i] = dst
def reference_stage_dependencies(
    schedule: OpSchedule, by_key: Mapping[OpKey, Op], stages: StageInfo | None
) -> dict[Op, tuple[Dependency, ...]]:
    num_stages = stages.num_stages if stages else 1 + max((op.unit for op in schedule.ops()), default=-1)
    info = stages or StageInfo(num_stages)
    m = _microbatches(schedule) if schedule.synchronous else 0
    # The gradient ops of each (stage, step): what the next step's forwards of that stage wait for. Only the
    # first forward of a (stage, step) on each processor gets these edges; the processor's later forwards of
    # that step follow it in program order anyway, so m edges per stage and step say what m² would.
    gradient_ops: dict[tuple[int, int], list[Op]] = {}
    first_forwards: set[Op] = set()
    if m:
        seen: set[tuple[int, int, int]] = set()
        for op in schedule.ops():
            if op.kind in STAGE_GRADIENT_KINDS:
                gradient_ops.setdefault((op.unit, op.iteration // m), []).append(op)
            elif op.kind == "F" and (op.unit, op.iteration // m, op.proc) not in seen:
                seen.add((op.unit, op.iteration // m, op.proc))
                first_forwards.add(op)
    out: dict[Op, tuple[Dependency, ...]] = {}
    for op in schedule.ops():
        s, t = op.unit, op.iteration
        deps: list[Dependency] = []
        if op.kind == "F":
            if s > 0:
                deps.append(Dependency(_lookup(by_key, ("F", s - 1, t), op), info.words_into_forward(s), "activation"))
            if op in first_forwards and t >= m:
                deps += [Dependency(g, 0, ROLE_STEP) for g in gradient_ops.get((s, t // m - 1), ())]
        elif op.kind in ("B", "I"):
            if s < num_stages - 1:
                later = "B" if ("B", s + 1, t) in by_key else "I"
                deps.append(Dependency(_lookup(by_key, (later, s + 1, t), op), info.words_into_backward(s), "error"))
            deps.append(Dependency(_lookup(by_key, ("F", s, t), op), 0, "kept"))
        elif op.kind == "W":
            deps.append(Dependency(_lookup(by_key, ("I", s, t), op), 0, "kept"))
        else:
            raise ScheduleError(f"op {op} on p{op.proc}: kind '{op.kind}' is not a stage-level kind (F, B, I, W)")
        out[op] = tuple(deps)
    return out


def reference_validate_periodic(
    schedule: PeriodicSchedule,
    graph: TrainingGraph,
    *,
    costs: Mapping[tuple[str, int], int] | None = None,
    comm: Callable[[int], int] | None = None,
    max_staleness: int | None = None,
) -> None:
    """Validate a periodic schedule of `graph`'s tasks in modulo form (see the module docstring)."""
    cost = dict(costs if costs is not None else schedule.costs)
    period, unfold, groups = schedule.period, schedule.unfold, dict(schedule.groups)

    def fail(summary: str, p: int | None, start: int | None) -> None:
        mark = (start, p) if p is not None and start is not None else None
        raise ScheduleError(summary, _periodic_grid(schedule, mark), step=start, proc=p)

    where: dict[tuple[str, int, int], tuple[int, int, int]] = {}  # task copy → (proc, lag, start)
    for p, body in enumerate(schedule.bodies):
        for slot in body:
            task = (slot.kind, slot.layer, slot.phase)
            if slot.lag < 0 or slot.start < 0:
                fail(f"lag: slot {slot} on p{p} has a negative lag or start", p, slot.start)
            if task in where:
                other = where[task][0]
                fail(f"duplicate: task {_label(task)} is in the bodies of p{other} and p{p}", p, slot.start)
            if (slot.kind, slot.layer) not in cost:
                fail(f"slot {slot} on p{p}: no cost known for task {slot.kind}{slot.layer}", p, slot.start)
            where[task] = (p, slot.lag, slot.start)
    graph_tasks = {(t.kind, t.layer, k) for t in graph.tasks for k in range(copies(t.kind, t.layer, unfold, groups))}
    for task in sorted(graph_tasks - where.keys()):
        fail(f"missing op: task {_label(task)} is in no processor's body", None, None)
    for task in sorted(where.keys() - graph_tasks):
        fail(f"extra op: task {_label(task)} is not in the training graph"
             + (f" unfolded by {unfold}" if unfold > 1 else ""), where[task][0], where[task][2])

    for p, body in enumerate(schedule.bodies):
        busy = [s for s in body if cost[(s.kind, s.layer)] > 0]
        if sum(cost[(s.kind, s.layer)] for s in busy) > period:
            fail(f"overlap: p{p} has more work than the period {period}", p, busy[0].start)
        for i, a in enumerate(busy if not _disjoint_arcs(busy, cost, period) else ()):  # the first overlap
            for b in busy[i + 1 :]:
                ca, cb = cost[(a.kind, a.layer)], cost[(b.kind, b.layer)]
                if (b.start - a.start) % period < ca or (a.start - b.start) % period < cb:
                    fail(f"overlap: on p{p}, {b} overlaps {a} modulo the period {period}", p, b.start)
        # A zero-cycle op occupies no cycles but keeps its place in the program: one that starts inside another
        # op's cycles waits for it (the unrolled program runs in start order), so the plan would not hold.
        for z in body:
            if cost[(z.kind, z.layer)] == 0:
                for a in busy:
                    if 0 < (z.start - a.start) % period < cost[(a.kind, a.layer)]:
                        fail(f"overlap: on p{p}, {z} (0 cycles) starts inside {a}'s cycles modulo the period "
                             f"{period}; it would wait for {a} to end", p, z.start)

    for e in unfolded_edges(graph, unfold, groups):
        (pu, lag_u, st_u), (pv, lag_v, st_v) = where[e.src], where[e.dst]
        c_u = cost[e.src[:2]]
        ready = st_u + c_u + (comm(e.words) if comm is not None and pu != pv else 0)
        at = (lag_v - lag_u + e.delay) * period + st_v
        src, dst = _label(e.src), _label(e.dst)
        if at < ready:
            fail(
                f"precedence: {dst} (p{pv}, lag {lag_v}, start {st_v}) starts before {src} "
                f"(p{pu}, lag {lag_u}, start {st_u}) delivers ({e.role}, delay {e.delay})",
                pv,
                st_v,
            )
        if pu == pv and at == st_u and tie_rank(*e.dst[:2]) <= tie_rank(*e.src[:2]):
            # Same cycle on one processor behind a zero-cycle producer: the unroll orders them by tie_rank.
            fail(f"precedence: {dst} starts in the cycle {src} (0 cycles) does, on p{pv}, but the tie order "
                 f"(one iteration's dataflow order) runs {dst} first", pv, st_v)

    if max_staleness is not None:
        for layer, stale in periodic_staleness(schedule, graph, cost).items():
            if stale > max_staleness:
                p, _, start = where[("F", layer, 0)]
                fail(f"staleness: F{layer} reads weights {stale} updates old > bound {max_staleness}", p, start)


def reference_check_duplicates(schedule: OpSchedule) -> None:
    seen: dict[OpKey, Op] = {}
    for op in schedule.ops():
        if op.key in seen:
            first = seen[op.key]
            _fail(schedule, f"duplicate: {op} runs twice (on p{first.proc} and on p{op.proc})", op)
        seen[op.key] = op


def reference_check_counts(schedule: OpSchedule, graph: TrainingGraph | None, stages: StageInfo | None,
                           iterations: int) -> None:
    """Every expected op is present (after duplicates and producers were checked: what is left is ops
    nothing consumes, such as a last W or U), and none lies outside the iterations."""
    seen = {op.key: op for op in schedule.ops()}
    expected = _expected_keys(schedule, graph, stages, iterations)
    if expected is None:
        return
    if schedule.level == "stage":
        for s, t in sorted({(k[1], k[2]) for k in expected}):
            has = {kind for kind in "BIW" if (kind, s, t) in seen}
            if "B" in has and len(has) > 1:
                _fail(schedule, f"duplicate: stage {s} micro-batch {t} has both B and I/W", seen[("B", s, t)])
            if has in ({"I"}, {"W"}):
                present, absent = ("I", "W") if has == {"I"} else ("W", "I")
                summary = f"missing op: {absent}{s}.{t} (stage {s} splits micro-batch {t} into I and W)"
                _fail(schedule, summary, seen[(present, s, t)])
            if not has:
                summary = f"missing op: B{s}.{t} (or I{s}.{t} and W{s}.{t}): no processor runs it"
                _fail(schedule, summary, _sibling(schedule, s, t))
        extra = [op for op in schedule.ops() if op.iteration >= iterations]
    else:
        extra = [op for op in schedule.ops() if op.key not in expected]
    for key in sorted(expected - seen.keys()):
        kind, unit, it = key
        _fail(schedule, f"missing op: {kind}{unit}.{it} — no processor runs it", _sibling(schedule, unit, it))
    if extra:
        _fail(schedule, f"extra op: {extra[0]} on p{extra[0].proc} is outside iterations 0..{iterations - 1}", extra[0])


def reference_events(c: CompiledSchedule, latency: int, words_per_cycle: float | Fraction, bus: bool,
                     order: BusOrder | None, last: list[int] | None = None,
                     served: list[tuple[int, int]] | None = None) -> tuple[list[int], list[int]]:
    """The event-driven engine. `order` compiles the bus (ranks, and floors for planned runs); `last[p]` ends
    processor p's program early (ops from it on, and what they consume, are left out); `served` collects the
    transfers (producer, consumer) in the order the channel served them."""
    n, procs = c.num_ops, c.num_procs
    dur, proc, consumers = c.dur, c.proc, c.consumers
    pending = [len(set(row)) for row in c.prods]  # distinct producers: one transfer per pair
    ready = [0] * n  # latest input arrival seen so far
    start = [0] * n
    end = [0] * n
    done = [False] * n
    nxt = c.bounds[:-1].copy()
    last = c.bounds[1:] if last is None else last
    free = [0] * procs
    running = [False] * procs
    link_free: dict[int, int] = {}
    hold_of: dict[int, int] = {}  # words → link cycles, memoised
    heap: list[int] = []
    rank = order.rank if order is not None else {}
    floor = order.floor if order is not None else None
    released: dict[int, tuple[int, int, int]] = {}  # rank → (producer, consumer, words)
    head = 0

    def try_start(p: int) -> None:
        i = nxt[p]
        if running[p] or i >= last[p] or pending[i]:
            return
        s = free[p] if free[p] > ready[i] else ready[i]
        start[i] = s
        end[i] = s + dur[i]
        running[p] = True
        nxt[p] = i + 1
        heapq.heappush(heap, end[i] * n + i)

    for p in range(procs):
        try_start(p)
    while heap:
        t = heap[0] // n
        bound = (t + 1) * n
        transfers: list[tuple[int, int, int, int]] = []
        # Every op ending at t, including zero-duration ops that start and end at t on the way, before
        # any transfer of cycle t is queued: transfers of one cycle go in consumer order.
        while heap and heap[0] < bound:
            i = heapq.heappop(heap) - t * n
            p = proc[i]
            done[i] = True
            running[p] = False
            free[p] = t
            for j, words in consumers[i]:
                q = proc[j]
                if j >= last[q]:
                    continue  # beyond the programs run
                if q == p:
                    if ready[j] < t:
                        ready[j] = t
                    pending[j] -= 1
                    if not pending[j]:
                        try_start(q)
                else:
                    transfers.append((0 if bus else p * procs + q, j, i, words))
            try_start(p)
        transfers.sort()  # per link, in consumer order (ops are numbered processor-major)
        queue = [(link, j, i, words, 0) for link, j, i, words in transfers]
        if rank:
            for _, j, i, words in transfers:
                released[rank[(i, j)]] = (i, j, words)
            queue = []
            while head in released:
                i, j, words = released.pop(head)
                queue.append((0, j, i, words, floor[head] if floor is not None else 0))
                head += 1
        for link, j, i, words, not_before in queue:
            depart = link_free.get(link, 0)
            if depart < t:
                depart = t
            if depart < not_before:
                depart = not_before
            hold = hold_of.get(words)
            if hold is None:
                hold = hold_of[words] = link_hold_cycles(words, words_per_cycle)
            link_free[link] = depart + hold
            arrival = depart + hold + latency
            if served is not None:
                served.append((i, j))
            if ready[j] < arrival:
                ready[j] = arrival
            pending[j] -= 1
            if not pending[j]:
                try_start(proc[j])
    if any(nxt[p] < last[p] for p in range(procs)):
        _check_finished(c, nxt, done, c.prods, [])
    return start, end


def reference_planned_order(c: CompiledSchedule, words_per_cycle: float | Fraction) -> BusOrder:
    plan, dur, proc = c.plan_time, c.dur, c.proc
    assert plan is not None
    rank_of_task = [tie_rank(kind, unit) for kind, unit in c.tasks]
    task = c.task.tolist()
    keyed = sorted((compiled_bus_key(plan[i] + dur[i], plan[i], proc[j], plan[j], rank_of_task[task[j]], proc[i]),
                    j, i, words) for i, j, words in _cross_transfers(c))
    rank: dict[tuple[int, int], int] = {}
    floor: list[int] = []
    free = 0
    for k, (key, j, i, words) in enumerate(keyed):
        rank[(i, j)] = k
        depart = max(key[0], free)
        floor.append(depart)
        free = depart + link_hold_cycles(words, words_per_cycle)
    return BusOrder(rank, floor)
