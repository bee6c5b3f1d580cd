"""The planner's passes as they were before the planner speed work (branch perf-planner), kept as the slow
references its fast paths are tested against (tests/test_schedule_fast_paths.py); a second reference module
because tests/schedule_reference.py is near its size limit. Copied from commit ca552ff
(layerpipe/schedule/_planner.py) with only the names changed (and the layout made afresh, not memoised); not
used by the package:

- `reference_search_plan` — `_search_plan` calling `PlanCosts.scaled_stage_term` / `scaled_stage_bus` per stage
  (since replica counts went up to N, one such search per round of `_planner.rounds`, none bounding another);
- `reference_replicated_timing` — `_replicated_timing` building every settled trial's schedule and counting the
  versions of every trial of the least staleness.

And from commit 36075c7 (layerpipe/schedule/_lags.py, _bodies.py), for the scheduler passes' work on issue 14's
explore sweep:

- `reference_layer_floor` — `StalenessFloor.layer_floor` relaxing every edge with its head between the loop's F
  and U (not only those on a path from F to U);
- `reference_order_bodies` — `_bodies.order_bodies` sorting each processor's tasks on its own;
- `reference_pack_circular` — `_bodies.pack_circular` (`max` per task);
- `reference_list_targets` — `_bodies.list_targets` (a list per task for its `max`);
- `reference_cut_holds` — `PlanCosts`' per-cut holds, the hold of an edge computed at every cut it crosses;
- `reference_update_chain_lags` — `_unfold.update_chain_lags` finding each layer's update copies on every call.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from fractions import Fraction

from layerpipe.interconnect import Interconnect
from layerpipe.schedule._bodies import best_ordering, default_targets, modulo_list_schedule, order_bodies, pack_bodies
from layerpipe.schedule._comm import Comm
from layerpipe.schedule._comm_timing import Timing, timed, timing_of
from layerpipe.schedule._lags import _UNREACHED, StalenessFloor, asap_times, staleness_from_span
from layerpipe.schedule._periodic import PeriodicSchedule
from layerpipe.schedule._planner import (
    Plan,
    PlanCosts,
    Replicated,
    Stage,
    _Chain,
    _coalesced_starts,
    _flatten,
    _layout,
    _preference,
    _round_robin_starts,
    _round_robin_targets,
    _topological_by,
    rounds,
)
from layerpipe.schedule._replicated_scores import _settled_lags
from layerpipe.schedule._task_table import TaskTable
from layerpipe.schedule._unfold import UnfoldedTable, periodic_of
from layerpipe.schedule._validate import periodic_staleness
from layerpipe.schedule._versions import periodic_versions

__all__ = ["reference_cut_holds", "reference_layer_floor", "reference_list_targets", "reference_order_bodies",
           "reference_pack_circular", "reference_replicated_timing", "reference_search_plan",
           "reference_update_chain_lags"]


def _by_target(target: Sequence[int], period: int) -> Callable[[int], tuple[int, int, int]]:
    """Body order by target offset modulo the period, then target, then task (the key `order_bodies` took)."""
    return lambda v: (target[v] % period, target[v], v)


def reference_search_plan(costs: PlanCosts, num_procs: int, replication: bool) -> Plan:
    """The best of `_reference_round` over the planner's rounds (`rounds`), each searched on its own (no bound
    carried from one to the next); `replication=False`: one replica per stage."""
    searches = rounds(num_procs) if replication else ((1, (1,)),)
    found = [_reference_round(costs, num_procs, counts, round_) for round_, counts in searches]
    return min(found, key=lambda p: _preference(p.cycles, p.stages))


def _reference_round(costs: PlanCosts, num_procs: int, counts: tuple[int, ...], round_: int) -> Plan:
    """The best plan on at most `num_procs` processors with replica counts in `counts` (dividing `round_`,
    by which every value is scaled; the old single search had counts 1, 2, 3, 4, 6 and round 12).

    States are (cut, processors used, replicas of the last stage) with a Pareto front of (largest term, bus
    load). Branch and bound: the best complete plan so far (first: one stage on the most replicas allowed)
    bounds the search — a stage over it is not extended (its compute only grows with more layers), nor a
    prefix whose remaining work over the remaining processors exceeds it.
    """
    n = len(costs)
    options = [r for r in counts if r <= num_procs]
    widest = max(options)
    # All values below are scaled by round_ (PlanCosts.scaled_*): integers, compared exactly.
    bound = max(costs.scaled_stage_term(0, n - 1, widest, round_), costs.scaled_stage_bus(0, n - 1, widest, round_))
    fronts: dict[tuple[int, int, int], list[tuple[int, int, _Chain]]] = {}
    work = costs.work

    def offer(key: tuple[int, int, int], term: int, bus: int, chain: _Chain) -> None:
        nonlocal bound
        if key[0] == n:
            bound = min(bound, max(term, bus))
        front = fronts.setdefault(key, [])
        for k, (t, b, c) in enumerate(front):
            if t <= term and b <= bus:
                if (t, b) == (term, bus) and _preference(term, _flatten(chain)) < _preference(t, _flatten(c)):
                    front[k] = (term, bus, chain)
                return
        front[:] = [e for e in front if not (term <= e[0] and bus <= e[1])]
        front.append((term, bus, chain))

    def extend(cut: int, used: int, r_before: int | None, front: list[tuple[int, int, _Chain]]) -> None:
        for r in options:
            if used + r > num_procs:
                continue
            link = costs.scaled_cut_term(cut, r_before, r, round_) if r_before is not None else 0
            cut_bus = costs.scaled_cut_bus(cut, round_) if r_before is not None else 0
            left = num_procs - used - r
            for last in range(cut, n):
                term = costs.scaled_stage_term(cut, last, r, round_)
                if term > bound:
                    break  # longer stages on r replicas only cost more
                rest = work[n] - work[last + 1]
                if rest and (not left or rest * round_ > bound * left):
                    continue  # the layers after this stage cannot finish within the bound on what is left
                extra = max(term, link)
                bus = costs.scaled_stage_bus(cut, last, r, round_) + cut_bus
                for t, b, chain in front:
                    if max(t, extra) <= bound and b + bus <= bound:
                        offer((last + 1, used + r, r), max(t, extra), b + bus, (chain, Stage(cut, last, r)))

    extend(0, 0, None, [(0, 0, None)])
    for cut in range(1, n):  # fronts at cut are final once every stage ending at cut − 1 was offered
        for key in sorted(k for k in fronts if k[0] == cut):
            extend(cut, key[1], key[2], list(fronts[key]))
    finals = [(max(t, b), _flatten(c)) for (at, _, _), front in fronts.items() if at == n for t, b, c in front]
    scaled, stages = min(finals, key=lambda e: _preference(*e))
    return Plan(stages, Fraction(scaled, round_))


def reference_replicated_timing(table: TaskTable, plan_: Plan, num_procs: int, interconnect: Interconnect,
                       coalesce: int | None) -> Replicated:
    """The plan's stages on their replicas: `table` unfolded by J = lcm(replicas) with update groups of r per
    stage, micro-batch t of a stage on its replica t mod r (round-robin), the updates on the root. The
    period is the busiest processor or channel; the bodies run each micro-batch's forward block and
    backward block (1F1B; the best of forward first, backward first, or all forwards first, by
    `best_ordering`), and the lags are the minimal ones on the interconnect.

    `coalesce` = m instead unfolds by m with one update group of m per layer (PipeDream-2BW's coalesced
    gradients, ICML'21 §3), for plans without replicas."""
    laid = _layout(table, plan_, num_procs, interconnect, coalesce)
    unfolded, period, stage_of, replicas = laid.table, laid.period, laid.stage_of, laid.replicas
    placement = list(laid.placement)

    def block(v: int) -> tuple[int, int, int, int]:
        """(micro-batch of the copy within the period, block, order in block); U after its group's last B."""
        t, k = unfolded.tasks[v], unfolded.phase[v]
        if t.kind == "F":
            return (k, 0, t.layer, 0)
        g = replicas[t.layer]
        return ((k * g + g - 1) if t.kind == "U" else k, 1, -t.layer, 1 if t.kind == "U" else 0)

    blocks = [block(v) for v in range(len(unfolded))]  # each key reads them, several times per task
    keys: list[Callable[[int], tuple]] = [
        blocks.__getitem__,
        lambda v: (blocks[v][0], 1 - blocks[v][1], *blocks[v][2:]),
        lambda v: (blocks[v][1], *blocks[v]),
    ]
    comm = Comm(placement, interconnect, num_procs)
    trials = [best_ordering(unfolded, placement, num_procs, period, [key], interconnect=interconnect) for key in keys]
    for target in default_targets(unfolded, placement, num_procs, asap_times(unfolded)):
        bodies = order_bodies(placement, num_procs, _by_target(target, period))
        trials.append(pack_bodies(unfolded, bodies, period, target, comm))
    # 1F1B-RR: every copy at its earliest fit after its producers, in the order of the steady state's slots.
    priority = _topological_by(unfolded, _round_robin_targets(unfolded, plan_, stage_of, replicas, period))
    listed = modulo_list_schedule(unfolded, period, num_procs, priority, fixed=placement)
    if listed is not None:
        trials.append(timed(unfolded, [at % period for at in listed[1]], period, comm))
    if coalesce:
        trials.append(timed(unfolded, _coalesced_starts(unfolded, plan_, stage_of, period, interconnect), period,
                            comm))
    else:
        trials.append(timed(unfolded, _round_robin_starts(unfolded, plan_, stage_of, period, interconnect), period,
                            comm))
    # Scored by (most stale read, most versions held, total staleness, deepest lag), first trial among equals.
    # The versions are counted only for the trials of the least staleness: no other trial can win.
    # A trial equal to an earlier one (body orders that coincide) settles and scores the same and comes later: it
    # cannot win, so it is not scored again.
    staled: list[tuple[int, Timing, PeriodicSchedule, dict[tuple[str, int, int], int], dict[int, int]]] = []
    tried: set[tuple[object, ...]] = set()
    for found in trials:
        seen = (tuple(found.start), tuple(found.lag), tuple(found.arrival.items()))
        if seen in tried:
            continue
        tried.add(seen)
        settled = _settled_lags(unfolded, found, period, comm)
        if settled is not None:
            lags, arrival = settled
            timing = timing_of(unfolded, found.start, lags, period, arrival)
            schedule = periodic_of(unfolded, placement, timing.start, timing.lag, period, num_procs, timing.arrival)
            pins = schedule.forward_pins()  # all that staleness and versions read
            stale = periodic_staleness(schedule, table.graph, pins=pins)
            staled.append((max(stale.values(), default=0), timing, schedule, pins, stale))
    # The micro-batch-major orders keep every layer's update copies in cyclic order, so one always fits.
    assert staled, "no body order keeps the update copies in order"
    least = min(most for most, *_ in staled)
    candidates: list[tuple[tuple[int, int, int, int], int, Timing]] = []
    for k, (most, timing, schedule, pins, stale) in enumerate(staled):
        if most == least:
            versions = periodic_versions(schedule, table.graph, pins)
            score = (most, max(versions.values(), default=1), sum(stale.values()), max(timing.lag, default=0))
            candidates.append((score, k, timing))
    return Replicated(unfolded, placement, period, min(candidates)[2])


def reference_layer_floor(floor: StalenessFloor, loop: tuple[int, int, int], placement: Sequence[int],
                          start: Sequence[int], period: int) -> int:
    """The least staleness layer `loop` = (layer, F task, U task) can have under any lags these starts and
    the placement's transfers allow."""
    _, f, u = loop
    src, dst, cost, transfer = floor.src, floor.dst, floor.cost, floor.transfer
    reach = [_UNREACHED] * len(cost)
    reach[f] = 0
    # A path from f holds tasks above f (edges run forward); only edges into f+1..u can end on one to u
    for e in range(bisect_right(dst, f), bisect_right(dst, u)):
        a = src[e]
        lag_a = reach[a]
        if lag_a == _UNREACHED:
            continue
        b = dst[e]
        ready = start[a] + cost[a] + (transfer[e] if placement[a] != placement[b] else 0)
        need = lag_a - ((start[b] - ready) // period)
        if need > reach[b]:
            reach[b] = need
    if reach[u] == _UNREACHED:
        return 0
    return staleness_from_span(reach[u] * period + start[u] + cost[u] - start[f], period)


def reference_order_bodies(placement: Sequence[int], num_procs: int, key: Callable[[int], tuple]) -> list[list[int]]:
    """Each processor's tasks sorted by `key`."""
    bodies: list[list[int]] = [[] for _ in range(num_procs)]
    for v, p in enumerate(placement):
        bodies[p].append(v)
    return [sorted(body, key=key) for body in bodies]


def reference_pack_circular(release: Sequence[int], cost: Sequence[int], period: int) -> list[int]:
    """Starts (mod P) for tasks in the given order, each at or after its release offset, without overlap
    around the period (a task may wrap past P). The load must be ≤ P."""
    if not release:
        return []
    if sum(cost) > period:
        raise ValueError(f"body of {sum(cost)} cycles does not fit the period {period}")
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


def reference_list_targets(table: TaskTable, placement: Sequence[int], num_procs: int,
                           priority: Sequence[int]) -> list[int]:
    """Start times of one iteration run alone on the placement (each processor serial, tasks in `priority`)."""
    free = [0] * num_procs
    at = [0] * len(table)
    for v in priority:
        p = placement[v]
        at[v] = max([free[p]] + [at[u] + table.cost[u] for u in table.preds[v]])
        free[p] = at[v] + table.cost[v]
    return at


def reference_cut_holds(table: TaskTable, interconnect: Interconnect) -> tuple[list[int], list[int]]:
    """`PlanCosts`' cut_forward and cut_backward: per cut, the holds of the edges crossing it each way."""
    position = {layer.index: i for i, layer in enumerate(table.graph.network.layers)}
    n = len(position)
    cut_forward, cut_backward = [0] * (n + 1), [0] * (n + 1)
    for v, ps in enumerate(table.preds):
        for u, w in zip(ps, table.pred_words[v], strict=True):
            a, b = position[table.tasks[u].layer], position[table.tasks[v].layer]
            for cut in range(min(a, b) + 1, max(a, b) + 1):
                if a < b:
                    cut_forward[cut] += interconnect.hold(w)
                else:
                    cut_backward[cut] += interconnect.hold(w)
    return cut_forward, cut_backward


def reference_update_chain_lags(table: UnfoldedTable, start: Sequence[int], lag: Sequence[int],
                                period: int) -> list[int] | None:
    """`lag` raised until the update order holds around the period; None when no lags make it hold."""
    out = list(lag)
    chains: dict[int, dict[int, int]] = {}
    for v, t in enumerate(table.tasks):
        if t.kind == "U":
            chains.setdefault(t.layer, {})[table.phase[v]] = v
    for chain in chains.values():
        order = [chain[q] for q in range(len(chain))]
        for _ in range(len(order) + 2):
            changed = False
            for k, v in enumerate(order):
                u = order[k - 1]
                wrap = 1 if k == 0 else 0
                need = out[u] - wrap - ((start[v] - start[u] - table.cost[u]) // period)
                if need > out[v]:
                    out[v], changed = need, True
            if not changed:
                break
        else:
            return None
    return out
