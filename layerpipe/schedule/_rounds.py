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

#: Runs per round, at the least, for the rounds to pay: a round costs 5–10 µs of numpy calls and the run sweep
#: about 1–1.5 µs per run, its building included. Measured with the rounds forced (tests' `min_runs_per_round=1`)
#: on layerpipe, pipedream, gpipe and 1f1b schedules at N = 4 … 256: the rounds were faster from about 12 runs per
#: processor-run bound up (resnet50 layerpipe N = 16: 1.6×; 1f1b N = 256: 4.9×), slower below (N = 4: 0.4×). A
#: processor's runs bound the rounds from below, so the rounds are tried only where the runs outnumber that
#: bound by this factor, and given up (None) once the rounds pass a budget worth the run sweep's time.
MIN_RUNS_PER_ROUND = 12

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
    # The table: one row per run and, after each processor's last run, a row that never starts (so a round just
    # moves every processor's pointer on by one when it starts: `nxt += ready`). Processor p's runs are rows
    # at[p] + p … at[p+1] + p − 1 and its end row is at[p+1] + p. Column 0 is the run before it on its processor
    # (available when that one ends: its start + its length), the other columns its inputs; slot `zero` reads
    # 0 (a processor's first run, and padding) and slot `never` reads UNKNOWN (the end rows).
    procs = len(at) - 1
    proc_of_run = np.repeat(np.arange(procs, dtype=np.int64), np.diff(at))
    row_of_run = np.arange(runs, dtype=np.int64) + proc_of_run
    rows = runs + procs
    zero, never = rows, rows + 1
    end_rows = at[1:] + np.arange(procs, dtype=np.int64)
    consumer_row = row_of_run[number[kept_consumer]]
    per_row = np.bincount(consumer_row, minlength=rows)
    width = 1 + (int(per_row.max()) if len(consumer_row) else 0)
    if width > 1 + MAX_INPUTS:
        return None
    key = np.full((rows, width), zero, dtype=np.int64)
    add = np.zeros((rows, width), dtype=np.int64)
    follows = np.ones(runs, dtype=bool)  # runs after another on their processor
    follows[at[:-1][at[:-1] < at[1:]]] = False
    later = row_of_run[follows]
    key[later, 0] = later - 1
    add[later, 0] = length[np.flatnonzero(follows) - 1]
    key[end_rows, 0] = never
    # Inputs come consumer-sorted, so a run's inputs are consecutive: column = 1 + place among them.
    first = np.zeros(rows, dtype=np.int64)
    np.cumsum(per_row[:-1], out=first[1:])
    column = 1 + np.arange(len(consumer_row), dtype=np.int64) - first[consumer_row]
    key[consumer_row, column] = row_of_run[number[kept_src]]
    add[consumer_row, column] = off[kept_src]
    del consumer_row, column, first, per_row, kept_consumer, kept_src, follows, later
    known = np.full(rows + 2, UNKNOWN, dtype=np.int64)
    known[zero] = 0
    nxt = end_rows - np.diff(at)  # each processor's next row: its first run's, or its end row
    while True:
        budget -= 1
        if budget < 0:
            return None  # far more rounds than a processor's runs: the run sweep is faster here
        # `take`, `maximum.reduce` and `count_nonzero`: the same as indexing, `max` and `any` at about half the
        # fixed cost per call, which is most of a round's cost on a few dozen processors.
        start = known.take(key.take(nxt, axis=0))
        start += add.take(nxt, axis=0)
        start = np.maximum.reduce(start, axis=1)
        ready = start < UNKNOWN
        if not np.count_nonzero(ready):
            break
        np.minimum(start, UNKNOWN, out=start)  # not ready: stays unknown (sums of unknowns cannot grow)
        known.put(nxt, start)
        nxt += ready
    if (nxt != end_rows).any():
        return None  # no processor can start its next run, and some have runs left: a deadlock
    known = known[row_of_run]
    end = known[number] + off
    return end - d, end
