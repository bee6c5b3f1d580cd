"""The list simulation that orders one step of the `ooo` policy (Oh et al., "Out-Of-Order BackProp", EuroSys'22,
§5; the policy, its sources and its layouts are in `_ooo.py`).

Stage s runs on processor s mod N. Its ops per micro-batch t are F_s(t) (forward), I_s(t) (input gradient: the
stage's A and E) and W_s(t) (weight gradient: G; W_s(m−1) also carries the per-step update U). Inputs:

- F_s(t) needs F_{s−1}(t) (plus the transfer of the activation words if on another processor); with `push` and
  more than one stage, F_0(t) for t ≥ N also needs W_0(t − N) (at most N micro-batches in flight);
- I_s(t) needs F_s(t), and below the last stage I_{s+1}(t) (plus the transfer of the error words) and
  W_s(t − 1) (W_s(t) runs before I_s(t+1): the code's race-condition rule);
- W_s(t) needs I_s(t), on the last stage I_s(m − 1) (its W waits for its last I).

At each decision every processor's candidate is the earliest start max(ready, free) among its ready ops, ties
by priority: first an I, or a W whose stage's next I has its input gradient and waits only for that W (both by
micro-batch, then the later stage), then an F (earliest stage, then micro-batch), then the oldest W. The op
placed is the earliest candidate over the processors (ties: priority, then the lower processor).

How it is fast (issue 14; the order is the one the scan over every candidate gave, byte for byte): each (kind,
stage) has one candidate, its next micro-batch, whose ready time changes only when a producer is placed and
whose priority only when its stage's I or the next stage's I advances. A processor keeps its candidates in two
heaps with lazy invalidation (a version per candidate; stale entries are dropped when they reach the top):
`avail`, ready by the processor's free time and ordered by priority alone (they all start at that free time),
and `future`, ready later, ordered by (ready, priority). A placement re-posts the few candidates it touches and
moves the `future` entries the processor's new free time has reached into `avail`. Within a processor no two
candidates share a priority (an I and a W of one stage with the same micro-batch cannot both be candidates
with the W's gate open), so (start, priority, processor) orders every candidate totally; priorities are
packed into one int.

A placement that leaves a candidate's (micro-batch, ready, priority) as it was keeps its entry.

`cutoff`: the caller's bound. Ops are placed in the order of their starts (a candidate a placement makes
ready waits for the op placed, or is on its processor, now free later), and a processor runs its ops one at a
time, so both free + the work it has left and the current start + any processor's work left are lower bounds
on the makespan; once one exceeds `cutoff` the simulation stops and returns None (the caller needs only
makespans up to `cutoff`, see `_ooo._plan_layouts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush
from typing import NamedTuple

from layerpipe.interconnect import Interconnect
from layerpipe.schedule import _native
from layerpipe.schedule._deps import StageInfo
from layerpipe.schedule._stage_programs import StageOp

KINDS = ("F", "I", "W")
F, I, W = 0, 1, 2
#: A processor's next op when it has none: after every real candidate.
IDLE: tuple[float, int, int, int, int] = (float("inf"), 0, 0, 0, 0)


class StageCost(NamedTuple):
    """Cycles of one stage's work: per micro-batch F, I (input gradient), W (weight gradient); per step U."""

    forward: int
    input_grad: int
    weight_grad: int
    update: int = 0


def processor_loads(costs: Sequence[StageCost], num_procs: int, microbatches: int) -> list[int]:
    """Cycles of every processor's ops in one step (stage s on s mod N): a lower bound on the step's makespan."""
    load = [0] * num_procs
    for s, c in enumerate(costs):
        load[s % num_procs] += microbatches * (c.forward + c.input_grad + c.weight_grad) + c.update
    return load


def makespan_bound(costs: Sequence[StageCost], num_procs: int, microbatches: int) -> int:
    """A lower bound on `ooo_order`'s makespan: every op of processor p needs the first forward to reach p's
    first stage p (at least the forwards of stages 0 .. p − 1: their transfers, never negative, are left out),
    and then p runs its ops one at a time."""
    load = processor_loads(costs, num_procs, microbatches)
    reach, bound = 0, 0
    for p in range(num_procs):
        if p:
            reach += costs[p - 1].forward
        bound = max(bound, reach + load[p])
    return bound


def _forward_transfers(num_procs: int, stages: StageInfo, interconnect: Interconnect) -> list[int]:
    """Per stage s, the uncontended transfer into F_s from F_{s−1} when they are on different processors."""
    return [0] + [interconnect.transfer_cycles(stages.words_into_forward(s)) if (s - 1) % num_procs != s % num_procs
                  else 0 for s in range(1, stages.num_stages)]


def ooo_order(costs: Sequence[StageCost], num_procs: int, microbatches: int, push: bool, stages: StageInfo,
              interconnect: Interconnect, cutoff: int | None = None) -> tuple[list[list[StageOp]], int] | None:
    """One step's per-processor order of stage s on processor s mod N (see the module docstring) and the step's
    makespan in the list simulation (uncontended transfers: an estimate, not the timed step); None once the
    makespan is known to exceed `cutoff`."""
    count, m, n = len(costs), microbatches, num_procs
    last = count - 1
    proc = [s % n for s in range(count)]
    # Arrival delay of F_s's input from F_{s−1} and of I_s's from I_{s+1}: the uncontended transfer, across processors.
    into_f = _forward_transfers(n, stages, interconnect)
    into_i = [interconnect.transfer_cycles(stages.words_into_backward(s)) if proc[s + 1] != proc[s] else 0
              for s in range(last)] + [0]
    dur_f = [c.forward for c in costs]
    dur_i = [c.input_grad for c in costs]
    dur_w = [c.weight_grad for c in costs]
    native = _native.ooo_order(m, n, into_f, into_i, dur_f, dur_i, dur_w, [c.update for c in costs], push,
                               processor_loads(costs, n, m), cutoff)
    if native is not None:  # the same simulation in C (`_kernels.c`: its scan finds what the heaps below find)
        if isinstance(native, str):  # "cutoff" or "cycle"
            if native == "cycle":
                raise AssertionError("ooo list simulation: no op is ready (a dependency cycle)")
            return None
        placed, makespan = native
        ordered: list[list[StageOp]] = [[] for _ in range(n)]
        for p, kind, s, t in placed:
            ordered[p].append((KINDS[kind], s, t))
        return ordered, makespan
    gated_push = push and last > 0  # the code gates every stage but the last: a single stage is not gated
    # End of every op, index s·m + t; −1 while not placed.
    end_f, end_i, end_w = [-1] * (count * m), [-1] * (count * m), [-1] * (count * m)
    nxt = [[0] * count for _ in KINDS]  # next micro-batch per kind and stage
    free = [0] * n
    left = processor_loads(costs, n, m)
    rows: list[list[StageOp]] = [[] for _ in range(n)]
    span = max(m, count) + 1  # priorities packed in one int: (class, a, b) → class·span² + a·span + b
    version = [0] * (3 * count)  # candidate c = 3·s + kind
    avail: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n)]  # (priority, c, t, version)
    future: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(n)]  # (ready, priority, c, t, version)

    def ready(kind: int, s: int, t: int) -> int:
        """When the op's inputs are in, or −1 if a producer has not been placed yet."""
        at = s * m + t
        if kind == F:
            r = 0
            if s:
                r = end_f[at - m]
                if r < 0:
                    return -1
                r += into_f[s]
            if gated_push and s == 0 and t >= n:
                e = end_w[t - n]
                if e < 0:
                    return -1
                r = max(r, e)
            return r
        if kind == I:
            r = end_f[at]
            if r < 0 or s == last:
                return r
            e = end_i[at + m]
            if e < 0:
                return -1
            r = max(r, e + into_i[s])
            if t:
                e = end_w[at - 1]
                if e < 0:
                    return -1
                r = max(r, e)
            return r
        return end_i[at] if s < last else end_i[s * m + m - 1]

    posted: list[tuple[int, int, int] | None] = [None] * (3 * count)  # (t, ready, priority) of the live entry
    dirty: set[int] = set()  # processors whose best candidate may have changed

    def post(kind: int, s: int) -> None:
        """(Re)place the candidate of (kind, s) in its processor's heaps, unless its entry there is the same."""
        c = 3 * s + kind
        t = nxt[kind][s]
        r = ready(kind, s, t) if t < m else -1
        if r < 0:
            if posted[c] is not None:
                version[c] += 1  # drops the entry
                posted[c] = None
                dirty.add(proc[s])
            return
        if kind == F:
            priority = span * span + s * span + t
        elif kind == I or (s < last and nxt[I][s] == t + 1 and t + 1 < m and end_i[(s + 1) * m + t + 1] >= 0):
            priority = t * span + count - s  # an I, or the W that gates a ready I: (0, t, −s)
        else:
            priority = 2 * span * span + t * span + s
        entry = (t, r, priority)
        if posted[c] == entry:
            return
        posted[c] = entry
        version[c] += 1
        p = proc[s]
        dirty.add(p)
        if r <= free[p]:
            heappush(avail[p], (priority, c, t, version[c]))
        else:
            heappush(future[p], (r, priority, c, t, version[c]))

    def best(p: int) -> tuple[float, int, int, int, int]:
        """(start, priority, p, c, t) of processor p's next op (`IDLE` when it has no candidate)."""
        a = avail[p]
        while a and a[0][3] != version[a[0][1]]:
            heappop(a)
        if a:
            priority, c, t, _ = a[0]
            return (free[p], priority, p, c, t)
        f = future[p]
        while f and f[0][4] != version[f[0][2]]:
            heappop(f)
        if f:
            r, priority, c, t, _ = f[0]
            return (r, priority, p, c, t)
        return IDLE

    for s in range(count):
        for kind in (F, I, W):
            post(kind, s)
    best_of = [best(p) for p in range(n)]
    most_left = max(left)  # an upper bound on max(left), refreshed when the cutoff test needs it
    for _ in range(3 * m * count):
        chosen = min(best_of)
        if chosen is IDLE:
            raise AssertionError("ooo list simulation: no op is ready (a dependency cycle)")
        start, _, here, c, t = chosen
        assert isinstance(start, int)
        s, kind = divmod(c, 3)
        at = s * m + t
        if kind == F:
            took = dur_f[s]
            end_f[at] = start + took
        elif kind == I:
            took = dur_i[s]
            end_i[at] = start + took
        else:
            took = dur_w[s] + (costs[s].update if t == m - 1 else 0)  # W_s(m−1) is the stage's last: then U
            end_w[at] = start + took
        free[here] = start + took
        left[here] -= took
        if cutoff is not None:
            # No later op starts before `start` (placements are in the order of their starts) and a processor
            # runs its ops one at a time after its free time: the makespan is at least these.
            if free[here] + left[here] > cutoff:
                return None
            if start + most_left > cutoff:
                most_left = max(left)
                if start + most_left > cutoff:
                    return None
        rows[here].append((KINDS[kind], s, t))
        nxt[kind][s] += 1
        dirty.clear()
        dirty.add(here)
        post(kind, s)  # the next op of this kind and stage, and every consumer of the op
        if kind == F:
            post(I, s)
            if s < last:
                post(F, s + 1)
        elif kind == I:
            post(W, s)
            if s:
                post(I, s - 1)
                post(W, s - 1)  # W_{s−1}'s gate looks at I_s's progress
        else:
            post(I, s)
            if push and s == 0:
                post(F, 0)
        f = future[here]
        while f and f[0][0] <= free[here]:  # the processor's new free time reached these: they start at it now
            _, priority, c, t, v = heappop(f)
            if v == version[c]:
                heappush(avail[here], (priority, c, t, v))
        for p in dirty:
            best_of[p] = best(p)
    return rows, max(free, default=0)
