"""Peak memory per processor, in words (design notes §7).

What is counted, as intervals [from, to) on one processor; at equal times releases go before allocations:

- Activations kept for backward (layer level): every dependency with role `kept` or `loss` (z_l, a_{l−1},
  masks, a_L) is held from its producer's start to its consumer's end on the producer's processor; when
  the consumer runs elsewhere the data lives on the consumer's processor from the producer's end (the
  transfer starts then) to the consumer's end. Transient forward activations and errors are not counted.
- Activations (stage level, no network): stage s keeps `activation_words[s]` per micro-batch from F_s(t)'s
  start to the end of the last backward op (B, I or W) of s and t, on F_s(t)'s processor.
- Weights of unit u (|W_u| words each version), charged to the processor that owns u (the one running
  its first U op, else its first F op): at time τ the held versions are the current one (updates finished
  by τ) and every version some reader is still using — a version is held from the first start of an op
  that reads it to the last end of one (under `stash` that is from the first F that reads it to the last
  E that reads it, since E reads F's version). `ema` adds one moving-average buffer of |W_u| words.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from layerpipe.sim._engine import CompiledSchedule
from layerpipe.sim._workload import Workload

KEPT_ROLES = ("kept", "loss")


def peak_memory(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                workload: Workload, mode: str) -> list[int]:
    """The largest number of words each processor holds at any time."""
    procs: list[np.ndarray] = []
    times: list[np.ndarray] = []
    deltas: list[np.ndarray] = []

    def add(p: np.ndarray, lo: np.ndarray, hi: np.ndarray, words: np.ndarray) -> None:
        procs.extend([p, p])
        times.extend([lo, hi])
        deltas.extend([words, -words])

    proc = np.asarray(c.proc, dtype=np.int64)
    if workload.level == "layer":
        add(*_kept_intervals(c, start, end, proc))
    else:
        add(*_stage_activation_intervals(c, start, end, workload))
    for p, t, d in _weight_steps(c, start, end, versions, workload, mode):
        procs.append(np.asarray([p] * len(t), dtype=np.int64))
        times.append(np.asarray(t, dtype=np.int64))
        deltas.append(np.asarray(d, dtype=np.int64))
    peaks = [0] * c.num_procs
    if not procs:
        return peaks
    all_p, all_t, all_d = np.concatenate(procs), np.concatenate(times), np.concatenate(deltas)
    order = np.lexsort((all_d, all_t, all_p))  # by processor, then time, releases (negative) first
    all_p, all_d = all_p[order], all_d[order]
    for p in range(c.num_procs):
        lo, hi = np.searchsorted(all_p, [p, p + 1])
        if hi > lo:
            peaks[p] = max(0, int(np.cumsum(all_d[lo:hi]).max()))
    return peaks


def _kept_intervals(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, proc: np.ndarray):
    roles = np.asarray(c.prod_role, dtype=object)
    mask = np.isin(roles, KEPT_ROLES) if len(roles) else np.zeros(0, dtype=bool)
    consumer = np.repeat(np.arange(c.num_ops), np.diff(np.asarray(c.prod_ptr)))[mask]
    producer = np.asarray(c.prod_idx, dtype=np.int64)[mask]
    words = np.asarray(c.prod_words, dtype=np.int64)[mask]
    local = proc[producer] == proc[consumer]
    where = np.where(local, proc[producer], proc[consumer])
    lo = np.where(local, start[producer], end[producer])
    return where, lo, end[consumer], words


def _stage_activation_intervals(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, workload: Workload):
    forward: dict[tuple[int, int], int] = {}
    release: dict[tuple[int, int], int] = {}
    for i, op in enumerate(c.ops):
        key = (op.unit, op.iteration)
        if op.kind == "F":
            forward[key] = i
        elif release.get(key, -1) < end[i]:
            release[key] = int(end[i])
    rows = [(c.proc[i], int(start[i]), release.get(key, int(end[i])), workload.activation_words.get(key[0], 0))
            for key, i in forward.items()]
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    return arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]


def _weight_steps(c: CompiledSchedule, start: np.ndarray, end: np.ndarray, versions: np.ndarray,
                  workload: Workload, mode: str):
    """Per weight unit: (owner processor, change times, word deltas) of the words its versions hold."""
    update_owner: dict[int, int] = {}
    forward_owner: dict[int, int] = {}
    update_ends: dict[int, list[int]] = defaultdict(list)
    reads: dict[int, dict[int, list[int]]] = defaultdict(dict)  # unit → version → [first start, last end]
    for i, op in enumerate(c.ops):
        u = op.unit
        if u not in workload.weight_words:
            continue
        if op.kind == "U":
            update_owner.setdefault(u, op.proc)
            update_ends[u].append(int(end[i]))
        elif "F" in op.kind:
            forward_owner.setdefault(u, op.proc)
        v = int(versions[i])
        if v >= 0:
            span = reads[u].get(v)
            if span is None:
                reads[u][v] = [int(start[i]), int(end[i])]
            else:
                span[0] = min(span[0], int(start[i]))
                span[1] = max(span[1], int(end[i]))
    for u, size in sorted(workload.weight_words.items()):
        p = update_owner.get(u, forward_owner.get(u))
        if p is None:
            continue
        counts = _held_version_counts(reads[u], sorted(update_ends[u]))
        extra = 1 if mode == "ema" else 0
        times, deltas, previous = [], [], 0
        for t, count in counts:
            words = (count + extra) * size
            if words != previous:
                times.append(t)
                deltas.append(words - previous)
                previous = words
        times.append(int(end.max()) + 1 if len(end) else 0)
        deltas.append(-previous)
        yield p, times, deltas


def _held_version_counts(spans: dict[int, list[int]], update_ends: list[int]) -> list[tuple[int, int]]:
    """(time, number of versions held from then on), for every time the number may change."""
    changes: dict[int, list[tuple[int, int]]] = defaultdict(list)  # time → (+1 hold / −1 release, version)
    for v, (lo, hi) in spans.items():
        if hi > lo:
            changes[lo].append((1, v))
            changes[hi].append((-1, v))
    for t in update_ends:
        changes.setdefault(t, [])
    active: dict[int, int] = defaultdict(int)
    out = [(0, 1)]
    current = 0
    k = 0
    for t in sorted(changes):
        while k < len(update_ends) and update_ends[k] <= t:
            k += 1
        current = k
        for sign, v in changes[t]:
            active[v] += sign
            if not active[v]:
                del active[v]
        out.append((t, len(active) + (current not in active)))
    return out
