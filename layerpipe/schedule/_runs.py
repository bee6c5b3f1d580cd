"""The work-list sweep of the timing engine over runs of ops, not ops (issue 14: the sweep was the largest part of
timing a synchronous step).

A processor's op whose every input is an earlier op on the same processor starts the cycle the op before it
ends: that producer ended no later (ends never decrease along a program), so nothing else can hold it back. Such
an op joins the run of the op before it; an op with an input from elsewhere (another processor's op, a transfer
on `links`) or from a later op of its own processor (a deadlock the sweep must see), and the first op of every
processor, head a run. A run of ops h … h + r − 1 then starts when its head does, and op i of it ends at
start(h) + off[i], off[i] = dur[h] + … + dur[i]. The sweep (`layerpipe.schedule._engine`'s rules: run each
processor as far as its inputs allow, park it on the first input not yet known, wake it when it is) walks only
the heads: an input op x is known when its run's start is, and is available at start(h(x)) + off[x]; on `links`
a run queues its ops' transfers in program order when its start is known, which is the order each link serves
them in (a link p→q carries only p's sends, in p's program order). Same inputs, same rules, so the same times
as the op-by-op sweep (`_engine._sweep`, which tests compare it with); the cost is per head and per input of a
head, not per op.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from layerpipe._gc import gc_paused
from layerpipe.schedule._int_lists import INT32_MAX, INT32_MIN, int64_array


@dataclass(frozen=True)
class Sends:  # compared by value (tests compare runs field by field)
    """The transfers the ops of each run queue, in program order, as flat lists: head k's are entries
    at[k] … at[k+1] − 1, each its input number, its link and the `off` of its sending op."""

    at: list[int]
    input: list[int]
    link: list[int]
    off: list[int]

    def of_head(self, k: int) -> list[tuple[int, int, int]]:
        """Head k's transfers as (input number, link, off) (for tests and reports; the sweep reads the lists)."""
        lo, hi = self.at[k], self.at[k + 1]
        return list(zip(self.input[lo:hi], self.link[lo:hi], self.off[lo:hi], strict=True))


@dataclass(frozen=True, eq=False)
class Runs:
    """The runs of a compiled schedule under one set of inputs (see the module docstring).

    Heads are numbered k = 0, 1, … in op order (processor-major); processor p's heads are
    head_bounds[p] … head_bounds[p+1] − 1. Head k is op `head[k]`, its run takes `length[k]` cycles, and its
    inputs are (key, add) pairs: available at known[key] + add. Keys are the sweep's slots: head k's run start is
    slot k, transfer t's arrival (input number n + t) slot H + t for H heads, and `none` = H + T, "no input",
    always known at 0 — slots, not op numbers, so the sweep's lists are as long as the heads and transfers, not
    the ops (issue 14: lenet5's 2.6 M ops have 0.5 M heads). Head k's first input is (first_key[k],
    first_add[k]) — key `none` when it has none — and the others are `rest[k]` (None for heads with one or none;
    `rest` None when no head has more): most heads have one input, and a tuple of tuples per head was most of
    building the runs (issue 14). `sends` are the transfers of the runs' ops in program order (`Sends`, by input
    number; None on `shared`).
    """

    head: np.ndarray  #: per head, its op (`op_times` scatters the heads' starts with it)
    head_bounds: list[int]
    length: list[int]
    first_key: list[int]
    first_add: list[int]
    rest: list[tuple[tuple[int, int], ...] | None] | None
    none: int  #: the slot standing for "no input" (one past the last head and transfer)
    sends: Sends | None
    run_of: np.ndarray  #: per op, its run's head op
    off: np.ndarray  #: per op, cycles from its run's start to its end
    dur: np.ndarray  #: per op, its cycles (int64: the array the runs were built from, for `op_times`)


#: Inputs per processor up to which `needed_inputs` takes them all at once (above, a processor at a time: memory).
SMALL_INPUTS = 2048

#: Runs pay when they merge ops: with more heads than this share of the ops (stage-level pipelines, where
#: nearly every op waits for another processor) the op-by-op sweep is faster than building the runs.
MAX_HEAD_SHARE = 0.75


def make_runs(bounds: list[int], dur: list[int] | np.ndarray, ptr: np.ndarray, src: np.ndarray,
              send_producer: np.ndarray | None = None, send_input: np.ndarray | None = None,
              send_link: np.ndarray | None = None, max_head_share: float = MAX_HEAD_SHARE) -> Runs | None:
    """Runs of ops numbered processor-major (processor p owns bounds[p] … bounds[p+1] − 1) whose inputs are
    src[ptr[i]:ptr[i+1]] (op numbers < n, or transfer input numbers ≥ n); sends (links only) by producer op,
    in each producer's queueing order. None when more than `max_head_share` of the ops head a run."""
    # Intermediate arrays are dropped as soon as they are used (issue 14: this is the simulator's largest peak).
    n = bounds[-1]
    consumer, keep = needed_inputs(bounds, ptr, src)
    kept_consumer = consumer[keep]
    del consumer
    kept_src = src[keep]
    del keep
    head = head_mask(bounds, kept_consumer)
    heads = np.flatnonzero(head)
    if len(heads) > max_head_share * n:
        return None
    dur = np.asarray(dur, dtype=np.int64)  # kept for `op_times` (the engine's array is int64 already: no copy)
    run_of, off = run_offsets(head, dur)
    last = np.r_[heads[1:] - 1, n - 1] if len(heads) else heads
    length = off[last]
    head_number = np.cumsum(head, dtype=np.int64)  # op → number of its run's head: its slot
    head_number -= 1
    del head
    # Keys as slots (see `Runs`): an op input's run's head number, a transfer's H + t.
    kept_is_op = kept_src < n
    if bool(kept_is_op.all()):
        key, add = head_number[kept_src], off[kept_src]
    else:
        at = np.minimum(kept_src, max(n - 1, 0))
        key = np.where(kept_is_op, head_number[at], kept_src + (len(heads) - n))
        add = np.where(kept_is_op, off[at], 0)
        del at
    del kept_src, kept_is_op
    in_ptr = np.zeros(len(heads) + 1, dtype=np.int64)
    np.cumsum(np.bincount(head_number[kept_consumer], minlength=len(heads)), out=in_ptr[1:])
    del kept_consumer
    head_bounds = np.searchsorted(heads, np.asarray(bounds, dtype=np.int64)).tolist()
    none = len(heads) + (len(send_input) if send_input is not None else 0)
    count = np.diff(in_ptr)
    has = count > 0
    first_at = in_ptr[:-1][has]
    first_key = np.full(len(heads), none, dtype=np.int64)
    first_key[has] = key[first_at]
    first_add = np.zeros(len(heads), dtype=np.int64)
    first_add[has] = add[first_at]
    multi = np.flatnonzero(count > 1).tolist()
    with gc_paused():
        first_keys = shared_ints(first_key)
        del first_key
        rest: list[tuple[tuple[int, int], ...] | None] | None = None
        if multi:
            keys = key.tolist()
            adds, at = add.tolist(), in_ptr.tolist()
            rest = [None] * len(heads)
            for k in multi:
                rest[k] = tuple(zip(keys[at[k] + 1:at[k + 1]], adds[at[k] + 1:at[k + 1]], strict=True))
            del keys, adds
        del key, add
        sends: Sends | None = None
        if send_producer is not None and send_input is not None and send_link is not None:
            # Flat lists and where each head's begin: no list or tuple per head or per transfer (a slice per
            # sending head was a fifth of building the runs of an explore point on links).
            at = np.zeros(len(heads) + 1, dtype=np.int64)
            np.cumsum(np.bincount(head_number[send_producer], minlength=len(heads)), out=at[1:])
            sends = Sends(at.tolist(), send_input.tolist(), send_link.tolist(), off[send_producer].tolist())
    return Runs(_narrow(heads), head_bounds, shared_ints(length), first_keys, shared_ints(first_add), rest,
                none, sends, _narrow(run_of), _narrow(off), dur)


def head_mask(bounds: list[int], kept_consumer: np.ndarray) -> np.ndarray:
    """Per op, does it head a run: the first op of every processor, and every consumer of a needed input."""
    counts: np.ndarray = np.diff(np.asarray(bounds, dtype=np.int64))
    head = np.zeros(bounds[-1], dtype=bool)
    head[np.asarray(bounds[:-1], dtype=np.int64)[counts > 0]] = True
    head[kept_consumer] = True
    return head


def run_offsets(head: np.ndarray, dur: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(run_of, off): per op, its run's head op and the cycles from that head's start to the op's end."""
    n = len(head)
    run_of = np.where(head, np.arange(n, dtype=np.int64), 0)
    if n:
        np.maximum.accumulate(run_of, out=run_of)
    d = np.asarray(dur, dtype=np.int64)
    off = np.cumsum(d)  # running sum of durations up to each op's end; then less its run head's start
    before = off - d  # … to its start
    off -= before[run_of]
    return run_of, off


#: Arrays shorter than this become lists by `tolist()` — an int object per element, 5–8x faster than sharing
#: them (`_shared`) — rather than shared ones: below it the extra int objects are at most ~2 MiB and die with
#: the run, while sharing is for the runs of 10⁵–10⁶ ops whose lists were the simulator's memory (issue 14).
#: The same values either way.
SHARE_MIN = 1 << 16


def shared_ints(values: np.ndarray) -> list[int]:
    """`values.tolist()`, with one int object per distinct value from `SHARE_MIN` values on (see `_shared`)."""
    if len(values) < SHARE_MIN:
        return values.tolist()
    return list(_shared(values))


def _shared(values: np.ndarray) -> Iterator[int]:
    """`values.tolist()` with one int object per distinct value (issue 14: memory per op). Offsets and run lengths
    repeat period after period, and an int object costs 32 bytes where a list slot costs 8. Small ranges map
    through a table of every value, others through `np.unique`'s inverse."""
    if not len(values):
        return iter(())
    lo, hi = int(values.min()), int(values.max())
    if lo >= 0 and hi <= max(256, len(values) // 8):
        table = list(range(hi + 1))
        return map(table.__getitem__, _ints(values))
    distinct, inverse = np.unique(values, return_inverse=True)
    table = distinct.tolist()
    return map(table.__getitem__, _ints(inverse.ravel()))


def _ints(values: np.ndarray) -> memoryview:
    """The values as an iterable of Python ints made one at a time, each freed once used — not `tolist()`'s list
    of them all: a burst of small objects freed after the run's lists were built would leave the allocator's
    arenas full of holes the process keeps (resident memory, issue 14)."""
    return memoryview(np.ascontiguousarray(values, dtype=np.int64).data)


def _narrow(values: np.ndarray) -> np.ndarray:
    """`values` as int32 when every value fits (half the memory; sums with int64 arrays stay int64)."""
    if len(values) and int(values.min()) >= INT32_MIN and int(values.max()) <= INT32_MAX:
        return values.astype(np.int32)
    return values


def needed_inputs(bounds: list[int], ptr: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(consumer of every input, is it needed?): an input that is an earlier op of the consumer's own processor
    has ended by the time the processor reaches the consumer, so a sweep need not look at it (nor can a
    processor ever wait for it: dropping it changes no time and no deadlock report).

    Ops are numbered processor-major, so the earlier ops of consumer j's processor p are exactly bounds[p] … j − 1
    (transfer inputs, numbered from n, are never among them): an input x is dropped when bounds[p] ≤ x < j — two
    comparisons per input, no processor looked up per input (issue 14: this was a fifth of building the runs)."""
    n = bounds[-1]
    ptr = np.asarray(ptr, dtype=np.int64)
    consumer = np.arange(n, dtype=np.int64).repeat(ptr[1:] - ptr[:-1])  # ndarray methods: no function wrappers
    cuts = ptr[np.asarray(bounds, dtype=np.int64)]
    if len(src) <= SMALL_INPUTS * max(len(bounds) - 1, 1):  # at once: a pass per processor costs more here
        first = np.asarray(bounds[:-1], dtype=np.int64).repeat(cuts[1:] - cuts[:-1])  # its processor's first op
        return consumer, (src < first) | (src >= consumer)
    # Processor by processor (consumers are numbered processor-major, so each is one slice of the entries): no
    # array of every entry's first op (issue 14: memory).
    keep = np.ones(len(src), dtype=bool)
    for p, (lo, hi) in enumerate(itertools.pairwise(cuts.tolist())):
        x = src[lo:hi]
        keep[lo:hi] = (x < bounds[p]) | (x >= consumer[lo:hi])
    return consumer, keep


def needed_input_lists(bounds: list[int], ptr: np.ndarray, src: np.ndarray) -> list[list[int]]:
    """Per op, its `needed_inputs` (a list per op: what the op-by-op sweep reads)."""
    n = bounds[-1]
    consumer, keep = needed_inputs(bounds, ptr, src)
    cuts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(consumer[keep], minlength=n), out=cuts[1:])
    values = src[keep].tolist()
    with gc_paused():
        return [values[a:b] for a, b in itertools.pairwise(cuts.tolist())]


#: What the op-by-op sweep reads per op: its first needed input, and the others of ops that have more than one
#: (None for ops with one or none; None altogether when no op has more).
FirstInputs = tuple[list[int], list[list[int] | None] | None]


def first_inputs(bounds: list[int], ptr: np.ndarray, src: np.ndarray, sentinel: int) -> FirstInputs:
    """Per op, its first `needed_inputs` entry (`sentinel`, an input the sweep holds available at cycle 0, when it
    has none) and the rest of them for ops with more. Nearly every op of a stage-level pipeline needs one input
    once its own processor's are dropped: one list of ints, not a list per op (building 1,024 small lists and
    freeing them was as long as the sweep itself, 1F1B at p = 8, issue 14)."""
    n = bounds[-1]
    count = ptr[1:] - ptr[:-1]
    if n and len(src) <= SMALL_INPUTS * max(len(bounds) - 1, 1) and int(count.max()) <= PAIRS:
        return _first_of_pairs(bounds, ptr, src, count, sentinel)
    _, keep = needed_inputs(bounds, ptr, src)
    # Each op's needed entries are the kept ones within its CSR slice: where its slice begins and ends among the
    # kept entries is the running count of kept entries at its slice bounds (no per-entry consumer array, no
    # bincount; a binary search of the bounds took three times as long).
    running = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(keep, out=running[1:])
    at = running[ptr]
    counts = at[1:] - at[:-1]
    kept = np.empty(int(running[-1]) + 1, dtype=np.int64)
    kept[:-1] = src[keep]
    kept[-1] = sentinel  # a pad: an op with none may index one past the last kept entry (`where` drops it)
    first = np.where(counts > 0, kept[at[:-1]], sentinel)
    multi = (counts > 1).nonzero()[0].tolist()
    if not multi:
        return first.tolist(), None
    values, cuts = kept.tolist(), at.tolist()
    more: list[list[int] | None] = [None] * n
    with gc_paused():
        for i in multi:
            more[i] = values[cuts[i] + 1:cuts[i + 1]]
    return first.tolist(), more


#: Entries per op up to which `first_inputs` looks at each op's entries in place (`_first_of_pairs`): a stage op
#: has at most two producers (its activation or error, and what it kept).
PAIRS = 2


def _first_of_pairs(bounds: list[int], ptr: np.ndarray, src: np.ndarray, count: np.ndarray,
                    sentinel: int) -> FirstInputs:
    """`first_inputs` where no op has more than two entries (`count` per op, at most 2): each op's first and second
    entry read in place (x, y) and tested per op, no running count of kept entries over the CSR (a `cumsum`, no
    vector loop in numpy) nor a compacted copy. An entry is dropped when it is an earlier op of the consumer's
    processor, first ≤ x < consumer: with `rel` = consumer − first, that is x − first < rel as unsigned numbers (one
    comparison: x below first wraps to a huge value)."""
    n = bounds[-1]
    padded = np.empty(len(src) + PAIRS, dtype=np.int64)  # past the last entry: a place to read for ops with fewer
    padded[:len(src)] = src
    padded[len(src):] = sentinel
    at = ptr[:-1]
    x, y = padded.take(at), padded.take(at + 1)  # an op's own entries only where count says so (masked below)
    cuts = np.asarray(bounds, dtype=np.int64)
    own = cuts[:-1].repeat(cuts[1:] - cuts[:-1])  # each op's processor's first op
    rel = (np.arange(n, dtype=np.int64) - own).view(np.uint64)
    need_x = (count >= 1) & ((x - own).view(np.uint64) >= rel)
    need_y = (count >= 2) & ((y - own).view(np.uint64) >= rel)
    first = np.where(need_x, x, np.where(need_y, y, sentinel))
    both = (need_x & need_y).nonzero()[0].tolist()
    if not both:
        return first.tolist(), None
    more: list[list[int] | None] = [None] * n
    for i, second in zip(both, y[both].tolist(), strict=True):
        more[i] = [second]
    return first.tolist(), more


def split_first(inputs: list[list[int]], sentinel: int) -> FirstInputs:
    """`first_inputs` of per-op input lists (as given, none dropped)."""
    first = [row[0] if row else sentinel for row in inputs]
    if all(len(row) <= 1 for row in inputs):
        return first, None
    return first, [row[1:] if len(row) > 1 else None for row in inputs]


def sweep_runs(r: Runs, num_links: int, hold: list[int] | tuple[()] = (), latency: int = 0
               ) -> tuple[list[int], list[int], bool]:
    """(known, next head per processor at stop, finished?) of the run sweep: known[k] is the start of head k's
    run, known[H + t] the arrival of transfer t (the slots of `Runs`); −1 where never known (a deadlock: `finished`
    False). `hold` is indexed by input number (n + t for transfer t)."""
    known = [-1] * (r.none + 1)
    known[r.none] = 0  # "no input"
    waiters: list[list[int] | None] = [None] * len(known)
    link_free = [0] * num_links
    length, sends = r.length, r.sends
    shift = len(r.run_of) - len(r.head)  # a transfer's input number less its slot
    send_at, send_input, send_link, send_off = ((sends.at, sends.input, sends.link, sends.off) if sends is not None
                                                else (None, [], [], []))
    first_key, first_add, rest = r.first_key, r.first_add, r.rest
    lo, hi = r.head_bounds[:-1], r.head_bounds[1:]
    nxt = list(lo)
    free = [0] * len(lo)
    work = list(range(len(lo) - 1, -1, -1))
    while work:
        p = work.pop()
        k, stop, t = nxt[p], hi[p], free[p]
        while k < stop:
            key = first_key[k]
            e = known[key]
            if e < 0:
                parked = waiters[key]
                if parked is None:
                    waiters[key] = [p]
                else:
                    parked.append(p)
                break
            e += first_add[k]
            s = t if t > e else e
            others = rest[k] if rest is not None else None
            if others is not None:
                for key, add in others:
                    e = known[key]
                    if e < 0:
                        parked = waiters[key]
                        if parked is None:
                            waiters[key] = [p]
                        else:
                            parked.append(p)
                        break
                    e += add
                    if e > s:
                        s = e
                else:
                    others = None
                if others is not None:  # parked on one of the others
                    break
            known[k] = s
            t = s + length[k]
            woken = waiters[k]
            if woken is not None:
                work.extend(woken)
                waiters[k] = None
            if send_at is not None:
                c, last = send_at[k], send_at[k + 1]
                while c < last:
                    x, link = send_input[c], send_link[c]
                    depart = link_free[link]
                    ready = s + send_off[c]
                    if depart < ready:
                        depart = ready
                    depart += hold[x]
                    link_free[link] = depart
                    x -= shift
                    known[x] = depart + latency
                    woken = waiters[x]
                    if woken is not None:
                        work.extend(woken)
                        waiters[x] = None
                    c += 1
            k += 1
        nxt[p], free[p] = k, t
    finished = all(k >= stop for k, stop in zip(nxt, hi, strict=True))
    return known, nxt, finished


def op_times(r: Runs, known: list[int], dur: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every op (int64 arrays) from its run's start (an op of a run never started gets
    meaningless values: the caller raises its deadlock first)."""
    n = len(dur)
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # The heads' starts are the first H slots, scattered to the heads' places and gathered per op by its run's head.
    at_heads = np.zeros(n, dtype=np.int64)
    at_heads[r.head] = int64_array(known[:len(r.head)])
    end = at_heads[r.run_of]
    end += r.off
    return end - np.asarray(dur, dtype=np.int64), end
