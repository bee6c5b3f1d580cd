"""The timing engine: explicit per-processor op lists in, start and end cycle of every op out.

Rules (design notes §7, contract 2): each processor runs its ops in program order; an op starts when its
processor is free and all its inputs have arrived — a producer's output arrives when the producer ends
(same processor, or the `shared` interconnect) or when its transfer arrives (`links`, see
`layerpipe.sim._interconnect`).

Speed: the schedule is compiled once into integer lists — ops numbered processor-major (the op after i
on its processor is i + 1), durations, producer lists — and the hot loops touch only Python ints and
lists, no per-event objects.

Both interconnect models reduce to the same problem, a longest path through resources that each run a
fixed program: processors run their ops, and in `links` mode every link p→q runs its transfers in a
fixed order too. Transfers on a link go in order of producer end time, ties by consumer order; all
producers on p→q run on p, one after another, so when every such producer takes at least one cycle
their end times increase along p's program and the link order is simply (producer position, consumer
position) — known before timing. A transfer is then a node like an op: it starts when its producer has
ended and its link is free, occupies the link ceil(w / words_per_cycle) cycles and delivers `latency`
cycles later. Start times then do not depend on the order nodes are visited in, so a work-list sweep
computes them without a heap: run each resource as far as its inputs allow, park it on the first
producer that has not finished, wake it when that producer finishes.

Only a zero-duration producer can end in the same cycle as the op before it and so tie with it on a link;
schedules with such a producer take the event-driven engine (`_run_links_events`): end events in time
order from a heap of plain ints (end · n + op); all ops ending in a cycle (zero-duration ones started in
that cycle included) are processed before that cycle's transfers are queued per link in consumer order.
Tests check that both engines agree wherever both apply.

When no processor can proceed and ops remain, the engine raises `DeadlockError` naming every blocked
processor, its next op and the producers it waits for.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property

from layerpipe.errors import InputError
from layerpipe.schedule._ir import Op, OpSchedule
from layerpipe.sim._interconnect import SimConfig, link_hold_cycles
from layerpipe.sim._workload import Workload


class DeadlockError(InputError):
    """No processor can start its next op. `blocked[p] = (next op, producers it still waits for)`."""

    def __init__(self, blocked: dict[int, tuple[Op, tuple[Op, ...]]]) -> None:
        self.blocked = blocked
        parts = []
        for p, (op, waits) in sorted(blocked.items()):
            inputs = ", ".join(f"{w} (p{w.proc})" for w in waits) or "nothing (unreachable)"
            parts.append(f"p{p} blocked at {op} waiting for {inputs}")
        super().__init__("deadlock: " + "; ".join(parts))


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """A schedule as flat arrays. Op i runs on `proc[i]`; processor p owns ops bounds[p]..bounds[p+1]−1.

    `prods[i]` lists op i's producers; the same dependencies flattened in CSR form (for vectorised
    reports) are prod_idx[prod_ptr[i]:prod_ptr[i+1]] with the words each sends (`prod_words`) and its
    dependency role (`prod_role`).
    """

    schedule: OpSchedule
    ops: tuple[Op, ...]
    proc: list[int]
    bounds: list[int]
    dur: list[int]
    prods: list[list[int]]
    prod_ptr: list[int]
    prod_idx: list[int]
    prod_words: list[int]
    prod_role: list[str]

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_procs(self) -> int:
        return len(self.bounds) - 1

    @cached_property
    def consumers(self) -> list[list[tuple[int, int]]]:
        """Per op, its (consumer, words) pairs in consumer order; words of one pair summed over its edges."""
        out: list[dict[int, int]] = [{} for _ in range(self.num_ops)]
        ptr, idx, words = self.prod_ptr, self.prod_idx, self.prod_words
        for i in range(self.num_ops):
            for k in range(ptr[i], ptr[i + 1]):
                pairs = out[idx[k]]
                pairs[i] = pairs.get(i, 0) + words[k]
        return [list(pairs.items()) for pairs in out]

    @cached_property
    def link_plan(self) -> LinkPlan:
        """The transfers of the `links` model as nodes n, n+1, ... in link order (see the module docstring)."""
        n, procs, proc = self.num_ops, self.num_procs, self.proc
        transfers = sorted((proc[i] * procs + proc[j], i, j, w)
                           for i, pairs in enumerate(self.consumers) for j, w in pairs if proc[i] != proc[j])
        prods = [[i for i in row if proc[i] == proc[j]] for j, row in enumerate(self.prods)]
        bounds_lo, bounds_hi = self.bounds[:-1], self.bounds[1:]
        words: list[int] = []
        link = -1
        for k, (lk, i, j, w) in enumerate(transfers):
            prods[j].append(n + k)
            prods.append([i])
            words.append(w)
            if lk != link:
                if link >= 0:
                    bounds_hi.append(n + k)
                bounds_lo.append(n + k)
                link = lk
        if transfers:
            bounds_hi.append(n + len(transfers))
        return LinkPlan(prods, bounds_lo, bounds_hi, words, [t[1] for t in transfers])


@dataclass(frozen=True)
class LinkPlan:
    """Ops and transfers as one node list. Resource r (processors first, then the used links) runs nodes
    lo[r]..hi[r]−1; `producer[k]` is the op that transfer node n + k carries data from."""

    prods: list[list[int]]
    lo: list[int]
    hi: list[int]
    words: list[int]
    producer: list[int]


def compile_schedule(schedule: OpSchedule, workload: Workload) -> CompiledSchedule:
    """Number the ops (processor-major), look up durations, and turn the dependencies into integer lists."""
    ops: list[Op] = []
    proc: list[int] = []
    bounds = [0]
    for p, row in enumerate(schedule.procs):
        for op in row:
            if op.proc != p:
                raise InputError(f"op {op} is listed on p{p} but says it runs on p{op.proc}")
        ops.extend(row)
        proc.extend([p] * len(row))
        bounds.append(len(ops))
    keys = [(op.kind, op.unit, op.iteration) for op in ops]
    if len(set(keys)) != len(ops):
        seen: dict[tuple[str, int, int], Op] = {}
        for op, key in zip(ops, keys, strict=True):
            if key in seen:
                raise InputError(f"op {op} appears twice (p{seen[key].proc} and p{op.proc})")
            seen[key] = op
    durations = workload.durations
    dur = [durations.get((k[0], k[1]), -1) for k in keys]
    for i, d in enumerate(dur):
        if d < 0:
            dur[i] = workload.duration(ops[i])  # raises for an unknown task
    deps = workload.dependencies(schedule)
    index_of = {id(op): i for i, op in enumerate(ops)}
    by_key: dict[tuple[str, int, int], int] | None = None
    prods: list[list[int]] = []
    prod_ptr = [0]
    prod_idx: list[int] = []
    prod_words: list[int] = []
    prod_role: list[str] = []
    # The dependency map lists ops in schedule order; fall back to lookups if it ever does not.
    in_order = len(deps) == len(ops) and all(a is b for a, b in zip(deps, ops, strict=True))
    lists = deps.values() if in_order else (deps[op] for op in ops)
    for dep_list in lists:
        row = []
        for dep in dep_list:
            j = index_of.get(id(dep.producer))
            if j is None:  # an equal but distinct Op object
                by_key = by_key or {k: n for n, k in enumerate(keys)}
                j = by_key[dep.producer.key]
            row.append(j)
            prod_words.append(dep.words)
            prod_role.append(dep.role)
        prods.append(row)
        prod_idx.extend(row)
        prod_ptr.append(len(prod_idx))
    return CompiledSchedule(schedule, tuple(ops), proc, bounds, dur, prods, prod_ptr, prod_idx, prod_words, prod_role)


def run(compiled: CompiledSchedule, config: SimConfig) -> tuple[list[int], list[int]]:
    """Start and end cycle of every op (compiled numbering)."""
    c = compiled
    if config.interconnect == "shared":
        start, end = _sweep(c, c.prods, c.bounds[:-1], c.bounds[1:], c.dur, c.dur)
        return start, end
    if any(d == 0 for d in c.dur) and _zero_duration_sender(c):
        return _run_links_events(c, config.link_latency, config.link_words_per_cycle)
    plan = c.link_plan
    hold = [link_hold_cycles(w, config.link_words_per_cycle) for w in plan.words]
    occupy = c.dur + hold
    deliver = c.dur + [h + config.link_latency for h in hold]
    start, end = _sweep(c, plan.prods, plan.lo, plan.hi, deliver, occupy, plan.producer)
    return start[:c.num_ops], end[:c.num_ops]


def _zero_duration_sender(c: CompiledSchedule) -> bool:
    proc = c.proc
    return any(c.dur[i] == 0 and any(proc[j] != proc[i] for j, _ in c.consumers[i]) for i in range(c.num_ops))


def _sweep(c: CompiledSchedule, prods: list[list[int]], lo: list[int], hi: list[int], deliver: list[int],
           occupy: list[int], producer: list[int] | None = None) -> tuple[list[int], list[int]]:
    """Longest path through resources running fixed programs (see the module docstring).

    Node i of resource r starts at max(r free, every producer's delivery time); its result is delivered
    `deliver[i]` cycles after its start and it keeps its resource busy `occupy[i]` cycles.
    """
    total = len(prods)
    start = [0] * total
    end = [-1] * total  # delivery time; -1: not run yet
    nxt = lo.copy()
    free = [0] * len(lo)
    waiting: dict[int, list[int]] = {}  # node → resources parked on it
    work = list(range(len(lo) - 1, -1, -1))
    while work:
        r = work.pop()
        i, last, t = nxt[r], hi[r], free[r]
        while i < last:
            s = t
            for j in prods[i]:
                e = end[j]
                if e < 0:
                    waiting.setdefault(j, []).append(r)
                    break
                if e > s:
                    s = e
            else:
                start[i] = s
                end[i] = s + deliver[i]
                t = s + occupy[i]
                if waiting:
                    woken = waiting.pop(i, None)
                    if woken:
                        work.extend(woken)
                i += 1
                continue
            break
        nxt[r], free[r] = i, t
    if any(nxt[p] < hi[p] for p in range(c.num_procs)):
        _check_finished(c, nxt, [e >= 0 for e in end], prods, producer or [])
    return start, end


def _run_links_events(c: CompiledSchedule, latency: int, words_per_cycle: float) -> tuple[list[int], list[int]]:
    n, procs = c.num_ops, c.num_procs
    dur, proc, consumers = c.dur, c.proc, c.consumers
    pending = [len(set(row)) for row in c.prods]  # distinct producers: one transfer per pair
    ready = [0] * n  # latest input arrival seen so far
    start = [0] * n
    end = [0] * n
    done = [False] * n
    nxt = c.bounds[:-1].copy()
    last = c.bounds[1:]
    free = [0] * procs
    running = [False] * procs
    link_free: dict[int, int] = {}
    hold_of: dict[int, int] = {}  # words → link cycles, memoised
    heap: list[int] = []

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
                if q == p:
                    if ready[j] < t:
                        ready[j] = t
                    pending[j] -= 1
                    if not pending[j]:
                        try_start(q)
                else:
                    transfers.append((p * procs + q, j, i, words))
            try_start(p)
        transfers.sort()  # per link, in consumer order (ops are numbered processor-major)
        for link, j, _, words in transfers:
            depart = link_free.get(link, 0)
            if depart < t:
                depart = t
            hold = hold_of.get(words)
            if hold is None:
                hold = hold_of[words] = link_hold_cycles(words, words_per_cycle)
            link_free[link] = depart + hold
            arrival = depart + hold + latency
            if ready[j] < arrival:
                ready[j] = arrival
            pending[j] -= 1
            if not pending[j]:
                try_start(proc[j])
    _check_finished(c, nxt, done, c.prods, [])
    return start, end


def _check_finished(c: CompiledSchedule, nxt: list[int], finished: list[bool], prods: list[list[int]],
                    transfer_producer: list[int]) -> None:
    """Raise `DeadlockError` if a processor has ops left; node n + k stands for transfer k's producer."""
    n = c.num_ops
    blocked: dict[int, tuple[Op, tuple[Op, ...]]] = {}
    for p in range(c.num_procs):
        i = nxt[p]
        if i < c.bounds[p + 1]:
            waits = sorted({j if j < n else transfer_producer[j - n] for j in prods[i] if not finished[j]})
            blocked[p] = (c.ops[i], tuple(c.ops[j] for j in waits))
    if blocked:
        raise DeadlockError(blocked)
