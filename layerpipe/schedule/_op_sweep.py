"""The engine's op-by-op sweeps (`layerpipe.schedule._engine`'s module docstring gives the rules): processors
walk their programs, each parked on the first input it lacks and woken when that input is known, and the
deadlock report when none can go on.

- `_sweep_first`: `shared` and `links` (transfers queued per link as their producer ends), each op's needed inputs
  as its first one and the others of the ops with more (`layerpipe.schedule._runs.first_inputs`);
- `_sweep_single`: stage-level pipelines on `shared`, where every op needs at most one input from another
  processor: one input per op, only ends kept (issue 14: the sweep of 1F1B and ZB-H1);
- `_sweep`: the same from a list of inputs per op (tests compare the engines with it);
- `_run_sweep`: the sweep over runs of ops (`layerpipe.schedule._runs`), with the same deadlock report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from layerpipe.errors import InputError
from layerpipe.schedule._int_lists import int64_array
from layerpipe.schedule._ir import Op
from layerpipe.schedule._runs import FirstInputs, Runs, op_times, split_first, sweep_runs

if TYPE_CHECKING:
    from layerpipe.schedule._engine import CompiledSchedule, LinkPlan


class DeadlockError(InputError):
    """No processor can start its next op. `blocked[p] = (next op, producers it still waits for)`."""

    def __init__(self, blocked: dict[int, tuple[Op, tuple[Op, ...]]]) -> None:
        self.blocked = blocked
        parts = []
        for p, (op, waits) in sorted(blocked.items()):
            inputs = ", ".join(f"{w} (p{w.proc})" for w in waits) or "nothing (unreachable)"
            parts.append(f"p{p} blocked at {op} waiting for {inputs}")
        super().__init__("deadlock: " + "; ".join(parts))


#: Processors from which a stage-level schedule on `shared` is timed in rounds (`layerpipe.schedule._rounds`)
#: rather than by `_sweep_single`. Every stage op heads a run, so a round advances about one op per processor;
#: `_sweep_single` costs 0.13–0.17 µs per op, a round 7–8 µs. Measured at m = 256 (op by op with its input
#: lists, vs rounds, ms): 1F1B p = 32 3.2 vs 4.5, p = 48 4.6 vs 5.1, p = 64 6.2 vs 6.5; ZB-H1 p = 32 4.0 vs 4.1,
#: p = 48 6.2 vs 5.3, p = 64 8.7 vs 6.8.
STAGE_ROUNDS_MIN_PROCS = 40


def _sweep_single(c: CompiledSchedule) -> tuple[np.ndarray, np.ndarray] | None:
    """`_sweep_first` where every op needs at most one input (stage-level pipelines, once each op's own
    processor's producers are dropped) on `shared`: the same times, from a loop with one input per op and only
    ends kept (starts are ends less durations); None where an op needs more, or on a deadlock (the caller's
    sweep reports it). A processor parks on an input as an int (the rare second one waiting on the same input
    in a dict), not in a list per input."""
    first, more = c.sweep_first
    if more is not None:
        return None
    n = c.num_ops
    dur, lo, hi = c.dur, c.bounds[:-1], c.bounds[1:]
    avail = [-1] * n
    avail.append(0)  # input n: "no input"
    nxt = lo.copy()
    free = [0] * len(lo)
    waiter = [-1] * n  # input → the processor parked on it
    others: dict[int, list[int]] = {}  # input → the processors parked on it after the first
    work = list(range(len(lo) - 1, -1, -1))
    while work:
        p = work.pop()
        i, last, t = nxt[p], hi[p], free[p]
        while i < last:
            e = avail[first[i]]
            if e < 0:
                x = first[i]
                if waiter[x] < 0:
                    waiter[x] = p
                else:
                    others.setdefault(x, []).append(p)
                break
            if e > t:
                t = e
            t += dur[i]
            avail[i] = t
            q = waiter[i]
            if q >= 0:  # op i ends once: its waiters are woken once, in the order they parked
                work.append(q)
                if others:
                    work.extend(others.pop(i, ()))
            i += 1
        nxt[p], free[p] = i, t
    if any(nxt[p] < hi[p] for p in range(c.num_procs)):
        return None
    del avail[n]
    end = int64_array(avail)
    return end - c.dur_array(), end


def _sweep(c: CompiledSchedule, inputs: list[list[int]], plan: LinkPlan | None = None,
           hold: list[int] | tuple[()] = (), latency: int = 0) -> tuple[list[int], list[int]]:
    """Start and end of every op given its inputs as a list per op (see `_sweep_first`, which this runs)."""
    total = c.num_ops + (len(plan.words) if plan is not None else 0)
    return _sweep_first(c, split_first(inputs, total), lambda: inputs, plan, hold, latency)


def _sweep_first(c: CompiledSchedule, needed: FirstInputs, listed: Callable[[], list[list[int]]],
                 plan: LinkPlan | None = None, hold: list[int] | tuple[()] = (), latency: int = 0
                 ) -> tuple[list[int], list[int]]:
    """Start and end of every op: processors walk their programs (see the module docstring).

    `needed` gives each op's inputs as its first one and the others of ops with more
    (`layerpipe.schedule._runs.first_inputs`); input `total` (one past the last) is always available at cycle 0
    and stands for "none". `listed()` gives the same inputs as a list per op, for a deadlock report only.
    `avail[x]` is when input x is available: an op's end (x < n) or a transfer's arrival (x = n + k, `links`
    only, queued on its link by `plan.sends` when its producer ends, holding it `hold[x]` cycles; no plan, no
    holds); −1 until known.
    """
    n = c.num_ops
    dur, lo, hi = c.dur, c.bounds[:-1], c.bounds[1:]
    sends = plan.sends if plan is not None else None
    total = n + (len(plan.words) if plan is not None else 0)
    first, more = needed
    start = [0] * n
    avail = [-1] * total
    avail.append(0)  # input `total`: "no input"
    link_free = [0] * (c.num_procs * c.num_procs)  # link p→q is p·N + q
    nxt = lo.copy()
    free = [0] * len(lo)
    waiters: list[list[int] | None] = [None] * total  # input → processors parked on it
    work = list(range(len(lo) - 1, -1, -1))
    while work:
        p = work.pop()
        i, last, t = nxt[p], hi[p], free[p]
        while i < last:
            x = first[i]
            e = avail[x]
            if e < 0:
                parked = waiters[x]
                if parked is None:
                    waiters[x] = [p]
                else:
                    parked.append(p)
                break
            s = t if t > e else e
            rest = more[i] if more is not None else None
            if rest is not None:
                for x in rest:
                    e = avail[x]
                    if e < 0:
                        parked = waiters[x]
                        if parked is None:
                            waiters[x] = [p]
                        else:
                            parked.append(p)
                        break
                    if e > s:
                        s = e
                else:
                    rest = None
                if rest is not None:  # parked on one of the others
                    break
            start[i] = s
            t = avail[i] = s + dur[i]
            woken = waiters[i]
            if woken is not None:
                work.extend(woken)
                waiters[i] = None
            if sends is not None:
                for x, link in sends[i]:
                    depart = link_free[link]
                    if depart < t:
                        depart = t
                    depart += hold[x]
                    link_free[link] = depart
                    avail[x] = depart + latency
                    woken = waiters[x]
                    if woken is not None:
                        work.extend(woken)
                        waiters[x] = None
            i += 1
        nxt[p], free[p] = i, t
    if any(nxt[p] < hi[p] for p in range(c.num_procs)):
        del avail[total]
        _check_finished(c, nxt, [e >= 0 for e in avail], listed(), plan.producer if plan is not None else [])
    del avail[n:]
    return start, avail


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


def _run_sweep(c: CompiledSchedule, runs: Runs, num_inputs: int, hold: list[int] | tuple[()] = (),
               latency: int = 0, plan: LinkPlan | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sweep over runs of ops (`layerpipe.schedule._runs`): the op-by-op `_sweep`'s times, its deadlocks."""
    known, nxt, finished = sweep_runs(runs, c.num_procs * c.num_procs, hold, latency)
    if not finished:
        n, heads = c.num_ops, runs.head.tolist()
        slot_of = np.searchsorted(runs.head, runs.run_of).tolist()  # op → its run's slot (`Runs`)
        done = [known[slot_of[x]] >= 0 if x < n else known[x - n + len(heads)] >= 0 for x in range(num_inputs)]
        at = [heads[k] if k < runs.head_bounds[p + 1] else c.bounds[p + 1] for p, k in enumerate(nxt)]
        _check_finished(c, at, done, plan.inputs if plan is not None else c.prods,
                        plan.producer if plan is not None else [])
    return op_times(runs, known, runs.dur)  # the durations the runs were built from (not a second array)
