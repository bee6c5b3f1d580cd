"""Processor bodies (design notes §5): where in the period each task of a placement starts, and the body
orders and packings worth trying for it.

A periodic schedule is fixed by three choices: which processor runs each task (placement), where in the
period each task starts (start offsets; a processor's body), and the iteration lag of each task. The
policies differ only in how they make the first two; the lags always come from `_comm_timing.minimal_lags`.

- `order_bodies` / `contiguous_starts` — a processor's tasks in a chosen order, packed from offset 0.
- `pack_circular` — a body packed around the period at or after target offsets (a task may wrap past P).
- `best_ordering` — the body orders and packings worth trying for a placement, best by staleness
                    (`asap_keys`, `default_targets`: `list_targets`, `prefix_targets`).
- `modulo_list_schedule` — placement and starts together, each task at its earliest fit after its
                    producers in a per-processor modulo reservation table (used under a staleness bound,
                    where how early the backward of a layer comes back matters, not only the load).
- `periodic_from` — the IR form of a timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from layerpipe.interconnect import SHARED, Interconnect
from layerpipe.schedule._comm import Comm
from layerpipe.schedule._comm_timing import Timing, timed
from layerpipe.schedule._lags import timeline
from layerpipe.schedule._periodic import PeriodicSchedule, Slot, make_slot, slot_order
from layerpipe.schedule._task_table import TaskTable


def order_bodies(placement: Sequence[int], num_procs: int, key: Callable[[int], tuple]) -> list[list[int]]:
    """Each processor's tasks sorted by `key` (equal keys in task order): one sort of every task, dealt out to the
    processors (a stable sort orders each processor's share as sorting that share alone would)."""
    bodies: list[list[int]] = [[] for _ in range(num_procs)]
    for v in sorted(range(len(placement)), key=key):
        bodies[placement[v]].append(v)
    return bodies


def offset_bodies(placement: Sequence[int], num_procs: int, target: Sequence[int], period: int) -> list[list[int]]:
    """`order_bodies` by target offset modulo the period, then target, then task (`_pack_to`'s order), sorting the
    keys themselves (they end with the task, so no two are equal) instead of calling a key per task."""
    bodies: list[list[int]] = [[] for _ in range(num_procs)]
    for _, _, v in sorted(zip([t % period for t in target], target, range(len(placement)), strict=True)):
        bodies[placement[v]].append(v)
    return bodies


def contiguous_starts(bodies: Sequence[Sequence[int]], cost: Sequence[int]) -> list[int]:
    """Pack every body from offset 0 in its order, without gaps."""
    start = [0] * len(cost)
    for body in bodies:
        at = 0
        for v in body:
            start[v] = at
            at += cost[v]
    return start


def periodic_from(table: TaskTable, placement: Sequence[int], start: Sequence[int], lag: Sequence[int],
                  period: int, num_procs: int, arrival: dict[tuple[int, int], int] | None = None) -> PeriodicSchedule:
    """The IR form of a timing; `arrival` (planned transfers) sets how late each remote weight read sees a
    new version (`PeriodicSchedule.read_delays`)."""
    bodies: list[list[Slot]] = [[] for _ in range(num_procs)]
    for v, t in enumerate(table.tasks):
        bodies[placement[v]].append(make_slot(start[v], t.kind, t.layer, lag[v]))
    costs = {(t.kind, t.layer): c for t, c in zip(table.tasks, table.cost, strict=True)}
    delays: dict[tuple[str, int] | tuple[str, int, int], int] = {}  # PeriodicSchedule.read_delays' keys
    for u, x, _ in table.weight_reads:
        if arrival and (u, x) in arrival:
            delays[(table.tasks[x].kind, table.tasks[x].layer)] = arrival[(u, x)] - start[u] - table.cost[u]
    return PeriodicSchedule(period, tuple(tuple(sorted(b, key=slot_order)) for b in bodies), costs, delays)


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
    # At least the longest free interval of each processor (a task longer fits nowhere there): lowered to the
    # true longest when a task fails to fit, never raised (intervals only shrink)
    widest = [period] * num_procs
    room = [period] * num_procs  # free cycles not yet promised to a started group
    group_cost: dict[int, int] = {}
    group_proc: dict[int, int] = {}
    if group is not None:
        for v in range(n):
            group_cost[group[v]] = group_cost.get(group[v], 0) + table.cost[v]
    proc = [-1] * n
    sigma = [0] * n
    ends = [0] * n  # sigma + cost of each placed task: what its consumers wait for
    cost, preds, every = table.cost, table.preds, range(num_procs)
    for v in priority:
        c = cost[v]
        ready = 0
        for u in preds[v]:
            end = ends[u]
            if end > ready:
                ready = end
        g = group[v] if group is not None else None
        if fixed is not None:
            candidates: Sequence[int] = (fixed[v],)
        elif g is not None and g in group_proc:
            candidates = (group_proc[g],)
        else:
            candidates = every
        need = group_cost[g] if g is not None and g not in group_proc else None  # room a group's first task needs
        offset = ready % period
        base = ready - offset
        best_at, best_p, best_k = -1, -1, -1
        if c:
            for p in candidates:
                if c > widest[p] or (need is not None and room[p] < need):
                    continue
                # `_earliest_fit`, inlined for tasks with cycles (the scheduler's innermost loop), keeping the free
                # interval it falls in (the split below then needs no search for it)
                at = -1
                for k, (a, b) in enumerate(free[p]):  # noqa: B007 (k is read after the loop)
                    if b - c >= (a if a > offset else offset):
                        at = base + (a if a > offset else offset)
                        break
                else:
                    longest = 0
                    for k, (a, b) in enumerate(free[p]):  # noqa: B007
                        if b - a >= c:
                            at = base + period + a
                            break
                        if b - a > longest:
                            longest = b - a
                    else:
                        widest[p] = longest
                if at >= 0 and (best_p < 0 or at < best_at):
                    best_at, best_p, best_k = at, p, k
                    if at == ready:  # no processor can start it earlier, and on a tie the first one found stays
                        break
        else:
            for p in candidates:
                if need is not None and room[p] < need:
                    continue
                found = _earliest_fit(free[p], ready, c, period)
                if found is not None and (best_p < 0 or found < best_at):
                    best_at, best_p = found, p
                    if found == ready:
                        break
        if best_p < 0:
            return None
        at, p = best_at, best_p
        if c:  # the interval split around the task: what is left before it and after it, if anything
            here = free[p]
            a, b = here[best_k]
            begin = at % period
            end = begin + c
            if begin > a:
                here[best_k] = (a, begin)
                if end < b:
                    here.insert(best_k + 1, (end, b))
            elif end < b:
                here[best_k] = (end, b)
            else:
                del here[best_k]
        if g is not None and g not in group_proc:  # (`room` is read only for groups: one is given whole)
            group_proc[g] = p
            room[p] -= group_cost[g]
        proc[v], sigma[v], ends[v] = p, at, at + c
    return proc, sigma


def _earliest_fit(free: list[tuple[int, int]], ready: int, cost: int, period: int) -> int | None:
    offset = ready % period
    base = ready - offset
    if cost == 0:
        # no cycles, but a place in the program: not inside a busy interval (it would wait for that op to end);
        # the end of the interval it falls in, the next free cycle, is the earliest point between ops (no op
        # here wraps past the period, so its boundary is one too)
        if offset == 0 or any(a <= offset <= b for a, b in free):
            return ready
        return base + next((a for a, _ in free if a > offset), period)
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


def time_bodies(table: TaskTable, bodies: Sequence[Sequence[int]], period: int, comm: Comm | None = None) -> Timing:
    """Gap-free starts in the given body orders and the minimal lags for them."""
    return timed(table, contiguous_starts(bodies, table.cost), period, comm)


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


def ordering_starts(table: TaskTable, placement: Sequence[int], num_procs: int, period: int,
                    keys: Sequence[Callable[[int], tuple]], targets: Sequence[Sequence[int]] = ()) -> list[list[int]]:
    """The starts `best_ordering` times for these keys and targets, in its order, without timing them (a
    caller that can rule a placement out from its starts alone skips the timing: `_lags.StalenessFloor`)."""
    out = [contiguous_starts(order_bodies(placement, num_procs, key), table.cost) for key in keys]
    for target in targets:
        out.append(packed_starts(table, offset_bodies(placement, num_procs, target, period), period, target))
    return out


def packed_starts(table: TaskTable, bodies: Sequence[Sequence[int]], period: int, target: Sequence[int]) -> list[int]:
    start = [0] * len(table)
    for body in bodies:
        for v, at in zip(body, pack_circular([target[v] % period for v in body], [table.cost[v] for v in body],
                                             period), strict=True):
            start[v] = at
    return start


def _pack_to(table: TaskTable, placement: Sequence[int], num_procs: int, period: int,
             target: Sequence[int], comm: Comm | None = None) -> Timing:
    """Bodies ordered by target offset, packed around the period at or after those offsets, minimal lags."""
    return pack_bodies(table, offset_bodies(placement, num_procs, target, period), period, target, comm)


def pack_bodies(table: TaskTable, bodies: Sequence[Sequence[int]], period: int, target: Sequence[int],
                comm: Comm | None = None) -> Timing:
    """Bodies in the given orders packed around the period, each task at or after its target offset
    (`pack_circular`), with the minimal lags for those starts."""
    return timed(table, packed_starts(table, bodies, period, target), period, comm)


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
            if r > at:
                at = r
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
    cost, preds = table.cost, table.preds
    end = list(cost)  # at + cost of every task (at 0 until placed): what its consumers wait for
    for v in priority:
        p = placement[v]
        ready = free[p]
        for u in preds[v]:
            if end[u] > ready:
                ready = end[u]
        at[v] = ready
        free[p] = end[v] = ready + cost[v]
    return at


def asap_keys(asap: Sequence[int], period: int) -> list[Callable[[int], tuple]]:
    """The two gap-free body orders worth trying for a placement: by earliest start in one iteration, and
    by that start modulo the period (which interleaves forward and backward work like 1F1B)."""
    return [lambda v: (asap[v], v), lambda v: (asap[v] % period, asap[v], v)]


def prefix_targets(table: TaskTable, order: Sequence[int]) -> list[int]:
    """Start of each task if the iteration ran serially in `order`."""
    at, out = 0, [0] * len(table)
    for v in order:
        out[v] = at
        at += table.cost[v]
    return out


def default_targets(table: TaskTable, placement: Sequence[int], num_procs: int, asap: Sequence[int]) -> list[list[int]]:
    """Target timings for `best_ordering`: ASAP with unlimited processors, one iteration on the placement,
    and the iteration run serially along its timeline."""
    order = timeline(table, asap)
    return [list(asap), list_targets(table, placement, num_procs, order), prefix_targets(table, order)]
