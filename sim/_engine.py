"""The timing engine: explicit per-processor op lists in, start and end cycle of every op out.

Rules (design notes §7, contract 2): each processor runs its ops in program order; an op starts when its
processor is free and all its inputs have arrived — a producer's output arrives when the producer ends
(same processor, or the `shared` interconnect) or when its transfer arrives (`links`, see
`layerpipe.sim._interconnect`).

Speed: the schedule is compiled once into flat integer arrays — ops numbered processor-major (so the
op after i on its processor is i + 1), durations, and producer/consumer lists in CSR form — and the hot
loops touch only Python ints and lists, no per-event objects.

- `shared`: start times are a longest path over program order and data edges, independent of the
  order events are processed in, so a work-list sweep computes them without a heap: run each processor
  as far as its inputs allow, park it on the first producer that has not finished, wake it when that
  producer finishes.
- `links`: link contention makes the order matter, so end events are processed in time order from a
  heap of plain ints (end · n + op), all ops ending in one cycle as one batch whose transfers are queued
  per link in consumer order.

When no processor can proceed and ops remain, the engine raises `DeadlockError` naming every blocked
processor, its next op and the producers it waits for.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

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


@dataclass(frozen=True)
class CompiledSchedule:
    """A schedule as flat arrays. Op i runs on `proc[i]`; processor p owns ops bounds[p]..bounds[p+1]−1.

    Producers of op i are prod_idx[prod_ptr[i]:prod_ptr[i+1]] with the words each sends (`prod_words`) and
    the dependency role (`prod_role`); consumers are the same edges seen from the producer side.
    """

    schedule: OpSchedule
    ops: tuple[Op, ...]
    proc: list[int]
    bounds: list[int]
    dur: list[int]
    prod_ptr: list[int]
    prod_idx: list[int]
    prod_words: list[int]
    prod_role: list[str]
    cons_ptr: list[int]
    cons_idx: list[int]
    cons_words: list[int]

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @property
    def num_procs(self) -> int:
        return len(self.bounds) - 1


def compile_schedule(schedule: OpSchedule, workload: Workload) -> CompiledSchedule:
    """Number the ops, look up durations, and turn the dependencies into CSR integer arrays."""
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
    index_of = {id(op): i for i, op in enumerate(ops)}
    if len({op.key for op in ops}) != len(ops):
        seen: dict[tuple[str, int, int], Op] = {}
        for op in ops:
            if op.key in seen:
                raise InputError(f"op {op} appears twice (p{seen[op.key].proc} and p{op.proc})")
            seen[op.key] = op
    durations = workload.durations
    dur: list[int] = []
    for op in ops:
        d = durations.get((op.kind, op.unit))
        dur.append(workload.duration(op) if d is None else d)
    deps = workload.dependencies(schedule)
    by_key = None
    prod_ptr = [0]
    prod_idx: list[int] = []
    prod_words: list[int] = []
    prod_role: list[str] = []
    for op in ops:
        for dep in deps[op]:
            j = index_of.get(id(dep.producer))
            if j is None:  # the dependency function handed back an equal but distinct Op object
                by_key = by_key or {o.key: k for k, o in enumerate(ops)}
                j = by_key[dep.producer.key]
            prod_idx.append(j)
            prod_words.append(dep.words)
            prod_role.append(dep.role)
        prod_ptr.append(len(prod_idx))
    cons_ptr, cons_idx, cons_words = _transpose(len(ops), prod_ptr, prod_idx, prod_words)
    return CompiledSchedule(schedule, tuple(ops), proc, bounds, dur, prod_ptr, prod_idx, prod_words, prod_role,
                            cons_ptr, cons_idx, cons_words)


def _transpose(n: int, ptr: list[int], idx: list[int], words: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Consumer lists from producer lists (a counting sort: consumers of each producer in op order)."""
    count = [0] * (n + 1)
    for j in idx:
        count[j + 1] += 1
    for i in range(n):
        count[i + 1] += count[i]
    fill = count[:-1].copy()
    out_idx = [0] * len(idx)
    out_words = [0] * len(idx)
    for i in range(n):
        for k in range(ptr[i], ptr[i + 1]):
            j = idx[k]
            slot = fill[j]
            out_idx[slot] = i
            out_words[slot] = words[k]
            fill[j] = slot + 1
    return count, out_idx, out_words


def run(compiled: CompiledSchedule, config: SimConfig) -> tuple[list[int], list[int]]:
    """Start and end cycle of every op (compiled numbering)."""
    if config.interconnect == "shared":
        return _run_shared(compiled)
    return _run_links(compiled, config.link_latency, config.link_words_per_cycle)


def _run_shared(c: CompiledSchedule) -> tuple[list[int], list[int]]:
    n, procs = c.num_ops, c.num_procs
    dur, pp, pi = c.dur, c.prod_ptr, c.prod_idx
    start = [0] * n
    end = [-1] * n  # -1: not run yet
    nxt = c.bounds[:-1].copy()
    last = c.bounds[1:]
    free = [0] * procs
    waiting: dict[int, list[int]] = {}  # producer op → processors parked on it
    work = list(range(procs - 1, -1, -1))
    while work:
        p = work.pop()
        i, hi, t = nxt[p], last[p], free[p]
        while i < hi:
            s = t
            blocker = -1
            for k in range(pp[i], pp[i + 1]):
                e = end[pi[k]]
                if e < 0:
                    blocker = pi[k]
                    break
                if e > s:
                    s = e
            if blocker >= 0:
                waiting.setdefault(blocker, []).append(p)
                break
            start[i] = s
            t = s + dur[i]
            end[i] = t
            woken = waiting.pop(i, None)
            if woken:
                work.extend(woken)
            i += 1
        nxt[p], free[p] = i, t
    _check_finished(c, nxt, [e >= 0 for e in end])
    return start, end


def _run_links(c: CompiledSchedule, latency: int, words_per_cycle: float) -> tuple[list[int], list[int]]:
    n, procs = c.num_ops, c.num_procs
    dur, proc = c.dur, c.proc
    cp, ci, cw = c.cons_ptr, c.cons_idx, c.cons_words
    pending = [c.prod_ptr[i + 1] - c.prod_ptr[i] for i in range(n)]
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
        t, i = divmod(heapq.heappop(heap), n)
        batch = [i]
        bound = (t + 1) * n
        while heap and heap[0] < bound:
            batch.append(heapq.heappop(heap) - t * n)
        transfers: list[tuple[int, int, int, int]] = []
        candidates: list[int] = []
        for i in batch:
            p = proc[i]
            done[i] = True
            running[p] = False
            free[p] = t
            candidates.append(p)
            for k in range(cp[i], cp[i + 1]):
                j = ci[k]
                q = proc[j]
                if q == p:
                    if ready[j] < t:
                        ready[j] = t
                    pending[j] -= 1
                    if not pending[j]:
                        candidates.append(q)
                else:
                    transfers.append((p * procs + q, j, i, cw[k]))
        if transfers:
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
                    candidates.append(proc[j])
        for p in candidates:
            try_start(p)
    _check_finished(c, nxt, done)
    return start, end


def _check_finished(c: CompiledSchedule, nxt: list[int], done: list[bool]) -> None:
    blocked: dict[int, tuple[Op, tuple[Op, ...]]] = {}
    for p in range(c.num_procs):
        i = nxt[p]
        if i < c.bounds[p + 1]:
            waits = tuple(c.ops[c.prod_idx[k]] for k in range(c.prod_ptr[i], c.prod_ptr[i + 1])
                          if not done[c.prod_idx[k]])
            blocked[p] = (c.ops[i], waits)
    if blocked:
        raise DeadlockError(blocked)
