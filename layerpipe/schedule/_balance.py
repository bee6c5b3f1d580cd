"""Items onto processors (design notes §5): load balancing and contiguous cuts of a timeline.

- `balance`       — LPT (or a given start) plus move/swap repair: items (tasks or groups of tasks) onto N
                    processors, minimising the largest load, which is the period of a gap-free body.
- `timeline_partition` — one iteration's tasks in critical-path order (`_lags.timeline`), cut into N runs.
- `partition_contiguous` — min-max split of a sequence into contiguous parts (from `layerpipe.stages`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from layerpipe.stages import partition_contiguous  # the one contiguous partitioner; re-exported for the policies


def balance(weights: Sequence[int], num_procs: int, initial: Sequence[int] | None = None,
            rounds: int = 2000) -> list[int]:
    """Items onto processors minimising the largest load: LPT (or `initial`), then moves and swaps off the
    busiest processor while they lower it. Deterministic (ties by index). Returns each item's processor."""
    proc = [0] * len(weights)
    members: list[list[int]] = [[] for _ in range(num_procs)]
    load = [0] * num_procs
    if initial is not None:
        for i, p in enumerate(initial):
            proc[i] = p
            members[p].append(i)
            load[p] += weights[i]
    else:
        heap = [(0, p) for p in range(num_procs)]
        for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
            lo, p = heapq.heappop(heap)
            proc[i] = p
            members[p].append(i)
            load[p] = lo + weights[i]
            heapq.heappush(heap, (load[p], p))
    # Each processor's items as (weight, item), sorted: kept by `_move` across rounds (a round reads them all)
    by_weight = [sorted((weights[j], j) for j in members[q]) for q in range(num_procs)]
    for _ in range(rounds):
        if not _improve_busiest(weights, proc, members, load, by_weight):
            break
    return proc


def timeline_partition(weights: Sequence[int], order: Sequence[int], num_procs: int) -> list[int]:
    """Processor per item: `order` cut into min(N, n) contiguous runs of min-max load, run k on processor k.
    Consecutive work shares a processor, so a body holds one stretch of the iteration and its offsets
    follow the iteration's own timeline (few lag increments, low staleness)."""
    runs = partition_contiguous([weights[i] for i in order], min(num_procs, len(order)))
    proc = [0] * len(weights)
    for k, run in enumerate(runs):
        for pos in run:
            proc[order[pos]] = k
    return proc


def _improve_busiest(weights: Sequence[int], proc: list[int], members: list[list[int]], load: list[int],
                     by_weight: list[list[tuple[int, int]]]) -> bool:
    """One move or swap that lowers the busiest processor without raising any other to its load.

    For item i (weight w) on the busiest processor and a processor q, a swap with j changes both loads by
    d = w − w_j; the best d is the one closest to (peak − load_q)/2, found by bisection in q's sorted weights
    (`by_weight`, each processor's (weight, item) pairs in order).

    Only a strictly lower key replaces the best, so options that cannot go below it are skipped: a move or swap
    of i (0 < d ≤ w) leaves the busiest processor at peak − d ≥ peak − w, and one with q has a key of at
    least (peak + load_q)/2 (the larger of two loads summing to that).
    """
    top = max(range(len(load)), key=lambda p: (load[p], -p))
    peak = load[top]
    best: tuple[int, int, int, int] | None = None  # (new pair max, item, to-proc, swapped item or -1)
    # The processors with room below the peak, in index order (the others take nothing)
    open_ = [(q, peak - load[q], by_weight[q], (peak + load[q]) / 2) for q in range(len(load))
             if q != top and load[q] < peak]
    for i in members[top]:
        w = weights[i]
        if best is not None and best[0] <= peak - w:
            continue
        for q, room, ws, floor in open_:
            if best is not None and best[0] <= floor:
                continue
            if w < room:
                key = max(peak - w, load[q] + w)
                if best is None or key < best[0]:
                    best = (key, i, q, -1)
            # want w_j = w − d with 0 < d < room, d near room/2: w_j near w − room/2
            k = bisect.bisect_left(ws, (w - room // 2, -1))
            for cand in (k - 1, k):
                if 0 <= cand < len(ws):
                    d = w - ws[cand][0]
                    if 0 < d < room:
                        key = max(peak - d, load[q] + d)
                        if best is None or key < best[0]:
                            best = (key, i, q, ws[cand][1])
    if best is None:
        return False
    _, i, q, j = best
    _move(i, top, q, weights, proc, members, load, by_weight)
    if j >= 0:
        _move(j, q, top, weights, proc, members, load, by_weight)
    return True


def _move(i: int, src: int, dst: int, weights: Sequence[int], proc: list[int], members: list[list[int]],
          load: list[int], by_weight: list[list[tuple[int, int]]]) -> None:
    members[src].remove(i)
    members[dst].append(i)
    by_weight[src].remove((weights[i], i))
    bisect.insort(by_weight[dst], (weights[i], i))
    load[src] -= weights[i]
    load[dst] += weights[i]
    proc[i] = dst
