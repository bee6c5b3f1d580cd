"""The timing sweep of `shared` and `links` in lock-step rounds over every processor at once, on arrays (issue 14:
1f1b on a 256-layer MLP at N = 256 times 1.6 M ops, and the run sweep's Python loop over 0.8 M heads was half of
it).

The runs are those of `layerpipe.schedule._runs` (an op whose every needed input is an earlier op of its own
processor joins the run of the op before it), and the rule is the sweep's: a run starts when its processor is
free and every input is available; input x (an op) is available at start(run(x)) + off[x]. Here each round
looks at the next run of every processor that has one left, and starts, together, every such run whose inputs
are all known. A run then starts in the round equal to its depth in the graph of runs (its longest chain of
runs before it), so the rounds number that depth: about a processor's runs plus the pipeline's depth. Each
round is a fixed handful of numpy calls over the processors, so the cost is per round, not per run — it pays
where many runs share each round (`MIN_RUNS_PER_ROUND`); elsewhere the run sweep stays the engine.

On `links` an input may be a transfer, available when it arrives; a run's transfers are timed in the round it
starts, every link's queue at once (`_LinkQueue`: a link serves its sender's transfers in program order, so a
running maximum gives their departures).

Same inputs, same rule, so the same times as the run sweep and the op-by-op sweep (tests compare them). A
schedule that deadlocks gets None: the caller runs the run sweep, whose report names the stuck ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerpipe.schedule._int_lists import INT32_MAX, stable_argsort
from layerpipe.schedule._runs import head_mask, needed_inputs, run_offsets

__all__ = ["MIN_PROCS", "LinkSends", "sweep_rounds"]

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


@dataclass(frozen=True)
class LinkSends:
    """The transfers of the `links` model, for the rounds: transfer t (input n + t of its consumer) is sent by op
    `producer[t]` on link `link[t]` (p·N + q), holds it `hold[t]` cycles and arrives `latency` cycles after it
    leaves; numbered in the order they queue (each link serves its transfers in that order)."""

    producer: np.ndarray
    link: np.ndarray
    hold: np.ndarray
    latency: int


def sweep_rounds(bounds: list[int], dur: np.ndarray, ptr: np.ndarray, src: np.ndarray,
                 sends: LinkSends | None = None, min_runs_per_round: int = MIN_RUNS_PER_ROUND
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, end) of every op (int64 arrays) of ops numbered processor-major (processor p owns bounds[p] …
    bounds[p+1] − 1) whose inputs are src[ptr[i]:ptr[i+1]]: ops (< n) or, on `links`, the transfers of `sends`
    (input n + t); None where the rounds do not pay (too few runs per round, a run with more than `MAX_INPUTS`
    inputs, the round budget spent) or on a deadlock: the caller's run sweep then times it, or reports the
    deadlock."""
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
    # (available when that one ends: its start + its length), the other columns its inputs. `known` holds the
    # rows' starts, then slot `zero` (reads 0: a processor's first run, and padding), slot `never` (reads
    # UNKNOWN: the end rows) and the transfers' arrivals.
    procs = len(at) - 1
    proc_of_run = np.repeat(np.arange(procs, dtype=np.int64), np.diff(at))
    row_of_run = np.arange(runs, dtype=np.int64) + proc_of_run
    rows = runs + procs
    zero, never, first_transfer = rows, rows + 1, rows + 2
    end_rows = at[1:] + np.arange(procs, dtype=np.int64)
    consumer_row = row_of_run[number[kept_consumer]]
    per_row = np.bincount(consumer_row, minlength=rows)
    width = 1 + (int(per_row.max()) if len(consumer_row) else 0)
    if width > 1 + MAX_INPUTS:
        return None
    # int32 tables where the values fit (issue 14: they are most of the rounds' memory, rows × width each).
    transfers = 0 if sends is None else len(sends.producer)
    small = np.int32 if first_transfer + transfers < INT32_MAX else np.int64
    key = np.full((rows, width), zero, dtype=small)
    add = np.zeros((rows, width), dtype=np.int32 if int(off.max()) < INT32_MAX else np.int64)
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
    is_op = kept_src < n
    at_op = np.minimum(kept_src, n - 1)
    key[consumer_row, column] = np.where(is_op, row_of_run[number[at_op]], first_transfer + kept_src - n)
    add[consumer_row, column] = np.where(is_op, off[at_op], 0)
    del consumer_row, column, first, per_row, kept_consumer, kept_src, follows, later, is_op, at_op
    queue = None
    if sends is not None:
        sender_row = row_of_run[number[np.asarray(sends.producer, dtype=np.int64)]]
        if len(sender_row) and (np.diff(sender_row) < 0).any():
            return None  # transfers not numbered by sending op (the link plan numbers them so)
        queue = _link_queue(sends, sender_row, off, rows)
    known = np.full(first_transfer + transfers, UNKNOWN, dtype=np.int64)
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
        if queue is not None:
            queue.send(nxt, ready, start, known, first_transfer)
        nxt += ready
    if (nxt != end_rows).any():
        return None  # no processor can start its next run, and some have runs left: a deadlock
    known = known[row_of_run]
    end = known[number] + off
    return end - d, end


@dataclass(frozen=True, eq=False)
class _LinkQueue:
    """The transfers of `LinkSends` by sending run, with what the rounds need to time a run's sends at once.

    A link serves its transfers in order: depart_j = max(depart_{j−1}, ready_j) + hold_j. With H_j the holds of
    the link's transfers up to j, E_j = depart_j − H_j = max(E_{j−1}, ready_j − H_{j−1}): a running maximum.
    A run's transfers are ready at its start s plus the sending op's `off`, so on each link
    E_j = max(E_base, s + w_j): `base` is the link's last transfer of an earlier run (its E is known by then)
    and w_j the running maximum of off − H_{j−1} over the run's transfers on that link up to j, both fixed
    before timing. The arrival is E_j + H_j + latency (`arrive`)."""

    ptr: np.ndarray  #: per row, its transfers ptr[row] … ptr[row+1] − 1 (they are numbered by sending run)
    base: np.ndarray  #: per transfer, the E slot of its link's last transfer of an earlier run (`count`: none)
    w: np.ndarray
    arrive: np.ndarray  #: H_j + latency
    e: np.ndarray  #: E per transfer, and a last slot that reads 0 (a link free from cycle 0)

    def send(self, nxt: np.ndarray, ready: np.ndarray, start: np.ndarray, known: np.ndarray, first: int) -> None:
        """Time the transfers of the runs started this round (rows `nxt` where `ready`, at `start`)."""
        lo = self.ptr.take(nxt)
        count = self.ptr.take(nxt + 1) - lo
        count *= ready
        total = int(count.sum())
        if not total:
            return
        ends = np.cumsum(count)
        which = np.repeat(lo - ends + count, count) + np.arange(total, dtype=np.int64)  # transfer numbers
        e = np.maximum(self.e.take(self.base.take(which)), np.repeat(start, count) + self.w.take(which))
        self.e.put(which, e)
        e += self.arrive.take(which)
        known.put(which + first, e)


def _link_queue(sends: LinkSends, sender_row: np.ndarray, off: np.ndarray, rows: int) -> _LinkQueue:
    count = len(sends.producer)
    link = np.asarray(sends.link, dtype=np.int64)
    hold = np.asarray(sends.hold, dtype=np.int64)
    ready_off = off[sends.producer]
    # Along each link (a stable sort by link keeps each link's queue order): the holds up to each transfer.
    order = stable_argsort(link)
    by_link = link[order]
    new_link = np.r_[True, by_link[1:] != by_link[:-1]] if count else np.zeros(0, dtype=bool)
    held = np.cumsum(hold[order])
    held -= np.maximum.accumulate(np.where(new_link, held - hold[order], 0)) if count else held
    up_to = np.empty(count, dtype=np.int64)
    up_to[order] = held  # H_j
    before = up_to - hold  # H_{j−1}
    # Groups of one run's transfers on one link: consecutive along the link. w is a running maximum per group:
    # raised by a step per group larger than any spread of the values, so one accumulate does every group.
    run_sorted = sender_row[order]
    new_group = new_link | np.r_[True, run_sorted[1:] != run_sorted[:-1]] if count else new_link
    value = ready_off[order] - before[order]
    w_sorted = value
    if count:
        group = np.cumsum(new_group) - 1
        spread = int(value.max()) - int(value.min()) + 1
        if spread * (int(group[-1]) + 1) >= 1 << 62:
            w_sorted = _grouped_running_max(value, new_group)
        else:
            w_sorted = np.maximum.accumulate(value + group * spread) - group * spread
    w = np.empty(count, dtype=np.int64)
    w[order] = w_sorted
    # base: the transfer before each group's first on the same link (same link, an earlier run), else none.
    group_first = np.flatnonzero(new_group)
    base_sorted = np.full(count, count, dtype=np.int64)
    if count:
        # order[g − 1]: the link's transfer before group g's first, where the group does not start a link
        firsts_base = np.where(new_link[group_first], count, order[np.maximum(group_first - 1, 0)])
        base_sorted = np.repeat(firsts_base, np.diff(np.r_[group_first, count]))
    base = np.empty(count, dtype=np.int64)
    base[order] = base_sorted
    ptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(sender_row, minlength=rows), out=ptr[1:])
    return _LinkQueue(ptr, base, w, up_to + sends.latency, np.zeros(count + 1, dtype=np.int64))


def _grouped_running_max(value: np.ndarray, new_group: np.ndarray) -> np.ndarray:
    """Running maximum restarted at each group (the rare case the one-accumulate step would overflow)."""
    out = value.copy()
    for k in range(1, len(out)):
        if not new_group[k] and out[k - 1] > out[k]:
            out[k] = out[k - 1]
    return out
