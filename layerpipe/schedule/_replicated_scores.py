"""Which trial timing of a replicated layout wins (`_planner._replicated_timing`): its trials — body orders and
packings of one unfolded table on one placement and period — are settled (`_settled_lags`: update lags raised
until the update order holds, the transfers re-planned on them) and scored by (most stale read, most versions
held, total staleness, deepest lag), the first trial among equals (`best_trial`).

The scores come straight from each trial's starts, lags and arrivals (`_ForwardPins`): the forward pins,
staleness and versions that `periodic_of`'s schedule of the trial would give (`PeriodicSchedule.forward_pins`,
`_validate.periodic_staleness`, `_versions.periodic_versions`), with what does not change between trials — each
layer's update copies, readers and the tasks that release a version, their costs, groups and phases — found once
per layout, so no trial's schedule is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from layerpipe.dfg import TrainingGraph
from layerpipe.schedule._comm import Comm, channel_timing
from layerpipe.schedule._comm_timing import Timing, comm_timing, replanned_alike, timing_of
from layerpipe.schedule._lags import _longest_lags
from layerpipe.schedule._periodic import PeriodicSchedule, seen_updates
from layerpipe.schedule._unfold import UnfoldedTable, periodic_of, update_chain_lags
from layerpipe.schedule._validate import periodic_staleness
from layerpipe.schedule._versions import layer_versions, periodic_versions, version_readers


class Trial(NamedTuple):
    """A trial timing without its staleness (`Timing`'s other fields): its starts, their minimal lags and the
    planned arrivals of its transfers (`comm_timing`)."""

    start: list[int]
    lag: list[int]
    arrival: dict[tuple[int, int], int]


def timed_trial(table: UnfoldedTable, start: list[int], period: int, comm: Comm) -> Trial:
    """`_comm_timing.timed` without the staleness (`loop_spans`), which `best_trial` does not read."""
    lag, arrival = comm_timing(table, start, period, comm)
    return Trial(start, lag, arrival)


#: A forward copy as `_ForwardPins.pins` reads it: (task, its key in the read delays, its key in the pins, ⌊k/g⌋ − 1
#: of its phase k).
_Reader = tuple[int, tuple[str, int] | tuple[str, int, int], tuple[str, int, int], int]

#: Per layer with weights: (layer, None) when it holds one version, else (layer, its F copies by phase, the
#: copies releasing each phase's version, its U copies by phase, g, J/g, c_U, c_release) — `periodic_versions`'
#: slots, as task indices.
_Versioned = tuple[int, tuple[list[int], list[int], list[int], int, int, int, int] | None]


class _ForwardPins:
    """`PeriodicSchedule.forward_pins` and `periodic_staleness` of the timings of one layout, straight from the
    starts, lags and arrivals: what `periodic_of` would put in each trial's schedule (its slots, costs and read
    delays) and `_validate.schedule_pins` would read back, with the trial-independent part — each layer's update
    copies and readers, their costs, groups and phases — found once; and `versions`, `periodic_versions` of such
    a schedule under those pins."""

    def __init__(self, table: UnfoldedTable, placement: Sequence[int], period: int, graph: TrainingGraph) -> None:
        self.table, self.placement, self.period, self.graph = table, placement, period, graph
        tasks, phase = table.tasks, table.phase
        self.costs = costs = {(t.kind, t.layer): c for t, c in zip(tasks, table.cost, strict=True)}  # `periodic_of`'s
        groups = dict(table.groups)
        updates: dict[int, list[int]] = {}
        readers: dict[int, list[int]] = {}
        for v, t in enumerate(tasks):
            if t.kind == "U":
                updates.setdefault(t.layer, []).append(v)
            elif t.kind == "F":
                readers.setdefault(t.layer, []).append(v)
        #: Per layer with readers and updates, by layer: (its F copies by phase, each with its key in the read
        #: delays and in the pins and its phase's ⌊k/g⌋ − 1; its U copies, J/g, c_U, whether a zero-cycle update
        #: is read by zero-cycle readers — `read_offset`'s extra cycle).
        self.layers: list[tuple[list[_Reader], list[int], int, int, bool]] = []
        for layer in sorted(readers):
            if layer in updates and ("U", layer) in costs:
                g = groups.get(layer, 1)
                xs = [(x, ("F", layer, phase[x]) if phase[x] else ("F", layer), ("F", layer, phase[x]),
                       phase[x] // g - 1) for x in sorted(readers[layer], key=phase.__getitem__)]
                c_u = costs[("U", layer)]
                self.layers.append((xs, updates[layer], table.unfold // g, c_u,
                                    c_u == 0 and costs.get(("F", layer), 1) == 0))
        # `periodic_of`'s read delays: keyed by the reader's (kind, layer, phase), the last read of a key winning
        self.reads = [(u, x, (tasks[x].kind, tasks[x].layer, phase[x]) if phase[x] else (tasks[x].kind, tasks[x].layer))
                      for u, x, _ in table.weight_reads]
        self.weighted = {t.layer for t in graph.tasks if t.kind == "U"}
        self._versioned: list[_Versioned] | None = None  # made on the first `versions` (most layouts need none)
        #: `layer_versions` by its inputs: trials that time a layer alike count it once.
        self._counted: dict[tuple[object, ...], int] = {}
        self._hot = 0  # the index in `_versioned` of the layer that last raised a count (`versions`)

    def pins(self, start: Sequence[int], lag: Sequence[int],
             arrival: dict[tuple[int, int], int]) -> dict[tuple[str, int, int], int]:
        """The forward pins, keyed and ordered as `forward_pins`: each reader's newest update by `seen_updates`
        (the one rule of pinned reads), over the copies with their `read_offset` from the reader's processor."""
        place, cost, phase = self.placement, self.table.cost, self.table.phase
        delays: dict[tuple[str, int] | tuple[str, int, int], int] = {}
        if arrival:
            for u, x, key in self.reads:
                if (u, x) in arrival:
                    delays[key] = arrival[(u, x)] - start[u] - cost[u]
        period = self.period
        out: dict[tuple[str, int, int], int] = {}
        for xs, us, per, c_u, zero in self.layers:
            if len(us) == 1 and not zero:
                # one copy, read `read_offset` = c_U after its start from every processor: `seen_updates` inlined
                q = us[0]
                end, q_lag, q_phase = start[q] + c_u, lag[q], phase[q]
                for x, delay_key, key, newest in xs:
                    best = per * ((start[x] - end - delays.get(delay_key, 0)) // period - q_lag + lag[x]) + q_phase
                    out[key] = newest - best
                continue
            # `read_offset`: the update's cost, one more for a zero-cycle update on a zero-cycle reader's processor
            offsets = {px: [(start[q], lag[q], phase[q], c_u + (zero and place[q] == px)) for q in us]
                       for px in {place[x] for x, *_ in xs}}
            for x, delay_key, key, newest in xs:
                best = max(seen_updates(start[x], lag[x], offsets[place[x]], per, period, delays.get(delay_key, 0)))
                out[key] = newest - best
        return out

    def staleness(self, pins: dict[tuple[str, int, int], int]) -> dict[int, int]:
        """`periodic_staleness` of these pins: per weighted layer, its stalest forward read, by layer."""
        out: dict[int, int] = {}
        for (_, layer, _), stale in pins.items():
            if layer in self.weighted:
                out[layer] = max(out.get(layer, stale), stale)
        return dict(sorted(out.items()))

    def versions(self, start: Sequence[int], lag: Sequence[int], pins: dict[tuple[str, int, int], int],
                 above: int | None = None) -> int | None:
        """max(`periodic_versions(schedule, graph, pins).values()`, default 1) of the trial's schedule (a period
        > 0); None as soon as some layer holds more than `above` (the caller needs no count above it)."""
        if self._versioned is None:
            self._versioned = self._versioned_layers()
        period = self.period
        depth = max(lag, default=0) + 2
        steady = min(lag, default=0) >= 0 and min(start, default=0) >= 0 and max(start, default=0) < period
        counted, versioned = self._counted, self._versioned
        most = 1
        # The layer that held the most in the last count first: trials of one layout peak on the same layers, so a
        # count that will exceed `above` most often does so at once
        hot = self._hot
        for i in (hot, *range(hot), *range(hot + 1, len(versioned))) if versioned else ():
            layer, found = versioned[i]
            if found is None:
                continue  # one version (most starts at 1)
            fs, es, us, g, per, c_u, c_e = found
            reads = tuple(((start[f], lag[f]), (start[e], lag[e]), pins.get(("F", layer, k)))
                          for k, (f, e) in enumerate(zip(fs, es, strict=True)))
            updates = tuple((start[u], lag[u], k) for k, u in enumerate(us))
            key = (layer, reads, updates, depth, steady)
            held = counted.get(key)
            if held is None:
                held = counted[key] = layer_versions(reads, updates, g, per, c_u, c_e, period, depth, steady)
            if held > most:
                most = held
                self._hot = i
                if above is not None and most > above:
                    return None
        return None if above is not None and most > above else most

    def _versioned_layers(self) -> list[_Versioned]:
        """`periodic_versions`' slots of every layer with weights, as task indices (`_Versioned`)."""
        table, costs = self.table, self.costs
        index = {(t.kind, t.layer, k): v for v, (t, k) in enumerate(zip(table.tasks, table.phase, strict=True))}
        groups = dict(table.groups)
        out: list[_Versioned] = []
        for layer, back in version_readers(self.graph):
            if back is None or ("U", layer) not in costs:
                out.append((layer, None))
                continue
            g = groups.get(layer, 1)
            per = table.unfold // g
            out.append((layer, ([index[("F", layer, k)] for k in range(table.unfold)],
                                [index[(back, layer, k)] for k in range(table.unfold)],
                                [index[("U", layer, q)] for q in range(per)], g, per, costs[("U", layer)],
                                costs[(back, layer)])))
        return out


def best_trial(unfolded: UnfoldedTable, placement: list[int], period: int, num_procs: int, comm: Comm,
               graph: TrainingGraph, trials: Sequence[Trial]) -> Timing:
    """The winner of `trials`, settled (`_settled_lags`): by (most stale read, most versions held, total
    staleness, deepest lag), the first trial among equals; its `Timing` (with the staleness of its loops).

    The staleness is read off the forward pins (`_ForwardPins`); the versions only for the trials of the least
    staleness, when there are several: no other trial can win, and a sole one wins whatever it holds. Those are
    counted best rest first (total staleness, deepest lag, trial), so each after the first wins only with fewer
    versions than the best so far, and its count stops at a layer holding as many. The trials are distinct (a
    trial equal to an earlier one would settle and score the same and come later: it could not win; the caller,
    `_planner._replicated_timing`, times body orders with equal starts once)."""
    forward = _ForwardPins(unfolded, placement, period, graph) if period > 0 else None
    staled: list[tuple[int, Trial, dict[tuple[str, int, int], int], dict[int, int]]] = []
    for found in trials:
        settled = _settled_lags(unfolded, found, period, comm)
        if settled is not None:
            lags, arrival = settled
            trial = Trial(found.start, lags, arrival)
            if forward is not None:
                pins = forward.pins(trial.start, trial.lag, trial.arrival)
                stale = forward.staleness(pins)
            else:  # no period to pin by: the schedule's own pins
                schedule = _schedule_of(unfolded, placement, trial, period, num_procs)
                pins = schedule.forward_pins()
                stale = periodic_staleness(schedule, graph, pins=pins)
            staled.append((max(stale.values(), default=0), trial, pins, stale))
    # The micro-batch-major orders keep every layer's update copies in cyclic order, so one always fits.
    assert staled, "no body order keeps the update copies in order"
    least = min(most for most, *_ in staled)
    if sum(most == least for most, *_ in staled) == 1:
        won = next(trial for most, trial, *_ in staled if most == least)
    else:
        # The winner has the fewest versions, then the least (total staleness, deepest lag, trial index). Scored
        # in the order of that rest: every trial after the first then beats the best so far only with fewer
        # versions than it, so its count stops as soon as one layer holds as many (most trials: one layer).
        tied = sorted(((sum(stale.values()), max(trial.lag, default=0)), k, trial, pins)
                      for k, (most, trial, pins, stale) in enumerate(staled) if most == least)
        best: tuple[tuple[int, int, int, int], int, Trial] | None = None
        for rest, k, trial, pins in tied:
            above = None if best is None else best[0][1] - 1
            if forward is not None:
                held = forward.versions(trial.start, trial.lag, pins, above)
                if held is None:
                    continue  # as many versions as the best or more: it cannot win
            else:
                schedule = _schedule_of(unfolded, placement, trial, period, num_procs)
                held = max(periodic_versions(schedule, graph, pins).values(), default=1)
            scored = ((least, held, *rest), k, trial)
            if best is None or scored < best:
                best = scored
        assert best is not None
        won = best[2]
    return timing_of(unfolded, won.start, won.lag, period, won.arrival)


def _schedule_of(table: UnfoldedTable, placement: list[int], timing: Trial, period: int,
                 num_procs: int) -> PeriodicSchedule:
    return periodic_of(table, placement, timing.start, timing.lag, period, num_procs, timing.arrival)


#: Rounds of re-planning a replicated timing's transfers on its raised update lags.
SETTLE_ROUNDS = 8


def _settled_lags(table: UnfoldedTable, found: Timing | Trial, period: int,
                  comm: Comm) -> tuple[list[int], dict[tuple[int, int], int]] | None:
    """`found`'s lags raised until the update order holds (`update_chain_lags`), with the transfers planned on
    those lags: the raised update lags move the updates' plan times, so the weight copies readers pin and the
    bus's order change with them, and the arrivals `found` was timed with would not be the plan's. Re-planned
    (`channel_timing` on the new plan times, then the least lags those arrivals allow, raised again) until the
    lags stop changing; None when the update order admits no lags or the rounds run out."""
    lags = update_chain_lags(table, found.start, found.lag, period)
    if lags is None or not found.arrival:
        return None if lags is None else (lags, found.arrival)
    if lags == found.lag and replanned_alike(table, found.start, period, comm, found.lag, found.arrival):
        # The first round would re-plan `found`'s own plan times: the same arrivals and lags, and the update order
        # already holds on them, so it would return them (almost every trial).
        return lags, dict(found.arrival)
    for _ in range(SETTLE_ROUNDS):
        arrival = channel_timing(table, comm, found.start, period,
                                 [lag * period + s for lag, s in zip(lags, found.start, strict=True)])
        # The least lags at or above the current ones that these arrivals allow: a lag raised by the update order
        # carries to the tasks after it (the larger of the current lags and the least ones from zero let a
        # consumer of a raised task start before its transfer arrived: 174.4 cycles per iteration simulated against
        # a planned 170, pipedream on 10 processors, bus:1:2, stages 1x5 | 2-4x1 | 5x1 | 6x1 | 7-8x2).
        need = _longest_lags(table, found.start, period, arrival, floor=lags)
        again = update_chain_lags(table, found.start, need, period)
        if again is None:
            return None
        if again == lags:
            return lags, arrival
        lags = again
    return None
