"""`improve`'s rounds on dense arrays: a placement's per-item neighbour sums kept per processor, so that a round's
candidate moves and their keys come out of a few numpy calls instead of a Python loop over the moves.

Why dense: every move of item i from s to d changes the same figures, read off four rows of i —

- words: WS[i, s] − WS[i, d], where WS[i, r] sums the words of i's edges to tasks now on r (both directions);
- links: channel (s, r) loses HO[i, r] and (d, r) gains it (holds of i's edges out to tasks on r), channel
  (r, s) loses HI[i, r] and (r, d) gains it (holds in); channels (s, d) and (d, s) get both of their terms;
- bus: the one channel changes by HB[i, s] − HB[i, d] (HB = HO + HI);
- candidate targets: the processors r with NB[i, r] > 0 (i has a neighbour task there).

and a move of item j from a to b shifts, for each item next to j, j's share of those sums from column a to
column b — the degree of j, like `_State.move`.

The key of a move (period, resources at the period, words) is the maximum of the loads and holds after the
move and how many resources hold it. Split the resources into those the move cannot change (processors other
than s and d, channels outside rows and columns s and d; their maximum and its count depend only on (s, d)) and
those it may change (s, d and the channels of rows and columns s and d, counted with their new values —
a channel whose change is 0 keeps its value, so counting it there or among the unchanged gives the same max and
count). That is `_State.key_after`'s key exactly (tests/test_placement_arrays.py), computed for every move
of a round at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from layerpipe.schedule._placement import _Items, _State

Key = tuple[int, int, int]

#: Largest magnitude of a summed load, hold or word count kept on int64 arrays (far beyond any table; above
#: it `_State` keeps no arrays and the rounds run on Python ints).
INT64_SAFE = 1 << 60

#: The figure planes of `Dense.sums`: words, holds out, holds in, neighbour tasks.
_WORDS, _OUT, _IN, _NEAR = range(4)


class PairSums:
    """What a move of each item does to its neighbours' dense sums, whatever the placement: per item j, the items
    next to it (`near[j]`) and j's share of their [words, holds out, holds in, tasks] sums (`share[j]`, 4 × len).
    Also every (item, neighbour task, figures) entry, to build the sums of a start placement at once."""

    def __init__(self, items: _Items, count: int) -> None:
        by_pair: dict[tuple[int, int], list[int]] = {}
        entry_item: list[int] = []
        entry_task: list[int] = []
        entry_figures: list[tuple[int, int, int, int]] = []
        for i, row in enumerate(items.nbrs):
            for x, wo, ho, wi, hi in row:
                entry_item.append(i)
                entry_task.append(x)
                entry_figures.append((wo + wi, ho, hi, 1))
                sums = by_pair.setdefault((items.item_of[x], i), [0, 0, 0, 0])
                sums[0] += wo + wi
                sums[1] += ho
                sums[2] += hi
                sums[3] += 1
        grouped: list[list[tuple[int, list[int]]]] = [[] for _ in range(count)]
        for (j, i), sums in by_pair.items():
            grouped[j].append((i, sums))
        self.near = [np.array([i for i, _ in g], dtype=np.int64) for g in grouped]
        self.share = [np.array([s for _, s in g], dtype=np.int64).reshape(len(g), 4).T.copy() for g in grouped]
        self.entry_item = np.array(entry_item, dtype=np.int64)
        self.entry_task = np.array(entry_task, dtype=np.int64)
        self.entry_figures = np.array(entry_figures, dtype=np.int64).reshape(len(entry_item), 4).T.copy()


class Dense:
    """A placement's loads, holds and per-item sums on int64 arrays, kept in step with `_State` under moves."""

    def __init__(self, state: _State, pairs: PairSums) -> None:
        n, count = state.n, len(state.item_place)
        self.pairs = pairs
        self.load = np.array(state.load, dtype=np.int64)
        self.cost = np.array(state.item_cost, dtype=np.int64)
        self.item_place = np.array(state.item_place, dtype=np.int64)
        # Channel holds as an N×N matrix (links) or one cell (bus); absent channels hold 0.
        self.chan = np.zeros(1 if state.bus else n * n, dtype=np.int64)
        for ch, x in state.chan.items():
            self.chan[ch] = x
        self.sums = np.zeros((4, count, n), dtype=np.int64)
        if len(pairs.entry_item):
            place = np.array(state.place, dtype=np.int64)
            for k in range(4):
                np.add.at(self.sums[k], (pairs.entry_item, place[pairs.entry_task]), pairs.entry_figures[k])

    def move(self, item: int, src: int, dst: int, changes: Sequence[tuple[int, int]]) -> None:
        c = self.cost[item]
        self.load[src] -= c
        self.load[dst] += c
        self.item_place[item] = dst
        for ch, d in changes:
            self.chan[ch] += d
        near = self.pairs.near[item]
        if len(near):
            share = self.pairs.share[item]
            self.sums[:, near, src] -= share
            self.sums[:, near, dst] += share


def candidate_arrays(state: _State, dense: Dense, light_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """`_State.candidate_moves` as (items, destinations) arrays, in the same (sorted) order."""
    top = state.levels[0]
    load, n = dense.load, state.n
    busy = load == top
    rows = np.flatnonzero(busy[dense.item_place])  # the items on a busiest processor
    if len(rows):
        light = np.argsort(load, kind="stable")[:light_targets]  # least loaded, ties by index
        want = dense.sums[_NEAR][rows] > 0  # processors where the item has a neighbour task
        want[:, light] = True
        want[np.arange(len(rows)), dense.item_place[rows]] = False
        want &= load[None, :] <= (top - dense.cost[rows])[:, None]
        at, dsts = np.nonzero(want)  # row-major: by item, then destination
        items = rows[at]
    else:
        items = dsts = np.zeros(0, dtype=np.int64)
    if not state.shared and top in state.chan.values():  # a busiest channel: its ends' moves, merged in order
        extra = state.channel_moves(top)
        if extra:
            codes = np.union1d(items * n + dsts, np.array([i * n + q for i, q in extra], dtype=np.int64))
            items, dsts = codes // n, codes % n
    return items, dsts


def scored_arrays(state: _State, dense: Dense, items: np.ndarray, dsts: np.ndarray, current: Key,
                  max_words: float | None) -> int:
    """`best_move` on arrays: the index of the first move of least key below `current` (words past
    `max_words` and above `current`'s skipped), or -1.

    Every move's key is bounded from below first, from what its (s, d) pair leaves alone and what only grows
    (the load of d, the holds of d's other channels); the exact keys, which read a row of i per channel block,
    are computed only for the moves whose bound does not exceed the best exact period found — first among the
    moves of least bound, which usually hold the best move, then, if that best is above their bound, among
    all moves up to it. A move left out has a period above the best's, so the pick is the one over all moves."""
    count = len(items)
    if not count:
        return -1
    n = state.n
    load = dense.load
    src = dense.item_place[items]
    cost = dense.cost[items]
    new_src, new_dst = load[src] - cost, load[dsts] + cost
    # Per distinct (s, d): the highest load or hold the move leaves alone and how many hold it, and a floor
    # under what it changes (d's other channels only gain).
    pair_codes, pair_of = np.unique(src * n + dsts, return_inverse=True)
    ps, pd = pair_codes // n, pair_codes % n
    pairs = len(pair_codes)
    hit = np.zeros((pairs, n), dtype=bool)
    ar = np.arange(pairs)
    hit[ar, ps] = True
    hit[ar, pd] = True
    left = np.where(hit, -1, load[None, :])
    floor = np.zeros(pairs, dtype=np.int64)
    if not state.shared and not state.bus:  # links: the channels outside rows and columns s and d
        chan = dense.chan.reshape(n, n)
        left_chan = np.where(hit[:, :, None] | hit[:, None, :], -1, chan[None, :, :]).reshape(pairs, -1)
        left = np.concatenate((left, left_chan), axis=1)
        floor = np.where(hit, -1, np.maximum(chan[pd], chan[:, pd].T)).max(axis=1)
    left_top = left.max(axis=1)
    left_count = (left == left_top[:, None]).sum(axis=1)
    bound = np.maximum(np.maximum(new_src, new_dst), np.maximum(left_top, floor)[pair_of])
    top0, at0, words0 = current
    open_ = np.flatnonzero(bound <= top0)  # a move bounded above the current period cannot go below it
    if not len(open_):
        return -1
    move_top, move_count = left_top[pair_of], left_count[pair_of]

    def least_of(sel: np.ndarray) -> tuple[int, int]:
        """The first move of least key below `current` among `sel` (index into the round's moves) and its period;
        (-1, 0) for none."""
        top, at_top, words = _keys(state, dense, items[sel], dsts[sel], src[sel], new_src[sel], new_dst[sel],
                                   move_top[sel], move_count[sel])
        below = (top < top0) | ((top == top0) & ((at_top < at0) | ((at_top == at0) & (words < words0))))
        if max_words is not None:
            below &= ~((words > max_words) & (words > words0))
        pick = np.flatnonzero(below)
        if not len(pick):
            return -1, 0
        for figure in (top, at_top, words):  # least key, lexicographically; the first move among equals
            values = figure[pick]
            pick = pick[values == values.min()]
        return int(sel[pick[0]]), int(top[pick[0]])

    least = bound[open_].min()
    best, period = least_of(open_[bound[open_] == least])
    if best >= 0 and period == least:
        return best
    return least_of(open_ if best < 0 else open_[bound[open_] <= period])[0]


def _keys(state: _State, dense: Dense, items: np.ndarray, dsts: np.ndarray, src: np.ndarray, new_src: np.ndarray,
          new_dst: np.ndarray, left_top: np.ndarray, left_count: np.ndarray) -> tuple[np.ndarray, ...]:
    """The moves' keys (period, resources at the period, words): the highest of what each leaves alone
    (`left_top`, held `left_count` times) and what it changes, after the move."""
    n, count, sums = state.n, len(items), dense.sums
    words = state.words + sums[_WORDS][items, src] - sums[_WORDS][items, dsts]
    top = np.maximum(np.maximum(new_src, new_dst), left_top)
    changed: list[np.ndarray] = [new_src, new_dst]
    grid: np.ndarray | None = None
    if state.bus:
        both = sums[_OUT] + sums[_IN]
        changed.append(dense.chan[0] + both[items, src] - both[items, dsts])
    elif not state.shared:
        chan = dense.chan.reshape(n, n)
        out, into = sums[_OUT][items], sums[_IN][items]
        k = np.arange(count)
        grid = np.empty((count, 4, n), dtype=np.int64)
        np.subtract(chan[src], out, out=grid[:, 0])  # (s, r) loses i's holds out to r
        np.add(chan[dsts], out, out=grid[:, 1])  # (d, r) gains them
        np.subtract(chan[:, src].T, into, out=grid[:, 2])  # (r, s) loses i's holds in from r
        np.add(chan[:, dsts].T, into, out=grid[:, 3])  # (r, d) gains them
        grid[k, :, src] = -1  # r ∈ {s, d}: the two channels between s and d, taken below with both terms
        grid[k, :, dsts] = -1
        changed.append(chan[src, dsts] - out[k, dsts] + into[k, src])
        changed.append(chan[dsts, src] + out[k, src] - into[k, dsts])
        grid = grid.reshape(count, -1)
        top = np.maximum(top, grid.max(axis=1))
    for values in changed[2:]:
        top = np.maximum(top, values)
    at_top = np.where(left_top == top, left_count, 0)
    for values in changed:
        at_top += values == top
    if grid is not None:
        at_top += (grid == top[:, None]).sum(axis=1)
    # Nothing loaded at all: every resource holds 0, counted as before the move (`key_after`).
    at_top = np.where(top == 0, state.hist.get(0, 0), at_top)
    return top, at_top, words
