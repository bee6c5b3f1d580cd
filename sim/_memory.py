"""Peak memory per processor, in words (design notes §7).

What is counted, as intervals [from, to) on one processor; at equal times releases go before allocations:

- Activations kept for backward (layer level): every dependency with role `kept` or `loss` (z_l, a_{l−1},
  masks, a_L) is held from its producer's start to its consumer's end on the producer's processor; when
  the consumer runs elsewhere the data lives on the consumer's processor from the producer's end (the
  transfer starts then) to the consumer's end. Transient forward activations and errors are not counted.
- Activations (stage level, no network): stage s keeps `activation_words[s]` per micro-batch from F_s(t)'s
  start to the end of the last backward op (B, I or W) of s and t, on F_s(t)'s processor.
- Weights of unit u (|W_u| words each version). At time τ the held versions are the current one (updates
  finished by τ) and every version some reader is still using — a version is held from the first start of
  an op that reads it to the last end of one (under `stash` that is from the first F that reads it to the
  last E that reads it, since E reads F's version). `ema` adds one moving-average buffer of |W_u| words.
  Where they are held depends on the interconnect (design notes §11, issue 10 item 4):
  * `shared` (one memory): one set, charged to the processor that owns u (the one running its first U op,
    else its first F op), counting every reader's versions; the buffer goes there too.
  * distributed (`links`, `bus`): every processor that reads W_u or updates it holds its own copy of the
    current version and the versions its own readers are still using — so a processor that only runs
    forwards of u holds |W_u| words, and the weights a processor streams in to read are counted where they
    are read. The `ema` buffer sits with the backward readers (E, B, I: the reconstruction runs there), or
    with the owner when u has none. Simplification: a copy is held from cycle 0 (a static buffer), not from
    the first transfer, and the current version counts as soon as its update ends, not when it arrives.
"""

from __future__ import annotations

import itertools

import numpy as np

from layerpipe.schedule._int_lists import sorted_unique, stable_argsort
from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._workload import Workload

KEPT_ROLES = ("kept", "loss")


def peak_memory(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                workload: Workload, mode: str, distributed: bool = False, engine_times: bool = False) -> list[int]:
    """The largest number of words each processor holds at any time (`distributed`: every reader of a
    weight holds its own copy, see the module docstring). `engine_times`: `start` and `end` are the timing
    engine's (from cycle 0, every op starting no earlier than the op before it on its processor ends), which lets
    a stage-level run without weights take `_stage_activation_peaks`."""
    if workload.level == "layer":
        native = _native_peaks(c, start, end, versions, workload, mode, distributed)
        if native is not None:
            return native
    # The weight changes first: their scratch arrays are gone before the activation intervals are built (peak).
    wp, wt, wd = _weight_changes(c, start, end, versions, workload, mode, distributed)
    if workload.level == "layer":
        where, lo, hi, words = _kept_intervals(c, start, end)
    else:
        if engine_times and not len(wp):
            fast = _stage_activation_peaks(c, start, end, workload)
            if fast is not None:
                return fast
        where, lo, hi, words = _stage_activation_intervals(c, start, end, workload)
    # Processor by processor (issue 14: no array of every change of every processor at once). Within one, the
    # changes by time, releases (negative) first; changes equal in both are equal, so their order is not seen.
    peaks = [0] * c.num_procs
    if len(where) <= SMALL_INTERVALS * max(c.num_procs, 1):  # at once (as before issue 14): cheaper here
        return _peaks_at_once(c.num_procs, [where, where, wp], [lo, hi, wt], [words, -words, wd])
    by_proc = stable_argsort(wp)
    cuts = list(itertools.accumulate(np.bincount(wp, minlength=c.num_procs).tolist(), initial=0))
    for p in range(c.num_procs):
        mine = np.flatnonzero(where == p)
        held = by_proc[cuts[p]:cuts[p + 1]]
        times = np.concatenate([lo[mine], hi[mine], wt[held]])
        deltas = np.concatenate([words[mine], -words[mine], wd[held]])
        if len(times):
            peaks[p] = max(0, int(np.cumsum(deltas[np.lexsort((deltas, times))]).max()))
    return peaks


def _native_peaks(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                  workload: Workload, mode: str, distributed: bool) -> list[int] | None:
    """`peak_memory` of a layer-level run by C (`lp_peaks`: `_weight_changes` taking every unit at once, and
    `_kept_intervals`, the same changes), where the library is built and those are the paths the run takes: integer
    weight sizes and words, at most MAX_AT_ONCE_OPS ops. None otherwise."""
    from layerpipe.schedule import _native

    sizes = workload.weight_words
    if (_native.library() is None or c.num_ops > MAX_AT_ONCE_OPS or c.prod_words.dtype.kind not in "iu"
            or not all(isinstance(w, int) for w in sizes.values())):
        return None
    units = sorted({u for _, u in c.tasks})
    dense = {u: k for k, u in enumerate(units)}
    flags = [(k == "U") | ("F" in k) << 1 | ("E" in k or k in ("B", "I")) << 2 for k, _ in c.tasks]
    return _native.peaks(c.bounds, c.task, start, end, versions, flags, [dense[u] for _, u in c.tasks],
                         [sizes.get(u, 0) for u in units], mode == "ema", distributed, c.prod_ptr, c.prod_idx,
                         c.prod_words, c.prod_role, [role in KEPT_ROLES for role in c.roles])


#: Intervals per processor up to which the peaks come from one sort of every change (above, one at a time).
SMALL_INTERVALS = 1024


def _peaks_at_once(num_procs: int, procs: list[np.ndarray], times: list[np.ndarray],
                   deltas: list[np.ndarray]) -> list[int]:
    """`peak_memory`'s peaks with one sort of every change (processor, time, words), given in parts."""
    peaks = [0] * num_procs
    all_p, all_t, all_d = np.concatenate(procs), np.concatenate(times), np.concatenate(deltas)
    if not len(all_p):
        return peaks
    integers = all_d.dtype.kind == "i" and all_t.dtype.kind == "i"
    span = int(all_t.max()) + 1 if integers else 0
    if integers and int(all_t.min()) >= 0 and 2 * num_procs * span < 1 << 62:
        # One key (processor, time, allocation?) rather than sorting by every delta's value: within one time of
        # one processor the releases still go first, so the running sum falls, then rises, and its largest
        # value there is the one before or after that time either way — the same peaks.
        key = (all_p.astype(np.int64) * span + all_t) * 2 + (all_d > 0)
        order = stable_argsort(key)  # radix sort of integers: 8x quicksort's speed here (16k keys)
        return _peaks_of_sorted(num_procs, all_d.take(order), np.bincount(all_p, minlength=num_procs))
    order = np.lexsort((all_d, all_t, all_p))
    if all_d.dtype.kind != "i":  # not integers: one cumsum per processor, so every sum is added as before
        all_p, all_d = all_p[order], all_d[order]
        bounds = np.searchsorted(all_p, np.arange(num_procs + 1))
        for p in range(num_procs):
            a, b = int(bounds[p]), int(bounds[p + 1])
            if b > a:
                peaks[p] = max(0, int(np.cumsum(all_d[a:b]).max()))
        return peaks
    return _peaks_of_sorted(num_procs, all_d[order], np.bincount(all_p[order], minlength=num_procs))


def _peaks_of_sorted(num_procs: int, deltas: np.ndarray, per_proc: np.ndarray) -> list[int]:
    """Peak of each processor's running sum of integer `deltas`, sorted by processor (`per_proc[p]` of them on
    p) and within one in the order they apply. One running sum over all of them; a processor's own is the
    global one less its value where the processor's changes begin (exact integers: the same sums)."""
    peaks = [0] * num_procs
    running = np.zeros(len(deltas) + 1, dtype=np.int64)
    np.cumsum(deltas, out=running[1:])
    counts = per_proc.tolist()
    cuts = list(itertools.accumulate(counts, initial=0))
    nonempty = [p for p in range(num_procs) if counts[p]]
    if nonempty:
        at = np.asarray([cuts[p] for p in nonempty], dtype=np.int64)
        tops = np.maximum.reduceat(running[1:], at) - running[at]
        for p, top in zip(nonempty, tops.tolist(), strict=True):
            peaks[p] = max(0, int(top))
    return peaks


def _kept_intervals(c: CompiledSchedule, start: np.ndarray, end: np.ndarray):
    proc = c.proc_array()
    kept = np.asarray([role in KEPT_ROLES for role in c.roles] or [False], dtype=bool)
    entries = np.flatnonzero(kept[c.prod_role])  # a table of the role codes: no wider copy of prod_role (peak)
    # The consumer of each kept entry from the CSR pointer (no consumer array over every entry: issue 14).
    consumer = np.searchsorted(c.prod_ptr, entries, side="right") - 1
    producer, words = c.prod_idx[entries], c.prod_words[entries]
    del entries
    where = proc[producer]
    local = where == proc[consumer]
    where[~local] = proc[consumer[~local]]
    lo = end[producer]
    lo[local] = start[producer[local]]
    return where, lo, end[consumer], words


def _stage_activation_intervals(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, workload: Workload):
    # `take` with integer indices throughout: the values of indexing, at half its cost on these short arrays.
    unit = np.asarray([u for _, u in c.tasks], dtype=np.int64).take(c.task)
    forward = np.asarray([k == "F" for k, _ in c.tasks], dtype=bool).take(c.task)
    span = int(c.iteration.max()) + 1 if c.num_ops else 1
    key = unit * span + c.iteration
    release = np.zeros((int(unit.max()) + 1 if c.num_ops else 1) * span, dtype=np.int64)
    np.maximum.at(release, key, end)  # the last end among the unit's ops of that micro-batch
    f = forward.nonzero()[0]
    words = np.asarray([workload.activation_words.get(u, 0) for u in range(len(release) // span)], dtype=np.int64)
    return c.proc_array(np.int64).take(f), start.take(f), release.take(key.take(f)), words.take(unit.take(f))


def _stage_activation_peaks(c: CompiledSchedule, start: np.ndarray, end: np.ndarray,
                            workload: Workload) -> list[int] | None:
    """`peak_memory` of a stage-level run without weights, from the engine's times (see `peak_memory`): the peaks
    of `_stage_activation_intervals` without sorting every change. None where it does not apply (an activation
    size not a non-negative int, a negative duration, too many intervals, times too long for one key).

    Words are never negative, so a processor's running sum rises only where an activation is allocated: its peak
    is 0 or its value just after some F op f's allocation. Its F ops start in program order (engine times), and
    releases at f's start go first: that value is the words of p's F ops up to f in program order less the
    words of p's intervals released at or before start(f). With keys processor · top + time, those are running
    sums at f's place among the F ops and at `searchsorted(release keys, f's key, "right")` — the earlier
    processors' allocations and releases, all counted on both sides, cancel. ~25 numpy calls instead of ~40 (and
    no sort when every stage keeps as many words)."""
    procs = c.num_procs
    if not c.num_ops or min(c.cost) < 0:
        return None
    unit_of_task = np.asarray([u for _, u in c.tasks], dtype=np.int64)
    unit = unit_of_task.take(c.task)
    f = np.flatnonzero(np.asarray([k == "F" for k, _ in c.tasks], dtype=bool).take(c.task))
    if len(f) > SMALL_INTERVALS * max(procs, 1):
        return None  # the general path's processor-by-processor sums (memory)
    span = int(c.iteration.max()) + 1
    key = unit * span + c.iteration
    release = np.zeros((int(unit.max()) + 1) * span, dtype=np.int64)
    np.maximum.at(release, key, end)  # as `_stage_activation_intervals`: the last end of the unit's micro-batch
    words_of = [workload.activation_words.get(u, 0) for u in range(len(release) // span)]
    if not all(type(w) is int and w >= 0 for w in words_of):
        return None
    peaks = [0] * procs
    if not len(f):
        return peaks
    hi = release.take(key.take(f))
    cuts = np.searchsorted(f, c.bounds)  # processor p's F ops are f[cuts[p]:cuts[p+1]]
    firsts = cuts.tolist()
    top = int(hi.max()) + 1  # past every release and every start (an F op's release is no earlier than its start)
    if procs * top >= 1 << 62:
        return None
    base = np.arange(procs, dtype=np.int64).repeat(cuts[1:] - cuts[:-1]) * top
    allocated = base + start.take(f)
    released = base + hi
    if min(words_of) == max(words_of):  # one size: counts, no sums
        held = np.arange(1, len(f) + 1, dtype=np.int64) - np.searchsorted(np.sort(released), allocated, "right")
        held *= words_of[0]
    else:
        words = np.asarray(words_of, dtype=np.int64).take(unit.take(f))
        order = stable_argsort(released)
        freed = np.zeros(len(f) + 1, dtype=np.int64)
        np.cumsum(words.take(order), out=freed[1:])
        held = np.cumsum(words) - freed.take(np.searchsorted(released.take(order), allocated, "right"))
    nonempty = [p for p in range(procs) if firsts[p] < firsts[p + 1]]
    tops = np.maximum.reduceat(held, [firsts[p] for p in nonempty]).tolist()
    for p, most in zip(nonempty, tops, strict=True):
        peaks[p] = max(0, most)
    return peaks


#: Ops up to which `_weight_changes` takes every unit at once (above, unit by unit: `_weight_steps`).
MAX_AT_ONCE_OPS = 1 << 17


def _weight_changes(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                    workload: Workload, mode: str, distributed: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(processor, time, word delta) of every change of the weight words held: on every processor at every
    time the same words as `_weight_steps` (so the same peaks), every unit and holder at once — a fixed number
    of array passes, not a dozen per unit and holder (22 of those per `explore` point: issue 14).

    A holder g (unit u of |W_u| = w words, processor q) holds, from 0 to the run's end, w for the current
    version plus `buffer`, plus w for each version v its readers keep in use, over [lo_v, hi_v) (first start,
    last end among them), less w while the current version is one of those (it is counted once): version v is
    current over [ue_{v−1}, ue_v) between u's sorted update ends, so that is [max(ue_{v−1}, lo_v), min(ue_v, hi_v)).
    """
    empty = np.zeros(0, dtype=np.int64)
    sizes = workload.weight_words
    if not any(w for w in sizes.values()):
        return empty, empty, empty
    if not all(isinstance(w, int) for w in sizes.values()) or c.num_ops > MAX_AT_ONCE_OPS:
        # Sizes not integers, or a long run (the arrays over every reader would raise the peak of memory: issue
        # 14): the steps unit by unit, as they were.
        parts = list(_weight_steps(c, start, end, versions, workload, mode, distributed))
        return (np.concatenate([np.full(len(t), p, dtype=np.int64) for p, t, _ in parts] or [empty]),
                np.concatenate([t for _, t, _ in parts] or [empty]),
                np.concatenate([d for _, _, d in parts] or [empty]))
    kinds = [k for k, _ in c.tasks]
    unit_of_task = np.asarray([u for _, u in c.tasks], dtype=np.int64)
    size_of_task = np.asarray([sizes.get(u, 0) for _, u in c.tasks], dtype=np.int64)
    weighted = size_of_task[c.task] > 0
    cuts = np.asarray(c.bounds, dtype=np.int64)
    # The owner of each unit: the processor of its first U op, else of its first op with an F.
    updates = np.flatnonzero(weighted & np.asarray([k == "U" for k in kinds], dtype=bool)[c.task])
    forwards = np.flatnonzero(weighted & np.asarray(["F" in k for k in kinds], dtype=bool)[c.task])
    owner_op: dict[int, int] = {}
    for ops in (forwards, updates):  # updates last: they win
        owned, first = np.unique(unit_of_task[c.task[ops]], return_index=True)
        owner_op.update(zip(owned.tolist(), ops[first].tolist(), strict=True))
    if not owner_op:
        return empty, empty, empty
    units = sorted(owner_op)  # units with an owner, numbered 0, 1, ... (dense)
    dense = np.full(int(unit_of_task.max()) + 2 - min(0, int(unit_of_task.min())), -1, dtype=np.int64)
    shift = -min(0, int(unit_of_task.min()))
    dense[np.asarray(units, dtype=np.int64) + shift] = np.arange(len(units))
    owner_ops = np.asarray([owner_op[u] for u in units], dtype=np.int64)
    owner = np.searchsorted(cuts, owner_ops, side="right") - 1
    size = np.asarray([sizes[u] for u in units], dtype=np.int64)
    extra = 1 if mode == "ema" else 0
    procs = c.num_procs
    # Readers of owned units, their unit (dense) and holder.
    readers = np.flatnonzero(versions >= 0)
    r_unit = dense[unit_of_task[c.task[readers]] + shift] if len(readers) else empty
    readers, r_unit = readers[r_unit >= 0], r_unit[r_unit >= 0]
    r_proc = np.searchsorted(cuts, readers, side="right") - 1
    r_holder = r_proc if distributed else owner[r_unit]
    # Holders: (unit, processor) of every reader and every owner; each holds w (+ buffer) throughout.
    holder_keys = sorted_unique(np.concatenate([r_unit * procs + r_holder, np.arange(len(units)) * procs + owner]))
    h_unit, h_proc = holder_keys // procs, holder_keys % procs
    held = size[h_unit]
    if extra:
        if distributed:  # the buffer sits with the backward readers, else with the owner
            backward = np.asarray([("E" in k or k in ("B", "I")) for k in kinds], dtype=bool)[c.task[readers]]
            buffered = sorted_unique(r_unit[backward] * procs + r_proc[backward])
            has_backward = np.zeros(len(units), dtype=bool)
            has_backward[r_unit[backward]] = True
            with_buffer = np.isin(holder_keys, buffered) | (~has_backward[h_unit] & (h_proc == owner[h_unit]))
        else:
            with_buffer = np.ones(len(holder_keys), dtype=bool)
        held = held + np.where(with_buffer, size[h_unit], 0)
    finish = int(end.max()) + 1 if len(end) else 0
    const_p = np.concatenate([h_proc, h_proc])
    const_t = np.concatenate([np.zeros(len(h_proc), dtype=np.int64), np.full(len(h_proc), finish, dtype=np.int64)])
    const_d = np.concatenate([held, -held])
    if not len(readers):
        return const_p, const_t, const_d
    # Versions in use per holder: [lo, hi) over its readers of each version.
    v = versions[readers].astype(np.int64)
    span = int(v.max()) + 1
    key = (r_unit * procs + r_holder) * span + v
    order = stable_argsort(key)
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    lo = np.minimum.reduceat(start[readers[order]], first)
    hi = np.maximum.reduceat(end[readers[order]], first)
    pair = key[first]
    p_unit, p_proc, p_version = pair // span // procs, pair // span % procs, pair % span
    w = size[p_unit]
    used = hi > lo
    # The current version's own span is not counted twice: u's update ends, sorted per unit.
    upd_unit = dense[unit_of_task[c.task[updates]] + shift]
    upd_order = np.lexsort((end[updates], upd_unit))
    ue = end[updates][upd_order]
    ue_cut = np.zeros(len(units) + 1, dtype=np.int64)
    np.cumsum(np.bincount(upd_unit, minlength=len(units)), out=ue_cut[1:])
    count = ue_cut[p_unit + 1] - ue_cut[p_unit]
    current = p_version <= count  # version v is current at some time only if v ≤ the number of updates
    base = ue_cut[p_unit] + p_version
    since = np.where(current & (p_version > 0), ue[np.clip(base - 1, 0, max(len(ue) - 1, 0))] if len(ue) else 0, lo)
    until = np.where(current & (p_version < count), ue[np.clip(base, 0, max(len(ue) - 1, 0))] if len(ue) else 0, hi)
    a, b = np.maximum(lo, since), np.minimum(hi, until)
    twice = current & (a < b)
    return (np.concatenate([const_p, p_proc[used], p_proc[used], p_proc[twice], p_proc[twice]]),
            np.concatenate([const_t, lo[used], hi[used], a[twice], b[twice]]),
            np.concatenate([const_d, w[used], -w[used], -w[twice], w[twice]]))


def _weight_steps(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                  workload: Workload, mode: str, distributed: bool = False):
    """Per weight unit and holding processor: (processor, change times, word deltas) of the words held."""
    if not workload.weight_words:
        return  # nothing to hold (stage-level runs without weight sizes)
    extra = 1 if mode == "ema" else 0
    # Per-task tables and per-unit subsets rather than flags and processors per op (issue 14: memory per op).
    kinds = [k for k, _ in c.tasks]
    is_update = np.asarray([k == "U" for k in kinds], dtype=bool)
    is_forward = np.asarray(["F" in k for k in kinds], dtype=bool)
    is_backward = np.asarray([("E" in k or k in ("B", "I")) for k in kinds], dtype=bool)
    cuts = np.asarray(c.bounds, dtype=np.int64)

    def proc(ops: np.ndarray) -> np.ndarray:  # the processors of some ops (numbered processor-major)
        return np.searchsorted(cuts, ops, side="right") - 1

    unit = _unit_per_op(c)
    by_unit = stable_argsort(unit)  # stable: program order within a unit's ops
    sorted_units = unit[by_unit]
    del unit
    finish = int(end.max()) + 1 if len(end) else 0
    for u, size in sorted(workload.weight_words.items()):
        lo_i, hi_i = np.searchsorted(sorted_units, [u, u + 1])
        members = by_unit[lo_i:hi_i]
        if not len(members):
            continue
        member_task = c.task[members]
        updates = members[is_update[member_task]]
        owners = updates if len(updates) else members[is_forward[member_task]]
        del member_task
        if not len(owners):
            continue
        readers = members[versions[members] >= 0]
        count = int(versions[readers].max()) + 1 if len(readers) else 0
        owner = int(proc(owners[:1])[0])
        update_ends = np.sort(end[updates])
        if not distributed:
            yield owner, *_held_words(readers, count, start, end, versions, update_ends, size, extra * size,
                                      finish)
            continue
        reader_proc = proc(readers)
        holders = sorted({int(q) for q in reader_proc} | {owner})
        buffered = {int(q) for q in reader_proc[is_backward[c.task[readers]]]} or {owner}
        for q in holders:
            mine = readers[reader_proc == q]
            yield q, *_held_words(mine, count, start, end, versions, update_ends, size,
                                  extra * size if q in buffered else 0, finish)


def _held_words(readers: np.ndarray, count: int, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                update_ends: np.ndarray, size: int, buffer: int, finish: int) -> tuple[np.ndarray, np.ndarray]:
    """(change times, word deltas) of the versions `readers` keep in use plus the current one, `size` words
    each, and `buffer` words more throughout; all released at `finish`."""
    lo = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(count, -1, dtype=np.int64)
    np.minimum.at(lo, versions[readers], start[readers])
    np.maximum.at(hi, versions[readers], end[readers])
    times, counts = _held_version_counts(lo, hi, update_ends)
    words = counts * size + buffer
    delta = np.diff(words, prepend=0)
    keep = delta != 0
    return np.r_[times[keep], finish], np.r_[delta[keep], -words[-1]]


def _held_version_counts(lo: np.ndarray, hi: np.ndarray, update_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, number of versions held from each time on): the current version, plus every version v with
    lo[v] <= τ < hi[v] (versions nobody read have lo > hi and never count)."""
    used = hi > lo
    span_lo, span_hi = np.sort(lo[used]), np.sort(hi[used])
    times = sorted_unique(np.concatenate([[0], span_lo, span_hi, update_ends]))
    active = np.searchsorted(span_lo, times, side="right") - np.searchsorted(span_hi, times, side="right")
    current = np.searchsorted(update_ends, times, side="right")
    known = current < len(lo)
    cur = np.minimum(current, max(len(lo) - 1, 0))
    current_held = known & (lo[cur] <= times) & (times < hi[cur]) if len(lo) else np.zeros(len(times), bool)
    return times, active + (~current_held).astype(np.int64)


def _unit_per_op(c: CompiledSchedule) -> np.ndarray:
    """Every op's unit (layer or stage), in the smallest of int16 / int32 / int64 that holds them (an array per
    op: issue 14's memory; compared and sorted only, never multiplied)."""
    units = [u for _, u in c.tasks]
    top = max((abs(u) for u in units), default=0)
    dtype = np.int16 if top < 2**15 - 1 else np.int32 if top < 2**31 - 1 else np.int64  # u + 1 fits too
    return np.asarray(units, dtype=dtype)[c.task]
