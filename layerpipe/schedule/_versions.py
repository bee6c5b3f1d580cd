"""Weight versions held at once in the steady state of a periodic timing (`periodic_versions`; the memory of
weight stashing the simulator's memory sweep counts, `layerpipe.sim._memory`), layer by layer (`layer_versions`),
so that a pass holding a trial's starts and lags but no schedule (`_replicated_scores`) counts them the same way.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence

from layerpipe.dfg import TrainingGraph
from layerpipe.schedule._periodic import PeriodicSchedule


def periodic_versions(schedule: PeriodicSchedule, graph: TrainingGraph,
                      pins: Mapping[tuple[str, int, int], int] | None = None) -> dict[int, int]:
    """Weight versions of each layer held at once in the steady state of the periodic timing: the current
    version plus every version a forward has read and its backward has not finished with (under `stash`
    E_l(t) uses the version F_l(t) read; without a stash edge, while the forward runs). Counted the way the
    simulator's memory sweep counts them (`layerpipe.sim._memory`), on the periodic timing itself: a window
    of iterations deep in the steady state, versions read from `read_pins` (`pins`, when the caller has
    them), update ends from the U slots.

    The window is periods 2D..3D (D = deepest lag + 2) of reads from periods 0..4D. Deep in the steady state
    the timing repeats every period with every version one round (J/g updates) newer, so the count at τ + P
    is the count at τ: the window's largest count is its first period's (`_steady_period`), which needs only
    the reads that touch that period — a few periods' worth instead of 4D. That holds when every slot starts
    in [0, P) at a lag ≥ 0 and every update and backward lasts at most P (a valid schedule's tasks fit the
    period); otherwise the whole window is swept.
    """
    pins = schedule.read_pins() if pins is None else pins
    slots = schedule.slot_by_key
    period, unfold = schedule.period, schedule.unfold
    depth = max((s.lag for s in slots.values()), default=0) + 2
    steady = period > 0 and all(s.lag >= 0 and 0 <= s.start < period for s in slots.values())
    out: dict[int, int] = {}
    for layer, back in version_readers(graph):
        if back is None or ("U", layer) not in schedule.costs:
            out[layer] = 1
            continue
        per = schedule.phases("U", layer)
        reads = [((f.start, f.lag), (e.start, e.lag), pins.get(("F", layer, k)))
                 for k in range(unfold) for f, e in ((slots[("F", layer, k)], slots[(back, layer, k)]),)]
        updates = [(u.start, u.lag, u.phase) for q in range(per) for u in (slots[("U", layer, q)],)]
        out[layer] = layer_versions(reads, updates, schedule.group(layer), per, schedule.costs[("U", layer)],
                                    schedule.costs[(back, layer)], period, depth, steady)
    return out


def version_readers(graph: TrainingGraph) -> list[tuple[int, str | None]]:
    """Per layer with weights, in network order, the kind of the task whose end releases the version a forward
    read (`periodic_versions`): the first task holding its E under `stash`, else F (2BW's floor makes it older);
    None when the layer has no such task (it holds one version)."""
    stashing = {e.dst.layer for e in graph.edges if e.role == "stash"}
    backward: dict[int, str] = {}  # the first task of each layer that holds its E
    for task in graph.tasks:
        if "E" in task.kind:
            backward.setdefault(task.layer, task.kind)
    out: list[tuple[int, str | None]] = []
    for layer in graph.network.layers:
        if layer.has_weights:
            # no stash: a forward holds its version only while it runs
            out.append((layer.index, backward.get(layer.index) if layer.index in stashing else "F"))
    return out


def layer_versions(reads: Sequence[tuple[tuple[int, int], tuple[int, int], int | None]],
                   updates: Sequence[tuple[int, int, int]], g: int, per: int, c_u: int, c_e: int, period: int,
                   depth: int, steady: bool) -> int:
    """`periodic_versions` of one layer: `reads[k]` = ((start, lag) of F phase k, (start, lag) of the task that
    releases its version, its pin or None), `updates[q]` = (start, lag, phase) of U phase q, the group g, J/g,
    the costs of U and of the releasing task; `depth` and `steady` are the schedule's (D, and whether every slot
    starts in [0, P) at a lag ≥ 0)."""
    unfold = len(reads)
    periods = 4 * depth
    lo, hi = 2 * depth * period, 3 * depth * period
    whole = range(periods)
    last_end = periods
    fast = steady and c_u <= period and c_e <= period
    if fast:
        hi, last_end = lo + period, 2 * depth + 2  # an update ending by lo + P ran in a period below 2D + 2
    # Update ends of periods j < last_end that apply an update ≥ 0: per·(j − lag) + phase ≥ 0, i.e.
    # j ≥ lag − ⌊phase / per⌋ (each copy's ends as one range, not every period filtered). Only those in the window
    # are listed; the ones before it are only counted (`_most_versions_held` reads how many ended by each τ).
    ends: list[int] = []
    before = 0
    for u_start, u_lag, u_phase in updates:
        end = u_start + c_u
        first = max(0, u_lag - u_phase // per)
        if period > 0:
            # periods of the copy's ends below lo, and below hi: j·P + end < x ⇔ j < ⌈(x − end)/P⌉
            below_lo = min(last_end, max(first, -((end - lo) // period)))
            below_hi = min(last_end, max(below_lo, -((end - hi) // period)))
            before += below_lo - first
            ends += [j * period + end for j in range(below_lo, below_hi)]
        else:  # every end is `end`: before the window or in it
            count = max(0, last_end - first)
            if end < lo:
                before += count
            elif end < hi:
                ends += [end] * count
    ends.sort()
    events: list[tuple[int, int, int]] = []  # (time, +1/−1, version): a forward's read until its E ends
    for k, ((f_start, f_lag), (e_start, e_lag), pin) in enumerate(reads):
        if pin is None:
            continue
        for j in (_steady_period(f_lag - e_lag, depth) if fast else whole):
            t = unfold * (j - f_lag) + k
            if t < 0:
                continue
            begin = j * period + f_start
            finish = (t // unfold + e_lag) * period + e_start + c_e
            events.append((begin, t // g - pin, finish))
    return _most_versions_held(events, ends, before, lo, hi)


def _steady_period(lag_gap: int, depth: int) -> range:
    """The periods j of the reads (F of period j, its backward lag_F − lag_E = `lag_gap` periods later or
    earlier) that begin, finish or are held in [2D·P, (2D + 1)·P): a read begins in period j and its backward
    (start in [0, P), at most P long) ends in period j − lag_gap or the next, so j lies in
    2D − 1 + min(0, lag_gap) .. 2D + max(0, lag_gap)."""
    return range(2 * depth - 1 + min(0, lag_gap), 2 * depth + max(0, lag_gap) + 1)


def _most_versions_held(events: list[tuple[int, int, int]], ends: list[int], before: int, lo: int, hi: int) -> int:
    """The most distinct versions held at a time τ in [lo, hi): the versions of the reads (begin, version,
    finish) with begin ≤ τ < finish, plus the current one (updates ended by τ: `before` the window, and `ends`,
    the sorted ends in it). A sweep over the event times with a count per active version (readers of one version
    overlap)."""
    begins = sorted((b, v) for b, v, _ in events)
    finishes = sorted((f, v) for _, v, f in events)
    active: dict[int, int] = {}
    best, i, k = 1, 0, 0
    # Only times in the window count; the reads that begin or finish before one are caught up on the way (the
    # state at τ is every begin and finish ≤ τ, however many times were visited before it).
    times = {b for b, _ in begins if lo <= b < hi} | {f for f, _ in finishes if lo <= f < hi}
    times.update(ends)
    for tau in sorted(times):
        while i < len(begins) and begins[i][0] <= tau:
            active[begins[i][1]] = active.get(begins[i][1], 0) + 1
            i += 1
        while k < len(finishes) and finishes[k][0] <= tau:
            v = finishes[k][1]
            active[v] -= 1
            if not active[v]:
                del active[v]
            k += 1
        current = before + bisect_right(ends, tau)
        best = max(best, len(active) + (current not in active))
    return best
