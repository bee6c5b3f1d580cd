"""The `shared` timing sweep in lock-step rounds over every processor at once, on arrays (issue 14: 1f1b on a
256-layer MLP at N = 256 times 1.6 M ops, and the run sweep's Python loop over 0.8 M heads was half of it).

The runs are those of `layerpipe.schedule._runs` (an op whose every needed input is an earlier op of its own
processor joins the run of the op before it), and the rule is the sweep's: a run starts when its processor is
free and every input is available; input x (an op) is available at start(run(x)) + off[x]. Here each round
looks at the next run of every processor that has one left, and starts, together, every such run whose inputs
are all known. A run then starts in the round equal to its depth in the graph of runs (its longest chain of
runs before it), so the rounds number that depth: about a processor's runs plus the pipeline's depth. Each
round is a fixed handful of numpy calls over the processors, so the cost is per round, not per run — it pays
where many runs share each round (`MIN_RUNS_PER_ROUND`); elsewhere the run sweep stays the engine.

Same inputs, same rule, so the same times as the run sweep and the op-by-op sweep (tests compare them). A
schedule that deadlocks gets None: the caller runs the run sweep, whose report names the stuck ops.
"""

from __future__ import annotations

import numpy as np

from layerpipe.schedule._runs import head_mask, needed_inputs, run_offsets

__all__ = ["MIN_PROCS", "sweep_rounds"]

#: Runs per round, at the least, for the rounds to pay: a round costs about 25 µs of numpy calls and the run
#: sweep about 0.6–1.3 µs per run (measured on 1f1b, layerpipe, pipedream and gpipe schedules at N = 8 … 256).
#: A processor's runs bound the rounds from below, so the rounds are tried only where the runs outnumber that
#: bound by this factor, and given up (None) once the rounds pass a budget worth the run sweep's time.
MIN_RUNS_PER_ROUND = 30

#: Processors below which the rounds cannot have `MIN_RUNS_PER_ROUND` runs per round (checked before any work).
MIN_PROCS = MIN_RUNS_PER_ROUND

#: Inputs per run above which the rounds are not used: each round reads a (processors × widest run) table.
MAX_INPUTS = 16

#: "Not known yet" for a run's start: larger than any time, so a round's maximum over a run's inputs is at least
#: this exactly when one of them is unknown (no separate test of every input).
UNKNOWN = np.int64(1) << np.int64(62)


def sweep_rounds(bounds: list[int], dur: np.ndarray, ptr: np.ndarray, src: np.ndarray,
                 min_runs_per_round: int = MIN_RUNS_PER_ROUND) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, end) of every op (int64 arrays) of ops numbered processor-major (processor p owns bounds[p] …
    bounds[p+1] − 1) whose inputs are the ops src[ptr[i]:ptr[i+1]]; None where the rounds do not pay (too few
    runs per round, a run with more than `MAX_INPUTS` inputs, the round budget spent) or on a deadlock: the
    caller's run sweep then times it, or reports the deadlock."""
    n = bounds[-1]
    d = np.asarray(dur, dtype=np.int64)
    if not n:
        return d.copy(), d.copy()
    consumer, keep = needed_inputs(bounds, ptr, src)
    kept_consumer = consumer[keep]
    kept_src = np.asarray(src, dtype=np.int64)[keep]
    del consumer, keep
    head = head_mask(bounds, kept_consumer)
    _, off = run_offsets(head, d)
    heads = np.flatnonzero(head)
    number = np.cumsum(head, dtype=np.int64)  # op → number of its run
    number -= 1
    del head
    runs = len(heads)
    at = np.searchsorted(heads, np.asarray(bounds, dtype=np.int64))  # processor p's runs: at[p] … at[p+1] − 1
    if int(np.diff(at).max()) * min_runs_per_round > runs:
        return None
    budget = 2 * runs // min_runs_per_round  # rounds worth about the run sweep's time
    length = off[np.r_[heads[1:] - 1, n - 1]]
    # Inputs as a (runs × width) table: run r's inputs in row r, padded with the sentinel run `runs`, whose
    # start is 0 (every start is at least 0). Inputs come consumer-sorted, so a run's inputs are consecutive.
    row = number[kept_consumer]
    per_run = np.bincount(row, minlength=runs)
    width = int(per_run.max()) if len(row) else 1
    if width > MAX_INPUTS:
        return None
    first = np.zeros(runs, dtype=np.int64)
    np.cumsum(per_run[:-1], out=first[1:])
    column = np.arange(len(row), dtype=np.int64) - first[row]
    key = np.full((runs, max(width, 1)), runs, dtype=np.int64)
    key[row, column] = number[kept_src]
    add = np.zeros((runs, max(width, 1)), dtype=np.int64)
    add[row, column] = off[kept_src]
    del row, column, first, per_run, kept_consumer, kept_src
    known = np.full(runs + 1, UNKNOWN, dtype=np.int64)
    known[runs] = 0
    nxt, stop = at[:-1].copy(), at[1:].copy()
    free = np.zeros(len(nxt), dtype=np.int64)
    pending = np.flatnonzero(nxt < stop)  # processors with runs left: each round looks at all of them
    while len(pending):
        budget -= 1
        if budget < 0:
            return None  # far more rounds than a processor's runs: the run sweep is faster here
        r = nxt[pending]
        start = (known[key[r]] + add[r]).max(axis=1)
        np.maximum(start, free[pending], out=start)
        ready = start < UNKNOWN
        go = pending
        if not ready.all():
            if not ready.any():
                return None  # no processor can start its next run: a deadlock
            go, r, start = pending[ready], r[ready], start[ready]
        known[r] = start
        free[go] = start + length[r]
        r += 1
        nxt[go] = r
        if (r >= stop[go]).any():
            pending = pending[nxt[pending] < stop[pending]]
    end = known[number] + off
    return end - d, end
